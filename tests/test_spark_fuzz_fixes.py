"""The Spark runtime's fixes for a fuzzer's findings: ``continuous_query``'s
``end_of_input`` folder (made when absent, read literally), the summary's ``split`` block
(the rates the shares were chosen at, kept across restarts), ``--trigger`` and
``--max-files-per-trigger`` refused before Spark starts, and ``--rejected DIR/`` printed
once-slashed.

Tests marked by their ``spark`` fixture share the session's one local SparkSession and keep
their runs tiny; the others need no Spark."""

from __future__ import annotations

import json
import os
import warnings
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import adaptcq
from adaptcq.errors import OptionError
from conftest import run_to_end

JOIN2 = ("SELECT R.id AS rid, S.id AS sid FROM R [RANGE 10 SECONDS], S [RANGE 10 SECONDS] "
         "WHERE R.a = S.a")
CHAIN = ("SELECT R.id AS rid, S.id AS sid, T.id AS tid FROM R [RANGE 10 SECONDS], "
         "S [RANGE 10 SECONDS], T [RANGE 10 SECONDS] WHERE R.a = S.a AND S.b = T.b")


def _chain_inputs(root: Path, n_r: int = 40) -> dict[str, str]:
    """R holds n_r rows, S 4, T 5: unequal rates, so the shares (and the replication they
    give) depend on them. T's second file holds a row late by more than the allowed lateness
    (0): rejected by both runtimes when that file is a micro-batch of its own."""
    root.mkdir(parents=True, exist_ok=True)
    out = {}
    for name, n, cols in (("R", n_r, "a"), ("S", 4, "ab"), ("T", 4, "b")):
        rows = [{"ts": round((i + 1) * 8 / n, 3), **{c: i % 2 for c in cols}, "id": i}
                for i in range(n)]
        d = root / name
        d.mkdir()
        pq.write_table(pa.Table.from_pylist(rows), d / "part-0.parquet")
        if name == "T":
            pq.write_table(pa.Table.from_pylist([{"ts": 0.5, "b": 0, "id": n}]),
                           d / "part-1.parquet")
            # Spark's file source reads the oldest file first (docs/spark.md): a later
            # modification time, so that it reads them in the local runtime's order
            t = (d / "part-0.parquet").stat().st_mtime
            os.utime(d / "part-1.parquet", (t + 10, t + 10))
        out[name] = str(d)
    return out


def _pairs(table) -> Counter:
    return Counter(zip(table.column("rid").to_pylist(), table.column("sid").to_pylist(),
                       table.column("_sign").to_pylist(), strict=True))


# -- 1. continuous_query(end_of_input=...) ------------------------------------------------

def test_end_of_input_folder_is_made_and_read_literally(spark, tmp_path, monkeypatch):
    """docs/spark.md's recipe: ``end_of_input="eoi"`` (relative, not there yet; here with
    glob characters in its name) and ``signal_end`` after the last file. The folder is made,
    its name is not a pattern, and the results equal the local runtime's."""
    from adaptcq.runtime.spark import SplitWarning, continuous_query
    tables = {"R": pa.table({"ts": [1.0, 2.0, 3.0], "a": [1, 1, 2], "id": [0, 1, 2]}),
              "S": pa.table({"ts": [1.5, 2.5, 3.5], "a": [1, 2, 2], "id": [0, 1, 2]})}
    streams = {}
    for name, t in tables.items():
        (tmp_path / name).mkdir()
        pq.write_table(t, tmp_path / name / "p.parquet")
        streams[name] = spark.readStream.schema(spark.read.parquet(
            str(tmp_path / name)).schema).parquet(str(tmp_path / name))
    monkeypatch.chdir(tmp_path)
    eoi = "eo[i]{x}*"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SplitWarning)
        res = continuous_query(spark, JOIN2, streams, end_of_input=eoi)
    assert (tmp_path / eoi).is_dir()
    got = run_to_end(spark, res, "adaptcq_fuzz_eoi", eoi)
    want = adaptcq.run(JOIN2, tables).table
    assert want.num_rows == 4
    assert _pairs(got) == _pairs(want)


def test_end_of_input_that_is_a_file_is_refused(spark, tmp_path):
    from adaptcq.runtime.spark import continuous_query
    (tmp_path / "R").mkdir()
    pq.write_table(pa.table({"ts": [1.0], "a": [1], "id": [0]}), tmp_path / "R" / "p.parquet")
    r = spark.readStream.schema("ts double, a long, id long").parquet(str(tmp_path / "R"))
    marker = tmp_path / "eoi.txt"
    marker.write_text("end\n")
    with pytest.raises(OptionError, match=r"end_of_input .*eoi\.txt.* is a file, not a folder"):
        continuous_query(spark, JOIN2, {"R": r, "S": r}, partitions=1,
                         end_of_input=str(marker))


# -- 2. the summary's split: at the rates the shares were chosen for ----------------------

