"""The pipeline plan and its two back ends (engine.plan, engine.codegen, engine.interp)."""

from __future__ import annotations

import os
import random
import traceback
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adaptcq.engine import plan as plans
from adaptcq.engine.continuous import ContinuousQuery
from adaptcq.engine.interp import Observation
from adaptcq.engine.mjoin import MJoin
from adaptcq.engine.plan import CacheLookup, CacheUpdate, Emit, Observe, Probe
from adaptcq.query.cql import parse_query
from adaptcq.stats.profiler import Profiler
from conftest import examples
from test_engine_oracle import Workload, random_cache_moves, workloads

GOLDEN = Path(__file__).parent / "golden"
CHAIN = ("SELECT R.id AS r, S.id AS s, T.id AS t FROM R [RANGE 10 SECONDS], "
         "S [RANGE 10 SECONDS], T [RANGE 10 SECONDS] WHERE R.a = S.a AND S.b = T.b")
SCHEMA = {"a": "number", "b": "number", "id": "number"}


def chain():
    return parse_query(CHAIN, {s: SCHEMA for s in "RST"})


# ----- compiled and interpreted give identical output and state ---------------------------
def _state(ex: MJoin):
    """Everything an update can change, by value: SteM rows and times, every index, every
    cache entry (segment tuples by value) and the caches' hit and miss counts."""
    stems = [(s.rows, s.times, {p: {k: dict(b) for k, b in idx.items()}
                                for p, idx in s._indexes.items()}) for s in ex.stems]
    caches = {}
    for ident, c in ex.caches.items():
        entries = {e[0]: sorted(map(repr, e[1].values())) for e in c.table if e is not None}
        caches[repr(ident)] = (entries, list(c.counts))
    return stems, caches


def _interpreted(cq: ContinuousQuery) -> list:
    """Make ``cq``'s executor run every update through the interpreter (with caches);
    returns a counter of the insertions it interpreted."""
    ex, calls = cq.executor, [0]
    interpret_insert = ex.interpret_insert

    def counted(*args, **kwargs):
        calls[0] += 1
        return interpret_insert(*args, **kwargs)
    ex.interpret_insert = counted
    ex.use_interpreter()
    return calls


def _random_orders(pair, rnd: random.Random) -> None:
    """Give both queries of ``pair`` the same random pipeline orders."""
    q = pair[0].query
    for a in q.aliases:
        order = [x for x in q.aliases if x != a]
        rnd.shuffle(order)
        for cq in pair:
            cq.executor.set_order(a, order)


def _in_step(pair, streams, ts, rows, rnd: random.Random, moves, check=None) -> None:
    """Feed both queries of ``pair`` one update at a time, every 4 updates first making
    the same random plan changes on both (each of ``moves``, ``move(cq, rng)``, with its
    own generator from one seed); after each update both have emitted the same rows and
    hold the same state, and ``check(k)`` runs."""
    for k in range(len(rows)):
        if k % 4 == 0:
            move_seed = rnd.random()
            for cq in pair:
                for move in moves:
                    move(cq, random.Random(move_seed))
        outs = [cq.process(streams[k:k + 1], None, ts[k:k + 1], rows[k:k + 1]) for cq in pair]
        assert outs[0] == outs[1], f"update {k}"
        assert _state(pair[0].executor) == _state(pair[1].executor), f"update {k}"
        if check is not None:
            check(k)


@settings(max_examples=examples(120), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=workloads(max_streams=5, max_rows=24), mode=st.sampled_from(["append", "retract"]),
       seed=st.integers(0, 10**6))
def test_compiled_and_interpreted_agree_update_by_update(case: Workload, mode, seed):
    """Random queries, data, orders and cache placements: after every update the two back
    ends have emitted the same rows in the same order and hold the same state."""
    q = case.query
    streams, ts, rows = list(case.streams), list(case.ts), case.tuples(q)
    pair = [ContinuousQuery(q, "mjoin", mode) for _ in range(2)]
    interpreted = _interpreted(pair[1])
    rnd = random.Random(seed)
    _random_orders(pair, rnd)
    _in_step(pair, streams, ts, rows, rnd, [random_cache_moves])
    # Every insertion of the second query ran through the interpreter, cache moves included.
    assert interpreted[0] == pair[1].stats.insertions


