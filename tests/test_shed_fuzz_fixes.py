"""Fixes from fuzzing the load-shedding join: the loss estimate from too small a sample,
tiny adaptation periods, options that changed nothing (T_c for partial, a local CPU
budget, a seed for inverted-id without shedding), and the expiries the summary counts."""

from __future__ import annotations

import random
from collections import Counter
from itertools import pairwise

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import adaptcq
from adaptcq.adapt.shed_control import MIN_PERIOD, ShedController
from adaptcq.engine.continuous import ContinuousQuery
from adaptcq.engine.shed_join import MIN_LOSS_HITS, loss_summary
from adaptcq.errors import OptionError
from adaptcq.query.cql import parse_query
from adaptcq.runtime.shed import engine_options, shed_engine_options, spark_shed_spec
from adaptcq.stats.shedding import HorvitzThompson
from adaptcq.stream.shed_workload import shed_two_way
from conftest import examples

common = settings(max_examples=examples(40), deadline=None,
                  suppress_health_check=[HealthCheck.too_slow])
SQL = ("SELECT R.id AS r, S.id AS s FROM R [RANGE 5 SECONDS], S [RANGE 5 SECONDS] "
       "WHERE R.k = S.k")


def _tables(n=600, seed=1, span=30.0):
    rnd = random.Random(seed)

    def tab(off):
        ts = sorted(rnd.uniform(0, span) for _ in range(n))
        return pa.table({"ts": ts, "k": [rnd.randint(0, 20) for _ in range(n)],
                         "id": list(range(off, off + n))})
    return {"R": tab(0), "S": tab(10**6)}


# ----- 1. the loss estimate --------------------------------------------------------------
def test_heavy_loss_from_an_empty_sample_is_not_reported_as_nothing_lost():
    """r·γ ≈ 0.003: the sample finds no match. The estimate is not below what was
    emitted, and the interval reaches 1 (unmeasured) instead of [0, 0]."""
    wl = shed_two_way(duration=10, rate=80, window=4, join="equality", seed=0)
    exact = len(adaptcq.run(wl.sql, wl.tables, executor="shed").table)
    res = adaptcq.run(wl.sql, wl.tables, executor="shed",
                      shed={"mode": "selective", "capacity": 2000, "seed": 0, "T_r": 1,
                            "T_c": 1, "index": "none"})
    st_, n = res.stats, len(res.table)
    assert n < exact / 2  # heavily overloaded
    assert st_["estimated_results"] >= n
    lo, hi = st_["estimated_lost_interval"]
    assert st_["estimated_lost_measured"] is False
    assert lo <= 1 - n / exact <= hi == 1.0


def test_an_exact_run_is_measured_and_loses_nothing():
    res = adaptcq.run(SQL, _tables(200), executor="shed")
    st_ = res.stats
    assert st_["estimated_lost_measured"] is True
    assert st_["estimated_lost"] == 0.0 and st_["estimated_lost_interval"] == [0.0, 0.0]
    assert st_["estimated_results"] == len(res.table)


@given(results=st.integers(0, 10**6), total=st.floats(0, 1e7), var=st.floats(0, 1e12),
       measured=st.booleans())
def test_loss_summary_never_estimates_below_the_emitted_results(results, total, var,
                                                                measured):
    out = loss_summary(results, total, var, measured)
    lo, hi = out["estimated_lost_interval"]
    assert out["estimated_results"] >= results
    assert 0.0 <= lo <= out["estimated_lost"] <= hi <= 1.0
    assert out["estimated_lost_measured"] is measured
    if not measured:
        assert hi == 1.0  # the exact output may be any larger


def test_the_estimator_is_measured_by_its_hits():
    ht = HorvitzThompson()
    ht.update(5, 1.0)  # counted exactly
    assert ht.measured(MIN_LOSS_HITS)
    for _ in range(50):
        ht.skip()
    ht.update(0, 0.01)
    assert not ht.measured(MIN_LOSS_HITS)  # estimated from a sample without a hit
    for _ in range(MIN_LOSS_HITS):
        ht.update(2, 0.01)
    assert ht.measured(MIN_LOSS_HITS) and ht.estimated == 61 and ht.hits == MIN_LOSS_HITS


def test_an_nway_run_from_an_empty_sample_is_unmeasured():
    sql = ("SELECT R.id AS r FROM R [RANGE 5 SECONDS], S [RANGE 5 SECONDS], "
           "T [RANGE 5 SECONDS] WHERE R.k = S.k AND S.k = T.k")
    tabs = _tables(400, seed=2)
    tabs["T"] = tabs["S"]
    exact = len(adaptcq.run(sql, tabs, executor="shed").table)
    res = adaptcq.run(sql, tabs, executor="shed",
                      shed={"mode": "selective", "capacity": 300, "seed": 1, "gamma": 0.01,
                            "index": "none"})
    st_, n = res.stats, len(res.table)
    assert n < exact / 10 and st_["estimated_results"] >= n
    # (r·γ < 0.001: a handful of sampled tuples, fewer with results)
    assert st_["estimated_lost_measured"] is False
    lo, hi = st_["estimated_lost_interval"]
    assert lo <= 1 - n / exact <= hi == 1.0


