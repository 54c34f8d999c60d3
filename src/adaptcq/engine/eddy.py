"""The CACQ eddy: many continuous queries over shared SteMs and grouped filters, every tuple
routed one operator at a time (cacq.txt §3.1–3.3).

Mechanism only: *which* operator a tuple visits next is asked of a routing policy
(``adapt.routing``); the policy is told what each operator consumed, returned and cost.

**Operators.** Per source: its grouped filters (one per column that some query's selection
compares with constants, ``engine.grouped_filter``; §3.2.6) and one opaque filter for every
other selection atom (UDFs, column-vs-column, arithmetic); per (source, role): a SteM
access (§3.3.1). A source's SteM is one :class:`~adaptcq.state.stem.SteM` holding full
source rows, shared by every query over the source; its hash indexes are those the
queries' join predicates probe.

**Tuple lineage** (§3.1.1, §3.2.2–3.2.3, §3.3.2). Python ints are the bitmaps.

- Every query has a *bit* (reused after it is removed). ``queriesCompleted`` is kept as its
  complement, the tuple's *query mask*: the queries the tuple may still be output to.
- A singleton carries, per source, the *done* bits of the source's operators list (bit j:
  filter j was applied) and the per-slot *failed* mask; a *slot* is one alias of one query
  over the source: ``bit + role * capacity`` (role: 0 for a query's first alias of the
  source, 1 for its second — a self-join — ...).
- The **per-row pass mask** (beyond the paper, which clears ``queriesCompleted`` on every
  new intermediate tuple and would forget a component's failed selections): after its
  filters, a singleton's slots that passed are stored with its row (``SourceState.passed``);
  an intermediate tuple's query mask is the AND of its components' pass masks, so a
  selection failed by one component is never forgotten.
- A *virtual source* (§3.3.2) is a set of (source, role) pairs, created lazily when an
  intermediate tuple of that type first appears. It has a query list (the queries over a
  superset of it), a completion mask (the queries over exactly it: a tuple of this virtual
  source is output to them), and a SteMs list (the SteM accesses its tuples still probe).
  A SteM access is *ready* for a tuple when some query in its mask joins the virtual
  source to that (source, role); visiting it hands all those queries to the intermediate
  tuples it produces (their bits leave the probing tuple's mask), so each result is built
  along exactly one route, whatever the routing policy chooses.

**SteMs** (§3.3.1). A singleton is built into its SteM before it probes any; the arrival
sequence number is global (``rid``); with roles, a row's sequence number as role k is
``rid * 8 + k``. An intermediate tuple is valid only if the probing tuple's sequence
number is greater than the indexed row's, and keeps the larger: so every result is
produced once, at its last component's arrival — and, in a self-join, a row pairs with
itself through two aliases exactly as the single-query engine's alias-by-alias arrivals
do (role 1 probes role 0 and finds itself; role 0 never finds role 1).

**Windows** (§3.3.3). A shared SteM keeps a row as long as the widest window of any query
over the source (``[RANGE w]`` and ``[ROWS n]``; a source with an unbounded alias keeps
every row); each query's own window is checked at match time. The holds recorded at a
row's arrival are hints: a row whose last hold lets go leaves only if no running query's
window, nor ``retain``, still needs it (``Eddy._needed``), as the query set may have
changed since (docs/cacq.md, "Windows and deletions"). In retract mode each query
gets its own deletions: a row leaving the window of alias (source, role) of the queries
with window w is a *deletion tuple* routed like an insertion, but matching every row
present at that instant by that query's windows instead of the sequence rule, and output
with sign -1 to exactly those queries (docs/cacq.md, "Windows and deletions").

**What a query sees.** Query q registered after arrival s_q and removed after arrival s'_q
outputs exactly what the single-query engine (``ContinuousQuery``) produces for q alone
on the arrivals (s_q, s'_q]: its results only combine rows with ``rid > s_q``. With
``start="window"`` it also sees the rows still held when it registers (see
``retain``), each until its own window has passed it (``Eddy._hold_for_window``), for
the rows arriving after it: a result of held rows alone is neither output nor, in
retract mode, retracted (``EddyQuery.since``, ``Eddy.held_only``).
"""

from __future__ import annotations

import bisect
import functools
import heapq
import math
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from adaptcq.engine.eddy_routes import nan_checks
from adaptcq.errors import OptionError, QueryError
from adaptcq.query.logical import ColumnRef, LogicalQuery, require_equi_joins
from adaptcq.stream.eventtime import to_units

ROLE_BITS = 8                 # a row's sequence number as role k: rid * 8 + k
MAX_ROLES = 1 << 3            # aliases of one source in one query (8 = 2**3 fits ROLE_BITS)
CAPACITY_DEFAULT = 1024       # query bits per role block (the paper's fixed-size bitmap)
START_MODES = ("now", "window")


class QueryFailed(Exception):
    """A query raised while a tuple was routed (a UDF); it is removed and reported."""


@dataclass
class EddyQuery:
    """One registered query: its bit, its aliases as (source, role), its windows."""

    handle: str
    bit: int
    query: LogicalQuery
    emit: Callable[[tuple], None]
    seq: int                                   # visible rows: rid > seq
    roles: tuple[tuple[str, int], ...]         # per alias (query.streams order)
    windows: tuple[tuple[str, float | int | None], ...]  # per alias, in engine units
    project: Callable = None                   # comps dict -> output values
    project_at: Callable = None                # the components, positionally (sorted vs)
    start: str = "now"
    # A result goes to the query only if a component arrived after ``since`` (its
    # registration): ``seq`` for start="now"; a start="window" query sees older rows but
    # never outputs (nor retracts) a result made of them alone.
    since: int = -1
    emitted: int = 0
    error: str | None = None

    @property
    def mask(self) -> int:
        return 1 << self.bit

    @property
    def vs(self) -> frozenset:
        return frozenset(self.roles)


@dataclass
class FilterOp:
    """A grouped filter or an opaque filter of one source, as the eddy routes to it."""

    id: int                  # global operator id (routing policies know operators by it)
    flag: int                # its bit in the source's operators list (done bits)
    impl: object             # GroupedFilter / OpaqueFilter (engine.grouped_filter)
    label: str
    slots: int = 0           # slots with an atom here
    weight: int = 1          # predicates it applies (its tickets per tuple, §4)


@dataclass
class Disjunction:
    """A multi-atom CNF clause of one slot (§3.2.7): decided when all its filters ran."""

    dbit: int      # its disjunct tag (set in ``passed`` by any true atom)
    slot: int      # the slot bit it belongs to
    ops: int       # flags of the filters holding its atoms


@dataclass
class SourceState:
    """Per source: its SteM, filters (operators list), slots and arrival counter."""

    name: str
    columns: tuple[str, ...]
    stem: object
    filters: dict[str, FilterOp] = field(default_factory=dict)   # column -> grouped filter
    opaque: FilterOp | None = None
    ops: list[FilterOp] = field(default_factory=list)             # the operators list
    disjunctions: list[Disjunction] = field(default_factory=list)
    dbits: int = 0                                                # disjunct tags in use
    slots: int = 0          # slot bits of alive queries over this source
    filtered: int = 0       # slots that have at least one selection clause
    passed: dict = field(default_factory=dict)      # rid -> slot mask that passed
    pos: dict = field(default_factory=dict)         # rid -> arrival count (count windows)
    count: int = 0          # arrivals so far (count windows count before selection)
    recent: deque = field(default_factory=deque)    # rids of the last arrivals (None: dropped)
    keep_rows: int = 0      # count retention: the largest [ROWS n]
    keep_time: float | None = None  # time retention: the largest [RANGE w]
    unbounded: bool = False
    roles: int = 1
    holds: dict = field(default_factory=dict)       # rid -> retention mechanisms holding it
    until: dict = field(default_factory=dict)       # rid -> end of its start="window" hold
    keep_all: bool = False  # build rows that pass no selection (retain=, start="window")
    ordered: list = field(default_factory=list)  # ops in this epoch's table order (cache)
    count_groups: list = field(default_factory=list)  # per role: [(n, queries)] [ROWS n]
    range_sizes: list = field(default_factory=list)   # per role: the [RANGE w] sizes
    range_seen: list = field(default_factory=list)    # [(w, query seq)], widest first


