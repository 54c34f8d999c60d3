"""Smoke tests of the CACQ benchmark (``adaptcq.bench.cacq``): every command's code path on
tiny inputs (``--scale tiny``), the workload and query generators, the analytic figures of
§4.1, and the fig11 dispatch. No timing is asserted."""

from __future__ import annotations

import csv
import math
import random
import sys
import types
from pathlib import Path

import pytest

from adaptcq.bench import cacq


def _read(path: Path) -> list[dict]:
    with open(path) as f:
        return list(csv.DictReader(f))


# ----- generators ------------------------------------------------------------------------


def test_s_rows_are_the_papers_source():
    rows = cacq.s_rows(500, seed=3)
    assert [r[0] for r in rows] == list(range(500))
    assert all(len(r) == 6 and all(0 <= v < 100 for v in r[1:]) for r in rows)
    assert rows == cacq.s_rows(500, seed=3)            # deterministic
    arr = cacq.s_arrivals(6, sources=("S1", "S2", "S3"))
    assert [a[0] for a in arr] == ["S1", "S2", "S3"] * 2
    assert [a[1] for a in arr] == sorted(a[1] for a in arr)


def test_random_selections_have_figure_6a_form():
    sqls = cacq.random_selections(200, seed=0)
    queries = cacq.parse_all(sqls, {"S": cacq.SCHEMA})
    assert len(queries) == 200
    per_field = dict.fromkeys(cacq.FIELDS, 0)
    for sql in sqls:
        assert sql.startswith("SELECT S.index FROM S")
        if " WHERE " not in sql:
            continue
        for pred in sql.split(" WHERE ")[1].split(" AND "):
            col, op, const = pred.split(" ")
            assert col[2:] in cacq.FIELDS and op in cacq.OPS and 0 <= int(const) < 100
            per_field[col[2:]] += 1
    # each field has a predicate in about half of the queries
    assert all(60 <= n <= 140 for n in per_field.values()), per_field


def test_random_joins_parse_and_feed_single_engines():
    schemas = {s: {c: "number" for c in cacq.JOIN_COLUMNS} for s in cacq.JOIN_SOURCES}
    rng = random.Random(5)
    sqls = [cacq.random_join(rng) for _ in range(20)]
    queries = cacq.parse_all(sqls, schemas)
    assert all(2 <= len(q.streams) <= 3 and q.predicates for q in queries)
    arr = cacq.join_arrivals(90, seed=1)
    si = cacq.single_inputs(queries, schemas, arr)
    for q, (streams, tss, rows) in zip(queries, si.inputs, strict=True):
        mine = {s.source for s in q.streams}
        assert len(rows) == sum(a[0] in mine for a in arr)
        assert tss == sorted(tss)
        for i, row in zip(streams, rows, strict=True):
            assert len(row) == len(q.columns[q.streams[i].alias])


def test_table_queries():
    assert cacq.table3_sql()[0] == "SELECT S.index FROM S WHERE S.a > 90"
    assert cacq.table3_sql()[-1].endswith("S.d > 30 AND S.e > 10")
    assert cacq.TABLE4["workload 1"] == ["a > 30", "b > 50", "c > 10", "d > 40", "e > 90"]
    assert cacq.TABLE4["workload 2"][1] == "a > 10 AND b > 10"
    assert cacq.TABLE4["workload 3"][4] == "a > 10 AND b > 30 AND c > 50 AND d > 70 AND e > 90"


# ----- the analytic routing figures (§4.1) ------------------------------------------------


def test_expected_filters_matches_the_paper():
    p = [0.1, 0.3, 0.5, 0.7, 0.9]
    assert cacq.expected_filters(p, range(5)) == pytest.approx(1.1555)   # paper: 1.156
    assert cacq.expected_filters(p, range(4, -1, -1)) == pytest.approx(5.0)
    # a random scheme that does not skip decided filters: the paper's 3.2
    assert cacq.expected_filters(p, None, skip_decided=False) == pytest.approx(3.2)
    assert 1.1555 < cacq.expected_filters(p, None) < 3.2


# ----- engines ---------------------------------------------------------------------------


def test_cacq_eddies_and_single_engines_agree():
    schemas = {"S": cacq.SCHEMA}
    queries = cacq.parse_all(cacq.random_selections(5, seed=2), schemas)
    arr = cacq.s_arrivals(400, seed=2)
    a = cacq.run_eddy(queries, schemas, arr, keep=True)
    b = cacq.run_eddy(queries, schemas, arr, executor="eddies", keep=True)
    c = cacq.run_single(cacq.single_inputs(queries, schemas, arr), keep=True)
    assert a.emitted == b.emitted == c.emitted
    assert a.outputs == b.outputs == c.outputs
    assert a.arrivals == 400 and a.cpu >= 0 and a.counts["arrivals"] == 400
    checks = cacq.Checks()
    assert checks.same("a vs c", a, c, multiset=True) and not checks.failed
    assert cacq.projection_cpu(queries, schemas, arr) >= 0


