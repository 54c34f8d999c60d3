"""User-defined functions in a query's SQL (cacq.txt §5, Figure 11(b); query.udf)."""

from __future__ import annotations

import datetime

import pytest

from adaptcq.engine.continuous import ContinuousQuery
from adaptcq.errors import OptionError, QueryError
from adaptcq.query.cnf import classify, to_cnf
from adaptcq.query.cql import parse_query
from adaptcq.query.expr import ExprError, compile_predicate, compile_projection, eval_namespace
from adaptcq.query.udf import (
    UDFError,
    default_registry,
    register_udf,
    udf_symbol,
    unregister_udf,
)

SCHEMAS = {"S": {"price": "number", "symbol": "string", "ts": "timestamp", "tags": "list"},
           "T": {"symbol": "string", "n": "number"}}
ROWS = [(120, "IBM"), (90, "IBM"), (150, "X"), (None, "MSFT"), (101, None)]


def interesting(price, symbol):
    if price is None or symbol is None:
        return None
    return price > 100 and symbol != "X"


def test_a_udf_filters_rows_as_the_function_says():
    registry: dict = {}
    assert register_udf("interesting", interesting, registry=registry) is interesting
    q = parse_query("SELECT S.price FROM S WHERE interesting(s.price, s.symbol)", SCHEMAS,
                    udfs=registry)
    sel = q.selections["S"]
    assert q.columns["S"] == ("price", "symbol")
    pred = compile_predicate(sel, q.columns["S"], "S", q.types, udfs=registry)
    assert [pred(r) for r in ROWS] == [interesting(*r) is True for r in ROWS]
    assert udf_symbol("interesting") in pred.source


def test_udf_compared_with_a_literal_and_in_arithmetic():
    udfs = {"score": lambda x: None if x is None else x / 10}
    q = parse_query("SELECT S.price FROM S WHERE score(S.price) + 1 > 11 AND "
                    "NOT score(S.price) IN (15)", SCHEMAS, udfs=udfs)
    pred = compile_predicate(q.selections["S"], q.columns["S"], "S", q.types, udfs=udfs)
    assert [pred((p,)) for p in (120, 100, 150, None)] == [True, False, False, False]


def test_arguments_and_results_follow_sql_nulls():
    seen = []

    def f(*args):
        seen.append(args)
        return args[0]

    udfs = {"f": f}
    q = parse_query("SELECT S.price FROM S WHERE f(S.price, S.price + 1, 'x', "
                    "TIMESTAMP '2024-01-01', NULL)", SCHEMAS, udfs=udfs)
    pred = compile_predicate(q.selections["S"], q.columns["S"], "S", q.types, udfs=udfs)
    assert pred((None,)) is False  # f returned None: UNKNOWN
    assert seen == [(None, None, "x", datetime.datetime(2024, 1, 1), None)]
    assert pred((0,)) is False and pred((3,)) is True
    # NOT UNKNOWN is UNKNOWN: NOT f(...) does not pass a NULL result either
    q = parse_query("SELECT S.price FROM S WHERE NOT f(S.price)", SCHEMAS, udfs=udfs)
    pred = compile_predicate(q.selections["S"], q.columns["S"], "S", q.types, udfs=udfs)
    assert [pred((v,)) for v in (None, 0, 3)] == [False, True, False]


def test_one_call_per_row_for_a_guarded_comparison():
    calls = []

    def score(x):
        calls.append(x)
        return x

    udfs = {"score": score}
    q = parse_query("SELECT S.price FROM S WHERE score(S.price) > 3", SCHEMAS, udfs=udfs)
    pred = compile_predicate(q.selections["S"], q.columns["S"], "S", q.types, udfs=udfs)
    assert pred((5,)) and not pred((None,))
    assert calls == [5, None]


def test_udf_on_a_list_column():
    udfs = {"has": lambda tags, t: tags is not None and t in tags}
    q = parse_query("SELECT S.price FROM S WHERE has(S.tags, 'hot')", SCHEMAS, udfs=udfs)
    pred = compile_predicate(q.selections["S"], q.columns["S"], "S", q.types, udfs=udfs)
    i = q.columns["S"].index("tags")
    assert [pred(tuple(v if k == i else 0 for k in range(len(q.columns["S"]))))
            for v in (["hot"], ["cold"], None)] == [True, False, False]


def test_unknown_function_is_refused_at_its_position():
    udfs = {"score": abs}
    sql = "SELECT S.price FROM S WHERE S.price > 1 AND scor(S.price) > 3"
    with pytest.raises(QueryError) as info:
        parse_query(sql, SCHEMAS, udfs=udfs)
    err = info.value
    assert "function SCOR is not supported" in err.message
    assert "registered: score" in err.message
    assert err.sql[err.position:].startswith("scor(")
    with pytest.raises(QueryError, match="no UDF is registered under that name"):
        parse_query(sql, SCHEMAS, udfs={})
    # built-in functions stay refused as before
    with pytest.raises(QueryError, match="function UPPER is not supported"):
        parse_query("SELECT S.price FROM S WHERE upper(S.symbol) = 'X'", SCHEMAS, udfs=udfs)


