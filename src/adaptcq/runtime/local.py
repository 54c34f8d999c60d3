"""The single-process runtime: sources in, one ContinuousQuery, a pyarrow Table out.

It reads every source, puts each into timestamp order within the allowed lateness, merges
the query's streams into one order (timestamp, then FROM position, then row position, so
ties are broken deterministically), and feeds the engine in batches.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from operator import itemgetter

import numpy as np
import pyarrow as pa

from adaptcq.engine.continuous import ContinuousQuery
from adaptcq.errors import InputError, QueryError
from adaptcq.query.logical import LogicalQuery
from adaptcq.stream.sources import arrival_order, load_source, nanoseconds, schema_kinds

BATCH = 32_768
TIME_UNIT = 1e-9  # the engine runs on int64 nanoseconds: exact window boundaries


@dataclass
class RunResult:
    """The output of a run and its statistics."""

    table: pa.Table
    stats: dict
    rejected: pa.Table
    samples: list = field(default_factory=list)
    query: LogicalQuery | None = None
    plan: str = ""

    def to_pandas(self):
        return self.table.to_pandas()


@dataclass
class PreparedInput:
    """Arrivals of all streams merged into processing order."""

    query: LogicalQuery
    streams: np.ndarray
    signs: np.ndarray | None
    timestamps: np.ndarray
    rows: list
    rejected: list[dict]
    ts_type: pa.DataType
    load_seconds: float
    time_unit: float = TIME_UNIT  # seconds per unit of ``timestamps`` (give it to the engine)


def prepare(sql: str | LogicalQuery, sources: Mapping[str, object], timestamp: str,
            sign: str | None = None, allowed_lateness: float = 0.0) -> PreparedInput:
    """Load sources, parse the query against their schemas and merge arrivals."""
    from adaptcq.query.cql import parse_query

    t0 = time.process_time()
    tables = {name: load_source(name, src, timestamp) for name, src in sources.items()}
    if isinstance(sql, LogicalQuery):
        query = sql
    else:
        schemas = {name: schema_kinds(t) for name, t in tables.items()}
        query = parse_query(sql, schemas)
    require_inputs(query, tables)
    _check_join_types(query)
    if sign is not None:
        for s in query.streams:
            if sign in tables[s.source].column_names and s.window.kind != "unbounded":
                raise InputError(f"stream {s.alias} has a sign column {sign!r} and a window "
                                 f"{s.window}; explicit deletions need an unbounded stream")

    order = {}
    rejected: list[dict] = []
    tsec = {}
    for name, table in tables.items():
        tsec[name] = nanoseconds(table, timestamp)  # exact event times (see TIME_UNIT)
        order[name] = arrival_order(tsec[name], round(allowed_lateness / TIME_UNIT))
        for r in order[name].late:
            rejected.append({"stream": name, "row": int(r),
                             "ts": float(tsec[name][r] * TIME_UNIT),
                             "reason": f"late by more than the allowed lateness "
                                       f"({allowed_lateness:g} s)"})

    parts_ts, parts_stream, parts_pos, all_rows, parts_sign = [], [], [], [], []
    offset = 0
    for i, s in enumerate(query.streams):
        table, acc = tables[s.source], order[s.source].accepted
        cols = [_pylist(table, c, acc, s.alias) for c in query.columns[s.alias]]
        rows = list(zip(*cols)) if cols else [()] * len(acc)
        parts_ts.append(tsec[s.source][acc])
        parts_stream.append(np.full(len(acc), i, np.int64))
        parts_pos.append(np.arange(len(acc)) + offset)
        offset += len(acc)
        all_rows.extend(rows)
        if sign is not None:
            if sign in table.column_names:
                sg = np.asarray(table.column(sign).to_numpy(zero_copy_only=False))[acc]
                bad = np.flatnonzero((sg != 1) & (sg != -1))
                if len(bad):
                    raise InputError(f"stream {s.source}: row {int(acc[bad[0]])} has sign "
                                     f"{sg[bad[0]].item()!r}; the sign column {sign!r} holds +1 or -1")
                parts_sign.append(sg.astype(np.int64))
            else:
                parts_sign.append(np.ones(len(acc), np.int64))
    ts = np.concatenate(parts_ts) if parts_ts else np.empty(0, np.int64)
    st = np.concatenate(parts_stream) if parts_stream else np.empty(0, np.int64)
    pos = np.concatenate(parts_pos) if parts_pos else np.empty(0, np.int64)
    merged = np.lexsort((pos, st, ts))
    rows = list(itemgetter(*merged)(all_rows)) if len(merged) > 1 else \
        [all_rows[j] for j in merged]
    signs = np.concatenate(parts_sign)[merged] if sign is not None and parts_sign else None
    ts_types = {tables[s.source].schema.field(timestamp).type for s in query.streams}
    ts_type = next(iter(ts_types)) if len(ts_types) == 1 else pa.float64()
    return PreparedInput(query, st[merged], signs, ts[merged], rows, rejected, ts_type,
                         time.process_time() - t0)


def _pylist(table: pa.Table, column: str, rows: np.ndarray, alias: str) -> list:
    if column not in table.column_names:
        raise InputError(f"stream {alias}: no column {column!r} in its input "
                         f"(its columns: {', '.join(table.column_names)})")
    return table.column(column).take(pa.array(rows, pa.int64())).to_pylist()


def require_inputs(query: LogicalQuery, names) -> None:
    """Every source the query reads has an input."""
    missing = sorted({s.source for s in query.streams} - set(names))
    if missing:
        raise InputError(f"no input for stream {', '.join(missing)}; give one with "
                         f"--input NAME=PATH (have: {', '.join(sorted(names)) or 'none'})")


def _check_join_types(query: LogicalQuery) -> None:
    """Columns equated across streams must be comparable: a string never equals a number."""
    for cls in query.classes:
        kinds = {c: query.types.get(c.stream, {}).get(c.column) for c in cls}
        known = {k for k in kinds.values() if k is not None}
        if len(known) > 1:
            desc = ", ".join(f"{c} is {k}" for c, k in sorted(kinds.items(), key=str) if k)
            raise QueryError(f"join columns of different types can never be equal: {desc}",
                             query.sql, None)


def execute(prepared: PreparedInput, executor: str = "mjoin", mode: str = "append",
            progress: Callable[[int, int], None] | None = None, **options) -> RunResult:
    """Run a prepared input through one ContinuousQuery and collect the output."""
    q = prepared.query
    policies = list(options.pop("policies", None) or [])
    options.setdefault("time_unit", TIME_UNIT)
    cache_options = options.pop("cache_options", None) or {}
    engine_executor = executor
    if executor == "acaching":  # MJoin + the A-Caching policy (a-caching.txt §4.5)
        from adaptcq.adapt.acaching import ACaching
        reorder = next((p for p in policies if type(p).__name__ == "AGreedy"), None)
        policies = [p for p in policies if p is not reorder]
        policies.append(ACaching(reorder=reorder, **cache_options))
        engine_executor = "mjoin"
    cq = ContinuousQuery(q, engine_executor, mode, **options)
    for policy in policies:
        cq.attach(policy)
    out: list = []
    n = len(prepared.rows)
    t0 = time.process_time()
    for start in range(0, n, BATCH):
        end = min(n, start + BATCH)
        sl = slice(start, end)
        out.extend(cq.process(prepared.streams[sl].tolist(),
                              None if prepared.signs is None else prepared.signs[sl].tolist(),
                              prepared.timestamps[sl].tolist(), prepared.rows[sl]))
        if progress:
            progress(end, n)
    cpu = time.process_time() - t0
    cq.sample(cq.now)
    table = output_table(q, out, prepared.ts_type, TIME_UNIT)
    rejected = prepared.rejected + [
        {"stream": q.aliases[i], "row": -1, "ts": ts * TIME_UNIT, "reason": why}
        for i, ts, _, why in cq.rejected_rows]
    peak_t, peak_b = cq.peak_state()
    st = cq.stats
    stats = {
        "executor": executor, "mode": mode,
        "arrivals": st.arrivals, "updates": st.updates, "insertions": st.insertions,
        "deletions": st.deletions, "filtered": st.filtered, "results": st.results,
        "rejected": len(rejected), "cpu_seconds": cpu, "load_cpu_seconds": prepared.load_seconds,
        "throughput": st.updates / cpu if cpu > 0 else float("inf"),
        "peak_state_tuples": peak_t, "peak_state_bytes": peak_b,
    }
    for policy in policies:
        if hasattr(policy, "report"):
            stats.update(policy.report())
    return RunResult(table, stats, rejected_table(rejected), st.samples, q,
                     cq.executor.describe())


def output_table(query: LogicalQuery, out: list, ts_type: pa.DataType,
                 time_unit: float = 1.0) -> pa.Table:
    """Output rows ``(*values, sign, ts)`` as a table with ``_sign`` (int8) and ``_ts``
    (``ts`` in units of ``time_unit`` seconds; ``_ts`` of the input's timestamp type, or
    float seconds)."""
    names = [o.name for o in query.outputs]
    if not out:
        arrays = [pa.array([], pa.null()) for _ in names] + [pa.array([], pa.int8()),
                                                             pa.array([], pa.float64())]
    else:
        # Converting the row tuples as one struct array is ~5x faster than per-column lists;
        # the value types are inferred from a sample and checked by the conversion itself.
        sample = list(zip(*out[:1024]))
        types = [pa.array(list(c)).type for c in sample[:-2]]
        types = [pa.float64() if pa.types.is_null(t) else t for t in types]
        ts_field = pa.float64() if time_unit == 1.0 else pa.int64()
        fields = [pa.field(f"f{k}", t) for k, t in enumerate(types)] + [
            pa.field("_sign", pa.int8()), pa.field("_ts", ts_field)]
        try:
            arrays = pa.array(out, type=pa.struct(fields)).flatten()
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            arrays = [pa.array(list(c)) for c in zip(*out)]
            arrays[-2] = arrays[-2].cast(pa.int8())
    ts = arrays[-1]
    if len(ts) and time_unit != 1.0:
        units = ts.to_numpy(zero_copy_only=False)
        if pa.types.is_timestamp(ts_type):
            ns = np.round(units * (time_unit / 1e-9)).astype("int64")
            ts = pa.array(ns, pa.int64()).cast(pa.timestamp("ns")).cast(ts_type, safe=False)
        else:
            ts = pa.array(units * time_unit, pa.float64())
    elif pa.types.is_timestamp(ts_type):
        ns = (ts.to_numpy(zero_copy_only=False) * 1e9).round().astype("int64")
        ts = pa.array(ns, pa.int64()).cast(pa.timestamp("ns")).cast(ts_type, safe=False)
    return pa.table([*arrays[:-1], ts], names=names + ["_sign", "_ts"])


def rejected_table(rows: list[dict]) -> pa.Table:
    schema = pa.schema([("stream", pa.string()), ("row", pa.int64()), ("ts", pa.float64()),
                        ("reason", pa.string())])
    return pa.Table.from_pylist(rows, schema=schema)


def run(sql: str, sources: Mapping[str, object], timestamp: str = "ts",
        executor: str = "mjoin", mode: str = "append", sign: str | None = None,
        allowed_lateness: float = 0.0, **options) -> RunResult:
    """Run a continuous query over finite inputs in this process.

    >>> result = adaptcq.run(sql, sources={"R": "r.parquet", ...}, timestamp="ts")
    >>> result.table  # pyarrow Table: SELECT columns, _sign, _ts
    >>> result.stats  # updates, results, throughput (updates per CPU-second), peak state...
    """
    prepared = prepare(sql, sources, timestamp, sign, allowed_lateness)
    return execute(prepared, executor, mode, **options)
