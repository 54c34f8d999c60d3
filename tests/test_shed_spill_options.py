"""Shedding and spilling options and summary figures: join direction on n-way joins (refused,
reported false), the spill seed and when_free checked, a stopped spilling run's summary
claiming no completeness, and the two-way shedding join counting every fully processed
tuple."""

from __future__ import annotations

import random
from collections import Counter

import pyarrow as pa
import pytest

import adaptcq
from adaptcq.errors import OptionError

SQL3 = ("SELECT R.id AS r, S.id AS s, T.id AS t FROM R [RANGE 1 SECONDS], "
        "S [RANGE 1 SECONDS], T [RANGE 1 SECONDS] WHERE R.k = S.k AND S.k = T.k")
SQL2 = "SELECT R.id AS r, S.id AS s FROM R [RANGE 1 SECONDS], S [RANGE 1 SECONDS] " \
       "WHERE R.k = S.k"


def small():
    return pa.table({"ts": [0.0, 0.5, 1.0, 1.5], "id": [1, 2, 3, 4], "k": [1, 1, 2, 2]})


def rows(result, cols):
    return Counter(tuple(r[c] for c in cols) for r in result.table.to_pylist())


# ----- 1. join direction is two-way only ----------------------------------------------------
def busy_tables(streams, n=300, seed=1):
    rnd = random.Random(seed)
    return {s: pa.table({"ts": sorted(rnd.uniform(0, 30) for _ in range(n)),
                         "id": list(range(n)), "k": [rnd.randint(0, 3) for _ in range(n)]})
            for s in streams}


def test_an_nway_selective_run_never_reports_join_direction():
    """Before any rate step (a short run) and after many (an overloaded long one), a 3-way
    selective run's summary says join_direction false; a two-way one says true."""
    three = {s: small() for s in "RST"}
    short = adaptcq.run(SQL3, three, executor="shed", shed={"mode": "selective",
                                                              "capacity": 10})
    assert short.stats["rate_steps"] == 0 and short.stats["join_direction"] is False
    long = adaptcq.run(SQL3, busy_tables("RST"), executor="shed",
                       shed={"mode": "selective", "capacity": 500, "T_r": 1, "T_c": 1})
    assert long.stats["rate_steps"] > 5 and long.stats["join_direction"] is False
    two = adaptcq.run(SQL2, {s: small() for s in "RS"}, executor="shed",
                      shed={"mode": "selective", "capacity": 10})
    assert two.stats["rate_steps"] == 0 and two.stats["join_direction"] is True


@pytest.mark.parametrize("direction", [False, True])
def test_join_direction_given_for_an_nway_join_is_refused(direction):
    with pytest.raises(OptionError, match=r"two-way algorithm .* joins 3 streams"):
        adaptcq.run(SQL3, {s: small() for s in "RST"}, executor="shed",
                    shed={"mode": "selective", "capacity": 10, "direction": direction})


def test_spark_refuses_join_direction_for_an_nway_join_on_the_driver():
    """The Spark runtime builds one group's engine on the driver (``_check_engine``): the
    refusal comes from there, before any worker runs (no JVM needed here)."""
    from adaptcq.query.cql import parse_query
    from adaptcq.runtime.shed import spark_shed_spec
    from adaptcq.runtime.spark import _check_engine
    kinds = {"ts": "number", "id": "number", "k": "number"}
    q = parse_query(SQL3, {s: kinds for s in "RST"})
    spec = spark_shed_spec({"mode": "selective", "capacity": 10, "direction": False}, 2, 2)
    with pytest.raises(OptionError, match="not applied to an n-way join"):
        _check_engine(q, "shed", "append", False, None, {"shed": spec})
    _check_engine(q, "shed", "append", False, None,
                  {"shed": spark_shed_spec({"mode": "selective", "capacity": 10}, 2, 2)})


