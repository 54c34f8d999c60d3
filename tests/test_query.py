"""The CQL front end (adaptcq.query.cql) and the expression compiler (adaptcq.query.expr).

Window syntax is STREAM's CQL (a-caching.txt §7.1); join-graph shapes are those of
join-ordering.txt §1.2/§3.3.
"""

from __future__ import annotations

import datetime

import pytest
import sqlglot
import sqlglot.expressions as exp
from hypothesis import given, settings
from hypothesis import strategies as st

from adaptcq.errors import QueryError
from adaptcq.query.cql import parse_query
from adaptcq.query.expr import (
    compile_predicate,
    compile_projection,
    eval_namespace,
    to_python,
)
from adaptcq.query.logical import ColumnRef, Window
from conftest import examples

SCHEMAS = {
    "orders": {"id": "number", "cust": "number", "ts": "timestamp", "amount": "number"},
    "shipments": {"order_id": "number", "qty": "number", "carrier": "string"},
    "customers": {"id": "number", "name": "string", "vip": "bool"},
}


def error_of(sql: str, schemas=None) -> QueryError:
    with pytest.raises(QueryError) as info:
        parse_query(sql, schemas)
    err = info.value
    assert err.sql == sql
    return err


def points_at(err: QueryError, text: str) -> bool:
    return err.position is not None and err.sql[err.position:].startswith(text)


# ----- windows ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("clause", "window"), [
    ("[RANGE 10 SECONDS]", Window("range", 10)),
    ("[RANGE 10]", Window("range", 10)),
    ("[range 1 second]", Window("range", 1)),
    ("[RANGE 500 MILLISECONDS]", Window("range", 0.5)),
    ("[RANGE 1 MILLISECOND]", Window("range", 0.001)),
    ("[RANGE 5 MINUTES]", Window("range", 300)),
    ("[RANGE 1.5 Minute]", Window("range", 90)),
    ("[RANGE 2 HOURS]", Window("range", 7200)),
    ("[RANGE 1 HOUR]", Window("range", 3600)),
    ("[RANGE 0.5 DAYS]", Window("range", 43200)),
    ("[RANGE 1 DAY]", Window("range", 86400)),
    ("[ROWS 1000]", Window("rows", 1000)),
    ("[RANGE UNBOUNDED]", Window()),
    ("[UNBOUNDED]", Window()),
    ("[NOW]", Window("range", 0)),
    ("", Window()),
])
def test_window_units(clause, window):
    q = parse_query(f"SELECT R.a FROM R {clause}")
    assert q.streams[0].window == window
    assert q.streams[0].source == "R"


def test_windows_belong_to_their_from_items():
    q = parse_query("SELECT R.a FROM R [RANGE 10 SECONDS], S [ROWS 1000] AS s, T "
                    "WHERE R.a = s.a AND s.b = T.b")
    assert [(s.alias, s.source, s.window) for s in q.streams] == [
        ("R", "R", Window("range", 10)), ("s", "S", Window("rows", 1000)),
        ("T", "T", Window())]
    q = parse_query("SELECT o.id FROM orders [RANGE 5 MINUTES] o")
    assert q.streams[0].alias == "o" and q.streams[0].window == Window("range", 300)


def test_window_in_join_syntax_and_positions():
    sql = "SELECT r.a FROM R [ROWS 5] AS r JOIN S [RANGE 2] s ON r.a = s.a"
    q = parse_query(sql)
    assert [s.window for s in q.streams] == [Window("rows", 5), Window("range", 2)]
    assert sql[q.streams[1].position:].startswith("S [RANGE")


def test_window_str_round_trip():
    for window in (Window("range", 10), Window("rows", 7), Window("range", 0.25)):
        text = str(window).replace("[UNBOUNDED]", "")
        assert parse_query(f"SELECT R.a FROM R {text}").streams[0].window == window


def test_brackets_inside_strings_are_not_windows():
    q = parse_query("SELECT R.a FROM R [ROWS 2] WHERE R.s = '[ROWS 3]'")
    assert q.streams[0].window == Window("rows", 2)
    assert q.selections["R"].sql() == "R.s = '[ROWS 3]'"


