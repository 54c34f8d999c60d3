"""CPU load shedding by selective processing (load-shedding.txt §4.1, §5): the policies as
pure functions, and the analysis of §5.1.1.

Streams and windows are indexed i = 0, 1 (the paper's 1, 2) and ī = 1 − i is the opposite
one; basic-window positions are j = 0 .. n_i − 1 with j = 0 the newest basic window (the
paper's j = 1 .. n_i). The engine (``engine/shed_join.py``) counts, the estimators in
``stats/`` average, and these functions decide:

* :func:`n_basic_windows` — n_i = 1 + ⌈w_i/b⌉ (§5.1);
* :func:`rate_adapt` — Algorithm 1 (§4.1): the fraction parameter r from β;
* :func:`micro_batch_rate` — Algorithm 1 once per micro-batch (the Spark runtime): β from
  the batch's CPU time against its budget;
* :func:`time_correlation` — Algorithm 2 (§5.1): o_{i,j} and the priority order s_i;
* :func:`join_direction` — Algorithm 4 (§5.2): r_1, r_2 from r and the o_i;
* :func:`utility_knapsack` — Algorithm 5 (§5.3): r_{i,z} by the fractional knapsack;
* :func:`basic_window_areas`, :func:`max_area`, :func:`phi` — §5.1.1's optimality ϕ of a
  basic window size b under a load r' for a match distribution f (given by its CDF).

The paper's typos are fixed here and said so where they are: Algorithm 4 line 7 (r_2 is
divided by w_2, not w_1), Algorithm 5 lines 12 and 16 (the probing tuple's frequency
ω_{ī,z}, not ω_{i,z}). Algorithm 2 line 5 divides by the r the samples were drawn with
(``adapt.shed_control`` passes r·γ's r; docs/shedding.md says why not r_i). Bad
parameters raise :class:`~adaptcq.errors.OptionError` naming the parameter and its value.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Hashable, Mapping, Sequence

import numpy as np

from adaptcq.checks import is_int
from adaptcq.errors import OptionError

__all__ = [
    "basic_window_areas",
    "join_direction",
    "max_area",
    "micro_batch_rate",
    "n_basic_windows",
    "phi",
    "rate_adapt",
    "time_correlation",
    "utility_knapsack",
]

# A ratio w/b within this relative distance of a whole number counts as that number, so
# that 20 / 0.1 (or 0.6 / 0.2 = 2.9999999999999996) gives the basic windows one expects.
_RATIO_TOL = 1e-9


# ---------------------------------------------------------------------------------------------
# Parameter checks
# ---------------------------------------------------------------------------------------------


def _number(name: str, value, *, low: float | None = None, high: float | None = None,
            strict_low: bool = False) -> float:
    """``value`` as a finite float within the bounds, else OptionError naming ``name``."""
    ok = isinstance(value, int | float | np.integer | np.floating) and not isinstance(
        value, bool) and math.isfinite(value)
    if ok and low is not None:
        ok = value > low if strict_low else value >= low
    if ok and high is not None:
        ok = value <= high
    if not ok:
        bound = []
        if low is not None:
            bound.append(f"{'>' if strict_low else '>='} {low:g}")
        if high is not None:
            bound.append(f"<= {high:g}")
        raise OptionError(f"{name} must be a finite number {' and '.join(bound)}, "
                          f"got {value!r}")
    return float(value)


def _pair(name: str, values, *, low: float = 0.0, strict_low: bool = False) -> tuple[float,
                                                                                     float]:
    """A per-stream pair (S_1, S_2) of numbers."""
    try:
        items = list(values)
    except TypeError:
        raise OptionError(f"{name} must be a pair of numbers (one per stream), "
                          f"got {values!r}") from None
    if len(items) != 2:
        raise OptionError(f"{name} must be a pair of numbers (one per stream), got {values!r}")
    a, b = (_number(f"{name}[{k}]", v, low=low, strict_low=strict_low)
            for k, v in enumerate(items))
    return a, b


def _fractions(name: str, values) -> np.ndarray:
    """A non-empty vector of finite numbers >= 0."""
    arr = np.asarray(values, dtype=np.float64) if len(values) else np.zeros(0)
    if arr.ndim != 1 or len(arr) == 0 or not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise OptionError(f"{name} must be a non-empty list of finite numbers >= 0, "
                          f"got {list(values)!r}")
    return arr


def _order(name: str, order, n: int) -> list[int]:
    """A priority order: a permutation of the positions 0..n−1."""
    out = [int(k) for k in order]
    if sorted(out) != list(range(n)):
        raise OptionError(f"{name} must be a permutation of the positions 0..{n - 1}, "
                          f"got {list(order)!r}")
    return out


# ---------------------------------------------------------------------------------------------
# §5.1: basic windows
# ---------------------------------------------------------------------------------------------


def n_basic_windows(w: float, b: float) -> int:
    """n_i = 1 + ⌈w_i/b⌉ (§5.1): the basic windows of size b seconds that window W_i of w_i
    seconds needs — one more than w_i/b because the newest one fills up while the oldest
    one still holds unexpired tuples.

    A ratio w/b within rounding error of a whole number counts as that number.
    """
    w = _number("w (window size, seconds)", w, low=0.0, strict_low=True)
    b = _number("b (basic window size, seconds)", b, low=0.0, strict_low=True)
    q = w / b
    near = round(q)
    if abs(q - near) <= _RATIO_TOL * max(1.0, q):
        q = near
    return 1 + math.ceil(q)


# ---------------------------------------------------------------------------------------------
# §4.1: rate adaptation
# ---------------------------------------------------------------------------------------------


def rate_adapt(r: float, alpha: Sequence[int], lam: Sequence[float], T_r: float,
               delta_r: float) -> tuple[float, float]:
    """Algorithm 1 (§4.1), one step every T_r seconds: returns (new r, β).

    ``alpha`` = (α_1, α_2), the tuples fetched from S_1, S_2 since the last step; ``lam`` =
    (λ_1, λ_2), their average arrival rates since then. β = (α_1 + α_2)/((λ_1 + λ_2)·T_r) is
    the share of the arrivals the join kept up with: when β < 1 the join fell behind and r
    shrinks to β·r (comparisons dominate the cost, so the work scales with r); otherwise r
    grows optimistically by the fraction boost factor δ_r, capped at 1 (if the extra work is
    too much, the next step takes it back).

    Beyond the paper: with no arrivals (λ_1 + λ_2 = 0) there is nothing to fall behind on,
    so β is taken as 1. r = 0 is absorbing (β·0 = δ_r·0 = 0): a caller that can reach it
    (β = 0: nothing fetched in a whole period) should keep a floor of its own.
    """
    r = _number("r (fraction parameter)", r, low=0.0, high=1.0)
    a1, a2 = _pair("alpha (tuples fetched per stream)", alpha)
    l1, l2 = _pair("lam (arrival rates per stream)", lam)
    T_r = _number("T_r (rate adaptation period, seconds)", T_r, low=0.0, strict_low=True)
    delta_r = _number("delta_r (fraction boost factor)", delta_r, low=1.0)
    beta = 1.0 if l1 + l2 == 0 else (a1 + a2) / ((l1 + l2) * T_r)
    if beta < 1:
        return r * beta, beta
    return min(1.0, delta_r * r), beta


def micro_batch_rate(r: float, seconds: float, budget: float, delta_r: float
                     ) -> tuple[float, float]:
    """Algorithm 1 (§4.1) with a micro-batch as its period (beyond the paper: a Spark
    partition group, which receives its input a micro-batch at a time and has no input
    buffer to watch): returns (new r, β).

    The group spent ``seconds`` of CPU time on a micro-batch whose budget is ``budget``
    seconds (its share of the trigger interval). β = budget/seconds is the share of the
    batch it could have processed in time, Algorithm 1's (α_1 + α_2)/((λ_1 + λ_2)·T_r):
    when β < 1 the group fell behind and r shrinks to β·r; otherwise r grows by δ_r,
    capped at 1. A batch that took no measurable time gives β = 1.
    """
    r = _number("r (fraction parameter)", r, low=0.0, high=1.0)
    seconds = _number("seconds (CPU time of the micro-batch)", seconds, low=0.0)
    budget = _number("budget (seconds per micro-batch)", budget, low=0.0, strict_low=True)
    delta_r = _number("delta_r (fraction boost factor)", delta_r, low=1.0)
    beta = 1.0 if seconds <= budget else budget / seconds
    if beta < 1:
        return r * beta, beta
    return min(1.0, delta_r * r), beta


# ---------------------------------------------------------------------------------------------
# §5.1: time correlation adaptation
# ---------------------------------------------------------------------------------------------


def time_correlation(o_hat: Sequence[float], gamma: float, r: float, b: float,
                     lam: Sequence[float], T_c: float,
                     previous: Sequence[int] | None = None) -> tuple[list[float], list[int]]:
    """Algorithm 2 (§5.1) for one window W_i, every T_c seconds: returns (o_i, s_i).

    ``o_hat[j]`` = ô_{i,j}, the matches the fully processed tuples (sampled with
    probability r·γ, Algorithm 3) found in basic window j during the period. Line 5:
    o_{i,j} = ô_{i,j}/(γ·r·b·λ_1·λ_2·T_c), the expected output of comparing a new tuple with
    one tuple of B_{i,j} — γ·r·λ_ī·T_c tuples were fully processed, each against about
    λ_i·b tuples of B_{i,j}. ``r`` must be the r the samples were drawn with (the paper
    writes r_i with join direction on; docs/shedding.md says why the controller passes
    Algorithm 1's r, with which Algorithm 3 line 2 samples). s_i lists the positions in descending order
    of o (line 6), ties broken towards the newer basic window (stable on j). The caller resets
    ô to zero (lines 7-8).

    Beyond the paper: when every ô is 0 (no fully processed tuple matched in the period) or
    the denominator is 0 (r, γ or a rate is 0), the period says nothing about where the
    matches are; the paper would sort the zeros into an arbitrary order, we keep
    ``previous`` (or the newest-first order 0..n−1 when there is none) and return o = 0.
    """
    o_hat_arr = _fractions("o_hat (matches per basic window)", o_hat)
    n = len(o_hat_arr)
    gamma = _number("gamma (sampling probability)", gamma, low=0.0, high=1.0)
    r = _number("r (fraction parameter)", r, low=0.0, high=1.0)
    b = _number("b (basic window size, seconds)", b, low=0.0, strict_low=True)
    l1, l2 = _pair("lam (arrival rates per stream)", lam)
    T_c = _number("T_c (time correlation period, seconds)", T_c, low=0.0, strict_low=True)
    keep = list(range(n)) if previous is None else _order("previous", previous, n)
    denominator = gamma * r * b * l1 * l2 * T_c
    if denominator == 0 or not np.any(o_hat_arr > 0):
        return [0.0] * n, keep
    o = o_hat_arr / denominator
    s = np.argsort(-o, kind="stable")  # stable: equal o keep the newer basic window first
    return o.tolist(), [int(k) for k in s]


# ---------------------------------------------------------------------------------------------
# §5.2: join direction adaptation
# ---------------------------------------------------------------------------------------------


def join_direction(r: float, w: Sequence[float], o: Sequence[float]) -> tuple[float, float]:
    """Algorithm 4 (§5.2), after each rate adaptation step: returns (r_1, r_2).

    ``o`` = (o_1, o_2), o_i = (1/n_i)·Σ_j o_{i,j}, the expected output of comparing a new
    tuple with a tuple of W_i. The comparisons per unit time must stay those of a single r:
    r·(w_1 + w_2) = r_1·w_1 + r_2·w_2. The more valuable window (o_1 ≥ o_2: W_1, ties to
    W_1) gets as much as it can: r_1 = min(1, r·(w_1+w_2)/w_1) (line 5); otherwise W_1 gets
    what W_2 leaves over, r_1 = max(0, r·(w_1+w_2)/w_1 − w_2/w_1) (line 6). Then line 7,
    fixed: r_2 = r·(w_1+w_2)/w_2 − r_1·w_1/w_2 — the paper prints "r·(w_1+w_2)/w_1 −
    r_1·w_1/w_2", which breaks the constraint. r_2 is clamped into [0, 1] only against
    floating-point error.
    """
    r = _number("r (fraction parameter)", r, low=0.0, high=1.0)
    w1, w2 = _pair("w (window sizes, seconds)", w, strict_low=True)
    o1, o2 = _pair("o (expected output per window)", o)
    share = r * (w1 + w2) / w1
    if o1 >= o2:
        r1 = _snap(min(1.0, share))
        return r1, _snap(r * (w1 + w2) / w2 - r1 * w1 / w2)  # line 7, fixed
    # Line 6, and line 7 written for this branch: W_2 gets min(1, r·(w_1+w_2)/w_2), the
    # same value without the cancellation of two large terms when w_2 ≪ w_1.
    return _snap(max(0.0, share - w2 / w1)), _snap(min(1.0, r * (w1 + w2) / w2))


def _snap(x: float, eps: float = 1e-12) -> float:
    """Clamp into [0, 1], and onto 1 within floating-point error of it (so that a window
    given everything gets exactly 1)."""
    x = min(1.0, max(0.0, x))
    return 1.0 if x > 1.0 - eps else x


# ---------------------------------------------------------------------------------------------
# §5.3: utility-based load shedding
# ---------------------------------------------------------------------------------------------


def utility_knapsack(r: float, lam: Sequence[float], w: Sequence[float], b: float,
                     o: Sequence[Sequence[float]], s: Sequence[Sequence[int]],
                     u: Mapping[tuple[int, Hashable], float],
                     omega: Mapping[tuple[int, Hashable], float]
                     ) -> dict[tuple[int, Hashable], float]:
    """Algorithm 5 (§5.3), replacing Algorithm 4: returns r_{i,z} for every (i, z) in ``u``.

    The fractional knapsack of §5.3: item I_{i,j,z} — comparing the incoming type-z tuples
    of S_ī with basic window B_{i,s_i^j} — has volume λ_1·λ_2·ω_{ī,z}·b (comparisons per unit
    time) and value per volume v_{i,j,z} = u_{i,z}·n_i·o_{i,s_i^j}/Σ_k o_{i,k} (the paper's
    estimate of u_{i,z}·n_i·p_{i,s_i^j}); the capacity is a = λ_1·λ_2·r·(w_1 + w_2). Greedy
    by value per volume is optimal; since s_i orders o_i descending (Algorithm 2), the items
    of one (i, z) come in s_i order, so a heap of the 2|Z| heads suffices: pop the best, take
    it whole (r_{i,z} += 1/n_i) while capacity is left, take the fraction r_e = 1 +
    a/(λ_1·λ_2·ω_{ī,z}·b) of the one that overflows and stop; push the next item of the same
    (i, z).

    ``o[i]`` holds the o_{i,j} (n_i = len(o[i])), ``s[i]`` the priority order (positions),
    ``u[(i, z)]`` = u_{i,z}, ``omega[(i, z)]`` = ω_{i,z} (frequency of type z in S_i). Fixed
    typo: lines 12 and 16 use ω_{ī,z}, the frequency of type z in the *probing* stream S_ī,
    as the item's volume says (the paper prints ω_{i,z}). Beyond the paper: when Σ_k o_{i,k}
    = 0 (nothing learnt about W_i), every basic window gets p = 1/n_i, i.e. v = u_{i,z}; an
    item of volume 0 (ω_{ī,z} = 0: no such tuple probes W_i) costs nothing and is taken
    whole, before the others. λ_1·λ_2 scales every
    volume and the capacity alike, so it cancels (and λ = 0 is harmless). Ties in v go to
    the lower i, then the earlier z in ``u``, then the earlier position in s_i. Results are
    clamped to [0, 1] against floating-point error.
    """
    r = _number("r (fraction parameter)", r, low=0.0, high=1.0)
    _pair("lam (arrival rates per stream)", lam)
    w1, w2 = _pair("w (window sizes, seconds)", w, strict_low=True)
    b = _number("b (basic window size, seconds)", b, low=0.0, strict_low=True)
    if len(o) != 2 or len(s) != 2:
        raise OptionError(f"o and s must hold one entry per window (two), got {len(o)} "
                          f"and {len(s)}")
    os_ = [_fractions(f"o[{i}] (expected output per basic window)", o[i]) for i in (0, 1)]
    ss = [_order(f"s[{i}] (priority order)", s[i], len(os_[i])) for i in (0, 1)]
    n = [len(os_[0]), len(os_[1])]
    z_rank: dict[Hashable, int] = {}
    for key in u:
        if not (isinstance(key, tuple) and len(key) == 2 and key[0] in (0, 1)):
            raise OptionError(f"u keys must be (i, z) with i in (0, 1), got {key!r}")
        z_rank.setdefault(key[1], len(z_rank))
    util = {k: _number(f"u[{k!r}] (expected utility)", v, low=0.0) for k, v in u.items()}
    vol = {}
    for (i, z) in util:
        if (1 - i, z) not in omega:
            raise OptionError(f"omega needs the frequency of type {z!r} in stream {1 - i} "
                              f"(omega[({1 - i}, {z!r})]) for u[({i}, {z!r})]")
        # Volumes and capacity divided by λ_1·λ_2 (it cancels).
        vol[(i, z)] = _number(f"omega[({1 - i}, {z!r})] (type frequency)",
                              omega[(1 - i, z)], low=0.0) * b
    total = [float(x.sum()) for x in os_]

    def value(i: int, z: Hashable, j: int) -> float:
        if vol[(i, z)] == 0:  # free: first, whatever its value (no such tuple probes)
            return math.inf
        p = os_[i][ss[i][j]] / total[i] if total[i] > 0 else 1.0 / n[i]
        return util[(i, z)] * n[i] * p

    out = dict.fromkeys(util, 0.0)
    heap = [(-value(i, z, 0), i, z_rank[z], 0, z) for (i, z) in util if n[i] > 0]
    heapq.heapify(heap)
    a = r * (w1 + w2)
    while heap:
        _, i, zr, j, z = heapq.heappop(heap)
        key = (i, z)
        a -= vol[key]
        if a > 0 or vol[key] == 0:
            out[key] += 1.0 / n[i]
        else:
            r_e = 1.0 + a / vol[key]
            out[key] += max(0.0, r_e) / n[i]
            break
        if j + 1 < n[i]:
            heapq.heappush(heap, (-value(i, z, j + 1), i, zr, j + 1, z))
    return {k: min(1.0, max(0.0, v)) for k, v in out.items()}


# ---------------------------------------------------------------------------------------------
# §5.1.1: impact of the basic window size
# ---------------------------------------------------------------------------------------------


def _cdf_at(cdf: Callable[[float], float], xs: np.ndarray) -> np.ndarray:
    """F at every point of ``xs``: one vectorised call when ``cdf`` takes arrays, else one
    call per point."""
    try:
        out = np.asarray(cdf(xs), dtype=np.float64)
    except Exception:  # noqa: BLE001 - a scalar-only callable: fall back to one call each
        out = None
    if out is not None and out.shape == xs.shape:
        return out
    return np.fromiter((float(cdf(float(x))) for x in xs.ravel()), dtype=np.float64,
                       count=xs.size).reshape(xs.shape)


def basic_window_areas(cdf: Callable[[float], float], w: float, b: float,
                       points: int = 64) -> list[float]:
    """p_{i,j} of §5.1.1 for j = 1..n_i (returned 0-based, newest first): the average area
    under the match distribution f_i that basic window B_{i,j} covers as the first basic
    window fills up (x ∈ [0, 1] of it full):

        p_{i,j} = ∫_{x=0}^{1} ∫_{max(0, x·b+(j−2)·b)}^{min(w_i, x·b+(j−1)·b)} f_i(y) dy dx.

    The inner integral is F(upper) − F(lower) with ``cdf`` = F (F(y) = ∫_0^y f); the outer is
    Gauss–Legendre with ``points`` nodes on each piece of [0, 1] between the x where a
    bound meets 0 or w_i (the integrand has kinks there, which would slow a single rule
    down). The areas sum to F(w_i) − F(0): for every x the n_i intervals tile [0, w_i].
    """
    w = _number("w (window size, seconds)", w, low=0.0, strict_low=True)
    b = _number("b (basic window size, seconds)", b, low=0.0, strict_low=True)
    if not is_int(points) or points < 1:
        raise OptionError(f"points (Gauss-Legendre nodes) must be a whole number >= 1, "
                          f"got {points!r}")
    n = n_basic_windows(w, b)
    nodes, weights = np.polynomial.legendre.leggauss(points)
    areas = []
    for j in range(1, n + 1):
        # Kinks of the integrand in x: where x·b + (j−1)·b = w or x·b + (j−2)·b hits 0 or w.
        cuts = {0.0, 1.0}
        for c in ((w - (j - 1) * b) / b, -(j - 2), (w - (j - 2) * b) / b):
            if 0.0 < c < 1.0:
                cuts.add(float(c))
        cuts_sorted = sorted(cuts)
        total = 0.0
        for lo, hi in itertools.pairwise(cuts_sorted):
            x = lo + (hi - lo) * (nodes + 1) / 2
            upper = np.minimum(w, x * b + (j - 1) * b)
            lower = np.maximum(0.0, x * b + (j - 2) * b)
            inner = np.where(upper > lower,
                             _cdf_at(cdf, np.clip(upper, 0.0, w))
                             - _cdf_at(cdf, np.clip(lower, 0.0, w)), 0.0)
            total += (hi - lo) / 2 * float(np.dot(weights, inner))
        areas.append(max(0.0, total))
    return areas


def max_area(cdf: Callable[[float], float], w: float, a: float, grid: int = 2000) -> float:
    """g(f_i, a) of §5.1.1: the largest area under f_i over an interval of length ``a``
    within [0, w_i] (a ≥ w_i: F(w_i) − F(0), all of it).

    Numerically: F(s + a) − F(s) at ``grid`` + 1 evenly spaced starts s ∈ [0, w_i − a], then
    once more on a finer grid around the best start (a peak between two grid points is
    found to within 1/grid² of the range).
    """
    w = _number("w (window size, seconds)", w, low=0.0, strict_low=True)
    a = _number("a (interval length, seconds)", a, low=0.0)
    if not is_int(grid) or grid < 1:
        raise OptionError(f"grid (start points) must be a whole number >= 1, got {grid!r}")
    if a >= w:
        f0, fw = _cdf_at(cdf, np.array([0.0, w]))
        return float(fw - f0)
    if a == 0:
        return 0.0
    span = w - a
    starts = np.linspace(0.0, span, grid + 1)
    areas = _cdf_at(cdf, starts + a) - _cdf_at(cdf, starts)
    k = int(np.argmax(areas))
    step = span / grid
    fine = np.clip(np.linspace(starts[k] - step, starts[k] + step, 201), 0.0, span)
    best = max(float(areas[k]),
               float(np.max(_cdf_at(cdf, fine + a) - _cdf_at(cdf, fine))))
    return max(0.0, best)


def phi(cdf: Callable[[float], float], w: float, b: float, r_prime: float) -> float:
    """ϕ of §5.1.1: how close to optimal selective processing with basic windows of b
    seconds is when a fraction r' of the window can be processed (r' > 1: resources to
    spare).

    c_e = min(n_i, ⌊r'·w_i/b⌋) basic windows are processed whole and the fraction c_p =
    (r'·w_i − c_e·b)/b of the next (0 when c_e = n_i), in descending order of their areas
    p_{i,j} (:func:`basic_window_areas`), so p_u ≈ c_p·p_{s^{c_e+1}} + Σ_{j≤c_e} p_{s^j};
    the optimum is g(f_i, w_i·min(1, r')) (:func:`max_area`), and ϕ = p_u/g.

    Note the paper's count: c_e treats every basic window as b seconds of tuples, while the
    newest and the oldest hold b/2 on average; so for a flat f and r' = 1, ϕ = 1 − b/(2·w_i),
    and ϕ = 1 only once r'·w_i ≥ n_i·b. g takes one interval, which bounds p_u for a
    unimodal f; ϕ is clamped to at most 1 against numerical error (and a multimodal f,
    whose best basic windows need not be adjacent). With no mass under f (g = 0), ϕ = 1.
    """
    w = _number("w (window size, seconds)", w, low=0.0, strict_low=True)
    b = _number("b (basic window size, seconds)", b, low=0.0, strict_low=True)
    r_prime = _number("r_prime (fraction of the windows processed)", r_prime, low=0.0,
                      strict_low=True)
    p = sorted(basic_window_areas(cdf, w, b), reverse=True)
    n = len(p)
    c_e = min(n, math.floor(r_prime * w / b))
    c_p = (r_prime * w - c_e * b) / b if c_e < n else 0.0
    p_u = sum(p[:c_e]) + (c_p * p[c_e] if c_e < n else 0.0)
    g = max_area(cdf, w, w * min(1.0, r_prime))
    if g <= 0:
        return 1.0
    return min(1.0, p_u / g)
