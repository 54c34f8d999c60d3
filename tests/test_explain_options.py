"""``adaptcq explain``: its options and its statistics file, checked before any work (a
tester's findings). A statistics file that is a folder, unreadable or not JSON is one line
naming it; a reader closing stdout ends explain quietly; an option or combination that
changes nothing in the report is refused with the reason, never ignored; the statistics'
values are numbers (not booleans or strings), finite, in range, and small enough that every
plan cost stays a finite float. No test here starts Spark (``--engine spark --partitions P``
only plans the split)."""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adaptcq.cli import main
from adaptcq.errors import AdaptcqError
from adaptcq.explain import add_arguments, explain_graph, graph_from_json
from adaptcq.query.cql import parse_query
from conftest import examples

SQL = ("SELECT R.id AS rid, S.id AS sid, T.id AS tid FROM R [RANGE 1 SECONDS], "
       "S [RANGE 1 SECONDS], T [RANGE 1 SECONDS] WHERE R.a = S.a AND S.b = T.b")
GOOD = {"rates": {"R": 1, "S": 2, "T": 3}, "selectivities": {"R,S": 0.1, "S,T": 0.2},
        "window": 1}


@pytest.fixture(scope="module")
def w(tmp_path_factory):
    """The §7.2 three-way workload (600 updates) and a valid statistics file."""
    from adaptcq.stream.workloads import three_way, write_workload
    d = tmp_path_factory.mktemp("w")
    write_workload(three_way(n_updates=600, seed=1), d)
    (d / "stats.json").write_text(json.dumps(GOOD))
    return d


def inputs(w) -> list[str]:
    return [x for s in "RST" for x in ("--input", f"{s}={w / f'{s}.parquet'}")]


