"""NiagaraCQ's PullUp and PushDown plans (cacq.txt §5, Figure 10) against the brute-force
oracle: random query sets shaped like §5's (``SELECT * FROM stocks s, articles a WHERE
<selection on s> AND s.symbol = a.symbol``, sometimes with a third stream, sharing a join or
not), random selections (ranges, IN, BETWEEN, OR, NULL tests, UDFs), random windows, random
data, queries registered and removed at random points, append and retract mode. Each
query's output must equal the oracle run on that query alone over the arrivals of its
interval (docs/cacq.md, "What a query sees")."""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adaptcq.engine.niagara import PullUp, PushDown
from adaptcq.errors import OptionError
from adaptcq.query.cql import parse_query
from adaptcq.query.udf import register_udf, unregister_udf
from conftest import examples
from oracle import interval_outputs

COLS = {"stocks": ("symbol", "price", "vol"), "articles": ("symbol", "topic", "len"),
        "trades": ("symbol", "qty")}
SCHEMAS = {"stocks": {"symbol": "number", "price": "number", "vol": "number"},
           "articles": {"symbol": "number", "topic": "string", "len": "number"},
           "trades": {"symbol": "number", "qty": "number"}}
EXECUTORS = {"pullup": PullUp, "pushdown": PushDown}



@pytest.fixture(autouse=True, scope="module")
def _udfs():
    """UDFs in the default registry for this module's tests only: the oracle compiles with
    it, and so do the executors when given no udfs= (cacq.txt §5, Figure 11(b): each user
    selects quotes with a UDF). Removed afterwards: every parse without udfs= resolves the
    whole default registry."""
    register_udf("nq_cheap", lambda price: None if price is None else price < 3)
    register_udf("nq_odd", lambda price, vol: price is not None and vol is not None
                 and (price + vol) % 2 == 1)
    yield
    unregister_udf("nq_cheap")
    unregister_udf("nq_odd")


STOCK_SELECTIONS = [
    "{s}.price > {x}", "{s}.price <= {x}", "{s}.price BETWEEN 1 AND {x}",
    "{s}.price IN (0, 2, {x})", "{s}.vol IS NULL", "({s}.price > {x} OR {s}.vol < 2)",
    "nq_cheap({s}.price)", "nq_odd({s}.price, {s}.vol)", "{s}.price > {x} AND {s}.vol >= 1",
    "NOT ({s}.price BETWEEN 1 AND {x})", "{s}.price + 1 > {s}.vol",
]
ARTICLE_SELECTIONS = ["{a}.topic = 'x'", "{a}.len > 1", "{a}.topic IN ('x', 'y')",
                      "({a}.len < 1 OR {a}.topic IS NULL)"]


@st.composite
def a_join(draw):
    """A join signature: stocks ⋈ articles on symbol (§5), sometimes ⋈ trades."""
    three = draw(st.integers(0, 3)) == 0
    sources = ["stocks", "articles"] + (["trades"] if three else [])
    windows = {}
    for src in sources:
        kind = draw(st.sampled_from(["range", "range", "rows", "none"]))
        if kind == "range":
            windows[src] = f" [RANGE {draw(st.sampled_from([0, 1, 2.5]))} SECONDS]"
        elif kind == "rows":
            windows[src] = f" [ROWS {draw(st.integers(1, 3))}]"
        else:
            windows[src] = ""
    extra = three and draw(st.booleans())   # a second predicate: trades.qty = articles.len
    return sources, windows, extra


