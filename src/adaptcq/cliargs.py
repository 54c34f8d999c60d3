"""Command-line argument helpers shared by ``adaptcq run`` (cli), ``adaptcq explain``
(explain) and the Spark driver of ``adaptcq run --engine spark`` (runtime.spark_cli).

Nothing here imports another adaptcq command module, so each of them can import this one
without an import cycle (``tests/test_imports.py`` checks the graph).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from adaptcq.errors import AdaptcqError

__all__ = ["Parser", "adaptivity_spec", "add_input_argument", "add_run_arguments",
           "check_partitions", "given_flags", "parse_inputs", "parse_orders", "query_files",
           "queryset_misfits", "run_defaults", "seed_refusal", "shed_options",
           "spill_options", "sql_arg", "sql_where"]


def sql_arg(text: str) -> str:
    """``--sql``: the query text, or ``@FILE`` to read it from a file."""
    if text.startswith("@"):
        if not text[1:].strip():  # (Path("") is the current folder)
            raise AdaptcqError(f"--sql {text!r}: give the query file's name after @, e.g. "
                               "--sql @query.sql")
        path = Path(text[1:])  # as written, as every path option is (no '~' expansion)
        from adaptcq.stream.sources import check_tilde_path
        check_tilde_path(text[1:], "query file", AdaptcqError)
        if not path.exists():
            raise AdaptcqError(f"query file {str(path)!r} does not exist")
        if path.is_dir():
            raise AdaptcqError(f"query file {str(path)!r} is a folder; give the file "
                               "holding the query")
        try:
            text = path.read_text(encoding="utf-8-sig")  # a BOM is not part of the query
        except (OSError, UnicodeDecodeError) as e:
            raise AdaptcqError(f"cannot read query file {str(path)!r}: {e}") from None
    return text.lstrip("\ufeff")


def query_files(items: list[str] | None) -> list[Path]:
    """The files ``--sql @FILE`` reads the queries from (outputs must not overwrite them)."""
    return [Path(t[1:]) for t in items or [] if t.startswith("@") and t[1:].strip()]


def parse_inputs(items: list[str]) -> dict[str, str]:
    """``--input NAME=PATH`` (repeated) as {NAME: PATH}."""
    out = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise AdaptcqError(f"--input {item!r}: expected NAME=PATH, e.g. --input R=r.parquet")
        if name in out:
            raise AdaptcqError(f"--input {name} is given twice")
        out[name] = path
    return out


def parse_orders(items: list[str]) -> dict[str, list[str]]:
    """``--order STREAM:S2,S3,...`` (repeated) as {STREAM: [S2, S3, ...]}. An empty item
    beside named streams (``R:S,,T``, ``R:S,T,``, ``R:,S,T``) is refused, naming its
    position: dropping it ran an order other than the one typed, perhaps with a stream
    left out by mistake. Items all empty (``R:,``) are the empty order, which the engine
    refuses naming the streams it needs (or takes, for a query of one stream)."""
    out = {}
    for item in items:
        stream, sep, rest = item.partition(":")
        if not sep or not stream or not rest:
            raise AdaptcqError(f"--order {item!r}: expected STREAM:S2,S3,..., e.g. --order R:S,T")
        names = [s.strip() for s in rest.split(",")]
        empty = [k for k, s in enumerate(names, 1) if not s]
        if len(empty) == len(names):
            names = []
        elif empty:
            where = ", ".join(map(str, empty))
            raise AdaptcqError(f"--order {item!r}: item{'s' if len(empty) > 1 else ''} "
                               f"{where} of the list after '{stream}:' "
                               f"{'are' if len(empty) > 1 else 'is'} empty; expected "
                               "STREAM:S2,S3,... with a stream between every two commas, "
                               "e.g. --order R:S,T")
        if stream in out:
            raise AdaptcqError(f"--order {stream}:... is given twice; give each pipeline once")
        out[stream] = names
    return out


def _flag(action: argparse.Action) -> str:
    """An option as ``--help`` names it (its longest spelling), or a positional's name."""
    if action.option_strings:
        return max(action.option_strings, key=len)
    return action.metavar or action.dest


