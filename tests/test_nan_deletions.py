"""A deletion (``--sign``) of a row holding NaN finds that row, in every executor
(docs/semantics.md, "Explicit deletions"): NaN equals nothing in the query's predicates, but
a deletion matches a row by its values, NaN included (``engine.continuous.row_key``, the
vectorized executor's ``_row_codes``)."""
from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import adaptcq
from adaptcq.engine.continuous import NAN_KEY, row_key
from adaptcq.runtime.local import prepare
from oracle import Oracle, _same_row

# R.f is used by the selection (NaN <> 2 holds), so a deletion must match it.
SQL = "SELECT R.id AS r, S.id AS s FROM R, S WHERE R.a = S.a AND R.f <> 2"
FLOATS = [0.0, -0.0, 1.5, 2.0, math.nan, -math.nan, None]
EXECUTORS = ["mjoin", "xjoin", "vector", "acaching"]


def _nan_with_bits(negative: bool) -> float:
    """A NaN built anew (another object, maybe another sign bit), as a row read again has."""
    v = float(np.float64(np.nan) * (-1 if negative else 1))
    assert math.isnan(v)
    return v


@st.composite
def signed_streams(draw):
    """R and S with sign columns: R's deletions copy an earlier R row, with its float
    rebuilt (a fresh NaN object, maybe -NaN; 0.0 as -0.0), or delete a row never there."""
    n = draw(st.integers(1, 30))
    r_rows, s_rows = [], []
    for j in range(n):
        if draw(st.booleans()):
            s_rows.append({"ts": j, "a": draw(st.sampled_from([0, 1])), "id": j, "sg": 1})
            continue
        if r_rows and draw(st.integers(0, 9)) < 4:
            old = draw(st.sampled_from(r_rows))
            f = old["f"]
            if f is not None and math.isnan(f):
                f = _nan_with_bits(draw(st.booleans()))
            elif f == 0.0 and draw(st.booleans()):
                f = -f
            r_rows.append({"ts": j, "a": old["a"], "f": f, "id": old["id"], "sg": -1})
        else:
            r_rows.append({"ts": j, "a": draw(st.sampled_from([0, 1, None])),
                           "f": draw(st.sampled_from(FLOATS)), "id": j,
                           "sg": -1 if draw(st.integers(0, 9)) == 0 else 1})
    mk = lambda rows, names, types: pa.table(
        {c: pa.array([r[c] for r in rows], t) for c, t in zip(names, types)})
    return (mk(r_rows, ["ts", "a", "f", "id", "sg"],
               [pa.int64(), pa.int64(), pa.float64(), pa.int64(), pa.int8()]),
            mk(s_rows, ["ts", "a", "id", "sg"], [pa.int64()] * 3 + [pa.int8()]))


def oracle_rows(sources, mode) -> tuple[Counter, int]:
    """The oracle's results, and how many deletions find no equal row still there (one
    that failed the selection counts as there: its deletion deletes nothing)."""
    p = prepare(SQL, sources, "ts", sign="sg")
    _, outs = Oracle(p.query, mode, 1e-9).run(p.streams.tolist(), p.signs.tolist(),
                                              p.timestamps.tolist(), p.rows)
    total = Counter()
    for c in outs:
        for (*vals, sign, ts), k in c.items():
            total[(*vals, sign, ts // 10**9)] += k
    there, rejected = [], 0
    for i, sign, row in zip(p.streams.tolist(), p.signs.tolist(), p.rows):
        if sign > 0:
            there.append((i, row))
            continue
        match = next((x for x in there if x[0] == i and _same_row(x[1], row)), None)
        if match is None:
            rejected += 1
        else:
            there.remove(match)
    return total, rejected


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=signed_streams(), mode=st.sampled_from(["append", "retract"]))
def test_deleting_a_row_with_nan_equals_the_oracle_in_every_executor(data, mode):
    r, s = data
    want, rejected = oracle_rows({"R": r, "S": s}, mode)
    for ex in EXECUTORS:
        got = adaptcq.run(SQL, {"R": r, "S": s}, timestamp="ts", sign="sg", executor=ex,
                          mode=mode)
        t = got.table
        rows = Counter(zip(t["r"].to_pylist(), t["s"].to_pylist(), t["_sign"].to_pylist(),
                           t["_ts"].to_pylist()))
        assert rows == want, ex
        assert got.rejected.num_rows == rejected, ex


def test_a_nan_row_is_deleted_and_its_result_retracted():
    """The finder's case: R(1, NaN) joins S; deleting R(1, NaN) at ts 2 retracts it."""
    r = pa.table({"ts": [1, 2], "a": [1, 1], "f": [math.nan, -math.nan], "id": [7, 7],
                  "sg": [1, -1]})
    s = pa.table({"ts": [0], "a": [1], "id": [9], "sg": [1]})
    for ex in EXECUTORS:
        got = adaptcq.run(SQL, {"R": r, "S": s}, timestamp="ts", sign="sg", executor=ex,
                          mode="retract")
        assert [(x["r"], x["s"], x["_sign"], x["_ts"]) for x in got.table.to_pylist()] == [
            (7, 9, 1, 1), (7, 9, -1, 2)], ex
        assert got.rejected.num_rows == 0, ex


def test_row_key_makes_every_nan_one_key():
    a, b = _nan_with_bits(False), _nan_with_bits(True)
    assert row_key((1, a)) == row_key((1, b)) == (1, NAN_KEY)
    assert row_key((1, [a, 2.0])) == row_key((1, [b, 2.0]))
    assert row_key((1, 2.0)) == (1, 2.0)          # no NaN: the row itself
    assert row_key((1, "nan")) != row_key((1, a))  # a string is no NaN


def test_row_key_checks_only_the_positions_that_may_hold_nan():
    """``nan_positions``: columns of kind number (or unknown) only; a row of strings is
    its own key without a look at its values."""
    from adaptcq.engine.continuous import nan_positions
    from adaptcq.query.cql import parse_query
    q = parse_query("SELECT R.s, S.f FROM R, S WHERE R.s = S.s",
                    {"R": {"s": "string", "t": "string"}, "S": {"s": "string", "f": "number"}})
    assert nan_positions(q, "R") == ()
    assert [q.columns["S"][k] for k in nan_positions(q, "S")] == ["f"]
    nan = _nan_with_bits(False)
    assert row_key(("a", nan), (1,)) == ("a", NAN_KEY)
    assert row_key(("a", nan), ()) == ("a", nan)  # not looked at
