"""A-Caching's cache selection policy (a-caching.txt §3.2, §4.4, §6, Appendix B):
candidate enumeration on the Example 4.1/4.2 plan (Figure 5), the selection algorithms
against exhaustive search (hypothesis), the LP bounds and its integral cases, and a
hand-computed instance."""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adaptcq.adapt.caching import (
    Candidate,
    Estimate,
    containment_forest,
    enumerate_candidates,
    global_candidate,
    global_candidates,
    is_nonoverlapping,
    net_benefit,
    prefix_candidates,
    prefix_property,
    proc,
    select,
    select_exhaustive,
    select_greedy,
    select_lp,
    select_tree,
    shared_groups,
    solve_relaxation,
    total_cost,
)
from adaptcq.query.cql import parse_query
from adaptcq.query.logical import ColumnRef
from conftest import examples

SIX = [f"R{i}" for i in range(1, 7)]


def equijoin(names: list[str]):
    """R1(A) ⋈_A R2(A) ⋈_A .. : every relation joined on the one attribute A."""
    where = " AND ".join(f"{a}.A = {b}.A" for a, b in itertools.pairwise(names))
    return parse_query(f"SELECT {names[0]}.A FROM {', '.join(names)} WHERE {where}")


# Figure 5(a) is not in our copy of the paper; these orders satisfy every statement of
# Examples 4.1 and 4.2 (see the tests below):
# - {R1,R2}: ΔR1 starts with R2, ΔR2 with R1;  {R1,R2,R3}: the first two of ΔR1, ΔR2, ΔR3;
# - {R4,R5}: ΔR4 starts with R5, ΔR5 with R4;  {R1..R5}: R6 is last in ΔR1..ΔR5;
# - ΔR5 has R1,R2 apart (R1,R2 is shared in ΔR3, ΔR4, ΔR6 only) and ΔR6 has R1,R2,R3 apart
#   (R1,R2,R3 is shared in ΔR4, ΔR5 only); ΔR6's three candidates are R1R2, R4R5, R1..R5.
FIG5 = {
    "R1": ["R2", "R3", "R4", "R5", "R6"],
    "R2": ["R1", "R3", "R4", "R5", "R6"],
    "R3": ["R1", "R2", "R4", "R5", "R6"],
    "R4": ["R5", "R1", "R2", "R3", "R6"],
    "R5": ["R4", "R1", "R3", "R2", "R6"],
    "R6": ["R1", "R2", "R4", "R5", "R3"],
}


@pytest.fixture(scope="module")
def six():
    return equijoin(SIX)


def segs(cands):
    return {(c.pipeline, frozenset(c.segment)) for c in cands}


def A(*streams):
    return frozenset(ColumnRef(s, "A") for s in streams)


# ----- Example 4.1 / 4.2 / 6.1 ------------------------------------------------------------
def test_example_4_1_prefix_property_sets():
    """"The prefix property holds for {R1,R2}, {R4,R5}, {R1,R2,R3}, and {R1,..,R5}"."""
    holds = {frozenset(s) for size in range(2, 6) for s in itertools.combinations(SIX, size)
             if prefix_property(FIG5, frozenset(s))}
    assert holds == {frozenset(s) for s in (("R1", "R2"), ("R4", "R5"), ("R1", "R2", "R3"),
                                            ("R1", "R2", "R3", "R4", "R5"))}


def test_example_4_1_candidates_and_trees(six):
    cands = prefix_candidates(six, FIG5)
    per = Counter(c.pipeline for c in cands)
    # "there are two candidate caches in ΔR4's pipeline" (R1,R2 and R1,R2,R3) ...
    assert {c.segment for c in cands if c.pipeline == "R4"} == {
        frozenset({"R1", "R2"}), frozenset({"R1", "R2", "R3"})}
    # ... "three candidate caches in ΔR6's pipeline".
    assert per["R6"] == 3
    # Every candidate's segment is one of the four prefix-property sets.
    assert {c.segment for c in cands} == {frozenset(s) for s in (
        ("R1", "R2"), ("R4", "R5"), ("R1", "R2", "R3"), ("R1", "R2", "R3", "R4", "R5"))}
    forest = containment_forest(cands)
    # Figure 5(b): a chain R1R2 ⊂ R1R2R3 in ΔR4's pipeline.
    r4 = [c for c in forest[None] if c.pipeline == "R4"]
    assert [c.segment for c in r4] == [frozenset({"R1", "R2", "R3"})]
    assert [c.segment for c in forest[r4[0]]] == [frozenset({"R1", "R2"})]
    # Figure 5(c): ΔR6's three caches form one tree rooted at R1..R5.
    r6 = [c for c in forest[None] if c.pipeline == "R6"]
    assert len(r6) == 1 and r6[0].segment == frozenset(SIX[:5])
    assert {c.segment for c in forest[r6[0]]} == {frozenset({"R1", "R2"}),
                                                  frozenset({"R4", "R5"})}
    assert [(c.start, c.end) for c in cands if c.pipeline == "R6"] == [(1, 2), (1, 5), (3, 4)]


