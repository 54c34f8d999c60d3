"""Selections evaluated over a column batch with Arrow compute (the vectorized executor's
ingestion; docs/vector.md). Same meaning as ``query.expr.compile_predicate``: SQL's
three-valued logic (Arrow's Kleene ``and``/``or``, a comparison with NULL is NULL), and a
row passes only when the condition is TRUE.

Only a subset is translated: columns, number, string, boolean and NULL literals, the six
comparisons, BETWEEN, IN over a list of non-NULL literals, IS [NOT] NULL of a value, AND,
OR, NOT, parentheses, a boolean column standing alone as a condition, arithmetic
(``+ - * /`` and unary minus) on numbers, and a timestamp column compared with (or BETWEEN)
timestamp constants (``'2024-01-01'``, ``TIMESTAMP '...'``, ``DATE '...'``: the values
``expr.constant_value`` gives the per-row compiler, naive UTC, made the column's Arrow
type), or IN a list of them. Anything else (UDF calls) makes :func:`arrow_predicate`
return None, and the caller evaluates the selection row by row with
``compile_predicate`` instead; a timestamp constant that the column's type cannot hold
exactly (a fraction of a second against a column in seconds, a date column) raises
``pa.ArrowTypeError`` at evaluation, with the same effect.

Arithmetic computes what the per-row compiler's Python computes, or raises
``pa.ArrowInvalid`` (the caller then evaluates that stream's selection per row): integers
(any width, as int64) with the checked kernels, where Python's integers never overflow;
with a float operand, or for ``/`` (true division, as in Spark SQL), in float64, the
integers cast exactly (the cast refuses one beyond 2^53, which Python would round); a zero
divisor gives NULL, as the compiler's guard does; other number types (decimals) raise
``pa.ArrowTypeError``.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import sqlglot.expressions as exp

from adaptcq.stream.arrays import to_numpy


def _check_exact(a, b) -> None:
    """Refuse comparing a decimal with a float: Arrow casts one to the other, where Python
    compares them exactly (``Decimal("0.10") == 0.1`` is False: the float is
    0.1000000000000000055...). The ``pa.ArrowTypeError`` makes the caller evaluate the
    selection row by row, as the per-tuple engine does."""
    ta, tb = a.type, b.type
    if (pa.types.is_decimal(ta) and pa.types.is_floating(tb)) or (
            pa.types.is_floating(ta) and pa.types.is_decimal(tb)):
        raise pa.ArrowTypeError("a decimal compared with a float: compared exactly, "
                                "row by row")


def _exact(op: Callable) -> Callable:
    """``op`` (an Arrow comparison) after ``_check_exact``."""
    def compare(a, b):
        _check_exact(a, b)
        return op(a, b)
    return compare


_COMPARE = {exp.EQ: _exact(pc.equal), exp.NEQ: _exact(pc.not_equal),
            exp.LT: _exact(pc.less), exp.LTE: _exact(pc.less_equal),
            exp.GT: _exact(pc.greater), exp.GTE: _exact(pc.greater_equal)}


class _Unsupported(Exception):
    """A node this translator leaves to the per-row compiler."""


def arrow_predicate(expr: exp.Expression | None, stream: str,
                    kinds: dict[str, str] | None = None
                    ) -> Callable[[pa.Table], np.ndarray] | None:
    """``table -> bool mask`` (rows where ``expr`` is TRUE) for ``stream``'s rows as a table
    of its columns, or None when ``expr`` uses what is not translated (module docstring).
    ``kinds``: the stream's column kinds (``LogicalQuery.types[stream]``); a timestamp
    column is translated only where compared with timestamp constants (a string compared
    with it is a timestamp literal, as in the per-row compiler)."""
    if expr is None:
        return None
    temporal = frozenset(c for c, k in (kinds or {}).items()
                         if k not in ("number", "decimal", "string", "bool"))
    booleans = frozenset(c for c, k in (kinds or {}).items() if k == "bool")
    try:
        fn = _Translator(stream, booleans, temporal).condition(expr)
    except _Unsupported:
        return None

    def mask(table: pa.Table) -> np.ndarray:
        n = table.num_rows
        got = fn(table)
        if isinstance(got, pa.Scalar):  # a constant condition
            return np.full(n, got.as_py() is True)
        if isinstance(got, pa.ChunkedArray):
            got = got.combine_chunks()
        return to_numpy(got, null=False)  # NULL (unknown) is not TRUE
    return mask


def _strip(node: exp.Expression) -> exp.Expression:
    while isinstance(node, exp.Paren):
        node = node.this
    return node


class _Translator:
    """One stream's selection as Arrow compute: ``booleans``, its boolean columns (which
    may stand alone as a condition); ``temporal``, its timestamp columns (compared with
    timestamp constants only)."""

    def __init__(self, stream: str, booleans: frozenset = frozenset(),
                 temporal: frozenset = frozenset()):
        self.stream, self.booleans, self.temporal = stream, booleans, temporal

    def condition(self, node: exp.Expression):
        node = _strip(node)
        if isinstance(node, exp.Not):
            inner = self.condition(node.this)
            return lambda t: pc.invert(inner(t))
        if isinstance(node, (exp.And, exp.Or)):
            a, b = self.condition(node.this), self.condition(node.expression)
            op = pc.and_kleene if isinstance(node, exp.And) else pc.or_kleene
            return lambda t: op(a(t), b(t))
        if (isinstance(node, exp.Column) and node.name in self.booleans
                and node.table in ("", self.stream)):  # a bare boolean column: TRUE where it is
            name = node.name

            def column(t):
                col = t.column(name)
                if col.type != pa.bool_():
                    raise pa.ArrowTypeError(f"{name} is {col.type}, not a boolean")
                return col
            return column
        if isinstance(node, exp.Boolean):
            value = pa.scalar(bool(node.this))
            return lambda t: value
        if type(node) in _COMPARE:
            op = _COMPARE[type(node)]
            a, b = self.compared(node.this, node.expression)
            return lambda t: op(a(t), b(t))
        if isinstance(node, exp.Between):
            x, lo = self.compared(node.this, node.args["low"])
            _, hi = self.compared(node.this, node.args["high"])
            ge, le = _COMPARE[exp.GTE], _COMPARE[exp.LTE]
            return lambda t: pc.and_kleene(ge(x(t), lo(t)), le(x(t), hi(t)))
        if isinstance(node, exp.In):
            if node.args.get("query") or node.args.get("unnest") or node.args.get("field"):
                raise _Unsupported
            if not node.expressions:
                raise _Unsupported
            if self.is_temporal(node.this):
                return self.temporal_in(node)
            values = [_constant(e) for e in node.expressions]
            if len({type(v) for v in values}) > 1 and not all(
                    isinstance(v, int | float) for v in values):
                raise _Unsupported
            x = self.value(node.this)
            return lambda t: _is_in(x(t), pa.array(values))
        if isinstance(node, exp.Is) and isinstance(node.expression, exp.Null):
            if isinstance(_strip(node.this), (exp.Not, exp.And, exp.Or, exp.Predicate)):
                raise _Unsupported
            x = self.value(node.this, temporal_ok=True)
            return lambda t: is_null(x(t))
        raise _Unsupported

    def temporal_in(self, node: exp.In):
        """A timestamp column IN a list of timestamp constants, each made the column's
        Arrow type as in a comparison (a NULL item is the per-row compiler's: the answer
        is then NULL, not FALSE, where nothing matches)."""
        if any(isinstance(_strip(e), exp.Null) for e in node.expressions):
            raise _Unsupported
        x = self.value(node.this, temporal_ok=True)
        items = [_timestamp_constant(e, x) for e in node.expressions]

        def is_in(t):
            col = x(t)
            return _is_in(col, pa.array([f(t) for f in items], col.type))
        return is_in

    def is_temporal(self, node: exp.Expression) -> bool:
        node = _strip(node)
        return isinstance(node, exp.Column) and node.name in self.temporal

    def compared(self, a: exp.Expression, b: exp.Expression):
        """The two sides of a comparison. Beside a timestamp column, the other side is a
        timestamp column too, or a constant read as the per-row compiler reads it
        (``constant_value(..., "timestamp")``: a string is a timestamp literal)."""
        ta, tb = self.is_temporal(a), self.is_temporal(b)
        if not (ta or tb):
            return self.value(a), self.value(b)
        fa = self.value(a, temporal_ok=True) if ta else None
        fb = self.value(b, temporal_ok=True) if tb else None
        if fa is None:
            fa = _timestamp_constant(a, fb)
        if fb is None:
            fb = _timestamp_constant(b, fa)
        return fa, fb

    def value(self, node: exp.Expression, temporal_ok: bool = False):
        node = _strip(node)
        stream = self.stream
        if isinstance(node, exp.Column):
            if isinstance(node.this, exp.Star) or node.table not in ("", stream):
                raise _Unsupported
            if node.name in self.temporal and not temporal_ok:
                raise _Unsupported  # a timestamp only in comparisons, BETWEEN, IN, IS NULL
            name = node.name
            return lambda t: t.column(name)
        if isinstance(node, exp.Literal):
            value = pa.scalar(_literal(node))
            return lambda t: value
        if isinstance(node, exp.Null):
            value = pa.scalar(None)
            return lambda t: value
        if isinstance(node, exp.Neg):
            try:  # a negative number literal (-9223372036854775808 included)
                value = pa.scalar(_constant(node))
                return lambda t: value
            except _Unsupported:
                pass
            x = self.operand(node.this)
            return lambda t: _negate(_number(x(t)))
        if type(node) in _ARITHMETIC or isinstance(node, exp.Div):
            a, b = self.operand(node.this), self.operand(node.expression)
            if isinstance(node, exp.Div):
                return lambda t: _divide(_number(a(t)), _number(b(t)))
            name = _ARITHMETIC[type(node)]
            return lambda t: _arith(name, _number(a(t)), _number(b(t)))
        raise _Unsupported  # casts, calls: the per-row compiler's

    def operand(self, node: exp.Expression):
        """An arithmetic operand: a number-valued expression (a NULL, boolean or string
        literal, or a condition, is left to the per-row compiler, which says what it
        means)."""
        inner = _strip(node)
        if isinstance(inner, (exp.Null, exp.Boolean)) or (
                isinstance(inner, exp.Literal) and inner.is_string):
            raise _Unsupported
        if not isinstance(inner, (exp.Column, exp.Literal, exp.Neg, exp.Div, *_ARITHMETIC)):
            raise _Unsupported
        return self.value(inner)


_ARITHMETIC = {exp.Add: "add", exp.Sub: "subtract", exp.Mul: "multiply"}


def is_null(col):
    """SQL's ``col IS NULL`` over a column. A union's value is NULL when its selected child's
    is: a union has no validity bitmap of its own, and before pyarrow 26 ``pc.is_null`` was
    false at every row of one (the vectorized executor lost the rows MJoin returned)."""
    if not pa.types.is_union(col.type):
        return pc.is_null(col)
    if isinstance(col, pa.ChunkedArray):
        return pa.chunked_array([_union_nulls(c) for c in col.chunks], pa.bool_())
    return _union_nulls(col)


def _union_nulls(arr: pa.UnionArray) -> pa.Array:
    """Which values of a union array are NULL: each child's nulls at the rows that select
    it (a sparse union's children are as long as the union, a dense one's are indexed by
    its offsets). The type-id and offset buffers are read at the array's own offset:
    ``type_codes`` and ``offsets`` ignore a slice's."""
    n, at, buffers = len(arr), arr.offset, arr.buffers()
    codes = np.frombuffer(buffers[1], dtype=np.int8)[at:at + n]
    out = np.zeros(n, dtype=bool)
    dense = arr.type.mode == "dense"
    offsets = np.frombuffer(buffers[2], dtype=np.int32)[at:at + n] if dense else None
    for i, code in enumerate(arr.type.type_codes):
        rows = codes == code
        if not rows.any():
            continue
        nulls = np.asarray(is_null(arr.field(i)).to_numpy(zero_copy_only=False), dtype=bool)
        out[rows] = nulls[offsets[rows]] if dense else nulls[rows]
    return pa.array(out, pa.bool_())


