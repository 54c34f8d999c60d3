"""Many continuous queries on one running engine (CACQ): ``adaptcq.Engine``.

Queries are registered and removed by **control events** ordered with the data by
timestamp (docs/cacq.md, "What a query sees"): an event at time t takes effect after every
arrival with a timestamp below t and before every arrival at t or later (events at one
time in the order given). So a run is deterministic, checkpointable, and the same on the
local runtime and on Spark. Query q registered after arrival s_q and removed after arrival
s'_q outputs exactly what the single-query engine produces for q alone on the arrivals in
(s_q, s'_q], with time advanced by every arrival and every control event (any query's) up to
q's removal: arrivals of sources q does not read and other queries' events advance time
too, so its deletions come when event time passes, as in one engine fed a heartbeat.

Inputs are read a chunk at a time and merged (``stream.merge``); each query's results
leave as Arrow batches to its own output (collected, a Parquet/CSV file, or a callback), a
few thousand at a time: memory is the engine's state plus a few chunks.

>>> engine = Engine(sources={"S": "s.parquet"}, timestamp="ts")       # doctest: +SKIP
>>> h = engine.register("SELECT * FROM S WHERE S.a > 90")             # doctest: +SKIP
>>> engine.deregister(h, at=60.0)                                     # doctest: +SKIP
>>> engine.run(); h.table()                                           # doctest: +SKIP
"""

from __future__ import annotations

import bisect
import contextlib
import datetime
import math
import numbers
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa

from adaptcq.checks import is_int
from adaptcq.engine.eddy import START_MODES  # (the baselines take "now" only)
from adaptcq.errors import InputError, OptionError, QueryError
from adaptcq.query.logical import LogicalQuery, StreamRef
from adaptcq.runtime.local import (
    REJECTED_SCHEMA,
    TIME_UNIT,
    _NumberedMerger,
    close_inputs,
    open_sources,
    output_schema,
    rejected_batch,
    rows_to_batch,
    source_paths,
)
from adaptcq.stream.eventtime import (
    NS_MAX,
    NS_MIN,
    SPAN,
    UNITS,
    check_unit,
    lateness_ns,
    to_nanoseconds,
)
from adaptcq.stream.sources import CHUNK_ROWS, csv_convert_options, csv_parse_options, schema_kinds

OUT_CHUNK = 65_536          # result rows per output batch, per query
STOP_EVERY = 256            # arrivals between two looks for a stop (``Engine.stop``)
ROUTING_EPOCH = 1000        # arrivals per routing table (compiled routes); None: per step
ACTIONS = ("register", "deregister")
CONTROL_COLUMNS = ("ts", "action", "query_id", "sql")

QUERYSET_EXECUTORS = {
    "eddy": "adaptcq.engine.eddy:Eddy",                       # CACQ: one shared eddy
    "eddies": "adaptcq.engine.eddy:PerQueryEddies",           # baseline: an eddy per query
    "pushdown": "adaptcq.engine.niagara:PushDown",            # NiagaraCQ baselines (§5)
    "pullup": "adaptcq.engine.niagara:PullUp",
}
NO_WINDOW_START = {  # why a baseline refuses start="window" (and retain=, which serves it)
    "eddies": "the eddies baseline gives each query a new eddy, which holds no earlier rows",
    "pushdown": "NiagaraCQ's plans hold no rows for a query registered later",
    "pullup": "NiagaraCQ's plans hold no rows for a query registered later",
}
STATIC = "NiagaraCQ's plans are static: nothing is routed"
UNUSED_OPTIONS = {  # executor -> {Engine option it does not use: why} (cli's misfits)
    "eddy": {},
    "eddies": {"retain": "retain= keeps rows for start='window', which the eddies "
                         "baseline refuses (a new eddy per query holds no earlier rows)",
               "capacity": "each query has an eddy of its own, so a limit on the queries "
                           "at once in one eddy limits nothing"},
    "pushdown": dict.fromkeys(("routing", "routing_options", "routing_epoch", "seed"), STATIC),
    "pullup": dict.fromkeys(("routing", "routing_options", "routing_epoch", "seed"), STATIC),
}


@dataclass
class ControlEvent:
    """One event of the control stream: register or deregister a query at time ``ts``
    (engine units, int64 nanoseconds; -inf: before any data)."""

    ts: float | int
    action: str
    query_id: str
    sql: str | None = None
    start: str = "now"
    order: int = 0            # position in the control stream (ties at one time)


@dataclass
class QueryHandle:
    """A registered query: its id, SQL and output (``table()`` when collected)."""

    id: str
    sql: str
    query: LogicalQuery
    schema: pa.Schema
    output: object = None          # None (collect), a path, or a callable(batch)
    start: str = "now"
    emitted: int = 0
    error: str | None = None
    state: str = "pending"         # pending, running, removed, failed
    rows: list = field(default_factory=list, repr=False)
    batches: list = field(default_factory=list, repr=False)
    sink: object = field(default=None, repr=False)

    def table(self) -> pa.Table:
        """The collected results (``output=None``)."""
        if self.output is not None:
            raise OptionError(f"query {self.id!r} writes to {self.output!r}; read it there")
        return pa.Table.from_batches(self.batches, schema=self.schema)

    def to_pandas(self):
        return self.table().to_pandas()


