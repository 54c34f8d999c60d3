"""Shares partitioning and state as changes, without a Spark job (docs/spark.md).

The split (``spark_split.ColumnarSplit``) and the partition groups (``spark_group``) are run
here exactly as Spark runs them, on Arrow batches in the union's layout, with Python's hash in
place of Spark's for the coordinates: the union of the groups' outputs must equal the local
engine's output on random queries of 2–5 streams with random join graphs (chains, stars,
cycles, complete graphs), random shares, random micro-batches, and groups rebuilt from their
stored changes at random points (a restart, another worker, a retried batch).
"""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adaptcq.engine.continuous import ContinuousQuery
from adaptcq.errors import AdaptcqError, OptionError
from adaptcq.optimizer.shares import choose_shares, factorizations, shipped
from adaptcq.query.cql import parse_query
from adaptcq.runtime import spark_group as sg
from adaptcq.runtime.spark_split import END, ColumnarSplit, _Config, plan_split
from conftest import examples
from test_engine_oracle import arrivals, queries

# ----- the shares (optimizer.shares) -----------------------------------------------------------


def test_factorizations_are_every_ordered_product():
    assert sorted(factorizations(4, 2)) == [(1, 4), (2, 2), (4, 1)]
    assert list(factorizations(1, 3)) == [(1, 1, 1)]
    assert len(list(factorizations(12, 3))) == 18
    assert all(math.prod(f) == 36 for f in factorizations(36, 4))


def test_shares_of_a_common_key_chain_and_star():
    R, S, T = "RST"
    # One class covers every stream: all P groups on it, nothing replicated.
    assert choose_shares([frozenset("RST")], {R: 1, S: 1, T: 1}, 8) == (8,)
    assert choose_shares([frozenset("RST"), frozenset("RS")], {R: 1, S: 1, T: 1}, 8) == (8, 1)
    # The chain R(a) ⋈ S(a,b) ⋈ T(b): shares split between a and b, S never replicated.
    chain = [frozenset("RS"), frozenset("ST")]
    assert choose_shares(chain, {R: 1, S: 1, T: 1}, 4) == (2, 2)
    assert shipped(chain, {R: 1, S: 1, T: 1}, (2, 2)) == 5
    # A fast T is cheaper to keep unreplicated: the shares go to b, R is replicated.
    assert choose_shares(chain, {R: 1, S: 1, T: 100}, 4) == (1, 4)
    # A star F(a,b,c) with dimensions A(a), B(b), C(c) and a large fact stream.
    star = [frozenset("FA"), frozenset("FB"), frozenset("FC")]
    sh = choose_shares(star, {"F": 1000, "A": 1, "B": 1, "C": 50}, 8)
    assert math.prod(sh) == 8 and sh[2] == 8
    # Caps: a class with 2 distinct values cannot use more than 2 groups.
    assert choose_shares(chain, {R: 1, S: 1, T: 100}, 4, caps=[None, 2]) == (2, 2)


def test_split_plans():
    schemas = {n: {"ts": "number", "a": "number", "b": "number", "id": "number"}
               for n in "RST"}
    q = parse_query("SELECT R.id AS r, T.id AS t FROM R [RANGE 1 SECONDS], S [RANGE 1 SECONDS], "
                    "T [RANGE 1 SECONDS] WHERE R.a = S.a AND S.b = T.b", schemas)
    plan = plan_split(q, 4)
    assert plan.groups == 4 and plan.classes == ("R.a = S.a", "S.b = T.b")
    assert plan.shares == (2, 2) and plan.replicas("S") == 1 and plan.replicas("R") == 2
    assert plan.describe()["replication"] == pytest.approx(5 / 3)
    assert sorted(plan.offsets("R").tolist()) == [0, 1] and plan.offsets("S").tolist() == [0]
    given_ = plan_split(q, None, shares={"T.b": 3})
    assert given_.shares == (1, 3) and given_.groups == 3
    with pytest.raises(OptionError, match="multiply to 3 groups, but partitions is 4"):
        plan_split(q, 4, shares={"S.b": 3})
    with pytest.raises(OptionError, match="'R.x' is not a column of a join attribute class"):
        plan_split(q, None, shares={"R.x": 2})
    common = parse_query("SELECT R.id FROM R [RANGE 1 SECONDS], S [RANGE 1 SECONDS] "
                         "WHERE R.a = S.a AND R.b = S.b", schemas)
    p = plan_split(common, 6)
    assert p.shares == (6, 1) and p.columns == {"R": "a", "S": "a"}
    rows = parse_query("SELECT R.id FROM R [ROWS 3], S [RANGE 1 SECONDS] WHERE R.a = S.a",
                       schemas)
    assert plan_split(rows, 4).groups == 1 and "[ROWS n]" in plan_split(rows, 4).reason


