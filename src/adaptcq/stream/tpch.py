"""TPC-H tables as insert streams, and Q3 and Q5 as continuous queries over them.

The tables come from DuckDB's ``tpch`` extension (``CALL dbgen(sf=...)``), installed from
the package registry as the ``duckdb-extension-tpch`` wheel (``duckdb_extensions``), so no
download from extensions.duckdb.org is needed. Every row of every table gets an arrival
time: the rows of all tables in one random order (a seeded permutation), ``rate`` rows per
second in all, so that each table arrives spread over the whole run, not one table after
another; each table is then written, in arrival order, as ``files`` Parquet time slices
(one per micro-batch when read with ``maxFilesPerTrigger=1``).

The streams are unbounded (no window): Q3 and Q5 are maintained as views, every join row
emitted once, when its last component arrives, so the union of the output is the join of
the whole tables whatever the arrival order. adaptcq does joins, not aggregation: the
queries output the join rows (keys), not TPC-H's grouped revenue. Dates are written as
``yyyymmdd`` integers, so the date conditions are integer comparisons.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

__all__ = ["COLUMNS", "QUERIES", "generate", "tables"]

#: the columns each query needs, per table
COLUMNS = {
    "customer": ["c_custkey", "c_mktsegment", "c_nationkey"],
    "orders": ["o_orderkey", "o_custkey", "o_orderdate"],
    "lineitem": ["l_orderkey", "l_linenumber", "l_suppkey", "l_shipdate"],
    "supplier": ["s_suppkey", "s_nationkey"],
    "nation": ["n_nationkey", "n_name", "n_regionkey"],
    "region": ["r_regionkey", "r_name"],
}
_DATES = {"o_orderdate", "l_shipdate"}

#: TPC-H Q3 and Q5's joins and selections, as continuous queries over the streams
QUERIES = {
    "q3": ("SELECT c.c_custkey AS custkey, o.o_orderkey AS orderkey, "
           "l.l_linenumber AS linenumber "
           "FROM customer c, orders o, lineitem l "
           "WHERE c.c_mktsegment = 'BUILDING' AND c.c_custkey = o.o_custkey "
           "AND l.l_orderkey = o.o_orderkey AND o.o_orderdate < 19950315 "
           "AND l.l_shipdate > 19950315"),
    "q5": ("SELECT c.c_custkey AS custkey, o.o_orderkey AS orderkey, "
           "l.l_linenumber AS linenumber, s.s_suppkey AS suppkey, n.n_name AS nation "
           "FROM customer c, orders o, lineitem l, supplier s, nation n, region r "
           "WHERE c.c_custkey = o.o_custkey AND l.l_orderkey = o.o_orderkey "
           "AND l.l_suppkey = s.s_suppkey AND c.c_nationkey = s.s_nationkey "
           "AND s.s_nationkey = n.n_nationkey AND n.n_regionkey = r.r_regionkey "
           "AND r.r_name = 'ASIA' AND o.o_orderdate >= 19940101 "
           "AND o.o_orderdate < 19950101"),
}
#: the tables each query reads
SOURCES = {"q3": ["customer", "orders", "lineitem"], "q5": list(COLUMNS)}
#: the id columns that identify a result row (to compare two engines' outputs)
IDS = {"q3": ["custkey", "orderkey", "linenumber"],
       "q5": ["custkey", "orderkey", "linenumber", "suppkey"]}


def tables(sf: float) -> dict:
    """The TPC-H tables at scale factor ``sf`` (``COLUMNS`` only) as Arrow tables."""
    import duckdb
    try:
        import duckdb_extensions
        duckdb_extensions.import_extension("tpch")
    except ImportError:  # pragma: no cover - the extension may come with duckdb itself
        pass
    con = duckdb.connect()
    try:
        con.execute("LOAD tpch")
    except duckdb.Error as e:
        raise RuntimeError(
            "DuckDB's tpch extension is not available: install the duckdb-extensions and "
            f"duckdb-extension-tpch packages of the same version as duckdb ({e})") from None
    con.execute(f"CALL dbgen(sf={float(sf)})")
    out = {}
    for name, cols in COLUMNS.items():
        sel = ", ".join(f"CAST(strftime({c}, '%Y%m%d') AS INTEGER) AS {c}" if c in _DATES
                        else c for c in cols)
        out[name] = con.execute(f"SELECT {sel} FROM {name}").arrow()
        if hasattr(out[name], "read_all"):  # duckdb returns a reader in newer versions
            out[name] = out[name].read_all()
    con.close()
    return out


def generate(sf: float, root: str | os.PathLike, files: int = 10, rate: float = 100_000.0,
             seed: int = 0) -> dict[str, str]:
    """Write the TPC-H tables at ``sf`` as insert streams under ``root`` (module
    docstring): ``root/<table>/part-<k>.parquet`` with a ``ts`` column (seconds), ``files``
    time slices per table. Returns {table: folder}. Reuses ``root`` when it holds the same
    (sf, files, rate, seed)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    root = Path(root)
    marker = root / "done.json"
    spec = {"sf": sf, "files": files, "rate": rate, "seed": seed}
    if marker.exists() and json.loads(marker.read_text()) == spec:
        return {n: str(root / n) for n in COLUMNS}
    shutil.rmtree(root, ignore_errors=True)
    data = tables(sf)
    sizes = [data[n].num_rows for n in COLUMNS]
    total = sum(sizes)
    # One arrival order for all tables: position k of a seeded permutation arrives at k/rate.
    pos = np.random.default_rng(seed).permutation(total)
    end = total / rate
    cuts = np.linspace(0.0, end, files + 1)
    cuts[-1] = np.inf
    start = 0
    for (name, t), n in zip(data.items(), sizes, strict=True):
        ts = np.sort(pos[start:start + n]) / rate
        order = np.argsort(pos[start:start + n], kind="stable")
        start += n
        t = t.take(pa.array(order)).append_column("ts", pa.array(ts))
        d = root / name
        d.mkdir(parents=True)
        idx = np.searchsorted(ts, cuts, side="left")
        for k in range(files):
            p = d / f"part-{k:04d}.parquet"
            pq.write_table(t.slice(idx[k], idx[k + 1] - idx[k]), p)
            os.utime(p, (1_600_000_000 + 10 * k, 1_600_000_000 + 10 * k))
    marker.write_text(json.dumps(spec))
    return {n: str(root / n) for n in COLUMNS}
