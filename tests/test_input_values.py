"""Input values reach the engine exactly, or are refused with where they are: decimal event
times (no float64 on the way), values Python cannot hold (the tuple-at-a-time executors'
rows), bad times in a folder's files (named by file), and later chunks of an iterable whose
types differ from the first rows' (docs/semantics.md, "From inputs to one update order" and
"Event time and `_ts`")."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

import adaptcq
from adaptcq.errors import InputError
from adaptcq.stream.eventtime import to_nanoseconds

PER_TUPLE = ["mjoin", "xjoin", "acaching", "tree"]
ALL = ["auto", "vector", *PER_TUPLE]
S1 = pa.table({"ts": [0], "k": [1]})


def ids(sql: str, sources: dict, **options) -> list:
    return sorted(adaptcq.run(sql, sources, **options).table.column("id").to_pylist())


# ----- 01: decimal event times are exact ---------------------------------------------------
RANGE2 = "SELECT R.id FROM R [RANGE 2 SECONDS], S [RANGE 2 SECONDS] WHERE R.k = S.k"


@pytest.mark.parametrize("executor", ALL)
def test_decimal_times_keep_every_nanosecond(executor):
    """1700000000.000000001 and 1700000002.000000002 are 2.000000001 s apart: they joined
    in a 2 s window when decimals went through float64."""
    t = pa.decimal128(19, 9)
    r = pa.table({"ts": pa.array([Decimal("1700000000.000000001")] * 2, t), "k": [1, 1],
                  "id": [0, 1]})
    s = pa.table({"ts": pa.array([Decimal("1700000002.000000002"),
                                  Decimal("1700000002.000000003")], t), "k": [1, 2]})
    assert ids(RANGE2, {"R": r, "S": s}, executor=executor) == []
    s = pa.table({"ts": pa.array([Decimal("1700000002.000000001")], t), "k": [1]})
    assert ids(RANGE2, {"R": r, "S": s}, executor=executor) == [0, 1]  # exactly 2 s


def test_decimal_nanoseconds_and_milliseconds_honour_the_unit():
    t = pa.decimal128(20, 0)
    r = pa.table({"ts": pa.array([Decimal(1700000000000000001)], t), "k": [1], "id": [0]})
    s = pa.table({"ts": pa.array([Decimal(1700000002000000002)], t), "k": [1]})
    assert ids(RANGE2, {"R": r, "S": s}, timestamp_unit="ns") == []
    t = pa.decimal128(22, 6)  # epoch milliseconds with nanosecond digits
    r = pa.table({"ts": pa.array([Decimal("1700000000000.000001")], t), "k": [1], "id": [0]})
    s = pa.table({"ts": pa.array([Decimal("1700000002000.000002")], t), "k": [1]})
    assert ids(RANGE2, {"R": r, "S": s}, timestamp_unit="ms") == []
    s = pa.table({"ts": pa.array([Decimal("1700000002000.000001")], t), "k": [1]})
    assert ids(RANGE2, {"R": r, "S": s}, timestamp_unit="ms") == [0]


def test_decimal_times_round_to_the_nanosecond_ties_to_even():
    d = [Decimal(x) for x in ("1.0000000005", "1.0000000015", "-0.0000000005",
                              "-0.0000000015", "0.0000000014")]
    for t in (pa.decimal128(21, 10), pa.decimal256(40, 10)):
        got = to_nanoseconds(pa.array(d, t), None, "R", "ts").tolist()
        assert got == [1_000_000_000, 1_000_000_002, 0, -2, 1]
    if hasattr(pa, "decimal32"):  # (pyarrow 19)
        assert to_nanoseconds(pa.array([Decimal("2.5"), Decimal("3.5")], pa.decimal32(5, 1)),
                              "ns", "R", "ts").tolist() == [2, 4]
    assert to_nanoseconds(pa.array([Decimal("17E3")], pa.decimal128(5, -3)), "s", "R",
                          "ts").tolist() == [17_000 * 10**9]
    # 2**63 - 0.5 ns rounds (to even) to 2**63: out of range, named with its row and value
    big = pa.array([Decimal(0), Decimal("9223372036.8547758075")], pa.decimal128(30, 10))
    with pytest.raises(InputError, match=r"stream R: row 8 has timestamp "
                       r"9223372036\.8547758075 in 'ts', out of range for unit s"):
        to_nanoseconds(big, None, "R", "ts", first_row=7)
    assert to_nanoseconds(big.slice(0, 1), None, "R", "ts").tolist() == [0]


# ----- 03, 04: values Python cannot hold ----------------------------------------------------
FAR = pa.table({"ts": [0, 1], "k": [1, 1], "id": [0, 1],
                "c": pa.array([-10**11, 0], pa.timestamp("s")),     # year -1199
                "d": pa.array([0, 3_000_000], pa.date32())})         # year 10183
FAR_SQL = ["SELECT R.id, R.c FROM R, S WHERE R.k = S.k",
           "SELECT R.id, R.d FROM R, S WHERE R.k = S.k",
           "SELECT R.id FROM R, S WHERE R.k = S.k AND R.c > '2020-01-01'"]


@pytest.mark.parametrize("executor", PER_TUPLE)
def test_a_date_python_cannot_hold_is_refused_naming_its_row(executor):
    """A bare OverflowError came from ``to_pylist``; the message now says where and why."""
    for sql in FAR_SQL:
        row, value, col = ((0, r"-1199-02-15 14:13:20", "c") if "R.d" not in sql
                           else (1, "10183-09-21", "d"))
        with pytest.raises(InputError, match=rf"stream R: row {row} has {value} in column "
                           rf"'{col}' \((timestamp\[s\]|date32\[day\])\), outside the years "
                           r"1 to 9999 that Python's date(time)? holds.*--executor vector"):
            adaptcq.run(sql, {"R": FAR, "S": S1}, executor=executor)


def test_the_vectorized_executor_keeps_such_dates():
    got = adaptcq.run(FAR_SQL[0], {"R": FAR, "S": S1}, executor="vector").table
    assert got.column("c").equals(FAR.column("c"))
    assert ids(FAR_SQL[2], {"R": FAR, "S": S1}, executor="vector") == []


def test_a_refused_value_in_a_file_names_the_file_and_a_late_row_is_only_rejected(tmp_path):
    pq.write_table(FAR.slice(1), tmp_path / "r.parquet")
    with pytest.raises(InputError, match=r"stream R \(file .*r\.parquet\): row 0 has "
                       r"10183-09-21 in column 'd'"):
        adaptcq.run(FAR_SQL[1], {"R": str(tmp_path / "r.parquet"), "S": S1},
                    executor="mjoin")
    late = pa.table({"ts": [5, 1], "k": [1, 1], "id": [0, 1],
                     "d": pa.array([0, 3_000_000], pa.date32())})
    r = adaptcq.run(FAR_SQL[1], {"R": late, "S": S1}, executor="mjoin")
    assert r.table.column("id").to_pylist() == [0] and r.stats["rejected"] == 1


def test_other_values_python_would_change_are_refused():
    for col, msg in [
            (pa.array([0, 10**14], pa.duration("s")),
             r"100000000000000 s .* beyond the ±999,999,999 days that Python's timedelta"),
            (pa.array([0, 1000], pa.date64()), r"1000 ms .* not a whole day"),
            (pa.array([0, 86_400], pa.time32("s")), r"86400 s .* not a time of day"),
            (pa.array([[0], [-10**11]], pa.list_(pa.timestamp("s"))),
             r"an item in column 'c' \(list<item: timestamp\[s\]>\), outside the years")]:
        r = pa.table({"ts": [0, 1], "k": [1, 1], "id": [0, 1], "c": col})
        with pytest.raises(InputError, match=rf"stream R: row 1 has {msg}"):
            adaptcq.run("SELECT R.id, R.c FROM R, S WHERE R.k = S.k", {"R": r, "S": S1},
                        executor="mjoin")
    edge = pa.table({"ts": [0, 1], "k": [1, 1], "id": [0, 1],
                     "c": pa.array([dt.datetime(1, 1, 1), dt.datetime.max], pa.timestamp("us")),
                     "d": pa.array([dt.date(1, 1, 1), dt.date.max], pa.date32())})
    got = adaptcq.run("SELECT R.id, R.c, R.d FROM R, S WHERE R.k = S.k",
                      {"R": edge, "S": S1}, executor="mjoin").table
    assert got.select(["c", "d"]).equals(edge.select(["c", "d"]))


NS = pa.table({"ts": [0, 1], "k": [1, 1], "id": [0, 1],
               "t": pa.array([1_000, 1_234_567_891], pa.time64("ns"))})


@pytest.mark.parametrize("executor", PER_TUPLE)
def test_a_time64_ns_with_sub_microsecond_digits_is_refused(executor):
    """Python's time holds microseconds: 1,234,567,891 ns came out 1,234,567,000."""
    with pytest.raises(InputError, match=r"stream R: row 1 has 00:00:01\.234567891 in column "
                       r"'t' \(time64\[ns\]\), with digits below the microsecond"):
        adaptcq.run("SELECT R.t FROM R, S WHERE R.k = S.k", {"R": NS, "S": S1},
                    executor=executor)
    whole = NS.set_column(3, "t", pa.array([1_000, 1_234_567_000], pa.time64("ns")))
    got = adaptcq.run("SELECT R.t FROM R, S WHERE R.k = S.k", {"R": whole, "S": S1},
                      executor=executor).table.column("t")
    assert got.type == pa.time64("ns") and got.equals(whole.column("t"))


