"""The interpreted back end of a pipeline plan (engine.plan): the plan run breadth-first,
counting per operator the tuples it processed and the work it did."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Observation:
    """One profiled tuple's trip through its pipeline (a-caching.txt Appendix A).

    ``delta[j]`` is the number of tuples operator j (0-based) processed for it, ``tau[j]``
    the seconds spent there, ``work[j]`` the work units it did there (the virtual work
    clock: one per probe and one per bucket entry scanned), and ``fanout[j]`` maps every
    stream not yet joined before operator j (the one joined there included) to the number
    of its tuples that match the ``delta[j]`` tuples reaching operator j: the conditional
    selectivities that A-Greedy's greedy invariant is checked against ([5];
    join-ordering.txt §3.2).
    """

    stream: str
    order: tuple[str, ...]
    delta: list[int]
    tau: list[float]
    fanout: list[dict[str, int]]
    results: int
    work: list[int] = field(default_factory=list)
