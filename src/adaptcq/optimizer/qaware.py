"""Q-Aware: choose the ordering algorithm by the shape of the join graph
(join-ordering.txt §6, Table 2).

Linear, star and general acyclic join graphs are ordered by TreeOpt (§4, optimal,
O(n² log n)); cyclic ones, complete graphs included, by FAB (§5, near-optimal, O(n³)).
Detecting a cycle takes O(n + e). A disconnected graph without cycles (a forest) counts as
acyclic here.
"""

from __future__ import annotations

from adaptcq.optimizer.cost import Objective, check_objective
from adaptcq.optimizer.fab import fab
from adaptcq.optimizer.graph import JoinGraph
from adaptcq.optimizer.treeopt import treeopt


def qaware_algorithm(graph: JoinGraph) -> str:
    """The algorithm Q-Aware uses for ``graph``: "treeopt" or "fab" (Table 2)."""
    return "fab" if graph.has_cycle else "treeopt"


def qaware(graph: JoinGraph, start: str, *, objective: Objective = "cost") -> list[str]:
    """The Q-Aware pipeline of ΔS_start: TreeOpt on acyclic graphs, FAB on cyclic ones."""
    check_objective(objective)
    if qaware_algorithm(graph) == "treeopt":
        return treeopt(graph, start, objective=objective)
    return fab(graph, start, objective=objective)
