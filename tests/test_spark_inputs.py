"""The Spark runtime's inputs, checkpoints, outputs, event times and options (issue 8).

Spark tests run real streaming queries on the shared local[2] session (conftest.py); each is
kept to one or two small runs. Most refusals happen before Spark does any work: those tests
call the CLI in-process (``adaptcq.cli.main``) and need no Spark job.
"""

from __future__ import annotations

import json
import os
import shutil
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import adaptcq
from adaptcq.cli import main
from adaptcq.errors import AdaptcqError, InputError, QueryError
from adaptcq.runtime.spark import (
    FINGERPRINT,
    OUTPUT_MARKER,
    SplitWarning,
    continuous_query,
    normalize_sql,
    run_files,
)
from conftest import run_to_end

PQ = ("SELECT R.id AS rid, S.id AS sid, T.id AS tid FROM R [RANGE 1 SECONDS], "
      "S [RANGE 1 SECONDS], T [RANGE 1 SECONDS] WHERE R.a = S.a AND S.a = T.a")
PAIR = "SELECT R.id AS rid, S.id AS sid FROM R [RANGE 1 SECONDS], S [RANGE 1 SECONDS] WHERE R.a = S.a"


def rows(table: pa.Table) -> Counter:
    return Counter(zip(*[table.column(c).to_pylist() for c in table.column_names]))


def three_streams(root: Path) -> dict[str, str]:
    """R as one Parquet file, S as a folder of two (one in a subfolder), T as a glob over two
    files: the README's single-file form, folders and globs."""
    root.mkdir(parents=True, exist_ok=True)

    def table(n, shift, k):
        ts = [round(0.05 * j + shift, 2) for j in range(n)]  # ties across streams
        return pa.table({"ts": ts, "id": list(range(k, k + n)), "a": [j % 4 for j in range(n)]})
    pq.write_table(table(40, 0.0, 0), root / "r.parquet")
    (root / "S" / "sub").mkdir(parents=True)
    pq.write_table(table(20, 0.0, 0), root / "S" / "a.parquet")
    pq.write_table(table(20, 1.0, 20), root / "S" / "sub" / "b.parquet")
    (root / "S" / "notes.md").write_text("not an input\n")  # neither Parquet nor CSV
    pq.write_table(table(20, 0.0, 0), root / "t-1.parquet")
    pq.write_table(table(20, 1.0, 20), root / "t-2.parquet")
    return {"R": str(root / "r.parquet"), "S": str(root / "S"), "T": str(root / "t-*.parquet")}


def cli(*args: str) -> list[str]:
    master = [] if "--master" in args else ["--master", "local[2]"]  # (given once only)
    return ["run", "--engine", "spark", *master, *args]


def error_of(capsys, argv) -> str:
    assert main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err  # one line, no traceback
    return err[0]


# ----- no Spark job ----------------------------------------------------------------------------

def test_normalized_sql_keeps_quoted_text():
    assert normalize_sql("SELECT  R.id\n FROM R ;") == "SELECT R.id FROM R"
    assert normalize_sql("WHERE R.s = 'a  b'") != normalize_sql("WHERE R.s = 'a b'")


@pytest.mark.parametrize(("extra", "message"), [
    (["--executor", "xjoin", "--reorder", "agreedy"],
     "--optimizer and --reorder order MJoin pipelines; use them with --executor mjoin"),
    (["--caches", "global"], ("--caches, --cache-memory, --reopt-interval and "
                              "--no-cache-verify need --executor acaching")),
    (["--executor", "acaching", "--reopt-interval", "0"], "--reopt-interval must be"),
    (["--max-results", "10"], "--max-results 10 is not supported with --engine spark yet"),
    (["--format", "csv"], "--format csv is not supported with --engine spark"),
    (["--master", "nonsense"], "--master 'nonsense' is not a Spark master URL"),
    (["--partitions", "0"], "--partitions must be >= 1"),
    (["--sign", "nosuchcol"], "no input has the sign column 'nosuchcol' (--sign)"),
    (["--allowed-lateness", "inf"], "--allowed-lateness must be a finite number of seconds"),
])
def test_cli_refuses_what_spark_does_not_do(tmp_path, capsys, extra, message):
    srcs = three_streams(tmp_path / "in")
    argv = cli("--sql", PQ, *[f"--input={k}={v}" for k, v in srcs.items()],
               "--output", str(tmp_path / "out"), *extra)
    assert error_of(capsys, argv).startswith(f"adaptcq: error: {message}")
    assert not (tmp_path / "out").exists()


