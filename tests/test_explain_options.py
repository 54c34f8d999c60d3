"""``adaptcq explain``: its options and its statistics file, checked before any work (a
tester's findings). A statistics file that is a folder, unreadable or not JSON is one line
naming it; a reader closing stdout ends explain quietly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from adaptcq.cli import main

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