@pytest.mark.parametrize(("clause", "at", "words"), [
    ("[ROWS 0]", "0]", "at least one row"),
    ("[ROWS -5]", "-5", "at least one row"),
    ("[ROWS 2.5]", "2.5", "whole number"),
    ("[RANGE -3 SECONDS]", "-3", "must not be negative"),
    ("[RANGE 3 FORTNIGHTS]", "FORTNIGHTS", "unknown time unit"),
    ("[RANGE ten]", "ten", "not a number"),
    ("[RANGE 3 SECONDS SLIDE 1]", "SLIDE", "unexpected"),
    ("[SLIDING 3]", "SLIDING", "unexpected"),
    ("[PARTITION BY a ROWS 3]", "PARTITION", "partitioned windows"),
    ("[ROWS]", "ROWS", "needs a size"),
    ("[]", "[]", "empty window clause"),
])
def test_bad_windows(clause, at, words):
    err = error_of(f"SELECT R.a FROM R {clause}")
    assert words in err.message
    assert points_at(err, at)


def test_window_placement_errors():
    err = error_of("SELECT r.a FROM R AS r [RANGE 3]")
    assert "before its alias" in err.message and points_at(err, "[RANGE 3]")
    err = error_of("SELECT R.a [ROWS 3] FROM R")
    assert "stream name in FROM" in err.message and points_at(err, "[ROWS 3]")
    err = error_of("SELECT R.a FROM R [ROWS 3")
    assert "never closed" in err.message and points_at(err, "[ROWS 3")


# ----- streams, aliases, columns -----------------------------------------------------------------
def test_aliases_and_column_aliases():
    q = parse_query("SELECT o.id AS oid, s.qty, o.amount * 2 FROM orders AS o, shipments s "
                    "WHERE o.id = s.order_id", SCHEMAS)
    assert q.aliases == ("o", "s")
    assert [s.source for s in q.streams] == ["orders", "shipments"]
    assert [o.name for o in q.outputs] == ["oid", "qty", "o.amount * 2"]
    assert [o.expr.sql() for o in q.outputs] == ["o.id", "s.qty", "o.amount * 2"]
    assert q.columns == {"o": ("id", "amount"), "s": ("order_id", "qty")}
    assert q.types == {"o": {"id": "number", "amount": "number"},
                       "s": {"order_id": "number", "qty": "number"}}


def test_self_join_shares_the_source():
    q = parse_query("SELECT a.id, b.id AS id2 FROM orders [ROWS 10] a, orders [ROWS 20] b "
                    "WHERE a.cust = b.cust", SCHEMAS)
    assert [(s.alias, s.source, s.window.size) for s in q.streams] == [
        ("a", "orders", 10), ("b", "orders", 20)]
    assert q.classes == (frozenset({ColumnRef("a", "cust"), ColumnRef("b", "cust")}),)
    assert q.columns == {"a": ("cust", "id"), "b": ("cust", "id")}


def test_star_expansion():
    q = parse_query("SELECT * FROM orders o JOIN customers c ON o.cust = c.id", SCHEMAS)
    assert [o.name for o in q.outputs] == ["o_id", "o_cust", "o_ts", "o_amount",
                                          "c_id", "c_name", "c_vip"]
    assert q.outputs[0].expr.sql() == "o.id"
    assert q.columns["o"] == ("cust", "id", "ts", "amount")
    assert q.columns["c"] == ("id", "name", "vip")
    assert q.types["o"]["ts"] == "timestamp"


def test_qualified_star():
    q = parse_query("SELECT c.*, o.id FROM orders o, customers c WHERE o.cust = c.id", SCHEMAS)
    assert [o.name for o in q.outputs] == ["c_id", "c_name", "c_vip", "id"]


def test_unqualified_columns_resolve_with_schemas():
    q = parse_query("SELECT name, qty FROM orders o, shipments s, customers c "
                    "WHERE o.id = order_id AND cust = c.id AND carrier = 'ups'", SCHEMAS)
    assert q.outputs[0].expr.sql() == "c.name"
    assert q.selections["s"].sql() == "s.carrier = 'ups'"
    assert {str(p.left) + "=" + str(p.right) for p in q.predicates} == {
        "o.id=s.order_id", "o.cust=c.id"}


