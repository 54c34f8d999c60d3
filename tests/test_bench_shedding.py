"""Smoke tests of the load-shedding benchmark (bench/shedding.py, load-shedding.txt §6):
every figure subcommand on tiny parameters writes its CSV and PNG with the expected
columns and values. Never on timing."""

from __future__ import annotations

import csv

import pytest

from adaptcq.bench.shedding import main, prepare, run_join


def _csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _run(tmp_path, *args):
    assert main([*args, "--out", str(tmp_path)]) == 0
    name = args[0]
    assert (tmp_path / f"{name}.png").stat().st_size > 0
    return _csv(tmp_path / f"{name}.csv")


def test_run_join_measures_after_the_warmup():
    prep = prepare(6.0, 100.0, 2.0, seed=1)
    whole = run_join(prep, "random", 2000.0)
    later = run_join(prep, "random", 2000.0, warmup=3.0, bin_seconds=1.0)
    assert whole["results"] == later["results"]          # the same run, deterministic
    assert later["measured"] <= later["results"]
    assert sum(later["bins"]) == later["results"]
    assert later["arrivals_R"] + later["arrivals_S"] < sum(
        len(t) for t in prep["workload"].tables.values())
    assert 0 <= later["drop_fraction"] <= 1
    with pytest.raises(ValueError):
        run_join(prep, "bogus", 2000.0)


def test_fig7(tmp_path, capsys):
    rows = _run(tmp_path, "fig7", "--rates", "50", "--windows", "2,4",
                "--windows-indexed", "4", "--measure", "2", "--capacity", "2000")
    assert {(r["index"], r["window"]) for r in rows} == {
        ("none", "2.0"), ("none", "4.0"), ("inverted", "4.0")}
    for r in rows:
        assert 0 <= float(r["drop_fraction"]) <= 1
        assert 0 <= float(r["drop_sum"]) <= 2
        assert int(r["drops_R"]) <= int(r["arrivals_R"])
    # overloaded at this capacity: random dropping drops
    assert all(float(r["drop_sum"]) > 0 for r in rows)
    assert "indexed join drops less" in capsys.readouterr().out


def test_fig9(tmp_path, capsys):
    rows = _run(tmp_path, "fig9", "--duration", "70", "--window", "2", "--bin", "5",
                "--runs", "1", "--capacity", "20000")
    assert {r["policy"] for r in rows} == {"random", "partial"}
    assert {float(r["time"]) for r in rows} == {5.0 * k for k in range(15)}
    series = _csv(tmp_path / "fig9_r.csv")
    assert series and {r["policy"] for r in series} == {"partial"}
    assert all(0 < float(r["r"]) <= 1 for r in series)
    out = capsys.readouterr().out
    assert "rate adaptation improves the output at 500 tuples/s" in out


def test_fig10(tmp_path):
    rows = _run(tmp_path, "fig10", "--duration", "10", "--windows", "2,3",
                "--kappas", "0.6,1.0", "--runs", "1", "--capacity", "20000")
    assert len(rows) == 2 * 2 * 2
    assert {(r["window"], r["kappa"], r["policy"]) for r in rows} == {
        (w, k, p) for w in ("2.0", "3.0") for k in ("0.6", "1.0")
        for p in ("random", "partial")}
    assert all(float(r["rate"]) >= 0 for r in rows)


def test_fig12(tmp_path, capsys):
    rows = _run(tmp_path, "fig12", "--duration", "70", "--window", "2", "--bw", "0.5",
                "--bin", "5", "--runs", "1", "--capacity", "20000")
    assert {r["policy"] for r in rows} == {"partial", "selective-nodir", "selective"}
    series = _csv(tmp_path / "fig12_r.csv")
    sel = [r for r in series if r["policy"] == "selective"]
    assert sel and all(0 <= float(r["r_1"]) <= 1 and 0 <= float(r["r_2"]) <= 1 for r in sel)
    assert "join direction adds more" in capsys.readouterr().out


def test_fig13(tmp_path):
    rows = _run(tmp_path, "fig13", "--duration", "10", "--window", "2",
                "--kappas", "0.6,1.0", "--runs", "1", "--capacity", "20000")
    assert len(rows) == 2 * 3
    assert {r["policy"] for r in rows} == {"partial", "selective-nodir", "selective"}


def test_fig14(tmp_path, capsys):
    rows = _run(tmp_path, "fig14", "--rate", "100", "--window", "2", "--window-indexed", "3",
                "--bws", "0.5,1", "--kappas", "0.8", "--measure", "2",
                "--capacity", "20000")
    assert {(r["index"], r["basic_window"]) for r in rows} == {
        (p, b) for p in ("none", "inverted", "inverted-id") for b in ("0.5", "1.0", "none")}
    assert all(r["policy"] == ("partial" if r["basic_window"] == "none" else "selective")
               for r in rows)
    assert {r["window"] for r in rows if r["index"] == "none"} == {"2.0"}
    assert {r["window"] for r in rows if r["index"] != "none"} == {"3.0"}
    assert "identifier-sorted lists give less output" in capsys.readouterr().out


def test_fig15_indexed_defaults(tmp_path):
    rows = _run(tmp_path, "fig15", "--joins", "overlap,overlap-indexed", "--rates", "100",
                "--rates-indexed", "50", "--duration", "3", "--duration-indexed", "4",
                "--runs", "1")
    got = {(r["join"], r["rate"], r["duration"], r["policy"]) for r in rows}
    assert got == {("overlap", "100.0", "3.0", p) for p in ("random", "selective")} | {
        ("overlap-indexed", "50.0", "4.0", p) for p in ("random", "selective")}


def test_fig17(tmp_path, capsys):
    rows = _run(tmp_path, "fig17", "--types", "2,3,4", "--factors", "10", "--duration", "4",
                "--runs", "1", "--capacity", "20000")
    assert {(r["types"], r["utility_shedding"]) for r in rows} == {
        (z, u) for z in ("2", "3", "4") for u in ("True", "False")}
    assert all(float(r["utility"]) >= 0 for r in rows)
    assert "decreases at first with |Z|" in capsys.readouterr().out
