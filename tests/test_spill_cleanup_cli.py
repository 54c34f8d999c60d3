"""`adaptcq cleanup DIR` and the spill folder of a local run (docs/spill.md, "Clean-up"):
an output inside the folder is refused before anything is touched; the folder is emptied
only once the late results are written; the report goes to stderr; ``complete_until`` is
an exclusive bound; a damaged manifest is refused in one line naming it; a refused run
removes the spill folder it made (and only that)."""

from __future__ import annotations

import errno
import hashlib
import json
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from tests.conftest import examples

import adaptcq
from adaptcq.cli import main
from adaptcq.errors import AdaptcqError
from adaptcq.runtime import output as output_mod
from adaptcq.runtime.local import prepare
from adaptcq.runtime.spill import cleanup_folder
from adaptcq.state import spill_store
from adaptcq.state.spill_store import SpillError
from oracle import Oracle

SQL = "SELECT A.id AS a, B.id AS b FROM A, B WHERE A.k = B.k"
SPILL = {"strategy": "global-penalty", "memory": "10kB", "partitions": 20, "every": 20,
         "cleanup": "off"}


def tables(seed: int = 1, n: int = 200, keys: int = 20) -> dict[str, pa.Table]:
    rng = np.random.default_rng(seed)
    return {s: pa.table({"ts": np.sort(rng.integers(0, 2000, n)) / 10.0,
                         "id": np.arange(n), "k": rng.integers(0, keys, n)}) for s in "AB"}


def rows(t: pa.Table) -> Counter:
    return Counter(zip(*(t.column(c).to_pylist() for c in ("a", "b", "_sign", "_ts")),
                       strict=True))


def oracle_rows(sources) -> Counter:
    """The oracle's output (a fresh Counter): computed once per distinct input, since the
    brute-force oracle takes seconds on these unbounded windows and most tests share one."""
    key = tuple((name, tuple(map(tuple, t.to_pydict().values())))
                for name, t in sorted(sources.items()))
    if key not in _ORACLE:
        _ORACLE[key] = _oracle_rows(sources)
    return Counter(_ORACLE[key])


_ORACLE: dict = {}


def _oracle_rows(sources) -> Counter:
    p = prepare(SQL, sources, "ts")
    _, outs = Oracle(p.query, "append", 1e-9).run(p.streams.tolist(), None,
                                                  p.timestamps.tolist(), p.rows)
    total: Counter = Counter()
    for c in outs:
        for (*vals, sign, ts), n in c.items():
            total[(*vals, sign, ts / 1e9)] += n
    return total


def left_on_disk(tmp: Path, sources=None, **spill) -> tuple:
    """A run with --cleanup off: its output and its spill folder."""
    sources = sources or tables()
    folder = tmp / "sp"
    run = adaptcq.run(SQL, sources, spill={**SPILL, **spill, "directory": str(folder)})
    assert run.stats["spills"] > 0
    return run, folder


