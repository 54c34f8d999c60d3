"""``adaptcq explain``: its options and its statistics file, checked before any work (a
tester's findings). A statistics file that is a folder, unreadable or not JSON is one line
naming it; a reader closing stdout ends explain quietly; an option or combination that
changes nothing in the report is refused with the reason, never ignored. No test here
starts Spark (``--engine spark --partitions P`` only plans the split)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from adaptcq.cli import main
from adaptcq.explain import add_arguments

SQL = ("SELECT R.id AS rid, S.id AS sid, T.id AS tid FROM R [RANGE 1 SECONDS], "
       "S [RANGE 1 SECONDS], T [RANGE 1 SECONDS] WHERE R.a = S.a AND S.b = T.b")
GOOD = {"rates": {"R": 1, "S": 2, "T": 3}, "selectivities": {"R,S": 0.1, "S,T": 0.2},
        "window": 1}


@pytest.fixture(scope="module")
def w(tmp_path_factory):
    """The §7.2 three-way workload (600 updates) and a valid statistics file."""
    from adaptcq.stream.workloads import three_way, write_workload
    d = tmp_path_factory.mktemp("w")
    write_workload(three_way(n_updates=600, seed=1), d)
    (d / "stats.json").write_text(json.dumps(GOOD))
    return d


def inputs(w) -> list[str]:
    return [x for s in "RST" for x in ("--input", f"{s}={w / f'{s}.parquet'}")]


def explain(capsys, *argv) -> tuple[int, str, str]:
    code = main(["explain", "--sql", SQL, *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def one_error(capsys, *argv) -> str:
    code, _, err = explain(capsys, *argv)
    assert code == 1, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("adaptcq: error: "), err
    return lines[0]


# ----- 1. the statistics file ---------------------------------------------------------------------
@pytest.mark.parametrize("split", [[], ["--engine", "spark", "--partitions", "4"]])
def test_a_statistics_folder_is_one_line_naming_it(w, capsys, split):
    """A folder (was IsADirectoryError), in the optimizer's report and in the split."""
    msg = one_error(capsys, "--stats", str(w), *split)
    assert f"statistics file {str(w)!r} is a folder" in msg


@pytest.mark.parametrize("split", [[], ["--engine", "spark", "--partitions", "4"]])
@pytest.mark.parametrize(("content", "message"), [
    (b"\xff\xfe{", "is not UTF-8 text"),
    (b'{"rates": {"R": NaN}}', "is not valid JSON: NaN is not a JSON number"),
    (b'{"rates": ', "is not valid JSON: Expecting value"),
])
def test_an_invalid_statistics_file_is_one_line_naming_it(tmp_path, capsys, split, content,
                                                          message):
    path = tmp_path / "s.json"
    path.write_bytes(content)
    msg = one_error(capsys, "--stats", str(path), *split)
    assert f"statistics file {str(path)!r} {message}" in msg


def test_an_unreadable_statistics_file_is_one_line_naming_it(tmp_path, capsys, monkeypatch):
    path = tmp_path / "s.json"
    path.write_text(json.dumps(GOOD))

    def denied(self, *a, **k):
        raise PermissionError(13, "Permission denied", str(self))
    monkeypatch.setattr(Path, "read_text", denied)  # (chmod 000 does not stop root)
    for split in ([], ["--engine", "spark", "--partitions", "4"]):
        msg = one_error(capsys, "--stats", str(path), *split)
        assert f"cannot read statistics file {str(path)!r}: Permission denied" in msg


# ----- 2. stdout closed by its reader -------------------------------------------------------------
@pytest.mark.parametrize("argv", [
    ["--stats", "STATS", "--json"],                  # print(json.dumps(report))
    ["--stats", "STATS"],                            # rich tables
    ["--code", "--json"],
    ["--code"],
    ["--engine", "spark", "--partitions", "4"],      # rich, the split (no Spark session)
])
def test_a_closed_stdout_ends_explain_quietly(w, argv):
    """``adaptcq explain ... | head -c 10``: a BrokenPipeError traceback (rich: exit 1)
    before; now exit 0 and nothing on stderr, as ``adaptcq run --output - | head``."""
    argv = [str(w / "stats.json") if a == "STATS" else a for a in argv]
    read, write = os.pipe()
    os.close(read)  # no reader: the first write fails with EPIPE, whenever it comes
    try:
        done = subprocess.run(
            [sys.executable, "-c", "from adaptcq.cli import main; raise SystemExit(main())",
             "explain", "--sql", SQL, *argv],
            stdout=write, stderr=subprocess.PIPE, timeout=120, check=False)
    finally:
        os.close(write)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stderr == b""