def test_outputs_inside_inputs_are_refused(tmp_path, capsys):
    srcs = three_streams(tmp_path / "in")
    inputs = [f"--input={k}={v}" for k, v in srcs.items()]
    for out, what in [(srcs["R"], "R"), (srcs["S"], "S"), (srcs["S"] + "/x", "S"),
                      (str(tmp_path / "in"), "R"), (str(tmp_path / "in" / "t-3.parquet"), "T")]:
        msg = error_of(capsys, cli("--sql", PQ, *inputs, "--output", out))
        assert f"--output {out} is the input" in msg and f"of stream {what}" in msg
    msg = error_of(capsys, cli("--sql", PQ, *inputs, "--output", str(tmp_path / "o"),
                               "--rejected", srcs["S"]))
    assert "--rejected" in msg and "of stream S" in msg
    msg = error_of(capsys, cli("--sql", PQ, *inputs, "--output", str(tmp_path / "o"),
                               "--checkpoint", str(tmp_path / "o")))
    assert "--checkpoint" in msg and "same folder" in msg
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "keep.txt").write_text("x")
    msg = error_of(capsys, cli("--sql", PQ, *inputs, "--output", str(tmp_path / "mine")))
    assert "not empty and was not written by adaptcq" in msg
    assert (tmp_path / "mine" / "keep.txt").exists()
    (tmp_path / "ck").write_text("a file")
    msg = error_of(capsys, cli("--sql", PQ, *inputs, "--output", str(tmp_path / "o"),
                               "--checkpoint", str(tmp_path / "ck")))
    assert msg == (f"adaptcq: error: checkpoint {tmp_path / 'ck'} is a file, not a folder; give "
                   "--checkpoint a new folder, or the folder of an earlier run of this query")


# ----- Spark -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def first_run(spark, tmp_path_factory):
    """The README's command over a single file, a folder and a glob, through the CLI, with a
    checkpoint: the run the checkpoint tests below restart from."""
    root = tmp_path_factory.mktemp("spark_inputs")
    srcs = three_streams(root / "in")
    argv = cli("--partitions", "2", "--mode", "retract", "--checkpoint", str(root / "ck"),
               "--sql", PQ, *[f"--input={k}={v}" for k, v in srcs.items()],
               "--output", str(root / "out"))
    assert main(argv) == 0
    return root, srcs, argv


def test_single_file_folder_and_glob_inputs_equal_local(first_run):
    root, srcs, _ = first_run
    local = adaptcq.run(PQ, srcs, mode="retract")
    assert local.table.num_rows > 20
    spark_out = pq.read_table(root / "out")
    assert spark_out.schema == local.table.schema
    assert rows(spark_out) == rows(local.table)
    fp = json.loads((root / "ck" / FINGERPRINT).read_text())
    assert fp["groups"] == 2 and fp["inputs"]["T"].endswith("t-*.parquet")
    assert json.loads((root / "out" / OUTPUT_MARKER).read_text())["run"] == fp["run"]


@pytest.mark.parametrize(("change", "difference"), [
    (("--sql", PQ.replace("R.a = S.a AND", "R.a = S.a AND R.id > 3 AND")),
     "the query text differs"),
    (("--mode", "append"), "--mode was retract, now append"),
    (("--partitions", "3"), "partition groups (--partitions) was 2, now 3"),
    (("--executor", "xjoin"), "--executor was auto, now xjoin"),
    (("--allowed-lateness", "0.5"), "--allowed-lateness (ns) was 0, now 500000000"),
    (("--timestamp-unit", "ms"), "--timestamp-unit was not given, now ms"),
])
def test_restart_with_another_query_is_refused(first_run, capsys, change, difference):
    root, _, argv = first_run
    argv = list(argv)
    flag, value = change
    if flag in argv:
        argv[argv.index(flag) + 1] = value
    else:
        argv += [flag, value]
    assert error_of(capsys, argv) == (
        f"adaptcq: error: checkpoint {root / 'ck'} was written by a different query "
        f"({difference}); use a new --checkpoint folder")


