"""Many queries in one Spark job (docs/cacq-spark.md): each query's output equals the local
``adaptcq.Engine``'s (``runtime.multi``) for the same inputs and control stream.

The partition groups are first tested without Spark: the split's packets are built here,
fed to ``_QuerySetGroup`` micro-batch by micro-batch, with the group restored from its
pickled state between batches. Then three Spark runs on the shared local[2] session
(conftest.py): a control stream registering and removing queries in P=2 groups, a stop and
restart from the checkpoint, and a query set with no common attribute class (one group,
with the warning) through the command line.
"""

from __future__ import annotations

import itertools
import json
import os
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import adaptcq
from adaptcq.errors import AdaptcqError, OptionError
from adaptcq.query.cql import parse_query
from adaptcq.runtime.local import rows_to_batch
from adaptcq.runtime.multi import Engine
from adaptcq.runtime.spark import SplitWarning
from adaptcq.runtime.spark_multi import (
    PartitionPlan,
    PartitionWarning,
    partition_refusal,
    plan_partitions,
    run_query_files,
)
from adaptcq.stream import eventtime as et

JOIN3 = ("SELECT R.id AS rid, S.id AS sid, T.id AS tid, R.a AS a "
         "FROM R [RANGE 1 SECONDS], S [RANGE 1.5 SECONDS], T [RANGE 1 SECONDS] "
         "WHERE R.a = S.a AND S.a = T.a AND S.x > 1")
JOIN2 = ("SELECT R.id AS rid, S.id AS sid FROM R [RANGE 2 SECONDS], S [RANGE 1 SECONDS] "
         "WHERE R.a = S.a AND R.x < 3")
SELECT = "SELECT S.id, S.b, S.ts FROM S [RANGE 1 SECONDS] WHERE S.b > 2"
OTHER = ("SELECT R.id AS rid, S.id AS sid FROM R [RANGE 1 SECONDS], S [RANGE 1 SECONDS] "
         "WHERE R.b = S.b")  # joins on b: does not equate the partition columns (a)
COLS = {"ts": "number", "id": "number", "a": "number", "b": "number", "x": "number"}
KINDS = {s: dict(COLS) for s in "RST"}


def _control(*rows):
    return [dict(zip(("ts", "action", "query_id", "sql"), r, strict=True)) for r in rows]


CONTROL = _control((None, "register", "j3", JOIN3), (2.0, "register", "j2", JOIN2),
                   (3.5, "register", "sel", SELECT), (6.0, "deregister", "j2", None),
                   (None, "deregister", "j3", None))  # after all data: time does not advance


# ----- no Spark needed ---------------------------------------------------------------------------

def _q(sql):
    return parse_query(sql, KINDS)


