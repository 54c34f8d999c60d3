"""Command line: ``adaptcq run``, ``adaptcq workload``, ``adaptcq bench``."""

from __future__ import annotations

import os
import signal
import sys


def _stop_while_starting() -> bool:
    """In the ``adaptcq`` command (its entry-point script is ``__main__``; not a program
    that imports this module), Ctrl-C or SIGTERM while this module is still imported, before
    main() handles them: one line and exit code 128 + the signal's number, at once (nothing
    has been written yet), not a KeyboardInterrupt traceback. True if installed."""
    script = getattr(sys.modules.get("__main__"), "__file__", None) or ""
    # (``python -m adaptcq`` runs adaptcq/__main__.py: the same command)
    module_run = os.path.basename(script) == "__main__.py" and \
        os.path.basename(os.path.dirname(script)) == "adaptcq"
    if os.path.basename(script) != "adaptcq" and not module_run:
        return False

    def stop(signum, frame):
        name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
        os.write(2, f"adaptcq: stopped by {name}\n".encode())
        os._exit(128 + signum)

    for num in (signal.SIGINT, signal.SIGTERM):
        signal.signal(num, stop)
    return True


_STARTING = _stop_while_starting()  # (first: the imports below take a while)

import argparse
import contextlib
from pathlib import Path

from adaptcq.cliargs import (
    QUERYSET_EXECUTORS,
    QUERYSET_ROUTING,
    Parser,
    adaptivity_spec,
    add_run_arguments,
    check_partitions,
    given_flags,
    ordering_flags,
    parse_inputs,
    parse_orders,
    queryset_misfits,
    routing_options,
    seed_refusal,
    shed_options,
    spill_options,
    sql_arg,
    sql_where,
)
from adaptcq.errors import AdaptcqError
from adaptcq.plain import row, say

# Shared with ``adaptcq explain`` and the Spark driver (adaptcq.cliargs); the old private
# names stay for callers that used them.
_sql_arg, _inputs, _orders, _Parser = sql_arg, parse_inputs, parse_orders, Parser


def build_parser() -> argparse.ArgumentParser:
    # (imported here: the import of this module, before main() handles Ctrl-C, stays short)
    from adaptcq.explain import add_arguments as add_explain_arguments
    p = Parser(prog="adaptcq", description=(
        "Adaptive continuous queries over multi-way stream joins. "
        "With no command, runs the embedded default (same as `adaptcq run`)."))
    p.add_argument("--version", action=_Version, nargs=0,
                   help="print the installed version and exit")
    sub = p.add_subparsers(dest="command", parser_class=Parser)

    r = sub.add_parser("run", help="run a continuous query (the embedded default without --sql)")
    add_run_arguments(r)

    w = sub.add_parser("workload", help="write one of the papers' synthetic workloads to Parquet")
    w.add_argument("name", help="three-way, nway, table2, default, spill or shed")
    w.add_argument("--out", required=True, help="output folder")
    w.add_argument("--seed", type=int, default=0)
    w.add_argument("--n-updates", type=int, help="number of arrivals over all streams")
    w.add_argument("--point", help="Table 2 point for `table2` (D1..D8; default D1)")
    w.add_argument("--r", type=int, help="multiplicity r of T for `three-way` (default 5)")

    e = sub.add_parser("explain", help="show the join graph, each ordering algorithm's "
                       "pipelines and costs, and Q-Aware's choice")
    add_explain_arguments(e)

    c = sub.add_parser("cleanup", help="produce the results a spilling run left on disk "
                       "(adaptcq run --spill ... --cleanup off --spill-dir DIR, or on Spark "
                       "its --checkpoint)")
    c.add_argument("folder", help="the run's --spill-dir (local), or its --checkpoint "
                   "(--engine spark)")
    c.add_argument("--output",
                   help="where the late results go (Parquet, or CSV / JSON lines by "
                   "suffix); needed for a spill folder. A Spark checkpoint's go to its "
                   "run's own --output folder")
    c.add_argument("--format", choices=["parquet", "csv", "jsonl"])
    c.add_argument("--master", help="Spark master for a checkpoint (default local[*])")

    a = sub.add_parser("spark-archive", help="build (or show, or remove) the class-data "
                       "archive that makes Spark's driver JVM start faster")
    a.add_argument("--master", default="local[2]",
                   help="the training job's Spark master (default local[2])")
    a.add_argument("--rebuild", action="store_true", help="build it again")
    a.add_argument("--remove", action="store_true", help="delete every archive")

    b = sub.add_parser("bench", help="benchmarks (write CSV/PNG, print figures)")
    b.add_argument("name", help="mjoin-xjoin")
    rest = b.add_argument("args", nargs=argparse.REMAINDER,
                          help="the benchmark's own options")
    # argparse counts a REMAINDER positional as required: a missing NAME was reported as
    # "required: name, args", though the options may be left out.
    rest.required = False
    return p


class _Version(argparse.Action):
    """``--version``: the version looked up when asked (importlib.metadata costs about
    15 ms, which every other command would pay at start-up)."""

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"adaptcq {_version()}")
        parser.exit()


