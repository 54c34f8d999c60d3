"""The interpreted back end of a pipeline plan (engine.plan): the plan run breadth-first,
counting per operator the tuples it processed and the work it did."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from time import perf_counter
from typing import Protocol

from adaptcq.engine.plan import CacheLookup, CacheUpdate, Observe, PipelinePlan, Probe
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
    delta: Sequence[int]
    tau: Sequence[float]      # the interpreter's; empty from the compiled profiled pipeline
    fanout: list[dict[str, int]]
    results: int
    work: Sequence[int] = field(default_factory=list)


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


def prepare(plan: PipelinePlan, env: Bindings) -> tuple:
    """The plan with every name resolved against ``env`` (indexes, caches, watchers, key
    functions, the projection): valid until the executor's plan changes, so an executor
    prepares a plan once and interprets it many times."""
    def one(op):
        if isinstance(op, Probe):
            return ("P", op, env.index(op), composite_key(op.key))
        if isinstance(op, CacheLookup):
            slots = [p.slot for p in op.segment if isinstance(p, Probe)]
            return ("L", op, env.cache(op.cache), composite_key(op.key),
                    tuple(one(x) for x in op.segment),
                    tuple(op.members.index(s) for s in slots), slots[0] - 1, slots[-1])
        if isinstance(op, CacheUpdate):
            return ("U", op, env.cache(op.cache), composite_key(op.key))
        if isinstance(op, Observe):
            return ("O", op, env.watcher(plan.stream, op.name), composite_key(op.key))
        return ("E", op, env.projection(plan))
    return (plan, tuple(one(op) for op in plan.ops))


class _Run:
    """One interpreted update: its counts and where work after a probe is charged."""

    __slots__ = ("counts", "emit", "fanouts", "last", "n", "sign", "ts", "use_caches")

    def __init__(self, n, sign, ts, emit, use_caches, fanouts):
        self.counts = Counts([0] * n, [0] * n, [0.0] * n, [])
        self.n, self.sign, self.ts, self.emit = n, sign, ts, emit
        self.use_caches, self.fanouts = use_caches, fanouts
        self.last = 0

    def run(self, steps, level: list[tuple]) -> list[tuple]:
        for step in steps:
            code = step[0]
            if code == "P":
                level = self.probe(step, level)
            elif code == "L":
                level = self.lookup(step, level)
            elif code == "U":
                _, op, cache, keyfn = step
                for comp in level:
                    part = tuple(comp[m] for m in op.members)
                    if op.delete:
                        cache.remove(keyfn(comp), tuple(map(id, part)))
                    else:
                        cache.add(keyfn(comp), tuple(map(id, part)), part)
                self.charge(len(level))
            elif code == "O":
                _, _, fn, keyfn = step
                for comp in level:
                    fn(keyfn(comp))
            else:  # Emit
                project, sign, ts, emit = step[2], self.sign, self.ts, self.emit
                for comp in level:
                    project(comp, sign, ts, emit)
                self.counts.results += len(level)
                self.charge(len(level))
        return level

    def charge(self, work: int) -> None:
        if self.n:
            self.counts.work[max(self.last, 1) - 1] += work

    def probe(self, step, level: list[tuple]) -> list[tuple]:
        _, op, index, keyfn = step
        counts, k = self.counts, op.slot - 1
        self.last = op.slot
        if self.fanouts is not None:
            counts.fanout.append(self.fanouts(level, k))
        t0 = perf_counter()
        nxt: list[tuple] = []
        if not op.positions:  # cartesian step: every row of the window
            rows = list(index.values())
            for comp in level:
                nxt.extend([comp + (v,) for v in rows])
            work = len(level) * len(rows)
        else:
            for comp in level:
                b = index.get(keyfn(comp))
                if b:
                    nxt.extend([comp + (v,) for v in b.values()])
            work = len(level) * len(index.stem) if op.scan else len(level) + len(nxt)
        counts.tau[k] += perf_counter() - t0
        counts.delta[k] += len(level)
        counts.work[k] += work
        return nxt

    def lookup(self, step, level: list[tuple]) -> list[tuple]:
        _, op, cache, keyfn, segment, where, first, last = step
        if not self.use_caches:
            return self.run(segment, level)
        counts = self.counts
        nxt: list[tuple] = []
        for comp in level:
            counts.work[first] += 1
            u = keyfn(comp)
            seg = cache.lookup(u)
            if seg is None:  # the segment's first probe counts this tuple in delta
                seg = {}
                for full in self.run(segment, [comp]):
                    part = tuple(full[m] for m in op.members)
                    seg[tuple(map(id, part))] = part
                cache.create(u, seg)
                counts.work[first] += 1
            else:
                counts.delta[first] += 1
                counts.work[first] += len(seg)
            # Segment tuples are in the cache's canonical order; slots follow the order.
            nxt.extend([comp + tuple(part[w] for w in where) for part in seg.values()])
        self.last = last
        return nxt


def interpret(program: tuple, row: tuple, sign: int, ts, emit, *, use_caches: bool = True,
              fanouts: Callable[[list, int], dict[str, int]] | None = None,
              ) -> tuple[tuple, Counts]:
    """Run a prepared plan (:func:`prepare`) on one update breadth-first: the same output,
    in the same order, and the same cache state as the compiled pipeline
    (engine.codegen), with the work of every operator counted. ``use_caches=False`` runs
    cached segments through their probes instead (profiling, a-caching.txt App. A: "no
    caches used"; CacheUpdates still run, so the caches stay consistent).
    ``fanouts(level, k)``: called before operator k with the composites reaching it
    (A-Greedy's conditional fan-outs). Returns the row to store and the counts."""
    plan, steps = program
    if plan.copy:
        row = (*row,)
    run = _Run(len(plan.order), sign, ts, emit, use_caches, fanouts)
    run.run(steps, [(row,)])
    return row, run.counts
