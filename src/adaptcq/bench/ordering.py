"""Reproduce the join-ordering experiments of join-ordering.txt §3.3 (Figures 4, 7, 9, 10).

    python -m adaptcq.bench.ordering [--n 3..20] [--settings 500] [--out results/ordering]
                                     [--engine spark|local] [--quick] [--dmjoin-max 14]
                                     [--objective cost|tuples|both]

For every N and join-graph shape (linear, star, general acyclic, cyclic, complete) the sweep
draws random settings (λ uniform in [1, 100], σ uniform in (0, 1], W = 1; see
:mod:`adaptcq.optimizer.random_graphs`), orders all N pipelines with every algorithm, and
records the plan's cost (Eq. 3, or the plan's intermediate tuples) and the plan-generation
time. Where DMJoin is tractable (N ≤ ``--dmjoin-max``) its plan is the optimum: an algorithm is
*optimal* on a setting when its plan costs at most (1 + 1e-9)·optimum, and the cost ratio to
the optimum is recorded ("n fold more expensive").

The sweep is a Spark batch job (one setting per row of a DataFrame of (n, shape, index),
evaluated with ``mapInPandas`` on ``local[2]``), or, with ``--engine local`` or when Java or
PySpark is unavailable, a local multiprocessing pool. It writes under ``--out``:
``settings.csv`` (one row per setting and algorithm), ``figure4.csv/png`` (F-Greedy vs DMJoin:
time, % optimal, cost ratios on general acyclic and complete graphs), ``figure7.csv/png``
(TreeOpt: % optimal, time, cost ratios on cyclic graphs), ``figure9.csv/png`` (FAB vs DMJoin:
time, % optimal), ``figure10.csv/png`` (FAB cost ratios on acyclic and complete graphs),
``summary.csv`` and ``claims.csv``; and prints a summary table and the list of the paper's
claims, each CONFIRMED or NOT CONFIRMED with the measured number.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import shutil
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from adaptcq.bench._args import given, nonnegative_int, positive_int, refuse_unused
from adaptcq.optimizer import (
    DMJOIN_MAX_STREAMS,
    OBJECTIVES,
    SHAPES,
    plan,
    plan_objective,
    random_graph,
)

#: heuristics compared with DMJoin, in the paper's order
HEURISTICS: tuple[str, ...] = ("fgreedy", "treeopt", "fab", "qaware")
LABEL = {"dmjoin": "DMJoin", "fgreedy": "F-Greedy", "treeopt": "TreeOpt", "fab": "FAB",
         "qaware": "Q-Aware"}
SHAPE_LABEL = {"linear": "linear", "star": "star", "acyclic": "general acyclic",
               "cyclic": "cyclic", "complete": "complete"}
REL_TOL = 1e-9
RESULT_COLUMNS = ["n", "shape", "index", "objective", "algorithm", "cost", "seconds"]

#: default settings per (N, shape) beyond which the default run trims (keeps < 10 min on 2 cores)
DEFAULT_SCHEDULE = ((10, 500), (14, 150), (20, 80))
QUICK_SCHEDULE = ((8, 50),)


# ----- one setting ---------------------------------------------------------------------------

def setting_rng(seed: int, n: int, shape: str, index: int) -> random.Random:
    """The random source of one setting: the same (seed, n, shape, index) gives the same
    join graph on any machine and in any worker."""
    return random.Random(f"adaptcq-ordering:{seed}:{n}:{shape}:{index}")


def evaluate_setting(n: int, shape: str, index: int, seed: int, dmjoin_max: int,
                     objectives: tuple[str, ...]) -> list[tuple]:
    """Plan one random setting with every algorithm; rows of :data:`RESULT_COLUMNS`."""
    graph = random_graph(n, shape, setting_rng(seed, n, shape, index))
    algorithms = (("dmjoin",) if n <= dmjoin_max else ()) + HEURISTICS
    rows = []
    for objective in objectives:
        for algorithm in algorithms:
            t0 = time.perf_counter()
            p = plan(graph, algorithm, objective=objective)  # type: ignore[arg-type]
            seconds = time.perf_counter() - t0
            cost = plan_objective(graph, p, objective)  # type: ignore[arg-type]
            rows.append((n, shape, index, objective, algorithm, cost, seconds))
    return rows


def evaluate_frame(batches: Iterator[pd.DataFrame], seed: int, dmjoin_max: int,
                   objectives: tuple[str, ...]) -> Iterator[pd.DataFrame]:
    """``mapInPandas`` body: settings (n, shape, index) in, result rows out."""
    for batch in batches:
        rows: list[tuple] = []
        for n, shape, index in zip(batch["n"], batch["shape"], batch["index"], strict=True):
            rows.extend(evaluate_setting(int(n), str(shape), int(index), seed, dmjoin_max,
                                         objectives))
        yield pd.DataFrame(rows, columns=RESULT_COLUMNS)


def _evaluate_chunk(args: tuple) -> list[tuple]:
    chunk, seed, dmjoin_max, objectives = args
    out: list[tuple] = []
    for n, shape, index in chunk:
        out.extend(evaluate_setting(n, shape, index, seed, dmjoin_max, objectives))
    return out


# ----- engines -------------------------------------------------------------------------------

def java_available() -> tuple[bool, str]:
    """Whether ``java -version`` runs; the reason when it does not."""
    java = shutil.which("java")
    home = os.environ.get("JAVA_HOME")
    if java is None and home:
        candidate = Path(home) / "bin" / "java"
        java = str(candidate) if candidate.exists() else None
    if java is None:
        return False, "no `java` on PATH and no JAVA_HOME/bin/java"
    try:
        proc = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"`java -version` failed: {exc}"
    if proc.returncode != 0:
        return False, f"`java -version` exited with {proc.returncode}: {proc.stderr.strip()}"
    first = (proc.stderr or proc.stdout).strip().splitlines()
    return True, first[0] if first else "java"


def run_spark(settings: pd.DataFrame, seed: int, dmjoin_max: int,
              objectives: tuple[str, ...], cores: int) -> pd.DataFrame:
    """Evaluate the settings as a Spark batch job on ``local[cores]``."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas")
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master(f"local[{cores}]")
             .appName("adaptcq-ordering-sweep")
             .config("spark.pyspark.python", sys.executable)
             .config("spark.pyspark.driver.python", sys.executable)
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", str(4 * cores))
             .config("spark.sql.execution.arrow.maxRecordsPerBatch", "64")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    try:
        schema = ("n long, shape string, index long, objective string, algorithm string, "
                  "cost double, seconds double")
        frame = spark.createDataFrame(settings).repartition(max(8, 16 * cores))

        # import by the module's real name, so that workers import it instead of
        # receiving a by-value copy of ``__main__``
        from adaptcq.bench.ordering import evaluate_frame as evaluate

        def body(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
            return evaluate(batches, seed, dmjoin_max, objectives)

        return frame.mapInPandas(body, schema=schema).toPandas()
    finally:
        spark.stop()


def run_local(settings: pd.DataFrame, seed: int, dmjoin_max: int,
              objectives: tuple[str, ...], cores: int) -> pd.DataFrame:
    """Evaluate the settings with a local process pool (in-process when ``cores`` is 1)."""
    items = list(zip(settings["n"].astype(int), settings["shape"].astype(str),
                     settings["index"].astype(int), strict=True))
    random.Random(seed).shuffle(items)  # mix heavy and light settings across chunks
    chunks = [items[i:i + 16] for i in range(0, len(items), 16)]
    jobs = [(c, seed, dmjoin_max, objectives) for c in chunks]
    from adaptcq.bench.ordering import _evaluate_chunk as evaluate  # picklable by reference

    rows: list[tuple] = []
    if cores > 1:
        try:
            import multiprocessing as mp

            with mp.get_context("spawn").Pool(cores) as pool:
                for part in pool.imap_unordered(evaluate, jobs):
                    rows.extend(part)
            return pd.DataFrame(rows, columns=RESULT_COLUMNS)
        except (OSError, ImportError) as exc:  # pragma: no cover - sandboxed hosts
            print(f"multiprocessing unavailable ({exc}); evaluating in-process")
            rows = []
    for job in jobs:
        rows.extend(evaluate(job))
    return pd.DataFrame(rows, columns=RESULT_COLUMNS)


# ----- analysis ------------------------------------------------------------------------------

def read_settings(path: Path) -> pd.DataFrame:
    """``settings.csv`` of an earlier sweep, its :data:`RESULT_COLUMNS` checked: ValueError
    naming the file, and the column or row (1 = the header line), for a file that is not
    one (empty, not CSV, a column missing, a value that is not the sweep's), rather than a
    pandas error or a wrong analysis later."""
    try:
        raw = pd.read_csv(path, low_memory=False)
    except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not a settings.csv of this benchmark "
                         f"({type(exc).__name__}: {exc})") from None
    missing = [c for c in RESULT_COLUMNS if c not in raw.columns]
    if missing:
        raise ValueError(f"{path}: not a settings.csv of this benchmark: no column "
                         f"{', '.join(missing)} (its columns: "
                         f"{', '.join(map(str, raw.columns)) or 'none'})")
    raw = raw[RESULT_COLUMNS].copy()
    known = {"shape": SHAPES, "objective": OBJECTIVES, "algorithm": tuple(LABEL)}
    for col in RESULT_COLUMNS:
        if col in known:
            bad = ~raw[col].isin(known[col])
            what = f"one of {', '.join(known[col])}"
        else:
            num = pd.to_numeric(raw[col], errors="coerce")
            # n and index are whole numbers >= 0; cost and seconds finite numbers >= 0
            bad = ~(np.isfinite(num) & (num >= 0))
            if col in ("n", "index"):
                bad |= num.ne(num.round())
                what = "a whole number >= 0"
            else:
                what = "a finite number >= 0"
            raw[col] = num
        if bad.any():
            row = int(np.flatnonzero(bad.to_numpy())[0])
            raise ValueError(f"{path}, row {row + 2}: {col} must be {what}, got "
                             f"{raw[col].iloc[row]!r}")
    raw[["n", "index"]] = raw[["n", "index"]].astype("int64")
    return raw


