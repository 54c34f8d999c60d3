"""The brute-force oracle: recompute the join of the windows' contents after every update.

Deliberately simple and independent of the engine: window contents are a plain list of the
live rows, membership is decided from the window definitions directly, and the join is a
nested loop over the live rows checking every equality. After each update the full join is
recomputed and the difference from the previous one is that update's output. A result is
identified by the arrivals it joins, not by its projected values: a NaN computed in the
SELECT list (``-R.f``) is a new object each time and equals nothing, so a diff on values
would take every old result for a new one.
"""

from __future__ import annotations

import math
from collections import Counter
from fractions import Fraction

from adaptcq.engine.continuous import row_key
from adaptcq.query.expr import compile_predicate, eval_namespace, to_python
from adaptcq.query.logical import LogicalQuery


class Oracle:
    def __init__(self, query: LogicalQuery, mode: str, time_unit: float = 1.0):
        self.q = query
        self.mode = mode
        self.time_unit = time_unit  # seconds per timestamp unit, as ContinuousQuery's
        self.sel = [compile_predicate(query.selections[a], query.columns[a], a, query.types)
                    if query.selections.get(a) is not None else (lambda row: True)
                    for a in query.aliases]
        src = ", ".join(to_python(o.expr, self._resolve, query.types) for o in query.outputs)
        # (the engine's namespace: Decimal('0.5') and Timestamp('...') literals)
        self.project = eval(f"lambda b: ({src},)", eval_namespace())
        # The equalities as (stream i, col pos, stream j, col pos).
        idx = {a: k for k, a in enumerate(query.aliases)}
        self.eqs = [(idx[x.stream], query.columns[x.stream].index(x.column),
                     idx[y.stream], query.columns[y.stream].index(y.column))
                    for x, y in query.equalities()]
        # The set join conditions (load-shedding.txt §3.2) as (i, pos, j, pos, test).
        self.sets = [(idx[p.left.stream], query.columns[p.left.stream].index(p.left.column),
                      idx[p.right.stream], query.columns[p.right.stream].index(p.right.column),
                      _set_condition(p)) for p in query.set_predicates]

    def _resolve(self, ref):
        return f"b[{self.q.aliases.index(ref.stream)}][{self.q.columns[ref.stream].index(ref.column)}]"

    # ----- the join ----------------------------------------------------------------------
    def join(self, live: list[tuple[int, int, tuple]]) -> dict:
        """The join of the live rows: {the arrival numbers of a result's rows: its rows}."""
        n = len(self.q.aliases)
        per = [[(j, row) for (s, j, row) in live if s == i] for i in range(n)]
        result: dict = {}
        bound: list = [None] * n
        ids: list = [None] * n

        def ok(i: int) -> bool:
            for a, pa_, b, pb in self.eqs:
                if (a == i and b < i) or (b == i and a < i):
                    va, vb = bound[a][pa_], bound[b][pb]
                    if va is None or vb is None or va != vb:
                        return False
            for a, pa_, b, pb, test in self.sets:
                if ((a == i and b < i) or (b == i and a < i)) and \
                        not test(bound[a][pa_], bound[b][pb]):
                    return False
            return True

        def rec(i: int):
            if i == n:
                result[tuple(ids)] = tuple(bound)
                return
            for j, row in per[i]:
                bound[i], ids[i] = row, j
                if ok(i):
                    rec(i + 1)
            bound[i] = None

        rec(0)
        return result

    # ----- the updates -------------------------------------------------------------------
    def run(self, streams, signs, timestamps, rows):
        """Return (events, outputs): events are (stream, sign, ts, row) in processing order,
        outputs[k] the Counter of (*values, sign, ts) emitted by event k. A stream of None
        is a time marker: time passes to its timestamp (due deletions happen), nothing
        arrives."""
        q = self.q
        live: list[tuple[int, int, tuple]] = []   # (stream, arrival number, row)
        arrived_ts: dict[int, float] = {}
        per_stream_arrivals: dict[int, list[int]] = {i: [] for i in range(len(q.aliases))}
        events, outputs = [], []
        current: dict = {}

        def step(stream, sign, ts, row, emit: bool):
            nonlocal current
            new = self.join(live)
            events.append((stream, sign, ts, row))
            out = Counter()
            if emit:
                for key in new.keys() - current.keys():
                    out[(*self.project(new[key]), 1, ts)] += 1
                if self.mode == "retract":
                    for key in current.keys() - new.keys():
                        out[(*self.project(current[key]), -1, ts)] += 1
            outputs.append(out)
            current = new

        for k, (i, ts, row) in enumerate(zip(streams, timestamps, rows)):
            sign = 1 if signs is None else signs[k]
            # Time-window deletions due before this arrival, in (t + w, arrival) order.
            due = []
            for s, j, r in live:
                w = q.streams[s].window
                if w.kind != "range":
                    continue
                # (exactly, from the query's digits: w.size is the nearest float)
                size = w.size if self.time_unit == 1.0 else round(
                    Fraction(w.seconds) / Fraction(str(self.time_unit)))
                if arrived_ts[j] + size < ts:
                    due.append((arrived_ts[j] + size, j, s, r))
            for exp_at, j, s, r in sorted(due, key=lambda d: (d[0], d[1])):
                live.remove((s, j, r))
                step(s, -1, exp_at, r, self.mode == "retract")
            if i is None:  # a time marker (an arrival of a stream the query does not read)
                continue
            if sign < 0:
                match = next((x for x in live if x[0] == i and _same_row(x[2], row)), None)
                if match is not None:
                    live.remove(match)
                    step(i, -1, ts, row, self.mode == "retract")
                continue
            arrived_ts[k] = ts
            w = q.streams[i].window
            per_stream_arrivals[i].append(k)
            if w.kind == "rows" and len(per_stream_arrivals[i]) > w.size:
                gone = per_stream_arrivals[i][-w.size - 1]
                old = next((x for x in live if x[1] == gone), None)
                if old is not None:
                    live.remove(old)
                    step(i, -1, ts, old[2], self.mode == "retract")
            if self.sel[i](row):
                live.append((i, k, row))
                step(i, 1, ts, row, True)
        return events, outputs


