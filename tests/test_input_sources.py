"""Input sources (``stream/sources.py``): what each kind of input gives the run, and what it
refuses. Iterables whose first rows leave a column's type unknown; folders of many files
read one file at a time; CSV types across the files of a folder; empty part files; the
order of a folder's files."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

import adaptcq
from adaptcq.errors import InputError
from adaptcq.stream import sources

EXECUTORS = ["auto", "mjoin", "xjoin"]


def rows_of(table: pa.Table) -> Counter:
    return Counter(zip(*[table.column(c).to_pylist() for c in table.column_names]))


# ----- iterables: a column NULL throughout the first chunk ---------------------------------
NULL_FIRST = [{"ts": float(i), "k": i % 3, "v": None if i < 5 else float(i)} for i in range(10)]
NULL_SQL = ("SELECT R.k, R.v, S.ts AS sts FROM R [RANGE 100], S [RANGE 100] WHERE R.k = S.k "
            "AND (R.v IS NULL OR R.v > 5.5)")
NULL_S = pa.table({"ts": [0.5, 9.5], "k": [0, 1]})
NULL_SCHEMA = pa.schema([("ts", pa.float64()), ("k", pa.int64()), ("v", pa.null())])


def _null_first_batches():
    return [pa.RecordBatch.from_pylist(NULL_FIRST[:3], schema=NULL_SCHEMA),  # pa.nulls
            pa.RecordBatch.from_pylist(NULL_FIRST[3:5], schema=NULL_SCHEMA),
            pa.RecordBatch.from_pylist(NULL_FIRST[5:7]),
            pa.RecordBatch.from_pylist(NULL_FIRST[7:], schema=NULL_SCHEMA.set(
                2, pa.field("v", pa.float64())))]


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("kind", ["dicts", "batches"])
def test_a_column_null_in_the_first_chunk_takes_its_type_from_a_later_one(executor, kind):
    want = adaptcq.run(NULL_SQL, {"R": pa.Table.from_pylist(NULL_FIRST), "S": NULL_S},
                       executor=executor, mode="retract").table
    assert want.schema.field("v").type == pa.float64() and want.num_rows > 4
    r = iter(NULL_FIRST) if kind == "dicts" else iter(_null_first_batches())
    got = adaptcq.run(NULL_SQL, {"R": r, "S": NULL_S}, executor=executor, mode="retract",
                      chunk_rows=3).table
    assert got.schema == want.schema
    assert got.equals(want)


def test_a_column_null_throughout_stays_of_type_null():
    rows = [{**r, "v": None} for r in NULL_FIRST]
    sql = "SELECT R.k, R.v FROM R [RANGE 100], S [RANGE 100] WHERE R.k = S.k"
    want = adaptcq.run(sql, {"R": pa.Table.from_pylist(rows), "S": NULL_S}).table
    assert want.schema.field("v").type == pa.null() and want.num_rows == 7
    for r in (iter(rows), iter([pa.RecordBatch.from_pylist(rows, schema=NULL_SCHEMA)])):
        assert adaptcq.run(sql, {"R": r, "S": NULL_S}, chunk_rows=3).table.equals(want)


def test_a_value_after_the_rows_read_ahead_is_an_error_naming_its_row(monkeypatch):
    monkeypatch.setattr(sources, "READ_AHEAD_ROWS", 2)
    sql = "SELECT R.k, R.v FROM R [RANGE 100], S [RANGE 100] WHERE R.k = S.k"
    one_row = [pa.RecordBatch.from_pylist([r], schema=None if r["v"] is not None else NULL_SCHEMA)
               for r in NULL_FIRST]
    for r, what in ((iter(NULL_FIRST), "dicts"), (iter(one_row), "RecordBatches")):
        with pytest.raises(InputError, match=rf"stream R: column 'v' was NULL in all of the "
                           rf"first 3 rows.* but row 5 has a value \(an iterable of {what}\)"):
            adaptcq.run(sql, {"R": r, "S": NULL_S}, chunk_rows=1)


# ----- folders: files opened one at a time -------------------------------------------------
FOLDER_SQL = ("SELECT R.id AS r, S.id AS s FROM R [RANGE 2], S [RANGE 2] WHERE R.a = S.a "
              "AND S.ts < 20")

OPEN_FILES_LIMIT = """
import resource, sys
import adaptcq, pyarrow.parquet as pq
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
r, s, out = sys.argv[1:]
pq.write_table(adaptcq.run({sql!r}, {{"R": r, "S": s}}, mode="retract").table, out)
"""


@pytest.mark.parametrize("kind", ["parquet", "csv"])
def test_a_folder_of_many_files_is_read_a_file_at_a_time(tmp_path, kind):
    """300 one-chunk files under a limit of 64 open files (every file used to be opened,
    and a CSV reader's first block buffered, before the first row was read); the results
    equal those of the same rows as one file."""
    n = 300
    rows = pa.table({"ts": [(k + 0.5) / 10 for k in range(n)], "id": list(range(n)),
                     "a": [k % 7 for k in range(n)]})
    folder = tmp_path / "R"
    folder.mkdir()
    for k in range(n):
        part = rows.slice(k, 1)
        if kind == "parquet":
            pq.write_table(part, folder / f"part-{k:04d}.parquet")
        else:
            pacsv.write_csv(part, folder / f"part-{k:04d}.csv")
    one = tmp_path / f"r.{kind}"
    pq.write_table(rows, one) if kind == "parquet" else pacsv.write_csv(rows, one)
    s = tmp_path / "s.parquet"
    pq.write_table(rows, s)
    want = adaptcq.run(FOLDER_SQL, {"R": str(one), "S": str(s)}, mode="retract").table
    assert want.num_rows > 100
    code = OPEN_FILES_LIMIT.format(sql=FOLDER_SQL)
    for r in (str(folder), str(folder / f"part-*.{kind}")):
        out = tmp_path / "out.parquet"
        done = subprocess.run([sys.executable, "-c", code, r, str(s), str(out)],
                              check=False, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        assert pq.read_table(out).equals(want)


def test_files_that_differ_are_refused_before_any_row_naming_the_file(tmp_path):
    (tmp_path / "R").mkdir()
    (tmp_path / "R" / "a.csv").write_text("ts,id,a\n0,0,1\n")
    (tmp_path / "R" / "b.csv").write_text("ts,id,a\n1,1,1\n")
    (tmp_path / "R" / "c.csv").write_text("ts,a,id\n2,1,2\n")
    with pytest.raises(InputError, match=r"stream R: '.*c.csv' has columns ts, a, id, but "
                       r"'.*a.csv' has ts, id, a; every file of '.*R' needs the same columns"):
        sources.open_source("R", str(tmp_path / "R"), "ts")


# ----- CSV folders: one type per column, as if the files were one ---------------------------
CSV_SQL = "SELECT R.ts AS t, R.c FROM R [RANGE 100], S [RANGE 100] WHERE R.k = S.k"
CSV_S = pa.table({"ts": [0.0], "k": [1]})


def _folder(tmp_path, files: dict[str, str]):
    folder = tmp_path / "R"
    folder.mkdir()
    for n, text in files.items():
        (folder / n).write_text(text)
    return str(folder)


def test_a_value_another_files_type_cannot_hold_names_the_file_and_row(tmp_path):
    r = _folder(tmp_path, {"a.csv": "ts,k,c\n1,1,x\n2,1,y\n", "b.csv": "ts,k,c\n3.5,1,z\n"})
    with pytest.raises(InputError) as e:
        adaptcq.run(CSV_SQL, {"R": r, "S": CSV_S})
    assert str(e.value).startswith(
        f"stream R: row 2 (row 0 of '{r}/b.csv') has '3.5' in column 'ts', which is int64, "
        f"the type of the first rows, in '{r}/a.csv'; give the column one type in all of its "
        "rows (if it holds fractions, write its whole numbers as 1.0, not 1, in the first "
        "rows), or use Parquet")
    (tmp_path / "R" / "a.csv").write_text("ts,k,c\n1.0,1,x\n2,1,y\n")  # as the message says
    got = adaptcq.run(CSV_SQL, {"R": r, "S": CSV_S}).table
    assert got.column("t").to_pylist() == [1.0, 2.0, 3.5]


def test_a_value_a_files_later_block_cannot_hold_names_its_row(tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "CSV_BLOCK", 64, raising=False)  # first block: ints only
    rows = [f"{k},1,x" for k in range(40)]
    rows[33] = "33.25,1,x"
    (tmp_path / "r.csv").write_text("ts,k,c\n" + "\n".join(rows) + "\n")
    with pytest.raises(InputError, match=rf"stream R: row 33 of '{tmp_path}/r.csv' has "
                       r"'33.25' in column 'ts', which is int64, the type of its first rows;"):
        adaptcq.run(CSV_SQL, {"R": str(tmp_path / "r.csv"), "S": CSV_S})
    r = _folder(tmp_path, {"a.csv": "ts,k,c\n0,1,x\n", "b.csv": "ts,k,c\n" + "\n".join(rows)})
    with pytest.raises(InputError, match=rf"stream R: row 34 \(row 33 of '{r}/b.csv'\) has "
                       rf"'33.25' in column 'ts', which is int64, the type of the first rows, "
                       rf"in '{r}/a.csv';"):
        adaptcq.run(CSV_SQL, {"R": r, "S": CSV_S})


def test_later_files_are_read_with_the_first_files_types(tmp_path):
    """b.csv alone would read c as int64 (007 as 7) and ts as int64: the folder reads them as
    a.csv's string and double, as one file holding both would, and as Spark does."""
    r = _folder(tmp_path, {"a.csv": "ts,k,c\n0.5,1,A1\n", "b.csv": "ts,k,c\n1,1,007\n2,1,010\n"})
    got = adaptcq.run(CSV_SQL, {"R": r, "S": CSV_S}).table
    assert got.column("c").to_pylist() == ["A1", "007", "010"]
    assert got.column("t").to_pylist() == [0.5, 1.0, 2.0]
    one = tmp_path / "one.csv"
    one.write_text("ts,k,c\n0.5,1,A1\n1,1,007\n2,1,010\n")
    assert got.equals(adaptcq.run(CSV_SQL, {"R": str(one), "S": CSV_S}).table)


# ----- CSV folders: empty part files ---------------------------------------------------------
def test_empty_part_files_in_a_folder_are_skipped(tmp_path):
    """Spark writes a part file with a header and no rows (or nothing) for an empty partition:
    in a folder or glob such files are skipped, the first one included; one empty file alone,
    or a folder of empty files only, is still an error."""
    head = "ts,k,c\n"
    r = _folder(tmp_path, {"part-0.csv": head, "part-1.csv": "", "part-2.csv": head + "1.5,1,x\n",
                           "part-3.csv": head, "part-4.csv": head + "2.5,1,y\n", "part-5.csv": ""})
    one = tmp_path / "one.csv"
    one.write_text(head + "1.5,1,x\n2.5,1,y\n")
    want = adaptcq.run(CSV_SQL, {"R": str(one), "S": CSV_S}).table
    assert want.num_rows == 2
    for source in (r, f"{r}/part-*.csv"):
        assert adaptcq.run(CSV_SQL, {"R": source, "S": CSV_S}).table.equals(want)
    (tmp_path / "R" / "part-3.csv").write_text("ts,c,k\n")  # an empty file's header counts
    with pytest.raises(InputError, match=r"part-3.csv' has columns ts, c, k, but .*part-2.csv'"):
        adaptcq.run(CSV_SQL, {"R": r, "S": CSV_S})
    for text, message in ((head, "has a header but no rows"), ("", r"is empty \(no header")):
        one.write_text(text)
        with pytest.raises(InputError, match=message):
            adaptcq.run(CSV_SQL, {"R": str(one), "S": CSV_S})
    (tmp_path / "x").mkdir()
    empty = _folder(tmp_path / "x", {"a.csv": head, "b.csv": ""})
    with pytest.raises(InputError, match=r"stream R: every file of '.*x/R' is empty \(a header "
                       r"and no rows, or nothing\)"):
        adaptcq.run(CSV_SQL, {"R": empty, "S": CSV_S})


# ----- folder order -----------------------------------------------------------------------
def test_a_folders_files_are_read_in_the_lexicographic_order_of_their_paths(tmp_path):
    """README, Input files: r-10.csv before r-2.csv, so r-2's and r-3's rows, earlier than
    r-11's, are late; named r-02 ... they are in time order."""
    n = (1, 10, 11, 2, 3)
    r = _folder(tmp_path, {f"r-{k}.csv": f"ts,k,c\n{k}.5,1,r{k}\n" for k in n})
    got = adaptcq.run(CSV_SQL, {"R": r, "S": CSV_S})
    assert got.table.column("c").to_pylist() == ["r1", "r10", "r11"]
    # Each named by its file and its row in that file, as the Spark runtime names them.
    assert [(Path(x["file"]).name, x["row"], x["ts"]) for x in got.rejected.to_pylist()] == \
        [("r-2.csv", 0, 2.5), ("r-3.csv", 0, 3.5)]
    (tmp_path / "p").mkdir()
    padded = _folder(tmp_path / "p", {f"r-{k:02d}.csv": f"ts,k,c\n{k}.5,1,r{k}\n" for k in n})
    got = adaptcq.run(CSV_SQL, {"R": padded, "S": CSV_S})
    assert got.table.column("c").to_pylist() == ["r1", "r2", "r3", "r10", "r11"]
    assert got.rejected.num_rows == 0


def test_a_csv_column_empty_in_its_first_rows_is_text(tmp_path):
    """It was refused ("its type is unknown"), even when the query never reads it; it is
    now a string column, as Spark and DuckDB read a column with no value."""
    (tmp_path / "r.csv").write_text("ts,k,note\n1,1,\n2,2,\n")
    got = adaptcq.run(CSV_SQL.replace("R.c", "R.k"), {"R": str(tmp_path / "r.csv"),
                                                     "S": CSV_S})
    assert got.table.num_rows >= 1
    got = adaptcq.run("SELECT R.note FROM R, S WHERE R.k = S.k",
                      {"R": str(tmp_path / "r.csv"), "S": CSV_S})
    assert got.table.schema.field("note").type == pa.string()
    assert set(got.table.column("note").to_pylist()) == {None}


@pytest.mark.parametrize("gz", [False, True])
def test_a_header_longer_than_a_block_is_named_not_called_empty(tmp_path, monkeypatch, gz):
    """pyarrow reports a first line longer than its block as an empty file: a file with
    a header of 40 columns was refused as "is empty (no header, no rows)"."""
    import gzip

    from adaptcq.stream import sources
    monkeypatch.setattr(sources, "CSV_BLOCK", 64)
    text = ("ts," + ",".join(f"c{i}" for i in range(40)) + "\n1,"
            + ",".join("1" for _ in range(40)) + "\n").encode()
    path = tmp_path / ("w.csv.gz" if gz else "w.csv")
    path.write_bytes(gzip.compress(text) if gz else text)
    with pytest.raises(adaptcq.InputError, match="first line, the header, is longer than 64"):
        sources.open_source("R", str(path), "ts")
    empty = tmp_path / "e.csv"
    empty.write_text("")
    with pytest.raises(adaptcq.InputError, match="is empty"):
        sources.open_source("R", str(empty), "ts")
