"""Event time: input timestamps to the engine's int64 nanoseconds, and back for ``_ts``.

The engine compares event times as int64 nanoseconds since the epoch, so window boundaries
are exact (docs/semantics.md, "Window boundaries"). A timestamp column is either of an Arrow
timestamp or date type, or numeric in a unit the user names (``--timestamp-unit``, seconds
by default), rounded to the nanosecond, ties to even (integers and decimals exactly, floats
from the double's product). Times that are not finite, or that lie outside what int64
nanoseconds can hold (1677-09-21 to 2262-04-11), are refused with the stream, row and
value: a common cause is epoch milliseconds read as seconds, and the message says so. Both
runtimes use these rules.

Output ``_ts`` keeps the input's type: a timestamp type keeps its timezone and its unit
(made finer only when a window size needs it, e.g. ``[RANGE 500 MILLISECONDS]`` over
``timestamp[s]``); integer times stay integers in the input's unit when every window size is
a whole number of that unit, else they become float64 in that unit; floating and decimal
times give float64. Integers and decimals never pass through float64 on the way in.
"""

from __future__ import annotations

import math
from decimal import ROUND_HALF_EVEN, Decimal, localcontext
from fractions import Fraction

import numpy as np
import pyarrow as pa

from adaptcq.checks import is_real
from adaptcq.errors import InputError, OptionError
from adaptcq.stream.arrays import from_numpy, null_mask, to_numpy

UNITS = {"s": 1_000_000_000, "ms": 1_000_000, "us": 1_000, "ns": 1}
"""Nanoseconds per unit of a numeric or timestamp column."""

NS_MAX = 2**63 - 1
NS_MIN = -(2**63) + 1  # INT64_MIN stays free: it is what a failed float cast gives
SPAN = "1677-09-21 to 2262-04-11"


def check_unit(unit: str | None) -> str:
    """The unit of numeric timestamps (``None``: seconds)."""
    if unit is None:
        return "s"
    if unit not in UNITS:
        raise InputError(f"--timestamp-unit {unit!r}: choose one of {', '.join(UNITS)}")
    return unit


def is_time_type(t: pa.DataType) -> bool:
    return pa.types.is_timestamp(t) or pa.types.is_date(t)


def is_numeric_time(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)


def check_time_type(stream: str, column: str, t: pa.DataType, unit: str | None) -> None:
    """A timestamp column is a timestamp, a date, or a number (in ``unit``)."""
    if is_time_type(t):
        if unit is not None:
            raise InputError(f"stream {stream}: --timestamp-unit {unit} applies to numeric "
                             f"timestamps, and {column!r} has type {t}, which carries its "
                             "own unit; leave --timestamp-unit out")
        return
    if not is_numeric_time(t):
        raise InputError(f"stream {stream}: timestamp column {column!r} has type {t}; it must "
                         "be a timestamp, a date, or a number (seconds, or --timestamp-unit)")


def to_nanoseconds(col: pa.Array | pa.ChunkedArray, unit: str | None, stream: str,
                   column: str, first_row: int = 0) -> np.ndarray:
    """Event times of one chunk of a stream as int64 nanoseconds since the epoch.

    ``first_row`` is the chunk's first row number in its input (for error messages).
    Raises InputError naming the stream, row and value of a null, non-finite or out-of-range
    time.
    """
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    if col.null_count:
        row = first_row + int(np.flatnonzero(null_mask(col))[0])
        raise InputError(f"stream {stream}: row {row} has no timestamp ({column!r} is null)")
    t = col.type
    if pa.types.is_date(t):
        col, t = col.cast(pa.timestamp("s")), pa.timestamp("s")
    if pa.types.is_timestamp(t):
        raw = to_numpy(col).astype(np.int64, copy=False)
        factor = UNITS[t.unit]
        _check_range(raw, factor, stream, column, first_row, f"timestamp[{t.unit}]")
        return raw * factor if factor != 1 else raw
    u = check_unit(unit)
    factor = UNITS[u]
    if pa.types.is_integer(t):
        raw = to_numpy(col)
        if pa.types.is_unsigned_integer(t):
            big = raw > NS_MAX // factor
            if big.any():
                row = int(np.flatnonzero(big)[0])
                _raise_range(stream, column, first_row + row, raw[row].item(), u)
        raw = raw.astype(np.int64, copy=False)
        _check_range(raw, factor, stream, column, first_row, u)
        return raw * factor if factor != 1 else raw
    if pa.types.is_decimal(t):
        return _decimal_ns(col, u, stream, column, first_row)
    vals = to_numpy(col if pa.types.is_floating(t) else col.cast(pa.float64()))
    vals = vals.astype(np.float64, copy=False)
    bad = ~np.isfinite(vals)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise InputError(f"stream {stream}: row {first_row + row} has timestamp "
                         f"{vals[row].item()!r} in {column!r}; a time must be a finite number")
    with np.errstate(over="ignore", invalid="ignore"):  # out-of-range values are refused below
        ns = vals * factor
    # float64 cannot hold NS_MAX exactly: 2**63 itself is out of range.
    out = (ns >= 2.0**63) | (ns < -(2.0**63))
    if out.any():
        row = int(np.flatnonzero(out)[0])
        _raise_range(stream, column, first_row + row, vals[row].item(), u)
    return np.round(ns).astype(np.int64)


