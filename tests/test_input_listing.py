"""Which files a folder or glob input reads, in which order, and the errors of reading them
(stream/sources.py ``_open_path``; runtime/spark.py ``_resolve_input``).

Both runtimes must read the same files in the same order: the local runtime lists them, the
Spark runtime's file source lists them again (its own rules: Hadoop's glob, hidden names,
``recursiveFileLookup``, ``pathGlobFilter``) and its split orders rows by
``spark_split._file_key``. The tests at the end run Spark (the shared local session).
"""

from __future__ import annotations

import os
import tempfile
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import adaptcq
from adaptcq.errors import InputError
from adaptcq.runtime.spark import _resolve_input, run_files
from adaptcq.runtime.spark_split import _file_key
from adaptcq.stream import sources
from conftest import examples

JOIN = ("SELECT R.id AS rid, S.id AS sid FROM R [RANGE 100 SECONDS], S [RANGE 100 SECONDS] "
        "WHERE R.a = S.a")


def csv(path: Path, ts: list[float], first_id: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pacsv.write_csv(pa.table({"ts": ts, "id": list(range(first_id, first_id + len(ts))),
                              "a": [1] * len(ts)}), path)


def ids(src: sources.Source) -> list[int]:
    return [i for b in src.chunks() for i in b.column("id").to_pylist()]


def rows(table: pa.Table) -> Counter:
    return Counter(zip(*[table.column(c).to_pylist() for c in table.column_names]))


# ----- what a folder or glob lists, against a model of Spark's file listing -------------------

DIRS = ["a", "a-b", "a.b", "B", "_c", ".d", "_k=1"]
FILES = ["x.csv", "x-y.csv", "Z.CSV", "_u.csv", ".h.csv", "_k=2.csv", "n.md"]


def spark_hidden(name: str) -> bool:
    # Spark: HadoopFSUtils.shouldFilterOutPathName and PartitioningAwareFileIndex.isDataPath
    return name.startswith(".") or (name.startswith("_") and "=" not in name)


def readable(name: str) -> bool:
    return name.lower().endswith((".csv", ".parquet"))


def model_folder(folder: Path) -> list[Path]:
    """The files Spark's file source lists in ``folder`` (recursiveFileLookup)."""
    out = []
    for top, dirs, files in os.walk(folder, followlinks=True):
        dirs[:] = [d for d in dirs if not spark_hidden(d)]
        out += [Path(top) / f for f in files if not spark_hidden(f) and readable(f)]
    return out


def model_glob_star(root: Path) -> list[Path]:
    """The files of ``root/*`` as Spark reads them: Hadoop's ``*`` also matches names that
    start with "." or "_"; a matching folder is listed (its own name not checked), a
    matching file is dropped when its name is hidden."""
    out = []
    for p in root.iterdir():
        if p.is_dir():
            out += model_folder(p)
        elif not spark_hidden(p.name):
            out.append(p)
    return out


def in_split_order(paths: list[Path]) -> list[Path]:
    """Files in the order the Spark split gives their rows (by its file key)."""
    return sorted(paths, key=lambda p: _file_key(p.absolute().as_uri(), {}))


trees = st.lists(st.tuples(st.lists(st.sampled_from(DIRS), max_size=2),
                           st.sampled_from(FILES)), min_size=1, max_size=8)


@settings(max_examples=examples(60), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(tree=trees)
def test_folder_and_glob_read_spark_s_files_in_its_split_order(tree):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "R"
        made = {}
        for parts, name in tree:
            made.setdefault(root.joinpath(*parts, name), len(made))
        for path, k in made.items():
            if readable(path.name):
                csv(path, [0.0], k)
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text("not an input\n")
        for given, want in ((str(root), model_folder(root)),
                            (str(root / "*"), model_glob_star(root))):
            want = in_split_order(want)
            if not want:
                with pytest.raises(InputError, match="stream R: .*(no Parquet or CSV|no file)"):
                    sources.open_source("R", given, "ts")
                continue
            if any(not readable(p.name) for p in root.iterdir() if p.is_file()
                   and not spark_hidden(p.name)) and given.endswith("*"):
                # a glob matching a file that is neither Parquet nor CSV is refused
                with pytest.raises(InputError, match=r"'.*n\.md' is neither Parquet nor CSV"):
                    sources.open_source("R", given, "ts")
                continue
            src = sources.open_source("R", given, "ts")
            assert src.paths == want
            assert ids(src) == [made[p] for p in want]  # read in that order


def test_a_glob_reads_a_matching_folder_with_its_subfolders(tmp_path):
    """The tester's case: R/day-* matching day-1.csv and a folder day-2/ (it read 2 rows of
    4 before, silently)."""
    csv(tmp_path / "R" / "day-1.csv", [1.0, 2.0], 0)
    csv(tmp_path / "R" / "day-2" / "part-0.csv", [3.0], 2)
    csv(tmp_path / "R" / "day-2" / "sub" / "part-1.csv", [4.0], 3)
    csv(tmp_path / "R" / "day-2" / "_temporary" / "part-9.csv", [0.0], 9)  # skipped
    csv(tmp_path / "R" / "_day-0.csv", [0.0], 8)  # a hidden name, matched by *day-*
    src = sources.open_source("R", str(tmp_path / "R" / "*day-*"), "ts")
    assert ids(src) == [0, 1, 2, 3]
    # a glob matching only folders reads them (it said "no file matches")
    src = sources.open_source("R", str(tmp_path / "R" / "day-2*"), "ts")
    assert ids(src) == [2, 3]


def test_a_glob_matching_only_skipped_files_says_why(tmp_path):
    csv(tmp_path / "R" / "_a.csv", [1.0], 0)
    (tmp_path / "R" / "empty").mkdir()
    with pytest.raises(InputError, match=r"stream R: '.*\*' matches 2 path\(s\) but no file to "
                       r"read: .*name starts with '_' or '.' is skipped"):
        sources.open_source("R", str(tmp_path / "R" / "*"), "ts")
    with pytest.raises(InputError, match=r"stream R: no file matches '.*nothing-\*'"):
        sources.open_source("R", str(tmp_path / "R" / "nothing-*"), "ts")


def test_folder_order_is_by_path_components_as_spark_s_split_orders(tmp_path):
    """R/a/x.csv comes before R/a-b/x.csv (by component: 'a' < 'a-b'), though the text
    'R/a-b/x.csv' sorts first ('-' < '/'); rows in that order are on time."""
    csv(tmp_path / "R" / "a-b" / "x.csv", [4.0, 5.0], 2)
    csv(tmp_path / "R" / "a" / "x.csv", [1.0, 2.0], 0)
    csv(tmp_path / "s.csv", [0.0], 9)
    src = sources.open_source("R", str(tmp_path / "R"), "ts")
    assert src.paths == in_split_order(src.paths)
    assert ids(src) == [0, 1, 2, 3]
    got = adaptcq.run(JOIN, {"R": str(tmp_path / "R"), "S": str(tmp_path / "s.csv")})
    assert got.table.num_rows == 4 and got.rejected.num_rows == 0


# ----- links ------------------------------------------------------------------------------------

def test_a_linked_subfolder_is_read_through_the_link(tmp_path):
    csv(tmp_path / "R" / "a.csv", [1.0], 0)
    csv(tmp_path / "other" / "b.csv", [2.0], 1)
    os.symlink("../other", tmp_path / "R" / "link")
    src = sources.open_source("R", str(tmp_path / "R"), "ts")
    assert src.paths == [tmp_path / "R" / "a.csv", tmp_path / "R" / "link" / "b.csv"]
    assert ids(src) == [0, 1]
    # through a glob's matching folder too
    assert ids(sources.open_source("R", str(tmp_path / "R" / "l*"), "ts")) == [1]


@pytest.mark.parametrize("target", [".", "..", "../.."])
def test_a_link_to_a_folder_holding_it_is_refused_naming_it(tmp_path, target):
    csv(tmp_path / "R" / "sub" / "a.csv", [1.0], 0)
    os.symlink(target, tmp_path / "R" / "sub" / "loop")
    real = (tmp_path / "R" / "sub" / target).resolve()
    with pytest.raises(InputError) as e:
        sources.open_source("R", str(tmp_path / "R"), "ts")
    assert str(e.value) == (
        f"stream R: {str(tmp_path / 'R' / 'sub' / 'loop')!r} is a link to {str(real)!r}, a "
        f"folder that holds it, so the files of {str(real)!r} would be read over and over "
        "(Spark's file source reads them again at every level); remove the link")


def test_two_links_to_one_folder_read_it_twice(tmp_path):
    """Not a cycle: each link is a path of its own (Spark reads both too)."""
    csv(tmp_path / "other" / "b.csv", [2.0], 1)
    csv(tmp_path / "R" / "a.csv", [1.0], 0)
    os.symlink("../other", tmp_path / "R" / "l1")
    os.symlink("../other", tmp_path / "R" / "l2")
    assert ids(sources.open_source("R", str(tmp_path / "R"), "ts")) == [0, 1, 1]


def test_spark_refuses_a_single_file_it_would_skip_as_hidden(tmp_path):
    """Spark's file source drops a file named '_x.csv' even when given alone (it read no
    row, exit 0); the local runtime reads it."""
    csv(tmp_path / "_part.csv", [1.0], 0)
    assert ids(sources.open_source("R", str(tmp_path / "_part.csv"), "ts")) == [0]
    with pytest.raises(InputError, match=r"stream R: '.*_part.csv' names a file whose name "
                       r"starts with '_', which Spark's file source skips \(as hidden\)"):
        _resolve_input("R", str(tmp_path / "_part.csv"), "ts", None)
    os.symlink("_part.csv", tmp_path / "r.csv")  # (Spark is given the real path)
    with pytest.raises(InputError, match="names a file whose name starts with '_'"):
        _resolve_input("R", str(tmp_path / "r.csv"), "ts", None)
    csv(tmp_path / "_k=1.csv", [1.0], 0)  # not hidden to Spark
    assert _resolve_input("R", str(tmp_path / "_k=1.csv"), "ts", None).files


def test_spark_lists_globs_and_folders_with_the_local_suffixes(tmp_path):
    csv(tmp_path / "R" / "day-1.csv", [1.0], 0)
    inp = _resolve_input("R", str(tmp_path / "R" / "day-*"), "ts", None)
    assert inp.options["recursiveFileLookup"] == "true"
    flt = inp.options["pathGlobFilter"]
    assert "[cC][sS][vV]" in flt and "[cC][sS][vV].[bB][zZ]2" in flt and ",bz2" not in flt


# ----- Parquet files that differ in nullability only --------------------------------------------

def _nullability_folder(root: Path) -> Path:
    folder = root / "R"
    folder.mkdir(parents=True)
    when = pa.array([0, 1], pa.timestamp("us"))
    t = pa.table({"ts": [1.0, 2.0], "id": [0, 1], "a": [1, 1], "when": when,
                  "tags": [[1], [2, None]]})
    pq.write_table(t, folder / "a.parquet")  # pandas/pyarrow: nullable fields
    strict = pa.schema([pa.field("ts", pa.float64(), False), pa.field("id", pa.int64(), False),
                        pa.field("a", pa.int64(), False),
                        pa.field("when", pa.timestamp("us"), False),
                        pa.field("tags", pa.list_(pa.field("element", pa.int64(), False)),
                                 False)],
                       metadata={"org.apache.spark.sql.parquet.row.metadata": "{}"})
    pq.write_table(pa.table({"ts": [3.0], "id": [2], "a": [1], "when": when[:1],
                             "tags": [[3]]}).cast(strict), folder / "b.parquet")
    return folder


def test_parquet_files_differing_only_in_nullability_are_one_input(tmp_path):
    folder = _nullability_folder(tmp_path)
    src = sources.open_source("R", str(folder), "ts")
    got = pa.Table.from_batches(list(src.chunks()))
    assert got.column("id").to_pylist() == [0, 1, 2]
    assert got.column("tags").to_pylist() == [[1], [2, None], [3]]
    pq.write_table(pa.table({"ts": [0.0], "id": [9], "a": [1]}), tmp_path / "s.parquet")
    res = adaptcq.run(JOIN, {"R": str(folder), "S": str(tmp_path / "s.parquet")})
    assert sorted(res.table.column("rid").to_pylist()) == [0, 1, 2]


@pytest.mark.parametrize(("other", "difference"), [
    ({"ts": [3.0], "id": pa.array([2], pa.int32()), "a": [1]}, "its column 'id' is int32, not int64"),
    ({"ts": [3.0], "a": [1], "id": [2]}, "its column 2 is 'a', not 'id'"),
    ({"ts": [3.0], "id": [2]}, "it lacks column 'a'"),
    ({"ts": [3.0], "id": [2], "a": [1], "b": [1]}, "it has a column 'b' more"),
])
def test_parquet_files_that_really_differ_are_refused_showing_the_difference(
        tmp_path, other, difference):
    (tmp_path / "R").mkdir()
    strict = pa.schema([pa.field("ts", pa.float64(), False), pa.field("id", pa.int64(), False),
                        pa.field("a", pa.int64(), False)])
    pq.write_table(pa.table({"ts": [1.0], "id": [0], "a": [1]}).cast(strict),
                   tmp_path / "R" / "a.parquet")
    pq.write_table(pa.table(other), tmp_path / "R" / "b.parquet")
    with pytest.raises(InputError) as e:
        sources.open_source("R", str(tmp_path / "R"), "ts")
    assert f"({difference}); every file of" in str(e.value)
    assert str(e.value).startswith(f"stream R: {str(tmp_path / 'R' / 'b.parquet')!r} has columns")


# ----- CSV rows with too few or too many fields -------------------------------------------------

@pytest.mark.parametrize(("bad", "fields"), [("4,4", 2), ("4,4,4,4", 4)])
def test_a_ragged_csv_row_is_named_by_its_row_number(tmp_path, bad, fields):
    """Row numbers count data rows from 0 after the header, as a conversion error's do: a
    blank line is no row, a quoted field may hold a line break."""
    lines = ["ts,id,a", "0,0,1", "", "1,1,1", '2,"x\ny",1', bad] + [
        f"{k},{k},1" for k in range(5, 50_000)]
    (tmp_path / "r.csv").write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError) as e:
        ids(sources.open_source("R", str(tmp_path / "r.csv"), "ts"))
    assert str(e.value) == (
        f"stream R: row 3 of {str(tmp_path / 'r.csv')!r} has {fields} field(s), but the "
        f"header has 3 columns: {bad!r}; give every row one field per column (quote a field "
        "that holds the delimiter)")


def test_a_ragged_row_deep_in_a_later_file_names_its_stream_row_too(tmp_path):
    csv(tmp_path / "R" / "a.csv", [0.0, 1.0], 0)
    body = ["ts,id,a"] + [f"{k},{k},1" for k in range(2, 300_000)]
    body[200_001] = "9,9"  # row 200000 of b.csv
    (tmp_path / "R" / "b.csv").write_text("\n".join(body) + "\n")
    with pytest.raises(InputError, match=(
            r"^stream R: row 200002 \(row 200000 of '.*b\.csv'\) has 2 field\(s\), but the "
            r"header has 3 columns: '9,9'")):
        ids(sources.open_source("R", str(tmp_path / "R"), "ts"))


# ----- Spark reads the same files in the same order --------------------------------------------

def _listing_case(root: Path) -> dict[str, str]:
    """A glob matching a file, a hidden file and a folder that holds a subfolder, a hidden
    file, a link to a folder, a file of an odd suffix and one in capitals; the files' order
    by path component is their time order (text order would make a/x.csv late)."""
    R = root / "R"
    csv(R / "day-1.csv", [0.1, 0.2], 0)
    csv(R / "_day-0.csv", [0.0], 100)  # skipped (hidden)
    csv(R / "day-2" / "a" / "x.csv", [1.0, 1.1], 2)
    csv(R / "day-2" / "a-b" / "x.csv", [2.0, 2.1], 4)
    csv(R / "day-2" / "_tmp.csv", [0.0], 101)  # skipped (hidden)
    (R / "day-2" / "n.bz2").write_text("ts,id,a\n0.0,102,1\n")  # neither Parquet nor CSV
    csv(root / "other" / "z.csv", [3.0], 6)
    os.symlink("../../other", R / "day-2" / "link")
    csv(R / "day-3.CSV", [4.0], 7)
    csv(root / "s.csv", [0.0, 5.0], 50)
    return {"R": str(R / "*day-*"), "S": str(root / "s.csv")}


def test_spark_reads_the_files_and_order_the_local_runtime_reads(spark, tmp_path):
    srcs = _listing_case(tmp_path / "in")
    local = adaptcq.run(JOIN, srcs)
    assert sorted(set(local.table.column("rid").to_pylist())) == list(range(8))
    assert local.rejected.num_rows == 0
    run = run_files(spark, JOIN, srcs, str(tmp_path / "ck"), str(tmp_path / "out"),
                    partitions=2)
    got = pq.read_table(tmp_path / "out")
    assert rows(got) == rows(local.table)
    assert run.rejected == 0


def test_spark_reads_parquet_files_differing_only_in_nullability(spark, tmp_path):
    folder = _nullability_folder(tmp_path / "in")
    pq.write_table(pa.table({"ts": [0.0], "id": [9], "a": [1]}), tmp_path / "in" / "s.parquet")
    srcs = {"R": str(folder), "S": str(tmp_path / "in" / "s.parquet")}
    local = adaptcq.run(JOIN, srcs)
    run_files(spark, JOIN, srcs, str(tmp_path / "ck"), str(tmp_path / "out"), partitions=2)
    got = pq.read_table(tmp_path / "out")
    assert rows(got) == rows(local.table) and got.num_rows == 3