# ----- split and groups on random queries ------------------------------------------------------

_QIDS = itertools.count()


def _config(query, plan, mode: str, signed: bool = False, executor: str = "mjoin",
            options: dict | None = None) -> _Config:
    return _Config(
        qid=f"test-{next(_QIDS)}", sql=query.sql,
        schemas={s.source: {c: "number" for c in ("a", "b", "c", "id", "ts")}
                 for s in query.streams},
        executor=executor, mode=mode, options=dict(options or {}), adaptivity=None,
        groups=plan.groups,
        keys=list(range(100, 100 + plan.groups)), lateness=0.0, lateness_ns=0,
        signed=signed, n_streams=len(query.streams),
        stream_columns=[[f"c{i}_{k}" for k in range(len(query.columns[a]))]
                        for i, a in enumerate(query.aliases)],
        reported=[True] * len(query.streams), sources=[s.source for s in query.streams],
        names=[o.name for o in query.outputs], ts_kinds=["float"] * len(query.streams),
        plan=plan, aliases=list(query.aliases),
        inputs={a: pa.schema([(c, pa.int64()) for c in query.columns[a]])
                for a in query.aliases})


def _union_batch(query, plan, streams, ts, rows, first: int, end: bool):
    """Rows in the layout ``runtime.spark._project`` gives the union (Python's hash for
    Spark's), plus an end-of-input row when ``end``."""
    n = len(rows)
    cols: dict[str, list] = {"_s": list(streams), "_g": [0] * n, "_ti": [None] * n,
                             "_td": list(ts), "_sg": [1] * n, "_o1": [None] * n,
                             "_o2": list(range(first, first + n)), "_oc": [False] * n}
    for c in range(len(plan.shares)):
        cols[f"_h{c}"] = [None] * n
    for i, a in enumerate(query.aliases):
        for k in range(len(query.columns[a])):
            cols[f"c{i}_{k}"] = [None] * n
    for r, (i, row) in enumerate(zip(streams, rows, strict=True)):
        a = query.aliases[i]
        for k, v in enumerate(row):
            cols[f"c{i}_{k}"][r] = v
        for c, column in plan.keys.get(a, ()):
            v = row[query.columns[a].index(column)]
            cols[f"_h{c}"][r] = -1 if v is None else hash((c, v)) % plan.shares[c]
    if end:
        for key, v in cols.items():
            v.append(END if key == "_s" else 0 if key in ("_g", "_o2") else
                     False if key == "_oc" else 1 if key == "_sg" else None)
    types = {"_s": pa.int32(), "_g": pa.int32(), "_ti": pa.int64(), "_td": pa.float64(),
             "_sg": pa.int8(), "_o1": pa.string(), "_o2": pa.int64(), "_oc": pa.bool_()}
    return pa.RecordBatch.from_pydict(
        {k: pa.array(v, types.get(k, pa.int32() if k.startswith("_h") else pa.int64()))
         for k, v in cols.items()})


