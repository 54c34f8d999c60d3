"""stream.arrays: numpy <-> Arrow from the buffers, checked against pyarrow's own
conversions; and a vectorized run that imports neither pandas nor networkx."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pyarrow as pa
import pytest

from adaptcq.stream.arrays import from_numpy, null_mask, numpy_dtype, to_numpy

TYPES = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint32(),
         pa.uint64(), pa.float32(), pa.float64(), pa.bool_(), pa.timestamp("ns"),
         pa.timestamp("s", tz="UTC"), pa.date32(), pa.date64(), pa.duration("ms"),
         pa.time32("ms"), pa.time64("us")]


def _values(t: pa.DataType, n: int, rng) -> list:
    if pa.types.is_boolean(t):
        return [bool(x) for x in rng.integers(0, 2, n)]
    if pa.types.is_floating(t):
        return [float(x) for x in rng.normal(0, 100, n)]
    if pa.types.is_unsigned_integer(t):
        return [int(x) for x in rng.integers(0, 100, n)]
    if pa.types.is_time32(t):
        return [int(x) for x in rng.integers(0, 86_400_000, n)]
    return [int(x) for x in rng.integers(-100, 100, n)] if pa.types.is_integer(t) else \
        [int(x) for x in rng.integers(0, 10**6, n)]


@pytest.mark.parametrize("t", TYPES, ids=str)
@pytest.mark.parametrize("nulls", [False, True])
def test_round_trip_matches_pyarrow(t, nulls):
    rng = np.random.default_rng(7)
    for n in (0, 1, 9, 70):
        vals = _values(t, n, rng)
        if nulls and n:
            vals = [None if k % 3 == 1 else v for k, v in enumerate(vals)]
        storage = pa.array(vals, pa.bool_() if pa.types.is_boolean(t) else (
            pa.float32() if t == pa.float32() else pa.float64() if pa.types.is_floating(t)
            else pa.from_numpy_dtype(numpy_dtype(t))))
        arr = storage.cast(t) if storage.type != t else storage
        for lo in range(min(n, 4)):  # offsets into the buffers (bitmaps not byte-aligned)
            part = arr.slice(lo)
            mask = null_mask(part)
            assert mask.tolist() == part.is_null().to_pylist()
            got = to_numpy(part)
            assert got.dtype == numpy_dtype(t)
            plain = pa.types.is_boolean(t) or pa.types.is_floating(t) or \
                pa.types.is_integer(t)  # else a time: its integer storage
            want = (part if plain else part.view(pa.from_numpy_dtype(got.dtype))).to_pylist()
            assert [None if m else v for v, m in zip(got.tolist(), mask)] == want
            assert not got[mask].any()  # NULLs as zero
            back = from_numpy(got, t, mask)
            assert back.type == t and back.equals(part)
        chunked = pa.chunked_array([arr, arr], t)
        assert to_numpy(chunked).tolist() == np.concatenate([to_numpy(arr)] * 2).tolist()


def test_other_types_fall_back_to_pyarrow():
    arr = pa.array(["a", None, "b"])
    assert to_numpy(arr).tolist() == ["a", None, "b"]
    assert null_mask(arr).tolist() == [False, True, False]
    assert from_numpy(np.array(["x", "y"], object), pa.string()).to_pylist() == ["x", "y"]
    d = pa.array([1, 2, 1]).dictionary_encode()
    assert to_numpy(d).tolist() == [1, 2, 1]
    assert from_numpy(np.arange(3)).type == pa.int64()
    assert null_mask(pa.nulls(3)).tolist() == [True] * 3


def test_a_vectorized_run_imports_neither_pandas_nor_networkx(tmp_path):
    """pyarrow imports pandas on its first pa.array or to_numpy: the vectorized path goes
    through stream.arrays instead (0.17 CPU-s of start-up saved); networkx (50 ms) only
    for an nx.Graph asked for."""
    import pyarrow.parquet as pq
    for s in "RS":
        pq.write_table(pa.table({"ts": np.arange(50, dtype=np.float64) / 10,
                                 "a": np.arange(50) % 7, "x": np.arange(50) * 1.5}),
                       tmp_path / f"{s}.parquet")
    code = textwrap.dedent(f"""
        import sys
        import adaptcq
        res = adaptcq.run("SELECT R.x AS rx, S.x AS sx FROM R [RANGE 1 SECONDS], "
                          "S [RANGE 1 SECONDS] WHERE R.a = S.a",
                          {{"R": r"{tmp_path / 'R.parquet'}", "S": r"{tmp_path / 'S.parquet'}"}})
        assert res.stats["executor"] == "vector", res.stats["executor"]
        assert res.table.num_rows > 0
        print(sorted(m for m in ("pandas", "networkx") if m in sys.modules))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout + out.stderr
