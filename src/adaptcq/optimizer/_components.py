"""Disconnected join graphs: order one connected component after another.

On a disconnected graph a pipeline has to take cartesian products, but only once the
prefix's component is exhausted (the rule every algorithm follows). TreeOpt and the global
impact ordering of FAB work on one connected graph, so for them the pipeline is: the start's
component ordered by the algorithm, then, while streams remain, the remaining stream with the
smallest λ (the smallest cartesian step, ties by name) followed by its own component ordered by
the algorithm from that stream. Every sub-order is the algorithm's own on a connected graph;
Eq. 2 scales a whole later component by the prefix's P, so ordering it separately is exact.
"""

from __future__ import annotations

from collections.abc import Callable

from adaptcq.optimizer.graph import JoinGraph, OptimizerError

ComponentOrder = Callable[[JoinGraph, str], list[str]]


def by_components(graph: JoinGraph, start: str, order_connected: ComponentOrder) -> list[str]:
    """``order_connected(graph, start)`` when the graph is connected; otherwise the
    component-by-component pipeline described in the module docstring."""
    if start not in graph.rates:
        raise OptimizerError(f"unknown start stream {start!r} "
                             f"(streams: {', '.join(graph.streams)})")
    if graph.is_connected:
        return order_connected(graph, start)
    comps = {s: c for c in graph.components() for s in c}
    order: list[str] = []
    entry = start
    remaining = set(graph.streams)
    while True:
        comp = comps[entry]
        sub = graph.subgraph(comp) if len(comp) > 1 else None
        if entry != start:
            order.append(entry)
        if sub is not None:
            order.extend(order_connected(sub, entry))
        remaining -= comp
        if not remaining:
            return order
        entry = min(remaining, key=lambda s: (graph.rates[s], s))
