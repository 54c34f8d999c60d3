"""Benchmark CLI fixes from the read-only fuzzers (round 20): bench.shedding's --types,
--factors and --ks bounded at parsing; verdicts that measured nothing printed as "not
measured" with the reason (shedding fig10/fig13/fig16/fig17/perf, shedding_nway,
shedding_analysis fig6); bench.ordering's --out and --reanalyze errors. Fast: parsing, the
measuring runs replaced by fakes, or tiny real runs. Never on timing."""

from __future__ import annotations

import math
import sys

import pytest

from adaptcq.bench import ordering, shedding, shedding_analysis, shedding_nway
from adaptcq.stream import shed_workload
from adaptcq.stream.workloads import WorkloadError
from conftest import refused

# ----- 1, 2. bounds at parsing ------------------------------------------------------------------


@pytest.mark.parametrize(("argv", "words"), [
    (["fig17", "--types", "1"], ["--types", "1 must be at least 2", "two tuple types"]),
    (["fig17", "--types", "4,1"], ["--types", "at least 2"]),
    (["fig17", "--factors", "0.5"], ["--factors", "0.5 must be from 1"]),
    (["fig17", "--factors", "1e308"], ["--factors", "normal double"]),
    (["fig16", "--ks", "2000"], ["--ks", "2000 must be from 0 to 644", "1/3^k"]),
    (["fig16", "--ks", "1,645"], ["--ks", "645"]),
])
def test_shedding_utility_options_bounded_at_parsing(argv, words, capsys, tmp_path):
    refused(shedding.main, [*argv, "--out", str(tmp_path)], capsys, *words)
    assert not any(tmp_path.iterdir())  # before any work


def test_utilities_refuse_values_beyond_doubles():
    """The library functions the CLI bounds: a WorkloadError, not an OverflowError."""
    top = shed_workload.utilities_fig16(math.floor(shed_workload.K_MAX))
    assert all(v >= sys.float_info.min for v in top)  # normal doubles, none 0
    with pytest.raises(WorkloadError, match="at most 644.8"):
        shed_workload.utilities_fig16(2000)
    with pytest.raises(WorkloadError, match="at most"):
        shed_workload.utilities_fig16(646)  # 1/3^646 is subnormal; 3^647 overflows
    assert min(shed_workload.utilities_fig17(2, 1e300)) >= sys.float_info.min
    with pytest.raises(WorkloadError, match="factor"):
        shed_workload.utilities_fig17(2, 1e308)
    with pytest.raises(WorkloadError, match="factor"):
        shed_workload.utilities_fig17(2, 0.5)


# ----- 3. verdicts that measured nothing --------------------------------------------------------


def _paper_lines(out: str) -> list[str]:
    return [x for x in out.splitlines() if x.startswith(("paper:", "check:"))]


def _fake_fig13(monkeypatch, rate):
    """fig13's runs replaced: ``rate(kappa, policy)`` is the average output."""
    monkeypatch.setattr(shedding, "prepare", lambda *a, kappa, **k: {"kappa": kappa})
    monkeypatch.setattr(shedding, "run_join", lambda prep, pol, cap, **k: {
        "results": 1, "rate": rate(prep["kappa"], pol), "r_min": 0.5, "cpu": 0.0})


def test_fig13_one_kappa_or_no_output_is_not_measured(monkeypatch, tmp_path, capsys):
    _fake_fig13(monkeypatch, lambda kappa, pol: 0.0)
    for kappas in ("0.8", "0.4,0.8"):
        assert shedding.main(["fig13", "--kappas", kappas, "--runs", "1", "--out",
                              str(tmp_path)]) == 0
        lines = _paper_lines(capsys.readouterr().out)
        assert len(lines) == 3
        assert all("-> not measured (" in x for x in lines), lines
        why = "needs at least 2 values, got 1" if kappas == "0.8" else "no output"
        assert all(why in x for x in lines), lines


def test_fig13_measures_the_trend_from_the_smallest_kappa(monkeypatch, tmp_path, capsys):
    """--kappas in any order: the trend runs from the smallest kappa to the largest."""
    gains = {"partial": 1.0, "selective-nodir": 1.0, "selective": 1.0}
    _fake_fig13(monkeypatch, lambda kappa, pol: 10.0 * (gains[pol] + (kappa if pol !=
                                                                      "partial" else 0)))
    assert shedding.main(["fig13", "--kappas", "0.8,0.4,0.8", "--runs", "1", "--out",
                          str(tmp_path)]) == 0
    out = capsys.readouterr().out
    lines = _paper_lines(out)
    assert all(x.split("-> ")[1].startswith("HOLDS") for x in lines), lines
    assert "at kappa=0.4 -> " in lines[0] and lines[0].endswith("at kappa=0.8)")
    assert out.index("kappa=0.4:") < out.index("kappa=0.8:")  # repeats dropped, sorted


