"""The CACQ eddy against the brute-force oracle: random query sets over shared sources
(overlapping selections, disjunctions, different windows, different join predicates
between the same sources, self-joins), registered and removed at random points, under
every routing policy and seed, in append and retract mode. Each query's output must equal
the oracle run on that query alone over the arrivals of its interval (cacq.txt §3;
docs/cacq.md "What a query sees")."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adaptcq.adapt.routing import make_routing
from adaptcq.engine.eddy import Eddy, PerQueryEddies
from adaptcq.errors import OptionError, QueryError
from adaptcq.query.cql import parse_query
from conftest import examples
from oracle import interval_outputs

COLS = ("a", "b", "c", "d")
KINDS = {"a": "number", "b": "number", "c": "number", "d": "string"}
SCHEMAS = {s: dict(KINDS) for s in ("R", "S", "T")}
ROUTINGS = ("tickets", "lottery", "random", "fixed")

SELECTIONS = [
    "{s}.c > 0", "{s}.c IS NOT NULL", "{s}.c IN (0, 2)", "{s}.a <= 1",
    "({s}.c BETWEEN 0 AND 1 OR {s}.a = 2)", "{s}.c <> 1", "{s}.d = 'x'",
    "({s}.d > 'x' OR {s}.c IS NULL)", "NOT ({s}.a = 1 AND {s}.b > 0)", "{s}.a + 1 > {s}.b",
    "{s}.d IN ('x', 'y') AND {s}.a >= 1",
]


@st.composite
def a_query(draw):
    """A random connected join over 1-3 aliases of R, S, T (self-joins allowed)."""
    n = draw(st.integers(1, 3))
    sources = [draw(st.sampled_from("RST")) for _ in range(n)]
    aliases = [f"x{i}" for i in range(n)]
    items = []
    for src, alias in zip(sources, aliases, strict=True):
        kind = draw(st.sampled_from(["range", "range", "rows", "none"]))
        win = ""
        if kind == "range":
            win = f" [RANGE {draw(st.sampled_from([0, 1, 2.5, 4]))} SECONDS]"
        elif kind == "rows":
            win = f" [ROWS {draw(st.integers(1, 4))}]"
        items.append(f"{src}{win} AS {alias}")
    preds = []
    for i in range(1, n):
        j = draw(st.integers(0, i - 1))
        preds.append(f"{aliases[j]}.{draw(st.sampled_from(COLS[:3]))} = "
                     f"{aliases[i]}.{draw(st.sampled_from(COLS[:3]))}")
    if n == 3 and draw(st.booleans()):  # a cycle or a second predicate between a pair
        preds.append(f"{aliases[0]}.b = {aliases[2]}.b")
    for alias in aliases:
        if draw(st.integers(0, 2)) == 0:
            preds.append(draw(st.sampled_from(SELECTIONS)).format(s=alias))
    select = draw(st.sampled_from(["*", ", ".join(f"{a}.a AS a{i}" for i, a in enumerate(aliases))]))
    where = f" WHERE {' AND '.join(preds)}" if preds else ""
    return f"SELECT {select} FROM {', '.join(items)}{where}"


values = st.one_of(st.none(), st.integers(0, 2))
strings = st.one_of(st.none(), st.sampled_from(["x", "y", "z"]))


@st.composite
def arrivals(draw, max_size=36):
    n = draw(st.integers(0, max_size))
    out, t = [], 0.0
    for _ in range(n):
        t += draw(st.sampled_from([0, 0, 0.5, 1, 2.5]))
        row = (draw(values), draw(values), draw(values), draw(strings))
        out.append((draw(st.sampled_from("RST")), t, row))
    return out


@st.composite
def scenarios(draw):
    data = draw(arrivals())
    n = len(data)
    queries = []
    for _ in range(draw(st.integers(1, 4))):
        sql = draw(a_query())
        lo = draw(st.integers(0, n))
        hi = draw(st.integers(lo, n + 1))
        queries.append((sql, lo, hi))
    mode = draw(st.sampled_from(["append", "retract"]))
    routing = draw(st.sampled_from(ROUTINGS))
    seed = draw(st.integers(0, 3))
    epoch = draw(st.sampled_from([None, None, 1, 4]))   # None: a decision per step
    return data, queries, mode, (routing, epoch), seed


def expected(sql: str, data, lo: int, hi: int, mode: str) -> Counter:
    """The oracle on ``sql`` alone over the arrivals (lo, hi]: each source row is an
    arrival for each of its aliases, in alias order; arrivals of other sources only
    advance time."""
    return interval_outputs(parse_query(sql, SCHEMAS), data, lo, hi, mode, lambda src: COLS)


def run_eddy(queries, data, mode, routing, seed, cls=Eddy, snapshot_at=None):
    """Run the query set; queries register before arrival ``lo + 1`` and leave after
    arrival ``hi``. ``snapshot_at``: snapshot and restore the engine before that arrival."""
    routing, epoch = routing if isinstance(routing, tuple) else (routing, None)
    policy = make_routing(routing, seed=seed)
    ed = cls(SCHEMAS, policy, mode=mode, routing_epoch=epoch)
    outs = {h: [] for h in range(len(queries))}
    events = sorted([(lo, 0, h) for h, (_, lo, _) in enumerate(queries)]
                    + [(hi, 1, h) for h, (_, _, hi) in enumerate(queries)])
    k = 0
    for seq0, (src, t, row) in enumerate(data):
        while k < len(events) and events[k][0] <= seq0:
            _, action, h = events[k]
            k += 1
            if action == 0:
                ed.add_query(f"q{h}", parse_query(queries[h][0], SCHEMAS), outs[h].append)
            else:
                ed.remove_query(f"q{h}")
        if snapshot_at == seq0:
            state = ed.snapshot()
            emits = {f"q{h}": outs[h].append for h in outs}
            ed = Eddy.restore(state, SCHEMAS, type(policy).from_state(state["policy"]),
                              lambda sql: parse_query(sql, SCHEMAS), emits)
        ed.process(src, t, row)
    return outs, ed


def check(queries, data, mode, outs) -> None:
    n = len(data)
    for h, (sql, lo, hi) in enumerate(queries):
        want = expected(sql, data, lo, min(hi, n), mode) if lo < n else Counter()
        got = Counter(outs[h])
        assert got == want, (f"query {h} {sql} over ({lo}, {hi}] ({mode}): missing "
                             f"{want - got}, extra {got - want}")


@settings(max_examples=examples(250), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_eddy_equals_oracle_per_query(scenario):
    data, queries, mode, routing, seed = scenario
    outs, _ = run_eddy(queries, data, mode, routing, seed)
    check(queries, data, mode, outs)


@settings(max_examples=examples(60), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(), st.integers(0, 40))
def test_snapshot_and_restore_mid_run(scenario, at):
    data, queries, mode, routing, seed = scenario
    outs, _ = run_eddy(queries, data, mode, routing, seed, snapshot_at=at)
    check(queries, data, mode, outs)


@settings(max_examples=examples(40), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_one_eddy_per_query_baseline_equals_oracle(scenario):
    data, queries, mode, routing, seed = scenario
    outs, _ = run_eddy(queries, data, mode, routing, seed, cls=PerQueryEddies)
    check(queries, data, mode, outs)


def test_self_join_pairs_a_row_with_itself_once():
    """Our semantics pair a tuple with itself through two aliases (the single-query
    engine's alias-by-alias arrivals); the strict sequence rule alone never would."""
    sql = "SELECT x.a AS xa, y.a AS ya FROM R AS x, R AS y WHERE x.a = y.a"
    outs, _ = run_eddy([(sql, 0, 9)], [("R", 0.0, (1, 0, 0, "x")), ("R", 1.0, (1, 0, 0, "y"))],
                       "append", "random", 0)
    assert Counter(outs[0]) == Counter({(1, 1, 1, 0.0): 1, (1, 1, 1, 1.0): 3})


def test_queries_share_one_stem_and_grouped_filters():
    ed = Eddy(SCHEMAS, make_routing("tickets"))
    for k, x in enumerate((10, 20, 30)):
        ed.add_query(f"q{k}", parse_query(
            f"SELECT * FROM R, S WHERE R.a = S.a AND R.b > {x} AND R.c < {x}", SCHEMAS),
            lambda row: None)
    d = ed.describe()
    labels = [o["operator"] for o in d["operators"]]
    assert labels.count("GF R.b") == 1 and labels.count("GF R.c") == 1
    ed.process("R", 0.0, (1, 50, 0, "x"))
    ed.process("S", 1.0, (1, 0, 0, "x"))
    stems = [o for o in ed.describe()["operators"] if o["operator"].startswith("SteM")]
    assert {o["operator"] for o in stems} == {"SteM R", "SteM S"}
    assert len(ed.sources["R"].stem) == 1     # one row, shared by all three queries


def test_removed_query_bit_is_reused_and_sees_nothing_older():
    out1, out2 = [], []
    ed = Eddy(SCHEMAS, make_routing("fixed"))
    ed.add_query("a", parse_query("SELECT * FROM R, S WHERE R.a = S.a", SCHEMAS), out1.append)
    ed.process("R", 0.0, (1, 0, 0, "x"))
    ed.remove_query("a")
    q = ed.add_query("b", parse_query("SELECT * FROM R, S WHERE R.a = S.a", SCHEMAS),
                     out2.append)
    assert q.bit == 0
    ed.process("S", 1.0, (1, 0, 0, "x"))
    assert out1 == [] and out2 == []        # the R row arrived before b was registered


def test_start_with_window_contents():
    out = []
    ed = Eddy(SCHEMAS, make_routing("fixed"), retain={"R": 10})
    ed.process("R", 0.0, (1, 5, 0, "x"))
    ed.process("R", 0.5, (1, 0, 0, "x"))
    ed.add_query("w", parse_query("SELECT R.b FROM R [RANGE 5 SECONDS], S WHERE R.a = S.a "
                                  "AND R.b > 1", SCHEMAS), out.append, start="window")
    ed.process("S", 1.0, (1, 0, 0, "x"))
    assert out == [(5, 1, 1.0)]


def test_bad_registrations_are_clear_errors():
    ed = Eddy(SCHEMAS, make_routing("tickets"))
    with pytest.raises(QueryError, match="unknown source 'U'"):
        ed.add_query("u", parse_query("SELECT * FROM U", {"U": KINDS}), print)
    with pytest.raises(OptionError, match="no query is registered as 'nope'"):
        ed.remove_query("nope")
    ed.add_query("x", parse_query("SELECT * FROM R", SCHEMAS), print)
    with pytest.raises(OptionError, match="already registered"):
        ed.add_query("x", parse_query("SELECT * FROM R", SCHEMAS), print)


@pytest.mark.parametrize("mode", ["append", "retract"])
def test_a_removed_rows_window_lets_go_of_its_rows(mode):
    """The count hold of the last [ROWS n] window on a source was never let go once its
    query left (``recent`` was only trimmed while some query had a count window): the
    source kept n rows for the rest of the run. The state is now what the running
    queries need, and their results are unchanged."""
    rows_q = "SELECT * FROM R [ROWS 50], S [RANGE 1 SECONDS] WHERE R.a = S.a"
    range_q = "SELECT R.b AS rb, S.b AS sb FROM R [RANGE 1 SECONDS], S [RANGE 1 SECONDS] WHERE R.a = S.a"
    data = [(src, float(i) + (0.5 if src == "S" else 0), (i % 3, i, 0, "x"))
            for i in range(120) for src in "RS"]
    outs = {}
    for with_rows in (True, False):
        ed = Eddy(SCHEMAS, make_routing("fixed"), mode=mode)
        if with_rows:
            ed.add_query("rows", parse_query(rows_q, SCHEMAS), [].append)
        out = outs[with_rows] = []
        for i, (src, t, row) in enumerate(data):
            if i == 100:
                if with_rows:
                    ed.remove_query("rows")
                ed.add_query("range", parse_query(range_q, SCHEMAS), out.append)
            ed.process(src, t, row)
        assert len(ed.sources["R"].stem) <= 2, len(ed.sources["R"].stem)   # [RANGE 1 s]
    assert outs[True] == outs[False] != []
