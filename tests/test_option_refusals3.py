"""Refused with a reason, never a bare library error or a silent no-op:

1. a union-typed column (sparse or dense, or nested in a list or struct) as a SELECT column:
   no executor can write union values, so the query is refused when it is checked against
   the schemas, naming the stream and column; IS [NOT] NULL on one still runs, as the
   oracle says, and comparing it or joining on it is refused as for any non-scalar column;
2. ``checks.is_finite`` of an int beyond float's range (it raised OverflowError), and the
   option checks that use it;
3. ``--optimizer`` / ``--reorder`` on a query of one or two streams, where every pipeline
   has a single order;
4. ``--optimizer`` / ``--reorder`` with spill or shedding options under ``--executor auto``:
   the message says that auto chose the operator tree (or the load-shedding join) and why.
"""

from __future__ import annotations

from collections import Counter
from fractions import Fraction

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import adaptcq
from adaptcq.checks import is_finite, is_int, is_real
from adaptcq.cli import main
from adaptcq.errors import OptionError, QueryError
from adaptcq.query.cql import parse_query
from adaptcq.stream.sources import schema_kinds
from conftest import examples
from oracle import oracle_total

PER_QUERY = ["vector", "mjoin", "xjoin", "acaching", "tree", "auto"]


# ----- 1. union columns ------------------------------------------------------------------

def _union(kind: str, tags, ints, strs) -> pa.Array:
    """A union of int64 and string values: tag 0 takes ``ints``, tag 1 ``strs``."""
    tags = pa.array(tags, pa.int8())
    if kind == "sparse":
        return pa.UnionArray.from_sparse(tags, [pa.array(ints, pa.int64()),
                                                pa.array(strs, pa.string())])
    offsets, counts = [], [0, 0]
    for t in tags.to_pylist():
        offsets.append(counts[t])
        counts[t] += 1
    picked = [[v for v, t in zip(ints, tags.to_pylist(), strict=True) if t == 0],
              [v for v, t in zip(strs, tags.to_pylist(), strict=True) if t == 1]]
    return pa.UnionArray.from_dense(tags, pa.array(offsets, pa.int32()),
                                    [pa.array(picked[0], pa.int64()),
                                     pa.array(picked[1], pa.string())])


def _tables(u: pa.Array, **extra):
    n = len(u)
    base = {"ts": pa.array(range(n), pa.int64()), "k": pa.array([i % 3 for i in range(n)])}
    return {"R": pa.table({**base, "u": u, **extra}), "S": pa.table({**base, "v": range(n)})}


UNION6 = {kind: _union(kind, [0, 1, 0, 1, 0, 1], [1, 2, None, 4, 5, 6],
                       ["a", "b", "c", None, "e", "f"]) for kind in ("sparse", "dense")}


@pytest.mark.parametrize("kind", ["sparse", "dense"])
@pytest.mark.parametrize("executor", PER_QUERY)
def test_a_union_select_column_is_refused_naming_it(kind, executor):
    sql = "SELECT S.v, R.u FROM R, S WHERE R.k = S.k"
    with pytest.raises(QueryError) as e:
        adaptcq.run(sql, _tables(UNION6[kind]), executor=executor)
    msg = str(e.value)
    assert msg.startswith(f"R.u (stream 'R', source 'R', column 'u') holds a union type, "
                          f"{kind}_union<")
    assert "no executor (vector, mjoin, xjoin, acaching, tree, shed" in msg
    assert "cannot be a SELECT column" in msg
    assert e.value.position == sql.index("R.u")


def test_a_union_brought_by_a_star_points_at_the_star():
    for sql in ("SELECT * FROM R, S WHERE R.k = S.k",
                "SELECT S.v AS sv, R.* FROM R, S WHERE R.k = S.k"):
        with pytest.raises(QueryError, match="R.u .* holds a union type") as e:
            adaptcq.run(sql, _tables(UNION6["sparse"]))
        assert e.value.position == sql.index("*" if sql.startswith("SELECT *") else "R.*")


@pytest.mark.parametrize("typ", [
    lambda u: pa.list_(u), lambda u: pa.struct([("x", u)]),
    lambda u: pa.map_(pa.string(), u)])
def test_a_union_nested_in_a_column_is_refused_too(typ):
    u = pa.sparse_union([pa.field("i", pa.int64()), pa.field("s", pa.string())])
    nested = pa.nulls(6, typ(u))  # (the type is what is checked, not the values)
    with pytest.raises(QueryError, match=r"R.w .* holds a union type, sparse_union<.*"
                                         r"\(inside its type "):
        adaptcq.run("SELECT R.w, S.v FROM R, S WHERE R.k = S.k",
                    _tables(UNION6["sparse"], w=nested), executor="mjoin")


def test_the_multi_query_engine_refuses_a_union_output_at_register():
    engine = adaptcq.Engine(_tables(UNION6["dense"]))
    with pytest.raises(QueryError, match="R.u .* holds a union type, dense_union"):
        engine.register("SELECT R.u, S.v FROM R, S WHERE R.k = S.k")


