"""State spill from the command line and the Python API (issue 12): the same results as
MJoin, late ones flagged; a spill folder left for `adaptcq cleanup`; refusals with reasons;
the §6.1 workload generator; the benchmark's smoke run."""

from __future__ import annotations

import json
import os
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import adaptcq
from adaptcq.cli import main
from adaptcq.errors import OptionError
from adaptcq.stats.partitions import partition_of
from adaptcq.stream.spill_workload import spill_five_way

SQL = ("SELECT A.id AS a, B.id AS b, C.id AS c, D.id AS d FROM A [RANGE 30 SECONDS], "
       "B [RANGE 30 SECONDS], C, D [RANGE 20 SECONDS] "
       "WHERE A.x = B.x AND B.x = C.x AND C.y = D.y")


@pytest.fixture
def files(tmp_path):
    rng = np.random.default_rng(5)
    n = 1200
    for s in "ABCD":
        pq.write_table(pa.table({"ts": np.sort(rng.integers(0, 2000, n)) / 10.0,
                                 "id": np.arange(n), "x": rng.integers(0, 150, n),
                                 "y": rng.integers(0, 150, n)}), tmp_path / f"{s}.parquet")
    return tmp_path


def cli(tmp, *extra):
    return main(["run", "--sql", SQL, *(f"--input={s}={tmp / f'{s}.parquet'}" for s in "ABCD"),
                 "--no-progress", *map(str, extra)])


def results(*paths) -> Counter:
    out = Counter()
    for p in paths:
        t = pq.read_table(p)
        out.update(zip(*(t.column(c).to_pylist() for c in ("a", "b", "c", "d", "_sign", "_ts"))))
    return out


@pytest.mark.parametrize("strategy", ["bottom-up", "local-output", "global-output",
                                      "global-penalty"])
def test_spilling_gives_mjoins_results(files, strategy):
    assert cli(files, "--executor", "mjoin", "--output", files / "m.parquet") == 0
    assert cli(files, "--spill", strategy, "--memory", "150kB", "--spill-partitions", 40,
               "--spill-check", 50, "--summary-json", files / "s.json",
               "--output", files / "s.parquet") == 0
    assert results(files / "s.parquet") == results(files / "m.parquet")
    summary = json.loads((files / "s.json").read_text())
    late = pq.read_table(files / "s.parquet").column("_late").to_pylist()
    assert summary["executor"] == "tree" and summary["spills"] > 0
    assert summary["late_results"] == sum(late) > 0
    assert summary["complete_until"] == pytest.approx(summary["last_event_time"])


def test_a_spill_folder_left_for_adaptcq_cleanup(files, capsys):
    assert cli(files, "--executor", "mjoin", "--output", files / "m.parquet") == 0
    folder = files / "spilled"
    assert cli(files, "--spill", "global-output", "--memory", "150kB", "--spill-partitions",
               40, "--spill-check", 50, "--cleanup", "off", "--spill-dir", folder,
               "--summary-json", files / "s.json", "--output", files / "s.parquet") == 0
    summary = json.loads((files / "s.json").read_text())
    assert summary["late_results"] == 0 and summary["complete_until"] < summary["last_event_time"]
    # A new run may not mix its spills with these.
    assert cli(files, "--spill", "global-output", "--memory", "150kB", "--spill-dir", folder,
               "--output", files / "t.parquet") == 1
    assert "adaptcq cleanup" in capsys.readouterr().err
    assert main(["cleanup", str(folder), "--output", str(files / "late.parquet")]) == 0
    assert results(files / "s.parquet", files / "late.parquet") == results(files / "m.parquet")
    assert all(pq.read_table(files / "late.parquet").column("_late").to_pylist())
    assert main(["cleanup", str(files), "--output", str(files / "x.parquet")]) == 1


def test_the_tree_executor_with_an_m_way_plan_and_never_while_running(files):
    assert cli(files, "--executor", "mjoin", "--output", files / "m.parquet") == 0
    assert cli(files, "--executor", "tree", "--tree", "((A, B, C), D)", "--spill",
               "global-penalty", "--memory", "100kB", "--cleanup", "never-while-running",
               "--summary-json", files / "s.json", "--output", files / "t.parquet") == 0
    assert results(files / "t.parquet") == results(files / "m.parquet")
    assert json.loads((files / "s.json").read_text())["cleanups"] == 1


