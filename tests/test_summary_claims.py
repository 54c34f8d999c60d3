"""What run summaries claim is what happened (findings of /tmp/s19/r6):

1. the vectorized run's ``plan`` shows the orders the last batch ran, and
   ``order_changes`` counts only re-orderings a later batch ran;
4. A-Caching's ``cache_memory_peak_bytes`` covers a cache dropped between two size samples;
5. ``adaptcq run --executor acaching`` on one or two streams is refused (no candidate cache).
"""

from __future__ import annotations

import itertools
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import adaptcq
from adaptcq.adapt import make_policies
from adaptcq.adapt.acaching import ACaching
from adaptcq.adapt.batch_order import BatchOrdering
from adaptcq.cli import main
from adaptcq.stream.workloads import WORKLOADS, write_workload

SQL4 = ("SELECT R1.id AS r1, R2.id AS r2, R3.id AS r3, R4.id AS r4 FROM R1 [RANGE 0.2 SECONDS], "
        "R2 [RANGE 0.2 SECONDS], R3 [RANGE 0.2 SECONDS], R4 [RANGE 0.2 SECONDS] "
        "WHERE R1.a = R2.a AND R2.a = R3.a AND R3.a = R4.a")


@pytest.fixture(scope="module")
def four(tmp_path_factory):
    d = tmp_path_factory.mktemp("four")
    rng = np.random.default_rng(0)
    for name in ("R1", "R2", "R3", "R4"):
        n = 2000
        pq.write_table(pa.table({"ts": np.sort(rng.uniform(0, 2, n)), "id": np.arange(n),
                                 "a": rng.integers(0, 200, n)}), d / f"{name}.parquet")
    return {name: str(d / f"{name}.parquet") for name in ("R1", "R2", "R3", "R4")}


def plan_orders(plan: str) -> dict[str, str]:
    return {line.split("Δ")[1].split(":")[0]: line.split(": ")[1].rstrip(">")
            for line in plan.splitlines() if line.startswith("<vector pipeline")}


def run_recording(monkeypatch, sources, **options):
    """The run, and per batch the orders it ran (the executor's orders when the batch's
    observers are called: only the ordering policy changes them, after the batch)."""
    ran: list[dict[str, str]] = []
    original = BatchOrdering.__call__

    def call(self, executor):
        ran.append({a: "⋈".join(o) for a, o in executor.orders.items()})
        return original(self, executor)

    monkeypatch.setattr(BatchOrdering, "__call__", call)
    res = adaptcq.run(SQL4, sources, executor="vector", **options)
    return res, ran


def test_one_batch_reports_the_orders_it_ran_and_no_change(monkeypatch, four):
    res, ran = run_recording(monkeypatch, four)
    s = res.stats
    assert s["batches"] == 1 and len(ran) == 1
    assert plan_orders(res.plan) == ran[0]
    assert s["order_changes"] == 0
    for a, order in plan_orders(res.plan).items():
        assert s["orders_used"][a] == {order: 1}


def test_many_batches_count_the_changes_a_batch_ran(monkeypatch, four):
    res, ran = run_recording(monkeypatch, four, batch_rows=500)
    s = res.stats
    assert s["batches"] == len(ran) >= 10
    assert plan_orders(res.plan) == ran[-1]
    used = sum(prev[a] != cur[a] for prev, cur in itertools.pairwise(ran) for a in cur)
    assert s["order_changes"] == used
    for a in ran[0]:  # the per-pipeline counts of orders_used are the batches that ran them
        counts: dict[str, int] = {}
        for r in ran:
            counts[r[a]] = counts.get(r[a], 0) + 1
        assert s["orders_used"][a] == counts


def test_the_cli_summary_plan_is_the_last_batch(four, capsys):
    argv = ["run", "--sql", SQL4, "--no-progress", "--summary-json", "-"]
    for k, v in four.items():
        argv += ["--input", f"{k}={v}"]
    assert main(argv) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["batches"] == 1 and s["order_changes"] == 0
    for a, order in plan_orders(s["plan"]).items():
        assert order in s["orders_used"][a]