@st.composite
def a_query(draw, joins):
    sources, windows, extra = draw(st.sampled_from(joins))
    alias = {"stocks": draw(st.sampled_from(["s", "q"])), "articles": "a", "trades": "t"}
    order = list(sources)
    if draw(st.booleans()):
        order.reverse()
    items = [f"{src}{windows[src]} AS {alias[src]}" for src in order]
    s, a = alias["stocks"], alias["articles"]
    preds = [f"{s}.symbol = {a}.symbol"]
    if "trades" in sources:
        preds.append(f"t.symbol = {draw(st.sampled_from([s, a]))}.symbol")
        if extra:
            preds.append(f"t.qty = {a}.len")
    for _ in range(draw(st.integers(0, 2))):
        x = draw(st.integers(0, 4))
        preds.append(draw(st.sampled_from(STOCK_SELECTIONS)).format(s=s, x=x))
    if draw(st.integers(0, 2)) == 0:
        preds.append(draw(st.sampled_from(ARTICLE_SELECTIONS)).format(a=a))
    draw(st.randoms()).shuffle(preds)
    select = draw(st.sampled_from(["*", f"{s}.price, {a}.topic", f"{a}.len AS n, {s}.symbol"]))
    return f"SELECT {select} FROM {', '.join(items)} WHERE {' AND '.join(preds)}"


symbols = st.sampled_from([0, 0, 1, 1, 2, None])
small = st.sampled_from([0, 1, 2, 3, 4, None])


@st.composite
def arrivals(draw, max_size=45):
    out, t = [], 0.0
    for _ in range(draw(st.integers(0, max_size) | st.integers(20, max_size))):
        t += draw(st.sampled_from([0, 0, 0.5, 0.5, 1, 2.5]))
        src = draw(st.sampled_from(["stocks", "stocks", "articles", "articles", "trades"]))
        if src == "stocks":
            row = (draw(symbols), draw(small), draw(small))
        elif src == "articles":
            row = (draw(symbols), draw(st.sampled_from(["x", "x", "y", "z", None])),
                   draw(small))
        else:
            row = (draw(symbols), draw(small))
        out.append((src, t, row))
    return out


