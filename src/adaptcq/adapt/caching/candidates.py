"""Candidate caches for the current pipeline orders (a-caching.txt §3.2, §4.4, §6).

``orders`` maps every stream R_i to its pipeline order R_{i_1}, .., R_{i_{n-1}} (as
``adaptcq.engine.mjoin.MJoin.orders`` holds them); positions are 1-based.

Choices, read from the paper:

* **Size.** §4.4's Example 4.1 calls the segments whose relation sets have the prefix
  property — all of two or more relations — "the set of candidate caches with at least one
  join", so by default a candidate caches a join: its segment has at least two relations
  (``min_relations=2``). A one-operator cache C_ijj trivially satisfies Def. 3.2 (k − j = 0)
  but only duplicates the hash index of R_{i_j}; pass ``min_relations=1`` to include it.
* **Empty keys.** A segment with no join predicate to the streams before it would be cached
  under the empty key: one entry holding the whole segment join, i.e. a cartesian product
  with the prefix. Such segments are not candidates.
* **§6 caches X ⋈ Y** (Def. 6.1): X is a contiguous segment of ΔR_i's pipeline and Y the
  join of *all relations not in X* (§6: "we can always use a globally-consistent cache C_ijk
  based on X ⋈ Y where X = R_{i_j} ⋈ .. ⋈ R_{i_k} and Y is the join of all relations not in
  X"); then X ∪ Y is all n relations and the prefix invariant always holds. Y therefore
  contains R_i itself, as in §7.4's ``(T ⋈ S) ⋈ R`` cache in ΔR's pipeline. A segment whose
  relations already have the prefix property is a prefix candidate, not a §6 one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from adaptcq.adapt.caching.model import Candidate, shared_groups
from adaptcq.engine.rules import cache_key, check_order, prefix_invariant
from adaptcq.query.logical import ColumnRef, LogicalQuery

__all__ = [
    "check_orders",
    "enumerate_candidates",
    "global_candidate",
    "global_candidates",
    "prefix_candidates",
    "prefix_property",
    "segment_key",
    "shared_groups",
]


def check_orders(query: LogicalQuery, orders: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
    """Every stream of ``query`` has a pipeline listing each other stream once
    (``engine.rules.check_order`` per pipeline)."""
    aliases = query.aliases
    if set(orders) != set(aliases):
        missing = [a for a in aliases if a not in orders]
        unknown = sorted(set(orders) - set(aliases))
        raise ValueError(f"orders must give one pipeline per stream of the query; "
                         f"missing {missing}, unknown {unknown}")
    return {a: check_order(aliases, a, orders[a]) for a in aliases}


def prefix_property(orders: Mapping[str, Sequence[str]], relations: frozenset[str] | set[str]) -> bool:
    """Def. 3.2 on a relation set S: for every R_l ∈ S the first |S| − 1 join operators of
    ΔR_l's pipeline join with S − {R_l} (in some order). Then every update to the join of S
    is computed by regular join processing. (``engine.rules.prefix_invariant``: the rule
    the executor checks when it places a cache.)"""
    return prefix_invariant(orders, relations)


def segment_key(query: LogicalQuery, before: frozenset[str] | set[str],
                segment: frozenset[str] | set[str]) -> frozenset[ColumnRef]:
    """K_ijk (§3.2) as a candidate holds it: ``engine.rules.cache_key`` — the segment-side
    columns joined to the streams ``before`` the segment (R_i, R_{i_1}, .., R_{i_{j-1}}),
    one per attribute class — as a set. The executor keys the cache it places for the
    candidate by the same columns, so a candidate and its cache agree on K_ijk."""
    return frozenset(cache_key(query, before, segment))


def _segments(orders: Mapping[str, Sequence[str]], pipeline: str, size: int):
    order = orders[pipeline]
    for start in range(1, len(order) - size + 2):
        end = start + size - 1
        yield start, end, frozenset(order[start - 1:end]), frozenset([pipeline, *order[:start - 1]])


def prefix_candidates(query: LogicalQuery, orders: Mapping[str, Sequence[str]],
                      min_relations: int = 2) -> list[Candidate]:
    """All caches C_ijk satisfying the prefix invariant (Def. 3.2) with a nonempty key and
    at least ``min_relations`` relations in the segment (see the module notes), in pipeline
    order (the query's FROM order), then start, then end."""
    if min_relations < 1:
        raise ValueError(f"min_relations must be at least 1, got {min_relations}")
    orders = check_orders(query, orders)
    out = []
    for p in query.aliases:
        for size in range(min_relations, len(orders[p]) + 1):
            for start, end, seg, before in _segments(orders, p, size):
                if not prefix_property(orders, seg):
                    continue
                key = segment_key(query, before, seg)
                if key:
                    out.append(Candidate(p, start, end, seg, key))
    out.sort(key=lambda c: (query.aliases.index(c.pipeline), c.start, c.end))
    return out


def global_candidate(query: LogicalQuery, orders: Mapping[str, Sequence[str]], pipeline: str,
                     start: int, end: int, extra: Sequence[str] | frozenset[str] | None = None
                     ) -> Candidate:
    """The globally-consistent cache X ⋈ Y of §6 (Def. 6.1) for the segment X at positions
    ``start..end`` of ``pipeline``'s order. ``extra`` is Y; by default all relations not in X
    (which always works). Raises ValueError unless Y is nonempty, disjoint from X, X ∪ Y has
    the prefix property (Def. 3.2) and the key is nonempty."""
    orders = check_orders(query, orders)
    order = orders[pipeline]
    if not 1 <= start <= end <= len(order):
        raise ValueError(f"positions {start}..{end} are not a segment of ΔR {pipeline}'s "
                         f"pipeline (1..{len(order)})")
    seg = frozenset(order[start - 1:end])
    y = frozenset(query.aliases) - seg if extra is None else frozenset(extra)
    unknown = y - set(query.aliases)
    if unknown:
        raise ValueError(f"Y names unknown streams {sorted(unknown)}")
    if not y or y & seg:
        raise ValueError("Y must be nonempty and disjoint from the segment X (§6)")
    if not prefix_property(orders, seg | y):
        raise ValueError(f"X ∪ Y = {sorted(seg | y)} does not satisfy the prefix invariant "
                         f"(Def. 3.2), so updates to X ⋈ Y are not computed by the pipelines")
    key = segment_key(query, frozenset([pipeline, *order[:start - 1]]), seg)
    if not key:
        raise ValueError(f"segment {sorted(seg)} has no join predicate with the streams "
                         f"before it in ΔR {pipeline}'s pipeline (empty cache key)")
    return Candidate(pipeline, start, end, seg, key, kind="global", extra=y)


def global_candidates(query: LogicalQuery, orders: Mapping[str, Sequence[str]], m: int,
                      min_relations: int = 2) -> list[Candidate]:
    """§6's quota of globally-consistent candidates.

    With p prefix candidates: none if p ≥ m; else m − p caches X ⋈ Y (Y = all relations
    not in X), taking first those where X is all but one relation (|X| = n − 1: the whole
    pipeline of the one relation left out, so at most n of them), then all but two
    relations, and so on down to ``min_relations``. Segments whose relations have the
    prefix property (prefix candidates, or excluded for an empty key) and empty-key segments
    are skipped. Within one size the paper selects "arbitrarily" once the quota is reached;
    here deterministically: pipelines in the query's FROM order, then by start position.
    """
    if m < 0:
        raise ValueError(f"the candidate quota m must be nonnegative, got {m}")
    orders = check_orders(query, orders)
    quota = m - len(prefix_candidates(query, orders, min_relations))
    out: list[Candidate] = []
    n = len(query.aliases)
    for size in range(n - 1, min_relations - 1, -1):
        if quota <= 0:
            break
        for p in query.aliases:
            for start, end, seg, before in _segments(orders, p, size):
                if quota <= 0:
                    break
                if prefix_property(orders, seg) or not segment_key(query, before, seg):
                    continue
                out.append(global_candidate(query, orders, p, start, end))
                quota -= 1
    return out


def enumerate_candidates(query: LogicalQuery, orders: Mapping[str, Sequence[str]],
                         m: int | None = None, min_relations: int = 2) -> list[Candidate]:
    """The candidates A-Caching chooses from: the prefix candidates (§4.4), plus, when a
    quota ``m`` is given (§6), the globally-consistent ones that fill it."""
    out = prefix_candidates(query, orders, min_relations)
    if m is not None:
        out += global_candidates(query, orders, m, min_relations)
    return out