def _decimal_ns(col: pa.Array, unit: str, stream: str, column: str,
                first_row: int) -> np.ndarray:
    """Decimal times as int64 ns, exactly: through float64 1700000000.000000001 s was
    1700000000 s. Multiplying by the unit only moves the decimal point, so the same digits
    are read at a scale smaller by the unit's digits (a view), then rounded to the
    nanosecond, ties to even as ``np.round`` rounds the float path, and cast (checked)."""
    import pyarrow.compute as pc
    t = col.type
    shift = len(str(UNITS[unit])) - 1  # 9, 6, 3 or 0 digits
    wide = t.bit_width == 256
    try:
        if t.bit_width < 128:  # (their casts to integers misjudge negative scales)
            col = col.cast(pa.decimal128(t.precision, t.scale))
        ns = col.view(pa.decimal256(76, t.scale - shift) if wide
                      else pa.decimal128(38, t.scale - shift))
        if t.scale > shift:
            ns = pc.round(ns, ndigits=0, round_mode="half_to_even")
        out = to_numpy(ns.cast(pa.int64()))
        if not (out == NS_MIN - 1).any():
            return out
    except pa.ArrowInvalid:
        pass
    # A value out of range (or beyond Arrow's precision on the way): in Python, exactly.
    out = np.empty(len(col), np.int64)
    with localcontext() as ctx:
        ctx.prec = 200
        for row, value in enumerate(col.to_pylist()):
            ns = int((value * UNITS[unit]).to_integral_value(ROUND_HALF_EVEN))
            if not NS_MIN <= ns <= NS_MAX:
                _raise_range(stream, column, first_row + row, value, unit)
            out[row] = ns
    return out


def _check_range(raw: np.ndarray, factor: int, stream: str, column: str, first_row: int,
                 unit: str) -> None:
    if factor == 1 or not len(raw):
        return
    limit = NS_MAX // factor
    out = (raw > limit) | (raw < -limit)
    if out.any():
        row = int(np.flatnonzero(out)[0])
        _raise_range(stream, column, first_row + row, raw[row].item(), unit)


def _raise_range(stream: str, column: str, row: int, value, unit: str):
    hint = ""
    if unit == "s":
        hint = ("; if the column holds epoch milliseconds (or µs, ns), say so with "
                "--timestamp-unit ms (us, ns)")
    shown = str(value) if isinstance(value, Decimal) else repr(value)
    raise InputError(f"stream {stream}: row {row} has timestamp {shown} in {column!r}, out "
                     f"of range for unit {unit} (event times span {SPAN}){hint}")


def to_units(seconds, unit: float):
    """A duration in seconds (a window's size) in the engine's time unit (seconds per unit:
    1e-9 for int64 nanoseconds), exactly: ``round(seconds / unit)`` in floating point is a
    unit short from about 93 days on (8,035,200 / 1e-9 = 8035199999999999.0), which lost
    the pairs exactly a window apart. ``unit`` 1.0 keeps ``seconds`` as it is."""
    if unit == 1.0:
        return seconds
    return round(Fraction(seconds) / Fraction(repr(unit)))


def finest_unit(window_ns: list[int]) -> str:
    """The coarsest unit in which every window size is a whole number."""
    for u in ("s", "ms", "us", "ns"):
        if all(w % UNITS[u] == 0 for w in window_ns):
            return u
    return "ns"


def output_time_type(stream_types: dict[str, pa.DataType], unit: str | None,
                     window_ns: list[int]) -> pa.DataType:
    """The type of ``_ts``, given each stream's timestamp column type and the windows' sizes
    in nanoseconds (an expiry's ``_ts`` is t + w). See the module docstring."""
    types = list(stream_types.values())
    if not types:
        return pa.float64()
    timed = [is_time_type(t) for t in types]
    if any(timed) and not all(timed):
        desc = ", ".join(f"{s}: {t}" for s, t in stream_types.items())
        raise InputError(f"the streams' timestamp columns mix timestamp and numeric types "
                         f"({desc}); give every stream the same kind of time")
    if all(timed):
        tzs = {getattr(t, "tz", None) for t in types}
        if len(tzs) > 1:
            desc = ", ".join(f"{s}: {t}" for s, t in stream_types.items())
            raise InputError(f"the streams' timestamps have different timezones ({desc})")
        units = [t.unit if pa.types.is_timestamp(t) else "s" for t in types]
        units.append(finest_unit(window_ns))
        finest = min(units, key=lambda u: UNITS[u])
        return pa.timestamp(finest, tz=tzs.pop())
    u = check_unit(unit)
    if all(pa.types.is_integer(t) for t in types) and all(
            w % UNITS[u] == 0 for w in window_ns):
        return pa.int64()
    return pa.float64()


def from_nanoseconds(ns: np.ndarray, out_type: pa.DataType, unit: str | None) -> pa.Array:
    """Engine times (int64 ns) as ``_ts`` values of ``out_type`` (exact for integer types)."""
    ns = np.asarray(ns, dtype=np.int64)
    if pa.types.is_timestamp(out_type):
        return from_numpy(ns // UNITS[out_type.unit], out_type)
    factor = UNITS[check_unit(unit)]
    if pa.types.is_integer(out_type):
        return from_numpy(ns // factor, pa.int64())
    return from_numpy(ns / factor, pa.float64())


def lateness_ns(seconds) -> int:
    """--allowed-lateness in nanoseconds: finite, >= 0 and within the span of event times.
    A number: ``True`` was 1 s and ``"1.5"`` 1.5 s."""
    if not is_real(seconds):
        raise OptionError(f"--allowed-lateness must be a number of seconds, got "
                           f"{seconds!r}")
    x = float(seconds)
    if not math.isfinite(x) or x < 0:
        raise OptionError(f"--allowed-lateness must be a finite number of seconds >= 0, "
                           f"got {seconds!r}")
    if x * 1e9 >= NS_MAX:
        raise OptionError(f"--allowed-lateness {seconds!r} s is longer than event times "
                           "span (292 years)")
    return to_units(x, 1e-9)
