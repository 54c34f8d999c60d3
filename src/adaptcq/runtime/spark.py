"""The Spark runtime: a continuous query as a partitioned Structured Streaming job.

Pipeline (ARCHITECTURE.md "The Spark pipeline"; docs/spark.md)::

    stream DataFrames ──project──> union ──Split (mapInArrow)──> groupBy(group)
        ──transformWithStateInPandas(one ContinuousQuery per partition group)──> results

* **Split** (state-spill.txt §5: "split operators" route every tuple to the partitioned
  stateful operator instance that owns it). From the query's attribute classes we take one
  class with a column in *every* stream; each update's value of that column is hashed into one
  of P partition groups (Spark's ``pmod(hash(col), P)``, computed in Spark). Every result is
  made of tuples that agree on that column, hence live in one group: state-spill.txt §2.1's
  requirement that "each query result can be generated from tuples within the same
  partition", with a *partition group* (§2.1, Figure 3(b): the partitions with one ID across
  all inputs) as the unit of work and of state. NULL keys never join; they go to group 0,
  where they still occupy (and leave) their windows.
* A query with a ``[ROWS n]`` window, or with no class spanning all streams (a chain
  ``R.a = S.a AND S.b = T.b``: §2.1's footnote, partitioned m-way joins over different columns
  need more than one partition function), runs in one group, with a warning saying so.
* The split also emits, in every packet, the maximum event time and row count of each
  stream it saw (punctuation). Every group receives a packet from every input batch, so every
  group learns the same per-stream event-time frontier each micro-batch, whether or not it got
  rows: that is what orders updates across micro-batch boundaries, decides lateness, and
  drives window expiry in groups that receive no more rows (see ``_GroupEngine.step``).
* **State**: each group's engine (``ContinuousQuery.snapshot()``), its not-yet-released rows
  and its frontier are one pickled blob in the RocksDB state store (a ListState of chunks plus
  a ValueState version/token), written every micro-batch. The live engine stays in the Python
  worker (``_LIVE``) and is reused while the stored token matches, so a micro-batch costs a
  snapshot write, not a rebuild; on any mismatch (another worker, a restart, a retried batch)
  the engine is restored from the store, which is the source of truth.

Output rows have the local runtime's columns (SELECT names, ``_sign`` int8, ``_ts``).
``side_outputs=True`` instead returns every row of the stateful operator with a ``_aq_kind``
column: 0 result, 1 rejected input row (late, or an unmatched explicit deletion), 2 group
statistics; ``write_batch`` routes them to Parquet.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import pickle
import tempfile
import time
import uuid
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from pyspark.sql.streaming import StatefulProcessor

from adaptcq.errors import AdaptcqError, InputError, QueryError
from adaptcq.query.logical import LogicalQuery
from adaptcq.runtime.local import TIME_UNIT

__all__ = [
    "KIND_REJECTED",
    "KIND_RESULT",
    "KIND_STATS",
    "SparkRun",
    "SplitPlan",
    "continuous_query",
    "plan_split",
    "run_cli",
    "run_files",
    "signal_end",
]

KIND_RESULT, KIND_REJECTED, KIND_STATS = 0, 1, 2
SIDE_COLUMNS = ("_aq_kind", "_aq_stream", "_aq_row", "_aq_file", "_aq_reason", "_aq_info")
CHUNK = 8 << 20  # bytes per state-store chunk of a group's snapshot
END = -1  # stream index of an end-of-input control row


class SplitWarning(UserWarning):
    """The query cannot be split into partition groups and runs as one."""


# ---------------------------------------------------------------------------------------------
# Split planning (state-spill.txt §2.1, §5)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SplitPlan:
    """How updates are routed to partition groups.

    ``columns[alias]`` is the column of each stream whose value picks the group (None when the
    query runs as one group); ``groups`` is P; ``reason`` says why a query is not split.
    """

    groups: int
    columns: dict[str, str | None]
    reason: str = ""


def plan_split(query: LogicalQuery, partitions: int) -> SplitPlan:
    """Find an attribute class with a column in every stream and split on it.

    state-spill.txt §2.1: inputs must be partitioned "such that each query result can be
    generated from tuples within the same partition". Any result's tuples agree on every
    class's value, so a class spanning all streams is such a partition function; with several,
    the first (in FROM and column order) is taken. Count windows are per stream, not per key
    (the n most recent rows of the whole stream), so a query with one cannot be split.
    """
    aliases = query.aliases
    single = {a: None for a in aliases}
    if partitions <= 1:
        return SplitPlan(1, single)
    rows = [s.alias for s in query.streams if s.window.kind == "rows"]
    if rows:
        return SplitPlan(1, single, (
            f"stream {', '.join(rows)} has a [ROWS n] window: it holds the n most recent rows "
            "of the whole stream, which no partition of the stream can know; use [RANGE ...] "
            "windows to let the query run in partition groups"))
    candidates = []
    for cls in query.classes:
        per = {}
        for a in aliases:
            cols = [c.column for c in cls if c.stream == a]
            if not cols:
                break
            per[a] = min(cols, key=query.columns[a].index)
        else:
            first = min(cls, key=lambda c: (aliases.index(c.stream),
                                            query.columns[c.stream].index(c.column)))
            candidates.append(((aliases.index(first.stream),
                                query.columns[first.stream].index(first.column)), per))
    if not candidates:
        classes = "; ".join(" = ".join(sorted(map(str, c))) for c in query.classes) or "none"
        return SplitPlan(1, single, (
            "no join attribute is shared by all streams (attribute classes: "
            f"{classes}), so no single partition function keeps every result in one group "
            "(state-spill.txt §2.1, footnote 1); an equality putting one column of every "
            f"stream in one class (e.g. {' = '.join(f'{a}.<col>' for a in aliases)}) would "
            "let it run in partition groups"))
    candidates.sort(key=lambda c: c[0])
    return SplitPlan(partitions, candidates[0][1])


# ---------------------------------------------------------------------------------------------
# Building the streaming plan
# ---------------------------------------------------------------------------------------------


def _spark_kind(dt) -> str:
    from pyspark.sql import types as T

    from adaptcq.stream.sources import column_kind
    if isinstance(dt, T.TimestampNTZType | T.TimestampType | T.DateType):
        return "timestamp"
    try:
        from pyspark.sql.pandas.types import to_arrow_type
        return column_kind(to_arrow_type(dt))
    except Exception:  # noqa: BLE001 - nested/unsupported Spark types: not joinable here
        return "other"


def continuous_query(spark, sql: str, streams: Mapping[str, object], timestamp: str = "ts",
                     executor: str = "mjoin", mode: str = "append", partitions: int | None = None,
                     allowed_lateness: float = 0.0, sign: str | None = None,
                     order: str | Mapping[str, str] | None = None,
                     end_of_input: str | os.PathLike | None = None,
                     side_outputs: bool = False, **options):
    """Run ``sql`` over streaming DataFrames; return the streaming DataFrame of its results.

    ``streams`` maps each source named in FROM to a streaming DataFrame (files, Kafka, rate,
    ``format("adaptcq")``, ...). The result has the local runtime's columns: the SELECT names,
    ``_sign`` (int8: +1, or -1 for retractions in ``mode="retract"``) and ``_ts`` (timestamp if
    the inputs' timestamps are, else float seconds), and the same rows (docs/spark.md says
    exactly when they can differ). Updates are split into ``partitions`` groups
    (state-spill.txt §2.1, §5; default: ``spark.sql.shuffle.partitions``).

    ``order`` names the column that orders rows of equal timestamp within a source (e.g.
    Kafka's ``offset``); by default a file source's ``(_metadata.file_path, row_index)`` is
    used, and otherwise Spark's ``monotonically_increasing_id()``. ``end_of_input`` is a folder
    watched for end-of-input marker files (``signal_end``): after one, every buffered row is
    processed as at the end of the local runtime's input. ``side_outputs=True`` returns the raw
    operator output (results, rejected rows, group statistics; see ``write_batch``).
    """
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    from adaptcq.engine.continuous import ContinuousQuery
    from adaptcq.query.cql import parse_query
    from adaptcq.runtime.local import _check_join_types, require_inputs

    if not isinstance(sql, str):
        raise QueryError("the Spark runtime takes the query as CQL text")
    for name, df in streams.items():
        if not getattr(df, "isStreaming", False):
            raise InputError(f"stream {name}: expected a streaming DataFrame "
                             "(spark.readStream...), got a batch one")
        if timestamp not in df.columns:
            raise InputError(f"stream {name}: no timestamp column {timestamp!r} "
                             f"(its columns: {', '.join(df.columns)})")
        tdt = df.schema[timestamp].dataType
        if not isinstance(tdt, T.NumericType | T.TimestampType | T.TimestampNTZType
                          | T.DateType):
            raise InputError(f"stream {name}: timestamp column {timestamp!r} has type "
                             f"{tdt.simpleString()}; it must be a timestamp or numeric seconds")
    schemas = {name: {f.name: _spark_kind(f.dataType) for f in df.schema.fields}
               for name, df in streams.items()}
    query = parse_query(sql, schemas)
    require_inputs(query, streams)
    _check_join_types(query)
    if allowed_lateness < 0 or not math.isfinite(allowed_lateness):
        raise InputError(f"allowed lateness must be >= 0 seconds, got {allowed_lateness!r}")
    try:  # validates executor, mode and plan options (orders, tree) before Spark starts work
        ContinuousQuery(query, executor, mode, **options)
    except (ValueError, KeyError) as e:
        raise AdaptcqError(str(e)) from None
    signed = set()
    if sign is not None:
        for s in query.streams:
            if sign in streams[s.source].columns:
                if s.window.kind != "unbounded":
                    raise InputError(f"stream {s.alias} has a sign column {sign!r} and a window "
                                     f"{s.window}; explicit deletions need an unbounded stream")
                signed.add(s.alias)
    names = [o.name for o in query.outputs]
    clash = sorted(set(names) & set(SIDE_COLUMNS))
    if clash:
        raise QueryError(f"output column {clash[0]} is a name the Spark runtime reserves")

    P = partitions or int(spark.conf.get("spark.sql.shuffle.partitions"))
    plan = plan_split(query, P)
    if plan.reason:
        warnings.warn(f"running in one partition group: {plan.reason}", SplitWarning,
                      stacklevel=2)
    P = plan.groups
    keys = _group_keys(spark, P)

    ts_types = {type(streams[s.source].schema[timestamp].dataType) for s in query.streams}
    ts_is_time = all(issubclass(t, T.TimestampType | T.TimestampNTZType | T.DateType)
                     for t in ts_types)

    parts = []
    col_types: dict[str, list] = {}
    for i, s in enumerate(query.streams):
        df = streams[s.source]
        part, col_types[s.alias] = _project(df, i, s.alias, query, plan, P, timestamp,
                                            sign if s.alias in signed else None, order,
                                            s.source)
        parts.append(part)
    if end_of_input is not None:
        ctl = spark.readStream.schema("value string").text(str(end_of_input))
        parts.append(ctl.select(F.lit(END).cast("int").alias("_s"),
                                F.lit(0).cast("int").alias("_g"),
                                F.lit(None).cast("long").alias("_t"),
                                F.lit(1).cast("byte").alias("_sg"),
                                F.lit(None).cast("string").alias("_o1"),
                                F.lit(0).cast("long").alias("_o2")))
    union = parts[0]
    for p in parts[1:]:
        union = union.unionByName(p, allowMissingColumns=True)

    out_types = _output_types(spark, query, col_types)
    fields = [T.StructField("_aq_kind", T.ByteType())]
    fields += [T.StructField(n, t) for n, t in zip(names, out_types, strict=True)]
    fields += [T.StructField("_sign", T.ByteType()), T.StructField("_ts", T.DoubleType()),
               T.StructField("_aq_stream", T.StringType()), T.StructField("_aq_row", T.LongType()),
               T.StructField("_aq_file", T.StringType()),
               T.StructField("_aq_reason", T.StringType()),
               T.StructField("_aq_info", T.StringType())]
    out_schema = T.StructType(fields)

    cfg = _Config(
        qid=uuid.uuid4().hex, sql=sql, schemas=schemas, executor=executor, mode=mode,
        options=dict(options), groups=P, keys=keys, lateness=float(allowed_lateness),
        signed=bool(signed), n_streams=len(query.streams),
        stream_columns=[[f"c{i}_{k}" for k in range(len(query.columns[a]))]
                        for i, a in enumerate(query.aliases)],
        reported=[_first_alias_of_source(query, i) for i in range(len(query.streams))],
        sources=[s.source for s in query.streams], names=names)
    packets = union.mapInArrow(_Split(cfg), "_g int, _p binary")
    raw = packets.groupBy("_g").transformWithStateInPandas(
        statefulProcessor=_Processor(cfg), outputStructType=out_schema,
        outputMode="Append", timeMode="None")
    raw = raw.withColumn("_ts", _ts_out(F.col("_ts"), ts_is_time)) if ts_is_time else raw
    raw._adaptcq = {"query": query, "plan": plan, "config": cfg, "names": names}
    if side_outputs:
        return raw
    res = raw.where(F.col("_aq_kind") == KIND_RESULT).select(*names, "_sign", "_ts")
    res._adaptcq = raw._adaptcq
    return res


def _ts_out(col, is_time: bool):
    """Event times leave as float seconds; timestamp inputs get timestamps back (µs)."""
    from pyspark.sql import functions as F
    if not is_time:
        return col
    return F.timestamp_micros(F.round(col * 1_000_000).cast("long")).cast("timestamp_ntz")


def _first_alias_of_source(query: LogicalQuery, i: int) -> bool:
    """A late row is reported once per source (as the local runtime does), by its first alias."""
    src = query.streams[i].source
    return next(j for j, s in enumerate(query.streams) if s.source == src) == i


def _project(df, i: int, alias: str, query: LogicalQuery, plan: SplitPlan, P: int,
             timestamp: str, sign: str | None, order, source: str):
    """One stream's rows in the union's layout: stream index, group, event time (float
    seconds), sign, order key, and the columns the query needs (``c<i>_<k>``, in
    ``query.columns[alias]`` order)."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    tdt = df.schema[timestamp].dataType
    # Event times travel as int64 nanoseconds, as in the local runtime: exact window
    # boundaries (runtime.local.TIME_UNIT).
    if isinstance(tdt, T.TimestampType | T.TimestampNTZType | T.DateType):
        t = F.unix_micros(F.col(timestamp).cast("timestamp")) * F.lit(1000)
    else:
        t = F.round(F.col(timestamp).cast("double") * F.lit(1e9))
    key_col = plan.columns.get(alias)
    if key_col is None:
        g = F.lit(0)
    else:
        g = F.when(F.col(key_col).isNull(), F.lit(0)).otherwise(
            F.pmod(F.hash(_hash_cast(query, alias, key_col, df)), F.lit(P)))
    ordcol = order.get(source) if isinstance(order, Mapping) else order
    if ordcol is not None:
        if ordcol not in df.columns:
            raise InputError(f"stream {source}: no order column {ordcol!r}")
        o1, o2 = F.lit(None).cast("string"), F.col(ordcol).cast("long")
    else:
        try:  # a file source: its rows' position in their file, as the local runtime reads it
            _ = df.select(F.col("_metadata.row_index")).schema  # analysis fails otherwise
            o1, o2 = F.col("_metadata.file_path"), F.col("_metadata.row_index")
        except Exception:  # noqa: BLE001 - not a (row-indexed) file source
            o1, o2 = F.lit(None).cast("string"), F.monotonically_increasing_id()
    cols = [F.lit(i).cast("int").alias("_s"), g.cast("int").alias("_g"),
            t.cast("long").alias("_t"),
            (F.col(sign).cast("byte") if sign else F.lit(1).cast("byte")).alias("_sg"),
            o1.alias("_o1"), o2.cast("long").alias("_o2")]
    types = []
    for k, c in enumerate(query.columns[alias]):
        if c not in df.columns:
            raise InputError(f"stream {alias}: no column {c!r} in its input "
                             f"(its columns: {', '.join(df.columns)})")
        dt = df.schema[c].dataType
        col = F.col(c)
        if isinstance(dt, T.TimestampType):
            # the engine compares naive UTC datetimes, as the local runtime normalizes them
            col, dt = col.cast("timestamp_ntz"), T.TimestampNTZType()
        cols.append(col.alias(f"c{i}_{k}"))
        types.append(dt)
    return df.select(*cols), types


def _hash_cast(query: LogicalQuery, alias: str, column: str, df):
    """The split column, cast so that equal values hash equally in every stream: Spark's
    ``hash`` of int 5 and of long 5 differ, while the engine joins them (5 == 5)."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T
    dt = df.schema[column].dataType
    if isinstance(dt, T.NumericType):
        return F.col(column).cast("double")
    if isinstance(dt, T.TimestampType | T.TimestampNTZType | T.DateType):
        return F.unix_micros(F.col(column).cast("timestamp"))
    return F.col(column).cast("string")


def _group_keys(spark, P: int) -> list[int]:
    """Grouping-key values that land in distinct shuffle partitions.

    Spark hash-partitions the grouping key (``pmod(hash(key), N)``); with keys 0..P-1 two
    groups often share a partition (and a core) while another partition idles. We pick, for
    group g, the smallest integer whose partition is g mod N: the groups spread evenly.
    """
    from pyspark.sql import functions as F
    n = int(spark.conf.get("spark.sql.shuffle.partitions"))
    if P <= 1:
        return [0]
    rows = (spark.range(0, 64 * max(n, P)).select(
        F.col("id").cast("int").alias("k"),
        F.pmod(F.hash(F.col("id").cast("int")), F.lit(n)).alias("p")).collect())
    by_part: dict[int, list[int]] = {}
    for r in rows:
        by_part.setdefault(r["p"], []).append(r["k"])
    keys = []
    for g in range(P):
        cands = by_part.get(g % n, [])
        used = set(keys)
        keys.append(next(k for k in cands if k not in used))
    return keys


def _output_types(spark, query: LogicalQuery, col_types: dict[str, list]):
    """Spark types of the SELECT expressions, found by letting Spark analyse them over empty
    relations with the streams' column types (no job runs)."""
    import sqlglot.expressions as exp
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    rels = None
    for a in query.aliases:
        schema = T.StructType([T.StructField(c, t) for c, t in
                               zip(query.columns[a], col_types[a], strict=True)])
        d = spark.createDataFrame([], schema).alias(a)
        rels = d if rels is None else rels.crossJoin(d)
    out = []
    for o in query.outputs:
        e = o.expr.unalias() if isinstance(o.expr, exp.Alias) else o.expr
        if isinstance(e, exp.Column):
            a, c = e.table, e.name
            out.append(col_types[a][query.columns[a].index(c)])
            continue
        try:
            out.append(rels.select(F.expr(e.sql(dialect="spark"))).schema.fields[0].dataType)
        except Exception as err:  # noqa: BLE001 - report as a query error with the expression
            raise QueryError(f"cannot type output {o.name} ({e.sql()}) in Spark: {err}",
                             query.sql) from None
    return out


# ---------------------------------------------------------------------------------------------
# The Split operator (runs in Spark's Python workers, before the shuffle)
# ---------------------------------------------------------------------------------------------


@dataclass
class _Config:
    qid: str
    sql: str
    schemas: dict
    executor: str
    mode: str
    options: dict
    groups: int
    keys: list[int]
    lateness: float
    signed: bool
    n_streams: int
    stream_columns: list[list[str]]
    reported: list[bool]
    sources: list[str]
    names: list[str]


class _Split:
    """state-spill.txt §5's split operator, as ``mapInArrow``: one packet per partition group
    per input Arrow batch. A packet carries that group's rows of the batch (Python tuples in
    the engine's row layout, pickled: the stateful operator then sees a few large rows instead
    of one pandas row per update) and, for every stream, the batch's maximum event time and row
    count. Packets go to every group, empty or not, so all groups share one event-time
    frontier (punctuation in the sense of stream processors)."""

    def __init__(self, cfg: _Config):
        self.cfg = cfg

    def __call__(self, batches):
        import pyarrow as pa
        import pyarrow.compute as pc
        cfg = self.cfg
        P = cfg.groups
        for batch in batches:
            if batch.num_rows == 0:
                continue
            s = batch.column("_s").to_numpy(zero_copy_only=False)
            g = batch.column("_g").to_numpy(zero_copy_only=False)
            tcol = batch.column("_t")
            missing = tcol.is_null().to_numpy(zero_copy_only=False)
            t = pc.fill_null(tcol, 0).to_numpy(zero_copy_only=False)  # int64 ns, kept exact
            end = bool((s == END).any())
            maxima = []
            for i in np.unique(s[s >= 0]).tolist():
                ti = t[s == i]
                if missing[s == i].any():
                    raise InputError(f"stream {cfg.sources[i]}: a row has no timestamp")
                maxima.append((i, int(ti.max()), len(ti)))
            if cfg.signed:
                sg = batch.column("_sg").to_numpy(zero_copy_only=False)
                bad = np.flatnonzero((s >= 0) & (sg != 1) & (sg != -1))
                if len(bad):
                    raise InputError(f"stream {cfg.sources[s[bad[0]]]}: sign "
                                     f"{sg[bad[0]]!r}; the sign column holds +1 or -1")
            out_g, out_p = [], []
            for gi in range(P):
                idx = np.flatnonzero((g == gi) & (s >= 0)) if P > 1 else np.flatnonzero(s >= 0)
                out_g.append(cfg.keys[gi])
                out_p.append(pickle.dumps(self._packet(batch, s, t, idx, end, maxima),
                                          protocol=pickle.HIGHEST_PROTOCOL))
            yield pa.RecordBatch.from_arrays(
                [pa.array(out_g, pa.int32()), pa.array(out_p, pa.binary())], ["_g", "_p"])

    def _packet(self, batch, s, t, idx, end, maxima):
        import pyarrow as pa
        cfg = self.cfg
        if len(idx) == 0:
            return (end, maxima, [], [], None, [], [], [])
        sub = batch.take(pa.array(idx))
        ss = s[idx]
        streams, tss, signs, o1, o2, rows = [], [], [], [], [], []
        for i in np.unique(ss).tolist():
            sel = np.flatnonzero(ss == i)
            part = sub.take(pa.array(sel)) if len(sel) != len(idx) else sub
            cols = [part.column(c).to_pylist() for c in cfg.stream_columns[i]]
            rows.extend(zip(*cols) if cols else [()] * len(sel))
            streams.extend([i] * len(sel))
            tss.extend(t[idx][sel].tolist())
            if cfg.signed:
                signs.extend(part.column("_sg").to_pylist())
            o1.extend(part.column("_o1").to_pylist())
            o2.extend(part.column("_o2").to_pylist())
        return (end, maxima, streams, tss, signs if cfg.signed else None, o1, o2, rows)


# ---------------------------------------------------------------------------------------------
# One partition group: event-time order across micro-batches, lateness, expiry
# ---------------------------------------------------------------------------------------------

_QUERIES: dict[str, LogicalQuery] = {}


def _logical(cfg: _Config) -> LogicalQuery:
    q = _QUERIES.get(cfg.qid)
    if q is None:
        from adaptcq.query.cql import parse_query
        q = _QUERIES[cfg.qid] = parse_query(cfg.sql, cfg.schemas)
    return q


@dataclass
class _GroupEngine:
    """A partition group's engine and the buffer in front of it.

    ``frontier[i]`` is the largest event time of stream i over all micro-batches so far (the
    same in every group: it comes from the split's punctuation). Rows wait in ``pending``
    until no row that could still arrive would precede them in the local runtime's order
    (timestamp, FROM position, row position): a row of stream i arriving later is accepted
    only if its timestamp is at least ``frontier[i] - lateness`` (else it is late), so a
    pending row x can go once ``(x.ts, x.stream) <= (frontier[i] - lateness, i)`` for every
    stream i.
    """

    cq: object
    groups: int
    frontier: list[float]
    pending: list[tuple] = field(default_factory=list)  # (ts, stream, seq, o1, o2, sign, row)
    seq: int = 0
    closed: bool = False
    late: int = 0
    peak_tuples: int = 0
    peak_bytes: int = 0

    def dumps(self) -> bytes:
        return pickle.dumps({
            "v": 1, "cq": self.cq.snapshot(), "groups": self.groups, "frontier": self.frontier,
            "pending": self.pending, "seq": self.seq, "closed": self.closed, "late": self.late,
            "peak": (self.peak_tuples, self.peak_bytes)}, protocol=pickle.HIGHEST_PROTOCOL)

    @classmethod
    def loads(cls, cfg: _Config, blob: bytes) -> _GroupEngine:
        from adaptcq.engine.continuous import ContinuousQuery
        st = pickle.loads(blob)
        if st["groups"] != cfg.groups:
            raise AdaptcqError(
                f"the checkpoint was written with {st['groups']} partition groups and the "
                f"query now has {cfg.groups}; restart with the same --partitions (rows would "
                "otherwise meet state of other keys)")
        cq = ContinuousQuery.restore(_logical(cfg), st["cq"], cfg.mode, **cfg.options)
        g = cls(cq, st["groups"], st["frontier"], st["pending"], st["seq"], st["closed"],
                st["late"], *st["peak"])
        return g

    @classmethod
    def new(cls, cfg: _Config) -> _GroupEngine:
        from adaptcq.engine.continuous import ContinuousQuery
        cq = ContinuousQuery(_logical(cfg), cfg.executor, cfg.mode, time_unit=TIME_UNIT,
                             **cfg.options)
        return cls(cq, cfg.groups, [-math.inf] * cfg.n_streams)

    def step(self, cfg: _Config, packets: list[tuple]) -> tuple[list, list]:
        """One micro-batch: lateness, ordering, release, expiry. Returns (results, rejected)."""
        L = round(cfg.lateness / TIME_UNIT)  # event times are int64 ns
        seq = self.seq
        self.seq += 1
        old = list(self.frontier)
        bmax = list(old)
        end = False
        rejected = []
        new = []
        for end_p, maxima, streams, tss, signs, o1, o2, rows in packets:
            end |= end_p
            for i, m, _ in maxima:
                bmax[i] = max(bmax[i], m)
            for k in range(len(rows)):
                i, ts = streams[k], tss[k]
                # Late: below the stream's frontier of earlier micro-batches minus the allowed
                # lateness (after end of input the frontier is closed at its maximum).
                if ts < old[i] - L:
                    self.late += 1
                    if cfg.reported[i]:
                        rejected.append((cfg.sources[i], o2[k], o1[k], ts, (
                            "arrived after end of input" if self.closed else
                            f"late by more than the allowed lateness ({cfg.lateness:g} s)")))
                    continue
                new.append((ts, i, seq, o1[k] or "", -1 if o2[k] is None else o2[k],
                            1 if signs is None else signs[k], rows[k]))
        self.frontier = bmax
        pool = self.pending + new
        if end or self.closed:
            # End of input: everything buffered is processed, as the local runtime processes
            # its whole input; the frontier closes at the largest event time of any stream.
            top = max(self.frontier)
            if end and not self.closed:
                self.closed = True
                self.frontier = [top + L] * len(self.frontier)
            bound_ts, bound_s = math.inf, 0
            advance = top
        else:
            bound_ts, bound_s = min((f - L, i) for i, f in enumerate(self.frontier))
            advance = bound_ts
        pool.sort(key=lambda r: r[:5])
        n = 0
        for r in pool:
            if r[0] < bound_ts or (r[0] == bound_ts and r[1] <= bound_s):
                n += 1
            else:
                break
        go, self.pending = pool[:n], pool[n:]
        cq = self.cq
        out = []
        n_rej = len(cq.rejected_rows)
        if go:
            out = cq.process([r[1] for r in go], [r[5] for r in go] if cfg.signed else None,
                             [r[0] for r in go], [r[6] for r in go])
        # Deletions due before `advance`: every row that could precede them has been processed
        # (later rows are at or after the bound), and some accepted update is later than them
        # (the row holding the frontier), so the local runtime would have processed them too.
        if advance > -math.inf:
            cq.advance_to(advance)
            out.extend(cq.drain())
        for i, ts, row, why in cq.rejected_rows[n_rej:]:
            rejected.append((cfg.sources[i], -1, None, ts, why))
        del cq.rejected_rows[:]
        tup, byt = cq.executor.state_tuples(), cq.executor.state_bytes()
        pt, pb = cq.peak_state()
        self.peak_tuples = max(self.peak_tuples, tup, pt)
        self.peak_bytes = max(self.peak_bytes, byt, pb)
        return out, rejected


_LIVE: dict[tuple[str, int], tuple[tuple[int, int], _GroupEngine]] = {}


class _Processor(StatefulProcessor):
    """The StatefulProcessor run by ``transformWithStateInPandas``: one ContinuousQuery per
    partition group (state-spill.txt §2.1's unit of state; §5's partitioned operator instance).

    State per group: ValueState ``meta`` (version, random token, chunk count, byte count) and
    ListState ``blob`` (the pickled ``_GroupEngine`` in chunks of ``CHUNK`` bytes). The class
    lives at module level so that Spark pickles it by reference and ``_LIVE`` is the worker
    module's own dict, which survives from one micro-batch to the next in a reused worker.
    """

    def __init__(self, cfg: _Config):
        self.cfg = cfg

    def init(self, handle) -> None:
        self.meta = handle.getValueState("meta", "version long, token long, chunks int, "
                                                 "nbytes long")
        self.blob = handle.getListState("blob", "chunk binary")

    def handleInputRows(self, key, rows, timerValues) -> Iterator:
        cfg = self.cfg
        gkey = int(key[0])
        # The packet is the last column (by position: pyspark rebuilds these frames from
        # itertuples, which renames columns starting with an underscore).
        packets = [pickle.loads(b) for pdf in rows for b in pdf.iloc[:, -1]]
        meta = self.meta.get()
        live = _LIVE.get((cfg.qid, gkey))
        if meta is None:
            eng, version, hit = _GroupEngine.new(cfg), 0, False
        elif live is not None and live[0] == (meta[0], meta[1]):
            eng, version, hit = live[1], meta[0], True
        else:  # the state store is the source of truth: rebuild from its snapshot
            blob = b"".join(c[0] for c in self.blob.get())
            if len(blob) != meta[3]:
                raise AdaptcqError(f"group {gkey}: state snapshot has {len(blob)} bytes, "
                                   f"expected {meta[3]}")
            eng, version, hit = _GroupEngine.loads(cfg, blob), meta[0], False
        # Whatever happens below, the live object is about to change: forget it first, so a
        # failure half-way can never leave a cached engine that disagrees with the store.
        _LIVE.pop((cfg.qid, gkey), None)
        t0 = time.process_time()
        out, rejected = eng.step(cfg, packets)
        cpu = time.process_time() - t0
        blob = eng.dumps()
        token = int.from_bytes(os.urandom(7), "little")
        self.blob.put([(blob[i:i + CHUNK],) for i in range(0, len(blob), CHUNK)])
        self.meta.update((version + 1, token, -(-len(blob) // CHUNK), len(blob)))
        _LIVE[(cfg.qid, gkey)] = ((version + 1, token), eng)
        while len(_LIVE) > 256:  # entries of finished queries
            del _LIVE[next(iter(_LIVE))]
        yield from _frames(cfg, gkey, eng, out, rejected, cpu, len(blob),
                           sum(len(p[7]) for p in packets), hit)

    def close(self) -> None:
        pass


def _frames(cfg: _Config, gkey: int, eng: _GroupEngine, out: list, rejected: list,
            cpu: float, snapshot_bytes: int, rows_in: int, cache_hit: bool):
    """The operator's output frames: results, rejected rows, one statistics row."""
    import pandas as pd
    names = cfg.names
    n = len(names)
    if out:
        cols = list(zip(*out))
        data = {"_aq_kind": np.zeros(len(out), np.int8)}
        for k in range(n):
            data[names[k]] = list(cols[k])
        data["_sign"] = np.asarray(cols[n], np.int8)
        data["_ts"] = np.asarray(cols[n + 1], np.int64) * TIME_UNIT  # float seconds
        df = pd.DataFrame(data)
        for c in ("_aq_stream", "_aq_row", "_aq_file", "_aq_reason", "_aq_info"):
            df[c] = None
        yield df
    if rejected:
        src, row, file, ts, why = zip(*rejected)
        data = {"_aq_kind": np.full(len(rejected), KIND_REJECTED, np.int8)}
        for k in range(n):
            data[names[k]] = [None] * len(rejected)
        data.update({"_sign": np.zeros(len(rejected), np.int8),
                     "_ts": np.asarray(ts, np.int64) * TIME_UNIT, "_aq_stream": list(src),
                     "_aq_row": list(row), "_aq_file": list(file), "_aq_reason": list(why),
                     "_aq_info": [None] * len(rejected)})
        yield pd.DataFrame(data)
    st = eng.cq.stats
    info = {"group": gkey, "arrivals": st.arrivals, "updates": st.updates,
            "insertions": st.insertions, "deletions": st.deletions, "filtered": st.filtered,
            "results": st.results, "late": eng.late, "pending": len(eng.pending),
            "rows_in": rows_in, "state_tuples": eng.cq.executor.state_tuples(),
            "state_bytes": eng.cq.executor.state_bytes(), "peak_state_tuples": eng.peak_tuples,
            "peak_state_bytes": eng.peak_bytes, "snapshot_bytes": snapshot_bytes,
            "engine_cpu_seconds": cpu, "cache_hit": cache_hit, "pid": os.getpid(),
            "now": eng.cq.now if math.isfinite(eng.cq.now) else None}
    data = {"_aq_kind": [KIND_STATS]}
    for k in range(n):
        data[names[k]] = [None]
    data.update({"_sign": [0], "_ts": [None], "_aq_stream": [None], "_aq_row": [None],
                 "_aq_file": [None], "_aq_reason": [None], "_aq_info": [json.dumps(info)]})
    yield pd.DataFrame(data)


# ---------------------------------------------------------------------------------------------
# Running to Parquet: end of input, side outputs, statistics
# ---------------------------------------------------------------------------------------------


def signal_end(folder: str | os.PathLike) -> Path:
    """Drop an end-of-input marker into the ``end_of_input`` folder of a running query."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    p = folder / f"end-{time.time_ns()}.txt"
    tmp = folder / f".{p.name}.tmp"
    tmp.write_text("end\n")
    tmp.rename(p)  # atomic: the file source never sees a partial file
    return p


@dataclass
class SparkRun:
    """What a ``run_files`` call did."""

    batches: int = 0
    rows_in: int = 0
    results: int = 0
    rejected: int = 0
    wall_seconds: float = 0.0
    groups: dict = field(default_factory=dict)  # group key -> its latest statistics
    output: str | None = None
    rejected_path: str | None = None
    history: list = field(default_factory=list)  # every statistics row, in batch order
    progress: list = field(default_factory=list)  # Spark's progress reports

    @property
    def peak_state_tuples(self) -> int:
        return sum(g["peak_state_tuples"] for g in self.groups.values())

    @property
    def peak_state_bytes(self) -> int:
        return sum(g["peak_state_bytes"] for g in self.groups.values())

    @property
    def updates(self) -> int:
        return sum(g["updates"] for g in self.groups.values())

    @property
    def pending(self) -> int:
        return sum(g["pending"] for g in self.groups.values())


def write_batch(raw_batch, batch_id: int, output: str | None, rejected: str | None,
                run: SparkRun, names: list[str]) -> None:
    """Route one micro-batch of side-output rows: results and rejected rows to Parquet files
    named by batch id (a re-run batch overwrites its own file: exactly once), statistics into
    ``run``. Use it from ``foreachBatch``."""
    import pyarrow.parquet as pq

    # One action on the batch: running the stateful plan twice in a batch is not allowed to
    # matter, but it would cost twice; collecting once and splitting on the driver avoids it.
    tab = raw_batch.toArrow()
    kind = tab.column("_aq_kind").to_numpy(zero_copy_only=False)
    res = tab.filter(kind == KIND_RESULT).select([*names, "_sign", "_ts"])
    rej = tab.filter(kind == KIND_REJECTED).select(["_aq_stream", "_aq_row", "_aq_file", "_ts",
                                                    "_aq_reason"]).rename_columns(
        ["stream", "row", "file", "ts", "reason"])
    stats = tab.filter(kind == KIND_STATS).column("_aq_info").to_pylist()
    if output and res.num_rows:
        Path(output).mkdir(parents=True, exist_ok=True)
        pq.write_table(res, Path(output) / f"part-{batch_id:08d}.parquet")
    if rejected and rej.num_rows:
        Path(rejected).mkdir(parents=True, exist_ok=True)
        pq.write_table(rej, Path(rejected) / f"part-{batch_id:08d}.parquet")
    run.batches += 1
    run.results += res.num_rows
    run.rejected += rej.num_rows
    for s in stats:
        info = json.loads(s)
        run.rows_in += info["rows_in"]
        run.groups[info["group"]] = info
        run.history.append(info)
    run._schema = res.schema


def run_files(spark, sql: str, sources: Mapping[str, str], checkpoint: str, output: str | None,
              rejected: str | None = None, timestamp: str = "ts", executor: str = "mjoin",
              mode: str = "append", partitions: int | None = None,
              allowed_lateness: float = 0.0, sign: str | None = None, finish: bool = True,
              max_files_per_trigger: int | None = None, **options) -> SparkRun:
    """Run ``sql`` over Parquet/CSV files (a file or folder per source) to Parquet.

    Processes every file present (several micro-batches with ``max_files_per_trigger``),
    then, with ``finish``, signals end of input so that buffered rows are processed as the
    local runtime would at the end of its input. Restarting with the same ``checkpoint``
    continues exactly where the previous run stopped (new files only).
    """
    streams = {name: _read_stream(spark, name, path, max_files_per_trigger)
               for name, path in sources.items()}
    ctl = Path(checkpoint) / "end_of_input"
    ctl.mkdir(parents=True, exist_ok=True)
    raw = continuous_query(spark, sql, streams, timestamp=timestamp, executor=executor,
                           mode=mode, partitions=partitions, allowed_lateness=allowed_lateness,
                           sign=sign, end_of_input=str(ctl), side_outputs=True, **options)
    names = raw._adaptcq["names"]
    run = SparkRun(output=output, rejected_path=rejected)
    t0 = time.perf_counter()
    q = (raw.writeStream.foreachBatch(
        lambda df, bid: write_batch(df, bid, output, rejected, run, names))
        .option("checkpointLocation", str(Path(checkpoint) / "query"))
        .queryName(f"adaptcq_{uuid.uuid4().hex[:8]}").start())
    try:
        q.processAllAvailable()
        if finish:
            signal_end(ctl)
            q.processAllAvailable()
    finally:
        run.progress = list(q.recentProgress)
        q.stop()
    exc = q.exception()
    if exc is not None:
        raise AdaptcqError(f"the Spark query failed: {exc}")
    run.wall_seconds = time.perf_counter() - t0
    if output and not any(Path(output).glob("*.parquet")):
        import pyarrow.parquet as pq
        Path(output).mkdir(parents=True, exist_ok=True)
        schema = getattr(run, "_schema", None)
        if schema is not None:
            pq.write_table(schema.empty_table(), Path(output) / "part-empty.parquet")
    return run


def _read_stream(spark, name: str, path, max_files: int | None):
    """A file stream with the file's own schema (Parquet, or CSV with a header)."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"stream {name}: input file {str(p)!r} does not exist")
    files = [p] if p.is_file() else sorted(p.iterdir())
    suffixes = {f.suffix.lower() for f in files if not f.name.startswith(("_", "."))}
    reader = spark.readStream
    if max_files:
        reader = reader.option("maxFilesPerTrigger", int(max_files))
    if suffixes <= {".parquet", ".pq"} and suffixes:
        schema = spark.read.parquet(str(p)).schema
        return reader.schema(schema).parquet(str(p))
    if suffixes <= {".csv", ".txt"} and suffixes:
        schema = spark.read.option("header", True).option("inferSchema", True).csv(str(p)).schema
        return reader.schema(schema).option("header", True).csv(str(p))
    raise InputError(f"stream {name}: {str(p)!r} is neither Parquet nor CSV "
                     "(use .parquet or .csv files)")


# ---------------------------------------------------------------------------------------------
# The CLI: adaptcq run --engine spark
# ---------------------------------------------------------------------------------------------


def run_cli(args, sql: str, sources: Mapping[str, object], timestamp: str, options: dict,
            console) -> int:
    """``adaptcq run --engine spark``: the query on Spark, files in, Parquet out, a summary."""
    from rich.table import Table

    from adaptcq.runtime.spark_session import get_spark

    if args.partitions is not None and args.partitions < 1:
        raise AdaptcqError(f"--partitions must be >= 1, got {args.partitions}")
    spark = get_spark(args.master, "adaptcq run")
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="adaptcq-spark-")))
        paths = {}
        for name, src in sources.items():
            if isinstance(src, str | os.PathLike):
                paths[name] = str(src)
            else:  # an in-memory table (the embedded default): stream it from Parquet
                import pyarrow.parquet as pq

                from adaptcq.stream.sources import load_source
                d = tmp / "inputs" / name
                d.mkdir(parents=True)
                pq.write_table(load_source(name, src, timestamp), d / "part-0.parquet")
                paths[name] = str(d)
        checkpoint = args.checkpoint or str(tmp / "checkpoint")
        output = args.output
        rejected = args.rejected or (f"{output}.rejected" if output else None)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", SplitWarning)
            run = run_files(spark, sql, paths, checkpoint, output, rejected, timestamp,
                            args.executor, args.mode, args.partitions, args.allowed_lateness,
                            args.sign, **options)
        for w in caught:
            if issubclass(w.category, SplitWarning):
                console.print(f"[yellow]warning:[/] {w.message}")
    if output:
        console.print(f"wrote {run.results:,} result rows to {output}/ (Parquet)")
    if run.rejected and rejected:
        console.print(f"wrote {run.rejected:,} rejected rows to {rejected}/ (Parquet)")
    t = Table(title="run summary (Spark)", show_header=False)
    t.add_column("what")
    t.add_column("value", justify="right")
    t.add_row("executor / mode", f"{args.executor} / {args.mode}")
    t.add_row("master / partition groups", f"{args.master} / {len(run.groups)}")
    t.add_row("micro-batches", f"{run.batches:,}")
    t.add_row("input rows", f"{run.rows_in:,}")
    t.add_row("updates processed (ΔR insertions + deletions)", f"{run.updates:,}")
    t.add_row("results", f"{run.results:,}")
    t.add_row("wall seconds (streaming query)", f"{run.wall_seconds:.2f}")
    t.add_row("throughput (input rows per second)",
              f"{run.rows_in / run.wall_seconds:,.0f}" if run.wall_seconds else "-")
    t.add_row("peak state, summed over groups (tuples)", f"{run.peak_state_tuples:,}")
    t.add_row("peak state, summed over groups (bytes)", f"{run.peak_state_bytes:,}")
    t.add_row("rejected rows", f"{run.rejected:,}")
    console.print(t)
    return 0