class Engine:
    """Many continuous queries over shared sources, one engine (cacq.txt).

    ``sources`` maps a source name to its input (a Parquet/CSV file, folder, glob, Arrow
    table, or an iterable of batches / dicts, as ``adaptcq.run`` takes). ``executor`` is
    ``eddy`` (CACQ), or a baseline: ``eddies`` (one eddy per query), ``pushdown`` or
    ``pullup`` (NiagaraCQ's plans, cacq.txt §5). ``routing`` is the eddy's policy
    (``adapt.routing``: tickets, lottery, random, fixed) with ``routing_options``.
    ``routing_epoch`` (arrivals, default 1000): follow a routing table the policy writes
    once per epoch, compiled to Python (``engine.eddy_routes``); None: the policy decides
    every routing step (cacq.txt §4's per-tuple lottery; about 1.5× slower, see
    docs/cacq-routing.md).
    ``retain`` (seconds per source) keeps rows that long for queries registered with
    ``start="window"``. ``udfs`` maps a name usable in the SQL to a Python callable.
    Late input rows (beyond ``allowed_lateness``) go to ``on_rejected`` (a callable given
    each RecordBatch of ``runtime.local.REJECTED_SCHEMA``) as they are found, or are kept
    in ``rejected`` (a pyarrow Table after ``run``).
    """

    def __init__(self, sources: Mapping[str, object], timestamp: str = "ts", *,
                 mode: str = "append", executor: str = "eddy", routing: str = "tickets",
                 routing_options: Mapping | None = None, seed: int = 0,
                 timestamp_unit: str | None = None, allowed_lateness: float = 0.0,
                 chunk_rows: int = CHUNK_ROWS, retain: Mapping[str, float] | None = None,
                 udfs: Mapping[str, Callable] | None = None, capacity: int | None = None,
                 routing_epoch: int | None = ROUTING_EPOCH,
                 on_rejected: Callable[[pa.RecordBatch], None] | None = None):
        if executor not in QUERYSET_EXECUTORS:
            raise OptionError(f"unknown executor {executor!r} for a query set; choose one of "
                              f"{', '.join(QUERYSET_EXECUTORS)}")
        # An option the executor does not use is refused with the reason, as the CLI
        # refuses its flags (cliargs.QUERYSET_OPTIONS), not ignored. The defaults are not
        # "given": the CLI passes them to every executor.
        given = {"routing": routing != "tickets", "routing_options": bool(routing_options),
                 "routing_epoch": routing_epoch != ROUTING_EPOCH, "seed": seed != 0,
                 "retain": bool(retain), "capacity": capacity is not None}
        unused = UNUSED_OPTIONS[executor]
        misfits = [k for k in unused if given[k]]
        if misfits:
            why = "; ".join(dict.fromkeys(unused[k] for k in misfits))
            raise OptionError(f"{', '.join(k + '=' for k in misfits)}: not for "
                              f"executor={executor!r} (a query set; {why}; see docs/cacq.md "
                              "for its options)")
        refusal = unused_seed(routing, seed) if given["seed"] else None
        if refusal:  # (as the CLI refuses --routing fixed --seed N)
            raise OptionError(refusal)
        if routing_epoch is not None and (not is_int(routing_epoch) or routing_epoch < 1):
            # (the eddy's own check took True as 1)
            raise OptionError(f"routing_epoch must be a positive number of arrivals or None "
                              f"(a decision per routing step), got {routing_epoch!r}")
        if not isinstance(sources, Mapping) or not sources:
            raise InputError("no sources: give Engine(sources={name: input, ...})")
        check_unit(timestamp_unit)
        self.input_paths = source_paths(sources)  # (no query's output may overwrite them)
        self.timestamp, self.unit, self.mode = timestamp, timestamp_unit, mode
        self.executor_name = executor
        self.sources = open_sources(sources, timestamp, timestamp_unit, chunk_rows)
        self.kinds = {n: schema_kinds(s.schema) for n, s in self.sources.items()}
        for what, value in (("routing_options", routing_options), ("udfs", udfs),
                            ("retain", retain)):
            if value is not None and not isinstance(value, Mapping):
                raise OptionError(f"{what} must be a dict, got {type(value).__name__}")
        if routing_options and "seed" in routing_options:
            # make_routing takes the seed once, from seed= (the CLI: from --seed).
            raise OptionError(f"routing_options={{'seed': {routing_options['seed']!r}}}: "
                              "give the seed with the seed= option, not as a routing option")
        if capacity is not None and (not is_int(capacity) or capacity < 1):
            raise OptionError(f"capacity (queries at once) must be a whole number >= 1, got "
                              f"{capacity!r}")
        for src, seconds in (retain or {}).items():
            if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or \
                    not 0 <= seconds < math.inf:
                raise OptionError(f"retain[{src!r}] must be a number of seconds >= 0, got "
                                  f"{seconds!r}")
        if on_rejected is not None and not callable(on_rejected):
            raise OptionError(f"on_rejected must be callable, got {type(on_rejected).__name__}")
        self.on_rejected = on_rejected
        self.rejected: pa.Table | list[pa.RecordBatch] = []
        self.udfs = dict(udfs or {})
        from adaptcq.adapt.routing import make_routing
        self.policy = make_routing(routing, seed=seed, **dict(routing_options or {}))
        self.ex = _load(executor)(self.kinds, self.policy, mode=mode, time_unit=TIME_UNIT,
                                  retain=retain, udfs=self.udfs,
                                  **({"capacity": capacity} if capacity is not None else {}),
                                  **({"routing_epoch": routing_epoch}
                                     if routing_epoch is not None else {}))
        self.lateness = lateness_ns(allowed_lateness)
        self.handles: dict[str, QueryHandle] = {}
        self.control: list[ControlEvent] = []
        self._order = 0
        self._ran = False
        self._stop = False
        self._stop_reason = "interrupted"
        self._closed: dict[str, str] = {}  # query id -> its output file, finished
        self.interrupted = False
        self.stopped: str | None = None  # why the run stopped before its input ended
        self.stats: dict = {}
        # Running queries that self-join a source over [ROWS n] windows, by source (``_tie``)
        self._watch: dict[str, dict[str, list[str]]] = {}

    # ----- the control stream ------------------------------------------------------------
    def register(self, sql: str, at=None, *, start: str = "now", output=None,
                 query_id: str | None = None) -> QueryHandle:
        """Register ``sql`` at time ``at`` (None: before any data; a number in the
        timestamp unit, seconds by default, or a datetime). The query is parsed now, so a
        bad query fails here, naming the position."""
        if self._ran:
            raise OptionError("the engine has run; register before run()")
        if not isinstance(sql, str):  # (parsing it raised a raw TypeError)
            raise QueryError(f"register: the query must be its SQL text (a string), got "
                             f"{type(sql).__name__}")
        if query_id is None:  # the first qN no query uses (a user may have taken q2)
            k = len(self.handles) + 1
            while f"q{k}" in self.handles:
                k += 1
            query_id = f"q{k}"
        if not isinstance(query_id, str) or not query_id:
            raise OptionError(f"query id {query_id!r}: give a non-empty string")
        qid = query_id
        check_query_id(qid)
        if qid in self.handles:
            raise OptionError(f"query id {qid!r} is already used")
        _check_output(qid, output)
        self._check_clash(qid, output)
        self._check_start(qid, start)
        query = self.parse(sql)
        check = getattr(self.ex, "check_query", None)
        if check is not None:  # (NiagaraCQ's plans: refused now, not when its time comes)
            check(qid, query)
        schema = output_schema(query, {n: s.schema for n, s in self.sources.items()},
                               self.timestamp, self.unit)
        ev = ControlEvent(self._ts(at), "register", qid, sql, start)  # (may refuse `at`)
        h = QueryHandle(qid, sql, query, schema, output, start)
        self.handles[qid] = h  # only now: a refused registration leaves nothing behind
        self._event(ev)
        return h

    def _check_clash(self, qid: str, output) -> None:
        """A file output that is an input, or another query's output file, is refused:
        two sinks wrote one temporary file, and the run failed with "No such file" after
        one query's results were lost."""
        if output is None or callable(output):
            return
        from adaptcq.runtime.output import refuse_overlaps
        refuse_overlaps(str(output), self.input_paths, f"query {qid}: output",
                        [(f"query {h.id}'s output", str(h.output))
                         for h in self.handles.values()
                         if h.output is not None and not callable(h.output)], OptionError)

    def _check_start(self, qid: str, start) -> None:
        """``start`` is checked here, not when the registration's time comes mid-run (which
        stopped every query, removing their outputs)."""
        if start not in START_MODES:
            raise OptionError(f"query {qid}: unknown start {start!r}; choose one of "
                              f"{', '.join(START_MODES)}")
        if start == "window" and self.executor_name in NO_WINDOW_START:
            raise OptionError(f"query {qid}: start='window' is not supported by "
                              f"executor={self.executor_name!r} "
                              f"({NO_WINDOW_START[self.executor_name]}); use start='now' or "
                              "executor='eddy'")

    def deregister(self, handle: QueryHandle | str, at=None) -> None:
        """Remove a query at time ``at`` (None: after all data)."""
        qid = handle.id if isinstance(handle, QueryHandle) else handle
        if self._ran:
            raise OptionError("the engine has run; deregister before run()")
        if qid not in self.handles:
            raise OptionError(f"no query {qid!r} to deregister (registered: "
                              f"{', '.join(self.handles) or 'none'})")
        ts = self._ts(at) if at is not None else float("inf")
        # (both were ignored, silently: the query ran on, or nothing happened)
        registered = next(e.ts for e in self.control
                          if e.query_id == qid and e.action == "register")
        if ts < registered:
            raise OptionError(f"deregisters {qid!r} at {at!r}, before its registration")
        if any(e.query_id == qid and e.action == "deregister" for e in self.control):
            raise OptionError(f"deregisters {qid!r} a second time")
        self._event(ControlEvent(ts, "deregister", qid))

    def load_control(self, source) -> None:
        """Read a control stream: rows (ts, action, query_id, sql[, start]) from a
        Parquet/CSV file, an Arrow table or a list of dicts; ``action`` is register or
        deregister; ``start`` (optional) is a registration's start, now or window."""
        if isinstance(source, pa.Table):
            table = source
        elif isinstance(source, list) and all(isinstance(r, Mapping) for r in source):
            table = pa.Table.from_pylist(source)
        elif isinstance(source, (str, os.PathLike)):
            table = _read_table(source)
        elif hasattr(source, "to_dict") and hasattr(source, "columns"):  # a DataFrame
            table = pa.Table.from_pylist(source.to_dict("records"))
        else:
            raise InputError(f"control stream: give a Parquet/CSV path, a pyarrow Table, a "
                             f"DataFrame or a list of dicts, not {type(source).__name__}")
        missing = [c for c in CONTROL_COLUMNS if c not in table.column_names
                   and c != "sql"]
        if missing:
            raise InputError(f"control stream: missing column(s) {', '.join(missing)} "
                             f"(columns: {', '.join(CONTROL_COLUMNS)})")
        # Another column was ignored, a "start" one too: refused, or read (start).
        extra = [c for c in table.column_names if c not in (*CONTROL_COLUMNS, "start")]
        if extra:
            raise InputError(f"control stream: unknown column(s) {', '.join(extra)} "
                             f"(columns: {', '.join(CONTROL_COLUMNS)}, and start: now or "
                             "window, for a registration)")
        for r, row in enumerate(table.to_pylist()):
            action = row.get("action")
            where = f"control stream row {r}"
            if action not in ACTIONS:
                raise InputError(f"{where}: action {action!r}; choose register or deregister")
            qid = row.get("query_id")
            if not qid:
                raise InputError(f"{where}: no query_id")
            if action == "register":
                if not row.get("sql"):
                    raise InputError(f"{where}: register needs the query's sql")
                with named_errors(f"{where} (query {qid})"):  # (a bad start: the row named)
                    self.register(row["sql"], row["ts"], query_id=str(qid),
                                  start=row.get("start") or "now")
            else:
                if str(qid) not in self.handles:
                    raise InputError(f"{where}: deregisters {qid!r}, which no earlier row "
                                     "registers")
                try:
                    self.deregister(str(qid), row["ts"])
                except (InputError, OptionError) as e:
                    raise InputError(f"{where} (query {qid}): {e}") from None

    def parse(self, sql: str) -> LogicalQuery:
        from adaptcq.query.cql import parse_query
        kw = {"udfs": self.udfs} if self.udfs else {}
        query = parse_query(sql, self.kinds, **kw)
        for s in query.streams:
            if s.source not in self.sources:
                raise QueryError(f"unknown source {s.source!r} (sources: "
                                 f"{', '.join(self.sources)})", sql, s.position)
        return query

    def _ts(self, at):
        """A control time in engine units: None is before any data; a datetime, or a
        number in the timestamp unit. Anything else (text, NaN, infinities, a time outside
        what int64 nanoseconds hold) is refused naming the value."""
        if at is None:
            return float("-inf")
        def out_of_range():
            return InputError(f"control time {at!r} is out of range (event times span "
                              f"{SPAN})")
        # Exactly as the data's times are converted, so an event at a row's time is at it:
        # through a float (total_seconds() * 1e9, float(an int of ns)) it was up to ~200 ns
        # off, on the wrong side of that row.
        if isinstance(at, datetime.datetime):
            if at.tzinfo is not None:
                at = at.astimezone(datetime.UTC).replace(tzinfo=None)
            d = at - datetime.datetime(1970, 1, 1)
            ns = ((d.days * 86_400 + d.seconds) * 1_000_000 + d.microseconds) * 1000 \
                + getattr(d, "nanoseconds", 0)  # (a pandas Timestamp's)
        elif isinstance(at, (bool, str, bytes)):  # (True was taken as 1 s, "3" as 3 s)
            raise InputError(f"control time {at!r} is not a number or a datetime "
                             f"(times are in {self.unit or 's'})")
        elif isinstance(at, numbers.Integral):
            ns = int(at) * UNITS[check_unit(self.unit)]
        else:
            try:
                x = float(at)
            except (TypeError, ValueError):
                raise InputError(f"control time {at!r} is not a number or a datetime "
                                 f"(times are in {self.unit or 's'})") from None
            if not math.isfinite(x):
                raise InputError(f"control time {at!r} is not finite")
            try:
                ns = int(to_nanoseconds(pa.array([x], pa.float64()), self.unit, "control",
                                        "at")[0])
            except InputError:
                raise out_of_range() from None
        if not NS_MIN <= ns <= NS_MAX:
            raise out_of_range()
        return ns

    def _event(self, ev: ControlEvent) -> None:
        if self._ran:
            raise OptionError("the engine has run; register before run()")
        ev.order = self._order
        self._order += 1
        keys = [(e.ts, e.order) for e in self.control]
        self.control.insert(bisect.bisect(keys, (ev.ts, ev.order)), ev)

    # ----- running ------------------------------------------------------------------------
    def stop(self, reason: str = "interrupted") -> None:
        """Stop at the next boundary between two arrivals (safe from a signal handler):
        every output then holds exactly the results of the arrivals processed, and
        ``stats`` says where each input stopped (``reason``: its ``stopped``)."""
        self._stop_reason = reason
        self._stop = True

    def run(self, max_arrivals: int | None = None) -> dict[str, QueryHandle]:
        """Process every input (or the first ``max_arrivals``: ``stats["stopped"]`` is then
        "max_arrivals N reached" if input was left); returns the handles (each with its
        output). An error, or a KeyboardInterrupt, stops every query and removes
        their output files (``stats["stopped"]`` names it); ``stop()`` keeps them."""
        if self._ran:
            raise OptionError("an Engine runs once")
        if max_arrivals is not None and (not is_int(max_arrivals) or max_arrivals < 0):
            raise OptionError(f"max_arrivals must be a whole number >= 0 (or None), got "
                              f"{max_arrivals!r}")
        self._ran = True
        self._rejected_count = 0
        t0 = time.process_time()
        self._closed: dict[str, str] = {}  # query id -> its output file, finished
        view = SimpleNamespace(
            streams=[StreamRef(n, n) for n in self.sources],
            columns={n: tuple(s.schema.names) for n, s in self.sources.items()})
        # (numbered: a stop knows each input's first row not processed)
        merger = _NumberedMerger(view, self.sources, self.timestamp, self.unit, self.lateness)
        names = list(self.sources)
        aborted = False
        control, ci = self.control, 0
        ex = self.ex
        arrivals = 0
        last = None  # the time of the last arrival processed
        done = None  # at a stop: per source, its first row not processed
        at: tuple = (None, 0)  # (the arrivals in process, the first not processed)
        try:
            for arr in merger:
                at = (arr, 0)
                ts_list = arr.timestamps
                lo, n = 0, len(ts_list)
                if max_arrivals is not None:
                    n = min(n, max_arrivals - arrivals)
                while lo < n:
                    if ci < len(control):
                        hi = min(n, bisect.bisect_left(ts_list, control[ci].ts, lo))
                    else:
                        hi = n
                    tie = self._tie(arr, names, lo, hi) if self._watch else None
                    if tie is not None:
                        hi = tie
                    process = ex.process
                    streams, rows = arr.streams, arr.rows
                    k = lo
                    while k < hi and not self._stop:  # (a stop is seen every STOP_EVERY)
                        end = min(hi, k + STOP_EVERY)
                        for j in range(k, end):
                            process(names[streams[j]], ts_list[j], rows[j])
                        arrivals += end - k
                        last, k = ts_list[end - 1], end
                        at = (arr, k)
                    if self._stop and k < n:
                        self.interrupted, self.stopped = True, self._stop_reason
                        n = k
                        break
                    lo = hi
                    if tie is not None:
                        self._fail_ties(arr, names, tie)
                        continue
                    if lo < n:
                        ci = self._apply(ci, ts_list[lo])
                    self._flush(False)
                self._flush(False)
                # Input is left beyond max_arrivals when this batch was cut (an input that
                # ends there runs on to its end: its control events, no stop reason).
                if not self.stopped and n < len(ts_list):
                    self.stopped = f"max_arrivals {max_arrivals:,} reached"
                if self.stopped:
                    done = self._stopped_at(merger, arr, n)
                    self._reject(merger, done)
                    break
                self._reject(merger)
            else:
                while ci < len(control):
                    ci = self._apply(ci, float("inf"))
        except BaseException as exc:
            # An error (or Ctrl-C inside an arrival) stops every query: their output files
            # are removed, not left holding what came before it (as the single-query CLI
            # does); the figures say where it stopped.
            aborted = True
            self._abort_outputs()
            self._failed(exc)
            done = self._stopped_at(merger, *at)
            with contextlib.suppress(Exception):  # the late rows before it (the error
                self._reject(merger, done)        # raised is the run's, not on_rejected's)
            self._set_stats(merger, arrivals, t0, last, done)
            raise
        finally:
            close_inputs(merger)  # (the input files: closed now, however the run ended)
            if not aborted:  # (a stop keeps the results so far, as it does there)
                try:
                    self._finish_outputs()
                except BaseException as exc:
                    self._failed(exc)
                    self._set_stats(merger, arrivals, t0, last, done)
                    raise
        self._reject(merger, done)
        self.rejected = pa.Table.from_batches(self.rejected, schema=REJECTED_SCHEMA)
        self._set_stats(merger, arrivals, t0, last, done)
        return self.handles

    def _failed(self, exc: BaseException) -> None:
        """``stopped`` of a run that raised: "interrupted" (a KeyboardInterrupt) or the
        error."""
        if self.stopped is None:
            self.interrupted = isinstance(exc, KeyboardInterrupt)
            self.stopped = "interrupted" if self.interrupted else \
                f"failed: {type(exc).__name__}: {exc}"

    @staticmethod
    def _stopped_at(merger: _NumberedMerger, arr, k: int) -> dict[str, int]:
        """Per source, its first row not processed when the run stopped at arrival ``k``
        of ``arr``; the late rows past it, not reached, are dropped from the merger's."""
        numbers = merger.row_numbers
        if arr is not None and len(numbers) == len(arr):
            done = merger.first_unprocessed(arr.streams[k:], numbers[k:])
        else:
            done = merger.first_unprocessed()
        late = merger.rejected
        late[:] = [r for r in late if r["row"] < done[r["stream"]]]
        return done

    def _set_stats(self, merger, arrivals: int, t0: float, last, done) -> None:
        """The run's figures (``done``: at a stop, per source, the rows processed)."""
        ex = self.ex
        self.stats = {"arrivals": arrivals, "cpu_seconds": time.process_time() - t0,
                      "rejected": self._rejected_count, **getattr(ex, "counts", {}),
                      "queries": {h.id: {"emitted": h.emitted, "state": h.state,
                                         **({"error": h.error} if h.error else {})}
                                  for h in self.handles.values()},
                      "rows_read": merger.positions(),
                      "rows_processed": done if done is not None else merger.positions(),
                      "stopped": self.stopped}
        if last is not None:
            self.stats["last_event_time"] = last / 1e9

    def abort_outputs(self) -> None:
        """Remove every query's output file, finished or not (a later step of the run
        failed, e.g. writing the rejected rows)."""
        self._abort_outputs()

    def _finish_outputs(self) -> None:
        """The last results out and every output file closed. An output failing here (a
        callback raising at the last flush, a full disk) is an error of the run too: every
        output file is removed, as above (a raising callback left the other queries'
        temporary files behind, their outputs never written)."""
        try:
            self._flush(True)
            for h in self.handles.values():
                self._open_output(h)  # (a query never registered gets its empty file)
                self._close_output(h)
        except BaseException:
            self._abort_outputs()
            raise

    def _close_output(self, h: QueryHandle) -> None:
        if h.sink is not None and h.id not in self._closed:
            h.sink.close()
            self._closed[h.id] = h.sink.path

    def _abort_outputs(self) -> None:
        """Every output file removed: those being written, and those finished (queries
        removed earlier) — an error stops every query."""
        for h in self.handles.values():
            if h.sink is not None:
                h.sink.abort()
        for path in self._closed.values():
            Path(path).unlink(missing_ok=True)

    def _reject(self, merger: _NumberedMerger, done=None) -> None:
        """The late rows reached so far leave (``on_rejected``), or are kept: those before
        the first row of their source not processed (``done`` at a stop; else the rows
        the merger buffers), so that a stop reports none beyond where it stopped."""
        if not merger.rejected:
            return
        due = merger.due_rejected(done if done is not None else merger.first_unprocessed())
        if not due:
            return
        batch = rejected_batch(due, self.sources)
        self._rejected_count += batch.num_rows
        if self.on_rejected is not None:
            self.on_rejected(batch)
        else:
            self.rejected.append(batch)

    def _apply(self, ci: int, upto) -> int:
        """Apply the control events with ts <= ``upto`` (before an arrival at ``upto``)."""
        control, ex = self.control, self.ex
        while ci < len(control) and control[ci].ts <= upto:
            ev = control[ci]
            ci += 1
            if ev.ts != float("-inf") and ev.ts != float("inf"):
                ex.advance_to(ev.ts)  # deletions due before the event belong to before it
            h = self.handles[ev.query_id]
            if ev.action == "register":
                if h.state != "pending":
                    raise OptionError(f"query {h.id!r} is registered twice")
                try:
                    ex.add_query(h.id, h.query, h.rows.append, ev.start)
                except OptionError as e:  # (e.g. capacity=: which query, and when)
                    raise OptionError(f"registering query {h.id!r} {self._when(ev.ts)}: "
                                      f"{e}") from None
                h.state = "running"
                self._open_output(h)  # (a file open per running query, not per query)
            elif h.state == "running":
                ex.remove_query(h.id)
                h.state = "removed"
                # Its last results out and its file finished now: a removed query held up
                # to a chunk of rows and an open file until the end of the run.
                self._flush_query(h)
                self._close_output(h)
            self._failures()
        self._failures()
        self._update_watch()
        return ci

    def _when(self, ts) -> str:
        """A control event's time for a message, in the timestamp unit."""
        if ts == float("-inf"):
            return "before any data"
        u = check_unit(self.unit)
        value = ts // UNITS[u] if ts % UNITS[u] == 0 else ts / UNITS[u]
        return f"at event time {value} {u}"

    # ----- [ROWS n] windows and rows of equal time (tie_watch) ------------------------------
    def _update_watch(self) -> None:
        self._watch = tie_watch(((h.id, h.query) for h in self.handles.values()
                                 if h.state == "running"), list(self.sources))

    def _tie(self, arr, names, lo: int, hi: int) -> int | None:
        """``first_tie`` of the arrivals [lo, end of this release), if before ``hi``."""
        k = first_tie(((names[arr.streams[j]], arr.timestamps[j])
                       for j in range(lo, len(arr.timestamps))), self._watch)
        return lo + k if k is not None and lo + k < hi else None

    def _fail_ties(self, arr, names, tie: int) -> None:
        ts = arr.timestamps[tie]
        tied = tied_queries(self._watch, ((names[arr.streams[j]], arr.timestamps[j])
                                          for j in range(tie, len(arr.timestamps))))
        for qid, (src, other) in tied.items():
            self.ex.remove_query(qid)
            h = self.handles[qid]
            h.state, h.error = "failed", tie_error(src, ts, other, names)
        self._update_watch()

    def _failures(self) -> None:
        for qid, err in getattr(self.ex, "failures", ()):
            h = self.handles.get(qid)
            if h is not None and h.state == "running":
                h.state, h.error = "failed", err

    def _open_output(self, h: QueryHandle) -> None:
        if h.output is None or callable(h.output) or h.sink is not None:
            return
        from adaptcq.runtime.output import FileSink, format_of
        path = str(h.output)
        h.sink = FileSink(path, h.schema, format_of(path, None, f"query {h.id} output"),
                          what=f"query {h.id} output")

    def _flush(self, final: bool) -> None:
        self._failures()
        for h in self.handles.values():
            if h.rows and (final or len(h.rows) >= OUT_CHUNK):
                self._flush_query(h)

    def _flush_query(self, h: QueryHandle) -> None:
        """A query's results so far out to its output."""
        if not h.rows:
            return
        rows, h.rows[:] = list(h.rows), []
        batch = rows_to_batch(rows, h.schema, self.unit)
        h.emitted += len(rows)
        if h.sink is not None:
            h.sink.write(batch)
        elif callable(h.output):
            h.output(batch)
        else:
            h.batches.append(batch)

    def explain(self) -> dict:
        """The shared operators, virtual sources, tickets per operator and each query's
        mask (``Eddy.describe``)."""
        return self.ex.describe()


