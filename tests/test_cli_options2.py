"""Options refused with a reason or passed through, never ignored (a fuzzer's findings):
--seed when auto falls back to MJoin, explain --caches for the given pipelines, the plan in
--summary-json, keys given twice (--routing-option, --shares), where --max-results stopped,
a bound on --partitions, explain reading inputs as run does, --optimizer with every
pipeline fixed on the vectorized executor, statistics too small for the cost model, and
the spill flags named as typed."""

from __future__ import annotations

import json
import signal
import time
from contextlib import contextmanager

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from adaptcq.cli import main
from adaptcq.cliargs import parse_shares, routing_options
from adaptcq.errors import AdaptcqError

SQL2 = "SELECT R.id AS r, S.id AS s FROM R [RANGE 5], S [RANGE 5] WHERE R.a = S.a"
SQL3 = ("SELECT R.id AS r, S.id AS s, T.id AS t FROM R [RANGE 5], S [RANGE 5], T [RANGE 5] "
        "WHERE R.a = S.a AND S.b = T.b")


def _write(d, streams: str, n: int = 20, ts=None, **cols) -> list[str]:
    out = []
    for s in streams:
        data = {"ts": ts if ts is not None else [float(i) for i in range(n)],
                "a": [i % 3 for i in range(n)], "b": [i % 4 for i in range(n)],
                "id": list(range(n)), **cols}
        pq.write_table(pa.table(data), d / f"{s}.parquet")
        out += ["--input", f"{s}={d / f'{s}.parquet'}"]
    return out


def error_of(capsys, argv) -> str:
    assert main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err  # one line, no traceback
    return err[0]


def _json(capsys, argv) -> dict:
    assert main(argv) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


@contextmanager
def _deadline(seconds: int):
    """Fail (TimeoutError) instead of hanging the test run."""
    def expired(signum, frame):
        raise TimeoutError(f"still running after {seconds} s")
    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    except TimeoutError as e:  # (its traceback, from inside a generator, trips pytest up)
        pytest.fail(str(e), pytrace=False)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


# ----- 1. --seed when auto falls back to MJoin ---------------------------------------------
def test_seed_seeds_the_fallback_policy_of_auto(tmp_path, capsys, monkeypatch):
    from adaptcq import adapt
    made = []
    real = adapt.make_policies

    def spy(*args, **kwargs):
        made.append(kwargs)
        return real(*args, **kwargs)
    monkeypatch.setattr(adapt, "make_policies", spy)
    inputs = _write(tmp_path, "RST")  # (three streams: on two, --optimizer orders nothing)
    sql = SQL3.replace("R.id AS r", "R.id + 1 AS r")
    summary = tmp_path / "s.json"
    assert main(["run", "--sql", sql, *inputs, "--optimizer", "fab", "--seed", "3",
                 "--no-progress", "--summary-json", str(summary)]) == 0
    doc = json.loads(summary.read_text())
    assert doc["executor"] == "mjoin" and doc["optimizer"] == "fab"
    assert {"optimizer": "fab", "seed": 3} in made
    # A run that stays vectorized draws nothing at random: still refused, with that reason.
    msg = error_of(capsys, ["run", "--sql", SQL3, *inputs, "--optimizer", "fab", "--seed",
                            "3", "--no-progress"])
    assert msg.startswith("adaptcq: error: --seed 3: nothing random in this run uses it "
                          "(--optimizer with --executor auto")
    assert "this run is vectorized" in msg


