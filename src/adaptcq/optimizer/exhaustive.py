"""Exhaustive enumeration of cartesian-free pipelines: the reference DMJoin is tested against.

Every order of the other streams in which each stream shares a predicate with the prefix
(or, once the prefix's component is exhausted, any stream) is generated and costed with
Eq. 2 (join-ordering.txt §2.2) or the intermediate-tuple count of §3.1/§4. O((n-1)!) time:
for tests and tiny graphs only.
"""

from __future__ import annotations

from collections.abc import Iterator

from adaptcq.optimizer.cost import Objective, admissible, check_objective, pipeline_objective
from adaptcq.optimizer.graph import JoinGraph, OptimizerError

#: exhaustive enumeration refuses graphs with more streams than this.
MAX_STREAMS = 10


def connected_orders(graph: JoinGraph, start: str) -> Iterator[list[str]]:
    """All cartesian-free pipelines of ΔS_start, in lexicographic order."""
    if start not in graph.rates:
        raise OptimizerError(f"unknown start stream {start!r} "
                             f"(streams: {', '.join(graph.streams)})")
    remaining = set(graph.streams) - {start}
    prefix = {start}
    order: list[str] = []

    def walk() -> Iterator[list[str]]:
        if not remaining:
            yield list(order)
            return
        for s in admissible(graph, prefix, remaining):
            remaining.discard(s)
            prefix.add(s)
            order.append(s)
            yield from walk()
            order.pop()
            prefix.discard(s)
            remaining.add(s)

    yield from walk()


def exhaustive(graph: JoinGraph, start: str, *, objective: Objective = "cost") -> list[str]:
    """The cheapest cartesian-free pipeline of ΔS_start found by trying them all (the first
    one in lexicographic order among equally cheap ones)."""
    check_objective(objective)
    if len(graph) > MAX_STREAMS:
        raise OptimizerError(f"exhaustive enumeration is O((n-1)!) and refuses {len(graph)} "
                             f"streams (at most {MAX_STREAMS}); use 'dmjoin'")
    best: list[str] | None = None
    best_cost = float("inf")
    for order in connected_orders(graph, start):
        c = pipeline_objective(graph, start, order, objective)
        if c < best_cost:
            best, best_cost = order, c
    assert best is not None
    return best
