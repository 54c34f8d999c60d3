"""Benchmark: state spill (state-spill.txt §6, issue 12).

``figures`` reproduces §6.2 on the workload of §6.1 (``stream/spill_workload.py``: five
streams, the plan ((A ⋈ B ⋈ C) ⋈ D) ⋈ E, 300 partitions, unbounded state): for each join
ratio setting — Figure 16 (3, 1, 1), Figure 19 (1, 3, 3), Figure 20 (3, 2, 3) — the
unlimited-memory run, then each strategy under a budget of ``--budget-fraction`` of the
unlimited run's peak state (the model of §2.2), with the clean-up after the input as in the
paper. It plots run-time results over (event) time per strategy (Figures 16, 19, 20), the
memory over time with each spill a drop (Figure 17: global output against global output
with penalty; Figure 18: penalty against bottom-up), and prints the clean-up time of each
strategy and whether the paper's trends hold ("not measured" where the run cannot tell the
strategies apart: no run-time result lost to a spill, or no strategy spilling more than
once, as on a tiny ``--arrivals``). Every run's run-time plus clean-up results are checked
against the unlimited run's count.

``perf`` is the issue's performance check: the paper's plan with ``--arrivals`` (5M) over
``[RANGE --window]`` windows, the unlimited run and the penalty strategy with a budget of
one tenth of the unlimited peak, each a fresh process: run-time results per CPU-second
(target: within 2× of unlimited), clean-up CPU against the run's (target: less), peak RSS
(VmHWM) above the process with its inputs loaded, against the budget plus the fixed
overhead: the same above a run a fifth as long under the same budget (what does not grow
with the run).

    python -m adaptcq.bench.spill figures [--arrivals 300000] [--budget-fraction 0.25]
        [--figures 16,19,20] [--out results/spill]
    python -m adaptcq.bench.spill perf [--arrivals 5000000] [--window 20] [--ratios 2,1,1]
    python -m adaptcq.bench.spill formats [--arrivals 100000]
    python -m adaptcq.bench.spill spark [--arrivals 100000] [--memory 64MB] [--partitions 2]
        [--repeats 3] [--master local[2]]
    python -m adaptcq.bench.spill rebuild [--rows 200000] [--repeats 3]

``spark`` measures spilling on Spark (docs/spill.md, "On Spark"): §6.1's workload with
unbounded state (Figure 16's ratios), each round three jobs in fresh processes, `adaptcq
run` locally with ``--spill global-penalty --memory M``, on Spark with the same options in P
partition groups, and on Spark without spilling; whole-process wall seconds (JVM start-up
included), the spills, late results and clean-up CPU of each, and the outputs compared as
multisets (they must be equal).

``rebuild`` measures a spilling Spark group's rebuild from its stored rows (no JVM: the
group driven as Spark drives it), its CPU and the peak memory it adds.

Writes ``summary.csv``, ``results_over_time.csv``, ``memory.csv``, ``fig16.png`` ...
``fig20.png`` (figures), ``perf.csv``, ``perf.png`` (perf), ``formats.csv``, ``formats.png``
(formats), ``spark.csv``, ``spark.png`` (spark) and ``rebuild.csv``, ``rebuild.png``
(rebuild) under OUT.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from adaptcq.bench._args import choices, fraction, nonnegative_int, positive_float, positive_int
from adaptcq.bench.spark_scale import write_csv  # the benchmarks' one CSV writer

FIGURES = {16: (3, 1, 1), 19: (1, 3, 3), 20: (3, 2, 3)}
STRATEGIES = ("bottom-up", "local-output", "global-output", "global-penalty")
BINS = 60
CLI = "from adaptcq.cli import main; raise SystemExit(main())"  # `adaptcq`, this interpreter


def _run(workload, spill: dict | None) -> dict:
    """One run in this process: results over event time (run-time and late), memory over
    time, the spill figures."""
    import numpy as np

    from adaptcq.runtime.local import stream
    options = {"spill": spill} if spill else {}
    t0 = time.process_time()
    run = stream(workload.sql, workload.tables, executor="tree", **options)
    times, late = [], 0
    for b in run:
        lt = b.column("_late").to_numpy(zero_copy_only=False)
        ts = b.column("_ts").to_numpy(zero_copy_only=False)
        times.append(ts[~lt])
        late += int(lt.sum())
    cpu = time.process_time() - t0
    s = run.stats
    ex = run.cq.executor
    if spill:  # the controller's checks, at engine times (ns)
        memory = [(ts * 1e-9, b) for ts, b in ex.controller.samples]
    else:
        memory = [(ts * 1e-9, b) for _, ts, _, b in run.cq.stats.samples]
    return {"runtime_times": np.concatenate(times) if times else np.zeros(0),
            "late": late, "results": s["results"], "cpu": cpu,
            "cleanup_cpu": s.get("cleanup_cpu_seconds", 0.0), "spills": s.get("spills", 0),
            "spilled_bytes": s.get("spilled_bytes_model", 0),
            "file_bytes": s.get("spill_file_bytes", 0),
            "peak_bytes": s["peak_state_bytes"], "memory": memory,
            "end": float(workload.tables["E"].column("ts")[-1].as_py())}


def figures(args) -> int:
    import numpy as np

    from adaptcq.stream.spill_workload import spill_five_way
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary, over_time, memory_rows = [], [], []
    verdicts = []
    for fig in args.figures:
        ratios = FIGURES[fig]
        wl = spill_five_way(args.arrivals, ratios=ratios, seed=args.seed)
        base = _run(wl, None)
        budget = int(base["peak_bytes"] * args.budget_fraction)
        print(f"Figure {fig}: join ratios {ratios}, {wl.n_updates:,} arrivals, "
              f"K = {wl.params['tuple_range']:,}; unlimited: {base['results']:,} results, "
              f"peak state {base['peak_bytes'] / 1e6:,.1f} MB (model), {base['cpu']:.1f} CPU-s; "
              f"budget {budget / 1e6:,.1f} MB ({args.budget_fraction:g} of the peak)")
        runs = {"unlimited": base}
        for strategy in STRATEGIES:
            # (local-output draws nothing: a seed for it is refused)
            seed = {} if strategy == "local-output" else {"seed": args.seed}
            r = _run(wl, {"strategy": strategy, "memory": budget, "cleanup": "end",
                          "when_free": False, **seed})
            if r["results"] != base["results"]:
                raise SystemExit(f"Figure {fig} {strategy}: {r['results']:,} results after "
                                 f"clean-up, the unlimited run has {base['results']:,}")
            runs[strategy] = r
            print(f"  {strategy:>15}: run-time results {len(r['runtime_times']):>10,} "
                  f"({len(r['runtime_times']) / base['results']:6.1%}), spills "
                  f"{r['spills']:>4}, run {r['cpu'] - r['cleanup_cpu']:6.1f} CPU-s, "
                  f"clean-up {r['cleanup_cpu']:6.1f} CPU-s")
        edges = np.linspace(0, base["end"], BINS + 1)
        for name, r in runs.items():
            counts = np.histogram(r["runtime_times"], bins=edges)[0].cumsum()  # _ts: s
            over_time += [{"figure": fig, "strategy": name, "minute": e / 60,
                           "runtime_results": int(c)} for e, c in zip(edges[1:], counts)]
            memory_rows += [{"figure": fig, "strategy": name, "minute": t / 60,
                             "model_bytes": int(b)} for t, b in r["memory"]]
            summary.append({"figure": fig, "ratios": "/".join(map(str, ratios)),
                            "strategy": name, "arrivals": wl.n_updates,
                            "budget_bytes": budget if name != "unlimited" else "",
                            "runtime_results": len(r["runtime_times"]),
                            "late_results": r["late"], "results": r["results"],
                            "spills": r["spills"], "spilled_bytes_model": r["spilled_bytes"],
                            "spill_file_bytes": r["file_bytes"],
                            "run_cpu_s": round(r["cpu"] - r["cleanup_cpu"], 3),
                            "cleanup_cpu_s": round(r["cleanup_cpu"], 3)})
        rt = {k: len(v["runtime_times"]) for k, v in runs.items()}
        sp = {k: v["spills"] for k, v in runs.items()}
        # A trend is measured only where the run tells the strategies apart: run-time
        # results once some strategy lost some to its spills (else every one produced all
        # of them: the budget never bound), spill frequencies once some strategy spilled
        # more than once (else 0 or 1 spill each, which orders nothing).
        lost = any(rt[k] < base["results"] for k in STRATEGIES)
        often = max(sp[k] for k in STRATEGIES) > 1
        no_loss = (f"every strategy produced all {base['results']:,} results at run time "
                   "(the budget never bound); raise --arrivals")
        counts = ", ".join(f"{k} {sp[k]}" for k in STRATEGIES)
        few = f"no strategy spilled more than once ({counts}); raise --arrivals"
        checks = [
            ("penalty >= global output (run-time results)",
             rt["global-penalty"] >= rt["global-output"] if lost else None, no_loss),
            ("global output > local output",
             rt["global-output"] > rt["local-output"] if lost else None, no_loss),
            ("global output > bottom-up",
             rt["global-output"] > rt["bottom-up"] if lost else None, no_loss),
            ("penalty spills no more often than global output (Figure 17)",
             sp["global-penalty"] <= sp["global-output"] if often else None, few),
            ("bottom-up spills least often (Figure 18)",
             sp["bottom-up"] <= min(sp["global-penalty"], sp["global-output"]) if often
             else None, few),
        ]
        for what, ok, why in checks:
            verdicts.append((fig, what, ok))
            verdict = f"not measured ({why})" if ok is None else \
                "HOLDS" if ok else "DOES NOT HOLD"
            print(f"  paper's trend: {what}: {verdict}")
        _plot_results(out / f"fig{fig}.png", fig, ratios, over_time)
        if fig == 16:
            _plot_memory(out / "fig17.png", "Figure 17: global output vs. global output "
                         "with penalty", memory_rows, fig, ("global-output", "global-penalty"),
                         budget)
            _plot_memory(out / "fig18.png", "Figure 18: global output with penalty vs. "
                         "bottom-up", memory_rows, fig, ("global-penalty", "bottom-up"), budget)
    write_csv(summary, out / "summary.csv")
    write_csv(over_time, out / "results_over_time.csv")
    write_csv(memory_rows, out / "memory.csv")
    measured = [ok for *_, ok in verdicts if ok is not None]
    unmeasured = len(verdicts) - len(measured)
    print(f"{sum(measured)} of {len(measured)} "
          + (f"measured trend checks hold ({unmeasured} not measured)" if unmeasured
             else "trend checks hold")
          + f"; files under {out}")
    return 0


def _plot_results(path: Path, fig: int, ratios, rows) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    plt.figure(figsize=(7, 4.5))
    for name in ("unlimited", *STRATEGIES):
        pts = [(r["minute"], r["runtime_results"]) for r in rows
               if r["figure"] == fig and r["strategy"] == name]
        plt.plot(*zip(*pts), label=name, linestyle="--" if name == "unlimited" else "-")
    plt.xlabel("event time (minutes)")
    plt.ylabel("run-time results (cumulative)")
    plt.title(f"Figure {fig}: run-time throughput, join ratios {ratios}")
    plt.legend()
    plt.tight_layout()
    plt.savefig(path, dpi=110)
    plt.close()


def _plot_memory(path: Path, title: str, rows, fig: int, names, budget: int) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    plt.figure(figsize=(7, 4.5))
    for name in names:
        pts = [(r["minute"], r["model_bytes"] / 1e6) for r in rows
               if r["figure"] == fig and r["strategy"] == name]
        plt.plot(*zip(*pts), label=name)
    plt.axhline(budget / 1e6, color="grey", linestyle=":", label="budget")
    plt.xlabel("event time (minutes)")
    plt.ylabel("state (MB, model of §2.2)")
    plt.title(title)
    plt.legend()
    plt.tight_layout()
    plt.savefig(path, dpi=110)
    plt.close()


def _plot_bars(path: Path, title: str, panels: list[tuple]) -> None:
    """Bar charts side by side, one a panel: (y label, {bar: value}[, (line y, line label)])
    -- the numbers of perf.csv, formats.csv and rebuild.csv as they are printed."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4), squeeze=False)
    for ax, (ylabel, bars, *line) in zip(axes[0], panels, strict=True):
        ax.bar(range(len(bars)), list(bars.values()), color="#4c72b0")
        ax.set_xticks(range(len(bars)), list(bars), rotation=30, ha="right", fontsize=8)
        ax.set_ylabel(ylabel)
        if line:
            ax.axhline(line[0][0], color="grey", linestyle=":", label=line[0][1])
            ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ----- perf: fresh processes -------------------------------------------------------------
