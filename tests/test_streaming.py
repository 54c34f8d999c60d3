"""The streaming local runtime: incremental sources, the bounded merge, results as they come,
exact event times, output types from the input schema, and the run's guards (issue 8)."""

from __future__ import annotations

import itertools
import json
import signal
from collections import Counter

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import adaptcq
from adaptcq.cli import main
from adaptcq.errors import AdaptcqError, InputError
from adaptcq.runtime.local import LocalRun
from conftest import examples

SQL2 = "SELECT R.id AS r, S.id AS s FROM R [RANGE 3 SECONDS], S [RANGE 3 SECONDS] WHERE R.a = S.a"
SQL_SELF = ("SELECT x.id AS x, y.id AS y, S.id AS s FROM R [RANGE 3 SECONDS] AS x, R [RANGE 2 SECONDS] AS y, "
            "S [RANGE 3 SECONDS] WHERE x.a = y.a AND y.a = S.a")


def rows_of(table: pa.Table) -> Counter:
    return Counter(zip(*[table.column(c).to_pylist() for c in table.column_names]))


# ----- the merge --------------------------------------------------------------------------
def reference_merge(sources: dict[str, list[dict]], aliases: list[str], lateness: int):
    """The definition (docs/semantics.md): a row is late when its time is below the largest
    earlier time of its source minus the lateness; the others are processed in (time, FROM
    position, row) order."""
    accepted, late = {}, set()
    for name, rows in sources.items():
        seen = None
        accepted[name] = []
        for k, r in enumerate(rows):
            if seen is not None and r["ts"] < seen - lateness:
                late.add((name, k))
            else:
                accepted[name].append((r["ts"], k, r))
            seen = r["ts"] if seen is None else max(seen, r["ts"])
    merged = [(t, i, k, r["id"]) for i, a in enumerate(aliases) for t, k, r in accepted[a]]
    return sorted(merged), late


@settings(max_examples=examples(150), deadline=None)
@given(data=st.data(), self_join=st.booleans(), lateness=st.sampled_from([0, 0, 1, 3]),
       chunk=st.integers(1, 7), executor=st.sampled_from(["mjoin", "vector"]))
