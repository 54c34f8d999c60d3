"""The arrival order: every stream's input merged into one order, incrementally.

Updates are processed in (timestamp, FROM position, row position) order (docs/semantics.md,
"Update streams"). Inputs are read a chunk at a time and merged with bounded buffering:

* **Lateness.** A row whose timestamp is below its source's watermark on arrival (the
  largest earlier timestamp of that source minus the allowed lateness L) is rejected: counted
  and reported with its stream, row number and reason. Every later row of the source then
  has a timestamp of at least ``max_ts - L``: that is the source's *frontier*.
* **Release.** A row can be processed once no row still to come can precede it: when its
  timestamp is below the smallest frontier of the sources not yet exhausted (an exhausted
  source's frontier is +∞). A row with a timestamp equal to that frontier waits, since a
  later row with the same time may come from a stream earlier in FROM.
* **Bounded buffering.** The merger always reads next from the source holding the frontier
  back, so each source buffers the rows of about one chunk plus those within L of its
  newest row. Sources far apart in time buffer the one that is ahead, a chunk at a time.

Each stream reads the columns its aliases need; a self-join's two aliases share one source
and one read. Rows handed out as tuples (the tuple-at-a-time executors) hold Python values:
a chunk with a value Python cannot hold exactly is refused, naming its row.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from operator import itemgetter

import numpy as np
import pyarrow as pa

from adaptcq.errors import InputError
from adaptcq.query.logical import LogicalQuery
from adaptcq.stream.arrays import from_numpy, null_mask, to_numpy
from adaptcq.stream.eventtime import to_nanoseconds
from adaptcq.stream.sources import Source, naive_schema

SECOND = 1_000_000_000


@dataclass
class Arrivals:
    """Merged arrivals in processing order (parallel lists, as ContinuousQuery takes them):
    the stream (alias index), the sign (+1/-1; None when no stream has a sign column), the
    event time in int64 nanoseconds, and the row (the alias's columns)."""

    streams: list[int]
    signs: list[int] | None
    timestamps: list[int]
    rows: list[tuple]

    def __len__(self) -> int:
        return len(self.rows)


@dataclass
class ArrivalBatch:
    """Arrivals in processing order, as columns: the stream (alias index) of each arrival,
    its time (engine units), its sign (+1/-1; None: all +1), and per alias a table of its
    arrivals' columns (``query.columns[alias]``, in their order of arrival; None when the
    alias has no arrival in the batch)."""

    streams: np.ndarray
    timestamps: np.ndarray
    signs: np.ndarray | None
    tables: list[pa.Table | None]

    def __len__(self) -> int:
        return len(self.streams)

    @classmethod
    def concat(cls, parts: list[ArrivalBatch]) -> ArrivalBatch:
        """One batch of ``parts``' arrivals, in order."""
        if len(parts) == 1:
            return parts[0]
        tables = []
        for i in range(len(parts[0].tables)):
            mine = [p.tables[i] for p in parts if p.tables[i] is not None]
            tables.append(None if not mine else mine[0] if len(mine) == 1
                          else pa.concat_tables(mine))
        signs = None if parts[0].signs is None else np.concatenate([p.signs for p in parts])
        return cls(np.concatenate([p.streams for p in parts]),
                   np.concatenate([p.timestamps for p in parts]), signs, tables)

    def slice(self, lo: int, hi: int) -> ArrivalBatch:
        """Arrivals [lo, hi) (each alias's table sliced to its arrivals among them)."""
        st = self.streams
        tables = []
        for i, t in enumerate(self.tables):
            if t is None:
                tables.append(None)
                continue
            a = int(np.count_nonzero(st[:lo] == i))
            b = a + int(np.count_nonzero(st[lo:hi] == i))
            tables.append(t.slice(a, b - a) if b > a else None)
        return ArrivalBatch(st[lo:hi], self.timestamps[lo:hi],
                            None if self.signs is None else self.signs[lo:hi], tables)



class _Feed:
    """One source: its chunks, its lateness watermark and its buffered rows."""

    def __init__(self, src: Source, aliases: list[tuple[int, list[str]]], timestamp: str,
                 unit: str | None, lateness: int, sign: str | None, columnar: bool = False):
        self.src = src
        self.aliases = aliases
        self.timestamp = timestamp
        self.unit = unit
        self.lateness = np.uint64(lateness)
        self.lateness_int = lateness
        self.sign = sign
        self.it = src.chunks()
        self.done = False
        self.max_ts: int | None = None
        self.next_row = 0
        self.columns = sorted({c for _, cols in aliases for c in cols})
        schema = naive_schema(pa.schema([src.schema.field(c) for c in self.columns]))
        self.table = pa.table([pa.nulls(0, f.type) for f in schema], schema=schema)
        # Rows become Python values (``release``): the columns whose values may not.
        self.checked = [] if columnar else [f.name for f in schema if _needs_check(f.type)]
        self.ts = np.empty(0, np.int64)
        self.pos = np.empty(0, np.int64)
        self.signs = np.empty(0, np.int64) if sign else None

    @property
    def frontier(self) -> float | int:
        """No row still to come from this source has a smaller timestamp."""
        if self.done:
            return float("inf")
        if self.max_ts is None:
            return float("-inf")
        return self.max_ts - self.lateness_int

    def pull(self, rejected: list[dict]) -> None:
        """Read one chunk: reject its late rows, buffer the others in (ts, row) order."""
        try:
            batch = next(self.it)
        except StopIteration:
            self.done = True
            return
        n = batch.num_rows
        first = self.next_row
        self.next_row += n
        where, at = self._where(first, n)
        ts = to_nanoseconds(batch.column(self.timestamp), self.unit, where, self.timestamp, at)
        in_order = bool(np.all(ts[1:] >= ts[:-1]))
        if in_order and (self.max_ts is None or self.max_ts - int(ts[0]) <= self.lateness_int):
            # The usual input: a chunk in time order whose first row is not late has no
            # late row (each later row is at least the one before it).
            late, top = None, int(ts[-1])
        else:
            run = np.maximum.accumulate(ts)
            prev = np.empty_like(ts)
            prev[0] = ts[0] if self.max_ts is None else self.max_ts
            prev[1:] = run[:-1]
            if self.max_ts is not None:
                np.maximum(prev, self.max_ts, out=prev)
            # prev - ts as uint64 is exact whenever ts < prev (no int64 overflow).
            late = (ts < prev) & ((prev - ts).view(np.uint64) > self.lateness)
            top = int(run[-1])
        self.max_ts = top if self.max_ts is None else max(self.max_ts, top)
        pos = np.arange(first, first + n, dtype=np.int64)
        signs = self._signs(batch, where, at) if self.sign else None
        table = pa.Table.from_batches([batch.select(self.columns)])
        if late is not None and late.any():
            for r in np.flatnonzero(late):
                rejected.append({
                    "stream": self.src.name, "row": int(pos[r]), "ts": int(ts[r]) / SECOND,
                    "reason": f"late by more than the allowed lateness "
                              f"({self.lateness_int / SECOND:g} s)"})
            keep = np.flatnonzero(~late)
            table, ts, pos = table.take(from_numpy(keep)), ts[keep], pos[keep]
            signs = None if signs is None else signs[keep]
        for c in self.checked:  # (a late row is rejected whatever its values)
            _check_python(table.column(c), where, pos - (first - at), c)
        sorted_in = len(ts) == 0 or (
            (len(self.ts) == 0 or ts[0] >= self.ts[-1])
            and (in_order if late is None else bool(np.all(ts[1:] >= ts[:-1]))))
        self.table = pa.concat_tables([self.table, table]) if self.table.num_rows else table
        self.ts = np.concatenate([self.ts, ts])
        self.pos = np.concatenate([self.pos, pos])
        if signs is not None:
            self.signs = np.concatenate([self.signs, signs])
        if not sorted_in:  # rows within the lateness: into (ts, row) order
            order = np.argsort(self.ts, kind="stable")
            self.table = self.table.take(from_numpy(order))
            self.ts, self.pos = self.ts[order], self.pos[order]
            if self.signs is not None:
                self.signs = self.signs[order]

    def _where(self, first: int, n: int) -> tuple[str, int]:
        """How messages name a chunk's stream, and the number they give its first row:
        a file input's file and the row within it (as rejected rows and the Spark runtime
        name them), else the row within the stream. A chunk never spans two files."""
        file, row = self.src.locate(first)
        if file is None or self.src.locate(first + n - 1)[0] != file:
            return self.src.name, first
        return f"{self.src.name} (file {file})", row

    def _signs(self, batch: pa.RecordBatch, where: str, first: int) -> np.ndarray:
        col = batch.column(self.sign)
        if col.null_count:
            r = int(np.flatnonzero(null_mask(col))[0])
            raise InputError(f"stream {where}: row {first + r} has no sign "
                             f"({self.sign!r} is null); the sign column holds +1 or -1")
        sg = to_numpy(col)
        bad = np.flatnonzero((sg != 1) & (sg != -1))
        if len(bad):
            raise InputError(f"stream {where}: row {first + int(bad[0])} has sign "
                             f"{sg[bad[0]].item()!r}; the sign column {self.sign!r} holds "
                             "+1 or -1")
        return sg.astype(np.int64)

    def release(self, frontier, columnar: bool = False) -> tuple | None:
        """Take the buffered rows with timestamps below ``frontier``: per alias (index,
        times, row numbers, signs, rows), rows as tuples or (``columnar``) a table of the
        alias's columns."""
        if frontier == float("inf"):
            k = len(self.ts)
        elif frontier == float("-inf"):
            return None
        else:
            k = int(np.searchsorted(self.ts, frontier, side="left"))
        if k == 0:
            return None
        part = self.table.slice(0, k)
        ts, pos = self.ts[:k], self.pos[:k]
        signs = None if self.signs is None else self.signs[:k]
        self.table = self.table.slice(k)
        self.ts, self.pos = self.ts[k:], self.pos[k:]
        if self.signs is not None:
            self.signs = self.signs[k:]
        if self.table.num_rows == 0:  # drop references to released buffers
            self.table = self.table.slice(0, 0).combine_chunks()
        out = []
        for i, cols in self.aliases:
            if columnar:
                out.append((i, ts, pos, signs, part.select(cols)))
                continue
            if cols:
                values = [py_values(part.column(c)) for c in cols]
                rows = list(zip(*values, strict=True))
            else:
                rows = [()] * k
            out.append((i, ts, pos, signs, rows))
        return out


def py_values(col: pa.ChunkedArray) -> list:
    """``col.to_pylist()``; a sliced sparse union is copied first: before pyarrow 25 its
    values were read from its children without the slice's offset."""
    if pa.types.is_union(col.type) and col.type.mode == "sparse":
        col = pa.chunked_array([pa.concat_arrays([c]) if c.offset else c for c in col.chunks],
                               col.type)
    return col.to_pylist()


_DAY = 86_400
_DAYS = (-719_162, 2_932_896)  # date(1, 1, 1) and date(9999, 12, 31), in days from 1970
_TIMEDELTA_DAYS = 999_999_999
_PER_SECOND = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}


