"""adaptcq on Spark as the partition groups grow, against Spark's native stream-stream joins.

``python -m adaptcq.bench.spark_scale [--partitions 1,2,4,8] [--sf 0.1] [--arrivals 1200000]``

Workloads (docs/spark-scale.md):

* ``chain``: R(a) ⋈ S(a,b) ⋈ T(b), ``[RANGE 10 SECONDS]`` windows, a-caching.txt §7.2's
  workload (``bench.spark_vs_native`` case b's data): no key is common to all streams, so
  the groups come from shares on a and b;
* ``q3``, ``q5``: TPC-H Q3 (customer ⋈ orders ⋈ lineitem on two keys) and Q5 (six tables,
  a cycle through nationkey) as unbounded insert streams (``stream.tpch``).

Each runs at every P on ``local[2]`` and once with Spark's native join chain, every job in a
fresh process, timed from process start to exit (JVM start-up included; every job maps the
same class-data archive of Spark's classes, ``runtime.jvm_archive``, built first when
missing, untimed; ``--no-jvm-archive``: none does), CPU of the whole process tree
(utime + stime of every process, sampled from /proc). Reported per job: rows per second
(wall), CPU-seconds, results (checked equal to native's as multisets of key columns), the
shares chosen, the rows shipped to groups and the replication factor (shipped
per input row). Writes ``<out>/spark_scale.csv`` and ``.png`` (throughput against P, native
as a line) and prints the table; medians over ``--repeats``.

``--state-growth`` instead runs one selective chain with unbounded windows over equal
micro-batches, so the state grows with every batch (10.5× from batch 1 to the last), and
reports per micro-batch its duration (Spark's ``triggerExecution``), the groups' state and
whether the group's live copy was used, caught up or rebuilt: ``<out>/state_growth.csv``
and ``.png``, and the ratio of the median batch time in the last third to that in the first
third (batch 0, which also starts the Python workers, and the end-of-input batch left out).

``--master`` (default ``local[2]``) and ``--shuffle-partitions`` run the same jobs on a
cluster (docs/spark-scale.md, "Running on a cluster").
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from adaptcq.bench._args import (
    choices,
    comma_list,
    positive_float,
    positive_int,
    refuse_unused,
    whole_at_least,
)
from adaptcq.errors import AdaptcqError

#: ``--arrivals``: the workloads here have three streams
ARRIVALS = whole_at_least(3, "one arrival per stream of the three")

WORKLOADS = ("chain", "q3", "q5")
CHAIN = ("SELECT R.id AS rid, S.id AS sid, T.id AS tid FROM R [RANGE 10 SECONDS], "
         "S [RANGE 10 SECONDS], T [RANGE 10 SECONDS] WHERE R.a = S.a AND S.b = T.b")
GROWTH = ("SELECT R.id AS rid, S.id AS sid, T.id AS tid FROM R, S, T "
          "WHERE R.a = S.a AND S.b = T.b")


class TreeCPU:
    """CPU seconds of this process and its descendants: every process's own utime + stime,
    sampled from /proc (Spark's JVM and Python workers are not reaped by us, so rusage
    would miss them; the children-time fields are not added, or a worker reaped by its
    daemon would count twice)."""

    def __init__(self, every: float = 0.2):
        self.seen: dict[int, float] = {}
        self.every = every
        self._stop = threading.Event()
        self._tick = os.sysconf("SC_CLK_TCK")
        self.thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> None:
        kids: dict[int, list[int]] = {}
        for p in os.listdir("/proc"):
            if p.isdigit():
                try:
                    st = Path(f"/proc/{p}/stat").read_text()
                except OSError:
                    continue
                kids.setdefault(int(st.rsplit(")", 1)[1].split()[1]), []).append(int(p))
        todo = [os.getpid()]
        while todo:
            p = todo.pop()
            todo.extend(kids.get(p, []))
            try:
                f = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            self.seen[p] = max(self.seen.get(p, 0.0), (int(f[11]) + int(f[12])) / self._tick)

    def _run(self):
        while not self._stop.wait(self.every):
            self.sample()

    def start(self) -> TreeCPU:
        self.thread.start()
        return self

    def stop(self) -> float:
        self.sample()
        self._stop.set()
        return sum(self.seen.values())


def add_jvm_archive_argument(ap) -> None:
    ap.add_argument("--no-jvm-archive", action="store_true",
                    help="start every job's JVM without the class-data archive "
                    "(runtime.jvm_archive); by default it is built first when missing "
                    "(untimed) and every job, adaptcq's and Spark native's, maps it")


def prepare_jvm_archive(args) -> str:
    """Every job of the run starts from the same class-data archive, or all without it
    (``--no-jvm-archive``): the comparison stays like for like. Returns what the CSV
    records (the archive's file name, or "off")."""
    from adaptcq.runtime import jvm_archive
    from adaptcq.runtime.spark_session import check_java
    check_java()  # before any data is built or job started: each would fail without it
    if args.no_jvm_archive:
        os.environ[jvm_archive.ENV_SWITCH] = "off"  # (the jobs inherit it)
        return "off"
    master = args.master if args.master.startswith("local") else "local[2]"
    return jvm_archive.build(master, log=print).name


# ----- data -------------------------------------------------------------------------------------

def workload(name: str, args, root: Path) -> tuple[str, dict[str, str], list[str]]:
    """(query, {source: folder}, id columns) of a workload."""
    if name == "chain":
        from adaptcq.bench.spark_vs_native import make_data
        return CHAIN, make_data("b", args.arrivals, args.files, root), ["rid", "sid", "tid"]
    from adaptcq.stream import tpch
    srcs = tpch.generate(args.sf, root / f"tpch_sf{args.sf}", files=args.files)
    return tpch.QUERIES[name], {n: srcs[n] for n in tpch.SOURCES[name]}, tpch.IDS[name]


# ----- jobs (each in its own process) -----------------------------------------------------------

def _spark(args, app: str):
    """The job's session: ``--master`` (default local[2]), and ``--shuffle-partitions`` when
    given (else the runtime's default: the master's cores)."""
    from adaptcq.runtime.spark_session import get_spark
    conf = {}
    if args.shuffle_partitions:
        conf["spark_sql_shuffle_partitions"] = args.shuffle_partitions
    return get_spark(args.master, app, **conf)


def job_adaptcq(sql: str, srcs: dict, out: Path, partitions: int, args) -> dict:
    from adaptcq.runtime.spark import run_files
    spark = _spark(args, "scale-adaptcq")
    run = run_files(spark, sql, srcs, str(out / "ck"), str(out / "result"), mode="append",
                    partitions=partitions, max_files_per_trigger=1)
    return {"rows_in": run.rows_in, "results": run.results, "batches": run.batches,
            "groups": len(run.groups), "shares": getattr(run, "shares", None),
            "shipped": getattr(run, "shipped", None),
            "engine_cpu_seconds": run.engine_cpu_seconds,
            "progress": [{"ms": p["durationMs"].get("triggerExecution"),
                          "rows": p["numInputRows"]} for p in run.progress],
            "history": [{k: h.get(k) for k in ("group", "state_tuples", "state_bytes",
                                               "rows_in", "shipped", "engine_cpu_seconds",
                                               "cache_hit", "caught_up", "rebuilt_rows",
                                               "rebuild_cpu_seconds", "snapshot_bytes",
                                               "meta_bytes", "entries")}
                        for h in run.history]}


def job_native(name: str, srcs: dict, out: Path, args) -> dict:
    """Spark's own stream-stream joins: the chain as bench.spark_vs_native builds it, TPC-H
    Q3 and Q5 as inner joins without watermarks (append mode; state kept for ever, as the
    unbounded streams require), the same selections applied before the joins."""
    from pyspark.sql import functions as F

    spark = _spark(args, "scale-native")
    if name == "chain":
        from adaptcq.bench.spark_vs_native import job_native as chain_native
        return chain_native("b", srcs, out, master=args.master)

    def read(n: str):
        schema = spark.read.parquet(srcs[n]).schema
        return (spark.readStream.option("maxFilesPerTrigger", 1).schema(schema)
                .parquet(srcs[n]).drop("ts"))

    c = read("customer")
    o = read("orders")
    li = read("lineitem")
    if name == "q3":
        c = c.where(F.col("c_mktsegment") == "BUILDING")
        o = o.where(F.col("o_orderdate") < 19950315)
        li = li.where(F.col("l_shipdate") > 19950315)
        res = (c.join(o, F.col("c_custkey") == F.col("o_custkey"))
               .join(li, F.col("l_orderkey") == F.col("o_orderkey"))
               .select(F.col("c_custkey").alias("custkey"),
                       F.col("o_orderkey").alias("orderkey"),
                       F.col("l_linenumber").alias("linenumber")))
    else:
        s, n, r = read("supplier"), read("nation"), read("region")
        o = o.where((F.col("o_orderdate") >= 19940101) & (F.col("o_orderdate") < 19950101))
        r = r.where(F.col("r_name") == "ASIA")
        res = (c.join(o, F.col("c_custkey") == F.col("o_custkey"))
               .join(li, F.col("l_orderkey") == F.col("o_orderkey"))
               .join(s, (F.col("l_suppkey") == F.col("s_suppkey"))
                     & (F.col("c_nationkey") == F.col("s_nationkey")))
               .join(n, F.col("s_nationkey") == F.col("n_nationkey"))
               .join(r, F.col("n_regionkey") == F.col("r_regionkey"))
               .select(F.col("c_custkey").alias("custkey"),
                       F.col("o_orderkey").alias("orderkey"),
                       F.col("l_linenumber").alias("linenumber"),
                       F.col("s_suppkey").alias("suppkey"), F.col("n_name").alias("nation")))
    q = (res.writeStream.format("parquet").option("path", str(out / "result"))
         .option("checkpointLocation", str(out / "ck")).trigger(availableNow=True).start())
    q.awaitTermination()
    prog = q.recentProgress
    return {"rows_in": sum(p["numInputRows"] for p in prog),
            "results": spark.read.parquet(str(out / "result")).count(), "batches": len(prog)}


def run_job(engine: str, name: str, args, out: Path, partitions: int = 1) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    cmd = [sys.executable, "-m", "adaptcq.bench.spark_scale", "--job", engine,
           "--workload", name, "--job-out", str(out), "--partitions", str(partitions),
           "--sf", str(args.sf), "--arrivals", str(args.arrivals), "--files", str(args.files),
           "--data", str(args.data), "--master", args.master]
    if args.shuffle_partitions:
        cmd += ["--shuffle-partitions", str(args.shuffle_partitions)]
    return timed_job(cmd, f"{engine} job on {name}")


#: An argparse type: a comma-separated list of whole numbers >= 1 (``--partitions 1,2,4``,
#: ``--batches 1000,20000``).
positive_ints = comma_list(positive_int, "number")


def write_csv(rows: list[dict], path: Path) -> None:
    """The benchmark's rows (dicts with the same keys) as a CSV file."""
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def timed_job(cmd: list[str], what: str) -> dict:
    """Run a benchmark job (``--job``) in a fresh process: the JSON line it prints, with the
    wall time from process start to exit (JVM start-up included)."""
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    line = next((x for x in reversed(proc.stdout.splitlines()) if x.startswith("{")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"{what} failed:\n{proc.stderr[-4000:]}")
    res = json.loads(line)
    res["wall_seconds"] = wall
    return res


def same_results(a: Path, b: Path, ids: list[str]) -> bool:
    from collections import Counter

    import pyarrow.parquet as pq

    def rows(p):
        t = pq.read_table(p, columns=ids)
        return Counter(zip(*(t.column(c).to_pylist() for c in ids), strict=True))
    return rows(a) == rows(b)


# ----- the benchmark ----------------------------------------------------------------------------

def scale(args) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows, differ = [], []
    archive = prepare_jvm_archive(args)
    for name in args.workloads:
        _, srcs, ids = workload(name, args, Path(args.data))
        n_in = sum(_rows(p) for p in srcs.values())
        print(f"{name}: {n_in:,} input rows", flush=True)
        native = [run_job("native", name, args, out / f"native_{name}")
                  for _ in range(args.repeats)]
        for P in args.partitions:
            runs, ok = [], True
            for k in range(args.repeats):  # each run's output checked before the next's
                runs.append(run_job("adaptcq", name, args, out / f"adaptcq_{name}_{P}", P))
                if not same_results(out / f"adaptcq_{name}_{P}" / "result",
                                    out / f"native_{name}" / "result", ids):
                    ok = False
                    differ.append(f"{name} P={P} run {k + 1}")
            rows.append(_row(name, "adaptcq", P, runs, n_in, ok))
            print(_line(rows[-1]), flush=True)
        rows.append(_row(name, "native", None, native, n_in, True))
        print(_line(rows[-1]), flush=True)
    for r in rows:
        r["jvm_archive"] = archive
    write_csv(rows, out / "spark_scale.csv")
    _plot(rows, out / "spark_scale.png")
    _print(rows, args.master)
    for name in args.workloads:
        nat = next(r for r in rows if r["workload"] == name and r["engine"] == "native")
        for r in rows:
            if r["workload"] == name and r["engine"] == "adaptcq":
                print(f"{name} P={r['partitions']}: {nat['wall_seconds'] / r['wall_seconds']:.2f}x "
                      "native by wall time (start-up included), "
                      f"{nat['cpu_seconds'] / r['cpu_seconds']:.2f}x per CPU-second")
    print(f"wrote {out / 'spark_scale.csv'} and {out / 'spark_scale.png'}")
    if differ:
        print(f"error: adaptcq's results differ from Spark native's in {', '.join(differ)}: "
              "the timings compare different work", flush=True)
        return 1
    return 0


def _rows(folder: str) -> int:
    import pyarrow.parquet as pq
    return sum(pq.ParquetFile(p).metadata.num_rows for p in sorted(Path(folder).glob("*.parquet")))


def _row(name, engine, P, runs, n_in, ok) -> dict:
    wall = statistics.median(r["wall_seconds"] for r in runs)
    cpu = statistics.median(r["cpu_seconds"] for r in runs)
    last = runs[-1]
    shipped = last.get("shipped")
    return {"workload": name, "engine": engine, "partitions": P or "", "repeats": len(runs),
            "input_rows": n_in, "results": last["results"], "results_equal": ok,
            "wall_seconds": round(wall, 2), "cpu_seconds": round(cpu, 1),
            "rows_per_second": round(n_in / wall), "rows_per_cpu_second": round(n_in / cpu),
            # "" where there are none to report (native; a runtime without run.shares)
            "shares": "" if last.get("shares") is None else json.dumps(last["shares"]),
            "shipped": "" if shipped is None else shipped,
            "replication": "" if not shipped else round(shipped / max(last["rows_in"], 1), 3),
            "engine_cpu_seconds": "" if engine == "native"
            else round(last.get("engine_cpu_seconds") or 0.0, 1)}


def _print(rows: list[dict], master: str) -> None:
    from rich.console import Console
    from rich.table import Table
    t = Table(title=f"adaptcq on Spark at P groups vs Spark native joins ({master})")
    for c in ("workload", "engine", "P", "wall s", "CPU s", "rows/s", "rows/CPU-s", "results",
              "equal", "shares", "shipped", "replication"):
        t.add_column(c, justify="right")
    for r in rows:
        t.add_row(r["workload"], r["engine"], str(r["partitions"] or "-"),
                  f"{r['wall_seconds']:.1f}", f"{r['cpu_seconds']:.1f}",
                  f"{r['rows_per_second']:,}", f"{r['rows_per_cpu_second']:,}",
                  f"{r['results']:,}", str(r["results_equal"]),
                  "-" if r["engine"] == "native" else _shares(r["shares"]),
                  "-" if r["engine"] == "native" else
                  (f"{r['shipped']:,}" if r["shipped"] != "" else "n/a"),
                  "-" if r["engine"] == "native" else (str(r["replication"]) or "n/a"))
    console = Console()
    if not console.is_terminal:  # a log file: do not cut the table to 80 columns
        console = Console(width=160)
    console.print(t)


def _shares(text: str) -> str:
    """The classes with a share above 1 (the CSV has them all)."""
    if not text:
        return "n/a"
    d = {k: v for k, v in json.loads(text).items() if v > 1}
    return ", ".join(f"{k}: {v}" for k, v in d.items()) if d else "one group"


def _line(r: dict) -> str:
    return (f"  {r['engine']:8s} P={r['partitions'] or '-':>2}: {r['wall_seconds']:7.1f} s wall, "
            f"{r['cpu_seconds']:6.1f} CPU-s, {r['rows_per_second']:>8,} rows/s, "
            f"{r['results']:,} results (equal: {r['results_equal']}), "
            f"shares {r['shares'] or '-'}, replication {r['replication'] or '-'}")


def _plot(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = sorted({r["workload"] for r in rows}, key=[r["workload"] for r in rows].index)
    fig, axes = plt.subplots(1, len(names), figsize=(4.5 * len(names), 3.6), squeeze=False)
    for ax, name in zip(axes[0], names, strict=True):
        ours = [r for r in rows if r["workload"] == name and r["engine"] == "adaptcq"]
        ax.plot([r["partitions"] for r in ours], [r["rows_per_second"] for r in ours], "o-",
                label="adaptcq on Spark")
        for r in rows:
            if r["workload"] == name and r["engine"] == "native":
                ax.axhline(r["rows_per_second"], color="gray", ls="--", label="Spark native")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("partition groups P")
        ax.set_ylabel("input rows per second (wall)")
        ax.set_title(name)
        ax.legend(fontsize=8)
    fig.suptitle("adaptcq on Spark: throughput against P (local[2])")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


# ----- state growth -----------------------------------------------------------------------------

def growth_data(root: Path, batches: int, per_batch: int, domain: int) -> dict[str, str]:
    """A selective chain: ``per_batch`` rows per stream and batch, keys uniform in
    ``domain`` (few results), one file per stream and batch."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    marker = root / "done.json"
    spec = [batches, per_batch, domain]
    if marker.exists() and json.loads(marker.read_text()) == spec:
        return {s: str(root / s) for s in "RST"}
    shutil.rmtree(root, ignore_errors=True)
    rng = np.random.default_rng(11)
    for s in "RST":
        (root / s).mkdir(parents=True)
        for k in range(batches):
            n = per_batch
            t = pa.table({"ts": k + np.sort(rng.uniform(0, 1, n)),
                          "id": np.arange(k * n, (k + 1) * n),
                          "a": rng.integers(0, domain, n), "b": rng.integers(0, domain, n)})
            p = root / s / f"part-{k:04d}.parquet"
            pq.write_table(t, p)
            os.utime(p, (1_600_000_000 + 10 * k, 1_600_000_000 + 10 * k))
    marker.write_text(json.dumps(spec))
    return {s: str(root / s) for s in "RST"}


def state_growth(args) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    growth_data(Path(args.data) / "growth", args.batches, args.batch_rows, 10**7)
    prepare_jvm_archive(args)
    res = run_job("adaptcq", "growth", args, out / "growth_job", args.growth_partitions)
    rows = growth_rows(res["progress"], res["history"])
    write_csv(rows, out / "state_growth.csv")
    g = growth_summary(rows)
    _plot_growth(rows, out / "state_growth.png", res["groups"], args.master)
    print(f"state grew {g['state_ratio']:.1f}x ({g['state_first']:,} -> {g['state_last']:,} "
          f"tuples) from batch {g['first_batch']} to batch {g['last_batch']}; median "
          f"micro-batch time of the first third {g['ms_first']:,.0f} ms, of the last third "
          f"{g['ms_last']:,.0f} ms ({g['time_ratio']:.2f}x); {res['groups']} group(s), "
          f"{res['wall_seconds']:.1f} s wall")
    print(f"wrote {out / 'state_growth.csv'} and {out / 'state_growth.png'}")
    return 0


def growth_rows(progress: list[dict], history: list[dict]) -> list[dict]:
    """One row per micro-batch: Spark's progress report (``ms``: triggerExecution, ``rows``:
    input rows, the end-of-input marker included) joined with the groups' statistics rows
    of that batch. Every group reports once per micro-batch, in batch order, so a group's
    k-th statistics row is of batch k. ``kind`` is ``data``, or ``end`` for a batch that
    brought the groups no row (the end-of-input marker's)."""
    per_batch: list[list[dict]] = [[] for _ in progress]
    seen: dict = {}
    for h in history:
        k = seen.get(h["group"], 0)
        seen[h["group"]] = k + 1
        if k < len(per_batch):
            per_batch[k].append(h)
    rows = []
    for b, (p, h) in enumerate(zip(progress, per_batch, strict=True)):
        data = sum(x.get("rows_in") or 0 for x in h)
        written = sum((x.get("meta_bytes") or 0) + (x.get("snapshot_bytes") or 0) for x in h)
        rows.append({
            "batch": b, "kind": "data" if data else "end", "rows_in": data,
            "batch_ms": p["ms"], "groups": len(h),
            "state_tuples": sum(x.get("state_tuples") or 0 for x in h),
            "state_bytes": sum(x.get("state_bytes") or 0 for x in h),
            "meta_bytes": written,
            "engine_cpu_ms": round(1000 * sum(x.get("engine_cpu_seconds") or 0 for x in h)),
            "rebuild_cpu_ms": round(1000 * sum(x.get("rebuild_cpu_seconds") or 0 for x in h)),
            "live_copy": sum(bool(x.get("cache_hit")) for x in h),
            "caught_up": sum(bool(x.get("caught_up")) for x in h)})
    return rows


def growth_summary(rows: list[dict]) -> dict:
    """Median batch time of the first and the last third of the data batches, and the state's
    growth between them. Batch 0 (which also starts the Python workers and the JVM's JIT)
    and the end-of-input batch are left out."""
    data = [r for r in rows if r["kind"] == "data"][1:]
    if not data:
        raise ValueError("--state-growth needs at least two micro-batches of data")
    k = max(1, len(data) // 3)
    t1 = statistics.median(r["batch_ms"] for r in data[:k])
    t2 = statistics.median(r["batch_ms"] for r in data[-k:])
    s1, s2 = data[0]["state_tuples"], data[-1]["state_tuples"]
    return {"first_batch": data[0]["batch"], "last_batch": data[-1]["batch"],
            "ms_first": t1, "ms_last": t2, "time_ratio": t2 / t1 if t1 else float("nan"),
            "state_first": s1, "state_last": s2, "state_ratio": s2 / max(s1, 1)}


def _plot_growth(rows, path: Path, groups: int, master: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 3.6))
    a = ax.plot([r["batch"] for r in rows], [r["batch_ms"] for r in rows], "o-",
                label="micro-batch time (ms)")
    ax.set_xlabel("micro-batch")
    ax.set_ylabel("ms")
    ax.set_ylim(bottom=0)
    ax2 = ax.twinx()
    b = ax2.plot([r["batch"] for r in rows], [r["state_tuples"] for r in rows], "s--",
                 color="tab:orange", label="state (tuples, all groups)")
    ax2.set_ylabel("state tuples")
    ax2.set_ylim(bottom=0)
    ax.legend(handles=a + b, fontsize=8, loc="upper center")
    ax.set_title(f"micro-batch time as the state grows ({groups} group(s), {master})",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m adaptcq.bench.spark_scale",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", type=choices(WORKLOADS), default=list(WORKLOADS),
                    help=f"comma-separated, from {', '.join(WORKLOADS)} (default all)")
    ap.add_argument("--partitions", type=positive_ints, default=[1, 2, 4, 8],
                    help="P values, comma-separated (default 1,2,4,8)")
    ap.add_argument("--sf", type=positive_float, default=0.1,
                    help="TPC-H scale factor of q3 and q5 (default 0.1)")
    ap.add_argument("--arrivals", type=ARRIVALS, default=1_200_000,
                    help="chain arrivals (default 1,200,000)")
    ap.add_argument("--files", type=positive_int, default=10,
                    help="time slices (micro-batches) of the chain and TPC-H inputs "
                         "(default 10)")
    ap.add_argument("--repeats", type=positive_int, default=1,
                    help="runs per point (medians; default 1)")
    ap.add_argument("--out", default="results/spark_scale",
                    help="folder of the CSV, the PNG and the jobs' outputs "
                         "(default results/spark_scale)")
    ap.add_argument("--data", default=None, help="data folder (default <out>/data)")
    ap.add_argument("--master", default="local[2]",
                    help="Spark master of every job (default local[2]; docs/spark-scale.md "
                    "for a cluster)")
    ap.add_argument("--shuffle-partitions", type=positive_int, default=None,
                    help="spark.sql.shuffle.partitions of every job (default: the master's "
                    "cores; on a cluster give at least the largest P)")
    ap.add_argument("--state-growth", action="store_true",
                    help="measure micro-batch time while the state grows instead")
    ap.add_argument("--batches", type=positive_int, default=21,
                    help="--state-growth micro-batches (default 21, at least 2)")
    ap.add_argument("--batch-rows", type=positive_int, default=40_000,
                    help="--state-growth rows per stream and micro-batch (default 40,000)")
    ap.add_argument("--growth-partitions", type=positive_int, default=2,
                    help="--state-growth partition groups P (default 2)")
    add_jvm_archive_argument(ap)
    ap.add_argument("--job", choices=["adaptcq", "native"], help=argparse.SUPPRESS)
    ap.add_argument("--workload", help=argparse.SUPPRESS)
    ap.add_argument("--job-out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if not args.job:  # (a job gets every option from its parent, used or not)
        if args.state_growth:
            refuse_unused(ap, ["workloads", "partitions", "sf", "arrivals", "files",
                                     "repeats"],
                          "with --state-growth (one selective chain of its own, "
                          "--growth-partitions groups)", argv=argv)
            if args.batches < 2:
                ap.error("--batches: at least 2 with --state-growth (batch 0, which starts "
                         "the workers, is left out of the timing)")
        else:
            refuse_unused(ap, ["batches", "batch_rows", "growth_partitions"],
                          "without --state-growth", argv=argv)
    args.data = args.data or str(Path(args.out) / "data")
    if args.job:
        cpu = TreeCPU().start()
        if args.workload == "growth":
            sql, srcs = GROWTH, {s: str(Path(args.data) / "growth" / s) for s in "RST"}
        else:
            sql, srcs, _ = workload(args.workload, args, Path(args.data))
        res = (job_adaptcq(sql, srcs, Path(args.job_out), args.partitions[0], args)
               if args.job == "adaptcq"
               else job_native(args.workload, srcs, Path(args.job_out), args))
        res["cpu_seconds"] = cpu.stop()
        print(json.dumps(res), flush=True)
        os._exit(0)  # the work is done and measured: skip the JVM's shutdown hooks
    from adaptcq.runtime.spark_session import check_java
    try:
        check_java()  # before the output folder is made
    except AdaptcqError as e:  # one line, as `adaptcq run` has it
        print(f"adaptcq: error: {e}", file=sys.stderr)
        return 1
    return state_growth(args) if args.state_growth else scale(args)


if __name__ == "__main__":
    raise SystemExit(main())
