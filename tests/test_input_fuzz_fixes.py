"""Reading CSV inputs (``stream/sources.py``), defects found by fuzzing the local runtime's
inputs (2026-11): whole numbers beyond int64 read as decimal128(38, 0), not rounded to
floats; quoted fields holding line breaks in files of several 4 MB blocks; conversion errors
that named no row (zone offsets, text that is not UTF-8, a fraction in such a decimal
column, a timestamp column inferred as text); a bare ``.gz`` no CSV suffix; a broken link
in a folder refused."""

from __future__ import annotations

import gzip
import os
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest

import adaptcq
from adaptcq.errors import InputError
from adaptcq.runtime.spark import _resolve_input
from adaptcq.stream import sources

BIG = 18446744073709551615  # 2**64 - 1
JOIN = ("SELECT R.id, R.x, S.y FROM R [RANGE 10], S [RANGE 10] WHERE R.id = S.id")


def write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, str):
        text = text.encode()
    path.write_bytes(gzip.compress(text) if path.name.endswith(".gz") else text)
    return path


def read_all(path, column: str = "ts") -> pa.Table:
    src = sources.open_source("R", str(path), column)
    try:
        return pa.Table.from_batches(list(src.chunks()), schema=pa.schema(src.schema))
    finally:
        src.close()


def error_of(path, column: str = "ts") -> str:
    with pytest.raises(InputError) as e:
        read_all(path, column)
    return str(e.value)


# ----- 1. whole numbers beyond int64 ------------------------------------------------------------

def test_ids_beyond_int64_join_exactly_as_decimals(tmp_path):
    r = write(tmp_path / "r.csv", f"ts,id,x\n1,{BIG},r1\n2,9223372036854775808,r2\n")
    s = write(tmp_path / "s.csv", f"ts,id,y\n1,{BIG - 1},s1\n2,{BIG},s2\n"
                                  "3,9223372036854775809,s3\n")
    for path in (r, s):
        assert sources.open_source("R", str(path), "ts").schema.field("id").type == \
            pa.decimal128(38, 0)
    res = adaptcq.run(JOIN, {"R": str(r), "S": str(s)})
    assert res.table.schema.field("id").type == pa.decimal128(38, 0)
    assert list(zip(res.table.column("id").to_pylist(), res.table.column("y").to_pylist())) \
        == [(Decimal(BIG), "s2")]


def test_the_spark_runtime_is_given_the_same_decimal_type(tmp_path):
    path = write(tmp_path / "r.csv", f"ts,id\n1,{BIG}\n2,-{BIG}\n")
    inp = _resolve_input("R", str(path), "ts", None)
    assert inp.schema.field("id").type == pa.decimal128(38, 0)
    types = pytest.importorskip("pyspark.sql.types")
    from pyspark.sql.pandas.types import from_arrow_schema
    assert from_arrow_schema(inp.schema)["id"].dataType == types.DecimalType(38, 0)


@pytest.mark.parametrize(("text", "kind"), [
    ("1\n2\n", pa.int64()),                     # int64, as before
    ("1.5\n2\n", pa.float64()),                 # fractions: float, as before
    ("1e3\n2\n", pa.float64()),                 # not written as a whole number
    ("+5\n-3\n\n7\n", pa.float64()),            # pyarrow's int64 takes no '+': a double holds it
    ("+5\n" + "9" * 15 + "\n", pa.float64()),    # 15 digits: exact as a double
    ("+5\n" + "9" * 16 + "\n", pa.decimal128(38, 0)),  # 16 digits: a double may round it
    (f"{BIG}\n\n-00{BIG}\n", pa.decimal128(38, 0)),
    ("9" * 38 + "\n", pa.decimal128(38, 0)),
])
def test_whole_number_columns_types(tmp_path, text, kind):
    path = write(tmp_path / "r.csv", "id,ts\n" + "".join(
        f"{v},{k}\n" for k, v in enumerate(text.splitlines())))
    got = read_all(path)
    assert got.schema.field("id").type == kind
    if pa.types.is_decimal(kind):
        assert got.column("id").to_pylist() == [
            Decimal(v) if v else None for v in text.splitlines()]


