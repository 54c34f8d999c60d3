"""The Spark runtime: a continuous query as a partitioned Structured Streaming job.

Pipeline (ARCHITECTURE.md "The Spark pipeline"; docs/spark.md)::

    stream DataFrames ──project──> union ──Split (mapInArrow)──> groupBy(group)
        ──transformWithStateInPandas(one ContinuousQuery per partition group)──> results

* **Split** (``runtime.spark_split``; state-spill.txt §5's "split operators"): every
  update goes to the partition groups the **shares** (HyperCube) give it: one hash
  coordinate per attribute class it has (``pmod(hash(col), p_c)``, computed here, in Spark,
  by ``_project``), replicated over the classes it lacks, so that every result meets in
  exactly one group whatever the join graph (``optimizer.shares`` chooses the shares).
  ``[ROWS n]`` windows run in one group, with a warning. The split turns each row's time into
  int64 nanoseconds with the local runtime's rules (``stream.eventtime``) and sends each
  group, per input batch, its rows as Arrow IPC batches and a punctuation (each stream's
  maximum event time and row count), so that every group learns the same event-time
  frontier each micro-batch: that orders updates across micro-batches, decides lateness and
  drives expiry in groups that receive no more rows.
* **Groups** (``runtime.spark_group``): one ``ContinuousQuery`` per group inside
  ``transformWithStateInPandas``, its state in the RocksDB state store **as changes** (the
  rows each micro-batch brought, removed whole once expired), the live engine kept in the
  worker and caught up or rebuilt from the changes when a worker has none.
* **Adaptivity** (``adaptivity=``, ``executor="acaching"``): every group builds its own
  policies (``make_policies``: an optimizer's initial plan, A-Greedy, A-Caching) and adapts
  on its own data; the orders they set and the pickled profiler and ordering policies
  survive a rebuild, A-Caching restarts, and their reports are in every statistics row.

Output rows have the local runtime's columns (SELECT names, ``_sign`` int8, ``_ts`` of the
type ``eventtime.output_time_type`` gives, converted from int64 nanoseconds with integer
arithmetic). ``side_outputs=True`` instead returns the stateful operator's own rows:
``_aq_kind`` (0 results, 1 rejected input rows, 2 group statistics), ``_aq_data`` (Arrow IPC
tables of results or rejected rows, ``_ts`` as int64 nanoseconds) and ``_aq_info``;
``write_batch`` routes them to Parquet.

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
import re
import time
import uuid
import warnings
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from adaptcq.checks import is_int, is_real
from adaptcq.errors import AdaptcqError, InputError, OptionError, QueryError
from adaptcq.query.logical import LogicalQuery, require_equi_joins
from adaptcq.runtime.output import check_tilde, overlaps, parquet_dictionary
from adaptcq.runtime.spark_group import GroupProcessor, _ipc, read_part
from adaptcq.runtime.spark_split import (
    _NOFILE,
    END,
    MARKER_CLEANUP,
    MARKER_TICK,
    MARKERS,
    ColumnarSplit,
    SplitPlan,
    SplitWarning,
    _Config,
    plan_split,
)
from adaptcq.stream import eventtime as et
from adaptcq.stream.eventtime import lateness_ns

__all__ = [
    "KIND_REJECTED",
    "KIND_RESULT",
    "KIND_STATS",
    "FileJob",
    "SparkRun",
    "SplitPlan",
    "check_run_options",
    "cleanup_checkpoint",
    "continuous_query",
    "make_policies",
    "plan_split",
    "prepare_cleanup",
    "prepare_files",
    "run_files",
    "signal_cleanup",
    "signal_end",
    "signal_tick",
    "write_batch",
]

KIND_RESULT, KIND_REJECTED, KIND_STATS = 0, 1, 2
SIDE_COLUMNS = ("_aq_kind", "_aq_data", "_aq_info")
HISTORY_ROWS = 1_000  # statistics rows a SparkRun keeps (``SparkRun.history``)
RESULTS_PER_BLOB = 100_000  # result rows per Arrow IPC table in the operator's output
CHUNK = 8 << 20  # bytes per state-store chunk of a query-set group's snapshot
TIME_UNIT = 1e-9  # seconds per engine time unit: event times are int64 nanoseconds
FINGERPRINT = "adaptcq.json"  # in a checkpoint folder: what query wrote it
OUTPUT_MARKER = "_adaptcq_output.json"  # in an output folder: which run owns it
FINGERPRINT_VERSION = 1



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
    if spec is not None and executor == "auto":
        executor = "mjoin"  # the policies act between two tuples (runtime.local's rule)
    if spec is not None and executor == "vector":
        raise OptionError("--executor vector orders its pipelines per batch; adaptive "
                          "policies (A-Greedy re-ordering, A-Caching) act between two "
                          "tuples: use executor mjoin (or acaching)")
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
    if isinstance(dt, T.DateType):
        return "date"
    if isinstance(dt, T.TimestampNTZType | T.TimestampType):
        return "timestamp"
    try:
        from pyspark.sql.pandas.types import to_arrow_type
        return column_kind(to_arrow_type(dt))
    except Exception:  # noqa: BLE001 - nested/unsupported Spark types: not joinable here
        return "other"


def _check_column_names(name: str, columns) -> None:
    """Column names Spark cannot tell apart in this runtime's column references are
    refused before the query starts, naming them (the local runtime reads them): a dot
    (Spark reads ``p.q`` as field q of a struct p) and names equal but for case (Spark
    resolves names case-insensitively)."""
    dotted = [c for c in columns if "." in c]
    if dotted:
        raise InputError(f"stream {name}: column {dotted[0]!r} has a dot, which Spark reads "
                         "as a struct field; rename it (the local runtime reads it)")
    seen: dict[str, str] = {}
    for c in columns:
        other = seen.setdefault(c.lower(), c)
        if other != c:
            raise InputError(f"stream {name}: columns {other!r} and {c!r} differ only in "
                             "case, which Spark does not tell apart; rename one (the local "
                             "runtime reads them)")


def _sign_column(F, sign: str | None):
    """The ``_sg`` byte of each row: +1 or -1 when the sign column holds exactly that, 0
    for anything else (a fraction, another number, NULL), which the split refuses naming
    the row (``ColumnarSplit._check_signs``). A plain cast to byte truncated 1.5 to 1, and
    stopped the query at 300 with Spark's cast overflow, naming no row."""
    if not sign:
        return F.lit(1).cast("byte")
    value = F.col(f"`{sign}`").cast("double")
    return F.when(value == 1.0, F.lit(1)).when(value == -1.0, F.lit(-1)) \
        .otherwise(F.lit(0)).cast("byte")


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
    if isinstance(dt, T.DecimalType) and dt.scale == 0:
        # (Spark reads a Parquet uint64 as DECIMAL(20, 0): as a double it kept about 256 ns
        # near today's epoch nanoseconds, so rows 1 ns apart joined in a 0 s window)
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
                     executor: str = "auto", mode: str = "append", partitions: int | None = None,
                     allowed_lateness: float = 0.0, sign: str | None = None,
                     order: str | Mapping[str, str] | None = None,
                     end_of_input: str | os.PathLike | None = None,
                     side_outputs: bool = False, timestamp_unit: str | None = None,
                     adaptivity: Mapping | None = None, rates: Mapping | None = None,
                     shares: Mapping | None = None, spill: Mapping | None = None,
                     group_keys: list[int] | None = None, **options):
    """Run ``sql`` over streaming DataFrames; return the streaming DataFrame of its results.

    ``streams`` maps each source named in FROM to a streaming DataFrame (files, Kafka, rate,
    ``format("adaptcq")``, ...). The result has the local runtime's columns: the SELECT names,
    ``_sign`` (int8: +1, or -1 for retractions in ``mode="retract"``) and ``_ts``, and the
    same rows (docs/spark.md says exactly when they can differ). ``_ts`` follows
    ``stream.eventtime``: timestamp inputs give timestamps (TimestampType inputs give
    TimestampType, TimestampNTZ inputs TimestampNTZ), numeric inputs give ``_ts`` in their
    unit (``timestamp_unit``: ``s`` (default), ``ms``, ``us`` or ``ns``), a long when every
    input is integer-typed and every window a whole number of the unit, else a double.
    Updates are split into ``partitions`` groups (default: ``spark.sql.shuffle.partitions``)
    by shares (HyperCube; ``runtime.spark_split``): each attribute class joining two or more
    streams gets a share, their product is P, chosen to ship the fewest tuples at the
    streams' ``rates`` (per source: rows per unit time, or any weights; default equal);
    ``shares`` (``{"S.b": 4, "R.a": 2}``: a column of each class) fixes them instead.

    Each group's state is stored under a grouping key chosen so that the groups land in
    distinct shuffle partitions of the session's ``spark.sql.shuffle.partitions``
    (``frame._adaptcq["group_keys"]``). Spark restarts a query from its checkpoint with the
    checkpoint's shuffle partitions, so a restart under another setting must pass the first
    run's keys as ``group_keys``. Without them a group that finds another group's state
    stops the query with an error naming both settings, but a group whose new key has no
    stored state cannot tell and starts empty (``run_files`` keeps the keys in its
    checkpoint and needs none of this).

    ``order`` names the column that orders rows of equal timestamp within a source (e.g.
    Kafka's ``offset``); by default a file source's ``(_metadata.file_path, row_index)`` is
    used (CSV: the row's position in its file block), and otherwise the row's position in
    its Spark partition. ``end_of_input`` is a folder watched for end-of-input marker files
    (``signal_end``): after one, every buffered row is processed as at the end of the local
    runtime's input; and for clean-up markers (``signal_cleanup``): spilling groups produce
    what their spills hold back. ``side_outputs=True`` returns the raw operator output
    (results, rejected rows, group statistics, ``_ts`` in int64 nanoseconds; see
    ``write_batch``).

    ``spill`` runs the operator tree in every group under a memory budget (the options of
    the local runtime's ``spill``, ``directory`` required: docs/spill.md, "On Spark"). The
    operator tree's results (``executor="tree"``, spilling or not) have a ``_late`` column,
    as locally.

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
    import pyarrow as pa
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    from adaptcq.runtime.local import check_sign_column, parse_signed, require_inputs

    if not isinstance(sql, str):
        raise QueryError("the Spark runtime takes the query as CQL text")
    check_sign_column(sign, timestamp)
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
        _check_column_names(name, df.columns)
        tdt = df.schema[timestamp].dataType
        time_types[name] = _arrow_time_type(tdt, tz)
        et.check_time_type(name, timestamp, time_types[name], timestamp_unit)
        if _time_kind(tdt) is None:
            raise InputError(f"stream {name}: timestamp column {timestamp!r} has type "
                             f"{tdt.simpleString()}; it must be a timestamp, a date, or a "
                             "number (seconds, or --timestamp-unit)")
    schemas = {name: {f.name: _spark_kind(f.dataType) for f in df.schema.fields}
               for name, df in streams.items()}
    query = parse_signed(sql, schemas, sign)
    require_inputs(query, streams)
    late_ns = lateness_ns(allowed_lateness)
    signed = _signed_streams(query, streams, sign)
    executor, spec = _adaptivity(executor, adaptivity)
    if spill is not None:
        from adaptcq.runtime.spill import spill_executor
        executor = spill_executor(executor)
    arrow = {name: pa.schema([pa.field(f.name, _arrow_time_type(f.dataType, tz))
                              for f in df.schema.fields]) for name, df in streams.items()}
    executor, options, spec = _vector_choice(executor, query, spec, options, arrow)
    # The operator tree's output has ``_late``, spilling or not, as the local runtime's
    # (``output_schema(late=executor == "tree")``): every group's tree emits it.
    late_column = executor == "tree"
    if late_column and spill is None:  # (a spilling group's tree asks for it itself)
        options["late_column"] = True
    if options.get("shed") is not None and executor != "shed":
        raise OptionError(f"the load-shedding options are for the load-shedding join "
                          f"(executor 'shed'), not {executor}")
    if executor != "shed":  # set join conditions: only the load-shedding join has them
        require_equi_joins(query, f"the {executor} executor")
    elif spec is not None:
        raise OptionError("adaptive policies (--optimizer, --reorder, --executor acaching) "
                          "order and cache MJoin pipelines; the load-shedding join adapts "
                          "with its own controller (--shed)")
    names = [o.name for o in query.outputs]
    clash = sorted(set(names) & set(SIDE_COLUMNS))
    if clash:
        raise QueryError(f"output column {clash[0]} is a name the Spark runtime reserves")

    windows = [s.window.in_units(TIME_UNIT) for s in query.streams
               if s.window.kind == "range"]
    ts_type = et.output_time_type({s.alias: time_types[s.source] for s in query.streams},
                                  timestamp_unit, windows)
    if _is_timestamp(ts_type):
        for s in query.streams:
            w = s.window.in_units(TIME_UNIT) if s.window.kind == "range" else 0
            if w % 1000:
                raise QueryError(
                    f"stream {s.alias} has window {s.window}, which is not a whole number of "
                    "microseconds: Spark timestamps have microsecond precision, so its "
                    "expiry times t + w could not be written exactly; use a window in whole "
                    "microseconds, or --engine local", query.sql)

    if shares:
        plan = plan_split(query, partitions, rates, shares)
    else:
        P = partitions or int(spark.conf.get("spark.sql.shuffle.partitions"))
        plan = plan_split(query, P, rates)
    if plan.reason:
        warnings.warn(f"running in one partition group: {plan.reason}", SplitWarning,
                      stacklevel=2)
    P = plan.groups
    key_partitions = int(spark.conf.get("spark.sql.shuffle.partitions"))
    keys = _group_keys(spark, P, key_partitions) if group_keys is None else \
        _given_keys(group_keys, P)
    if spill is not None:
        from adaptcq.runtime.spill import spark_spill_spec
        spill = spark_spill_spec(spill, P)
        if spark.sparkContext.getConf().get("spark.speculation", "false").lower() == "true":
            raise OptionError("spilling is refused with spark.speculation=true: two attempts "
                              "of one micro-batch running at once would write and remove "
                              "each other's spill files (their names do not carry the "
                              "attempt); turn speculation off for this query's session")
    if options.get("shed") is not None:
        from adaptcq.runtime.shed import spark_shed_spec
        options["shed"] = spark_shed_spec(options["shed"], P,
                                          spark.sparkContext.defaultParallelism)

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
    inputs = {a: _arrow_schema(T.StructType([T.StructField(c, t) for c, t in zip(
        query.columns[a], col_types[a], strict=True)])) for a in query.aliases}
    # Validates executor, mode, plan options (orders, tree) and the policies' options
    # before Spark starts work: what every group will build (and before the end-of-input
    # folder is made).
    _check_engine(query, executor, mode, bool(signed), spec, options, inputs)
    if end_of_input is not None:
        ctl = spark.readStream.schema("value string").text(_control_folder(end_of_input))
        # A marker file says "end" (``signal_end``), "cleanup" (``signal_cleanup``) or
        # "tick" (``signal_tick``).
        value = F.trim(F.col("value"))
        kind = F.lit(END)
        for text, code in MARKERS.items():
            kind = F.when(value == text, F.lit(code)).otherwise(kind)
        parts.append(ctl.select(kind.cast("int").alias("_s"),
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

    out_types = _output_types(query, col_types, inputs)
    late = [T.StructField("_late", T.BooleanType())] if late_column else []
    result_struct = T.StructType(
        [T.StructField(n, t) for n, t in zip(names, out_types, strict=True)]
        + [T.StructField("_sign", T.ByteType()), T.StructField("_ts", T.LongType())] + late)
    out_schema = T.StructType([T.StructField("_aq_kind", T.ByteType()),
                               T.StructField("_aq_data", T.BinaryType()),
                               T.StructField("_aq_info", T.StringType())])

    cfg = _Config(
        qid=uuid.uuid4().hex, sql=sql, schemas=schemas, executor=executor, mode=mode,
        options=dict(options), adaptivity=spec, groups=P, keys=keys, lateness=float(allowed_lateness),
        lateness_ns=late_ns, signed=bool(signed), n_streams=len(query.streams),
        stream_columns=[[f"c{i}_{k}" for k in range(len(query.columns[a]))]
                        for i, a in enumerate(query.aliases)],
        reported=[_first_alias_of_source(query, i) for i in range(len(query.streams))],
        sources=[s.source for s in query.streams], names=names, timestamp=timestamp,
        unit=timestamp_unit, ts_kinds=ts_kinds, sign=sign, plan=plan,
        aliases=list(query.aliases), results=_arrow_schema(result_struct), inputs=inputs,
        spill=spill, key_partitions=key_partitions)
    packets = union.mapInArrow(ColumnarSplit(cfg), "_g int, _s int, _p binary")
    raw = packets.groupBy("_g").transformWithStateInPandas(
        statefulProcessor=GroupProcessor(cfg), outputStructType=out_schema,
        outputMode="Append", timeMode="None")
    info = {"query": query, "plan": plan, "config": cfg, "names": names,
            "ts_type": ts_type, "unit": timestamp_unit, "adaptivity": spec, "spill": spill,
            "group_keys": list(keys), "shuffle_partitions": key_partitions}
    raw._adaptcq = info
    if side_outputs:
        return raw
    res = (raw.where(F.col("_aq_kind") == KIND_RESULT).select("_aq_data")
           .mapInArrow(_unpack, result_struct)
           .select(*names, "_sign", _ts_out(ts_type, timestamp_unit).alias("_ts"),
                   *(["_late"] if late_column else [])))
    res._adaptcq = info
    return res


def _vector_choice(executor: str, query: LogicalQuery, spec: dict | None,
                   options: Mapping, schemas: Mapping | None = None
                   ) -> tuple[str, dict, dict | None]:
    """The groups' executor for ``executor`` "auto" or "vector" (the local runtime's rule,
    ``runtime.local.choose_executor``, over the streams' column types as Arrow types,
    ``schemas``; policies are per tuple), the options it takes and the adaptivity spec.
    When auto falls back to a per-tuple executor, ``ordering`` (the vectorized executor's
    per-batch algorithm) becomes its optimizer policy in every group, as the local runtime
    makes it MJoin's (``LocalRun``): never dropped."""
    from adaptcq.runtime.local import choose_executor
    options = dict(options)
    if executor not in ("auto", "vector"):
        if options.get("ordering") not in (None, "off"):
            raise OptionError("ordering (per-batch pipeline orders) is for the vectorized "
                              f"executor, not {executor}")
        options.pop("ordering", None)
        return executor, options, spec
    given = {**options, "policies": spec is not None}
    chosen, _ = choose_executor(executor, query, given, schemas)
    if chosen != "vector":
        ordering = options.pop("ordering", None)
        if ordering not in (None, "off"):
            # (spec is None here: a spec made auto mjoin before, which refuses ordering;
            # the load-shedding join refuses the policy in continuous_query)
            spec = _adaptivity("mjoin", {"optimizer": ordering})[1]
    return chosen, options, spec


