"""The interpreted back end of a pipeline plan (engine.plan): the plan run breadth-first,
counting per operator the tuples it processed and the work it did."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from time import perf_counter
from typing import Protocol

from adaptcq.engine.plan import CacheLookup, CacheUpdate, Emit, Observe, PipelinePlan, Probe
from adaptcq.engine.rules import composite_key


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


# ----- the interpreter -------------------------------------------------------------------
@dataclass
class Counts:
    """Per join operator (slot k at index k - 1): tuples processed, work units, seconds.

    Work units (the virtual work clock, deterministic): a hash probe 1, each bucket entry
    it yields 1; a window scan or cartesian step 1 per row examined; a cache probe 1, each
    cached tuple it yields 1 (counted at the segment's first operator), and on a miss the
    segment's own work; a CacheUpdate 1 per tuple passing (counted at the operator before
    it); an emitted result 1 (counted at the last operator)."""

    delta: list[int]
    work: list[int]
    tau: list[float]
    fanout: list[dict[str, int]]
    results: int = 0


class Bindings(Protocol):
    """What the interpreter asks the executor for (names as the plan uses them)."""

    def index(self, op: Probe): ...          # an index (``get(key)``), or rows for a scan
    def cache(self, name: str): ...          # a JoinCache
    def watcher(self, stream: str, name: str): ...  # fn(key)
    def projection(self, plan: PipelinePlan): ...  # fn(comp, sign, ts, emit)


def interpret(plan: PipelinePlan, env: Bindings, row: tuple, sign: int, ts, emit, *,
              use_caches: bool = True,
              fanouts: Callable[[list, int], dict[str, int]] | None = None,
              ) -> tuple[tuple, Counts]:
    """Run ``plan`` on one update breadth-first: the same output, in the same order, and the
    same cache state as the compiled pipeline (engine.codegen), with the work of every
    operator counted. ``use_caches=False`` runs cached segments through their probes
    instead (profiling, a-caching.txt App. A: "no caches used"; CacheUpdates still run, so
    the caches stay consistent). ``fanouts(level, k)``: called before operator k with the
    composites reaching it (A-Greedy's conditional fan-outs). Returns the row to store and
    the counts."""
    n = len(plan.order)
    counts = Counts([0] * n, [0] * n, [0.0] * n, [])
    if plan.copy:
        row = (*row,)
    level: list[tuple] = [(row,)]
    last = [0]  # the operator that work after a probe is charged to

    def step(op, level: list[tuple]) -> list[tuple]:
        if isinstance(op, Probe):
            return probe(op, level)
        if isinstance(op, CacheLookup):
            return lookup(op, level)
        k = max(last[0], 1) - 1
        if isinstance(op, CacheUpdate):
            cache = env.cache(op.cache)
            keyfn = composite_key(op.key)
            for comp in level:
                part = tuple(comp[m] for m in op.members)
                ids = tuple(map(id, part))
                if op.delete:
                    cache.remove(keyfn(comp), ids)
                else:
                    cache.add(keyfn(comp), ids, part)
            if n:
                counts.work[k] += len(level)
        elif isinstance(op, Observe):
            fn, keyfn = env.watcher(plan.stream, op.name), composite_key(op.key)
            for comp in level:
                fn(keyfn(comp))
        elif isinstance(op, Emit):
            project = env.projection(plan)
            for comp in level:
                project(comp, sign, ts, emit)
            counts.results += len(level)
            if n:
                counts.work[k] += len(level)
        return level

    def probe(op: Probe, level: list[tuple]) -> list[tuple]:
        k = op.slot - 1
        last[0] = op.slot
        if fanouts is not None:
            counts.fanout.append(fanouts(level, k))
        t0 = perf_counter()
        nxt: list[tuple] = []
        index = env.index(op)
        work = 0
        if not op.positions:  # cartesian step: every row of the window
            rows = list(index.values())
            for comp in level:
                nxt.extend([comp + (v,) for v in rows])
            work = len(level) * len(rows)
        else:
            keyfn = composite_key(op.key)
            for comp in level:
                b = index.get(keyfn(comp))
                if b:
                    nxt.extend([comp + (v,) for v in b.values()])
            work = len(level) * (len(index.stem) if op.scan else 1) + \
                (0 if op.scan else len(nxt))
        counts.tau[k] += perf_counter() - t0
        counts.delta[k] += len(level)
        counts.work[k] += work
        return nxt

    def lookup(op: CacheLookup, level: list[tuple]) -> list[tuple]:
        first = next(p.slot for p in op.segment if isinstance(p, Probe)) - 1
        if not use_caches:
            for sub in op.segment:
                level = step(sub, level)
            return level
        cache, keyfn = env.cache(op.cache), composite_key(op.key)
        # Segment tuples are stored in the cache's canonical order; slots follow the order.
        slots = [p.slot for p in op.segment if isinstance(p, Probe)]
        where = [op.members.index(s) for s in slots]
        nxt: list[tuple] = []
        for comp in level:
            counts.delta[first] += 1
            counts.work[first] += 1
            u = keyfn(comp)
            seg = cache.lookup(u)
            if seg is None:
                sub = [comp]
                for inner in op.segment:
                    sub = step(inner, sub)
                seg = {}
                for full in sub:
                    part = tuple(full[m] for m in op.members)
                    seg[tuple(map(id, part))] = part
                cache.create(u, seg)
                counts.work[first] += 1
            else:
                counts.work[first] += len(seg)
            nxt.extend([comp + tuple(part[w] for w in where) for part in seg.values()])
        last[0] = slots[-1]
        return nxt

    for op in plan.ops:
        level = step(op, level)
    return row, counts