def run_groups(query, plan, mode, streams, ts, rows, cuts, rebuild_at, rnd,
               workers: int = 1, executor: str = "mjoin", options: dict | None = None,
               groups: list | None = None) -> Counter:
    """Feed the split's packets to every group, micro-batch by micro-batch; at the batches
    in ``rebuild_at`` each group is rebuilt from its store (its live copies dropped). With
    several ``workers`` (Python processes, each its own live copies) a group's step runs on
    a random one: a stale copy there catches up with the store. ``groups`` receives each
    group's engine after its last step."""
    cfg = _config(query, plan, mode, executor=executor, options=options)
    lives = [{} for _ in range(workers)]
    split = ColumnarSplit(cfg)
    stores = {g: sg.MemoryStore() for g in cfg.keys}
    out: Counter = Counter()
    caught = CAUGHT_UP
    bounds = [0, *cuts, len(rows)]
    for b, (lo, hi) in enumerate(itertools.pairwise(bounds)):
        last = hi == len(rows)
        batch = _union_batch(query, plan, streams[lo:hi], ts[lo:hi], rows[lo:hi], lo, last)
        packets: dict[int, list] = {g: [] for g in cfg.keys}
        for rb in split(iter([batch])):
            for g, s, p in zip(*(rb.column(c).to_pylist() for c in ("_g", "_s", "_p")),
                               strict=True):
                packets[g].append((s, p))
        for g in cfg.keys:
            if b in rebuild_at and rnd.random() < 0.7:
                for live in lives:
                    live.pop((cfg.qid, g), None)
            sg._LIVE = lives[rnd.randrange(workers)]
            eng, res, rejected, _, extra = sg.advance_group(cfg, g, stores[g], packets[g])
            if last and groups is not None:
                groups.append(eng)
            caught[0] += extra["caught_up"]
            assert not rejected
            if isinstance(res, pa.Table):  # the vectorized executor's output
                res = [tuple(r.values()) for r in res.to_pylist()]
            out.update(res)
    return out


CAUGHT_UP = [0]  # catch-ups seen (the test of them checks some happen)


def local_output(query, mode, streams, ts, rows) -> Counter:
    order = sorted(range(len(rows)), key=lambda k: (ts[k], streams[k], k))
    cq = ContinuousQuery(query, "mjoin", mode, time_unit=1e-9)
    out = cq.process([streams[k] for k in order], None,
                     [round(ts[k] * 1e9) for k in order], [rows[k] for k in order])
    return Counter(out)


@settings(max_examples=examples(90), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data(), mode=st.sampled_from(["append", "retract"]), seed=st.integers(0, 10**6),
       executor=st.sampled_from(["mjoin", "vector"]))
def test_groups_equal_the_local_engine(data, mode, seed, executor):
    """Shares split, groups, rebuilds and catch-ups, with MJoin or the vectorized executor
    in each group (issue 16: every group runs it over the column batches it receives)."""
    query = data.draw(queries(max_streams=5))
    streams, ts, dicts = data.draw(arrivals(len(query.streams), max_rows=30))
    rows = [tuple(d[c] for c in query.columns[query.aliases[i]])
            for i, d in zip(streams, dicts, strict=True)]
    rnd = random.Random(seed)
    if any(s.window.kind == "rows" for s in query.streams):
        plan = plan_split(query, rnd.randint(1, 4))
        assert plan.groups == 1
    elif rnd.random() < 0.5:
        plan = plan_split(query, rnd.randint(1, 8))
    else:
        labels = [c.split(" = ")[0] for c in plan_split(query, 2).classes]
        plan = plan_split(query, None, shares={x: rnd.randint(1, 3) for x in labels})
    n = len(rows)
    cuts = sorted(rnd.sample(range(1, n), min(rnd.randint(0, 4), n - 1))) if n > 1 else []
    rebuild_at = set(rnd.sample(range(len(cuts) + 1), rnd.randint(0, len(cuts) + 1)))
    got = run_groups(query, plan, mode, streams, ts, rows, cuts, rebuild_at, rnd,
                     workers=rnd.choice([1, 2, 3]), executor=executor)
    assert got == local_output(query, mode, streams, ts, rows)