def test_partition_plan_across_queries():
    cols = {s: list(COLS) for s in "RST"}
    plan = plan_partitions({"j3": _q(JOIN3), "j2": _q(JOIN2), "sel": _q(SELECT)}, cols, 4,
                           timestamp="ts")
    assert plan.groups == 4 and plan.columns == {"R": "a", "S": "a", "T": "a"}
    assert partition_refusal(_q(SELECT), plan) is None        # one stream: any partitioning
    assert partition_refusal(_q(JOIN2), plan) is None
    why = partition_refusal(_q(OTHER), plan)
    assert "does not equate the partition columns (R.a = S.a)" in why
    rows = partition_refusal(_q(JOIN2.replace("S [RANGE 1 SECONDS]", "S [ROWS 3]")), plan)
    assert "[ROWS n]" in rows
    # Two queries joining on different columns: no one choice, one group and the reason.
    one = plan_partitions({"j2": _q(JOIN2), "o": _q(OTHER)}, cols, 4)
    assert one.groups == 1 and "no choice of one column per source" in one.reason
    assert "j2 equates" in one.reason and "o equates" in one.reason
    # A chain has no class spanning its streams.
    chain = plan_partitions({"c": _q("SELECT R.id FROM R, S, T WHERE R.a = S.a AND S.b = T.b")},
                            cols, 4)
    assert chain.groups == 1 and "query c has no join attribute shared by all" in chain.reason
    # Only selections: a column of the same name where one source is constrained, and
    # partition_by for sources no query joins yet.
    sel = plan_partitions({"s": _q(SELECT), "j": _q("SELECT * FROM R, S WHERE R.b = S.b")},
                          cols, 2, timestamp="ts")
    assert sel.columns == {"R": "b", "S": "b", "T": "b"} and "T.b" in sel.chosen
    forced = plan_partitions({"s": _q(SELECT)}, cols, 2, partition_by={"S": "x"})
    assert forced.columns["S"] == "x"
    with pytest.raises(OptionError, match="not equated by every query"):
        plan_partitions({"j2": _q(JOIN2)}, cols, 2, partition_by={"R": "b"})
    with pytest.raises(OptionError, match="no column 'zz'"):
        plan_partitions({}, cols, 2, partition_by={"R": "zz"})
    # Several classes: the one all queries share is found.
    both = "SELECT R.id FROM R, S WHERE R.a = S.a AND R.b = S.b"
    plan = plan_partitions({"q": _q(both), "o": _q(OTHER)}, cols, 2)
    assert plan.columns["R"] == "b" and plan.columns["S"] == "b"


def _workload(seed: int, n: int = 150, files: int = 2):
    """Random streams (timestamp ties, duplicate and NULL keys), each cut into ``files``
    consecutive pieces."""
    rng = np.random.default_rng(seed)
    out = {}
    for k, name in enumerate("RST"):
        m = n + 30 * k
        ts = np.sort(np.round(rng.uniform(0, 8, m), 1))
        a = rng.integers(0, 5, m).astype(object)
        a[rng.random(m) < 0.05] = None
        t = pa.table({"ts": pa.array(ts, pa.float64()), "id": pa.array(np.arange(m), pa.int64()),
                      "a": pa.array(list(a), pa.int64()),
                      "b": pa.array(rng.integers(0, 5, m), pa.int64()),
                      "x": pa.array(rng.integers(0, 4, m), pa.int64())})
        cuts = np.linspace(0, m, files + 1).astype(int)
        out[name] = [t.slice(a_, b_ - a_) for a_, b_ in itertools.pairwise(cuts)]
    return out


def _local(tables, control, mode, queries=None):
    eng = Engine(tables, "ts", mode=mode)
    for qid, sql in (queries or {}).items():
        eng.register(sql, query_id=qid)
    eng.load_control(control)
    eng.run()
    return eng


def _counter(table: pa.Table) -> Counter:
    cols = []
    for c in table.column_names:
        vals = table.column(c).to_pylist()
        if c == "_ts" and pa.types.is_floating(table.column(c).type):
            vals = [round(v, 9) for v in vals]
        cols.append(vals)
    return Counter(zip(*cols, strict=True))


def _config(plan: PartitionPlan, mode: str):
    from adaptcq.runtime.spark_multi import _QSConfig
    return _QSConfig(
        qid=f"test-{id(plan)}-{mode}", sources=list("RST"), schemas=KINDS,
        stream_columns=[], mode=mode, routing="tickets", routing_options={}, seed=0,
        capacity=None, routing_epoch=None, udfs={}, groups=plan.groups,
        keys=list(range(plan.groups)), partition=plan, lateness=0.0, lateness_ns=0,
        timestamp="ts", unit=None, ts_kinds=["float"] * 3)


