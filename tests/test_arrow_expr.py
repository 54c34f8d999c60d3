"""Selections over column batches (query.arrow_expr) mean what the per-row compiler's do:
the same rows pass, with SQL's three-valued logic, NULLs, NaN and strings."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adaptcq.query.arrow_expr import arrow_predicate
from adaptcq.query.cql import parse_query
from adaptcq.query.expr import compile_predicate
from conftest import examples

SCHEMA = {"a": "number", "b": "number", "s": "string", "f": "bool"}
TABLE = pa.table({
    "a": pa.array([0, 1, 2, None, 5, -3, 2, None], pa.int64()),
    "b": pa.array([0.5, float("nan"), None, 2.0, -0.0, 1.0, 2.0, 3.5], pa.float64()),
    "s": pa.array(["x", "y", None, "é", "", "x", "yy", "b"], pa.string()),
    "f": pa.array([True, False, None, True, False, None, True, False], pa.bool_())})


@pytest.mark.parametrize("cond", [
    "R.a > 0", "R.a <> 1", "R.a IS NULL", "R.a IS NOT NULL", "R.a IN (0, 2)",
    "R.a NOT IN (0, 2)", "R.a BETWEEN 0 AND 2", "R.a NOT BETWEEN 0 AND 2",
    "(R.a BETWEEN 0 AND 1 OR R.a = 2)", "NOT (R.a > 1 AND R.b < 2)", "R.b >= 1",
    "R.b = 0", "R.b <> R.b", "R.a = R.b", "R.s = 'x'", "R.s > 'x'", "R.s IN ('x', 'é')",
    "R.f", "NOT R.f", "R.a > NULL", "R.a IN (1, 2.5)", "(R.a = 1 OR TRUE)",
    "R.a + 1 > 2", "R.a / R.b > 0", "R.a * R.a - 1 >= R.b", "-R.a < 1", "R.a / 0 IS NULL",
    "R.a / R.a = 1", "R.b * 2 + R.a BETWEEN 0 AND 6", "R.a - 2.5 IN (-0.5, 2.5)",
    "R.f AND R.a > 0", "(NOT R.f OR R.a IS NULL)",
])
def test_column_selection_equals_the_row_one(cond):
    q = parse_query(f"SELECT R.a FROM R, S WHERE R.a = S.a AND {cond}",
                    {"R": SCHEMA, "S": {"a": "number"}})
    expr = q.selections["R"]
    rowwise = compile_predicate(expr, q.columns["R"], "R", q.types)
    table = TABLE.select(list(q.columns["R"]))
    want = [bool(rowwise(r)) for r in zip(*(table.column(c).to_pylist()
                                            for c in table.column_names))]
    fn = arrow_predicate(expr, "R", q.types["R"])
    assert fn is not None
    assert fn(table).tolist() == want
    assert not any(isinstance(x, float) and math.isnan(x) for x in fn(table).tolist())
    assert np.asarray(fn(table)).dtype == bool


def _naive_utc(v):
    """A timestamp column's value as the per-row compiler sees it: naive UTC."""
    import datetime
    if v is not None and getattr(v, "tzinfo", None) is not None:
        v = v.astimezone(datetime.UTC).replace(tzinfo=None)
    return v


@pytest.mark.parametrize("typ", [pa.timestamp("s"), pa.timestamp("ms"), pa.timestamp("us"),
                                 pa.timestamp("us", "UTC"), pa.timestamp("ns", "UTC"),
                                 pa.timestamp("ms", "Europe/Paris")])
@pytest.mark.parametrize("cond", [
    "R.t >= '2024-01-01'", "R.t < TIMESTAMP '2024-01-01 00:00:02'", "R.t = '2023-12-31 23:00'",
    "R.t BETWEEN '2023-12-31T23:30:00' AND DATE '2024-01-02'",
    "R.t > '2024-01-01T01:00:00+01:00'", "R.t IS NULL", "R.t <> R.u", "R.t > NULL",
    "NOT (R.t < '2024-01-01' OR R.a > 1)", "'2024-01-01' <= R.t",
    "R.t IN ('2024-01-01', TIMESTAMP '2024-01-01 00:00:02')",
    "R.t NOT IN ('2023-12-31 23:00:00', '2024-01-02')",
])
def test_timestamp_columns_against_constants_equal_the_row_compiler(cond, typ):
    """A string compared with a timestamp column is a timestamp literal (naive UTC), the
    column's Arrow type whatever its unit and time zone: the rows the per-row compiler
    passes."""
    import datetime
    q = parse_query(f"SELECT R.a FROM R, S WHERE R.a = S.a AND {cond}",
                    {"R": {"a": "number", "t": "timestamp", "u": "timestamp"},
                     "S": {"a": "number"}})
    base = datetime.datetime(2024, 1, 1)
    ts = [base, base - datetime.timedelta(hours=1), None, base + datetime.timedelta(seconds=2),
          base + datetime.timedelta(days=1), base - datetime.timedelta(minutes=30)]
    table = pa.table({"a": pa.array([0, 1, 2, 3, 4, 5], pa.int64()),
                      "t": pa.array(ts, pa.timestamp(typ.unit)).cast(typ),
                      "u": pa.array(ts[::-1], pa.timestamp(typ.unit)).cast(typ)})
    table = table.select(list(q.columns["R"]))
    rowwise = compile_predicate(q.selections["R"], q.columns["R"], "R", q.types)
    want = [bool(rowwise(tuple(map(_naive_utc, r))))
            for r in zip(*(table.column(c).to_pylist() for c in table.column_names))]
    fn = arrow_predicate(q.selections["R"], "R", q.types["R"])
    assert fn is not None
    assert fn(table).tolist() == want


