"""Fixes of the CACQ eddy found by fuzzing (docs/cacq.md): shared SteM retention when the
query set changes, a UDF raising at a start="window" registration, checkpoints of the
``advance_to`` watermark and of ``retain``, and ``routing_options={"seed": ...}``."""

from __future__ import annotations

import math
from collections import Counter

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import adaptcq
from adaptcq.adapt.routing import make_routing, restore_routing
from adaptcq.engine.eddy import Eddy
from adaptcq.errors import OptionError
from adaptcq.query.cql import parse_query
from conftest import examples
from test_eddy import check, run_eddy
from test_eddy_window_start import RETAIN, run_scenario, window_expected
from test_engine_multi import expected, tables

WINDOWS = ("", " [ROWS 1]", " [ROWS 3]", " [RANGE 0 SECONDS]", " [RANGE 2.5 SECONDS]",
           " [RANGE 10 SECONDS]", " [RANGE 10 SECONDS]")


@st.composite
def sharing_query(draw):
    """A query over R and S only, so that queries share SteMs: one or two aliases, a
    self-join often, every window kind (unbounded, [ROWS n], [RANGE w]) on either alias."""
    n = draw(st.sampled_from([1, 2, 2]))
    srcs = [draw(st.sampled_from("RS")) for _ in range(n)]
    items = [f"{s}{draw(st.sampled_from(WINDOWS))} AS x{i}" for i, s in enumerate(srcs)]
    where = f" WHERE x0.{draw(st.sampled_from('ab'))} = x1.a" if n == 2 else ""
    if draw(st.integers(0, 3)) == 0:
        where += (" AND " if where else " WHERE ") + "x0.c IS NOT NULL"
    return f"SELECT * FROM {', '.join(items)}{where}"


@st.composite
def unbounded_and_rows(draw):
    """A self-join with an unbounded and a [ROWS n] alias: its removal changes two
    retentions of the source at once (the shape of the fuzzer's finding)."""
    src = draw(st.sampled_from("RS"))
    wins = draw(st.permutations(["", f" [ROWS {draw(st.integers(1, 4))}]"]))
    return f"SELECT * FROM {src}{wins[0]} AS x0, {src}{wins[1]} AS x1 WHERE x0.a = x1.a"


@st.composite
def sharing_arrivals(draw, max_size=24):
    out, t = [], 0.0
    for _ in range(draw(st.integers(1, max_size))):
        t += draw(st.sampled_from([0.5, 1, 1, 2.5]))   # (distinct times: no tie rule)
        out.append((draw(st.sampled_from("RS")), t,
                    (draw(st.integers(0, 1)), draw(st.integers(0, 1)),
                     draw(st.sampled_from([None, 0, 1])), "x")))
    return out


@st.composite
def churn(draw):
    """Queries with mixed windows over shared sources: one running throughout, the others
    (one of them an unbounded + [ROWS n] self-join) added and removed at random arrivals
    (intervals (lo, hi] of arrival positions)."""
    data = draw(sharing_arrivals())
    n = len(data)
    queries = [(draw(sharing_query()), 0, n + 1)]
    for k in range(draw(st.integers(1, 3))):
        lo = draw(st.integers(0, n))
        sql = draw(unbounded_and_rows() if k == 0 else sharing_query())
        queries.append((sql, lo, draw(st.integers(lo, n + 1))))
    return (data, queries, draw(st.sampled_from(["append", "retract"])),
            draw(st.sampled_from([("tickets", None), ("random", 1)])), draw(st.integers(0, 3)))