@pytest.mark.parametrize(("sql", "message"), [
    ("SELECT S.v FROM R, S WHERE R.k = S.k AND R.u = 1",
     "cannot compare R.u: it is a column of a non-scalar type (such as binary or a union)"),
    ("SELECT S.v FROM R, S WHERE R.u = S.k",
     ("R.u is a column of a non-scalar type (such as binary or a union); join columns must "
     "be scalar")),
])
def test_a_union_in_a_predicate_or_join_key_is_refused(sql, message):
    with pytest.raises(QueryError) as e:
        adaptcq.run(sql, _tables(UNION6["sparse"]), executor="mjoin")
    assert str(e.value).startswith(message)
    assert e.value.position == sql.index("R.u")


@st.composite
def _union_rows(draw):
    n = draw(st.integers(1, 12))
    tags = draw(st.lists(st.integers(0, 1), min_size=n, max_size=n))
    ints = draw(st.lists(st.none() | st.integers(-5, 5), min_size=n, max_size=n))
    strs = draw(st.lists(st.none() | st.text("ab", max_size=2), min_size=n, max_size=n))
    keys = draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))
    return draw(st.sampled_from(["sparse", "dense"])), tags, ints, strs, keys


@settings(max_examples=examples(25))
@given(_union_rows(), st.sampled_from(["IS NULL", "IS NOT NULL"]))
def test_is_null_on_a_union_column_equals_the_oracle(data, test):
    """What a union column can do: be tested. Every per-tuple executor and the vectorized
    one give the oracle's results (unbounded windows: the whole output is one multiset)."""
    kind, tags, ints, strs, keys = data
    u = _union(kind, tags, ints, strs)
    n = len(u)
    tables = {"R": pa.table({"ts": pa.array(range(n), pa.int64()), "k": keys, "u": u}),
              "S": pa.table({"ts": pa.array(range(n), pa.int64()), "k": keys,
                             "v": range(n)})}
    sql = f"SELECT R.ts AS rts, S.v FROM R, S WHERE R.k = S.k AND R.u {test}"
    query = parse_query(sql, {s: schema_kinds(t) for s, t in tables.items()})
    # Arrivals by timestamp, R before S on a tie (with unbounded windows, order is free).
    rows = {s: t.select(list(query.columns[s])).to_pylist() for s, t in tables.items()}
    arrivals = sorted([(i, 0, "R") for i in range(n)] + [(i, 1, "S") for i in range(n)])
    streams = [query.aliases.index(s) for _, _, s in arrivals]
    ts = [i for i, _, _ in arrivals]
    tup = [tuple(rows[s][i].values()) for i, _, s in arrivals]
    want = oracle_total(query, streams, ts, tup)
    for executor in ("vector", "mjoin", "xjoin", "acaching", "tree"):
        out = adaptcq.run(sql, tables, executor=executor).table
        got = Counter(zip(out["rts"].to_pylist(), out["v"].to_pylist(),
                          out["_sign"].to_pylist(), out["_ts"].to_pylist(), strict=True))
        assert got == want, executor


# ----- 2. is_finite of huge ints ---------------------------------------------------------

@given(st.integers().map(lambda i: i * 10 ** 400) | st.integers())
def test_every_int_is_finite(i):
    assert is_int(i) and is_real(i) and is_finite(i)


@pytest.mark.parametrize("x", [10 ** 400, -(10 ** 400), Fraction(10 ** 400, 3),
                               np.uint64(2 ** 64 - 1)])
def test_huge_rationals_are_finite(x):
    assert is_finite(x)


@pytest.mark.parametrize("x", [float("nan"), float("inf"), np.float64("-inf"), True, "1"])
def test_what_is_not_finite_stays_so(x):
    assert not is_finite(x)


def test_option_checks_refuse_huge_ints_with_their_messages():
    from adaptcq.adapt.acaching import METHODS, _check_options
    from adaptcq.adapt.routing import make_routing
    base = {"W": 1, "p": 0.5, "reopt_interval": 10, "change": 0.1, "caches": "prefix",
            "m": 0, "memory": None, "W_d": 1, "alpha": 2, "method": next(iter(METHODS)),
            "interval": 1}
    with pytest.raises(ValueError, match=r"option p \(the profiling probability\) must be "
                                         r"in \[0, 1\]"):
        _check_options(**{**base, "p": 10 ** 400})
    _check_options(**{**base, "memory": 10 ** 400})  # a budget that large: no limit
    with pytest.raises(OptionError, match="routing option decay must be a number in"):
        make_routing("lottery", decay=10 ** 400)
    with pytest.raises(OptionError, match="routing option cost_smoothing must be a number"):
        make_routing("lottery", cost_smoothing=10 ** 400)


# ----- 3. and 4. --optimizer / --reorder with nothing to order -----------------------------

@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    d = tmp_path_factory.mktemp("in")
    rng = np.random.default_rng(3)
    n = 200
    for s in "RST":
        pq.write_table(pa.table({"ts": np.sort(rng.integers(0, 400, n)) / 10.0,
                                 "a": rng.integers(0, 10, n), "b": rng.integers(0, 10, n),
                                 "id": np.arange(n)}), d / f"{s}.parquet")
    return {s: f"--input={s}={d / f'{s}.parquet'}" for s in "RST"}


