"""A selection in conjunctive normal form, and its atoms classified (cacq.txt §3.2.6–3.2.7).

CACQ handles OR "following standard practice" (§3.2.7): a query's selection on a stream is
reduced to CNF, an AND of clauses, each an OR of atoms. An atom that compares a column with
constants goes into the grouped filter of its (source, column) (§3.2.6, Figure 5); any
other atom (two columns, arithmetic, a UDF...) is *opaque*: a compiled predicate of its own.
A clause of one atom is a conjunct (the query fails when it is not TRUE); a clause of
several atoms gets a disjunct bit, set when any of its atoms is TRUE (§3.2.7).

**Three-valued logic.** A row passes a WHERE clause when the condition is TRUE. The
rewriting is valid under Kleene's logic, SQL's: De Morgan's laws, double negation,
distribution and absorption all hold in it, and ``NOT (x < c)`` is ``x >= c`` (both UNKNOWN
when x is NULL: a NULL fails both; the rewriting never turns UNKNOWN into TRUE).
``x BETWEEN a AND b`` is ``x >= a AND x <= b`` (the compiler's own definition) and ``x NOT
BETWEEN a AND b`` is ``x < a OR x > b``.

**What is rewritten.** Only what a grouped filter can then take: a NOT in front of a
``column OP constant`` comparison becomes the negated comparison, and BETWEEN with a column
and two constants becomes two comparisons. Every other atom stays whole, NOT included
(``NOT (S.a < S.b)``, ``NOT (f(x) BETWEEN 1 AND 3)``, ``x NOT IN (1, NULL)``): it is opaque
anyway, and compiled whole it is exactly what the query's own predicate computes (a UDF is
not called twice for one BETWEEN).

**One exception: float NaN**, which SQL does not have. Compiled predicates compare a NaN
as Python does (every order comparison FALSE), so ``NOT (x < 3)`` is TRUE for a NaN and its
rewriting ``x >= 3`` is not. (The compiler is not closed under NOT for NaN either:
``NOT (x BETWEEN 1 AND 3)`` is FALSE for a NaN.) For every other value, NULL included, the
CNF is TRUE exactly when the selection is (``tests/test_cnf.py`` checks it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import sqlglot.expressions as exp

from adaptcq.errors import QueryError
from adaptcq.query import expr as sqlexpr

Clause = tuple[exp.Expression, ...]
CNF = tuple[Clause, ...]

_NEGATED: dict[type, type] = {
    exp.EQ: exp.NEQ, exp.NEQ: exp.EQ, exp.LT: exp.GTE, exp.GTE: exp.LT,
    exp.GT: exp.LTE, exp.LTE: exp.GT,
}
_FLIPPED: dict[type, type] = {  # c OP x is x FLIPPED(OP) c
    exp.EQ: exp.EQ, exp.NEQ: exp.NEQ, exp.LT: exp.GT, exp.GT: exp.LT,
    exp.LTE: exp.GTE, exp.GTE: exp.LTE,
}
_OPS: dict[type, str] = {
    exp.EQ: "=", exp.NEQ: "!=", exp.LT: "<", exp.LTE: "<=", exp.GT: ">", exp.GTE: ">=",
}


# ----- CNF ---------------------------------------------------------------------------------
def to_cnf(expr: exp.Expression | None, sql: str | None = None, max_clauses: int = 256
           ) -> CNF:
    """The clauses (ANDed) of atoms (ORed) of a selection ``expr``.

    An empty tuple is TRUE (``expr`` None, or a tautology such as ``x > 1 OR TRUE``); a
    condition that can never be TRUE gives the one clause ``(FALSE,)``; no clause is
    empty. Duplicate atoms, duplicate clauses and clauses that contain another clause
    (absorption) are dropped. Atoms are sqlglot nodes without enclosing parentheses:
    comparisons, ``x IN (...)``, ``NOT (x IN (...))``, ``x IS NULL``, ``NOT (x IS NULL)``,
    and any other condition, whole. New nodes are built from copies: ``expr`` is left as
    it is. Raises :class:`QueryError`, pointing into ``sql`` at the OR (or NOT) whose
    distribution would give more than ``max_clauses`` clauses.
    """
    if expr is None:
        return ()
    return _CNFBuilder(sql, max_clauses).cnf(expr, negate=False)


class _CNFBuilder:
    """Negation normal form and distribution in one recursive pass: ``cnf(node, negate)``
    is the CNF of ``node`` (of ``NOT node`` when ``negate``), NOTs pushed to the atoms."""

    def __init__(self, sql: str | None, max_clauses: int):
        self.sql = sql
        self.max_clauses = max_clauses

    def cnf(self, node: exp.Expression, negate: bool) -> CNF:
        node = _strip(node)
        if isinstance(node, exp.Not):
            return self.cnf(node.this, not negate)
        if isinstance(node, (exp.And, exp.Or)):
            left = self.cnf(node.this, negate)
            right = self.cnf(node.expression, negate)
            # NOT (a AND b) = NOT a OR NOT b; NOT (a OR b) = NOT a AND NOT b (Kleene).
            if isinstance(node, exp.And) != negate:
                return self.conjoin(left, right, node)
            return self.disjoin(left, right, node)
        if isinstance(node, exp.Boolean):
            return _TRUE if node.this != negate else _FALSE
        if isinstance(node, exp.Null):  # UNKNOWN, and NOT UNKNOWN too: never TRUE
            return _FALSE
        if isinstance(node, exp.Between) and _is_column(node.this) and _is_constant(
                node.args["low"]) and _is_constant(node.args["high"]):
            x, low, high = node.this, node.args["low"], node.args["high"]
            ge, le = _binary(exp.GTE, x, low), _binary(exp.LTE, x, high)
            if not negate:
                return self.conjoin(((ge,),), ((le,),), node)
            return self.disjoin(((_negated(ge),),), ((_negated(le),),), node)
        if negate:
            if type(node) in _NEGATED and _simple_comparison(node):
                return ((_negated(node),),)
            return ((exp.Not(this=_paren(node.copy())),),)
        return ((node,),)

    def conjoin(self, left: CNF, right: CNF, node: exp.Expression) -> CNF:
        out = _conjoin(left, right)
        if len(out) > self.max_clauses:
            raise self.too_large(node, len(out))
        return out

    def disjoin(self, left: CNF, right: CNF, node: exp.Expression) -> CNF:
        """``left OR right`` distributed: one clause per pair of clauses."""
        if not left or not right:  # TRUE OR x
            return _TRUE
        if len(left) * len(right) > self.max_clauses:
            raise self.too_large(node, len(left) * len(right))
        return _simplify(tuple(a + b for a in left for b in right))

    def too_large(self, node: exp.Expression, count: int) -> QueryError:
        starts = [n.meta["start"] for n in node.walk() if "start" in n.meta]
        ends = [n.meta["end"] for n in node.walk() if "end" in n.meta]
        position = min(starts) if starts else None
        length = max(ends) - position + 1 if starts and ends else 1
        return QueryError(
            f"this condition has {count} or more clauses in conjunctive normal form, more "
            f"than the {self.max_clauses} allowed (cacq.txt §3.2.7: OR is distributed over "
            "AND); write it with fewer ORs of ANDs", self.sql, position, length)


_TRUE: CNF = ()
_FALSE: CNF = ((exp.false(),),)


def _conjoin(left: CNF, right: CNF) -> CNF:
    if left == _FALSE or right == _FALSE:
        return _FALSE
    return _simplify(left + right)


def _simplify(clauses: CNF) -> CNF:
    """Drop FALSE atoms, duplicate atoms, TRUE clauses (none are built), duplicate clauses
    and clauses that hold another one (absorption: a AND (a OR b) = a, also in Kleene's
    logic). A clause left empty makes the whole CNF FALSE."""
    unique: list[Clause] = []
    for clause in clauses:
        atoms = tuple(dict.fromkeys(a for a in clause if not _is_false(a)))
        if not atoms:
            return _FALSE
        unique.append(atoms)
    by_set = {frozenset(c): c for c in reversed(unique)}  # first of equal clauses kept
    unique = [by_set[k] for k in dict.fromkeys(frozenset(c) for c in unique)]
    # Only a shorter clause can absorb a longer one: compare across lengths only (a long
    # AND of single atoms costs no quadratic pass).
    sets = [frozenset(c) for c in unique]
    smaller: dict[int, list[frozenset]] = {}
    for s in sets:
        smaller.setdefault(len(s), []).append(s)
    lengths = sorted(smaller)
    kept = [c for c, s in zip(unique, sets, strict=True)
            if not any(t < s for n in lengths if n < len(s) for t in smaller[n])]
    return tuple(kept)


def _is_false(atom: exp.Expression) -> bool:
    return isinstance(atom, exp.Boolean) and not atom.this


# ----- atoms -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Atom:
    """One atom of a CNF clause, classified for the eddy (cacq.txt §3.2.6).

    ``kind`` "simple": ``column`` ``op`` ``constant`` can go into the grouped filter of the
    column; ``op`` is one of :data:`adaptcq.engine.grouped_filter.OPS` ("<", "<=", ">",
    ">=", "=", "!=", "in", "not in", "is null", "is not null") and ``constant`` the value
    compiled code compares with (a frozenset for in/not in, None for the NULL tests).
    ``kind`` "opaque": anything else; evaluate ``expr`` with ``expr.compile_predicate``.
    """

    expr: exp.Expression
    kind: Literal["simple", "opaque"]
    column: str | None = None
    op: str | None = None
    constant: object = None

    @property
    def label(self) -> str:
        """The atom's SQL, for explain output and error messages."""
        return self.expr.sql()


