"""Many continuous queries over shared state in one Spark streaming job (CACQ on Spark).

The single-query Spark runtime (``runtime.spark``; docs/spark.md) with one CACQ eddy
(``engine.eddy.Eddy``; docs/cacq.md) per partition group instead of one ``ContinuousQuery``
(docs/cacq-spark.md)::

    sources ──project──┐
    control ──project──┼─ union ──Split (mapInArrow)──> groupBy(group)
    end of input ──────┘      ──transformWithStateInPandas(one Eddy per partition group)
                                  ──foreachBatch──> out/query_id=<id>/part-<batch>.parquet

* **Partitioning** (``plan_partitions``): one column per source, hashed into P groups as the
  single-query split hashes its attribute class (``runtime.spark._project``). The columns are
  chosen so that every query known when the job starts (``queries=`` and a static control
  table) equates them: a query over several streams has one attribute class holding, for
  each of its streams, that stream's source's partition column. Queries over one stream fit
  any partitioning. With no such choice (or a ``[ROWS n]`` window) the job runs in one
  group, with a ``SplitWarning`` naming why. A query registered later through a control
  stream that does not equate the partition columns is *refused*: its status is
  ``refused`` with the reason, and the other queries keep running.
* **The control stream is data.** Control rows (ts, action, query_id, sql) travel in the
  union with the data; the split replicates every control row to all P groups, and each
  group orders them with its rows by event time (an event at t after every arrival below
  t, before every arrival at t or later; time advanced to t first: ``runtime.multi``'s
  rule). Pending events and the query set are in each group's state, so a restart from the
  checkpoint continues exactly: queries registered before stay registered, later events
  take effect when their time comes. A static control (``queries=`` texts, a control table)
  is written once into the checkpoint (``control/part-00000.parquet``, times already in
  int64 nanoseconds) and read back as a file stream.
* **State**: per group, the eddy's ``snapshot()`` (plain data: SteMs, pending deletions, the
  query set, masks, routing tickets), the rows waiting for the event-time frontier, the
  pending control events and the query states, pickled into the RocksDB state store every
  micro-batch (a whole snapshot per group per micro-batch), restored with
  ``Eddy.restore``; the live eddy stays in the worker while the stored token matches.
* **Output**: results leave the stateful operator as pickled row lists tagged with their
  query (one fixed operator schema for queries of different output schemas); the driver's
  ``foreachBatch`` turns each query's rows into Arrow with the local runtime's
  ``rows_to_batch`` and ``output_schema`` and writes them to ``out/query_id=<id>/`` (hive
  style), one file per query per micro-batch, named by batch id (exactly once).

Every query's output equals ``runtime.multi.Engine``'s for the same inputs and control
stream (tests/test_spark_multi.py); the exceptions are listed in docs/cacq-spark.md.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import math
import os
import pickle
import shutil
import time
import uuid
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import quote

import numpy as np
from pyspark.sql.streaming import StatefulProcessor

from adaptcq.checks import is_int
from adaptcq.errors import AdaptcqError, InputError, OptionError, QueryError
from adaptcq.optimizer.shares import check_groups
from adaptcq.query.logical import LogicalQuery
from adaptcq.runtime.spark import (
    CHUNK,
    FINGERPRINT,
    KIND_REJECTED,
    KIND_RESULT,
    KIND_STATS,
    OUTPUT_MARKER,
    TIME_UNIT,
    _arrow_time_type,
    _check_places,
    _control_folder,
    _given_keys,
    _group_keys,
    _hadoop_literal,
    _project,
    _read_failure,
    _read_stream,
    _resolve_input,
    _spark_kind,
    _time_kind,
    _write_parquet,
    _write_text,
    normalize_sql,
    restart_group_keys,
    signal_end,
    spark_error,
)
from adaptcq.runtime.spark_group import (
    _group_index,
    check_group,
    is_before,
    release,
    reopened_bound,
)
from adaptcq.runtime.spark_split import (
    END,
    MARKERS,
    SplitPlan,
    SplitWarning,
    _file_of,
    _Split,
)
from adaptcq.stream import eventtime as et
from adaptcq.stream.eventtime import lateness_ns

__all__ = [
    "CONTROL",
    "PartitionPlan",
    "PartitionWarning",
    "QuerySetRun",
    "partition_refusal",
    "plan_partitions",
    "query_set_stream",
    "run_cli_multi",
    "run_queries",
    "run_query_files",
]

CONTROL = -2  # stream index of a control row in the union (END, -1, is end of input)
CONTROL_KINDS = {"ns": 0, "us": 1, "int": 2, "float": 3}  # how a control row's time travels
RESULTS_PER_ROW = 20_000  # result tuples per pickled operator output row
FINGERPRINT_VERSION = 1
QUERY_STATES = ("pending", "running", "removed", "refused", "failed")
STATUS_FILE = "_queries.json"  # in the output folder: every query's state, error, rows


# ---------------------------------------------------------------------------------------------
# Partitioning a query set (state-spill.txt §2.1, across queries)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PartitionPlan:
    """How updates are routed to partition groups: ``columns[source]`` is the column whose
    value picks a source's group (None in one group); ``reason`` says why the job runs in
    one group; ``chosen`` says how the columns were chosen."""

    groups: int
    columns: dict[str, str | None]
    reason: str = ""
    chosen: str = ""
    guessed: tuple[str, ...] = ()   # sources hashed on a column no known query joins


class PartitionWarning(UserWarning):
    """A source is hashed on a column that no query known at the start joins: a query
    registered later that joins it on another column will be refused."""


def _class_options(query: LogicalQuery) -> list[dict[str, frozenset]]:
    """For a query over several streams, each attribute class with a column of every
    stream, as {source: the columns of that source it may hash} (a self-join's aliases of
    one source must use one column); in plan_split's order (FROM, then column order)."""
    aliases = query.aliases
    src = {s.alias: s.source for s in query.streams}
    found = []
    for cls in query.classes:
        per: dict[str, frozenset] = {}
        for a in aliases:
            cols = frozenset(c.column for c in cls if c.stream == a)
            per[src[a]] = per[src[a]] & cols if src[a] in per else cols
        if all(per.values()) and len(per) == len(set(src.values())):
            first = min(cls, key=lambda c: (aliases.index(c.stream),
                                            query.columns[c.stream].index(c.column)))
            found.append(((aliases.index(first.stream),
                           query.columns[first.stream].index(first.column)), per))
    found.sort(key=lambda f: f[0])
    return [per for _, per in found]


def _classes_text(query: LogicalQuery) -> str:
    return "; ".join(" = ".join(sorted(map(str, c))) for c in query.classes) or "none"


def plan_partitions(queries: Mapping[str, LogicalQuery], columns: Mapping[str, Sequence[str]],
                    partitions: int, partition_by: Mapping[str, str] | None = None,
                    timestamp: str | None = None) -> PartitionPlan:
    """Choose one partition column per source so that every query in ``queries`` (those
    known when the job starts) keeps each of its results inside one group.

    A query over one stream fits any choice. A query over several needs an attribute class
    holding, for each of its streams, the partition column of the stream's source. The
    choice is searched over the queries' classes (first fitting choice in query order, each
    query's classes in FROM and column order); ``partition_by`` fixes some or all columns.
    A source no such query reads (only selections, or no query yet) is hashed on a column
    of the same name as another source's partition column when it has one, else on its
    first column other than the timestamp: give ``partition_by`` to choose it for queries
    that will be registered later. Without a fitting choice, or with a ``[ROWS n]`` window
    (the n most recent rows of a whole stream, which no partition knows), one group."""
    single = {s: None for s in columns}
    check_groups(partitions, f"partitions={partitions:,}", OptionError)
    if partition_by:
        for s, c in partition_by.items():
            if s not in columns:
                raise OptionError(f"partition_by: unknown source {s!r} (sources: "
                                  f"{', '.join(columns)})")
            if c not in columns[s]:
                raise OptionError(f"partition_by: source {s} has no column {c!r} (its "
                                  f"columns: {', '.join(columns[s])})")
    if partitions <= 1:
        return PartitionPlan(1, single)
    rows = [f"{qid} ({s.alias})" for qid, q in queries.items() for s in q.streams
            if s.window.kind == "rows"]
    if rows:
        return PartitionPlan(1, single, (
            f"query {', '.join(rows)} has a [ROWS n] window: it holds the n most recent rows "
            "of the whole stream, which no partition of the stream can know; use [RANGE ...] "
            "windows to let the queries run in partition groups"))
    needs = []
    for qid, q in queries.items():
        if len(q.streams) < 2:
            continue
        opts = _class_options(q)
        if not opts:
            aliases = q.aliases
            return PartitionPlan(1, single, (
                f"query {qid} has no join attribute shared by all its streams (attribute "
                f"classes: {_classes_text(q)}), so no partition function keeps each of its "
                "results in one group (state-spill.txt §2.1, footnote 1); an equality putting "
                f"one column of every stream in one class (e.g. "
                f"{' = '.join(f'{a}.<col>' for a in aliases)}) would let the queries run in "
                "partition groups"))
        needs.append((qid, q, opts))
    allowed = {s: frozenset(partition_by[s]) if partition_by and s in partition_by
               else frozenset(cols) for s, cols in columns.items()}
    solution = _search(needs, allowed)
    if solution is None:
        joins = "; ".join(f"{qid} equates {_classes_text(q)}" for qid, q, _ in needs)
        if partition_by:
            raise OptionError(
                "partition_by " + ", ".join(f"{s}.{c}" for s, c in partition_by.items())
                + f" is not equated by every query known at the start ({joins}): each "
                "query over several streams must put the partition column of each of its "
                "streams in one attribute class")
        return PartitionPlan(1, single, (
            "no choice of one column per source is equated by every query known at the "
            f"start ({joins}), so no one partition function keeps every query's results in "
            "one group (state-spill.txt §2.1, footnote 1); queries that join their streams "
            "on the same columns of each source run in partition groups"))
    constrained = {s for _, _, opts in needs for o in opts for s in o} | set(partition_by or ())
    chosen = {}
    for s, cols in columns.items():
        if s in constrained:
            chosen[s] = min(solution[s], key=list(cols).index)
    how = []
    for s, cols in columns.items():
        if s in chosen:
            continue
        same = [c for c in chosen.values() if c in cols]
        rest = [c for c in cols if c != timestamp] or list(cols)
        chosen[s] = same[0] if same else rest[0]
        how.append(f"{s}.{chosen[s]}")
    text = ", ".join(f"{s}.{chosen[s]}" for s in columns)
    if how:
        text += (f" ({', '.join(how)}: no query known at the start joins "
                 f"{'it' if len(how) == 1 else 'them'}; partition_by chooses)")
    guessed = tuple(s for s in columns if s not in constrained)
    return PartitionPlan(partitions, {s: chosen[s] for s in columns}, "", text, guessed)