def test_single_stream_without_schemas():
    q = parse_query("SELECT a, b + 1 AS c FROM R [ROWS 3] WHERE a > 2")
    assert q.outputs[0].expr.sql() == "R.a"
    assert q.selections["R"].sql() == "R.a > 2"
    assert q.columns == {"R": ("a", "b")}
    assert q.types == {"R": {}}


def test_column_order_join_then_selection_then_output():
    q = parse_query("SELECT R.z, S.y FROM R, S WHERE R.w > 1 AND S.x = R.k AND S.y < 3")
    assert q.columns == {"R": ("k", "w", "z"), "S": ("x", "y")}


# ----- predicates, selections, classes ---------------------------------------------------------
def test_join_on_and_where_mixed():
    q = parse_query("SELECT R.a FROM R JOIN S ON R.a = S.a AND S.c > 2 INNER JOIN T "
                    "ON T.b = S.b WHERE R.d IS NOT NULL")
    assert [(str(p.left), str(p.right)) for p in q.predicates] == [
        ("R.a", "S.a"), ("T.b", "S.b")]
    assert q.selections["S"].sql() == "S.c > 2"
    assert q.selections["R"].sql() == "NOT R.d IS NULL"
    assert q.selections["T"] is None
    assert q.shape == "linear"


def test_predicate_positions():
    sql = "SELECT R.a FROM R, S WHERE R.x = 1 AND (S.b = R.b)"
    q = parse_query(sql)
    assert sql[q.predicates[0].position:].startswith("(S.b = R.b)")


def test_several_predicates_between_one_pair():
    q = parse_query("SELECT R.a FROM R, S WHERE R.a = S.a AND R.b = S.b")
    assert len(q.classes) == 2
    assert q.join_graph.edges["R", "S"]["predicates"] == [
        (ColumnRef("R", "a"), ColumnRef("S", "a")), (ColumnRef("R", "b"), ColumnRef("S", "b"))]
    assert q.join_key("S", {"R"}) == [("a", ColumnRef("R", "a")), ("b", ColumnRef("R", "b"))]


def test_transitive_class_gives_triangle():
    q = parse_query("SELECT R.a FROM R, S, T WHERE R.a = S.a AND S.a = T.a")
    assert q.classes == (frozenset({ColumnRef("R", "a"), ColumnRef("S", "a"),
                                    ColumnRef("T", "a")}),)
    g = q.join_graph
    assert {frozenset(e) for e in g.edges} == {frozenset("RS"), frozenset("ST"),
                                              frozenset("RT")}
    assert q.shape == "cyclic"


def test_two_columns_of_one_stream_in_a_class_imply_a_selection():
    q = parse_query("SELECT R.a FROM R, S WHERE R.a = S.x AND R.b = S.x")
    assert q.selections["R"].sql() == "R.a = R.b"
    assert q.selections["S"] is None
    assert q.columns["R"] == ("a", "b")


def test_implied_equality_joins_existing_selection():
    q = parse_query("SELECT R.a FROM R, S WHERE R.c > 0 AND R.a = S.x AND S.x = R.b")
    assert q.selections["R"].sql() == "R.c > 0 AND R.a = R.b"


def test_equality_within_one_stream_is_a_selection():
    q = parse_query("SELECT R.a FROM R WHERE R.a = R.b")
    assert q.predicates == () and q.classes == ()
    assert q.selections["R"].sql() == "R.a = R.b"


def test_selection_kinds_are_kept():
    where = ("R.a = 1 AND R.b <> 2 AND R.c != 3 AND R.d < 4 AND R.e <= 5 AND R.f > 6 AND "
             "R.g >= 7 AND R.h BETWEEN 1 AND 2 AND R.i IN (1, 2) AND R.j IS NULL AND "
             "NOT (R.k = 'x' OR R.l IS NOT NULL) AND R.m > TIMESTAMP '2024-01-01 00:00:00'")
    q = parse_query(f"SELECT R.a FROM R WHERE {where}")
    assert q.selections["R"] is not None
    assert len(list(q.selections["R"].flatten())) == 12