# ----- 2. explain --caches for the pipelines of --order ------------------------------------
def test_explain_caches_are_those_of_the_given_orders(tmp_path, capsys):
    import random

    from adaptcq.adapt.acaching import enumerate_candidates
    from adaptcq.engine.continuous import ContinuousQuery
    from adaptcq.query.cql import parse_query
    rng = random.Random(1)
    inputs = []
    for s in "RSTU":
        n = 200
        pq.write_table(pa.table({"ts": [i * 0.05 for i in range(n)],
                                 "a": [rng.randint(0, 4) for _ in range(n)],
                                 "b": [rng.randint(0, 4) for _ in range(n)],
                                 "id": list(range(n))}), tmp_path / f"{s}.parquet")
        inputs += ["--input", f"{s}={tmp_path / f'{s}.parquet'}"]
    sql = ("SELECT R.id AS r, S.id AS s, T.id AS t, U.id AS u FROM R [RANGE 5], S [RANGE 5], "
           "T [RANGE 5], U [RANGE 5] WHERE R.a = S.a AND S.b = T.b AND T.a = U.a")
    orders = {"R": ["U", "T", "S"], "U": ["R", "S", "T"]}
    inputs += ["--prefix", "200"]  # (fast: A-Caching over 200 rows)
    got = _json(capsys, ["explain", "--sql", sql, *inputs, "--caches", "prefix",
                         "--order", "R:U,T,S", "--order", "U:R,S,T", "--json"])
    q = parse_query(sql)
    ex = ContinuousQuery(q, "mjoin", "append", orders=orders).executor
    want = [c.name for c in enumerate_candidates(q, ex.orders, None)]
    assert sorted(c["cache"] for c in got["caches"]) == sorted(want)
    default = _json(capsys, ["explain", "--sql", sql, *inputs, "--caches", "prefix", "--json"])
    assert {c["cache"] for c in default["caches"]} != set(want)  # (the orders matter here)
    # --mode and --nested-loop are the run's too; an executor without pipelines is refused.
    assert main(["explain", "--sql", sql, *inputs, "--caches", "prefix", "--mode", "retract",
                 "--nested-loop", "T", "--json"]) == 0
    capsys.readouterr()
    msg = error_of(capsys, ["explain", "--sql", sql, *inputs, "--caches", "prefix",
                            "--executor", "xjoin"])
    assert "--executor xjoin with --caches" in msg


# ----- 3. the plan in --summary-json --------------------------------------------------------
@pytest.mark.parametrize(("opts", "shown"), [
    (["--executor", "mjoin", "--order", "R:T,S", "--nested-loop", "S"],
     ["R: T ⋈ S", "nested-loop joins into S"]),
    (["--executor", "xjoin", "--tree", "((R,T),S)"], ["XJoin ((R ⋈ T) ⋈ S)"]),
])
def test_summary_json_has_the_plan(tmp_path, capsys, opts, shown):
    inputs = _write(tmp_path, "RST")
    summary = tmp_path / "s.json"
    assert main(["run", "--sql", SQL3, *inputs, *opts, "--no-progress",
                 "--summary-json", str(summary)]) == 0
    plan = json.loads(summary.read_text())["plan"]
    for text in shown:
        assert text in plan


# ----- 4. --routing-option KEY given twice ----------------------------------------------------
def test_a_routing_option_given_twice_is_refused(tmp_path, capsys):
    inputs = _write(tmp_path, "RS")
    msg = error_of(capsys, ["run", "--executor", "eddy", "--sql", SQL2, *inputs, "--output",
                            str(tmp_path / "o"), "--routing-option", "decay=abc",
                            "--routing-option", "decay=0.9"])
    assert msg == ("adaptcq: error: --routing-option decay is given twice (decay=abc, then "
                   "decay=0.9); give it once")
    assert routing_options(["decay=0.9", "decay=0.9"]) == {"decay": 0.9}  # the same: once
    with pytest.raises(AdaptcqError, match="given twice"):
        routing_options(["x=1", "x=true"])


# ----- 5. where --max-results stopped -------------------------------------------------------
def _stopped(tmp_path, capsys, inputs, sql, *opts) -> dict:
    summary = tmp_path / "s.json"
    msg = error_of(capsys, ["run", "--sql", sql, *inputs, *opts, "--no-progress",
                            "--summary-json", str(summary)])
    doc = json.loads(summary.read_text())
    assert "reached" in doc["stopped"]
    assert f"input stopped after {doc['arrivals']:,} arrivals" in msg
    return doc


