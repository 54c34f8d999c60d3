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
* The split also turns each row's time into int64 nanoseconds with the local runtime's rules
  (``stream.eventtime``: the unit of numeric times, errors naming stream, row and value), and
  emits, in every packet, the maximum event time and row count of each stream it saw
  (punctuation). Every group receives a packet from every input batch, so every group learns
  the same per-stream event-time frontier each micro-batch, whether or not it got rows: that
  is what orders updates across micro-batch boundaries, decides lateness, and drives window
  expiry in groups that receive no more rows (see ``_GroupEngine.step``).
* **State**: each group's engine (``ContinuousQuery.snapshot()``), its not-yet-released rows
  and its frontier are one pickled blob in the RocksDB state store (a ListState of chunks plus
  a ValueState version/token), written every micro-batch. The live engine stays in the Python
  worker (``_LIVE``) and is reused while the stored token matches, so a micro-batch costs a
  snapshot write, not a rebuild; on any mismatch (another worker, a restart, a retried batch)
  the engine is restored from the store, which is the source of truth.
* **Adaptivity** (``adaptivity=``, ``executor="acaching"``): every group builds its own
  policies (``make_policies``: an optimizer's initial plan, A-Greedy, A-Caching) and adapts
  on its own data; the orders they set travel in the engine's snapshot, their statistics
  restart after a restore (``_GroupEngine``), and their reports are in every statistics row.

Output rows have the local runtime's columns (SELECT names, ``_sign`` int8, ``_ts`` of the
type ``eventtime.output_time_type`` gives, converted from int64 nanoseconds with integer
arithmetic). ``side_outputs=True`` instead returns every row of the stateful operator with a
``_aq_kind`` column: 0 result, 1 rejected input row (late, or an unmatched explicit deletion),
2 group statistics, and ``_ts`` as int64 nanoseconds; ``write_batch`` routes them to Parquet.