def test_constant_conjunct_goes_to_first_stream():
    q = parse_query("SELECT R.a FROM R, S WHERE R.a = S.a AND 1 = 1")
    assert q.selections["R"].sql() == "1 = 1"


@pytest.mark.parametrize(("where", "shape"), [
    ("A.x = B.x AND B.y = C.y AND C.z = D.z", "linear"),
    ("A.x = B.x AND A.y = C.y AND A.z = D.z", "star"),
    ("A.x = B.x AND B.y = C.y AND B.z = D.z AND D.w = E.w AND D.v = F.v", "acyclic"),
    ("A.x = B.x AND B.y = C.y AND C.z = D.z AND D.w = A.w", "cyclic"),
    ("A.x = B.x AND A.x = C.x AND A.x = D.x", "cyclic"),  # complete: one class of four
])
def test_shapes(where, shape):
    streams = sorted({w[0] for w in where.replace(" AND ", " ").split() if w[1:2] == "."})
    q = parse_query(f"SELECT A.x FROM {', '.join(streams)} WHERE {where}")
    assert q.shape == shape
    # the networkx-free views (join_edges, adjacency, shape) agree with the nx.Graph
    from adaptcq.query.logical import graph_shape
    g = q.join_graph
    assert graph_shape(g) == shape
    assert list(q.join_edges()) == list(g.edges)
    assert all(q.join_edges()[e] == g.edges[e]["predicates"] for e in g.edges)
    assert q.adjacency() == {a: tuple(g.neighbors(a)) for a in q.aliases}


def test_complete_graph_from_one_class():
    q = parse_query("SELECT A.x FROM A, B, C, D WHERE A.x = B.x AND B.x = C.x AND C.x = D.x")
    assert q.join_graph.number_of_edges() == 6


def test_timestamp_literals():
    q = parse_query("SELECT o.id FROM orders o WHERE o.ts >= '2024-01-01 00:00:00' AND "
                    "o.ts < TIMESTAMP '2024-02-01 00:00:00'", SCHEMAS)
    pred = compile_predicate(q.selections["o"], q.columns["o"], "o", q.types)
    ts = q.columns["o"].index("ts")
    row = [None] * len(q.columns["o"])
    row[ts] = datetime.datetime(2024, 1, 15)
    assert pred(tuple(row))
    row[ts] = datetime.datetime(2024, 2, 1)
    assert not pred(tuple(row))


# ----- errors ----------------------------------------------------------------------------------
def test_non_equi_predicates():
    err = error_of("SELECT R.a FROM R, S WHERE R.a = S.a AND R.a < S.b")
    assert err.message == "non-equi predicate between streams R and S is not supported"
    assert points_at(err, "R.a < S.b")
    err = error_of("SELECT R.a FROM R, S WHERE R.a = S.b + 1")
    assert points_at(err, "R.a = S.b + 1")
    err = error_of("SELECT R.a FROM R, S WHERE R.a = S.a OR R.b = S.b")
    assert points_at(err, "R.a = S.a OR")
    assert err.message.startswith("an OR of conditions on streams R and S is not supported")
    err = error_of("SELECT R.a FROM R, S WHERE NOT (R.a = S.a)")
    assert points_at(err, "NOT (R.a")
    assert err.message.startswith("a NOT of conditions on streams R and S")


def test_disconnected_join_graph():
    err = error_of("SELECT R.a FROM R, S, T WHERE R.a = S.a")
    assert err.message == ("the join graph is disconnected: {R, S} and {T} share no predicate "
                           "(a cross product is not supported)")
    assert points_at(err, "T WHERE")
    err = error_of("SELECT R.a FROM R, S, T, U WHERE R.a = T.a")
    assert "{R, T}, {S} and {U}" in err.message