def test_stale_copies_catch_up():
    """Two workers taking a group's micro-batches at random: most steps find a stale copy,
    which catches up from the entries written since, and the output stays exact."""
    schemas = {n: {"ts": "number", "a": "number", "b": "number", "id": "number"}
               for n in "RST"}
    q = parse_query("SELECT R.id AS r, S.id AS s, T.id AS t FROM R [RANGE 2 SECONDS], "
                    "S [RANGE 1 SECONDS], T [ROWS 30] WHERE R.a = S.a AND S.b = T.b", schemas)
    rng = np.random.default_rng(5)
    n = 900
    streams = rng.integers(0, 3, n).tolist()
    ts = np.round(np.sort(rng.uniform(0, 30, n)), 1).tolist()
    ab = rng.integers(0, 5, (n, 2)).tolist()
    rows = [((a, k), (a, b, k), (b, k))[i] for k, (i, (a, b)) in enumerate(zip(streams, ab))]
    cuts = list(range(30, n, 30))
    for mode, executor in itertools.product(("append", "retract"), ("mjoin", "vector")):
        before = CAUGHT_UP[0]
        got = run_groups(q, plan_split(q, 1), mode, streams, ts, rows, cuts, set(),
                         random.Random(1), workers=2, executor=executor)
        assert got == local_output(q, mode, streams, ts, rows)
        assert CAUGHT_UP[0] - before >= 5


def test_a_result_meets_in_exactly_one_group():
    """HyperCube's invariant on a cycle R(a,c) ⋈ S(a,b) ⋈ T(b,c), P = 8 = 2·2·2: the
    replicas of three joining tuples share exactly one group."""
    schemas = {n: {"ts": "number", "a": "number", "b": "number", "c": "number"} for n in "RST"}
    q = parse_query("SELECT R.a FROM R, S, T WHERE R.a = S.a AND S.b = T.b AND T.c = R.c",
                    schemas)
    plan = plan_split(q, 8)
    assert plan.shares == (2, 2, 2)
    st_ = plan.strides

    def groups(alias, values):
        base = sum(hash((c, values[col])) % plan.shares[c] * st_[c]
                   for c, col in plan.keys[alias])
        return {base + int(o) for o in plan.offsets(alias)}

    rng = np.random.default_rng(1)
    for _ in range(200):
        a, b, c = (int(x) for x in rng.integers(0, 50, 3))
        common = (groups("R", {"a": a, "c": c}) & groups("S", {"a": a, "b": b})
                  & groups("T", {"b": b, "c": c}))
        assert len(common) == 1


def _alternating(w_r: float, w_s: float, n: int):
    """R and S arriving in turn every 0.05 s, R.a = S.a over 7 keys, windows of w_r and w_s
    seconds, one group: (query, plan, streams, times, rows)."""
    schemas = {x: {"ts": "number", "a": "number", "id": "number"} for x in "RS"}
    q = parse_query(f"SELECT R.id AS r, S.id AS s FROM R [RANGE {w_r} SECONDS], "
                    f"S [RANGE {w_s} SECONDS] WHERE R.a = S.a", schemas)
    return (q, plan_split(q, 1), [k % 2 for k in range(n)], [k * 0.05 for k in range(n)],
            [(k % 7, k) for k in range(n)])


def test_entries_are_removed_when_their_rows_expire():
    """State as changes: a group's store holds only entries some window still needs, and a
    rebuild from it continues exactly."""
    q, plan, streams, ts, rows = _alternating(2, 2, 400)  # 20 s of data, 2 s windows
    n = len(rows)
    cuts = list(range(20, n, 20))  # 1 s per micro-batch
    rnd = random.Random(3)
    got = run_groups(q, plan, "retract", streams, ts, rows, cuts, set(range(0, 30, 3)), rnd)
    assert got == local_output(q, "retract", streams, ts, rows)
    # Replay, and look at one group's store after the run: a few seconds of entries left.
    cfg = _config(q, plan, "retract")
    store = sg.MemoryStore()
    split = ColumnarSplit(cfg)
    bounds = [0, *cuts, n]
    sizes = []
    for lo, hi in itertools.pairwise(bounds):
        batch = _union_batch(q, plan, streams[lo:hi], ts[lo:hi], rows[lo:hi], lo, False)
        packets = [(s, p) for rb in split(iter([batch]))
                   for s, p in zip(rb.column("_s").to_pylist(), rb.column("_p").to_pylist(),
                                   strict=True)]
        sg.advance_group(cfg, cfg.keys[0], store, packets)
        sizes.append(len(store.entries))
    assert max(sizes) <= 8 and sizes[-1] <= 8  # (2 streams × ~3 s of 1 s entries)


