"""The engine's protocols (engine/protocols.py): executors and policies, the one Profiler a
query shares among its policies, policies composed as a list (``adapt.make_policies``),
and A-Caching's decisions on the work clock (deterministic without the measured checks)."""

from __future__ import annotations

import ast
import itertools
import json
import os
import pickle
import random
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import adaptcq.runtime.local
from adaptcq.adapt import make_policies
from adaptcq.adapt.acaching import ACaching
from adaptcq.adapt.reorder import AGreedy, InitialPlan
from adaptcq.engine.continuous import ContinuousQuery
from adaptcq.engine.protocols import (
    AdaptiveExecutor,
    CachingExecutor,
    Executor,
    Policy,
    members,
    missing,
)
from adaptcq.errors import AdaptcqError, OptionError
from adaptcq.query.cql import parse_query
from adaptcq.stats.profiler import Profiler
from adaptcq.stream.workloads import three_way
from conftest import examples
from oracle import Oracle, engine_outputs
from test_acaching import chaotic
from test_engine_oracle import arrivals, as_tuples, queries
from test_policy_hooks import Counting

SCHEMA = {"a": "number", "id": "number"}
TWO = "SELECT R.id AS r, S.id AS s FROM R [ROWS 50], S [ROWS 50] WHERE R.a = S.a"


def two_way() -> ContinuousQuery:
    return ContinuousQuery(parse_query(TWO, {"R": SCHEMA, "S": SCHEMA}), "mjoin", "append")


def feed(cq, n=4000):
    return cq.process([k % 2 for k in range(n)], None, [k / 10 for k in range(n)],
                      [(k % 7, k) for k in range(n)])


# ----- the protocols -----------------------------------------------------------------------
def test_executors_conform():
    q = parse_query(TWO, {"R": SCHEMA, "S": SCHEMA})
    mjoin, xjoin = ContinuousQuery(q, "mjoin").executor, ContinuousQuery(q, "xjoin").executor
    assert isinstance(mjoin, CachingExecutor) and missing(mjoin, CachingExecutor) == []
    assert isinstance(xjoin, Executor) and not isinstance(xjoin, AdaptiveExecutor)
    assert {"profile_insert", "set_order"} <= set(missing(xjoin, AdaptiveExecutor))
    # isinstance and missing() read the same members
    assert set(members(Executor)) < set(members(AdaptiveExecutor)) < set(members(
        CachingExecutor))


def test_policies_conform_and_report_json():
    cq = two_way()
    pols = make_policies(optimizer="fgreedy", reorder="agreedy", caching={}, p=0.5,
                         interval=100)
    assert [type(p) for p in pols] == [InitialPlan, AGreedy, ACaching]
    for pol in pols:
        assert isinstance(pol, Policy) and missing(pol, Policy) == []
        cq.attach(pol)
    feed(cq)
    assert isinstance(Profiler(), Policy)
    for pol in [*pols, cq.profiler]:
        json.dumps(pol.report())  # JSON-serialisable, as the Spark runtime ships it


def test_attach_names_the_missing_hooks():
    class Old:  # the duck-typed policy of before: no stream_probability, bind, W, report
        sample_probability, interval, seed = 0.1, 100, 0

        def on_profile(self, cq, obs, ts): ...

        def on_interval(self, cq, ts): ...

    cq = two_way()
    with pytest.raises(OptionError, match=r"Old is not an adaptive policy: it lacks "
                                          r"needs_fanouts, W, stream_probability, bind, "
                                          r"report \(see adaptcq.engine.protocols.Policy\)"):
        cq.attach(Old())
    assert cq.policies == [] and cq.profiler is None
    with pytest.raises(OptionError, match="lacks sample_probability"):
        cq.attach(object())


def test_attach_refuses_xjoin_disagreeing_W_and_a_second_profiler():
    q = parse_query(TWO, {"R": SCHEMA, "S": SCHEMA})
    with pytest.raises(ValueError, match="xjoin executor cannot be profiled; adaptive "
                                         "policies need --executor mjoin"):
        ContinuousQuery(q, "xjoin").attach(AGreedy())
    cq = two_way()
    cq.attach(AGreedy(W=5))
    with pytest.raises(OptionError, match=r"ACaching averages W = 10 observations, but this "
                                          r"query's profiler keeps W = 5"):
        cq.attach(ACaching())
    with pytest.raises(OptionError, match="already has a profiler"):
        cq.attach(Profiler(W=5))
    cq.attach(Counting(0.1, None))  # W None: takes the profiler's
    assert len(cq.policies) == 2
    # A Profiler attached first is the query's profiler; policies then share it.
    cq = two_way()
    prof = Profiler(W=3, p=0.0, interval=50)
    cq.attach(prof)
    pol = AGreedy(W=3)
    cq.attach(pol)
    assert cq.profiler is prof and pol.profiler is prof


