"""What every policy of ``adapt/`` shares: the attributes and hooks of the
``engine.protocols.Policy`` protocol, with defaults.

A policy reads its statistics from the query's one Profiler, handed to it by
``ContinuousQuery.attach`` through :meth:`PolicyBase.bind`; it never feeds the profiler
(the query does, once per observation and once per tick, before any policy hook runs).
"""

from __future__ import annotations

from adaptcq.stats.estimators import W_DEFAULT
from adaptcq.stats.profiler import INTERVAL_DEFAULT, P_DEFAULT, Profiler, check_schedule

HISTORY_MAX = 1_000
"""Entries a policy's history keeps, the latest: a query runs for days, and a policy may
decide hundreds of times per million arrivals (A-Greedy re-ordering a pipeline whose two
orders cost the same); its counters count every decision."""


def log_bounded(history: list, entry) -> None:
    """Append ``entry`` to a policy's ``history``, keeping the latest HISTORY_MAX."""
    history.append(entry)
    if len(history) > HISTORY_MAX:
        del history[:len(history) - HISTORY_MAX]


class PolicyBase:
    """Defaults for the ``Policy`` protocol: one profiling probability p for every
    pipeline, a tick interval, the statistics window W, and the shared profiler."""

    needs_fanouts = True

    def __init__(self, p: float = P_DEFAULT, W: int = W_DEFAULT,
                 interval: int | None = INTERVAL_DEFAULT, seed: int = 0):
        check_schedule(W, p, interval)
        self.sample_probability = p
        self.W = W
        self.interval = interval
        self.seed = seed
        self.profiler: Profiler | None = None

    def stream_probability(self, i: int) -> float:
        return self.sample_probability

    def bind(self, profiler: Profiler) -> None:
        """Read statistics from ``profiler`` (the query's; it keeps W observations)."""
        if profiler.W != self.W:
            raise ValueError(f"{type(self).__name__} keeps W = {self.W} observations per "
                             f"statistic, the query's profiler W = {profiler.W}")
        self.profiler = profiler

    def _profiled(self) -> int:
        """Profiled tuples the shared profiler has seen, over all pipelines (what cheap
        profiling's share measurements count, ``verify.share_ready``)."""
        return (sum(s.observations for s in self.profiler.pipelines.values())
                if self.profiler is not None else 0)

    def on_profile(self, cq, obs, ts) -> None:
        pass

    def on_interval(self, cq, ts) -> None:
        pass

    def report(self) -> dict:
        return {}
