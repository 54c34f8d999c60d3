"""Tests of the synthetic workload generators (a-caching.txt §7.1-§7.4)."""

from __future__ import annotations

import itertools
import time

import numpy as np
import pandas as pd
import pytest

from adaptcq.stream.workloads import (
    TABLE2,
    WORKLOADS,
    Burst,
    Workload,
    WorkloadError,
    default_workload,
    nway,
    read_workload,
    table2_point,
    three_way,
    write_workload,
)


def _col(w: Workload, stream: str, col: str) -> np.ndarray:
    return w.tables[stream].column(col).to_numpy()


def _empirical_selectivity(w: Workload, x: str, y: str) -> float:
    """Fraction of tuple pairs (one of x, one of y) that are in their windows together
    (|ts_x - ts_y| <= window, the inclusive RANGE boundary) and join on a."""
    win = w.params["window"]
    tx, ty = _col(w, x, "ts"), _col(w, y, "ts")
    together = (np.searchsorted(ty, tx + win, side="right")
                - np.searchsorted(ty, tx - win, side="left")).sum()
    left = pd.DataFrame({"a": _col(w, x, "a"), "tx": tx})
    right = pd.DataFrame({"a": _col(w, y, "a"), "ty": ty})
    m = left.merge(right, on="a")
    joined = int((np.abs(m["tx"] - m["ty"]) <= win).sum())
    return joined / together


# --------------------------------------------------------------------------- format


def test_table_format_and_contract():
    for w in (three_way(n_updates=7_000), table2_point("D3", n_updates=3_100), default_workload()):
        assert w.timestamp == "ts"
        assert set(w.tables) == set(w.params["streams"])
        for name, t in w.tables.items():
            assert t.schema.field("ts").type == "double"
            assert t.schema.field("id").type == "int64"
            assert np.array_equal(_col(w, name, "id"), np.arange(t.num_rows))
            for c in t.column_names:
                if c not in ("ts", "id"):
                    assert c in ("a", "b") and t.schema.field(c).type == "int64"
        assert w.n_updates == w.params["n_updates"]  # exactly n_updates arrivals in all


def test_sql_text():
    w = three_way(n_updates=7_000)
    assert w.sql == ("SELECT R.id AS rid, S.id AS sid, T.id AS tid FROM R [RANGE 1 SECONDS], "
                     "S [RANGE 1 SECONDS], T [RANGE 1 SECONDS] WHERE R.a = S.a AND S.b = T.b")
    assert "[RANGE 0.5 SECONDS]" in three_way(n_updates=700, window=0.5).sql
    d = default_workload()
    assert d.sql.startswith("SELECT R1.id AS r1, R2.id AS r2, R3.id AS r3, R4.id AS r4, "
                            "R1.a AS a FROM R1 [RANGE 0.2 SECONDS], R2 [RANGE 0.2 SECONDS]")
    assert d.sql.endswith("WHERE R1.a = R2.a AND R2.a = R3.a AND R3.a = R4.a")
    t = table2_point("D8", n_updates=400)
    assert "R.a = S.a AND S.a = T.a AND T.a = U.a" in t.sql
    assert list(t.tables) == ["R", "S", "T", "U"]


def test_table2_transcription():
    assert TABLE2["D3"]["rates"] == {"R": 10, "S": 15, "T": 1, "U": 5}
    sel = TABLE2["D4"]["selectivities"]
    assert sel[frozenset("RS")] == 0.003 and sel[frozenset("SU")] == 0.0023
    assert sel[frozenset("TU")] == 0.0027
    assert TABLE2["D5"]["selectivities"][frozenset("TU")] == 0.002
    assert all(v == 0 for v in TABLE2["D7"]["selectivities"].values())
    assert set(WORKLOADS) == {"three-way", "nway", "table2", "default", "spill", "shed"}
    assert WORKLOADS["table2"](name="D2", n_updates=1_800).params["point"] == "D2"


# --------------------------------------------------------------------------- determinism


def test_deterministic_for_a_seed():
    assert nway(n_updates=4_000, seed=3) == nway(n_updates=4_000, seed=3)
    assert table2_point("D1", n_updates=2_600, seed=5) == table2_point("D1", n_updates=2_600,
                                                                       seed=5)
    assert three_way(n_updates=7_000, seed=1) == three_way(n_updates=7_000, seed=1)
    assert default_workload(seed=2) == default_workload(seed=2)


