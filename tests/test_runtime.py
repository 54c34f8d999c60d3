"""The local runtime and the command line: sources, ordering, lateness, output, errors."""

from __future__ import annotations

import datetime as dt
import warnings
from collections import Counter

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import adaptcq
from adaptcq.cli import main
from adaptcq.errors import InputError, OptionError, QueryError
from adaptcq.runtime.local import prepare
from oracle import Oracle

SQL3 = ("SELECT R.id AS rid, S.id AS sid, T.id AS tid FROM R [RANGE 2 SECONDS], "
        "S [RANGE 2 SECONDS], T [RANGE 2 SECONDS] WHERE R.a = S.a AND S.b = T.b")


def frames(seed=0, n=60):
    rng = np.random.default_rng(seed)
    mk = lambda cols: pd.DataFrame(
        {"ts": np.sort(rng.integers(0, 20, n)).astype(float), "id": np.arange(n),
         **{c: rng.integers(0, 4, n) for c in cols}})
    return {"R": mk("a"), "S": mk("ab"), "T": mk("b")}


def rows_of(table: pa.Table) -> Counter:
    return Counter(zip(*[table.column(c).to_pylist() for c in table.column_names]))


def oracle_rows(sql, sources, mode, **kw) -> Counter:
    """The oracle on the runtime's merged arrivals (int64 ns), its _ts back in seconds."""
    p = prepare(sql, sources, "ts", **kw)
    _, outs = Oracle(p.query, mode, 1e-9).run(
        p.streams.tolist(), None if p.signs is None else p.signs.tolist(),
        p.timestamps.tolist(), p.rows)
    total = Counter()
    for c in outs:
        for (*vals, sign, ts), n in c.items():
            total[(*vals, sign, ts / 1e9)] += n  # exact: int ns to the nearest float
    return total


@pytest.mark.parametrize("mode", ["append", "retract"])
@pytest.mark.parametrize("executor", ["mjoin", "xjoin"])
def test_run_equals_oracle_on_dataframes(mode, executor):
    src = frames()
    res = adaptcq.run(SQL3, src, timestamp="ts", executor=executor, mode=mode)
    assert res.table.column_names == ["rid", "sid", "tid", "_sign", "_ts"]
    assert res.table.schema.field("_sign").type == pa.int8()
    assert rows_of(res.table) == oracle_rows(SQL3, src, mode)
    assert res.stats["results"] == res.table.num_rows > 0
    assert res.stats["updates"] == res.stats["insertions"] + res.stats["deletions"]


def test_sources_of_every_kind_give_the_same_output(tmp_path):
    src = frames(1)
    pq.write_table(pa.Table.from_pandas(src["R"]), tmp_path / "r.parquet")
    src["S"].to_csv(tmp_path / "s.csv", index=False)
    kinds = {"R": str(tmp_path / "r.parquet"), "S": tmp_path / "s.csv",
             "T": src["T"].to_dict("records")}
    a = adaptcq.run(SQL3, src, mode="retract")
    b = adaptcq.run(SQL3, kinds, mode="retract")
    assert rows_of(a.table) == rows_of(b.table)


def test_timestamp_columns_and_timestamp_selections():
    base = dt.datetime(2024, 1, 1)
    r = pa.table({"ts": pa.array([base + dt.timedelta(seconds=s) for s in (0, 1, 5)],
                                 pa.timestamp("us", tz="UTC")), "a": [1, 1, 1], "id": [0, 1, 2]})
    s = pa.table({"ts": pa.array([base + dt.timedelta(seconds=s) for s in (1, 2)],
                                 pa.timestamp("us", tz="UTC")), "a": [1, 1], "id": [10, 11]})
    sql = ("SELECT R.id AS rid, S.id AS sid FROM R [RANGE 1 SECONDS], S [RANGE 1 SECONDS] "
           "WHERE R.a = S.a AND R.ts >= '2024-01-01 00:00:01'")
    res = adaptcq.run(sql, {"R": r, "S": s}, mode="append")
    # R0 is filtered out; R1 (t=1) joins S0 (t=1) and S1 (t=2, |Δ| = 1 s, inclusive).
    assert sorted(res.table.column("sid").to_pylist()) == [10, 11]
    assert pa.types.is_timestamp(res.table.schema.field("_ts").type)
    assert res.table.column("_ts").to_pylist()[0].replace(tzinfo=None) == base + \
        dt.timedelta(seconds=1)


