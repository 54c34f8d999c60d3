"""The Python API's option values, checked before any row is read (a tester's findings):
option shapes named in an OptionError instead of raw Python exceptions, empty pipeline
orders, ``make_policies`` parameters no policy takes, A-Caching's ``verify``, the query
set Engine's control times, routing epoch and ``max_arrivals`` stop, and ``sample_every``."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import adaptcq
from adaptcq.adapt import make_policies
from adaptcq.cli import main
from adaptcq.errors import AdaptcqError, OptionError, QueryError
from adaptcq.runtime.local import prepare
from oracle import Oracle

R2 = pa.table({"ts": [1.0, 2.0], "a": [1, 2], "x": [10, 20]})
S2 = pa.table({"ts": [1.5, 2.5], "a": [1, 2], "y": [5, 6]})
SQL2 = "SELECT R.x, S.y FROM R [RANGE 10], S [RANGE 10] WHERE R.a = S.a"

SQL3 = ("SELECT R.x AS rx, S.x AS sx, T.x AS tx FROM R [RANGE 3], S [RANGE 3], T [RANGE 3] "
        "WHERE R.a = S.a AND S.b = T.b")


def three(seed=0, n=40):
    rng = np.random.default_rng(seed)
    mk = lambda cols: pa.table({"ts": np.sort(rng.integers(0, 20, n)).astype(float),
                                "x": np.arange(n),
                                **{c: rng.integers(0, 3, n) for c in cols}})
    return {"R": mk("a"), "S": mk("ab"), "T": mk("b")}


def rows_of(table: pa.Table) -> Counter:
    return Counter(zip(*[table.column(c).to_pylist() for c in table.column_names]))


def oracle_rows(sql, sources) -> Counter:
    p = prepare(sql, sources, "ts")
    _, outs = Oracle(p.query, "append", 1e-9).run(p.streams.tolist(), None,
                                                  p.timestamps.tolist(), p.rows)
    total = Counter()
    for c in outs:
        for (*vals, sign, ts), n in c.items():
            total[(*vals, sign, ts / 1e9)] += n
    return total


# ----- 1. option shapes -------------------------------------------------------------------

@pytest.mark.parametrize("kw, message", [
    ({"chunk_rows": 10**20}, r"chunk_rows must be at most 9,223,372,036,854,775,807"),
    ({"spill": 5}, r"spill must be a dict of options, e\.g\. spill=\{'strategy'"),
    ({"spill": "global-penalty"}, r"spill must be a dict of options.*got 'global-penalty'"),
    ({"spill": {"strategy": "global-penalty", "memory": "64MB", "directory": 5}},
     r"spill option directory \(--spill-dir\) must be a folder's path, got 5"),
    ({"shed": 5}, r"shed must be a dict of options, e\.g\. shed=\{'mode'"),
    ({"shed": "selective"}, r"shed must be a dict of options.*got 'selective'"),
    ({"executor": "acaching", "cache_options": 5}, r"cache_options must be a dict of options"),
    ({"executor": "mjoin", "cache_options": [("caches", "global")]},
     r"cache_options must be a dict of options"),
    ({"sample_every": "x"}, (r"sample_every \(updates between two state samples\) must be "
                             r"a positive whole number, got 'x'")),
])
def test_bad_option_shapes_are_named(kw, message):
    with pytest.raises(OptionError, match=message):
        adaptcq.run(SQL2, {"R": R2, "S": S2}, **kw)


def test_shape_checks_where_spill_and_shed_are_read():
    """The same checks where the Spark runtime reads the options (no LocalRun before)."""
    from adaptcq.runtime.shed import shed_engine_options
    from adaptcq.runtime.spill import spark_spill_spec
    with pytest.raises(OptionError, match="spill must be a dict of spill options"):
        spark_spill_spec("global-penalty", 2)
    with pytest.raises(OptionError, match="spill option directory"):
        spark_spill_spec({"strategy": "global-penalty", "memory": "64MB", "directory": ""}, 2)
    with pytest.raises(OptionError, match="shed must be a dict of shedding options"):
        shed_engine_options("selective")


def test_largest_chunk_rows_still_runs(tmp_path):
    """2**63 - 1 is the bound, not a refusal of large values: every kind of source reads
    with it, and the results are the oracle's."""
    pq.write_table(R2, tmp_path / "r.parquet")
    expected = oracle_rows(SQL2, {"R": R2, "S": S2})
    for sources in ({"R": R2, "S": S2}, {"R": str(tmp_path / "r.parquet"), "S": S2.to_pylist()}):
        res = adaptcq.run(SQL2, sources, chunk_rows=2**63 - 1)
        assert rows_of(res.table) == expected and len(expected) == 2
    with pytest.raises(OptionError, match="chunk_rows must be at most"):
        adaptcq.Engine(sources={"R": R2}, chunk_rows=2**63)


