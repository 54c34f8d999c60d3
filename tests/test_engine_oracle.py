"""MJoin and XJoin against the brute-force oracle on random queries, data and plan changes."""

from __future__ import annotations

import itertools
import random
import re
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from adaptcq.engine.continuous import ContinuousQuery
from adaptcq.engine.mjoin import join_columns
from adaptcq.engine.rules import cache_key, prefix_invariant, row_key_positions
from adaptcq.engine.xjoin import Tree
from adaptcq.query.cql import parse_query
from conftest import examples
from oracle import Oracle, assert_equals_oracle, engine_outputs

COLS = ("a", "b", "c")
SCHEMA = {"a": "number", "b": "number", "c": "number", "id": "number", "ts": "number"}


@st.composite
def queries(draw, max_streams=6, window=None):
    """Random CQL text over a random connected join graph (trees, cycles, complete
    graphs, several predicates per pair), random windows (``window``: this one for every
    stream) and selections."""
    n = draw(st.integers(2, max_streams))
    names = [f"S{i}" for i in range(n)]
    edges = []
    for i in range(1, n):
        edges.append((draw(st.integers(0, i - 1)), i))
    extra = draw(st.sampled_from(["tree", "cycle", "complete", "multi"]))
    if extra == "cycle" and n >= 3:
        edges.append((0, n - 1))
    elif extra == "complete":
        edges = [(i, j) for i in range(n) for j in range(i + 1, n)]
    preds = [f"{names[i]}.{draw(st.sampled_from(COLS[:2]))} = "
             f"{names[j]}.{draw(st.sampled_from(COLS[:2]))}" for i, j in edges]
    if extra == "multi":  # a second predicate between one pair: a two-column probe key
        i, j = edges[draw(st.integers(0, len(edges) - 1))]
        preds.append(f"{names[i]}.b = {names[j]}.a" if preds[0].endswith(".b")
                     else f"{names[i]}.b = {names[j]}.b")
    sels = []
    for nm in names:
        sel = draw(st.sampled_from([None, None, "{s}.c > 0", "{s}.c IS NOT NULL",
                                    "{s}.c IN (0, 2)", "({s}.c BETWEEN 0 AND 1 OR {s}.a = 2)",
                                    "{s}.c <> 1"]))
        if sel:
            sels.append(sel.format(s=nm))
    windows = []
    for _ in names:
        if window is not None:
            windows.append(f" {window}")
            continue
        kind = draw(st.sampled_from(["range", "rows", "none"]))
        if kind == "range":
            windows.append(f" [RANGE {draw(st.sampled_from([0, 1, 2.5, 4]))} SECONDS]")
        elif kind == "rows":
            windows.append(f" [ROWS {draw(st.integers(1, 4))}]")
        else:
            windows.append("")
    select = ", ".join(f"{nm}.id AS i{k}" for k, nm in enumerate(names)) + f", {names[0]}.a"
    frm = ", ".join(nm + w for nm, w in zip(names, windows))
    sql = f"SELECT {select} FROM {frm} WHERE " + " AND ".join(preds + sels)
    return parse_query(sql, {nm: SCHEMA for nm in names})


@st.composite
def arrivals(draw, n_streams, max_rows=22):
    """Arrivals in timestamp order with ties, duplicate keys and NULL keys."""
    k = draw(st.integers(1, max_rows))
    value = st.sampled_from([0, 1, None]) if draw(st.booleans()) else st.sampled_from([0, 1])
    streams, ts, rows = [], [], []
    t = 0.0
    for r in range(k):
        t += draw(st.sampled_from([0.0, 0.0, 0.5, 1.0, 3.0]))
        streams.append(draw(st.integers(0, n_streams - 1)))
        ts.append(t)
        # columns per stream are (join attrs..., selection cols..., id); fill by name later
        rows.append({"a": draw(value), "b": draw(value), "c": draw(value), "id": r})
    return streams, ts, rows


def as_tuples(query, streams, rows):
    return [tuple(r[c] for c in query.columns[query.aliases[i]]) for i, r in zip(streams, rows)]


def random_tree(aliases, rnd: random.Random) -> Tree:
    nodes: list[Tree] = list(aliases)
    rnd.shuffle(nodes)
    while len(nodes) > 1:
        i, j = sorted(rnd.sample(range(len(nodes)), 2))
        b = nodes.pop(j)
        a = nodes.pop(i)
        nodes.append((a, b) if rnd.random() < 0.5 else (b, a))
    return nodes[0]


