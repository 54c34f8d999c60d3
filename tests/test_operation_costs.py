"""Seconds per operation measured as the query runs (stats.costs; issue 14, item 1), and
§4.1's benefit and cost in those terms (adapt.caching.model). No timing is asserted: the
intervals here are synthetic, so every expected figure is exact."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from adaptcq.adapt.caching.model import OpCosts, cache_estimate, operator_cost
from adaptcq.stats.costs import KINDS, MIN_INTERVALS, PRIOR, OperationCosts, fit_costs
from conftest import examples

TRUE = {"probe": 180e-9, "entry": 60e-9, "scan_row": 25e-9, "cache_probe": 400e-9,
        "cache_update": 300e-9, "entry_build": 900e-9, "insert": 1.2e-6, "expiry": 1.1e-6,
        "observe": 500e-9}


def _intervals(n: int, seed: int = 0) -> list[dict[str, float]]:
    rng = np.random.default_rng(seed)
    return [{k: float(rng.integers(0, 1000)) for k in KINDS} for _ in range(n)]


def _cpu(rows, costs=TRUE) -> list[float]:
    return [math.fsum(costs[k] * r.get(k, 0.0) for k in costs) for r in rows]


def test_known_costs_are_recovered_exactly():
    rows = _intervals(20)
    fit = fit_costs(rows, _cpu(rows))
    for k in KINDS:
        assert fit[k] == pytest.approx(TRUE[k], rel=1e-9), k
    assert fit.determined == KINDS
    assert fit.status == f"{len(KINDS)} of {len(KINDS)} kinds measured over 20 intervals"
    assert fit.intervals == 20


@settings(max_examples=examples(60), deadline=None)
@given(costs=st.lists(st.floats(1e-9, 1e-5), min_size=len(KINDS), max_size=len(KINDS)),
       n=st.integers(len(KINDS) + 2, 40), seed=st.integers(0, 10_000))
def test_any_costs_are_recovered_from_varied_noise_free_intervals(costs, n, seed):
    truth = dict(zip(KINDS, costs))
    rows = _intervals(n, seed)
    X = np.array([[r[k] for k in KINDS] for r in rows])
    assume(np.linalg.cond(X / np.sqrt((X ** 2).mean(axis=0))) < 30)  # (RCOND = 3%)
    fit = fit_costs(rows, _cpu(rows, truth))
    for k in KINDS:
        assert fit[k] == pytest.approx(truth[k], rel=1e-6, abs=1e-15), k


def test_too_few_intervals_fall_back_to_one_scale_on_the_prior():
    rows = _intervals(MIN_INTERVALS - 1)
    cpu = _cpu(rows)
    fit = fit_costs(rows, cpu)
    assert fit.determined == ()
    assert "one scale on the prior" in fit.status and f"(< {MIN_INTERVALS})" in fit.status
    scale = sum(cpu) / sum(PRIOR[k] * r[k] for r in rows for k in KINDS)
    assert fit.scale == pytest.approx(scale, rel=1e-12)
    for k in KINDS:
        assert fit[k] == pytest.approx(scale * PRIOR[k], rel=1e-12)
    # the scale is the old single rate: the total CPU is predicted exactly
    assert sum(fit.cpu(r) for r in rows) == pytest.approx(sum(cpu), rel=1e-12)


def test_intervals_without_variation_keep_the_prior_split_and_say_so():
    """A steady stream: every interval the same mix of operations. Nothing separates the
    kinds, so none is measured; the fit still predicts that mix's CPU exactly, and moves
    the kinds only along it (from the prior: r - r̄ proportional to the mix, per column
    scale)."""
    mix = {"probe": 700.0, "entry": 1400.0, "insert": 500.0, "expiry": 500.0}
    rows = [{k: v * (1 + t % 3) for k, v in mix.items()} for t in range(12)]
    cpu = _cpu(rows)
    fit = fit_costs(rows, cpu)
    assert fit.determined == ()
    assert "collinear, prior's split: probe, entry, insert, expiry" in fit.status
    assert "not seen, prior: scan_row, cache_probe, cache_update, entry_build, observe" \
        in fit.status
    for r, c in zip(rows, cpu):
        assert fit.cpu(r) == pytest.approx(c, rel=1e-9)
    for k in ("scan_row", "cache_probe", "cache_update", "entry_build", "observe"):
        assert fit[k] == pytest.approx(fit.scale * PRIOR[k], rel=1e-12)


def test_a_kind_never_seen_keeps_the_prior_while_the_others_are_measured():
    rows = _intervals(24, seed=3)
    for r in rows:
        r["cache_probe"] = r["cache_update"] = r["entry_build"] = 0.0
    fit = fit_costs(rows, _cpu(rows))
    seen = [k for k in KINDS if k not in ("cache_probe", "cache_update", "entry_build")]
    assert set(fit.determined) == set(seen)
    for k in seen:
        assert fit[k] == pytest.approx(TRUE[k], rel=1e-9)
    assert "not seen, prior: cache_probe, cache_update, entry_build" in fit.status
    assert fit["cache_probe"] == pytest.approx(fit.scale * PRIOR["cache_probe"])


def test_costs_are_never_negative():
    """Intervals whose least-squares fit would give a kind a negative cost: that kind is
    fixed at 0 and the others fitted again."""
    rows = _intervals(30, seed=5)
    truth = dict(TRUE, entry=-200e-9)  # (impossible, but a noisy interval set can say so)
    fit = fit_costs(rows, _cpu(rows, truth))
    assert fit["entry"] == 0.0
    assert all(v >= 0 for v in fit.seconds.values())


@settings(max_examples=examples(60), deadline=None)
@given(rows=st.lists(st.fixed_dictionaries({k: st.floats(0, 1e4) for k in KINDS}),
                     min_size=1, max_size=30),
       cpu=st.lists(st.floats(0, 1.0), min_size=30, max_size=30))
def test_any_intervals_give_finite_non_negative_costs_or_none(rows, cpu):
    fit = fit_costs(rows, cpu[:len(rows)])
    if fit is None:  # nothing counted or no CPU: nothing to scale
        assert sum(cpu[:len(rows)]) == 0 or all(
            sum(PRIOR[k] * r[k] for k in KINDS) == 0 for r in rows)
        return
    assert all(math.isfinite(v) and v >= 0 for v in fit.seconds.values())
    assert set(fit.determined) <= set(KINDS) and fit.status


def test_nothing_counted_gives_no_estimate_and_bad_input_is_refused():
    assert fit_costs([], []) is None
    assert fit_costs([{"probe": 0.0}], [1.0]) is None
    assert fit_costs([{"probe": 5.0}], [0.0]) is None
    with pytest.raises(ValueError, match="unknown operation kinds"):
        fit_costs([{"probes": 1.0}], [1.0])
    with pytest.raises(ValueError, match="2 intervals of counts but 1"):
        fit_costs([{}, {}], [1.0])


def test_the_online_estimator_keeps_the_w_most_recent_intervals():
    est = OperationCosts(W=20)
    assert est.get() is None and not est.ready
    old = _intervals(20, seed=7)
    for r, c in zip(old, _cpu(old, {k: 1e-6 for k in KINDS})):
        est.update(r, c)
    rows = _intervals(20, seed=8)
    for r, c in zip(rows, _cpu(rows)):
        est.update(r, c)
    assert est.n == 40 and est.ready
    fit = est.get()
    for k in KINDS:  # the first 20 (other costs) have left the window
        assert fit[k] == pytest.approx(TRUE[k], rel=1e-9)
    with pytest.raises(ValueError, match="non-negative"):
        est.update({"probe": -1.0}, 1.0)
    with pytest.raises(ValueError, match="non-negative"):
        est.update({"probe": 1.0}, float("nan"))


# ----- §4.1 in the engine's terms ------------------------------------------------------------
def test_the_work_clock_is_the_papers_formula():
    """On the work clock (``--no-cache-verify``) benefit and cost are §4.1's exactly:
    benefit = Σ d c − d_ij·probe_cost − miss·(Σ d c + d_{i,k+1}·update_cost), cost =
    update_cost · Σ d_{l,|Z|-1}."""
    costs = OpCosts.work_clock(probe_cost=1.5, update_cost=0.5)
    seg, d_in, d_out, miss, ups = 40.0, 10.0, 12.0, 0.25, [3.0, 4.0]
    e = cache_estimate(seg, d_in, d_out, miss, ups, costs)
    assert e.benefit == pytest.approx(seg - d_in * 1.5 - miss * (seg + d_out * 0.5))
    assert e.cost == pytest.approx(0.5 * 7.0)
    assert operator_cost(10.0, (1.0, 2.0, 0.0), costs) == pytest.approx(30.0)


def test_measured_costs_price_every_operation_the_compiled_cache_does():
    s = dict(TRUE)
    costs = OpCosts.measured(s, retract=True)
    assert (costs.runs, costs.maintains, costs.clock) == (2.0, 2.0, "seconds")
    seg = operator_cost(10.0, (1.0, 1.0, 0.0), costs)  # 10 tuples/s, a probe and an entry
    assert seg == pytest.approx(10.0 * 2 * (s["probe"] + s["entry"]))
    e = cache_estimate(seg, 10.0, 10.0, 0.2, [1.0, 1.0], costs, maintain_joins=0.0)
    hit_and_probe = 2 * 10.0 * s["cache_probe"] + 2 * 0.8 * 10.0 * s["entry"]
    miss = 0.2 * (seg + 2 * (10.0 * s["entry"] + 10.0 * s["entry_build"]))
    assert e.benefit == pytest.approx(seg - hit_and_probe - miss)
    assert e.cost == pytest.approx(2 * s["cache_update"] * 2.0)
    # probe_cost and update_cost scale the measured cache costs (0: caches are free)
    free = OpCosts.measured(s, retract=False, probe_cost=0.0, update_cost=0.0)
    assert (free.cache_probe, free.cache_store, free.entry_build, free.cache_update) == (0,) * 4
    assert free.runs == 1.0 and free.cache_yield == s["entry"]


def test_the_online_estimator_refits_every_few_intervals():
    est = OperationCosts(W=20, every=5)
    rows = _intervals(23, seed=9)
    cpu = _cpu(rows)
    for r, c in zip(rows[:20], cpu[:20]):
        est.update(r, c)
    first = est.get()
    assert first.intervals == 20 and not est.stale
    for r, c in zip(rows[20:], cpu[20:]):  # 3 more: not refitted yet
        est.update(r, c)
    assert est.get() is first and not est.stale
    est.update(rows[0], cpu[0]).update(rows[1], cpu[1])
    assert est.stale and est.get() is not first and est.n == 25
    with pytest.raises(ValueError, match="unknown operation kinds"):
        est.update({"probes": 1.0}, 1.0)


def test_intervals_while_windows_fill_set_only_the_scale():
    """Intervals marked unsteady (windows filling: their counts lag) give one scale on
    the prior while no steady interval has come, and are ignored once one has."""
    est = OperationCosts(W=20)
    rows = _intervals(12, seed=11)
    cpu = _cpu(rows)
    for r, c in zip(rows[:6], cpu[:6]):
        est.update(r, 2 * c, steady=False)
    fit = est.get()
    assert fit.intervals == 0 and fit.determined == ()
    assert fit.status.startswith("no steady interval yet (6 while windows fill)")
    scale = 2 * sum(cpu[:6]) / sum(PRIOR[k] * r[k] for r in rows[:6] for k in KINDS)
    assert fit["probe"] == pytest.approx(scale * PRIOR["probe"], rel=1e-12)
    for r, c in zip(rows[6:], cpu[6:]):
        est.update(r, c)
    fit = est.get()
    assert fit.intervals == 6 and est.n == 6
    assert fit.scale == pytest.approx(
        sum(cpu[6:]) / sum(PRIOR[k] * r[k] for r in rows[6:] for k in KINDS), rel=1e-12)
