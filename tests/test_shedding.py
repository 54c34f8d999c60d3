"""The load-shedding join (engine.shed_join, load-shedding.txt): exact with ample capacity,
a sub-multiset of the oracle under overload, deterministic on the virtual clock, within
its comparison budget; the set join conditions and their errors."""

from __future__ import annotations

import math
import random
from collections import Counter

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adaptcq.adapt.shed_control import ShedController
from adaptcq.engine.continuous import ContinuousQuery
from adaptcq.errors import AdaptcqError, OptionError, QueryError
from adaptcq.query.cql import parse_query
from conftest import examples
from oracle import Oracle, engine_outputs, oracle_total

SCHEMA = {"ts": "number", "id": "number", "s": "list", "w": "map", "v": "number"}
common = settings(max_examples=examples(60), deadline=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

CONDITIONS = ["OVERLAP(R.s, S.s) >= {k}", "OVERLAP(R.s, S.s) > {k}", "SET_EQUAL(R.s, S.s)",
              "SUBSET(R.s, S.s)", "SUPERSET(R.s, S.s)", "INNER_PRODUCT(R.w, S.w) >= {k}",
              "R.v = S.v"]


@st.composite
def queries(draw):
    cond = draw(st.sampled_from(CONDITIONS)).format(k=draw(st.sampled_from([0, 1, 2])))
    if draw(st.integers(0, 3)) == 0:
        cond += " AND R.v = S.v" if "R.v" not in cond else " AND OVERLAP(R.s, S.s) >= 1"
    wins = [draw(st.sampled_from(["0", "1", "2.5", "4"])) for _ in range(2)]
    sql = (f"SELECT R.id AS r, S.id AS i FROM R [RANGE {wins[0]} SECONDS], "
           f"S [RANGE {wins[1]} SECONDS] WHERE {cond}")
    return parse_query(sql, {"R": SCHEMA, "S": SCHEMA})


@st.composite
def arrivals(draw, max_rows=40):
    k = draw(st.integers(1, max_rows))
    items = st.lists(st.one_of(st.integers(1, 5), st.just(None)) if draw(st.booleans())
                     else st.integers(1, 5), max_size=4)  # NULL items: shared with nothing
    sets = st.one_of(st.none(), items) if draw(st.booleans()) else items
    streams, ts, rows = [], [], []
    t = 0.0
    for r in range(k):
        t += draw(st.sampled_from([0, 0, 0.5, 1, 2.0]))
        streams.append(draw(st.integers(0, 1)))
        ts.append(t)
        s = draw(sets)
        w = None if s is None else {x: draw(st.sampled_from([0.5, 1, 2, None]))
                                    for x in s if x is not None}  # (map keys: never NULL)
        rows.append({"s": s, "w": w, "v": draw(st.sampled_from([0, 1, None])), "id": r})
    return streams, ts, rows


def as_tuples(query, streams, rows):
    return [tuple(r[c] for c in query.columns[query.aliases[i]]) for i, r in zip(streams, rows)]


def index_for(query, rnd):
    if query.set_predicates and query.predicates:
        return rnd.choice(["auto", "none", "hash", "inverted", "inverted-id"])
    if query.set_predicates:
        return rnd.choice(["auto", "none", "inverted", "inverted-id"])
    return rnd.choice(["auto", "none", "hash"])


@common
@given(data=st.data(), seed=st.integers(0, 10**6))
def test_without_a_capacity_limit_the_join_equals_the_oracle_update_by_update(data, seed):
    q = data.draw(queries())
    streams, ts, rows = data.draw(arrivals())
    tup = as_tuples(q, streams, rows)
    rnd = random.Random(seed)
    cq = ContinuousQuery(q, "shed", "append", trace=True, index=index_for(q, rnd),
                         basic_window=rnd.choice([None, 0.5, 1, 3]), seed=seed)
    _, got = engine_outputs(cq.trace, cq.process(streams, None, ts, tup) + cq.finish())
    events, outputs = Oracle(q, "append").run(streams, None, ts, tup)
    want = [o for e, o in zip(events, outputs) if e[1] > 0]  # insertions (append mode)
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g == w, f"arrival {k}: shed join {dict(g)} != oracle {dict(w)}"


@common
@given(data=st.data(), seed=st.integers(0, 10**6),
       shed=st.sampled_from(["none", "random", "partial", "selective"]),
       capacity=st.sampled_from([0.5, 2, 10, 1e9]))
def test_under_overload_the_output_is_a_sub_multiset_and_replays_exactly(
        data, seed, shed, capacity):
    q = data.draw(queries())
    streams, ts, rows = data.draw(arrivals(max_rows=60))
    tup = as_tuples(q, streams, rows)
    rnd = random.Random(seed)
    kw = {"index": index_for(q, rnd), "basic_window": rnd.choice([None, 0.5, 1, 3]),
          "buffer": rnd.choice([0.5, 1, 2]), "gamma": rnd.choice([0.1, 0.5]), "seed": seed,
          "shed": shed, "capacity": capacity}

    def once():
        ctl = (ShedController(shed, T_r=rnd_t, T_c=rnd_t)
               if shed in ("partial", "selective") else None)
        cq = ContinuousQuery(q, "shed", "append", controller=ctl, **kw)
        return cq.process(streams, None, ts, tup) + cq.finish()

    rnd_t = rnd.choice([0.5, 1, 5])
    first = once()
    want = oracle_total(q, streams, ts, tup)
    assert want == pairs_total(q, streams, ts, tup)  # the two brute forces agree
    got = Counter(first)
    assert not got - want, f"rows the oracle does not have: {dict(got - want)}"
    assert once() == first  # the virtual clock replays exactly
    if capacity == 1e9:  # ample: nothing is shed
        assert got == want


def pairs_total(query, streams, ts, tup) -> Counter:
    """The append-mode output of a two-way windowed join by brute force over pairs (the
    oracle's conditions and projection, without its per-update recomputation): a pair
    joins at the later arrival when the earlier row is within its window."""
    o = Oracle(query, "append")
    w = [s.window.size for s in query.streams]
    total: Counter = Counter()
    for k in range(len(tup)):
        i = streams[k]
        if not o.sel[i](tup[k]):
            continue
        m = k - 1
        while m >= 0 and ts[k] - ts[m] <= max(w):
            j = streams[m]
            if j != i and ts[k] - ts[m] <= w[j] and o.sel[j](tup[m]):
                bound = [None, None]
                bound[i], bound[j] = tup[k], tup[m]
                if all(bound[a][pa_] is not None and bound[a][pa_] == bound[b][pb]
                       for a, pa_, b, pb in o.eqs) and \
                        all(test(bound[a][pa_], bound[b][pb]) for a, pa_, b, pb, test in o.sets):
                    total[(*o.project(bound), 1, ts[k])] += 1
            m -= 1
    return total


# ----- n-way: selective processing inside MJoin pipelines ----------------------------------
NWAY_CONDITIONS = ["{a}.v = {b}.v", "OVERLAP({a}.s, {b}.s) >= 1", "OVERLAP({a}.s, {b}.s) >= 2",
                   "SUBSET({a}.s, {b}.s)", "{a}.v = {b}.v AND OVERLAP({a}.s, {b}.s) >= 1"]


@st.composite
def nway_queries(draw):
    n = draw(st.integers(3, 4))
    names = ["R", "S", "T", "U"][:n]
    edges = [(draw(st.integers(0, i - 1)), i) for i in range(1, n)]
    if draw(st.booleans()):
        edges.append((0, n - 1))
    conds = [draw(st.sampled_from(NWAY_CONDITIONS)).format(a=names[i], b=names[j])
             for i, j in edges]
    wins = [draw(st.sampled_from(["0", "1", "2.5"])) for _ in names]
    sql = (f"SELECT {', '.join(f'{x}.id AS i{k}' for k, x in enumerate(names))} FROM "
           + ", ".join(f"{x} [RANGE {w} SECONDS]" for x, w in zip(names, wins))
           + " WHERE " + " AND ".join(conds))
    return parse_query(sql, {x: SCHEMA for x in names})


@st.composite
def nway_arrivals(draw, n, max_rows=30):
    k = draw(st.integers(1, max_rows))
    streams, ts, rows, t = [], [], [], 0.0
    for r in range(k):
        t += draw(st.sampled_from([0, 0, 0.5, 1]))
        streams.append(draw(st.integers(0, n - 1)))
        ts.append(t)
        s = draw(st.one_of(st.none(), st.lists(st.integers(1, 4), max_size=3)))
        rows.append({"s": s, "w": None, "v": draw(st.sampled_from([0, 1, None])), "id": r})
    return streams, ts, rows


@common
@given(data=st.data(), seed=st.integers(0, 10**6))
def test_nway_without_a_capacity_limit_equals_the_oracle_update_by_update(data, seed):
    q = data.draw(nway_queries())
    streams, ts, rows = data.draw(nway_arrivals(len(q.aliases)))
    tup = as_tuples(q, streams, rows)
    rnd = random.Random(seed)
    cq = ContinuousQuery(q, "shed", "append", trace=True,
                         index=rnd.choice(["auto", "none"] + (["hash"] if q.predicates else [])),
                         basic_window=rnd.choice([None, 0.5, 1]))
    _, got = engine_outputs(cq.trace, cq.process(streams, None, ts, tup) + cq.finish())
    events, outputs = Oracle(q, "append").run(streams, None, ts, tup)
    want = [o for e, o in zip(events, outputs) if e[1] > 0]
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g == w, f"arrival {k}: shed MJoin {dict(g)} != oracle {dict(w)}"


@common
@given(data=st.data(), seed=st.integers(0, 10**6),
       shed=st.sampled_from(["none", "random", "partial", "selective"]),
       capacity=st.sampled_from([1, 5, 1e9]))
def test_nway_under_overload_is_a_sub_multiset_and_replays(data, seed, shed, capacity):
    q = data.draw(nway_queries())
    streams, ts, rows = data.draw(nway_arrivals(len(q.aliases), max_rows=50))
    tup = as_tuples(q, streams, rows)

    def once():
        ctl = (ShedController(shed, T_r=1, T_c=1)
               if shed in ("partial", "selective") else None)
        cq = ContinuousQuery(q, "shed", "append", shed=shed, capacity=capacity,
                             controller=ctl, seed=seed, basic_window=0.5)
        return cq.process(streams, None, ts, tup) + cq.finish()

    first = once()
    want = oracle_total(q, streams, ts, tup)
    assert not Counter(first) - want
    assert once() == first
    if capacity == 1e9:
        assert Counter(first) == want


def _overlap_workload(n=2000, seed=3):
    rnd = random.Random(seed)
    streams, ts, rows, t = [], [], [], 0.0
    for r in range(n):
        t += rnd.expovariate(200.0)
        streams.append(r % 2)
        ts.append(t)
        rows.append({"s": rnd.sample(range(1, 20), 4), "w": None, "v": 0, "id": r})
    return streams, ts, rows


def _overlap_case():
    """An overlap join over 4 s windows and its arrivals: 2,000 at 200 per second."""
    q = parse_query("SELECT R.id AS r, S.id AS i FROM R [RANGE 4 SECONDS], "
                    "S [RANGE 4 SECONDS] WHERE OVERLAP(R.s, S.s) >= 2",
                    {"R": SCHEMA, "S": SCHEMA})
    streams, ts, rows = _overlap_workload()
    return q, streams, ts, as_tuples(q, streams, rows)


def test_selective_processing_stays_within_its_comparison_budget():
    """Non-indexed: a tuple not fully processed compares with at most ⌈r_i·|W_i|⌉ rows
    plus one basic window (Algorithm 3, lines 7–15)."""
    q, streams, ts, tup = _overlap_case()
    cq = ContinuousQuery(q, "shed", "append", shed="selective", capacity=20_000,
                         basic_window=0.5, index="none",
                         controller=ShedController("selective", T_r=1, T_c=1))
    ex = cq.executor
    checked = []
    process = ex._process

    def spy(p, row, ts_):
        i = 1 - p
        size = sum(len(bw) for bw in ex.windows[i])
        biggest = max(len(bw) for bw in ex.windows[i])
        r, full, work = ex.fractions[i], ex.full[p], ex.work
        process(p, row, ts_)
        if ex.full[p] == full:  # selective, not sampled
            compared = ex.work - work - 1  # minus the insertion
            assert compared <= math.ceil(r * size) + biggest
            checked.append(r)
    ex._process = spy
    out = cq.process(streams, None, ts, tup) + cq.finish()
    assert checked and min(checked) < 1.0  # the run was overloaded and shed
    assert not Counter(out) - pairs_total(q, streams, ts, tup)


def test_shedding_reports_what_it_lost():
    q, streams, ts, tup = _overlap_case()
    exact = sum(pairs_total(q, streams, ts, tup).values())
    cq = ContinuousQuery(q, "shed", "append", shed="partial", capacity=20_000,
                         controller=ShedController("partial", T_r=1, T_c=1))
    out = cq.process(streams, None, ts, tup) + cq.finish()
    rep = cq.executor.report()
    assert rep["fraction_r_min"] < 1 and rep["rate_steps"] > 0
    lost = 1 - len(out) / exact
    lo, hi = rep["estimated_lost_interval"]
    assert lo <= rep["estimated_lost"] <= hi
    assert lost > 0.1 and abs(rep["estimated_lost"] - lost) < 0.15


@pytest.mark.parametrize("sql, kw, message", [
    (("SELECT * FROM R [RANGE 1 SECONDS], S [RANGE 1 SECONDS], T [RANGE 1 SECONDS] WHERE "
     "R.v = S.v AND S.v = T.v"), {"index": "inverted"}, "uses none or hash"),
    ("SELECT * FROM R [ROWS 3], S [RANGE 1 SECONDS] WHERE R.v = S.v", {}, "RANGE w"),
    ("SELECT * FROM R, S WHERE R.v = S.v", {}, "RANGE w"),
    ("SELECT * FROM R [RANGE 1 SECONDS], S [RANGE 1 SECONDS] WHERE OVERLAP(R.s, S.s) >= 1",
     {"index": "hash"}, "--index hash needs an equi-join"),
    ("SELECT * FROM R [RANGE 1 SECONDS], S [RANGE 1 SECONDS] WHERE R.v = S.v",
     {"index": "inverted"}, "needs a set join condition"),
    ("SELECT * FROM R [RANGE 1 SECONDS], S [RANGE 1 SECONDS] WHERE R.v = S.v",
     {"shed": "selective"}, "needs a CPU capacity"),
    ("SELECT * FROM R [RANGE 1 SECONDS], S [RANGE 1 SECONDS] WHERE R.v = S.v",
     {"shed": "random", "capacity": "lots"}, "--capacity must be"),
])
def test_refusals(sql, kw, message):
    schemas = {"R": SCHEMA, "S": SCHEMA, "T": SCHEMA}
    with pytest.raises(OptionError, match=message):
        ContinuousQuery(parse_query(sql, schemas), "shed", "append", **kw)


def test_retract_mode_is_refused():
    q = parse_query("SELECT * FROM R [RANGE 1 SECONDS], S [RANGE 1 SECONDS] WHERE R.v = S.v",
                    {"R": SCHEMA, "S": SCHEMA})
    with pytest.raises(OptionError, match="append mode only"):
        ContinuousQuery(q, "shed", "retract")


@pytest.mark.parametrize("executor", ["mjoin", "xjoin", "tree"])
def test_other_executors_refuse_set_conditions(executor):
    q = parse_query("SELECT * FROM R [RANGE 1 SECONDS], S [RANGE 1 SECONDS] "
                    "WHERE OVERLAP(R.s, S.s) >= 2", {"R": SCHEMA, "S": SCHEMA})
    with pytest.raises(QueryError, match="only the load-shedding join evaluates it"):
        ContinuousQuery(q, executor, "append")


@pytest.mark.parametrize("where, message, at", [
    ("OVERLAP(R.s, S.s) >= 2 OR R.v = 1", "OVERLAP is a set join condition", "OVERLAP"),
    ("OVERLAP(R.s, S.v) >= 2", "OVERLAP needs sets", "S.v"),
    ("OVERLAP(R.s, S.s)", "compare it with a constant", "OVERLAP"),
    ("SUBSET(R.s, S.s) >= 1", "takes no threshold", "SUBSET"),
    ("OVERLAP(R.s, R.s) >= 1", "both columns are of R", "OVERLAP"),
    ("OVERLAP(R.s, S.s) >= S.v", "must be a constant number", "S.v"),
    ("INNER_PRODUCT(R.s, S.s) >= 1", "weighted sets", "R.s"),
])
def test_set_condition_errors_name_the_place(where, message, at):
    sql = f"SELECT R.id FROM R [RANGE 1 SECONDS], S [RANGE 1 SECONDS] WHERE {where}"
    with pytest.raises(QueryError, match=message) as e:
        parse_query(sql, {"R": SCHEMA, "S": SCHEMA})
    assert e.value.position == sql.index(at, sql.index("WHERE"))


def test_the_local_runtime_runs_set_joins_and_reports_shedding():
    from adaptcq.runtime.local import run
    rnd = random.Random(0)
    tables = {}
    for name in "RS":
        ts = sorted(rnd.uniform(0, 10) for _ in range(400))
        tables[name] = pa.table({"ts": ts, "id": list(range(400)),
                                 "s": [rnd.sample(range(1, 10), 3) for _ in ts]})
    sql = ("SELECT R.id AS r, S.id AS i FROM R [RANGE 2 SECONDS], S [RANGE 2 SECONDS] "
           "WHERE OVERLAP(R.s, S.s) >= 2")
    full = run(sql, tables)
    assert full.stats["executor"] == "shed"
    assert "set join conditions" in full.stats["executor_reason"]
    shed = run(sql, tables, shed={"mode": "selective", "capacity": 3000, "T_r": 1, "T_c": 1})
    st_ = shed.stats
    assert 0 < shed.table.num_rows < full.table.num_rows
    assert st_["shed"] == "selective" and st_["rate_steps"] > 0 and st_["estimated_lost"] > 0
    pairs = Counter(tuple(d.values()) for d in shed.table.select(["r", "i"]).to_pylist())
    every = Counter(tuple(d.values()) for d in full.table.select(["r", "i"]).to_pylist())
    assert not pairs - every
    with pytest.raises(AdaptcqError, match="are for the load-shedding join"):
        run(sql, tables, executor="mjoin", shed={"mode": "random", "capacity": 10})


# ----- utility-based shedding (§5.3) and the command line -----------------------------------
def _typed_workload(duration=20.0, rate=200.0, seed=2):
    from adaptcq.stream.shed_workload import shed_two_way, utilities_fig16
    return shed_two_way(duration=duration, rate=rate, window=4.0, seed=seed,
                        utilities=utilities_fig16(2), frequencies="inverse")


def test_utility_based_shedding_counts_the_utility_of_what_it_emits():
    from adaptcq.runtime.local import run
    wl = _typed_workload()
    util = wl.params["utility"]
    values = {"t0": 1.0, "t1": 0.25, "t2": 1 / 9}
    full = run(wl.sql, wl.tables)
    kinds = {n: dict(zip(t.column("id").to_pylist(), t.column("kind").to_pylist()))
             for n, t in wl.tables.items()}

    def worth(table):
        return sum(max(values[kinds["R"][r]], values[kinds["S"][s]])
                   for r, s in zip(table.column("r").to_pylist(),
                                   table.column("s").to_pylist()))

    ample = run(wl.sql, wl.tables, shed={"mode": "selective", "capacity": 1e12,
                                         "utility": util})
    assert ample.table.num_rows == full.table.num_rows
    assert ample.stats["output_utility"] == pytest.approx(worth(full.table))
    shed = run(wl.sql, wl.tables, shed={"mode": "selective", "capacity": 20_000,
                                        "T_r": 1, "T_c": 1, "utility": util})
    assert 0 < shed.table.num_rows < full.table.num_rows
    assert shed.stats["output_utility"] == pytest.approx(worth(shed.table))
    every = Counter(zip(full.table.column("r").to_pylist(), full.table.column("s").to_pylist()))
    got = Counter(zip(shed.table.column("r").to_pylist(), shed.table.column("s").to_pylist()))
    assert not got - every
    again = run(wl.sql, wl.tables, shed={"mode": "selective", "capacity": 20_000,
                                         "T_r": 1, "T_c": 1, "utility": util})
    assert again.table.equals(shed.table)


@pytest.mark.parametrize("utility, message", [
    ("kind = 't0'", "must be a CASE expression"),
    ("CASE R.kind WHEN 't0' THEN 1 END", "write columns unqualified"),
    ("CASE colour WHEN 'red' THEN 1 END", "stream R has no column 'colour'"),
    ("CASE kind WHEN 't0' THEN id END", "a utility must be a constant number"),
])
def test_utility_errors(utility, message):
    from adaptcq.runtime.local import run
    wl = _typed_workload(duration=2.0)
    with pytest.raises(OptionError, match=message):
        run(wl.sql, wl.tables, shed={"mode": "selective", "capacity": 1e6,
                                     "utility": utility})
    with pytest.raises(OptionError, match="for --shed selective"):
        run(wl.sql, wl.tables, shed={"mode": "random", "capacity": 1e6,
                                     "utility": "CASE kind WHEN 't0' THEN 1 END"})


def test_the_command_line(tmp_path, capsys):
    import json

    from adaptcq.cli import main
    assert main(["workload", "shed", "--out", str(tmp_path / "w"), "--n-updates", "6000"]) == 0
    w = tmp_path / "w"
    summary = tmp_path / "summary.json"
    assert main(["run", "--sql", f"@{w / 'query.sql'}", "--input", f"R={w / 'R.parquet'}",
                 "--input", f"S={w / 'S.parquet'}", "--shed", "selective",
                 "--capacity", "50000", "--basic-window", "2", "--output",
                 str(tmp_path / "out.parquet"), "--summary-json", str(summary),
                 "--no-progress"]) == 0
    stats = json.loads(summary.read_text())
    assert stats["executor"] == "shed" and stats["shed"] == "selective"
    assert stats["basic_window"] == 2 and stats["results"] > 0
    assert main(["run", "--sql", f"@{w / 'query.sql'}", "--input", f"R={w / 'R.parquet'}",
                 "--input", f"S={w / 'S.parquet'}", "--shed", "random", "--capacity", "1e4",
                 "--executor", "mjoin", "--output", str(tmp_path / "x.parquet")]) == 1
    assert "are for the load-shedding join (--executor shed)" in capsys.readouterr().err


def test_the_nway_benchmark_runs(tmp_path, capsys):
    from adaptcq.bench.shedding_nway import main
    assert main(["--runs", "1", "--duration", "3", "--rate", "40", "--window", "2",
                 "--cases", "overlap,equality-hash", "--out", str(tmp_path)]) == 0
    rows = (tmp_path / "nway.csv").read_text().splitlines()
    assert rows[0].startswith("case,run,policy,results")
    assert len(rows) == 1 + 4
    assert "selective / random output" in capsys.readouterr().out


def test_nway_refuses_utilities_and_inverted_indexes():
    q = parse_query("SELECT * FROM R [RANGE 1 SECONDS], S [RANGE 1 SECONDS], "
                    "T [RANGE 1 SECONDS] WHERE R.v = S.v AND OVERLAP(S.s, T.s) >= 1",
                    {a: SCHEMA for a in "RST"})
    with pytest.raises(OptionError, match="for two-way joins"):
        ContinuousQuery(q, "shed", "append", types=([lambda r: 0] * 3, [1.0]))
    with pytest.raises(OptionError, match="uses none or hash"):
        ContinuousQuery(q, "shed", "append", index="inverted-id")


def test_explain_shows_the_load_shedding_plan(capsys):
    from adaptcq.cli import main
    sql = ("SELECT R.id FROM R [RANGE 20 SECONDS], S [RANGE 20 SECONDS] "
           "WHERE OVERLAP(R.s, S.s) >= 3")
    assert main(["explain", "--sql", sql]) == 0
    assert "load-shedding join R ⋈ S on OVERLAP(R.s, S.s) >= 3" in capsys.readouterr().out
    sql3 = ("SELECT R.a FROM R [RANGE 5 SECONDS], S [RANGE 5 SECONDS], T [RANGE 2 SECONDS] "
            "WHERE R.a = S.a AND S.b = T.b")
    assert main(["explain", "--sql", sql3, "--executor", "shed"]) == 0
    assert "pipelines ΔR: S ⋈ T; ΔS: R ⋈ T; ΔT: S ⋈ R" in capsys.readouterr().out


# ----- regressions found in review ----------------------------------------------------------
def test_a_basic_window_that_is_no_whole_number_of_time_units_loses_nothing():
    """n_i is computed in engine units: with b = 1/3 s in nanoseconds, (n − 1)·b must cover
    w, or a shift empties a basic window whose row is exactly w old."""
    from adaptcq.runtime.local import run
    r = pa.table({"ts": pa.array([0, 333333332, 333333333, 666666666, 999999999,
                                  1333333332], pa.int64()), "id": list(range(6)), "a": [1] * 6})
    s = pa.table({"ts": pa.array([1333333332], pa.int64()), "id": [0], "a": [1]})
    sql = "SELECT R.id AS r FROM R [RANGE 1 SECONDS], S [RANGE 1 SECONDS] WHERE R.a = S.a"
    for b in (1 / 3, 1 / 9, 1 / 12, 1 / 14):
        out = run(sql, {"R": r, "S": s}, timestamp_unit="ns", shed={"basic_window": b})
        assert sorted(out.table.column("r").to_pylist()) == [1, 2, 3, 4, 5], b


@pytest.mark.parametrize("spec, message", [
    ({"buffer": float("inf"), "capacity": 10}, "finite number of seconds"),
    ({"basic_window": float("inf")}, "finite number of seconds"),
    ({"capacity": 1e-300}, "from 0.001 up"),
    ({"basic_window": 1e-12}, "below the time unit"),
    ({"basic_window": 1e-5}, "basic windows per window"),
    ({"mode": "partial", "capacity": 10, "direction": False}, "for --shed selective"),
    ({"mode": "selective", "capacity": 10, "direction": False,
      "utility": "CASE a WHEN 1 THEN 1 END"}, "replaces join direction"),
    ({"buffer": 1}, "--buffer needs --capacity"),
    ({"mode": "random", "capacity": 10, "gamma": 0.5}, "for --shed selective or partial"),
])
def test_option_values_and_combinations_are_refused(spec, message):
    from adaptcq.runtime.local import run
    t = pa.table({"ts": [0.0, 1.0], "id": [0, 1], "a": [1, 1]})
    sql = "SELECT R.id AS r FROM R [RANGE 1 SECONDS], S [RANGE 1 SECONDS] WHERE R.a = S.a"
    with pytest.raises(OptionError, match=message):
        run(sql, {"R": t, "S": t}, timestamp_unit="s", shed=spec)


@pytest.mark.parametrize("spec, message", [
    ({"mode": "selective", "capacity": 10, "T_r": "5"}, r"T_r .* got '5'"),
    ({"mode": "selective", "capacity": 10, "T_c": None}, r"T_c .* got None"),
    ({"mode": "selective", "capacity": 10, "delta_r": "2"}, r"delta_r .* got '2'"),
    ({"mode": "selective", "capacity": 10, "gamma": "0.5"}, r"gamma .* got '0.5'"),
    ({"mode": "selective", "capacity": True}, r"--capacity must be .* got True"),
    ({"mode": "selective", "capacity": 10, "T_r": math.inf}, r"T_r .* finite .* got inf"),
    ({"mode": "selective", "capacity": 10, "delta_r": math.inf}, r"delta_r .* got inf"),
    ({"mode": "selective", "capacity": 10, "direction": "no"}, r"direction .* got 'no'"),
    ({"mode": "random", "capacity": 10, "buffer": True}, r"--buffer .* got True"),
    ({"basic_window": False}, r"--basic-window .* got False"),
    ({"mode": "fast"}, r"unknown --shed 'fast'"),
    ({"index": ["none"]}, r"unknown --index \['none'\]"),
    ({"mode": "selective", "capacity": 10, "utility": 3}, r"--utility .* got 3"),
    ({"mode": "random", "capacity": 10, "seed": "1"}, r"seed must be an integer, got '1'"),
    ({"mode": "none", "seed": 3}, r"seed 3: nothing random in this run uses it"),
    ({"capacity": 10, "index": "inverted", "seed": 3}, r"seed 3: nothing random"),
])
def test_every_shed_option_is_checked_up_front(spec, message):
    """Where the options are parsed (before any join is built: for Spark, on the driver),
    an OptionError naming the option and its value; not a raw TypeError, nor a refusal
    mid-run at the first rate step (delta_r), nor silently accepted (T_r = inf never
    adapts; a seed that seeds nothing, as the CLI refuses --seed)."""
    from adaptcq.runtime.shed import shed_engine_options
    with pytest.raises(OptionError, match=message):
        shed_engine_options(spec)


def test_a_seed_is_taken_where_something_random_uses_it():
    from adaptcq.runtime.shed import shed_engine_options
    for spec in ({"mode": "random", "capacity": 10, "seed": 3},
                 {"mode": "selective", "capacity": 10, "seed": 3},
                 {"mode": "partial", "capacity": 10, "index": "inverted-id", "seed": 3}):
        assert shed_engine_options(spec)[1]["seed"] == 3
    # inverted-id's random identifiers order its lists and nothing else (the cost is per
    # list length, candidates are tested in time order): with --shed none, refused.
    with pytest.raises(OptionError, match="seed 3: nothing random .* inverted-id"):
        shed_engine_options({"index": "inverted-id", "seed": 3})


def test_random_dropping_keeps_the_buffer_at_its_size_and_a_gap_costs_nothing():
    q, streams, ts, tup = _overlap_case()
    cq = ContinuousQuery(q, "shed", "append", shed="random", capacity=5_000, buffer=0.5)
    ex = cq.executor
    for k in range(len(tup)):  # one arrival at a time: after each, at most a buffer's worth
        cq.process(streams[k:k + 1], None, ts[k:k + 1], tup[k:k + 1])
        i = streams[k]
        assert len(ex.buffers[i]) <= len(ex.recent[i])
    assert sum(ex.drops) > 0
    gap = ContinuousQuery(q, "shed", "append", shed="selective", capacity=100,
                          controller=ShedController("selective"))
    gap.process([0, 1, 0, 1], None, [0.0, 0.5, 1e7, 1e7 + 0.5], as_tuples(
        q, [0, 1, 0, 1], [{"s": [1, 2], "w": None, "v": 0, "id": k} for k in range(4)]))
    assert gap.executor.controller.steps <= 70  # not 2·10⁶ empty periods


def test_nested_list_items_are_named():
    from adaptcq.errors import InputError
    q = parse_query("SELECT R.id AS r FROM R [RANGE 4 SECONDS], S [RANGE 4 SECONDS] "
                    "WHERE OVERLAP(R.s, S.s) >= 1", {"R": SCHEMA, "S": SCHEMA})
    cq = ContinuousQuery(q, "shed", "append")
    with pytest.raises(InputError, match=r"OVERLAP\(R.s, S.s\) >= 1: a set's items must"):
        cq.process([0], None, [0.0], as_tuples(q, [0], [{"s": [[1], [2]], "w": None,
                                                         "v": 0, "id": 0}]))


@pytest.mark.parametrize("index", ["none", "inverted", "inverted-id"])
@pytest.mark.parametrize("cond, r, s, joins", [
    ("OVERLAP(R.s, S.s) >= 1", [None, 7], [None, 8], False),  # NULL is no shared item
    ("OVERLAP(R.s, S.s) >= 2", [None, 7], [None, 7], False),
    ("OVERLAP(R.s, S.s) >= 1", [None, 7], [7], True),
    ("SET_EQUAL(R.s, S.s)", [None, 7], [7], True),            # a set is its non-NULL items
    ("SET_EQUAL(R.s, S.s)", [None], [], True),
    ("SUBSET(R.s, S.s)", [None], [8], True),
    ("SUBSET(R.s, S.s)", [None, 7], [8, None], False),
    ("SUPERSET(R.s, S.s)", [7], [None, 7], True),
    ("INNER_PRODUCT(R.w, S.w) >= 2", {1: None, 2: 1.0}, {1: 5.0, 2: 2.0}, True),
    ("INNER_PRODUCT(R.w, S.w) >= 3", {1: None, 2: 1.0}, {1: 5.0, 2: 2.0}, False),
    ("INNER_PRODUCT(R.w, S.w) >= 1", {None: 1.0}, {None: 1.0}, False),  # (not from Arrow)
])
def test_null_set_items_are_shared_with_no_set(cond, r, s, joins, index):
    """docs/shedding.md, "Set-valued joins": a NULL item equals nothing (as SQL's
    ARRAY[NULL,7] && ARRAY[NULL,8] is false); a NULL weight adds nothing. The engine with
    every index, and the oracle, agree with the definition."""
    q = parse_query(f"SELECT R.id AS r, S.id AS i FROM R [RANGE 4 SECONDS], "
                    f"S [RANGE 4 SECONDS] WHERE {cond}", {"R": SCHEMA, "S": SCHEMA})
    key = "w" if "INNER" in cond else "s"
    rows = [{"s": None, "w": None, "v": 0, "id": 0}, {"s": None, "w": None, "v": 0, "id": 1}]
    rows[0][key], rows[1][key] = r, s
    streams, ts = [0, 1], [0.0, 0.5]
    tup = as_tuples(q, streams, rows)
    want = Counter({(0, 1, 1, 0.5): 1}) if joins else Counter()
    assert oracle_total(q, streams, ts, tup) == want
    cq = ContinuousQuery(q, "shed", "append", index=index)
    assert Counter(cq.process(streams, None, ts, tup) + cq.finish()) == want


def test_explain_of_an_equi_join_with_select_star_still_measures(tmp_path, capsys):
    import pyarrow.parquet as pq

    from adaptcq.cli import main
    t = pa.table({"ts": [0.0, 0.5, 1.0], "a": [1, 1, 2]})
    for n in "RS":
        pq.write_table(t, tmp_path / f"{n}.parquet")
    sql = "SELECT * FROM R [RANGE 1 SECONDS], S [RANGE 1 SECONDS] WHERE R.a = S.a"
    assert main(["explain", "--sql", sql, "--input", f"R={tmp_path / 'R.parquet'}",
                 "--input", f"S={tmp_path / 'S.parquet'}"]) == 0
    assert "load-shedding" not in capsys.readouterr().out


def test_the_reported_capacity_is_the_one_given():
    """The capacity travels per engine time unit (ns): 2000 came back 2000.0000000000002
    in the run summary (found by fuzzing)."""
    q = parse_query("SELECT R.a FROM R [RANGE 1 SECONDS], S [RANGE 1 SECONDS] "
                    "WHERE R.a = S.a", {"R": {"a": "number"}, "S": {"a": "number"}})
    for capacity in (2000, 1000, 156250, 0.5):
        cq = ContinuousQuery(q, "shed", "append", capacity=capacity)
        assert cq.executor.report()["capacity"] == capacity