def test_example_4_2_shared_caches(six):
    groups = shared_groups(prefix_candidates(six, FIG5))
    by_segment = {g[0]: sorted(c.pipeline for c in members) for g, members in groups.items()}
    # "R1,R2 is shared in the pipelines for ΔR3, ΔR4, and ΔR6."
    assert by_segment[frozenset({"R1", "R2"})] == ["R3", "R4", "R6"]
    # "R1,R2,R3 is shared in the pipelines for ΔR4 and ΔR5."
    assert by_segment[frozenset({"R1", "R2", "R3"})] == ["R4", "R5"]
    # "the key for each cache is attribute A": one group per segment, keyed on A — one
    # segment-side column of the class (engine.rules.cache_key: the first in FROM order).
    assert len(groups) == 4
    for segment, key, extra in groups:
        assert key == A(min(segment, key=SIX.index)) and extra == frozenset()
    # Forced by the statements (not stated): R4,R5 sits at positions 3..4 of ΔR1..ΔR3.
    assert by_segment[frozenset({"R4", "R5"})] == ["R1", "R2", "R3", "R6"]
    assert by_segment[frozenset(SIX[:5])] == ["R6"]


def test_candidate_names_and_keys(six):
    c = next(c for c in prefix_candidates(six, FIG5) if c.pipeline == "R4" and c.end == 3)
    assert (c.start, c.end, c.segment, c.key) == (2, 3, frozenset({"R1", "R2"}), A("R1"))
    assert c.name == "C[R4: R1⋈R2 | key R1.A]"
    assert c.operators == (("R4", 2), ("R4", 3))


def test_example_6_1_globally_consistent_cache(six):
    """ΔR6's pipeline R2,R3,R4,R5,R1: R2⋈R3 fails the prefix invariant, (R2⋈R3)⋈R1 holds."""
    orders = dict(FIG5, R6=["R2", "R3", "R4", "R5", "R1"])
    assert not prefix_property(orders, {"R2", "R3"})
    assert not any(c.pipeline == "R6" and c.segment == {"R2", "R3"}
                   for c in prefix_candidates(six, orders))
    c = global_candidate(six, orders, "R6", 1, 2, extra=["R1"])
    assert (c.kind, c.segment, c.extra, c.key) == (
        "global", frozenset({"R2", "R3"}), frozenset({"R1"}), A("R2"))
    assert c.name == "C[R6: (R2⋈R3)⋈R1 | key R2.A]"
    with pytest.raises(ValueError, match="prefix invariant"):
        global_candidate(six, orders, "R6", 1, 2, extra=["R4"])
    # The default Y is every relation not in X: then X ∪ Y is all six, always valid.
    assert global_candidate(six, orders, "R6", 1, 2).extra == frozenset({"R1", "R4", "R5", "R6"})


def test_section_6_quota(six):
    p = len(prefix_candidates(six, FIG5))
    assert p == 10
    assert global_candidates(six, FIG5, m=p) == [] and global_candidates(six, FIG5, m=3) == []
    # All but one relation first: ΔR1..ΔR5's whole pipelines (ΔR6's, R1..R5, is a prefix
    # candidate already); then all but two, pipelines in FROM order, then start.
    got = global_candidates(six, FIG5, m=p + 6)
    assert [(c.pipeline, c.start, c.end) for c in got] == [
        ("R1", 1, 5), ("R2", 1, 5), ("R3", 1, 5), ("R4", 1, 5), ("R5", 1, 5), ("R1", 1, 4)]
    for c in got:
        assert c.kind == "global" and c.extra == frozenset(SIX) - c.segment
    assert got[0].name == "C[R1: (R2⋈R3⋈R4⋈R5⋈R6)⋈R1 | key R2.A]"
    assert global_candidates(six, FIG5, m=p + 2) == got[:2]
    assert enumerate_candidates(six, FIG5, m=p + 6) == prefix_candidates(six, FIG5) + got