@pytest.mark.parametrize("extra, message", [
    (["--spill", "global-output", "--memory", "1MB", "--executor", "mjoin"],
     "spilling is done by the operator tree"),
    (["--spill", "global-output"], "--spill STRATEGY and --memory BUDGET go together"),
    (["--spill", "global-output", "--memory", "1MB", "--cleanup", "off"], "--spill-dir"),
    (["--spill", "global-output", "--memory", "1MB", "--executor", "acaching"],
     "not by --executor acaching"),
    (["--spill", "global-output", "--memory", "lots"], "--memory 'lots'"),
    (["--spill", "global-output", "--memory", "1MB", "--mode", "retract"], "append mode only"),
    (["--spill", "global-output", "--memory", "1MB", "--engine", "spark", "--spill-dir",
      "s"], "inside the checkpoint"),
    (["--spill", "global-output", "--memory", "1MB", "--engine", "spark", "--cleanup",
      "off"], "--cleanup off on Spark leaves the held-back results in the checkpoint"),
    (["--executor", "xjoin", "--tree", "((A, B, C), D)"], "exactly two inputs"),
    (["--executor", "tree", "--tree", "((A, D), B, C)"], "no join column shared"),
])
def test_refusals_name_the_reason(files, capsys, extra, message):
    assert cli(files, *extra, "--output", files / "o.parquet") == 1
    assert message in capsys.readouterr().err


def test_the_python_api(files):
    sources = {s: str(files / f"{s}.parquet") for s in "ABCD"}
    want = adaptcq.run(SQL, sources, executor="mjoin").table
    got = adaptcq.run(SQL, sources, spill={"strategy": "global-penalty", "memory": 100_000,
                                           "partitions": 30, "every": 40})
    assert got.stats["executor"] == "tree" and got.stats["spills"] > 0
    key = ("a", "b", "c", "d", "_ts")
    assert Counter(zip(*(got.table.column(c).to_pylist() for c in key))) == \
        Counter(zip(*(want.column(c).to_pylist() for c in key)))
    with pytest.raises(OptionError, match="unknown spill option 'budget'"):
        adaptcq.run(SQL, sources, spill={"strategy": "global-output", "budget": 5})
    with pytest.raises(OptionError, match="need the operator tree"):
        adaptcq.run(SQL, sources, executor="mjoin",
                    spill={"strategy": "global-output", "memory": 5000})


@pytest.mark.parametrize("case", ["columns", "expression", "other types"])
def test_late_results_of_a_batch_cleanup_leave_as_arrow_or_as_rows(files, monkeypatch, case):
    """A SELECT of plain columns: a batch clean-up's late results leave as Arrow tables
    (``SpillTree.emit_table``); with an expression, or columns whose type is not the
    output's, as rows. The results are the same either way."""
    from adaptcq.engine.spill_tree import SpillTree
    from adaptcq.runtime import local
    sql = SQL if case != "expression" else SQL.replace("D.id AS d", "D.id + 1 AS d")
    if case == "other types":  # the late tables' id columns as int32: not the output's
        plain = SpillTree._late_table

        def narrowed(self, part):
            t = plain(self, part)
            return t.set_column(0, t.column_names[0], t.column(0).cast(pa.int32()))
        monkeypatch.setattr(SpillTree, "_late_table", narrowed)
    tables = []
    emit_table = local.LocalRun._emit_table

    def counted(self, t):
        tables.append(t.num_rows)
        return emit_table(self, t)
    monkeypatch.setattr(local.LocalRun, "_emit_table", counted)
    sources = {s: str(files / f"{s}.parquet") for s in "ABCD"}
    got = adaptcq.run(sql, sources, spill={"strategy": "global-penalty", "memory": 100_000,
                                           "partitions": 30, "every": 40})
    assert got.stats["late_results"] > 0 and got.stats["cleanup_batch_runs"] > 0
    assert (sum(tables) == got.stats["late_results"]) == (case == "columns")
    assert tables if case == "columns" else not tables
    want = adaptcq.run(sql, sources, executor="mjoin").table
    key = ("a", "b", "c", "d", "_ts")
    assert got.stats["results"] == got.table.num_rows == want.num_rows
    assert got.table.schema.field("a").type == want.schema.field("a").type
    assert Counter(zip(*(got.table.column(c).to_pylist() for c in key))) == \
        Counter(zip(*(want.column(c).to_pylist() for c in key)))