def _simulate(pieces, control_batches, plan: PartitionPlan, mode: str):
    """The split and the groups, in Python: micro-batch k holds piece k of every stream and
    the control events of ``control_batches[k]``; every group is restored from its pickled
    state after every micro-batch. Returns ({query id: rows}, the groups)."""
    from adaptcq.runtime.spark_multi import _QuerySetGroup
    cfg = _config(plan, mode)
    groups = [_QuerySetGroup.new(cfg) for _ in range(plan.groups)]
    out: dict[str, list] = {}
    start = dict.fromkeys("RST", 0)
    n_batches = max(len(next(iter(pieces.values()))), len(control_batches))
    for b in range(n_batches + 1):
        end = b == n_batches
        per_group = [[[], [], [], [], []] for _ in groups]  # streams, ts, o1, o2, rows
        maxima = []
        for i, name in enumerate("RST"):
            if end or b >= len(pieces[name]) or not pieces[name][b].num_rows:
                continue
            t = pieces[name][b]
            ns = et.to_nanoseconds(t.column("ts"), None, name, "ts").tolist()
            maxima.append((i, max(ns), t.num_rows))
            col = t.column_names.index(plan.columns[name]) if plan.groups > 1 else None
            for k, row in enumerate(zip(*(t.column(c).to_pylist() for c in t.column_names),
                                        strict=True)):
                g = 0 if col is None or row[col] is None else hash(float(row[col])) % len(groups)
                for lst, v in zip(per_group[g], (i, ns[k], name, start[name] + k, row),
                                  strict=True):
                    lst.append(v)
            start[name] += t.num_rows
        ctl = control_batches[b] if b < len(control_batches) else []
        for g, eng in enumerate(groups):
            streams, tss, o1, o2, rows = per_group[g]
            packet = (end, maxima, streams, tss, None, o1, o2, rows, list(ctl))
            res, _ = eng.step(cfg, [packet])
            for qid, r in res.items():
                out.setdefault(qid, []).extend(r)
            groups[g] = _QuerySetGroup.loads(cfg, eng.dumps())
    return out, groups


def _events(control, offset: int = 0):
    """The control rows as the split delivers them (times in int64 ns, as the local
    Engine converts them)."""
    ref = Engine({n: pa.schema([(c, pa.float64()) for c in COLS]).empty_table() for n in "RST"},
                 "ts")
    ref.load_control(control)
    return [(e.ts, "ctl", offset + k, e.action, e.query_id, e.sql, None)
            for k, e in enumerate(ref.control)]


@pytest.mark.parametrize("mode", ["append", "retract"])
def test_partition_groups_equal_the_local_engine(mode):
    """Three queries registered at different times and one removed mid-way, in 2 groups
    restored after every micro-batch: every query's rows equal the local Engine's; a query
    arriving later that does not equate the partition columns is refused and the others
    run on; a control row whose time has passed takes effect on arrival."""
    pieces = _workload(7, files=4)
    tables = {k: pa.concat_tables(v) for k, v in pieces.items()}
    plan = plan_partitions({"j3": _q(JOIN3), "j2": _q(JOIN2)}, {s: list(COLS) for s in "RST"},
                           2, timestamp="ts")
    assert plan.groups == 2
    late = _control((7.0, "register", "other", OTHER), (0.5, "register", "late", SELECT))
    out, groups = _simulate(pieces, [_events(CONTROL), [], _events(late, 100)], plan, mode)
    local = _local(tables, CONTROL, mode)
    for qid in ("j3", "j2", "sel"):
        h = local.handles[qid]
        got = _counter(pa.Table.from_batches([rows_to_batch(out.get(qid, []), h.schema, None)]))
        assert got == _counter(h.table()), qid
        assert sum(got.values()) > 5, qid
    for eng in groups:
        assert eng.queries["j2"]["state"] == "removed"
        assert eng.queries["j3"]["state"] == "removed" and eng.queries["sel"]["state"] == "running"
        assert eng.queries["other"]["state"] == "refused"
        assert "does not equate the partition columns" in eng.queries["other"]["error"]
        assert eng.queries["late"]["state"] == "running" and "arrived after" in \
            eng.queries["late"]["late"]
    assert "other" not in out


