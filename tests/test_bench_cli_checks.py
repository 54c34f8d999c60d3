"""The benchmark commands' option checks (bench/shedding.py, shedding_analysis.py,
shedding_nway.py, spill.py, adaptive_ordering.py, streaming.py, cacq.py, cacq_fig11.py,
acaching_figures.py): a bad value is an argparse error naming the option before any work,
an option the chosen figure does not read is refused, a 0 is not taken for the default;
what is printed is what was written (perf's files, the PNGs of shedding_nway and spill's
rebuild, formats and perf), a cached input is the one asked for, ``--seed`` is used; every
option has a help text. Fast: parsing, or tiny runs."""

from __future__ import annotations

import argparse
import importlib
import json
from types import SimpleNamespace

import pytest

from adaptcq.bench import (
    acaching_figures,
    adaptive_ordering,
    cacq,
    cacq_fig11,
    shedding,
    shedding_analysis,
    shedding_nway,
    spill,
    streaming,
)
from conftest import read_csv, refused

# ----- every option documented ------------------------------------------------------------------

class _Parsed(Exception):
    pass


@pytest.mark.parametrize("module, argv", [
    (shedding, ["fig7"]), (shedding_analysis, ["fig5"]), (shedding_analysis, ["fig6"]),
    (shedding_nway, []), (spill, ["figures"]), (adaptive_ordering, []), (streaming, []),
    (cacq, ["fig8"]), (cacq_fig11, ["fig11a"]), (acaching_figures, ["fig6"])])
def test_every_option_has_a_help_text(module, argv, monkeypatch):
    parsers = []

    def grab(self, *args, **kwargs):
        parsers.append(self)
        raise _Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", grab)
    with pytest.raises(_Parsed):
        module.main(argv)
    todo, missing = list(parsers), []
    while todo:
        p = todo.pop()
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                todo += action.choices.values()
            elif action.help != argparse.SUPPRESS and not action.help:
                missing.append(f"{p.prog} {action.dest}")
    assert not missing


# ----- bench.shedding ---------------------------------------------------------------------------

def test_shedding_perf_writes_and_prints_its_own_files(tmp_path, capsys):
    """perf printed 'wrote perf.csv, perf.png' but wrote fig15.csv and fig15.png."""
    assert shedding.main(["perf", "--runs", "1", "--duration", "3", "--rates", "100",
                          "--out", str(tmp_path)]) == 0
    assert not (tmp_path / "fig15.csv").exists() and not (tmp_path / "fig15.png").exists()
    rows = read_csv(tmp_path / "perf.csv")
    assert {r["policy"] for r in rows} == {"random", "selective"}
    assert (tmp_path / "perf.png").stat().st_size > 0
    assert f"wrote {tmp_path / 'perf.csv'}, {tmp_path / 'perf.png'}" in capsys.readouterr().out


@pytest.mark.parametrize("argv, names", [
    (["fig16", "--joins", "bogus"], ["--joins", "bogus"]),
    (["fig16", "--joins", "overlap"], ["--joins", "not used by fig16"]),
    (["fig16", "--window", "1", "--rates", "5"], ["--window", "--rates", "fig16"]),
    (["fig7", "--duration", "5"], ["--duration", "fig7"]),
    (["perf", "--rates-indexed", "5"], ["--rates-indexed", "perf"]),
    (["fig15", "--joins", "overlap", "--duration-indexed", "4"], ["--duration-indexed"]),
    (["fig14", "--parts", "inverted", "--window", "3"], ["--window"]),
    (["fig14", "--parts", "none", "--window-indexed", "3"], ["--window-indexed"]),
    (["fig14", "--parts", "bogus"], ["--parts", "bogus"]),
    (["perf", "--runs", "0"], ["--runs"]),
    (["perf", "--rates", "-5"], ["--rates"]),
    (["perf", "--capacity", "-1"], ["--capacity"]),
    (["fig16", "--ks", "abc"], ["--ks", "abc"]),
    (["fig17", "--types", "2.5"], ["--types"]),
    (["fig9", "--bin", "0"], ["--bin"]),
])
def test_shedding_refuses_bad_and_unread_options(argv, names, capsys):
    refused(shedding.main, argv, capsys, *names)


