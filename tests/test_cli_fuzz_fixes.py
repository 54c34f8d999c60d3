"""A tester's findings on the command line (cli, explain, cliargs):

1. query text, names and paths were printed through rich markup: ``[range 2 seconds]`` was
   eaten as a tag, a ``[/]`` raised MarkupError, ``lo[red]x/o.csv`` was reported as
   ``lox/o.csv`` (and ``:cat:`` became an emoji);
2. the finished output was deleted when the "wrote N result rows" message failed;
3. ``explain --input`` took λ (and σ) from the last ~5% of the prefix it said it measured;
4. a key given twice in a --stats file was resolved silently to the last value;
5. empty items of --order (``R:S,,T``) were dropped;
6. --summary-json left out the summary's cache changes (``cache_history``);
7. ``python -m adaptcq``, ``adaptcq --version``, and ``adaptcq bench`` with no name.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adaptcq.cli import _summary_doc, main, summary_table
from adaptcq.cliargs import parse_orders
from adaptcq.errors import AdaptcqError
from adaptcq.explain import load_stats
from conftest import examples

WINDOWS = "R [range 2 seconds], S [RANGE 2 SECONDS], T [RANGE 2 SECONDS]"
JOIN = "R.k0 = S.k0 AND S.k1 = T.k1"
STATS = {"rates": {"R": 1, "S": 3, "T": 1}, "selectivities": {"R,S": 0.2, "S,T": 0.2}}


def _write_inputs(folder: Path, rows: int = 5) -> list[str]:
    """R(ts, id, k0, name), S(ts, id, k0, k1), T(ts, id, k1): every row joins."""
    for s, cols in (("R", ["k0", "name"]), ("S", ["k0", "k1"]), ("T", ["k1"])):
        with open(folder / f"{s}.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["ts", "id", *cols])
            for i in range(rows):
                w.writerow([i, i, *["x" if c == "name" else 1 for c in cols]])
    return [a for s in "RST" for a in ("--input", f"{s}={folder / f'{s}.csv'}")]


def _flat(text: str) -> str:
    return " ".join(text.split())  # (rich wraps long lines at spaces)


# ----- 1. user text is never read as rich markup ---------------------------------------------
@settings(max_examples=examples(40))
@given(st.text(alphabet="[]/:abcdeRr ~\\#@", min_size=1, max_size=14))
def test_explain_prints_query_text_verbatim(tmp_path_factory, literal):
    folder = tmp_path_factory.mktemp("q")
    (folder / "g.json").write_text(json.dumps(STATS))
    sql = f"SELECT R.id AS r FROM {WINDOWS} WHERE {JOIN} AND R.name <> '{literal}'"
    out = subprocess_free_explain(["--sql", sql, "--stats", str(folder / "g.json")])
    assert f"query: {_flat(sql)}" in _flat(out)


def subprocess_free_explain(argv: list[str]) -> str:
    import contextlib
    import io
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["explain", *argv]) == 0
    return buf.getvalue()


def test_explain_names_a_stats_path_with_markup_in_it(tmp_path):
    folder = tmp_path / "br[/]x :cat: [red]y"
    folder.mkdir(parents=True)
    (folder / "g.json").write_text(json.dumps(STATS))
    out = subprocess_free_explain(["--sql", f"SELECT R.id AS r FROM {WINDOWS} WHERE {JOIN}",
                                   "--stats", str(folder / "g.json")])
    assert f"statistics: given ({folder / 'g.json'})" in _flat(out)


@pytest.mark.parametrize("sub", ["br[/]x", "lo[red]x", "e:cat:x"])
def test_run_output_path_with_markup_is_written_and_named(tmp_path, capsys, sub):
    inputs = _write_inputs(tmp_path)
    out = tmp_path / sub / "o.csv"
    out.parent.mkdir(parents=True)
    sql = f"SELECT R.id AS r FROM {WINDOWS} WHERE {JOIN} AND R.name <> '[/]'"
    assert main(["run", "--sql", sql, *inputs, "--executor", "mjoin", "--output", str(out),
                 "--rejected", str(out.parent / "rej.csv"), "--no-progress"]) == 0
    text = _flat(capsys.readouterr().out)
    assert f"query: {_flat(sql)}" in text
    assert f"wrote 65 result rows to {out}" in text
    assert f"wrote 0 rejected rows to {out.parent / 'rej.csv'}" in text
    assert len(out.read_text().splitlines()) == 66  # the header and the 65 results


def _render(renderable) -> str:
    from rich.console import Console
    console = Console(width=300, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(renderable)
    return console.export_text()


def test_summary_table_prints_names_and_messages_as_they_are():
    stats = {"executor": "acaching", "mode": "append", "arrivals": 10, "updates": 10,
             "filtered": 0, "results": 3, "cpu_seconds": 0.1, "throughput": 100.0,
             "peak_state_tuples": 4, "peak_state_bytes": 40, "rejected": 0,
             "rows_read": {"r": 5, "s": 5}, "rows_processed": {"r": 5, "s": 5},
             "stopped": "failed: --output 'a[/]b[red]c' is full",
             "caches_used": ["C[t: r⋈s | key s.b] :cat:"],
             "cache_history": [{"arrival": 7, "ts": 1.0, "event": "use",
                                "what": "C[t: r⋈s | key s.b]"}]}
    text = _render(summary_table(SimpleNamespace(stats=stats, plan="ΔR r: s [bold]⋈[/] t")))
    for shown in ("failed: --output 'a[/]b[red]c' is full", "C[t: r⋈s | key s.b] :cat:",
                  "at arrival 7: use C[t: r⋈s | key s.b]", "ΔR r: s [bold]⋈[/] t"):
        assert shown in text


# ----- 2. a finished output is never removed by a message ------------------------------------
def _failing_message(monkeypatch, start: str) -> None:
    """Make the console fail on the message starting with ``start`` (as a full disk or a
    closed terminal would)."""
    from rich.console import Console
    real = Console.print

    def print_(self, *objects, **kwargs):
        if objects and str(objects[0]).startswith(start):
            raise OSError(5, "Input/output error (simulated)")
        return real(self, *objects, **kwargs)
    monkeypatch.setattr(Console, "print", print_)


@pytest.mark.parametrize("message", ["wrote 65 result rows", "wrote 0 rejected rows"])
def test_run_keeps_complete_outputs_when_a_final_message_fails(tmp_path, monkeypatch,
                                                               message):
    inputs = _write_inputs(tmp_path)
    out, rej = tmp_path / "o.csv", tmp_path / "rej.csv"
    _failing_message(monkeypatch, message)
    with pytest.raises(OSError, match="simulated"):
        main(["run", "--sql", f"SELECT R.id AS r FROM {WINDOWS} WHERE {JOIN}", *inputs,
              "--executor", "mjoin", "--output", str(out), "--rejected", str(rej),
              "--no-progress"])
    assert len(out.read_text().splitlines()) == 66
    assert rej.read_text().splitlines()[0].startswith('"stream"')


@pytest.mark.parametrize("message", ["wrote 0 rejected rows", "query q1:"])
def test_query_set_keeps_complete_outputs_when_a_final_message_fails(tmp_path, monkeypatch,
                                                                     message):
    inputs = _write_inputs(tmp_path)
    _failing_message(monkeypatch, message)
    with pytest.raises(OSError, match="simulated"):
        main(["run", "--executor", "eddy", "--sql",
              f"SELECT R.id AS r FROM {WINDOWS} WHERE {JOIN}", *inputs,
              "--output", str(tmp_path / "out"), "--rejected", str(tmp_path / "rej.csv")])
    import pyarrow.parquet as pq
    assert pq.read_table(tmp_path / "out" / "query_id=q1" / "part-0.parquet").num_rows == 65
    assert (tmp_path / "rej.csv").read_text().startswith('"stream"')


# ----- 3. explain --input measures over the whole prefix ---------------------------------------
def _explain_json(tmp_path, inputs, sql) -> dict:
    import contextlib
    import io
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["explain", "--sql", sql, *inputs, "--json"]) == 0
    return json.loads(buf.getvalue())


@settings(max_examples=examples(12))
@given(st.lists(st.tuples(st.integers(2, 60), st.integers(1, 40)), min_size=3, max_size=3))
def test_explain_rates_cover_the_whole_prefix(tmp_path_factory, spec):
    """λ of every stream is its rows over the prefix's event-time span, whichever stream
    ends first (the Profiler's last-W-ticks rate gave a stream that had ended 1e-09)."""
    folder = tmp_path_factory.mktemp("rates")
    times = {}
    for s, cols, (n, gap) in zip("RST", (["k0"], ["k0", "k1"], ["k1"]), spec, strict=True):
        times[s] = [i * gap / 10 for i in range(n)]
        with open(folder / f"{s}.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["ts", "id", *cols])
            for i, t in enumerate(times[s]):
                w.writerow([t, i, *[i % 3 for _ in cols]])
    span = max(max(t) for t in times.values()) - min(min(t) for t in times.values())
    inputs = [a for s in "RST" for a in ("--input", f"{s}={folder / f'{s}.csv'}")]
    report = _explain_json(folder, inputs, f"SELECT R.k0 FROM {WINDOWS} WHERE {JOIN}")
    for s in "RST":
        assert report["rates"][s] == pytest.approx(len(times[s]) / span, rel=1e-9)
    total = sum(len(t) for t in times.values())
    assert report["statistics"].startswith(f"measured over the first {total:,} input rows "
                                           f"(event time 0 to {span:g} s;")


def test_explain_selectivity_covers_the_whole_prefix(tmp_path):
    """R ⋈ S matches on every key for 90% of the prefix and never in its last 10%: the
    selectivity is the prefix's (large), not its tail's (none: floored near 0)."""
    rows = {"R": [], "S": [], "T": []}
    for i in range(400):
        key = 1 if i < 360 else 1000 + i  # the tail's keys never match
        rows["R"].append((i / 10, i, key))
        rows["S"].append((i / 10 + 0.05, i, key if i < 360 else 5000 + i, 1))
        rows["T"].append((i / 10 + 0.07, i, 1))
    cols = {"R": ["k0"], "S": ["k0", "k1"], "T": ["k1"]}
    for s, rs in rows.items():
        with open(tmp_path / f"{s}.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["ts", "id", *cols[s]])
            w.writerows(rs)
    inputs = [a for s in "RST" for a in ("--input", f"{s}={tmp_path / f'{s}.csv'}")]
    report = _explain_json(tmp_path, inputs, "SELECT R.k0 FROM R [RANGE 2 SECONDS], "
                           f"S [RANGE 2 SECONDS], T [RANGE 2 SECONDS] WHERE {JOIN}")
    sigma = {tuple(e["streams"]): e["sigma"] for e in report["edges"]}
    assert sigma[("R", "S")] > 0.5


# ----- 4. a key given twice in a --stats file ---------------------------------------------------
@pytest.mark.parametrize("text, named", [
    ('{"rates":{"R":1,"S":1,"T":1},"selectivities":{"R,S":0.1,"R,S":0.9,"S,T":0.1}}',
     'in selectivities: "R,S" is given twice (0.1, then 0.9)'),
    ('{"rates":{"R":1,"S":1,"T":1,"R":50},"selectivities":{"R,S":0.1,"S,T":0.1}}',
     'in rates: "R" is given twice (1, then 50)'),
    ('{"rates":{"R":1,"S":1,"T":1},"selectivities":{"R,S":0.1,"S,T":0.1},"window":2,'
     + '"window":3}', '"window" is given twice (2, then 3)'),
    ('{"rates":{"R":1,"S":1,"T":1},"selectivities":{"R,S":0.1,"S,T":0.1},'
     + '"costs":{"join":1,"join":1,"join":2}}',
     'in costs: "join" is given 3 times (1, then 1, then 2)'),
])
def test_stats_key_given_twice_is_refused(tmp_path, capsys, text, named):
    (tmp_path / "s.json").write_text(text)
    assert main(["explain", "--sql", f"SELECT R.id AS r FROM {WINDOWS} WHERE {JOIN}",
                 "--stats", str(tmp_path / "s.json")]) == 1
    err = capsys.readouterr().err
    assert named in err and str(tmp_path / "s.json") in err


@settings(max_examples=examples(60))
@given(st.dictionaries(st.text(min_size=1, max_size=4), st.integers(0, 9), min_size=1,
                       max_size=5), st.data())
def test_load_stats_refuses_exactly_the_repeated_keys(tmp_path_factory, pairs, data):
    keys = list(pairs)
    repeat = data.draw(st.sampled_from([None, *keys]))
    items = [(k, v) for k, v in pairs.items()] + ([(repeat, -1)] if repeat is not None else [])
    text = "{\"rates\": {" + ", ".join(f"{json.dumps(k)}: {v}" for k, v in items) + "}}"
    path = tmp_path_factory.mktemp("s") / "s.json"
    path.write_text(text)
    if repeat is None:
        assert load_stats(str(path)) == {"rates": pairs}
    else:
        with pytest.raises(AdaptcqError) as e:
            load_stats(str(path))
        assert f"in rates: {json.dumps(repeat)} is given twice ({pairs[repeat]}, then -1)" \
            in str(e.value)


# ----- 5. --order items -----------------------------------------------------------------------
@settings(max_examples=examples(100))
@given(st.lists(st.sampled_from(["S", "T", "U", " V ", ""]), min_size=1, max_size=5))
def test_parse_orders_refuses_empty_items_by_position(names):
    item = "R:" + ",".join(names)
    empty = [k for k, s in enumerate(names, 1) if not s.strip()]
    if item == "R:":  # (nothing after the colon: the format message)
        with pytest.raises(AdaptcqError, match="expected STREAM:S2,S3"):
            parse_orders([item])
    elif len(empty) == len(names):  # the empty order: the engine names what it needs
        assert parse_orders([item]) == {"R": []}
    elif empty:
        with pytest.raises(AdaptcqError) as e:
            parse_orders([item])
        where = ", ".join(map(str, empty))
        assert f"{where} of the list after 'R:' " in str(e.value)
        assert repr(item) in str(e.value)
    else:
        assert parse_orders([item]) == {"R": [s.strip() for s in names]}


@pytest.mark.parametrize("order", ["R:S,,T", "R:S,T,", "R:,S,T"])
@pytest.mark.parametrize("command", ["run", "explain"])
def test_order_with_an_empty_item_is_refused(tmp_path, capsys, order, command):
    sql = f"SELECT R.id AS r FROM {WINDOWS} WHERE {JOIN}"
    argv = (["run", "--sql", sql, *_write_inputs(tmp_path), "--executor", "mjoin",
             "--no-progress"] if command == "run" else ["explain", "--sql", sql, "--code"])
    assert main([*argv, "--order", order]) == 1
    assert f"--order {order!r}: item" in capsys.readouterr().err


# ----- 6. --summary-json carries the cache changes -------------------------------------------
def test_summary_json_holds_the_cache_history(tmp_path, capsys):
    from adaptcq.stream.workloads import three_way, write_workload
    write_workload(three_way(n_updates=8000, r=5, window=0.5, seed=4), tmp_path)
    args = ["run", "--sql", f"@{tmp_path}/query.sql", "--executor", "acaching", "--mode",
            "retract", "--nested-loop", "S.b", "--reopt-interval", "4000",
            "--no-cache-verify", "--no-progress", "--output", f"{tmp_path}/out.parquet",
            "--summary-json", f"{tmp_path}/s.json"]
    for s in "RST":
        args += ["--input", f"{s}={tmp_path}/{s}.parquet"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    doc = json.loads((tmp_path / "s.json").read_text())
    changes = [h for h in doc["cache_history"] if h["event"] in ("use", "drop", "shrink",
                                                                  "grow")]
    assert changes and doc["cache_changes"] == len(changes)
    for h in changes[-8:]:  # the printed "cache changes over time"
        assert _flat(f"at arrival {h['arrival']:,}: {h['event']} {h['what']}") in \
            _flat(printed.replace("│", " "))
    assert set(doc["cache_history"][0]) == {"arrival", "ts", "event", "what"}


def test_summary_doc_keeps_the_cache_history_whole():
    history = [{"arrival": k, "ts": k / 10, "event": "use" if k % 2 else "select",
                "what": f"C{k}"} for k in range(20)]
    run = SimpleNamespace(stats={"executor": "acaching", "mode": "append",
                                 "cache_history": history}, plan="p", rss_samples=[])
    doc = _summary_doc(run)
    assert doc["cache_history"] == history and doc["plan"] == "p"


# ----- 7. entry points ------------------------------------------------------------------------
def test_python_m_adaptcq_is_the_command():
    p = subprocess.run([sys.executable, "-m", "adaptcq", "--help"], capture_output=True,
                       text=True, check=False)
    assert p.returncode == 0 and p.stdout.startswith("usage: adaptcq")
    p = subprocess.run([sys.executable, "-m", "adaptcq", "run", "--order", "R:S,,T",
                        "--sql", "x"], capture_output=True, text=True, check=False)
    assert p.returncode == 1 and "--order 'R:S,,T': item 2" in p.stderr


def test_version_is_the_installed_distributions(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"adaptcq {version('adaptcq')}"


def test_bench_without_a_name_asks_for_the_name_only(capsys):
    with pytest.raises(SystemExit) as e:
        main(["bench"])
    assert e.value.code == 1
    err = capsys.readouterr().err
    assert "the following arguments are required: name (" in err and "args" not in err


def test_explain_state_sizes_are_those_at_the_end_of_the_prefix(tmp_path):
    """λ·W is each stream's state at the end of the prefix: a ROWS window's n, an unbounded
    stream's every row (an average over the prefix counted the windows while they filled:
    half the unbounded stream's)."""
    cols = {"R": ["a"], "S": ["a", "b"], "T": ["b"]}
    for s, cs in cols.items():
        with open(tmp_path / f"{s}.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["ts", "id", *cs])
            for i in range(900):
                w.writerow([i / 10 + "RST".index(s) / 100, i, *[i % 7 for _ in cs]])
    inputs = [a for s in "RST" for a in ("--input", f"{s}={tmp_path / f'{s}.csv'}")]
    report = _explain_json(tmp_path, inputs, "SELECT R.id FROM R [ROWS 100], S [ROWS 10], T "
                           "WHERE R.a = S.a AND S.b = T.b")
    state = {s: report["rates"][s] * report["window"] for s in "RST"}
    assert state == pytest.approx({"R": 100, "S": 10, "T": 900}, rel=1e-9)
    assert "the state sizes are those at its end" in report["statistics"]
