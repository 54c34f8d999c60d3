"""Smoke test of the a-caching §7 benchmark: one small figure runs and writes its CSV."""

import csv

from adaptcq.bench.acaching_figures import main


def test_fig6_quick_writes_csv(tmp_path, capsys):
    assert main(["fig6", "--quick", "--out", str(tmp_path)]) == 0
    rows = list(csv.DictReader((tmp_path / "fig6.csv").open()))
    assert [int(r["r"]) for r in rows] == [1, 5]
    for r in rows:
        assert float(r["mjoin"]) > 0 and float(r["caching"]) > 0
        assert 0.0 <= float(r["hit_prob"]) <= 1.0
    assert (tmp_path / "fig6.png").stat().st_size > 0
    trends = list(csv.DictReader((tmp_path / "fig6_trends.csv").open()))
    assert trends and all(t["verdict"] in ("CONFIRMED", "NOT CONFIRMED") for t in trends)
    assert "outputs identical" in capsys.readouterr().out


def test_fig13_quick_prints_issue_14s_check(tmp_path, capsys):
    """Figure 13 compares A-Caching at each budget with the best static plan that fits it
    (MJoin, or the best XJoin where its join subresults fit) and says whether issue 14's
    0.9x holds at every budget."""
    assert main(["fig13", "--quick", "--out", str(tmp_path), "--runs", "1"]) == 0
    rows = list(csv.DictReader((tmp_path / "fig13.csv").open()))
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.strip().startswith("issue 14:"))
    shares = []
    for r in rows:
        fits = float(r["xjoin_subresult_bytes"]) <= float(r["memory_bytes"])
        best = max(float(r["mjoin"]), float(r["xjoin"]) if fits else 0.0)
        shares.append(float(r["caching"]) / best)
        assert f"{int(r['memory_bytes']):,} B {shares[-1]:.2f}" in line
    assert line.rstrip().endswith("a run)")
    assert ("-> MET" in line) == (min(shares) >= 0.9)


def test_fig10_quick_prints_issue_14s_check(tmp_path, capsys):
    """Figure 10 states issue 14's check from its own rows: A-Caching against the forced
    R⋈S cache at every point (whole run) and against MJoin at the largest |S|, and prints
    the second-half ratios beside it."""
    assert main(["fig10", "--quick", "--out", str(tmp_path), "--runs", "1"]) == 0
    rows = list(csv.DictReader((tmp_path / "fig10.csv").open()))
    out = capsys.readouterr().out.splitlines()
    line = next(x for x in out if x.strip().startswith("issue 14:"))
    whole = [float(r["acaching_vs_cache"]) for r in rows]
    vs_mjoin = 1 / float(rows[-1]["acaching_relative"])
    assert ", ".join(f"{x:.2f}" for x in whole) in line
    assert f"at the largest |S| {vs_mjoin:.2f}" in line
    assert ("-> MET" in line) == (min(whole) >= 0.9 and vs_mjoin >= 1.5)
    half = next(x for x in out if x.strip().startswith("second half of each run"))
    assert half.endswith(", ".join(f"{float(r['acaching_vs_cache_second_half']):.2f}"
                                   for r in rows))