def _refuse_empty(parser: argparse.ArgumentParser, action: argparse.Action, values) -> None:
    """An empty (or blank) text value is refused, naming the option: argparse passes it
    on, and the option's use would then skip it (``if args.tree:``) or misread it (an
    empty path is the current folder)."""
    for value in values if isinstance(values, list) else [values]:
        if isinstance(value, str) and not value.strip():
            what = action.metavar or action.dest.upper()
            parser.error(f"{_flag(action)} {value!r}: the value is empty; give {what}")


class _StoreOnce(argparse._StoreAction):
    """A single-valued option: given twice it is refused, naming it (argparse would keep
    the last value silently, ``--executor mjoin --executor xjoin`` running xjoin). Every
    spelling counts: ``--opt=value`` and the prefixes argparse accepts (``--exec``)."""

    def __call__(self, parser, namespace, values, option_string=None):
        _refuse_empty(parser, self, values)
        if self.option_strings:
            given = getattr(parser, "_given_once", None)
            if given is None:
                given = parser._given_once = {}
            if self.dest in given:
                parser.error(f"{_flag(self)} is given twice ({_shown(given[self.dest])}, then "
                             f"{_shown(values)}); give it once")
            given[self.dest] = values
        super().__call__(parser, namespace, values, option_string)


class _AppendChecked(argparse._AppendAction):
    """A repeatable option (``--input``, ``--sql``, ...): an empty value is refused."""

    def __call__(self, parser, namespace, values, option_string=None):
        _refuse_empty(parser, self, values)
        super().__call__(parser, namespace, values, option_string)


def _shown(value) -> str:
    return " ".join(map(str, value)) if isinstance(value, list) else str(value)


