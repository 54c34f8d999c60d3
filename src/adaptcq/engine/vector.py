"""The vectorized executor: MJoin's exact results computed a micro-batch at a time over
column batches (issue 16; ARCHITECTURE.md "A third back end: vectorized").

The per-tuple executors run one update at a time through CPython. This one takes a batch
of arrivals and computes, with numpy over column arrays, exactly the output MJoin would
produce update by update: the same rows with the same ``_sign`` and ``_ts``, in the same
order of updates.

**Updates and positions.** Every update of the batch (an insertion, a time-window expiry,
a count-window eviction, an explicit deletion) gets a global position: the order in which
``ContinuousQuery.process`` would run it (stream.windows: the expiries due before an
arrival, ordered by (t + w, arrival), then the arrival's own count-window or explicit
deletion, then its insertion). A stored row y has the position ``ins_y`` of its insertion
and ``del_y`` of its deletion (∞ while it is still in its window).

**The rule** (:func:`present`, the only one): a result is a combination of one row per
stream meeting the join predicates; it exists from the insertion of its last-arriving
component to the deletion of its first-leaving one. So an insertion of x at position p
emits every combination whose other components y are *present at p*: ``ins_y < p <
del_y``; in retract mode the deletion of x at position p emits every combination whose
other components are present at p, with the deletion's time as ``_ts``. MJoin's pipeline
ΔX ⋈ … computes exactly this, update by update (a-caching.txt §3.1).

**Bands, not filters.** For ``[RANGE w]`` and ``[ROWS n]`` windows both ``ins`` and
``del`` increase with arrival order, so the rows of a stream present at p are one
contiguous range of its window, found by two binary searches. Each join step of a
pipeline probes the next stream's index for (key, that range) directly (:class:`RunIndex`:
rows sorted by key then arrival), so an intermediate result never holds a pair that is not
a valid partial result, whatever the batch size. Unbounded windows with explicit deletions
(rows leave from the middle) test ``del_y > p`` after the probe.

**State as columns.** Each stream's window (:class:`ColumnWindow`) is parallel numpy arrays
in arrival order: positions, times, key codes, and the values the output needs. Expiry
slices the front; explicit deletions mark rows dead and compact now and then. Indexes are
log-structured runs of sorted rows (one run per batch, merged when one is no larger than
twice the next), built on first use for the key columns a pipeline probes.

**Keys** (:class:`KeyCoding`, per attribute class): keys meet exactly when the per-tuple
engine's values are equal (Python's ``==``) whatever their Arrow types. Integers,
booleans and one time type as int64; timestamps of several units in the finest one, dates
as days; floats (and classes mixing integers and floats) as the bits of the float64 value,
-0.0 as 0.0 and NaN never joining, as in the per-tuple engine (with integers, matches
checked on the values); anything else (strings, decimals…) as a 64-bit hash whose matches
are then checked on the values. A NULL never joins. A key of several columns is a mix of
their codes, its matches checked column by column.

The orders of the pipelines may change between batches (``orders``, or a policy such as
``adapt.batch_order``); each batch runs with the orders current when it starts.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal

import numpy as np
import pyarrow as pa

from adaptcq.engine.continuous import Counters, row_key
from adaptcq.engine.rules import check_given_orders, check_order, connected_order
from adaptcq.errors import InputError, OptionError
from adaptcq.query.logical import ColumnRef, LogicalQuery
from adaptcq.stats.estimators import Ratio
from adaptcq.stream.arrays import from_numpy, null_mask, numpy_dtype, storage_type, to_numpy
from adaptcq.stream.eventtime import NS_MAX, UNITS
from adaptcq.stream.merge import ArrivalBatch, python_misfit

INF = np.iinfo(np.int64).max  # the deletion position of a row still in its window
_MIX = np.uint64(0x9E3779B97F4A7C15)  # odd multiplier mixing the codes of a several-column key


def present(ins: np.ndarray, dele: np.ndarray, p) -> np.ndarray:
    """The one exactness rule: rows (their insertion and deletion positions) present at the
    update at position ``p``, i.e. ``ins < p < del`` (module docstring)."""
    return (ins < p) & (p < dele)


# ----- arrivals ----------------------------------------------------------------------------
def batch_from_rows(query: LogicalQuery, schemas: Mapping[str, pa.Schema],
                    streams: Sequence[int], signs: Sequence[int] | None,
                    timestamps: Sequence, rows: Sequence[tuple]) -> ArrivalBatch:
    """An :class:`ArrivalBatch` from ContinuousQuery.process's parallel lists (rows as
    tuples in ``query.columns`` order), typed by ``schemas`` (per alias)."""
    st = np.asarray(streams, dtype=np.int64)
    tables: list[pa.Table | None] = []
    for i, alias in enumerate(query.aliases):
        mine = [rows[k] for k in np.flatnonzero(st == i)]
        if not mine:
            tables.append(None)
            continue
        cols = query.columns[alias]
        schema = schemas[alias]
        tables.append(pa.table({c: pa.array([r[j] for r in mine], schema.field(c).type)
                                for j, c in enumerate(cols)},
                               schema=pa.schema([schema.field(c) for c in cols])))
    ts = np.asarray(timestamps)
    if ts.dtype.kind not in "iuf":
        ts = ts.astype(np.float64)
    return ArrivalBatch(st, ts, None if signs is None else np.asarray(signs, np.int64),
                        tables)


# ----- values and key codes ------------------------------------------------------------------
def _value_type(t: pa.DataType) -> pa.DataType:
    """A column's type as the engine holds it (a dictionary decoded to its values)."""
    return t.value_type if pa.types.is_dictionary(t) else t


class Values:
    """How one input column is held in a window: numpy values and a NULL mask for
    fixed-width types (ints, floats, bools, times: ``stream.arrays``), numpy objects for
    the rest."""

    def __init__(self, t: pa.DataType):
        self.type = t
        self.dtype = numpy_dtype(t)
        self.primitive = self.dtype is not None
        if self.dtype is None:
            self.dtype = np.dtype(object)

    def to_numpy(self, arr) -> tuple[np.ndarray, np.ndarray]:
        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks()
        if pa.types.is_dictionary(arr.type):
            arr = arr.dictionary_decode()
        return to_numpy(arr), null_mask(arr)

    def to_arrow(self, values: np.ndarray, mask: np.ndarray) -> pa.Array:
        if not self.primitive:
            return pa.array(values, type=self.type, mask=mask if mask.any() else None)
        return from_numpy(values, self.type, mask)


_MS_PER_DAY = 86_400_000


