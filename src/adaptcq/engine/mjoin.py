"""MJoin executor (a-caching.txt §3.1; Viglas et al. [30]).

One pipeline per stream R_i: an order R_i1, ..., R_i(n-1) of the other streams. An update
r in ΔR_i is joined with the other n-1 SteMs in that order, each join probing a hash index
with all predicates between the joined relation and the prefix; the result tuples are
insertions (or deletions) to the n-way join. Then R_i's SteM is updated. No join
subresult is kept, so a pipeline can be re-ordered between any two updates without any
effect on results.

This module is plan state and mechanism only: the pipelines are plans (``engine.plan``),
compiled for speed (``engine.codegen``) or interpreted with work counts for profiling
(``engine.interp``); the rules they obey are in ``engine.rules``; which order or cache to
use is decided in ``adapt/``.
"""

from __future__ import annotations

from collections.abc import Sequence

from adaptcq.engine import plan as plans
from adaptcq.engine.cache import JoinCache
from adaptcq.engine.codegen import (
    Compiled,
    compile_plan,
    compile_source,
    exec_source,
    projection_source,
)
from adaptcq.engine.interp import Observation, interpret, prepare
from adaptcq.engine.plan import CacheSpec, PipelinePlan, Probe
from adaptcq.engine.rules import (
    cache_key,
    check_given_orders,
    check_order,
    composite_key,
    connected_order,
    key_function,
    prefix_invariant,
    probe_plan,
    row_key_positions,
)
from adaptcq.errors import OptionError
from adaptcq.query.logical import LogicalQuery
from adaptcq.state.stem import ScanIndex, SteM

#: Profiled tuples interpreted on a new plan before its profiled pipeline is compiled.
COMPILE_AFTER = 16