def test_a_whole_number_of_more_than_38_digits_is_refused_naming_its_row(tmp_path):
    wide = "-" + "1" * 39
    path = write(tmp_path / "r.csv", f"ts,id\n1,{BIG}\n2,\n3,{wide}\n")
    assert error_of(path) == (
        f"stream R: row 2 of {str(path)!r} has {wide!r} in column 'id', a whole number of "
        "more than 38 digits: a CSV column of whole numbers is read as int64, or as "
        "decimal128(38, 0) when one is beyond int64, and neither holds it; use Parquet (a "
        "string or decimal256 column)")


def test_a_later_fraction_or_wider_number_in_such_a_column_names_its_row(tmp_path):
    write(tmp_path / "R" / "a.csv", f"ts,id\n1,{BIG}\n")
    write(tmp_path / "R" / "b.csv", "ts,id\n2,1.0\n3,1e3\n4, 12 \n5,1.5\n")
    b = str(tmp_path / "R" / "b.csv")
    msg = error_of(tmp_path / "R")
    assert msg.startswith(f"stream R: row 4 (row 3 of {b!r}) has '1.5' in column 'id', which "
                          "is decimal128(38, 0), the type of the first rows, in ")
    assert "which holds no fraction and at most 38 digits" in msg
    write(tmp_path / "R" / "b.csv", "ts,id\n2,7\n3," + "9" * 39 + "\n")
    assert error_of(tmp_path / "R").startswith(
        f"stream R: row 2 (row 1 of {b!r}) has '{'9' * 39}' in column 'id'")


def test_a_fraction_after_the_first_block_names_its_row(tmp_path):
    n = 300_000  # > 4 MB: the fraction is in a later block
    path = write(tmp_path / "r.csv", f"ts,id\n0,{BIG}\n" + "".join(
        f"{k},{k:07}\n" for k in range(1, n)) + f"{n},2.5\n")
    assert os.path.getsize(path) > sources.CSV_BLOCK
    assert error_of(path).startswith(f"stream R: row {n} of {str(path)!r} has '2.5' in "
                                     "column 'id', which is decimal128(38, 0)")


# ----- 2. quoted fields holding line breaks ---------------------------------------------------

def test_quoted_line_breaks_in_a_file_of_many_blocks(tmp_path):
    n = 400_000
    path = write(tmp_path / "r.csv", "ts,note\n" + "".join(
        f'{k},"x\ny\r\nz{k}"\n' for k in range(n)))
    assert os.path.getsize(path) > 2 * sources.CSV_BLOCK
    got = read_all(path)
    assert got.num_rows == n
    assert got.column("note")[n - 1].as_py() == f"x\ny\r\nz{n - 1}"
    assert got.column("ts").to_pylist() == list(range(n))


@pytest.mark.parametrize(("bad", "said"), [
    ('9,"a\nb",extra', "has 4 field(s), but the header has 3 columns: '{n},9,\"a\\nb\",extra'"),
    ('abc,"a\nb"', "has 'abc' in column 'id', which is int64"),
])
def test_errors_after_quoted_line_breaks_count_rows_not_lines(tmp_path, bad, said):
    n = 300_000
    path = write(tmp_path / "r.csv", "ts,id,note\n" + "".join(
        f'{k},{k},"x\ny"\n' for k in range(n)) + f"{n},{bad}\n")
    assert os.path.getsize(path) > sources.CSV_BLOCK
    assert error_of(path).startswith(f"stream R: row {n} of {str(path)!r} " + said.format(n=n))


def test_a_later_file_with_quoted_line_breaks(tmp_path):
    write(tmp_path / "R" / "a.csv", "ts,note\n0,plain\n")
    write(tmp_path / "R" / "b.csv.gz", "ts,note\n" + "".join(
        f'{k},"line\n{k}"\n' for k in range(1, 200_000)))
    got = read_all(tmp_path / "R")
    assert got.num_rows == 200_000 and got.column("note")[-1].as_py() == "line\n199999"


