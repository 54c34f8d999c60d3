"""Selections over column batches (query.arrow_expr) mean what the per-row compiler's do:
the same rows pass, with SQL's three-valued logic, NULLs, NaN and strings."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest

from adaptcq.query.arrow_expr import arrow_predicate
from adaptcq.query.cql import parse_query
from adaptcq.query.expr import compile_predicate

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
    "R.a + 1 > 2", "R.a / R.b > 0",
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
    if cond in ("R.a + 1 > 2", "R.a / R.b > 0", "R.f", "NOT R.f"):
        assert fn is None  # left to the per-row compiler (arithmetic, a bare value)
        return
    assert fn is not None
    assert fn(table).tolist() == want
    assert not any(isinstance(x, float) and math.isnan(x) for x in fn(table).tolist())
    assert np.asarray(fn(table)).dtype == bool


def test_timestamp_columns_are_left_to_the_row_compiler():
    """A string compared with a timestamp column is a timestamp literal there."""
    q = parse_query("SELECT R.a FROM R, S WHERE R.a = S.a AND R.t >= '2024-01-01'",
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
