"""MJoin executor (a-caching.txt §3.1; Viglas et al. [30]).

One pipeline per stream R_i: an order R_i1, ..., R_i(n-1) of the other streams. An update
r in ΔR_i is joined with the other n-1 SteMs in that order, each join probing a hash index
with all predicates between the joined relation and the prefix; the result tuples are
insertions (or deletions) to the n-way join. Then R_i's SteM is updated. No join
subresult is kept, so a pipeline can be re-ordered between any two updates without any
effect on results.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from time import perf_counter

from adaptcq.engine.cache import EMPTY, JoinCache
from adaptcq.engine.interp import Observation
from adaptcq.engine.compile import (
    compile_function,
    composite_key,
    key_source,
    probe_plan,
    projection_source,
)
from adaptcq.query.logical import ColumnRef, LogicalQuery
from adaptcq.state.stem import ScanIndex, SteM


def connected_order(query: LogicalQuery, start: str) -> list[str]:
    """A pipeline order that never takes a cartesian product while a stream connected to
    the prefix remains: repeatedly the first stream in FROM order adjacent to the prefix."""
    g = query.join_graph
    prefix, rest = [start], [a for a in query.aliases if a != start]
    while rest:
        nxt = next((a for a in rest if any(g.has_edge(a, p) for p in prefix)), rest[0])
        prefix.append(nxt)
        rest.remove(nxt)
    return prefix[1:]


def check_order(query: LogicalQuery, start: str, order: Sequence[str]) -> list[str]:
    others = sorted(a for a in query.aliases if a != start)
    if sorted(order) != others:
        raise ValueError(
            f"pipeline order for {start} must list each of {', '.join(others)} once, "
            f"got {', '.join(order) or 'nothing'}")
    return list(order)


class MJoin:
    """The MJoin executor over one SteM per stream.

    ``out`` receives output tuples ``(*select values, sign, ts)``. In append mode deletions
    only update the SteM (expiries emit nothing); in retract mode they run the pipeline
    and emit result deletions.
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
        unknown = sorted(set(orders or ()) - set(query.aliases))
        if unknown:
            raise ValueError(f"pipeline order for {', '.join(unknown)}: no stream "
                             f"{' or '.join(unknown)} in the query (streams: "
                             f"{', '.join(query.aliases)})")
        self.query = query
        self._aliases = query.aliases
        self.retract = mode == "retract"
        self.stems = [SteM(a, query.columns[a]) for a in query.aliases]
        self.out = [] if out is None else out
        self._emit = self.out.append
        self.orders: dict[str, list[str]] = {}
        self._pipelines: list = [None] * len(self.stems)     # insertions (with CacheUpdates)
        self._del_pipelines: list = [None] * len(self.stems)  # deletions (retract mode)
        self._profile_cache: dict = {}
        # Caches (a-caching.txt §3.2): placements per pipeline, the shared cache objects,
        # and for each stream the caches holding its rows (evicted on its deletions).
        self.placements: dict[str, list[tuple[int, int, JoinCache]]] = {
            a: [] for a in query.aliases}
        self.caches: dict[tuple, JoinCache] = {}
        # Probe-key observers (App. A: a CacheLookup that only watches the probe stream of
        # a cache not in use, for its Bloom-filter miss estimate): (pipeline, start) -> fns.
        self.observers: dict[tuple[str, int], list] = {}
        self._member_caches: list[list[JoinCache]] = [[] for _ in query.aliases]
        # While caches exist, every SteM row is a distinct object (see ``_rebuild``).
        self._distinct = False
        for a in query.aliases:
            self.orders[a] = check_order(query, a, (orders or {}).get(a)
                                         or connected_order(query, a))
        self._rebuild()

    def set_emit(self, emit) -> None:
        """Where result tuples go (``out.append`` by default; a driver may bound them)."""
        self._emit = emit

    # ----- plan ------------------------------------------------------------------------
    def set_order(self, stream: str, order: Sequence[str]) -> None:
        """Re-order ``stream``'s pipeline; valid between any two updates. The caches used
        in that pipeline are removed, and so is any cache elsewhere whose prefix invariant
        the new order breaks (a-caching.txt §4.5 step 5)."""
        self.orders[stream] = check_order(self.query, stream, order)
        self.placements[stream] = []
        self.observers = {k: v for k, v in self.observers.items() if k[0] != stream}
        for pipeline, placed in self.placements.items():
            self.placements[pipeline] = [
                (j, k, c) for j, k, c in placed
                if prefix_invariant(self.orders, c.members + tuple(sorted(c.extra)))]
        self._rebuild()

    def _rebuild(self) -> None:
        """Recompile every pipeline for the current orders and caches; drop indexes and
        caches no longer used."""
        self._profile_cache.clear()  # it holds index dicts that a re-order may drop
        used = {c for placed in self.placements.values() for _, _, c in placed}
        for key in [k for k, c in self.caches.items() if c not in used]:
            self.caches.pop(key).clear()
        for c in self.caches.values():
            c.users = {p for p, placed in self.placements.items()
                       if any(x is c for _, _, x in placed)}
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
        for i, a in enumerate(self.query.aliases):
            self._pipelines[i] = self._compile(a, self.orders[a], "insert")
            self._del_pipelines[i] = self._compile(
                a, self.orders[a], "delete" if self.retract else "maintain")
        self._drop_unused_indexes()

    def _updates_in(self, start: str, prefix_only: bool = False) -> dict[int, list[JoinCache]]:
        """CacheUpdate operators of ``start``'s pipeline: for each used cache whose
        Z = X ∪ Y holds ``start``, one after the first |Z| - 1 joins (§3.2, §6)."""
        ups: dict[int, list[JoinCache]] = {}
        for c in self.caches.values():
            z = set(c.members) | c.extra
            if start in z and not (prefix_only and c.extra):
                ups.setdefault(len(z) - 1, []).append(c)
        return ups

    def _compile(self, start: str, order: list[str], kind: str):
        """Nested loops over index buckets (see ``engine.compile``), with CacheLookup
        before each cached segment and CacheUpdate operators where the caches need them.

        ``kind``: "insert" (CacheUpdates insert), "delete" (retract mode: CacheUpdates of
        prefix-invariant caches delete), "maintain" (append mode: a deletion emits nothing,
        so only the joins up to the last CacheUpdate run; None when there is none)."""
        q = self.query
        ups = self._updates_in(start, prefix_only=kind != "insert")
        copy = kind == "insert" and bool(self.caches)
        if kind == "maintain":
            if not ups:
                return None
            order = order[:max(ups)]
        var = {start: "v0"}

        def resolve(ref: ColumnRef) -> str:
            return f"{var[ref.stream]}[{q.columns[ref.stream].index(ref.column)}]"

        ns: dict = {}
        lines = ["def pipeline(v0, sign, ts, emit):"]
        ind = "    "
        if copy:  # a distinct row object (see ``_rebuild``); returned for the SteM insert
            lines.append(f"{ind}v0 = (*v0,)")
        prefix = [start]
        segments = {} if kind == "maintain" else {j: (k, c) for j, k, c in self.placements[start]}

        def cache_updates(position: int, ind: str) -> None:
            for c in ups.get(position, ()):
                name = f"C{id(c)}"
                ns[name], ns[name + "T"] = c, c.table
                ids = "(" + "".join(f"id({var[m]}), " for m in c.members) + ")"
                comp = "(" + "".join(f"{var[m]}, " for m in c.members) + ")"
                if kind != "insert":  # delete(u, r), inlined (prefix-invariant caches)
                    lines.extend([f"{ind}u = {_key_src(c.key, resolve)}",
                                  f"{ind}e = {name}T[hash(u) % {c.buckets}]",
                                  f"{ind}if e is not None and e[0] == u:",
                                  f"{ind}    e[1].pop({ids}, None)"])
                elif c.rev_positions:  # rows that need the reverse map: the method does it
                    lines.append(f"{ind}{name}.add({_key_src(c.key, resolve)}, {ids}, {comp})")
                else:  # insert(u, r), inlined: only if the cache holds key u (§3.2)
                    lines.extend([f"{ind}u = {_key_src(c.key, resolve)}",
                                  f"{ind}e = {name}T[hash(u) % {c.buckets}]",
                                  f"{ind}if e is not None and e[0] == u:",
                                  f"{ind}    e[1][{ids}] = {comp}"])

        def probe_loop(k: int, s: str, ind: str) -> str:
            stem = self.stems[q.aliases.index(s)]
            positions, refs = probe_plan(q, s, prefix)
            if positions:
                ns[f"I{k}"] = self._index_for(stem, positions)
                lines.append(f"{ind}b{k} = I{k}.get({key_source(refs, resolve)})")
                lines.append(f"{ind}if b{k}:")
                ind += "    "
                lines.append(f"{ind}for v{k} in b{k}.values():")
            else:  # cartesian product step: only when forced by a given order
                ns[f"R{k}"] = stem.rows
                lines.append(f"{ind}for v{k} in R{k}.values():")
            var[s] = f"v{k}"
            prefix.append(s)
            return ind + "    "

        def observe(position: int, ind: str) -> None:
            for n, (key, fn) in enumerate(self.observers.get((start, position), ())):
                ns[f"O{position}_{n}"] = fn
                probe = _key_src(key, lambda ref: resolve(_probe_ref(q, ref, prefix)))
                lines.append(f"{ind}O{position}_{n}({probe})")

        cache_updates(0, ind)
        k = 1
        while k <= len(order):
            if kind == "insert":
                observe(k, ind)
            if k in segments:  # CacheLookup, the segment on a miss, CacheUpdate of create
                end, c = segments[k]
                name = f"C{id(c)}"
                ns[name], ns[name + "T"], ns[name + "N"] = c, c.table, c.counts
                ns["EMPTY"] = EMPTY
                probe = _key_src(c.key, lambda ref: resolve(_probe_ref(q, ref, prefix)))
                null = "u is None" if len(c.key) == 1 else "None in u"
                # probe(u), inlined; a NULL key joins nothing (an empty hit)
                lines += [f"{ind}u = {probe}",
                          f"{ind}if {null}:", f"{ind}    seg = EMPTY",
                          f"{ind}else:",
                          f"{ind}    e = {name}T[hash(u) % {c.buckets}]",
                          f"{ind}    if e is not None and e[0] == u:",
                          f"{ind}        seg = e[1]",
                          f"{ind}        {name}N[0] += 1",
                          f"{ind}    else:",
                          f"{ind}        seg = None",
                          f"{ind}if seg is None:", f"{ind}    seg = {{}}"]
                inner = ind + "    "
                for pos in range(k, end + 1):
                    inner = probe_loop(pos, order[pos - 1], inner)
                members = [var[m] for m in c.members]
                lines.append(f"{inner}seg[({''.join(f'id({v}), ' for v in members)})] = "
                             f"({''.join(f'{v}, ' for v in members)})")
                # create(u, v), inlined (direct-mapped: replaces the slot's entry); the
                # method is needed only to record rows in the reverse map.
                if c.rev_positions:
                    lines.append(f"{ind}    {name}.create(u, seg)")
                else:
                    lines += [f"{ind}    if {'u is not None' if len(c.key) == 1 else 'None not in u'}:",
                              f"{ind}        {name}T[hash(u) % {c.buckets}] = (u, seg)",
                              f"{ind}    {name}N[1] += 1"]
                lines.append(f"{ind}for {''.join(f'{v}, ' for v in members)} in seg.values():")
                ind += "    "
                k = end + 1
            else:
                ind = probe_loop(k, order[k - 1], ind)
                k += 1
            cache_updates(k - 1, ind)
        if kind == "maintain":
            lines.append(f"{ind}pass")
        else:
            lines.append(f"{ind}emit(({projection_source(q, resolve)} sign, ts))")
        if kind == "insert":
            lines.append("    return v0")
        return compile_function("pipeline", lines, ns)

    def _index_for(self, stem: SteM, positions: tuple[int, ...]):
        """The hash index a join into ``stem`` probes (a scan for a nested-loop stream)."""
        return ScanIndex(stem, positions) if self._scans(stem, positions) \
            else stem.index(positions)

    def _scans(self, stem: SteM, positions: tuple[int, ...]) -> bool:
        return stem.name in self.nested_loop or any(
            f"{stem.name}.{stem.columns[p]}" in self.nested_loop for p in positions)

    def _drop_unused_indexes(self) -> None:
        used: dict[str, set] = {a: set() for a in self.query.aliases}
        for start, order in self.orders.items():
            prefix = [start]
            for s in order:
                positions, _ = probe_plan(self.query, s, prefix)
                if positions and not self._scans(self.stems[self._aliases.index(s)], positions):
                    used[s].add(positions)
                prefix.append(s)
        for c in self.caches.values():
            if c.guard:
                used[c.guard[0]].add(c.guard[1])
        for stem in self.stems:
            for positions in stem.indexed:
                if positions not in used[stem.name]:
                    stem.drop_index(positions)

    # ----- caches (the mechanism; choosing them is adapt/caching's job) -------------------
    def place_cache(self, pipeline: str, start: int, end: int,
                    extra: frozenset[str] | set[str] = frozenset(),
                    buckets: int = 1024) -> JoinCache:
        """Use a cache over operators ``start``..``end`` (1-based) of ``pipeline``'s order:
        a prefix-invariant cache (Def. 3.2) or, with ``extra`` = Y, a globally-consistent
        X ⋈ Y cache (§6, Def. 6.1). A cache with the same segment, key and Y already in use
        in another pipeline is shared (Def. 4.1). It starts empty and fills on misses;
        results are unaffected. Raises ValueError when the invariant does not hold, or the
        placement overlaps a cache or a CacheUpdate operator of this pipeline."""
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
            what = "prefix invariant (Def. 3.2)" if not extra else                 "prefix invariant of X ∪ Y (§6)"
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
        # CacheUpdate operators must not sit inside a cached segment of the same pipeline.
        trial = dict(self.caches)
        trial[ident] = cache
        for p, placed in self.placements.items():
            segs = placed + ([(start, end, cache)] if p == pipeline else [])
            for c in trial.values():
                zc = set(c.members) | c.extra
                pos = len(zc) - 1
                if p in zc and any(j <= pos < k for j, k, _ in segs):
                    raise ValueError(f"the CacheUpdate of {c.name} in {p}'s pipeline would "
                                     "sit inside a cached segment")
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
        ColumnRefs as ``cache_key`` gives them). One recompilation for all of them."""
        for pipeline, start, key, fn in watches:
            self.observers.setdefault((pipeline, start), []).append((tuple(key), fn))
        self._recompile_inserts({p for p, *_ in watches})

    def clear_observers(self) -> None:
        if self.observers:
            pipelines = {p for p, _ in self.observers}
            self.observers.clear()
            self._recompile_inserts(pipelines)

    def _recompile_inserts(self, pipelines) -> None:
        """Observers live only in the insertion pipelines (and the profiled path)."""
        self._profile_cache.clear()
        for a in pipelines:
            i = self._aliases.index(a)
            self._pipelines[i] = self._compile(a, self.orders[a], "insert")

    def resize_cache(self, cache: JoinCache, buckets: int) -> None:
        """Change a cache's bucket count (§3.3: chosen from its estimated size; §5)."""
        cache.resize(buckets)
        self._rebuild()

    def cache_bytes(self) -> int:
        return sum(c.size_bytes() for c in self.caches.values())

    # ----- updates ---------------------------------------------------------------------
    def insert(self, i: int, rid: int, row: tuple, ts) -> None:
        # The pipeline returns the row object to store (a copy while caches exist).
        self.stems[i].insert(rid, self._pipelines[i](row, 1, ts, self._emit))

    def delete(self, i: int, rid: int, ts) -> None:
        row = self.stems[i].delete(rid)
        for c in self._member_caches[i]:
            c.evict_row(self._aliases[i], row)
        pipeline = self._del_pipelines[i]
        if pipeline is not None:
            pipeline(row, -1, ts, self._emit)
        # §6 with R_i in Y: no R_i tuple left for the key. After the deletion pipeline,
        # whose CacheLookup may (re)create the entry for the deleted row's key on a miss:
        # evicting first let a retraction leave an entry that no R_i tuple guards, and
        # X tuples arriving while no R_i tuple has the key never reach it (a lost result).
        for c in self._guarded[i]:
            _, positions, keyfn = c.guard
            u = keyfn(row)
            if u is not None and not self.stems[i].index(positions).get(u):
                c.evict_key(u)

    # ----- profiling (the mechanism; statistics and policies live in stats/ and adapt/) --
    def profile_insert(self, i: int, rid: int, row: tuple, ts, fanouts: bool = True) -> Observation:
        """Process an insertion fully, breadth-first, measuring each operator.

        Gives the same output as ``insert``; slower, so drivers use it for a sample of
        tuples only (a-caching.txt App. A: profile with probability p_i, no caches used)."""
        if self._distinct:  # see ``_rebuild``
            row = (*row,)
        obs = self._profiled(i, row, 1, ts, fanouts)
        self.stems[i].insert(rid, row)
        return obs

    def _profiled(self, i: int, row: tuple, sign: int, ts, fanouts: bool) -> Observation:
        q = self.query
        start = q.aliases[i]
        order = self.orders[start]
        steps, project, ups, watchers = self._profile_plan(start)
        level = [(row,)]
        delta, tau, fan, work = [], [], [], []
        remaining = list(order)
        if sign > 0:
            _apply_updates(ups.get(0, ()), level)
        for k, (stem, idx, keyfn) in enumerate(steps):
            for fn, okey in watchers.get(k + 1, ()) if sign > 0 else ():
                for comp in level:  # probe-key observers see profiled tuples too
                    fn(okey(comp))
            if fanouts:
                fan.append(self._fanouts(level, start, order[:k], remaining))
            t0 = perf_counter()
            nxt = []
            if idx is None:
                rows = stem.rows.values()
                for comp in level:
                    nxt.extend([comp + (v,) for v in rows])
            else:
                for comp in level:
                    key = keyfn(comp)
                    b = idx.get(key) if key is not None else None
                    if b:
                        nxt.extend([comp + (v,) for v in b.values()])
            tau.append(perf_counter() - t0)
            delta.append(len(level))
            work.append(len(level) + len(nxt))
            remaining.pop(0)
            level = nxt
            if sign > 0:
                _apply_updates(ups.get(k + 1, ()), level)
        for comp in level:
            project(comp, sign, ts, self._emit)
        return Observation(start, tuple(order), delta, tau, fan, len(level), work)

    def _profile_plan(self, start: str):
        """Per operator: (SteM, index or None for a cartesian step, key of a composite),
        and the projection of a full composite (in pipeline order)."""
        cached = self._profile_cache.get(start)
        order = tuple(self.orders[start])
        if cached is not None and cached[0] == order:
            return cached[1:]
        q = self.query
        prefix = [start]
        steps = []
        for s in order:
            positions, refs = probe_plan(q, s, prefix)
            stem = self.stems[q.aliases.index(s)]
            slots = [(prefix.index(r.stream), q.columns[r.stream].index(r.column)) for r in refs]
            steps.append((stem, self._index_for(stem, positions) if positions else None,
                          composite_key(slots)))
            prefix.append(s)

        def resolve(ref: ColumnRef) -> str:
            return f"c[{prefix.index(ref.stream)}][{q.columns[ref.stream].index(ref.column)}]"

        project = compile_function("project", [
            "def project(c, sign, ts, emit):",
            f"    emit(({projection_source(q, resolve)} sign, ts))"], {})
        # CacheUpdate operators at each position: (cache, key of a composite, member slots)
        ups = {pos: [(c, composite_key([(prefix.index(r.stream), q.columns[r.stream].index(r.column))
                                    for r in c.key]),
                      tuple(prefix.index(m) for m in c.members)) for c in caches]
               for pos, caches in self._updates_in(start).items()}
        watchers = {}
        for (pipeline, position), obs in self.observers.items():
            if pipeline == start and position <= len(order):
                pre = prefix[:position]
                watchers[position] = [
                    (fn, composite_key([(pre.index(r.stream), q.columns[r.stream].index(r.column))
                                    for r in (_probe_ref(q, ref, pre) for ref in key)]))
                    for key, fn in obs]
        self._profile_cache[start] = (order, steps, project, ups, watchers)
        return steps, project, ups, watchers

    def _fanouts(self, level, start, joined, remaining) -> dict[str, int]:
        """Matches of each remaining stream for the tuples at this point of the pipeline.
        The probe plans are kept per (pipeline, prefix) until the next plan change."""
        key = ("fanouts", start, tuple(joined))
        plans = self._profile_cache.get(key)
        if plans is None:
            q = self.query
            prefix = [start, *joined]
            plans = []
            for s in remaining:
                positions, refs = probe_plan(q, s, prefix)
                stem = self.stems[q.aliases.index(s)]
                plans.append((s, stem, self._index_for(stem, positions) if positions else None,
                              composite_key([(prefix.index(r.stream),
                                          q.columns[r.stream].index(r.column)) for r in refs])
                              if positions else None))
            self._profile_cache[key] = plans
        out = {}
        for s, stem, idx, keyfn in plans:
            if idx is None:
                out[s] = len(stem) * len(level)
                continue
            n = 0
            for comp in level:
                k = keyfn(comp)
                b = idx.get(k) if k is not None else None
                if b:
                    n += len(b)
            out[s] = n
        return out

    # ----- checkpoints -----------------------------------------------------------------
    def plan_state(self) -> dict:
        return {"orders": {a: list(o) for a, o in self.orders.items()},
                "nested_loop": sorted(self.nested_loop)}

    def load(self, i: int, rows: dict) -> None:
        """Restore stream i's window contents (rid -> row) without producing output."""
        stem = self.stems[i]
        for rid, row in rows.items():
            stem.insert(rid, (*row,) if self._distinct else row)

    # ----- introspection ---------------------------------------------------------------
    def state_tuples(self) -> int:
        return sum(len(s) for s in self.stems)

    def state_bytes(self) -> int:
        return sum(s.size_bytes() for s in self.stems)

    def describe(self) -> str:
        if self.nested_loop:
            return "\n".join([*(f"ΔR {s}: " + " ⋈ ".join(o) for s, o in self.orders.items()),
                              f"nested-loop joins into {', '.join(sorted(self.nested_loop))}"])
        return "\n".join(f"ΔR {s}: " + " ⋈ ".join(o) for s, o in self.orders.items())


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


