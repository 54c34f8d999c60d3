"""adaptcq on Spark versus Spark's own stream-stream joins, on one machine (local[2]).

``python -m adaptcq.bench.spark_vs_native [--arrivals 3000000] [--repeats 3]
[--out results/spark_vs_native]``

Windowed 3-way joins, ``[RANGE 10 SECONDS]`` on every stream, append mode, over the same
Parquet files (each stream cut into ``--files`` time slices, one per micro-batch):

(a) ``R(a) ⋈ S(a) ⋈ T(a)`` (a-caching.txt §7.3's n-way join generator, n = 3, σ = 1e-4 per
    pair): one attribute class spans all streams, so adaptcq's partition groups split on it;
(b) ``R(a) ⋈ S(a,b) ⋈ T(b)`` (a-caching.txt §7.2's default workload with a 10 s window): no
    class spans all streams, so the groups come from shares on a and b (HyperCube);
(c), (d) the same two shapes where joins are selective: 1,000,000 rows per stream, keys
    uniform in 60,000 values, about 3,260 results (``--arrivals`` does not apply): the
    engine is mostly idle and the Spark–Python boundary is what costs.

Spark native expresses the same window semantics as a chain of inner stream-stream joins with
watermarks and time-range conditions (every pair ``|Δts| <= 10 s``, which is exactly when
``[RANGE 10 SECONDS]`` windows hold all three tuples together: docs/semantics.md). Each engine
runs in a fresh process (``--job``), timed from process start to exit (JVM start-up
included), both from the same class-data archive of Spark's classes (``runtime.jvm_archive``,
built first when missing, untimed; ``--no-jvm-archive``: both without); CPU seconds are
those of the whole process tree (driver, JVM, Python workers), sampled from /proc (each process's own time). The result multisets of (R.id, S.id, T.id) are checked equal.
With ``--repeats N`` the two engines run alternately N times per case and the figures are
medians (the ratio of the median walls, and each run's ratio beside it). Writes
``<out>/spark_vs_native.csv`` and ``.png`` and prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

from adaptcq.bench._args import choices, positive_int, refuse_unused, whole_at_least
from adaptcq.bench.spark_scale import (
    TreeCPU,
    add_jvm_archive_argument,
    prepare_jvm_archive,
    timed_job,
    write_csv,
)
from adaptcq.errors import AdaptcqError

#: ``--arrivals``: the workloads here have three streams
ARRIVALS = whole_at_least(3, "one arrival per stream of the three")
#: ``--executor``: what ``runtime.spark.run_files`` runs in a partition group on these joins
#: (``shed`` needs load-shedding options this benchmark does not give)
EXECUTORS = ("auto", "vector", "mjoin", "xjoin", "tree", "acaching")

WINDOW = 10.0
EPOCH_SHIFT_US = 10**15  # about 31 years

SELECTIVE_ROWS = 1_000_000  # rows per stream of the selective cases c and d
SELECTIVE_DOMAIN = 60_000  # their key domain
SELECTIVE_RATE = 197.8  # rows per second per stream: about 3,260 results with W = 10 s

SQL = {
    "a": ("SELECT R.id AS rid, S.id AS sid, T.id AS tid FROM R [RANGE 10 SECONDS], "
          "S [RANGE 10 SECONDS], T [RANGE 10 SECONDS] WHERE R.a = S.a AND S.a = T.a"),
    "b": ("SELECT R.id AS rid, S.id AS sid, T.id AS tid FROM R [RANGE 10 SECONDS], "
          "S [RANGE 10 SECONDS], T [RANGE 10 SECONDS] WHERE R.a = S.a AND S.b = T.b"),
}
SQL["c"], SQL["d"] = SQL["a"], SQL["b"]
TITLE = {"a": "(a) R(a)⋈S(a)⋈T(a): partitions on a",
         "b": "(b) R(a)⋈S(a,b)⋈T(b): shares on a and b",
         "c": "(c) R(a)⋈S(a)⋈T(a), selective: 3M rows, ~3,260 results",
         "d": "(d) R(a)⋈S(a,b)⋈T(b), selective: 3M rows, ~3,260 results"}


# ----- data --------------------------------------------------------------------------------

def make_data(case: str, arrivals: int, files: int, root: Path) -> dict[str, str]:
    """Write the case's streams as ``files`` consecutive time slices per stream."""
    import numpy as np
    import pyarrow.parquet as pq

    from adaptcq.stream.workloads import nway, three_way
    d = root / f"case_{case}"
    marker = d / "done.json"
    if case in "cd":
        arrivals = 3 * SELECTIVE_ROWS  # the selective cases have their own fixed size
    if marker.exists() and json.loads(marker.read_text()) == [arrivals, files]:
        return {s: str(d / s) for s in "RST"}
    shutil.rmtree(d, ignore_errors=True)
    if case in "cd":
        wl = _selective()
    elif case == "a":
        wl = nway(3, names=("R", "S", "T"), n_updates=arrivals, window=WINDOW, rate=1000.0,
                  selectivities={frozenset(p): 1e-4 for p in (("R", "S"), ("R", "T"),
                                                              ("S", "T"))})
    else:
        wl = three_way(n_updates=arrivals, window=WINDOW)
    end = max(t.column("ts").to_numpy()[-1] for t in wl.tables.values()) + 1e-9
    cuts = np.linspace(0.0, end, files + 1)
    for s, t in wl.tables.items():
        (d / s).mkdir(parents=True)
        ts = t.column("ts").to_numpy()
        idx = np.searchsorted(ts, cuts, side="left")
        for k in range(files):
            p = d / s / f"part-{k:04d}.parquet"
            pq.write_table(t.slice(idx[k], idx[k + 1] - idx[k]), p)
            os.utime(p, (1_600_000_000 + 10 * k, 1_600_000_000 + 10 * k))
    marker.write_text(json.dumps([arrivals, files]))
    return {s: str(d / s) for s in "RST"}


