"""Rejected deletions (a sign column's -1 that matches no earlier row) are reported as late
rows are: named by source, with the row's position in the input the user gave, once per
input row (a self-join's aliases do not each report it), and counted so in the summary."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

import adaptcq
from adaptcq.cli import main
from adaptcq.errors import QueryError

EXECUTORS = ["vector", "mjoin", "xjoin", "acaching"]
REASON = "deletion of a row not in "


def rejected(res) -> list[tuple]:
    return sorted((r["stream"], r["row"], r["ts"]) for r in res.rejected.to_pylist())


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("chunk_rows", [1, 3, 16_384])
def test_plain_join_names_the_source_and_the_input_row(executor, chunk_rows):
    # R's rows are out of time order (within the lateness), so processing order and input
    # order differ: the row numbers must be the input's.
    r = pa.table({"ts": [3.0, 1.0, 2.0, 5.0, 4.0, 6.0], "k": [1, 1, 2, 1, 9, 2],
                  "sg": pa.array([1, 1, 1, -1, -1, -1], pa.int8())})
    s = pa.table({"ts": [0.5, 2.5, 7.0], "k": [1, 5, 2], "sg": [1, -1, -1]})
    res = adaptcq.run("SELECT R.k AS rk, S.ts AS sts FROM R, S WHERE R.k = S.k",
                      {"R": r, "S": s}, sign="sg", executor=executor, mode="retract",
                      allowed_lateness=5, chunk_rows=chunk_rows)
    # R row 3 (k 1) and row 5 (k 2) delete earlier rows; R row 4 (k 9) and S rows 1 and 2
    # (S has no (2.5, 5) nor (7.0, 2)) match nothing.
    assert rejected(res) == [("R", 4, 4.0), ("S", 1, 2.5), ("S", 2, 7.0)]
    assert res.stats["rejected"] == res.rejected.num_rows == 3
    reasons = {r["stream"]: r["reason"] for r in res.rejected.to_pylist()}
    assert reasons == {"R": REASON + "R", "S": REASON + "S"}


@pytest.mark.parametrize("executor", EXECUTORS)
def test_self_join_reports_an_input_row_once_by_source(executor):
    r = pa.table({"ts": [1, 2], "k": [1, 2], "sg": [1, -1]})
    res = adaptcq.run("SELECT r1.ts AS a FROM R r1, R r2 WHERE r1.k = r2.k", {"R": r},
                      sign="sg", executor=executor)
    assert res.rejected.to_pylist() == [
        {"stream": "R", "row": 1, "file": None, "ts": 2.0, "reason": REASON + "r1"}]
    assert res.stats["rejected"] == 1


@pytest.mark.parametrize("executor", ["vector", "mjoin"])
@pytest.mark.parametrize("batch", [{}, {"batch_rows": 1}, {"batch_rows": 2}])
def test_self_join_with_a_third_stream_and_small_batches(executor, batch):
    """Both aliases' copies of a row may fall in different batches: still once."""
    if executor != "vector" and batch:
        pytest.skip("batch_rows is the vectorized executor's")
    r = pa.table({"ts": [1, 2, 3, 4, 5], "k": [1, 2, 1, 3, 1], "sg": [1, -1, -1, -1, 1]})
    t = pa.table({"ts": [0], "k": [1]})
    res = adaptcq.run("SELECT a.k AS x, T.ts AS y FROM R a, R b, T "
                      "WHERE a.k = b.k AND b.k = T.k", {"R": r, "T": t}, sign="sg",
                      executor=executor, **batch)
    assert rejected(res) == [("R", 1, 2.0), ("R", 3, 4.0)]
    assert res.stats["rejected"] == 2


def test_late_rows_and_rejected_deletions_are_reported_alike():
    r = pa.table({"ts": [5, 1, 6, 7], "k": [1, 1, 1, 4], "sg": [1, 1, -1, -1]})
    s = pa.table({"ts": [0], "k": [1]})
    res = adaptcq.run("SELECT R.k FROM R, S WHERE R.k = S.k", {"R": r, "S": s}, sign="sg")
    rows = res.rejected.to_pylist()
    assert [(x["stream"], x["row"], x["ts"]) for x in rows] == [("R", 1, 1.0), ("R", 3, 7.0)]
    assert rows[0]["reason"].startswith("late by more than the allowed lateness")
    assert rows[1]["reason"] == REASON + "R"
    assert res.stats["rejected"] == 2