def test_ambiguous_and_unknown_columns():
    err = error_of("SELECT id FROM orders o, customers c WHERE o.cust = c.id", SCHEMAS)
    assert "ambiguous column 'id'" in err.message and "o, c" in err.message
    assert points_at(err, "id FROM")
    err = error_of("SELECT o.id FROM orders o, customers c WHERE o.cust = c.id AND "
                   "c.nam = 'x'", SCHEMAS)
    assert "unknown column 'nam' in stream 'c'" in err.message
    assert "id, name, vip" in err.message
    assert points_at(err, "c.nam")
    err = error_of("SELECT zip FROM orders o", SCHEMAS)
    assert "unknown column 'zip'" in err.message and points_at(err, "zip")


def test_unqualified_column_needs_schemas_with_several_streams():
    err = error_of("SELECT R.a FROM R, S WHERE R.a = S.a AND b > 1")
    assert "must be qualified" in err.message and points_at(err, "b > 1")


def test_unknown_alias_qualifier():
    err = error_of("SELECT R.a FROM R, S WHERE R.a = S.a AND X.b = 1")
    assert "unknown stream or alias 'X'" in err.message and points_at(err, "X.b")
    err = error_of("SELECT orders.id FROM orders o", SCHEMAS)
    assert "'orders'" in err.message and points_at(err, "orders.id")


def test_unknown_stream_lists_known_ones():
    err = error_of("SELECT o.id FROM orders o, invoices i WHERE o.id = i.id", SCHEMAS)
    assert err.message.startswith("unknown stream 'invoices'")
    assert "customers, orders, shipments" in err.message
    assert points_at(err, "invoices i")


def test_duplicate_alias():
    err = error_of("SELECT R.a FROM R, S AS R WHERE R.a = R.a")
    assert "duplicate stream alias 'R'" in err.message and points_at(err, "R WHERE")
    err = error_of("SELECT R.a FROM R, R")
    assert points_at(err, "R\n") or err.position == len("SELECT R.a FROM R, ")


def test_duplicate_output_names():
    err = error_of("SELECT R.a, S.a FROM R, S WHERE R.a = S.a")
    assert "duplicate output column name 'a'" in err.message and points_at(err, "S.a FROM")
    err = error_of("SELECT R.b AS x, R.c AS x FROM R")
    assert points_at(err, "R.c AS x")


def test_star_needs_schemas():
    err = error_of("SELECT * FROM R")
    assert "schemas" in err.message and points_at(err, "* FROM")


@pytest.mark.parametrize(("sql", "words", "at"), [
    ("SELECT R.a FROM R GROUP BY R.a", "GROUP BY", "GROUP BY"),
    ("SELECT count(R.a) FROM R", "aggregate function COUNT", "count("),
    ("SELECT R.a FROM R ORDER BY R.a", "ORDER BY", "ORDER BY"),
    ("SELECT R.a FROM R LIMIT 10", "LIMIT", "LIMIT"),
    ("SELECT DISTINCT R.a FROM R", "DISTINCT", "DISTINCT"),
    ("SELECT R.a FROM R WHERE R.a IN (SELECT S.a FROM S)", "subquery", "R.a IN"),
    ("SELECT R.a FROM (SELECT 1 AS a) AS R", "subquery", "(SELECT 1"),
    ("SELECT R.a FROM R UNION SELECT S.a FROM S", "UNION", "UNION"),
    ("SELECT R.a FROM R LEFT JOIN S ON R.a = S.a", "LEFT JOIN", "LEFT"),
    ("SELECT R.a FROM R LEFT OUTER JOIN S ON R.a = S.a", "LEFT OUTER JOIN", "LEFT"),
    ("SELECT R.a FROM R FULL OUTER JOIN S ON R.a = S.a", "FULL", "FULL"),
    ("SELECT R.a FROM R CROSS JOIN S", "CROSS JOIN", "CROSS"),
    ("SELECT R.a FROM R JOIN S USING (a)", "USING", "USING"),
    ("SELECT R.a, max(R.b) FROM R GROUP BY R.a HAVING max(R.b) > 1", "aggregate function MAX",
     "max(R.b) FROM"),
    ("SELECT R.a FROM R WHERE R.a > 1 HAVING R.a > 2", "HAVING", "HAVING"),
    ("SELECT sum(R.a) OVER (PARTITION BY R.b) FROM R", "window function", "sum("),
    ("WITH x AS (SELECT 1) SELECT R.a FROM R", "WITH", "WITH"),
    ("SELECT R.a FROM R WHERE upper(R.s) = 'X'", "function UPPER", "upper("),
    ("SELECT R.a FROM R WHERE R.s LIKE 'X%'", "LIKE operator", "LIKE"),
    ("SELECT R.a FROM R WHERE R.s NOT LIKE 'X%'", "NOT LIKE operator", "NOT LIKE"),
    ("SELECT R.a || R.b FROM R", "|| operator", "||"),
    ("SELECT R.a % 2 FROM R", "% operator", "% 2"),
    ("SELECT CAST(R.a AS INT) FROM R", "CAST", "CAST"),
    ("SELECT R.a FROM R WHERE EXISTS (SELECT 1)", "subquery", "EXISTS"),
    ("SELECT R.a FROM R WHERE R.b IS TRUE", "IS TRUE", "R.b IS TRUE"),
    ("SELECT CASE WHEN R.a > 1 THEN 1 END FROM R", "CASE", "CASE"),
    ("SELECT R.a FROM (R JOIN S ON R.a = S.a)", "parenthesized join", "(R JOIN"),
    ("SELECT R.a FROM R TABLESAMPLE (10 PERCENT)", "SAMPLE", "R TABLESAMPLE"),
])
def test_unsupported_constructs(sql, words, at):
    err = error_of(sql)
    assert words in err.message and "not supported" in err.message
    assert points_at(err, at), (err.position, err)