def _search(needs: list, allowed: dict[str, frozenset]) -> dict[str, frozenset] | None:
    """The first choice (depth first) of one class per query whose columns intersect."""
    if not needs:
        return allowed
    _, _, opts = needs[0]
    for opt in opts:
        nxt = dict(allowed)
        for s, cols in opt.items():
            nxt[s] = nxt[s] & cols
        if all(nxt[s] for s in opt):
            found = _search(needs[1:], nxt)
            if found is not None:
                return found
    return None


def partition_refusal(query: LogicalQuery, plan: PartitionPlan) -> str | None:
    """Why ``query`` cannot run in ``plan``'s partition groups (None: it can)."""
    if plan.groups <= 1:
        return None
    rows = [s.alias for s in query.streams if s.window.kind == "rows"]
    if rows:
        return (f"stream {', '.join(rows)} has a [ROWS n] window, which holds the n most "
                f"recent rows of the whole stream, and the job runs in {plan.groups} "
                "partition groups; use a [RANGE ...] window")
    if len(query.streams) < 2:
        return None
    src = {s.alias: s.source for s in query.streams}
    for cls in query.classes:
        if all(any(c.stream == a and c.column == plan.columns.get(src[a]) for c in cls)
               for a in query.aliases):
            return None
    need = " = ".join(f"{a}.{plan.columns.get(src[a])}" for a in query.aliases)
    return (f"it does not equate the partition columns ({need}): the job runs in "
            f"{plan.groups} partition groups hashing "
            + ", ".join(f"{s}.{c}" for s, c in plan.columns.items())
            + " (fixed when it started), so its results could "
            f"span groups (its attribute classes: {_classes_text(query)}); register it in a "
            "job partitioned on its join columns (partition_by), or in one group")


# ---------------------------------------------------------------------------------------------
# The split: data rows to their group, control rows to every group
# ---------------------------------------------------------------------------------------------


@dataclass
class _QSConfig:
    qid: str                       # this run's id (keys of the live eddies in a worker)
    sources: list[str]             # stream index -> source name
    schemas: dict                  # source -> {column: kind}, in row order
    stream_columns: list[list[str]]
    mode: str
    routing: str
    routing_options: dict
    seed: int
    capacity: int | None
    routing_epoch: int | None
    udfs: dict
    groups: int
    keys: list[int]
    partition: PartitionPlan
    lateness: float
    lateness_ns: int
    timestamp: str
    unit: str | None
    ts_kinds: list[str]
    signed: bool = False
    sign: str | None = None
    reported: list = field(default_factory=list)
    key_partitions: int | None = None  # the session's shuffle partitions (error messages)


def _control_time(kind: int, raw, action: str | None, unit: str | None):
    """A control row's time in int64 ns (±inf: before any data / after all data), with
    ``runtime.multi.Engine``'s conversion (its ``_ts``), so both runtimes agree on ties."""
    from adaptcq.runtime.multi import Engine
    if raw is None:
        return -math.inf if action == "register" else math.inf
    if kind == CONTROL_KINDS["ns"]:
        return int(raw)
    if kind == CONTROL_KINDS["us"]:
        raw = datetime.datetime(1970, 1, 1) + datetime.timedelta(microseconds=int(raw))
    return Engine._ts(SimpleNamespace(unit=unit), raw)


class _QSSplit(_Split):
    """The split (``runtime.spark._Split``) of a query set: one packet per partition group
    per input Arrow batch, carrying the group's data rows, every stream's maximum event
    time (punctuation), and *every* control row of the batch: each group sees the whole
    control stream."""

    @staticmethod
    def _numbered(s: np.ndarray) -> np.ndarray:
        return s != END  # data rows and control rows

    @staticmethod
    def _order_class(stream: int):
        return stream == CONTROL  # control rows are numbered apart from data rows

    def __call__(self, batches):
        import pyarrow as pa
        cfg = self.cfg
        P = cfg.groups
        for batch, s, end, o1, o2, t, maxima in self._prepared(batches):
            g = batch.column("_g").to_numpy(zero_copy_only=False)
            controls = self._controls(batch, np.flatnonzero(s == CONTROL), o1, o2)
            out_g, out_p = [], []
            for gi in range(P):
                idx = np.flatnonzero((g == gi) & (s >= 0)) if P > 1 else np.flatnonzero(s >= 0)
                out_g.append(cfg.keys[gi])
                packet = (*self._packet(batch, s, t, idx, end, maxima, o1, o2), controls)
                out_p.append(pickle.dumps(packet, protocol=pickle.HIGHEST_PROTOCOL))
            yield pa.RecordBatch.from_arrays(
                [pa.array(out_g, pa.int32()), pa.array(out_p, pa.binary())], ["_g", "_p"])

    def _controls(self, batch, idx: np.ndarray, o1: list, o2: np.ndarray) -> list[tuple]:
        """The batch's control events: (t, file key, row, action, query_id, sql, error)."""
        if not len(idx):
            return []
        import pyarrow as pa
        sub = batch.take(pa.array(idx))
        cols = {c: sub.column(c).to_pylist() for c in ("_ck", "_ti", "_td", "_ca", "_cq",
                                                         "_cs")}
        out = []
        for j, r in enumerate(idx.tolist()):
            kind, action, qid, sql = cols["_ck"][j], cols["_ca"][j], cols["_cq"][j], \
                cols["_cs"][j]
            raw = cols["_td"][j] if kind == CONTROL_KINDS["float"] else cols["_ti"][j]
            f = _file_of(o1[r])
            where = f"control stream{f' (file {f})' if f else ''} row {int(o2[r])}"
            err, t = None, math.inf
            if action not in ("register", "deregister"):
                err = f"{where}: action {action!r}; choose register or deregister"
            elif not qid:
                err = f"{where}: no query_id"
            elif action == "register" and not sql:
                err = f"{where}: register needs the query's sql"
            else:
                try:
                    t = _control_time(kind, raw, action, self.cfg.unit)
                except (ValueError, OverflowError, TypeError) as e:
                    err = f"{where}: bad time {raw!r} in 'ts' ({e})"
            out.append((t, o1[r] or "", int(o2[r]), action, qid, sql, err))
        return out


# ---------------------------------------------------------------------------------------------
# One partition group: an eddy, its event-time buffer and its control events
# ---------------------------------------------------------------------------------------------

_PARSED: dict[tuple[str, str], LogicalQuery] = {}


def _parse(cfg: _QSConfig, sql: str) -> LogicalQuery:
    q = _PARSED.get((cfg.qid, sql))
    if q is None:
        from adaptcq.query.cql import parse_query
        kw = {"udfs": cfg.udfs} if cfg.udfs else {}
        q = parse_query(sql, cfg.schemas, **kw)
        for s in q.streams:
            if s.source not in cfg.schemas:
                raise QueryError(f"unknown source {s.source!r} (sources: "
                                 f"{', '.join(cfg.schemas)})", sql, s.position)
        while len(_PARSED) > 4096:
            del _PARSED[next(iter(_PARSED))]
        _PARSED[(cfg.qid, sql)] = q
    return q


def _new_eddy(cfg: _QSConfig):
    from adaptcq.adapt.routing import make_routing
    from adaptcq.engine.eddy import Eddy
    policy = make_routing(cfg.routing, seed=cfg.seed, **cfg.routing_options)
    return Eddy(cfg.schemas, policy, mode=cfg.mode, time_unit=TIME_UNIT, udfs=cfg.udfs,
                **({"capacity": cfg.capacity} if cfg.capacity else {}),
                **({"routing_epoch": cfg.routing_epoch} if cfg.routing_epoch else {}))