def check(query, mode, executor, streams, ts, rows, seed, options=None, chunks=1):
    rnd = random.Random(seed)
    cq = ContinuousQuery(query, executor, mode, trace=True, **(options or {}))
    out = []
    cuts = sorted(rnd.sample(range(1, len(rows)), min(chunks - 1, len(rows) - 1))) \
        if len(rows) > 1 else []
    bounds = [0, *cuts, len(rows)]
    for lo, hi in itertools.pairwise(bounds):
        if executor == "mjoin" and lo > 0:  # re-order random pipelines mid-stream
            for a in rnd.sample(query.aliases, rnd.randint(1, len(query.aliases))):
                others = [x for x in query.aliases if x != a]
                rnd.shuffle(others)
                cq.executor.set_order(a, others)
        out += cq.process(streams[lo:hi], None, ts[lo:hi], rows[lo:hi])
    got = engine_outputs(cq.trace, out)
    want = Oracle(query, mode).run(streams, None, ts, rows)
    assert got[0] == want[0], "the update streams ΔR differ from the oracle's"
    for k, (g, w) in enumerate(zip(got[1], want[1])):
        assert g == w, f"update {k} {want[0][k]}: engine {dict(g)} != oracle {dict(w)}"
    return out


common = settings(max_examples=examples(120), deadline=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@common
@given(data=st.data(), mode=st.sampled_from(["append", "retract"]), seed=st.integers(0, 10**6))
def test_mjoin_equals_oracle_with_reorderings(data, mode, seed):
    q = data.draw(queries())
    streams, ts, rows = data.draw(arrivals(len(q.aliases)))
    check(q, mode, "mjoin", streams, ts, as_tuples(q, streams, rows), seed, chunks=4)


@common
@given(data=st.data(), mode=st.sampled_from(["append", "retract"]), seed=st.integers(0, 10**6))
def test_xjoin_equals_oracle_on_random_trees(data, mode, seed):
    q = data.draw(queries())
    streams, ts, rows = data.draw(arrivals(len(q.aliases)))
    tree = random_tree(q.aliases, random.Random(seed)) if seed % 3 else None  # None: left-deep
    check(q, mode, "xjoin", streams, ts, as_tuples(q, streams, rows), seed, {"tree": tree})


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), seed=st.integers(0, 10**6))
def test_mjoin_and_xjoin_agree_on_larger_inputs(data, seed):
    """Bigger inputs than the oracle can afford: the two executors check each other."""
    q = data.draw(queries(max_streams=4))
    rnd = random.Random(seed)
    streams = [rnd.randrange(len(q.aliases)) for _ in range(300)]
    ts = sorted(rnd.choice([0, 0.5, 1]) * k / 3 for k in range(300))
    rows = [{"a": rnd.choice([0, 1, 2, 3, None]), "b": rnd.choice([0, 1, 2]),
             "c": rnd.choice([0, 1, 2]), "id": k} for k in range(300)]
    tup = as_tuples(q, streams, rows)
    for mode in ("append", "retract"):
        outs = []
        for ex in ("mjoin", "xjoin"):
            cq = ContinuousQuery(q, ex, mode)
            outs.append(sorted(map(repr, cq.process(streams, None, ts, tup))))
        assert outs[0] == outs[1]


def test_worked_example_3_1():
    """a-caching.txt Example 3.1: inserting <1> into R1 yields the one result <1,1,2,2>."""
    sch = {"R1": {"a": "number"}, "R2": {"a": "number", "b": "number"}, "R3": {"b": "number"}}
    q = parse_query("SELECT R1.a AS a1, R2.a AS a2, R2.b AS b2, R3.b AS b3 FROM R1, R2, R3 "
                    "WHERE R1.a = R2.a AND R2.b = R3.b", sch)
    # Figure 2(b): R2 = {<1,2>, <1,3>, <2,3>}, R3 = {<2>, <4>}. (R2's columns are (a, b).)
    streams = [1, 1, 1, 2, 2, 0]
    rows = [(1, 2), (1, 3), (2, 3), (2,), (4,), (1,)]
    for ex in ("mjoin", "xjoin"):
        cq = ContinuousQuery(q, ex, "append")
        out = cq.process(streams, None, [0.0] * 6, rows)
        assert out == [(1, 1, 2, 2, 1, 0.0)]


@settings(max_examples=examples(80), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), mode=st.sampled_from(["append", "retract"]),
       executor=st.sampled_from(["mjoin", "xjoin"]), seed=st.integers(0, 10**6))
