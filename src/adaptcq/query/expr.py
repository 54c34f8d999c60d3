"""Compile the scalar SQL of a continuous query (selections, SELECT items) to Python source.

The accepted expressions are those the CQL front end lets through (``adaptcq.query.cql``):
columns, literals, ``+ - * /``, unary minus, the comparisons ``= <> != < <= > >=``,
``BETWEEN``, ``IN (...)``, ``IS [NOT] NULL``, ``NOT``, ``AND``, ``OR``,
``TIMESTAMP '...'`` / ``DATE '...'`` literals and calls of user-defined functions
(``adaptcq.query.udf``). STREAM evaluates these per tuple of a window (a-caching.txt §7.1;
CQL), so the generated code is kept lean: no helper calls at all (but the UDFs themselves).

SQL's three-valued logic is compiled by duality rather than by helpers. Every boolean
expression ``e`` gets two Python sources, ``T(e)`` (true exactly when ``e`` is TRUE) and
``F(e)`` (true exactly when ``e`` is FALSE); UNKNOWN is neither. Then
``T(NOT e) = F(e)``, ``T(a AND b) = T(a) and T(b)``, ``F(a AND b) = F(a) or F(b)`` and so
on, each node appearing once in each source. A WHERE clause passes a row when its condition is
TRUE, so a predicate is just ``T``; ``R.x > 5`` becomes ``(r[1] is not None and r[1] > 5)``.
The three-valued value of a condition (for a SELECT item) is
``(True if T else False if F else None)``.

A scalar value is a plain Python expression plus *guards*, the conditions under which it is
NULL: a NULL operand (``x is None``), or a zero divisor (SQL engines disagree on ``x / 0``;
here it is NULL, as in SQLite, so that one bad tuple cannot stop a continuous query).
Division is Python's true division, as in Spark SQL. Timestamps are naive-UTC
``datetime.datetime`` values; a string literal compared with a timestamp column is parsed at
compile time with ``datetime.fromisoformat``.

A UDF call ``f(a, b)`` (cacq.txt §5) becomes ``(_u0 := _udf_f(a, b))`` in a NULL guard, so
that the value tested and the value used come from one call; its arguments are passed as
three-valued values (None for NULL). Compiled code finds the UDF as ``udf.udf_symbol(name)``
in its namespace: :func:`compile_predicate` builds that itself (``udfs=None``: the default
registry), while the callers of :func:`to_python` and :func:`compile_projection`, which get
source text, must pass ``udfs=`` explicitly and evaluate with ``eval_namespace(udfs)`` (a
call in source compiled without ``udfs=`` is an :class:`ExprError`, not a NameError later).
"""

from __future__ import annotations

import datetime
import decimal
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import sqlglot.expressions as exp

from adaptcq.query import udf as udfmod
from adaptcq.query.logical import ColumnRef, sub_micro_span

Resolve = Callable[[ColumnRef], str]
Types = dict[str, dict[str, str]]

_COMPARISONS: dict[type, str] = {
    exp.EQ: "==", exp.NEQ: "!=", exp.LT: "<", exp.LTE: "<=", exp.GT: ">", exp.GTE: ">=",
}
_ARITHMETIC: dict[type, str] = {exp.Add: "+", exp.Sub: "-", exp.Mul: "*", exp.Div: "/"}
_TEMPORAL_TYPES = {
    exp.DataType.Type.DATE, exp.DataType.Type.DATETIME, exp.DataType.Type.TIMESTAMP,
    exp.DataType.Type.TIMESTAMPNTZ, exp.DataType.Type.TIMESTAMPTZ,
    exp.DataType.Type.TIMESTAMPLTZ,
}
_BOOLEAN_NODES = (exp.And, exp.Or, exp.Not, exp.Between, exp.In, exp.Is, exp.Boolean,
                  *_COMPARISONS)

SCALAR_KINDS = frozenset({"number", "decimal", "string", "timestamp", "date", "bool"})
"""Column kinds whose values can be compared, hashed (joined) and, for numbers, computed on.
The other kinds ("list", "struct", "map", "null", "other") may only be selected or tested with
IS [NOT] NULL (a union, of kind "other", only tested: ``logical.output_types``)."""

_NOT_CONDITIONS = frozenset({"string", "timestamp", "date"})
"""Scalar kinds that cannot stand as a condition (``_Compiler._truth_of_value``)."""

_FAMILY = {"decimal": "number", "date": "timestamp"}
"""A decimal column is a number and a date column a time for every check of kinds; the
finer kind only decides how a literal compared with the column is read (``_Compiler._context``):
as an exact ``Decimal``, or as a ``datetime.date``."""


def kind_family(kind: str | None) -> str | None:
    """"number" for "decimal", "timestamp" for "date", else ``kind``."""
    return _FAMILY.get(kind, kind) if kind is not None else None

