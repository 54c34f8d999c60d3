"""The logical continuous query: streams with windows, join predicates, selections, outputs.

This is the contract between the CQL front end (``adaptcq.query.cql``) and everything
below it. The join graph follows join-ordering.txt §2.1 (nodes are streams, an edge joins two
streams that share a predicate) and a-caching.txt §3.1 (equijoins R_i.attr_j = R_k.attr_l).
"""

from __future__ import annotations

import numbers
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, Literal

import pyarrow as pa
import sqlglot.expressions as exp

from adaptcq.errors import QueryError
from adaptcq.stream.eventtime import to_units

_SUB_MICRO = re.compile(r"(?<=\d\d)[.,]\d{6}(\d+)")  # a fraction's digits past the µs


def sub_micro_span(text: str) -> tuple[int, int, str] | None:
    """Where timestamp literal ``text``'s fraction has digits past the microsecond: (start,
    end, the digits); None when it has none. Python's datetime holds microseconds."""
    m = _SUB_MICRO.search(text)
    return (m.start(1), m.end(1), m.group(1)) if m else None


def below_microsecond(text: str) -> str:
    """The digits of timestamp literal ``text``'s fraction past the microsecond, trailing
    zeros dropped ('' when it has none)."""
    span = sub_micro_span(text)
    return span[2].rstrip("0") if span else ""


if TYPE_CHECKING:  # networkx is imported only when a caller asks for an nx.Graph
    import networkx as nx

WindowKind = Literal["range", "rows", "unbounded"]
Shape = Literal["linear", "star", "acyclic", "cyclic"]


@dataclass(frozen=True)
class Window:
    """A STREAM window (a-caching.txt §7.1; CQL): ``[RANGE w]`` seconds, ``[ROWS n]``, or none.

    Boundary (inclusive): at time tau a ``[RANGE w]`` window holds the tuples with timestamp
    t where ``tau - w <= t <= tau``; a tuple leaves when the first update with a timestamp
    greater than ``t + w`` is processed. A ``[ROWS n]`` window holds the n most recent rows.

    ``size``: rows for ``[ROWS n]``; for ``[RANGE w]`` the seconds as an int when whole, else
    the nearest float (for what computes in float seconds: the load-shedding join's basic
    windows, cost models). ``seconds``: a ``[RANGE w]`` size exactly, a ``Decimal`` (the
    query text's digits; docs/semantics.md says w is exact to the nanosecond, and a float
    keeps about 16 digits); built from a float ``size``, the float's shortest repr. A
    ``Decimal`` given as ``size`` sets both. Engines on int64 nanoseconds convert with
    :meth:`in_units`, never from ``size``.
    """

    kind: WindowKind = "unbounded"
    size: float | int | None = None
    seconds: Decimal | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.kind != "range" or self.size is None:
            # (no exact seconds: a replace() from a [RANGE w] to another kind kept them)
            object.__setattr__(self, "seconds", None)
            return
        size, exact = self.size, self.seconds
        if isinstance(size, Decimal):
            exact = size  # (a replace() of the size passes the old seconds along)
            whole = size.is_finite() and size == size.to_integral_value()
            size = int(size) if whole else float(size)
        elif exact is None or exact != size and float(exact) != size:
            # (a ``seconds`` that is not this size: dataclasses.replace of the size alone)
            exact = (Decimal(int(size)) if isinstance(size, numbers.Integral)
                     else Decimal(repr(float(size))))
        object.__setattr__(self, "size", size)
        object.__setattr__(self, "seconds", exact)

    def in_units(self, unit: float) -> int | float:
        """A ``[RANGE w]`` size in the engine's time unit (``unit`` seconds; 1e-9 for int64
        nanoseconds), exactly from ``seconds`` (``eventtime.to_units``); ``unit`` 1.0 gives
        ``size``, float seconds."""
        if self.kind != "range":
            raise ValueError(f"{self} has no time size")
        if unit == 1.0:
            return self.size
        return to_units(self._exact(), unit)

    def _exact(self) -> Decimal:
        """``seconds``; a Window unpickled from a checkpoint written before ``seconds``
        existed has the class default None: its float size is what that run used."""
        return self.seconds if self.seconds is not None else Decimal(repr(float(self.size)))

    def __str__(self) -> str:
        if self.kind == "range":
            return f"[RANGE {_decimal_text(self._exact())} SECONDS]"
        if self.kind == "rows":
            return f"[ROWS {self.size}]"
        return "[UNBOUNDED]"


