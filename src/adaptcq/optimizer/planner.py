"""One entry point for all orderings: a pipeline for one stream, or a whole MJoin plan.

A plan maps every stream S_k to the order of its pipeline ⋈_{S_k:1}, …, ⋈_{S_k:n-1}
(join-ordering.txt §2.1); its cost is Eq. 3. Each algorithm is a pure function
``(graph, start, *, objective) -> list[str]`` in its own module.
"""

from __future__ import annotations

from collections.abc import Callable

from adaptcq.optimizer.cost import Objective, check_objective
from adaptcq.optimizer.dmjoin import dmjoin
from adaptcq.optimizer.fab import fab
from adaptcq.optimizer.fgreedy import fgreedy
from adaptcq.optimizer.graph import JoinGraph, OptimizerError
from adaptcq.optimizer.qaware import qaware
from adaptcq.optimizer.treeopt import treeopt

Ordering = Callable[..., list[str]]

#: The paper's algorithms by name: DMJoin (§3.1), F-Greedy (§3.2), TreeOpt (§4), FAB (§5),
#: Q-Aware (§6).
ALGORITHMS: tuple[str, ...] = ("dmjoin", "fgreedy", "treeopt", "fab", "qaware")

_FUNCTIONS: dict[str, Ordering] = {
    "dmjoin": dmjoin,
    "fgreedy": fgreedy,
    "treeopt": treeopt,
    "fab": fab,
    "qaware": qaware,
}


def ordering(algorithm: str) -> Ordering:
    """The ordering function called ``algorithm``."""
    try:
        return _FUNCTIONS[algorithm]
    except KeyError:
        raise OptimizerError(f"unknown ordering algorithm {algorithm!r}; choose one of "
                             f"{', '.join(ALGORITHMS)}") from None


def order_pipeline(graph: JoinGraph, start: str, algorithm: str = "qaware", *,
                   objective: Objective = "cost") -> list[str]:
    """The order in which ΔS_start probes the other streams' states, by ``algorithm``."""
    fn = ordering(algorithm)
    check_objective(objective)
    return fn(graph, start, objective=objective)


def plan(graph: JoinGraph, algorithm: str = "qaware", *,
         objective: Objective = "cost") -> dict[str, list[str]]:
    """A pipeline for every stream of ``graph`` (an n-way MJoin plan), by ``algorithm``."""
    fn = ordering(algorithm)
    check_objective(objective)
    return {s: fn(graph, s, objective=objective) for s in graph.streams}