INT64_MIN, INT64_MAX = -(2 ** 63), 2 ** 63 - 1

_KIND_WORDS = {
    "number": "a number", "decimal": "a decimal", "string": "a string",
    "timestamp": "a timestamp", "date": "a date",
    "bool": "a boolean", "list": "a list column", "struct": "a struct column",
    "map": "a map column",
    "null": "a column of type null (all its values NULL): give the column a type",
    "other": "a column of a non-scalar type (such as binary or a union)",
}


def describe_kind(kind: str) -> str:
    """``"a list column"``, ``"a string"``...: what a value of ``kind`` is, for messages."""
    return _KIND_WORDS.get(kind, f"of kind {kind!r}")


class ExprError(ValueError):
    """An expression that cannot be compiled; ``node`` is the offending sqlglot node."""

    def __init__(self, message: str, node: exp.Expression | None = None):
        super().__init__(message)
        self.node = node


def _timestamp_ns(text: str):
    """``repr`` of a timestamp literal with nanoseconds, a pandas Timestamp, reads
    ``Timestamp('...')``; pandas is imported only when one is evaluated."""
    import pandas as pd
    return pd.Timestamp(text)


LITERAL_NAMESPACE = {"datetime": datetime, "Decimal": decimal.Decimal,
                     "Timestamp": _timestamp_ns}
"""The names constants written inline use (``datetime.datetime(...)``, ``Decimal('1.1')``,
``Timestamp('...')``): every namespace generated code runs in holds them
(``engine.codegen.exec_source``)."""


def eval_namespace(udfs: udfmod.UDFs | None = None) -> dict[str, object]:
    """The globals that code from :func:`to_python` / :func:`compile_projection` needs: pass
    the ``udfs`` the code was compiled with (None: the default registry's)."""
    return {**LITERAL_NAMESPACE, **udfmod.udf_namespace(udfmod.resolve_udfs(udfs))}


def literal_context(kind: str | None, constant: exp.Expression | None = None) -> str | None:
    """How a literal compared with a column of ``kind`` is read (``constant_value``'s
    ``against``): "timestamp" beside a timestamp column or when the literal is a
    ``TIMESTAMP``/``DATE`` one, "date" beside a date column, "decimal" beside a decimal
    column, else None."""
    if kind in ("date", "decimal"):
        return kind
    if kind == "timestamp" or (constant is not None and is_temporal_cast(_strip(constant))):
        return "timestamp"
    return None


def constant_value(node: exp.Expression, against: str | None = None) -> object:
    """The Python value compiled code compares with for the constant ``node``: a number or
    string literal, a signed number, ``TIMESTAMP '...'`` / ``DATE '...'``, TRUE/FALSE.

    ``against``: what the other side of the comparison is (``literal_context``):
    "timestamp" (a string literal then means a timestamp, as in compiled code), "date"
    (a ``datetime.date``), "decimal" (a number is an exact ``Decimal``). Raises :class:`ExprError` for anything else,
    NULL included, and for a literal the compiler refuses. Computed by the compiler itself,
    so a grouped filter's constants (``query.cnf``) equal those of :func:`compile_predicate`.
    """
    inner = _strip(node)
    while isinstance(inner, exp.Neg):
        inner = _strip(inner.this)
    if not (isinstance(inner, (exp.Literal, exp.Boolean)) or is_temporal_cast(inner)):
        raise ExprError(f"{node.sql()} is not a constant", node)
    if inner is not _strip(node) and not (isinstance(inner, exp.Literal)
                                          and not inner.is_string):
        raise ExprError(f"{node.sql()} is not a constant", node)

    def no_columns(ref: ColumnRef) -> str:  # pragma: no cover - constants have none
        raise ExprError(f"{ref} is not a constant", node)

    consts: dict[str, object] = {}
    val = _Compiler(no_columns, None, consts, udfs={}).value(node, against)
    return eval(val.src, {**eval_namespace({}), **consts})


def parse_timestamp(text: str) -> datetime.datetime:
    """A timestamp literal as a naive-UTC datetime (ISO 8601; a date alone means midnight).

    Python's datetime holds microseconds, and ``fromisoformat`` drops further digits
    without a word: a literal with nanoseconds is a pandas ``Timestamp`` instead (a
    datetime that holds them), so that it compares exactly with a column in ns. It is read
    as ``fromisoformat`` reads the literal cut to the microsecond (any ISO form: a comma
    before the fraction, the basic form) plus the digits past it. Digits below a
    nanosecond, or nanoseconds outside what a ns timestamp spans, are refused (ValueError
    saying so)."""
    text = text.strip()
    start, end, extra = sub_micro_span(text) or (0, 0, "")
    if len(extra.rstrip("0")) > 3:
        raise ValueError(f"'{text}' has digits below a nanosecond")
    value = datetime.datetime.fromisoformat(text[:start] + text[end:] if extra else text)
    if value.tzinfo is not None:
        value = value.astimezone(datetime.UTC).replace(tzinfo=None)
    if not extra.rstrip("0"):
        return value
    import pandas as pd
    try:
        return pd.Timestamp(value) + pd.Timedelta(nanoseconds=int(extra[:3].ljust(3, "0")))
    except (OverflowError, pd.errors.OutOfBoundsDatetime):
        raise ValueError(f"'{text}' has nanoseconds, and a timestamp with nanoseconds lies "
                         "within 1677-09-21 and 2262-04-11") from None


