"""The one check of a pipeline order (``engine.rules.check_order``), as every entry point
sees it: MJoin and the vectorized executor (``orders=``, ``set_order``), ContinuousQuery,
``adaptcq.run``; a refused ``set_order`` leaves the plan as it was; and
``ContinuousQuery.restore`` refuses a plan option that differs from the snapshot's."""

from __future__ import annotations

import random
import re

import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import adaptcq
from adaptcq.engine.continuous import ContinuousQuery
from adaptcq.engine.mjoin import MJoin
from adaptcq.engine.rules import check_given_orders, check_order
from adaptcq.engine.vector import VectorJoin
from adaptcq.errors import OptionError
from adaptcq.query.cql import parse_query
from conftest import examples
from oracle import assert_equals_oracle

SCH = {"a": "number", "b": "number", "id": "number"}
SQL = ("SELECT R.id AS r, S.id AS s, T.id AS t, U.id AS u FROM R [RANGE 6], S [RANGE 6], "
       "T [RANGE 6], U [RANGE 6] WHERE R.a = S.a AND S.b = T.b AND T.a = U.a")
Q = parse_query(SQL, {s: SCH for s in "RSTU"})
ALIASES = list(Q.aliases)


def _arrivals(seed: int, n: int = 60, q=Q):
    """n arrivals, four a second, on random streams of ``q``: join columns in 0..2, id k."""
    rnd = random.Random(seed)
    streams = [rnd.randrange(len(q.aliases)) for _ in range(n)]
    rows = [tuple(k if c == "id" else rnd.randrange(3) for c in q.columns[q.aliases[i]])
            for k, i in enumerate(streams)]
    return streams, [k / 4 for k in range(n)], rows


def _not_an_order(draw, others):
    """Something that names the right streams but is no order: the streams as one string,
    a set, a frozenset, a one-shot iterator, a generator, a dict; or None, a number, a list
    holding a non-string."""
    kind = draw(st.sampled_from(["str", "set", "frozenset", "iter", "gen", "dict", "none",
                                 "int", "mixed"]))
    perm = draw(st.permutations(others))
    return {"str": lambda: "".join(perm), "set": lambda: set(perm),
            "frozenset": lambda: frozenset(perm), "iter": lambda: iter(perm),
            "gen": lambda: (s for s in perm), "dict": lambda: dict.fromkeys(perm),
            "none": lambda: None, "int": lambda: 3,
            "mixed": lambda: [*perm[:-1], 1]}[kind]()


@st.composite
def bad_orders(draw):
    start = draw(st.sampled_from(ALIASES))
    return start, _not_an_order(draw, [a for a in ALIASES if a != start])


@st.composite
def wrong_lists(draw):
    """Lists of stream names that are not each other stream once: one missing, one twice,
    the start itself in it, or a stream not in the query."""
    start = draw(st.sampled_from(ALIASES))
    others = draw(st.permutations([a for a in ALIASES if a != start]))
    k = draw(st.integers(0, len(others) - 1))
    how = draw(st.sampled_from(["drop", "twice", "start", "unknown"]))
    wrong = {"drop": others[:k] + others[k + 1:], "twice": [*others, others[k]],
             "start": [*others[:k], start, *others[k + 1:]],
             "unknown": [*others[:k], "X", *others[k + 1:]]}[how]
    return start, wrong


@settings(max_examples=examples(60))
@given(start=st.sampled_from(ALIASES), data=st.data(), as_tuple=st.booleans())
def test_every_permutation_as_a_list_or_tuple_is_an_order(start, data, as_tuple):
    perm = data.draw(st.permutations([a for a in ALIASES if a != start]))
    order = tuple(perm) if as_tuple else list(perm)
    got = check_order(ALIASES, start, order)
    assert got == list(perm) and type(got) is list and got is not order
    ex = MJoin(Q, orders={start: order})
    assert ex.orders[start] == list(perm)
    ex.set_order(start, order[::-1])
    assert ex.orders[start] == list(perm)[::-1]


@settings(max_examples=examples(80))
@given(bad=bad_orders())
def test_what_is_no_list_of_names_is_refused_everywhere_naming_the_stream(bad):
    """A string was taken letter by letter, a set in its hash order (another plan with
    another PYTHONHASHSEED), an iterator used up by the check (an empty order stored);
    None and numbers gave raw TypeErrors."""
    start, order = bad
    message = re.escape(f"orders[{start!r}] must be a list of the other streams")
    with pytest.raises(ValueError, match=message):
        check_order(ALIASES, start, order)
    with pytest.raises(OptionError, match=message):
        ContinuousQuery(Q, "mjoin", orders={start: order})