def test_snapshot_and_restore_continue_exactly(data, mode, executor, seed):
    """A query checkpointed at any point and restored gives the output of an
    uninterrupted run (what the Spark runtime's state store relies on)."""
    q = data.draw(queries(max_streams=4))
    streams, ts, rows = data.draw(arrivals(len(q.aliases)))
    rows = as_tuples(q, streams, rows)
    uninterrupted = ContinuousQuery(q, executor, mode)
    whole = uninterrupted.process(streams, None, ts, rows)
    cut = random.Random(seed).randint(0, len(rows))
    first = ContinuousQuery(q, executor, mode)
    out = first.process(streams[:cut], None, ts[:cut], rows[:cut]) if cut else []
    second = ContinuousQuery.restore(q, first.snapshot(), mode)
    out += second.process(streams[cut:], None, ts[cut:], rows[cut:]) if cut < len(rows) else []
    assert sorted(map(repr, out)) == sorted(map(repr, whole))
    assert second.stats.updates == uninterrupted.stats.updates
    assert second.stats.arrivals == uninterrupted.stats.arrivals


@common
@given(steps=st.lists(st.tuples(st.booleans(), st.integers(-3, 6)), max_size=60))
def test_expiry_clock_queue_keeps_the_heaps_order(steps):
    """stream.windows.ExpiryClock with its deque (one window length) pops exactly what the
    heap alone pops, in the same order, also when entries come out of order (late
    arrivals, which go to the heap) and when ``due`` drains part of them; ``pending`` is
    the sorted rest; a clock pickled before the deque existed loads."""
    import pickle

    from adaptcq.stream.windows import ExpiryClock
    fast, ref = ExpiryClock(fifo=True), ExpiryClock()
    t, rid = 0.0, 0
    for push, step in steps:
        if push:  # mostly forward in time; a negative step is a late arrival
            t = max(0.0, t + step)
            rid += 1
            for clock in (fast, ref):
                clock.push((t + 2.5, rid, rid % 3, rid))
        else:
            now = t + step
            assert list(fast.due(now)) == list(ref.due(now))
    assert fast.pending() == sorted(ref.heap) and len(fast) == len(ref)
    assert list(fast.due(float("inf"))) == sorted(ref.heap)
    old = ExpiryClock.__new__(ExpiryClock)
    old.__setstate__((None, {"heap": [(1.0, 1, 0, 1)]}))
    assert old.fifo is None and list(old.due(2.0)) == [(1.0, 1, 0, 1)]
    assert pickle.loads(pickle.dumps(fast)).pending() == fast.pending()


@common
@given(data=st.data(), mode=st.sampled_from(["append", "retract"]),
       executor=st.sampled_from(["mjoin", "xjoin"]))
def test_one_window_length_queues_expiries_in_arrival_order(data, mode, executor):
    """When every windowed stream has one window length the clock's deque holds the
    deletions (ExpiryClock): the output, in order, is the heap-only clock's, also with
    arrivals out of timestamp order."""
    w = data.draw(st.sampled_from([0, 1, 2.5]))
    q = data.draw(queries(max_streams=4, window=f"[RANGE {w} SECONDS]"))
    streams, ts, rows = data.draw(arrivals(len(q.aliases)))
    if data.draw(st.booleans()) and len(ts) > 2:  # some late arrivals
        k = data.draw(st.integers(1, len(ts) - 1))
        ts = ts[:k] + [max(0.0, x - 2.0) for x in ts[k:k + 2]] + ts[k + 2:]
    rows = as_tuples(q, streams, rows)
    fast, ref = ContinuousQuery(q, executor, mode), ContinuousQuery(q, executor, mode)
    ref.clock.fifo = None
    assert fast.clock.fifo is not None
    out_fast = fast.process(streams, None, ts, rows)
    out_ref = ref.process(streams, None, ts, rows)
    fast.advance_to(float("inf"))
    ref.advance_to(float("inf"))
    assert out_fast == out_ref and fast.drain() == ref.drain()
    assert fast.stats.deletions == ref.stats.deletions


