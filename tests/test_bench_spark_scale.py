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
def test_tpch_queries_parse(tpch_streams, q):
    """Q3 and Q5 are adaptcq CQL over the streams' columns: unbounded streams, equi-joins on
    the TPC-H keys (Q5's nationkey closes a cycle), no aggregation."""
    from adaptcq.query.cql import parse_query
    from adaptcq.stream import tpch
    from adaptcq.stream.sources import schema_kinds
    srcs, _ = tpch_streams
    schemas = {n: schema_kinds(pq.read_schema(next(Path(srcs[n]).glob("*.parquet"))))
               for n in tpch.SOURCES[q]}
    query = parse_query(tpch.QUERIES[q], schemas)
    assert query.join_graph.number_of_nodes() == len(tpch.SOURCES[q])
    assert query.shape == ("linear" if q == "q3" else "cyclic")


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


def test_state_growth_rows_join_progress_and_group_statistics():
    """Each group's k-th statistics row belongs to micro-batch k; the end-of-input batch (no
    rows for the groups) and batch 0 are left out of the comparison."""
    from adaptcq.bench.spark_scale import growth_rows, growth_summary
    progress = [{"ms": ms, "rows": 60} for ms in (900, 200, 210, 220, 230, 240, 250)]
    progress.append({"ms": 50, "rows": 1})
    history = []
    for b in range(8):
        for g in (0, 1):
            history.append({"group": g, "rows_in": 30 if b < 7 else 0,
                            "state_tuples": 30 * (b + 1) if b < 7 else 210,
                            "engine_cpu_seconds": 0.01, "cache_hit": b % 2 == 0})
    rows = growth_rows(progress, history)
    assert [r["kind"] for r in rows] == ["data"] * 7 + ["end"]
    assert [r["state_tuples"] for r in rows][:3] == [60, 120, 180]
    assert all(r["groups"] == 2 for r in rows) and rows[0]["live_copy"] == 2
    g = growth_summary(rows)
    assert (g["first_batch"], g["last_batch"]) == (1, 6)
    assert (g["ms_first"], g["ms_last"]) == (205, 245)  # medians of batches 1-2 and 5-6
    assert g["state_ratio"] == 420 / 120


def test_scale_rows_take_medians_and_replication(tmp_path, capsys):
    """A point's row: medians over the repeats, the shares, the rows shipped and the
    replication (shipped per input row) of adaptcq; none of these for native."""
    from adaptcq.bench.spark_scale import _plot, _print, _row
    runs = [{"wall_seconds": w, "cpu_seconds": c, "rows_in": 1000, "results": 7,
             "shares": {"R.a = S.a": 1, "S.b = T.b": 2}, "shipped": 1143,
             "engine_cpu_seconds": 0.5} for w, c in ((10.0, 15.0), (30.0, 12.0), (20.0, 18.0))]
    ours = _row("chain", "adaptcq", 2, runs, 1000, True)
    assert (ours["wall_seconds"], ours["cpu_seconds"]) == (20.0, 15.0)
    assert ours["rows_per_second"] == 50 and ours["replication"] == 1.143
    assert ours["shares"] == '{"R.a = S.a": 1, "S.b = T.b": 2}'
    native = _row("chain", "native", None, [{"wall_seconds": 40.0, "cpu_seconds": 30.0,
                                             "rows_in": 1000, "results": 7}], 1000, True)
    assert (native["partitions"], native["shares"], native["shipped"],
            native["replication"]) == ("", "", "", "")
    # a runtime without run.shipped / run.shares: n/a, not a crash
    old = _row("chain", "adaptcq", 1, [dict(runs[0], shares=None, shipped=None)], 1000, True)
    assert (old["shares"], old["shipped"], old["replication"]) == ("", "", "")
    _print([ours, old, native], "local[2]")
    assert "n/a" in capsys.readouterr().out
    _plot([ours, old, native], tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 0


@pytest.mark.parametrize("bench, argv", [
    ("spark_scale", ["--workloads", "chain", "--arrivals", "300"]),
    ("spark_scale", ["--state-growth"]),
    ("spark_vs_native", ["--cases", "a", "--arrivals", "300"]),
    ("spark_vs_native", ["--cases", "a", "--arrivals", "300", "--no-jvm-archive"]),
])
def test_without_java_the_spark_benchmarks_stop_in_one_line(bench, argv, tmp_path,
                                                            monkeypatch, capsys):
    """No Java: one `adaptcq: error:` line naming the fix, as `adaptcq run --engine spark`
    gives (it was a traceback, two with --no-jvm-archive), before any data or folder."""
    import importlib

    from adaptcq.errors import JavaMissingError
    from adaptcq.runtime import spark_session

    def missing():
        raise JavaMissingError("the Spark runtime needs a Java runtime: install Java 17")
    monkeypatch.setattr(spark_session, "check_java", missing)
    main = importlib.import_module(f"adaptcq.bench.{bench}").main
    out = tmp_path / "out"
    assert main([*argv, "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.strip() == "adaptcq: error: the Spark runtime needs a Java runtime: install Java 17"
    assert not out.exists()