@settings(max_examples=examples(80))
@given(wrong=wrong_lists())
def test_a_list_not_naming_each_other_stream_once_is_refused(wrong):
    start, order = wrong
    others = ", ".join(sorted(a for a in ALIASES if a != start))
    message = re.escape(f"pipeline order for {start} must list each of {others} once, "
                        f"got {', '.join(order) or 'nothing'}")
    with pytest.raises(ValueError, match=message):
        check_order(ALIASES, start, order)
    with pytest.raises(OptionError, match=message):
        MJoin(Q, orders={start: order})


def _vector(orders=None):
    schemas = {n: pa.schema([("ts", pa.float64()), ("a", pa.int64()), ("b", pa.int64()),
                             ("id", pa.int64())]) for n in ALIASES}
    return VectorJoin(Q, schemas=schemas, orders=orders)


@pytest.mark.parametrize("order", ["STU", {"S", "T", "U"}, None, [1, 2, 3], ["S", None, "T"]])
def test_the_executors_and_the_run_give_one_message(order):
    """MJoin, the vectorized executor, ContinuousQuery and adaptcq.run refuse a bad order
    with the same words (the check lives in one place)."""
    message = re.escape("orders['R'] must be a list of the other streams (S, T, U) in "
                        "the order R's pipeline joins them, got ")
    for build in (lambda: MJoin(Q, orders={"R": order}),
                  lambda: _vector({"R": order}),
                  lambda: ContinuousQuery(Q, "mjoin", orders={"R": order})):
        with pytest.raises(OptionError, match=message):
            build()
    frames = {n: pd.DataFrame({"ts": [1.0], "a": [1], "b": [1], "id": [1]}) for n in ALIASES}
    for executor in ("mjoin", "vector"):
        with pytest.raises(OptionError, match=message):
            adaptcq.run(SQL, frames, executor=executor, orders={"R": order})
    for ex in (MJoin(Q), _vector()):
        with pytest.raises(ValueError, match=message):
            ex.set_order("R", order)


@pytest.mark.parametrize("orders, message", [
    (["S", "T", "U"], ("orders must map streams to their pipeline orders, e.g. "
                       "{'R': ['S', 'T', 'U']}, got ['S', 'T', 'U']")),
    ({"X": ["R"]}, "pipeline order for X: no stream X in the query (streams: R, S, T, U)"),
    ({1: [], "Y": []}, "pipeline order for 1, Y: no stream 1 or Y in the query"),
])
def test_the_orders_option_itself_is_checked(orders, message):
    with pytest.raises(OptionError, match=re.escape(message)):
        check_given_orders(ALIASES, orders, OptionError)
    with pytest.raises(OptionError, match=re.escape(message)):
        ContinuousQuery(Q, "mjoin", orders=orders)
    with pytest.raises(OptionError, match=re.escape(message)):
        _vector(orders)


@pytest.mark.parametrize("make", [lambda: MJoin(Q), _vector], ids=["mjoin", "vector"])
def test_set_order_of_a_stream_not_in_the_query_names_it(make):
    ex = make()
    with pytest.raises(ValueError, match=re.escape(
            "pipeline order for X: no stream X in the query (streams: R, S, T, U)")):
        ex.set_order("X", ["R", "S", "T", "U"])
    assert "X" not in ex.orders


@settings(max_examples=examples(25))
@given(bad=bad_orders(), seed=st.integers(0, 10**6), mode=st.sampled_from(["append",
                                                                           "retract"]))
def test_a_refused_set_order_leaves_the_plan_and_the_results_exact(bad, seed, mode):
    """set_order given a one-shot iterator stored the empty list its check left, so every
    later re-plan (place_cache, another set_order) raised KeyError."""
    start, order = bad
    streams, ts, rows = _arrivals(seed)
    cut = len(rows) // 2
    cq = ContinuousQuery(Q, "mjoin", mode, trace=True)
    out = cq.process(streams[:cut], None, ts[:cut], rows[:cut])
    before = {a: list(o) for a, o in cq.executor.orders.items()}
    with pytest.raises(ValueError):
        cq.executor.set_order(start, order)
    assert cq.executor.orders == before
    # Re-plans after it still work: re-order another way, then a cache (R ⋈ S in ΔT's and
    # ΔU's pipelines needs T: R, S, ... and U: ...; place one where the plan allows).
    cq.executor.set_order("T", ["S", "R", "U"])
    cq.executor.set_order("U", ["T", "S", "R"])
    cq.executor.set_order("S", ["R", "T", "U"])
    cq.executor.set_order("R", ["S", "T", "U"])
    cq.executor.place_cache("T", 1, 2)
    out += cq.process(streams[cut:], None, ts[cut:], rows[cut:])
    assert_equals_oracle(Q, mode, streams, ts, rows, cq.trace, out)
    assert out  # (the arrivals join: an empty run would prove nothing)