def is_temporal_cast(node: exp.Expression) -> bool:
    """``TIMESTAMP '...'``, ``DATE '...'`` or ``CAST('...' AS TIMESTAMP)``: a string literal
    cast to a date/time type, the only cast the front end accepts."""
    return (isinstance(node, exp.Cast) and isinstance(node.this, exp.Literal)
            and node.this.is_string and node.to.this in _TEMPORAL_TYPES)


def to_python(expr: exp.Expression, resolve: Resolve, types: Types | None = None,
              udfs: udfmod.UDFs | None = None) -> str:
    """Python source of ``expr``'s value under SQL three-valued logic (None is NULL).

    ``resolve`` gives the source of a column's value (e.g. ``"r[2]"``); the code needs only
    builtins and ``eval_namespace(udfs)``. UDF calls compile only with ``udfs`` given.
    """
    return _Compiler(resolve, types, udfs=udfs, explicit=True).value3(expr)


def compile_projection(exprs: Iterable[exp.Expression], resolve: Resolve,
                       types: Types | None = None, udfs: udfmod.UDFs | None = None) -> str:
    """Source of a tuple holding the values of ``exprs`` (or of ``OutputColumn``s' exprs);
    evaluate it with ``eval_namespace(udfs)``."""
    compiler = _Compiler(resolve, types, udfs=udfs, explicit=True)
    items = [compiler.value3(getattr(e, "expr", e)) for e in exprs]
    return "(" + "".join(item + ", " for item in items).rstrip(" ") + ")"


def compile_predicate(expr: exp.Expression | None, columns: Sequence[str], stream: str,
                      types: Types | None = None, udfs: udfmod.UDFs | None = None
                      ) -> Callable[[tuple], bool]:
    """A function ``row -> bool`` that is True exactly when ``expr`` is TRUE for ``row``.

    ``row`` is a tuple of ``stream``'s values in ``columns`` order; columns of ``expr`` must
    be of ``stream`` (or unqualified). NULL/UNKNOWN does not pass, as in a SQL WHERE clause.
    The generated source is kept on the function as ``source``. ``expr=None`` passes all.
    ``udfs``: the functions calls may name (None: the default registry); a UDF that raises
    makes the function raise :class:`~adaptcq.query.udf.UDFError` naming it.
    """
    index = {name: i for i, name in enumerate(columns)}

    def resolve(ref: ColumnRef) -> str:
        if ref.stream not in ("", stream):
            raise ExprError(f"column {ref} is not a column of stream {stream!r}")
        if ref.column not in index:
            raise ExprError(f"column {ref.column!r} is not among the columns of stream "
                            f"{stream!r}: {', '.join(columns)}")
        return f"r[{index[ref.column]}]"

    consts: dict[str, object] = {}
    compiler = _Compiler(resolve, types, consts, stream, udfs=udfs)
    source = "True" if expr is None else compiler.true(expr)
    namespace = {**eval_namespace({}), **udfmod.udf_namespace(compiler.called), **consts}
    fn = eval(f"lambda r: {source}", namespace)
    fn.source = source
    return fn


@dataclass(frozen=True)
class _Val:
    """A compiled scalar: ``src`` is its value when no guard holds; each guard is a pair
    (source true when the value is NULL, source true when it is not); ``null`` marks a value
    that is always NULL."""

    src: str
    guards: tuple[tuple[str, str], ...] = ()
    null: bool = False

    def not_null(self, *more: str) -> str:
        """Source true when the value is non-NULL and every one of ``more`` holds."""
        return _all([g[1] for g in self.guards] + list(more))

    def is_null(self) -> str:
        if self.null:
            return "True"
        return _any([g[0] for g in self.guards])


def _all(parts: list[str]) -> str:
    parts = [p for p in parts if p != "True"]
    if "False" in parts:
        return "False"
    if not parts:
        return "True"
    return parts[0] if len(parts) == 1 else "(" + " and ".join(parts) + ")"


def _any(parts: list[str]) -> str:
    parts = [p for p in parts if p != "False"]
    if "True" in parts:
        return "True"
    if not parts:
        return "False"
    return parts[0] if len(parts) == 1 else "(" + " or ".join(parts) + ")"


