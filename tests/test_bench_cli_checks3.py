"""The benchmark commands' verdicts and refusals, third round: a trend the run cannot
measure is "not measured", never a verdict (shedding_analysis fig5, spill figures,
acaching_figures fig8, cacq fig6a, adaptive_ordering's phases, shedding_nway's summary); an
option the run does not read is refused (vector --batches, vector_libs --threads); too few
or too many arrivals are an argparse error naming the option and the bound; results that
differ between engines or executors make the command fail (spark_vs_native, spark_scale,
mjoin_xjoin). Fast: parsing, tiny runs, or the measuring jobs replaced by fakes (no Spark)."""

from __future__ import annotations

import argparse
import json
import subprocess
import types
import warnings

import numpy as np
import pytest

from adaptcq.bench import (
    _args,
    acaching_figures,
    adaptive_ordering,
    cacq,
    mjoin_xjoin,
    ordering,
    shedding,
    shedding_analysis,
    shedding_nway,
    spark_scale,
    spark_vs_native,
    spill,
    streaming,
    vector,
    vector_libs,
)
from conftest import read_csv, refused
from test_bench_cli_checks2 import _fake_libs

# ----- 1. shedding_analysis fig5 ----------------------------------------------------------------

def _grid(n_ratios: int, n_loads: int) -> dict:
    base = np.linspace(0.5, 1.0, n_loads)[None, :] - 0.1 * np.arange(n_ratios)[:, None]
    return {shedding_analysis.NAMES[0]: base, shedding_analysis.NAMES[1]: base - 0.05}


def test_fig5_checks_need_two_values_along_a_trend():
    ok = [v for _, v, _ in shedding_analysis.fig5_checks(_grid(2, 3), [0.1, 0.2],
                                                         [0.1, 0.5, 1.0])]
    assert ok == [True, True, True]
    one_load = shedding_analysis.fig5_checks(_grid(2, 1), [0.1, 0.2], [0.5])
    assert one_load[0][1] is None and "--loads" in one_load[0][2]
    assert one_load[1][1] is True and one_load[2][1] is True  # measured from one load on
    one_ratio = shedding_analysis.fig5_checks(_grid(1, 3), [0.1], [0.1, 0.5, 1.0])
    assert one_ratio[2][1] is None and "--ratios" in one_ratio[2][2]
    assert one_ratio[0][1] is True