def test_query_text_must_be_a_string():
    with pytest.raises(QueryError, match="the query must be its SQL text .* got int"):
        adaptcq.run(5, {"R": R2})
    engine = adaptcq.Engine(sources={"R": R2})
    with pytest.raises(QueryError, match="register: the query must be its SQL text"):
        engine.register(5)
    assert engine.handles == {}


# ----- 2. empty pipeline orders -----------------------------------------------------------

@pytest.mark.parametrize("executor", ["mjoin", "vector", "acaching"])
@pytest.mark.parametrize("order, message", [
    ([], "pipeline order for R must list each of S, T once, got nothing"),
    (None, r"orders\['R'\] must be a list of the other streams .* got None"),
    ("ST", r"orders\['R'\] must be a list"),
    ([1, 2], r"orders\['R'\] must be a list"),
])
def test_an_empty_pipeline_order_is_refused(executor, order, message):
    with pytest.raises(OptionError, match=message):
        adaptcq.run(SQL3, three(), executor=executor, orders={"R": order})


def test_an_empty_order_is_refused_before_the_agreedy_conflict():
    """{"R": []} counted as fixing R's pipeline, so A-Greedy was refused for it."""
    with pytest.raises(OptionError, match="pipeline order for R must list each of S, T"):
        adaptcq.run(SQL3, three(), executor="mjoin", orders={"R": []},
                    policies=make_policies(reorder="agreedy"))


@pytest.mark.parametrize("executor", ["mjoin", "vector", "acaching"])
def test_full_orders_still_run_and_match_the_oracle(executor):
    src = three(4)
    res = adaptcq.run(SQL3, src, executor=executor, orders={"R": ["S", "T"], "T": ("S", "R")})
    assert rows_of(res.table) == oracle_rows(SQL3, src)
    assert res.table.num_rows > 0


def test_a_one_stream_pipeline_order_is_empty():
    res = adaptcq.run("SELECT R.x FROM R", {"R": R2}, executor="mjoin", orders={"R": []})
    assert res.table.column("x").to_pylist() == [10, 20]


def test_cli_order_without_streams_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for name, t in three().items():
        pq.write_table(t, f"{name}.parquet")
    code = main(["run", "--sql", SQL3, *[a for s in "RST" for a in
                                         ("--input", f"{s}={s}.parquet")],
                 "--executor", "mjoin", "--order", "R:,", "--no-progress",
                 "--output", "out.parquet"])
    assert code == 1
    assert "pipeline order for R must list each of S, T once, got nothing" in \
        capsys.readouterr().err


# ----- 3. make_policies parameters no policy takes --------------------------------------------

@pytest.mark.parametrize("kw, message", [
    ({"optimizer": "qaware", "alpha": -1},
     (r"alpha=-1 is used by no policy built: it is for A-Greedy \(reorder='agreedy'\), and "
      r"this asks for optimizer only")),
    ({"optimizer": "qaware", "cheap": "no"}, r"cheap='no' is used by no policy built"),
    ({"reorder": "agreedy", "objective": "tuples"},
     r"objective='tuples' is used by no policy built: it is for the initial plan"),
    ({"reorder": "agreedy", "initial_p": 5}, r"initial_p=5 is used by no policy built"),
    ({"caching": {}, "alpha": 5}, r"alpha=5 .*A-Caching's own alpha goes in caching"),
    ({"caching": {}, "p": 0.5}, r"p=0\.5 .*A-Caching's own p goes in caching"),
    ({"caching": {"W": 3}, "W": 4}, r"W=4 .* A-Caching takes the W that caching gives"),
    ({"optimizer": "qaware", "initial_p": 0.5, "p": 0.1},
     r"p=0\.1 .* initial_p overrides it for the initial plan, and no A-Greedy"),
    ({"p": 2, "W": -1, "seed": "x"}, r"p=2 is used by no policy built: .* asks for no policy"),
    ({"seed": 1}, r"seed=1 is used by no policy built"),
])
def test_make_policies_refuses_parameters_no_policy_takes(kw, message):
    with pytest.raises(OptionError, match=message):
        make_policies(**kw)