def test_moved_checkpoint_is_refused(first_run, capsys, tmp_path):
    root, _, argv = first_run
    moved = tmp_path / "moved"
    shutil.copytree(root / "ck", moved)
    argv = list(argv)
    argv[argv.index("--checkpoint") + 1] = str(moved)
    assert error_of(capsys, argv) == (
        f"adaptcq: error: checkpoint {moved} was written at {root / 'ck'} and has been moved "
        "or copied since; a Spark checkpoint records absolute paths (of its own end-of-input "
        "folder, among others) and works only where it was written: move it back, or use a "
        "new --checkpoint folder")


def test_fresh_run_clears_an_earlier_output_and_restarts_append_to_their_own(first_run,
                                                                              spark, tmp_path,
                                                                              capsys):
    """A fresh run over an adaptcq output folder replaces its results (never mixes two
    queries'); the checkpoint that wrote them is then refused that folder."""
    root, srcs, argv = first_run
    out = tmp_path / "out"
    shutil.copytree(root / "out", out)
    run = run_files(spark, PAIR, {"R": srcs["R"], "S": srcs["S"]}, str(tmp_path / "ck2"),
                    str(out), mode="append", partitions=2)
    got = pq.read_table(out)
    assert got.column_names == ["rid", "sid", "_sign", "_ts"]
    assert rows(got) == rows(adaptcq.run(PAIR, {"R": srcs["R"], "S": srcs["S"]}).table)
    assert run.results == got.num_rows
    argv = list(argv)
    argv[argv.index("--output") + 1] = str(out)
    # the first run's checkpoint records its own output; point it here: another query's
    fp_file = root / "ck" / FINGERPRINT
    saved = fp_file.read_text()
    try:
        fp = json.loads(saved)
        fp["output"], fp["rejected"] = str(out.resolve()), str(out.resolve()) + ".rejected"
        fp_file.write_text(json.dumps(fp))
        msg = error_of(capsys, argv)
    finally:
        fp_file.write_text(saved)
    assert msg.startswith(f"adaptcq: error: --output {out} holds the results of another run")


def test_csv_rows_keep_file_order_and_row_numbers(spark, tmp_path):
    """CSV has no row index on Spark: rows of equal time keep their file order (a [ROWS n]
    window shows it) and a rejected row has its index in its file."""
    ts = [0, 0, 0, 1, 1, 1, 2, 2, 5, 0.5, 5, 5, 6, 6]
    lines = [f"{float(t)},{k},{k % 2}" for k, t in enumerate(ts)]
    (tmp_path / "R").mkdir()
    (tmp_path / "R" / "r-1.csv").write_text("ts,id,a\n" + "\n".join(lines[:9]) + "\n")
    (tmp_path / "R" / "r-2.csv").write_text("ts,id,a\n" + "\n".join(lines[9:]) + "\n")
    (tmp_path / "s.csv").write_text("ts,id,a\n" + "\n".join(
        f"{t},{k},{k % 2}" for k, t in enumerate([0, 1, 1, 2, 2, 5, 6])) + "\n")
    srcs = {"R": str(tmp_path / "R"), "S": str(tmp_path / "s.csv")}
    sql = ("SELECT R.id AS rid, S.id AS sid FROM R [ROWS 2], S [RANGE 1 SECONDS] "
           "WHERE R.a = S.a")
    local = adaptcq.run(sql, srcs, mode="retract", allowed_lateness=1.0)
    # Row 0 of r-2.csv, named alike by both runtimes (its file and its row in it).
    mine = local.rejected.to_pylist()
    assert [(r["stream"], r["row"]) for r in mine] == [("R", 0)]
    assert os.path.realpath(mine[0]["file"]) == os.path.realpath(tmp_path / "R" / "r-2.csv")
    # one file per micro-batch: the late row arrives in the second (lateness is decided per
    # micro-batch on Spark, docs/spark.md)
    with pytest.warns(SplitWarning, match=r"stream R has a \[ROWS n\] window"):
        run = run_files(spark, sql, srcs, str(tmp_path / "ck"), str(tmp_path / "out"),
                        str(tmp_path / "rej"), mode="retract", allowed_lateness=1.0,
                        max_files_per_trigger=1)
    assert rows(pq.read_table(tmp_path / "out")) == rows(local.table)
    rej = pq.read_table(tmp_path / "rej").to_pylist()
    assert run.rejected == 1 and [(r["stream"], r["row"]) for r in rej] == [("R", 0)]
    assert rej[0]["file"] == os.path.realpath(tmp_path / "R" / "r-2.csv")
    assert rej[0]["ts"] == 0.5


