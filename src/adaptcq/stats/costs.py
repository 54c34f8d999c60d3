"""Seconds per operation of each kind, measured on the compiled pipelines as they run
(issue 14, item 1; a-caching.txt §4.3: probe_cost and update_cost "derived from the cache
implementation", Appendix A: c_ij measured in seconds).

The policy counts, for every interval between two ticks, how many operations of each kind
the compiled pipelines did (``KINDS``: hash probes, bucket entries, window rows scanned,
cache probes, CacheUpdates, cache entries built, insertions, expiries) and measures the CPU
seconds the interval took. Over the ``W`` most recent intervals, the CPU of interval t is
modelled as ``cpu_t = Σ_k r_k · n_tk``; this module estimates the seconds per operation
``r_k``. Statistics only: it never reads a clock or an executor.

The estimator (:func:`fit_costs`, our choice, justified in docs/caching.md):

1. **One scale on a prior.** ``s = Σ cpu / Σ_t Σ_k prior_k n_tk`` (the ratio-of-sums form
   of the old single seconds-per-work-unit rate) gives ``r̄ = s · prior``: relative costs
   from the structure of the generated code (``PRIOR``), absolute ones from the run.
2. **Corrected where the data say something.** The columns (kinds) are scaled to unit
   root mean square, and the least-squares correction to ``r̄`` is shrunk towards 0 along
   each right singular vector by ``S²/(S² + λ)``, ``λ = σ²/τ²``: σ² the residual variance
   of the unshrunk fit, τ² the prior's own size (a ridge regression towards the prior
   whose strength the data set: empirical Bayes). Directions the intervals determine well
   follow the data; directions they do not (a kind never seen, kinds always in one
   proportion, as probes and insertions are in a steady stream) keep the prior's split;
   so does every direction whose singular value is below ``rcond`` (3%) of the largest:
   the counts themselves are estimates (probes and entries per tuple from W profiled
   tuples, a few percent off), so the intervals cannot tell kinds apart along a direction
   in which they differ by less than that (a steady stream after a cache is placed: cache
   probes, CacheUpdates, probes and insertions all in one proportion).
   With fewer intervals than kinds, only the n − 2 strongest directions are fitted (two
   intervals are left to measure σ by). Noise-free intervals give σ = 0, so with varied
   enough intervals every kind is determined and known costs are recovered exactly. A kind is reported as *measured*
   when its diagonal of the resolution matrix ``V diag(S²/(S²+λ)) Vᵀ`` is at least
   ``resolve`` (the data, not the prior, set 90% of it).
3. **Non-negative.** A kind estimated below 0 is fixed at 0 and the rest fitted again
   (an active set; at most one pass per kind).

Degenerate inputs fall back and say so (``CostFit.status``): fewer than ``min_intervals``
intervals gives step 1 alone; no work counted at all gives no estimate (``get`` is None).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

KINDS = ("probe", "entry", "scan_row", "cache_probe", "cache_update", "entry_build",
         "insert", "expiry", "observe")
"""Operation kinds, as the policy counts them per interval (``adapt.acaching``):

* ``probe``: a hash-index probe (one per tuple reaching a hash join operator);
* ``entry``: a bucket entry joined, or a cached segment tuple yielded or stored;
* ``scan_row``: a window row examined by a nested-loop (scan) or cartesian operator;
* ``cache_probe``: a CacheLookup (hit or miss);
* ``cache_update``: a tuple passing a CacheUpdate;
* ``entry_build``: a cache entry created after a miss;
* ``insert``, ``expiry``: an arrival, a tuple leaving its window (the update loop, the
  window clock, the SteM's work, the call into the pipeline, the output rows: what every
  plan pays alike);
