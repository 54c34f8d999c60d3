"""The CQL front end refuses what it would otherwise run with another meaning, and says
where: star modifiers, column lists on table aliases, joins other than inner ones, non-boolean
values as conditions, placeholders, arrays; and a [RANGE w] size is kept exact to the
nanosecond (docs/semantics.md, "Window boundaries"; a-caching.txt §7.1 for the windows).
"""

from __future__ import annotations

import dataclasses
import datetime
from decimal import Decimal

import duckdb
import pyarrow as pa
import pytest
import sqlglot.parser
from hypothesis import given, settings
from hypothesis import strategies as st

import adaptcq
from adaptcq.errors import QueryError
from adaptcq.query.cql import parse_query
from adaptcq.query.logical import Window

SCHEMAS = {
    "R": {"ts": "number", "a": "number", "b": "number", "s": "string", "t": "timestamp",
          "d": "date", "m": "decimal", "f": "bool"},
    "S": {"ts": "number", "a": "number", "c": "number"},
}


def error_of(sql: str, schemas=SCHEMAS) -> QueryError:
    with pytest.raises(QueryError) as info:
        parse_query(sql, schemas)
    assert info.value.sql == sql
    return info.value


def points_at(err: QueryError, text: str) -> bool:
    return err.position is not None and err.sql[err.position:].startswith(text)


# ----- 1. star modifiers ---------------------------------------------------------------------
@pytest.mark.parametrize(("sql", "word"), [
    ("SELECT * EXCLUDE (b) FROM R, S WHERE R.a = S.a", "EXCLUDE"),
    ("SELECT * EXCEPT (c) FROM R, S WHERE R.a = S.a", "EXCEPT"),
    ("SELECT R.* EXCLUDE (b) FROM R, S WHERE R.a = S.a", "EXCLUDE"),
    ("SELECT * REPLACE (0 AS a) FROM R, S WHERE R.a = S.a", "REPLACE"),
    ("SELECT R.* RENAME (b AS bb) FROM R, S WHERE R.a = S.a", "RENAME"),
    ("SELECT S.a, * ILIKE '%a' FROM R, S WHERE R.a = S.a", "ILIKE"),
])
def test_star_modifiers_are_refused_at_the_modifier(sql, word):
    err = error_of(sql)
    assert err.message.startswith(f"{word} after '") and "not supported" in err.message
    assert points_at(err, word)
    # (the name in both streams, ts, is not reported as ambiguous first)
    assert "ambiguous" not in err.message


def test_plain_stars_still_expand():
    q = parse_query("SELECT R.*, S.* FROM R, S WHERE R.a = S.a", SCHEMAS)
    assert [o.name for o in q.outputs][:3] == ["R_ts", "R_a", "R_b"]
    assert len(q.outputs) == len(SCHEMAS["R"]) + len(SCHEMAS["S"])


def test_star_modifier_through_run_is_a_query_error():
    R = pa.table({"ts": [1], "a": [1], "b": [3]})
    S = pa.table({"ts": [1], "a": [1]})
    with pytest.raises(QueryError, match="EXCLUDE after"):
        adaptcq.run("SELECT * EXCLUDE (b) FROM R, S WHERE R.a = S.a", {"R": R, "S": S},
                    executor="mjoin")


# ----- 2. column lists on table aliases ------------------------------------------------------
@pytest.mark.parametrize("sql", [
    "SELECT x.ts FROM R AS x(ts, b, a), S WHERE x.a = S.a",
    "SELECT x.ts FROM R x (ts), S WHERE x.a = S.a",
    "SELECT x.ts FROM S JOIN R AS x(a) ON x.a = S.a",
])
def test_table_alias_column_lists_are_refused(sql):
    err = error_of(sql)
    assert "a column list on the alias 'x'" in err.message and "not supported" in err.message
    assert points_at(err, "(")


def test_plain_alias_reads_the_stream_columns():
    q = parse_query("SELECT x.b FROM R AS x, S WHERE x.a = S.a", SCHEMAS)
    assert q.streams[0].alias == "x" and q.columns["x"] == ("a", "b")


