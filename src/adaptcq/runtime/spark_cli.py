"""``adaptcq run --engine spark``: the command line's driver of the Spark runtime.

Checks the options (each works on Spark or is refused with a reason, none is ignored),
turns in-memory inputs into Parquet, runs ``runtime.spark.prepare_files(...).run(spark)``
and prints the run summary, with one line per partition group saying what its adaptive
policies decided (docs/spark.md, "Adaptivity"). The Spark runtime itself
(``runtime.spark``) knows nothing of the command line.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import tempfile
import warnings
from collections.abc import Mapping
from pathlib import Path

from adaptcq.cliargs import adaptivity_spec, run_defaults
from adaptcq.errors import AdaptcqError
from adaptcq.plain import say
from adaptcq.runtime.local import check_sign_column
from adaptcq.runtime.spark import SparkRun, SplitWarning, check_run_options, prepare_files

__all__ = ["cleanup_cli", "refuse_unsupported", "run_cli", "summary"]

_REFUSED = {
    "max_results": ("the Spark runtime writes results a micro-batch at a time from P "
                    "partition groups, so it has no first N results to stop at; use --engine "
                    "local"),
    "spill_dir": ("on Spark every partition group spills into its own folder inside the "
                  "checkpoint (--checkpoint), versioned with it; give --checkpoint instead"),
}
# Options the Spark path uses (or, --no-progress, that have nothing to turn off there).
_HANDLED = {"command", "help", "sql", "input", "timestamp", "timestamp_unit", "executor",
            "mode", "output", "rejected", "order", "tree", "nested_loop", "sign",
            "allowed_lateness", "no_progress", "engine", "master", "partitions", "checkpoint",
            "format", "summary_json", "optimizer", "reorder", "caches", "cache_memory",
            "reopt_interval", "no_cache_verify", "shed", "capacity", "basic_window", "index", "buffer",
            "no_join_direction", "utility", "trigger", "max_files_per_trigger", "spill",
            "memory", "spill_partitions", "spill_fraction", "spill_check", "spill_sample",
            "cleanup", "shares"}


def refuse_unsupported(args) -> None:
    """Every ``adaptcq run`` option works on Spark or is refused with a reason: none is
    ignored."""
    from adaptcq.runtime.output import file_suffix
    fmt = getattr(args, "format", None)
    if getattr(args, "output", None) == "-":
        raise AdaptcqError("--output - (stdout) is not supported with --engine spark: its "
                           "output is a folder of Parquet files, one per micro-batch; give a "
                           "folder, or use --engine local")
    suffix = file_suffix(args.output) if getattr(args, "output", None) else None
    if suffix and suffix not in (".parquet", ".pq"):
        # (a folder named o.csv holding Parquet files; out.parquet/ is Spark's own habit)
        raise AdaptcqError(f"--output {args.output!r}: --engine spark writes a folder of "
                           f"Parquet files, one per micro-batch, not a {suffix} file; give "
                           "--output a folder name")
    if fmt not in (None, "parquet"):
        raise AdaptcqError(f"--format {fmt} is not supported with --engine spark: its output "
                           "is a folder of Parquet files, one per micro-batch (convert it "
                           "afterwards, or use --engine local)")
    for dest, (flag, default) in run_defaults().items():
        if dest in _HANDLED or not hasattr(args, dest):
            continue
        if dest == "seed" and getattr(args, "shed", None):
            continue  # the load-shedding join's sampling and random drops
        value = getattr(args, dest)
        if value == default or value is None or value is False or value == []:
            continue
        # (a repeatable flag's list as the flags typed, not a Python list)
        shown = (flag if isinstance(value, bool) else
                 " ".join(f"{flag} {v}" for v in value) if isinstance(value, list | tuple)
                 else f"{flag} {value}")
        reason = _REFUSED.get(dest, "the Spark runtime does not implement it; use --engine "
                                    "local")
        raise AdaptcqError(f"{shown} is not supported with --engine spark yet: {reason}")


def run_cli(args, sql: str, sources: Mapping[str, object], timestamp: str, options: dict,
            console) -> int:
    """``adaptcq run --engine spark``: the query on Spark, files in, Parquet out, a summary.
    ``options`` are the plan options (``--order``, ``--nested-loop``, ``--tree``); the
    adaptive policies come from ``--optimizer``, ``--reorder`` and ``--executor acaching``
    (``cliargs.adaptivity_spec``) and run in every partition group."""
    from adaptcq.runtime.spark_session import check_master, get_spark, local_cores

    refuse_unsupported(args)
    for flag in ("batch_rows", "batch_seconds"):
        if flag in options:
            raise AdaptcqError(f"--{flag.replace('_', '-')} is not for --engine spark: a "
                               "partition group's batch is what its micro-batch releases "
                               "(docs/vector.md, On Spark)")
    unknown = sorted(set(options) - {"orders", "tree", "nested_loop", "ordering", "shed",
                                     "spill"})
    if unknown:  # the CLI builds no others for Spark: a programming error if it does
        raise AdaptcqError(f"engine option {unknown[0]} is not supported with --engine spark")
    if (options.get("spill") or {}).get("cleanup") == "off" and not args.checkpoint:
        raise AdaptcqError("--cleanup off on Spark leaves the held-back results in the "
                           "checkpoint for `adaptcq cleanup CHECKPOINT`: give --checkpoint "
                           "(without it the checkpoint is a temporary folder)")
    # before Spark starts (the run checks them again), and before --shed reads --trigger
    check_run_options(args.max_files_per_trigger, args.trigger)
    check_sign_column(args.sign, timestamp)
    shed = options.get("shed")
    if shed is not None:  # refused here, before Spark starts (the run checks them again)
        from adaptcq.runtime.shed import spark_shed_spec
        wall = shed.get("capacity") == "wall" and args.trigger is not None
        spark_shed_spec({**shed, "interval": args.trigger} if wall else shed, 1, 1)
        if args.executor not in ("auto", "shed"):
            raise AdaptcqError(f"the load-shedding options are for the load-shedding join "
                               f"(--executor shed), not {args.executor}")
    # --optimizer with the vectorized executor is its per-batch ordering (no policy); if
    # auto falls back to MJoin, continuous_query makes it the groups' optimizer policy
    adaptivity = None if "ordering" in options else adaptivity_spec(args)
    executor = "mjoin" if args.executor == "acaching" else args.executor
    master = getattr(args, "master", None) or "local[*]"
    check_master(master)
    partitions = getattr(args, "partitions", None)
    from adaptcq.cliargs import check_partitions, parse_shares
    check_partitions(partitions)
    shares = parse_shares(getattr(args, "shares", None) or [])
    if shares and partitions == 1 and math.prod(shares.values()) != 1:
        # (prepare_files takes 1 as "no --partitions given": an explicit 1 is checked here)
        raise AdaptcqError(f"--shares make {math.prod(shares.values())} partition groups, "
                           "but --partitions is 1; give one or make them agree")
    # (with --shares their product is P: prepare_files takes 1 as "no --partitions given")
    partitions = partitions or (1 if shares else local_cores(master))
    unit = getattr(args, "timestamp_unit", None)
    output = (args.output.rstrip("/") or "/") if args.output else None
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="adaptcq-spark-")))
        paths = {}
        for name, src in sources.items():
            if isinstance(src, str | os.PathLike):
                paths[name] = str(src)
            else:  # an in-memory table (the embedded default): stream it from Parquet
                import pyarrow as pa
                import pyarrow.parquet as pq
                table = src if isinstance(src, pa.Table) else pa.Table.from_pandas(
                    src, preserve_index=False)
                d = tmp / "inputs" / name
                d.mkdir(parents=True)
                pq.write_table(table, d / "part-0.parquet", coerce_timestamps="us",
                               allow_truncated_timestamps=False)
                paths[name] = str(d)
        checkpoint = args.checkpoint or str(tmp / "checkpoint")
        # (as --output: a trailing '/' would be printed twice, "rej//")
        rejected = (args.rejected.rstrip("/") or "/") if args.rejected else \
            (f"{output}.rejected" if output else None)
        job = prepare_files(sql, paths, checkpoint, output, rejected, timestamp,
                            executor, args.mode, partitions, args.allowed_lateness,
                            args.sign, unit, adaptivity=adaptivity, shares=shares or None,
                            **options)
        spark = get_spark(master, "adaptcq run")
        with _quiet(spark), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", SplitWarning)
            run = job.run(spark, max_files_per_trigger=args.max_files_per_trigger,
                          trigger=args.trigger)
        for w in caught:
            if issubclass(w.category, SplitWarning):
                say(console, ("warning:", "yellow"), f" {w.message}")
    if output:
        console.print(f"wrote {run.results:,} result rows to {output}/ (Parquet)",
                      highlight=False)
    if run.rejected and rejected:
        console.print(f"wrote {run.rejected:,} rejected rows to {rejected}/ (Parquet)",
                      highlight=False)
    console.print(summary_table(run, args, master))
    if run.spill is not None and run.spill["complete_until"] is not None and args.checkpoint:
        console.print(f"results the spills hold back are on disk: `adaptcq cleanup "
                      f"{args.checkpoint}` produces them", highlight=False)
    if run.adaptivity is not None:
        console.print(decisions_table(run))
    if getattr(args, "summary_json", None):
        _write_summary_json(args.summary_json, run, args.executor, args.mode, master)
    return 0


def cleanup_cli(args, console) -> int:
    """``adaptcq cleanup CHECKPOINT``: the results a spilling Spark run holds back
    (``--cleanup off``, or a run stopped before the end of its input), produced by the query
    restarted from its checkpoint (``runtime.spark.cleanup_checkpoint``) and appended to
    its own output folder."""
    from adaptcq.runtime.spark import prepare_cleanup
    from adaptcq.runtime.spark_session import check_master, get_spark

    if args.format not in (None, "parquet"):
        raise AdaptcqError(f"--format {args.format}: a Spark run's output is a folder of "
                           "Parquet files, and its late results join them there")
    job = prepare_cleanup(args.folder)
    if args.output is not None and (
            job.output is None or os.path.realpath(args.output) != os.path.realpath(job.output)):
        raise AdaptcqError(f"--output {args.output}: the late results of checkpoint "
                           f"{args.folder} go to its run's own output folder "
                           f"({job.output or 'none: the run wrote no output'}), where a "
                           "restart appends; leave --output out, or give that folder")
    master = args.master or "local[*]"
    check_master(master)
    spark = get_spark(master, "adaptcq cleanup")
    with _quiet(spark):
        run = job.run(spark, finish=False, cleanup=True)
    where = f" to {job.output}/ (Parquet)" if job.output else ""
    console.print(f"wrote {run.results:,} result rows{where}: the late results the "
                  "checkpoint's spills held back (and the results of any new input)",
                  highlight=False)
    shown = argparse.Namespace(executor=job.executor, mode=job.mode,
                               checkpoint=args.folder)
    console.print(summary_table(run, shown, master))
    return 0


@contextlib.contextmanager
def _quiet(spark):
    """Spark's and py4j's logs off while a job runs: failures are reported as one line
    (AdaptcqError); Spark's own log of them would be hundreds of lines of JVM and Python
    stack traces (py4j logs a failed foreachBatch call with its traceback, too)."""
    spark.sparkContext.setLogLevel("OFF")
    py4j_log = logging.getLogger("py4j")
    level = py4j_log.level
    py4j_log.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        spark.sparkContext.setLogLevel("ERROR")
        py4j_log.setLevel(level)


def summary_table(run: SparkRun, args, master: str):
    from rich.table import Table

    t = Table(title="run summary (Spark)", show_header=False)
    t.add_column("what")
    t.add_column("value", justify="right")
    t.add_row("executor / mode", f"{run.executor or args.executor} / {args.mode}")
    t.add_row("master / partition groups", f"{master} / {len(run.groups)}")
    t.add_row("checkpoint", ("continued from " if run.restarted else "new: ")
              + (args.checkpoint or "(temporary)"))
    t.add_row("micro-batches", f"{run.batches:,}")
    t.add_row("input rows", f"{run.rows_in:,}")
    if run.shares:
        t.add_row("shares", ", ".join(f"{k}: {v}" for k, v in run.shares.items()))
        t.add_row("rows shipped (replication)", f"{run.shipped:,} ({run.replication:.2f}x)")
    t.add_row("updates processed (ΔR insertions + deletions, all groups)", f"{run.updates:,}")
    if run.restarted:
        t.add_row("updates processed, totals of every run of this checkpoint",
                  f"{run.updates_total:,}")
    live, caught, rebuilt = _group_starts(run)
    t.add_row("group micro-batches: live copy / caught up / new or rebuilt",
              f"{live:,} / {caught:,} / {rebuilt:,}")
    t.add_row("results", f"{run.results:,}")
    t.add_row("wall seconds (streaming query)", f"{run.wall_seconds:.2f}")
    t.add_row("throughput (input rows per second)",
              f"{run.rows_in / run.wall_seconds:,.0f}" if run.wall_seconds else "-")
    t.add_row("peak state, summed over groups (tuples)", f"{run.peak_state_tuples:,}")
    t.add_row("peak state, summed over groups (bytes)", f"{run.peak_state_bytes:,}")
    t.add_row("rejected rows", f"{run.rejected:,}")
    spill = run.spill
    if spill is not None:
        # The groups keep their spill counters in the checkpoint's state: after a restart
        # (or `adaptcq cleanup`) they are the checkpoint's totals, not this run's.
        if run.restarted:
            t.add_row("spill figures below", "totals of every run of this checkpoint")
        t.add_row("spill strategy / budget (each group's share)",
                  f"{spill['strategy']} / {spill['memory']:,} B ({spill['budget']:,} B)")
        t.add_row("spills (events / partition groups)",
                  f"{spill['spills']:,} / {spill['partition_groups_spilled']:,}")
        t.add_row("spilled (model bytes / bytes on disk)",
                  f"{spill['spilled_bytes_model']:,} / {spill['spill_file_bytes']:,}")
        t.add_row("clean-ups (CPU seconds; at the end of input)",
                  f"{spill['cleanups']:,} ({spill['cleanup_cpu_seconds']:.2f}; "
                  f"{spill['end_cleanup_cpu_seconds']:.2f})")
        if spill["cleanup_writebacks"]:
            t.add_row("partition groups written back by clean-ups",
                      f"{spill['cleanup_writebacks']:,}")
        t.add_row("late results (produced by clean-ups)", f"{spill['late_results']:,}")
        if spill["complete_until"] is not None:
            t.add_row("output complete before (event time, ns; exclusive)",
                      f"{spill['complete_until']:,}")
    if run.adaptivity is not None:
        t.add_row("adaptive policies (in every group)", describe_adaptivity(run.adaptivity))
    shed = run.shedding
    if shed is not None:
        lo, hi = shed["estimated_lost_interval"]
        t.add_row("load shedding (in every group)", shed["shed"])
        t.add_row("r per group (final; lowest of any group)",
                  ", ".join(f"{r:g}" for r in shed["fraction_r"].values())
                  + f"; {shed['fraction_r_min']:g}")
        t.add_row("dropped arrivals", ", ".join(f"{a}: {n:,}"
                                                for a, n in shed["buffer_drops"].items()))
        t.add_row("estimated results lost (95% interval)",
                  f"{shed['estimated_lost']:.1%} ({lo:.1%} – {hi:.1%})")
    return t


def describe_adaptivity(spec: Mapping) -> str:
    parts = []
    if spec.get("optimizer"):
        parts.append(f"initial plan by {spec['optimizer']}")
    if spec.get("reorder") not in (None, "off"):
        parts.append(f"re-ordering by {spec['reorder']}")
    if spec.get("caching") is not None:
        opts = ", ".join(f"{k} {v}" for k, v in spec["caching"].items() if v is not None)
        parts.append("A-Caching" + (f" ({opts})" if opts else ""))
    return "; ".join(parts) or "none"


def _entries(report: Mapping, skip_empty: bool = False) -> list[str]:
    items = []
    for key, value in report.items():
        if skip_empty and value in (0, 0.0, "", None, [], {}):
            continue
        if isinstance(value, list):
            value = ", ".join(map(str, value)) or "none"
        elif isinstance(value, float):
            value = f"{value:,.4g}"
        elif isinstance(value, int) and not isinstance(value, bool):
            value = f"{value:,}"
        if value in ("", None):
            continue
        items.append(f"{key.replace('_', ' ')}: {value}")
    return items


def group_decisions(info: Mapping) -> str:
    """One group's policies' decisions, readable: their ``report()`` entries, and what the
    policies restarted by a restore from the state store (A-Caching) had decided."""
    items = _entries(info.get("policies") or {})
    restores = info.get("policy_restores") or 0
    if restores:
        continued = info.get("policy_continued") or 0
        items.append(f"restored from the state store {restores:,} time(s): orders kept; "
                     f"profiler and ordering policies continued {continued:,} time(s), "
                     f"restarted {restores - continued:,}"
                     + ("; A-Caching restarted each time"
                        if "cache_selections" in (info.get("policies") or {}) else ""))
        earlier = info.get("restarted_policies") or []
        if earlier:
            before = _entries(earlier[-1], skip_empty=True)
            items.append("before the last restart: " + (", ".join(before) or "no decision"))
    return "; ".join(items) or "no decision"


def decisions_table(run: SparkRun):
    from rich.table import Table

    t = Table(title="adaptive decisions per partition group (each on its own data)")
    t.add_column("group", justify="right")
    t.add_column("updates", justify="right")
    t.add_column("plan now")
    t.add_column("decisions")
    for k in sorted(run.groups):
        info = run.groups[k]
        t.add_row(str(k), f"{info['updates']:,}", info.get("plan", ""), group_decisions(info))
    return t


def _group_starts(run: SparkRun) -> tuple[int, int, int]:
    """How the groups' micro-batches found their engine: the live copy in the worker, a
    stale copy caught up from the stored changes, or one rebuilt from them (or new)."""
    return run.live_copies, run.caught_up, run.group_batches - run.live_copies - run.caught_up


def summary(run: SparkRun) -> dict:
    """A run's figures (what the CLI's summary shows, plus each group's latest statistics:
    its plan and, with adaptive policies, their reports under ``policies``)."""
    return {
        "engine": "spark", "batches": run.batches, "input_rows": run.rows_in,
        "updates": run.updates, "updates_total": run.updates_total,
        "results": run.results, "rejected": run.rejected,
        "wall_seconds": run.wall_seconds,
        "throughput": run.rows_in / run.wall_seconds if run.wall_seconds else None,
        "peak_state_tuples": run.peak_state_tuples, "peak_state_bytes": run.peak_state_bytes,
        "partition_groups": len(run.groups), "split": run.split, "rows_shipped": run.shipped,
        "replication": run.replication,
        "group_batches": dict(zip(("live_copy", "caught_up", "rebuilt"), _group_starts(run),
                                  strict=True)),
        "checkpoint": run.checkpoint,
        "restarted": run.restarted, "output": run.output, "adaptivity": run.adaptivity,
        "shedding": run.shedding, "spill": run.spill,
        "groups": [run.groups[k] for k in sorted(run.groups)]}


def _write_summary_json(path: str, run: SparkRun, executor: str, mode: str,
                        master: str) -> None:
    from adaptcq.runtime.output import summary_json
    from adaptcq.runtime.spark import _write_text
    # What every group ran (auto resolved), as the local summary and the table say.
    doc = {"executor": run.executor or executor, "mode": mode, "master": master,
           **summary(run)}
    try:
        _write_text(Path(path), summary_json(doc) + "\n")
    except OSError as e:
        raise AdaptcqError(f"--summary-json {path!r}: cannot write: {e.strerror or e}") \
            from None