def test_time64_ns_keeps_its_nanoseconds_in_the_vectorized_executor_and_deletions():
    got = adaptcq.run("SELECT R.t FROM R, S WHERE R.k = S.k", {"R": NS, "S": S1},
                      executor="vector").table.column("t")
    assert got.equals(NS.column("t"))
    # insert t = 1 ns, delete t = 2 ns: no such row (mjoin matched it once cut to 0 µs)
    r = pa.table({"ts": [1, 2], "k": [1, 1], "t": pa.array([1, 2], pa.time64("ns")),
                  "sg": pa.array([1, -1], pa.int8())})
    out = adaptcq.run("SELECT R.t FROM R, S WHERE R.k = S.k", {"R": r, "S": S1},
                      executor="vector", mode="retract", sign="sg")
    assert out.stats["rejected"] == 1 and out.table.column("_sign").to_pylist() == [1]
    with pytest.raises(InputError, match=r"row 0 has 00:00:00\.000000001 in column 't'"):
        adaptcq.run("SELECT R.t FROM R, S WHERE R.k = S.k", {"R": r, "S": S1},
                    executor="mjoin", mode="retract", sign="sg")


# ----- 05: a bad time in a folder's file names the file and its row -------------------------
@pytest.mark.parametrize("kind", ["parquet", "csv"])
@pytest.mark.parametrize("executor", ["vector", "mjoin"])
def test_a_bad_time_in_a_folder_names_the_file_and_the_row_in_it(tmp_path, kind, executor):
    (tmp_path / "R").mkdir()
    a = pa.table({"ts": [1.0, 2.0], "k": [1, 2]})
    b = pa.table({"ts": [3.0, None], "k": [1, 2]})
    for name, t in (("a", a), ("b", b)):
        path = tmp_path / "R" / f"{name}.{kind}"
        pq.write_table(t, path) if kind == "parquet" else pacsv.write_csv(t, path)
    with pytest.raises(InputError, match=rf"stream R \(file .*R/b\.{kind}\): row 1 has no "
                       r"timestamp \('ts' is null\)"):
        adaptcq.run("SELECT R.k FROM R, S WHERE R.k = S.k",
                    {"R": str(tmp_path / "R"), "S": S1}, executor=executor)


