"""Query sets (CACQ, docs/cacq.md): an error in one of many `--sql` queries names it (the
option's position, the query id and its file) with the query's line and caret, locally and
on Spark; the Spark query set checks its queries, a static control, the checkpoint and the
output folders before Spark starts (no JVM: `get_spark` is never called); `seed` refused
with `routing="fixed"` by `adaptcq.Engine` as by the CLI (one check, `unused_seed`)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import adaptcq
from adaptcq.cli import main
from adaptcq.errors import OptionError, QueryError
from adaptcq.runtime.multi import named_errors, unused_seed

GOOD = "SELECT R.a FROM R"
SYNTAX = "SELECT R.a FROM R WHERE R.a >"
UNKNOWN = "SELECT R.a FROM R WHERE R.q > 1"


@pytest.fixture
def files(tmp_path):
    pq.write_table(pa.table({"ts": [1.0, 2.0], "a": [1, 2]}), tmp_path / "r.parquet")
    (tmp_path / "bad.sql").write_text(UNKNOWN + "\n")
    return tmp_path


def _error(capsys, argv) -> list[str]:
    assert main(argv) == 1
    return capsys.readouterr().err.rstrip("\n").splitlines()


def _local(d, *sql, extra=()):
    return ["run", "--executor", "eddy", *(a for s in sql for a in ("--sql", s)),
            "--input", f"R={d / 'r.parquet'}", "--output", str(d / "out"), *extra]


# ----- defect 2: which --sql is wrong --------------------------------------------------------

def test_inline_sql_error_names_the_option_and_query(files, capsys):
    err = _error(capsys, _local(files, GOOD, SYNTAX, f"@{files / 'bad.sql'}"))
    assert err[0].startswith("adaptcq: error: --sql #2 (query q2): syntax error")
    assert "(line 1, column 29)" in err[0]
    assert err[1:] == ["  " + SYNTAX, "  " + " " * 28 + "^"]   # the query and a caret
    assert not (files / "out").exists()                         # refused before any output


def test_file_sql_error_names_the_file(files, capsys):
    bad = files / "bad.sql"
    err = _error(capsys, _local(files, GOOD, GOOD, f"@{bad}"))
    assert err[0].startswith(f"adaptcq: error: --sql #3 (query q3, file {bad}): unknown "
                             "column 'q'")
    assert err[0].endswith("(line 1, column 25)")
    assert err[1:] == ["  " + UNKNOWN, "  " + " " * 24 + "^^^"]


def test_explain_names_the_wrong_sql_as_run_does(files, capsys):
    bad = files / "bad.sql"
    err = _error(capsys, ["explain", "--executor", "eddy", "--sql", GOOD, "--sql", f"@{bad}",
                          "--input", f"R={files / 'r.parquet'}"])
    assert err[0].startswith(f"adaptcq: error: --sql #2 (query q2, file {bad}): unknown "
                             "column 'q'")
    assert err[1:] == ["  " + UNKNOWN, "  " + " " * 24 + "^^^"]


def test_named_errors_keeps_class_text_and_position():
    with pytest.raises(QueryError) as ei, named_errors("--sql #4 (query q4)"):
        raise QueryError("bad", "SELECT x", 7, length=2)
    e = ei.value
    assert (e.message, e.sql, e.position, e.length) == ("--sql #4 (query q4): bad",
                                                        "SELECT x", 7, 2)
    with pytest.raises(OptionError, match=r"^where: nope$"), named_errors("where"):
        raise OptionError("nope")


def test_control_row_error_still_named_with_caret(files):
    e = adaptcq.Engine({"R": files / "r.parquet"}, "ts")
    with pytest.raises(QueryError) as ei:
        e.load_control([{"ts": None, "action": "register", "query_id": "ok", "sql": GOOD},
                        {"ts": None, "action": "register", "query_id": "b", "sql": UNKNOWN}])
    assert ei.value.message.startswith("control stream row 1 (query b): unknown column 'q'")
    assert ei.value.position == 24 and str(ei.value).endswith("^^^")


# ----- defects 2 and 3 on Spark: named, and before Spark starts -------------------------------

class SparkStarted(Exception):
    pass


@pytest.fixture
def no_spark(monkeypatch):
    """Any start of Spark raises SparkStarted (the tests need no JVM)."""
    pytest.importorskip("pyspark")
    import adaptcq.runtime.spark_session as session

    def get_spark(*a, **k):
        raise SparkStarted
    monkeypatch.setattr(session, "get_spark", get_spark)


def _spark(d, *sql, extra=()):
    return ["run", "--engine", "spark", "--executor", "eddy", "--master", "local[1]",
            *(a for s in sql for a in ("--sql", s)), "--input", f"R={d / 'r.parquet'}",
            "--output", str(d / "sp"), *extra]


def test_spark_sql_error_named_before_spark_starts(files, capsys, no_spark):
    bad = files / "bad.sql"
    err = _error(capsys, _spark(files, GOOD, f"@{bad}"))
    assert err[0].startswith(f"adaptcq: error: --sql #2 (query q2, file {bad}): unknown "
                             "column 'q'")
    assert err[1:] == ["  " + UNKNOWN, "  " + " " * 24 + "^^^"]
    err = _error(capsys, _spark(files, SYNTAX))
    assert err[0].startswith("adaptcq: error: --sql #1 (query q1): syntax error")


def test_spark_control_error_before_spark_starts(files, capsys, no_spark):
    pq.write_table(pa.Table.from_pylist(
        [{"ts": 1.0, "action": "register", "query_id": "ok", "sql": GOOD},
         {"ts": 1.5, "action": "register", "query_id": "bad2", "sql": SYNTAX}]),
        files / "ctl.parquet")
    err = _error(capsys, _spark(files, extra=["--queries", str(files / "ctl.parquet")]))
    assert err[0].startswith("adaptcq: error: control stream row 1 (query bad2): syntax error")


def test_spark_checkpoint_and_output_checked_before_spark_starts(files, capsys, no_spark):
    ck = files / "ck"
    ck.mkdir()
    (ck / "x.txt").write_text("mine")
    err = _error(capsys, _spark(files, GOOD, extra=["--checkpoint", str(ck)]))
    assert "is not empty and has no" in err[0]
    out = files / "sp"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    err = _error(capsys, _spark(files, GOOD))
    assert "is a folder that is not empty and was not written by adaptcq" in err[0]
    assert (out / "notes.txt").read_text() == "mine"


def test_spark_good_query_set_reaches_spark(files, no_spark):
    # The checks refuse nothing that runs: a good query set gets as far as starting Spark,
    # and the output folder is left as it was (only checked).
    with pytest.raises(SparkStarted):
        main(_spark(files, GOOD, "SELECT R.a FROM R WHERE R.a > 1"))
    assert not (files / "sp").exists()


# ----- defect 4: a seed fixed routing never uses ---------------------------------------------

@pytest.mark.parametrize("executor", ["eddy", "eddies"])
def test_engine_refuses_a_seed_with_fixed_routing(files, executor):
    with pytest.raises(OptionError, match=r"^seed=3: routing='fixed' routes in a priority "
                                          r"order and draws nothing at random"):
        adaptcq.Engine({"R": files / "r.parquet"}, "ts", executor=executor,
                       routing="fixed", seed=3)
    e = adaptcq.Engine({"R": files / "r.parquet"}, "ts", executor=executor, routing="fixed")
    h = e.register(GOOD)
    e.run()
    assert h.table().column("a").to_pylist() == [1, 2]


@pytest.mark.parametrize("routing", ["tickets", "lottery", "random"])
def test_seed_kept_for_the_policies_that_draw(routing):
    assert unused_seed(routing, 3) is None and unused_seed(routing, 3, cli=True) is None


def test_engine_and_cli_give_the_same_reason(files, capsys):
    engine = unused_seed("fixed", 2)
    cli = unused_seed("fixed", 2, cli=True)
    reason = "routes in a priority order and draws nothing at random"
    assert reason in engine and reason in cli
    err = _error(capsys, _local(files, GOOD, extra=["--routing", "fixed", "--seed", "2"]))
    assert err == [f"adaptcq: error: {cli}"]


def test_control_csv_reads_a_query_over_several_lines(tmp_path):
    """A quoted SQL field spanning lines in a CSV control stream, across pyarrow's 1 MB
    block (its default parse refused it: "Expected 4 columns, got 1"): read as the inputs
    are (``sources.csv_parse_options``)."""
    sql = "SELECT R.a\n" + ("-- " + "x" * 1000 + "\n") * 1100 + "FROM R\nWHERE R.a > 1"
    (tmp_path / "control.csv").write_text(f'ts,action,query_id,sql\n0,register,q1,"{sql}"\n')
    engine = adaptcq.Engine({"R": pa.table({"ts": [1.0, 2.0], "a": [1, 2]})}, "ts")
    engine.load_control(str(tmp_path / "control.csv"))
    engine.run()
    assert [h.table().column("a").to_pylist() for h in engine.handles.values()] == [[2]]