def test_make_policies_still_takes_what_its_policies_use():
    pols = make_policies(optimizer="qaware", objective="tuples", initial_p=0.5, p=0.1,
                         alpha=2.0, cheap=False, reorder="agreedy", W=4, seed=3)
    assert [type(p).__name__ for p in pols] == ["InitialPlan", "AGreedy"]
    assert pols[1].cheap is False and pols[1].alpha == 2.0
    (cache,) = make_policies(caching={"p": 0.2}, W=5, interval=50, seed=2)
    assert (cache.W, cache.interval, cache.seed, cache.p) == (5, 50, 2, 0.2)
    assert make_policies() == []


@pytest.mark.parametrize("kw, message", [
    ({"reorder": "agreedy", "seed": "x"}, "policy parameter seed must be a whole number"),
    ({"optimizer": "qaware", "seed": 1.5}, "policy parameter seed must be a whole number"),
    ({"reorder": "agreedy", "alpha": "x"}, r"alpha \(A-Greedy's tolerance\) must be a number"),
    ({"caching": {"seed": "x"}}, "A-Caching option seed must be a whole number, got 'x'"),
])
def test_policy_seed_and_alpha_types_are_checked(kw, message):
    """A seed of 1.5 or "x" was taken unchecked; alpha="x" failed on a raw comparison."""
    with pytest.raises(OptionError, match=message):
        make_policies(**kw)


def test_a_wrong_typed_policy_parameter_is_an_option_error():
    """cheap='no' where A-Greedy takes it: an adaptcq OptionError (still a TypeError)."""
    with pytest.raises(OptionError, match=r"cheap .* must be True or False, got 'no'") as e:
        make_policies(reorder="agreedy", cheap="no")
    assert isinstance(e.value, TypeError) and isinstance(e.value, AdaptcqError)


# ----- 4. A-Caching's verify ----------------------------------------------------------------

@pytest.mark.parametrize("value", ["false", "no", None, 0, 1])
def test_acaching_verify_takes_true_or_false_only(value):
    with pytest.raises(OptionError, match="option verify .* must be True or False"):
        make_policies(caching={"verify": value})
    with pytest.raises(OptionError, match="option verify .* must be True or False"):
        adaptcq.run(SQL2, {"R": R2, "S": S2}, executor="acaching",
                    cache_options={"verify": value})


def test_acaching_verify_false_runs_and_matches_the_oracle():
    src = three(2)
    assert make_policies(caching={"verify": False})[0].verify is False
    res = adaptcq.run(SQL3, src, executor="acaching", cache_options={"verify": False})
    assert rows_of(res.table) == oracle_rows(SQL3, src)


# ----- 5. the query set Engine ----------------------------------------------------------------

ROWS = [{"ts": float(i), "a": i % 3, "x": i} for i in range(10)]


@pytest.mark.parametrize("at", ["3", b"3"])
def test_engine_control_time_text_is_refused(at):
    engine = adaptcq.Engine(sources={"R": list(ROWS)})
    with pytest.raises(AdaptcqError, match="control time .* is not a number or a datetime"):
        engine.register("SELECT R.x FROM R", at=at)
    assert engine.handles == {}


@pytest.mark.parametrize("epoch", [True, False, 1.5, 0, "x"])
def test_engine_routing_epoch_is_a_positive_whole_number(epoch):
    with pytest.raises(OptionError, match="routing_epoch must be a positive number of "
                                          "arrivals or None"):
        adaptcq.Engine(sources={"R": list(ROWS)}, routing_epoch=epoch)


def test_engine_max_arrivals_says_why_it_stopped():
    engine = adaptcq.Engine(sources={"R": list(ROWS)})
    h = engine.register("SELECT R.x FROM R")
    engine.run(max_arrivals=3)
    assert engine.stats["stopped"] == "max_arrivals 3 reached"
    assert engine.stats["rows_processed"] == {"R": 3}
    assert h.table().column("x").to_pylist() == [0, 1, 2]


@pytest.mark.parametrize("limit", [10, 11])
def test_engine_max_arrivals_at_or_past_the_end_is_a_full_run(limit):
    """Input that ends at the bound was not stopped: no reason, every row, and a query
    deregistered after the last arrival is deregistered as in a run without the bound."""
    engine = adaptcq.Engine(sources={"R": list(ROWS)})
    h = engine.register("SELECT R.x FROM R")
    engine.deregister(h, at=100)
    engine.run(max_arrivals=limit)
    assert engine.stats["stopped"] is None
    assert engine.stats["rows_processed"] == {"R": 10}
    assert h.table().column("x").to_pylist() == list(range(10))
    full = adaptcq.Engine(sources={"R": list(ROWS)})
    g = full.register("SELECT R.x FROM R")
    full.deregister(g, at=100)
    full.run()
    assert engine.stats["queries"]["q1"] == full.stats["queries"]["q1"]