class Parser(argparse.ArgumentParser):
    """Usage errors are one line and exit 1, like every other error. A single-valued
    option given twice, and an empty value, are usage errors (``_StoreOnce``,
    ``_AppendChecked``)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.register("action", None, _StoreOnce)
        self.register("action", "store", _StoreOnce)
        self.register("action", "append", _AppendChecked)

    def parse_known_args(self, args=None, namespace=None):
        self._given_once = {}  # the single-valued options given in this parse (_StoreOnce)
        return super().parse_known_args(args, namespace)

    def error(self, message: str):
        self.exit(1, f"adaptcq: error: {message} (see {self.prog} --help)\n")


QUERYSET_EXECUTORS = ("eddy", "eddies", "pushdown", "pullup")


def routing_options(items: list[str]) -> dict[str, object]:
    """``--routing-option KEY=VALUE`` items as keyword arguments (numbers, true/false, or
    text); the policy refuses unknown keys. A key given twice with different values is
    refused, naming both (a dict kept the last silently)."""
    out: dict[str, object] = {}
    typed: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise AdaptcqError(f"--routing-option {item!r}: expected KEY=VALUE")
        if key == "seed":  # make_routing takes the seed once, from --seed
            raise AdaptcqError(f"--routing-option {item!r}: give the seed with --seed")
        parsed = _routing_value(value)
        if key in out and (out[key] != parsed  # (true is not 1)
                           or isinstance(out[key], bool) != isinstance(parsed, bool)):
            raise AdaptcqError(f"--routing-option {key} is given twice ({typed[key]}, then "
                               f"{item}); give it once")
        out[key], typed[key] = parsed, item
    return out


def _routing_value(value: str) -> object:
    """A ``--routing-option`` value: true/false, an int, a float, else the text."""
    low = value.lower()
    if low in ("true", "false"):
        return low == "true"
    try:
        return int(value)
    except ValueError:
        try:
            return float(value)
        except ValueError:
            return value


# How the inputs are read: options of ``adaptcq run`` that ``adaptcq explain`` shares, so
# that it reads (and rejects) the rows a run would (add_input_argument).
INPUT_ARGUMENTS: dict[str, dict] = {
    "--timestamp-unit": {"choices": ["s", "ms", "us", "ns"],
                         "help": "unit of a numeric timestamp column (default: s); "
                         "timestamp-typed columns carry their own"},
    "--sign": {"help": "column holding +1/-1 (explicit deletions; unbounded streams)"},
    "--allowed-lateness": {"type": float, "default": None, "metavar": "SECONDS",
                           "help": "rows later than this behind their stream's newest row "
                           "are rejected (default 0)"},
}


def add_input_argument(p: argparse.ArgumentParser, flag: str, **overrides) -> None:
    """One of ``INPUT_ARGUMENTS`` (``overrides``: e.g. run's default, where explain keeps
    None to tell a value given from none)."""
    p.add_argument(flag, **{**INPUT_ARGUMENTS[flag], **overrides})


def add_run_arguments(r: argparse.ArgumentParser) -> None:
    """The options of ``adaptcq run``."""
    r.add_argument("--sql", action="append", default=None,
                   help="the CQL query text, or @FILE to read it from a file; repeat it for "
                   "several queries on one engine (--executor eddy, eddies, pushdown, pullup)")
    r.add_argument("--input", action="append", default=[], metavar="NAME=PATH",
                   help="a stream's input file (Parquet or CSV); repeat for each stream")
    r.add_argument("--timestamp", default="ts", help="the timestamp column (default: ts)")
    add_input_argument(r, "--timestamp-unit")
    r.add_argument("--executor", default="auto",
                   choices=["auto", "vector", "mjoin", "xjoin", "acaching", "tree", "shed",
                            *QUERYSET_EXECUTORS],
                   help="auto (default): the vectorized executor whenever the query and "
                   "options allow it, else mjoin (the summary says why); vector: MJoin's "
                   "results a batch at a time over columns (docs/vector.md); mjoin, xjoin: "
                   "a tuple at a time; acaching: MJoin with adaptive join-subresult caches "
                   "(A-Caching); tree: a plan of m-way stateful operators whose partition "
                   "groups can be spilled to disk (state-spill.txt, docs/spill.md); shed: "
                   "the load-shedding join (load-shedding.txt, docs/shedding.md; two "
                   "streams, or MJoin pipelines for more; the one that evaluates OVERLAP "
                   "and the other set conditions); eddy: "
                   "many queries in one CACQ eddy over shared state "
                   "(cacq.txt); eddies, pushdown, pullup: its baselines (an eddy per query, "
                   "NiagaraCQ's plans)")
    r.add_argument("--batch-rows", type=int, default=None, metavar="N",
                   help="vectorized executor: arrivals per batch (default 20,000)")
    r.add_argument("--batch-seconds", type=float, default=None, metavar="S",
                   help="vectorized executor: close a batch after S seconds of event time "
                   "(with --batch-rows: whichever comes first)")
    r.add_argument("--routing", choices=["tickets", "lottery", "random", "fixed"],
                   help="the eddy's routing policy (default tickets; cacq.txt §4)")
    r.add_argument("--routing-option", action="append", default=[], metavar="KEY=VALUE",
                   help="a routing policy parameter, e.g. decay=0.9 (docs/cacq-routing.md)")
    r.add_argument("--routing-epoch", type=int, default=None, metavar="ARRIVALS",
                   help="the eddy follows a routing table the policy writes every ARRIVALS "
                   "arrivals, compiled to Python (default 1000); 0: the policy decides "
                   "every routing step (cacq.txt §4's per-tuple lottery)")
    r.add_argument("--queries", metavar="FILE",
                   help="a control stream (Parquet or CSV; columns ts, action, query_id, "
                   "sql; action register or deregister) for --executor eddy and its "
                   "baselines")
    # No default: a --seed that nothing random uses is refused (seed_refusal), even 0.
    r.add_argument("--seed", type=int, default=None,
                   help="seed of what is random in the run (default 0): a randomized eddy "
                   "routing policy, the adaptive policies' profiling samples, --shed random, "
                   "partial and selective, --spill bottom-up and the global strategies")
    r.add_argument("--caches", choices=["prefix", "global"],
                   help="A-Caching candidates: prefix-invariant only, or also the "
                   "globally-consistent ones (a-caching.txt §6)")
    r.add_argument("--cache-memory", type=int, metavar="BYTES",
                   help="A-Caching memory budget for caches (default: unlimited)")
    r.add_argument("--no-cache-verify", action="store_true",
                   help="with --executor acaching: keep every cache change the cost model "
                   "makes, without checking it against the measured CPU (the paper's "
                   "policy; its decisions are then deterministic)")
    r.add_argument("--reopt-interval", type=int, metavar="TUPLES",
                   help="A-Caching re-optimization interval I in tuples (default 10,000)")
    r.add_argument("--mode", default="append", choices=["append", "retract"])
    r.add_argument("--output", help="write the result rows to this file as they are produced "
                   "(Parquet, or CSV / JSON lines by suffix or --format; - for stdout); a "
                   "folder for a query set (--executor eddy ...) and --engine spark")
    r.add_argument("--format", choices=["parquet", "csv", "jsonl"],
                   help="output format (default: from --output's suffix; csv for stdout)")
    r.add_argument("--max-results", type=int, metavar="N",
                   help="stop with an error once the output has N rows (a guard against an "
                   "exploding join)")
    r.add_argument("--rejected", help="write rejected input rows to this file (its format by suffix) "
                   "(default: the output's name with .rejected before its suffix, "
                   "o.csv -> o.rejected.csv, written when there are any)")
    r.add_argument("--order", action="append", default=[], metavar="STREAM:S2,S3,...",
                   help="fix STREAM's MJoin pipeline order")
    r.add_argument("--tree", help="XJoin tree of binary joins, e.g. '((R,S),T)' (default: "
                   "left-deep); with --executor tree, nodes of any number of inputs, e.g. "
                   "'(((A,B,C),D),E)'")
    r.add_argument("--spill", choices=["bottom-up", "local-output", "global-output",
                                       "global-penalty"],
                   help="spill partition groups of the operator tree to disk when its state "
                   "passes --memory, choosing them by this strategy (state-spill.txt §3; "
                   "runs --executor tree)")
    r.add_argument("--memory", metavar="BYTES",
                   help="with --spill: the state budget, e.g. 512MB, 2GiB or 1TB, from 1 byte "
                   "to 8 EiB (state-spill.txt §2.2's model of the state size)")
    r.add_argument("--spill-partitions", type=int, metavar="N",
                   help="partition ids per operator (default 300, state-spill.txt §6.1; at "
                   "most 1,000,000)")
    r.add_argument("--spill-fraction", type=float, metavar="F",
                   help="a spill frees this fraction of the budget (default 0.2)")
    r.add_argument("--spill-check", type=int, metavar="K",
                   help="insertions between two memory checks (default 1,000)")
    r.add_argument("--spill-dir", metavar="DIR",
                   help="folder for the spilled generations (default: a temporary folder)")
    r.add_argument("--spill-sample", type=float, metavar="P",
                   help="fraction of results traced for the global strategies' statistics "
                   "(default 0.1; refused with bottom-up and local-output, which trace none)")
    r.add_argument("--cleanup", choices=["end", "off", "never-while-running"],
                   help="end (default): produce the results the spills held back at the end "
                   "of the input, and while running once memory frees up; "
                   "never-while-running: only at the end; off: leave them in --spill-dir for "
                   "`adaptcq cleanup DIR`")
    r.add_argument("--shed", choices=["none", "random", "partial", "selective"],
                   help="CPU load shedding of a two-way windowed join (load-shedding.txt; "
                   "runs --executor shed): selective (windows kept whole, the basic windows "
                   "that pay processed first), partial (rate adaptation only), random (drop "
                   "random buffered tuples, process the rest fully), none (buffers overflow)")
    r.add_argument("--capacity", metavar="UNITS|wall",
                   help="with --shed: the join's CPU capacity in work units (one tuple "
                   "comparison, index entry or insertion) per second of event time, or wall "
                   "(the CPU time each tuple really takes)")
    r.add_argument("--basic-window", type=float, metavar="SECONDS",
                   help="with --shed: basic window size b (default: a twentieth of the larger "
                   "window, as the paper's 1 s for 20 s windows)")
    r.add_argument("--index", choices=["auto", "none", "hash", "inverted", "inverted-id"],
                   help="with --shed: the window index (auto: hash for an equi-join, none "
                   "for set joins; inverted: time-ordered identifier lists, inverted-id: "
                   "identifier-sorted)")
    r.add_argument("--buffer", type=float, metavar="SECONDS",
                   help="with --shed: input buffer in front of the join (default 1 s)")
    r.add_argument("--utility", metavar="CASE",
                   help="with --shed selective: tuple types and their utilities, as "
                   "\"CASE kind WHEN 'alert' THEN 3 WHEN 'news' THEN 1 ELSE 0.5 END\" over each "
                   "stream's own (unqualified) columns; shedding then maximizes the output's "
                   "utility, a result worth the larger of its tuples' (Algorithm 5)")
    r.add_argument("--no-join-direction", action="store_true",
                   help="with --shed selective: no join direction adaptation (Algorithm 4)")
    r.add_argument("--nested-loop", action="append", default=[], metavar="STREAM[.COLUMN]",
                   help="MJoin: joins into STREAM (or probing its COLUMN) scan its window "
                   "instead of a hash index (a-caching.txt Figure 10)")
    add_input_argument(r, "--sign")
    add_input_argument(r, "--allowed-lateness", default=0.0)
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    r.add_argument("--summary-json", metavar="FILE",
                   help="also write the run summary as JSON (with the memory samples); - for "
                   "stdout when the results do not go there")
    r.add_argument("--optimizer", choices=["dmjoin", "fgreedy", "treeopt", "fab", "qaware"],
                   help="choose the MJoin's plan with this ordering algorithm "
                   "(join-ordering.txt) once online statistics are warm (on Spark: in "
                   "every partition group, over its own data)")
    r.add_argument("--reorder", choices=["agreedy", "off"], default="off",
                   help="adaptive re-ordering at run time: A-Greedy (a-caching.txt §4, [5]; "
                   "on Spark: in every partition group)")
    r.add_argument("--engine", default="local", choices=["local", "spark"],
                   help="local: this process; spark: a partitioned Structured Streaming job")
    r.add_argument("--master", help="Spark master (with --engine spark; default local[*])")
    r.add_argument("--partitions", type=int, default=None,
                   help="number of partition groups P (with --engine spark; default: cores)")
    r.add_argument("--shares", action="append", default=[], metavar="STREAM.COLUMN=P",
                   help="with --engine spark: the share of the attribute class holding "
                   "STREAM.COLUMN (repeat it; classes not named get 1; the product is the "
                   "number of partition groups). Default: chosen from the inputs' sizes")
    r.add_argument("--trigger", type=float, metavar="SECONDS",
                   help="with --engine spark: start a micro-batch every SECONDS (Spark's "
                   "processing-time trigger; default: as soon as the last one ends). With "
                   "--shed and --capacity wall it is the partition groups' CPU budget")
    r.add_argument("--max-files-per-trigger", type=int, metavar="N",
                   help="with --engine spark: read at most N new files of each input per "
                   "micro-batch (a folder of files then arrives over several micro-batches)")
    r.add_argument("--checkpoint", help="Spark checkpoint folder: a restarted run continues "
                   "exactly from it (with --engine spark)")


def run_defaults() -> dict[str, tuple[str, object]]:
    """``adaptcq run``'s options: dest -> (flag, default)."""
    p = Parser(prog="adaptcq run")
    add_run_arguments(p)
    return {a.dest: (a.option_strings[0] if a.option_strings else a.dest, a.default)
            for a in p._actions}