def test_window_boundary_is_inclusive():
    """|Δts| = w joins; |Δts| > w does not (Window docstring), also where float seconds
    would round wrongly (508.138 + 10.0 < 518.138 in binary floating point)."""
    r = pd.DataFrame({"ts": [0.0, 0.0, 508.138], "a": [1, 2, 3], "id": [0, 1, 2]})
    s = pd.DataFrame({"ts": [10.0, 10.5, 518.138], "a": [1, 2, 3], "id": [0, 1, 2]})
    sql = "SELECT R.id AS r, S.id AS s FROM R [RANGE 10 SECONDS], S [RANGE 10 SECONDS] " \
          "WHERE R.a = S.a"
    res = adaptcq.run(sql, {"R": r, "S": s})
    assert res.table.column("r").to_pylist() == [0, 2]


def test_self_join_shares_input_rows():
    r = pd.DataFrame({"ts": [0.0, 1.0, 2.0], "a": [1, 1, 2], "id": [0, 1, 2]})
    sql = "SELECT x.id AS i, y.id AS j FROM R [ROWS 2] AS x, R [ROWS 2] y WHERE x.a = y.a"
    for mode in ("append", "retract"):
        res = adaptcq.run(sql, {"R": r}, mode=mode)
        assert rows_of(res.table) == oracle_rows(sql, {"R": r}, mode)
    pairs = Counter(zip(res.table.column("i").to_pylist(), res.table.column("j").to_pylist()))
    assert pairs[(0, 1)] >= 1 and pairs[(1, 0)] >= 1 and pairs[(2, 2)] == 1


def test_late_rows_are_counted_and_written(tmp_path):
    r = pd.DataFrame({"ts": [0.0, 5.0, 1.0, 4.5], "a": [1, 1, 1, 1], "id": [0, 1, 2, 3]})
    s = pd.DataFrame({"ts": [6.0], "a": [1], "id": [0]})
    sql = "SELECT R.id AS r FROM R [RANGE 10 SECONDS], S [RANGE 10 SECONDS] WHERE R.a = S.a"
    res = adaptcq.run(sql, {"R": r, "S": s}, allowed_lateness=1.0)
    assert res.stats["rejected"] == 1
    assert res.rejected.to_pylist() == [
        {"stream": "R", "row": 2, "file": None, "ts": 1.0, "reason": "late by more than the allowed lateness (1 s)"}]
    assert sorted(res.table.column("r").to_pylist()) == [0, 1, 3]
    pq.write_table(pa.Table.from_pandas(r), tmp_path / "r.parquet")
    pq.write_table(pa.Table.from_pandas(s), tmp_path / "s.parquet")
    out = tmp_path / "out.parquet"
    assert main(["run", "--sql", sql, "--input", f"R={tmp_path / 'r.parquet'}", "--input",
                 f"S={tmp_path / 's.parquet'}", "--allowed-lateness", "1", "--output", str(out),
                 "--no-progress"]) == 0
    assert pq.read_table(tmp_path / "out.rejected.parquet").num_rows == 1
    # A refused run leaves the earlier output and its rejected rows as they were (it
    # removed the rejected file only); an accepted one replaces both.
    inputs = ["--input", f"R={tmp_path / 'r.parquet'}", "--input", f"S={tmp_path / 's.parquet'}"]
    assert main(["run", "--sql", "SELECT R.nope FROM R, S WHERE R.a = S.a", *inputs,
                 "--output", str(out), "--no-progress"]) == 1
    assert out.exists() and (tmp_path / "out.rejected.parquet").exists()
    assert main(["run", "--sql", sql, *inputs, "--allowed-lateness", "10", "--output",
                 str(out), "--no-progress"]) == 0
    assert not (tmp_path / "out.rejected.parquet").exists()  # (no row was late this time)
    # Each output has its own: out.csv's are CSV, beside, and out.parquet's stay (out.csv
    # and out.parquet shared out.rejected.parquet, so a run of one removed the other's).
    late = [*inputs, "--allowed-lateness", "1", "--no-progress", "--sql", sql]
    assert main(["run", *late, "--output", str(out)]) == 0
    assert main(["run", *late, "--output", str(tmp_path / "out.csv.gz")]) == 0
    assert pq.read_table(tmp_path / "out.rejected.parquet").num_rows == 1
    import pyarrow.csv as pacsv
    assert pacsv.read_csv(tmp_path / "out.rejected.csv.gz").column("row").to_pylist() == [2]


