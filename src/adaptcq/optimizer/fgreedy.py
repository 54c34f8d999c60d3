"""F-Greedy: the forward greedy ordering of join-ordering.txt §3.2 (Fig. 3).

In each iteration the candidate that generates the smallest number of intermediate tuples
is joined next, i.e. the stream s minimizing P_i = P_{i-1}·λ_s·W·σ_s (σ_s: the product of σ
between s and the prefix). Candidates are only the streams sharing a predicate with the
prefix while any remain (no needless cartesian product); ties go to the smaller name.
O(n²) per pipeline, O(n³) for an n-way MJoin.
"""

from __future__ import annotations

from adaptcq.optimizer.cost import Objective, admissible, check_objective, join_factor
from adaptcq.optimizer.graph import JoinGraph, OptimizerError


def fgreedy(graph: JoinGraph, start: str, *, objective: Objective = "cost") -> list[str]:
    """The forward greedy pipeline of ΔS_start (§3.2). The rule is the paper's — smallest
    intermediate result next — whatever the ``objective`` (accepted for a uniform
    signature)."""
    check_objective(objective)
    if start not in graph.rates:
        raise OptimizerError(f"unknown start stream {start!r} "
                             f"(streams: {', '.join(graph.streams)})")
    prefix = {start}
    remaining = set(graph.streams) - prefix
    order: list[str] = []
    while remaining:
        nxt = min(admissible(graph, prefix, remaining),
                  key=lambda s: (join_factor(graph, prefix, s), s))
        order.append(nxt)
        prefix.add(nxt)
        remaining.discard(nxt)
    return order