def _check_engine(query: LogicalQuery, executor: str, mode: str, signed: bool,
                  spec: dict | None, options: dict, inputs: dict | None = None) -> None:
    """Build one group's engine and policies on the driver: a bad option fails here, in
    one line, not in a Spark worker."""
    from adaptcq.engine.continuous import ContinuousQuery
    if executor == "vector":
        from adaptcq.runtime.spark_group import vector_engine
        try:
            vector_engine(query, mode, inputs, signed, options)
        except (ValueError, KeyError, TypeError) as e:
            raise OptionError(str(e).strip('"')) from None
        return
    from adaptcq.runtime.shed import engine_options
    try:
        cq = ContinuousQuery(query, executor, mode, time_unit=TIME_UNIT,
                             explicit_deletions=signed, **engine_options(options))
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
    hashes = []
    if plan.shares:
        # Shares: one coordinate per class the stream is hashed on (-1: a NULL key), with
        # the class index as a seed so that two classes' coordinates are independent (the
        # first class unseeded: a key common to all streams splits as it always did).
        g = F.lit(0)
        for c, column in plan.keys.get(alias, ()):
            value = _hash_cast(query, alias, column, df)
            h = F.hash(value) if c == 0 else F.hash(F.lit(c), value)
            hashes.append(F.when(F.col(column).isNull(), F.lit(-1)).otherwise(
                F.pmod(h, F.lit(plan.shares[c]))).cast("int").alias(f"_h{c}"))
    elif key_col is None:
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
            _sign_column(F, sign).alias("_sg"),
            o1.alias("_o1"), o2.cast("long").alias("_o2"), oc.alias("_oc"), *hashes]
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
    """The split column, cast so that values the engine joins hash equally in every stream:
    Spark's ``hash`` of int 5 and of long 5 differ, while the engine joins them (5 == 5).

    Times become epoch microseconds of the engine's value, never through the session time
    zone: the engine compares naive UTC datetimes (``_project``: a TimestampType column
    by its instant, a TimestampNTZ column by its wall-clock value read as UTC), so
    TimestampType 12:00Z and TimestampNTZ 12:00 are equal and must hash equally whatever
    ``spark.sql.session.timeZone`` is (``cast(ntz as timestamp)`` would read the NTZ value
    in that zone), and a restart under another time zone must route rows as before. A
    date hashes as its midnight UTC."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T
    dt = df.schema[column].dataType
    name = column.replace("`", "``")
    if isinstance(dt, T.NumericType):
        return F.col(column).cast("double")
    if isinstance(dt, T.TimestampType):
        return F.unix_micros(F.col(column))
    if isinstance(dt, T.TimestampNTZType):
        return F.expr(f"timestampdiff(MICROSECOND, {_EPOCH_NTZ}, `{name}`)")
    if isinstance(dt, T.DateType):
        return F.unix_date(F.col(column)).cast("long") * F.lit(86_400_000_000)
    return F.col(column).cast("string")


def _group_keys(spark, P: int, n: int | None = None) -> list[int]:
    """Grouping-key values that land in distinct shuffle partitions.

    Spark hash-partitions the grouping key (``pmod(hash(key), N)``); with keys 0..P-1 two
    groups often share a partition (and a core) while another partition idles. We pick, for
    group g, the smallest integer whose partition is g mod N: the groups spread evenly.
    Spark's ``hash`` of an int is computed here (``spark_int_hash``), not by a Spark job: a
    job costs the driver a second or more before the query starts.

    N is ``n``, by default the session's ``spark.sql.shuffle.partitions``. The keys name
    the groups' state, so a restart must use the first run's keys whatever the session says
    (``group_keys`` of ``continuous_query``; a run over files keeps them in its checkpoint):
    Spark itself runs a restarted query with the checkpoint's shuffle partitions.
    """
    if n is None:
        n = int(spark.conf.get("spark.sql.shuffle.partitions"))
    if P <= 1:
        return [0]
    # Group g takes the (g // n)-th smallest key of partition g mod n (the partitions'
    # keys are disjoint, so an earlier group of another partition never took it), among
    # the keys 0 .. 64·max(n, P) - 1; in numpy, a block of keys at a time until every
    # partition has the keys its groups need (a loop over the keys in Python took 6 s
    # at 100,000 groups).
    need = np.bincount(np.arange(P) % n, minlength=n)  # groups per partition
    limit, block = 64 * max(n, P), max(n, P)
    keys, parts, have = [], [], np.zeros(n, np.int64)
    for lo in range(0, limit, block):
        k = np.arange(lo, min(limit, lo + block), dtype=np.int64)
        part = _spark_int_hashes(k) % n
        keys.append(k)
        parts.append(part)
        have += np.bincount(part, minlength=n)
        if (have >= need).all():
            break
    k, part = np.concatenate(keys), np.concatenate(parts)
    short = np.flatnonzero(have < need)
    if len(short):
        raise AdaptcqError(f"{P:,} partition groups over {n:,} shuffle partitions: "
                           f"partition {int(short[0])} has {int(have[short[0]])} of the "
                           f"{int(need[short[0]])} grouping keys it needs among the first "
                           f"{limit:,} integers")
    order = np.argsort(part, kind="stable")  # by partition, each one's keys ascending
    first = np.concatenate([[0], np.cumsum(have)[:-1]])
    g = np.arange(P)
    return k[order][first[g % n] + g // n].tolist()


def _spark_int_hashes(values: np.ndarray) -> np.ndarray:
    """``spark_int_hash`` of each of ``values`` (int64 within 32 bits), vectorized: the
    same Murmur3_x86_32 steps in uint32 arithmetic (numpy wraps at 2^32 as ``& m`` does)."""
    def rotl(x, r):
        return (x << np.uint32(r)) | (x >> np.uint32(32 - r))
    with np.errstate(over="ignore"):
        k1 = values.astype(np.uint32) * np.uint32(0xCC9E2D51)
        k1 = rotl(k1, 15) * np.uint32(0x1B873593)
        h1 = rotl(np.uint32(42) ^ k1, 13)
        h1 = h1 * np.uint32(5) + np.uint32(0xE6546B64)
        h1 ^= np.uint32(4)  # the length in bytes
        h1 ^= h1 >> np.uint32(16)
        h1 = h1 * np.uint32(0x85EBCA6B)
        h1 ^= h1 >> np.uint32(13)
        h1 = h1 * np.uint32(0xC2B2AE35)
        h1 ^= h1 >> np.uint32(16)
    return h1.view(np.int32).astype(np.int64)


def _given_keys(keys, P: int) -> list[int]:
    """``group_keys`` of ``continuous_query``, checked: P distinct 32-bit ints."""
    ok = (isinstance(keys, list | tuple) and len(keys) == P
          and all(isinstance(k, int | np.integer) and not isinstance(k, bool)
                  and -(1 << 31) <= k < (1 << 31) for k in keys)
          and len({int(k) for k in keys}) == P)
    if not ok:
        raise OptionError(f"group_keys must be {P} distinct whole numbers (one grouping key "
                          "per partition group, as the first run of the checkpoint chose "
                          f"them), got {keys!r}")
    return [int(k) for k in keys]


def checkpoint_shuffle_partitions(query_checkpoint: str | os.PathLike) -> int | None:
    """The ``spark.sql.shuffle.partitions`` a streaming checkpoint runs with (Spark records
    the first run's value in every offset log entry and restarts with it, whatever the
    session says); None when it has no offset log."""
    logs = sorted((p for p in Path(query_checkpoint, "offsets").glob("[0-9]*")
                   if p.name.isdigit()), key=lambda p: int(p.name))
    for f in reversed(logs):
        with contextlib.suppress(OSError, ValueError, IndexError, KeyError, TypeError):
            meta = json.loads(f.read_text().splitlines()[1])
            return int(meta["conf"]["spark.sql.shuffle.partitions"])
    return None


def restart_group_keys(stored: Mapping, query_checkpoint: str | os.PathLike,
                       groups: int) -> list[int] | None:
    """The grouping keys a restarted query must use: those its first run kept (``stored``,
    the checkpoint's fingerprint); for a checkpoint that predates them, those chosen for
    the shuffle partitions Spark recorded in it (and restarts with), as that first run
    chose them; None when neither is known."""
    keys = stored.get("group_keys")
    if keys is not None:
        return list(keys)
    n = checkpoint_shuffle_partitions(query_checkpoint)
    return None if n is None else _group_keys(None, groups, n)


def spark_int_hash(value: int, seed: int = 42) -> int:
    """Spark's ``hash(CAST(value AS INT))``: Murmur3_x86_32 ``hashInt`` with Spark's seed
    42, as a signed 32-bit int (``tests/test_spark.py`` checks it against Spark)."""
    m = 0xFFFFFFFF

    def rotl(x: int, r: int) -> int:
        return ((x << r) | (x >> (32 - r))) & m
    k1 = (value & m) * 0xCC9E2D51 & m
    k1 = rotl(k1, 15) * 0x1B873593 & m
    h1 = rotl((seed & m) ^ k1, 13)
    h1 = (h1 * 5 + 0xE6546B64) & m
    h1 ^= 4  # the length in bytes
    h1 ^= h1 >> 16
    h1 = h1 * 0x85EBCA6B & m
    h1 ^= h1 >> 13
    h1 = h1 * 0xC2B2AE35 & m
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 & 0x80000000 else h1


def _output_types(query: LogicalQuery, col_types: dict[str, list], inputs: dict):
    """Spark types of the SELECT columns: a column keeps its Spark type; an expression gets
    the local runtime's Arrow type (``query.logical.output_types``: integer arithmetic in
    int64, a decimal's refused, as locally), as Spark's. Spark's own analysis typed
    ``R.a + S.c`` over int32 columns int32, which values past 2^31 did not fit (the group's
    Arrow conversion failed), and let decimal arithmetic through."""
    import pyarrow as pa
    import sqlglot.expressions as exp
    from pyspark.sql.pandas.types import from_arrow_type

    from adaptcq.query.logical import output_types
    by_source: dict = {}
    for st in query.streams:  # (several aliases of one source: their columns together)
        by_source.setdefault(st.source, {}).update(
            {f.name: f for f in inputs[st.alias]})
    types = output_types(query, {src: pa.schema(list(fields.values()))
                                 for src, fields in by_source.items()})
    out = []
    for o, t in zip(query.outputs, types, strict=True):
        e = o.expr.unalias() if isinstance(o.expr, exp.Alias) else o.expr
        if isinstance(e, exp.Column):
            a, c = e.table, e.name
            out.append(col_types[a][query.columns[a].index(c)])
        else:
            out.append(from_arrow_type(t))
    return out


# ---------------------------------------------------------------------------------------------
# The stateful operator's output (``spark_group.GroupProcessor``)
# ---------------------------------------------------------------------------------------------


def _frames(cfg: _Config, gkey: int, eng, out: list, rejected: list, cpu: float,
            extra: dict):
    """The operator's output frames: results and rejected rows as Arrow IPC tables (a few
    large rows, not one per result: pyspark would otherwise convert every result row on
    its way through the JVM), and one statistics row (the group's counters, state and
    ``extra``: rows in, rows shipped, store figures)."""
    import pandas as pd
    import pyarrow as pa
    kinds, blobs = [], []
    schema = cfg.results
    # The vectorized executor's output, and a spilling group's late results of a batch
    # clean-up (``PartitionGroup.take_late_tables``): Arrow already.
    tables = eng.take_late_tables()
    if isinstance(out, pa.Table):
        tables, out = [out, *tables], ()
    for t in tables:
        table = pa.Table.from_arrays([c if c.type == f.type else c.cast(f.type)
                                      for c, f in zip(t.columns, schema, strict=True)],
                                     schema=schema)
        for a in range(0, t.num_rows, RESULTS_PER_BLOB):
            kinds.append(KIND_RESULT)
            blobs.append(_ipc(table.slice(a, RESULTS_PER_BLOB)))
    for a in range(0, len(out), RESULTS_PER_BLOB):
        cols = list(zip(*out[a:a + RESULTS_PER_BLOB], strict=True))
        table = pa.Table.from_arrays([pa.array(c, f.type) for c, f in
                                      zip(cols, schema, strict=True)], schema=schema)
        kinds.append(KIND_RESULT)
        blobs.append(_ipc(table))
    if rejected:
        src, row, file, ts, why = zip(*rejected, strict=True)
        kinds.append(KIND_REJECTED)
        blobs.append(_ipc(pa.table({
            "stream": pa.array(src, pa.string()), "row": pa.array(row, pa.int64()),
            "file": pa.array(file, pa.string()), "ts": pa.array(ts, pa.int64()),
            "reason": pa.array(why, pa.string())})))
    if blobs:
        yield pd.DataFrame({"_aq_kind": np.asarray(kinds, np.int8), "_aq_data": blobs,
                            "_aq_info": [None] * len(blobs)})
    st = eng.cq.stats
    info = {"group": gkey, "arrivals": st.arrivals, "updates": st.updates,
            "insertions": st.insertions, "deletions": st.deletions, "filtered": st.filtered,
            "results": st.results, "late": eng.late,
            "pending": sum(0 if t is None else t.num_rows for t in eng.pending),
            "state_tuples": eng.cq.executor.state_tuples(),
            "state_bytes": eng.cq.executor.state_bytes(), "peak_state_tuples": eng.peak_tuples,
            "peak_state_bytes": eng.peak_bytes, "engine_cpu_seconds": cpu, **extra,
            "pid": os.getpid(),
            "now": eng.cq.now if math.isfinite(eng.cq.now) else None,
            "plan": eng.cq.executor.describe()}
    if cfg.executor == "shed":
        info["shedding"] = eng.cq.executor.report()
    if cfg.spill is not None:
        from adaptcq.runtime.spill import spill_figures
        ex = eng.cq.executor
        info["spill"] = {**spill_figures(ex), "strategy": cfg.spill["strategy"],
                         "memory": cfg.spill["memory"], "budget": cfg.spill["budget"],
                         "first_pending_ns": ex.counters.first_pending}
    if cfg.adaptivity is not None:
        info["policies"] = eng.report()
        info["policy_restores"] = eng.restores
        info["policy_continued"] = eng.continued
        info["restarted_policies"] = eng.earlier
    yield pd.DataFrame({"_aq_kind": np.asarray([KIND_STATS], np.int8), "_aq_data": [None],
                        "_aq_info": [json.dumps(info)]})


def _unpack(batches):
    """``mapInArrow``: the results' Arrow IPC tables as rows (``continuous_query``)."""
    for batch in batches:
        for blob in batch.column(0).to_pylist():
            yield from read_part(blob).to_batches()


