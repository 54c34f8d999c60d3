"""The Spark runtime does what docs/spark.md says of four options: ``--shares`` on the
command line, ``--optimizer`` when ``--executor auto`` falls back to MJoin, the operator
tree's ``_late`` column, and an adaptcq error raised in a worker keeping its class.

Tests marked by their ``spark`` fixture share the session's one local SparkSession and keep
their runs tiny; the others need no Spark."""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import adaptcq
from adaptcq.errors import AdaptcqError

CHAIN = ("SELECT R.id AS r, S.id AS s, T.id AS t FROM R [RANGE 1 SECONDS], "
         "S [RANGE 1 SECONDS], T [RANGE 2 SECONDS] WHERE R.a = S.a AND S.b = T.b")
# A SELECT expression: --executor auto cannot vectorize it and falls back to MJoin.
EXPRESSION = ("SELECT R.id AS r, S.id + 1 AS s FROM R [RANGE 1 SECONDS], "
              "S [RANGE 1 SECONDS] WHERE R.a = S.a")
EXPRESSION3 = CHAIN.replace("S.id AS s", "S.id + 1 AS s")
KINDS = {"ts": "number", "id": "number", "a": "number", "b": "number"}


def _inputs(root: Path, names: str = "RST", n: int = 40, seed: int = 0) -> dict[str, str]:
    """One Parquet file per stream, in a folder of its own: timestamp ties, few keys."""
    rng = np.random.default_rng(seed)
    out = {}
    for k, name in enumerate(names):
        d = root / name
        d.mkdir(parents=True)
        pq.write_table(pa.table({
            "ts": np.sort(np.round(rng.uniform(0, 3, n), 1)),
            "id": np.arange(n) + 100 * k, "a": rng.integers(0, 3, n),
            "b": rng.integers(0, 3, n)}), d / "p0.parquet")
        out[name] = str(d)
    return out


def _rows(table: pa.Table) -> Counter:
    cols = []
    for c in table.column_names:
        vals = table.column(c).to_pylist()
        if c == "_ts" and pa.types.is_floating(table.schema.field(c).type):
            vals = [round(v, 9) for v in vals]
        cols.append(vals)
    return Counter(zip(*cols, strict=True))


def _assert_same(local: pa.Table, out) -> None:
    spark = pq.read_table(out)
    assert spark.schema.names == local.schema.names
    a, b = _rows(local), _rows(spark)
    assert sum(a.values()) > 0, "the workload should produce results"
    assert a == b, f"local {sum(a.values())} rows, spark {sum(b.values())}"


def _cli(sql: str, srcs: dict, out: Path, *flags: str) -> list[str]:
    return ["run", "--engine", "spark", "--master", "local[2]", "--sql", sql,
            *[f"--input={k}={v}" for k, v in srcs.items()], "--output", str(out),
            "--no-progress", *flags]


# ----- finding 01: --shares on the command line ----------------------------------------------

def test_refuse_unsupported_accepts_shares_and_shows_a_refused_list_as_typed():
    """--shares is a Spark option (not refused); a refused repeatable flag is named as the
    command line gave it, not as a Python list."""
    from adaptcq.cliargs import run_defaults
    from adaptcq.runtime.spark_cli import refuse_unsupported
    args = argparse.Namespace(**{d: default for d, (_, default) in run_defaults().items()})
    args.shares = ["S.b=2"]
    refuse_unsupported(args)
    args.routing_option = ["a=1", "b=2"]
    with pytest.raises(AdaptcqError) as e:
        refuse_unsupported(args)
    assert str(e.value).startswith("--routing-option a=1 --routing-option b=2 is not "
                                   "supported with --engine spark yet"), str(e.value)


