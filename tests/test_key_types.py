"""Join keys of different Arrow types: every executor matches them as the per-tuple engine
does (Python's ``==``), or is refused with the reason (``engine.vector.KeyCoding``,
``stats.partitions.partition_of``)."""

from __future__ import annotations

import datetime
import decimal

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import adaptcq
from adaptcq.errors import OptionError, QueryError
from conftest import examples

SQL = "SELECT R.id AS rid, S.id AS sid FROM R, S WHERE R.k = S.k"
D = decimal.Decimal
EPOCH = datetime.datetime(1970, 1, 1)


def pairs(executor: str, kr: pa.Array, ks: pa.Array) -> list:
    n, m = len(kr), len(ks)
    R = pa.table({"ts": pa.array(range(n)), "k": kr, "id": [f"r{i}" for i in range(n)]})
    S = pa.table({"ts": pa.array(range(n, n + m)), "k": ks, "id": [f"s{i}" for i in range(m)]})
    res = adaptcq.run(SQL, {"R": R, "S": S}, executor=executor)
    return sorted((r["rid"], r["sid"]) for r in res.table.to_pylist())


# Each family: Arrow types whose values stand for the same small numbers (``conv``), so
# that keys of two types of a family compare equal exactly where Python says they do.
NUMBERS = [(pa.int64(), int), (pa.int32(), int), (pa.float64(), float),
           (pa.decimal128(9, 2), lambda v: D(v) / 2), (pa.decimal128(9, 1), lambda v: D(v) / 2),
           (pa.float64(), lambda v: v / 2)]
TIMES = [(pa.timestamp(u), lambda v, u=u: EPOCH + datetime.timedelta(seconds=v))
         for u in ("s", "ms", "us", "ns")]
DATES = [(pa.date32(), lambda v: datetime.date(2000, 1, 1) + datetime.timedelta(days=v)),
         (pa.date64(), lambda v: datetime.date(2000, 1, 1) + datetime.timedelta(days=v))]