def _arrow_schema(struct):
    """The Arrow schema of the results (timestamps without a zone: the engine's are naive
    UTC, as the local runtime's)."""
    import pyarrow as pa
    from pyspark.sql import types as T
    from pyspark.sql.pandas.types import to_arrow_type
    fields = []
    for f in struct.fields:
        t = to_arrow_type(f.dataType, timezone="UTC")
        if isinstance(f.dataType, T.TimestampType):
            t = pa.timestamp("us", tz="UTC")
        fields.append(pa.field(f.name, t))
    return pa.schema(fields)


# ---------------------------------------------------------------------------------------------
# Running to Parquet: end of input, side outputs, statistics
# ---------------------------------------------------------------------------------------------


def signal_end(folder: str | os.PathLike) -> Path:
    """Drop an end-of-input marker into the ``end_of_input`` folder of a running query."""
    return _marker(folder, "end")


def signal_cleanup(folder: str | os.PathLike) -> Path:
    """Drop a clean-up marker into the ``end_of_input`` folder of a running query: at its
    micro-batch every spilling partition group produces the results its spills hold back
    (state-spill.txt §4; docs/spill.md, "Clean-up on demand"); a no-op for groups with
    nothing on disk."""
    return _marker(folder, MARKER_CLEANUP)


def signal_tick(folder: str | os.PathLike) -> Path:
    """Drop a tick marker into the ``end_of_input`` folder of a running query: a micro-batch
    in which every partition group runs without rows. A spilling group then removes the
    spill files the committed micro-batch's clean-ups merged (they stay until a later
    micro-batch commits, so that a retried one still finds them), without a rebuild."""
    return _marker(folder, MARKER_TICK)