@settings(max_examples=examples(200), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(churn(), st.one_of(st.none(), st.integers(0, 24)))
def test_removing_queries_keeps_the_rows_the_others_need(scenario, snapshot_at):
    """Each query equals the oracle on it alone over its interval, whichever queries over
    its sources come and go meanwhile (found: removing a query reading S unbounded and over
    [ROWS 3] evicted S's rows from the SteM that another's [RANGE 10] still held)."""
    data, queries, mode, routing, seed = scenario
    outs, ed = run_eddy(queries, data, mode, routing, seed, snapshot_at=snapshot_at)
    check(queries, data, mode, outs)
    # ... and the rows do leave once no query needs them (memory stays bounded).
    for h in list(ed.queries):
        ed.remove_query(h)
    ed.advance_to(1e9)
    assert {n: len(s.stem) for n, s in ed.sources.items()} == {"R": 0, "S": 0, "T": 0}


@st.composite
def churn_then_window(draw):
    """With ``retain``: queries of mixed windows come and go, and a start="window" query
    registers at a random time (it must see every earlier row)."""
    data = draw(sharing_arrivals(max_size=16))
    times = sorted({t for _, t, _ in data})
    queries = []
    for k in range(draw(st.integers(1, 3))):
        at = draw(st.sampled_from([None, *times]))
        end = draw(st.sampled_from([None, *[t + 0.25 for t in times if at is None or t >= at]]))
        queries.append((draw(unbounded_and_rows() if k == 0 else sharing_query()), "now",
                        at, end))
    reg = draw(st.sampled_from(times)) + 0.5
    if queries[0][3] is not None and draw(st.booleans()):
        reg = queries[0][3] + 0.125   # just after the self-join's removal
    queries.append((draw(sharing_query()), "window", reg, None))
    return data, queries, draw(st.sampled_from(["append", "retract"]))


@settings(max_examples=examples(150), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(churn_then_window())
def test_retained_rows_survive_query_churn(scenario):
    data, queries, mode = scenario
    engine = adaptcq.Engine(tables(data), "ts", mode=mode, retain={"R": RETAIN, "S": RETAIN})
    handles = run_scenario(engine, queries)
    events = [t for _, _, at, end in queries for t in (at, end) if t is not None]
    for h, (sql, start, at, end) in zip(handles, queries, strict=True):
        assert h.state != "failed", h.error   # (distinct times: no tie rule applies)
        lo, hi = -math.inf if at is None else at, math.inf if end is None else end
        until = max((t for t in events if lo <= t <= hi), default=hi)
        got = Counter(tuple(r.values()) for r in h.table().to_pylist())
        if start == "window":
            want = window_expected(sql, data, at, hi, mode, None, until)
        else:
            want = expected(sql, data, lo, hi, mode, until)
        assert got == want, f"{sql} {start} [{at}, {end}) {mode}: missing {want - got}, " \
                            f"extra {got - want}"


S1 = pa.table({"ts": [1.0, 2.0], "id": [1, 2], "k": [7, 7]})
R1 = pa.table({"ts": [3.0], "id": [10], "k": [7]})
RANGE_Q = "SELECT S.id AS sid, R.id AS rid FROM S [RANGE 10 SECONDS], R WHERE S.k = R.k"
SELF_Q = "SELECT x.id AS a, y.id AS b FROM S [ROWS 3] AS x, S AS y WHERE x.k = y.k"


def _pairs(h):
    t = h.table()
    return sorted(zip(t.column("sid").to_pylist(), t.column("rid").to_pylist(),
                      t.column("_sign").to_pylist(), strict=True))


@pytest.mark.parametrize("mode", ["append", "retract"])
def test_removing_an_unbounded_self_join_keeps_the_range_querys_rows(mode):
    engine = adaptcq.Engine({"S": S1, "R": R1}, "ts", mode=mode)
    ha = engine.register(RANGE_Q)
    engine.deregister(engine.register(SELF_Q), at=2.5)
    engine.run()
    assert _pairs(ha) == [(1, 10, 1), (2, 10, 1)]


def test_retained_rows_outlive_an_unbounded_query():
    engine = adaptcq.Engine({"S": S1, "R": R1}, "ts", retain={"S": 100})
    engine.deregister(engine.register(SELF_Q), at=2.5)
    hc = engine.register(RANGE_Q, at=2.7, start="window")
    engine.run()
    assert _pairs(hc) == [(1, 10, 1), (2, 10, 1)]


def test_a_window_query_keeps_rows_held_while_the_source_was_unbounded():
    """W registers with start="window" while U reads S unbounded; when U leaves, the rows
    W saw stay for W's [RANGE 10] (a time hold scheduled before U, for P's [RANGE 5],
    took them at 6 and 7 s)."""
    S = pa.table({"ts": [1.0, 2.0], "k": [7, 7]})
    R = pa.table({"ts": [8.0], "k": [7]})
    e = adaptcq.Engine({"S": S, "R": R}, "ts")
    e.register("SELECT S.k FROM S [RANGE 5 SECONDS]")
    u = e.register("SELECT S.k FROM S", at=3.0)
    w = e.register("SELECT S.ts AS sts, R.ts AS rts FROM S [RANGE 10 SECONDS], R "
                   "WHERE S.k = R.k", at=4.0, start="window")
    e.deregister(u, at=5.0)
    e.run()
    assert sorted((r["sts"], r["rts"]) for r in w.table().to_pylist()) == [(1.0, 8.0),
                                                                          (2.0, 8.0)]


def test_a_failed_self_join_keeps_the_other_querys_deletions():
    """The [ROWS 3] self-join stops at S's two rows of one time (the tie rule) and its
    removal must not take S's rows from the [RANGE 1] query (retract: its deletions)."""
    S = pa.table({"ts": [26.0, 27.0, 29.0], "id": [20, 22, 24]})
    R = pa.table({"ts": [27.0], "id": [21]})
    a = "SELECT S.id FROM S [RANGE 1 SECONDS]"
    b = ("SELECT * FROM S [ROWS 3] AS x0, R AS x1, S AS x2 "
         "WHERE x0.id = x1.id AND x1.id = x2.id")
    outs = []
    for with_b in (False, True):
        e = adaptcq.Engine({"R": R, "S": S}, "ts", mode="retract")
        ha = e.register(a)
        if with_b:
            e.register(b)
        e.run()
        outs.append(sorted((r["id"], r["_sign"], r["_ts"]) for r in ha.table().to_pylist()))
    assert outs[1] == outs[0]
    assert (20, -1, 27.0) in outs[0]


def _boom(x):
    if x == 3:
        raise ValueError("three!")
    return x > 1


@pytest.mark.parametrize("mode", ["append", "retract"])
def test_a_udf_raising_on_a_held_row_fails_only_its_query(mode):
    """start="window" evaluates the new query's selection on the held rows: a UDF raising
    there fails that query alone, as on an arrival (docs/cacq.md, "Errors")."""
    S = pa.table({"ts": [1.0, 2.0, 3.0, 4.0], "a": [1, 3, 2, 5]})
    R = pa.table({"ts": [3.5], "a": [2]})
    e = adaptcq.Engine({"S": S, "R": R}, "ts", mode=mode, udfs={"boom": _boom},
                       retain={"S": 100})
    good = e.register("SELECT S.a FROM S [RANGE 1 SECONDS]")
    bad = e.register("SELECT R.a AS r FROM R, S [RANGE 5 SECONDS] WHERE R.a = S.a "
                     "AND boom(S.a)", at=2.5, start="window")
    later = e.register("SELECT S.a FROM S", at=2.6, start="window")
    e.run()
    alone = adaptcq.Engine({"S": S, "R": R}, "ts", mode=mode, retain={"S": 100})
    want = [alone.register("SELECT S.a FROM S [RANGE 1 SECONDS]"),
            alone.register("SELECT S.a FROM S", at=2.6, start="window")]
    alone.run()
    assert bad.state == "failed" and bad.table().num_rows == 0
    assert "UDF 'boom' raised ValueError: three!" in bad.error
    assert "held when it registered with start='window'" in bad.error
    for h, w in zip((good, later), want, strict=True):
        assert h.state != "failed"
        assert h.table().to_pylist() == w.table().to_pylist()
    assert [r["a"] for r in later.table().to_pylist()] == [2, 5]


def _advance_then_register(snap: bool) -> dict:
    sch = {"S": {"ts": "number", "a": "number"}}

    def parse(sql):
        return parse_query(sql, sch)
    outs = {"A": [], "B": []}
    ed = Eddy(sch, make_routing("tickets"), mode="retract", retain={"S": 10.0})
    ed.add_query("A", parse("SELECT S.a FROM S [RANGE 1 SECONDS]"), outs["A"].append)
    ed.process("S", 1.0, (1.0, 1))
    ed.advance_to(3.0)   # A's deletion of the row, due at 2, done
    if snap:
        state = ed.snapshot()
        ed = Eddy.restore(state, sch, restore_routing(state["policy"]), parse,
                          {k: v.append for k, v in outs.items()})
    ed.add_query("B", parse("SELECT S.a FROM S [RANGE 1 SECONDS]"), outs["B"].append, "window")
    ed.process("S", 3.5, (3.5, 2))
    ed.advance_to(10.0)
    return outs


def test_a_checkpoint_keeps_the_advance_to_watermark():
    """Restored after an advance_to, a start="window" registration scheduled the held
    row's deletion again, done before the checkpoint: A got its retraction twice."""
    want = _advance_then_register(False)
    assert want["A"] == [(1, 1, 1.0), (1, -1, 2.0), (2, 1, 3.5), (2, -1, 4.5)]
    assert _advance_then_register(True) == want


def test_a_checkpoint_without_the_watermark_still_restores():
    sch = {"S": {"ts": "number", "a": "number"}}
    ed = Eddy(sch, make_routing("tickets"))
    ed.advance_to(3.0)
    state = ed.snapshot()
    assert state["advanced"] == 3.0
    del state["advanced"]   # (written before it was kept)
    ed = Eddy.restore(state, sch, restore_routing(state["policy"]),
                      lambda sql: parse_query(sql, sch), {})
    assert ed._done_until() == -math.inf


@pytest.mark.parametrize("restored", [False, True])
def test_retain_holds_rows_after_a_restore_with_no_query(restored):
    sch = {"S": {"ts": "number", "k": "number"}, "R": {"ts": "number", "k": "number"}}
    sql = "SELECT x.ts AS sts, y.ts AS rts FROM S [RANGE 5 SECONDS] AS x, R AS y WHERE x.k = y.k"
    out = []
    ed = Eddy(sch, make_routing("tickets"), retain={"S": 10.0})
    if restored:   # a checkpoint before any query is registered
        state = ed.snapshot()
        ed = Eddy.restore(state, sch, restore_routing(state["policy"]),
                          lambda q: parse_query(q, sch), {})
    ed.process("S", 1.0, (1.0, 7))   # held for retain only
    assert len(ed.sources["S"].stem) == 1
    ed.add_query("q", parse_query(sql, sch), out.append, "window")
    ed.process("R", 2.0, (2.0, 7))
    assert out == [(1.0, 2.0, 1, 2.0)]


@pytest.mark.parametrize("routing", ["tickets", "lottery", "random", "fixed"])
def test_seed_as_a_routing_option_is_refused(routing):
    S = pa.table({"ts": [1.0, 2.0], "a": [1, 2]})
    with pytest.raises(OptionError, match=r"routing_options=\{'seed': 3\}: give the seed "
                                          r"with the seed= option"):
        adaptcq.Engine({"S": S}, "ts", routing=routing, routing_options={"seed": 3})
    if routing == "fixed":  # (it draws nothing at random: seed= is refused too)
        with pytest.raises(OptionError, match="draws nothing at random"):
            adaptcq.Engine({"S": S}, "ts", routing=routing, seed=3)
        return
    e = adaptcq.Engine({"S": S}, "ts", routing=routing, seed=3)   # the way to give it
    h = e.register("SELECT S.a FROM S")
    e.run()
    assert h.table().column("a").to_pylist() == [1, 2]
