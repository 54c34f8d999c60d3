"""The logical continuous query: streams with windows, join predicates, selections, outputs.

This is the contract between the CQL front end (``adaptcq.query.cql``) and everything
below it. The join graph follows join-ordering.txt §2.1 (nodes are streams, an edge joins two
streams that share a predicate) and a-caching.txt §3.1 (equijoins R_i.attr_j = R_k.attr_l).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import networkx as nx
import sqlglot.expressions as exp

WindowKind = Literal["range", "rows", "unbounded"]
Shape = Literal["linear", "star", "acyclic", "cyclic"]


@dataclass(frozen=True)
class Window:
    """A STREAM window (a-caching.txt §7.1; CQL): ``[RANGE w]`` seconds, ``[ROWS n]``, or none.

    Boundary (inclusive): at time tau a ``[RANGE w]`` window holds the tuples with timestamp
    t where ``tau - w <= t <= tau``; a tuple leaves when the first update with a timestamp
    greater than ``t + w`` is processed. A ``[ROWS n]`` window holds the n most recent rows.
    """

    kind: WindowKind = "unbounded"
    size: float | int | None = None

    def __str__(self) -> str:
        if self.kind == "range":
            return f"[RANGE {self.size:g} SECONDS]"
        if self.kind == "rows":
            return f"[ROWS {self.size}]"
        return "[UNBOUNDED]"


@dataclass(frozen=True)
class ColumnRef:
    """A column of one stream of the query, by the stream's alias."""

    stream: str
    column: str

    def __str__(self) -> str:
        return f"{self.stream}.{self.column}"


@dataclass(frozen=True)
class StreamRef:
    """One FROM item: a source stream under an alias, with its window.

    ``source`` names the input (the key of ``sources=`` / ``--input``); two aliases of one
    source (a self-join) are two streams of the query that share input rows.
    ``position`` is the character offset of the FROM item in the query text.
    """

    alias: str
    source: str
    window: Window = Window()
    position: int = 0


@dataclass(frozen=True)
class JoinPredicate:
    """An equi-join predicate between two different streams, as written in the query."""

    left: ColumnRef
    right: ColumnRef
    position: int = 0

    def other(self, stream: str) -> ColumnRef:
        return self.right if self.left.stream == stream else self.left

    def side(self, stream: str) -> ColumnRef:
        return self.left if self.left.stream == stream else self.right


@dataclass(frozen=True)
class OutputColumn:
    """One SELECT item: the output column's name and its expression.

    Every ``exp.Column`` inside ``expr`` is qualified with the stream alias as its table.
    """

    name: str
    expr: exp.Expression


@dataclass
class LogicalQuery:
    """A parsed, resolved continuous query.

    - ``streams``: the FROM items in text order.
    - ``predicates``: equi-join predicates between two streams, as written.
    - ``classes``: the attribute classes, i.e. the equivalence classes of columns under the
      written equalities (transitively closed); each has at least two columns.
    - ``selections``: per stream alias, the conjunction of predicates that mention only that
      stream (None when there are none); columns qualified as in ``outputs``.
    - ``outputs``: the SELECT list, ``*`` expanded to ``<alias>_<column>`` names.
    - ``columns``: per stream alias, the columns the query needs from it, in a fixed order
      (join attributes, then selection and output columns); rows inside the engine are
      tuples in exactly this order.
    - ``types``: per stream alias, column -> kind in {"number", "string", "timestamp",
      "bool", "other"} for the columns known from the schemas.
    """

    sql: str
    streams: tuple[StreamRef, ...]
    predicates: tuple[JoinPredicate, ...]
    classes: tuple[frozenset[ColumnRef], ...]
    selections: dict[str, exp.Expression | None]
    outputs: tuple[OutputColumn, ...]
    columns: dict[str, tuple[str, ...]]
    types: dict[str, dict[str, str]] = field(default_factory=dict)

    # ----- derived views -------------------------------------------------------------
    @property
    def aliases(self) -> tuple[str, ...]:
        return tuple(s.alias for s in self.streams)

    def stream(self, alias: str) -> StreamRef:
        for s in self.streams:
            if s.alias == alias:
                return s
        raise KeyError(alias)

    def equalities(self) -> list[tuple[ColumnRef, ColumnRef]]:
        """All pairwise equalities between two streams implied by the attribute classes."""
        pairs = []
        for cls in self.classes:
            refs = sorted(cls, key=lambda c: (self.aliases.index(c.stream), c.column))
            for i, a in enumerate(refs):
                for b in refs[i + 1:]:
                    if a.stream != b.stream:
                        pairs.append((a, b))
        return pairs

    @property
    def join_graph(self) -> nx.Graph:
        """Nodes: stream aliases. Edge (u, v) carries ``predicates``: a list of
        (ColumnRef of u, ColumnRef of v), all equalities between u and v implied by the
        query (written ones and their transitive consequences)."""
        g = nx.Graph()
        g.add_nodes_from(self.aliases)
        for a, b in self.equalities():
            if g.has_edge(a.stream, b.stream):
                preds = g.edges[a.stream, b.stream]["predicates"]
            else:
                preds = []
                g.add_edge(a.stream, b.stream, predicates=preds)
            u, v = a.stream, b.stream
            pair = (a, b) if (u, v) == (a.stream, b.stream) else (b, a)
            if pair not in preds:
                preds.append(pair)
        return g

    @property
    def shape(self) -> Shape:
        return graph_shape(self.join_graph)

    def join_key(self, stream: str, others: set[str] | frozenset[str]) -> list[tuple[str, ColumnRef]]:
        """The equalities between ``stream`` and the streams in ``others``, one per column of
        ``stream`` that is equated to some column of ``others``: a list of
        (column of ``stream``, a ColumnRef in ``others``). Used for probe keys: the key of
        ``stream``'s index is the listed columns, probed with the listed ColumnRefs."""
        out: list[tuple[str, ColumnRef]] = []
        seen: set[str] = set()
        for cls in self.classes:
            mine = sorted(c.column for c in cls if c.stream == stream)
            theirs = sorted((c for c in cls if c.stream in others),
                            key=lambda c: (self.aliases.index(c.stream), c.column))
            if not mine or not theirs:
                continue
            # Every column of ``stream`` in the class must equal the probing value; the
            # columns of ``stream`` among themselves are equated by a selection.
            for col in mine:
                if col not in seen:
                    seen.add(col)
                    out.append((col, theirs[0]))
        out.sort(key=lambda p: self.columns[stream].index(p[0]))
        return out


def graph_shape(g: nx.Graph) -> Shape:
    """join-ordering.txt §1.2/§3.3 shapes: linear (a path), star (one hub, >= 4 nodes),
    general acyclic (a tree), cyclic (anything with a cycle, complete graphs included)."""
    n = g.number_of_nodes()
    if n <= 2:
        return "linear"
    if not nx.is_tree(g):
        return "cyclic"
    degrees = sorted(d for _, d in g.degree())
    if degrees[-1] <= 2:
        return "linear"
    if degrees[-1] == n - 1:
        return "star"
    return "acyclic"