def _interpreted_profiling(ex: MJoin) -> list:
    """Make ``ex.profile_insert`` the interpreter's (breadth-first, no caches used), the
    reference the compiled profiled pipeline is checked against; returns its call count."""
    calls = [0]

    def profile(i, rid, row, ts, fanouts=True):
        calls[0] += 1
        counts = ex.interpret_insert(i, rid, row, ts, use_caches=False, fanouts=fanouts)
        stream = ex.query.aliases[i]
        return Observation(stream, tuple(ex.orders[stream]), counts.delta, [],
                           counts.fanout, counts.results, counts.work)
    ex.profile_insert = profile
    return calls


@settings(max_examples=examples(100), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=workloads(max_streams=5, max_rows=24), mode=st.sampled_from(["append", "retract"]),
       nested=st.booleans(), seed=st.integers(0, 10**6))
def test_compiled_profiling_counts_as_the_interpreter(case: Workload, mode, nested, seed):
    """Every insertion profiled, with random orders, cache placements, probe observers and
    nested-loop joins: the compiled profiled pipeline (codegen ``counting``) emits the
    same rows, leaves the same state and counts the same δ, work, fan-outs and results as
    the interpreter it replaced."""
    q = case.query
    streams, ts, rows = list(case.streams), list(case.ts), case.tuples(q)
    rnd = random.Random(seed)
    loops = [a for a in q.aliases if nested and rnd.random() < 0.5]
    pair = [ContinuousQuery(q, "mjoin", mode, nested_loop=loops) for _ in range(2)]
    pair[0].executor.compile_after = rnd.choice([0, 0, 2])  # compiled from the first tuple on
    interpreted = _interpreted_profiling(pair[1].executor)
    seen: list[list] = [[], []]
    for cq, got in zip(pair, seen):
        cq.attach(Profiler(p=1.0, interval=10**6))
        cq.feed_observation = lambda obs, t, got=got: got.append(
            (obs.stream, tuple(obs.order), list(obs.delta), list(obs.work), obs.fanout,
             obs.results))
    _random_orders(pair, rnd)
    observers = lambda cq, r: _random_observers(cq.executor, r)

    def same_observations(k):
        assert seen[0] == seen[1], f"update {k}"
    _in_step(pair, streams, ts, rows, rnd, [random_cache_moves, observers], same_observations)
    assert interpreted[0] == len(seen[1]) == pair[1].stats.insertions


def _random_observers(ex: MJoin, rnd: random.Random) -> None:
    """Watch the probe key of a random position of a random pipeline (App. A's Bloom
    observers), or clear all watchers."""
    if rnd.random() < 0.3:
        ex.clear_observers()
        return
    pipeline = rnd.choice(ex.query.aliases)
    order = ex.orders[pipeline]
    if not order:
        return
    start = rnd.randint(1, len(order))
    prefix = {pipeline, *order[:start - 1]}
    key = [ref for cls in ex.query.classes for ref in cls if ref.stream == order[start - 1]
           and any(other.stream in prefix for other in cls)]
    if key:
        ex.observe_probes([(pipeline, start, key[:1], lambda u: None)])


