"""The Spark runtime gives the local runtime's output (docs/spark.md).

Each Spark test runs a real Structured Streaming query on the shared local[2] session
(conftest.py) over Parquet files, several micro-batches per run, and compares the rows with
``adaptcq.run`` on the same files as multisets of (SELECT values, _sign, _ts).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import itertools
import json
import math
import os
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import adaptcq
from adaptcq.errors import AdaptcqError, JavaMissingError, OptionError
from adaptcq.query.cql import parse_query
from adaptcq.runtime.spark import SplitWarning, plan_split, run_files
from conftest import run_to_end

PARTITIONED = ("SELECT R.id AS rid, S.id AS sid, T.id AS tid, R.a AS a "
               "FROM R [RANGE 1 SECONDS], S [RANGE 1.5 SECONDS], T [RANGE 1 SECONDS] "
               "WHERE R.a = S.a AND S.a = T.a AND S.x > 1")
CHAIN = ("SELECT R.id AS rid, S.id AS sid, T.id AS tid "
         "FROM R [RANGE 1 SECONDS], S [RANGE 1 SECONDS], T [RANGE 2 SECONDS] "
         "WHERE R.a = S.a AND S.b = T.b")
SCHEMAS = {"R": {"ts": "number", "id": "number", "a": "number", "b": "number", "x": "number"},
           "S": {"ts": "number", "id": "number", "a": "number", "b": "number", "x": "number"},
           "T": {"ts": "number", "id": "number", "a": "number", "b": "number", "x": "number"}}


# ----- no Spark needed -----------------------------------------------------------------------

def test_missing_java_names_the_fix(monkeypatch, tmp_path):
    from adaptcq.runtime.spark_session import get_spark
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no java anywhere
    with pytest.raises(JavaMissingError) as e:
        get_spark("local[1]")
    msg = str(e.value)
    assert "Java" in msg and "openjdk-17" in msg and "JAVA_HOME" in msg
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-such-jdk"))
    with pytest.raises(JavaMissingError, match="JAVA_HOME is .*no-such-jdk"):
        get_spark("local[1]")


def test_bad_master_and_worker_errors_are_one_line():
    from adaptcq.runtime.spark import spark_error
    from adaptcq.runtime.spark_session import SparkStartError, get_spark
    with pytest.raises(SparkStartError, match=r"--master 'nonsense' is not a Spark master URL"):
        get_spark("nonsense")
    worker = ("[STREAM_FAILED] Query [id = 1] terminated with exception: Job aborted\n"
              "Traceback (most recent call last):\n  File \"x.py\", line 1, in f\n"
              "adaptcq.errors.InputError: stream R: row 3 has timestamp nan in 'ts'; a time "
              "must be a finite number\n\n=== Streaming Query ===\n")
    err = spark_error(RuntimeError(worker))
    assert type(err).__name__ == "InputError"
    assert str(err) == "stream R: row 3 has timestamp nan in 'ts'; a time must be a finite number"
    # A whole traceback (no simplified traceback: spark_session.default_conf) prints the
    # error a raise replaced before the one raised: the raised one is reported.
    chained = worker.replace("\n\n===", (
        "\n\nDuring handling of the above exception, another exception occurred:\n\n"
        "Traceback (most recent call last):\n  File \"x.py\", line 2, in f\n"
        "adaptcq.errors.InputError: stream R (file r.parquet): row 3 has timestamp nan in "
        "'ts'; a time must be a finite number\n\n==="))
    assert str(spark_error(RuntimeError(chained))).startswith("stream R (file r.parquet): ")
    other = spark_error(RuntimeError("[STREAM_FAILED] Query x terminated with exception: "
                                     "[PATH_NOT_FOUND] Path does not exist: x.\n\tat a.b"))
    assert str(other) == "the Spark query failed: [PATH_NOT_FOUND] Path does not exist: x."


def test_group_keys_of_a_checkpoint_that_predates_them(tmp_path):
    """A checkpoint whose fingerprint has no grouping keys (written before they were kept)
    restarts with the keys its first run chose: those for the shuffle partitions Spark
    recorded in its offset log (and restarts with), not the session's."""
    from adaptcq.runtime.spark import _given_keys, _group_keys, checkpoint_shuffle_partitions
    offsets = tmp_path / "query" / "offsets"
    assert checkpoint_shuffle_partitions(tmp_path / "query") is None
    offsets.mkdir(parents=True)
    for k, n in ((0, 2), (1, 2)):
        (offsets / str(k)).write_text(
            "v1\n" + json.dumps({"batchWatermarkMs": 0, "conf": {
                "spark.sql.shuffle.partitions": str(n)}}) + '\n{"logOffset":0}\n')
    (offsets / ".1.crc").write_text("x")
    assert checkpoint_shuffle_partitions(tmp_path / "query") == 2
    assert _group_keys(None, 4, 2) == [2, 0, 4, 1] and _group_keys(None, 4, 4) == [12, 6, 2, 0]
    assert _given_keys((2, 0, 4, 1), 4) == [2, 0, 4, 1]
    for bad in ([2, 0, 4], [2, 2, 4, 1], [2, 0, 4, "1"], [True, 0, 4, 1]):
        with pytest.raises(AdaptcqError, match="group_keys must be 4 distinct whole numbers"):
            _given_keys(bad, 4)


