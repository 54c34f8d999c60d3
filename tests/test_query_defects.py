"""Bad and edge inputs to the query front end, the engine's query wrapper and the workload
generators (issue 8, "Defects"): each is refused with a message naming what is wrong and
where, or now works."""

from __future__ import annotations

import math
import pickle

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sqlglot

from adaptcq.engine.continuous import ContinuousQuery, OptionError, row_key
from adaptcq.errors import AdaptcqError, QueryError
from adaptcq.query.cql import parse_query
from adaptcq.query.expr import compile_predicate, compile_projection, eval_namespace
from adaptcq.query.logical import output_overflows, output_types
from adaptcq.stream.workloads import (
    WORKLOADS,
    WorkloadError,
    nway,
    read_workload,
    three_way,
    write_workload,
)

SCHEMAS = {
    "R": {"id": "number", "a": "number", "x": "number", "_ts": "number", "name": "string",
          "t": "timestamp", "ok": "bool", "tags": "list", "info": "struct", "blob": "other"},
    "S": {"id": "number", "a": "number", "tags": "list"},
}


def error_of(sql: str, schemas=SCHEMAS) -> QueryError:
    with pytest.raises(QueryError) as info:
        parse_query(sql, schemas)
    return info.value


def points_at(err: QueryError, text: str) -> bool:
    return err.position is not None and err.sql[err.position:].startswith(text)


# ----- 1. reserved and duplicate output names -------------------------------------------------
@pytest.mark.parametrize(("sql", "at"), [
    ("SELECT R.id, R.x AS _sign FROM R", "R.x AS _sign"),
    ("SELECT R.x AS _ts FROM R", "R.x AS _ts"),
    ("SELECT R.x AS _TS FROM R", "R.x AS _TS"),
    ("SELECT R.id, R._ts FROM R", "R._ts"),
    ('SELECT R.id + 1 AS "_sign" FROM R', "R.id + 1"),
])
def test_sign_and_ts_are_reserved_output_names(sql, at):
    err = error_of(sql)
    assert "reserved" in err.message and "_sign and _ts" in err.message
    assert "sign and time" in err.message
    assert points_at(err, at)


def test_input_column_named_ts_can_be_renamed_or_starred():
    q = parse_query("SELECT R._ts AS in_ts FROM R", SCHEMAS)
    assert [o.name for o in q.outputs] == ["in_ts"]
    q = parse_query("SELECT * FROM R", {"R": {"_ts": "number", "_sign": "number"}})
    assert [o.name for o in q.outputs] == ["R__ts", "R__sign"]


def test_star_and_item_with_one_name_are_refused():
    err = error_of("SELECT R.*, R.a AS R_a FROM R")
    assert "duplicate output column name 'R_a'" in err.message and points_at(err, "R.a AS R_a")


# ----- 2a. list and struct columns cannot be joined or compared -------------------------------
def test_list_column_as_join_key_is_refused_at_the_predicate():
    err = error_of("SELECT R.id FROM R, S WHERE R.id = S.id AND R.tags = S.a")
    assert err.message == ("R.tags is a list column; join columns must be scalar (numbers, "
                           "strings, timestamps, booleans)")
    assert points_at(err, "R.tags = S.a")
    err = error_of("SELECT R.id FROM R JOIN S ON S.a = R.info")
    assert "R.info is a struct column; join columns must be scalar" in err.message
    assert points_at(err, "S.a = R.info")
    err = error_of("SELECT R.id FROM R, S WHERE R.blob = S.a")
    assert "R.blob is a column of a non-scalar type" in err.message
    assert "join columns must be scalar" in err.message


@pytest.mark.parametrize(("where", "at", "words"), [
    ("R.tags = R.tags", "R.tags =", "cannot compare R.tags: it is a list column"),
    ("R.info > 1", "R.info", "cannot compare R.info: it is a struct column"),
    ("R.tags IN (1, 2)", "R.tags IN", "cannot compare R.tags"),
    ("R.a BETWEEN R.tags AND 3", "R.tags AND", "cannot compare R.tags"),
    ("R.tags", "R.tags", "R.tags is a list column, not a condition"),
    ("NOT R.info AND R.a > 1", "R.info", "R.info is a struct column, not a condition"),
])
def test_list_and_struct_columns_in_where_are_refused(where, at, words):
    err = error_of(f"SELECT R.id FROM R WHERE {where}")
    assert words in err.message and points_at(err, at)


def test_list_and_struct_columns_can_be_selected_and_tested_for_null():
    q = parse_query("SELECT R.tags, R.info, R.tags IS NULL AS no_tags FROM R "
                    "WHERE R.info IS NOT NULL", SCHEMAS)
    assert [o.name for o in q.outputs] == ["tags", "info", "no_tags"]


