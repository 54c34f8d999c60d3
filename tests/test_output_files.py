"""Output files as files: JSON lines and the summary are valid JSON whatever the floats,
and what CSV cannot hold is refused before a file is made."""

from __future__ import annotations

import json
import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from adaptcq.cli import main
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