def _check_output(qid: str, output) -> None:
    """A query's output: None (kept in memory), a callable given each RecordBatch, or a
    file path whose suffix names a format (not a name ending with '/', nor a device or
    FIFO), checked at registration (a bad one failed at run(), losing every query's
    results; output=5 wrote a file named 5)."""
    if output is None or callable(output):
        return
    if not isinstance(output, (str, os.PathLike)):
        raise OptionError(f"query {qid}: output {output!r} is neither a file path nor a "
                          "callable")
    from adaptcq.runtime.output import check_file_name, format_of
    format_of(str(output), None, f"query {qid} output")
    check_file_name(str(output), f"query {qid}: output", error=OptionError)


#: Routing policies that draw nothing at random, and why: a seed for one is refused
#: (``Engine(seed=)``, ``--seed``), not ignored (cacq.txt §4.1: a fixed plan is static).
NO_DRAWS = {"fixed": "routes in a priority order and draws nothing at random"}


def unused_seed(routing, seed, *, cli: bool = False) -> str | None:
    """The refusal of ``seed`` when the ``routing`` policy never draws at random (fixed), in
    the Engine's words or, with ``cli``, the command line's; None when the policy draws.
    The one check behind ``Engine(routing="fixed", seed=3)`` and ``--routing fixed
    --seed 3``."""
    why = NO_DRAWS.get(routing) if isinstance(routing, str) else None
    if why is None:
        return None
    if cli:
        return (f"--seed {seed}: --routing {routing} {why}; give --routing tickets, lottery "
                "or random to seed")
    return (f"seed={seed!r}: routing={routing!r} {why}; give routing='tickets', 'lottery' "
            "or 'random' to seed")