def random_cache_moves(cq, rnd: random.Random, tries: int = 6) -> None:
    """Place and drop random caches, ignoring the placements the mechanism refuses: half
    of the placements are any segment with a random Y, a quarter one of the placements
    that satisfy the invariants for the current orders (``valid_placements``):
    prefix-invariant caches and globally-consistent X ⋈ Y ones (a-caching.txt §6), Y
    holding the pipeline's own stream included, and a quarter ``hard_placements``. Several
    caches end up in use at once, in different pipelines, so one cache's CacheUpdates run
    after another's hits."""
    ex = cq.executor
    for _ in range(tries):
        pipeline = rnd.choice(ex.query.aliases)
        order = ex.orders[pipeline]
        if rnd.random() < 0.3 and ex.placements[pipeline]:
            ex.drop_cache(pipeline, rnd.choice(ex.placements[pipeline])[2])
            continue
        draw = rnd.random()
        if draw < 0.25:  # two at once, one of them refused if they cannot live together
            for pipeline, j, k, extra in hard_placements(ex, rnd):
                try:
                    ex.place_cache(pipeline, j, k, extra, buckets=rnd.choice([1, 2, 64]))
                except ValueError:
                    pass
            continue
        if draw < 0.5:
            valid = valid_placements(ex)
            if not valid:
                continue
            pipeline, j, k, extra = rnd.choice(valid)
        else:
            j = rnd.randint(1, len(order))
            k = rnd.randint(j, len(order))
            rest = [a for a in ex.query.aliases if a not in order[j - 1:k]]
            extra = frozenset(rnd.sample(rest, rnd.randint(0, len(rest)))) \
                if rest and rnd.random() < 0.4 else frozenset()
        try:
            ex.place_cache(pipeline, j, k, extra, buckets=rnd.choice([1, 2, 64]))
        except ValueError:
            pass


def valid_placements(ex) -> list[tuple[str, int, int, frozenset]]:
    """Every (pipeline, start, end, Y) whose X ∪ Y satisfies the prefix invariant for the
    executor's current orders (Def. 3.2; §6 for Y nonempty) and whose key is nonempty, Y
    with the pipeline's own stream only from position 1 (MJoin's guarded caches); whether
    it fits the caches already in use is the executor's to say."""
    q = ex.query
    out = []
    for p in q.aliases:
        order = ex.orders[p]
        for j in range(1, len(order) + 1):
            for k in range(j, len(order) + 1):
                seg = order[j - 1:k]
                if not cache_key(q, [p, *order[:j - 1]], seg):
                    continue
                rest = [a for a in q.aliases if a not in seg and (j == 1 or a != p)]
                for size in range(len(rest) + 1):
                    for extra in itertools.combinations(rest, size):
                        if prefix_invariant(ex.orders, [*seg, *extra]):
                            out.append((p, j, k, frozenset(extra)))
    return out


def hard_placements(ex, rnd: random.Random, valid=None) -> list:
    """One or two placements (of ``valid``, default ``valid_placements``) that are hard to
    get right, in random order of placement: when there are such, a §6 cache and a cache
    whose CacheUpdate in the §6 cache's pipeline follows its hits before all of its Y is
    joined (the executor must refuse whichever comes second), or a §6 cache with the
    pipeline's own stream R_i in Y and a key whose order is not the order of R_i's
    columns (MJoin's guard); else any §6 cache."""
    valid = valid_placements(ex) if valid is None else valid
    glob = [v for v in valid if v[3]]
    pairs = [(a, b) for a in glob for b in valid if _after_hits(ex.orders, a, b)]
    guarded = [v for v in glob if _permuted_guard(ex, v)]
    if pairs and (not guarded or rnd.random() < 0.5):
        head = list(rnd.choice(pairs))
        rnd.shuffle(head)
        return head
    if guarded and rnd.random() < 0.9:
        return [rnd.choice(guarded)]
    return glob[:1]


def _after_hits(orders, first, other) -> bool:
    """Whether cache ``other`` (a placement) has a CacheUpdate in the pipeline of §6 cache
    ``first`` at or after the end of its segment, before all of its Y is joined."""
    p, _, k, y = first
    pipeline, j, end, extra = other
    z = {*orders[pipeline][j - 1:end], *extra}
    pos = len(z) - 1
    return p in z and pos >= k and not y <= {p, *orders[p][:pos]}


def _permuted_guard(ex, placement) -> bool:
    """Whether ``placement`` is a §6 cache with its pipeline's stream R_i in Y whose key
    columns, in the cache key's order, are not in the order of R_i's columns."""
    p, j, k, extra = placement
    if p not in extra:
        return False
    key = cache_key(ex.query, [p, *ex.orders[p][:j - 1]], ex.orders[p][j - 1:k])
    positions = row_key_positions(ex.query, key, p)
    return positions is not None and list(positions) != sorted(positions)


