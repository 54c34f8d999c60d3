"""The pipeline plan: one MJoin pipeline as a small intermediate representation
(ARCHITECTURE.md "The engine core"; a-caching.txt §3.1–§3.2, §6).

A pipeline ΔR_i ⋈ R_i1 ⋈ … ⋈ R_i(n-1) is a sequence of operators over *slots*: slot 0 holds
the arriving (or deleted) row of R_i, slot k the row of the k-th stream joined. A key is a
tuple of (slot, column position) pairs. The operators:

* :class:`Probe` — join with the SteM of the next stream: a hash probe on its index, a scan
  of its window (a nested-loop join, a-caching.txt §7.2), or a cartesian step;
* :class:`CacheLookup` — probe a join-subresult cache (§3.2) for the segment of probes it
  holds; on a miss, run the segment and create the entry;
* :class:`CacheUpdate` — maintain a cache with the tuples passing (§3.2; §6 for X ⋈ Y);
* :class:`Observe` — hand a candidate cache's probe key to a watcher (App. A);
* :class:`Emit` — project the composite onto the SELECT list and emit it.

Later issues add a basic-window probe (load shedding) and a routing point (eddies).

A plan is built from the executor's state by small pure passes, in this order (each one
function, sqlglot-style): :func:`probes` (order → probes), :func:`lookups` (cached segments),
:func:`updates` (CacheUpdates), :func:`observers`, :func:`emit` (projection, or truncation
of an append-mode deletion pipeline). The rules they apply are defined once, in
``engine.rules``. Two back ends run a plan: ``engine.codegen`` compiles it to Python source
and ``engine.interp`` interprets it breadth-first, counting work; they give identical output
and state (a property test).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from adaptcq.engine.rules import probe_plan, probe_ref
from adaptcq.query.logical import ColumnRef, LogicalQuery

Key = tuple[tuple[int, int], ...]  # (slot, column position) pairs; () for no key

KINDS = ("insert", "delete", "maintain")


@dataclass(frozen=True)
class Probe:
    """Join ``stream`` into slot ``slot``: its rows whose ``positions`` equal the
    composite's ``key`` (a hash index), all rows with ``scan`` tested against the key (a
    nested-loop join), or every row when there are no positions (a cartesian step)."""

    stream: str
    slot: int
    positions: tuple[int, ...]
    key: Key
    scan: bool = False


@dataclass(frozen=True)
class CacheLookup:
    """probe(u) of cache ``cache`` with u read at ``key`` from the prefix; the entry's
    segment tuples fill ``members`` (slots, in the cache's canonical stream order). On a
    miss the ``segment`` probes run and create(u, v) stores their tuples (§3.2).
    ``tracked``: the cache keeps a reverse map from rows to keys (a §6 cache some of whose
    rows do not determine their key), so create goes through the cache's method."""

    cache: str
    key: Key
    members: tuple[int, ...]
    segment: tuple[Probe, ...]
    tracked: bool = False


@dataclass(frozen=True)
class CacheUpdate:
    """insert(u, r) (or delete, for ``delete``) of the segment tuple in ``members`` into
    cache ``cache`` when it holds key u, read at ``key`` (§3.2)."""

    cache: str
    key: Key
    members: tuple[int, ...]
    delete: bool = False
    tracked: bool = False


@dataclass(frozen=True)
class Observe:
    """Call watcher ``name`` with the probe key read at ``key`` (a candidate cache's probe
    stream, for its Bloom-filter miss estimate: a-caching.txt App. A)."""

    name: str
    key: Key


@dataclass(frozen=True)
class Emit:
    """Emit the composite's SELECT values, then ``sign`` and ``ts``."""


Op = Probe | CacheLookup | CacheUpdate | Observe | Emit


@dataclass(frozen=True)
class CacheSpec:
    """What a plan needs to know of one cache: its name in the executor, its segment
    (``members``, canonical order), its Y (``extra``), key columns, and whether it keeps a
    reverse map."""

    name: str
    members: tuple[str, ...]
    extra: frozenset[str]
    key: tuple[ColumnRef, ...]
    tracked: bool = False

    @property
    def z(self) -> frozenset[str]:
        """X ∪ Y: the relations whose pipelines carry this cache's CacheUpdates."""
        return frozenset(self.members) | self.extra


@dataclass(frozen=True)
class PipelinePlan:
    """One pipeline of one kind: "insert", "delete" (retract mode: deletions run the joins
    and emit result deletions) or "maintain" (append mode: a deletion emits nothing, so
    only the joins up to the last CacheUpdate run). ``slots`` maps each stream to its slot
    (the ΔR stream is 0). ``copy``: an insertion copies its row first (caches identify
    rows by object identity, engine.cache)."""

    stream: str
    kind: str
    order: tuple[str, ...]
    ops: tuple[Op, ...]
    slots: tuple[tuple[str, int], ...]
    copy: bool = False

    @property
    def name(self) -> str:
        """``<pipeline ΔR: S⋈T>`` (with the kind unless it is an insertion pipeline)."""
        kind = "" if self.kind == "insert" else f" {self.kind}"
        return f"<pipeline Δ{self.stream}{kind}: {'⋈'.join(self.order) or '∅'}>"

    @property
    def empty(self) -> bool:
        """Nothing to run (an append-mode deletion pipeline without CacheUpdates)."""
        return not self.ops


# ----- passes ----------------------------------------------------------------------------
def probes(query: LogicalQuery, stream: str, order: Sequence[str],
           scans=lambda stream, positions: False) -> PipelinePlan:
    """Pass 1, order → probes: one Probe per stream of ``order``, keyed on every predicate
    between it and the prefix (``rules.probe_plan``). ``scans(stream, positions)`` says
    which joins scan the window instead of probing a hash index."""
    prefix, ops = [stream], []
    for k, s in enumerate(order, 1):
        positions, refs = probe_plan(query, s, prefix)
        ops.append(Probe(s, k, positions, _key(query, refs, prefix),
                         bool(positions) and scans(s, positions)))
        prefix.append(s)
    return PipelinePlan(stream, "insert", tuple(order), tuple(ops),
                        tuple((s, k) for k, s in enumerate(prefix)))


def lookups(query: LogicalQuery, plan: PipelinePlan,
            placements: Sequence[tuple[int, int, CacheSpec]]) -> PipelinePlan:
    """Pass 2: each cached segment start..end (1-based positions of the order) becomes one
    CacheLookup holding the segment's probes, probed with the cache key K_ijk read from the
    prefix (``rules.probe_ref``)."""
    if not placements:
        return plan
    slots = dict(plan.slots)
    by_start = {j: (k, c) for j, k, c in placements}
    ops, pos = [], 1
    body = list(plan.ops)
    while pos <= len(body):
        if pos in by_start:
            end, c = by_start[pos]
            prefix = [plan.stream, *plan.order[:pos - 1]]
            refs = [probe_ref(query, ref, prefix) for ref in c.key]
            ops.append(CacheLookup(c.name, _key(query, refs, prefix),
                                   tuple(slots[m] for m in c.members),
                                   tuple(body[pos - 1:end]), c.tracked))
            pos = end + 1
        else:
            ops.append(body[pos - 1])
            pos += 1
    return replace(plan, ops=tuple(ops))


def updates(query: LogicalQuery, plan: PipelinePlan, caches: Sequence[CacheSpec],
            kind: str) -> PipelinePlan:
    """Pass 3: for each cache whose Z = X ∪ Y holds this pipeline's stream, a CacheUpdate
    after the first |Z| − 1 joins, where the prefix invariant (Def. 3.2) makes the tuples
    passing exactly the new tuples of Z's join (§3.2, §6). Deletion pipelines maintain
    prefix-invariant caches only (a §6 cache drops deleted rows by identity instead)."""
    if kind not in KINDS:
        raise ValueError(f"unknown pipeline kind {kind!r}; one of {', '.join(KINDS)}")
    slots = dict(plan.slots)
    at: dict[int, list[CacheUpdate]] = {}
    for c in caches:
        if plan.stream in c.z and not (kind != "insert" and c.extra):
            at.setdefault(len(c.z) - 1, []).append(CacheUpdate(
                c.name, _key(query, c.key, slots), tuple(slots[m] for m in c.members),
                delete=kind != "insert", tracked=c.tracked))
    return _insert_at(replace(plan, kind=kind), at, after=True)


def observers(query: LogicalQuery, plan: PipelinePlan,
              watches: Sequence[tuple[int, tuple[ColumnRef, ...], str]]) -> PipelinePlan:
    """Pass 4 (insertion pipelines only): for each (position, key columns, name), an
    Observe before operator ``position`` (1-based) reading the candidate cache's probe key
    from the prefix. One inside a cached segment runs on misses only."""
    if plan.kind != "insert" or not watches:
        return plan
    at: dict[int, list[Observe]] = {}
    for position, key, name in watches:
        if position <= len(plan.order):
            prefix = [plan.stream, *plan.order[:position - 1]]
            refs = [probe_ref(query, ref, prefix) for ref in key]
            at.setdefault(position - 1, []).append(Observe(name, _key(query, refs, prefix)))
    return _insert_at(plan, at, after=False)


def emit(plan: PipelinePlan) -> PipelinePlan:
    """Pass 5: an Emit at the end; in a "maintain" pipeline, instead, drop everything after
    the last CacheUpdate (no CacheUpdate: an empty plan)."""
    if plan.kind != "maintain":
        return replace(plan, ops=(*plan.ops, Emit()))
    ops = list(plan.ops)
    while ops and not isinstance(ops[-1], CacheUpdate):
        ops.pop()
    return replace(plan, ops=tuple(ops))


def build(query: LogicalQuery, stream: str, order: Sequence[str], kind: str, *,
          caches: Sequence[CacheSpec] = (),
          placements: Sequence[tuple[int, int, CacheSpec]] = (),
          watches: Sequence[tuple[int, tuple[ColumnRef, ...], str]] = (),
          scans=lambda stream, positions: False) -> PipelinePlan:
    """The plan of ``stream``'s pipeline: the five passes in order. ``caches``: every cache
    in use (for CacheUpdates); ``placements``: (start, end, cache) used in this pipeline
    (insertion and retract-mode deletion pipelines look them up; "maintain" ones do not)."""
    plan = probes(query, stream, order, scans)
    if kind != "maintain":
        plan = lookups(query, plan, placements)
    plan = updates(query, plan, caches, kind)
    plan = observers(query, plan, watches)
    plan = emit(plan)
    return replace(plan, copy=kind == "insert" and bool(caches))


# ----- helpers -----------------------------------------------------------------------------
def _key(query: LogicalQuery, refs: Sequence[ColumnRef],
         slots: Sequence[str] | Mapping[str, int]) -> Key:
    """(slot, position) pairs of ColumnRefs, ``slots`` a prefix list or stream → slot."""
    index = slots if isinstance(slots, Mapping) else {s: k for k, s in enumerate(slots)}
    return tuple((index[r.stream], query.columns[r.stream].index(r.column)) for r in refs)


def _insert_at(plan: PipelinePlan, at: Mapping[int, list[Op]], after: bool) -> PipelinePlan:
    """Place ops at positions (joins done before them). Within a position, CacheUpdates
    (``after``) follow Observes. A position inside a cached segment puts the op in the
    segment (run on misses)."""
    if not at:
        return plan

    out: list[Op] = list(at.get(0, ()))
    done = 0
    for op in plan.ops:
        if isinstance(op, CacheLookup):
            inner: list[Op] = []
            last = op.segment[-1].slot
            for p in op.segment:
                inner.append(p)
                if isinstance(p, Probe):
                    done += 1
                    if done != last:  # the segment's end: after the lookup, below
                        inner.extend(at.get(done, ()))
            out.append(replace(op, segment=tuple(inner)))
            out.extend(at.get(done, ()))
        elif isinstance(op, Probe):
            out.append(op)
            done += 1
            out.extend(at.get(done, ()))
        else:
            out.append(op)
    return replace(plan, ops=tuple(out))


def describe(plan: PipelinePlan) -> str:
    """The plan as indented text, one operator per line (keys as ``v<slot>[<column>]``)."""
    streams = {k: s for s, k in plan.slots}

    def key(k: Key) -> str:
        return ", ".join(f"v{s}[{p}]" for s, p in k) or "-"

    def one(op, ind: str) -> list[str]:
        if isinstance(op, Probe):
            how = "scan" if op.scan else ("hash" if op.positions else "cartesian")
            return [f"{ind}Probe {op.stream} -> v{op.slot} ({how} on {key(op.key)})"]
        if isinstance(op, CacheLookup):
            head = (f"{ind}CacheLookup {op.cache} on {key(op.key)} -> "
                    + ", ".join(f"v{m}" for m in op.members) + " (on a miss:)")
            return [head] + [x for sub in op.segment for x in one(sub, ind + "  ")]
        if isinstance(op, CacheUpdate):
            members = "⋈".join(streams[m] for m in op.members)
            what = "delete" if op.delete else "insert"
            return [f"{ind}CacheUpdate {op.cache} {what} {members} on {key(op.key)}"]
        if isinstance(op, Observe):
            return [f"{ind}Observe {op.name} on {key(op.key)}"]
        return [f"{ind}Emit"]

    return "\n".join([plan.name] + [x for op in plan.ops for x in one(op, "  ")])
