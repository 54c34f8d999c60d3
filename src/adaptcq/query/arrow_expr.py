"""Selections evaluated over a column batch with Arrow compute (the vectorized executor's
ingestion; docs/vector.md). Same meaning as ``query.expr.compile_predicate``: SQL's
three-valued logic (Arrow's Kleene ``and``/``or``, a comparison with NULL is NULL), and a
row passes only when the condition is TRUE.

Only a subset is translated: columns, number, string, boolean and NULL literals, the six
comparisons, BETWEEN, IN over a list of non-NULL literals, IS [NOT] NULL of a value, AND,
OR, NOT and parentheses. Anything else (arithmetic, whose overflow and division by zero
the per-tuple compiler guards; timestamp literals; UDF calls; a bare value as a condition)
makes :func:`arrow_predicate` return None, and the caller evaluates the selection row by
row with ``compile_predicate`` instead.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import sqlglot.expressions as exp

from adaptcq.stream.arrays import to_numpy

_COMPARE = {exp.EQ: pc.equal, exp.NEQ: pc.not_equal, exp.LT: pc.less,
            exp.LTE: pc.less_equal, exp.GT: pc.greater, exp.GTE: pc.greater_equal}


class _Unsupported(Exception):
    """A node this translator leaves to the per-row compiler."""


def arrow_predicate(expr: exp.Expression | None, stream: str,
                    kinds: dict[str, str] | None = None
                    ) -> Callable[[pa.Table], np.ndarray] | None:
    """``table -> bool mask`` (rows where ``expr`` is TRUE) for ``stream``'s rows as a table
    of its columns, or None when ``expr`` uses what is not translated (module docstring).
    ``kinds``: the stream's column kinds (``LogicalQuery.types[stream]``); a timestamp
    column is left to the per-row compiler, which reads a string compared with it as a
    timestamp literal."""
    if expr is None:
        return None
    temporal = {c for c, k in (kinds or {}).items() if k not in ("number", "string", "bool")}
    if any(isinstance(c, exp.Column) and c.name in temporal for c in expr.find_all(exp.Column)):
        return None
    try:
        fn = _condition(expr, stream)
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


def _condition(node: exp.Expression, stream: str):
    node = _strip(node)
    if isinstance(node, exp.Not):
        inner = _condition(node.this, stream)
        return lambda t: pc.invert(inner(t))
    if isinstance(node, (exp.And, exp.Or)):
        a, b = _condition(node.this, stream), _condition(node.expression, stream)
        op = pc.and_kleene if isinstance(node, exp.And) else pc.or_kleene
        return lambda t: op(a(t), b(t))
    if isinstance(node, exp.Boolean):
        value = pa.scalar(bool(node.this))
        return lambda t: value
    if type(node) in _COMPARE:
        op = _COMPARE[type(node)]
        a, b = _value(node.this, stream), _value(node.expression, stream)
        return lambda t: op(a(t), b(t))
    if isinstance(node, exp.Between):
        x = _value(node.this, stream)
        lo, hi = _value(node.args["low"], stream), _value(node.args["high"], stream)
        return lambda t: pc.and_kleene(pc.greater_equal(x(t), lo(t)),
                                       pc.less_equal(x(t), hi(t)))
    if isinstance(node, exp.In):
        if node.args.get("query") or node.args.get("unnest") or node.args.get("field"):
            raise _Unsupported
        items = [_strip(e) for e in node.expressions]
        if not items or not all(isinstance(e, exp.Literal) for e in items):
            raise _Unsupported  # NULL or computed items: the per-row compiler's OR chain
        values = [_literal(e) for e in items]
        if len({type(v) for v in values}) > 1 and not all(
                isinstance(v, int | float) for v in values):
            raise _Unsupported
        x = _value(node.this, stream)

        def is_in(t):
            col = x(t)
            found = pc.is_in(col, value_set=pa.array(values))
            return pc.if_else(pc.is_null(col), pa.scalar(None, pa.bool_()), found)
        return is_in
    if isinstance(node, exp.Is) and isinstance(node.expression, exp.Null):
        if isinstance(_strip(node.this), (exp.Not, exp.And, exp.Or, exp.Predicate)):
            raise _Unsupported
        x = _value(node.this, stream)
        return lambda t: pc.is_null(x(t))
    raise _Unsupported


def _value(node: exp.Expression, stream: str):
    node = _strip(node)
    if isinstance(node, exp.Column):
        if isinstance(node.this, exp.Star) or node.table not in ("", stream):
            raise _Unsupported
        name = node.name
        return lambda t: t.column(name)
    if isinstance(node, exp.Literal):
        value = pa.scalar(_literal(node))
        return lambda t: value
    if isinstance(node, exp.Null):
        value = pa.scalar(None)
        return lambda t: value
    raise _Unsupported  # arithmetic, casts, calls: the per-row compiler's guards


def _literal(node: exp.Literal):
    if node.is_string:
        return node.this
    try:
        return int(node.this)
    except ValueError:
        pass
    try:
        value = float(node.this)
    except ValueError:
        raise _Unsupported from None
    if not math.isfinite(value):
        raise _Unsupported
    return value
