"""The command line's option values, checked before any work (a tester's findings): where
--summary-json may go (not over an input, another output or a folder; `-` for stdout),
finite-but-huge numbers refused in one line instead of a traceback, a single-valued option
given twice, empty values, --spill-sample with a strategy that samples nothing, the
workload generator's options, a query set's --output, trailing comments after the query,
and the wording of a few refusals."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from adaptcq.adapt.spilling import parse_bytes
from adaptcq.cli import build_parser, main
from adaptcq.cliargs import _StoreOnce
from adaptcq.errors import OptionError, QueryError
from adaptcq.query.cql import parse_query
from adaptcq.stats.partitions import MAX_PARTITIONS, PartitionStatistics

SQL = ("SELECT R.a AS ra, S.c AS sc FROM R [RANGE 2 SECONDS], S [RANGE 2 SECONDS] "
       "WHERE R.a = S.a")


@pytest.fixture
def d(tmp_path, monkeypatch):
    """Two small inputs and the query in a file, in the current folder."""
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(1)
    n = 200
    for s in "RS":
        pq.write_table(pa.table({"ts": np.sort(rng.integers(0, 400, n)) / 10.0,
                                 "a": rng.integers(0, 20, n), "c": rng.integers(0, 5, n)}),
                       tmp_path / f"{s}.parquet")
    (tmp_path / "q.sql").write_text(SQL + "\n")
    return tmp_path


INPUTS = ["--input", "R=R.parquet", "--input", "S=S.parquet"]


def run(*extra) -> list[str]:
    return ["run", "--sql", "@q.sql", *INPUTS, "--no-progress", *map(str, extra)]


def code_of(argv) -> int:
    try:
        return main(argv)
    except SystemExit as e:  # argparse's usage errors (Parser.error)
        return e.code


def error_of(capsys, argv) -> str:
    """The one error line of a refused command (exit code 1, no traceback)."""
    assert code_of(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


# ----- 1. --summary-json ------------------------------------------------------------------------

@pytest.mark.parametrize("target", ["R.parquet", "q.sql", "."])
def test_summary_json_never_overwrites_an_input(d, capsys, target):
    before = {p: (d / p).read_bytes() for p in ("R.parquet", "q.sql")}
    msg = error_of(capsys, run("--summary-json", target, "--output", "o.parquet"))
    assert msg.startswith(f"adaptcq: error: --summary-json {target!r} is the input ")
    assert "writing there would destroy the input" in msg
    assert {p: (d / p).read_bytes() for p in before} == before
    assert not (d / "o.parquet").exists()  # refused before any work


@pytest.mark.parametrize(("extra", "what"), [
    (["--output", "o.parquet"], "--output 'o.parquet'"),
    (["--output", "o.parquet", "--rejected", "s.json"], "--rejected 's.json'"),
    (["--output", "o.parquet"], "the rejected rows' file (--rejected's default)"),
    (["--executor", "tree", "--spill", "global-output", "--memory", "1MB", "--cleanup", "off",
      "--spill-dir", "sp", "--output", "o.parquet"], "--spill-dir 'sp'"),
])
def test_summary_json_is_not_another_output(d, capsys, extra, what):
    target = {"--output 'o.parquet'": "o.parquet", "--rejected 's.json'": "s.json",
              "--spill-dir 'sp'": "sp/s.json"}.get(what, "o.rejected.parquet")
    msg = error_of(capsys, run(*extra, "--summary-json", target))
    assert msg.startswith(f"adaptcq: error: --summary-json {target!r} is {what}")
    assert not (d / "o.parquet").exists()


def test_summary_json_folder_is_refused_before_the_run(d, capsys):
    (d / "sub").mkdir()
    msg = error_of(capsys, run("--summary-json", "sub", "--output", "o.parquet"))
    assert msg == ("adaptcq: error: --summary-json 'sub' is a folder; give a file name, e.g. "
                   "'sub/summary.json'")
    assert not (d / "o.parquet").exists()


def test_summary_json_folder_is_made_and_the_file_written(d, capsys):
    assert code_of(run("--summary-json", "new/s.json", "--output", "o.parquet")) == 0
    assert json.loads((d / "new" / "s.json").read_text())["arrivals"] == 400


def test_summary_json_dash_is_stdout(d, capsys):
    assert code_of(run("--summary-json", "-", "--output", "o.csv")) == 0
    out, err = capsys.readouterr()
    doc = json.loads(out)  # stdout holds the JSON alone; messages went to stderr
    assert doc["arrivals"] == 400 and "run summary" in err
    assert not (d / "-").exists()
    # with the results on stdout, `-` is refused
    msg = error_of(capsys, run("--summary-json", "-", "--output", "-"))
    assert msg == ("adaptcq: error: --summary-json -: stdout carries the results "
                   "(--output -); give --summary-json a file")


def test_summary_json_dash_on_spark_is_refused_before_spark_starts(d, capsys):
    msg = error_of(capsys, run("--engine", "spark", "--output", "o", "--summary-json", "-"))
    assert msg.startswith("adaptcq: error: --summary-json - (stdout) is not supported with "
                          "--engine spark")


def test_query_set_summary_json_is_checked(d, capsys):
    qs = ["run", "--executor", "eddy", "--sql", "@q.sql", *INPUTS]
    msg = error_of(capsys, [*qs, "--output", "eo", "--summary-json", "S.parquet"])
    assert msg.startswith("adaptcq: error: --summary-json 'S.parquet' is the input")
    msg = error_of(capsys, [*qs, "--output", "eo", "--summary-json", "eo/s.json"])
    assert msg.startswith("adaptcq: error: --summary-json 'eo/s.json' is --output 'eo'")
    (d / "sub").mkdir()
    msg = error_of(capsys, [*qs, "--output", "eo", "--summary-json", "sub"])
    assert "is a folder" in msg
    assert not (d / "eo").exists()
    assert code_of([*qs, "--output", "eo", "--summary-json", "-"]) == 0
    assert json.loads(capsys.readouterr().out)["arrivals"] == 400
    assert not (d / "-").exists()


# ----- 2. finite but huge numbers ----------------------------------------------------------------

@pytest.mark.parametrize(("extra", "message"), [
    (["--executor", "vector", "--batch-seconds", "1e300"],
     "--batch-seconds 1e+300 s is longer than event times span"),
    (["--spill", "local-output", "--memory", "1MB", "--spill-partitions",
      "99999999999999999999999"],
     f"--spill-partitions must be a whole number from 1 to {MAX_PARTITIONS:,}"),
    (["--spill", "local-output", "--memory", "1MB", "--spill-partitions", "0"],
     "--spill-partitions must be a whole number from 1"),
    (["--spill", "local-output", "--memory", "inf"], "--memory 'inf': expected a size"),
    (["--spill", "local-output", "--memory", "infKB"], "--memory 'infKB': expected a size"),
    (["--spill", "local-output", "--memory", "nan"], "--memory 'nan': expected a size"),
    (["--spill", "local-output", "--memory", "0.4"], "--memory must be at least 1 byte"),
    (["--spill", "local-output", "--memory", "0"], "--memory must be at least 1 byte"),
    (["--spill", "local-output", "--memory", "1e30"], "--memory '1e30' is more than 2**63"),
    (["--spill", "local-output", "--memory", "8EiB"], "--memory '8EiB' is more than 2**63"),
])
def test_huge_numbers_are_refused_in_one_line(d, capsys, extra, message):
    msg = error_of(capsys, run(*extra, "--output", "o.parquet"))
    assert msg.startswith(f"adaptcq: error: {message}")


@pytest.mark.parametrize(("text", "value"), [
    ("1TB", 10**12), ("1TiB", 2**40), ("2tb", 2 * 10**12), ("1.5PB", 15 * 10**14),
    ("1PiB", 2**50), ("1EB", 10**18), ("3GB", 3 * 10**9), ("1e3k", 10**6), ("1.9", 1),
    ("512 MiB", 512 * 2**20)])
def test_memory_units_are_consistent(text, value):
    assert parse_bytes(text) == value


def test_a_terabyte_budget_runs(d):
    assert code_of(run("--spill", "local-output", "--memory", "1TB",
                       "--output", "o.parquet")) == 0


def test_partition_statistics_bound_their_size():
    with pytest.raises(OptionError, match="partitions per operator must be a whole number"):
        PartitionStatistics(2, 10**23)
    assert PartitionStatistics(1, 3).partitions == 3


# ----- 3. a single-valued option given twice ------------------------------------------------------

@pytest.mark.parametrize("twice", [
    ["--executor", "mjoin", "--executor", "xjoin"],
    ["--mode", "append", "--mode", "retract"],
    ["--output", "a.parquet", "--output", "b.parquet"],
    ["--max-results", "5", "--max-results", "9"],
    ["--timestamp", "ts", "--timestamp", "ts"],
    ["--format", "csv", "--format", "jsonl"],
    ["--summary-json", "a.json", "--summary-json", "b.json"],
    ["--executor=mjoin", "--executor", "xjoin"],   # --opt=value
    ["--exec", "mjoin", "--executor=xjoin"],        # a prefix argparse accepts
])
def test_a_repeated_option_is_refused(d, capsys, twice):
    flag = twice[-2] if twice[-2].startswith("--") else twice[-1].split("=")[0]
    msg = error_of(capsys, run(*twice))
    assert msg.startswith(f"adaptcq: error: {flag} is given twice (")
    assert msg.endswith("; give it once (see adaptcq run --help)")
    assert not any(d.glob("*.json")) and not (d / "a.parquet").exists()


def _value(action: argparse.Action) -> str:
    if action.choices:
        return str(next(iter(action.choices)))
    return "1" if action.type in (int, float) else "x"


def test_every_single_valued_option_of_every_command_is_guarded(capsys):
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    checked = 0
    for name, parser in sub.choices.items():
        for action in parser._actions:
            if not (isinstance(action, _StoreOnce) and action.option_strings):
                continue
            flag = action.option_strings[0]
            argv = [name, *(["x"] if name in ("workload", "cleanup", "bench") else []),
                    flag, _value(action), flag, _value(action)]
            with pytest.raises(SystemExit) as e:
                build_parser().parse_args(argv)
            assert e.value.code == 1
            assert f"{flag} is given twice" in capsys.readouterr().err
            checked += 1
    assert checked > 50


def test_explain_and_workload_refuse_repeats_too(d, capsys):
    msg = error_of(capsys, ["explain", "--sql", "@q.sql", *INPUTS, "--prefix", "5",
                            "--prefix=6"])
    assert msg.startswith("adaptcq: error: --prefix is given twice (5, then 6)")
    msg = error_of(capsys, ["workload", "three-way", "--out", "a", "--out", "b"])
    assert msg.startswith("adaptcq: error: --out is given twice (a, then b)")
    assert not (d / "a").exists() and not (d / "b").exists()


# ----- 4. empty values ----------------------------------------------------------------------------

@pytest.mark.parametrize(("flag", "extra"), [
    ("--tree", []), ("--summary-json", []), ("--spill-dir", []),
    ("--output", []), ("--rejected", ["--output", "o.parquet"]), ("--timestamp", []),
    ("--input", []), ("--sign", []),
])
def test_an_empty_value_is_refused_naming_the_option(d, capsys, flag, extra):
    for empty in ("", " "):
        msg = error_of(capsys, run(*extra, flag, empty))
        assert msg.startswith(f"adaptcq: error: {flag} {empty!r}: the value is empty; give ")
    assert not (d / "o.parquet").exists()


def test_sql_at_without_a_file_name(d, capsys):
    msg = error_of(capsys, ["run", "--sql", "@", *INPUTS])
    assert msg == ("adaptcq: error: --sql '@': give the query file's name after @, e.g. "
                   "--sql @query.sql")


# ----- 5. --spill-sample with a strategy that samples nothing --------------------------------------

@pytest.mark.parametrize(("strategy", "why"), [
    ("local-output", "counts each operator's own output"),
    ("bottom-up", "chooses partition groups at random")])
def test_spill_sample_needs_a_global_strategy(d, capsys, strategy, why):
    msg = error_of(capsys, run("--spill", strategy, "--memory", "1MB", "--spill-sample", "0.5",
                               "--output", "o.parquet"))
    assert msg == (f"adaptcq: error: --spill-sample: --spill {strategy} {why} and traces no "
                   "sample of results; the sample is for --spill global-output and "
                   "global-penalty")
    assert code_of(run("--spill", "global-output", "--memory", "1MB", "--spill-sample", "0.5",
                       "--output", "o.parquet")) == 0


# ----- 6. the workload generator's options ------------------------------------------------------

@pytest.mark.parametrize(("argv", "message"), [
    (["three-way", "--r", "0"], "r (multiplicity in T) must be an integer >= 1, got 0"),
    (["three-way", "--r", "-1"], "r (multiplicity in T) must be an integer >= 1, got -1"),
    (["three-way", "--point", "D3"], ("--point is for the table2 workload (its Table 2 "
                                      "point); three-way does not use it")),
    (["shed", "--point", "D3"], "--point is for the table2 workload"),
    (["nway", "--r", "4"], ("--r is for the three-way workload (the multiplicity of T); "
                            "nway does not use it")),
    (["table2", "--r", "4"], "--r is for the three-way workload"),
])
def test_workload_options_it_does_not_use_are_refused(d, capsys, argv, message):
    msg = error_of(capsys, ["workload", *argv, "--out", "w", "--n-updates", "60"])
    assert msg.startswith(f"adaptcq: error: {message}")
    assert not (d / "w").exists()


def test_workload_options_it_uses_still_work(d, capsys):
    assert code_of(["workload", "three-way", "--r", "2", "--out", "w", "--n-updates", "60"]) == 0
    assert json.loads((d / "w" / "params.json").read_text())["params"]["r"] == 2
    assert code_of(["workload", "table2", "--point", "D3", "--out", "t", "--n-updates",
                    "80"]) == 0
    assert "D3" in (d / "t" / "params.json").read_text()


# ----- 7. a query set's --output is a folder ------------------------------------------------------

@pytest.mark.parametrize("out", ["eo.csv", "eo.parquet", "eo.jsonl.gz"])
def test_query_set_output_with_a_file_suffix_is_refused(d, capsys, out):
    msg = error_of(capsys, ["run", "--executor", "eddy", "--sql", "@q.sql", *INPUTS,
                            "--output", out])
    assert msg.startswith(f"adaptcq: error: --output {out!r}: --executor eddy writes a folder "
                          "of Parquet files per query")
    assert not (d / out).exists()


# ----- 8. SQL text around the one statement ---------------------------------------------------

@pytest.mark.parametrize("text", [
    "SELECT R.id AS rid FROM R;\n-- end\n", "SELECT R.id AS rid FROM R; -- end",
    "SELECT R.id AS rid FROM R;;", "SELECT R.id AS rid FROM R; /* end */ ;\n",
    "-- the query\nSELECT R.id AS rid FROM R [RANGE 2 SECONDS];\n\n"])
def test_trailing_comments_and_empty_statements_are_accepted(text):
    assert [s.alias for s in parse_query(text).streams] == ["R"]


@pytest.mark.parametrize("text", ["-- nothing\n", "/* nothing */", ";", " ; ;\n"])
def test_comment_only_text_is_an_empty_query(text):
    with pytest.raises(QueryError) as info:
        parse_query(text)
    assert info.value.message == "the query is empty"


def test_a_second_statement_is_still_refused_at_its_semicolon():
    with pytest.raises(QueryError, match="only one statement is allowed") as info:
        parse_query("SELECT R.a FROM R;; -- x\nSELECT S.a FROM S")
    err = info.value
    assert err.sql[err.position:].startswith("; -- x")


def test_a_query_file_with_a_trailing_comment_runs(d):
    (d / "q.sql").write_text(SQL + ";\n-- end of the query\n")
    assert code_of(run("--output", "o.parquet")) == 0
    assert pq.read_table(d / "o.parquet").num_rows > 0


# ----- 9. the wording of a few refusals ----------------------------------------------------------

def test_cleanup_of_a_missing_folder_says_so(d, capsys):
    msg = error_of(capsys, ["cleanup", "nodir", "--output", "c.parquet"])
    assert msg == ("adaptcq: error: 'nodir' does not exist; give the --spill-dir of a run with "
                   "--cleanup off")
    msg = error_of(capsys, ["cleanup", "R.parquet", "--output", "c.parquet"])
    assert msg.startswith("adaptcq: error: 'R.parquet' is a file, not a spill folder")


@pytest.mark.parametrize(("executor", "tail"), [
    ("tree", " (it takes a plan of m-way operators: --tree)"), ("shed", ""),
    ("xjoin", " (it takes a tree of binary joins: --tree)")])
def test_order_names_the_executors_that_take_it(d, capsys, executor, tail):
    msg = error_of(capsys, run("--executor", executor, "--order", "R:S"))
    assert msg == ("adaptcq: error: --order sets MJoin pipelines, for --executor mjoin, "
                   f"acaching, vector or auto; not --executor {executor}{tail}")


@pytest.mark.parametrize("executor", ["tree", "shed", "xjoin"])
@pytest.mark.parametrize("flag", [["--optimizer", "fgreedy"], ["--reorder", "agreedy"]])
def test_adaptive_policies_name_acaching_too(d, capsys, executor, flag):
    msg = error_of(capsys, run("--executor", executor, *flag))
    assert msg == ("adaptcq: error: --optimizer and --reorder order MJoin pipelines; use them "
                   "with --executor mjoin or acaching (--optimizer also with vector or auto), "
                   f"not {executor}")


def test_the_python_api_and_spark_refuse_what_the_cli_does(tmp_path):
    """batch_seconds beyond int64 nanoseconds from Python (an OverflowError traceback);
    --engine spark --output o.csv (a folder named o.csv holding Parquet files)."""
    import adaptcq
    from adaptcq.errors import AdaptcqError
    from adaptcq.runtime.spark_cli import refuse_unsupported
    t = pa.table({"ts": [1, 2], "k": [1, 1]})
    with pytest.raises(OptionError, match="longer than event times span"):
        adaptcq.run("SELECT R.k FROM R, S WHERE R.k = S.k", {"R": t, "S": t},
                    executor="vector", batch_seconds=1e300)

    class Args:
        output = str(tmp_path / "o.csv")
        format = None
    with pytest.raises(AdaptcqError, match="writes a folder of Parquet files"):
        refuse_unsupported(Args())