def check_cache_invariants(ex) -> None:
    """Every entry (u, v) of every cache in use, recomputed by brute force from the SteMs'
    rows: v ⊆ σ_{K=u}(X) (Def. 3.1, 6.1: only live, joining tuples), v = σ_{K=u}(X) for a
    prefix-invariant cache (Def. 3.1), σ_{K=u}(X) ⋉ Y ⊆ v for a globally-consistent one
    (Def. 6.1), and for one with its pipeline's stream in Y an entry only while a tuple
    of that stream has its key. Checked between updates, a stale or missing tuple shows up
    at once, before (or without) any result depending on it."""
    q = ex.query
    live = {s.name: list(s.rows.values()) for s in ex.stems}
    # A cache with its pipeline's stream R_i in Y keeps an entry only while an R_i tuple
    # has the entry's key (MJoin's guard: what makes Def. 6.1 exact for it).
    guarded = {id(c): p for p, placed in ex.placements.items() for _, _, c in placed
               if p in c.extra}
    for c in ex.caches.values():
        if id(c) in guarded:
            p = guarded[id(c)]
            where = [q.columns[p].index(next(r.column for r in cls if r.stream == p))
                     for cls in (next(k for k in q.classes if ref in k) for ref in c.key)]
            keys = {u[0] if len(u) == 1 else u
                    for u in (tuple(row[i] for i in where) for row in live[p])}
            for e in c.table:
                assert e is None or e[0] in keys, \
                    f"{c.name} in {p}'s pipeline keeps entry {e[0]!r} with no {p} tuple"
        x = list(c.members)
        xy = x + sorted(c.extra)
        whole = _brute_join(q, xy, live)
        cols = [(x.index(r.stream), q.columns[r.stream].index(r.column)) for r in c.key]

        def key(comp, cols=cols):
            u = tuple(comp[i][p] for i, p in cols)
            return u[0] if len(u) == 1 else u
        exact: dict = {}
        for comp in _brute_join(q, x, live):
            exact.setdefault(key(comp), set()).add(tuple(map(id, comp)))
        lower: dict = {}
        for comp in whole:
            lower.setdefault(key(comp[:len(x)]), set()).add(tuple(map(id, comp[:len(x)])))
        for e in c.table:
            if e is None:
                continue
            u, v = e
            held = set(v)
            assert all(ids == tuple(map(id, comp)) for ids, comp in v.items()), c.name
            assert held <= exact.get(u, set()), \
                f"{c.name} entry {u!r} holds tuples not in σ_K=u(X): stale"
            want = lower.get(u, set()) if c.extra else exact.get(u, set())
            assert want <= held, f"{c.name} entry {u!r} misses tuples it must hold"


def _brute_join(q, streams: list[str], live: dict) -> list[tuple]:
    """The join of ``streams``'s live rows (nested loops, every equality between two of
    them; NULL joins nothing), as tuples of rows in ``streams`` order."""
    eqs = [(streams.index(a.stream), q.columns[a.stream].index(a.column),
            streams.index(b.stream), q.columns[b.stream].index(b.column))
           for a, b in q.equalities() if a.stream in streams and b.stream in streams]
    out: list[tuple] = [()]
    for k, s in enumerate(streams):
        checks = [(i, pi, pj) if j == k else (j, pj, pi) for i, pi, j, pj in eqs
                  if max(i, j) == k]
        out = [comp + (row,) for comp in out for row in live[s]
               if all(comp[o][po] is not None and comp[o][po] == row[pm]
                      for o, po, pm in checks)]
    return out


@dataclass(frozen=True)
class Workload:
    """A query over streams S0, S1, ... (columns a, b, c, id) and its arrivals; the repr is
    the Python that rebuilds it, so a falsifying example pastes into an ``@example``.
    ``rows`` are (a, b, c) per arrival; a row's id is its position."""

    sql: str
    streams: tuple[int, ...]
    ts: tuple[float, ...]
    rows: tuple[tuple, ...]
    parsed: object = field(default=None, repr=False, compare=False)

    @property
    def query(self):
        if self.parsed is not None:
            return self.parsed
        names = sorted(set(re.findall(r"\bS\d+\b", self.sql)), key=lambda n: int(n[1:]))
        return parse_query(self.sql, {nm: SCHEMA for nm in names})

    def tuples(self, query) -> list[tuple]:
        dicts = [{"a": a, "b": b, "c": c, "id": k} for k, (a, b, c) in enumerate(self.rows)]
        return as_tuples(query, self.streams, dicts)


@st.composite
def workloads(draw, max_streams=6, max_rows=22):
    q = draw(queries(max_streams))
    streams, ts, rows = draw(arrivals(len(q.aliases), max_rows))
    return Workload(q.sql, tuple(streams), tuple(ts),
                    tuple((r["a"], r["b"], r["c"]) for r in rows), q)


# Regressions (docs/testing.md). Lost results of a globally-consistent cache with the
# pipeline's own stream in Y (§6, MJoin's guarded caches): a retraction evicted the entry of
# the last R_i tuple with its key, then the deletion pipeline's CacheLookup re-created it;
# X tuples arriving while no R_i tuple had the key were never added, and the next R_i tuple
# hit the stale entry. The first is the shrunk case, the second the query of issue 8.
@example(case=Workload(
    sql="SELECT S0.id AS i0, S1.id AS i1, S0.a FROM S0 [RANGE 0 SECONDS], "
        "S1 [RANGE 0 SECONDS] WHERE S0.a = S1.a",
    streams=(1, 0, 1), ts=(0.0, 0.5, 0.5), rows=((0, 0, 0),) * 3), mode="retract", seed=0)