def test_section_7_4_three_way_global_cache():
    """§7.4: with ΔT's R⋈S cache the one §6 cache in a quota of 2 is (T⋈S)⋈R in ΔR's."""
    q = parse_query("SELECT R.A FROM R, S, T WHERE R.A = S.A AND S.B = T.B")
    orders = {"R": ["S", "T"], "S": ["R", "T"], "T": ["S", "R"]}
    [prefix] = prefix_candidates(q, orders)
    assert prefix.name == "C[T: R⋈S | key S.B]"
    [g] = global_candidates(q, orders, m=2)
    assert g.name == "C[R: (S⋈T)⋈R | key S.A]"


def test_empty_keys_and_single_operator_caches():
    """Chain R–S–T–U with ΔR's pipeline T, U, S: the T⋈U segment has the prefix property
    but no predicate with R, so it would be a cartesian product: not a candidate."""
    q = parse_query("SELECT R.a FROM R, S, T, U WHERE R.a = S.a AND S.b = T.b AND T.c = U.c")
    orders = {"R": ["T", "U", "S"], "S": ["R", "T", "U"], "T": ["U", "S", "R"],
              "U": ["T", "S", "R"]}
    assert prefix_property(orders, {"T", "U"})
    cands = prefix_candidates(q, orders)
    assert ("R", frozenset({"T", "U"})) not in segs(cands)
    assert ("S", frozenset({"T", "U"})) in segs(cands)
    singles = prefix_candidates(q, orders, min_relations=1)
    ones = {(c.pipeline, c.start) for c in singles if c.length == 1}
    # Every operator but ΔR's first (T: no predicate with R) is a one-operator candidate;
    # ΔR's second (U) is keyed on U.c = T.c.
    assert ones == {(p, j) for p in "RSTU" for j in (1, 2, 3)} - {("R", 1)}
    assert all(c.key for c in singles)


def test_bad_orders_rejected(six):
    with pytest.raises(ValueError, match="pipeline order for R3"):
        prefix_candidates(six, dict(FIG5, R3=["R1", "R2", "R4", "R5"]))
    with pytest.raises(ValueError, match="missing"):
        prefix_candidates(six, {k: v for k, v in FIG5.items() if k != "R2"})


# ----- the hand-computed instance on Figure 5 -----------------------------------------
def fig5_instance(six):
    """Every operator costs d·c = 1 (30 operators). Groups (benefit per cache; L = cost):
        R1R2   in ΔR3, ΔR4, ΔR6   benefit 1.5 each, L = 3
        R1R2R3 in ΔR4, ΔR5        benefit 2.5 each, L = 2
        R4R5   in ΔR1, ΔR2, ΔR3, ΔR6  benefit 1.2 each, L = 4
        R1..R5 in ΔR6             benefit 3.6,      L = 1
    Conflicts: ΔR4 holds R1R2 ⊂ R1R2R3; ΔR6 holds R1R2, R4R5 ⊂ R1..R5. By hand:
      with R1R2R3 in ΔR4 and ΔR5 (+5 − 2 = 3): R1..R5 in ΔR6 (+2.6) leaves R1R2 only ΔR3
        (1.5 − 3 < 0) and R4R5 only ΔR1..ΔR3 (3.6 − 4 < 0): 5.6; without R1..R5, R1R2 in
        ΔR3, ΔR6 (3 − 3 = 0) and R4R5 in all four (4.8 − 4 = 0.8): 3.8;
      with R1R2 in ΔR4, R1R2R3 only in ΔR5 (+0.5): R1..R5 (+2.6) + R1R2 in ΔR3, ΔR4 (0):
        3.1; or R1R2 in all three (1.5) + R4R5 in all four (0.8): 2.8.
    So the optimum is R1R2R3 in ΔR4, ΔR5 and R1..R5 in ΔR6: net benefit 5.6, total cost
    30 − 5.6 = 24.4."""
    cands = prefix_candidates(six, FIG5)
    table = {frozenset({"R1", "R2"}): (1.5, 3.0), frozenset({"R1", "R2", "R3"}): (2.5, 2.0),
             frozenset({"R4", "R5"}): (1.2, 4.0), frozenset(SIX[:5]): (3.6, 1.0)}
    estimates = {c: Estimate(*table[c.segment]) for c in cands}
    ops = {(p, j): 1.0 for p in SIX for j in range(1, 6)}
    return cands, estimates, ops


