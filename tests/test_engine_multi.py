"""``adaptcq.Engine``: many queries registered and removed by control events ordered with
the data by timestamp (docs/cacq.md, "What a query sees"), each with its own output; the
CLI (``adaptcq run --executor eddy``) and ``adaptcq explain --executor eddy``; errors."""

from __future__ import annotations

import itertools
import math
import re
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import adaptcq
from adaptcq.cli import main
from adaptcq.errors import InputError, OptionError, QueryError
from adaptcq.query.cql import parse_query
from conftest import examples
from oracle import Oracle
from test_eddy import a_query

COLS = ("a", "b", "c", "d")
KINDS = {"ts": "number", "a": "number", "b": "number", "c": "number", "d": "string"}
SOURCES = ("R", "S", "T")


def tables(data) -> dict[str, pa.Table]:
    out = {}
    for s in SOURCES:
        rows = [(t, *row) for src, t, row in data if src == s]
        out[s] = pa.table({"ts": pa.array([r[0] for r in rows], pa.float64()),
                           "a": pa.array([r[1] for r in rows], pa.int64()),
                           "b": pa.array([r[2] for r in rows], pa.int64()),
                           "c": pa.array([r[3] for r in rows], pa.int64()),
                           "d": pa.array([r[4] for r in rows], pa.string())})
    return out


def merged(data) -> list:
    """The engine's arrival order: (timestamp, source position, row position)."""
    pos = Counter()
    keyed = []
    for src, t, row in data:
        keyed.append((t, SOURCES.index(src), pos[src], src, row))
        pos[src] += 1
    return [(src, t, row) for t, _, _, src, row in sorted(keyed)]


def expected(sql: str, data, start: float, end: float, mode: str,
             until: float | None = None) -> Counter:
    """The oracle on ``sql`` alone over the arrivals with start <= ts < end, time then
    advanced to ``until`` (default ``end``: the last control event while the query runs,
    docs/cacq.md); rows as the engine's output rows (values, _sign, _ts)."""
    until = end if until is None else until
    schemas = {s: KINDS for s in SOURCES}
    q = parse_query(sql, schemas)
    streams, ts, rows = [], [], []
    for src, t, row in merged(data):
        if not start <= t < end:
            continue
        mine = [i for i, s in enumerate(q.streams) if s.source == src]
        if not mine:
            streams.append(None)
            ts.append(t)
            rows.append(None)
        full = dict(zip(("ts", *COLS), (t, *row), strict=True))
        for i in mine:
            streams.append(i)
            ts.append(t)
            rows.append(tuple(full[c] for c in q.columns[q.streams[i].alias]))
    if math.isfinite(until) and until >= max(ts, default=-math.inf):
        streams.append(None)
        ts.append(until)
        rows.append(None)
    total: Counter = Counter()
    for c in Oracle(q, mode).run(streams, None, ts, rows)[1]:
        total.update(c)
    return total


@st.composite
def engine_scenarios(draw):
    from test_eddy import arrivals
    data = draw(arrivals(max_size=24))
    times = sorted({t for _, t, _ in data}) or [0.0]
    queries = []
    for _ in range(draw(st.integers(1, 3))):
        sql = draw(a_query())
        start = draw(st.sampled_from([None, *times]))
        end = draw(st.sampled_from([None, *times, times[-1] + 0.5]))
        if start is not None and end is not None and end < start:
            start, end = end, start
        queries.append((sql, start, end))
    return data, queries, draw(st.sampled_from(["append", "retract"])), \
        draw(st.sampled_from([None, 2]))