def given_flags(args, dests) -> list[str]:
    """The flags of ``adaptcq run`` among ``dests`` that the command line gave (a value
    other than the default; 0 and "" count as given), in ``--help`` order."""
    return [flag for dest, (flag, default) in run_defaults().items()
            if dest in dests and _given(getattr(args, dest, default), default)]


def _given(value, default) -> bool:
    # ``is`` for False: 0 == False, and --routing-epoch 0 is a value.
    return not (value is None or value is False or value == [] or value == default)


# What each query-set executor uses of ``adaptcq run``'s options on the local engine
# (argparse dests); _run_queryset refuses every other one given, so none is ignored.
# --no-progress: a query set shows no progress bar, so there is nothing to turn off.
_QUERYSET_COMMON = frozenset({
    "command", "help", "sql", "input", "timestamp", "timestamp_unit", "executor", "queries",
    "mode", "output", "allowed_lateness", "rejected", "no_progress", "summary_json",
    "engine"})
# The eddy's routing; NiagaraCQ's plans (pushdown, pullup) are static and route nothing.
QUERYSET_ROUTING = frozenset({"routing", "routing_option", "routing_epoch", "seed"})
QUERYSET_OPTIONS = {"eddy": _QUERYSET_COMMON | QUERYSET_ROUTING,
                    "eddies": _QUERYSET_COMMON | QUERYSET_ROUTING,
                    "pushdown": _QUERYSET_COMMON,
                    "pullup": _QUERYSET_COMMON}