def test_cli_shares_reach_prepare_files(tmp_path, monkeypatch):
    """`adaptcq run --engine spark --shares S.b=2` hands the shares to prepare_files, with
    no --partitions (their product is P); stopped there, before Spark starts."""
    from adaptcq.cli import main
    from adaptcq.runtime import spark_cli

    class Stop(Exception):
        pass
    seen = {}

    def fake(*args, **kwargs):
        seen.update(args=args, kwargs=kwargs)
        raise Stop
    monkeypatch.setattr(spark_cli, "prepare_files", fake)
    srcs = _inputs(tmp_path / "in")
    with pytest.raises(Stop):
        main(_cli(CHAIN, srcs, tmp_path / "out", "--shares", "S.b=2", "--shares", "R.a=1"))
    assert seen["kwargs"]["shares"] == {"S.b": 2, "R.a": 1}
    assert seen["args"][8] == 1  # partitions: none given, the shares make P
    # An explicit --partitions 1 that the shares do not make is refused (it was taken as
    # "not given": 2 groups ran; found in review).
    assert main(_cli(CHAIN, srcs, tmp_path / "out", "--shares", "S.b=2",
                     "--partitions", "1")) == 1


def test_cli_shares_run_as_given(spark, tmp_path):
    """The run with the given shares: two partition groups, S.b's class split in two, the
    local runtime's results."""
    from adaptcq.cli import main
    srcs = _inputs(tmp_path / "in")
    out, summary = tmp_path / "out", tmp_path / "summary.json"
    assert main(_cli(CHAIN, srcs, out, "--shares", "S.b=2",
                     "--summary-json", str(summary))) == 0
    doc = json.loads(summary.read_text())
    assert doc["split"]["shares"] == {"R.a = S.a": 1, "S.b = T.b": 2}
    assert doc["partition_groups"] == 2
    _assert_same(adaptcq.run(CHAIN, srcs).table, out)


# ----- finding 02: --optimizer when --executor auto falls back to MJoin ----------------------

@pytest.mark.parametrize(("sql", "options"), [
    (EXPRESSION, {}), (CHAIN, {"nested_loop": ["S"]})])
def test_ordering_becomes_the_optimizer_policy_when_auto_falls_back(sql, options):
    """As the local runtime does (``LocalRun``): auto's fallback to MJoin runs the
    per-batch ordering's algorithm as MJoin's optimizer policy; never dropped."""
    from adaptcq.query.cql import parse_query
    from adaptcq.runtime.spark import _vector_choice
    query = parse_query(sql, {n: KINDS for n in "RST"})
    executor, opts, spec = _vector_choice("auto", query, None,
                                          {**options, "ordering": "fgreedy"})
    assert executor == "mjoin"
    assert "ordering" not in opts
    assert spec == {"optimizer": "fgreedy", "reorder": "off", "caching": None}
    # vectorized: the ordering stays the executor's own, with no policy
    plain = parse_query(CHAIN, {n: KINDS for n in "RST"})
    executor, opts, spec = _vector_choice("auto", plain, None, {"ordering": "fgreedy"})
    assert (executor, opts, spec) == ("vector", {"ordering": "fgreedy"}, None)


def test_cli_optimizer_runs_in_every_group_when_auto_falls_back(spark, tmp_path, capsys):
    """`--optimizer fgreedy` on a query auto runs on MJoin (a SELECT expression): every
    partition group runs the optimizer (summary and --summary-json), results as locally."""
    from adaptcq.cli import main
    srcs = _inputs(tmp_path / "in", "RST")  # (three streams: on two it orders nothing)
    out, summary = tmp_path / "out", tmp_path / "summary.json"
    assert main(_cli(EXPRESSION3, srcs, out, "--optimizer", "fgreedy", "--partitions", "2",
                     "--summary-json", str(summary))) == 0
    console = capsys.readouterr().out
    doc = json.loads(summary.read_text())
    assert doc["adaptivity"]["optimizer"] == "fgreedy"
    assert len(doc["groups"]) == 2
    for g in doc["groups"]:
        assert g["policies"]["optimizer"] == "fgreedy", g.get("policies")
    assert "initial plan by fgreedy" in console
    _assert_same(adaptcq.run(EXPRESSION3, srcs).table, out)


