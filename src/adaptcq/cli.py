"""Command line: ``adaptcq run``, ``adaptcq workload``, ``adaptcq bench``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from adaptcq.errors import AdaptcqError


def _sql_arg(text: str) -> str:
    if text.startswith("@"):
        path = Path(text[1:])
        if not path.exists():
            raise AdaptcqError(f"query file {str(path)!r} does not exist")
        return path.read_text()
    return text


def _inputs(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise AdaptcqError(f"--input {item!r}: expected NAME=PATH, e.g. --input R=r.parquet")
        if name in out:
            raise AdaptcqError(f"--input {name} is given twice")
        out[name] = path
    return out


def _orders(items: list[str]) -> dict[str, list[str]]:
    out = {}
    for item in items:
        stream, sep, rest = item.partition(":")
        if not sep or not stream or not rest:
            raise AdaptcqError(f"--order {item!r}: expected STREAM:S2,S3,..., e.g. --order R:S,T")
        out[stream] = [s.strip() for s in rest.split(",") if s.strip()]
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="adaptcq", description=(
        "Adaptive continuous queries over multi-way stream joins. "
        "With no command, runs the embedded default (same as `adaptcq run`)."))
    sub = p.add_subparsers(dest="command")

    r = sub.add_parser("run", help="run a continuous query (the embedded default without --sql)")
    r.add_argument("--sql", help="the CQL query text, or @FILE to read it from a file")
    r.add_argument("--input", action="append", default=[], metavar="NAME=PATH",
                   help="a stream's input file (Parquet or CSV); repeat for each stream")
    r.add_argument("--timestamp", default="ts", help="the timestamp column (default: ts)")
    r.add_argument("--executor", default="mjoin", choices=["mjoin", "xjoin", "acaching"],
                   help="acaching: MJoin with adaptive join-subresult caches (A-Caching)")
    r.add_argument("--caches", default="prefix", choices=["prefix", "global"],
                   help="A-Caching candidates: prefix-invariant only, or also the "
                   "globally-consistent ones (a-caching.txt §6)")
    r.add_argument("--cache-memory", type=int, metavar="BYTES",
                   help="A-Caching memory budget for caches (default: unlimited)")
    r.add_argument("--reopt-interval", type=int, default=10_000, metavar="TUPLES",
                   help="A-Caching re-optimization interval I in tuples (default 10,000)")
    r.add_argument("--mode", default="append", choices=["append", "retract"])
    r.add_argument("--output", help="write the result rows to this Parquet file")
    r.add_argument("--rejected", help="write rejected input rows to this Parquet file "
                   "(default: OUTPUT with .rejected.parquet when there are any)")
    r.add_argument("--order", action="append", default=[], metavar="STREAM:S2,S3,...",
                   help="fix STREAM's MJoin pipeline order")
    r.add_argument("--tree", help="XJoin tree, e.g. '((R,S),T)' (default: left-deep)")
    r.add_argument("--nested-loop", action="append", default=[], metavar="STREAM[.COLUMN]",
                   help="MJoin: joins into STREAM (or probing its COLUMN) scan its window "
                   "instead of a hash index (a-caching.txt Figure 10)")
    r.add_argument("--sign", help="column holding +1/-1 (explicit deletions; unbounded streams)")
    r.add_argument("--allowed-lateness", type=float, default=0.0, metavar="SECONDS",
                   help="rows later than this behind their stream's newest row are rejected")
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    r.add_argument("--optimizer", choices=["dmjoin", "fgreedy", "treeopt", "fab", "qaware"],
                   help="choose the MJoin's plan with this ordering algorithm "
                   "(join-ordering.txt) once online statistics are warm")
    r.add_argument("--reorder", choices=["agreedy", "off"], default="off",
                   help="adaptive re-ordering at run time: A-Greedy (a-caching.txt §4, [5])")
    r.add_argument("--engine", default="local", choices=["local", "spark"],
                   help="local: this process; spark: a partitioned Structured Streaming job")
    r.add_argument("--master", default="local[*]", help="Spark master (with --engine spark)")
    r.add_argument("--partitions", type=int, default=None,
                   help="number of partition groups P (with --engine spark; default: cores)")
    r.add_argument("--checkpoint", help="Spark checkpoint folder: a restarted run continues "
                   "exactly from it (with --engine spark)")

    w = sub.add_parser("workload", help="write one of the papers' synthetic workloads to Parquet")
    w.add_argument("name", help="three-way, nway, table2 or default")
    w.add_argument("--out", required=True, help="output folder")
    w.add_argument("--seed", type=int, default=0)
    w.add_argument("--n-updates", type=int, help="number of arrivals over all streams")
    w.add_argument("--point", default="D1", help="Table 2 point for `table2` (D1..D8)")
    w.add_argument("--r", type=int, help="multiplicity r of T for `three-way`")

    e = sub.add_parser("explain", help="show the join graph, each ordering algorithm's "
                       "pipelines and costs, and Q-Aware's choice")
    from adaptcq.explain import add_arguments as add_explain_arguments
    add_explain_arguments(e)

    b = sub.add_parser("bench", help="benchmarks (write CSV/PNG, print figures)")
    b.add_argument("name", help="mjoin-xjoin")
    b.add_argument("args", nargs=argparse.REMAINDER)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    args = parser.parse_args(argv or ["run"])
    try:
        if args.command == "run":
            return cmd_run(args)
        if args.command == "workload":
            return cmd_workload(args)
        if args.command == "bench":
            return cmd_bench(args)
        if args.command == "explain":
            from adaptcq.explain import main as explain_main
            return explain_main(args)
    except AdaptcqError as e:
        print(f"adaptcq: error: {e}", file=sys.stderr)
        return 1
    parser.print_help()
    return 2


def cmd_run(args) -> int:
    from rich.console import Console

    from adaptcq.runtime.local import execute, prepare

    console = Console(stderr=False)
    options = {}
    if args.order:
        if args.executor not in ("mjoin", "acaching"):
            raise AdaptcqError("--order sets MJoin pipelines; use --tree with --executor xjoin")
        options["orders"] = _orders(args.order)
    if args.nested_loop:
        if args.executor not in ("mjoin", "acaching"):
            raise AdaptcqError("--nested-loop is for --executor mjoin or acaching")
        options["nested_loop"] = args.nested_loop
    if args.executor == "acaching":
        options["cache_options"] = {"caches": args.caches, "memory": args.cache_memory,
                                    "reopt_interval": args.reopt_interval}
    elif args.cache_memory is not None or args.caches != "prefix":
        raise AdaptcqError("--caches and --cache-memory need --executor acaching")
    if args.optimizer or args.reorder != "off":
        if args.executor not in ("mjoin", "acaching"):
            raise AdaptcqError("--optimizer and --reorder order MJoin pipelines; "
                               "use them with --executor mjoin")
        from adaptcq.adapt.reorder import make_policies
        options["policies"] = make_policies(optimizer=args.optimizer, reorder=args.reorder)
    if args.tree:
        if args.executor != "xjoin":
            raise AdaptcqError("--tree is for --executor xjoin")
        from adaptcq.engine.xjoin import parse_tree
        try:
            options["tree"] = parse_tree(args.tree)
        except ValueError as e:
            raise AdaptcqError(str(e)) from None
    if args.sql is None:
        if args.input:
            raise AdaptcqError("--input needs --sql (without both, the embedded default runs)")
        from adaptcq.stream.workloads import default_workload
        wl = default_workload()
        sql, sources, timestamp = wl.sql, wl.tables, wl.timestamp
        console.print(f"[bold]adaptcq[/] embedded default: {wl.name}")
    else:
        sql, sources, timestamp = _sql_arg(args.sql), _inputs(args.input), args.timestamp
        if not sources:
            raise AdaptcqError("--sql needs an --input NAME=PATH for each stream")
    console.print(f"query: {' '.join(sql.split())}")
    if args.engine == "spark":
        from adaptcq.runtime.spark import run_cli
        return run_cli(args, sql, sources, timestamp, options, console)
    if args.checkpoint or args.partitions:
        raise AdaptcqError("--checkpoint and --partitions need --engine spark")
    prepared = prepare(sql, sources, timestamp, args.sign, args.allowed_lateness)
    try:
        result = _execute_with_progress(execute, prepared, args, options, console)
    except ValueError as e:
        raise AdaptcqError(str(e)) from None
    _write_outputs(result, args, console)
    console.print(summary_table(result))
    return 0


def _execute_with_progress(execute, prepared, args, options, console):
    if args.no_progress or not console.is_terminal and not sys.stderr.isatty():
        return execute(prepared, args.executor, args.mode, **options)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn
    with Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
                  TimeRemainingColumn(), console=console, transient=True) as bar:
        task = bar.add_task(f"{args.executor} ({args.mode})", total=len(prepared.rows))
        return execute(prepared, args.executor, args.mode,
                       progress=lambda done, total: bar.update(task, completed=done), **options)


def _write_outputs(result, args, console) -> None:
    import pyarrow.parquet as pq
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(result.table, args.output)
        console.print(f"wrote {result.table.num_rows} result rows to {args.output}")
    rejected_path = args.rejected or (
        str(Path(args.output).with_suffix(".rejected.parquet"))
        if args.output and result.rejected.num_rows else None)
    if rejected_path:
        pq.write_table(result.rejected, rejected_path)
        console.print(f"wrote {result.rejected.num_rows} rejected rows to {rejected_path}")


def summary_table(result):
    from rich.table import Table

    s = result.stats
    t = Table(title="run summary", show_header=False)
    t.add_column("what")
    t.add_column("value", justify="right")
    t.add_row("executor / mode", f"{s['executor']} / {s['mode']}")
    t.add_row("plan", result.plan)
    t.add_row("input rows (arrivals)", f"{s['arrivals']:,}")
    t.add_row("updates processed (ΔR insertions + deletions)", f"{s['updates']:,}")
    t.add_row("rows dropped by selections", f"{s['filtered']:,}")
    t.add_row("results", f"{s['results']:,}")
    t.add_row("engine CPU seconds", f"{s['cpu_seconds']:.3f}")
    t.add_row("throughput (updates per CPU-second)", f"{s['throughput']:,.0f}")
    t.add_row("peak state (tuples)", f"{s['peak_state_tuples']:,}")
    t.add_row("peak state (bytes)", f"{s['peak_state_bytes']:,}")
    t.add_row("rejected rows", f"{s['rejected']:,}")
    for key, value in s.items():  # what the adaptive policies report
        if key in _CORE or key == "cache_history":
            continue
        if isinstance(value, list):
            value = "\n".join(map(str, value)) or "none"
        elif isinstance(value, float):
            value = f"{value:,.4g}"
        elif isinstance(value, int):
            value = f"{value:,}"
        t.add_row(key.replace("_", " "), str(value))
    if s.get("cache_history"):
        changes = [h for h in s["cache_history"]
                   if h["event"] in ("use", "drop", "shrink", "grow")]
        t.add_row("cache changes over time", "\n".join(
            f"at arrival {h['arrival']:,}: {h['event']} {h['what']}" for h in changes[-8:])
            or "none")
    return t


_CORE = {"executor", "mode", "arrivals", "updates", "insertions", "deletions", "filtered",
         "results", "rejected", "cpu_seconds", "load_cpu_seconds", "throughput",
         "peak_state_tuples", "peak_state_bytes"}


def cmd_workload(args) -> int:
    from adaptcq.stream.workloads import WORKLOADS, write_workload

    if args.name not in WORKLOADS:
        raise AdaptcqError(f"unknown workload {args.name!r}; choose one of {', '.join(WORKLOADS)}")
    kwargs = {"seed": args.seed}
    if args.n_updates:
        kwargs["n_updates"] = args.n_updates
    if args.name == "table2":
        kwargs["name"] = args.point
    if args.r and args.name == "three-way":
        kwargs["r"] = args.r
    wl = WORKLOADS[args.name](**kwargs)
    paths = write_workload(wl, args.out)
    for name, path in paths.items():
        print(f"{name}: {path}")
    print(f"query: {wl.sql}")
    return 0


def cmd_bench(args) -> int:
    if args.name == "mjoin-xjoin":
        from adaptcq.bench.mjoin_xjoin import main as bench_main
        return bench_main(args.args)
    raise AdaptcqError(f"unknown benchmark {args.name!r}; choose mjoin-xjoin")


if __name__ == "__main__":
    sys.exit(main())