@example(case=Workload(
    sql="SELECT S0.id AS i0, S1.id AS i1, S2.id AS i2, S0.a FROM S0 [RANGE 0 SECONDS], S1, S2 "
        "WHERE S0.b = S1.a AND S0.a = S2.a",
    streams=(1, 1, 0, 0, 2, 0, 1, 0, 1, 0, 1, 0),
    ts=(3.0, 3.5, 3.5, 4.0, 7.0, 7.5, 10.5, 11.5, 11.5, 11.5, 11.5, 11.5),
    rows=((0, 0, 0), (1, 1, 1), (1, 1, 1), (0, 1, 1), (1, 1, 1), (1, 0, 1), (0, 1, 0),
          (1, 0, 0), (0, 0, 1), (0, 0, 1), (1, 0, 0), (0, 0, 1))), mode="retract", seed=1188)
@settings(max_examples=examples(150), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=workloads(max_streams=5, max_rows=26), mode=st.sampled_from(["append", "retract"]),
       seed=st.integers(0, 10**6))
def test_caches_never_change_results(case, mode, seed):
    """Random cache placements (prefix-invariant and §6, several at once), drops, orders
    (chosen so that caches satisfy the prefix invariant) and profiled tuples: output
    equals the oracle's, and every cache entry its definition's after every update."""
    check_caches(case, mode, seed)


def check_caches(case: Workload, mode: str, seed: int) -> None:
    q = case.query
    streams, ts, rows = list(case.streams), list(case.ts), case.tuples(q)
    rnd = random.Random(seed)
    cq = ContinuousQuery(q, "mjoin", mode, trace=True)
    cq.attach(_Nop())  # asks for nothing: the loop below forces profiled insertions
    # Orders that give the prefix invariant for a group of streams: all pipelines of the
    # group start with the rest of the group.
    group = rnd.sample(q.aliases, rnd.randint(2, len(q.aliases)))
    for a in q.aliases:
        head = [g for g in group if g != a] if a in group else []
        tail = [x for x in q.aliases if x != a and x not in head]
        rnd.shuffle(head)
        rnd.shuffle(tail)
        cq.executor.set_order(a, head + tail)
    out = []
    cuts = sorted(rnd.sample(range(len(rows) + 1), min(4, len(rows) + 1)))
    bounds = [0, *cuts, len(rows)]
    for lo, hi in itertools.pairwise(bounds):
        random_cache_moves(cq, rnd)
        if hi > lo:
            # Profile some tuples by hand: the breadth-first path must keep caches too.
            for k in range(lo, hi):
                cq._next_profile = cq._next_event = cq.next_rid + 1 if rnd.random() < 0.3 \
                    else float("inf")
                out += cq.process(streams[k:k + 1], None, ts[k:k + 1], rows[k:k + 1])
                check_cache_invariants(cq.executor)
    assert_equals_oracle(q, mode, streams, ts, rows, cq.trace, out)


class _Nop:
    """A policy that asks for nothing (engine.protocols.Policy): attached, it lets a test
    force one profiled insertion by setting the query's next profiling point."""

    sample_probability, needs_fanouts, interval, W, seed = 0.0, True, None, None, 0

    def stream_probability(self, i):
        return 0.0

    def bind(self, profiler):
        pass

    def on_profile(self, cq, obs, ts):
        pass

    def on_interval(self, cq, ts):
        pass

    def report(self):
        return {}


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), mode=st.sampled_from(["append", "retract"]), seed=st.integers(0, 10**6))
def test_nested_loop_joins_equal_the_oracle(data, mode, seed):
    """Joins that scan a window (no hash index: a-caching.txt Figure 10), with caches."""
    q = data.draw(queries(max_streams=4))
    streams, ts, rows = data.draw(arrivals(len(q.aliases)))
    rows = as_tuples(q, streams, rows)
    rnd = random.Random(seed)
    scanned = [rnd.choice(q.aliases)] if rnd.random() < 0.5 else \
        [f"{a}.{c}" for a in q.aliases for c in join_columns(q, a)][:2]
    cq = ContinuousQuery(q, "mjoin", mode, trace=True, nested_loop=scanned)
    out = []
    for k in range(len(rows)):
        if k % 5 == 0:
            random_cache_moves(cq, rnd, tries=2)
        out += cq.process(streams[k:k + 1], None, ts[k:k + 1], rows[k:k + 1])
    assert engine_outputs(cq.trace, out) == Oracle(q, mode).run(streams, None, ts, rows)