def test_rows_out_of_their_window_are_not_stored():
    """Micro-batches ten times longer than the windows: an entry keeps only the rows that
    can still matter (pending, or in their window), so the store holds about a window of
    rows, not a micro-batch of them, and a rebuild from it at every micro-batch (on either
    executor, in either mode) still continues exactly."""
    q, plan, streams, ts, rows = _alternating(1, 2, 2000)  # 100 s, 10 rows/s per stream
    n = len(rows)
    cuts = list(range(200, n, 200))  # 10 s per micro-batch
    for mode, executor in itertools.product(("append", "retract"), ("mjoin", "vector")):
        got = run_groups(q, plan, mode, streams, ts, rows, cuts, set(range(len(cuts) + 1)),
                         random.Random(4), executor=executor)
        assert got == local_output(q, mode, streams, ts, rows)
    cfg = _config(q, plan, "append")
    store = sg.MemoryStore()
    for lo, hi in itertools.pairwise([0, *cuts, n]):
        batch = _union_batch(q, plan, streams[lo:hi], ts[lo:hi], rows[lo:hi], lo, False)
        sg.advance_group(cfg, cfg.keys[0], store, _route(cfg, batch)[cfg.keys[0]])
        stored = [0, 0]
        for (i, _, _), (_, blob) in store.items():
            stored[i] += sg.read_part(blob).num_rows
        # R: 1 s of rows (10) and S: 2 s (20) in their windows, plus the rows that wait
        # for the other stream's next micro-batch (at most one per stream here).
        assert stored[0] <= 12 and stored[1] <= 22, stored


def test_a_group_refuses_another_groups_state():
    """A group's meta records which partition group it is: a restart whose grouping keys
    were chosen for other shuffle partitions (so that key 101, group 1's before, is group
    0's now) stops with an error naming the setting, instead of joining group 0's rows
    with group 1's state."""
    q, _, streams, ts, rows = _alternating(2, 2, 40)
    plan = plan_split(q, 2)
    cfg = _config(q, plan, "append")
    cfg.key_partitions = 2
    assert cfg.keys == [100, 101]
    batch = _union_batch(q, plan, streams, ts, rows, 0, False)
    stores = {g: sg.MemoryStore() for g in cfg.keys}
    for g, packets in _route(cfg, batch).items():
        sg.advance_group(cfg, g, stores[g], packets)
    again = _config(q, plan, "append")  # the same keys: a rebuild continues
    again.key_partitions = 2
    sg.advance_group(again, 101, stores[101], [])
    other = _config(q, plan, "append")
    other.keys, other.key_partitions = [101, 100], 4
    with pytest.raises(AdaptcqError, match=r"partition group 0 \(grouping key 101\) found "
                       r"the state of partition group 1 .*spark\.sql\.shuffle\.partitions, "
                       r"which was 2 when the state was written and is 4 now"):
        sg.advance_group(other, 101, stores[101], [])


def _route(cfg, batch) -> dict[int, list]:
    packets: dict[int, list] = {g: [] for g in cfg.keys}
    for rb in ColumnarSplit(cfg)(iter([batch])):
        for g, s, p in zip(*(rb.column(c).to_pylist() for c in ("_g", "_s", "_p")),
                           strict=True):
            packets[g].append((s, p))
    return packets