@dataclass
class _QuerySetGroup:
    """A partition group's eddy and the buffer in front of it.

    As ``runtime.spark._GroupEngine``: ``frontier[i]`` is the largest event time of stream i
    over all micro-batches (the same in every group), rows wait in ``pending`` until nothing
    that can still arrive precedes them, late rows are rejected. Control events wait in
    ``pending`` too, keyed ``(t, -1, ...)`` so that an event at t goes after every row below
    t and before every row at t or later; one is released once every stream's frontier
    (minus the allowed lateness) has reached t. A control row arriving after the data
    passed its time (``t <= bound``, the release point of earlier micro-batches, the same
    in every group) takes effect at once, before the micro-batch's rows, and its query's
    status says so (``late``).

    ``queries`` holds every query the control stream named: its state (``QUERY_STATES``),
    SQL, error and the rows it emitted in this group; ``control_errors`` the control rows
    that could not be applied (a bad action, a second registration of an id, ...)."""

    eddy: object
    groups: int
    frontier: list
    pending: list = field(default_factory=list)  # (t, stream | -1, seq, file, row, payload)
    seq: int = 0
    closed: bool = False
    late: int = 0
    bound: float = -math.inf
    queries: dict = field(default_factory=dict)
    control_errors: list = field(default_factory=list)
    peak_rows: int = 0
    out: dict = field(default_factory=dict, repr=False)  # qid -> rows emitted this step
    bound_s: int = 0  # the release bound's stream (FROM position) at ``bound``

    def emitter(self, qid: str):
        return self.out.setdefault(qid, []).append

    @classmethod
    def new(cls, cfg: _QSConfig) -> _QuerySetGroup:
        return cls(_new_eddy(cfg), cfg.groups, [-math.inf] * len(cfg.sources))

    def dumps(self, cfg: _QSConfig | None = None, gkey: int | None = None) -> bytes:
        group = None if cfg is None else _group_index(cfg, gkey)
        return pickle.dumps({
            "v": 1, "eddy": self.eddy.snapshot(), "groups": self.groups, "group": group,
            "key_partitions": None if cfg is None else cfg.key_partitions,
            "frontier": self.frontier, "pending": self.pending, "seq": self.seq,
            "closed": self.closed, "late": self.late, "bound": self.bound,
            "bound_s": self.bound_s,
            "queries": self.queries, "control_errors": self.control_errors,
            "peak_rows": self.peak_rows}, protocol=pickle.HIGHEST_PROTOCOL)

    @classmethod
    def loads(cls, cfg: _QSConfig, blob: bytes, gkey: int | None = None) -> _QuerySetGroup:
        from adaptcq.adapt.routing import restore_routing
        from adaptcq.engine.eddy import Eddy
        st = pickle.loads(blob)
        if st["groups"] != cfg.groups:
            raise AdaptcqError(
                f"the checkpoint was written with {st['groups']} partition groups and the "
                f"job now has {cfg.groups}; restart with the same partitions (rows would "
                "otherwise meet state of other keys)")
        if gkey is not None:
            check_group(cfg, gkey, st)
        if "bound_s" in st:
            frontier, (bts, bs) = st["frontier"], (st["bound"], st["bound_s"])
        else:  # written before it was kept: the bound came from the frontier, which every
            # later row passes anyway, or was +inf, closed by an end of input then
            frontier, (bts, bs) = reopened_bound(
                {"frontier": st["frontier"], "bound": (st["bound"], 0)}, cfg.lateness_ns)
        g = cls(None, st["groups"], frontier, st["pending"], st["seq"], st["closed"],
                st["late"], bts, st["queries"], st["control_errors"], st["peak_rows"],
                bound_s=bs)
        snap = st["eddy"]
        emits = {h[0]: g.emitter(h[0]) for h in snap["queries"]}
        g.eddy = Eddy.restore(snap, cfg.schemas, restore_routing(snap["policy"]),
                              lambda sql: _parse(cfg, sql), emits, udfs=cfg.udfs or None)
        return g

    def step(self, cfg: _QSConfig, packets: list[tuple]) -> tuple[dict, list]:
        """One micro-batch. Returns ({query id: result rows}, rejected rows)."""
        L = cfg.lateness_ns
        seq = self.seq
        self.seq += 1
        old = list(self.frontier)
        bmax = list(old)
        prev = self.bound
        end = False
        rejected, new, controls = [], [], []
        reopen = False
        for end_p, maxima, streams, tss, _signs, o1, o2, rows, ctl in packets:
            end |= end_p
            controls.extend(ctl)
            reopen |= bool(maxima)
            for i, m, _ in maxima:
                bmax[i] = max(bmax[i], m)
            for k in range(len(rows)):
                i, ts = streams[k], tss[k]
                # Not late, yet before what was processed already: only after an end
                # of input.
                late = ts < old[i] - L
                after = not late and is_before(ts, i, (prev, self.bound_s))
                if after or late:
                    self.late += 1
                    f = _file_of(o1[k])
                    row = o2[k] if f is not None or not (o1[k] or "") else -1
                    rejected.append((cfg.sources[i], row, f, ts, (
                        "arrived after end of input" if self.closed or after else
                        f"late by more than the allowed lateness ({cfg.lateness:g} s)")))
                    continue
                new.append((ts, i, seq, o1[k] or "", o2[k], rows[k]))
        # Control rows in stream order (packets may come in any order): receipt is where a
        # second registration of one id is refused, identically in every group.
        late_ctl = []
        for t, k1, k2, action, qid, sql, err in sorted(controls, key=lambda c: (c[1], c[2])):
            if err is not None:
                self.control_errors.append(err)
                continue
            if action == "register":
                if qid in self.queries:
                    self.control_errors.append(
                        f"query id {qid!r} is registered twice (control row {k2}); the "
                        "second registration is ignored")
                    continue
                self.queries[qid] = {"state": "pending", "sql": sql, "error": None,
                                     "rows": 0, "at": None if math.isinf(t) else t}
            item = (t, -1, seq, k1, k2, (action, qid, sql))
            if prev > -math.inf and t <= prev:
                late_ctl.append(item)
            else:
                new.append(item)
        self.frontier = bmax
        for item in late_ctl:
            self._apply(cfg, item[0], *item[5], late=True)
        # Input after an end of input (a restart over files added since) re-opens the
        # group: its rows and control events wait for the frontier again.
        self.closed = (self.closed and not reopen) or end
        go, self.pending, (bound_ts, self.bound_s), advance = release(
            self.pending + new, self.frontier, (prev, self.bound_s), end, L)
        eddy, names = self.eddy, cfg.sources
        tie = self._tie(go, names)
        for k, r in enumerate(go):
            if k == tie:  # (runtime.multi.first_tie) the queries concerned stop here
                self._fail_ties(go[k:], names)
                tie = self._tie(go[k:], names)
                tie = None if tie is None else k + tie
            if r[1] >= 0:
                eddy.process(names[r[1]], r[0], r[5])
            else:
                if r[0] > advance > -math.inf:
                    # At the end of input, an event after the last arrival (a removal with
                    # no time, say) comes after the deletions that arrival made due, even
                    # when that arrival is in another group.
                    eddy.advance_to(advance)
                self._apply(cfg, r[0], *r[5])
                # (a query registered here is watched from its first row on)
                nxt = self._tie(go[k + 1:], names)
                tie = None if nxt is None else k + 1 + nxt
        # Deletions due before the release point (runtime.spark._GroupEngine.step): every
        # row and control event that could precede them has been processed.
        if advance > -math.inf:
            eddy.advance_to(advance)
        self.bound = bound_ts  # (never below prev: ``release``)
        self._failures()
        out = {}
        for qid, lst in self.out.items():
            if lst:
                out[qid] = list(lst)
                lst.clear()
                if qid in self.queries:
                    self.queries[qid]["rows"] += len(out[qid])
        self.peak_rows = max(self.peak_rows, self.state_rows())
        return out, rejected

    def _apply(self, cfg: _QSConfig, t, action: str, qid: str, sql: str | None,
               late: bool = False) -> None:
        """One control event (``runtime.multi.Engine._apply``): time advanced to t first."""
        eddy = self.eddy
        if not late and not math.isinf(t):
            eddy.advance_to(t)
        info = self.queries.get(qid)
        if action == "register":
            if info is None or info["state"] != "pending":
                return
            reason = None
            try:
                query = _parse(cfg, sql)
                reason = partition_refusal(query, cfg.partition)
                if reason is None:
                    eddy.add_query(qid, query, self.emitter(qid), "now")
            except AdaptcqError as e:
                reason = str(e)
            info["state"] = "refused" if reason else "running"
            info["error"] = reason
        elif info is None:
            self.control_errors.append(f"deregisters {qid!r}, which no control row "
                                       "registers")
            return
        elif info["state"] == "running":
            eddy.remove_query(qid)
            info["state"] = "removed"
        if late:
            info["late"] = (f"its {action} row arrived after the data had passed its time; "
                            "it took effect when it arrived")
        self._failures()

    def _tie(self, go: list, names) -> int | None:
        """The first released row whose time a released row of a source it is watched
        with shares (``runtime.multi.tie_watch``, ``first_tie``), or None."""
        from adaptcq.runtime.multi import first_tie, tie_watch
        self._watch = tie_watch(((qid, q.query) for qid, q in self.eddy.queries.items()),
                                names)
        return first_tie(((names[r[1]] if r[1] >= 0 else None, r[0]) for r in go),
                         self._watch)

    def _fail_ties(self, go: list, names) -> None:
        """Stop the queries tied at ``go[0]`` (``runtime.multi.tied_queries``)."""
        from adaptcq.runtime.multi import tie_error, tied_queries
        ts = go[0][0]
        tied = tied_queries(self._watch, ((names[r[1]] if r[1] >= 0 else None, r[0])
                                          for r in go))
        for qid, (src, other) in tied.items():
            self.eddy.remove_query(qid)
            info = self.queries.get(qid)
            if info is not None:
                info["state"], info["error"] = "failed", tie_error(src, ts, other, names)

    def _failures(self) -> None:
        for qid, err in getattr(self.eddy, "failures", ()):
            info = self.queries.get(qid)
            if info is not None and info["state"] == "running":
                info["state"], info["error"] = "failed", err

    def state_rows(self) -> int:
        return sum(len(st.stem) for st in self.eddy.sources.values())


_LIVE: dict[tuple[str, int], tuple[tuple[int, int], _QuerySetGroup]] = {}


