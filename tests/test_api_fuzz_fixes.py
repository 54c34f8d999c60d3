"""Fixes from fuzzing the Python API: options the vectorized executor dropped, values of an
iterable of dicts converted silently within a chunk or reported at the wrong row, a
dropped run's open files, NumPy integers as whole-number options, and a sign column that
is the timestamp column."""

from __future__ import annotations

import datetime as dt
import gc
import os
from decimal import Decimal

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import adaptcq
from adaptcq.checks import whole
from adaptcq.cli import main
from adaptcq.errors import InputError, OptionError

SQL = "SELECT R.x, S.y FROM R, S WHERE R.a = S.a"
S = pa.table({"ts": [0.5], "a": [0], "y": [1]})
FEW = settings(max_examples=25, deadline=None,
               suppress_health_check=[HealthCheck.function_scoped_fixture])


def _rows(xs) -> list[dict]:
    return [{"ts": float(i), "a": 0, "x": x} for i, x in enumerate(xs)]


# ----- 1. spill options with the vectorized executor -------------------------------------
def test_spill_options_are_refused_by_the_vectorized_executor():
    R = pa.table({"ts": np.arange(20.0), "a": np.arange(20) % 3, "x": np.arange(20)})
    spill = {"strategy": "global-penalty", "memory": "1kB"}
    for ex in ("vector", "mjoin", "xjoin"):
        with pytest.raises(OptionError, match=f"need the operator tree .*this run uses {ex}$"):
            adaptcq.run(SQL, {"R": R, "S": S}, executor=ex, spill=spill)
    # auto still chooses the operator tree for them
    assert adaptcq.run(SQL, {"R": R, "S": S}, spill=spill).stats["executor"] == "tree"


# ----- 2. lossy conversions within one chunk of dicts ------------------------------------
# (what the column holds first, a value pyarrow converted into its type, why it is refused:
# within its chunk, or alone in a later chunk)
LOSSY = [
    (dt.date(2020, 1, 1), dt.datetime(2020, 1, 2, 12, 30), ("a time of day",)),
    (dt.date(2020, 1, 1), dt.datetime(2020, 1, 2, tzinfo=dt.timezone(dt.timedelta(hours=2))),
     ("a time of day",)),
    (1.5, True, ("a bool, which is not a number", "bool: another type")),
    (2.5, np.bool_(False), ("a bool, which is not a number", "bool: another type",
                            "numpy.bool")),
    ("a", b"b", ("bytes, which are not a string", "binary: another type")),
    ([dt.date(2020, 1, 1)], [dt.datetime(2020, 1, 2, 3)], ("at x[]", "a time of day")),
    ({"q": 1.5}, {"q": True}, ("at x.q", "another type")),
]


@FEW
@given(case=st.sampled_from(LOSSY), n=st.integers(2, 12), data=st.data())
def test_a_lossy_value_is_refused_wherever_it_sits_in_its_chunk(case, n, data):
    """docs/semantics.md §5: such a value is refused whatever the chunking (it was refused
    only alone in its chunk, and converted after a value of the column's type)."""
    held, bad, why = case
    k = data.draw(st.integers(1, n - 1), label="row of the bad value")
    chunk = data.draw(st.integers(1, n), label="chunk_rows")
    xs = [held] * n
    xs[k] = bad
    with pytest.raises(InputError) as e:
        adaptcq.run(SQL, {"R": iter(_rows(xs)), "S": S}, chunk_rows=chunk)
    msg = str(e.value)
    assert f"row {k} has" in msg and any(w in msg for w in why), msg