def prefix_invariant(orders: dict[str, list[str]], z: Sequence[str]) -> bool:
    """Def. 3.2: for each R_l in Z, the first |Z| - 1 joins of ΔR_l's pipeline are with the
    other relations of Z (for a global cache, Z = X ∪ Y: §6)."""
    zs = set(z)
    return all(set(orders[s][:len(zs) - 1]) == zs - {s} for s in zs)


def cache_key(query: LogicalQuery, prefix: Sequence[str], members: Sequence[str]):
    """K: the join attributes between the relations before the segment and those in it,
    as segment-side columns, one per attribute class (equal within a segment tuple)."""
    key = []
    for cls in query.classes:
        if any(c.stream in prefix for c in cls):
            mine = sorted((c for c in cls if c.stream in members),
                          key=lambda c: (query.aliases.index(c.stream),
                                         query.columns[c.stream].index(c.column)))
            if mine:
                key.append(mine[0])
    return tuple(sorted(key, key=lambda c: (query.aliases.index(c.stream), c.column)))


def _probe_ref(query: LogicalQuery, ref: ColumnRef, prefix: Sequence[str]) -> ColumnRef:
    """A prefix column equated to key column ``ref`` (same attribute class)."""
    for cls in query.classes:
        if ref in cls:
            return min((c for c in cls if c.stream in prefix),
                       key=lambda c: (list(prefix).index(c.stream), c.column))
    raise ValueError(f"{ref} is not a join attribute")