def _decimal_text(value: Decimal) -> str:
    """``value`` exactly, without trailing zeros: plain digits (``0.5``, ``1234567``), or
    with an exponent when very large or small (``1E+400``)."""
    if not value.is_finite():
        return str(value)
    if value == 0:
        return "0"
    sign, digits, exponent = value.as_tuple()
    while digits[-1] == 0:  # (not normalize(): it rounds to the context's 28 digits)
        digits, exponent = digits[:-1], exponent + 1
    value = Decimal((sign, digits, exponent))
    return format(value, "f") if -30 < value.adjusted() < 21 else str(value)


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


SetKind = Literal["overlap", "equal", "subset", "superset", "inner"]

#: SQL function -> the set join condition it writes (load-shedding.txt §3.2): OVERLAP and
#: INNER_PRODUCT take a threshold (``>= k``), the others are conditions of their own.
SET_FUNCTIONS: dict[str, SetKind] = {"OVERLAP": "overlap", "SET_EQUAL": "equal",
                                     "SUBSET": "subset", "SUPERSET": "superset",
                                     "INNER_PRODUCT": "inner"}


@dataclass(frozen=True)
class SetPredicate:
    """A join condition on set-valued columns of two streams (load-shedding.txt §3.2):

    - ``overlap``: |L ∩ R| >= threshold (``OVERLAP(R.s, S.s) >= k``);
    - ``equal``: L = R as sets (``SET_EQUAL(R.s, S.s)``);
    - ``subset`` / ``superset``: L ⊆ R / L ⊇ R (``SUBSET(R.s, S.s)``);
    - ``inner``: Σ_{x ∈ L ∩ R} L[x]·R[x] >= threshold over weighted sets (map columns,
      item -> weight; ``INNER_PRODUCT(R.w, S.w) >= θ``).

    A list column is read as a set (duplicates count once); a NULL set never joins, as a
    NULL key never does. ``strict``: the comparison was ``>`` rather than ``>=``.
    """

    kind: SetKind
    left: ColumnRef
    right: ColumnRef
    threshold: float | None = None
    strict: bool = False
    position: int = 0

    @property
    def streams(self) -> tuple[str, str]:
        return self.left.stream, self.right.stream

    def __str__(self) -> str:
        name = next(f for f, k in SET_FUNCTIONS.items() if k == self.kind)
        text = f"{name}({self.left}, {self.right})"
        if self.threshold is None:
            return text
        return f"{text} {'>' if self.strict else '>='} {self.threshold:g}"


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
    - ``columns``: per stream alias, the layout of its *source's* rows: the columns any
      alias of that source needs, in a fixed order (join attributes, then selection and
      output columns, alias by alias in FROM order). Aliases of one source (a self-join)
      share the layout. Rows inside the engine are tuples in exactly this order; the
      projection onto ``outputs`` happens when a result is emitted.
    - ``types``: per stream alias, column -> kind in {"number", "string", "timestamp",
      "bool", "list", "struct", "map", "null", "other"} for the columns known from the schemas
      (``cql.KINDS``; the Arrow types of the outputs: :func:`output_types`).
    - ``set_predicates``: join conditions on set-valued columns (:class:`SetPredicate`);
      only the load-shedding join (``engine.shed_join``) evaluates them, every other
      executor refuses such a query (:func:`require_equi_joins`).
    """

    sql: str
    streams: tuple[StreamRef, ...]
    predicates: tuple[JoinPredicate, ...]
    classes: tuple[frozenset[ColumnRef], ...]
    selections: dict[str, exp.Expression | None]
    outputs: tuple[OutputColumn, ...]
    columns: dict[str, tuple[str, ...]]
    types: dict[str, dict[str, str]] = field(default_factory=dict)
    set_predicates: tuple[SetPredicate, ...] = ()

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

    def join_edges(self) -> dict[tuple[str, str], list[tuple[ColumnRef, ColumnRef]]]:
        """The join graph's edges without networkx, in the order and orientation
        :attr:`join_graph` lists them: (u, v) -> that edge's ``predicates``."""
        edges: dict[frozenset[str], tuple[tuple[str, str], list]] = {}
        for a, b in self.equalities():
            key = frozenset((a.stream, b.stream))
            if key not in edges:
                edges[key] = ((a.stream, b.stream), [])
            (u, v), preds = edges[key]
            pair = (a, b) if (u, v) == (a.stream, b.stream) else (b, a)
            if pair not in preds:
                preds.append(pair)
        # networkx's order: node by node (FROM order), each one's new neighbours in the
        # order their edges were added
        adj: dict[str, list[str]] = {a: [] for a in self.aliases}
        for u, v in (uv for uv, _ in edges.values()):
            adj[u].append(v)
            adj[v].append(u)
        out, seen = {}, set()
        for n in self.aliases:
            for m in adj[n]:
                if m not in seen:
                    out[(n, m)] = edges[frozenset((n, m))][1]
            seen.add(n)
        return out

    def adjacency(self) -> dict[str, tuple[str, ...]]:
        """The join graph as neighbour lists, per alias in FROM order (no networkx)."""
        adj: dict[str, list[str]] = {a: [] for a in self.aliases}
        for u, v in self.join_edges():
            adj[u].append(v)
            adj[v].append(u)
        for p in self.set_predicates:  # a set join condition is an edge too
            u, v = p.streams
            if v not in adj[u]:
                adj[u].append(v)
                adj[v].append(u)
        return {a: tuple(n) for a, n in adj.items()}

    @property
    def join_graph(self) -> nx.Graph:
        """Nodes: stream aliases. Edge (u, v) carries ``predicates``: a list of
        (ColumnRef of u, ColumnRef of v), all equalities between u and v implied by the
        query (written ones and their transitive consequences)."""
        import networkx as nx
        g = nx.Graph()
        g.add_nodes_from(self.aliases)
        for (u, v), preds in self.join_edges().items():
            g.add_edge(u, v, predicates=preds)
        return g

    @property
    def shape(self) -> Shape:
        return adjacency_shape(self.adjacency())

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
    return adjacency_shape({n: tuple(g.neighbors(n)) for n in g.nodes})