@contextlib.contextmanager
def named_errors(where: str):
    """Re-raise a query's registration error prefixed with ``where`` (a control row, a
    ``--sql`` option: which of many queries is wrong), of the same class; a
    ``QueryError`` keeps its SQL and position, so its caret still shows."""
    try:
        yield
    except QueryError as e:
        raise QueryError(f"{where}: {e.message}", e.sql, e.position, e.length) from None
    except InputError as e:
        raise InputError(f"{where}: {e}") from None
    except OptionError as e:
        raise OptionError(f"{where}: {e}") from None


def check_query_id(qid: str) -> None:
    """A query id names its output folder (``query_id=<id>``, locally and on Spark): one
    that could leave the folder or hide in it (a '/' or '\\', a leading '.' or '_') is
    refused. ``../x`` wrote outside ``--output``."""
    if not isinstance(qid, str) or any(c in qid for c in "/\\\0") \
            or qid.startswith((".", "_")):
        raise OptionError(f"query id {qid!r}: an id names its output folder "
                          "(query_id=<id>); it cannot hold '/' or '\\', or start with '.' "
                          "or '_'")


def tie_watch(queries, order) -> dict[str, dict[str, list[str]]]:
    """Which rows of equal time a query cannot share an engine over: for each source, the
    sources (itself included) whose rows of the same time the queries listed cannot take in
    the engine's order, ``order`` being the sources' order, which breaks the engine's ties
    (``first_tie``). ``queries``: (id, LogicalQuery) pairs.

    docs/semantics.md orders rows of equal time by FROM position, and a [ROWS n] window's
    contents depend on that order. A shared engine receives a source's row once, for all its
    aliases, and breaks ties by its own order of the sources, for every query. So a query
    is watched for a tie (1) of two rows of one source it joins with itself, one alias
    having a [ROWS n] window, and (2) of rows of two sources, one with a [ROWS n] window,
    that its FROM lists in the other order than the engine's (with all other windows the
    results do not depend on the order of rows of equal time)."""
    rank = {s: i for i, s in enumerate(order)}
    watch: dict[str, dict[str, list[str]]] = {}
    for qid, query in queries:
        pos: dict[str, list[int]] = {}  # source -> the FROM positions of its aliases
        rows = set()
        for i, st in enumerate(query.streams):
            pos.setdefault(st.source, []).append(i)
            if st.window.kind == "rows":
                rows.add(st.source)
        for a, pa_ in pos.items():
            for b, pb in pos.items():
                if not ({a, b} & rows):
                    continue
                if a == b:
                    clash = len(pa_) > 1
                else:
                    first = rank.get(a, 0) < rank.get(b, 0)  # the engine's: a's rows first
                    clash = any((i < j) != first for i in pa_ for j in pb)
                if clash:
                    watch.setdefault(a, {}).setdefault(b, []).append(qid)
    return watch