def test_a_timestamp_constant_a_column_cannot_hold_goes_per_row():
    """Half a second against a column in whole seconds: Arrow would round; the selection
    raises, and the vectorized executor then runs it per row."""
    q = parse_query("SELECT R.a FROM R, S WHERE R.a = S.a AND R.t > '2024-01-01 00:00:00.5'",
                    {"R": {"a": "number", "t": "timestamp"}, "S": {"a": "number"}})
    fn = arrow_predicate(q.selections["R"], "R", q.types["R"])
    table = pa.table({"a": [1], "t": pa.array([0], pa.timestamp("s"))}).select(
        list(q.columns["R"]))
    with pytest.raises(pa.ArrowTypeError):
        fn(table)


def test_a_timestamp_in_list_with_a_null_is_left_to_the_row_compiler():
    q = parse_query("SELECT R.a FROM R, S WHERE R.a = S.a AND "
                    "R.t IN ('2024-01-01', NULL)",
                    {"R": {"a": "number", "t": "timestamp"}, "S": {"a": "number"}})
    assert arrow_predicate(q.selections["R"], "R", q.types["R"]) is None


def test_a_selection_arrow_has_no_kernel_for_falls_back_per_row():
    """A decimal column against a float literal: the vectorized executor gives MJoin's rows
    (per row when Arrow compute cannot compare the types)."""
    import decimal

    import adaptcq
    r = pa.table({"ts": [0.0, 1.0, 2.0, 3.0], "id": [1, 2, 3, 4], "a": [1, 1, 1, 2],
                  "d": pa.array([decimal.Decimal("1.5"), decimal.Decimal("2.5"), None,
                                 decimal.Decimal("9.0")], pa.decimal128(5, 2))})
    s = pa.table({"ts": [0.5, 1.5, 3.5], "id": [7, 8, 9], "a": [1, 1, 2]})
    sql = "SELECT R.id AS r, S.id AS s FROM R, S WHERE R.a = S.a AND R.d > 2.25"
    v = adaptcq.run(sql, {"R": r, "S": s})
    m = adaptcq.run(sql, {"R": r, "S": s}, executor="mjoin")
    assert v.stats["executor"] == "vector"
    assert v.table.to_pylist() == m.table.to_pylist() and v.table.num_rows == 3


INT64 = (-(2**63), 2**63 - 1)


def _arith_expr(draw, depth=0):
    leaves = st.sampled_from(["R.i", "R.j", "R.x", "R.y", "0", "1", "-3", "2.5", "0.0",
                              "9223372036854775807", "-9223372036854775808",
                              "4611686018427387904", "9007199254740993"])
    if depth >= 3 or draw(st.booleans()):
        return draw(leaves)
    op = draw(st.sampled_from(["+", "-", "*", "/", "neg"]))
    if op == "neg":
        return f"-({_arith_expr(draw, depth + 1)})"
    return f"({_arith_expr(draw, depth + 1)} {op} {_arith_expr(draw, depth + 1)})"


def _numbers():
    ints = st.one_of(st.integers(-5, 5), st.sampled_from(
        [INT64[0], INT64[1], 2**53 + 1, -(2**53) - 1, 2**62, 3037000500]), st.none())
    floats = st.one_of(st.floats(allow_nan=True, allow_infinity=True, width=64),
                       st.sampled_from([0.0, -0.0, 0.5, 1e308]), st.none())
    return ints, floats