def _control_folder(folder: str | os.PathLike) -> str:
    """``continuous_query``'s ``end_of_input`` as Spark's file source is to read it: made if
    absent (the source refuses a path that does not exist, and ``signal_end`` makes it only
    once the query runs), absolute (the JVM resolves a relative path against its own
    working folder) and escaped (the source globs it: a '[', '{' or '*' in it is a
    pattern). A URI (``hdfs://...``) is Spark's to resolve and is passed as given."""
    if not isinstance(folder, str | os.PathLike):
        raise OptionError(f"end_of_input must be a folder path, got {folder!r}")
    text = os.fsdecode(folder)
    if re.match(r"[A-Za-z][A-Za-z0-9+.-]*://", text):
        return text
    path = os.path.realpath(text)
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise OptionError(f"end_of_input {text!r} is a file, not a folder: give a folder "
                          "for the end-of-input markers (signal_end)") from None
    except OSError as e:
        raise OptionError(f"end_of_input {text!r}: cannot make the folder "
                          f"({e.strerror or e})") from None
    return _hadoop_literal(path)


def _marker(folder: str | os.PathLike, kind: str) -> Path:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    p = folder / f"{kind}-{time.time_ns()}.txt"
    tmp = folder / f".{p.name}.tmp"
    tmp.write_text(f"{kind}\n")
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
    # The latest HISTORY_ROWS statistics rows (one per group and micro-batch), in batch
    # order: a query running for days keeps a bounded tail; ``group_batches`` and the
    # totals below count every row.
    history: deque = field(default_factory=lambda: deque(maxlen=HISTORY_ROWS))
    group_batches: int = 0  # statistics rows seen (a group's micro-batch each)
    engine_cpu_seconds: float = 0.0  # the groups' engine CPU, summed
    live_copies: int = 0  # group micro-batches that found their live engine in the worker
    caught_up: int = 0  # ... a stale copy, caught up from the stored changes
    progress: list = field(default_factory=list)  # Spark's progress reports
    run_id: str = ""  # the checkpoint's run (its output folders carry it)
    checkpoint: str | None = None
    restarted: bool = False  # continued from a checkpoint that had processed input
    ts_type: object = None  # pyarrow type of _ts (None: leave int64 nanoseconds)
    unit: str | None = None  # --timestamp-unit
    adaptivity: dict | None = None  # the policies every group ran (continuous_query)
    split: dict = field(default_factory=dict)  # SplitPlan.describe(): groups, shares, ...
    shipped: int = 0  # rows received by the groups, replicas counted
    executor: str = ""  # what every group ran (auto resolved: vector or mjoin)
    # Each group's updates when this run first stepped it: its counters are the
    # checkpoint's totals, over every run.
    updates_before: dict = field(default_factory=dict)

    @property
    def shares(self) -> dict:
        """Attribute class -> its share (empty when the query runs in one group)."""
        return dict(self.split.get("shares", {}))

    @property
    def replication(self) -> float:
        """Rows shipped per input row (1: no replication)."""
        return self.shipped / self.rows_in if self.rows_in else 1.0

    @property
    def peak_state_tuples(self) -> int:
        return sum(g["peak_state_tuples"] for g in self.groups.values())

    @property
    def peak_state_bytes(self) -> int:
        return sum(g["peak_state_bytes"] for g in self.groups.values())

    @property
    def updates(self) -> int:
        """Updates processed by this run (``updates_total``: by every run of the
        checkpoint)."""
        return sum(g["updates"] - self.updates_before.get(k, 0)
                   for k, g in self.groups.items())

    @property
    def updates_total(self) -> int:
        return sum(g["updates"] for g in self.groups.values())

    @property
    def spill(self) -> dict | None:
        """The spilling figures over all groups (None without spilling): counts, bytes,
        clean-up time and late results summed; ``complete_until`` the oldest pending
        spill's time in any group (int64 ns; None once every group has cleaned up)."""
        reports = [g["spill"] for g in self.groups.values() if g.get("spill")]
        if not reports:
            return None
        out = {k: sum(r.get(k, 0) for r in reports) for k in (  # (older versions lack some)
            "spills", "partition_groups_spilled", "spilled_bytes_model", "spill_file_bytes",
            "cleanups", "cleanup_cpu_seconds", "end_cleanup_cpu_seconds", "late_results",
            "cleanup_handovers", "cleanup_writebacks", "cleanup_writeback_bytes_model",
            "memory_model_now")}
        pending = [r["first_pending_ns"] for r in reports if r["first_pending_ns"] is not None]
        out["complete_until"] = min(pending) if pending else None
        out.update({k: reports[0][k] for k in ("strategy", "memory", "budget")})
        return out

    @property
    def shedding(self) -> dict | None:
        """The load-shedding figures over all groups (None without the load-shedding
        join): results, drops and the estimated loss summed (the groups' estimates are of
        disjoint parts of the output), r per group."""
        reports = {k: g["shedding"] for k, g in sorted(self.groups.items())
                   if "shedding" in g}
        if not reports:
            return None
        from adaptcq.engine.shed_join import loss_summary
        drops: dict[str, int] = {}
        for rep in reports.values():
            for alias, n in rep["buffer_drops"].items():
                drops[alias] = drops.get(alias, 0) + n
        results = sum(r["shed_results"] for r in reports.values())
        out = {"shed": next(iter(reports.values()))["shed"], "shed_results": results,
               "buffer_drops": drops,
               "fully_processed": sum(r["fully_processed"] for r in reports.values()),
               "max_delay_seconds": max(r["max_delay_seconds"] for r in reports.values()),
               "fraction_r": {k: r.get("fraction_r_final", 1.0)
                              for k, r in reports.items()},
               "fraction_r_min": min(r.get("fraction_r_min", 1.0) for r in reports.values()),
               "rate_steps": sum(r.get("rate_steps", 0) for r in reports.values())}
        out.update(loss_summary(results, sum(r["estimated_results"] for r in reports.values()),
                                sum(r["estimated_results_var"] for r in reports.values()),
                                all(r.get("estimated_lost_measured", True)
                                    for r in reports.values())))
        return out

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
    pq.write_table(table, tmp, use_dictionary=parquet_dictionary(table.schema))
    os.replace(tmp, folder / name)