def test_explicit_deletions_on_unbounded_streams():
    r = pd.DataFrame({"ts": [0.0, 1.0, 2.0, 3.0], "a": [1, 1, 1, 7], "id": [0, 1, 0, 9],
                      "op": [1, 1, -1, -1]})
    s = pd.DataFrame({"ts": [0.5], "a": [1], "id": [5], "op": [1]})
    sql = "SELECT R.id AS r, S.id AS s FROM R, S WHERE R.a = S.a"
    res = adaptcq.run(sql, {"R": r, "S": s}, mode="retract", sign="op")
    got = list(zip(res.table.column("r").to_pylist(), res.table.column("_sign").to_pylist()))
    assert got == [(0, 1), (1, 1), (0, -1)]
    assert res.stats["rejected"] == 1  # the deletion of (7, 9), which was never inserted
    assert rows_of(res.table) == oracle_rows(sql, {"R": r, "S": s}, "retract", sign="op")
    with pytest.raises(InputError, match="unbounded"):
        adaptcq.run("SELECT R.id FROM R [ROWS 3], S WHERE R.a = S.a", {"R": r, "S": s},
                    sign="op")


def test_select_star_names_columns_by_alias():
    src = frames(2, 10)
    res = adaptcq.run("SELECT * FROM R [ROWS 3] AS x, S [ROWS 3] WHERE x.a = S.a",
                      {"R": src["R"], "S": src["S"]})
    assert res.table.column_names == ["x_ts", "x_id", "x_a", "S_ts", "S_id", "S_a", "S_b",
                                      "_sign", "_ts"]


@pytest.mark.parametrize("sources, kwargs, message", [
    ({"R": "/nonexistent/r.parquet"}, {}, "stream R: input file '/nonexistent/r.parquet' does not exist"),
    ({"R": pd.DataFrame({"t": [1.0], "a": [1]})}, {}, "stream R: no timestamp column 'ts'"),
    ({"R": pd.DataFrame({"ts": ["x"], "a": [1]})}, {}, "it must be a timestamp, a date, or a number"),
    ({"R": pd.DataFrame({"ts": [1.0, None], "a": [1, 2]}), "S": pd.DataFrame({"ts": [1.0], "a": [1]})},
     {}, "row 1 has no timestamp"),
    ({"R": pd.DataFrame({"ts": [1.0], "a": [1]}), "S": pd.DataFrame({"ts": [1.0], "b": [1]})},
     {}, "unknown column"),
    ({"R": pd.DataFrame({"ts": [1.0], "a": [1]})}, {}, "no input for stream S; give one with --input"),
])
def test_bad_input_names_the_stream(sources, kwargs, message):
    with pytest.raises((InputError, QueryError), match=message):
        adaptcq.run("SELECT R.a FROM R, S WHERE R.a = S.a", sources, **kwargs)


def test_join_columns_of_different_types_are_an_error():
    r = pd.DataFrame({"ts": [1.0], "a": ["1"]})
    s = pd.DataFrame({"ts": [1.0], "a": [1]})
    with pytest.raises(QueryError, match="R.a is a string, S.a is a number"):
        adaptcq.run("SELECT R.a FROM R, S WHERE R.a = S.a", {"R": r, "S": s})


def test_bad_sign_values_name_the_row():
    r = pd.DataFrame({"ts": [1.0, 2.0], "a": [1, 1], "op": [1, 0]})
    with pytest.raises(InputError, match="stream R: row 1 has sign 0"):
        adaptcq.run("SELECT R.a FROM R, R AS q WHERE R.a = q.a", {"R": r}, sign="op")


def test_bad_orders_and_trees_are_errors():
    src = frames(3, 5)
    with pytest.raises(ValueError, match="must list each of S, T once"):
        adaptcq.run(SQL3, src, orders={"R": ["S"]})
    with pytest.raises(ValueError, match="exactly once"):
        adaptcq.run(SQL3, src, executor="xjoin", tree=(("R", "S"), "R"))