def test_no_join_direction_still_works_for_two_streams():
    out = adaptcq.run(SQL2, {s: small() for s in "RS"}, executor="shed",
                      shed={"mode": "selective", "capacity": 10, "direction": False})
    assert out.stats["join_direction"] is False


def test_the_cli_refuses_no_join_direction_for_three_streams(tmp_path, capsys):
    import pyarrow.parquet as pq

    from adaptcq.cli import main
    for s in "RST":
        pq.write_table(small(), tmp_path / f"{s}.parquet")
    code = main(["run", "--sql", SQL3, *(f"--input={s}={tmp_path / f'{s}.parquet'}"
                                         for s in "RST"),
                 "--no-progress", "--shed", "selective", "--capacity", "10",
                 "--no-join-direction", "--output", str(tmp_path / "o.parquet")])
    assert code != 0
    assert "not applied to an n-way join" in capsys.readouterr().err
    assert not (tmp_path / "o.parquet").exists()


# ----- 2. and 3. the spill seed and when_free -------------------------------------------------
SPILL_SQL = ("SELECT A.id AS a, B.id AS b FROM A [RANGE 2 SECONDS], B [RANGE 1 SECONDS] "
             "WHERE A.k = B.k")


def spill_tables():
    rnd = random.Random(3)
    return {n: pa.table({"ts": sorted(rnd.uniform(0, 20) for _ in range(150)),
                         "k": [rnd.randint(0, 2) for _ in range(150)],
                         "id": list(range(150))}) for n in "AB"}


SPILL = {"strategy": "bottom-up", "memory": 2500, "partitions": 3, "every": 2}


@pytest.mark.parametrize("seed", ["x", 1.5, True, None])
def test_a_spill_seed_must_be_an_integer(seed):
    """'x' raised a bare ValueError from int(); 1.5 and True became 1."""
    with pytest.raises(OptionError, match=r"spill option seed must be an integer, got"):
        adaptcq.run(SPILL_SQL, spill_tables(), spill={**SPILL, "seed": seed})
    from adaptcq.runtime.spill import spark_spill_spec
    with pytest.raises(OptionError, match=r"seed must be an integer"):
        spark_spill_spec({**SPILL, "seed": seed, "directory": "/nonexistent"}, 1)


def test_a_spill_seed_nothing_draws_with_is_refused():
    """local-output ranks deterministically (the CLI refuses --seed with it); without a
    strategy nothing spills."""
    with pytest.raises(OptionError, match="local-output ranks partition groups "
                                          "deterministically"):
        adaptcq.run(SPILL_SQL, spill_tables(),
                    spill={**SPILL, "strategy": "local-output", "seed": 3})
    with pytest.raises(OptionError, match="nothing spills"):
        adaptcq.run(SPILL_SQL, spill_tables(), executor="tree", spill={"seed": 3})


def test_a_spill_seed_is_used_and_results_stay_exact():
    tabs = spill_tables()
    ref = rows(adaptcq.run(SPILL_SQL, tabs, executor="mjoin"), ("a", "b", "_ts"))
    runs = [adaptcq.run(SPILL_SQL, tabs, spill={**SPILL, "seed": seed})
            for seed in (0, 5, 5)]
    for r in runs:
        assert rows(r, ("a", "b", "_ts")) == ref and r.stats["spills"] > 0
    assert runs[1].stats["partition_groups_spilled"] == runs[2].stats["partition_groups_spilled"]


@pytest.mark.parametrize("value", ["no", "false", 0, 1, None])
def test_when_free_takes_only_true_or_false(value):
    """bool(value) made "no" and "false" mean true: clean-ups while running."""
    with pytest.raises(OptionError, match=r"when_free .* must be True or False, got"):
        adaptcq.run(SPILL_SQL, spill_tables(), spill={**SPILL, "when_free": value})
    from adaptcq.runtime.spill import spark_spill_spec
    with pytest.raises(OptionError, match="when_free"):
        spark_spill_spec({**SPILL, "when_free": value, "directory": "/nonexistent"}, 1)


