"""The data of the Spark scaling benchmarks (bench.spark_scale, bench.spark_vs_native)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

import adaptcq


@pytest.fixture(scope="module")
def tpch_streams(tmp_path_factory):
    pytest.importorskip("duckdb")
    from adaptcq.stream import tpch
    root = tmp_path_factory.mktemp("tpch")
    return tpch.generate(0.01, root, files=4, rate=1000.0, seed=3), tpch.tables(0.01)


def test_tpch_streams_interleave_all_tables_in_time_order(tpch_streams):
    srcs, tables = tpch_streams
    firsts, lasts = {}, {}
    for name, folder in srcs.items():
        parts = [pq.read_table(p) for p in sorted(Path(folder).glob("*.parquet"))]
        assert len(parts) == 4
        ts = np.concatenate([p.column("ts").to_numpy() for p in parts])
        assert (np.diff(ts) >= 0).all()  # each stream in arrival order, across its files
        assert len(ts) == tables[name].num_rows
        # the same rows as the table (the ts column added)
        t = pq.read_table(folder).drop_columns(["ts"])
        key = t.column_names
        assert Counter(zip(*(t.column(c).to_pylist() for c in key), strict=True)) == \
            Counter(zip(*(tables[name].column(c).to_pylist() for c in key), strict=True))
        firsts[name], lasts[name] = ts[0], ts[-1]
    total = sum(t.num_rows for t in tables.values())
    # one arrival order for all tables: every large table spans the whole run
    for name in ("customer", "orders", "lineitem", "supplier"):
        assert firsts[name] < 0.05 * total / 1000 and lasts[name] > 0.95 * total / 1000


@pytest.mark.parametrize("q", ["q3", "q5"])
def test_tpch_queries_equal_duckdb(tpch_streams, q):
    """Q3 and Q5 over the streams (local runtime) give exactly DuckDB's join of the tables."""
    import duckdb

    from adaptcq.stream import tpch
    srcs, _ = tpch_streams
    got = adaptcq.run(tpch.QUERIES[q], {n: srcs[n] for n in tpch.SOURCES[q]},
                      mode="append").table
    con = duckdb.connect()
    for n in tpch.SOURCES[q]:
        con.register(n, pq.read_table(srcs[n]))
    want = con.execute(tpch.QUERIES[q]).arrow()
    want = want.read_all() if hasattr(want, "read_all") else want
    ids = tpch.IDS[q]
    assert got.num_rows > 10
    assert Counter(zip(*(got.column(c).to_pylist() for c in ids), strict=True)) == \
        Counter(zip(*(want.column(c).to_pylist() for c in ids), strict=True))


def test_state_growth_data(tmp_path):
    from adaptcq.bench.spark_scale import growth_data
    srcs = growth_data(tmp_path, batches=3, per_batch=100, domain=1000)
    for folder in srcs.values():
        files = sorted(Path(folder).glob("*.parquet"))
        assert [pq.read_metadata(f).num_rows for f in files] == [100, 100, 100]
        ts = pq.read_table(folder).column("ts").to_numpy()
        assert (np.diff(ts) >= 0).all() and ts[0] >= 0 and ts[-1] < 3


def test_selective_cases_of_spark_vs_native(tmp_path):
    """Cases c and d: 1,000,000 rows per stream whatever --arrivals, keys in [0, 60,000),
    at 197.8 rows per second per stream, in 10 time slices."""
    from adaptcq.bench.spark_vs_native import (
        SELECTIVE_DOMAIN,
        SELECTIVE_RATE,
        SELECTIVE_ROWS,
        make_data,
    )
    srcs = make_data("d", 123, 10, tmp_path)
    for folder in srcs.values():
        t = pq.read_table(folder)
        assert t.num_rows == SELECTIVE_ROWS == 1_000_000
        assert len(list(Path(folder).glob("*.parquet"))) == 10
        assert 0 <= min(t.column("a").to_pylist()[:1000]) and \
            max(t.column("b").to_numpy()) < SELECTIVE_DOMAIN
        span = t.column("ts").to_numpy()[-1]
        assert abs(span - SELECTIVE_ROWS / SELECTIVE_RATE) < 5