def _merge(*vals: _Val) -> tuple[tuple[str, str], ...]:
    guards: list[tuple[str, str]] = []
    for v in vals:
        guards.extend(g for g in v.guards if g not in guards)
    return tuple(guards)


def _strip(node: exp.Expression) -> exp.Expression:
    while isinstance(node, exp.Paren):
        node = node.this
    return node


def _is_boolean(node: exp.Expression) -> bool:
    node = _strip(node)
    return isinstance(node, _BOOLEAN_NODES)


class _Compiler:
    """Compiles one expression tree. ``consts`` (optional) collects constants that would be
    costly to rebuild per tuple (datetimes, IN-sets of them) under names ``_k0, _k1, ...``;
    without it they are written inline. ``stream`` is the stream of unqualified columns.
    ``udfs`` are the functions calls may name (None: the default registry); ``explicit``
    refuses calls unless ``udfs`` was given (source text for a caller's namespace).
    ``called`` collects the UDFs the code calls."""

    def __init__(self, resolve: Resolve, types: Types | None,
                 consts: dict[str, object] | None = None, stream: str = "",
                 udfs: udfmod.UDFs | None = None, explicit: bool = False):
        self.resolve = resolve
        self.types = types or {}
        self.consts = consts
        self.stream = stream
        self.udfs = None if explicit and udfs is None else udfmod.resolve_udfs(udfs)
        self.called: dict[str, Callable[..., object]] = {}
        self.results = 0  # walrus names _u0, _u1, ... of UDF results

    # ----- three-valued value ---------------------------------------------------------
    def value3(self, node: exp.Expression) -> str:
        if _is_boolean(node):
            t, f = self.true(node), self.false(node)
            if {t, f} == {"True", "False"}:
                return t
            if f == "False":
                return f"(True if {t} else None)"
            return f"(True if {t} else False if {f} else None)"
        self._check_int_range(node)
        val = self.value(node)
        if val.null:
            return "None"
        if not val.guards:
            return val.src
        return f"(None if {val.is_null()} else {val.src})"

    # ----- TRUE / FALSE sources -------------------------------------------------------
    def true(self, node: exp.Expression) -> str:
        return self._truth(node, True)

    def false(self, node: exp.Expression) -> str:
        return self._truth(node, False)

    def _truth(self, node: exp.Expression, want: bool) -> str:
        node = _strip(node)
        if isinstance(node, exp.Not):
            return self._truth(node.this, not want)
        if isinstance(node, (exp.And, exp.Or)):
            parts = [self._truth(node.this, want), self._truth(node.expression, want)]
            conjunctive = isinstance(node, exp.And) == want
            return _all(parts) if conjunctive else _any(parts)
        if isinstance(node, exp.Boolean):
            return str(node.this == want)
        for kind, method in self._PREDICATES:
            if isinstance(node, kind):
                return method(self, node, want)
        return self._truth_of_value(node, want)

    def _truth_of_value(self, node: exp.Expression, want: bool) -> str:
        """A value standing as a condition: a boolean, or a number (nonzero is TRUE, as in
        DuckDB, SQLite and MySQL); a UDF's result by its truthiness (cacq.txt §5). A
        string, timestamp or date is refused (PostgreSQL refuses them, DuckDB casts a
        string and fails on most values; Python's truthiness kept 'false' and dropped '')
        and so is a list, struct or map."""
        kind = self._kind(node)
        if kind is not None and kind not in SCALAR_KINDS:
            raise ExprError(f"{_strip(node).sql()} is {describe_kind(kind)}, not a condition",
                            node)
        if kind in _NOT_CONDITIONS:
            inner, what = _strip(node), _strip(node).sql()
            if is_temporal_cast(inner):  # sqlglot writes it back as CAST(...)
                kind = _describe_constant(inner).split(" ")[1]
                what = f"{kind.upper()} {inner.this.sql()}"
            raise ExprError(f"{what} is {describe_kind(kind)}, not a condition "
                            "(a condition is a boolean, or a number where nonzero is TRUE; "
                            "compare it, e.g. with = or IS NOT NULL)", node)
        val = self.value(node)
        if val.null:
            return "False"
        return val.not_null(f"bool({val.src})" if want else f"not {val.src}")

    def _comparison(self, node: exp.Binary, want: bool) -> str:
        self._check_comparable(node, [node.this, node.expression])
        against = self._context([node.this, node.expression])
        left = self.value(node.this, against)
        right = self.value(node.expression, against)
        op = _COMPARISONS[type(node)]
        guard = self._nan_guard([(node.this, left), (node.expression, right)]) \
            if op not in ("==", "!=") else []
        return _compare(left, op, right, want, guard)

    def _nan_guard(self, operands) -> list[str]:
        """The float operands of an ordering beside a decimal one: Python's Decimal raises
        InvalidOperation when ordered against a NaN float, where NaN is neither less nor
        greater; the test then holds only for a float that is no NaN (``v == v``)."""
        kinds = [self._kind(n) for n, _ in operands]
        if "decimal" not in kinds:
            return []
        return [v.src for (_, v), k in zip(operands, kinds, strict=True) if k == "number"]

    def _between(self, node: exp.Between, want: bool) -> str:
        self._check_comparable(node, [node.this, node.args["low"], node.args["high"]])
        against = self._context([node.this])
        x = self.value(node.this, against)
        low = self.value(node.args["low"], against)
        high = self.value(node.args["high"], against)
        if not want:  # NOT (low <= x) OR NOT (x <= high), each UNKNOWN when a side is NULL
            # (not x < low OR x > high: a NaN is neither, but NOT BETWEEN keeps it, as
            # NOT (x <= high) does and as the vectorized executor does)
            return _any([_compare(low, "<=", x, False), _compare(x, "<=", high, False)])
        if x.null or low.null or high.null:
            return "False"
        test = f"{low.src} <= {x.src} <= {high.src}"
        guard = self._nan_guard([(node.this, x), (node.args["low"], low),
                                 (node.args["high"], high)])
        if guard:
            test = " and ".join([*(f"{g} == {g}" for g in guard), f"({test})"])
        return _Val("", _merge(x, low, high)).not_null(test)

    def _in(self, node: exp.In, want: bool) -> str:
        if node.args.get("query") or node.args.get("unnest") or node.args.get("field"):
            raise ExprError("IN with a subquery is not supported", node)
        self._check_comparable(node, [node.this, *node.expressions])
        against = self._context([node.this])
        x = self.value(node.this, against)
        items = [self.value(e, against) for e in node.expressions]
        if not items or any(i.guards or i.null for i in items):  # x = a OR x = b ...
            tests = [_compare(x, "==", item, want) for item in items]
            return _any(tests) if want else _all(tests)
        if x.null:
            return "False"
        test = f"{x.src} {'in' if want else 'not in'} {self._set_source(node)}"
        return x.not_null(test)

    def _set_source(self, node: exp.In) -> str:
        """The constant collection of an ``IN`` list: a set display of numbers and strings
        (CPython folds it into a frozenset constant), a hoisted frozenset of datetimes when
        constants are collected, else a tuple of datetimes. Beside a date column the items
        are dates, beside a decimal column exact ``Decimal``s (hoisted the same way)."""
        against = self._context([node.this])
        if against is None:
            sources = [self.value(e).src for e in node.expressions]
            return "{" + ", ".join(dict.fromkeys(sources)) + "}"
        if against == "decimal":
            try:
                values = [self._exact(e) for e in node.expressions]
            except ExprError:  # not all literals: a set built per row, still exact
                sources = [self.value(e, against).src for e in node.expressions]
                return "{" + ", ".join(dict.fromkeys(sources)) + "}"
        else:
            values = [self._time(_literal_of(e), against) for e in node.expressions]
        if self.consts is not None:
            return self._constant(frozenset(values))
        return "(" + "".join(repr(v) + ", " for v in dict.fromkeys(values)) + ")"

    def _is(self, node: exp.Is, want: bool) -> str:
        if not isinstance(node.expression, exp.Null):
            raise ExprError(f"IS {node.expression.sql()} is not supported (only IS [NOT] NULL)",
                            node)
        if _is_boolean(node.this):
            t, f = self.true(node.this), self.false(node.this)
            known = _any([t, f])
            return _negate(known) if want else known
        val = self.value(node.this)
        null = val.is_null()
        return null if want else _negate(null)

    _PREDICATES: tuple = (
        (tuple(_COMPARISONS), _comparison),
        (exp.Between, _between),
        (exp.In, _in),
        (exp.Is, _is),
    )

    # ----- scalar values --------------------------------------------------------------
    def value(self, node: exp.Expression, against: str | None = None) -> _Val:
        """``node``'s value; ``against`` (``_context``) says how a literal in it is read."""
        node = _strip(node)
        if isinstance(node, exp.Column):
            return self._column(node)
        if isinstance(node, exp.Literal):
            return self._literal(node, against)
        if isinstance(node, exp.Null):
            return _Val("None", null=True)
        if isinstance(node, exp.Boolean):
            if against in ("timestamp", "date"):
                raise ExprError(f"cannot compare a {against} with {node.sql()}", node)
            return _Val(repr(bool(node.this)))
        if is_temporal_cast(node):
            return _Val(self._constant(self._time(node.this, against or "timestamp")))
        if isinstance(node, exp.Neg):
            self._check_number(node.this, "-", node)
            inner = self.value(node.this, against)
            return _Val(f"(-{inner.src})", inner.guards, inner.null)
        if type(node) in _ARITHMETIC:
            return self._arithmetic(node)
        if isinstance(node, exp.Anonymous):
            return self._call(node)
        if _is_boolean(node):
            t, f = self.true(node), self.false(node)
            known = _any([t, f])
            return _Val(f"({t})", ((_negate(known), known),))
        raise ExprError(f"unsupported expression {node.sql()!r}", node)

    def _column(self, node: exp.Column) -> _Val:
        if isinstance(node.this, exp.Star):
            raise ExprError(f"'{node.sql()}' is not a value", node)
        src = self.resolve(ColumnRef(node.table, node.name))
        return _Val(src, ((f"{src} is None", f"{src} is not None"),))

    def _literal(self, node: exp.Literal, against: str | None) -> _Val:
        if node.is_string:
            if against in ("timestamp", "date"):
                return _Val(self._constant(self._time(node, against)))
            return _Val(repr(node.this))
        if against in ("timestamp", "date"):
            raise ExprError(f"cannot compare a {against} with the number {node.this}", node)
        text = node.this
        try:
            return _Val(repr(int(text)))
        except ValueError:
            pass
        if against == "decimal":  # SQL's 1.1 is exact: a decimal 1.10 equals it
            return _Val(self._constant(self._exact(node)))
        try:
            number = float(text)
        except ValueError:
            raise ExprError(f"{text} is not a number", node) from None
        if not math.isfinite(number):  # repr would be 'inf'/'nan': not Python source
            raise ExprError(f"{text} is out of range for a number", node)
        return _Val(repr(number))

    def _call(self, node: exp.Anonymous) -> _Val:
        """A UDF call: one call per evaluation, its result bound to a fresh name so that
        the NULL guard and the value read the same result."""
        name = node.name.lower()
        if self.udfs is None:
            raise ExprError(f"the UDF call {node.sql()} needs the UDFs: compile with udfs= "
                            "and evaluate with eval_namespace(udfs)", node)
        fn = self.udfs.get(name)
        if fn is None:
            known = ", ".join(sorted(self.udfs)) or "none"
            raise ExprError(f"unknown function {node.name}: not a registered UDF "
                            f"(registered: {known})", node)
        self.called[name] = fn
        args = []
        for arg in node.expressions:
            inner = _strip(arg)
            if isinstance(inner, exp.Column):  # the common case: no guard needed
                args.append(self._column(inner).src)
            else:
                args.append(self.value3(arg))
        var = f"_u{self.results}"
        self.results += 1
        call = f"({var} := {udfmod.udf_symbol(name)}({', '.join(args)}))"
        return _Val(var, ((f"{call} is None", f"{call} is not None"),))

    def _arithmetic(self, node: exp.Binary) -> _Val:
        op = _ARITHMETIC[type(node)]
        for operand in (node.this, node.expression):
            # As in SELECT (logical.output_types): Python's Decimal does not mix with float
            # (R.d * 0.5 raised TypeError at the first row), and no result type is defined.
            if self._kind(operand) == "decimal":
                raise ExprError(f"arithmetic on the decimal value {_strip(operand).sql()} is "
                                "not supported", node)
            self._check_number(operand, op, node)
            self._check_int_range(operand)
        left, right = self.value(node.this), self.value(node.expression)
        src = f"({left.src} {_ARITHMETIC[type(node)]} {right.src})"
        guards = _merge(left, right)
        if isinstance(node, exp.Div):
            zero = (f"{right.src} == 0", f"{right.src} != 0")
            guards = guards + ((zero,) if zero not in guards else ())
        return _Val(src, guards, left.null or right.null)

    # ----- timestamps and constants ---------------------------------------------------
    def _temporal(self, node: exp.Expression) -> bool:
        node = _strip(node)
        return is_temporal_cast(node) or self._kind(node) in ("timestamp", "date")

    def _context(self, operands: list[exp.Expression]) -> str | None:
        """How the literals compared with ``operands`` (the sides of a comparison; BETWEEN's
        or IN's operand) are read: "date" beside a date column, "timestamp" beside any other
        time, "decimal" beside a decimal column, else None (``literal_context``)."""
        kinds = [self._kind(o) for o in operands]
        if any(self._temporal(o) for o in operands):
            return "date" if "date" in kinds else "timestamp"
        return "decimal" if "decimal" in kinds else None

    def _kind(self, node: exp.Expression) -> str | None:
        """The kind of a value where it is known: the schema kind of a column,
        "number"/"string" for a literal, "number" for arithmetic, "bool" for a condition,
        "timestamp" for a timestamp literal; None when unknown (NULL, no schema)."""
        node = _strip(node)
        if isinstance(node, exp.Column) and not isinstance(node.this, exp.Star):
            return self.types.get(node.table or self.stream, {}).get(node.name)
        if isinstance(node, exp.Literal):
            return "string" if node.is_string else "number"
        if is_temporal_cast(node):
            return "timestamp"
        if isinstance(node, exp.Neg):  # -R.d is a decimal still: its literals are exact
            return "decimal" if self._kind(node.this) == "decimal" else "number"
        if type(node) in _ARITHMETIC:
            return "number"
        if _is_boolean(node):
            return "bool"
        return None

    def _check_comparable(self, node: exp.Expression, operands: list[exp.Expression]) -> None:
        """Reject comparing a list/struct value, and values of different kinds, where the
        kinds are known: Python would raise at run time (``int > datetime``), or quietly
        find nothing equal (``'x' = TIMESTAMP '...'``), on the first row."""
        for o in operands:
            kind = self._kind(o)
            if kind is not None and kind not in SCALAR_KINDS:
                raise ExprError(f"cannot compare {_strip(o).sql()}: it is "
                                f"{describe_kind(kind)}; comparisons need scalar values "
                                "(numbers, strings, timestamps, booleans)", o)
        self._check_kinds(node, operands)
        kinds = {kind_family(self._kind(o)) for o in operands} & {"number", "string"}
        if len(kinds) == 2:
            raise ExprError(f"cannot compare a number with a string in '{node.sql()}'", node)

    def _check_kinds(self, node: exp.Expression, operands: list[exp.Expression]) -> None:
        """Each value compared (both sides of a comparison; BETWEEN's and IN's operand with
        each bound or item) must be of the other's kind. A string literal beside a
        timestamp is a timestamp literal, exactly where the compiler reads it so (either
        side of a comparison, BETWEEN's and IN's operand); a boolean compares with a number
        as 1/0 (Python's and Spark SQL's reading). A number with a string is left to the
        caller's message. The error points at the literal when one side is a literal."""
        both = type(node) in _COMPARISONS
        temporal = (any(self._temporal(o) for o in operands) if both
                    else self._temporal(operands[0]))
        columns = {self._kind(o) for o in operands if not _is_constant(o)}
        if {"date", "timestamp"} <= columns:  # Python: never equal, and < raises
            raise ExprError(f"cannot compare a date with a timestamp in '{node.sql()}' (a "
                            "date is never equal to a timestamp, and neither is before the "
                            "other); compare the date with a DATE '...' literal", node)
        kinds = [self._kind(o) for o in operands]  # as named in messages
        if temporal:
            kinds = [("timestamp" if _is_string_literal(o) else k)
                     for o, k in zip(operands, kinds, strict=True)]
        first, kind0 = operands[0], kinds[0]
        for other, kind in zip(operands[1:], kinds[1:], strict=True):
            pair = {kind_family(kind0), kind_family(kind)}
            if (None in pair or len(pair) == 1 or pair == {"number", "bool"}
                    or pair == {"number", "string"}):
                continue
            if _is_constant(other):
                raise ExprError(f"cannot compare {describe_kind(kind0)} with "
                                f"{_describe_constant(other)}", other)
            if _is_constant(first):
                raise ExprError(f"cannot compare {describe_kind(kind)} with "
                                f"{_describe_constant(first)}", first)
            raise ExprError(f"cannot compare {describe_kind(kind0)} with "
                            f"{describe_kind(kind)} in '{node.sql()}'", node)

    def _check_number(self, operand: exp.Expression, op: str, node: exp.Expression) -> None:
        """Arithmetic takes numbers: refuse a string, timestamp, boolean or list operand."""
        kind = self._kind(operand)
        if kind is not None and kind_family(kind) != "number":
            raise ExprError(f"'{op}' needs numbers, but {_strip(operand).sql()} is "
                            f"{describe_kind(kind)} (in '{node.sql()}')", operand)

    @staticmethod
    def _check_int_range(node: exp.Expression) -> None:
        """An integer literal that is computed with or output must fit 64 bits (the output
        column's type; Python would carry it exactly and fail only when writing). In
        comparisons any integer is fine: they are exact."""
        sign, inner = 1, _strip(node)
        while isinstance(inner, exp.Neg):
            sign, inner = -sign, _strip(inner.this)
        if not (isinstance(inner, exp.Literal) and not inner.is_string):
            return
        try:
            value = sign * int(inner.this)
        except ValueError:
            return  # not an integer: a float literal, checked by _literal
        if not INT64_MIN <= value <= INT64_MAX:
            approx = float(inner.this)
            example = f", e.g. {approx:.6g}," if math.isfinite(approx) else ""
            raise ExprError(f"{inner.this} is out of range for a 64-bit integer (write it "
                            f"as a floating-point number{example} to compute in floating "
                            "point)", inner)

    @staticmethod
    def _timestamp(node: exp.Literal) -> datetime.datetime:
        try:
            return parse_timestamp(node.this)
        except ValueError as e:
            if "nanosecond" in str(e) and str(e).startswith(f"'{node.this.strip()}'"):
                raise ExprError(f"invalid timestamp literal: {e}", node) from None
            raise ExprError(f"invalid timestamp literal '{node.this}' (expected ISO 8601, "
                            "e.g. '2024-01-01 00:00:00')", node) from None

    def _time(self, node: exp.Literal, against: str) -> datetime.datetime | datetime.date:
        """A time literal compared with a timestamp (a naive-UTC datetime) or with a date
        column (a ``datetime.date``: Python's date never equals a datetime and cannot be
        ordered against one). Beside a date, a time of day other than midnight is refused:
        SQL would compare the date as its midnight, which a date value cannot express
        exactly here."""
        value = self._timestamp(node)
        if against != "date":
            return value
        if value.time() != datetime.time(0) or getattr(value, "nanosecond", 0):
            raise ExprError(f"a date is compared with '{node.this}', which has a time of day "
                            f"({value.time()} UTC); compare it with a date, e.g. DATE "
                            f"'{value.date()}'", node)
        return value.date()

    @staticmethod
    def _exact(node: exp.Expression) -> decimal.Decimal | int:
        """A number literal (signed) compared with a decimal column, exactly as written."""
        sign, inner = 1, _strip(node)
        while isinstance(inner, exp.Neg):
            sign, inner = -sign, _strip(inner.this)
        if not (isinstance(inner, exp.Literal) and not inner.is_string):
            raise ExprError(f"cannot compare a decimal with {node.sql()}", node)
        try:
            value = decimal.Decimal(inner.this)
        except decimal.InvalidOperation:
            raise ExprError(f"{inner.this} is not a number", inner) from None
        if not value.is_finite():
            raise ExprError(f"{inner.this} is out of range for a number", inner)
        if sign < 0:  # (not sign * value: arithmetic rounds to the context's 28 digits)
            value = value.copy_negate()
        return int(value) if value == value.to_integral_value() else value

    def _constant(self, value: object) -> str:
        if self.consts is None:
            return repr(value)
        for name, known in self.consts.items():
            if known == value and type(known) is type(value):
                return name
        name = f"_k{len(self.consts)}"
        self.consts[name] = value
        return name


