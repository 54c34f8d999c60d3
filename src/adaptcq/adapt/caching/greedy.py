"""Appendix B's greedy algorithm (a-caching.txt Theorem 4.3): an O(log n) approximation of
the minimum total cost with shared caches, by the set-cover argument.

Every operator ⋈_{i_j} is also a zero-length cache with B = d_ij c_ij, n = 1 and L = 0, its
own group (§4.4). Each round, for each group G_r the smallest cost-rate

    D_r = min_{S ⊆ G_r} (L_r + Σ_{c∈S} B_c) / Σ_{c∈S} n_c

is attained by a prefix of G_r's caches sorted by B_c / n_c (Appendix B's claim), where
n_c counts the operators of c not yet covered. The group with the smallest D_r has its set
S_r chosen, the covered operators are deleted, and the rounds repeat until every operator is
covered. Overlapping choices are then resolved by keeping the cache covering the most
operators. A group's L_r is paid once: after a group was chosen its remaining caches are
offered with L_r = 0 (the objective counts L_r once per group).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from adaptcq.adapt.caching.model import (
    Candidate,
    Estimate,
    Operator,
    Selection,
    check_instance,
    group_costs,
    natural_key,
    proc,
    resolve_overlaps,
    shared_groups,
    sort_key,
)


def best_prefix(lead: float, caches: list[tuple[float, int]]) -> tuple[float, int]:
    """Appendix B's cost-rate of one group: ``caches`` are (B_c, n_c) with n_c > 0, sorted by
    B_c / n_c; returns (D_r, how many of them form S_r). Ties keep the shorter prefix."""
    best, size = float("inf"), 0
    num, den = lead, 0
    for i, (b, n) in enumerate(caches, start=1):
        num += b
        den += n
        rate = num / den
        if rate < best - 1e-12 * max(1.0, abs(best)) or size == 0:
            best, size = rate, i
    return best, size


def select_greedy(candidates: Iterable[Candidate], estimates: Mapping[Candidate, Estimate],
                  operator_costs: Mapping[Operator, float]) -> Selection:
    """Appendix B's greedy algorithm (see the module notes). Deterministic: among groups with
    equal D_r the one covering more operators, then the first in pipeline/position order."""
    cands = check_instance(candidates, estimates, operator_costs)
    lead = group_costs(cands, estimates)
    groups = shared_groups(sorted(cands, key=sort_key))
    b = {c: proc(c, estimates[c], operator_costs) for c in cands}
    uncovered: set[Operator] = set(operator_costs)
    paid: set = set()
    remaining = {g: list(members) for g, members in groups.items()}
    picked: list[Candidate] = []
    while uncovered:
        best: tuple | None = None
        for g, members in remaining.items():
            live = [(b[c], n, c) for c in members
                    if (n := sum(op in uncovered for op in c.operators)) > 0]
            if not live:
                continue
            live.sort(key=lambda t: (t[0] / t[1], sort_key(t[2])))
            rate, size = best_prefix(0.0 if g in paid else lead[g],
                                     [(bc, n) for bc, n, _ in live])
            covers = sum(n for _, n, _ in live[:size])
            rank = (rate, -covers, sort_key(live[0][2]))
            if best is None or _better(rank, best[0]):
                best = (rank, g, [c for _, _, c in live[:size]])
        # The operators themselves: zero-length caches, L = 0, n = 1.
        op = min(uncovered, key=lambda o: (operator_costs[o], natural_key(o[0]), o[1]))
        op_rank = (operator_costs[op], -1, (natural_key(op[0]), op[1]))
        if best is None or _better(op_rank, best[0]):
            uncovered.discard(op)
            continue
        _, g, chosen = best
        paid.add(g)
        for c in chosen:
            picked.append(c)
            remaining[g].remove(c)
            uncovered.difference_update(c.operators)
    return Selection.of(resolve_overlaps(picked), estimates, operator_costs, "greedy")


def _better(rank: tuple, other: tuple) -> bool:
    """Smaller cost-rate first (with a relative tolerance), then more operators covered."""
    a, b = rank[0], other[0]
    if abs(a - b) > 1e-12 * max(1.0, abs(a), abs(b)):
        return a < b
    return rank[1:] < other[1:]