def test_bad_times_stop_with_the_local_message(spark, tmp_path):
    pq.write_table(pa.table({"ts": [0.0, 0.5, 1.0, float("nan"), 2.0], "id": range(5),
                             "a": [1] * 5}), tmp_path / "r.parquet")
    pq.write_table(pa.table({"ts": [0.0, 0.6], "id": range(2), "a": [1] * 2}),
                   tmp_path / "s.parquet")
    srcs = {"R": str(tmp_path / "r.parquet"), "S": str(tmp_path / "s.parquet")}
    with pytest.raises(InputError) as local:
        adaptcq.run(PAIR, srcs)
    with pytest.raises(InputError) as remote:
        run_files(spark, PAIR, srcs, str(tmp_path / "ck"), str(tmp_path / "out"))
    # both name the file and the row in it (as the local runtime names file inputs' rows)
    assert str(local.value) == (f"stream R (file {srcs['R']}): row 3 has timestamp nan in "
                                "'ts'; a time must be a finite number")
    assert str(remote.value) == str(local.value)


def test_integer_times_in_milliseconds(spark, tmp_path, capsys):
    """Epoch milliseconds: refused as seconds (out of range) with the local message, right
    with --timestamp-unit ms (on the same checkpoint, which completed no micro-batch), and
    ``_ts`` stays int64 milliseconds, exactly."""
    for name, step in (("r", 100), ("s", 150)):
        (tmp_path / f"{name}.csv").write_text("ts,id,a\n" + "\n".join(
            f"{1_700_000_000_000 + step * k},{k},1" for k in range(8)) + "\n")
    inputs = [f"--input=R={tmp_path / 'r.csv'}", f"--input=S={tmp_path / 's.csv'}",
              "--checkpoint", str(tmp_path / "ck")]
    msg = error_of(capsys, cli("--sql", PAIR, *inputs, "--output", str(tmp_path / "out")))
    # R and S are read by parallel tasks: whichever fails first is reported
    assert msg in {(f"adaptcq: error: stream {n} (file {tmp_path / f'{n.lower()}.csv'}): row 0 "
                    "has timestamp 1700000000000 in 'ts', out of range for unit s (event times "
                    "span 1677-09-21 to 2262-04-11); if the column holds epoch milliseconds (or "
                    "µs, ns), say so with --timestamp-unit ms (us, ns)") for n in "RS"}
    # the failed run completed no micro-batch: its checkpoint and output take another query
    assert main(cli("--sql", PAIR, *inputs, "--output", str(tmp_path / "out"),
                    "--mode", "retract", "--timestamp-unit", "ms",
                    "--summary-json", str(tmp_path / "summary.json"))) == 0
    local = adaptcq.run(PAIR, {"R": str(tmp_path / "r.csv"), "S": str(tmp_path / "s.csv")},
                        mode="retract", timestamp_unit="ms")
    got = pq.read_table(tmp_path / "out")
    assert got.schema.field("_ts").type == pa.int64() == local.table.schema.field("_ts").type
    assert rows(got) == rows(local.table) and got.num_rows > 10
    doc = json.loads((tmp_path / "summary.json").read_text())
    assert doc["engine"] == "spark" and doc["results"] == got.num_rows
    assert doc["input_rows"] == 16 and doc["mode"] == "retract"


def test_timestamps_are_exact_and_keep_their_type(spark, tmp_path):
    """Timestamp inputs with microsecond fractions: every ``_ts`` (arrivals and expiries
    t + w) is exact and of the input's type, in the streaming DataFrame too."""
    base = 1_700_000_000_123_457  # µs
    for name, step in (("R", 333_331), ("S", 250_003)):
        t = pa.array([base + step * k for k in range(12)], pa.int64()).cast(
            pa.timestamp("us", tz="UTC"))
        (tmp_path / name).mkdir()
        pq.write_table(pa.table({"ts": t, "id": range(12), "a": [k % 2 for k in range(12)]}),
                       tmp_path / name / "part-0.parquet")
    srcs = {n: str(tmp_path / n) for n in "RS"}
    local = adaptcq.run(PAIR, srcs, mode="retract")
    streams = {n: spark.readStream.schema(spark.read.parquet(p).schema).parquet(p)
               for n, p in srcs.items()}
    ctl = tmp_path / "end"
    ctl.mkdir()
    res = continuous_query(spark, PAIR, streams, mode="retract", partitions=2,
                           end_of_input=str(ctl))
    got = run_to_end(spark, res, "adaptcq_ts_exact", ctl)
    assert got.schema.field("_ts").type == pa.timestamp("us", tz="UTC")
    assert local.table.schema.field("_ts").type == pa.timestamp("us", tz="UTC")
    assert any(s == -1 for s in got.column("_sign").to_pylist())  # expiries: t + w
    assert rows(got) == rows(local.table)


