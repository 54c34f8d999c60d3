"""Output files as files: JSON lines and the summary are valid JSON whatever the floats,
what CSV cannot hold is refused before a file is made, ``.gz`` names are gzip-compressed,
and a suffix that names no format is refused rather than written as Parquet."""

from __future__ import annotations

import gzip
import json
import math
import os

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

import adaptcq
from adaptcq.cli import main
from adaptcq.errors import AdaptcqError
from adaptcq.runtime import output

NAN, INF = math.nan, math.inf


def strict_json(text: str):
    """json.loads that refuses the bare NaN / Infinity / -Infinity tokens (not JSON)."""
    def refuse(token):
        raise AssertionError(f"{token} is not JSON")
    return json.loads(text, parse_constant=refuse)


@pytest.fixture
def floats(tmp_path):
    """R: non-finite floats in a float column, a list and a struct; S: one matching row."""
    pq.write_table(pa.table({
        "ts": [1.0, 2.0, 3.0, 4.0], "k": [1, 1, 1, 1], "x": [NAN, INF, -INF, 1.5],
        "l": pa.array([[NAN, 1.0], [INF], None, [2.5]]),
        "st": pa.array([{"a": -INF, "b": "s"}, {"a": 1.0, "b": "t"}, None,
                        {"a": 0.5, "b": "NaN"}])}), tmp_path / "r.parquet")
    pq.write_table(pa.table({"ts": [0.0], "k": [1]}), tmp_path / "s.parquet")
    return ["run", "--no-progress", f"--input=R={tmp_path / 'r.parquet'}",
            f"--input=S={tmp_path / 's.parquet'}"]


# ----- 1. JSON lines: NaN and infinities as strings, at any depth --------------------------