def test_control_times_convert_as_the_local_engine_does():
    import datetime
    from types import SimpleNamespace

    from adaptcq.runtime.spark_multi import CONTROL_KINDS, _control_time
    ts = Engine._ts
    s, ms = SimpleNamespace(unit=None), SimpleNamespace(unit="ms")
    assert _control_time(CONTROL_KINDS["float"], 2.3, "register", None) == ts(s, 2.3)
    assert _control_time(CONTROL_KINDS["int"], 1700000000123, "register", "ms") == \
        ts(ms, 1700000000123)
    at = datetime.datetime(2024, 5, 1, 12, 0, 0, 123456)
    us = (at - datetime.datetime(1970, 1, 1)) // datetime.timedelta(microseconds=1)
    assert _control_time(CONTROL_KINDS["us"], us, "register", None) == ts(s, at)
    assert _control_time(CONTROL_KINDS["ns"], 5, "register", None) == 5
    assert _control_time(CONTROL_KINDS["float"], None, "register", None) == -float("inf")
    assert _control_time(CONTROL_KINDS["float"], None, "deregister", None) == float("inf")


def test_a_removal_after_all_data_comes_after_the_last_deletions():
    """A group whose rows end early still emits, before a removal at the end of the input
    (null ts), the deletions the local engine emits when the last arrival of any group
    passes them."""
    schema = pa.schema([(c, pa.float64() if c == "ts" else pa.int64()) for c in COLS])
    s = pa.table({"ts": [1.0, 1.0, 3.0, 5.0], "id": [0, 1, 2, 3], "a": [1, 2, 2, 2],
                  "b": [3, 3, 3, 3], "x": [0, 0, 0, 0]}, schema=schema)
    pieces = {"R": [schema.empty_table()], "S": [s], "T": [schema.empty_table()]}
    control = _control((None, "register", "sel", SELECT), (None, "deregister", "sel", None))
    plan = PartitionPlan(2, dict.fromkeys("RST", "a"))
    out, _ = _simulate(pieces, [_events(control)], plan, "retract")
    local = _local({k: v[0] for k, v in pieces.items()}, control, "retract")
    h = local.handles["sel"]
    got = _counter(pa.Table.from_batches([rows_to_batch(out["sel"], h.schema, None)]))
    assert got == _counter(h.table())
    assert -1 in {r[-2] for r in got}


def test_control_errors_are_recorded_not_fatal():
    plan = PartitionPlan(1, dict.fromkeys("RST"))
    bad = [(-float("inf"), "ctl", 0, "register", "q", "SELECT nope FROM S", None),
           (-float("inf"), "ctl", 1, "register", "q", SELECT, None),
           (1e9, "ctl", 2, "deregister", "ghost", None, None),
           (0, "ctl", 3, None, None, None, "control stream row 3: action 'x'; choose ...")]
    pieces = _workload(3, n=40, files=1)
    _, groups = _simulate(pieces, [bad], plan, "append")
    eng = groups[0]
    assert eng.queries["q"]["state"] == "refused" and "nope" in eng.queries["q"]["error"]
    assert any("registered twice" in e for e in eng.control_errors)
    assert any("'ghost', which no control row registers" in e for e in eng.control_errors)
    assert any("action 'x'" in e for e in eng.control_errors)


# ----- Spark ---------------------------------------------------------------------------------------

def _write(root: Path, pieces: dict, start: int = 0) -> dict[str, str]:
    """Piece k of each stream to ``<stream>/part-<k>.parquet`` (modification times
    increasing with k: the file source takes them in that order, one per micro-batch)."""
    for name, parts in pieces.items():
        d = root / name
        d.mkdir(parents=True, exist_ok=True)
        for k, t in enumerate(parts, start):
            p = d / f"part-{k}.parquet"
            pq.write_table(t, p)
            os.utime(p, (1_600_000_000 + 10 * k, 1_600_000_000 + 10 * k))
    return {name: str(root / name) for name in pieces}


