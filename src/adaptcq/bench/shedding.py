"""Benchmark: CPU load shedding by selective processing against random dropping
(load-shedding.txt §6, Figures 7, 8–10, 11–13, 14, 15, 16 and 17; issue 13's
performance check).

Every figure runs the §6.1 workload (``stream.shed_workload.shed_two_way``: set-valued
tuples, Zipf popularity κ, cycle period ς = 2w, time shift τ = 5/8·ς unless stated,
overlap threshold 3) through the load-shedding join at a fixed CPU capacity on the virtual
work clock, and compares shedding policies measured in the same process on the same
input:

- ``random``: the §6.1 baseline (full processing, random drops from the input buffers);
- ``partial``: rate adaptation only (Algorithm 1; windows processed newest first);
- ``selective-nodir``: rate and time correlation adaptation (Algorithms 1–3);
- ``selective``: all three adaptations (plus join direction, Algorithm 4).

The capacity. The paper's machine is not ours; we take its capacity from Figure 7's
statement that a non-indexed overlap join at 50 tuples/s per stream with 125 s windows
drops about half of its tuples: random dropping then keeps 25 tuples/s per stream, which
costs 2 · 25 · (25 · 125) = 156,250 comparisons per second. That is the default
``--capacity`` for every figure (work units per second of event time; a unit is one tuple
comparison, one index entry or list lookup, or one insertion). ``fig7`` re-measures the
statement as a consistency check. With it a non-indexed 20 s join is already overloaded at
100 tuples/s (2 · 100 · 100 · 20 = 400,000 units/s), where the paper's Figures 8–9 show no
shedding: our r is below 1 from the start of Figures 8–13, and the gains appear in every
phase, not only in the bursts.

Figures (defaults in brackets; fewer points and runs than the paper, to keep each default
run under about 8 minutes on one core):

- ``fig7`` (§6.2): random dropping's input drop rate (the sum of the two streams' dropped
  fractions, as the paper plots it; also the overall fraction) against the window size,
  non-indexed and with the inverted index, per stream rate; measured over ``--measure``
  seconds after the windows filled.
- ``fig9`` (§6.3, with Figure 8's r): the "fig8" rate profile, τ = 0, w = 20 s;
  rate adaptation (``partial``) against random dropping: output per ``--bin`` seconds and r
  per T_r.
- ``fig10`` (§6.3): average output rate over the Figure 8 period against κ, per window.
- ``fig12`` (§6.4, with Figure 11's r_1, r_2): the "fig11" profile (an approximation: the
  paper does not give it), w = 20 s, b = 1 s; partial, selective-nodir and selective.
- ``fig13`` (§6.4): average output against κ for the three settings, threshold 4.
- ``fig14`` (§6.4.2): average output rate after the windows filled against the basic
  window size b at 500 tuples/s, per κ: non-indexed w = 20 s, and w = 200 s with the
  time-ordered (``inverted``) and identifier-sorted (``inverted-id``) inverted indexes.
  "none" is partial processing (rate adaptation only, no basic-window selection), the
  paper's run without basic windows: the engine still keeps basic windows of w/20 for
  expiry, but partial processing reads the window newest first as one piece.
- ``fig15`` (§6.4.1): selective processing against random dropping per stream rate and
  join (overlap or equality, indexed or not). The indexed joins have 200 s windows, which
  need runs longer than 200 s to fill: by default they run 300 s (``--duration-indexed``)
  at 100, 300 and 500 tuples/s only, the non-indexed ones 60 s at 100–500 tuples/s (the
  default sweep takes about 10 minutes).
- ``fig16``/``fig17`` (§6.5): output utility of selective processing with and without
  utility-based shedding (Algorithm 5 against Algorithm 4); Figure 16 over the utility
  skewness k for three type-frequency models, Figure 17 over the number of tuple types |Z|
  for value difference factors (inverse type frequencies).
- ``perf``: the issue's check (Figure 15's non-indexed overlap join at 500 tuples/s).

The shedder's own overhead is measured as CPU time: the adaptation steps (Algorithms 1,
2, 4) timed inside the controller, against the run's CPU time.

    python -m adaptcq.bench.shedding fig7 [--rates 50,100,200] [--windows 25,50,75,100,125]
        [--windows-indexed 125,375,625] [--measure 30] [--runs 1]
    python -m adaptcq.bench.shedding fig9 [--duration 150] [--window 20] [--bin 5] [--runs 3]
    python -m adaptcq.bench.shedding fig10 [--kappas 0.4,0.6,0.8,1.0] [--windows 10,20]
        [--duration 150] [--runs 2]
    python -m adaptcq.bench.shedding fig12 [--duration 150] [--window 20] [--bw 1] [--bin 5]
        [--runs 3]
    python -m adaptcq.bench.shedding fig13 [--kappas 0.4,0.6,0.8,1.0] [--threshold 4]
        [--duration 150] [--runs 2]
    python -m adaptcq.bench.shedding fig14 [--bws 0.25,0.5,1,2,5,10] [--kappas 0.6,0.8]
        [--rate 500] [--window 20] [--window-indexed 200] [--measure 40]
        [--parts none,inverted,inverted-id] [--runs 1]
    python -m adaptcq.bench.shedding fig15 [--rates 100,200,300,400,500] [--duration 60]
        [--duration-indexed 300] [--joins overlap,overlap-indexed,equality,equality-indexed]
        [--runs 3]
    python -m adaptcq.bench.shedding perf [--runs 3]   # the issue's check: 500 tuples/s,
                                                       # non-indexed overlap
    python -m adaptcq.bench.shedding fig16 [--ks 0,1,2,3,4] [--duration 60] [--runs 3]
    python -m adaptcq.bench.shedding fig17 [--types 2,4,8,16] [--factors 10,100]
        [--duration 60] [--runs 3]

Every command also takes ``--capacity`` (156250) and ``--out`` (results/shedding), and
writes ``<figure>.csv`` and ``<figure>.png`` under OUT (the time-series figures also
``fig9_r.csv`` and ``fig12_r.csv``: r, r_1, r_2 per T_r; ``fig15_series.csv``, or
``perf_series.csv`` for perf: those of the last selective run), prints the numbers, and
prints each of the paper's observations as a check, HOLDS or DOES NOT HOLD, with the numbers
behind it, or "not measured" with the reason where the run cannot tell (a trend over one
value, no output to compare with, windows that never filled, no overload). List options are
taken in ascending order, repeats dropped. An option the figure does not read is refused
(``--help`` lists who reads what).
"""

from __future__ import annotations

import argparse
import bisect
import math
import statistics
import sys
import time
from pathlib import Path

from adaptcq.bench._args import (
    choices,
    comma_list,
    nonnegative_float,
    number_in,
    physical_memory,
    positive_float,
    positive_int,
    refuse_oversized,
    refuse_unused,
    whole_at_least,
)
from adaptcq.bench.spark_scale import write_csv

CAPACITY = 156_250.0  # work units per second (see the module docstring)
JOINS = {  # name -> (join, window, index)
    "overlap": ("overlap", 20.0, "none"),
    "overlap-indexed": ("overlap", 200.0, "inverted"),
    "equality": ("equality", 20.0, "none"),
    "equality-indexed": ("equality", 200.0, "hash"),
}
POLICIES = ("random", "partial", "selective-nodir", "selective")
LABELS = {"random": "random drop", "partial": "rate adaptation",
          "selective-nodir": "+ time correlation", "selective": "+ join direction"}
SETTINGS = ("partial", "selective-nodir", "selective")  # Figures 12 and 13


# ----- running the join ----------------------------------------------------------------------
def _rows(wl, query):
    """The workload's arrivals in time order (R first on ties), as engine rows."""
    cols = {a: query.columns[a] for a in query.aliases}
    items = []
    for i, a in enumerate(query.aliases):
        t = wl.tables[a]
        data = [t.column(c).to_pylist() for c in cols[a]]
        ts = t.column("ts").to_pylist()
        items += [(ts[k], i, k, tuple(d[k] for d in data)) for k in range(len(ts))]
    items.sort(key=lambda x: (x[0], x[1], x[2]))
    return [x[1] for x in items], [x[0] for x in items], [x[3] for x in items]