@st.composite
def scenarios(draw):
    data = draw(arrivals())
    n = len(data)
    joins = draw(st.lists(a_join(), min_size=1, max_size=2))
    queries = []
    for _ in range(draw(st.integers(1, 5))):
        sql = draw(a_query(joins))
        lo = draw(st.integers(0, n // 3) | st.integers(0, n))
        hi = draw(st.just(n + 1) | st.integers(lo, n + 1))
        queries.append((sql, lo, hi))
    return data, queries, draw(st.sampled_from(["append", "retract"]))


def expected(sql: str, data, lo: int, hi: int, mode: str) -> Counter:
    """The oracle on ``sql`` alone over the arrivals (lo, hi]; arrivals of the sources it
    does not read only advance time."""
    return interval_outputs(parse_query(sql, SCHEMAS), data, lo, hi, mode, lambda src: COLS[src])


def run(cls, queries, data, mode):
    """Queries register before arrival ``lo + 1`` and leave after arrival ``hi``."""
    ex = cls(SCHEMAS, None, mode=mode)
    outs = {h: [] for h in range(len(queries))}
    events = sorted([(lo, 0, h) for h, (_, lo, _) in enumerate(queries)]
                    + [(hi, 1, h) for h, (_, _, hi) in enumerate(queries)])
    k = 0
    for seq0, (src, t, row) in enumerate(data):
        while k < len(events) and events[k][0] <= seq0:
            _, action, h = events[k]
            k += 1
            if action == 0:
                ex.add_query(f"q{h}", parse_query(queries[h][0], SCHEMAS), outs[h].append)
            else:
                ex.remove_query(f"q{h}")
        ex.process(src, t, row)
    return outs, ex


def check(queries, data, mode, outs) -> None:
    n = len(data)
    for h, (sql, lo, hi) in enumerate(queries):
        want = expected(sql, data, lo, min(hi, n), mode) if lo < n else Counter()
        got = Counter(outs[h])
        assert got == want, (f"query {h} {sql} over ({lo}, {hi}] ({mode}): missing "
                             f"{want - got}, extra {got - want}")


@pytest.mark.parametrize("executor", sorted(EXECUTORS))
@settings(max_examples=examples(200), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(scenario=scenarios())
def test_plan_equals_oracle_per_query(executor, scenario):
    data, queries, mode = scenario
    outs, ex = run(EXECUTORS[executor], queries, data, mode)
    check(queries, data, mode, outs)
    assert ex.failures == []


# ----- the plans' shapes (Figure 10) -----------------------------------------------------------
SQL = ("SELECT * FROM stocks s, articles a WHERE s.price > {x} AND s.symbol = a.symbol")


def _three_queries(cls):
    ex = cls(SCHEMAS, None)
    outs = {}
    for x in (0, 2, 4):
        outs[x] = []
        ex.add_query(f"x{x}", parse_query(SQL.format(x=x), SCHEMAS), outs[x].append)
    return ex, outs


def test_pullup_shares_one_join_and_selects_after_it():
    ex, outs = _three_queries(PullUp)
    (group,) = ex.describe()["groups"]
    assert group["queries"] == ["x0", "x2", "x4"]
    assert group["grouped selection (after the join)"] == ["stocks.price (3 predicates)"]
    ex.process("articles", 0.0, (1, "x", 5))
    ex.process("stocks", 1.0, (1, 3, 0))      # selected by x0 and x2
    ex.process("stocks", 2.0, (1, 0, 0))      # selected by none: joined all the same
    assert ex.counts["joined"] == 2 and ex.counts["selections"] == 2
    assert [len(outs[x]) for x in (0, 2, 4)] == [1, 1, 0]


def test_pushdown_selects_first_and_joins_once_per_query():
    ex, outs = _three_queries(PushDown)
    d = ex.describe()
    assert d["grouped selections"] == {"stocks": ["stocks.price (3 predicates)"],
                                       "articles": []}
    assert list(d["shared SteMs"]) == ["articles [UNBOUNDED]"]   # one articles hash table
    ex.process("articles", 0.0, (1, "x", 5))
    ex.process("stocks", 1.0, (1, 3, 0))      # selected by x0 and x2: joined twice
    ex.process("stocks", 2.0, (1, 0, 0))      # selected by none: not joined
    assert ex.counts["selections"] == 3        # one grouped evaluation per tuple
    # the article probed three (empty) stocks tables, the quote was joined twice
    assert ex.counts["joins"] == 5 and ex.counts["joined"] == 2
    assert [len(outs[x]) for x in (0, 2, 4)] == [1, 1, 0]
    assert len(ex.shared[("articles", "unbounded", None)].stem) == 1


def test_different_joins_are_different_groups():
    ex = PullUp(SCHEMAS, None)
    ex.add_query("a", parse_query(SQL.format(x=1), SCHEMAS), print)
    ex.add_query("b", parse_query(SQL.format(x=1).replace("articles a", "articles [ROWS 2] a"),
                                  SCHEMAS), print)
    assert len(ex.describe()["groups"]) == 2
    ex.remove_query("a")
    assert len(ex.describe()["groups"]) == 1


# ----- refusals and failures ------------------------------------------------------------------
@pytest.mark.parametrize("cls", [PullUp, PushDown])
def test_unsupported_query_sets_are_refused(cls):
    ex = cls(SCHEMAS, None)
    ex.add_query("ok", parse_query(SQL.format(x=1), SCHEMAS), print)
    self_join = parse_query("SELECT * FROM stocks s, stocks s2 WHERE s.symbol = s2.symbol",
                            SCHEMAS)
    with pytest.raises(OptionError, match=r"query 'sj' reads 'stocks' twice.*self-join.*"
                                          r"identical tuple sets"):
        ex.add_query("sj", self_join, print)
    with pytest.raises(OptionError, match="query 'w': start='window' is not supported"):
        ex.add_query("w", parse_query(SQL.format(x=1), SCHEMAS), print, start="window")
    with pytest.raises(OptionError, match="already registered"):
        ex.add_query("ok", parse_query(SQL.format(x=2), SCHEMAS), print)
    with pytest.raises(OptionError, match="no query is registered as 'nope'"):
        ex.remove_query("nope")
    with pytest.raises(OptionError, match="retain="):
        cls(SCHEMAS, None, retain={"stocks": 10})
    # a UDF the parser knew but the executor does not: refused when compiled
    other = {"only_here": lambda p: True}
    with pytest.raises(Exception, match="only_here"):
        ex.add_query("u", parse_query("SELECT * FROM stocks s, articles a WHERE only_here("
                                      "s.price) AND s.symbol = a.symbol", SCHEMAS,
                                      udfs=other), print)
    assert list(ex.queries) == ["ok"]          # the refused queries left nothing behind
    before = ex.describe()
    ex.add_query("ok2", parse_query(SQL.format(x=2), SCHEMAS), print)
    ex.remove_query("ok2")
    assert ex.describe() == before


@pytest.mark.parametrize("cls", [PullUp, PushDown])
def test_a_raising_udf_fails_its_query_only(cls):
    def boom(price):
        if price == 3:
            raise ValueError("no threes")
        return True
    udfs = {"boom": boom}
    ex = cls(SCHEMAS, None, udfs=udfs)
    good, bad = [], []
    ex.add_query("good", parse_query(SQL.format(x=0), SCHEMAS), good.append)
    ex.add_query("bad", parse_query("SELECT * FROM stocks s, articles a WHERE boom(s.price) "
                                    "AND s.symbol = a.symbol", SCHEMAS, udfs=udfs), bad.append)
    ex.process("articles", 0.0, (1, "x", 5))
    ex.process("stocks", 1.0, (1, 2, 0))
    ex.process("stocks", 2.0, (1, 3, 0))
    ex.process("stocks", 3.0, (1, 4, 0))
    assert len(good) == 3 and len(bad) == 1
    assert list(ex.queries) == ["good"]
    ((handle, message),) = ex.failures
    assert handle == "bad" and "no threes" in message


# ----- through the Engine ---------------------------------------------------------------------
@pytest.mark.parametrize("executor", ["pullup", "pushdown"])
@pytest.mark.parametrize("mode", ["append", "retract"])
def test_engine_runs_the_baselines_like_the_eddy(executor, mode):
    from adaptcq.runtime.multi import Engine
    stocks = pa.table({"symbol": [1, 2, 1, 2, 1, 3], "price": [10.0, 50.0, 90.0, 5.0, 70.0, 1.0],
                       "ts": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]})
    articles = pa.table({"symbol": [1, 2, 3, 1], "topic": ["a", "b", "c", "d"],
                         "ts": [0.0, 0.5, 0.7, 4.5]})
    q1 = ("SELECT s.price, a.topic FROM stocks [RANGE 2 SECONDS] s, articles a "
          "WHERE s.price > {x} AND s.symbol = a.symbol")
    q2 = ("SELECT * FROM stocks [ROWS 2] s, articles a WHERE s.price BETWEEN 5 AND {x} "
          "AND s.symbol = a.symbol")
    queries = [(q1, None, None), (q2, 2.5, 5.0)]
    tables = {}
    for ex in ("eddy", executor):
        engine = Engine(sources={"stocks": stocks, "articles": articles}, timestamp="ts",
                        executor=ex, mode=mode)
        hs = [engine.register(sql.format(x=x), at=at) for x, (sql, at, _) in
              zip((20, 60), queries, strict=True)]
        for h, (_, _, until) in zip(hs, queries, strict=True):
            if until is not None:
                engine.deregister(h, at=until)
        engine.run()
        tables[ex] = [sorted(h.table().to_pylist(), key=repr) for h in hs]
    assert tables[executor] == tables["eddy"]
    assert any(tables["eddy"])