def test_syntax_errors_point_into_the_text():
    err = error_of("SELECT R.a FROM R WHERE R.a = = 1")
    assert err.message.startswith("syntax error") and points_at(err, "= 1")
    err = error_of("SELECT R.a FROM R [ROWS 5]\n WHERE R.a = 3 FROMX 4")
    assert points_at(err, "FROMX")
    err = error_of("SELECT R.a FROM R WHERE R.s = 'abc")
    assert "unterminated string" in err.message and points_at(err, "'abc")
    err = error_of("   ")
    assert "empty" in err.message


def test_invalid_timestamp_literal():
    err = error_of("SELECT o.id FROM orders o WHERE o.ts > 'yesterday'", SCHEMAS)
    assert "invalid timestamp literal 'yesterday'" in err.message
    assert points_at(err, "'yesterday'")
    err = error_of("SELECT R.a FROM R WHERE R.t > TIMESTAMP 'soon'")
    assert points_at(err, "'soon'")


def test_number_compared_with_string():
    err = error_of("SELECT o.id FROM orders o WHERE o.amount > 'big'", SCHEMAS)
    assert "cannot compare a number with a string" in err.message
    assert points_at(err, "o.amount > 'big'")


def test_statement_level_errors():
    err = error_of("SELECT R.a FROM R; SELECT S.a FROM S")
    assert "one statement" in err.message and points_at(err, "; SELECT")
    err = error_of("SELECT FROM R")
    assert "SELECT list is empty" in err.message
    err = error_of("INSERT INTO R VALUES (1)")
    assert "expected a SELECT" in err.message and err.position == 0
    err = error_of("SELECT R.a FROM")
    assert "end of the query" in err.message
    assert parse_query("SELECT R.a FROM R [ROWS 2];").streams[0].window == Window("rows", 2)


def test_comments_and_quoted_names():
    q = parse_query('SELECT "R"."a" FROM "R" [ROWS 3] -- [not a window]\n'
                    "WHERE R.a > 1 /* [nor this] */")
    assert q.streams[0].window == Window("rows", 3)
    assert q.selections["R"].sql() == "R.a > 1"


def test_bad_schema_kind():
    err = error_of("SELECT R.a FROM R", {"R": {"a": "money"}})
    assert "unknown kind 'money'" in err.message


def test_error_renders_a_caret():
    err = error_of("SELECT R.a FROM R, S WHERE R.a < S.b")
    lines = str(err).splitlines()
    assert lines[1].strip() == err.sql
    assert lines[2].index("^") - lines[1].index("S") == err.position


