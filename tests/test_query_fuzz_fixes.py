"""Fixes of the query front end's fuzzing: the eddy joining a NaN key with itself in a
self-join, the caret under a line holding tabs, wide characters or a lone CR, the oracle's
decimal literals and computed NaN in SELECT, stray commas and an empty ``IN ()`` refused,
and what ``adaptcq explain`` says where ``adaptcq run`` would decide otherwise."""

from __future__ import annotations

import json
from collections import Counter
from decimal import Decimal

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import adaptcq
from adaptcq.cli import main
from adaptcq.engine.continuous import ContinuousQuery
from adaptcq.errors import QueryError
from adaptcq.query.cql import parse_query
from conftest import examples
from oracle import Oracle, assert_equals_oracle, interval_outputs, nan_safe

NAN = float("nan")


# ----- 1. the eddy: a NaN join key joins nothing, not even its own row ----------------------
def _eddy_pairs(sql, tables, executor, **options):
    e = adaptcq.Engine(sources=tables, executor=executor, **options)
    h = e.register(sql)
    e.run()
    return sorted(map(tuple, (r.values() for r in h.table().select(["x", "y"]).to_pylist())))


@pytest.mark.parametrize("executor", ["eddy", "eddies"])
@pytest.mark.parametrize("epoch", [None, 1, 1000])   # interpreted; compiled routes
@pytest.mark.parametrize("mode", ["append", "retract"])
def test_a_nan_row_does_not_join_itself_in_a_self_join(executor, epoch, mode):
    """The fuzzer's case: rows (nan, 0), (1.0, 1) joined on f with themselves give only
    (1, 1); the NaN row's probe key was the very object stored in the SteM's index, which
    Python's dict matches by identity. A two-column key (a tuple) likewise."""
    t = pa.table({"ts": [1.0, 2.0, 3.0], "f": [NAN, 1.0, NAN], "k": [1, 1, 1],
                  "id": [0, 1, 2]})
    for where in ("a.f = b.f", "a.f = b.f AND a.k = b.k", "a.k = b.k AND a.f = b.f"):
        sql = f"SELECT a.id AS x, b.id AS y FROM T a, T b WHERE {where}"
        assert _eddy_pairs(sql, {"T": t}, executor, routing_epoch=epoch, mode=mode) == \
            [(1, 1)], where


KEYS = st.sampled_from([NAN, -0.0, 0.0, 1.0, None])
WINDOWS = ("", "", " [ROWS 2]", " [RANGE 1 SECONDS]")
SCHEMAS = {"T": {"ts": "number", "f": "number", "g": "number", "id": "number"},
           "U": {"ts": "number", "f": "number", "id": "number"}}
SHAPES = [
    "FROM T{0} a, T{1} b WHERE a.f = b.f",
    "FROM T{0} a, T{1} b WHERE a.f = b.f AND a.g = b.g",
    "FROM T{0} a, U{1} b WHERE a.f = b.f",
    "FROM T{0} a, T{1} b, U{2} c WHERE a.f = b.f AND b.f = c.f",
    "FROM T{0} a, T{1} b, T{2} c WHERE a.f = b.g AND b.f = c.f",
    "FROM T{0} a, U{1} b, T{2} c WHERE a.g = b.f AND b.f = c.f AND a.f = c.g",
]


@st.composite
def nan_scenarios(draw):
    """Rows of T and U with float keys among NaN, -0.0, 0.0, 1.0 and NULL at distinct
    times, a self-join or 2-3 way join over them, windows (RANGE in append mode only: the
    engine does not advance time past the last arrival), a mode and a routing epoch."""
    mode = draw(st.sampled_from(["append", "retract"]))
    shape = draw(st.sampled_from(SHAPES))
    windows = [w for w in WINDOWS if mode == "append" or "RANGE" not in w]
    sql = ("SELECT a.id AS x, b.id AS y, a.f AS v "
           + shape.format(*(draw(st.sampled_from(windows)) for _ in range(3))))
    data = []
    for k in range(draw(st.integers(1, 12))):
        src = draw(st.sampled_from("TU"))
        row = (float(k), draw(KEYS), draw(KEYS), k) if src == "T" else \
              (float(k), draw(KEYS), k)
        data.append((src, float(k), row))
    return sql, data, mode, draw(st.sampled_from([None, 1, 1000]))


