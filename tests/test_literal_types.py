"""Comparisons of values of different kinds (a timestamp literal with a number column, a
number literal with a timestamp column, ...) are refused when the query is checked, with a
caret at the literal, before any row is processed; the comparisons that make sense stay
accepted and run."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest

import adaptcq
from adaptcq.cli import main
from adaptcq.errors import QueryError
from adaptcq.query.cql import parse_query

SCHEMAS = {
    "R": {"ts": "number", "a": "number", "id": "number", "s": "string", "t": "timestamp",
          "u": "timestamp", "ok": "bool"},
    "S": {"ts": "number", "a": "number"},
}


def error_of(where: str, select: str = "R.id") -> QueryError:
    with pytest.raises(QueryError) as info:
        parse_query(f"SELECT {select} FROM R, S WHERE R.a = S.a AND {where}", SCHEMAS)
    return info.value


def points_at(err: QueryError, text: str) -> bool:
    return err.position is not None and err.sql[err.position:].startswith(text)


# ----- refused: the caret under the literal ---------------------------------------------------
@pytest.mark.parametrize(("where", "at", "message"), [
    # a timestamp or date literal against a number
    ("R.a > TIMESTAMP '2020-01-01'", "TIMESTAMP '2020-01-01'",
     "cannot compare a number with the timestamp '2020-01-01'"),
    ("TIMESTAMP '2020-01-01' < R.a", "TIMESTAMP '2020-01-01'",
     "cannot compare a number with the timestamp '2020-01-01'"),
    ("R.a = DATE '2020-01-01'", "DATE '2020-01-01'",
     "cannot compare a number with the date '2020-01-01'"),
    ("R.a + 1 >= TIMESTAMP '2020-01-01'", "TIMESTAMP",
     "cannot compare a number with the timestamp '2020-01-01'"),
    ("R.a BETWEEN 0 AND TIMESTAMP '2020-01-01'", "TIMESTAMP",
     "cannot compare a number with the timestamp '2020-01-01'"),
    ("R.a IN (1, DATE '2020-01-01')", "DATE",
     "cannot compare a number with the date '2020-01-01'"),
    # a number literal against a timestamp (the direction refused before, kept)
    ("R.t > 5", "5", "cannot compare a timestamp with the number 5"),
    ("5 < R.t", "5 < R.t", "cannot compare a timestamp with the number 5"),
    ("R.t > -5", "-5", "cannot compare a timestamp with the number -5"),
    ("R.t BETWEEN '2020-01-01' AND 7", "7", "cannot compare a timestamp with the number 7"),
    ("R.t IN ('2020-01-01', 2)", "2", "cannot compare a timestamp with the number 2"),
    # timestamp literals against strings, booleans
    ("R.s = TIMESTAMP '2020-01-01'", "TIMESTAMP",
     "cannot compare a string with the timestamp '2020-01-01'"),
    ("R.s IN (DATE '2020-01-01')", "DATE", "cannot compare a string with the date"),
    ("R.ok = TIMESTAMP '2020-01-01'", "TIMESTAMP",
     "cannot compare a boolean with the timestamp"),
    ("R.t = TRUE", "TRUE", "cannot compare a timestamp with TRUE"),
    # booleans against strings
    ("R.ok < 'x'", "'x'", "cannot compare a boolean with the string 'x'"),
    ("R.s = FALSE", "FALSE", "cannot compare a string with FALSE"),
])
def test_a_literal_of_another_kind_is_refused_at_the_literal(where, at, message):
    err = error_of(where)
    assert message in err.message, err.message
    assert points_at(err, at), (err.position, err.sql[err.position or 0:])


@pytest.mark.parametrize(("where", "message"), [
    ("R.a > 'x'", "cannot compare a number with a string"),
    ("'x' = R.a", "cannot compare a number with a string"),
    ("R.s IN (1, 2)", "cannot compare a number with a string"),
])
def test_numbers_and_strings_are_still_refused(where, message):
    err = error_of(where)
    assert message in err.message and points_at(err, where)


@pytest.mark.parametrize(("where", "message"), [
    ("R.t > R.a", "cannot compare a timestamp with a number in 'R.t > R.a'"),
    ("R.t <= R.a * 2", "cannot compare a timestamp with a number"),
    ("R.s = R.t", "cannot compare a string with a timestamp"),
    ("R.ok = R.s", "cannot compare a boolean with a string"),
])
def test_columns_of_different_kinds_are_refused_at_the_comparison(where, message):
    err = error_of(where)
    assert message in err.message and points_at(err, where)


def test_the_caret_is_at_the_literal_not_at_an_earlier_word_date():
    with pytest.raises(QueryError) as info:
        parse_query("SELECT R.date FROM R WHERE R.date > DATE '2020-01-01'",
                    {"R": {"date": "number"}})
    assert points_at(info.value, "DATE '2020-01-01'")


def test_a_select_item_is_checked_too():
    err = error_of("R.a > 0", select="R.a > TIMESTAMP '2020-01-01' AS late")
    assert "cannot compare a number with the timestamp '2020-01-01'" in err.message
    assert points_at(err, "TIMESTAMP '2020-01-01' AS late")


# ----- accepted ---------------------------------------------------------------------------------
@pytest.mark.parametrize("where", [
    "R.t > TIMESTAMP '2020-01-01'", "R.t >= DATE '2020-01-01'", "R.t = '2020-01-01'",
    "'2020-01-01 10:00' < R.t", "R.t BETWEEN '2020-01-01' AND TIMESTAMP '2021-01-01'",
    "R.t IN ('2020-01-01', DATE '2020-01-02')", "R.t <> R.u", "R.t > NULL", "R.t IS NULL",
    "R.a > 5", "R.a BETWEEN -1 AND 2.5", "R.a IN (1, 2)", "R.a = R.id + 1",
    "R.s = 'x'", "R.s IN ('x', 'y')", "R.s > R.s",
    "R.ok = TRUE", "R.ok <> FALSE", "R.ok = (R.a > 1)", "R.ok = 1", "NULL = R.s",
    "TIMESTAMP '2020-01-01' < TIMESTAMP '2021-01-01'",
])
def test_comparisons_of_one_kind_are_accepted(where):
    q = parse_query(f"SELECT R.id FROM R, S WHERE R.a = S.a AND {where}", SCHEMAS)
    assert q.selections["R"] is not None


def test_without_schemas_nothing_is_refused_for_kinds():
    parse_query("SELECT R.id FROM R, S WHERE R.a = S.a AND R.a > TIMESTAMP '2020-01-01'")


# ----- end to end: refused before any row, in every executor ------------------------------------
R = pa.table({"ts": [1, 2], "a": [1, 2], "id": [10, 20],
              "t": [dt.datetime(2020, 1, 1), dt.datetime(2021, 1, 1)]})
S = pa.table({"ts": [1, 2], "a": [1, 2]})


@pytest.mark.parametrize("executor", ["vector", "mjoin", "xjoin", "acaching"])
@pytest.mark.parametrize(("where", "at"), [
    ("R.a > TIMESTAMP '2020-01-01'", "TIMESTAMP"), ("R.t > 5", "5"),
])
def test_refused_before_any_row_is_processed(executor, where, at):
    sql = f"SELECT R.id FROM R, S WHERE R.a = S.a AND {where}"
    with pytest.raises(QueryError) as info:
        adaptcq.stream(sql, {"R": R, "S": S}, executor=executor)  # not iterated: no row
    assert points_at(info.value, at)


@pytest.mark.parametrize("executor", ["vector", "mjoin"])
def test_accepted_timestamp_comparisons_run(executor):
    sql = ("SELECT R.id FROM R, S WHERE R.a = S.a AND R.t > '2020-06-01' "
           "AND R.a < 5 AND R.t < TIMESTAMP '2022-01-01'")
    res = adaptcq.run(sql, {"R": R, "S": S}, executor=executor)
    assert res.table.column("id").to_pylist() == [20]


def test_the_command_line_prints_the_error_with_a_caret(tmp_path, capsys):
    for name in ("r", "s"):
        (tmp_path / f"{name}.csv").write_text("ts,a,id\n1,1,10\n2,2,20\n")
    sql = "SELECT R.id FROM R, S WHERE R.a = S.a AND R.a > TIMESTAMP '2020-01-01'"
    assert main(["run", "--sql", sql, "--input", f"R={tmp_path / 'r.csv'}",
                 "--input", f"S={tmp_path / 's.csv'}", "--output", "-", "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "cannot compare a number with the timestamp '2020-01-01'" in err
    assert "Traceback" not in err
    lines = err.splitlines()
    k = next(k for k, x in enumerate(lines) if x.strip().startswith("^"))
    assert lines[k].index("^") == lines[k - 1].index("TIMESTAMP")


def test_a_null_typed_join_column_and_natural_join_are_named():
    """An all-NULL Parquet column (Arrow type null) is named as such, not as "a column of
    a non-scalar type (such as a list, struct or binary)"; NATURAL JOIN is refused as
    itself, not as a disconnected join graph. Selecting a null-typed column works."""
    R = pa.table({"ts": [1, 2], "k": pa.array([None, None], pa.null()), "id": [1, 2]})
    S = pa.table({"ts": [1, 2], "k": [1, 2], "id": [1, 2]})
    with pytest.raises(QueryError, match=r"R\.k is a column of type null \(all its values "
                                         r"NULL\): give the column a type"):
        adaptcq.run("SELECT R.id AS r, S.id AS s FROM R, S WHERE R.k = S.k", {"R": R, "S": S})
    with pytest.raises(QueryError, match=r"NATURAL JOIN \(write the equalities in ON\)") as e:
        adaptcq.run("SELECT * FROM R NATURAL JOIN S", {"R": R, "S": S})
    assert e.value.position == "SELECT * FROM R NATURAL JOIN S".index("NATURAL")
    assert adaptcq.run("SELECT R.k, S.id FROM R, S WHERE R.id = S.id",
                       {"R": R, "S": S}).table.num_rows == 2


# ----- timestamp literals with nanoseconds ------------------------------------------------------
_B = 1704067200 * 10**9  # 2024-01-01 00:00:00 UTC in ns
RN = pa.table({"ts": [0, 1, 2], "k": [1, 1, 1], "id": [0, 1, 2],
               "c": pa.array([_B, _B + 1, _B + 999], pa.timestamp("ns")),
               "u": pa.array([_B // 1000, _B // 1000 + 1, _B // 1000 + 2], pa.timestamp("us")),
               "z": pa.array([_B, _B + 1, _B + 999], pa.timestamp("ns", tz="UTC")),
               "d": pa.array([19723, 19723, 19724], pa.date32())})
SN = pa.table({"ts": [0], "k": [1]})


NS_CASES = [
    ("R.c = '2024-01-01 00:00:00.000000001'", [1]),
    ("R.c > TIMESTAMP '2024-01-01 00:00:00.000000500'", [2]),
    ("R.c IN ('2024-01-01 00:00:00.000000999', '2024-01-01 00:00:00.000000002')", [2]),
    ("R.c BETWEEN '2024-01-01 00:00:00.000000001' AND '2024-01-01 00:00:00.000000998'", [1]),
    ("R.z = '2024-01-01 02:00:00.000000001+02:00'", [1]),
    # a microsecond column never equals a literal with nanoseconds; order is exact
    ("R.u = '2024-01-01 00:00:00.000001001'", []),
    ("R.u > '2024-01-01 00:00:00.000001001'", [2]),
    ("R.c = '2024-01-01 00:00:00.000000001000'", [1]),  # zeros past the ns are exact
]


@pytest.mark.parametrize("executor", ["vector", "mjoin", "xjoin", "acaching", "tree"])
@pytest.mark.parametrize(("where", "ids"), NS_CASES)
def test_a_timestamp_literal_keeps_its_nanoseconds(executor, where, ids):
    """Python's datetime holds microseconds, and fromisoformat dropped the digits past
    them without a word: R.c = '...000000001' selected the row at .000000000."""
    res = adaptcq.run(f"SELECT R.id FROM R, S WHERE R.k = S.k AND {where}",
                      {"R": RN, "S": SN}, executor=executor)
    assert sorted(res.table.column("id").to_pylist()) == ids


@pytest.mark.parametrize(("where", "message"), [
    ("R.c = '2024-01-01 00:00:00.0000000001'", "digits below a nanosecond"),
    ("R.d = '2024-01-01 00:00:00.000000001'", "has a time of day"),
])
def test_a_literal_finer_than_its_column_is_refused(where, message):
    with pytest.raises(QueryError, match=message):
        adaptcq.run(f"SELECT R.id FROM R, S WHERE R.k = S.k AND {where}",
                    {"R": RN, "S": SN}, executor="mjoin")


@pytest.mark.parametrize(("where", "ids"), NS_CASES[:2] + NS_CASES[5:7])
def test_the_eddy_keeps_a_literal_s_nanoseconds(tmp_path, where, ids):
    import pyarrow.parquet as pq
    pq.write_table(RN, tmp_path / "r.parquet")
    pq.write_table(SN, tmp_path / "s.parquet")
    out = tmp_path / "o"  # (the eddy writes a folder per query)
    assert main(["run", "--sql", f"SELECT R.id FROM R, S WHERE R.k = S.k AND {where}",
                 "--input", f"R={tmp_path / 'r.parquet'}", "--input",
                 f"S={tmp_path / 's.parquet'}", "--executor", "eddy", "--output", str(out),
                 "--no-progress"]) == 0
    assert sorted(pq.read_table(out).column("id").to_pylist()) == ids


@pytest.mark.parametrize("executor", ["mjoin", "xjoin", "tree"])
def test_a_selected_timestamp_literal_keeps_its_nanoseconds(executor):
    sql = ("SELECT TIMESTAMP '2024-01-01 02:00:00.000000001+02:00' AS x, "
           "TIMESTAMP '2024-01-01 00:00:00.5' AS y FROM R, S WHERE R.k = S.k")
    t = adaptcq.run(sql, {"R": RN.slice(0, 1), "S": SN}, executor=executor).table
    assert t.schema.field("x").type == pa.timestamp("ns")
    assert t.schema.field("y").type == pa.timestamp("us")
    assert t.column("x").cast(pa.int64()).to_pylist() == [_B + 1]


@pytest.mark.parametrize("executor", ["vector", "mjoin"])
@pytest.mark.parametrize("literal", ["2024-01-01 00:00:00,000000001",
                                     "2024-01-01T00:00:00,000000001Z",
                                     "20240101T000000.000000001"])
def test_every_iso_form_keeps_its_nanoseconds(executor, literal):
    """A comma before the fraction went to pandas' fallback parser, which cut it to the
    microsecond; the ISO basic form went to fromisoformat, which cut it too."""
    res = adaptcq.run(f"SELECT R.id FROM R, S WHERE R.k = S.k AND R.c = '{literal}'",
                      {"R": RN, "S": SN}, executor=executor)
    assert res.table.column("id").to_pylist() == [1]


def test_a_nanosecond_literal_outside_the_ns_span_says_so():
    with pytest.raises(QueryError, match="lies within 1677-09-21 and 2262-04-11"):
        adaptcq.run("SELECT R.id FROM R, S WHERE R.k = S.k AND "
                    "R.c = '3000-01-01 00:00:00.000000001'", {"R": RN, "S": SN},
                    executor="mjoin")