def test_split_plan():
    q = parse_query(PARTITIONED, SCHEMAS)
    plan = plan_split(q, 4)
    assert plan.groups == 4 and plan.columns == {"R": "a", "S": "a", "T": "a"}
    chain = plan_split(parse_query(CHAIN, SCHEMAS), 4)
    assert chain.groups == 4 and chain.shares == (2, 2) and not chain.reason
    rows = plan_split(parse_query(PARTITIONED.replace("T [RANGE 1 SECONDS]", "T [ROWS 5]"),
                                  SCHEMAS), 4)
    assert rows.groups == 1 and "[ROWS n]" in rows.reason


@pytest.mark.parametrize("rate", [True, "2", 0, -1.0, float("inf"), float("nan")])
def test_split_plan_refuses_a_rate_that_is_not_a_positive_number(rate):
    # True was taken as rate 1 (bool is an int).
    with pytest.raises(OptionError, match="stream R has rate"):
        plan_split(parse_query(CHAIN, SCHEMAS), 4, {"R": rate})


# ----- adaptivity in a partition group, across restores (no Spark job) ----------------------

def _group_config(sql: str, tables: dict, spec, mode: str = "retract"):
    from adaptcq.runtime.spark import _adaptivity
    from adaptcq.runtime.spark_split import _Config
    from adaptcq.stream.sources import schema_kinds
    schemas = {n: schema_kinds(t) for n, t in tables.items()}
    q = parse_query(sql, schemas)
    executor, spec = _adaptivity("mjoin", spec)
    return _Config(
        qid=f"test-{id(tables)}-{id(spec)}", sql=sql, schemas=schemas, executor=executor,
        mode=mode, options={}, adaptivity=spec, groups=1, keys=[0], lateness=0.0,
        lateness_ns=0, signed=False, n_streams=len(q.streams),
        stream_columns=[[f"c{i}_{k}" for k in range(len(q.columns[a]))]
                        for i, a in enumerate(q.aliases)],
        reported=[True] * len(q.streams), sources=[st.source for st in q.streams],
        names=[o.name for o in q.outputs], plan=plan_split(q, 1), aliases=list(q.aliases))


def _packets(cfg, streams, ts, rows, first: int, end: bool = False) -> list:
    """One micro-batch of a group's packets, as ``ColumnarSplit`` sends them."""
    from adaptcq.runtime.spark_split import PUNCT, _ipc
    maxima = [(i, max(t for s, t in zip(streams, ts, strict=True) if s == i),
               streams.count(i)) for i in sorted(set(streams))]
    out = [(PUNCT, json.dumps({"end": end, "maxima": maxima}).encode())]
    for i, _, _ in maxima:
        idx = [k for k, s in enumerate(streams) if s == i]
        cols = {"_t": pa.array([ts[k] for k in idx], pa.int64()),
                "_o1": pa.array([""] * len(idx)).dictionary_encode(),
                "_o2": pa.array([first + k for k in idx], pa.int64())}
        for c, name in enumerate(cfg.stream_columns[i]):
            cols[name] = pa.array([rows[k][c] for k in idx])
        cols["_pr"] = pa.array([True] * len(idx))
        out.append((i, _ipc(pa.table(cols))))
    return out


def _run_group(cfg, prepared, chunks: int, restore_after=(), each=None):
    """Feed ``prepared`` to one group in ``chunks`` micro-batches (as the split would),
    rebuilding the group from its stored changes after the batches in ``restore_after``."""
    from adaptcq.runtime import spark_group as sg
    n = len(prepared.rows)
    cuts = np.linspace(0, n, chunks + 1).astype(int)
    store = sg.MemoryStore()
    out = []
    eng = None
    for k, (a, b) in enumerate(itertools.pairwise(cuts)):
        packets = _packets(cfg, prepared.streams[a:b].tolist(),
                           prepared.timestamps[a:b].tolist(), list(prepared.rows[a:b]), a)
        eng, res, _, _, _ = sg.advance_group(cfg, 0, store, packets)
        out += res
        if k in restore_after:
            sg._LIVE.pop((cfg.qid, 0))
            before = eng
            eng = sg.PartitionGroup.rebuild(cfg, store)
            sg._LIVE[(cfg.qid, 0)] = (store.get_meta()[:2], eng)
            if each is not None:
                each(before, eng)
    eng, res, _, _, _ = sg.advance_group(cfg, 0, store, _packets(cfg, [], [], [], n, True))
    out += res
    return Counter(out), eng


SPEC = {"optimizer": "qaware", "reorder": "agreedy", "caching": {"reopt_interval": 300},
        "p": 0.5, "W": 3, "interval": 40}