class _QSProcessor(StatefulProcessor):
    """The stateful operator of a query set: a ``_QuerySetGroup`` per partition group, its
    state a ValueState ``meta`` (version, random token, chunk count, byte count) and a
    ListState ``blob`` (the pickled group in chunks of ``CHUNK`` bytes), the live group kept
    in the worker while the stored token matches. (A query set's groups are still stored as
    snapshots; single queries store changes: ``runtime.spark_group``.)"""

    def __init__(self, cfg):
        self.cfg = cfg

    def init(self, handle) -> None:
        self.meta = handle.getValueState("meta", "version long, token long, chunks int, "
                                                 "nbytes long")
        self.blob = handle.getListState("blob", "chunk binary")

    def close(self) -> None:
        pass

    def handleInputRows(self, key, rows, timerValues) -> Iterator:
        cfg = self.cfg
        gkey = int(key[0])
        packets = [pickle.loads(b) for pdf in rows for b in pdf.iloc[:, -1]]
        meta = self.meta.get()
        live = _LIVE.get((cfg.qid, gkey))
        if meta is None:
            eng, version, hit = _QuerySetGroup.new(cfg), 0, False
        elif live is not None and live[0] == (meta[0], meta[1]):
            eng, version, hit = live[1], meta[0], True
        else:
            blob = b"".join(c[0] for c in self.blob.get())
            if len(blob) != meta[3]:
                raise AdaptcqError(f"group {gkey}: state snapshot has {len(blob)} bytes, "
                                   f"expected {meta[3]}")
            eng, version, hit = _QuerySetGroup.loads(cfg, blob, gkey), meta[0], False
        _LIVE.pop((cfg.qid, gkey), None)
        t0 = time.process_time()
        out, rejected = eng.step(cfg, packets)
        cpu = time.process_time() - t0
        blob = eng.dumps(cfg, gkey)
        token = int.from_bytes(os.urandom(7), "little")
        self.blob.put([(blob[i:i + CHUNK],) for i in range(0, len(blob), CHUNK)])
        self.meta.update((version + 1, token, -(-len(blob) // CHUNK), len(blob)))
        _LIVE[(cfg.qid, gkey)] = ((version + 1, token), eng)
        while len(_LIVE) > 256:
            del _LIVE[next(iter(_LIVE))]
        yield from _frames(gkey, eng, out, rejected, cpu, len(blob),
                           sum(len(p[7]) for p in packets), hit)


OUT_COLUMNS = ("_aq_kind", "_aq_query", "_aq_rows", "_aq_stream", "_aq_row", "_aq_file",
               "_aq_ts", "_aq_reason", "_aq_info")


def _out_schema():
    from pyspark.sql import types as T
    return T.StructType([
        T.StructField("_aq_kind", T.ByteType()), T.StructField("_aq_query", T.StringType()),
        T.StructField("_aq_rows", T.BinaryType()), T.StructField("_aq_stream", T.StringType()),
        T.StructField("_aq_row", T.LongType()), T.StructField("_aq_file", T.StringType()),
        T.StructField("_aq_ts", T.LongType()), T.StructField("_aq_reason", T.StringType()),
        T.StructField("_aq_info", T.StringType())])


def _frames(gkey: int, eng: _QuerySetGroup, out: dict, rejected: list, cpu: float,
            snapshot_bytes: int, rows_in: int, cache_hit: bool):
    """The operator's output: result row lists (pickled, per query), rejected rows, and one
    statistics row per group per micro-batch."""
    import pandas as pd
    kinds, qids, blobs = [], [], []
    for qid, rows in out.items():
        for a in range(0, len(rows), RESULTS_PER_ROW):
            kinds.append(KIND_RESULT)
            qids.append(qid)
            blobs.append(pickle.dumps(rows[a:a + RESULTS_PER_ROW],
                                      protocol=pickle.HIGHEST_PROTOCOL))
    if kinds:
        n = len(kinds)
        yield pd.DataFrame({"_aq_kind": np.asarray(kinds, np.int8), "_aq_query": qids,
                            "_aq_rows": blobs, "_aq_stream": [None] * n,
                            "_aq_row": [None] * n, "_aq_file": [None] * n,
                            "_aq_ts": [None] * n, "_aq_reason": [None] * n,
                            "_aq_info": [None] * n})
    if rejected:
        src, row, file, ts, why = zip(*rejected)
        n = len(rejected)
        yield pd.DataFrame({"_aq_kind": np.full(n, KIND_REJECTED, np.int8),
                            "_aq_query": [None] * n, "_aq_rows": [None] * n,
                            "_aq_stream": list(src), "_aq_row": list(row), "_aq_file": list(file),
                            "_aq_ts": np.asarray(ts, np.int64), "_aq_reason": list(why),
                            "_aq_info": [None] * n})
    counts = eng.eddy.counts
    counts = counts() if callable(counts) else dict(counts)
    info = {"group": gkey, **counts, "late": eng.late, "pending": len(eng.pending),
            "rows_in": rows_in, "state_rows": eng.state_rows(), "peak_state_rows": eng.peak_rows,
            "snapshot_bytes": snapshot_bytes, "engine_cpu_seconds": cpu,
            "cache_hit": cache_hit, "pid": os.getpid(),
            "now": eng.eddy.now if math.isfinite(eng.eddy.now) else None,
            "queries": eng.queries, "control_errors": eng.control_errors}
    yield pd.DataFrame({"_aq_kind": [KIND_STATS], "_aq_query": [None], "_aq_rows": [None],
                        "_aq_stream": [None], "_aq_row": [None], "_aq_file": [None],
                        "_aq_ts": [None], "_aq_reason": [None],
                        "_aq_info": [json.dumps(info, default=str)]})


# ---------------------------------------------------------------------------------------------
# Building the streaming plan
# ---------------------------------------------------------------------------------------------


def _control_part(df, stream_index: int, unit: str | None, canonical: bool):
    """A control stream in the union's layout: ``_ck`` (how its time travels), the time in
    ``_ti``/``_td``, its order keys (file and row index, as a data stream's), ``_ca`` action,
    ``_cq`` query id, ``_cs`` sql."""
    from pyspark.sql import functions as F
    missing = [c for c in ("ts", "action", "query_id") if c not in df.columns]
    if missing:
        raise InputError(f"control stream: missing column(s) {', '.join(missing)} "
                         "(columns: ts, action, query_id, sql)")
    extra = [c for c in df.columns if c not in ("ts", "action", "query_id", "sql")]
    if extra:  # (ignored before; a start column would ask for what Spark does not offer)
        raise InputError(f"control stream: unknown column(s) {', '.join(extra)} (columns: "
                         "ts, action, query_id, sql; start=window is not offered on Spark)")
    if "sql" not in df.columns:
        df = df.withColumn("sql", F.lit(None).cast("string"))
    tdt = df.schema["ts"].dataType
    tk = _time_kind(tdt)
    if tk is None or tk == "date":
        raise InputError(f"control stream: 'ts' has type {tdt.simpleString()}; it must be a "
                         "timestamp or a number (in the data's timestamp unit)")
    if tk == "us" and unit is not None:
        raise InputError("control stream: 'ts' is a timestamp, and --timestamp-unit applies "
                         "to numeric times")
    # The raw control stream goes to _project (not a projection of it): a file source's
    # _metadata (the row index: the order of events at one time) is read from it.
    view = SimpleNamespace(columns={"control": ["action", "query_id", "sql"]})
    part, _ = _project(df, stream_index, "control", view, SplitPlan(1, {"control": None}), 1,
                       "ts", tk, None, None, "control")
    kind = CONTROL_KINDS["ns"] if canonical else CONTROL_KINDS[tk]
    p = f"c{stream_index}_"
    return part.select(
        F.lit(CONTROL).cast("int").alias("_s"), "_g", "_ti", "_td", "_sg", "_o1", "_o2",
        "_oc", F.lit(kind).cast("byte").alias("_ck"),
        F.col(f"{p}0").cast("string").alias("_ca"), F.col(f"{p}1").cast("string").alias("_cq"),
        F.col(f"{p}2").cast("string").alias("_cs"))


def query_set_stream(spark, sources: Mapping[str, object], controls: Sequence = (), *,
                     known: Mapping[str, LogicalQuery] | None = None, timestamp: str = "ts",
                     timestamp_unit: str | None = None, mode: str = "append",
                     routing: str = "tickets", routing_options: Mapping | None = None,
                     seed: int = 0, partitions: int | None = None,
                     partition_by: Mapping[str, str] | None = None,
                     allowed_lateness: float = 0.0,
                     order: str | Mapping[str, str] | None = None,
                     end_of_input: str | os.PathLike | None = None,
                     udfs: Mapping | None = None, capacity: int | None = None,
                     routing_epoch: int | None = None, group_keys: list[int] | None = None):
    """The streaming plan of a query set: returns (the stateful operator's raw output, info).

    ``sources`` maps each source to a streaming DataFrame; ``controls`` is a list of
    ``(streaming DataFrame, canonical)``: control streams with columns ts, action,
    query_id, sql (``canonical``: ``ts`` already int64 ns, as ``run_queries`` writes
    them). ``known`` are the queries known now, which choose the partition columns
    (``plan_partitions``). The raw output has one row per (group, query, up to
    ``RESULTS_PER_ROW`` results) with the pickled rows, rejected rows and statistics rows
    (``_aq_kind``); ``run_queries`` writes it. ``group_keys``: the groups' grouping keys
    of the checkpoint's first run (``info["group_keys"]``; default: chosen for the
    session's ``spark.sql.shuffle.partitions``, as ``runtime.spark.continuous_query``)."""
    from pyspark.sql import functions as F

    et.check_unit(timestamp_unit)
    tz = spark.conf.get("spark.sql.session.timeZone")
    names = list(sources)
    ts_kinds = []
    for name, df in sources.items():
        if not getattr(df, "isStreaming", False):
            raise InputError(f"stream {name}: expected a streaming DataFrame "
                             "(spark.readStream...), got a batch one")
        if timestamp not in df.columns:
            raise InputError(f"stream {name}: no timestamp column {timestamp!r} "
                             f"(its columns: {', '.join(df.columns)})")
        tdt = df.schema[timestamp].dataType
        et.check_time_type(name, timestamp, _arrow_time_type(tdt, tz), timestamp_unit)
        if _time_kind(tdt) is None:
            raise InputError(f"stream {name}: timestamp column {timestamp!r} has type "
                             f"{tdt.simpleString()}; it must be a timestamp, a date, or a "
                             "number (seconds, or --timestamp-unit)")
        ts_kinds.append(_time_kind(tdt))
    schemas = {n: {f.name: _spark_kind(f.dataType) for f in df.schema.fields}
               for n, df in sources.items()}
    P = partitions or int(spark.conf.get("spark.sql.shuffle.partitions"))
    plan = plan_partitions(dict(known or {}), {n: list(df.columns) for n, df in sources.items()},
                           P, partition_by, timestamp)
    if plan.reason:
        warnings.warn(f"running in one partition group: {plan.reason}", SplitWarning,
                      stacklevel=2)
    key_partitions = int(spark.conf.get("spark.sql.shuffle.partitions"))
    keys = _group_keys(spark, plan.groups, key_partitions) if group_keys is None else \
        _given_keys(group_keys, plan.groups)
    parts = []
    for i, (name, df) in enumerate(sources.items()):
        view = SimpleNamespace(columns={name: list(df.columns)})
        part, _ = _project(df, i, name, view, SplitPlan(plan.groups, {name: plan.columns[name]}),
                           plan.groups, timestamp, ts_kinds[i], None, order, name)
        parts.append(part)
    for k, (ctl, canonical) in enumerate(controls):
        parts.append(_control_part(ctl, len(names) + k, timestamp_unit, canonical))
    if end_of_input is not None:
        eoi = spark.readStream.schema("value string").text(_control_folder(end_of_input))
        # (Clean-up and tick markers are for spilling queries, ``runtime.spark``: a query
        # set neither spills nor ends on them.)
        eoi = eoi.where(~F.trim(F.col("value")).isin(*MARKERS))
        parts.append(eoi.select(F.lit(END).cast("int").alias("_s"),
                                F.lit(0).cast("int").alias("_g"),
                                F.lit(None).cast("long").alias("_ti"),
                                F.lit(None).cast("double").alias("_td"),
                                F.lit(1).cast("byte").alias("_sg"),
                                F.lit(None).cast("string").alias("_o1"),
                                F.lit(0).cast("long").alias("_o2"),
                                F.lit(False).alias("_oc")))
    union = parts[0]
    for p in parts[1:]:
        union = union.unionByName(p, allowMissingColumns=True)
    cfg = _QSConfig(
        qid=uuid.uuid4().hex, sources=names, schemas=schemas,
        stream_columns=[[f"c{i}_{k}" for k in range(len(sources[n].columns))]
                        for i, n in enumerate(names)],
        mode=mode, routing=routing, routing_options=dict(routing_options or {}), seed=seed,
        capacity=capacity, routing_epoch=routing_epoch, udfs=dict(udfs or {}),
        groups=plan.groups, keys=keys, partition=plan, lateness=float(allowed_lateness),
        lateness_ns=lateness_ns(allowed_lateness), timestamp=timestamp, unit=timestamp_unit,
        ts_kinds=ts_kinds, reported=[True] * len(names), key_partitions=key_partitions)
    packets = union.mapInArrow(_QSSplit(cfg), "_g int, _p binary")
    raw = packets.groupBy("_g").transformWithStateInPandas(
        statefulProcessor=_QSProcessor(cfg), outputStructType=_out_schema(),
        outputMode="Append", timeMode="None")
    return raw, {"plan": plan, "config": cfg, "group_keys": list(keys),
                 "shuffle_partitions": key_partitions}


# ---------------------------------------------------------------------------------------------
# Running a query set to Parquet: a folder per query
# ---------------------------------------------------------------------------------------------


@dataclass
class QuerySetRun:
    """What a ``run_queries`` call did. ``queries[id]``: ``state`` (pending, running,
    removed, refused, failed), ``error``, ``sql``, ``rows`` (result rows written, over every
    run of the checkpoint), ``late`` (a control row that arrived after its time)."""

    batches: int = 0
    rows_in: int = 0
    results: int = 0
    rejected: int = 0
    wall_seconds: float = 0.0
    groups: dict = field(default_factory=dict)    # group key -> its latest statistics
    queries: dict = field(default_factory=dict)
    control_errors: list = field(default_factory=list)
    plan: PartitionPlan | None = None
    output: str | None = None
    rejected_path: str | None = None
    checkpoint: str | None = None
    run_id: str = ""
    restarted: bool = False
    progress: list = field(default_factory=list)
    query: object = field(default=None, repr=False)   # the StreamingQuery while it runs
    end_of_input: str | None = None                    # its end-of-input folder
    inputs: dict = field(default_factory=dict, repr=False)  # run_files' inputs, for errors
    _t0: float = field(default=0.0, repr=False)
    _schema_of: object = field(default=None, repr=False)

    def finish(self) -> QuerySetRun:
        """End of input: process everything available, signal the end (every buffered row
        and pending control event is processed, as at the end of the local runtime's
        input), process that, stop, and write every query's status and empty outputs."""
        return self._close(lambda q: (q.processAllAvailable(), signal_end(self.end_of_input),
                                      q.processAllAvailable()))

    def stop(self, drain: bool = False) -> QuerySetRun:
        """Stop the job (``drain``: after processing everything available); a restart from
        the checkpoint continues exactly where it stopped."""
        return self._close(lambda q: q.processAllAvailable() if drain else None)

    def _close(self, work) -> QuerySetRun:
        q, failure = self.query, None
        if q is None:
            return self
        try:
            work(q)
        except Exception as e:  # noqa: BLE001 - reported below, in one line
            failure = e
        finally:
            self.progress = list(q.recentProgress)
            with contextlib.suppress(Exception):
                q.stop()
            self.query = None
        if failure is None:
            failure = q.exception()
        if failure is not None:
            if isinstance(failure, AdaptcqError):
                raise failure
            # (a CSV row Spark's FAILFAST reader stopped at: named as the local runtime names it)
            read = _read_failure(self.inputs or {}, str(getattr(failure, "desc", None)
                                                         or failure))
            raise (read or spark_error(failure)) from None
        self.wall_seconds = time.perf_counter() - self._t0
        self._write_status()
        return self

    def _write_status(self) -> None:
        if not self.output:
            return
        for qid, cur in self.queries.items():
            folder = self.path(qid)
            if cur["state"] == "refused" or any(folder.glob("*.parquet")):
                continue
            with contextlib.suppress(AdaptcqError):  # SQL that a pending query never parsed
                _write_parquet(self._schema_of(qid, cur["sql"]).empty_table(), folder,
                               "part-empty.parquet")
        _write_text(Path(self.output) / STATUS_FILE,
                    json.dumps(self.queries, indent=1, default=str) + "\n")

    def path(self, query_id: str) -> Path:
        """The folder of one query's results (``pyarrow.parquet.read_table`` reads it)."""
        return Path(self.output) / f"query_id={quote(str(query_id), safe='')}"

    def table(self, query_id: str):
        import pyarrow.parquet as pq
        return pq.read_table(self.path(query_id))

    @property
    def arrivals(self) -> int:
        return sum(g.get("arrivals", 0) for g in self.groups.values())

    @property
    def pending(self) -> int:
        return sum(g["pending"] for g in self.groups.values())

    @property
    def peak_state_rows(self) -> int:
        return sum(g["peak_state_rows"] for g in self.groups.values())


_SEVERITY = {"failed": 4, "refused": 3, "removed": 2, "running": 1, "pending": 0}


class _Writer:
    """``foreachBatch``: each query's rows to ``out/query_id=<id>/part-<batch>.parquet``
    (a re-run batch overwrites its own files), rejected rows to ``rejected``, statistics
    into the run."""

    def __init__(self, run: QuerySetRun, schema_of, unit: str | None):
        self.run, self.schema_of, self.unit = run, schema_of, unit
        self.per_group: dict[int, dict] = {}

    def __call__(self, df, batch_id: int) -> None:
        import pyarrow as pa

        from adaptcq.runtime.local import rows_to_batch
        run = self.run
        tab = df.toArrow()
        kind = tab.column("_aq_kind").to_numpy(zero_copy_only=False)
        for s in tab.filter(kind == KIND_STATS).column("_aq_info").to_pylist():
            info = json.loads(s)
            run.rows_in += info["rows_in"]
            run.groups[info["group"]] = info
            self.per_group[info["group"]] = info["queries"]
            for err in info["control_errors"]:
                if err not in run.control_errors:
                    run.control_errors.append(err)
        self._merge()
        res = tab.filter(kind == KIND_RESULT)
        rows: dict[str, list] = {}
        for qid, blob in zip(res.column("_aq_query").to_pylist(),
                             res.column("_aq_rows").to_pylist(), strict=True):
            rows.setdefault(qid, []).extend(pickle.loads(blob))
        for qid, out in rows.items():
            batch = rows_to_batch(out, self.schema_of(qid, run.queries[qid]["sql"]), self.unit)
            if run.output:
                _write_parquet(pa.Table.from_batches([batch]), run.path(qid),
                               f"part-{batch_id:08d}.parquet")
            run.queries[qid]["rows"] += batch.num_rows
            run.results += batch.num_rows
        rj = tab.filter(kind == KIND_REJECTED)
        if rj.num_rows and run.rejected_path:
            rej = pa.table({
                "stream": rj.column("_aq_stream"), "row": rj.column("_aq_row"),
                "file": rj.column("_aq_file"),
                "ts": pa.array(rj.column("_aq_ts").to_numpy() / 1e9, pa.float64()),
                "reason": rj.column("_aq_reason")})
            if not (Path(run.rejected_path) / OUTPUT_MARKER).exists():
                _mark(Path(run.rejected_path), run)
            _write_parquet(rej, Path(run.rejected_path), f"part-{batch_id:08d}.parquet")
        run.rejected += rj.num_rows
        run.batches += 1

    def _merge(self) -> None:
        """Every query's state over the groups: the same in all of them, except that a
        query whose UDF raised fails only in the group where it did (the most severe state
        wins, with the group named)."""
        agg: dict[str, dict] = {}
        for g, queries in sorted(self.per_group.items()):
            for qid, info in queries.items():
                a = agg.get(qid)
                if a is None or _SEVERITY[info["state"]] > _SEVERITY[a["state"]]:
                    err = info["error"]
                    if info["state"] == "failed" and len(self.per_group) > 1:
                        err = f"{err} (in partition group {g}; the other groups ran on)"
                    agg[qid] = a = {"state": info["state"], "error": err, "sql": info["sql"]}
                for k in ("late", "at"):
                    if info.get(k) is not None:
                        a[k] = info[k]
        for qid, a in agg.items():
            cur = self.run.queries.setdefault(qid, {"rows": 0})
            cur.update(a)


def _arrow_schemas(spark, sources: Mapping[str, object]) -> dict:
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_type
    tz = spark.conf.get("spark.sql.session.timeZone")
    return {n: pa.schema([pa.field(f.name, to_arrow_type(f.dataType, timezone=tz))
                          for f in df.schema.fields]) for n, df in sources.items()}


def _reference(schemas: Mapping, queries, control, timestamp: str, unit: str | None,
               mode: str, routing: str, routing_options: Mapping | None, seed: int,
               udfs, capacity, routing_epoch, allowed_lateness: float,
               labels: Mapping[str, str] | None = None):
    """A local ``runtime.multi.Engine`` over empty inputs of the sources' schemas, holding
    the queries and the static control events: the local runtime's own checks, query ids,
    time conversion and event order, and each query's output schema. ``labels`` names a
    query in its errors (query id -> where it was given: the CLI's ``--sql #k``)."""
    from adaptcq.runtime.multi import Engine, named_errors
    ref = Engine({n: s.empty_table() for n, s in schemas.items()}, timestamp, mode=mode,
                 executor="eddy", routing=routing, routing_options=routing_options,
                 seed=seed, timestamp_unit=unit, allowed_lateness=allowed_lateness,
                 udfs=udfs, capacity=capacity, routing_epoch=routing_epoch)
    if isinstance(queries, str):
        queries = [queries]
    if isinstance(queries, Mapping):
        for qid, sql in queries.items():
            where = (labels or {}).get(qid)
            with named_errors(where) if where else contextlib.nullcontext():
                ref.register(sql, query_id=str(qid))
    else:
        for sql in queries or ():
            ref.register(sql)
    if control is not None:
        ref.load_control(control)  # (ids checked by register: runtime.multi.check_query_id)
        late_start = [e.query_id for e in ref.control if e.start != "now"]
        if late_start:  # (the groups would run it from now: refused, not ignored)
            raise OptionError(f"control stream: query {late_start[0]} starts with the "
                              "window's contents (start=window), which the Spark query set "
                              "does not offer (docs/cacq-spark.md); use start=now, or the "
                              "local engine")
    return ref


def _static_control_table(ref):
    """The reference engine's control events in order, times in int64 ns (null: before any
    data for a registration, after all data for a removal)."""
    import pyarrow as pa
    evs = ref.control
    return pa.table({
        "ts": pa.array([None if math.isinf(e.ts) else int(e.ts) for e in evs], pa.int64()),
        "action": pa.array([e.action for e in evs], pa.string()),
        "query_id": pa.array([e.query_id for e in evs], pa.string()),
        "sql": pa.array([e.sql for e in evs], pa.string())})


_LABELS = {
    "version": "fingerprint version", "queries": "the queries and static control events",
    "control_stream": "the control stream", "timestamp": "timestamp column",
    "timestamp_unit": "timestamp unit", "mode": "mode", "routing": "routing policy",
    "routing_options": "routing options", "seed": "seed", "groups": "partition groups",
    "partition": "partition columns", "allowed_lateness_ns": "allowed lateness (ns)",
    "capacity": "capacity", "routing_epoch": "routing epoch", "sources": "sources",
    "inputs": "inputs", "output": "output", "rejected": "rejected-rows folder",
    "udfs": "UDF names",
}


def _checkpoint(ck: Path, fp: dict) -> tuple[bool, dict | None]:
    """(fresh, stored fingerprint); a checkpoint of another query set is refused."""
    if ck.exists() and not ck.is_dir():
        raise AdaptcqError(f"checkpoint {ck} is a file, not a folder")
    f = ck / FINGERPRINT
    if not f.exists():
        if ck.exists() and any(p.is_file() for p in ck.rglob("*")):
            raise AdaptcqError(f"checkpoint {ck} is not empty and has no {FINGERPRINT}: it "
                               "was not written by adaptcq; use a new checkpoint folder")
        return True, None
    try:
        stored = json.loads(f.read_text())
    except (OSError, ValueError) as e:
        raise AdaptcqError(f"checkpoint {ck}: cannot read its {FINGERPRINT} ({e}); use a "
                           "new checkpoint folder") from None
    if not any((ck / "query" / "commits").glob("[0-9]*")):
        return True, stored
    if stored.get("kind") != "queryset":
        raise AdaptcqError(f"checkpoint {ck} was written by a single-query run; use a new "
                           "checkpoint folder")
    if stored.get("checkpoint") != fp["checkpoint"]:
        raise AdaptcqError(f"checkpoint {ck} was written at {stored.get('checkpoint')} and has "
                           "been moved or copied since; move it back, or use a new checkpoint "
                           "folder")
    diffs = [label for key, label in _LABELS.items() if stored.get(key) != fp.get(key)]
    if diffs:
        raise AdaptcqError(f"checkpoint {ck} was written by a different query set "
                           f"({', '.join(diffs)} differ); use a new checkpoint folder (to add "
                           "queries to a running job, give it a control stream)")
    return False, stored


def _prepare_output(out: Path | None, fresh: bool, run_id: str, label: str = "output",
                    check_only: bool = False) -> None:
    """A fresh run takes an absent or empty folder, or an earlier query-set output (whose
    query folders it removes, unless ``check_only``); a restart appends to its own output
    only."""
    if out is None:
        return
    if out.exists() and not out.is_dir():
        raise AdaptcqError(f"{label} {out} is a file; a query set's output is a folder with "
                           "one sub-folder per query (query_id=<id>)")
    if not out.exists() or not any(out.iterdir()):
        if not fresh and label == "output":
            raise AdaptcqError(f"{label} {out} is gone or empty, but the checkpoint has "
                               "written results there; restore it, or use a new checkpoint")
        return
    try:
        owner = json.loads((out / OUTPUT_MARKER).read_text())
    except (OSError, ValueError):
        raise AdaptcqError(f"{label} {out} is a folder that is not empty and was not written "
                           "by adaptcq on Spark; give a new or empty folder") from None
    if not fresh:
        if owner.get("run") != run_id:
            raise AdaptcqError(f"{label} {out} holds the results of another run (checkpoint "
                               f"{owner.get('checkpoint')}); a restart appends only to its "
                               "own output")
        return
    ours = [p for p in out.iterdir() if p.name in (OUTPUT_MARKER, STATUS_FILE)
            or (p.name.startswith("part-") and p.suffix == ".parquet")
            or (p.is_dir() and p.name.startswith("query_id=")
                and all(f.name.startswith(("part-", ".part-")) for f in p.iterdir()))]
    foreign = sorted(p.name for p in out.iterdir() if p not in ours)
    if foreign:
        raise AdaptcqError(f"{label} {out} holds files adaptcq did not write "
                           f"({', '.join(foreign[:3])}); give a new or empty folder")
    if check_only:
        return
    for p in ours:
        if p.is_dir():
            shutil.rmtree(p)
        else:
            p.unlink()


def _mark(folder: Path, run: QuerySetRun) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    _write_text(folder / OUTPUT_MARKER, json.dumps(
        {"run": run.run_id, "checkpoint": run.checkpoint}, indent=1) + "\n")


def _checked(schemas: Mapping, queries, control, is_stream: bool, partitions: Callable, *,
             checkpoint, output, rejected, timestamp: str, timestamp_unit: str | None,
             mode: str, routing: str, routing_options: Mapping | None, seed: int,
             partition_by: Mapping | None, allowed_lateness: float, udfs, capacity,
             routing_epoch, fingerprint: Mapping | None, labels: Mapping | None = None):
    """What ``run_queries`` checks and plans before it touches Spark's job: the queries
    and a static control (the local Engine's checks, ``_reference``), P (``partitions()``:
    called after them, so a bad query is named first), the partition plan and the
    checkpoint's fingerprint. Returns (reference engine, plan, P, checkpoint path, static
    control table or None, fingerprint, fresh, stored fingerprint)."""
    ref = _reference(schemas, queries, None if is_stream else control, timestamp,
                     timestamp_unit, mode, routing, routing_options, seed, udfs, capacity,
                     routing_epoch, allowed_lateness, labels)
    P = partitions()
    if not is_int(P) or P < 1:
        raise OptionError(f"partitions must be a whole number >= 1, got {P!r}")
    known = {qid: h.query for qid, h in ref.handles.items()}
    plan = plan_partitions(known, {n: list(s.names) for n, s in schemas.items()}, P,
                           partition_by, timestamp)
    ck = Path(str(checkpoint))  # (as written, as every path: docs/spark.md)
    static = _static_control_table(ref) if ref.control else None
    fp = {
        "version": FINGERPRINT_VERSION, "kind": "queryset",
        "queries": [[e.ts if not math.isinf(e.ts) else str(e.ts), e.action, e.query_id,
                     normalize_sql(e.sql) if e.sql else None] for e in ref.control],
        "control_stream": bool(is_stream), "timestamp": timestamp,
        "timestamp_unit": timestamp_unit, "mode": mode, "routing": routing,
        "routing_options": json.loads(json.dumps(dict(routing_options or {}), default=repr)),
        "seed": seed, "groups": plan.groups, "partition": plan.columns,
        "allowed_lateness_ns": lateness_ns(allowed_lateness), "capacity": capacity,
        "routing_epoch": routing_epoch, "udfs": sorted(udfs or {}),
        "sources": {n: [f"{f.name}: {f.type}" for f in s] for n, s in schemas.items()},
        "output": os.path.realpath(output) if output else None,
        "rejected": os.path.realpath(rejected) if rejected else None,
        "checkpoint": os.path.realpath(ck), **dict(fingerprint or {})}
    fresh, stored = _checkpoint(ck, fp)
    return ref, plan, P, ck, static, fp, fresh, stored


def run_queries(spark, sources: Mapping[str, object], queries=None, control=None, *,
                checkpoint: str | os.PathLike, output: str | os.PathLike | None,
                rejected: str | os.PathLike | None = None, timestamp: str = "ts",
                timestamp_unit: str | None = None, mode: str = "append",
                routing: str = "tickets", routing_options: Mapping | None = None,
                seed: int = 0, partitions: int | None = None,
                partition_by: Mapping[str, str] | None = None,
                allowed_lateness: float = 0.0, order: str | Mapping[str, str] | None = None,
                udfs: Mapping | None = None, capacity: int | None = None,
                routing_epoch: int | None = None, finish: bool = True, wait: bool = True,
                schemas: Mapping | None = None, _fingerprint: Mapping | None = None,
                _inputs: Mapping | None = None) -> QuerySetRun:
    """Run many continuous queries over ``sources`` (streaming DataFrames) in one Spark job,
    one CACQ eddy per partition group; each query's results to ``output/query_id=<id>/``.

    ``queries``: SQL texts (ids q1, q2, ...) or {id: SQL}, registered before any data.
    ``control``: a control stream, rows (ts, action, query_id, sql) with action register or
    deregister: a static one (a Parquet/CSV path, an Arrow table, a list of dicts; checked
    now, as ``runtime.multi.Engine.load_control`` checks it), or a streaming DataFrame
    whose rows may arrive while the job runs (they take effect at their time; one whose
    time has passed takes effect on arrival). The queries known now choose the partition
    columns (``plan_partitions``; ``partition_by`` fixes them); a later query that does not
    equate them is refused (its status says why), the others run on.

    Processes everything available, then with ``finish`` signals end of input (so buffered
    rows are processed, as at the end of the local runtime's input) and stops. With
    ``wait=False`` it returns at once, the job running: ``run.finish()`` or ``run.stop()``
    end it (live sources). Restarting with the same ``checkpoint`` continues exactly.
    ``schemas``: the sources' Arrow schemas for the output types (default: from the Spark
    schemas)."""
    import pyarrow as pa

    from adaptcq.runtime.local import output_schema
    is_stream = control is not None and getattr(control, "isStreaming", False)
    if not queries and control is None:
        raise OptionError("no queries: give queries=[SQL, ...] and/or a control stream")
    schemas = dict(schemas) if schemas is not None else _arrow_schemas(spark, sources)
    ref, plan, P, ck, static, fp, fresh, stored = _checked(
        schemas, queries, control, is_stream,
        lambda: partitions or int(spark.conf.get("spark.sql.shuffle.partitions")),
        checkpoint=checkpoint, output=output, rejected=rejected, timestamp=timestamp,
        timestamp_unit=timestamp_unit, mode=mode, routing=routing,
        routing_options=routing_options, seed=seed, partition_by=partition_by,
        allowed_lateness=allowed_lateness, udfs=udfs, capacity=capacity,
        routing_epoch=routing_epoch, fingerprint=_fingerprint)
    known = {qid: h.query for qid, h in ref.handles.items()}
    fp["run"] = uuid.uuid4().hex if fresh else stored["run"]
    # The groups' grouping keys name their state: chosen at the first run (for the
    # session's shuffle partitions), kept in the fingerprint, reused by every restart
    # (Spark restarts with the checkpoint's shuffle partitions, whatever the session says).
    keys = None if fresh else restart_group_keys(stored, ck / "query", plan.groups)
    run = QuerySetRun(plan=plan, output=str(output) if output else None,
                      rejected_path=str(rejected) if rejected else None,
                      checkpoint=fp["checkpoint"], run_id=fp["run"], restarted=not fresh,
                      inputs=dict(_inputs or {}))
    if output:
        _prepare_output(Path(output), fresh, fp["run"])
    if rejected:
        _prepare_output(Path(rejected), fresh, fp["run"], "rejected-rows folder")
    if fresh:
        with contextlib.suppress(OSError):
            shutil.rmtree(ck / "query")
        with contextlib.suppress(OSError):
            shutil.rmtree(ck / "control")
        for f in (ck / "end_of_input").glob("end-*.txt"):
            f.unlink()
        ck.mkdir(parents=True, exist_ok=True)
        fp["shuffle_partitions"] = int(spark.conf.get("spark.sql.shuffle.partitions"))
        fp["group_keys"] = _group_keys(spark, plan.groups, fp["shuffle_partitions"])
        keys = fp["group_keys"]
        _write_text(ck / FINGERPRINT, json.dumps(fp, indent=1) + "\n")
        if static is not None:
            _write_parquet(static, ck / "control", "part-00000.parquet")
    elif output:
        with contextlib.suppress(OSError, ValueError):
            for qid, q in json.loads((Path(output) / STATUS_FILE).read_text()).items():
                run.queries[qid] = {"state": q["state"], "sql": q["sql"],
                                    "error": q.get("error"), "rows": q.get("rows", 0)}
    for qid, h in ref.handles.items():
        run.queries.setdefault(qid, {"state": "pending", "sql": h.sql, "error": None,
                                     "rows": 0})
    if output:
        _mark(Path(output), run)
    eoi = ck / "end_of_input"
    eoi.mkdir(parents=True, exist_ok=True)
    controls = []
    if static is not None:
        # (absolute: the JVM resolves a relative path against its own folder; escaped: Hadoop
        # reads a source's path as a glob)
        ctl = spark.readStream.schema("ts long, action string, query_id string, sql string") \
            .parquet(_hadoop_literal(os.path.realpath(ck / "control")))
        controls.append((ctl, True))
    if is_stream:
        controls.append((control, False))
    schema_cache: dict[str, pa.Schema] = {qid: h.schema for qid, h in ref.handles.items()}

    def schema_of(qid: str, sql: str) -> pa.Schema:
        s = schema_cache.get(qid)
        if s is None:
            s = schema_cache[qid] = output_schema(ref.parse(sql), schemas, timestamp,
                                                  timestamp_unit)
        return s

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SplitWarning)  # warned once, here, below
            raw, _ = query_set_stream(
                spark, sources, controls, known=known, timestamp=timestamp,
                timestamp_unit=timestamp_unit, mode=mode, routing=routing,
                routing_options=routing_options, seed=seed, partitions=P,
                partition_by=partition_by, allowed_lateness=allowed_lateness, order=order,
                end_of_input=eoi, udfs=udfs,
                capacity=capacity,
                routing_epoch=routing_epoch, group_keys=keys)
    except AdaptcqError:
        raise
    except Exception as e:  # noqa: BLE001 - Spark's analysis errors, in one line
        raise spark_error(e) from None
    if plan.reason:
        warnings.warn(f"running in one partition group: {plan.reason}", SplitWarning,
                      stacklevel=2)
    elif plan.guessed and plan.groups > 1:
        warnings.warn(
            f"partition columns {plan.chosen}: a query registered later that joins "
            f"{', '.join(plan.guessed)} on other columns will be refused (give partition_by)",
            PartitionWarning, stacklevel=2)
    writer = _Writer(run, schema_of, timestamp_unit)
    run._t0 = time.perf_counter()
    run.end_of_input = str(eoi)
    try:
        run.query = (raw.writeStream.foreachBatch(writer)
                     .option("checkpointLocation", os.path.abspath(ck / "query"))
                     .queryName(f"adaptcq_queries_{uuid.uuid4().hex[:8]}").start())
    except Exception as e:  # noqa: BLE001 - one line
        raise spark_error(e) from None
    run._schema_of = schema_of
    if wait and finish:
        run.finish()
    elif wait:
        run.stop(drain=True)
    return run


def run_query_files(spark, sources: Mapping[str, str], queries=None, control=None, *,
                    checkpoint: str | os.PathLike, output: str | os.PathLike | None,
                    rejected: str | os.PathLike | None = None, timestamp: str = "ts",
                    timestamp_unit: str | None = None,
                    max_files_per_trigger: int | None = None, **options) -> QuerySetRun:
    """``run_queries`` over Parquet/CSV files (a file, a folder or a glob per source, read
    and checked as the local runtime reads them, with their own Arrow schemas for the
    output types); ``max_files_per_trigger`` cuts them into micro-batches. An output inside
    an input or the checkpoint is refused."""
    inputs = _file_inputs(sources, output, rejected, checkpoint, timestamp, timestamp_unit)
    streams = {n: _read_stream(spark, inp, max_files_per_trigger) for n, inp in inputs.items()}
    return run_queries(spark, streams, queries, control, checkpoint=checkpoint, output=output,
                       rejected=rejected, timestamp=timestamp, timestamp_unit=timestamp_unit,
                       schemas={n: i.schema for n, i in inputs.items()},
                       _fingerprint=_inputs_fingerprint(inputs), _inputs=inputs,
                       **options)


def _file_inputs(sources: Mapping[str, str], output, rejected, checkpoint, timestamp: str,
                 timestamp_unit: str | None) -> dict:
    """The sources' files, read and checked as the local runtime reads them (no Spark); an
    output inside an input or the checkpoint is refused."""
    inputs = {name: _resolve_input(name, path, timestamp, timestamp_unit)
              for name, path in sources.items()}
    _check_places(inputs, str(output) if output else None,
                  str(rejected) if rejected else None, str(checkpoint))
    return inputs


def _inputs_fingerprint(inputs: Mapping) -> dict:
    return {"inputs": {n: i.pattern or os.path.realpath(i.given) for n, i in inputs.items()}}


def check_query_files(sources: Mapping[str, str], queries=None, control=None, *,
                      checkpoint: str | os.PathLike, output: str | os.PathLike | None,
                      partitions: int, rejected: str | os.PathLike | None = None,
                      timestamp: str = "ts", timestamp_unit: str | None = None,
                      mode: str = "append", routing: str = "tickets",
                      routing_options: Mapping | None = None, seed: int = 0,
                      partition_by: Mapping[str, str] | None = None,
                      allowed_lateness: float = 0.0, udfs: Mapping | None = None,
                      capacity: int | None = None, routing_epoch: int | None = None,
                      labels: Mapping[str, str] | None = None) -> None:
    """Everything ``run_query_files`` checks that needs no Spark, before Spark starts (the
    JVM takes seconds): the inputs and places, the queries and a static control with the
    local Engine's checks and messages, P and the partition plan, the checkpoint's
    fingerprint and the output folders. ``labels`` names a query in its errors (the CLI's
    ``--sql #k``). ``run_query_files`` then checks all of it again, in the same code."""
    if not queries and control is None:
        raise OptionError("no queries: give queries=[SQL, ...] and/or a control stream")
    inputs = _file_inputs(sources, output, rejected, checkpoint, timestamp, timestamp_unit)
    is_stream = control is not None and getattr(control, "isStreaming", False)
    *_, fresh, stored = _checked(
        {n: i.schema for n, i in inputs.items()}, queries, control, is_stream,
        lambda: partitions, checkpoint=checkpoint, output=output, rejected=rejected,
        timestamp=timestamp, timestamp_unit=timestamp_unit, mode=mode, routing=routing,
        routing_options=routing_options, seed=seed, partition_by=partition_by,
        allowed_lateness=allowed_lateness, udfs=udfs, capacity=capacity,
        routing_epoch=routing_epoch, fingerprint=_inputs_fingerprint(inputs), labels=labels)
    run_id = None if fresh else stored["run"]
    if output:
        _prepare_output(Path(output), fresh, run_id, check_only=True)
    if rejected:
        _prepare_output(Path(rejected), fresh, run_id, "rejected-rows folder",
                        check_only=True)


# ---------------------------------------------------------------------------------------------
# The command line: adaptcq run --engine spark --executor eddy
# ---------------------------------------------------------------------------------------------

_CLI_HANDLED = {"command", "help", "sql", "input", "timestamp", "timestamp_unit", "executor",
                "mode", "output", "rejected", "allowed_lateness", "no_progress", "engine",
                "master", "partitions", "checkpoint", "format", "summary_json", "routing",
                "routing_option", "queries", "seed", "reorder"}


def run_cli_multi(args, console) -> int:
    """``adaptcq run --engine spark --executor eddy --sql @q1.sql --sql @q2.sql
    [--queries control.parquet] --input NAME=PATH ... --output out/``: the query set on
    Spark, each query's results in ``out/query_id=<id>/`` (``--sql`` queries are q1, q2,
    ... and registered before any data, as on the local engine), a summary, and one line
    per query with its state and rows."""
    from adaptcq.cliargs import parse_inputs, routing_options, run_defaults, sql_arg, sql_where
    from adaptcq.plain import say
    from adaptcq.runtime.spark_session import check_master, get_spark, local_cores

    if args.executor != "eddy":
        raise AdaptcqError(f"--executor {args.executor} is not supported with --engine spark: "
                           "the Spark runtime runs a query set in one CACQ eddy per partition "
                           "group (--executor eddy); use --engine local for the baselines")
    if getattr(args, "output", None) in (None, "-"):
        raise AdaptcqError("--executor eddy writes one output per query: give --output FOLDER")
    if getattr(args, "format", None) not in (None, "parquet"):
        raise AdaptcqError(f"--format {args.format} is not supported with --engine spark: each "
                           "query's output is a folder of Parquet files")
    if getattr(args, "reorder", "off") != "off":
        raise AdaptcqError("--reorder is for single-query MJoins; the eddy routes adaptively "
                           "(--routing)")
    for dest, (flag, default) in run_defaults().items():
        if dest in _CLI_HANDLED or not hasattr(args, dest):
            continue
        value = getattr(args, dest)
        if value == default or value is None or value is False or value == []:
            continue
        raise AdaptcqError(f"{flag}: not for --executor eddy on Spark (a query set; see "
                           "docs/cacq-spark.md for its options)")
    if not args.sql and not args.queries:
        raise AdaptcqError("--executor eddy needs queries: --sql (repeat it) and/or --queries "
                           "FILE")
    sources = parse_inputs(args.input)
    if not sources:
        raise AdaptcqError("give an --input NAME=PATH for each source")
    queries = {f"q{k}": sql_arg(text) for k, text in enumerate(args.sql or [], 1)}
    master = getattr(args, "master", None) or "local[*]"
    check_master(master)
    if getattr(args, "shares", None):
        raise AdaptcqError("--shares: a query set on Spark is split on one column per source "
                           "(--partition-by), not by shares; shares are for one query")
    partitions = getattr(args, "partitions", None)
    if partitions is not None and partitions < 1:
        raise AdaptcqError(f"--partitions must be >= 1, got {partitions}")
    partitions = partitions or local_cores(master)
    output = args.output.rstrip("/") or "/"
    rejected = args.rejected or f"{output}.rejected"
    options = {"timestamp": args.timestamp,
               "timestamp_unit": getattr(args, "timestamp_unit", None), "mode": args.mode,
               "routing": args.routing or "tickets",
               "routing_options": routing_options(args.routing_option or []),
               "seed": args.seed, "allowed_lateness": args.allowed_lateness}
    with _temporary_folder() as tmp:
        checkpoint = args.checkpoint or str(tmp / "checkpoint")
        # Checked before Spark starts (its JVM takes seconds): a bad query or control row is
        # named at once, with the local Engine's messages (docs/cacq-spark.md, "Errors").
        check_query_files(sources, queries, args.queries, checkpoint=checkpoint,
                          output=output, rejected=rejected, partitions=partitions,
                          labels={f"q{k}": sql_where(k, text)
                                  for k, text in enumerate(args.sql or [], 1)}, **options)
        spark = get_spark(master, "adaptcq run")
        import logging
        spark.sparkContext.setLogLevel("OFF")
        py4j_log = logging.getLogger("py4j")
        level = py4j_log.level
        py4j_log.setLevel(logging.CRITICAL + 1)
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", SplitWarning)
                warnings.simplefilter("always", PartitionWarning)
                run = run_query_files(
                    spark, sources, queries, args.queries, checkpoint=checkpoint,
                    output=output, rejected=rejected, partitions=partitions, **options)
        finally:
            spark.sparkContext.setLogLevel("ERROR")
            py4j_log.setLevel(level)
    for w in caught:
        if issubclass(w.category, SplitWarning | PartitionWarning):
            say(console, ("warning:", "yellow"), f" {w.message}", highlight=False)
    console.print(summary_table(run, args, master))
    for qid, q in run.queries.items():
        say(console, f"query {qid}: {q['state']}, {q['rows']:,} result rows -> {run.path(qid)}",
            *((f"  {q['state']}: {q['error']}", "red"),) if q.get("error") else (),
            highlight=False)
    for err in run.control_errors:
        say(console, ("control stream:", "red"), f" {err}", highlight=False)
    if run.rejected:
        console.print(f"wrote {run.rejected:,} rejected rows to {rejected}/ (Parquet)",
                      highlight=False)
    if getattr(args, "summary_json", None):
        from adaptcq.runtime.output import summary_json
        _write_text(Path(args.summary_json), summary_json(summary(run)) + "\n")
    return 0


@contextlib.contextmanager
def _temporary_folder():
    import tempfile
    with tempfile.TemporaryDirectory(prefix="adaptcq-spark-") as d:
        yield Path(d)


def summary(run: QuerySetRun) -> dict:
    """A run's figures as JSON-able data (``--summary-json``)."""
    return {"engine": "spark", "executor": "eddy", "batches": run.batches,
            "input_rows": run.rows_in, "results": run.results, "rejected": run.rejected,
            "wall_seconds": run.wall_seconds, "partition_groups": len(run.groups),
            "partition": run.plan.columns if run.plan else None,
            "one_group_because": run.plan.reason if run.plan else None,
            "checkpoint": run.checkpoint, "restarted": run.restarted, "output": run.output,
            "queries": run.queries, "control_errors": run.control_errors,
            "groups": [run.groups[k] for k in sorted(run.groups)]}


def summary_table(run: QuerySetRun, args, master: str):
    from rich.table import Table
    t = Table(title="run summary (query set on Spark)", show_header=False)
    t.add_column("what")
    t.add_column("value", justify="right")
    t.add_row("executor / routing / mode",
              f"eddy / {args.routing or 'tickets'} / {args.mode}")
    t.add_row("master / partition groups", f"{master} / {len(run.groups)}")
    if run.plan is not None and run.plan.groups > 1:
        t.add_row("partition columns", run.plan.chosen)
    t.add_row("checkpoint", ("continued from " if run.restarted else "new: ")
              + (args.checkpoint or "(temporary)"))
    t.add_row("queries", f"{len(run.queries):,}")
    t.add_row("micro-batches", f"{run.batches:,}")
    t.add_row("input rows", f"{run.rows_in:,}")
    t.add_row("results (all queries)", f"{run.results:,}")
    t.add_row("wall seconds (streaming query)", f"{run.wall_seconds:.2f}")
    t.add_row("peak state, summed over groups (rows)", f"{run.peak_state_rows:,}")
    t.add_row("rejected rows", f"{run.rejected:,}")
    return t