# ----- 06: an iterable of dicts: later values must fit the first rows' types exactly -------
@pytest.mark.parametrize("executor", ["vector", "mjoin"])
def test_a_fraction_in_an_integer_column_is_refused_not_cut(executor):
    sql = "SELECT R.id FROM R, S WHERE R.k = S.k"
    for bad in (1.5, -0.7):
        rows = [{"ts": 0, "k": 1, "id": 0}, {"ts": 1, "k": 2, "id": 1},
                {"ts": 2, "k": 3, "id": 2}, {"ts": 3, "k": bad, "id": 3}]
        with pytest.raises(InputError, match=rf"stream R: rows 2\.\.3 do not fit the types of "
                           rf"the first rows: column 'k' is int64 there, and row 3 has {bad}"):
            adaptcq.run(sql, {"R": iter(rows), "S": S1}, executor=executor, chunk_rows=2)
    rows = [{"ts": 0, "k": 1}, {"ts": 1, "k": 1}, {"ts": 1.5, "k": 1}]  # the event time
    with pytest.raises(InputError, match=r"column 'ts' is int64 there, and row 2 has 1\.5"):
        adaptcq.run("SELECT R.k FROM R, S WHERE R.k = S.k", {"R": iter(rows), "S": S1},
                    executor=executor, chunk_rows=2)
    # a number held exactly is taken: 1.0 and Decimal 1 in int64, an int in float64
    rows = [{"ts": 0, "k": 1, "id": 0, "f": 0.5}, {"ts": 1, "k": 2, "id": 1, "f": 1.5},
            {"ts": 2, "k": 1.0, "id": 2, "f": 3}, {"ts": 3, "k": 2.0, "id": 3, "f": 4},
            {"ts": 4, "k": Decimal(1), "id": 4, "f": None}]
    got = adaptcq.run("SELECT R.id, R.k, R.f FROM R, S WHERE R.k = S.k",
                      {"R": iter(rows), "S": S1}, executor=executor, chunk_rows=2).table
    assert got.schema.field("k").type == pa.int64() and sorted(got.column("id").to_pylist()) \
        == [0, 2, 4]
    assert got.column("f").to_pylist() == [0.5, 3.0, None]