def write_batch(raw_batch, batch_id: int, output: str | None, rejected: str | None,
                run: SparkRun, names: list[str], ts_type=None, unit: str | None = None) -> None:
    """Route one micro-batch of the operator's output (``side_outputs=True``: rows of
    ``_aq_kind``, ``_aq_data`` Arrow IPC tables, ``_aq_info`` statistics JSON): results and
    rejected rows to Parquet files named by batch id (a re-run batch overwrites its own file: exactly once), statistics into
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
    data = tab.column("_aq_data").to_pylist()
    info = tab.column("_aq_info").to_pylist()
    parts = {KIND_RESULT: [], KIND_REJECTED: []}
    stats = []
    for k, d, s in zip(kind.tolist(), data, info, strict=True):
        if k == KIND_STATS:
            stats.append(s)
        else:
            parts[k].append(read_part(d))
    res = pa.concat_tables(parts[KIND_RESULT]) if parts[KIND_RESULT] else None
    if res is not None and ts_type is not None:
        ns = res.column("_ts").to_numpy()
        res = res.set_column(len(names) + 1, "_ts", et.from_nanoseconds(ns, ts_type, unit))
    rj = pa.concat_tables(parts[KIND_REJECTED]) if parts[KIND_REJECTED] else None
    rej = pa.table({
        "stream": pa.array([], pa.string()) if rj is None else rj.column("stream"),
        "row": pa.array([], pa.int64()) if rj is None else rj.column("row"),
        "file": pa.array([], pa.string()) if rj is None else rj.column("file"),
        "ts": pa.array([] if rj is None else rj.column("ts").to_numpy() / 1e9, pa.float64()),
        "reason": pa.array([], pa.string()) if rj is None else rj.column("reason")})
    if output and res is not None and res.num_rows:
        _write_parquet(res, Path(output), f"part-{batch_id:08d}.parquet")
    if rejected and rej.num_rows:
        if run.run_id and not (Path(rejected) / OUTPUT_MARKER).exists():
            _mark(Path(rejected), run)
        _write_parquet(rej, Path(rejected), f"part-{batch_id:08d}.parquet")
    run.batches += 1
    run.results += 0 if res is None else res.num_rows
    run.rejected += rej.num_rows
    for s in stats:
        info = json.loads(s)
        run.rows_in += info["rows_in"]
        run.shipped += info.get("shipped", info["rows_in"])
        run.groups[info["group"]] = info
        run.updates_before.setdefault(info["group"], info.get("updates_before", 0))
        run.history.append(info)
        run.group_batches += 1
        run.engine_cpu_seconds += info.get("engine_cpu_seconds", 0.0)
        run.live_copies += bool(info.get("cache_hit"))
        run.caught_up += bool(info.get("caught_up"))
    if res is not None:
        run._schema = res.schema


# ---------------------------------------------------------------------------------------------
# Files in: a file, a folder or a glob per stream, as the local runtime reads them
# ---------------------------------------------------------------------------------------------

def _glob_filter(kind: str) -> str:
    """Spark's ``pathGlobFilter`` for the files of a folder (or of a glob's matching folders)
    of ``kind``: the local runtime's suffixes (``sources.PARQUET_SUFFIXES``, ``CSV_SUFFIXES``),
    in any case, as it compares them. A filter of its own made Spark read ``x.bz2`` and skip
    ``x.Csv``, which the local runtime does the other way round."""
    from adaptcq.stream.sources import CSV_SUFFIXES, PARQUET_SUFFIXES
    suffixes = PARQUET_SUFFIXES if kind == "parquet" else CSV_SUFFIXES
    return "*.{" + ",".join("".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else c
                                    for c in s[1:]) for s in suffixes) + "}"


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


def _hadoop_literal(text: str) -> str:
    """``text`` escaped for Hadoop's glob (Spark's file source globs every path it is
    given): each of its characters stands for itself."""
    return "".join("\\" + c if c in "{}[]*?\\" else c for c in text)


def _one_file_glob(path: Path) -> str:
    """A glob matching exactly ``path``. Spark's file source takes folders (it sets the
    path as ``basePath``, which must be a folder) and globs; a glob of one file reads it."""
    esc = _hadoop_literal
    name = path.name
    j = max(k for k, c in enumerate(name) if c.isalnum())  # a .parquet/.csv name has one
    return f"{esc(str(path.parent))}/{esc(name[:j])}[{name[j]}]{esc(name[j + 1:])}"


def _spark_glob(text: str) -> str:
    """The absolute Hadoop glob of glob input ``text``, matching what Python's glob matches
    for it (``sources.check_glob`` has refused the syntax the two read differently): the
    current folder's components (under a relative glob) and the glob's components without
    ``*``, ``?`` or ``[`` are literal to Python's glob, so escaped here."""
    import glob as globlib
    parts = os.path.normpath(text).split("/")
    if os.path.isabs(text):
        base: list[str] = []
    else:
        up = next((k for k, p in enumerate(parts) if p != ".."), len(parts))
        cwd = os.getcwd().split("/")
        base = [_hadoop_literal(p) for p in cwd[:max(1, len(cwd) - up)]]
        parts = parts[up:]
    out = base + [p if globlib.has_magic(p) else _hadoop_literal(p) for p in parts]
    return "/".join(out) if out[0] == "" else "/" + "/".join(out)


def _resolve_input(name: str, given, timestamp: str, unit: str | None) -> _Input:
    """One stream's input: the local runtime's checks (files exist, Parquet or CSV and not
    both, the same columns in every file, the timestamp column and its type) and what Spark
    loads for it."""
    from adaptcq.stream.sources import hidden_name, open_source
    text = str(given)  # as written, as the local runtime takes it (no '~' expansion)
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
    # A glob's matching folders are read with their subfolders, as a folder is (without
    # recursiveFileLookup Spark read only a matching folder's own files).
    listing = {"recursiveFileLookup": "true", "pathGlobFilter": _glob_filter(kind)}
    if any(c in text for c in "*?["):
        pattern = os.path.abspath(text)
        path, options = _spark_glob(text), listing
    elif Path(text).is_dir():
        path, options = _hadoop_literal(os.path.realpath(text)), listing
    else:
        real = Path(os.path.realpath(text))
        if hidden_name(real.name):  # (Spark applies its rule to a path it is given too)
            raise InputError(
                f"stream {name}: {text!r} names a file whose name starts with "
                f"{real.name[0]!r}, which Spark's file source skips (as hidden), so it would "
                "read no row of it; rename the file, or use --engine local")
        path, options = _one_file_glob(real), {}
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


def _plain_parquet_schema(schema):
    """The Spark schema of Parquet files whose columns (as pyarrow read them) are all of
    types that Spark reads as the same type (signed integers, floats, booleans, strings,
    binary), every field nullable, as Spark's file source makes them; None for any other
    type (timestamps, decimals, unsigned integers, nested types: Spark's reading rules
    differ there). Spares the driver a Spark read of the files' footers (about 0.7 s per
    stream before the query starts)."""
    import pyarrow as pa
    from pyspark.sql import types as T
    plain = {pa.int8(): T.ByteType(), pa.int16(): T.ShortType(),
             pa.int32(): T.IntegerType(), pa.int64(): T.LongType(),
             pa.float32(): T.FloatType(), pa.float64(): T.DoubleType(),
             pa.bool_(): T.BooleanType(), pa.string(): T.StringType(),
             pa.large_string(): T.StringType(), pa.binary(): T.BinaryType(),
             pa.large_binary(): T.BinaryType()}
    fields = []
    for f in schema:
        t = plain.get(f.type)
        if t is None:
            return None
        fields.append(T.StructField(f.name, t, True))
    return T.StructType(fields)


MAX_FILE_AGE = "3650000d"  # ten thousand years: older than any file's modification time


def _read_stream(spark, inp: _Input, max_files: int | None):
    """A file stream with the files' own schema (Parquet; CSV with a header, its column
    types inferred as the local runtime infers them, by pyarrow)."""
    # Spark's file source ignores files older than ``maxFileAge`` (7 days by default)
    # before its newest file: an input file added with an old modification time (tar,
    # cp -p, touch -d) would be skipped unread. Never skip one; Spark then remembers every
    # file's name it has read (docs/spark.md, "Files, checkpoints and outputs").
    reader = spark.readStream.options(**inp.options).option("maxFileAge", MAX_FILE_AGE)
    if max_files:
        reader = reader.option("maxFilesPerTrigger", int(max_files))
    from pyspark.sql.pandas.types import from_arrow_schema
    if inp.kind == "parquet":
        schema = _plain_parquet_schema(inp.schema)
        if schema is None:  # Spark's own reading of anything beyond plain types
            schema = spark.read.options(**inp.options).parquet(inp.path).schema
        return reader.schema(schema).parquet(inp.path)
    # FAILFAST: a row the local runtime stops at (too few or too many fields, a value its
    # column's type cannot hold) stops Spark too, rather than becoming NULLs (PERMISSIVE,
    # Spark's default); ``_read_failure`` names its file and row. Spark counts a row's
    # fields only without CSV column pruning (else it pads a short row with NULLs when the
    # query leaves out its last columns); a streaming query keeps the session's conf as it
    # was when it starts (docs/spark.md, "CSV tokens"). multiLine: a quoted field may hold
    # line breaks, as the local runtime reads it (sources.csv_parse_options); Spark then
    # reads each file whole, in one task, so a row's block start is 0 and its index in the
    # block its row number in the file (``_project``).
    spark.conf.set("spark.sql.csv.parser.columnPruning.enabled", "false")
    return (reader.schema(from_arrow_schema(inp.schema)).option("header", True)
            .option("mode", "FAILFAST").option("multiLine", True).csv(inp.path))


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
    "groups": "partition groups (--partitions)", "shares_given": "--shares",
    "allowed_lateness_ns": "--allowed-lateness (ns)", "sign": "--sign",
    "order": "order column", "options": "engine options (--order, --tree, --nested-loop)",
    "adaptivity": "adaptive policies (--optimizer, --reorder, --executor acaching and its "
                  "cache options)",
    "inputs": "inputs", "schemas": "input columns", "output": "--output",
    "rejected": "--rejected", "columns": "output columns",
}