# ----- 3. only inner joins -------------------------------------------------------------------
@pytest.mark.parametrize(("join", "words"), [
    ("ASOF JOIN", "ASOF JOIN"),
    ("POSITIONAL JOIN", "POSITIONAL JOIN"),
    ("ANY JOIN", "ANY JOIN"),
    ("STRAIGHT_JOIN", "STRAIGHT_JOIN"),
    ("SEMI JOIN", "SEMI JOIN"),
    ("ANTI JOIN", "ANTI JOIN"),
    ("LEFT OUTER JOIN", "LEFT OUTER JOIN"),
    ("NATURAL LEFT JOIN", "NATURAL LEFT JOIN"),
    ("CROSS JOIN", "CROSS JOIN"),
])
def test_joins_other_than_inner_are_refused_at_their_first_word(join, words):
    sql = f"SELECT R.a FROM R {join} S ON R.a = S.a"
    err = error_of(sql)
    assert f"{words} (only inner joins) is not supported" in err.message
    assert points_at(err, join.split()[0])


def test_an_alias_named_like_a_join_word_is_an_alias_after_as():
    """(``R AS loop JOIN S`` was refused as a LOOP JOIN, a regression of the refusal of
    other dialects' join words read as aliases.)"""
    for word in ("loop", "merge", "hash", "global", "positional", "lookup", "all"):
        q = parse_query(f"SELECT s.a FROM R [RANGE 10] AS {word} JOIN S [RANGE 10] s "
                        f"ON {word}.a = s.a")
        assert [s.alias for s in q.streams] == [word, "s"]


def test_a_later_join_is_pointed_at_not_the_first_keyword_of_its_kind():
    sql = 'SELECT R.a AS "left" FROM R JOIN S ON R.a = S.a LEFT JOIN S AS T ON T.a = R.a'
    err = error_of(sql)
    assert err.position == sql.index("LEFT")


def test_every_join_word_sqlglot_knows_is_refused():
    """Each method, side and kind sqlglot's parser can put on a join: the query parses
    (or is a syntax error), and is never run as an inner join."""
    words = {t.name for t in (sqlglot.parser.Parser.JOIN_METHODS
                              | sqlglot.parser.Parser.JOIN_SIDES
                              | sqlglot.parser.Parser.JOIN_KINDS)}
    assert {"ASOF", "NATURAL", "POSITIONAL", "LEFT", "SEMI"} <= words
    for word in sorted(words - {"INNER"}):
        sql = f"SELECT R.a FROM R {word} JOIN S ON R.a = S.a"
        err = error_of(sql)
        assert "not supported" in err.message or "syntax error" in err.message, sql


@pytest.mark.parametrize("sql", [
    "SELECT R.a FROM R JOIN S ON R.a = S.a",
    "SELECT R.a FROM R INNER JOIN S ON R.a = S.a",
    "SELECT R.a FROM R, S WHERE R.a = S.a",
    "SELECT any_.a FROM R AS any_, S WHERE any_.a = S.a",
])
def test_inner_joins_are_accepted(sql):
    assert len(parse_query(sql, SCHEMAS).predicates) == 1


def test_asof_join_through_run_is_refused():
    R = pa.table({"ts": [1], "a": [1]})
    S = pa.table({"ts": [1, 2, 3], "a": [1, 1, 1]})
    with pytest.raises(QueryError, match="ASOF JOIN"):
        adaptcq.run("SELECT R.a AS ra, S.ts AS sts FROM R ASOF JOIN S ON R.a = S.a",
                    {"R": R, "S": S}, executor="mjoin")


# ----- 4. what may stand as a condition ------------------------------------------------------
@pytest.mark.parametrize("column", ["R.s", "R.t", "R.d"])
@pytest.mark.parametrize("form", [
    "SELECT R.a FROM R WHERE {c}",
    "SELECT R.a FROM R WHERE NOT {c}",
    "SELECT R.a FROM R WHERE R.a > 1 AND ({c} OR R.f)",
    "SELECT R.a, {c} OR FALSE AS x FROM R",
    "SELECT R.a, NOT {c} AS x FROM R",
])
def test_strings_and_times_are_not_conditions(column, form):
    sql = form.format(c=column)
    err = error_of(sql)
    assert f"{column} is a" in err.message and "not a condition" in err.message
    assert points_at(err, column)


