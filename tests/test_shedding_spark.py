"""Load shedding in Spark partition groups (docs/shedding.md, "On Spark"), without a Spark
job: the split and the groups run as Spark runs them (``test_spark_groups.run_groups``),
with groups rebuilt from their stored changes at random points.

* On the virtual clock a group sheds exactly as the local join does: its windows come back
  from the stored rows, and the shedder's state (buffers, fates of recent arrivals, clock,
  statistics, controller, random state) from ``ShedJoin.shed_state``.
* With a CPU budget per micro-batch (``--capacity wall --trigger``) r moves once per
  micro-batch (``adapt.shedding.micro_batch_rate``), the controller survives rebuilds, and
  every result is a true one.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adaptcq.adapt.shed_control import R_MIN, ShedController
from adaptcq.adapt.shedding import micro_batch_rate
from adaptcq.engine.continuous import ContinuousQuery
from adaptcq.errors import OptionError
from adaptcq.query.cql import parse_query
from adaptcq.runtime.shed import engine_options, spark_shed_spec
from adaptcq.runtime.spark_split import plan_split
from conftest import examples
from test_spark_groups import run_groups

SCHEMAS = {n: {"ts": "number", "a": "number", "b": "number", "id": "number"} for n in "RST"}
TWO = ("SELECT R.id AS r, S.id AS s FROM R [RANGE 2 SECONDS], S [RANGE 3 SECONDS] "
       "WHERE R.a = S.a")
THREE = ("SELECT R.id AS r, S.id AS s, T.id AS t FROM R [RANGE 2 SECONDS], "
         "S [RANGE 2 SECONDS], T [RANGE 1 SECONDS] WHERE R.a = S.a AND S.b = T.b")


def _workload(query, n: int, rnd: random.Random):
    k = len(query.streams)
    streams = [rnd.randrange(k) for _ in range(n)]
    t, ts = 0.0, []
    for _ in range(n):
        t += rnd.choice([0.0, 0.01, 0.02, 0.05, 0.1])
        ts.append(round(t, 2))
    rows = []
    for r, i in enumerate(streams):
        cols = query.columns[query.aliases[i]]
        d = {"a": rnd.randrange(3), "b": rnd.randrange(3), "id": r}
        rows.append(tuple(d[c] for c in cols))
    return streams, ts, rows


def _local(query, spec, streams, ts, rows) -> Counter:
    """The local runtime's order and end of input (``finish``)."""
    order = sorted(range(len(rows)), key=lambda k: (ts[k], streams[k], k))
    cq = ContinuousQuery(query, "shed", "append", time_unit=1e-9,
                         **engine_options({"shed": spec}))
    out = cq.process([streams[k] for k in order], None,
                     [round(ts[k] * 1e9) for k in order], [rows[k] for k in order])
    out += cq.finish()
    return Counter(out)


def _oracle(query, streams, ts, rows) -> Counter:
    return _local(query, {"mode": "none"}, streams, ts, rows)


@settings(max_examples=examples(40), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**6), sql=st.sampled_from([TWO, THREE]),
       mode=st.sampled_from(["selective", "partial", "random", "none"]),
       capacity=st.sampled_from([20.0, 60.0, 200.0, 5000.0]),
       gamma=st.sampled_from([0.1, 0.5]))
def test_groups_shed_exactly_as_the_local_join(seed, sql, mode, capacity, gamma):
    """Virtual clock, one group (the query's one hash class is not split: shedding is per
    group): micro-batches, rebuilds and stale workers at random, the same output as the
    local join, result for result."""
    query = parse_query(sql, SCHEMAS)
    rnd = random.Random(seed)
    streams, ts, rows = _workload(query, rnd.randint(20, 160), rnd)
    spec = {"mode": mode, "capacity": capacity}
    if mode != "none":  # (mode none draws nothing at random: a seed is refused)
        spec["seed"] = seed % 97
    if mode in ("selective", "partial"):
        spec.update(gamma=gamma, T_r=0.5)
    if mode == "selective":  # (partial has no time correlation: T_c is refused)
        spec["T_c"] = 0.5
    n = len(rows)
    cuts = sorted(rnd.sample(range(1, n), rnd.randint(0, 6)))
    rebuild_at = set(rnd.sample(range(len(cuts) + 1), rnd.randint(0, len(cuts) + 1)))
    groups: list = []
    got = run_groups(query, plan_split(query, 1), "append", streams, ts, rows, cuts,
                     rebuild_at, rnd, workers=rnd.choice([1, 2]), executor="shed",
                     options={"shed": spec}, groups=groups)
    assert got == _local(query, spec, streams, ts, rows)
    assert not got - _oracle(query, streams, ts, rows)  # no false results, no duplicates
    assert groups[0].cq.executor.restore_mismatches == 0