def test_dmjoin_refused_when_attached():
    from adaptcq.optimizer import DMJOIN_MAX_STREAMS

    names = [f"X{k}" for k in range(DMJOIN_MAX_STREAMS + 1)]
    q = parse_query(f"SELECT X0.a FROM {', '.join(names)} WHERE "
                    + " AND ".join(f"{x}.a = {y}.a" for x, y in itertools.pairwise(names)))
    cq = ContinuousQuery(q, "mjoin")
    with pytest.raises(AdaptcqError, match="dmjoin is exponential"):
        cq.attach(InitialPlan("dmjoin"))
    assert cq.policies == [] and cq.profiler is None


# ----- one profiler per query --------------------------------------------------------------
def test_one_profiler_sees_each_observation_once_and_is_shared():
    cq = two_way()
    a, b = Counting(0.2, 700, seed=3), Counting(0.05, 300)
    greedy = AGreedy(p=0.1, interval=1000)
    for pol in (a, b, greedy):
        cq.attach(pol)
    feed(cq, 10_000)
    assert a.profiler is b.profiler is greedy.profiler is cq.profiler
    # every policy saw every observation, once; the profiler was fed each once
    assert a.profiled == b.profiled and len({id(o) for o in a.profiled}) == len(a.profiled)
    profiled = sum(s.observations for s in cq.profiler.pipelines.values())
    assert profiled == len(a.profiled) > 0
    assert greedy.report()["agreedy_profiled"] == profiled
    # p = the maximum (0.2), ticks at the smallest interval (300), one profiler tick each
    assert len(a.profiled) / cq.stats.insertions == pytest.approx(0.2, abs=0.03)
    assert a.ticks == b.ticks == list(range(300, 10_001, 300))
    assert cq.profiler.ticks == len(a.ticks) and cq.profiler.interval == 300


def test_per_pipeline_probability_is_the_maximum_over_policies():
    class OnlyR(Counting):
        def stream_probability(self, i):
            return self.sample_probability if i == 0 else 0.0

    cq = two_way()
    r_only, low = OnlyR(1.0, None), Counting(0.1, None)
    cq.attach(r_only)
    cq.attach(low)
    feed(cq, 8000)
    by = {s: sum(1 for o in low.profiled if o.stream == s) for s in "RS"}
    assert by["R"] == cq.per_stream[0]                     # p_R = max(1.0, 0.1)
    assert by["S"] / cq.per_stream[1] == pytest.approx(0.1, abs=0.03)  # p_S = max(0, 0.1)


def test_a_restored_profiler_keeps_its_statistics():
    """A checkpointed query's profiler and policies, pickled and attached to the restored
    query: the same profiler, statistics and all, shared again."""
    cq = two_way()
    pol = AGreedy(p=0.5, interval=100)
    cq.attach(pol)
    feed(cq)
    saved, snap = pickle.dumps((cq.profiler, pol)), cq.snapshot()
    seen = sum(s.observations for s in cq.profiler.pipelines.values())
    restored = ContinuousQuery.restore(parse_query(TWO, {"R": SCHEMA, "S": SCHEMA}), snap)
    profiler, pol = pickle.loads(saved)
    restored.attach(profiler)
    restored.attach(pol)
    assert restored.profiler is profiler and pol.profiler is profiler
    assert sum(s.observations for s in profiler.pipelines.values()) == seen > 0
    feed(restored)
    assert sum(s.observations for s in profiler.pipelines.values()) > seen


# ----- make_policies ------------------------------------------------------------------------
def test_make_policies_refuses_unknown_parameters():
    assert make_policies() == []
    with pytest.raises(AdaptcqError, match=r"unknown policy parameter\(s\) beta, gamma"):
        make_policies(reorder="agreedy", beta=1, gamma=2)
    with pytest.raises(AdaptcqError, match=r"unknown A-Caching option\(s\) size"):
        make_policies(caching={"caches": "global", "size": 3})
    with pytest.raises(AdaptcqError, match="caching must be None or a dict"):
        make_policies(caching="global")
    with pytest.raises(AdaptcqError, match="unknown --reorder 'eddy'"):
        make_policies(reorder="eddy")
    with pytest.raises(AdaptcqError, match="share one profiler, so one W; got W = 3, 10"):
        make_policies(reorder="agreedy", caching={"W": 3})
    with pytest.raises(ValueError, match="--reopt-interval must be a positive number"):
        make_policies(caching={"reopt_interval": 0})
    pols = make_policies(optimizer="fab", reorder="agreedy", W=4, seed=9,
                         caching={"caches": "global", "memory": 10_000})
    greedy, caching = pols[1], pols[2]
    assert greedy.wait_for is pols[0]
    assert {p.W for p in pols} == {4} and {p.seed for p in pols} == {9}
    assert (caching.caches, caching.memory) == ("global", 10_000)