# ----- command line --------------------------------------------------------------------------
def test_cli_runs_a_query_over_files(tmp_path, capsys):
    src = frames(4)
    for name, df in src.items():
        pq.write_table(pa.Table.from_pandas(df), tmp_path / f"{name}.parquet")
    (tmp_path / "q.sql").write_text(SQL3)
    out = tmp_path / "res.parquet"
    args = ["run", "--sql", f"@{tmp_path / 'q.sql'}", "--timestamp", "ts", "--mode", "retract",
            "--executor", "xjoin", "--tree", "(R, (S, T))", "--output", str(out), "--no-progress"]
    for name in src:
        args += ["--input", f"{name}={tmp_path / f'{name}.parquet'}"]
    assert main(args) == 0
    assert rows_of(pq.read_table(out)) == oracle_rows(SQL3, src, "retract")
    text = capsys.readouterr().out
    assert "throughput (updates per CPU-second)" in text and "XJoin (R ⋈ (S ⋈ T))" in text
    mj = [a for a in args if a not in ("--tree", "(R, (S, T))")] + ["--order", "T:S,R"]
    mj[mj.index("xjoin")] = "mjoin"
    assert main(mj) == 0
    assert "ΔR T: S ⋈ R" in capsys.readouterr().out


@pytest.mark.parametrize("args, message", [
    (["run", "--sql", "SELECT R.a FROM R"], "--sql needs an --input"),
    (["run", "--sql", "SELECT R.a FROM R", "--input", "R"], "expected NAME=PATH"),
    (["run", "--sql", "SELECT R.a FROM R", "--input", "R=/no/such.parquet"], "does not exist"),
    (["run", "--sql", "@/no/such.sql"], "query file '/no/such.sql' does not exist"),
    (["run", "--sql", "SELECT R.a FROM R, S", "--input", "R=x", "--input", "R=y"], "twice"),
    (["run", "--order", "R:S", "--executor", "xjoin"], "--order sets MJoin pipelines"),
    (["workload", "nope", "--out", "/tmp/x"], "unknown workload"),
])
def test_cli_errors_are_clear(args, message, capsys):
    assert main(args) == 1
    assert message in capsys.readouterr().err


def test_cli_unknown_option_exits_nonzero(capsys):
    with pytest.raises(SystemExit) as e:
        main(["run", "--frobnicate"])
    assert e.value.code == 1
    assert "unrecognized arguments: --frobnicate" in capsys.readouterr().err


def test_explain_code_prints_every_pipeline(tmp_path, capsys):
    """``adaptcq explain --code``: the generated source of every MJoin pipeline, for the
    default orders or --order; the same text on every call; refused with a reason for XJoin
    and Spark, and its plan options refused without it."""
    import json
    assert main(["explain", "--code", "--sql", SQL3, "--order", "R:T,S"]) == 0
    text = capsys.readouterr().out
    for name in ("ΔR: T⋈S", "ΔS: R⋈T", "ΔT: S⋈R"):
        assert f"# <pipeline {name}>" in text
    assert text.count("def pipeline(") == 3
    assert main(["explain", "--code", "--sql", SQL3, "--order", "R:T,S"]) == 0
    assert capsys.readouterr().out == text  # deterministic names, deterministic source
    assert main(["explain", "--code", "--json", "--mode", "retract", "--sql", SQL3]) == 0
    code = json.loads(capsys.readouterr().out)["code"]
    assert len(code) == 6 and "<pipeline ΔR: S⋈T>" in code  # insertions and deletions
    for name, source in code.items():
        compile(source, name, "exec")
    for extra, message in [(["--engine", "spark"], "--code with --engine spark: on Spark"),
                           (["--executor", "xjoin"], "XJoin has no generated pipelines"),
                           (["--order", "R:X"], "pipeline order for R must list")]:
        assert main(["explain", "--code", "--sql", SQL3, *extra]) == 1
        assert message in capsys.readouterr().err
    assert main(["explain", "--sql", SQL3, "--order", "R:T,S"]) == 1
    assert "--order is for --code" in capsys.readouterr().err