@settings(max_examples=examples(60), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(engine_scenarios())
def test_engine_control_events_by_timestamp(scenario):
    data, queries, mode, epoch = scenario
    engine = adaptcq.Engine(tables(data), "ts", mode=mode, routing_epoch=epoch)
    handles = []
    for sql, start, end in queries:
        h = engine.register(sql, at=start)
        if end is not None:
            engine.deregister(h, at=end)
        handles.append(h)
    engine.run()
    events = [t for _, start, end in queries for t in (start, end) if t is not None]
    for h, (sql, start, end) in zip(handles, queries, strict=True):
        got = Counter(tuple(r.values()) for r in h.table().to_pylist())
        lo, hi = -math.inf if start is None else start, math.inf if end is None else end
        # every control event while q runs advances its time (docs/cacq.md)
        until = max((t for t in events if lo <= t <= hi), default=hi)
        want = expected(sql, data, lo, hi, mode, until)
        assert got == want, f"{sql} [{start}, {end}) {mode}: missing {want - got}, " \
                            f"extra {got - want}"


def test_failing_udf_removes_only_its_query():
    def boom(x):
        if x == 3:
            raise ValueError("three!")
        return x > 1

    source = pa.table({"ts": [1.0, 2.0, 3.0, 4.0, 5.0], "a": [1, 2, 3, 4, 5]})
    engine = adaptcq.Engine({"S": source}, udfs={"boom": boom, "even": lambda x: x % 2 == 0})
    bad = engine.register("SELECT S.a FROM S WHERE boom(S.a)")
    good = engine.register("SELECT S.a FROM S WHERE even(S.a)")
    engine.run()
    assert bad.state == "failed" and "boom" in bad.error and "three!" in bad.error
    assert bad.table().column("a").to_pylist() == [2]          # until it raised
    assert good.state == "running"
    assert good.table().column("a").to_pylist() == [2, 4]      # nothing lost
    assert engine.stats["queries"]["q1"]["state"] == "failed"


def test_bad_queries_and_control_streams_are_named():
    src = {"S": pa.table({"ts": [1.0], "a": [1]})}
    engine = adaptcq.Engine(src)
    with pytest.raises(QueryError, match="unknown source 'U'|U"):
        engine.register("SELECT * FROM U")
    with pytest.raises(OptionError, match="no query 'zz' to deregister"):
        engine.deregister("zz")
    with pytest.raises(InputError, match="row 1: action 'drop'"):
        engine.load_control([{"ts": 0.0, "action": "register", "query_id": "a",
                              "sql": "SELECT * FROM S"},
                             {"ts": 1.0, "action": "drop", "query_id": "a", "sql": None}])
    with pytest.raises(InputError, match="deregisters 'b', which no earlier row registers"):
        adaptcq.Engine(src).load_control([{"ts": 0.0, "action": "deregister",
                                           "query_id": "b", "sql": None}])
    with pytest.raises(QueryError, match="control stream row 0 .query c."):
        adaptcq.Engine(src).load_control([{"ts": 0.0, "action": "register",
                                           "query_id": "c", "sql": "SELECT * FROM S WHERE"}])
    with pytest.raises(OptionError, match="unknown executor"):
        adaptcq.Engine(src, executor="nope")


def _write(tmp_path, data):
    paths = {}
    for name, t in tables(data).items():
        paths[name] = tmp_path / f"{name}.parquet"
        pq.write_table(t, paths[name])
    return paths


DATA = [("R", 0.0, (1, 0, 1, "x")), ("S", 0.5, (1, 2, 0, "y")), ("R", 1.0, (2, 0, 2, "x")),
        ("S", 1.5, (2, 2, 5, "z")), ("T", 2.0, (0, 2, 0, "x")), ("S", 6.0, (1, 2, 0, "y"))]


def test_cli_writes_one_output_per_query(tmp_path, capsys):
    paths = _write(tmp_path, DATA)
    q1 = "SELECT R.a AS ra, S.c AS sc FROM R [RANGE 2 SECONDS], S WHERE R.a = S.a"
    q2 = "SELECT S.a FROM S WHERE S.c > 0"
    (tmp_path / "q2.sql").write_text(q2)
    out = tmp_path / "out"
    inputs = [f"--input={n}={p}" for n, p in paths.items()]
    assert main(["run", "--executor", "eddy", "--sql", q1, "--sql", f"@{tmp_path / 'q2.sql'}",
                 *inputs, "--output", str(out), "--no-progress"]) == 0
    r1 = pq.read_table(out / "query_id=q1" / "part-0.parquet").to_pylist()
    r2 = pq.read_table(out / "query_id=q2" / "part-0.parquet").to_pylist()
    assert sorted((r["ra"], r["sc"]) for r in r1) == [(1, 0), (2, 5)]   # R@0 gone at 6
    assert [r["a"] for r in r2] == [2]
    ds = pq.ParquetDataset(out)   # readable as one dataset partitioned by query_id
    assert ds.files
    # A control stream: q3 registered at 1.0 and removed at 5.0 sees S@1.5 only.
    control = tmp_path / "control.csv"
    control.write_text("ts,action,query_id,sql\n"
                       "1.0,register,q3,SELECT S.a FROM S\n5.0,deregister,q3,\n")
    assert main(["run", "--executor", "eddy", "--queries", str(control), *inputs,
                 "--output", str(out), "--no-progress", "--routing", "lottery"]) == 0
    assert not (out / "query_id=q1").exists()     # an earlier run's queries are replaced
    r3 = pq.read_table(out / "query_id=q3" / "part-0.parquet").to_pylist()
    assert [(r["a"], r["_ts"]) for r in r3] == [(2, 1.5)]


# S's row 2 (time 1.0) comes after its row at 6.0: late by 5 s.
LATE = [*DATA[:-1], ("S", 6.0, (1, 2, 0, "y")), ("S", 1.0, (2, 2, 7, "w"))]


@pytest.mark.parametrize("callback", [False, True])
def test_late_rows_of_a_query_set_leave_as_they_are_found(tmp_path, callback):
    """A query set's late rows were kept in the engine as dicts for the whole run (memory
    growing with them) and written nowhere; they now go to ``on_rejected`` a chunk at a
    time, or to ``engine.rejected`` (a Table), named by file and row as ``adaptcq.run``
    names them."""
    paths = _write(tmp_path, LATE)
    got: list[pa.RecordBatch] = []
    eng = adaptcq.Engine(paths, "ts", on_rejected=got.append if callback else None)
    eng.register("SELECT S.a FROM S")
    eng.run()
    table = pa.Table.from_batches(got) if callback else eng.rejected
    rows = table.to_pylist()
    assert [(r["stream"], r["row"], r["ts"]) for r in rows] == [("S", 3, 1.0)]
    assert rows[0]["file"] == str(paths["S"]) and rows[0]["reason"].startswith("late")
    assert eng.stats["rejected"] == 1
    assert eng.rejected.num_rows == (0 if callback else 1)


def test_cli_writes_a_query_sets_rejected_rows(tmp_path, capsys):
    paths = _write(tmp_path, LATE)
    inputs = [f"--input={n}={p}" for n, p in paths.items()]
    out = tmp_path / "out"
    assert main(["run", "--executor", "eddy", "--sql", "SELECT S.a FROM S", *inputs,
                 "--output", str(out), "--no-progress"]) == 0
    rej = pq.read_table(tmp_path / "out.rejected.parquet").to_pylist()  # beside the folder
    assert [(r["stream"], r["row"]) for r in rej] == [("S", 3)]
    assert "wrote 1 rejected rows" in capsys.readouterr().out
    given = tmp_path / "late.csv"
    assert main(["run", "--executor", "eddy", "--sql", "SELECT S.a FROM S", *inputs,
                 "--output", str(out), "--rejected", str(given), "--no-progress"]) == 0
    assert "late by more than" in given.read_text()


def test_cli_refuses_what_a_query_set_cannot_take(tmp_path, capsys):
    paths = _write(tmp_path, DATA)
    inputs = [f"--input={n}={p}" for n, p in paths.items()]
    assert main(["run", "--executor", "eddy", "--sql", "SELECT * FROM S", *inputs,
                 "--output", str(tmp_path / "o"), "--order", "S:R"]) == 1
    assert "--order: not for --executor eddy" in capsys.readouterr().err
    assert main(["run", "--sql", "SELECT * FROM S", "--sql", "SELECT * FROM R",
                 *inputs]) == 1
    assert "2 --sql options" in capsys.readouterr().err
    assert main(["run", "--sql", "SELECT * FROM S", "--routing", "random", *inputs]) == 1
    assert "--routing is for --executor eddy" in capsys.readouterr().err


def test_explain_shows_shared_operators_and_masks(tmp_path, capsys):
    paths = _write(tmp_path, DATA)
    inputs = [f"--input={n}={p}" for n, p in paths.items()]
    assert main(["explain", "--executor", "eddy", "--sql",
                 "SELECT * FROM R, S WHERE R.a = S.a AND S.c > 0", "--sql",
                 "SELECT * FROM S WHERE S.c > 3", *inputs, "--code"]) == 0
    text = capsys.readouterr().out
    for part in ("GF S.c", "SteM R", "virtual sources", "R⋈S", "q1", "q2",
                 "completion mask", "compiled route of S#0", "def route("):
        assert part in text


@pytest.mark.parametrize("executor", ["eddy", "eddies"])
def test_a_self_join_over_rows_windows_stops_before_rows_of_one_time(executor):
    """docs/semantics.md orders rows of equal time by FROM position: a self-join's first
    alias gets all of them before its second, and a [ROWS n] window's contents depend on
    it. A shared engine gets each row once, for both aliases: the query stops, naming
    why, before the first such row (nothing wrong emitted), while other queries and
    rows of distinct times go on as ``adaptcq.run``'s."""
    sql = ("SELECT r1.id AS a, r2.id AS b FROM R [ROWS 1] AS r1, R [ROWS 1] AS r2 "
           "WHERE r1.k = r2.k")
    plain = "SELECT r.id AS a FROM R r WHERE r.k = 1"
    for times, tie in (([1, 2, 3, 4], False), ([1, 2, 2, 3], True)):
        R = pa.table({"ts": times, "k": [1, 1, 1, 1], "id": [0, 1, 2, 3]})
        engine = adaptcq.Engine({"R": R}, executor=executor)
        h, other = engine.register(sql), engine.register(plain)
        engine.run()
        assert other.state == "running" and other.table().num_rows == 4
        want = adaptcq.run(sql, {"R": R}, executor="mjoin").table.to_pylist()
        got = h.table().to_pylist()
        if tie:
            assert h.state == "failed" and "same time (2 s" in h.error
            assert "[ROWS n]" in h.error
            assert got == want[:len(got)] and len(got) < len(want)
            assert all(r["_ts"] < 2 for r in got)
        else:
            assert h.state == "running" and got == want


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_rows_windows_and_ties_across_sources_stop_or_equal_adaptcq_run(data):
    """A shared engine takes rows of equal time in the order of its sources, for every
    query; docs/semantics.md orders them by the query's FROM, and a [ROWS n] window's
    contents depend on it. A query whose FROM orders such a pair of sources otherwise stops
    before the first tie, its results so far a prefix of ``adaptcq.run``'s; every other
    query equals it (found by fuzzing: the eddy emitted a result adaptcq run does not)."""
    n = data.draw(st.integers(2, 6))
    names = ["R", "S", "T"]
    tabs = {x: pa.table({"ts": sorted(data.draw(st.lists(st.integers(0, 3), min_size=n,
                                                              max_size=n))),
                         "k": data.draw(st.lists(st.integers(0, 1), min_size=n, max_size=n)),
                         "id": list(range(n))}) for x in names}
    order = data.draw(st.permutations(names))
    engine = adaptcq.Engine({x: tabs[x] for x in order},
                            executor=data.draw(st.sampled_from(["eddy", "eddies"])))
    queries = []
    for _ in range(3):
        streams = data.draw(st.permutations(names))[:data.draw(st.integers(2, 3))]
        windows = [data.draw(st.sampled_from(["", " [ROWS 1]", " [ROWS 2]", " [RANGE 1]"]))
                   for _ in streams]
        sql = (f"SELECT {', '.join(f'{x}.id AS {x.lower()}' for x in streams)} FROM "
               + ", ".join(x + w for x, w in zip(streams, windows, strict=True)) + " WHERE "
               + " AND ".join(f"{a}.k = {b}.k" for a, b in itertools.pairwise(streams)))
        rows = {x for x, w in zip(streams, windows, strict=True) if "ROWS" in w}
        clash = any((x in rows or y in rows) and order.index(x) > order.index(y)
                    for i, x in enumerate(streams) for y in streams[i + 1:])
        queries.append((sql, engine.register(sql), clash))
    engine.run()
    for sql, h, clash in queries:
        assert clash or h.state == "running", (sql, h.error)  # only a clash can stop it
        sources = {x: tabs[x] for x in names if f" {x}" in sql.split("WHERE")[0]}
        want = adaptcq.run(sql, sources, executor="mjoin").table.to_pylist()
        got = h.table().to_pylist()
        if h.state == "failed":
            assert "the order of its sources" in h.error, h.error
            assert got == want[:len(got)]
        else:
            assert h.state == "running" and Counter(map(str, got)) == Counter(map(str, want))


def test_a_window_start_query_in_retract_mode_schedules_the_held_rows_deletions():
    """Retract mode, ``start="window"`` with retained rows that no running query held: the
    held rows' deletions for the new window are scheduled like any other (a payload of
    the wrong shape crashed the run; found by fuzzing)."""
    R = pa.table({"ts": [1, 20], "k": [1, 1]})
    S = pa.table({"ts": [1, 20], "k": [1, 1]})
    rows = {}
    for mode in ("append", "retract"):
        engine = adaptcq.Engine({"R": R, "S": S}, retain={"R": 100}, mode=mode)
        h = engine.register("SELECT R.k FROM R [RANGE 10], S [RANGE 10] WHERE R.k = S.k",
                            at=5, start="window")
        engine.run()
        assert h.state == "running"
        rows[mode] = h.table().to_pylist()
    assert rows["append"] == [r for r in rows["retract"] if r["_sign"] == 1] != []


@pytest.mark.parametrize("executor", ["eddy", "eddies", "pushdown", "pullup"])
def test_a_udf_raising_in_a_select_item_fails_only_its_query(executor):
    """docs/cacq.md: a raising UDF fails its own query; the others keep running and lose
    nothing. Also where the UDF is in the SELECT list (a condition AS a column), which
    took the whole engine down (found by fuzzing)."""
    def boom(x):
        if x == 2:
            raise ValueError("two!")
        return x

    engine = adaptcq.Engine({"R": pa.table({"ts": [1, 2, 3], "x": [1, 2, 3]})},
                            udfs={"boom": boom}, executor=executor)
    bad = engine.register("SELECT R.x, boom(R.x) > 1 AS hot FROM R")
    good = engine.register("SELECT R.x FROM R")
    engine.run()
    assert bad.state == "failed" and "boom" in bad.error and "two!" in bad.error
    assert bad.table().column("x").to_pylist() == [1]      # until it raised
    assert good.state == "running" and good.table().column("x").to_pylist() == [1, 2, 3]


def test_control_rows_with_bad_times_are_refused_naming_the_row(tmp_path):
    """A control time that is not a time (text, NaN, out of int64 nanoseconds), a
    deregistration timed before its registration, and a control file that is not Parquet
    are refused naming the row or the file (raw errors, or silently accepted, before)."""
    R = pa.table({"ts": [1, 2], "k": [1, 1]})
    sql = "SELECT R.k FROM R"
    for ctl, message in (
            ([{"ts": float("nan"), "action": "register", "query_id": "a", "sql": sql}],
             "row 0 (query a): control time nan is not finite"),
            ([{"ts": "abc", "action": "register", "query_id": "a", "sql": sql}],
             "row 0 (query a): control time 'abc' is not a number"),
            ([{"ts": 1e30, "action": "register", "query_id": "a", "sql": sql}],
             "row 0 (query a): control time 1e+30 is out of range"),
            ([{"ts": 5, "action": "register", "query_id": "a", "sql": sql},
              {"ts": 2, "action": "deregister", "query_id": "a", "sql": None}],
             "row 1 (query a): deregisters 'a' at 2, before its registration")):
        with pytest.raises(InputError, match=re.escape(message)):
            adaptcq.Engine({"R": R}).load_control(ctl)
    (tmp_path / "g.parquet").write_text("garbage")
    with pytest.raises(InputError, match="cannot be read as Parquet"):
        adaptcq.Engine({"R": R}).load_control(str(tmp_path / "g.parquet"))


def test_an_error_mid_run_leaves_no_partial_output_files(tmp_path):
    """As the single-query CLI: an error stops the run and removes the outputs, instead of
    finishing them holding only what came before it (found by fuzzing)."""
    def broken():
        yield {"ts": 1, "k": 1}
        yield {"ts": 2, "k": 1}
        raise RuntimeError("the source broke")

    engine = adaptcq.Engine({"R": broken(), "S": pa.table({"ts": [1, 2, 3], "k": [1, 1, 1]})},
                            chunk_rows=1)
    engine.register("SELECT R.k FROM R [RANGE 10], S [RANGE 10] WHERE R.k = S.k",
                    output=str(tmp_path / "q1.parquet"))
    with pytest.raises(RuntimeError, match="the source broke"):
        engine.run()
    assert list(tmp_path.iterdir()) == []


def test_a_control_csv_reads_only_an_empty_field_as_null(tmp_path):
    """A control stream's CSV is read as inputs are (``sources.CSV_NULLS``): a query id
    such as NA or NULL is that text (pyarrow's default null values made it NULL)."""
    control = tmp_path / "control.csv"
    control.write_text("ts,action,query_id,sql\n"
                       ",register,NA,SELECT R.k FROM R\n,register,NULL,SELECT R.k FROM R\n")
    engine = adaptcq.Engine({"R": pa.table({"ts": [1.0], "k": [1]})})
    engine.load_control(str(control))
    engine.run()
    assert {h: engine.handles[h].table().num_rows for h in ("NA", "NULL")} == \
        {"NA": 1, "NULL": 1}


@pytest.mark.parametrize("qid", ["../../x", "a/b", "a\\b", ".hidden", "_x"])
def test_a_query_id_that_would_leave_or_hide_in_the_output_folder_is_refused(qid, tmp_path):
    """A query id names its folder under --output (query_id=<id>): '../../x' in a control
    stream wrote outside it (found by fuzzing). Refused, as on Spark, before any row."""
    engine = adaptcq.Engine({"R": pa.table({"ts": [1.0], "k": [1]})})
    with pytest.raises(OptionError, match="an id names its output folder"):
        engine.register("SELECT R.k FROM R", query_id=qid)
    control = tmp_path / "c.csv"
    control.write_text(f'ts,action,query_id,sql\n0.5,register,"{qid}",SELECT R.k FROM R\n')
    with pytest.raises(OptionError, match="an id names its output folder"):
        adaptcq.Engine({"R": pa.table({"ts": [1.0], "k": [1]})}).load_control(str(control))


def test_a_second_deregistration_in_a_control_stream_is_refused():
    """It did nothing, silently (found by fuzzing)."""
    engine = adaptcq.Engine({"R": pa.table({"ts": [1.0], "k": [1]})})
    with pytest.raises(InputError, match="control stream row 2 .query q1.: deregisters 'q1' a"):
        engine.load_control([
            {"ts": 0.0, "action": "register", "query_id": "q1", "sql": "SELECT R.k FROM R"},
            {"ts": 2.0, "action": "deregister", "query_id": "q1", "sql": None},
            {"ts": 3.0, "action": "deregister", "query_id": "q1", "sql": None}])


def test_engine_api_misuse_is_refused_without_leaving_state(tmp_path):
    """Found by fuzzing the Python API: a deregistration before the registration was
    ignored (the query ran on) and a second one accepted; chunk_rows=-1 gave an empty
    output; output=5 wrote a file named 5; a refused registration left its id used; an
    automatic id collided with a chosen one; a DataFrame control stream or a non-string
    source name gave raw tracebacks."""
    import pandas as pd
    R = pa.table({"ts": [1.0, 2.0, 3.0], "k": [1, 1, 1]})
    sql = "SELECT R.k FROM R"
    engine = adaptcq.Engine({"R": R})
    h = engine.register(sql, at=2.0)
    with pytest.raises(OptionError, match="before its registration"):
        engine.deregister(h, at=1.0)
    engine.deregister(h, at=2.5)
    with pytest.raises(OptionError, match="a second time"):
        engine.deregister(h, at=3.0)
    for bad in (-1, 0, 2.0, True):
        with pytest.raises(OptionError, match="chunk_rows must be a positive whole number"):
            adaptcq.Engine({"R": R}, chunk_rows=bad)
    with pytest.raises(InputError, match="source name 1"):
        adaptcq.Engine({1: R})
    engine = adaptcq.Engine({"R": R})
    with pytest.raises(OptionError, match="neither a file path nor a callable"):
        engine.register(sql, output=5)
    with pytest.raises(adaptcq.errors.AdaptcqError, match="is not an output format's suffix"):
        engine.register(sql, output=str(tmp_path / "x.txt"))
    with pytest.raises(InputError):
        engine.register(sql, at="abc", query_id="a")
    engine.register(sql, at=1.0, query_id="a")          # the refused one left nothing
    engine.register(sql, query_id="q2")
    assert engine.register(sql).id == "q3"              # (q2 is taken)
    engine.load_control(pd.DataFrame([{"ts": None, "action": "register",
                                       "query_id": "df", "sql": sql}]))
    with pytest.raises(InputError, match="not tuple"):
        engine.load_control(("x",))
    engine.run()
    assert engine.handles["df"].table().num_rows == 3
    assert not (tmp_path / "5").exists()


@pytest.mark.parametrize(("kw", "message"), [
    ({"capacity": 0}, "capacity .queries at once. must be a whole number"),
    ({"capacity": 1.5}, "capacity .queries at once. must be a whole number"),
    ({"routing_epoch": 0}, "routing_epoch must be a positive number"),
    ({"retain": [1]}, "retain must be a dict"),
    ({"retain": {"R": -1}}, r"retain\['R'\] must be a number of seconds"),
    ({"udfs": [1]}, "udfs must be a dict"),
    ({"routing_options": [1]}, "routing_options must be a dict"),
])
def test_engine_options_of_the_wrong_shape_are_refused(kw, message):
    """capacity=0 and routing_epoch=0 meant the default, silently; a float capacity, lists
    and a negative retain gave raw tracebacks or ran (found by fuzzing the Python API)."""
    with pytest.raises(OptionError, match=message):
        adaptcq.Engine({"R": pa.table({"ts": [1.0], "k": [1]})}, **kw)


def test_a_static_plans_summary_says_it_does_not_route(tmp_path, capsys):
    """PullUp and PushDown (NiagaraCQ's static plans) showed 'routing: tickets' in the run
    summary (found by running every docs example)."""
    paths = _write(tmp_path, DATA)
    inputs = [f"--input={n}={p}" for n, p in paths.items()]
    assert main(["run", "--executor", "pullup", "--sql", "SELECT S.a FROM S", *inputs,
                 "--output", str(tmp_path / "out"), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "none (a static" in out and "tickets" not in out


def test_an_output_clashing_with_another_or_an_input_is_refused(tmp_path):
    """Two queries given one output file: both sinks wrote one temporary file and the run
    failed with "No such file", one query's results lost (found by fuzzing the Python API).
    An output that is an input would destroy it."""
    src = tmp_path / "r.parquet"
    pq.write_table(pa.table({"ts": [1.0, 2.0, 3.0], "a": [1, 2, 3]}), src)
    engine = adaptcq.Engine({"R": str(src)})
    out = tmp_path / "same.parquet"
    engine.register("SELECT R.a FROM R WHERE R.a > 1", output=str(out), query_id="q1")
    with pytest.raises(OptionError, match="q2: output .* is query q1's output"):
        engine.register("SELECT R.a FROM R", output=str(tmp_path / "." / "same.parquet"),
                        query_id="q2")
    with pytest.raises(OptionError, match="is the input .*would destroy the input"):
        engine.register("SELECT R.a FROM R", output=str(src), query_id="q3")
    engine.register("SELECT R.a FROM R", output=str(tmp_path / "q4.parquet"), query_id="q4")
    engine.run()
    assert pq.read_table(out).column("a").to_pylist() == [2, 3]
    assert pq.read_table(tmp_path / "q4.parquet").column("a").to_pylist() == [1, 2, 3]


def test_an_output_failing_at_the_end_removes_every_output(tmp_path):
    """A callback raising at the final flush left the other query's temporary file behind
    and its output never written (docs/cacq.md: an error removes the outputs)."""
    engine = adaptcq.Engine({"R": pa.table({"ts": [1.0, 2.0], "a": [1, 2]})})

    def down(batch):
        raise RuntimeError("sink down")

    engine.register("SELECT R.a FROM R", output=str(tmp_path / "first.parquet"))
    engine.register("SELECT R.a FROM R", output=down)
    engine.register("SELECT R.a FROM R", output=str(tmp_path / "ok.parquet"))
    with pytest.raises(RuntimeError, match="sink down"):
        engine.run()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("executor", "kw", "message"), [
    ("pullup", {"routing": "lottery"}, "routing=: not for executor='pullup'.*static"),
    ("pushdown", {"routing_options": {"decay": 0.5}, "seed": 3},
     "routing_options=, seed=: not for executor='pushdown'.*nothing is routed"),
    ("pullup", {"routing_epoch": None}, "routing_epoch=: .*static"),
    ("eddies", {"retain": {"R": 100}}, "retain=: not for executor='eddies'.*start='window'"),
    ("eddies", {"capacity": 1}, "capacity=: not for executor='eddies'.*limits nothing"),
])
def test_options_the_executor_does_not_use_are_refused(executor, kw, message):
    """Accepted and ignored by the baselines, while the CLI refuses the same flags (found by
    fuzzing the Python API)."""
    with pytest.raises(OptionError, match=message):
        adaptcq.Engine({"R": pa.table({"ts": [1.0], "k": [1]})}, executor=executor, **kw)


@pytest.mark.parametrize("executor", ["eddy", "eddies", "pushdown", "pullup"])
def test_the_defaults_the_cli_passes_are_taken_by_every_executor(executor):
    from adaptcq.runtime.multi import ROUTING_EPOCH
    engine = adaptcq.Engine({"R": pa.table({"ts": [1.0], "k": [1]})}, executor=executor,
                            routing="tickets", routing_options={}, seed=0,
                            routing_epoch=ROUTING_EPOCH)
    h = engine.register("SELECT R.k FROM R")
    engine.run()
    assert h.table().num_rows == 1


def test_control_times_are_exact():
    """A datetime control time went through total_seconds() * 1e9, an int of nanoseconds
    through float(at): up to ~200 ns off, so an event at a row's time landed on the wrong
    side of it (found by fuzzing the Python API)."""
    import datetime
    base = datetime.datetime(2024, 3, 5, 12, 0, 0)
    at = base + datetime.timedelta(microseconds=1)  # float conversion: 24 ns late
    tbl = pa.table({"ts": pa.array([base, at, at + datetime.timedelta(seconds=1)],
                                   pa.timestamp("us")), "a": [1, 2, 3]})
    engine = adaptcq.Engine({"R": tbl})
    late = engine.register("SELECT R.a FROM R", at=at)
    gone = engine.register("SELECT R.a FROM R")
    engine.deregister(gone, at=at)
    engine.run()
    assert late.table().column("a").to_pylist() == [2, 3]
    assert gone.table().column("a").to_pylist() == [1]
    t0 = 1709640000000001001
    engine = adaptcq.Engine({"R": pa.table({"ts": [t0 - 1000, t0, t0 + 1000],
                                            "a": [1, 2, 3]})}, timestamp_unit="ns")
    late = engine.register("SELECT R.a FROM R", at=t0)
    engine.run()
    assert late.table().column("a").to_pylist() == [2, 3]
    pd = pytest.importorskip("pandas")
    engine = adaptcq.Engine({"R": pa.table({"ts": [t0 - 1, t0]}).cast(
        pa.schema([("ts", pa.timestamp("ns"))]))})
    late = engine.register("SELECT R.ts FROM R", at=pd.Timestamp(t0))
    engine.run()
    assert late.table().num_rows == 1
    x = 0.1 + 0.2                                 # float times: as the data's are converted
    engine = adaptcq.Engine({"R": pa.table({"ts": [0.1, x, 0.4], "a": [1, 2, 3]})})
    late = engine.register("SELECT R.a FROM R", at=x)
    engine.run()
    assert late.table().column("a").to_pylist() == [2, 3]


@pytest.mark.parametrize(("executor", "start", "message"), [
    ("eddy", "bogus", "q2: unknown start 'bogus'; choose one of now, window"),
    ("eddies", "window", "q2: start='window' is not supported by executor='eddies'"),
    ("pushdown", "window", "q2: start='window' is not supported by executor='pushdown'"),
    ("pullup", "window", "q2: start='window' is not supported by executor='pullup'"),
])
def test_a_bad_start_is_refused_at_registration(tmp_path, executor, start, message):
    """It was refused when its time came mid-run, stopping every query and removing their
    outputs (found by fuzzing the Python API)."""
    engine = adaptcq.Engine({"R": pa.table({"ts": [1.0, 5.0, 9.0], "a": [1, 2, 3]})},
                            executor=executor)
    engine.register("SELECT R.a FROM R", output=str(tmp_path / "good.parquet"))
    with pytest.raises(OptionError, match=message):
        engine.register("SELECT R.a FROM R", at=5.0, start=start)
    assert list(engine.handles) == ["q1"]
    engine.run()
    assert (tmp_path / "good.parquet").exists()


@pytest.mark.parametrize("executor", ["eddy", "pullup"])
def test_exceeding_capacity_names_the_query_and_its_time(executor):
    engine = adaptcq.Engine({"R": pa.table({"ts": [1.0, 2.5, 3.0], "a": [1, 2, 3]})},
                            executor=executor, capacity=1)
    engine.register("SELECT R.a FROM R")
    engine.register("SELECT R.a FROM R", at=2.5, query_id="late")
    with pytest.raises(OptionError, match="registering query 'late' at event time 2.5 s: "
                                          "more than 1 queries at once"):
        engine.run()


def test_another_querys_control_event_advances_time():
    """docs/cacq.md, "What a query sees": every control event while q runs advances its
    time, so retract mode emits q's deletions due before another query's later event (found
    by fuzzing: documented, and the property test's oracle now models it)."""
    sql = "SELECT R.a FROM R [RANGE 2 SECONDS]"
    data = pa.table({"ts": [1.0, 5.0], "a": [1, 2]})

    def rows(h):
        return sorted(tuple(r.values()) for r in h.table().to_pylist())

    alone = adaptcq.Engine({"R": data}, mode="retract")
    q = alone.register(sql)
    alone.run()
    assert rows(q) == [(1, -1, 3.0), (1, 1, 1.0), (2, 1, 5.0)]
    assert rows(q) == sorted(tuple(r.values()) for r in adaptcq.run(
        sql, {"R": data}, mode="retract").table.to_pylist())
    shared = adaptcq.Engine({"R": data}, mode="retract")
    q = shared.register(sql)
    shared.deregister(shared.register("SELECT R.a FROM R WHERE R.a > 100"), at=10.0)
    shared.run()
    assert rows(q) == [(1, -1, 3.0), (1, 1, 1.0), (2, -1, 7.0), (2, 1, 5.0)]


def test_a_removed_query_finishes_its_output_at_once(tmp_path):
    """A deregistered query held its unwritten results (up to a chunk) and its open file
    until the run ended, so a control stream of many queries grew memory and open files
    with the run (found measuring memory over long runs). Its file is now complete at its
    removal, and a query's file is opened at its registration."""
    out1, out2 = tmp_path / "q1.parquet", tmp_path / "q2.parquet"
    seen = {}

    def rows():
        for i in range(400):
            if i == 300:  # long after q1's removal at 100 s, before q2's registration
                seen["q1 done"] = out1.exists() and pq.read_table(out1).num_rows
                seen["q2 open"] = any(p.name.startswith(out2.name) for p in tmp_path.iterdir())
            yield {"ts": float(i), "k": i % 3}

    eng = adaptcq.Engine({"R": rows()}, "ts", chunk_rows=10)  # (read a little ahead only)
    q1 = eng.register("SELECT R.k FROM R", output=str(out1))
    eng.deregister(q1, at=100.0)
    eng.register("SELECT R.k FROM R", at=350.0, output=str(out2))
    eng.run()
    assert seen == {"q1 done": 100, "q2 open": False}
    assert pq.read_table(out1).num_rows == 100 and pq.read_table(out2).num_rows == 50


@pytest.mark.parametrize("executor", ["pushdown", "pullup"])
@pytest.mark.parametrize(("sql", "message"), [
    ("SELECT a.a FROM R a, R b WHERE a.a = b.a", "a self-join is not one of NiagaraCQ"),
    ("SELECT R.a FROM R, S WHERE R.a < S.a", "non-equi predicate"),
])
def test_niagara_refuses_what_its_plans_cannot_run_at_registration(tmp_path, executor, sql,
                                                                    message):
    """Refused only when the registration's time came, mid-run (which stopped every query,
    removing their outputs); now at register(), before any data."""
    eng = adaptcq.Engine(_write(tmp_path, DATA), "ts", executor=executor)
    with pytest.raises((OptionError, QueryError), match=message):
        eng.register(sql, at=5.0)


def test_a_boolean_control_time_is_refused(tmp_path):
    eng = adaptcq.Engine(_write(tmp_path, DATA), "ts")
    with pytest.raises(InputError, match="control time True is not a number"):
        eng.register("SELECT S.a FROM S", at=True)


def test_a_control_streams_start_column_is_read_and_others_refused(tmp_path):
    """A control stream's columns other than ts, action, query_id, sql were ignored, a
    "start" one too (its query ran from now); start is now read, and the others refused."""
    paths = _write(tmp_path, DATA)
    sql = "SELECT R.a AS ra, S.c AS sc FROM R [RANGE 5 SECONDS], S WHERE R.a = S.a"
    rows = [{"ts": 1.2, "action": "register", "query_id": "w", "sql": sql, "start": "window"},
            {"ts": 1.2, "action": "register", "query_id": "n", "sql": sql, "start": None}]
    eng = adaptcq.Engine(paths, "ts", retain={"R": 10})
    eng.load_control(rows)
    eng.run()
    w, n = eng.handles["w"].table(), eng.handles["n"].table()
    # w sees R@0 and R@1 (held) with S@1.5; n sees only what arrives after 1.2.
    assert sorted(w.column("ra").to_pylist()) == [2] and n.num_rows == 0
    with pytest.raises(InputError, match="unknown column.*priority"):
        adaptcq.Engine(paths, "ts").load_control([{**rows[1], "priority": 3}])
    with pytest.raises(OptionError, match="row 0 .query n.: query n: unknown start .later."):
        adaptcq.Engine(paths, "ts").load_control([{**rows[1], "start": "later"}])


def test_spark_query_sets_refuse_a_window_start_in_the_control_stream():
    """The Spark query set ran such a query from now (start was ignored): refused."""
    from adaptcq.runtime.spark_multi import _reference
    schemas = {s: pa.schema([("ts", pa.float64()), ("a", pa.int64())]) for s in "RS"}

    class Src:  # (what _reference reads of a source: an empty table of its schema)
        def __init__(self, schema):
            self.schema = schema

        def empty_table(self):
            return self.schema.empty_table()
    ctl = [{"ts": 1.0, "action": "register", "query_id": "w", "sql": "SELECT R.a FROM R",
            "start": "window"}]
    with pytest.raises(OptionError, match="start=window.*does not offer"):
        _reference({n: Src(s) for n, s in schemas.items()}, None, ctl, "ts", None, "append",
                   "tickets", None, 0, None, None, 1000, 0.0)