@pytest.mark.parametrize("executor", ["mjoin", "xjoin", "acaching", "vector"])
def test_max_results_inside_a_slice_says_where_it_stopped(tmp_path, capsys, executor):
    n = 60  # the 65,536th result (one output chunk) comes with R's 41st row: 41·40·40
    inputs = _write(tmp_path, "RST", n, a=[0] * n)
    sql = "SELECT R.id AS r, S.id AS s, T.id AS t FROM R, S, T WHERE R.a = S.a AND S.a = T.a"
    doc = _stopped(tmp_path, capsys, inputs, sql, "--executor", executor,
                   "--max-results", "100")
    done = doc["rows_processed"]
    assert doc["arrivals"] == doc["updates"] == sum(done.values()) > 0
    if executor != "vector":  # (the vectorized executor stops after its whole batch)
        assert done == {"R": 41, "S": 40, "T": 40}
        assert doc["last_event_time"] == 40.0


def test_max_results_in_a_spill_clean_up_says_where_it_stopped(tmp_path, capsys):
    n = 300
    inputs = _write(tmp_path, "RS", n, ts=[i / 10 for i in range(n)], a=[i % 2 for i in range(n)])
    doc = _stopped(tmp_path, capsys, inputs, SQL2, "--spill", "bottom-up", "--memory", "2kB",
                   "--spill-check", "10", "--max-results", "50")
    assert doc["arrivals"] == sum(doc["rows_processed"].values()) > 0
    assert doc["updates"] >= doc["arrivals"]


# ----- 6. --shares of one class given twice -----------------------------------------------------
def test_a_share_given_twice_is_refused_naming_both(capsys):
    base = ["explain", "--sql", SQL3, "--engine", "spark"]
    msg = error_of(capsys, [*base, "--shares", "S.a=2", "--shares", "S.a=3"])
    assert msg == "adaptcq: error: --shares S.a is given twice (S.a=2, then S.a=3); give it once"
    msg = error_of(capsys, [*base, "--shares", "R.a=2", "--shares", "S.a=3"])
    assert "R.a=2 and S.a=3" in msg and "R.a = S.a" in msg
    assert parse_shares(["S.a=2", "S.a=2"]) == {"S.a": 2}
    got = _json(capsys, [*base, "--shares", "R.a=2", "--shares", "S.a=2", "--json"])
    assert got["shares"] == {"R.a = S.a": 2, "S.b = T.b": 1}


# ----- 7. a bound on --partitions -----------------------------------------------------------------
def test_huge_partitions_are_refused_at_once(capsys):
    base = ["explain", "--sql", SQL3, "--engine", "spark"]
    with _deadline(20):  # (it never returned)
        t0 = time.monotonic()
        msg = error_of(capsys, [*base, "--partitions", "1000000000"])
        assert msg.startswith("adaptcq: error: --partitions 1,000,000,000: at most 100,000 "
                              "partition groups")
        from adaptcq.optimizer.graph import OptimizerError
        from adaptcq.optimizer.shares import MAX_GROUPS, choose_shares, factorizations
        from adaptcq.query.cql import parse_query
        from adaptcq.runtime.spark_split import plan_split
        assert _json(capsys, [*base, "--partitions", str(MAX_GROUPS), "--json"])["groups"] \
            == MAX_GROUPS
        msg = error_of(capsys, [*base, "--shares", "R.a=1000", "--shares", "S.b=1000"])
        assert "multiply to 1,000,000 groups: at most 100,000" in msg
        # the API (Spark's plan_split) and the optimizer, the same bound
        with pytest.raises(OptimizerError, match="at most 100,000"):
            plan_split(parse_query(SQL3), 10**9)
        with pytest.raises(OptimizerError):
            choose_shares([frozenset("RS"), frozenset("ST")], {"R": 1, "S": 1, "T": 1}, 10**9)
        assert len(list(factorizations(10**9, 2))) == 100  # from divisors, not 10**9 steps
        assert time.monotonic() - t0 < 15


