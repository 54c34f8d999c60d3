"""Paths and CSV rows read alike by the two runtimes (stream/sources.py, runtime/spark.py,
cliargs.py, cli.cmd_cleanup, runtime/multi.py's control stream).

- A CSV row Spark cannot read past the rows the driver checks stops a Spark run, as it
  stops a local run, naming the file and the row (FAILFAST; it became NULLs).
- A glob means the same files to Python's glob and Hadoop's, or is refused naming the
  character (``{a,b}`` was alternation on Spark and literal locally).
- Every path is taken as written (no ``~`` expansion); an unexpanded ``~`` folder that does
  not exist is refused, as an output's is.
- A control stream's CSV is read with the inputs' options, its text columns as text.

Spark tests use the shared local session (conftest.py); the glob property asks Hadoop's
file system directly (what Spark's file source globs with), without a Spark job.
"""

from __future__ import annotations

import contextlib
import glob
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import adaptcq
from adaptcq.cli import main
from adaptcq.cliargs import query_files, sql_arg
from adaptcq.errors import AdaptcqError, InputError
from adaptcq.runtime.multi import _read_table
from adaptcq.runtime.spark import (
    _resolve_input,
    _spark_glob,
    failed_read,
    prepare_files,
    run_files,
)
from adaptcq.stream.sources import check_glob, open_source
from conftest import examples

PAIR = ("SELECT R.id AS rid, S.id AS sid FROM R [RANGE 1 SECONDS], S [RANGE 1 SECONDS] "
        "WHERE R.a = S.a")


def error_of(capsys, argv) -> str:
    assert main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


# ----- 1. a bad CSV row past the driver's check stops Spark, naming file and row ----------

def test_failed_read_names_the_local_file_and_spark_s_reason():
    text = ("Caused by: org.apache.spark.SparkException: [FAILED_READ_FILE.NO_HINT] Encountered "
            "error while reading file file:///tmp/a%20b/r.v1.csv.  SQLSTATE: KD001\n\tat x\n"
            "Caused by: org.apache.spark.SparkRuntimeException: [MALFORMED_CSV_RECORD] "
            "Malformed CSV record: 1.5,4 SQLSTATE: KD000\n\tat y\n")
    assert failed_read(text) == ("/tmp/a b/r.v1.csv", "Malformed CSV record: 1.5,4")
    assert failed_read("[STREAM_FAILED] something else") is None


def two_files(root: Path, later: str) -> dict[str, str]:
    """R: a folder whose second file holds ``later`` as its second row; the driver reads
    only the first file's rows (a later file's header), so Spark meets the row first."""
    (root / "R").mkdir(parents=True)
    (root / "R" / "a.csv").write_text("ts,id,a,v\n0.0,1,1,0.5\n0.5,2,2,1.5\n")
    (root / "R" / "b.csv").write_text(f"ts,id,a,v\n1.0,3,1,2.5\n{later}\n2.0,5,1,1.0\n")
    (root / "s.csv").write_text("ts,id,a\n0.0,1,1\n1.0,2,2\n1.4,3,1\n")
    return {"R": str(root / "R"), "S": str(root / "s.csv")}


@pytest.mark.parametrize(("later", "message"), [
    # a short row whose missing fields the query does not read (column pruning padded it)
    ("1.5,4", "row 1 of '{b}' has 2 field(s), but the header has 4 columns: '1.5,4'"),
    ("1.5,x4,1,2.0", "row 1 of '{b}' has 'x4' in column 'id', which is int64"),
])
def test_a_bad_csv_row_in_a_later_file_stops_spark_naming_its_file_and_row(
        spark, tmp_path, later, message):
    srcs = two_files(tmp_path, later)
    b = os.path.join(srcs["R"], "b.csv")
    with pytest.raises(InputError) as local:
        adaptcq.run(PAIR, srcs)
    with pytest.raises(InputError) as remote:
        run_files(spark, PAIR, srcs, str(tmp_path / "ck"), str(tmp_path / "out"))
    assert str(local.value).startswith(f"stream R: row 3 (row 1 of {b!r}) ")
    # The same message, but for the row of the stream (Spark numbers rows within a file)
    assert str(remote.value) == str(local.value).replace(f"row 3 (row 1 of {b!r})",
                                                         f"row 1 of {b!r}")
    assert str(remote.value).startswith("stream R: " + message.format(b=b))