def queryset_misfits(args) -> list[str]:
    """The flags given that ``--executor eddy|eddies|pushdown|pullup`` does not use on the
    local engine (``QUERYSET_OPTIONS``)."""
    used = QUERYSET_OPTIONS[args.executor]
    return given_flags(args, set(run_defaults()) - used)


def cache_options(args) -> dict | None:
    """A-Caching's options from ``--executor acaching --caches --cache-memory
    --reopt-interval`` (the keyword arguments of ``adapt.acaching.ACaching``, which checks
    their values); None without ``--executor acaching``. The cache flags without it are
    an error."""
    if args.executor == "acaching":
        return {"caches": args.caches or "prefix", "memory": args.cache_memory,
                "reopt_interval": 10_000 if args.reopt_interval is None
                else args.reopt_interval, "verify": not args.no_cache_verify,
                # the profiling samples (and the LP selection's rounding)
                **({} if getattr(args, "seed", None) is None else {"seed": args.seed})}
    if args.cache_memory is not None or args.caches is not None or \
            args.reopt_interval is not None or args.no_cache_verify:
        raise AdaptcqError("--caches, --cache-memory, --reopt-interval and --no-cache-verify "
                           "need --executor acaching")
    return None


def adaptivity_spec(args) -> dict | None:
    """What ``--optimizer``, ``--reorder`` and ``--executor acaching`` (with its cache
    options) ask for, as the keyword arguments of ``adapt.make_policies``:
    ``{"optimizer": ..., "reorder": ..., "caching": {...} or None}``; None when no adaptive
    policy is asked for. XJoin with a policy is refused (policies re-order and cache
    MJoin pipelines)."""
    caching = cache_options(args)
    if args.optimizer is None and args.reorder == "off" and caching is None:
        return None
    if args.executor in ("xjoin", "tree", "shed"):  # (A-Caching is MJoin with caches)
        raise AdaptcqError("--optimizer and --reorder order MJoin pipelines; use them with "
                           "--executor mjoin or acaching (--optimizer also with vector or "
                           f"auto), not {args.executor}")
    if args.executor == "auto":
        # auto runs the operator tree for spill options and the load-shedding join for
        # shedding ones (runtime.local.choose_executor); neither runs MJoin's pipelines, and
        # the executor's "cannot be profiled" did not say that auto had chosen it, or why.
        ordering = ordering_flags(args)
        asked = " and ".join(f"{flag} {value}" for flag, value in ordering)
        spill, shed = given_flags(args, _SPILL_DESTS), given_flags(args, _SHED_DESTS)
        if bool(spill) != bool(shed):  # (both: the run refuses the pair, the root cause)
            one = len(spill or shed) == 1
            if spill:
                chosen = "the operator tree (--executor tree)"
                why = (f"ask{'s' if one else ''} to spill state, which only the operator "
                       "tree does")
            else:
                chosen = "the load-shedding join (--executor shed)"
                why = f"{'is' if one else 'are'} the load-shedding join's"
            given = " and ".join(spill or shed)
            raise AdaptcqError(
                f"{asked} order{'s' if len(ordering) == 1 else ''} MJoin pipelines, but "
                f"--executor auto runs {chosen} here, because {given} {why}; a policy cannot "
                "order or profile that executor: drop "
                f"{' and '.join(flag for flag, _ in ordering)}, or drop {given}")
    if args.executor == "vector" and (args.reorder != "off" or caching is not None):
        raise AdaptcqError("--executor vector orders its pipelines per batch (--optimizer "
                           "chooses the algorithm); --reorder agreedy and caches act between "
                           "two tuples: use --executor mjoin or acaching")
    return {"optimizer": args.optimizer, "reorder": args.reorder, "caching": caching}