def test_fig10_one_kappa_is_not_measured(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(shedding, "prepare", lambda *a, **k: {})
    monkeypatch.setattr(shedding, "run_join", lambda prep, pol, cap, **k: {
        "results": 1, "rate": 2.0 if pol == "partial" else 1.0, "r_min": 0.5, "cpu": 0.0})
    assert shedding.main(["fig10", "--kappas", "0.6", "--windows", "2", "--runs", "1",
                          "--out", str(tmp_path)]) == 0
    (line,) = _paper_lines(capsys.readouterr().out)
    assert "grows with kappa -> not measured (a trend over --kappas needs" in line


def _fake_utility(monkeypatch, gain):
    """fig16/fig17's runs replaced: output utility 100 without, 100·(1 + gain) with."""
    def pair(utilities, frequencies, duration, capacity, seed):
        return 100.0, 100.0 * (1 + gain(utilities, frequencies))
    monkeypatch.setattr(shedding, "_utility_pair", pair)


def test_fig16_one_k_or_a_tie_is_not_measured(monkeypatch, tmp_path, capsys):
    _fake_utility(monkeypatch, lambda u, f: 0.0)  # utility-based shedding changed nothing
    assert shedding.main(["fig16", "--ks", "1", "--runs", "1", "--out", str(tmp_path)]) == 0
    grows, most = _paper_lines(capsys.readouterr().out)
    assert "-> not measured (a trend over --ks needs at least 2 values, got 1)" in grows
    assert "-> not measured (no model gains more than the others" in most
    # measured: the gains differ by model and grow with k (the smallest utility 1/3^k)
    _fake_utility(monkeypatch, lambda u, f: (1 - u[-1]) * {"inverse": 2, "uniform": 1,
                                                           "direct": 0.5}[f])
    assert shedding.main(["fig16", "--ks", "2,0", "--runs", "1", "--out", str(tmp_path)]) == 0
    grows, most = _paper_lines(capsys.readouterr().out)
    assert "-> HOLDS" in grows and "-> HOLDS (most: inverse)" in most


def test_fig17_too_few_types_is_not_measured(monkeypatch, tmp_path, capsys):
    _fake_utility(monkeypatch, lambda u, f: 1 / len(u))
    assert shedding.main(["fig17", "--types", "2,4", "--factors", "10", "--runs", "1",
                          "--out", str(tmp_path)]) == 0
    (line,) = _paper_lines(capsys.readouterr().out)
    assert "then stabilizes -> not measured (a trend over --types needs at least 3" in line


def _fake_fig15(monkeypatch, drops: int, random_results: int = 100):
    monkeypatch.setattr(shedding, "prepare", lambda *a, **k: {})
    monkeypatch.setattr(shedding, "run_join", lambda prep, pol, cap, **k: {
        "policy": pol, "results": 400 if pol == "selective" else random_results, "work": 1,
        "r_min": 1.0, "drops": drops, "cpu": 1.0, "overhead": 0.001,
        "estimated_lost": 0.0, "series": None})


@pytest.mark.filterwarnings("ignore:No artists with labels")  # (no ratio line to plot)
@pytest.mark.parametrize(("duration", "drops", "random_results", "expected"), [
    ("8", 5, 100, "not measured (a --duration of 8 s does not fill the join's 20 s windows"),
    ("30", 0, 100, "not measured (no overload: neither policy shed anything"),
    ("30", 5, 0, "not measured (random dropping gave 0 results in every run"),
    ("30", 5, 100, "4.00x -> HOLDS"),
])
def test_perf_verdict_needs_filled_windows_overload_and_output(
        monkeypatch, tmp_path, capsys, duration, drops, random_results, expected):
    _fake_fig15(monkeypatch, drops, random_results)
    assert shedding.main(["perf", "--duration", duration, "--runs", "1", "--out",
                          str(tmp_path)]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if ">= 3x random" in x)
    assert expected in line, line


def _fake_nway(monkeypatch, drops: dict, results: dict):
    """shedding_nway's runs replaced: ``drops``/``results`` by (policy, run)."""
    def run_case(case, streams, rate, window, duration, policy, capacity, seed):
        return {"case": case, "run": seed, "policy": policy,
                "results": results[(policy, seed)], "work": 1, "r_min": 1.0,
                "drops": drops[(policy, seed)], "estimated_lost": 0.0}
    monkeypatch.setattr(shedding_nway, "run_case", run_case)


def _nway_summary(tmp_path, capsys) -> str:
    assert shedding_nway.main(["--runs", "2", "--cases", "overlap", "--out",
                               str(tmp_path)]) == 0
    return next(x for x in capsys.readouterr().out.splitlines()
                if "selective / random" in x)


def test_nway_without_overload_is_not_measured(monkeypatch, tmp_path, capsys):
    same = {(p, k): 6 for p in ("random", "selective") for k in (0, 1)}
    _fake_nway(monkeypatch, {k: 0 for k in same}, same)
    line = _nway_summary(tmp_path, capsys)
    assert "not measured (no overload, neither policy shed anything in every run: run 0, " \
           "run 1; for an overload raise --rate" in line
    assert "pay" not in line and "--capacity or lower --rate" not in line


def test_nway_leaves_out_runs_without_overload(monkeypatch, tmp_path, capsys):
    results = {("random", 0): 6, ("selective", 0): 6, ("random", 1): 10,
               ("selective", 1): 30}
    _fake_nway(monkeypatch, {("random", 0): 0, ("selective", 0): 0, ("random", 1): 4,
                             ("selective", 1): 0}, results)
    line = _nway_summary(tmp_path, capsys)
    assert "3.00x (median of 1: 3.00): pays; left out, no overload, neither policy shed " \
           "anything: run 0" in line


def test_fig6_shorter_than_the_window_is_not_measured(tmp_path, capsys):
    assert shedding_analysis.main(["fig6", "--duration", "10", "--rate", "100", "--sample",
                                   "100", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "HOLD" not in out
    assert out.count("not measured (a --duration of 10 s does not fill the w = 20 s") == 5
    assert "0 of 0 measured checks hold (5 not measured)" in out


# ----- 4. bench.ordering ------------------------------------------------------------------------

_SWEEP = ["--n", "3", "--settings", "1", "--engine", "local", "--cores", "1"]


def test_ordering_reanalyzes_the_objectives_the_sweep_ran(tmp_path, capsys):
    out = str(tmp_path / "t")
    assert ordering.main([*_SWEEP, "--objective", "tuples", "--out", out]) == 0
    capsys.readouterr()
    assert ordering.main(["--reanalyze", "--out", out]) == 0  # default: both
    printed = capsys.readouterr().out
    assert "holds only objective tuples: analysing that" in printed
    assert "objective tuples" in printed and "objective cost" not in printed
    refused(ordering.main, ["--reanalyze", "--objective", "both", "--out", out], capsys,
            "--objective both", "no row of objective cost (only tuples)",
            "give --objective tuples")


def test_ordering_out_naming_a_file_is_refused(tmp_path, capsys):
    f = tmp_path / "afile"
    f.write_text("")
    for extra in ([*_SWEEP], ["--reanalyze"]):
        refused(ordering.main, [*extra, "--out", str(f)], capsys, f"--out {f}: a file")


@pytest.mark.parametrize(("text", "words"), [
    ("", ["not a settings.csv", "EmptyDataError"]),
    ("x,y\n1,2\n", ["no column n, shape, index", "its columns: x, y"]),
    (("n,shape,index,objective,algorithm,cost,seconds\n3,linear,0,cost,fab,1.5,0.1\n"
      "3,linear,0,cost,fab,abc,0.1\n"), ["row 3: cost must be a finite number"]),
    ("n,shape,index,objective,algorithm,cost,seconds\n3,ring,0,cost,fab,1.5,0.1\n",
     ["row 2: shape must be one of"]),
    ("n,shape,index,objective,algorithm,cost,seconds\n3.5,linear,0,cost,fab,1.5,0.1\n",
     ["row 2: n must be a whole number"]),
])
def test_ordering_reanalyze_refuses_a_foreign_settings_csv(tmp_path, capsys, text, words):
    (tmp_path / "settings.csv").write_text(text)
    refused(ordering.main, ["--reanalyze", "--out", str(tmp_path)], capsys,
            f"{tmp_path / 'settings.csv'}", *words)