def components(adj: Mapping[str, Iterable[str]]) -> list[set[str]]:
    """The connected components of a graph given as neighbour lists, in the order of their
    first node in ``adj``."""
    out, seen = [], set()
    for a in adj:
        if a in seen:
            continue
        part, todo = {a}, [a]
        while todo:
            for b in adj[todo.pop()]:
                if b not in part:
                    part.add(b)
                    todo.append(b)
        seen |= part
        out.append(part)
    return out


def adjacency_shape(adj: Mapping[str, Iterable[str]]) -> Shape:
    """:func:`graph_shape` of a graph given as neighbour lists (a disconnected graph is not
    a tree, so it is "cyclic")."""
    n = len(adj)
    if n <= 2:
        return "linear"
    degrees = sorted(len(set(nb)) for nb in adj.values())
    if sum(degrees) // 2 != n - 1 or len(components(adj)) != 1:  # not a tree
        return "cyclic"
    if degrees[-1] <= 2:
        return "linear"
    if degrees[-1] == n - 1:
        return "star"
    return "acyclic"


# ----- output column types ---------------------------------------------------------------
_INT64_MAX = 2 ** 63 - 1
_ARITHMETIC = (exp.Add, exp.Sub, exp.Mul, exp.Div)
_CONDITIONS = (exp.EQ, exp.NEQ, exp.LT, exp.LTE, exp.GT, exp.GTE, exp.Between, exp.In, exp.Is,
               exp.Not, exp.And, exp.Or, exp.Boolean)
_TEMPORAL = {exp.DataType.Type.DATE, exp.DataType.Type.DATETIME, exp.DataType.Type.TIMESTAMP,
             exp.DataType.Type.TIMESTAMPNTZ, exp.DataType.Type.TIMESTAMPTZ,
             exp.DataType.Type.TIMESTAMPLTZ}