def test_group_policies_survive_a_restore_and_results_stay_exact():
    """docs/spark.md "Adaptivity": a group restored from its pickled state keeps its orders,
    its profiler and its ordering policies (statistics, history, the initial plan); A-Caching
    restarts (its caches are not in the engine's snapshot). Results equal the local runtime's
    and those of a run without policies or restores."""
    from adaptcq.adapt.acaching import ACaching
    from adaptcq.runtime.local import prepare
    tables = {k: pa.concat_tables(v) for k, v in _workload(7, n=400, files=1).items()}
    prepared = prepare(PARTITIONED, tables, "ts")
    plain, _ = _run_group(_group_config(PARTITIONED, tables, None), prepared, 6)
    local = adaptcq.run(PARTITIONED, tables, mode="retract").table
    want = Counter((*r[:-1], round(r[-1] * 1e9)) for r in _rows(local).elements())
    assert sum(want.values()) > 100 and plain == want
    seen = []

    def continued(before, after):
        seen.append(after)
        assert after.cq.executor.orders == before.cq.executor.orders
        old = {type(p).__name__: p for p in before.policies}
        new = {type(p).__name__: p for p in after.policies}
        assert new["AGreedy"].reorderings == old["AGreedy"].reorderings
        assert new["AGreedy"].history == old["AGreedy"].history
        assert new["InitialPlan"].done == old["InitialPlan"].done
        assert new["AGreedy"].wait_for is new["InitialPlan"]  # pickled together
        assert after.cq.profiler.report() == before.cq.profiler.report()
        assert isinstance(new["ACaching"], ACaching) and new["ACaching"] is not old["ACaching"]
        assert new["ACaching"].selections == 0  # restarted

    got, eng = _run_group(_group_config(PARTITIONED, tables, SPEC), prepared, 6,
                          restore_after={1, 2, 4}, each=continued)
    assert got == want
    assert eng.restores == 3 and eng.continued == 3 and len(seen) == 3
    rep = eng.report()
    assert rep["optimizer_chosen"] and rep["optimizer_planned_at_arrival"] > 0
    assert rep["agreedy_reorderings"] > 0 and rep["agreedy_profiled"] > 0
    assert "cache_selections" in rep and "cache_history" not in rep
    assert len(eng.earlier) == 3  # A-Caching's report at each restart
    json.dumps(rep)


def test_group_policies_that_do_not_pickle_restart_keeping_the_plan(monkeypatch):
    """The fallback: policies that do not pickle start afresh after a restore; the optimizer
    whose initial plan was set does not plan again (its plan is the restored orders)."""
    import adaptcq.runtime.spark_group as sg
    from adaptcq.runtime.local import prepare
    monkeypatch.setattr(sg, "_dump_policies", lambda cq, saved: None)
    tables = {k: pa.concat_tables(v) for k, v in _workload(8, n=300, files=1).items()}
    prepared = prepare(PARTITIONED, tables, "ts")
    spec = {"optimizer": "fgreedy", "reorder": "agreedy", "p": 1.0, "W": 2, "interval": 20}
    plain, _ = _run_group(_group_config(PARTITIONED, tables, None), prepared, 4)

    def restarted(before, after):
        assert before.planned is not None  # the plan was set in the first batches
        assert after.cq.executor.orders == before.cq.executor.orders
        assert [type(p).__name__ for p in after.policies] == ["AGreedy"]
        assert after.policies[0].reorderings == 0 and after.continued == 0

    got, eng = _run_group(_group_config(PARTITIONED, tables, spec), prepared, 4,
                          restore_after={2}, each=restarted)
    assert got == plain
    rep = eng.report()
    assert rep["optimizer"] == "fgreedy" and "optimizer_plan_cost" in rep
    assert eng.earlier and "agreedy_reorderings" in eng.earlier[-1]


def test_adaptivity_is_refused_where_it_cannot_run(tmp_path):
    from adaptcq.errors import OptionError
    from adaptcq.runtime.spark import prepare_files
    srcs = _write(tmp_path / "in", _workload(9, n=40, files=1))
    with pytest.raises(OptionError, match="the xjoin executor has none"):
        prepare_files(PARTITIONED, srcs, tmp_path / "ck", None, executor="xjoin",
                      adaptivity={"reorder": "agreedy"})
    with pytest.raises(AdaptcqError, match="unknown policy parameter"):
        prepare_files(PARTITIONED, srcs, tmp_path / "ck", None,
                      adaptivity={"reorder": "agreedy", "nonsense": 1})
    with pytest.raises(OptionError, match="no policy"):
        prepare_files(PARTITIONED, srcs, tmp_path / "ck", None, adaptivity={"p": 0.5})
    with pytest.raises(AdaptcqError, match="reopt-interval"):
        prepare_files(PARTITIONED, srcs, tmp_path / "ck", None, executor="acaching",
                      adaptivity={"caching": {"reopt_interval": -1}})


# ----- helpers ---------------------------------------------------------------------------------

def _workload(seed: int, n: int = 240, files: int = 2, null_rate: float = 0.05):
    """Random streams with timestamp ties, duplicate and NULL keys; each stream's rows in
    timestamp order, cut into ``files`` consecutive pieces."""
    rng = np.random.default_rng(seed)
    tables = {}
    for k, name in enumerate("RST"):
        m = n + 40 * k
        ts = np.sort(np.round(rng.uniform(0, 8, m), 1))  # 0.1 s grid: many ties
        a = rng.integers(0, 6, m).astype(object)
        a[rng.random(m) < null_rate] = None
        tables[name] = pa.table({
            "ts": pa.array(ts, pa.float64()), "id": pa.array(np.arange(m), pa.int64()),
            "a": pa.array(list(a), pa.int64()), "b": pa.array(rng.integers(0, 5, m), pa.int64()),
            "x": pa.array(rng.integers(0, 4, m), pa.int64())})
    return _pieces(tables, files)


def _pieces(tables, files):
    out = {}
    for name, t in tables.items():
        cuts = np.linspace(0, t.num_rows, files + 1).astype(int)
        out[name] = [t.slice(a, b - a) for a, b in itertools.pairwise(cuts)]
    return out


