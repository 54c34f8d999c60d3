"""How a run ends when it does not simply reach the end of its input: a signal (SIGTERM as
Ctrl-C, on one query and on a query set), a second signal, a failure while outputs are
closed, a failed run's --summary-json, output paths refused before any work (a trailing
'/', devices and FIFOs), where each input stopped (late rows read past the stop), input
files closed when a stream is left, a KeyboardInterrupt recorded (found by fuzzing the
failure paths)."""

from __future__ import annotations

import errno
import gc
import json
import os
import signal
import stat
import subprocess
import sys
import time
import weakref
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import adaptcq
from adaptcq.cli import main
from adaptcq.runtime import output

SQL = ("SELECT R.x AS rx, S.x AS sx FROM R [RANGE 0.01 SECONDS], S [RANGE 0.01 SECONDS] "
       "WHERE R.a = S.a")
SQL_R3 = "SELECT R.x AS rx FROM R [RANGE 1 SECONDS] WHERE R.a = 3"
ENV = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")


def tables(n: int, late_every: int | None = None) -> dict[str, pa.Table]:
    """R and S, one row a millisecond; R's row k * late_every (k >= 1) is late (time 0)."""
    out = {}
    for s in "RS":
        ts = np.arange(n) * 0.001
        if s == "R" and late_every:
            ts[late_every::late_every] = 0.0
        out[s] = pa.table({"ts": ts, "a": np.arange(n) % 50, "x": np.arange(n)})
    return out


def write(folder: Path, n: int, late_every: int | None = None) -> dict[str, pa.Table]:
    t = tables(n, late_every)
    for s, table in t.items():
        pq.write_table(table, folder / f"{s}.parquet")
    return t


def cli(folder: Path, *extra) -> int:
    return main(["run", "--sql", SQL, "--input", f"R={folder / 'R.parquet'}", "--input",
                 f"S={folder / 'S.parquet'}", "--no-progress", *map(str, extra)])


def temporaries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob(".*.tmp"))


def rows_of(table: pa.Table, columns=("rx", "sx", "_sign")) -> Counter:
    return Counter(zip(*[table.column(c).to_pylist() for c in columns], strict=True))


def prefix_run(t: dict[str, pa.Table], done: dict[str, int], sql: str = SQL):
    """The run of the first ``done[s]`` rows of each input (of those ``sql`` reads): what
    a stopped run processed."""
    return adaptcq.run(sql, {s: t[s].slice(0, done[s]) for s in t if f" {s} [" in sql})


def late_rows_before(done: int, late_every: int) -> list[int]:
    return list(range(late_every, done, late_every))