def output_types(query: LogicalQuery, source_schemas: Mapping[str, pa.Schema]
                 ) -> list[pa.DataType]:
    """The Arrow type of each of ``query.outputs``, from the input schemas (keyed by
    source name, ``query.streams[i].source``), never from values (docs/semantics.md,
    "Output columns and their types"):

    - a column reference: the input column's type exactly (a dictionary type decoded to its
      value type);
    - ``+ - *`` and unary minus: int64 when every operand is an integer, float64 when one is
      floating; ``/``: float64 (operands NULL or of type null do not count);
    - a literal: int64, float64, string or bool; ``NULL``: null; ``TIMESTAMP '...'`` /
      ``DATE '...'``: timestamp[us];
    - a condition (comparison, BETWEEN, IN, IS NULL, NOT, AND, OR, TRUE/FALSE): bool.

    Raises :class:`QueryError` for a source or column missing from ``source_schemas`` and
    for arithmetic on non-numbers or on decimal columns (the parser refuses the former when
    it has the schemas' kinds).
    """
    return [_OutputTyper(query, source_schemas).type_of(o.expr).type for o in query.outputs]


def output_overflows(query: LogicalQuery, source_schemas: Mapping[str, pa.Schema]
                     ) -> list[bool]:
    """For each of ``query.outputs``: True when it is integer arithmetic (int64 by
    :func:`output_types`) whose value can leave the int64 range, judged from the operand
    types (int8 + int8 cannot; int64 + int64, int32 * int32 * int32 or any uint64 operand
    can). The engine computes such values exactly (Python integers); a writer must then
    check them and report an out-of-range value as an error naming the output column."""
    typer = _OutputTyper(query, source_schemas)
    out = []
    for o in query.outputs:
        t = typer.type_of(o.expr)
        out.append(t.computed and pa.types.is_integer(t.type) and t.bound > _INT64_MAX)
    return out


@dataclass(frozen=True)
class _Typed:
    type: pa.DataType
    bound: int = 0          # largest absolute value of an integer (0: not an integer)
    computed: bool = False  # the result of integer arithmetic (int64) rather than a column