@pytest.mark.parametrize("case", ["columns", "expression"])
def test_adaptcq_cleanup_writes_late_results_as_arrow_or_as_rows(files, monkeypatch, case):
    """`adaptcq cleanup FOLDER`: with a SELECT of plain columns the batch clean-up's late
    results are written as Arrow tables, with an expression as rows; the output is the
    same multiset as MJoin's either way."""
    from adaptcq.runtime import local
    sql = SQL if case == "columns" else SQL.replace("D.id AS d", "D.id + 1 AS d")
    inputs = [f"--input={s}={files / f'{s}.parquet'}" for s in "ABCD"]
    assert main(["run", "--sql", sql, *inputs, "--no-progress", "--executor", "mjoin",
                 "--output", str(files / "m.parquet")]) == 0
    folder = files / "spilled"
    assert main(["run", "--sql", sql, *inputs, "--no-progress", "--spill", "global-penalty",
                 "--memory", "100kB", "--spill-partitions", "30", "--spill-check", "40",
                 "--cleanup", "off", "--spill-dir", str(folder),
                 "--output", str(files / "s.parquet")]) == 0
    tables = []
    to_schema = local.table_to_schema

    def counted(t, schema, unit):
        tables.append(t.num_rows)
        return to_schema(t, schema, unit)
    monkeypatch.setattr(local, "table_to_schema", counted)
    assert main(["cleanup", str(folder), "--output", str(files / "late.parquet")]) == 0
    late = pq.read_table(files / "late.parquet")
    assert late.num_rows > 0 and all(late.column("_late").to_pylist())
    assert (sum(tables) == late.num_rows) if case == "columns" else not tables
    assert results(files / "s.parquet", files / "late.parquet") == results(files / "m.parquet")


@pytest.mark.parametrize("arrow", [True, False])
def test_late_results_are_counted_when_a_result_bound_stops_the_cleanup(files, arrow):
    """--max-results reached inside the end of input's clean-up: the summary counts the
    late results produced so far (it said 0: the count was added when a clean-up ended);
    with a SELECT of plain columns they leave as Arrow, with an expression as rows."""
    sql = SQL if arrow else SQL.replace("D.id AS d", "D.id + 1 AS d")
    sources = {s: str(files / f"{s}.parquet") for s in "ABCD"}
    spill = {"strategy": "global-penalty", "memory": 100_000, "partitions": 30,
             "every": 40, "when_free": False}
    whole = adaptcq.run(sql, sources, spill=spill)
    bound = whole.table.num_rows - whole.stats["late_results"] // 2  # inside the clean-up
    got = adaptcq.run(sql, sources, spill=spill, max_results=bound)
    late = sum(got.table.column("_late").to_pylist())
    assert got.table.num_rows == bound and 0 < late < whole.stats["late_results"]
    assert late <= got.stats["late_results"] <= whole.stats["late_results"]


def test_late_results_leave_an_iterator_while_the_cleanup_runs(files, monkeypatch):
    """The end-of-input clean-up pauses after each partition group, and the late results
    emitted so far leave `adaptcq.stream`'s iterator then: they do not wait, all in memory,
    for the clean-up's end."""
    from adaptcq.runtime import local
    monkeypatch.setattr(local, "OUT_CHUNK", 64)  # small batches: many leave on the way
    sources = {s: str(files / f"{s}.parquet") for s in "ABCD"}
    run = adaptcq.stream(SQL, sources, spill={"strategy": "global-penalty", "memory": 100_000,
                                              "partitions": 30, "every": 40,
                                              "when_free": False})
    cleanups_done, late = [], 0
    for b in run:
        n = sum(b.column("_late").to_pylist())
        if n:
            cleanups_done.append(run.cq.executor.counters.cleanups)
            late += n
    assert len(cleanups_done) > 1 and cleanups_done[0] == 0  # out before the clean-up ended
    assert late == run.stats["late_results"] > 0
    assert run.stats["cleanups"] == 1