# ----- the expression compiler ----------------------------------------------------------------
def where(text: str) -> exp.Expression:
    return sqlglot.parse_one(f"SELECT 1 FROM R WHERE {text}").args["where"].this


def test_lean_predicate_source():
    pred = compile_predicate(where("R.x > 5"), ("k", "x"), "R")
    assert pred.source == "(r[1] is not None and r[1] > 5)"
    assert pred((0, 6)) is True and pred((0, 5)) is False and pred((0, None)) is False
    assert compile_predicate(None, ("x",), "R")((1,)) is True
    pred = compile_predicate(where("R.x IN (1, 2, 3)"), ("x",), "R")
    assert pred.source == "(r[0] is not None and r[0] in {1, 2, 3})"
    pred = compile_predicate(where("R.x BETWEEN 1 AND 3"), ("x",), "R")
    assert pred.source == "(r[0] is not None and 1 <= r[0] <= 3)"


def test_predicate_rejects_foreign_columns():
    with pytest.raises(ValueError, match="not a column of stream 'R'"):
        compile_predicate(where("S.x > 5"), ("x",), "R")
    with pytest.raises(ValueError, match="not among the columns"):
        compile_predicate(where("R.y > 5"), ("x",), "R")


def test_timestamp_constants_are_hoisted():
    types = {"R": {"t": "timestamp"}}
    pred = compile_predicate(where("R.t IN ('2024-01-01', '2024-01-02T00:00:00+01:00')"),
                             ("t",), "R", types)
    assert pred((datetime.datetime(2024, 1, 1, 23, 0),))
    assert not pred((datetime.datetime(2024, 1, 2),))
    assert "datetime" not in pred.source
    src = to_python(where("R.t > '2024-01-01'"), lambda c: "t", types)
    assert "datetime.datetime(2024, 1, 1, 0, 0)" in src


def test_division_by_zero_is_null():
    src = compile_projection([where("R.a / R.b")], lambda c: f"r[{'ab'.index(c.column)}]")
    fn = eval(f"lambda r: {src}", eval_namespace())
    assert fn((1, 0)) == (None,) and fn((1, 2)) == (0.5,) and fn((None, 2)) == (None,)


def test_projection_of_output_columns():
    q = parse_query("SELECT R.a, R.a + R.b AS s, R.a > 1 AS big, -R.b AS nb FROM R")
    src = compile_projection(q.outputs, lambda c: f"r[{q.columns['R'].index(c.column)}]")
    fn = eval(f"lambda r: {src}", eval_namespace())
    assert fn((2, 3)) == (2, 5, True, -3)
    assert fn((None, 3)) == (None, None, None, -3)
    assert compile_projection([], lambda c: "x") == "()"


# ----- property: compiled code agrees with a reference 3VL evaluator --------------------------
def _and3(a, b):
    if a is False or b is False:
        return False
    return None if a is None or b is None else True


def _or3(a, b):
    if a is True or b is True:
        return True
    return None if a is None or b is None else False


def _arith(op, a, b):
    if a is None or b is None:
        return None
    if op == "/":
        return None if b == 0 else a / b
    return {"+": a + b, "-": a - b, "*": a * b}[op]


_CMP = {exp.EQ: "==", exp.NEQ: "!=", exp.LT: "<", exp.LTE: "<=", exp.GT: ">", exp.GTE: ">="}
_OPS = {exp.Add: "+", exp.Sub: "-", exp.Mul: "*", exp.Div: "/"}