def single(folder: str, spill: str | None) -> dict:
    """One run in this process (inputs read from ``folder``); CPU from getrusage."""
    import pyarrow.parquet as pq

    from adaptcq.runtime.local import current_rss, stream
    sql = (Path(folder) / "query.sql").read_text()
    tables = {s: pq.read_table(Path(folder) / f"{s}.parquet") for s in "ABCDE"}
    rss0 = current_rss()
    options = {"spill": json.loads(spill)} if spill else {}
    run = stream(sql, tables, executor="tree", **options)
    runtime = late = 0
    for b in run:
        n_late = b.column("_late").to_numpy(zero_copy_only=False).sum()
        late += int(n_late)
        runtime += b.num_rows - int(n_late)
    ru = resource.getrusage(resource.RUSAGE_SELF)
    s = run.stats
    with open("/proc/self/status") as f:
        hwm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM"))
    return {"runtime_results": runtime, "late_results": late, "results": s["results"],
            "engine_cpu_s": s["cpu_seconds"], "cleanup_cpu_s": s.get("cleanup_cpu_seconds", 0),
            "process_cpu_s": ru.ru_utime + ru.ru_stime, "spills": s.get("spills", 0),
            "cleanups": s.get("cleanups", 0), "cleanup_writebacks": s.get("cleanup_writebacks", 0),
            "end_cleanup_cpu_s": s.get("end_cleanup_cpu_seconds", 0),
            "peak_state_model": s["peak_state_bytes"], "peak_rss": hwm, "rss_before": rss0}