# ----- 8. explain reads inputs as run does ---------------------------------------------------
def test_explain_takes_the_input_options_of_run(tmp_path, capsys):
    ms = tmp_path / "ms"
    ms.mkdir()
    inputs = _write(ms, "RS", 100, ts=[1_700_000_000_000 + i * 100 for i in range(100)])
    msg = error_of(capsys, ["explain", "--sql", SQL2, *inputs])
    assert "--timestamp-unit ms" in msg  # what the message says works:
    got = _json(capsys, ["explain", "--sql", SQL2, *inputs, "--timestamp-unit", "ms", "--json"])
    assert got["rejected"] is None and got["algorithms"]
    got = _json(capsys, ["explain", "--sql", SQL2, *inputs, "--timestamp-unit", "ms",
                         "--executor", "vector", "--json"])
    assert got["results"] > 0


def test_explain_reports_the_rows_run_rejects(tmp_path, capsys):
    ts = [i / 2 for i in range(100)]
    for k in range(0, 100, 3):
        ts[k] = max(0.0, ts[k] - 5)  # every third row 5 s late
    inputs = _write(tmp_path, "RS", 100, ts=ts)
    late = {"rows": 66, "reasons": {"late by more than the allowed lateness (0 s)":
                                    {"R": 33, "S": 33}}}
    assert _json(capsys, ["explain", "--sql", SQL2, *inputs, "--json"])["rejected"] == late
    assert _json(capsys, ["explain", "--sql", SQL2, *inputs, "--executor", "vector",
                          "--json"])["rejected"] == late
    assert main(["explain", "--sql", SQL2, *inputs]) == 0
    assert "rejected: 66 input rows rejected" in capsys.readouterr().out
    got = _json(capsys, ["explain", "--sql", SQL2, *inputs, "--allowed-lateness", "5",
                         "--json"])
    assert got["rejected"] is None
    msg = error_of(capsys, ["explain", "--sql", SQL2, "--code", "--allowed-lateness", "5"])
    assert "--allowed-lateness 5.0 has no effect" in msg


def test_explain_sign_processes_deletions(tmp_path, capsys):
    sql = "SELECT R.id AS r, S.id AS s FROM R, S WHERE R.a = S.a"
    inputs = _write(tmp_path, "RS", 6, sign=[1, 1, 1, 1, -1, -1], a=[0, 1, 2, 0, 5, 0],
                    id=[0, 1, 2, 3, 9, 3])
    got = _json(capsys, ["explain", "--sql", sql, *inputs, "--sign", "sign", "--json"])
    # (5, 9) was never inserted: its deletion is rejected, (0, 3)'s deletes its row
    assert got["rejected"] == {"rows": 2, "reasons": {"deletion of a row not in R": {"R": 1},
                                                      "deletion of a row not in S": {"S": 1}}}
    summary = tmp_path / "s.json"  # as adaptcq run counts them
    assert main(["run", "--sql", sql, *inputs, "--sign", "sign", "--executor", "mjoin",
                 "--no-progress", "--summary-json", str(summary)]) == 0
    assert json.loads(summary.read_text())["rejected"] == 2


# ----- 9. --optimizer with every pipeline fixed, vectorized ------------------------------------
@pytest.mark.parametrize("executor", ["vector", "auto"])
def test_vector_refuses_an_optimizer_with_every_pipeline_fixed(tmp_path, capsys, executor):
    inputs = _write(tmp_path, "RST")
    fixed = ["--order", "R:T,S", "--order", "S:T,R", "--order", "T:R,S"]
    msg = error_of(capsys, ["run", "--sql", SQL3, *inputs, "--executor", executor, *fixed,
                            "--optimizer", "fab", "--no-progress"])
    assert msg.startswith("adaptcq: error: --order fixes every pipeline (R, S, T), so "
                          "--optimizer fab has nothing left to order")
    summary = tmp_path / "s.json"  # some fixed: it orders the others
    assert main(["run", "--sql", SQL3, *inputs, "--executor", executor, *fixed[:4],
                 "--optimizer", "fab", "--no-progress", "--summary-json", str(summary)]) == 0
    assert json.loads(summary.read_text())["ordering"] == "fab"