def test_cli_writes_workloads(tmp_path, capsys):
    assert main(["workload", "three-way", "--out", str(tmp_path), "--n-updates", "700"]) == 0
    assert {p.name for p in tmp_path.iterdir()} >= {"R.parquet", "S.parquet", "T.parquet",
                                                    "query.sql"}


def test_the_collector_is_paused_per_batch_and_left_as_it_was():
    """The cyclic garbage collector is off while the engine works a batch
    (``adaptcq.collector``) and on again after it, also when the batch fails; a caller
    that turned it off keeps it off. The results are MJoin's either way."""
    import gc

    from adaptcq import collector
    seen = []
    with collector.paused():
        seen.append(gc.isenabled())
    assert seen == [False] and gc.isenabled()
    with pytest.raises(RuntimeError), collector.paused():
        raise RuntimeError("a batch failed")
    assert gc.isenabled()
    from adaptcq.stream.workloads import three_way
    wl = three_way(n_updates=2_000, r=2, seed=3)
    want = adaptcq.run(wl.sql, wl.tables, executor="mjoin").table
    assert gc.isenabled()
    gc.disable()
    try:
        with collector.paused():
            assert not gc.isenabled()
        got = adaptcq.run(wl.sql, wl.tables, executor="mjoin").table
        assert not gc.isenabled()
    finally:
        gc.enable()
    assert got.equals(want)


@pytest.mark.parametrize("executor", ["vector", "mjoin"])
def test_leaving_a_stream_early_says_so_in_its_stats(executor):
    """Closing the iterator (``break``) stops the run: ``stopped`` says so,
    ``rows_processed`` counts the rows processed, not those read ahead, and ``results``
    the rows received (it counted buffered rows, ``stopped`` was None and results counted
    rows never delivered; found by fuzzing)."""
    n = 60_000
    tabs = {x: pa.table({"ts": list(range(n)), "k": [i % 7 for i in range(n)]}) for x in "RS"}
    run = adaptcq.stream("SELECT R.k FROM R [ROWS 10], S [ROWS 10] WHERE R.k = S.k", tabs,
                         executor=executor, chunk_rows=1000)
    got = 0
    for batch in run:
        got += batch.num_rows
        break
    s = run.stats
    assert s["stopped"] == "closed by its consumer"
    assert s["results"] == got <= s.get("results_computed", got)  # what was received
    assert sum(s["rows_processed"].values()) == s["arrivals"] < 2 * n
    assert all(s["rows_processed"][x] <= s["rows_read"][x] for x in "RS")


@pytest.mark.parametrize("executor", ["vector", "mjoin"])
def test_a_source_that_raises_is_named_in_the_stats(executor):
    """A source's own generator raising: the exception reaches the caller unchanged, and
    ``stopped`` names it (it stayed None, as if the input had ended)."""
    def rows():
        for i in range(3000):
            yield {"ts": i, "k": i % 5}
        raise ConnectionError("the feed dropped")

    s_rows = pa.table({"ts": list(range(10)), "k": list(range(10))})
    run = adaptcq.stream("SELECT R.k FROM R [ROWS 10], S [ROWS 10] WHERE R.k = S.k",
                         {"R": rows(), "S": s_rows}, executor=executor, chunk_rows=1000)
    with pytest.raises(ConnectionError, match="the feed dropped"):
        for _ in run:
            pass
    assert run.stats["stopped"] == "failed: ConnectionError: the feed dropped"


@pytest.mark.parametrize("executor", ["vector", "mjoin"])
def test_max_results_summary_counts_the_results_written(executor):
    """--max-results cuts the output mid-update: the summary's results are the output's
    rows (it said 182 for 10 written), the engine's count is results_computed."""
    n = 2_000
    tabs = {x: pa.table({"ts": list(range(n)), "k": [i % 7 for i in range(n)]}) for x in "RS"}
    res = adaptcq.run("SELECT R.k FROM R [ROWS 10], S [ROWS 10] WHERE R.k = S.k", tabs,
                      executor=executor, max_results=10)
    assert res.table.num_rows == res.stats["results"] == 10
    assert res.stats["results_computed"] >= 10
    assert res.stats["stopped"] == "--max-results 10 reached"