def explain(capsys, *argv) -> tuple[int, str, str]:
    code = main(["explain", "--sql", SQL, *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def one_error(capsys, *argv) -> str:
    code, _, err = explain(capsys, *argv)
    assert code == 1, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("adaptcq: error: "), err
    return lines[0]


# ----- 1. the statistics file ---------------------------------------------------------------------
@pytest.mark.parametrize("split", [[], ["--engine", "spark", "--partitions", "4"]])
def test_a_statistics_folder_is_one_line_naming_it(w, capsys, split):
    """A folder (was IsADirectoryError), in the optimizer's report and in the split."""
    msg = one_error(capsys, "--stats", str(w), *split)
    assert f"statistics file {str(w)!r} is a folder" in msg


@pytest.mark.parametrize("split", [[], ["--engine", "spark", "--partitions", "4"]])
@pytest.mark.parametrize(("content", "message"), [
    (b"\xff\xfe{", "is not UTF-8 text"),
    (b'{"rates": {"R": NaN}}', "is not valid JSON: NaN is not a JSON number"),
    (b'{"rates": ', "is not valid JSON: Expecting value"),
])
def test_an_invalid_statistics_file_is_one_line_naming_it(tmp_path, capsys, split, content,
                                                          message):
    path = tmp_path / "s.json"
    path.write_bytes(content)
    msg = one_error(capsys, "--stats", str(path), *split)
    assert f"statistics file {str(path)!r} {message}" in msg


def test_an_unreadable_statistics_file_is_one_line_naming_it(tmp_path, capsys, monkeypatch):
    path = tmp_path / "s.json"
    path.write_text(json.dumps(GOOD))

    def denied(self, *a, **k):
        raise PermissionError(13, "Permission denied", str(self))
    monkeypatch.setattr(Path, "read_text", denied)  # (chmod 000 does not stop root)
    for split in ([], ["--engine", "spark", "--partitions", "4"]):
        msg = one_error(capsys, "--stats", str(path), *split)
        assert f"cannot read statistics file {str(path)!r}: Permission denied" in msg


# ----- 2. stdout closed by its reader -------------------------------------------------------------
@pytest.mark.parametrize("argv", [
    ["--stats", "STATS", "--json"],                  # print(json.dumps(report))
    ["--stats", "STATS"],                            # rich tables
    ["--code", "--json"],
    ["--code"],
    ["--engine", "spark", "--partitions", "4"],      # rich, the split (no Spark session)
])
def test_a_closed_stdout_ends_explain_quietly(w, argv):
    """``adaptcq explain ... | head -c 10``: a BrokenPipeError traceback (rich: exit 1)
    before; now exit 0 and nothing on stderr, as ``adaptcq run --output - | head``."""
    argv = [str(w / "stats.json") if a == "STATS" else a for a in argv]
    read, write = os.pipe()
    os.close(read)  # no reader: the first write fails with EPIPE, whenever it comes
    try:
        done = subprocess.run(
            [sys.executable, "-c", "from adaptcq.cli import main; raise SystemExit(main())",
             "explain", "--sql", SQL, *argv],
            stdout=write, stderr=subprocess.PIPE, timeout=120, check=False)
    finally:
        os.close(write)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stderr == b""


# ----- 3. options that change nothing are refused -------------------------------------------------
REFUSED = [
    # (argv with W for the workload folder, STATS for its statistics file, INPUTS, flag)
    (["--stats", "STATS", "--prefix", "10"], "--prefix"),
    (["--stats", "STATS", "--timestamp", "ts"], "--timestamp"),
    (["--code", "--prefix", "10"], "--prefix"),
    (["--code", "--timestamp", "ts"], "--timestamp"),
    (["--engine", "spark", "--partitions", "4", "--prefix", "10"], "--prefix"),
    (["--engine", "spark", "--partitions", "4", "--timestamp", "ts"], "--timestamp"),
    (["--engine", "spark", "--partitions", "4", "INPUTS", "--prefix", "10"], "--prefix"),
    (["--engine", "spark", "--partitions", "4", "--stats", "STATS", "--timestamp", "ts"],
     "--timestamp"),
    (["--stats", "STATS", "--routing", "lottery"], "--routing"),
    (["INPUTS", "--routing", "lottery"], "--routing"),
    (["--code", "--routing", "lottery"], "--routing"),
    (["--engine", "spark", "--partitions", "4", "--routing", "lottery"], "--routing"),
    (["--executor", "vector", "--routing", "lottery"], "--routing"),
    (["--executor", "shed", "--routing", "lottery"], "--routing"),
    (["--code", "--caches", "prefix"], "--caches"),
    (["--stats", "STATS", "--engine", "spark", "--partitions", "4", "--caches", "prefix"],
     "--caches"),
    (["--engine", "spark", "--partitions", "4", "--mode", "retract"], "--mode"),
    (["--engine", "spark", "--partitions", "4", "--executor", "mjoin"], "--executor"),
    (["--engine", "spark", "--partitions", "4", "--order", "R:T,S"], "--order"),
    (["--executor", "eddy", "INPUTS", "--stats", "STATS"], "--stats"),
    (["--executor", "eddy", "INPUTS", "--order", "R:T,S"], "--order"),
    (["--executor", "eddy", "INPUTS", "--nested-loop", "S"], "--nested-loop"),
    (["--executor", "eddy", "INPUTS", "--caches", "prefix"], "--caches"),
    (["--executor", "eddy", "INPUTS", "--shares", "S.b=2"], "--shares"),
    (["--executor", "eddy", "INPUTS", "--engine", "spark", "--partitions", "2"], "--engine"),
    (["--executor", "eddy", "INPUTS", "--batch-rows", "10"], "--batch-rows"),
    (["--executor", "shed", "--order", "R:T,S"], "--order"),
    (["--executor", "shed", "--prefix", "10"], "--prefix"),
    (["--executor", "shed", "--timestamp", "ts"], "--timestamp"),
    (["--executor", "vector", "--engine", "spark"], "--engine"),
    (["--executor", "vector", "--batch-rows", "10"], "--batch-rows"),
    (["--executor", "vector", "--prefix", "10"], "--prefix"),
]


def _argv(w, argv: list[str]) -> list[str]:
    out = []
    for a in argv:
        out += (inputs(w) if a == "INPUTS" else [str(w / "stats.json")] if a == "STATS"
                else [a])
    return out


@pytest.mark.parametrize(("argv", "flag"), REFUSED, ids=[" ".join(a) for a, _ in REFUSED])
def test_an_option_without_effect_is_refused_naming_it(w, capsys, argv, flag):
    """Each of these printed the same report with and without ``flag``."""
    msg = one_error(capsys, *_argv(w, argv))
    assert msg.startswith(f"adaptcq: error: {flag}") and "no effect on" in msg, msg
    assert msg.split(": ", 3)[-1].strip(), msg  # and a reason


def test_several_options_without_effect_are_named_together(w, capsys):
    msg = one_error(capsys, *_argv(w, ["--executor", "eddy", "INPUTS", "--order", "R:T,S",
                                       "--stats", "STATS"]))
    assert "--stats" in msg and "--order" in msg and "have no effect" in msg


def test_stats_and_input_together_are_refused_by_the_split_too(w, capsys):
    """The split took the rates of --stats and ignored --input."""
    msg = one_error(capsys, *_argv(w, ["--engine", "spark", "--partitions", "4",
                                       "--stats", "STATS", "INPUTS"]))
    assert "not both" in msg


@pytest.mark.parametrize("argv", [
    ["--stats", "STATS", "--code", "--order", "R:T,S", "--mode", "retract",
     "--executor", "acaching", "--engine", "local", "--json"],
    ["INPUTS", "--prefix", "300", "--timestamp", "ts", "--caches", "prefix", "--code",
     "--nested-loop", "S", "--json"],
    ["--code", "--order", "R:T,S", "--nested-loop", "S", "--engine", "local"],
    ["--executor", "eddy", "INPUTS", "--routing", "lottery", "--prefix", "200", "--code",
     "--mode", "retract", "--timestamp", "ts", "--engine", "local", "--json"],
    ["--executor", "vector", "INPUTS", "--batch-rows", "50", "--prefix", "300",
     "--order", "R:T,S", "--mode", "retract", "--timestamp", "ts", "--json"],
    ["--executor", "vector", "--order", "R:T,S", "--engine", "local"],
    ["--executor", "shed", "--mode", "append", "--engine", "local"],
    ["--engine", "spark", "--partitions", "4", "--stats", "STATS", "--json"],
    ["--engine", "spark", "--partitions", "4", "INPUTS", "--timestamp", "ts", "--json"],
    ["--engine", "spark", "--shares", "S.b=2"],
])
def test_the_options_each_report_uses_are_accepted(w, capsys, argv):
    code, _, err = explain(capsys, *_argv(w, argv))
    assert code == 0, err


def test_every_option_has_its_place_in_the_table():
    """A new option must say which reports use it (``_uses``), or it would be refused or
    ignored by accident."""
    from adaptcq.explain import _OPTIONS
    p = argparse.ArgumentParser()
    add_arguments(p)
    dests = {a.dest for a in p._actions} - {"help", "sql", "json"}
    assert dests == set(_OPTIONS)


# ----- 4. the statistics' values ------------------------------------------------------------------
def _stats(**changes) -> dict:
    data = json.loads(json.dumps(GOOD))
    for key, value in changes.items():
        section, _, name = key.partition("__")
        if name:
            data.setdefault(section, {})[name.replace("_", ",")] = value
        else:
            data[section] = value
    return data


BAD = [
    (_stats(rates__R=True), "rates.R", "must be a number, got true"),
    (_stats(rates__R="2"), "rates.R", 'must be a number, got "2"'),
    (_stats(rates__R=None), "rates.R", "must be a number, got null"),
    (_stats(rates__R=[1]), "rates.R", "must be a number"),
    (_stats(rates__R=0), "rates.R", "must be > 0"),
    (_stats(rates__R=-3), "rates.R", "must be > 0"),
    (json.dumps(GOOD).replace('"R": 1', '"R": 1e999'), "rates.R", "must be finite, got inf"),
    (_stats(rates__R=10 ** 400), "rates.R", "must be finite"),
    (_stats(selectivities__R_S=True), "'R,S'", "must be a number, got true"),
    (_stats(selectivities__R_S="0.5"), "'R,S'", "must be a number"),
    (_stats(selectivities__R_S=0), "'R,S'", "must be in (0, 1]"),
    (_stats(selectivities__R_S=1.5), "'R,S'", "must be in (0, 1]"),
    (_stats(window=True), "'window'", "must be a number, got true"),
    (_stats(window="2"), "'window'", "must be a number"),
    (_stats(window=0), "'window'", "must be > 0"),
    (_stats(costs__join=-1), "costs.join", "must be >= 0"),
    (_stats(costs__insert=False), "costs.insert", "must be a number"),
    (_stats(rates={"R": 1e308, "S": 1e308, "T": 1e308}, window=1e308), "rates.R",
     "too large for the cost model"),
    (_stats(rates={"R": 1e200, "S": 1e200, "T": 1e200}, window=1e200), "rates.R",
     "too large for the cost model"),
    (_stats(rates={"R": 1e100, "S": 1, "T": 1e100}, window=1e100), "rates.", "too large"),
    (_stats(costs__join=1e300), "costs.join", "too large for the cost model"),
]


@pytest.mark.parametrize(("data", "key", "message"), BAD,
                         ids=[f"{k} {m}" for _, k, m in BAD])
def test_bad_statistics_values_are_refused_naming_the_key(tmp_path, capsys, data, key,
                                                         message):
    """``"R": true`` was rate 1, ``"R": "2"`` rate 2, and huge rates and windows a numpy
    RuntimeWarning and "DMJoin found no admissible order (internal error)"."""
    path = tmp_path / "s.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no RuntimeWarning on the way
        msg = one_error(capsys, "--stats", str(path))
    assert "statistics: " in msg and key in msg and message in msg, msg


@pytest.mark.parametrize(("rates", "message"), [
    ({"R": True, "S": 1, "T": 1}, "rates.R) must be a number, got true"),
    ({"R": "2", "S": 1, "T": 1}, "rates.R) must be a number"),
    ({"R": 1, "S": 1}, "no rate for stream T"),
    ({"R": 1, "S": 1, "T": 1, "X": 1}, "rates name stream 'X'"),
    ({"R": 1e300, "S": 1, "T": 1}, "rates.R) = 1e+300 is too large"),
])
def test_the_split_checks_the_rates_of_its_statistics_file(tmp_path, capsys, rates, message):
    """The split took any value (a boolean as rate 1) and a missing stream as rate 1."""
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"rates": rates}))
    msg = one_error(capsys, "--stats", str(path), "--engine", "spark", "--partitions", "4")
    assert message in msg, msg


