"""JSON lines write every Arrow duration unit as one exact ISO 8601 duration; the vectorized
executor builds a batch's output a bounded number of rows at a time (``step_limit``), and
splitting a batch so gives exactly the brute-force oracle's output, update by update."""

from __future__ import annotations

import datetime as dt
import json
import random
from collections import Counter

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adaptcq.cli import main
from adaptcq.engine.vector import VectorJoin, batch_from_rows
from adaptcq.query.cql import parse_query
from adaptcq.runtime.output import json_lines
from conftest import examples
from oracle import Oracle
from test_engine_oracle import arrivals, as_tuples, queries
from test_vector import INT_SCHEMA, random_cuts, schemas, vector_updates

# ----- JSON lines: durations ------------------------------------------------------------


@pytest.mark.parametrize(("unit", "value", "text"), [
    ("s", 86_400, "P1DT0H0M0S"),
    ("ms", 90_061_500, "P1DT1H1M1.5S"),
    ("us", 86_400_000_005, "P1DT0H0M0.000005S"),
    ("ns", 86_400_000_000_005, "P1DT0H0M0.000000005S"),
    ("us", -5, "-P0DT0H0M0.000005S"),
    ("ns", -86_400_000_000_005, "-P1DT0H0M0.000000005S"),
    ("ms", 0, "P0DT0H0M0S"),
    ("ns", -(2 ** 63 - 1), "-P106751DT23H47M16.854775807S"),
])
def test_jsonl_durations_are_one_exact_iso_form(unit, value, text):
    """Every unit, negative ones too, in a list and a struct as well: one ISO 8601 form,
    exact to the nanosecond, which pandas reads back as the same duration."""
    col = pa.array([value, None], pa.duration(unit))
    batch = pa.record_batch({
        "d": col,
        "l": pa.array([[value], None], pa.list_(pa.duration(unit))),
        "s": pa.StructArray.from_arrays([col], ["x"]),
    })
    rows = [json.loads(line) for line in json_lines(batch.to_pylist()).splitlines()]
    assert rows[0] == {"d": text, "l": [text], "s": {"x": text}}
    assert rows[1] == {"d": None, "l": None, "s": {"x": None}}
    assert pd.Timedelta(text).value == value * {"s": 10**9, "ms": 10**6, "us": 10**3,
                                                "ns": 1}[unit]


def test_jsonl_output_file_writes_units_alike(tmp_path):
    """The same duration stored in microseconds and in nanoseconds is the same text in a
    JSON lines output file (it was Python's str() for one and ISO 8601 for the other)."""
    pq.write_table(pa.table({
        "ts": [1], "a": [1],
        "du": pa.array([dt.timedelta(days=-1, microseconds=5)], pa.duration("us")),
        "dn": pa.array([-86_400_000_000_000 + 5_000], pa.duration("ns"))}),
        tmp_path / "R.parquet")
    pq.write_table(pa.table({"ts": [1], "a": [1]}), tmp_path / "S.parquet")
    out = tmp_path / "o.jsonl"
    assert main(["run", "--no-progress", "--executor", "mjoin", "--sql",
                 "SELECT R.du, R.dn FROM R, S WHERE R.a = S.a",
                 "--input", f"R={tmp_path / 'R.parquet'}",
                 "--input", f"S={tmp_path / 'S.parquet'}", "--output", str(out)]) == 0
    row = json.loads(out.read_text().splitlines()[0])
    assert (row["du"], row["dn"]) == ("-P0DT23H59M59.999995S",) * 2


# ----- the vectorized executor: a batch's output a bounded number of rows at a time -------

def _one_key(n: int, mode: str = "append"):
    """R and S of n arrivals each, interleaved, all with the same key, unbounded windows
    for append (n * n results) or [ROWS 50] for retract."""
    w = "" if mode == "append" else " [ROWS 50]"
    q = parse_query(f"SELECT R.id AS r, S.id AS s FROM R{w}, S{w} WHERE R.a = S.a",
                    {x: {"a": "number", "id": "number"} for x in "RS"})
    streams = [k % 2 for k in range(2 * n)]
    ts = list(range(2 * n))
    rows = as_tuples(q, streams, [{"a": 1, "id": k} for k in range(2 * n)])
    return q, streams, ts, rows


def _vector(q, mode, step_limit=None, range_updates=None, ts_dtype=np.int64):
    vj = VectorJoin(q, mode, schemas(q, INT_SCHEMA), ts_dtype=ts_dtype)
    if step_limit is not None:
        vj.step_limit = step_limit
    if range_updates is not None:
        vj.range_updates = range_updates
    return vj