class MJoin:
    """The MJoin executor over one SteM per stream.

    ``out`` receives output tuples ``(*select values, sign, ts)``. In append mode deletions
    only update the SteM (expiries emit nothing); in retract mode they run the pipeline
    and emit result deletions.

    A worked update (after Flink's ``StreamingMultiJoinOperator`` documentation). The query
    R(a, id) ⋈_a S(a, b, id) ⋈_b T(b, id); rows are tuples in ``query.columns`` order, and
    insert(i, rid, row, ts) takes the stream's index, the arrival sequence number, the row
    and its event time.

        >>> from adaptcq.query.cql import parse_query
        >>> from adaptcq.engine.plan import describe
        >>> q = parse_query("SELECT R.id AS r, S.id AS s, T.id AS t FROM R, S, T "
        ...                 "WHERE R.a = S.a AND S.b = T.b",
        ...                 {x: {"a": "number", "b": "number", "id": "number"} for x in "RST"})
        >>> q.columns
        {'R': ('a', 'id'), 'S': ('a', 'b', 'id'), 'T': ('b', 'id')}

    State before: S holds (a=1, b=7, id=10), T holds (b=7, id=20), R is empty. ΔR's pipeline
    is S then T, with a cache of S⋈T keyed on S.a (a-caching.txt §3.2: the prefix invariant
    holds because ΔS's pipeline starts with T and ΔT's with S).

        >>> ex = MJoin(q, orders={"R": ["S", "T"], "S": ["T", "R"], "T": ["S", "R"]})
        >>> ex.insert(1, 1, (1, 7, 10), 0)
        >>> ex.insert(2, 2, (7, 20), 0)
        >>> cache = ex.place_cache("R", 1, 2, buckets=7)

    The plan (engine.plan): the cached segment's probes run only on a miss. ΔS's pipeline
    carries the CacheUpdate that keeps the cache consistent when S or T rows arrive.

        >>> print(describe(ex.plan("R")))
        <pipeline ΔR: S⋈T>
          CacheLookup C0 on v0[0] -> v1, v2 (on a miss:)
            Probe S -> v1 (hash on v0[0])
            Probe T -> v2 (hash on v1[1])
          Emit
        >>> print(describe(ex.plan("S")))
        <pipeline ΔS: T⋈R>
          Probe T -> v1 (hash on v0[1])
          CacheUpdate C0 insert S⋈T on v0[0]
          Probe R -> v2 (hash on v0[0])
          Emit

    The generated code (engine.codegen; ``adaptcq explain --code`` prints it): the whole
    insertion, ending with the row stored in R's SteM. ``I1`` and ``I2`` are the hash
    indexes on S.a and T.b, ``C0T`` the cache's slots, ``C0N`` its hit and miss counters.

        >>> print(ex.pipeline_sources()["<pipeline ΔR: S⋈T>"])
        def pipeline(rid, v0, ts):
            v0 = (*v0,)
            # CacheLookup C0 over S⋈T: probe(u); on a miss run the segment and create(u, v)
            u = v0[0]
            if u is None:
                seg = EMPTY
            else:
                e = C0T[hash(u) % 7]
                if e is not None and e[0] == u:
                    seg = e[1]
                    C0N[0] += 1
                else:
                    seg = None
            if seg is None:
                seg = {}
                # ⋈ S
                b1 = I1.get(v0[0])
                if b1:
                    for v1 in b1.values():
                        # ⋈ T
                        b2 = I2.get(v1[1])
                        if b2:
                            for v2 in b2.values():
                                seg[(id(v1), id(v2),)] = (v1, v2,)
                if u is not None:
                    C0T[hash(u) % 7] = (u, seg)
                C0N[1] += 1
            for v1, v2, in seg.values():
                emit((v0[1], v1[2], v2[1], 1, ts))
            STEM.insert(rid, v0, ts)  # an attribute: recompiled per index set
        <BLANKLINE>

    R(a=1, id=1) arrives at t=5: the cache misses (counts are [hits, misses]), the segment
    runs, the entry for u=1 is created, one result (r, s, t, sign, ts) is emitted, and the row
    enters R's SteM with its time.

        >>> ex.insert(0, 3, (1, 1), 5)
        >>> cache.counts, ex.out
        ([0, 1], [(1, 10, 20, 1, 5)])
        >>> [(e[0], list(e[1].values())) for e in cache.table if e is not None]
        [(1, [((1, 7, 10), (7, 20))])]
        >>> ex.stems[0].rows, ex.stems[0].times
        ({3: (1, 1)}, {3: 5})

    State after a second R(a=1, id=2) at t=6: a cache hit, no probe of S or T.

        >>> ex.insert(0, 4, (1, 2), 6)
        >>> cache.counts, ex.out[-1]
        ([1, 1], (2, 10, 20, 1, 6))
    """

    name = "mjoin"

    def __init__(self, query: LogicalQuery, mode: str = "append",
                 orders: dict[str, Sequence[str]] | None = None, out: list | None = None,
                 nested_loop: Sequence[str] = ()):
        # Joins into these streams ("S"), or probing these columns ("S.b"), scan the window
        # instead of probing a hash index (a-caching.txt §7.2, Figure 10).
        if isinstance(nested_loop, str):
            nested_loop = [nested_loop]
        self.nested_loop = frozenset(nested_loop)
        for item in sorted(self.nested_loop):
            _check_nested_loop(query, item)
        given = check_given_orders(query.aliases, orders, OptionError)
        self.query = query
        self.reorders = 0  # set_order calls so far
        self._aliases = query.aliases
        self.retract = mode == "retract"
        self.stems = [SteM(a, query.columns[a]) for a in query.aliases]
        self._stem = dict(zip(query.aliases, self.stems))
        self.out = [] if out is None else out
        self._emit = self.out.append
        self.orders: dict[str, list[str]] = {}
        # The current plans and their compiled functions, per stream: insertions (with
        # CacheUpdates) and deletions ("delete" in retract mode, "maintain" in append).
        self.plans: dict[tuple[str, str], PipelinePlan] = {}
        self.compiled: dict[tuple[str, str], Compiled] = {}
        # Per stream, the whole update as one generated function (``_wire``: the insertion
        # pipeline itself, a generated delete): what the query's update loop calls.
        # Replaced in place, so a loop holding the lists sees every plan change at once.
        self.inserts: list = [None] * len(self.stems)
        self.deletes: list = [None] * len(self.stems)
        self._projections: dict[tuple, object] = {}  # slot layout -> projection
        self._fanout_fns: dict[str, object] = {}  # stream -> fn(level, k), see _fanouts
        self._programs: dict[tuple[str, str], tuple] = {}  # prepared plans (interpreter)
        # (stream index, fan-outs?) -> MJoin._profiler's tuple (its compiled profiled
        # pipeline); before that, (plan, profiled tuples interpreted on it)
        self._profiled: dict[tuple[int, bool], tuple] = {}
        self._profile_uses: dict[tuple[int, bool], tuple] = {}
        # (stream, kind) -> (bucket counts, the objects its compiled function was bound
        # to): what ``_compile`` compares before keeping a pipeline; and the streams whose
        # insertion plan changed since the stale state was last forgotten.
        self._bound: dict[tuple[str, str], tuple[dict, dict]] = {}
        self._replanned: set[str] = set()
        self._scan_indexes: dict[tuple, ScanIndex] = {}
        self.compile_after = COMPILE_AFTER
        # Caches (a-caching.txt §3.2): placements per pipeline, the shared cache objects,
        # and for each stream the caches holding its rows (evicted on its deletions).
        self.placements: dict[str, list[tuple[int, int, JoinCache]]] = {
            a: [] for a in query.aliases}
        self.caches: dict[tuple, JoinCache] = {}
        self._cache_names: dict[int, str] = {}   # id(cache) -> its name in the plans
        self._by_name: dict[str, JoinCache] = {}
        # Probe-key observers (App. A: a CacheLookup that only watches the probe stream of
        # a cache not in use, for its Bloom-filter miss estimate): (pipeline, start) -> fns.
        self.observers: dict[tuple[str, int], list] = {}
        self._member_caches: list[list[JoinCache]] = [[] for _ in query.aliases]
        self._guarded: list[list[JoinCache]] = [[] for _ in query.aliases]
        # While caches exist, every SteM row is a distinct object (see ``_rebuild``).
        self._distinct = False
        # Every update through the interpreter (``use_interpreter``), else compiled code.
        self.interpreted = False
        for a in query.aliases:
            self.orders[a] = given[a] if a in given else connected_order(query, a)
        for i, stem in enumerate(self.stems):  # see _wire: deletes[i] may be stem.delete
            stem.listeners.append(lambda i=i: self._wire(i))
        self._rebuild()

    def set_emit(self, emit) -> None:
        """Where result tuples go (``out.append`` by default; a driver may bound them)."""
        self._emit = emit
        for i, a in enumerate(self._aliases):
            self._wire(i)
            self._fn(a, "insert").__globals__["emit"] = emit  # the insertion's namespace
        self._profiled.clear()  # compiled with the old emit

    def _wire(self, i: int) -> None:
        """Stream i's update functions for the current pipelines: the insertion pipeline
        itself (it stores its row), and a generated delete(rid, ts) that removes the row,
        evicts it from §6 caches, runs the deletion pipeline and drops guarded cache
        entries left without an R_i tuple (see ``delete``)."""
        alias = self._aliases[i]
        insert = self._fn(alias, "insert")
        if insert is None:  # a SteM recompiled before the first plan exists
            return
        if self.interpreted:
            self.inserts[i] = lambda rid, row, ts: self.interpret_insert(i, rid, row, ts)
            self.deletes[i] = lambda rid, ts: self.interpret_delete(i, rid, ts)
            return
        ns = {"stem": self.stems[i], "dele": self._fn(alias, self._delete_kind),
              "emit": self._emit, "members": tuple(self._member_caches[i]),
              "guards": tuple((c, *c.guard[1:]) for c in self._guarded[i]), "alias": alias}
        if not (ns["members"] or ns["dele"] or ns["guards"]):
            # Nothing but the SteM's own delete (an append-mode expiry without caches):
            # call it directly; it is re-bound whenever the SteM recompiles it.
            self.inserts[i], self.deletes[i] = insert, self.stems[i].delete
            return
        lines = ["def delete(rid, ts):", "    row = stem.delete(rid)"]
        if ns["members"]:
            lines += ["    for c in members:", "        c.evict_row(alias, row)"]
        if ns["dele"] is not None:
            lines.append("    dele(row, -1, ts, emit)")
        if ns["guards"]:
            lines += ["    for c, positions, keyfn in guards:", "        u = keyfn(row)",
                      "        if u is not None and not stem.index(positions).get(u):",
                      "            c.evict_key(u)"]
        ns, _ = exec_source(f"<MJoin updates Δ{alias}>", "\n".join(lines) + "\n", ns)
        self.inserts[i], self.deletes[i] = insert, ns["delete"]

    # ----- plan ------------------------------------------------------------------------
    def set_order(self, stream: str, order: Sequence[str]) -> None:
        """Re-order ``stream``'s pipeline; valid between any two updates. The caches used
        in that pipeline are removed, and so is any cache elsewhere whose prefix invariant
        the new order breaks (a-caching.txt §4.5 step 5). A refused order (see
        ``engine.rules.check_order``) changes nothing."""
        self.orders[stream] = check_order(self.query.aliases, stream, order)
        self.reorders += 1  # policies that keep per-plan state notice a re-ordering by it
        dropped = bool(self.placements[stream])
        self.placements[stream] = []
        self.observers = {k: v for k, v in self.observers.items() if k[0] != stream}
        for pipeline, placed in self.placements.items():
            kept = [(j, k, c) for j, k, c in placed
                    if prefix_invariant(self.orders, c.members + tuple(sorted(c.extra)))]
            dropped |= len(kept) < len(placed)
            self.placements[pipeline] = kept
        # Another pipeline's plan depends on this order only through the caches (each
        # cache's updates are placed in every pipeline that feeds it): while no cache was
        # dropped, only this stream's pipelines are re-planned. A-Greedy may flip two
        # orders of equal cost hundreds of times.
        self._rebuild(only=stream if not dropped else None)

    def _rebuild(self, only: str | None = None) -> None:
        """Re-plan and recompile every pipeline (or ``only`` that stream's two) for the
        current orders and caches; drop indexes and caches no longer used."""
        used = {c for placed in self.placements.values() for _, _, c in placed}
        for key in [k for k, c in self.caches.items() if c not in used]:
            self.caches.pop(key).clear()
        # Cache names in the plans: C0, C1, ... in a deterministic order of the caches.
        ordered = sorted(self.caches.items(), key=lambda kv: repr(kv[0]))
        self._cache_names = {id(c): f"C{n}" for n, (_, c) in enumerate(ordered)}
        self._by_name = {f"C{n}": c for n, (_, c) in enumerate(ordered)}
        # Globally-consistent caches drop deleted rows by identity (Def. 6.1 allows extra
        # tuples, so their CacheUpdates cannot find every tuple a deletion ends).
        self._member_caches = [[c for c in self.caches.values() if a in c.members and c.extra]
                               for a in self.query.aliases]
        self._guarded = [[c for c in self.caches.values() if c.guard and c.guard[0] == a]
                         for a in self.query.aliases]
        # Caches identify a segment tuple by the ids of its base rows, so two tuples of one
        # SteM must never be one object (a caller may pass the same tuple object for two
        # arrivals: a cache then kept one of their results). While caches exist, insertion
        # pipelines copy the arriving row; when the first cache appears, the rows inserted
        # before without a copy are made distinct.
        if self.caches and not self._distinct:
            for stem in self.stems:
                stem.make_rows_distinct()
        self._distinct = bool(self.caches)
        self._projections.clear()
        for i, a in enumerate(self.query.aliases):
            if only is None or a == only:
                self._compile(a, "insert")
                self._compile(a, self._delete_kind)
                self._wire(i)
        self._forget_stale(self._drop_unused_indexes())

    def _forget_stale(self, dropped: bool) -> None:
        """After a re-plan: the interpreter's programs and the profiled pipelines are kept
        per plan object (``_compile`` keeps the object of a plan that did not change), so
        only those of changed plans are stale; the fan-out functions hold the indexes of
        their stream's order. An index dropped may be held by any of them: all go."""
        if dropped:
            self._fanout_fns.clear()
            self._profiled.clear()
            self._programs.clear()
            self._replanned = set()
            return
        for key in [k for k, got in self._profiled.items()
                    if got[0] is not self.plans.get((self._aliases[k[0]], "insert"))]:
            del self._profiled[key]
        for key in [k for k, got in self._programs.items() if got[0] is not self.plans.get(k)]:
            del self._programs[key]
        for stream in [a for a in self._fanout_fns if a in self._replanned]:
            del self._fanout_fns[stream]
        self._replanned = set()

    def _spec(self, c: JoinCache) -> CacheSpec:
        return CacheSpec(self._cache_names[id(c)], c.members, c.extra, c.key,
                         bool(c.rev_positions))

    def plan(self, stream: str, kind: str = "insert") -> PipelinePlan:
        """The plan of ``stream``'s pipeline of ``kind`` for the current orders, caches and
        observers (engine.plan)."""
        specs = [self._spec(c) for c in self.caches.values()]
        placements = [(j, k, self._spec(c)) for j, k, c in self.placements[stream]]
        watches = []
        for (pipeline, position), obs in sorted(self.observers.items()):
            if pipeline == stream:
                watches += [(position, key, f"O{position}_{n}")
                            for n, (key, _) in enumerate(obs)]
        return plans.build(self.query, stream, self.orders[stream], kind, caches=specs,
                           placements=placements, watches=watches, scans=self._scans)

    @property
    def _delete_kind(self) -> str:
        """Deletion pipelines: "delete" in retract mode, "maintain" in append mode."""
        return "delete" if self.retract else "maintain"

    def _compile(self, stream: str, kind: str) -> None:
        """(Re)compile a pipeline for the current orders, caches and observers. A plan
        equal to the one compiled, over the same objects (indexes, caches, observers) and
        bucket counts, keeps its plan object and compiled function: a re-plan (a cache
        placed or dropped, observers added, one pipeline re-ordered) changes a few
        pipelines, and a kept plan also keeps its profiled pipeline and its interpreter
        program (``_forget_stale``)."""
        key = (stream, kind)
        plan = self.plan(stream, kind)
        buckets = {name: c.buckets for name, c in self._by_name.items()}
        old, bound = self.plans.get(key), self._bound.get(key)
        if old is not None and old == plan and (
                plan.empty or (bound is not None and bound[0] == buckets and all(
                    self._bind(old, name, what) is obj for (name, what), obj in bound[1].items()))):
            return  # the same code over the same objects: nothing to do
        self.plans[key] = plan
        if kind == "insert":
            self._replanned.add(stream)
        if plan.empty:
            self.compiled.pop(key, None)
            self._bound.pop(key, None)
            return
        objects: dict = {}

        def bind(name, what):
            obj = objects[(name, what)] = self._bind(plan, name, what)
            return obj
        self.compiled[key] = compile_plan(self.query, plan, bind, buckets)
        self._bound[key] = (buckets, objects)

    def _fn(self, stream: str, kind: str):
        """The compiled function of a current pipeline (None when there is none)."""
        compiled = self.compiled.get((stream, kind))
        return None if compiled is None else compiled.fn

    def _bind(self, plan: PipelinePlan, name: str, what: str):
        """The object behind a free name of generated code (engine.codegen.generate)."""
        if what in ("index", "rows"):
            op = next(o for o in _probes(plan.ops) if o.slot == int(name[1:]))
            return self.index(op)
        if what == "cache":
            return self._by_name[name]
        if what == "table":
            return self._by_name[name[:-1]].table
        if what == "counts":
            return self._by_name[name[:-1]].counts
        if what == "watcher":
            return self.watcher(plan.stream, name)
        if what == "stem":
            return self._stem[plan.stream]
        if what == "emit":
            return self._emit
        if what == "empty":
            from adaptcq.engine.cache import EMPTY
            return EMPTY
        raise KeyError(name)

    def pipeline_sources(self) -> dict[str, str]:
        """The generated source of every compiled pipeline, by pipeline name
        (``<pipeline ΔR: S⋈T>``): what ``adaptcq explain --code`` prints."""
        return {self.plans[key].name: c.source for key, c in self.compiled.items()}

    # ----- bindings the back ends read (engine.interp.Bindings) -------------------------
    def index(self, op: Probe):
        """The index a Probe reads: a hash index, a window scan (nested loop), or the
        window's rows for a cartesian step."""
        stem = self._stem[op.stream]
        if not op.positions:
            return stem.rows
        if not op.scan:
            return stem.index(op.positions)
        # One per (stream, positions): it holds no state of its own (it scans the SteM's
        # rows as they are), and the same object lets ``_compile`` keep a pipeline.
        got = self._scan_indexes.get((op.stream, op.positions))
        if got is None:
            got = self._scan_indexes[(op.stream, op.positions)] = ScanIndex(stem, op.positions)
        return got

    def cache(self, name: str) -> JoinCache:
        return self._by_name[name]

    def watcher(self, stream: str, name: str):
        """Observer ``O<position>_<n>`` of ``stream``'s pipeline."""
        position, n = name[1:].split("_")
        return self.observers[(stream, int(position))][int(n)][1]

    def projection(self, plan: PipelinePlan):
        """fn(composite, sign, ts, emit) for a plan's Emit (the interpreter's)."""
        # Keyed by the slot layout (a small tuple): hashing a whole plan costs more.
        fn = self._projections.get(plan.slots)
        if fn is None:
            slots = dict(plan.slots)
            q = self.query

            def resolve(ref):
                return f"c[{slots[ref.stream]}][{q.columns[ref.stream].index(ref.column)}]"
            fn = compile_source("project", f"<projection Δ{plan.stream}>", "\n".join([
                "def project(c, sign, ts, emit):",
                f"    emit(({projection_source(q, resolve)}sign, ts))", ""]), {}).fn
            self._projections[plan.slots] = fn
        return fn

    def scans(self, stream: str, positions: tuple[int, ...]) -> bool:
        """Whether a join into ``stream`` on ``positions`` scans the window (a nested-loop
        join, ``nested_loop``) instead of probing a hash index."""
        return self._scans(stream, positions)

    def _scans(self, stream: str, positions: tuple[int, ...]) -> bool:
        cols = self._stem[stream].columns
        return stream in self.nested_loop or any(
            f"{stream}.{cols[p]}" in self.nested_loop for p in positions)

    def _drop_unused_indexes(self) -> bool:
        used: dict[str, set] = {a: set() for a in self.query.aliases}
        for start, order in self.orders.items():
            prefix = [start]
            for s in order:
                positions, _ = probe_plan(self.query, s, prefix)
                if positions and not self._scans(s, positions):
                    used[s].add(positions)
                prefix.append(s)
        for c in self.caches.values():
            if c.guard:
                used[c.guard[0]].add(c.guard[1])
        dropped = False
        for stem in self.stems:
            for positions in stem.indexed:
                if positions not in used[stem.name]:
                    stem.drop_index(positions)
                    dropped = True
        return dropped

    # ----- caches (the mechanism; choosing them is adapt/caching's job) -------------------
    def place_cache(self, pipeline: str, start: int, end: int,
                    extra: frozenset[str] | set[str] = frozenset(),
                    buckets: int = 1024) -> JoinCache:
        """Use a cache over operators ``start``..``end`` (1-based) of ``pipeline``'s order:
        a prefix-invariant cache (Def. 3.2) or, with ``extra`` = Y, a globally-consistent
        X ⋈ Y cache (§6, Def. 6.1). A cache with the same segment, key and Y already in use
        in another pipeline is shared (Def. 4.1). It starts empty and fills on misses;
        results are unaffected. Raises ValueError when the invariant does not hold, when
        the placement overlaps a cache or a CacheUpdate operator of this pipeline, or when a
        CacheUpdate of any cache would follow a §6 segment's hits in the same pipeline
        before all of that cache's Y is joined (a hit holds only Def. 6.1's lower bound,
        a CacheUpdate needs every new tuple of its join: §3.2)."""
        q, order = self.query, self.orders[pipeline]
        if not 1 <= start <= end <= len(order):
            raise ValueError(f"cache segment {start}..{end} is outside {pipeline}'s pipeline "
                             f"of {len(order)} joins")
        segment = order[start - 1:end]
        extra = frozenset(extra)
        prefix = [pipeline, *order[:start - 1]]
        if extra & set(segment):
            raise ValueError(f"Y = {sorted(extra)} must not hold a relation of the segment")
        z = tuple(segment) + tuple(sorted(extra))
        if not prefix_invariant(self.orders, z):
            what = "prefix invariant (Def. 3.2)" if not extra else \
                "prefix invariant of X ∪ Y (§6)"
            raise ValueError(f"a cache of {'⋈'.join(segment)} in {pipeline}'s pipeline breaks "
                             f"the {what} for the current orders")
        members = tuple(a for a in q.aliases if a in segment)
        key = cache_key(q, prefix, members)
        if not key:
            raise ValueError(f"no join attribute links {', '.join(prefix)} to "
                             f"{'⋈'.join(segment)}: a cache would hold a cartesian product")
        for j, k, _ in self.placements[pipeline]:
            if not (end < j or k < start):
                raise ValueError(f"the segment {start}..{end} overlaps a cache at {j}..{k}")
        guard = None
        if pipeline in extra:
            guard = _guard(q, pipeline, start, key, extra)
        ident = (members, extra, key, pipeline if guard else None)
        cache = self.caches.get(ident) or JoinCache(
            members, extra, key, buckets, {m: _row_key(q, key, m) for m in members})
        cache.guard = guard
        # A CacheUpdate must see every new tuple of its join (§3.2: "U_l has access to all
        # updates"). A hit bypasses the operators of its segment, so none may sit inside
        # one; and a §6 hit yields only Def. 6.1's lower bound σ_{K=u}(X) ⋉ Y, so none may
        # follow it while some of Y is not yet joined (it would miss the X tuples that
        # join nothing in Y: a stale or missing tuple in another cache).
        trial = dict(self.caches)
        trial[ident] = cache
        for p, placed in self.placements.items():
            segs = placed + ([(start, end, cache)] if p == pipeline else [])
            for c in trial.values():
                zc = set(c.members) | c.extra
                pos = len(zc) - 1
                if p not in zc:
                    continue
                if any(j <= pos < k for j, k, _ in segs):
                    raise ValueError(f"the CacheUpdate of {c.name} in {p}'s pipeline would "
                                     "sit inside a cached segment")
                joined = {p, *self.orders[p][:pos]}
                for j, k, d in segs:
                    missing = sorted(d.extra - joined)
                    if d.extra and pos >= k and missing:
                        raise ValueError(
                            f"the CacheUpdate of {c.name} in {p}'s pipeline (after join "
                            f"{pos}) would follow the hits of the globally-consistent "
                            f"cache {d.name} at {j}..{k} before {', '.join(missing)} of "
                            "its Y is joined: a hit holds only the X tuples that join Y "
                            "(Def. 6.1), and the CacheUpdate needs all of them (§3.2)")
        self.caches[ident] = cache
        self.placements[pipeline] = sorted(self.placements[pipeline] + [(start, end, cache)],
                                           key=lambda t: t[0])
        self._rebuild()
        return cache

    def drop_cache(self, pipeline: str, cache: JoinCache) -> None:
        """Stop using ``cache`` in ``pipeline`` (dropped entirely when no pipeline uses it)."""
        self.placements[pipeline] = [t for t in self.placements[pipeline] if t[2] is not cache]
        self._rebuild()

    def observe_probes(self, watches) -> None:
        """For each (pipeline, start, key, fn) in ``watches``, call ``fn(u)`` with the cache
        key u of every tuple reaching operator ``start`` of ``pipeline`` (key: segment-side
        ColumnRefs as ``rules.cache_key`` gives them). One recompilation for all of them."""
        for pipeline, start, key, fn in watches:
            self.observers.setdefault((pipeline, start), []).append((tuple(key), fn))
        self._recompile_inserts({p for p, *_ in watches})

    def clear_observers(self) -> None:
        if self.observers:
            pipelines = {p for p, _ in self.observers}
            self.observers.clear()
            self._recompile_inserts(pipelines)

    def _recompile_inserts(self, pipelines) -> None:
        """Observers live only in the insertion pipelines."""
        for a in pipelines:
            self._compile(a, "insert")
            self._wire(self._aliases.index(a))
        self._forget_stale(False)

    def resize_cache(self, cache: JoinCache, buckets: int) -> None:
        """Change a cache's bucket count (§3.3: chosen from its estimated size; §5)."""
        cache.resize(buckets)
        self._rebuild()

    def cache_bytes(self) -> int:
        return sum(c.size_bytes() for c in self.caches.values())

    # ----- updates ---------------------------------------------------------------------
    def insert(self, i: int, rid: int, row: tuple, ts) -> None:
        """Insert ``row`` (arrival ``rid``, event time ``ts``) into stream i: run its
        pipeline, then store the row it returns (a copy while caches exist)."""
        self.inserts[i](rid, row, ts)

    def delete(self, i: int, rid: int, ts) -> None:
        """Delete stream i's row ``rid``: remove it from the SteM, evict it from §6
        caches, run the deletion pipeline, drop guarded entries (``_wire`` generates it;
        ``interpret_delete`` is the same steps with the interpreter)."""
        self.deletes[i](rid, ts)

    # ----- the interpreted back end (profiling, the work clock) ---------------------------
    def use_interpreter(self, on: bool = True) -> None:
        """Run every update through the interpreter (engine.interp, caches used) instead of
        the compiled pipelines: the same output and state, update by update (a property
        test), with per-operator work counted; slower."""
        self.interpreted = bool(on)
        for i in range(len(self.stems)):
            self._wire(i)

    def interpret_insert(self, i: int, rid: int, row: tuple, ts, *, use_caches: bool = True,
                         fanouts: bool = False):
        """Process an insertion with the interpreter (engine.interp): the same output and
        state as ``insert``, with per-operator counts (returned)."""
        stream = self._aliases[i]
        fan = None
        if fanouts:
            fan = self._fanout_fns.get(stream)
            if fan is None:  # kept until the next plan change (``_rebuild``)
                fan = self._fanout_fns[stream] = self._fanouts(stream)
        row, counts = interpret(self._program(stream, "insert"), row, 1, ts, self._emit,
                                use_caches=use_caches, fanouts=fan)
        self.stems[i].insert(rid, row, ts)
        return counts

    def interpret_delete(self, i: int, rid: int, ts):
        """``delete`` with the interpreter; returns the counts (None when the deletion
        pipeline is empty: an append-mode expiry with no CacheUpdate to run). The steps
        and their order are those of the generated delete (``_wire``)."""
        alias = self._aliases[i]
        row = self.stems[i].delete(rid)
        for c in self._member_caches[i]:
            c.evict_row(alias, row)
        counts = None
        if not self.plans[(alias, self._delete_kind)].empty:
            _, counts = interpret(self._program(alias, self._delete_kind), row, -1, ts,
                                  self._emit)
        # §6 with R_i in Y: no R_i tuple left for the key. After the deletion pipeline,
        # whose CacheLookup may (re)create the entry for the deleted row's key on a miss:
        # evicting first let a retraction leave an entry that no R_i tuple guards, and
        # X tuples arriving while no R_i tuple has the key never reach it (a lost result).
        for c in self._guarded[i]:
            _, positions, keyfn = c.guard
            u = keyfn(row)
            if u is not None and not self.stems[i].index(positions).get(u):
                c.evict_key(u)
        return counts

    def _program(self, stream: str, kind: str) -> tuple:
        """The interpreter's prepared form of a current plan (engine.interp.prepare),
        kept until the plan changes."""
        program = self._programs.get((stream, kind))
        if program is None or program[0] is not self.plans[(stream, kind)]:
            program = self._programs[(stream, kind)] = prepare(self.plans[(stream, kind)], self)
        return program

    def profile_insert(self, i: int, rid: int, row: tuple, ts, fanouts: bool = True) -> Observation:
        """Process an insertion fully, measuring each operator: the compiled pipeline with
        counters (engine.codegen ``counting``), cached segments run through their probes.

        Gives the same output and state as ``insert`` and the same counts as the
        interpreter (``interpret_insert(..., use_caches=False)``, a property test), at a
        few times an unprofiled insertion's cost; drivers use it for a sample of tuples
        (a-caching.txt App. A: profile with probability p_i, no caches used). ``tau`` is
        not timed per operator (the work units replace it). The first ``compile_after``
        tuples profiled on a plan go through the interpreter (compiling costs about what
        60 interpreted tuples do, and some plans live for only a few)."""
        key = (i, fanouts)
        got = self._profiled.get(key)
        if got is None or got[0] is not self.plans[(self._aliases[i], "insert")]:
            # A plan that lives for a few profiled tuples (observers come and go with
            # every re-profiling) is not worth compiling: interpret its first ones.
            plan = self.plans[(self._aliases[i], "insert")]
            seen = self._profile_uses.get(key)
            n = seen[1] + 1 if seen is not None and seen[0] is plan else 1
            if n <= self.compile_after:
                self._profile_uses[key] = (plan, n)
                stream = self._aliases[i]
                counts = self.interpret_insert(i, rid, row, ts, use_caches=False,
                                               fanouts=fanouts)
                return Observation(stream, tuple(self.orders[stream]), counts.delta,
                                   counts.tau, counts.fanout, counts.results, counts.work)
            got = self._profiler(i, fanouts)
        _, fn, stream, order, suffixes = got
        delta, work, fan, results = fn(rid, row, ts)
        return Observation(stream, order, delta, [],
                           [dict(zip(x, f)) for x, f in zip(suffixes, fan)], results, work)

    def _profiler(self, i: int, fanouts: bool) -> tuple:
        """(insertion plan, its compiled profiled pipeline, stream, order, the streams of
        order[j:] per position) for stream i, with or without fan-outs; kept until the
        plan changes."""
        stream = self._aliases[i]
        plan = self.plans[(stream, "insert")]
        fans = self._fan_probes(stream) if fanouts else None
        named = {f"F{j}_{m}": fp for j, fs in enumerate(fans or ()) for m, fp in enumerate(fs)}
        buckets = {name: c.buckets for name, c in self._by_name.items()}
        fn = compile_plan(self.query, plan, lambda name, what: self.index(named[name])
                          if what == "fan" else self._bind(plan, name, what),
                          buckets, counting=True, fans=fans).fn
        order = tuple(self.orders[stream])
        got = (plan, fn, stream, order, tuple(order[j:] for j in range(len(order))))
        self._profiled[(i, fanouts)] = got
        return got

    def _fan_probes(self, stream: str) -> list[tuple[Probe, ...]]:
        """Per position j of ``stream``'s order, a Probe of each stream not yet joined
        before it (``order[j:]``, the operator's own first), keyed on every predicate
        between it and the prefix: what A-Greedy's conditional fan-outs count."""
        order, q = self.orders[stream], self.query
        out = []
        for j in range(len(order)):
            prefix = [stream, *order[:j]]
            fans = []
            for s in order[j:]:
                positions, refs = probe_plan(q, s, prefix)
                slots = tuple((prefix.index(r.stream), q.columns[r.stream].index(r.column))
                              for r in refs)
                fans.append(Probe(s, j + 1, positions, slots,
                                  bool(positions) and self._scans(s, positions)))
            out.append(tuple(fans))
        return out

    def _fanouts(self, stream: str):
        """fn(level, k) for the interpreter: matches of each stream not yet joined before
        operator k for the composites reaching it (A-Greedy's conditional fan-outs).
        Indexes are resolved on first use after a plan change."""
        resolved: dict[int, list] = {}
        fans = self._fan_probes(stream)

        def fan(level, k):
            probes = resolved.get(k)
            if probes is None:
                probes = resolved[k] = [
                    (fp.stream, self._stem[fp.stream], self.index(fp) if fp.positions else None,
                     composite_key(fp.key)) for fp in fans[k]]
            out = {}
            for s, stem, idx, keyfn in probes:
                if idx is None:
                    out[s] = len(stem) * len(level)
                    continue
                n = 0
                for comp in level:
                    b = idx.get(keyfn(comp))
                    if b:
                        n += len(b)
                out[s] = n
            return out
        return fan

    # ----- checkpoints -----------------------------------------------------------------
    def plan_state(self) -> dict:
        return {"orders": {a: list(o) for a, o in self.orders.items()},
                "nested_loop": sorted(self.nested_loop)}

    def load(self, i: int, rows: dict, times: dict | None = None) -> None:
        """Restore stream i's window contents (rid -> row, rid -> event time) without
        producing output."""
        stem = self.stems[i]
        times = times or {}
        for rid, row in rows.items():
            stem.insert(rid, (*row,) if self._distinct else row, times.get(rid))

    # ----- introspection ---------------------------------------------------------------
    def state_tuples(self) -> int:
        return sum(len(s) for s in self.stems)

    def state_bytes(self) -> int:
        return sum(s.size_bytes() for s in self.stems)

    def describe(self) -> str:
        lines = [f"ΔR {s}: " + " ⋈ ".join(o) for s, o in self.orders.items()]
        if self.nested_loop:
            lines.append(f"nested-loop joins into {', '.join(sorted(self.nested_loop))}")
        return "\n".join(lines)


