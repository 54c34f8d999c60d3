"""The command line's outputs and how a run ends: the vectorized executor's summary when
--max-results stops it, CSV output that adaptcq reads back as it was (floats stay floats),
Ctrl-C / SIGTERM from the command's start, output paths taken as written (``~`` as the
inputs take it), and a refused run leaving no folder behind."""

from __future__ import annotations

import io
import json
import math
import os
import signal
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from tests.conftest import examples

import adaptcq
from adaptcq import cli
from adaptcq.cli import main
from adaptcq.runtime import output
from adaptcq.stream.sources import open_source

JOIN = "SELECT R.id AS rid, S.id AS sid FROM R, S WHERE R.a = S.a"


def _pair(n: int) -> dict[str, pa.Table]:
    """R and S: n rows each at times 0..n-1, five join keys."""
    t = pa.table({"ts": [float(i) for i in range(n)], "id": list(range(n)),
                  "a": [i % 5 for i in range(n)]})
    return {"R": t, "S": t}


@pytest.fixture
def inputs(tmp_path):
    for name, t in _pair(40).items():
        pq.write_table(t, tmp_path / f"{name.lower()}.parquet")
    return ["run", "--no-progress", "--input", f"R={tmp_path / 'r.parquet'}",
            "--input", f"S={tmp_path / 's.parquet'}"]


# ----- 02. --max-results on the vectorized executor: the batch it stopped in is counted ---