def test_merge_equals_the_definition(data, self_join, lateness, chunk, executor):
    """The merged order, as row tuples (per-tuple executors) or as column batches (the
    vectorized executor: each alias's table in its arrivals' order)."""
    def rows(n):
        ts = data.draw(st.lists(st.integers(0, 12), min_size=n, max_size=n))
        return [{"ts": t, "id": k, "a": k % 3} for k, t in enumerate(ts)]
    src = {"R": rows(data.draw(st.integers(1, 15))), "S": rows(data.draw(st.integers(1, 15)))}
    sql = SQL_SELF if self_join else SQL2
    run = LocalRun(sql, {n: iter(r) for n, r in src.items()}, executor=executor,
                   allowed_lateness=lateness, chunk_rows=chunk)
    got = []
    ids = [run.query.columns[a].index("id") for a in run.query.aliases]
    for arr in run.merger:
        if executor == "vector":
            seen = [iter(t.column("id").to_pylist()) if t is not None else None
                    for t in arr.tables]
            got += [(int(t) // 10**9, int(i), next(seen[i]))
                    for i, t in zip(arr.streams, arr.timestamps)]
        else:
            got += [(t // 10**9, i, r[ids[i]])
                    for i, t, r in zip(arr.streams, arr.timestamps, arr.rows)]
        # Bounded buffering: a source never holds more than a chunk beyond its lateness.
        assert run.merger.buffered() <= 2 * (chunk + 15)
    aliases = [s.source for s in run.query.streams]
    want, late = reference_merge(src, aliases, lateness)
    assert got == [(t, i, rid) for t, i, _, rid in want]
    assert {(r["stream"], r["row"]) for r in run.merger.rejected} == late


def test_results_do_not_depend_on_chunk_size():
    rng = np.random.default_rng(1)
    n = 400
    frames = {s: pd.DataFrame({"ts": np.sort(rng.integers(0, 40, n)) / 4, "id": np.arange(n),
                               "a": rng.integers(0, 5, n)}) for s in "RS"}
    tables = [adaptcq.run(SQL2, frames, mode="retract", chunk_rows=c).table for c in (1, 7, 10**6)]
    assert tables[0].equals(tables[1]) and tables[1].equals(tables[2])


def test_a_generator_that_never_ends_streams_results():
    def forever(stream):
        for k in itertools.count():
            yield {"ts": k * 0.25, "id": k, "a": k % 7, "src": stream}
    run = adaptcq.stream(SQL2, {"R": forever("R"), "S": forever("S")}, chunk_rows=256)
    seen = 0
    for batch in run:
        assert batch.schema.names == ["r", "s", "_sign", "_ts"]
        r, s = batch.column("r").to_numpy(), batch.column("s").to_numpy()
        assert ((r % 7) == (s % 7)).all() and (np.abs(r - s) <= 12).all()
        seen += batch.num_rows
        assert run.merger.buffered() <= 4 * 256  # memory: a few chunks, not the input
        if seen > 50_000:
            run.stop()
    assert run.interrupted and run.stats["results"] == seen


def test_every_kind_of_source_gives_the_same_result(tmp_path):
    rng = np.random.default_rng(2)
    n = 3000
    df = {s: pd.DataFrame({"ts": np.sort(rng.integers(0, 300, n)) / 10, "id": np.arange(n),
                           "a": rng.integers(0, 50, n)}) for s in "RS"}
    want = rows_of(adaptcq.run(SQL2, df).table)
    t = {s: pa.Table.from_pandas(d, preserve_index=False) for s, d in df.items()}
    (tmp_path / "Rdir").mkdir()
    for k, part in enumerate(t["R"].to_batches(max_chunksize=700)):  # a folder of files
        pq.write_table(pa.Table.from_batches([part]), tmp_path / "Rdir" / f"part-{k:02d}.parquet")
    pacsv.write_csv(t["S"], tmp_path / "s.csv")
    variants = [
        {"R": str(tmp_path / "Rdir"), "S": str(tmp_path / "s.csv")},
        {"R": str(tmp_path / "Rdir" / "part-*.parquet"), "S": t["S"]},
        {"R": pa.RecordBatchReader.from_batches(t["R"].schema, t["R"].to_batches(500)),
         "S": iter(t["S"].to_batches(333))},
        {"R": iter(df["R"].to_dict("records")), "S": t["S"].to_batches()[0]},
    ]
    for v in variants:
        assert rows_of(adaptcq.run(SQL2, v, chunk_rows=512).table) == want


def test_a_parquet_folder_whose_files_differ_is_an_error(tmp_path):
    pq.write_table(pa.table({"ts": [1.0], "id": [1], "a": [1]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"ts": [2.0], "id": [2]}), tmp_path / "b.parquet")
    s = pd.DataFrame({"ts": [1.0], "id": [1], "a": [1]})
    with pytest.raises(InputError, match="b.parquet' has columns ts double, id int64, but"):
        adaptcq.run(SQL2, {"R": str(tmp_path), "S": s})


# ----- event time -------------------------------------------------------------------------
def test_timestamp_typed_input_keeps_its_type_and_exact_times():
    ts = pd.to_datetime(["2024-03-01 10:00:00.000001", "2024-03-01 10:00:02.999999"]).tz_localize(
        "Europe/Paris")
    r = pa.table({"ts": pa.array(ts, pa.timestamp("us", tz="Europe/Paris")), "id": [0, 1],
                  "a": [1, 1]})
    later = pd.to_datetime(["2024-03-01 10:00:02.999999", "2024-03-01 10:00:10.000000"]).tz_localize(
        "Europe/Paris")
    s = pa.table({"ts": pa.array(later, pa.timestamp("us", tz="Europe/Paris")), "id": [5, 6],
                  "a": [1, 2]})
    res = adaptcq.run(SQL2, {"R": r, "S": s}, mode="retract")
    assert res.table.schema.field("_ts").type == pa.timestamp("us", tz="Europe/Paris")
    ins = [t for t, sg in zip(res.table.column("_ts").to_pylist(),
                              res.table.column("_sign").to_pylist()) if sg == 1]
    assert ins == [ts[1].to_pydatetime()] * 2  # not a microsecond early
    # deletions carry t + w exactly
    dels = [t for t, sg in zip(res.table.column("_ts").to_pylist(),
                               res.table.column("_sign").to_pylist()) if sg == -1]
    assert dels[0] == (ts[0] + pd.Timedelta(seconds=3)).to_pydatetime()


def test_integer_times_stay_integers_and_units_are_honoured():
    r = pd.DataFrame({"ts": [1_700_000_000_000, 1_700_000_002_000], "id": [0, 1], "a": [1, 1]})
    s = pd.DataFrame({"ts": [1_700_000_002_500], "id": [9], "a": [1]})
    with pytest.raises(InputError, match=r"stream R: row 0 has timestamp 1700000000000 .*"
                                         r"--timestamp-unit ms"):
        adaptcq.run(SQL2, {"R": r, "S": s})
    res = adaptcq.run(SQL2, {"R": r, "S": s}, timestamp_unit="ms", mode="retract")
    assert res.table.schema.field("_ts").type == pa.int64()
    assert res.table.column("_ts").to_pylist() == [1_700_000_002_500] * 2
    assert sorted(res.table.column("r").to_pylist()) == [0, 1]


@pytest.mark.parametrize("bad, message", [
    (float("nan"), "row 1 has timestamp nan in 'ts'; a time must be a finite number"),
    (float("inf"), "row 1 has timestamp inf"),
    (1e300, "row 1 has timestamp 1e+300 in 'ts', out of range"),
])
def test_non_finite_and_out_of_range_times_name_the_row(bad, message):
    r = pa.table({"ts": [1.0, bad], "id": [0, 1], "a": [1, 1]})  # pandas would make NaN null
    s = pa.table({"ts": [1.0], "id": [0], "a": [1]})
    with pytest.raises(InputError, match="stream R: " + message.replace("+", r"\+")):
        adaptcq.run(SQL2, {"R": r, "S": s})


def test_a_unit_for_timestamp_typed_columns_is_refused():
    r = pa.table({"ts": pa.array([0], pa.timestamp("s")), "id": [0], "a": [1]})
    with pytest.raises(InputError, match="--timestamp-unit ms applies to numeric timestamps"):
        adaptcq.run(SQL2, {"R": r, "S": r}, timestamp_unit="ms")


# ----- output types ----------------------------------------------------------------------
def test_output_types_come_from_the_input_schema():
    r = pa.table({"ts": [1.0], "id": pa.array([2**64 - 1], pa.uint64()), "a": [1],
                  "tags": pa.array([["x", "y"]]), "p": pa.array([{"k": 1}])})
    s = pa.table({"ts": [1.0], "id": pa.array([0], pa.int16()), "a": [1]})
    sql = ("SELECT R.id AS big, S.id AS small, R.tags, R.p FROM R, S WHERE R.a = S.a")
    res = adaptcq.run(sql, {"R": r, "S": s})
    assert res.table.schema.field("big").type == pa.uint64()
    assert res.table.schema.field("small").type == pa.int16()
    assert res.table.column("big").to_pylist() == [2**64 - 1]
    assert res.table.column("tags").to_pylist() == [["x", "y"]]
    assert res.table.column("p").to_pylist() == [{"k": 1}]
    empty = adaptcq.run(sql, {"R": r.slice(0, 0), "S": s})  # no rows: still typed
    assert empty.table.num_rows == 0 and empty.table.schema == res.table.schema


def test_integer_overflow_in_select_is_an_error_naming_the_column():
    r = pd.DataFrame({"ts": [1.0], "id": [2**62], "a": [1]})
    with pytest.raises(AdaptcqError, match="output column 'p'"):
        adaptcq.run("SELECT R.id * 4 AS p FROM R, S WHERE R.a = S.a", {"R": r, "S": r})


def test_unknown_keyword_arguments_are_refused():
    r = pd.DataFrame({"ts": [1.0], "id": [1], "a": [1]})
    with pytest.raises(ValueError, match="unknown option 'moed'"):
        adaptcq.run(SQL2, {"R": r, "S": r}, moed="retract")


def test_an_unused_input_is_an_error():
    r = pd.DataFrame({"ts": [1.0], "id": [1], "a": [1]})
    with pytest.raises(InputError, match="input U is not a stream of the query"):
        adaptcq.run(SQL2, {"R": r, "S": r, "U": r})


def test_max_results_bounds_an_exploding_join():
    n = 20  # 20^5 = 3.2M possible results: still far past the bound
    df = pd.DataFrame({"ts": np.arange(n) / 100, "id": np.arange(n), "a": np.zeros(n, int)})
    sql = ("SELECT A.id FROM A, B, C, D, E WHERE A.a = B.a AND B.a = C.a AND C.a = D.a "
           "AND D.a = E.a")
    run = adaptcq.stream(sql, {s: df for s in "ABCDE"}, max_results=10_000)
    total = sum(b.num_rows for b in run)
    assert total == 10_000 and run.stopped == "--max-results 10,000 reached"


# ----- command line -----------------------------------------------------------------------
@pytest.fixture
def files(tmp_path):
    rng = np.random.default_rng(3)
    n = 2000
    for s in "RS":
        pq.write_table(pa.table({"ts": np.sort(rng.integers(0, 400, n)) / 10.0,
                                 "id": np.arange(n), "a": rng.integers(0, 30, n)}),
                       tmp_path / f"{s}.parquet")
    return tmp_path


def cli(tmp, *extra):
    return main(["run", "--sql", SQL2, "--input", f"R={tmp / 'R.parquet'}", "--input",
                 f"S={tmp / 'S.parquet'}", "--no-progress", *map(str, extra)])


def test_parquet_output_gathers_small_batches_into_row_groups(files, monkeypatch):
    """Many small batches of results make one row group per ROW_GROUP rows, not one per
    batch, with the same rows in the same order (output.FileSink)."""
    from adaptcq.runtime import output
    assert cli(files, "--output", files / "one.parquet", "--batch-rows", "50") == 0
    assert cli(files, "--output", files / "batch.parquet", "--executor", "mjoin") == 0
    one, ref = pq.ParquetFile(files / "one.parquet"), pq.read_table(files / "batch.parquet")
    assert 0 < one.metadata.num_rows < output.ROW_GROUP and one.num_row_groups == 1
    assert one.read().to_pylist() == ref.to_pylist()
    monkeypatch.setattr(output, "ROW_GROUP", 100)
    assert cli(files, "--output", files / "many.parquet", "--batch-rows", "50") == 0
    many = pq.ParquetFile(files / "many.parquet")
    sizes = [many.metadata.row_group(k).num_rows for k in range(many.num_row_groups)]
    assert all(n >= 100 for n in sizes[:-1]) and sum(sizes) == one.metadata.num_rows
    assert many.read().to_pylist() == ref.to_pylist()


def test_parquet_output_dictionary_encodes_strings_only(tmp_path):
    """A results file dictionary-encodes its string, binary and dictionary columns, and
    writes numbers plainly (output.parquet_dictionary), with every value kept."""
    from adaptcq.runtime import output
    t = pa.table({"id": pa.array([1, 2, 2], pa.int64()), "x": [0.5, 0.5, 1.0],
                  "s": ["a", "b", "a"], "d": pa.array(["u", "u", "v"]).dictionary_encode(),
                  "_sign": pa.array([1, 1, -1], pa.int8())})
    sink = output.FileSink(str(tmp_path / "o.parquet"), t.schema, "parquet")
    for b in t.to_batches(max_chunksize=2):
        sink.write(b)
    sink.close()
    f = pq.ParquetFile(tmp_path / "o.parquet")
    enc = {f.schema_arrow.names[c]: f.metadata.row_group(0).column(c).encodings
           for c in range(f.metadata.num_columns)}
    assert {n for n, e in enc.items() if any("DICTIONARY" in x for x in e)} == {"s", "d"}
    assert f.read().to_pylist() == t.to_pylist()


def test_cli_writes_parquet_csv_and_json_lines(files, capsys):
    assert cli(files, "--output", files / "o.parquet") == 0
    want = pq.read_table(files / "o.parquet")
    assert cli(files, "--output", files / "o.csv") == 0
    assert pacsv.read_csv(files / "o.csv").num_rows == want.num_rows
    assert cli(files, "--output", files / "o.jsonl") == 0
    lines = (files / "o.jsonl").read_text().splitlines()
    assert len(lines) == want.num_rows and json.loads(lines[0]).keys() == {"r", "s", "_sign", "_ts"}
    capsys.readouterr()
    assert cli(files, "--output", "-", "--format", "jsonl") == 0
    out = capsys.readouterr()
    assert len(out.out.splitlines()) == want.num_rows and "run summary" in out.err
    assert not list(files.glob(".*.tmp"))  # no temporary file left behind


def test_cli_refuses_outputs_that_are_inputs(files, capsys):
    before = (files / "R.parquet").read_bytes()
    assert cli(files, "--output", files / "R.parquet") == 1
    assert "would destroy the input" in capsys.readouterr().err
    assert cli(files, "--output", files, "--format", "csv") == 1  # a folder holding inputs
    assert (files / "R.parquet").read_bytes() == before


@pytest.mark.parametrize("where, message", [
    ("/proc/adaptcq-out.parquet", "not writable|cannot"),
    ("{tmp}", "is a folder"),
])
def test_cli_checks_the_output_before_running(files, capsys, where, message):
    (files / "sub").mkdir()
    assert cli(files, "--output", where.format(tmp=files / "sub")) == 1
    err = capsys.readouterr().err
    assert err.startswith("adaptcq: error:") and pytest.importorskip("re").search(message, err)


def test_a_stale_rejected_file_is_removed(files):
    (files / "o.rejected.parquet").write_bytes(b"old")
    assert cli(files, "--output", files / "o.parquet") == 0
    assert not (files / "o.rejected.parquet").exists()


# Both executor paths stop between two steps: MJoin between updates, the vectorized one
# between batches (small batches here, so that there is a later one to skip).
PATHS = [["--executor", "mjoin"], ["--executor", "vector", "--batch-rows", "300"]]


@pytest.mark.parametrize("path", PATHS)
def test_ctrl_c_leaves_a_valid_prefix_of_the_output(files, capsys, monkeypatch, path):
    assert cli(files, "--output", files / "full.parquet", *path) == 0
    full = pq.read_table(files / "full.parquet")
    from adaptcq.runtime import output
    real = output.FileSink.write

    pressed = []

    def write_then_interrupt(self, batch):
        real(self, batch)
        if not pressed:  # as a user's Ctrl-C, once, after the first batch
            pressed.append(1)
            signal.raise_signal(signal.SIGINT)
    monkeypatch.setattr(output.FileSink, "write", write_then_interrupt)
    monkeypatch.setattr("adaptcq.runtime.local.OUT_CHUNK", 500)
    assert cli(files, "--output", files / "part.parquet", *path) == 130
    part = pq.read_table(files / "part.parquet")  # a valid Parquet file
    assert 0 < part.num_rows < full.num_rows
    assert part.equals(full.slice(0, part.num_rows))
    out = capsys.readouterr().out
    assert "interrupted: input stopped after" in out and "processed: R " in out
    # what was processed is exactly what produced the partial output
    import re
    done = {m[0]: int(m[1].replace(",", "")) for m in re.findall(r"(\w) ([\d,]+) rows", out)}
    prefix = {s: pq.read_table(files / f"{s}.parquet").slice(0, done[s]) for s in "RS"}
    again = adaptcq.run(SQL2, prefix)
    assert rows_of(again.table) == rows_of(part)


@pytest.mark.parametrize("extra, message", [
    (["--allowed-lateness", "inf"], "--allowed-lateness must be a finite number"),
    (["--allowed-lateness", "nan"], "--allowed-lateness must be a finite number"),
    (["--allowed-lateness", "-1"], "--allowed-lateness must be a finite number of seconds >= 0"),
    (["--allowed-lateness", "1e300"], "longer than event times span"),
    (["--partitions", "0"], "need --engine spark"),
    (["--executor", "acaching", "--reopt-interval", "0"], "--reopt-interval must be a positive"),
    (["--executor", "acaching", "--reopt-interval", "-5"], "--reopt-interval must be a positive"),
    (["--executor", "acaching", "--cache-memory", "-1"], "--cache-memory must be >= 0"),
    (["--reopt-interval", "5"], "need --executor acaching"),
    (["--order", "R:S", "--order", "R:S"], "given twice"),
    (["--sign", "nosuchcol"], "no input has the sign column 'nosuchcol'"),
    (["--max-results", "0"], "--max-results must be a positive"),
    (["--format", "csv"], "--format needs --output"),
])
def test_cli_option_errors_are_one_clear_line(files, capsys, extra, message):
    assert cli(files, *extra) == 1
    err = capsys.readouterr().err
    assert err.startswith("adaptcq: error:") and len(err.strip().splitlines()) <= 3
    assert pytest.importorskip("re").search(message, err), err


def test_cli_max_results_stops_with_a_valid_file(files, capsys):
    assert cli(files, "--output", files / "o.parquet", "--max-results", "100") == 1
    assert pq.read_table(files / "o.parquet").num_rows == 100
    assert "--max-results 100 reached" in capsys.readouterr().err


def test_cli_sign_column_must_be_numeric(tmp_path, capsys):
    pq.write_table(pa.table({"ts": [1.0], "id": [1], "a": [1], "op": ["+"]}), tmp_path / "R.parquet")
    pq.write_table(pa.table({"ts": [1.0], "id": [1], "a": [1]}), tmp_path / "S.parquet")
    sql = "SELECT R.id FROM R, S WHERE R.a = S.a"
    assert main(["run", "--sql", sql, "--input", f"R={tmp_path / 'R.parquet'}", "--input",
                 f"S={tmp_path / 'S.parquet'}", "--sign", "op", "--no-progress"]) == 1
    assert "the sign column 'op' has type string" in capsys.readouterr().err


def test_cli_csv_edge_cases(tmp_path, capsys):
    s = tmp_path / "s.csv"
    s.write_text("ts,id,a\n1,1,1\n")
    cases = {
        "ts,id,a\n": "has a header but no rows",
        "ts,id,a,a\n1,1,1,2\n": "more than one column named 'a'",
        "\ufeffts,id,a\n1,1,1\n": None,  # a UTF-8 BOM is not part of the first column's name
    }
    for text, message in cases.items():
        r = tmp_path / "r.csv"
        r.write_text(text, encoding="utf-8")
        code = main(["run", "--sql", SQL2, "--input", f"R={r}", "--input", f"S={s}",
                     "--no-progress"])
        err = capsys.readouterr().err
        if message is None:
            assert code == 0, err
        else:
            assert code == 1 and message in err


def test_cli_query_file_edge_cases(tmp_path, files, capsys):
    q = tmp_path / "q.sql"
    q.write_text("\ufeff" + SQL2, encoding="utf-8")
    assert main(["run", "--sql", f"@{q}", "--input", f"R={files / 'R.parquet'}", "--input",
                 f"S={files / 'S.parquet'}", "--no-progress"]) == 0
    assert main(["run", "--sql", f"@{tmp_path}", "--input", f"R={files / 'R.parquet'}",
                 "--no-progress"]) == 1
    assert "is a folder" in capsys.readouterr().err


def test_cli_workload_zero_updates_is_an_error(tmp_path, capsys):
    assert main(["workload", "three-way", "--out", str(tmp_path / "w"), "--n-updates", "0"]) == 1
    assert "adaptcq: error:" in capsys.readouterr().err


def test_a_full_disk_is_one_clear_error_and_leaves_nothing_behind(files, capsys, monkeypatch):
    import errno

    from adaptcq.runtime import output

    def full(self, batch):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(output.FileSink, "_write", full)
    (files / "o.parquet").write_bytes(b"an old result")
    assert cli(files, "--output", files / "o.parquet") == 1
    err = capsys.readouterr().err
    assert err.startswith("adaptcq: error: --output: cannot write") and "No space left" in err
    assert not (files / "o.parquet").exists()  # the old file does not look current
    assert not list(files.glob(".*.tmp"))


def test_results_of_a_slow_source_arrive_live():
    """Results leave at the end of every chunk read, not when 65,536 have gathered."""
    def slow(stream):
        for k in itertools.count():
            yield {"ts": k * 0.25, "id": k, "a": k % 7}
    run = adaptcq.stream(SQL2, {"R": slow("R"), "S": slow("S")}, chunk_rows=8)
    first = next(iter(run))
    assert 0 < first.num_rows < 1000 and run.stats["arrivals"] < 100
    run.stop()


@pytest.mark.parametrize("path", PATHS)
def test_stdout_closed_by_its_reader_stops_quietly(files, tmp_path, path):
    import subprocess
    import sys
    cmd = [sys.executable, "-m", "adaptcq.cli", "run", "--sql", SQL2,
           "--input", f"R={files / 'R.parquet'}", "--input", f"S={files / 'S.parquet'}",
           "--output", "-", "--format", "jsonl", "--no-progress", *path]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.readline()
    p.stdout.close()  # as `| head -1` does
    err = p.stderr.read().decode()
    assert p.wait() == 0, err
    assert "Traceback" not in err and "stdout was closed by its reader" in err


def test_stdout_closed_mid_run_reports_where_each_input_stopped(tmp_path):
    """A run stopped by its reader (`| head`) says which rows were processed: they add up
    to the arrivals, not to the rows the merge had read ahead."""
    import json
    import subprocess
    import sys

    from adaptcq.stream.workloads import three_way, write_workload
    write_workload(three_way(n_updates=100_000, seed=1), tmp_path)
    cmd = [sys.executable, "-m", "adaptcq.cli", "run", "--sql", f"@{tmp_path / 'query.sql'}",
           *[x for s in "RST" for x in ("--input", f"{s}={tmp_path / f'{s}.parquet'}")],
           "--output", "-", "--format", "jsonl", "--no-progress",
           "--summary-json", str(tmp_path / "summary.json")]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.readline()
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait() == 0, err
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["stopped"] == "stdout was closed by its reader"
    assert sum(s["rows_processed"].values()) == s["arrivals"] < sum(s["rows_read"].values())


def test_usage_errors_are_one_line_and_exit_1(capsys):
    with pytest.raises(SystemExit) as e:
        main(["run", "--bogus"])
    assert e.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith("adaptcq: error: unrecognized arguments: --bogus")
    assert len(err.strip().splitlines()) == 1


def test_a_stream_without_input_is_named(files, capsys):
    sql = SQL2.replace("WHERE", ", T WHERE T.a = S.a AND")
    assert cli(files, "--output", files / "o.parquet") == 0
    assert main(["run", "--sql", sql, "--input", f"R={files / 'R.parquet'}", "--input",
                 f"S={files / 'S.parquet'}", "--no-progress"]) == 1
    assert "no input for stream T; give one with --input NAME=PATH" in capsys.readouterr().err