def with_optimum(results: pd.DataFrame) -> pd.DataFrame:
    """Add ``optimum`` (DMJoin's cost on the same setting), ``ratio`` and ``optimal``."""
    key = ["n", "shape", "index", "objective"]
    opt = (results[results["algorithm"] == "dmjoin"][key + ["cost"]]
           .rename(columns={"cost": "optimum"}))
    out = results.merge(opt, on=key, how="left")
    out["ratio"] = out["cost"] / out["optimum"]
    optimal = (out["cost"] <= out["optimum"] * (1 + REL_TOL)).astype("boolean")
    optimal[out["optimum"].isna()] = pd.NA
    out["optimal"] = optimal
    return out


def share_optimal(df: pd.DataFrame) -> pd.DataFrame:
    """% of settings with an optimal plan, per objective, algorithm, shape and N."""
    d = df[df["optimum"].notna()]
    g = d.groupby(["objective", "algorithm", "shape", "n"])["optimal"]
    return (g.mean() * 100).rename("pct_optimal").reset_index()


def ratio_quantiles(df: pd.DataFrame) -> pd.DataFrame:
    d = df[df["optimum"].notna()]
    g = d.groupby(["objective", "algorithm", "shape", "n"])["ratio"]
    if d.empty:  # no N within --dmjoin-max: no optimum, no ratios (unstack gives no columns)
        return pd.DataFrame(columns=["objective", "algorithm", "shape", "n", "min", "q1",
                                     "median", "q3", "max", "mean"])
    q = g.quantile([0.0, 0.25, 0.5, 0.75, 1.0]).unstack()
    q.columns = ["min", "q1", "median", "q3", "max"]
    q["mean"] = g.mean()
    return q.reset_index()