def _probes(ops):
    """Every Probe of a plan's operators, cached segments included."""
    for op in ops:
        if isinstance(op, Probe):
            yield op
        elif isinstance(op, plans.CacheLookup):
            yield from _probes(op.segment)


def join_columns(query: LogicalQuery, stream: str) -> list[str]:
    """Columns of ``stream`` that a join predicate probes: those equated to a column of
    another stream (in the stream's column order)."""
    probed = {c.column for cls in query.classes if any(x.stream != stream for x in cls)
              for c in cls if c.stream == stream}
    return [c for c in query.columns[stream] if c in probed]


def _check_nested_loop(query: LogicalQuery, item) -> None:
    """``STREAM`` or ``STREAM.COLUMN`` with COLUMN a join column of STREAM."""
    stream, dot, column = str(item).partition(".")
    if stream not in query.aliases:
        raise ValueError(f"nested-loop join {item!r}: no stream {stream} in the query "
                         f"(streams: {', '.join(query.aliases)})")
    if not dot:
        return
    cols = join_columns(query, stream)
    if column not in cols:
        raise ValueError(f"nested-loop join {item!r}: {stream}.{column} is not a join column; "
                         f"{stream}'s join columns are: {', '.join(cols) or 'none'}")


def _row_key(query: LogicalQuery, key, stream: str):
    """row -> cache key when ``stream``'s row alone determines it, else None."""
    positions = row_key_positions(query, key, stream)
    return None if positions is None else key_function(positions)