class _OutputTyper:
    def __init__(self, query: LogicalQuery, schemas: Mapping[str, pa.Schema]):
        self.query = query
        self.schemas = schemas

    def error(self, message: str, node: exp.Expression) -> QueryError:
        starts = [n.meta["start"] for n in node.walk() if "start" in n.meta]
        return QueryError(message, self.query.sql, min(starts) if starts else None)

    def type_of(self, node: exp.Expression) -> _Typed:
        while isinstance(node, exp.Paren | exp.Alias):
            node = node.this
        if isinstance(node, exp.Column):
            return self.column(node)
        if isinstance(node, exp.Literal):
            if node.is_string:
                return _Typed(pa.string())
            try:
                return _Typed(pa.int64(), abs(int(node.this)))
            except ValueError:
                return _Typed(pa.float64())
        if isinstance(node, exp.Null):
            return _Typed(pa.null())
        if isinstance(node, _CONDITIONS):
            return _Typed(pa.bool_())
        if (isinstance(node, exp.Cast) and isinstance(node.this, exp.Literal)
                and node.to.this in _TEMPORAL):
            # (a literal with nanoseconds holds them: expr.parse_timestamp)
            return _Typed(pa.timestamp("ns" if below_microsecond(node.this.this) else "us"))
        if isinstance(node, exp.Neg):
            return self.arithmetic(node, [node.this])
        if isinstance(node, _ARITHMETIC):
            return self.arithmetic(node, [node.this, node.expression])
        if isinstance(node, exp.Anonymous):
            raise self.error(
                f"{node.sql()} in the SELECT list: a UDF's result has no declared type, so "
                "the engines that write typed output (adaptcq.run, adaptcq.Engine, the CLI, "
                "Spark) cannot make it an output column; use the UDF in WHERE, or call the "
                "Eddy directly (docs/cacq-filters.md)", node)
        raise self.error(f"cannot tell the type of {node.sql()!r}", node)

    def column(self, node: exp.Column) -> _Typed:
        try:
            source = self.query.stream(node.table).source
        except KeyError:
            raise self.error(f"unknown stream {node.table!r} in {node.sql()}", node) from None
        schema = self.schemas.get(source)
        if schema is None:
            raise self.error(f"no schema for source {source!r} (have: "
                             f"{', '.join(self.schemas) or 'none'})", node)
        index = schema.get_field_index(node.name)
        if index < 0:
            raise self.error(f"source {source!r} has no column {node.name!r} (its columns: "
                             f"{', '.join(schema.names)})", node)
        t = schema.field(index).type
        if pa.types.is_dictionary(t):
            t = t.value_type
        union = _union_in(t)
        if union is not None:
            # Every executor builds its output columns from Python values, which pyarrow
            # cannot convert to a union: refused here, before any row is read, rather than
            # failing at the first result with a bare ArrowNotImplementedError.
            where = "" if union == t else f" (inside its type {t})"
            raise self.error(
                f"{node.sql()} (stream {node.table!r}, source {source!r}, column "
                f"{node.name!r}) holds a union type, {union}{where}: no executor (vector, "
                "mjoin, xjoin, acaching, tree, shed, the multi-query eddy, Spark) can write "
                "union values to its output, so it cannot be a SELECT column; test it with "
                "IS [NOT] NULL, or give the input a single type for it", node)
        bound = 0
        if pa.types.is_integer(t):
            bound = 2 ** t.bit_width - 1 if pa.types.is_unsigned_integer(t) \
                else 2 ** (t.bit_width - 1)
        return _Typed(t, bound)

    def arithmetic(self, node: exp.Expression, operands: list[exp.Expression]) -> _Typed:
        typed = [self.type_of(o) for o in operands]
        for o, t in zip(operands, typed, strict=True):
            if pa.types.is_decimal(t.type) and not isinstance(node, exp.Neg):
                raise self.error(f"arithmetic on the decimal value {o.sql()} is not "
                                 "supported", node)
            if not (pa.types.is_integer(t.type) or pa.types.is_floating(t.type)
                    or pa.types.is_decimal(t.type) or pa.types.is_null(t.type)):
                raise self.error(f"arithmetic needs numbers, but {o.sql()} has type "
                                 f"{t.type}", node)
        known = [t for t in typed if not pa.types.is_null(t.type)]
        if isinstance(node, exp.Div):
            return _Typed(pa.float64())
        if not known:
            return _Typed(pa.null())
        if isinstance(node, exp.Neg) and pa.types.is_decimal(known[0].type):
            return known[0]
        if any(pa.types.is_floating(t.type) for t in known):
            return _Typed(pa.float64())
        if isinstance(node, exp.Mul):
            bound = 1
            for t in known:
                bound *= t.bound
            bound = bound if len(known) == 2 else 0  # times NULL: always NULL
        elif isinstance(node, exp.Neg):
            bound = known[0].bound
        else:
            bound = sum(t.bound for t in known) if len(known) == 2 else 0
        return _Typed(pa.int64(), bound, True)


def _union_in(t: pa.DataType) -> pa.DataType | None:
    """The first (sparse or dense) union type in ``t``, ``t`` itself or nested in a list,
    struct, map or dictionary; None when it holds none."""
    t = getattr(t, "storage_type", t)  # an extension type: its values are the storage's
    if pa.types.is_dictionary(t):
        t = t.value_type
    if pa.types.is_union(t):
        return t
    for i in range(t.num_fields):
        found = _union_in(t.field(i).type)
        if found is not None:
            return found
    return None


def require_equi_joins(query: LogicalQuery, what: str) -> None:
    """Refuse a query with set join conditions for ``what`` (an executor or runtime that
    joins by equality only): it would otherwise run the query as a cross product."""
    if query.set_predicates:
        p = query.set_predicates[0]
        raise QueryError(f"{p} is a set join condition (load-shedding.txt §3.2); only the "
                         "load-shedding join evaluates it (adaptcq run --executor shed, "
                         f"[RANGE w] windows): {what} joins by equality only",
                         query.sql, p.position)