def test_rows_of_an_alias_reading_no_column_are_told_apart():
    """Every row of ``SELECT 1 ... FROM R`` is ``()``: the second deletion (row 2) is the
    one rejected, the first takes row 0."""
    r = pa.table({"ts": [1, 2, 3, 4], "sg": [1, -1, -1, 1]})
    res = adaptcq.run("SELECT 1 AS one FROM R", {"R": r}, sign="sg", executor="mjoin")
    assert rejected(res) == [("R", 2, 3.0)]


def test_a_generator_source():
    def rows():
        yield {"ts": 1.0, "k": 1, "sg": 1}
        yield {"ts": 2.0, "k": 2, "sg": -1}
        yield {"ts": 3.0, "k": 1, "sg": -1}
        yield {"ts": 4.0, "k": 1, "sg": -1}
    s = pa.table({"ts": [0.0], "k": [1], "sg": [1]})
    for executor in ("vector", "mjoin"):
        res = adaptcq.run("SELECT R.k FROM R, S WHERE R.k = S.k", {"R": rows(), "S": s},
                          sign="sg", executor=executor)
        assert rejected(res) == [("R", 1, 2.0), ("R", 3, 4.0)]


def test_the_command_line_writes_them_and_counts_them(tmp_path):
    (tmp_path / "r.csv").write_text("ts,k,sg\n1,1,1\n2,2,-1\n3,1,1\n4,1,-1\n5,7,-1\n")
    out, rej, summary = tmp_path / "out.parquet", tmp_path / "rej.parquet", tmp_path / "s.json"
    assert main(["run", "--sql", "SELECT a.k AS x FROM R a, R b WHERE a.k = b.k",
                 "--input", f"R={tmp_path / 'r.csv'}", "--sign", "sg", "--output", str(out),
                 "--rejected", str(rej), "--summary-json", str(summary),
                 "--no-progress"]) == 0
    got = pq.read_table(rej).to_pylist()
    assert [(x["stream"], x["row"], x["ts"]) for x in got] == [("R", 1, 2.0), ("R", 4, 5.0)]
    assert {x["file"] for x in got} == {str(tmp_path / "r.csv")}
    assert json.loads(summary.read_text())["rejected"] == 2


@pytest.mark.parametrize("kind", ["csv", "parquet"])
@pytest.mark.parametrize("executor", EXECUTORS)
def test_a_folders_rejected_rows_name_their_file_and_row_in_it(tmp_path, kind, executor):
    """A folder's rejected row was named by its row number in the whole folder only; it
    is now named as the Spark runtime names it: its file and its row in that file (late
    rows, and deletions that match nothing)."""
    parts = {"a": {"ts": [1.5, 2.0, 3.0], "k": [1, 2, 3], "sg": [1, 1, 1]},
             "b": {"ts": [4.0, 5.0], "k": [9, 2], "sg": [-1, -1]},  # row 0 deletes nothing
             "c": {"ts": [6.0, 0.5, 7.0], "k": [3, 1, 8], "sg": [-1, 1, -1]}}  # row 1 late
    folder = tmp_path / "R"
    folder.mkdir()
    for name, cols in parts.items():
        t = pa.table(cols)
        if kind == "csv":
            pacsv.write_csv(t, folder / f"{name}.csv")
        else:
            pq.write_table(t, folder / f"{name}.parquet")
    s = pa.table({"ts": [0.0], "k": [1], "sg": [1]})
    res = adaptcq.run("SELECT R.k FROM R, S WHERE R.k = S.k", {"R": str(folder), "S": s},
                      sign="sg", executor=executor)
    got = sorted((Path(x["file"]).name, x["row"], x["ts"], x["reason"][:4])
                 for x in res.rejected.to_pylist())
    assert got == [(f"b.{kind}", 0, 4.0, "dele"), (f"c.{kind}", 1, 0.5, "late"),
                   (f"c.{kind}", 2, 7.0, "dele")]
    assert res.rejected.schema.names == ["stream", "row", "file", "ts", "reason"]


@pytest.mark.parametrize("executor", ["vector", "mjoin"])
def test_reported_times_are_the_nearest_float_of_the_seconds(executor):
    """Times in reports are nanoseconds / 1e9 (correctly rounded), not × 1e-9: 127 s was
    reported as 127.00000000000001 (found by fuzzing, 2026-11-27)."""
    res = adaptcq.run("SELECT R.k FROM R, S WHERE R.k = S.k",
                      {"R": pa.table({"ts": [100, 127], "k": [1, 2], "sg": [1, -1]}),
                       "S": pa.table({"ts": [101], "k": [1], "sg": [1]})},
                      sign="sg", executor=executor)
    assert rejected(res) == [("R", 1, 127.0)]
    assert res.stats["last_event_time"] == 127.0
    spilled = adaptcq.run("SELECT R.k FROM R, S WHERE R.k = S.k",
                          {"R": pa.table({"ts": [100, 127], "k": [1, 2]}),
                           "S": pa.table({"ts": [101], "k": [1]})},
                          spill={"strategy": "bottom-up", "memory": "1MB"})
    assert spilled.stats["complete_until"] == 127.0