def test_high_query_bits_give_the_same_results():
    schemas = {"S": cacq.SCHEMA}
    queries = cacq.parse_all(cacq.table3_sql(), schemas)
    arr = cacq.s_arrivals(300, seed=4)
    low = cacq.run_eddy(queries, schemas, arr)
    high = cacq.run_eddy(queries, schemas, arr, capacity=700, bits=list(range(695, 700)))
    assert low.emitted == high.emitted
    assert max(high.engine.by_bit) == 699


def test_checks_report_a_mismatch():
    checks = cacq.Checks()
    assert not checks.same("x", cacq.Run(1.0, 1, [1, 2]), cacq.Run(1.0, 1, [1, 3]))
    assert checks.failed and "queries [1]" in checks.failed[0]


def test_fit_and_settle_helpers():
    c0, c1, se = cacq._fit([(0, 1.0), (10, 2.0), (20, 3.0), (30, 4.0)])
    assert (c0, c1) == pytest.approx((1.0, 0.1)) and se == pytest.approx(0.0)
    pts = [(float(t), {f"S.{f}": 0.0 for f in cacq.FIELDS}) for t in range(12)]
    for t, pct in pts:
        pct["S.a"] = 100.0 if t < 5 else 60.0
        pct["S.b"] = 0.0 if t <= 5 else (20.0 if t < 8 else 40.0)
    got = cacq._settle_times(pts)
    assert got["S.a"] == "t=0" and got["S.b"] == 3.0 and got["S.c"] == "floor"
    assert got["S.d"] == ""                         # arrives after the end


# ----- every command, tiny ---------------------------------------------------------------


@pytest.mark.parametrize("figure", ["perf", "fig4", "fig6a", "fig6b", "fig8", "fig9"])
def test_command_writes_its_figure(figure, tmp_path, capsys):
    assert cacq.main([figure, "--scale", "tiny", "--out", str(tmp_path)]) == 0
    assert (tmp_path / f"{figure}.csv").stat().st_size > 0
    assert (tmp_path / f"{figure}.png").stat().st_size > 0
    text = capsys.readouterr().out
    assert "outputs DIFFER" not in text
    if figure == "perf":
        assert text.count("PASS") + text.count("FAIL") == 2
        assert {r["engine"] for r in _read(tmp_path / "perf.csv")} >= {
            "cacq", "single-query engines", "per-query eddies", "eddy", "mjoin"}
    else:
        trends = _read(tmp_path / f"{figure}_trends.csv")
        assert trends and all(r["verdict"] in ("HOLDS", "DOES NOT HOLD", "PARTLY", "MEASURED")
                              for r in trends)
    if figure == "fig8":
        rows = {r["scheme"]: r for r in _read(tmp_path / "fig8.csv")}
        worst = float(rows["worst order (fixed e,d,c,b,a)"]["filters_per_tuple"])
        best = float(rows["optimal order (fixed a,b,c,d,e)"]["filters_per_tuple"])
        assert worst == 5.0 and 1.0 <= best < float(rows["random"]["filters_per_tuple"])
    if figure == "fig9":
        rows = _read(tmp_path / "fig9.csv")
        assert {(r["workload"], r["variant"]) for r in rows} == {
            (w, v) for w in cacq.TABLE4 for v in ("no decay", "decay 0.5/1000")}
        for r in rows:
            total = sum(float(r[f"pct_S.{f}"]) for f in cacq.FIELDS)
            assert total == pytest.approx(100.0, abs=0.1) or total == 0.0


def test_fig11_dispatches_lazily(tmp_path, monkeypatch):
    calls = []
    fake = types.ModuleType("adaptcq.bench.cacq_fig11")
    fake.main = lambda argv: calls.append(argv) or 0
    monkeypatch.setitem(sys.modules, "adaptcq.bench.cacq_fig11", fake)
    import adaptcq.bench
    monkeypatch.setattr(adaptcq.bench, "cacq_fig11", fake, raising=False)
    assert cacq.main(["fig11b", "--quick", "--out", str(tmp_path)]) == 0
    assert calls == [["fig11b", "--out", str(tmp_path), "--quick"]]


def test_run_throughput_properties():
    r = cacq.Run(2.0, 100, [10, 30])
    assert r.throughput == 50 and r.out_rate == 20
    assert math.isinf(cacq.Run(0.0, 1, [1]).throughput)


def test_collect_trends_accepts_other_modules_files(tmp_path):
    cacq.write_csv(tmp_path / "fig8_trends.csv", [
        {"figure": "fig8", "trend": "t", "verdict": "HOLDS", "evidence": "e", "reason": ""}])
    (tmp_path / "fig11a_trends.csv").write_text("trend,verdict,detail\nx,DOES NOT HOLD,y\n")
    got = cacq.collect_trends(tmp_path, ["fig8", "fig9", "fig11a"])
    assert [(r["figure"], r["verdict"]) for r in got] == [
        ("fig8", "HOLDS"), ("fig11a", "DOES NOT HOLD")]
    assert len(_read(tmp_path / "trends.csv")) == 2
