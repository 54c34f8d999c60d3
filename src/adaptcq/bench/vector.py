"""Benchmark: the vectorized executor against MJoin and XJoin, whole process (issue 16).

Every measurement is a fresh process (``--single``) that reads the workload's Parquet
inputs, runs the query with ``adaptcq.stream`` (result batches counted, not kept: the same
for every executor) and reports its own CPU time from ``getrusage`` (user + system, all
threads): interpreter start-up, imports, reading and merging the input, the join and
building the output. Figures are medians of ``--runs`` runs; the executors alternate
within each run, so drift hits them alike. The workloads (written once under
``OUT/data``):

* ``s72`` — a-caching.txt §7.2's default join R(A)⋈S(A,B)⋈T(B), multiplicity 5 in T,
  700,000 arrivals (``stream.workloads.three_way``, its default 1-second windows: the result
  count is the same for any window of at least 4 ms), retract mode: 995,000 results.
  (Issue 16 quotes 1,489,122 results for "W = 10 s"; no setting of ``three_way`` gives that
  count — with values that never repeat each R tuple joins exactly one S and five T tuples
  whatever the window — so this is the workload the other §7.2 benchmarks run.)
* ``chain`` — the selective chain R(a)⋈S(a,b)⋈T(b): 1,000,000 rows per stream, keys
  uniform in [0, 100,000), 197.8 rows per second per stream, [RANGE 10 SECONDS], append
  mode: about 1,200 results.
* ``many`` — many results per arrival: R(a)⋈S(a), a in [0, 50), 1,000 rows per second per
  stream, [RANGE 1 SECONDS], 200,000 arrivals, append mode (about 20 matches per arrival).
* ``cycle5`` — a 5-way cycle R1.a=R2.a, R2.b=R3.b, R3.a=R4.a, R4.b=R5.b, R5.a=R1.b, keys in
  [0, 400), 200 rows per second per stream, [RANGE 10 SECONDS], 200,000 arrivals, append.
* ``star`` — a star H(a,b,c,d) with A(a), B(b), C(c), D(d), keys in [0, 2,000), 200 rows
  per second per stream, [RANGE 10 SECONDS], 200,000 arrivals, append (about one match per
  probe; with keys in [0, 500) it gave 49 million results, and MJoin minutes per run).

Executors: the vectorized one at batch sizes 1,000, 5,000, 20,000 (the default) and
100,000, MJoin and XJoin. Targets printed as MET / NOT MET (never tuned): s72 ≥ 1,500,000
updates per whole-process CPU-second and ≥ 4× MJoin; chain ≥ 8× MJoin (CPU). The memory
part: the chain scaled to 10,000,000 arrivals with the vectorized executor under 400 MB
peak RSS, and s72 with batches of 100,000 under 2× the peak RSS of batches of 10,000 (peak
RSS and the growth over the process's RSS before the run are both reported).

Results are compared across executors and batch sizes by count and by an order-independent
digest of every result row (all columns, retractions included); a difference is printed as
MISMATCH. ``--quick`` runs every workload (and the memory part) at 3% of its size: the
targets, set for the full sizes, are then reported as not checked.

    python -m adaptcq.bench.vector [--runs 3] [--quick] [--workloads s72,chain,...]
        [--batches 1000,5000,20000,100000] [--executors vector,mjoin,xjoin]
        [--no-memory | --only-memory] [--out results/vector]

Writes ``runs.csv``, ``summary.csv``, ``memory.csv`` and ``throughput.png`` under OUT.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from adaptcq.bench._args import choices, positive_int, refuse_unused
from adaptcq.bench.spark_scale import positive_ints, write_csv  # shared by the benchmarks

BATCHES = (1_000, 5_000, 20_000, 100_000)
EXECUTORS = ("vector", "mjoin", "xjoin")
QUICK_SCALE = 0.03  # --quick: 3% of every workload
DEFAULT_BATCH = 20_000
WORKLOADS = ("s72", "chain", "many", "cycle5", "star")
SKIP = {("xjoin", "cycle5"): "its left-deep tree keeps R1⋈R2⋈R3⋈R4 (about 125 tuples per "
                             "arrival): 197 CPU-s for one run (2026-11-24), not repeated"}
MODES = {"s72": "retract", "chain": "append", "many": "append", "cycle5": "append",
         "star": "append"}


# ----- workloads -----------------------------------------------------------------------------
def _uniform(names, per_stream: int, rate: float, keys: dict, seed: int):
    """Tables with sorted uniform times at ``rate`` rows/s and uniform integer keys
    (``keys``: column -> domain, per stream a list of its columns)."""
    import numpy as np
    import pyarrow as pa
    rng = np.random.default_rng(seed)
    span = per_stream / rate
    out = {}
    for s, cols in names.items():
        data = {"ts": np.sort(rng.uniform(0, span, per_stream)),
                "id": np.arange(per_stream)}
        for c in cols:
            data[c] = rng.integers(0, keys[c], per_stream)
        out[s] = pa.table(data)
    return out


def make_workload(name: str, folder: Path, scale: float = 1.0) -> str:
    """Write workload ``name`` (its inputs and query.sql) to ``folder``; returns the SQL."""
    import pyarrow.parquet as pq
    folder.mkdir(parents=True, exist_ok=True)
    if name == "s72":
        from adaptcq.stream.workloads import three_way
        wl = three_way(n_updates=int(700_000 * scale), r=5)
        tables, sql = wl.tables, wl.sql
    elif name == "chain":
        n = int(1_000_000 * scale)
        tables = _uniform({"R": ["a"], "S": ["a", "b"], "T": ["b"]}, n, 197.8,
                          {"a": 100_000, "b": 100_000}, 2024)
        sql = ("SELECT R.id AS r, S.id AS s, T.id AS t FROM R [RANGE 10 SECONDS], "
               "S [RANGE 10 SECONDS], T [RANGE 10 SECONDS] WHERE R.a = S.a AND S.b = T.b")
    elif name == "many":
        tables = _uniform({"R": ["a"], "S": ["a"]}, int(100_000 * scale), 1000.0,
                          {"a": 50}, 7)
        sql = ("SELECT R.id AS r, S.id AS s FROM R [RANGE 1 SECONDS], S [RANGE 1 SECONDS] "
               "WHERE R.a = S.a")
    elif name == "cycle5":
        names = {f"R{i}": ["a", "b"] for i in range(1, 6)}
        tables = _uniform(names, int(40_000 * scale), 200.0, {"a": 400, "b": 400}, 5)
        w = " [RANGE 10 SECONDS]"
        sql = ("SELECT R1.id AS i1, R2.id AS i2, R3.id AS i3, R4.id AS i4, R5.id AS i5 FROM "
               + ", ".join(f"R{i}{w}" for i in range(1, 6))
               + " WHERE R1.a = R2.a AND R2.b = R3.b AND R3.a = R4.a AND R4.b = R5.b "
               "AND R5.a = R1.b")
    elif name == "star":
        names = {"H": ["a", "b", "c", "d"], "A": ["a"], "B": ["b"], "C": ["c"], "D": ["d"]}
        tables = _uniform(names, int(40_000 * scale), 200.0,
                          dict.fromkeys("abcd", 2000), 9)
        w = " [RANGE 10 SECONDS]"
        sql = ("SELECT H.id AS h, A.id AS a, B.id AS b, C.id AS c, D.id AS d FROM "
               f"H{w}, A{w}, B{w}, C{w}, D{w} "
               "WHERE H.a = A.a AND H.b = B.b AND H.c = C.c AND H.d = D.d")
    else:
        raise ValueError(f"unknown workload {name!r}; choose from {', '.join(WORKLOADS)}")
    for s, t in tables.items():
        pq.write_table(t, folder / f"{s}.parquet")
    (folder / "query.sql").write_text(sql)
    (folder / "params.json").write_text(json.dumps({"workload": name, "scale": scale}))
    return sql


def cached_workload(name: str, folder: Path, scale: float) -> None:
    """Reuse ``folder`` when it holds workload ``name`` at ``scale`` (its params.json), else
    write it: an input left by a run at another scale is not this one."""
    try:
        same = json.loads((folder / "params.json").read_text()) == {"workload": name,
                                                                    "scale": scale}
    except (OSError, ValueError):
        same = False
    if not same:
        make_workload(name, folder, scale)


def result_digest(batch, acc: int = 0) -> int:
    """``acc`` plus an order-independent digest of ``batch``'s rows (all columns): the sum,
    modulo 2**64, of a mixed 64-bit hash of each row. Executors may emit a batch's results in
    any order; equal multisets of rows give equal digests."""
    import numpy as np
    import pyarrow.compute as pc

    def mix(x):  # splitmix64's finaliser (uint64 arithmetic wraps)
        x = x ^ (x >> np.uint64(30))
        x = x * np.uint64(0xBF58476D1CE4E5B9)
        x = x ^ (x >> np.uint64(27))
        x = x * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))

    h = np.zeros(batch.num_rows, np.uint64)
    for i, col in enumerate(batch.columns):
        v = pc.fill_null(col, 0).to_numpy(zero_copy_only=False)
        v = (v.view(np.uint64) if v.dtype.itemsize == 8 else v.astype(np.int64).view(np.uint64))
        h = mix(h ^ mix(v + np.uint64((i + 1) * 0x9E3779B97F4A7C15 % 2**64)))
    return (acc + int(h.sum(dtype=np.uint64))) % 2**64


# ----- one measurement (a fresh process) -------------------------------------------------------
def single(folder: str, executor: str, mode: str, batch: int | None,
           digest: bool = True) -> dict:
    """Run one query in this process; CPU from getrusage covers the whole process, less the
    digest of the results (``digest=False``, for the memory part: no digest, whose arrays
    grow with the batch)."""
    from adaptcq.runtime.local import current_rss, stream
    sources = {p.stem: str(p) for p in sorted(Path(folder).glob("*.parquet"))}
    sql = (Path(folder) / "query.sql").read_text()
    options = {"batch_rows": batch} if executor == "vector" and batch else {}
    rss0 = current_rss()
    t0 = time.perf_counter()
    run = stream(sql, sources, executor=executor, mode=mode, **options)
    results, acc, digest_cpu = 0, 0, 0.0
    for b in run:
        results += b.num_rows
        if digest:
            c0 = time.process_time()
            acc = result_digest(b, acc)
            digest_cpu += time.process_time() - c0
    wall = time.perf_counter() - t0
    ru = resource.getrusage(resource.RUSAGE_SELF)
    cpu = ru.ru_utime + ru.ru_stime - digest_cpu
    s = run.stats
    return {"executor": executor, "batch": batch or "", "mode": mode, "results": results,
            **({"digest": f"{acc:016x}"} if digest else {}),
            "arrivals": s["arrivals"], "updates": s["updates"], "process_cpu_s": cpu,
            "engine_cpu_s": s["cpu_seconds"], "wall_s": wall,
            "updates_per_cpu_s": s["updates"] / cpu,
            "peak_rss_mb": _peak_rss_mb(ru), "rss_before_mb": rss0 / 2**20}


def _peak_rss_mb(ru) -> float:
    """This process's peak RSS since it started (VmHWM; ru_maxrss keeps the parent's peak
    from before the exec, here the driver that generated the inputs)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return ru.ru_maxrss / 1024