def first_tie(arrivals, watch: Mapping[str, Mapping[str, list]]) -> int | None:
    """The index of the first of ``arrivals`` ((source, time) in processing order, one
    release: the mergers release all rows of one time together; a None source is not a
    row) that has the same time as a later arrival of a source it is watched with
    (``tie_watch``), or None. The queries concerned stop before it (``tied_queries``),
    their results so far exact (``tie_error``). Rows of distinct times are not affected."""
    if not watch:
        return None
    seen: dict = {}  # time -> {source: the index of its first row of that time}
    first = None
    for k, (src, ts) in enumerate(arrivals):
        partners = watch.get(src)
        if partners is None:
            if src is not None:
                seen.setdefault(ts, {}).setdefault(src, k)
            continue
        at = seen.setdefault(ts, {})
        for other in partners:
            j = at.get(other)
            if j is not None and (first is None or j < first):
                first = j
        at.setdefault(src, k)
    return first


def tied_queries(watch: Mapping[str, Mapping[str, list]], arrivals) -> dict[str, tuple]:
    """The queries that stop at the tie ``first_tie`` found, ``arrivals`` starting with its
    row: query id -> (its source, the source it ties with)."""
    arrivals = list(arrivals)
    src, ts = arrivals[0]
    present = [s for s, t in arrivals[1:] if t == ts]
    out: dict[str, tuple] = {}
    for other, qids in watch.get(src, {}).items():
        if other in present:
            for qid in qids:
                out.setdefault(qid, (src, other))
    return out