def test_shedding_analysis_refuses_bad_and_unread_options(capsys):
    refused(shedding_analysis.main, ["fig5", "--source", "normal", "--duration", "5",
                                      "--rate", "3", "--sample", "7"], capsys,
             "--duration", "--rate", "--sample", "--source normal")
    for opt, value in (("--bins", "0"), ("--sample", "0"), ("--duration", "-1"),
                       ("--rate", "0"), ("--seed", "-1")):
        refused(shedding_analysis.main, ["fig6", opt, value], capsys, opt)


def test_shedding_nway_refuses_a_zero_rate_and_writes_a_png(tmp_path, capsys):
    """--rate 0 ran at the default rate (`rate or default`); only nway.csv was written."""
    for opt, value in (("--rate", "0"), ("--runs", "0"), ("--cases", "bogus"),
                       ("--streams", "9"), ("--window", "-1"), ("--capacity", "0")):
        refused(shedding_nway.main, [opt, value], capsys, opt)
    assert shedding_nway.main(["--runs", "1", "--duration", "3", "--rate", "40", "--window",
                               "2", "--cases", "overlap", "--out", str(tmp_path)]) == 0
    assert len(read_csv(tmp_path / "nway.csv")) == 2
    assert (tmp_path / "nway.png").stat().st_size > 0
    assert f"{tmp_path / 'nway.png'}" in capsys.readouterr().out


# ----- bench.streaming --------------------------------------------------------------------------

def test_streaming_reuses_only_the_input_asked_for(tmp_path, capsys):
    """--r 2 after a run with r = 5 reused the r = 5 input of the same size."""
    five = streaming.workload_dir(tmp_path, 300, 5)
    two = streaming.workload_dir(tmp_path, 300, 2)
    assert five != two
    assert json.loads((two / "params.json").read_text())["params"]["r"] == 2
    assert json.loads((five / "params.json").read_text())["params"]["r"] == 5
    capsys.readouterr()
    assert streaming.workload_dir(tmp_path, 300, 5) == five  # reused: not written again
    assert "wrote the workload" not in capsys.readouterr().out
    # a folder whose params.json disagrees (an older layout, a partial write) is rewritten
    meta = json.loads((five / "params.json").read_text())
    meta["params"]["r"] = 3
    (five / "params.json").write_text(json.dumps(meta))
    streaming.workload_dir(tmp_path, 300, 5)
    assert json.loads((five / "params.json").read_text())["params"]["r"] == 5


def test_streaming_refuses_bad_values(tmp_path, capsys):
    for opt, value in (("--runs", "0"), ("--arrivals", "-3"), ("--r", "0")):
        refused(streaming.main, [opt, value, "--out", str(tmp_path)], capsys, opt)
    assert not (tmp_path / "runs.csv").exists()


# ----- bench.spill ------------------------------------------------------------------------------

def test_spill_rebuild_uses_the_seed_and_writes_a_png(tmp_path, capsys):
    """rebuild --seed 7 drew its join keys with random.Random(1) whatever the seed."""
    assert spill.main(["rebuild", "--rows", "300", "--repeats", "1", "--seed", "7",
                       "--out", str(tmp_path)]) == 0
    (row,) = read_csv(tmp_path / "rebuild.csv")
    assert row["seed"] == "7"  # reported by the child process that drew the keys
    assert (tmp_path / "rebuild.png").stat().st_size > 0


def test_spill_formats_writes_a_png(tmp_path):
    assert spill.main(["formats", "--arrivals", "2000", "--out", str(tmp_path)]) == 0
    assert len(read_csv(tmp_path / "formats.csv")) == 5
    assert (tmp_path / "formats.png").stat().st_size > 0


