"""The vectorized executor gives exactly MJoin's output (issue 16): the same rows with the same
``_sign`` and ``_ts``, in the same order of updates (any order within one update), for random
queries, data, batch sizes and pipeline orders."""

from __future__ import annotations

import itertools
import random
from collections import Counter

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import adaptcq
from adaptcq.engine.continuous import ContinuousQuery
from adaptcq.engine.vector import VectorJoin, _Ledger, batch_from_rows, unsupported
from adaptcq.errors import OptionError
from adaptcq.query.cql import parse_query
from conftest import examples
from oracle import Oracle, engine_outputs
from test_engine_oracle import arrivals, as_tuples, queries

INT_SCHEMA = pa.schema([(c, pa.int64()) for c in ("a", "b", "c", "id")])


def schemas(q, schema=INT_SCHEMA):
    return {a: pa.schema([schema.field(c) for c in q.columns[a]]) for a in q.aliases}


def mjoin_updates(q, mode, streams, signs, ts, rows):
    """MJoin's output split by update: the non-empty Counters, in update order."""
    cq = ContinuousQuery(q, "mjoin", mode, trace=True, explicit_deletions=signs is not None)
    out = cq.process(streams, signs, ts, rows)
    return [c for c in engine_outputs(cq.trace, out)[1] if c], cq


def vector_updates(q, mode, streams, signs, ts, rows, cuts, rnd=None, schema=INT_SCHEMA,
                   limits: dict | None = None):
    """The vectorized executor's output over batches cut at ``cuts``, split by update (its
    ``_pos``); with ``rnd``, random pipeline orders before every batch; ``limits`` sets the
    executor's own attributes first (``step_limit``, ``range_updates``)."""
    vj = VectorJoin(q, mode, schemas(q, schema), explicit_deletions=signs is not None,
                    ts_dtype=np.asarray(ts).dtype if len(ts) else np.int64)
    for name, value in (limits or {}).items():
        setattr(vj, name, value)
    groups: dict[int, Counter] = {}
    order: list[int] = []
    bounds = [0, *cuts, len(rows)]
    for lo, hi in itertools.pairwise(bounds):
        if hi <= lo:
            continue
        if rnd is not None:
            for a in q.aliases:
                others = [x for x in q.aliases if x != a]
                rnd.shuffle(others)
                vj.set_order(a, others)
        batch = batch_from_rows(q, vj.schemas, streams[lo:hi],
                                None if signs is None else signs[lo:hi], ts[lo:hi], rows[lo:hi])
        out = vj.process_batch(batch, positions=True)
        for r in out.to_pylist():
            p = r.pop("_pos")
            if p not in groups:
                groups[p] = Counter()
                order.append(p)
            groups[p][tuple(r.values())] += 1
    assert order == sorted(order), "updates out of order"
    return [groups[p] for p in order], vj


def random_cuts(rnd, n):
    k = rnd.randint(0, min(6, max(0, n - 1)))
    return sorted(rnd.sample(range(1, n), k)) if n > 1 else []