@pytest.mark.parametrize(("where", "at"), [
    ("'true'", "'true'"),
    ("TIMESTAMP '2024-01-01'", "TIMESTAMP"),
    ("DATE '2024-01-01' OR R.f", "DATE"),
])
def test_string_and_time_literals_are_not_conditions(where, at):
    err = error_of(f"SELECT R.a FROM R WHERE {where}")
    assert "not a condition" in err.message and points_at(err, at)


def test_strings_and_times_compared_or_tested_for_null_are_fine():
    parse_query("SELECT R.s IS NULL AS n FROM R WHERE R.s = 'x' AND R.t IS NOT NULL "
                "AND R.d = DATE '2024-01-01'", SCHEMAS)


def _number_rows(values):
    R = pa.table({"ts": list(range(len(values))), "k": [1] * len(values), "x": values})
    S = pa.table({"ts": [0], "k": [1]})
    return R, S


@settings(max_examples=25, deadline=None)
@given(values=st.lists(st.one_of(st.none(), st.integers(-3, 3)), min_size=1, max_size=8),
       floats=st.booleans())
def test_numbers_as_conditions_are_nonzero_as_in_duckdb(values, floats):
    """A number standing as a condition is TRUE when nonzero, FALSE when zero, UNKNOWN when
    NULL (DuckDB's cast to boolean), in WHERE and in SELECT, per row and vectorized."""
    values = [None if v is None else (v / 2 if floats else v) for v in values]
    R, S = _number_rows(pa.array(values, pa.float64() if floats else pa.int64()))
    con = duckdb.connect()
    con.register("R", R)
    con.register("S", S)
    where = "SELECT R.ts AS rts FROM R, S WHERE R.k = S.k AND {}"
    for cond in ("R.x", "NOT R.x", "(R.x OR FALSE)"):
        sql = where.format(cond)
        want = sorted(r[0] for r in con.execute(sql).fetchall())
        for executor in ("mjoin", "vector"):
            got = adaptcq.run(sql, {"R": R, "S": S}, executor=executor).table
            assert sorted(got.column("rts").to_pylist()) == want, (sql, executor)
    sql = "SELECT R.ts AS rts, (R.x OR FALSE) AS c FROM R, S WHERE R.k = S.k"
    want = sorted(con.execute(sql).fetchall(), key=lambda r: r[0])
    got = adaptcq.run(sql, {"R": R, "S": S}, executor="mjoin").table
    assert sorted(((r["rts"], r["c"]) for r in got.to_pylist()), key=lambda r: r[0]) == want


@pytest.mark.parametrize("executor", ["mjoin", "vector"])
def test_string_column_as_condition_refused_by_every_executor(executor):
    R = pa.table({"ts": [1, 2], "k": [1, 1], "s": ["true", "false"],
                  "t": pa.array([datetime.datetime(1970, 1, 1)] * 2, pa.timestamp("us"))})
    S = pa.table({"ts": [1], "k": [1]})
    for cond in ("R.s", "NOT R.t"):
        with pytest.raises(QueryError, match="not a condition"):
            adaptcq.run(f"SELECT R.k FROM R, S WHERE R.k = S.k AND {cond}",
                        {"R": R, "S": S}, executor=executor)


# ----- 5. [RANGE w] exact to the nanosecond --------------------------------------------------
def test_range_size_keeps_every_digit():
    w = parse_query("SELECT R.a FROM R [RANGE 100000000.000000001]").streams[0].window
    assert w.seconds == Decimal("100000000.000000001")
    assert w.in_units(1e-9) == 100_000_000_000_000_001
    assert str(w) == "[RANGE 100000000.000000001 SECONDS]"
    assert w != Window("range", 100_000_000)  # (their float sizes are equal)
    assert w.size == 1e8  # float seconds, for what computes in floats