def snapshot(folder: Path) -> dict[str, str]:
    """Every file of the folder by its SHA-256."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir()}


def spill_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("spill-"))


# ----- 1. an output inside the spill folder ---------------------------------------------

@pytest.mark.parametrize("where", ["spill-000002.arrow", "manifest.json", ".", "late.parquet",
                                   "../sp/late.csv"])
def test_an_output_inside_the_spill_folder_is_refused_before_anything_is_touched(
        tmp_path, capsys, where):
    run, folder = left_on_disk(tmp_path)
    before = snapshot(folder)
    out = str(folder / where)
    assert main(["cleanup", str(folder), "--output", out, "--format", "parquet"]) == 1
    err = capsys.readouterr().err
    assert f"--output {out!r} is inside the spill folder {str(folder)!r}" in err
    assert "give a place outside it" in err
    assert snapshot(folder) == before
    # and the late results can still be produced, all of them
    assert main(["cleanup", str(folder), "--output", str(tmp_path / "late.parquet")]) == 0
    late = rows(pq.read_table(tmp_path / "late.parquet"))
    assert rows(run.table) + late == oracle_rows(tables())
    assert sum(late.values()) > 0


def test_a_link_into_the_spill_folder_is_refused_too(tmp_path, capsys):
    _, folder = left_on_disk(tmp_path)
    link = tmp_path / "link"
    link.symlink_to(folder)
    before = snapshot(folder)
    assert main(["cleanup", str(folder), "--output", str(link / spill_files(folder)[0])]) == 1
    assert "is inside the spill folder" in capsys.readouterr().err
    assert snapshot(folder) == before


# ----- 2. the folder is emptied only once the output is written -------------------------

def _full_disk(*_):
    raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("fmt, fails", [("parquet", "_finish"), ("jsonl", "_write"),
                                        ("csv", "_finish")])
def test_a_failed_write_leaves_the_spill_folder_whole_for_a_retry(tmp_path, capsys,
                                                                  monkeypatch, fmt, fails):
    run, folder = left_on_disk(tmp_path)
    before = snapshot(folder)
    late_path = str(tmp_path / f"late.{fmt}")
    with monkeypatch.context() as m:
        m.setattr(output_mod.FileSink, fails, _full_disk)
        assert main(["cleanup", str(folder), "--output", late_path]) == 1
    err = capsys.readouterr().err
    assert "No space left on device" in err and "--output" in err
    assert snapshot(folder) == before
    assert not Path(late_path).exists()
    # the retry produces every late result, and then empties the folder
    assert main(["cleanup", str(folder), "--output", str(tmp_path / "late.parquet")]) == 0
    late = rows(pq.read_table(tmp_path / "late.parquet"))
    assert rows(run.table) + late == oracle_rows(tables())
    assert spill_files(folder) == []
    assert json.loads((folder / "manifest.json").read_text())["events"] == []


def test_a_folder_that_cannot_be_emptied_after_the_write_says_the_results_are_out(
        tmp_path, monkeypatch):
    run, folder = left_on_disk(tmp_path)
    out = tmp_path / "late.parquet"
    monkeypatch.setattr(spill_store, "_write_file", _full_disk)  # (the manifest's rewrite)
    with pytest.raises(SpillError) as e:
        cleanup_folder(str(folder), str(out))
    late = rows(pq.read_table(out))
    n = sum(late.values())
    assert f"the {n:,} late results were written to {out}" in str(e.value)
    assert "adaptcq cleanup on it again would write them again" in str(e.value)
    assert rows(run.table) + late == oracle_rows(tables())


# ----- 3. the report goes to stderr -------------------------------------------------------

@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_cleanup_to_stdout_leaves_stdout_to_the_results(tmp_path, capsys, fmt):
    run, folder = left_on_disk(tmp_path)
    assert main(["cleanup", str(folder), "--output", "-", "--format", fmt]) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    if fmt == "jsonl":
        got = Counter((r["a"], r["b"], r["_sign"], r["_ts"]) for r in map(json.loads, lines))
    else:
        assert lines[0].split(",")[:2] == ['"a"', '"b"']
        got = Counter(tuple(ln.split(",")[:2]) for ln in lines[1:])
    n = sum(got.values())
    assert n == sum((oracle_rows(tables()) - rows(run.table)).values()) > 0
    if fmt == "jsonl":
        assert rows(run.table) + got == oracle_rows(tables())
    assert f"wrote {n:,} late results to -" in captured.err
    assert "wrote" not in captured.out


# ----- 4. complete_until is exclusive ---------------------------------------------------

def _complete_until_holds(tmp: Path, sources, spill: dict) -> tuple:
    run = adaptcq.run(SQL, sources, spill={**spill, "directory": str(tmp / "sp")})
    cu = run.stats["complete_until"]
    cleanup_folder(str(tmp / "sp"), str(tmp / "late.parquet"))
    late = pq.read_table(tmp / "late.parquet")["_ts"].to_pylist()
    assert rows(run.table) + rows(pq.read_table(tmp / "late.parquet")) == oracle_rows(sources)
    # Every result with _ts < complete_until was in the run's own output.
    assert all(t >= cu for t in late), (cu, min(late))
    return cu, late


def test_complete_until_is_exclusive_a_result_at_that_time_can_come_late(tmp_path):
    n = 200
    rng = np.random.default_rng(0)
    sources = {s: pa.table({"ts": [float(i // 20) for i in range(n)],  # 20 rows a second
                            "id": [off + i for i in range(n)],
                            "k": rng.integers(0, 15, n)}) for s, off in (("A", 0), ("B", 10000))}
    cu, late = _complete_until_holds(tmp_path, sources, {
        "strategy": "bottom-up", "memory": "12kB", "partitions": 15, "every": 1,
        "cleanup": "off", "seed": 0})
    assert cu in late  # so the bound could not be read as inclusive


@settings(max_examples=examples(12))
@given(seed=st.integers(0, 10**6), n=st.integers(40, 120), keys=st.integers(4, 25),
       strategy=st.sampled_from(["bottom-up", "global-output", "global-penalty"]),
       memory=st.sampled_from(["4kB", "8kB", "16kB"]), every=st.sampled_from([1, 7, 40]))
def test_every_late_result_is_at_or_after_complete_until(tmp_path_factory, seed, n, keys,
                                                        strategy, memory, every):
    tmp = tmp_path_factory.mktemp("cu")
    rng = np.random.default_rng(seed)
    sources = {s: pa.table({"ts": np.sort(rng.integers(0, n // 4 + 1, n)).astype(float),
                            "id": np.arange(n), "k": rng.integers(0, keys, n)})
               for s in "AB"}
    try:
        cu, late = _complete_until_holds(tmp, sources, {
            "strategy": strategy, "memory": memory, "partitions": 8, "every": every,
            "cleanup": "off"})
        event(f"late results: {bool(late)}, one at complete_until: {cu in late}")
    except AdaptcqError as e:  # a budget under one partition group: refused, not wrong
        assert "smaller than one partition group" in str(e)
        assert not (tmp / "sp").exists()  # (and its folder removed)
        event("refused")


# ----- 5. a damaged manifest ---------------------------------------------------------------

def _pop(*keys):
    def damage(m):
        d = m
        for k in keys[:-1]:
            d = d[k]
        d.pop(keys[-1])
    return damage


def _set(value, *keys):
    def damage(m):
        d = m
        for k in keys[:-1]:
            d = d[k]
        d[keys[-1]] = value
    return damage


@pytest.mark.parametrize("damage, words", [
    (_pop("events", 0, "sha256"), "event 1 (spill-000001.arrow) has no SHA-256"),
    (_set("xyz", "events", 0, "sha256"), "event 1 (spill-000001.arrow) has no SHA-256"),
    (_pop("events"), "it has no 'events'"),
    (_set({}, "events"), "has 'events' of type dict, not a list"),
    (_set([5], "events"), "event 1 is int, not an object"),
    (_pop("events", 0, "file"), "event 1 names no spill file (its 'file' is None"),
    (_set("../x.arrow", "events", 0, "file"), "names no spill file (its 'file' is '../x.arrow'"),
    (_pop("events", 0, "bytes"), "event 1 (spill-000001.arrow) has no size"),
    (_set([], "meta"), "its 'meta' is list, not an object"),
    (_set("(A, Q)", "meta", "tree"), "its plan '(A, Q)'"),
    (_set("((A", "meta", "tree"), "its plan '((A'"),
    (_pop("meta", "types"), "its 'meta' has no 'types'"),
    (_pop("meta", "output_schema"), "its 'meta' has no 'output_schema'"),
    (_set("not base64!", "meta", "output_schema"), "the output schema cannot be read"),
    (_set("aGVsbG8=", "meta", "output_schema"), "the output schema cannot be read"),
    (_set("SELECT nonsense", "meta", "sql"),
     "its query cannot be parsed (the query has no FROM clause (line 1, column 1))"),
    (_set("seven", "meta", "partitions"), "its plan '(A, B)' (partitions 'seven'"),
])
def test_a_damaged_manifest_is_refused_in_one_line_naming_it(tmp_path, capsys, damage,
                                                            words):
    _, folder = left_on_disk(tmp_path)
    manifest = folder / "manifest.json"
    m = json.loads(manifest.read_text())
    damage(m)
    manifest.write_text(json.dumps(m))
    before = snapshot(folder)
    assert main(["cleanup", str(folder), "--output", str(tmp_path / "late.parquet")]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"adaptcq: error: spill manifest {manifest} is damaged: "), err
    assert words in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert snapshot(folder) == before
    assert not (tmp_path / "late.parquet").exists()


def test_a_manifest_that_is_not_an_object_is_refused(tmp_path):
    _, folder = left_on_disk(tmp_path)
    (folder / "manifest.json").write_text("[1, 2]")
    with pytest.raises(SpillError, match=r"is damaged: it holds list, not an object"):
        cleanup_folder(str(folder), str(tmp_path / "late.parquet"))


# ----- 6. a refused run and its spill folder ---------------------------------------------

SMALL = {"strategy": "bottom-up", "memory": "2kB", "partitions": 2, "every": 5}


def test_a_refused_run_removes_the_spill_folder_it_made(tmp_path):
    folder = tmp_path / "a" / "b" / "sd"
    with pytest.raises(AdaptcqError, match="smaller than one partition group"):
        adaptcq.run(SQL, tables(), spill={**SMALL, "directory": str(folder)})
    assert not (tmp_path / "a").exists()


def test_a_refused_cli_run_removes_the_spill_folder_it_made(tmp_path, capsys):
    for s, t in tables().items():
        pq.write_table(t, tmp_path / f"{s}.parquet")
    code = main(["run", "--sql", SQL, "--input", f"A={tmp_path / 'A.parquet'}", "--input",
                 f"B={tmp_path / 'B.parquet'}", "--no-progress", "--spill", "bottom-up",
                 "--memory", "2kB", "--spill-partitions", "2", "--spill-check", "5",
                 "--spill-dir", str(tmp_path / "sd"), "--output", str(tmp_path / "o.parquet")])
    assert code == 1
    assert "smaller than one partition group" in capsys.readouterr().err
    assert not (tmp_path / "sd").exists() and not (tmp_path / "o.parquet").exists()


@pytest.mark.parametrize("with_manifest", [False, True])
def test_a_refused_run_leaves_a_folder_the_user_gave_as_it_was(tmp_path, with_manifest):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    if with_manifest:  # (an emptied spill folder: a manifest without events)
        left_on_disk(tmp_path / "x")
        shutil.copy(tmp_path / "x" / "sp" / "manifest.json", folder)
        doc = json.loads((folder / "manifest.json").read_text())
        doc["events"] = []
        (folder / "manifest.json").write_text(json.dumps(doc))
    before = snapshot(folder)
    with pytest.raises(AdaptcqError, match="smaller than one partition group"):
        adaptcq.run(SQL, tables(), spill={**SMALL, "directory": str(folder)})
    after = snapshot(folder)
    assert after.pop("notes.txt") == before.pop("notes.txt")
    # a manifest it found stays (rewritten, still without events); none is added
    assert after.keys() == before.keys()
    if with_manifest:
        assert json.loads((folder / "manifest.json").read_text())["events"] == []


def test_an_empty_folder_the_user_gave_stays(tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    with pytest.raises(AdaptcqError, match="smaller than one partition group"):
        adaptcq.run(SQL, tables(), spill={**SMALL, "directory": str(folder)})
    assert folder.is_dir() and list(folder.iterdir()) == []


def test_a_spill_dir_that_is_the_output_is_refused_before_any_work(tmp_path, capsys):
    """--spill-dir X --output X: refused naming both (it failed at the end with 'cannot
    remove the old file: Is a directory' and left an empty folder X)."""
    r = pa.table({"ts": [float(i) for i in range(50)], "k": [i % 5 for i in range(50)]})
    for n in "RS":
        pq.write_table(r, tmp_path / f"{n}.parquet")
    out = tmp_path / "out.parquet"
    code = main(["run", "--sql", "SELECT R.k FROM R, S WHERE R.k = S.k",
                 "--input", f"R={tmp_path / 'R.parquet'}", "--input",
                 f"S={tmp_path / 'S.parquet'}", "--spill", "bottom-up", "--memory", "1kB",
                 "--spill-dir", str(out), "--output", str(out), "--no-progress"])
    assert code != 0
    err = capsys.readouterr().err
    assert "is --spill-dir" in err
    assert not out.exists()


def test_an_output_reached_through_a_link_into_the_spill_dir_is_refused(tmp_path, capsys):
    """A link to the spill folder is the spill folder: an output named through it as a
    file the store owns is refused, as the same path written directly is."""
    r = pa.table({"ts": [float(i) for i in range(50)], "k": [i % 5 for i in range(50)]})
    for n in "RS":
        pq.write_table(r, tmp_path / f"{n}.parquet")
    (tmp_path / "sd").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "sd", target_is_directory=True)
    code = main(["run", "--sql", "SELECT R.k FROM R, S WHERE R.k = S.k",
                 "--input", f"R={tmp_path / 'R.parquet'}", "--input",
                 f"S={tmp_path / 'S.parquet'}", "--spill", "bottom-up", "--memory", "1kB",
                 "--spill-dir", str(tmp_path / "sd"), "--output",
                 str(tmp_path / "link" / "manifest.json"), "--format", "jsonl",
                 "--no-progress"])
    assert code != 0
    assert "is --spill-dir" in capsys.readouterr().err
    assert list((tmp_path / "sd").iterdir()) == []


