"""The workload generator of load-shedding.txt §6.1 (stream/shed_workload.py), its match
distributions (Figure 6), and the Figure 5 / 6 benchmark commands
(bench/shedding_analysis.py) on tiny parameters."""

from __future__ import annotations

import csv
import itertools
import math

import numpy as np
import pyarrow as pa
import pytest

from adaptcq.stream.shed_workload import (
    match_distribution,
    shed_two_way,
    utilities_fig16,
    utilities_fig17,
)
from adaptcq.stream.workloads import WORKLOADS, WorkloadError, read_workload, write_workload


def _sets(wl, stream):
    return wl.tables[stream].column("s").to_pylist()


def _a(ts, items, cycle, shift=0.0):
    """§6.1: the most popular item at time T."""
    return 1 + np.floor(items * np.mod(ts - shift, cycle) / cycle).astype(np.int64)


def test_same_seed_same_workload():
    a = shed_two_way(duration=5, rate=200, seed=3)
    b = shed_two_way(duration=5, rate=200, seed=3)
    c = shed_two_way(duration=5, rate=200, seed=4)
    for s in ("R", "S"):
        assert a.tables[s].equals(b.tables[s])
        assert not a.tables[s].equals(c.tables[s])
    assert a.params == b.params and a.sql == b.sql


def test_columns_and_types():
    wl = shed_two_way(duration=3, rate=100)
    assert wl.name == "shed" and set(wl.tables) == {"R", "S"}
    for t in wl.tables.values():
        assert t.schema.names == ["ts", "id", "s", "v"]       # no kind without utilities
        assert t.schema.field("ts").type == pa.float64()
        assert t.schema.field("id").type == pa.int64()
        assert t.schema.field("s").type == pa.list_(pa.int64())
        assert t.schema.field("v").type == pa.int64()
        ts = t.column("ts").to_numpy()
        assert np.all(np.diff(ts) >= 0) and ts[0] >= 0 and ts[-1] < 3
        assert t.column("id").to_pylist() == list(range(t.num_rows))
        v = t.column("v").to_numpy()
        assert v.min() >= 1 and v.max() <= 5000
    assert wl.sql == ("SELECT R.id AS r, S.id AS s FROM R [RANGE 20 SECONDS], "
                      "S [RANGE 20 SECONDS] WHERE OVERLAP(R.s, S.s) >= 3")
    assert wl.params["utility"] is None
    assert wl.params["cycle"] == 40 and wl.params["shift"] == 25
    eq = shed_two_way(duration=1, rate=50, join="equality", window=7.5)
    assert eq.sql.endswith("FROM R [RANGE 7.5 SECONDS], S [RANGE 7.5 SECONDS] "
                           "WHERE R.v = S.v")


def test_sets_sorted_distinct_in_range_with_normal_sizes():
    wl = shed_two_way(duration=10, rate=500)
    for stream in ("R", "S"):
        sets = _sets(wl, stream)
        assert all(x == sorted(set(x)) and 1 <= x[0] and x[-1] <= 100 for x in sets)
        sizes = np.array([len(x) for x in sets])
        assert sizes.mean() == pytest.approx(5.0, abs=0.1)
        assert sizes.std() == pytest.approx(1.0, abs=0.1)
    small = shed_two_way(duration=5, rate=200, items=8, mu=6, sigma=3)
    sizes = [len(x) for x in _sets(small, "R")]
    assert min(sizes) == 1 and max(sizes) == 8       # clipped to [1, L]
    assert all(x == sorted(set(x)) and 1 <= x[0] and x[-1] <= 8 for x in _sets(small, "R"))