def _write(root: Path, pieces: dict, start: int = 0) -> dict[str, str]:
    """Piece k of each stream to ``<stream>/part-<k>.parquet``, modification times increasing
    with k: the file source takes files in that order, one per micro-batch."""
    for name, parts in pieces.items():
        d = root / name
        d.mkdir(parents=True, exist_ok=True)
        for k, t in enumerate(parts, start):
            p = d / f"part-{k}.parquet"
            pq.write_table(t, p)
            os.utime(p, (1_600_000_000 + 10 * k, 1_600_000_000 + 10 * k))
    return {name: str(root / name) for name in pieces}


def _rows(table: pa.Table) -> Counter:
    cols = []
    for c in table.column_names:
        col = table.column(c)
        if pa.types.is_timestamp(col.type):
            col = col.cast(pa.timestamp("us")).cast(pa.int64())
        vals = col.to_pylist()
        if c == "_ts" and pa.types.is_floating(col.type):
            vals = [round(v, 9) for v in vals]
        cols.append(vals)
    return Counter(zip(*cols, strict=True))


def _spark_rows(path) -> Counter:
    return _rows(pq.read_table(path))


def _assert_same(local: pa.Table, spark_out, min_rows: int = 1):
    a, b = _rows(local), _spark_rows(spark_out)
    assert sum(a.values()) >= min_rows, "the workload should produce results"
    assert a == b, (f"local {sum(a.values())} rows, spark {sum(b.values())}; only local: "
                    f"{list((a - b).items())[:5]}; only spark: {list((b - a).items())[:5]}")


# ----- Spark -------------------------------------------------------------------------------------

@pytest.mark.parametrize(("mode", "seed"), [("append", 1), ("retract", 2)])
def test_partitioned_query_equals_local(spark, tmp_path, mode, seed):
    srcs = _write(tmp_path / "in", _workload(seed))
    local = adaptcq.run(PARTITIONED, srcs, mode=mode)
    run = run_files(spark, PARTITIONED, srcs, str(tmp_path / "ck"), str(tmp_path / "out"),
                    mode=mode, partitions=2, max_files_per_trigger=1)
    _assert_same(local.table, tmp_path / "out", min_rows=20)
    assert len(run.groups) == 2 and run.batches >= 3  # 2 data batches + the end of input
    assert run.rows_in == sum(pq.read_table(p).num_rows for p in srcs.values())
    assert run.updates == local.stats["updates"]
    assert run.rejected == 0 and run.pending == 0


def test_computed_outputs_are_typed_by_spark_and_equal_local(spark, tmp_path):
    """SELECT expressions that are not plain columns are typed by Spark's analysis
    (``spark._output_types``) and give the local runtime's values."""
    sql = ("SELECT R.id AS rid, R.x + S.b * 2 AS v, R.x > 1 AS big, S.id AS sid "
           "FROM R [RANGE 2 SECONDS], S [RANGE 2 SECONDS] WHERE R.a = S.a")
    srcs = _write(tmp_path / "in", {k: v for k, v in _workload(4, n=80).items() if k != "T"})
    local = adaptcq.run(sql, srcs, mode="append")
    run_files(spark, sql, srcs, str(tmp_path / "ck"), str(tmp_path / "out"), mode="append",
              partitions=2)
    _assert_same(local.table, tmp_path / "out", min_rows=20)
    got = pq.read_table(tmp_path / "out").schema
    assert got.field("v").type == pa.int64() and got.field("big").type == pa.bool_()


def test_chain_runs_in_shares_and_equals_local(spark, tmp_path):
    """R(a) ⋈ S(a,b) ⋈ T(b) has no key common to all streams: with shares (a: 2, b: 2) it
    runs in four groups, R replicated over b's two and T over a's two."""
    srcs = _write(tmp_path / "in", _workload(3, n=200, files=3))
    local = adaptcq.run(CHAIN, srcs, mode="retract")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = run_files(spark, CHAIN, srcs, str(tmp_path / "ck"), str(tmp_path / "out"),
                        mode="retract", partitions=4, max_files_per_trigger=1)
    assert not any(issubclass(w.category, SplitWarning) for w in caught)
    assert len(run.groups) == 4 and run.shares == {"R.a = S.a": 2, "S.b = T.b": 2}
    n = {k: pq.read_table(p).num_rows for k, p in srcs.items()}
    assert run.rows_in == sum(n.values())
    nulls = {k: pq.read_table(p).column("a" if k == "R" else "b").null_count
             for k, p in srcs.items() if k != "S"}
    # R and T go to two groups each, except rows with a NULL key (one group: they never join)
    assert run.shipped == n["S"] + 2 * (n["R"] + n["T"]) - nulls["R"] - nulls["T"]
    _assert_same(local.table, tmp_path / "out", min_rows=20)
    assert {-1, 1} <= set(pq.read_table(tmp_path / "out").column("_sign").to_pylist())