def test_a_refusal_while_the_run_is_set_up_removes_the_spill_folder_it_made(tmp_path):
    """A tree the query cannot take is refused after the spill store was made: the
    folders it made go with it."""
    r = pa.table({"ts": [float(i) for i in range(50)], "k": [i % 5 for i in range(50)]})
    with pytest.raises(AdaptcqError, match="must hold each of R, S"):
        adaptcq.run("SELECT R.k FROM R, S WHERE R.k = S.k", {"R": r, "S": r},
                    executor="tree", tree="(R, X)",
                    spill={"strategy": "bottom-up", "memory": "4kB",
                           "directory": str(tmp_path / "x" / "y")})
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("to_stdout", [True, False])
def test_an_output_failing_after_a_cleanup_off_run_keeps_or_drops_its_spill_files(
        tmp_path, monkeypatch, to_stdout):
    """``--cleanup off``, the run finished, then the rejected rows' output fails: results
    already on stdout stay delivered, so the spill files of their late results stay for
    ``adaptcq cleanup``; a file output is removed, and its spill files with it."""
    import io
    import sys

    from adaptcq import cli
    for s, t in tables().items():
        pq.write_table(t, tmp_path / f"{s}.parquet")
    spill = tmp_path / "spill"

    def fail(self, *a, **k):
        raise OSError(errno.ENOSPC, "No space left on device (simulated)")
    monkeypatch.setattr(cli.RejectedOutput, "close", fail)
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(io.BytesIO(), write_through=True))
    with pytest.raises(OSError, match="No space left"):
        cli.main(["run", "--no-progress", "--sql", SQL, "--input",
                  f"A={tmp_path / 'A.parquet'}", "--input", f"B={tmp_path / 'B.parquet'}",
                  "--timestamp", "ts", "--executor", "tree", "--spill", "global-penalty",
                  "--memory", "10kB", "--cleanup", "off", "--spill-dir", str(spill),
                  "--output", "-" if to_stdout else str(tmp_path / "o.csv")])
    left = sorted(p.name for p in spill.iterdir()) if spill.exists() else []
    if to_stdout:
        assert "manifest.json" in left and any(n.startswith("spill-") for n in left)
    else:
        assert not any(n.startswith("spill-") for n in left)
        assert not (tmp_path / "o.csv").exists()