def test_the_order_a_set_gives_no_longer_depends_on_the_hash_seed():
    """(A set was accepted in its iteration order; now there is nothing to depend on.)"""
    for order in ({"S", "T", "U"}, frozenset("STU")):
        with pytest.raises(OptionError):
            ContinuousQuery(Q, "mjoin", orders={"R": order})


# ----- restore -------------------------------------------------------------------------------
Q3 = parse_query("SELECT R.id AS r, S.id AS s, T.id AS t FROM R [RANGE 6], S [RANGE 6], "
                 "T [RANGE 6] WHERE R.a = S.a AND S.b = T.b", {s: SCH for s in "RST"})


@pytest.mark.parametrize("executor, built, asked, name", [
    ("xjoin", {"tree": (("R", "S"), "T")}, {"tree": ("R", ("S", "T"))}, "tree"),
    ("xjoin", {"tree": (("R", "S"), "T")}, {"tree": "(R, (S, T))"}, "tree"),
    ("mjoin", {}, {"orders": {"R": ["T", "S"]}}, "orders"),
    ("mjoin", {}, {"nested_loop": ["S"]}, "nested_loop"),
    ("mjoin", {"nested_loop": "S"}, {"nested_loop": []}, "nested_loop"),
    ("mjoin", {}, {"orders": {"R": iter(["S", "T"])}}, "orders"),
    ("mjoin", {}, {"time_unit": 1e-9}, "time_unit"),
    ("mjoin", {}, {"explicit_deletions": True}, "explicit_deletions"),
])
def test_restore_refuses_a_setting_that_differs_from_the_snapshot(executor, built, asked,
                                                                 name):
    """The snapshot's plan replaced the options given to restore, silently."""
    blob = ContinuousQuery(Q3, executor, "retract", **built).snapshot()
    with pytest.raises(OptionError, match=rf"restore: {name}=.* differs from the "
                                          rf"snapshot's {name}="):
        ContinuousQuery.restore(Q3, blob, "retract", **asked)


@pytest.mark.parametrize("executor, built, asked", [
    ("xjoin", {"tree": (("R", "S"), "T")}, {"tree": "((R, S), T)"}),
    ("xjoin", {"tree": (("R", "S"), "T")}, {"tree": [["R", "S"], "T"]}),
    ("mjoin", {"orders": {"R": ["T", "S"]}, "nested_loop": "S"},
     {"orders": {"R": ("T", "S")}, "nested_loop": ["S"], "time_unit": 1}),
])
def test_restore_with_the_snapshots_own_settings_continues_exactly(executor, built, asked):
    streams, ts, rows = _arrivals(7, 40, Q3)
    whole = ContinuousQuery(Q3, executor, "retract", **built)
    want = whole.process(streams, None, ts, rows)
    first = ContinuousQuery(Q3, executor, "retract", **built)
    got = first.process(streams[:20], None, ts[:20], rows[:20])
    again = ContinuousQuery.restore(Q3, first.snapshot(), "retract", **asked)
    got += again.process(streams[20:], None, ts[20:], rows[20:])
    assert sorted(map(repr, got)) == sorted(map(repr, want)) and want
    assert again.executor.plan_state() == first.executor.plan_state()


def test_restore_takes_the_constructors_not_given_defaults():
    """``orders=None`` / ``nested_loop=None`` are what the constructor takes for "not
    given": restoring with them asks for nothing and is not refused."""
    q = parse_query("SELECT R.a FROM R, S, T WHERE R.a = S.a AND S.a = T.a")
    cq = ContinuousQuery(q, "mjoin", "append")
    cq.process([0, 1, 2], None, [1.0, 2.0, 3.0], [(1,), (1,), (1,)])
    blob = cq.snapshot()
    back = ContinuousQuery.restore(q, blob, "append", orders=None, nested_loop=None)
    assert back.process([0], None, [4.0], [(1,)]) == cq.process([0], None, [4.0], [(1,)])