def test_a_budget_per_micro_batch_moves_r_and_survives_rebuilds():
    """``--capacity wall --trigger``: a budget far below any batch's CPU time halves r (at
    least) every micro-batch down to its floor, across rebuilds at every batch; the sampled
    tuples still run fully, and every result is a true one."""
    query = parse_query(TWO, SCHEMAS)
    rnd = random.Random(3)
    streams, ts, rows = _workload(query, 1200, rnd)
    cuts = list(range(100, 1200, 100))
    for mode in ("selective", "partial", "random"):
        spec = {"mode": mode, "capacity": "wall", "budget": 1e-9, "seed": 1}
        groups: list = []
        got = run_groups(query, plan_split(query, 1), "append", streams, ts, rows, cuts,
                         set(range(len(cuts) + 1)), rnd, executor="shed",
                         options={"shed": spec}, groups=groups)
        ex = groups[0].cq.executor
        rep = ex.report()
        assert rep["rate_steps"] == len(cuts) + 1, mode  # one per micro-batch, kept
        assert rep["fraction_r_min"] == R_MIN and rep["capacity"] == "batch"
        assert not got - _oracle(query, streams, ts, rows)
        assert sum(got.values()) < sum(_oracle(query, streams, ts, rows).values())
        if mode == "random":  # the kept share of arrivals is r: most are dropped
            assert sum(ex.drops) > len(rows) // 2 and ex.buffers == [[], []] or \
                all(not b for b in ex.buffers)
        else:
            assert sum(ex.drops) == 0 and ex.results == sum(got.values())


def test_micro_batch_rate_is_algorithm_1_per_batch():
    assert micro_batch_rate(1.0, 2.0, 1.0, 1.2) == (0.5, 0.5)
    assert micro_batch_rate(0.5, 0.5, 1.0, 1.2) == (pytest.approx(0.6), 1.0)
    assert micro_batch_rate(0.9, 0.0, 1.0, 1.2) == (1.0, 1.0)
    with pytest.raises(OptionError, match="budget"):
        micro_batch_rate(1.0, 1.0, 0.0, 1.2)
    with pytest.raises(OptionError, match="seconds"):
        micro_batch_rate(1.0, float("nan"), 1.0, 1.2)


def test_spark_shedding_options_are_checked_on_the_driver():
    assert spark_shed_spec({"mode": "selective", "capacity": "wall", "interval": 2.0},
                           groups=4, cores=2)["budget"] == 1.0  # half a core each
    assert spark_shed_spec({"mode": "partial", "capacity": "wall", "interval": 2.0},
                           groups=1, cores=8)["budget"] == 2.0
    assert "capacity" not in spark_shed_spec({"mode": "none", "capacity": "wall",
                                              "interval": 1}, groups=1, cores=1)
    assert spark_shed_spec({"mode": "selective", "capacity": 500}, 2, 2) == {
        "mode": "selective", "capacity": 500}
    for spec, match in (
            ({"mode": "selective", "capacity": "wall"}, "needs the trigger interval"),
            ({"mode": "selective", "capacity": 500, "interval": 1}, "is not used"),
            ({"mode": "selective", "capacity": "wall", "interval": -1}, "positive"),
            ({"mode": "selective", "utility": "CASE a WHEN 1 THEN 2 END"}, "--utility"),
            ({"mode": "selective", "budget": 1}, "set by the Spark runtime"),
            ({"mode": "selective", "capacity": "wall", "interval": 1, "buffer": 2},
             "no input buffer")):
        with pytest.raises(OptionError, match=match):
            spark_shed_spec(spec, 1, 1)
    with pytest.raises(OptionError, match="partial or selective"):
        ShedController("random")  # random shedding has no controller on the local clock


# ----- on Spark ----------------------------------------------------------------------------