def test_a_time_of_day_in_a_date_column_is_refused_midnight_is_its_date():
    sql = "SELECT R.d FROM R, S WHERE R.k = S.k"
    rows = [{"ts": 0, "k": 1, "d": dt.date(2024, 1, 1)}, {"ts": 1, "k": 1, "d": None},
            {"ts": 2, "k": 1, "d": dt.datetime(2024, 1, 2)},
            {"ts": 3, "k": 1, "d": dt.datetime(2024, 1, 2, 23, 59)}]
    with pytest.raises(InputError, match=r"column 'd' is date32\[day\] there, and row 3 has "
                       r"datetime\.datetime\(2024, 1, 2, 23, 59\) \(a time of day"):
        adaptcq.run(sql, {"R": iter(rows), "S": S1}, chunk_rows=2)
    got = adaptcq.run(sql, {"R": iter(rows[:3]), "S": S1}, chunk_rows=2).table
    assert got.column("d").to_pylist() == [dt.date(2024, 1, 1), None, dt.date(2024, 1, 2)]


def test_a_string_or_bool_for_a_number_from_dicts_stays_refused():
    for bad, col in (("5", "k"), (True, "k"), (1, "s")):
        rows = [{"ts": 0, "k": 1, "s": "a"}, {"ts": 1, "k": 1, "s": "b"},
                {"ts": 2, "k": 1, "s": "c", col: bad}]
        with pytest.raises(InputError, match=rf"rows 2\.\.2 do not fit the types of the first "
                           rf"rows: column '{col}' is"):
            adaptcq.run("SELECT R.s FROM R, S WHERE R.k = S.k", {"R": iter(rows), "S": S1},
                        chunk_rows=2)


# ----- 07: an iterable of RecordBatches: one family of types per column ---------------------
def test_a_later_batch_of_another_kind_is_refused():
    """int 5 after strings became '5' (and joined '5'); '7' after int64 became 7."""
    sql = "SELECT R.k FROM R, S WHERE R.k = S.k"
    cases = [(pa.array(["05"]), pa.array([5]), "string", "int64"),
             (pa.array([1]), pa.array(["7"]), "int64", "string"),
             (pa.array([1]), pa.array([7.0]), "int64", "double"),
             (pa.array([1.0]), pa.array([Decimal(7)]), "double", r"decimal128\(1, 0\)"),
             (pa.array([True]), pa.array([1]), "bool", "int64"),
             (pa.array([dt.date(2024, 1, 1)]), pa.array([dt.datetime(2024, 1, 1)]),
              r"date32\[day\]", r"timestamp\[us\]")]
    for first, later, a, b in cases:
        s = pa.table({"ts": [0], "k": first})
        batches = [pa.record_batch({"ts": [0], "k": first}),
                   pa.record_batch({"ts": [1, 2], "k": later.take([0, 0])})]
        with pytest.raises(InputError, match=rf"stream R: column 'k' is {a} in the first rows "
                           rf"and {b} in rows 1\.\.2 \(an iterable of RecordBatches\); give "
                           "the source one type per column"):
            adaptcq.run(sql, {"R": iter(batches), "S": s})