def reference(node: exp.Expression, row: dict):
    """Evaluate ``node`` on ``row`` by the SQL three-valued-logic truth tables, naively."""
    if isinstance(node, exp.Paren):
        return reference(node.this, row)
    if isinstance(node, exp.Column):
        return row[node.name]
    if isinstance(node, exp.Literal):
        return node.this if node.is_string else int(node.this)
    if isinstance(node, exp.Null):
        return None
    if isinstance(node, exp.Boolean):
        return node.this
    if isinstance(node, exp.Neg):
        v = reference(node.this, row)
        return None if v is None else -v
    if type(node) in _OPS:
        return _arith(_OPS[type(node)], reference(node.this, row),
                      reference(node.expression, row))
    if type(node) in _CMP:
        a, b = reference(node.this, row), reference(node.expression, row)
        return None if a is None or b is None else eval(f"a {_CMP[type(node)]} b")
    if isinstance(node, exp.Between):
        x = reference(node.this, row)
        lo, hi = reference(node.args["low"], row), reference(node.args["high"], row)
        ge = None if x is None or lo is None else x >= lo
        le = None if x is None or hi is None else x <= hi
        return _and3(ge, le)
    if isinstance(node, exp.In):
        x, result = reference(node.this, row), False
        for item in node.expressions:
            v = reference(item, row)
            result = _or3(result, None if x is None or v is None else x == v)
        return result
    if isinstance(node, exp.Is):
        return reference(node.this, row) is None
    if isinstance(node, exp.Not):
        v = reference(node.this, row)
        return None if v is None else not v
    if isinstance(node, exp.And):
        return _and3(reference(node.this, row), reference(node.expression, row))
    if isinstance(node, exp.Or):
        return _or3(reference(node.this, row), reference(node.expression, row))
    raise AssertionError(node)


_LEAVES = st.sampled_from(["R.a", "R.b", "R.c", "0", "1", "2", "-1", "NULL"])
_VALUES = st.recursive(
    _LEAVES,
    lambda inner: st.one_of(
        st.tuples(inner, st.sampled_from(["+", "-", "*", "/"]), inner).map(
            lambda t: f"({t[0]} {t[1]} {t[2]})"),
        inner.map(lambda v: f"-({v})")),
    max_leaves=4)


def _atoms(values):
    cmp = st.tuples(values, st.sampled_from(["=", "<>", "!=", "<", "<=", ">", ">="]), values)
    return st.one_of(
        cmp.map(lambda t: f"{t[0]} {t[1]} {t[2]}"),
        st.tuples(values, values, values).map(lambda t: f"{t[0]} BETWEEN {t[1]} AND {t[2]}"),
        st.tuples(values, st.lists(values, min_size=1, max_size=3)).map(
            lambda t: f"{t[0]} IN ({', '.join(t[1])})"),
        st.tuples(values, st.booleans()).map(
            lambda t: f"{t[0]} IS {'NOT ' if t[1] else ''}NULL"),
        st.sampled_from(["TRUE", "FALSE", "NULL"]),
    )


_CONDITIONS = st.recursive(
    _atoms(_VALUES),
    lambda inner: st.one_of(
        inner.map(lambda c: f"NOT ({c})"),
        st.tuples(inner, st.sampled_from(["AND", "OR"]), inner).map(
            lambda t: f"({t[0]}) {t[1]} ({t[2]})"),
        inner.map(lambda c: f"({c}) IS NULL"),
    ),
    max_leaves=6)
_ROWS = st.tuples(*[st.one_of(st.none(), st.integers(-2, 2))] * 3)
_COLUMNS = ("a", "b", "c")


@settings(max_examples=examples(400), deadline=None)
@given(_CONDITIONS, st.lists(_ROWS, min_size=1, max_size=8))
def test_compiled_predicates_agree_with_reference(text, rows):
    node = where(text)
    pred = compile_predicate(node, _COLUMNS, "R")
    value = eval(f"lambda r: {to_python(node, _resolve_abc)}", eval_namespace())
    for row in rows:
        expected = reference(node, dict(zip(_COLUMNS, row, strict=True)))
        assert value(row) is expected, (text, row, expected)
        assert pred(row) is (expected is True), (text, row, expected)


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(_VALUES, min_size=1, max_size=3), st.lists(_ROWS, min_size=1, max_size=8))
def test_compiled_projections_agree_with_reference(texts, rows):
    nodes = [sqlglot.parse_one(f"SELECT {t} FROM R").expressions[0] for t in texts]
    fn = eval(f"lambda r: {compile_projection(nodes, _resolve_abc)}", eval_namespace())
    for row in rows:
        env = dict(zip(_COLUMNS, row, strict=True))
        assert fn(row) == tuple(reference(n, env) for n in nodes)


def _resolve_abc(ref: ColumnRef) -> str:
    return f"r[{_COLUMNS.index(ref.column)}]"