def test_popularity_rotates_and_s_is_shifted():
    wl = shed_two_way(duration=12, rate=3000, kappa=1.0)   # ς = 40, τ = 25, L = 100
    for stream, shift in (("R", 0.0), ("S", 25.0)):
        t = wl.tables[stream]
        ts = t.column("ts").to_numpy()
        sets = _sets(wl, stream)
        for start in (0.0, 10.0):
            # a(T) stays put for 40/100 = 0.4 s: over the slice of time where it is a(start),
            # the most frequent item is a(start).
            a = int(_a(np.array([start]), 100, 40.0, shift)[0])
            rows = np.flatnonzero((ts >= start) & (ts < start + 0.4)
                                  & (_a(ts, 100, 40.0, shift) == a))
            assert len(rows) > 300
            items = np.concatenate([sets[k] for k in rows])
            assert np.bincount(items).argmax() == a
        assert int(_a(np.array([10.0]), 100, 40.0, 25.0)[0]) == 63   # the shifted one
        # Over the whole run, the rank of each item relative to a(T) is Zipf(κ).
        sizes = np.array([len(x) for x in sets])
        ranks = np.mod(np.concatenate(sets) - np.repeat(_a(ts, 100, 40.0, shift), sizes),
                       100)
        counts = np.bincount(ranks, minlength=100)
        assert counts.argmax() == 0 and counts[0] > counts[1] > counts[3] > counts[20]
        # Equi-join values: sets of one item out of 5000, drawn the same way.
        v = t.column("v").to_numpy()
        vr = np.bincount(np.mod(v - _a(ts, 5000, 40.0, shift), 5000), minlength=5000)
        assert vr.argmax() == 0
        assert vr[0] / vr[1] == pytest.approx(2.0, rel=0.25)   # 2^κ, κ = 1


def test_match_distribution_reproduces_figure_6():
    wl = shed_two_way(duration=40, rate=300)
    m = match_distribution(wl, sample=600)
    assert m["edges"][0] == 0 and m["edges"][-1] == 20 and len(m["edges"]) == 21
    f2, f1 = m["f_2"], m["f_1"]
    assert (f2["probe"], f2["window_of"], f1["probe"], f1["window_of"]) == ("R", "S", "S", "R")
    for f in (f1, f2):
        assert sum(f["mass"]) == pytest.approx(1.0)
        assert f["matches"] > 100 and f["sampled"] == 600
        assert 0 < f["match_probability"] < 0.05
    # R probing W_S: a clear peak at ς − τ = 15 s = 0.75·w, far above lag 0.
    assert abs(f2["peak_lag"] - 15.0) <= 1.5
    peak = max(f2["mass"])
    assert peak > 4 * f2["mass"][0] and peak > 3 / 20
    # S probing W_R: its matches are τ = 25 s back, out of the window: it rises to lag w.
    assert f1["peak_lag"] >= 15
    assert max(f1["mass"]) < peak / 2


def test_fig8_rate_profile_counts():
    wl = shed_two_way(duration=120, rate="fig8", seed=1)
    assert wl.params["rate_profile"] == [[0, 100], [60, 500], [75, 300], [105, 100]]
    for stream in ("R", "S"):
        ts = wl.tables[stream].column("ts").to_numpy()
        counts = np.histogram(ts, bins=[0, 60, 75, 105, 120])[0]
        for got, want in zip(counts, (6000, 7500, 9000, 1500), strict=True):
            assert abs(got - want) < 5 * math.sqrt(want)          # Poisson
    approx = shed_two_way(duration=10, rate="fig11")
    assert "approximation" in approx.params["rate_profile_note"]


def test_n_updates_sets_the_duration():
    wl = shed_two_way(rate=500, n_updates=10_000)
    assert wl.params["duration"] == pytest.approx(10.0)
    assert abs(wl.n_updates - 10_000) < 5 * math.sqrt(10_000)
    wl = shed_two_way(rate="fig8", n_updates=2 * (6000 + 2500))   # 60 s at 100, 5 s at 500
    assert wl.params["duration"] == pytest.approx(65.0)