* ``observe``: a probe key handed to a candidate's Bloom filter (App. A's observer)."""

PRIOR = {"probe": 1.0, "entry": 0.5, "scan_row": 0.25, "cache_probe": 2.0,
         "cache_update": 1.5, "entry_build": 2.0, "insert": 12.0, "expiry": 12.0,
         "observe": 4.0}
"""Relative costs before the intervals determine them, in hash probes: the Python
operations of each kind's generated code (``engine.codegen``), counted once from the
source and not fitted to any result. A hash probe is a method call and a bucket test
(``b = I.get(u)``, ``if b``, ``b.values()``); a bucket entry one loop step; a scanned row
one comparison in ``ScanIndex.get``; a cache probe computes its key, hashes it, takes a
modulo, indexes the table, compares twice and counts (about twice a probe); a CacheUpdate
the same without the count, and on a hit one dict store of two built tuples; an entry
built after a miss a dict, a slot store and a count; an observed key a Python call that
hashes it into a ``bytearray`` and counts.

An insertion or an expiry is everything an arrival costs besides its joins, counted the
same way (thirteenth session, after a measured mismatch, below; it was 3, the SteM's body
and the pipeline call alone):

* insertion, about 12: the update loop's steps (the arrival's stream, time and row, the
  window clock's test, the selection, count-window and trace tests, the counters: about
  20 simple steps, 5 probes), the window clock's push of a 4-tuple (a ``heappush``, 1.5;
  a deque's append where one window length is in force, 0.5), two
  Python calls (the pipeline, the SteM's ``insert``: 2 each) and the SteM's body (two
  dict stores, and per index a key, a ``get`` and a store: 2.5);
* expiry, about 12: the clock's test and ``heappop`` (a sift-down: 2.5; a deque's
  ``popleft`` with one window length, 1), the loop's steps
  (1.5), three Python calls (the executor's ``delete``, the SteM's, the delete pipeline:
  6) and the SteM's body (two pops, and per index a lookup, a delete and a test: 2).