def test_fig5_one_load_is_not_measured_and_ratios_are_sorted(tmp_path, capsys):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fit through one point (numpy's RankWarning)
        assert shedding_analysis.main(["fig5", "--source", "normal", "--ratios", "0.5,0.1",
                                       "--loads", "0.5", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert ("decreasing resources lower the optimality for a fixed basic window size: "
            "not measured (a trend in r' needs at least 2 --loads values, got 1)") in out
    assert "phi at the smallest b/w (0.1)" in out and "phi at the largest b/w (0.5)" in out
    assert "of 2 measured observations hold (1 not measured)" in out
    rows = read_csv(tmp_path / "fig5.csv")
    assert [float(r["b_over_w"]) for r in rows[:2]] == [0.1, 0.5]


@pytest.mark.parametrize(("argv", "words"), [
    (["--ratios", "0.1,1.5"], ["--ratios", "b/w 1.5 is above 1"]),
    (["--loads", "0.5,2"], ["--loads", "r' 2 is above 1"]),
    (["--ratios", "0.1,-1"], ["--ratios", "positive"]),
])
def test_fig5_refuses_values_outside_the_figure(argv, words, tmp_path, capsys):
    refused(shedding_analysis.main, ["fig5", "--source", "normal", *argv, "--out",
                                      str(tmp_path / "o")], capsys, *words)
    assert not (tmp_path / "o").exists()


# ----- 2. options read only with some executors or libraries ------------------------------------

def test_vector_refuses_batches_without_the_vector_executor(tmp_path, capsys):
    refused(vector.main, ["--executors", "mjoin", "--batches", "777", "--out",
                           str(tmp_path / "v")], capsys,
             "--batches: not used without vector in --executors")
    assert not (tmp_path / "v").exists()


def test_vector_takes_batches_with_the_vector_executor(monkeypatch, tmp_path):
    calls = []

    def make(name, folder, scale=1.0):
        folder.mkdir(parents=True, exist_ok=True)
        return "SELECT 1"

    def spawn(folder, executor, mode, batch, digest=True):
        calls.append((executor, batch))
        return {"executor": executor, "batch": batch or "", "mode": mode, "results": 1,
                "digest": "ab", "arrivals": 9, "updates": 9, "process_cpu_s": 1.0,
                "engine_cpu_s": 0.5, "wall_s": 1.0, "updates_per_cpu_s": 9.0,
                "peak_rss_mb": 1.0, "rss_before_mb": 1.0}
    monkeypatch.setattr(vector, "make_workload", make)
    monkeypatch.setattr(vector, "_spawn", spawn)
    assert vector.main(["--quick", "--workloads", "chain", "--executors", "vector,mjoin",
                        "--batches", "777", "--no-memory", "--out", str(tmp_path)]) == 0
    assert ("vector", 777) in calls and ("mjoin", None) in calls


def test_vector_libs_refuses_threads_without_a_threaded_library(monkeypatch, tmp_path,
                                                                capsys):
    calls = []
    _fake_libs(monkeypatch, calls, ("numpy", "pyarrow", "duckdb"))
    refused(vector_libs.main, ["--libs", "numpy", "--threads", "4", "--quick", "--out",
                                str(tmp_path / "o")], capsys,
             "--threads: not used without a threaded library", "(numpy)")
    # the default libraries, none threaded installed: the same
    _fake_libs(monkeypatch, calls, ("numpy", "pyarrow"))
    refused(vector_libs.main, ["--threads", "4", "--quick", "--out", str(tmp_path / "o")],
             capsys, "--threads: not used")
    assert calls == [] and not (tmp_path / "o").exists()
    _fake_libs(monkeypatch, calls, ("numpy", "pyarrow", "duckdb"))
    assert vector_libs.main(["--libs", "numpy,duckdb", "--threads", "4", "--quick", "--out",
                             str(tmp_path / "o")]) == 0
    assert {t for a, t in calls if a[0] == "--child"} == {4}
    assert (tmp_path / "o" / "vector_libs_threads4_quick.csv").exists()


# ----- 3. adaptive_ordering: chunks cut at the change -------------------------------------------

def test_run_plans_cuts_the_chunks_at_given_arrivals():
    from adaptcq.runtime.local import prepare
    wl = adaptive_ordering.drift_workload(seconds_per_phase=0.5, rate=300.0, window=0.5,
                                          seed=1)
    prepared = prepare(wl.sql, wl.tables, wl.timestamp)
    n = len(prepared.rows)
    got = adaptive_ordering.run_plans(prepared, "retract", 500, {"m": (None, [])},
                                      cuts=(700, 0, n + 5))
    assert [x["arrivals"] for x in got["m"][0]] == sorted({*range(500, n, 500), 700, n})
    whole = adaptive_ordering.run_plans(prepared, "retract", 500, {"m": (None, [])})
    assert got["m"][1] == whole["m"][1]  # the same output however cut


def _ordering_run(tmp_path, *extra):
    return adaptive_ordering.main(["--runs", "1", "--seconds", "0.5", "--rate", "300",
                                   "--window", "0.5", "--p", "1", "--seed", "3", "--out",
                                   str(tmp_path), *extra])


def test_adaptive_ordering_one_chunk_per_phase_when_the_chunk_is_longer(tmp_path, capsys):
    assert _ordering_run(tmp_path, "--chunk", "100000") == 0
    out = capsys.readouterr().out
    summary = json.loads((tmp_path / "summary.json").read_text())
    change, n = summary["change_arrival"], summary["arrivals"]
    assert 0 < change < n
    assert [int(r["arrivals"]) for r in read_csv(tmp_path / "throughput.csv")] == [change, n]
    for k in (1, 2):
        line = next(x for x in out.splitlines() if x.startswith(f"phase {k}:"))
        assert "nan" not in line and "best static plan" in line


def test_adaptive_ordering_phase_without_cpu_is_not_measured(tmp_path, capsys, monkeypatch):
    import time as real_time
    clock = types.SimpleNamespace(process_time=lambda: 1.0, perf_counter=real_time.perf_counter,
                                  time=real_time.time)
    monkeypatch.setattr(adaptive_ordering, "time", clock)  # every chunk: 0 CPU-s
    assert _ordering_run(tmp_path, "--chunk", "100000") == 0
    out = capsys.readouterr().out
    for k in (1, 2):
        line = next(x for x in out.splitlines() if x.startswith(f"phase {k}:"))
        assert "not measured" in line and "nan" not in line
        assert "no best static plan named" in line
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["phases"]["phase1"] == {"measured": False}


# ----- 4. too few arrivals ----------------------------------------------------------------------

@pytest.mark.parametrize(("main", "argv"), [
    (mjoin_xjoin.main, []), (streaming.main, []), (spark_vs_native.main, ["--cases", "b"]),
    (spark_scale.main, ["--workloads", "chain"]),
])
@pytest.mark.parametrize("n", ["1", "2"])
def test_arrivals_below_one_a_stream_arerefused(main, argv, n, tmp_path, capsys):
    err = refused(main, [*argv, "--arrivals", n, "--out", str(tmp_path / "o")], capsys,
                   "argument --arrivals", f"{n} must be at least 3")
    assert "n-updates" not in err
    assert not (tmp_path / "o").exists()


def test_spill_figures_tiny_run_marks_its_trends_not_measured(tmp_path, capsys):
    assert spill.main(["figures", "--arrivals", "5", "--figures", "16", "--out",
                       str(tmp_path)]) == 0
    out = capsys.readouterr().out
    trends = [x for x in out.splitlines() if "paper's trend:" in x]
    assert len(trends) == 5 and all("not measured" in x for x in trends)
    assert "HOLDS" not in out
    assert "0 of 0 measured trend checks hold (5 not measured)" in out


def test_spill_figures_trends_measured_when_the_strategies_differ(tmp_path, capsys,
                                                                  monkeypatch):
    lost = {"bottom-up": 5, "local-output": 6, "global-output": 8, "global-penalty": 9}
    spills = {"bottom-up": 1, "local-output": 4, "global-output": 4, "global-penalty": 2}

    def run(wl, options):
        name = options["strategy"] if options else None
        times = np.arange(lost[name] if name else 10, dtype=float)
        return {"runtime_times": times, "late": 10 - len(times), "results": 10, "cpu": 1.0,
                "cleanup_cpu": 0.0, "spills": spills.get(name, 0), "spilled_bytes": 0,
                "file_bytes": 0, "peak_bytes": 1000, "memory": [(0.0, 1), (1.0, 2)],
                "end": 60.0}
    monkeypatch.setattr(spill, "_run", run)
    assert spill.main(["figures", "--arrivals", "5", "--figures", "16", "--out",
                       str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "not measured" not in out
    assert "5 of 5 trend checks hold" in out


# ----- 5. huge values ---------------------------------------------------------------------------

@pytest.mark.parametrize(("main", "argv", "words"), [
    (adaptive_ordering.main, ["--seconds", "1e12"], ["--seconds 1e+12", "at most about"]),
    (shedding.main, ["fig12", "--duration", "1e12"], ["--duration 1e+12", "at most about"]),
    (shedding.main, ["fig12", "--bin", "1e-12"], ["--bin 1e-12", "at least about"]),
    (shedding.main, ["fig7", "--measure", "1e12"], ["--measure 1e+12", "at most about"]),
    (shedding.main, ["fig15", "--duration-indexed", "1e12"], ["--duration-indexed"]),
])
def test_runs_larger_than_the_memory_arerefused(main, argv, words, tmp_path, capsys):
    err = refused(main, [*argv, "--out", str(tmp_path / "o")], capsys, *words,
                   "GiB of memory")
    assert "Traceback" not in err
    assert not (tmp_path / "o").exists()


def test_refuse_oversized_names_the_value_that_fits(monkeypatch, capsys):
    monkeypatch.setattr(_args, "physical_memory", lambda: 1000 * 2**30)
    p = argparse.ArgumentParser(prog="x")
    _args.refuse_oversized(p, "--seconds", 10.0, 500 * 2**30, "what")  # fits: no error
    with pytest.raises(SystemExit):
        _args.refuse_oversized(p, "--seconds", 10.0, 4000 * 2**30, "what")
    assert "--seconds must be at most about 2.5" in capsys.readouterr().err


def test_adaptive_ordering_window_overflowing_the_cost_is_an_option_error(tmp_path, capsys):
    err = refused(adaptive_ordering.main, ["--runs", "1", "--seconds", "0.5", "--rate", "300",
                                            "--window", "1e300", "--out", str(tmp_path)],
                   capsys, "--window 1e+300", "no static plan")
    assert "Traceback" not in err


# ----- 6. results that differ fail the command --------------------------------------------------

def _fake_spark_job(results):
    def job(*a, **k):
        return {"rows_in": 30, "results": results, "batches": 1, "stream_seconds": 1.0,
                "peak_state_tuples": 1, "peak_state_bytes": 1, "wall_seconds": 2.0,
                "cpu_seconds": 2.0}
    return job


def test_spark_vs_native_fails_when_results_differ(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(spark_vs_native, "run_job", _fake_spark_job(5))
    monkeypatch.setattr(spark_vs_native, "prepare_jvm_archive", lambda args: "off")
    verdicts = iter([(True, 5, 5), (False, 5, 6)])
    monkeypatch.setattr(spark_vs_native, "same_results", lambda a, b: next(verdicts))
    argv = ["--cases", "b", "--arrivals", "30", "--files", "1", "--repeats", "2", "--out",
            str(tmp_path)]
    assert spark_vs_native.main(argv) == 1
    out = capsys.readouterr().out
    assert "error: adaptcq's results differ from Spark native's (case b run 2" in out
    monkeypatch.setattr(spark_vs_native, "same_results", lambda a, b: (True, 5, 5))
    assert spark_vs_native.main(argv) == 0
    assert "error" not in capsys.readouterr().out


def test_spark_vs_native_executor_is_checked_at_parsing(tmp_path, capsys):
    refused(spark_vs_native.main, ["--executor", "bogus", "--cases", "b", "--out",
                                    str(tmp_path / "o")], capsys, "--executor", "bogus")
    assert not (tmp_path / "o").exists()


def test_spark_scale_checks_every_repeat(monkeypatch, tmp_path, capsys):
    seen = []

    def job(engine, name, args, out, partitions=1):
        seen.append(engine)
        return {"rows_in": 30, "results": 5, "batches": 1, "wall_seconds": 2.0,
                "cpu_seconds": 2.0}
    monkeypatch.setattr(spark_scale, "run_job", job)
    monkeypatch.setattr(spark_scale, "prepare_jvm_archive", lambda args: "off")
    # the adaptcq runs' outputs, in turn: the first equal to native's, the second not
    verdicts = iter([True, False])
    monkeypatch.setattr(spark_scale, "same_results", lambda a, b, ids: next(verdicts))
    argv = ["--workloads", "chain", "--arrivals", "30", "--files", "1", "--partitions", "1",
            "--repeats", "2", "--out", str(tmp_path)]
    assert spark_scale.main(argv) == 1
    out = capsys.readouterr().out
    assert "error: adaptcq's results differ from Spark native's in chain P=1 run 2" in out
    assert seen.count("adaptcq") == 2
    rows = read_csv(tmp_path / "spark_scale.csv")
    assert next(r for r in rows if r["engine"] == "adaptcq")["results_equal"] == "False"
    monkeypatch.setattr(spark_scale, "same_results", lambda a, b, ids: True)
    assert spark_scale.main(argv) == 0


def _fake_single(monkeypatch, results):
    """mjoin_xjoin's measuring subprocesses replaced: executor -> (results, digest)."""
    def fake_run(cmd, **kw):
        ex = cmd[cmd.index("--single") + 1]
        n, digest = results[ex]
        row = {"executor": ex, "mode": "retract", "arrivals": 30, "updates": 30,
               "results": n, "digest": digest, "process_cpu_s": 1.0, "engine_cpu_s": 0.5,
               "wall_s": 1.0, "updates_per_cpu_s": 30.0, "engine_updates_per_cpu_s": 60.0,
               "peak_state_tuples": 3, "peak_state_bytes": 30, "max_rss_kib": 1}
        return subprocess.CompletedProcess(cmd, 0, json.dumps(row) + "\n", "")
    monkeypatch.setattr(mjoin_xjoin.subprocess, "run", fake_run)


def test_mjoin_xjoin_fails_when_the_executors_disagree(monkeypatch, tmp_path, capsys):
    argv = ["--arrivals", "30", "--runs", "1", "--out", str(tmp_path)]
    _fake_single(monkeypatch, {"mjoin": (7, "aa"), "xjoin": (7, "bb")})
    assert mjoin_xjoin.main(argv) == 1
    out = capsys.readouterr().out
    assert "error: the executors' results differ" in out and "digest bb" in out
    _fake_single(monkeypatch, {"mjoin": (7, "aa"), "xjoin": (8, "aa")})
    assert mjoin_xjoin.main(argv) == 1
    _fake_single(monkeypatch, {"mjoin": (7, "aa"), "xjoin": (7, "aa")})
    assert mjoin_xjoin.main(argv) == 0
    assert "results agree: every run of mjoin, xjoin gave the same 7 results" in \
        capsys.readouterr().out


def test_mjoin_xjoin_single_digests_the_result_rows(tmp_path):
    from adaptcq.stream.workloads import three_way, write_workload
    write_workload(three_way(n_updates=300, r=2, seed=0), tmp_path)
    rows = {ex: mjoin_xjoin.single(ex, str(tmp_path), "retract") for ex in ("mjoin", "xjoin")}
    assert rows["mjoin"]["results"] > 0
    assert rows["mjoin"]["digest"] == rows["xjoin"]["digest"]
    assert rows["mjoin"]["results"] == rows["xjoin"]["results"]


# ----- 7. acaching_figures fig8 --quick ---------------------------------------------------------

def test_acaching_fig8_without_a_ratio_above_one_is_not_measured(monkeypatch, tmp_path,
                                                                 capsys):
    monkeypatch.setattr(acaching_figures, "aligned_three_way", lambda g, rs_speed: None)

    def fig3way(fig, out, points, x, *a, **k):
        return [{x: ratio, "relative": rel} for (ratio, _), rel in
                zip(points, (0.9, 1.3, 1.4, 1.6, 1.8, 2.0), strict=False)]
    monkeypatch.setattr(acaching_figures, "_fig_3way", fig3way)
    acaching_figures.fig8(tmp_path, True, 1)
    out = capsys.readouterr().out
    assert ("[NOT MEASURED] the cache is better even when the update rate is higher than "
            "the probe rate") in out
    assert "no point with an update-to-probe ratio above 1 (ratios 0.2, 0.8: --quick)" in out
    assert "reason:" not in out.split("[NOT MEASURED]")[1]
    acaching_figures.fig8(tmp_path, False, 1)  # ratios up to 3.2: measured
    out = capsys.readouterr().out
    assert "NOT MEASURED" not in out
    assert "[NOT CONFIRMED] the cache is better even when the update rate is higher" in out


# ----- 8. shedding_nway, cacq fig6a, ordering --n ------------------------------------------------

def test_shedding_nway_says_which_runs_it_left_out(monkeypatch, tmp_path, capsys):
    def run_case(case, streams, rate, window, duration, policy, capacity, seed):
        n = 0 if policy == "random" and (case == "equality" or seed == 0) else 10 + seed
        return {"case": case, "run": seed, "policy": policy, "results": n, "work": 1,
                "r_min": 1.0, "drops": 5 if policy == "random" else 0,  # (an overload)
                "estimated_lost": 0.0}
    monkeypatch.setattr(shedding_nway, "run_case", run_case)
    assert shedding_nway.main(["--runs", "2", "--cases", "overlap,equality", "--out",
                               str(tmp_path)]) == 0
    out = capsys.readouterr().out
    summary = [x for x in out.splitlines() if "selective / random" in x]
    overlap = next(x for x in summary if x.strip().startswith("overlap "))
    assert "(median of 1: " in overlap
    assert "left out, random dropping gave 0 results: run 0 (selective 10)" in overlap
    equality = next(x for x in summary if x.strip().startswith("equality "))
    assert "not measured (random dropping gave 0 results in every run" in equality


def test_cacq_fig6a_peak_check_needs_points_around_five(monkeypatch, tmp_path):
    assert cacq.main(["fig6a", "--scale", "tiny", "--out", str(tmp_path)]) == 0
    row = next(r for r in read_csv(tmp_path / "fig6a_trends.csv") if "about 5" in r["trend"])
    assert "3 to 10 queries" in row["trend"]
    peak = int(row["evidence"].rsplit("maximum at ", 1)[1].split()[0])
    assert row["verdict"] == ("HOLDS" if 3 <= peak <= 10 else "DOES NOT HOLD")
    monkeypatch.setitem(cacq.SIZES["tiny"], "fig6a_queries", (1, 3))
    assert cacq.main(["fig6a", "--scale", "tiny", "--out", str(tmp_path)]) == 0
    row = next(r for r in read_csv(tmp_path / "fig6a_trends.csv") if "about 5" in r["trend"])
    assert row["verdict"] == "NOT MEASURED" and "above 10" in row["evidence"]


@pytest.mark.parametrize(("text", "words"), [
    ("5..3", ["the range '5..3' is empty", "write 3..5"]),
    ("8-4", ["the range '8-4' is empty"]),
    ("3..x", ["not a whole number"]),
])
def test_ordering_n_names_an_empty_range(text, words):
    with pytest.raises(argparse.ArgumentTypeError) as e:
        ordering.parse_ns(text)
    for w in words:
        assert w in str(e.value)
    assert ordering.parse_ns("3..5,4") == [3, 4, 5]