SQL1 = "SELECT R.id AS r FROM R [RANGE 2 SECONDS] WHERE R.a > 1"
SQL2 = ("SELECT R.id AS r, S.id AS s FROM R [RANGE 2 SECONDS], S [RANGE 2 SECONDS] "
        "WHERE R.a = S.a")
SQL3 = ("SELECT R.id AS r, S.id AS s, T.id AS t FROM R [RANGE 2 SECONDS], "
        "S [RANGE 2 SECONDS], T [RANGE 2 SECONDS] WHERE R.a = S.a AND S.b = T.b")


def error_of(capsys, argv) -> str:
    assert main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err  # one line, no traceback
    return err[0]


def _run(inputs, tmp_path, sql, streams, *extra) -> list[str]:
    return ["run", "--sql", sql, *(inputs[s] for s in streams), "--no-progress",
            "--output", str(tmp_path / "o.parquet"), *extra]


@pytest.mark.parametrize("executor", ["vector", "mjoin", "acaching", "auto"])
def test_optimizer_on_two_streams_is_refused(inputs, tmp_path, capsys, executor):
    msg = error_of(capsys, _run(inputs, tmp_path, SQL2, "RS", "--executor", executor,
                                "--optimizer", "fab"))
    assert msg == ("adaptcq: error: --optimizer fab orders the joins of each pipeline, but "
                   "this query joins two streams (R, S): each pipeline has a single order "
                   "(ΔR: S, ΔS: R), so there is nothing to order; drop --optimizer "
                   "(ordering matters from three streams on)")
    assert not (tmp_path / "o.parquet").exists()


@pytest.mark.parametrize("executor", ["mjoin", "acaching", "auto"])
def test_reorder_on_two_streams_is_refused(inputs, tmp_path, capsys, executor):
    msg = error_of(capsys, _run(inputs, tmp_path, SQL2, "RS", "--executor", executor,
                                "--optimizer", "qaware", "--reorder", "agreedy"))
    assert msg.startswith("adaptcq: error: --optimizer qaware and --reorder agreedy order "
                          "the joins of each pipeline, but this query joins two streams")
    assert msg.endswith("drop --optimizer and --reorder (ordering matters from three "
                        "streams on)")


def test_a_self_join_of_two_aliases_and_one_stream_are_refused_too(inputs, tmp_path, capsys):
    self_join = "SELECT A.id AS x, B.id AS y FROM R AS A, R AS B WHERE A.a = B.b"
    msg = error_of(capsys, _run(inputs, tmp_path, self_join, "R", "--reorder", "agreedy"))
    assert "this query joins two streams (A, B): each pipeline has a single order " \
           "(ΔA: B, ΔB: A)" in msg
    msg = error_of(capsys, _run(inputs, tmp_path, SQL1, "R", "--optimizer", "dmjoin"))
    assert msg.startswith("adaptcq: error: --optimizer dmjoin orders the joins of each "
                          "pipeline, but this query reads one stream (R): it has no join, "
                          "so there is nothing to order")


def test_a_query_the_run_cannot_read_is_the_runs_to_report(inputs, tmp_path, capsys):
    assert main(_run(inputs, tmp_path, "SELECT R.id FROM R, S WHERE R.a = = S.a", "RS",
                     "--optimizer", "fab")) == 1
    msg = capsys.readouterr().err
    assert "syntax error" in msg and "nothing to order" not in msg


@pytest.mark.parametrize("flags", [["--optimizer", "fab"], ["--reorder", "agreedy"]])
def test_three_streams_still_order(inputs, tmp_path, capsys, flags):
    assert main(_run(inputs, tmp_path, SQL3, "RST", "--executor", "mjoin", *flags)) == 0, \
        capsys.readouterr().err
    assert pq.read_table(tmp_path / "o.parquet").num_rows > 0


@pytest.mark.parametrize("flags", [["--optimizer", "fgreedy"], ["--reorder", "agreedy"]])
@pytest.mark.parametrize(("extra", "named", "chosen"), [
    (["--spill", "local-output", "--memory", "1MB"], "--spill and --memory",
     ("the operator tree (--executor tree) here, because --spill and --memory ask to spill "
     "state, which only the operator tree does")),
    (["--memory", "1MB"], "--memory",
     "the operator tree (--executor tree) here, because --memory asks to spill state"),
    (["--shed", "partial", "--capacity", "100"], "--shed and --capacity",
     ("the load-shedding join (--executor shed) here, because --shed and --capacity are the "
     "load-shedding join's")),
])
def test_auto_names_the_executor_it_chose_and_why(inputs, tmp_path, capsys, flags, extra,
                                                  named, chosen):
    msg = error_of(capsys, _run(inputs, tmp_path, SQL3, "RST", *flags, *extra))
    assert msg.startswith(f"adaptcq: error: {' '.join(flags)} orders MJoin pipelines, but "
                          f"--executor auto runs {chosen}")
    assert msg.endswith(f"a policy cannot order or profile that executor: drop {flags[0]}, "
                        f"or drop {named}")