# ----- finding 03: the operator tree's _late column ------------------------------------------

def test_tree_executor_output_has_the_local_columns(spark, tmp_path):
    """--executor tree without spilling: the output has the local runtime's columns and
    types, ``_late`` (bool, all false) included, and its rows."""
    from adaptcq.runtime.spark import run_files
    srcs = _inputs(tmp_path / "in", "RS")
    sql = "SELECT R.id AS r, S.id AS s FROM R [RANGE 1 SECONDS], S [RANGE 1 SECONDS] " \
          "WHERE R.a = S.a"
    local = adaptcq.run(sql, srcs, executor="tree").table
    out = tmp_path / "out"
    run_files(spark, sql, srcs, str(tmp_path / "ck"), str(out), executor="tree",
              partitions=2)
    got = pq.read_table(out)
    assert got.schema.remove_metadata() == local.schema.remove_metadata()
    assert local.schema.names[-1] == "_late"
    assert not any(got.column("_late").to_pylist())
    _assert_same(local, out)


# ----- finding 05: an adaptcq error from a worker keeps its class ----------------------------

def _worker_failure(last: str) -> Exception:
    """A streaming query's failure as Spark reports a Python worker's exception: a JVM
    exception wrapping the traceback, an earlier exception's context printed first."""
    return Exception(
        "[STREAM_FAILED] Query [id = 1] terminated with exception: "
        "org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
        '  File "/x/adaptcq/runtime/spark_group.py", line 1, in step\n'
        "adaptcq.errors.InputError: the context, printed first\n\n"
        "During handling of the above exception, another exception occurred:\n\n"
        "Traceback (most recent call last):\n"
        '  File "/x/adaptcq/adapt/spilling.py", line 190, in check\n'
        f"{last}\n\tat org.apache.spark.api.python.BasePythonRunner.handle(X.scala:1)\n")


@pytest.mark.parametrize(("module", "name"), [
    ("adaptcq.state.spill_store", "SpillError"), ("adaptcq.query.udf", "UDFError"),
    ("adaptcq.optimizer.graph", "OptimizerError"),
    ("adaptcq.engine.grouped_filter", "FilterError"),
    ("adaptcq.stream.workloads", "WorkloadError"), ("adaptcq.errors", "OptionError")])
def test_spark_error_keeps_the_class_of_any_adaptcq_module(module, name):
    import importlib

    from adaptcq.runtime.spark import spark_error
    err = spark_error(_worker_failure(f"{module}.{name}: the budget is too small: x.y: z"))
    assert type(err) is getattr(importlib.import_module(module), name)
    assert str(err) == "the budget is too small: x.y: z"


@pytest.mark.parametrize("last", [
    "adaptcq.query.expr.ExprError: not an AdaptcqError",  # a ValueError of adaptcq
    "adaptcq.no_such_module.SomeError: no such module",
    "adaptcq.errors.NoSuchError: no such class"])
def test_spark_error_names_other_exceptions_in_full(last):
    """An exception that is no AdaptcqError of an adaptcq module keeps its full name (the
    earlier InputError in the traceback is only its context)."""
    from adaptcq.runtime.spark import spark_error
    err = spark_error(_worker_failure(last))
    assert type(err) is AdaptcqError
    assert str(err) == f"the Spark query failed: {last}"


def test_summary_json_names_the_executor_that_ran(tmp_path):
    """--summary-json said "auto" where the local summary names what ran (found in review)."""
    from adaptcq.runtime.spark import SparkRun
    from adaptcq.runtime.spark_cli import _write_summary_json
    path = tmp_path / "s.json"
    _write_summary_json(str(path), SparkRun(executor="vector"), "auto", "append", "local[1]")
    assert json.loads(path.read_text())["executor"] == "vector"
