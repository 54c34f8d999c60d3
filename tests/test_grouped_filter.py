"""Grouped filters (cacq.txt §3.2.6, Figure 5) and opaque filters against naive evaluation.

A grouped filter must give, for every probe value, exactly the masks that evaluating each
stored predicate on its own (SQL semantics: NULL makes every comparison UNKNOWN) gives.
"""

from __future__ import annotations

import datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adaptcq.engine.grouped_filter import OPS, FilterError, GroupedFilter, OpaqueFilter
from adaptcq.query.expr import compile_predicate
from adaptcq.query.udf import UDFError
from conftest import examples

_PY = {"<": "__lt__", "<=": "__le__", ">": "__gt__", ">=": "__ge__", "=": "__eq__",
       "!=": "__ne__"}


def naive_true(op: str, constant, value) -> bool:
    """Is ``value op constant`` TRUE? (SQL: NULL is UNKNOWN; otherwise as Python, which is
    how compiled predicates compare, NaN included.)"""
    if op == "is null":
        return value is None
    if op == "is not null":
        return value is not None
    if value is None:
        return False
    if op == "in":
        return value in constant
    if op == "not in":
        return value not in constant
    return {"<": value < constant, "<=": value <= constant, ">": value > constant,
            ">=": value >= constant, "=": value == constant, "!=": value != constant}[op]


def naive(preds, value) -> tuple[int, int]:
    fail = passed = 0
    for op, constant, bit, disjunct in preds:
        ok = naive_true(op, constant, value)
        if disjunct and ok:
            passed |= 1 << bit
        if not disjunct and not ok:
            fail |= 1 << bit
    return fail, passed


# ----- domains: constants and probe values of one comparable type --------------------------
_T0 = datetime.datetime(2024, 1, 1)
_DOMAINS = {
    "int": (st.integers(-4, 4), st.integers(-5, 5)),
    "float": (st.integers(-4, 4).map(lambda i: i / 2) | st.integers(-2, 2),
              st.integers(-9, 9).map(lambda i: i / 2) | st.just(float("nan"))
              | st.just(float("inf")) | st.just(-0.0)),
    "str": (st.sampled_from(["", "a", "ab", "b", "ba", "c"]),
            st.sampled_from(["", "a", "aa", "ab", "b", "ba", "bb", "c", "d"])),
    "timestamp": (st.integers(-3, 3).map(lambda h: _T0 + datetime.timedelta(hours=h)),
                  st.integers(-8, 8).map(lambda h: _T0 + datetime.timedelta(minutes=30 * h))),
    "bool": (st.booleans(), st.booleans()),
}


@st.composite
def scenarios(draw):
    """A domain, a sequence of adds and removes, and probe values."""
    constants, values = _DOMAINS[draw(st.sampled_from(sorted(_DOMAINS)))]
    bits = st.integers(0, 6)
    actions = []
    for _ in range(draw(st.integers(0, 14))):
        kind = draw(st.sampled_from(["add"] * 5 + ["between", "remove"]))
        bit, disjunct = draw(bits), draw(st.booleans())
        if kind == "remove":
            actions.append(("remove", bit, draw(st.sampled_from([None, False, True]))))
        elif kind == "between":  # BETWEEN as two comparisons under one tag (query.cnf)
            low, high = draw(constants), draw(constants)
            actions.append(("add", ">=", low, bit, disjunct))
            actions.append(("add", "<=", high, bit, disjunct))
        else:
            op = draw(st.sampled_from(OPS))
            if op in ("in", "not in"):
                constant = frozenset(draw(st.lists(constants, max_size=3)))
            elif op in ("is null", "is not null"):
                constant = None
            else:
                constant = draw(constants)
            actions.append(("add", op, constant, bit, disjunct))
    probes = draw(st.lists(st.none() | values, min_size=1, max_size=10))
    return actions, probes


@settings(max_examples=examples(400), deadline=None)
@given(scenarios())
def test_grouped_filter_agrees_with_naive_evaluation(scenario):
    actions, probes = scenario
    gf = GroupedFilter("S", "a", 1)
    model: list = []
    for action in actions:
        if action[0] == "add":
            _, op, constant, bit, disjunct = action
            gf.add(op, constant, bit, disjunct)
            model.append((op, None if op in ("is null", "is not null") else constant, bit,
                          disjunct))
        else:
            _, bit, disjunct = action
            gf.remove(bit, disjunct)
            model = [p for p in model
                     if not (p[2] == bit and (disjunct is None or p[3] == disjunct))]
        # probe between changes too: the lazy rebuild must notice every change
        for value in probes[:2]:
            assert gf.probe(value) == naive(model, value), (model, value)
    assert gf.predicates() == model and len(gf) == len(model)
    assert gf.conjunct_bits == sum({1 << b for _, _, b, d in model if not d})
    assert gf.disjunct_bits == sum({1 << b for _, _, b, d in model if d})
    for value in probes:
        expected = naive(model, value)
        assert gf.probe(value) == expected, (model, value)
        assert gf.probe_row(("x", value)) == expected


def test_figure_5_style_example():
    """Predicates on S.a like Figure 5's (its constants 1, 7, 11, 3, 5, 6, 8, 3, 56; the
    operator symbols are lost in cacq.txt), one query each, probed with S.a = 8."""
    gf = GroupedFilter("S", "a", 0)
    preds = [(">", 1), (">", 7), (">", 11), ("<", 3), ("<", 5), ("=", 6), ("=", 8),
             (">=", 3), (">=", 56)]
    for bit, (op, c) in enumerate(preds):
        gf.add(op, c, bit)
    fail, passed = gf.probe(8)
    matches = [bit for bit in range(len(preds)) if not fail >> bit & 1]
    assert [preds[b] for b in matches] == [(">", 1), (">", 7), ("=", 8), (">=", 3)]
    assert passed == 0