The intervals seldom separate these from the probes (a steady stream does both in one
proportion), so the prior's split is what the fit keeps; at 3 it priced a probe at 2–3×
what it costs, and every cache's saved probes with it (docs/adaptive-ordering.md: a cache
predicted to save 5–9% of the CPU measured 0.96–1.10×)."""

MIN_INTERVALS = 4   # fewer: one scale on the prior (step 1 only)
RESOLVE = 0.9       # a kind is "measured" when the data set at least 90% of its estimate
RCOND = 0.03        # directions with a singular value below 3% of the largest keep the prior


@dataclass(frozen=True)
class CostFit:
    """Seconds per operation of each kind, and how they were obtained.

    ``determined``: the kinds the intervals determined (the rest keep the prior's split);
    ``scale``: seconds per prior unit (step 1); ``intervals``: how many were used;
    ``status``: one line saying which fallback, if any, applied."""

    seconds: Mapping[str, float]
    determined: tuple[str, ...]
    scale: float
    intervals: int
    status: str

    def __getitem__(self, kind: str) -> float:
        return self.seconds[kind]

    def cpu(self, counts: Mapping[str, float]) -> float:
        """The CPU seconds the fit predicts for ``counts`` operations per kind."""
        return math.fsum(self.seconds[k] * n for k, n in counts.items())


def fit_costs(rows: Sequence[Mapping[str, float]], cpu: Sequence[float],
              prior: Mapping[str, float] = PRIOR, *, resolve: float = RESOLVE,
              rcond: float = RCOND, min_intervals: int = MIN_INTERVALS) -> CostFit | None:
    """Seconds per operation of each kind of ``prior`` from intervals: ``rows[t]`` the
    operations of each kind counted in interval t (missing kinds count 0), ``cpu[t]`` its
    CPU seconds. See the module docstring for the three steps. None when no operation was
    counted or no CPU time passed (nothing to scale)."""
    if len(rows) != len(cpu):
        raise ValueError(f"{len(rows)} intervals of counts but {len(cpu)} CPU figures")
    kinds = tuple(prior)
    unknown = sorted({k for r in rows for k in r} - set(kinds))
    if unknown:
        raise ValueError(f"unknown operation kinds {unknown}; known: {list(kinds)}")
    if not rows:
        return None
    return _fit_matrix([[r.get(k, 0.0) for k in kinds] for r in rows], cpu, prior,
                       resolve, rcond, min_intervals)


def _fit_matrix(rows, cpu, prior: Mapping[str, float], resolve: float = RESOLVE,
                rcond: float = RCOND, min_intervals: int = MIN_INTERVALS) -> CostFit | None:
    """:func:`fit_costs` on rows already in the order of ``prior``'s kinds."""
    kinds = tuple(prior)
    if any(v < 0 for v in prior.values()):
        raise ValueError("prior costs cannot be negative")
    n = len(rows)
    X = np.array(rows, dtype=float)
    y = np.array(cpu, dtype=float)
    p = np.array([float(prior[k]) for k in kinds])
    weight = float((X @ p).sum())
    if weight <= 0 or y.sum() <= 0 or not np.isfinite(X).all() or not np.isfinite(y).all():
        return None
    scale = float(y.sum()) / weight
    base = scale * p
    if n < min_intervals:
        return _fit(kinds, base, (), scale, n,
                    f"{n} interval{'s' * (n != 1)} (< {min_intervals}): one scale on the prior")
    r = base.copy()
    free = [j for j in range(len(kinds)) if X[:, j].any()]
    determined: list[int] = []
    lam = 0.0
    for _ in range(len(kinds) + 1):
        fixed = [j for j in range(len(kinds)) if j not in free]
        resid = y - X[:, fixed] @ r[fixed] - X[:, free] @ base[free]
        Xf = X[:, free]
        norms = np.sqrt((Xf * Xf).sum(axis=0) / n)
        Z = Xf / norms
        # Z's SVD through its Gram matrix (K × K, K ≤ 9: cheaper than an SVD of n × K)
        S2, V = np.linalg.eigh(Z.T @ Z)
        keep = S2 > (rcond * rcond) * S2[-1]
        # the strongest directions first, as many as leave 2 intervals to measure the
        # noise by (a few intervals still set the direction in which they vary most)
        top = np.flatnonzero(keep)[::-1][:max(0, n - 2)]
        S2, V = S2[top], V[:, top]
        rank = len(S2)
        proj = (V.T @ (Z.T @ resid)) / np.sqrt(S2)   # Uᵀ·resid per direction
        dof = n - rank
        if dof < 2 or rank == 0:  # no estimate of the noise: the prior throughout
            lam = math.inf
            shrink = np.zeros(rank)
        else:
            sigma2 = float(resid @ resid - proj @ proj) / dof
            tau2 = float(((base[free] * norms) ** 2).mean())  # the prior's own size
            lam = max(0.0, sigma2) / tau2 if tau2 > 0 else math.inf
            shrink = S2 / (S2 + lam)
        step = V @ (shrink * proj / np.sqrt(S2)) if rank else np.zeros(len(free))
        r[free] = base[free] + step / norms
        resolution = (V ** 2) @ shrink if rank else np.zeros(len(free))
        determined = [free[i] for i in range(len(free)) if resolution[i] >= resolve]
        neg = [j for j in free if r[j] < 0]
        if not neg:
            break
        for j in neg:  # the active set: fixed at 0, the others fitted again
            free.remove(j)
            r[j] = 0.0
        if not free:
            break
    det = tuple(kinds[j] for j in determined)
    unseen = [k for j, k in enumerate(kinds) if not X[:, j].any()]
    rest = [k for k in kinds if k not in det and k not in unseen]
    parts = [f"{len(det)} of {len(kinds)} kinds measured over {n} intervals"]
    if unseen:
        parts.append("not seen, prior: " + ", ".join(unseen))
    if rest:
        parts.append("collinear, prior's split: " + ", ".join(rest))
    return _fit(kinds, r, det, scale, n, "; ".join(parts))


def _fit(kinds, r, det, scale, n, status) -> CostFit:
    return CostFit({k: float(max(0.0, v)) for k, v in zip(kinds, r)}, tuple(det), scale, n,
                   status)


class OperationCosts:
    """The online estimator of the stats layer (``update``/``get``, as
    ``stats.estimators``): seconds per operation of each kind over the ``W`` most recent
    intervals (:func:`fit_costs`). ``get`` fits lazily, and again only once ``every`` new
    intervals have come (a fit costs a few hundred microseconds of numpy calls, about
    what 100 arrivals do)."""

    __slots__ = ("W", "_cpu", "_fit", "_fitted", "_rows", "_scale_only", "every", "n", "prior")

    def __init__(self, W: int = 40, prior: Mapping[str, float] = PRIOR, every: int = 1):
        if W < 1 or every < 1:
            raise ValueError("W and every must be at least 1")
        self.W, self.every = W, every
        self.prior = dict(prior)
        self._rows: deque[list[float]] = deque(maxlen=W)
        self._cpu: deque[float] = deque(maxlen=W)
        self._fit: CostFit | None = None
        self._fitted = 0  # n at the last fit
        self.n = 0  # intervals ever seen
        # intervals good for the scale only (``update(..., steady=False)``)
        self._scale_only: deque[tuple[list[float], float]] = deque(maxlen=W)

    def update(self, counts: Mapping[str, float], cpu: float,
               steady: bool = True) -> OperationCosts:
        """One interval: operations per kind and its CPU seconds (negative or non-finite
        figures are refused: a count or a CPU time cannot be). ``steady=False``: counts
        known to be biased in their mix (windows filling), used only for step 1's scale
        while no steady interval has come."""
        if not (math.isfinite(cpu) and cpu >= 0) or any(
                not math.isfinite(v) or v < 0 for v in counts.values()):
            raise ValueError(f"an interval needs finite non-negative figures, got "
                             f"{dict(counts)} and {cpu}")
        unknown = sorted(set(counts) - set(self.prior))
        if unknown:
            raise ValueError(f"unknown operation kinds {unknown}; known: {list(self.prior)}")
        row = [counts.get(k, 0.0) for k in self.prior]
        if not steady:
            self._scale_only.append((row, float(cpu)))
            if not self._rows:
                self._fit = None  # (the scale follows until a steady interval comes)
            return self
        self._rows.append(row)
        self._cpu.append(float(cpu))
        self.n += 1
        return self

    def get(self, fresh: bool = False) -> CostFit | None:
        """The fit over the W most recent intervals, refitted once ``every`` new ones
        have come (``fresh``: whenever one has)."""
        if not self._rows:
            if self._fit is None and self._scale_only:
                self._fit = self._scale_fit()
            return self._fit
        if self._fit is None or self._fitted == 0 or self.n - self._fitted >= (
                1 if fresh else self.every):
            self._fit = _fit_matrix(list(self._rows), list(self._cpu), self.prior)
            self._fitted = self.n
        return self._fit

    def _scale_fit(self) -> CostFit | None:
        """Step 1 alone over the unsteady intervals (pure Python: it runs at every tick
        while windows fill)."""
        weight = math.fsum(p * x for row, _ in self._scale_only for p, x in
                           zip(self.prior.values(), row))
        cpu = math.fsum(c for _, c in self._scale_only)
        if weight <= 0 or cpu <= 0:
            return None
        scale = cpu / weight
        return CostFit({k: scale * p for k, p in self.prior.items()}, (), scale, 0,
                       f"no steady interval yet ({len(self._scale_only)} while windows "
                       "fill): one scale on the prior")

    @property
    def stale(self) -> bool:
        """Whether ``get`` would fit again (the policy's cached costs follow it)."""
        if not self._rows:
            return self._fit is None and bool(self._scale_only)
        return self._fit is None or self._fitted == 0 or self.n - self._fitted >= self.every

    @property
    def ready(self) -> bool:
        return len(self._rows) >= MIN_INTERVALS