def test_default_batch_output_leaves_in_bounded_pieces():
    """One default batch (20,000 arrivals) whose output is 640,000 rows, over 2.4 times
    ``step_limit``: the output leaves through ``emit`` in several tables, none larger than
    ``step_limit``, in update order, and all of them are the whole output."""
    q, streams, ts, rows = _one_key(800)
    vj = _vector(q, "append")
    tables = []
    vj.emit = tables.append
    batch = batch_from_rows(q, vj.schemas, streams, None, ts, rows)
    assert vj.process_batch(batch).num_rows == 0  # (all of it went to emit)
    sizes = [t.num_rows for t in tables]
    assert sum(sizes) == 800 * 800 == vj.stats.results
    assert len(sizes) >= 3
    assert max(sizes) <= vj.step_limit
    got = Counter(zip(*(pa.concat_tables(tables).column(c).to_pylist() for c in ("r", "s")),
                      strict=True))
    assert got == Counter((r, s) for r in range(0, 1600, 2) for s in range(1, 1600, 2))
    ts_out = pa.concat_tables(tables).column("_ts").to_numpy()
    assert (np.diff(ts_out) >= 0).all()  # update order: each insertion's time


def test_one_update_larger_than_the_limit_is_built_whole():
    """An update that alone joins more than ``step_limit`` rows cannot be split: it is
    built at once (no endless splitting), the others still in bounded pieces."""
    q = parse_query("SELECT R.id AS r, S.id AS s FROM R, S WHERE R.a = S.a",
                    {x: {"a": "number", "id": "number"} for x in "RS"})
    streams = [1] * 30 + [0] * 3
    rows = as_tuples(q, streams, [{"a": 1, "id": k} for k in range(33)])
    vj = _vector(q, "append", step_limit=10)
    tables = []
    vj.emit = tables.append
    vj.process_batch(batch_from_rows(q, vj.schemas, streams, None, list(range(33)), rows))
    assert [t.num_rows for t in tables] == [30, 30, 30]


def test_selectivity_is_one_observation_a_batch():
    """σ is measured over the W most recent batches (docs/vector.md): a batch split into
    many ranges is still one observation per joined pair, with all its matches."""
    q, streams, ts, rows = _one_key(200)
    vj = _vector(q, "append", step_limit=500)
    tables = []
    vj.emit = tables.append
    vj.process_batch(batch_from_rows(q, vj.schemas, streams, None, ts, rows))
    assert len(tables) > 10
    assert {k: r.n for k, r in vj.selectivity.items()} == {("R", "S"): 1, ("S", "R"): 1}
    assert sum(num for r in vj.selectivity.values() for num, _ in r._obs) == 200 * 200


common = settings(max_examples=examples(150), deadline=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _split_run(q, mode, streams, signs, ts, rows, cuts, step_limit, range_updates):
    """The vectorized executor's output over batches cut at ``cuts`` with the given limits,
    by update (the non-empty Counters in update order), against the brute-force oracle's."""
    got, _ = vector_updates(q, mode, streams, signs, ts, rows, cuts,
                            limits={"step_limit": step_limit, "range_updates": range_updates})
    want = [c for c in Oracle(q, mode).run(streams, signs, ts, rows)[1] if c]
    assert got == want


@common
@given(data=st.data(), mode=st.sampled_from(["append", "retract"]), seed=st.integers(0, 10**6),
       step_limit=st.integers(1, 12), range_updates=st.integers(1, 40))
def test_split_batches_equal_the_oracle(data, mode, seed, step_limit, range_updates):
    """Random queries, windows, data and batch cuts, with tiny ``step_limit`` and
    ``range_updates`` so that ranges are split at every step: the output, update by
    update and in update order, is the brute-force oracle's."""
    q = data.draw(queries(max_streams=4))
    streams, ts, rows = data.draw(arrivals(len(q.aliases), max_rows=30))
    rows = as_tuples(q, streams, rows)
    _split_run(q, mode, streams, None, ts, rows, random_cuts(random.Random(seed), len(rows)),
               step_limit, range_updates)


@pytest.mark.parametrize("mode", ["append", "retract"])
def test_split_batches_with_explicit_deletions_equal_the_oracle(mode):
    """Unbounded windows whose rows leave from the middle (explicit deletions, tested after
    the rows are counted), split into ranges of a few rows: the oracle's output."""
    q = parse_query("SELECT R.id AS r, S.id AS s, T.id AS t FROM R, S, T "
                    "WHERE R.a = S.a AND S.a = T.a",
                    {x: {"a": "number", "id": "number"} for x in "RST"})
    rnd = random.Random(11)
    streams, ts, rows, signs, seen = [], [], [], [], {0: [], 1: [], 2: []}
    for k in range(120):
        i = rnd.randrange(3)
        if seen[i] and rnd.random() < 0.3:
            row, sign = seen[i].pop(rnd.randrange(len(seen[i]))), -1
        else:
            row, sign = (rnd.randrange(2), k), 1
            seen[i].append(row)
        streams.append(i)
        ts.append(k // 4)
        rows.append(row)
        signs.append(sign)
    for step_limit, cuts in ((3, [40, 80]), (17, [])):
        _split_run(q, mode, streams, signs, ts, rows, cuts, step_limit, 5)