def test_stop_and_restart_from_checkpoint(spark, tmp_path):
    """Run the first files, stop; add files; restart from the checkpoint: the output of both
    runs together is that of one uninterrupted run (nothing lost, nothing repeated)."""
    pieces = _workload(4, n=240, files=4)
    first = {k: v[:2] for k, v in pieces.items()}
    rest = {k: v[2:] for k, v in pieces.items()}
    srcs = _write(tmp_path / "in", first)
    ck, out = str(tmp_path / "ck"), str(tmp_path / "out")
    run1 = run_files(spark, PARTITIONED, srcs, ck, out, mode="retract", partitions=2,
                     max_files_per_trigger=1, finish=False)
    assert run1.pending > 0 or run1.results > 0  # it stopped mid-stream, state in the store
    _write(tmp_path / "in", rest, start=2)
    run2 = run_files(spark, PARTITIONED, srcs, ck, out, mode="retract", partitions=2,
                     max_files_per_trigger=1)
    assert run2.rows_in == sum(t.num_rows for parts in rest.values() for t in parts)
    local = adaptcq.run(PARTITIONED, srcs, mode="retract")
    _assert_same(local.table, out, min_rows=20)


def _random_case(seed: int):
    """A random query of 2–5 streams over a random join graph (chain, star, cycle or a
    complete graph; join columns a, b, c), random [RANGE] windows and a selection, and its
    random streams in 4 files each (timestamp ties, duplicate and NULL keys)."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 6))
    names = [f"S{i}" for i in range(n)]
    shape = ["chain", "star", "cycle", "complete"][seed % 4]
    if shape == "star":
        edges = [(0, i) for i in range(1, n)]
    elif shape == "complete":
        edges = [(i, j) for i in range(n) for j in range(i + 1, n)]
    else:
        edges = [(i - 1, i) for i in range(1, n)] + ([(0, n - 1)] if shape == "cycle"
                                                      and n > 2 else [])
    cols = "abc"
    preds = [f"{names[i]}.{cols[rng.integers(0, 3)]} = {names[j]}.{cols[rng.integers(0, 3)]}"
             for i, j in edges]
    windows = [f"[RANGE {rng.choice([0.5, 1, 2])} SECONDS]" for _ in names]
    select = ", ".join(f"{nm}.id AS i{k}" for k, nm in enumerate(names))
    sql = (f"SELECT {select} FROM " + ", ".join(f"{nm} {w}" for nm, w in
                                                zip(names, windows, strict=True))
           + " WHERE " + " AND ".join([*preds, f"{names[-1]}.c <> 1"]))
    pieces = {}
    for k, nm in enumerate(names):
        m = 60 + 15 * k
        ts = np.sort(np.round(rng.uniform(0, 6, m), 1))
        data = {"ts": pa.array(ts), "id": pa.array(np.arange(m), pa.int64())}
        for c in cols:
            v = rng.integers(0, 3, m).astype(object)
            v[rng.random(m) < 0.05] = None
            data[c] = pa.array(list(v), pa.int64())
        t = pa.table(data)
        cut = np.linspace(0, m, 5).astype(int)
        pieces[nm] = [t.slice(cut[q], cut[q + 1] - cut[q]) for q in range(4)]
    return sql, pieces


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_random_queries_with_shares_stop_restart_and_equal_local(spark, tmp_path, seed):
    """Must hold (issue 11): random queries of 2–5 streams over chains, stars, cycles and
    complete graphs, random P and shares, append and retract, stopped after two files and
    restarted from the checkpoint: the output equals the local runtime's."""
    sql, pieces = _random_case(seed)
    rng = np.random.default_rng(100 + seed)
    mode = ["append", "retract"][seed % 2]
    q = parse_query(sql, {nm: {c: "number" for c in ("ts", "id", "a", "b", "c")}
                          for nm in pieces})
    labels = [c.split(" = ")[0] for c in plan_split(q, 2).classes]
    shares = ({x: int(rng.integers(1, 3)) for x in labels} if seed >= 2 else None)
    P = None if shares else int(rng.integers(2, 6))
    srcs = _write(tmp_path / "in", {k: v[:2] for k, v in pieces.items()})
    ck, out = str(tmp_path / "ck"), str(tmp_path / "out")
    run1 = run_files(spark, sql, srcs, ck, out, mode=mode, partitions=P, shares=shares,
                     max_files_per_trigger=1, finish=False)
    _write(tmp_path / "in", {k: v[2:] for k, v in pieces.items()}, start=2)
    run2 = run_files(spark, sql, srcs, ck, out, mode=mode, partitions=P, shares=shares,
                     max_files_per_trigger=1)
    assert run2.shares == run1.shares  # kept in the checkpoint
    assert len(run1.groups) == (math.prod(run1.shares.values()) if run1.shares else 1)
    _assert_same(adaptcq.run(sql, srcs, mode=mode).table, out, min_rows=1)


def test_restart_keeps_the_measured_shares_and_refuses_others(spark, tmp_path):
    """The shares are chosen at the first run's row counts and kept: a restart after T has
    grown 20-fold routes rows as before; other --shares are refused."""
    pieces = _workload(6, n=150, files=2)
    srcs = _write(tmp_path / "in", {k: v[:1] for k, v in pieces.items()})
    ck, out = str(tmp_path / "ck"), str(tmp_path / "out")
    run1 = run_files(spark, CHAIN, srcs, ck, out, mode="append", partitions=4,
                     max_files_per_trigger=1, finish=False)
    assert run1.shares == {"R.a = S.a": 2, "S.b = T.b": 2}
    big = {"T": [pa.concat_tables([pieces["T"][1]] * 20).sort_by("ts")],
           "R": pieces["R"][1:], "S": pieces["S"][1:]}
    _write(tmp_path / "in", big, start=1)
    with pytest.raises(AdaptcqError, match="--shares was not given, now"):
        run_files(spark, CHAIN, srcs, ck, out, mode="append", shares={"S.b": 4})
    run2 = run_files(spark, CHAIN, srcs, ck, out, mode="append", partitions=4,
                     max_files_per_trigger=1)
    assert run2.shares == run1.shares
    _assert_same(adaptcq.run(CHAIN, srcs, mode="append").table, out, min_rows=20)