# ----- 10. statistics too small for the cost model ----------------------------------------------
@pytest.mark.parametrize("cyclic", [False, True])
def test_explain_refuses_statistics_whose_state_underflows(tmp_path, capsys, cyclic):
    sql = SQL3 + (" AND R.b = T.b" if cyclic else "")
    sel = {"R,S": 0.5, "S,T": 0.5, **({"R,T": 0.5} if cyclic else {})}
    stats = tmp_path / "stats.json"
    stats.write_text(json.dumps({"rates": {"R": 1, "S": 1e-200, "T": 1}, "selectivities": sel,
                                 "window": 1e-200}))
    msg = error_of(capsys, ["explain", "--sql", sql, "--stats", str(stats)])
    assert msg.startswith("adaptcq: error: statistics: rates.S = 1e-200 and 'window' = 1e-200 "
                          "are too small for the cost model: the state of S's window, λ·W")


def test_treeopt_ranks_a_cost_that_underflowed():
    from adaptcq.optimizer import ALGORITHMS, JoinGraph, plan
    for edges in ("RS ST", "RS ST RT"):
        g = JoinGraph({"R": 1, "S": 1e-200, "T": 1},
                      {frozenset(e): 0.5 for e in edges.split()}, window=1e-200)
        for name in ALGORITHMS:  # (TreeOpt divided by λ·W = 0)
            assert set(plan(g, name)) == {"R", "S", "T"}


# ----- 11. the spill flags named as typed -------------------------------------------------------
@pytest.mark.parametrize(("flag", "value"), [("--spill-fraction", "0"), ("--spill-check", "0"),
                                             ("--spill-sample", "2")])
def test_spill_values_are_refused_naming_the_flag(tmp_path, capsys, flag, value):
    inputs = _write(tmp_path, "RS")
    msg = error_of(capsys, ["run", "--sql", SQL2, *inputs, "--spill", "global-output",
                            "--memory", "1MB", flag, value, "--no-progress"])
    assert msg.startswith(f"adaptcq: error: {flag} ")


@pytest.mark.parametrize("plan_opts", [["--order", "R:S"], ["--nested-loop", "S"]])
@pytest.mark.parametrize(("other", "uses"), [
    (["--spill", "bottom-up", "--memory", "1MB"], "the operator tree"),
    (["--shed", "random", "--capacity", "100"], "the load-shedding join"),
])
def test_mjoin_plan_options_with_another_executor_name_the_flags(tmp_path, capsys, plan_opts,
                                                                 other, uses):
    inputs = _write(tmp_path, "RS")
    msg = error_of(capsys, ["run", "--sql", SQL2, *inputs, *plan_opts, *other,
                            "--no-progress"])
    assert msg.startswith(f"adaptcq: error: {plan_opts[0]} shapes MJoin's pipelines, and this "
                          f"run uses {uses}")
    assert "unknown option" not in msg and "orders" not in msg.replace("orders its", "")


def test_a_query_set_s_huge_partitions_are_refused_at_once():
    """The Spark query set's own partition plan (its Python API) has the bound too."""
    from adaptcq.errors import OptionError
    from adaptcq.query.cql import parse_query
    from adaptcq.runtime.spark_multi import plan_partitions
    q = parse_query("SELECT R.id FROM R, S WHERE R.a = S.a",
                    {"R": {"a": "number", "id": "number"}, "S": {"a": "number"}})
    with pytest.raises(OptionError, match="at most 100,000 partition groups"):
        plan_partitions({"q": q}, {"R": ["a", "id", "ts"], "S": ["a", "ts"]}, 10**9)
