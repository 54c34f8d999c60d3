"""NiagaraCQ's grouped plans as query-set executors: the baselines of cacq.txt §5 (Figure 10).

CACQ is compared (§5, Figure 11) with the two plans the NiagaraCQ optimizer builds for the
workload ``SELECT * FROM stocks s, articles a WHERE s.price > x AND s.symbol = a.symbol``,
many queries differing only in x. NiagaraCQ shares an operator between queries only when it
can show that "the set of tuples flowing into that operator in both queries is always the
same" (the *identical tuple sets* rule): its tuples carry no lineage, so the queries a tuple
may go to are implied by where it is in the plan.

- :class:`PullUp` (Figure 10(b)): the join at the bottom. Both inputs are unfiltered in every
  query, so all queries with the same join share **one join**; its output is identical for
  all of them, so their selections form **one grouped selection over the joined tuples**,
  followed by a *split* to each query. The selections run after the join, on every joined
  tuple — "contrary to well established query optimization wisdom" (§5): a quote is joined
  even when no query selects it, and a selection (a UDF, Figure 11(b)) is evaluated once per
  join result rather than once per quote.
- :class:`PushDown` (Figure 10(a)): the selections first. All of them read the unfiltered
  stream, so they form **one grouped selection per stream**, evaluated once per tuple for all
  queries; the split then feeds **a separate join per query** (the selected tuple sets differ,
  so no two joins may be grouped). The hash table of a relation no query selects on is
  shared by those queries ("although the hash table over articles is shared between
  queries", §5). A tuple selected by k queries is inserted and joined k times.

NiagaraCQ groups selections on one attribute into a join with a constant table indexed by a
B-tree (§5); the equivalent here is the engine's grouped filter
(:mod:`adaptcq.engine.grouped_filter`: sorted constants probed by bisection, hash sets for
``=``/``IN``), the same structure the eddy uses, so the comparison measures the plans and not
the predicate index. Selections a grouped filter cannot take (UDFs, column against column)
are compiled predicates (:class:`~adaptcq.engine.grouped_filter.OpaqueFilter`), all of a
grouped selection's evaluated for every tuple it receives ("NiagaraCQ cannot group UDFs").
Join state is the engine's :class:`~adaptcq.state.stem.SteM` (hash indexes on the join
columns), as the eddy's.

**The query sets they run.** Queries are grouped by *join signature*: the set of FROM sources,
each with its window, and the join predicates (attribute classes over (source, column)).
Queries with the same signature are one NiagaraCQ group (PullUp: one shared join per
signature); a query with another signature gets a group of its own, as NiagaraCQ's optimizer
would do. Selections may be anything a query can have (ranges, ``IN``, ``BETWEEN``, ``OR``,
UDFs). Refused, with an :class:`~adaptcq.errors.OptionError` naming the query and why: a
self-join (one source twice in FROM: the plans of Figure 10 join distinct streams, and a
signature over (source, column) could not tell the two inputs apart), ``start="window"`` and
``retain=`` (the plans keep no rows for a query registered later).

**Semantics** are those of every query-set executor (``engine.eddy``): each query emits rows
``(*outputs, sign, ts)``; query q registered after arrival s_q and removed after arrival
s'_q outputs exactly what the single-query engine produces for q alone on the arrivals in
(s_q, s'_q]. Windows (``[RANGE w]``, ``[ROWS n]`` counted before selection, unbounded) keep
each SteM equal to its window's contents at every update (range deletions are processed, in
(t + w, arrival) order, before the first update with a later timestamp), so a probe needs no
window test; in retract mode a deletion emits the results it ends, with sign -1 and time
t + w (or the arriving row's time, for ``[ROWS n]``). A result is visible to q only when every
component arrived after s_q (the smallest component arrival number is carried along the join).

**Keeping the baselines fair** (they are for speed comparisons, so nothing in them is slower
than it has to be):

- the grouped selections are the same compiled grouped filters the eddy uses; a grouped
  selection is one generated probe per filter with no per-tuple routing or lineage;
- joins probe hash indexes on SteMs, with a straight-line loop for a two-way join (the §5
  workload) and rows shared by reference (never copied: a joined tuple is a tuple of
  references to the component rows, not a concatenation);
- nothing is stored that no plan can read: in append mode a single-source query's rows are
  not stored at all; PullUp probes skip rows older than every query of the group;
- no per-tuple bookkeeping for statistics beyond a few counters per arrival;
- what remains is what the paper attributes to each plan: PullUp joins every tuple and
  selects after the join; PushDown stores and joins a tuple once per query selecting it.
"""

from __future__ import annotations

import bisect
import functools
import heapq
from collections import deque
from collections.abc import Callable, Mapping

from adaptcq.errors import OptionError, QueryError
from adaptcq.query.logical import ColumnRef, LogicalQuery, require_equi_joins
from adaptcq.query.udf import calls_udf, default_registry, guarded_output
from adaptcq.stream.eventtime import to_units