@pytest.fixture
def no_default_signals(monkeypatch):
    """SIGINT and SIGTERM raise an error unless the CLI handles them: a test never kills
    or interrupts pytest itself (the code before these fixes did not handle them)."""
    def unhandled(signum, frame):
        raise RuntimeError(f"{signal.Signals(signum).name} was not handled by the CLI")
    previous = {s: signal.signal(s, unhandled) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for s, h in previous.items():
        signal.signal(s, h)


# ----- 1, 2: SIGTERM as Ctrl-C; Ctrl-C on a query set ------------------------------------
SIGNAL_CASES = {
    "one query, SIGTERM": (signal.SIGTERM, ["--executor", "mjoin"]),
    "spilling, SIGTERM": (signal.SIGTERM, ["--spill", "bottom-up", "--memory", "200000"]),
    "query set, SIGINT": (signal.SIGINT, ["--executor", "eddy", "--sql", SQL_R3]),
    "query set, SIGTERM": (signal.SIGTERM, ["--executor", "eddy"]),
}


@pytest.mark.parametrize("case", SIGNAL_CASES)
def test_a_signal_stops_the_run_between_two_updates(tmp_path, case):
    """A real signal, sent once the run writes: exit 128 + the signal, a summary saying
    where each input stopped, valid outputs holding exactly the results of the rows
    processed, the late rows before that point in the rejected rows' file, no temporary
    file or spill folder left (SIGTERM killed the run, leaving them; on a query set Ctrl-C
    gave a traceback, outputs cut inside an arrival and no rejected rows)."""
    sig, extra = SIGNAL_CASES[case]
    queryset = "--executor" in extra and "eddy" in extra
    n, late = 600_000, 1000
    t = write(tmp_path, n, late)
    tmpdir, out = tmp_path / "tmp", tmp_path / "out"
    tmpdir.mkdir()
    out.mkdir()
    target = out / "q" if queryset else out / "o.parquet"
    cmd = [sys.executable, "-m", "adaptcq.cli", "run", "--sql", SQL, "--input",
           f"R={tmp_path / 'R.parquet'}", "--input", f"S={tmp_path / 'S.parquet'}",
           "--no-progress", "--output", str(target), "--summary-json", str(out / "s.json"),
           *extra]
    p = subprocess.Popen(cmd, env=dict(ENV, TMPDIR=str(tmpdir)), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not temporaries(out) and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)  # the outputs are open: the run has begun
        time.sleep(0.3)
        assert p.poll() is None, "the run ended before the signal: give it more input"
        p.send_signal(sig)
        stdout, stderr = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == 128 + sig, (stdout, stderr)
    assert "Traceback" not in stderr
    said = "interrupted" if sig == signal.SIGINT else "terminated (SIGTERM)"
    assert f"{said}: input stopped after" in stdout
    assert temporaries(tmp_path) == [] and list(tmpdir.iterdir()) == []
    summary = json.loads((out / "s.json").read_text())
    assert summary["stopped"] == said
    done = summary["rows_processed"]
    assert 0 < done["R"] < n and summary["rows_read"]["R"] >= done["R"]
    want = prefix_run(t, done)
    if queryset:
        got = pq.read_table(target / "query_id=q1" / "part-0.parquet")
        rejected = pq.read_table(out / "q.rejected.parquet")
        if "--sql" in extra[2:]:
            alone = prefix_run(t, done, SQL_R3).table
            assert rows_of(pq.read_table(target / "query_id=q2" / "part-0.parquet"),
                           ("rx", "_sign")) == rows_of(alone, ("rx", "_sign"))
    else:
        got = pq.read_table(target)
        rejected = pq.read_table(out / "o.rejected.parquet")
        assert summary["results"] == got.num_rows
    assert rows_of(got) == rows_of(want.table)
    assert rejected.column("row").to_pylist() == late_rows_before(done["R"], late)


def test_a_second_signal_stops_at_once_and_removes_the_outputs(tmp_path, monkeypatch,
                                                                no_default_signals):
    """A second Ctrl-C stops inside the update: the outputs are removed (they would be
    cut), the summary JSON says so, exit 130 without a traceback."""
    write(tmp_path, 20_000, 1000)
    real = output.FileSink.write

    def write_then_press_twice(self, batch):
        real(self, batch)
        if self.what == "--output":
            signal.raise_signal(signal.SIGINT)
            signal.raise_signal(signal.SIGINT)
    monkeypatch.setattr(output.FileSink, "write", write_then_press_twice)
    monkeypatch.setattr("adaptcq.runtime.local.OUT_CHUNK", 500)
    out = tmp_path / "out"
    try:
        code = cli(tmp_path, "--executor", "mjoin", "--output", out / "o.parquet",
                   "--summary-json", out / "s.json")
    except KeyboardInterrupt:
        code = "KeyboardInterrupt"
    assert code == 130
    assert sorted(p.name for p in out.iterdir()) == ["s.json"]
    summary = json.loads((out / "s.json").read_text())
    assert summary["stopped"].startswith("failed: stopped at once by a second Ctrl-C")


def test_a_signal_while_the_run_is_set_up_stops_at_once(tmp_path, monkeypatch,
                                                        no_default_signals):
    """SIGTERM before the run began (its spill folder made): exit 143, nothing left."""
    import tempfile

    from adaptcq.runtime import local
    write(tmp_path, 2_000)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    real = local.LocalRun.__init__

    def init_then_terminate(self, *args, **kwargs):
        real(self, *args, **kwargs)
        signal.raise_signal(signal.SIGTERM)
    monkeypatch.setattr(local.LocalRun, "__init__", init_then_terminate)
    assert cli(tmp_path, "--spill", "bottom-up", "--memory", "100000", "--output",
               tmp_path / "out" / "o.parquet") == 143
    gc.collect()
    # (its output folder, made by the checks, is removed too: the run wrote nothing)
    assert list((tmp_path / "tmp").iterdir()) == [] and not (tmp_path / "out").exists()


def test_engine_stop_keeps_each_querys_results_of_the_arrivals_processed(monkeypatch):
    """``Engine.stop()`` (the query-set CLI's Ctrl-C) stops between two arrivals: each
    query's output is that of its query alone over the rows processed, and the late rows
    past that point are not reported."""
    from adaptcq.runtime import multi
    monkeypatch.setattr(multi, "OUT_CHUNK", 200)
    t = tables(30_000, 1000)
    got: dict[str, list] = {"q1": [], "q2": []}
    rejected: list = []
    engine = adaptcq.Engine(t, on_rejected=rejected.append)

    def take(qid):
        def out(batch):
            got[qid].append(batch)
            if sum(b.num_rows for b in got["q1"]) > 5_000:
                engine.stop()
        return out
    engine.register(SQL, query_id="q1", output=take("q1"))
    engine.register(SQL_R3, query_id="q2", output=take("q2"))
    engine.run()
    s = engine.stats
    assert engine.interrupted and s["stopped"] == "interrupted"
    done = s["rows_processed"]
    assert 0 < done["R"] < 30_000 and s["arrivals"] == done["R"] + done["S"] - len(
        late_rows_before(done["R"], 1000))
    assert rows_of(pa.Table.from_batches(got["q1"])) == rows_of(prefix_run(t, done).table)
    assert rows_of(pa.Table.from_batches(got["q2"]), ("rx", "_sign")) == \
        rows_of(prefix_run(t, done, SQL_R3).table, ("rx", "_sign"))
    late = pa.Table.from_batches(rejected).column("row").to_pylist()
    assert late == late_rows_before(done["R"], 1000) and s["rejected"] == len(late)


def test_a_keyboard_interrupt_on_a_query_set_removes_its_outputs(tmp_path):
    """A KeyboardInterrupt inside an arrival (here a function of the query) leaves no
    output cut inside it, and the figures say so (they were not set)."""
    def udf(x):
        if x == 7_000:
            raise KeyboardInterrupt
        return True
    engine = adaptcq.Engine(tables(20_000), udfs={"ok": udf})
    engine.register("SELECT R.x AS rx FROM R WHERE ok(R.x)", output=str(tmp_path / "q.parquet"))
    with pytest.raises(KeyboardInterrupt):
        engine.run()
    assert list(tmp_path.iterdir()) == []
    assert engine.stats["stopped"] == "interrupted"
    assert engine.stats["rows_processed"]["R"] <= 7_000


# ----- 3, 5: output paths refused before any work --------------------------------------
@pytest.fixture
def special(tmp_path, request):
    """A FIFO (with a reader, so that nothing blocks), a character device (the null
    device's numbers; root only) or a link to the FIFO."""
    kind = request.param
    path = tmp_path / "special"
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    if kind == "FIFO":
        os.rename(fifo, path)
    elif kind == "character device":
        try:
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        except PermissionError:
            pytest.skip("making a device node needs root")
    else:
        os.symlink(fifo, path)
    yield kind, path
    os.close(reader)


@pytest.mark.parametrize("special", ["FIFO", "character device", "link to a FIFO"],
                         indirect=True)
@pytest.mark.parametrize("option", ["--output", "--rejected", "--summary-json"])
def test_a_device_or_fifo_is_refused_not_replaced(tmp_path, capsys, special, option):
    """A device or FIFO named as an output was deleted and a regular file renamed into
    its place (as root, `--output /dev/null` deleted the system's device node)."""
    kind, path = special
    write(tmp_path, 2_000, 100)
    before = os.stat(path).st_mode
    given = {"--output": tmp_path / "o.parquet", option: path}
    args = [a for k, v in given.items() for a in (k, v)]
    assert cli(tmp_path, *args) == 1
    err = capsys.readouterr().err
    shown = "a FIFO" if kind != "character device" else "a character device"
    assert f"{option} '{path}' is {shown}" in err and "not a regular file" in err, err
    assert stat.S_IFMT(os.stat(path).st_mode) == stat.S_IFMT(before)
    assert not (tmp_path / "o.parquet").exists() and temporaries(tmp_path) == []


def test_a_path_among_file_descriptors_is_refused(tmp_path, capsys):
    """/dev/stdout, /dev/fd/N and /proc/self/fd/N lead to a descriptor's file, even a
    regular one: the output renamed into place replaced the link (as root, /dev/stdout)."""
    write(tmp_path, 2_000)
    with open(tmp_path / "held.txt", "w") as held:
        path = f"/proc/self/fd/{held.fileno()}"
        assert cli(tmp_path, "--output", path) == 1
    err = capsys.readouterr().err
    assert f"--output '{path}': an output cannot go in '/proc/" in err, err


@pytest.mark.parametrize("option, name, message", [
    ("--output", "results/", "ends with '/'"),
    ("--output", "o.parquet/", "ends with '/'"),
    ("--rejected", "rej.parquet/", "ends with '/'"),
    ("--summary-json", "s.json/", "ends with '/'"),
    ("--output", "plain.txt/o.parquet", "'{tmp}/plain.txt' is a file, not a folder"),
])
def test_a_file_output_named_as_a_folder_is_refused_before_any_work(tmp_path, capsys,
                                                                    option, name, message):
    """A name ending with '/' passed the checks, the whole run was made, and renaming
    the finished file failed (every result lost)."""
    write(tmp_path, 2_000, 100)
    (tmp_path / "plain.txt").write_text("not a folder")
    given = {"--output": tmp_path / "o.parquet", option: f"{tmp_path}/{name}"}
    args = [a for k, v in given.items() for a in (k, v)]
    assert cli(tmp_path, *args) == 1
    err = capsys.readouterr().err
    assert f"{option} '{tmp_path}/{name}'" in err and message.format(tmp=tmp_path) in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["R.parquet", "S.parquet",
                                                          "plain.txt"]


# ----- 4, 6, 7: failures at the end, the summary JSON ----------------------------------
@pytest.mark.parametrize("failing", ["--output", "--rejected"])
def test_a_failure_closing_an_output_removes_every_output(tmp_path, monkeypatch, capsys,
                                                          failing):
    """The disk fills as one output is closed: no temporary file is left (the rejected
    rows' stayed when --output failed) and no finished file (--output stayed, complete
    looking, when the rejected rows' failed); the summary says the run failed."""
    write(tmp_path, 20_000, 1000)
    real = output.FileSink._finish

    def finish(self):
        if self.what == failing:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(self)
    monkeypatch.setattr(output.FileSink, "_finish", finish)
    out = tmp_path / "out"
    assert cli(tmp_path, "--output", out / "o.parquet", "--summary-json", out / "s.json") == 1
    assert "No space left on device" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["s.json"]
    summary = json.loads((out / "s.json").read_text())
    assert summary["stopped"].startswith("failed: ") and "No space left" in summary["stopped"]


def bad_csv(folder: Path, n: int, null_at: int | None = None) -> None:
    for s in "RS":
        with open(folder / f"{s}.csv", "w") as f:
            f.write("ts,a,x\n")
            for i in range(n):
                ts = "" if s == "S" and i == null_at else f"{i * 0.001:.3f}"
                f.write(f"{ts},{i % 50},{i}\n")


@pytest.mark.parametrize("executor", ["mjoin", "eddy"])
def test_a_failed_run_writes_its_own_summary_json(tmp_path, capsys, executor):
    """The summary of a run that failed mid-way replaces the earlier run's (which said
    "stopped": null and its results, as if this run had succeeded)."""
    out = tmp_path / ("q" if executor == "eddy" else "o.csv")

    def run():
        return main(["run", "--sql", SQL, "--input", f"R={tmp_path / 'R.csv'}", "--input",
                     f"S={tmp_path / 'S.csv'}", "--no-progress", "--executor", executor,
                     "--output", str(out), "--summary-json", str(tmp_path / "s.json")])
    bad_csv(tmp_path, 20_000)
    assert run() == 0
    assert json.loads((tmp_path / "s.json").read_text())["stopped"] is None
    bad_csv(tmp_path, 20_000, null_at=18_000)  # (in the second chunk of S)
    assert run() == 1
    assert "row 18000 has no timestamp" in capsys.readouterr().err
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["stopped"].startswith("failed: InputError: stream S") and \
        "row 18000 has no timestamp" in summary["stopped"]
    assert 0 < summary["rows_processed"]["S"] <= 18_000 and summary["arrivals"] > 0


def test_the_summary_json_is_never_left_partial(tmp_path):
    """A write that fails part-way (a full disk; here a file size limit) left an invalid
    JSON file; now it leaves none (an earlier run's is removed: it is not this run's)."""
    write(tmp_path, 2_000)
    summary = tmp_path / "s.json"
    summary.write_text('{"stopped": null, "results": 12345}')  # an earlier run's
    # Files of at most 200 bytes (SIGXFSZ is ignored by Python: a write fails, EFBIG).
    limited = ("import resource, sys; from adaptcq.cli import main; "
               "resource.setrlimit(resource.RLIMIT_FSIZE, (200, resource.RLIM_INFINITY)); "
               "sys.exit(main(sys.argv[1:]))")
    r = subprocess.run([sys.executable, "-c", limited, "run", "--sql", SQL, "--input",
                        f"R={tmp_path / 'R.parquet'}", "--input",
                        f"S={tmp_path / 'S.parquet'}", "--no-progress", "--summary-json",
                        str(summary)], env=ENV, capture_output=True, text=True, timeout=120,
                       check=False)
    assert r.returncode == 1 and "--summary-json" in r.stderr and "cannot write" in r.stderr
    assert not summary.exists() and temporaries(tmp_path) == []


# ----- 8: where each input stopped ------------------------------------------------------
@pytest.mark.parametrize("executor, options", [("vector", {"batch_rows": 500}),
                                               ("mjoin", {})])
def test_rows_processed_is_the_prefix_processed(executor, options):
    """Late rows read past the stop were counted as processed (and reported rejected)
    though the rows before them were not: a run resumed there would skip rows."""
    t = tables(10_000, 100)
    run = adaptcq.stream(SQL, t, executor=executor, chunk_rows=1000, **options)
    got = []
    for batch in run:
        got.append(batch)
        run.stop()
    s = run.stats
    done = s["rows_processed"]
    assert s["stopped"] == "interrupted" and 0 < done["R"] < s["rows_read"]["R"]
    again = prefix_run(t, done)
    assert rows_of(pa.Table.from_batches(got)) == rows_of(again.table)
    assert run.rejected_table().column("row").to_pylist() == \
        again.rejected.column("row").to_pylist() == late_rows_before(done["R"], 100)
    assert s["rejected"] == again.stats["rejected"]


# ----- 9: input files closed ------------------------------------------------------------
def open_files(folder: Path) -> list[str]:
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(folder)):
            out.append(Path(target).name)
    return out


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="lists /proc/self/fd")
@pytest.mark.parametrize("executor", ["vector", "mjoin"])
def test_a_stream_left_early_closes_its_inputs_and_is_freed(tmp_path, executor):
    """``break`` out of ``adaptcq.stream`` kept the input files open while the run object
    lived (the usual pattern keeps it to read its stats), and the vectorized executor's
    run lived until a garbage collection (a reference cycle through its emit)."""
    write(tmp_path, 20_000)
    src = {s: str(tmp_path / f"{s}.parquet") for s in "RS"}
    gc.disable()
    try:
        run = adaptcq.stream(SQL, src, executor=executor, chunk_rows=1000)
        for _ in run:
            break
        assert run.stats["stopped"] == "closed by its consumer"
        assert open_files(tmp_path) == []
        ref = weakref.ref(run)
        del run, _
        assert ref() is None
    finally:
        gc.enable()