def _python_bounds(t: pa.DataType) -> tuple[int, int, int, str] | None:
    """For a type whose values ``to_pylist`` can fail on or change: the least and greatest
    storage value Python holds, the multiple every value must be (date64: whole days;
    time64[ns]: whole microseconds), and the Python type. None: every value converts
    exactly (timestamp[ns] and duration[ns] become pandas' Timestamp and Timedelta)."""
    if pa.types.is_timestamp(t) and t.unit != "ns":
        k = _PER_SECOND[t.unit]
        return _DAYS[0] * _DAY * k, (_DAYS[1] + 1) * _DAY * k - 1, 1, "datetime"
    if pa.types.is_date32(t):
        return _DAYS[0], _DAYS[1], 1, "date"
    if pa.types.is_date64(t):
        ms = _DAY * 1_000
        return _DAYS[0] * ms, _DAYS[1] * ms, ms, "date"
    if pa.types.is_duration(t) and t.unit in ("s", "ms"):
        k = _PER_SECOND[t.unit]
        return (-_TIMEDELTA_DAYS * _DAY * k, ((_TIMEDELTA_DAYS + 1) * _DAY) * k - 1, 1,
                "timedelta")
    if pa.types.is_time(t):
        k = _PER_SECOND[t.unit]
        return 0, _DAY * k - 1, 1_000 if t.unit == "ns" else 1, "time"
    return None