def _selective():
    """Cases c and d: 1,000,000 rows per stream, keys a and b uniform in [0, 60,000), times
    uniform at 197.8 rows per second per stream (about 5,056 s): with W = 10 s a result
    needs two key matches within 10 s, about N·(2Wλ/D)²·3/4 ≈ 3,260 of them, on either
    shape."""
    from types import SimpleNamespace

    import numpy as np
    import pyarrow as pa
    rng = np.random.default_rng(2024)
    n, span = SELECTIVE_ROWS, SELECTIVE_ROWS / SELECTIVE_RATE
    tables = {s: pa.table({"ts": np.sort(rng.uniform(0, span, n)), "id": np.arange(n),
                           "a": rng.integers(0, SELECTIVE_DOMAIN, n),
                           "b": rng.integers(0, SELECTIVE_DOMAIN, n)}) for s in "RST"}
    return SimpleNamespace(tables=tables)


# ----- the two jobs ------------------------------------------------------------------------

def job_adaptcq(case: str, srcs: dict, out: Path, partitions: int,
                master: str = "local[2]", executor: str = "auto") -> dict:
    from adaptcq.runtime.spark import run_files
    from adaptcq.runtime.spark_session import get_spark
    spark = get_spark(master, "bench-adaptcq")
    t0 = time.perf_counter()
    run = run_files(spark, SQL[case], srcs, str(out / "ck"), str(out / "result"),
                    mode="append", partitions=partitions, max_files_per_trigger=1,
                    executor=executor)
    stream_s = time.perf_counter() - t0
    return {"rows_in": run.rows_in, "results": run.results, "batches": run.batches,
            "stream_seconds": stream_s, "peak_state_tuples": run.peak_state_tuples,
            "peak_state_bytes": run.peak_state_bytes, "groups": len(run.groups),
            "engine_cpu_seconds": run.engine_cpu_seconds,
            "cache_hits": run.live_copies, "group_batches": run.group_batches,
            "executor": run.executor}