@pytest.mark.parametrize("executor", ["mjoin", "vector"])
def test_replicated_late_rows_and_unmatched_deletions_are_reported_once(executor):
    """Replicas never show twice: a late row of a replicated stream, and an explicit
    deletion of a row that is not there, are each reported by one group; explicit deletions
    in replicated streams delete in every replica."""
    schemas = {n: {"ts": "number", "a": "number", "b": "number", "id": "number"}
               for n in "RST"}
    q = parse_query("SELECT R.id AS r, S.id AS s, T.id AS t FROM R, S, T "
                    "WHERE R.a = S.a AND S.b = T.b", schemas)
    plan = plan_split(q, 4)
    assert plan.shares == (2, 2)
    cfg = _config(q, plan, "retract", signed=True, executor=executor)
    stores = {g: sg.MemoryStore() for g in cfg.keys}
    # (stream, ts, row, sign): R(a, id), S(a, b, id), T(b, id)
    batches = [
        [(0, 1.0, (1, 10), 1), (1, 1.0, (1, 2, 20), 1), (2, 1.0, (2, 30), 1),
         (2, 2.0, (2, 31), 1), (0, 3.0, (5, 11), 1)],
        [(0, 0.5, (1, 12), 1),  # late: R's frontier is 3.0
         (2, 4.0, (2, 30), -1),  # deletes T 30 in both of T's replicas
         (0, 4.0, (9, 99), -1),  # deletes nothing: reported once
         (1, 5.0, (1, 2, 21), 1)],
    ]
    out: Counter = Counter()
    rejected = []
    for k, rows in enumerate(batches):
        streams = [r[0] for r in rows]
        batch = _union_batch(q, plan, streams, [r[1] for r in rows], [r[2] for r in rows],
                             100 * k, k == len(batches) - 1)
        sgn = pa.array([r[3] for r in rows] + ([1] if k == len(batches) - 1 else []),
                       pa.int8())
        batch = batch.set_column(batch.schema.get_field_index("_sg"), "_sg", sgn)
        packets = _route(cfg, batch)
        for g in cfg.keys:
            _, res, rej, _, _ = sg.advance_group(cfg, g, stores[g], packets[g])
            if isinstance(res, pa.Table):  # the vectorized executor's output
                res = [tuple(r.values()) for r in res.to_pylist()]
            out.update(res)
            rejected += rej
    reasons = sorted(r[4] for r in rejected)
    assert len(rejected) == 2, rejected
    assert reasons[0].startswith("deletion of a row not in R")
    assert reasons[1].startswith("late by more than the allowed lateness")
    # both by source and by their row in the input, as the local runtime reports them
    where = {r[4].split(" ")[0]: (r[0], r[1]) for r in rejected}
    assert where == {"deletion": ("R", 102), "late": ("R", 100)}, rejected
    cq = ContinuousQuery(q, "mjoin", "retract", time_unit=1e-9, explicit_deletions=True)
    rows = [r for b in batches for r in b if not (r[0] == 0 and r[1] == 0.5)]
    rows.sort(key=lambda r: (r[1], r[0]))
    want = Counter(cq.process([r[0] for r in rows], [r[3] for r in rows],
                              [round(r[1] * 1e9) for r in rows], [r[2] for r in rows]))
    assert out == want and sum(v for k, v in want.items() if k[-2] == -1) >= 1