def _needs_check(t: pa.DataType) -> bool:
    if pa.types.is_dictionary(t):
        return _needs_check(t.value_type)
    if pa.types.is_struct(t):
        return any(_needs_check(f.type) for f in t)
    if pa.types.is_map(t):
        return _needs_check(t.key_type) or _needs_check(t.item_type)
    if pa.types.is_union(t):
        return any(_needs_check(f.type) for f in t)
    if pa.types.is_run_end_encoded(t) or _is_list(t):
        return _needs_check(t.value_type)
    return _python_bounds(t) is not None


def _is_list(t: pa.DataType) -> bool:
    """A list type of any kind (``is_nested`` holds for unions and run-end encoding too)."""
    return any(getattr(pa.types, n, lambda _: False)(t) for n in (
        "is_list", "is_large_list", "is_fixed_size_list", "is_list_view",
        "is_large_list_view"))


def _leaves(col: pa.Array):
    """The arrays of a column and of its items (lists, structs, maps, unions, run-end
    encoded values), flattened."""
    t = col.type
    if pa.types.is_dictionary(t):
        yield from _leaves(col.dictionary_decode())
    elif pa.types.is_struct(t):
        for child in col.flatten():
            yield from _leaves(child)
    elif pa.types.is_map(t):  # (no flatten kernel): its entries, key-value structs
        o = col.offsets
        yield from _leaves(col.values.slice(o[0].as_py(), o[-1].as_py() - o[0].as_py()))
    elif pa.types.is_union(t):
        for k in range(t.num_fields):
            yield from _leaves(col.field(k))
    elif pa.types.is_run_end_encoded(t):  # its values, each run once
        yield from _leaves(col.values)
    elif _is_list(t):
        yield from _leaves(col.flatten())
    else:
        yield col