def _assert_queries_equal(local: Engine, out: Path, min_rows: int = 5):
    for qid, h in local.handles.items():
        want, got = _counter(h.table()), _counter(pq.read_table(out / f"query_id={qid}"))
        assert sum(want.values()) >= min_rows, qid
        assert got == want, (f"{qid}: local {sum(want.values())} rows, spark "
                             f"{sum(got.values())}; only local {list((want - got).items())[:3]}"
                             f"; only spark {list((got - want).items())[:3]}")


def test_control_stream_on_spark_equals_local(spark, tmp_path):
    """Three queries registered at different times through the control stream (two joins
    sharing the attribute class a, one selection), one removed mid-way, in 2 groups: j3 is
    given before the data (it chooses the partition columns), the others come in a
    streaming control DataFrame (a folder of control files) carried with the data."""
    pieces = _workload(1, files=2)
    srcs = _write(tmp_path / "in", pieces)
    (tmp_path / "control").mkdir()
    pq.write_table(pa.Table.from_pylist(CONTROL[1:]), tmp_path / "control" / "c0.parquet")
    control = spark.readStream.schema("ts double, action string, query_id string, sql string") \
        .parquet(str(tmp_path / "control"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", SplitWarning)
        warnings.simplefilter("error", PartitionWarning)
        run = run_query_files(spark, srcs, {"j3": JOIN3}, control, checkpoint=tmp_path / "ck",
                              output=tmp_path / "out", mode="retract", partitions=2,
                              max_files_per_trigger=1)
    local = _local(srcs, CONTROL, "retract")
    _assert_queries_equal(local, tmp_path / "out")
    assert len(run.groups) == 2 and run.plan.columns == {"R": "a", "S": "a", "T": "a"}
    assert {q: v["state"] for q, v in run.queries.items()} == {
        "j3": "removed", "j2": "removed", "sel": "running"}
    assert run.queries["j3"]["rows"] == local.handles["j3"].emitted
    status = json.loads((tmp_path / "out" / "_queries.json").read_text())
    assert status["j2"]["state"] == "removed"
    assert run.batches >= 3 and run.pending == 0 and run.rejected == 0


def test_restart_from_checkpoint_continues_the_query_set(spark, tmp_path):
    """Stopped after the first files and restarted from the checkpoint: the output equals
    an uninterrupted run's, including a query registered after the restart point; a
    different query set is refused."""
    pieces = _workload(2, files=4)
    srcs = _write(tmp_path / "in", {k: v[:2] for k, v in pieces.items()})
    control = CONTROL + _control((6.5, "register", "after", JOIN2.replace("R.x < 3", "S.b < 4")))
    ck, out = tmp_path / "ck", tmp_path / "out"
    kw = {"checkpoint": ck, "output": out, "mode": "retract", "partitions": 2,
          "max_files_per_trigger": 1}
    run1 = run_query_files(spark, srcs, None, control, finish=False, **kw)
    assert run1.pending > 0 and run1.queries["after"]["state"] == "pending"
    assert max(pa.concat_tables(v[:2]).column("ts").to_pylist()[-1]
               for v in pieces.values()) < 6.5
    # A clean-up marker (for spilling queries: runtime.spark.signal_cleanup) in the
    # end-of-input folder is no end of input for a query set: a restart that reads it alone
    # would have closed the input, and the rest of the files would have been rejected.
    from adaptcq.runtime.spark import signal_cleanup
    signal_cleanup(ck / "end_of_input")
    assert run_query_files(spark, srcs, None, control, finish=False, **kw).rejected == 0
    _write(tmp_path / "in", {k: v[2:] for k, v in pieces.items()}, start=2)
    with pytest.raises(AdaptcqError, match="different query set"):
        run_query_files(spark, srcs, None, control[:-1], **kw)
    run2 = run_query_files(spark, srcs, None, control, **{**kw, "max_files_per_trigger": None})
    assert run2.restarted and run2.queries["after"]["state"] == "running"
    assert run2.rows_in == sum(t.num_rows for v in pieces.values() for t in v[2:])
    _assert_queries_equal(_local(srcs, control, "retract"), out)


def test_restart_under_other_shuffle_partitions_continues_the_query_set(spark, tmp_path):
    """The groups' grouping keys are kept in the checkpoint: a restart under another
    spark.sql.shuffle.partitions (Spark restarts with the checkpoint's) gives every group
    its own state back, and the output equals an uninterrupted run's."""
    pieces = _workload(3, n=100, files=2)
    srcs = _write(tmp_path / "in", {k: v[:1] for k, v in pieces.items()})
    kw = {"checkpoint": tmp_path / "ck", "output": tmp_path / "out", "mode": "retract",
          "partitions": 2, "max_files_per_trigger": 1}
    assert spark.conf.get("spark.sql.shuffle.partitions") == "2"
    run1 = run_query_files(spark, srcs, {"j3": JOIN3}, finish=False, **kw)
    _write(tmp_path / "in", {k: v[1:] for k, v in pieces.items()}, start=1)
    spark.conf.set("spark.sql.shuffle.partitions", "4")
    try:
        run2 = run_query_files(spark, srcs, {"j3": JOIN3}, **kw)
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", "2")
    local = Engine(srcs, "ts", mode="retract")
    local.register(JOIN3, query_id="j3")
    local.run()
    _assert_queries_equal(local, tmp_path / "out")
    assert run2.restarted and sorted(run2.groups) == sorted(run1.groups)


def test_no_common_attribute_class_runs_in_one_group_from_the_cli(spark, tmp_path, capsys):
    """`adaptcq run --engine spark --executor eddy`: queries joining on different columns
    run in one group with a warning naming why; outputs equal the local Engine's."""
    from adaptcq.cli import main
    srcs = _write(tmp_path / "in", _workload(3, n=120, files=2))
    (tmp_path / "q1.sql").write_text(JOIN2)
    control = tmp_path / "control.parquet"
    pq.write_table(pa.Table.from_pylist(_control((3.0, "register", "o", OTHER))), control)
    argv = ["run", "--engine", "spark", "--executor", "eddy", "--master", "local[2]",
            "--partitions", "2", "--sql", f"@{tmp_path / 'q1.sql'}", "--queries", str(control),
            *[f"--input={k}={v}" for k, v in srcs.items()], "--output", str(tmp_path / "out"),
            "--summary-json", str(tmp_path / "summary.json")]
    assert main(argv) == 0
    console = capsys.readouterr().out
    assert "running in one partition group" in console and "no choice of one column" in console
    doc = json.loads((tmp_path / "summary.json").read_text())
    assert doc["partition_groups"] == 1 and set(doc["queries"]) == {"q1", "o"}
    _assert_queries_equal(_local(srcs, str(control), "append", {"q1": JOIN2}), tmp_path / "out")


SELFJOIN = ("SELECT r1.id AS x, r2.id AS y FROM R [ROWS 2] AS r1, R [ROWS 2] AS r2 "
            "WHERE r1.a = r2.a")


def _selfjoin_groups_and_local(cut: int, control):
    """R with two rows at time 3, cut into micro-batches at ``cut`` (0: one), S and T
    empty, through one group and through the local Engine: (group output, groups, the
    local Engine's handle of the self-join), the local query checked to have failed at
    time 3 and the groups' rows checked equal to its."""
    R = pa.table({"ts": pa.array([1.0, 2.0, 3.0, 3.0, 4.0]), "id": pa.array(range(5)),
                  "a": pa.array([1] * 5), "b": pa.array([0] * 5), "x": pa.array([0] * 5)})
    empty = R.slice(0, 0)
    parts = [R.slice(0, cut), R.slice(cut)] if cut else [R]
    pieces = {"R": parts, "S": [empty] * len(parts), "T": [empty] * len(parts)}
    plan = plan_partitions({"self": _q(SELFJOIN)}, {s: list(COLS) for s in "RST"}, 1,
                           timestamp="ts")
    out, groups = _simulate(pieces, [_events(control)], plan, "append")
    h = _local({"R": R, "S": empty, "T": empty}, control, "append").handles["self"]
    assert h.state == "failed" and "same time (3 s" in h.error
    got = _counter(pa.Table.from_batches([rows_to_batch(out.get("self", []), h.schema, None)]))
    assert got == _counter(h.table())
    return got, groups, h


def test_a_self_join_over_rows_windows_stops_at_rows_of_one_time_as_locally():
    """A query joining R with itself over [ROWS n] windows stops, failed, just before two
    rows of R with one time, in the Spark groups as in the local Engine
    (``runtime.multi.first_tie``): the rows before it equal the local Engine's, and the
    query registered beside it runs on."""
    control = _control((None, "register", "self", SELFJOIN), (None, "register", "sel", SELECT))
    got, groups, h = _selfjoin_groups_and_local(2, control)
    assert sum(got.values()) == 4  # up to time 2
    info = groups[0].queries["self"]
    assert info["state"] == "failed" and info["error"] == h.error
    assert groups[0].queries["sel"]["state"] == "running"


def test_a_self_join_registered_in_the_micro_batch_of_its_tie_stops_there_too():
    """The query registered by a control row of the same micro-batch as the two rows of
    one time: the groups watch it from its registration on, as the local Engine does."""
    _, groups, _ = _selfjoin_groups_and_local(0, _control((1.5, "register", "self", SELFJOIN)))
    assert groups[0].queries["self"]["state"] == "failed"


def test_rows_windows_and_ties_of_two_sources_stop_as_locally():
    """A query whose FROM orders T before R, T with a [ROWS 1] window, stops before rows of
    R and T with one time (the engines take R's first: their order of sources), in the
    Spark groups as in the local Engine (``runtime.multi.tie_watch``); the query with the
    engines' order runs on and equals ``adaptcq.run``."""
    def table(ts):
        n = len(ts)
        return pa.table({"ts": pa.array(ts, pa.float64()), "id": pa.array(range(n)),
                         "a": pa.array([1] * n), "b": pa.array([0] * n),
                         "x": pa.array([0] * n)})
    tabs = {"R": table([1.0, 3.0]), "S": table([]), "T": table([2.0, 3.0, 3.0])}
    sqls = {"tr": "SELECT T.id AS t, R.id AS r FROM T [ROWS 1], R WHERE T.a = R.a",
            "rt": "SELECT T.id AS t, R.id AS r FROM R, T [ROWS 1] WHERE T.a = R.a"}
    control = _control(*((None, "register", q, sql) for q, sql in sqls.items()))
    plan = plan_partitions({q: _q(sql) for q, sql in sqls.items()},
                           {s: list(COLS) for s in "RST"}, 1, timestamp="ts")
    out, groups = _simulate({s: [t] for s, t in tabs.items()}, [_events(control)], plan,
                            "append")
    eng = _local(tabs, control, "append")
    tr, rt = eng.handles["tr"], eng.handles["rt"]
    assert tr.state == "failed" and "sources R and T have the same time (3 s" in tr.error
    assert groups[0].queries["tr"]["state"] == "failed"
    assert groups[0].queries["tr"]["error"] == tr.error
    assert rt.state == groups[0].queries["rt"]["state"] == "running"
    want = adaptcq.run(sqls["rt"], {"R": tabs["R"], "T": tabs["T"]}, executor="mjoin").table
    assert _counter(rt.table()) == _counter(want)
    got = pa.Table.from_batches([rows_to_batch(out.get("rt", []), rt.schema, None)])
    assert _counter(got) == _counter(want)