@settings(max_examples=examples(40), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(nan_scenarios(), st.sampled_from(["eddy", "eddies"]))
def test_eddy_joins_on_nan_zero_and_null_keys_equal_the_oracle(scenario, executor):
    sql, data, mode, epoch = scenario
    cols = {s: tuple(SCHEMAS[s]) for s in SCHEMAS}
    tables = {s: pa.table({c: pa.array([r[j] for src, _, r in data if src == s],
                                       pa.float64() if c != "id" else pa.int64())
                           for j, c in enumerate(cols[s])}) for s in cols}
    e = adaptcq.Engine(sources=tables, executor=executor, mode=mode, routing_epoch=epoch)
    h = e.register(sql)
    e.run()
    got = Counter(tuple(r.values()) for r in h.table().to_pylist())
    want = interval_outputs(parse_query(sql, SCHEMAS), data, 0, len(data), mode,
                            cols.__getitem__)
    assert nan_safe(got) == nan_safe(want), (sql, data)


# ----- 2. the caret: by display width -------------------------------------------------------
def _error(sql: str) -> QueryError:
    with pytest.raises(QueryError) as e:
        parse_query(sql, {"R": {"ts": "number", "k": "number", "x": "number"}})
    return e.value


def _caret_line(e: QueryError) -> str:
    return str(e).splitlines()[-1][2:]


def test_the_caret_keeps_tabs_and_counts_wide_characters_twice():
    e = _error("SELECT R.k\tFROM R\tWHERE R.zz = 1")
    assert "(line 1, column 25)" in str(e)
    assert _caret_line(e) == " " * 10 + "\t" + " " * 6 + "\t" + " " * 6 + "^^^^"
    e = _error("SELECT '日本日本' AS x, R.zz FROM R")
    assert "(line 1, column 21)" in str(e)   # the column counts characters
    assert _caret_line(e) == " " * 24 + "^^^^"   # 日本日本 is 8 columns wide, not 4
    # a combining accent takes no column; a wide character inside the span two carets
    e = _error("SELECT 'e\u0301' AS x, R.zz FROM R")
    assert _caret_line(e) == " " * 17 + "^^^^"
    e = _error("SELECT R.k FROM R WHERE R.x = '日' AND R.zz = 1")
    line = str(e).splitlines()[-2][2:]
    assert line.index("R.zz") + 1 == len(_caret_line(e)) - 4   # (日: one index, two columns)


@pytest.mark.parametrize("brk", ["\n", "\r\n", "\r"])
def test_a_lone_cr_ends_a_line_as_lf_and_crlf_do(brk):
    for where in ("R.zz = 1", "R.x = = 1"):   # a schema error; sqlglot's syntax error
        e = _error(f"SELECT R.k{brk}FROM R{brk}WHERE {where}")
        assert "(line 3, column " in str(e)
        shown = str(e).splitlines()[-2]
        assert shown == f"  WHERE {where}"
        assert "\r" not in str(e)
    e = _error(f"SELECT R.k FROM R{brk}{brk}WHERE R.zz = 1")
    assert "(line 3, column 7)" in str(e) and _caret_line(e) == " " * 6 + "^^^^"


# ----- 3. the oracle ------------------------------------------------------------------------
def test_the_oracle_reads_decimal_literals_in_select():
    q = parse_query("SELECT R.m = 0.5 AS e FROM R, S WHERE R.k = S.k",
                    {"R": {"ts": "number", "k": "number", "m": "decimal"},
                     "S": {"ts": "number", "k": "number"}})
    _, outs = Oracle(q, "append").run([0, 1], None, [1, 1], [(1, Decimal("0.50")), (1,)])
    assert outs == [Counter(), Counter({(True, 1, 1): 1})]


@pytest.mark.parametrize("mode", ["append", "retract"])
def test_a_nan_computed_in_select_is_one_result_in_the_oracle(mode):
    """-R.f is a new NaN object each time the oracle projects: it once took every old
    result for a new one. Results are now told apart by the arrivals they join; MJoin
    agrees update by update (compared with every NaN one value)."""
    q = parse_query("SELECT -R.f AS e, S.id AS s FROM R, S [ROWS 1] WHERE R.k = S.k",
                    {"R": {"ts": "number", "k": "number", "f": "number"},
                     "S": {"ts": "number", "k": "number", "id": "number"}})
    streams, ts = [0, 1, 1, 0], [1, 2, 3, 4]
    rows = [(1, NAN), (1, 10), (1, 11), (1, 2.0)]
    _, outs = Oracle(q, mode).run(streams, None, ts, rows)
    # (R's NaN, S's 10, 10 leaves its [ROWS 1] (retract: -(nan, 10)), S's 11, R's 2.0:
    # one new result each, where the old results came out again as new ones)
    assert [sum(c.values()) for c in outs] == [0, 1, 1 if mode == "retract" else 0, 1, 1]
    cq = ContinuousQuery(q, "mjoin", mode, trace=True)
    out = cq.process(streams, None, ts, rows)
    assert_equals_oracle(q, mode, streams, ts, rows, cq.trace, out)


# ----- 4. stray commas and IN () ------------------------------------------------------------
@pytest.mark.parametrize("sql, at, length, says", [
    ("SELECT R.k, FROM R", ",", 1, "before 'FROM'"),
    ("SELECT R.k FROM R, S, WHERE R.k = S.k", "S,", 1, "before 'WHERE'"),
    ("SELECT R.k FROM R [ROWS 2], S, WHERE R.k = S.k", "S,", 1, "before 'WHERE'"),
    ("SELECT R.k FROM R WHERE R.x IN (1,)", "1,", 1, "before ')'"),
    ("SELECT R.k FROM R WHERE R.x IN (,1)", "(,", 1, "no item before it"),
    ("SELECT , R.k FROM R", ",", 1, "no item before it"),
    ("SELECT R.k,, R.x FROM R", ",,", 1, "before ','"),
    ("SELECT R.k FROM R WHERE R.x IN (1) ,", ") ,", 1, "the end of the query"),
    ("SELECT R.k FROM R, S, JOIN S AS T ON R.k = T.k", "S,", 1, "before 'JOIN'"),
    ("SELECT R.k FROM R WHERE R.x IN ()", "()", 2, "IN () lists no value"),
    ("SELECT R.k FROM R WHERE R.x NOT IN ( /* none */ )", "( /*", 14, "IN () lists no"),
])
def test_stray_commas_and_an_empty_in_are_refused_where_they_are(sql, at, length, says):
    schemas = {s: {"ts": "number", "k": "number", "x": "number"} for s in "RS"}
    with pytest.raises(QueryError) as e:
        parse_query(sql, schemas)
    pos = sql.index(at) + (at.index(",") if "," in at else 0)
    assert e.value.position == pos and e.value.length == length, str(e.value)
    assert says in e.value.message


@pytest.mark.parametrize("sql", [
    "SELECT R.k, R.x FROM R, S WHERE R.k = S.k AND R.x IN (1, 2);",
    "SELECT 'a,' AS s, R.k FROM R WHERE R.x IN ((1), 2) -- trailing,",
    "SELECT R.k FROM R /* , */ WHERE R.x NOT IN (1)",
])
def test_commas_between_items_are_accepted(sql):
    parse_query(sql, {s: {"ts": "number", "k": "number", "x": "number"} for s in "RS"})


# ----- 5. explain where run would decide otherwise -----------------------------------------
def test_explain_code_without_input_says_the_columns_are_not_checked(capsys):
    sql = "SELECT R.zz FROM R, Q WHERE R.k = Q.k AND R.s > 1"  # run refuses it (no R.zz)
    assert main(["explain", "--code", "--sql", sql]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# columns and types not checked (no --input)")
    assert "def pipeline(" in out
    assert main(["explain", "--code", "--json", "--sql", sql]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["note"].startswith("columns and types not checked") and report["code"]


def test_explain_reports_a_query_whose_selection_passes_no_row(tmp_path, capsys):
    """adaptcq run runs it; explain showed an error. It now shows the plans, with the σ's
    it could not measure named in its statistics line."""
    for s in "RS":
        pq.write_table(pa.table({"ts": [0.1 * k for k in range(50)], "a": [k % 3 for k in
                                                                            range(50)],
                                 "id": list(range(50))}), tmp_path / f"{s}.parquet")
    sql = "SELECT R.id FROM R, S WHERE R.a = S.a AND S.id < 0"
    inputs = [x for s in "RS" for x in ("--input", f"{s}={tmp_path / f'{s}.parquet'}")]
    assert main(["run", "--no-progress", "--sql", sql, *inputs, "--output",
                 str(tmp_path / "out")]) == 0
    capsys.readouterr()
    assert main(["explain", "--json", "--sql", sql, *inputs]) == 0
    report = json.loads(capsys.readouterr().out)
    assert "the σ's of the joins of S are not measured" in report["statistics"]
    assert "S's selection passed none of its 50 rows" in report["statistics"]
    assert {e["sigma"] for e in report["edges"]} == {1.0}


def test_a_star_name_clash_is_told_to_list_the_columns():
    schemas = {"R": {"ts": "number", "K": "number", "k": "number"},
               "S": {"ts": "number", "k": "number"}}
    for sql in ("SELECT * FROM R, S WHERE R.k = S.k",
                "SELECT R.*, S.k FROM R, S WHERE R.k = S.k"):
        with pytest.raises(QueryError) as e:
            parse_query(sql, schemas)
        assert "list the columns in place of the * and rename one with AS" in str(e.value)
    with pytest.raises(QueryError) as e:   # an item with a name: AS renames it
        parse_query("SELECT R.k AS a, S.k AS A FROM R, S WHERE R.k = S.k", schemas)
    assert "(use AS to rename one)" in str(e.value)


# ----- IS NULL on a union column (the vectorized executor) -------------------------------------

@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0, 1]), st.sampled_from([None, 1, 2]),
                          st.sampled_from([None, "x"])), min_size=1, max_size=10),
       st.booleans(), st.data())