@pytest.mark.parametrize("executor", EXECUTORS)
def test_select_star_leaves_the_sign_column_out(executor):
    """``SELECT *`` took the sign column in, so a deletion's -1 never equalled its row's +1
    and every deletion was rejected; it is no column of the stream (fuzzing, 2026-11-27)."""
    r = pa.table({"ts": [0, 0, 2], "a": [1, 1, 1], "id": [0, 0, 7], "sg": [1, -1, 1]})
    s = pa.table({"ts": [1], "a": [1], "id": [10], "sg": [1]})
    res = adaptcq.run("SELECT * FROM R, S WHERE R.a = S.a", {"R": r, "S": s}, sign="sg",
                      executor=executor, mode="retract")
    assert res.stats["rejected"] == 0
    assert res.table.column_names == ["R_ts", "R_a", "R_id", "S_ts", "S_a", "S_id", "_sign",
                                      "_ts"]
    assert [(x["R_id"], x["_sign"]) for x in res.table.to_pylist()] == [(7, 1)]


def test_a_query_reading_the_sign_column_is_refused_at_the_name():
    r = pa.table({"ts": [0], "a": [1], "sg": [1]})
    with pytest.raises(QueryError, match=r"column 'sg' is the sign column \(--sign\)") as e:
        adaptcq.run("SELECT R.a FROM R WHERE R.sg > 0", {"R": r}, sign="sg")
    assert e.value.position == len("SELECT R.a FROM R WHERE ")
    with pytest.raises(QueryError, match="unknown column 'nope'"):  # (others as before)
        adaptcq.run("SELECT R.nope FROM R", {"R": r}, sign="sg")


def test_the_default_rejected_file_never_deletes_an_input(tmp_path, capsys):
    """The default (o.rejected.csv beside o.csv) was not checked against the inputs, and a
    run removed it as a stale file of an earlier run: an input of that name was deleted
    (found in review). It is now refused as a --rejected given would be."""
    (tmp_path / "o.rejected.csv").write_text("ts,k\n1,1\n")
    (tmp_path / "s.csv").write_text("ts,k\n1,1\n")
    args = ["run", "--sql", "SELECT R.k FROM R, S WHERE R.k = S.k", "--no-progress",
            "--input", f"R={tmp_path / 'o.rejected.csv'}", "--input", f"S={tmp_path / 's.csv'}"]
    assert main([*args, "--output", str(tmp_path / "o.csv")]) == 1
    assert "--rejected's default" in capsys.readouterr().err
    assert (tmp_path / "o.rejected.csv").read_text() == "ts,k\n1,1\n"
    # A query set's: its output folder q, the default q.rejected.parquet.
    pq.write_table(pa.table({"ts": [1.0], "k": [1]}), tmp_path / "q.rejected.parquet")
    assert main(["run", "--executor", "eddy", "--sql", "SELECT R.k FROM R", "--no-progress",
                 "--input", f"R={tmp_path / 'q.rejected.parquet'}",
                 "--output", str(tmp_path / "q")]) == 1
    assert "--rejected's default" in capsys.readouterr().err
    assert pq.read_table(tmp_path / "q.rejected.parquet").num_rows == 1


def test_the_default_rejected_file_takes_the_outputs_format(tmp_path):
    """With --format naming another format than the output's suffix, the default followed
    the suffix (-o o.csv --format parquet wrote its rejected rows as CSV; found in
    review); it now takes the format: o.csv.rejected.parquet."""
    (tmp_path / "r.csv").write_text("ts,k\n5,1\n1,1\n")
    (tmp_path / "s.csv").write_text("ts,k\n1,1\n")
    args = ["run", "--sql", "SELECT R.k FROM R, S WHERE R.k = S.k", "--no-progress",
            "--input", f"R={tmp_path / 'r.csv'}", "--input", f"S={tmp_path / 's.csv'}"]
    assert main([*args, "--output", str(tmp_path / "o.csv"), "--format", "parquet"]) == 0
    assert pq.read_table(tmp_path / "o.csv.rejected.parquet").num_rows == 1
    assert main([*args, "--output", str(tmp_path / "o.txt"), "--format", "csv"]) == 0
    assert (tmp_path / "o.txt.rejected.csv").read_text().startswith('"stream","row"')
