"""Benchmark: which columnar library should run the micro-batch windowed join — Polars, DuckDB
or numpy (with pyarrow)?

The computation (append mode, insert results only): streams R(a), S(a,b), T(b) arrive in one
global order (event time; ties in FROM order, then row order) and every arrival gets its
global position p. A result (r, s, t) of ``R.a = S.a AND S.b = T.b`` is emitted at the arrival
of its last component x when every other component y arrived before it (p_y < p_x) and is
still in its window (t_x - W <= t_y; event times as int64 nanoseconds, as adaptcq's engine
holds them). Arrivals are processed in batches of B consecutive positions; per batch, for each
stream X, the batch's X rows (ΔX) are joined with the other streams' kept state (rows still
in the window plus the batch's own rows), the window and order test applied at *every* join
step, then rows with t_y < t_last_of_batch - W are expired. Each result row (rid, sid, tid)
is materialised; per batch its count and the sums of the three id columns are kept, and
every implementation must give identical per-batch figures.

Three libraries (four functions), each in its own function:

* :func:`run_polars` — lazy ``join_where`` (one equality plus ``p_y < p_x`` and
  ``t_y >= t_x - W``) per join step, the three drivers collected together
  (``pl.collect_all``);
* :func:`run_polars_eager` — the plain DataFrame form: eager key-only ``join`` then
  ``filter`` per step (its largest pre-filter join is the intermediate it reports);
* :func:`run_duckdb` — one SQL query per batch (UNION ALL of the three drivers) over Arrow
  tables registered for that batch, range conditions in the ON clauses;
* :func:`run_numpy` — each stream's state as numpy arrays in arrival order plus, per join
  column, a sorted ``key << 32 | row`` index maintained incrementally (merge in the batch's
  rows, drop expired ones); "same key AND row in [lo, hi)" is two ``np.searchsorted`` (lo:
  first row with t_y >= t_x - W, hi: first row with p_y >= p_x), the ranges expanded to
  pairs with ``np.repeat``/``arange`` (the band is pushed into the join, so no intermediate
  holds an out-of-window or later pair). pyarrow holds the inputs.

State in all three is a contiguous slice of each stream's arrival-order columns (appending a
batch and expiring a prefix move two bounds), so none of them pays for copying state; what
differs is the per-batch join (Polars and DuckDB build a hash table per query, numpy keeps its
sorted index). Input preparation (merge order, int64 nanosecond times) is done once, untimed.

Workloads: ``a`` — a-caching §7.2's default (:func:`adaptcq.stream.workloads.three_way`,
700,000 arrivals, window 10 s: 500,000 results); ``b`` — a selective chain, 1,000,000 rows per
stream, keys uniform in [0, 100,000), times uniform over 1,000,000/197.8 s (seed 2024), W =
10 s (about a thousand results). Batch sizes 1,000, 10,000, 20,000, 100,000 arrivals.

Measured per (library, workload, B), each in a fresh subprocess, median of ``--runs`` runs
(default 3): CPU seconds of the join computation over all threads (``getrusage`` user +
system differences) and wall seconds. Polars and DuckDB are limited to ``--threads`` threads
(default 2: ``POLARS_MAX_THREADS``, DuckDB ``SET threads``). Memory: the subprocess's peak RSS
above its RSS after preparing the input, and the largest intermediate built (rows) — numpy's
largest banded pair set, polars_eager's largest key-only join before its filter; for the fused
hash joins (polars join_where, DuckDB) the intermediate is internal, and the CSV gives the
largest key-only equi-join of each step (computed by numpy, untimed) as its upper bound. Results are checked
against adaptcq's per-tuple engine (``executor="mjoin"``) for both workloads (counts and id
sums), unless ``--no-engine-check``.

    python -m adaptcq.bench.vector_libs [--quick] [--out results/vector_libs] [--runs 3]
        [--libs numpy,polars,polars_eager,duckdb] [--workloads a,b] [--batches 1000,10000]
        [--threads 2] [--no-engine-check]

Writes ``<out>/vector_libs.csv`` and ``.png`` (CPU-seconds against B, per workload, a line per
library) and prints the table. ``--quick`` runs workload b only, at 200,000 rows per stream,
B in {1,000, 10,000}, one run each. A library that is not installed is left out, with a
note, unless ``--libs`` names it (then it is an error).
"""