def mean_times(df: pd.DataFrame) -> pd.DataFrame:
    g = df.groupby(["objective", "algorithm", "n"])["seconds"]
    return g.mean().rename("mean_seconds").reset_index()


@dataclass
class Claim:
    section: str
    text: str
    confirmed: bool | None
    measured: str

    @property
    def verdict(self) -> str:
        if self.confirmed is None:
            return "NOT MEASURED"
        return "CONFIRMED" if self.confirmed else "NOT CONFIRMED"


def claims(df: pd.DataFrame, objective: str) -> list[Claim]:
    """The paper's claims, checked on the settings where DMJoin ran."""
    d = df[(df["objective"] == objective) & df["optimum"].notna()]
    out: list[Claim] = []
    if d.empty:
        return [Claim("§3.3", "optimality claims", None, "DMJoin ran on no setting")]

    def sub(alg: str, shapes: tuple[str, ...]) -> pd.DataFrame:
        return d[(d["algorithm"] == alg) & d["shape"].isin(shapes)]

    def pct(alg: str, shapes: tuple[str, ...]) -> float:
        s = sub(alg, shapes)
        return float(s["optimal"].mean() * 100) if len(s) else math.nan

    def worst(alg: str, shapes: tuple[str, ...]) -> float:
        s = sub(alg, shapes)
        return float(s["ratio"].max()) if len(s) else math.nan

    def count(alg: str, shapes: tuple[str, ...]) -> int:
        return len(sub(alg, shapes))

    acyc = ("linear", "star", "acyclic")
    cyc = ("cyclic", "complete")
    tree_pct = pct("treeopt", acyc)
    out.append(Claim("§4, Fig. 7.a", "TreeOpt generates an optimal plan for every acyclic "
                     "setting (linear, star, general acyclic)", tree_pct == 100.0,
                     f"{tree_pct:.2f}% of {count('treeopt', acyc)} settings"))
    for shape in ("linear", "star"):
        p = pct("fgreedy", (shape,))
        out.append(Claim("§3.3, Fig. 4.b", f"F-Greedy generates optimal plans for {shape} "
                         f"join graphs", p == 100.0,
                         f"{p:.2f}% of {count('fgreedy', (shape,))} settings"))
    for shape in ("acyclic", "cyclic", "complete"):
        p = pct("fgreedy", (shape,))
        out.append(Claim("§3.3, Fig. 4.b", f"F-Greedy generates sub-optimal plans for "
                         f"{SHAPE_LABEL[shape]} join graphs in many settings", p < 100.0,
                         f"optimal in {p:.2f}% ({100 - p:.2f}% sub-optimal)"))
    w = worst("fgreedy", ("acyclic",))
    out.append(Claim("§1.3, Fig. 4.c", "heuristics produce acyclic plans up to 5 fold more "
                     "expensive than the optimum", w >= 5.0,
                     f"worst F-Greedy ratio on general acyclic graphs {w:.2f}x"))
    w = worst("fgreedy", cyc)
    out.append(Claim("§1.3, Fig. 4.d", "on cyclic graphs heuristics produce plans up to 15 "
                     "fold more expensive than the optimum", w >= 15.0,
                     f"worst F-Greedy ratio on cyclic and complete graphs {w:.2f}x"))
    top = int(d["n"].max())
    first_n = int(d["n"].min())
    last = pct_at(d, "treeopt", cyc, top)
    first = pct_at(d, "treeopt", cyc, first_n)
    out.append(Claim("§4, Fig. 7.a", "on cyclic graphs TreeOpt's share of optimal plans "
                     "rapidly goes down towards zero as N grows", last <= 10.0 and last < first,
                     f"{first:.1f}% at N={first_n}, {last:.1f}% at N={top}"))
    s = sub("treeopt", cyc)
    q3 = float(s["ratio"].quantile(0.75))
    out.append(Claim("§4", "TreeOpt on cyclic graphs: the upper quartile of plans is about "
                     "2.5 fold more expensive than the optimum", 2.0 <= q3 <= 3.0,
                     f"75th-percentile ratio {q3:.2f}x"))
    w = worst("treeopt", cyc)
    out.append(Claim("§4, Fig. 7.c", "TreeOpt on cyclic graphs is sometimes 50 fold or worse",
                     w >= 50.0, f"worst TreeOpt ratio {w:.2f}x"))
    fg, to = pct("fgreedy", cyc), pct("treeopt", cyc)
    out.append(Claim("§4 summary", "on cyclic graphs F-Greedy outperforms TreeOpt",
                     fg > to, f"optimal: F-Greedy {fg:.1f}% vs TreeOpt {to:.1f}%"))
    per_shape = {sh: (pct("fab", (sh,)), pct("fgreedy", (sh,))) for sh in SHAPES
                 if count("fab", (sh,))}
    geq = all(a >= b for a, b in per_shape.values())
    strict = all(per_shape[sh][0] > per_shape[sh][1] for sh in cyc if sh in per_shape)
    out.append(Claim("§5, Fig. 9.b", "FAB finds optimal plans more often than F-Greedy for "
                     "the whole spectrum (strictly more on cyclic and complete graphs)",
                     geq and strict,
                     "; ".join(f"{sh} {a:.1f}% vs {b:.1f}%" for sh, (a, b) in
                               per_shape.items())))
    for sh in cyc:
        a, b = pct("fab", (sh,)), pct("treeopt", (sh,))
        out.append(Claim("§5, Fig. 9.b", f"FAB finds optimal plans more often than TreeOpt on "
                         f"{sh} graphs", a > b, f"FAB {a:.1f}% vs TreeOpt {b:.1f}%"))
    p = pct("fab", ("acyclic",))
    out.append(Claim("§5", "FAB does not guarantee optimal plans on acyclic graphs",
                     p < 100.0, f"FAB optimal in {p:.2f}% of general acyclic settings"))
    w = worst("fab", ("acyclic",))
    out.append(Claim("§5, Fig. 10.a", "FAB's acyclic plans are at most 1.25 fold more "
                     "expensive than the optimum", w <= 1.25,
                     f"worst FAB ratio on general acyclic graphs {w:.3f}x"))
    w = worst("fab", cyc)
    out.append(Claim("§5, Fig. 10.b", "FAB's cyclic plans are at most 2 fold more expensive "
                     "than the optimum", w <= 2.0,
                     f"worst FAB ratio on cyclic and complete graphs {w:.3f}x"))
    p = pct("qaware", acyc)
    qa_c = pct("qaware", cyc)
    out.append(Claim("§6, Table 2", "Q-Aware is optimal on acyclic graphs (TreeOpt) and "
                     "near-optimal on cyclic ones (FAB)", p == 100.0,
                     f"optimal in {p:.2f}% acyclic, {qa_c:.1f}% cyclic/complete settings; "
                     f"worst cyclic ratio {worst('qaware', cyc):.3f}x"))
    return out