CAPACITY_DEFAULT = 1024


# ----- grouped selection ----------------------------------------------------------------------
class GroupedSelection:
    """The selections of many queries over tuples of ``len(sources)`` components, evaluated
    together (cacq.txt §3.2.6 grouped filters; NiagaraCQ's grouped selection of §5).

    ``sources`` names each component's source and ``columns`` its row layout. A query's
    selection (per component: the alias's expression) is reduced to CNF (§3.2.7); each
    clause of one atom is a *conjunct* tagged with the query's bit, a clause of several atoms
    gets a *disjunct* tag of its own, satisfied when any of its atoms is TRUE. Simple atoms go
    into the grouped filter of (component, column), others into the component's opaque
    filter. :meth:`fails` returns the query bits whose selection the tuple does not pass.
    """

    def __init__(self, sources: tuple[str, ...], columns: tuple[tuple[str, ...], ...],
                 udfs: Mapping | None, on_error: Callable[[int, str], None]):
        self.sources = sources
        self.columns = columns
        self.udfs = udfs
        self.on_error = on_error           # (query bit, message): a UDF raised
        self.filters: dict[tuple[int, str], object] = {}     # (comp, column) -> GroupedFilter
        self.opaque: dict[int, object] = {}                   # comp -> OpaqueFilter
        self.needs: dict[int, int] = {}    # query bit -> disjunct tags it needs, all TRUE
        self.owner: dict[int, int] = {}    # disjunct tag -> query bit
        self.queries = 0                   # query bits with at least one clause here
        self.fails: Callable[[tuple], int] = lambda comps: 0
        self.fails_row: Callable[[tuple], int] = lambda row: 0

    def __len__(self) -> int:
        return sum(len(f) for f in self.filters.values()) + sum(
            len(f) for f in self.opaque.values())

    def add(self, bit: int, query: LogicalQuery, comp_of: Mapping[str, int]) -> bool:
        """Fold ``query``'s selections (alias -> component by ``comp_of``) in under ``bit``;
        returns whether it has any clause here."""
        try:
            return self._add(bit, query, comp_of)
        except Exception:
            self.remove(bit)        # a clause that does not compile leaves nothing behind
            raise

    def _add(self, bit: int, query: LogicalQuery, comp_of: Mapping[str, int]) -> bool:
        from adaptcq.engine.grouped_filter import GroupedFilter, OpaqueFilter
        from adaptcq.query.cnf import classify, to_cnf
        from adaptcq.query.expr import compile_predicate
        any_clause = False
        for alias, comp in comp_of.items():
            expr = query.selections.get(alias)
            if expr is None:
                continue
            cols = self.columns[comp]
            for clause in to_cnf(expr, query.sql):
                any_clause = True
                atoms = [classify(a, alias, cols, query.types) for a in clause]
                disjunct = len(atoms) > 1
                if disjunct:
                    tag = 0
                    while tag in self.owner:
                        tag += 1
                    self.owner[tag] = bit
                    self.needs[bit] = self.needs.get(bit, 0) | 1 << tag
                else:
                    tag = bit
                for atom in atoms:
                    if atom.kind == "simple":
                        gf = self.filters.get((comp, atom.column))
                        if gf is None:
                            gf = self.filters[(comp, atom.column)] = GroupedFilter(
                                self.sources[comp], atom.column, cols.index(atom.column))
                        gf.add(atom.op, atom.constant, tag, disjunct=disjunct)
                    else:
                        of = self.opaque.get(comp)
                        if of is None:
                            of = self.opaque[comp] = OpaqueFilter(self.sources[comp])
                        fn = compile_predicate(atom.expr, cols, alias, query.types,
                                               udfs=_called(atom.expr, self.udfs))
                        of.add(fn, tag, disjunct=disjunct, label=atom.expr.sql())
        if any_clause:
            self.queries |= 1 << bit
        self._rebuild()
        return any_clause

    def remove(self, bit: int) -> None:
        """Remove every clause of query ``bit`` (idempotent)."""
        tags = [t for t, b in self.owner.items() if b == bit]
        for f in [*self.filters.values(), *self.opaque.values()]:
            f.remove(bit, disjunct=False)
            for t in tags:
                f.remove(t, disjunct=True)
        for t in tags:
            del self.owner[t]
        self.needs.pop(bit, None)
        self.queries &= ~(1 << bit)
        self.filters = {k: f for k, f in self.filters.items() if len(f)}
        self.opaque = {k: f for k, f in self.opaque.items() if len(f)}
        self._rebuild()

    def _rebuild(self) -> None:
        """Bind ``fails``/``fails_row`` to the current filters: queries change rarely,
        tuples arrive constantly, so the per-tuple path is a closure over exactly the
        probes in use (one probe call when one grouped filter holds everything, as in §5)."""
        probes = []
        for (comp, _), gf in self.filters.items():
            gf.probe(None)                 # build the generated probe now, not per tuple
            probes.append((comp, gf.probe_row))
        for comp, of in self.opaque.items():
            probes.append((comp, self._guarded(of)))
        needs = tuple(self.needs.items())
        if not probes:
            self.fails = self.fails_row = lambda x: 0
        elif len(probes) == 1 and not needs:
            comp, probe = probes[0]
            self.fails = lambda comps: probe(comps[comp])[0]
            self.fails_row = lambda row: probe(row)[0]
        else:
            probes = tuple(probes)

            def fails(comps):
                fail = passed = 0
                for comp, probe in probes:
                    f, p = probe(comps[comp])
                    fail |= f
                    passed |= p
                for bit, need in needs:     # §3.2.7: every disjunct tag must be TRUE
                    if need & ~passed:
                        fail |= 1 << bit
                return fail

            self.fails = fails
            self.fails_row = lambda row: fails((row,))

    def _guarded(self, of) -> Callable[[tuple], tuple[int, int]]:
        """The opaque filter's probe; a predicate that raises (a UDF) fails its query,
        which is reported and taken out of the filter, and the row is probed again."""
        from adaptcq.engine.grouped_filter import FilterError

        def probe(row):
            failed = 0
            while True:
                try:
                    f, p = of.probe_row(row)
                    return f | failed, p
                except FilterError as e:
                    bit = self.owner.get(e.bit, e.bit) if e.disjunct else e.bit
                    failed |= 1 << bit
                    of.remove(bit, disjunct=False)
                    for t, b in list(self.owner.items()):
                        if b == bit:
                            of.remove(t, disjunct=True)
                    self.on_error(bit, str(e))

        return probe

    def describe(self) -> list[str]:
        out = [f"{self.sources[c]}.{col} ({len(f)} predicates)"
               for (c, col), f in self.filters.items()]
        out += [f"{self.sources[c]} opaque ({len(f)} predicates)" for c, f in self.opaque.items()]
        return out