def test_a_later_batch_of_the_same_family_is_taken_when_its_values_fit():
    sql = "SELECT R.k, R.t FROM R, S WHERE R.k = S.k"
    s = pa.table({"ts": [0], "k": pa.array([7], pa.int32())})
    first = pa.record_batch({"ts": [0], "k": pa.array([7], pa.int32()),
                             "t": pa.array([1_000], pa.timestamp("ms"))})
    fits = pa.record_batch({"ts": [1], "k": pa.array([7]),
                            "t": pa.array([2_000_000], pa.timestamp("us"))})
    got = adaptcq.run(sql, {"R": iter([first, fits]), "S": s}).table
    assert got.schema.field("k").type == pa.int32()
    assert got.column("t").to_pylist() == [dt.datetime(1970, 1, 1, 0, 0, 1),
                                           dt.datetime(1970, 1, 1, 0, 0, 2)]
    too_big = r"row 2 has 1099511627776, which does not fit \(Integer value 1099511627776 "
    lost = (r"row 2 has datetime\.datetime\(1970, 1, 1, 0, 0, 2, 1\), which does not fit "
            r"\(Casting from timestamp\[us\] to timestamp\[ms\] would lose data")
    for k, t, why in ((2**40, 2_000_000, too_big), (7, 2_000_001, lost)):
        bad = pa.record_batch({"ts": [1, 2], "k": pa.array([7, k]),
                               "t": pa.array([2_000_000, t], pa.timestamp("us"))})
        with pytest.raises(InputError, match=rf"is (int32|timestamp\[ms\]) in the first rows and "
                           rf"(int64|timestamp\[us\]) in rows 1\.\.2: {why}"):
            adaptcq.run(sql, {"R": iter([first, bad]), "S": s})


# ----- JSON lines output: written through Python values -------------------------------------
@pytest.mark.parametrize(("sql", "table", "column"), [
    (FAR_SQL[1], FAR, "d"),
    ("SELECT R.t FROM R, S WHERE R.k = S.k", NS, "t"),
])
def test_json_lines_refuse_a_value_python_cannot_hold(tmp_path, capsys, sql, table, column):
    """The vectorized executor keeps such values in Arrow; JSON lines then raised a bare
    OverflowError (a date past 9999) or wrote a time64[ns] cut to the microsecond."""
    from adaptcq.cli import main
    pq.write_table(table, tmp_path / "r.parquet")
    pq.write_table(S1, tmp_path / "s.parquet")
    assert main(["run", "--sql", sql, "--input", f"R={tmp_path / 'r.parquet'}", "--input",
                 f"S={tmp_path / 's.parquet'}", "--executor", "vector", "--output",
                 str(tmp_path / "o.jsonl"), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert f"--format jsonl: output column '{column}'" in err and "write Parquet" in err
    assert "Traceback" not in err


def test_the_vectorized_executor_s_row_by_row_paths_refuse_them_naming_the_column():
    """A selection Arrow compute does not run (a date column against DATE '...') goes row
    by row in Python values: a bare OverflowError before."""
    with pytest.raises(InputError, match=r"stream R: column 'd' \(date32\[day\]\) has a value "
                       "outside the years 1 to 9999"):
        adaptcq.run("SELECT R.id FROM R, S WHERE R.k = S.k AND R.d < DATE '2020-01-01'",
                    {"R": FAR, "S": S1}, executor="vector")


def test_unions_and_run_end_encoded_columns_are_looked_into():
    """``is_nested`` holds for unions and run-end encoding too, which have no list items:
    the check raised AttributeError on them."""
    from adaptcq.stream.merge import python_misfit
    ree = pa.RunEndEncodedArray.from_arrays(pa.array([1], pa.int32()),
                                            pa.array([2_932_897], pa.date32()))
    assert "outside the years 1 to 9999" in python_misfit(ree)
    union = pa.UnionArray.from_sparse(pa.array([0, 1], pa.int8()),
                                      [pa.array([0, 2_932_897], pa.date32()),
                                       pa.array(["a", "b"])])
    assert "outside the years 1 to 9999" in python_misfit(union)