@pytest.mark.parametrize(("clause", "text"), [
    ("[RANGE 1234567]", "[RANGE 1234567 SECONDS]"),
    ("[RANGE 1.5 MINUTES]", "[RANGE 90 SECONDS]"),
    ("[RANGE 500 MILLISECONDS]", "[RANGE 0.5 SECONDS]"),
    ("[RANGE 0.000001 MILLISECONDS]", "[RANGE 0.000000001 SECONDS]"),
    ("[RANGE 1e400]", "[RANGE 1E+400 SECONDS]"),
    ("[NOW]", "[RANGE 0 SECONDS]"),
])
def test_window_sizes_print_exactly(clause, text):
    w = parse_query(f"SELECT R.a FROM R {clause}").streams[0].window
    assert str(w) == text
    assert parse_query(f"SELECT R.a FROM R {text}").streams[0].window == w


@pytest.mark.parametrize("clause", ["[RANGE 1e-12]", "[RANGE 1.5e-9 SECONDS]",
                                    "[RANGE 0.0000001 MILLISECONDS]",
                                    "[RANGE 0.0000000001]"])
def test_sizes_finer_than_a_nanosecond_are_refused(clause):
    sql = f"SELECT R.a FROM R {clause}"
    err = error_of(sql, None)
    assert "has digits below a nanosecond" in err.message
    assert err.position == sql.index(clause.split()[1])


@pytest.mark.parametrize("clause", ["[RANGE 1e1000]", "[RANGE 1e999999]",
                                    "[RANGE 1E+1003 MILLISECONDS]"])
def test_sizes_of_10_to_the_1000_seconds_or_more_are_refused(clause):
    """(Converting 1e999999 seconds to nanoseconds took half a minute; any size beyond
    2^64 ns expires nothing on int64-nanosecond times, so such sizes lose nothing.)"""
    sql = f"SELECT R.a FROM R {clause}"
    err = error_of(sql, None)
    assert "10^1000 seconds or longer" in err.message
    assert err.position == sql.index(clause.split()[1])
    assert str(parse_query("SELECT R.a FROM R [RANGE 1e999]").streams[0].window) == \
        "[RANGE 1E+999 SECONDS]"


UNITS = {"": Decimal(1), " MILLISECONDS": Decimal("0.001"), " SECONDS": Decimal(1),
         " MINUTES": Decimal(60), " HOURS": Decimal(3600), " DAYS": Decimal(86400)}


@settings(max_examples=200, deadline=None)
@given(whole=st.integers(0, 10**12), fraction=st.integers(0, 10**12 - 1),
       places=st.integers(0, 12), unit=st.sampled_from(sorted(UNITS)),
       exponent=st.integers(-3, 3))
def test_range_sizes_are_exact_or_refused(whole, fraction, places, unit, exponent):
    """Any decimal size and unit: the window's nanoseconds are the exact product, or the
    size is refused when that is not whole; the printed window parses back to itself."""
    digits = f"{whole}.{str(fraction % 10**places).zfill(places)}" if places else str(whole)
    text = f"{digits}e{exponent}"
    exact = Decimal(text) * UNITS[unit] * 10**9
    sql = f"SELECT R.a FROM R [RANGE {text}{unit}]"
    if exact != exact.to_integral_value():
        assert "below a nanosecond" in error_of(sql, None).message
        return
    w = parse_query(sql).streams[0].window
    assert w.in_units(1e-9) == int(exact)
    assert parse_query(f"SELECT R.a FROM R {w}").streams[0].window == w


def test_windows_built_from_floats_compare_with_parsed_ones():
    assert Window("range", 0.001) == parse_query(
        "SELECT R.a FROM R [RANGE 1 MILLISECOND]").streams[0].window
    assert Window("range", 0.1).in_units(1e-9) == 100_000_000
    assert Window("range", 2.5).in_units(1.0) == 2.5
    exact = Window("range", Decimal("100000000.000000001"))
    assert dataclasses.replace(exact, size=5).in_units(1e-9) == 5 * 10**9