def test_a_bad_csv_row_stops_a_spark_query_set_naming_its_file_and_row(spark, tmp_path):
    """The same for many queries in one Spark job (``spark_multi``): it said only "the Spark
    query failed"."""
    from adaptcq.runtime.spark_multi import run_query_files
    srcs = two_files(tmp_path, "1.5,4")
    b = os.path.join(srcs["R"], "b.csv")
    with pytest.raises(InputError) as remote:
        run_query_files(spark, srcs, {"q": PAIR}, checkpoint=str(tmp_path / "ck"),
                        output=str(tmp_path / "out"))
    assert str(remote.value).startswith(
        f"stream R: row 1 of {b!r} has 2 field(s), but the header has 4 columns")


def test_a_value_only_spark_cannot_read_is_named_not_nulled(spark, tmp_path):
    """``nan`` is NaN to the local runtime, a malformed number to Spark: it stopped being
    NULL on Spark (silently another result); the error names the file and Spark's reason."""
    srcs = two_files(tmp_path, "1.5,4,1,nan")
    sql = ("SELECT R.id AS rid, R.v AS v, S.id AS sid FROM R [RANGE 1 SECONDS], "
           "S [RANGE 1 SECONDS] WHERE R.a = S.a")
    local = adaptcq.run(sql, srcs).table.to_pylist()
    assert any(r["rid"] == 4 and r["v"] != r["v"] for r in local)  # NaN, read
    with pytest.raises(InputError) as remote:
        run_files(spark, sql, srcs, str(tmp_path / "ck"), str(tmp_path / "out"))
    b = os.path.join(srcs["R"], "b.csv")
    assert str(remote.value).startswith(f"stream R: Spark cannot read a row of {b!r} that "
                                        "the local runtime reads (")
    assert '"nan"' in str(remote.value)


# ----- 2. globs: the same files to both runtimes, or refused ------------------------------

@pytest.mark.parametrize(("pattern", "char"), [
    ("r-{a,b}*.csv", "{"), ("r-*.{csv,txt}", "{"), ("r-[^a].csv", "["), ("r-\\*.csv", "\\"),
    ("r-[a*.csv", "["), ("r-[?]*.csv", "["), ("d{x}*/r.csv", "{"),
])
def test_glob_syntax_read_otherwise_by_hadoop_is_refused_on_both_runtimes(
        tmp_path, pattern, char):
    for n in ("r-a.csv", "r-b.csv", "r-^.csv"):
        (tmp_path / n).write_text("ts,id,a\n0.0,1,1\n")
    text = str(tmp_path / pattern)
    k = text.index(char, len(str(tmp_path)))
    expected = f"stream R: glob {text!r}, character {k + 1} ({char!r}): "
    with pytest.raises(InputError) as local:
        open_source("R", text, "ts")
    with pytest.raises(InputError) as remote:
        _resolve_input("R", text, "ts", None)
    assert str(local.value).startswith(expected)
    assert str(remote.value) == str(local.value)


@pytest.mark.parametrize(("pattern", "at"), [("d*/", "d*/"), ("d*/../r.csv", "../r.csv")])
def test_a_glob_spark_would_be_given_normalized_is_refused_on_both_runtimes(
        tmp_path, pattern, at):
    """``data/*/`` matched only folders locally, and Spark, given ``data/*``, read the
    files beside them too; ``d*/../r.csv`` was read once per folder locally, once on
    Spark."""
    (tmp_path / "d1").mkdir()
    (tmp_path / "d1" / "r.csv").write_text("ts,id,a\n0.0,1,1\n")
    (tmp_path / "dtop.csv").write_text("ts,id,a\n0.0,2,1\n")
    (tmp_path / "r.csv").write_text("ts,id,a\n0.0,3,1\n")
    text = f"{tmp_path}/{pattern}"  # (a Path drops the trailing '/')
    k = len(str(tmp_path)) + 1 + pattern.index(at) + (len(at) - 1 if at == pattern else 0)
    with pytest.raises(InputError) as local:
        open_source("R", text, "ts")
    with pytest.raises(InputError) as remote:
        _resolve_input("R", text, "ts", None)
    assert str(local.value).startswith(f"stream R: glob {text!r}, character {k + 1} ")
    assert str(remote.value) == str(local.value)