def test_bad_engine_option_reaches_the_engine(spark, tmp_path, capsys):
    """--order and --tree are passed to every group's engine, not ignored: a bad one fails."""
    srcs = three_streams(tmp_path / "in")
    inputs = [f"--input={k}={v}" for k, v in srcs.items()]
    msg = error_of(capsys, cli("--sql", PQ, *inputs, "--output", str(tmp_path / "o"),
                               "--order", "X:S,T"))
    assert "X" in msg and "Traceback" not in msg
    with pytest.raises(AdaptcqError):
        run_files(spark, PQ, srcs, str(tmp_path / "ck"), None, executor="xjoin",
                  tree=("nonsense",))


def test_column_names_spark_cannot_tell_apart_are_refused_before_it_starts(spark, tmp_path):
    """A dotted name (a struct field to Spark) and names equal but for case (Spark
    resolves names case-insensitively) are refused naming the stream and the columns;
    the local runtime reads both."""
    from adaptcq.runtime.spark import _check_column_names
    _check_column_names("R", ["ts", "id", "a"])
    with pytest.raises(InputError, match=r"stream R: column 'p\.q' has a dot"):
        _check_column_names("R", ["ts", "p.q"])
    with pytest.raises(InputError, match="columns 'a' and 'A' differ only in case"):
        _check_column_names("R", ["ts", "a", "A"])
    pq.write_table(pa.table({"ts": [1.0], "id": [1], "a": [1], "A": [7]}), tmp_path / "r.parquet")
    pq.write_table(pa.table({"ts": [1.5], "id": [1], "a": [1]}), tmp_path / "s.parquet")
    srcs = {"R": str(tmp_path / "r.parquet"), "S": str(tmp_path / "s.parquet")}
    assert adaptcq.run(PAIR, srcs).table.num_rows == 1
    with pytest.raises(InputError, match="differ only in case"):
        run_files(spark, PAIR, srcs, str(tmp_path / "ck"), str(tmp_path / "out"))


