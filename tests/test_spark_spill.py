"""Spilling on Spark (issue 12 item 7; docs/spill.md, "On Spark"): a partition group's
operator tree spills into its folder under the checkpoint, versioned with the group's
stored changes. Driven here without Spark, through ``spark_group.advance_group`` over a
``MemoryStore`` (as ``transformWithStateInPandas`` drives it), with random queries, data,
budgets, rebuilds from the store and failed micro-batches retried; then end to end on
Spark, with a stop and a restart from the checkpoint."""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import random
import uuid
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import adaptcq
from adaptcq.errors import AdaptcqError, OptionError
from conftest import examples
from oracle import oracle_total
from test_spill import arrivals, as_tuples, queries, random_plan

NS = 10**9


def _config(q, tree, spill: dict, directory: Path):
    from adaptcq.runtime.spark_split import _Config, plan_split
    from adaptcq.runtime.spill import spark_spill_spec
    inputs = {a: pa.schema([(c, pa.int64()) for c in q.columns[a]]) for a in q.aliases}
    return _Config(
        qid=f"spill-{uuid.uuid4().hex}", sql=q.sql,
        schemas={s.source: {c: "number" for c in (*q.columns[s.alias], "ts")}
                 for s in q.streams},
        executor="tree", mode="append", options={"tree": tree}, adaptivity=None, groups=1,
        keys=[0], lateness=0.0, lateness_ns=0, signed=False, n_streams=len(q.streams),
        stream_columns=[[f"c{i}_{k}" for k in range(len(q.columns[a]))]
                        for i, a in enumerate(q.aliases)],
        reported=[True] * len(q.streams), sources=[s.source for s in q.streams],
        names=[o.name for o in q.outputs], plan=plan_split(q, 1), aliases=list(q.aliases),
        inputs=inputs, spill=spark_spill_spec({**spill, "directory": str(directory)}, 1),
        # the output as Spark types it (every column here is an int64 one)
        results=pa.schema([(o.name, pa.int64()) for o in q.outputs]
                          + [("_sign", pa.int8()), ("_ts", pa.int64()), ("_late", pa.bool_())]))


def _packets(cfg, streams, ts, rows, first: int, end: bool = False,
             same_order: bool = False, cleanup: bool = False) -> list:
    """One micro-batch of a group's packets, as ``ColumnarSplit`` sends them (with
    ``same_order``, every row's order-column value is 0: a user's order column need not be
    unique; with ``cleanup``, the micro-batch of a clean-up marker)."""
    from adaptcq.runtime.spark_split import PUNCT, _ipc
    present = sorted(set(streams))
    maxima = [(i, max(t for s, t in zip(streams, ts, strict=True) if s == i),
               streams.count(i)) for i in present]
    out = [(PUNCT, json.dumps({"end": end, "maxima": maxima,
                               "cleanup": cleanup}).encode())]
    for i in present:
        idx = [k for k, s in enumerate(streams) if s == i]
        cols = {"_t": pa.array([ts[k] for k in idx], pa.int64()),
                "_o1": pa.array([""] * len(idx)).dictionary_encode(),
                "_o2": pa.array([0 if same_order else first + k for k in idx], pa.int64())}
        for c, name in enumerate(cfg.stream_columns[i]):
            cols[name] = pa.array([rows[k][c] for k in idx], pa.int64())
        cols["_pr"] = pa.array([True] * len(idx))
        out.append((i, _ipc(pa.table(cols))))
    return out


def _results(eng, res) -> list:
    """A step's results as rows: its rows, then the late results a batch clean-up left
    as Arrow (``PartitionGroup.take_late_tables``; Spark takes them in ``_frames``)."""
    rows = list(res)
    for t in eng.take_late_tables():
        rows += zip(*(c.to_pylist() for c in t.columns), strict=True)
    return rows