def _is_in(col, value_set: pa.Array):
    """SQL's ``col IN (list of non-NULL values)``: NULL where ``col`` is NULL (a decimal
    column with float values: row by row, ``_check_exact``)."""
    _check_exact(col, value_set)
    if pa.types.is_floating(col.type) or pa.types.is_floating(value_set.type):
        # is_in tells -0.0 from 0.0 (it compares bits); Python's == and Arrow's
        # comparisons do not. Adding 0.0 makes every zero +0.0 and changes nothing else.
        col, value_set = _plus_zero(col), _plus_zero(value_set)
    return pc.if_else(is_null(col), pa.scalar(None, pa.bool_()),
                      pc.is_in(col, value_set=value_set))


def _plus_zero(values):
    return pc.add(values, 0.0) if pa.types.is_floating(values.type) else values


def _timestamp_constant(node: exp.Expression, column):
    """A constant compared with a timestamp column (``column``: table -> the column), as
    the column's Arrow type at evaluation; NULL is a NULL of that type."""
    from adaptcq.query.expr import ExprError, constant_value
    if isinstance(_strip(node), exp.Null):
        return lambda t: pa.scalar(None, column(t).type)
    try:
        value = constant_value(node, "timestamp")
    except ExprError:
        raise _Unsupported from None
    if not isinstance(value, datetime.datetime):
        raise _Unsupported
    cache: dict = {}

    def scalar(t):
        typ = column(t).type
        got = cache.get(typ)
        if got is None:
            got = cache[typ] = _as_timestamp(value, typ)
        return got
    return scalar