def timing_claims(df: pd.DataFrame, objective: str) -> list[Claim]:
    t = mean_times(df[df["objective"] == objective])
    out = []
    if t.empty:  # no plan of this objective: nothing timed
        return out
    dm = t[t["algorithm"] == "dmjoin"].set_index("n")["mean_seconds"]
    if len(dm) >= 3:
        ns = np.array(dm.index, dtype=float)[-4:]
        ys = np.log(dm.values[-4:])
        growth = float(np.exp(np.polyfit(ns, ys, 1)[0]))
        # a polynomial O(n^3) algorithm grows by at most (N/(N-1))^3 per added stream
        poly = (ns[-1] / (ns[-1] - 1)) ** 3
        out.append(Claim("§3.3, Fig. 4.a", "DMJoin's plan-generation time is exponential in N",
                         growth > poly,
                         f"time grows {growth:.2f}x per added stream over N="
                         f"{int(ns[0])}..{int(ns[-1])} (an O(n^3) algorithm: at most "
                         f"{poly:.2f}x); {dm.iloc[-1] * 1e3:.1f} ms per plan at "
                         f"N={int(dm.index[-1])}"))
    top = int(t["n"].max())
    at = t[t["n"] == top].set_index("algorithm")["mean_seconds"]
    if "treeopt" in at and "fgreedy" in at:
        out.append(Claim("§4, Fig. 7.b", "TreeOpt generates plans faster than F-Greedy",
                         bool(at["treeopt"] < at["fgreedy"]),
                         f"N={top}: TreeOpt {at['treeopt'] * 1e3:.2f} ms vs F-Greedy "
                         f"{at['fgreedy'] * 1e3:.2f} ms per plan"))
    return out