@settings(max_examples=examples(60), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data(), mode=st.sampled_from(["append", "retract"]), seed=st.integers(0, 1000))
def test_initial_plan_agreedy_and_acaching_together_never_change_results(data, mode, seed):
    """The three policies composed by make_policies in one query, eager (W = 2, every
    insertion profiled, a tick every 2 arrivals): the initial plan sets the orders,
    A-Greedy re-orders, A-Caching places and drops caches (on random estimates for odd
    seeds, so that it does often); the output equals the oracle's, update by update."""
    from adaptcq.optimizer import ALGORITHMS

    q = data.draw(queries(max_streams=4))
    streams, ts, rows = data.draw(arrivals(len(q.aliases), max_rows=40))
    rows = as_tuples(q, streams, rows)
    rnd = random.Random(seed)
    pols = make_policies(
        optimizer=rnd.choice([None, None, *ALGORITHMS]), reorder="agreedy", W=2, interval=2, seed=seed,
        p=1.0, alpha=1.0, caching={"caches": rnd.choice(["prefix", "global"]), "p": 1.0,
                                   "reopt_interval": 16, "W_d": 2, "alpha": 2})
    if seed % 2:  # random estimates: caches come and go at many more points
        chaotic(pols[-1], seed)
    cq = ContinuousQuery(q, "mjoin", mode, trace=True)
    for pol in pols:
        cq.attach(pol)
    out = []
    for k in range(0, len(rows), 5):
        out += cq.process(streams[k:k + 5], None, ts[k:k + 5], rows[k:k + 5])
    assert engine_outputs(cq.trace, out) == Oracle(q, mode).run(streams, None, ts, rows)


def test_composed_policies_all_act_and_keep_the_output():
    """On §7.2's 3-way join with an expensive join into S (Figure 10): the initial plan is
    set, A-Greedy runs after it, A-Caching selects caches, and the output is MJoin's."""
    wl = three_way(n_updates=8_000, r=5, window=0.5, seed=4)
    p = adaptcq.runtime.local.prepare(wl.sql, wl.tables, "ts")
    outs, pols = [], make_policies(optimizer="qaware", reorder="agreedy",
                                   caching={"reopt_interval": 4000})
    for policies in ([], pols):
        cq = ContinuousQuery(p.query, "mjoin", "retract", time_unit=p.time_unit,
                             nested_loop=["S.b"])
        for pol in policies:
            cq.attach(pol)
        outs.append(sorted(cq.process(p.streams.tolist(), None, p.timestamps.tolist(),
                                      p.rows)))
    assert outs[0] == outs[1] and outs[0]
    initial, greedy, caching = pols
    assert initial.done and caching.selections >= 1
    assert greedy.report()["agreedy_profiled"] > 0


# ----- A-Caching on the work clock: deterministic decisions --------------------------------
def _acaching_run() -> dict:
    wl = three_way(n_updates=12_000, r=5, window=0.5, seed=4)
    p = adaptcq.runtime.local.prepare(wl.sql, wl.tables, "ts")
    cq = ContinuousQuery(p.query, "mjoin", "retract", time_unit=p.time_unit,
                         nested_loop=["S.b"])
    # (verify=False and cheap=False: the cost model's decisions and a fixed p; measured
    # ones depend on the CPU)
    policies = make_policies(reorder="agreedy", seed=1, cheap=False,
                             caching={"caches": "global", "reopt_interval": 3000,
                                      "verify": False})
    for pol in policies:
        cq.attach(pol)
    for k in range(0, len(p.rows), 997):
        cq.process(p.streams[k:k + 997].tolist(), None, p.timestamps[k:k + 997].tolist(),
                   p.rows[k:k + 997])
    report = policies[-1].report()
    return {"history": report["cache_history"], "used": report["caches_used"],
            "agreedy": policies[0].history}


def test_acaching_decisions_are_deterministic():
    """No wall time in any decision: the same input gives the same cache events at the
    same arrivals (and the same A-Greedy re-orderings), run after run."""
    first, second = _acaching_run(), _acaching_run()
    assert any(h["event"] == "use" for h in first["history"])
    assert first == second


def test_acaching_decisions_do_not_depend_on_the_process():
    """The same in a fresh interpreter with another string-hash seed."""
    code = ("import json, sys; sys.path[:0] = [sys.argv[1]]; "
            "from test_protocols import _acaching_run; print(json.dumps(_acaching_run()))")
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    got = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent)], env=env,
                         check=True, capture_output=True, text=True).stdout
    assert json.loads(got) == json.loads(json.dumps(_acaching_run()))


# ----- layering -----------------------------------------------------------------------------
def test_engine_imports_no_policy_runtime_or_optimizer():
    engine = Path(adaptcq.runtime.local.__file__).parent.parent / "engine"
    for path in sorted(engine.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                assert not name.startswith(("adaptcq.adapt", "adaptcq.runtime",
                                            "adaptcq.optimizer")), (path.name, name)