# ----- 4. the peak cache memory ---------------------------------------------------------------
def test_peak_cache_memory_covers_a_cache_dropped_between_samples(monkeypatch, tmp_path):
    wl = WORKLOADS["three-way"](n_updates=40000, seed=0)
    write_workload(wl, str(tmp_path))
    src = {n: str(tmp_path / f"{n}.parquet") for n in "RST"}
    sql = ("SELECT R.id AS r FROM R [RANGE 0.5 SECONDS], S [RANGE 0.5 SECONDS], "
           "T [RANGE 0.5 SECONDS] WHERE R.a = S.a AND S.b = T.b")
    seen: list[int] = []  # the total size of the caches in use, at the start of each tick
    original = ACaching.on_interval

    def on_interval(self, cq, ts):
        seen.append(sum(st.cache.size_bytes() for st in self.states.values()
                        if st.state == "used" and st.cache is not None))
        return original(self, cq, ts)

    monkeypatch.setattr(ACaching, "on_interval", on_interval)
    r = adaptcq.run(sql, src, timestamp="ts", executor="mjoin", mode="retract",
                    nested_loop=["S.b"],
                    policies=make_policies(optimizer="qaware", reorder="agreedy", caching={}))
    s = r.stats
    drops = [h for h in s["cache_history"] if h["event"] == "drop"]
    assert drops and max(seen) > 0
    assert s["cache_memory_peak_bytes"] >= max(seen)


# ----- 5. A-Caching on one or two streams ----------------------------------------------------
@pytest.fixture(scope="module")
def rst(tmp_path_factory):
    d = tmp_path_factory.mktemp("rst")
    rng = np.random.default_rng(0)
    for n in "RST":
        pq.write_table(pa.table({"ts": np.sort(rng.uniform(0, 10, 500)), "id": np.arange(500),
                                 "a": rng.integers(0, 20, 500)}), d / f"{n}.parquet")
    return {n: str(d / f"{n}.parquet") for n in "RST"}


SQL2 = "SELECT R.id AS r, S.id AS s FROM R [RANGE 1 SECONDS], S [RANGE 1 SECONDS] WHERE R.a = S.a"
SQL1 = "SELECT R.id AS r FROM R [RANGE 1 SECONDS]"
SQL3 = ("SELECT R.id AS r FROM R [RANGE 1 SECONDS], S [RANGE 1 SECONDS], T [RANGE 1 SECONDS] "
        "WHERE R.a = S.a AND S.a = T.a")


@pytest.mark.parametrize("sql, streams, what", [
    (SQL2, "RS", ("this query joins two streams (R, S): each pipeline has a single join "
                  "(ΔR: S, ΔS: R), so there is nothing to cache")),
    (SQL1, "R", "this query reads one stream (R): it has no join, so there is nothing to cache"),
])
@pytest.mark.parametrize("extra, dropped", [
    ([], "drop --executor acaching (caching"),
    (["--caches", "global", "--cache-memory", "1000000"],
     "drop --executor acaching and --caches and --cache-memory (caching"),
])
def test_acaching_with_nothing_to_cache_is_refused(rst, capsys, sql, streams, what, extra,
                                                   dropped):
    argv = ["run", "--sql", sql, "--executor", "acaching", *extra, "--no-progress"]
    for n in streams:
        argv += ["--input", f"{n}={rst[n]}"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert what in err and dropped in err and "Traceback" not in err


def test_acaching_on_three_streams_runs_and_the_api_accepts_two(rst, capsys, tmp_path):
    argv = ["run", "--sql", SQL3, "--executor", "acaching", "--no-progress",
            "--summary-json", str(tmp_path / "s.json")]
    for n in "RST":
        argv += ["--input", f"{n}={rst[n]}"]
    assert main(argv) == 0
    assert json.loads((tmp_path / "s.json").read_text())["cache_candidates"] > 0
    # The Python API accepts the policy on two streams (documented): it has no candidate.
    r = adaptcq.run(SQL2, {n: rst[n] for n in "RS"}, executor="acaching")
    assert r.stats["cache_candidates"] == 0