def test_fixed_orders_with_an_ordering_policy_are_refused_per_tuple():
    """--order with --optimizer or --reorder on MJoin: the policies replaced the fixed
    orders silently (found by fuzzing); refused. The vectorized executor takes both."""
    from adaptcq.adapt import make_policies
    from adaptcq.errors import OptionError
    src = frames(3, 5)
    sql = "SELECT R.a FROM R, S, T WHERE R.a = S.a AND S.b = T.b"
    for policies in (make_policies(optimizer="qaware"), make_policies(reorder="agreedy")):
        with pytest.raises(OptionError, match="--order fixes pipelines' orders"):
            adaptcq.run(sql, src, executor="mjoin", orders={"T": ["R", "S"]},
                        policies=policies)
    adaptcq.run(sql, src, executor="vector", orders={"T": ["R", "S"]}, ordering="qaware")


def test_a_policy_object_serves_one_query():
    """Reused for a second run, an initial plan kept its 'done' and planned nothing while
    the report said its plan was set; A-Greedy kept its scaled-down profiling (found by
    fuzzing the Python API). A second attach is refused."""
    from adaptcq.adapt import make_policies
    from adaptcq.errors import OptionError
    src = frames(3, 40)
    sql = "SELECT R.a FROM R, S, T WHERE R.a = S.a AND S.b = T.b"
    policies = make_policies(optimizer="qaware", reorder="agreedy")
    adaptcq.run(sql, src, executor="mjoin", policies=policies)
    with pytest.raises(OptionError, match="already serves another query"):
        adaptcq.run(sql, src, executor="mjoin", policies=policies)


def test_python_api_inputs_and_arguments_are_checked_up_front():
    """Found by fuzzing the Python API: a key only later rows of an iterable's first chunk
    had was dropped, silently; a RecordBatchReader read twice gave an empty stream; float
    chunk_rows, a non-callable on_rejected and a non-string source name gave raw tracebacks
    (on_rejected only at the first late row)."""
    from adaptcq.errors import InputError, OptionError
    sql = ("SELECT R.id AS rid, S.id AS sid FROM R [RANGE 10 SECONDS], S [RANGE 10 SECONDS] "
           "WHERE R.a = S.a")
    s = pd.DataFrame({"ts": [1.5, 2.5, 3.5], "a": [1, 2, 1], "id": [20, 21, 22]})

    def rows():
        yield {"ts": 1.0, "a": 1}                 # no id: NULL, as in later chunks
        yield {"ts": 2.0, "a": 2, "id": 11}       # the column comes from here
    got = adaptcq.run(sql, {"R": rows(), "S": s}).table
    assert sorted(got.column("rid").to_pylist(), key=str) == [11, None, None]
    r = pa.table({"ts": [1.0, 2.0], "a": [1, 2], "id": [10, 11]})
    reader = pa.RecordBatchReader.from_batches(r.schema, r.to_batches())
    assert adaptcq.run(sql, {"R": reader, "S": s}).table.num_rows == 3
    with pytest.raises(InputError, match="RecordBatchReader yielded no batch"):
        adaptcq.run(sql, {"R": reader, "S": s})
    for bad in (1.5, 2.0, True, "10"):
        with pytest.raises(OptionError, match="chunk_rows must be a positive whole number"):
            adaptcq.run(sql, {"R": r, "S": s}, chunk_rows=bad)
    with pytest.raises(OptionError, match="on_rejected must be a callable"):
        adaptcq.run(sql, {"R": r, "S": s}, on_rejected=5)
    with pytest.raises(InputError, match="source name 1"):
        adaptcq.run(sql, {1: r, "S": s})


def test_dataframes_pyarrow_cannot_take_are_named():
    """Non-string or repeated column names and a column of mixed values gave pyarrow's
    errors, naming neither the stream nor the column (found by fuzzing the Python API)."""
    from adaptcq.errors import InputError
    sql = "SELECT R.id FROM R, S WHERE R.a = S.a"
    s = pd.DataFrame({"ts": [1.5], "a": [1], "id": [20]})
    r = pd.DataFrame({"ts": [1.0, 2.0], "a": [1, 2], "id": [10, 11]})
    named = r.copy()
    named.columns = ["ts", "a", 5]
    for frame, message in ((named, "column names must be strings, not 5"),
                           (pd.concat([r, r[["id"]]], axis=1), "more than one column named 'id'"),
                           (r.assign(x=[1, "a"]), "column 'x' cannot be one Arrow type")):
        with pytest.raises(InputError, match=message):
            adaptcq.run(sql, {"R": frame, "S": s})


