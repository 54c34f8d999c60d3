"""Globally-consistent caches X ⋈ Y (a-caching.txt §6) in MJoin, together with other caches,
against the brute-force oracle.

A §6 entry holds at least the X tuples that join Y (Def. 6.1), not all of σ_{K=u}(X), so
its hits must not feed a CacheUpdate that needs every new tuple of its join (§3.2: "U_l has
access to all updates"); and an entry whose Y holds the pipeline's own stream R_i lives
only while an R_i tuple has its key (MJoin's guard), looked up in the key's own column
order."""

from __future__ import annotations

import random
import re
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adaptcq.adapt.caching import enumerate_candidates
from adaptcq.engine.continuous import ContinuousQuery
from adaptcq.query.cql import parse_query
from conftest import examples
from oracle import Oracle, assert_equals_oracle
from test_acaching import chaotic, eager
from test_engine_oracle import check_cache_invariants, hard_placements, valid_placements

SCHEMA = {"a": "number", "b": "number", "c": "number", "id": "number"}


@st.composite
def cases(draw):
    """A 3- or 4-way join over S0.. (columns a, b, c, id) whose graph is a tree or a cycle,
    one edge of it sometimes two predicates crossing columns (S_i.a = S_j.b AND S_i.b =
    S_j.a): keys of two or three columns, often not in the columns' order; random
    windows, and 20 to 36 arrivals over small domains (keys recur, so entries are hit,
    and rows expire)."""
    n = draw(st.integers(3, 4))
    names = [f"S{i}" for i in range(n)]
    edges = [(draw(st.integers(0, i - 1)), i) for i in range(1, n)]
    if draw(st.booleans()) and (0, n - 1) not in edges:
        edges.append((0, n - 1))
    crossed = draw(st.integers(-1, len(edges) - 1))  # -1: none
    col = st.sampled_from("abc")
    preds = set()
    for e, (i, j) in enumerate(edges):
        if e == crossed:
            preds |= {f"{names[i]}.a = {names[j]}.b", f"{names[i]}.b = {names[j]}.a"}
        else:
            preds.add(f"{names[i]}.{draw(col)} = {names[j]}.{draw(col)}")
    windows = [draw(st.sampled_from([" [RANGE 0 SECONDS]", " [RANGE 1 SECONDS]",
                                     " [RANGE 2.5 SECONDS]", " [ROWS 1]", " [ROWS 2]",
                                     " [ROWS 3]", ""])) for _ in names]
    sql = ("SELECT " + ", ".join(f"{nm}.id AS i{k}" for k, nm in enumerate(names))
           + " FROM " + ", ".join(nm + w for nm, w in zip(names, windows))
           + " WHERE " + " AND ".join(sorted(preds)))
    q = parse_query(sql, {nm: SCHEMA for nm in names})
    # The arrivals from a seed: hypothesis's own draws favour small, repetitive values.
    rnd = random.Random(draw(st.integers(0, 10**6)))
    values = [0, 1, 1, None] if rnd.random() < 0.3 else [0, 1]
    streams, ts, rows, t = [], [], [], 0.0
    for r in range(rnd.randint(20, 36)):
        t += rnd.choice([0.0, 0.0, 0.5, 1.0, 3.0])
        s = rnd.randrange(n)
        vals = {c: rnd.choice(values) for c in "abc"} | {"id": r}
        streams.append(s)
        ts.append(t)
        rows.append(tuple(vals[c] for c in q.columns[names[s]]))
    return q, streams, ts, rows


def _orders(q, rnd: random.Random) -> dict[str, list[str]]:
    """Orders giving a random group of streams the prefix property (so prefix caches of
    the group and §6 caches with X ∪ Y = the group exist), the rest random."""
    group = rnd.sample(q.aliases, rnd.randint(2, len(q.aliases)))
    orders = {}
    for a in q.aliases:
        head = [g for g in group if g != a] if a in group else []
        tail = [x for x in q.aliases if x != a and x not in head]
        rnd.shuffle(head)
        rnd.shuffle(tail)
        orders[a] = head + tail
    return orders


