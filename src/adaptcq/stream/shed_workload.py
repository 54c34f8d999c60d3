"""The workload of load-shedding.txt §6.1: two streams R and S (the paper's S_1, S_2) of
set-valued tuples whose matches are correlated in time, and their match distributions
(Figure 6).

**Tuples.** Each tuple has ``s``, a set of items drawn from 1..L (L = ``items``, 100) as a
sorted list of distinct int64: its size is Normal(μ, σ) rounded and clipped to [1, L] (μ = 5,
σ = 1), its items drawn without replacement by a Zipf popularity with parameter κ over the
popularity ranks 1..L (P(rank k) ∝ 1/k^κ); ``v``, a single int64 for equi-joins, drawn the
same way from L = ``equi_items`` (5000) items with sets of exactly one item (μ = 1, σ = 0,
§6.1); and, when ``utilities`` are given (§6.5), ``kind``, the tuple's type "t0", "t1", ...
drawn iid with the type frequencies (the same for both streams).

**Time correlation** (§6.1). Popularity ranks rotate with the cycle period ς (``cycle``,
default 2·w): at time T the most popular item is a = 1 + ⌊L·(T mod ς)/ς⌋, the next a + 1,
and so on (mod L). S is shifted by τ (``shift``, default 5/8·ς): its most popular item at T
is a = 1 + ⌊L·((T − τ) mod ς)/ς⌋. Since a(T − τ) = a(T + ς − τ), an R tuple at T resembles
the S tuples of T − (ς − τ): R probing the window of S finds its matches ς − τ = 0.75·w back
(the peak of Figure 6), while S probing the window of R finds them τ = 1.25·w back, outside
the window (it sees only the tail, rising towards lag w).

**Arrivals.** Each stream is a Poisson process (independent for R and S) of ``rate`` tuples
per second, or of a piecewise-constant profile: "fig8" (§6.3: 100 tuples/s for 60 s, 500/s
for 15 s, 300/s for 30 s, then 100/s to the end) or "fig11" (§6.4: the text does not give
Figure 11's profile; we *approximate* it by Figure 8's shape, which also ramps the load to
500 tuples/s and back, and record the profile in ``params["rate_profile"]``).
``n_updates`` sets the duration instead, so that about that many arrivals (both streams)
are expected: the duration D solves 2·∫_0^D rate = n_updates.

**Utilities** (§6.5): V(z) for the types t0 .. t{|Z|−1}; type frequencies "uniform",
"inverse" (∝ 1/V), "direct" (∝ V) or explicit. :func:`utilities_fig16` and
:func:`utilities_fig17` give the utilities of Figures 16 and 17.

:func:`match_distribution` measures the match distributions f_1, f_2 of Figure 6 on a
generated workload. Randomness: one ``numpy.random.SeedSequence(seed)``, spawned into
independent generators per stream and purpose, so changing the utilities does not change
the sets.
"""

from __future__ import annotations

import itertools
import math
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from adaptcq.checks import is_int
from adaptcq.stream.workloads import (
    TIMESTAMP,
    Workload,
    WorkloadError,
    _check_n_updates,
    _check_seed,
    _fmt,
)

__all__ = [
    "PROFILES",
    "match_distribution",
    "rate_profile",
    "shed_two_way",
    "utilities_fig16",
    "utilities_fig17",
]

STREAMS = ("R", "S")

PROFILES: dict[str, tuple[tuple[float, float], ...]] = {
    # §6.3, Figure 8: (start second, tuples per second per stream); the last rate holds on.
    "fig8": ((0.0, 100.0), (60.0, 500.0), (75.0, 300.0), (105.0, 100.0)),
    # §6.4, Figure 11: not in the text; an approximation by Figure 8's shape.
    "fig11": ((0.0, 100.0), (60.0, 500.0), (75.0, 300.0), (105.0, 100.0)),
}
"""Rate profiles by name: (start, rate) steps, each rate holding until the next start."""


# ---------------------------------------------------------------------------------------------
# Parameter checks
# ---------------------------------------------------------------------------------------------


def _positive(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating) \
            or not math.isfinite(value) or value <= 0:
        raise WorkloadError(f"{name} must be a positive number, got {value!r}")
    return float(value)


