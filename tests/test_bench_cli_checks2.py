"""The options of bench.vector, vector_libs, mjoin_xjoin, ordering, spark_scale and
spark_vs_native: a bad value or an option the mode does not read is an argparse error naming
it, before any work; what is printed and written is what ran (no Spark, no real timing:
the measuring subprocesses are replaced by fakes)."""

from __future__ import annotations

import csv
import json

import pyarrow as pa
import pytest

from adaptcq.bench import mjoin_xjoin, ordering, spark_scale, spark_vs_native, vector, vector_libs
from conftest import refused


# ----- bench.vector ---------------------------------------------------------------------------
@pytest.mark.parametrize(("argv", "words"), [
    (["--no-memory", "--only-memory"], ["--only-memory", "--no-memory"]),
    (["--runs", "0"], ["--runs"]),
    (["--batches", "0"], ["--batches"]),
    (["--batches", "1000,-5"], ["--batches"]),
    (["--workloads", "bogus"], ["--workloads", "bogus"]),
    (["--executors", "vector,bogus"], ["--executors", "bogus"]),
    (["--only-memory", "--runs", "3"], ["--runs: not used with --only-memory"]),
    (["--only-memory", "--workloads", "s72"], ["--workloads: not used"]),
])
def test_vector_refuses_bad_and_unused_options(argv, words, capsys, tmp_path):
    refused(vector.main, [*argv, "--out", str(tmp_path / "v")], capsys, *words)
    assert not (tmp_path / "v").exists()  # refused before any work


def _fake_vector(monkeypatch, calls):
    def make(name, folder, scale=1.0):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "params.json").write_text(json.dumps({"workload": name, "scale": scale}))
        calls.append(("make", name, scale))
        return "SELECT 1"

    def spawn(folder, executor, mode, batch, digest=True):
        calls.append(("spawn", executor, batch))
        n = 300_000 if folder.name == "chain10m" else 21_000
        return {"executor": executor, "batch": batch or "", "mode": mode, "results": 10,
                **({"digest": "ab"} if digest else {}), "arrivals": n, "updates": n,
                "process_cpu_s": 1.0, "engine_cpu_s": 0.5, "wall_s": 1.0,
                "updates_per_cpu_s": float(n), "peak_rss_mb": 100.0, "rss_before_mb": 60.0}
    monkeypatch.setattr(vector, "make_workload", make)
    monkeypatch.setattr(vector, "_spawn", spawn)


