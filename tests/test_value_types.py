"""Values of unusual Arrow types and spellings read and compared alike in every executor and
both runtimes: dictionary-encoded timezone-aware timestamps (``stream.sources.normalize``),
timestamp join keys of several units far from 1970 (``engine.vector.time_unit``), CSV
booleans (``stream.sources.CSV_BOOLS``) and integers beyond int64 in an iterable of dicts."""

from __future__ import annotations

import datetime
import decimal
import itertools
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import adaptcq
from adaptcq.errors import InputError
from conftest import examples

EXECUTORS = ("mjoin", "xjoin", "tree", "shed", "vector")
EPOCH = datetime.datetime(1970, 1, 1)
UNIT = {"s": 1, "ms": 1000, "us": 10**6, "ns": 10**9}  # units per second


def ids(table: pa.Table, *cols: str) -> list:
    return sorted(zip(*(table.column(c).to_pylist() for c in cols), strict=True))


# ----- a dictionary of timezone-aware timestamps --------------------------------------------
S_NAIVE = pa.table({"ts": pa.array([3], pa.int64()), "j": [1],
                    "k2": pa.array([1000], pa.timestamp("ms")), "id": ["s0"]})
WHERES = ["R.j = S.j AND R.k = TIMESTAMP '1970-01-01 00:00:01'",
          "R.j = S.j AND R.k > '1970-01-01 00:00:00.5'",
          "R.j = S.j AND R.k IN ('1970-01-01 00:00:01', NULL)",
          "R.k = S.k2"]