@settings(max_examples=examples(40), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@given(data=st.data(), seed=st.integers(0, 10**6),
       strategy=st.sampled_from(["bottom-up", "local-output", "global-output",
                                 "global-penalty"]),
       budget=st.integers(1_500, 8_000), every=st.integers(1, 6))
def test_a_spilling_group_rebuilt_or_retried_equals_the_oracle(data, seed, strategy, budget,
                                                              every, tmp_path_factory):
    """Random queries, plans and budgets in one spilling group, fed in random micro-batches;
    after random ones the live copy is dropped (a restart: the group is rebuilt from the
    store and its spill folder), and random ones fail half-way (their spill files and
    clean-ups are written, the store is not) and are retried. Clean-ups on demand
    (``signal_cleanup``) come with random micro-batches, some without rows; with
    ``--cleanup off`` nothing is cleaned up until one after the end of the input (``adaptcq
    cleanup CHECKPOINT``). Run-time plus late output equals the oracle's, each result
    once."""
    from adaptcq.runtime import spark_group as sg
    from adaptcq.state.spill_store import SpillError
    q = data.draw(queries(max_streams=4))
    streams, ts, rows = data.draw(arrivals(len(q.aliases), max_rows=80))
    tup = as_tuples(q, streams, rows)
    rnd = random.Random(seed)
    folder = tmp_path_factory.mktemp("spill")
    off = rnd.random() < 0.3
    cfg = _config(q, random_plan(q, rnd), {"strategy": strategy, "memory": budget,
                                           "every": every, "partitions": rnd.choice([2, 7]),
                                           **({} if strategy == "local-output"
                                              else {"seed": seed}),
                                           "cleanup": "off" if off else "end"},
                  folder)
    ns = [round(t * NS) for t in ts]
    cuts = sorted({0, len(tup), *(rnd.randrange(len(tup) + 1) for _ in range(4))})
    store = sg.MemoryStore()
    same_order = rnd.random() < 0.3
    replay_rows = sg.REPLAY_ROWS
    sg.REPLAY_ROWS = rnd.choice([1, 3, replay_rows])  # a rebuild's rows in chunks of any size
    out, rebuilds, retries = [], 0, 0
    batches = []
    for a, b in itertools.pairwise(cuts):
        if rnd.random() < 0.2:  # a clean-up asked for in a micro-batch without rows
            batches.append((a, a, True))
        if rnd.random() < 0.15:
            batches.append((a, "tick", False))  # signal_tick: nothing to process
        batches.append((a, b, rnd.random() < 0.2))
    batches.append((len(tup), None, rnd.random() < 0.2))
    if rnd.random() < 0.3:
        batches.append((len(tup), "tick", False))  # signal_tick: nothing to process
    if off:
        batches.append((len(tup), None, True))  # adaptcq cleanup CHECKPOINT
    asked = sum(c for _, _, c in batches)
    asked_wb = wb = 0  # clean-ups on demand without rows that wrote groups back
    try:
        for a, b, cleanup in batches:
            end = b is None
            if b == "tick":
                from adaptcq.runtime.spark_split import PUNCT
                packets = [(PUNCT, json.dumps({"end": False, "maxima": [],
                                               "cleanup": False}).encode())]
            elif end:
                packets = _packets(cfg, [], [], [], a, True, cleanup=cleanup)
            else:
                packets = _packets(cfg, streams[a:b], ns[a:b], tup[a:b], a, end, same_order,
                                   cleanup)
            if rnd.random() < 0.3:  # an attempt that fails after the engine ran: retried
                saved = copy.deepcopy((store.meta, store.entries, store.adapt))
                sg.advance_group(cfg, 0, store, list(packets))
                store.meta, store.entries, store.adapt = saved
                sg._LIVE.pop((cfg.qid, 0), None)
                retries += 1
            elif rnd.random() < 0.3:  # a restart, or the group on another worker
                sg._LIVE.pop((cfg.qid, 0), None)
                rebuilds += 1
            done = sg.advance_group(cfg, 0, store, list(packets))
            if done is None:  # a tick changes nothing
                assert b == "tick"
                continue
            eng, res, _, _, _ = done
            out += _results(eng, res)
            if cleanup and b == a:
                asked_wb += eng.cq.executor.counters.writebacks > wb
            wb = eng.cq.executor.counters.writebacks
    except SpillError as e:  # a budget below one partition group: refused, named
        assert "smaller than one partition group" in str(e)
        event("refused: a budget below one partition group")
        return
    finally:
        sg._LIVE.pop((cfg.qid, 0), None)
        sg.REPLAY_ROWS = replay_rows
    got = Counter(r[:-3] + (r[-3], r[-2] / NS) for r in out)
    assert got == oracle_total(q, streams, ts, tup)
    c = eng.cq.executor.counters
    assert c.first_pending is None and c.late_results == sum(r[-1] for r in out)
    if c.spills:  # finished, nothing in memory: the store keeps no rows
        assert store.entries == {}
    event(f"spills: {min(c.spills, 3)}+, rebuilt: {min(rebuilds, 1)}+, "
          f"retried: {min(retries, 1)}+, groups written back: {bool(c.writebacks)}")
    event(f"cleanup off: {off}, clean-ups asked for: {min(asked, 2)}+, "
          f"written back by one without rows: {bool(asked_wb)}")


def test_a_missing_spill_file_at_a_rebuild_is_named(tmp_path):
    """A group rebuilt from the store whose folder lost a spill file the checkpoint names
    stops with an error naming the file (its held-back results could not be produced)."""
    from adaptcq.query.cql import parse_query
    from adaptcq.runtime import spark_group as sg
    from adaptcq.state.spill_store import SpillError
    schema = {c: "number" for c in ("a", "b", "id", "ts")}
    q = parse_query("SELECT R.id AS r, S.id AS s FROM R, S WHERE R.a = S.a",
                    {"R": schema, "S": schema})
    cfg = _config(q, None, {"strategy": "bottom-up", "memory": 1_500, "every": 1,
                            "partitions": 4}, tmp_path / "spill")
    store = sg.MemoryStore()
    rows = [(k % 4, k) for k in range(40)]  # (a, id)
    streams = [k % 2 for k in range(40)]
    try:
        sg.advance_group(cfg, 0, store, _packets(cfg, streams, [k * NS for k in range(40)],
                                                  rows, 0))
        files = sorted((tmp_path / "spill" / "group-00000").glob("spill-*.arrow"))
        assert files, "the budget should make the group spill"
        files[0].unlink()
        sg._LIVE.pop((cfg.qid, 0), None)
        with pytest.raises(SpillError, match=f"{files[0].name} named in the checkpoint is "
                                             "missing"):
            sg.advance_group(cfg, 0, store, _packets(cfg, [], [], [], 40, True))
    finally:
        sg._LIVE.pop((cfg.qid, 0), None)


def _two_streams(window: str = ""):
    from adaptcq.query.cql import parse_query
    schema = {c: "number" for c in ("a", "id", "ts")}
    return parse_query(f"SELECT R.id AS r, S.id AS s FROM R{window}, S{window} "
                       "WHERE R.a = S.a", {"R": schema, "S": schema})


def _windowed_stream(seed: int, n: int):
    """R(a) ⋈ S(a) over [RANGE 5 SECONDS], n rows at four a second, six key values."""
    q = _two_streams(" [RANGE 5 SECONDS]")
    rnd = random.Random(seed)
    streams = [rnd.randrange(2) for _ in range(n)]
    rows = [(rnd.randrange(6), k) for k in range(n)]
    return q, streams, rows, [k * NS // 4 for k in range(n)]


def test_the_store_stays_bounded_while_spills_stay_pending(tmp_path):
    """A windowed stream that keeps the state at its budget spills at every check and never
    cleans up while running (``when_free`` off: no write-backs either); the rows kept in
    the store (what a rebuild replays) and the journal stay about a window's worth, not
    the stream since the first spill; a rebuild at the end is cheap and its results are
    the uninterrupted run's."""
    from adaptcq.runtime import spark_group as sg
    q, streams, rows, ts = _windowed_stream(1, 4000)
    n = len(rows)

    def run(rebuild: bool, folder):
        cfg = _config(q, None, {"strategy": "bottom-up", "memory": 8000, "every": 5,
                                "partitions": 8, "when_free": False}, folder)
        store, out, kept = sg.MemoryStore(), [], []
        try:
            for b, (a, z) in enumerate(itertools.pairwise(range(0, n + 1, 100))):
                if rebuild and b == 39:
                    sg._LIVE.pop((cfg.qid, 0), None)
                eng, res, *_ = sg.advance_group(cfg, 0, store, _packets(
                    cfg, streams[a:z], ts[a:z], rows[a:z], a))
                out += _results(eng, res)
                kept.append((sum(e[3] for e in eng.entries.values()), len(eng.journal)))
            eng, res, *_ = sg.advance_group(cfg, 0, store, _packets(cfg, [], [], [], n, True))
        finally:
            sg._LIVE.pop((cfg.qid, 0), None)
        out += _results(eng, res)
        return Counter(r[:-1] for r in out), eng, kept  # (late or not may differ)

    plain, eng, kept = run(False, tmp_path / "a")
    assert eng.cq.executor.counters.spills > 100 and eng.cq.executor.counters.late_results
    assert max(k for k, _ in kept) < 400 and max(j for _, j in kept) < 40  # of 4,000 rows
    again, eng, _ = run(True, tmp_path / "b")
    assert eng.rebuilt_rows < 400
    assert again == plain


def test_groups_written_back_by_a_cleanup_survive_rebuilds_and_retries(tmp_path):
    """A windowed stream at its budget: clean-ups while running merge the spilled state
    whose windows ended and write back the merged groups memory cannot hold
    (``SpillTree.cleanup(keep=)``). The disk then holds about a window's spilled state,
    and a group rebuilt, or retried, right after such a clean-up gives the results of the
    uninterrupted run, which are the oracle's."""
    from adaptcq.runtime import spark_group as sg
    q, streams, rows, ts = _windowed_stream(2, 3000)
    n = len(rows)

    def run(lose: set, fail: set, folder):
        cfg = _config(q, None, {"strategy": "global-penalty", "memory": 4000, "every": 5,
                                "partitions": 8}, folder)
        store, out, files = sg.MemoryStore(), [], []
        written = 0
        try:
            for b, (a, z) in enumerate(itertools.pairwise(range(0, n + 1, 100))):
                packets = _packets(cfg, streams[a:z], ts[a:z], rows[a:z], a)
                if b in fail:  # runs, writes its files, is not committed: retried
                    saved = copy.deepcopy((store.meta, store.entries, store.adapt))
                    sg.advance_group(cfg, 0, store, list(packets))
                    store.meta, store.entries, store.adapt = saved
                    sg._LIVE.pop((cfg.qid, 0), None)
                if b in lose:
                    sg._LIVE.pop((cfg.qid, 0), None)
                eng, res, *_ = sg.advance_group(cfg, 0, store, packets)
                out += _results(eng, res)
                c = eng.cq.executor.counters
                written = max(written, c.writebacks)
                files.append(len(eng.cq.executor.store.events))
            eng, res, *_ = sg.advance_group(cfg, 0, store, _packets(cfg, [], [], [], n, True))
        finally:
            sg._LIVE.pop((cfg.qid, 0), None)
        out += _results(eng, res)
        return Counter(r[:-3] + (r[-3], r[-2] / NS) for r in out), written, files

    plain, written, files = run(set(), set(), tmp_path / "a")
    assert written > 0
    assert max(files) < 10  # spill events on disk: not one per spill since the start
    assert plain == oracle_total(q, streams, [t / NS for t in ts], rows)
    lose, fail = set(range(3, 30, 4)), set(range(5, 30, 6))
    again, _, _ = run(lose, fail, tmp_path / "b")
    assert again == plain


def test_rows_after_the_end_of_input_are_rejected_when_spilling(tmp_path):
    """The end of input's clean-up merged every spilled generation and left nothing in
    memory: a row arriving after it could not join, so it is rejected (counted, with the
    reason), as a late row is."""
    from adaptcq.runtime import spark_group as sg
    q = _two_streams()
    cfg = _config(q, None, {"strategy": "bottom-up", "memory": 10**6, "partitions": 2},
                  tmp_path / "spill")

    def packets(rng):
        return _packets(cfg, [t % 2 for t in rng], [t * NS for t in rng],
                        [((t // 2) % 2, t) for t in rng], rng[0])
    try:
        store = sg.MemoryStore()
        sg.advance_group(cfg, 0, store, packets(range(10)))
        sg.advance_group(cfg, 0, store, _packets(cfg, [], [], [], 10, True))
        _, res, rejected, *_ = sg.advance_group(cfg, 0, store, packets(range(12, 14)))
    finally:
        sg._LIVE.pop((cfg.qid, 0), None)
    assert res == [] and len(rejected) == 2
    assert all(r[-1] == "arrived after end of input" for r in rejected)


def test_rows_a_cleanup_puts_back_after_a_rebuild_still_expire(tmp_path, monkeypatch):
    """A rebuild gives replayed rows new ids; a later clean-up while running puts spilled
    rows back under the ids they were spilled with. They still leave memory when their
    window ends (the tree's own expiry), as in the uninterrupted run."""
    from adaptcq.adapt import spilling
    from adaptcq.runtime import spark_group as sg
    from adaptcq.stats.partitions import partition_of
    q = _two_streams(" [RANGE 50 SECONDS]")

    def check(self, ex, ts):  # spill group of key 0 at 5 s, clean up at 15 s
        if ts == 5 * NS:
            ex.spill([(1, partition_of(0, 2))], ts)
        elif ts == 15 * NS and ex.pending():
            ex.cleanup(ts)
    monkeypatch.setattr(spilling.SpillPolicy, "check", check)

    def run(rebuild: bool, folder):
        cfg = _config(q, None, {"strategy": "bottom-up", "memory": 10**6, "every": 1,
                                "partitions": 2}, folder)
        store, out = sg.MemoryStore(), []
        try:
            for b, rng in enumerate([range(10), range(10, 20), range(60, 70),
                                     range(120, 130)]):
                if rebuild and b == 1:
                    sg._LIVE.pop((cfg.qid, 0), None)
                eng, res, *_ = sg.advance_group(cfg, 0, store, _packets(
                    cfg, [t % 2 for t in rng], [t * NS for t in rng],
                    [((t // 2) % 2, t) for t in rng], rng[0]))
                out += _results(eng, res)
            ex = eng.cq.executor
            stale = [exp for op in ex.ops for g in op.parts.values() for k in range(2)
                     for exp, _ in g.entries(k) if exp < eng.expired]
            held = sum(len(s.rows) for s in ex.stems)
        finally:
            sg._LIVE.pop((cfg.qid, 0), None)
        return Counter(out), stale, held

    plain, stale, held = run(False, tmp_path / "a")
    again, stale2, held2 = run(True, tmp_path / "b")
    assert again == plain and stale == stale2 == [] and held2 == held


def test_spark_spill_options_are_checked_and_unsupported_ones_refused():
    from adaptcq.runtime.spill import spark_spill_spec
    spec = spark_spill_spec({"strategy": "bottom-up", "memory": "4MB", "directory": "d"}, 4)
    assert spec["budget"] == 1_000_000 and spec["memory"] == 4_000_000
    off = spark_spill_spec({"strategy": "bottom-up", "memory": "4MB", "directory": "d",
                            "cleanup": "off"}, 1)
    assert off["cleanup"] == "off" and not off["when_free"]
    with pytest.raises(OptionError, match="cannot also clean up while running"):
        spark_spill_spec({"strategy": "bottom-up", "memory": "4MB", "directory": "d",
                          "cleanup": "off", "when_free": True}, 1)
    with pytest.raises(OptionError, match="choose end or off"):
        spark_spill_spec({"strategy": "bottom-up", "memory": "4MB", "directory": "d",
                          "cleanup": "later"}, 1)
    with pytest.raises(OptionError, match="needs a folder"):
        spark_spill_spec({"strategy": "bottom-up", "memory": "4MB"}, 1)
    with pytest.raises(OptionError, match="go together"):
        spark_spill_spec({"strategy": "bottom-up", "directory": "d"}, 1)
    with pytest.raises(OptionError, match="unknown spill strategy"):
        spark_spill_spec({"strategy": "sideways", "memory": "4MB", "directory": "d"}, 1)


# ----- Spark ------------------------------------------------------------------------------

SQL = ("SELECT A.id AS a, B.id AS b, C.id AS c FROM A [RANGE 30 SECONDS], "
       "B [RANGE 30 SECONDS], C [RANGE 30 SECONDS] WHERE A.x = B.x AND B.y = C.y")


def _files(root: Path, n: int, files: int, start: int = 0) -> dict[str, str]:
    import os
    rng = random.Random(7)
    for name in "ABC":
        d = root / name
        d.mkdir(parents=True, exist_ok=True)
        rows = [(k * 0.25, k, rng.randrange(12), rng.randrange(12)) for k in range(n)]
        per = n // files
        for f in range(start, files):
            part = rows[f * per:(f + 1) * per]
            p = d / f"part-{f}.parquet"
            pq.write_table(pa.table({"ts": [r[0] for r in part], "id": [r[1] for r in part],
                                     "x": [r[2] for r in part], "y": [r[3] for r in part]}), p)
            os.utime(p, (1_600_000_000 + 10 * f, 1_600_000_000 + 10 * f))
    return {name: str(root / name) for name in "ABC"}


def _hold_back(root: Path) -> None:
    """Files 2 and 3 of every stream out of sight: a first run sees files 0 and 1."""
    for name in "ABC":
        for f in (2, 3):
            (root / name / f"part-{f}.parquet").rename(root / name / f"later-{f}")


def _bring_back(root: Path) -> None:
    """Files 2 and 3 back, with the modification times the file source orders them by."""
    import os
    for name in "ABC":
        for f in (2, 3):
            p = root / name / f"part-{f}.parquet"
            (root / name / f"later-{f}").rename(p)
            os.utime(p, (1_600_000_000 + 10 * f, 1_600_000_000 + 10 * f))


def _multiset(table: pa.Table) -> Counter:
    cols = [c for c in table.column_names if c != "_late"]
    return Counter(zip(*[table.column(c).to_pylist() for c in cols], strict=True))


def test_spilling_on_spark_with_a_restart_equals_local(spark, tmp_path):
    """Two groups spilling under a small budget; the first run stops after two of four files
    a stream, the restart (a new query: every group rebuilt from the checkpoint, its spill
    folder as the checkpoint recorded it) runs the rest and the end of input, whose
    clean-up produces the held-back results. Together: the local runtime's results."""
    from adaptcq.runtime.spark import run_files
    srcs = _files(tmp_path / "in", 800, 4)
    _hold_back(tmp_path / "in")
    ck, out = str(tmp_path / "ck"), str(tmp_path / "out")
    spill = {"strategy": "global-output", "memory": "80kB", "every": 10, "partitions": 16}
    run1 = run_files(spark, SQL, srcs, ck, out, partitions=2, max_files_per_trigger=1,
                     finish=False, spill=spill)
    assert run1.spill["spills"] > 0 and run1.spill["complete_until"] is not None
    _bring_back(tmp_path / "in")
    run2 = run_files(spark, SQL, srcs, ck, out, partitions=2, max_files_per_trigger=1,
                     spill=spill)
    assert run2.restarted and run2.spill["late_results"] > 0
    assert any(h["rebuilt_rows"] > 0 for h in run2.history)  # rebuilt by replaying
    assert run2.spill["complete_until"] is None
    local = adaptcq.run(SQL, srcs)
    got = ds.dataset(out).to_table()
    assert got.column_names[-1] == "_late"
    assert _multiset(got) == _multiset(local.table)
    assert sum(got.column("_late").to_pylist()) > 0
    # Nothing is pending: every group's folder names no spill event any more, and the files
    # the end of input's clean-up merged are gone (removed in the tick micro-batch after
    # it was committed).
    for manifest in Path(ck, "spill").glob("group-*/manifest.json"):
        assert json.loads(manifest.read_text())["events"] == []
    assert list(Path(ck, "spill").glob("group-*/*.arrow")) == []


def test_cleanups_on_demand_on_spark_with_cleanup_off_equal_local(spark, tmp_path):
    """``--cleanup off`` on Spark: nothing is cleaned up by the run, not even at the end of
    its input. ``adaptcq cleanup CHECKPOINT`` (``cleanup_checkpoint``) after a run stopped
    half-way produces what was held back so far (a clean-up while running, its merged
    groups back in memory or written back); the run then goes on to the end of its input,
    and a second clean-up produces the rest. Together: the local runtime's results, each
    once; a third clean-up finds nothing. The query text has a comment and a final
    semicolon: the clean-up runs it as given, not as the fingerprint compares it (with
    white space collapsed, the comment would swallow the WHERE clause)."""
    from adaptcq.runtime.spark import cleanup_checkpoint, run_files
    sql = SQL.replace(" WHERE", " -- the joins\nWHERE") + ";"
    srcs = _files(tmp_path / "in", 800, 4)
    _hold_back(tmp_path / "in")
    ck, out = str(tmp_path / "ck"), str(tmp_path / "out")
    spill = {"strategy": "global-penalty", "memory": "80kB", "every": 10, "partitions": 16,
             "cleanup": "off"}
    run1 = run_files(spark, sql, srcs, ck, out, partitions=2, max_files_per_trigger=1,
                     finish=False, spill=spill)
    assert run1.spill["spills"] > 0 and run1.spill["late_results"] == 0
    held = run1.spill["complete_until"]
    assert held is not None
    mid = cleanup_checkpoint(spark, ck)
    assert mid.restarted and mid.rows_in == 0 and mid.results > 0
    assert mid.spill["late_results"] == mid.results
    assert mid.spill["complete_until"] is None or mid.spill["complete_until"] > held
    _bring_back(tmp_path / "in")
    run2 = run_files(spark, sql, srcs, ck, out, partitions=2, max_files_per_trigger=1,
                     spill=spill)
    assert run2.spill["cleanups"] == mid.spill["cleanups"]  # none at the end of input
    assert run2.spill["complete_until"] is not None
    end = cleanup_checkpoint(spark, ck)
    assert end.results > 0 and end.spill["complete_until"] is None
    got = ds.dataset(out).to_table()
    local = adaptcq.run(sql, srcs)
    assert _multiset(got) == _multiset(local.table)
    assert sum(got.column("_late").to_pylist()) == mid.results + end.results
    for manifest in Path(ck, "spill").glob("group-*/manifest.json"):
        assert json.loads(manifest.read_text())["events"] == []
    assert list(Path(ck, "spill").glob("group-*/*.arrow")) == []
    assert cleanup_checkpoint(spark, ck).results == 0
    from adaptcq.cli import main  # late results go to the run's own output, nowhere else
    assert main(["cleanup", ck, "--output", str(tmp_path / "elsewhere")]) == 1


def test_a_running_query_cleans_up_when_signalled(spark, tmp_path):
    """``continuous_query(..., end_of_input=F)`` spilling with ``cleanup="off"``: nothing
    is cleaned up until ``signal_cleanup(F)``; the micro-batch of the marker produces what
    was held back so far (half the input), more input is held back again, and after the
    end of input a second marker produces the rest. Together: the local runtime's
    results, each once."""
    from adaptcq.runtime.spark import continuous_query, signal_cleanup, signal_end
    srcs = _files(tmp_path / "in", 800, 4)
    _hold_back(tmp_path / "in")
    streams = {n: spark.readStream.schema(spark.read.parquet(p).schema)
               .option("pathGlobFilter", "*.parquet").parquet(p) for n, p in srcs.items()}
    ctl = tmp_path / "ctl"
    ctl.mkdir()
    res = continuous_query(spark, SQL, streams, partitions=2, end_of_input=str(ctl),
                           spill={"strategy": "global-penalty", "memory": "60kB",
                                  "every": 10, "partitions": 16, "cleanup": "off",
                                  "directory": str(tmp_path / "spill")})
    name = "adaptcq_spill_signalled"
    q = res.writeStream.format("memory").queryName(name).start()

    def late() -> int:
        q.processAllAvailable()
        return spark.table(name).where("_late").count()

    try:
        before = late()
        signal_cleanup(ctl)
        first = late()
        _bring_back(tmp_path / "in")
        held = late()
        signal_end(ctl)
        ended = late()
        signal_cleanup(ctl)
        last = late()
    finally:
        q.stop()
    assert before == 0 and first > 0  # held back until the first marker
    assert held == ended == first and last > ended  # the rest at the second
    got = spark.table(name).toArrow()
    assert _multiset(got.select(["a", "b", "c"])) == _multiset(
        adaptcq.run(SQL, srcs).table.select(["a", "b", "c"]))


@pytest.mark.parametrize("spill", [None, {"strategy": "bottom-up", "memory": "50kB"}])
def test_a_run_with_no_result_writes_an_empty_output(spark, tmp_path, spill):
    """Inputs whose keys never meet: the run succeeds with no result and leaves an empty
    Parquet file with the results' columns (it used to fail looking them up in the side
    outputs' frame: found by a helper's fuzzing)."""
    from adaptcq.runtime.spark import run_files
    srcs = {}
    for name, base in (("A", 0), ("B", 1000)):  # disjoint join keys
        d = tmp_path / "in" / name
        d.mkdir(parents=True)
        pq.write_table(pa.table({"ts": [k * 0.5 for k in range(40)], "id": list(range(40)),
                                 "x": [base + k % 5 for k in range(40)]}), d / "part-0.parquet")
        srcs[name] = str(d)
    sql = ("SELECT A.id AS a, B.id AS b FROM A [RANGE 10 SECONDS], B [RANGE 10 SECONDS] "
           "WHERE A.x = B.x")
    out = tmp_path / "out"
    run = run_files(spark, sql, srcs, str(tmp_path / "ck"), str(out), partitions=2,
                    **({"spill": spill} if spill else {}))
    assert run.results == 0
    got = ds.dataset(str(out)).to_table()
    assert got.num_rows == 0
    assert got.column_names == ["a", "b", "_sign", "_ts", *(["_late"] if spill else [])]
    assert got.schema.field("_ts").type == pa.float64()  # as the input's times


def test_cleanup_of_a_checkpoint_refuses_what_holds_nothing_back(tmp_path):
    """``adaptcq cleanup CHECKPOINT`` names why it cannot run, before Spark starts."""
    from adaptcq.cli import main
    from adaptcq.runtime.spark import FINGERPRINT, prepare_cleanup
    with pytest.raises(AdaptcqError, match="not the checkpoint of a Spark run"):
        prepare_cleanup(tmp_path)
    ck = tmp_path / "ck"
    (ck / "query" / "commits").mkdir(parents=True)
    (ck / FINGERPRINT).write_text(json.dumps({"options": {}}))
    with pytest.raises(AdaptcqError, match="does not spill"):
        prepare_cleanup(ck)
    (ck / FINGERPRINT).write_text(json.dumps({"options": {"spill": {"strategy": "x"}}}))
    with pytest.raises(AdaptcqError, match="no micro-batch of its run was completed"):
        prepare_cleanup(ck)
    (ck / "query" / "commits" / "0").write_text("v1\n")
    with pytest.raises(AdaptcqError, match="does not record its query text as given"):
        prepare_cleanup(ck)  # (a checkpoint of an earlier version)
    assert main(["cleanup", str(ck), "--format", "csv"]) == 1  # a Spark output is Parquet
    assert main(["cleanup", str(tmp_path)]) == 1  # a spill folder needs --output
    assert main(["cleanup", str(tmp_path), "--output", "x.parquet", "--master",
                 "local[1]"]) == 1
    # (the embedded default query; refused before Spark starts)
    assert main(["run", "--engine", "spark", "--spill", "bottom-up", "--memory", "1MB",
                 "--cleanup", "off"]) == 1


def test_spilling_on_spark_refuses_what_it_cannot_do(spark, tmp_path, monkeypatch):
    from pyspark import SparkConf

    from adaptcq.runtime.spark import run_files
    srcs = _files(tmp_path / "in", 40, 1)
    spec = SparkConf(loadDefaults=False).set("spark.speculation", "true")
    with monkeypatch.context() as m:
        m.setattr(spark.sparkContext, "getConf", lambda: spec)
        with pytest.raises(AdaptcqError, match="refused with spark.speculation=true"):
            run_files(spark, SQL, srcs, str(tmp_path / "ck4"), str(tmp_path / "out4"),
                      spill={"strategy": "bottom-up", "memory": "1MB"})
    with pytest.raises(AdaptcqError, match="not by --executor mjoin"):
        run_files(spark, SQL, srcs, str(tmp_path / "ck"), str(tmp_path / "out"),
                  executor="mjoin", spill={"strategy": "bottom-up", "memory": "1MB"})
    with pytest.raises(AdaptcqError, match="spills into its checkpoint"):
        run_files(spark, SQL, srcs, str(tmp_path / "ck3"), str(tmp_path / "out3"),
                  spill={"strategy": "bottom-up", "memory": "1MB", "directory": "x"})
    with pytest.raises(AdaptcqError, match="append mode only"):
        run_files(spark, SQL, srcs, str(tmp_path / "ck2"), str(tmp_path / "out2"),
                  mode="retract", spill={"strategy": "bottom-up", "memory": "1MB"})


def test_a_groups_late_results_leave_as_arrow_when_typed_as_the_output():
    """A spilling group's late results of a batch clean-up: a table whose columns have the
    output's types leaves as Arrow (``late_tables``), another as rows with the step's
    results (``PartitionGroup._emit_late``)."""
    import types

    from adaptcq.runtime.spark_group import PartitionGroup
    schema = pa.schema([("x", pa.int64()), ("_sign", pa.int8()), ("_ts", pa.int64()),
                        ("_late", pa.bool_())])
    group, rows = types.SimpleNamespace(late_tables=[]), []
    typed = pa.table([pa.array([1, 2]), pa.array([1, 1], pa.int8()), pa.array([5, 6]),
                      pa.array([True, True])], names=schema.names)
    PartitionGroup._emit_late(group, schema, rows, typed)
    assert group.late_tables == [typed] and rows == []
    other = typed.set_column(0, "x", typed.column(0).cast(pa.int32()))
    PartitionGroup._emit_late(group, schema, rows, other)
    assert group.late_tables == [typed] and rows == [(1, 1, 5, True), (2, 1, 6, True)]


@pytest.mark.parametrize("restarted", [False, True])
def test_a_restarted_runs_summary_says_its_spill_figures_are_the_checkpoints_totals(restarted):
    """The groups keep their spill counters in the checkpoint's state, so a second
    ``adaptcq cleanup`` (which writes nothing) showed the first one's late results as if it had
    produced them; the summary now says the figures are the checkpoint's totals."""
    from rich.console import Console

    from adaptcq.runtime.spark import SparkRun
    from adaptcq.runtime.spark_cli import summary_table
    figures = dict.fromkeys((
        "spills", "partition_groups_spilled", "spilled_bytes_model", "spill_file_bytes",
        "cleanups", "cleanup_cpu_seconds", "end_cleanup_cpu_seconds", "late_results",
        "cleanup_handovers", "cleanup_writebacks", "cleanup_writeback_bytes_model",
        "memory_model_now"), 0)
    figures.update(late_results=7, first_pending_ns=None, strategy="global-penalty",
                   memory=1000, budget=500)
    group = {"updates": 1, "peak_state_tuples": 1, "peak_state_bytes": 1, "spill": figures}
    run = SparkRun(groups={0: group}, restarted=restarted)
    console = Console(width=200, record=True)
    console.print(summary_table(run, argparse.Namespace(executor="mjoin", mode="append",
                                                        checkpoint="ck"), "local[1]"))
    text = console.export_text()
    assert "late results (produced by clean-ups)" in text
    assert ("totals of every run of this checkpoint" in text) == restarted