@pytest.mark.parametrize("xs, want", [
    ([1, 2.5], [1.0, 2.5]),
    ([1, Decimal("2.5")], [Decimal("1.0"), Decimal("2.5")]),
    ([dt.date(2020, 1, 1), dt.datetime(2020, 1, 2)], [dt.date(2020, 1, 1), dt.date(2020, 1, 2)]),
    ([[1], [2.5]], [[1.0], [2.5]]),
    ([{"q": True, "r": 1}, {"q": False, "r": 2}], [{"q": True, "r": 1}, {"q": False, "r": 2}]),
])
def test_exact_mixes_within_a_chunk_are_kept(xs, want):
    got = adaptcq.run(SQL, {"R": iter(_rows(xs)), "S": S}, chunk_rows=len(xs))
    assert got.table.column("x").to_pylist() == want


# ----- 3. a later chunk's bad value is named at its row ---------------------------------
# (the column's values, a value that does not fit its type)
MISFITS = [(lambda i: i, lambda i: str(i)), (lambda i: i, lambda i: True),
           (lambda i: i, lambda i: Decimal(i) + Decimal("0.5")),
           (lambda i: float(i), lambda i: 2**53 + 1),
           (lambda i: Decimal(i % 7), lambda i: i + 0.5)]  # (decimal(1, 0))


@FEW
@given(case=st.sampled_from(MISFITS), chunk=st.integers(1, 6), data=st.data())
def test_a_later_chunks_bad_value_is_named_at_its_row(case, chunk, data):
    good, bad = case
    n = chunk * 4
    k = data.draw(st.integers(chunk, n - 1), label="row of the bad value")
    xs = [good(i) for i in range(n)]
    xs[k] = bad(k)
    with pytest.raises(InputError) as e:
        adaptcq.run(SQL, {"R": iter(_rows(xs)), "S": S}, chunk_rows=chunk)
    msg = str(e.value)
    assert f"row {k} has {xs[k]!r}" in msg, msg


# ----- 4. a run dropped unstarted ---------------------------------------------------------
def _open(path) -> bool:
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == str(path):
                return True
        except OSError:
            continue
    return False


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
@pytest.mark.parametrize("executor", ["auto", "mjoin", "tree"])
def test_a_dropped_run_closes_its_input_and_removes_its_spill_folder(tmp_path, executor):
    csv = tmp_path / "r.csv"
    pcsv.write_csv(pa.table({"ts": [1.0, 2.0], "a": [1, 2], "x": [1, 2]}), csv)
    folder = tmp_path / "spill"
    kw = {"spill": {"strategy": "global-penalty", "memory": "1kB",
                    "directory": str(folder)}} if executor == "tree" else {}
    gc.collect()
    gc.disable()  # (the reference count alone must free it)
    try:
        run = adaptcq.stream(SQL, {"R": str(csv), "S": S}, executor=executor, **kw)
        assert _open(csv)
        del run
        assert not _open(csv)
        assert not folder.exists()
    finally:
        gc.enable()


def test_a_run_to_its_end_keeps_its_results_and_spill_figures(tmp_path):
    R = pa.table({"ts": np.arange(30.0), "a": np.zeros(30, int), "x": np.arange(30)})
    got = adaptcq.run(SQL, {"R": R, "S": S}, spill={"strategy": "global-penalty",
                                                    "memory": "1kB"})
    assert got.table.num_rows == 30 and "spills" in got.stats


# ----- 5. NumPy integers as whole numbers ----------------------------------------------------
@given(n=st.integers(1, 2**62), t=st.sampled_from([int, np.int64, np.int32, np.uint64]))
def test_whole_takes_integers_of_any_kind(n, t):
    if t is np.int32:
        n = n % 2**31 or 1
    assert whole(t(n)) == n and type(whole(t(n))) is int


@pytest.mark.parametrize("x", [True, False, np.bool_(True), 3.0, np.float64(3), "3", None])
def test_whole_refuses_what_is_not_a_whole_number(x):
    assert whole(x) is None