def _place_together(ex, rnd: random.Random, most: int = 4) -> list:
    """Up to ``most`` caches: first the hard ones (``hard_placements``: a §6 cache and one
    whose CacheUpdate would follow its hits, or a guarded §6 cache with a permuted key),
    then the other valid placements in random order. Refused placements are skipped."""
    valid = valid_placements(ex)
    rnd.shuffle(valid)
    head = hard_placements(ex, rnd, valid)
    placed = []
    for pipeline, j, k, extra in head + [v for v in valid if v not in head]:
        if len(placed) == most:
            break
        try:
            placed.append(ex.place_cache(pipeline, j, k, extra, buckets=rnd.choice([1, 3, 64])))
        except ValueError:
            continue
    return placed


def _check(q, mode, streams, ts, rows, cq) -> None:
    """Feed the arrivals one at a time, checking every cache's invariant after each, then
    every update's output against the oracle."""
    out = []
    for k in range(len(rows)):
        out += cq.process(streams[k:k + 1], None, ts[k:k + 1], rows[k:k + 1])
        check_cache_invariants(cq.executor)
    assert_equals_oracle(q, mode, streams, ts, rows, cq.trace, out)


@settings(max_examples=examples(300), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=cases(), mode=st.sampled_from(["append", "retract"]),
       interpreted=st.booleans(), seed=st.integers(0, 10**6))
def test_global_caches_with_other_caches_equal_the_oracle(case, mode, interpreted, seed):
    """Several caches in use at once in different pipelines, §6 ones among them (Y with or
    without the pipeline's own stream; keys of several columns in or out of their column
    order; pairs that may not live together offered in either order), through the
    compiled or the interpreted back end: every cache entry its definition's after every
    update, and every update's output the oracle's."""
    q, streams, ts, rows = case
    rnd = random.Random(seed)
    cq = ContinuousQuery(q, "mjoin", mode, trace=True)
    for a, order in _orders(q, rnd).items():
        cq.executor.set_order(a, order)
    _place_together(cq.executor, rnd)
    if interpreted:
        cq.executor.use_interpreter()
    _check(q, mode, streams, ts, rows, cq)


@settings(max_examples=examples(60), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=cases(), mode=st.sampled_from(["append", "retract"]), seed=st.integers(0, 1000))
def test_acaching_with_global_candidates_equals_the_oracle(case, mode, seed):
    """The live policy with ``caches="global"`` and random estimates (so it selects, uses
    and drops many candidate sets, §6's among them): every cache entry its definition's
    after every update, and the oracle's output."""
    q, streams, ts, rows = case
    rnd = random.Random(seed)
    cq = ContinuousQuery(q, "mjoin", mode, trace=True)
    for a, order in _orders(q, rnd).items():
        cq.executor.set_order(a, order)
    cq.attach(chaotic(eager(caches="global", m=12, seed=seed), seed))
    _check(q, mode, streams, ts, rows, cq)


# ----- the two defects, as found (regressions) --------------------------------------------
def _chain3(windows=("[RANGE 0.1 SECONDS]", "[ROWS 2]", "[RANGE 0 SECONDS]")):
    """S0 ⋈_{S0.b = S1.a} S1 ⋈_{S1.b = S2.a} S2 with the given windows."""
    return parse_query(
        "SELECT S0.id AS i0, S1.id AS i1, S2.id AS i2 FROM "
        + ", ".join(f"S{i} {w}" for i, w in enumerate(windows))
        + " WHERE S0.b = S1.a AND S1.b = S2.a",
        {f"S{i}": {"a": "number", "b": "number", "id": "number"} for i in range(3)})


def _oracle_total(q, mode, streams, ts, rows) -> Counter:
    total: Counter = Counter()
    for w in Oracle(q, mode).run(streams, None, ts, rows)[1]:
        total.update(w)
    return total