# ----- 2b. list and struct values through the engine -----------------------------------------
LIST_ROWS = [(1, [1, 2], {"k": [3]}), (1, [5], None), (1, [1, 2], {"k": [3]})]


@pytest.mark.parametrize("executor", ["mjoin", "xjoin"])
@pytest.mark.parametrize("mode", ["append", "retract"])
def test_list_values_in_select_on_unbounded_streams(executor, mode):
    q = parse_query("SELECT R.tags, R.info, S.tags AS stags FROM R, S WHERE R.a = S.a",
                    {"R": {"a": "number", "tags": "list", "info": "struct"},
                     "S": {"a": "number", "tags": "list"}})
    cq = ContinuousQuery(q, executor, mode)
    out = cq.process([0, 1, 0], None, [1, 2, 3], [LIST_ROWS[0], (1, [[7]]), LIST_ROWS[2]])
    assert out == [([1, 2], {"k": [3]}, [[7]], 1, 2), ([1, 2], {"k": [3]}, [[7]], 1, 3)]


def test_list_values_through_the_local_runtime():
    import adaptcq
    r = pa.table({"ts": [1.0, 2.0], "a": [1, 1], "tags": [[1, 2], [3]],
                  "info": [{"x": 1}, {"x": 2}]})
    s = pa.table({"ts": [1.5], "a": [1]})
    res = adaptcq.run("SELECT R.tags, R.info, S.a FROM R, S WHERE R.a = S.a",
                      {"R": r, "S": s}, mode="retract")
    assert res.table.column("tags").to_pylist() == [[1, 2], [3]]
    assert res.table.column("info").to_pylist() == [{"x": 1}, {"x": 2}]


@pytest.mark.parametrize("executor", ["mjoin", "xjoin"])
def test_explicit_deletions_of_rows_holding_lists_survive_a_snapshot(executor):
    q = parse_query("SELECT R.tags, S.a FROM R, S WHERE R.a = S.a",
                    {"R": {"a": "number", "tags": "list", "info": "struct"},
                     "S": {"a": "number"}})
    cq = ContinuousQuery(q, executor, "retract", explicit_deletions=True)
    rows = [LIST_ROWS[0], LIST_ROWS[1], (1,), LIST_ROWS[2]]
    out = cq.process([0, 0, 1, 0], None, [1, 2, 3, 4], rows)
    assert sorted(out, key=str) == [([1, 2], 1, 1, 3), ([1, 2], 1, 1, 4), ([5], 1, 1, 3)]
    again = ContinuousQuery.restore(q, cq.snapshot(), "retract")
    assert again.explicit_deletions
    # The oldest equal row (rid 1) is deleted; a row never inserted is rejected.
    out = again.process([0, 0], [-1, -1], [5, 6],
                        [(1, [1, 2], {"k": [3]}), (1, [9], {"k": []})])
    assert out == [([1, 2], 1, -1, 5)]
    assert [r[3] for r in again.rejected_rows] == ["deletion of a row not in R"]


def test_explicit_deletion_without_the_flag_is_a_clear_error():
    q = parse_query("SELECT R.a FROM R, S WHERE R.a = S.a")
    cq = ContinuousQuery(q, "mjoin")
    assert cq.values == [None, None]  # no per-value map is kept without the flag
    with pytest.raises(ValueError, match="explicit_deletions=True"):
        cq.process([0], [-1], [1], [(1,)])


def test_row_keys_are_hashable_and_equal_for_equal_rows():
    a = (1, [1, [2, 3]], {"k": [1], "j": {"x": 2}}, None)
    b = (1, [1, [2, 3]], {"j": {"x": 2}, "k": [1]}, None)
    assert row_key(a) == row_key(b) and hash(row_key(a)) == hash(row_key(b))
    assert row_key((1, "x")) == (1, "x")
    assert row_key((1, [1])) != row_key((1, [[1]]))
    assert pickle.loads(pickle.dumps(row_key(a))) == row_key(a)


# ----- 3a. SELECT expressions are type-checked -----------------------------------------------
@pytest.mark.parametrize(("select", "at", "words"), [
    ("R.id + 'x'", "'x'", "'+' needs numbers, but 'x' is a string"),
    ("R.name * 2", "R.name", "'*' needs numbers, but R.name is a string"),
    ("R.t - 1", "R.t", "R.t is a timestamp"),
    ("-R.ok", "R.ok", "'-' needs numbers, but R.ok is a boolean"),
    ("R.tags + 1", "R.tags", "R.tags is a list column"),
    ("(R.a > 1) + 1", "(R.a > 1)", "is a boolean"),
])
def test_select_arithmetic_is_type_checked(select, at, words):
    err = error_of(f"SELECT {select} AS v FROM R")
    assert words in err.message and points_at(err, at)


