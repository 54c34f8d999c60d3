"""The vectorized executor's benchmark runs end to end on tiny inputs (no timing asserted)."""

from __future__ import annotations

import csv

from adaptcq.bench.vector import main


def test_quick_benchmark_writes_its_tables_and_every_executor_agrees(tmp_path, capsys):
    assert main(["--quick", "--workloads", "chain,star", "--batches", "500,20000",
                 "--executors", "vector,mjoin", "--no-memory", "--out", str(tmp_path)]) == 0
    with open(tmp_path / "summary.csv") as f:
        summary = list(csv.DictReader(f))
    assert {(r["workload"], r["executor"], r["batch"]) for r in summary} == {
        (w, e, b) for w in ("chain", "star")
        for e, b in (("vector", "500"), ("vector", "20000"), ("mjoin", ""))}
    assert all(r["results_agree"] == "True" for r in summary)
    assert (tmp_path / "throughput.png").stat().st_size > 0
    out = capsys.readouterr().out
    assert "target chain" in out and "MISMATCH" not in out
