"""Literals compared with date and decimal columns, NOT BETWEEN on NaN, and -0.0 in IN lists:
every executor keeps exactly the rows SQL keeps (found by fuzzing against DuckDB,
2026-11-27; each case failed before: a date column against a date literal raised
TypeError or matched nothing, a decimal column never equalled 1.1, NOT BETWEEN dropped NaN
in the per-tuple executors only, and the vectorized IN told -0.0 from 0.0)."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import adaptcq
from adaptcq.errors import QueryError
from adaptcq.query.cql import parse_query
from conftest import examples

EXECUTORS = ("vector", "mjoin", "xjoin", "tree", "eddy")
"""Every single-query executor that evaluates selections its own way, and ``eddy``: a query
set's engine (``adaptcq.Engine``), whose grouped filters read constants through
``query.cnf``."""


def _tables(column: pa.Array) -> dict[str, pa.Table]:
    n = len(column)
    return {"R": pa.table({"ts": list(range(n)), "k": [0] * n, "id": list(range(n)),
                           "v": column}),
            "S": pa.table({"ts": [n], "k": [0]})}


def _run(sql: str, tables: dict, executor: str) -> pa.Table:
    if executor == "eddy":
        engine = adaptcq.Engine(tables)
        handle = engine.register(sql)
        engine.run()
        assert handle.state == "running", handle.error
        return handle.table()
    return adaptcq.run(sql, tables, executor=executor).table


def kept(where: str, column: pa.Array, executor: str) -> list[int]:
    """The row numbers of R whose value ``v`` passes ``where``, in a join with S."""
    res = _run(f"SELECT R.id AS id FROM R, S WHERE R.k = S.k AND {where}", _tables(column),
               executor)
    return sorted(res.column("id").to_pylist())


DATES = pa.array([dt.date(2024, 1, 1), dt.date(2024, 1, 3), None], pa.date32())


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize(("where", "want"), [
    ("R.v = DATE '2024-01-01'", [0]),
    ("R.v = '2024-01-01'", [0]),
    ("R.v <> DATE '2024-01-01'", [1]),
    ("R.v < DATE '2024-01-02'", [0]),
    ("R.v >= '2024-01-02'", [1]),
    ("R.v BETWEEN DATE '2024-01-01' AND DATE '2024-01-02'", [0]),
    ("R.v NOT BETWEEN DATE '2024-01-02' AND DATE '2024-01-05'", [0]),
    ("R.v IN (DATE '2024-01-03', DATE '2024-02-01')", [1]),
    ("R.v NOT IN ('2024-01-03')", [0]),
    ("R.v = TIMESTAMP '2024-01-03 00:00:00'", [1]),   # midnight: the date itself
    ("DATE '2024-01-02' > R.v", [0]),
])
def test_a_date_column_against_time_literals(executor, where, want):
    assert kept(where, DATES, executor) == want
    assert kept(where, DATES.cast(pa.date64()), executor) == want


def test_a_date_against_a_time_of_day_or_a_timestamp_column_is_refused():
    sch = {"R": {"ts": "number", "k": "number", "d": "date", "t": "timestamp"},
           "S": {"ts": "number", "k": "number"}}
    with pytest.raises(QueryError, match="has a time of day") as info:
        parse_query("SELECT R.k FROM R, S WHERE R.k = S.k AND R.d < '2024-01-02 12:00'", sch)
    assert info.value.sql[info.value.position:].startswith("'2024-01-02 12:00'")
    with pytest.raises(QueryError, match="cannot compare a date with a timestamp"):
        parse_query("SELECT R.k FROM R, S WHERE R.k = S.k AND R.d < R.t", sch)
    with pytest.raises(QueryError, match="cannot compare a date with the number 5"):
        parse_query("SELECT R.k FROM R, S WHERE R.k = S.k AND R.d = 5", sch)
    # A timestamp literal beside a timestamp column stays what it was.
    parse_query("SELECT R.k FROM R, S WHERE R.k = S.k AND R.t < '2024-01-02 12:00'", sch)


DECIMALS = pa.array([Decimal("1.10"), Decimal("0.10"), Decimal("-2.50"), None],
                    pa.decimal128(10, 2))


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize(("where", "want"), [
    ("R.v = 1.1", [0]),
    ("R.v = 0.1", [1]),
    ("R.v = 1.10", [0]),
    ("R.v <> 0.1", [0, 2]),
    ("R.v >= 0.1", [0, 1]),
    ("R.v > 0.1", [0]),
    ("R.v IN (0.1, 1.1)", [0, 1]),
    ("R.v NOT IN (0.1, 7)", [0, 2]),
    ("R.v BETWEEN 0.1 AND 1.1", [0, 1]),
    ("R.v = -2.5", [2]),
    ("R.v = -(2.5)", [2]),
    ("R.v < 1", [1, 2]),
    ("R.v = 1e-1", [1]),
    ("-R.v = -0.1", [1]),                          # still a decimal: the literal is exact
    ("R.v = 0.1000000000000000000000000000001", []),  # not rounded to 28 digits
])
def test_a_decimal_column_against_number_literals_is_exact(executor, where, want):
    assert kept(where, DECIMALS, executor) == want


@pytest.mark.parametrize("executor", ["mjoin", "xjoin", "tree", "acaching", "eddy"])
def test_literals_in_select_expressions(executor):
    """A comparison with a decimal, date or timestamp literal in SELECT (compiled into the
    pipelines' code: ``Decimal(...)`` and ``datetime...`` must be known there; a NameError
    at the first result before)."""
    tabs = _tables(DECIMALS.slice(0, 2))
    tabs["R"] = tabs["R"].append_column("d", DATES.slice(0, 2)).append_column(
        "t", pa.array([dt.datetime(2024, 1, 1), dt.datetime(2024, 1, 2)], pa.timestamp("us")))
    got = _run("SELECT R.id, R.v = 1.1 AS a, R.v IN (0.1, 7) AS b, R.d = DATE '2024-01-03' "
               "AS c, R.t = TIMESTAMP '2024-01-02 00:00:00' AS e FROM R, S WHERE R.k = S.k",
               tabs, executor)
    rows = sorted(got.select(["id", "a", "b", "c", "e"]).to_pylist(), key=lambda r: r["id"])
    assert [(r["a"], r["b"], r["c"], r["e"]) for r in rows] == [
        (True, False, False, False), (False, True, True, True)]


@pytest.mark.parametrize("executor", ["vector", "mjoin", "xjoin", "tree"])
def test_not_between_keeps_nan_as_not_less_or_equal_does(executor):
    """(The eddy's grouped filters are the documented exception for NaN: cacq-filters.md.)"""
    values = pa.array([float("nan"), 2.0, 0.5, None])
    assert kept("R.v NOT BETWEEN 0 AND 1", values, executor) == [0, 1]
    assert kept("NOT (R.v BETWEEN 0 AND 1)", values, executor) == [0, 1]
    assert kept("NOT (R.v <= 1)", values, executor) == [0, 1]
    assert kept("R.v BETWEEN 0 AND 1", values, executor) == [2]


@pytest.mark.parametrize("executor", EXECUTORS)
def test_minus_zero_is_zero_in_an_in_list(executor):
    values = pa.array([-0.0, 0.0, 5.0])
    assert kept("R.v IN (0.0, 5.0)", values, executor) == [0, 1, 2]
    assert kept("R.v IN (-0.0)", values, executor) == [0, 1]
    assert kept("R.v NOT IN (0.0)", values, executor) == [2]


@settings(max_examples=examples(40), deadline=None)
@given(st.lists(st.one_of(st.none(), st.decimals(min_value=-5, max_value=5, places=2)),
                min_size=1, max_size=8),
       st.decimals(min_value=-5, max_value=5, places=1),
       st.sampled_from(["=", "<>", "<", "<=", ">", ">="]))
def test_decimal_comparisons_are_pythons_exact_ones(values, literal, op):
    """Every executor keeps the rows Python's exact Decimal comparison keeps."""
    compare = {"=": Decimal.__eq__, "<>": Decimal.__ne__, "<": Decimal.__lt__,
               "<=": Decimal.__le__, ">": Decimal.__gt__, ">=": Decimal.__ge__}[op]
    want = [i for i, v in enumerate(values) if v is not None and compare(v, literal)]
    column = pa.array(values, pa.decimal128(10, 2))
    text = format(literal, "f")
    for executor in ("vector", "mjoin", "eddy"):
        assert kept(f"R.v {op} {text}", column, executor) == want, executor


def test_join_columns_of_two_kinds_are_refused_with_a_caret():
    sch = {"R": {"ts": "number", "s": "string", "d": "decimal"},
           "S": {"ts": "number", "k": "number", "e": "date", "t": "timestamp"}}
    with pytest.raises(QueryError, match="R.s is a string, S.k is a number") as info:
        parse_query("SELECT R.s FROM R, S WHERE R.s = S.k", sch)
    assert info.value.sql[info.value.position:].startswith("R.s = S.k")
    parse_query("SELECT R.s FROM R, S WHERE R.d = S.k", sch)   # a decimal is a number
    with pytest.raises(QueryError, match="a date never equals a timestamp"):
        parse_query("SELECT S.k FROM S, S AS T WHERE S.e = T.t", {"S": sch["S"]})