# ----- 6. sample_every ------------------------------------------------------------------------

@pytest.mark.parametrize("executor", ["vector"])
@pytest.mark.parametrize("value", [0, 10])
def test_sample_every_is_refused_on_vector_whatever_its_value(executor, value):
    with pytest.raises(OptionError, match="--executor vector cannot run this: state samples"):
        adaptcq.run(SQL2, {"R": R2, "S": S2}, executor=executor, sample_every=value)


@pytest.mark.parametrize("executor", ["auto", "mjoin"])
@pytest.mark.parametrize("value", [0, -1, 1.5, True, "x"])
def test_sample_every_is_a_positive_whole_number(executor, value):
    with pytest.raises(OptionError, match="sample_every .* must be a positive whole number"):
        adaptcq.run(SQL2, {"R": R2, "S": S2}, executor=executor, sample_every=value)


def test_sample_every_given_runs_mjoin_and_samples():
    src = three(5)
    res = adaptcq.run(SQL3, src, sample_every=1)
    assert res.stats["executor"] == "mjoin"
    assert rows_of(res.table) == oracle_rows(SQL3, src)
    assert len(res.samples) >= res.stats["updates"] // 2


def test_a_rebuilt_spark_group_drops_the_initial_plans_own_parameters():
    """A Spark partition group rebuilt after its initial plan was set builds its policies
    again without the optimizer, and without the parameters only the optimizer took
    (``objective``, ``initial_p``, and ``p`` when no A-Greedy remains): ``make_policies``
    refuses parameters no policy takes, so the rebuild failed on such a spec."""
    from types import SimpleNamespace

    from adaptcq.runtime.spark_group import PartitionGroup
    attached = []
    group = SimpleNamespace(planned={"plan": "set"}, policies=[],
                            cq=SimpleNamespace(attach=attached.append))
    spec = {"optimizer": "qaware", "reorder": "agreedy", "caching": None,
            "objective": "tuples", "initial_p": 0.5, "p": 0.1, "alpha": 1.5}
    PartitionGroup.attach(group, SimpleNamespace(adaptivity=spec))
    assert [type(p).__name__ for p in attached] == ["AGreedy"]
    assert attached[0].p == 0.1
    attached.clear()
    spec = {**spec, "reorder": "off", "alpha": None}
    del spec["alpha"]
    PartitionGroup.attach(group, SimpleNamespace(adaptivity=spec))
    assert attached == []  # nothing left to attach


def test_the_executors_themselves_refuse_an_empty_order():
    """MJoin and the vectorized executor (what Spark's groups build) refuse an order of
    nothing, or None, as check_orders does before a local run."""
    from adaptcq.engine.mjoin import MJoin
    from adaptcq.engine.vector import VectorJoin
    from adaptcq.query.cql import parse_query
    q = parse_query("SELECT R.a FROM R, S, T WHERE R.a = S.a AND S.a = T.a")
    with pytest.raises(ValueError, match="must list each of S, T once, got nothing"):
        MJoin(q, orders={"R": []})
    with pytest.raises(ValueError, match=r"orders\['R'\] must be a list .* got None"):
        MJoin(q, orders={"R": None})
    schemas = {n: pa.schema([("ts", pa.float64()), ("a", pa.int64())]) for n in "RST"}
    with pytest.raises(ValueError, match="must list each of S, T once, got nothing"):
        VectorJoin(q, schemas=schemas, orders={"R": []})


def test_a_rebuilt_spark_group_keeps_only_parameters_a_policy_still_takes():
    """(A common ``seed`` beside caching's own was taken by the optimizer alone: the
    rebuild failed inside a Spark worker, 'used by no policy built'.)"""
    from types import SimpleNamespace

    from adaptcq.runtime.spark_group import PartitionGroup
    attached = []
    group = SimpleNamespace(planned={"plan": "set"}, policies=[],
                            cq=SimpleNamespace(attach=attached.append))
    spec = {"optimizer": "fgreedy", "reorder": "off", "caching": {"seed": 1}, "seed": 2}
    PartitionGroup.attach(group, SimpleNamespace(adaptivity=spec))
    assert [type(p).__name__ for p in attached] == ["ACaching"]
