"""Output files and the values' types: what a format cannot hold is refused before any file
is made (found by fuzzing the writers)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from adaptcq.cli import main


def test_csv_output_of_a_list_column_is_refused_before_a_file_is_made(tmp_path, capsys):
    pq.write_table(pa.table({"ts": [1], "k": [1], "l": pa.array([[1, None]])}),
                   tmp_path / "r.parquet")
    pq.write_table(pa.table({"ts": [1], "k": [1]}), tmp_path / "s.parquet")
    args = ["run", "--no-progress", "--sql", "SELECT R.l FROM R, S WHERE R.k = S.k",
            f"--input=R={tmp_path / 'r.parquet'}", f"--input=S={tmp_path / 's.parquet'}"]
    assert main([*args, "--output", str(tmp_path / "o.csv")]) == 1
    err = capsys.readouterr().err
    assert "CSV cannot hold column 'l' (list<element: int64>)" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.parquet", "s.parquet"]
    assert main([*args, "--output", str(tmp_path / "o.jsonl")]) == 0
    assert (tmp_path / "o.jsonl").read_text().startswith('{"l": [1, null]')


def test_rejected_rows_to_stdout_are_refused(tmp_path, capsys):
    """``--rejected -`` would interleave rejected rows with the results on stdout (or with
    the summary): refused, asking for a file."""
    pq.write_table(pa.table({"ts": [1], "k": [1]}), tmp_path / "r.parquet")
    pq.write_table(pa.table({"ts": [1], "k": [1]}), tmp_path / "s.parquet")
    assert main(["run", "--no-progress", "--sql", "SELECT R.k FROM R, S WHERE R.k = S.k",
                 f"--input=R={tmp_path / 'r.parquet'}", f"--input=S={tmp_path / 's.parquet'}",
                 "--output", "-", "--format", "jsonl", "--rejected", "-"]) == 1
    assert "--rejected -: stdout carries the results" in capsys.readouterr().err
