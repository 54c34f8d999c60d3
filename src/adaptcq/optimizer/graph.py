"""The statistics-annotated join graph JG of join-ordering.txt §2.1–2.2.

Nodes are streams with their input rates λ (tuples per unit time); an edge joins two streams
that share at least one join predicate and carries the selectivity σ of joining them. A pair
without an edge has no predicate: joining it is a cartesian product, σ = 1. Several predicates
between one pair are independent (§2.1, "we assume independent join selectivities"), so their
selectivities multiply (:meth:`JoinGraph.from_predicates`). W is the sliding time window and
C_insert, C_delete, C_join are the unit costs of Table 1.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from functools import cached_property
from types import MappingProxyType
from typing import TYPE_CHECKING

from adaptcq.checks import is_real
from adaptcq.errors import AdaptcqError
from adaptcq.query.logical import Shape, adjacency_shape

if TYPE_CHECKING:
    import networkx as nx


class OptimizerError(AdaptcqError, ValueError):
    """A join graph, start stream or algorithm the optimizer cannot work with."""


def _check_positive(what: str, value: float, *, allow_zero: bool = False) -> float:
    # (a bool or a string is no number: float(True) and float("2") took them as 1 and 2)
    if not is_real(value):
        raise OptimizerError(f"{what} must be a number, got {value!r}")
    try:
        v = float(value)
    except (TypeError, ValueError, OverflowError):
        raise OptimizerError(f"{what} must be a finite number, got {value!r}") from None
    if not math.isfinite(v) or v < 0 or (v == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise OptimizerError(f"{what} must be finite and {bound}, got {value!r}")
    return v


class JoinGraph:
    """An immutable join graph: rates λ per stream, selectivities σ per joined pair, window W.

    ``selectivities`` maps ``frozenset({a, b})`` (a 2-tuple ``(a, b)`` is accepted too) to
    σ in (0, 1]; a pair that is missing has no predicate. Instances are hashable values:
    equal graphs compare and hash equal, and none of their fields can be changed.

    >>> g = JoinGraph({"R": 10, "S": 20, "T": 5}, {("R", "S"): 0.1, ("S", "T"): 0.5}, window=2)
    >>> g.neighbors("S"), g.sigma("R", "T"), g.shape
    (('R', 'T'), 1.0, 'linear')
    """

    def __init__(self, rates: Mapping[str, float],
                 selectivities: Mapping[frozenset[str] | tuple[str, str], float] | None = None,
                 window: float = 1.0, c_insert: float = 1.0, c_delete: float = 1.0,
                 c_join: float = 1.0):
        if not rates:
            raise OptimizerError("a join graph needs at least one stream")
        clean_rates: dict[str, float] = {}
        for name, lam in rates.items():
            if not isinstance(name, str) or not name:
                raise OptimizerError(f"stream names must be non-empty strings, got {name!r}")
            clean_rates[name] = _check_positive(f"rate λ of stream {name!r}", lam)
        sel: dict[frozenset[str], float] = {}
        for key, value in (selectivities or {}).items():
            pair = frozenset(key)
            if len(pair) != 2 or len(tuple(key)) != 2:
                raise OptimizerError(f"a selectivity key must name two different streams, "
                                     f"got {tuple(key)!r}")
            for s in pair:
                if s not in clean_rates:
                    raise OptimizerError(f"selectivity {tuple(key)!r} names stream {s!r}, "
                                         f"which has no rate (streams: {sorted(clean_rates)})")
            if pair in sel:
                raise OptimizerError(f"selectivity of {sorted(pair)} given twice; use "
                                     f"JoinGraph.from_predicates to multiply several predicates")
            sigma = _check_positive(f"selectivity σ of {sorted(pair)}", value)
            if sigma > 1.0:
                raise OptimizerError(f"selectivity σ of {sorted(pair)} must be in (0, 1], "
                                     f"got {value!r}")
            sel[pair] = sigma
        self._rates = MappingProxyType(dict(sorted(clean_rates.items())))
        self._sel = MappingProxyType(dict(sorted(sel.items(), key=lambda kv: sorted(kv[0]))))
        self._window = _check_positive("window W", window)
        self._c_insert = _check_positive("C_insert", c_insert, allow_zero=True)
        self._c_delete = _check_positive("C_delete", c_delete, allow_zero=True)
        self._c_join = _check_positive("C_join", c_join, allow_zero=True)
        adj: dict[str, list[str]] = {s: [] for s in self._rates}
        for pair in self._sel:
            a, b = sorted(pair)
            adj[a].append(b)
            adj[b].append(a)
        self._adj = MappingProxyType({s: tuple(sorted(v)) for s, v in adj.items()})
        self._frozen = True

    # ----- construction ---------------------------------------------------------------
    @classmethod
    def from_predicates(cls, rates: Mapping[str, float],
                        predicates: Iterable[tuple[str, str, float]], window: float = 1.0,
                        **costs: float) -> JoinGraph:
        """Build a graph from individual predicates ``(a, b, σ)``; the selectivities of several
        predicates between one pair multiply (independence, join-ordering.txt §2.1)."""
        sel: dict[frozenset[str], float] = {}
        for a, b, sigma in predicates:
            if a == b:
                raise OptimizerError(f"predicate ({a!r}, {b!r}) joins a stream with itself; "
                                     f"that is a selection, not a join")
            s = _check_positive(f"selectivity σ of ({a!r}, {b!r})", sigma)
            pair = frozenset((a, b))
            sel[pair] = sel.get(pair, 1.0) * s
        return cls(rates, sel, window=window, **costs)

    # ----- fields -----------------------------------------------------------------------
    @property
    def rates(self) -> Mapping[str, float]:
        """λ per stream (read-only), in name order."""
        return self._rates

    @property
    def selectivities(self) -> Mapping[frozenset[str], float]:
        """σ per joined pair (read-only); pairs without a predicate are absent."""
        return self._sel

    @property
    def window(self) -> float:
        return self._window

    @property
    def c_insert(self) -> float:
        return self._c_insert

    @property
    def c_delete(self) -> float:
        return self._c_delete

    @property
    def c_join(self) -> float:
        return self._c_join

    @property
    def streams(self) -> tuple[str, ...]:
        """The stream names, sorted."""
        return tuple(self._rates)

    def __len__(self) -> int:
        return len(self._rates)

    # ----- queries -----------------------------------------------------------------------
    def rate(self, s: str) -> float:
        self._require(s)
        return self._rates[s]

    def neighbors(self, s: str) -> tuple[str, ...]:
        """The streams sharing a predicate with ``s``, sorted by name."""
        self._require(s)
        return self._adj[s]

    def neighbor_selectivities(self, s: str) -> tuple[tuple[str, float], ...]:
        """``(t, σ_st)`` for every neighbor t of ``s``, sorted by name."""
        self._require(s)
        return self._nsel[s]

    @cached_property
    def _nsel(self) -> Mapping[str, tuple[tuple[str, float], ...]]:
        return MappingProxyType({
            s: tuple((t, self._sel[frozenset((s, t))]) for t in nbrs)
            for s, nbrs in self._adj.items()})

    def has_edge(self, a: str, b: str) -> bool:
        return frozenset((a, b)) in self._sel

    def sigma(self, a: str, b: str) -> float:
        """σ between ``a`` and ``b``; 1.0 when they share no predicate (a cartesian product)."""
        self._require(a)
        self._require(b)
        if a == b:
            raise OptimizerError(f"σ is defined between two different streams, got {a!r} twice")
        return self._sel.get(frozenset((a, b)), 1.0)

    def edges(self) -> list[tuple[str, str, float]]:
        """All edges as ``(a, b, σ)`` with ``a < b``, sorted."""
        return [(*sorted(p), s) for p, s in self._sel.items()]  # type: ignore[misc]

    @cached_property
    def is_connected(self) -> bool:
        return len(self.components()) == 1

    def components(self) -> list[frozenset[str]]:
        """Connected components, the one holding the smallest name first, each sorted by its
        smallest name."""
        seen: set[str] = set()
        out: list[frozenset[str]] = []
        for s in self._rates:
            if s in seen:
                continue
            comp = {s}
            todo = [s]
            while todo:
                for t in self._adj[todo.pop()]:
                    if t not in comp:
                        comp.add(t)
                        todo.append(t)
            seen |= comp
            out.append(frozenset(comp))
        return out

    @cached_property
    def has_cycle(self) -> bool:
        """True when the graph contains a cycle (it is not a forest)."""
        return len(self._sel) > len(self._rates) - len(self.components())

    @cached_property
    def shape(self) -> Shape:
        """``linear``, ``star``, ``acyclic`` or ``cyclic``, as
        :func:`adaptcq.query.logical.graph_shape` defines them (join-ordering.txt §1.2, §3.3).
        A disconnected graph is not a tree and is therefore reported as ``cyclic`` there;
        use :attr:`has_cycle` to tell forests apart."""
        return adjacency_shape(self._adj)

    def to_networkx(self) -> nx.Graph:
        """A new ``networkx.Graph``: node attribute ``rate`` (λ), edge attributes ``sigma`` (σ)
        and ``weight`` = λ_a·λ_b·σ_ab (the spanning-tree weight of §4); graph attributes
        ``window``, ``c_insert``, ``c_delete``, ``c_join``."""
        import networkx as nx
        g = nx.Graph(window=self._window, c_insert=self._c_insert, c_delete=self._c_delete,
                     c_join=self._c_join)
        for s, lam in self._rates.items():
            g.add_node(s, rate=lam)
        for a, b, sigma in self.edges():
            g.add_edge(a, b, sigma=sigma, weight=self._rates[a] * self._rates[b] * sigma)
        return g

    def subgraph(self, streams: Iterable[str]) -> JoinGraph:
        """The induced join graph on ``streams`` (same window and unit costs)."""
        keep = set(streams)
        for s in keep:
            self._require(s)
        return JoinGraph({s: self._rates[s] for s in keep},
                         {p: v for p, v in self._sel.items() if p <= keep},
                         window=self._window, c_insert=self._c_insert,
                         c_delete=self._c_delete, c_join=self._c_join)

    # ----- value semantics --------------------------------------------------------------
    def _key(self) -> tuple:
        return (tuple(self._rates.items()), tuple(self._sel.items()), self._window,
                self._c_insert, self._c_delete, self._c_join)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, JoinGraph):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __setattr__(self, name: str, value: object) -> None:
        if self.__dict__.get("_frozen"):
            raise AttributeError(f"JoinGraph is immutable; cannot set {name!r}")
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"JoinGraph is immutable; cannot delete {name!r}")

    def __repr__(self) -> str:
        rates = ", ".join(f"{s!r}: {v:g}" for s, v in self._rates.items())
        sel = ", ".join(f"({a!r}, {b!r}): {v:g}" for a, b, v in self.edges())
        return (f"JoinGraph({{{rates}}}, {{{sel}}}, window={self._window:g}, "
                f"c_insert={self._c_insert:g}, c_delete={self._c_delete:g}, "
                f"c_join={self._c_join:g})")

    def __reduce__(self):
        return (_rebuild, (dict(self._rates), dict(self._sel), self._window, self._c_insert,
                           self._c_delete, self._c_join))

    def _require(self, s: str) -> None:
        if s not in self._rates:
            raise OptimizerError(f"unknown stream {s!r} (streams: {', '.join(self._rates)})")


def _rebuild(rates, sel, window, c_insert, c_delete, c_join) -> JoinGraph:
    return JoinGraph(rates, sel, window=window, c_insert=c_insert, c_delete=c_delete,
                     c_join=c_join)