def classify(atom: exp.Expression, alias: str, columns: Sequence[str],
             types: Mapping[str, Mapping[str, str]] | None = None) -> Atom:
    """Classify an atom of ``to_cnf`` on stream ``alias``, whose rows hold ``columns``.

    Simple (what a grouped filter can take): ``column OP constant`` or ``constant OP
    column`` (the operator flipped) with OP in ``< <= > >= = != <>``; ``column [NOT] IN
    (constants)``; ``column IS [NOT] NULL``; and, for a column of kind "bool", the bare
    ``column`` (``= TRUE``) and ``NOT column`` (``= FALSE``). Constants are literals, signed
    numbers, ``TIMESTAMP '...'`` / ``DATE '...'`` and TRUE/FALSE, never NULL; each converted
    by ``expr.constant_value`` exactly as compiled code converts it (a string compared with
    a timestamp column is a timestamp). Everything else is opaque, and so is any atom whose
    constant the compiler would refuse (compiling it reports the error).
    """
    types = types or {}
    node = _strip(atom)
    negated = isinstance(node, exp.Not)
    inner = _strip(node.this) if negated else node

    def column_of(n: exp.Expression) -> str | None:
        n = _strip(n)
        if (isinstance(n, exp.Column) and not isinstance(n.this, exp.Star)
                and n.table in ("", alias) and n.name in columns):
            return n.name
        return None

    def kind_of(column: str) -> str | None:
        return types.get(alias, {}).get(column)

    def simple(column: str, op: str, constant: object = None) -> Atom:
        return Atom(atom, "simple", column, op, constant)

    try:
        if isinstance(inner, exp.Is) and isinstance(inner.expression, exp.Null):
            column = column_of(inner.this)
            if column is not None:
                return simple(column, "is not null" if negated else "is null")
        elif isinstance(inner, exp.In) and not any(
                inner.args.get(k) for k in ("query", "unnest", "field")):
            column = column_of(inner.this)
            if column is not None and inner.expressions and all(
                    _is_constant(e) for e in inner.expressions):
                against = sqlexpr.literal_context(kind_of(column))
                values = frozenset(sqlexpr.constant_value(e, against)
                                   for e in inner.expressions)
                return simple(column, "not in" if negated else "in", values)
        elif not negated and type(inner) in _OPS:
            left, right = inner.this, inner.expression
            kind = type(inner)
            if column_of(left) is None and column_of(right) is not None:
                left, right, kind = right, left, _FLIPPED[kind]
            column = column_of(left)
            if column is not None and _is_constant(right):
                against = sqlexpr.literal_context(kind_of(column), right)
                return simple(column, _OPS[kind], sqlexpr.constant_value(right, against))
        else:
            column = column_of(inner)
            if column is not None and kind_of(column) == "bool":
                return simple(column, "=", not negated)
    except sqlexpr.ExprError:
        pass  # the compiler refuses the constant: opaque, so compiling it reports why
    return Atom(atom, "opaque")