``run_files`` (and the CLI's driver, ``runtime.spark_cli``) run a query over files: inputs checked and resolved as the local
runtime resolves them (a file, a folder, a glob), a fingerprint of the query in the
checkpoint (a restart with another query is refused), and output folders that never mix
the results of two queries (docs/spark.md, "Files, checkpoints and outputs").
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import math
import os
import pickle
import re
import time
import uuid
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from pyspark.sql.streaming import StatefulProcessor

from adaptcq import errors as _errors
from adaptcq.errors import AdaptcqError, InputError, OptionError, QueryError
from adaptcq.query.logical import LogicalQuery
from adaptcq.runtime.output import overlaps
from adaptcq.stream import eventtime as et
from adaptcq.stream.eventtime import lateness_ns

__all__ = [
    "KIND_REJECTED",
    "KIND_RESULT",
    "KIND_STATS",
    "FileJob",
    "SparkRun",
    "SplitPlan",
    "continuous_query",
    "make_policies",
    "plan_split",
    "prepare_files",
    "run_files",
    "signal_end",
    "write_batch",
]

KIND_RESULT, KIND_REJECTED, KIND_STATS = 0, 1, 2
SIDE_COLUMNS = ("_aq_kind", "_aq_stream", "_aq_row", "_aq_file", "_aq_reason", "_aq_info")
CHUNK = 8 << 20  # bytes per state-store chunk of a group's snapshot
END = -1  # stream index of an end-of-input control row
TIME_UNIT = 1e-9  # seconds per engine time unit: event times are int64 nanoseconds
FINGERPRINT = "adaptcq.json"  # in a checkpoint folder: what query wrote it
OUTPUT_MARKER = "_adaptcq_output.json"  # in an output folder: which run owns it
FINGERPRINT_VERSION = 1
_SEP = "\x01"  # replaces "/" in a file path's order key: paths sort as the local runtime's
_NOFILE = "\x00"  # prefix of the order key of a row that comes from no file



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
# Adaptivity: the same policies in every partition group
# ---------------------------------------------------------------------------------------------

#: The keys of an adaptivity spec besides ``adapt.make_policies``' policy parameters.
_SPEC_KEYS = ("optimizer", "reorder", "caching")


def make_policies(spec: Mapping) -> list:
    """Fresh policy objects for one partition group from an adaptivity ``spec``: the keyword
    arguments of ``adapt.make_policies`` (``optimizer``, ``reorder``, ``caching`` (a dict
    of A-Caching options, or None) and policy parameters such as ``p``, ``W``,
    ``interval``, ``seed``). Policy objects hold one group's statistics, so every group
    builds its own from the spec (a spec pickles; compiled engines and their policies do
    not travel)."""
    from adaptcq.adapt import make_policies as make
    return list(make(**spec))


def _adaptivity(executor: str, adaptivity: Mapping | None) -> tuple[str, dict | None]:
    """(engine executor, adaptivity spec or None). ``executor="acaching"`` is shorthand for
    mjoin with A-Caching (its default options unless the spec gives ``caching``). A spec
    that asks for nothing is None; XJoin with a policy is refused."""
    spec = None if adaptivity is None else dict(adaptivity)
    if spec is not None and not isinstance(spec.get("caching", None), Mapping | None):
        raise OptionError("adaptivity['caching'] must be a dict of A-Caching options "
                          "(adapt.acaching.ACaching's keyword arguments) or None")
    if executor == "acaching":
        spec = spec or {}
        spec["caching"] = dict(spec.get("caching") or {})
        executor = "mjoin"
    if spec is not None:
        spec.setdefault("optimizer", None)
        spec.setdefault("reorder", "off")
        spec.setdefault("caching", None)
        if spec["caching"] is not None:
            spec["caching"] = dict(spec["caching"])
        if spec["optimizer"] is None and spec["reorder"] == "off" and spec["caching"] is None:
            if set(spec) - set(_SPEC_KEYS):
                raise OptionError(
                    f"policy parameter(s) {', '.join(sorted(set(spec) - set(_SPEC_KEYS)))} "
                    "given, but no policy: set optimizer, reorder='agreedy' or caching")
            spec = None
    if spec is not None and executor != "mjoin":
        raise OptionError(
            f"adaptive policies (optimizer, A-Greedy re-ordering, A-Caching) re-order and "
            f"cache MJoin pipelines, and the {executor} executor has none: its tree of "
            "binary joins keeps intermediate results that depend on the tree, so it cannot "
            "be re-ordered between updates; use executor mjoin (or acaching)")
    return executor, spec


_CHANGES = ("use", "drop", "shrink", "grow")


def _jsonable_report(report: dict) -> dict:
    """A policies' report as JSON-able values, small enough to travel every micro-batch:
    A-Caching's full ``cache_history`` becomes its last few cache changes."""
    out = dict(report)
    history = out.pop("cache_history", None)
    if history is not None:
        changes = [h for h in history if h.get("event") in _CHANGES]
        out["cache_last_changes"] = [f"at arrival {h['arrival']:,}: {h['event']} {h['what']}"
                                     for h in changes[-5:]]
    return json.loads(json.dumps(out, default=str))


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


def _time_kind(dt) -> str | None:
    """How a timestamp column travels to the split: ``us`` (a Spark timestamp, as epoch
    microseconds), ``date`` (days), ``int`` or ``float`` (numbers in the time unit)."""
    from pyspark.sql import types as T
    if isinstance(dt, T.TimestampType | T.TimestampNTZType):
        return "us"
    if isinstance(dt, T.DateType):
        return "date"
    if isinstance(dt, T.ByteType | T.ShortType | T.IntegerType | T.LongType):
        return "int"
    if isinstance(dt, T.FloatType | T.DoubleType | T.DecimalType):
        return "float"
    return None


def _arrow_time_type(dt, tz: str):
    """The Arrow type of a Spark timestamp column, as ``stream.eventtime`` classifies it."""
    import pyarrow as pa
    from pyspark.sql import types as T
    if isinstance(dt, T.TimestampType):
        return pa.timestamp("us", tz=tz)
    if isinstance(dt, T.TimestampNTZType):
        return pa.timestamp("us")
    try:
        from pyspark.sql.pandas.types import to_arrow_type
        return to_arrow_type(dt)
    except Exception:  # noqa: BLE001 - a type Arrow cannot hold: not a time either
        return pa.null()


def continuous_query(spark, sql: str, streams: Mapping[str, object], timestamp: str = "ts",
                     executor: str = "mjoin", mode: str = "append", partitions: int | None = None,
                     allowed_lateness: float = 0.0, sign: str | None = None,
                     order: str | Mapping[str, str] | None = None,
                     end_of_input: str | os.PathLike | None = None,
                     side_outputs: bool = False, timestamp_unit: str | None = None,
                     adaptivity: Mapping | None = None, **options):
    """Run ``sql`` over streaming DataFrames; return the streaming DataFrame of its results.

    ``streams`` maps each source named in FROM to a streaming DataFrame (files, Kafka, rate,
    ``format("adaptcq")``, ...). The result has the local runtime's columns: the SELECT names,
    ``_sign`` (int8: +1, or -1 for retractions in ``mode="retract"``) and ``_ts``, and the
    same rows (docs/spark.md says exactly when they can differ). ``_ts`` follows
    ``stream.eventtime``: timestamp inputs give timestamps (TimestampType inputs give
    TimestampType, TimestampNTZ inputs TimestampNTZ), numeric inputs give ``_ts`` in their
    unit (``timestamp_unit``: ``s`` (default), ``ms``, ``us`` or ``ns``), a long when every
    input is integer-typed and every window a whole number of the unit, else a double.
    Updates are split into ``partitions`` groups (state-spill.txt §2.1, §5; default:
    ``spark.sql.shuffle.partitions``).

    ``order`` names the column that orders rows of equal timestamp within a source (e.g.
    Kafka's ``offset``); by default a file source's ``(_metadata.file_path, row_index)`` is
    used (CSV: the row's position in its file block), and otherwise the row's position in
    its Spark partition. ``end_of_input`` is a folder watched for end-of-input marker files
    (``signal_end``): after one, every buffered row is processed as at the end of the local
    runtime's input. ``side_outputs=True`` returns the raw operator output (results, rejected
    rows, group statistics, ``_ts`` in int64 nanoseconds; see ``write_batch``).

    ``adaptivity`` runs adaptive policies inside every partition group, each on its own
    data: the keyword arguments of ``adapt.make_policies`` (``optimizer``: an ordering
    algorithm for the initial plan; ``reorder="agreedy"``; ``caching``: a dict of A-Caching
    options; policy parameters ``p``, ``W``, ``interval``, ...). ``executor="acaching"`` is
    mjoin with A-Caching. Each group's decisions are in its statistics rows (``policies``;
    docs/spark.md, "Adaptivity").

    A time that is null, not finite, or outside what int64 nanoseconds hold stops the query
    with the local runtime's message (stream, row, value; ``run_files`` raises it as an
    ``InputError``).
    """
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    from adaptcq.query.cql import parse_query
    from adaptcq.runtime.local import _check_join_types, require_inputs

    if not isinstance(sql, str):
        raise QueryError("the Spark runtime takes the query as CQL text")
    et.check_unit(timestamp_unit)
    tz = spark.conf.get("spark.sql.session.timeZone")
    time_types = {}
    for name, df in streams.items():
        if not getattr(df, "isStreaming", False):
            raise InputError(f"stream {name}: expected a streaming DataFrame "
                             "(spark.readStream...), got a batch one")
        if timestamp not in df.columns:
            raise InputError(f"stream {name}: no timestamp column {timestamp!r} "
                             f"(its columns: {', '.join(df.columns)})")
        tdt = df.schema[timestamp].dataType
        time_types[name] = _arrow_time_type(tdt, tz)
        et.check_time_type(name, timestamp, time_types[name], timestamp_unit)
        if _time_kind(tdt) is None:
            raise InputError(f"stream {name}: timestamp column {timestamp!r} has type "
                             f"{tdt.simpleString()}; it must be a timestamp, a date, or a "
                             "number (seconds, or --timestamp-unit)")
    schemas = {name: {f.name: _spark_kind(f.dataType) for f in df.schema.fields}
               for name, df in streams.items()}
    query = parse_query(sql, schemas)
    require_inputs(query, streams)
    _check_join_types(query)
    late_ns = lateness_ns(allowed_lateness)
    signed = _signed_streams(query, streams, sign)
    executor, spec = _adaptivity(executor, adaptivity)
    # Validates executor, mode, plan options (orders, tree) and the policies' options
    # before Spark starts work: what every group will build.
    _check_engine(query, executor, mode, bool(signed), spec, options)
    names = [o.name for o in query.outputs]
    clash = sorted(set(names) & set(SIDE_COLUMNS))
    if clash:
        raise QueryError(f"output column {clash[0]} is a name the Spark runtime reserves")

    windows = [round(s.window.size / TIME_UNIT) for s in query.streams
               if s.window.kind == "range"]
    ts_type = et.output_time_type({s.alias: time_types[s.source] for s in query.streams},
                                  timestamp_unit, windows)
    if _is_timestamp(ts_type):
        for s in query.streams:
            w = round(s.window.size / TIME_UNIT) if s.window.kind == "range" else 0
            if w % 1000:
                raise QueryError(
                    f"stream {s.alias} has window {s.window}, which is not a whole number of "
                    "microseconds: Spark timestamps have microsecond precision, so its "
                    "expiry times t + w could not be written exactly; use a window in whole "
                    "microseconds, or --engine local", query.sql)

    P = partitions or int(spark.conf.get("spark.sql.shuffle.partitions"))
    plan = plan_split(query, P)
    if plan.reason:
        warnings.warn(f"running in one partition group: {plan.reason}", SplitWarning,
                      stacklevel=2)
    P = plan.groups
    keys = _group_keys(spark, P)

    parts = []
    col_types: dict[str, list] = {}
    ts_kinds = []
    for i, s in enumerate(query.streams):
        df = streams[s.source]
        ts_kinds.append(_time_kind(df.schema[timestamp].dataType))
        part, col_types[s.alias] = _project(df, i, s.alias, query, plan, P, timestamp,
                                            ts_kinds[-1], sign if s.alias in signed else None,
                                            order, s.source)
        parts.append(part)
    if end_of_input is not None:
        ctl = spark.readStream.schema("value string").text(str(end_of_input))
        parts.append(ctl.select(F.lit(END).cast("int").alias("_s"),
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

    out_types = _output_types(spark, query, col_types)
    fields = [T.StructField("_aq_kind", T.ByteType())]
    fields += [T.StructField(n, t) for n, t in zip(names, out_types, strict=True)]
    fields += [T.StructField("_sign", T.ByteType()), T.StructField("_ts", T.LongType()),
               T.StructField("_aq_stream", T.StringType()), T.StructField("_aq_row", T.LongType()),
               T.StructField("_aq_file", T.StringType()),
               T.StructField("_aq_reason", T.StringType()),
               T.StructField("_aq_info", T.StringType())]
    out_schema = T.StructType(fields)

    cfg = _Config(
        qid=uuid.uuid4().hex, sql=sql, schemas=schemas, executor=executor, mode=mode,
        options=dict(options), adaptivity=spec, groups=P, keys=keys, lateness=float(allowed_lateness),
        lateness_ns=late_ns, signed=bool(signed), n_streams=len(query.streams),
        stream_columns=[[f"c{i}_{k}" for k in range(len(query.columns[a]))]
                        for i, a in enumerate(query.aliases)],
        reported=[_first_alias_of_source(query, i) for i in range(len(query.streams))],
        sources=[s.source for s in query.streams], names=names, timestamp=timestamp,
        unit=timestamp_unit, ts_kinds=ts_kinds, sign=sign)
    packets = union.mapInArrow(_Split(cfg), "_g int, _p binary")
    raw = packets.groupBy("_g").transformWithStateInPandas(
        statefulProcessor=_Processor(cfg), outputStructType=out_schema,
        outputMode="Append", timeMode="None")
    info = {"query": query, "plan": plan, "config": cfg, "names": names,
            "ts_type": ts_type, "unit": timestamp_unit, "adaptivity": spec}
    raw._adaptcq = info
    if side_outputs:
        return raw
    res = raw.where(F.col("_aq_kind") == KIND_RESULT).select(
        *names, "_sign", _ts_out(ts_type, timestamp_unit).alias("_ts"))
    res._adaptcq = info
    return res


def _check_engine(query: LogicalQuery, executor: str, mode: str, signed: bool,
                  spec: dict | None, options: dict) -> None:
    """Build one group's engine and policies on the driver: a bad option fails here, in
    one line, not in a Spark worker."""
    from adaptcq.engine.continuous import ContinuousQuery
    try:
        cq = ContinuousQuery(query, executor, mode, time_unit=TIME_UNIT,
                             explicit_deletions=signed, **options)
        for policy in make_policies(spec) if spec is not None else ():
            cq.attach(policy)
    except AdaptcqError:
        raise
    except (ValueError, KeyError, TypeError) as e:
        raise OptionError(str(e).strip('"')) from None


def _is_timestamp(t) -> bool:
    import pyarrow as pa
    return pa.types.is_timestamp(t)


def _signed_streams(query: LogicalQuery, streams: Mapping[str, object],
                    sign: str | None) -> set[str]:
    """The aliases whose input has the sign column (the local runtime's checks)."""
    from pyspark.sql import types as T
    if sign is None:
        return set()
    having = [n for n, df in streams.items() if sign in df.columns]
    if not having:
        raise InputError(f"no input has the sign column {sign!r} (--sign); the inputs' "
                         "columns: " + "; ".join(f"{n}: {', '.join(df.columns)}"
                                                 for n, df in streams.items()))
    for n in having:
        dt = streams[n].schema[sign].dataType
        if not isinstance(dt, T.NumericType):
            raise InputError(f"stream {n}: the sign column {sign!r} has type "
                             f"{dt.simpleString()}; it must hold the numbers +1 (insert) or "
                             "-1 (delete)")
    signed = set()
    for s in query.streams:
        if s.source in having:
            if s.window.kind != "unbounded":
                raise InputError(f"stream {s.alias} has a sign column {sign!r} and a window "
                                 f"{s.window}; explicit deletions need an unbounded stream")
            signed.add(s.alias)
    return signed


_EPOCH_NTZ = "TIMESTAMP_NTZ'1970-01-01 00:00:00'"


def _ts_out(ts_type, unit: str | None):
    """``_ts`` from int64 nanoseconds to its output type, with integer arithmetic.

    Timestamps: ``ns div 1000`` microseconds (exact: inputs are whole microseconds and
    windows are checked to be), as TimestampType (an instant, from ``timestamp_micros``) or
    TimestampNTZ (wall-clock time in UTC, from ``timestampadd``: no session timezone
    involved). Numbers: ``ns div factor`` (a long; exact, as every window is a whole number
    of the unit) or ``ns / factor`` (a double, as ``eventtime.from_nanoseconds``)."""
    import pyarrow as pa
    from pyspark.sql import functions as F
    if pa.types.is_timestamp(ts_type):
        if ts_type.tz:
            return F.timestamp_micros(F.expr("_ts div 1000"))
        return F.expr(f"timestampadd(MICROSECOND, _ts div 1000, {_EPOCH_NTZ})")
    factor = et.UNITS[et.check_unit(unit)]
    if pa.types.is_integer(ts_type):
        return F.expr(f"_ts div {factor}")
    return F.col("_ts").cast("double") / F.lit(float(factor))


def _first_alias_of_source(query: LogicalQuery, i: int) -> bool:
    """A late row is reported once per source (as the local runtime does), by its first alias."""
    src = query.streams[i].source
    return next(j for j, s in enumerate(query.streams) if s.source == src) == i


def _metadata_fields(df) -> set[str]:
    """The fields of a file source's ``_metadata`` column (empty for other sources), read
    from the analysed plan: selecting a missing column would log an analysis error."""
    from pyspark.sql import types as T
    with contextlib.suppress(Exception):  # no JVM plan to inspect (e.g. Spark Connect)
        attrs = df._jdf.queryExecution().analyzed().metadataOutput()
        for k in range(attrs.size()):
            a = attrs.apply(k)
            if a.name() == "_metadata":
                dt = T.StructType.fromJson(json.loads(a.dataType().json()))
                return {f.name for f in dt.fields}
    return set()


def _project(df, i: int, alias: str, query: LogicalQuery, plan: SplitPlan, P: int,
             timestamp: str, ts_kind: str, sign: str | None, order, source: str):
    """One stream's rows in the union's layout: stream index, group, raw event time (``_ti``
    long: epoch microseconds, days, or an integer time; ``_td`` double: a fractional time),
    sign, order key (``_o1`` file, ``_o2`` position; with ``_oc`` the split adds the row's
    count within its (file, block) or Spark partition), and the columns the query needs
    (``c<i>_<k>``, in ``query.columns[alias]`` order)."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    tdt = df.schema[timestamp].dataType
    tcol = F.col(f"`{timestamp.replace('`', '``')}`")
    ti, td = F.lit(None).cast("long"), F.lit(None).cast("double")
    if ts_kind == "us":
        ti = (F.unix_micros(tcol) if isinstance(tdt, T.TimestampType) else
              F.expr(f"timestampdiff(MICROSECOND, {_EPOCH_NTZ}, "
                     f"`{timestamp.replace('`', '``')}`)"))
    elif ts_kind == "date":
        ti = F.unix_date(tcol)
    elif ts_kind == "int":
        ti = tcol
    else:
        td = tcol
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
        o1, o2, oc = F.lit(None).cast("string"), F.col(ordcol).cast("long"), F.lit(False)
    else:
        meta = _metadata_fields(df)
        if "row_index" in meta:  # Parquet: the row's index in its file
            o1, o2, oc = F.col("_metadata.file_path"), F.col("_metadata.row_index"), F.lit(False)
        elif "file_block_start" in meta:
            # CSV and other text formats have no row index. A file block is read in order by
            # one task, so the split numbers the rows of each (file, block start): block
            # start + k increases with the row's position in the file (every line takes at
            # least one byte), and is the row index itself in a file of one block.
            o1, o2, oc = (F.col("_metadata.file_path"), F.col("_metadata.file_block_start"),
                          F.lit(True))
        else:  # any other source: the row's position in its Spark partition
            o1 = F.concat(F.lit(_NOFILE + "p"),
                          F.lpad(F.spark_partition_id().cast("string"), 6, "0"))
            o2, oc = F.lit(0).cast("long"), F.lit(True)
    cols = [F.lit(i).cast("int").alias("_s"), g.cast("int").alias("_g"),
            ti.cast("long").alias("_ti"), td.cast("double").alias("_td"),
            (F.col(sign).cast("byte") if sign else F.lit(1).cast("byte")).alias("_sg"),
            o1.alias("_o1"), o2.cast("long").alias("_o2"), oc.alias("_oc")]
    types = []
    for k, c in enumerate(query.columns[alias]):
        if c not in df.columns:
            raise InputError(f"stream {alias}: no column {c!r} in its input "
                             f"(its columns: {', '.join(df.columns)})")
        dt = df.schema[c].dataType
        col = F.col(c)
        if isinstance(dt, T.TimestampType):
            # The engine compares naive UTC datetimes, as the local runtime normalizes them;
            # built from the instant, so the session timezone plays no part.
            col = F.expr(f"timestampadd(MICROSECOND, unix_micros(`{c.replace('`', '``')}`), "
                         f"{_EPOCH_NTZ})")
            dt = T.TimestampNTZType()
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
    adaptivity: dict | None
    groups: int
    keys: list[int]
    lateness: float
    lateness_ns: int
    signed: bool
    n_streams: int
    stream_columns: list[list[str]]
    reported: list[bool]
    sources: list[str]
    names: list[str]
    timestamp: str = "ts"
    unit: str | None = None
    ts_kinds: list[str] = field(default_factory=list)
    sign: str | None = None


def _file_key(uri: str | None, cache: dict) -> str:
    """The order key of a row's file: its local path with "/" as ``_SEP``, so that keys sort
    as the local runtime sorts a source's files (``sorted(Path)``). Rows of no file keep
    their ``_NOFILE`` key; rows with an order column have none ("")."""
    if uri is None:
        return ""
    key = cache.get(uri)
    if key is None:
        if uri.startswith(_NOFILE):
            key = uri
        else:
            from urllib.parse import unquote, urlparse
            path = unquote(urlparse(uri).path) if uri.startswith("file:") else uri
            key = path.replace("/", _SEP)
        cache[uri] = key
    return key


def _file_of(key: str | None) -> str | None:
    """The file a row came from (for messages), from its order key."""
    if not key or key.startswith(_NOFILE):
        return None
    return key.replace(_SEP, "/")


class _Split:
    """state-spill.txt §5's split operator, as ``mapInArrow``: one packet per partition group
    per input Arrow batch. A packet carries that group's rows of the batch (Python tuples in
    the engine's row layout, pickled: the stateful operator then sees a few large rows instead
    of one pandas row per update) and, for every stream, the batch's maximum event time and row
    count. Packets go to every group, empty or not, so all groups share one event-time
    frontier (punctuation in the sense of stream processors).

    Event times become int64 nanoseconds here, with ``eventtime.to_nanoseconds`` (the local
    runtime's rules and messages). One call sees one Spark partition in order, which is what
    numbers the rows of sources without a row index (``_oc``)."""

    def __init__(self, cfg: _Config):
        self.cfg = cfg

    def __call__(self, batches):
        import pyarrow as pa
        import pyarrow.compute as pc
        cfg = self.cfg
        P = cfg.groups
        counters: dict = {}
        keys: dict = {}
        for batch in batches:
            if batch.num_rows == 0:
                continue
            s = batch.column("_s").to_numpy(zero_copy_only=False)
            g = batch.column("_g").to_numpy(zero_copy_only=False)
            end = bool((s == END).any())
            o1 = [_file_key(u, keys) for u in batch.column("_o1").to_pylist()]
            o2 = pc.fill_null(batch.column("_o2"), -1).to_numpy(zero_copy_only=False).copy()
            oc = pc.fill_null(batch.column("_oc"), False).to_numpy(zero_copy_only=False)
            for j in np.flatnonzero(oc & (s >= 0)).tolist():
                k = (o1[j], int(o2[j]))
                c = counters.get(k, 0)
                counters[k] = c + 1
                o2[j] += c
            t = np.zeros(len(s), np.int64)
            maxima = []
            for i in np.unique(s[s >= 0]).tolist():
                sel = np.flatnonzero(s == i)
                t[sel] = self._times(batch, i, sel, o1, o2)
                maxima.append((i, int(t[sel].max()), len(sel)))
            if cfg.signed:
                self._check_signs(batch, s, o1, o2)
            out_g, out_p = [], []
            for gi in range(P):
                idx = np.flatnonzero((g == gi) & (s >= 0)) if P > 1 else np.flatnonzero(s >= 0)
                out_g.append(cfg.keys[gi])
                out_p.append(pickle.dumps(self._packet(batch, s, t, idx, end, maxima, o1, o2),
                                          protocol=pickle.HIGHEST_PROTOCOL))
            yield pa.RecordBatch.from_arrays(
                [pa.array(out_g, pa.int32()), pa.array(out_p, pa.binary())], ["_g", "_p"])

    def _times(self, batch, i: int, sel: np.ndarray, o1: list, o2: np.ndarray) -> np.ndarray:
        """Stream i's event times in ``sel`` as int64 ns; a bad one is an InputError naming
        the stream, its file and the row's index there, with ``eventtime``'s wording."""
        import pyarrow as pa
        cfg = self.cfg
        kind = cfg.ts_kinds[i]
        col = batch.column("_td" if kind == "float" else "_ti").take(pa.array(sel))
        if kind == "us":
            col = col.cast(pa.timestamp("us"))
        elif kind == "date":
            col = col.cast(pa.int32()).cast(pa.date32())
        try:
            return et.to_nanoseconds(col, cfg.unit, cfg.sources[i], cfg.timestamp)
        except InputError:
            for j in range(len(col)):  # the first bad row, with its own number and file
                r = int(sel[j])
                f = _file_of(o1[r])
                et.to_nanoseconds(col.slice(j, 1), cfg.unit,
                                  cfg.sources[i] + (f" (file {f})" if f else ""),
                                  cfg.timestamp, first_row=int(o2[r]))
            raise

    def _check_signs(self, batch, s: np.ndarray, o1: list, o2: np.ndarray) -> None:
        cfg = self.cfg
        sg = batch.column("_sg").to_numpy(zero_copy_only=False)
        bad = np.flatnonzero((s >= 0) & (sg != 1) & (sg != -1))
        if len(bad):
            r = int(bad[0])
            f = _file_of(o1[r])
            raise InputError(f"stream {cfg.sources[s[r]]}{f' (file {f})' if f else ''}: row "
                             f"{int(o2[r])} has sign {sg[r].item()!r}; the sign column "
                             f"{cfg.sign!r} holds +1 or -1")

    def _packet(self, batch, s, t, idx, end, maxima, o1, o2):
        import pyarrow as pa
        cfg = self.cfg
        if len(idx) == 0:
            return (end, maxima, [], [], None, [], [], [])
        sub = batch.take(pa.array(idx))
        ss = s[idx]
        streams, tss, signs, k1, k2, rows = [], [], [], [], [], []
        for i in np.unique(ss).tolist():
            sel = np.flatnonzero(ss == i)
            at = idx[sel]
            part = sub.take(pa.array(sel)) if len(sel) != len(idx) else sub
            cols = [part.column(c).to_pylist() for c in cfg.stream_columns[i]]
            rows.extend(zip(*cols) if cols else [()] * len(sel))
            streams.extend([i] * len(sel))
            tss.extend(t[at].tolist())
            if cfg.signed:
                signs.extend(part.column("_sg").to_pylist())
            k1.extend(o1[j] for j in at.tolist())
            k2.extend(o2[at].tolist())
        return (end, maxima, streams, tss, signs if cfg.signed else None, k1, k2, rows)


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


def release(pool: list, frontier: list, closed: bool, end: bool, lateness: int
            ) -> tuple[list, list, list, bool, float, float]:
    """The rows of ``pool`` (tuples keyed ``(ts, stream, micro-batch, file, row, ...)``)
    that can be processed now: those before the release bound, the smallest frontier minus
    the allowed lateness (ties: by stream). At the end of input everything goes, as the
    local runtime processes its whole input, and the frontier closes at the largest event
    time of any stream. Returns (go, pending, frontier, closed, bound, advance): deletions
    due before ``advance`` can then be processed."""
    if end or closed:
        top = max(frontier)
        if end and not closed:
            closed = True
            frontier = [top + lateness] * len(frontier)
        bound_ts, bound_s = math.inf, 0
        advance = top
    else:
        bound_ts, bound_s = min((f - lateness, i) for i, f in enumerate(frontier))
        advance = bound_ts
    pool.sort(key=lambda r: r[:5])
    n = 0
    for r in pool:
        if r[0] < bound_ts or (r[0] == bound_ts and r[1] <= bound_s):
            n += 1
        else:
            break
    return pool[:n], pool[n:], frontier, closed, bound_ts, advance


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

    ``policies`` are the group's adaptive policies (``cfg.adaptivity``), attached to ``cq``
    (docs/spark.md, "Adaptivity"). Between micro-batches they live on with the live engine
    in the worker (``_LIVE``). The group's pickled state keeps them too, so that a restore
    from the store (another worker got the group, a retried batch, a restart from the
    checkpoint) continues them, not only the engine:

    * the orders in force are in the engine's snapshot (``plan_state``);
    * the query's Profiler and the ordering policies (the optimizer's initial plan,
      A-Greedy) are pickled with the group (``policy_state``; the logical query they refer
      to is not pickled but re-bound to this worker's copy): statistics, history and the
      initial plan carry on as if nothing happened;
    * A-Caching starts afresh: the caches it placed are join subresults held by the engine,
      which its snapshot does not carry (SteMs determine them), so the restored engine has
      none, and A-Caching profiles its candidates and selects again (on the restored
      profiler's statistics). Its report before the restore is kept in ``earlier``.

    Policies that do not pickle (a policy holding the engine, say) fall back to the same
    fresh start, with an optimizer whose plan was set (``planned``) not planning again: its
    plan is the restored orders. Results never depend on any of this: MJoin is exact under
    any order and any cache.
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
    policies: list = field(default_factory=list)
    planned: dict | None = None  # the optimizer's report once its initial plan is set
    earlier: list = field(default_factory=list)  # reports of policies restarted by a restore
    restores: int = 0  # restores from the store with policies
    continued: int = 0  # of them, restores that continued the saved profiler and policies

    def dumps(self) -> bytes:
        adapt = None
        if self.policies or self.planned is not None:
            full = self.report()  # (also records ``planned``)
            saved = self.policy_state()
            blob = _dump_policies(self.cq, saved) if saved is not None else None
            restarting = self.policies if blob is None else \
                [p for p, kept in zip(self.policies, saved[1], strict=True) if kept is None]
            adapt = {"saved": blob, "full": full,
                     "restarting": self.report(restarting) if restarting else {},
                     "planned": self.planned, "earlier": self.earlier,
                     "restores": self.restores, "continued": self.continued}
        return pickle.dumps({
            "v": 1, "cq": self.cq.snapshot(), "groups": self.groups, "frontier": self.frontier,
            "pending": self.pending, "seq": self.seq, "closed": self.closed, "late": self.late,
            "peak": (self.peak_tuples, self.peak_bytes), "adapt": adapt},
            protocol=pickle.HIGHEST_PROTOCOL)

    def policy_state(self) -> tuple | None:
        """(the query's profiler, each policy or None where it restarts after a restore)."""
        if not self.policies or getattr(self.cq, "profiler", None) is None:
            return None
        from adaptcq.adapt.acaching import ACaching
        return (self.cq.profiler,
                [None if isinstance(p, ACaching) else p for p in self.policies])

    def attach(self, cfg: _Config, saved: tuple | None = None) -> None:
        """Attach the group's policies: fresh ones from ``cfg.adaptivity``, or those of
        ``saved`` (``policy_state``, unpickled) with fresh ones where it has None."""
        spec = cfg.adaptivity
        if spec is None:
            return
        if saved is None and self.planned is not None and spec.get("optimizer") is not None:
            # The initial plan was set before the snapshot and is in the restored orders.
            spec = {**spec, "optimizer": None}
            if spec["reorder"] == "off" and spec["caching"] is None:
                return
        fresh = make_policies(spec)
        if saved is not None:
            profiler, kept = saved
            if len(kept) != len(fresh):
                raise AdaptcqError("the group's saved policies do not match the query's "
                                   "adaptivity; restart with a new --checkpoint")
            self.cq.attach(profiler)  # the query's profiler, statistics and all
            fresh = [f if k is None else k for k, f in zip(kept, fresh, strict=True)]
        self.policies = fresh
        for policy in self.policies:
            self.cq.attach(policy)

    def report(self, policies: list | None = None) -> dict:
        """What the group's policies decided: their ``report()`` dicts merged (JSON-able),
        with the optimizer's once its plan is set, even from before a restore."""
        merged: dict = {} if policies is not None else dict(self.planned or {})
        for policy in self.policies if policies is None else policies:
            if type(policy).__name__ == "InitialPlan" and getattr(policy, "done", False):
                self.planned = _jsonable_report(policy.report())
            merged.update(policy.report())
        return _jsonable_report(merged)

    @classmethod
    def loads(cls, cfg: _Config, blob: bytes) -> _GroupEngine:
        from adaptcq.engine.continuous import ContinuousQuery
        st = pickle.loads(blob)
        if st["groups"] != cfg.groups:
            raise AdaptcqError(
                f"the checkpoint was written with {st['groups']} partition groups and the "
                f"query now has {cfg.groups}; restart with the same --partitions (rows would "
                "otherwise meet state of other keys)")

        def engine():
            cq = ContinuousQuery.restore(_logical(cfg), st["cq"], cfg.mode, **cfg.options)
            return cls(cq, st["groups"], st["frontier"], st["pending"], st["seq"],
                       st["closed"], st["late"], *st["peak"])

        g = engine()
        adapt = st.get("adapt")
        if adapt is None:
            g.attach(cfg)
            return g

        def carry(g: _GroupEngine, restarted: dict, continued: int = 0) -> _GroupEngine:
            g.planned, g.restores = adapt["planned"], adapt["restores"] + 1
            g.continued = adapt.get("continued", 0) + continued
            g.earlier = [*adapt["earlier"], restarted][-_EARLIER:] if restarted else \
                list(adapt["earlier"])
            return g

        if adapt["saved"] is not None:
            try:
                carry(g, adapt["restarting"], 1).attach(cfg,
                                                        _load_policies(cfg, adapt["saved"]))
                return g
            except AdaptcqError:
                raise
            except Exception:  # noqa: BLE001 - saved policies that no longer load: fresh ones
                g = engine()
        carry(g, adapt["full"]).attach(cfg)
        return g

    @classmethod
    def new(cls, cfg: _Config) -> _GroupEngine:
        from adaptcq.engine.continuous import ContinuousQuery
        cq = ContinuousQuery(_logical(cfg), cfg.executor, cfg.mode, time_unit=TIME_UNIT,
                             explicit_deletions=cfg.signed, **cfg.options)
        g = cls(cq, cfg.groups, [-math.inf] * cfg.n_streams)
        g.attach(cfg)
        return g

    def step(self, cfg: _Config, packets: list[tuple]) -> tuple[list, list]:
        """One micro-batch: lateness, ordering, release, expiry. Returns (results, rejected)."""
        L = cfg.lateness_ns  # event times are int64 ns
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
                        f = _file_of(o1[k])
                        row = o2[k] if f is not None or not (o1[k] or "") else -1
                        rejected.append((cfg.sources[i], row, f, ts, (
                            "arrived after end of input" if self.closed else
                            f"late by more than the allowed lateness ({cfg.lateness:g} s)")))
                    continue
                new.append((ts, i, seq, o1[k] or "", o2[k],
                            1 if signs is None else signs[k], rows[k]))
        go, self.pending, self.frontier, self.closed, _, advance = release(
            self.pending + new, bmax, self.closed, end, L)
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


class _PolicyPickler(pickle.Pickler):
    """Pickles a group's profiler and policies: the logical query they refer to becomes a
    reference (re-bound on load to the worker's copy, which the restored engine runs); the
    engine itself must not be reachable (it would not survive as the same object)."""

    def __init__(self, file, cq):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.cq = cq

    def persistent_id(self, obj):
        if isinstance(obj, LogicalQuery):
            return "query"
        if obj is self.cq or obj is self.cq.executor:
            raise pickle.PicklingError("a policy holds the engine")
        return None


class _PolicyUnpickler(pickle.Unpickler):
    def __init__(self, file, query: LogicalQuery):
        super().__init__(file)
        self.query = query

    def persistent_load(self, pid):
        if pid == "query":
            return self.query
        raise pickle.UnpicklingError(f"unknown reference {pid!r}")


def _dump_policies(cq, saved: tuple) -> bytes | None:
    """``saved`` pickled, or None when it does not pickle (the policies then restart after a
    restore, as A-Caching always does)."""
    import io
    buf = io.BytesIO()
    try:
        _PolicyPickler(buf, cq).dump(saved)
    except (pickle.PicklingError, TypeError, AttributeError, RecursionError):
        return None
    return buf.getvalue()


def _load_policies(cfg: _Config, blob: bytes) -> tuple:
    import io
    return _PolicyUnpickler(io.BytesIO(blob), _logical(cfg)).load()


_LIVE: dict[tuple[str, int], tuple[tuple[int, int], _GroupEngine]] = {}
_EARLIER = 4  # reports of earlier policy generations kept per group


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
        data["_ts"] = np.asarray(cols[n + 1], np.int64)  # int64 ns, converted by the caller
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
                     "_ts": np.asarray(ts, np.int64), "_aq_stream": list(src),
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
            "now": eng.cq.now if math.isfinite(eng.cq.now) else None,
            "plan": eng.cq.executor.describe()}
    if cfg.adaptivity is not None:
        info["policies"] = eng.report()
        info["policy_restores"] = eng.restores
        info["policy_continued"] = eng.continued
        info["restarted_policies"] = eng.earlier
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
    run_id: str = ""  # the checkpoint's run (its output folders carry it)
    checkpoint: str | None = None
    restarted: bool = False  # continued from a checkpoint that had processed input
    ts_type: object = None  # pyarrow type of _ts (None: leave int64 nanoseconds)
    unit: str | None = None  # --timestamp-unit
    adaptivity: dict | None = None  # the policies every group ran (continuous_query)

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


_OURS = re.compile(r"part-(\d{8}|empty)\.parquet|\.part-(\d{8}|empty)\.parquet\.tmp")


def _is_ours(name: str) -> bool:
    """A file adaptcq writes into an output folder."""
    return name == OUTPUT_MARKER or bool(_OURS.fullmatch(name))


def _mark(folder: Path, run: SparkRun) -> None:
    """Claim ``folder`` for ``run``'s checkpoint (``OUTPUT_MARKER``; Spark and pyarrow
    skip files whose names start with an underscore)."""
    folder.mkdir(parents=True, exist_ok=True)
    _write_text(folder / OUTPUT_MARKER, json.dumps(
        {"run": run.run_id, "checkpoint": run.checkpoint}, indent=1) + "\n")


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _write_parquet(table, folder: Path, name: str) -> None:
    """Write under a temporary name, then rename: a killed run never leaves a partial file
    (readers skip names starting with a dot)."""
    import pyarrow.parquet as pq
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{name}.tmp"
    pq.write_table(table, tmp)
    os.replace(tmp, folder / name)


def write_batch(raw_batch, batch_id: int, output: str | None, rejected: str | None,
                run: SparkRun, names: list[str], ts_type=None, unit: str | None = None) -> None:
    """Route one micro-batch of side-output rows: results and rejected rows to Parquet files
    named by batch id (a re-run batch overwrites its own file: exactly once), statistics into
    ``run``. Use it from ``foreachBatch``.

    ``_ts`` leaves the operator as int64 nanoseconds and is written as ``ts_type`` (default
    ``run.ts_type``; see ``eventtime.from_nanoseconds``). Rejected rows have the local
    runtime's columns (stream, row, ts in float seconds, reason) plus ``file``."""
    import pyarrow as pa

    if ts_type is None:
        ts_type, unit = run.ts_type, run.unit
    # One action on the batch: running the stateful plan twice in a batch is not allowed to
    # matter, but it would cost twice; collecting once and splitting on the driver avoids it.
    tab = raw_batch.toArrow()
    kind = tab.column("_aq_kind").to_numpy(zero_copy_only=False)
    res = tab.filter(kind == KIND_RESULT).select([*names, "_sign", "_ts"])
    if ts_type is not None:
        ns = res.column("_ts").to_numpy()
        res = res.set_column(len(names) + 1, "_ts", et.from_nanoseconds(ns, ts_type, unit))
    rj = tab.filter(kind == KIND_REJECTED)
    rej = pa.table({
        "stream": rj.column("_aq_stream"), "row": rj.column("_aq_row"),
        "file": rj.column("_aq_file"),
        "ts": pa.array(rj.column("_ts").to_numpy() / 1e9, pa.float64()),
        "reason": rj.column("_aq_reason")})
    stats = tab.filter(kind == KIND_STATS).column("_aq_info").to_pylist()
    if output and res.num_rows:
        _write_parquet(res, Path(output), f"part-{batch_id:08d}.parquet")
    if rejected and rej.num_rows:
        if run.run_id and not (Path(rejected) / OUTPUT_MARKER).exists():
            _mark(Path(rejected), run)
        _write_parquet(rej, Path(rejected), f"part-{batch_id:08d}.parquet")
    run.batches += 1
    run.results += res.num_rows
    run.rejected += rej.num_rows
    for s in stats:
        info = json.loads(s)
        run.rows_in += info["rows_in"]
        run.groups[info["group"]] = info
        run.history.append(info)
    run._schema = res.schema


# ---------------------------------------------------------------------------------------------
# Files in: a file, a folder or a glob per stream, as the local runtime reads them
# ---------------------------------------------------------------------------------------------

_GLOB_FILTER = {"parquet": "*.{parquet,pq,PARQUET,PQ}",
                "csv": "*.{csv,txt,gz,bz2,CSV,TXT,GZ,BZ2}"}


@dataclass
class _Input:
    name: str
    given: str  # as the user gave it
    kind: str  # parquet | csv
    path: str  # what Spark's file source loads: a folder, a glob, or a one-file glob
    options: dict
    files: list  # the files present now, as the local runtime lists them (sorted)
    schema: object  # pyarrow schema, as the local runtime reads it
    pattern: str | None = None  # the absolute pattern of a glob input


def _one_file_glob(path: Path) -> str:
    """A glob matching exactly ``path``. Spark's file source takes folders (it sets the
    path as ``basePath``, which must be a folder) and globs; a glob of one file reads it."""
    special = set("{}[]*?\\")

    def esc(text: str) -> str:
        return "".join("\\" + c if c in special else c for c in text)
    name = path.name
    j = max(k for k, c in enumerate(name) if c.isalnum())  # a .parquet/.csv name has one
    return f"{esc(str(path.parent))}/{esc(name[:j])}[{name[j]}]{esc(name[j + 1:])}"


def _resolve_input(name: str, given, timestamp: str, unit: str | None) -> _Input:
    """One stream's input: the local runtime's checks (files exist, Parquet or CSV and not
    both, the same columns in every file, the timestamp column and its type) and what Spark
    loads for it."""
    from adaptcq.stream.sources import open_source
    text = os.path.expanduser(str(given))
    if "**" in text:
        raise InputError(f"stream {name}: {text!r}: '**' (any depth) is not supported by "
                         "Spark's file source; give the folder instead (all its subfolders "
                         "are read)")
    src = open_source(name, text, timestamp, unit)
    files = [Path(p) for p in src.paths]
    if not files:
        raise InputError(f"stream {name}: no file in {text!r}")
    kind = "parquet" if files[0].name.lower().endswith((".parquet", ".pq")) else "csv"
    pattern = None
    if any(c in text for c in "*?["):
        pattern = os.path.abspath(text)
        path, options = pattern, {}
    elif Path(text).is_dir():
        path = os.path.realpath(text)
        options = {"recursiveFileLookup": "true", "pathGlobFilter": _GLOB_FILTER[kind]}
    else:
        path, options = _one_file_glob(Path(os.path.realpath(text))), {}
    if kind == "parquet":
        _check_parquet_times(name, files)
    return _Input(name, str(given), kind, path, options, files, src.schema, pattern)


def _check_parquet_times(name: str, files: list) -> None:
    """Spark cannot read Parquet TIMESTAMP(NANOS) columns (pyarrow's default for pandas
    datetimes): say so before Spark fails with a stack trace."""
    import pyarrow.parquet as pq
    for f in files:
        sch = None
        with contextlib.suppress(Exception):  # unreadable: open_source has said so already
            sch = pq.ParquetFile(f).schema
        for k in range(len(sch) if sch is not None else 0):
            col = sch.column(k)
            lt = col.logical_type
            if lt.type == "TIMESTAMP" and '"nanoseconds"' in lt.to_json():
                raise InputError(
                    f"stream {name}: column {col.path!r} of {str(f)!r} holds nanosecond "
                    "timestamps (Parquet TIMESTAMP(NANOS)), which Spark cannot read; write "
                    "it in microseconds (pyarrow: pq.write_table(..., coerce_timestamps='us'))"
                    ", or use --engine local")


def _read_stream(spark, inp: _Input, max_files: int | None):
    """A file stream with the files' own schema (Parquet; CSV with a header, its column
    types inferred as the local runtime infers them, by pyarrow)."""
    reader = spark.readStream.options(**inp.options)
    if max_files:
        reader = reader.option("maxFilesPerTrigger", int(max_files))
    if inp.kind == "parquet":
        schema = spark.read.options(**inp.options).parquet(inp.path).schema
        return reader.schema(schema).parquet(inp.path)
    from pyspark.sql.pandas.types import from_arrow_schema
    return reader.schema(from_arrow_schema(inp.schema)).option("header", True).csv(inp.path)


# ---------------------------------------------------------------------------------------------
# Checkpoint fingerprints and output folders
# ---------------------------------------------------------------------------------------------

_QUOTED = re.compile(r"('(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|`[^`]*`)|\s+")


def normalize_sql(sql: str) -> str:
    """The query text with runs of white space (outside quotes) made one space and a final
    semicolon dropped: what a checkpoint's fingerprint compares."""
    text = _QUOTED.sub(lambda m: m.group(1) or " ", sql).strip()
    return text[:-1].rstrip() if text.endswith(";") else text


def _canonical(value):
    return json.loads(json.dumps(value, sort_keys=True, default=repr))


_LABELS = {
    "version": "fingerprint version", "sql": "the query", "timestamp": "--timestamp",
    "timestamp_unit": "--timestamp-unit", "executor": "--executor", "mode": "--mode",
    "groups": "partition groups (--partitions)",
    "allowed_lateness_ns": "--allowed-lateness (ns)", "sign": "--sign",
    "order": "order column", "options": "engine options (--order, --tree, --nested-loop)",
    "adaptivity": "adaptive policies (--optimizer, --reorder, --executor acaching and its "
                  "cache options)",
    "inputs": "inputs", "schemas": "input columns", "output": "--output",
    "rejected": "--rejected",
}


def _fingerprint_diff(old: dict, new: dict) -> list[str]:
    out = []
    for key, label in _LABELS.items():
        a, b = old.get(key), new.get(key)
        if a == b:
            continue
        if key == "sql":
            out.append("the query text differs")
        elif key in ("inputs", "schemas") and isinstance(a, dict) and isinstance(b, dict):
            for n in sorted(set(a) | set(b)):
                if a.get(n) != b.get(n):
                    out.append(f"input {n}: was {a.get(n)}, now {b.get(n)}" if key == "inputs"
                               else f"the columns of input {n} differ")
        else:
            out.append(f"{label} was {_shown(a)}, now {_shown(b)}")
    return out


def _shown(value) -> str:
    return "not given" if value is None else str(value)


@dataclass
class FileJob:
    """A checked run of a query over files (``prepare_files``): nothing is written and no
    Spark job runs until ``run``."""

    sql: str
    inputs: dict
    checkpoint: Path
    checkpoint_label: str
    output: str | None
    rejected: str | None
    timestamp: str
    executor: str
    mode: str
    partitions: int
    allowed_lateness: float
    sign: str | None
    unit: str | None
    options: dict
    adaptivity: dict | None
    fingerprint: dict
    fresh: bool
    output_state: str | None
    rejected_state: str | None

    def commit(self) -> None:
        """Write the fingerprint (a fresh run) and claim or clear the output folders."""
        ck = self.checkpoint
        ck.mkdir(parents=True, exist_ok=True)
        if self.fresh:
            # A run that completed no micro-batch may have left Spark offsets, uncommitted
            # state and end markers: none of it counts.
            with contextlib.suppress(OSError):
                import shutil
                shutil.rmtree(ck / "query")
            for f in (ck / "end_of_input").glob("end-*.txt"):
                f.unlink()
            _write_text(ck / FINGERPRINT, json.dumps(self.fingerprint, indent=1) + "\n")
        run = self._run_record()
        if self.output and self.output_state != "append":
            self._clear(Path(self.output), self.output_state)
            _mark(Path(self.output), run)
        if self.rejected and self.rejected_state == "clear":
            self._clear(Path(self.rejected), "clear")
            with contextlib.suppress(OSError):
                Path(self.rejected).rmdir()

    @staticmethod
    def _clear(folder: Path, state: str | None) -> None:
        if state != "clear":
            return
        for f in folder.iterdir():
            if _is_ours(f.name):
                f.unlink()

    def _run_record(self) -> SparkRun:
        return SparkRun(output=self.output, rejected_path=self.rejected,
                        run_id=self.fingerprint["run"], checkpoint=self.fingerprint["checkpoint"],
                        restarted=not self.fresh)

    def run(self, spark, finish: bool = True, max_files_per_trigger: int | None = None
            ) -> SparkRun:
        """Run the query on ``spark`` over every file present; with ``finish``, signal the
        end of input so that buffered rows are processed as the local runtime would."""
        ctl = self.checkpoint / "end_of_input"
        ctl.mkdir(parents=True, exist_ok=True)  # Spark's file source needs the folder
        try:
            streams = {n: _read_stream(spark, inp, max_files_per_trigger)
                       for n, inp in self.inputs.items()}
            raw = continuous_query(
                spark, self.sql, streams, timestamp=self.timestamp, executor=self.executor,
                mode=self.mode, partitions=self.partitions,
                allowed_lateness=self.allowed_lateness, sign=self.sign,
                end_of_input=str(ctl), side_outputs=True, timestamp_unit=self.unit,
                adaptivity=self.adaptivity, **self.options)
        except AdaptcqError:
            raise
        except Exception as e:  # noqa: BLE001 - Spark's analysis errors, in one line
            raise spark_error(e) from None
        self.commit()
        info = raw._adaptcq
        names = info["names"]
        run = self._run_record()
        run.ts_type, run.unit = info["ts_type"], info["unit"]
        run.adaptivity = info["adaptivity"]
        output, rejected = self.output, self.rejected
        t0 = time.perf_counter()
        q = None
        failure = None
        try:
            q = (raw.writeStream.foreachBatch(
                lambda df, bid: write_batch(df, bid, output, rejected, run, names))
                .option("checkpointLocation", str(self.checkpoint / "query"))
                .queryName(f"adaptcq_{uuid.uuid4().hex[:8]}").start())
            q.processAllAvailable()
            if finish:
                signal_end(ctl)
                q.processAllAvailable()
        except Exception as e:  # noqa: BLE001 - reported below, in one line
            failure = e
        finally:
            if q is not None:
                run.progress = list(q.recentProgress)
                with contextlib.suppress(Exception):
                    q.stop()
        if q is not None and failure is None:
            failure = q.exception()
        if failure is not None:
            if isinstance(failure, AdaptcqError):
                raise failure
            raise spark_error(failure) from None
        run.wall_seconds = time.perf_counter() - t0
        if output and not any(Path(output).glob("*.parquet")):
            schema = getattr(run, "_schema", None) or _result_schema(spark, raw, names,
                                                                    info["ts_type"])
            _write_parquet(schema.empty_table(), Path(output), "part-empty.parquet")
        return run


def _result_schema(spark, raw, names, ts_type):
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_type
    tz = spark.conf.get("spark.sql.session.timeZone")
    return pa.schema([pa.field(n, to_arrow_type(raw.schema[n].dataType, timezone=tz))
                      for n in names] + [pa.field("_sign", pa.int8()), pa.field("_ts", ts_type)])


def _check_places(inputs: dict, output: str | None, rejected: str | None,
                  checkpoint: str) -> None:
    """Refuse an output that is, holds or is inside an input (it would be read back, or
    destroy the input), or that is the checkpoint."""
    ck = os.path.realpath(checkpoint)
    for label, path in (("--output", output), ("--rejected", rejected)):
        if path is None:
            continue
        real = os.path.realpath(path)
        for inp in inputs.values():
            hit = any(overlaps(real, os.path.realpath(f)) for f in inp.files)
            if inp.pattern is None:
                root = os.path.realpath(os.path.expanduser(inp.given))
                hit = hit or overlaps(real, root)
            else:
                hit = hit or any(fnmatch.fnmatchcase(str(p), inp.pattern)
                                 for p in (Path(real), *Path(real).parents))
            if hit:
                raise AdaptcqError(
                    f"{label} {path} is the input {inp.given} of stream {inp.name} (or holds "
                    "it, or is inside it): the results would be read back as input, or "
                    "destroy it; write them somewhere else")
        if overlaps(real, ck):
            raise AdaptcqError(f"{label} {path} and --checkpoint {checkpoint} are the same "
                               "folder (or one holds the other); give them separate folders")
    if output and rejected and os.path.realpath(output) == os.path.realpath(rejected):
        raise AdaptcqError("--rejected and --output name the same folder")


def _checkpoint_state(ck: Path, label: str, fp: dict) -> tuple[dict | None, bool]:
    """(stored fingerprint, fresh). Fresh: no micro-batch of this checkpoint was completed."""
    if ck.exists() and not ck.is_dir():
        raise AdaptcqError(f"checkpoint {label} is a file, not a folder; give --checkpoint a "
                           "new folder, or the folder of an earlier run of this query")
    f = ck / FINGERPRINT
    if not f.exists():
        if ck.exists() and any(p.is_file() for p in ck.rglob("*")):
            raise AdaptcqError(f"checkpoint {label} is not empty and has no {FINGERPRINT}: it "
                               "was not written by this version of adaptcq; use a new "
                               "--checkpoint folder")
        return None, True
    try:
        stored = json.loads(f.read_text())
        if not isinstance(stored, dict):
            raise TypeError("not a JSON object")
    except (OSError, ValueError, TypeError) as e:
        raise AdaptcqError(f"checkpoint {label}: cannot read its {FINGERPRINT} ({e}); use a "
                           "new --checkpoint folder") from None
    if not any((ck / "query" / "commits").glob("[0-9]*")):
        # No micro-batch was completed (a run that failed on its first one, say): nothing
        # of it counts, so this run starts afresh, and may be another query.
        return stored, True
    if stored.get("checkpoint") != fp["checkpoint"]:
        raise AdaptcqError(
            f"checkpoint {label} was written at {stored.get('checkpoint')} and has been moved "
            "or copied since; a Spark checkpoint records absolute paths (of its own "
            "end-of-input folder, among others) and works only where it was written: move it "
            "back, or use a new --checkpoint folder")
    diffs = _fingerprint_diff(stored, fp)
    if diffs:
        raise AdaptcqError(f"checkpoint {label} was written by a different query "
                           f"({'; '.join(diffs)}); use a new --checkpoint folder")
    return stored, False


def _output_state(path: str | None, label: str, fresh: bool, run_id: str | None,
                  ck_label: str, must_exist: bool) -> str | None:
    """What to do with an output folder: ``new`` (absent or empty), ``clear`` (a fresh run
    over an earlier adaptcq output: its files are removed), ``append`` (a restart over its
    own output). Anything else is refused: results of two queries never mix."""
    if path is None:
        return None
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise AdaptcqError(f"{label} {path} is a file; with --engine spark the output is a "
                           "folder of Parquet files (one per micro-batch): give a folder")
    if not p.exists() or not any(p.iterdir()):
        if not fresh and must_exist:
            raise AdaptcqError(f"{label} {path} is gone or empty, but checkpoint {ck_label} "
                               "has written results there; restore it, or start afresh with a "
                               "new --checkpoint folder")
        return "new"
    try:
        owner = json.loads((p / OUTPUT_MARKER).read_text())
    except (OSError, ValueError):
        raise AdaptcqError(f"{label} {path} is a folder that is not empty and was not written "
                           "by adaptcq on Spark; give a new or empty folder (adaptcq removes "
                           "only files it wrote)") from None
    if fresh:
        foreign = sorted(f.name for f in p.iterdir() if not _is_ours(f.name))
        if foreign:
            raise AdaptcqError(f"{label} {path} holds files adaptcq did not write "
                               f"({', '.join(foreign[:3])}); give a new or empty folder")
        return "clear"
    if owner.get("run") != run_id:
        raise AdaptcqError(f"{label} {path} holds the results of another run (checkpoint "
                           f"{owner.get('checkpoint')}); a restart from checkpoint {ck_label} "
                           "appends only to its own output: give that output, or use a new "
                           "--checkpoint folder")
    return "append"


def prepare_files(sql: str, sources: Mapping[str, str], checkpoint: str | os.PathLike,
                  output: str | None, rejected: str | None = None, timestamp: str = "ts",
                  executor: str = "mjoin", mode: str = "append", partitions: int = 1,
                  allowed_lateness: float = 0.0, sign: str | None = None,
                  timestamp_unit: str | None = None, adaptivity: Mapping | None = None,
                  **options) -> FileJob:
    """Check a run over files before Spark does any work: the inputs (as the local runtime
    reads them), the query, the places (no output inside an input or the checkpoint), the
    checkpoint (its fingerprint must be this query's) and the output folders."""
    from adaptcq.query.cql import parse_query
    from adaptcq.runtime.local import require_inputs
    from adaptcq.stream.sources import schema_kinds

    if not isinstance(partitions, int) or isinstance(partitions, bool) or partitions < 1:
        raise AdaptcqError(f"--partitions must be a whole number >= 1, got {partitions!r}")
    if not isinstance(sql, str):
        raise QueryError("the Spark runtime takes the query as CQL text")
    et.check_unit(timestamp_unit)
    late = lateness_ns(allowed_lateness)
    inputs = {name: _resolve_input(name, path, timestamp, timestamp_unit)
              for name, path in sources.items()}
    query = parse_query(sql, {n: schema_kinds(i.schema) for n, i in inputs.items()})
    require_inputs(query, inputs)
    if sign is not None and not any(sign in i.schema.names for i in inputs.values()):
        raise InputError(f"no input has the sign column {sign!r} (--sign); the inputs' "
                         "columns: " + "; ".join(f"{n}: {', '.join(i.schema.names)}"
                                                 for n, i in inputs.items()))
    groups = plan_split(query, partitions).groups
    _, spec = _adaptivity(executor, adaptivity)
    if spec is not None:  # the policies' options, before Spark starts (run checks them again)
        try:
            make_policies(spec)
        except AdaptcqError:
            raise
        except (ValueError, KeyError, TypeError) as e:
            raise OptionError(str(e).strip('"')) from None
    ck_label = str(checkpoint)
    ck = Path(os.path.expanduser(ck_label))
    _check_places(inputs, output, rejected, str(ck))
    fp = {
        "version": FINGERPRINT_VERSION, "sql": normalize_sql(sql), "timestamp": timestamp,
        "timestamp_unit": timestamp_unit, "executor": executor, "mode": mode,
        "groups": groups, "allowed_lateness_ns": late, "sign": sign,
        "order": _canonical(options.get("order")),
        "options": _canonical({k: v for k, v in options.items() if k != "order"}),
        # Results never depend on the policies (MJoin is exact under any order and cache),
        # but a restart continues the policies' plan, so it must be the same request.
        "adaptivity": _canonical(spec),
        "inputs": {n: i.pattern or os.path.realpath(os.path.expanduser(i.given))
                   for n, i in inputs.items()},
        "schemas": {n: [f"{f.name}: {f.type}" for f in i.schema] for n, i in inputs.items()},
        "output": os.path.realpath(output) if output else None,
        "rejected": os.path.realpath(rejected) if rejected else None,
        "checkpoint": os.path.realpath(ck),
    }
    stored, fresh = _checkpoint_state(ck, ck_label, fp)
    fp["run"] = uuid.uuid4().hex if fresh else stored.get("run")
    from adaptcq import __version__
    fp["adaptcq"] = __version__
    out_state = _output_state(output, "--output", fresh, fp["run"], ck_label, True)
    rej_state = _output_state(rejected, "--rejected", fresh, fp["run"], ck_label, False)
    return FileJob(sql, inputs, ck, ck_label, output, rejected, timestamp, executor, mode,
                   partitions, allowed_lateness, sign, timestamp_unit, dict(options),
                   None if adaptivity is None else dict(adaptivity), fp, fresh, out_state,
                   rej_state)


def run_files(spark, sql: str, sources: Mapping[str, str], checkpoint: str, output: str | None,
              rejected: str | None = None, timestamp: str = "ts", executor: str = "mjoin",
              mode: str = "append", partitions: int | None = None,
              allowed_lateness: float = 0.0, sign: str | None = None, finish: bool = True,
              max_files_per_trigger: int | None = None, timestamp_unit: str | None = None,
              adaptivity: Mapping | None = None, **options) -> SparkRun:
    """Run ``sql`` over Parquet/CSV files (a file, a folder or a glob per source) to Parquet.

    Processes every file present (several micro-batches with ``max_files_per_trigger``),
    then, with ``finish``, signals end of input so that buffered rows are processed as the
    local runtime would at the end of its input. Restarting with the same ``checkpoint``
    continues exactly where the previous run stopped (new files only); a checkpoint written
    by another query, or an output folder holding another query's results, is refused
    (``prepare_files``; docs/spark.md). ``adaptivity``: adaptive policies in every
    partition group (``continuous_query``).
    """
    P = partitions if partitions is not None else \
        int(spark.conf.get("spark.sql.shuffle.partitions"))
    job = prepare_files(sql, sources, checkpoint, output, rejected, timestamp, executor, mode,
                        P, allowed_lateness, sign, timestamp_unit, adaptivity=adaptivity,
                        **options)
    return job.run(spark, finish, max_files_per_trigger)


# ---------------------------------------------------------------------------------------------
# Errors: one line, not a JVM stack trace
# ---------------------------------------------------------------------------------------------

_ADAPTCQ_RAISED = re.compile(r"adaptcq\.errors\.(\w+): ([^\n]+)")
_PY_RAISED = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception)): ([^\n]+)$", re.MULTILINE)


def spark_error(exc: BaseException) -> AdaptcqError:
    """A Spark or py4j failure as one-line AdaptcqError: an adaptcq error raised in a Python
    worker keeps its class and message; anything else keeps its first line."""
    text = str(getattr(exc, "desc", None) or exc)
    m = _ADAPTCQ_RAISED.search(text)
    if m:
        cls = getattr(_errors, m.group(1), None)
        if not (isinstance(cls, type) and issubclass(cls, AdaptcqError)):
            cls = AdaptcqError
        return cls(m.group(2).strip())
    if "Traceback (most recent call last)" in text:
        found = _PY_RAISED.findall(text.split("Traceback (most recent call last)", 1)[1])
        if found:
            return AdaptcqError(f"the Spark query failed: {found[-1][0]}: {found[-1][1]}")
    head = text.split("terminated with exception: ", 1)[-1].strip()
    line = next((x.strip() for x in head.splitlines() if x.strip()), type(exc).__name__)
    return AdaptcqError(f"the Spark query failed: {line}")