def _same_row(a, b) -> bool:
    """Whether a deletion's values are the row's (docs/semantics.md): equal values, lists
    and structs by value, and NaN equal to NaN (a deletion of a row holding NaN finds it)."""
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(map(_same_row, a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same_row(a[k], b[k]) for k in a)
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def _set_condition(p):
    """test(left value, right value) for a set join condition, written from its
    definition: lists are sets, maps weighted sets, NULL never joins. A NULL item equals
    nothing, so a set is its non-NULL items; a NULL weight's product is NULL, which the
    sum skips (docs/shedding.md)."""
    def cmp(x):
        return x > p.threshold if p.strict else x >= p.threshold

    def test(a, b):
        if a is None or b is None:
            return False
        if p.kind == "inner":
            wa, wb = dict(a), dict(b)
            return cmp(sum(wa[x] * wb[x] for x in wa if x is not None and x in wb
                           and wa[x] is not None and wb[x] is not None))
        sa = {x for x in a if x is not None}
        sb = {x for x in b if x is not None}
        return {"overlap": lambda: cmp(len(sa & sb)), "equal": lambda: sa == sb,
                "subset": lambda: sa.issubset(sb), "superset": lambda: sa.issuperset(sb)
                }[p.kind]()
    return test


def oracle_total(query: LogicalQuery, streams, ts, tup) -> Counter:
    """The oracle's whole append-mode output over the arrivals, as one multiset."""
    total: Counter = Counter()
    for c in Oracle(query, "append").run(streams, None, ts, tup)[1]:
        total.update(c)
    return total


def engine_outputs(trace, out):
    """Split an engine's output by update, using its trace: (events, Counters)."""
    events, outputs = [], []
    bounds = [t[4] for t in trace] + [len(out)]
    for k, (i, sign, ts, row, _) in enumerate(trace):
        events.append((i, sign, ts, row))
        outputs.append(Counter(out[bounds[k]:bounds[k + 1]]))
    return events, outputs


def interval_outputs(query: LogicalQuery, data, lo: int, hi: int, mode: str,
                     columns) -> Counter:
    """The oracle on ``query`` alone over the arrivals (lo, hi] of ``data`` ((source, ts,
    row) in arrival order; ``columns(source)`` names the row's columns): each source row is
    an arrival for each of its aliases, in alias order, and arrivals of sources the query
    does not read only advance time (docs/cacq.md, "What a query sees")."""
    streams, ts, rows = [], [], []
    for seq, (src, t, row) in enumerate(data, 1):
        if not lo < seq <= hi:
            continue
        mine = [i for i, s in enumerate(query.streams) if s.source == src]
        if not mine:
            streams.append(None)
            ts.append(t)
            rows.append(None)
        for i in mine:
            cols = columns(src)
            streams.append(i)
            ts.append(t)
            rows.append(tuple(row[cols.index(c)] for c in query.columns[query.streams[i].alias]))
    total: Counter = Counter()
    for c in Oracle(query, mode).run(streams, None, ts, rows)[1]:
        total.update(c)
    return total


def assert_equals_oracle(q: LogicalQuery, mode: str, streams, ts, rows, trace, out) -> None:
    """The engine's output (``trace``, ``out`` of a ``ContinuousQuery`` with ``trace=True``)
    equals the oracle's update by update, naming the first update that differs."""
    got = engine_outputs(trace, out)
    want = Oracle(q, mode).run(streams, None, ts, rows)
    assert got[0] == want[0]
    for k, (g, w) in enumerate(zip(got[1], want[1], strict=True)):
        assert nan_safe(g) == nan_safe(w), \
            f"update {k} {want[0][k]}: engine {dict(g)} != oracle {dict(w)}"


def nan_safe(rows: Counter) -> Counter:
    """``rows`` keyed so that every NaN is one value (``engine.continuous.row_key``): an
    output row holding a NaN the executor computed equals the oracle's."""
    out: Counter = Counter()
    for r, c in rows.items():
        out[row_key(r)] += c
    return out