@settings(max_examples=examples(20), deadline=None)
@given(n=st.integers(1, 60), batch_rows=st.integers(1, 50), limit=st.integers(1, 40))
def test_vector_max_results_counts_the_batch_it_stopped_in(n, batch_rows, limit):
    """The batch in which --max-results is reached is processed whole (README): it is
    counted in ``batches`` and its last arrival is ``last_event_time``, as for any batch."""
    r = adaptcq.run(JOIN, _pair(n), timestamp="ts", executor="vector",
                    max_results=limit, batch_rows=batch_rows)
    s = r.stats
    done = sum(s["rows_processed"].values())  # arrivals processed, in whole batches
    assert s["batches"] == -(-done // batch_rows)
    # R's and S's arrivals alternate at the same times: arrival k is at time k // 2.
    assert s["last_event_time"] == ((done - 1) // 2 if done else None)
    if s["stopped"] is not None:
        assert s["results"] == limit and s["batches"] >= 1


def test_vector_max_results_summary_json(tmp_path, inputs, capsys):
    summary = tmp_path / "s.json"
    assert main([*inputs, "--sql", JOIN, "--executor", "vector", "--max-results", "10",
                 "--summary-json", str(summary)]) == 1  # (stopped: the output holds 10)
    assert "--max-results 10 reached" in capsys.readouterr().err
    doc = json.loads(summary.read_text())
    assert doc["results"] == 10 and doc["batches"] == 1
    assert doc["last_event_time"] == 39.0  # the whole (single) batch was processed


# ----- 04. CSV output reads back as it was: a whole float keeps its decimal point ---------

FLOATS = st.floats(allow_nan=True, allow_infinity=True) | st.integers(-10**6, 10**6).map(float)


def _csv_text(table: pa.Table) -> str:
    buf = io.BytesIO()
    w = output.CsvWriter(buf, table.schema)
    for b in table.to_batches(max_chunksize=7):
        w.write_batch(b)
    return buf.getvalue().decode()


def _bits(x: float | None):
    """The double's bits (-0.0 is not 0.0); every NaN alike (CSV has one ``nan``)."""
    if x is None or math.isnan(x):
        return x if x is None else "nan"
    return struct.pack("<d", x)


@settings(max_examples=examples(60), deadline=None)
@given(values=st.lists(st.none() | FLOATS, min_size=1, max_size=30))
def test_csv_floats_read_back_as_the_same_doubles(tmp_path_factory, values):
    """Every float64 written to CSV (whole, -0.0, NaN, infinite, subnormal) reads back,
    through adaptcq's CSV input, as a float64 column holding the very same double. (A
    column with no value at all reads back as text, as README says.)"""
    assume(any(v is not None for v in values))
    folder = tmp_path_factory.mktemp("csv")
    path = folder / "o.csv"
    table = pa.table({"ts": pa.array([float(i) for i in range(len(values))]),
                      "f": pa.array(values, pa.float64())})
    sink = output.FileSink(str(path), table.schema, "csv")
    for b in table.to_batches(max_chunksize=5):
        sink.write(b)
    sink.close()
    src = open_source("R", str(path), "ts", None)
    try:
        back = pa.Table.from_batches(list(src.chunks()))
    finally:
        src.close()
    assert back.schema.field("f").type == pa.float64(), path.read_text()
    got = back.column("f").to_pylist()
    assert [_bits(v) for v in got] == [_bits(v) for v in values], path.read_text()


def test_csv_whole_floats_have_a_decimal_point():
    text = _csv_text(pa.table({"f": pa.array([2.0, -0.0, 1e20, 0.5, math.nan, None]),
                               "g": pa.array([3.0, 1.5, None, 0.0, 1.0, 2.0], pa.float32()),
                               "i": [1, 2, 3, 4, 5, 6]}))
    assert text.splitlines() == ['"f","g","i"', "2.0,3.0,1", "-0.0,1.5,2", "1e+20,,3",
                                 "0.5,0.0,4", "nan,1.0,5", ",2.0,6"]


TEXT = st.text(alphabet=st.sampled_from(['a', '"', ",", "\n", "\r", "é", " ", "x"]),
               max_size=6)


@settings(max_examples=examples(40), deadline=None)
@given(rows=st.lists(st.tuples(st.none() | TEXT, st.none() | st.integers(-2**63, 2**63 - 1),
                               st.none() | st.booleans()), min_size=1, max_size=20))
def test_csv_writer_writes_other_columns_as_pyarrow_does(rows):
    """Every column but a float one is written exactly as pyarrow's CSV writer writes it
    (the header too): quotes doubled, "" an empty string, an empty field NULL."""
    s, i, b = zip(*rows, strict=True)
    table = pa.table({"s": pa.array(s, pa.string()), "i": pa.array(i, pa.int64()),
                      'b "q"': pa.array(b, pa.bool_()),
                      "d": pa.array(s, pa.large_string()).dictionary_encode(),
                      "t": pa.array(i, pa.int64()).cast(pa.timestamp("ns", "UTC"))})
    buf = io.BytesIO()
    pacsv.write_csv(table, buf)
    assert _csv_text(table) == buf.getvalue().decode()


def test_cli_reads_its_own_csv_output_back(tmp_path, capsys):
    """Run 1 writes CSV whose float column is all whole numbers; run 2 reads it as an
    input: the column is float64 (it came back as int64)."""
    pq.write_table(pa.table({"ts": [1.0, 2.0, 3.0], "a": [1, 1, 1], "f": [2.0, 3.0, -0.0]}),
                   tmp_path / "r.parquet")
    pq.write_table(pa.table({"ts": [0.0], "a": [1]}), tmp_path / "s.parquet")
    first = tmp_path / "o.csv"
    assert main(["run", "--no-progress", "--sql",
                 "SELECT R.ts AS ts, R.a AS a, R.f AS f FROM R, S WHERE R.a = S.a",
                 "--input", f"R={tmp_path / 'r.parquet'}", "--input",
                 f"S={tmp_path / 's.parquet'}", "--output", str(first)]) == 0
    second = tmp_path / "o2.parquet"
    assert main(["run", "--no-progress", "--sql", "SELECT R.f FROM R, S WHERE R.a = S.a",
                 "--input", f"R={first}", "--input", f"S={tmp_path / 's.parquet'}",
                 "--output", str(second)]) == 0, capsys.readouterr().err
    t = pq.read_table(second)
    assert t.schema.field("f").type == pa.float64()
    assert [_bits(v) for v in t.column("f").to_pylist()] == [_bits(v) for v in
                                                               (2.0, 3.0, -0.0)]


# ----- 05. Ctrl-C and SIGTERM from the command's start ------------------------------------

@pytest.mark.parametrize("sig, code, name", [(signal.SIGINT, 130, "Ctrl-C"),
                                             (signal.SIGTERM, 143, "SIGTERM")])
def test_signal_before_any_run_exits_with_one_line(monkeypatch, capsys, sig, code, name):
    """A signal in a command that does not take signals over (here `workload`, while it
    starts): one line, exit 128 + the signal's number, no traceback."""
    def interrupted(args):
        os.kill(os.getpid(), sig)
        time.sleep(5)  # (the handler raises before this ends)
        raise AssertionError("the signal was not handled")
    monkeypatch.setattr(cli, "cmd_workload", interrupted)
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    assert main(["workload", "nway", "--out", "x"]) == code
    assert capsys.readouterr().err == f"adaptcq: stopped by {name}\n"
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def test_signal_while_checking_leaves_no_folder(tmp_path, inputs, monkeypatch, capsys):
    """Ctrl-C while the run is set up (after its output checks made the folder): stopped,
    exit 130, and the folder made for the output is gone."""
    from adaptcq.runtime import local

    def interrupted(*a, **k):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
        raise AssertionError("the signal was not handled")
    monkeypatch.setattr(local, "LocalRun", interrupted)
    assert main([*inputs, "--sql", JOIN, "--output", str(tmp_path / "new" / "deep" / "o.csv"),
                 "--summary-json", str(tmp_path / "new2" / "s.json")]) == 130
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.parquet", "s.parquet"]


def test_signal_while_the_command_module_is_imported(tmp_path):
    """In the `adaptcq` command, a signal while adaptcq.cli is still being imported (before
    main() runs) exits 130 with one line, not a KeyboardInterrupt traceback."""
    script = tmp_path / "adaptcq"  # (the entry point's name: the early handler is for it)
    script.write_text(textwrap.dedent("""
        import os, signal, time
        import adaptcq.cli
        os.kill(os.getpid(), signal.SIGINT)  # as if during the imports that follow
        time.sleep(5)
        raise SystemExit(3)
    """))
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=False,
                       env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"), timeout=60)
    assert (p.returncode, p.stderr) == (130, "adaptcq: stopped by Ctrl-C\n")


def test_the_early_handler_is_only_for_the_command():
    """A program that imports adaptcq.cli keeps its own Ctrl-C handling."""
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    assert cli._stop_while_starting() is False
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


# ----- 07. '~' in an output path: taken as written, as the inputs take it ------------------

@pytest.mark.parametrize("flag, name", [("--summary-json", "s.json"), ("--output", "o.csv"),
                                        ("--rejected", "rej.csv")])
def test_unexpanded_tilde_is_refused_before_any_work(tmp_path, inputs, monkeypatch, capsys,
                                                     flag, name):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    assert main([*inputs, "--sql", JOIN, f"{flag}=~/{name}"]) == 1
    out, err = capsys.readouterr()
    assert f"{flag} '~/{name}': there is no folder '~' here" in err
    assert "run summary" not in out  # (refused before any work)
    assert list(home.iterdir()) == [] and not (tmp_path / "~").exists()


@pytest.mark.parametrize("flag, name", [("--summary-json", "s.json"), ("--output", "o.csv"),
                                        ("--rejected", "rej.csv")])
def test_tilde_folder_that_exists_is_checked_and_written_alike(tmp_path, inputs, monkeypatch,
                                                               capsys, flag, name):
    """A folder named '~' here is a folder like any other: the check and the writer both
    take the path as written (the check expanded '~', the writer did not)."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "~").mkdir()
    assert main([*inputs, "--sql", JOIN, f"{flag}=~/{name}"]) == 0, capsys.readouterr().err
    assert (tmp_path / "~" / name).is_file() and list(home.iterdir()) == []


def test_output_paths_are_not_expanded(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "~").mkdir()
    # "~/x" here is ./~/x, not $HOME/x: no overlap with the input $HOME/x
    assert not output.overlaps("~/x", tmp_path / "x")
    assert output.check_output_path("~/o.csv", [tmp_path / "o.csv"]) == Path("~/o.csv")


# ----- 08. a refused run leaves every file alone: no folder made for its outputs ----------

@pytest.mark.parametrize("why, extra, sql", [
    ("unknown column", [], "SELECT R.nosuch FROM R, S WHERE R.a = S.a"),
    ("missing input", ["--input", "T=/nonexistent/t.parquet"],
     "SELECT R.id FROM R, S, T WHERE R.a = S.a AND S.a = T.a"),
    ("refused option", ["--executor", "mjoin", "--batch-rows", "5"], JOIN),
])
@pytest.mark.parametrize("flag", ["--output", "--rejected", "--summary-json"])
def test_refused_run_leaves_no_folder(tmp_path, inputs, capsys, why, extra, sql, flag):
    name = {"--output": "o.csv", "--rejected": "r.csv", "--summary-json": "s.json"}[flag]
    assert main([*inputs, *extra, "--sql", sql, flag,
                 str(tmp_path / "new" / "deeper" / name)]) == 1
    assert "adaptcq: error:" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.parquet", "s.parquet"]


def test_a_successful_run_keeps_its_folders(tmp_path, inputs, capsys):
    out = tmp_path / "new" / "deeper" / "o.csv"
    assert main([*inputs, "--sql", JOIN, "--output", str(out)]) == 0
    assert out.is_file()
    assert output.MADE_FOLDERS == []  # (forgotten: kept)


def test_remove_made_folders_keeps_a_folder_written_to(tmp_path):
    output.make_folder(tmp_path / "a" / "b")
    (tmp_path / "a" / "kept.txt").write_text("x")
    output.remove_made_folders()
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["kept.txt"]
    assert output.MADE_FOLDERS == []
