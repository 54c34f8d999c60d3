"""Benchmark: MJoin and XJoin on a-caching.txt §7.2's default 3-way join.

R(A) ⋈_A S(A,B) ⋈_B T(B), multiplicity 1 in R and S and r = 5 in T, ΔT five times as fast
as ΔR and ΔS, sliding windows, retract mode. Each run is a fresh process (``--single``)
that reads the Parquet inputs, runs the query and reports its own CPU time, so the figure
is whole-process: interpreter start-up, imports, reading and merging input, the join,
and building the output table. Reported: input updates (ΔR insertions and deletions) per
CPU-second, median of ``--runs`` runs, and the engine-only figure beside it.

    python -m adaptcq.bench.mjoin_xjoin [--arrivals 600000] [--runs 5] [--out results/mjoin_xjoin]

``--baseline SRC`` also runs every executor from another checkout's ``src`` folder (e.g. made
with ``git worktree add /tmp/before HEAD~3``), interleaved with this one on the same input,
and reports this tree's throughput as a ratio of the baseline's: the check that a change
costs no speed. SRC must hold ``adaptcq/__init__.py`` (else the runs would silently import
this tree, and compare it with itself); each baseline run checks that it imported SRC's.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from adaptcq.bench._args import choices, positive_int, whole_at_least

#: ``--arrivals``: the workloads here have three streams
ARRIVALS = whole_at_least(3, "one arrival per stream of the three")

#: what ``runtime.local.run`` takes as executor= (it is not imported here: the parent process
#: only spawns the runs)
EXECUTORS = ("mjoin", "xjoin", "acaching", "tree", "vector", "auto")


def single(executor: str, folder: str, mode: str) -> dict:
    """One run in this process; CPU time from getrusage covers the whole process."""
    import resource

    import adaptcq
    from adaptcq.bench.vector import result_digest
    from adaptcq.runtime.local import run
    from adaptcq.stream.workloads import read_workload

    wl = read_workload(folder)
    t0 = time.perf_counter()
    res = run(wl.sql, wl.tables, timestamp=wl.timestamp, executor=executor, mode=mode)
    wall = time.perf_counter() - t0
    ru = resource.getrusage(resource.RUSAGE_SELF)
    cpu = ru.ru_utime + ru.ru_stime
    s = res.stats
    # After the measurement: an order-independent digest of every result row, of the
    # query's columns (the operator tree adds a flag _late, False here: nothing spills).
    table = res.table.drop_columns([c for c in ("_late",) if c in res.table.column_names])
    digest = 0
    for batch in table.to_batches():
        digest = result_digest(batch, digest)
    return {"executor": executor, "mode": mode, "arrivals": s["arrivals"],
            "updates": s["updates"], "results": s["results"], "digest": f"{digest:016x}",
            "process_cpu_s": cpu, "engine_cpu_s": s["cpu_seconds"], "wall_s": wall,
            "updates_per_cpu_s": s["updates"] / cpu,
            "engine_updates_per_cpu_s": s["throughput"],
            "peak_state_tuples": s["peak_state_tuples"], "peak_state_bytes": s["peak_state_bytes"],
            "max_rss_kib": ru.ru_maxrss,
            "package": str(Path(adaptcq.__file__).resolve().parent)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m adaptcq.bench.mjoin_xjoin", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arrivals", type=ARRIVALS, default=600_000,
                   help="input rows over all streams (default 600,000)")
    p.add_argument("--runs", type=positive_int, default=5,
                   help="runs per executor, medians reported (default 5)")
    p.add_argument("--r", type=positive_int, default=5,
                   help="multiplicity of T (paper default 5)")
    p.add_argument("--mode", default="retract", choices=["append", "retract"],
                   help="output mode (default retract)")
    p.add_argument("--executors", type=choices(EXECUTORS), default=["mjoin", "xjoin"],
                   help=f"comma-separated, from {', '.join(EXECUTORS)} (default mjoin,xjoin; "
                        "mjoin,acaching adds issue 14's A-Caching check)")
    p.add_argument("--out", default="results/mjoin_xjoin",
                   help="folder of the CSVs, the PNG and the input (default "
                        "results/mjoin_xjoin)")
    p.add_argument("--baseline", metavar="SRC",
                   help="also run the executors from this src folder of another checkout "
                        "(the folder holding adaptcq/__init__.py)")
    p.add_argument("--single", help=argparse.SUPPRESS)
    p.add_argument("--input", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.single:
        print(json.dumps(single(args.single, args.input, args.mode)))
        return 0
    if "tree" in args.executors and args.mode != "append":
        p.error("--executors tree: the operator tree runs in append mode only; add "
                "--mode append")
    baseline = None
    if args.baseline:
        baseline = Path(args.baseline).resolve()
        if not (baseline / "adaptcq" / "__init__.py").is_file():
            hint = (f" (a checkout root? give {baseline / 'src'})"
                    if (baseline / "src" / "adaptcq" / "__init__.py").is_file() else "")
            p.error(f"--baseline {args.baseline}: no adaptcq/__init__.py in it{hint}; give "
                    "the src folder of another checkout")

    from adaptcq.stream.workloads import three_way, write_workload

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data = out / "input"
    wl = three_way(n_updates=args.arrivals, r=args.r, seed=0)
    write_workload(wl, data)
    print(f"workload: {wl.sql}\n  {args.arrivals:,} arrivals, r = {args.r}; inputs in {data}")
    rows = []
    executors = args.executors
    trees = [("", None)] + ([("baseline:", baseline)] if baseline else [])
    runs = [(ex, tag, src) for ex in executors for tag, src in trees]
    for run_no in range(args.runs):
        # interleaved (and alternated), so drift hits every variant alike
        for ex, tag, src in (runs if run_no % 2 == 0 else runs[::-1]):
            cmd = [sys.executable, "-m", "adaptcq.bench.mjoin_xjoin", "--single", ex,
                   "--input", str(data), "--mode", args.mode]
            env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
            if src:
                env["PYTHONPATH"] = str(src)
            res = subprocess.run(["taskset", "-c", "0", *cmd] if _has_taskset() else cmd,
                                 capture_output=True, text=True, env=env, check=False)
            if res.returncode != 0:
                print(res.stderr, file=sys.stderr)
                return 1
            row = json.loads(res.stdout.strip().splitlines()[-1])
            expected = (src or Path(__file__).resolve().parents[2]) / "adaptcq"
            package = row.pop("package", None)  # (an older baseline does not say)
            if package is not None and Path(package) != expected:
                # (an installed copy or an import path ahead of PYTHONPATH won: the ratio
                # would not be of the two trees)
                print(f"{tag + ex} imported adaptcq from {package}, not {expected}",
                      file=sys.stderr)
                return 1
            row["run"] = run_no
            row["executor"] = tag + ex
            rows.append(row)
            print(f"  run {run_no + 1}/{args.runs} {tag + ex:15s} "
                  f"{row['updates_per_cpu_s']:>10,.0f} updates/CPU-s whole process "
                  f"({row['engine_updates_per_cpu_s']:,.0f} engine only)")
    with open(out / "runs.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    summary = {}
    executors = [tag + ex for ex in executors for tag, _ in trees]
    for ex in executors:
        mine = [r for r in rows if r["executor"] == ex]
        summary[ex] = {k: statistics.median(r[k] for r in mine) for k in
                       ("updates_per_cpu_s", "engine_updates_per_cpu_s", "process_cpu_s",
                        "peak_state_tuples", "peak_state_bytes")}
        summary[ex]["updates"] = mine[0]["updates"]
        summary[ex]["results"] = mine[0]["results"]
    with open(out / "summary.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["executor", "updates", "results", "median_updates_per_cpu_s",
                    "median_engine_updates_per_cpu_s", "median_peak_state_tuples",
                    "median_peak_state_bytes"])
        for ex, s in summary.items():
            w.writerow([ex, s["updates"], s["results"], round(s["updates_per_cpu_s"]),
                        round(s["engine_updates_per_cpu_s"]), s["peak_state_tuples"],
                        s["peak_state_bytes"]])
    _plot(summary, out / "throughput.png", args)
    print(f"\nmedian of {args.runs} runs, {args.mode} mode, one core (taskset), whole process:")
    for ex, s in summary.items():
        print(f"  {ex:6s} {s['updates_per_cpu_s']:>10,.0f} input updates per CPU-second "
              f"(engine only {s['engine_updates_per_cpu_s']:,.0f}); {s['updates']:,} updates, "
              f"{s['results']:,} results, peak state {s['peak_state_tuples']:,} tuples")
    for ex in executors:
        base = summary.get("baseline:" + ex)
        if base:
            print(f"  {ex} against the baseline ({args.baseline}): "
                  f"{summary[ex]['updates_per_cpu_s'] / base['updates_per_cpu_s']:.3f}x whole "
                  f"process, {summary[ex]['engine_updates_per_cpu_s'] / base['engine_updates_per_cpu_s']:.3f}x "
                  "engine only")
    if "mjoin" in summary and "xjoin" in summary:
        ratio = summary["mjoin"]["updates_per_cpu_s"] / summary["xjoin"]["updates_per_cpu_s"]
        print(f"  MJoin / XJoin throughput ratio: {ratio:.2f}")
    if "mjoin" in summary and "acaching" in summary:
        _acaching_check(rows)
    agree = _results_agree(rows)
    if "mjoin" in summary:
        target = 150_000
        got = summary["mjoin"]["updates_per_cpu_s"]
        print(f"  target for MJoin: {target:,} per CPU-second -> "
              f"{'MET' if got >= target else 'NOT MET'} ({got / target:.2f}x)")
    print(f"wrote {out / 'runs.csv'}, {out / 'summary.csv'}, {out / 'throughput.png'}")
    return 0 if agree else 1


def _results_agree(rows: list[dict]) -> bool:
    """Every run of every executor gave the same results: the same count and, where the
    run reports one (an older ``--baseline`` may not), the same digest of the result rows
    (``bench.vector.result_digest``: equal multisets, equal digests). Prints the verdict."""
    seen: dict[tuple, list[str]] = {}
    for r in rows:
        seen.setdefault((r["results"], r.get("digest")), []).append(
            f"{r['executor']} run {r['run'] + 1}")
    digests = {d for _, d in seen if d is not None}
    counts = {n for n, _ in seen}
    if len(counts) == 1 and len(digests) <= 1:
        print(f"  results agree: every run of {', '.join(dict.fromkeys(r['executor'] for r in rows))} "
              f"gave the same {next(iter(counts)):,} results"
              + (" (same digest of the rows)" if digests else ""))
        return True
    print("error: the executors' results differ: " + "; ".join(
        f"{n:,} results{'' if d is None else f' (digest {d})'} from {', '.join(who)}"
        for (n, d), who in seen.items()), flush=True)
    return False


ACACHING_LIMIT = 1.05  # issue 14: A-Caching's whole-process CPU at most 1.05× MJoin's


def _acaching_check(rows: list[dict]) -> None:
    """Issue 14's check: A-Caching's whole-process CPU against MJoin's, as the median of
    the ratios of the runs made side by side (run k of each), which cancels the drift of
    a shared machine better than a ratio of medians."""
    by = {}
    for r in rows:
        by.setdefault(r["executor"], {})[r["run"]] = r
    pairs = sorted(by["acaching"][k]["process_cpu_s"] / by["mjoin"][k]["process_cpu_s"]
                   for k in by["mjoin"] if k in by["acaching"])
    engine = sorted(by["acaching"][k]["engine_cpu_s"] / by["mjoin"][k]["engine_cpu_s"]
                    for k in by["mjoin"] if k in by["acaching"])
    ratio = statistics.median(pairs)
    print(f"  A-Caching / MJoin CPU, median of {len(pairs)} side-by-side runs: {ratio:.3f}x "
          f"whole process (runs: {', '.join(f'{x:.2f}' for x in pairs)}), "
          f"{statistics.median(engine):.3f}x engine only; issue 14's limit "
          f"{ACACHING_LIMIT:.2f}x -> {'MET' if ratio <= ACACHING_LIMIT else 'NOT MET'}")


def _has_taskset() -> bool:
    from shutil import which
    return which("taskset") is not None


def _plot(summary: dict, path: Path, args) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    names = list(summary)
    ax.bar(names, [summary[n]["updates_per_cpu_s"] for n in names], color=["#4472c4", "#ed7d31"])
    ax.set_ylabel("input updates per CPU-second")
    ax.set_title(f"3-way join R⋈S⋈T, r={args.r}, {args.mode}\n(median of {args.runs}, whole process)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