def test_fig5_hand_computed_optimum(six):
    cands, est, ops = fig5_instance(six)
    want = {("R4", frozenset({"R1", "R2", "R3"})), ("R5", frozenset({"R1", "R2", "R3"})),
            ("R6", frozenset(SIX[:5]))}
    best = select_exhaustive(cands, est, ops)
    assert segs(best.chosen) == want
    assert best.net_benefit == pytest.approx(5.6) and best.total_cost == pytest.approx(24.4)
    # proc of the R1..R5 cache: 5 operators × 1 − 3.6.
    r6 = next(c for c in cands if c.length == 5)
    assert proc(r6, est[r6], ops) == pytest.approx(1.4)
    # Greedy: D(R1R2R3) = (2 + 0.5 + 0.5)/6 = 0.5, D(R1..R5) = (1 + 1.4)/5 = 0.48 first,
    # then R1R2R3 (0.5); then R1R2 (ΔR3 alone: 1.75) and R4R5 (ΔR1..3: 6.4/6) lose to the
    # operators (1 each): the optimum.
    greedy = select_greedy(cands, est, ops)
    assert segs(greedy.chosen) == want
    auto = select(cands, est, ops)
    assert auto.method == "greedy" and segs(auto.chosen) == want
    lp = select_lp(cands, est, ops, rng=0)
    assert lp.lower_bound <= 24.4 + 1e-9 and lp.total_cost >= 24.4 - 1e-9
    with pytest.raises(ValueError, match="shared"):
        select_tree(cands, est, ops)


def cache(pipeline, start, end, group):
    segment = frozenset(f"{group}_{t}" for t in range(end - start + 1))
    return Candidate(pipeline, start, end, segment, frozenset({ColumnRef(f"{group}_0", "k")}))


def test_greedy_pays_a_group_cost_once():
    """P0, P1 with two unit operators each; group G = {c1 in P0 (proc 0), c2 in P1 (proc
    1.6)}, L = 1. Round 1: D_G = min((1 + 0)/2, (1 + 0 + 1.6)/4) = 0.5 < 1: S = {c1}.
    Round 2: G is paid, so c2's rate is 1.6/2 = 0.8 < 1 (it would be 1.3 if L were
    charged again): c2 too. Total 0 + 1.6 + 1 = 2.6, the optimum (vs 3 with c1 alone)."""
    c1, c2 = cache("P0", 1, 2, "G"), cache("P1", 1, 2, "G")
    est = {c1: Estimate(2.0, 1.0), c2: Estimate(0.4, 1.0)}
    ops = {(p, j): 1.0 for p in ("P0", "P1") for j in (1, 2)}
    greedy = select_greedy([c1, c2], est, ops)
    assert greedy.chosen == {c1, c2} and greedy.total_cost == pytest.approx(2.6)
    assert select_exhaustive([c1, c2], est, ops).total_cost == pytest.approx(2.6)


def test_greedy_resolves_overlaps_by_size():
    """One pipeline, operators 1, 1, 10; small = 1..2 (proc 0.2, L 0.1), big = 1..3 (proc
    2, L 0.1). Greedy takes small (rate 0.15), then big for operator 3 (rate 2.1 < 10);
    they overlap and the one covering more operators stays: total 2.1 (small alone: 10.3)."""
    small, big = cache("P0", 1, 2, "S"), cache("P0", 1, 3, "B")
    est = {small: Estimate(1.8, 0.1), big: Estimate(10.0, 0.1)}
    ops = {("P0", 1): 1.0, ("P0", 2): 1.0, ("P0", 3): 10.0}
    greedy = select_greedy([small, big], est, ops)
    assert greedy.chosen == {big} and greedy.total_cost == pytest.approx(2.1)
    assert select_tree([small, big], est, ops).chosen == {big}


