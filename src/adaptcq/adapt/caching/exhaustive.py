"""Exhaustive cache selection over the 2^m subsets of the candidates
(a-caching.txt §4.4 last paragraph: "negligible for n ≤ 6"; §6: the only algorithm for
globally-consistent caches, whose selection problem is as hard as independent set).

Depth-first over the candidates; a branch that would add a cache overlapping one already
chosen is pruned at once, and so is a branch whose value plus every remaining positive
benefit cannot beat the best found (maintenance costs are nonnegative). Maximizes the net
benefit, i.e. minimizes the total cost (the two differ by a constant; see ``model``).
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
    sort_key,
)

MAX_CANDIDATES = 22
"""Largest m accepted: 2^22 ≈ 4 million subsets is the ceiling for an adaptive step."""


def select_exhaustive(candidates: Iterable[Candidate], estimates: Mapping[Candidate, Estimate],
                      operator_costs: Mapping[Operator, float],
                      max_candidates: int = MAX_CANDIDATES) -> Selection:
    """The optimal nonoverlapping subset (any candidates: shared, §6, overlapping).

    Raises ValueError above ``max_candidates`` (default 22) candidates. Ties keep the
    subset found first, searching "without C" before "with C" in pipeline/position order,
    so a cache is only chosen when it strictly improves the net benefit."""
    cands = sorted(check_instance(candidates, estimates, operator_costs), key=sort_key)
    m = len(cands)
    if m > max_candidates:
        raise ValueError(f"exhaustive cache selection over {m} candidates (2^{m} subsets) "
                         f"refused; the limit is {max_candidates} — use the tree, greedy or "
                         f"lp algorithm, or a smaller quota m (§6)")
    costs = group_costs(cands, estimates)
    benefit = [estimates[c].benefit for c in cands]
    ops = [frozenset(c.operators) for c in cands]
    groups = [c.group for c in cands]
    # optimistic[i]: the most the candidates i.. can still add.
    optimistic = [0.0] * (m + 1)
    for i in range(m - 1, -1, -1):
        optimistic[i] = optimistic[i + 1] + max(0.0, benefit[i])

    best_value = 0.0
    best: list[int] = []
    chosen: list[int] = []
    paid: dict = {}

    def search(i: int, value: float, used: frozenset) -> None:
        nonlocal best_value, best
        if value > best_value + 1e-12 * max(1.0, abs(best_value)):
            best_value, best = value, list(chosen)
        if i == m or value + optimistic[i] <= best_value:
            return
        search(i + 1, value, used)
        if ops[i] & used:
            return
        g = groups[i]
        new_group = paid.get(g, 0) == 0
        paid[g] = paid.get(g, 0) + 1
        chosen.append(i)
        search(i + 1, value + benefit[i] - (costs[g] if new_group else 0.0), used | ops[i])
        chosen.pop()
        paid[g] -= 1

    search(0, 0.0, frozenset())
    return Selection.of((cands[i] for i in best), estimates, operator_costs, "exhaustive")