def test_retraction_leaves_no_unguarded_global_cache_entry():
    """Regression (issue 8): a globally-consistent cache in ΔS1's pipeline with S1 itself
    in Y keeps the entry for key u only while an S1 tuple has key u (§6, MJoin ``_guard``).
    The retraction of the last one evicted the entry and then its deletion pipeline's
    CacheLookup re-created it; the S0 tuple arriving next was not added (no S1 partner),
    and the next S1 tuple hit the stale, empty entry: a lost result."""
    sch = {"a": "number", "id": "number"}
    q = parse_query("SELECT S0.id AS i0, S1.id AS i1 FROM S0 [RANGE 0 SECONDS], "
                    "S1 [RANGE 0 SECONDS] WHERE S0.a = S1.a", {"S0": sch, "S1": sch})
    cq = ContinuousQuery(q, "mjoin", "retract")
    cache = cq.executor.place_cache("S1", 1, 1, extra={"S1"})
    assert cq.process([1], None, [0.0], [(7, 0)]) == []
    assert cache.entries == 1  # created by the miss: S0 has nothing with a = 7
    # S1's tuple expires (its retraction runs the pipeline), then S0's tuple arrives.
    assert cq.process([0], None, [0.5], [(7, 1)]) == []
    assert cache.entries == 0
    assert cq.process([1], None, [0.5], [(7, 2)]) == [(1, 2, 1, 0.5)]


@pytest.mark.parametrize("when", ["before", "after", "profiled"])
def test_one_row_object_arriving_twice_keeps_both_results(when):
    """Regression: caches identify segment tuples by the ids of their base rows, so the same
    tuple object passed for two arrivals of one stream made a cache keep one result of
    the two. Rows are copied while caches exist (by the compiled pipelines, and by the
    profiled path: "profiled"), and made distinct when the first cache is placed ("after")."""
    sch = {"a": "number", "b": "number"}
    q = parse_query("SELECT R.b AS rb, S.b AS sb, T.b AS tb FROM R, S, T "
                    "WHERE R.a = S.a AND S.a = T.a", {"R": sch, "S": sch, "T": sch})
    row = (1, 5)
    results = []
    for cached in (False, True):
        cq = ContinuousQuery(q, "mjoin", "retract")
        cq.attach(_Nop())
        ex = cq.executor
        for a, order in {"R": ["S", "T"], "S": ["T", "R"], "T": ["S", "R"]}.items():
            ex.set_order(a, order)
        if cached and when != "after":
            ex.place_cache("R", 1, 2)
        out = []
        for i in (1, 2, 2):  # the same object for S's and T's arrivals
            if when == "profiled":
                cq._next_profile = cq._next_event = cq.next_rid + 1
            out += cq.process([i], None, [0], [row])
        if cached and when == "after":
            ex.place_cache("R", 1, 2)
        out += cq.process([0, 0], None, [1, 2], [(1, 6), (1, 7)])
        results.append(sorted(out))
    assert results[0] == results[1]
    assert results[1].count((7, 5, 5, 1, 2)) == 2


@pytest.mark.parametrize(("options", "message"), [
    ({"nested_loop": ["S.id"]},
     "nested-loop join 'S.id': S.id is not a join column; S's join columns are: a, b"),
    ({"nested_loop": ["S.nosuch"]},
     "nested-loop join 'S.nosuch': S.nosuch is not a join column; S's join columns are: a, b"),
    ({"nested_loop": ["X"]}, "nested-loop join 'X': no stream X in the query (streams: R, S, T)"),
    ({"nested_loop": ["X.a"]},
     "nested-loop join 'X.a': no stream X in the query (streams: R, S, T)"),
    ({"orders": {"X": ["R", "S"]}},
     "pipeline order for X: no stream X in the query (streams: R, S, T)"),
    ({"orders": {"R": ["S", "T"], "X": [], "Y": []}},
     "pipeline order for X, Y: no stream X or Y in the query (streams: R, S, T)"),
    ({"orders": {"R": ["S"]}}, "pipeline order for R must list each of S, T once, got S"),
])
def test_mjoin_refuses_bad_plan_options(options, message):
    """Regression (issue 8): a nested-loop column no join probes and an order for a stream
    not in the query were accepted and silently ignored."""
    sch = {"a": "number", "b": "number", "id": "number"}
    q = parse_query("SELECT R.id AS r, S.id AS s, T.id AS t FROM R, S, T "
                    "WHERE R.a = S.a AND S.b = T.b", {"R": sch, "S": sch, "T": sch})
    with pytest.raises(ValueError, match=re.escape(message)):
        ContinuousQuery(q, "mjoin", **options)
    # What is valid stays valid: a stream, or one of its join columns.
    for ok in (["S"], ["S.a"], ["S.b", "T"]):
        assert ContinuousQuery(q, "mjoin", nested_loop=ok).executor.nested_loop == set(ok)