def test_interpreter_counts_work_per_operator():
    """The work clock: a hash probe costs 1 plus 1 per bucket entry; delta counts the
    tuples reaching each operator; the results are counted."""
    ex = MJoin(chain(), orders={"R": ["S", "T"]})
    q = ex.query
    col = {a: q.columns[a] for a in q.aliases}

    def row(stream, **v):
        return tuple(v.get(c) for c in col[stream])
    ex.insert(1, 1, row("S", a=1, b=7, id=10), 0)
    ex.insert(1, 2, row("S", a=1, b=8, id=11), 0)
    ex.insert(2, 3, row("T", b=7, id=20), 0)
    ex.insert(2, 4, row("T", b=7, id=21), 0)
    obs = ex.profile_insert(0, 5, row("R", a=1, id=1), 0)
    assert list(obs.delta) == [1, 2]            # one R tuple reaches ⋈S; two RS tuples reach ⋈T
    assert obs.results == 2
    # ⋈S: 1 probe + 2 entries; ⋈T: 2 probes + 2 entries + 2 results emitted
    assert list(obs.work) == [3, 6]
    assert obs.fanout[0] == {"S": 2, "T": 2}  # T shares no predicate with R: every row
    assert sorted(ex.out) == [(1, 10, 20, 1, 0), (1, 10, 21, 1, 0)]


# ----- plans ------------------------------------------------------------------------------
def test_passes_build_the_expected_plan():
    q = chain()
    spec = plans.CacheSpec("C0", ("S", "T"), frozenset(), (next(
        c for c in q.classes for c in c if c.stream == "S" and c.column == "a"),))
    p = plans.build(q, "R", ["S", "T"], "insert", caches=[spec], placements=[(1, 2, spec)])
    assert p.name == "<pipeline ΔR: S⋈T>"
    (lookup, emit) = p.ops
    assert isinstance(lookup, CacheLookup) and isinstance(emit, Emit)
    assert [type(o) for o in lookup.segment] == [Probe, Probe]
    assert lookup.key == ((0, q.columns["R"].index("a")),)
    # S's pipeline holds the CacheUpdate of C0 after its first join (|Z| - 1 = 1)
    ps = plans.build(q, "S", ["T", "R"], "insert", caches=[spec])
    assert [type(o) for o in ps.ops] == [Probe, CacheUpdate, Probe, Emit]
    # append mode: a deletion runs only up to the last CacheUpdate
    pm = plans.build(q, "S", ["T", "R"], "maintain", caches=[spec])
    assert [type(o) for o in pm.ops] == [Probe, CacheUpdate] and pm.ops[1].delete
    assert plans.build(q, "R", ["S", "T"], "maintain").empty
    po = plans.build(q, "R", ["S", "T"], "insert", watches=[(2, spec.key, "O2_0")])
    assert [type(o) for o in po.ops] == [Probe, Observe, Probe, Emit]


# ----- generated code -----------------------------------------------------------------------
def _golden_cases():
    q = chain()
    plain = MJoin(q)
    cached = MJoin(q, orders={"R": ["S", "T"], "S": ["T", "R"], "T": ["S", "R"]})
    cached.place_cache("R", 1, 2, buckets=97)
    retract = MJoin(q, "retract", orders=cached.orders)
    retract.place_cache("R", 1, 2, buckets=97)
    nested = MJoin(q, nested_loop=["T"])
    return {"chain": plain, "chain_cache": cached, "chain_cache_retract": retract,
            "chain_nested_loop": nested}


def _render(ex: MJoin) -> str:
    return "".join(f"# {name}\n{src}\n" for name, src in sorted(ex.pipeline_sources().items()))


