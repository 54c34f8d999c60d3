"""Input sources and their arrival order.

A source is a Parquet file (or a folder of them), a CSV file, a pandas DataFrame, a
pyarrow Table, or a Python iterable of dicts. Its timestamp is a named column of a
timestamp type or of numeric seconds. ``arrival_order`` puts a source's rows into
timestamp order, rejecting (and reporting) rows later than the allowed lateness.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from adaptcq.errors import InputError


def load_source(name: str, source, timestamp: str) -> pa.Table:
    """Read one stream's input into a pyarrow Table, checking its timestamp column."""
    table = _read(name, source)
    if timestamp not in table.column_names:
        raise InputError(f"stream {name}: no timestamp column {timestamp!r} "
                         f"(its columns: {', '.join(table.column_names)})")
    col = table.column(timestamp)
    if not (pa.types.is_timestamp(col.type) or pa.types.is_integer(col.type)
            or pa.types.is_floating(col.type) or pa.types.is_date(col.type)):
        raise InputError(f"stream {name}: timestamp column {timestamp!r} has type {col.type}; "
                         "it must be a timestamp or numeric seconds")
    if col.null_count:
        row = int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])
        raise InputError(f"stream {name}: row {row} has no timestamp ({timestamp!r} is null)")
    return _normalize(table)


def _read(name: str, source) -> pa.Table:
    if isinstance(source, pa.Table):
        return source
    if isinstance(source, pa.RecordBatch):
        return pa.Table.from_batches([source])
    try:
        import pandas as pd
        if isinstance(source, pd.DataFrame):
            return pa.Table.from_pandas(source, preserve_index=False)
    except ImportError:  # pragma: no cover - pandas is a dependency
        pass
    if isinstance(source, (str, Path)):
        path = Path(source)
        if not path.exists():
            raise InputError(f"stream {name}: input file {str(path)!r} does not exist")
        try:
            if path.is_dir() or path.suffix.lower() in (".parquet", ".pq"):
                import pyarrow.parquet as pq
                return pq.read_table(path)
            if path.suffix.lower() in (".csv", ".txt", ".gz"):
                import pyarrow.csv as pacsv
                return pacsv.read_csv(path)
        except (pa.ArrowInvalid, OSError) as e:
            raise InputError(f"stream {name}: cannot read {str(path)!r}: {e}") from None
        raise InputError(f"stream {name}: {str(path)!r} is neither Parquet nor CSV "
                         "(use a .parquet or .csv file)")
    if isinstance(source, Iterable) and not isinstance(source, (bytes, Mapping)):
        rows = list(source)
        if rows and not all(isinstance(r, Mapping) for r in rows):
            bad = next(i for i, r in enumerate(rows) if not isinstance(r, Mapping))
            raise InputError(f"stream {name}: row {bad} is {type(rows[bad]).__name__}; "
                             "an iterable source yields dicts of column -> value")
        return pa.Table.from_pylist(rows)
    raise InputError(f"stream {name}: cannot read a source of type {type(source).__name__}")


def _normalize(table: pa.Table) -> pa.Table:
    """Timestamps become naive UTC (what the engine compares); dictionaries are decoded."""
    cols, changed = [], False
    for col in table.columns:
        t = col.type
        if pa.types.is_timestamp(t) and t.tz is not None:
            col, changed = col.cast(pa.timestamp(t.unit)), True
        elif pa.types.is_dictionary(t):
            col, changed = col.cast(t.value_type), True
        cols.append(col)
    return pa.table(cols, names=table.column_names) if changed else table


def column_kind(t: pa.DataType) -> str:
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t):
        return "number"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "string"
    if pa.types.is_timestamp(t) or pa.types.is_date(t):
        return "timestamp"
    if pa.types.is_boolean(t):
        return "bool"
    return "other"


def schema_kinds(table: pa.Table) -> dict[str, str]:
    return {f.name: column_kind(f.type) for f in table.schema}


def nanoseconds(table: pa.Table, timestamp: str) -> np.ndarray:
    """Event times as int64 nanoseconds (since the epoch for timestamp columns; numeric
    seconds rounded to the nanosecond): exact, so window boundaries are exact."""
    col = table.column(timestamp)
    if pa.types.is_date(col.type):
        col = col.cast(pa.timestamp("s"))
    if pa.types.is_timestamp(col.type):
        return pc.cast(col, pa.timestamp("ns")).cast(pa.int64()).to_numpy()
    return np.round(col.to_numpy().astype(np.float64) * 1e9).astype(np.int64)


@dataclass
class ArrivalOrder:
    """A source's rows in processing order (``accepted``, row indices sorted by timestamp,
    ties in file order) and the rows rejected as too late (``late``)."""

    accepted: np.ndarray
    late: np.ndarray


def arrival_order(ts: np.ndarray, allowed_lateness: float) -> ArrivalOrder:
    """Reorder within the allowed lateness; reject beyond it.

    A row is late when its timestamp is below the watermark at its arrival: the largest
    timestamp of the rows before it in the source, minus ``allowed_lateness``. The other
    rows are processed in (timestamp, position) order, which is exactly the order a
    watermark-driven buffer would release them in.
    """
    if len(ts) == 0:
        return ArrivalOrder(np.empty(0, np.int64), np.empty(0, np.int64))
    prev_max = np.maximum.accumulate(np.concatenate(([-np.inf], ts[:-1])))
    late = ts < prev_max - allowed_lateness
    ok = np.flatnonzero(~late)
    accepted = ok[np.argsort(ts[ok], kind="stable")]
    return ArrivalOrder(accepted, np.flatnonzero(late))
