"""Selections in CNF and their atoms classified (cacq.txt §3.2.6–3.2.7, query.cnf).

The property: on random rows (NULLs included), the CNF (AND of ORs of atoms, each atom
compiled) is TRUE exactly when the compiled selection is, and every atom classified
"simple" gives in a grouped filter exactly what the compiled atom gives.
"""

from __future__ import annotations

import datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adaptcq.engine.grouped_filter import GroupedFilter
from adaptcq.errors import QueryError
from adaptcq.query.cnf import classify, to_cnf
from adaptcq.query.cql import parse_query
from adaptcq.query.expr import compile_predicate
from conftest import examples

SCHEMAS = {"S": {"a": "number", "b": "number", "s": "string", "t": "timestamp", "f": "bool"}}
UDFS = {"pos": lambda x: None if x is None else x > 0,
        "sq": lambda x: None if x is None else x * x}
T0 = datetime.datetime(2024, 1, 1)


def selection(where: str, schemas=SCHEMAS):
    q = parse_query(f"SELECT * FROM S WHERE {where}", schemas, udfs=UDFS)
    return q, q.selections["S"]


def cnf_sql(where: str) -> list[list[str]]:
    q, sel = selection(where)
    return [[a.sql() for a in clause] for clause in to_cnf(sel, q.sql)]


def atom_of(where: str):
    q, sel = selection(where)
    (clause,) = to_cnf(sel, q.sql)
    (atom,) = clause
    return classify(atom, "S", q.columns["S"], q.types)


# ----- random conditions ------------------------------------------------------------------
_NUM = st.sampled_from(["-1", "0", "1", "2", "1.5", "-0.5", "- 1"])
_STR = st.sampled_from(["''", "'a'", "'ab'", "'b'"])
_TS = st.integers(0, 4).map(lambda h: f"'2024-01-01 0{h}:00:00'")
_TSLIT = _TS | _TS.map(lambda s: f"TIMESTAMP {s}")
_CMP = st.sampled_from(["=", "<>", "!=", "<", "<=", ">", ">="])
_NUMCOL = st.sampled_from(["S.a", "S.b"])


def _cmp(col, lit):
    return st.tuples(col, _CMP, lit, st.booleans()).map(
        lambda t: f"{t[0]} {t[1]} {t[2]}" if t[3] else f"{t[2]} {t[1]} {t[0]}")


def _between(col, lit):
    return st.tuples(col, st.sampled_from(["", "NOT "]), lit, lit).map(
        lambda t: f"{t[0]} {t[1]}BETWEEN {t[2]} AND {t[3]}")


def _in(col, lit):
    items = st.lists(lit | st.just("NULL").filter(lambda _: True), min_size=1, max_size=3)
    return st.tuples(col, st.sampled_from(["", "NOT "]), items).map(
        lambda t: f"{t[0]} {t[1]}IN ({', '.join(t[2])})")


_ATOMS = st.one_of(
    _cmp(_NUMCOL, _NUM), _cmp(st.just("S.s"), _STR), _cmp(st.just("S.t"), _TSLIT),
    _between(_NUMCOL, _NUM), _between(st.just("S.t"), _TSLIT),
    _in(_NUMCOL, _NUM), _in(st.just("S.s"), _STR), _in(st.just("S.t"), _TS),
    st.tuples(st.sampled_from(["S.a", "S.s", "S.t", "S.f"]), st.sampled_from(["", "NOT "])).map(
        lambda t: f"{t[0]} IS {t[1]}NULL"),
    st.sampled_from(["S.a < S.b", "S.a + 1 > S.b", "S.a = NULL", "S.f", "NOT S.f",
                     "S.f = TRUE", "S.f <> FALSE", "TRUE", "FALSE", "NULL", "pos(S.a)",
                     "sq(S.b) > 1", "NOT (S.a BETWEEN S.b AND 2)", "sq(S.a) BETWEEN 1 AND 3",
                     "S.a IN (1, S.b)"]),
)
_FORMS = {
    "not": "NOT ({0})", "and": "({0}) AND ({1})", "or": "({0}) OR ({1})",
    "mixed": "({0}) OR ({1}) AND ({2})",
    "is null": "({0}) IS NULL",  # rarer: it makes everything under it one opaque atom
}
_CONDITIONS = st.recursive(
    _ATOMS,
    lambda inner: st.tuples(
        st.sampled_from(["not", "and", "or", "and", "or", "mixed", "not", "is null"]),
        inner, inner, inner).map(lambda t: _FORMS[t[0]].format(*t[1:])),
    max_leaves=7)
_ROWS = st.fixed_dictionaries({
    "a": st.sampled_from([None, -1, 0, 0.5, 1, 1.5, 2, 3]),
    "b": st.sampled_from([None, -1, 0, 1, 2, -0.5]),
    "s": st.sampled_from([None, "", "a", "ab", "b", "c"]),
    "t": st.one_of(st.none(), st.integers(-1, 9).map(
        lambda k: T0 + datetime.timedelta(minutes=30 * k))),
    "f": st.sampled_from([None, True, False]),
})


