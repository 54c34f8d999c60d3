"""FAB: Forward And Backward greedy (join-ordering.txt §5, Algorithm 1).

The backward half is the *global impact ordering* (Algorithm 1, GImpactOrdering): among the
streams still in the join graph (S_start excepted) the one with the least global impact is
placed last, removed from the graph, and the process repeats for the next-to-last position
until all n−1 positions are filled. GlobalImpact(JG, S_q) (Algorithm 1, lines 9–15) is the
product of the rates of all remaining streams but S_q and of the selectivities "not related to
S_q" — those between two remaining streams other than S_q. (Lines 11–14 iterate over ordered
pairs (S_x, S_y), which would count each σ twice; we follow the prose, "the product of the
arrival rates of all remaining streams and the join selectivities not related to S_q", and
count each predicate once.)

Cartesian products: the backward choice is restricted to streams whose removal leaves the
remaining graph connected (never a cut vertex), so read forwards every stream shares a
predicate with its prefix. Such a stream always exists: a connected graph with two or more
streams has at least two vertices that are not cut vertices, and one of them is not S_start.

FAB runs the global impact ordering beside F-Greedy (§3.2) and keeps whichever pipeline is
cheaper under the objective (F-Greedy on a tie). O(n²) per pipeline, O(n³) per MJoin.
"""

from __future__ import annotations

from collections.abc import Iterable

from adaptcq.optimizer._components import by_components
from adaptcq.optimizer.cost import Objective, check_objective, pipeline_objective
from adaptcq.optimizer.fgreedy import fgreedy
from adaptcq.optimizer.graph import JoinGraph, OptimizerError


def global_impact(graph: JoinGraph, remaining: Iterable[str], stream: str) -> float:
    """GlobalImpact(JG, S_q) of Algorithm 1 on the join graph reduced to ``remaining``:
    Π λ_x over the remaining streams x ≠ S_q, times Π σ_xy over the predicates between two
    remaining streams x, y ≠ S_q (each predicate once)."""
    rest = set(remaining)
    if stream not in rest:
        raise OptimizerError(f"{stream!r} is not among the remaining streams {sorted(rest)}")
    rest.discard(stream)
    impact = 1.0
    for x in sorted(rest):
        impact *= graph.rates[x]
    for a, b, sigma in graph.edges():
        if a in rest and b in rest:
            impact *= sigma
    return impact


def _connected_without(graph: JoinGraph, nodes: set[str], removed: str, root: str) -> bool:
    """Whether the subgraph induced by ``nodes`` minus ``removed`` is connected."""
    seen = {root}
    todo = [root]
    while todo:
        for v in graph.neighbors(todo.pop()):
            if v in nodes and v != removed and v not in seen:
                seen.add(v)
                todo.append(v)
    return len(seen) == len(nodes) - 1


def _gimpact_connected(graph: JoinGraph, start: str) -> list[str]:
    remaining = set(graph.streams)
    tail: list[str] = []
    while len(remaining) > 1:
        # argmin GlobalImpact(S_q) = argmax λ_q·Π_{y remaining} σ_qy, because
        # GlobalImpact(S_q)·λ_q·Π_y σ_qy is the same product for every q (all remaining
        # rates and predicates); this form costs O(degree) instead of O(n + e).
        def weight(q: str) -> float:
            w = graph.rates[q]
            for y, sigma in graph.neighbor_selectivities(q):
                if y in remaining:
                    w *= sigma
            return w

        # least impact first (ties: smaller name); skip cut vertices, whose removal would
        # force a cartesian product
        ranked = sorted(remaining - {start}, key=lambda q: (-weight(q), q))
        last = next(q for q in ranked if _connected_without(graph, remaining, q, start))
        tail.append(last)
        remaining.discard(last)
    tail.reverse()
    return tail


def gimpact_order(graph: JoinGraph, start: str) -> list[str]:
    """The global impact ordering of ΔS_start (Algorithm 1, GImpactOrdering), filled from
    the last position backwards; ties go to the smaller name."""
    return by_components(graph, start, _gimpact_connected)


def fab(graph: JoinGraph, start: str, *, objective: Objective = "cost") -> list[str]:
    """The FAB pipeline of ΔS_start (§5): the cheaper under ``objective`` of the global
    impact ordering and the F-Greedy order."""
    check_objective(objective)
    forward = fgreedy(graph, start)
    backward = gimpact_order(graph, start)
    if backward == forward:
        return forward
    if pipeline_objective(graph, start, backward, objective) < \
            pipeline_objective(graph, start, forward, objective):
        return backward
    return forward