def _has_nan(key, at: tuple[int, ...], single: bool) -> bool:
    """Whether a probe key is NaN (``single``) or holds one at the positions ``at``."""
    if single:
        return key != key  # noqa: PLR0124 (NaN: the one value unequal to itself)
    return any(key[i] != key[i] for i in at)


@dataclass
class Group:
    """Queries that probe one SteM access with the same equalities: one index probe."""

    positions: tuple[int, ...]                  # index columns of the target source
    probe: tuple[tuple[tuple[str, int], int], ...]  # per column: (component, position)
    mask: int                                   # the queries of the group
    windows: list = field(default_factory=list)  # (kind, size, mask)
    index: dict | None = None
    nan: tuple[int, ...] = ()                   # probe elements that may be NaN (nan_checks)


@dataclass
class Target:
    """A SteM access in a virtual source's SteMs list: (source, role) to probe."""

    id: int
    source: str
    role: int
    needs: int                 # queries handed to this target's intermediates
    groups: list[Group]


@dataclass
class VirtualSource:
    """§3.3.2: a set of (source, role) with its query list, completion mask, SteMs list."""

    id: int
    key: frozenset
    queries: int
    complete: int
    targets: list[Target]
    nexts: dict = field(default_factory=dict)   # target id -> the virtual source it makes