def job_native(case: str, srcs: dict, out: Path, master: str = "local[2]") -> dict:
    from pyspark.sql import functions as F

    from adaptcq.runtime.spark_session import get_spark
    spark = get_spark(master, "bench-native")
    t0 = time.perf_counter()

    def side(name: str):
        schema = spark.read.parquet(srcs[name]).schema
        df = spark.readStream.option("maxFilesPerTrigger", 1).schema(schema).parquet(srcs[name])
        cols = [F.col(c).alias(f"{name}_{c}") for c in df.columns if c != "ts"]
        # Event times shifted by a constant (no Δts changes): Spark treats a row at the
        # epoch itself as behind its initial watermark (0) and drops it.
        return (df.select(F.timestamp_micros(F.round(F.col("ts") * 1e6).cast("long")
                                             + EPOCH_SHIFT_US).alias(f"{name}_et"), *cols)
                .withWatermark(f"{name}_et", "0 seconds"))

    def near(x: str, y: str) -> str:
        return (f"{y}_et BETWEEN {x}_et - INTERVAL {int(WINDOW)} SECONDS "
                f"AND {x}_et + INTERVAL {int(WINDOW)} SECONDS")

    r, s, t = side("R"), side("S"), side("T")
    rs = r.join(s, F.expr(f"R_a = S_a AND {near('R', 'S')}"))
    # Spark allows one event-time column per stream into the next stateful operator (and no
    # new watermark after a join): the pair keeps R_et as its event time, S_et goes on as a
    # plain value (an expression drops the watermark metadata). The range conditions on R_et
    # let Spark evict the pairs' state.
    rs = rs.select(*[(F.col(c) + F.expr("INTERVAL 0 SECONDS")).alias(c) if c == "S_et"
                     else F.col(c) for c in rs.columns])
    key = "T_a = S_a" if case in ("a", "c") else "T_b = S_b"
    rst = rs.join(t, F.expr(f"{key} AND {near('R', 'T')} AND {near('S', 'T')}"))
    res = rst.select(F.col("R_id").alias("rid"), F.col("S_id").alias("sid"),
                     F.col("T_id").alias("tid"))
    q = (res.writeStream.format("parquet").option("path", str(out / "result"))
         .option("checkpointLocation", str(out / "ck")).trigger(availableNow=True).start())
    q.awaitTermination()
    stream_s = time.perf_counter() - t0
    prog = q.recentProgress
    rows_in = sum(p["numInputRows"] for p in prog)
    peak_rows = max((sum(o.get("numRowsTotal", 0) for o in p["stateOperators"])
                     for p in prog), default=0)
    peak_bytes = max((sum(o.get("memoryUsedBytes", 0) for o in p["stateOperators"])
                      for p in prog), default=0)
    return {"rows_in": rows_in, "results": spark.read.parquet(str(out / "result")).count(),
            "batches": len(prog), "stream_seconds": stream_s, "peak_state_tuples": peak_rows,
            "peak_state_bytes": peak_bytes}