@pytest.mark.parametrize("first", ["global", "prefix"])
def test_a_cacheupdate_may_not_follow_global_hits_before_y_is_joined(first):
    """Regression: the §6 cache C[S1 ⋈ S0⋈S2 | S1.a] in ΔS0's pipeline (S1 then S2) holds
    only S1 tuples that join S2 (Def. 6.1); the prefix cache C[S0⋈S1 | S1.b] in ΔS2's
    pipeline has its CacheUpdate in ΔS0's pipeline right after S1, so S0's expiry ran
    through the §6 hit, never reached that CacheUpdate, and left the pair (S0#200, S1#300)
    in C[S0⋈S1]: a later S2 row joined an expired S0 row (retract mode). Whichever is
    placed second is refused, naming both; with the one placed, results are exact."""
    q = _chain3()
    cq = ContinuousQuery(q, "mjoin", "retract", trace=True)
    ex = cq.executor
    for a, order in {"S0": ["S1", "S2"], "S1": ["S0", "S2"], "S2": ["S1", "S0"]}.items():
        ex.set_order(a, order)
    place = {"global": lambda: ex.place_cache("S0", 1, 1, frozenset({"S0", "S2"})),
             "prefix": lambda: ex.place_cache("S2", 1, 2)}
    place[first]()
    message = ("the CacheUpdate of C[S0⋈S1 | S1.b] in S0's pipeline (after join 1) would "
               "follow the hits of the globally-consistent cache C[S1 ⋈ S0⋈S2 | S1.a] at "
               "1..1 before S2 of its Y is joined")
    with pytest.raises(ValueError, match=re.escape(message)):
        place["prefix" if first == "global" else "global"]()
    assert len(ex.caches) == 1 and sum(map(len, ex.placements.values())) == 1
    streams, ts = [2, 0, 1, 0, 2], [0.0, 1.0, 1.0, 1.5, 2.0]
    rows = [(2, 100), (2, 200), (2, 2, 300), (9, 201), (2, 101)]
    _check(q, "retract", streams, ts, rows, cq)


def test_candidates_a_caching_enumerates_are_refused_together():
    """Regression (the 4-way form): two candidates of ``enumerate_candidates(q, orders,
    6)``, the §6 C[S0: (S1⋈S3)⋈S0⋈S2] and the prefix C[S2: S0⋈S1⋈S3], whose CacheUpdate in
    ΔS0's pipeline follows the §6 hits before S2 is joined: the second placement is
    refused (A-Caching logs it and goes on without it), and the output is the oracle's."""
    q = parse_query(
        "SELECT S0.id AS i0, S1.id AS i1, S2.id AS i2, S3.id AS i3 FROM S0 [RANGE 0.1 "
        "SECONDS], S1 [ROWS 2], S2 [RANGE 0 SECONDS], S3 [ROWS 1] "
        "WHERE S0.b = S1.a AND S1.b = S2.a AND S2.b = S3.a",
        {f"S{i}": {"a": "number", "b": "number", "id": "number"} for i in range(4)})
    orders = {"S0": ["S1", "S3", "S2"], "S1": ["S0", "S3", "S2"], "S2": ["S0", "S3", "S1"],
              "S3": ["S1", "S0", "S2"]}
    cands = {c.name: c for c in enumerate_candidates(q, orders, 6)}
    prefix, glob = cands["C[S2: S0⋈S1⋈S3 | key S1.b,S3.a]"], cands["C[S0: (S1⋈S3)⋈S0⋈S2 | key S1.a]"]
    cq = ContinuousQuery(q, "mjoin", "retract", trace=True)
    for a, order in orders.items():
        cq.executor.set_order(a, order)
    cq.executor.place_cache(prefix.pipeline, prefix.start, prefix.end, prefix.extra)
    with pytest.raises(ValueError, match="before S2 of its Y is joined"):
        cq.executor.place_cache(glob.pipeline, glob.start, glob.end, glob.extra)
    streams, ts = [2, 0, 3, 1, 2], [1465.1, 1465.9, 1465.9, 1465.9, 1471.2]
    rows = [(0, 0, 2922), (2, 2923), (0, 2924), (2, 0, 2925), (0, 0, 2932)]
    _check(q, "retract", streams, ts, rows, cq)