# ----- 10: a KeyboardInterrupt is recorded ----------------------------------------------
@pytest.mark.parametrize("executor", ["vector", "mjoin"])
@pytest.mark.parametrize("where", ["source", "on_rejected"])
def test_a_keyboard_interrupt_is_recorded_where_it_stopped(executor, where):
    """A KeyboardInterrupt (Ctrl-C in the consuming program) raised in a source or in
    on_rejected left stopped None and rows_processed = rows read: a cut run looked
    finished."""
    t = tables(20_000, 1000)

    def rows(stop_at):
        for i, row in enumerate(t["R"].to_pylist()):
            if i == stop_at:
                raise KeyboardInterrupt
            yield row

    def on_rejected(batch):
        if batch.column("row")[0].as_py() >= 5_000:
            raise KeyboardInterrupt
    src = {"R": rows(12_000) if where == "source" else t["R"], "S": t["S"]}
    options = {"batch_rows": 500} if executor == "vector" else {}
    if where == "on_rejected":
        options["on_rejected"] = on_rejected
    run = adaptcq.stream(SQL, src, executor=executor, chunk_rows=1000, **options)
    with pytest.raises(KeyboardInterrupt):
        for _ in run:
            pass
    s = run.stats
    assert s["stopped"] == "interrupted" and run.interrupted
    done = s["rows_processed"]  # (late rows are reported once the rows before them are done)
    assert 0 < done["R"] <= 12_000 if where == "source" else 5_000 < done["R"] < 20_000
    assert s["results"] == prefix_run(t, done).table.num_rows