def test_where_arithmetic_is_type_checked_too():
    err = error_of("SELECT R.id FROM R WHERE R.name + 1 > 2")
    assert "'+' needs numbers, but R.name is a string" in err.message


# ----- 3b. numeric literals ------------------------------------------------------------------
@pytest.mark.parametrize(("sql", "literal"), [
    ("SELECT R.id FROM R WHERE R.a = 2.5e400", "2.5e400"),
    ("SELECT R.id FROM R WHERE R.a + 1e309 > 0", "1e309"),
    ("SELECT -1.8e308 * 10 AS v FROM R", "1.8e308"),
    ("SELECT R.id FROM R WHERE R.a IN (1, 2.5e400)", "2.5e400"),
])
def test_float_literal_out_of_range(sql, literal):
    err = error_of(sql)
    assert err.message.startswith(f"{literal} is out of range for a number")
    assert points_at(err, literal)


@pytest.mark.parametrize(("sql", "literal"), [
    ("SELECT R.a * 99999999999999999999 AS v FROM R", "99999999999999999999"),
    ("SELECT 9223372036854775808 AS v FROM R", "9223372036854775808"),
    ("SELECT R.id FROM R WHERE R.a - 100000000000000000000000 > 0",
     "100000000000000000000000"),
])
def test_integer_literal_out_of_int64_in_arithmetic_or_output(sql, literal):
    err = error_of(sql)
    assert f"{literal} is out of range for a 64-bit integer" in err.message
    assert points_at(err, literal)


def test_large_integers_compare_exactly_and_int64_min_is_a_value():
    q = parse_query("SELECT -9223372036854775808 AS lo FROM R "
                    "WHERE R.a = 18446744073709551615 OR R.a > 100000000000000000000000",
                    SCHEMAS)
    pred = compile_predicate(q.selections["R"], q.columns["R"], "R", q.types)
    assert pred((2 ** 64 - 1,)) and not pred((2 ** 63,)) and pred((10 ** 24 + 1,))


@pytest.mark.parametrize("text", ["1e-400", "1.7976931348623157e308", "0.1", "5.", ".5",
                                  "123456789012345678", "9223372036854775807", "1e22"])
def test_literals_round_trip_through_generated_code(text):
    node = sqlglot.parse_one(f"SELECT {text} FROM R").expressions[0]
    src = compile_projection([node], lambda ref: "r[0]")
    (value,) = eval(f"lambda r: {src}", eval_namespace())(())
    expected = int(text) if text.isdigit() else float(text)
    assert value == expected and type(value) is type(expected)
    assert math.isfinite(value)


# ----- 3c. output types from the input schema ------------------------------------------------
def test_output_types_from_the_input_schema():
    schemas = {"src": pa.schema([
        ("u", pa.uint64()), ("i8", pa.int8()), ("i", pa.int64()), ("f", pa.float32()),
        ("t", pa.timestamp("ns", "Europe/Paris")), ("tags", pa.list_(pa.string())),
        ("info", pa.struct([("x", pa.int32())])), ("d", pa.dictionary(pa.int8(), pa.string())),
        ("day", pa.date32())])}
    q = parse_query(
        "SELECT u, t, tags, info, d, day, f, i8 + 1 AS a, i + 1 AS b, i * 2.0 AS c, "
        "i / 2 AS q, -i8 AS n, u - 0 AS g, i8 * i8 * i8 AS cube, 1 AS one, 1.5 AS half, "
        "'x' AS s, NULL AS nul, i > 1 AS big, TIMESTAMP '2024-01-01' AS t0 "
        "FROM src [RANGE 5] AS R", None)
    names = [o.name for o in q.outputs]
    types = dict(zip(names, output_types(q, schemas), strict=True))
    assert types == {
        "u": pa.uint64(), "t": pa.timestamp("ns", "Europe/Paris"),
        "tags": pa.list_(pa.string()), "info": pa.struct([("x", pa.int32())]),
        "d": pa.string(), "day": pa.date32(), "f": pa.float32(), "a": pa.int64(),
        "b": pa.int64(), "c": pa.float64(), "q": pa.float64(), "n": pa.int64(),
        "g": pa.int64(), "cube": pa.int64(), "one": pa.int64(), "half": pa.float64(),
        "s": pa.string(), "nul": pa.null(), "big": pa.bool_(), "t0": pa.timestamp("us"),
    }
    overflows = dict(zip(names, output_overflows(q, schemas), strict=True))
    assert {n for n, v in overflows.items() if v} == {"b", "g"}