def _misfit(leaf: pa.Array) -> str | None:
    """Why a value of ``leaf`` (a column with no items) has no exact Python value, if one
    has none."""
    bounds = _python_bounds(leaf.type)
    if bounds is None or not len(leaf):
        return None
    lo, hi, step, kind = bounds
    raw = to_numpy(leaf, null=0)  # (NULL: 0, in every range)
    if raw.min() < lo or raw.max() > hi:
        if kind == "time":
            return "not a time of day (0 to 24 h, all that Python's datetime.time holds)"
        if kind == "timedelta":
            return "beyond the ±999,999,999 days that Python's timedelta holds"
        return f"outside the years 1 to 9999 that Python's {kind} holds"
    if step != 1 and (raw % step).any():
        if kind == "date":
            return "not a whole day (date64 holds whole days, as milliseconds)"
        return "with digits below the microsecond, which Python's datetime.time drops"
    return None


def python_misfit(col: pa.Array | pa.ChunkedArray) -> str | None:
    """Why a value of ``col`` (or of its items) has no exact Python value, if one has
    none: what ``to_pylist`` would raise on, or change, without a word."""
    if not _needs_check(col.type):
        return None
    if isinstance(col, pa.ChunkedArray):
        col = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
    return next((w for leaf in _leaves(col) if (w := _misfit(leaf))), None)


def first_misfit_row(col: pa.Array | pa.ChunkedArray) -> int:
    """The first row of ``col`` whose value ``python_misfit`` refuses (it has one): row by
    row, an error's cost only."""
    return next(k for k in range(len(col)) if python_misfit(col.slice(k, 1)))


def _check_python(col: pa.Array | pa.ChunkedArray, stream: str, rows: np.ndarray,
                  column: str) -> None:
    """Refuse a chunk whose ``column`` holds a value with no exact Python value, which the
    tuple-at-a-time executors' rows hold (``release``): to_pylist raised a bare
    OverflowError on a date past 9999, and cut a time64[ns] to the microsecond. The message
    names the row (``rows``: each value's number); the vectorized executor keeps the
    column in Arrow."""
    why = python_misfit(col)
    if why is None:
        return
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    row = first_misfit_row(col)
    value, t = col.slice(row, 1), col.type
    if pa.types.is_nested(t):
        shown = "an item"
    elif pa.types.is_date64(t) or pa.types.is_duration(t) or "out of range" in (
            shown := value.cast(pa.string())[0].as_py()):
        unit = "ms" if pa.types.is_date64(t) else t.unit
        shown = f"{to_numpy(value)[0]} {unit}"
    raise InputError(f"stream {stream}: row {rows[row]} has {shown} in column {column!r} "
                     f"({col.type}), {why}; the tuple-at-a-time executors take each row as "
                     "Python values and would lose it, --executor vector keeps columns in "
                     "Arrow (where it runs the query over columns: docs/vector.md)")