@settings(max_examples=examples(500), deadline=None)
@given(_CONDITIONS, st.lists(_ROWS, min_size=1, max_size=8))
def test_cnf_agrees_with_the_compiled_selection(where, rows):
    q, sel = selection(where)
    cols, types = q.columns["S"], q.types
    before = sel.sql()
    original = compile_predicate(sel, cols, "S", types, udfs=UDFS)
    cnf = to_cnf(sel, q.sql)
    assert sel.sql() == before  # the query's tree is left as it was
    assert all(clause for clause in cnf)
    compiled = [[compile_predicate(a, cols, "S", types, udfs=UDFS) for a in clause]
                for clause in cnf]
    atoms = [classify(a, "S", cols, types) for clause in cnf for a in clause]
    filters = []
    for atom in atoms:
        if atom.kind == "simple":
            gf = GroupedFilter("S", atom.column, cols.index(atom.column))
            gf.add(atom.op, atom.constant, 0)
            gf.add(atom.op, atom.constant, 1, disjunct=True)
            filters.append((gf, compile_predicate(atom.expr, cols, "S", types)))
    for values in rows:
        row = tuple(values[c] for c in cols)
        expected = original(row)
        assert all(any(p(row) for p in clause) for clause in compiled) is expected, \
            (where, cnf, row)
        for gf, pred in filters:
            truth = pred(row)
            assert gf.probe_row(row) == (0 if truth else 1, 2 if truth else 0), \
                (where, gf.predicates(), row)


@settings(max_examples=examples(400), deadline=None)
@given(_ATOMS, st.integers(0, 2), st.lists(_ROWS, min_size=1, max_size=8))
def test_atoms_agree_in_a_grouped_filter(where, nots, rows):
    """Each atom of a (NOT-ed) comparison, classified and put into a grouped filter as a
    conjunct and as a disjunct, gives what the compiled atom gives (the rewritten atoms of
    NOT and BETWEEN included)."""
    q, sel = selection("NOT " * nots + f"({where})")
    cols, types = q.columns["S"], q.types
    for clause in to_cnf(sel, q.sql):
        for atom in (classify(a, "S", cols, types) for a in clause):
            if atom.kind != "simple":
                continue
            gf = GroupedFilter("S", atom.column, cols.index(atom.column))
            gf.add(atom.op, atom.constant, 0)
            gf.add(atom.op, atom.constant, 1, disjunct=True)
            pred = compile_predicate(atom.expr, cols, "S", types)
            for values in rows:
                row = tuple(values[c] for c in cols)
                truth = pred(row)
                assert gf.probe_row(row) == (0 if truth else 1, 2 if truth else 0), \
                    (atom, row)


# ----- rewriting --------------------------------------------------------------------------
def test_not_is_pushed_to_the_atoms():
    assert cnf_sql("NOT (S.a > 1 OR S.b IN (1, 2))") == [["S.a <= 1"], ["NOT (S.b IN (1, 2))"]]
    assert cnf_sql("NOT (S.a > 1 AND S.b = 2)") == [["S.a <= 1", "S.b <> 2"]]
    assert cnf_sql("NOT NOT S.a < 1") == [["S.a < 1"]]
    assert cnf_sql("NOT (S.a IS NOT NULL)") == [["S.a IS NULL"]]
    assert cnf_sql("NOT (S.a <> 1)") == [["S.a = 1"]]
    assert cnf_sql("NOT (1 < S.a)") == [["1 >= S.a"]]
    # an opaque comparison keeps its NOT: compiled whole, it is exact
    assert cnf_sql("NOT (S.a < S.b)") == [["NOT (S.a < S.b)"]]


def test_between_becomes_two_comparisons():
    assert cnf_sql("S.a BETWEEN 1 AND 2") == [["S.a >= 1"], ["S.a <= 2"]]
    assert cnf_sql("S.a NOT BETWEEN 1 AND 2") == [["S.a < 1", "S.a > 2"]]
    assert cnf_sql("NOT (S.a NOT BETWEEN 1 AND 2)") == [["S.a >= 1"], ["S.a <= 2"]]
    # not column-and-constants: one atom (a UDF is not called twice)
    assert cnf_sql("sq(S.a) BETWEEN 1 AND 2") == [["SQ(S.a) BETWEEN 1 AND 2"]]


def test_distribution_and_simplification():
    assert cnf_sql("S.a = 1 OR (S.b = 2 AND S.s = 'x')") == [
        ["S.a = 1", "S.b = 2"], ["S.a = 1", "S.s = 'x'"]]
    # absorption: (a > 1 OR b < 2) AND (a > 1 OR b > 3) AND a > 1 ... keeps a > 1
    assert cnf_sql("(S.a > 1 AND S.b < 2) OR (S.a > 1 AND S.b > 3)") == [
        ["S.a > 1"], ["S.b < 2", "S.b > 3"]]
    assert cnf_sql("S.a = 1 OR S.a = 1") == [["S.a = 1"]]
    assert cnf_sql("S.a > 1 OR TRUE") == []
    assert cnf_sql("S.a > 1 OR FALSE") == [["S.a > 1"]]
    assert cnf_sql("S.a > 1 OR NULL") == [["S.a > 1"]]
    assert cnf_sql("S.a > 1 AND NOT TRUE") == [["FALSE"]]
    assert cnf_sql("NOT NULL") == [["FALSE"]]
    assert to_cnf(None) == ()