def test_vector_quick_memory_says_what_it_ran_and_checks_no_target(monkeypatch, tmp_path,
                                                                   capsys):
    calls = []
    _fake_vector(monkeypatch, calls)
    assert vector.main(["--quick", "--only-memory", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "target memory, chain 10M arrivals < 400 MB -> not checked (quick: 300,000" in out
    assert "MET" not in out
    with open(tmp_path / "memory.csv") as f:
        what = [r["what"] for r in csv.DictReader(f)]
    assert what[0] == "chain, 300,000 arrivals (quick), vector"
    assert all("10M" not in w and "(quick)" in w for w in what)
    assert f"wrote {tmp_path / 'memory.csv'}\n" in out  # not the tables it did not write


def test_vector_quick_takes_runs(monkeypatch, tmp_path):
    calls = []
    _fake_vector(monkeypatch, calls)
    assert vector.main(["--quick", "--runs", "3", "--workloads", "chain", "--batches", "20000",
                        "--executors", "vector", "--no-memory", "--out", str(tmp_path)]) == 0
    assert [c for c in calls if c[0] == "spawn"] == [("spawn", "vector", 20_000)] * 3


def test_vector_cached_s72_is_rebuilt_at_another_scale(monkeypatch, tmp_path):
    calls = []
    _fake_vector(monkeypatch, calls)
    folder = tmp_path / "s72"
    vector.cached_workload("s72", folder, 1.0)
    vector.cached_workload("s72", folder, 1.0)  # same scale: reused
    vector.cached_workload("s72", folder, 0.03)
    assert calls == [("make", "s72", 1.0), ("make", "s72", 0.03)]
    (folder / "params.json").unlink()  # an input of an older run, scale unknown: rebuilt
    vector.cached_workload("s72", folder, 0.03)
    assert calls[-1] == ("make", "s72", 0.03)


def test_vector_digest_is_order_independent_and_sees_rows():
    t = pa.table({"r": [1, 2, 3, 4], "s": [5, 6, 7, 8], "_sign": pa.array([1, 1, -1, 1],
                                                                          pa.int8()),
                  "_ts": [0.5, 1.0, 1.5, 2.0]})
    whole = vector.result_digest(t)
    shuffled = t.take([3, 1, 0, 2])
    split = vector.result_digest(shuffled.slice(2), vector.result_digest(shuffled.slice(0, 2)))
    assert whole == split
    swapped = t.set_column(0, "r", pa.array([2, 1, 3, 4]))  # same values, other rows
    assert vector.result_digest(swapped) != whole
    sign = t.set_column(2, "_sign", pa.array([1, 1, 1, 1], pa.int8()))
    assert vector.result_digest(sign) != whole


def test_vector_summary_flags_equal_counts_with_other_rows():
    def row(ex, batch, digest):
        return {"workload": "chain", "executor": ex, "batch": batch, "results": 5,
                "digest": digest, "updates": 9, "process_cpu_s": 1.0, "engine_cpu_s": 1.0,
                "updates_per_cpu_s": 9.0, "peak_rss_mb": 1.0}
    same = vector._summary([row("vector", 1000, "a"), row("mjoin", "", "a")])
    assert all(s["results_agree"] for s in same)
    other = vector._summary([row("vector", 1000, "a"), row("mjoin", "", "b")])
    assert not any(s["results_agree"] for s in other)


# ----- bench.mjoin_xjoin ----------------------------------------------------------------------
@pytest.mark.parametrize(("argv", "words"), [
    (["--runs", "0"], ["--runs"]),
    (["--runs", "-2"], ["--runs"]),
    (["--arrivals", "-5"], ["--arrivals"]),
    (["--r", "-1"], ["--r"]),
    (["--executors", "bogus"], ["--executors", "bogus"]),
    (["--executors", "tree"], ["--executors tree", "--mode append"]),
    (["--baseline", "/nonexistent/src"], ["--baseline /nonexistent/src", "adaptcq/__init__.py"]),
])
def test_mjoin_xjoin_refuses_bad_options(argv, words, capsys, tmp_path):
    refused(mjoin_xjoin.main, [*argv, "--out", str(tmp_path / "m")], capsys, *words)
    assert not (tmp_path / "m").exists()


def test_mjoin_xjoin_baseline_must_be_a_src_folder(capsys, tmp_path):
    (tmp_path / "src" / "adaptcq").mkdir(parents=True)
    (tmp_path / "src" / "adaptcq" / "__init__.py").write_text("")
    refused(mjoin_xjoin.main, ["--baseline", str(tmp_path), "--out", str(tmp_path / "m")],
             capsys, "--baseline", f"give {tmp_path / 'src'}")


# ----- bench.ordering -------------------------------------------------------------------------
@pytest.mark.parametrize(("argv", "words"), [
    (["--settings", "0", "--n", "3"], ["--settings"]),
    (["--cores", "0"], ["--cores"]),
    (["--dmjoin-max", "-1"], ["--dmjoin-max"]),
    (["--reanalyze", "--n", "3..4", "--seed", "9", "--dmjoin-max", "5"],
     ["--n, --dmjoin-max, --seed: not used with --reanalyze"]),
    (["--reanalyze"], ["--reanalyze: no", "settings.csv"]),
])
def test_ordering_refuses_bad_and_unused_options(argv, words, capsys, tmp_path):
    refused(ordering.main, [*argv, "--out", str(tmp_path / "o")], capsys, *words)


def test_ordering_beyond_dmjoin_max_and_reanalysis(tmp_path, capsys):
    # every N above --dmjoin-max: no optimum, only plan times (was a pandas ValueError)
    out = str(tmp_path / "o")
    assert ordering.main(["--n", "21", "--settings", "1", "--engine", "local", "--cores", "1",
                          "--objective", "cost", "--out", out]) == 0
    assert "DMJoin ran on no setting" in capsys.readouterr().out
    assert ordering.main(["--reanalyze", "--objective", "cost", "--out", out]) == 0
    printed = capsys.readouterr().out
    assert "N = 21..21, DMJoin up to N = 0" in printed and "sweep" not in printed


# ----- bench.vector_libs ----------------------------------------------------------------------
def _fake_libs(monkeypatch, calls, installed=("numpy", "pyarrow", "duckdb")):
    """vector_libs with its measuring children replaced: ``calls`` gets each child's
    (arguments, threads); ``installed``: the libraries it finds."""
    def spawn(args, threads):
        calls.append((args, threads))
        if args[0] == "--engine-child":
            return {"results": 3, "sums": [1, 2, 3], "seconds": 0.1}
        return {"cpu": [0.1], "wall": [0.1], "counts": [1, 2], "sums": [1, 2, 3],
                "max_intermediate": 4, "rss_mb": 1.0}
    monkeypatch.setattr(vector_libs, "_spawn", spawn)
    monkeypatch.setattr(vector_libs, "_versions", lambda: {
        m: ("1" if m in installed else None) for m in ("numpy", "pyarrow", "polars", "duckdb")})


@pytest.mark.parametrize(("argv", "words"), [
    (["--libs", "bogus"], ["--libs", "bogus"]),
    (["--libs", "numpy,polars"], ["--libs: polars not installed"]),
    (["--quick", "--workloads", "a,b"], ["--workloads a", "--quick"]),
    (["--runs", "0"], ["--runs"]),
    (["--threads", "0"], ["--threads"]),
    (["--batches", "0"], ["--batches"]),
])
def test_vector_libs_refuses_bad_options(argv, words, monkeypatch, capsys, tmp_path):
    calls = []
    _fake_libs(monkeypatch, calls)
    refused(vector_libs.main, [*argv, "--out", str(tmp_path)], capsys, *words)
    assert calls == []


def test_vector_libs_quick_runs_workload_b_only_and_draws_it(monkeypatch, tmp_path, capsys):
    calls = []
    _fake_libs(monkeypatch, calls)
    assert vector_libs.main(["--quick", "--out", str(tmp_path)]) == 0
    assert {c[1] for c, _ in calls if c[0] == "--engine-child"} == {"b"}
    assert {c[2] for c, _ in calls if c[0] == "--child"} == {"b"}
    assert {c[1] for c, _ in calls if c[0] == "--child"} == {"numpy", "duckdb"}
    out = capsys.readouterr().out
    assert "polars: not installed, left out" in out
    png = tmp_path / "vector_libs_quick.png"
    assert png.read_bytes()[:4] == b"\x89PNG"


# ----- bench.spark_scale, bench.spark_vs_native (refused before any data or JVM) -----------
@pytest.mark.parametrize(("argv", "words"), [
    (["--workloads", "bogus"], ["--workloads", "bogus"]),
    (["--partitions", "0"], ["--partitions"]),
    (["--partitions", "1,x"], ["--partitions"]),
    (["--sf", "-1"], ["--sf"]),
    (["--repeats", "0"], ["--repeats"]),
    (["--state-growth", "--workloads", "q3", "--sf", "0.05"],
     ["--workloads, --sf: not used with --state-growth"]),
    (["--state-growth", "--batches", "1"], ["--batches: at least 2"]),
    (["--batches", "5"], ["--batches: not used without --state-growth"]),
    (["--growth-partitions", "4", "--batch-rows", "10"],
     ["--batch-rows, --growth-partitions: not used without --state-growth"]),
])
def test_spark_scale_refuses_bad_and_unused_options(argv, words, capsys, tmp_path):
    refused(spark_scale.main, [*argv, "--out", str(tmp_path / "s")], capsys, *words)
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize(("argv", "words"), [
    (["--cases", "z"], ["--cases", "'z'"]),
    (["--repeats", "0"], ["--repeats"]),
    (["--files", "0"], ["--files"]),
    (["--cases", "c,d", "--arrivals", "30000"], ["--arrivals: not used by cases c and d"]),
])
def test_spark_vs_native_refuses_bad_options(argv, words, capsys, tmp_path):
    refused(spark_vs_native.main, [*argv, "--out", str(tmp_path / "s")], capsys, *words)
    assert not (tmp_path / "s").exists()


# ----- --help -----------------------------------------------------------------------------------
@pytest.mark.parametrize(("main", "prog", "options"), [
    (vector.main, "adaptcq.bench.vector", ["--runs", "--workloads", "--batches",
                                           "--executors", "--out"]),
    (vector_libs.main, "python -m adaptcq.bench.vector_libs",
     ["--runs", "--libs", "--workloads", "--batches", "--threads", "--out", "--quick"]),
    (mjoin_xjoin.main, "adaptcq.bench.mjoin_xjoin", ["--runs", "--executors", "--out"]),
    (ordering.main, "adaptcq.bench.ordering", ["--out", "--cores", "--seed"]),
    (spark_scale.main, "adaptcq.bench.spark_scale", ["--workloads", "--out", "--repeats",
                                                     "--growth-partitions"]),
    (spark_vs_native.main, "adaptcq.bench.spark_vs_native", ["--cases", "--out",
                                                             "--partitions"]),
])
def test_help_documents_every_option(main, prog, options, capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    assert f"usage: {prog}" in text or f"usage: python -m {prog}" in text
    lines = text.splitlines()
    for opt in options:  # the option's line (or the next) carries a description
        i = next(k for k, x in enumerate(lines) if x.strip().startswith(opt))
        described = lines[i].strip().split(None, 2)[1:] + [lines[i + 1].strip()]
        assert any(len(d) > 8 and not d.isupper() for d in described), (opt, lines[i:i + 2])