class Eddy:
    """Shared state and routing of many queries (see the module docstring).

    ``schemas`` maps each source to its columns (rows are tuples in that order) and their
    kinds (``query.cql.KINDS``). ``policy`` is a routing policy (``adapt.routing``).
    ``time_unit`` is seconds per timestamp unit, as ``ContinuousQuery``'s.
    ``retain`` (seconds per source) keeps rows at least that long even when no query needs
    them, so that a query registered with ``start="window"`` finds them.
    """

    def __init__(self, schemas: Mapping[str, Mapping[str, str]], policy, mode: str = "append",
                 time_unit: float = 1.0, capacity: int = CAPACITY_DEFAULT,
                 retain: Mapping[str, float] | None = None, udfs: Mapping | None = None,
                 routing_epoch: int | None = None):
        from adaptcq.state.stem import SteM
        # (bool is an int to isinstance: True was taken as 1)
        if routing_epoch is not None and (not isinstance(routing_epoch, int)
                                          or isinstance(routing_epoch, bool)
                                          or routing_epoch < 1):
            raise OptionError(f"routing_epoch must be a positive number of arrivals or "
                              f"None (a decision per routing step), got {routing_epoch!r}")
        if mode not in ("append", "retract"):
            raise OptionError(f"unknown mode {mode!r}; choose append or retract")
        self.mode = mode
        self.policy = policy
        self.time_unit = time_unit
        self.capacity = capacity
        self.schemas = {s: dict(cols) for s, cols in schemas.items()}
        self.udfs = dict(udfs or {})
        self.sources: dict[str, SourceState] = {
            s: SourceState(s, tuple(cols), SteM(s, tuple(cols))) for s, cols in schemas.items()}
        self.retain = {}
        for s, w in (retain or {}).items():
            if s not in self.sources:
                raise OptionError(f"retain: unknown source {s!r} (sources: "
                                  f"{', '.join(self.sources)})")
            self.retain[s] = self._units(w)
        self.queries: dict[str, EddyQuery] = {}
        self.by_bit: dict[int, EddyQuery] = {}
        self.alive = 0
        self.free_bits: list[int] = []
        self.next_bit = 0
        self.op_keys: dict[tuple, int] = {}
        self.vsources: dict[frozenset, VirtualSource] = {}
        self.targets: dict[tuple[str, int], int] = {}   # (source, role) -> op id
        self.heap: list = []          # (time, eff, phase, kind, source, payload)
        self.rid = 0                  # arrivals so far (the global sequence number)
        self.now = -math.inf
        # The latest ``advance_to``: a registration's time, where a start="window" query
        # starts (``now`` is the last arrival's). Kept in checkpoints: a registration
        # after a restore may follow no advance_to of its own, and a start="window" query
        # would then schedule deletions already done (``_schedule_window_deletions``).
        self._advanced = -math.inf
        self.last_reg = -1            # the largest registration sequence of a live query
        self.failures: list[tuple[str, str]] = []   # (query handle, error) of failed queries
        self._counts = {"routings": 0, "deletions": 0}
        self._results_removed = 0       # result rows of queries no longer registered
        self.built = self.dropped = 0   # rows stored / dropped by every query's filters
        self.op_labels: dict[int, str] = {}
        # The update in progress, as lists mutated in place (compiled routes read them):
        # [source, role, deletion?, arrival rid] and [time, sequence] of the event the
        # windows are checked against.
        self._cur = self._cur_list = [None, 0, False, 0]
        self._event = self._ev = [-math.inf, -1]
        # Compiled routes (routing_epoch): per-operator tuples consumed / returned this
        # epoch, the table's orders, and the compiled functions.
        self.routing_epoch = routing_epoch
        self._n_in: list[int] = []
        self._n_out: list[int] = []
        self._orders: dict = {}
        self._routes: dict = {}
        self._epoch_left = routing_epoch or 0
        self._failed: list[tuple[str, str]] = []  # queries whose UDF raised, this arrival
        self._refresh()

    # ----- units ------------------------------------------------------------------------
    def _units(self, seconds):
        return to_units(seconds, self.time_unit)

    def _op_id(self, key: tuple, label: str) -> int:
        """The operator id of ``key`` (("GF", source, column), ("OF", source) or
        ("SteM", source, role)): stable for the engine's life, across (de)registrations
        and checkpoints, so routing statistics stay attached to their operator."""
        oid = self.op_keys.get(key)
        if oid is None:
            oid = self.op_keys[key] = len(self.op_keys)
        self.op_labels[oid] = label
        self.policy.add_op(oid)
        while len(self._n_in) <= oid:
            self._n_in.append(0)
            self._n_out.append(0)
        return oid

    # ----- registration (cacq.txt §3.2.1, §3.3.2) -------------------------------------------
    def add_query(self, handle: str, query: LogicalQuery, emit: Callable[[tuple], None],
                  start: str = "now", *, _bit: int | None = None, _seq: int | None = None,
                  _since: int | None = None) -> EddyQuery:
        """Register ``query`` under ``handle``; its results go to ``emit``. It sees arrivals
        after the current one (``start="now"``) or also the rows held now (``"window"``)."""
        if handle in self.queries:
            raise OptionError(f"a query is already registered as {handle!r}")
        require_equi_joins(query, "the eddy (CACQ)")
        if start not in START_MODES:
            raise OptionError(f"unknown start {start!r}; choose one of {', '.join(START_MODES)}")
        for s in query.streams:
            if s.source not in self.sources:
                raise QueryError(f"unknown source {s.source!r} (this engine's sources: "
                                 f"{', '.join(self.sources)})", query.sql, s.position)
        if _bit is None:
            bit = self.free_bits[0] if self.free_bits else self.next_bit
        else:
            bit = _bit
        if bit >= self.capacity:
            raise OptionError(f"more than {self.capacity} queries at once; raise capacity=")
        roles, seen = [], {}
        for s in query.streams:
            k = seen.get(s.source, 0)
            if k >= MAX_ROLES:
                raise QueryError(f"more than {MAX_ROLES} aliases of source {s.source!r}",
                                 query.sql, s.position)
            seen[s.source] = k + 1
            roles.append((s.source, k))
        windows = tuple((s.window.kind, None if s.window.size is None
                         else (s.window.in_units(self.time_unit) if s.window.kind == "range"
                               else int(s.window.size)))
                        for s in query.streams)
        seq = _seq if _seq is not None else (self.rid if start == "now" else -1)
        since = _since if _since is not None else (self.rid if _seq is None else seq)
        q = EddyQuery(handle, bit, query, emit, seq, tuple(roles), windows, start=start,
                      since=since)
        q.project = self._projection(q)
        from adaptcq.query.udf import calls_udf, default_registry, guarded_output
        if calls_udf(query.outputs, self.udfs or default_registry()):
            q.emit, q.project, q.project_at = guarded_output(
                functools.partial(self._output_error, handle), q.emit, q.project, q.project_at)
        installed = []
        try:
            for a, (src, k) in zip(query.aliases, roles, strict=True):
                self._install_selection(q, a, src, k)
                installed.append(src)
        except Exception:
            for src in installed:
                self._uninstall_selection(q, src)
            raise
        if bit in self.free_bits:
            self.free_bits.remove(bit)
        while self.next_bit <= bit:
            if self.next_bit != bit:
                bisect.insort(self.free_bits, self.next_bit)
            self.next_bit += 1
        self.queries[handle] = q
        self.by_bit[bit] = q
        self.alive |= q.mask
        self.last_reg = max(self.last_reg, q.seq)
        self._refresh()
        if start == "window" and _seq is None:
            error = self._admit_window(q)
            if error is not None:
                self.remove_query(handle, error=error)
        return q

    def remove_query(self, handle: str, error: str | None = None) -> EddyQuery:
        """Deregister: the query gets nothing more; its bit is free for the next query."""
        q = self.queries.pop(handle, None)
        if q is None:
            raise OptionError(f"no query is registered as {handle!r} (registered: "
                              f"{', '.join(self.queries) or 'none'})")
        del self.by_bit[q.bit]
        self._results_removed += q.emitted
        self.alive &= ~q.mask
        for src in {s for s, _ in q.roles}:
            self._uninstall_selection(q, src)
        bisect.insort(self.free_bits, q.bit)
        q.error = error
        if error is not None:
            self.failures.append((handle, error))
        self.last_reg = max((x.seq for x in self.queries.values()), default=-1)
        self._refresh()
        return q

    def _slot(self, q: EddyQuery, role: int) -> int:
        return 1 << (q.bit + role * self.capacity)

    def _install_selection(self, q: EddyQuery, alias: str, src: str, role: int) -> None:
        """Fold the alias's selection into the source's filters (§3.2.1, §3.2.6–3.2.7)."""
        st = self.sources[src]
        slot = self._slot(q, role)
        st.slots |= slot
        expr = q.query.selections.get(alias)
        if expr is None:
            return
        from adaptcq.engine.grouped_filter import GroupedFilter, OpaqueFilter
        from adaptcq.query.cnf import classify, to_cnf
        from adaptcq.query.expr import compile_predicate
        st.filtered |= slot
        types = q.query.types
        cols = st.columns
        for clause in to_cnf(expr, q.query.sql):
            atoms = [classify(a, alias, cols, types) for a in clause]
            flags = 0
            dbit = None
            if len(atoms) > 1:
                # Disjunct tags live above every slot tag: a filter's remove(tag) drops
                # both kinds, so the two tag spaces must not meet.
                local = (~st.dbits & (st.dbits + 1)).bit_length() - 1   # lowest free
                st.dbits |= 1 << local
                dbit = self.capacity * MAX_ROLES + local
            tag = dbit if dbit is not None else slot.bit_length() - 1
            for atom in atoms:
                if atom.kind == "simple":
                    op = st.filters.get(atom.column)
                    if op is None:
                        impl = GroupedFilter(src, atom.column, cols.index(atom.column))
                        op = FilterOp(self._op_id(("GF", src, atom.column),
                                                 f"GF {src}.{atom.column}"), 0, impl,
                                      f"{src}.{atom.column}")
                        st.filters[atom.column] = op
                        self._add_filter_op(st, op)
                    op.impl.add(atom.op, atom.constant, tag, disjunct=dbit is not None)
                else:
                    op = st.opaque
                    if op is None:
                        impl = OpaqueFilter()
                        op = FilterOp(self._op_id(("OF", src), f"F {src} (opaque)"), 0, impl,
                                      f"{src} (opaque)")
                        st.opaque = op
                        self._add_filter_op(st, op)
                    fn = compile_predicate(atom.expr, cols, alias, types, **self._udf_kw())
                    op.impl.add(fn, tag, disjunct=dbit is not None,
                                label=f"{q.handle}: {atom.expr.sql()}")
                op.slots |= slot
                op.weight = max(1, len(op.impl))
                flags |= op.flag
                st.ordered = []
            if dbit is not None:
                st.disjunctions.append(Disjunction(dbit, slot, flags))

    def _udf_kw(self) -> dict:
        return {"udfs": self.udfs} if self.udfs else {}

    def _add_filter_op(self, st: SourceState, op: FilterOp) -> None:
        used = 0
        for o in st.ops:
            used |= o.flag
        j = 0
        while used >> j & 1:
            j += 1
        op.flag = 1 << j
        st.ops.append(op)

    def _uninstall_selection(self, q: EddyQuery, src: str) -> None:
        st = self.sources[src]
        for role in range(MAX_ROLES):
            slot = self._slot(q, role)
            if not st.slots & slot:
                continue
            st.slots &= ~slot
            st.filtered &= ~slot
            tag = slot.bit_length() - 1
            for d in [d for d in st.disjunctions if d.slot == slot]:
                st.disjunctions.remove(d)
                st.dbits &= ~(1 << (d.dbit - self.capacity * MAX_ROLES))
                for op in st.ops:
                    op.impl.remove(d.dbit, disjunct=True)
            st.ordered = []
            for op in list(st.ops):
                op.impl.remove(tag, disjunct=False)
                op.slots &= ~slot
                op.weight = max(1, len(op.impl))
                if not len(op.impl):
                    # An empty filter leaves the operators list (its flag is reused).
                    st.ops.remove(op)
                    if op is st.opaque:
                        st.opaque = None
                    else:
                        st.filters.pop(next(c for c, o in st.filters.items() if o is op))
                    self.policy.remove_op(op.id)
                    self._n_in[op.id] = self._n_out[op.id] = 0  # nothing to report

    def _projection(self, q: EddyQuery) -> Callable:
        """comps dict {(source, role): row} -> the query's output values."""
        from adaptcq.query.expr import compile_projection, eval_namespace
        names = {}
        role_of = dict(zip(q.query.aliases, q.roles, strict=True))

        def resolve(ref: ColumnRef) -> str:
            src, k = role_of[ref.stream]
            var = names.setdefault((src, k), f"K{len(names)}")
            return f"c[{var}][{self.sources[src].columns.index(ref.column)}]"
        from adaptcq.query.udf import default_registry
        udfs = self.udfs or default_registry()
        body = compile_projection(q.query.outputs, resolve, q.query.types, udfs=udfs)
        ns = {**eval_namespace(udfs), **{v: key for key, v in names.items()}}
        # The same projection over the components as positional arguments, in the
        # sorted order of the query's (source, role) pairs (compiled routes call it).
        order = sorted(q.vs)
        pos = {key: f"a{i}" for i, key in enumerate(order)}
        body_at = body
        for key, var in names.items():
            body_at = body_at.replace(f"c[{var}]", pos[key])
        q.project_at = eval(f"lambda {', '.join(pos.values())}: {body_at}", ns)
        return eval(f"lambda c: {body}", ns)

    def _admit_window(self, q: EddyQuery) -> str | None:
        """``start="window"``: evaluate the new query's selections on the rows held now,
        so they count for it (registration costs one pass over the held rows of its
        sources). A selection raising on a held row (a UDF) fails the query alone, as on
        an arrival (docs/cacq.md, "Errors"): the error is returned, before anything is
        held or scheduled for the query."""
        from adaptcq.query.expr import compile_predicate
        for a, (src, k) in zip(q.query.aliases, q.roles, strict=True):
            st = self.sources[src]
            slot = self._slot(q, k)
            sel = q.query.selections.get(a)
            fn = compile_predicate(sel, st.columns, a, q.query.types, **self._udf_kw())
            passed = st.passed
            for rid, row in st.stem.rows.items():
                try:
                    ok = fn(row)
                except Exception as e:  # noqa: BLE001 - a UDF may raise anything
                    return (f"{q.handle}: {sel.sql()} raised {type(e).__name__}: {e} "
                            f"on a row of {src} ({st.stem.times[rid] * self.time_unit:g} s "
                            f"of event time) held when it registered with start='window'")
                passed[rid] = passed[rid] | slot if ok else passed[rid] & ~slot
        for src, k in q.roles:
            self._hold_for_window(q, src, k)
            if self.mode == "retract":
                self._schedule_window_deletions(q, src, k)
        return None

    # ----- derived structures -------------------------------------------------------------
    def _refresh(self) -> None:
        """Recompute retention, roles and virtual sources after the query set changed
        (virtual sources are rebuilt lazily, on first use)."""
        was_unbounded = {n for n, st in self.sources.items() if st.unbounded}
        for st in self.sources.values():
            st.keep_rows, st.keep_time, st.unbounded, st.roles = 0, None, False, 1
            st.range_seen = []
            w = self.retain.get(st.name)
            if w is not None:
                st.keep_time = w
        for q in self.queries.values():
            for (src, k), (kind, size) in zip(q.roles, q.windows, strict=True):
                st = self.sources[src]
                st.roles = max(st.roles, k + 1)
                if kind == "unbounded":
                    st.unbounded = True
                elif kind == "rows":
                    st.keep_rows = max(st.keep_rows, size)
                else:
                    st.keep_time = size if st.keep_time is None else max(st.keep_time, size)
                    # (for ``_needed``: a row is needed by the windows that may see it)
                    st.range_seen.append((size, q.seq))
        now = self._done_until()
        for st in self.sources.values():
            st.range_seen.sort(reverse=True)   # widest first
            if st.name in was_unbounded and not st.unbounded:
                # First: its rows were held by none while it was read unbounded.
                self._bound_rows(st)
            # The widest [ROWS n] shrank (or went with its last query): its count hold
            # lets go now of the rows beyond the new one (``process`` only trims while
            # some query has a count window, and at the source's next arrival).
            recent = st.recent
            while len(recent) > st.keep_rows:
                old = recent.popleft()
                if old is not None:
                    self._release(st, old, 2, now, due=False)
        self.vsources.clear()
        self._visible_cache = {}
        self._range_masks: dict[tuple, int] = {}
        self._routes = {}
        self._singles: dict[tuple[str, int], VirtualSource] = {}
        window_queries = any(q.start == "window" for q in self.queries.values())
        # The queries that see rows older than their registration (start="window").
        self._seers = [q for q in self.queries.values() if q.since > q.seq]
        self._seers_mask = sum(q.mask for q in self._seers)
        for st in self.sources.values():
            # Rows are kept for a query registered later with start="window" only when
            # asked to (retain=, or such a query is running): that is what it costs.
            st.keep_all = st.name in self.retain or (window_queries and bool(st.slots))
            st.count_groups = [[(n, m) for kind, n, m in self._alias_windows(st.name, k)
                                if kind == "rows"] for k in range(st.roles)]
            st.range_sizes = [sorted({size for kind, size, _ in self._alias_windows(st.name, k)
                                      if kind == "range"}) for k in range(st.roles)]

    def _bound_rows(self, st: SourceState) -> None:
        """The last query reading ``st`` unbounded left: its rows get the retention the
        remaining windows (and ``retain``) ask for, from now (``_needed``); the others
        leave. Holds recorded before are dropped: while the source was unbounded no hold
        let go (``_release``), so they no longer match the pending events; a stale event
        firing later only makes ``_release`` check the row's need again."""
        now = self._done_until()
        st.holds.clear()
        st.until.clear()   # (``_needed`` covers the running window queries' windows)
        for rid in list(st.stem.rows):
            if not self._needed(st, rid, now, due=False):
                self._drop(st, rid)

    def vsource(self, key: frozenset) -> VirtualSource:
        """The virtual source of ``key``, created on first use (§3.3.2)."""
        vs = self.vsources.get(key)
        if vs is not None:
            return vs
        queries = complete = 0
        per_target: dict[tuple[str, int], list[EddyQuery]] = {}
        for q in self.queries.values():
            qvs = q.vs
            if key <= qvs:
                queries |= q.mask
                if key == qvs:
                    complete |= q.mask
                for t in qvs - key:
                    per_target.setdefault(t, []).append(q)
        targets = []
        for (src, k) in sorted(per_target):
            groups: dict[tuple, Group] = {}
            needs = 0
            for q in per_target[(src, k)]:
                probe = self._equalities(q, key, (src, k))
                if not probe:
                    continue   # not adjacent yet: the query reaches (src, k) later
                positions = tuple(p for p, _ in probe)
                g = groups.get((positions, tuple(c for _, c in probe)))
                if g is None:
                    g = groups[(positions, tuple(c for _, c in probe))] = Group(
                        positions, tuple(c for _, c in probe), 0)
                g.mask |= q.mask
                needs |= q.mask
                kind, size = q.windows[q.roles.index((src, k))]
                for w in g.windows:
                    if w[0] == kind and w[1] == size:
                        w[2] |= q.mask
                        break
                else:
                    g.windows.append([kind, size, q.mask])
            if not needs:
                continue
            tid = self.targets.get((src, k))
            if tid is None:
                tid = self.targets[(src, k)] = self._op_id(
                    ("SteM", src, k), f"SteM {src}" + (f" (role {k})" if k else ""))
            for g in groups.values():
                g.index = self.sources[src].stem.index(g.positions)
                g.nan = nan_checks(self, g.probe)
                g.windows = [tuple(w) for w in g.windows]
            targets.append(Target(tid, src, k, needs, list(groups.values())))
        vs = VirtualSource(len(self.vsources), key, queries, complete, targets)
        self.vsources[key] = vs
        return vs

    def _equalities(self, q: EddyQuery, key: frozenset, target: tuple[str, int]
                    ) -> tuple[tuple[int, tuple[tuple[str, int], int]], ...]:
        """q's equalities between the components ``key`` and ``target``: per column of the
        target in an attribute class that ``key`` also has, (its position in the source's
        rows, (component, position)) — the probe of engine.rules.probe_plan, per query."""
        query = q.query
        role_of = dict(zip(query.aliases, q.roles, strict=True))
        alias_of = {v: a for a, v in role_of.items()}
        t_alias = alias_of[target]
        t_cols = self.sources[target[0]].columns
        out = {}
        for cls in query.classes:
            mine = [c.column for c in cls if c.stream == t_alias]
            theirs = sorted((role_of[c.stream], c.column) for c in cls
                            if role_of[c.stream] in key)
            if not mine or not theirs:
                continue
            comp, col = theirs[0]
            for m in mine:
                out[t_cols.index(m)] = (comp, self.sources[comp[0]].columns.index(col))
        return tuple(sorted(out.items()))

    @property
    def counts(self) -> dict[str, int]:
        """Arrivals, rows stored and dropped, result rows (all queries), routing steps
        (filter and SteM visits), deletion tuples (retract)."""
        return {"arrivals": self.rid, "built": self.built, "dropped": self.dropped,
                "results": self._results_removed + sum(q.emitted
                                                       for q in self.queries.values()),
                **self._counts}

    # ----- visibility ---------------------------------------------------------------------
    def visible(self, rid: int) -> int:
        """Queries that may see row ``rid``: alive ones registered before it arrived."""
        if rid > self.last_reg:
            return self.alive
        m = 0
        for q in self.queries.values():
            if q.seq < rid:
                m |= q.mask
        return m

    def held_only(self, hi: int) -> int:
        """The start="window" queries for which a result whose newest component has
        sequence number ``hi`` is made of rows held when they registered: never output to
        them, so a deletion does not retract it (docs/cacq.md, "What a query sees")."""
        rid = hi // ROLE_BITS
        m = 0
        for q in self._seers:
            if q.since >= rid:
                m |= q.mask
        return m

    # ----- the update loop ----------------------------------------------------------------
    def process(self, source: str, ts, row: tuple) -> None:
        """One arrival: the deletions due before it, its filters, its build into the SteM,
        then, per role, its count-window deletions (retract) and its routing (§3.3.1)."""
        heap = self.heap
        while heap and heap[0][0] < ts:
            self._due(heapq.heappop(heap))
        self.now = ts
        self.rid = rid = self.rid + 1
        st = self.sources[source]
        st.count += 1
        if st.keep_rows:
            st.recent.append(None)
        passed = self._filter(st, row) if st.filtered else st.slots
        if passed or st.keep_all:
            self._build(st, rid, ts, row, passed)
        else:
            self.dropped += 1
        alive = self.alive
        cur, ev = self._cur, self._ev
        cur[3] = rid
        for k in range(st.roles):
            if st.count_groups[k] and self.mode == "retract":
                cur[0], cur[1], cur[2] = source, k, True
                self._count_deletions(st, k, ts)
                cur[2] = False
            qmask = (passed >> (k * self.capacity)) & alive
            if not qmask:
                continue
            cur[0], cur[1], cur[2] = source, k, False
            ev[0], ev[1] = ts, -1
            vs = self._singles.get((source, k)) or self._single(source, k)
            qmask &= vs.queries
            if not qmask:
                continue
            if self.routing_epoch:
                fn = self._routes.get((source, k, False)) or self._route_fn(source, k, False)
                fn(row, rid * ROLE_BITS + k, qmask, 1, ts)
            else:
                self._route(vs, {(source, k): row}, rid * ROLE_BITS + k, qmask, 1, ts)
        cur[0] = None
        if st.keep_rows:
            recent = st.recent
            while len(recent) > st.keep_rows:
                old = recent.popleft()
                if old is not None:
                    self._release(st, old, 2, ts, due=False)
        if self._failed:
            self._remove_failed()
        if self.routing_epoch:
            self._epoch_left -= 1
            if self._epoch_left <= 0:
                self._new_epoch()

    def _single(self, source: str, k: int) -> VirtualSource:
        vs = self._singles[(source, k)] = self.vsource(frozenset(((source, k),)))
        return vs

    def _done_until(self):
        """The event time deletions are done up to: the latest arrival's or the latest
        ``advance_to``'s, whichever is later."""
        return max(self.now, self._advanced)

    def advance_to(self, now) -> None:
        """Process every deletion due before ``now`` (the end of the input, a watermark)."""
        self._advanced = max(self._advanced, now)
        heap = self.heap
        while heap and heap[0][0] < now:
            self._due(heapq.heappop(heap))

    def _build(self, st: SourceState, rid: int, ts, row: tuple, passed: int) -> None:
        """Insert the singleton into its SteM (before it probes any, §3.3.1) and schedule
        its retention and, in retract mode, its per-query deletions.

        Retention: a time hold (a heap entry) and/or a count hold (``recent``); a row held
        by both has an entry in ``holds`` and leaves when both let go. In retract mode the
        deletion event of the widest window also lets go of the time hold when it is the
        retention (one heap entry instead of two)."""
        st.stem.insert(rid, row, ts)
        st.passed[rid] = passed
        # Its position among the source's arrivals: a [ROWS n] query registered later with
        # start="window" places the held rows in its window by it (``_hold_for_window``).
        st.pos[rid] = st.count
        self.built += 1
        keep_time = None if st.unbounded else st.keep_time
        if st.keep_rows:
            st.recent[-1] = rid
            if keep_time is not None:
                st.holds[rid] = 3
        heap = self.heap
        if self.mode == "retract":
            last = st.roles - 1
            for k in range(st.roles):
                for size in st.range_sizes[k]:
                    release = k == last and size == keep_time
                    if release:
                        keep_time = None   # this event is the retention too
                    heapq.heappush(heap, (ts + size, rid * ROLE_BITS + k, 0, st.name,
                                          (rid, k, size, release)))
        if keep_time is not None:
            heapq.heappush(heap, (ts + keep_time, rid * ROLE_BITS + ROLE_BITS - 1, 1,
                                  st.name, rid))

    def _alias_windows(self, src: str, k: int) -> list[tuple[str, object, int]]:
        """(kind, size, queries) of the live queries' windows on alias (src, k)."""
        cache = self._visible_cache
        got = cache.get((src, k))
        if got is None:
            by: dict[tuple, int] = {}
            for q in self.queries.values():
                for role, w in zip(q.roles, q.windows, strict=True):
                    if role == (src, k):
                        by[w] = by.get(w, 0) | q.mask
            got = cache[(src, k)] = [(kind, size, m) for (kind, size), m in by.items()]
        return got

    def _schedule_window_deletions(self, q: EddyQuery, src: str, k: int) -> None:
        """Retract mode, ``start="window"``: deletions of the held rows for the new query's
        window on (src, k), for the rows that have none pending (one pass over the pending
        events). A row built while some query had that window has one; a row built before
        (held for ``retain`` or for another window) has none, even when a query registered
        since has the window. A row whose window ended before the registration is skipped:
        it joins no later arrival, so there is nothing of the query's to retract; and a
        deletion of it would go again to the queries with that window, theirs done."""
        kind, size = q.windows[q.roles.index((src, k))]
        if kind != "range":
            return
        pending = {p[0] for _, _, phase, s, p in self.heap
                   if phase == 0 and s == src and p[1] == k and p[2] == size}
        st = self.sources[src]
        now = self._done_until()
        for rid in st.stem.rows:
            end = st.stem.times[rid] + size
            if rid not in pending and end >= now:
                heapq.heappush(self.heap, (end, rid * ROLE_BITS + k, 0, src,
                                           (rid, k, size, False)))  # (not the retention)

    def _hold_for_window(self, q: EddyQuery, src: str, k: int) -> None:
        """``start="window"``: the held rows the new query sees on (src, k) stay until its
        window has passed them, whatever kept them so far (a running query's shorter
        window, a shorter ``retain``): leaving at their old time, they would take the
        retraction of the query's results with them, and their matches with later
        arrivals. [RANGE w]: a hold of its own (flag 4) until the row's time + w, the
        longest of the window queries seeing it (``until``; a heap entry of phase 2);
        [ROWS n]: the count hold reaches back over the source's last n arrivals, by the
        rows' positions. A row already gone stays gone; memory stays bounded by the
        running queries' windows. While a query reads the source unbounded no row leaves,
        and ``_bound_rows`` then gives every row the retention of the windows left."""
        kind, size = q.windows[q.roles.index((src, k))]
        st = self.sources[src]
        holds, recent = st.holds, st.recent
        if kind == "range" and not st.unbounded:
            slot = self._slot(q, k)
            counted = set(recent)
            now = self._done_until()
            for rid, t in st.stem.times.items():
                end = t + size
                if st.passed[rid] & slot and end >= now and end > st.until.get(rid, -math.inf):
                    # (no entry in ``holds``: its one hold is the count's if in ``recent``)
                    holds[rid] = (holds.get(rid) or (2 if rid in counted else 1)) | 4
                    st.until[rid] = end
                    heapq.heappush(self.heap, (end, rid * ROLE_BITS + ROLE_BITS - 1, 2,
                                               src, rid))
        elif kind == "rows":
            # ``recent`` is the source's last arrivals (keep_rows, just raised for this
            # query, or fewer): prepend the older ones, the rows still held by position.
            at = {p: rid for rid, p in st.pos.items()}
            first = st.count - len(recent)      # the position just before recent[0]
            while len(recent) < st.keep_rows and first > 0:
                rid = at.get(first)
                recent.appendleft(rid)
                if rid is not None:
                    holds[rid] = (holds.get(rid) or 1) | 2
                first -= 1

    def _release(self, st: SourceState, rid: int, flag: int, at, due: bool = True) -> None:
        """A retention hold (1: time, 2: count, 4: for a start="window" query) lets go of
        row ``rid`` at event time ``at`` (``due``: its heap entry of time ``at`` fired;
        otherwise an arrival at ``at`` or a change of the query set, after which a row
        whose window ends at ``at`` is still needed). While a query reads the source
        unbounded, no row leaves.

        The holds were set under the query set of the row's arrival, which may have
        changed since (a query read the source unbounded and left, a wider window came):
        so a row whose last hold lets go leaves only if no running query's window, nor
        ``retain``, still needs it (``_needed``, which then gives it a hold again)."""
        if st.unbounded or rid not in st.passed:
            # Held by an unbounded query; or already gone (a hold scheduled under an
            # earlier query set: a row is only needed by queries registered before it,
            # and the hold covering them all may already have let it go).
            return
        holds = st.holds
        if holds:
            h = holds.get(rid)
            if h is not None:
                h &= ~flag
                if h:
                    holds[rid] = h
                    return
                del holds[rid]
        if not self._needed(st, rid, at, due):
            self._drop(st, rid)

    def _needed(self, st: SourceState, rid: int, at, due: bool) -> bool:
        """Whether row ``rid`` must stay after event time ``at`` (``due`` as in
        ``_release``) for the running queries: among the last arrivals of the widest
        [ROWS n]; within ``retain`` or a [RANGE w] window of a query that may see it
        (registered before it, or with start="window"); or held for a start="window"
        query (``until``). If so, the hold that will let go of it is recorded (and a
        time hold scheduled), so that ``_release`` asks again then (cacq.txt §3.3.3: a
        shared SteM keeps a row for the widest window over it)."""
        holds = st.holds
        pos = st.pos.get(rid)
        if (st.count - pos < len(st.recent)) if pos is not None else rid in st.recent:
            holds[rid] = holds.get(rid, 0) | 2     # its count trim comes back here
            return True
        u = st.until.get(rid)
        if u is not None and (u > at or not due and u == at):
            holds[rid] = holds.get(rid, 0) | 4     # its phase-2 entry is pending
            return True
        t = st.stem.times[rid]
        wide = st.keep_time
        if wide is None or t + wide < at or due and t + wide == at:
            return False     # (the common case: its one hold was the widest window's)
        wide = self.retain.get(st.name, -math.inf)
        for size, seq in st.range_seen:
            if size <= wide:
                break
            if seq < rid:
                wide = size
                break
        end = t + wide
        if end > at or not due and end == at:
            holds[rid] = holds.get(rid, 0) | 1
            heapq.heappush(self.heap, (end, rid * ROLE_BITS + ROLE_BITS - 1, 1, st.name, rid))
            return True
        return False

    def _drop(self, st: SourceState, rid: int) -> None:
        """Row ``rid`` leaves its SteM."""
        st.stem.delete(rid)
        del st.passed[rid]
        st.holds.pop(rid, None)
        st.until.pop(rid, None)
        if st.pos:
            st.pos.pop(rid, None)

    def _due(self, entry: tuple) -> None:
        """A heap entry: a retention expiry (phase 1) or a retract deletion (phase 0)."""
        t, eff, phase, src, payload = entry
        st = self.sources[src]
        if phase == 1:
            self._release(st, payload, 1, t)
            return
        if phase == 2:
            # A start="window" hold ends, unless a later window query extended it since.
            if st.until.get(payload) == t:
                del st.until[payload]
                self._release(st, payload, 4, t)
            return
        rid, k, size, release = payload
        row = st.stem.rows.get(rid)
        if row is None:
            return
        qmask = self._range_masks.get((src, k, size))
        if qmask is None:
            qmask = 0
            for kind, sz, m in self._alias_windows(src, k):
                if kind == "range" and sz == size:
                    qmask = m
            self._range_masks[(src, k, size)] = qmask
        if qmask:
            qmask &= st.passed[rid] >> (k * self.capacity)
            if rid <= self.last_reg:
                qmask &= self.visible(rid)
        if qmask:
            cur, ev = self._cur, self._ev
            cur[0], cur[1], cur[2], cur[3] = None, 0, True, self.rid
            ev[0], ev[1] = t, eff
            self._delete(src, k, rid, row, qmask, t)
            cur[2] = False
        if release:
            self._release(st, rid, 1, t)

    def _count_deletions(self, st: SourceState, k: int, ts) -> None:
        """Retract: the arrival pushes row ``count - n`` out of each [ROWS n] window on
        alias (source, k), just before its own insertion as role k."""
        recent = st.recent
        for n, m in st.count_groups[k]:
            if len(recent) <= n:
                continue
            rid = recent[-n - 1]
            if rid is None:
                continue
            row = st.stem.rows.get(rid)
            if row is None:
                continue
            qmask = m & self.visible(rid) & (st.passed.get(rid, 0) >> (k * self.capacity))
            if qmask:
                ev = self._ev
                ev[0], ev[1] = ts, -1
                self._delete(st.name, k, rid, row, qmask, ts)

    def _delete(self, src: str, k: int, rid: int, row: tuple, qmask: int, ts) -> None:
        self._counts["deletions"] += 1
        if self.routing_epoch:
            fn = self._routes.get((src, k, True))
            if fn is not None:   # the fast path: no virtual source lookup
                fn(row, rid * ROLE_BITS + k, qmask & self._singles[(src, k)].queries, -1, ts)
                return
        vs = self._singles.get((src, k)) or self._single(src, k)
        qmask &= vs.queries
        if not qmask:
            return
        if self.routing_epoch:
            fn = self._routes.get((src, k, True)) or self._route_fn(src, k, True)
            fn(row, rid * ROLE_BITS + k, qmask, -1, ts)
        else:
            self._route(vs, {(src, k): row}, rid * ROLE_BITS + k, qmask, -1, ts)

    # ----- compiled routes (routing epochs) ---------------------------------------------------
    def _route_fn(self, src: str, k: int, deletion: bool):
        """The compiled route of singletons of (src, k) for this epoch's table
        (engine.eddy_routes); a query set too wide to inline is interpreted."""
        from adaptcq.engine.codegen import exec_source
        from adaptcq.engine.eddy_routes import TooLarge, route_source
        try:
            source, ns = route_source(self, (src, k), deletion, self._orders)
        except TooLarge:
            vs = self._single(src, k)

            def fn(row, hi, qmask, sign, ts):
                self._route(vs, {(src, k): row}, hi, qmask, sign, ts)
        else:
            label = f"<eddy route {src}#{k}{' deletion' if deletion else ''}>"
            fn = exec_source(label, source, ns)[0]["route"]
            fn.source = source
        self._routes[(src, k, deletion)] = fn
        return fn

    def route_sources(self) -> dict[str, str]:
        """The generated source of every compiled route in use (``explain --code``)."""
        return {f"{src}#{k}{' (deletion)' if d else ''}": getattr(fn, "source", "interpreted")
                for (src, k, d), fn in sorted(self._routes.items(),
                                              key=lambda x: (x[0][0], x[0][1], x[0][2]))}

    def _new_epoch(self) -> None:
        """End of a routing epoch: tell the policy what every operator consumed and
        returned (summed over the epoch), and take a fresh routing table; routes are
        recompiled only when an order changed."""
        self._epoch_left = self.routing_epoch
        policy, n_in, n_out = self.policy, self._n_in, self._n_out
        totals = {}
        for op, c in enumerate(n_in):
            if c:
                totals[op] = (c, n_out[op], 1, c + n_out[op])
                n_in[op] = n_out[op] = 0
        if totals:
            policy.account(totals)
        groups = {vs.id: [t.id for t in vs.targets] for vs in self.vsources.values()
                  if len(vs.targets) > 1}
        for st in self.sources.values():
            if len(st.ops) > 1:
                groups[("F", st.name)] = [op.id for op in st.ops]
        table = policy.route_table(groups) if groups else {}
        orders = {key: tuple(table[key]) for key in groups}
        if orders != self._orders:
            changed = {key for key in orders if orders[key] != self._orders.get(key)}
            self._orders = orders
            if any(not isinstance(key, tuple) for key in changed):
                self._routes.clear()
            for st in self.sources.values():
                st.ordered = []

    # ----- filters (§3.2.6–3.2.7) --------------------------------------------------------------
    def _filter(self, st: SourceState, row: tuple) -> int:
        """Route a singleton through its source's filters, in the policy's order, until
        every slot is decided; returns the slots it passed (its pass mask)."""
        live = st.slots
        pending = st.filtered & live
        if not pending:
            return live
        from adaptcq.engine.grouped_filter import FilterError
        policy = self.policy
        failed = dpass = done = 0
        routings = 0
        if self.routing_epoch:
            # This epoch's table order, in one pass: a filter is visited when it holds a
            # predicate of a slot still undecided; the policy learns at the epoch's end.
            n_in, n_out = self._n_in, self._n_out
            disjunctions = st.disjunctions
            for op in st.ordered or self._order_filters(st):
                applied = op.slots & pending & ~failed
                if not applied:
                    continue
                routings += 1
                try:
                    f, p = op.impl.probe_row(row)
                except FilterError:
                    f, p = self._isolate(st, op, row)
                failed |= f
                done |= op.flag
                if disjunctions:
                    dpass |= p
                    for d in disjunctions:
                        if not d.ops & ~done and not dpass >> d.dbit & 1:
                            failed |= d.slot
                n_in[op.id] += applied.bit_count()
                n_out[op.id] += (applied & ~failed).bit_count()
                if not pending & ~failed:
                    break
            self._counts["routings"] += routings
            return live & ~failed
        ops = st.ops
        while True:
            undecided = pending & ~failed
            if not undecided:
                break
            ready = [op for op in ops if not done & op.flag and op.slots & undecided]
            if not ready:
                break
            routings += 1
            if len(ready) == 1:
                op = ready[0]
            else:
                oid = policy.choose([o.id for o in ready])
                op = next(o for o in ready if o.id == oid)
            # §4's tickets: the filter gains one per predicate it applies to the tuple
            # and gives one back per predicate the tuple still passes, so it earns one per
            # predicate it failed (a filter of many queries earns even when the tuple
            # lives on for other queries; docs/cacq-routing.md).
            applied = op.slots & undecided
            policy.routed(op.id, applied.bit_count())
            try:
                f, p = op.impl.probe_row(row)
            except FilterError:
                f, p = self._isolate(st, op, row)
            failed |= f
            dpass |= p
            done |= op.flag
            for d in st.disjunctions:
                if not d.ops & ~done and not dpass >> d.dbit & 1:
                    failed |= d.slot
            kept = (applied & ~failed).bit_count()
            policy.returned(op.id, 1 if kept else 0, kept, 1)
        self._counts["routings"] += routings
        return live & ~failed

    def _order_filters(self, st: SourceState) -> list:
        """The source's filters in this epoch's table order (unlisted ones last)."""
        rank = {op: i for i, op in enumerate(self._orders.get(("F", st.name), ()))}
        st.ordered = sorted(st.ops, key=lambda o: (rank.get(o.id, len(rank)), o.id))
        return st.ordered

    def _isolate(self, st: SourceState, op: FilterOp, row: tuple) -> tuple[int, int]:
        """A predicate of ``op`` raised: evaluate each predicate on its own, so that only
        the queries whose UDF raised fail (and are removed after this arrival)."""
        f, p, errors = op.impl.probe_row_isolated(row)
        for e in errors:
            f |= self._filter_error(st, e)
        return f, p

    def _filter_error(self, st: SourceState, e) -> int:
        """A UDF raised: the query owning the atom fails (removed after this arrival, with
        the error recorded); for this row its slot fails, so nothing is half-output."""
        slot = None
        if e.disjunct:
            for d in st.disjunctions:
                if d.dbit == e.bit:
                    slot = d.slot
        if slot is None:
            slot = 1 << e.bit
        qbit = (slot.bit_length() - 1) % self.capacity
        q = self.by_bit.get(qbit)
        if q is not None and q.handle not in [h for h, _ in self._failed]:
            self._failed = [*self._failed, (q.handle, f"{e}")]
        return slot | sum(self._slot(q, r) for r in range(MAX_ROLES)) if q else slot

    def _remove_failed(self) -> None:
        failed, self._failed = self._failed, []
        for handle, err in failed:
            if handle in self.queries:
                self.remove_query(handle, error=err)

    def _output_error(self, handle: str, message: str) -> None:
        """A UDF in the query's SELECT list raised: removed after this arrival, as for one
        in its WHERE (``_filter_error``)."""
        if handle not in [h for h, _ in self._failed]:
            self._failed = [*self._failed, (handle, message)]

    # ----- routing (§3.3.2) ---------------------------------------------------------------------
    def _route(self, vs: VirtualSource, comps: dict, hi: int, qmask: int, sign: int, ts) -> None:
        """Route a tuple and every intermediate tuple it produces to completion."""
        policy = self.policy
        probe = self._probe
        by_bit = self.by_bit
        routings = 0
        stack = [(vs, comps, hi, qmask)]
        pop = stack.pop
        while stack:
            vs, comps, hi, qmask = pop()
            out = qmask & vs.complete
            if out:
                qmask ^= out
                if sign < 0 and out & self._seers_mask:
                    out &= ~self.held_only(hi)
                while out:
                    low = out & -out
                    q = by_bit[low.bit_length() - 1]
                    q.emit((*q.project(comps), sign, ts))
                    q.emitted += 1
                    out ^= low
            targets = vs.targets
            while qmask:
                # The policy is asked (and told) only where there is a choice.
                ready = [t for t in targets if qmask & t.needs]
                if not ready:
                    break
                routings += 1
                if len(ready) == 1:
                    t = ready[0]
                    handled = qmask & t.needs
                    probe(vs, t, comps, hi, handled, sign, stack)
                    qmask ^= handled
                    continue
                tid = policy.choose([x.id for x in ready])
                t = next(x for x in ready if x.id == tid)
                handled = qmask & t.needs
                weight = handled.bit_count()
                policy.routed(t.id, weight)
                n, work = probe(vs, t, comps, hi, handled, sign, stack)
                qmask ^= handled
                policy.returned(t.id, n + (1 if qmask else 0), weight, work)
        self._counts["routings"] += routings

    def _probe(self, vs: VirtualSource, t: Target, comps: dict, hi: int, handled: int,
               sign: int, stack: list) -> tuple[int, int]:
        """Probe SteM access ``t`` with a tuple of ``vs``; push the valid intermediate
        tuples (§3.3.1: an insertion matches only older rows, and each match is checked
        against every query's window on the target). Returns (tuples produced, work)."""
        src, k = t.source, t.role
        st = self.sources[src]
        times, passed, shift = st.stem.times, st.passed, k * self.capacity
        vs2 = vs.nexts.get(t.id)
        if vs2 is None:
            vs2 = vs.nexts[t.id] = self.vsource(vs.key | {(src, k)})
        ck = (src, k)
        deletion = sign < 0
        ev_t, ev_e = self._event
        cur_src, cur_k, cur_del, _ = self._cur
        last = self.last_reg
        produced = work = 0
        push = stack.append
        for g in t.groups:
            m = g.mask & handled
            if not m:
                continue
            probe = g.probe
            if len(probe) == 1:
                comp, p = probe[0]
                key = comps[comp][p]
                if key is None:
                    continue
            else:
                key = tuple(comps[c][p] for c, p in probe)
                if None in key:
                    continue
            work += 1
            bucket = g.index.get(key)
            if not bucket:
                continue
            if g.nan and _has_nan(key, g.nan, len(probe) == 1):
                continue   # a NaN found its own stored object, by identity (nan_checks)
            work += len(bucket)
            windows = g.windows
            single = windows[0] if len(windows) == 1 else None
            for rid, row in bucket.items():
                eff = rid * ROLE_BITS + k
                if not deletion:
                    if eff >= hi:
                        continue
                elif cur_src == src and rid == self.rid and k >= cur_k:
                    continue   # the arrival's own later roles are not there yet
                mm = m & (passed[rid] >> shift)
                if not mm:
                    continue
                if rid <= last:
                    mm &= self.visible(rid)
                if single is not None and single[0] == "range":
                    end = times[rid] + single[1]
                    if end < ev_t or end == ev_t and eff <= ev_e:
                        continue
                else:
                    mm &= self._in_windows(windows, mm, st, rid, eff, ev_t, ev_e,
                                           src == cur_src, k, cur_k, cur_del)
                if mm:
                    c2 = comps.copy()
                    c2[ck] = row
                    # An insertion keeps the larger sequence, hi; a deletion keeps its
                    # newest component's, which tells held-only results (``held_only``).
                    push((vs2, c2, eff if deletion and eff > hi else hi, mm))
                    produced += 1
        return produced, work

    @staticmethod
    def _in_windows(windows, mm: int, st: SourceState, rid: int, eff: int, ev_t, ev_e,
                    same_source: bool, k: int, cur_k: int, cur_del: bool) -> int:
        """The queries (of ``mm``) in whose window on the target the row is at the event
        being processed (time ``ev_t``, sequence ``ev_e``; docs/cacq.md, "Windows")."""
        ok = 0
        for kind, size, wm in windows:
            if not wm & mm:
                continue
            if kind == "range":
                end = st.stem.times[rid] + size
                if end > ev_t or end == ev_t and eff > ev_e:
                    ok |= wm
            elif kind == "rows":
                c = st.count
                # Role j of the arrival in progress has counted it once its own step
                # (deletions, then insertion) has begun.
                if same_source and (k >= cur_k if cur_del else k > cur_k):
                    c -= 1
                pos = st.pos.get(rid)   # (None: from a checkpoint that kept no position)
                if pos is not None and c - pos < size:
                    ok |= wm
            else:
                ok |= wm
        return ok

    # ----- checkpoints ----------------------------------------------------------------------
    def snapshot(self) -> dict:
        """Plain data to continue exactly here: every source's rows with their times, pass
        masks, positions and retention holds; pending deletions; the query set (SQL, bit,
        registration sequence, in registration order); operator ids; the routing policy's
        state. Nothing compiled is kept: ``restore`` recompiles from the SQL."""
        return {
            "version": 1, "mode": self.mode, "capacity": self.capacity,
            "routing_epoch": self.routing_epoch, "orders": dict(self._orders),
            "epoch_left": self._epoch_left, "n_in": list(self._n_in),
            "n_out": list(self._n_out),
            "time_unit": self.time_unit, "retain": dict(self.retain),
            "sources": {n: {"rows": dict(st.stem.rows), "times": dict(st.stem.times),
                            "passed": dict(st.passed), "pos": dict(st.pos),
                            "count": st.count, "recent": list(st.recent),
                            "holds": dict(st.holds), "until": dict(st.until)}
                        for n, st in self.sources.items()},
            "heap": list(self.heap), "rid": self.rid, "now": self.now,
            "advanced": self._advanced,
            "queries": [(q.handle, q.query.sql, q.bit, q.seq, q.start, q.emitted, q.since)
                        for q in self.queries.values()],
            "op_keys": dict(self.op_keys), "counts": dict(self._counts),
            "built": self.built, "dropped": self.dropped,
            "results_removed": self._results_removed,
            "failures": list(self.failures),
            "policy": self.policy.state(),
        }

    @classmethod
    def restore(cls, state: dict, schemas, policy, parse: Callable[[str], LogicalQuery],
                emits: Mapping[str, Callable[[tuple], None]], udfs: Mapping | None = None
                ) -> Eddy:
        """The engine of ``snapshot`` (``policy``: restored from ``state["policy"]``;
        ``parse``: SQL -> LogicalQuery; ``emits``: each query's output callback)."""
        ed = cls(schemas, policy, mode=state["mode"], time_unit=state["time_unit"],
                 capacity=state["capacity"], udfs=udfs, routing_epoch=state["routing_epoch"])
        ed.retain = dict(state["retain"])   # (in engine units: not through __init__)
        ed._refresh()   # the retention it asks for, even if no query is registered below
        ed.op_keys = dict(state["op_keys"])
        for name, s in state["sources"].items():
            st = ed.sources[name]
            for rid, row in s["rows"].items():
                st.stem.insert(rid, row, s["times"][rid])
            st.passed, st.pos, st.holds = dict(s["passed"]), dict(s["pos"]), dict(s["holds"])
            st.until = dict(s.get("until", {}))
        for handle, sql, bit, seq, start, emitted, *since in state["queries"]:
            # (a checkpoint written before ``since`` was kept has none: the old rule)
            q = ed.add_query(handle, parse(sql), emits[handle], start, _bit=bit, _seq=seq,
                             _since=since[0] if since else None)
            q.emitted = emitted
        for name, s in state["sources"].items():
            # After the queries: a partial query set would trim the count holds.
            st = ed.sources[name]
            st.count, st.recent = s["count"], deque(s["recent"])
        ed.heap = list(state["heap"])
        heapq.heapify(ed.heap)
        ed.rid, ed.now = state["rid"], state["now"]
        # (a checkpoint written before the watermark was kept has none: no advance_to)
        ed._advanced = state.get("advanced", -math.inf)
        ed._counts = dict(state["counts"])
        ed._orders, ed._epoch_left = dict(state["orders"]), state["epoch_left"]
        ed._n_in[:len(state["n_in"])] = state["n_in"]
        ed._n_out[:len(state["n_out"])] = state["n_out"]
        ed.built, ed.dropped = state["built"], state["dropped"]
        ed._results_removed = state["results_removed"]
        ed.failures = list(state["failures"])
        return ed

    # ----- introspection ------------------------------------------------------------------
    def describe(self) -> dict:
        """The shared operators, virtual sources, tickets and each query's masks, for
        ``adaptcq explain`` (plain data)."""
        tickets = self.policy.tickets() if hasattr(self.policy, "tickets") else {}
        ops = []
        for st in self.sources.values():
            for op in st.ops:
                ops.append({"id": op.id, "operator": self.op_labels[op.id], "source": st.name,
                            "flag": op.flag, "predicates": len(op.impl),
                            "tickets": tickets.get(op.id)})
        for (src, k), tid in sorted(self.targets.items()):
            ops.append({"id": tid, "operator": self.op_labels[tid], "source": src,
                        "flag": None, "rows": len(self.sources[src].stem),
                        "tickets": tickets.get(tid)})
        vss = []
        for key in sorted(self.vsources, key=lambda k: sorted(k)):
            vs = self.vsources[key]
            vss.append({"id": vs.id, "sources": _vs_name(key), "queries": _bits(vs.queries),
                        "completion": _bits(vs.complete),
                        "stems": [self.op_labels[t.id] for t in vs.targets]})
        queries = []
        for q in self.queries.values():
            masks = {}
            for a, (src, k) in zip(q.query.aliases, q.roles, strict=True):
                slot = self._slot(q, k)
                st = self.sources[src]
                used = [op for op in st.ops if op.slots & slot]
                # The query's completion mask over the source's operators list (§3.2.3):
                # the filters a singleton must have visited before it is output to it.
                masks[a] = {"source": src, "role": k, "slot": slot.bit_length() - 1,
                            "completion": sum(op.flag for op in used),
                            "filters": [self.op_labels[op.id] for op in used]}
            queries.append({"query": q.handle, "bit": q.bit, "registered_after": q.seq,
                            "virtual_source": _vs_name(q.vs), "aliases": masks,
                            "emitted": q.emitted})
        return {"operators": ops, "virtual_sources": vss, "queries": queries,
                "counts": dict(self.counts), "failures": list(self.failures)}