def test_signs_times_and_key_types_spark_read_otherwise_match_local(spark, tmp_path):
    """Found by fuzzing Spark against the local runtime: a sign of 1.5 (truncated to 1 by
    a cast) is refused naming the row; a Parquet uint64 time (Spark's DECIMAL(20, 0),
    which went through a double) is exact to the nanosecond; a timestamp joined with a
    date is refused as locally (it once ran the vectorized executor, which refused it in
    the groups; then, as locally, MJoin, which found nothing)."""
    b = 1_700_000_000_000_000_000
    for name, off in (("r", 1), ("s", 2)):
        pq.write_table(pa.table({"ts": pa.array([b + off, b + off + 1000], pa.uint64()),
                                 "id": [1, 2], "a": [1, 1]}), tmp_path / f"{name}.parquet")
    srcs = {"R": str(tmp_path / "r.parquet"), "S": str(tmp_path / "s.parquet")}
    sql0 = PAIR.replace("1 SECONDS", "0 SECONDS")
    local = adaptcq.run(sql0, srcs, mode="retract", timestamp_unit="ns")
    got = run_files(spark, sql0, srcs, str(tmp_path / "ck"), str(tmp_path / "out"),
                    mode="retract", timestamp_unit="ns")
    assert local.table.num_rows == 0 and got.results == 0  # (as a double: 3 rows)

    pq.write_table(pa.table({"ts": [1.0, 2.0], "id": [1, 2], "a": [1, 2], "sg": [1.0, 1.5]}),
                   tmp_path / "rs.parquet")
    pq.write_table(pa.table({"ts": [1.5, 2.5], "id": [1, 2], "a": [1, 2], "sg": [1.0, 1.0]}),
                   tmp_path / "ss.parquet")
    signed = {"R": str(tmp_path / "rs.parquet"), "S": str(tmp_path / "ss.parquet")}
    plain = "SELECT R.id AS rid, S.id AS sid FROM R, S WHERE R.a = S.a"
    with pytest.raises(InputError, match="row 1 has a sign other than"):
        run_files(spark, plain, signed, str(tmp_path / "ck2"), str(tmp_path / "out2"),
                  mode="retract", sign="sg")
    # The sign column is no column of the stream: SELECT * leaves it out (it took it in,
    # and every deletion was rejected), and a query naming it is refused, as locally.
    pq.write_table(pa.table({"ts": [1.0, 1.0, 3.0], "id": [1, 1, 3], "a": [1, 1, 1],
                             "sg": [1, -1, 1]}), tmp_path / "rs.parquet")
    star = "SELECT * FROM R, S WHERE R.a = S.a"
    local = adaptcq.run(star, signed, mode="retract", sign="sg")
    got = run_files(spark, star, signed, str(tmp_path / "ck4"), str(tmp_path / "out4"),
                    mode="retract", sign="sg")
    assert got.rejected == local.stats["rejected"] == 0
    assert rows(pq.read_table(tmp_path / "out4")) == rows(local.table)
    assert local.table.num_rows == 1 and "sg" not in local.table.column_names
    with pytest.raises(QueryError, match="is the sign column"):
        run_files(spark, "SELECT R.sg FROM R, S WHERE R.a = S.a", signed,
                  str(tmp_path / "ck5"), str(tmp_path / "out5"), sign="sg")

    import datetime as dt
    day = dt.datetime(2024, 1, 1)
    pq.write_table(pa.table({"ts": [1.0, 2.0], "id": [1, 2], "a": pa.array(
        [day, day + dt.timedelta(days=1)], pa.timestamp("us"))}), tmp_path / "rt.parquet")
    pq.write_table(pa.table({"ts": [1.5, 2.5], "id": [1, 2], "a": pa.array(
        [dt.date(2024, 1, 1), dt.date(2024, 1, 2)], pa.date32())}), tmp_path / "sd.parquet")
    mixed = {"R": str(tmp_path / "rt.parquet"), "S": str(tmp_path / "sd.parquet")}
    for run in (lambda: run_files(spark, PAIR, mixed, str(tmp_path / "ck3"),
                                  str(tmp_path / "out3")),
                lambda: adaptcq.run(PAIR, mixed)):  # refused as locally, before any row
        with pytest.raises(QueryError, match="a date never equals a timestamp"):
            run()


def test_select_arithmetic_is_typed_as_locally(spark, tmp_path):
    """Spark typed SELECT arithmetic with its own rules: int32 + int32 stayed int32, so a
    sum past 2^31 failed in the groups' Arrow conversion, int8 + 1 came out int32, and
    decimal arithmetic, which the local runtime refuses, ran or crashed (found by
    fuzzing). The expressions now get the local types: int64, and decimals refused."""
    for s, col in (("R", "a"), ("S", "c")):
        t = pa.table({"ts": pa.array([0, 1], pa.int64()), "k": pa.array([1, 1], pa.int32()),
                      col: pa.array([3, 2_000_000_000], pa.int32()),
                      "b": pa.array([5, 100], pa.int8()),
                      "m": pa.array([1, 2], pa.decimal128(5, 2))})
        pq.write_table(t, tmp_path / f"{s}.parquet")
    src = {s: str(tmp_path / f"{s}.parquet") for s in "RS"}
    sql = ("SELECT R.a + S.c AS x, R.b + 1 AS y FROM R [RANGE 5 SECONDS], S [RANGE 5 SECONDS] "
           "WHERE R.k = S.k")
    want = adaptcq.run(sql, src).table
    run_files(spark, sql, src, str(tmp_path / "ck"), str(tmp_path / "out"), partitions=2)
    got = pq.read_table(tmp_path / "out")
    assert got.schema.field("x").type == got.schema.field("y").type == pa.int64()
    assert sorted(got.column("x").to_pylist()) == sorted(want.column("x").to_pylist()) == \
        [6, 2_000_000_003, 2_000_000_003, 4_000_000_000]
    with pytest.raises(QueryError, match="arithmetic on the decimal value R.m"):
        run_files(spark, "SELECT R.m * 2 AS m2 FROM R, S WHERE R.k = S.k", src,
                  str(tmp_path / "ck2"), str(tmp_path / "out2"))
