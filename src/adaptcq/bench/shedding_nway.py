"""Benchmark: selective processing inside n-way MJoin pipelines against random dropping
(beyond load-shedding.txt; issue 13 item 7: "say where it pays and where not").

A chain R ⋈ S ⋈ T (``--streams``) of the §6.1 workload, each link with the paper's time
correlation (stream k shifted by k·τ), joined by set overlap without an index, by equality
without an index, and by equality with hash indexes, at one CPU capacity on the virtual
clock; selective processing (rate and per-step time-correlation adaptation) against the
random-drop baseline, in the same process on the same input. The paper's Figure 15 finds no
gain for indexed equi-joins (a hash probe costs the same whatever part of the window it
would look at); this measures whether that carries over to pipelines.

    python -m adaptcq.bench.shedding_nway [--streams 3] [--rate R] [--window 10]
        [--duration 60] [--runs 3] [--capacity 156250] [--out results/shedding]

Writes ``nway.csv`` (case, run, policy, results, work, r_min, drops, estimated_lost) and
prints the medians of the selective / random output ratios.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from adaptcq.bench.shedding import CAPACITY, _rows
from adaptcq.bench.spark_scale import write_csv

CASES = {  # name -> (join, index, overlap threshold, default rate: enough to overload)
    "overlap": ("overlap", "none", 3, 200.0),
    "equality": ("equality", "none", 0, 200.0),
    "equality-hash": ("equality", "hash", 0, 2000.0),
}


def run_case(case: str, streams: int, rate: float, window: float, duration: float,
             policy: str, capacity: float, seed: int) -> dict:
    from adaptcq.adapt.shed_control import ShedController
    from adaptcq.engine.continuous import ContinuousQuery
    from adaptcq.query.cql import parse_query
    from adaptcq.stream.shed_workload import shed_two_way

    join, index, threshold, default_rate = CASES[case]
    rate = rate or default_rate
    kw = {"threshold": threshold} if join == "overlap" else {}
    wl = shed_two_way(duration=duration, rate=rate, window=window, join=join, seed=seed,
                      streams=streams, **kw)
    kinds = {n: {f.name: ("list" if str(f.type).startswith("list") else "number")
                 for f in t.schema} for n, t in wl.tables.items()}
    q = parse_query(wl.sql, kinds)
    arrivals, ts, rows = _rows(wl, q)
    ctl = ShedController("selective") if policy == "selective" else None
    cq = ContinuousQuery(q, "shed", "append", shed=policy, capacity=capacity,
                         basic_window=window / 20, index=index, controller=ctl, seed=seed)
    n = len(cq.process(arrivals, None, ts, rows)) + len(cq.finish())
    rep = cq.executor.report()
    return {"case": case, "run": seed, "policy": policy, "results": n,
            "work": rep["work_units"], "r_min": rep.get("fraction_r_min", 1.0),
            "drops": sum(rep["buffer_drops"].values()),
            "estimated_lost": round(rep["estimated_lost"], 4)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m adaptcq.bench.shedding_nway",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, default=3)
    ap.add_argument("--rate", type=float, default=None,
                    help="tuples/s per stream (default: 200, 2,000 for equality-hash, "
                    "whose hash probes need that much to overload the capacity)")
    ap.add_argument("--window", type=float, default=10.0)
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--capacity", type=float, default=CAPACITY)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--out", default="results/shedding")
    a = ap.parse_args(argv)
    cases = a.cases.split(",")
    bad = [c for c in cases if c not in CASES]
    if bad:
        ap.error(f"unknown case {bad[0]!r}; choose from {', '.join(CASES)}")
    rows = []
    for case in cases:
        for k in range(a.runs):
            for policy in ("random", "selective"):
                r = run_case(case, a.streams, a.rate, a.window, a.duration, policy,
                             a.capacity, k)
                rows.append(r)
                print(f"{case:14} run {k} {policy:9} results {r['results']:>9,}  r_min "
                      f"{r['r_min']:.4f}  drops {r['drops']:>7,}", flush=True)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    write_csv(rows, out / "nway.csv")
    print(f"{a.streams}-way chain, {a.window:g} s windows, capacity {a.capacity:,.0f} "
          f"units/s, rates {', '.join(f'{c}: {a.rate or CASES[c][3]:g}/s' for c in cases)}:")
    for case in cases:
        ratios = []
        for k in range(a.runs):
            pick = {r["policy"]: r["results"] for r in rows
                    if r["case"] == case and r["run"] == k}
            if pick.get("random"):
                ratios.append(pick["selective"] / pick["random"])
        if ratios:
            med = statistics.median(ratios)
            verdict = "pays" if med >= 1.2 else "does not pay" if med < 1.05 else "pays a little"
            print(f"  {case:14} selective / random output {med:.2f}x (median of "
                  f"{len(ratios)}: {', '.join(f'{x:.2f}' for x in ratios)}): {verdict}")
    print(f"wrote {out / 'nway.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