def _spawn(folder: Path, executor: str, mode: str, batch: int | None,
           digest: bool = True) -> dict:
    cmd = [sys.executable, "-m", "adaptcq.bench.vector", "--single", executor,
           "--input", str(folder), "--mode", mode, "--batch", str(batch or 0)]
    if not digest:
        cmd.append("--no-digest")
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


# ----- the benchmark ------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m adaptcq.bench.vector", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=positive_int, default=None,
                   help="runs per measurement, medians reported (default 3; --quick: 1)")
    p.add_argument("--quick", action="store_true",
                   help="tiny inputs (3%% of each workload, memory part included), one run "
                        "unless --runs: a smoke test; the targets are not checked")
    p.add_argument("--workloads", type=choices(WORKLOADS), default=list(WORKLOADS),
                   help=f"comma-separated, from {', '.join(WORKLOADS)} (default all)")
    p.add_argument("--batches", type=positive_ints, default=list(BATCHES),
                   help="the vectorized executor's batch sizes in arrivals, comma-separated "
                        f"(default {','.join(map(str, BATCHES))}; only with vector among "
                        "--executors)")
    p.add_argument("--executors", type=choices(EXECUTORS), default=list(EXECUTORS),
                   help=f"comma-separated, from {', '.join(EXECUTORS)} (default all)")
    memory = p.add_mutually_exclusive_group()
    memory.add_argument("--no-memory", action="store_true", help="skip the memory part")
    memory.add_argument("--only-memory", action="store_true",
                        help="run the memory part only (the chain at 10M arrivals, s72 at "
                             "batches of 10,000 and 100,000; vectorized executor)")
    p.add_argument("--out", default="results/vector",
                   help="folder of the CSVs, the PNG and the inputs (default results/vector)")
    p.add_argument("--single", help=argparse.SUPPRESS)
    p.add_argument("--input", help=argparse.SUPPRESS)
    p.add_argument("--mode", help=argparse.SUPPRESS)
    p.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    p.add_argument("--no-digest", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.single:
        print(json.dumps(single(args.input, args.single, args.mode, args.batch or None,
                                digest=not args.no_digest)))
        return 0
    if args.only_memory:  # the memory part has its own workloads, executor and batches
        refuse_unused(p, ["runs", "workloads", "batches", "executors"],
                      "with --only-memory (its runs are fixed: the vectorized executor on "
                      "the chain and s72)", argv=argv)
    elif "vector" not in args.executors:  # the batch sizes are the vectorized executor's
        refuse_unused(p, ["batches"], "without vector in --executors (the batch "
                      "sizes are the vectorized executor's)", argv=argv)

    scale = QUICK_SCALE if args.quick else 1.0
    runs = args.runs or (1 if args.quick else 3)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    batches = args.batches
    executors = args.executors
    rows = []
    for name in [] if args.only_memory else args.workloads:
        folder = out / "data" / name
        sql = make_workload(name, folder, scale)
        mode = MODES[name]
        print(f"{name} ({mode}): {' '.join(sql.split())}", flush=True)
        variants = [("vector", b) for b in batches if "vector" in executors] + \
            [(e, None) for e in executors if e != "vector" and (e, name) not in SKIP]
        for e, why in ((e, SKIP[(e, name)]) for e in executors if (e, name) in SKIP):
            print(f"  {e} skipped: {why}", flush=True)
        for run in range(runs):
            for ex, b in (variants if run % 2 == 0 else variants[::-1]):
                r = _spawn(folder, ex, mode, b)
                r.update(workload=name, run=run)
                rows.append(r)
                print(f"  run {run + 1}/{runs} {ex:6s} {b or ''!s:>7s} "
                      f"{r['process_cpu_s']:7.2f} CPU-s whole process "
                      f"({r['engine_cpu_s']:.2f} engine), {r['results']:,} results", flush=True)
    summary = _summary(rows)
    if rows:
        write_csv(rows, out / "runs.csv")
        write_csv(summary, out / "summary.csv")
        _plot(summary, out / "throughput.png")
    memory = [] if args.no_memory else _memory(out, scale)
    if memory:
        write_csv(memory, out / "memory.csv")
    _report(summary, memory, runs, args.quick)
    written = ([out / "runs.csv", out / "summary.csv", out / "throughput.png"] if rows else []) \
        + ([out / "memory.csv"] if memory else [])
    print(f"wrote {', '.join(map(str, written))}")
    return 0


def _summary(rows: list[dict]) -> list[dict]:
    out = []
    keys = sorted({(r["workload"], r["executor"], r["batch"]) for r in rows},
                  key=lambda k: (WORKLOADS.index(k[0]), k[1] != "vector", k[1], k[2] or 0))
    for w, ex, b in keys:
        mine = [r for r in rows if (r["workload"], r["executor"], r["batch"]) == (w, ex, b)]
        med = {k: statistics.median(r[k] for r in mine)
               for k in ("process_cpu_s", "engine_cpu_s", "updates_per_cpu_s", "peak_rss_mb")}
        counts = {(r["results"], r.get("digest")) for r in mine}
        out.append({"workload": w, "executor": ex, "batch": b, "runs": len(mine),
                    "updates": mine[0]["updates"], "results": mine[0]["results"],
                    "digest": mine[0].get("digest", ""),
                    "results_agree": len(counts) == 1,
                    **{f"median_{k}": round(v, 3) for k, v in med.items()}})
    for w in {s["workload"] for s in out}:  # every executor and batch size: the same results
        counts = {(s["results"], s["digest"]) for s in out if s["workload"] == w}
        for s in out:
            if s["workload"] == w:
                s["results_agree"] = s["results_agree"] and len(counts) == 1
    for s in out:  # the ratio to MJoin's CPU in the same runs
        m = next((x for x in out if x["workload"] == s["workload"]
                  and x["executor"] == "mjoin"), None)
        s["mjoin_cpu_ratio"] = (round(m["median_process_cpu_s"] / s["median_process_cpu_s"],
                                      2) if m else "")
    return out


def _memory(out: Path, scale: float) -> list[dict]:
    """The chain at 10M arrivals (vector), and s72 at batches of 10,000 and 100,000; at
    ``scale`` < 1 (``--quick``) both scaled down, and labelled with what ran."""
    rows = []
    big = out / "data" / "chain10m"
    make_workload("chain", big, scale * 10 / 3)
    r = _spawn(big, "vector", "append", DEFAULT_BATCH, digest=False)
    size = "10M arrivals" if scale == 1.0 else f"{r['arrivals']:,} arrivals (quick)"
    rows.append({"what": f"chain, {size}, vector", **r})
    s72 = out / "data" / "s72"
    cached_workload("s72", s72, scale)  # (the main part may have written it at this scale)
    for b in (10_000, 100_000):
        r = _spawn(s72, "vector", "retract", b, digest=False)
        tag = "" if scale == 1.0 else f", {r['arrivals']:,} arrivals (quick)"
        rows.append({"what": f"s72, batches of {b:,}{tag}", **r})
    for r in rows:
        print(f"  memory: {r['what']}: peak RSS {r['peak_rss_mb']:.0f} MB "
              f"({r['peak_rss_mb'] - r['rss_before_mb']:.0f} MB over the "
              f"{r['rss_before_mb']:.0f} MB before the run), {r['arrivals']:,} arrivals",
              flush=True)
    return rows


def _report(summary: list[dict], memory: list[dict], runs: int, quick: bool = False) -> None:
    """The table and the targets; a ``quick`` run's inputs are 3% of the targets' sizes, so
    its targets are reported as not checked."""
    if summary:
        print(f"\nmedians of {runs} run(s), whole process (start-up, imports, reading, join, "
              "output):")
        print(f"  {'workload':8s} {'executor':8s} {'batch':>7s} {'CPU-s':>7s} {'engine':>7s} "
              f"{'updates/CPU-s':>14s} {'vs MJoin':>8s} {'results':>11s}")
    else:
        print()
    for s in summary:
        flag = "" if s["results_agree"] else "  MISMATCH"
        print(f"  {s['workload']:8s} {s['executor']:8s} {s['batch']!s:>7s} "
              f"{s['median_process_cpu_s']:7.2f} {s['median_engine_cpu_s']:7.2f} "
              f"{s['median_updates_per_cpu_s']:14,.0f} {s['mjoin_cpu_ratio']!s:>8s} "
              f"{s['results']:11,}{flag}")

    def row(w, ex, b=""):
        return next((s for s in summary if s["workload"] == w and s["executor"] == ex
                     and s["batch"] == b), None)

    skip = "not checked (quick: 3% of the size)"
    v72, m72 = row("s72", "vector", DEFAULT_BATCH), row("s72", "mjoin")
    if v72 and m72 and quick:
        print(f"  target s72: >= 1,500,000 updates per CPU-second, >= 4x MJoin -> {skip}")
    elif v72 and m72:
        tput = v72["median_updates_per_cpu_s"]
        print(f"  target s72: >= 1,500,000 updates per CPU-second -> "
              f"{'MET' if tput >= 1_500_000 else 'NOT MET'} ({tput:,.0f}); >= 4x MJoin -> "
              f"{'MET' if v72['mjoin_cpu_ratio'] >= 4 else 'NOT MET'} "
              f"({v72['mjoin_cpu_ratio']}x)")
    vc, mc = row("chain", "vector", DEFAULT_BATCH), row("chain", "mjoin")
    if vc and mc and quick:
        print(f"  target chain: >= 8x MJoin's CPU -> {skip}")
    elif vc and mc:
        print(f"  target chain: >= 8x MJoin's CPU -> "
              f"{'MET' if vc['mjoin_cpu_ratio'] >= 8 else 'NOT MET'} ({vc['mjoin_cpu_ratio']}x)")
    if memory and quick:
        chain, small, large = memory
        print(f"  target memory, chain 10M arrivals < 400 MB -> not checked (quick: "
              f"{chain['arrivals']:,} arrivals, peak RSS {chain['peak_rss_mb']:.0f} MB)")
        print(f"  target memory, s72 batch 100,000 < 2x batch 10,000 -> not checked (quick: "
              f"{small['arrivals']:,} arrivals, peak RSS "
              f"{large['peak_rss_mb'] / small['peak_rss_mb']:.2f}x)")
    elif memory:
        chain = memory[0]
        print(f"  target memory, chain 10M arrivals < 400 MB -> "
              f"{'MET' if chain['peak_rss_mb'] < 400 else 'NOT MET'} "
              f"({chain['peak_rss_mb']:.0f} MB)")
        small, large = memory[1], memory[2]
        ratio = large["peak_rss_mb"] / small["peak_rss_mb"]
        grow = ((large["peak_rss_mb"] - large["rss_before_mb"])
                / max(1.0, small["peak_rss_mb"] - small["rss_before_mb"]))
        print(f"  target memory, s72 batch 100,000 < 2x batch 10,000 -> "
              f"{'MET' if ratio < 2 else 'NOT MET'} (peak RSS {ratio:.2f}x; growth over the "
              f"RSS before the run {grow:.2f}x)")


def _plot(summary: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = [w for w in WORKLOADS if any(s["workload"] == w for s in summary)]
    fig, axes = plt.subplots(1, len(names), figsize=(3.2 * len(names), 3.2), squeeze=False)
    for ax, w in zip(axes[0], names):
        vec = sorted((s["batch"], s["median_updates_per_cpu_s"]) for s in summary
                     if s["workload"] == w and s["executor"] == "vector")
        if vec:
            ax.plot([b for b, _ in vec], [t for _, t in vec], "o-", label="vector")
        for ex, style in (("mjoin", "--"), ("xjoin", ":")):
            s = next((s for s in summary if s["workload"] == w and s["executor"] == ex), None)
            if s:
                ax.axhline(s["median_updates_per_cpu_s"], ls=style, color="gray", label=ex)
        ax.set_xscale("log")
        ax.set_title(w)
        ax.set_xlabel("batch (arrivals)")
        ax.set_ylabel("updates per CPU-s (whole process)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