def test_the_workload_has_its_tuple_range_and_join_ratios():
    """§6.1: in every block of K tuples, value v appears R_v times, R_v its partition's
    ratio, drawn from {1..2R-1} so that the operator's average ratio is R."""
    w = spill_five_way(5 * 9000, ratios=(3, 1, 2), tuple_range=3000)
    assert w.params["tuple_range"] == 3000
    for stream, col, ratio in (("A", "x", 3), ("C", "y", 1), ("E", "x", 2)):
        values = np.asarray(w.tables[stream].column(col))
        per_block = [Counter(values[k:k + 3000].tolist()) for k in range(0, 9000, 3000)]
        by_partition: dict = {}
        for v, n in per_block[0].items():
            by_partition.setdefault(partition_of(v, 300), set()).add(n)
        full = {v: n for v, n in per_block[0].items() if n == max(per_block[0].values())}
        assert full  # values keep their count in every block (the last value may be cut)
        assert per_block[0] == per_block[1] == per_block[2]
        assert all(len(ns) <= 2 for ns in by_partition.values())
        assert all(max(ns) <= 2 * ratio - 1 for ns in by_partition.values())
    ts = np.asarray(w.tables["B"].column("ts"))
    assert np.allclose(np.diff(ts), 0.05)


def test_the_benchmark_runs_small(tmp_path, capsys):
    from adaptcq.bench.spill import main as bench
    assert bench(["figures", "--arrivals", "3000", "--figures", "16", "--out",
                  str(tmp_path)]) == 0
    assert (tmp_path / "fig16.png").exists() and (tmp_path / "fig17.png").exists()
    out = capsys.readouterr().out
    assert "trend checks hold" in out


def test_the_spark_benchmark_runs_small(spark, tmp_path, capsys, monkeypatch):
    """``bench.spill spark``: the three jobs, their outputs equal (it stops otherwise), the
    CSV and plot written. The jobs run in this process on the shared session (the bench
    starts a process per job to time it; two more JVMs would add nothing to what is
    checked here)."""
    import csv
    import subprocess

    import adaptcq.bench.spill as spill_bench
    from adaptcq.bench.spill import main as bench

    real_run, jobs = subprocess.run, []

    def in_process(cmd, **kwargs):  # subprocess is one module: other callers pass through
        if cmd[1:3] != ["-c", spill_bench.CLI]:
            return real_run(cmd, **kwargs)
        jobs.append(cmd)
        return subprocess.CompletedProcess(cmd, main(cmd[3:]), "", "")
    monkeypatch.setattr(subprocess, "run", in_process)
    assert bench(["spark", "--arrivals", "2000", "--memory", "200kB", "--repeats", "1",
                  "--out", str(tmp_path)]) == 0
    with open(tmp_path / "spark.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["job"] for r in rows] == ["local, spilling", "spark, spilling",
                                        "spark, no spilling"]
    assert int(rows[1]["spills"]) > 0 and int(rows[2]["spills"]) == 0
    assert len({r["results"] for r in rows}) == 1
    assert (tmp_path / "spark.png").exists()
    assert "outputs equal in every round" in capsys.readouterr().out
    assert len(jobs) == 3  # every job ran (in this process)


def test_the_rebuild_benchmark_runs_small(tmp_path, capsys):
    """``bench.spill rebuild``: a spilling group rebuilt in a fresh process replays every
    stored row (those released), the CSV written."""
    import csv

    from adaptcq.bench.spill import main as bench
    assert bench(["rebuild", "--rows", "3000", "--repeats", "1", "--out", str(tmp_path)]) == 0
    with open(tmp_path / "rebuild.csv") as f:
        (row,) = list(csv.DictReader(f))
    assert int(row["rows"]) == 9000 and 8990 <= int(row["rebuilt_rows"]) <= 9000
    assert "rebuild CPU median" in capsys.readouterr().out


