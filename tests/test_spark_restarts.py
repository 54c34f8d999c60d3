"""Restarts after an end of input (docs/spark.md, "Event time across micro-batches", 5): a
CLI run ends its input; files added later are read by a run with the same checkpoint, and
the results over both runs are the local runtime's over all files.

First without Spark, as ``test_spark_groups`` runs the split and the groups: random queries
with end-of-input markers in the middle of their input, rows after each (a restart's),
groups rebuilt and caught up at random; query sets the same way. Then on the shared Spark
session: two CLI runs of one checkpoint, the second over files added since (some with an
old modification time), for MJoin and the vectorized executor, and a query set.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import math
import os
import random
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import adaptcq
from adaptcq.query.cql import parse_query
from adaptcq.runtime import spark_group as sg
from adaptcq.runtime.multi import Engine
from adaptcq.runtime.spark_split import plan_split
from conftest import examples
from test_engine_oracle import arrivals, queries
from test_spark_groups import _config, _route, _union_batch, local_output

# ----- single queries, without Spark ------------------------------------------------------------


def run_with_ends(query, plan, mode, streams, ts, rows, batches, ends, rebuild_at, rnd,
                  executor="mjoin", workers=1):
    """Micro-batches of the rows ``batches`` (lists of indices), an end-of-input marker in
    those of ``ends`` (the last always has one), groups rebuilt (``rebuild_at``) or run on
    one of ``workers`` (stale copies catch up). Returns (results, rejected rows)."""
    cfg = _config(query, plan, mode, executor=executor)
    lives = [{} for _ in range(workers)]
    stores = {g: sg.MemoryStore() for g in cfg.keys}
    out: Counter = Counter()
    rejected: list = []
    for b, idx in enumerate(batches):
        end = b in ends or b == len(batches) - 1
        packets = _route(cfg, _union_batch(query, plan, [streams[k] for k in idx],
                                           [ts[k] for k in idx], [rows[k] for k in idx],
                                           100 * b, end))
        for g in cfg.keys:
            if b in rebuild_at:
                for live in lives:
                    live.pop((cfg.qid, g), None)
            sg._LIVE = lives[rnd.randrange(workers)]
            _, res, rej, _, _ = sg.advance_group(cfg, g, stores[g], packets[g])
            if isinstance(res, pa.Table):  # the vectorized executor's output
                res = [tuple(r.values()) for r in res.to_pylist()]
            out.update(res)
            rejected += rej
    return out, rejected


def runs_of_files(streams, n_runs: int, n_batches: int, rnd) -> tuple[list, set]:
    """Rows (in the local runtime's order) cut into ``n_runs`` consecutive runs, each ending
    its input; within a run each stream's rows go to its micro-batches in order, each
    stream cut at its own points (as one stream's files reach further than another's).
    Returns (micro-batches as lists of row indices, the micro-batches that end a run)."""
    n = len(streams)
    edges = [0, *sorted(rnd.sample(range(1, n), min(n_runs - 1, n - 1))), n]
    batches, ends = [], set()
    for lo, hi in itertools.pairwise(edges):
        mine = [[] for _ in range(n_batches)]
        for s in set(streams[lo:hi]):
            idx = [k for k in range(lo, hi) if streams[k] == s]
            cuts = sorted(rnd.choices(range(len(idx) + 1), k=n_batches - 1))
            for b, (a, z) in enumerate(itertools.pairwise([0, *cuts, len(idx)])):
                mine[b] += idx[a:z]
        batches += [sorted(m) for m in mine]
        ends.add(len(batches) - 1)
    return batches, ends


@settings(max_examples=examples(60), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data(), mode=st.sampled_from(["append", "retract"]), seed=st.integers(0, 10**6),
       executor=st.sampled_from(["mjoin", "vector"]))
def test_rows_after_an_end_of_input_are_ordered_again(data, mode, seed, executor):
    """Runs that end their input, each followed by a restart over files added since (rows
    in the local runtime's order across runs; within a run, each stream's files reach
    their own times): none is rejected, and the groups (shares with replication, rebuilds,
    catch-ups) give the local engine's output over all rows. Before the fix every row
    after the first end was released as it came, out of order."""
    query = data.draw(queries(max_streams=4))
    streams, ts, dicts = data.draw(arrivals(len(query.streams), max_rows=40))
    order = sorted(range(len(ts)), key=lambda k: (ts[k], streams[k]))
    streams, ts, dicts = ([streams[k] for k in order], [ts[k] for k in order],
                          [dicts[k] for k in order])
    rows = [tuple(d[c] for c in query.columns[query.aliases[i]])
            for i, d in zip(streams, dicts, strict=True)]
    rnd = random.Random(seed)
    if any(s.window.kind == "rows" for s in query.streams):
        plan = plan_split(query, 1)
    else:
        labels = [c.split(" = ")[0] for c in plan_split(query, 2).classes]
        plan = plan_split(query, None, shares={x: rnd.randint(1, 3) for x in labels})
    batches, ends = runs_of_files(streams, rnd.randint(2, 3), rnd.randint(1, 3), rnd)
    rebuild_at = set(rnd.sample(range(len(batches)), rnd.randint(0, len(batches))))
    got, rejected = run_with_ends(query, plan, mode, streams, ts, rows, batches, ends,
                                  rebuild_at, rnd, executor, workers=rnd.choice([1, 2]))
    assert not rejected
    assert got == local_output(query, mode, streams, ts, rows)


SCHEMAS = {n: {"ts": "number", "a": "number", "id": "number"} for n in "RS"}
JOIN = ("SELECT R.id AS r, S.id AS s FROM R [RANGE 2 SECONDS], S [RANGE 2 SECONDS] "
        "WHERE R.a = S.a")


@pytest.mark.parametrize("executor", ["mjoin", "vector"])
def test_a_restart_after_an_end_of_input_holds_rows_for_the_frontier(executor):
    """After an end of input at 5.0 (S's last row): a row before it, and R's row at 5.0
    itself (R comes before S at equal times, so it would precede S's row already
    processed), are rejected as arrived after end of input; rows after it wait for every
    stream's frontier as before the end, in retract mode with rebuilds between batches."""
    q = parse_query(JOIN, SCHEMAS)
    # (stream, ts, row); an end of input after the first micro-batch
    batches = [[(0, 1.0, (1, 10)), (1, 2.0, (1, 20)), (1, 5.0, (1, 21))],
               [(0, 4.0, (1, 11)), (0, 5.0, (1, 12)), (1, 5.0, (1, 22)),
                (0, 6.0, (1, 13)), (1, 9.0, (1, 23))],
               [(0, 8.0, (1, 14)), (0, 10.0, (1, 15))]]
    cfg = _config(q, plan_split(q, 1), "retract", executor=executor)
    store, out, rejected = sg.MemoryStore(), Counter(), []
    for k, rows in enumerate(batches):
        batch = _union_batch(q, plan_split(q, 1), [r[0] for r in rows], [r[1] for r in rows],
                             [r[2] for r in rows], 100 * k, k != 1)
        sg._LIVE = {}  # rebuilt from the store every micro-batch
        g, res, rej, _, _ = sg.advance_group(cfg, 100, store, _route(cfg, batch)[100])
        if isinstance(res, pa.Table):
            res = [tuple(r.values()) for r in res.to_pylist()]
        out.update(res)
        rejected += rej
        if k == 1:  # S's 9.0 holds R's rows after 9.0: the frontier rules again
            assert not g.closed and g.bound == (round(6e9), 0)
    assert sorted((r[1], r[4]) for r in rejected) == [
        (100, "arrived after end of input"), (101, "arrived after end of input")]
    kept = [r for b in batches for r in b if (r[1], r[0]) not in ((4.0, 0), (5.0, 0))]
    kept.sort(key=lambda r: (r[1], r[0]))
    want = local_output(q, "retract", [r[0] for r in kept], [r[1] for r in kept],
                        [r[2] for r in kept])
    assert out == want and sum(want.values()) >= 5


def test_a_group_closed_by_an_earlier_version_reopens():
    """A checkpoint written before restarts re-opened groups has the bound +inf and the
    frontier at the largest time plus the lateness: it is read as closed at that time, every
    stream's rows at it processed."""
    info = {"frontier": [7 + 2, 7 + 2], "bound": (math.inf, 0)}
    assert sg.reopened_bound(info, 2) == ([7, 7], (7, 1))
    info = {"frontier": [5, 9], "bound": (3, 0)}
    assert sg.reopened_bound(info, 2) == ([5, 9], (3, 0))


# ----- query sets, without Spark ----------------------------------------------------------------

def _qs_run(pieces: dict, control: dict, ends: set, mode: str, groups: int = 2):
    """``_QuerySetGroup``s over micro-batches (batch k: piece k of every stream and the
    control events ``control[k]``), an end of input in the batches of ``ends`` and the
    last, every group restored from its pickle after every micro-batch. Returns ({query
    id: rows}, rejected rows)."""
    from adaptcq.runtime.spark_multi import _QuerySetGroup, plan_partitions
    from adaptcq.stream import eventtime as et
    from test_spark_multi import _config as qs_config
    from test_spark_multi import _q
    plan = plan_partitions({"j": _q(JOIN2)}, {s: ["ts", "id", "a", "b", "x"] for s in "RST"},
                           groups, timestamp="ts")
    cfg = qs_config(plan, mode)
    engs = [_QuerySetGroup.new(cfg) for _ in range(plan.groups)]
    out: dict = {}
    rejected: list = []
    n = len(next(iter(pieces.values())))
    start = dict.fromkeys("RST", 0)
    for b in range(n):
        per = [[[], [], [], [], []] for _ in engs]
        maxima = []
        for i, name in enumerate("RST"):
            t = pieces[name][b]
            if not t.num_rows:
                continue
            ns = et.to_nanoseconds(t.column("ts"), None, name, "ts").tolist()
            maxima.append((i, max(ns), t.num_rows))
            col = t.column_names.index(plan.columns[name])
            for k, row in enumerate(zip(*(t.column(c).to_pylist() for c in t.column_names),
                                        strict=True)):
                g = 0 if row[col] is None else hash(float(row[col])) % len(engs)
                for lst, v in zip(per[g], (i, ns[k], name, start[name] + k, row), strict=True):
                    lst.append(v)
            start[name] += t.num_rows
        end = b in ends or b == n - 1
        for g, eng in enumerate(engs):
            packet = (end, maxima, *per[g][:2], None, *per[g][2:], control.get(b, []))
            res, rej = eng.step(cfg, [packet])
            rejected += rej
            for qid, r in res.items():
                out.setdefault(qid, []).extend(r)
            engs[g] = _QuerySetGroup.loads(cfg, eng.dumps())
    return out, rejected


JOIN2 = ("SELECT R.id AS rid, S.id AS sid FROM R [RANGE 2 SECONDS], S [RANGE 1 SECONDS] "
         "WHERE R.a = S.a AND R.x < 3")


@pytest.mark.parametrize("mode", ["append", "retract"])
def test_query_sets_after_an_end_of_input_equal_the_local_engine(mode):
    """A query set whose input ends twice before its last end (three runs of one
    checkpoint, each over the files added since): the eddy's results equal the local
    Engine's over all files, none rejected; a query registered at 5.0 by a control row
    of the third run waits for its time. (Before the fix the rows after the first end were
    released at once, unordered.)"""
    from adaptcq.runtime.local import rows_to_batch
    from test_spark_multi import _control, _counter, _events, _workload
    # Files of two seconds each: a run's files end before the next run's begin.
    pieces = {k: [t.filter(pa.array((t.column("ts").to_numpy() >= 2 * b)
                                    & (t.column("ts").to_numpy() < 2 * b + 2)))
                  for b in range(4)]
              for k, t in ((k, pa.concat_tables(v)) for k, v in _workload(3).items())}
    first, later = _control((None, "register", "j", JOIN2)), \
        _control((5.0, "register", "k", JOIN2))
    out, rejected = _qs_run(pieces, {0: _events(first), 2: _events(later, 10)}, {0, 2}, mode)
    assert not rejected
    control = first + later
    local = Engine({k: pa.concat_tables(v) for k, v in pieces.items()}, "ts", mode=mode)
    local.load_control(control)
    local.run()
    for qid in ("j", "k"):
        h = local.handles[qid]
        got = _counter(pa.Table.from_batches([rows_to_batch(out.get(qid, []), h.schema,
                                                            None)]))
        assert got == _counter(h.table()) and sum(got.values()) > 5, qid


def test_a_query_set_end_applies_later_control_events_and_rows_before_them_are_rejected():
    """An end of input applies the control events still waiting (a registration at 5.0
    after data that ends before 2.0): rows that arrive after it at earlier times would
    follow the event out of order, and are rejected as arrived after end of input."""
    from test_spark_multi import _control, _events, _workload
    pieces = {k: [t.filter(pa.array(t.column("ts").to_numpy() < 2)),
                  t.filter(pa.array(t.column("ts").to_numpy() >= 2))]
              for k, t in ((k, pa.concat_tables(v)) for k, v in _workload(4).items())}
    control = _control((None, "register", "j", JOIN2), (5.0, "register", "k", JOIN2))
    _, rejected = _qs_run(pieces, {0: _events(control)}, {0}, "append")
    ts = [r[3] for r in rejected]
    assert {r[4] for r in rejected} == {"arrived after end of input"}
    assert max(ts) < 5e9 and len(ts) == sum(
        int(((t.column("ts").to_numpy() >= 2) & (t.column("ts").to_numpy() < 5)).sum())
        for t in (pa.concat_tables(v) for v in _workload(4).values()))
    # A removal with no time ("after all data") applied by the end: every later row would
    # follow it, and is rejected (counted) rather than missed by the removed query.
    control = _control((None, "register", "j", JOIN2), (None, "deregister", "j", None))
    _, rejected = _qs_run(pieces, {0: _events(control)}, {0}, "append")
    assert {r[4] for r in rejected} == {"arrived after end of input"}
    assert len(rejected) == sum(t.num_rows for t in
                                (v[1] for v in pieces.values()))


# ----- the command line, without Spark ----------------------------------------------------------

def test_cleanup_of_a_mistyped_checkpoint_says_what_it_is_not(tmp_path, capsys):
    """``adaptcq cleanup DIR`` without --output: a DIR that does not exist, is a file, or
    is neither a checkpoint nor a spill folder is named as such, not told it needs
    --output (the local form's option)."""
    from adaptcq.cli import main
    (tmp_path / "f.txt").write_text("x")
    for name, says in (("ck-typo", "does not exist"), ("f.txt", "is a file"),
                       (".", "is neither a Spark checkpoint (no adaptcq.json)")):
        assert main(["cleanup", str(tmp_path / name)]) == 1
        err = capsys.readouterr().err
        assert says in err and "needs --output" not in err, err


# ----- on Spark ---------------------------------------------------------------------------------

SQL = ("SELECT R.id AS rid, S.id AS sid FROM R [RANGE 2 SECONDS], S [RANGE 2 SECONDS] "
       "WHERE R.a = S.a")


def _file(root: Path, name: str, k: int, lo: float, hi: float, mtime: float) -> str:
    rng = np.random.default_rng(10 * k + len(name))
    n = 24
    t = pa.table({"ts": np.sort(np.round(rng.uniform(lo, hi, n), 1)),
                  "id": np.arange(100 * k, 100 * k + n), "a": rng.integers(0, 3, n)})
    d = root / name
    d.mkdir(parents=True, exist_ok=True)
    pq.write_table(t, d / f"part-{k}.parquet")
    os.utime(d / f"part-{k}.parquet", (mtime, mtime))
    return str(d)


def _rows(t: pa.Table) -> Counter:
    return Counter(zip(*(t.column(c).to_pylist() for c in t.column_names), strict=True))


@pytest.mark.parametrize("executor", ["mjoin", "auto"])
def test_a_cli_run_over_files_added_after_its_end_equals_the_local_runtime(spark, tmp_path,
                                                                        executor):
    """Two CLI runs of one checkpoint, each ending its input; the second reads the files
    added since, one per micro-batch, with modification times a month older than the
    first run's files (cp -p, tar): its results complete the local runtime's over all
    files (before the fix: rows lost and extra with MJoin, 'arrivals out of time order'
    with the vectorized executor; files older than 7 days skipped unread), and its
    summary reports its own updates and the checkpoint's total apart."""
    from adaptcq.cli import main
    now = time.time()
    srcs = {n: _file(tmp_path / "in", n, 0, 0, 5, now) for n in "RS"}
    out, summ = tmp_path / "out", tmp_path / "s.json"
    argv = ["run", "--engine", "spark", "--master", "local[2]", "--partitions", "2",
            "--executor", executor, "--sql", SQL, "--input", f"R={srcs['R']}",
            "--input", f"S={srcs['S']}", "--output", str(out),
            "--checkpoint", str(tmp_path / "ck"), "--max-files-per-trigger", "1",
            "--summary-json", str(summ)]
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(argv) == 0
        first = json.loads(summ.read_text())
        old = now - 30 * 86400  # in time order among themselves (docs/spark.md)
        _file(tmp_path / "in", "R", 1, 5, 15, old)
        _file(tmp_path / "in", "S", 1, 5, 10, old)
        _file(tmp_path / "in", "S", 2, 10, 15, old + 10)
        assert main(argv) == 0
    second = json.loads(summ.read_text())
    local = adaptcq.run(SQL, srcs)
    assert second["input_rows"] == 72 and second["rejected"] == 0
    assert _rows(pq.read_table(out)) == _rows(local.table) and local.table.num_rows > 20
    assert second["updates_total"] == local.stats["updates"]
    assert first["updates"] + second["updates"] == second["updates_total"]


def test_a_query_set_over_files_added_after_its_end_equals_the_local_engine(spark, tmp_path):
    """The same for a query set (--executor eddy): two CLI runs of one checkpoint, the
    second over a file added since, equal to the local engine's run over all files."""
    from adaptcq.cli import main
    now = time.time()
    srcs = {n: _file(tmp_path / "in", n, 0, 0, 5, now) for n in "RS"}

    def run(engine: list, out: Path) -> int:
        with contextlib.redirect_stdout(io.StringIO()):
            return main(["run", *engine, "--executor", "eddy", "--sql", SQL, "--input",
                         f"R={srcs['R']}", "--input", f"S={srcs['S']}", "--output", str(out)])

    on_spark = ["--engine", "spark", "--master", "local[2]", "--partitions", "2",
                "--checkpoint", str(tmp_path / "ck")]
    assert run(on_spark, tmp_path / "out") == 0
    _file(tmp_path / "in", "R", 1, 5, 10, now + 10)
    _file(tmp_path / "in", "S", 1, 5, 10, now + 10)
    assert run(on_spark, tmp_path / "out") == 0
    assert run([], tmp_path / "local") == 0
    want = _rows(pq.read_table(tmp_path / "local" / "query_id=q1"))
    assert _rows(pq.read_table(tmp_path / "out" / "query_id=q1")) == want
    assert sum(want.values()) > 20