@pytest.mark.parametrize(("extra", "other"), [
    ({"S0", "S2"}, ("S2", 1, 2, {"S2"})),  # its CacheUpdate in ΔS0's comes after S1 and S2
    ({"S0"}, ("S2", 1, 2, set())),         # C[S0⋈S1] right after the segment: Y = {S0}
])
def test_a_cacheupdate_after_all_of_y_is_joined_is_accepted(extra, other):
    """The refusal is no wider than needed: a §6 cache C[S1 ⋈ Y] over S1 in ΔS0's
    pipeline (S1 then S2) and a cache whose CacheUpdate in ΔS0's pipeline comes after
    every relation of Y is joined (R_i itself, S0, is joined from the start: its tuple is
    the one passing) are used together; the output is the oracle's, in both modes."""
    q = _chain3(("[ROWS 2]", "[ROWS 2]", "[RANGE 1 SECONDS]"))
    rnd = random.Random(5)
    streams = [rnd.randrange(3) for _ in range(60)]
    ts = [k / 4 for k in range(60)]
    rows = [tuple({"a": rnd.randint(0, 1), "b": rnd.randint(0, 1), "id": k}[c]
                  for c in q.columns[f"S{s}"]) for k, s in enumerate(streams)]
    for mode in ("append", "retract"):
        cq = ContinuousQuery(q, "mjoin", mode, trace=True)
        ex = cq.executor
        for a, order in {"S0": ["S1", "S2"], "S1": ["S0", "S2"], "S2": ["S0", "S1"]}.items():
            ex.set_order(a, order)
        first = ex.place_cache("S0", 1, 1, frozenset(extra))
        second = ex.place_cache(*other[:3], frozenset(other[3]))
        _check(q, mode, streams, ts, rows, cq)
        assert first.hits and second.hits


@pytest.mark.parametrize("mode", ["append", "retract"])
def test_guarded_cache_evicts_by_its_own_key_order(mode):
    """Regression: the §6 cache C[S2: (S0⋈S1)⋈S2 | key S0.c,S1.b] (Y holds S2 itself) keys
    its entries by (S2.b, S2.a), the cache key's order; its guard looked that key up in
    S2's index on the positions sorted, (S2.a, S2.b), so S2#3 = (1, 0) kept the entry of
    the departed S2#1 = (0, 1) alive, and S2#6 hit the stale entry: its result with S0#2
    and S1#5 was lost, in both modes."""
    q = parse_query(
        "SELECT S0.id AS i0, S1.id AS i1, S2.id AS i2 FROM S0 [ROWS 2], "
        "S1 [RANGE 0 SECONDS], S2 [ROWS 2] WHERE S0.b = S1.a AND S1.b = S2.a AND S2.b = S0.c",
        {"S0": {"b": "number", "c": "number", "id": "number"},
         "S1": {"a": "number", "b": "number", "id": "number"},
         "S2": {"a": "number", "b": "number", "id": "number"}})
    orders = {"S0": ["S1", "S2"], "S1": ["S2", "S0"], "S2": ["S1", "S0"]}
    cand = next(c for c in enumerate_candidates(q, orders, 6)
                if c.pipeline == "S2" and c.extra == {"S2"})
    cq = ContinuousQuery(q, "mjoin", mode, trace=True)
    for a, order in orders.items():
        cq.executor.set_order(a, order)
    cache = cq.executor.place_cache(cand.pipeline, cand.start, cand.end, cand.extra)
    assert cache.guard[1] == (1, 0)  # S2's columns (a, b, id): b then a, the key's order
    streams, ts = [2, 0, 2, 2, 1, 2], [1.0, 2.0, 3.0, 4.0, 5.0, 5.0]
    rows = [(0, 1, 1), (1, 1, 2), (1, 0, 3), (2, 1, 4), (1, 0, 5), (0, 1, 6)]
    _check(q, mode, streams, ts, rows, cq)
    assert _oracle_total(q, mode, streams, ts, rows)[(2, 5, 6, 1, 5.0)] == 1