# ----- 6. refusals name the construct and point at it ----------------------------------------
@pytest.mark.parametrize(("sql", "at"), [
    ("SELECT R.a FROM R, S WHERE R.a = S.a AND R.a = ?", "?"),
    ("SELECT R.a FROM R, S WHERE R.a = S.a AND R.a = :p", ":p"),
    ("SELECT R.a FROM R WHERE R.a = 1 OR R.a > :x AND R.b = ?", ":x"),
    ("SELECT R.a FROM R WHERE R.a = @p", "@p"),
    ("SELECT R.a FROM R WHERE R.a = $1", "$1"),
])
def test_placeholders_are_refused_with_their_place(sql, at):
    err = error_of(sql, None)
    assert f"the query parameter '{at}'" in err.message and points_at(err, at)


@pytest.mark.parametrize(("where", "operator", "at"), [
    ("R.a > > 1", ">>", "> > 1"),
    ("R.a << 2 > 1", "<<", "<< 2"),
    ("R.a >> 1 = 0", ">>", ">> 1"),
    ("R.a IS DISTINCT FROM 1", "IS DISTINCT FROM", "IS DISTINCT"),
    ("R.a & 1 = 1", "&", "& 1"),
])
def test_operators_are_named_as_read(where, operator, at):
    err = error_of(f"SELECT R.a FROM R WHERE {where}", None)
    assert f"the {operator} operator is not supported" in err.message
    assert points_at(err, at)


@pytest.mark.parametrize(("sql", "at"), [
    ("SELECT R.a FROM R WHERE R.a IN [1, 2]", "[1, 2]"),
    ("SELECT R.a[1] FROM R", "[1]"),
    ("SELECT ARRAY[1] FROM R", "[1]"),
    ("SELECT R.a FROM R WHERE R.m['k'] = 1", "['k']"),
])
def test_brackets_that_are_no_window_say_so(sql, at):
    err = error_of(sql, None)
    assert "arrays, subscripts and [...] lists are not supported" in err.message
    assert "in a window clause" not in err.message
    assert points_at(err, at) and err.length == len(at)


def test_a_misspelt_window_is_still_called_a_window():
    err = error_of("SELECT R.a FROM R [RANG 5]", None)
    assert "unexpected 'RANG' in a window clause" in err.message and points_at(err, "RANG")


@pytest.mark.parametrize(("clause", "window"), [
    ("[RANGE /* c */ 1]", Window("range", 1)),
    ("[ROWS 2 /* ] */]", Window("rows", 2)),
    ("[RANGE 3 -- three\n SECONDS]", Window("range", 3)),
    ("[/* now */ NOW]", Window("range", 0)),
])
def test_comments_inside_window_clauses(clause, window):
    q = parse_query(f"SELECT R.a FROM R {clause} WHERE R.a > 1")
    assert q.streams[0].window == window and q.selections["R"].sql() == "R.a > 1"


@pytest.mark.parametrize("clause", ["[RANGE １]", "[ROWS ２]", "[RANGE 1٫5]"])
def test_non_ascii_digits_in_window_sizes_are_refused(clause):
    err = error_of(f"SELECT R.a FROM R {clause}", None)
    assert "window size" in err.message and points_at(err, clause.split()[1].rstrip("]"))


def test_a_window_rebuilt_with_replace_keeps_one_size():
    """``dataclasses.replace`` passes the old exact seconds along: a new Decimal size must
    win (the nanosecond engines used the old one), and another kind has none; a Window
    unpickled from before ``seconds`` existed prints and converts from its float size."""

    w = dataclasses.replace(Window("range", Decimal(10)), size=Decimal(20))
    assert (str(w), w.in_units(1e-9), w.in_units(1.0)) == ("[RANGE 20 SECONDS]",
                                                           20_000_000_000, 20)
    assert dataclasses.replace(Window("range", 10), kind="rows", size=5) == Window("rows", 5)
    old = Window.__new__(Window)
    old.__dict__.update(kind="range", size=2.5)  # (no "seconds": the class default None)
    assert (str(old), old.in_units(1e-9)) == ("[RANGE 2.5 SECONDS]", 2_500_000_000)