# ----- 2. tiny adaptation periods --------------------------------------------------------
@pytest.mark.parametrize("key", ["T_r", "T_c"])
@pytest.mark.parametrize("value", [1e-310, 1e-20, 1e-12, MIN_PERIOD / 2])
def test_periods_below_the_floor_are_refused_naming_them(key, value):
    with pytest.raises(OptionError, match=rf"{key} .* >= 0\.001, got {value!r}"):
        shed_engine_options({"mode": "selective", "capacity": 10, key: value})


def test_the_shortest_period_runs():
    """T_r = T_c = MIN_PERIOD over 30 s of event time: the run ends (each arrival runs at
    most the rate steps of CATCH_UP periods and one time correlation step) and emits a
    sub-multiset of the exact output."""
    tabs = _tables(300)
    exact = adaptcq.run(SQL, tabs, executor="shed").table.to_pylist()
    res = adaptcq.run(SQL, tabs, executor="shed",
                      shed={"mode": "selective", "capacity": 3000, "T_r": MIN_PERIOD,
                            "T_c": MIN_PERIOD, "seed": 1})
    got = res.table.to_pylist()
    assert res.stats["rate_steps"] > 0 and len(got) < len(exact)
    assert not Counter(map(repr, got)) - Counter(map(repr, exact))


def test_a_period_below_the_resolution_of_event_time_is_refused():
    """At event time 10¹⁴ s a float cannot add a millisecond: the schedule would never
    advance (an endless loop before); refused naming the period."""
    q = parse_query(SQL, {"R": {"ts": "number", "k": "number", "id": "number"},
                          "S": {"ts": "number", "k": "number", "id": "number"}})
    cq = ContinuousQuery(q, "shed", "append", shed="selective", capacity=100,
                         controller=ShedController("selective", T_r=1e-3, T_c=1e-3))
    with pytest.raises(OptionError, match=r"T_r = 0\.001 s is below the resolution"):
        cq.process([0, 1], None, [1e14, 1e14 + 1], [(1, 0), (1, 1)])


def test_steps_due_at_one_arrival_are_bounded():
    """A long gap with short periods: one time correlation step (the others would find no
    match) and at most CATCH_UP + 1 rate steps per arrival."""
    from adaptcq.adapt.shed_control import CATCH_UP
    ctl = ShedController("selective", T_r=MIN_PERIOD, T_c=MIN_PERIOD)
    calls = {"corr": 0, "rate": 0}
    ctl.correlation_step = lambda join, now: calls.__setitem__("corr", calls["corr"] + 1)
    ctl.rate_step = lambda join, now: calls.__setitem__("rate", calls["rate"] + 1)
    ctl.at(None, 0.0)
    ctl.at(None, 1000.0)  # 10⁶ periods later
    assert calls == {"corr": 1, "rate": CATCH_UP + 1}
    assert ctl.next_corr > 1000.0 and ctl.next_rate > 1000.0
    ctl.at(None, 1000.0 + 0.5 * MIN_PERIOD)  # nothing due
    assert calls == {"corr": 1, "rate": CATCH_UP + 1}


# ----- 3.-5. options that changed nothing ------------------------------------------------
@pytest.mark.parametrize("mode", ["partial", "random", "none"])
def test_T_c_is_refused_without_time_correlation(mode):
    spec = {"mode": mode, "capacity": 100, "T_c": 5}
    with pytest.raises(OptionError, match=rf"T_c .* is for --shed selective, not {mode}"):
        shed_engine_options(spec)
    with pytest.raises(OptionError, match="T_c"):
        adaptcq.run(SQL, _tables(50), executor="shed", shed=spec)


def test_partial_keeps_T_r():
    ctl, opts = shed_engine_options({"mode": "partial", "capacity": 100, "T_r": 2})
    assert ctl.T_r == 2 and opts["shed"] == "partial"


def test_a_local_cpu_budget_is_refused_and_spark_sets_its_own():
    spec = {"mode": "selective", "capacity": "wall", "budget": 0.001, "seed": 1}
    with pytest.raises(OptionError, match=r"'budget' \(0\.001\) .* a local run has no "
                                          r"micro-batches"):
        adaptcq.run(SQL, _tables(50), executor="shed", shed=spec)
    with pytest.raises(OptionError, match="set by the Spark runtime"):
        spark_shed_spec(spec, 1, 1)  # nor a user's on Spark
    # the Spark runtime's own budget reaches the controller
    spark = spark_shed_spec({"mode": "selective", "capacity": "wall", "interval": 2}, 1, 1)
    assert engine_options({"shed": spark})["controller"].budget == 2.0