def test_large_but_representable_statistics_still_explain(tmp_path, capsys):
    path = tmp_path / "s.json"
    path.write_text(json.dumps(_stats(rates={"R": 1e50, "S": 1e50, "T": 1e50}, window=1e50,
                                      selectivities={"R,S": 1, "S,T": 1})))
    code, out, err = explain(capsys, "--stats", str(path), "--json")
    assert code == 0, err
    report = json.loads(out)
    assert all(math.isfinite(a["cost"]) for a in report["algorithms"].values())
    assert math.isfinite(report["optimum"])


def _chain(n: int) -> str:
    names = [f"S{i}" for i in range(n)]
    return ("SELECT S0.a FROM " + ", ".join(names) + " WHERE "
            + " AND ".join(f"S{i}.b = S{i + 1}.a" for i in range(n - 1)))


@settings(max_examples=examples(60))
@given(n=st.integers(2, 7), star=st.booleans(), data=st.data())
def test_accepted_statistics_give_finite_costs(n, star, data):
    """Whatever the magnitudes, a statistics file is refused as too large or every plan
    cost is a finite float, with no overflow warning (DMJoin included)."""
    import numpy as np
    if star:
        sql = ("SELECT S0.a1 FROM " + ", ".join(f"S{i}" for i in range(n)) + " WHERE "
               + " AND ".join(f"S0.a{i} = S{i}.a" for i in range(1, n)))
    else:
        sql = _chain(n)
    query = parse_query(sql)
    magnitude = st.floats(-20, 308).map(lambda e: 10.0 ** e)
    stats = {"rates": {a: data.draw(magnitude) for a in query.aliases},
             "selectivities": {",".join(e): data.draw(st.sampled_from([1, 0.5, 1e-6]))
                               for e in query.join_edges()},
             "window": data.draw(magnitude),
             "costs": {"join": data.draw(st.sampled_from([0, 1, 1e100]))}}
    with warnings.catch_warnings(), np.errstate(all="raise"):
        warnings.simplefilter("error")
        try:
            graph = graph_from_json(query, stats)
        except AdaptcqError as e:
            assert "too large for the cost model" in str(e)
            return
        report = explain_graph(graph)
    for info in report["algorithms"].values():
        assert math.isfinite(info["cost"]) and all(
            math.isfinite(c) for c in info["pipeline_costs"].values())


def test_explain_reads_the_prefix_not_the_whole_input():
    """``--prefix`` bounds what explain holds in memory: the inputs are read up to the
    prefix (a chunk at a time), not to their end; the statistics are those of the prefix."""
    import numpy as np
    import pyarrow as pa

    from adaptcq.explain import measure

    chunks, pulled = 200, {"R": 0, "S": 0, "T": 0}

    def batches(name, seed):
        rng = np.random.default_rng(seed)
        for k in range(chunks):
            pulled[name] += 1
            yield pa.record_batch({"ts": np.arange(k * 100, (k + 1) * 100) / 100.0,
                                   "a": rng.integers(0, 20, 100)})

    sql = ("SELECT R.a FROM R [RANGE 1 SECONDS], S [RANGE 1 SECONDS], T [RANGE 1 SECONDS] "
           "WHERE R.a = S.a AND S.a = T.a")
    sources = {s: batches(s, i) for i, s in enumerate("RST")}
    *_, n = measure(sql, sources, "ts", 3_000)
    assert n == 3_000
    # 3,000 arrivals are about 10 chunks of each stream; the merger reads one ahead
    assert max(pulled.values()) <= 15, pulled