def test_literal_parts_of_a_glob_and_its_folder_may_hold_any_character(tmp_path):
    """Only a wildcard part is a pattern: '{', '}' or ']' in another part (or in the current
    folder, for a relative glob) are literal to both (escaped for Spark)."""
    d = tmp_path / "w{1}" / "x[2]"
    d.mkdir(parents=True)
    (d / "r-a.csv").write_text("ts,id,a\n0.0,1,1\n")
    with contextlib.chdir(tmp_path):
        assert _spark_glob("w{1}/x*/r-*.csv") == f"{tmp_path}/w\\{{1\\}}/x*/r-*.csv"
        inp = _resolve_input("R", "w{1}/x*/r-*.csv", "ts", None)
    assert [p.name for p in inp.files] == ["r-a.csv"]
    with contextlib.chdir(d):
        assert _spark_glob("r-*.csv") == f"{tmp_path}/w\\{{1\\}}/x\\[2\\]/r-*.csv"
    folder = _resolve_input("R", str(d.parent), "ts", None)  # (no '[': not a glob)
    assert folder.path == f"{tmp_path}/w\\{{1\\}}"
    assert [p.name for p in folder.files] == ["r-a.csv"]


def test_spark_reads_a_folder_and_a_glob_under_special_names_as_the_local_runtime(
        spark, tmp_path):
    """A folder named with '{' was a Hadoop glob to Spark (of another folder, 'in1'), and a
    relative glob's current folder with '[' part of the pattern: both read nothing, or
    other files."""
    root = tmp_path / "at [x]"
    (root / "in{1}").mkdir(parents=True)
    (root / "in1").mkdir()
    (root / "in{1}" / "r.csv").write_text("ts,id,a\n0.0,1,1\n0.5,2,2\n")
    (root / "in1" / "r.csv").write_text("ts,id,a\n0.0,9,1\n")
    (root / "s-1.csv").write_text("ts,id,a\n0.0,1,1\n0.6,2,2\n")
    with contextlib.chdir(root):
        srcs = {"R": "in{1}", "S": "s-*.csv"}
        local = adaptcq.run(PAIR, srcs).table
        run_files(spark, PAIR, srcs, "ck", "out")
        remote = pq.read_table("out")
    assert sorted(remote.to_pylist(), key=str) == sorted(local.to_pylist(), key=str)
    assert sorted(r["rid"] for r in local.to_pylist()) == [1, 2]


NAMES = ["a.csv", "b.csv", "ab.csv", "^.csv", "!.csv", "-.csv", "].csv", "{a,b}.csv",
         "[.csv", "?.csv", "*.csv", "a-b.csv", ".h.csv"]
GLOB_CHARS = st.sampled_from(list("ab^!-],{}[?*\\") + ["[!", "[^", "[a-b]", "[]a]", "{a,b}"])


@pytest.fixture(scope="module")
def named_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("g") / "in [1]"  # (a current folder Hadoop must not glob)
    root.mkdir()
    for n in NAMES:
        (root / n).write_text("ts\n0.0\n")
    return root


@settings(max_examples=examples(150))
@given(parts=st.lists(GLOB_CHARS, min_size=1, max_size=4))
def test_an_accepted_glob_matches_the_same_files_in_python_and_hadoop(spark, named_files,
                                                                      parts):
    """Every glob over names with the characters whose meaning could differ: refused by
    ``check_glob``, or matching the same files with Python's glob (the local runtime's) and
    Hadoop's ``globStatus`` (Spark's file source's) of ``_spark_glob`` (a relative glob,
    from a current folder whose name has '[', ' ')."""
    text = "".join(parts) + ".csv"
    if not glob.has_magic(text):
        text = "*" + text
    try:
        check_glob("R", text)
    except InputError:
        return
    jvm = spark._jvm
    fs = jvm.org.apache.hadoop.fs.FileSystem.getLocal(spark._jsc.hadoopConfiguration())
    with contextlib.chdir(named_files):
        python = {os.path.basename(p) for p in glob.glob(text, include_hidden=True)}
        found = fs.globStatus(jvm.org.apache.hadoop.fs.Path(_spark_glob(text)))
    hadoop = {s.getPath().getName() for s in found or []}
    assert python == hadoop, text


# ----- 3. paths as written: no '~' expansion, an unexpanded '~' refused --------------------

TILDE = "there is no folder '~nobody-adaptcq' here, and adaptcq does not expand '~'"


def test_an_input_under_a_missing_tilde_folder_is_refused_alike(tmp_path):
    path = "~nobody-adaptcq/r.csv"
    with pytest.raises(InputError, match=TILDE) as local:
        open_source("R", path, "ts")
    with pytest.raises(InputError) as remote:
        _resolve_input("R", path, "ts", None)
    assert str(local.value).startswith(f"stream R: input {path!r}: ")
    assert str(remote.value) == str(local.value)