def pct_at(d: pd.DataFrame, alg: str, shapes: tuple[str, ...], n: int) -> float:
    s = d[(d["algorithm"] == alg) & d["shape"].isin(shapes) & (d["n"] == n)]
    return float(s["optimal"].mean() * 100) if len(s) else math.nan


# ----- figures ---------------------------------------------------------------------------------

def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _time_panel(ax, times: pd.DataFrame, algorithms: tuple[str, ...], title: str) -> None:
    for alg in algorithms:
        t = times[times["algorithm"] == alg]
        if len(t):
            ax.plot(t["n"], t["mean_seconds"] * 1e3, marker="o", ms=3, label=LABEL[alg])
    ax.set_yscale("log")
    ax.set_xlabel("N (streams)")
    ax.set_ylabel("plan generation time per MJoin (ms)")
    ax.set_title(title)
    ax.legend(fontsize=8)


def _pct_panel(ax, pct: pd.DataFrame, alg: str, title: str) -> None:
    for shape in SHAPES:
        p = pct[(pct["algorithm"] == alg) & (pct["shape"] == shape)]
        if len(p):
            ax.plot(p["n"], p["pct_optimal"], marker="o", ms=3, label=SHAPE_LABEL[shape])
    ax.set_ylim(-3, 103)
    ax.set_xlabel("N (streams)")
    ax.set_ylabel("% of settings with an optimal plan")
    ax.set_title(title)
    if ax.get_legend_handles_labels()[0]:  # (none when no N is within --dmjoin-max)
        ax.legend(fontsize=8)


def _ratio_panel(ax, df: pd.DataFrame, alg: str, shapes: tuple[str, ...], title: str) -> None:
    d = df[(df["algorithm"] == alg) & df["shape"].isin(shapes) & df["optimum"].notna()]
    ns = sorted(d["n"].unique())
    data = [d[d["n"] == n]["ratio"].to_numpy() for n in ns]
    if data:
        ax.boxplot(data, positions=ns, widths=0.6, whis=(0, 100), showmeans=True)
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_yscale("log")
    ax.set_xlabel("N (streams)")
    ax.set_ylabel("plan cost / optimal plan cost (log; whiskers min–max)")
    ax.set_title(title)