def test_summary_split_is_at_the_input_row_counts_and_kept_on_restart(spark, tmp_path,
                                                                       capsys):
    """The shares are chosen at the inputs' row counts (R 40, S 4, T 5); the summary's
    ``split`` block describes them at those rates, as ``explain`` does, and its replication
    is the rows actually shipped per input row. A restart keeps the first run's rates (its
    shares) although its inputs now hold more rows. Also: ``--rejected DIR/`` is printed
    with one '/'."""
    from adaptcq.cli import main
    from adaptcq.runtime.spark import prepare_files
    srcs = _chain_inputs(tmp_path / "in")
    out, rej, ck, js = (tmp_path / "out", tmp_path / "rej", tmp_path / "ck",
                        tmp_path / "s.json")
    argv = ["run", "--engine", "spark", "--master", "local[1]", "--partitions", "4",
            "--sql", CHAIN, *[f"--input={k}={v}" for k, v in srcs.items()],
            "--output", str(out), "--rejected", f"{rej}/", "--checkpoint", str(ck),
            "--summary-json", str(js), "--max-files-per-trigger", "1"]
    # (the CLI sets the shared session's shuffle partitions to its master's cores: put
    # them back for the tests that follow)
    shuffle = spark.conf.get("spark.sql.shuffle.partitions")
    try:
        assert main(argv) == 0
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", shuffle)
    console = capsys.readouterr().out
    assert f"rejected rows to {rej}/ (Parquet)" in console.replace("\n", ""), console
    assert "//" not in console
    s = json.loads(js.read_text())
    split = s["split"]
    assert split["rates"] == {"R": 40.0, "S": 4.0, "T": 5.0}
    assert split["shares"] == {"R.a = S.a": 4, "S.b = T.b": 1}
    # R and S hashed on a, T (no a) sent to all 4 groups: (40 + 4 + 5*4) / 49
    assert split["replication"] == pytest.approx(64 / 49)
    assert s["rows_shipped"] / s["input_rows"] == pytest.approx(split["replication"])

    pq.write_table(pq.read_table(Path(srcs["S"]) / "part-0.parquet"),
                   Path(srcs["S"]) / "part-1.parquet")  # more S rows: other rates now
    job = prepare_files(CHAIN, srcs, ck, str(out), str(rej), partitions=4)
    assert not job.fresh
    assert job.rates == {"R": 40.0, "S": 4.0, "T": 5.0}
    assert job.shares == {"R.a = S.a": 4, "S.b = T.b": 1}


def test_given_shares_are_described_at_the_input_row_counts(tmp_path):
    """``--shares`` fixes the shares; the split they describe is at the rows the inputs
    hold (not at equal rates). No Spark: ``prepare_files`` measures them."""
    from adaptcq.runtime.spark import prepare_files
    srcs = _chain_inputs(tmp_path / "in")
    job = prepare_files(CHAIN, srcs, tmp_path / "ck", str(tmp_path / "out"),
                        shares={"S.b": 2})
    assert job.rates == {"R": 40.0, "S": 4.0, "T": 5.0}
    assert job.fingerprint["rates"] == job.rates


# -- 3. --trigger and --max-files-per-trigger, before Spark starts -------------------------

@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--trigger", "0", "--trigger must be a positive number of seconds, got 0.0"),
    ("--trigger", "inf", "--trigger must be a positive number of seconds, got inf"),
    ("--max-files-per-trigger", "0",
     "--max-files-per-trigger must be a whole number >= 1, got 0"),
])
def test_trigger_options_are_refused_before_spark_starts(tmp_path, capsys, monkeypatch, flag,
                                                         value, message):
    from adaptcq.cli import main
    from adaptcq.runtime import spark_session

    def no_spark(*a, **k):
        raise AssertionError("Spark was started before the refusal")
    monkeypatch.setattr(spark_session, "get_spark", no_spark)
    srcs = _chain_inputs(tmp_path / "in")
    argv = ["run", "--engine", "spark", "--master", "local[1]", "--sql", CHAIN,
            *[f"--input={k}={v}" for k, v in srcs.items()], "--output",
            str(tmp_path / "out"), "--checkpoint", str(tmp_path / "ck"), flag, value]
    assert main(argv) == 1
    err = capsys.readouterr()
    assert message in err.out + err.err
    assert not (tmp_path / "ck").exists() and not (tmp_path / "out").exists()


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"trigger": 0}, "--trigger must be a positive number of seconds, got 0"),
    ({"trigger": "1"}, "--trigger must be a positive number of seconds, got '1'"),
    ({"trigger": True}, "--trigger must be a positive number of seconds, got True"),
    ({"max_files_per_trigger": 1.0}, "--max-files-per-trigger must be a whole number >= 1"),
])
def test_run_files_refuses_trigger_options_before_it_checks_or_writes(tmp_path, kwargs,
                                                                      message):
    """``run_files`` (no session needed to get the refusal) refuses them first, with the
    CLI's message, and writes nothing."""
    from adaptcq.runtime.spark import run_files
    srcs = _chain_inputs(tmp_path / "in")
    with pytest.raises(OptionError, match=message.replace("(", r"\(")):
        run_files(None, CHAIN, srcs, str(tmp_path / "ck"), str(tmp_path / "out"), **kwargs)
    assert not (tmp_path / "ck").exists()
