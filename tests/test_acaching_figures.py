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