@pytest.mark.parametrize(("tree", "message"), [
    ((("R", "S"), "T", "X"), "each join takes exactly two inputs, got 3"),
    (("R",), "each join takes exactly two inputs, got 1"),
    ((("R", "S"), 3), "a leaf must be a stream name, got 3"),
    ((("R", "S"), "X"), "must hold each of R, S, T exactly once"),
])
def test_xjoin_refuses_bad_trees(tree, message):
    """Regression: a third input of a join was silently ignored (or a crash)."""
    sch = {"a": "number", "b": "number", "id": "number"}
    q = parse_query("SELECT R.id AS r, S.id AS s, T.id AS t FROM R, S, T "
                    "WHERE R.a = S.a AND S.b = T.b", {"R": sch, "S": sch, "T": sch})
    with pytest.raises(ValueError, match=re.escape(message)):
        ContinuousQuery(q, "xjoin", tree=tree)
    assert ContinuousQuery(q, "xjoin", tree=["R", ["S", "T"]]).executor.tree == ("R", ("S", "T"))
    # The CLI's text works from Python too (it was taken as one stream named "(R, (S, T))").
    assert ContinuousQuery(q, "xjoin", tree="(R, (S, T))").executor.tree == ("R", ("S", "T"))
    with pytest.raises(ValueError, match=re.escape("each join takes exactly two inputs")):
        ContinuousQuery(q, "xjoin", tree="(R, S, T)")


def test_a_replan_keeps_the_pipelines_it_does_not_change():
    """``MJoin._compile`` keeps the plan object and compiled function of a pipeline whose
    plan, bound objects and bucket counts are unchanged (observers added to one pipeline,
    one pipeline re-ordered), and so its profiled pipeline; changed ones are recompiled.
    Profiled and plain insertions interleaved with such re-plans, caches placed and
    dropped, give the output of an executor left alone."""
    from adaptcq.engine.mjoin import MJoin
    q = parse_query("SELECT R.id AS r, S.id AS s, T.id AS t FROM R, S, T "
                    "WHERE R.a = S.a AND S.b = T.b",
                    {x: {"a": "number", "b": "number", "id": "number"} for x in "RST"})
    orders = {"R": ["S", "T"], "S": ["T", "R"], "T": ["S", "R"]}
    ex, plain = MJoin(q, orders=orders), MJoin(q, orders=orders)
    before = dict(ex.compiled)
    from adaptcq.engine.rules import cache_key

    def watch(a):  # (A-Caching watches no empty key: a cartesian step)
        key = cache_key(q, [a], (ex.orders[a][0],))
        return [(a, 1, key, [].append)] if key else []
    ex.observe_probes(watch("R"))
    assert ex.compiled[("R", "insert")] is not before[("R", "insert")]
    assert all(ex.compiled[k] is c for k, c in before.items() if k != ("R", "insert"))
    ex.clear_observers()
    kept = ex.plans[("S", "insert")]
    ex.set_order("R", ["T", "S"])
    assert ex.plans[("S", "insert")] is kept
    rnd = random.Random(3)
    rid = 0
    for step in range(400):
        i = rnd.randrange(3)
        row = {"R": (rnd.randint(0, 4), rid), "S": (rnd.randint(0, 4), rnd.randint(0, 4), rid),
               "T": (rnd.randint(0, 4), rid)}["RST"[i]]
        rid += 1
        if rnd.random() < 0.3:
            ex.profile_insert(i, rid, row, step)
        else:
            ex.insert(i, rid, row, step)
        plain.insert(i, rid, row, step)
        move = rnd.random()
        if move < 0.05:
            ex.observe_probes(watch(rnd.choice("RST")))
        elif move < 0.1:
            ex.clear_observers()
        elif move < 0.13:
            a = rnd.choice("RST")
            ex.set_order(a, list(reversed(ex.orders[a])))
        elif move < 0.18:
            try:
                cache = ex.place_cache("R", 1, 2, buckets=rnd.choice([1, 7]))
            except ValueError:
                continue
            if rnd.random() < 0.5:
                ex.drop_cache("R", cache)
    assert sorted(ex.out) == sorted(plain.out)