def _as_timestamp(value: datetime.datetime, typ: pa.DataType) -> pa.Scalar:
    """A naive-UTC datetime as a scalar of timestamp type ``typ``, exactly; anything else
    raises ``pa.ArrowTypeError`` (the stream's selection then runs per row)."""
    if not pa.types.is_timestamp(typ):
        raise pa.ArrowTypeError(f"a timestamp constant against a {typ} column")
    if typ.tz is not None:
        value = value.replace(tzinfo=datetime.UTC)
    micros = {"s": 1_000_000, "ms": 1_000, "us": 1, "ns": 1}[typ.unit]
    if value.microsecond % micros or (getattr(value, "nanosecond", 0) and typ.unit != "ns"):
        raise pa.ArrowTypeError(f"{value} does not fit a {typ} column exactly")
    return pa.scalar(value, type=typ)


def _number(v):
    """An arithmetic operand as int64 or float64 (Python's int and float); other types
    (decimals, strings) raise ``pa.ArrowTypeError``: the caller goes per row."""
    t = v.type
    if pa.types.is_integer(t):
        return v if t == pa.int64() else pc.cast(v, pa.int64())  # (safe: may raise)
    if pa.types.is_floating(t):
        return v if t == pa.float64() else pc.cast(v, pa.float64())
    raise pa.ArrowTypeError(f"arithmetic on {t} is left to the per-row compiler")