common = settings(max_examples=examples(150), deadline=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@common
@given(data=st.data(), mode=st.sampled_from(["append", "retract"]), seed=st.integers(0, 10**6))
def test_vector_equals_mjoin(data, mode, seed):
    """Random queries (chains, stars, cycles, complete graphs, two-column keys), selections,
    NULL keys, duplicates, RANGE/ROWS/unbounded windows, random batches and orders."""
    q = data.draw(queries(max_streams=5))
    streams, ts, rows = data.draw(arrivals(len(q.aliases), max_rows=30))
    rows = as_tuples(q, streams, rows)
    want, cq = mjoin_updates(q, mode, streams, None, ts, rows)
    rnd = random.Random(seed)
    got, vj = vector_updates(q, mode, streams, None, ts, rows, random_cuts(rnd, len(rows)),
                             rnd if seed % 2 else None)
    assert got == want
    assert vj.stats.updates == cq.stats.updates
    assert vj.stats.filtered == cq.stats.filtered
    assert vj.state_tuples() == cq.executor.state_tuples()


@common
@given(data=st.data(), mode=st.sampled_from(["append", "retract"]), seed=st.integers(0, 10**6))
def test_vector_explicit_deletions(data, mode, seed):
    """Unbounded streams with explicit deletions (sign -1): the oldest equal row leaves, a
    deletion of a row that is not there is rejected, as in MJoin."""
    rnd = random.Random(seed)
    n = data.draw(st.integers(2, 4))
    names = [f"S{i}" for i in range(n)]
    preds = [f"{names[rnd.randrange(i)]}.a = {names[i]}.{rnd.choice('ab')}" for i in range(1, n)]
    sel = " AND S0.c <> 1" if seed % 3 == 0 else ""
    sql = (f"SELECT {', '.join(f'{x}.id AS i{k}' for k, x in enumerate(names))} "
           f"FROM {', '.join(names)} WHERE {' AND '.join(preds)}{sel}")
    q = parse_query(sql, {x: {"a": "number", "b": "number", "c": "number", "id": "number"}
                          for x in names})
    k = data.draw(st.integers(1, 30))
    streams, ts, rows, signs = [], [], [], []
    seen: dict[int, list] = {}
    t = 0
    for j in range(k):
        t += rnd.choice([0, 0, 1])
        i = rnd.randrange(n)
        old = seen.get(i)
        if old and rnd.random() < 0.35:
            row, sign = rnd.choice(old), -1
        else:
            d = {"a": rnd.choice([0, 1, None]), "b": rnd.choice([0, 1]),
                 "c": rnd.choice([0, 1]), "id": rnd.choice([j, 0])}
            row, sign = tuple(d[c] for c in q.columns[names[i]]), 1
            if rnd.random() < 0.1:
                sign = -1  # a deletion of a row that may not be there
            else:
                seen.setdefault(i, []).append(row)
        streams.append(i)
        ts.append(t)
        rows.append(row)
        signs.append(sign)
    want, cq = mjoin_updates(q, mode, streams, signs, ts, rows)
    got, vj = vector_updates(q, mode, streams, signs, ts, rows, random_cuts(rnd, len(rows)))
    assert got == want
    assert vj.stats.rejected == cq.stats.rejected
    assert vj.state_tuples() == cq.executor.state_tuples()
    assert all(isinstance(v, _Ledger) for v in vj.values)  # matched over columns


MIXED_SCHEMA = pa.schema([("a", pa.int64()), ("f", pa.float64()), ("s", pa.string()),
                          ("id", pa.int64())])


@common
@given(data=st.data(), mode=st.sampled_from(["append", "retract"]), seed=st.integers(0, 10**6))
def test_explicit_deletions_match_rows_as_python_does(data, mode, seed):
    """Deletions matched over columns (_Ledger) take the row the per-tuple engine takes
    (``row_key``): NULL equals NULL, -0.0 equals 0.0, NaN equals NaN (a deletion of a row
    holding NaN finds it); strings and duplicates; deletions
    that find nothing are rejected; any batch cuts."""
    rnd = random.Random(seed)
    q = parse_query("SELECT R.id AS r, S.id AS i, S.s AS s FROM R, S "
                    "WHERE R.a = S.a AND R.f <> 2",
                    {x: {"a": "number", "f": "number", "s": "string", "id": "number"}
                     for x in "RS"})
    k = data.draw(st.integers(1, 40))
    streams, ts, rows, signs = [], [], [], []
    seen: dict[int, list] = {}
    for j in range(k):
        i = rnd.randrange(2)
        old = seen.get(i)
        if old and rnd.random() < 0.4:
            # an equal row built anew, as rows read from Arrow are: a fresh NaN object
            # matches (row_key), and so do 0.0 and -0.0
            row, sign = tuple(float(str(v)) if isinstance(v, float) else v
                              for v in rnd.choice(old)), -1
            if rnd.random() < 0.3:
                row = tuple(-v if isinstance(v, float) and v == 0.0 else v for v in row)
        else:
            d = {"a": rnd.choice([0, 1, None]),
                 "f": rnd.choice([0.0, -0.0, 1.5, 2.0, float("nan"), None]),
                 "s": rnd.choice(["x", "", None, "é"]), "id": rnd.choice([j, 0])}
            row, sign = tuple(d[c] for c in q.columns["RS"[i]]), 1
            if rnd.random() < 0.1:
                sign = -1
            else:
                seen.setdefault(i, []).append(row)
        streams.append(i)
        ts.append(j // 3)
        rows.append(row)
        signs.append(sign)
    want, cq = mjoin_updates(q, mode, streams, signs, ts, rows)
    got, vj = vector_updates(q, mode, streams, signs, ts, rows, random_cuts(rnd, len(rows)),
                             schema=MIXED_SCHEMA)
    assert got == want
    assert vj.stats.rejected == cq.stats.rejected
    assert vj.stats.filtered == cq.stats.filtered
    assert vj.state_tuples() == cq.executor.state_tuples()
    assert all(isinstance(v, _Ledger) for v in vj.values)


def test_batch_size_does_not_change_the_output():
    """One batch, batches of one, and a batch larger than the input give the same rows."""
    rnd = random.Random(7)
    q = parse_query("SELECT R.id AS r, S.id AS s, T.id AS t FROM R [RANGE 3 SECONDS], "
                    "S [ROWS 5], T [RANGE 2 SECONDS] WHERE R.a = S.a AND S.b = T.b",
                    {x: {"a": "number", "b": "number", "id": "number"} for x in "RST"})
    n = 400
    streams = [rnd.randrange(3) for _ in range(n)]
    ts = np.cumsum([rnd.choice([0, 0, 1]) for _ in range(n)]).tolist()
    rows = [tuple({"a": rnd.randrange(4), "b": rnd.randrange(4), "id": j}[c]
                  for c in q.columns[q.aliases[i]]) for j, i in enumerate(streams)]
    for mode in ("append", "retract"):
        want, _ = mjoin_updates(q, mode, streams, None, ts, rows)
        assert sum(map(len, want)) > 50
        for cuts in ([], list(range(1, n)), [n // 3, n // 2]):
            got, _ = vector_updates(q, mode, streams, None, ts, rows, cuts)
            assert got == want


def test_string_float_and_two_column_keys():
    """Hashed (string) keys are checked on their values; float keys join as numbers (-0.0
    equals 0.0, NaN joins nothing); a two-column key checks each column."""
    q = parse_query("SELECT R.id AS r, S.id AS s FROM R, S WHERE R.k = S.k AND R.x = S.x",
                    {x: {"k": "string", "x": "number", "id": "number"} for x in "RS"})
    schema = pa.schema([("k", pa.string()), ("x", pa.float64()), ("id", pa.int64())])
    rows = [("a", 0.0, 1), ("a", -0.0, 2), ("b", float("nan"), 3), ("b", float("nan"), 4),
            (None, 1.0, 5), (None, 1.0, 6), ("é", 2.5, 7), ("é", 2.5, 8)]
    streams = [0, 1, 0, 1, 0, 1, 0, 1]
    ts = list(range(8))
    for mode in ("append", "retract"):
        want, _ = mjoin_updates(q, mode, streams, None, ts, rows)
        got, _ = vector_updates(q, mode, streams, None, ts, rows, [3], schema=schema)
        assert got == want
        assert [set(c) for c in got] == [{(1, 2, 1, 1)}, {(7, 8, 1, 7)}]


def test_oracle_on_the_batch_rule():
    """The vectorized output against the brute-force oracle directly (not only MJoin)."""
    q = parse_query("SELECT R.id AS r, S.id AS s FROM R [RANGE 1 SECONDS], S [ROWS 2] "
                    "WHERE R.a = S.a", {x: {"a": "number", "id": "number"} for x in "RS"})
    streams = [0, 1, 1, 0, 1, 1, 0]
    ts = [0, 0, 1, 1, 2, 3, 3]
    rows = [(1, 0), (1, 1), (1, 2), (1, 3), (1, 4), (2, 5), (1, 6)]
    for mode in ("append", "retract"):
        _, outs = Oracle(q, mode).run(streams, None, ts, rows)
        got, _ = vector_updates(q, mode, streams, None, ts, rows, [2])
        assert got == [c for c in outs if c]


def test_expressions_in_select_are_refused_with_a_reason():
    q = parse_query("SELECT R.a + 1 AS x FROM R, S WHERE R.a = S.a",
                    {x: {"a": "number"} for x in "RS"})
    assert "expression" in unsupported(q)
    with pytest.raises(OptionError, match="outputs columns only"):
        VectorJoin(q, "append", {a: pa.schema([("a", pa.int64())]) for a in "RS"})


@common
@given(data=st.data(), seed=st.integers(0, 10**6))
def test_advance_to_and_load_match_mjoin(data, seed):
    """Time advanced between batches (a Spark group's release bound) expires rows as
    ``ContinuousQuery.advance_to`` does; an executor rebuilt with ``load`` from the arrivals
    continues exactly as the original."""
    q = data.draw(queries(max_streams=4))
    streams, ts, rows = data.draw(arrivals(len(q.aliases), max_rows=30))
    rows = as_tuples(q, streams, rows)
    rnd = random.Random(seed)
    cuts = random_cuts(rnd, len(rows))
    bounds = [0, *cuts, len(rows)]
    cq = ContinuousQuery(q, "mjoin", "retract", trace=True)
    vj = VectorJoin(q, "retract", schemas(q), ts_dtype=np.float64)
    out, got = [], {}

    def take(table):
        for r in table.to_pylist():
            got.setdefault(r.pop("_pos"), Counter())[tuple(r.values())] += 1

    for lo, hi in itertools.pairwise(bounds):
        out += cq.process(streams[lo:hi], None, ts[lo:hi], rows[lo:hi])
        b = batch_from_rows(q, vj.schemas, streams[lo:hi], None, ts[lo:hi], rows[lo:hi])
        take(vj.process_batch(b, positions=True))
        now = ts[hi] if hi < len(rows) else ts[-1] + rnd.choice([0, 1, 5])
        cq.advance_to(now)
        out += cq.drain()
        take(vj.advance_to(now, positions=True))
    want = [c for c in engine_outputs(cq.trace, out)[1] if c]
    assert [got[p] for p in sorted(got)] == want
    # rebuilt from its input, then both continue with the same arrivals
    cut = rnd.randint(0, len(rows))
    first = VectorJoin(q, "retract", schemas(q), ts_dtype=np.float64)
    whole = VectorJoin(q, "retract", schemas(q), ts_dtype=np.float64)
    part = batch_from_rows(q, first.schemas, streams[:cut], None, ts[:cut], rows[:cut])
    first.load(part, expired_before=ts[cut - 1] if cut else None)
    whole.process_batch(part)
    if cut:
        whole.advance_to(ts[cut - 1])
    rest = batch_from_rows(q, first.schemas, streams[cut:], None, ts[cut:], rows[cut:])
    assert first.process_batch(rest).to_pylist() == whole.process_batch(rest).to_pylist()
    assert first.state_tuples() == whole.state_tuples()


def test_update_ranks_is_the_processing_order():
    """_update_ranks counts instead of sorting: against the sort it replaces, by (arrival,
    phase, then for time expiries (e, tie)), equal keys in the order listed."""
    from adaptcq.engine.vector import _update_ranks
    rng = np.random.default_rng(3)
    for trial in range(500):
        n = int(rng.integers(0, 30))
        k, phase = rng.integers(0, 6, n), rng.integers(0, 3, n)
        e = rng.integers(0, 4, n) if trial % 2 else rng.random(n)
        tie = rng.integers(0, 5, n)
        if trial % 3 == 0:  # times that grow with the arrival, as _time_expiries lists them
            e = np.sort(e)[np.argsort(np.argsort(k, kind="stable"), kind="stable")]
        key = [(k[u], phase[u], e[u] if phase[u] == 0 else 0, tie[u] if phase[u] == 0 else 0,
                u) for u in range(n)]
        want = np.empty(n, np.int64)
        want[sorted(range(n), key=key.__getitem__)] = np.arange(n)
        # _update_ranks takes the others, then the time expiries (phase 0), as listed
        ex = phase == 0
        listed = np.concatenate([np.flatnonzero(~ex), np.flatnonzero(ex)])
        got = np.empty(n, np.int64)
        got[listed] = _update_ranks(k[~ex], phase[~ex], k[ex], e[ex], tie[ex])
        assert got.tolist() == want.tolist()


def test_radix_sorted_runs_equal_compared_ones(monkeypatch):
    """_Run orders a large run with a radix sort (_stable_order): the same arrays as the
    comparison sorts, for small and wide spans, negative codes and hashed (non-direct)
    ones; and a join whose runs all take the radix path gives MJoin's output."""
    from adaptcq.engine import vector
    rng = np.random.default_rng(5)
    for lo, hi in [(0, 50), (-70_000, 70_000), (5, 2**40), (-2**63, 2**63 - 1)]:
        for n in (0, 1, 7, 300, 3000):
            code = rng.integers(lo, hi, n, dtype=np.int64)
            off = code.view(np.uint64) - np.uint64(int(code.min(initial=0)) % 2**64)
            span = int(code.max(initial=0)) - int(code.min(initial=0))
            assert (vector._stable_order(off, span) == np.argsort(code, kind="stable")).all()
            sid = np.sort(rng.choice(10 * n + 1, n, replace=False)).astype(np.int64) + 3
            runs = []
            for rows in (0, 10**9):  # every run radix-sorted, then none
                monkeypatch.setattr(vector, "_RADIX_ROWS", rows)
                runs.append(vector._Run(3, 10 * n + 4, code, sid))
            a, b = runs
            assert a.direct == b.direct
            for name in ("comb", "code", "sid", "rank"):
                x, y = getattr(a, name), getattr(b, name)
                assert (x is None and y is None) or (x == y).all(), name
    monkeypatch.setattr(vector, "_RADIX_ROWS", 0)
    test_batch_size_does_not_change_the_output()


def test_explicit_deletions_at_scale_compact_the_ledger_and_the_window():
    """Thousands of deletions: the window compacts (rows renumbered) and the ledger drops
    its taken entries, and the output is still MJoin's, row for row."""
    import adaptcq
    n = 6_000

    def stream(seed):
        rnd = random.Random(seed)
        live, rows = [], []
        for j in range(n):
            if live and rnd.random() < 0.45:  # a live row leaves (or, 1 in 20, a stranger)
                a, i = live.pop(rnd.randrange(len(live))) if rnd.random() < 0.95 else (-1, j)
                rows.append((a, i, -1))
            else:
                a = rnd.randrange(300)
                live.append((a, j if rnd.random() < 0.9 else 0))  # some duplicates
                rows.append((*live[-1], 1))
        a, ids, sg = zip(*rows, strict=True)
        return pa.table({"ts": np.arange(n) * 0.01, "a": list(a), "id": list(ids),
                         "sg": pa.array(sg, pa.int8())})

    sources = {"R": stream(1), "S": stream(2)}
    sql = "SELECT R.id AS r, S.id AS s FROM R, S WHERE R.a = S.a"
    want = adaptcq.run(sql, sources, sign="sg", executor="mjoin")
    got = adaptcq.run(sql, sources, sign="sg", batch_rows=700)
    assert got.stats["executor"] == "vector"
    assert got.table.to_pylist() == want.table.to_pylist()
    assert got.stats["rejected"] == want.stats["rejected"] > 0


def test_a_window_beyond_a_float_is_refused_by_name_or_run_per_tuple():
    """[RANGE 1e400] (an exact int) raised OverflowError in the vectorized executor's check
    (and so in the default executor); auto now runs MJoin, vector and shed refuse it."""
    tabs = {"R": pa.table({"ts": [0, 5], "a": [1, 1]}), "S": pa.table({"ts": [1, 6], "a": [1, 1]})}
    sql = "SELECT R.a FROM R [RANGE 1e400], S [RANGE 1e400] WHERE R.a = S.a"
    want = adaptcq.run(sql, tabs, executor="mjoin").table
    assert adaptcq.run(sql, tabs).table.equals(want) and want.num_rows == 4
    with pytest.raises(OptionError, match=r"\[RANGE 1\.000e\+400 SECONDS\] window is longer"):
        adaptcq.run(sql, tabs, executor="vector")
    with pytest.raises(OptionError, match="longer than a float holds"):
        adaptcq.run(sql, tabs, executor="shed")