# ----- 3. options that change nothing are refused -------------------------------------------------
REFUSED = [
    # (argv with W for the workload folder, STATS for its statistics file, INPUTS, flag)
    (["--stats", "STATS", "--prefix", "10"], "--prefix"),
    (["--stats", "STATS", "--timestamp", "ts"], "--timestamp"),
    (["--code", "--prefix", "10"], "--prefix"),
    (["--code", "--timestamp", "ts"], "--timestamp"),
    (["--engine", "spark", "--partitions", "4", "--prefix", "10"], "--prefix"),
    (["--engine", "spark", "--partitions", "4", "--timestamp", "ts"], "--timestamp"),
    (["--engine", "spark", "--partitions", "4", "INPUTS", "--prefix", "10"], "--prefix"),
    (["--engine", "spark", "--partitions", "4", "--stats", "STATS", "--timestamp", "ts"],
     "--timestamp"),
    (["--stats", "STATS", "--routing", "lottery"], "--routing"),
    (["INPUTS", "--routing", "lottery"], "--routing"),
    (["--code", "--routing", "lottery"], "--routing"),
    (["--engine", "spark", "--partitions", "4", "--routing", "lottery"], "--routing"),
    (["--executor", "vector", "--routing", "lottery"], "--routing"),
    (["--executor", "shed", "--routing", "lottery"], "--routing"),
    (["--code", "--caches", "prefix"], "--caches"),
    (["--stats", "STATS", "--engine", "spark", "--partitions", "4", "--caches", "prefix"],
     "--caches"),
    (["--engine", "spark", "--partitions", "4", "--mode", "retract"], "--mode"),
    (["--engine", "spark", "--partitions", "4", "--executor", "mjoin"], "--executor"),
    (["--engine", "spark", "--partitions", "4", "--order", "R:T,S"], "--order"),
    (["--executor", "eddy", "INPUTS", "--stats", "STATS"], "--stats"),
    (["--executor", "eddy", "INPUTS", "--order", "R:T,S"], "--order"),
    (["--executor", "eddy", "INPUTS", "--nested-loop", "S"], "--nested-loop"),
    (["--executor", "eddy", "INPUTS", "--caches", "prefix"], "--caches"),
    (["--executor", "eddy", "INPUTS", "--shares", "S.b=2"], "--shares"),
    (["--executor", "eddy", "INPUTS", "--engine", "spark", "--partitions", "2"], "--engine"),
    (["--executor", "eddy", "INPUTS", "--batch-rows", "10"], "--batch-rows"),
    (["--executor", "shed", "--order", "R:T,S"], "--order"),
    (["--executor", "shed", "--prefix", "10"], "--prefix"),
    (["--executor", "shed", "--timestamp", "ts"], "--timestamp"),
    (["--executor", "vector", "--engine", "spark"], "--engine"),
    (["--executor", "vector", "--batch-rows", "10"], "--batch-rows"),
    (["--executor", "vector", "--prefix", "10"], "--prefix"),
]


def _argv(w, argv: list[str]) -> list[str]:
    out = []
    for a in argv:
        out += (inputs(w) if a == "INPUTS" else [str(w / "stats.json")] if a == "STATS"
                else [a])
    return out


@pytest.mark.parametrize(("argv", "flag"), REFUSED, ids=[" ".join(a) for a, _ in REFUSED])
def test_an_option_without_effect_is_refused_naming_it(w, capsys, argv, flag):
    """Each of these printed the same report with and without ``flag``."""
    msg = one_error(capsys, *_argv(w, argv))
    assert msg.startswith(f"adaptcq: error: {flag}") and "no effect on" in msg, msg
    assert msg.split(": ", 3)[-1].strip(), msg  # and a reason


def test_several_options_without_effect_are_named_together(w, capsys):
    msg = one_error(capsys, *_argv(w, ["--executor", "eddy", "INPUTS", "--order", "R:T,S",
                                       "--stats", "STATS"]))
    assert "--stats" in msg and "--order" in msg and "have no effect" in msg


def test_stats_and_input_together_are_refused_by_the_split_too(w, capsys):
    """The split took the rates of --stats and ignored --input."""
    msg = one_error(capsys, *_argv(w, ["--engine", "spark", "--partitions", "4",
                                       "--stats", "STATS", "INPUTS"]))
    assert "not both" in msg


@pytest.mark.parametrize("argv", [
    ["--stats", "STATS", "--code", "--order", "R:T,S", "--mode", "retract",
     "--executor", "acaching", "--engine", "local", "--json"],
    ["INPUTS", "--prefix", "300", "--timestamp", "ts", "--caches", "prefix", "--code",
     "--nested-loop", "S", "--json"],
    ["--code", "--order", "R:T,S", "--nested-loop", "S", "--engine", "local"],
    ["--executor", "eddy", "INPUTS", "--routing", "lottery", "--prefix", "200", "--code",
     "--mode", "retract", "--timestamp", "ts", "--engine", "local", "--json"],
    ["--executor", "vector", "INPUTS", "--batch-rows", "50", "--prefix", "300",
     "--order", "R:T,S", "--mode", "retract", "--timestamp", "ts", "--json"],
    ["--executor", "vector", "--order", "R:T,S", "--engine", "local"],
    ["--executor", "shed", "--mode", "append", "--engine", "local"],
    ["--engine", "spark", "--partitions", "4", "--stats", "STATS", "--json"],
    ["--engine", "spark", "--partitions", "4", "INPUTS", "--timestamp", "ts", "--json"],
    ["--engine", "spark", "--shares", "S.b=2"],
])
def test_the_options_each_report_uses_are_accepted(w, capsys, argv):
    code, _, err = explain(capsys, *_argv(w, argv))
    assert code == 0, err


def test_every_option_has_its_place_in_the_table():
    """A new option must say which reports use it (``_uses``), or it would be refused or
    ignored by accident."""
    from adaptcq.explain import _OPTIONS
    p = argparse.ArgumentParser()
    add_arguments(p)
    dests = {a.dest for a in p._actions} - {"help", "sql", "json"}
    assert dests == set(_OPTIONS)


