"""Resource edges: inputs closed when a run's iterator is closed before its first batch, a
CSV file opened and read once, bench options seen when typed with their default, the
shares' search and the Spark grouping keys at their bounds."""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import adaptcq
from adaptcq.bench import _args
from adaptcq.errors import AdaptcqError, InputError
from adaptcq.optimizer.shares import choose_shares, factorizations, replication, shipped
from adaptcq.stream import sources

SQL = "SELECT R.a, S.b FROM R [RANGE 5 SECONDS], S [RANGE 5 SECONDS] WHERE R.a = S.a"
FD = Path("/proc/self/fd")


def open_files(folder: Path) -> list[str]:
    """The files under ``folder`` this process holds open."""
    out = []
    for fd in os.listdir(FD):
        try:
            target = os.readlink(FD / fd)
        except OSError:
            continue
        if target.startswith(str(folder)):
            out.append(target)
    return out


@pytest.fixture
def csvs(tmp_path):
    for s in "RS":
        pacsv.write_csv(pa.table({"ts": np.arange(20.0), "a": np.arange(20) % 3,
                                  "b": np.arange(20)}), tmp_path / f"{s}.csv")
    return tmp_path


needs_proc = pytest.mark.skipif(not FD.is_dir(), reason="needs /proc/self/fd")


@needs_proc
def test_closing_the_iterator_before_its_first_batch_closes_the_inputs(csvs):
    run = adaptcq.stream(SQL, {"R": str(csvs / "R.csv"), "S": str(csvs / "S.csv")})
    assert len(open_files(csvs)) == 2  # each CSV's first block was read at set-up
    it = iter(run)
    it.close()
    assert open_files(csvs) == []  # now, not at a garbage collection
    assert run.stats["stopped"] == "closed by its consumer"
    assert run.stats["rows_processed"] == {"R": 0, "S": 0}
    assert list(it) == []

    run = adaptcq.stream(SQL, {"R": str(csvs / "R.csv"), "S": str(csvs / "S.csv")})
    it = iter(run)
    del it  # dropped unstarted: closed as it goes
    assert open_files(csvs) == []

    run = adaptcq.stream(SQL, {"R": str(csvs / "R.csv"), "S": str(csvs / "S.csv")})
    it = iter(run)
    first = next(it)  # started, then closed: as before
    it.close()
    assert first.num_rows > 0 and open_files(csvs) == []


@needs_proc
def test_a_set_up_error_closes_the_inputs_opened_before_it(csvs):
    good = {"R": str(csvs / "R.csv"), "S": str(csvs / "S.csv")}
    with pytest.raises(AdaptcqError, match="column"):  # the query, after the inputs
        adaptcq.stream(SQL.replace("S.b", "S.nope"), good)
    assert open_files(csvs) == []
    with pytest.raises(InputError, match="does not exist"):  # the second input
        adaptcq.stream(SQL, {"R": str(csvs / "R.csv"), "S": str(csvs / "none.csv")})
    assert open_files(csvs) == []
    with pytest.raises(InputError, match="no timestamp column 'when'"):
        adaptcq.stream(SQL, good, timestamp="when")
    assert open_files(csvs) == []


def _reference(path: Path, block: int) -> pa.Table:
    """pyarrow's streaming reader with the same block size: types from the first block, a
    column NULL throughout it as text (the file read again with the types corrected)."""
    conv = dict(sources.CSV_NULLS)
    ro = pacsv.ReadOptions(block_size=block)
    with pacsv.open_csv(path, read_options=ro,
                        convert_options=pacsv.ConvertOptions(**conv)) as r:
        schema = r.schema
        if not any(pa.types.is_null(f.type) for f in schema):
            return r.read_all()
    types = {f.name: pa.string() if pa.types.is_null(f.type) else f.type for f in schema}
    with pacsv.open_csv(path, read_options=ro, convert_options=pacsv.ConvertOptions(
            column_types=types, **conv)) as r:
        return r.read_all()


_cell = st.one_of(st.integers(-99, 999).map(str), st.sampled_from(["1.5", "-2.25", "x", "ab"]),
                  st.just(""))


@settings(max_examples=120, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.integers(1, 60), cols=st.lists(st.tuples(st.sampled_from(
    ["int", "float", "text", "late", "cells"]), st.integers(0, 60)), min_size=1, max_size=3),
    block=st.integers(40, 200), cells=st.data())
def test_csv_rows_and_types_are_pyarrows_whatever_the_block(tmp_path, monkeypatch, rows, cols,
                                                            block, cells):
    """A CSV source gives the types and values pyarrow's streaming reader gives, at every
    block size: types from the first block, a column empty throughout it as text."""
    path = tmp_path / "h.csv"
    columns = [[str(float(k)) for k in range(rows)]]
    for kind, empty in cols:
        col = []
        for k in range(rows):
            if kind == "late":  # empty in its first rows, then values
                col.append("" if k < empty else str(k))
            elif kind == "cells":
                col.append(cells.draw(_cell))
            else:
                col.append({"int": str(k * 7 - 20), "float": f"{k / 4}",
                            "text": f"t{k}"}[kind])
        columns.append(col)
    names = ["ts"] + [f"c{j}" for j in range(len(cols))]
    path.write_text("\n".join([",".join(names)] + [",".join(c[k] for c in columns)
                                                   for k in range(rows)]) + "\n")
    monkeypatch.setattr(sources, "CSV_BLOCK", block)
    try:
        want = _reference(path, block)
    except pa.ArrowInvalid:
        want = None
    try:
        src = sources.open_source("H", str(path), "ts")
        got = pa.Table.from_batches(list(src.chunks()), schema=src.schema)
    except InputError:
        got = None
    if want is None or got is None:
        assert want is None and got is None
        return
    assert got.schema == want.schema
    assert got.to_pydict() == want.to_pydict()


