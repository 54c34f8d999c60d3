"""Join-subresult caches in MJoin pipelines (a-caching.txt §3.2, §3.3, §6).

A cache C_ijk sits in R_i's pipeline over the segment ⋈_ij .. ⋈_ik. Logically it holds pairs
(u, v): u a value of the cache key K_ijk (the join attributes between the relations before
the segment and those in it), v a set of tuples of the segment's join. Here:

- the store is a *direct-mapped* hash table (§3.3): a key hashes to one slot; a new key
  colliding with another simply replaces it (caches promise consistency, not completeness);
- v maps the identity of a segment tuple (the ``id`` of each of its base rows) to the tuple
  of base rows, in the canonical order of the segment's streams: references, never copies.
  So no two tuples of one SteM may be one Python object while caches exist: MJoin copies
  an arriving row then (a caller may pass one tuple object for two arrivals);
- *consistency* (Def. 3.1): v = σ_{K=u}(segment join) for the prefix-invariant kind; the
  *global-consistency invariant* (Def. 6.1) for a globally-consistent X ⋈ Y cache:
  σ_{K=u}(X) ⋉ Y ⊆ v ⊆ σ_{K=u}(X).

Maintenance. Insertions reach a cache through CacheUpdate operators placed in the pipelines
of the segment's streams (of X ∪ Y for a global cache) after their first |Z| - 1 joins, where
the prefix invariant (Def. 3.2) guarantees that the tuples passing are exactly the new
tuples of the join of Z; the cache adds their X part if it holds their key (``add``).
Deletions: a prefix-invariant cache is maintained by the same CacheUpdate operators run on
the deletion (in append mode a pipeline truncated after its last CacheUpdate). A
globally-consistent cache drops every cached segment tuple that holds the deleted base row
r (``evict_row``): the entry is found from r's own key columns where r has them, otherwise
through a reverse map from rows to keys. One with the pipeline's own stream R_i in Y also
drops the entry for key u when the last R_i tuple with key u leaves (``evict_key``), after
the deletion's own pipeline ran: that pipeline's CacheLookup may create the entry on a miss.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from operator import itemgetter

from adaptcq.engine.rules import is_null_key
from adaptcq.query.logical import ColumnRef

EMPTY: dict = {}


class JoinCache:
    """One cache (shared by every pipeline that uses it: Def. 4.1)."""

    def __init__(self, members: tuple[str, ...], extra: frozenset[str],
                 key: tuple[ColumnRef, ...], buckets: int,
                 row_keys: dict[str, Callable | None]):
        self.members = members          # X, canonical order (the query's FROM order)
        self.extra = extra              # Y (empty for the prefix-invariant kind)
        self.key = key                  # K: segment-side columns, one per attribute class
        self.buckets = max(1, int(buckets))
        self.table: list = [None] * self.buckets
        # For each member stream: row -> the cache key of every segment tuple holding the
        # row, or None when the row alone does not determine it (then: reverse map).
        self.row_keys = row_keys
        self.rev: dict[int, set] = {}
        # Only globally-consistent caches evict by row; prefix-invariant ones are maintained
        # by CacheUpdates on deletions too (§3.2), so they need no reverse map.
        self.rev_positions = [members.index(s) for s in members
                              if extra and row_keys.get(s) is None]
        # [hits, misses]: compiled pipelines count hits inline, ``create`` counts misses.
        self.counts = [0, 0]
        self.guard = None               # (R_i, positions, row -> key) when R_i is in Y

    @property
    def kind(self) -> str:
        return "global" if self.extra else "prefix"

    @property
    def name(self) -> str:
        core = "⋈".join(self.members)
        key = ",".join(str(k) for k in self.key)
        return f"C[{core}" + (f" ⋈ {'⋈'.join(sorted(self.extra))}" if self.extra else "") + \
            f" | {key}]"

    # ----- CacheLookup ---------------------------------------------------------------------
    # (Compiled pipelines inline the hit path of lookup and the whole of add; these
    # methods are the reference versions, used by the interpreter and the tests.)
    def lookup(self, u):
        """probe(u): the entry's tuples on a hit, None on a miss; a key with a NULL joins
        nothing, so it is an empty hit."""
        if is_null_key(u):
            return EMPTY
        e = self.table[hash(u) % self.buckets]
        if e is not None and e[0] == u:
            self.counts[0] += 1
            return e[1]
        return None

    def create(self, u, v: dict) -> None:
        """create(u, v) after a miss: direct-mapped, replacing whatever held the slot."""
        self.counts[1] += 1
        if is_null_key(u):
            return
        self.table[hash(u) % self.buckets] = (u, v)
        if self.rev_positions:
            self._remember(u, v.values())

    # ----- CacheUpdate -----------------------------------------------------------------------
    def add(self, u, ids: tuple, comp: tuple) -> None:
        """insert(u, r): add segment tuple r if the cache holds key u (idempotent: a global
        cache sees a segment tuple again for each new Y partner)."""
        e = self.table[hash(u) % self.buckets] if u is not None else None
        if e is not None and e[0] == u:
            e[1][ids] = comp  # assigning again is a no-op: idempotent for global caches
            if self.rev_positions:
                self._remember(u, (comp,))

    def remove(self, u, ids: tuple) -> None:
        """delete(u, r) of a prefix-invariant cache: drop segment tuple r from entry u
        (a deletion's CacheUpdate; compiled pipelines inline it)."""
        e = self.table[hash(u) % self.buckets] if u is not None else None
        if e is not None and e[0] == u:
            e[1].pop(ids, None)

    def evict_row(self, stream: str, row: tuple) -> None:
        """delete: drop every cached segment tuple that holds base row ``row``."""
        keyfn = self.row_keys.get(stream)
        if keyfn is not None:
            keys = (keyfn(row),)
        else:
            keys = self.rev.pop(id(row), ())
        p = self.members.index(stream)
        rid = id(row)
        for u in keys:
            if u is None:
                continue
            e = self.table[hash(u) % self.buckets]
            if e is not None and e[0] == u:
                v = e[1]
                for ids in [ids for ids in v if ids[p] == rid]:
                    del v[ids]

    def evict_key(self, u) -> None:
        """Drop the entry for key u (allowed at any time: caches need not be complete)."""
        slot = hash(u) % self.buckets
        e = self.table[slot]
        if e is not None and e[0] == u:
            self.table[slot] = None

    def _remember(self, u, comps) -> None:
        rev = self.rev
        for comp in comps:
            for p in self.rev_positions:
                s = rev.get(id(comp[p]))
                if s is None:
                    rev[id(comp[p])] = {u}
                else:
                    s.add(u)

    @property
    def entries(self) -> int:
        """Keys cached now (counted on demand: O(buckets))."""
        return len(self.table) - self.table.count(None)

    @property
    def tuples(self) -> int:
        """Segment tuples cached now (counted on demand: O(buckets), in C: an entry is
        a (key, dict) pair, never None)."""
        return sum(map(len, map(itemgetter(1), filter(None, self.table))))

    @property
    def probes(self) -> int:
        return self.counts[0] + self.counts[1]

    @property
    def hits(self) -> int:
        return self.counts[0]

    # ----- memory (§5) -----------------------------------------------------------------------
    def size_bytes(self) -> int:
        """Memory held: the slot array, each entry's dict, and per cached tuple its
        identity tuple and row-reference tuple (the base rows belong to the SteMs)."""
        n = len(self.members)
        per_tuple = 2 * (sys.getsizeof(()) + 8 * n) + 2 * 8  # ids, comp, dict slot
        per_entry = sys.getsizeof({}) + sys.getsizeof((0, 0)) + 64
        return sys.getsizeof(self.table) + self.entries * per_entry + self.tuples * per_tuple

    def resize(self, buckets: int) -> None:
        """Change the bucket count; entries whose slots collide are dropped (allowed).
        The executor recompiles its pipelines after this (they inline the bucket count)."""
        old = [e for e in self.table if e is not None]
        self.buckets = max(1, int(buckets))
        self.table = [None] * self.buckets
        self.rev.clear()
        hits, misses = self.counts
        for u, v in old:
            self.create(u, v)
        self.counts[:] = [hits, misses]

    def clear(self) -> None:
        """Empty the cache in place (compiled code keeps its reference to the table)."""
        self.table[:] = [None] * self.buckets
        self.rev.clear()

    @property
    def miss_rate(self) -> float:
        return 1.0 - self.hits / self.probes if self.probes else 1.0