@contextlib.contextmanager
def _spark_conf(spark, key: str, value: str):
    """``key`` set to ``value`` on the shared session, restored afterwards."""
    old = spark.conf.get(key)
    spark.conf.set(key, value)
    try:
        yield
    finally:
        spark.conf.set(key, old)


def test_timestamp_joins_timestamp_ntz_under_any_session_time_zone(spark, tmp_path):
    """A TimestampType column equated with a TimestampNTZ column (the engine compares both
    as naive UTC datetimes: 12:00Z equals 12:00) in 4 groups, under a session time zone
    that is not UTC: the split hashes both by that value, never through the session time
    zone, so every result is found (issue 11: 3 of 8 were)."""
    keys = [dt.datetime(2024, 1, 1, 12) + dt.timedelta(hours=h) for h in range(8)]
    for name, ts, ids, k in (
            ("R", [float(i) for i in range(8)], range(8),
             pa.array([x.replace(tzinfo=dt.UTC) for x in keys],
                      pa.timestamp("us", tz="UTC"))),
            ("S", [i + 0.5 for i in range(8)], range(100, 108),
             pa.array(keys, pa.timestamp("us")))):
        (tmp_path / "in" / name).mkdir(parents=True)
        pq.write_table(pa.table({"ts": ts, "id": list(ids), "k": k}),
                       tmp_path / "in" / name / "p.parquet")
    srcs = {n: str(tmp_path / "in" / n) for n in "RS"}
    sql = ("SELECT R.id AS r, S.id AS s FROM R [RANGE 100 SECONDS], S [RANGE 100 SECONDS] "
           "WHERE R.k = S.k")
    with _spark_conf(spark, "spark.sql.session.timeZone", "America/New_York"):
        run_files(spark, sql, srcs, str(tmp_path / "ck"), str(tmp_path / "out"), partitions=4)
    local = adaptcq.run(sql, srcs).table
    assert sorted(zip(local.column("r").to_pylist(), local.column("s").to_pylist(),
                      strict=True)) == [(i, 100 + i) for i in range(8)]
    got = pq.read_table(tmp_path / "out").select(["r", "s"])
    assert Counter(map(tuple, (r.values() for r in got.to_pylist()))) == \
        Counter((i, 100 + i) for i in range(8))


def test_restart_under_other_shuffle_partitions_is_exact(spark, tmp_path):
    """The groups' grouping keys are chosen for spark.sql.shuffle.partitions at the first
    run and kept in the checkpoint: a restart under another value (a CLI restart with
    another --master) gives every group its own state back, and the output equals the
    local runtime's (issue 11: 49,703 rows of 68,587, each group reading another group's
    state or none)."""
    pieces = _workload(7, n=100, files=2)
    srcs = _write(tmp_path / "in", {k: v[:1] for k, v in pieces.items()})
    ck, out = str(tmp_path / "ck"), str(tmp_path / "out")
    assert spark.conf.get("spark.sql.shuffle.partitions") == "2"
    run1 = run_files(spark, PARTITIONED, srcs, ck, out, mode="retract", partitions=4,
                     max_files_per_trigger=1, finish=False)
    _write(tmp_path / "in", {k: v[1:] for k, v in pieces.items()}, start=1)
    with _spark_conf(spark, "spark.sql.shuffle.partitions", "4"):
        run2 = run_files(spark, PARTITIONED, srcs, ck, out, mode="retract", partitions=4,
                         max_files_per_trigger=1)
    _assert_same(adaptcq.run(PARTITIONED, srcs, mode="retract").table, out, min_rows=20)
    assert sorted(run2.groups) == sorted(run1.groups)  # the same keys, the same state
    fp = json.loads((tmp_path / "ck" / "adaptcq.json").read_text())
    assert fp["shuffle_partitions"] == 2 and sorted(fp["group_keys"]) == sorted(run1.groups)


def test_late_rows_are_counted_and_written(spark, tmp_path):
    pieces = _workload(5, n=160, files=2, null_rate=0.0)
    s2 = pieces["S"][1].to_pydict()
    # Two rows of S's second file arrive long after their time: one within the allowed
    # lateness (put into order), one beyond it (rejected).
    t_max = pieces["S"][0].column("ts").to_pylist()[-1]
    s2["ts"][0] = t_max - 0.5
    s2["ts"][1] = t_max - 3.0
    pieces["S"][1] = pa.table(s2, schema=pieces["S"][1].schema)
    srcs = _write(tmp_path / "in", pieces)
    local = adaptcq.run(PARTITIONED, srcs, mode="retract", allowed_lateness=1.0)
    assert local.stats["rejected"] == 1
    run = run_files(spark, PARTITIONED, srcs, str(tmp_path / "ck"), str(tmp_path / "out"),
                    str(tmp_path / "rejected"), mode="retract", partitions=2,
                    allowed_lateness=1.0, max_files_per_trigger=1)
    _assert_same(local.table, tmp_path / "out", min_rows=10)
    assert run.rejected == 1
    rej = pq.read_table(tmp_path / "rejected").to_pylist()
    assert len(rej) == 1 and rej[0]["stream"] == "S" and rej[0]["row"] == 1
    assert rej[0]["ts"] == pytest.approx(t_max - 3.0)
    assert "allowed lateness (1 s)" in rej[0]["reason"]
    assert sum(g["late"] for g in run.groups.values()) == 1
    # Both runtimes name it alike: its file, and its row in that file.
    mine = local.rejected.to_pylist()[0]
    assert (mine["stream"], mine["row"], mine["ts"]) == (rej[0]["stream"], 1, rej[0]["ts"])
    assert os.path.realpath(mine["file"]) == os.path.realpath(
        rej[0]["file"].removeprefix("file://").removeprefix("file:"))