def _fingerprint_diff(old: dict, new: dict) -> list[str]:
    out = []
    for key, label in _LABELS.items():
        a, b = old.get(key), new.get(key)
        if a == b or (key == "columns" and a is None):  # (not recorded before 2026-11-27)
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


def check_run_options(max_files_per_trigger: int | None = None,
                      trigger: float | None = None) -> None:
    """Refuse a bad ``max_files_per_trigger`` or ``trigger`` of ``FileJob.run``; callers
    (``run_files``, the CLI) check them before they start Spark, as ``run`` does again."""
    if max_files_per_trigger is not None and (
            not is_int(max_files_per_trigger) or max_files_per_trigger < 1):
        raise OptionError(f"--max-files-per-trigger must be a whole number >= 1, got "
                          f"{max_files_per_trigger!r}")
    if trigger is not None and not (is_real(trigger) and 0 < trigger < math.inf):
        raise OptionError(f"--trigger must be a positive number of seconds, got "
                          f"{trigger!r}")


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
    shares: dict = field(default_factory=dict)  # the shares in force (label -> share)
    rates: dict | None = None  # the rates they were chosen for (kept in the fingerprint)

    def commit(self) -> None:
        """Write the fingerprint (a fresh run) and claim or clear the output folders."""
        ck = self.checkpoint
        ck.mkdir(parents=True, exist_ok=True)
        if self.fresh:
            # A run that completed no micro-batch may have left Spark offsets, uncommitted
            # state and end markers: none of it counts.
            import shutil
            for state in ("query", "spill"):
                with contextlib.suppress(OSError):
                    shutil.rmtree(ck / state)
            for pattern in ("end-*.txt", "cleanup-*.txt", "tick-*.txt"):
                for f in (ck / "end_of_input").glob(pattern):
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

    def _group_keys(self) -> list[int] | None:
        """The grouping keys of a restart: those its first run chose (in the fingerprint);
        for a checkpoint that predates them, those chosen for the shuffle partitions
        Spark records in the checkpoint (and restarts with), as that first run chose them.
        None for a fresh run (the session's choice, recorded by ``commit``)."""
        if self.fresh:
            return None
        return restart_group_keys(self.fingerprint, self.checkpoint / "query",
                                  self.fingerprint["groups"])

    def run(self, spark, finish: bool = True, max_files_per_trigger: int | None = None,
            trigger: float | None = None, cleanup: bool = False) -> SparkRun:
        """Run the query on ``spark`` over every file present; with ``finish``, signal the
        end of input so that buffered rows are processed as the local runtime would.
        ``trigger``: seconds between micro-batch starts (default: back to back).
        ``cleanup``: then signal a clean-up (``signal_cleanup``): the results the spills
        hold back are produced (``adaptcq cleanup CHECKPOINT``)."""
        check_run_options(max_files_per_trigger, trigger)
        ctl = self.checkpoint / "end_of_input"  # (continuous_query makes it)
        options = dict(self.options)
        if options.get("spill") is not None:  # spilled generations: kept with the checkpoint
            options["spill"] = {**options["spill"], "directory": str(self.checkpoint / "spill")}
        shed = options.get("shed")
        if trigger is not None and shed and shed.get("capacity") == "wall":
            # the trigger interval is the groups' CPU budget per micro-batch
            options["shed"] = {"interval": trigger, **shed}
        keys = self._group_keys()
        try:
            streams = {n: _read_stream(spark, inp, max_files_per_trigger)
                       for n, inp in self.inputs.items()}
            raw = continuous_query(
                spark, self.sql, streams, timestamp=self.timestamp, executor=self.executor,
                mode=self.mode, partitions=None if self.shares else self.partitions,
                shares=self.shares or None,
                allowed_lateness=self.allowed_lateness, sign=self.sign,
                end_of_input=ctl, side_outputs=True, rates=self.rates,
                timestamp_unit=self.unit,
                adaptivity=self.adaptivity, group_keys=keys, **options)
        except AdaptcqError:
            raise
        except Exception as e:  # noqa: BLE001 - Spark's analysis errors, in one line
            raise spark_error(e) from None
        if self.fresh:  # recorded by commit, with the fingerprint
            self.fingerprint["group_keys"] = raw._adaptcq["group_keys"]
            self.fingerprint["shuffle_partitions"] = raw._adaptcq["shuffle_partitions"]
        self.commit()
        info = raw._adaptcq
        names = info["names"]
        run = self._run_record()
        run.ts_type, run.unit = info["ts_type"], info["unit"]
        run.adaptivity = info["adaptivity"]
        run.executor = info["config"].executor
        run.split = info["plan"].describe()
        output, rejected = self.output, self.rejected
        t0 = time.perf_counter()
        q = None
        failure = None
        try:
            writer = (raw.writeStream.foreachBatch(
                lambda df, bid: write_batch(df, bid, output, rejected, run, names))
                # absolute: the JVM resolves a relative path against its own working
                # folder, which a chdir in Python after the session started does not move
                .option("checkpointLocation", os.path.abspath(self.checkpoint / "query"))
                .queryName(f"adaptcq_{uuid.uuid4().hex[:8]}"))
            if trigger is not None:
                writer = writer.trigger(processingTime=f"{trigger * 1000:.0f} milliseconds")
            q = writer.start()
            q.processAllAvailable()
            if finish:
                signal_end(ctl)
                q.processAllAvailable()
            if cleanup:
                signal_cleanup(ctl)
                q.processAllAvailable()
            if options.get("spill") is not None and (finish or cleanup):
                # The files the last micro-batch's clean-ups merged go once it is committed.
                signal_tick(ctl)
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
            read = _read_failure(self.inputs, str(getattr(failure, "desc", None) or failure))
            raise (read or spark_error(failure)) from None
        run.wall_seconds = time.perf_counter() - t0
        if output and not any(Path(output).glob("*.parquet")):
            schema = getattr(run, "_schema", None) or _result_schema(
                info["config"].results, info["ts_type"])
            _write_parquet(schema.empty_table(), Path(output), "part-empty.parquet")
        return run