def test_a_failed_run_leaves_no_half_spill_folder(files, capsys):
    """A run that stops with an error cannot clean up what it spilled (its memory is
    gone): the folder is emptied, so a new run or `adaptcq cleanup` is not misled."""
    folder = files / "spilled"
    assert cli(files, "--spill", "global-output", "--memory", "150kB", "--spill-partitions",
               40, "--spill-check", 50, "--spill-dir", folder, "--max-results", 100,
               "--output", files / "s.parquet") == 1
    assert "max-results" in capsys.readouterr().err
    assert not list(folder.glob("spill-*"))
    assert cli(files, "--spill", "global-output", "--memory", "150kB", "--spill-dir", folder,
               "--output", files / "s.parquet") == 0


def test_a_temporary_spill_folder_goes_with_its_run(files):
    """Without --spill-dir the spilled state goes to a temporary folder. It is removed
    when the run ends, when it stops early, and when the run is dropped before it was
    iterated (nothing calls its ``close`` then): one folder per query would otherwise be
    left behind by a process that runs queries for days."""
    import gc
    sources = {s: str(files / f"{s}.parquet") for s in "ABCD"}
    spill = {"strategy": "global-penalty", "memory": 100_000, "partitions": 30, "every": 40}

    def folder(run):
        return run.cq.executor.store.directory

    whole = adaptcq.stream(SQL, sources, spill=spill)
    d1 = folder(whole)
    assert d1.is_dir() and sum(b.num_rows for b in whole) > 0
    stopped = adaptcq.stream(SQL, sources, spill=spill)
    d2 = folder(stopped)
    it = iter(stopped)
    next(it)
    it.close()  # the consumer stops early
    dropped = adaptcq.stream(SQL, sources, spill=spill)
    d3 = folder(dropped)
    assert d3.is_dir()
    del dropped
    gc.collect()
    assert not d1.exists() and not d2.exists() and not d3.exists()


def test_a_process_that_exits_mid_run_leaves_no_spill_folder_or_error(files):
    """A process that exits while a spilling run is half-iterated: the temporary folder
    goes at exit, and the run's own clean-up after it (the generator closed last) does not
    fail on the missing folder."""
    import subprocess
    import sys
    script = (
        "import sys, adaptcq\n"
        f"sources = {{s: {str(files)!r} + f'/{{s}}.parquet' for s in 'ABCD'}}\n"
        f"run = adaptcq.stream({SQL!r}, sources, spill={{'strategy': 'global-penalty', "
        "'memory': 100_000, 'partitions': 30, 'every': 40, 'when_free': False})\n"
        "it = iter(run)\n"
        "while not run.cq.executor.counters.spills:\n"
        "    next(it)\n"
        "print(run.cq.executor.store.directory)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          check=True)
    folder = done.stdout.strip().splitlines()[-1]
    assert "Exception ignored" not in done.stderr and "Error" not in done.stderr
    assert folder and not os.path.exists(folder)


def test_the_perf_benchmark_runs_small(tmp_path, capsys):
    """``bench.spill perf`` at its smallest size: the unlimited run, the penalty run under
    a tenth of its peak and the fifth-as-long run for the fixed overhead, each in a fresh
    process; equal results (it stops otherwise), the CSV and the three verdicts printed."""
    import csv

    from adaptcq.bench.spill import main as bench
    assert bench(["perf", "--arrivals", "50000", "--out", str(tmp_path)]) == 0
    with open(tmp_path / "perf.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["arrivals"]) for r in rows] == [50_000, 50_000, 10_000]
    assert int(rows[1]["spills"]) > 0 and int(rows[1]["cleanup_writebacks"]) > 0
    out = capsys.readouterr().out
    assert out.count("MET") == 3  # each target's verdict, met or not
    with pytest.raises(SystemExit, match="at least 50,000"):
        bench(["perf", "--arrivals", "40000", "--out", str(tmp_path)])