def test_T_r_with_a_budget_per_micro_batch_is_refused():
    spark = spark_shed_spec({"mode": "partial", "capacity": "wall", "interval": 2}, 1, 1)
    with pytest.raises(OptionError, match="T_r .* once per micro-batch"):
        engine_options({"shed": {**spark, "T_r": 3}})


def test_inverted_id_identifiers_change_nothing_so_its_seed_is_refused_without_shedding():
    """The identifiers (§4.2.1) order the identifier lists only: under --shed none,
    overloaded, joins whose identifiers were drawn with different seeds agree in output,
    work and drops, so a seed there is refused; with shedding the seed draws the
    samples, and is taken."""
    from test_shedding import _overlap_case
    q, streams, ts, tup = _overlap_case()
    runs = []
    for seed in (1, 2):
        cq = ContinuousQuery(q, "shed", "append", index="inverted-id", capacity=20_000,
                             seed=seed)
        out = cq.process(streams, None, ts, tup) + cq.finish()
        ex = cq.executor
        ids = [i for win in ex.windows for bw in win for i in bw.ids]
        runs.append((ids, sorted(out, key=repr), ex.work, list(ex.drops)))
    assert runs[0][0] != runs[1][0]  # the identifiers differ ...
    assert sum(runs[0][3]) > 0  # (overloaded: the buffers dropped)
    assert runs[0][1:] == runs[1][1:]  # ... and nothing else does
    with pytest.raises(OptionError, match="seed 2: nothing random .* inverted-id"):
        adaptcq.run(SQL, _tables(50), executor="shed",
                    shed={"index": "inverted-id", "capacity": 3000, "seed": 2})
    assert shed_engine_options({"mode": "selective", "capacity": 10,
                                "index": "inverted-id", "seed": 2})[1]["seed"] == 2


# ----- 6. expiries in the run summary ----------------------------------------------------
def test_the_summary_counts_the_shed_joins_expiries_as_the_other_executors_do():
    R = pa.table({"ts": [1, 2, 3], "a": [1, 1, 2], "x": [10, 20, 30]})
    S = pa.table({"ts": [1, 2, 4], "a": [5, 6, 7], "y": [1.5, 2.0, 3.0]})
    sql = "SELECT R.x, S.y FROM R [RANGE 1], S [RANGE 1] WHERE R.a = S.a"
    shed = adaptcq.run(sql, {"R": R, "S": S}, executor="shed").stats
    assert (shed["deletions"], shed["updates"]) == (4, 10)


@common
@given(seed=st.integers(0, 10**6), k=st.sampled_from([2, 3]),
       b=st.sampled_from([None, 0.3, 1.0]))
def test_expiries_equal_mjoins_without_shedding(seed, k, b):
    """Random arrivals (equal times, gaps, windows of 0–3 s): the shed join's deletions
    and updates are MJoin's, two- and three-way, whatever the basic window size."""
    rnd = random.Random(seed)
    names = "RST"[:k]
    wins = [rnd.choice(["0", "0.5", "1", "3"]) for _ in names]
    cond = " AND ".join(f"{a}.k = {c}.k" for a, c in pairwise(names))
    sql = (f"SELECT {names[0]}.id FROM " + ", ".join(
        f"{a} [RANGE {w} SECONDS]" for a, w in zip(names, wins, strict=True))
        + f" WHERE {cond}")
    tabs = {}
    for a in names:
        n = rnd.randint(0, 25)
        t, ts = 0.0, []
        for _ in range(n):
            t += rnd.choice([0.0, 0.25, 0.5, 1.0, 4.0])
            ts.append(t)
        tabs[a] = pa.table({"ts": pa.array(ts, pa.float64()),
                            "k": pa.array([rnd.randint(0, 2) for _ in ts], pa.int64()),
                            "id": pa.array(range(n), pa.int64())})
    opts = {} if b is None else {"shed": {"basic_window": b}}
    shed = adaptcq.run(sql, tabs, executor="shed", **opts).stats
    mjoin = adaptcq.run(sql, tabs, executor="mjoin").stats
    assert (shed["deletions"], shed["updates"]) == (mjoin["deletions"], mjoin["updates"])


def test_expiries_under_shedding_count_only_rows_that_entered_a_window():
    """Overloaded: dropped arrivals never enter a window; every row that did and is
    older than its window by the last arrival counts, whether or not its basic window
    was emptied yet."""
    tabs = _tables(600)
    res = adaptcq.run(SQL, tabs, executor="shed",
                      shed={"mode": "random", "capacity": 200, "seed": 1})
    st_ = res.stats
    dropped = sum(st_["buffer_drops"].values())
    assert dropped > 0
    last = max(max(t["ts"].to_pylist()) for t in tabs.values())
    # the kept arrivals older than the window by the last arrival, at most
    old = sum(1 for t in tabs.values() for x in t["ts"].to_pylist() if x + 5 < last)
    assert 0 < st_["deletions"] <= old
    assert st_["deletions"] >= old - dropped
    assert st_["updates"] == st_["insertions"] + st_["deletions"]