def _guard(query: LogicalQuery, pipeline: str, start: int, key, extra: frozenset[str]):
    """A globally-consistent X ⋈ Y cache with R_i itself in Y (§6 takes Y = every relation
    not in X; §7.4's (T ⋈ S) ⋈ R in ΔR's pipeline). Def. 6.1 joins X only with the other
    relations, so this is exact only when the entry for key u is kept while some R_i tuple
    has key u: then every X tuple joining a new R_i tuple (and Y) also joins an old one.
    That holds when the cache is probed straight from R_i (start 1, so u is a function of
    R_i's row) and R_i's predicates to the rest of Y use only key columns. Returns
    (R_i, key column positions in R_i, row -> key); the entry is evicted when the last R_i
    tuple with its key leaves."""
    if start != 1:
        raise ValueError(f"a cache with {pipeline} in Y must start at position 1 of "
                         f"{pipeline}'s pipeline")
    positions = row_key_positions(query, key, pipeline)
    key_classes = [next(c for c in query.classes if ref in c) for ref in key]
    for cls in query.classes:
        links_rest = any(c.stream in extra - {pipeline} for c in cls)
        if links_rest and any(c.stream == pipeline for c in cls) and cls not in key_classes:
            raise ValueError(f"{pipeline} joins Y on a column outside the cache key: "
                             "the entry cannot be kept exact")
    if positions is None:
        raise ValueError(f"the cache key is not a function of {pipeline}'s rows")
    # Positions in the cache key's order (not sorted): the index they name is keyed by
    # the same function as the entries, so the guard finds the row's own key.
    return (pipeline, positions, key_function(positions))