def test_utilities_and_frequencies():
    assert utilities_fig16(2) == pytest.approx([1, 1 / 4, 1 / 9])
    assert utilities_fig16(0) == [1, 1, 1]
    v = utilities_fig17(10, 100)
    assert v[0] == 1 and v[0] / v[-1] == pytest.approx(100)
    assert all(a > b for a, b in itertools.pairwise(v))
    assert v[1] == pytest.approx(1 / 2 ** 2)                # θ = log_10 100 = 2
    wl = shed_two_way(duration=10, rate=500, utilities=[1, 0.25, 0.5], frequencies="inverse")
    assert wl.params["frequencies"] == pytest.approx([1 / 7, 4 / 7, 2 / 7])
    assert wl.params["utility"] == "CASE kind WHEN 't0' THEN 1 WHEN 't1' THEN 0.25 " \
                                   "WHEN 't2' THEN 0.5 END"
    for stream in ("R", "S"):
        t = wl.tables[stream]
        assert t.schema.field("kind").type == pa.string()
        kinds = t.column("kind").to_pylist()
        for z, f in enumerate(wl.params["frequencies"]):
            assert kinds.count(f"t{z}") / len(kinds) == pytest.approx(f, abs=0.03)
    direct = shed_two_way(duration=1, rate=50, utilities=[1, 0.25], frequencies="direct")
    assert direct.params["frequencies"] == pytest.approx([0.8, 0.2])
    explicit = shed_two_way(duration=1, rate=50, utilities=[1, 2], frequencies=[3, 1])
    assert explicit.params["frequencies"] == pytest.approx([0.75, 0.25])
    # The types do not change the sets (separate random streams).
    plain = shed_two_way(duration=10, rate=500)
    assert plain.tables["R"].column("s").equals(wl.tables["R"].column("s"))


@pytest.mark.parametrize("kwargs, name", [
    ({"rate": "fig9"}, "rate"), ({"rate": 0}, "rate"), ({"join": "theta"}, "join"),
    ({"kappa": -1}, "kappa"), ({"items": 0}, "items"), ({"window": 0}, "window"),
    ({"threshold": 0}, "threshold"), ({"frequencies": "inverse"}, "frequencies"),
    ({"utilities": [1, 0], "frequencies": "inverse"}, "inverse"),
    ({"utilities": [1, 2], "frequencies": [1]}, "frequencies"), ({"seed": -1}, "seed"),
    ({"n_updates": 1}, "n_updates"), ({"cycle": -2}, "cycle"),
])
def test_bad_parameters_name_themselves(kwargs, name):
    with pytest.raises(WorkloadError, match=name):
        shed_two_way(**({"duration": 1, "rate": 10} | kwargs))
    with pytest.raises(WorkloadError, match="types"):
        utilities_fig17(1, 10)


def test_registered_and_round_trips(tmp_path):
    wl = WORKLOADS["shed"](n_updates=400, seed=2)
    assert wl.name == "shed" and wl.params["n_updates"] == 400
    wl = shed_two_way(duration=2, rate=50, utilities=utilities_fig16(1))
    write_workload(wl, tmp_path / "w")
    back = read_workload(tmp_path / "w")
    assert back.sql == wl.sql and back.params == wl.params
    for s in ("R", "S"):
        assert back.tables[s].equals(wl.tables[s])


# ----- bench/shedding_analysis.py: smoke tests ------------------------------------------------


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_bench_fig6_smoke(tmp_path, capsys):
    from adaptcq.bench.shedding_analysis import main
    assert main(["fig6", "--out", str(tmp_path), "--duration", "30", "--rate", "150",
                 "--sample", "200"]) == 0
    rows = _rows(tmp_path / "fig6.csv")
    assert {r["kappa"] for r in rows} == {"0.6", "0.8"}
    assert {r["f"] for r in rows} == {"f_1", "f_2"}
    assert len(rows) == 2 * 2 * 20
    for kappa in ("0.6", "0.8"):
        mass = [float(r["mass"]) for r in rows if r["kappa"] == kappa and r["f"] == "f_2"]
        assert sum(mass) == pytest.approx(1.0, abs=1e-6)
    assert (tmp_path / "fig6.png").stat().st_size > 0
    assert "expected" in capsys.readouterr().out


def test_bench_fig5_smoke(tmp_path, capsys):
    from adaptcq.bench.shedding_analysis import main
    assert main(["fig5", "--out", str(tmp_path), "--source", "normal",
                 "--ratios", "0.05,0.2,0.5", "--loads", "0.1,0.5,1"]) == 0
    rows = _rows(tmp_path / "fig5.csv")
    assert len(rows) == 2 * 3 * 3
    assert {r["distribution"] for r in rows} == {"less skewed", "more skewed"}
    assert all(0 <= float(r["phi"]) <= 1 for r in rows)
    assert (tmp_path / "fig5.png").stat().st_size > 0
    out = capsys.readouterr().out
    assert out.count("HOLDS") + out.count("DOES NOT HOLD") == 3