class ArrivalMerger:
    """Merges the query's sources into processing order, a chunk at a time.

    Iterating yields ``Arrivals``; late rows are appended to ``rejected`` (dicts with
    stream, row, ts in seconds, reason) as they are found. ``positions()`` tells how far
    each source has been read (for the summary of an interrupted run).
    """

    feed_type = _Feed  # what reads each source (a subclass may record more as it reads)

    def __init__(self, query: LogicalQuery, sources: Mapping[str, Source], timestamp: str,
                 unit: str | None = None, lateness: int = 0, sign: str | None = None,
                 columnar: bool = False):
        self.query = query
        self.columnar = columnar  # yield ArrivalBatch (columns), not Arrivals (row tuples)
        self.rejected: list[dict] = []
        self.signed = sign is not None
        self.feeds: list[_Feed] = []
        for name, src in sources.items():
            aliases = [(i, query.columns[s.alias]) for i, s in enumerate(query.streams)
                       if s.source == name]
            if not aliases:
                continue
            self.feeds.append(self.feed_type(src, aliases, timestamp, unit, lateness,
                                             sign if sign in src.schema.names else None,
                                             columnar))

    def positions(self) -> dict[str, int]:
        """Rows read so far from each source."""
        return {f.src.name: f.next_row for f in self.feeds}

    def buffered(self) -> int:
        """Rows read but not yet released."""
        return sum(len(f.ts) for f in self.feeds)

    def __iter__(self) -> Iterator[Arrivals | ArrivalBatch]:
        feeds = self.feeds
        while True:
            live = [f for f in feeds if not f.done]
            if not live:
                break
            min(live, key=lambda f: f.frontier).pull(self.rejected)
            frontier = min((f.frontier for f in feeds), default=float("inf"))
            merged = self._release(frontier)
            if merged is not None:
                yield merged
        merged = self._release(float("inf"))
        if merged is not None:
            yield merged

    def _release(self, frontier) -> Arrivals | ArrivalBatch | None:
        parts = []
        for f in self.feeds:
            got = f.release(frontier, self.columnar)
            if got:
                parts.extend(got)
        if not parts:
            return None
        if self.columnar:
            return self._columns(parts)
        if len(parts) == 1:
            i, ts, _, signs, rows = parts[0]
            return Arrivals([i] * len(rows), None if not self.signed else
                            (signs.tolist() if signs is not None else [1] * len(rows)),
                            ts.tolist(), rows)
        ts = np.concatenate([p[1] for p in parts])
        st = np.concatenate([np.full(len(p[1]), p[0], np.int64) for p in parts])
        pos = np.concatenate([p[2] for p in parts])
        rows = [r for p in parts for r in p[4]]
        order = np.lexsort((pos, st, ts))
        signs = None
        if self.signed:
            signs = np.concatenate([p[3] if p[3] is not None else np.ones(len(p[1]), np.int64)
                                    for p in parts])[order].tolist()
        return Arrivals(st[order].tolist(), signs, ts[order].tolist(),
                        list(itemgetter(*order)(rows)) if len(order) > 1 else
                        [rows[j] for j in order])

    def _columns(self, parts) -> ArrivalBatch:
        """The released parts merged into one ArrivalBatch (each alias's rows keep their
        (ts, row) order, so its table needs no reordering)."""
        tables: list = [None] * len(self.query.streams)
        parts = sorted(parts, key=lambda p: p[0])  # by alias: ties in time go in FROM order
        for i, _, _, _, table in parts:
            tables[i] = table
        ts = np.concatenate([p[1] for p in parts])
        st = np.concatenate([np.full(len(p[1]), p[0], np.int64) for p in parts])
        # Each part is in (time, row) order, so a stable sort on time alone merges them in
        # (time, alias, row) order: linear on these sorted runs, unlike a three-key lexsort.
        order = np.argsort(ts, kind="stable") if len(parts) > 1 else np.arange(len(ts))
        signs = None
        if self.signed:
            signs = np.concatenate([p[3] if p[3] is not None else np.ones(len(p[1]), np.int64)
                                    for p in parts])[order]
        return ArrivalBatch(st[order], ts[order], signs, tables)
