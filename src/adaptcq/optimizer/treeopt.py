"""TreeOpt: the IK/KBZ rank ordering extended to MJoin pipelines (join-ordering.txt §4).

For ΔS_start the (acyclic) join graph is a tree rooted at S_start; a stream may join only
after its parent (otherwise the join would be a cartesian product). The order-dependent part
of the pipeline's cost has the recursive form of Ibaraki–Kameda (§4):

    C(Λ) = 0, C(S_start) = 0, C(ζ1 ζ2) = C(ζ1) + T(ζ1)·C(ζ2),
    T(Λ) = 1, T(⋈_{start:i}) = σ_i·λ_i·W, T(ζ) = Π T(⋈) over ζ,

with σ_i the selectivity of the edge from S_{start:i} to its parent. For the single stream
the two objectives differ only in C:

* objective "cost" — C(⋈_{start:i}) = λ_i·W, the state size each probing tuple scans, which
  makes λ_start·C(ζ) exactly the order-dependent part of Eq. 2
  (Σ_i [Π_{j≤i} λ_j σ_{j-1}] W^i);
* objective "tuples" — C(⋈_{start:i}) = λ_i·σ_i·W, the paper's §4 definition, for which
  λ_start·C(ζ) is the intermediate-tuple count Σ_i P_i of §3.1.

Both satisfy the Adjacent Sequence Interchange property, so ordering by
rank(ζ) = (T(ζ) − 1)/C(ζ) is optimal: bottom-up, the chains of a node's children are merged
by ascending rank, and while the node's rank exceeds the rank of the first module below it
the two are combined into one module (the merge of S_q and S_r into S_qS_r, Fig. 6). Ties keep
the children in name order.

Cyclic graphs (§4, "Handling Cycles in TreeOpt", Fig. 5): TreeOpt runs on the minimum
spanning tree with edge weights λ_i·λ_j·σ_ij (Kruskal; ties by the pair's names), ranks use
the tree's selectivities, and the order is then costed on the whole graph. That spanning tree
is computed once per graph and rooted at each start. O(n² log n) per MJoin.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

from adaptcq.optimizer._components import by_components
from adaptcq.optimizer.cost import Objective, check_objective
from adaptcq.optimizer.graph import JoinGraph, OptimizerError


@dataclass(frozen=True)
class Module:
    """A sequence of streams that stays together in the final order, with its §4 C and T."""

    streams: tuple[str, ...]
    c: float
    t: float

    @property
    def rank(self) -> float:
        """rank(ζ) = (T(ζ) − 1)/C(ζ) (§4). A C that underflowed to 0 (rates and a window
        near the smallest floats) is the limit C → 0+: ±inf, or 0 when T = 1."""
        if self.c == 0:
            return 0.0 if self.t == 1.0 else math.copysign(math.inf, self.t - 1.0)
        return (self.t - 1.0) / self.c

    def then(self, other: Module) -> Module:
        """ζ1ζ2 with C(ζ1ζ2) = C(ζ1) + T(ζ1)·C(ζ2) and T(ζ1ζ2) = T(ζ1)·T(ζ2)."""
        return Module(self.streams + other.streams, self.c + self.t * other.c,
                      self.t * other.t)


def spanning_tree(graph: JoinGraph) -> list[tuple[str, str]]:
    """The minimum spanning tree (a forest on a disconnected graph) of §4 with edge weight
    λ_i·λ_j·σ_ij, by Kruskal's algorithm; equal weights are taken in name order. Returns
    the tree's edges ``(a, b)`` with ``a < b``."""
    rates = graph.rates
    edges = sorted((rates[a] * rates[b] * s, a, b) for a, b, s in graph.edges())
    parent = {s: s for s in graph.streams}

    def find(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    tree = []
    for _, a, b in edges:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[ra] = rb
            tree.append((a, b))
    return tree


def _tree_order(graph: JoinGraph, start: str, tree_edges: list[tuple[str, str]],
                objective: Objective) -> list[str]:
    """KBZ on the tree (connected, spanning ``graph``) rooted at ``start``."""
    adj: dict[str, list[str]] = {s: [] for s in graph.streams}
    for a, b in tree_edges:
        adj[a].append(b)
        adj[b].append(a)
    w = graph.window
    # Iterative DFS from the root: parents and a post-order.
    parent: dict[str, str | None] = {start: None}
    visit = [start]
    stack = [start]
    while stack:
        u = stack.pop()
        for v in sorted(adj[u], reverse=True):
            if v not in parent:
                parent[v] = u
                visit.append(v)
                stack.append(v)
    if len(parent) != len(graph):  # pragma: no cover - guarded by by_components
        raise OptimizerError("TreeOpt needs a spanning tree of the whole graph")
    chains: dict[str, list[Module]] = {}
    for u in reversed(visit):
        kids = sorted(v for v in adj[u] if parent.get(v) == u)
        merged = list(heapq.merge(*(chains.pop(v) for v in kids), key=lambda m: m.rank))
        if u == start:
            return [s for m in merged for s in m.streams]
        p = parent[u]
        assert p is not None
        lam_w = graph.rates[u] * w
        t = lam_w * graph.sigma(u, p)
        head = Module((u,), lam_w if objective == "cost" else t, t)
        i = 0
        while i < len(merged) and merged[i].rank < head.rank:
            head = head.then(merged[i])
            i += 1
        chains[u] = [head, *merged[i:]]
    raise AssertionError("unreachable")  # pragma: no cover


def treeopt(graph: JoinGraph, start: str, *, objective: Objective = "cost") -> list[str]:
    """The TreeOpt pipeline of ΔS_start (§4): optimal under ``objective`` when the graph is
    acyclic; on a cyclic graph, the optimal order for its minimum spanning tree."""
    check_objective(objective)
    tree = [(a, b) for a, b, _ in graph.edges()] if not graph.has_cycle else \
        spanning_tree(graph)

    def order(g: JoinGraph, root: str) -> list[str]:
        names = set(g.streams)
        return _tree_order(g, root, [(a, b) for a, b in tree if a in names and b in names],
                           objective)

    return by_components(graph, start, order)