def test_numpy_integers_are_taken_as_counts():
    R = pa.table({"ts": np.arange(10.0), "a": np.zeros(10, int), "x": np.arange(10)})
    got = adaptcq.run(SQL, {"R": R, "S": S}, max_results=np.int64(3))
    assert got.table.num_rows == 3 and got.stats["stopped"] == "--max-results 3 reached"
    for kw in ({"chunk_rows": np.int64(4)}, {"batch_rows": np.uint16(4)}):
        assert adaptcq.run(SQL, {"R": R, "S": S}, **kw).table.num_rows == 10
    for bad in (True, 3.0, np.bool_(True), np.float64(3)):
        with pytest.raises(OptionError, match="must be a positive whole number"):
            adaptcq.run(SQL, {"R": R, "S": S}, max_results=bad)


# ----- 6. the sign column cannot be the timestamp column -------------------------------------
@pytest.mark.parametrize("executor", ["auto", "mjoin", "vector"])
def test_a_sign_column_that_is_the_timestamp_column_is_refused(executor):
    R = pa.table({"ts": [1, 1, -1], "k": [1, 1, 1], "v": [5, 6, 5]})
    T = pa.table({"ts": [-1], "k": [1], "w": [20]})
    with pytest.raises(OptionError, match="--sign 'ts' .*names the timestamp column"):
        adaptcq.run("SELECT R.v, T.w FROM R, T WHERE R.k = T.k", {"R": R, "T": T},
                    sign="ts", executor=executor, mode="retract", allowed_lateness=5)


def test_the_cli_refuses_a_sign_column_that_is_the_timestamp_column(tmp_path, capsys):
    for name, t in (("R", pa.table({"ts": [1.0], "a": [0], "x": [1]})), ("S", S)):
        pcsv.write_csv(t, tmp_path / f"{name}.csv")
    assert main(["run", "--sql", SQL, "--input", f"R={tmp_path / 'R.csv'}", "--input",
                 f"S={tmp_path / 'S.csv'}", "--sign", "ts", "--timestamp", "ts",
                 "--no-progress", "--output", str(tmp_path / "o.csv")]) == 1
    assert "names the timestamp column" in capsys.readouterr().err


def test_spark_refuses_a_sign_column_that_is_the_timestamp_column(tmp_path, capsys):
    """On Spark too, before a JVM starts: the API (continuous_query, prepare_files, which
    run_files calls) and `adaptcq run --engine spark`."""
    pytest.importorskip("pyspark")
    from adaptcq.runtime.spark import continuous_query, prepare_files
    with pytest.raises(OptionError, match="names the timestamp column"):
        continuous_query(None, SQL, {"R": None, "S": None}, timestamp="ts", sign="ts")
    for name, t in (("R", pa.table({"ts": [1.0], "a": [0], "x": [1]})), ("S", S)):
        pcsv.write_csv(t, tmp_path / f"{name}.csv")
    srcs = {n: str(tmp_path / f"{n}.csv") for n in "RS"}
    with pytest.raises(OptionError, match="names the timestamp column"):
        prepare_files(SQL, srcs, tmp_path / "ck", str(tmp_path / "o"), sign="ts")
    assert main(["run", "--engine", "spark", "--sql", SQL, "--input", f"R={srcs['R']}",
                 "--input", f"S={srcs['S']}", "--sign", "ts", "--no-progress",
                 "--output", str(tmp_path / "o2")]) == 1
    assert "names the timestamp column" in capsys.readouterr().err
    assert not (tmp_path / "ck").exists() and not (tmp_path / "o2").exists()


# ----- later fixes: live sources' batches, decimals ordered against NaN ----------------------
def _live_feed(name, seen, log):
    """A live feed: 3 chunks of 5 rows, 10 s apart; records how many results the consumer
    held when each chunk was asked for."""
    import datetime
    t0 = datetime.datetime(2024, 1, 1)
    for c in range(3):
        log.append((name, len(seen)))
        yield pa.record_batch({
            "ts": pa.array([t0 + datetime.timedelta(seconds=10 * c + i) for i in range(5)],
                           pa.timestamp("us")),
            "a": pa.array([1] * 5, pa.int64()),
            "id": pa.array([10 * c + i for i in range(5)], pa.int64())})