# ----- join state ---------------------------------------------------------------------------
class Store:
    """One SteM under one window: the rows of ``source`` in that window (those its plan
    stores), with their arrival numbers as row ids (``state.stem.SteM``)."""

    __slots__ = ("dead", "kind", "owner", "size", "source", "stem")

    def __init__(self, source: str, columns: tuple[str, ...], kind: str, size, owner):
        from adaptcq.state.stem import SteM
        self.source = source
        self.stem = SteM(source, columns)
        self.kind, self.size = kind, size
        self.owner = owner       # who is told of deletions (the executor interprets it)
        self.dead = False        # dropped with its last query: pending expiries skip it


class Join:
    """A pipelined n-way symmetric hash join over one :class:`Store` per component (the
    doubly-pipelined join of cacq.txt §3.3.1, generalised to n inputs as MJoin does): an
    update of component i probes the others in a fixed order, each step an index probe keyed
    on the values bound so far. The join graph is connected (the parser refuses cross
    products), so each step has at least one equality."""

    def __init__(self, stores: list[Store], classes: list[list[tuple[int, int]]]):
        self.stores = stores
        self.n = len(stores)
        self.runs = [self._compile(i, classes) for i in range(self.n)]

    def _compile(self, i: int, classes) -> Callable:
        """``run(row, rid, seq) -> [(comps, smallest rid)]``: the results an update of
        component i makes with the other stores' rows arrived after ``seq``."""
        n = self.n
        bound, steps = {i}, []
        while len(bound) < n:
            best = None
            for j in range(n):
                if j in bound:
                    continue
                spec = {}
                for cls in classes:
                    theirs = sorted((c, p) for c, p in cls if c in bound)
                    if theirs:
                        for c, p in cls:
                            if c == j:
                                spec[p] = theirs[0]
                if spec and (best is None or len(spec) > len(best[1])):
                    best = (j, spec)
            j, spec = best
            positions = tuple(sorted(spec))
            steps.append((j, self.stores[j].stem.index(positions),
                          tuple(spec[p] for p in positions)))
            bound.add(j)
        if not steps:
            return lambda row, rid, seq: [((row,), rid)]
        if len(steps) == 1 and len(steps[0][2]) == 1:
            # The two-way join on one attribute (§5): a straight loop over one bucket.
            j, index, ((_, p),) = steps[0]
            first = i < j

            def run2(row, rid, seq):
                key = row[p]
                if key is None:
                    return ()
                bucket = index.get(key)
                if not bucket:
                    return ()
                # min() as a conditional: a call costs several times more here.
                if first:
                    return [((row, r2), rid if rid < rid2 else rid2)  # noqa: FURB136
                            for rid2, r2 in bucket.items() if rid2 > seq]
                return [((r2, row), rid if rid < rid2 else rid2)  # noqa: FURB136
                        for rid2, r2 in bucket.items() if rid2 > seq]
            return run2
        last = len(steps) - 1

        def extend(k, comps, minrid, seq, out):
            j, index, src = steps[k]
            if len(src) == 1:
                c, p = src[0]
                key = comps[c][p]
                if key is None:
                    return
            else:
                key = tuple(comps[c][p] for c, p in src)
                if None in key:
                    return
            bucket = index.get(key)
            if not bucket:
                return
            for rid2, r2 in bucket.items():
                if rid2 <= seq:
                    continue
                comps[j] = r2
                m = minrid if minrid < rid2 else rid2  # noqa: FURB136
                if k == last:
                    out.append((tuple(comps), m))
                else:
                    extend(k + 1, comps, m, seq, out)
            comps[j] = None

        def run(row, rid, seq):
            comps = [None] * n
            comps[i] = row
            out = []
            extend(0, comps, rid, seq, out)
            return out
        return run