def _files(wl, root, parts: int) -> dict:
    """Each stream's table as ``parts`` Parquet files in time order, their modification
    times a second apart (Spark's file source reads them oldest first)."""
    import os

    import pyarrow.parquet as pq
    srcs = {}
    for name, table in wl.tables.items():
        d = root / name
        d.mkdir()
        step = -(-table.num_rows // parts)
        for j in range(parts):
            f = d / f"part-{j}.parquet"
            pq.write_table(table.slice(j * step, step), f)
            os.utime(f, (1e9 + j, 1e9 + j))
        srcs[name] = str(d)
    return srcs


def _pairs(table) -> Counter:
    return Counter(zip(*(table.column(c).to_pylist() for c in ("r", "s")), strict=True))


def test_spark_groups_shed_as_the_local_join(spark, tmp_path):
    """A set-overlap join on Spark, five micro-batches: on the virtual clock it sheds exactly
    as the local run; with a budget per micro-batch r falls and every result is true; an
    equality next to the overlap splits it into two groups, exact without shedding."""
    import pyarrow.parquet as pq

    import adaptcq
    from adaptcq.runtime.spark import run_files
    from adaptcq.stream.shed_workload import shed_two_way
    wl = shed_two_way(duration=12.0, rate=60.0, window=4.0, threshold=2, seed=4)
    srcs = _files(wl, tmp_path, 5)
    shed = {"mode": "selective", "capacity": 3000, "seed": 2, "T_r": 1.0, "T_c": 1.0}
    local = adaptcq.run(wl.sql, srcs, shed=shed)
    assert local.stats["buffer_drops"]["R"] + local.stats["buffer_drops"]["S"] > 0
    oracle = _pairs(adaptcq.run(wl.sql, srcs).table)

    run = run_files(spark, wl.sql, srcs, str(tmp_path / "ck"), str(tmp_path / "out"),
                    partitions=1, max_files_per_trigger=1, shed=shed)
    got = _pairs(pq.read_table(tmp_path / "out"))
    assert run.executor == "shed" and run.batches >= 5
    assert got == _pairs(local.table) and not got - oracle
    assert run.shedding["buffer_drops"] == local.stats["buffer_drops"]

    wall = {"mode": "selective", "capacity": "wall", "seed": 2}
    run = run_files(spark, wl.sql, srcs, str(tmp_path / "ck2"), str(tmp_path / "out2"),
                    partitions=1, max_files_per_trigger=1, trigger=1e-4, shed=wall)
    got = _pairs(pq.read_table(tmp_path / "out2"))
    assert not got - oracle and run.shedding["fraction_r_min"] < 1
    assert run.shedding["rate_steps"] >= 5 and sum(got.values()) < sum(oracle.values())

    # An equality next to the overlap: shares split the join into two groups.
    import pyarrow.compute as pc
    wl.tables = {n: t.append_column("k", pc.bit_wise_and(t.column("id"), 1))
                 for n, t in wl.tables.items()}
    sql = wl.sql.replace("WHERE ", "WHERE R.k = S.k AND ")
    keyed = tmp_path / "keyed"
    keyed.mkdir()
    srcs = _files(wl, keyed, 2)
    run = run_files(spark, sql, srcs, str(tmp_path / "ck3"), str(tmp_path / "out3"),
                    partitions=2)
    assert run.executor == "shed" and len(run.groups) == 2
    assert _pairs(pq.read_table(tmp_path / "out3")) == _pairs(adaptcq.run(sql, srcs).table)


def test_the_command_line_refuses_spark_shedding_options_before_spark_starts(tmp_path,
                                                                            capsys):
    from adaptcq.cli import main
    from adaptcq.stream.shed_workload import shed_two_way
    wl = shed_two_way(duration=2.0, rate=20.0, window=1.0, seed=1)
    srcs = _files(wl, tmp_path, 1)
    base = ["run", "--engine", "spark", "--sql", wl.sql, "--input", f"R={srcs['R']}",
            "--input", f"S={srcs['S']}", "--shed", "selective", "--output",
            str(tmp_path / "out")]
    for extra, message in (
            (["--capacity", "wall"], "needs the trigger interval"),
            (["--capacity", "9", "--utility", "CASE v WHEN 1 THEN 2 END"], "--utility"),
            (["--capacity", "9", "--executor", "mjoin"], "not mjoin"),
            (["--capacity", "wall", "--trigger", "1", "--buffer", "2"], "no input buffer")):
        assert main(base + extra) == 1
        assert message in capsys.readouterr().err.replace("\n", " ")
    assert main(base[:2] + ["local"] + base[3:] + ["--trigger", "1"]) == 1
    assert "need --engine spark" in capsys.readouterr().err.replace("\n", " ")


def test_a_quiet_stream_does_not_hold_the_expiry_frontier_back():
    """A stream that stops arriving: its expired rows leave its basic windows (the newest
    one too) at the next probe, so the frontier by which a Spark group forgets its stored
    rows follows the other stream instead of staying at the quiet one's last row."""
    query = parse_query(TWO, SCHEMAS)
    cq = ContinuousQuery(query, "shed", "append", time_unit=1e-9, track=True,
                         **engine_options({"shed": {"mode": "selective", "capacity": 1e6,
                                                    "T_r": 1.0, "T_c": 1.0}}))
    streams = [1] * 5 + [0] * 600
    ts = [k * 0.1 for k in range(5)] + [k * 0.1 for k in range(600)]
    order = sorted(range(len(ts)), key=lambda k: (ts[k], streams[k]))
    cq.process([streams[k] for k in order], None, [round(ts[k] * 1e9) for k in order],
               [(k % 3, k) for k in order])
    ex = cq.executor
    assert sum(len(bw) for bw in ex.windows[1]) == 0  # S's rows all left
    now = round(59.9 * 1e9)
    assert ex.frontier(now) >= now - round(3e9)  # within a window of the newest arrival