def test_too_many_clauses_is_refused_with_its_position():
    where = " OR ".join(f"(S.a = {i} AND S.b = {i})" for i in range(9))  # 2**9 clauses
    q, sel = selection(where)
    with pytest.raises(QueryError) as info:
        to_cnf(sel, q.sql)
    err = info.value
    assert "conjunctive normal form" in err.message and "256" in err.message
    assert err.sql == q.sql and q.sql[err.position:].startswith("S.a = 0 AND")
    assert len(to_cnf(sel, q.sql, max_clauses=512)) == 512
    conjuncts = " AND ".join(f"S.a <> {i}" for i in range(120))
    q, sel = selection(conjuncts)
    with pytest.raises(QueryError, match="101 or more clauses .* than the 100 allowed"):
        to_cnf(sel, q.sql, max_clauses=100)


def test_nan_is_the_documented_exception():
    """Compiled predicates compare NaN as Python does; NOT (a < 3) is TRUE for NaN while its
    rewriting a >= 3 is not (query.cnf's docstring)."""
    q, sel = selection("NOT (S.a < 3)")
    cols = q.columns["S"]
    assert compile_predicate(sel, cols, "S", q.types)((float("nan"),)) is True
    ((atom,),) = to_cnf(sel, q.sql)
    assert compile_predicate(atom, cols, "S", q.types)((float("nan"),)) is False


# ----- classification ---------------------------------------------------------------------
@pytest.mark.parametrize(("where", "column", "op", "constant"), [
    ("S.a > 1", "a", ">", 1),
    ("S.a <> 1.5", "a", "!=", 1.5),
    ("S.a != -2", "a", "!=", -2),
    ("1 < S.a", "a", ">", 1),
    ("2 >= S.a", "a", "<=", 2),
    ("-(-3) = S.b", "b", "=", 3),
    ("S.s <= 'x'", "s", "<=", "x"),
    ("S.t > '2024-01-01T01:00:00+01:00'", "t", ">", datetime.datetime(2024, 1, 1)),
    ("TIMESTAMP '2024-01-02' < S.t", "t", ">", datetime.datetime(2024, 1, 2)),
    ("S.t IN ('2024-01-01', TIMESTAMP '2024-01-02')", "t", "in",
     frozenset({datetime.datetime(2024, 1, 1), datetime.datetime(2024, 1, 2)})),
    ("S.a IN (1, 2.5, 1)", "a", "in", frozenset({1, 2.5})),
    ("S.a NOT IN (1)", "a", "not in", frozenset({1})),
    ("S.s NOT IN ('a', 'b')", "s", "not in", frozenset({"a", "b"})),
    ("S.a IS NULL", "a", "is null", None),
    ("S.a IS NOT NULL", "a", "is not null", None),
    ("S.f", "f", "=", True),
    ("NOT S.f", "f", "=", False),
    ("S.f = TRUE", "f", "=", True),
])
def test_simple_atoms(where, column, op, constant):
    atom = atom_of(where)
    assert (atom.kind, atom.column, atom.op, atom.constant) == ("simple", column, op, constant)
    assert type(atom.constant) is type(constant)


@pytest.mark.parametrize("where", [
    "S.a < S.b", "S.a + 1 > 2", "S.a = NULL", "S.a IN (1, NULL)", "S.a IN (1, S.b)",
    "pos(S.a)", "sq(S.a) > 1", "NOT pos(S.a)", "(S.a > 1) IS NULL", "TRUE = TRUE",
    "NOT (S.a < S.b)", "S.a NOT IN (1, NULL)",
])
def test_opaque_atoms(where):
    atom = atom_of(where)
    assert atom.kind == "opaque" and atom.column is None and atom.op is None
    assert atom.label == atom.expr.sql()


def test_constants_are_those_of_compiled_code():
    """A string compared with a column of unknown kind stays a string; with a timestamp
    column it is a timestamp (expr.constant_value is the compiler's own conversion)."""
    q = parse_query("SELECT R.x FROM R WHERE R.x > '2024-01-01'")
    ((atom,),) = to_cnf(q.selections["R"], q.sql)
    assert classify(atom, "R", q.columns["R"], q.types).constant == "2024-01-01"
    q = parse_query("SELECT R.x FROM R WHERE R.x > 12345678901234567890")
    ((atom,),) = to_cnf(q.selections["R"], q.sql)
    assert classify(atom, "R", q.columns["R"], q.types).constant == 12345678901234567890