def signature(query: LogicalQuery, windows: Mapping[str, tuple]) -> tuple:
    """The join signature (module docstring): sources with windows, attribute classes over
    (source, column). Selections are not part of it."""
    src = {s.alias: s.source for s in query.streams}
    return (tuple(sorted((s.source, *windows[s.alias]) for s in query.streams)),
            frozenset(frozenset((src[c.stream], c.column) for c in cls)
                      for cls in query.classes))


class _Query:
    __slots__ = ("bit", "comp_of", "emit", "emitted", "group", "handle", "join", "mask",
                 "project", "query", "seq", "stores")

    def __init__(self, handle, bit, query, emit, seq):
        self.handle, self.bit, self.mask = handle, bit, 1 << bit
        self.query, self.emit, self.seq = query, emit, seq
        self.emitted = 0
        self.comp_of: dict[str, int] = {}      # source -> component index
        self.project = None
        self.group = None
        self.join = None
        self.stores: list[Store] = []


# ----- the common executor ------------------------------------------------------------------
class _Niagara:
    """What both plans share: the query registry and bits, windows (range expiries in one
    heap, count windows per (source, n)), projections, failures. Subclasses build the plan
    (``_install``/``_uninstall``), route arrivals (``_arrive``) and deletions (``_deleted``)."""

    name = "niagara"

    def __init__(self, schemas: Mapping[str, Mapping[str, str]], policy=None,
                 mode: str = "append", time_unit: float = 1.0,
                 capacity: int = CAPACITY_DEFAULT, retain: Mapping | None = None,
                 udfs: Mapping | None = None, routing_epoch: int | None = None):
        if mode not in ("append", "retract"):
            raise OptionError(f"unknown mode {mode!r}; choose append or retract")
        if retain:
            raise OptionError(f"retain= keeps rows for queries registered with "
                              f"start='window', which the NiagaraCQ {self.name} plan does "
                              "not support (its plans hold no rows for later queries)")
        self.mode = mode
        self.retract = mode == "retract"
        # ``policy`` and ``routing_epoch`` are the eddy's routing; they are accepted for the
        # common executor interface and unused: the plans are static (cacq.txt §5).
        self.policy = policy
        self.time_unit = time_unit
        self.capacity = capacity
        self.schemas = {s: dict(c) for s, c in schemas.items()}
        self.columns = {s: tuple(c) for s, c in schemas.items()}
        self.udfs = dict(udfs) if udfs else None   # None: the default UDF registry
        self.queries: dict[str, _Query] = {}
        self.by_bit: dict[int, _Query] = {}
        self.free_bits: list[int] = []
        self.next_bit = 0
        self.alive = 0
        self.last_reg = -1
        self.rid = 0
        self.heap: list = []              # (t + w, rid, n, store): range expiries
        self._n = 0                       # heap tie-breaker
        # Count windows: (source, n) -> [deque of the source's last n arrival ids,
        # {rid: [stores holding it]}].
        self.counted: dict[tuple[str, int], list] = {}
        self.count_sizes: dict[str, tuple[int, ...]] = {}
        self.failures: list[tuple[str, str]] = []
        self._failed: list[tuple[int, str]] = []
        self.counts = {"arrivals": 0, "joins": 0, "joined": 0, "selections": 0,
                       "outputs": 0, "deletions": 0}

    # ----- registration -----------------------------------------------------------------
    def add_query(self, handle: str, query: LogicalQuery, emit: Callable[[tuple], None],
                  start: str = "now") -> _Query:
        """Register ``query``: it sees the arrivals after the current one."""
        if handle in self.queries:
            raise OptionError(f"a query is already registered as {handle!r}")
        if start != "now":
            raise OptionError(f"query {handle!r}: start={start!r} is not supported by the "
                              f"NiagaraCQ {self.name} plan (its plans hold no rows for a "
                              "query registered later); use start='now' or the eddy")
        seen = self.check_query(handle, query)
        bit = self.free_bits[0] if self.free_bits else self.next_bit
        if bit >= self.capacity:
            raise OptionError(f"more than {self.capacity} queries at once; raise capacity=")
        q = _Query(handle, bit, query, emit, self.rid)
        q.comp_of = {s: k for k, s in enumerate(sorted(seen))}
        q.project = self._projection(q)
        if calls_udf(query.outputs, self.udfs or default_registry()):
            q.emit, q.project = guarded_output(functools.partial(self._on_error, bit),
                                               q.emit, q.project)
        self._install(q)
        if self.free_bits and self.free_bits[0] == bit:
            self.free_bits.pop(0)
        else:
            self.next_bit += 1
        self.queries[handle] = q
        self.by_bit[bit] = q
        self.alive |= q.mask
        self.last_reg = max(self.last_reg, q.seq)
        self._windows_changed()
        return q

    def check_query(self, handle: str, query: LogicalQuery) -> dict[str, str]:
        """What NiagaraCQ's plans cannot run, refused (``runtime.multi.Engine.register``
        calls it before any data; ``add_query`` again): a non-equi join, an unknown source,
        a self-join. Returns source -> alias."""
        require_equi_joins(query, "NiagaraCQ")
        seen: dict[str, str] = {}
        for s in query.streams:
            if s.source not in self.columns:
                raise QueryError(f"unknown source {s.source!r} (this engine's sources: "
                                 f"{', '.join(self.columns)})", query.sql, s.position)
            if s.source in seen:
                raise OptionError(
                    f"query {handle!r} reads {s.source!r} twice ({seen[s.source]} and "
                    f"{s.alias}): a self-join is not one of NiagaraCQ's grouped plans "
                    "(cacq.txt §5, Figure 10 joins distinct streams), and the NiagaraCQ "
                    "optimizer groups only identical tuple sets; run it with the eddy")
            seen[s.source] = s.alias
        return seen

    def remove_query(self, handle: str, error: str | None = None) -> _Query:
        """Deregister: the query gets nothing more; its bit is free for the next query."""
        q = self.queries.pop(handle, None)
        if q is None:
            raise OptionError(f"no query is registered as {handle!r} (registered: "
                              f"{', '.join(self.queries) or 'none'})")
        del self.by_bit[q.bit]
        self.alive &= ~q.mask
        self._uninstall(q)
        bisect.insort(self.free_bits, q.bit)
        if error is not None:
            self.failures.append((handle, error))
        self.last_reg = max((x.seq for x in self.queries.values()), default=-1)
        self._windows_changed()
        return q

    def _units(self, seconds):
        return to_units(seconds, self.time_unit)

    def _windows(self, query: LogicalQuery) -> dict[str, tuple]:
        out = {}
        for s in query.streams:
            w = s.window
            size = None if w.size is None else (
                w.in_units(self.time_unit) if w.kind == "range" else int(w.size))
            out[s.alias] = (w.kind, size)
        return out

    def _classes(self, q: _Query) -> list[list[tuple[int, int]]]:
        """The query's attribute classes as (component, position) pairs."""
        src = {s.alias: s.source for s in q.query.streams}
        return [[(q.comp_of[src[c.stream]], self.columns[src[c.stream]].index(c.column))
                 for c in sorted(cls, key=lambda c: (c.stream, c.column))]
                for cls in q.query.classes]

    def _projection(self, q: _Query) -> Callable:
        """comps (rows in component order) -> the query's output values."""
        from adaptcq.query import udf as udfmod
        from adaptcq.query.expr import compile_projection, eval_namespace
        src = {s.alias: s.source for s in q.query.streams}

        def resolve(ref: ColumnRef) -> str:
            s = src[ref.stream]
            return f"c[{q.comp_of[s]}][{self.columns[s].index(ref.column)}]"
        all_udfs = self.udfs if self.udfs is not None else dict(udfmod.default_registry())
        udfs = {}
        for o in q.query.outputs:
            udfs.update(_called(o.expr, all_udfs))
        body = compile_projection(q.query.outputs, resolve, q.query.types, udfs=udfs)
        return eval(f"lambda c: {body}", eval_namespace(udfs))

    def _new_store(self, source: str, window: tuple, owner) -> Store:
        return Store(source, self.columns[source], window[0], window[1], owner)

    def _windows_changed(self) -> None:
        """Track the count windows in use: (source, n) of every live store."""
        sizes: dict[str, set] = {}
        for store in self._stores():
            if store.kind == "rows":
                sizes.setdefault(store.source, set()).add(store.size)
        self.count_sizes = {s: tuple(sorted(v)) for s, v in sizes.items()}
        for key in list(self.counted):
            if key[1] not in sizes.get(key[0], ()):
                del self.counted[key]
        for s, ns in self.count_sizes.items():
            for n in ns:
                self.counted.setdefault((s, n), [deque(), {}])

    # ----- failures (a UDF raised) --------------------------------------------------------
    def _on_error(self, bit: int, message: str) -> None:
        """The query stops getting output at once and is removed after this update."""
        q = self.by_bit.get(bit)
        if q is None or not self.alive & q.mask:
            return
        self.alive &= ~q.mask
        self._mute(q)
        self._failed.append((bit, message))

    def _mute(self, q: _Query) -> None:
        """Take ``q`` out of every split at once (subclasses)."""

    def _remove_failed(self) -> None:
        failed, self._failed = self._failed, []
        for bit, message in failed:
            q = self.by_bit.get(bit)
            if q is not None:
                self.remove_query(q.handle, error=message)

    # ----- the update loop ------------------------------------------------------------------
    def process(self, source: str, ts, row: tuple) -> None:
        """One arrival: the window deletions due before it, its count-window deletions,
        then the plan (``_arrive``)."""
        heap = self.heap
        while heap and heap[0][0] < ts:
            self._expire(heapq.heappop(heap))
        self.rid += 1
        rid = self.rid
        self.counts["arrivals"] += 1
        sizes = self.count_sizes.get(source)
        if sizes:
            for n in sizes:
                recent, holders = self.counted[(source, n)]
                if len(recent) >= n:
                    old = recent.popleft()
                    for store in holders.pop(old, ()):
                        if not store.dead:
                            old_row = store.stem.delete(old)
                            if self.retract:
                                self._deleted(store, old, old_row, ts)
                recent.append(rid)
        self._arrive(source, rid, ts, row)
        if self._failed:
            self._remove_failed()

    def advance_to(self, now) -> None:
        """Process every window deletion due before ``now``."""
        heap = self.heap
        while heap and heap[0][0] < now:
            self._expire(heapq.heappop(heap))
        if self._failed:
            self._remove_failed()

    def _expire(self, entry) -> None:
        t, rid, _, store = entry
        if store.dead:
            return
        row = store.stem.delete(rid)
        self.counts["deletions"] += 1
        if self.retract:
            self._deleted(store, rid, row, t)

    def _insert(self, store: Store, rid: int, row: tuple, ts) -> None:
        """Into a store, with its window's expiry."""
        store.stem.insert(rid, row, ts)
        kind = store.kind
        if kind == "range":
            self._n += 1
            heapq.heappush(self.heap, (ts + store.size, rid, self._n, store))
        elif kind == "rows":
            holders = self.counted[(store.source, store.size)][1]
            got = holders.get(rid)
            if got is None:
                holders[rid] = [store]
            else:
                got.append(store)

    def visible(self, minrid: int) -> int:
        """Queries that may see a result whose oldest component arrived as ``minrid``."""
        if minrid > self.last_reg:
            return self.alive
        m = 0
        for q in self.queries.values():
            if q.seq < minrid:
                m |= q.mask
        return m & self.alive

    # subclass hooks
    def _install(self, q: _Query) -> None:
        raise NotImplementedError

    def _uninstall(self, q: _Query) -> None:
        raise NotImplementedError

    def _stores(self):
        raise NotImplementedError

    def _arrive(self, source: str, rid: int, ts, row: tuple) -> None:
        raise NotImplementedError

    def _deleted(self, store: Store, rid: int, row: tuple, ts) -> None:
        raise NotImplementedError