def test_shared_bits_and_disjuncts():
    gf = GroupedFilter("S", "a", 0)
    gf.add(">", 3, 0)
    gf.add("<", 9, 0)                  # query 0: 3 < a < 9
    gf.add("<", 0, 1, disjunct=True)   # a clause of query 1: a < 0 OR a > 10
    gf.add(">", 10, 1, disjunct=True)
    assert gf.probe(5) == (0, 0)
    assert gf.probe(11) == (1, 2)
    assert gf.probe(-1) == (1, 2)
    assert gf.probe(None) == (1, 0)
    gf.remove(0)
    assert gf.probe(11) == (0, 2) and gf.conjunct_bits == 0 and len(gf) == 2
    gf.remove(1, disjunct=False)  # only conjuncts of tag 1: none
    assert len(gf) == 2
    gf.remove(1, disjunct=True)
    assert len(gf) == 0 and gf.probe(3) == (0, 0)


def test_null_and_nan_values():
    gf = GroupedFilter("S", "a", 0)
    for bit, (op, c) in enumerate([("<", 1.5), ("!=", 2.0), ("not in", frozenset({1})),
                                   ("is null", None), ("is not null", None), ("=", 3)]):
        gf.add(op, c, bit)
    assert gf.probe(None) == (0b110111, 0)  # only IS NULL is TRUE
    # NaN: as Python compares it (compiled predicates do): only !=, NOT IN, IS NOT NULL
    assert gf.probe(float("nan")) == (0b101001, 0)


def test_probe_and_probe_row_use_the_current_predicates():
    gf = GroupedFilter("S", "a", 2)
    assert gf.probe(1) == (0, 0) and gf.probe_row((0, 0, None)) == (0, 0)
    gf.add(">=", 1, 3)
    assert gf.probe_row((0, 0, 1)) == (0, 0)
    gf.add("=", 2, 3)
    assert gf.probe_row((0, 0, 1)) == (8, 0)
    assert gf.probe_row((0, 0, 2)) == (0, 0)
    assert "bisect" in gf.source_code


def test_refusals():
    gf = GroupedFilter("S", "a", 0)
    with pytest.raises(ValueError, match="unknown predicate 'like'"):
        gf.add("like", "x%", 0)
    with pytest.raises(ValueError, match="tag bit"):
        gf.add(">", 1, -1)
    with pytest.raises(ValueError, match="NULL"):
        gf.add("=", None, 0)
    with pytest.raises(ValueError, match="NULL"):
        gf.add("in", frozenset({1, None}), 0)
    with pytest.raises(ValueError, match="NaN"):
        gf.add("<", float("nan"), 0)
    gf.add(">", 1, 0)
    with pytest.raises(TypeError, match="S.a: constant 'x' cannot be ordered"):
        gf.add("<", "x", 1)
    gf.add("=", "x", 1)  # equality with another type is just never TRUE, as in Python
    assert gf.probe(2) == (2, 0)


def test_incomparable_value_raises_naming_the_filter():
    gf = GroupedFilter("S", "price", 0)
    gf.add(">", 10, 0)
    with pytest.raises(TypeError, match=r"grouped filter S.price: cannot probe with the "
                                        r"value 'abc' \(str\)"):
        gf.probe("abc")
    equality_only = GroupedFilter("S", "price", 0)
    equality_only.add("=", 10, 0)
    assert equality_only.probe("abc") == (1, 0)


# ----- opaque filters ---------------------------------------------------------------------------
def test_opaque_filter_tags():
    cols = ("a", "b")
    of = OpaqueFilter("S")
    of.add(compile_predicate(_where("S.a < S.b"), cols, "S"), 0, label="q0: S.a < S.b")
    of.add(compile_predicate(_where("S.a + S.b > 10"), cols, "S"), 1, disjunct=True)
    assert of.probe_row((1, 2)) == (0, 0)
    assert of.probe_row((9, 3)) == (1, 2)
    assert of.probe_row((None, 3)) == (1, 0)
    assert len(of) == 2 and of.conjunct_bits == 1 and of.disjunct_bits == 2
    assert of.predicates() == [("opaque", "q0: S.a < S.b", 0, False), ("opaque", "", 1, True)]
    of.remove(0)
    assert of.probe_row((9, 3)) == (0, 2) and of.conjunct_bits == 0


def test_opaque_filter_attributes_a_raising_udf_to_its_tag():
    def bad(x):
        return 1 / x

    udfs = {"inv": bad}
    of = OpaqueFilter("S")
    of.add(compile_predicate(_where("S.a > 0"), ("a",), "S"), 0)
    of.add(compile_predicate(_where("inv(S.a) > 0"), ("a",), "S", udfs=udfs), 5,
           disjunct=True, label="q5: inv(S.a) > 0")
    assert of.probe_row((2,)) == (0, 32)
    with pytest.raises(FilterError) as info:
        of.probe_row((0,))
    err = info.value
    assert err.bit == 5 and err.disjunct and err.label == "q5: inv(S.a) > 0"
    assert isinstance(err.error, UDFError) and err.error.name == "inv"
    assert isinstance(err.__cause__, UDFError)
    assert "q5: inv(S.a) > 0" in str(err) and "'inv'" in str(err)
    assert isinstance(err.error.__cause__, ZeroDivisionError)


def _where(text: str):
    import sqlglot
    return sqlglot.parse_one(f"SELECT 1 FROM S WHERE {text}").args["where"].this