def _non_negative(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating) \
            or not math.isfinite(value) or value < 0:
        raise WorkloadError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)


def _whole(name: str, value: Any, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < low:
        raise WorkloadError(f"{name} must be a whole number >= {low}, got {value!r}")
    return int(value)


# ---------------------------------------------------------------------------------------------
# Rates and arrivals
# ---------------------------------------------------------------------------------------------


def rate_profile(rate: float | str) -> list[tuple[float, float]]:
    """The (start second, tuples/s per stream) steps of ``rate``: one step for a number,
    the steps of :data:`PROFILES` for a profile name (§6.3 "fig8", §6.4 "fig11")."""
    if isinstance(rate, str):
        if rate not in PROFILES:
            raise WorkloadError(f"rate must be tuples per second or one of "
                                f"{', '.join(PROFILES)}, got {rate!r}")
        return [tuple(step) for step in PROFILES[rate]]
    return [(0.0, _positive("rate (tuples per second per stream)", rate))]


def _duration_for(profile: Sequence[tuple[float, float]], n_updates: int) -> float:
    """The D at which 2·∫_0^D rate = n_updates (both streams, expected arrivals)."""
    target = n_updates / 2.0
    done = 0.0
    for k, (start, rate) in enumerate(profile):
        end = profile[k + 1][0] if k + 1 < len(profile) else math.inf
        if done + rate * (end - start) >= target:
            return start + (target - done) / rate
        done += rate * (end - start)
    raise AssertionError("unreachable: the last step is unbounded")


def _arrivals(profile: Sequence[tuple[float, float]], duration: float,
              rng: np.random.Generator) -> np.ndarray:
    """A Poisson process of the piecewise-constant rate on [0, duration): per step a
    Poisson count, uniform sorted times."""
    parts = []
    for k, (start, rate) in enumerate(profile):
        end = min(duration, profile[k + 1][0] if k + 1 < len(profile) else duration)
        if end <= start:
            continue
        count = rng.poisson(rate * (end - start))
        parts.append(np.sort(rng.uniform(start, end, count)))
    return np.concatenate(parts) if parts else np.zeros(0)


# ---------------------------------------------------------------------------------------------
# Sets with rotating Zipf popularity
# ---------------------------------------------------------------------------------------------


def _zipf_log_weights(items: int, kappa: float) -> np.ndarray:
    """log P(rank k) up to a constant, P(rank k) ∝ 1/k^κ, ranks 1..L (§6.1)."""
    return -kappa * np.log(np.arange(1, items + 1, dtype=np.float64))


def _most_popular(ts: np.ndarray, items: int, cycle: float, shift: float) -> np.ndarray:
    """a = 1 + ⌊L·((T − τ) mod ς)/ς⌋ (§6.1), the most popular item at each time."""
    a = 1 + np.floor(items * np.mod(ts - shift, cycle) / cycle).astype(np.int64)
    return np.minimum(a, items)  # guard (T − τ) mod ς rounding up to ς


def _sets(ts: np.ndarray, items: int, kappa: float, mu: float, sigma: float, cycle: float,
          shift: float, rng: np.random.Generator, chunk: int = 16384
          ) -> tuple[np.ndarray, np.ndarray]:
    """The ``s`` column as (offsets, values): per tuple a size round(N(μ, σ)) in [1, L],
    that many distinct ranks by Gumbel-top-k over the Zipf log-weights (sampling without
    replacement proportional to the weights), mapped to items ((a − 1 + rank − 1) mod L) + 1
    and sorted."""
    n = len(ts)
    sizes = np.clip(np.rint(rng.normal(mu, sigma, n)), 1, items).astype(np.int64)
    logw = _zipf_log_weights(items, kappa)
    a = _most_popular(ts, items, cycle, shift)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    values = np.empty(int(offsets[-1]), dtype=np.int64)
    for lo in range(0, n, chunk):
        hi = min(n, lo + chunk)
        k = sizes[lo:hi]
        kmax = int(k.max())
        keys = logw + rng.gumbel(size=(hi - lo, items))
        # The kmax best keys per row, best first: the first k of them are the sample.
        top = np.argpartition(-keys, kmax - 1, axis=1)[:, :kmax]
        order = np.argsort(-np.take_along_axis(keys, top, axis=1), axis=1, kind="stable")
        ranks = np.take_along_axis(top, order, axis=1)                  # 0-based ranks
        chosen = np.mod(a[lo:hi, None] - 1 + ranks, items) + 1
        keep = np.arange(kmax)[None, :] < k[:, None]
        chosen = np.where(keep, chosen, items + 1)                      # sorted to the end
        chosen.sort(axis=1)
        values[offsets[lo]:offsets[hi]] = chosen[keep]   # row by row, the first k of each
    return offsets, values


def _values(ts: np.ndarray, items: int, kappa: float, cycle: float, shift: float,
            rng: np.random.Generator) -> np.ndarray:
    """The ``v`` column: sets of exactly one item from L = ``equi_items`` (§6.1: μ = 1,
    σ = 0), the rank drawn by Zipf(κ)."""
    w = np.exp(_zipf_log_weights(items, kappa))
    ranks = rng.choice(items, size=len(ts), p=w / w.sum())              # 0-based ranks
    return np.mod(_most_popular(ts, items, cycle, shift) - 1 + ranks, items) + 1


# ---------------------------------------------------------------------------------------------
# Utilities (§6.5)
# ---------------------------------------------------------------------------------------------


#: The largest utility skewness k of :func:`utilities_fig16`: beyond it the smallest
#: utility 1/3^k is no longer a normal double (it loses precision, then 3^k overflows and
#: 1/3^k is 0, a type worth nothing: not Figure 16's model). About 644.8.
K_MAX = math.log(sys.float_info.min) / -math.log(3.0)
#: The largest value difference factor of :func:`utilities_fig17`: its lowest utility,
#: 1/factor, must be a normal double (about 4.5e307), for the same reason.
FACTOR_MAX = 1.0 / sys.float_info.min


def utilities_fig16(k: float) -> list[float]:
    """Figure 16's utilities for skewness k (§6.5): {1, 1/2^k, 1/3^k}, k in [0, K_MAX]."""
    k = _non_negative("k (utility skewness)", k)
    if k > K_MAX:
        raise WorkloadError(f"k (utility skewness) must be at most {K_MAX:.1f} (1/3^k must "
                            f"be a normal double), got {k!r}")
    return [1.0, 1.0 / 2.0 ** k, 1.0 / 3.0 ** k]


def utilities_fig17(types: int, factor: float) -> list[float]:
    """Figure 17's utilities (§6.5): |Z| = ``types`` types whose utilities follow a Zipf
    distribution with parameter θ = log_{|Z|}(factor), V(z) ∝ 1/(z + 1)^θ, so that the
    highest (V = 1) is ``factor`` times the lowest (1/|Z|^θ = 1/factor)."""
    types = _whole("types (type domain size |Z|)", types, low=2)
    factor = _positive("factor (value difference factor)", factor)
    if not 1 <= factor <= FACTOR_MAX:
        raise WorkloadError(f"factor (value difference factor) must be from 1 to "
                            f"{FACTOR_MAX:.3g} (the lowest utility, 1/factor, must be a "
                            f"normal double), got {factor!r}")
    theta = math.log(factor) / math.log(types)
    return [1.0 / (z + 1) ** theta for z in range(types)]


def _type_frequencies(utilities: Sequence[float],
                      frequencies: str | Sequence[float]) -> tuple[list[float], str]:
    """ω_z for every type (§6.5) and the model's name."""
    v = np.asarray(utilities, dtype=np.float64)
    if isinstance(frequencies, str):
        if frequencies == "uniform":
            f = np.ones_like(v)
        elif frequencies == "inverse":
            if np.any(v <= 0):
                raise WorkloadError(f"frequencies='inverse' needs utilities > 0, got "
                                    f"{list(utilities)!r}")
            f = 1.0 / v
        elif frequencies == "direct":
            f = v.copy()
        else:
            raise WorkloadError(f"frequencies must be 'uniform', 'inverse', 'direct' or one "
                                f"number per type, got {frequencies!r}")
        model = frequencies
    else:
        f = np.asarray(list(frequencies), dtype=np.float64)
        if f.shape != v.shape or not np.all(np.isfinite(f)) or np.any(f < 0):
            raise WorkloadError(f"frequencies must be one number >= 0 per type "
                                f"({len(v)}), got {list(frequencies)!r}")
        model = "explicit"
    if f.sum() <= 0:
        raise WorkloadError(f"frequencies must not all be 0, got {list(frequencies)!r}")
    return (f / f.sum()).tolist(), model


def _utility_case(utilities: Sequence[float]) -> str:
    """The utility as SQL: CASE kind WHEN 't0' THEN V(0) ... END (each stream's own
    ``kind``)."""
    whens = " ".join(f"WHEN 't{z}' THEN {_fmt(x)}" for z, x in enumerate(utilities))
    return f"CASE kind {whens} END"


# ---------------------------------------------------------------------------------------------
# The generator
# ---------------------------------------------------------------------------------------------


def _stream_names(streams) -> tuple[str, ...]:
    if not is_int(streams) or not 2 <= streams <= 8:
        raise WorkloadError(f"streams must be a whole number from 2 to 8, got {streams!r}")
    return STREAMS if streams == 2 else ("R", "S", "T", "U", "V", "X", "Y", "Z")[:streams]


def shed_two_way(duration: float = 120.0, rate: float | str = 500.0, window: float = 20.0,
                 kappa: float = 0.8, items: int = 100, mu: float = 5.0, sigma: float = 1.0,
                 cycle: float | None = None, shift: float | None = None, threshold: int = 3,
                 join: str = "overlap", equi_items: int = 5000,
                 utilities: Sequence[float] | None = None,
                 frequencies: str | Sequence[float] = "uniform", seed: int = 0,
                 n_updates: int | None = None, streams: int = 2) -> Workload:
    """§6.1's workload: streams R and S over ``window``-second windows joined by set
    overlap (``join="overlap"``: OVERLAP(R.s, S.s) >= ``threshold``) or equality
    (``join="equality"``: R.v = S.v). See the module docstring for the model.

    ``streams`` > 2 (beyond the paper, for selective processing in n-way MJoins): a chain
    R ⋈ S ⋈ T ⋈ … of that many streams, each joined with the next by the same condition,
    the k-th stream (from 0) shifted by k·τ (mod ς), so that each link has the time
    correlation of the paper's pair; ``n_updates`` is then not accepted."""
    seed = _check_seed(seed)
    window = _positive("window (seconds)", window)
    kappa = _non_negative("kappa (Zipf parameter)", kappa)
    items = _whole("items (L)", items)
    mu = _positive("mu (mean set size)", mu)
    sigma = _non_negative("sigma (set size deviation)", sigma)
    cycle = 2.0 * window if cycle is None else _positive("cycle (cycle period ς, seconds)",
                                                         cycle)
    if shift is None:
        shift = 5.0 / 8.0 * cycle
    elif isinstance(shift, bool) or not isinstance(shift, int | float) \
            or not math.isfinite(shift):
        raise WorkloadError(f"shift (time shift τ, seconds) must be a finite number, "
                            f"got {shift!r}")
    shift = float(shift)
    threshold = _whole("threshold (overlap threshold)", threshold)
    equi_items = _whole("equi_items (L for equi-joins)", equi_items)
    if join not in ("overlap", "equality"):
        raise WorkloadError(f"join must be 'overlap' or 'equality', got {join!r}")
    profile = rate_profile(rate)
    stream_names = _stream_names(streams)
    if n_updates is not None and len(stream_names) > 2:
        raise WorkloadError("n_updates sets the duration of the two-stream workload; give "
                            "duration for a chain of more streams")
    if n_updates is not None:
        n_updates = _check_n_updates(n_updates, len(STREAMS))
        duration = _duration_for(profile, n_updates)
    else:
        duration = _positive("duration (seconds)", duration)
    if utilities is not None:
        utilities = [float(x) for x in utilities]
        if not utilities or not all(math.isfinite(x) and x >= 0 for x in utilities):
            raise WorkloadError(f"utilities must be a non-empty list of numbers >= 0, "
                                f"got {utilities!r}")
        freqs, model = _type_frequencies(utilities, frequencies)
    elif frequencies != "uniform":
        raise WorkloadError(f"frequencies={frequencies!r} needs utilities (the tuple types)")
    else:
        freqs, model = None, None

    seeds = np.random.SeedSequence(seed).spawn(4 * len(stream_names))
    tables = {}
    for k, name in enumerate(stream_names):
        arr, set_rng, val_rng, type_rng = (np.random.default_rng(s)
                                           for s in seeds[4 * k:4 * k + 4])
        ts = _arrivals(profile, duration, arr)
        tau = k * shift   # S (stream 2) is the shifted one; in a chain, each next one
        offsets, values = _sets(ts, items, kappa, mu, sigma, cycle, tau, set_rng)
        cols = {
            TIMESTAMP: pa.array(ts, type=pa.float64()),
            "id": pa.array(np.arange(len(ts), dtype=np.int64), type=pa.int64()),
            "s": pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)),
                                          pa.array(values, type=pa.int64())),
            "v": pa.array(_values(ts, equi_items, kappa, cycle, tau, val_rng),
                          type=pa.int64()),
        }
        if freqs is not None:
            z = type_rng.choice(len(freqs), size=len(ts), p=freqs)
            names = np.array([f"t{i}" for i in range(len(freqs))], dtype=object)
            cols["kind"] = pa.array(names[z], type=pa.string())
        tables[name] = pa.table(cols)

    w = _fmt(window)
    if len(stream_names) == 2:
        cond = f"OVERLAP(R.s, S.s) >= {threshold}" if join == "overlap" else "R.v = S.v"
        sql = (f"SELECT R.id AS r, S.id AS s FROM R [RANGE {w} SECONDS], "
               f"S [RANGE {w} SECONDS] WHERE {cond}")
    else:
        links = [f"OVERLAP({a}.s, {b}.s) >= {threshold}" if join == "overlap" else
                 f"{a}.v = {b}.v" for a, b in itertools.pairwise(stream_names)]
        sql = (f"SELECT {', '.join(f'{a}.id AS {a.lower()}' for a in stream_names)} FROM "
               + ", ".join(f"{a} [RANGE {w} SECONDS]" for a in stream_names)
               + " WHERE " + " AND ".join(links))
    return Workload("shed", sql, tables, params={
        "duration": duration, "rate": rate if isinstance(rate, str) else float(rate),
        "rate_profile": [[float(a), float(b)] for a, b in profile],
        "rate_profile_note": ("approximation: Figure 11's profile is not in the text; "
                              "Figure 8's shape" if rate == "fig11" else None),
        "window": window, "kappa": kappa, "items": items, "mu": mu, "sigma": sigma,
        "cycle": cycle, "shift": shift, "threshold": threshold, "join": join,
        "equi_items": equi_items, "utilities": utilities, "frequencies": freqs,
        "frequency_model": model, "seed": seed, "n_updates": n_updates,
        "utility": None if utilities is None else _utility_case(utilities),
        "shifted_stream": "S"})