def prepare(duration: float, rate: float | str = 500.0, window: float = 20.0, *,
            kappa: float = 0.8, shift: float | None = None, threshold: int = 3,
            join: str = "overlap", utilities=None, frequencies: str = "uniform",
            seed: int = 0) -> dict:
    """The §6.1 workload parsed and turned into arrivals once, for several runs."""
    from adaptcq.query.cql import parse_query
    from adaptcq.stream.shed_workload import shed_two_way

    wl = shed_two_way(duration=duration, rate=rate, window=window, kappa=kappa, shift=shift,
                      threshold=threshold, join=join, utilities=utilities,
                      frequencies=frequencies, seed=seed)
    kinds = {n: {f.name: ("list" if str(f.type).startswith("list") else
                          "string" if str(f.type) == "string" else "number")
                 for f in t.schema} for n, t in wl.tables.items()}
    q = parse_query(wl.sql, kinds)
    types = None
    if utilities is not None:
        from adaptcq.runtime.shed import utility_types
        q, fns, values, _ = utility_types(q, wl.params["utility"], kinds)
        types = (fns, values)
    return {"workload": wl, "query": q, "arrivals": _rows(wl, q), "types": types,
            "window": window, "duration": float(wl.params["duration"]), "seed": seed}


def run_join(prep: dict, policy: str, capacity: float, *, basic_window: float | None = None,
             index: str = "none", warmup: float = 0.0, bin_seconds: float | None = None,
             utility: bool = True, seed: int | None = None) -> dict:
    """One run of the load-shedding join on prepared arrivals. ``policy``: one of
    :data:`POLICIES`. Drops, arrivals and ``rate`` (output per second) are measured from
    ``warmup`` seconds on; ``bins`` counts the output per ``bin_seconds`` of result time."""
    from adaptcq.adapt.shed_control import ShedController
    from adaptcq.engine.continuous import ContinuousQuery

    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; choose from {', '.join(POLICIES)}")
    seed = prep["seed"] if seed is None else seed
    ctl = None
    if policy == "partial":
        ctl = ShedController("partial")
    elif policy.startswith("selective"):
        ctl = ShedController("selective", direction=policy == "selective", utility=utility)
    shed = "selective" if policy.startswith("selective") else policy
    window = prep["window"]
    cq = ContinuousQuery(prep["query"], "shed", "append", shed=shed, capacity=capacity,
                         basic_window=window / 20 if basic_window is None else basic_window,
                         index=index, controller=ctl, types=prep["types"], seed=seed)
    streams, ts, rows = prep["arrivals"]
    split = bisect.bisect_left(ts, warmup) if warmup > 0 else 0
    ex = cq.executor
    t0 = time.process_time()
    out = cq.process(streams[:split], None, ts[:split], rows[:split]) if split else []
    drops0, arr0 = list(ex.drops), list(ex.arrivals)
    out += cq.process(streams[split:], None, ts[split:], rows[split:]) + cq.finish()
    cpu = time.process_time() - t0
    rep = ex.report()
    drops = [d - d0 for d, d0 in zip(ex.drops, drops0)]
    arrived = [a - a0 for a, a0 in zip(ex.arrivals, arr0)]
    span = max(prep["duration"] - warmup, 1e-9)
    measured = sum(1 for row in out if row[-1] >= warmup) if warmup > 0 else len(out)
    res = {"policy": policy, "results": len(out), "measured": measured,
           "rate": measured / span, "work": rep["work_units"],
           "r_min": rep.get("fraction_r_min", 1.0), "drops": sum(ex.drops),
           "drops_R": drops[0], "drops_S": drops[1], "arrivals_R": arrived[0],
           "arrivals_S": arrived[1],
           "drop_sum": sum(d / a for d, a in zip(drops, arrived) if a),
           "drop_fraction": sum(drops) / sum(arrived) if sum(arrived) else 0.0,
           "cpu": round(cpu, 3),
           "overhead": round(ctl.cpu / cpu, 5) if ctl is not None and cpu > 0 else 0.0,
           "estimated_lost": rep["estimated_lost"], "utility": ex.utility,
           "series": ctl.series_columns() if ctl is not None else None}
    if bin_seconds:
        nb = int(prep["duration"] // bin_seconds) + 1
        counts = [0] * nb
        for row in out:
            counts[min(int(row[-1] // bin_seconds), nb - 1)] += 1
        res["bins"] = counts
    return res


def run_one(join: str, rate: float, duration: float, policy: str, capacity: float,
            seed: int = 0) -> dict:
    """One Figure 15 run of the load-shedding join; returns its figures."""
    kind, window, index = JOINS[join]
    prep = prepare(duration, rate, window, join=kind, seed=seed)
    r = run_join(prep, policy, capacity, index=index)
    return {"join": join, "rate": rate, **{k: r[k] for k in (
        "policy", "results", "work", "r_min", "drops", "cpu", "overhead", "estimated_lost",
        "series")}}


def run_utility(k: float, frequencies: str, duration: float, capacity: float,
                utility_shedding: bool, seed: int = 0, utilities=None) -> dict:
    """One Figure 16 (or 17) run: tuple types with ``utilities`` (default Figure 16's
    {1, 1/2^k, 1/3^k}), selective processing with (Algorithm 5) or without (Algorithm 4)
    utility-based shedding; the output utility is measured the same way in both."""
    from adaptcq.stream.shed_workload import utilities_fig16

    utilities = utilities_fig16(k) if utilities is None else list(utilities)
    prep = prepare(duration, 500.0, 20.0, utilities=utilities, frequencies=frequencies,
                   seed=seed)
    r = run_join(prep, "selective", capacity, basic_window=1.0, utility=utility_shedding)
    return {"k": k, "frequencies": frequencies, "utility_shedding": utility_shedding,
            "results": r["results"], "utility": r["utility"], "run": seed}


# ----- shared helpers ----------------------------------------------------------------------
def _med(xs):
    xs = [x for x in xs if not math.isnan(x)]
    return statistics.median(xs) if xs else float("nan")


def _gain(new: float, base: float) -> float:
    return new / base - 1 if base else float("nan")


def check(claim: str, ok: bool | None, detail: str) -> bool | None:
    """Print one of the paper's observations with the verdict and its numbers; ``ok`` None
    when the run cannot tell (a trend over one value, a ratio to no output, no overload):
    "not measured", ``detail`` saying why, never a verdict from numbers that measured
    nothing."""
    verdict = "not measured" if ok is None else "HOLDS" if ok else "DOES NOT HOLD"
    print(f"paper: {claim} -> {verdict} ({detail})", flush=True)
    return ok


def _too_few(values, option: str, need: int = 2) -> str | None:
    """Why a trend along ``values`` (``option``'s, ascending) cannot be measured, or None."""
    if len(values) < need:
        return f"a trend over {option} needs at least {need} values, got {len(values)}"
    return None


def _unmeasured(*xs: float) -> bool:
    """Some of ``xs`` is NaN: a gain over a baseline that gave nothing, a median of none."""
    return any(math.isnan(x) for x in xs)


def _pct(x: float) -> str:
    return f"{x * 100:+.0f}%"


def _plot(path: Path, panels: list[dict]) -> None:
    """Line plots side by side; a panel: title, xlabel, ylabel, lines {label: (xs, ys)},
    optional logx."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4), squeeze=False)
    for ax, p in zip(axes[0], panels):
        for label, (xs, ys) in p["lines"].items():
            ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, label=label)
        if p.get("logx"):
            ax.set_xscale("log")
        ax.set_title(p["title"])
        ax.set_xlabel(p["xlabel"])
        ax.set_ylabel(p["ylabel"])
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _series_rows(series: dict, **extra) -> list[dict]:
    return [{**extra, **dict(zip(series, v))} for v in zip(*series.values())]


def _phases(profile: str, duration: float) -> list[tuple[float, float, float]]:
    """(start, end, rate) of each step of a rate profile within the run."""
    from adaptcq.stream.shed_workload import rate_profile
    steps = rate_profile(profile)
    out = []
    for k, (start, rate) in enumerate(steps):
        end = min(duration, steps[k + 1][0] if k + 1 < len(steps) else duration)
        if end > start:
            out.append((start, end, rate))
    return out


def _phase_rate(bins: list[int], bin_seconds: float, start: float, end: float) -> float:
    """Output per second over [start, end) from the per-bin counts (whole bins)."""
    lo, hi = int(start // bin_seconds), int(end // bin_seconds)
    picked = bins[lo:hi]
    return sum(picked) / (len(picked) * bin_seconds) if picked else float("nan")


# ----- Figure 7 ------------------------------------------------------------------------------
def fig7(rates, windows, windows_indexed, measure, runs, capacity, out: Path) -> list[dict]:
    rows = []
    for index, ws in (("none", windows), ("inverted", windows_indexed)):
        for rate in rates:
            for w in ws:
                for seed in range(runs):
                    prep = prepare(w + measure, rate, w, seed=seed)
                    r = run_join(prep, "random", capacity, index=index, warmup=w)
                    rows.append({"index": index, "rate": rate, "window": w, "run": seed,
                                 **{k: r[k] for k in (
                                     "drop_sum", "drop_fraction", "drops_R", "drops_S",
                                     "arrivals_R", "arrivals_S", "results", "work", "cpu")}})
                    print(f"fig7 {index:8} {rate:5g}/s w={w:5g}s run {seed}: drop rate "
                          f"(sum of both streams) {r['drop_sum']:.3f}, overall "
                          f"{r['drop_fraction']:.3f}  cpu {r['cpu']:.1f}s", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    write_csv(rows, out / "fig7.csv")

    def med(index, rate, w, key="drop_sum"):
        return _med([x[key] for x in rows if x["index"] == index and x["rate"] == rate
                     and x["window"] == w])

    _plot(out / "fig7.png", [
        {"title": f"Figure 7 ({name}): random drop", "xlabel": "window size (s)",
         "ylabel": "input drop rate (sum of both streams)",
         "lines": {f"{rate:g} tuples/s": (ws, [med(index, rate, w) for w in ws])
                   for rate in rates}}
        for name, index, ws in (("non-indexed", "none", windows),
                                ("inverted index", "inverted", windows_indexed))])
    for index, ws in (("none", windows), ("inverted", windows_indexed)):
        for rate in rates:
            print(f"{index:8} {rate:5g}/s: " + ", ".join(
                f"w={w:g}: {med(index, rate, w):.3f}" for w in ws))
    if 50.0 in rates and 125.0 in windows:
        f = med("none", 50.0, 125.0, "drop_fraction")
        check("non-indexed at 50 tuples/s and w = 125 s drops about half the tuples "
              "(how CAPACITY was derived)", 0.4 <= f <= 0.6,
              f"overall fraction {f:.3f}, sum of the streams' fractions "
              f"{med('none', 50.0, 125.0):.3f}; within [0.4, 0.6]")
    common = sorted(set(windows) & set(windows_indexed))
    pairs = [(rate, w, med("none", rate, w), med("inverted", rate, w))
             for rate in rates for w in common]
    if pairs:
        ok = all(i < n or n == 0 for _, _, n, i in pairs)
        check("the indexed join drops less than the non-indexed at the same window and rate",
              ok, "; ".join(f"{rate:g}/s w={w:g}: {n:.3f} vs {i:.3f}"
                            for rate, w, n, i in pairs))
    if 100.0 in rates and 625.0 in windows_indexed:
        f = med("inverted", 100.0, 625.0, "drop_fraction")
        print(f"paper (informative): indexed at 100 tuples/s, w = 625 s drops about a "
              f"quarter; here {f:.3f} overall (sum {med('inverted', 100.0, 625.0):.3f})")
    return rows


# ----- Figures 8 and 9 -------------------------------------------------------------------------
def _time_series_figure(name, profile, policies, duration, window, bin_seconds, runs,
                        capacity, out: Path, *, shift=None, basic_window=None):
    """Output over time per policy, r over time of the adaptive ones; returns (rows,
    series rows, per-policy per-phase median output rates, phases)."""
    rows, series_rows, runs_out = [], [], []
    for seed in range(runs):
        prep = prepare(duration, profile, window, shift=shift, seed=seed)
        per = {}
        for pol in policies:
            r = run_join(prep, pol, capacity, basic_window=basic_window,
                         bin_seconds=bin_seconds)
            per[pol] = r
            for k, c in enumerate(r["bins"]):
                rows.append({"run": seed, "policy": pol, "time": k * bin_seconds,
                             "results": c, "rate": c / bin_seconds})
            if r["series"] is not None:
                series_rows += _series_rows(r["series"], run=seed, policy=pol)
            print(f"{name} run {seed} {pol:15} results {r['results']:>8,}  r_min "
                  f"{r['r_min']:.4f}  drops {r['drops']:>6,}  cpu {r['cpu']:.1f}s",
                  flush=True)
        runs_out.append(per)
    out.mkdir(parents=True, exist_ok=True)
    write_csv(rows, out / f"{name}.csv")
    if series_rows:
        write_csv(series_rows, out / f"{name}_r.csv")
    phases = _phases(profile, duration)
    rates = {pol: [_med([_phase_rate(per[pol]["bins"], bin_seconds, a, b) for per in runs_out])
                   for a, b, _ in phases] for pol in policies}
    print(f"{name}: output per second by phase (median of {runs} runs)")
    for (a, b, lam), k in zip(phases, range(len(phases))):
        print(f"  [{a:g}, {b:g}) s at {lam:g} tuples/s: " + ", ".join(
            f"{pol} {rates[pol][k]:.1f}" for pol in policies))
    return rows, series_rows, runs_out, rates, phases


def _median_bins(runs_out, pol):
    return [_med(list(v)) for v in zip(*(per[pol]["bins"] for per in runs_out))]


def _phase_gain(runs_out, new, base, bin_seconds, a, b) -> float:
    """The median over runs of the output gain of ``new`` over ``base`` in [a, b)."""
    return _med([_gain(_phase_rate(per[new]["bins"], bin_seconds, a, b),
                       _phase_rate(per[base]["bins"], bin_seconds, a, b))
                 for per in runs_out])


def fig9(duration, window, bin_seconds, runs, capacity, out: Path) -> list[dict]:
    rows, _, runs_out, _, phases = _time_series_figure(
        "fig9", "fig8", ("random", "partial"), duration, window, bin_seconds, runs,
        capacity, out, shift=0.0)
    xs = [k * bin_seconds for k in range(len(runs_out[0]["random"]["bins"]))]
    s0 = runs_out[-1]["partial"]["series"]
    _plot(out / "fig9.png", [
        {"title": "Figure 8: fraction r (rate adaptation, last run)", "xlabel": "time (s)",
         "ylabel": "r", "lines": {"r": (s0["time"], s0["r"])}},
        {"title": "Figure 9: output rate (median of runs)", "xlabel": "time (s)",
         "ylabel": f"output tuples/s ({bin_seconds:g} s bins)",
         "lines": {LABELS[p]: (xs, [c / bin_seconds for c in _median_bins(runs_out, p)])
                   for p in ("random", "partial")}}])
    # r over time: before the burst, lowest in the burst, at the end.
    burst = [(a, b) for a, b, lam in phases if lam > phases[0][2]]
    if burst:
        b0, b1 = burst[0][0], burst[-1][1]
        pre, low, post = [], [], []
        for per in runs_out:
            s = per["partial"]["series"]
            pre.append(_med([r for t, r in zip(s["time"], s["r"]) if b0 - 30 < t <= b0]))
            low.append(min([r for t, r in zip(s["time"], s["r"]) if b0 < t <= b1] or [1]))
            post.append(s["r"][-1] if s["r"] else float("nan"))
        pre, low, post = _med(pre), _med(low), _med(post)
        check("r drops when the rates rise and recovers after", low < pre and post > 2 * low,
              f"r before the burst {pre:.3f}, lowest in it {low:.3f}, at the end {post:.3f} "
              f"(medians; recovering: the end above twice the lowest; back to the r before: "
              f"{'yes' if post >= 0.8 * pre else 'not yet'}: Algorithm 1 raises r by at most "
              f"delta_r = 1.2 per T_r)")
    for lam, paper in ((500.0, "~100%"), (300.0, "~50%")):
        ph = [(a, b) for a, b, x in phases if x == lam]
        if ph:
            g = _phase_gain(runs_out, "partial", "random", bin_seconds, *ph[0])
            check(f"rate adaptation improves the output at {lam:g} tuples/s ({paper})", g > 0,
                  f"{_pct(g)} median over runs in [{ph[0][0]:g}, {ph[0][1]:g}) s")
    g = _phase_gain(runs_out, "partial", "random", bin_seconds, *phases[0][:2])
    print(f"(at {phases[0][2]:g} tuples/s, where the paper does not shed: {_pct(g)}; our "
          f"capacity overloads that rate already)")
    return rows


# ----- Figure 10 -------------------------------------------------------------------------------
def fig10(kappas, windows, duration, runs, capacity, out: Path) -> list[dict]:
    rows = []
    for w in windows:
        for kappa in kappas:
            for seed in range(runs):
                prep = prepare(duration, "fig8", w, kappa=kappa, shift=0.0, seed=seed)
                for pol in ("random", "partial"):
                    r = run_join(prep, pol, capacity)
                    rows.append({"window": w, "kappa": kappa, "run": seed, "policy": pol,
                                 "results": r["results"], "rate": r["rate"],
                                 "r_min": r["r_min"], "cpu": r["cpu"]})
                    print(f"fig10 w={w:g}s kappa={kappa:g} run {seed} {pol:8} average output "
                          f"{r['rate']:8.1f}/s  cpu {r['cpu']:.1f}s", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    write_csv(rows, out / "fig10.csv")

    def avg(w, kappa, pol):
        return _med([x["rate"] for x in rows if x["window"] == w and x["kappa"] == kappa
                     and x["policy"] == pol])

    def gain(w, kappa):
        return _med([_gain(a["rate"], b["rate"]) for a in rows for b in rows
                     if a["window"] == b["window"] == w and a["kappa"] == b["kappa"] == kappa
                     and a["run"] == b["run"] and a["policy"] == "partial"
                     and b["policy"] == "random"])

    _plot(out / "fig10.png", [
        {"title": "Figure 10: average output (Figure 8's period)", "xlabel": "kappa",
         "ylabel": "average output tuples/s",
         "lines": {f"{LABELS[p]}, w={w:g}s": (kappas, [avg(w, k, p) for k in kappas])
                   for w in windows for p in ("random", "partial")}}])
    for w in windows:
        print(f"w={w:g}s: " + ", ".join(
            f"kappa={k:g}: random {avg(w, k, 'random'):.1f}, rate adaptation "
            f"{avg(w, k, 'partial'):.1f} ({_pct(gain(w, k))})" for k in kappas))
    grows_k = {w: gain(w, kappas[-1]) > gain(w, kappas[0]) for w in windows}
    detail = "; ".join(f"w={w:g}s: {_pct(gain(w, kappas[0]))} at kappa={kappas[0]:g} -> "
                       f"{_pct(gain(w, kappas[-1]))} at kappa={kappas[-1]:g}" for w in windows)
    few = _too_few(kappas, "--kappas")
    if few is None and _unmeasured(*(gain(w, k) for w in windows for k in kappas)):
        few = f"random dropping gave no output to compare with ({detail})"
    check("the improvement of rate adaptation grows with kappa",
          None if few else all(grows_k.values()), few or detail)
    if len(windows) > 1:
        grows_w = [gain(windows[-1], k) > gain(windows[0], k) for k in kappas]
        check("the improvement grows with the window size", all(grows_w),
              "; ".join(f"kappa={k:g}: {_pct(gain(windows[0], k))} (w={windows[0]:g}s) vs "
                        f"{_pct(gain(windows[-1], k))} (w={windows[-1]:g}s)" for k in kappas))
    return rows


# ----- Figures 11 and 12 -----------------------------------------------------------------------
def fig12(duration, window, basic_window, bin_seconds, runs, capacity, out: Path) -> list[dict]:
    from adaptcq.stream.shed_workload import match_distribution

    rows, _, runs_out, _, phases = _time_series_figure(
        "fig12", "fig11", SETTINGS, duration, window, bin_seconds, runs, capacity, out,
        basic_window=basic_window)
    xs = [k * bin_seconds for k in range(len(runs_out[0]["partial"]["bins"]))]
    s0 = runs_out[-1]["selective"]["series"]
    _plot(out / "fig12.png", [
        {"title": "Figure 11: r_1 (W_R), r_2 (W_S), join direction (last run)",
         "xlabel": "time (s)", "ylabel": "fraction",
         "lines": {"r": (s0["time"], s0["r"]), "r_1 (W_R)": (s0["time"], s0["r_1"]),
                   "r_2 (W_S)": (s0["time"], s0["r_2"])}},
        {"title": "Figure 12: output rate (median of runs)", "xlabel": "time (s)",
         "ylabel": f"output tuples/s ({bin_seconds:g} s bins)",
         "lines": {LABELS[p]: (xs, [c / bin_seconds for c in _median_bins(runs_out, p)])
                   for p in SETTINGS}}])
    high = [(a, b) for a, b, lam in phases if lam > phases[0][2]]
    if high:
        a, b = high[0][0], high[-1][1]
        g1 = _phase_gain(runs_out, "selective-nodir", "partial", bin_seconds, a, b)
        g2 = _phase_gain(runs_out, "selective", "selective-nodir", bin_seconds, a, b)
        check("time correlation improves the output over rate adaptation only when the "
              "rates are high (~50%)", g1 > 0, f"{_pct(g1)} in [{a:g}, {b:g}) s")
        check("join direction adds more on top (~40%)", g2 > 0,
              f"{_pct(g2)} in [{a:g}, {b:g}) s")
    low = [(a, b) for a, b, lam in phases if lam == phases[0][2]]
    for a, b in low[:1]:
        print(f"(at {phases[0][2]:g} tuples/s, [{a:g}, {b:g}) s: time correlation "
              f"{_pct(_phase_gain(runs_out, 'selective-nodir', 'partial', bin_seconds, a, b))}"
              f", join direction "
              f"{_pct(_phase_gain(runs_out, 'selective', 'selective-nodir', bin_seconds, a, b))}"
              f")")
    # Which fraction is reduced first: the first T_r at which r_1 and r_2 differ, per run.
    first = []
    for per in runs_out:
        s = per["selective"]["series"]
        for t, r1, r2 in zip(s["time"], s["r_1"], s["r_2"]):
            if abs(r1 - r2) > 1e-9:
                first.append(("r_1" if r1 < r2 else "r_2", t, r1, r2))
                break
    md = match_distribution(prepare(3 * window, 500.0, window)["workload"], threshold=3,
                            window=window)
    f1, f2 = md["f_1"], md["f_2"]
    less = "r_1" if f1["match_probability"] < f2["match_probability"] else "r_2"
    print(f"match distributions (500 tuples/s, w={window:g}s): f_1 = W_{f1['window_of']} "
          f"probed by {f1['probe']}: {f1['match_probability']:.5f} matches per comparison, "
          f"peak lag {f1['peak_lag']}; f_2 = W_{f2['window_of']} probed by {f2['probe']}: "
          f"{f2['match_probability']:.5f}, peak lag {f2['peak_lag']}")
    if first:
        names = [x[0] for x in first]
        check(f"the reduction starts with the fraction of the less useful window "
              f"({less}, the fraction of W_{'R' if less == 'r_1' else 'S'} here; the "
              f"paper's r_2)", all(n == less for n in names),
              "; ".join(f"run {k}: {n} first, at t={t:g}s (r_1 {r1:.3f}, r_2 {r2:.3f})"
                        for k, (n, t, r1, r2) in enumerate(first)))
    return rows


# ----- Figure 13 -------------------------------------------------------------------------------
def fig13(kappas, threshold, duration, window, runs, capacity, out: Path) -> list[dict]:
    rows = []
    for kappa in kappas:
        for seed in range(runs):
            prep = prepare(duration, "fig11", window, kappa=kappa, threshold=threshold,
                           seed=seed)
            for pol in SETTINGS:
                r = run_join(prep, pol, capacity, basic_window=1.0)
                rows.append({"kappa": kappa, "run": seed, "policy": pol,
                             "results": r["results"], "rate": r["rate"], "r_min": r["r_min"],
                             "cpu": r["cpu"]})
                print(f"fig13 kappa={kappa:g} run {seed} {pol:15} average output "
                      f"{r['rate']:8.2f}/s  cpu {r['cpu']:.1f}s", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    write_csv(rows, out / "fig13.csv")

    def avg(kappa, pol):
        return _med([x["rate"] for x in rows if x["kappa"] == kappa and x["policy"] == pol])

    def gain(kappa, new, base="partial"):
        return _med([_gain(a["rate"], b["rate"]) for a in rows for b in rows
                     if a["kappa"] == b["kappa"] == kappa and a["run"] == b["run"]
                     and a["policy"] == new and b["policy"] == base])

    _plot(out / "fig13.png", [
        {"title": f"Figure 13: average output, threshold {threshold}", "xlabel": "kappa",
         "ylabel": "average output tuples/s",
         "lines": {LABELS[p]: (kappas, [avg(k, p) for k in kappas]) for p in SETTINGS}}])
    for k in kappas:
        print(f"kappa={k:g}: " + ", ".join(f"{p} {avg(k, p):.2f}/s" for p in SETTINGS)
              + f"; over rate adaptation: time correlation "
              f"{_pct(gain(k, 'selective-nodir'))}, + join direction "
              f"{_pct(gain(k, 'selective'))}")
    k0, k1 = kappas[0], kappas[-1]
    few = _too_few(kappas, "--kappas")
    for pol in ("selective-nodir", "selective"):
        g0, g1 = gain(k0, pol), gain(k1, pol)
        detail = (f"{_pct(g0)} at kappa={k0:g} -> {_pct(g1)} at kappa={k1:g}")
        why = few or (f"rate adaptation gave no output to compare with ({detail})"
                      if _unmeasured(g0, g1) else None)
        check(f"the improvement of {LABELS[pol]} over rate adaptation grows with kappa",
              None if why else g1 > g0, why or detail)
    a0, a1 = avg(k0, "partial"), avg(k1, "partial")
    detail = (f"{a0:.2f}/s at kappa={k0:g} -> {a1:.2f}/s at kappa={k1:g} (criterion: at "
              f"most +20%)")
    # (no output at either end: "0 -> 0" would hold whatever the trend)
    why = few or (f"no output at either kappa ({detail}); raise --duration or lower "
                  "--threshold"
                  if _unmeasured(a0, a1) or a0 == a1 == 0 else None)
    check("rate adaptation alone does not improve with kappa", None if why else a1 <= 1.2 * a0,
          why or detail)
    return rows


# ----- Figure 14 -------------------------------------------------------------------------------
def fig14(bws, kappas, rate, window, window_indexed, measure, parts, runs, capacity,
          out: Path) -> list[dict]:
    rows = []
    for part in parts:
        w = window if part == "none" else window_indexed
        for kappa in kappas:
            for seed in range(runs):
                prep = prepare(w + measure, rate, w, kappa=kappa, seed=seed)
                for b in [*bws, None]:
                    pol = "selective" if b is not None else "partial"
                    r = run_join(prep, pol, capacity, basic_window=b, index=part, warmup=w)
                    rows.append({"index": part, "window": w, "kappa": kappa, "run": seed,
                                 "basic_window": "none" if b is None else b,
                                 "policy": pol, "rate": r["rate"], "results": r["results"],
                                 "work": r["work"], "r_min": r["r_min"], "cpu": r["cpu"]})
                    print(f"fig14 {part:11} w={w:g}s kappa={kappa:g} b="
                          f"{'none' if b is None else f'{b:g}'} run {seed}: output "
                          f"{r['rate']:8.1f}/s after the windows filled  cpu {r['cpu']:.1f}s",
                          flush=True)
    out.mkdir(parents=True, exist_ok=True)
    write_csv(rows, out / "fig14.csv")

    def avg(part, kappa, b):
        return _med([x["rate"] for x in rows if x["index"] == part and x["kappa"] == kappa
                     and x["basic_window"] == b])

    names = {"none": "non-indexed", "inverted": "inverted (time-sorted)",
             "inverted-id": "inverted-id (identifier-sorted)"}
    panels = []
    for group in (["none"], [p for p in parts if p != "none"]):
        group = [p for p in group if p in parts]
        if group:
            panels.append({
                "title": f"Figure 14: {', '.join(names[p] for p in group)} ('none' drawn at b = w)",
                "xlabel": "basic window size b (s)", "ylabel": "average output tuples/s",
                "logx": True,
                "lines": {**{f"{names[p]}, kappa={k:g}": (bws, [avg(p, k, b) for b in bws])
                             for p in group for k in kappas},
                          **{f"{names[p]}, kappa={k:g}, none": (
                              [window if p == "none" else window_indexed],
                              [avg(p, k, "none")]) for p in group for k in kappas}}})
    _plot(out / "fig14.png", panels)
    for part in parts:
        for k in kappas:
            print(f"{names[part]:32} kappa={k:g}: " + ", ".join(
                f"b={b:g}: {avg(part, k, b):.1f}" for b in bws)
                + f", none: {avg(part, k, 'none'):.1f}")
    if "none" in parts and len(bws) > 1:
        small, large = bws[0], bws[-1]
        det = [(k, avg("none", k, small), avg("none", k, large), avg("none", k, "none"))
               for k in kappas]
        check("small basic windows give more output (non-indexed)",
              all(s > lg and s > n for _, s, lg, n in det),
              "; ".join(f"kappa={k:g}: b={small:g}: {s:.1f}, b={large:g}: {lg:.1f}, none: "
                        f"{n:.1f}" for k, s, lg, n in det))
    if "inverted" in parts and len(bws) > 2:
        det = []
        for k in kappas:
            ys = [avg("inverted", k, b) for b in bws]
            best = max(range(len(bws)), key=lambda j: ys[j])
            det.append((k, bws[best], ys[best], ys[0]))
        check("indexed: very small basic windows give less again (lookup overhead)",
              all(bb > bws[0] and y0 < yb for _, bb, yb, y0 in det),
              "; ".join(f"kappa={k:g}: best b={bb:g} ({yb:.1f}/s), b={bws[0]:g}: {y0:.1f}/s"
                        for k, bb, yb, y0 in det))
    if "inverted" in parts and "inverted-id" in parts:
        det = [(k, b, avg("inverted", k, b), avg("inverted-id", k, b))
               for k in kappas for b in bws]
        lower = all(i < t for _, _, t, i in det)
        gaps = {k: [(1 - i / t) if t else float("nan") for kk, _, t, i in det if kk == k]
                for k in kappas}
        larger = all(g[-1] > g[0] for g in gaps.values())
        check("identifier-sorted lists give less output than time-sorted ones",
              lower, "; ".join(f"kappa={k:g}: " + ", ".join(
                  f"b={b:g}: {t:.1f} vs {i:.1f}" for kk, b, t, i in det if kk == k)
                  for k in kappas))
        check("... especially at large basic windows", larger,
              "; ".join(f"kappa={k:g}: shortfall {g[0] * 100:.0f}% at b={bws[0]:g} -> "
                        f"{g[-1] * 100:.0f}% at b={bws[-1]:g}" for k, g in gaps.items()))
    return rows


# ----- Figures 16 and 17 -----------------------------------------------------------------------
def _utility_pair(utilities, frequencies, duration, capacity, seed) -> tuple[float, float]:
    """Output utility without and with utility-based shedding on the same input."""
    prep = prepare(duration, 500.0, 20.0, utilities=utilities, frequencies=frequencies,
                   seed=seed)
    base, util = (run_join(prep, "selective", capacity, basic_window=1.0, utility=u)
                  for u in (False, True))
    return base["utility"], util["utility"]


def fig16(ks, duration, runs, capacity, out: Path) -> list[dict]:
    from adaptcq.stream.shed_workload import utilities_fig16

    rows = []
    for freq in ("uniform", "inverse", "direct"):
        for k in ks:
            for seed in range(runs):
                b, u = _utility_pair(utilities_fig16(k), freq, duration, capacity, seed)
                rows += [{"k": k, "frequencies": freq, "utility_shedding": flag,
                          "utility": x, "run": seed} for flag, x in ((False, b), (True, u))]
                print(f"{freq:8} k={k:g} run {seed}: output utility {b:,.1f} -> {u:,.1f} "
                      f"with utility-based shedding ({_pct(_gain(u, b))})", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    write_csv(rows, out / "fig16.csv")
    summary = {(freq, k): _utility_gain(rows, frequencies=freq, k=k)
               for freq in ("uniform", "inverse", "direct") for k in ks}
    _plot(out / "fig16.png", [
        {"title": "Figure 16: utility-based shedding",
         "xlabel": "skewness k of the utilities {1, 1/2^k, 1/3^k}",
         "ylabel": "output utility improvement (%)",
         "lines": {f: (ks, [summary[(f, k)] * 100 for k in ks])
                   for f in ("uniform", "inverse", "direct")}}])
    for (freq, k), g in summary.items():
        print(f"{freq:8} k={k:g}: median improvement {g * 100:+.1f}%")
    inc = {f: summary[(f, ks[-1])] > summary[(f, ks[0])] for f in ("uniform", "inverse")}
    nan = _unmeasured(*summary.values())
    no_base = "selective processing without it gave no output utility to compare with"
    why = _too_few(ks, "--ks") or (no_base if nan else None)
    check("the improvement grows with skewness for uniform and inverse frequencies",
          None if why else all(inc.values()), why or str(inc))
    last = {f: summary[(f, ks[-1])] for f in ("uniform", "inverse", "direct")}
    best = max(last, key=last.get)
    if not nan and list(last.values()).count(last[best]) > 1:  # a tie: none gains most
        nan, no_base = True, (f"no model gains more than the others at k={ks[-1]:g} ("
                              + ", ".join(f"{f} {_pct(g)}" for f, g in last.items())
                              + "): raise --duration or lower --capacity")
    check("inverse frequencies gain most", None if nan else best == "inverse",
          no_base if nan else f"most: {best}")
    return rows


def _utility_gain(rows, **match) -> float:
    """Median over runs of the output utility gain of utility-based shedding."""
    pick = [r for r in rows if all(r[k] == v for k, v in match.items())]
    by_run = {}
    for r in pick:
        by_run.setdefault(r["run"], {})[r["utility_shedding"]] = r["utility"]
    return _med([_gain(v[True], v[False]) for v in by_run.values() if len(v) == 2])


def fig17(types_list, factors, duration, runs, capacity, out: Path) -> list[dict]:
    from adaptcq.stream.shed_workload import utilities_fig17

    rows = []
    for factor in factors:
        for nz in types_list:
            for seed in range(runs):
                b, u = _utility_pair(utilities_fig17(nz, factor), "inverse", duration,
                                     capacity, seed)
                rows += [{"types": nz, "factor": factor, "utility_shedding": flag,
                          "utility": x, "run": seed} for flag, x in ((False, b), (True, u))]
                print(f"fig17 factor={factor:g} |Z|={nz} run {seed}: output utility "
                      f"{b:,.1f} -> {u:,.1f} ({_pct(_gain(u, b))})", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    write_csv(rows, out / "fig17.csv")
    summary = {f: [_utility_gain(rows, factor=f, types=nz) for nz in types_list]
               for f in factors}
    _plot(out / "fig17.png", [
        {"title": "Figure 17: utility-based shedding, inverse frequencies",
         "xlabel": "type domain size |Z|", "ylabel": "output utility improvement (%)",
         "logx": True,
         "lines": {f"value difference factor {f:g}": (types_list, [g * 100 for g in gs])
                   for f, gs in summary.items()}}])
    for f, gs in summary.items():
        print(f"factor={f:g}: " + ", ".join(f"|Z|={nz}: {g * 100:+.1f}%"
                                           for nz, g in zip(types_list, gs)))
    why = _too_few(types_list, "--types", 3) or (
        "selective processing without utility-based shedding gave no output utility to "
        "compare with" if _unmeasured(*(g for gs in summary.values() for g in gs)) else None)
    if why:  # (a first step and later ones: three |Z| at least)
        check("the improvement decreases at first with |Z|, then stabilizes", None, why)
    else:
        ok = {}
        for f, gs in summary.items():
            first = gs[0] - gs[1]
            later = max(abs(gs[j + 1] - gs[j]) for j in range(1, len(gs) - 1))
            ok[f] = first > 0 and later < first
        check("the improvement decreases at first with |Z|, then stabilizes",
              all(ok.values()), "; ".join(
                  f"factor={f:g}: first step {(gs[0] - gs[1]) * 100:+.1f} points down, "
                  f"later steps at most "
                  f"{max(abs(gs[j + 1] - gs[j]) for j in range(1, len(gs) - 1)) * 100:.1f}"
                  for f, gs in summary.items()))
    return rows


# ----- Figure 15 -------------------------------------------------------------------------------
def fig15(rates, joins, duration, runs, capacity, out: Path, *,
          duration_indexed: float | None = None, rates_indexed=None,
          name: str = "fig15") -> list[dict]:
    """Figure 15's runs; writes ``<name>.csv`` and ``<name>_series.csv`` (``perf`` passes
    its own name: its files must not be fig15's, which a fig15 run would overwrite)."""
    rows, last_series = [], None
    for join in joins:
        indexed = JOINS[join][2] != "none"
        d = duration_indexed if indexed and duration_indexed else duration
        for rate in (rates_indexed if indexed and rates_indexed else rates):
            for k in range(runs):
                kind, window, index = JOINS[join]
                prep = prepare(d, rate, window, join=kind, seed=k)
                for policy in ("random", "selective"):
                    r = run_join(prep, policy, capacity, index=index)
                    if r["series"] is not None:
                        last_series = r["series"]
                    rows.append({"join": join, "rate": rate, "duration": d, **{
                        x: r[x] for x in ("policy", "results", "work", "r_min", "drops",
                                          "cpu", "overhead", "estimated_lost")}, "run": k})
                    print(f"{join:17} {rate:5g}/s run {k} {policy:9} results "
                          f"{r['results']:>9,}  r_min {r['r_min']:.4f}  drops "
                          f"{r['drops']:>7,}  cpu {r['cpu']:.1f}s", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    write_csv(rows, out / f"{name}.csv")
    if last_series and _series_rows(last_series):  # (none in a run shorter than T_r)
        write_csv(_series_rows(last_series), out / f"{name}_series.csv")
    return rows


def summarize(rows, rates, joins) -> list[tuple[str, float, float]]:
    """Per (join, rate): the median of selective/random output ratios over runs."""
    out = []
    for join in joins:
        for rate in rates:
            ratios = []
            for k in sorted({r["run"] for r in rows}):
                pick = {r["policy"]: r for r in rows
                        if r["join"] == join and r["rate"] == rate and r["run"] == k}
                if len(pick) == 2 and pick["random"]["results"]:
                    ratios.append(pick["selective"]["results"] / pick["random"]["results"])
            if ratios:
                med = statistics.median(ratios)
                out.append((join, rate, med))
                print(f"{join:17} {rate:5g}/s  selective / random output: {med:.2f}x "
                      f"(median of {len(ratios)}; runs: "
                      f"{', '.join(f'{x:.2f}' for x in ratios)})")
    return out


def plot(summary, out: Path, name: str = "fig15") -> None:
    _plot(out / f"{name}.png", [
        {"title": "Figure 15: selective processing vs random dropping",
         "xlabel": "stream rate (tuples/s)",
         "ylabel": "output improvement over random drop (%)",
         "lines": {join: ([r for j, r, _ in summary if j == join],
                          [(x - 1) * 100 for j, _, x in summary if j == join])
                   for join in dict.fromkeys(j for j, _, _ in summary)}}])


# ----- the command line ------------------------------------------------------------------------
FIGURES = ("fig7", "fig9", "fig10", "fig12", "fig13", "fig14", "fig15", "perf", "fig16",
           "fig17")
PARTS = ("none", "inverted", "inverted-id")  # Figure 14's indexes
DEFAULTS = {  # per figure: the defaults of the options it reads (see the docstring)
    "fig7": {"rates": [50.0, 100.0, 200.0], "windows": [25.0, 50.0, 75.0, 100.0, 125.0],
             "windows_indexed": [125.0, 375.0, 625.0], "measure": 30.0, "runs": 1},
    "fig9": {"duration": 150.0, "window": 20.0, "bin": 5.0, "runs": 3},
    "fig10": {"duration": 150.0, "windows": [10.0, 20.0], "kappas": [0.4, 0.6, 0.8, 1.0],
              "runs": 2},
    "fig12": {"duration": 150.0, "window": 20.0, "bw": 1.0, "bin": 5.0, "runs": 3},
    "fig13": {"duration": 150.0, "window": 20.0, "kappas": [0.4, 0.6, 0.8, 1.0],
              "threshold": 4, "runs": 2},
    "fig14": {"bws": [0.25, 0.5, 1.0, 2.0, 5.0, 10.0], "kappas": [0.6, 0.8], "rate": 500.0,
              "window": 20.0, "window_indexed": 200.0, "measure": 40.0, "parts": list(PARTS),
              "runs": 1},
    "fig15": {"rates": [100.0, 200.0, 300.0, 400.0, 500.0], "duration": 60.0,
              "duration_indexed": 300.0, "rates_indexed": [100.0, 300.0, 500.0],
              "joins": list(JOINS), "runs": 3},
    "perf": {"rates": [500.0], "duration": 60.0, "joins": ["overlap"], "runs": 3},
    "fig16": {"ks": [0.0, 1.0, 2.0, 3.0, 4.0], "duration": 60.0, "runs": 3},
    "fig17": {"types": [2, 4, 8, 16], "factors": [10.0, 100.0], "duration": 60.0, "runs": 3},
}
#: the list options taken in ascending order, repeats dropped (a trend's axis: --kappas
#: 0.8,0.4 once compared the wrong ends, --kappas 0.8,0.8 counted as two values)
SORTED = ("rates", "rates_indexed", "windows", "windows_indexed", "kappas", "bws", "ks",
          "types", "factors")
#: the options only some figures read (their dests); ``--capacity`` and ``--out`` are read by all
OPTIONS = tuple(dict.fromkeys(k for d in DEFAULTS.values() for k in d))


def _shown(value) -> str:
    if isinstance(value, list):
        return ",".join(_shown(x) for x in value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def _help(dest: str, text: str) -> str:
    """``text`` with the figures that read ``dest`` and their defaults (DEFAULTS)."""
    by_default: dict[str, list[str]] = {}
    for f in FIGURES:
        if dest in DEFAULTS[f]:
            by_default.setdefault(_shown(DEFAULTS[f][dest]), []).append(f)
    figs = [f for fs in by_default.values() for f in fs]
    who = "every figure" if len(figs) == len(FIGURES) else ", ".join(figs)
    if len(by_default) == 1:
        return f"{who}: {text} (default {next(iter(by_default))})"
    return (f"{who}: {text} (default " + "; ".join(
        f"{', '.join(fs)}: {d}" for d, fs in by_default.items()) + ")")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m adaptcq.bench.shedding",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=FIGURES, help="the figure to run: %(choices)s")
    floats, nonneg = comma_list(positive_float), comma_list(nonnegative_float)

    def opt(flag, kind, text, metavar):
        ap.add_argument(flag, type=kind, metavar=metavar,
                        help=_help(flag[2:].replace("-", "_"), text).replace("%", "%%"))

    from adaptcq.stream.shed_workload import FACTOR_MAX, K_MAX
    opt("--ks", comma_list(number_in(0.0, math.floor(K_MAX), "the smallest utility, 1/3^k, "
                                     "must be a normal double")),
        "utility skewness values k, comma-separated", "K,...")
    opt("--rates", floats, "stream rates, tuples/s per stream, comma-separated", "R,...")
    opt("--rates-indexed", floats, "the indexed joins' rates, comma-separated", "R,...")
    opt("--joins", choices(JOINS), f"joins, comma-separated, from {', '.join(JOINS)}",
        "JOIN,...")
    opt("--windows", floats, "window sizes (s) (fig7: of the non-indexed join), "
        "comma-separated", "W,...")
    opt("--windows-indexed", floats, "window sizes of the indexed join (s), comma-separated",
        "W,...")
    opt("--window", positive_float, "window (s) (fig14: of the non-indexed join)", "W")
    opt("--window-indexed", positive_float, "the indexed joins' window (s)", "W")
    opt("--kappas", nonneg, "Zipf parameters kappa, comma-separated", "K,...")
    opt("--bws", floats, "basic window sizes b (s), comma-separated", "B,...")
    opt("--bw", positive_float, "the basic window size b (s)", "B")
    opt("--bin", positive_float, "output bins (s)", "S")
    opt("--measure", positive_float, "seconds measured after the windows filled", "S")
    opt("--parts", choices(PARTS), "indexes, comma-separated: none (non-indexed, "
        "rate adaptation only), inverted (time-sorted lists), inverted-id "
        "(identifier-sorted)", "PART,...")
    opt("--rate", positive_float, "stream rate (tuples/s per stream)", "R")
    opt("--threshold", positive_int, "overlap threshold", "N")
    opt("--types", comma_list(whole_at_least(2, "utility-based shedding needs two tuple "
                                          "types to choose between")),
        "numbers of tuple types |Z|, comma-separated", "N,...")
    opt("--factors", comma_list(number_in(1.0, FACTOR_MAX, "the highest utility over the "
                                          "lowest; 1/factor must be a normal double")),
        "value difference factors, comma-separated", "F,...")
    opt("--duration", positive_float, "event seconds per run (fig15, perf: of the "
        "non-indexed joins)", "S")
    opt("--duration-indexed", positive_float, "run length of the indexed joins (s)", "S")
    opt("--runs", positive_int, "runs per point (seeds 0..N-1), median reported", "N")
    ap.add_argument("--capacity", type=positive_float, default=CAPACITY, metavar="UNITS",
                    help="every figure: CPU capacity, work units per second of event time "
                    f"(default {CAPACITY:,.0f}; see the description)")
    ap.add_argument("--out", default="results/shedding",
                    help="every figure: folder for the CSV and PNG files (default "
                    "%(default)s)")
    a = ap.parse_args(argv)
    # An option the figure does not read is refused, not ignored (before any work).
    refuse_unused(ap, [d for d in OPTIONS if d not in DEFAULTS[a.what]],
                  f"by {a.what}", argv=argv)
    if a.what == "fig15" and a.joins and all(JOINS[j][2] == "none" for j in a.joins):
        refuse_unused(ap, ["rates_indexed", "duration_indexed"],
                      "without an indexed join in --joins", argv=argv)
    if a.what == "fig14" and a.parts and "none" not in a.parts:
        refuse_unused(ap, ["window"], "by fig14 without 'none' in --parts", argv=argv)
    if a.what == "fig14" and a.parts == ["none"]:
        refuse_unused(ap, ["window_indexed"], "by fig14 with --parts none alone", argv=argv)
    for key, value in DEFAULTS[a.what].items():
        if getattr(a, key) is None:
            setattr(a, key, value)
        elif key in SORTED:  # the trends read their axis first to last
            setattr(a, key, sorted(set(getattr(a, key))))
    _refuse_oversized_runs(ap, a)
    out, cap = Path(a.out), a.capacity
    t0 = time.time()
    if a.what == "fig7":
        fig7(a.rates, a.windows, a.windows_indexed, a.measure, a.runs, cap, out)
    elif a.what == "fig9":
        fig9(a.duration, a.window, a.bin, a.runs, cap, out)
    elif a.what == "fig10":
        fig10(a.kappas, a.windows, a.duration, a.runs, cap, out)
    elif a.what == "fig12":
        fig12(a.duration, a.window, a.bw, a.bin, a.runs, cap, out)
    elif a.what == "fig13":
        fig13(a.kappas, a.threshold, a.duration, a.window, a.runs, cap, out)
    elif a.what == "fig14":
        fig14(a.bws, a.kappas, a.rate, a.window, a.window_indexed, a.measure, a.parts,
              a.runs, cap, out)
    elif a.what == "fig16":
        fig16(a.ks, a.duration, a.runs, cap, out)
    elif a.what == "fig17":
        fig17(a.types, a.factors, a.duration, a.runs, cap, out)
    else:
        _fig15_main(a, out, cap)
    print(f"{a.what}: {time.time() - t0:.0f} s; wrote {out / (a.what + '.csv')}, "
          f"{out / (a.what + '.png')}")
    return 0


#: memory per arrival of a prepared run, measured (peak RSS of ``prepare`` on the overlap
#: join: ~1.2 KB), rounded up for the run's state: the bound on the run lengths
BYTES_PER_ARRIVAL = 2000
#: the rate profile of each figure that runs one (see the figure functions)
FIGURE_PROFILES = {"fig9": "fig8", "fig10": "fig8", "fig12": "fig11", "fig13": "fig11"}


def _arrivals(rate: float | str, duration: float) -> float:
    """Expected arrivals of both streams over ``duration`` s at ``rate`` (or a profile)."""
    return 2 * sum((end - start) * r for start, end, r in _phases(rate, duration))


def _refuse_oversized_runs(ap: argparse.ArgumentParser, a) -> None:
    """Refuse (exit 2) a run length whose arrivals would not fit in memory, or output bins
    too many to count, naming the option and its bound: before any work (a --duration of
    1e12 ended in an _ArrayMemoryError traceback)."""
    b = BYTES_PER_ARRIVAL
    each = f"~{b:,} bytes each"
    if a.what in ("fig7", "fig14"):  # runs of window + measure seconds
        if a.what == "fig7":
            runs = [(r, w, "--windows" if w in a.windows else "--windows-indexed")
                    for r in a.rates for w in [*a.windows, *a.windows_indexed]]
        else:
            runs = [(a.rate, w, "--window" if w == a.window else "--window-indexed")
                    for w in ([a.window] if "none" in a.parts else [])
                    + ([a.window_indexed] if set(a.parts) - {"none"} else [])]
        for rate, w, wflag in runs:
            nbytes = _arrivals(rate, w + a.measure) * b
            what = (f"a run of window {w:g} + --measure {a.measure:g} s at {rate:g} "
                    f"tuples/s per stream ({each})")
            fits = physical_memory() / (2 * rate * b)  # seconds of arrivals that fit
            if fits > w:
                refuse_oversized(ap, "--measure", a.measure, nbytes, what, fits - w)
            refuse_oversized(ap, wflag, w, nbytes, what, max(fits - a.measure, 0.0))
        return
    runs = []
    if a.what in FIGURE_PROFILES:
        runs.append(("--duration", a.duration, FIGURE_PROFILES[a.what]))
    elif a.what in ("fig16", "fig17"):
        runs.append(("--duration", a.duration, 500.0))
    else:  # fig15, perf (perf runs every join --duration long at --rates)
        indexed = a.what == "fig15" and any(JOINS[j][2] != "none" for j in a.joins)
        if not indexed or any(JOINS[j][2] == "none" for j in a.joins):
            runs.append(("--duration", a.duration, max(a.rates)))
        if indexed:
            runs.append(("--duration-indexed", a.duration_indexed,
                         max(a.rates_indexed or a.rates)))
    for flag, duration, rate in runs:
        shown = (f"the {rate} rate profile" if isinstance(rate, str)
                 else f"{rate:g} tuples/s per stream")
        refuse_oversized(ap, flag, duration, _arrivals(rate, duration) * b,
                         f"a run's {_arrivals(rate, duration):,.0f} arrivals at {shown} "
                         f"({each})")
    if a.what in ("fig9", "fig12"):  # a count per output bin, per run
        bins = a.duration / a.bin + 1
        refuse_oversized(ap, "--bin", a.bin, bins * 8 * 8,
                         f"{bins:,.0f} output bins of a {a.duration:g} s run",
                         8 * 8 * a.duration / max(physical_memory(), 1), "at least")


def _perf_verdict(rows, summary, duration: float) -> str:
    """The issue's check (selective >= 3x random, non-indexed overlap at 500/s) on fig15's
    rows: "not measured" with the reason where the runs cannot tell: windows never filled
    (the claim is about an overloaded join in its steady state), no overload (neither policy
    shed: the ratio is 1 by construction), or no output of random dropping (no ratio)."""
    window = JOINS["overlap"][1]
    pick = [r for r in rows if r["join"] == "overlap" and r["rate"] == 500.0]
    med = next((m for j, rate, m in summary if j == "overlap" and rate == 500.0), None)
    if duration <= window:
        why = (f"a --duration of {duration:g} s does not fill the join's {window:g} s "
               f"windows; give more than {window:g}")
    elif not any(r["drops"] or r["r_min"] < 1 for r in pick):
        why = "no overload: neither policy shed anything; lower --capacity"
    elif med is None:
        why = "random dropping gave 0 results in every run; raise --duration"
    else:
        return f"{med:.2f}x -> {'HOLDS' if med >= 3 else 'DOES NOT HOLD'}"
    return f"not measured ({why})" + (f"; measured {med:.2f}x" if med is not None else "")


def _fig15_main(a, out: Path, cap: float) -> None:
    """fig15 and perf (perf: Figure 15's non-indexed overlap join at 500/s, its own files)."""
    joins = a.joins
    rows = fig15(a.rates, joins, a.duration, a.runs, cap, out,
                 duration_indexed=getattr(a, "duration_indexed", None),
                 rates_indexed=getattr(a, "rates_indexed", None), name=a.what)
    all_rates = sorted({r["rate"] for r in rows})
    summary = summarize(rows, all_rates, joins)
    plot(summary, out, a.what)
    sel = [r for r in rows if r["policy"] == "selective"]
    over = statistics.median(r["overhead"] for r in sel) if sel else 0.0
    print(f"shedder overhead (adaptation steps' CPU / run CPU, median): {over:.3%}")
    if "overlap" in joins and 500.0 in all_rates:
        print(f"check: non-indexed overlap at 500/s, selective >= 3x random: "
              f"{_perf_verdict(rows, summary, a.duration)}")
    print(f"check: shedder overhead < 2%: {over:.3%} -> "
          f"{'HOLDS' if over < 0.02 else 'DOES NOT HOLD'}")
    idx = [m for j, _, m in summary if j == "equality-indexed"]
    if idx:
        print(f"paper: no gain for hash-indexed equi-joins; here {min(idx):.2f}x to "
              f"{max(idx):.2f}x")


if __name__ == "__main__":
    sys.exit(main())
