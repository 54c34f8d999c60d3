"""Random join graphs for the experiments of join-ordering.txt §3.3.

The paper draws, for each N, "the input rate for each stream [1-100] tuples/sec" and "the join
selectivities among the streams", 500 times per N. It does not say how selectivities are
drawn; we draw σ uniformly in (0, 1] (its worked examples use σ such as 0.26 and 0.78), and
use W = 1 (its examples count λ_i·λ_j·σ_ij tuples per second, i.e. W = 1).

Shapes (§1.2, Fig. 4.b and 7.a): ``linear`` (a path in random order), ``star`` (a random hub
joined to all others), ``acyclic`` (a random labelled tree from a uniform Prüfer sequence,
redrawn until it is neither a path nor a star — possible from 5 streams on; with 4 or fewer
every tree is a path or a star), ``cyclic`` (a random tree plus k extra edges, k uniform in
1..n−1 and below the number of missing edges so the graph is not complete, when n ≥ 4;
for n = 3 the only cyclic graph is the triangle), ``complete`` (all pairs). Streams are named
S1..Sn.
"""

from __future__ import annotations

import heapq
import random
from itertools import combinations

from adaptcq.optimizer.graph import JoinGraph, OptimizerError

SHAPES: tuple[str, ...] = ("linear", "star", "acyclic", "cyclic", "complete")
RATE_RANGE = (1.0, 100.0)


def _rng(rng: random.Random | int | None) -> random.Random:
    if isinstance(rng, random.Random):
        return rng
    return random.Random(rng)


def _random_tree(n: int, r: random.Random) -> list[tuple[int, int]]:
    """A uniformly random labelled tree on 0..n-1 (Prüfer decoding)."""
    if n == 1:
        return []
    if n == 2:
        return [(0, 1)]
    seq = [r.randrange(n) for _ in range(n - 2)]
    degree = [1] * n
    for x in seq:
        degree[x] += 1
    leaves = [i for i in range(n) if degree[i] == 1]
    heapq.heapify(leaves)
    edges = []
    for x in seq:
        leaf = heapq.heappop(leaves)
        edges.append((leaf, x))
        degree[x] -= 1
        if degree[x] == 1:
            heapq.heappush(leaves, x)
    edges.append((heapq.heappop(leaves), heapq.heappop(leaves)))
    return edges


def random_edges(n: int, shape: str, rng: random.Random | int | None = None
                 ) -> list[tuple[int, int]]:
    """The edges (pairs of 0-based stream indexes) of a random join graph of ``shape``."""
    r = _rng(rng)
    if shape not in SHAPES:
        raise OptimizerError(f"unknown shape {shape!r}; choose one of {', '.join(SHAPES)}")
    if n < 1:
        raise OptimizerError(f"a join graph needs at least one stream, got n={n}")
    nodes = list(range(n))
    if shape == "linear":
        r.shuffle(nodes)
        return [(nodes[i], nodes[i + 1]) for i in range(n - 1)]
    if shape == "star":
        hub = r.randrange(n)
        return [(hub, i) for i in nodes if i != hub]
    if shape == "complete":
        return list(combinations(nodes, 2))
    if shape == "acyclic":
        while True:
            edges = _random_tree(n, r)
            degree = [0] * n
            for a, b in edges:
                degree[a] += 1
                degree[b] += 1
            top = max(degree, default=0)
            if n < 5 or (2 < top < n - 1):
                return edges
    # cyclic: a random tree plus extra edges
    if n < 3:
        raise OptimizerError(f"a cyclic join graph needs at least 3 streams, got n={n}")
    edges = _random_tree(n, r)
    present = {frozenset(e) for e in edges}
    missing = [p for p in combinations(nodes, 2) if frozenset(p) not in present]
    most = len(missing) if n == 3 else min(n - 1, len(missing) - 1)
    extra = r.randint(1, most)
    return edges + r.sample(missing, extra)


def random_graph(n: int, shape: str, rng: random.Random | int | None = None, *,
                 window: float = 1.0, rate_range: tuple[float, float] = RATE_RANGE
                 ) -> JoinGraph:
    """A random §3.3 setting: streams S1..Sn with λ uniform in ``rate_range`` ([1, 100]),
    σ uniform in (0, 1] on the edges of a random graph of ``shape``, window W."""
    r = _rng(rng)
    edges = random_edges(n, shape, r)
    lo, hi = rate_range
    rates = {f"S{i + 1}": r.uniform(lo, hi) for i in range(n)}
    sel = {frozenset((f"S{a + 1}", f"S{b + 1}")): 1.0 - r.random() for a, b in edges}
    return JoinGraph(rates, sel, window=window)