def parse_shares(items: list[str]) -> dict[str, int]:
    """``--shares S.b=4`` (repeated) as {"S.b": 4}. A column given twice with different
    shares is refused, naming both (``runtime.spark_split.plan_split`` refuses two columns
    of one attribute class given different shares)."""
    out: dict[str, int] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip() or not value.strip().isdigit() or int(value) < 1:
            raise AdaptcqError(f"--shares {item!r}: expected STREAM.COLUMN=P with P a whole "
                               "number >= 1 (e.g. --shares S.b=4)")
        name = name.strip()
        if out.get(name, int(value)) != int(value):
            raise AdaptcqError(f"--shares {name} is given twice ({name}={out[name]}, then "
                               f"{name}={int(value)}); give it once")
        out[name] = int(value)
    return out


def check_partitions(partitions: int | None) -> None:
    """``--partitions P``: a whole number from 1 to ``optimizer.shares.MAX_GROUPS`` (more
    groups than any cluster has cores; the split and the groups' keys are planned on the
    driver), refused naming the flag. None: not given."""
    from adaptcq.optimizer.shares import check_groups
    if partitions is None:
        return
    if partitions < 1:
        raise AdaptcqError(f"--partitions must be >= 1, got {partitions}")
    check_groups(partitions, f"--partitions {partitions:,}", AdaptcqError)