def _fresh(folder: Path, spill: dict | None) -> dict:
    cmd = [sys.executable, "-m", "adaptcq.bench.spill", "--single", str(folder)]
    if spill:
        cmd += ["--spill", json.dumps(spill)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _workload_folder(root: Path, name: str, arrivals: int, args):
    import pyarrow.parquet as pq

    from adaptcq.stream.spill_workload import spill_five_way
    folder = root / name
    folder.mkdir()
    wl = spill_five_way(arrivals, ratios=tuple(args.ratios), window=args.window,
                        seed=args.seed)
    for s, t in wl.tables.items():
        pq.write_table(t, folder / f"{s}.parquet")
    (folder / "query.sql").write_text(wl.sql)
    return folder, wl


def perf(args) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    short_n = args.arrivals // 5
    if short_n < 10_000:
        raise SystemExit("perf: --arrivals must be at least 50,000 (the fixed overhead is "
                         "measured on a run a fifth as long)")
    with tempfile.TemporaryDirectory(prefix="adaptcq-spill-bench-") as tmp:
        folder, wl = _workload_folder(Path(tmp), "run", args.arrivals, args)
        print(f"the paper's plan, {args.arrivals:,} arrivals, [RANGE {args.window:g} SECONDS], "
              f"join ratios {tuple(args.ratios)}, K = {wl.params['tuple_range']:,}")
        base = _fresh(folder, None)
        budget = int(base["peak_state_model"] / 10)
        print(f"  unlimited: {base['results']:,} results, {base['engine_cpu_s']:.1f} engine "
              f"CPU-s, peak state {base['peak_state_model'] / 1e6:,.1f} MB (model), peak RSS "
              f"{base['peak_rss'] / 2**20:,.0f} MiB")
        spill = {"strategy": "global-penalty", "memory": budget}  # the run's defaults
        r = _fresh(folder, spill)
        # The fixed overhead: what a run under the same budget holds above its loaded
        # inputs when it is a fifth as long (the engine, its statistics, a chunk of
        # output, a clean-up's working memory, the allocator's arenas). Memory that grows
        # with the run shows as the long run's excess over it. (On this workload RSS
        # settles after about 200,000 arrivals: a shorter run understates it.)
        short = _fresh(_workload_folder(Path(tmp), "short", short_n, args)[0], spill)
    if r["results"] != base["results"]:
        raise SystemExit(f"penalty run: {r['results']:,} results, unlimited "
                         f"{base['results']:,}")
    run_cpu = r["engine_cpu_s"] - r["cleanup_cpu_s"]
    rate_base = base["results"] / base["engine_cpu_s"]
    rate = r["runtime_results"] / run_cpu
    above = r["peak_rss"] - r["rss_before"]
    fixed = short["peak_rss"] - short["rss_before"]
    rows = [{"run": "unlimited", "arrivals": args.arrivals, "budget": "", **base},
            {"run": "global-penalty", "arrivals": args.arrivals, "budget": budget, **r},
            {"run": "global-penalty (a fifth as long)", "arrivals": short_n,
             "budget": budget, **short}]
    write_csv(rows, out / "perf.csv")
    ok_rate = rate * 2 >= rate_base
    ok_clean = r["cleanup_cpu_s"] < run_cpu
    ok_rss = above <= budget + fixed
    print(f"  global-penalty, budget {budget / 1e6:,.2f} MB: {r['runtime_results']:,} run-time "
          f"results ({r['runtime_results'] / base['results']:.1%}), {r['spills']} spills, "
          f"{r['cleanups']} clean-ups ({r['cleanup_writebacks']:,} groups written back), run "
          f"{run_cpu:.1f} CPU-s, clean-ups {r['cleanup_cpu_s']:.1f} CPU-s, peak RSS "
          f"{r['peak_rss'] / 2**20:,.0f} MiB")
    print(f"  run-time results per CPU-second: {rate:,.0f} against unlimited {rate_base:,.0f} "
          f"({rate / rate_base:.2f}×; target ≥ 0.5×): {'MET' if ok_rate else 'NOT MET'}")
    print(f"  clean-up {r['cleanup_cpu_s']:.1f} CPU-s against the run's {run_cpu:.1f}: "
          f"{'MET' if ok_clean else 'NOT MET'} (of it, the end of input's "
          f"{r['end_cleanup_cpu_s']:.2f} CPU-s; the rest ran while running, as write-backs)")
    print(f"  peak RSS {r['peak_rss'] / 2**20:,.0f} MiB: {above / 2**20:,.1f} MiB above the "
          f"process with its inputs loaded ({r['rss_before'] / 2**20:,.0f} MiB), against the "
          f"budget {budget / 2**20:,.2f} MiB + the fixed overhead {fixed / 2**20:,.1f} MiB (a "
          f"{short_n:,}-arrival run's peak above its loaded inputs, same budget): "
          f"{'MET' if ok_rss else 'NOT MET'}")
    _plot_bars(out / "perf.png", f"spill perf: {args.arrivals:,} arrivals, global-penalty "
               f"under {budget / 1e6:,.2f} MB", [
                   ("run-time results per CPU-second",
                    {"unlimited": rate_base, "global-penalty": rate},
                    (rate_base / 2, "target: half of unlimited")),
                   ("CPU seconds (global-penalty)",
                    {"run": run_cpu, "clean-up": r["cleanup_cpu_s"]}),
                   ("peak RSS above the loaded inputs (MiB)",
                    {"global-penalty": above / 2**20, f"{short_n:,} arrivals": fixed / 2**20},
                    ((budget + fixed) / 2**20, "budget + fixed overhead"))])
    print(f"  wrote {out / 'perf.csv'}, {out / 'perf.png'}")
    return 0


def formats(args) -> int:
    """The spill store's file format, chosen by measurement: the spill events of a Figure
    16 run (kept with ``--cleanup off``) written and read back as Arrow IPC (zstd, lz4,
    none) and Parquet (zstd, snappy); CPU seconds and bytes."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyarrow import ipc

    from adaptcq.runtime.local import run
    from adaptcq.stream.spill_workload import spill_five_way
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    wl = spill_five_way(args.arrivals, ratios=(3, 1, 1), seed=args.seed)
    with tempfile.TemporaryDirectory(prefix="adaptcq-spill-formats-") as tmp:
        base = run(wl.sql, wl.tables, executor="tree").stats["peak_state_bytes"]
        run(wl.sql, wl.tables, spill={"strategy": "global-penalty", "memory": base // 4,
                                      "cleanup": "off", "directory": tmp, "when_free": False})
        tables = []
        for f in sorted(Path(tmp).glob("spill-*.arrow")):
            with pa.memory_map(str(f)) as src:
                tables.append(ipc.open_file(src).read_all())
        rows = sum(t.num_rows for t in tables)

        def timed(write, read) -> tuple[float, float, int]:
            folder = Path(tmp) / "fmt"
            folder.mkdir(exist_ok=True)
            for p in folder.iterdir():
                p.unlink()
            t0 = time.process_time()
            for k, t in enumerate(tables):
                write(t, folder / f"{k}")
            t1 = time.process_time()
            for k in range(len(tables)):
                read(folder / f"{k}")
            t2 = time.process_time()
            return t1 - t0, t2 - t1, sum(p.stat().st_size for p in folder.iterdir())

        def ipc_writer(codec):
            def write(t, path):
                with ipc.new_file(str(path), t.schema,
                                  options=ipc.IpcWriteOptions(compression=codec)) as w:
                    w.write_table(t)
            return write

        def ipc_read(path):
            with pa.memory_map(str(path)) as src:
                ipc.open_file(src).read_all().to_pylist()

        cases = {f"arrow-ipc-{c or 'none'}": (ipc_writer(c), ipc_read)
                 for c in ("zstd", "lz4", None)}
        for codec in ("zstd", "snappy"):
            cases[f"parquet-{codec}"] = (
                lambda t, path, codec=codec: pq.write_table(t, str(path), compression=codec),
                lambda path: pq.read_table(str(path)).to_pylist())
        rows_out = []
        for name, (w, r) in cases.items():
            wt, rt, size = timed(w, r)
            rows_out.append({"format": name, "files": len(tables), "rows": rows,
                             "write_cpu_s": round(wt, 3), "read_cpu_s": round(rt, 3),
                             "bytes": size})
            print(f"{name:>18}: write {wt:6.3f} CPU-s, read (to Python rows) {rt:6.3f} "
                  f"CPU-s, {size / 1e6:8.1f} MB for {rows:,} stored inputs in "
                  f"{len(tables)} spill events")
    write_csv(rows_out, out / "formats.csv")
    _plot_bars(out / "formats.png", f"spill file formats: {rows:,} stored inputs in "
               f"{len(tables)} spill events ({args.arrivals:,} arrivals)", [
                   ("write CPU seconds", {x["format"]: x["write_cpu_s"] for x in rows_out}),
                   ("read CPU seconds (to Python rows)",
                    {x["format"]: x["read_cpu_s"] for x in rows_out}),
                   ("MB on disk", {x["format"]: x["bytes"] / 1e6 for x in rows_out})])
    print(f"wrote {out / 'formats.csv'}, {out / 'formats.png'}")
    return 0


def _outputs(path: Path):
    """A job's output (a Parquet file or folder) as a multiset, ``_late`` left out: which
    results come late depends on the spills, the results do not."""
    from collections import Counter

    import pyarrow.dataset as ds
    t = ds.dataset(str(path), format="parquet").to_table()
    cols = [c for c in t.column_names if c != "_late"]
    return Counter(zip(*(t.column(c).to_pylist() for c in cols), strict=True))


def spark(args) -> int:
    import statistics

    import pyarrow.parquet as pq

    from adaptcq.stream.spill_workload import spill_five_way
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    spill = ["--spill", "global-penalty", "--memory", args.memory]
    rows = []
    with tempfile.TemporaryDirectory(prefix="adaptcq-spill-spark-") as tmp:
        folder = Path(tmp)
        wl = spill_five_way(args.arrivals, seed=args.seed)
        for name, t in wl.tables.items():
            pq.write_table(t, folder / f"{name}.parquet")
        inputs = [x for name in wl.tables for x in ("--input", f"{name}={folder}/{name}.parquet")]
        spark_opts = ["--engine", "spark", "--master", args.master,
                      "--partitions", str(args.partitions)]
        jobs = {"local, spilling": spill, "spark, spilling": spark_opts + spill,
                "spark, no spilling": spark_opts}
        print(f"§6.1's workload, {wl.n_updates:,} arrivals, unbounded state, ratios (3, 1, 1); "
              f"--memory {args.memory}; Spark: {args.partitions} groups on {args.master}")
        for r in range(args.repeats):
            outputs = []
            for job, opts in jobs.items():
                o = str(folder / f"out-{r}-{len(outputs)}") + (
                    "" if "--engine" in opts else ".parquet")
                summary = folder / f"summary-{r}-{len(outputs)}.json"
                cmd = [sys.executable, "-c", CLI, "run", "--sql", wl.sql, *inputs, *opts,
                       "--output", o, "--summary-json", str(summary), "--no-progress"]
                if "--engine" in opts:
                    cmd += ["--checkpoint", str(folder / f"ck-{r}-{len(outputs)}")]
                t0 = time.perf_counter()
                done = subprocess.run(cmd, capture_output=True, text=True, check=False)
                wall = time.perf_counter() - t0
                if done.returncode:
                    raise SystemExit(f"{job} failed:\n{done.stderr[-3000:]}")
                sm = json.loads(summary.read_text())
                sp = sm.get("spill") or sm
                rows.append({"round": r + 1, "job": job, "wall_seconds": round(wall, 2),
                             "results": sm["results"], "spills": sp.get("spills", 0),
                             "late_results": sp.get("late_results", 0),
                             "cleanup_cpu_seconds": sp.get("cleanup_cpu_seconds", 0.0)})
                outputs.append(_outputs(o))
                print(f"  round {r + 1}: {job}: {wall:.1f} s, {rows[-1]['spills']} spills, "
                      f"{rows[-1]['late_results']:,} late results of {sm['results']:,}")
            if any(x != outputs[0] for x in outputs[1:]):
                raise SystemExit(f"round {r + 1}: the three jobs' outputs differ")
    write_csv(rows, out / "spark.csv")
    med = {job: statistics.median(x["wall_seconds"] for x in rows if x["job"] == job)
           for job in jobs}
    ratios = [a["wall_seconds"] / b["wall_seconds"] for a, b in zip(
        [x for x in rows if x["job"] == "spark, spilling"],
        [x for x in rows if x["job"] == "spark, no spilling"], strict=True)]
    print("  outputs equal in every round (as multisets, _late left out)")
    for job, m in med.items():
        print(f"  {job}: median {m:.1f} s")
    print(f"  Spark with spilling / without, per round: "
          f"{', '.join(f'{x:.2f}' for x in ratios)}")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.bar(list(med), list(med.values()), color=["#4c72b0", "#dd8452", "#55a868"])
    ax.set_ylabel("wall seconds (median, whole process)")
    ax.set_title(f"spilling on Spark: {args.arrivals:,} arrivals, --memory {args.memory}")
    fig.tight_layout()
    fig.savefig(out / "spark.png", dpi=120)
    plt.close(fig)
    print(f"  wrote {out / 'spark.csv'}, {out / 'spark.png'}")
    return 0


# ----- rebuild: a spilling Spark group rebuilt from its store ----------------------------
def single_rebuild(rows: int, folder: str, seed: int = 0) -> dict:
    """One spilling partition group driven as Spark drives it (``advance_group`` over an
    in-memory store, no JVM): ``rows`` rows a stream over three unbounded streams (join
    keys drawn with ``seed``, ``--seed``), 20,000 a micro-batch, a 4 MB budget (global-penalty), then its live copy dropped and one
    micro-batch that only moves the frontier: a rebuild (the stored rows replayed with the
    journal's spill events). CPU of the rebuild, and the peak RSS during it above the RSS
    before it (VmHWM reset through /proc/self/clear_refs)."""
    import random
    import uuid

    import pyarrow as pa

    from adaptcq.query.cql import parse_query
    from adaptcq.runtime import spark_group as sg
    from adaptcq.runtime.local import current_rss
    from adaptcq.runtime.spark_split import PUNCT, _Config, _ipc, plan_split
    from adaptcq.runtime.spill import spark_spill_spec
    sql = ("SELECT A.id AS a, B.id AS b, C.id AS c FROM A, B, C "
           "WHERE A.x = B.x AND B.y = C.y AND A.id < 0")  # the joins run, no output
    kinds = {s: {c: "number" for c in ("id", "x", "y", "ts")} for s in "ABC"}
    q = parse_query(sql, kinds)
    cfg = _Config(
        qid=uuid.uuid4().hex, sql=q.sql, schemas=kinds, executor="tree", mode="append",
        options={"tree": (("A", "B"), "C")}, adaptivity=None, groups=1, keys=[0],
        lateness=0.0, lateness_ns=0, signed=False, n_streams=3,
        stream_columns=[[f"c{i}_{k}" for k in range(len(q.columns[a]))]
                        for i, a in enumerate("ABC")],
        reported=[True] * 3, sources=list("ABC"), names=["a", "b", "c"],
        plan=plan_split(q, 1), aliases=list("ABC"),
        inputs={a: pa.schema([(c, pa.int64()) for c in q.columns[a]]) for a in "ABC"},
        spill=spark_spill_spec({"strategy": "global-penalty", "memory": "4MB",
                                "directory": folder}, 1))
    store, rng, per = sg.MemoryStore(), random.Random(seed), 20_000

    def punct(maxima) -> tuple:
        return (PUNCT, json.dumps({"end": False, "maxima": maxima, "cleanup": False}).encode())

    for b in range(0, rows, per):
        n = min(per, rows - b)
        ts = [(b + k) * 10**6 for k in range(n)]  # one row a millisecond
        packets = [punct([(i, ts[-1], n) for i in range(3)])]
        for i, a in enumerate("ABC"):
            cols = {"_t": pa.array(ts, pa.int64()),
                    "_o1": pa.array([""] * n).dictionary_encode(),
                    "_o2": pa.array(range(b, b + n), pa.int64())}
            for k, c in enumerate(q.columns[a]):  # ids, and join keys in 5,000 values
                cols[f"c{i}_{k}"] = pa.array(range(b, b + n) if c == "id" else
                                             [rng.randrange(5000) for _ in range(n)],
                                             pa.int64())
            cols["_pr"] = pa.array([True] * n)
            packets.append((i, _ipc(pa.table(cols))))
        sg.advance_group(cfg, 0, store, packets)
    sg._LIVE.clear()  # a restart: no live copy
    import gc
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM from here: the rebuild's peak alone
    before = current_rss()
    stats = sg.advance_group(cfg, 0, store, [punct([(0, 0, 0)])])[4]
    with open("/proc/self/status") as f:
        hwm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM"))
    return {"rows": 3 * rows, "seed": seed, "rebuilt_rows": stats["rebuilt_rows"],
            "rebuild_cpu_s": round(stats["rebuild_cpu_seconds"], 3),
            "rss_before_mib": round(before / 2**20, 1),
            "peak_above_mib": round((hwm - before) / 2**20, 1),
            "replay_rows": getattr(sg, "REPLAY_ROWS", "all")}  # (older trees: all at once)


def rebuild(args) -> int:
    """``rebuild``: ``single_rebuild`` in fresh processes, ``--repeats`` times."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="adaptcq-rebuild-bench-") as tmp:
        for r in range(args.repeats):
            cmd = [sys.executable, "-m", "adaptcq.bench.spill", "--single-rebuild",
                   str(args.rows), str(Path(tmp) / f"run{r}"), str(args.seed)]
            done = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if done.returncode:
                raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
            rows.append({"repeat": r, **json.loads(done.stdout.strip().splitlines()[-1])})
    write_csv(rows, out / "rebuild.csv")
    import statistics
    print(f"rebuild of one spilling group, {3 * args.rows:,} stored rows (3 unbounded "
          f"streams, 4 MB budget), {args.repeats} fresh processes:")
    print(f"  rebuild CPU median {statistics.median(r['rebuild_cpu_s'] for r in rows):.2f} s,"
          f" peak RSS above the RSS before it median "
          f"{statistics.median(r['peak_above_mib'] for r in rows):.0f} MiB "
          f"(rows turned into Python rows {rows[0]['replay_rows']:,} at a time)"
          if isinstance(rows[0]["replay_rows"], int) else "(rows turned into Python rows "
          "all at once)")
    _plot_bars(out / "rebuild.png", f"rebuild of one spilling group: {3 * args.rows:,} "
               f"stored rows, seed {args.seed}", [
                   ("rebuild CPU seconds", {f"repeat {r['repeat'] + 1}": r["rebuild_cpu_s"]
                                            for r in rows}),
                   ("peak RSS above the RSS before it (MiB)",
                    {f"repeat {r['repeat'] + 1}": r["peak_above_mib"] for r in rows})])
    print(f"  wrote {out / 'rebuild.csv'}, {out / 'rebuild.png'}")
    return 0


def _arrivals(text: str) -> int:
    """Arrivals over the five streams: at least one a stream (``spill_five_way``)."""
    n = positive_int(text)
    if n < 5:
        raise argparse.ArgumentTypeError(f"{n} must be at least 5 (one arrival a stream)")
    return n


def _figures(text: str) -> list[int]:
    return [int(x) for x in choices(map(str, FIGURES))(text)]


def _ratios(text: str) -> list[int]:
    ratios = [positive_int(x.strip()) for x in text.split(",")]
    if len(ratios) != 3:
        raise argparse.ArgumentTypeError(f"{text!r}: three join ratios (Join1, Join2, Join3)")
    return ratios


def _memory(text: str) -> str:
    """A size ``adaptcq run --memory`` takes, checked here: not after the data is built."""
    from adaptcq.adapt.spilling import parse_bytes
    from adaptcq.errors import AdaptcqError
    try:
        parse_bytes(text)
    except AdaptcqError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--single-rebuild"]:  # ROWS FOLDER [SEED]: rebuild's child process
        print(json.dumps(single_rebuild(int(argv[1]), argv[2],
                                        int(argv[3]) if len(argv) > 3 else 0)))
        return 0
    if argv[:1] == ["--single"]:
        spill = argv[argv.index("--spill") + 1] if "--spill" in argv else None
        print(json.dumps(single(argv[1], spill)))
        return 0
    p = argparse.ArgumentParser(prog="python -m adaptcq.bench.spill",
                                description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    f = sub.add_parser("figures", help="Figures 16-20 and clean-up times (§6.2)")
    f.add_argument("--arrivals", type=_arrivals, default=300_000,
                   help="arrivals over the five streams (default 300,000: the paper's 50 "
                   "minutes at 50 ms per stream)")
    f.add_argument("--budget-fraction", type=fraction, default=0.25,
                   help="the budget as a fraction (0, 1] of the unlimited run's peak state "
                   "(default 0.25)")
    f.add_argument("--figures", type=_figures, default=list(FIGURES), metavar="N,...",
                   help="figures, comma-separated, from 16 (join ratios 3,1,1; also "
                   "Figures 17, 18), 19 (1,3,3), 20 (3,2,3) (default all)")
    q = sub.add_parser("perf", help="the issue's performance check (fresh processes)")
    q.add_argument("--arrivals", type=_arrivals, default=5_000_000,
                   help="arrivals over the five streams, at least 50,000 (default "
                   "5,000,000)")
    q.add_argument("--window", type=positive_float, default=20.0,
                   help="[RANGE W SECONDS] on every stream (default 20)")
    q.add_argument("--ratios", type=_ratios, default=[2, 1, 1], metavar="R1,R2,R3",
                   help="average join ratios of Join1, Join2, Join3, whole numbers >= 1 "
                   "(default 2,1,1)")
    fm = sub.add_parser("formats", help="the spill file format, by measurement")
    fm.add_argument("--arrivals", type=_arrivals, default=100_000,
                    help="arrivals of the Figure 16 run whose spill events are stored "
                    "(default 100,000)")
    sk = sub.add_parser("spark", help="spilling on Spark against local and unspilled Spark")
    sk.add_argument("--arrivals", type=_arrivals, default=100_000,
                    help="arrivals over the five streams (default 100,000)")
    sk.add_argument("--memory", type=_memory, default="64MB",
                    help="the spill budget, as `adaptcq run --memory` (default 64MB)")
    sk.add_argument("--partitions", type=positive_int, default=2,
                    help="Spark partition groups (default 2)")
    sk.add_argument("--repeats", type=positive_int, default=3,
                    help="rounds of the three jobs, median reported (default 3)")
    sk.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    rb = sub.add_parser("rebuild", help="a spilling Spark group's rebuild: CPU and memory")
    rb.add_argument("--rows", type=positive_int, default=200_000,
                    help="rows per stream (default 200,000)")
    rb.add_argument("--repeats", type=positive_int, default=3,
                    help="fresh processes, median reported (default 3)")
    for sp in (f, q, fm, sk, rb):
        sp.add_argument("--seed", type=nonnegative_int, default=0,
                        help="seed of the data (default 0)")
        sp.add_argument("--out", default="results/spill",
                        help="folder for the CSV and PNG files (default %(default)s)")
    args = p.parse_args(argv)
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
    return {"figures": figures, "perf": perf, "formats": formats,
            "spark": spark, "rebuild": rebuild}[args.what](args)


if __name__ == "__main__":
    sys.exit(main())
