"""The policy hooks of ContinuousQuery: sampled profiling with probability p, and ticks."""

from __future__ import annotations

import pytest

from adaptcq.engine.continuous import ContinuousQuery
from adaptcq.query.cql import parse_query

SCHEMA = {"a": "number", "id": "number"}


class Counting:
    """A minimal policy (engine.protocols.Policy): records what it is shown."""

    needs_fanouts = False

    def __init__(self, p, interval, seed=0, W=None):
        self.sample_probability, self.interval, self.seed, self.W = p, interval, seed, W
        self.profiled, self.ticks = [], []
        self.profiler = None

    def stream_probability(self, i):
        return self.sample_probability

    def bind(self, profiler):
        self.profiler = profiler

    def on_profile(self, cq, obs, ts):
        self.profiled.append(obs)

    def on_interval(self, cq, ts):
        self.ticks.append(cq.next_rid)

    def report(self):
        return {"profiled": len(self.profiled)}


def run(policy, n=20_000):
    q = parse_query("SELECT R.id AS r, S.id AS s FROM R [ROWS 50], S [ROWS 50] "
                    "WHERE R.a = S.a", {"R": SCHEMA, "S": SCHEMA})
    cq = ContinuousQuery(q, "mjoin", "append")
    cq.attach(policy)
    out = cq.process([k % 2 for k in range(n)], None, [k / 10 for k in range(n)],
                     [(k % 7, k) for k in range(n)])
    return cq, out


@pytest.mark.parametrize("p", [1.0, 0.25, 0.01])
def test_each_insertion_is_profiled_with_probability_p(p):
    pol = Counting(p, None)
    cq, _ = run(pol)
    share = len(pol.profiled) / cq.stats.insertions
    assert share == pytest.approx(p, abs=4 * (p * (1 - p) / cq.stats.insertions) ** 0.5 + 1e-9)
    plain, _ = run(Counting(0.0, None))
    assert cq.stats.results == plain.stats.results  # profiled tuples give the same output
    assert sum(o.results for o in pol.profiled) > 0
    # The query's profiler saw each of them once.
    assert sum(s.observations for s in cq.profiler.pipelines.values()) == len(pol.profiled)
    assert pol.profiler is cq.profiler


def test_ticks_every_interval_and_no_profiling_at_p_zero():
    pol = Counting(0.0, 1000)
    cq, _ = run(pol, n=10_500)
    assert pol.profiled == []
    assert pol.ticks == list(range(1000, 10_001, 1000))
    assert cq.profiler.ticks == len(pol.ticks)


def test_xjoin_refuses_policies():
    q = parse_query("SELECT R.id FROM R, S WHERE R.a = S.a", {"R": SCHEMA, "S": SCHEMA})
    with pytest.raises(ValueError, match="need --executor mjoin"):
        ContinuousQuery(q, "xjoin").attach(Counting(0.1, None))