def tie_error(src: str, ts, other: str | None = None, order=()) -> str:
    if other is None or other == src:
        return (f"two rows of source {src} have the same time ({ts / 1e9:g} s of event "
                f"time); the query joins {src} with itself over a [ROWS n] window, whose "
                "contents then depend on the order of its aliases (docs/semantics.md), which "
                "a shared engine cannot follow: run it alone with adaptcq run")
    engine = " before ".join(s for s in order if s in (src, other)) or f"{src} before {other}"
    return (f"rows of sources {src} and {other} have the same time ({ts / 1e9:g} s of event "
            f"time); the query's FROM orders them otherwise than this engine, which takes "
            f"rows of equal time in the order of its sources ({engine}), and its [ROWS n] "
            "window then holds other rows (docs/semantics.md): give the sources in the "
            "order of the query's FROM, or run it alone with adaptcq run")


def _load(path: str):
    import importlib
    mod, name = QUERYSET_EXECUTORS[path].split(":")
    return getattr(importlib.import_module(mod), name)


def _read_table(source) -> pa.Table:
    path = Path(source)
    if not path.exists():
        raise InputError(f"control stream {str(path)!r} does not exist")
    try:
        if path.suffix == ".csv":
            import pyarrow.csv as pacsv
            # As the inputs are read (nulls, booleans), but the text columns as text: a
            # query id 007 or true was read as a number or a boolean and renamed 7, True.
            text = {c: pa.string() for c in ("action", "query_id", "sql", "start")}
            return pacsv.read_csv(path, convert_options=csv_convert_options(text),
                                  parse_options=csv_parse_options())
        import pyarrow.parquet as pq
        return pq.read_table(path)
    except (pa.ArrowException, OSError) as e:
        raise InputError(f"control stream {str(path)!r} cannot be read as "
                         f"{'CSV' if path.suffix == '.csv' else 'Parquet'} (a .csv name is "
                         f"read as CSV, any other as Parquet): {e}") from None
