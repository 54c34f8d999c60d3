"""numpy <-> Arrow for fixed-width columns, from and to the buffers.

pyarrow imports pandas (about 0.17 CPU-seconds) the first time it converts anything with
``pa.array``, ``Array.to_numpy`` or ``pa.scalar``. The vectorized path only ever converts
fixed-width columns (integers, floats, booleans, times), which these functions do from the
Arrow buffers directly (zero-copy where the layouts agree), so a vectorized run never
imports pandas. Any other type falls back to pyarrow's own conversion.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa


def storage_type(t: pa.DataType) -> pa.DataType | None:
    """The integer type a fixed-width temporal type is stored as (None: not temporal)."""
    if pa.types.is_timestamp(t) or pa.types.is_duration(t) or pa.types.is_date64(t) or \
            pa.types.is_time64(t):
        return pa.int64()
    if pa.types.is_date32(t) or pa.types.is_time32(t):
        return pa.int32()
    return None


def numpy_dtype(t: pa.DataType) -> np.dtype | None:
    """The numpy dtype of a fixed-width type's values (times: their integer storage);
    None for any other type."""
    if pa.types.is_boolean(t):
        return np.dtype(np.bool_)
    st = storage_type(t)
    if st is not None:
        t = st
    if pa.types.is_integer(t):
        return np.dtype(f"{'i' if pa.types.is_signed_integer(t) else 'u'}{t.bit_width // 8}")
    if pa.types.is_floating(t):
        return np.dtype(f"f{t.bit_width // 8}")
    return None


def _flat(arr: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(arr, pa.ChunkedArray):
        return arr.chunk(0) if arr.num_chunks == 1 else arr.combine_chunks()
    return arr


def _bits(buf: pa.Buffer, offset: int, n: int) -> np.ndarray:
    """``n`` bits of a bitmap from bit ``offset``, as booleans."""
    raw = np.frombuffer(buf, np.uint8, count=(offset + n + 7) // 8)
    return np.unpackbits(raw, count=offset + n, bitorder="little")[offset:].view(np.bool_)


def null_mask(arr: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """True where ``arr`` is NULL."""
    arr = _flat(arr)
    n = len(arr)
    if not arr.null_count:
        return np.zeros(n, bool)
    if pa.types.is_null(arr.type):
        return np.ones(n, bool)
    validity = arr.buffers()[0]
    if validity is None:  # a type whose NULLs are not in a bitmap (a union, say)
        arr = arr.is_null()
        return _bits(arr.buffers()[1], arr.offset, n)
    return ~_bits(validity, arr.offset, n)


def to_numpy(arr: pa.Array | pa.ChunkedArray, null=0) -> np.ndarray:
    """The values of ``arr`` as numpy, NULLs as ``null`` (times as their integer storage;
    read-only when it is a view of the Arrow buffer). Types that are not fixed-width go
    through ``to_numpy`` (objects)."""
    arr = _flat(arr)
    dt = numpy_dtype(arr.type)
    if dt is None:
        if pa.types.is_dictionary(arr.type):
            return to_numpy(arr.dictionary_decode(), null)
        if pa.types.is_nested(arr.type):
            # Python values, one object each: Arrow's to_numpy makes a list of numbers a
            # numpy array, its NULLs NaN (a list of ints then cannot be written back)
            out = np.empty(len(arr), dtype=object)
            for k, v in enumerate(arr.to_pylist()):
                out[k] = v
            return out
        return arr.to_numpy(zero_copy_only=False)
    n = len(arr)
    data = arr.buffers()[1] if n else None
    if data is None:
        values = np.zeros(n, dt)
    elif dt == np.bool_:
        values = _bits(data, arr.offset, n)
    else:
        values = np.frombuffer(data, dt, count=n, offset=arr.offset * dt.itemsize)
    if arr.null_count:
        values = np.where(null_mask(arr), np.asarray(null, dt), values)
    return values


def from_numpy(values: np.ndarray, type: pa.DataType | None = None,
               mask: np.ndarray | None = None) -> pa.Array:
    """An Arrow array of ``type`` (default: ``values``' own) holding ``values``, NULL where
    ``mask`` is True (zero-copy for the values when their dtype is the type's)."""
    values = np.asarray(values)
    if type is None:
        type = pa.from_numpy_dtype(values.dtype)
    dt = numpy_dtype(type)
    if dt is None or values.ndim != 1:
        return pa.array(values, type=type, mask=mask)
    n = len(values)
    validity, nulls = None, 0
    if mask is not None:
        nulls = int(np.count_nonzero(mask))
        if nulls:
            validity = pa.py_buffer(np.packbits(~np.asarray(mask, bool), bitorder="little"))
    if dt == np.bool_:
        data = pa.py_buffer(np.packbits(values.astype(bool, copy=False), bitorder="little"))
    else:
        data = pa.py_buffer(np.ascontiguousarray(values, dtype=dt))
    return pa.Array.from_buffers(type, n, [validity, data], null_count=nulls)


def engine_values(arr: pa.Array | pa.ChunkedArray) -> list:
    """An Arrow column's values as the engine's rows hold them: a timestamp with a time zone
    as naive UTC datetimes, as ``sources.normalize`` gives rows (``to_pylist`` would give
    aware datetimes, and Python never finds a naive datetime equal to an aware one: spilled
    rows read back this way missed every join with rows in memory)."""
    t = arr.type
    if pa.types.is_timestamp(t) and t.tz is not None:
        arr = arr.cast(pa.timestamp(t.unit))
    return arr.to_pylist()