def _check_arith(data, cmp):
    ints, floats = _numbers()
    n = data.draw(st.integers(1, 6))
    cols = {"i": data.draw(st.lists(ints, min_size=n, max_size=n)),
            "j": data.draw(st.lists(ints, min_size=n, max_size=n)),
            "x": data.draw(st.lists(floats, min_size=n, max_size=n)),
            "y": data.draw(st.lists(floats, min_size=n, max_size=n))}
    types = {"i": data.draw(st.sampled_from([pa.int64(), pa.int32(), pa.int8()])),
             "j": pa.int64(),
             "x": data.draw(st.sampled_from([pa.float64(), pa.float32()])),
             "y": pa.float64()}
    try:
        table = pa.table({c: pa.array(v, types[c]) for c, v in cols.items()})
    except (pa.ArrowInvalid, OverflowError):
        return  # a value the column's type cannot hold
    cond = f"{_arith_expr(data.draw)} {cmp} {_arith_expr(data.draw)}"
    schema = {c: "number" for c in cols}
    try:
        q = parse_query(f"SELECT R.i FROM R, S WHERE R.i = S.i AND {cond}",
                        {"R": schema, "S": {"i": "number"}})
    except Exception:  # noqa: BLE001 - a query the compiler refuses is not the point
        return
    expr = q.selections["R"]
    rowwise = compile_predicate(expr, q.columns["R"], "R", q.types)
    t = table.select(list(q.columns["R"]))
    rows = list(zip(*(t.column(c).to_pylist() for c in t.column_names)))
    want = []
    for r in rows:
        try:
            want.append(bool(rowwise(r)))
        except (OverflowError, ZeroDivisionError):
            return  # Python itself fails on this row (e.g. int * inf beyond float)
    fn = arrow_predicate(expr, "R", q.types["R"])
    assert fn is not None, cond
    try:
        got = fn(t)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return  # overflow, or an integer beyond 2^53 in float arithmetic: the caller goes per row
    assert got.tolist() == want, (cond, rows)


@settings(max_examples=examples(400), deadline=None)
@given(data=st.data(), cmp=st.sampled_from(["<", "=", ">=", "<>"]))
def test_arithmetic_over_columns_equals_python(data, cmp):
    """Random arithmetic over int (int8/int32/int64) and float (float32/float64) columns
    with NULLs, zeros, NaN, infinities and int64's extremes: the column batch's answer is
    the per-row compiler's, or it raises for the caller to go per row (an overflow that
    Python's integers do not have, a cast beyond 2^53)."""
    _check_arith(data, cmp)


def test_integer_overflow_and_zero_divisors_give_pythons_answer_in_the_vector_executor():
    """Where int64 would wrap (2^62 + 2^62) the column batch raises and the vectorized
    executor evaluates the selection per row; a zero divisor is NULL (the row fails): the
    rows that pass are MJoin's."""
    import adaptcq
    big = 2**62
    r = pa.table({"ts": [0.0, 1.0, 2.0, 3.0], "id": [1, 2, 3, 4], "a": [1, 1, 1, 1],
                  "i": pa.array([big, 3, None, -big], pa.int64()),
                  "z": pa.array([0, 2, 1, 0], pa.int64())})
    s = pa.table({"ts": [0.5, 1.5, 3.5], "id": [7, 8, 9], "a": [1, 1, 1]})
    for cond, passing in (("R.i + R.i > 0", {1, 2}), ("R.i * 2 < 0", {4}),
                          ("R.i / R.z >= 1.5", {2}), ("NOT (R.i / R.z < 0)", {2})):
        sql = f"SELECT R.id AS r, S.id AS s FROM R, S WHERE R.a = S.a AND {cond}"
        v = adaptcq.run(sql, {"R": r, "S": s})
        m = adaptcq.run(sql, {"R": r, "S": s}, executor="mjoin")
        assert v.stats["executor"] == "vector"
        assert v.table.to_pylist() == m.table.to_pylist(), cond
        assert {row["r"] for row in v.table.to_pylist()} == passing, cond


@pytest.mark.parametrize("tz", [None, "UTC", "Asia/Tokyo"])
def test_the_vector_executor_runs_timestamp_selections_over_columns(tz, monkeypatch):
    """Timestamp literals against time-zoned or naive timestamp columns: MJoin's rows, with
    no row going through the per-row path."""
    import datetime

    import adaptcq
    from adaptcq.engine import vector

    def table(n, offset):
        t = [datetime.datetime(2024, 1, 1) + datetime.timedelta(seconds=0.7 * i + offset)
             for i in range(n)]
        col = pa.array(t, pa.timestamp("us"))
        col = col.cast(pa.timestamp("us", tz)) if tz else col
        return pa.table({"ts": col, "id": list(range(n)), "a": [i % 3 for i in range(n)],
                         "t": col})

    sources = {"R": table(40, 0), "S": table(40, 0.3)}
    sql = ("SELECT R.id AS r, S.id AS s FROM R [RANGE 5 SECONDS], S [RANGE 5 SECONDS] "
           "WHERE R.a = S.a AND R.t >= '2024-01-01 00:00:10' "
           "AND S.t < TIMESTAMP '2024-01-01 00:00:20.5'")
    want = adaptcq.run(sql, sources, executor="mjoin").table.to_pylist()

    def no_rows(self, i, table):
        raise AssertionError("a timestamp selection went per row")
    monkeypatch.setattr(vector.VectorJoin, "_rows", no_rows)
    got = adaptcq.run(sql, sources)
    assert got.stats["executor"] == "vector"
    assert got.table.to_pylist() == want and len(want) > 0
