"""``register(sql, start="window")`` (docs/cacq.md, "What a query sees") against the oracle:
the query sees the rows held when it registers, for the rows that arrive after it; a result
made only of held rows is never emitted, so in retract mode it is never retracted either
(each −1 of a query takes back an earlier +1 of that query)."""

from __future__ import annotations

import math
import re
from collections import Counter

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import adaptcq
from conftest import examples
from test_eddy import a_query, arrivals
from test_engine_multi import expected, tables

RETAIN = 1000.0   # beyond any generated time span: every earlier row is held


def window_expected(sql: str, data, reg: float, end: float, mode: str) -> Counter:
    """The oracle for a query registered at ``reg`` with ``start="window"`` (every earlier
    row held): its results over all arrivals until ``end`` less those made only of rows
    before ``reg`` (with both signs: [RANGE w] and unbounded windows, whose departures do
    not depend on later arrivals)."""
    full = expected(sql, data, -math.inf, end, mode)
    held = expected(sql, [d for d in data if d[1] < reg], -math.inf, end, mode)
    assert not held - full, (sql, held - full)
    return full - held


@st.composite
def window_scenarios(draw):
    data = draw(arrivals(max_size=24))
    times = sorted({t for _, t, _ in data}) or [0.0]
    # [ROWS n] left out: a count window's departure depends on the arrivals after it.
    rows = re.compile(r"\[ROWS (\d+)\]")
    queries = []
    for i in range(draw(st.integers(1, 3))):
        sql = rows.sub(r"[RANGE \1 SECONDS]", draw(a_query()))
        start = "window" if i == 0 else draw(st.sampled_from(["now", "window"]))
        at = draw(st.sampled_from(times))
        end = draw(st.sampled_from([None, *[t for t in times if t >= at], times[-1] + 0.5]))
        queries.append((sql, start, at, end))
    return (data, queries, draw(st.sampled_from(["retract", "append"])),
            draw(st.sampled_from([None, 2])))


@settings(max_examples=examples(150), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(window_scenarios())
def test_window_start_queries_equal_the_oracle(scenario):
    data, queries, mode, epoch = scenario
    engine = adaptcq.Engine(tables(data), "ts", mode=mode, routing_epoch=epoch,
                            retain={s: RETAIN for s in "RST"})
    handles = []
    for sql, start, at, end in queries:
        h = engine.register(sql, at=at, start=start)
        if end is not None:
            engine.deregister(h, at=end)
        handles.append(h)
    engine.run()
    for h, (sql, start, at, end) in zip(handles, queries, strict=True):
        got = Counter(tuple(r.values()) for r in h.table().to_pylist())
        end = math.inf if end is None else end
        want = (window_expected(sql, data, at, end, mode) if start == "window"
                else expected(sql, data, at, end, mode))
        assert got == want, f"{sql} {start} [{at}, {end}) {mode}: missing {want - got}, " \
                            f"extra {got - want}"


def test_window_start_retracts_only_what_it_emitted():
    """A result of two held rows (R@1 and S@1.5) was retracted at R@1's departure though
    never emitted: its net count went to −1 (found by fuzzing)."""
    R = pa.table({"ts": [1.0, 2.0, 6.0], "k": [1, 1, 1]})
    S = pa.table({"ts": [1.5, 5.0, 7.0], "k": [1, 1, 1]})
    sql = ("SELECT R.ts AS rt, S.ts AS st FROM R [RANGE 3 SECONDS], S [RANGE 3 SECONDS] "
           "WHERE R.k = S.k")
    for epoch in (None, 1):
        e = adaptcq.Engine({"R": R, "S": S}, "ts", mode="retract", routing_epoch=epoch,
                           retain={"R": 10, "S": 10})
        h = e.register(sql, at=3.0, start="window")
        e.run()
        got = sorted(tuple(r.values()) for r in h.table().to_pylist())
        assert got == [(2.0, 5.0, -1, 5.0), (2.0, 5.0, 1, 5.0), (6.0, 5.0, 1, 6.0),
                       (6.0, 7.0, 1, 7.0)]


def test_window_start_deletes_held_rows_another_query_does_not_see():
    """A held row built before any query had the window got no deletion for a
    start="window" query when a query registered since (which does not see the row) had
    the same window: the window query's result with it was never retracted."""
    R = pa.table({"ts": [0.5, 5.0], "k": [1, 1]})
    S = pa.table({"ts": [2.0, 6.0], "k": [1, 1]})
    sql = "SELECT R.ts AS rt, S.ts AS st FROM R [RANGE 2 SECONDS], S WHERE R.k = S.k"
    for epoch in (None, 1):
        e = adaptcq.Engine({"R": R, "S": S}, "ts", mode="retract", routing_epoch=epoch,
                           retain={"R": 100, "S": 100})
        e.register(sql, at=1.0)
        h = e.register(sql, at=1.5, start="window")
        e.run()
        got = sorted(tuple(r.values()) for r in h.table().to_pylist())
        assert got == [(0.5, 2.0, -1, 2.5), (0.5, 2.0, 1, 2.0), (5.0, 2.0, 1, 5.0),
                       (5.0, 6.0, 1, 6.0)]