def test_engine_option_shapes_are_named():
    """A list for orders, one policy for policies, True for nested_loop, and a float for
    an Engine's max_arrivals reached the engines as raw TypeErrors / AttributeErrors (found
    by fuzzing the Python API)."""
    from adaptcq.adapt import make_policies
    from adaptcq.errors import OptionError
    src = frames(3, 10)
    sql = "SELECT R.a FROM R, S, T WHERE R.a = S.a AND S.b = T.b"
    for kw, message in (({"orders": ["S", "T"]}, "orders must map a stream"),
                        ({"policies": make_policies(optimizer="qaware")[0]},
                         "policies must be a list"),
                        ({"nested_loop": True}, "nested_loop must be a list")):
        with pytest.raises(OptionError, match=message):
            adaptcq.run(sql, src, executor="mjoin", **kw)
    engine = adaptcq.Engine(src)
    engine.register(sql)
    with pytest.raises(OptionError, match="max_arrivals must be a whole number"):
        engine.run(max_arrivals=1.5)


def test_a_tree_needs_an_executor_that_takes_one():
    """tree= with the default executor fell back to MJoin, which then said 'unknown option
    tree for the mjoin executor' (found by fuzzing the Python API)."""
    from adaptcq.errors import OptionError
    src = frames(3, 10)
    sql = "SELECT R.a FROM R, S, T WHERE R.a = S.a AND S.b = T.b"
    for executor in ("auto", "vector", "mjoin"):
        with pytest.raises(OptionError, match="give executor='xjoin' or executor='tree'"):
            adaptcq.run(sql, src, executor=executor, tree="((R, S), T)")
    assert adaptcq.run(sql, src, executor="xjoin", tree="((R, S), T)").stats["results"] >= 0


def test_bad_policy_values_are_option_errors():
    """make_policies(W=-1) raised a bare ValueError: now an OptionError (still a
    ValueError), as the CLI reports option errors."""
    from adaptcq.adapt import make_policies
    from adaptcq.errors import OptionError
    for kw in ({"optimizer": "qaware", "W": -1}, {"reorder": "agreedy", "interval": 0},
               {"reorder": "agreedy", "p": 2}, {"caching": {"caches": -1}}):
        with pytest.raises(OptionError):
            make_policies(**kw)


@pytest.mark.parametrize("option", [{"allowed_lateness": True}, {"allowed_lateness": "1.5"},
                                    {"batch_seconds": True}, {"batch_seconds": "1"}])
def test_time_options_take_numbers_only(option):
    """A boolean or a string was taken as a number of seconds (True as 1 s), as batch_rows,
    chunk_rows and max_results already refuse (fuzzing, 2026-11-27)."""
    tabs = {x: pa.table({"ts": [1.0], "k": [1]}) for x in "RS"}
    name = "--" + next(iter(option)).replace("_", "-")
    with pytest.raises(OptionError, match=name):
        adaptcq.run("SELECT R.k FROM R, S WHERE R.k = S.k", tabs, executor="vector",
                    **option)


def test_batch_seconds_near_the_end_of_int64_time_does_not_wrap():
    """The batch's end, its first time + batch_seconds, wrapped int64 near 2262: every batch
    was cut to one row (with numpy overflow warnings); results were right."""
    big = 9_223_372_036  # 2262-04-11, in epoch seconds
    tabs = {"R": pa.table({"ts": [big - 100, big - 50, big - 10], "a": [1, 1, 1]}),
            "S": pa.table({"ts": [big - 99, big - 49, big - 9], "a": [1, 1, 1]})}
    sql = "SELECT R.a FROM R [RANGE 20], S [RANGE 20] WHERE R.a = S.a"
    want = adaptcq.run(sql, tabs, executor="mjoin").table
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = adaptcq.run(sql, tabs, executor="vector", batch_seconds=9e9)
    assert got.stats["batches"] == 1 and got.table.equals(want)