# ----- 3. conversion errors name the row --------------------------------------------------------

@pytest.mark.parametrize(("first", "later", "kind"), [
    ("2024-01-01 00:00:01Z", "2024-01-01 00:00:02", "timestamp[s, tz=UTC]"),
    ("2024-01-01 00:00:01", "2024-01-01 00:00:02+01:00", "timestamp[s]"),
])
def test_a_zone_offset_mismatch_names_file_row_and_column(tmp_path, first, later, kind):
    write(tmp_path / "R" / "a.csv", f"ts,x\n{first},1\n")
    write(tmp_path / "R" / "b.csv", f"ts,x\n2024-01-01 00:00:03{first[19:]},2\n{later},3\n")
    b = str(tmp_path / "R" / "b.csv")
    msg = error_of(tmp_path / "R")
    assert msg.startswith(f"stream R: row 2 (row 1 of {b!r}) has {later!r} in column 'ts', "
                          f"which is {kind}, the type of the first rows, in ")
    assert "(every time with a zone offset, such as Z or +01:00, or every time without one)" \
        in msg


def test_text_that_is_not_utf8_names_its_row(tmp_path):
    write(tmp_path / "R" / "a.csv", "ts,x\n1,a\n")
    write(tmp_path / "R" / "b.csv", b"ts,x\n2,ok\n3,caf\xe9\n")
    b = str(tmp_path / "R" / "b.csv")
    assert error_of(tmp_path / "R").startswith(
        f"stream R: row 2 (row 1 of {b!r}) has b'caf\\xe9' in column 'x', which is not "
        "UTF-8 text; a CSV file is read as UTF-8")
    # in the first rows (pyarrow read the column as bytes, Spark would change them)
    path = write(tmp_path / "one.csv", b"ts,x\n1,a\n2,\n3,caf\xe9\n")
    assert error_of(path).startswith(
        f"stream R: row 2 of {str(path)!r} has b'caf\\xe9' in column 'x', which is not UTF-8 "
        "text")


@pytest.mark.parametrize(("rows", "said"), [
    (["2024-01-01 00:00:01", "", "2024-01-01 00:00:02", "abc"],
     ("row 0 of {p} has '2024-01-01 00:00:01', a time without a zone offset, and row 3 of {p} "
      "has 'abc', which is not")),
    (["2024-01-01 00:00:01Z", "2024-01-01 00:00:02"],
     ("row 0 of {p} has '2024-01-01 00:00:01Z', a time with a zone offset, and row 1 of {p} "
      "has '2024-01-01 00:00:02', which is not")),
    (["1.5", "2024-01-01"], ("row 0 of {p} has '1.5', a number, and row 1 of {p} has "
                             "'2024-01-01', which is not")),
    (["abc", "2024-01-01"], "row 0 of {p} has 'abc', which is neither a time nor a number"),
])
def test_a_timestamp_column_read_as_text_names_the_row_that_made_it_so(tmp_path, rows, said):
    path = write(tmp_path / "r.csv", "ts,x\n" + "".join(f"{t},{k}\n" for k, t in enumerate(rows)))
    msg = error_of(path)
    assert msg.startswith("stream R: timestamp column 'ts' has type string; it must be a "
                          "timestamp, a date, or a number")
    assert said.format(p=repr(str(path))) in msg


# ----- 4. which files are CSV -------------------------------------------------------------------

def test_gzip_files_that_are_not_csv_are_skipped_in_a_folder(tmp_path):
    write(tmp_path / "R" / "a.csv", "ts,x\n1,1\n")
    write(tmp_path / "R" / "b.jsonl.gz", '{"ts": 2, "x": 2}\n')
    write(tmp_path / "R" / "c.parquet.gz", "not parquet")
    write(tmp_path / "R" / "d.csv.gz", "ts,x\n3,3\n")
    write(tmp_path / "R" / "e.TXT.gz", "ts,x\n4,4\n")
    assert read_all(tmp_path / "R").column("x").to_pylist() == [1, 3, 4]
    assert all(s.count(".") == 1 + s.endswith((".gz", ".bz2")) for s in sources.CSV_SUFFIXES)