# ``spill_options``' keys (``runtime.spill``'s) -> the ``adaptcq run`` flag that sets each:
# messages name the flag typed, not the key (--spill-partitions is not Spark's --partitions).
SPILL_FLAGS = {"strategy": "--spill", "memory": "--memory", "partitions": "--spill-partitions",
               "fraction": "--spill-fraction", "every": "--spill-check",
               "directory": "--spill-dir", "sample": "--spill-sample", "cleanup": "--cleanup"}


def spill_options(args) -> dict | None:
    """``--spill --memory --spill-*`` and ``--cleanup`` as the ``spill`` option of a local
    run (``runtime.spill``); None when none is given. They need the operator tree."""
    given = {"strategy": args.spill, "memory": args.memory,
             "partitions": args.spill_partitions, "fraction": args.spill_fraction,
             "every": args.spill_check, "directory": args.spill_dir,
             "sample": args.spill_sample}
    spill = {k: v for k, v in given.items() if v is not None}
    if args.cleanup is not None:
        spill["cleanup"] = "end" if args.cleanup == "never-while-running" else args.cleanup
        if args.cleanup == "never-while-running":
            spill["when_free"] = False
    if not spill:
        return None
    if args.executor not in ("auto", "tree"):
        flags = ", ".join(SPILL_FLAGS[k] for k in SPILL_FLAGS
                          if (args.cleanup if k == "cleanup" else given[k]) is not None)
        raise AdaptcqError(f"{flags}: spilling is done by the operator tree "
                           f"(--executor tree), not by --executor {args.executor}")
    if getattr(args, "seed", None) is not None:
        spill["seed"] = args.seed  # bottom-up's random choice, the global strategies' sample
    return spill


