"""State-spill defects found by fuzzing (docs/spill.md, "Disk" and "Clean-up"): a clean-up
whose hand-over write fails still finishes and repeats nothing; a finished `--cleanup off`
run always leaves a folder `adaptcq cleanup` takes; a spill folder damaged past its
SHA-256 checks (a manifest edited to another valid query, plan or partition count, a
spill file's group index missing or wrong, an event removed from the manifest) is refused
naming what is wrong, and the folder is left as it was."""

from __future__ import annotations

import hashlib
import json
import random
import shutil
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyarrow import ipc

import adaptcq
from adaptcq.cli import main
from adaptcq.engine.continuous import ContinuousQuery
from adaptcq.query.cql import parse_query
from adaptcq.runtime.spill import cleanup_folder
from adaptcq.state import spill_store
from adaptcq.state.spill_store import SpillError, SpillStore
from oracle import oracle_total

# ----- 1. a failed hand-over write during a clean-up while running -------------------------

CHAIN = parse_query("SELECT R.id AS r, S.id AS s, T.id AS t, U.id AS u FROM R, S, T, U "
                    "WHERE R.a = S.a AND S.a = T.a AND T.a = U.a",
                    {n: {"a": "number", "id": "number"} for n in "RSTU"})


def _failing_scratch(monkeypatch, k: int) -> list:
    """Scratch (hand-over) writes fail from the k-th on while ``on[0]`` (a full disk)."""
    real, calls, on = spill_store._write_scratch, [0], [True]

    def full_disk(path, data):
        calls[0] += 1
        if on[0] and calls[0] >= k:
            raise OSError(28, "No space left on device")
        real(path, data)

    monkeypatch.setattr(spill_store, "_write_scratch", full_disk)
    return on


@pytest.mark.parametrize("k", [1, 2, 3])
def test_a_failed_hand_over_finishes_the_cleanup_and_repeats_nothing(tmp_path, monkeypatch,
                                                                     k):
    """The report's case: every missing subresult is handed over through disk, and the
    k-th hand-over write fails during a clean-up while running. The clean-up finishes (its
    late results out once, nothing left pending), then says so; a caller that goes on gets
    every result exactly once."""
    cq = ContinuousQuery(CHAIN, "tree", "append", tree=((("R", "S"), "T"), "U"),
                         partitions=1, store=SpillStore(tmp_path, CHAIN.columns),
                         late_column=True)
    ex = cq.executor
    ex._handover_limit = lambda: 0.0
    out, streams, ts, rows = [], [], [], []

    def arrive(stream, t):
        streams.append(stream)
        ts.append(t)
        rows.append((0, t))
        out.extend(cq.process([stream], None, [t], [(0, t)]))

    arrive(2, 0)
    ex.spill([(2, 0)], 0)
    arrive(1, 1)
    ex.spill([(1, 0)], 1)
    arrive(0, 2)
    ex.spill([(1, 0)], 2)
    arrive(0, 3)
    on = _failing_scratch(monkeypatch, k)
    try:
        ex.cleanup(3)
        raised = None
    except SpillError as e:
        raised = str(e)
    out += cq.drain()
    assert raised is not None  # (the clean-up writes three hand-overs)
    if raised is not None:
        assert "No space left on device" in raised and "finished" in raised, raised
        assert "no partition group was dropped" not in raised
    assert not ex.pending() and not ex.store.events  # merged: nothing listed twice
    assert not list(tmp_path.glob("cleanup-*"))  # the hand-over folder went all the same
    on[0] = False
    arrive(3, 4)
    ex.cleanup(final=True)
    out += cq.drain()
    got = Counter(r[:-1] for r in out)
    assert got == oracle_total(CHAIN, streams, ts, rows)
    assert got == Counter({(2, 1, 0, 4, 1, 4): 1, (3, 1, 0, 4, 1, 4): 1})


CHAIN4 = parse_query("SELECT A.id AS w, B.id AS x, C.id AS y, D.id AS z FROM A, B [RANGE 8], "
                     "C, D WHERE A.a = B.a AND B.b = C.b AND C.a = D.a",
                     {n: {"a": "number", "b": "number", "id": "number"} for n in "ABCD"})