def test_adaptcq_data_source(spark):
    from adaptcq.stream.datasource import register
    from adaptcq.stream.workloads import three_way
    register(spark)
    wl = three_way(n_updates=7000)
    df = (spark.read.format("adaptcq").option("workload", "three-way")
          .option("n_updates", 7000).option("stream", "S").load())
    assert df.columns == wl.tables["S"].column_names
    got = df.toArrow().sort_by("id")
    assert got.equals(wl.tables["S"].cast(got.schema))
    stream = (spark.readStream.format("adaptcq").option("workload", "three-way")
              .option("n_updates", 7000).option("stream", "T").option("rowsPerBatch", 2000)
              .load())
    q = stream.writeStream.format("memory").queryName("adaptcq_src_test").start()
    q.processAllAvailable()
    q.stop()
    assert spark.table("adaptcq_src_test").count() == wl.tables["T"].num_rows
    assert len(q.recentProgress) >= 3  # 5000 rows at 2000 per micro-batch


def test_continuous_query_over_a_source_without_files(spark, tmp_path):
    """A source with neither files nor an order column (here the ``adaptcq`` format): rows
    are ordered by their position in their Spark partition (streaming DataFrames refuse
    ``monotonically_increasing_id``), and the results equal the local runtime's."""
    from adaptcq.runtime.spark import continuous_query
    from adaptcq.stream.datasource import register
    from adaptcq.stream.workloads import three_way
    register(spark)
    wl = three_way(n_updates=3000)
    streams = {name: (spark.readStream.format("adaptcq").option("workload", "three-way")
                      .option("n_updates", 3000).option("stream", name)
                      .option("rowsPerBatch", 700).load()) for name in wl.tables}
    ctl = tmp_path / "end"
    ctl.mkdir()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SplitWarning)
        res = continuous_query(spark, wl.sql, streams, timestamp=wl.timestamp, mode="retract",
                               end_of_input=str(ctl))
    got = run_to_end(spark, res, "adaptcq_src_cq", ctl)
    local = adaptcq.run(wl.sql, wl.tables, timestamp=wl.timestamp, mode="retract")
    assert local.table.num_rows > 100
    assert _rows(got) == _rows(local.table)


@pytest.mark.parametrize(("flags", "keys"), [
    (["--reorder", "agreedy"], {"agreedy_reorderings", "agreedy_profiled"}),
    (["--optimizer", "qaware", "--executor", "mjoin"], {"optimizer", "optimizer_plan"}),
    (["--executor", "acaching", "--caches", "global", "--reopt-interval", "200"],
     {"caches_used", "cache_selections", "cache_candidates"}),
])
def test_cli_runs_adaptive_policies_in_every_group(spark, tmp_path, capsys, flags, keys):
    """`adaptcq run --engine spark` with --reorder, --optimizer or --executor acaching runs
    the policy in every partition group: results equal the local runtime's, and the summary
    (console and --summary-json) has each group's decisions."""
    from adaptcq.cli import main
    srcs = _write(tmp_path / "in", _workload(11, n=200, files=2))
    out, summary = tmp_path / "out", tmp_path / "summary.json"
    argv = ["run", "--engine", "spark", "--master", "local[2]", "--partitions", "2",
            "--mode", "retract", "--sql", PARTITIONED,
            *[f"--input={k}={v}" for k, v in srcs.items()], "--output", str(out),
            "--summary-json", str(summary), *flags]
    assert main(argv) == 0
    console = capsys.readouterr().out
    _assert_same(adaptcq.run(PARTITIONED, srcs, mode="retract").table, out, min_rows=20)
    doc = json.loads(summary.read_text())
    assert doc["adaptivity"]["reorder"] == ("agreedy" if "agreedy" in flags else "off")
    assert (doc["adaptivity"]["caching"] is not None) == ("acaching" in flags)
    assert len(doc["groups"]) == 2
    for g in doc["groups"]:
        assert keys <= set(g["policies"]), g["policies"]
        assert g["plan"].startswith("ΔR R: ")
    assert "adaptive decisions per partition group" in console
    assert "adaptive policies (in every group)" in console