def test_explain_shows_the_shares(tmp_path, capsys):
    """``adaptcq explain --engine spark --partitions P``: the shares, each stream's
    replication and the rows shipped, at the inputs' row counts; --shares; refusals."""
    import json

    import pyarrow.parquet as pq

    from adaptcq.cli import main
    sql = ("SELECT R.id AS r FROM R [RANGE 1 SECONDS], S [RANGE 1 SECONDS], "
           "T [RANGE 1 SECONDS] WHERE R.a = S.a AND S.b = T.b")
    for name, n in (("R", 10), ("S", 10), ("T", 1000)):
        pq.write_table(pa.table({"ts": np.arange(n, dtype=float), "id": np.arange(n),
                                 "a": np.zeros(n, int), "b": np.zeros(n, int)}),
                       tmp_path / f"{name}.parquet")
    inputs = [x for n in "RST" for x in ("--input", f"{n}={tmp_path / n}.parquet")]
    assert main(["explain", "--engine", "spark", "--partitions", "4", "--json", "--sql", sql,
                 *inputs]) == 0
    d = json.loads(capsys.readouterr().out)
    # T is 100 times larger than R: keep it unreplicated, all 4 groups on b
    assert d["shares"] == {"R.a = S.a": 1, "S.b = T.b": 4} and d["replicas"]["R"] == 4
    assert d["rates_from"] == "row counts of the inputs"
    assert main(["explain", "--engine", "spark", "--partitions", "4", "--sql", sql]) == 0
    text = capsys.readouterr().out
    assert "R.a = S.a" in text and "tuples shipped per input tuple: 1.667" in text
    assert main(["explain", "--engine", "spark", "--shares", "S.b=3", "--json",
                 "--sql", sql]) == 0
    assert json.loads(capsys.readouterr().out)["shares"] == {"R.a = S.a": 1, "S.b = T.b": 3}
    for argv, message in (
            (["explain", "--partitions", "2", "--sql", sql], "give --engine spark"),
            (["explain", "--engine", "spark", "--shares", "S.b", "--sql", sql],
             "expected STREAM.COLUMN=P"),
            (["run", "--sql", sql, "--shares", "S.b=2", *inputs], "need --engine spark")):
        assert main(argv) != 0
        assert message in capsys.readouterr().err


def test_a_long_run_keeps_a_bounded_history_and_whole_totals(monkeypatch):
    """``write_batch`` on a query running for days: ``SparkRun.history`` keeps the latest
    statistics rows only; the totals the summary and the benchmarks read count every row."""
    import json

    from adaptcq.runtime import spark as spark_rt

    monkeypatch.setattr(spark_rt, "HISTORY_ROWS", 5)
    run = spark_rt.SparkRun()

    class Batch:  # what foreachBatch hands over: only toArrow is used
        def __init__(self, rows):
            self.rows = rows

        def toArrow(self):
            return pa.table({
                "_aq_kind": pa.array([spark_rt.KIND_STATS] * len(self.rows), pa.int8()),
                "_aq_data": pa.array([None] * len(self.rows), pa.binary()),
                "_aq_info": [json.dumps(r) for r in self.rows]})

    for b in range(20):
        rows = [{"group": g, "rows_in": 10, "engine_cpu_seconds": 0.5,
                 "cache_hit": b % 2 == 0, "caught_up": b % 4 == 1, "batch": b}
                for g in (0, 1)]
        spark_rt.write_batch(Batch(rows), b, None, None, run, ["x"])
    assert len(run.history) == 5
    assert [h["batch"] for h in run.history] == [17, 18, 18, 19, 19]
    assert run.group_batches == 40 and run.rows_in == 400 and run.batches == 20
    assert run.engine_cpu_seconds == pytest.approx(20.0)
    assert (run.live_copies, run.caught_up) == (20, 10)
    assert sorted(run.groups) == [0, 1] and run.groups[1]["batch"] == 19


def test_a_value_python_cannot_hold_is_refused_naming_file_row_and_column():
    """A group's released rows become Python values: a date past 9999 raised a bare
    OverflowError from the Spark query; now the local runtime's message, with the file."""
    from types import SimpleNamespace

    from adaptcq.runtime.spark_split import _SEP
    t = pa.table({"d": pa.array([0, 2_932_897], pa.date32()),
                  "_o1": [f"{_SEP}data{_SEP}R.parquet"] * 2, "_o2": pa.array([7, 8], pa.int64())})
    cfg = SimpleNamespace(stream_columns=[["d"]], sources=["R"])
    with pytest.raises(AdaptcqError, match=r"stream R \(file /data/R\.parquet\): row 8 has a "
                       r"value in column 'd' \(date32\[day\]\) outside the years 1 to 9999"):
        sg._check_python_values(cfg, 0, t)
    sg._check_python_values(cfg, 0, t.slice(0, 1))  # (in range: nothing to say)