from __future__ import annotations

import os

_THREADS_ENV = "ADAPTCQ_BENCH_THREADS"
if _THREADS_ENV in os.environ:  # a measuring subprocess: fix Polars' pool before it is imported
    os.environ["POLARS_MAX_THREADS"] = os.environ[_THREADS_ENV]

import argparse
import csv
import json
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from adaptcq.bench._args import choices, positive_int, refuse_unused
from adaptcq.bench.spark_scale import positive_ints

SECOND = 1_000_000_000
NAMES = ("R", "S", "T")
KEYS = {"R": ("a",), "S": ("a", "b"), "T": ("b",)}
# Per driver: the two join steps (partner stream, partner's column, column of the row already
# bound that it equals). R.a = S.a AND S.b = T.b.
PLANS = {
    "R": (("S", "a", ("R", "a")), ("T", "b", ("S", "b"))),
    "S": (("R", "a", ("S", "a")), ("T", "b", ("S", "b"))),
    "T": (("S", "b", ("T", "b")), ("R", "a", ("S", "a"))),
}
LIBS = ("numpy", "polars", "polars_eager", "duckdb")
THREADED = ("polars", "polars_eager", "duckdb")  # the libraries --threads limits
WORKLOADS = ("a", "b")
BATCHES = (1_000, 10_000, 20_000, 100_000)
MASK32 = (1 << 32) - 1


# ----- input ------------------------------------------------------------------------------
@dataclass
class Streams:
    """The three streams in arrival order: per stream a pyarrow table (t: int64 ns, p: global
    position, id, join columns) and the same columns as numpy arrays; the global time array
    (by position) and the window in ns."""

    tables: dict[str, pa.Table]
    cols: dict[str, dict[str, np.ndarray]]
    gts: np.ndarray
    window: int
    name: str

    @property
    def n(self) -> int:
        return len(self.gts)


def prepare(tables: dict[str, pa.Table], window_s: float, name: str) -> Streams:
    from adaptcq.stream.eventtime import to_nanoseconds

    ts = {s: to_nanoseconds(tables[s]["ts"], "s", s, "ts") for s in NAMES}
    allt = np.concatenate([ts[s] for s in NAMES])
    sid = np.concatenate([np.full(len(ts[s]), i, np.int64) for i, s in enumerate(NAMES)])
    row = np.concatenate([np.arange(len(ts[s]), dtype=np.int64) for s in NAMES])
    order = np.lexsort((row, sid, allt))  # time, then FROM order, then row
    pos = np.empty(len(order), np.int64)
    pos[order] = np.arange(len(order), dtype=np.int64)
    cols, out = {}, {}
    start = 0
    for s in NAMES:
        n = len(ts[s])
        c = {"t": ts[s], "p": pos[start:start + n].copy(),
             "id": tables[s]["id"].to_numpy().astype(np.int64)}
        for k in KEYS[s]:
            c[k] = tables[s][k].to_numpy().astype(np.int64)
        assert np.all(np.diff(c["p"]) > 0), "a stream's rows must be in time order"
        assert c[KEYS[s][0]].min() >= 0 and c[KEYS[s][-1]].max() < 2**31 and n < 2**32
        cols[s] = c
        out[s] = pa.table(c)
        start += n
    return Streams(out, cols, allt[order], round(window_s * SECOND), name)


def workload_a() -> tuple[dict[str, pa.Table], float, str]:
    from adaptcq.stream.workloads import three_way

    wl = three_way(n_updates=700_000, window=10.0)
    return wl.tables, 10.0, wl.sql


def workload_b(n: int = 1_000_000) -> tuple[dict[str, pa.Table], float, str]:
    rng = np.random.default_rng(2024)
    span = n / 197.8
    tabs = {}
    for s in NAMES:
        t = np.sort(rng.uniform(0.0, span, n))
        cols = {"ts": t, "id": np.arange(n, dtype=np.int64)}
        for k in KEYS[s]:
            cols[k] = rng.integers(0, 100_000, n, dtype=np.int64)
        tabs[s] = pa.table(cols)
    sql = ("SELECT R.id AS rid, S.id AS sid, T.id AS tid "
           "FROM R [RANGE 10 SECONDS], S [RANGE 10 SECONDS], T [RANGE 10 SECONDS] "
           "WHERE R.a = S.a AND S.b = T.b")
    return tabs, 10.0, sql