def test_when_free_false_cleans_up_only_at_the_end():
    tabs = spill_tables()
    never = adaptcq.run(SPILL_SQL, tabs, spill={**SPILL, "when_free": False})
    free = adaptcq.run(SPILL_SQL, tabs, spill={**SPILL, "when_free": True})
    assert never.stats["cleanups"] == 1 < free.stats["cleanups"]
    assert rows(never, ("a", "b")) == rows(free, ("a", "b"))


# ----- 4. a stopped spilling run claims no completeness ------------------------------------
def test_a_max_results_stop_reports_no_complete_until_or_spill_folder(tmp_path):
    """The output is cut at --max-results and the spill files removed: complete_until
    (results before it are missing) and spill_folder (nothing left to clean up) are not
    reported. The same run to the end reports both, and the folder cleans up."""
    from adaptcq.runtime.spill import cleanup_folder
    tabs = spill_tables()
    spill = {**SPILL, "cleanup": "off"}
    cut = adaptcq.run(SPILL_SQL, tabs, max_results=5,
                      spill={**spill, "directory": str(tmp_path / "cut")})
    assert cut.stats["stopped"] and cut.table.num_rows == 5 and cut.stats["spills"] > 0
    assert "complete_until" not in cut.stats and "spill_folder" not in cut.stats
    whole = adaptcq.run(SPILL_SQL, tabs, spill={**spill, "directory": str(tmp_path / "w")})
    assert whole.stats["stopped"] is None
    assert whole.stats["spill_folder"] == str(tmp_path / "w")
    # every result before complete_until is in the run's own output
    ref = adaptcq.run(SPILL_SQL, tabs, executor="mjoin").table.to_pylist()
    cu = whole.stats["complete_until"]
    need = Counter((r["a"], r["b"]) for r in ref if r["_ts"] < cu)
    assert sum(need.values()) > 0
    assert not need - rows(whole, ("a", "b"))
    done = cleanup_folder(whole.stats["spill_folder"], str(tmp_path / "late.parquet"))
    assert done["late_results"] + whole.table.num_rows == len(ref)


def test_a_run_closed_by_its_consumer_reports_no_complete_until():
    run = adaptcq.stream(SPILL_SQL, spill_tables(), chunk_rows=20,
                         spill={**SPILL, "every": 1})
    it = iter(run)
    next(it)
    it.close()
    assert run.stats["stopped"] == "closed by its consumer"
    assert "complete_until" not in run.stats and "spill_folder" not in run.stats


def test_a_finished_run_still_reports_complete_until():
    r = adaptcq.run(SPILL_SQL, spill_tables(), spill=SPILL)
    assert r.stats["complete_until"] == pytest.approx(r.stats["last_event_time"])
    assert "spill_folder" not in r.stats  # cleaned up: nothing left on disk


# ----- 5. fully_processed of the two-way shedding join --------------------------------------
def test_tuples_meeting_an_empty_window_count_as_fully_processed():
    """With --shed none (or random) and ample capacity every fetched tuple is fully
    processed; those that probed an empty window were left out (0 of 6 here)."""
    R = pa.table({"ts": [0.0, 1.0, 2.0], "id": [1, 2, 3], "k": [1, 1, 2]})
    S = pa.table({"ts": [0.5, 1.5, 2.5], "id": [10, 20, 30], "k": [1, 2, 2]})
    sql = ("SELECT R.id AS r, S.id AS s FROM R [RANGE 0.1 SECONDS], S [RANGE 0.1 SECONDS] "
           "WHERE R.k = S.k")
    for mode in ("none", "random"):
        st = adaptcq.run(sql, {"R": R, "S": S}, executor="shed",
                         shed={"mode": mode, "capacity": 1e9}).stats
        assert st["arrivals"] == 6 and sum(st["buffer_drops"].values()) == 0
        assert st["fully_processed"] == 6, mode