# ----- helpers -----------------------------------------------------------------------------
def _strip(node: exp.Expression) -> exp.Expression:
    while isinstance(node, exp.Paren):
        node = node.this
    return node


def _paren(node: exp.Expression) -> exp.Expression:
    return node if isinstance(node, (exp.Column, exp.Paren)) else exp.Paren(this=node)


def _is_column(node: exp.Expression) -> bool:
    node = _strip(node)
    return isinstance(node, exp.Column) and not isinstance(node.this, exp.Star)


def _is_constant(node: exp.Expression) -> bool:
    """A literal the compiler reads as one value (see ``expr.constant_value``); not NULL."""
    node = _strip(node)
    if isinstance(node, exp.Neg):
        inner = _strip(node.this)
        while isinstance(inner, exp.Neg):
            inner = _strip(inner.this)
        return isinstance(inner, exp.Literal) and not inner.is_string
    return (isinstance(node, (exp.Literal, exp.Boolean))
            or sqlexpr.is_temporal_cast(node))


def _simple_comparison(node: exp.Expression) -> bool:
    """``column OP constant`` or ``constant OP column``: negated, it stays one for a
    grouped filter; other comparisons stay whole under their NOT."""
    a, b = node.this, node.expression
    return (_is_column(a) and _is_constant(b)) or (_is_constant(a) and _is_column(b))


def _binary(kind: type, left: exp.Expression, right: exp.Expression) -> exp.Expression:
    return kind(this=_strip(left).copy(), expression=_strip(right).copy())


def _negated(node: exp.Expression) -> exp.Expression:
    return _binary(_NEGATED[type(node)], node.this, node.expression)
