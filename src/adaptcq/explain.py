"""``adaptcq explain``: the join graph, each ordering algorithm's plan and cost.

For a query and statistics — given (``--stats FILE``) or measured by running the query over
a prefix of its inputs with the Profiler (``stats.profiler``, a-caching.txt App. A) — print
the join graph's shape (join-ordering.txt §1.2), its edges with σ, every algorithm's
pipelines (one line per start stream) and plan cost (Eq. 1–3, ``optimizer.plan_cost``),
which algorithm Q-Aware chose (§6) and the optimum (DMJoin, §3.1) where it is tractable,
with each algorithm's ratio to it.

The statistics file is JSON::

    {"rates": {"R": 10, "S": 20, "T": 5},          # λ per stream (tuples per second)
     "selectivities": {"R,S": 0.1, "S,T": 0.5},    # σ per joined pair, keyed "A,B"
     "window": 2,                                  # W in seconds (optional with equal
                                                   #   [RANGE w] windows: w is used)
     "costs": {"insert": 1, "delete": 1, "join": 1}}  # optional unit costs (Table 1)

Every stream of the query needs a rate, every joined pair (an edge of the query's join
graph) a selectivity; names are the query's stream aliases. Values are JSON numbers (not
booleans or strings; NaN and Infinity are not JSON), finite, rates and the window > 0, σ in
(0, 1] (a fraction of the pairs that join), unit costs >= 0; statistics under which a plan
could cost more than ``COST_LIMIT`` (a float near its end) are refused, naming the largest
rate, and so are those under which a window's state λ·W, or a probe's matches σ·λ·W, is
below the smallest normal float (``_check_state_range``), naming the statistics.
``--engine spark --partitions P --stats FILE`` reads the same file and uses its rates.

``--code`` prints the Python source generated for every MJoin pipeline of the query
(``MJoin.pipeline_sources``, engine/codegen.py), for the default orders or the ones given
with ``--order`` (and ``--nested-loop``, ``--mode``); it needs no statistics. ``--caches``
shows A-Caching's candidates for the same pipelines (those ``adaptcq run --executor
acaching`` with these options would consider).

With ``--input`` the inputs are read as ``adaptcq run`` reads them (``--timestamp``,
``--timestamp-unit``, ``--allowed-lateness``, ``--sign``: ``cliargs.INPUT_ARGUMENTS``), and
the rows it would reject are counted in the report, by reason and stream.

Each kind of report uses some of the options (``_uses``: the eddy, the vectorized
executor, the split into partition groups, the load-shedding join, --code alone, plans for
--stats, plans for --input); one given that the report does not use is refused with the
reason (``refuse_unused``), never ignored. A reader closing stdout (``| head``) ends
explain quietly, with status 0.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
from pathlib import Path

from adaptcq.cliargs import add_input_argument, parse_inputs, parse_orders, sql_arg, sql_where
from adaptcq.errors import AdaptcqError
from adaptcq.plain import say

DEFAULT_TIMESTAMP = "ts"
DEFAULT_PREFIX = 200_000


def _timestamp(args) -> str:
    return getattr(args, "timestamp", None) or DEFAULT_TIMESTAMP


def _prefix(args) -> int:
    n = getattr(args, "prefix", None)
    return DEFAULT_PREFIX if n is None else n


def _reading(args) -> dict:
    """How the inputs are read (``--timestamp-unit``, ``--allowed-lateness``, ``--sign``),
    as ``runtime.local.prepare``'s keyword arguments: the rows a run would read and
    reject."""
    lateness = getattr(args, "allowed_lateness", None)
    return {"sign": getattr(args, "sign", None),
            "allowed_lateness": 0.0 if lateness is None else lateness,
            "timestamp_unit": getattr(args, "timestamp_unit", None)}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sql", required=True, action="append",
                   help="the CQL query text, or @FILE (repeat it with --executor eddy)")
    p.add_argument("--input", action="append", default=[], metavar="NAME=PATH",
                   help="measure statistics by running over these inputs")
    p.add_argument("--timestamp", default=None,
                   help="the inputs' time column (default ts); with --input")
    for flag in ("--timestamp-unit", "--allowed-lateness", "--sign"):  # as adaptcq run's
        add_input_argument(p, flag)
    p.add_argument("--stats", metavar="FILE",
                   help="JSON statistics: {rates: {S: λ}, selectivities: {'R,S': σ}, window: W}")
    p.add_argument("--prefix", type=int, default=None,
                   help="measure statistics over at most this many input rows (default "
                   f"{DEFAULT_PREFIX:,}); with --input")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--caches", choices=["prefix", "global"],
                   help="also run A-Caching over the measured prefix and show its candidate "
                   "caches (a-caching.txt §4.2, §6) with benefit and cost, and which it uses; "
                   "for the pipelines of --order, --nested-loop and --mode, as adaptcq run "
                   "--executor acaching with them")
    c = p.add_argument_group("generated code (--code)")
    c.add_argument("--code", action="store_true",
                   help="print the generated Python source of every MJoin pipeline (for the "
                   "default orders, or --order); needs no statistics")
    c.add_argument("--order", action="append", default=[], metavar="STREAM:S2,S3,...",
                   help="with --code or --caches: STREAM's pipeline order (as adaptcq run "
                   "--order)")
    c.add_argument("--nested-loop", action="append", default=[], metavar="STREAM[.COLUMN]",
                   help="with --code or --caches: joins into STREAM scan its window (as "
                   "adaptcq run)")
    c.add_argument("--mode", choices=["append", "retract"],
                   help="with --code or --caches: retract also has deletion pipelines "
                   "(default append)")
    c.add_argument("--executor", choices=["mjoin", "xjoin", "acaching", "eddy", "vector",
                                          "shed"],
                   help="with --code: the executor adaptcq run would use (mjoin; xjoin has "
                   "no generated pipelines); eddy: run the queries (repeat --sql) in one "
                   "CACQ eddy over the first --prefix input rows and show its shared "
                   "operators, virtual sources, tickets and each query's mask; vector: the "
                   "vectorized executor's pipelines, and with --input the statistics it "
                   "measured over the first --prefix rows and the orders it chose per batch; "
                   "shed: the load-shedding join's plan (chosen for any query with a set "
                   "join condition)")
    c.add_argument("--batch-rows", type=int, default=None, metavar="N",
                   help="with --executor vector --input: arrivals per batch (as adaptcq run)")
    c.add_argument("--routing", choices=["tickets", "lottery", "random", "fixed"],
                   help="with --executor eddy: the routing policy (default tickets)")
    c.add_argument("--engine", choices=["local", "spark"],
                   help="with --code: the engine adaptcq run would use (local); spark with "
                   "--partitions P: show how the query is split into P partition groups")
    s = p.add_argument_group("Spark partition groups (--engine spark --partitions P)")
    s.add_argument("--partitions", type=int,
                   help="the number of partition groups P: show the shares of each attribute "
                   "class, each stream's replication and the tuples shipped (rates from "
                   "--stats, or the row counts of --input, or equal)")
    s.add_argument("--shares", action="append", default=[], metavar="STREAM.COLUMN=P",
                   help="show these shares instead of the chosen ones (as adaptcq run)")


# ----- statistics ----------------------------------------------------------------------------
COST_LIMIT = 1e300
"""The largest plan cost the statistics may lead to (``_check_cost_range``): floats end
near 1.8e308, and Eq. 2 multiplies λ·W once per join of a pipeline, so a statistics file
whose worst plan could cost more is refused rather than run into inf (and DMJoin, whose
candidates all become inf, into finding no order)."""


def load_stats(path: str) -> object:
    """The parsed JSON of the statistics file ``path``; a missing, unreadable or invalid
    file, or a folder, is an ``AdaptcqError`` naming it. A key given twice in one object
    (a rate, ``"R,S"``, a whole section) is refused, naming it and where: JSON readers
    keep one of the values silently (Python's the last), as ``"R,S"`` with ``"S,R"`` is
    refused in ``_other_stats``."""
    p = Path(path)
    if not p.exists():
        raise AdaptcqError(f"statistics file {str(p)!r} does not exist")
    if p.is_dir():
        raise AdaptcqError(f"statistics file {str(p)!r} is a folder; give the JSON file")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise AdaptcqError(f"statistics file {str(p)!r} is not UTF-8 text (JSON expected)") \
            from None
    except OSError as e:
        raise AdaptcqError(f"cannot read statistics file {str(p)!r}: {e.strerror or e}") \
            from None
    try:
        data = json.loads(text, parse_constant=_no_constant, object_pairs_hook=_Pairs)
    except json.JSONDecodeError as e:
        raise AdaptcqError(f"statistics file {str(p)!r} is not valid JSON: {e.msg} "
                           f"(line {e.lineno}, column {e.colno})") from None
    except ValueError as e:  # NaN, Infinity (not JSON, though Python's reader takes them)
        raise AdaptcqError(f"statistics file {str(p)!r} is not valid JSON: {e}") from None
    twice = _given_twice(data, "")
    if twice is not None:
        where, key, values = twice
        shown = ", then ".join(json.dumps(v) for v in values)
        times = "twice" if len(values) == 2 else f"{len(values)} times"
        raise AdaptcqError(f"statistics file {str(p)!r}: {where}{json.dumps(key)} is given "
                           f"{times} ({shown}); give it once")
    return data


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


class _Pairs(dict):
    """A JSON object (``object_pairs_hook``) that remembers the keys given more than once,
    with every value given, in order (``twice``); as a dict it holds the last, as
    ``json.loads`` would."""

    def __init__(self, pairs):
        super().__init__(pairs)
        seen: dict = {}
        for k, v in pairs:
            seen.setdefault(k, []).append(v)
        self.twice = {k: vs for k, vs in seen.items() if len(vs) > 1}


def _given_twice(data, where: str) -> tuple[str, str, list] | None:
    """The first key given twice in ``data`` (parsed with ``_Pairs``), depth first in
    file order: (where, e.g. ``"in rates: "``, key, its values), or None."""
    if isinstance(data, list):
        for k, item in enumerate(data):
            got = _given_twice(item, f"{where.removesuffix(': ')}[{k}]: ".lstrip())
            if got is not None:
                return got
        return None
    if not isinstance(data, dict):
        return None
    twice = getattr(data, "twice", {})
    for key, value in data.items():
        if key in twice:
            return (f"in {where}" if where else ""), key, twice[key]
        got = _given_twice(value, f"{where.removesuffix(': ')}{'.' if where else ''}{key}: ")
        if got is not None:
            return got
    return None


def _number(where: str, value, *, low: str = "positive", at_most_one: bool = False) -> float:
    """``value`` of the statistics as a float: a JSON number (not a boolean, not a string),
    finite, and > 0 (``low="positive"``) or >= 0 (``"non-negative"``), and <= 1 with
    ``at_most_one``; otherwise an error naming ``where``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise AdaptcqError(f"statistics: {where} must be a number, got {json.dumps(value)}")
    try:
        v = float(value)
    except OverflowError:  # an integer beyond the float range
        raise AdaptcqError(f"statistics: {where} must be finite, got an integer of "
                           f"{len(str(abs(value)))} digits") from None
    if not math.isfinite(v):
        raise AdaptcqError(f"statistics: {where} must be finite, got {value}")
    bad = v < 0 or (v == 0 and low == "positive") or (at_most_one and v > 1)
    if bad:
        want = "in (0, 1]" if at_most_one else "> 0" if low == "positive" else ">= 0"
        raise AdaptcqError(f"statistics: {where} must be {want}, got {value}")
    return v


def _check_stats_object(data) -> None:
    if not isinstance(data, dict):
        raise AdaptcqError("statistics must be a JSON object with 'rates' and "
                           "'selectivities'")
    unknown_keys = sorted(set(data) - {"rates", "selectivities", "window", "costs"})
    if unknown_keys:
        raise AdaptcqError(f"statistics: unknown key(s) {', '.join(unknown_keys)}; expected "
                           "rates, selectivities, window, costs")


def rates_from_json(query, data) -> dict[str, float]:
    """λ per stream alias of a statistics file's parsed JSON: every stream of ``query`` and
    no other, each a finite number > 0."""
    _check_stats_object(data)
    aliases = list(query.aliases)
    rates = data.get("rates")
    if not isinstance(rates, dict):
        raise AdaptcqError("statistics: 'rates' must map each stream to its rate λ")
    for s in rates:
        if s not in aliases:
            raise AdaptcqError(f"statistics: rates name stream {s!r}, which is not in the "
                               f"query (streams: {', '.join(aliases)})")
    missing = [a for a in aliases if a not in rates]
    if missing:
        raise AdaptcqError(f"statistics: no rate for stream {', '.join(missing)}")
    return {a: _number(f"the rate of {a} (rates.{a})", rates[a]) for a in aliases}


def _other_stats(query, data) -> tuple[dict, float | None, dict]:
    """The selectivities (by pair), window (None when not given) and unit costs of a
    statistics file's parsed JSON, each value checked; every key named is checked against
    ``query``, but none is required."""
    aliases = list(query.aliases)
    sels = data.get("selectivities", {})
    if not isinstance(sels, dict):
        raise AdaptcqError("statistics: 'selectivities' must map \"A,B\" to σ")
    edges = {frozenset(e) for e in query.join_edges()}
    sel = {}
    for key, sigma in sels.items():
        parts = [x.strip() for x in str(key).split(",")]
        if len(parts) != 2 or not all(parts) or parts[0] == parts[1]:
            raise AdaptcqError(f"statistics: selectivity key {key!r} must name two "
                               "different streams as \"A,B\"")
        for s in parts:
            if s not in aliases:
                raise AdaptcqError(f"statistics: selectivity {key!r} names stream {s!r}, "
                                   f"which is not in the query (streams: {', '.join(aliases)})")
        pair = frozenset(parts)
        if pair not in edges:
            raise AdaptcqError(f"statistics: the query has no join predicate between "
                               f"{parts[0]} and {parts[1]}, so {key!r} has no selectivity")
        if pair in sel:
            raise AdaptcqError(f"statistics: the selectivity of {parts[0]},{parts[1]} is "
                               "given twice")
        # σ is a fraction of the pairs that join (join-ordering.txt §2.1): in (0, 1]
        sel[pair] = _number(f"the selectivity σ of {key!r} (selectivities)", sigma,
                            at_most_one=True)
    window = data.get("window")
    if window is not None:
        window = _number("'window' (W, seconds)", window)
    costs = data.get("costs", {})
    if not isinstance(costs, dict) or set(costs) - {"insert", "delete", "join"}:
        raise AdaptcqError("statistics: 'costs' may give insert, delete and join unit costs")
    costs = {k: _number(f"the unit cost costs.{k}", v, low="non-negative")
             for k, v in costs.items()}
    return sel, window, costs


def graph_from_json(query, data) -> object:
    """The ``JoinGraph`` of a statistics file's parsed JSON, checked against ``query``:
    a rate for every stream, a selectivity for every joined pair, the window (given, or
    the streams' common [RANGE w]); numbers only, finite, rates and the window > 0, σ in
    (0, 1], unit costs >= 0, no plan costing more than ``COST_LIMIT`` and no λ·W or σ·λ·W
    below the smallest normal float."""
    from adaptcq.adapt.graph import common_range
    from adaptcq.optimizer import JoinGraph

    rates = rates_from_json(query, data)
    sel, window, costs = _other_stats(query, data)
    for e in sorted({frozenset(e) for e in query.join_edges()}, key=sorted):
        if e not in sel:
            a, b = sorted(e)
            raise AdaptcqError(f"statistics: no selectivity for the join of {a} and {b}; "
                               f"give \"{a},{b}\"")
    where = "'window'"
    if window is None:
        window = common_range(query)
        where = "the query's [RANGE w] window"
        if window is None:
            raise AdaptcqError("statistics: give 'window' (W, seconds): the query's streams "
                               "do not all have the same [RANGE w] window")
    _check_cost_range(rates, window, costs, where)
    _check_state_range(rates, sel, window, where)
    return JoinGraph(rates, sel, window=window,
                     **{f"c_{k}": v for k, v in costs.items()})


def _check_cost_range(rates: dict, window: float, costs: dict, where: str) -> None:
    """Refuse statistics under which a plan could cost more than ``COST_LIMIT``.

    A pipeline of start stream s has, after joining a set X of the others, at most
    P_X <= λ_s·Π_{j∈X} max(1, λ_j·W) tuples (σ <= 1; DMJoin computes P_X for every subset
    X, so no σ can be counted on), each probe of Eq. 2 costs at most that times C_join, so
    a pipeline costs at most (n + 1)·c·λ_s·Π_{j≠s} max(1, λ_j·W), c the largest unit cost
    (or 1), and a plan n times the largest pipeline. Computed in logarithms, so that it
    cannot overflow itself."""
    n = len(rates)
    logs = {s: math.log10(lam) for s, lam in rates.items()}
    state = {s: max(0.0, v + math.log10(window)) for s, v in logs.items()}  # log max(1, λW)
    total = sum(state.values())
    worst = max(logs, key=lambda s: logs[s] + total - state[s])
    unit, c = max(costs.items(), key=lambda kv: kv[1], default=("", 1.0))
    bound = (math.log10(n * (n + 1)) + logs[worst] + total - state[worst]
             + math.log10(max(1.0, c)))
    if bound > math.log10(COST_LIMIT):
        big = max(rates, key=rates.get)
        costs_text = f" and costs.{unit} = {c:g}" if c > 1 else ""
        raise AdaptcqError(
            f"statistics: the rates (the largest rates.{big} = {rates[big]:g}), {where} = "
            f"{window:g}{costs_text} are too large for the cost model: a plan over {n} "
            f"streams could cost up to about 1e{bound:.0f} per second (Eq. 2 multiplies by "
            f"λ·W, the tuples in a window, once per join), beyond the {COST_LIMIT:.0e} that "
            "keeps every cost a finite float")


def _check_state_range(rates: dict, sel: dict, window: float, where: str) -> None:
    """Refuse statistics under which a window's state λ·W, or a join's output per probe
    σ·λ·W, is below the smallest normal float (``sys.float_info.min``, about 2.2e-308):
    the cost model divides by them (TreeOpt's ranks) and compares their products, which
    would be 0 or have lost their precision. Computed in logarithms, like
    ``_check_cost_range``."""
    floor = math.log10(sys.float_info.min)
    w = math.log10(window)
    for s, lam in rates.items():
        if math.log10(lam) + w < floor:
            raise AdaptcqError(
                f"statistics: rates.{s} = {lam:g} and {where} = {window:g} are too small for "
                f"the cost model: the state of {s}'s window, λ·W, would be about "
                f"1e{math.log10(lam) + w:.0f}, below the smallest float "
                f"({sys.float_info.min:.1e})")
    for pair, sigma in sel.items():
        for s in sorted(pair):
            if math.log10(sigma) + math.log10(rates[s]) + w < floor:
                a, b = sorted(pair)
                raise AdaptcqError(
                    f"statistics: the selectivity σ of \"{a},{b}\" = {sigma:g}, rates.{s} = "
                    f"{rates[s]:g} and {where} = {window:g} are too small for the cost "
                    f"model: the matches of a probe into {s}'s window, σ·λ·W, would be "
                    f"about 1e{math.log10(sigma) + math.log10(rates[s]) + w:.0f}, below the "
                    f"smallest float ({sys.float_info.min:.1e})")


def _check_split_range(rates: dict, groups: int) -> None:
    """Refuse rates under which the tuples shipped to ``groups`` partition groups
    (Σ λ_s·replicas_s <= n·P·λ_max, ``optimizer.shares.shipped``) could exceed
    ``COST_LIMIT``."""
    big = max(rates, key=rates.get)
    if math.log10(len(rates) * max(1, groups)) + math.log10(rates[big]) > \
            math.log10(COST_LIMIT):
        raise AdaptcqError(f"statistics: the rate of {big} (rates.{big}) = {rates[big]:g} "
                           f"is too large: the tuples shipped to {groups} groups would pass "
                           f"{COST_LIMIT:.0e} per second")


def measure(sql: str, sources: dict, timestamp: str, prefix: int, p: float | None = None,
            rejected: list | None = None, **reading):
    """Run the query over at most ``prefix`` input rows with the Profiler attached and
    return (query, join graph from the measured statistics, ``PrefixStats``, rows used).
    The inputs are read as ``adaptcq run`` reads them (``reading``: ``sign``,
    ``allowed_lateness``, ``timestamp_unit``); the rows it rejects are appended to
    ``rejected`` (dicts with ``stream`` and ``reason``).

    The statistics cover the whole prefix, as the report says ("measured over the first
    N input rows"): λ is each stream's insertions (past its selection) over the prefix's
    event-time span, and σ averages every profiled tuple of the prefix (the Profiler's W
    is the prefix). A running policy's Profiler averages its W = 10 latest (a-caching.txt
    Table 1, §7.1) to follow change; here that was the last ~5% of the prefix, and a
    stream whose rows ended before the others' got λ = 1e-09. The state sizes are those
    at the end of the prefix: an average over it would count the windows while they
    filled from empty (an unbounded stream's state at half its size)."""
    from adaptcq.adapt.graph import join_graph_from_stats
    from adaptcq.stats.profiler import Profiler

    prepared = _prepared(sql, sources, timestamp, reading, rejected, prefix)
    n = min(len(prepared.rows), max(0, prefix))
    if n == 0:
        raise AdaptcqError("no input rows to measure statistics on"
                           + (f" ({len(rejected):,} rejected)" if rejected else ""))
    # Profile about 2,000 tuples whatever the prefix (at least 1 in 50); W = n holds
    # every profiled tuple and every tick (at most one per arrival).
    profiler = Profiler(W=n, p=p if p is not None else min(1.0, max(0.02, 2000 / n)),
                        interval=max(1, n // 200))
    cq = _replay(prepared, n, profiler, rejected)
    # A stream none of whose rows were profiled (none arrived, or its selection passed
    # none) is reported, not refused, as adaptcq run runs the query: its λ is what was
    # measured (0: no state) and its σ's are not measured (join_graph_from_stats takes 1).
    starved = [a for a, k in profiler.observations_at_start().items() if k == 0]
    unmeasured = _starved(prepared, cq, n, prefix, starved) if starved else ""
    if profiler.query is None:
        raise AdaptcqError(f"too few profiled tuples to measure statistics in the first "
                           f"{n:,} input rows; give a larger --prefix or --stats FILE")
    times = prepared.timestamps[:n]
    start, end = (float(t) * prepared.time_unit for t in (times.min(), times.max()))
    if not end > start:
        raise AdaptcqError("cannot measure stream rates: the input's timestamps do not "
                           "advance over the prefix; give --stats FILE")
    aliases = prepared.query.aliases
    stats = PrefixStats(profiler, dict(zip(aliases, cq.per_stream, strict=True)), start, end,
                        {a: len(stem) for a, stem in zip(aliases, cq.executor.stems,
                                                         strict=True)}, unmeasured)
    return prepared.query, join_graph_from_stats(prepared.query, stats), stats, n


class PrefixStats:
    """The statistics of a whole prefix (``measure``), as ``adapt.graph
    .join_graph_from_stats`` reads a Profiler: ``rate`` is a stream's insertions over the
    prefix's event-time span [``start``, ``end``] (seconds); ``state_size`` its state at
    the end of the prefix (``sizes``); σ and its floor are the Profiler's, whose W covers
    the prefix. ``unmeasured``: why some streams' σ's were not measured (``_starved``), or
    empty."""

    def __init__(self, profiler, inserted: dict[str, int], start: float, end: float,
                 sizes: dict[str, int], unmeasured: str = ""):
        self.profiler, self.inserted, self.sizes = profiler, inserted, sizes
        self.start, self.end = start, end
        self.unmeasured = unmeasured
        self.profiled = sum(p.observations for p in profiler.pipelines.values())

    def rate(self, s: str) -> float:
        return self.inserted[s] / (self.end - self.start)

    def state_size(self, s: str) -> float:
        return float(self.sizes[s])

    def selectivity(self, a: str, b: str) -> float | None:
        return self.profiler.selectivity(a, b)

    def sigma_floor(self, a: str, b: str) -> float:
        return self.profiler.sigma_floor(a, b)

    def describe(self, n: int) -> str:
        """The report's "statistics" line."""
        return (f"measured over the first {n:,} input rows (event time {self.start:g} to "
                f"{self.end:g} s; {self.profiled:,} profiled tuples): λ is each stream's "
                "insertions over that span, σ is averaged over the whole prefix, the state "
                "sizes are those at its end" + (f"; {self.unmeasured}" if self.unmeasured
                                                 else ""))


@contextlib.contextmanager
def _star_needs_input(advice: str = "give --input NAME=PATH for each stream"):
    """On the command line, a ``SELECT *`` read without the inputs' schemas is told to
    ``advice`` (the inputs give the schemas), not to pass ``schemas=`` (the Python API's
    way)."""
    from adaptcq.errors import QueryError
    from adaptcq.query.cql import STAR_ADVICE
    try:
        yield
    except QueryError as e:
        if f"({STAR_ADVICE})" not in e.message:
            raise
        raise QueryError(e.message.replace(f"({STAR_ADVICE})",
                                           f"({advice}, or list the columns)"),
                         e.sql, e.position, e.length) from None


def _starved(prepared, cq, n: int, prefix: int, starved: list[str]) -> str:
    """The report's note on the streams ``starved``, which had no profiled tuple at the
    start of their pipelines in the first ``n`` rows of ``prepared`` (run by ``cq``): the
    σ's of their joins are not measured (the plans take 1, join_graph_from_stats), and why:
    no row of the stream, or its selection passed none, and whether the whole input was
    read (then a larger --prefix cannot help). (It was an error; adaptcq run runs such a
    query, so explain shows its plans.)"""
    query = prepared.query
    ended = len(prepared.rows) < prefix  # prepare stopped before the prefix: input ended
    streams, rows, signs = prepared.streams, prepared.rows, prepared.signs
    read = "the whole input" if ended else f"the first {n:,} input rows"
    causes, sampled = [], False
    for alias in starved:
        i = next(k for k, st in enumerate(query.streams) if st.alias == alias)
        source, sel = query.streams[i].source, cq.selections[i]
        arrived = [k for k in range(n) if query.streams[streams[k]].source == source
                   and (signs is None or signs[k] > 0)]
        passed = sum(1 for k in arrived if sel is None or sel(rows[k]))
        if not arrived:
            causes.append(f"{alias} has no row in {read} ({n:,} rows)")
        elif not passed:
            causes.append(f"{alias}'s selection passed none of its {len(arrived):,} rows "
                          f"in {read} ({n:,} rows)")
        else:
            sampled = True
            causes.append(f"too few of {alias}'s {passed:,} selected rows in {read} "
                          f"({n:,} rows) were profiled")
    advice = ("give --stats FILE to set them" if ended and not sampled
              else "give --stats FILE to set them (the whole input was read)" if ended
              else "a larger --prefix may measure them, or give --stats FILE")
    names = ", ".join(starved)
    return (f"the σ's of the joins of {names} are not measured (taken as 1, the pessimistic "
            f"value): " + "; ".join(causes) + f"; {advice}")


def _prepared(sql: str, sources: dict, timestamp: str, reading: dict, rejected: list | None,
              prefix: int):
    """The first ``prefix`` arrivals in memory (not the whole input), read as a run reads
    them; the late rows among those read go to ``rejected``."""
    from adaptcq.runtime.local import prepare
    prepared = prepare(sql, sources, timestamp, limit=max(0, prefix), **reading)
    if rejected is not None:
        rejected.extend(prepared.rejected)
    return prepared


def _replay(prepared, n: int, policy, rejected: list | None, mode: str = "append",
            **options):
    """The first ``n`` arrivals of ``prepared`` through MJoin (``options``: its orders and
    nested-loop joins) with ``policy`` attached, deletions included (``--sign``); the
    unmatched deletions it rejects go to ``rejected``, once per input row, as a run
    reports them."""
    from adaptcq.engine.continuous import ContinuousQuery
    signed = prepared.signs is not None
    try:
        cq = ContinuousQuery(prepared.query, "mjoin", mode, time_unit=prepared.time_unit,
                             explicit_deletions=signed, **options)
    except (ValueError, KeyError, TypeError) as e:
        raise AdaptcqError(str(e).strip('"')) from None
    cq.attach(policy)
    cq.process(prepared.streams[:n].tolist(),
               prepared.signs[:n].tolist() if signed else None,
               prepared.timestamps[:n].tolist(), prepared.rows[:n])
    cq.drain()
    if rejected is not None:
        first = {}
        for i, st in enumerate(prepared.query.streams):
            first.setdefault(st.source, i)
        reporting = set(first.values())
        rejected.extend({"stream": prepared.query.streams[i].source, "reason": why}
                        for i, _, _, why in cq.rejected_rows if i in reporting)
    return cq


def rejected_summary(rows: list[dict]) -> dict | None:
    """Rejected input rows (dicts with ``stream`` and ``reason``) as {"rows": count,
    "reasons": {reason: {stream: count}}}; None when there are none."""
    if not rows:
        return None
    reasons: dict[str, dict[str, int]] = {}
    for r in rows:
        per = reasons.setdefault(r["reason"], {})
        per[r["stream"]] = per.get(r["stream"], 0) + 1
    return {"rows": len(rows), "reasons": reasons}


def _rejected_text(summary: dict | None) -> str:
    """One line for ``rejected_summary``, or "" when no row was rejected."""
    if summary is None:
        return ""
    return (f"{summary['rows']:,} input rows rejected, as adaptcq run rejects them: "
            + "; ".join(f"{reason} ({', '.join(f'{s} {k:,}' for s, k in per.items())})"
                        for reason, per in summary["reasons"].items()))


# ----- the report ----------------------------------------------------------------------------
def explain_graph(graph) -> dict:
    """Every algorithm's plan and cost on ``graph``, Q-Aware's choice and the optimum."""
    from adaptcq.optimizer import (
        ALGORITHMS,
        DMJOIN_MAX_STREAMS,
        pipeline_cost,
        plan,
        plan_cost,
        qaware_algorithm,
    )

    tractable = len(graph) <= DMJOIN_MAX_STREAMS
    algorithms = {}
    for name in ALGORITHMS:
        if name == "dmjoin" and not tractable:
            continue
        pl = plan(graph, name)
        algorithms[name] = {
            "plan": pl, "cost": plan_cost(graph, pl),
            "pipeline_costs": {s: pipeline_cost(graph, s, o) for s, o in pl.items()}}
    optimum = algorithms["dmjoin"]["cost"] if tractable else None
    for info in algorithms.values():
        info["ratio"] = (info["cost"] / optimum if optimum else
                         (1.0 if optimum == 0 and info["cost"] == 0 else None))
    return {
        "shape": graph.shape, "has_cycle": graph.has_cycle, "connected": graph.is_connected,
        "rates": dict(graph.rates), "window": graph.window,
        "edges": [{"streams": [a, b], "sigma": s} for a, b, s in graph.edges()],
        "algorithms": algorithms, "qaware_chose": qaware_algorithm(graph),
        "optimum": optimum, "dmjoin_tractable": tractable,
    }


def _print(report: dict, query, source: str) -> None:
    from rich.table import Table

    console = _console(width=None if _console().is_terminal else 140)
    say(console, ("query", "bold"), f": {' '.join(query.sql.split())}")
    say(console, ("statistics", "bold"), f": {source}")
    if report.get("rejected"):
        say(console, ("rejected", "bold"), f": {_rejected_text(report['rejected'])}")
    shape = report["shape"]
    if not report["connected"]:
        shape = ("disconnected (pipelines take cartesian products between its "
                 "components)")
    say(console, ("join graph shape", "bold"), f": {shape}; window W = {report['window']:g}")
    t = Table()
    t.add_column("stream")
    t.add_column("λ (tuples/s)", justify="right")
    t.add_column("λ·W (state)", justify="right")
    for s, lam in report["rates"].items():
        t.add_row(s, f"{lam:,.4g}", f"{lam * report['window']:,.4g}")
    console.print(t)
    e = Table()
    e.add_column("pair")
    e.add_column("σ", justify="right")
    for edge in report["edges"]:
        e.add_row(" ⋈ ".join(edge["streams"]), f"{edge['sigma']:.4g}")
    console.print(e)
    for name, info in report["algorithms"].items():
        title = f"{name}: plan cost {info['cost']:,.6g}"
        if info["ratio"] is not None:
            title += f" ({info['ratio']:.3f} × optimum)"
        if name == "qaware":
            title += f" — Q-Aware chose {report['qaware_chose']}"
        say(console, (title, "bold"))
        p = Table()
        p.add_column("ΔS")
        p.add_column("pipeline")
        p.add_column("cost (Eq. 2)", justify="right")
        for s, order in info["plan"].items():
            p.add_row(s, " ⋈ ".join([s, *order]), f"{info['pipeline_costs'][s]:,.6g}")
        console.print(p)
    say(console, ("Q-Aware chose", "bold"), f": {report['qaware_chose']} "
          f"({'cyclic' if report['has_cycle'] else 'acyclic'} join graph, §6)")
    if report["optimum"] is not None:
        say(console, ("optimum", "bold"), f" (DMJoin): {report['optimum']:,.6g}")
    else:
        from adaptcq.optimizer import DMJOIN_MAX_STREAMS
        say(console, ("optimum", "bold"), f": not computed (DMJoin is exponential; more than "
              f"{DMJOIN_MAX_STREAMS} streams)")


def main(args) -> int:
    """``adaptcq explain``. A reader that closes stdout early (``adaptcq explain ... |
    head``) ends it quietly, as it ends ``adaptcq run --output - | head``."""
    try:
        code = _main(args)
        sys.stdout.flush()  # a report smaller than the pipe's buffer fails only here
    except BrokenPipeError:
        # Python would report the closed pipe again when it flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return code


def _console(**kwargs):
    """A rich Console whose write to a closed stdout raises ``BrokenPipeError`` (for
    ``main``), where rich's own handler would exit with status 1. Markup and emoji codes
    are off: what explain prints holds the user's query text, names, paths and values
    (``[range 2 seconds]`` was eaten as a tag, a ``[/]`` raised MarkupError, ``:cat:``
    became an emoji); styles are given as parts (``plain.say``)."""
    from rich.console import Console
    console = Console(markup=False, emoji=False, **kwargs)
    console.on_broken_pipe = _broken_pipe
    return console


def _broken_pipe() -> None:
    raise BrokenPipeError("stdout was closed by its reader")


def _main(args) -> int:
    from adaptcq.query.cql import parse_query

    if getattr(args, "executor", None) == "eddy":
        return explain_eddy(args)
    if getattr(args, "executor", None) == "vector":
        return explain_vector(args)
    if getattr(args, "batch_rows", None) is not None:
        raise AdaptcqError("--batch-rows is for --executor vector")
    if len(args.sql) > 1:
        raise AdaptcqError("several --sql: explain a query set with --executor eddy")
    sql = sql_arg(args.sql[0])
    if getattr(args, "partitions", None) is not None or getattr(args, "shares", None):
        return explain_split(args, sql)
    if getattr(args, "executor", None) == "shed" or _has_set_conditions(sql):
        if getattr(args, "executor", None) not in (None, "shed"):
            raise AdaptcqError(f"--executor {args.executor}: the query has a set join "
                               "condition, which only the load-shedding join evaluates "
                               "(--executor shed)")
        return explain_shed(args, sql)
    code = _code_request(args)
    if code is not None and not args.stats and not args.input:
        refuse_unused(args, "code")
        with _star_needs_input():
            code_text = pipeline_code(sql, **code)
        return _print_code(code_text, getattr(args, "json", False), UNCHECKED)
    if args.stats and args.input:
        raise AdaptcqError("give either --stats FILE or --input NAME=PATH ..., not both")
    if args.stats:
        refuse_unused(args, "stats")
        data = load_stats(args.stats)
        with _star_needs_input("give --input NAME=PATH for each stream instead of --stats"):
            query = parse_query(sql)
        graph = graph_from_json(query, data)
        source = f"given ({args.stats})"
    elif args.input:
        refuse_unused(args, "input")
        if _prefix(args) < 1:
            raise AdaptcqError(f"--prefix must be at least 1, got {_prefix(args)}")
        rows: list[dict] = []
        query, graph, measured, n = measure(sql, parse_inputs(args.input), _timestamp(args),
                                            _prefix(args), rejected=rows, **_reading(args))
        source = measured.describe(n)
        rejected = rejected_summary(rows)
    else:
        raise AdaptcqError("explain needs statistics: --stats FILE, or --input NAME=PATH for "
                           "each stream to measure them")
    report = explain_graph(graph)
    if args.input:
        report["rejected"] = rejected
    if getattr(args, "caches", None):
        report["caches"] = cache_candidates(sql, parse_inputs(args.input), _timestamp(args),
                                            _prefix(args), args.caches, **_plan(args),
                                            **_reading(args))
    if code is not None:
        reading = _reading(args)
        report["code"] = pipeline_code(sql, **code, sources=parse_inputs(args.input),
                                       timestamp=_timestamp(args),
                                       timestamp_unit=reading["timestamp_unit"],
                                       sign=reading["sign"])
        if not args.input:  # (--stats: the query was read without the inputs' schemas)
            report["note"] = UNCHECKED
    if getattr(args, "json", False):
        print(json.dumps({"statistics": source, **report}, indent=2, default=str))
    else:
        _print(report, query, source)
        if "caches" in report:
            _print_caches(report["caches"])
        if code is not None:
            _print_code(report["code"], False, report.get("note"))
    return 0


# ----- which options each kind of report uses ---------------------------------------------------
# An option that does not change what explain shows is refused with the reason, never ignored
# (as adaptcq run refuses options its executor or engine does not use).
_OPTIONS = ("input", "timestamp", "timestamp_unit", "allowed_lateness", "sign", "stats",
            "prefix", "caches", "code", "order", "nested_loop", "mode", "executor", "batch_rows",
            "routing", "engine", "partitions", "shares")
_PLAN_OPTIONS = frozenset({"code", "order", "nested_loop", "mode", "executor", "engine"})
# How the inputs are read (as adaptcq run reads them: cliargs.INPUT_ARGUMENTS).
_READING = frozenset({"timestamp_unit", "allowed_lateness", "sign"})
_MEASURE = frozenset({"input", "timestamp", "prefix"}) | _READING


def _uses(mode: str, args) -> frozenset:
    """The options (argparse dests) the report ``mode`` uses: "eddy", "vector", "split"
    (--engine spark --partitions/--shares), "shed" (the load-shedding join), "code" (--code
    alone), "stats" (plans for --stats) or "input" (plans for statistics measured over
    --input)."""
    inputs = bool(getattr(args, "input", None))
    if mode == "eddy":  # (a query set takes no sign column: adaptcq run refuses it too)
        return (_MEASURE - {"sign"}) | {"code", "mode", "executor", "routing", "engine"}
    if mode == "vector":
        return (frozenset({"order", "mode", "executor", "engine"})
                | (_MEASURE | {"batch_rows"} if inputs else frozenset()))
    if mode == "split":
        rates = ({"stats"} if getattr(args, "stats", None) else  # timestamp: checked as run
                 {"input", "timestamp", "timestamp_unit"} if inputs else set())  # does
        return frozenset({"engine", "partitions", "shares"} | rates)
    if mode == "shed":
        return frozenset({"mode", "executor", "engine"})
    if mode == "code":
        return _PLAN_OPTIONS
    if mode == "stats":
        return _PLAN_OPTIONS | {"stats"}
    if mode == "input":
        return _PLAN_OPTIONS | _MEASURE | {"caches"}
    raise ValueError(mode)


_SHOWS = {
    "eddy": "explain --executor eddy (a local run of the queries in one eddy)",
    "vector": "explain --executor vector",
    "split": "the split into partition groups (--engine spark --partitions/--shares)",
    "shed": "the load-shedding join's plan",
    "code": "--code without --stats or --input (the generated pipelines alone)",
    "stats": "the plans for the statistics of --stats",
    "input": "the plans for the statistics measured over --input",
}

def _no_input(mode: str, args) -> str:
    if mode == "shed":
        return "and the load-shedding join's plan is shown without reading any input"
    if getattr(args, "stats", None):
        return "and with --stats no input is read"
    return "and no input is read here (give --input)"


def _why(dest: str, mode: str, args) -> str:
    """Why option ``dest`` changes nothing in report ``mode``."""
    if dest == "routing":
        return "it is the eddy's routing policy (--executor eddy)"
    if dest == "prefix":
        if mode == "split" and getattr(args, "input", None):
            return ("the split weighs the streams by the inputs' whole row counts; it runs "
                    "no rows")
        return f"it bounds the input rows measured, {_no_input(mode, args)}"
    if dest == "timestamp":
        return f"it names the inputs' time column, {_no_input(mode, args)}"
    if dest == "sign" and mode == "eddy":
        return ("a query set takes insertions only (adaptcq run --executor eddy refuses it "
                "too)")
    if dest in ("sign", "allowed_lateness") and mode == "split" and getattr(args, "input",
                                                                            None):
        return ("the split weighs the streams by the inputs' whole row counts; it rejects "
                "no row")
    if dest in _READING:
        return f"it says how the inputs are read, {_no_input(mode, args)}"
    if dest == "input":
        return "give either --stats FILE or --input NAME=PATH ..., not both"
    if dest == "batch_rows":
        if mode == "vector":
            return "it sets the batches of the run over --input; give --input"
        return "it is for --executor vector (the arrivals per batch)"
    if dest == "stats":
        return ("the eddy takes no statistics file: its routing learns from the tuples of "
                "--input as it runs")
    if dest == "caches":
        return {
            "eddy": "A-Caching's caches are over MJoin's pipelines; the eddy shares SteMs",
            "split": "the split does not depend on the caches each group chooses",
            "code": "it runs A-Caching over the first --prefix rows of --input to show its "
                    "candidate caches; give --input",
            "stats": "it measures cache statistics by running A-Caching over --input: give "
                     "--input instead of --stats",
        }.get(mode, "it shows A-Caching's candidate caches, measured over --input")
    if dest == "order":
        if mode == "eddy":
            return "the eddy has no pipelines to order: its routing (--routing) orders the "\
                   "operators for each tuple"
        if mode == "split":
            return "the split does not depend on the pipelines' orders"
        return ("it sets MJoin's pipeline orders; the load-shedding join has its own "
                "(adaptcq run refuses --order with it)")
    if dest == "nested_loop":
        if mode == "split":
            return "the split does not depend on how a group's joins scan their windows"
        return ("it is for --executor mjoin or acaching (it chooses how a per-tuple probe "
                "scans a window)")
    if dest == "mode":
        return "the split is the same in append and retract mode"
    if dest == "executor":
        return "the split is the same for every executor"
    if dest == "engine":
        return ("explain shows this executor on the local engine; --engine spark with "
                "--partitions P (or --shares) shows a query's split into partition groups")
    if dest in ("partitions", "shares"):
        return ("it shows a single query's split into partition groups (--engine spark, "
                "without --executor eddy)")
    if dest == "code":
        return "it prints MJoin's generated pipelines"
    return "it is not used here"


def _flag(args, dest: str) -> str:
    flag = "--" + dest.replace("_", "-")
    value = getattr(args, dest, None)
    return flag if isinstance(value, bool | list) else f"{flag} {value}"


def refuse_unused(args, mode: str) -> None:
    """Refuse, naming each with the reason, the options given that report ``mode`` does
    not use (``_uses``); ``--engine local`` is the engine every report but the split
    shows, so it is accepted wherever --engine is."""
    used = _uses(mode, args)
    unused = []
    for dest in _OPTIONS:
        value = getattr(args, dest, None)
        if value is None or value is False or value == []:
            continue
        if dest not in used or (dest == "engine" and mode != "split" and value == "spark"):
            unused.append(dest)
    if not unused:
        return
    flags = [_flag(args, d) for d in unused]
    if len(unused) == 1:
        raise AdaptcqError(f"{flags[0]} has no effect on {_SHOWS[mode]}: "
                           f"{_why(unused[0], mode, args)}")
    raise AdaptcqError(f"{', '.join(flags)} have no effect on {_SHOWS[mode]}: " + "; ".join(
        f"{f.split(' ')[0]}: {_why(d, mode, args)}" for f, d in zip(flags, unused, strict=True)))


# ----- generated code --------------------------------------------------------------------------
_CODE_ONLY = ("order", "nested_loop", "mode", "executor", "engine")


def _code_request(args) -> dict | None:
    """``--code`` and its plan options (orders, nested-loop joins, mode), or None. XJoin and
    Spark are refused with the reason; a plan option without ``--code`` (or ``--caches``,
    whose candidates follow the pipelines' orders) is an error, not ignored."""
    if not getattr(args, "code", False):
        given = [f"--{k.replace('_', '-')}" for k in _CODE_ONLY
                 if getattr(args, k, None) not in (None, [])]
        if given and getattr(args, "caches", None):
            _check_cache_plan(args)
        elif given:
            raise AdaptcqError(f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} "
                               "for --code (they choose the plan whose generated code it "
                               "prints) or --caches (the pipelines whose candidate caches "
                               "it shows); give one of them")
        return None
    if getattr(args, "engine", None) == "spark":
        raise AdaptcqError(
            "--code with --engine spark: on Spark every partition group compiles these same "
            "pipelines in its Python worker, and with adaptive policies each group re-orders "
            "them on its own data, so there is no one program to show; --code (--engine "
            "local) shows the pipelines every group starts from")
    if getattr(args, "executor", None) == "xjoin":
        raise AdaptcqError(
            "--code with --executor xjoin: XJoin has no generated pipelines (it runs a tree "
            "of binary joins, operator by operator, with only its output projection "
            "compiled); --code shows MJoin's")
    return _plan(args)


def _plan(args) -> dict:
    """The pipelines ``--order``, ``--nested-loop`` and ``--mode`` ask for, as
    ``pipeline_code``'s and ``cache_candidates``' keyword arguments."""
    return {"orders": parse_orders(getattr(args, "order", []) or []),
            "nested_loop": list(getattr(args, "nested_loop", []) or []),
            "mode": getattr(args, "mode", None) or "append"}


def _check_cache_plan(args) -> None:
    """``--caches`` runs MJoin with A-Caching (``adaptcq run --executor acaching``) on the
    local engine: another executor or Spark is refused with the reason."""
    executor = getattr(args, "executor", None)
    if executor not in (None, "acaching"):  # (adaptcq run refuses --caches without it)
        raise AdaptcqError(f"--executor {executor} with --caches: the candidate caches are "
                           "A-Caching's, over MJoin's pipelines (adaptcq run --executor "
                           "acaching); give --executor acaching, or no --executor")
    if getattr(args, "engine", None) == "spark":
        raise AdaptcqError("--caches with --engine spark: on Spark every partition group "
                           "chooses its caches over its own data; --caches shows them for "
                           "the local engine (--engine local)")


def pipeline_code(sql: str, orders: dict | None = None, nested_loop=(), mode: str = "append",
                  sources: dict | None = None, timestamp: str = "ts",
                  timestamp_unit: str | None = None, sign: str | None = None
                  ) -> dict[str, str]:
    """The generated source of every MJoin pipeline of ``sql`` for ``orders`` (default: each
    pipeline's connected order), by pipeline name (``<pipeline ΔR: S⋈T>``). With
    ``sources`` the query is typed by the inputs' columns (their ``sign`` column apart),
    as a run would type it."""
    from adaptcq.engine.continuous import ContinuousQuery
    from adaptcq.query.cql import parse_query

    if sources:
        from adaptcq.runtime.local import parse_signed
        from adaptcq.stream.sources import open_source, schema_kinds
        schemas = {n: schema_kinds(open_source(n, p, timestamp, timestamp_unit).schema)
                   for n, p in sources.items()}
        query = parse_signed(sql, schemas, sign)
    else:
        query = parse_query(sql)
    options = {k: v for k, v in (("orders", orders), ("nested_loop", nested_loop)) if v}
    try:
        cq = ContinuousQuery(query, "mjoin", mode, **options)
    except (ValueError, KeyError, TypeError) as e:
        raise AdaptcqError(str(e).strip('"')) from None
    return dict(cq.executor.pipeline_sources())


# Without --input the query is parsed without schemas (cql.parse_query): nothing knows its
# streams' columns or their types, so a query adaptcq run refuses may still get code.
UNCHECKED = ("columns and types not checked (no --input): the code is for the query as "
             "written; adaptcq run checks it against its inputs and may refuse it")


def _print_code(code: dict[str, str], as_json: bool, note: str | None = None) -> int:
    if as_json:
        print(json.dumps({**({"note": note} if note else {}), "code": code}, indent=2))
        return 0
    if note:
        print(f"# {note}")
        print()
    for name, source in code.items():
        print(f"# {name}")
        print(source.rstrip("\n"))
        print()
    return 0


def cache_candidates(sql: str, sources: dict, timestamp: str, prefix: int,
                     caches: str, orders: dict | None = None, nested_loop=(),
                     mode: str = "append", **reading) -> list[dict]:
    """Run A-Caching (MJoin + ``adapt.acaching``) over the first ``prefix`` rows and list
    its candidates: state (used/profiled/unused), benefit, cost (§4.1), hit rate. The
    pipelines are those ``adaptcq run --executor acaching`` would run with the same
    ``--order``, ``--nested-loop`` and ``--mode`` (the candidates follow the orders), over
    the inputs read as it reads them (``reading``, as ``measure``'s)."""
    from adaptcq.adapt.acaching import ACaching

    prepared = _prepared(sql, sources, timestamp, reading, None, prefix)
    n = min(len(prepared.rows), max(0, prefix))
    policy = ACaching(caches=caches, p=min(1.0, max(0.01, 2000 / max(n, 1))),
                      interval=max(1, n // 400), reopt_interval=max(1, n // 4))
    options = {k: v for k, v in (("orders", orders), ("nested_loop", list(nested_loop)))
               if v}
    _replay(prepared, n, policy, None, mode, **options)
    out = []
    for cand, st in policy.states.items():
        e = st.estimate or policy.estimate(st)
        net, ratio = policy.predicted(st)
        trials = [m for m in policy.measured if cand.name in m["change"]]
        last = trials[-1] if trials else None
        out.append({"cache": cand.name, "kind": cand.kind, "state": st.state,
                    "benefit": None if e is None else e.benefit,
                    "cost": None if e is None else e.cost,
                    "clock": policy.costs().clock,
                    "net_cpu_ms_per_s": None if net is None else net * 1e3,
                    "predicted_ratio": ratio,
                    "measured_ratio": None if last is None else last["ratio"],
                    "measured_net_cpu_ms_per_s": None if last is None
                    or last.get("measured_cpu_saved_per_s") is None
                    else last["measured_cpu_saved_per_s"] * 1e3
                    * (1 if last["change"].startswith("use") else -1),
                    "hit_rate": (st.cache.hits / st.cache.probes)
                    if st.cache is not None and st.cache.probes else None,
                    "trials": trials})
    if out:
        out[0]["cost_model"] = policy.cost_model()
        out[0]["seconds_per_operation"] = policy.seconds_per_operation()
    return out


def _print_caches(rows: list[dict]) -> None:
    from rich.table import Table

    from adaptcq.adapt.acaching import describe_measured

    seconds = bool(rows) and rows[0].get("clock") == "seconds"
    unit = ("CPU seconds per second of input at the per-operation costs measured as it "
            "ran" if seconds else "work units per second of input")
    t = Table(title=f"A-Caching candidates (benefit and cost in {unit}, §4.1; net CPU and "
                    "CPU ratio predicted, then measured in the cache's latest trial)")
    cols = ("cache", "kind", "state", "benefit", "cost", "net", "net CPU", "ratio",
            "net CPU measured", "ratio measured", "hit rate")
    for col in cols:
        t.add_column(col, justify="left" if col in ("cache", "kind", "state") else "right")

    def ms(x):
        return "—" if x is None else f"{x:+.3g} ms/s"

    def times(x):
        return "—" if x is None else f"{x:.2f}×"
    for r in rows:
        b, c = r["benefit"], r["cost"]
        t.add_row(r["cache"], r["kind"], r["state"],
                  "—" if b is None else f"{b:.3g}", "—" if c is None else f"{c:.3g}",
                  "—" if b is None else f"{b - c:.3g}", ms(r.get("net_cpu_ms_per_s")),
                  times(r.get("predicted_ratio")), ms(r.get("measured_net_cpu_ms_per_s")),
                  times(r.get("measured_ratio")),
                  "—" if r["hit_rate"] is None else f"{r['hit_rate']:.1%}")
    if not rows:
        t.add_row("no candidate satisfies the prefix invariant for these orders",
                  *[""] * (len(cols) - 1))
    _console().print(t)
    if rows and rows[0].get("cost_model"):
        _console().print(f"Cost model: {rows[0]['cost_model']}")
        per_op = rows[0].get("seconds_per_operation")
        if per_op:
            _console().print("  ns per operation (* measured, else the prior's split): " + ", ".join(
                f"{k} {v:g}" for k, v in per_op.items()))
    trials = list({(m["arrival"], m["change"]): m for r in rows
                   for m in r.get("trials", ())}.values())
    if trials:  # decisions checked by measurement: the model beside what was measured
        _console().print("Cache changes measured (model against measurement):")
        for m in sorted(trials, key=lambda m: m["arrival"]):
            _console().print("  " + describe_measured(m))


# ----- a query set in one eddy (cacq.txt) --------------------------------------------------------
def explain_eddy(args) -> int:
    """Run the queries in one eddy over the first ``--prefix`` input rows and show what
    they share: operators (grouped filters, SteMs) with their tickets, the virtual sources
    created so far, and each query's bit and masks (``Eddy.describe``)."""
    from adaptcq.runtime.multi import Engine, named_errors
    if not args.input:
        raise AdaptcqError("--executor eddy runs the queries: give --input NAME=PATH for "
                           "each source")
    refuse_unused(args, "eddy")
    if _prefix(args) < 1:
        raise AdaptcqError(f"--prefix must be at least 1, got {_prefix(args)}")
    rows: list[dict] = []
    reading = _reading(args)
    engine = Engine(parse_inputs(args.input), _timestamp(args), mode=args.mode or "append",
                    routing=args.routing or "tickets", routing_epoch=min(1000, _prefix(args)),
                    timestamp_unit=reading["timestamp_unit"],
                    allowed_lateness=reading["allowed_lateness"],
                    on_rejected=lambda batch: rows.extend(batch.to_pylist()))
    for k, text in enumerate(args.sql, 1):
        sql = sql_arg(text)
        with named_errors(sql_where(k, text)):  # (which of many --sql is wrong, as run says)
            engine.register(sql, query_id=f"q{k}", output=lambda batch: None)
    engine.run(max_arrivals=_prefix(args))
    report = engine.explain()
    report["rejected"] = rejected_summary(rows)
    if getattr(args, "code", False):
        report["routes"] = engine.ex.route_sources()
    if getattr(args, "json", False):
        print(json.dumps(report, indent=2, default=str))
        return 0
    from rich.table import Table
    console = _console()
    say(console, ("eddy", "bold"), f" over the first {engine.stats['arrivals']:,} arrivals "
          f"({args.routing or 'tickets'} routing)")
    if report["rejected"]:
        say(console, ("rejected", "bold"), f": {_rejected_text(report['rejected'])}")
    t = Table(title="shared operators")
    for col in ("id", "operator", "predicates / rows", "tickets"):
        t.add_column(col)
    for op in report["operators"]:
        size = op.get("predicates", op.get("rows"))
        t.add_row(str(op["id"]), op["operator"], f"{size:,}",
                  "-" if op["tickets"] is None else f"{op['tickets']:,.0f}")
    console.print(t)
    t = Table(title="virtual sources (§3.3.2)")
    for col in ("id", "sources", "queries", "completion mask", "SteMs list"):
        t.add_column(col)
    for vs in report["virtual_sources"]:
        t.add_row(str(vs["id"]), vs["sources"], _bitlist(vs["queries"]),
                  _bitlist(vs["completion"]), ", ".join(vs["stems"]) or "-")
    console.print(t)
    t = Table(title="queries")
    for col in ("query", "bit", "sources", "per alias: slot and filters", "results"):
        t.add_column(col)
    for q in report["queries"]:
        aliases = "\n".join(f"{a}: slot {m['slot']}, completion mask "
                            f"{m['completion']:#b} over {m['source']}'s operators "
                            f"({', '.join(m['filters']) or 'no filter'})"
                            for a, m in q["aliases"].items())
        t.add_row(q["query"], str(q["bit"]), q["virtual_source"], aliases,
                  f"{q['emitted']:,}")
    console.print(t)
    for name, source in report.get("routes", {}).items():
        say(console, (f"compiled route of {name}", "bold"), " (this epoch's routing table)")
        console.print(source, highlight=False)
    return 0


def _has_set_conditions(sql: str) -> bool:
    """Whether the query has a set join condition (read without schemas; a query that
    needs them, e.g. for SELECT *, is left to the path that has them)."""
    from adaptcq.errors import QueryError
    from adaptcq.query.cql import parse_query
    try:
        return bool(parse_query(sql).set_predicates)
    except QueryError:
        return False


def explain_shed(args, sql: str) -> int:
    """``adaptcq explain`` of a query the load-shedding join runs (``--executor shed``,
    or any query with a set join condition): its conditions, windows, basic windows,
    index and, for three or more streams, its MJoin pipelines (docs/shedding.md)."""
    from adaptcq.engine.continuous import ContinuousQuery
    from adaptcq.query.cql import parse_query

    for flag, value in (("--code", getattr(args, "code", False)), ("--stats", args.stats),
                        ("--input", args.input), ("--caches", args.caches)):
        if value:
            raise AdaptcqError(f"{flag} is not for the load-shedding join: it has no "
                               "generated pipelines, caches or optimizer statistics; its "
                               "plan is shown without them")
    refuse_unused(args, "shed")
    query = parse_query(sql)
    cq = ContinuousQuery(query, "shed", args.mode or "append")
    plan = cq.executor.describe()
    if getattr(args, "json", False):
        print(json.dumps({"executor": "shed", "plan": plan}))
    else:
        print(plan)
    return 0


def explain_vector(args) -> int:
    """``adaptcq explain --executor vector``: the vectorized executor's pipelines (each join
    a band join on its key), and with ``--input`` a run over the first ``--prefix`` rows:
    the window sizes and selectivities it measured, and the orders it chose per batch
    (adapt.batch_order) — the plan the next batch would run."""
    from adaptcq.engine.vector import VectorJoin, unsupported
    from adaptcq.query.cql import parse_query

    if len(args.sql) > 1:
        raise AdaptcqError("several --sql: the vectorized executor runs one query")
    for flag, value in (("--code", args.code), ("--nested-loop", args.nested_loop),
                        ("--caches", args.caches), ("--stats", args.stats),
                        ("--partitions", args.partitions), ("--shares", args.shares)):
        if value:
            raise AdaptcqError(f"{flag} is not for --executor vector (it has no generated "
                               "code, caches or shares of its own; it measures its "
                               "statistics itself: give --input)")
    refuse_unused(args, "vector")
    if args.input and _prefix(args) < 1:
        raise AdaptcqError(f"--prefix must be at least 1, got {_prefix(args)}")
    sql = sql_arg(args.sql[0])
    orders = parse_orders(args.order or [])
    mode = args.mode or "append"
    report: dict = {"executor": "vector", "mode": mode}
    if args.input:
        from adaptcq.runtime.local import LocalRun
        rows: list[dict] = []
        run = LocalRun(sql, parse_inputs(args.input), _timestamp(args), "vector", mode,
                       orders=orders, batch_rows=args.batch_rows, **_reading(args),
                       on_rejected=lambda batch: rows.extend(batch.to_pylist()))
        vj, left = run.cq, _prefix(args)
        for batch, _ in run.iter_batches():  # the batches adaptcq run would make
            vj.process_batch(batch.slice(0, min(len(batch), left)))
            run._engine_rejected()  # (unmatched deletions, by their input rows)
            left -= len(batch)
            if left <= 0:
                break
        run._flush_rejected()
        report["rejected"] = rejected_summary(rows)
        query = vj.query
        report["measured"] = (f"over the first {vj.stats.arrivals:,} input rows, in "
                              f"batches of {run.batch_rows:,}")
        report["windows"] = {w.alias: len(w) - w.dead for w in vj.windows}
        report["selectivities"] = {f"{a}→{b}": r.get() for (a, b), r in
                                   sorted(vj.selectivity.items())}
        report["orders_used"] = {a: {"⋈".join(o): k for o, k in used.items()}
                                 for a, used in vj.order_log.items()}
        report["results"] = vj.stats.results
    else:
        with _star_needs_input():
            query = parse_query(sql)
        why = unsupported(query)
        if why:
            raise AdaptcqError(f"the vectorized executor cannot run this query: {why}")
        import pyarrow as pa
        schemas = {a: pa.schema([(c, pa.int64()) for c in query.columns[a]])
                   for a in query.aliases}
        try:  # (a bad --order: one line, as with --input and adaptcq run)
            vj = VectorJoin(query, mode, schemas, orders=orders)
        except (ValueError, KeyError, TypeError) as e:
            raise AdaptcqError(str(e).strip('"')) from None
        report["measured"] = None
    report["plan"] = vj.describe()
    report["orders"] = {a: list(o) for a, o in vj.orders.items()}
    if getattr(args, "json", False):
        print(json.dumps(report, indent=2, default=str))
        return 0
    print(f"vectorized executor ({mode} mode): one pipeline per stream, every join a band "
          "join on its key with the window and arrival-order test inside it")
    print(report["plan"])
    if report["measured"] is None:
        print("orders: chosen per batch by fgreedy over measured window sizes and "
              "selectivities (adaptcq run --optimizer ALGORITHM to change it); give --input "
              "to see them measured")
        return 0
    print(f"\nmeasured {report['measured']}; {report['results']:,} results")
    if report["rejected"]:
        print(f"rejected: {_rejected_text(report['rejected'])}")
    print("tuples in each window now: " + ", ".join(f"{a} {n:,}" for a, n in
                                                     report["windows"].items()))
    for k, v in report["selectivities"].items():
        print(f"  σ {k}: {v:.3g}")
    print("orders used (batches):")
    for a, used in report["orders_used"].items():
        print(f"  Δ{a}: " + ", ".join(f"{o} ×{k}" for o, k in used.items()))
    return 0


def _bitlist(bits: list[int]) -> str:
    return "{" + ", ".join(f"q@{b}" for b in bits) + "}"


# ----- Spark partition groups ------------------------------------------------------------------
def explain_split(args, sql: str) -> int:
    """``explain --engine spark --partitions P``: the shares (HyperCube) split of the query
    into P partition groups (``runtime.spark_split.plan_split``), at the rates of
    ``--stats``, or of the inputs' row counts (``--input``), or equal rates."""
    from adaptcq.cliargs import check_partitions, parse_shares
    from adaptcq.query.cql import parse_query
    from adaptcq.runtime.spark_split import plan_split
    if getattr(args, "engine", None) != "spark":
        raise AdaptcqError("--partitions and --shares describe the Spark runtime's partition "
                           "groups: give --engine spark")
    if getattr(args, "code", False):
        raise AdaptcqError("--partitions shows the split, --code the generated pipelines: "
                           "give one of them")
    if args.stats and args.input:
        raise AdaptcqError("give either --stats FILE or --input NAME=PATH ..., not both: "
                           "the split takes its rates from one of them")
    refuse_unused(args, "split")
    P = args.partitions
    check_partitions(P)
    shares = parse_shares(args.shares or [])
    rates, source = None, "equal rates"
    if args.stats:
        with _star_needs_input("give --input NAME=PATH for each stream instead of --stats"):
            query = parse_query(sql)
        data = load_stats(args.stats)
        rates, source = rates_from_json(query, data), f"rates of {args.stats}"
        _other_stats(query, data)  # the rest of the file is checked too, though not used
        _check_split_range(rates, P or math.prod(shares.values()))
    elif args.input:
        from adaptcq.errors import QueryError
        from adaptcq.runtime.local import refuse_missing_inputs, require_inputs
        from adaptcq.runtime.spark import _input_rates, _resolve_input
        from adaptcq.stream.sources import schema_kinds
        inputs = {n: _resolve_input(n, p, _timestamp(args), _reading(args)["timestamp_unit"])
                  for n, p in parse_inputs(args.input).items()}
        try:
            query = parse_query(sql, {n: schema_kinds(i.schema) for n, i in inputs.items()})
        except QueryError:
            refuse_missing_inputs(sql, inputs)  # (as run names a stream without input)
            raise
        require_inputs(query, inputs)  # as adaptcq run checks them
        rates, source = _input_rates(query, inputs), "row counts of the inputs"
    else:
        with _star_needs_input():
            query = parse_query(sql)
    plan = plan_split(query, P, rates, shares or None)
    d = plan.describe()
    d["rates_from"] = source
    if getattr(args, "json", False):
        print(json.dumps(d, indent=2))
        return 0
    from rich.table import Table
    con = _console()
    if plan.reason:
        con.print(f"one partition group: {plan.reason}", highlight=False)
        return 0
    t = Table(title=f"shares for P = {plan.groups} partition groups ({source})")
    t.add_column("attribute class")
    t.add_column("share", justify="right")
    for label, p in d["shares"].items():
        t.add_row(label, str(p))
    con.print(t)
    u = Table(title="streams")
    u.add_column("stream")
    u.add_column("rate", justify="right")
    u.add_column("hashed on")
    u.add_column("groups per tuple", justify="right")
    for a in query.aliases:
        u.add_row(a, f"{d['rates'][a]:g}",
                  ", ".join(f"{a}.{col}" for _, col in plan.keys.get(a, ())) or "-",
                  str(d["replicas"][a]))
    con.print(u)
    con.print(f"tuples shipped per input tuple: {d['replication']:.3f}", highlight=False)
    return 0
