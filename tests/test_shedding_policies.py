"""The load shedding policies of load-shedding.txt (adapt/shedding.py): Algorithms 1, 2, 4
and 5 on exact examples and by property (Algorithm 5 against ``scipy.optimize.linprog``),
and the analysis of §5.1.1 against ``scipy.integrate``."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate, optimize
from scipy.stats import truncnorm

from adaptcq.adapt.shedding import (
    basic_window_areas,
    join_direction,
    max_area,
    n_basic_windows,
    phi,
    rate_adapt,
    time_correlation,
    utility_knapsack,
)
from adaptcq.errors import OptionError
from conftest import examples

# ----- §5.1: basic windows ---------------------------------------------------------------


def test_n_basic_windows_is_one_more_than_the_ceiling():
    assert n_basic_windows(20, 1) == 21
    assert n_basic_windows(20, 0.1) == 201          # 20/0.1 is not quite 200 in floats
    assert n_basic_windows(0.6, 0.2) == 4           # 0.6/0.2 = 2.9999999999999996
    assert n_basic_windows(20, 3) == 1 + 7
    assert n_basic_windows(1, 5) == 2


@pytest.mark.parametrize("w, b", [(0, 1), (20, 0), (20, -1), (-5, 1), (math.inf, 1)])
def test_n_basic_windows_refuses_bad_sizes(w, b):
    with pytest.raises(OptionError, match="must be a finite number > 0"):
        n_basic_windows(w, b)


# ----- Algorithm 1 -----------------------------------------------------------------------


def test_rate_adapt_shrinks_by_beta_when_behind():
    # 5 s at 100 + 100 tuples/s = 1000 arrivals, 600 fetched: β = 0.6.
    r, beta = rate_adapt(0.5, (300, 300), (100.0, 100.0), 5.0, 1.2)
    assert beta == pytest.approx(0.6)
    assert r == pytest.approx(0.3)


def test_rate_adapt_boosts_when_keeping_up_and_caps_at_one():
    r, beta = rate_adapt(0.5, (500, 500), (100.0, 100.0), 5.0, 1.2)
    assert beta == pytest.approx(1.0)
    assert r == pytest.approx(0.6)
    r, beta = rate_adapt(0.9, (600, 600), (100.0, 100.0), 5.0, 1.2)  # β > 1: buffers drain
    assert beta == pytest.approx(1.2)
    assert r == 1.0


def test_rate_adapt_without_arrivals_takes_beta_one():
    assert rate_adapt(0.5, (0, 0), (0.0, 0.0), 5.0, 1.2) == (pytest.approx(0.6), 1.0)


@pytest.mark.parametrize("kwargs, name", [
    ({"r": 1.5}, "r"), ({"r": -0.1}, "r"), ({"T_r": 0}, "T_r"), ({"delta_r": 0.5}, "delta_r"),
    ({"alpha": (1, -1)}, "alpha"), ({"lam": (1.0,)}, "lam"), ({"lam": (1.0, math.nan)}, "lam"),
])
def test_rate_adapt_names_the_bad_parameter(kwargs, name):
    args = {"r": 0.5, "alpha": (1, 1), "lam": (1.0, 1.0), "T_r": 5.0, "delta_r": 1.2} | kwargs
    with pytest.raises(OptionError, match=name):
        rate_adapt(**args)


# ----- Algorithm 2 -----------------------------------------------------------------------


def test_time_correlation_normalises_and_orders_descending():
    o, s = time_correlation([2, 8, 0, 4], gamma=0.1, r=0.5, b=1.0, lam=(10.0, 20.0), T_c=5.0)
    denom = 0.1 * 0.5 * 1.0 * 10.0 * 20.0 * 5.0
    assert o == pytest.approx([2 / denom, 8 / denom, 0.0, 4 / denom])
    assert s == [1, 3, 0, 2]


def test_time_correlation_ties_go_to_the_newer_basic_window():
    _, s = time_correlation([1, 3, 1, 3, 0], 0.1, 1.0, 1.0, (1.0, 1.0), 5.0)
    assert s == [1, 3, 0, 2, 4]


def test_time_correlation_without_matches_keeps_the_previous_order():
    o, s = time_correlation([0, 0, 0], 0.1, 1.0, 1.0, (1.0, 1.0), 5.0, previous=[2, 0, 1])
    assert (o, s) == ([0.0, 0.0, 0.0], [2, 0, 1])
    o, s = time_correlation([0, 0, 0], 0.1, 1.0, 1.0, (1.0, 1.0), 5.0)
    assert (o, s) == ([0.0, 0.0, 0.0], [0, 1, 2])
    # A zero denominator (r = 0: nothing was sampled) says nothing either.
    o, s = time_correlation([1, 2, 0], 0.1, 0.0, 1.0, (1.0, 1.0), 5.0, previous=[1, 2, 0])
    assert (o, s) == ([0.0, 0.0, 0.0], [1, 2, 0])


def test_time_correlation_refuses_a_previous_order_that_is_not_a_permutation():
    with pytest.raises(OptionError, match="previous"):
        time_correlation([0, 0], 0.1, 1.0, 1.0, (1.0, 1.0), 5.0, previous=[0, 0])
    with pytest.raises(OptionError, match="o_hat"):
        time_correlation([1, -1], 0.1, 1.0, 1.0, (1.0, 1.0), 5.0)


# ----- Algorithm 4 -----------------------------------------------------------------------


def test_join_direction_examples():
    assert join_direction(0.25, (20, 20), (2.0, 1.0)) == pytest.approx((0.5, 0.0))
    assert join_direction(0.75, (20, 20), (2.0, 1.0)) == pytest.approx((1.0, 0.5))
    assert join_direction(0.25, (20, 20), (1.0, 2.0)) == pytest.approx((0.0, 0.5))
    assert join_direction(0.75, (20, 20), (1.0, 2.0)) == pytest.approx((0.5, 1.0))
    assert join_direction(1.0, (10, 30), (0.0, 5.0)) == pytest.approx((1.0, 1.0))
    # The paper's printed line 7 would give r·(w1+w2)/w1 − r1·w1/w2 = 0.4·40/10 − 1·10/30.
    r1, r2 = join_direction(0.4, (10, 30), (5.0, 0.0))
    assert (r1, r2) == pytest.approx((1.0, (0.4 * 40 - 10) / 30))


@settings(max_examples=examples(200), deadline=None)
@given(r=st.floats(0, 1), w1=st.floats(1e-3, 100), w2=st.floats(1e-3, 100),
       o1=st.floats(0, 1e6), o2=st.floats(0, 1e6))
def test_join_direction_keeps_the_constraint(r, w1, w2, o1, o2):
    r1, r2 = join_direction(r, (w1, w2), (o1, o2))
    assert 0 <= r1 <= 1 and 0 <= r2 <= 1
    assert r1 * w1 + r2 * w2 == pytest.approx(r * (w1 + w2), rel=1e-9, abs=1e-9)
    # The more valuable window gets the larger fraction (ties: W_1).
    first, second = (r1, r2) if o1 >= o2 else (r2, r1)
    assert first >= second - 1e-12  # (subnormal r: rounding)
    if 1e-9 < r < 1 - 1e-9:
        assert first > second


# ----- Algorithm 5 -----------------------------------------------------------------------


def _knapsack_value(r_iz, lam, o, s, u, omega, b):
    """Value and volume of the item choice that r_{i,z} stands for: r_{i,z}·n_i items of
    (i, z) in s_i order, the last one fractionally."""
    value = volume = 0.0
    for (i, z), rv in r_iz.items():
        n = len(o[i])
        tot = sum(o[i])
        left = rv * n
        for j in range(n):
            x = min(1.0, max(0.0, left - j))
            p = o[i][s[i][j]] / tot if tot > 0 else 1 / n
            vol = lam[0] * lam[1] * omega[(1 - i, z)] * b
            value += x * vol * u[(i, z)] * n * p
            volume += x * vol
    return value, volume


def _knapsack_lp(r, lam, w, b, o, u, omega):
    """The fractional knapsack of §5.3 by ``linprog``: items I_{i,j,z}, volume
    λ1λ2·ω_{ī,z}·b, value volume·v_{i,j,z}, capacity λ1λ2·r·(w1+w2)."""
    vols, vals = [], []
    for (i, z), util in u.items():
        n, tot = len(o[i]), sum(o[i])
        for j in range(n):
            p = o[i][j] / tot if tot > 0 else 1 / n
            vol = lam[0] * lam[1] * omega[(1 - i, z)] * b
            vols.append(vol)
            vals.append(vol * util * n * p)
    res = optimize.linprog(-np.array(vals), A_ub=[vols],
                           b_ub=[lam[0] * lam[1] * r * (w[0] + w[1])],
                           bounds=[(0, 1)] * len(vals), method="highs")
    assert res.status == 0
    return -res.fun


@st.composite
def knapsack_instances(draw):
    types = draw(st.integers(1, 3))
    b = draw(st.floats(0.5, 5))
    w = (draw(st.floats(1, 20)), draw(st.floats(1, 20)))
    o = [draw(st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.0]) | st.floats(0, 10),
                       min_size=n_basic_windows(wi, b), max_size=n_basic_windows(wi, b)))
         for wi in w]
    s = [list(np.argsort(-np.array(oi), kind="stable")) for oi in o]
    zs = [f"t{k}" for k in range(types)]
    u = {(i, z): draw(st.floats(0, 10)) for i in (0, 1) for z in zs}
    omega = {}
    for i in (0, 1):
        raw = [draw(st.floats(0, 1)) for _ in zs]
        tot = sum(raw) or 1.0
        omega.update({(i, z): x / tot for z, x in zip(zs, raw, strict=True)})
    lam = (draw(st.floats(0.5, 50)), draw(st.floats(0.5, 50)))
    return draw(st.floats(0, 1)), lam, w, b, o, s, u, omega


@settings(max_examples=examples(60), deadline=None)
@given(knapsack_instances())
def test_utility_knapsack_equals_linprog(instance):
    r, lam, w, b, o, s, u, omega = instance
    r_iz = utility_knapsack(r, lam, w, b, o, s, u, omega)
    assert set(r_iz) == set(u)
    assert all(0 <= x <= 1 for x in r_iz.values())
    value, volume = _knapsack_value(r_iz, lam, o, s, u, omega, b)
    capacity = lam[0] * lam[1] * r * (w[0] + w[1])
    assert volume <= capacity * (1 + 1e-9) + 1e-9
    best = _knapsack_lp(r, lam, w, b, o, u, omega)
    assert value == pytest.approx(best, rel=1e-6, abs=1e-9 * max(1.0, capacity))


def test_utility_knapsack_example_and_typo_fix():
    # One type per stream, W_1 and W_2 of two basic windows; type "x" is frequent in S_2
    # (the stream probing W_1) and rare in S_1: its volume against W_1 uses ω_{2,x}.
    o = [[3.0, 1.0], [1.0, 1.0]]
    s = [[0, 1], [0, 1]]
    u = {(0, "x"): 1.0, (1, "x"): 1.0}
    omega = {(0, "x"): 1.0, (1, "x"): 1.0}
    # Capacity r·(w1+w2) = 0.5·4 = 2 (λ1λ2 = 1), each item volume ω·b = 1: two items,
    # W_1's first (v = 1.5), then W_2's first (v = 1, before W_1's second: v = 0.5).
    got = utility_knapsack(0.5, (1.0, 1.0), (2.0, 2.0), 1.0, o, s, u, omega)
    assert got == pytest.approx({(0, "x"): 0.5, (1, "x"): 0.5})
    # Half an item left: W_2's first basic window half done.
    got = utility_knapsack(0.375, (1.0, 1.0), (2.0, 2.0), 1.0, o, s, u, omega)
    assert got == pytest.approx({(0, "x"): 0.5, (1, "x"): 0.25})
    # ω_{ī,z}: S_2 tuples of type y are what probes W_1; with ω_{2,y} = 0 they are free.
    u2 = {(0, "y"): 1.0, (1, "y"): 1.0}
    omega2 = {(0, "y"): 1.0, (1, "y"): 0.0}
    got = utility_knapsack(0.0, (1.0, 1.0), (2.0, 2.0), 1.0, o, s, u2, omega2)
    assert got == pytest.approx({(0, "y"): 1.0, (1, "y"): 0.0})


def test_utility_knapsack_without_statistics_spreads_evenly():
    got = utility_knapsack(0.5, (2.0, 2.0), (2.0, 2.0), 1.0, [[0, 0], [0, 0]],
                           [[0, 1], [0, 1]], {(0, "a"): 2.0, (1, "a"): 1.0},
                           {(0, "a"): 1.0, (1, "a"): 1.0})
    assert got == pytest.approx({(0, "a"): 1.0, (1, "a"): 0.0})


def test_utility_knapsack_needs_the_probing_streams_frequency():
    with pytest.raises(OptionError, match=r"omega\[\(1, 'a'\)\]"):
        utility_knapsack(0.5, (1.0, 1.0), (2.0, 2.0), 1.0, [[1], [1]], [[0], [0]],
                         {(0, "a"): 1.0}, {(0, "a"): 1.0})


# ----- §5.1.1: ϕ ---------------------------------------------------------------------------

W = 20.0


def _uniform():
    return (lambda y: 1.0 / W), (lambda y: np.clip(np.asarray(y, dtype=float) / W, 0, 1))


def _triangular(peak=15.0):
    def pdf(y):
        return 2 * y / (W * peak) if y <= peak else 2 * (W - y) / (W * (W - peak))

    def cdf(y):
        y = np.clip(np.asarray(y, dtype=float), 0, W)
        return np.where(y <= peak, y * y / (W * peak),
                        1 - (W - y) ** 2 / (W * (W - peak)))
    return pdf, cdf


def _normal(mu=15.0, sd=1.5):
    d = truncnorm((0 - mu) / sd, (W - mu) / sd, loc=mu, scale=sd)
    return d.pdf, d.cdf


@pytest.mark.parametrize("dist", [_uniform, _triangular, _normal])
@pytest.mark.parametrize("b", [3.0, 7.0])
def test_basic_window_areas_match_dblquad(dist, b):
    pdf, cdf = dist()
    areas = basic_window_areas(cdf, W, b)
    assert len(areas) == n_basic_windows(W, b)
    for j, p in enumerate(areas, start=1):
        def lo(x, j=j):
            return max(0.0, x * b + (j - 2) * b)

        def hi(x, j=j):
            return max(lo(x), min(W, x * b + (j - 1) * b))
        want, _ = integrate.dblquad(lambda y, x: pdf(y), 0, 1, lo, hi, epsabs=1e-10)
        assert p == pytest.approx(want, abs=1e-4)
    # For every x the basic windows tile [0, w]: the areas sum to all of f.
    assert sum(areas) == pytest.approx(float(cdf(W) - cdf(0.0)), abs=1e-9)


def test_max_area():
    _, cdf = _uniform()
    assert max_area(cdf, W, 5.0) == pytest.approx(0.25)
    assert max_area(cdf, W, 25.0) == pytest.approx(1.0)
    _, cdf = _triangular(15.0)
    # The best interval of length a under a triangle has equal density at both ends.
    a = 4.0
    s0 = optimize.brentq(lambda s: 2 * s / (W * 15) - 2 * (W - s - a) / (W * 5), 10, 15)
    assert max_area(cdf, W, a) == pytest.approx(float(cdf(s0 + a) - cdf(s0)), abs=1e-7)


def test_phi_flat_distribution():
    _, cdf = _uniform()
    for b in (0.5, 2.0, 3.0):
        n = n_basic_windows(W, b)
        # Enough budget for every basic window: optimal.
        assert phi(cdf, W, b, n * b / W) == pytest.approx(1.0)
        assert phi(cdf, W, b, 2.0) == pytest.approx(1.0)
        # Below that, every basic window is as good as any other: optimal too, except for
        # the b/2 the paper's count misses at r' = 1 (the newest and oldest basic windows
        # hold half a basic window on average).
        assert phi(cdf, W, b, 0.3) == pytest.approx(1.0)
    assert phi(cdf, W, 2.0, 1.0) == pytest.approx(1 - 2.0 / (2 * W))


@pytest.mark.parametrize("dist", [_uniform, _triangular, _normal])
def test_phi_at_most_one(dist):
    _, cdf = dist()
    for b in (0.2, 1.0, 2.5, 10.0):
        for rp in (0.05, 0.2, 0.5, 1.0, 1.5):
            assert 0 <= phi(cdf, W, b, rp) <= 1


def test_phi_figure_5_observations():
    _, narrow = _normal(15.0, 1.5)     # the more skewed distribution
    _, wide = _normal(15.0, 5.0)
    ratios = (0.01, 0.05, 0.1, 0.2, 0.5)
    for rp in (0.1, 0.2):
        # Smaller basic windows are better when resources are low and f is skewed.
        got = [phi(narrow, W, x * W, rp) for x in ratios]
        assert all(a >= b - 1e-9 for a, b in itertools.pairwise(got))
        assert got[-1] < got[0] - 0.2
        # More skew, lower optimality for a fixed basic window size.
        for x in (0.1, 0.2, 0.5):
            assert phi(narrow, W, x * W, rp) <= phi(wide, W, x * W, rp) + 1e-9
    # Fewer resources, lower optimality for a fixed basic window size.
    for x in (0.1, 0.2):
        got = [phi(narrow, W, x * W, rp) for rp in (0.05, 0.1, 0.3, 0.6, 1.0)]
        assert all(a <= b + 1e-9 for a, b in itertools.pairwise(got))


def test_phi_refuses_bad_parameters():
    _, cdf = _uniform()
    with pytest.raises(OptionError, match="r_prime"):
        phi(cdf, W, 1.0, 0.0)
    with pytest.raises(OptionError, match="points"):
        basic_window_areas(cdf, W, 1.0, points=0)