def shed_options(args) -> dict | None:
    """``--shed --capacity --basic-window --index --buffer --no-join-direction`` as the
    ``shed`` option of a local run (``runtime.shed``); None when none is given."""
    given = {"mode": args.shed, "capacity": args.capacity,
             "basic_window": args.basic_window, "index": args.index, "buffer": args.buffer,
             "utility": args.utility}
    shed = {k: v for k, v in given.items() if v is not None}
    if args.no_join_direction:
        shed["direction"] = False
    if shed and getattr(args, "seed", None) is not None:
        shed["seed"] = args.seed  # the sampling and random drops
    return shed or None


_SHED_DESTS = ("shed", "capacity", "basic_window", "index", "buffer", "utility",
               "no_join_direction")
_SPILL_DESTS = ("spill", "memory", "spill_partitions", "spill_fraction", "spill_check",
                "spill_dir", "spill_sample", "cleanup")


def ordering_flags(args) -> list[tuple[str, str]]:
    """(flag, value) of ``--optimizer`` and ``--reorder`` where given (not off): the options
    that order MJoin pipelines, as the refusals that concern them name them."""
    return [(flag, value) for flag, value in (("--optimizer", args.optimizer),
                                              ("--reorder", args.reorder))
            if value not in (None, "off")]


def seed_refusal(args) -> str | None:
    """Why ``--seed`` would seed nothing in this single-query run (the message refusing
    it), or None when it is not given or something random uses it: the load-shedding
    join's drops and samples (--shed random, partial, selective; --index inverted-id's
    random identifiers only order its lists, which changes nothing), the spill policy's random choice and lineage sample (--spill
    bottom-up, global-output, global-penalty), the adaptive policies' profiling samples
    (--executor acaching, --reorder agreedy, --optimizer with --executor mjoin, or with
    --executor auto when it falls back to MJoin). The vectorized executor's per-batch
    ordering counts exactly and samples nothing; whether auto falls back is known once
    the query and the inputs' types are (``runtime.local.LocalRun`` then refuses a seed
    the vectorized executor would not use)."""
    if getattr(args, "seed", None) is None:
        return None
    ex = args.executor
    if ex == "shed" or given_flags(args, _SHED_DESTS):
        mode = args.shed or "none"
        if mode in ("random", "partial", "selective"):
            return None
        why = f"--shed {mode} drops and samples no tuple at random"
    elif ex == "tree" or given_flags(args, _SPILL_DESTS):
        if args.spill in ("bottom-up", "global-output", "global-penalty"):
            return None
        why = ("--spill local-output ranks partition groups deterministically" if args.spill
               else "the operator tree without --spill chooses nothing at random")
    elif ex == "acaching" or args.reorder == "agreedy" or \
            (args.optimizer and ex in ("mjoin", "auto")):
        return None  # (auto: the run decides, see above)
    elif args.optimizer:
        why = (f"--optimizer with --executor {ex} orders the vectorized executor's batches "
               "from exact counts; --executor mjoin profiles a seeded sample")
    elif ex == "xjoin":
        why = "--executor xjoin computes exact results over a fixed tree"
    else:
        why = f"--executor {ex} without adaptive policies computes exact results"
    return (f"--seed {args.seed}: nothing random in this run uses it ({why}); it seeds "
            "eddy routing, the adaptive policies' profiling samples, --shed random, partial "
            "and selective, and --spill bottom-up, global-output and global-penalty")


def sql_where(k: int, text: str) -> str:
    """The ``k``-th ``--sql`` of a query set (query ``qk``), with its file for ``@FILE``, as an
    error about that query names it: ``--sql #3 (query q3, file bad.sql)``."""
    file = f", file {text[1:]}" if text.startswith("@") else ""
    return f"--sql #{k} (query q{k}{file})"
