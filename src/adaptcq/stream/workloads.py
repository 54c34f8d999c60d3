"""Synthetic workload generators of the A-Caching experiments (a-caching.txt §7).

a-caching.txt §7.1 runs two equijoin queries over sliding windows on append-only streams
produced by "a synthetic data generator [...] with specified data characteristics and
relative arrival rates"; stream arrival rates are uniform by default and tuples are 32 bytes
(here: an ``id`` plus the join attributes). This module is that generator:

* :func:`three_way` — §7.2's default ``R(A) ⋈_A S(A,B) ⋈_B T(B)``;
* :func:`nway` — §7.3's ``R1(A) ⋈_A ... ⋈_A Rn(A)`` with given relative rates and pairwise
  join selectivities;
* :func:`table2_point` — the eight sample points D1..D8 of §7.3's Table 2;
* :class:`Burst` — a rate burst on one stream (§7.4: ΔR at 20 times its rate from the
  100,000th ΔS tuple on);
* :func:`default_workload` — what ``adaptcq run`` runs with no arguments.

Every generator returns a :class:`Workload`: the CQL query, one :class:`pyarrow.Table` per
stream (float64 ``ts`` in seconds, non-decreasing; int64 ``id`` = row number in the stream;
int64 join attributes ``a``/``b``) and ``params`` recording everything that produced it
(JSON-serialisable, so :func:`write_workload` / :func:`read_workload` round-trip it).
Generation is vectorised numpy and deterministic for a seed (``numpy.random.default_rng``).

Arrival model. Stream i with absolute rate λ_i (tuples/second) has its k-th tuple (k = 0, 1,
...) at the time t at which its *virtual clock* ``V_i(t) = ∫_0^t m_i(s) ds`` reaches k/λ_i,
where ``m_i`` is the product of the factors of the bursts on i covering time s (1 outside
bursts). Without bursts that is the uniform ``t = k/λ_i``; inside a ×f burst the gaps are f
times shorter. ``n_updates`` is the total number of arrivals over all streams: the run ends
at the time T where ``Σ_i λ_i V_i(T) = n_updates`` and the per-stream counts are those
expected counts rounded (largest remainder) to sum to exactly ``n_updates``.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from adaptcq.errors import AdaptcqError

__all__ = [
    "TABLE2",
    "WORKLOADS",
    "Burst",
    "Workload",
    "WorkloadError",
    "default_workload",
    "nway",
    "read_workload",
    "table2_point",
    "three_way",
    "write_workload",
]

TIMESTAMP = "ts"

# a-caching.txt §7.3, Table 2, transcribed: relative arrival rates of R, S, T, U (relative
# to T) and pairwise join selectivities R⋈S, R⋈T, R⋈U, S⋈T, S⋈U, T⋈U.
_TABLE2_PAIRS = (("R", "S"), ("R", "T"), ("R", "U"), ("S", "T"), ("S", "U"), ("T", "U"))
_TABLE2_ROWS = {
    "D1": ((10, 1, 1, 1), (0.004, 0.005, 0.005, 0.007, 0.0045, 0.005)),
    "D2": ((8, 1, 1, 8), (0.004, 0.005, 0.005, 0.007, 0.0045, 0.005)),
    "D3": ((10, 15, 1, 5), (0.003, 0.005, 0.007, 0.0045, 0.006, 0.008)),
    "D4": ((1, 1, 1, 1), (0.003, 0.004, 0.0067, 0.002, 0.0023, 0.0027)),
    "D5": ((4, 1, 1, 4), (0.005, 0.007, 0.005, 0.006, 0.005, 0.002)),
    "D6": ((1, 1, 1, 1), (0.005, 0.0033, 0.0025, 0.0067, 0.005, 0.0075)),
    "D7": ((1, 1, 1, 1), (0.0, 0.0, 0.0, 0.0, 0.0, 0.0)),
    "D8": ((1, 1, 1, 1), (0.001, 0.001, 0.001, 0.001, 0.001, 0.001)),
}
TABLE2: dict[str, dict[str, Any]] = {
    point: {
        "rates": dict(zip("RSTU", (float(x) for x in rates), strict=True)),
        "selectivities": {
            frozenset(pair): sel for pair, sel in zip(_TABLE2_PAIRS, sels, strict=True)
        },
    }
    for point, (rates, sels) in _TABLE2_ROWS.items()
}
"""Table 2 of a-caching.txt §7.3: point -> {"rates": {stream: rate relative to T},
"selectivities": {frozenset({x, y}): σ}} for streams R, S, T, U."""


class WorkloadError(AdaptcqError, ValueError):
    """A workload generator was given parameters it cannot honour (names the parameter)."""


# ---------------------------------------------------------------------------------------------
# Data model
# ---------------------------------------------------------------------------------------------


@dataclass
class Workload:
    """A generated workload: the continuous query and the streams it runs over.

    ``tables`` maps each source stream name to a table with a float64 ``ts`` column (event
    time, seconds, non-decreasing), an int64 ``id`` (row number in that stream) and int64
    join-attribute columns (``a``, ``b``). ``params`` holds everything that generated it
    (JSON-serialisable).
    """

    name: str
    sql: str
    tables: dict[str, pa.Table]
    timestamp: str = TIMESTAMP
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def n_updates(self) -> int:
        """Total number of arrivals over all streams."""
        return sum(t.num_rows for t in self.tables.values())


@dataclass(frozen=True)
class Burst:
    """A rate burst: stream ``stream`` arrives ``factor`` times faster in ``[start, end)``.

    ``start``/``end`` are event times in seconds (``end=None``: to the end of the run). The
    burst shortens that stream's inter-arrival gaps inside the interval (more tuples per
    second there); it does not move the rest of the stream's schedule relative to the
    interval's length. ``factor < 1`` is a lull.

    The start can instead be given as an arrival count of some stream, resolved to a time
    during generation: ``Burst.after_arrivals("S", 100_000, stream="R", factor=20)`` is
    a-caching.txt §7.4's "a burst in ΔR starts when 100,000 ΔS tuples have arrived and
    continues through the remainder of the run" (20 times its normal rate).
    """

    stream: str
    factor: float
    start: float | None = 0.0
    end: float | None = None
    start_after: tuple[str, int] | None = None
    end_after: tuple[str, int] | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.factor, int | float) and math.isfinite(self.factor)
                and self.factor > 0):
            raise WorkloadError(f"Burst factor must be a positive number, got {self.factor!r}")
        if self.start is None and self.start_after is None:
            raise WorkloadError("Burst needs a start time or start_after=(stream, count)")
        for label, spec in (("start_after", self.start_after), ("end_after", self.end_after)):
            if spec is not None and (len(spec) != 2 or int(spec[1]) < 1):
                raise WorkloadError(f"Burst {label} must be (stream, count >= 1), got {spec!r}")
        if (self.start is not None and self.end is not None and self.start_after is None
                and self.end_after is None and self.end < self.start):
            raise WorkloadError(f"Burst end {self.end} is before its start {self.start}")

    @classmethod
    def after_arrivals(cls, stream_counted: str = "S", count: int = 100_000, stream: str = "R",
                       factor: float = 20.0, end_count: int | None = None) -> Burst:
        """The burst starting when ``count`` tuples of ``stream_counted`` have arrived.

        The start is the event time of that stream's ``count``-th arrival; with
        ``end_count`` it ends at its ``end_count``-th arrival, else it runs to the end.
        """
        return cls(stream=stream, factor=float(factor), start=None, end=None,
                   start_after=(stream_counted, int(count)),
                   end_after=None if end_count is None else (stream_counted, int(end_count)))

    @property
    def resolved(self) -> bool:
        return self.start_after is None and self.end_after is None

    def to_json(self) -> dict[str, Any]:
        return {
            "stream": self.stream, "factor": float(self.factor),
            "start": None if self.start is None else float(self.start),
            "end": None if self.end is None else float(self.end),
            "start_after": None if self.start_after is None else list(self.start_after),
            "end_after": None if self.end_after is None else list(self.end_after),
        }


# ---------------------------------------------------------------------------------------------
# Arrival schedules
# ---------------------------------------------------------------------------------------------


class _Clock:
    """The virtual clock V(t) = ∫_0^t m(s) ds of one stream, m = product of its bursts."""

    def __init__(self, bursts: Sequence[Burst]):
        points = {0.0}
        for b in bursts:
            points.add(max(0.0, float(b.start)))
            if b.end is not None:
                points.add(max(0.0, float(b.end)))
        self.t = np.array(sorted(points))
        mids = np.append((self.t[:-1] + self.t[1:]) / 2, self.t[-1] + 1.0)
        mult = np.ones_like(self.t)
        for b in bursts:
            end = math.inf if b.end is None else b.end
            mult[(mids >= b.start) & (mids < end)] *= b.factor
        self.m = mult  # multiplier on [t[k], t[k+1]) (last: to infinity)
        self.v = np.concatenate([[0.0], np.cumsum(np.diff(self.t) * mult[:-1])])

    def forward(self, t: np.ndarray | float) -> np.ndarray:
        t = np.asarray(t, dtype=np.float64)
        k = np.clip(np.searchsorted(self.t, t, side="right") - 1, 0, len(self.t) - 1)
        return self.v[k] + (t - self.t[k]) * self.m[k]

    def inverse(self, v: np.ndarray | float) -> np.ndarray:
        v = np.asarray(v, dtype=np.float64)
        k = np.clip(np.searchsorted(self.v, v, side="right") - 1, 0, len(self.v) - 1)
        return self.t[k] + (v - self.v[k]) / self.m[k]


def _as_bursts(burst: Burst | Iterable[Burst] | None) -> list[Burst]:
    if burst is None:
        return []
    if isinstance(burst, Burst):
        return [burst]
    out = list(burst)
    for b in out:
        if not isinstance(b, Burst):
            raise WorkloadError(f"burst must be a Burst or a list of them, got {b!r}")
    return out


def _resolve_bursts(bursts: Sequence[Burst], rates: Mapping[str, float]) -> list[Burst]:
    """Turn count-based burst boundaries into times (in the order given)."""
    for b in bursts:
        for spec in (b.start_after, b.end_after):
            if b.stream not in rates or (spec is not None and spec[0] not in rates):
                raise WorkloadError(
                    f"burst on {b.stream!r} names a stream that is not one of {list(rates)}")
    done: list[Burst] = [b for b in bursts if b.resolved]
    for b in bursts:
        if b.resolved:
            continue
        times = {}
        for label, spec in (("start", b.start_after), ("end", b.end_after)):
            if spec is None:
                times[label] = b.start if label == "start" else b.end
                continue
            counted, count = spec[0], int(spec[1])
            clock = _Clock([d for d in done if d.stream == counted])
            times[label] = float(clock.inverse((count - 1) / rates[counted]))
        if times["end"] is not None and times["end"] < times["start"]:
            raise WorkloadError(f"burst {b} ends before it starts")
        done.append(replace(b, start=times["start"], end=times["end"]))
    return done


def _warn_late_bursts(bursts: Sequence[Burst], end: float) -> None:
    for b in bursts:
        if b.start >= end:
            warnings.warn(f"burst on {b.stream} starts at t={b.start:g}s, after the run ends "
                          f"(t={end:g}s): raise n_updates for it to have an effect",
                          stacklevel=3)


def _check_n_updates(n_updates: Any, streams: int) -> int:
    """``n_updates`` as an int: a whole number, at least one arrival per stream."""
    ok = isinstance(n_updates, int | np.integer | float) and not isinstance(n_updates, bool)
    if not ok or not math.isfinite(n_updates) or int(n_updates) != n_updates \
            or n_updates < streams:
        raise WorkloadError(f"n_updates (--n-updates) must be a whole number >= {streams} "
                            f"(at least one arrival per stream), got {n_updates!r}")
    return int(n_updates)


def _check_seed(seed: Any) -> int:
    """A numpy seed: a whole number >= 0."""
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise WorkloadError(f"seed (--seed) must be a whole number >= 0, got {seed!r}")
    return int(seed)


def _schedule(rates: Mapping[str, float], n_updates: int,
              bursts: Sequence[Burst]) -> tuple[dict[str, np.ndarray], float]:
    """Arrival times per stream, ``n_updates`` arrivals in all; returns (times, run end)."""
    n_updates = _check_n_updates(n_updates, len(rates))
    clocks = {s: _Clock([b for b in bursts if b.stream == s]) for s in rates}
    # Total expected arrivals by time T is piecewise linear in T: invert it on the union
    # of all breakpoints, extrapolating past the last one.
    bps = np.unique(np.concatenate([c.t for c in clocks.values()]))

    def total(t: np.ndarray) -> np.ndarray:
        return sum(rates[s] * clocks[s].forward(t) for s in rates)

    tot = total(bps)
    if n_updates <= tot[-1]:
        end = float(np.interp(n_updates, tot, bps))
    else:  # past the last breakpoint every stream runs at its final (constant) rate
        slope = sum(rates[s] * clocks[s].m[-1] for s in rates)
        end = float(bps[-1] + (n_updates - tot[-1]) / slope)
    expected = {s: float(rates[s] * clocks[s].forward(end)) for s in rates}
    counts = _largest_remainder(expected, n_updates)
    times = {}
    for s in rates:
        v = np.arange(counts[s], dtype=np.float64) / rates[s]
        t = clocks[s].inverse(v)
        times[s] = np.maximum.accumulate(t) if len(t) else t  # guard float ties at breakpoints
    return times, end


def _largest_remainder(expected: Mapping[str, float], total: int) -> dict[str, int]:
    floors = {s: max(1, math.floor(x)) for s, x in expected.items()}
    short = total - sum(floors.values())
    order = sorted(expected, key=lambda s: (-(expected[s] - math.floor(expected[s])),
                                            list(expected).index(s)))
    i = 0
    while short != 0 and order:
        s = order[i % len(order)]
        if short > 0:
            floors[s] += 1
            short -= 1
        elif floors[s] > 1:
            floors[s] -= 1
            short += 1
        i += 1
    return floors


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


def _fmt(x: float) -> str:
    """Compact decimal for SQL: 10.0 -> '10', 0.2 -> '0.2', 1e-5 -> '0.00001'."""
    return np.format_float_positional(float(x), trim="-")


def _table(ts: np.ndarray, **attrs: np.ndarray) -> pa.Table:
    cols = {
        TIMESTAMP: pa.array(ts, type=pa.float64()),
        "id": pa.array(np.arange(len(ts), dtype=np.int64), type=pa.int64()),
    }
    for name, values in attrs.items():
        cols[name] = pa.array(np.asarray(values, dtype=np.int64), type=pa.int64())
    return pa.table(cols)


def _check_positive(name: str, value: float) -> float:
    if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
        raise WorkloadError(f"{name} must be a positive number, got {value!r}")
    return float(value)


def _pair_key(x: str, y: str) -> str:
    return f"{x},{y}"


# ---------------------------------------------------------------------------------------------
# §7.2: the three-way join
# ---------------------------------------------------------------------------------------------


def three_way(n_updates: int = 700_000, r: int = 5, rate: float = 1000.0,
              window: float | None = None, burst: Burst | Iterable[Burst] | None = None,
              seed: int = 0, domain: int | None = None) -> Workload:
    """a-caching.txt §7.2's default workload: ``R(A) ⋈_A S(A,B) ⋈_B T(B)``.

    "The join attributes R.A, S.A, S.B, and T.B draw values from the same domain in the
    same order. The multiplicity of these values is 1 in R and S and a variable r in T
    (default r = 5), and the rate of ΔT correspondingly is r times that of ΔR and ΔS."
    Arrivals are uniform: ΔR and ΔS at ``rate`` tuples/second, ΔT at ``r * rate``, all
    starting at time 0. Every stream carries the value ``v = floor(t * rate)`` at time t, so
    value v arrives at time v/rate in all three streams (once in R and S, r consecutive times
    in T; ``S.a == S.b``). Under a burst the stream keeps that value/time alignment, so a ×f
    burst on ΔR gives R's values multiplicity f for its duration (the §7.4 setting, where
    repeated R values make a ``T ⋈ S`` cache in ΔR's pipeline pay off). ``domain`` (optional)
    wraps values modulo ``domain``; by default they never repeat across the run.

    ``window`` (seconds, the same RANGE on all three streams) defaults to ``1000 / rate``:
    a window then holds N = 1000 tuples of R and of S and r·N of T, and since it is far
    longer than the 1/rate it takes a value's r copies in T to arrive, each R tuple joins
    exactly one S tuple and r T tuples. The pairwise join selectivities within the windows
    (fraction of window tuple pairs that join) are σ(R⋈S) = σ(S⋈T) = 1/N = 1/(window·rate)
    (0.001 by default), recorded in ``params["selectivities"]``. The seed is recorded but
    this workload uses no randomness.

    ``n_updates`` counts arrivals over all streams (default 700,000: 100,000 each of ΔR,
    ΔS and 500,000 of ΔT). For §7.4 pass
    ``burst=Burst.after_arrivals("S", 100_000, stream="R", factor=20)`` and a larger
    ``n_updates``.
    """
    seed = _check_seed(seed)
    if int(r) != r or r < 1:
        raise WorkloadError(f"r (multiplicity in T) must be an integer >= 1, got {r!r}")
    r = int(r)
    rate = _check_positive("rate", rate)
    window = 1000.0 / rate if window is None else _check_positive("window", window)
    if domain is not None and (int(domain) != domain or domain < 1):
        raise WorkloadError(f"domain must be a positive integer, got {domain!r}")
    rates = {"R": rate, "S": rate, "T": r * rate}
    bursts = _resolve_bursts(_as_bursts(burst), rates)
    times, end = _schedule(rates, n_updates, bursts)
    _warn_late_bursts(bursts, end)
    if window < (r - 1) / (r * rate):
        warnings.warn(f"three_way: window {window:g}s is shorter than the {(r - 1) / (r * rate):g}s "
                      f"over which a value's {r} copies arrive in T; R tuples will join fewer "
                      "than r of them", stacklevel=2)

    def values(t: np.ndarray) -> np.ndarray:
        v = np.floor(t * rate + 1e-6).astype(np.int64)
        return v % domain if domain is not None else v

    tables = {
        "R": _table(times["R"], a=values(times["R"])),
        "S": _table(times["S"], a=values(times["S"]), b=values(times["S"])),
        "T": _table(times["T"], b=values(times["T"])),
    }
    n_window = window * rate
    if domain is not None and n_window >= domain:
        warnings.warn(f"three_way: window holds {n_window:g} values of a domain of {domain}; "
                      "tuples will join more than one repeat of a value", stacklevel=2)
    w = _fmt(window)
    sql = (f"SELECT R.id AS rid, S.id AS sid, T.id AS tid "
           f"FROM R [RANGE {w} SECONDS], S [RANGE {w} SECONDS], T [RANGE {w} SECONDS] "
           f"WHERE R.a = S.a AND S.b = T.b")
    params = {
        "generator": "three-way",
        "paper": "a-caching.txt §7.2 (§7.4 with a burst)",
        "n_updates": int(n_updates), "r": r, "rate": rate, "window": window, "seed": int(seed),
        "domain": None if domain is None else int(domain),
        "streams": list(rates),
        "rates": {s: float(x) for s, x in rates.items()},
        "relative_rates": {"R": 1.0, "S": 1.0, "T": float(r)},
        "counts": {s: len(t) for s, t in times.items()},
        "duration": end,
        "bursts": [b.to_json() for b in _as_bursts(burst)],
        "bursts_resolved": [b.to_json() for b in bursts],
        "selectivities": {_pair_key("R", "S"): 1.0 / n_window,
                          _pair_key("S", "T"): 1.0 / n_window},
        "matches_per_r_tuple": {"S": 1, "T": r},
    }
    return Workload(name=f"three-way(r={r})", sql=sql, tables=tables, params=params)


# ---------------------------------------------------------------------------------------------
# §7.3: the n-way join on one attribute
# ---------------------------------------------------------------------------------------------


def _normalise_selectivities(names: Sequence[str], selectivities: Any) -> dict[frozenset, float]:
    if selectivities is None:
        return {frozenset(p): 0.005 for p in itertools.combinations(names, 2)}
    if not isinstance(selectivities, Mapping):
        raise WorkloadError("selectivities must map pairs of streams to σ, e.g. "
                            "{frozenset({'R1', 'R2'}): 0.004}")
    out: dict[frozenset, float] = {}
    for key, sel in selectivities.items():
        if isinstance(key, str):
            key = [k.strip() for k in key.replace("⋈", ",").replace("-", ",").split(",")]
        pair = frozenset(key)
        if len(pair) != 2 or not pair <= set(names):
            raise WorkloadError(f"selectivity key {key!r} is not a pair of streams of {names}")
        if not (isinstance(sel, int | float) and 0 <= sel <= 1):
            raise WorkloadError(f"selectivity of {sorted(pair)} must be in [0, 1], got {sel!r}")
        out[pair] = float(sel)
    return out


def _fit_nested(names: Sequence[str], sel: Mapping[frozenset, float]) -> dict[str, float]:
    """Least-squares fit of x_i = log d_i to -log σ_ij = max(x_i, x_j) over given pairs.

    For a fixed order of the x's, max(x_i, x_j) is the later one's x, so the problem is a
    weighted isotonic regression (the k-th stream's target is the mean of -log σ with the
    k-1 streams before it, weight k-1), solved by pool-adjacent-violators; all orders are
    tried for up to 7 streams, else a greedy order plus pairwise swaps.
    """
    n = len(names)
    c = {p: -math.log(s) for p, s in sel.items()}

    def solve(order: Sequence[str]) -> tuple[float, list[float]]:
        ys, ws = [], []
        for k, s in enumerate(order):
            prev = [c[frozenset((s, q))] for q in order[:k] if frozenset((s, q)) in c]
            ys.append(sum(prev) / len(prev) if prev else None)
            ws.append(len(prev))
        # PAVA on the positions with data; positions without data take their neighbours.
        blocks: list[list[float]] = []  # [value, weight, size]
        for y, w in zip(ys, ws, strict=True):
            if w == 0:
                blocks.append([math.nan, 0.0, 1])
                continue
            blocks.append([y, float(w), 1])
            while len(blocks) > 1:
                j = len(blocks) - 2
                while j >= 0 and blocks[j][1] == 0:
                    j -= 1
                if j < 0 or blocks[j][0] <= blocks[-1][0]:
                    break
                merged = blocks[j:]
                wsum = sum(b[1] for b in merged)
                val = sum(b[0] * b[1] for b in merged if b[1]) / wsum
                blocks[j:] = [[val, wsum, sum(b[2] for b in merged)]]
        xs: list[float] = []
        for val, _, size in blocks:
            xs.extend([val] * int(size))
        # Fill positions without data: never the max of a fitted pair, so any value not above
        # the next fitted one works; take the next fitted value (or the previous at the end).
        for k in range(n - 1, -1, -1):
            if math.isnan(xs[k]):
                xs[k] = xs[k + 1] if k + 1 < n else math.nan
        for k in range(n):
            if math.isnan(xs[k]):
                xs[k] = xs[k - 1] if k > 0 else 0.0
        fit = dict(zip(order, xs, strict=True))
        loss = sum((max(fit[a], fit[b]) - cv) ** 2 for (a, b), cv in
                   ((tuple(p), v) for p, v in c.items()))
        return loss, xs

    if n <= 7:
        orders: Iterable[Sequence[str]] = itertools.permutations(names)
        best = min(((solve(o)[0], o) for o in orders), key=lambda t: t[0])
        order = best[1]
    else:
        mean_c = {s: np.mean([v for p, v in c.items() if s in p]) for s in names}
        order = sorted(names, key=lambda s: mean_c[s])
        loss = solve(order)[0]
        improved = True
        while improved:
            improved = False
            for i, j in itertools.combinations(range(n), 2):
                cand = list(order)
                cand[i], cand[j] = cand[j], cand[i]
                cl = solve(cand)[0]
                if cl < loss - 1e-12:
                    order, loss, improved = cand, cl, True
    xs = solve(order)[1]
    return {s: math.exp(x) for s, x in zip(order, xs, strict=True)}


def _fit_intervals(names: Sequence[str], sel: Mapping[frozenset, float], start: Mapping[str, int],
                   min_domain: int) -> dict[str, tuple[int, int]]:
    key = (tuple(names), tuple(sorted((tuple(sorted(p)), float(s)) for p, s in sel.items())),
           tuple(int(start[s]) for s in names), int(min_domain))
    return dict(_fit_intervals_cached(*key))


@functools.lru_cache(maxsize=64)
def _fit_intervals_cached(names: tuple[str, ...], sel_items: tuple, start_sizes: tuple[int, ...],
                          min_domain: int) -> tuple[tuple[str, tuple[int, int]], ...]:
    """Fit integer intervals [o_i, o_i + d_i) (d_i >= min_domain) to the pairwise σ.

    σ_ij = overlap_ij / (d_i d_j) has 2n - 1 free parameters against n(n-1)/2 pairs, so it
    meets most of Table 2 almost exactly where nested domains cannot. Least squares on
    log σ (σ = 0 pairs: penalised overlap) by Nelder-Mead from the nested fit and from
    fixed pseudo-random starts (seeded, so the layout never depends on the data seed), then
    an integer coordinate descent.
    """
    from scipy.optimize import minimize

    sel = {frozenset(p): s for p, s in sel_items}
    start = dict(zip(names, start_sizes, strict=True))
    n = len(names)
    idx = {s: k for k, s in enumerate(names)}
    terms = [(idx[min(p)], idx[max(p)], s, math.log(s) if s > 0 else 0.0)
             for p, s in sel.items()]

    def loss_int(o: Sequence[float], d: Sequence[float]) -> float:
        total = 0.0
        for i, j, s, log_s in terms:
            overlap = min(o[i] + d[i], o[j] + d[j]) - max(o[i], o[j])
            if s == 0:
                if overlap > 0:
                    total += 1e3 * (overlap / max(d[i], d[j])) ** 2
            elif overlap <= 0:
                total += 1e3 + (1.0 - overlap) ** 2
            else:
                total += (math.log(overlap / (d[i] * d[j])) - log_s) ** 2
        return total

    def unpack(z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return np.concatenate([[0.0], z[: n - 1]]), min_domain + np.exp(z[n - 1:])

    def loss(z: np.ndarray) -> float:
        o, d = unpack(z)
        return loss_int(o.tolist(), d.tolist())

    d0 = np.log(np.maximum(1.0, np.array([start[s] for s in names], float) - min_domain))
    rng = np.random.default_rng(20040613)
    starts = [np.concatenate([np.zeros(n - 1), d0])]
    scale = float(np.mean([start[s] for s in names]))
    for _ in range(7):
        starts.append(np.concatenate([rng.uniform(-0.5, 0.5, n - 1) * scale,
                                      d0 + rng.uniform(-0.3, 0.3, n)]))
    best = min((minimize(loss, z0, method="Nelder-Mead",
                         options={"maxiter": 4000 * n, "xatol": 1e-6, "fatol": 1e-14})
                for z0 in starts), key=lambda r: r.fun)
    o, d = unpack(best.x)
    o = np.round(o - o.min()).tolist()
    d = np.maximum(min_domain, np.round(d)).tolist()
    cur = loss_int(o, d)
    improved = True
    while improved:
        improved = False
        for k in range(2 * n):
            for step in (-2, -1, 1, 2):
                o2, d2 = list(o), list(d)
                if k < n:
                    o2[k] += step
                else:
                    d2[k - n] = max(min_domain, d2[k - n] + step)
                cand = loss_int(o2, d2)
                if cand < cur - 1e-15:
                    o, d, cur, improved = o2, d2, cand, True
    low = min(o)
    return tuple((s, (int(o[k] - low), int(d[k]))) for k, s in enumerate(names))


def _domains(names: Sequence[str], sel: Mapping[frozenset, float], isolated_domain: int,
             layout: str = "nested", min_domain: int = 40) -> dict[str, tuple[int, int]]:
    """Per stream (offset, size): values are uniform over [offset, offset + size).

    ``layout="nested"``: streams connected by σ > 0 pairs share an offset (nested domains
    [off, off + d_i), so σ_ij = 1/max(d_i, d_j)). ``layout="intervals"``: within such a
    group each stream gets its own fitted interval (see ``_fit_intervals``). Either way
    different groups get disjoint ranges, so their pairs never join (σ = 0, e.g. all of
    Table 2's D7).
    """
    parent = {s: s for s in names}

    def find(s: str) -> str:
        while parent[s] != s:
            parent[s] = parent[parent[s]]
            s = parent[s]
        return s

    for p, s in sel.items():
        if s > 0:
            a, b = tuple(p)
            parent[find(a)] = find(b)
    comps: dict[str, list[str]] = {}
    for s in names:
        comps.setdefault(find(s), []).append(s)
    out: dict[str, tuple[int, int]] = {}
    offset = 0
    for members in comps.values():
        zero = [sorted(p) for p, s in sel.items() if s == 0 and p <= set(members)]
        if zero and layout == "nested":
            raise WorkloadError(
                f"selectivity 0 between {zero[0][0]} and {zero[0][1]} cannot be met: both are "
                "linked to other streams by non-zero selectivities, and one shared join "
                "attribute with nested domains makes every such pair join sometimes "
                "(layout='intervals' can)")
        sub = {p: s for p, s in sel.items() if s > 0 and p <= set(members)}
        if not sub:
            local = {m: (0, int(isolated_domain)) for m in members}
        else:
            fit = _fit_nested(members, sub)
            sizes = {m: max(1, round(fit[m])) for m in members}
            local = {m: (0, sizes[m]) for m in members}
            if layout == "intervals" and len(members) > 1:
                within = {p: s for p, s in sel.items() if p <= set(members)}
                local = _fit_intervals(members, within, sizes, min_domain)
                bad = [sorted(p) for p in within if within[p] == 0 and _achieved(
                    local[min(p)], local[max(p)]) > 0]
                if bad:
                    raise WorkloadError(f"selectivity 0 between {bad[0][0]} and {bad[0][1]} "
                                        "cannot be met together with the other selectivities")
        for m in members:
            out[m] = (offset + local[m][0], local[m][1])
        offset += max(o + d for o, d in local.values())
    return out


def _achieved(x: tuple[int, int], y: tuple[int, int]) -> float:
    """Exact σ for independent uniform values over [off, off + d): overlap / (d_x d_y)."""
    overlap = max(0, min(x[0] + x[1], y[0] + y[1]) - max(x[0], y[0]))
    return overlap / (x[1] * y[1])


def nway(n: int = 4, rates: Mapping[str, float] | Sequence[float] | None = None,
         selectivities: Mapping[Any, float] | None = None, n_updates: int = 200_000,
         window: float | None = None, seed: int = 0,
         burst: Burst | Iterable[Burst] | None = None, *, names: Sequence[str] | None = None,
         rate: float = 1000.0, isolated_domain: int = 200, layout: str = "nested",
         min_domain: int = 40, name: str | None = None) -> Workload:
    """a-caching.txt §7.3's ``R1(A) ⋈_A R2(A) ⋈_A ... ⋈_A Rn(A)``.

    ``rates`` are relative arrival rates (stream -> rate, or a list in stream order; default
    all 1); a relative rate x arrives uniformly at ``x * rate`` tuples/second.
    ``selectivities`` maps ``frozenset({x, y})`` (or ``(x, y)``, or ``"x,y"``) to the
    pairwise join selectivity σ_xy: as in the paper, the fraction of pairs of tuples, one in
    each window, that join (default 0.005 for every pair). Pairs left out are unconstrained.

    With one shared attribute the pairwise σ cannot all be set independently. Each stream's
    A is drawn uniformly (independently per tuple) from its own domain [0, d_i), so
    σ_ij = 1/max(d_i, d_j); the integers d_i are a least-squares fit of log σ (see
    ``_fit_nested``). Pairs with σ = 0 get disjoint domains (streams joined by non-zero σ
    share a range; separate groups get separate ranges; a stream in no non-zero pair gets
    ``isolated_domain`` values). ``params`` records the domains and the requested and
    achieved σ of every pair and their relative errors.

    ``layout="intervals"`` (opt-in) instead gives each stream its own integer interval
    [o_i, o_i + d_i) with d_i >= ``min_domain``, σ_ij = overlap/(d_i d_j), fitted the same
    way; with 2n - 1 parameters it meets most of Table 2 within a few percent, at the price
    of smaller domains (higher value multiplicity) and fewer values common to all streams.

    The streams are ``names``, else the keys of a ``rates`` mapping, else R1..Rn (``n`` is
    only used for those default names). ``window`` (RANGE seconds, all streams) defaults to
    ``1 / (rate · σ̄)`` with σ̄ the geometric mean of the requested non-zero σ
    (1/isolated_domain if none), rounded to two significant digits: a window of a
    relative-rate-1 stream then holds about 1/σ̄ tuples, so a probe into it finds about one
    match. σ itself does not depend on the window (values are independent of time).
    """
    seed = _check_seed(seed)
    if names is None:
        if isinstance(rates, Mapping):
            names = list(rates)
        elif isinstance(selectivities, Mapping) and selectivities and all(
                isinstance(k, frozenset) for k in selectivities):
            found = sorted({s for k in selectivities for s in k},
                           key=lambda s: (len(s), s))
            names = found if len(found) == n else [f"R{i}" for i in range(1, n + 1)]
        else:
            names = [f"R{i}" for i in range(1, n + 1)]
    names = [str(s) for s in names]
    if len(set(names)) != len(names) or len(names) < 2:
        raise WorkloadError(f"need at least two distinct stream names, got {names}")
    if n != len(names) and n != 4:
        raise WorkloadError(f"n={n} but {len(names)} stream names {names}")
    n = len(names)
    if rates is None:
        rel = {s: 1.0 for s in names}
    elif isinstance(rates, Mapping):
        if set(rates) != set(names):
            raise WorkloadError(f"rates names streams {sorted(rates)}, expected {names}")
        rel = {s: _check_positive(f"rate of {s}", rates[s]) for s in names}
    else:
        rates = list(rates)
        if len(rates) != n:
            raise WorkloadError(f"{len(rates)} rates for {n} streams {names}")
        rel = {s: _check_positive(f"rate of {s}", x) for s, x in zip(names, rates, strict=True)}
    rate = _check_positive("rate", rate)
    if int(isolated_domain) != isolated_domain or isolated_domain < 1:
        raise WorkloadError(f"isolated_domain must be a positive integer, got {isolated_domain!r}")
    if layout not in ("nested", "intervals"):
        raise WorkloadError(f"layout must be 'nested' or 'intervals', got {layout!r}")
    if int(min_domain) != min_domain or min_domain < 1:
        raise WorkloadError(f"min_domain must be a positive integer, got {min_domain!r}")
    sel = _normalise_selectivities(names, selectivities)
    domains = _domains(names, sel, int(isolated_domain), layout, int(min_domain))
    nonzero = [s for s in sel.values() if s > 0]
    sigma_bar = (math.exp(np.mean(np.log(nonzero))) if nonzero else 1.0 / isolated_domain)
    if window is None:
        window = float(f"{1.0 / (rate * sigma_bar):.2g}")
    window = _check_positive("window", window)

    abs_rates = {s: rel[s] * rate for s in names}
    bursts = _resolve_bursts(_as_bursts(burst), abs_rates)
    times, end = _schedule(abs_rates, n_updates, bursts)
    _warn_late_bursts(bursts, end)
    rng = np.random.default_rng(seed)
    tables = {}
    for s in names:
        off, d = domains[s]
        tables[s] = _table(times[s], a=rng.integers(off, off + d, size=len(times[s])))

    pairs = list(itertools.combinations(names, 2))
    requested = {_pair_key(x, y): sel.get(frozenset((x, y))) for x, y in pairs}
    achieved = {_pair_key(x, y): _achieved(domains[x], domains[y]) for x, y in pairs}
    rel_err = {k: (None if requested[k] is None else
                   (0.0 if requested[k] == achieved[k] else
                    (math.inf if requested[k] == 0 else
                     achieved[k] / requested[k] - 1.0)))
               for k in requested}
    w = _fmt(window)
    aliases = {s: (s.lower() if s.lower() != "a" else f"{s.lower()}_id") for s in names}
    select = ", ".join(f"{s}.id AS {aliases[s]}" for s in names) + f", {names[0]}.a AS a"
    sql = (f"SELECT {select} FROM " + ", ".join(f"{s} [RANGE {w} SECONDS]" for s in names)
           + " WHERE " + " AND ".join(f"{x}.a = {y}.a" for x, y in itertools.pairwise(names)))
    params = {
        "generator": "nway",
        "paper": "a-caching.txt §7.3",
        "n": n, "n_updates": int(n_updates), "rate": rate, "window": window, "seed": int(seed),
        "isolated_domain": int(isolated_domain), "layout": layout,
        "min_domain": int(min_domain),
        "streams": names,
        "relative_rates": rel,
        "rates": abs_rates,
        "counts": {s: len(t) for s, t in times.items()},
        "duration": end,
        "bursts": [b.to_json() for b in _as_bursts(burst)],
        "bursts_resolved": [b.to_json() for b in bursts],
        "domains": {s: {"offset": off, "size": d} for s, (off, d) in domains.items()},
        "selectivity_model": "A uniform over [offset, offset+size) per stream; "
                             "sigma = overlap / (size_x * size_y)",
        "common_values": max(0, min(o + d for o, d in domains.values())
                             - max(o for o, _ in domains.values())),
        "selectivities_requested": requested,
        "selectivities": achieved,
        "selectivity_rel_error": rel_err,
        "max_abs_rel_error": max((abs(v) for v in rel_err.values() if v is not None),
                                 default=0.0),
    }
    return Workload(name=name or f"nway(n={n})", sql=sql, tables=tables, params=params)


def table2_point(name: str = "D1", n_updates: int = 200_000, seed: int = 0,
                 burst: Burst | Iterable[Burst] | None = None, *,
                 names: Sequence[str] = ("R", "S", "T", "U"), window: float | None = None,
                 rate: float = 1000.0, layout: str = "nested", min_domain: int = 40) -> Workload:
    """One of the eight sample points D1..D8 of a-caching.txt §7.3, Table 2.

    The 4-way join of streams R, S, T, U (or ``names``, in that order) on A with Table 2's
    arrival rates (relative to T, which arrives at ``rate`` tuples/second) and pairwise join
    selectivities (see :data:`TABLE2`), generated by :func:`nway` (``layout``/``min_domain``
    as there); ``params`` records the selectivities achieved versus Table 2's.
    """
    seed = _check_seed(seed)
    key = str(name).upper()
    if key not in TABLE2:
        raise WorkloadError(f"Table 2 has points D1..D8, not {name!r}")
    names = [str(s) for s in names]
    if len(names) != 4:
        raise WorkloadError(f"Table 2 points join four streams, got names {names}")
    ren = dict(zip("RSTU", names, strict=True))
    point = TABLE2[key]
    rates = {ren[s]: x for s, x in point["rates"].items()}
    sels = {frozenset(ren[s] for s in p): v for p, v in point["selectivities"].items()}
    w = nway(4, rates=rates, selectivities=sels, n_updates=n_updates, window=window,
             seed=seed, burst=burst, names=names, rate=rate, layout=layout,
             min_domain=min_domain, name=key)
    w.params["generator"] = "table2"
    w.params["point"] = key
    w.params["paper"] = "a-caching.txt §7.3, Table 2"
    return w


def default_workload(seed: int = 0, n_updates: int = 200_000) -> Workload:
    """What ``adaptcq run`` runs with no arguments.

    a-caching.txt §7.3's 4-way join ``R1(A) ⋈ R2(A) ⋈ R3(A) ⋈ R4(A)`` at Table 2's point D1
    (R1..R4 in the roles of R, S, T, U), about 200,000 arrivals, with a ×5 rate burst on R2
    over the middle third of the run (in event time), so an adaptive plan has something to
    adapt to.
    """
    seed = _check_seed(seed)
    n_updates = _check_n_updates(n_updates, 4)
    point = TABLE2["D1"]
    rel = dict(zip(("R1", "R2", "R3", "R4"), point["rates"].values(), strict=True))
    factor, stream, rate = 5.0, "R2", 1000.0
    # Run length T with a ×f burst on one stream over [T/3, 2T/3):
    # n = Σλ·T + λ_b·(f - 1)·T/3.
    lam = {s: x * rate for s, x in rel.items()}
    run = n_updates / (sum(lam.values()) + lam[stream] * (factor - 1) / 3)
    burst = Burst(stream=stream, factor=factor, start=run / 3, end=2 * run / 3)
    w = table2_point("D1", n_updates=n_updates, seed=seed, burst=burst,
                     names=("R1", "R2", "R3", "R4"), rate=rate)
    w.name = "default"
    w.params["generator"] = "default"
    return w


# ---------------------------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------------------------


def write_workload(w: Workload, out_dir: str | Path) -> dict[str, Path]:
    """Write ``<out_dir>/<stream>.parquet`` per stream, ``query.sql`` and ``params.json``.

    ``out_dir`` must be a new folder, an empty one, or the folder of a workload written
    before (its files exactly ``params.json``, ``query.sql`` and the ``<stream>.parquet`` of
    the streams that ``params.json`` lists): that workload is then replaced, its files for
    streams the new one lacks removed. Anything else (an existing file, a folder holding
    other files) is a :class:`WorkloadError`, so that no data is overwritten by mistake.
    Each file is written under a temporary name and then renamed.

    Returns stream name -> path, plus ``"query.sql"`` and ``"params.json"``.
    """
    out = Path(out_dir)
    stale = _check_out_dir(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        paths: dict[str, Path] = {}
        for s, table in w.tables.items():
            p = out / f"{s}.parquet"
            _replace(p, lambda tmp, table=table: pq.write_table(table, tmp))
            paths[s] = p
        sql_path = out / "query.sql"
        _replace(sql_path, lambda tmp: tmp.write_text(w.sql + "\n", encoding="utf-8"))
        meta = {"name": w.name, "timestamp": w.timestamp, "streams": list(w.tables),
                "params": w.params}
        text = json.dumps(meta, indent=2, allow_nan=True) + "\n"
        params_path = out / "params.json"
        _replace(params_path, lambda tmp: tmp.write_text(text, encoding="utf-8"))
        for p in stale - {p.name for p in paths.values()} - {"query.sql", "params.json"}:
            (out / p).unlink(missing_ok=True)
    except OSError as e:
        raise WorkloadError(f"cannot write the workload to {str(out)!r}: "
                            f"{e.strerror or e}") from None
    paths["query.sql"] = sql_path
    paths["params.json"] = params_path
    return paths


_PARTIAL = ".partial"  # suffix of a file being written (renamed when complete)


def _replace(path: Path, write: Callable[[Path], object]) -> None:
    tmp = path.with_name(f".{path.name}{_PARTIAL}")
    try:
        write(tmp)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def _check_out_dir(out: Path) -> set[str]:
    """Refuse an output path that would overwrite something other than a workload;
    return the names of the files of the previous workload in it (to replace)."""
    if not out.exists():
        if out.is_symlink():
            raise WorkloadError(f"cannot write the workload to {str(out)!r}: it is a "
                                "broken symbolic link")
        return set()
    if not out.is_dir():
        raise WorkloadError(f"cannot write the workload to {str(out)!r}: it is an existing "
                            "file (the workload output is a folder: give a new or empty one)")
    try:
        entries = {p.name: p for p in out.iterdir()}
    except OSError as e:
        raise WorkloadError(f"cannot read the folder {str(out)!r}: {e.strerror or e}") from None
    files = {n for n in entries if not (n.startswith(".") and n.endswith(_PARTIAL))}
    if not files:
        return set()
    expected = {"params.json", "query.sql"}
    try:
        meta = json.loads((out / "params.json").read_text(encoding="utf-8"))
        expected |= {f"{s}.parquet" for s in meta["streams"]}
    except (OSError, ValueError, KeyError, TypeError):
        expected = set()
    if "params.json" not in files or not files <= expected or not all(
            entries[n].is_file() for n in files):
        others = sorted(files - expected) or sorted(files)
        listed = ", ".join(others[:5]) + (", ..." if len(others) > 5 else "")
        raise WorkloadError(f"cannot write the workload to {str(out)!r}: the folder is not "
                            f"empty and is not a workload written before (it holds {listed}); "
                            "give a new or empty folder")
    return files


def read_workload(out_dir: str | Path) -> Workload:
    """Read back a workload written by :func:`write_workload`."""
    out = Path(out_dir)
    try:
        meta = json.loads((out / "params.json").read_text(encoding="utf-8"))
        sql = (out / "query.sql").read_text(encoding="utf-8").strip()
    except FileNotFoundError as e:
        raise WorkloadError(f"{out} is not a workload directory: {e.filename} is missing") from e
    tables = {s: pq.read_table(out / f"{s}.parquet") for s in meta["streams"]}
    return Workload(name=meta["name"], sql=sql, tables=tables,
                    timestamp=meta.get("timestamp", TIMESTAMP), params=meta["params"])


WORKLOADS: dict[str, Callable[..., Workload]] = {
    "three-way": three_way,
    "nway": nway,
    "table2": table2_point,
    "default": default_workload,
}


def _spill(**kwargs) -> Workload:
    from adaptcq.stream.spill_workload import spill_five_way
    return spill_five_way(**kwargs)


WORKLOADS["spill"] = _spill  # state-spill.txt §6.1 (stream/spill_workload.py)
"""Generators by name, for ``WORKLOADS[name](**kwargs)`` from a CLI."""


def _shed(**kwargs) -> Workload:
    from adaptcq.stream.shed_workload import shed_two_way
    if "n_updates" in kwargs:  # given (as by --n-updates), it must be a count
        _check_n_updates(kwargs["n_updates"], 2)
    return shed_two_way(**kwargs)


WORKLOADS["shed"] = _shed  # load-shedding.txt §6.1 (stream/shed_workload.py)