# ----- objectives -----------------------------------------------------------------------
def test_objectives_and_proc_identity(six):
    cands, est, ops = fig5_instance(six)
    for c in cands:
        assert proc(c, est[c], ops) == pytest.approx(c.length * 1.0 - est[c].benefit)
    both = [c for c in cands if c.segment == frozenset({"R1", "R2"})]
    assert net_benefit(both, est) == pytest.approx(3 * 1.5 - 3.0)  # L paid once
    assert total_cost(both, est, ops) == pytest.approx(30 - 1.5)
    assert total_cost([], est, ops) == 30 and net_benefit([], est) == 0
    r4 = [c for c in cands if c.pipeline == "R4"]
    assert not is_nonoverlapping(r4)
    with pytest.raises(ValueError, match="nonoverlapping"):
        total_cost(r4, est, ops)


@settings(max_examples=examples(40), deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_max_net_benefit_is_min_total_cost(seed):
    """Over all 2^m subsets: total = Σ d·c − net for every nonoverlapping subset, so the
    same subsets maximize the one and minimize the other."""
    cands, est, ops = random_instance(random.Random(seed), shared=True, max_candidates=10)
    base = math.fsum(ops.values())
    feasible = [s for r in range(len(cands) + 1) for s in itertools.combinations(cands, r)
                if is_nonoverlapping(s)]
    nets = [net_benefit(s, est) for s in feasible]
    totals = [total_cost(s, est, ops) for s in feasible]
    for n, t in zip(nets, totals, strict=True):
        assert t == pytest.approx(base - n, abs=1e-9)
    best_net, best_total = max(nets), min(totals)
    assert best_total == pytest.approx(base - best_net, abs=1e-9)
    argmax = {i for i, n in enumerate(nets) if n >= best_net - 1e-9}
    argmin = {i for i, t in enumerate(totals) if t <= best_total + 1e-9}
    assert argmax == argmin
    assert select_exhaustive(cands, est, ops).net_benefit == pytest.approx(best_net, abs=1e-9)


# ----- random instances ------------------------------------------------------------------
def _laminar(rnd: random.Random, lo: int, hi: int, out: list, outer=None) -> None:
    i = lo
    while i < hi:
        if rnd.random() < 0.7:
            e = rnd.randint(i + 1, min(hi, i + rnd.randint(1, 4)))
            if (i, e) != outer:
                out.append((i, e))
                if e - i >= 2 and rnd.random() < 0.7:
                    _laminar(rnd, i, e, out, (i, e))
            i = e + 1
        else:
            i += 1


def random_instance(rnd: random.Random, pipelines: int | None = None, shared: bool = True,
                    nested: bool = True, max_candidates: int = 14):
    """Synthetic pipelines P0.. with 2..6 operators each; per pipeline a laminar family of
    intervals of ≥ 2 operators (nested or not); with ``shared`` equal-length intervals of
    different pipelines are grouped at random (one cache per pipeline per group)."""
    pipelines = pipelines or rnd.randint(2, 5)
    ops = {(f"P{p}", j): round(rnd.uniform(0.1, 10.0), 3)
           for p in range(pipelines) for j in range(1, rnd.randint(2, 7) + 1)}
    intervals = []
    for p in range(pipelines):
        n = max(j for q, j in ops if q == f"P{p}")
        found: list = []
        if nested:
            _laminar(rnd, 1, n, found)
        else:
            i = 1
            while i < n:
                if rnd.random() < 0.6:
                    e = rnd.randint(i + 1, n)
                    found.append((i, e))
                    i = e + 1
                else:
                    i += 1
        intervals += [(f"P{p}", s, e) for s, e in found]
    rnd.shuffle(intervals)
    intervals = intervals[:max_candidates]
    groups: list[list] = []
    for iv in intervals:
        options = [g for g in groups if g[0][2] - g[0][1] == iv[2] - iv[1]
                   and all(m[0] != iv[0] for m in g)]
        if shared and options and rnd.random() < 0.75:
            rnd.choice(options).append(iv)
        else:
            groups.append([iv])
    cands, est = [], {}
    for gid, members in enumerate(groups):
        size = members[0][2] - members[0][1] + 1
        segment = frozenset(f"G{gid}_{t}" for t in range(size))
        key = frozenset({ColumnRef(f"G{gid}_0", "k")})
        work = [math.fsum(ops[(p, j)] for j in range(s, e + 1)) for p, s, e in members]
        cost = round(rnd.uniform(0.0, 0.6) * sum(work), 3)
        for (p, s, e), w in zip(members, work, strict=True):
            c = Candidate(p, s, e, segment, key)
            cands.append(c)
            est[c] = Estimate(benefit=round(rnd.uniform(-0.2, 1.0) * w, 3), cost=cost)
    return cands, est, ops


def query_instance(rnd: random.Random, n: int):
    """An n-way equijoin on A with random pipeline orders: real candidates and sharing."""
    names = [f"R{i}" for i in range(1, n + 1)]
    q = equijoin(names)
    orders = {a: rnd.sample([b for b in names if b != a], n - 1) for a in names}
    cands = prefix_candidates(q, orders)
    ops = {(a, j): round(rnd.uniform(0.1, 10.0), 3) for a in names for j in range(1, n)}
    est = {}
    for members in shared_groups(cands).values():
        work = [math.fsum(ops[o] for o in c.operators) for c in members]
        cost = round(rnd.uniform(0.0, 0.6) * sum(work), 3)
        for c, w in zip(members, work, strict=True):
            est[c] = Estimate(round(rnd.uniform(-0.2, 1.0) * w, 3), cost)
    return cands, est, ops


@settings(max_examples=examples(80), deadline=None)
@given(seed=st.integers(0, 2**32 - 1), pipelines=st.sampled_from([1, 1, 2, 3, 4]))
def test_tree_equals_exhaustive_without_sharing(seed, pipelines):
    cands, est, ops = random_instance(random.Random(seed), pipelines, shared=False)
    tree, best = select_tree(cands, est, ops), select_exhaustive(cands, est, ops)
    assert is_nonoverlapping(tree.chosen)
    assert tree.net_benefit == pytest.approx(best.net_benefit, abs=1e-9)
    assert tree.total_cost == pytest.approx(best.total_cost, abs=1e-9)
    assert select(cands, est, ops).method == "tree"


@settings(max_examples=examples(40), deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.sampled_from([4, 5, 6]))
def test_tree_equals_exhaustive_on_one_real_pipeline(seed, n):
    rnd = random.Random(seed)
    cands, est, ops = query_instance(rnd, n)
    pipe = f"R{rnd.randint(1, n)}"
    mine = [c for c in cands if c.pipeline == pipe]
    tree, best = select_tree(mine, est, ops), select_exhaustive(mine, est, ops)
    assert tree.net_benefit == pytest.approx(best.net_benefit, abs=1e-9)


def check_approximations(cands, est, ops, seed):
    best = select_exhaustive(cands, est, ops)
    greedy = select_greedy(cands, est, ops)
    lp = select_lp(cands, est, ops, rng=seed)
    for s in (best, greedy, lp):
        assert is_nonoverlapping(s.chosen) and s.chosen <= set(cands)
        assert s.total_cost == pytest.approx(total_cost(s.chosen, est, ops), abs=1e-9)
        assert s.net_benefit == pytest.approx(math.fsum(ops.values()) - s.total_cost, abs=1e-6)
    assert lp.lower_bound <= best.total_cost + 1e-6
    assert best.total_cost <= greedy.total_cost + 1e-9
    assert best.total_cost <= lp.total_cost + 1e-9
    if lp.integral:
        assert lp.total_cost == pytest.approx(best.total_cost, abs=1e-6)


@settings(max_examples=examples(80), deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_greedy_and_lp_bounds_synthetic(seed):
    check_approximations(*random_instance(random.Random(seed), shared=True), seed)


@settings(max_examples=examples(30), deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.sampled_from([4, 5]))
def test_greedy_and_lp_bounds_real_plans(seed, n):
    check_approximations(*query_instance(random.Random(seed), n), seed)


# ----- the LP's integral special cases ---------------------------------------------------
@settings(max_examples=examples(60), deadline=None)
@given(seed=st.integers(0, 2**32 - 1), shared=st.booleans())
def test_lp_integral_special_cases(seed, shared):
    """Integral and optimal (a) without sharing, any nesting (laminar coverage is totally
    unimodular), (b) with sharing when every operator is in at most one cache."""
    cands, est, ops = random_instance(random.Random(seed), shared=shared, nested=not shared)
    cover = Counter(op for c in cands for op in c.operators)
    assert shared or all(len(m) == 1 for m in shared_groups(cands).values())
    assert not shared or max(cover.values(), default=0) <= 1
    relax = solve_relaxation(cands, est, ops)
    assert relax.integral
    lp, best = select_lp(cands, est, ops, rng=seed), select_exhaustive(cands, est, ops)
    assert lp.integral and lp.total_cost == pytest.approx(best.total_cost, abs=1e-6)
    assert relax.value == pytest.approx(best.total_cost, abs=1e-6)


def test_lp_two_caches_per_operator_can_be_fractional():
    """Appendix B claims an integral LP optimum when every operator is in at most two
    non-zero-length caches. Not so with sharing: a 7-way equijoin whose ΔR5, ΔR6, ΔR7
    pipelines each hold two of the nested caches R1R2 ⊂ R1R2R3 ⊂ R1..R4 (an odd cycle of
    groups) has the fractional optimum x = z = 1/2 below the integral optimum."""
    names = [f"R{i}" for i in range(1, 8)]
    q = equijoin(names)
    orders = {r: [x for x in names[:4] if x != r] + ["R7", "R5", "R6"] for r in names[:4]}
    orders |= {"R5": ["R1", "R3", "R2", "R4", "R6", "R7"],   # R1R2R3, R1..R4
               "R6": ["R3", "R4", "R1", "R2", "R5", "R7"],   # R1R2 (3..4), R1..R4
               "R7": ["R1", "R2", "R3", "R5", "R4", "R6"]}   # R1R2, R1R2R3
    cands = prefix_candidates(q, orders)
    assert max(Counter(op for c in cands for op in c.operators).values()) == 2
    ops = {(p, j): 1.0 for p in names for j in range(1, 7)}
    for op in [("R7", 1), ("R7", 2), ("R5", 1), ("R5", 2), ("R5", 3), ("R6", 3), ("R6", 4)]:
        ops[op] = 10.0   # covered by both caches of its pipeline
    for op in [("R7", 3), ("R5", 4), ("R6", 1), ("R6", 2)]:
        ops[op] = 0.01   # covered by the larger cache only
    # Caches in ΔR5..ΔR7 save all their work (proc 0); the others save nothing; L = 1.
    est = {c: Estimate(math.fsum(ops[o] for o in c.operators)
                       if c.pipeline in ("R5", "R6", "R7") else 0.0, 1.0) for c in cands}
    relax = solve_relaxation(cands, est, ops)
    assert not relax.integral
    halves = [v for c, v in relax.x.items() if c.pipeline in ("R5", "R6", "R7")]
    assert halves == pytest.approx([0.5] * 6)
    best = select_exhaustive(cands, est, ops)
    # Fractional: the other 42 − 4 − 7 = 31 unit operators + 1.5 (three L's at ½) +
    # 4 × 0.01 / 2; integral: two groups are needed (a vertex cover of the triangle).
    assert relax.value == pytest.approx(31 + 1.5 + 0.02)
    assert best.total_cost == pytest.approx(33.0)
    lp = select_lp(cands, est, ops, rng=1)
    assert lp.integral is False and lp.lower_bound < best.total_cost <= lp.total_cost
    check_approximations(cands, est, ops, 1)
    # One rounding round picks only caches in the LP's support, each group all or nothing
    # (its members here share x = 1/2 and one α_r).
    support = {c for c, v in relax.x.items() if v > 1e-9}
    for seed in range(20):
        one = select_lp(cands, est, ops, rng=seed, rounds=1)
        assert one.chosen <= support and is_nonoverlapping(one.chosen)
        assert one.total_cost >= best.total_cost - 1e-9


def odd_cycle_plan():
    names = [f"R{i}" for i in range(1, 8)]
    orders = {r: [x for x in names[:4] if x != r] + ["R7", "R5", "R6"] for r in names[:4]}
    orders |= {"R5": ["R1", "R3", "R2", "R4", "R6", "R7"],
               "R6": ["R3", "R4", "R1", "R2", "R5", "R7"],
               "R7": ["R1", "R2", "R3", "R5", "R4", "R6"]}
    return names, prefix_candidates(equijoin(names), orders)


@settings(max_examples=examples(30), deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_lp_rounding_near_the_odd_cycle(seed):
    """Perturbed costs around the fractional instance above: the rounding path runs."""
    rnd = random.Random(seed)
    names, cands = odd_cycle_plan()
    ops = {(p, j): rnd.uniform(0.5, 1.5) for p in names for j in range(1, 7)}
    for op in [("R7", 1), ("R7", 2), ("R5", 1), ("R5", 2), ("R5", 3), ("R6", 3), ("R6", 4)]:
        ops[op] = rnd.uniform(5, 15)
    for op in [("R7", 3), ("R5", 4), ("R6", 1), ("R6", 2)]:
        ops[op] = rnd.uniform(0, 0.1)
    lead = {g: rnd.uniform(0.5, 1.5) for g in shared_groups(cands)}
    est = {c: Estimate(math.fsum(ops[o] for o in c.operators) * rnd.uniform(0.9, 1.0)
                       if c.pipeline in ("R5", "R6", "R7") else 0.0, lead[c.group])
           for c in cands}
    check_approximations(cands, est, ops, seed)


# ----- dispatch and errors -----------------------------------------------------------------
def test_select_dispatch(six):
    cands, est, ops = fig5_instance(six)
    assert select(cands, est, ops).method == "greedy"
    assert select(cands, est, ops, method="exhaustive").method == "exhaustive"
    assert select(cands, est, ops, method="lp", rng=3).method == "lp"
    alone = [c for c in cands if c.pipeline == "R6"]
    assert select(alone, est, ops).method == "tree"
    p = len(cands)
    extra = global_candidates(six, FIG5, m=p + 2)
    est2 = dict(est) | {c: Estimate(0.5, 0.1) for c in extra}
    out = select(cands + extra, est2, ops)
    assert out.method == "exhaustive"
    assert out.net_benefit == pytest.approx(select_exhaustive(cands + extra, est2, ops).net_benefit)
    with pytest.raises(ValueError, match="unknown cache selection method"):
        select(cands, est, ops, method="best")


def test_errors(six):
    cands, est, ops = fig5_instance(six)
    with pytest.raises(ValueError, match="no estimate"):
        select_greedy(cands, {c: e for c, e in est.items() if c.pipeline != "R6"}, ops)
    with pytest.raises(ValueError, match="operator_costs has no entry"):
        select_tree(cands[:1], est, {})
    shared = [c for c in cands if c.segment == frozenset({"R1", "R2"})]
    bad = dict(est) | {shared[0]: Estimate(1.5, 2.0)}
    with pytest.raises(ValueError, match="different costs"):
        select_exhaustive(cands, bad, ops)
    with pytest.raises(ValueError, match="negative"):
        Estimate(1.0, -1.0)
    with pytest.raises(ValueError, match="relations"):
        Candidate("R1", 1, 3, frozenset({"R2"}), A("R2"))
    # Overlapping without nesting (§6 caches can): not a containment forest.
    x = global_candidate(six, FIG5, "R1", 2, 3)
    y = global_candidate(six, FIG5, "R1", 3, 5)
    both = {x: Estimate(1, 0), y: Estimate(1, 0)}
    with pytest.raises(ValueError, match="overlap without nesting"):
        select_tree([x, y], both, ops)
    assert select_exhaustive([x, y], both, ops).net_benefit == 1


def test_exhaustive_refuses_large_m():
    rnd = random.Random(7)
    ops = {(f"P{p}", j): 1.0 for p in range(12) for j in range(1, 5)}
    cands, est = [], {}
    for p in range(12):
        for s, e in ((1, 2), (3, 4)):
            c = Candidate(f"P{p}", s, e, frozenset({f"X{p}_{s}", f"Y{p}_{s}"}),
                          frozenset({ColumnRef(f"X{p}_{s}", "k")}))
            cands.append(c)
            est[c] = Estimate(rnd.uniform(0, 2), 0.5)
    with pytest.raises(ValueError, match="24 candidates"):
        select_exhaustive(cands, est, ops)
    # The tree algorithm handles them (no sharing): every cache with benefit > 0.5.
    tree = select_tree(cands, est, ops)
    assert tree.chosen == {c for c in cands if est[c].benefit > 0.5}
