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


def _burn(seconds: float) -> None:
    import time
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_the_query_clock_counts_its_own_work_only():
    """``cq.cpu()``, the clock the policies measure intervals on, runs inside ``process``
    and ``advance_to`` (a tick sees it running) and stands still between them, however much
    CPU the driver spends there (other plans side by side, input, output)."""
    seen = []

    class Clocked(Counting):
        def on_interval(self, cq, ts):
            seen.append(cq.cpu())
            _burn(0.002)  # a policy's own work is the query's
            seen.append(cq.cpu())

    q = parse_query("SELECT R.id AS r, S.id AS s FROM R [RANGE 1 SECONDS], S [RANGE 1 "
                    "SECONDS] WHERE R.a = S.a", {"R": SCHEMA, "S": SCHEMA})
    cq = ContinuousQuery(q, "mjoin", "append")
    cq.attach(Clocked(0.0, 500))
    assert cq.cpu() == 0.0
    n = 2000
    cq.process([k % 2 for k in range(n)], None, [k / 100 for k in range(n)],
               [(k % 7, k) for k in range(n)])
    after = cq.cpu()
    assert len(seen) == 8 and all(b - a >= 0.002 for a, b in zip(seen[::2], seen[1::2]))
    assert after >= seen[-1]
    _burn(0.05)  # the driver's work between batches
    assert cq.cpu() == after
    cq.advance_to(1e9)  # every window deletion, on the query's clock too
    assert cq.cpu() > after and cq.stats.deletions == n


def test_xjoin_refuses_policies():
    q = parse_query("SELECT R.id FROM R, S WHERE R.a = S.a", {"R": SCHEMA, "S": SCHEMA})
    with pytest.raises(ValueError, match="need --executor mjoin"):
        ContinuousQuery(q, "xjoin").attach(Counting(0.1, None))