def _result_schema(results, ts_type):
    """The output files' schema when no micro-batch wrote a result: the operator's result
    schema (``_Config.results``) with ``_ts`` as ``write_batch`` writes it."""
    import pyarrow as pa
    if ts_type is None:
        return results
    return results.set(results.get_field_index("_ts"), pa.field("_ts", ts_type))


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
                root = os.path.realpath(inp.given)
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


def _checkpoint_state(ck: Path, label: str, fp: dict,
                      columns_then: list[str] | None = None) -> tuple[dict | None, bool]:
    """(stored fingerprint, fresh). Fresh: no micro-batch of this checkpoint was completed.
    ``columns_then``: the output columns versions before 2026-11-27 wrote for this query
    (their fingerprints do not record them)."""
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
    if "columns" not in stored and columns_then is not None and columns_then != fp["columns"]:
        # Written before the fingerprint recorded the output's columns (2026-11-27), by a
        # version whose columns for this query differ: appending would mix part files.
        diffs.append(f"its output's columns were {', '.join(columns_then)}; this version "
                     f"writes {', '.join(fp['columns'])}")
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
                  executor: str = "auto", mode: str = "append", partitions: int = 1,
                  allowed_lateness: float = 0.0, sign: str | None = None,
                  timestamp_unit: str | None = None, adaptivity: Mapping | None = None,
                  shares: Mapping | None = None, **options) -> FileJob:
    """Check a run over files before Spark does any work: the inputs (as the local runtime
    reads them), the query, the places (no output inside an input or the checkpoint), the
    checkpoint (its fingerprint must be this query's) and the output folders; choose the
    shares (``shares``, those of the checkpoint, or at the inputs' row counts)."""
    from adaptcq.query.cql import parse_query
    from adaptcq.runtime.local import (
        check_sign_column,
        output_schema,
        parse_signed,
        require_inputs,
    )
    from adaptcq.stream.sources import schema_kinds

    if not is_int(partitions) or partitions < 1:
        raise AdaptcqError(f"--partitions must be a whole number >= 1, got {partitions!r}")
    if not isinstance(sql, str):
        raise QueryError("the Spark runtime takes the query as CQL text")
    check_sign_column(sign, timestamp)
    et.check_unit(timestamp_unit)
    late = lateness_ns(allowed_lateness)
    inputs = {name: _resolve_input(name, path, timestamp, timestamp_unit)
              for name, path in sources.items()}
    query = parse_signed(sql, {n: schema_kinds(i.schema) for n, i in inputs.items()}, sign)
    require_inputs(query, inputs)
    if sign is not None and not any(sign in i.schema.names for i in inputs.values()):
        raise InputError(f"no input has the sign column {sign!r} (--sign); the inputs' "
                         "columns: " + "; ".join(f"{n}: {', '.join(i.schema.names)}"
                                                 for n, i in inputs.items()))
    if shares is not None and not isinstance(shares, Mapping):
        raise OptionError(f"shares must map a column of each attribute class to its share, "
                          f"got {shares!r}")
    plan = plan_split(query, None if shares else partitions, None, shares or None)
    if shares and partitions not in (None, 1, plan.groups):
        raise OptionError(f"shares {dict(shares)} make {plan.groups} partition groups, but "
                          f"--partitions is {partitions}; give one or make them agree")
    groups = plan.groups
    _, spec = _adaptivity(executor, adaptivity)
    if options.get("spill") is not None:  # before Spark starts (run checks them again)
        from adaptcq.engine.spill_tree import check_query
        from adaptcq.runtime.spill import spark_spill_spec, spill_executor
        spill_executor(executor)
        if options["spill"].get("directory") is not None:
            raise OptionError("a run over files spills into its checkpoint (<checkpoint>/"
                              "spill), versioned with it; spill={'directory': ...} is for "
                              "continuous_query, whose checkpoint adaptcq does not know")
        check_query(query, mode)
        spark_spill_spec({**options["spill"], "directory": str(checkpoint)}, groups)
    if spec is not None:  # the policies' options, before Spark starts (run checks them again)
        try:
            make_policies(spec)
        except AdaptcqError:
            raise
        except (ValueError, KeyError, TypeError) as e:
            raise OptionError(str(e).strip('"')) from None
    ck_label = str(checkpoint)
    check_tilde(ck_label, "--checkpoint")  # (taken as written, as the outputs are)
    ck = Path(ck_label)
    _check_places(inputs, output, rejected, str(ck))
    spilling = options.get("spill") is not None

    def output_columns(q: LogicalQuery, late: bool) -> list[str]:
        return output_schema(q, {n: i.schema for n, i in inputs.items()}, timestamp,
                             timestamp_unit, late).names
    fp = {
        "version": FINGERPRINT_VERSION, "sql": normalize_sql(sql),
        "sql_text": sql,  # as given: what `adaptcq cleanup CHECKPOINT` runs again
        "timestamp": timestamp,
        "timestamp_unit": timestamp_unit, "executor": executor, "mode": mode,
        "groups": groups, "shares_given": _canonical(shares or None),
        "allowed_lateness_ns": late, "sign": sign,
        "order": _canonical(options.get("order")),
        "options": _canonical({k: v for k, v in options.items() if k != "order"}),
        # Results never depend on the policies (MJoin is exact under any order and cache),
        # but a restart continues the policies' plan, so it must be the same request.
        "adaptivity": _canonical(spec),
        "inputs": {n: i.pattern or os.path.realpath(i.given)
                   for n, i in inputs.items()},
        "schemas": {n: [f"{f.name}: {f.type}" for f in i.schema] for n, i in inputs.items()},
        "output": os.path.realpath(output) if output else None,
        "rejected": os.path.realpath(rejected) if rejected else None,
        "checkpoint": os.path.realpath(ck),
        # The output's columns (the local runtime's): a restart appends part files, which
        # must have them all. The operator tree's (spilling: auto runs it) have _late.
        "columns": output_columns(query, executor == "tree" or spilling),
    }
    # Before 2026-11-27: SELECT * kept the --sign column, and _late came with spilling only.
    then = parse_query(sql, {n: schema_kinds(i.schema) for n, i in inputs.items()}) \
        if sign is not None else query
    stored, fresh = _checkpoint_state(ck, ck_label, fp, output_columns(then, spilling))
    # The shares: measured at the first run (at the rows each input holds), then kept, so
    # that a restart routes rows to the groups that hold their state. The rates are kept
    # with them: the run's summary describes the split at the rates it was chosen for
    # (given shares: at the rows the first run's inputs held).
    rates = None
    if groups > 1:
        kept = not fresh and bool(shares or stored.get("shares"))
        # (a checkpoint written before 2026-11-28 has no rates: equal ones, as it described)
        rates = stored.get("rates") if kept else _input_rates(query, inputs)
        if not shares:
            shares = stored["shares"] if kept else \
                plan_split(query, groups, rates).describe()["shares"]
    fp["shares"] = plan_split(query, None, None, shares).describe()["shares"] if shares else {}
    fp["rates"] = rates
    fp["run"] = uuid.uuid4().hex if fresh else stored.get("run")
    # The groups' grouping keys: chosen at the first run (FileJob.run, for the session's
    # shuffle partitions), then kept: they name the groups' state in the checkpoint.
    fp["group_keys"] = None if fresh else stored.get("group_keys")
    fp["shuffle_partitions"] = None if fresh else stored.get("shuffle_partitions")
    from adaptcq import __version__
    fp["adaptcq"] = __version__
    out_state = _output_state(output, "--output", fresh, fp["run"], ck_label, True)
    rej_state = _output_state(rejected, "--rejected", fresh, fp["run"], ck_label, False)
    return FileJob(sql, inputs, ck, ck_label, output, rejected, timestamp, executor, mode,
                   partitions, allowed_lateness, sign, timestamp_unit, dict(options),
                   None if adaptivity is None else dict(adaptivity), fp, fresh, out_state,
                   rej_state, dict(fp["shares"]), rates)


def _input_rates(query: LogicalQuery, inputs: dict) -> dict[str, float]:
    """Each source's rows in the files present (the rates the shares are chosen for, as
    relative weights): Parquet from its footers; text files estimated from their size and
    the lines in their first 64 KiB."""
    import pyarrow.parquet as pq
    out = {}
    for s in query.streams:
        inp = inputs[s.source]
        n = 0
        for f in inp.files:
            if inp.kind == "parquet":
                n += pq.ParquetFile(f).metadata.num_rows
            else:
                size = os.path.getsize(f)
                with open(f, "rb") as fh:
                    head = fh.read(1 << 16)
                n += max(1, round(size * head.count(b"\n") / max(len(head), 1)))
        out[s.alias] = float(max(n, 1))
    return out