# ----- PullUp (Figure 10(b)) ------------------------------------------------------------------
class _Group:
    """One NiagaraCQ group of PullUp: the queries of one join signature, their shared join
    and the grouped selection over its output."""

    def __init__(self, sig, sources: tuple[str, ...]):
        self.sig = sig
        self.sources = sources
        self.comp_of = {s: k for k, s in enumerate(sources)}
        self.stores: list[Store] = []
        self.join: Join | None = None
        self.selection: GroupedSelection | None = None
        self.mask = 0          # its live queries
        self.min_seq = -1      # rows arrived before every query of the group are skipped


class PullUp(_Niagara):
    """NiagaraCQ's PullUp plan (cacq.txt §5, Figure 10(b)): per join signature one shared
    join of all its queries, then one grouped selection over the joined tuples, then a
    split to each query (see the module docstring). Same interface as
    :class:`adaptcq.engine.eddy.Eddy`."""

    name = "PullUp"

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.groups: dict[tuple, _Group] = {}
        self.readers: dict[str, list[_Group]] = {s: [] for s in self.columns}

    def _stores(self):
        for g in self.groups.values():
            yield from g.stores

    def _install(self, q: _Query) -> None:
        windows = self._windows(q.query)
        sig = signature(q.query, windows)
        g = self.groups.get(sig)
        new = g is None
        if new:
            g = _Group(sig, tuple(sorted(q.comp_of)))
            win = {s.source: windows[s.alias] for s in q.query.streams}
            g.stores = [self._new_store(s, win[s], g) for s in g.sources]
            g.join = Join(g.stores, self._classes(q))
            g.selection = GroupedSelection(
                g.sources, tuple(self.columns[s] for s in g.sources), self.udfs,
                self._on_error)
        # q's components are the group's (both sorted by source).
        alias_comp = {s.alias: g.comp_of[s.source] for s in q.query.streams}
        g.selection.add(q.bit, q.query, alias_comp)
        q.group = g
        g.mask |= q.mask
        g.min_seq = min(x.seq for x in [*self._group_queries(g), q])
        if new:
            self.groups[sig] = g
            for s in g.sources:
                self.readers[s].append(g)

    def _group_queries(self, g: _Group) -> list[_Query]:
        return [x for x in self.queries.values() if x.group is g]

    def _mute(self, q: _Query) -> None:
        q.group.mask &= ~q.mask

    def _uninstall(self, q: _Query) -> None:
        g = q.group
        g.mask &= ~q.mask
        g.selection.remove(q.bit)
        rest = self._group_queries(g)
        if rest:
            g.min_seq = min(x.seq for x in rest)
            return
        # The group's last query: its join state goes (a later query of this signature
        # sees only later arrivals, so it starts a new group with empty stores).
        del self.groups[g.sig]
        for s in g.sources:
            self.readers[s].remove(g)
        for store in g.stores:
            store.dead = True

    def _arrive(self, source: str, rid: int, ts, row: tuple) -> None:
        counts = self.counts
        for g in self.readers[source]:
            i = g.comp_of[source]
            if g.join.n > 1 or self.retract:   # a lone source's rows are never probed
                self._insert(g.stores[i], rid, row, ts)
            results = g.join.runs[i](row, rid, g.min_seq)
            counts["joins"] += 1
            if results:
                self._split(g, results, 1, ts)

    def _deleted(self, store: Store, rid: int, row: tuple, ts) -> None:
        g = store.owner
        results = g.join.runs[g.comp_of[store.source]](row, rid, g.min_seq)
        self.counts["joins"] += 1
        if results:
            self._split(g, results, -1, ts)

    def _split(self, g: _Group, results, sign: int, ts) -> None:
        """The grouped selection over the joined tuples, then the split (Figure 10(b))."""
        fails = g.selection.fails
        by_bit = self.by_bit
        last = self.last_reg
        outputs = 0
        for comps, minrid in results:
            cand = g.mask if minrid > last else g.mask & self.visible(minrid)
            if not cand:
                continue
            cand &= ~fails(comps)
            cand &= g.mask          # a UDF failing just now took its query out
            while cand:
                low = cand & -cand
                q = by_bit[low.bit_length() - 1]
                q.emit((*q.project(comps), sign, ts))
                outputs += 1
                cand ^= low
        counts = self.counts
        counts["joined"] += len(results)
        counts["selections"] += len(results)
        counts["outputs"] += outputs

    def describe(self) -> dict:
        groups = []
        for g in self.groups.values():
            groups.append({
                "join": " ⋈ ".join(f"{s.source} {_wname(s)}" for s in g.stores),
                "queries": [q.handle for q in self._group_queries(g)],
                "rows": {s.source: len(s.stem) for s in g.stores},
                "grouped selection (after the join)": g.selection.describe()})
        return {"plan": "NiagaraCQ PullUp (cacq.txt §5, Figure 10(b))", "groups": groups,
                "counts": dict(self.counts), "failures": list(self.failures)}