def _key_src(key: Sequence[ColumnRef], resolve) -> str:
    if len(key) == 1:
        return resolve(key[0])
    return "(" + "".join(resolve(r) + ", " for r in key) + ")"


def _row_key(query: LogicalQuery, key: Sequence[ColumnRef], stream: str):
    """row -> cache key when ``stream``'s row alone determines it (each key column's class
    has a column of ``stream``), else None."""
    cols = query.columns[stream]
    positions = []
    for ref in key:
        cls = next(c for c in query.classes if ref in c)
        mine = [c for c in cls if c.stream == stream]
        if not mine:
            return None
        positions.append(cols.index(mine[0].column))
    if len(positions) == 1:
        (p,) = positions
        return lambda row: row[p]
    return lambda row, _ps=tuple(positions): tuple(row[p] for p in _ps)


def _apply_updates(ups, level) -> None:
    """CacheUpdate for composites of the profiled (breadth-first) path."""
    for cache, keyfn, slots in ups:
        for comp in level:
            part = tuple(comp[p] for p in slots)
            cache.add(keyfn(comp), tuple(map(id, part)), part)


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
    keyfn = _row_key(query, key, pipeline)
    key_classes = [next(c for c in query.classes if ref in c) for ref in key]
    for cls in query.classes:
        links_rest = any(c.stream in extra - {pipeline} for c in cls)
        if links_rest and any(c.stream == pipeline for c in cls) and cls not in key_classes:
            raise ValueError(f"{pipeline} joins Y on a column outside the cache key: "
                             "the entry cannot be kept exact")
    if keyfn is None:
        raise ValueError(f"the cache key is not a function of {pipeline}'s rows")
    cols = query.columns[pipeline]
    positions = tuple(sorted({cols.index(next(c for c in cls if c.stream == pipeline).column)
                              for cls in key_classes}))
    return (pipeline, positions, keyfn)