def run_job(engine: str, case: str, data: Path, out: Path, partitions: int,
            master: str = "local[2]", executor: str = "auto") -> dict:
    """One engine on one case in a fresh process: wall time from start to exit."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    cmd = [sys.executable, "-m", "adaptcq.bench.spark_vs_native", "--job", engine,
           "--case", case, "--data", str(data), "--job-out", str(out),
           "--partitions", str(partitions), "--master", master, "--executor", executor]
    return timed_job(cmd, f"{engine} job on case {case}")


def same_results(a: Path, b: Path) -> tuple[bool, int, int]:
    import numpy as np
    import pyarrow.parquet as pq

    def ids(p):
        t = pq.read_table(p, columns=["rid", "sid", "tid"])
        m = np.stack([t.column(c).to_numpy() for c in ("rid", "sid", "tid")], axis=1)
        return m[np.lexsort(m.T[::-1])] if len(m) else m
    x, y = ids(a), ids(b)
    return bool(x.shape == y.shape and (x == y).all()), len(x), len(y)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m adaptcq.bench.spark_vs_native", description=__doc__.split("\n\n")[0])
    ap.add_argument("--arrivals", type=ARRIVALS, default=3_000_000,
                    help="arrivals of cases a and b (default 3,000,000; c and d: 3,000,000, "
                         "fixed)")
    ap.add_argument("--files", type=positive_int, default=10,
                    help="time slices (micro-batches; default 10)")
    ap.add_argument("--partitions", type=positive_int, default=2,
                    help="adaptcq's partition groups (default 2)")
    ap.add_argument("--repeats", type=positive_int, default=1,
                    help="runs of each engine per case, alternating (figures are medians; "
                         "default 1)")
    ap.add_argument("--cases", type=choices(SQL), default=sorted(SQL),
                    help="comma-separated, from a (R(a)⋈S(a)⋈T(a)), b (R(a)⋈S(a,b)⋈T(b)), "
                         "c and d (the same two, selective, 3,000,000 rows); default all")
    ap.add_argument("--out", default="results/spark_vs_native",
                    help="folder of the CSV, the PNG, the inputs and the jobs' outputs "
                         "(default results/spark_vs_native)")
    ap.add_argument("--master", default="local[2]", help="Spark master of both jobs")
    ap.add_argument("--executor", default="auto", choices=EXECUTORS,
                    help="adaptcq's executor in every partition group, one of %(choices)s "
                    "(auto: the vectorized one; mjoin: a tuple at a time)")
    add_jvm_archive_argument(ap)
    ap.add_argument("--job", choices=["adaptcq", "native"], help=argparse.SUPPRESS)
    ap.add_argument("--case", help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--job-out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if not args.job and not set(args.cases) & {"a", "b"}:
        refuse_unused(ap, ["arrivals"], "by cases c and d (their size is fixed)", argv=argv)

    if args.job:  # child process: run one job, print its figures as JSON
        cpu = TreeCPU().start()
        srcs = {s: str(Path(args.data) / s) for s in "RST"}
        fn = job_adaptcq if args.job == "adaptcq" else job_native
        res = (fn(args.case, srcs, Path(args.job_out), args.partitions, args.master,
                  args.executor)
               if args.job == "adaptcq" else fn(args.case, srcs, Path(args.job_out),
                                                args.master))
        res["cpu_seconds"] = cpu.stop()
        print(json.dumps(res), flush=True)
        os._exit(0)  # skip the JVM shutdown hooks' wait: the work is done and measured

    try:
        archive = prepare_jvm_archive(args)
    except AdaptcqError as e:  # Java missing, say: one line, as `adaptcq run` has it
        print(f"adaptcq: error: {e}", file=sys.stderr)
        return 1
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows, differ = [], []
    for case in args.cases:
        srcs = make_data(case, args.arrivals, args.files, out / "data")
        n = 3 * SELECTIVE_ROWS if case in "cd" else args.arrivals
        data = Path(srcs["R"]).parent
        runs: dict[str, list] = {"adaptcq": [], "native": []}
        ok, na, nn = True, 0, 0
        for k in range(args.repeats):  # the engines alternate: a slow spell hits both
            for engine in ("adaptcq", "native"):
                print(f"case {case}: {engine} (run {k + 1} of {args.repeats}) ...", flush=True)
                runs[engine].append(run_job(engine, case, data, out / f"{engine}_{case}",
                                            args.partitions, args.master, args.executor))
            same, na, nn = same_results(out / f"adaptcq_{case}" / "result",
                                        out / f"native_{case}" / "result")
            if not same:
                differ.append(f"case {case} run {k + 1}: adaptcq {na:,} rows, native {nn:,}")
            ok &= same
        ratios = [x["wall_seconds"] / a["wall_seconds"]
                  for a, x in zip(runs["adaptcq"], runs["native"], strict=True)]
        for engine, rs in runs.items():
            r = rs[-1]
            wall = statistics.median(x["wall_seconds"] for x in rs)
            cpu = statistics.median(x["cpu_seconds"] for x in rs)
            rows.append({
                "case": case, "engine": engine, "arrivals": n, "repeats": len(rs),
                "rows_in": r["rows_in"], "results": r["results"], "batches": r["batches"],
                "wall_seconds": round(wall, 2),
                "wall_seconds_runs": " ".join(f"{x['wall_seconds']:.2f}" for x in rs),
                "stream_seconds": round(statistics.median(x["stream_seconds"] for x in rs), 2),
                "cpu_seconds": round(cpu, 1),
                "rows_per_second": round(n / wall),
                "rows_per_cpu_second": round(n / cpu),
                "speedup_wall_runs": " ".join(f"{x:.2f}" for x in ratios),
                "peak_state_tuples": r["peak_state_tuples"],
                "peak_state_bytes": r["peak_state_bytes"],
                "results_equal": ok, "jvm_archive": archive, "extra": json.dumps(
                    {k: v for k, v in r.items() if k in ("groups", "engine_cpu_seconds",
                                                         "cache_hits", "group_batches",
                                                         "executor")})})
        a, x = rows[-2], rows[-1]
        print(f"case {case}: results equal: {ok} ({na:,} vs {nn:,} rows); "
              f"speed-up (wall, medians of {args.repeats}) "
              f"{x['wall_seconds'] / a['wall_seconds']:.2f}x (per run: "
              f"{', '.join(f'{r:.2f}x' for r in ratios)}), per CPU-second "
              f"{x['cpu_seconds'] / a['cpu_seconds']:.2f}x", flush=True)
    write_csv(rows, out / "spark_vs_native.csv")
    _plot(rows, out / "spark_vs_native.png")
    _print(rows, args.master)
    if differ:
        print(f"error: adaptcq's results differ from Spark native's ({'; '.join(differ)}): "
              "the timings compare different work", flush=True)
        return 1
    return 0


def _print(rows, master: str = "local[2]") -> None:
    from rich.console import Console
    from rich.table import Table
    t = Table(title=f"adaptcq on Spark vs Spark native stream-stream joins ({master})")
    for c in ("case", "engine", "wall s", "CPU s", "rows/s", "rows/CPU-s", "results",
              "peak state", "equal"):
        t.add_column(c, justify="right")
    for r in rows:
        t.add_row(r["case"], r["engine"], f"{r['wall_seconds']:.1f}", f"{r['cpu_seconds']:.0f}",
                  f"{r['rows_per_second']:,}", f"{r['rows_per_cpu_second']:,}",
                  f"{r['results']:,}", f"{r['peak_state_tuples']:,}", str(r["results_equal"]))
    console = Console()
    if not console.is_terminal:  # a log file: do not cut the table to 80 columns
        console = Console(width=160)
    console.print(t)


def _plot(rows, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    cases = sorted({r["case"] for r in rows})
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, label in ((axes[0], "rows_per_second", "input rows per second (wall)"),
                           (axes[1], "rows_per_cpu_second", "input rows per CPU-second")):
        for k, engine in enumerate(("adaptcq", "native")):
            vals = [next(r[key] for r in rows if r["case"] == c and r["engine"] == engine)
                    for c in cases]
            ax.bar([i + 0.4 * k for i in range(len(cases))], vals, 0.4,
                   label="adaptcq on Spark" if engine == "adaptcq" else "Spark native joins")
        ax.set_xticks([i + 0.2 for i in range(len(cases))], [TITLE[c] for c in cases],
                      fontsize=7)
        ax.set_ylabel(label)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