def _vs_name(key) -> str:
    return "⋈".join(src + (f"#{k}" if k else "") for src, k in sorted(key))


def _bits(mask: int) -> list[int]:
    out, b = [], 0
    while mask:
        if mask & 1:
            out.append(b)
        mask >>= 1
        b += 1
    return out


class PerQueryEddies:
    """Baseline of cacq.txt §3.2.8 (Figure 6): "the basic implementation in Telegraph, in
    which each query runs with its own eddy and operators" — one :class:`Eddy` per query,
    nothing shared (each has its own SteMs, filters and routing policy, a copy of the
    given one's kind and parameters). Same interface as :class:`Eddy`."""

    def __init__(self, schemas, policy, mode: str = "append", time_unit: float = 1.0,
                 capacity: int = CAPACITY_DEFAULT, retain=None, udfs=None,
                 routing_epoch: int | None = None):
        self.schemas, self.policy, self.mode = schemas, policy, mode
        self.routing_epoch = routing_epoch
        self.time_unit, self.capacity, self.retain, self.udfs = time_unit, capacity, retain, udfs
        self.eddies: dict[str, Eddy] = {}
        self.readers: dict[str, list[Eddy]] = {s: [] for s in schemas}
        self.failures: list[tuple[str, str]] = []

    def add_query(self, handle: str, query: LogicalQuery, emit, start: str = "now"):
        if start != "now":
            raise OptionError("the eddies baseline gives each query a new eddy, which holds "
                              "no earlier rows: start='window' needs the shared eddy")
        policy = type(self.policy).from_state(self.policy.state())
        ed = Eddy(self.schemas, policy, self.mode, self.time_unit, self.capacity,
                  self.retain, self.udfs, self.routing_epoch)
        q = ed.add_query(handle, query, emit, start)
        self.eddies[handle] = ed
        self._readers()
        return q

    def remove_query(self, handle: str, error: str | None = None):
        if handle not in self.eddies:
            raise OptionError(f"no query is registered as {handle!r}")
        ed = self.eddies.pop(handle)
        self._readers()
        return ed.remove_query(handle, error)

    def _readers(self) -> None:
        self.readers = {s: [] for s in self.schemas}
        for ed in self.eddies.values():
            for s in {src for q in ed.queries.values() for src, _ in q.roles}:
                self.readers[s].append(ed)

    def process(self, source: str, ts, row: tuple) -> None:
        for ed in self.readers[source]:
            ed.process(source, ts, row)
        for ed in self.eddies.values():
            if ed.failures:
                self.failures.extend(ed.failures)
                ed.failures = []
        # Eddies not reading the source only see time pass (their deletions, retract).
        if self.mode == "retract":
            for ed in self.eddies.values():
                if ed not in self.readers[source]:
                    ed.advance_to(ts)

    def advance_to(self, now) -> None:
        for ed in self.eddies.values():
            ed.advance_to(now)

    @property
    def counts(self) -> dict:
        out: dict = {}
        for ed in self.eddies.values():
            for k, v in ed.counts.items():
                out[k] = out.get(k, 0) + v
        return out

    def describe(self) -> dict:
        return {"eddies": {h: ed.describe() for h, ed in self.eddies.items()}}
