"""``adaptcq explain`` accepts and refuses what ``adaptcq run`` does, with the same one-line
errors (a tester's findings): a bad --order for --executor vector without --input, an input
that is not a stream of the query in the Spark split, --caches with --executor mjoin; a
stream whose selection passes no row is named as the cause (not "give a larger --prefix"
when the whole input was read); a SELECT * without --input is told to give --input. No test
here starts Spark (``--engine spark --partitions P`` only plans the split)."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from adaptcq.cli import main

SQL3 = ("SELECT R.id AS r FROM R [RANGE 1 SECONDS], S [RANGE 1 SECONDS], T [RANGE 1 SECONDS] "
        "WHERE R.a = S.a AND S.b = T.b")
SQL2 = "SELECT R.id AS r, S.id AS s FROM R [RANGE 1 SECONDS], S [RANGE 1 SECONDS] WHERE R.a = S.a"
STAR = "SELECT * FROM R [RANGE 1 SECONDS], S [RANGE 1 SECONDS] WHERE R.a = S.a"
ROWS = 300


@pytest.fixture(scope="module")
def d(tmp_path_factory):
    """R(a), S(a, b), T(b): ROWS rows each over 10 seconds, keys in 0..4."""
    d = tmp_path_factory.mktemp("in")
    for name, cols in {"R": "a", "S": "ab", "T": "b"}.items():
        t = {"ts": [10 * k / ROWS for k in range(ROWS)], "id": list(range(ROWS))}
        for c in cols:
            t[c] = [(k * 7 + ord(c)) % 5 for k in range(ROWS)]
        pq.write_table(pa.table(t), d / f"{name}.parquet")
    return d


def inputs(d, names="RST") -> list[str]:
    return [x for s in names for x in ("--input", f"{s}={d / f'{s}.parquet'}")]


def one_error(capsys, *argv) -> str:
    code = main(list(argv))
    err = capsys.readouterr().err
    assert code == 1, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("adaptcq: error: "), err
    return lines[0]


def test_vector_bad_order_without_input_is_the_line_run_prints(d, capsys):
    want = "adaptcq: error: pipeline order for R must list each of S, T once, got S"
    assert one_error(capsys, "explain", "--sql", SQL3, "--executor", "vector",
                     "--order", "R:S") == want
    assert one_error(capsys, "explain", "--sql", SQL3, "--executor", "vector",
                     "--order", "R:S", *inputs(d)) == want
    assert one_error(capsys, "explain", "--sql", SQL3, "--code", "--order", "R:S") == want
    # a good order is still shown
    assert main(["explain", "--sql", SQL3, "--executor", "vector", "--order", "R:S,T"]) == 0
    assert "R" in capsys.readouterr().out


def test_split_refuses_an_input_that_is_not_a_stream_of_the_query(d, capsys):
    err = one_error(capsys, "explain", "--sql", SQL2, "--engine", "spark", "--partitions",
                    "4", *inputs(d))
    assert "input T is not a stream of the query (its streams: R, S)" in err
    assert err == one_error(capsys, "explain", "--sql", SQL2, *inputs(d))
    err = one_error(capsys, "explain", "--sql", SQL3, "--engine", "spark", "--partitions",
                    "4", *inputs(d, "RS"))
    assert "no input for stream T" in err
    # the inputs of the query's streams give the split
    assert main(["explain", "--sql", SQL2, "--engine", "spark", "--partitions", "4",
                 "--json", *inputs(d, "RS")]) == 0
    assert json.loads(capsys.readouterr().out)["rates_from"] == "row counts of the inputs"


def statistics_line(capsys, *argv) -> str:
    """The report's statistics (explain --json ...), which it printed with exit 0."""
    assert main([*argv, "--json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)["statistics"]


def test_a_selection_that_passes_no_row_is_named_not_a_larger_prefix(d, capsys):
    """adaptcq run runs such a query: explain reports its plans (it refused them), noting
    which σ's are not measured and why."""
    sql = SQL3 + " AND T.id < 0"
    for prefix in ([], ["--prefix", str(10 * ROWS)]):  # the whole input is read
        note = statistics_line(capsys, "explain", "--sql", sql, *inputs(d), *prefix)
        assert "the σ's of the joins of T are not measured (taken as 1" in note
        assert (f"T's selection passed none of its {ROWS:,} rows in the whole input "
                f"({3 * ROWS:,} rows)") in note
        assert "larger --prefix" not in note and note.endswith("give --stats FILE to set them")
    # part of the input read: a larger --prefix may help, and says so
    note = statistics_line(capsys, "explain", "--sql", sql, *inputs(d), "--prefix", "90")
    assert "T's selection passed none of its" in note and "in the first 90 input rows" in note
    assert note.endswith("a larger --prefix may measure them, or give --stats FILE")
    # a selection that passes rows measures
    assert "not measured" not in statistics_line(
        capsys, "explain", "--sql", SQL3 + " AND T.id >= 0", *inputs(d))


def test_a_stream_with_no_row_in_the_prefix_is_named(d, tmp_path, capsys):
    t = pq.read_table(d / "T.parquet")
    late = t.set_column(0, "ts", pa.array([100.0 + x for x in t["ts"].to_pylist()]))
    pq.write_table(late, tmp_path / "T.parquet")
    argv = ["explain", "--sql", SQL3, *inputs(d, "RS"), "--input",
            f"T={tmp_path / 'T.parquet'}", "--prefix", str(2 * ROWS)]
    note = statistics_line(capsys, *argv)
    assert f"T has no row in the first {2 * ROWS} input rows" in note
    assert note.endswith("a larger --prefix may measure them, or give --stats FILE")


@pytest.mark.parametrize("executor", ["mjoin", "xjoin"])
def test_caches_with_an_executor_other_than_acaching_is_refused_as_run_refuses_it(
        d, capsys, executor):
    common = ["--sql", SQL3, *inputs(d), "--executor", executor, "--caches", "global"]
    err = one_error(capsys, "explain", *common)
    assert err.startswith(f"adaptcq: error: --executor {executor} with --caches: ")
    assert "give --executor acaching, or no --executor" in err
    assert "need --executor acaching" in one_error(capsys, "run", "--no-progress", *common)


@pytest.mark.parametrize("executor", [[], ["--executor", "acaching"]])
def test_caches_with_acaching_or_no_executor_shows_the_candidates(d, capsys, executor):
    assert main(["explain", "--sql", SQL3, *inputs(d), "--caches", "global", "--json",
                 *executor]) == 0
    assert '"caches"' in capsys.readouterr().out


@pytest.mark.parametrize("argv, advice", [
    (["--code"], "give --input NAME=PATH for each stream, or list the columns"),
    (["--executor", "vector"], "give --input NAME=PATH for each stream, or list the columns"),
    (["--engine", "spark", "--partitions", "4"],
     "give --input NAME=PATH for each stream, or list the columns"),
])
def test_select_star_without_input_is_told_to_give_input(capsys, argv, advice):
    code = main(["explain", "--sql", STAR, *argv])
    err = capsys.readouterr().err
    assert code == 1
    first = err.strip().splitlines()[0]
    assert first.startswith("adaptcq: error: '*' needs the stream schemas to expand")
    assert advice in first and "schemas=" not in first


def test_select_star_with_input_is_expanded(d, capsys):
    assert main(["explain", "--sql", STAR, "--code", *inputs(d, "RS")]) == 0
    assert "pipeline" in capsys.readouterr().out
    assert main(["explain", "--sql", STAR, "--executor", "vector", *inputs(d, "RS")]) == 0
    capsys.readouterr()