def _version() -> str:
    """The installed distribution's version (``adaptcq --version``)."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("adaptcq")
    except PackageNotFoundError:  # (a source tree on sys.path, not installed)
        return "(not installed: no distribution metadata)"


def main(argv: list[str] | None = None) -> int:
    """The command line. Ctrl-C and SIGTERM are handled from its first statement, for
    every command: until a run takes them over (``_run_local``, ``_run_queryset``: they
    stop it between two updates) and in commands that do not, they stop at once with one
    line on stderr and exit code 128 + the signal's number (130, 143), as README says, not
    a traceback (or, for SIGTERM, a silent kill that skipped the clean-up of temporary
    files). A run that is refused or fails removes the folders its checks made for its
    outputs, when they are still empty (``output.remove_made_folders``)."""
    import threading
    code = 1
    # (a signal handler can be set in the main thread only; main() in another thread, as
    # a program may call it, leaves signals as they are)
    signals = _StopSignals() if threading.current_thread() is threading.main_thread() \
        else None
    try:
        with signals or contextlib.nullcontext():
            try:
                code = _main(argv)
            except KeyboardInterrupt:
                if signals is None:
                    raise
                code = signals.code
                print(f"adaptcq: stopped by {signals.name}", file=sys.stderr)
    except SystemExit as e:  # (argparse: --help, or a usage error)
        code = 0 if e.code is None else e.code if isinstance(e.code, int) else 1
        raise
    finally:
        _made_folders(remove=code != 0)
        if _STARTING:  # (the command's end: Python's own handling again, not os._exit)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
    return code


def _made_folders(remove: bool) -> None:
    """The folders the output checks made (``output.MADE_FOLDERS``): removed when still
    empty after a refused or failed run, else kept. (Only if ``runtime.output`` was
    imported: else none was made, and importing it would load pyarrow.)"""
    output = sys.modules.get("adaptcq.runtime.output")
    if output is None:
        return
    if remove:
        output.remove_made_folders()
    else:
        output.forget_made_folders()


def _main(argv: list[str] | None) -> int:
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
        if args.command == "cleanup":
            return cmd_cleanup(args)
        if args.command == "spark-archive":
            return cmd_spark_archive(args)
        if args.command == "explain":
            from adaptcq.explain import main as explain_main
            return explain_main(args)
    except AdaptcqError as e:
        print(f"adaptcq: error: {e}", file=sys.stderr)
        return 1
    parser.print_help()
    return 2


def cmd_spark_archive(args) -> int:
    """``adaptcq spark-archive``: the driver JVM's class-data archive
    (``runtime.jvm_archive``): built when missing (or ``--rebuild``), else shown."""
    from adaptcq.runtime import jvm_archive
    if args.remove:
        if args.rebuild:
            raise AdaptcqError("--remove and --rebuild contradict each other; give one")
        gone = jvm_archive.remove()
        print(f"removed {len(gone)} archive(s) from {jvm_archive.cache_dir() / 'jvm'}")
        return 0
    try:
        path = jvm_archive.build(args.master, force=args.rebuild, log=print)
    except jvm_archive.JvmArchiveError as e:
        raise AdaptcqError(f"cannot build the JVM class-data archive: {e}") from None
    print(f"{path} ({path.stat().st_size / 2**20:.0f} MiB): Spark sessions started by "
          f"adaptcq map it (set {jvm_archive.ENV_SWITCH}=off to do without)")
    return 0


def cmd_run(args) -> int:
    from rich.console import Console

    to_stdout = args.output == "-" or args.summary_json == "-"
    # With results (or the JSON summary) on stdout, every message goes to stderr. Markup
    # and emoji codes are off: messages and tables hold the user's query text, names and
    # paths (the Spark runtime's too, which prints through this console); styles are
    # given as rich.text.Text (``plain.say``).
    console = Console(stderr=to_stdout, markup=False, emoji=False)
    if args.executor in QUERYSET_EXECUTORS:
        return _run_queryset(args, console)
    if args.sql is not None and len(args.sql) > 1:
        raise AdaptcqError(f"{len(args.sql)} --sql options: several queries run on one engine "
                           f"with --executor {' | '.join(QUERYSET_EXECUTORS)}")
    # (given_flags: --routing-epoch 0 is given too)
    baselines = ", ".join(QUERYSET_EXECUTORS[1:])
    users = {"--queries": f"eddy and its baselines ({baselines})"}
    routing = "eddy or eddies (the eddy's routing; NiagaraCQ's plans are static)"
    flags = given_flags(args, (QUERYSET_ROUTING - {"seed"}) | {"queries"})  # seed: below
    if flags:
        raise AdaptcqError(f"{flags[0]} is for --executor {users.get(flags[0], routing)}")
    if args.sql is not None:
        args.sql = args.sql[0]
    options = _run_options(args)
    if args.sql is None:
        if args.input:
            raise AdaptcqError("--input needs --sql (without both, the embedded default runs)")
        from adaptcq.stream.workloads import default_workload
        wl = default_workload()
        sql, sources, timestamp = wl.sql, wl.tables, wl.timestamp
        say(console, ("adaptcq", "bold"), f" embedded default: {wl.name}")
    else:
        sql, sources, timestamp = _sql_arg(args.sql), _inputs(args.input), args.timestamp
        if not sources:
            raise AdaptcqError("--sql needs an --input NAME=PATH for each stream")
        _refuse_nothing_to_order(args, sql)
        _refuse_nothing_to_cache(args, sql)
    _check_output_tildes(args)
    _check_summary_json(args, _input_paths(sources, [args.sql] if args.sql else []),
                        _outputs(args, spark=args.engine == "spark"))
    say(console, f"query: {' '.join(sql.split())}")
    if args.engine == "spark":
        from adaptcq.runtime.spark_cli import run_cli
        args.master = args.master or "local[*]"
        return run_cli(args, sql, sources, timestamp, options, console)
    if (args.checkpoint is not None or args.partitions is not None or args.master is not None
            or args.shares or args.trigger is not None
            or args.max_files_per_trigger is not None):
        raise AdaptcqError("--checkpoint, --partitions, --shares, --master, --trigger and "
                           "--max-files-per-trigger need --engine spark")
    return _run_local(args, sql, sources, timestamp, options, console)


def _refuse_nothing_to_order(args, sql: str) -> None:
    """``--optimizer`` / ``--reorder`` on a query of one or two streams: a pipeline orders
    the other streams (join-ordering.txt §2.1, Fig. 2b), so each of its pipelines has a single order
    (ΔR: S) and the policy, or the vectorized executor's per-batch ordering, would run
    and order nothing. Refused, as other options that would do nothing are."""
    ordering = ordering_flags(args)
    if not ordering:
        return
    what = _at_most_two_streams(sql, "order")
    if what is None:
        return
    raise AdaptcqError(f"{' and '.join(f'{flag} {value}' for flag, value in ordering)} "
                       f"order{'s' if len(ordering) == 1 else ''} the joins of each "
                       f"pipeline, but this query {what}, so there is nothing to order; drop "
                       f"{' and '.join(flag for flag, _ in ordering)} (ordering matters from "
                       "three streams on)")


def _at_most_two_streams(sql: str, single: str) -> str | None:
    """How a query of one or two streams reads them, for the refusals of what would do
    nothing there ("joins two streams (R, S): each pipeline has a single ``single`` (ΔR:
    S, ΔS: R)"); None for three streams or more, or a query that does not parse (the run
    reports it, where it parses the query against the inputs)."""
    from adaptcq.errors import QueryError
    from adaptcq.query.cql import parse_streams
    try:
        streams = parse_streams(sql)
    except QueryError:
        return None
    if len(streams) > 2:
        return None
    names = ", ".join(s.alias for s in streams)
    if len(streams) == 1:
        return f"reads one stream ({names}): it has no join"
    a, b = streams[0].alias, streams[1].alias
    return f"joins two streams ({names}): each pipeline has a single {single} (Δ{a}: {b}, Δ{b}: {a})"


def _refuse_nothing_to_cache(args, sql: str) -> None:
    """``--executor acaching`` on a query of one or two streams: a cache holds the join
    subresults of a segment of a pipeline's joins that joins at least two streams
    (a-caching.txt §3, and §4's "candidate caches with at least one join"), and a pipeline
    of a two-stream query has a single join (ΔR: S), so there is no candidate cache and the
    policy would profile and cache nothing. Refused, as ``--optimizer`` / ``--reorder``
    there (``_refuse_nothing_to_order``); the Python API accepts it (as it accepts those)."""
    if args.executor != "acaching":
        return
    if (args.reopt_interval is not None and not args.reopt_interval > 0) or \
            (args.cache_memory is not None and not args.cache_memory >= 0):
        return  # a bad value is the first error: the run names it (ACaching checks them)
    what = _at_most_two_streams(sql, "join")
    if what is None:
        return
    flags = ["--executor acaching"] + [
        flag for flag, given in (("--caches", args.caches is not None),
                                 ("--cache-memory", args.cache_memory is not None),
                                 ("--reopt-interval", args.reopt_interval is not None),
                                 ("--no-cache-verify", args.no_cache_verify)) if given]
    raise AdaptcqError(f"--executor acaching caches the subresults of two or more joins of a "
                       f"pipeline (a-caching.txt §3), but this query {what}, so there is "
                       f"nothing to cache; drop {' and '.join(flags)} (caching matters from "
                       "three streams on)")


def _run_queryset(args, console) -> int:
    """``adaptcq run --executor eddy --sql @q1.sql --sql @q2.sql [--queries FILE]``: many
    queries on one engine; each query's results go to OUTPUT/query_id=ID/part-0.parquet
    (a folder partitioned by query_id, readable with pyarrow.dataset or Spark)."""
    from adaptcq.runtime.multi import ROUTING_EPOCH, unused_seed
    if args.routing_epoch is not None and args.routing_epoch < 0:
        raise AdaptcqError(f"--routing-epoch must be 0 or a positive number of arrivals, "
                           f"got {args.routing_epoch}")
    refusal = unused_seed(args.routing, args.seed, cli=True) \
        if args.seed is not None and args.executor in ("eddy", "eddies") else None
    if refusal:  # (Engine(routing="fixed", seed=3) is refused by the same check)
        raise AdaptcqError(refusal)
    from adaptcq.runtime.output import file_suffix
    suffix = file_suffix(args.output) if args.output not in (None, "-") else None
    if suffix:
        raise AdaptcqError(f"--output {args.output!r}: --executor {args.executor} writes a "
                           "folder of Parquet files per query (OUTPUT/query_id=ID/), not a "
                           f"{suffix} file; give --output a folder name")
    sources = _inputs(args.input)
    inputs = _input_paths(sources, args.sql or [], [args.queries] if args.queries else [])
    _check_output_tildes(args)
    _check_summary_json(args, inputs, _outputs(args, spark=args.engine == "spark"))
    if args.engine == "spark":  # (run_cli_multi refuses what the Spark query set ignores)
        from adaptcq.runtime.spark_multi import run_cli_multi
        check_partitions(args.partitions)
        args.seed = args.seed or 0
        return run_cli_multi(args, console)
    # Every option the executor does not use is refused (cliargs.QUERYSET_OPTIONS).
    misfits = queryset_misfits(args)
    if misfits:
        static = args.executor in ("pushdown", "pullup") and \
            given_flags(args, QUERYSET_ROUTING)
        raise AdaptcqError(f"{', '.join(misfits)}: not for --executor {args.executor} (a query "
                           "set" + ("; NiagaraCQ's plans are static: nothing is routed"
                                    if static else "")
                           + "; see docs/cacq.md for its options)")
    if not args.sql and not args.queries:
        raise AdaptcqError(f"--executor {args.executor} needs queries: --sql (repeat it) "
                           "and/or --queries FILE")
    if not sources:
        raise AdaptcqError("give an --input NAME=PATH for each source")
    if args.output in (None, "-"):
        raise AdaptcqError(f"--executor {args.executor} writes one output per query: give "
                           "--output FOLDER")
    from adaptcq.runtime.local import source_paths
    from adaptcq.runtime.multi import Engine, named_errors
    from adaptcq.runtime.output import make_folder, overlaps
    out = Path(args.output)  # (as written, as the inputs: _check_output_tildes)
    for p in source_paths(sources):
        if overlaps(out, p):
            raise AdaptcqError(f"--output {args.output!r} is the input {str(p)!r} (or holds "
                               "it, or is inside it); writing there would destroy the input")
    if out.exists() and not out.is_dir():
        raise AdaptcqError(f"--output {args.output!r} is a file; --executor {args.executor} "
                           "writes a folder with one sub-folder per query")
    rejected = RejectedOutput(args.rejected, args.output, inputs)
    engine = Engine(sources, args.timestamp, mode=args.mode, executor=args.executor,
                    routing=args.routing or "tickets",
                    routing_options=routing_options(args.routing_option),
                    seed=args.seed or 0,
                    timestamp_unit=args.timestamp_unit,
                    allowed_lateness=args.allowed_lateness,
                    routing_epoch=ROUTING_EPOCH if args.routing_epoch is None
                    else args.routing_epoch or None, on_rejected=rejected)
    for k, text in enumerate(args.sql or [], 1):
        sql = _sql_arg(text)
        with named_errors(sql_where(k, text)):  # (which of many --sql is wrong)
            engine.register(sql, query_id=f"q{k}",
                            output=str(out / f"query_id=q{k}" / "part-0.parquet"))
    if args.queries:
        engine.load_control(args.queries)
        for h in engine.handles.values():
            if h.output is None:
                h.output = str(out / f"query_id={h.id}" / "part-0.parquet")
    import shutil
    for stale in out.glob("query_id=*"):  # an earlier run's queries: replaced, not mixed
        if stale.is_dir():
            shutil.rmtree(stale)
    for h in engine.handles.values():
        make_folder(Path(h.output).parent)  # (recorded: a failed run removes it if empty)
    # Ctrl-C and SIGTERM stop between two arrivals, as for one query (_run_local).
    with _StopSignals(engine.stop) as signals:
        try:
            rejected.start()
            engine.run()  # (it removes the queries' outputs when it fails)
            rejected.close()  # (failing, it removes the queries' outputs too: below)
        except BaseException as exc:
            rejected.abort()
            engine.abort_outputs()  # (the rejected rows' file failed: none looks complete)
            _failed_summary(args, lambda: dict(engine.stats), engine.stats.get("stopped"),
                            exc, signals)
            if signals.forced:
                say(console, ("stopped at once", "bold"), f" by a second {signals.name}; "
                     "the outputs were removed")
                return signals.code
            raise
    # Every output is complete from here: nothing below may remove one.
    rejected.report(console, engine.stats["rejected"])
    console.print(queryset_summary(engine, args))
    for h in engine.handles.values():
        say(console, f"query {h.id}: {h.emitted:,} result rows -> {h.output}",
             *((("  failed: " + str(h.error), "red"),) if h.error else ()))
    if args.summary_json:
        _write_json(args.summary_json, engine.stats)
    if engine.interrupted:
        say(console, (signals.said, "bold"), f": {_where(engine.stats)}; each query's "
             "output holds exactly the results of the arrivals processed")
        return signals.code
    return 0


def _input_paths(sources, sql: list[str], others: list[str] = ()) -> list[Path]:
    """What a run reads from files: its inputs (a glob's files), ``--sql @FILE``'s query
    files and the other files named (the control stream): no output may overwrite them."""
    from adaptcq.cliargs import query_files
    from adaptcq.runtime.local import source_paths
    return [*source_paths(sources), *query_files(sql), *(Path(p) for p in others)]


def _outputs(args, spark: bool) -> list[tuple[str, str]]:
    """The paths a run writes besides --summary-json, each with the words naming it: the
    results, the rejected rows (given, or their default beside the results), the spill
    folder, the Spark checkpoint."""
    out = args.output if args.output not in (None, "-") else None
    targets = [("--output", out)]
    if args.rejected not in (None, "-"):
        targets.append(("--rejected", args.rejected))
    elif out is not None:
        kind = "folder" if spark else "file"
        targets.append((f"the rejected rows' {kind} (--rejected's default)",
                        f"{out.rstrip('/')}.rejected" if spark
                        else _default_rejected(out, getattr(args, "format", None))))
    targets += [("--spill-dir", getattr(args, "spill_dir", None)),
                ("--checkpoint", getattr(args, "checkpoint", None))]
    return [(what, path) for what, path in targets if path is not None]


def _check_output_tildes(args) -> None:
    """``--output`` and ``--rejected`` are taken as written, as the inputs are: one that
    starts with a ``~`` the shell left (``--output=~/o.csv``) and no folder of that name
    exists is refused before any work (``output.check_tilde``), on either engine, rather
    than made into a folder named ``~``; so is ``--checkpoint`` (Spark). (``--summary-json``:
    in check_output_path.)"""
    from adaptcq.runtime.output import check_tilde
    for flag, path in (("--output", args.output), ("--rejected", args.rejected),
                       ("--checkpoint", getattr(args, "checkpoint", None))):
        if path not in (None, "-"):
            check_tilde(path, flag)


def _check_summary_json(args, inputs: list[Path], outputs: list[tuple[str, str]]) -> None:
    """``--summary-json``, checked before any work as --output and --rejected are: not an
    input (nor a folder holding one), not a place another output goes, not a folder, in a
    folder that can be written (made if missing). ``-`` is stdout, unless the results go
    there (--output -) or the run is on Spark (whose driver writes the summary to a
    file)."""
    path = args.summary_json
    if path is None:
        return
    if path == "-":
        if args.output == "-":
            raise AdaptcqError("--summary-json -: stdout carries the results (--output -); "
                               "give --summary-json a file")
        if args.engine == "spark":
            raise AdaptcqError("--summary-json - (stdout) is not supported with --engine "
                               "spark yet; give --summary-json a file")
        return
    from adaptcq.runtime.output import check_output_path
    check_output_path(path, inputs, "--summary-json", outputs, "summary.json")


def queryset_summary(engine, args):
    from rich.table import Table

    s = engine.stats
    t = Table(title="run summary (query set)", show_header=False)
    t.add_column("what")
    t.add_column("value", justify="right")
    routing = (args.routing or "tickets") if args.executor in ("eddy", "eddies") else \
        "none (a static plan)"  # (NiagaraCQ's plans do not route)
    row(t, "executor / routing / mode", f"{args.executor} / {routing} / {args.mode}")
    row(t, "queries", f"{len(engine.handles):,}")
    row(t, "input rows (arrivals)", f"{s['arrivals']:,}")
    row(t, "engine CPU seconds", f"{s['cpu_seconds']:.3f}")
    if s["cpu_seconds"] > 0:
        row(t, "throughput (arrivals per CPU-second)",
             f"{s['arrivals'] / s['cpu_seconds']:,.0f}")
    for key in ("results", "routings", "built", "dropped", "deletions"):
        if key in s:
            row(t, key, f"{s[key]:,}")
    if s.get("arrivals") and "routings" in s:
        row(t, "routings per arrival", f"{s['routings'] / s['arrivals']:.3f}")
    row(t, "rejected rows (late)", f"{s['rejected']:,}")
    _where_inputs_stopped(t, s)
    return t


def _where_inputs_stopped(t, s: dict) -> None:
    """The summary's rows read per input and, for a run that stopped before the end of its
    input, why and the rows processed per input."""
    if s.get("rows_read"):
        row(t, "input rows read", ", ".join(f"{n}: {k:,}" for n, k in s["rows_read"].items()))
    if s.get("stopped"):
        row(t, "stopped", s["stopped"])
        row(t, "input rows processed",
             ", ".join(f"{n}: {k:,}" for n, k in s["rows_processed"].items()))


def _run_options(args) -> dict:
    """Engine options from the command line, each checked against the executor. With
    ``--engine spark`` only the plan options (orders, nested-loop joins, tree): the
    adaptive policies are built in every partition group (``cliargs.adaptivity_spec``)."""
    options: dict = {}
    mjoin = args.executor in ("mjoin", "acaching", "auto", "vector")
    if args.order:
        if not mjoin:
            tree = {"xjoin": " (it takes a tree of binary joins: --tree)",
                    "tree": " (it takes a plan of m-way operators: --tree)"}
            raise AdaptcqError("--order sets MJoin pipelines, for --executor mjoin, acaching, "
                               f"vector or auto; not --executor {args.executor}"
                               + tree.get(args.executor, ""))
        options["orders"] = _orders(args.order)
    if args.nested_loop:
        if args.executor not in ("mjoin", "acaching", "auto"):
            raise AdaptcqError("--nested-loop is for --executor mjoin or acaching (it chooses "
                               "how a per-tuple probe scans a window)")
        options["nested_loop"] = args.nested_loop
    # --executor acaching's cache options, --optimizer, --reorder (ACaching and the
    # policies check the values). The Spark driver builds every group's policies from
    # the same spec in its workers (runtime.spark_cli).
    spec = adaptivity_spec(args)
    vectorizable = args.executor in ("auto", "vector")
    if spec is not None and vectorizable and spec["reorder"] == "off" \
            and spec["caching"] is None:
        # The vectorized executor orders per batch with this algorithm (adapt.batch_order);
        # if auto falls back to MJoin, the same algorithm becomes its optimizer policy.
        options["ordering"] = spec["optimizer"]
        spec = None
        if args.seed is not None and args.executor == "auto" and args.engine != "spark" \
                and not given_flags(args, ("shed", "spill")):
            options["seed"] = args.seed  # that policy's profiling sample (LocalRun decides)
    if args.batch_rows is not None:
        options["batch_rows"] = args.batch_rows
    if args.batch_seconds is not None:
        options["batch_seconds"] = args.batch_seconds  # (checked by local.batch_options)
    if spec is not None and args.engine != "spark":
        if spec["caching"] is not None:
            options["cache_options"] = spec["caching"]
        if spec["optimizer"] or spec["reorder"] != "off":
            from adaptcq.adapt import make_policies
            options["policies"] = make_policies(
                optimizer=spec["optimizer"], reorder=spec["reorder"],
                **({} if args.seed is None else {"seed": args.seed}))  # profiling samples
    shed = shed_options(args)
    if shed is not None:
        options["shed"] = shed
    spill = spill_options(args)
    if spill is not None:
        options["spill"] = spill
    if args.tree:
        tree_executor = args.executor == "tree" or (args.executor == "auto" and spill)
        if args.executor != "xjoin" and not tree_executor:
            raise AdaptcqError("--tree is for --executor xjoin (binary joins) or --executor "
                               "tree (m-way operators)")
        from adaptcq.engine.spill_tree import parse_plan
        from adaptcq.engine.xjoin import parse_tree
        try:
            options["tree"] = parse_plan(args.tree) if tree_executor else parse_tree(args.tree)
        except ValueError as e:
            raise AdaptcqError(str(e)) from None
    if args.max_results is not None and args.max_results < 1:
        raise AdaptcqError(f"--max-results must be a positive number, got {args.max_results}")
    refusal = seed_refusal(args)  # after the other checks: they name the root cause
    if refusal is not None:
        raise AdaptcqError(refusal)
    return options


def _run_local(args, sql, sources, timestamp, options, console) -> int:
    import pyarrow as pa
    # The system allocator hands freed memory back; Arrow's default pool keeps ~50 MB more
    # resident on a long run (measured on the §7.2 join).
    if "ARROW_DEFAULT_MEMORY_POOL" not in os.environ:
        pa.set_memory_pool(pa.system_memory_pool())

    from adaptcq.runtime.local import LocalRun
    from adaptcq.runtime.output import FileSink, OutputClosed, check_output_path, format_of

    inputs = _input_paths(sources, [args.sql]) if args.sql is not None else []
    fmt = format_of(args.output, args.format)
    if args.output is None and args.format is not None:
        raise AdaptcqError("--format needs --output (a file, or - for stdout)")
    if args.output not in (None, "-"):
        check_output_path(args.output, inputs)
        _refuse_spill_dir_clash(args.spill_dir, args.output, "--output")
    if args.rejected not in (None, "-"):
        _refuse_spill_dir_clash(args.spill_dir, args.rejected, "--rejected")
    rejected = RejectedOutput(args.rejected, args.output, inputs, args.format)
    # Ctrl-C and SIGTERM stop the run between two updates; while it is set up (its spill
    # folder is made then) they stop at once: nothing is left.
    with _StopSignals() as signals:
        try:
            run = LocalRun(sql, sources, timestamp, args.executor, args.mode, sign=args.sign,
                           allowed_lateness=args.allowed_lateness,
                           timestamp_unit=args.timestamp_unit, max_results=args.max_results,
                           on_rejected=rejected, **options)
        except KeyboardInterrupt:
            if not signals.forced:
                raise
            say(console, ("stopped", "bold"), f" by {signals.name} before the run began")
            return signals.code
        signals.stop = run.stop
        sink = None
        began = False
        try:
            sink = FileSink(args.output, run.schema, fmt) if args.output is not None else None
            rejected.start()
            try:
                with _progress(args, console, run) as update:
                    run.progress = update
                    run.sink = sink  # results are written as they leave the engine
                    began = True
                    for _ in run:
                        pass
            except OutputClosed:  # `adaptcq run --output - | head`: the reader has its rows
                run.stopped = "stdout was closed by its reader"
                sink = None
            # (inside the try: an output failing to close removes the others too)
            if sink is not None:
                sink.close()
            rejected.close()
        except BaseException as exc:
            if sink is not None:
                sink.abort()
            rejected.abort()
            if run.spill is not None and (not began or args.output != "-"):
                # A run that failed before it began leaves no spill folder it made; one
                # whose output is removed (above) none of its spill files either. Results
                # already on stdout stay delivered: so do the spill files of their late
                # results (``adaptcq cleanup``). (LocalRun closes its store itself.)
                run.spill.close(False)
            _failed_summary(args, lambda: _summary_doc(run), run.stopped, exc, signals)
            if signals.forced:
                say(console, ("stopped at once", "bold"), f" by a second {signals.name}; "
                     "the outputs were removed")
                return signals.code
            raise
    # Every output is complete from here: nothing below may abort one (the message once
    # printed inside the try above, failing, had the finished output deleted).
    if sink is not None and args.output != "-":
        say(console, f"wrote {sink.rows:,} result rows to {args.output}")
    rejected.report(console, run.rejected_count)
    console.print(summary_table(run.result(None)))
    if args.summary_json:
        _write_json(args.summary_json, _summary_doc(run))
    if run.stopped == "stdout was closed by its reader":
        say(console, f"stdout was closed by its reader after {run.stats['results']:,} "
             "result rows; the run stopped there")
        return 0
    if run.interrupted:
        say(console, (signals.said, "bold"), f": {_where(run.stats)}; the output holds "
             "exactly the results of the arrivals processed")
        return signals.code
    if run.stopped:
        raise AdaptcqError(f"stopped: {run.stopped} ({_where(run.stats)}); the output holds "
                           "the results so far")
    return 0


def _refuse_spill_dir_clash(spill_dir: str | None, path: str, what: str) -> None:
    """An output that is the spill folder, holds it, or is inside it under a name the spill
    store writes or clears (``state.spill_store.owns``) is refused before any work: one
    would destroy the other (``--spill-dir o.parquet --output o.parquet`` failed at the
    end, leaving an empty folder). Other files beside the spill files are fine. Links are
    followed: an output reached through a link into the spill folder is the same file."""
    if not spill_dir:
        return
    from adaptcq.state.spill_store import owns
    out, folder = Path(path).resolve(), Path(spill_dir).resolve()
    if out == folder or out in folder.parents or (out.parent == folder and owns(out.name)):
        raise AdaptcqError(f"{what} {path!r} is --spill-dir {spill_dir!r}, holds it or is a "
                           "file the spill store writes there; give each a place of its own")


_SIGNALS = {"SIGINT": "Ctrl-C", "SIGTERM": "SIGTERM"}  # the signals that stop a run


class _StopSignals:
    """SIGINT (Ctrl-C) and SIGTERM (kill, timeout, docker stop) stop a run at the next
    boundary between two updates (``stop(reason)``), so that its outputs are valid and
    say so; a second signal stops at once (KeyboardInterrupt, ``forced``: the outputs are
    removed). The exit code is 128 + the signal's number, as a shell reports a process
    killed by it."""

    def __init__(self, stop=None):
        self.stop = stop  # (None while the run is set up: a signal stops at once)
        self.signum: int | None = None
        self.forced = False
        self.previous: dict = {}

    def __enter__(self):
        import signal
        for name in _SIGNALS:
            num = getattr(signal, name)
            self.previous[num] = signal.signal(num, self._handle)
        return self

    def __exit__(self, *exc):
        import signal
        for num, handler in self.previous.items():
            signal.signal(num, handler)
        return False

    def _handle(self, signum, frame):
        if self.signum is not None or self.stop is None:
            self.signum = self.signum or signum
            self.forced = True
            raise KeyboardInterrupt  # a second signal: stop at once
        self.signum = signum
        self.stop(self.said)

    @property
    def name(self) -> str:
        import signal
        return _SIGNALS.get(signal.Signals(self.signum or signal.SIGINT).name, "a signal")

    @property
    def said(self) -> str:
        return "interrupted" if self.name == "Ctrl-C" else f"terminated ({self.name})"

    @property
    def code(self) -> int:
        import signal
        return 128 + (self.signum or signal.SIGINT)


def _failed_summary(args, doc, stopped: str | None, exc: BaseException, signals) -> None:
    """``--summary-json`` of a run that failed once its outputs were begun: its figures
    with ``stopped`` = "failed: ..." (an earlier run's summary stayed, saying it had
    succeeded); if they cannot be had, the stale file is removed. Never raises: the
    error that failed the run is the one reported."""
    path = args.summary_json
    if path is None:
        return
    if signals is not None and signals.forced:
        why = f"failed: stopped at once by a second {signals.name}; the outputs were removed"
    elif stopped is not None and stopped.startswith("failed: "):
        why = stopped
    elif isinstance(exc, AdaptcqError):
        why = f"failed: {exc}"
    else:
        why = f"failed: {type(exc).__name__}: {exc}".rstrip(": ")
    try:
        d = doc()
        d["stopped"] = why
        _write_json(path, d)
    except Exception:  # noqa: BLE001 - no figures: at least no stale summary
        if path != "-":
            with contextlib.suppress(OSError):
                Path(path).unlink(missing_ok=True)


def _summary_doc(run) -> dict:
    """The printed summary's figures as JSON, with its plan (``plan``: the text of the
    summary's plan row, as a Spark group's ``plan``) and the memory samples. A-Caching's
    ``cache_history`` (its latest ``adapt.base.HISTORY_MAX`` events, from which the
    printed "cache changes over time" are taken) is kept whole, a list of {arrival, ts,
    event, what}: the JSON is the summary, and a script needs to see which caches were
    used and dropped when."""
    doc = {}
    for k, v in run.stats.items():
        doc[k] = [dict(h) for h in v] if k == "cache_history" else v
        if k == "mode":
            doc["plan"] = run.plan
    doc["rss_samples"] = [{"arrivals": a, "rss_bytes": b} for a, b in run.rss_samples]
    return doc


def _write_json(path: str, doc) -> None:
    """``--summary-json``: valid JSON; a figure that does not exist (the throughput of a
    run that took no CPU time) is null, never a bare Infinity / NaN token. Written as the
    outputs are (a full disk left an empty, invalid file); if it fails, none is left."""
    from adaptcq.runtime.output import summary_json, write_text
    text = summary_json(doc)
    try:
        if path == "-":  # (every message went to stderr: cmd_run's console)
            sys.stdout.write(text + "\n")
            sys.stdout.flush()
            return
        write_text(path, text)  # (a temporary renamed into place: never a partial file)
    except OSError as e:
        if path != "-":  # an earlier run's summary must not pass for this run's
            with contextlib.suppress(OSError):
                Path(path).unlink(missing_ok=True)
        raise AdaptcqError(f"--summary-json {path!r}: cannot write: {e.strerror or e}") \
            from None


class RejectedOutput:
    """``--rejected``: the rejected input rows, written as they come (``__call__`` is the
    run's ``on_rejected``). Without ``--rejected`` they go beside ``--output`` (a file or a
    query set's folder: ``OUT.rejected.parquet``), created at the first rejected row only;
    with no ``--output`` either they are counted, not kept. Paths are checked on creation,
    before any work."""

    def __init__(self, given: str | None, output: str | None, inputs: list[Path],
                 fmt: str | None = None):
        from adaptcq.runtime.output import check_output_path
        if given == "-":  # (its rows would interleave with the results or the summary)
            raise AdaptcqError("--rejected -: stdout carries the results (--output -) or the "
                               "run's summary; give --rejected a file")
        self.given = given
        self.path = given if given is not None else (
            None if output in (None, "-") else _default_rejected(output, fmt))
        if self.path is not None:
            # (the default too: start() removes a stale one, and an input of its name was
            # deleted)
            check_output_path(self.path, inputs,
                              "--rejected" if given is not None else "--rejected's default")
        if given is not None and output not in (None, "-") and \
                Path(given).resolve() == Path(output).resolve():
            raise AdaptcqError("--rejected and --output name the same file")
        self.sink = None

    def __call__(self, batch) -> None:
        if self.path is None:
            return
        if self.sink is None:
            from adaptcq.runtime.local import REJECTED_SCHEMA
            from adaptcq.runtime.output import FileSink, format_of
            self.sink = FileSink(self.path, REJECTED_SCHEMA, format_of(self.path, None),
                                 "--rejected")
        self.sink.write(batch)

    def start(self) -> None:
        """Once the query is accepted: a stale default file from an earlier run goes with
        the earlier output (a refused run keeps both); a ``--rejected`` file given is
        always written, empty when no row is rejected."""
        if self.given is None:
            if self.path is not None:
                Path(self.path).unlink(missing_ok=True)
        else:
            import pyarrow as pa

            from adaptcq.runtime.local import REJECTED_SCHEMA
            self(pa.RecordBatch.from_pylist([], schema=REJECTED_SCHEMA))

    def abort(self) -> None:
        if self.sink is not None:
            self.sink.abort()

    def close(self) -> None:
        """The file is complete (inside the run's try: failing, it removes the other
        outputs too); ``report`` says so once every output is closed."""
        if self.sink is not None:
            self.sink.close()

    def report(self, console, count: int) -> None:
        if self.sink is not None:
            say(console, f"wrote {self.sink.rows:,} rejected rows to {self.path}")
        if count and self.path is None:
            say(console, f"{count:,} rows were rejected; give --rejected FILE to keep them")


def _default_rejected(output: str, fmt: str | None = None) -> str:
    """``--rejected``'s default: the output's name with ``.rejected`` before its format
    suffix, in its format (``o.csv.gz`` -> ``o.rejected.csv.gz``); with ``--format`` naming
    another format, that format's suffix after the whole name (``o.txt --format csv`` ->
    ``o.txt.rejected.csv``); else Parquet after the whole name (a query set's folder).
    Outputs ``o.csv`` and ``o.parquet`` once shared ``o.rejected.parquet``, so a run of
    one removed the other's as stale."""
    from adaptcq.runtime.output import SUFFIXES, _suffix
    p = Path(output)
    suffix, gz = _suffix(output)
    if fmt is not None and SUFFIXES.get(suffix) != fmt:  # (--format names another format)
        return str(p.with_name(f"{p.name}.rejected.{fmt}"))
    if suffix in SUFFIXES:
        cut = len(suffix) + (len(".gz") if gz else 0)
        return str(p.with_name(p.name[:-cut] + ".rejected" + p.name[-cut:]))
    return str(p.with_name(p.name + ".rejected.parquet"))


def _where(s: dict) -> str:
    """Where the inputs stopped, from a run's (or a query set's) stats."""
    done = ", ".join(f"{n} {k:,} rows" for n, k in s["rows_processed"].items())
    read = ", ".join(f"{n} {k:,}" for n, k in s["rows_read"].items())
    at = f" (the last at event time {s['last_event_time']:g} s)" \
        if "last_event_time" in s else ""
    return (f"input stopped after {s['arrivals']:,} arrivals{at}; processed: {done} "
            f"(read: {read})")


class _progress:
    """A progress bar on stderr while the run reads its input (none when not a terminal)."""

    def __init__(self, args, console, run):
        self.enabled = not args.no_progress and console.is_terminal and sys.stderr.isatty()
        self.args, self.console, self.run = args, console, run
        self.bar = None

    def __enter__(self):
        if not self.enabled:
            return None
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn
        self.bar = Progress("[progress.description]{task.description}", BarColumn(),
                            MofNCompleteColumn(), TimeRemainingColumn(), console=self.console,
                            transient=True)
        self.bar.__enter__()
        task = self.bar.add_task(f"{self.args.executor} ({self.args.mode})",
                                 total=self.run.total_rows)
        return lambda done, total: self.bar.update(task, completed=done)

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.__exit__(*exc)
        return False


def summary_table(result):
    from rich.table import Table

    s = result.stats
    t = Table(title="run summary", show_header=False)
    t.add_column("what")
    t.add_column("value", justify="right")
    row(t, "executor / mode", f"{s['executor']} / {s['mode']}")
    row(t, "plan", result.plan)
    row(t, "input rows (arrivals)", f"{s['arrivals']:,}")
    row(t, "updates processed (ΔR insertions + deletions)", f"{s['updates']:,}")
    row(t, "rows dropped by selections", f"{s['filtered']:,}")
    row(t, "results", f"{s['results']:,}")
    row(t, "engine CPU seconds", f"{s['cpu_seconds']:.3f}")
    row(t, "throughput (updates per CPU-second)", f"{s['throughput']:,.0f}")
    row(t, "peak state (tuples)", f"{s['peak_state_tuples']:,}")
    row(t, "peak state (bytes)", f"{s['peak_state_bytes']:,}")
    row(t, "rejected rows", f"{s['rejected']:,}")
    if "peak_rss_bytes" in s:
        row(t, "peak memory (RSS)", f"{s['peak_rss_bytes'] / 2**20:,.0f} MiB")
    _where_inputs_stopped(t, s)
    for key, value in s.items():  # what the adaptive policies report
        if key in _CORE or key == "cache_history":
            continue
        if key == "cache_measured":
            from adaptcq.adapt.acaching import describe_measured
            value = [describe_measured(m) for m in value]
        if value is None:
            value = "—"
        elif isinstance(value, bool):  # (before int: a bool is one, and printed 1/0)
            value = "yes" if value else "no"
        elif isinstance(value, list):
            value = "\n".join(map(str, value)) or "none"
        elif isinstance(value, dict):
            value = "\n".join(f"{k}: {_brief(v)}" for k, v in value.items()) or "none"
        elif isinstance(value, float):
            value = f"{value:,.4g}"
        elif isinstance(value, int):
            value = f"{value:,}"
        row(t, key.replace("_", " "), str(value))
    if s.get("cache_history"):
        changes = [h for h in s["cache_history"]
                   if h["event"] in ("use", "drop", "shrink", "grow")]
        row(t, "cache changes over time", "\n".join(
            f"at arrival {h['arrival']:,}: {h['event']} {h['what']}" for h in changes[-8:])
            or "none")
    return t


def _brief(value) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k} ×{v:,}" if isinstance(v, int) else f"{k} {v}"
                         for k, v in value.items())
    return str(value)