@pytest.mark.parametrize("name", ["a.parquet.gz", "b.jsonl.gz", "c.gz"])
def test_a_file_given_directly_with_another_suffix_is_refused_listing_the_suffixes(
        tmp_path, name):
    path = write(tmp_path / name, "ts,x\n1,1\n")
    assert error_of(path) == (
        f"stream R: {str(path)!r} is neither Parquet nor CSV: an input file's name ends in "
        ".parquet or .pq (Parquet) or .csv, .txt, .csv.gz, .txt.gz or .csv.bz2 (CSV), in any "
        "case")


# ----- 5. broken links ------------------------------------------------------------------------

@pytest.mark.parametrize("glob", [False, True])
def test_a_broken_link_in_a_folder_or_glob_is_refused_naming_it(tmp_path, glob):
    write(tmp_path / "R" / "a.csv", "ts,x\n1,1\n")
    os.symlink("../missing.csv", tmp_path / "R" / "z.csv")
    os.symlink("../gone", tmp_path / "R" / "_hidden")  # hidden: skipped, as before
    given = str(tmp_path / "R" / "*.csv") if glob else str(tmp_path / "R")
    assert error_of(given) == (
        f"stream R: {str(tmp_path / 'R' / 'z.csv')!r} is a link to '../missing.csv', which "
        "does not exist; restore its target or remove the link")
    (tmp_path / "R" / "z.csv").unlink()
    assert read_all(given).num_rows == 1


# ----- both runtimes ----------------------------------------------------------------------------

class _Recorder:
    """Stands for Spark's session and stream reader: records the options it is given."""

    def __init__(self):
        self.seen: dict = {}
        self.conf = self

    def set(self, key, value):
        pass

    @property
    def readStream(self):  # (Spark's name)
        return self

    def options(self, **options):
        self.seen.update(options)
        return self

    def option(self, key, value):
        self.seen[key] = value
        return self

    def schema(self, schema):
        self.given = schema
        return self

    def csv(self, path):
        return self


def test_spark_reads_csv_with_line_breaks_in_quoted_fields_and_the_decimal_type(tmp_path):
    """Spark's CSV reader is given multiLine (a quoted field may hold line breaks, as the
    local runtime reads it) and the corrected types. (Run end to end on Spark when this was
    fixed: the same rows as the local runtime for a join on ids beyond int64 with quoted
    line breaks in both inputs.)"""
    pytest.importorskip("pyspark")
    from pyspark.sql import types as T

    from adaptcq.runtime.spark import _read_stream
    path = write(tmp_path / "r.csv", f'ts,id,x\n1,{BIG},"a\nb"\n')
    spark = _Recorder()
    _read_stream(spark, _resolve_input("R", str(path), "ts", None), None)
    assert spark.seen["multiLine"] is True and spark.seen["mode"] == "FAILFAST"
    assert spark.given["id"].dataType == T.DecimalType(38, 0)


def test_a_later_whole_number_beyond_int64_says_how_to_read_it_exactly(tmp_path):
    """The hint for an int64 column must not be "write 1.0": a float column rounds such ids
    (distinct ones joined as equal)."""
    write(tmp_path / "R" / "a.csv", "ts,id\n1,5\n2,6\n")
    write(tmp_path / "R" / "b.csv", f"ts,id\n3,{BIG}\n")
    msg = error_of(tmp_path / "R")
    assert f"has '{BIG}' in column 'id', which is int64" in msg
    assert ("a whole number beyond int64: put a row holding one in the first rows of the first "
            "file (the column is then decimal128(38, 0))") in msg
    assert "1.0" not in msg