def test_jsonl_writes_non_finite_floats_as_strings_at_any_depth(tmp_path, floats, capsys):
    out = tmp_path / "o.jsonl"
    assert main([*floats, "--sql", "SELECT R.x, R.l, R.st FROM R, S WHERE R.k = S.k",
                 "--output", str(out)]) == 0, capsys.readouterr().err
    rows = [strict_json(line) for line in out.read_text().splitlines()]
    assert [(r["x"], r["l"], r["st"]) for r in rows] == [
        ("NaN", ["NaN", 1.0], {"a": "-Infinity", "b": "s"}),
        ("Infinity", ["Infinity"], {"a": 1.0, "b": "t"}),
        ("-Infinity", None, None),
        (1.5, [2.5], {"a": 0.5, "b": "NaN"})]  # finite rows are written as before
    # stdout is the same writer
    capsys.readouterr()
    assert main([*floats, "--sql", "SELECT R.x FROM R, S WHERE R.k = S.k", "--output", "-",
                 "--format", "jsonl"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [strict_json(line)["x"] for line in lines] == ["NaN", "Infinity", "-Infinity", 1.5]


def test_json_lines_keep_other_values_as_before():
    rows = [{"t": pa.scalar(0, pa.timestamp("s")).as_py(), "b": b"\x00\xff", "s": "é",
             "n": None, "f": -0.0}]
    assert output.json_lines(rows) == ('{"t": "1970-01-01T00:00:00", "b": "00ff", "s": "é", '
                                       '"n": null, "f": -0.0}\n')


# ----- 2. --summary-json: valid JSON, a figure that does not exist is null -----------------

def test_summary_json_of_a_run_without_cpu_time_is_valid_json(tmp_path, capsys):
    empty = tmp_path / "empty.parquet"
    pq.write_table(pa.table({"ts": pa.array([], pa.float64()), "k": pa.array([], pa.int64())}),
                   empty)
    summary = tmp_path / "em.json"
    assert main(["run", "--no-progress", "--sql", "SELECT R.k FROM R, S WHERE R.k = S.k",
                 f"--input=R={empty}", f"--input=S={empty}", "--output",
                 str(tmp_path / "em.parquet"), "--summary-json", str(summary)]) == 0, \
        capsys.readouterr().err
    doc = strict_json(summary.read_text())
    assert doc["updates"] == 0 and doc["throughput"] is None


def test_summary_json_writes_every_non_finite_number_as_null():
    doc = {"a": INF, "b": [NAN, 1.0, (-INF, 2)], "c": {"d": -INF, "e": 0.25}, "f": "inf",
           "g": 3, "h": {1, 2}}
    assert strict_json(output.summary_json(doc)) == {
        "a": None, "b": [None, 1.0, [None, 2]], "c": {"d": None, "e": 0.25}, "f": "inf",
        "g": 3, "h": "{1, 2}"}


# ----- 3. CSV refuses bytes before any file is made ----------------------------------------

def test_csv_output_of_binary_columns_is_refused_before_a_file_is_made(tmp_path, capsys):
    pq.write_table(pa.table({
        "ts": [1.0], "k": [1], "b": pa.array([b"\xff\x00"]),
        "lb": pa.array([b"\xfe"], pa.large_binary()),
        "fb": pa.array([b"\x80\x81"], pa.binary(2)), "s": ["fine"]}), tmp_path / "r.parquet")
    pq.write_table(pa.table({"ts": [0.0], "k": [1]}), tmp_path / "s.parquet")
    args = ["run", "--no-progress", "--sql",
            "SELECT R.b, R.lb, R.fb, R.s FROM R, S WHERE R.k = S.k",
            f"--input=R={tmp_path / 'r.parquet'}", f"--input=S={tmp_path / 's.parquet'}"]
    for name in ("o.csv", "o.csv.gz"):
        assert main([*args, "--output", str(tmp_path / name)]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1, err  # one line, no traceback
        assert err[0].startswith("adaptcq: error: --output: CSV cannot hold columns 'b' "
                                 "(binary), 'lb' (large_binary), 'fb' (fixed_size_binary[2]);")
        assert "Parquet or JSON lines" in err[0]
        assert sorted(p.name for p in tmp_path.iterdir()) == ["r.parquet", "s.parquet"]
    assert main([*args, "--output", "-", "--format", "csv"]) == 1
    assert capsys.readouterr().out == ""
    assert main([*args, "--output", str(tmp_path / "o.jsonl")]) == 0  # bytes as hex there
    row = strict_json((tmp_path / "o.jsonl").read_text())
    assert (row["b"], row["lb"], row["fb"], row["s"]) == ("ff00", "fe", "8081", "fine")


# ----- 4. .gz names are gzip-compressed; unknown suffixes are refused ----------------------

def test_csv_gz_output_is_gzip_and_reads_back_as_an_input(tmp_path, floats, capsys):
    out = tmp_path / "o.csv.gz"
    assert main([*floats, "--sql", "SELECT R.k, R.x, R.ts AS rts FROM R, S WHERE R.k = S.k",
                 "--output", str(out)]) == 0, capsys.readouterr().err
    assert out.read_bytes()[:2] == b"\x1f\x8b"  # the gzip magic number
    assert gzip.decompress(out.read_bytes()).decode().splitlines()[0] == \
        '"k","x","rts","_sign","_ts"'
    assert pacsv.read_csv(out).column("rts").to_pylist() == [1.0, 2.0, 3.0, 4.0]
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    # adaptcq's own CSV input reads it back (a self-join of the output on k)
    back = adaptcq.run("SELECT A.rts FROM A, B WHERE A.k = B.k AND B.rts = 1",
                       {"A": str(out), "B": str(out)}, timestamp="rts")
    assert sorted(back.table.column("rts").to_pylist()) == [1.0, 2.0, 3.0, 4.0]


@pytest.mark.parametrize("name", ["o.jsonl.gz", "o.ndjson.gz", "o.json.gz"])
def test_jsonl_gz_output_is_gzip(tmp_path, floats, capsys, name):
    out = tmp_path / name
    assert main([*floats, "--sql", "SELECT R.x FROM R, S WHERE R.k = S.k",
                 "--output", str(out)]) == 0, capsys.readouterr().err
    with gzip.open(out, "rt") as f:
        assert [strict_json(line)["x"] for line in f] == ["NaN", "Infinity", "-Infinity", 1.5]


def test_a_gzip_sink_given_up_leaves_nothing(tmp_path):
    """An aborted run (an error, a second Ctrl-C) leaves neither the file nor its temporary
    one, and closes the descriptor kept for fsync."""
    schema = pa.schema([("x", pa.float64())])
    fds = len(os.listdir("/proc/self/fd"))
    sink = output.FileSink(str(tmp_path / "o.csv.gz"), schema, "csv")
    sink.write(pa.record_batch({"x": [1.0, 2.0]}))
    sink.abort()
    assert list(tmp_path.iterdir()) == []
    assert len(os.listdir("/proc/self/fd")) == fds
    sink = output.FileSink(str(tmp_path / "o.jsonl.gz"), schema, "jsonl")
    sink.write(pa.record_batch({"x": [NAN]}))
    sink.close()
    assert list(tmp_path.iterdir()) == [tmp_path / "o.jsonl.gz"]
    assert gzip.decompress((tmp_path / "o.jsonl.gz").read_bytes()) == b'{"x": "NaN"}\n'
    assert len(os.listdir("/proc/self/fd")) == fds


@pytest.mark.parametrize(("name", "fmt"), [
    ("o.parquet", "parquet"), ("o.PQ", "parquet"), ("o", "parquet"), ("d.x/o", "parquet"),
    ("o.csv", "csv"), ("o.CSV.GZ", "csv"), ("o.jsonl", "jsonl"), ("o.ndjson", "jsonl"),
    ("o.json.gz", "jsonl"), ("-", "csv")])
def test_the_format_comes_from_the_suffix(name, fmt):
    assert output.format_of(name, None) == fmt


@pytest.mark.parametrize(("name", "suffix"), [
    ("o.txt", "'.txt'"), ("o.gz", "'.gz'"), ("o.csvx", "'.csvx'"), ("o.txt.gz", "'.txt.gz'")])
def test_an_unknown_suffix_is_refused_before_a_file_is_made(tmp_path, floats, capsys, name,
                                                            suffix):
    before = sorted(tmp_path.iterdir())
    assert main([*floats, "--sql", "SELECT R.x FROM R, S WHERE R.k = S.k",
                 "--output", str(tmp_path / name)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert f"{suffix} is not an output format's suffix" in err[0]
    assert ".parquet" in err[0] and ".csv" in err[0] and ".jsonl" in err[0]
    assert "--format" in err[0]
    assert sorted(tmp_path.iterdir()) == before
    # --format says what to write under any name
    assert main([*floats, "--sql", "SELECT R.x FROM R, S WHERE R.k = S.k",
                 "--output", str(tmp_path / name), "--format", "jsonl"]) == 0
    raw = (tmp_path / name).read_bytes()
    text = gzip.decompress(raw) if name.endswith(".gz") else raw
    assert strict_json(text.decode().splitlines()[0])["x"] == "NaN"


def test_parquet_under_a_gz_name_is_refused(tmp_path, floats, capsys):
    for extra in ([], ["--format", "parquet"]):
        assert main([*floats, "--sql", "SELECT R.x FROM R, S WHERE R.k = S.k", "--output",
                     str(tmp_path / "o.parquet.gz"), *extra]) == 1
        assert "Parquet is compressed inside the file" in capsys.readouterr().err
    assert not (tmp_path / "o.parquet.gz").exists()


def test_a_rejected_file_with_an_unknown_suffix_is_refused_before_any_file(tmp_path, floats,
                                                                          capsys):
    before = sorted(tmp_path.iterdir())
    assert main([*floats, "--sql", "SELECT R.x FROM R, S WHERE R.k = S.k", "--output",
                 str(tmp_path / "o.parquet"), "--rejected", str(tmp_path / "rej.txt")]) == 1
    err = capsys.readouterr().err
    assert "--rejected" in err and "'.txt' is not an output format's suffix" in err
    assert sorted(tmp_path.iterdir()) == before


def test_no_suffix_is_still_parquet(tmp_path, floats, capsys):
    assert main([*floats, "--sql", "SELECT R.x FROM R, S WHERE R.k = S.k",
                 "--output", str(tmp_path / "results")]) == 0, capsys.readouterr().err
    assert pq.read_table(tmp_path / "results").num_rows == 4
    with pytest.raises(AdaptcqError, match="--format 'xml'"):
        output.format_of("o.csv", "xml")


# ----- 5. CSV and NaN: a round trip keeps them -------------------------------------------

def test_csv_round_trip_keeps_nan_null_and_empty_strings(tmp_path, floats, capsys):
    """adaptcq writes NaN as ``nan``, NULL as an empty field and an empty string as ``""``;
    its CSV input reads only an empty field as NULL (as Spark and DuckDB do), so each comes
    back as it was (pyarrow's default null values read ``nan`` as NULL: NaN came back NULL).
    Tokens such as NA are text, not NULL."""
    out = tmp_path / "o.csv"
    assert main([*floats, "--sql", "SELECT R.x, R.ts AS rts FROM R, S WHERE R.k = S.k",
                 "--output", str(out)]) == 0, capsys.readouterr().err
    assert [line.split(",")[0] for line in out.read_text().splitlines()] == \
        ['"x"', "nan", "inf", "-inf", "1.5"]
    back = adaptcq.run("SELECT A.x FROM A, B WHERE A.rts = B.rts",
                       {"A": str(out), "B": str(out)}, timestamp="rts").table
    got = back.column("x").to_pylist()
    assert math.isnan(got[0]) and got[1:] == [INF, -INF, 1.5]
    text = tmp_path / "t.csv"
    text.write_text('ts,k,s,n\n1,1,"",1\n2,1,,\n3,1,NA,3\n')
    rows = adaptcq.run("SELECT A.s, A.n FROM A, B WHERE A.k = B.k",
                       {"A": str(text), "B": pa.table({"ts": [9], "k": [1]})}).table
    assert rows.column("s").to_pylist() == ["", None, "NA"]
    assert rows.column("n").to_pylist() == [1, None, 3]


def test_a_query_sets_output_with_an_unknown_suffix_names_the_query(tmp_path):
    """From the Python API a query set's output is named by its query, not as --output."""
    eng = adaptcq.Engine({"R": pa.table({"ts": [1], "k": [1]})})
    with pytest.raises(AdaptcqError, match=r"query q1 output '.*x\.txt': '\.txt' is not"):
        eng.register("SELECT R.k FROM R", output=str(tmp_path / "x.txt"))  # (not at run())