def _floats(*vs):
    """Operands in float64, integers cast exactly (beyond 2^53 the cast raises)."""
    return [v if v.type == pa.float64() else pc.cast(v, pa.float64()) for v in vs]


def _arith(name: str, a, b):
    if a.type == pa.int64() and b.type == pa.int64():
        return getattr(pc, f"{name}_checked")(a, b)  # overflow raises
    return getattr(pc, name)(*_floats(a, b))


def _divide(a, b):
    a, b = _floats(a, b)
    return pc.if_else(pc.equal(b, 0.0), pa.scalar(None, pa.float64()), pc.divide(a, b))


def _negate(a):
    return pc.negate_checked(a) if a.type == pa.int64() else pc.negate(a)


def _constant(node: exp.Expression):
    """An IN item's value: a literal, or a negated number literal; anything else (NULL,
    a computed item) is the per-row compiler's OR chain."""
    node, sign = _strip(node), 1
    while isinstance(node, exp.Neg):
        node, sign = _strip(node.this), -sign
    if not isinstance(node, exp.Literal) or (sign < 0 and node.is_string):
        raise _Unsupported
    return _literal(node, sign)


def _literal(node: exp.Literal, sign: int = 1):
    if node.is_string:
        return node.this
    try:
        value = sign * int(node.this)
    except ValueError:
        pass
    else:  # beyond int64 Arrow has no integer for it; Python compares it exactly
        if not -(2**63) <= value < 2**63:
            raise _Unsupported
        return value
    try:
        value = sign * float(node.this)
    except ValueError:
        raise _Unsupported from None
    if not math.isfinite(value):
        raise _Unsupported
    return value