@pytest.mark.parametrize("mode", ["none", "random", "partial", "selective"])
def test_fully_processed_with_ample_capacity_is_every_fetched_tuple(mode):
    """Windows often empty (short ranges over sparse arrivals), ample capacity: r stays 1,
    every fetched tuple is fully processed, and the output is the oracle's."""
    tabs = busy_tables("RS", n=200, seed=4)
    sql = ("SELECT R.id AS r, S.id AS s FROM R [RANGE 0.2 SECONDS], S [RANGE 0.1 SECONDS] "
           "WHERE R.k = S.k")
    seed = {} if mode == "none" else {"seed": 2}  # (none draws nothing: a seed refused)
    out = adaptcq.run(sql, tabs, executor="shed", shed={"mode": mode, "capacity": 1e9,
                                                        **seed})
    st = out.stats
    assert st["fully_processed"] == st["arrivals"] - sum(st["buffer_drops"].values()) == 400
    ref = adaptcq.run(sql, tabs, executor="mjoin")
    assert rows(out, ("r", "s", "_ts")) == rows(ref, ("r", "s", "_ts"))
    assert st["shed_results"] == ref.table.num_rows > 0


def test_fully_processed_stays_within_the_fetched_tuples_under_overload():
    tabs = busy_tables("RS", n=400, seed=6)
    sql = ("SELECT R.id AS r, S.id AS s FROM R [RANGE 3 SECONDS], S [RANGE 3 SECONDS] "
           "WHERE R.k = S.k")
    out = adaptcq.run(sql, tabs, executor="shed",
                      shed={"mode": "selective", "capacity": 300, "T_r": 1, "T_c": 1,
                            "seed": 1})
    st = out.stats
    fetched = st["arrivals"] - sum(st["buffer_drops"].values())
    assert st["fraction_r_min"] < 1 and 0 < st["fully_processed"] < fetched
    ref = rows(adaptcq.run(sql, tabs, executor="mjoin"), ("r", "s", "_ts"))
    assert not rows(out, ("r", "s", "_ts")) - ref  # a sub-multiset of the oracle's



def test_utility_based_shedding_reports_no_join_direction():
    """Algorithm 5 replaces Algorithm 4: the summary said join_direction true."""
    t = pa.table({"ts": [0.0, 0.5, 1.0, 1.5], "id": [1, 2, 3, 4], "k": [1, 1, 2, 2],
                  "kind": ["a", "b", "a", "b"]})
    out = adaptcq.run(SQL2, {"R": t, "S": t}, executor="shed",
                      shed={"mode": "selective", "capacity": 10,
                            "utility": "CASE kind WHEN 'a' THEN 3 ELSE 1 END"})
    assert "output_utility" in out.stats and out.stats["join_direction"] is False


def test_a_run_stopped_by_stop_still_cleans_up_and_reports_complete_until():
    """stop() ends the input early, but the spills' clean-up still runs: every result of
    the arrivals processed is out, so complete_until (their last event time) is true."""
    tabs = spill_tables()
    run = adaptcq.stream(SPILL_SQL, tabs, chunk_rows=20, spill={**SPILL, "every": 1})
    got = []
    for b in run:
        got += b.to_pylist()
        if not run.stats.get("stopped"):
            run.stop()
    st = run.stats
    assert st["stopped"] and st["spills"] > 0 and st["cleanups"] >= 1
    assert st["complete_until"] == pytest.approx(st["last_event_time"])
    assert st["complete_until"] < max(max(t.column("ts").to_pylist()) for t in tabs.values())
    ref = adaptcq.run(SPILL_SQL, tabs, executor="mjoin").table.to_pylist()
    need = Counter((r["a"], r["b"]) for r in ref if r["_ts"] <= st["complete_until"])
    assert sum(need.values()) > 0
    assert Counter((r["a"], r["b"]) for r in got) == need
