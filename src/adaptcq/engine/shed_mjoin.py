"""Selective processing inside n-way MJoin pipelines (beyond load-shedding.txt, which
covers two-way joins; issue 13 item 7).

Each stream X has an MJoin pipeline: an order of the other streams in which a new tuple of
X is joined with their windows (a-caching.txt §3.1; the default connected order of
``engine.rules``). Every step of it is a join operator that probes a window W_Y split into
basic windows, and load shedding acts per step:

* a fetched tuple is fully processed with probability r·γ (Algorithm 3, line 2): its whole
  plan runs against every basic window, and the matches per basic window of each step
  (X, Y) feed ô_{X,Y,j};
* otherwise each partial result compares with r·|W_Y| rows of W_Y at each step, the basic
  windows in the order s_{X,Y} that the time correlation (Algorithm 2) learnt for that
  step, the last one in part;
* r comes from rate adaptation (Algorithm 1 over all streams: β = Σα_i / (Σλ_i·T_r)).

Join direction (Algorithm 4) and utility-based shedding (Algorithm 5) are two-way
algorithms and are not generalized here. The windows, buffers, virtual clock, expiry and
conditions are the two-way join's (``engine.shed_join``); with ample capacity every tuple
is fully processed and the output equals the oracle's. Indexes: none, or ``hash`` (one per
equality condition and basic window).
"""

from __future__ import annotations

import bisect

from adaptcq.engine.rules import connected_order
from adaptcq.engine.shed_join import MIN_LOSS_HITS, ShedJoin, budget_slices
from adaptcq.errors import OptionError
from adaptcq.stats.shedding import BasicWindowMatches