@settings(max_examples=examples(8), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(unit=st.sampled_from(["s", "ms", "us", "ns"]),
       tz=st.sampled_from(["UTC", "Europe/Paris", "+05:30"]),
       secs=st.lists(st.one_of(st.none(), st.integers(-2, 3)), min_size=1, max_size=6),
       where=st.sampled_from(WHERES))
def test_a_dictionary_of_aware_timestamps_is_read_as_the_plain_column(unit, tz, secs, where):
    """pandas' Categorical of aware datetimes is a dictionary of timestamps with a time
    zone: its decoded values kept the zone, where every other timestamp is naive UTC, so
    the per-tuple executors found no value equal to a literal or a naive column, and raised
    a raw TypeError on an order comparison."""
    vals = pa.array([None if s is None else s * UNIT[unit] for s in secs],
                    pa.timestamp(unit, tz))
    n = len(vals)
    sql = (f"SELECT R.id AS rid, R.k AS k FROM R [RANGE 100 SECONDS], S [RANGE 100 SECONDS] "
           f"WHERE {where}")
    for executor in EXECUTORS:
        got = {}
        for enc, col in (("plain", vals), ("dictionary", vals.dictionary_encode())):
            R = pa.table({"ts": pa.array(range(n), pa.int64()), "k": col, "j": [1] * n,
                          "id": [f"r{i}" for i in range(n)]})
            res = adaptcq.run(sql, {"R": R, "S": S_NAIVE}, executor=executor).table
            assert res.schema.field("k").type == pa.timestamp(unit, tz)  # the zone kept
            got[enc] = ids(res, "rid", "k")
        assert got["dictionary"] == got["plain"], executor
    # the plain column's rows: the instant 1 s (the literals, k2) in each filter
    one = [f"r{i}" for i, s in enumerate(secs) if s == 1]
    more = [f"r{i}" for i, s in enumerate(secs) if s is not None and s >= 1]
    assert [r for r, _ in got["plain"]] == (more if ">" in where else one)



def test_a_pandas_categorical_of_aware_datetimes_joins_a_naive_column():
    pd = pytest.importorskip("pandas")
    R = pd.DataFrame({"ts": [0, 1, 2], "j": [1, 1, 1], "id": ["r0", "r1", "r2"],
                      "k": pd.Categorical(pd.to_datetime([0, 1000, None], unit="ms",
                                                         utc=True))})
    sql = ("SELECT R.id AS rid FROM R [RANGE 100 SECONDS], S [RANGE 100 SECONDS] "
           "WHERE R.k = S.k2 AND R.k <= '1970-01-01 00:00:01'")
    for executor in EXECUTORS:
        res = adaptcq.run(sql, {"R": R, "S": S_NAIVE}, executor=executor)
        assert res.table.column("rid").to_pylist() == ["r1"], executor


def test_a_dictionary_of_aware_timestamps_meets_its_rows_after_a_spill():
    """Spilled rows are read back as naive UTC (``engine_values``); with the decoded values
    naive too, joins across a spill meet as they do in memory."""
    hours = [datetime.datetime(2024, 1, 1, h, tzinfo=datetime.UTC) for h in range(6)]
    n = 60
    keys = pa.array([hours[i % 6] for i in range(n)], pa.timestamp("s", tz="Europe/Paris"))
    r = pa.table({"ts": pa.array(range(n), pa.int64()), "k": keys.dictionary_encode(),
                  "v": pa.array(range(n))})
    s = pa.table({"ts": pa.array(range(n), pa.int64()), "k": keys.cast(pa.timestamp("s")),
                  "v": pa.array(range(n))})
    sql = "SELECT R.v AS rv, S.v AS sv FROM R, S WHERE R.k = S.k"
    got = adaptcq.run(sql, {"R": r, "S": s}, executor="tree",
                      spill={"strategy": "bottom-up", "memory": "2kB", "every": 1})
    assert got.stats["spills"] > 0
    pairs = Counter(zip(got.table["rv"].to_pylist(), got.table["sv"].to_pylist(), strict=True))
    assert pairs == Counter((i, j) for i in range(n) for j in range(n) if i % 6 == j % 6)


# ----- timestamp join keys of several units -------------------------------------------------
FAR = int((datetime.datetime(3000, 1, 1) - EPOCH).total_seconds())
NS = {"s": 10**9, "ms": 10**6, "us": 10**3, "ns": 1}
# Instants (ns since 1970) held by some units and not others: fractions of a second, and
# seconds beyond int64 nanoseconds (2262) or microseconds (about 294,000 years: none).
INSTANTS = [0, 1, 10**3, 10**6 + 1, 10**9, 5 * 10**9, -10**9, 2**62, FAR * 10**9,
            FAR * 10**9 + 10**6, FAR * 10**9 + 10**3, -FAR * 10**9,
            int((datetime.datetime(9999, 12, 31) - EPOCH).total_seconds()) * 10**9]


def in_unit(instant: int, unit: str) -> int | None:
    q, r = divmod(instant, NS[unit])
    return q if r == 0 and -2**63 <= q < 2**63 else None


@settings(max_examples=examples(40), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(units=st.lists(st.sampled_from(list(NS)), min_size=2, max_size=4), data=st.data())
def test_timestamp_keys_of_several_units_meet_exactly_as_python_does(units, data):
    """The vectorized executor stopped mid-run ("too far from 1970") at a seconds key beyond
    2262 beside a nanoseconds one, which auto could not fall back from. Such a value equals
    no nanoseconds value, and a result holds one value in every column of the class: it
    joins nothing, and the run goes on."""
    names = "RSTU"[:len(units)]
    tables = {}
    for k, (name, unit) in enumerate(zip(names, units, strict=True)):
        pool = [v for v in (in_unit(i, unit) for i in INSTANTS) if v is not None]
        vals = data.draw(st.lists(st.one_of(st.none(), st.sampled_from(pool)), min_size=1,
                                  max_size=4))
        tables[name] = pa.table({"ts": pa.array([k] * len(vals), pa.int64()),
                                 "k": pa.array(vals, pa.timestamp(unit)),
                                 "id": [f"{name}{i}" for i in range(len(vals))]})
    sql = (f"SELECT {', '.join(f'{n}.id AS {n}' for n in names)} FROM "
           f"{', '.join(names)} WHERE "
           + " AND ".join(f"{a}.k = {b}.k" for a, b in itertools.pairwise(names)))
    # Python's == on the instants (ns as Python ints: exact, whatever the year)
    inst = {n: [None if v is None else v * NS[u]
                for v in tables[n].column("k").cast(pa.int64()).to_pylist()]
            for n, u in zip(names, units, strict=True)}
    rows = [list(enumerate(inst[n])) for n in names]
    expect = sorted(tuple(f"{n}{i}" for n, (i, _) in zip(names, combo, strict=True))
                    for combo in itertools.product(*rows)
                    if None not in (x for _, x in combo) and len({x for _, x in combo}) == 1)
    mjoin = adaptcq.run(sql, tables, executor="mjoin").table
    assert ids(mjoin, *names) == sorted(expect)
    for executor in ("auto", "vector", "tree"):
        res = adaptcq.run(sql, tables, executor=executor)
        assert ids(res.table, *names) == sorted(expect), executor
        assert executor != "auto" or res.stats["executor"] == "vector"


def test_a_seconds_key_beyond_2262_joins_its_equal_under_the_default_executor():
    """The finding's case: R in seconds (the year 3000, and 0), S in nanoseconds; and a
    third stream in milliseconds, which meets R in the year 3000 where S is not joined."""
    R = pa.table({"ts": pa.array([0, 1], pa.int64()), "k": pa.array([FAR, 0], pa.timestamp("s")),
                  "id": ["r0", "r1"]})
    S = pa.table({"ts": pa.array([2, 3], pa.int64()), "k": pa.array([5, 0], pa.timestamp("ns")),
                  "id": ["s0", "s1"]})
    T = pa.table({"ts": pa.array([4, 5], pa.int64()),
                  "k": pa.array([FAR * 1000, 0], pa.timestamp("ms")), "id": ["t0", "t1"]})
    two = ("SELECT R.id AS rid, S.id AS sid FROM R [RANGE 100 SECONDS], "
           "S [RANGE 100 SECONDS] WHERE R.k = S.k")
    res = adaptcq.run(two, {"R": R, "S": S})
    assert res.stats["executor"] == "vector" and ids(res.table, "rid", "sid") == [("r1", "s1")]
    # a class of three units: R and T meet in the year 3000 only where S (in ns) cannot
    three = ("SELECT R.id AS rid, S.id AS sid, T.id AS tid FROM R [RANGE 100 SECONDS], "
             "S [RANGE 100 SECONDS], T [RANGE 100 SECONDS] WHERE R.k = S.k AND S.k = T.k")
    for executor in ("vector", "mjoin"):
        got = adaptcq.run(three, {"R": R, "S": S, "T": T}, executor=executor).table
        assert ids(got, "rid", "sid", "tid") == [("r1", "s1", "t1")], executor
    # a class without S: R and T meet in the year 3000 too
    pair = three.replace("R.k = S.k AND S.k = T.k", "R.k = T.k AND R.j = S.j")
    src = {n: t.append_column("j", pa.array([1, 1])) for n, t in (("R", R), ("S", S), ("T", T))}
    for executor in ("vector", "mjoin"):
        got = adaptcq.run(pair, src, executor=executor).table
        assert ids(got, "rid", "tid") == sorted(2 * [("r0", "t0"), ("r1", "t1")]), executor


# ----- CSV booleans as Spark reads them -----------------------------------------------------
def test_csv_booleans_are_true_and_false_in_any_case_and_1_is_a_number_or_text(tmp_path):
    """pyarrow took 1/0 as booleans beside true/false, Spark (given the same inferred type)
    read them as malformed, NULL: the runtimes joined differently. Now a boolean is only
    true or false, in any case, as Spark's BooleanType reads it."""
    (tmp_path / "R.csv").write_text("ts,b,id\n0,true,r0\n1,1,r1\n2,tRuE,r2\n3,FALSE,r3\n")
    (tmp_path / "S.csv").write_text("ts,b,id\n4,1,s0\n5,true,s1\n6,0,s2\n")
    (tmp_path / "T.csv").write_text("ts,b,id\n7,True,t0\n8,false,t1\n9,fAlSe,t2\n")
    src = {n: str(tmp_path / f"{n}.csv") for n in "RST"}
    sql = ("SELECT R.id AS rid, S.id AS sid FROM R [RANGE 100 SECONDS], S [RANGE 100 SECONDS] "
           "WHERE R.b = S.b")
    res = adaptcq.run(sql, {n: src[n] for n in "RS"})  # as text: "1" = "1", "true" = "true"
    assert ids(res.table, "rid", "sid") == [("r0", "s1"), ("r1", "s0")]
    sql = ("SELECT T.id AS tid, T.b AS b FROM T [RANGE 100 SECONDS], U [RANGE 100 SECONDS] "
           "WHERE T.b = U.b")
    U = pa.table({"ts": [10, 11], "b": [True, False]})
    got = adaptcq.run(sql, {"T": src["T"], "U": U}).table
    assert got.schema.field("b").type == pa.bool_()
    assert ids(got, "tid", "b") == [("t0", True), ("t1", False), ("t2", False)]
    (tmp_path / "Z.csv").write_text("ts,b\n0,1\n1,0\n")  # 1 and 0 alone: integers
    ones = adaptcq.run("SELECT Z.b FROM Z, U WHERE Z.b = U.b",
                       {"Z": str(tmp_path / "Z.csv"), "U": pa.table({"ts": [10], "b": [1]})})
    assert ones.table.schema.field("b").type == pa.int64() and ones.table.num_rows == 1


def test_a_1_in_a_later_csv_file_of_booleans_is_an_error_naming_its_row(tmp_path):
    (tmp_path / "R").mkdir()
    (tmp_path / "R" / "a.csv").write_text("ts,b\n0,true\n1,false\n")
    (tmp_path / "R" / "b.csv").write_text("ts,b\n2,TRUE\n3,1\n")
    S = pa.table({"ts": [4], "b": [True]})
    with pytest.raises(InputError, match=r"stream R: row 3 \(row 1 of .*b\.csv'\) has '1' in "
                       r"column 'b', which is bool"):
        adaptcq.run("SELECT R.b FROM R, S WHERE R.b = S.b", {"R": str(tmp_path / "R"), "S": S})


def test_csv_booleans_read_alike_on_spark(spark, tmp_path):
    from adaptcq.runtime.spark import run_files
    (tmp_path / "R.csv").write_text("ts,b,c,id\n0,true,true,r0\n1,1,TRUE,r1\n2,0,fAlSe,r2\n")
    (tmp_path / "S.csv").write_text("ts,b,c,id\n3,1,True,s0\n4,true,false,s1\n5,0,FALSE,s2\n")
    src = {n: str(tmp_path / f"{n}.csv") for n in "RS"}
    sql = ("SELECT R.id AS rid, S.id AS sid, R.c AS c FROM R [RANGE 100 SECONDS], "
           "S [RANGE 100 SECONDS] WHERE R.b = S.b AND R.c = S.c")
    local = adaptcq.run(sql, src).table
    run_files(spark, sql, src, str(tmp_path / "ck"), str(tmp_path / "out"), partitions=1)
    remote = pq.read_table(tmp_path / "out")
    # b (1 beside true) is text in both, c (true/false in any case) booleans in both
    assert ids(remote, "rid", "sid", "c") == ids(local, "rid", "sid", "c") == [
        ("r1", "s0", True), ("r2", "s2", False)]


# ----- integers beyond int64 in an iterable of dicts ----------------------------------------
@pytest.mark.parametrize("big", [2**64 - 1, 2**63, -2**63 - 1, 10**5000],
                         ids=["2**64-1", "2**63", "-2**63-1", "10**5000"])
@pytest.mark.parametrize("where", ["first", "later", "nested"])
def test_an_integer_beyond_int64_from_dicts_names_its_column_row_and_value(big, where):
    """pyarrow reads a Python int as int64 and said only "Python int too large to convert
    to C long", with the chunk's rows; the 1e20 of a later chunk was named fully."""
    S = pa.table({"ts": pa.array([100], pa.int64()), "j": [1]})
    first = [big] if where == "nested" else big if where == "first" else 1
    later = [1] if where == "nested" else 1 if where == "first" else big
    rows = [{"ts": 0, "j": 1, "other": "x", "k": first}, {"ts": 1, "j": 1, "k": later}]
    row = 1 if where == "later" else 0
    shown = str(big) if big < 10**100 else "an integer of 16610 bits"
    with pytest.raises(InputError, match=rf"^stream R: row {row} has {shown} in column 'k', "
                       r"an integer beyond int64 \(-9223372036854775808\.\.9223372036854775807"
                       r"\), the type a Python int is read as; give such values as "
                       r"decimal\.Decimal"):
        adaptcq.run("SELECT R.k FROM R, S WHERE R.j = S.j", {"R": iter(rows), "S": S},
                    chunk_rows=1 if where == "later" else 2)
    if where == "first" and big < 10**100:  # as the message says: a Decimal is a decimal
        rows[0]["k"] = decimal.Decimal(big)
        got = adaptcq.run("SELECT R.k FROM R, S WHERE R.j = S.j", {"R": iter(rows), "S": S})
        assert sorted(got.table.column("k").to_pylist()) == sorted([1, big])


def test_values_of_no_one_type_from_dicts_name_the_column_and_row():
    S = pa.table({"ts": pa.array([100], pa.int64()), "j": [1]})
    rows = [{"ts": 0, "j": 1, "k": 1}, {"ts": 1, "j": 1, "k": 2}, {"ts": 2, "j": 1, "k": "x"}]
    with pytest.raises(InputError, match=r"^stream R: rows 0\.\.2: column 'k' cannot be one "
                       r"Arrow type: row 2 has 'x' \(Could not convert 'x'"):
        adaptcq.run("SELECT R.k FROM R, S WHERE R.j = S.j", {"R": iter(rows), "S": S})