@pytest.mark.parametrize("opts", [{}, {"batch_seconds": 60}, {"batch_rows": 4},
                                  {"batch_rows": 3, "batch_seconds": 0.5}])
def test_a_live_sources_results_leave_at_every_release_as_mjoins_do(opts):
    """docs/vector.md, "Batching": sources of unknown length close a batch at every
    release; with batch_seconds, or a release beyond batch_rows, its last part waited for
    more input (a paused feed held its results back)."""
    sql = ("SELECT R.id AS r, S.id AS s FROM R [RANGE 100 SECONDS], S [RANGE 100 SECONDS] "
           "WHERE R.a = S.a")
    held = {}
    for ex, o in (("mjoin", {}), ("vector", opts)):
        seen, log = [], []
        for b in adaptcq.stream(sql, {"R": _live_feed("R", seen, log),
                                      "S": _live_feed("S", seen, log)}, executor=ex, **o):
            seen.extend(b.to_pylist())
        held[ex] = ([k for n, k in log if n == "R"], sorted(map(repr, seen)))
    assert held["vector"] == held["mjoin"]
    assert held["mjoin"][0] == [0, 16, 81]


@pytest.mark.parametrize("executor", ["mjoin", "vector"])
def test_a_decimal_ordered_against_a_nan_float_is_false(executor):
    """Python's Decimal raised InvalidOperation ordered against a NaN float (a raw
    traceback); NaN is neither less nor greater, so the comparison fails and its NOT
    holds, as for floats (docs/semantics.md)."""
    R = pa.table({"ts": [1.0, 2.0, 3.0], "a": [1, 1, 1], "id": [1, 2, 3],
                  "d": pa.array([Decimal("1.5")] * 3, pa.decimal128(5, 2)),
                  "f": [float("nan"), 1.0, 2.0]})
    S = pa.table({"ts": [0.0], "a": [1]})
    for cond, want in (("R.d > R.f", [2]), ("R.f < R.d", [2]), ("R.d <= R.f", [3]),
                       ("NOT (R.d > R.f)", [1, 3]), ("R.f BETWEEN R.d AND 3", [3]),
                       ("R.d BETWEEN R.f AND 3", [2]), ("R.d = R.f", []),
                       ("R.d <> R.f", [1, 2, 3])):
        got = adaptcq.run(f"SELECT R.id FROM R, S WHERE R.a = S.a AND {cond}",
                          {"R": R, "S": S}, executor=executor)
        assert sorted(got.table["id"].to_pylist()) == want, cond


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), batch_rows=st.integers(1, 12))
def test_the_vectorized_executor_reports_unmatched_deletions_in_arrival_order(data,
                                                                              batch_rows):
    """Its rejected rows were grouped stream by stream within a batch; MJoin reports them
    in arrival order (the same rows either way)."""
    def stream(name):
        n = data.draw(st.integers(1, 10), label=f"{name} rows")
        keys = data.draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))
        signs = data.draw(st.lists(st.sampled_from([1, 1, -1]), min_size=n, max_size=n))
        times = sorted(data.draw(st.lists(st.integers(0, 6), min_size=n, max_size=n)))
        return pa.table({"ts": pa.array(times, pa.int64()), "a": keys, "id": keys,
                         "s": pa.array(signs, pa.int8())})
    srcs = {"R": stream("R"), "S": stream("S")}
    sql = "SELECT R.id AS r, S.id AS s FROM R, S WHERE R.a = S.a"
    got = {ex: adaptcq.run(sql, srcs, executor=ex, sign="s", **opts).rejected.to_pylist()
           for ex, opts in (("mjoin", {}), ("vector", {"batch_rows": batch_rows}))}
    assert got["vector"] == got["mjoin"]