_CORE = {"executor", "mode", "arrivals", "updates", "insertions", "deletions", "filtered",
         "results", "rejected", "cpu_seconds", "load_cpu_seconds", "throughput",
         "peak_state_tuples", "peak_state_bytes", "peak_rss_bytes", "rows_read", "rows_processed", "stopped",
         "last_event_time"}


def cmd_workload(args) -> int:
    from adaptcq.stream.workloads import WORKLOADS, write_workload

    if args.name not in WORKLOADS:
        raise AdaptcqError(f"unknown workload {args.name!r}; choose one of {', '.join(WORKLOADS)}")
    # An option the workload does not use is refused, never ignored.
    for flag, value, user, what in (("--point", args.point, "table2", "its Table 2 point"),
                                    ("--r", args.r, "three-way", "the multiplicity of T")):
        if value is not None and args.name != user:
            raise AdaptcqError(f"{flag} is for the {user} workload ({what}); {args.name} "
                               "does not use it")
    kwargs = {"seed": args.seed}
    if args.n_updates is not None:
        kwargs["n_updates"] = args.n_updates
    if args.point is not None:
        kwargs["name"] = args.point
    if args.r is not None:  # (0 is a value: three_way refuses it, as it does -1)
        kwargs["r"] = args.r
    wl = WORKLOADS[args.name](**kwargs)
    paths = write_workload(wl, args.out)
    for name, path in paths.items():
        print(f"{name}: {path}")
    print(f"query: {wl.sql}")
    return 0