# ---------------------------------------------------------------------------------------------
# Figure 6: the match distributions
# ---------------------------------------------------------------------------------------------


def _bitsets(table: pa.Table, items: int) -> np.ndarray:
    """Each tuple's set as ⌈(L + 1)/64⌉ uint64 words (bit x for item x)."""
    col = table.column("s").combine_chunks()
    offsets = col.offsets.to_numpy()
    values = col.values.to_numpy().astype(np.int64)
    words = (items + 1 + 63) // 64
    rows = np.repeat(np.arange(len(col)), np.diff(offsets))
    out = np.zeros((len(col), words), dtype=np.uint64)
    np.bitwise_or.at(out, (rows, values // 64),
                     np.left_shift(np.uint64(1), (values % 64).astype(np.uint64)))
    return out


if hasattr(np, "bitwise_count"):
    def _popcount(x: np.ndarray) -> np.ndarray:
        return np.bitwise_count(x).astype(np.int64)
else:  # numpy < 2: a byte lookup table
    _BYTE_COUNTS = np.array([i.bit_count() for i in range(256)], dtype=np.int64)

    def _popcount(x: np.ndarray) -> np.ndarray:
        return _BYTE_COUNTS[x.view(np.uint8)].reshape(*x.shape, 8).sum(axis=-1)


def match_distribution(workload: Workload, threshold: int = 3, window: float | None = None,
                       bins: int = 20, sample: int = 2000, seed: int = 0) -> dict:
    """The empirical match distributions f_1 (of W_R, probed by S tuples) and f_2 (of W_S,
    probed by R tuples) of Figure 6 (§6.1) on a ``shed`` workload.

    For a random sample of up to ``sample`` tuples t of the probing stream — those at least
    one window after the other stream's first tuple, when there are any, so that every lag
    in [0, w] is compared — compare t with every tuple t_o of the opposite stream with
    0 ≤ T(t) − T(t_o) ≤ w and count the overlap matches |t.s ∩ t_o.s| ≥ ``threshold`` by lag
    bin (``bins`` bins over [0, w]). Returns ``{"window", "threshold", "edges", "f_1",
    "f_2"}``, each f a dict with ``probe`` and ``window_of`` (stream names), ``mass`` (the
    lags of the matches, normalised to sum 1: a density over [0, w] per bin), ``rate`` (per
    bin, matches per comparison), ``match_probability`` (matches per comparison),
    ``comparisons``, ``matches``, ``peak_lag`` (the centre of the fullest bin) and
    ``sampled``.
    """
    threshold = _whole("threshold (overlap threshold)", threshold)
    bins = _whole("bins", bins)
    sample = _whole("sample", sample)
    seed = _check_seed(seed)
    w = float(workload.params.get("window", 0)) if window is None else window
    w = _positive("window (seconds)", w)
    items = int(workload.params.get("items", 100))
    for name in STREAMS:
        if name not in workload.tables or "s" not in workload.tables[name].column_names:
            raise WorkloadError(f"match_distribution needs streams R and S with a set column "
                                f"'s' (a 'shed' workload), got {sorted(workload.tables)}")
    ts = {n: workload.tables[n].column(TIMESTAMP).to_numpy() for n in STREAMS}
    bits = {n: _bitsets(workload.tables[n], items) for n in STREAMS}
    edges = np.linspace(0.0, w, bins + 1)
    rng = np.random.default_rng(seed)
    out: dict[str, Any] = {"window": w, "threshold": threshold, "edges": edges.tolist()}
    for label, probe, other in (("f_1", "S", "R"), ("f_2", "R", "S")):
        t_probe, t_other = ts[probe], ts[other]
        candidates = np.arange(len(t_probe))
        if len(t_other):
            full = candidates[t_probe >= t_other[0] + w]
            candidates = full if len(full) else candidates
        picked = np.sort(rng.choice(candidates, size=min(sample, len(candidates)),
                                    replace=False)) if len(candidates) else candidates
        matches = np.zeros(bins, dtype=np.int64)
        compared = np.zeros(bins, dtype=np.int64)
        lo_idx = np.searchsorted(t_other, t_probe[picked] - w, side="left")
        hi_idx = np.searchsorted(t_other, t_probe[picked], side="right")
        for t, lo, hi in zip(picked, lo_idx, hi_idx, strict=True):
            if hi <= lo:
                continue
            lags = t_probe[t] - t_other[lo:hi]
            common = _popcount(bits[other][lo:hi] & bits[probe][t]).sum(axis=1)
            k = np.minimum((lags / w * bins).astype(np.int64), bins - 1)
            compared += np.bincount(k, minlength=bins)
            matches += np.bincount(k[common >= threshold], minlength=bins)
        total, comps = int(matches.sum()), int(compared.sum())
        mass = matches / total if total else np.zeros(bins)
        rate_ = np.divide(matches, compared, out=np.zeros(bins), where=compared > 0)
        centres = (edges[:-1] + edges[1:]) / 2
        out[label] = {
            "probe": probe, "window_of": other, "mass": mass.tolist(),
            "rate": rate_.tolist(), "match_probability": total / comps if comps else 0.0,
            "comparisons": comps, "matches": total,
            "peak_lag": float(centres[int(np.argmax(mass))]) if total else None,
            "sampled": len(picked),
        }
    return out