def write_figures(df: pd.DataFrame, out: Path, objective: str, suffix: str) -> list[Path]:
    """Figures 4, 7, 9, 10 (PNG) and the data each plots (CSV); returns the PNG paths."""
    plt = _plt()
    d = df[df["objective"] == objective]
    pct = share_optimal(d)
    times = mean_times(d)
    quant = ratio_quantiles(d)
    what = "cost (Eq. 3)" if objective == "cost" else "intermediate tuples"
    written = []

    def save(fig, name: str, frames: list[pd.DataFrame]) -> None:
        fig.suptitle(f"join-ordering.txt Figure {name.removeprefix('figure')} — "
                     f"objective: {what}", fontsize=10)
        fig.tight_layout()
        path = out / f"{name}{suffix}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        pd.concat(frames, ignore_index=True).to_csv(out / f"{name}{suffix}.csv", index=False)
        written.append(path)

    def tag(frame: pd.DataFrame, panel: str) -> pd.DataFrame:
        frame = frame.copy()
        frame.insert(0, "panel", panel)
        return frame

    # Figure 4: F-Greedy vs DMJoin
    fig, ax = plt.subplots(2, 2, figsize=(11, 8))
    _time_panel(ax[0, 0], times, ("fgreedy", "dmjoin"), "(a) plan generation time")
    _pct_panel(ax[0, 1], pct, "fgreedy", "(b) % optimal plans by F-Greedy")
    _ratio_panel(ax[1, 0], d, "fgreedy", ("acyclic",), "(c) F-Greedy, general acyclic")
    _ratio_panel(ax[1, 1], d, "fgreedy", ("complete",), "(d) F-Greedy, complete")
    sel = quant["algorithm"] == "fgreedy"
    save(fig, "figure4", [
        tag(times[times["algorithm"].isin(["fgreedy", "dmjoin"])], "a"),
        tag(pct[pct["algorithm"] == "fgreedy"], "b"),
        tag(quant[sel & (quant["shape"] == "acyclic")], "c"),
        tag(quant[sel & (quant["shape"] == "complete")], "d")])

    # Figure 7: TreeOpt
    fig, ax = plt.subplots(1, 3, figsize=(15, 4.5))
    _pct_panel(ax[0], pct, "treeopt", "(a) % optimal plans by TreeOpt")
    _time_panel(ax[1], times, ("treeopt", "fgreedy", "dmjoin"), "(b) plan generation time")
    _ratio_panel(ax[2], d, "treeopt", ("cyclic", "complete"),
                 "(c) TreeOpt vs DMJoin, cyclic + complete")
    sel = quant["algorithm"] == "treeopt"
    save(fig, "figure7", [
        tag(pct[pct["algorithm"] == "treeopt"], "a"),
        tag(times[times["algorithm"].isin(["treeopt", "fgreedy", "dmjoin"])], "b"),
        tag(quant[sel & quant["shape"].isin(["cyclic", "complete"])], "c")])

    # Figure 9: FAB vs DMJoin
    fig, ax = plt.subplots(1, 2, figsize=(11, 4.5))
    _time_panel(ax[0], times, ("fab", "fgreedy", "treeopt", "qaware", "dmjoin"),
                "(a) plan generation time")
    _pct_panel(ax[1], pct, "fab", "(b) % optimal plans by FAB")
    save(fig, "figure9", [tag(times, "a"), tag(pct[pct["algorithm"] == "fab"], "b")])

    # Figure 10: FAB plan cost vs DMJoin
    fig, ax = plt.subplots(1, 2, figsize=(11, 4.5))
    _ratio_panel(ax[0], d, "fab", ("acyclic",), "(a) FAB vs DMJoin, general acyclic")
    _ratio_panel(ax[1], d, "fab", ("complete",), "(b) FAB vs DMJoin, complete")
    sel = quant["algorithm"] == "fab"
    save(fig, "figure10", [tag(quant[sel & (quant["shape"] == "acyclic")], "a"),
                           tag(quant[sel & (quant["shape"] == "complete")], "b")])
    return written


# ----- command line ----------------------------------------------------------------------------

def parse_ns(text: str) -> list[int]:
    """``3..20``, ``3-20``, ``5`` or ``3,5,8``."""
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        sep = ".." if ".." in part else ("-" if "-" in part[1:] else None)
        try:
            if sep:
                lo, hi = (int(x) for x in part.split(sep, 1))
                if hi < lo:
                    raise argparse.ArgumentTypeError(
                        f"the range {part!r} is empty ({lo} > {hi}; write {hi}{sep}{lo})")
                out.extend(range(lo, hi + 1))
            elif part:
                out.append(int(part))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{part!r} in {text!r} is not a whole number or a range such as 3..20"
            ) from None
    if not out or min(out) < 3:
        raise argparse.ArgumentTypeError(f"N must be 3 or more, got {text!r}")
    return sorted(set(out))


def settings_per_n(ns: list[int], requested: int | None,
                   schedule: tuple[tuple[int, int], ...]) -> dict[int, int]:
    """Settings per (N, shape): ``requested`` for every N when given, else the schedule."""
    if requested is not None:
        return {n: requested for n in ns}
    out = {}
    for n in ns:
        out[n] = next((k for top, k in schedule if n <= top), schedule[-1][1])
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m adaptcq.bench.ordering",
        description="Reproduce join-ordering.txt §3.3, Figures 4, 7, 9 and 10: DMJoin, "
                    "F-Greedy, TreeOpt, FAB and Q-Aware on random join graphs.")
    p.add_argument("--n", type=parse_ns, default=None,
                   help="numbers of streams, e.g. 3..20 (default 3..20; --quick: 3..8)")
    p.add_argument("--settings", type=positive_int, default=None,
                   help="random settings per N and shape (the paper: 500). Default: 500 for "
                        "N<=10, 150 for N<=14, 80 beyond (about 6 minutes on 2 idle cores); "
                        "--quick: 50")
    p.add_argument("--dmjoin-max", type=nonnegative_int, default=None,
                   help=f"largest N on which DMJoin runs (default 14, at most "
                        f"{DMJOIN_MAX_STREAMS}); above it no optimum is known")
    p.add_argument("--objective", choices=(*OBJECTIVES, "both"), default="both",
                   help="cost: Eq. 3; tuples: intermediate tuples (§3.1); both (default)")
    p.add_argument("--out", type=Path, default=Path("results/ordering"),
                   help="folder of the CSVs and PNGs (default results/ordering)")
    p.add_argument("--engine", choices=("spark", "local"), default="spark",
                   help="spark: a Spark batch job on local[cores] (default); local: a "
                        "process pool")
    p.add_argument("--cores", type=positive_int, default=2,
                   help="worker processes or Spark local[cores] (default 2)")
    p.add_argument("--seed", type=nonnegative_int, default=0,
                   help="seed of the random settings (default 0)")
    p.add_argument("--reanalyze", action="store_true",
                   help="do not evaluate: re-read --out/settings.csv and redo the tables, "
                        "claims and figures (only --out and --objective apply)")
    p.add_argument("--quick", action="store_true",
                   help="N 3..8, 50 settings per N and shape (under a minute)")
    return p