@settings(max_examples=examples(60), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(family=st.sampled_from([NUMBERS, TIMES, DATES]), data=st.data())
def test_executors_match_keys_of_different_types_as_python_does(family, data):
    (tr, fr), (ts_, fs) = (data.draw(st.sampled_from(family)) for _ in range(2))
    vr = data.draw(st.lists(st.one_of(st.none(), st.integers(-6, 6)), min_size=1, max_size=8))
    vs = data.draw(st.lists(st.one_of(st.none(), st.integers(-6, 6)), min_size=1, max_size=8))
    kr = pa.array([None if v is None else fr(v) for v in vr], tr)
    ks = pa.array([None if v is None else fs(v) for v in vs], ts_)
    want = pairs("mjoin", kr, ks)
    # the reference: Python's == on the values the per-tuple engine sees
    expect = sorted((f"r{i}", f"s{j}") for i, x in enumerate(kr.to_pylist())
                    for j, y in enumerate(ks.to_pylist())
                    if x is not None and y is not None and x == y)
    assert want == expect
    for executor in ("vector", "tree", "xjoin"):
        assert pairs(executor, kr, ks) == want, executor


def test_wide_integers_do_not_meet_the_floats_they_round_to():
    kr, ks = pa.array([2**53 + 1, 1, 2]), pa.array([2.0**53, 1.0, 2.5])
    for executor in ("vector", "mjoin", "tree"):
        assert pairs(executor, kr, ks) == [("r1", "s1")], executor


def test_a_date_joined_with_a_timestamp_is_refused_in_every_executor():
    """A date never equals a timestamp (Python's ==): the join would match nothing, almost
    surely a mistake, so it is refused at the predicate (it ran and returned nothing)."""
    kr, ks = pa.array([0, 1], pa.timestamp("ms")), pa.array([0, 1], pa.date32())
    for executor in ("auto", "vector", "mjoin", "tree"):
        with pytest.raises(QueryError, match="a date never equals a timestamp"):
            pairs(executor, kr, ks)


def test_windows_beyond_int64_nanoseconds_run_per_tuple_and_never_lose_results():
    """A [RANGE w] window too long for int64 nanoseconds beside a timestamp: ``auto`` runs
    MJoin, ``vector`` refuses naming the window; a long window with present-day times
    expires nothing it should keep (the expiry time saturates, never wraps)."""
    R = pa.table({"ts": pa.array([datetime.datetime(2024, 1, 1)]), "a": [1], "id": ["r0"]})
    S = pa.table({"ts": pa.array([datetime.datetime(2024, 1, 1, 0, 0, 1)]), "a": [1],
                  "id": ["s0"]})
    for w in ("90000 DAYS", "1e30 SECONDS"):
        sql = (f"SELECT R.id AS rid, S.id AS sid FROM R [RANGE {w}], S [RANGE {w}] "
               "WHERE R.a = S.a")
        res = adaptcq.run(sql, {"R": R, "S": S})
        assert res.stats["executor"] == "mjoin"
        assert [(r["rid"], r["sid"]) for r in res.table.to_pylist()] == [("r0", "s0")]
        with pytest.raises(OptionError, match=r"RANGE .* window is longer"):
            adaptcq.run(sql, {"R": R, "S": S}, executor="vector")
    # 100 years fits; times near the end of int64 saturate instead of wrapping
    sql = ("SELECT R.id AS rid, S.id AS sid FROM R [RANGE 36500 DAYS], S [RANGE 36500 DAYS] "
           "WHERE R.a = S.a")
    late = {"R": pa.table({"ts": pa.array([datetime.datetime(2250, 1, 1)], pa.timestamp("ns")),
                           "a": [1], "id": ["r0"]}),
            "S": pa.table({"ts": pa.array([datetime.datetime(2250, 1, 2)], pa.timestamp("ns")),
                           "a": [1], "id": ["s0"]})}
    for executor in ("vector", "mjoin"):
        res = adaptcq.run(sql, late, executor=executor)
        assert [(r["rid"], r["sid"]) for r in res.table.to_pylist()] == [("r0", "s0")]


@pytest.mark.parametrize("days", [93, 365, 10_000])
def test_rows_exactly_a_long_window_apart_join_in_every_executor(days):
    """|Δts| <= w holds to the nanosecond however long the window: a size in seconds
    divided by 1e-9 in floating point is a nanosecond short from about 93 days on."""
    w = days * 86400
    R = pa.table({"ts": [0], "k": [1]})
    sql = (f"SELECT R.k FROM R [RANGE {days} DAYS], S [RANGE {days} DAYS] "
           "WHERE R.k = S.k")
    for executor in ("auto", "mjoin", "xjoin", "tree"):
        meets = adaptcq.run(sql, {"R": R, "S": pa.table({"ts": [w], "k": [1]})},
                            executor=executor)
        past = adaptcq.run(sql, {"R": R, "S": pa.table({"ts": [w + 1], "k": [1]})},
                           executor=executor, timestamp_unit="s")
        assert meets.table.num_rows == 1 and meets.table.schema.field("_ts").type == pa.int64()
        assert past.table.num_rows == 0, executor
    engine = adaptcq.Engine({"R": R, "S": pa.table({"ts": [w], "k": [1]})})
    h = engine.register(sql)
    engine.run()
    assert h.table().num_rows == 1


def test_nested_values_keep_their_nulls_in_the_vectorized_executor():
    """A NULL inside a list (of floats, of ints), a struct or a map comes out as NULL and
    of the column's type, as the per-tuple engine gives it (was NaN, or a crash for ints)."""
    R = pa.table({"ts": [1, 2], "k": [1, 1], "l": pa.array([[1.0, None], None]),
                  "li": pa.array([[1, None], [2]]),
                  "s": pa.array([{"a": [1.0, None]}, {"a": None}]),
                  "m": pa.array([[("x", 1)], None], pa.map_(pa.string(), pa.int64()))})
    S = pa.table({"ts": [1], "k": [1]})
    for c in ("l", "li", "s", "m"):
        sql = f"SELECT R.{c} FROM R, S WHERE R.k = S.k"
        vec = adaptcq.run(sql, {"R": R, "S": S}, executor="vector").table
        ref = adaptcq.run(sql, {"R": R, "S": S}, executor="mjoin").table
        assert vec.column(c).type == R.column(c).type == ref.column(c).type
        assert vec.column(c).to_pylist() == ref.column(c).to_pylist() == R.column(c).to_pylist()


def test_a_decimal_column_compared_with_a_float_literal_agrees_in_every_executor():
    """Arrow casts a decimal and a float to one type; Python (the per-tuple engine)
    compares them exactly: the vectorized executor evaluates such a selection row by row,
    so every executor keeps the same rows. A literal beside a decimal column is SQL's
    exact 0.1 (tests/test_exact_literals.py); a float column is compared with a decimal
    one as Python does, exactly (0.1 the float is 0.1000000000000000055...)."""
    R = pa.table({"ts": [1, 2, 3], "k": [1, 1, 1], "id": [1, 2, 3], "f": [0.1, 0.25, 1.0],
                  "d": pa.array([D("0.10"), D("0.25"), D("1.00")], pa.decimal128(5, 2))})
    S = pa.table({"ts": [1], "k": [1], "id": [9]})
    for cond, want in (("R.d = 0.1", [1]), ("R.d >= 0.1", [1, 2, 3]), ("R.d < 0.2", [1]),
                       ("R.d BETWEEN 0.1 AND 0.3", [1, 2]), ("R.d IN (0.1, 0.25)", [1, 2]),
                       ("R.d = R.f", [2, 3]), ("R.f = 0.1", [1]), ("R.d = 1", [3])):
        sql = f"SELECT R.id AS r FROM R, S WHERE R.k = S.k AND {cond}"
        for executor in ("vector", "mjoin", "tree"):
            got = adaptcq.run(sql, {"R": R, "S": S}, executor=executor).table
            assert sorted(got.column("r").to_pylist()) == want, (cond, executor)


def test_an_arrow_map_column_is_a_weighted_set_for_inner_product():
    """docs/shedding.md: a map column (item -> weight) is a weighted set. Arrow map columns
    were read as structs, so INNER_PRODUCT refused every real input."""
    def table(ts, ids, weights):
        return pa.table({"ts": pa.array(ts, pa.float64()), "id": pa.array(ids, pa.int64()),
                         "w": pa.array(weights, pa.map_(pa.int64(), pa.float64()))})
    R = table([0.0, 0.2], [1, 3], [[(1, 2.0), (2, 1.0)], [(2, 0.5)]])
    S = table([0.5], [2], [[(1, 1.0), (2, 1.0)]])
    sql = ("SELECT R.id AS r, S.id AS s FROM R [RANGE 5 SECONDS], S [RANGE 5 SECONDS] "
           "WHERE INNER_PRODUCT(R.w, S.w) >= 2")
    got = adaptcq.run(sql, {"R": R, "S": S}).table   # 2·1 + 1·1 = 3 and 0.5·1
    assert list(zip(got.column("r").to_pylist(), got.column("s").to_pylist())) == [(1, 2)]


@pytest.mark.parametrize("where", ["R.x + R.d < 6", "R.d * 0.5 < 6", "R.id + R.d > 0",
                                   "-R.d + 1 > 0"])
def test_decimal_arithmetic_in_where_is_refused_as_in_select(where):
    """It passed the checks in WHERE and raised a raw TypeError (float and Decimal) at the
    first row, locally and on Spark (fuzzing, 2026-11-27)."""
    R = pa.table({"ts": [1.0], "id": [1], "x": [1.5],
                  "d": pa.array([decimal.Decimal("1.25")], pa.decimal128(10, 2))})
    S = pa.table({"ts": [1.05], "id": [1]})
    sql = f"SELECT R.id AS i FROM R, S WHERE R.id = S.id AND {where}"
    for executor in ("mjoin", "auto"):
        with pytest.raises(QueryError, match="arithmetic on the decimal value"):
            adaptcq.run(sql, {"R": R, "S": S}, executor=executor)
    # Negation alone keeps a decimal exact, as before.
    got = adaptcq.run("SELECT R.id AS i FROM R, S WHERE R.id = S.id AND -R.d = -1.25",
                      {"R": R, "S": S})
    assert got.table.num_rows == 1