def test_restart_from_checkpoint_with_adaptivity_stays_exact(spark, tmp_path):
    """Stopped and restarted from its checkpoint with every policy on, aggressive enough
    to decide within a few hundred rows: the output equals one uninterrupted local run,
    the groups' decisions survive the restart, and another adaptivity is refused."""
    pieces = _workload(12, n=240, files=4)
    srcs = _write(tmp_path / "in", {k: v[:2] for k, v in pieces.items()})
    ck, out = str(tmp_path / "ck"), str(tmp_path / "out")
    run1 = run_files(spark, PARTITIONED, srcs, ck, out, mode="retract", partitions=2,
                     max_files_per_trigger=1, finish=False, adaptivity=SPEC)
    assert run1.adaptivity["caching"] == {"reopt_interval": 300}
    planned = {k: g["policies"].get("optimizer_plan") for k, g in run1.groups.items()}
    assert all(p and not p.startswith("not set") for p in planned.values()), planned
    _write(tmp_path / "in", {k: v[2:] for k, v in pieces.items()}, start=2)
    with pytest.raises(AdaptcqError, match="adaptive policies"):
        run_files(spark, PARTITIONED, srcs, ck, out, mode="retract", partitions=2,
                  adaptivity={**SPEC, "reorder": "off"})
    run2 = run_files(spark, PARTITIONED, srcs, ck, out, mode="retract", partitions=2,
                     max_files_per_trigger=1, adaptivity=SPEC)
    _assert_same(adaptcq.run(PARTITIONED, srcs, mode="retract").table, out, min_rows=20)
    for k, g in run2.groups.items():
        assert g["policy_restores"] >= 1  # the new query's workers restored every group
        assert g["policies"]["optimizer_plan"] == planned[k]  # planned once, kept
        assert g["policies"]["agreedy_profiled"] > 0
    assert sum(g["policies"]["agreedy_reorderings"] for g in run2.groups.values()) > 0


def test_group_keys_hash_is_sparks(spark):
    """The driver computes Spark's hash of an int itself (``spark_int_hash``), so the group
    keys' shuffle partitions are Spark's without a job; checked here against Spark."""
    from pyspark.sql import functions as F

    from adaptcq.runtime.spark import spark_int_hash
    vals = [0, 1, -1, 2, 7, 42, 255, 65_536, 2**31 - 1, -(2**31), 123_456_789]
    vals += list(range(3, 300))
    rows = (spark.createDataFrame([(v,) for v in vals], "v int")
            .select("v", F.hash("v").alias("h")).collect())
    assert [spark_int_hash(r["v"]) for r in rows] == [r["h"] for r in rows]


def test_plain_parquet_schema_is_sparks(spark, tmp_path):
    """A Parquet input of plain column types gets its Spark schema from pyarrow's (no Spark
    read before the query); it is the schema Spark reads; other types fall back to Spark."""
    from adaptcq.runtime.spark import _plain_parquet_schema
    t = pa.table({"ts": pa.array([1.5], pa.float64()), "a": pa.array([1], pa.int64()),
                  "b": pa.array([2], pa.int32()), "c": pa.array([3], pa.int16()),
                  "d": pa.array([4], pa.int8()), "f": pa.array([1.0], pa.float32()),
                  "s": pa.array(["x"], pa.string()), "y": pa.array([b"z"], pa.binary()),
                  "k": pa.array([True], pa.bool_())})
    pq.write_table(t, tmp_path / "t.parquet")
    assert _plain_parquet_schema(pq.read_schema(tmp_path / "t.parquet")) == \
        spark.read.parquet(str(tmp_path / "t.parquet")).schema
    assert _plain_parquet_schema(pa.schema([("t", pa.timestamp("us"))])) is None
    assert _plain_parquet_schema(pa.schema([("u", pa.uint32())])) is None


def test_daemon_drops_spark_zips_only_for_the_same_installed_versions(tmp_path):
    """``runtime.spark_daemon``: Spark's pyspark.zip and py4j zip leave the workers' path
    only when the same version is installed on another entry; otherwise they stay."""
    import zipfile

    from adaptcq.runtime.spark_daemon import prefer_installed

    def zipped(name: str, package: str, version: str, folder: str = "zips") -> str:
        (tmp_path / folder).mkdir(exist_ok=True)
        p = tmp_path / folder / name
        with zipfile.ZipFile(p, "w") as z:
            z.writestr(f"{package}/version.py", f'__version__: str = "{version}"\n')
        return str(p)

    site = tmp_path / "site"
    for package, version in (("pyspark", "4.3.0"), ("py4j", "0.10.9.9")):
        (site / package).mkdir(parents=True)
        (site / package / "version.py").write_text(f"__version__ = '{version}'\n")
    same = [zipped("pyspark.zip", "pyspark", "4.3.0"),
            zipped("py4j-0.10.9.9-src.zip", "py4j", "0.10.9.9")]
    assert prefer_installed([*same, "/elsewhere", str(site)]) == ["/elsewhere", str(site)]
    other = zipped("pyspark.zip", "pyspark", "4.2.0", "old")
    assert prefer_installed([other, str(site)]) == [other, str(site)]
    assert prefer_installed([same[0], "/elsewhere"]) == [same[0], "/elsewhere"]


def test_worker_freezes_its_imports_once():
    """``spark_daemon.freeze_imports``: the first call moves the worker's objects out of the
    collector's reach (pyspark's daemon collects after every task), later calls add nothing,
    so objects made by later tasks stay collectable. In a fresh interpreter: freezing
    the test process would keep its garbage."""
    import subprocess
    import sys
    code = ("import gc\n"
            "from adaptcq.runtime.spark_daemon import freeze_imports\n"
            "assert gc.get_freeze_count() == 0\n"
            "freeze_imports()\n"
            "n = gc.get_freeze_count()\n"
            "assert n > 0\n"
            "later = [[] for _ in range(1000)]\n"
            "freeze_imports()\n"
            "assert gc.get_freeze_count() == n\n")
    subprocess.run([sys.executable, "-c", code], check=True)