def evaluate_all(args: argparse.Namespace, console, settings: pd.DataFrame, dmjoin_max: int,
                 objectives: tuple[str, ...], out: Path) -> pd.DataFrame:
    """Run the sweep on the chosen engine; write and return the per-setting results."""
    engine = args.engine
    if engine == "spark":
        ok, why = java_available()
        if not ok:
            console.print(f"Spark unavailable ({why}); falling back to local multiprocessing")
            engine = "local"
        else:
            try:
                import pyspark  # noqa: F401
            except ImportError as exc:
                console.print(f"PySpark unavailable ({exc}); falling back to local "
                              f"multiprocessing")
                engine = "local"
    else:
        console.print("--engine local: evaluating with a local process pool")
    t0 = time.perf_counter()
    if engine == "spark":
        console.print(f"engine: Spark batch job, local[{args.cores}], mapInPandas "
                      f"(java: {java_available()[1]})")
        try:
            raw = run_spark(settings, args.seed, dmjoin_max, objectives, args.cores)
        except Exception as exc:  # noqa: BLE001 - report and fall back
            console.print(f"Spark job failed ({type(exc).__name__}: {exc}); falling back to "
                          f"local multiprocessing")
            raw = run_local(settings, args.seed, dmjoin_max, objectives, args.cores)
            engine = "local"
    else:
        raw = run_local(settings, args.seed, dmjoin_max, objectives, args.cores)
    wall = time.perf_counter() - t0
    df = with_optimum(raw.sort_values(["objective", "n", "shape", "index", "algorithm"])
                      .reset_index(drop=True))
    df.to_csv(out / "settings.csv", index=False)
    console.print(f"evaluated {len(settings)} settings in {wall:.1f} s ({engine})")

    return df


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.out.exists() and not args.out.is_dir():
        parser.error(f"--out {args.out}: a file, not a folder")
    if args.reanalyze:  # the sweep's parameters are those recorded in settings.csv
        refuse_unused(parser, ["n", "settings", "dmjoin_max", "engine", "cores", "seed",
                                     "quick"],
                      f"with --reanalyze (it re-reads {args.out / 'settings.csv'} as it is)", argv=argv)
        if not (args.out / "settings.csv").is_file():
            parser.error(f"--reanalyze: no {args.out / 'settings.csv'} to re-read (--out)")
    from rich.console import Console
    from rich.table import Table

    console = Console(width=140)
    ns = args.n or (list(range(3, 9)) if args.quick else list(range(3, 21)))
    schedule = QUICK_SCHEDULE if args.quick else DEFAULT_SCHEDULE
    per_n = settings_per_n(ns, args.settings, schedule)
    dmjoin_max = args.dmjoin_max if args.dmjoin_max is not None else 14
    if dmjoin_max > DMJOIN_MAX_STREAMS:
        console.print(f"--dmjoin-max {dmjoin_max} lowered to DMJoin's limit "
                      f"{DMJOIN_MAX_STREAMS}")
        dmjoin_max = DMJOIN_MAX_STREAMS
    objectives = OBJECTIVES if args.objective == "both" else (args.objective,)
    out: Path = args.out
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # (a file on the way, no permission)
        parser.error(f"--out {out}: cannot create the folder ({exc.strerror or exc})")

    if not args.reanalyze:
        settings = pd.DataFrame(
            [(n, shape, i) for n in ns for shape in SHAPES for i in range(per_n[n])],
            columns=["n", "shape", "index"])
        console.print(f"[bold]join-ordering.txt §3.3 sweep[/bold]: N = {ns[0]}..{ns[-1]}, "
                      f"shapes {', '.join(SHAPES)}, {len(settings)} settings, objective(s) "
                      f"{', '.join(objectives)}, seed {args.seed}")
        trimmed = sorted({k for k in per_n.values()})
        if len(trimmed) > 1 or (args.settings is None and trimmed[0] != 500):
            console.print("settings per N and shape: " + ", ".join(
                f"N={n}: {k}" for n, k in per_n.items()) + " (the paper uses 500; pass "
                "--settings 500 for the full run)")
        console.print(f"DMJoin (exponential) runs only for N <= {dmjoin_max}; optimality "
                      f"and cost ratios are measured there; above it only plan-generation "
                      f"time")

    if args.reanalyze:
        try:
            raw = read_settings(out / "settings.csv")
        except ValueError as exc:
            parser.error(f"--reanalyze: {exc}")
        present = tuple(o for o in OBJECTIVES if o in set(raw["objective"]))
        absent = [o for o in objectives if o not in present]
        if absent and (len(absent) == len(objectives)
                       or given(parser, argv, ["objective"])):
            # an objective asked for by name must be there; the default "both" reads
            # what the sweep ran (a sweep with --objective tuples has no cost rows)
            parser.error(f"--objective {args.objective}: {out / 'settings.csv'} holds no "
                         f"row of objective {', '.join(absent)} (only "
                         f"{', '.join(present) or 'none'}); give --objective "
                         f"{present[0] if len(present) == 1 else 'both'}")
        if absent:
            console.print(f"{out / 'settings.csv'} holds only objective "
                          f"{', '.join(present)}: analysing that")
            objectives = present
        raw = raw[raw["objective"].isin(objectives)]
        ns = sorted(int(n) for n in raw["n"].unique())
        dmjoin_ns = raw[raw["algorithm"] == "dmjoin"]["n"]
        dmjoin_max = int(dmjoin_ns.max()) if len(dmjoin_ns) else 0
        console.print(f"re-analysing {out / 'settings.csv'}: "
                      f"{len(raw.groupby(['n', 'shape', 'index']))} settings, N = "
                      f"{ns[0]}..{ns[-1]}, DMJoin up to N = {dmjoin_max}")
        df = with_optimum(raw.reset_index(drop=True))
    else:
        df = evaluate_all(args, console, settings, dmjoin_max, objectives, out)

    all_claims = []
    summary_rows = []
    for objective in objectives:
        suffix = "" if len(objectives) == 1 or objective == "cost" else f"_{objective}"
        pngs = write_figures(df, out, objective, suffix)
        d = df[(df["objective"] == objective) & df["optimum"].notna()]
        table = Table(title=f"objective = {objective} "
                      f"({'Eq. 3 CPU cost' if objective == 'cost' else 'intermediate tuples'})"
                      f", N <= {dmjoin_max} vs DMJoin")
        for col in ("shape", "algorithm", "% optimal", "median ratio", "75% ratio",
                    "max ratio", f"ms/plan N={ns[-1]}"):
            table.add_column(col, justify="right" if col not in ("shape", "algorithm")
                             else "left")
        times = mean_times(df[df["objective"] == objective])
        for shape in SHAPES:
            for alg in HEURISTICS:
                s = d[(d["shape"] == shape) & (d["algorithm"] == alg)]
                tt = times[(times["algorithm"] == alg) & (times["n"] == ns[-1])]
                row = {
                    "objective": objective, "shape": shape, "algorithm": alg,
                    "settings": len(s),
                    "pct_optimal": float(s["optimal"].mean() * 100) if len(s) else math.nan,
                    "median_ratio": float(s["ratio"].median()) if len(s) else math.nan,
                    "q3_ratio": float(s["ratio"].quantile(0.75)) if len(s) else math.nan,
                    "max_ratio": float(s["ratio"].max()) if len(s) else math.nan,
                    "ms_per_plan_largest_n": float(tt["mean_seconds"].mean() * 1e3)
                    if len(tt) else math.nan,
                }
                summary_rows.append(row)
                table.add_row(SHAPE_LABEL[shape], LABEL[alg], f"{row['pct_optimal']:.1f}",
                              f"{row['median_ratio']:.3f}", f"{row['q3_ratio']:.3f}",
                              f"{row['max_ratio']:.2f}", f"{row['ms_per_plan_largest_n']:.2f}")
        console.print(table)
        cl = claims(df, objective) + timing_claims(df, objective)
        console.print(f"[bold]The paper's claims (objective {objective}):[/bold]")
        for c in cl:
            colour = {"CONFIRMED": "green", "NOT CONFIRMED": "red"}.get(c.verdict, "yellow")
            console.print(f"  [{colour}]{c.verdict:>13}[/{colour}]  {c.section}: {c.text} — "
                          f"{c.measured}", highlight=False)
            all_claims.append({"objective": objective, "section": c.section, "claim": c.text,
                               "verdict": c.verdict, "measured": c.measured})
        console.print("figures: " + ", ".join(str(p) for p in pngs))
    pd.DataFrame(summary_rows).to_csv(out / "summary.csv", index=False)
    pd.DataFrame(all_claims).to_csv(out / "claims.csv", index=False)
    console.print(f"wrote {out}/settings.csv, summary.csv, claims.csv and figure CSV/PNGs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