def load(workload: str, quick: bool) -> tuple[Streams, str, dict[str, pa.Table]]:
    if workload == "a":
        tabs, w, sql = workload_a()
    else:
        tabs, w, sql = workload_b(200_000 if quick else 1_000_000)
    return prepare(tabs, w, workload), sql, tabs


# ----- batching (shared bookkeeping, run inside each timed region) --------------------------
def batch_plan(st: Streams, size: int):
    """Per batch: {stream: (lo, d, hi)} — state rows [lo, hi), the batch's own rows [d, hi)
    (row indices of the stream) — and the next batch's state start (after expiry)."""
    lo = dict.fromkeys(NAMES, 0)
    for p0 in range(0, st.n, size):
        p1 = min(p0 + size, st.n)
        spans = {}
        for s in NAMES:
            p = st.cols[s]["p"]
            spans[s] = (lo[s], int(np.searchsorted(p, p0)), int(np.searchsorted(p, p1)))
        yield spans
        cut = int(st.gts[p1 - 1]) - st.window  # expire t_y < t_last - W
        for s in NAMES:
            lo[s] = int(np.searchsorted(st.cols[s]["t"], cut, "left"))


# ----- numpy (+ pyarrow input) ------------------------------------------------------------
def _expand(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Ranges [starts, ends) -> (owner index, position) of every element."""
    counts = np.maximum(ends - starts, 0)
    total = int(counts.sum())
    owner = np.repeat(np.arange(len(starts)), counts)
    first = np.cumsum(counts) - counts
    pos = np.repeat(starts - first, counts) + np.arange(total)
    return owner, pos


def run_numpy(st: Streams, size: int, diag: bool = False) -> dict:
    cols, W = st.cols, st.window
    # index[(stream, column)]: sorted int64 key << 32 | row over the stream's state rows;
    # fresh[(stream, column)]: the same for the batch's own rows only (merged into index).
    index = {(s, k): np.empty(0, np.int64) for s in NAMES for k in KEYS[s]}
    fresh = dict.fromkeys(index)
    hi_prev = dict.fromkeys(NAMES, 0)
    counts, sums, max_inter, max_equi = [], np.zeros(3, np.int64), 0, [0, 0]
    for spans in batch_plan(st, size):
        for (s, k), ix in index.items():  # expire, then merge the batch's rows in
            lo, _, hi = spans[s]
            if len(ix) and int(np.min(ix & MASK32)) < lo:
                ix = ix[(ix & MASK32) >= lo]
            new = np.sort((cols[s][k][hi_prev[s]:hi] << 32)
                          | np.arange(hi_prev[s], hi, dtype=np.int64))
            if len(new):
                ix = np.insert(ix, np.searchsorted(ix, new), new)
            index[(s, k)], fresh[(s, k)] = ix, new
        for s in NAMES:
            hi_prev[s] = spans[s][2]
        n_batch = 0
        for x, steps in PLANS.items():
            _, d, hi = spans[x]
            if d == hi:
                continue
            tx, px = cols[x]["t"][d:hi], cols[x]["p"][d:hi]
            # Driver rows in (key, row) order, so that the first step's probes come sorted
            # (numpy's searchsorted is ~5x faster on sorted needles: cache locality).
            xr = fresh[(x, steps[0][2][1])] & MASK32
            bound = {x: xr}  # row of each stream per partial result
            owner = xr - d  # partial -> driver row (offset in row order)
            for step, (y, ky, (z, kz)) in enumerate(steps):
                lo_y, _, hi_y = spans[y]
                ty, py = cols[y]["t"][lo_y:hi_y], cols[y]["p"][lo_y:hi_y]
                # The band of y rows [lo, hi) per partial: t_y >= t_x - W and p_y < p_x. At
                # the first step per driver row in row order (sorted needles), then permuted;
                # later only for the surviving partials' driver rows.
                if step == 0:
                    band_lo = (np.searchsorted(ty, tx - W, "left") + lo_y)[owner]
                    band_hi = (np.searchsorted(py, px, "left") + lo_y)[owner]
                else:
                    band_lo = np.searchsorted(ty, tx[owner] - W, "left") + lo_y
                    band_hi = np.searchsorted(py, px[owner], "left") + lo_y
                key = cols[z][kz][bound[z]] << 32
                ix = index[(y, ky)]
                starts = np.searchsorted(ix, key | band_lo)
                ends = np.searchsorted(ix, key | band_hi)
                if diag:  # what a key-only equi-join would materialise at this step
                    e = (np.searchsorted(ix, key | hi_y) - np.searchsorted(ix, key | lo_y)).sum()
                    max_equi[step] = max(max_equi[step], int(e))
                which, at = _expand(starts, ends)
                bound = {r: v[which] for r, v in bound.items()}
                bound[y] = ix[at] & MASK32
                owner = owner[which]
                max_inter = max(max_inter, len(owner))
            n_batch += len(owner)
            sums += [int(cols[s]["id"][bound[s]].sum()) for s in NAMES]
        counts.append(n_batch)
    return {"counts": counts, "sums": sums.tolist(), "max_intermediate": max_inter,
            "max_equi_join": max_equi}


# ----- Polars -----------------------------------------------------------------------------
def run_polars(st: Streams, size: int) -> dict:
    import polars as pl

    W = st.window
    full = {s: pl.from_arrow(st.tables[s]).rename(lambda c, s=s: f"{s}_{c}") for s in NAMES}
    counts, sums = [], np.zeros(3, np.int64)
    for spans in batch_plan(st, size):
        state = {s: full[s].slice(lo, hi - lo).lazy() for s, (lo, _, hi) in spans.items()}
        queries = []
        for x, steps in PLANS.items():
            _, d, hi = spans[x]
            if d == hi:
                continue
            q = full[x].slice(d, hi - d).lazy().with_columns(
                (pl.col(f"{x}_t") - W).alias("x_lo"))
            for y, ky, (z, kz) in steps:
                q = q.join_where(state[y], pl.col(f"{z}_{kz}") == pl.col(f"{y}_{ky}"),
                                 pl.col(f"{y}_p") < pl.col(f"{x}_p"),
                                 pl.col(f"{y}_t") >= pl.col("x_lo"))
            queries.append(q.select([f"{s}_id" for s in NAMES]))
        n_batch = 0
        for df in pl.collect_all(queries):
            n_batch += df.height
            if df.height:
                sums += np.asarray(df.sum().row(0), dtype=np.int64)
        counts.append(n_batch)
    return {"counts": counts, "sums": sums.tolist()}


def run_polars_eager(st: Streams, size: int) -> dict:
    """The plain-DataFrame form: eager key-only ``join`` then ``filter`` per step."""
    import polars as pl

    W = st.window
    full = {s: pl.from_arrow(st.tables[s]).rename(lambda c, s=s: f"{s}_{c}") for s in NAMES}
    counts, sums, max_inter = [], np.zeros(3, np.int64), 0
    for spans in batch_plan(st, size):
        state = {s: full[s].slice(lo, hi - lo) for s, (lo, _, hi) in spans.items()}
        n_batch = 0
        for x, steps in PLANS.items():
            _, d, hi = spans[x]
            if d == hi:
                continue
            df = full[x].slice(d, hi - d)
            for y, ky, (z, kz) in steps:
                df = df.join(state[y], left_on=f"{z}_{kz}", right_on=f"{y}_{ky}")
                max_inter = max(max_inter, df.height)
                df = df.filter((pl.col(f"{y}_p") < pl.col(f"{x}_p"))
                               & (pl.col(f"{y}_t") >= pl.col(f"{x}_t") - W))
            df = df.select([f"{s}_id" for s in NAMES])
            n_batch += df.height
            if df.height:
                sums += np.asarray(df.sum().row(0), dtype=np.int64)
        counts.append(n_batch)
    return {"counts": counts, "sums": sums.tolist(), "max_intermediate": max_inter}


# ----- DuckDB -----------------------------------------------------------------------------
def _duckdb_sql(W: int) -> str:
    parts = []
    for x, steps in PLANS.items():
        joins = " ".join(
            f"JOIN {y} AS {y.lower()} ON {y.lower()}.{ky} = {z.lower()}.{kz} "
            f"AND {y.lower()}.p < {x.lower()}.p AND {y.lower()}.t >= {x.lower()}.t - {W}"
            for y, ky, (z, kz) in steps)
        parts.append(f"SELECT r.id AS rid, s.id AS sid, t.id AS tid "
                     f"FROM d{x} AS {x.lower()} {joins}")
    return " UNION ALL ".join(parts)


def run_duckdb(st: Streams, size: int, threads: int) -> dict:
    import duckdb

    con = duckdb.connect()
    con.execute(f"SET threads = {threads}")
    sql = _duckdb_sql(st.window)
    counts, sums = [], np.zeros(3, np.int64)
    for spans in batch_plan(st, size):
        for s, (lo, d, hi) in spans.items():
            con.register(s, st.tables[s].slice(lo, hi - lo))
            con.register(f"d{s}", st.tables[s].slice(d, hi - d))
        cur = con.execute(sql)
        res = cur.to_arrow_table() if hasattr(cur, "to_arrow_table") else cur.fetch_arrow_table()
        counts.append(res.num_rows)
        if res.num_rows:
            sums += [pc.sum(res[c]).as_py() for c in ("rid", "sid", "tid")]
    con.close()
    return {"counts": counts, "sums": sums.tolist()}


# ----- measuring --------------------------------------------------------------------------
def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _status(field: str) -> int | None:
    """VmRSS / VmHWM of this process in bytes (None where /proc does not say)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _reset_peak() -> bool:
    """Reset the kernel's peak-RSS mark (VmHWM) to the current RSS (Linux >= 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def child(lib: str, workload: str, size: int, runs: int, quick: bool, threads: int) -> dict:
    st, _, _ = load(workload, quick)
    fn = {"numpy": lambda: run_numpy(st, size), "polars": lambda: run_polars(st, size),
          "polars_eager": lambda: run_polars_eager(st, size),
          "duckdb": lambda: run_duckdb(st, size, threads)}[lib]
    import gc

    if lib != "numpy":  # library code and pools are not the join's memory
        __import__(lib.split("_")[0])
    gc.collect()
    exact_peak = _reset_peak()  # else the input generation's own peak would hide the join's
    base_rss = _status("VmRSS") or 0
    cpus, walls, out = [], [], None
    for _ in range(runs):
        c0, w0 = _cpu(), time.perf_counter()
        res = fn()
        walls.append(time.perf_counter() - w0)
        cpus.append(_cpu() - c0)
        if out is not None and (res["counts"] != out["counts"] or res["sums"] != out["sums"]):
            raise AssertionError(f"{lib}: runs disagree")
        out = res
    peak = (_status("VmHWM") if exact_peak else None) or \
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    info = {"cpu": cpus, "wall": walls, "counts": out["counts"], "sums": out["sums"],
            "max_intermediate": out.get("max_intermediate"),
            "rss_mb": max(0, peak - base_rss) / 2**20}
    if lib == "numpy":
        info["max_equi_join"] = run_numpy(st, size, diag=True)["max_equi_join"]
    return info


def engine_check(workload: str, quick: bool) -> dict:
    """adaptcq's per-tuple MJoin on the same input: result count and id sums."""
    from adaptcq.runtime.local import run

    _, sql, tabs = load(workload, quick)
    t0 = time.perf_counter()
    res = run(sql, tabs, timestamp="ts", executor="mjoin", mode="append")
    tab = res.table
    return {"results": int(res.stats["results"]), "seconds": time.perf_counter() - t0,
            "sums": [int(pc.sum(tab[c]).as_py() or 0) for c in ("rid", "sid", "tid")]}


def _spawn(args: list[str], threads: int) -> dict:
    env = dict(os.environ, **{_THREADS_ENV: str(threads)})
    proc = subprocess.run([sys.executable, "-m", "adaptcq.bench.vector_libs", *args],
                          env=env, capture_output=True, text=True, check=False)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _versions() -> dict:
    v = {"numpy": np.__version__, "pyarrow": pa.__version__}
    for m in ("polars", "duckdb"):
        try:
            v[m] = __import__(m).__version__
        except ImportError:
            v[m] = None
    return v


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m adaptcq.bench.vector_libs",
                                 description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="workload b only, 200,000 rows per stream, B in 1,000 and 10,000, "
                         "one run unless --runs")
    ap.add_argument("--out", default="results/vector_libs",
                    help="folder of the CSV, the PNG and the versions (default "
                         "results/vector_libs)")
    ap.add_argument("--runs", type=positive_int, default=None,
                    help="runs per (library, workload, B), medians reported (default 3; "
                         "--quick: 1)")
    ap.add_argument("--threads", type=positive_int, default=2,
                    help="threads of Polars and DuckDB (default 2; refused when neither "
                    "runs)")
    ap.add_argument("--libs", type=choices(LIBS), default=None,
                    help=f"comma-separated, from {', '.join(LIBS)} (default: those installed)")
    ap.add_argument("--workloads", type=choices(WORKLOADS), default=None,
                    help="comma-separated, from a (§7.2's join), b (the selective chain); "
                         "default a,b (--quick: b)")
    ap.add_argument("--batches", type=positive_ints, default=None,
                    help="batch sizes B in arrivals, comma-separated (default "
                         f"{','.join(map(str, BATCHES))}; --quick: 1000,10000)")
    ap.add_argument("--no-engine-check", action="store_true",
                    help="do not check the results against adaptcq's MJoin")
    ap.add_argument("--child", nargs=3, metavar=("LIB", "WORKLOAD", "B"), help=argparse.SUPPRESS)
    ap.add_argument("--engine-child", metavar="WORKLOAD", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    runs = a.runs or (1 if a.quick else 3)
    if a.child:
        lib, wl, b = a.child
        print(json.dumps(child(lib, wl, int(b), runs, a.quick, a.threads)))
        return 0
    if a.engine_child:
        print(json.dumps(engine_check(a.engine_child, a.quick)))
        return 0

    if a.quick and a.workloads and "a" in a.workloads:
        ap.error("--workloads a: --quick runs workload b only (a has no small size)")
    versions = _versions()
    missing = [x for x in (a.libs or LIBS) if versions[x.split("_")[0]] is None]
    if a.libs and missing:
        ap.error(f"--libs: {', '.join(missing)} not installed (pip install "
                 f"{' '.join(sorted({x.split('_')[0] for x in missing}))})")
    for x in missing:
        print(f"{x}: not installed, left out (pip install {x.split('_')[0]})", flush=True)
    libs = [x for x in (a.libs or LIBS) if x not in missing]
    if not any(x in THREADED for x in libs):  # numpy alone runs on one thread
        refuse_unused(ap, ["threads"], f"without a threaded library ({', '.join(THREADED)}) "
                      f"among those run ({', '.join(libs) or 'none'})", argv=argv)
    sizes = a.batches or ([1_000, 10_000] if a.quick else list(BATCHES))
    workloads = a.workloads or (["b"] if a.quick else list(WORKLOADS))
    print(f"versions: {versions}; threads={a.threads} (POLARS_MAX_THREADS, DuckDB SET threads);"
          f" runs={runs}{' (quick: workload b at 200,000 rows per stream)' if a.quick else ''}",
          flush=True)
    engine = {}
    if not a.no_engine_check:
        for wl in workloads:
            engine[wl] = _spawn(["--engine-child", wl] + (["--quick"] if a.quick else []), 1)
            print(f"engine mjoin, workload {wl}: {engine[wl]['results']} results, id sums "
                  f"{engine[wl]['sums']} ({engine[wl]['seconds']:.1f} s)", flush=True)
    rows, ref = [], {}
    for wl in workloads:
        for size in sizes:
            for lib in libs:
                args = ["--child", lib, wl, str(size), "--runs", str(runs),
                        "--threads", str(a.threads)] + (["--quick"] if a.quick else [])
                r = _spawn(args, a.threads)
                key = (wl, size)
                ref.setdefault(key, (lib, r["counts"], r["sums"]))
                agree = r["counts"] == ref[key][1] and r["sums"] == ref[key][2]
                eng = engine.get(wl)
                eng_ok = None if eng is None else (
                    eng["results"] == sum(r["counts"]) and eng["sums"] == r["sums"])
                row = {"workload": wl, "batch": size, "lib": lib, "threads": a.threads,
                       "cpu_s": statistics.median(r["cpu"]), "wall_s": statistics.median(r["wall"]),
                       "cpu_runs": " ".join(f"{x:.3f}" for x in r["cpu"]),
                       "wall_runs": " ".join(f"{x:.3f}" for x in r["wall"]),
                       "results": sum(r["counts"]), "batches": len(r["counts"]),
                       "sum_rid": r["sums"][0], "sum_sid": r["sums"][1], "sum_tid": r["sums"][2],
                       "agrees_with": ref[key][0] if agree else f"NO ({ref[key][0]})",
                       "matches_engine": eng_ok,
                       "max_intermediate_rows": r.get("max_intermediate"),
                       "equi_join_rows_step1_step2": " ".join(map(str, r["max_equi_join"]))
                       if r.get("max_equi_join") else "",
                       "peak_rss_mb": round(r["rss_mb"], 1)}
                rows.append(row)
                print(f"{wl} B={size:>7,} {lib:<7} cpu {row['cpu_s']:7.3f} s  wall "
                      f"{row['wall_s']:7.3f} s  results {row['results']:>7,}  agree "
                      f"{row['agrees_with']}  engine {eng_ok}  rss +{row['peak_rss_mb']} MB",
                      flush=True)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = "vector_libs" + ("" if a.threads == 2 else f"_threads{a.threads}") \
        + ("_quick" if a.quick else "")
    path = out / f"{stem}.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    (out / f"{stem}_versions.json").write_text(
        json.dumps({"versions": versions, "threads": a.threads, "runs": runs,
                    "engine": engine}, indent=1))
    _plot(rows, libs, workloads, out / f"{stem}.png", runs, a.threads)
    print(f"\nmedian of {runs}; CPU-s = user+sys over all threads; wrote {path} and "
          f"{out / f'{stem}.png'}")
    print(f"{'workload':<8} {'B':>8} " + " ".join(f"{lib + ' cpu/wall':>22}" for lib in libs)
          + f" {'results':>8} agree")
    for wl in workloads:
        for size in sizes:
            sel = {r["lib"]: r for r in rows if r["workload"] == wl and r["batch"] == size}
            cells = " ".join(f"{sel[lib]['cpu_s']:>10.3f}/{sel[lib]['wall_s']:<10.3f}"
                             if lib in sel else f"{'-':>22}" for lib in libs)
            ok = all(r["agrees_with"] == libs[0] and r["matches_engine"] is not False
                     for r in sel.values())
            print(f"{wl:<8} {size:>8,} {cells} {next(iter(sel.values()))['results']:>8,} "
                  f"{'yes' if ok else 'NO'}")
    bad = [r for r in rows if r["agrees_with"].startswith("NO") or r["matches_engine"] is False]
    return 1 if bad else 0


def _plot(rows: list[dict], libs: list[str], workloads: list[str], path: Path, runs: int,
          threads: int) -> None:
    """The CSV's CPU-seconds against the batch size B, one panel per workload, a line per
    library (log-log: B spans two decades)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    title = {"a": "a: §7.2 join", "b": "b: selective chain"}
    fig, axes = plt.subplots(1, len(workloads), figsize=(4.5 * len(workloads), 3.8),
                             squeeze=False)
    for ax, wl in zip(axes[0], workloads, strict=True):
        for lib in libs:
            mine = sorted((r["batch"], r["cpu_s"]) for r in rows
                          if r["workload"] == wl and r["lib"] == lib)
            ax.plot([b for b, _ in mine], [c for _, c in mine], "o-", label=lib)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("batch size B (arrivals)")
        ax.set_ylabel("CPU-seconds of the join")
        ax.set_title(f"workload {title[wl]}")
        ax.legend(fontsize=8)
    fig.suptitle(f"the band join per library\n(median of {runs}; Polars, DuckDB: {threads} "
                 "threads)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