def test_a_typed_default_is_an_option_given():
    ap = argparse.ArgumentParser(prog="bench")
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--tag", action="append")
    ap.add_argument("-v", "--verbose", action="count", default=0)
    for argv in (["--runs", "3"], ["--runs=3"], ["--ru", "3"]):
        args = ap.parse_args(argv)
        assert args.runs == ap.get_default("runs")  # the value alone cannot tell
        assert _args.given(ap, argv, ["runs", "duration"]) == ["runs"]
        with pytest.raises(SystemExit):
            _args.refuse_unused(ap, ["runs"], "by fig9", argv=argv)
        _args.refuse_unused(ap, ["duration", "tag", "verbose"], "by fig9", argv=argv)
    assert _args.given(ap, ["--tag", "a", "-vv"], ["tag", "verbose", "runs"]) == \
        ["tag", "verbose"]


def test_refused_options_are_named(capsys):
    top = argparse.ArgumentParser(prog="bench")
    sub = top.add_subparsers(dest="what", required=True)
    f5 = sub.add_parser("fig5")
    f5.add_argument("--seed", type=int, default=0)
    f5.add_argument("--bins", type=int, default=20)
    argv = ["fig5", "--seed", "0", "--bins", "20"]
    top.parse_args(argv)
    with pytest.raises(SystemExit):
        _args.refuse_unused(f5, ["seed", "bins"], "with --source normal", argv=argv[1:])
    assert "--seed, --bins: not used with --source normal" in capsys.readouterr().err


def _exhaustive(covers, rates, P, caps=None):
    """``choose_shares`` as it was: every factorization, the least key."""
    best = None
    for shares in factorizations(P, len(covers)):
        if caps is not None and any(c is not None and p > c
                                    for p, c in zip(shares, caps, strict=True)):
            continue
        cost = shipped(covers, rates, shares)
        replicated = sum(replication(covers, shares, s) > 1 for s in rates)
        key = (round(cost, 9), replicated, tuple(-p for p in shares))
        if best is None or key < best[0]:
            best = (key, shares)
    return None if best is None else best[1]


@settings(max_examples=400, deadline=None)
@given(data=st.data(), m=st.integers(1, 5), k=st.integers(1, 4),
       P=st.sampled_from([1, 2, 4, 6, 8, 12, 16, 24, 30, 36, 60, 64, 72, 97, 120, 210]))
def test_shares_are_the_exhaustive_searchs(data, m, k, P):
    names = "ABCDE"[:m]
    covers = [frozenset(data.draw(st.sets(st.sampled_from(names), max_size=m)))
              for _ in range(k)]
    rates = {s: data.draw(st.sampled_from([1, 1, 2, 3, 0.5, 0.1, 0.3, 7.25, 100]))
             for s in names}
    caps = data.draw(st.one_of(st.none(), st.lists(
        st.sampled_from([None, 1, 2, 3, 4, 8]), min_size=k, max_size=k)))
    want = _exhaustive(covers, rates, P, caps)
    if want is None:
        with pytest.raises(ValueError, match="fit the caps"):
            choose_shares(covers, rates, P, caps)
    else:
        assert choose_shares(covers, rates, P, caps) == want


def test_a_chain_of_nine_classes_at_55440_groups_is_locally_optimal():
    """16 million factorizations; a few thousand states. No move of one prime factor from
    a class to another ships fewer tuples."""
    names = [f"R{i}" for i in range(10)]
    chain = [frozenset(names[i:i + 2]) for i in range(9)]
    rates = {s: i + 1 for i, s in enumerate(names)}
    P = 55440
    got = choose_shares(chain, rates, P)
    assert math.prod(got) == P
    cost = shipped(chain, rates, got)
    for a in range(9):
        for b in range(9):
            for q in (2, 3, 5, 7, 11):
                if a != b and got[a] % q == 0:
                    moved = list(got)
                    moved[a] //= q
                    moved[b] *= q
                    assert shipped(chain, rates, moved) >= cost - 1e-9


def _old_group_keys(P: int, n: int) -> list[int]:
    from adaptcq.runtime.spark import spark_int_hash
    if P <= 1:
        return [0]
    by_part: dict[int, list[int]] = {}
    for k in range(64 * max(n, P)):
        by_part.setdefault(spark_int_hash(k) % n, []).append(k)
    keys: list[int] = []
    for g in range(P):
        used = set(keys)
        keys.append(next(k for k in by_part.get(g % n, []) if k not in used))
    return keys


@pytest.mark.parametrize(("P", "n"), [(1, 8), (2, 1), (4, 2), (4, 4), (7, 3), (37, 200),
                                      (200, 200), (300, 7), (1000, 16), (5, 1000),
                                      (2048, 2048)])
def test_group_keys_are_the_loops(P, n):
    pytest.importorskip("pyspark")
    from adaptcq.runtime.spark import _group_keys
    assert _group_keys(None, P, n) == _old_group_keys(P, n)


def test_vectorized_hash_is_the_scalar_one():
    pytest.importorskip("pyspark")
    from adaptcq.runtime.spark import _spark_int_hashes, spark_int_hash
    vals = [0, 1, -1, 2, 7, 42, 255, 65_536, 2**31 - 1, -(2**31), 123_456_789,
            *range(3, 3000, 7)]
    assert _spark_int_hashes(np.array(vals, np.int64)).tolist() == \
        [spark_int_hash(v) for v in vals]