def test_is_null_on_a_union_is_its_selected_childs(rows, dense, data):
    """A union's value is NULL when its selected child's is (a union has no validity bitmap:
    before pyarrow 26 ``pc.is_null`` was false on every row, and the vectorized executor
    lost the rows MJoin returned); sparse and dense, sliced."""
    from adaptcq.query.arrow_expr import is_null
    codes = pa.array([c for c, _, _ in rows], pa.int8())
    if dense:
        kids, offsets = ([], []), []
        for c, a, b in rows:
            offsets.append(len(kids[c]))
            kids[c].append(a if c == 0 else b)
        u = pa.UnionArray.from_dense(codes, pa.array(offsets, pa.int32()),
                                     [pa.array(kids[0], pa.int64()), pa.array(kids[1], pa.string())])
    else:
        u = pa.UnionArray.from_sparse(codes, [pa.array([a for _, a, _ in rows], pa.int64()),
                                              pa.array([b for _, _, b in rows], pa.string())])
    lo = data.draw(st.integers(0, len(rows) - 1))
    u = u.slice(lo, data.draw(st.integers(0, len(rows) - lo)))
    # (copied: before pyarrow 25 a sliced sparse union's values ignored the slice's offset)
    want = [v is None for v in pa.concat_arrays([u]).to_pylist()]
    assert is_null(u).to_pylist() == want
    assert is_null(pa.chunked_array([u, u])).to_pylist() == want + want
    n = len(u)
    if n:
        r = pa.table({"ts": pa.array(range(n), pa.int64()), "k": [0] * n, "u": u})
        s = pa.table({"ts": pa.array([0], pa.int64()), "k": [0], "v": [7]})
        sql = "SELECT R.ts AS rts, S.v FROM R, S WHERE R.k = S.k AND R.u IS NULL"
        got = {ex: sorted(adaptcq.run(sql, {"R": r, "S": s}, executor=ex).table
                          .column("rts").to_pylist()) for ex in ("vector", "mjoin")}
        assert got["vector"] == got["mjoin"]