@pytest.mark.parametrize("seed", range(8))
def test_random_runs_with_failing_hand_overs_give_every_result_once(tmp_path, monkeypatch,
                                                                    seed):
    """Random spills and clean-ups while running (some writing every merged group back)
    on a 4-way chain under random plans, every missing subresult handed over through disk
    and two random hand-over writes refused: run-time plus late output equals the
    oracle's, each SpillError caught and the run going on (3 of these 8 seeds repeated
    late results before the fix)."""
    rnd = random.Random(seed)
    q = CHAIN4
    cq = ContinuousQuery(q, "tree", "append", tree=rnd.choice([
        ((("A", "B"), "C"), "D"), (("A", "B"), ("C", "D")), ("A", ("B", ("C", "D")))]),
        partitions=rnd.choice([1, 2, 3]), store=SpillStore(tmp_path, q.columns),
        late_column=True)
    ex = cq.executor
    ex._handover_limit = lambda: 0.0
    real, calls, fail = spill_store._write_scratch, [0], set(rnd.sample(range(1, 12), 2))

    def full_disk(path, data):
        calls[0] += 1
        if calls[0] in fail:
            raise OSError(28, "No space left on device")
        real(path, data)

    monkeypatch.setattr(spill_store, "_write_scratch", full_disk)
    streams, ts, rows, out, errors = [], [], [], [], 0
    for i in range(40):
        s = rnd.randrange(4)
        streams.append(s)
        ts.append(i // 2)
        vals = {"a": rnd.randrange(2), "b": rnd.randrange(2), "id": i}
        rows.append(tuple(vals[c] for c in q.columns[q.aliases[s]]))
        out += cq.process([s], None, [ts[-1]], [rows[-1]])
        if rnd.random() < 0.3 and ex.candidates():
            cands = ex.candidates()
            ex.spill([(c[0], c[1]) for c in rnd.sample(cands, rnd.randint(1, len(cands)))],
                     ts[-1])
        if rnd.random() < 0.15:
            try:
                ex.cleanup(ts[-1], keep=rnd.choice([None, 0.0]))
            except SpillError:
                errors += 1
            out += cq.drain()
    try:
        ex.cleanup(final=True)
    except SpillError:  # (finished all the same: nothing is pending)
        errors += 1
    out += cq.drain()
    assert errors > 0 and not ex.pending()
    assert Counter(r[:-1] for r in out) == oracle_total(q, streams, ts, rows)


# ----- 2. a finished --cleanup off run always leaves a folder adaptcq cleanup takes ---------

def _late_rows(path: Path) -> Counter:
    t = pq.read_table(path)
    assert all(t.column("_late").to_pylist())
    return Counter(zip(t.column("r").to_pylist(), t.column("s").to_pylist(), strict=True))


def _run_rows(t: pa.Table) -> Counter:
    return Counter(zip(t.column("r").to_pylist(), t.column("s").to_pylist(), strict=True))


def test_a_cleanup_off_run_whose_last_groups_all_ended_can_be_cleaned_up(tmp_path):
    """Spills during the run; at its end only groups whose inputs all ended are in memory,
    so the last spill event writes nothing: the manifest still gets the query."""
    R = pa.table({"ts": [0, 0, 5, 100], "id": [0, 1, 2, 3], "a": [1, 2, 0, None]})
    S = pa.table({"ts": [0, 0], "id": [0, 1], "a": [1, 2]})
    folder = tmp_path / "sd3"
    res = adaptcq.run("SELECT R.id AS r, S.id AS s FROM R [RANGE 1], S [RANGE 1] "
                      "WHERE R.a = S.a", {"R": R, "S": S},
                      spill={"strategy": "bottom-up", "memory": 500, "every": 1,
                             "partitions": 3, "cleanup": "off", "directory": str(folder)})
    assert res.stats["spills"] >= 1 and res.stats["spill_folder"] == str(folder)
    done = cleanup_folder(str(folder), str(tmp_path / "late.parquet"))
    late = _late_rows(tmp_path / "late.parquet")
    assert done["late_results"] == sum(late.values())
    assert _run_rows(res.table) + late == Counter({(0, 0): 1, (1, 1): 1})
    assert not list(folder.glob("spill-*"))


def test_a_cleanup_off_run_that_never_spilled_leaves_a_manifest(tmp_path, capsys):
    """The CLI workflow `run --cleanup off ... && adaptcq cleanup DIR` with no spill and a
    group left empty in memory: the clean-up succeeds with no late results."""
    pq.write_table(pa.table({"ts": [0, 10], "id": [0, 1], "a": [1, None]}),
                   tmp_path / "R.parquet")
    pq.write_table(pa.table({"ts": [0], "id": [0], "a": [1]}), tmp_path / "S.parquet")
    folder = tmp_path / "sd2"
    sql = "SELECT R.id AS r, S.id AS s FROM R [RANGE 1], S [RANGE 1] WHERE R.a = S.a"
    assert main(["run", "--sql", sql, "--input", f"R={tmp_path / 'R.parquet'}",
                 "--input", f"S={tmp_path / 'S.parquet'}", "--spill", "bottom-up",
                 "--memory", "1MB", "--cleanup", "off", "--spill-dir", str(folder),
                 "--output", str(tmp_path / "o.parquet"), "--no-progress"]) == 0
    assert (folder / "manifest.json").exists()
    assert main(["cleanup", str(folder), "--output", str(tmp_path / "late.parquet")]) == 0
    assert "wrote 0 late results" in capsys.readouterr().err
    assert _run_rows(pq.read_table(tmp_path / "o.parquet")) == Counter({(0, 0): 1})
    assert _late_rows(tmp_path / "late.parquet") == Counter()


# ----- 3. a spill folder damaged past its SHA-256 checks -----------------------------------

SQL3 = ("SELECT R.id AS r, S.id AS s, T.id AS t FROM R [RANGE 10], S [RANGE 10], "
        "T [RANGE 10] WHERE R.a = S.a AND S.a = T.a")
SPILL3 = {"strategy": "bottom-up", "memory": "6kB", "partitions": 11, "every": 5,
          "cleanup": "off"}


def _sources(n: int = 90) -> dict[str, pa.Table]:
    return {s: pa.table({"ts": [i // 3 for i in range(n)], "id": list(range(n)),
                         "a": [(i * 7 + j) % 5 for i in range(n)]})
            for j, s in enumerate("RST")}


_LEFT: dict = {}


def left(tmp_path: Path) -> tuple[Path, Counter]:
    """A `--cleanup off` run's spill folder (a copy of one made once) and the late rows
    its intact clean-up writes."""
    if not _LEFT:
        base = tmp_path.parent / "left-once"
        res = adaptcq.run(SQL3, _sources(), tree="((R, S), T)",
                          spill={**SPILL3, "directory": str(base / "sd")})
        assert res.stats["spills"] >= 3
        files = {p.name: p.read_bytes() for p in (base / "sd").iterdir()}
        shutil.copytree(base / "sd", base / "copy")
        cleanup_folder(str(base / "copy"), str(base / "late.parquet"))
        t = pq.read_table(base / "late.parquet")
        _LEFT.update(files=files, late=Counter(zip(*(t.column(c).to_pylist()
                                                     for c in "rst"), strict=True)))
        assert _LEFT["late"]
    folder = tmp_path / "sd"
    folder.mkdir()
    for name, data in _LEFT["files"].items():
        (folder / name).write_bytes(data)
    return folder, _LEFT["late"]


def snapshot(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir()}


def edit_manifest(folder: Path, edit) -> None:
    m = json.loads((folder / "manifest.json").read_text())
    edit(m)
    (folder / "manifest.json").write_text(json.dumps(m))


def refused(tmp_path: Path, folder: Path, *words: str) -> str:
    before = snapshot(folder)
    with pytest.raises(SpillError) as e:
        cleanup_folder(str(folder), str(tmp_path / "late.parquet"))
    for w in words:
        assert w in str(e.value), str(e.value)
    assert snapshot(folder) == before  # nothing removed or rewritten
    assert not (tmp_path / "late.parquet").exists()
    return str(e.value)


def test_an_intact_folder_cleans_up_with_or_without_its_fingerprint(tmp_path):
    folder, late = left(tmp_path)
    m = json.loads((folder / "manifest.json").read_text())
    assert m["fingerprint"].startswith("meta-sha256:")
    cleanup_folder(str(folder), str(tmp_path / "late.parquet"))
    t = pq.read_table(tmp_path / "late.parquet")
    assert Counter(zip(*(t.column(c).to_pylist() for c in "rst"), strict=True)) == late
    older = tmp_path / "older"
    older.mkdir()
    folder2, _ = left(older)
    edit_manifest(folder2, lambda m: m.update(fingerprint=""))  # (written before it)
    cleanup_folder(str(folder2), str(older / "late.parquet"))
    t = pq.read_table(older / "late.parquet")
    assert Counter(zip(*(t.column(c).to_pylist() for c in "rst"), strict=True)) == late


@pytest.mark.parametrize("key, value", [
    ("partitions", 3), ("partitions", 12), ("tree", "((R, T), S)"),
    ("sql", SQL3.replace("[RANGE 10], T", "[RANGE 9], T")),
])
def test_a_manifest_edited_to_another_valid_query_or_plan_is_refused(tmp_path, key, value):
    folder, _ = left(tmp_path)
    edit_manifest(folder, lambda m: m["meta"].update({key: value}))
    refused(tmp_path, folder, f"spill manifest {folder / 'manifest.json'} is damaged",
            "fingerprint")


def test_without_a_fingerprint_fewer_partitions_are_refused_naming_a_file(tmp_path):
    folder, _ = left(tmp_path)

    def edit(m):
        m["fingerprint"] = ""
        m["meta"]["partitions"] = 3
    edit_manifest(folder, edit)
    msg = refused(tmp_path, folder, "spill file", "partition id", "there are 3 partitions")
    assert str(folder / "spill-") in msg


def _rewrite_index(folder: Path, name: str, change) -> None:
    """Rewrite a spill file with its schema metadata changed by ``change`` (a dict of
    bytes), its size and SHA-256 in the manifest updated: damage the checksums pass."""
    path = folder / name
    r = ipc.open_file(pa.memory_map(str(path)))
    md = dict(r.schema.metadata)
    change(md)
    schema = r.schema.with_metadata(md)
    sink = pa.BufferOutputStream()
    with ipc.new_file(sink, schema) as w:
        for b in range(r.num_record_batches):
            w.write_batch(r.get_batch(b))
    data = sink.getvalue().to_pybytes()
    del r
    path.write_bytes(data)

    def edit(m):
        for ev in m["events"]:
            if ev["file"] == name:
                ev["bytes"], ev["sha256"] = len(data), hashlib.sha256(data).hexdigest()
    edit_manifest(folder, edit)


def _index_edit(field: int, value, row: int = 0):
    def change(md):
        index = json.loads(md[b"adaptcq.groups"])
        index[row][field] = value(index[row]) if callable(value) else value
        md[b"adaptcq.groups"] = json.dumps(index).encode()
    return change


@pytest.mark.parametrize("change, words", [
    (lambda md: md.pop(b"adaptcq.groups"), ["has no group index", "'adaptcq.groups'"]),
    (lambda md: md.pop(b"adaptcq.blocks"), ["has no group index", "'adaptcq.blocks'"]),
    (lambda md: md.update({b"adaptcq.groups": b"{not json"}), ["damaged group index"]),
    (lambda md: md.update({b"adaptcq.groups": b"[[1, 2]]"}), ["damaged group index"]),
    (_index_edit(1, 999), ["partition id 999", "there are 11 partitions"]),
    (_index_edit(1, -1), ["damaged group index", "row 1"]),
    (_index_edit(0, 7), ["operator 7", "has 2"]),
    (_index_edit(0, 0), ["damaged group index"]),
    (_index_edit(2, 99), ["damaged group index"]),
    # a pid below the count that the batch does not hold
    (_index_edit(1, lambda row: (row[1] + 1) % 11), ["no rows of partition id"]),
])
def test_a_spill_file_with_a_bad_group_index_is_refused_naming_it(tmp_path, change, words):
    folder, _ = left(tmp_path)
    name = json.loads((folder / "manifest.json").read_text())["events"][0]["file"]
    _rewrite_index(folder, name, change)
    if words == ["no rows of partition id"]:
        # (only when that pid has no rows in the batch: otherwise it is another group)
        index = json.loads(ipc.open_file(pa.memory_map(str(folder / name))).schema
                           .metadata[b"adaptcq.groups"])
        same = [(r[0], r[1], r[2]) for r in index]
        if len(set(same)) < len(same):
            pytest.skip("the edited pid is another group of that batch")
    refused(tmp_path, folder, f"spill file {folder / name}", *words)


def test_an_event_removed_from_the_manifest_is_refused_naming_its_file(tmp_path):
    folder, _ = left(tmp_path)
    m = json.loads((folder / "manifest.json").read_text())
    gone = m["events"][1]["file"]
    edit_manifest(folder, lambda m: m["events"].pop(1))
    refused(tmp_path, folder, "does not list", gone)


def test_a_run_given_an_emptied_spill_folder_drops_the_earlier_query(tmp_path):
    """An emptied folder (a manifest without events) keeps its query for no new run: a
    crash of that run would otherwise leave its spill files under the earlier query."""
    folder, _ = left(tmp_path)
    cleanup_folder(str(folder), str(tmp_path / "late.parquet"))
    doc = json.loads((folder / "manifest.json").read_text())
    assert doc["events"] == [] and doc["meta"]["sql"]
    store = SpillStore(folder, {"R": ("a",)}, fresh=True)
    assert store.meta == {} and store.fingerprint == ""


def test_a_spill_batch_with_rows_of_no_input_is_refused_naming_its_file(tmp_path):
    """A batch whose ``child`` column names no input of its operator (rewritten by hand,
    its SHA-256 updated): refused, not read as no rows."""
    folder, _ = left(tmp_path)
    name = json.loads((folder / "manifest.json").read_text())["events"][0]["file"]
    path = folder / name
    r = ipc.open_file(pa.memory_map(str(path)))
    batches = [r.get_batch(b) for b in range(r.num_record_batches)]
    schema = r.schema
    del r
    first = batches[0]
    i = first.schema.get_field_index("child")
    batches[0] = first.set_column(i, "child", pa.array([5] * first.num_rows, pa.int16()))
    sink = pa.BufferOutputStream()
    with ipc.new_file(sink, schema) as w:
        for b in batches:
            w.write_batch(b)
    data = sink.getvalue().to_pybytes()
    path.write_bytes(data)

    def edit(m):
        m["events"][0].update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    edit_manifest(folder, edit)
    refused(tmp_path, folder, f"spill file {path} is damaged", "'child' column is outside")