class ShedMJoin(ShedJoin):
    """The load-shedding join of three or more streams, by MJoin pipelines."""

    def __init__(self, query, mode: str = "append", out: list | None = None, *,
                 state: bytes | None = None, **kw):
        super().__init__(query, mode, out, **kw)
        if self.type_of is not None:
            raise OptionError("utility-based shedding (--utility, Algorithm 5) is for "
                              "two-way joins")
        aliases, k = self.aliases, len(self.aliases)
        where = {a: i for i, a in enumerate(aliases)}
        # Per stream X: its pipeline, each step (Y, the conditions linking Y to the streams
        # bound before it, as (condition index, bound stream, test with the bound stream
        # probing)).
        self.steps: dict[int, list] = {}
        for x in range(k):
            bound, steps = {x}, []
            for alias in connected_order(query, aliases[x]):
                y = where[alias]
                links = [(ci, b, c.tests[b]) for ci, c in enumerate(self.conds)
                         for b in c.cols if b in bound and y in c.cols and b != y]
                steps.append((y, links))
                bound.add(y)
            self.steps[x] = steps
        self.matches = {(x, y): BasicWindowMatches(self.n[y])
                        for x in range(k) for y, _ in self.steps[x]}
        self.orders = {(x, y): list(range(self.n[y])) for (x, y) in self.matches}
        self.fractions = [1.0] * k
        if state is not None:  # (after the pipelines' own statistics are made)
            self._restore(state)

    def _choose_index(self, index: str) -> str:
        has_eq = any(c.pred is None for c in self.conds)
        if index == "auto":
            return "hash" if has_eq else "none"
        if index == "hash" and not has_eq:
            raise OptionError("--index hash needs an equi-join condition (R.a = S.b)")
        if index.startswith("inverted"):
            raise OptionError(f"--index {index} is for two-way set joins; an n-way "
                              "load-shedding join uses none or hash")
        return index

    # ----- one tuple through its pipeline ------------------------------------------------
    def _process(self, p: int, row: tuple, ts) -> None:
        vals = tuple(c.prepare(row[c.cols[p]]) if p in c.cols else None
                     for c in self.conds)
        self.processed[p] += 1
        self._insert(p, row, ts, vals, 0)
        for y, _ in self.steps[p]:
            self._expire(y, ts)
        adaptive = self.shed in ("partial", "selective")
        r = self.sample_r
        pi = r * self.gamma
        sampled = adaptive and self.rng.random() < pi
        full = sampled or r >= 1.0 or not adaptive
        if full:
            self.full[p] += 1
        comps = [None] * len(self.aliases)
        comps[p] = (row, vals)
        partials = [comps]
        for y, links in self.steps[p]:
            win = self.windows[y]
            out = []
            if full:
                hat = self.matches[(p, y)] if sampled else None
                for comps in partials:
                    for j, bw in enumerate(win):
                        if bw.ts:
                            found = self._step(y, links, comps, bw, 0, ts, out)
                            if hat is not None and found:
                                hat.update(j, found)
            else:
                size = sum(len(bw) for bw in win)
                order = self.orders[(p, y)]
                for comps in partials:  # r·|W_Y| rows per partial result (Algorithm 3)
                    for bw, lo in budget_slices(win, order, r * size):
                        self._step(y, links, comps, bw, lo, ts, out)
            partials = out
            if not partials:
                break
        emit, project = self._emit, self._project
        for comps in partials:
            project(tuple(c[0] for c in comps), ts, emit)
        self.results += len(partials)
        if full and (not adaptive or r >= 1.0):
            self.estimate[p].update(len(partials), 1.0)
        elif sampled:
            self.estimate[p].update(len(partials), pi)
        else:  # its full output is estimated from the sample
            self.estimate[p].skip()

    def _step(self, y: int, links: list, comps: list, bw, lo: int, ts, out: list) -> int:
        """Join one partial result with the rows of basic window ``bw`` of W_Y from
        position ``lo`` on; append the extended partial results to ``out``."""
        limit = ts - self.w[y]
        bts, brows, bvals = bw.ts, bw.rows, bw.vals
        cand = None
        if self.index == "hash":
            for ci, b, _ in links:
                if self.conds[ci].pred is None:
                    key = comps[b][1][ci]
                    self.work += 1
                    lst = bw.index.get(ci, {}).get(key) if key is not None else None
                    if not lst:
                        return 0
                    cand = lst[bisect.bisect_left(lst, lo):] if lo else lst
                    break
        if cand is None:
            cand = range(lo, len(bts))
        self.work += len(cand)
        found = 0
        for pos in cand:
            if bts[pos] < limit:
                continue
            v = bvals[pos]
            if all(test(comps[b][1][ci], v[ci]) for ci, b, test in links):
                new = list(comps)
                new[y] = (brows[pos], v)
                out.append(new)
                found += 1
        return found

    def _insert(self, p: int, row: tuple, ts, vals: tuple, z: int) -> None:
        bw, pos = self._append(p, row, ts, vals, z)
        if self.index == "hash":  # one hash index per equality condition of this stream
            for ci, c in enumerate(self.conds):
                if c.pred is None and p in c.cols and vals[ci] is not None:
                    bw.index.setdefault(ci, {}).setdefault(vals[ci], []).append(pos)
                    self.work += 1

    def loss(self) -> dict:
        """As the two-way join's, per pipeline: the sampled tuples' full results over
        π, scaled up for the probing stream's dropped arrivals and every other window's
        dropped rows; unmeasured when a pipeline's estimate rests on too few sampled
        tuples with results, or all arrivals of a stream it needs were dropped."""
        total = var = 0.0
        measured = True
        k = len(self.aliases)
        for p in range(k):
            if not all(self.arrivals):
                break  # a stream without arrivals: no result of any pipeline can exist
            if self.processed[p] == 0:
                measured = False
                continue
            scale = self.arrivals[p] / self.processed[p]
            for y in range(k):
                if y != p:
                    kept = 1.0 - self.drops[y] / self.arrivals[y]
                    if kept <= 0:
                        scale = 0.0
                        break
                    scale /= kept
            if scale == 0.0:
                measured = False  # all of a stream's rows dropped: nothing to scale up
                continue
            est = self.estimate[p]
            total += est.get() * scale
            var += (est.stderr() * scale) ** 2
            measured = measured and est.measured(MIN_LOSS_HITS)
        return self._loss_summary(total, var, measured)

    def describe(self) -> str:
        base = super().describe().replace("load-shedding join", "load-shedding MJoin", 1)
        pipes = "; ".join(f"Δ{self.aliases[x]}: " + " ⋈ ".join(self.aliases[y] for y, _ in s)
                          for x, s in self.steps.items())
        return f"{base}; pipelines {pipes}"