def test_spill_perf_writes_a_png(tmp_path, monkeypatch):
    """perf's runs replaced by canned ones (the real run is test_spill_cli's, 20 s):
    perf.png is drawn from what perf.csv holds."""
    def fake_folder(root, name, arrivals, args):
        return root / name, SimpleNamespace(params={"tuple_range": 1000})

    def fake_fresh(folder, spill_options):
        r = {"results": 1000, "runtime_results": 600 if spill_options else 1000,
             "engine_cpu_s": 2.0, "cleanup_cpu_s": 0.5 if spill_options else 0,
             "end_cleanup_cpu_s": 0.1, "spills": 3, "cleanups": 2, "cleanup_writebacks": 5,
             "peak_state_model": 10_000_000, "peak_rss": 300 * 2**20, "rss_before": 250 * 2**20}
        return r

    monkeypatch.setattr(spill, "_workload_folder", fake_folder)
    monkeypatch.setattr(spill, "_fresh", fake_fresh)
    assert spill.main(["perf", "--arrivals", "50000", "--out", str(tmp_path)]) == 0
    assert len(read_csv(tmp_path / "perf.csv")) == 3
    assert (tmp_path / "perf.png").stat().st_size > 0


@pytest.mark.parametrize("argv, name", [
    (["figures", "--budget-fraction", "-1"], "--budget-fraction"),
    (["figures", "--budget-fraction", "1.5"], "--budget-fraction"),
    (["figures", "--figures", "17"], "--figures"),
    (["figures", "--arrivals", "3"], "--arrivals"),
    (["perf", "--ratios", "1,2"], "--ratios"),
    (["perf", "--window", "0"], "--window"),
    (["spark", "--memory", "lots"], "--memory"),
    (["spark", "--repeats", "0"], "--repeats"),
    (["rebuild", "--rows", "0"], "--rows"),
    (["rebuild", "--seed", "-1"], "--seed"),
])
def test_spill_refuses_bad_values(argv, name, capsys):
    refused(spill.main, argv, capsys, name)


# ----- bench.adaptive_ordering ------------------------------------------------------------------

@pytest.mark.parametrize("argv, name", [
    (["--runs", "0"], "--runs"),  # "A-Greedy profiled no tuple", blaming the engine
    (["--chunk", "0"], "--chunk"),
    (["--p", "5"], "--p"),
    (["--seconds", "-2"], "--seconds"),  # "n_updates ... -4000"
    (["--seconds", "0.0001"], "--seconds"),
    (["--alpha", "0.5"], "--alpha"),
    (["--W", "0"], "--W"),
])
def test_adaptive_ordering_refuses_bad_values(argv, name, tmp_path, capsys):
    refused(adaptive_ordering.main, [*argv, "--out", str(tmp_path)], capsys, name)


# ----- bench.cacq, cacq_fig11, acaching_figures ------------------------------------------------

@pytest.mark.parametrize("module, argv, name", [
    ("cacq", ["fig8", "--runs", "0"], "--runs"),  # once ran with the default 3 runs
    ("cacq", ["fig8", "--runs", "-1"], "--runs"),
    ("cacq", ["fig9", "--runs", "2"], "not used by fig9"),
    ("cacq_fig11", ["fig11a", "--runs", "0"], "--runs"),
    ("cacq_fig11", ["fig11a", "--seed", "-1"], "--seed"),
    ("acaching_figures", ["fig6", "--runs", "0"], "--runs"),
    ("acaching_figures", ["fig6", "--runs", "-1"], "--runs"),
    ("acaching_figures", ["fig12", "--runs", "2"], "not used by fig12"),
])
def test_cacq_and_acaching_refuse_bad_runs(module, argv, name, tmp_path, capsys):
    main = importlib.import_module(f"adaptcq.bench.{module}").main
    refused(main, [*argv, "--out", str(tmp_path)], capsys, name)