def test_output_types_of_a_self_join_use_the_source_schema():
    q = parse_query("SELECT R.v, q.v AS w FROM src AS R, src AS q WHERE R.k = q.k", None)
    schemas = {"src": pa.schema([("k", pa.string()), ("v", pa.uint16())])}
    assert output_types(q, schemas) == [pa.uint16(), pa.uint16()]


def test_output_types_errors_name_the_column():
    q = parse_query("SELECT R.v, R.d + 1 AS e FROM R", None)
    with pytest.raises(QueryError, match="source 'R' has no column 'v'"):
        output_types(q, {"R": pa.schema([("d", pa.int64())])})
    with pytest.raises(QueryError, match="no schema for source 'R'"):
        output_types(q, {})
    with pytest.raises(QueryError, match="decimal"):
        output_types(q, {"R": pa.schema([("v", pa.int64()), ("d", pa.decimal128(9, 2))])})


# ----- 4. unknown options --------------------------------------------------------------------
@pytest.mark.parametrize(("executor", "options", "words"), [
    ("mjoin", {"policies": []}, ["unknown option policies for the mjoin executor",
                                 "accepted: orders, nested_loop", "attach"]),
    ("mjoin", {"tree": ("R", "S")}, ["unknown option tree", "tree is for the xjoin executor"]),
    ("xjoin", {"orders": {"R": ["S"]}}, ["unknown option orders for the xjoin executor",
                                         "accepted: tree", "orders is for the mjoin"]),
    ("mjoin", {"foo": 1, "bar": 2}, ["unknown options foo, bar", "time_unit"]),
    ("acaching", {}, ["unknown executor 'acaching'", "mjoin, xjoin"]),
])
def test_unknown_options_are_refused(executor, options, words):
    q = parse_query("SELECT R.a FROM R, S WHERE R.a = S.a")
    with pytest.raises(OptionError) as info:
        ContinuousQuery(q, executor, "append", **options)
    assert isinstance(info.value, AdaptcqError) and isinstance(info.value, ValueError)
    for w in words:
        assert w in str(info.value)


def test_known_options_still_work_and_restore_keeps_the_plan():
    q = parse_query("SELECT R.a FROM R, S WHERE R.a = S.a")
    cq = ContinuousQuery(q, "mjoin", "append", orders={"R": ["S"]}, nested_loop=["S"],
                         trace=True, sample_every=10, time_unit=1.0)
    again = ContinuousQuery.restore(q, cq.snapshot(), "append", orders={"R": ["S"]})
    assert again.executor.nested_loop == {"S"} and not again.explicit_deletions
    x = ContinuousQuery(q, "xjoin", "retract", tree=("S", "R"))
    assert ContinuousQuery.restore(q, x.snapshot(), "retract").executor.tree == ("S", "R")


# ----- 5. workloads --------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(WORKLOADS))
@pytest.mark.parametrize("seed", [-1, 1.5, "3", True])
def test_bad_seed_is_named(name, seed):
    with pytest.raises(WorkloadError, match=r"seed \(--seed\) must be a whole number >= 0"):
        WORKLOADS[name](seed=seed, n_updates=1_000)


@pytest.mark.parametrize("name", list(WORKLOADS))
@pytest.mark.parametrize("n", [0, -1, 2.5, None])
def test_bad_n_updates_is_named(name, n):
    with pytest.raises(WorkloadError, match=r"n_updates \(--n-updates\) must be a whole "):
        WORKLOADS[name](n_updates=n)


def test_out_that_is_a_file_is_refused(tmp_path):
    f = tmp_path / "data.parquet"
    f.write_bytes(b"precious")
    with pytest.raises(WorkloadError, match="it is an existing file"):
        write_workload(three_way(n_updates=300), f)
    assert f.read_bytes() == b"precious"
    with pytest.raises(WorkloadError, match="cannot write the workload"):
        write_workload(three_way(n_updates=300), f / "sub")


def test_out_folder_with_other_files_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("keep me")
    pq.write_table(pa.table({"x": [1]}), tmp_path / "R.parquet")
    with pytest.raises(WorkloadError, match="not empty and is not a workload") as info:
        write_workload(three_way(n_updates=300), tmp_path)
    assert "notes.txt" in str(info.value)
    assert pq.read_table(tmp_path / "R.parquet").column_names == ["x"]


def test_previous_workload_is_replaced_and_empty_folder_accepted(tmp_path):
    out = tmp_path / "wl"
    out.mkdir()
    write_workload(nway(n_updates=400), out)  # R1..R4
    assert len(list(out.iterdir())) == 6
    write_workload(three_way(n_updates=300), out)  # R, S, T: the R1..R4 files go
    assert sorted(p.name for p in out.iterdir()) == [
        "R.parquet", "S.parquet", "T.parquet", "params.json", "query.sql"]
    assert read_workload(out).n_updates == 300