def test_a_folder_named_tilde_is_read_as_written_by_both_runtimes(tmp_path, monkeypatch):
    home = tmp_path / "home"
    (home / "d").mkdir(parents=True)
    (home / "d" / "r.csv").write_text("ts,id\n0.0,1\n0.5,2\n")  # what '~' expanded to
    (tmp_path / "~" / "d").mkdir(parents=True)
    (tmp_path / "~" / "d" / "r.csv").write_text("ts,id\n0.0,7\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    assert open_source("R", "~/d/r.csv", "ts").paths == [Path("~/d/r.csv")]
    inp = _resolve_input("R", "~/d/r.csv", "ts", None)
    assert inp.files == [Path("~/d/r.csv")]
    assert inp.path.startswith(str(tmp_path / "~" / "d"))


def test_query_files_are_taken_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert query_files(["@~/q.sql", "SELECT 1"]) == [Path("~/q.sql")]
    with pytest.raises(AdaptcqError, match=f"query file '~nobody-adaptcq/q.sql': {TILDE}"):
        sql_arg("@~nobody-adaptcq/q.sql")
    (tmp_path / "~").mkdir()
    (tmp_path / "~" / "q.sql").write_text("SELECT R.id FROM R [RANGE 1 SECONDS]")
    assert sql_arg("@~/q.sql") == "SELECT R.id FROM R [RANGE 1 SECONDS]"


def test_a_checkpoint_under_a_missing_tilde_folder_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "r.csv").write_text("ts,id,a\n0.0,1,1\n")
    with pytest.raises(AdaptcqError, match="--checkpoint '~nobody-adaptcq/ck': there is no"):
        prepare_files("SELECT R.id FROM R [RANGE 1 SECONDS]", {"R": "r.csv"},
                      "~nobody-adaptcq/ck", None)
    err = error_of(capsys, ["run", "--engine", "spark", "--master", "local[1]", "--sql",
                            "SELECT R.id FROM R [RANGE 1 SECONDS]", "--input", "R=r.csv",
                            "--checkpoint=~nobody-adaptcq/ck"])
    assert "--checkpoint '~nobody-adaptcq/ck': there is no folder" in err
    assert not list(tmp_path.glob("~*"))


def test_cleanup_takes_its_folder_as_written(tmp_path, capsys, monkeypatch):
    """``~/ck`` is the folder '~' here, not the home folder's ck (a Spark checkpoint there
    was cleaned up instead); a missing '~' folder is refused as such."""
    home = tmp_path / "home"
    (home / "ck").mkdir(parents=True)
    (home / "ck" / "adaptcq.json").write_text("{}")
    (tmp_path / "~" / "ck").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    err = error_of(capsys, ["cleanup", "~/ck"])
    assert err.endswith("~/ck is neither a Spark checkpoint (no adaptcq.json) nor a spill "
                        "folder (no manifest.json); adaptcq cleanup takes a Spark run's "
                        "checkpoint (a folder holding adaptcq.json) or the --spill-dir of a "
                        "local run with --cleanup off")
    err = error_of(capsys, ["cleanup", "~nobody-adaptcq/ck"])
    assert f"adaptcq cleanup '~nobody-adaptcq/ck': {TILDE}" in err


# ----- 4. the control stream's CSV: the inputs' options, its text as text ---------------

def test_a_control_csv_keeps_query_ids_as_written(tmp_path):
    """A query id column of 007 (or of true) was read as integers (booleans), so the id
    became '7' ('True'). The control stream has no boolean column: its text columns are
    read as text, the rest with the inputs' options (``sources.csv_convert_options``)."""
    control = tmp_path / "control.csv"
    control.write_text("ts,action,query_id,sql\n0,register,007,SELECT R.k FROM R\n"
                       "0,register,true,SELECT R.k FROM R\n")
    assert _read_table(control).column("query_id").to_pylist() == ["007", "true"]
    only = tmp_path / "only.csv"
    only.write_text("ts,action,query_id,sql\n0,register,007,SELECT R.k FROM R\n")
    engine = adaptcq.Engine({"R": pa.table({"ts": [1.0], "k": [1]})})
    engine.load_control(str(only))
    engine.run()
    assert {h: engine.handles[h].table().num_rows for h in engine.handles} == {"007": 1}