@pytest.mark.parametrize("case", sorted(_golden_cases()))
def test_generated_source_is_pinned(case):
    """Golden files pin the generated source (ADAPTCQ_UPDATE_GOLDEN=1 rewrites them after
    an intended change; review the diff)."""
    text = _render(_golden_cases()[case])
    path = GOLDEN / f"{case}.py.txt"
    if os.environ.get("ADAPTCQ_UPDATE_GOLDEN"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert text == path.read_text()


def test_generated_source_is_deterministic():
    """Names never come from id(): two executors of one plan give the same source."""
    a, b = _golden_cases()["chain_cache"], _golden_cases()["chain_cache"]
    assert a.pipeline_sources() == b.pipeline_sources()
    assert all(name.startswith("<pipeline Δ") for name in a.pipeline_sources())


def test_traceback_shows_the_generated_line():
    ex = MJoin(chain())
    q = ex.query

    def boom(row):
        raise RuntimeError("sink failed")
    ex.set_emit(boom)
    ex.insert(1, 1, tuple(1 if c in "ab" else 5 for c in q.columns["S"]), 0)
    ex.insert(2, 2, tuple(1 if c in "ab" else 6 for c in q.columns["T"]), 0)
    with pytest.raises(RuntimeError) as err:
        ex.insert(0, 3, tuple(1 if c in "ab" else 7 for c in q.columns["R"]), 0)
    text = "".join(traceback.format_exception(err.value))
    assert 'File "<pipeline ΔR: S⋈T' in text
    assert "emit((" in text  # the generated line itself, from linecache


def test_mjoin_worked_example_holds():
    """The worked update in MJoin's docstring is a doctest: state, plan, code, output."""
    import doctest

    from adaptcq.engine import mjoin
    result = doctest.testmod(mjoin, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 10 and result.failed == 0


def test_a_reordering_without_caches_replans_only_its_stream(monkeypatch):
    """Without caches no other pipeline depends on a stream's order: a re-ordering builds
    only that stream's two plans and keeps every other pipeline's plan and compiled
    function (A-Greedy may flip two orders of equal cost hundreds of times); results under
    re-orderings are checked against the oracle by
    test_engine_oracle.test_mjoin_equals_oracle_with_reorderings."""
    ex = MJoin(chain())
    plans_before, compiled_before = dict(ex.plans), dict(ex.compiled)
    built = []
    real = plans.build
    monkeypatch.setattr(plans, "build", lambda q, stream, *a, **k: (
        built.append(stream), real(q, stream, *a, **k))[1])
    ex.set_order("R", ["T", "S"])
    assert built == ["R", "R"]  # its insertion and its deletion (or maintenance) pipeline
    assert ex.plans[("R", "insert")] is not plans_before[("R", "insert")]
    others = [k for k in plans_before if k[0] != "R"]
    assert others and all(ex.plans[k] is plans_before[k] for k in others)
    assert all(ex.compiled.get(k) is compiled_before.get(k) for k in others)


def test_linecache_holds_only_the_sources_in_use():
    """Re-planning for days must not grow linecache: a source leaves it with the last
    function compiled from it."""
    import gc
    import linecache

    ex = MJoin(chain())
    names = {c.filename for c in ex.compiled.values()}
    assert names and all(n in linecache.cache for n in names)
    for _ in range(3):  # re-plans: new orders, then back
        ex.set_order("R", ["T", "S"])
        ex.set_order("R", ["S", "T"])
    del ex
    gc.collect()
    assert not any(n in linecache.cache for n in names)


def test_generated_code_is_compiled_once_per_source_and_the_cache_is_bounded(monkeypatch):
    """``codegen._code``: a source seen before reuses its code object (new functions in a
    new namespace each time, tracebacks still named after it); the cache keeps the
    ``CODE_CACHE`` most recently used."""
    import builtins

    from adaptcq.engine import codegen
    codegen._code.cache_clear()
    compiles = []
    real = builtins.compile
    monkeypatch.setattr(builtins, "compile", lambda *a, **k: compiles.append(a[1]) or real(*a, **k))
    src = "def f():\n    return k\n"
    a, fa = codegen.exec_source("<gen a>", src, {"k": 1})
    b, fb = codegen.exec_source("<gen a>", src, {"k": 2})
    assert fa == fb and len(compiles) == 1
    assert a["f"] is not b["f"] and (a["f"](), b["f"]()) == (1, 2)
    assert a["f"].__code__ is b["f"].__code__ and a["f"].__code__.co_filename == fa
    n = codegen.CODE_CACHE
    for j in range(n):  # as many other sources push the first one out
        codegen.exec_source("<gen b>", f"def f():\n    return {j}\n", {})
    assert codegen._code.cache_info().currsize == n and len(compiles) == n + 1
    c, _ = codegen.exec_source("<gen a>", src, {"k": 3})
    assert len(compiles) == n + 2 and c["f"]() == 3