def test_different_seeds_differ_where_random():
    a, b = table2_point("D1", n_updates=2_600, seed=0), table2_point("D1", n_updates=2_600, seed=1)
    for s in a.tables:
        assert not np.array_equal(_col(a, s, "a"), _col(b, s, "a"))
        assert np.array_equal(_col(a, s, "ts"), _col(b, s, "ts"))  # arrivals are uniform
    # The three-way workload has no randomness: values follow the arrival order.
    assert three_way(n_updates=700, seed=0).tables == three_way(n_updates=700, seed=9).tables


# --------------------------------------------------------------------------- arrivals


def test_timestamps_non_decreasing():
    ws = [three_way(n_updates=70_000, burst=Burst.after_arrivals("S", 2_000, "R", 20)),
          table2_point("D3", n_updates=31_000), default_workload(),
          nway(n_updates=10_000, burst=[Burst("R1", 3.0, 1.0, 2.0), Burst("R1", 0.5, 1.5)])]
    for w in ws:
        for s in w.tables:
            ts = _col(w, s, "ts")
            assert ts[0] >= 0 and np.all(np.diff(ts) >= 0), (w.name, s)


def test_relative_rates_honoured():
    w = table2_point("D3", n_updates=310_000)
    counts = w.params["counts"]
    assert sum(counts.values()) == 310_000
    for s, rel in TABLE2["D3"]["rates"].items():
        assert counts[s] / counts["T"] == pytest.approx(rel, rel=0.02)
        # evenly spaced at rel * 1000 tuples/second
        assert np.diff(_col(w, s, "ts")).mean() == pytest.approx(1 / (rel * 1000), rel=1e-3)


def test_three_way_multiplicity_and_alignment():
    r = 5
    w = three_way(n_updates=70_000, r=r, rate=1000.0)
    counts = w.params["counts"]
    assert counts["T"] == r * counts["R"] and counts["R"] == counts["S"] == 10_000
    tb = _col(w, "T", "b")
    values, runs = np.unique(tb, return_counts=True)
    assert np.all(runs == r) and np.array_equal(values, np.arange(len(values)))
    assert np.all(np.diff(tb) >= 0)  # each value appears r times consecutively
    for col in ("a",):
        assert np.array_equal(_col(w, "R", col), np.arange(counts["R"]))  # multiplicity 1
    assert np.array_equal(_col(w, "S", "a"), _col(w, "S", "b"))
    # value v arrives at about time v/rate in every stream
    for s, col in (("R", "a"), ("S", "b"), ("T", "b")):
        assert np.all(np.abs(_col(w, s, "ts") - _col(w, s, col) / 1000.0) < 1 / 1000.0)
    assert w.params["selectivities"] == {"R,S": 0.001, "S,T": 0.001}
    # each R tuple joins exactly one S tuple and r T tuples within the window
    win = w.params["window"]
    rt, ra = _col(w, "R", "ts")[:200], _col(w, "R", "a")[:200]
    tt = _col(w, "T", "ts")
    for t0, v in zip(rt, ra, strict=True):
        near = np.abs(tt - t0) <= win
        assert int((tb[near] == v).sum()) == r


def test_burst_multiplies_rate_inside_interval():
    burst = Burst.after_arrivals("S", count=2_000, stream="R", factor=20)
    w = three_way(n_updates=120_000, burst=burst)
    (resolved,) = w.params["bursts_resolved"]
    start = resolved["start"]
    assert start == pytest.approx(_col(w, "S", "ts")[1_999])  # the 2,000th ΔS arrival
    ts = _col(w, "R", "ts")
    inside = ((ts >= start + 0.1) & (ts < start + 1.1)).sum()
    outside = ((ts >= start - 1.1) & (ts < start - 0.1)).sum()
    assert inside / outside == pytest.approx(20, rel=0.02)
    # the alignment holds, so R's values get multiplicity 20 during the burst
    a = _col(w, "R", "a")
    _, runs = np.unique(a[ts >= start + 0.1], return_counts=True)
    assert np.all(np.abs(runs[1:-1] - 20) <= 1)
    # S and T are untouched
    assert np.diff(_col(w, "S", "ts")).max() == pytest.approx(1e-3)