def cmd_cleanup(args) -> int:
    """``adaptcq cleanup DIR --output OUT``: the results a spilling run held back on disk
    (state-spill.txt §4), written to OUT; the folder is emptied. ``adaptcq cleanup
    CHECKPOINT``: the same for a Spark run, as a Spark job over its checkpoint
    (``runtime.spark_cli.cleanup_cli``)."""
    from adaptcq.runtime.spark import FINGERPRINT
    from adaptcq.runtime.spill import cleanup_folder
    from adaptcq.state.spill_store import MANIFEST
    from adaptcq.stream.sources import check_tilde_path
    # As written, as ``cleanup_folder`` and every path option take it (no '~' expansion).
    check_tilde_path(args.folder, "adaptcq cleanup", AdaptcqError)
    folder = Path(args.folder)
    if (folder / FINGERPRINT).exists():
        from rich.console import Console

        from adaptcq.runtime.spark_cli import cleanup_cli
        return cleanup_cli(args, Console(markup=False, emoji=False))
    if args.output is None or args.master is not None:
        # Without --output (or with --master) DIR was meant as a Spark checkpoint, or
        # --output was forgotten: say what DIR is not before asking for either form's
        # options (a mistyped checkpoint would be told it needs --output). With --output
        # alone, ``cleanup_folder`` says it for a spill folder.
        what = ("a Spark run's checkpoint (a folder holding adaptcq.json) or the --spill-dir "
                "of a local run with --cleanup off")
        if not folder.exists():
            raise AdaptcqError(f"{args.folder} does not exist; adaptcq cleanup takes {what}")
        if not folder.is_dir():
            raise AdaptcqError(f"{args.folder} is a file; adaptcq cleanup takes {what}")
        if not (folder / MANIFEST).exists():
            raise AdaptcqError(
                f"{args.folder} is neither a Spark checkpoint (no {FINGERPRINT}) nor a spill "
                f"folder (no {MANIFEST}); adaptcq cleanup takes {what}")
    if args.master is not None:
        raise AdaptcqError(f"--master is for a Spark run's checkpoint; {args.folder} is not "
                           "one (it has no adaptcq.json)")
    if args.output is None:
        raise AdaptcqError("adaptcq cleanup DIR needs --output: where the late results go")
    done = cleanup_folder(args.folder, args.output, args.format)
    # On stderr, as adaptcq run's summary: with --output - stdout carries the results.
    print(f"wrote {done['late_results']:,} late results to {args.output} "
          f"(clean-up {done['cleanup_cpu_seconds']:.3f} CPU-s); {args.folder} is empty",
          file=sys.stderr)
    return 0


def cmd_bench(args) -> int:
    if args.name == "mjoin-xjoin":
        from adaptcq.bench.mjoin_xjoin import main as bench_main
        return bench_main(args.args)
    raise AdaptcqError(f"unknown benchmark {args.name!r}; choose mjoin-xjoin")


if __name__ == "__main__":
    sys.exit(main())