def test_a_raising_udf_names_itself():
    def fragile(x):
        raise KeyError(x)

    udfs = {"fragile": fragile}
    q = parse_query("SELECT S.price FROM S WHERE fragile(S.price)", SCHEMAS, udfs=udfs)
    pred = compile_predicate(q.selections["S"], q.columns["S"], "S", q.types, udfs=udfs)
    with pytest.raises(UDFError, match="UDF 'fragile' raised KeyError") as info:
        pred((1,))
    assert info.value.name == "fragile" and isinstance(info.value.__cause__, KeyError)


def test_udf_is_an_opaque_atom():
    udfs = {"score": abs}
    q = parse_query("SELECT S.price FROM S WHERE score(S.price) > 3 OR S.price < 0",
                    SCHEMAS, udfs=udfs)
    (clause,) = to_cnf(q.selections["S"], q.sql)
    kinds = [classify(a, "S", q.columns["S"], q.types).kind for a in clause]
    assert kinds == ["opaque", "simple"]


def test_udfs_in_the_select_list():
    udfs = {"Double": lambda x: None if x is None else 2 * x}
    q = parse_query("SELECT double(S.price) AS d, DOUBLE(S.price) + 1 AS e FROM S", SCHEMAS,
                    udfs=udfs)
    cols = q.columns["S"]
    src = compile_projection(q.outputs, lambda c: f"r[{cols.index(c.column)}]", q.types,
                             udfs=udfs)
    fn = eval(f"lambda r: {src}", eval_namespace(udfs))
    assert fn((3,)) == (6, 7) and fn((None,)) == (None, None)
    # source text for a namespace the caller builds: the UDFs must be named explicitly
    with pytest.raises(ExprError, match="needs the UDFs"):
        compile_projection(q.outputs, lambda c: "r[0]", q.types)


def test_udf_across_two_streams_is_not_a_join_predicate():
    with pytest.raises(QueryError, match="non-equi predicate between streams S and T"):
        parse_query("SELECT S.price FROM S, T WHERE S.symbol = T.symbol AND "
                    "near(S.price, T.n)", SCHEMAS, udfs={"near": lambda a, b: True})


def test_registration_rules():
    registry: dict = {}
    register_udf("Score", abs, registry=registry)
    register_udf("SCORE", round, registry=registry)  # case-insensitive: replaces
    assert registry == {"score": round}
    unregister_udf("sCoRe", registry=registry)
    assert registry == {}
    with pytest.raises(OptionError, match="built-in function UPPER"):
        register_udf("upper", str.upper, registry=registry)
    with pytest.raises(OptionError, match="not an identifier"):
        register_udf("my-udf", abs, registry=registry)
    with pytest.raises(OptionError, match="keyword"):
        register_udf("select", abs, registry=registry)
    with pytest.raises(TypeError, match="not callable"):
        register_udf("ok", 42, registry=registry)
    with pytest.raises(OptionError, match="two UDFs are named"):
        parse_query("SELECT S.price FROM S", SCHEMAS, udfs={"f": abs, "F": round})


def test_default_registry_reaches_the_single_query_engine():
    """A UDF registered process-wide is seen by parse_query and compile_predicate without
    udfs=, so ContinuousQuery runs a WHERE that calls it."""
    register_udf("adaptcq_test_pos", lambda x: x is not None and x > 0)
    try:
        assert "adaptcq_test_pos" in default_registry()
        q = parse_query("SELECT R.a, S.b FROM R, S WHERE R.k = S.k AND adaptcq_test_pos(R.a)")
        cq = ContinuousQuery(q, "mjoin", "append")
        out = cq.process([0, 0, 1], None, [1, 2, 3], [(1, -5), (1, 7), (1, 9)])
        assert [r[:2] for r in out] == [(7, 9)]
    finally:
        unregister_udf("adaptcq_test_pos")
    with pytest.raises(QueryError, match="function ADAPTCQ_TEST_POS is not supported"):
        parse_query("SELECT R.a FROM R WHERE adaptcq_test_pos(R.a)")


def test_an_untyped_udf_result_in_select_is_refused_with_the_reason():
    """A UDF's value has no declared type: engines writing typed output refuse it as an
    output column, naming why; inside a condition it is boolean and runs."""
    import pyarrow as pa

    import adaptcq
    from adaptcq.errors import QueryError
    from adaptcq.query.udf import register_udf, unregister_udf
    register_udf("score_t", lambda v: v / 10)
    try:
        t = pa.table({"ts": [0.0, 1.0], "symbol": ["A", "B"], "volume": [50.0, 10.0]})
        eng = adaptcq.Engine(sources={"stocks": t}, timestamp="ts")
        with pytest.raises(QueryError, match="a UDF's result has no declared type"):
            eng.register("SELECT s.symbol, score_t(s.volume) AS x FROM stocks s")
        h = eng.register("SELECT s.symbol, score_t(s.volume) > 3 AS hot FROM stocks s")
        eng.run()
        assert h.table().column("hot").to_pylist() == [True, False]
    finally:
        unregister_udf("score_t")
