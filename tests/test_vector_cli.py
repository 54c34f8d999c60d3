"""The vectorized executor from the command line and the Python API (issue 16): the default
where it can run, the same output as MJoin whatever the batching, the reason it did or did
not run, and options it cannot honour refused with that reason."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import adaptcq
from adaptcq.cli import main
from adaptcq.errors import OptionError

SQL = ("SELECT R.id AS r, S.id AS s, T.id AS t FROM R [RANGE 2 SECONDS], S [ROWS 40], "
       "T [RANGE 3 SECONDS] WHERE R.a = S.a AND S.b = T.b AND T.c <> 1")


@pytest.fixture
def files(tmp_path):
    rng = np.random.default_rng(11)
    n = 1500
    for s in "RST":
        pq.write_table(pa.table({"ts": np.sort(rng.integers(0, 600, n)) / 10.0,
                                 "id": np.arange(n), "a": rng.integers(0, 12, n),
                                 "b": rng.integers(0, 12, n), "c": rng.integers(0, 3, n)}),
                       tmp_path / f"{s}.parquet")
    return tmp_path


def cli(tmp, *extra):
    return main(["run", "--sql", SQL, *(f"--input={s}={tmp / f'{s}.parquet'}" for s in "RST"),
                 "--no-progress", *map(str, extra)])


def rows(path) -> list:
    t = pq.read_table(path)
    return list(zip(*(t.column(c).to_pylist() for c in t.column_names)))


@pytest.mark.parametrize("mode", ["append", "retract"])
def test_batching_never_changes_the_output(files, mode):
    """MJoin's output, row for row and in order of updates (within one update any order),
    for the default batches, batches of 7 arrivals, and batches of 2.5 s of event time."""
    assert cli(files, "--executor", "mjoin", "--mode", mode, "--output",
               files / "m.parquet") == 0
    want = rows(files / "m.parquet")
    assert len(want) > 200
    for extra in ([], ["--batch-rows", "7"], ["--batch-seconds", "2.5"],
                  ["--batch-rows", "100000", "--optimizer", "dmjoin"]):
        out = files / "v.parquet"
        assert cli(files, "--mode", mode, "--output", out, "--summary-json",
                   files / "s.json", *extra) == 0
        got = rows(out)
        assert Counter(got) == Counter(want)
        # in order of updates: the (_ts, _sign) sequence is the same
        assert [r[-2:] for r in got] == [r[-2:] for r in want]
        summary = json.loads((files / "s.json").read_text())
        assert summary["executor"] == "vector"
        assert summary["executor_reason"].startswith("auto")


def test_auto_falls_back_to_mjoin_and_says_why(files, capsys):
    assert cli(files, "--reorder", "agreedy", "--summary-json", files / "s.json") == 0
    summary = json.loads((files / "s.json").read_text())
    assert summary["executor"] == "mjoin"
    assert "act between two tuples" in summary["executor_reason"]
    out = capsys.readouterr().out
    assert "not vectorized because" in out


@pytest.mark.parametrize(("flags", "message"), [
    (["--executor", "vector", "--reorder", "agreedy"], "act between two tuples"),
    (["--executor", "vector", "--nested-loop", "S"], "--nested-loop is for"),
    (["--executor", "mjoin", "--batch-rows", "10"], "are for the vectorized executor"),
    (["--executor", "vector", "--batch-rows", "0"], "--batch-rows must be a positive"),
    (["--executor", "vector", "--batch-seconds", "-1"], "--batch-seconds must be a positive"),
    (["--executor", "vector", "--order", "X:S,T"], "no stream X"),
])
def test_what_the_vectorized_executor_cannot_honour_is_refused(files, capsys, flags, message):
    assert cli(files, *flags) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_python_api_default_and_refusals(files):
    srcs = {s: str(files / f"{s}.parquet") for s in "RST"}
    res = adaptcq.run(SQL, srcs, mode="retract")
    assert res.stats["executor"] == "vector" and res.stats["batches"] >= 1
    assert sum(res.stats["orders_used"]["R"].values()) == res.stats["batches"]
    ref = adaptcq.run(SQL, srcs, mode="retract", executor="mjoin")
    assert Counter(tuple(r.values()) for r in res.table.to_pylist()) == \
        Counter(tuple(r.values()) for r in ref.table.to_pylist())
    assert res.table.schema == ref.table.schema
    two = {s: srcs[s] for s in "RS"}
    with pytest.raises(OptionError, match="outputs columns only"):
        adaptcq.run("SELECT R.id + 1 AS x FROM R, S WHERE R.a = S.a", two, executor="vector")
    fallback = adaptcq.run("SELECT R.id + 1 AS x FROM R, S WHERE R.a = S.a", two)
    assert fallback.stats["executor"] == "mjoin"
    assert "expression" in fallback.stats["executor_reason"]
    with pytest.raises(OptionError, match="ordering"):
        adaptcq.run(SQL, srcs, executor="mjoin", ordering="fgreedy")


def test_explain_shows_the_plan_and_the_measured_orders(files, capsys):
    inputs = [f"--input={s}={files / f'{s}.parquet'}" for s in "RST"]
    assert main(["explain", "--executor", "vector", "--sql", SQL, *inputs,
                 "--prefix", "3000", "--batch-rows", "500", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report["orders"]) == {"R", "S", "T"}
    assert "band join on a = R.a" in report["plan"]
    assert sum(report["orders_used"]["S"].values()) >= 5
    assert report["selectivities"]
    assert main(["explain", "--executor", "vector", "--sql", SQL, "--code"]) == 1