class KeyCoding:
    """The codes of one attribute class (module docstring, "Keys"). Equal codes for values
    the per-tuple engine finds equal (Python's ``==``), whatever the columns' types:

    * "int": integers and booleans, or one time type (exact, as int64);
    * "time": timestamps of several units, as int64 counts of the finest unit, a value
      beyond its range never joining (``encode``); "date": date32 and date64, as days (a
      date64's time of day is not part of its date);
    * "float": floats, or floats and integers, as the bits of the float64 value (-0.0 as
      0.0, NaN never joins); with integers too, matches are checked on the values
      exactly (``check``: an integer beyond 2**53 rounds to a float it does not equal);
    * "hash": anything else, as a 64-bit hash whose matches are checked on the values:
      pandas' hash of the values for one type, Python's own ``hash`` for several
      (decimals with integers, floats or decimals of another scale: Python's hash is equal
      for numbers that compare equal, and pandas' is not)."""

    def __init__(self, types: Sequence[pa.DataType]):
        ints = all(pa.types.is_integer(t) or pa.types.is_boolean(t) for t in types)
        big = any(t == pa.uint64() for t in types)
        numbers = all(pa.types.is_integer(t) or pa.types.is_floating(t)
                      or pa.types.is_boolean(t) for t in types)
        same_time = len(set(types)) == 1 and storage_type(types[0]) is not None
        self.check = False      # matches are checked on the values
        self.pyhash = False     # codes from Python's hash (several types)
        self.finest = 1         # "time": nanoseconds per unit of the finest unit
        if (ints and not big) or same_time:
            self.kind = "int"
        elif all(pa.types.is_timestamp(t) for t in types):
            self.kind = "time"
            self.finest = min(UNITS[t.unit] for t in types)
        elif all(pa.types.is_date(t) for t in types):
            self.kind = "date"
        elif numbers and not big:
            self.kind = "float"
            self.check = not all(pa.types.is_floating(t) for t in types)
        else:
            self.kind = "hash"
            self.check = True
            self.pyhash = len(set(types)) > 1

    def encode(self, values: np.ndarray, mask: np.ndarray,
               t: pa.DataType | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(int64 codes, NULL mask: rows whose value never joins) of a column of type
        ``t`` (needed by "time" and "date")."""
        if self.kind == "int":
            return values.astype(np.int64, copy=False), mask
        if self.kind == "time":
            factor = UNITS[t.unit] // self.finest
            v = values.astype(np.int64, copy=False)
            if factor > 1:
                # A value beyond the finest unit's int64 range (seconds past 2262 beside
                # nanoseconds) equals no value of the finest column, and a result holds one
                # value in every column of the class: it joins nothing, and is marked so
                # (its code, wrapped past int64, is never looked at).
                far = (np.abs(v) > NS_MAX // factor) | (v == np.iinfo(np.int64).min)
                with np.errstate(over="ignore"):
                    v = v * factor
                mask = mask | far
            return v, mask
        if self.kind == "date":
            v = values.astype(np.int64, copy=False)
            return (v // _MS_PER_DAY if pa.types.is_date64(t) else v), mask
        if self.kind == "float":
            f = values.astype(np.float64) + 0.0  # -0.0 + 0.0 is 0.0: one code for zero
            return f.view(np.int64), mask | np.isnan(f)
        obj = values if values.dtype == object else values.astype(object)
        if self.pyhash:
            # (one Python call per value: only classes mixing types come here)
            codes = np.fromiter((hash(x) for x in obj), np.int64, len(obj))
            return codes, mask
        import pandas as pd
        try:
            codes = pd.util.hash_array(obj, categorize=False).view(np.int64)
        except TypeError as e:
            raise OptionError(f"the vectorized executor cannot key a join on these values "
                              f"({e}); use --executor mjoin") from None
        return codes, mask


def unsupported_keys(query: LogicalQuery, types: Mapping[tuple[str, str], pa.DataType]
                     ) -> str | None:
    """Why the vectorized executor cannot join on ``query``'s attribute classes with these
    column types (None: it can): a date and a timestamp are never equal to the per-tuple
    engine (Python's ``==``), and their integer storage would make them equal here."""
    for cls in query.classes:
        ts = [c for c in cls if pa.types.is_timestamp(types.get((c.stream, c.column),
                                                                 pa.null()))]
        dates = [c for c in cls if pa.types.is_date(types.get((c.stream, c.column),
                                                               pa.null()))]
        if ts and dates:
            return (f"the join of {ts[0]} (a timestamp) with {dates[0]} (a date) never "
                    "matches (a date is not equal to any timestamp); the per-tuple engine "
                    "runs it")
    return None


def _combine(codes: Sequence[np.ndarray]) -> np.ndarray:
    """One int64 code for a several-column key (a mix; matches are checked per column)."""
    if len(codes) == 1:
        return codes[0]
    with np.errstate(over="ignore"):
        h = codes[0].view(np.uint64).copy()
        for c in codes[1:]:
            h = h * _MIX + c.view(np.uint64)
    return h.view(np.int64)


# ----- a window as columns ---------------------------------------------------------------------
class _Columns:
    """Growable parallel numpy arrays with a movable front (appends amortized O(1))."""

    def __init__(self, dtypes: Mapping[str, np.dtype]):
        self.cap = 1024
        self.start = self.stop = 0
        self.data = {k: np.empty(self.cap, dt) for k, dt in dtypes.items()}

    def __len__(self) -> int:
        return self.stop - self.start

    def view(self, name: str) -> np.ndarray:
        return self.data[name][self.start:self.stop]

    def append(self, cols: Mapping[str, np.ndarray], n: int) -> None:
        if self.stop + n > self.cap:
            live = self.stop - self.start
            cap = max(1024, 2 * (live + n))
            for k, a in self.data.items():
                b = np.empty(cap, a.dtype) if cap > self.cap else a
                b[:live] = a[self.start:self.stop]
                self.data[k] = b
            self.cap = max(cap, self.cap)
            self.start, self.stop = 0, live
        for k, a in cols.items():
            self.data[k][self.stop:self.stop + n] = a
        self.stop += n

    def trim(self, k: int) -> None:
        self.start += k

    def keep(self, mask: np.ndarray) -> None:
        for a in self.data.values():
            live = a[self.start:self.stop][mask]
            a[:len(live)] = live
        self.start, self.stop = 0, int(mask.sum())


class ColumnWindow:
    """One stream's window as columns in arrival order (module docstring). A row's *sid*
    is its number among the rows ever stored (``base`` is the first live one's)."""

    def __init__(self, alias: str, kind: str, size, columns: Mapping[str, Values],
                 codings: Mapping[str, KeyCoding], ts_dtype, explicit: bool):
        self.alias, self.kind, self.size = alias, kind, size
        self.values = dict(columns)
        self.codings = dict(codings)
        self.explicit = explicit  # rows may leave from the middle (explicit deletions)
        dtypes = {"ins": np.int64, "del": np.int64, "dts": ts_dtype, "ts": ts_dtype,
                  "cnt": np.int64}
        for c, v in self.values.items():
            dtypes["v:" + c] = v.dtype
            dtypes["m:" + c] = np.bool_
        for c in self.codings:
            dtypes["c:" + c] = np.int64
            dtypes["n:" + c] = np.bool_
        self.cols = _Columns(dtypes)
        self.base = 0          # sid of the first live row
        self.dead = 0          # rows marked deleted (explicit deletions), not yet compacted
        self.indexes: dict[tuple[str, ...], RunIndex] = {}

    def __len__(self) -> int:
        return len(self.cols)

    @property
    def end(self) -> int:
        """The sid the next stored row gets."""
        return self.base + len(self.cols)

    def col(self, name: str) -> np.ndarray:
        return self.cols.view(name)

    def append(self, table: pa.Table, ts: np.ndarray, cnt: np.ndarray, ins: np.ndarray) -> None:
        n = len(ts)
        cols = {"ins": ins, "del": np.full(n, INF, np.int64), "dts": ts, "ts": ts, "cnt": cnt}
        for c, v in self.values.items():
            cols["v:" + c], cols["m:" + c] = v.to_numpy(table.column(c))
        for c, coding in self.codings.items():
            if "v:" + c in cols:
                v, m = cols["v:" + c], cols["m:" + c]
            else:  # a key column the output does not need: codes only
                v, m = Values(table.schema.field(c).type).to_numpy(table.column(c))
            cols["c:" + c], cols["n:" + c] = coding.encode(v, m, table.schema.field(c).type)
        self.cols.append(cols, n)

    def lo_hi(self, p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per position p, the sid range [lo, hi) holding every row present at p (for an
        unbounded window with explicit deletions, a superset: test ``del > p`` too)."""
        hi = np.searchsorted(self.col("ins"), p, "left")
        if self.explicit or self.kind == "unbounded":
            lo = np.zeros_like(hi)
        else:
            lo = np.searchsorted(self.col("del"), p, "right")
        return lo + self.base, hi + self.base

    def index(self, key: tuple[str, ...]) -> RunIndex:
        ix = self.indexes.get(key)
        if ix is None:
            ix = self.indexes[key] = RunIndex(key)
        ix.refresh(self)
        return ix

    def key_codes(self, key: Sequence[str], lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        """Combined codes and the NULL mask of rows with sids [lo, hi) on columns ``key``."""
        a, b = lo - self.base, hi - self.base
        codes = [self.col("c:" + c)[a:b] for c in key]
        null = np.zeros(b - a, bool)
        for c in key:
            null |= self.col("n:" + c)[a:b]
        return _combine(codes), null

    def drop_front(self, k: int) -> None:
        if k:
            self.cols.trim(k)
            self.base += k

    def compact(self) -> np.ndarray | None:
        """Drop rows marked deleted when they are many; returns old local index -> new
        (or None when nothing moved). Indexes are rebuilt on their next use."""
        if self.dead < 1024 or self.dead * 2 < len(self.cols):
            return None
        alive = self.col("del") == INF
        remap = np.cumsum(alive) - 1
        self.cols.keep(alive)
        self.dead = 0
        self.indexes.clear()
        return np.where(alive, remap, -1)

    def nbytes(self) -> int:
        per_row = sum(a.dtype.itemsize for a in self.cols.data.values())
        return per_row * len(self.cols)


_RADIX_ROWS = 1024  # from about this many rows on, _stable_order beats a comparison sort


def _stable_order(off: np.ndarray, span: int) -> np.ndarray:
    """The stable permutation sorting ``off`` (uint64, at most ``span``): an LSD radix sort
    on 16-bit digits, least significant first, each one numpy's stable sort of a uint16
    array, which is a counting radix sort (linear) where its sorts of int64 compare, with
    no SIMD sort for them on our machines. Building an index run (``_Run``) of 8,700 codes
    spanning 100,000 (the chain of issue 16): 90 µs against 210 µs for ``comb.sort()``;
    hashed codes (four digits) 180 µs against 370 µs for a stable argsort."""
    order = np.argsort(off.astype(np.uint16), kind="stable")
    shift = 16
    while span >> shift:
        digit = (off[order] >> np.uint64(shift)).astype(np.uint16)
        order = order[np.argsort(digit, kind="stable")]
        shift += 16
    return order


class _Run:
    """Rows with sids in [s0, s0 + L), sorted by (key code, sid), so that one binary search
    finds (code, sid bound): ``comb`` is sorted and encodes both. When the codes span a
    small enough range (most integer keys), ``comb`` = (code − cmin) × L + (sid − s0)
    directly ("direct": two searches per probe); else comb = rank of the code × L + (sid −
    s0), the rank found by a search of ``code`` (three)."""

    __slots__ = ("L", "bits", "cmax", "cmin", "code", "comb", "direct", "rank", "s0", "sid")

    def __init__(self, s0: int, s1: int, code: np.ndarray, sid: np.ndarray):
        """``code``, ``sid`` of the rows (NULL keys left out), in sid order."""
        self.s0, self.L = s0, max(1, s1 - s0)
        n = len(code)
        cmin = int(code.min()) if n else 0
        cmax = int(code.max()) if n else 0
        self.cmin, self.cmax = cmin, cmax
        self.direct = (cmax - cmin + 1) * self.L < 2 ** 62
        # A bitmap of the codes present, when their range is small: a membership test is
        # then one lookup, not a binary search (``has``).
        self.bits = None
        # code − cmin, wrapping in uint64 (exact: the span is below 2^64)
        off = code.view(np.uint64) - np.uint64(cmin % 2 ** 64)
        if n and cmax - cmin < max(1 << 16, 16 * n):
            self.bits = np.zeros(cmax - cmin + 1, bool)
            self.bits[off] = True
        if self.direct:
            comb = off.view(np.int64) * self.L + (sid - s0)
            if n >= _RADIX_ROWS:
                comb = comb[_stable_order(off, cmax - cmin)]
            else:
                comb.sort()  # unique values: any sort is stable
            self.comb = comb
            self.code = self.rank = self.sid = None
            return
        # within a code, sids stay ascending (a stable order)
        order = (_stable_order(off, cmax - cmin) if n >= _RADIX_ROWS
                 else np.argsort(code, kind="stable"))
        self.code, self.sid = code[order], sid[order]
        rank = np.zeros(n, np.int64)
        if n > 1:
            np.cumsum(self.code[1:] != self.code[:-1], out=rank[1:])
        self.rank = rank
        self.comb = rank * self.L + (self.sid - s0)

    @classmethod
    def of(cls, win: ColumnWindow, key: tuple[str, ...], s0: int, s1: int) -> _Run:
        code, null = win.key_codes(key, s0, s1)
        sid = np.arange(s0, s1, dtype=np.int64)
        if null.any():
            keep = ~null
            code, sid = code[keep], sid[keep]
        return cls(s0, s1, code, sid)

    def has(self, q: np.ndarray) -> np.ndarray:
        """Per code of q: whether this run holds a row with it (any sid)."""
        n = len(self.comb)
        if self.bits is not None:
            ok = (q >= self.cmin) & (q <= self.cmax)
            ok[ok] = self.bits[q[ok] - self.cmin]
            return ok
        if self.direct:
            ok = (q >= self.cmin) & (q <= self.cmax)
            r0 = np.where(ok, q - self.cmin, 0) * self.L
            a = np.searchsorted(self.comb, r0, "left")
            return ok & (a < n) & (self.comb[np.minimum(a, n - 1)] < r0 + self.L)
        g = np.searchsorted(self.code, q, "left")
        return (g < n) & (self.code[np.minimum(g, n - 1)] == q)

    def __len__(self) -> int:
        return len(self.comb)

    @property
    def s1(self) -> int:
        return self.s0 + self.L

    def bounds(self, q: np.ndarray, lo: np.ndarray, hi: np.ndarray):
        """(j, a, b): the rows with code q[j] and sid in [lo[j], hi[j]) are ``comb[a:b]``
        (element-wise), or None; counted before ``take`` builds them (``step_limit``)."""
        n = len(self.comb)
        if not len(q):
            return None
        if self.direct:
            if int(q.min()) >= self.cmin and int(q.max()) <= self.cmax:
                j = None  # every probe's code is in the run's range: no selection
                r0 = (q - self.cmin) * self.L
            else:
                j = np.flatnonzero((q >= self.cmin) & (q <= self.cmax))
                if not len(j):
                    return None
                r0 = (q[j] - self.cmin) * self.L
        else:
            g = np.searchsorted(self.code, q, "left")
            gc = np.minimum(g, n - 1)
            j = np.flatnonzero((g < n) & (self.code[gc] == q))
            if not len(j):
                return None
            r0 = self.rank[gc[j]] * self.L
        if j is not None:
            lo, hi = lo[j], hi[j]
        s0, s1 = self.s0, self.s1
        if int(lo.min()) >= s0 and int(hi.max()) <= s1:  # the bands lie inside the run
            t_lo, t_hi = r0 + (lo - s0), r0 + (hi - s0)
        else:
            t_lo = r0 + np.clip(lo - s0, 0, self.L)
            t_hi = r0 + np.clip(hi - s0, 0, self.L)
        comb = self.comb
        a = np.searchsorted(comb, t_lo, "left")
        # Most probes of a selective join find nothing: test the first candidate before
        # searching for the end of the range.
        hit = np.flatnonzero((a < n) & (comb[np.minimum(a, n - 1)] < t_hi))
        if len(hit) < len(a):
            a, t_hi = a[hit], t_hi[hit]
            j = hit if j is None else j[hit]
        elif j is None:
            j = np.arange(len(a))
        return j, a, np.searchsorted(comb, t_hi, "left")

    def take(self, j: np.ndarray, a: np.ndarray, b: np.ndarray):
        """(probe index, sid) of each row ``bounds`` found."""
        jj, at = _expand(j, a, b - a)
        if self.direct:
            return jj, self.comb[at] % self.L + self.s0
        return jj, self.sid[at]


class RunIndex:
    """A hash-free index of one window on ``key`` columns: log-structured sorted runs."""

    def __init__(self, key: tuple[str, ...]):
        self.key = key
        self.runs: list[_Run] = []
        self.covered = 0  # sids below this are in runs (or gone)
        self.found = 1.0  # running fraction of probes whose code is here (``candidates``)
        self._hit_rate = 1.0  # matches per probe of the last probe (capped at 1)
        self._probes = 0  # probes of the last ``bounds``

    def refresh(self, win: ColumnWindow) -> None:
        """Drop the runs that left the window and index the rows stored since: a new run,
        merged with the runs before it while one is no larger than twice the next. A
        merge is decided on the runs' sizes first and then built at once from the
        window's columns (the rows of consecutive runs are one range of sids), so a
        batch sorts its rows once instead of sorting them and then merging runs."""
        runs = [r for r in self.runs if r.s1 > win.base]
        self.covered = max(self.covered, win.base)
        if self.covered < win.end:
            size = win.end - self.covered
            first = self.covered
            while runs and len(runs[-1]) - max(0, win.base - runs[-1].s0) <= 2 * size:
                old = runs.pop()
                size += len(old)
                first = max(old.s0, win.base)
            runs.append(_Run.of(win, self.key, first, win.end))
            self.covered = win.end
        self.runs = runs

    def candidates(self, q: np.ndarray) -> np.ndarray | None:
        """The probes whose code is in the index at all (any arrival), when most are not
        (a selective join: measured on the earlier probes, ``found``); None otherwise, when
        the test would cost more than it saves. The window band is then computed only for
        these (``ColumnWindow.lo_hi``)."""
        if self.found > 0.5 or not len(q):
            # untested probes: the last probe's matches per probe stand in for the fraction
            self.found = 0.9 * self.found + 0.1 * self._hit_rate
            return None
        mask = np.zeros(len(q), bool)
        for run in self.runs:
            if len(run):
                mask |= run.has(q)
        some = np.flatnonzero(mask)
        self.found = 0.9 * self.found + 0.1 * (len(some) / len(q))
        return some

    def bounds(self, q: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> list[tuple]:
        """Per run, where its rows with code ``q[j]`` and sid in [lo[j], hi[j]) lie
        (``_Run.bounds``): ``rows`` counts them and ``take`` builds them, so that a join
        step too large for ``step_limit`` is split before any of it is built."""
        found = []
        for run in self.runs:
            if len(run):
                got = run.bounds(q, lo, hi)
                if got is not None and len(got[0]):
                    found.append((run, *got))
        self._probes = len(q)
        return found

    @staticmethod
    def rows(found: list[tuple]) -> int:
        return sum(int((b - a).sum()) for _, _, a, b in found)

    @staticmethod
    def per_probe(found: list[tuple], n: int) -> np.ndarray:
        """Rows per probe (of ``n``), for choosing where to split the updates."""
        rows = np.zeros(n, np.int64)
        for _, j, a, b in found:
            np.add.at(rows, j, b - a)
        return rows

    def take(self, found: list[tuple]) -> tuple[np.ndarray, np.ndarray]:
        """(probe index, sid) of the rows ``bounds`` found."""
        outs_j, outs_s = [], []
        for run, j, a, b in found:
            jj, sid = run.take(j, a, b)
            if len(jj):
                outs_j.append(jj)
                outs_s.append(sid)
        self._hit_rate = min(1.0, sum(len(x) for x in outs_j) / max(1, self._probes))
        if not outs_j:
            return np.empty(0, np.int64), np.empty(0, np.int64)
        if len(outs_j) == 1:
            return outs_j[0], outs_s[0]
        return np.concatenate(outs_j), np.concatenate(outs_s)


def _ledger_types_ok(schema: pa.Schema) -> bool:
    """Whether rows of ``schema`` compare in Arrow as Python compares the per-tuple
    engine's rows (``continuous.row_key``): scalars whose equality is their value's
    (numbers, booleans, strings, bytes, times, decimals); NULL equals NULL (``None is
    None``), -0.0 equals 0.0, NaN equals NaN (``row_key`` makes every NaN one key). Nested
    and dictionary values keep the per-row matching."""
    t = pa.types
    return all(t.is_integer(f.type) or t.is_floating(f.type) or t.is_boolean(f.type)
               or t.is_string(f.type) or t.is_large_string(f.type) or t.is_binary(f.type)
               or t.is_large_binary(f.type) or t.is_timestamp(f.type) or t.is_date(f.type)
               or t.is_time(f.type) or t.is_duration(f.type) or t.is_decimal(f.type)
               for f in schema)


def _row_codes(table: pa.Table) -> np.ndarray:
    """A code per row of ``table``, equal exactly for rows equal as Python tuples (see
    ``_ledger_types_ok``): each column dictionary-encoded (NULL its own code), the codes
    combined column by column and made dense again. Every NaN is one value, whatever its
    sign and payload bits, as ``row_key`` has it."""
    import pyarrow.compute as pc
    n = table.num_rows
    code = np.zeros(n, np.int64)
    for col in table.columns:
        col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
        enc = pc.dictionary_encode(_value_equal(col))
        c = to_numpy(enc.indices.cast(pa.int64()).fill_null(-1), null=False)
        code = code * (len(enc.dictionary) + 1) + (c + 1)
        code = np.unique(code, return_inverse=True)[1].astype(np.int64, copy=False)
    return code


class _Ledger:
    """An explicit-deletion stream's arrivals still there (docs/vector.md, "Explicit
    deletions"), oldest first, as columns: their values and their sids (-1: the row failed
    its selection, so its deletion deletes nothing). A deletion takes the oldest equal row;
    one that finds none is rejected. Matched a batch at a time: the FIFO queue of each
    distinct row is a reflected walk (queue length = S_t − min(0, min S), S the running sum
    of its insertions and deletions from its length before the batch), so a deletion is
    rejected where S reaches a new minimum below zero, and the j-th accepted deletion of a
    row takes the j-th entry pushed for it (the ledger's, then the batch's insertions).
    Entries taken are marked dead and dropped when they are half of the ledger."""

    def __init__(self, names: Sequence[str]):
        self.names = list(names)
        self.parts: list[pa.Table] = []
        self.sids = np.empty(0, np.int64)
        self.alive = np.empty(0, bool)
        self.dead = 0

    def __len__(self) -> int:
        return len(self.sids)

    def table(self) -> pa.Table | None:
        if not self.parts:
            return None
        if len(self.parts) > 64:  # a chunked table of many small chunks: gather them
            self.parts = [pa.concat_tables(self.parts).combine_chunks()]
        return self.parts[0] if len(self.parts) == 1 else pa.concat_tables(self.parts)

    def push(self, table: pa.Table, sids: np.ndarray) -> None:
        if table.num_rows:
            self.parts.append(table.select(self.names))
            self.sids = np.concatenate([self.sids, sids])
            self.alive = np.concatenate([self.alive, np.ones(len(sids), bool)])

    def take(self, at: np.ndarray) -> None:
        """Entries at these positions leave (the positions stay valid until ``compact``)."""
        self.alive[at] = False
        self.dead += len(at)

    def compact(self) -> None:
        if self.dead * 2 <= len(self.sids):
            return
        t = self.table()
        self.parts = [t.filter(from_numpy(self.alive))] if self.alive.any() else []
        self.sids = self.sids[self.alive]
        self.alive = np.ones(len(self.sids), bool)
        self.dead = 0

    def candidates(self, batch: pa.Table) -> np.ndarray:
        """Positions of the live entries whose every value occurs in ``batch``'s column:
        only these can equal a row of the batch (a hash probe per value, in Arrow)."""
        import pyarrow.compute as pc
        old = self.table()
        if old is None:
            return np.empty(0, np.int64)
        mask = self.alive.copy()
        for name in self.names:
            col, values = _value_equal(old.column(name)), _value_equal(batch.column(name))
            found = pc.is_in(col, value_set=values.combine_chunks()
                             if isinstance(values, pa.ChunkedArray) else values,
                             skip_nulls=False)
            mask &= to_numpy(found.combine_chunks() if isinstance(found, pa.ChunkedArray)
                             else found, null=False)
        return np.flatnonzero(mask)

    def match(self, table: pa.Table, ins: np.ndarray):
        """Match a batch of arrivals (``table`` in arrival order, ``ins``: insertion, else
        deletion) against the ledger and each other: (rejected, taken) per arrival, where
        ``taken`` is, for an accepted deletion, the entry it takes: its position in the
        ledger, or len(ledger) + the batch position of an insertion of this batch (-1
        otherwise)."""
        m, n = len(self), table.num_rows
        batch = table.select(self.names)
        cand = self.candidates(batch) if m else np.empty(0, np.int64)
        mc = len(cand)
        both = batch if not mc else pa.concat_tables([self.table().take(from_numpy(cand)),
                                                      batch])
        codes = _row_codes(both)
        g_old, g = codes[:mc], codes[mc:]
        groups = int(codes.max(initial=-1)) + 1
        c0 = np.bincount(g_old, minlength=groups)
        order = np.lexsort((np.arange(n), g))        # the batch by (row, arrival)
        gs = g[order]
        x = np.where(ins[order], 1, -1).astype(np.int64)
        start = np.ones(n, bool)
        start[1:] = gs[1:] != gs[:-1]
        seg = np.cumsum(start) - 1
        csum = np.cumsum(x)
        before = (csum - x)[start]                   # the running sum at each row's start
        walk = c0[gs] + csum - before[seg]           # S_t
        big = 2 * (mc + n) + 2                       # S spans [-n, mc + n]
        shifted = walk - seg * big                   # later rows lower: cummin restarts
        low = np.minimum.accumulate(shifted) + seg * big
        prev = np.empty(n, np.int64)                 # min(0, min S before t) in its row
        prev[1:] = low[:-1]
        prev[start] = 0
        np.minimum(prev, 0, out=prev)
        rejected_sorted = (x < 0) & (walk < prev)
        accepted = (x < 0) & ~rejected_sorted
        # rank of each accepted deletion among its row's, and of each push among its row's
        rank_del = _ranks(accepted, start, seg)
        push_batch = x > 0
        rank_push = c0[gs] + _ranks(push_batch, start, seg)
        old_rank = np.empty(mc, np.int64)
        if mc:
            o = np.argsort(g_old, kind="stable")
            so = g_old[o]
            first = np.ones(mc, bool)
            first[1:] = so[1:] != so[:-1]
            old_rank[o] = _ranks(np.ones(mc, bool), first, np.cumsum(first) - 1)
        width = mc + n + 1
        push_key = np.concatenate([g_old * width + old_rank,
                                   gs[push_batch] * width + rank_push[push_batch]])
        push_at = np.concatenate([cand, m + order[push_batch]])
        srt = np.argsort(push_key, kind="stable")
        want = gs[accepted] * width + rank_del[accepted]
        hit = np.searchsorted(push_key[srt], want)
        taken = np.full(n, -1, np.int64)
        taken[order[accepted]] = push_at[srt[hit]]
        rejected = np.zeros(n, bool)
        rejected[order] = rejected_sorted
        return rejected, taken


def _value_equal(col):
    """A column whose values Arrow's hashing finds equal exactly when ``row_key`` has them
    equal: for floats, -0.0 made 0.0 (-0.0 + 0.0 is 0.0) and every NaN one NaN, whatever
    its sign and payload bits (half floats widened to float32, exactly, since Arrow has no
    arithmetic on them); other columns as they are."""
    if not pa.types.is_floating(col.type):
        return col
    import pyarrow.compute as pc
    if pa.types.is_float16(col.type):
        col = col.cast(pa.float32())
    col = pc.add(col, pa.scalar(0.0, col.type))
    return pc.if_else(pc.is_nan(col), pa.scalar(float("nan"), col.type), col)


def _ranks(flag: np.ndarray, start: np.ndarray, seg: np.ndarray) -> np.ndarray:
    """Per position, how many flagged positions come before it in its segment (rows
    grouped in segments: ``start`` marks each one's first, ``seg`` numbers them); the rank
    of a flagged position among its segment's."""
    c = np.cumsum(flag)
    return c - flag - (c - flag)[start][seg]


def _pairs_present(w: ColumnWindow, p: np.ndarray) -> float:
    """Σ over the positions p of the rows of w present there (σ's denominator), from at
    most 256 of them (a sample: the band of every probe is not always computed)."""
    if not len(p):
        return 0.0
    step = max(1, len(p) // 256)
    lo, hi = w.lo_hi(p[::step])
    return float((hi - lo).mean()) * len(p)


class _Updates:
    """The updates of one batch as they are found: per group, its sort key (arrival k,
    phase 0 time expiry / 1 count or explicit deletion / 2 insertion, expiry time e, tie by
    arrival; scalars broadcast) and what it does (kind, stream, sids, deletion times). The
    time expiries and the others are listed apart, as ``_update_ranks`` ranks them: no pass
    over the whole batch's updates to split them by phase, and no e or tie for the others."""

    def __init__(self, time_dtype):
        self.dtype = time_dtype
        self.k, self.phase, self.what = [], [], []              # phases 1 and 2
        self.ek, self.e, self.tie, self.e_what = [], [], [], []  # phase 0

    def add(self, k, phase, e, tie, kind, i, sids, extra=None) -> None:
        m = len(sids)
        k = np.broadcast_to(np.asarray(k, np.int64), (m,))
        if phase == 0:
            self.ek.append(k)
            self.e.append(np.broadcast_to(np.asarray(e, self.dtype), (m,)))
            self.tie.append(np.broadcast_to(np.asarray(tie, np.int64), (m,)))
            self.e_what.append((kind, i, sids, extra))
        else:
            self.k.append(k)
            self.phase.append(np.full(m, phase, np.int8))
            self.what.append((kind, i, sids, extra))

    def __len__(self) -> int:
        return len(self.what) + len(self.e_what)

    def plan(self) -> tuple:
        """(k, phase, ek, e, tie, what), as ``VectorJoin._run`` takes them: the keys of
        the others, then of the time expiries; ``what`` lists the others' groups first,
        the order of ``_update_ranks``' ranks."""
        def cat(parts, dtype):
            return np.concatenate(parts) if parts else np.empty(0, dtype)
        return (cat(self.k, np.int64), cat(self.phase, np.int8), cat(self.ek, np.int64),
                cat(self.e, self.dtype), cat(self.tie, np.int64), self.what + self.e_what)


class _TooLarge(Exception):
    """A join step would build more rows than its range has left of ``step_limit``: the
    positions of its probes and the rows each would build, where to split the range."""

    def __init__(self, pos: np.ndarray, rows: np.ndarray):
        super().__init__()
        self.pos, self.rows = pos, rows


class _Ranges:
    """The position ranges [lo, hi) in which a batch's driving updates (positions ``p``)
    are joined, one at a time: the next ``size`` updates (``size`` may change from one
    range to the next), or first the pieces of a range split by ``split``."""

    def __init__(self, p: np.ndarray):
        self.p, self.k, self.sorted = p, 0, False
        self.pieces: list[tuple[int, int]] = []

    def next(self, size: int) -> tuple[int, int] | None:
        if self.pieces:
            return self.pieces.pop(0)
        p, n = self.p, len(self.p)
        if self.k >= n:
            return None
        if self.k == 0 and n <= size:  # one range: no need to order the positions
            self.k = n
            return int(p.min()), int(p.max()) + 1
        if not self.sorted:
            # The drivers' positions come as one ascending run per pipeline: a stable sort
            # (timsort) merges such runs in linear time, where numpy's default sort does not.
            self.p = p = np.sort(p, kind="stable")
            self.sorted = True
        k, self.k = self.k, min(self.k + size, n)
        return int(p[k]), int(p[self.k]) if self.k < n else int(p[-1]) + 1

    def split(self, lo: int, hi: int, pos: np.ndarray, rows: np.ndarray, target: int) -> None:
        """Put [lo, hi) back as pieces of about ``target`` rows each, by the ``rows`` that
        probes at positions ``pos`` (at two or more positions) would build: a cut where
        the rows before a probe pass a multiple of ``target``, and before and after a probe
        that builds ``target`` alone; at least one cut, so every piece is smaller."""
        order = np.argsort(pos, kind="stable")
        pos, rows = pos[order], rows[order]
        bucket = (np.cumsum(rows) - rows) // max(1, target)
        at = np.flatnonzero(np.diff(bucket) > 0) + 1
        big = np.flatnonzero(rows >= target)
        cuts = np.unique(np.concatenate([pos[at], pos[big], pos[np.minimum(big + 1,
                                                                           len(pos) - 1)]]))
        cuts = cuts[(cuts > lo) & (cuts < hi)]
        if not len(cuts):  # (rows of one position, or few): halve the positions
            distinct = np.unique(pos)
            cuts = distinct[len(distinct) // 2:len(distinct) // 2 + 1]
        edges = [lo, *(int(c) for c in cuts), hi]
        self.pieces[:0] = list(itertools.pairwise(edges))


def _update_ranks(k: np.ndarray, phase: np.ndarray, ek: np.ndarray, e: np.ndarray,
                  tie: np.ndarray) -> np.ndarray:
    """Each update's rank in the processing order: by (arrival k, phase, expiry time e,
    tie), equal keys in the order listed; the others (count or explicit deletions and
    insertions: ``k``, ``phase``) first, then the time expiries (``ek``, ``e``, ``tie``), as
    ``_Updates`` lists them. Counting, not one big sort: at arrival k come its time expiries
    (phase 0, ranked among themselves by (k, e, tie)), then its count or explicit deletion
    (phase 1), then its insertion (phase 2); so an update's rank is its rank among its own
    kind plus the number of the other kind ordered before it. Only the expiries are sorted
    (by e alone when no two share a time, as is usual)."""
    no, ne = len(k), len(ek)
    if no + ne == 0:
        return np.empty(0, np.int64)
    nk = max(int(k.max(initial=-1)), int(ek.max(initial=-1))) + 1
    rank = np.empty(no + ne, np.int64)
    # the others by slot (k, phase 1 or 2), in the order listed within a slot
    slot = k * 2 + (phase - 1)
    occupied = np.bincount(slot, minlength=2 * nk)
    upto = np.zeros(2 * nk + 1, np.int64)  # others in the slots before slot s: upto[s]
    np.cumsum(occupied, out=upto[1:])
    if occupied.max(initial=0) <= 1:
        within = upto[slot]
    else:
        within = np.empty(no, np.int64)
        within[np.argsort(slot, kind="stable")] = np.arange(no, dtype=np.int64)
    expired_upto = np.cumsum(np.bincount(ek, minlength=nk))  # expiries at arrivals <= k
    np.add(within, expired_upto[k], out=rank[:no])
    if ne:
        order = np.argsort(e, kind="stable")
        se, sk = e[order], ek[order]
        if (se[1:] == se[:-1]).any() or (sk[1:] < sk[:-1]).any():
            order = np.lexsort((tie, e, ek))
        r = rank[no:]
        r[order] = np.arange(ne, dtype=np.int64)
        r += upto[2 * ek]  # the others at arrivals < k come before
    return rank


def _expand(j: np.ndarray, starts: np.ndarray, counts: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray]:
    """Ranges [starts[k], starts[k] + counts[k]) as (j[k] repeated, each position)."""
    counts = np.maximum(counts, 0)
    total = int(counts.sum())
    if total == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    if total == len(counts) and counts.max() <= 1:  # one position each (a key join)
        return j, starts
    rep = np.repeat(np.arange(len(counts)), counts)
    ends = np.cumsum(counts)
    at = np.arange(total, dtype=np.int64) - (ends - counts)[rep] + starts[rep]
    return j[rep], at


# ----- the executor --------------------------------------------------------------------------
@dataclass
class _Step:
    """One join of a pipeline: stream ``stream`` probed on its columns ``key`` with the
    prefix columns ``refs`` (empty: a cartesian step); ``check``: verify matches per column
    (a several-column key or a hashed class)."""

    stream: str
    key: tuple[str, ...]
    refs: tuple[ColumnRef, ...]
    check: bool


class VectorJoin:
    """Windows, selections and the vectorized MJoin of one query (module docstring).

    ``schemas``: per alias, the Arrow schema of its rows (``query.columns[alias]``).
    ``process_batch(ArrivalBatch)`` returns the output as an Arrow table (the SELECT columns,
    ``_sign`` int8, ``_ts`` in engine time units); ``process`` takes and returns rows as
    ``ContinuousQuery.process`` does.
    """

    name = "vector"

    def __init__(self, query: LogicalQuery, mode: str = "append",
                 schemas: Mapping[str, pa.Schema] | None = None, time_unit: float = 1.0,
                 explicit_deletions: bool = False, orders: Mapping | None = None,
                 ts_dtype=np.int64):
        from adaptcq.engine.continuous import MODES
        from adaptcq.query.expr import compile_predicate

        if mode not in MODES:
            raise OptionError(f"unknown mode {mode!r}; choose append or retract")
        reason = unsupported(query)
        if reason:
            raise OptionError(f"the vectorized executor cannot run this query: {reason}")
        if schemas is None:
            raise OptionError("VectorJoin needs the streams' Arrow schemas")
        self.query, self.mode = query, mode
        self.aliases = query.aliases
        self._index = {a: i for i, a in enumerate(self.aliases)}  # alias -> stream index
        self._steps: dict[tuple[str, tuple[str, ...]], list[_Step]] = {}
        self.schemas = dict(schemas)
        self.retract = mode == "retract"
        self.time_unit = time_unit
        self.explicit_deletions = bool(explicit_deletions)
        aliases = query.aliases
        self.selections = [
            compile_predicate(query.selections[a], query.columns[a], a, query.types)
            if query.selections.get(a) is not None else None for a in aliases]
        # The same selections over column batches, where they translate (query.arrow_expr;
        # imported only for a selection: it loads pyarrow.compute).
        self.column_selections: list = [None] * len(aliases)
        if any(sel is not None for sel in self.selections):
            from adaptcq.query.arrow_expr import arrow_predicate
            self.column_selections = [arrow_predicate(query.selections.get(a), a,
                                                      query.types.get(a))
                                      for a in aliases]
        types = {(a, c): _value_type(schemas[a].field(c).type)
                 for a in aliases for c in query.columns[a]}
        reason = unsupported_keys(query, types)
        if reason:
            raise OptionError(f"the vectorized executor cannot run this query: {reason}")
        self.codings: dict[ColumnRef, KeyCoding] = {}
        for cls in query.classes:
            coding = KeyCoding([types[(r.stream, r.column)] for r in sorted(
                cls, key=lambda r: (r.stream, r.column))])
            for r in cls:
                self.codings[r] = coding
        outputs = {ColumnRef(o.expr.table, o.expr.name) for o in query.outputs}
        self.windows: list[ColumnWindow] = []
        for s in query.streams:
            a = s.alias
            mine = {r.column: c for r, c in self.codings.items() if r.stream == a}
            needed = [c for c in query.columns[a]
                      if ColumnRef(a, c) in outputs or (c in mine and mine[c].check)]
            size = s.window.size
            if s.window.kind == "range":
                size = s.window.in_units(time_unit)
            self.windows.append(ColumnWindow(
                a, s.window.kind, size, {c: Values(types[(a, c)]) for c in needed}, mine,
                ts_dtype, explicit_deletions and s.window.kind == "unbounded"))
        self.outputs = [(aliases.index(o.expr.table), o.expr.name, Values(
            types[(o.expr.table, o.expr.name)])) for o in query.outputs]
        given = check_given_orders(aliases, orders, OptionError)  # (the one check: engine.rules)
        self.orders: dict[str, list[str]] = {
            a: given[a] if a in given else connected_order(query, a) for a in aliases}
        self.stats = Counters()
        self.next_pos = 0            # positions of updates (module docstring)
        self.counts = [0] * len(aliases)  # arrivals per stream (count windows)
        self.now = float("-inf")  # the time of the last arrival
        self.rejected_rows: list[tuple[int, float, tuple, str]] = []
        self.rejected_at: list[int] = []  # each rejected row's arrival index in its batch
        # Explicit deletions, per unbounded stream: its rows still there, oldest first, as
        # a _Ledger (columns) where Arrow's equality is Python's, else as a dict
        # row_key(row) -> sids of the equal rows (None for one that failed the selection).
        self.values: list[_Ledger | dict | None] = [
            None if not w.explicit else
            _Ledger(query.columns[w.alias]) if _ledger_types_ok(pa.schema(
                [self.schemas[w.alias].field(c) for c in query.columns[w.alias]])) else {}
            for w in self.windows]
        # σ per joined pair (z, y), measured at the steps where only z's columns key y
        # (stats.estimators.Ratio: matches per probe and window tuple, W recent batches)
        self.selectivity: dict[tuple[str, str], Ratio] = {}
        self.order_log: dict[str, dict[tuple[str, ...], int]] = {a: {} for a in aliases}
        self.observers: list = []    # fn(self) after each batch (adaptive ordering)
        # Memory (docs/vector.md, "Batching"): the updates of a batch are joined a range of
        # positions at a time, at most ``range_updates`` driving updates, sized so that the
        # range builds about step_limit / 2 rows (from the rows per update measured so far,
        # ``_per_update``); a join step that would build more than ``step_limit`` rows, its
        # range's earlier pipelines' results included, is split before it is built (one
        # update's own rows excepted). With ``emit`` set each range's output goes there at
        # once, so a batch never holds more than about ``step_limit`` rows of its output.
        self.range_updates = 65_536
        self.step_limit = 262_144
        self._per_update = 0.0
        self._held = self._peak = 0  # rows of the range: held in results, most at once
        self._sel_range: dict[tuple[str, str], list] = {}  # σ counts (``_pipeline``)
        self.emit = None

    # ----- plan ------------------------------------------------------------------------------
    def set_order(self, stream: str, order: Sequence[str]) -> None:
        """Re-order ``stream``'s pipeline; any order gives the same results (no join
        subresult is kept), so it may change between any two batches. A refused order
        (``engine.rules.check_order``) changes nothing."""
        self.orders[stream] = check_order(self.query.aliases, stream, order)

    def steps(self, stream: str) -> list[_Step]:
        key = (stream, tuple(self.orders[stream]))
        got = self._steps.get(key)
        if got is None:
            got = self._steps[key] = self._plan_steps(stream)
        return got

    def _plan_steps(self, stream: str) -> list[_Step]:
        q, prefix, out = self.query, [stream], []
        for s in self.orders[stream]:
            pairs = q.join_key(s, frozenset(prefix))
            key = tuple(c for c, _ in pairs)
            refs = tuple(r for _, r in pairs)
            check = len(key) > 1 or any(self.codings[ColumnRef(s, c)].check for c in key)
            out.append(_Step(s, key, refs, check))
            prefix.append(s)
        return out

    def describe(self) -> str:
        lines = []
        for a in self.query.aliases:
            lines.append(f"<vector pipeline Δ{a}: {'⋈'.join(self.orders[a]) or '∅'}>")
            for st in self.steps(a):
                how = (f"band join on {', '.join(st.key)} = "
                       f"{', '.join(map(str, st.refs))}" if st.key else "band (cartesian)")
                lines.append(f"  ⋈ {st.stream}: {how}" + (" (matches checked)" if st.check
                                                          else ""))
        return "\n".join(lines)

    def plan_state(self) -> dict:
        return {"orders": {a: list(o) for a, o in self.orders.items()}}

    @property
    def next_rid(self) -> int:
        """(ContinuousQuery's arrival counter; here the next update position.)"""
        return self.next_pos

    @property
    def executor(self) -> VectorJoin:
        """The executor (itself: windows, selections and joins are one object here)."""
        return self

    def sample(self, ts) -> None:
        """Record the state's size (as ContinuousQuery.sample, bounded the same way)."""
        from adaptcq.engine.continuous import MAX_SAMPLES
        st = self.stats
        tuples, nbytes = self.state_tuples(), self.state_bytes()
        st.samples.append((st.updates, ts, tuples, nbytes))
        st.peak_tuples = max(st.peak_tuples, tuples)
        st.peak_bytes = max(st.peak_bytes, nbytes)
        if len(st.samples) > MAX_SAMPLES:
            del st.samples[1::2]

    def peak_state(self) -> tuple[int, int]:
        st = self.stats
        return max(st.peak_tuples, self.state_tuples()), max(st.peak_bytes, self.state_bytes())

    def state_tuples(self) -> int:
        return sum(len(w) - w.dead for w in self.windows)

    def state_bytes(self) -> int:
        return sum(w.nbytes() for w in self.windows)

    # ----- the row interface (ContinuousQuery.process) -----------------------------------
    def process(self, streams, signs, timestamps, rows, schemas=None) -> list[tuple]:
        if not len(rows):
            return []
        batch = batch_from_rows(self.query, schemas or self.schemas, streams, signs,
                                timestamps, rows)
        out = self.process_batch(batch)
        return [tuple(r.values()) for r in out.to_pylist()]

    # ----- one batch -------------------------------------------------------------------------
    def process_batch(self, batch: ArrivalBatch, positions: bool = False,
                      emit: bool = True) -> pa.Table:
        """Every update of ``batch``, in order; the output rows, ordered by update (with a
        ``_pos`` column of update positions when ``positions``). ``emit=False`` brings the
        windows to where the batch leaves them without joining (a rebuild)."""
        if len(batch) == 0:
            return self._empty(positions)
        ts = batch.timestamps
        if ts[0] < self.now:
            raise ValueError(f"arrivals out of time order: {ts[0]} after {self.now}")
        pos0 = self.next_pos
        out = self._run(self._ingest(batch, pos0), pos0, positions, emit)
        self.now = ts[-1].item()  # a Python number: it goes into JSON summaries
        for fn in self.observers:
            fn(self)
        return out

    def advance_to(self, now, positions: bool = False, emit: bool = True) -> pa.Table:
        """Every time-window deletion due before ``now`` (``t + w < now``), as
        ``ContinuousQuery.advance_to``; their output (retract mode)."""
        n = len(self.windows)
        empty = np.empty(0, np.int64)
        self._fresh, self._fresh_k = [empty] * n, [empty] * n
        dt = self.windows[0].cols.data["ts"].dtype
        updates = _Updates(dt)
        self._time_expiries(np.empty(0, dt), np.asarray(now, dt), self.next_pos, updates.add)
        if not len(updates):
            return self._empty(positions)
        return self._run(updates.plan(), self.next_pos, positions, emit)

    def _run(self, plan, pos0: int, positions: bool, emit: bool) -> pa.Table:
        """Number the updates listed by ``plan`` (module docstring, "Updates and
        positions"), run the pipelines, and drop what left its window."""
        *keys, what = plan
        positions_all = pos0 + _update_ranks(*keys)
        self.next_pos = pos0 + len(positions_all)
        at = 0
        deleted: list[tuple[np.ndarray, np.ndarray]] = [
            (np.empty(0, np.int64), np.empty(0, np.int64)) for _ in self.windows]
        for kind, i, sids, extra in what:
            m = len(sids)
            p = positions_all[at:at + m]
            at += m
            w = self.windows[i]
            local = sids - w.base
            if kind == "ins":
                w.col("ins")[local] = p
            else:
                w.col("del")[local] = p
                w.col("dts")[local] = extra
                d_s, d_p = deleted[i]
                deleted[i] = (np.concatenate([d_s, sids]), np.concatenate([d_p, p]))
        out = self._join(deleted) if emit else self._empty(True)
        self._expire(deleted)
        self.stats.results += out.num_rows
        return out if positions else out.drop_columns(["_pos"])

    def _ingest(self, batch: ArrivalBatch, pos0: int):
        """Store the batch's rows (positions to be set) and list every update with its
        sort key (``_Updates``)."""
        st, ts, sg = batch.streams, batch.timestamps, batch.signs
        last = ts[-1]
        updates = _Updates(ts.dtype)
        add = updates.add
        self._fresh = []  # per stream: sids stored in this batch (insertion pipelines)
        self._fresh_k = []  # per stream: their arrivals' indices in the batch
        for i, w in enumerate(self.windows):
            idx = np.flatnonzero(st == i)
            table = batch.tables[i]
            start_sid = w.end
            if not len(idx):
                self._fresh.append(np.empty(0, np.int64))
                self._fresh_k.append(np.empty(0, np.int64))
                continue
            if table is None or table.num_rows != len(idx):
                raise ValueError(f"stream {w.alias}: {len(idx)} arrivals but "
                                 f"{0 if table is None else table.num_rows} rows")
            signs = None if sg is None else sg[idx]
            if signs is not None and (signs < 0).any():
                sids, k_in = self._explicit(i, idx, table, signs, ts, add)
                self._fresh.append(sids)
                self._fresh_k.append(k_in)
                continue
            passed = self._select(i, table)
            cnt = self.counts[i] + 1 + np.arange(len(idx), dtype=np.int64)
            self.counts[i] += len(idx)
            self.stats.arrivals += len(idx)
            keep = np.flatnonzero(passed)
            self.stats.filtered += len(idx) - len(keep)
            if self.values[i] is not None:  # explicit-deletion stream: remember values
                self._remember(i, table, passed, start_sid)
            if len(keep) < len(idx):
                table = table.take(from_numpy(keep))
            k_in = idx[keep]
            w.append(table, ts[k_in], cnt[keep], np.zeros(len(keep), np.int64))
            sids = np.arange(start_sid, w.end, dtype=np.int64)
            self._fresh.append(sids)
            self._fresh_k.append(k_in)
            self.stats.insertions += len(sids)
            add(k_in, 2, 0, 0, "ins", i, sids)
            if w.kind == "rows":  # count-window evictions by these arrivals
                self._evictions(i, idx, cnt, add, ts)
        self._time_expiries(ts, last, pos0, add)
        return updates.plan()

    def _time_expiries(self, ts: np.ndarray, last, pos0: int, add) -> None:
        """[RANGE w]: the rows with ``t + w < last`` (a prefix of each window) leave, each
        before the first arrival of ``ts`` later than its ``t + w``, in (t + w, arrival)
        order: the sort key ties by arrival (a row stored in this batch by its index)."""
        for i, w in enumerate(self.windows):
            if w.kind != "range" or not len(w):
                continue
            # (saturating: a time too close to the end of int64 for its window never
            # expires, rather than wrapping to a time long past)
            e = np.minimum(w.col("ts"), NS_MAX - w.size) + w.size
            m = int(np.searchsorted(e, last, "left"))
            if not m:
                continue
            e = e[:m]
            k = np.searchsorted(ts, e, "right")
            sids = np.arange(w.base, w.base + m, dtype=np.int64)
            # the rows stored before this batch (their insertion positions), then those
            # stored in it (a suffix of the window: their arrivals' indices)
            old = min(m, int(self._fresh[i][0]) - w.base) if len(self._fresh[i]) else m
            tie = np.empty(m, np.int64)
            tie[:old] = w.col("ins")[:old]
            tie[old:] = pos0 + self._fresh_k[i][:m - old]
            self.stats.deletions += m
            add(k, 0, e, tie, "del", i, sids, e)

    def load(self, batch: ArrivalBatch, expired_before=None) -> None:
        """The windows as ``process_batch(batch)`` and ``advance_to(expired_before)`` would
        leave them, without joining (a Spark group rebuilt or caught up from its stored
        rows: their results were emitted before). Rejections are not reported again."""
        n_rej = len(self.rejected_rows)
        results = self.stats.results
        if len(batch):
            self.process_batch(batch, emit=False)
        if expired_before is not None and np.isfinite(expired_before):
            self.advance_to(expired_before, emit=False)
        del self.rejected_rows[n_rej:]
        del self.rejected_at[n_rej:]
        self.stats.results = results

    def _select(self, i: int, table: pa.Table) -> np.ndarray:
        sel = self.selections[i]
        if sel is None:
            return np.ones(table.num_rows, bool)
        if self.column_selections[i] is not None:
            try:
                return self.column_selections[i](table)
            except (pa.ArrowNotImplementedError, pa.ArrowInvalid, pa.ArrowTypeError):
                # A type Arrow compute has no kernel for (a decimal against a float, say),
                # or arithmetic Python's integers would carry on (an int64 overflow): from
                # now on this stream's selection runs per row, as below.
                self.column_selections[i] = None
        # A selection Arrow compute does not express (timestamp literals, UDFs) runs per
        # row: the per-tuple engine's compiled predicate, the same logic.
        return np.fromiter((bool(sel(r)) for r in self._rows(i, table)), bool,
                           table.num_rows)

    def _rows(self, i: int, table: pa.Table, exact: bool = True):
        """Stream i's rows of ``table`` as the per-tuple engine's tuples (the per-row
        paths: selections Arrow compute cannot run, explicit deletions). A value Python
        cannot hold exactly is refused, naming its column (``merge.python_misfit``); with
        ``exact=False`` (rows only reported, as rejected) such a column is given as text."""
        cols = self.query.columns[self.query.aliases[i]]
        values = []
        for c in cols:
            col = table.column(c)
            why = python_misfit(col)
            if why is not None and exact:
                stream = self.query.streams[i]
                alias = f" (as {stream.alias})" if stream.alias != stream.source else ""
                raise InputError(
                    f"stream {stream.source}{alias}: column {c!r} ({col.type}) has a value "
                    f"{why}; this query's selection on it, or an explicit deletion, runs row "
                    "by row in Python values here")
            if why is None:
                values.append(col.to_pylist())
            else:
                try:
                    values.append(col.cast(pa.string()).to_pylist())
                except pa.ArrowException:  # (a nested column: no text; nothing reads it)
                    values.append([None] * len(col))
        return zip(*values)

    def _evictions(self, i: int, idx: np.ndarray, cnt: np.ndarray, add, ts) -> None:
        """[ROWS n]: the arrival numbered c + n of stream i deletes the row numbered c."""
        w = self.windows[i]
        n = int(w.size)
        c_all = w.col("cnt")
        m = int(np.searchsorted(c_all, self.counts[i] - n, "right"))  # cnt <= count - n
        if not m:
            return
        gone = c_all[:m]
        first = int(cnt[0])
        k = idx[gone + n - first]
        sids = np.arange(w.base, w.base + m, dtype=np.int64)
        self.stats.deletions += m
        add(k, 1, 0, 0, "del", i, sids, ts[k])

    def _remember(self, i: int, table: pa.Table, passed: np.ndarray, sid: int) -> None:
        """The values of an explicit-deletion stream's arrivals, for later deletions (a row
        that failed the selection is remembered as None: its deletion deletes nothing)."""
        store = self.values[i]
        if isinstance(store, _Ledger):
            sids = np.where(passed, sid + np.cumsum(passed) - 1, -1).astype(np.int64)
            store.push(table, sids)
            return
        for r, ok in zip(self._rows(i, table), passed.tolist()):
            store.setdefault(row_key(r), deque()).append(sid if ok else None)
            sid += ok

    def _explicit(self, i, idx, table, signs, ts, add) -> tuple[np.ndarray, np.ndarray]:
        """A stream with explicit deletions in this batch: arrival by arrival (the oldest
        equal row still there leaves; a deletion matching nothing is rejected). Returns the
        sids stored and their arrivals' indices in the batch."""
        if isinstance(self.values[i], _Ledger):
            return self._explicit_columns(i, idx, table, signs, ts, add)
        w = self.windows[i]
        store = self.values[i]
        alias = self.query.aliases[i]
        rows = self._rows(i, table)
        sel = self.selections[i]
        ins_k, ins_rows, ins_sids, del_k, del_sids = [], [], [], [], []
        sid = w.end
        for j, (k, r, s) in enumerate(zip(idx.tolist(), rows, signs.tolist())):
            self.stats.arrivals += 1
            key = row_key(r)
            if s < 0:
                rids = store.get(key)
                if not rids:
                    self.stats.rejected += 1
                    self.rejected_rows.append((i, ts[k], r, f"deletion of a row not in {alias}"))
                    self.rejected_at.append(k)
                    continue
                gone = rids.popleft()
                if not rids:
                    del store[key]
                if gone is not None:
                    del_k.append(k)
                    del_sids.append(gone)
                continue
            self.counts[i] += 1
            if sel is not None and not sel(r):
                self.stats.filtered += 1
                store.setdefault(key, deque()).append(None)
                continue
            store.setdefault(key, deque()).append(sid)
            ins_k.append(k)
            ins_rows.append(j)
            ins_sids.append(sid)
            sid += 1
        if ins_rows:
            part = table.take(from_numpy(np.asarray(ins_rows, np.int64)))
            k_in = np.asarray(ins_k, np.int64)
            w.append(part, ts[k_in], np.zeros(len(k_in), np.int64),
                     np.zeros(len(k_in), np.int64))
            self.stats.insertions += len(k_in)
            add(k_in, 2, 0, 0, "ins", i, np.asarray(ins_sids, np.int64))
        if del_k:
            k_d = np.asarray(del_k, np.int64)
            self.stats.deletions += len(k_d)
            add(k_d, 1, 0, 0, "del", i, np.asarray(del_sids, np.int64), ts[k_d])
        return np.asarray(ins_sids, np.int64), np.asarray(ins_k, np.int64)

    def _explicit_columns(self, i, idx, table, signs, ts, add
                          ) -> tuple[np.ndarray, np.ndarray]:
        """``_explicit`` over columns (``_Ledger.match``): the same insertions, deletions,
        rejections and counts, a batch at a time."""
        w, led = self.windows[i], self.values[i]
        n, m = len(idx), len(led)
        ins = signs > 0
        n_ins = int(ins.sum())
        self.stats.arrivals += n
        self.counts[i] += n_ins
        passed = np.zeros(n, bool)  # the selection is asked of insertions only, as per row
        ins_at = np.flatnonzero(ins)
        if n_ins:
            passed[ins_at] = self._select(i, table.take(from_numpy(ins_at)))
        self.stats.filtered += n_ins - int(passed.sum())
        rejected, taken = led.match(table, ins)
        pj = np.flatnonzero(passed)
        bsid = np.full(n, -1, np.int64)
        bsid[pj] = w.end + np.arange(len(pj), dtype=np.int64)
        dj = np.flatnonzero(taken >= 0)
        src = taken[dj]
        from_old = src < m
        gone = np.empty(len(dj), np.int64)
        gone[from_old] = led.sids[src[from_old]]
        gone[~from_old] = bsid[src[~from_old] - m]
        new = ins.copy()
        new[src[~from_old] - m] = False
        led.take(src[from_old])
        led.push(table.filter(from_numpy(new)), bsid[new])
        led.compact()
        rj = np.flatnonzero(rejected)
        if len(rj):
            alias = self.query.aliases[i]
            for k, r in zip(idx[rj].tolist(),
                            self._rows(i, table.take(from_numpy(rj)), exact=False)):
                self.stats.rejected += 1
                self.rejected_rows.append((i, ts[k], r, f"deletion of a row not in {alias}"))
                self.rejected_at.append(k)
        if len(pj):
            k_in = idx[pj]
            w.append(table.take(from_numpy(pj)), ts[k_in], np.zeros(len(pj), np.int64),
                     np.zeros(len(pj), np.int64))
            self.stats.insertions += len(pj)
            add(k_in, 2, 0, 0, "ins", i, bsid[pj])
        real = gone >= 0
        if real.any():
            k_d = idx[dj[real]]
            self.stats.deletions += len(k_d)
            add(k_d, 1, 0, 0, "del", i, gone[real], ts[k_d])
        return bsid[pj], idx[pj]

    # ----- the joins ---------------------------------------------------------------------
    def _join(self, deleted) -> pa.Table:
        """Every pipeline over its driving updates (the batch's insertions, and in retract
        mode its deletions), a range of update positions at a time (``_Ranges``): each
        range's output, in position order, goes to ``emit`` when one is set (a driver
        bounding its memory), else all of it is returned."""
        drivers = []  # (stream, sids, positions, sign, times), positions ascending
        for i in range(len(self.windows)):
            w = self.windows[i]
            fresh = self._fresh[i]
            if len(fresh):
                local = fresh - w.base
                drivers.append((i, fresh, w.col("ins")[local], 1, w.col("ts")[local]))
            if self.retract and len(deleted[i][0]):
                sids, p = deleted[i]
                order = np.argsort(p, kind="stable")
                sids, p = sids[order], p[order]
                drivers.append((i, sids, p, -1, w.col("dts")[sids - w.base]))
        for i in {d[0] for d in drivers}:
            a = self.aliases[i]
            order = tuple(self.orders[a])
            self.order_log[a][order] = self.order_log[a].get(order, 0) + 1
        out = []
        todo = _Ranges(np.concatenate([d[2] for d in drivers]) if drivers else
                       np.empty(0, np.int64))
        target = max(1, self.step_limit // 2)
        sel: dict[tuple[str, str], list] = {}
        while (r := todo.next(self._range_size(target))) is not None:
            lo, hi = r
            self._held = self._peak = 0
            self._sel_range = {}
            parts, updates = [], 0
            try:
                for i, sids, p, sign, ts in drivers:
                    a, b = np.searchsorted(p, [lo, hi], "left")
                    if b > a:
                        updates += b - a
                        parts.append(self._pipeline(i, sids[a:b], p[a:b], sign, ts[a:b]))
                        self._held += len(parts[-1][1])
            except _TooLarge as big:
                # (what this range's steps measured is dropped: its pieces measure it again)
                self._per_update = max(self._per_update, self._peak / max(1, updates))
                todo.split(lo, hi, big.pos, big.rows, target)
                continue
            self._per_update = self._peak / max(1, updates)
            for k, (num, den) in self._sel_range.items():
                acc = sel.setdefault(k, [0, 0.0])
                acc[0] += num
                acc[1] += den
            table = self._output([x for x in parts if len(x[1])])
            if not table.num_rows:
                continue  # (its _ts is int64 whatever the time type: no concat with it)
            if self.emit is not None:
                self.stats.results += table.num_rows
                self.emit(table.drop_columns(["_pos"]))
            else:
                out.append(table)
        for k, (num, den) in sel.items():  # one observation a batch (docs/vector.md)
            est = self.selectivity.get(k)
            if est is None:
                est = self.selectivity[k] = Ratio()
            est.update(num, den)
        if not out:
            return self._empty(True)
        return out[0] if len(out) == 1 else pa.concat_tables(out)

    def _range_size(self, target: int) -> int:
        """Driving updates in the next range: about ``target`` rows at the rows per update
        of the last range, at most ``range_updates``."""
        if self._per_update * self.range_updates <= target:
            return self.range_updates
        return max(1, int(target / self._per_update))

    def _too_large(self, rows: int, pos: np.ndarray) -> bool:
        """Whether a join step that would build ``rows`` rows passes what its range has
        left of ``step_limit``, with probes (at positions ``pos``) of more than one update:
        one update's own rows are built at once, whatever their number."""
        got = self._held + rows
        self._peak = max(self._peak, got)
        return got > self.step_limit and len(pos) > 0 and pos.min() != pos.max()

    def _pipeline(self, i: int, sids: np.ndarray, p: np.ndarray, sign: int, ts: np.ndarray):
        """ΔX ⋈ … for driving rows ``sids`` of stream i at positions ``p``: every
        combination of rows present at each p (the band at every step)."""
        alias = self.aliases[i]
        index_of = self._index
        cur = {i: sids}
        drv = np.arange(len(sids))
        for st in self.steps(alias):
            if not len(drv):
                break
            y = index_of[st.stream]
            w = self.windows[y]
            pc_ = p[drv]
            pairs = _pairs_present(w, pc_)  # pairs the step could join: σ's denominator
            if st.key:
                codes, null = [], np.zeros(len(drv), bool)
                for ref in st.refs:
                    z = index_of[ref.stream]
                    zw = self.windows[z]
                    local = cur[z] - zw.base
                    codes.append(zw.col("c:" + ref.column)[local])
                    null |= zw.col("n:" + ref.column)[local]
                q = _combine(codes)
                live = np.flatnonzero(~null) if null.any() else None
                index = w.index(st.key)
                some = index.candidates(q if live is None else q[live])
                if some is not None:  # a selective step: only probes whose key is there
                    live = some if live is None else live[some]
                if live is not None:
                    q = q[live]
                pl = pc_ if live is None else pc_[live]
                lo, hi = w.lo_hi(pl)
                found = index.bounds(q, lo, hi)  # counted before they are built
                if self._too_large(index.rows(found), pl):
                    raise _TooLarge(pl, index.per_probe(found, len(q)))
                j, ysid = index.take(found)
                if live is not None:
                    j = live[j]
                if st.check and len(j):
                    ok = self._check(st, y, ysid, cur, j)
                    j, ysid = j[ok], ysid[ok]
            else:
                lo, hi = w.lo_hi(pc_)
                n = np.maximum(hi - lo, 0)
                if self._too_large(int(n.sum()), pc_):
                    raise _TooLarge(pc_, n)
                j, at = _expand(np.arange(len(drv)), lo, hi - lo)
                ysid = at
            if w.explicit and len(j):  # rows leave from the middle: the rule itself
                yl = ysid - w.base
                ok = present(w.col("ins")[yl], w.col("del")[yl], pc_[j])
                j, ysid = j[ok], ysid[ok]
            linked = {r.stream for r in st.refs}
            if len(linked) == 1:
                (z,) = linked
                acc = self._sel_range.setdefault((z, st.stream), [0, 0.0])
                acc[0] += len(j)
                acc[1] += pairs
            cur = {s: a[j] for s, a in cur.items()}
            cur[y] = ysid
            drv = drv[j]
        return cur, p[drv], sign, ts[drv]

    def _check(self, st: _Step, y: int, ysid, cur, j) -> np.ndarray:
        w = self.windows[y]
        ok = np.ones(len(j), bool)
        for c, ref in zip(st.key, st.refs):
            z = self._index[ref.stream]
            zw = self.windows[z]
            zl = cur[z][j] - zw.base
            yl = ysid - w.base
            ok &= w.col("c:" + c)[yl] == zw.col("c:" + ref.column)[zl]
            if self.codings[ref].check:  # (as Python objects: exact across types)
                mine, theirs = w.col("v:" + c)[yl], zw.col("v:" + ref.column)[zl]
                if mine.dtype != theirs.dtype:
                    mine, theirs = mine.astype(object), theirs.astype(object)
                ok &= mine == theirs
        return ok

    def _output(self, parts) -> pa.Table:
        if not parts:
            return self._empty(True)
        p = np.concatenate([x[1] for x in parts])
        order = np.argsort(p, kind="stable")
        arrays, names = [], []
        for (i, col, values), o in zip(self.outputs, self.query.outputs):
            w = self.windows[i]
            local = np.concatenate([x[0][i] for x in parts])[order] - w.base
            arrays.append(values.to_arrow(w.col("v:" + col)[local], w.col("m:" + col)[local]))
            names.append(o.name)
        sign = np.concatenate([np.full(len(x[1]), x[2], np.int8) for x in parts])[order]
        ts = np.concatenate([x[3] for x in parts])[order]
        arrays += [from_numpy(sign), from_numpy(ts), from_numpy(p[order])]
        names += ["_sign", "_ts", "_pos"]
        return pa.table(arrays, names=names)

    def _empty(self, positions: bool) -> pa.Table:
        fields = [pa.field(o.name, v.type) for (_, _, v), o in zip(self.outputs,
                                                                   self.query.outputs)]
        fields += [pa.field("_sign", pa.int8()), pa.field("_ts", pa.int64())]
        if positions:
            fields.append(pa.field("_pos", pa.int64()))
        return pa.table([pa.nulls(0, f.type) for f in fields], schema=pa.schema(fields))

    def _expire(self, deleted) -> None:
        """Rows deleted in this batch leave their windows (a prefix, or marked dead)."""
        for i, w in enumerate(self.windows):
            sids = deleted[i][0]
            if not len(sids):
                continue
            if w.explicit:
                w.dead += len(sids)
                remap = w.compact()
                if remap is not None:
                    self._remap(i, remap)
            else:
                w.drop_front(len(sids))

    def _remap(self, i: int, remap: np.ndarray) -> None:
        w = self.windows[i]
        base = w.base
        led = self.values[i]
        if isinstance(led, _Ledger):
            live = (led.sids >= 0) & led.alive
            led.sids[live] = remap[led.sids[live] - base] + base
            return
        for key, rids in list(self.values[i].items()):
            self.values[i][key] = deque(None if r is None else int(remap[r - base]) + base
                                        for r in rids)


def _number_text(x) -> str:
    """A window size for a message (an exact int such as 10**400 overflows a float)."""
    try:
        return f"{x:g}"
    except OverflowError:
        return f"{Decimal(x):.3e}"


def unsupported(query: LogicalQuery) -> str | None:
    """Why the vectorized executor cannot run ``query`` (None: it can)."""
    import sqlglot.expressions as exp
    if query.set_predicates:
        return (f"{query.set_predicates[0]} is a set join condition; the load-shedding "
                "join (--executor shed) evaluates it")
    for o in query.outputs:
        if not isinstance(o.expr, exp.Column):
            return (f"the SELECT item {o.name!r} is an expression ({o.expr.sql()}); the "
                    "vectorized executor outputs columns only")
    for s in query.streams:
        # (compared as written: a size such as 1e400, an exact int, overflows a float)
        if s.window.kind == "range" and s.window.size >= NS_MAX / 2 / 1e9:
            return (f"{s.alias}'s [RANGE {_number_text(s.window.size)} SECONDS] window is "
                    "longer than the vectorized executor's 64-bit nanosecond times can hold "
                    "beside a timestamp (about 146 years)")
    return None
