"""`adaptcq run` refuses, naming the flag as typed, every option the run would not use:
the query-set executors' options (one table, checked against every option of the command),
`--seed` where nothing random uses it, and the spill flags given without the operator
tree. The combinations that are used still run."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from adaptcq.cli import _run_options, build_parser, main
from adaptcq.cliargs import QUERYSET_OPTIONS, run_defaults

SQL = ("SELECT R.a AS ra, S.c AS sc FROM R [RANGE 2 SECONDS], S [RANGE 2 SECONDS] "
       "WHERE R.a = S.a")
# --optimizer and --reorder need three streams (on two, each pipeline has one order)
SQL3 = ("SELECT R.a AS ra, S.c AS sc, T.c AS tc FROM R [RANGE 2 SECONDS], S [RANGE 2 SECONDS], "
        "T [RANGE 2 SECONDS] WHERE R.a = S.a AND S.c = T.c")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    d = tmp_path_factory.mktemp("in")
    rng = np.random.default_rng(1)
    n = 300
    for s in "RST":
        pq.write_table(pa.table({"ts": np.sort(rng.integers(0, 600, n)) / 10.0,
                                 "a": rng.integers(0, 20, n), "c": rng.integers(0, 5, n)}),
                       d / f"{s}.parquet")
    return [f"--input={s}={d / f'{s}.parquet'}" for s in "RS"]


@pytest.fixture(scope="module")
def inputs3(inputs):
    r = inputs[0]  # --input=R=<folder>/R.parquet (the fixture wrote T.parquet beside it)
    return [*inputs, "--input=T=" + r[len("--input=R="):-len("R.parquet")] + "T.parquet"]


def error_of(capsys, argv) -> str:
    assert main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err  # one line, no traceback
    return err[0]


# ----- the query-set executors ----------------------------------------------------------

# A value for every option of `adaptcq run` a query set does not use; the test below fails
# when an option is added to the command without a decision for the query sets.
SINGLE_QUERY = {
    "batch_rows": ["--batch-rows", "5"], "batch_seconds": ["--batch-seconds", "2"],
    "caches": ["--caches", "global"], "cache_memory": ["--cache-memory", "5"],
    "no_cache_verify": ["--no-cache-verify"], "reopt_interval": ["--reopt-interval", "9"],
    "format": ["--format", "csv"], "max_results": ["--max-results", "0"],
    "order": ["--order", "R:S"],
    "tree": ["--tree", "(R, S)"], "spill": ["--spill", "bottom-up"],
    "memory": ["--memory", "1MB"], "spill_partitions": ["--spill-partitions", "3"],
    "spill_fraction": ["--spill-fraction", "0.3"], "spill_check": ["--spill-check", "4"],
    "spill_dir": ["--spill-dir", "D"], "spill_sample": ["--spill-sample", "0.5"],
    "cleanup": ["--cleanup", "off"], "shed": ["--shed", "selective"],
    "capacity": ["--capacity", "1"], "basic_window": ["--basic-window", "1"],
    "index": ["--index", "hash"], "buffer": ["--buffer", "1"],
    "utility": ["--utility", "junk"], "no_join_direction": ["--no-join-direction"],
    "nested_loop": ["--nested-loop", "S"], "sign": ["--sign", "c"],
    "optimizer": ["--optimizer", "fgreedy"], "reorder": ["--reorder", "agreedy"],
    "master": ["--master", "local[1]"], "partitions": ["--partitions", "2"],
    "shares": ["--shares", "S.a=2"], "trigger": ["--trigger", "2"],
    "max_files_per_trigger": ["--max-files-per-trigger", "1"],
    "checkpoint": ["--checkpoint", "ck"],
}
ROUTING = {"routing": ["--routing", "random"], "routing_option": ["--routing-option", "decay=1"],
           "routing_epoch": ["--routing-epoch", "0"], "seed": ["--seed", "3"]}


def test_every_option_has_a_decision_for_the_query_sets():
    options = set(run_defaults()) - {"help"}
    assert set(SINGLE_QUERY) == options - QUERYSET_OPTIONS["eddy"]
    assert set(ROUTING) == QUERYSET_OPTIONS["eddy"] - QUERYSET_OPTIONS["pushdown"]
    assert QUERYSET_OPTIONS["eddies"] == QUERYSET_OPTIONS["eddy"]
    assert QUERYSET_OPTIONS["pullup"] == QUERYSET_OPTIONS["pushdown"]


def _queryset(executor, inputs, out, *extra):
    return ["run", "--executor", executor, "--sql", SQL, *inputs, "--output", str(out),
            "--no-progress", *extra]


@pytest.mark.parametrize("executor", ["eddy", "eddies", "pushdown", "pullup"])
@pytest.mark.parametrize("dest", sorted(SINGLE_QUERY))
def test_a_query_set_refuses_single_query_options(tmp_path, capsys, inputs, executor, dest):
    flag = SINGLE_QUERY[dest][0]
    msg = error_of(capsys, _queryset(executor, inputs, tmp_path / "o", *SINGLE_QUERY[dest]))
    assert msg.startswith(f"adaptcq: error: {flag}: not for --executor {executor} (a query set")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("executor", ["pushdown", "pullup"])
@pytest.mark.parametrize("dest", sorted(ROUTING))
def test_niagara_plans_refuse_routing_options(tmp_path, capsys, inputs, executor, dest):
    msg = error_of(capsys, _queryset(executor, inputs, tmp_path / "o", *ROUTING[dest]))
    assert msg.startswith(f"adaptcq: error: {ROUTING[dest][0]}: not for --executor "
                          f"{executor}")
    assert "NiagaraCQ's plans are static" in msg


def test_every_offending_flag_is_named(tmp_path, capsys, inputs):
    msg = error_of(capsys, _queryset("pushdown", inputs, tmp_path / "o", "--shed", "selective",
                                     "--capacity", "1", "--routing", "lottery", "--seed", "2"))
    assert msg.startswith("adaptcq: error: --routing, --seed, --shed, --capacity: not for "
                          "--executor pushdown")


@pytest.mark.parametrize("executor", ["eddy", "eddies"])
def test_fixed_routing_refuses_a_seed(tmp_path, capsys, inputs, executor):
    msg = error_of(capsys, _queryset(executor, inputs, tmp_path / "o", "--routing", "fixed",
                                     "--seed", "3"))
    assert msg.startswith("adaptcq: error: --seed 3: --routing fixed routes in a priority "
                          "order")
    # on Spark too, before any JVM starts
    msg = error_of(capsys, _queryset(executor, inputs, tmp_path / "o", "--routing", "fixed",
                                     "--seed", "0", "--engine", "spark"))
    assert msg.startswith("adaptcq: error: --seed 0: --routing fixed")


def test_a_routing_option_seed_is_refused(tmp_path, capsys, inputs):
    msg = error_of(capsys, _queryset("eddy", inputs, tmp_path / "o", "--routing-option",
                                     "seed=5"))
    assert msg == "adaptcq: error: --routing-option 'seed=5': give the seed with --seed"


def test_the_query_sets_run_with_the_options_they_use(tmp_path, capsys, inputs):
    common = ["--mode", "retract", "--timestamp", "ts", "--timestamp-unit", "s",
              "--allowed-lateness", "1", "--summary-json", str(tmp_path / "s.json")]
    runs = {"eddy": ["--routing", "random", "--seed", "3", "--routing-epoch", "0"],
            "eddies": ["--routing", "lottery", "--seed", "0", "--routing-option", "decay=0.9",
                       "--routing-epoch", "50"],
            "pushdown": [], "pullup": []}
    got = {}
    for executor, extra in runs.items():
        out = tmp_path / executor
        assert main(_queryset(executor, inputs, out, *common, *extra)) == 0, \
            capsys.readouterr().err
        t = pq.read_table(out / "query_id=q1" / "part-0.parquet")
        got[executor] = sorted(zip(*(t.column(c).to_pylist() for c in t.column_names)))
    assert got["eddy"] and all(rows == got["eddy"] for rows in got.values())
    assert main(_queryset("eddy", inputs, tmp_path / "f", "--routing", "fixed")) == 0


# ----- --seed on one query -----------------------------------------------------------------

def _one(inputs, tmp_path, *extra):
    sql = SQL3 if any("T=" in i for i in inputs) else SQL
    return ["run", "--sql", sql, *inputs, "--output", str(tmp_path / "o.parquet"),
            "--no-progress", *extra]


@pytest.mark.parametrize(("extra", "why"), [
    (["--executor", "mjoin"], "--executor mjoin without adaptive policies"),
    (["--executor", "xjoin"], "--executor xjoin computes exact results over a fixed tree"),
    (["--executor", "vector"], "--executor vector without adaptive policies"),
    (["--executor", "auto"], "--executor auto without adaptive policies"),
    (["--executor", "vector", "--optimizer", "fgreedy"], "--optimizer with --executor vector"),
    (["--optimizer", "fgreedy"], "--optimizer with --executor auto"),
    (["--executor", "tree"], "the operator tree without --spill"),
    (["--executor", "tree", "--spill", "local-output", "--memory", "1MB"],
     "--spill local-output ranks partition groups deterministically"),
    (["--executor", "shed"], "--shed none drops and samples no tuple at random"),
    (["--executor", "shed", "--shed", "none", "--capacity", "100"], "--shed none"),
    # inverted-id's random identifiers stand for memory addresses (load-shedding.txt
    # §4.2.1): they only order its lists, so no output, work or drop depends on them
    (["--executor", "shed", "--index", "inverted-id"], "--shed none"),
])
def test_a_seed_nothing_uses_is_refused(tmp_path, capsys, inputs, inputs3, extra, why):
    for seed in ("4", "0"):  # an explicit 0 too: it is not the default, just the value
        given = inputs3 if "--optimizer" in extra else inputs
        msg = error_of(capsys, _one(given, tmp_path, *extra, "--seed", seed))
        assert msg.startswith(f"adaptcq: error: --seed {seed}: nothing random in this run "
                              f"uses it ({why}")
    assert not (tmp_path / "o.parquet").exists()


def _options(*argv) -> dict:
    args = build_parser().parse_args(["run", "--sql", SQL, *argv])
    args.sql = args.sql[0]
    return _run_options(args)


@pytest.mark.parametrize(("extra", "seeded"), [
    (["--executor", "acaching"], lambda o: o["cache_options"]["seed"]),
    (["--executor", "mjoin", "--optimizer", "fgreedy"], lambda o: o["policies"][0].seed),
    (["--executor", "mjoin", "--reorder", "agreedy"], lambda o: o["policies"][0].seed),
    (["--reorder", "agreedy"], lambda o: o["policies"][0].seed),
    (["--executor", "shed", "--shed", "random", "--capacity", "100"],
     lambda o: o["shed"]["seed"]),
    (["--shed", "partial", "--capacity", "100"], lambda o: o["shed"]["seed"]),
    (["--shed", "selective", "--capacity", "100"], lambda o: o["shed"]["seed"]),
    (["--executor", "tree", "--spill", "bottom-up", "--memory", "1MB"],
     lambda o: o["spill"]["seed"]),
    (["--spill", "global-output", "--memory", "1MB"], lambda o: o["spill"]["seed"]),
    (["--spill", "global-penalty", "--memory", "1MB"], lambda o: o["spill"]["seed"]),
])
def test_a_seed_reaches_what_it_seeds(extra, seeded):
    assert seeded(_options(*extra, "--seed", "7")) == 7


def test_no_seed_leaves_the_defaults():
    assert "seed" not in _options("--executor", "acaching")["cache_options"]
    assert _options("--executor", "mjoin", "--reorder", "agreedy")["policies"][0].seed == 0
    assert "seed" not in _options("--spill", "bottom-up", "--memory", "1MB")["spill"]


@pytest.mark.parametrize("extra", [
    ["--executor", "acaching"],
    ["--executor", "mjoin", "--reorder", "agreedy"],
    ["--executor", "shed", "--shed", "selective", "--capacity", "100"],
    ["--executor", "tree", "--spill", "bottom-up", "--memory", "1MB"],
])
def test_seeded_runs_still_run(tmp_path, capsys, inputs, inputs3, extra):
    # (ordering and caching need three streams: refused on two)
    given = inputs3 if "--reorder" in extra or "acaching" in extra else inputs
    assert main(_one(given, tmp_path, *extra, "--seed", "4")) == 0, capsys.readouterr().err
    assert (tmp_path / "o.parquet").exists()


@pytest.mark.parametrize("extra", [["--routing", "random"], ["--routing-epoch", "0"],
                                   ["--routing-option", "decay=1"]])
def test_routing_options_on_one_query_name_the_eddy(tmp_path, capsys, inputs, extra):
    msg = error_of(capsys, _one(inputs, tmp_path, "--executor", "mjoin", *extra))
    assert msg.startswith(f"adaptcq: error: {extra[0]} is for --executor eddy or eddies")


# ----- the spill flags, as typed -------------------------------------------------------------

@pytest.mark.parametrize("flag", [["--spill", "global-output"], ["--memory", "1MB"],
                                  ["--spill-partitions", "3"], ["--spill-fraction", "0.3"],
                                  ["--spill-check", "4"], ["--spill-dir", "D"],
                                  ["--spill-sample", "0.5"], ["--cleanup", "off"]])
def test_spill_flags_without_the_tree_are_named_as_typed(tmp_path, capsys, inputs, flag):
    msg = error_of(capsys, _one(inputs, tmp_path, "--executor", "mjoin", *flag))
    assert msg == (f"adaptcq: error: {flag[0]}: spilling is done by the operator tree "
                   "(--executor tree), not by --executor mjoin")


def test_all_spill_flags_are_named(tmp_path, capsys, inputs):
    msg = error_of(capsys, _one(inputs, tmp_path, "--executor", "acaching", "--cleanup", "off",
                                "--spill-dir", "D", "--spill-partitions", "3", "--spill",
                                "bottom-up", "--memory", "1MB", "--spill-sample", "0.5"))
    assert msg.startswith("adaptcq: error: --spill, --memory, --spill-partitions, --spill-dir, "
                          "--spill-sample, --cleanup: spilling is done by the operator tree")