def run_files(spark, sql: str, sources: Mapping[str, str], checkpoint: str, output: str | None,
              rejected: str | None = None, timestamp: str = "ts", executor: str = "auto",
              mode: str = "append", partitions: int | None = None,
              allowed_lateness: float = 0.0, sign: str | None = None, finish: bool = True,
              max_files_per_trigger: int | None = None, timestamp_unit: str | None = None,
              trigger: float | None = None,
              adaptivity: Mapping | None = None, shares: Mapping | None = None,
              **options) -> SparkRun:
    """Run ``sql`` over Parquet/CSV files (a file, a folder or a glob per source) to Parquet.

    Processes every file present (several micro-batches with ``max_files_per_trigger``),
    then, with ``finish``, signals end of input so that buffered rows are processed as the
    local runtime would at the end of its input. Restarting with the same ``checkpoint``
    continues exactly where the previous run stopped (new files only); a checkpoint written
    by another query, or an output folder holding another query's results, is refused
    (``prepare_files``; docs/spark.md). ``adaptivity``: adaptive policies in every
    partition group (``continuous_query``). The query runs in ``partitions`` groups by shares
    chosen at the rows each input holds when it starts (``shares`` fixes them), kept in the
    checkpoint for restarts.
    """
    check_run_options(max_files_per_trigger, trigger)  # (before the inputs are read)
    P = partitions if partitions is not None else \
        1 if shares else int(spark.conf.get("spark.sql.shuffle.partitions"))
    job = prepare_files(sql, sources, checkpoint, output, rejected, timestamp, executor, mode,
                        P, allowed_lateness, sign, timestamp_unit, adaptivity=adaptivity,
                        shares=shares, **options)
    return job.run(spark, finish, max_files_per_trigger, trigger)


def prepare_cleanup(checkpoint: str | os.PathLike) -> FileJob:
    """``adaptcq cleanup CHECKPOINT`` before Spark starts: the run over files that wrote
    ``checkpoint`` (its query, inputs, options and output, from the checkpoint's
    fingerprint), checked as a restart; refused, with the reason, when the query does not
    spill or no micro-batch of it was completed."""
    from adaptcq.stream.sources import check_tilde_path
    check_tilde_path(str(checkpoint), "checkpoint", AdaptcqError)
    ck = Path(checkpoint)
    try:
        fp = json.loads((ck / FINGERPRINT).read_text())
    except (OSError, ValueError) as e:
        raise AdaptcqError(f"{checkpoint} is not the checkpoint of a Spark run (no readable "
                           f"{FINGERPRINT}: {e}); `adaptcq cleanup` takes the --checkpoint "
                           "of `adaptcq run --engine spark --spill ...`, or the --spill-dir "
                           "of a local run with --cleanup off") from None
    options = dict(fp.get("options") or {})
    if options.get("spill") is None:
        raise AdaptcqError(f"checkpoint {checkpoint}: its query does not spill (no --spill), "
                           "so no results are held back on disk")
    if not any((ck / "query" / "commits").glob("[0-9]*")):
        raise AdaptcqError(f"checkpoint {checkpoint}: no micro-batch of its run was "
                           "completed, so nothing was spilled; run the query")
    if fp.get("sql_text") is None:
        # (``sql`` is normalized for comparison only: a comment or a final semicolon
        # would make it another query, or one the spill folder does not recognize.)
        raise AdaptcqError(f"checkpoint {checkpoint} was written before `adaptcq cleanup` "
                           "worked on Spark and does not record its query text as given; "
                           "run the query to the end of its input (its clean-up runs there)")
    if fp.get("order") is not None:
        options["order"] = fp["order"]
    return prepare_files(
        fp["sql_text"], fp["inputs"], str(checkpoint), fp.get("output"), fp.get("rejected"),
        fp["timestamp"], fp["executor"], fp["mode"], fp["groups"],
        fp["allowed_lateness_ns"] / 1e9, fp.get("sign"), fp.get("timestamp_unit"),
        shares=fp.get("shares_given"), **options)


def cleanup_checkpoint(spark, checkpoint: str | os.PathLike) -> SparkRun:
    """The results a spilling Spark run holds back (``--cleanup off``, or a run stopped
    before the end of its input), produced now (``adaptcq cleanup CHECKPOINT``;
    state-spill.txt §4; docs/spill.md, "Clean-up on demand"): the query restarts from its
    checkpoint, processes any new input files, and every partition group cleans up in the
    micro-batch of a clean-up marker (``signal_cleanup``), its late results appended to the
    run's own output folder, exactly once with the checkpoint."""
    return prepare_cleanup(checkpoint).run(spark, finish=False, cleanup=True)


# ---------------------------------------------------------------------------------------------
# Errors: one line, not a JVM stack trace
# ---------------------------------------------------------------------------------------------

# An adaptcq exception as a traceback's last line names it: ``adaptcq.<module>.<Class>``
# (adaptcq.errors, adaptcq.state.spill_store, ...).
_ADAPTCQ_RAISED = re.compile(r"\b(adaptcq(?:\.[A-Za-z_]\w*)*)\.([A-Za-z_]\w*): ([^\n]+)")
_PY_RAISED = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception)): ([^\n]+)$", re.MULTILINE)
# Spark's file scan names the file it failed on (URL-encoded: no space in it), and the
# reader's own error follows as the last cause (CSV in FAILFAST mode: the record's text).
_FAILED_READ = re.compile(r"\[FAILED_READ_FILE[.\w]*\] Encountered error while reading file "
                          r"(\S+?)\.(?:\s|$)")
_CAUSE = re.compile(r"^Caused by: [\w.$]+: (?:\[[\w.]+\] )?(.+?)(?: SQLSTATE: \w+)?\s*$",
                    re.MULTILINE)


def failed_read(text: str) -> tuple[str, str] | None:
    """(the local path, the reader's reason) of a Spark failure to read an input file, from
    its error text; None if it is not one."""
    from urllib.parse import unquote, urlparse
    m = _FAILED_READ.search(text)
    if m is None:
        return None
    url = urlparse(m.group(1))
    path = unquote(url.path) if url.scheme in ("", "file") else m.group(1)
    causes = [c for c in _CAUSE.findall(text[m.end():])
              if not c.startswith("Encountered error while reading file")]
    reason = causes[-1].strip() if causes else "unreadable"
    return path, reason.rstrip(".")


def _read_failure(inputs: Mapping[str, _Input], text: str) -> AdaptcqError | None:
    """A Spark failure to read an input file as the local runtime's error for the file: CSV
    is read in FAILFAST mode (``_read_stream``), so a row the local runtime stops at (too few
    fields, a value its column's type cannot hold) stops Spark too, at a row past what the
    driver checked; the file is read again here by the local rules, which name the row.
    A row only Spark cannot read (docs/spark.md, "CSV tokens") is named by its text."""
    found = failed_read(text)
    if found is None:
        return None
    path, reason = found
    real = os.path.realpath(path)
    for inp in inputs.values():
        named = next((f for f in inp.files if os.path.realpath(f) == real), None)
        inside = (inp.pattern is None and os.path.isdir(inp.given)
                  and Path(real).is_relative_to(os.path.realpath(inp.given)))
        matched = inp.pattern is not None and any(
            p.match(inp.pattern) for p in (Path(real), *Path(real).parents))
        if named is None and not inside and not matched:
            continue
        shown = str(named or path)
        if inp.kind == "csv":
            from adaptcq.stream.sources import csv_file_error
            local = csv_file_error(inp.name, named or path, inp.schema, inp.files[0])
            if local is not None:
                return local
            return InputError(
                f"stream {inp.name}: Spark cannot read a row of {shown!r} that the local "
                f"runtime reads ({reason}): Spark reads a number as NaN only when written "
                "NaN, and an infinity only as Inf, -Inf or Infinity (docs/spark.md, \"CSV "
                "tokens\"); rewrite those values, give the input as Parquet, or use --engine "
                "local")
        return InputError(f"stream {inp.name}: Spark cannot read {shown!r}: {reason}")
    return AdaptcqError(f"the Spark query failed reading {path!r}: {reason}")


def _adaptcq_class(module: str, name: str) -> type | None:
    """The AdaptcqError subclass ``module.name`` names (an adaptcq module only, imported
    if need be: a worker may raise from one the driver has not loaded); None otherwise."""
    import importlib
    import sys
    if module != "adaptcq" and not module.startswith("adaptcq."):
        return None
    mod = sys.modules.get(module)
    if mod is None:
        try:
            mod = importlib.import_module(module)
        except Exception:  # noqa: BLE001 - not a module of this adaptcq: no class to keep
            return None
    cls = getattr(mod, name, None)
    return cls if isinstance(cls, type) and issubclass(cls, AdaptcqError) else None


def spark_error(exc: BaseException) -> AdaptcqError:
    """A Spark or py4j failure as one-line AdaptcqError: an adaptcq error raised in a Python
    worker keeps its class (from whichever adaptcq module defines it) and message; anything
    else keeps its first line."""
    text = str(getattr(exc, "desc", None) or exc)
    # The last one: a traceback prints an exception's context or cause before it (a row's
    # error raised again with its file named: docs/spark.md).
    m = next(reversed(list(_ADAPTCQ_RAISED.finditer(text))), None)
    cls = m and _adaptcq_class(m.group(1), m.group(2))
    if cls is not None:
        try:
            return cls(m.group(3).strip())
        except TypeError:
            # A class built from more than a message (UDFError, FilterError): its worker's
            # arguments do not travel, its class and message do.
            err = cls.__new__(cls)
            Exception.__init__(err, m.group(3).strip())
            return err
    read = failed_read(text)
    if read is not None:  # (before a Python traceback's last line: a py4j call's)
        return AdaptcqError(f"the Spark query failed reading {read[0]!r}: {read[1]}")
    if "Traceback (most recent call last)" in text:
        found = _PY_RAISED.findall(text.split("Traceback (most recent call last)", 1)[1])
        if found:
            return AdaptcqError(f"the Spark query failed: {found[-1][0]}: {found[-1][1]}")
    head = text.split("terminated with exception: ", 1)[-1].strip()
    line = next((x.strip() for x in head.splitlines() if x.strip()), type(exc).__name__)
    return AdaptcqError(f"the Spark query failed: {line}")