def test_burst_with_end_and_default_workload_middle_third():
    w = nway(n=2, n_updates=20_000, burst=Burst("R1", factor=4.0, start=2.0, end=4.0))
    ts = _col(w, "R1", "ts")
    inside, before = ((ts >= 2) & (ts < 4)).sum(), (ts < 2).sum()
    after = ((ts >= 4) & (ts < 6)).sum()
    assert inside / before == pytest.approx(4, rel=0.01) and after / before == pytest.approx(
        1, rel=0.01)
    d = default_workload()
    assert d.n_updates == 200_000
    (b,) = d.params["bursts_resolved"]
    run = d.params["duration"]
    assert b["stream"] == "R2" and b["factor"] == 5
    assert b["start"] == pytest.approx(run / 3) and b["end"] == pytest.approx(2 * run / 3)
    ts = _col(d, "R2", "ts")
    mid = ((ts >= run / 3) & (ts < 2 * run / 3)).sum()
    first = (ts < run / 3).sum()
    assert mid / first == pytest.approx(5, rel=0.01)
    assert d.params["point"] == "D1"


def test_burst_validation():
    with pytest.raises(WorkloadError):
        Burst("R", factor=0, start=1.0)
    with pytest.raises(WorkloadError):
        three_way(n_updates=700, burst=Burst("X", 2.0, 0.0))
    with pytest.warns(UserWarning, match="after the run ends"):
        three_way(n_updates=700, burst=Burst.after_arrivals("S", 100_000, "R", 20))


# --------------------------------------------------------------------------- selectivities


@pytest.mark.parametrize("point", ["D1", "D5"])
def test_empirical_selectivity_matches_params(point):
    w = table2_point(point, n_updates=26_000, seed=7)
    achieved = w.params["selectivities"]
    for x, y in itertools.combinations("RSTU", 2):
        emp = _empirical_selectivity(w, x, y)
        assert emp == pytest.approx(achieved[f"{x},{y}"], rel=0.08), (x, y)


def test_nested_fit_records_requested_and_achieved():
    w = table2_point("D1", n_updates=2_600)
    p = w.params
    assert p["selectivities_requested"]["S,T"] == 0.007
    dom = {s: d["size"] for s, d in p["domains"].items()}
    for x, y in itertools.combinations("RSTU", 2):
        assert p["selectivities"][f"{x},{y}"] == pytest.approx(1 / max(dom[x], dom[y]))
    # D8 (all 0.001) is met exactly; D7 (all 0) never joins
    assert table2_point("D8", n_updates=400).params["max_abs_rel_error"] == 0
    d7 = table2_point("D7", n_updates=4_000)
    assert all(v == 0 for v in d7.params["selectivities"].values())
    vals = [set(_col(d7, s, "a").tolist()) for s in "RSTU"]
    assert all(not (u & v) for u, v in itertools.combinations(vals, 2))


def test_intervals_layout_fits_table2_closely():
    w = table2_point("D1", n_updates=26_000, layout="intervals")
    assert w.params["max_abs_rel_error"] < 0.01
    assert w.params["common_values"] > 0  # the 4-way join still has values in common
    for x, y in (("R", "S"), ("S", "T")):
        emp = _empirical_selectivity(w, x, y)
        assert emp == pytest.approx(w.params["selectivities"][f"{x},{y}"], rel=0.08)


def test_zero_selectivity_inside_a_joined_group_is_refused_by_nested():
    sel = {("R1", "R2"): 0.01, ("R2", "R3"): 0.01, ("R1", "R3"): 0.0}
    with pytest.raises(WorkloadError, match="selectivity 0"):
        nway(n=3, selectivities=sel, n_updates=300)
    w = nway(n=3, selectivities={("R1", "R2"): 0.01, ("R2", "R3"): 0.0, ("R1", "R3"): 0.0},
             n_updates=300)
    assert w.params["selectivities"]["R2,R3"] == 0 and w.params["selectivities"]["R1,R2"] > 0


def test_table2_errors():
    with pytest.raises(WorkloadError):
        table2_point("D9")


# --------------------------------------------------------------------------- files, speed


def test_write_read_round_trip(tmp_path):
    w = table2_point("D2", n_updates=1_800, burst=Burst.after_arrivals("S", 50, "R", 3.0))
    paths = write_workload(w, tmp_path / "wl")
    assert paths["R"] == tmp_path / "wl" / "R.parquet"
    assert (tmp_path / "wl" / "query.sql").read_text().strip() == w.sql
    back = read_workload(tmp_path / "wl")
    assert back == w
    assert list(back.tables) == list(w.tables)
    with pytest.raises(WorkloadError):
        read_workload(tmp_path / "missing")


def test_three_million_rows_quickly():
    t0 = time.perf_counter()
    w = three_way(n_updates=3_000_000)
    assert time.perf_counter() - t0 < 2.0
    assert w.n_updates == 3_000_000