def _is_string_literal(node: exp.Expression) -> bool:
    node = _strip(node)
    return isinstance(node, exp.Literal) and node.is_string


def _is_constant(node: exp.Expression) -> bool:
    """A literal as written: a number (signed), a string, TRUE/FALSE, a timestamp or date."""
    inner = _strip(node)
    while isinstance(inner, exp.Neg):
        inner = _strip(inner.this)
    if inner is not _strip(node):
        return isinstance(inner, exp.Literal) and not inner.is_string
    return isinstance(inner, (exp.Literal, exp.Boolean)) or is_temporal_cast(inner)


def _describe_constant(node: exp.Expression) -> str:
    """``the number -5``, ``the string 'x'``, ``the timestamp '2024-01-01'``, ``TRUE``."""
    inner = _strip(node)
    if isinstance(inner, exp.Neg) or (isinstance(inner, exp.Literal) and not inner.is_string):
        return f"the number {inner.sql()}"
    if isinstance(inner, exp.Literal):
        return f"the string {inner.sql()}"
    if is_temporal_cast(inner):  # sqlglot writes it back as CAST(...): say what was meant
        what = "date" if inner.to.this == exp.DataType.Type.DATE else "timestamp"
        return f"the {what} {inner.this.sql()}"
    return inner.sql()


def _literal_of(node: exp.Expression) -> exp.Literal:
    """The string literal of a timestamp item (``'...'`` or ``TIMESTAMP '...'``)."""
    node = _strip(node)
    literal = node.this if is_temporal_cast(node) else node
    if not (isinstance(literal, exp.Literal) and literal.is_string):
        raise ExprError(f"cannot compare a timestamp with {node.sql()}", node)
    return literal


def _compare(left: _Val, op: str, right: _Val, want: bool, nan_guard=()) -> str:
    """T (``want``) or F of ``left op right``: UNKNOWN when either side is NULL; with
    ``nan_guard`` (sources that may be a NaN float beside a decimal) false where one is."""
    if left.null or right.null:
        return "False"
    test = f"{left.src} {op} {right.src}"
    if nan_guard:
        test = "(" + " and ".join([*(f"{g} == {g}" for g in nan_guard), test]) + ")"
    return _Val("", _merge(left, right)).not_null(test if want else f"not {test}")


def _negate(src: str) -> str:
    if src in ("True", "False"):
        return str(src == "False")
    return f"not {src}"
