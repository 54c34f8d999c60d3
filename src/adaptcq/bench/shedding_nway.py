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
``nway.png`` (the median output of each policy per case), and prints the medians of the
selective / random output ratios: over the runs where some policy shed load and random
dropping gave results (the others are named, left out; none left: "not measured").
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from adaptcq.bench._args import choices, positive_float, positive_int
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
    rate = default_rate if rate is None else rate  # (not `or`: a rate of 0 is no default)
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


def _streams(text: str) -> int:
    """``--streams``: the chain's length, 2 to 8 (``shed_two_way``'s stream names)."""
    n = positive_int(text)
    if not 2 <= n <= 8:
        raise argparse.ArgumentTypeError(f"{n} must be from 2 to 8")
    return n


def _rate(case: str, rate: float | None) -> float:
    return CASES[case][3] if rate is None else rate


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m adaptcq.bench.shedding_nway",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=_streams, default=3,
                    help="streams in the chain R ⋈ S ⋈ T ..., 2 to 8 (default 3)")
    ap.add_argument("--rate", type=positive_float, default=None,
                    help="tuples/s per stream (default: 200, 2,000 for equality-hash, "
                    "whose hash probes need that much to overload the capacity)")
    ap.add_argument("--window", type=positive_float, default=10.0,
                    help="window of every stream, seconds (default 10)")
    ap.add_argument("--duration", type=positive_float, default=60.0,
                    help="event seconds per run (default 60)")
    ap.add_argument("--runs", type=positive_int, default=3,
                    help="runs per case and policy (seeds 0..N-1), median reported "
                    "(default 3)")
    ap.add_argument("--capacity", type=positive_float, default=CAPACITY,
                    help=f"CPU capacity, work units per second of event time (default "
                    f"{CAPACITY:,.0f}, bench.shedding's)")
    ap.add_argument("--cases", type=choices(CASES), default=list(CASES),
                    metavar="CASE,...", help="joins, comma-separated, from "
                    f"{', '.join(CASES)} (default all)")
    ap.add_argument("--out", default="results/shedding",
                    help="folder for nway.csv and nway.png (default %(default)s)")
    a = ap.parse_args(argv)
    cases = a.cases
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
    _plot(rows, cases, out / "nway.png", a)
    print(f"{a.streams}-way chain, {a.window:g} s windows, capacity {a.capacity:,.0f} "
          f"units/s, rates {', '.join(f'{c}: {_rate(c, a.rate):g}/s' for c in cases)}:")
    for case in cases:
        print(f"  {case:14} selective / random output: "
              + _summary([r for r in rows if r["case"] == case], a.runs))
    print(f"wrote {out / 'nway.csv'}, {out / 'nway.png'}")
    return 0


def _shed(r: dict) -> bool:
    """The run shed load: tuples dropped, or windows processed in part (r_min < 1)."""
    return r["drops"] > 0 or r["r_min"] < 1


def _summary(rows: list[dict], runs: int) -> str:
    """One case's selective / random output ratio, the median over the runs that measure
    one, and which runs were left out and why: a run where neither policy shed anything
    (no overload: both process everything, the ratio is 1 by construction) or where random
    dropping gave 0 results (no ratio). No run left: "not measured", the hint fitting the
    reason (more load for no overload, more arrivals or capacity for no results)."""
    ratios, idle, empty = [], [], []
    for k in range(runs):
        pick = {r["policy"]: r for r in rows if r["run"] == k}
        rnd, sel = pick["random"], pick["selective"]
        if not (_shed(rnd) or _shed(sel)):
            idle.append(f"run {k}")
        elif rnd["results"]:
            ratios.append(sel["results"] / rnd["results"])
        else:
            empty.append(f"run {k} (selective {sel['results']:,})")
    gone = [(why, runs_) for why, runs_ in (
        ("no overload, neither policy shed anything", idle),
        ("random dropping gave 0 results", empty)) if runs_]
    if ratios:
        med = statistics.median(ratios)
        verdict = "pays" if med >= 1.2 else "does not pay" if med < 1.05 else "pays a little"
        left = "; ".join(f"{why}: {', '.join(r)}" for why, r in gone)
        return (f"{med:.2f}x (median of {len(ratios)}: {', '.join(f'{x:.2f}' for x in ratios)})"
                f": {verdict}" + (f"; left out, {left}" if gone else ""))
    hints = []
    if idle:  # more load than the capacity: only then does a policy choose what to keep
        hints.append("for an overload raise --rate or --streams, or lower --capacity")
    if empty:
        hints.append("for results raise --duration or --capacity, or lower --rate")
    every = " in every run" if len(gone) == 1 else ""
    left = "; ".join(f"{why}{every}: {', '.join(r)}" for why, r in gone)
    return f"not measured ({left}; {'; '.join(hints)})"


def _plot(rows: list[dict], cases: list[str], path: Path, a) -> None:
    """nway.csv as bars: the median output of each policy per case (its ratio above)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    med = {(c, p): statistics.median(r["results"] for r in rows
                                     if r["case"] == c and r["policy"] == p)
           for c in cases for p in ("random", "selective")}
    fig, ax = plt.subplots(figsize=(1.8 * len(cases) + 2.5, 3.8))
    for j, (policy, color) in enumerate((("random", "#4c72b0"), ("selective", "#dd8452"))):
        xs = [i + (j - 0.5) * 0.38 for i in range(len(cases))]
        ax.bar(xs, [med[(c, policy)] for c in cases], 0.38, color=color,
               label=f"{policy} (median of {a.runs})")
    for i, c in enumerate(cases):
        if med[(c, "random")]:
            ax.annotate(f"{med[(c, 'selective')] / med[(c, 'random')]:.2f}×",
                        (i, max(med[(c, "random")], med[(c, "selective")])),
                        ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(cases)), [f"{c}\n{_rate(c, a.rate):g}/s" for c in cases])
    ax.set_ylabel("results")
    ax.set_title(f"{a.streams}-way chain, {a.window:g} s windows, capacity "
                 f"{a.capacity:,.0f} units/s", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