# ----- PushDown (Figure 10(a)) ----------------------------------------------------------------
class PushDown(_Niagara):
    """NiagaraCQ's PushDown plan (cacq.txt §5, Figure 10(a)): per source one grouped
    selection over the unfiltered stream, shared by every query reading it; a split; then a
    join per query over its selected tuples, the SteM of a relation a query does not select
    on shared by the queries with that window on it (see the module docstring). Same
    interface as :class:`adaptcq.engine.eddy.Eddy`."""

    name = "PushDown"

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.selections: dict[str, GroupedSelection] = {}
        self.readers: dict[str, int] = {}           # source -> its queries' bits
        self.shared: dict[tuple, Store] = {}         # (source, kind, size) -> unselected SteM
        self.shared_users: dict[tuple, int] = {}     # its queries' bits

    def _stores(self):
        yield from self.shared.values()
        for q in self.queries.values():
            for s in q.stores:
                if s.owner is q:
                    yield s

    def _install(self, q: _Query) -> None:
        windows = self._windows(q.query)
        stores = [None] * len(q.comp_of)
        added, shared = [], []
        try:
            for s in q.query.streams:
                sel = self.selections.get(s.source)
                if sel is None:
                    sel = self.selections[s.source] = GroupedSelection(
                        (s.source,), (self.columns[s.source],), self.udfs, self._on_error)
                added.append(sel)
                own = sel.add(q.bit, q.query, {s.alias: 0})
                w = windows[s.alias]
                if own or (len(q.comp_of) == 1 and not self.retract):
                    # its selected tuples: a SteM of its own (a lone source in append
                    # mode: never filled, nothing probes it)
                    store = self._new_store(s.source, w, q)
                else:        # unselected: the hash table shared by such queries
                    key = (s.source, *w)
                    store = self.shared.get(key)
                    if store is None:
                        store = self.shared[key] = self._new_store(s.source, w, key)
                    self.shared_users[key] = self.shared_users.get(key, 0) | q.mask
                    shared.append(key)
                stores[q.comp_of[s.source]] = store
        except Exception:       # leave nothing behind
            for sel in added:
                sel.remove(q.bit)
            for key in shared:
                self.shared_users[key] &= ~q.mask
                if not self.shared_users[key]:
                    del self.shared_users[key]
                    del self.shared[key]
            for src, sel in list(self.selections.items()):
                if not self.readers.get(src) and not len(sel):
                    del self.selections[src]
            raise
        for s in q.query.streams:
            self.readers[s.source] = self.readers.get(s.source, 0) | q.mask
        q.stores = stores
        q.join = Join(stores, self._classes(q))

    def _mute(self, q: _Query) -> None:
        for s in q.query.streams:
            self.readers[s.source] &= ~q.mask

    def _uninstall(self, q: _Query) -> None:
        for s in q.query.streams:
            self.readers[s.source] &= ~q.mask
            sel = self.selections[s.source]
            sel.remove(q.bit)
            if not self.readers[s.source]:
                del self.readers[s.source]
                del self.selections[s.source]
        for store in q.stores:
            if store.owner is q:
                store.dead = True
            else:
                key = store.owner
                self.shared_users[key] &= ~q.mask
                if not self.shared_users[key]:
                    del self.shared_users[key]
                    del self.shared[key]
                    store.dead = True

    def _arrive(self, source: str, rid: int, ts, row: tuple) -> None:
        readers = self.readers.get(source)
        if not readers:
            return
        counts = self.counts
        # The grouped selection: one evaluation for every query reading the source.
        passed = readers & ~self.selections[source].fails_row(row)
        counts["selections"] += 1
        store_all = self.retract
        for key, store in self.shared.items():     # unselected relations: stored once
            if key[0] == source:
                self._insert(store, rid, row, ts)
        passed &= self.alive
        by_bit = self.by_bit
        joins = joined = outputs = 0
        # The split: each selecting query's own join (a tuple selected by k queries is
        # stored and joined k times, Figure 10(a)).
        while passed:
            low = passed & -passed
            passed ^= low
            q = by_bit[low.bit_length() - 1]
            i = q.comp_of[source]
            store = q.stores[i]
            if store.owner is q and (store_all or len(q.stores) > 1):
                self._insert(store, rid, row, ts)
            results = q.join.runs[i](row, rid, q.seq)
            joins += 1
            if results:
                joined += len(results)
                emit, project = q.emit, q.project
                for comps, _ in results:
                    emit((*project(comps), 1, ts))
                outputs += len(results)
        counts["joins"] += joins
        counts["joined"] += joined
        counts["outputs"] += outputs

    def _deleted(self, store: Store, rid: int, row: tuple, ts) -> None:
        if isinstance(store.owner, _Query):
            users = store.owner.mask & self.alive
        else:
            users = self.shared_users.get(store.owner, 0) & self.alive
        while users:
            low = users & -users
            users ^= low
            q = self.by_bit[low.bit_length() - 1]
            if q.seq >= rid:
                continue
            results = q.join.runs[q.comp_of[store.source]](row, rid, q.seq)
            self.counts["joins"] += 1
            for comps, _ in results:
                q.emit((*q.project(comps), -1, ts))
            self.counts["outputs"] += len(results)

    def describe(self) -> dict:
        return {
            "plan": "NiagaraCQ PushDown (cacq.txt §5, Figure 10(a))",
            "grouped selections": {s: sel.describe() for s, sel in self.selections.items()},
            "shared SteMs": {f"{k[0]} {_wname(st)}": len(st.stem)
                             for k, st in self.shared.items()},
            "joins": {q.handle: " ⋈ ".join(
                f"{st.source} {_wname(st)} ({'own' if st.owner is q else 'shared'}, "
                f"{len(st.stem)} rows)" for st in q.stores) for q in self.queries.values()},
            "counts": dict(self.counts), "failures": list(self.failures)}


def _called(expr, udfs: Mapping | None) -> dict | None:
    """The UDFs (of ``udfs``; None: the default registry) that ``expr`` calls. Compiling
    with only those keeps registration cheap: every UDF handed to the compiler is checked
    against SQL's built-in names (``query.udf.check_udf_name``, a sqlglot parse each), and
    §5's UDF experiment has 100 queries, each with its own UDF."""
    import sqlglot.expressions as exp

    from adaptcq.query import udf as udfmod
    names = {n.name.lower() for n in expr.find_all(exp.Anonymous)}
    if not names:
        return {}
    pool = udfs if udfs is not None else udfmod.default_registry()
    return {k: f for k, f in pool.items() if k.lower() in names}


def _wname(store: Store) -> str:
    if store.kind == "range":
        return f"[RANGE {store.size}]"
    if store.kind == "rows":
        return f"[ROWS {store.size}]"
    return "[UNBOUNDED]"
