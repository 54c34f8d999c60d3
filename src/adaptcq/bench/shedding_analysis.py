"""Benchmark: the analysis and data checks of load-shedding.txt — Figures 5 and 6 (issue 13).

``fig5`` computes ϕ of §5.1.1 (``adapt/shedding.py``: how close to optimal selective
processing with basic windows of b seconds is when a fraction r' of the windows can be
processed) over a grid of b/w (x) and r' (y), both in (0, 1] and taken in ascending
order, for two match distributions, one more skewed than the other, and prints the paper's
three observations as checks (HOLDS / DOES NOT HOLD; "not measured" for a trend along an
axis given only one value). The distributions (``--source``):

* ``workload`` (default): measured — the match distribution f_2 (R probing the window of S,
  Figure 6's peaked one) of the §6.1 workload at κ = 0.6 (less skewed) and κ = 0.8 (more
  skewed), w = 20 s, ς = 2w, τ = 5/8·ς, by ``match_distribution``: per lag bin the matches
  per comparison, normalised, as a piecewise-constant density (piecewise-linear CDF);
* ``normal``: two normals truncated to [0, w], both centred at 0.75·w (Figure 6's peak),
  standard deviations 0.2·w (less skewed) and 0.05·w (more skewed).

``fig6`` generates the §6.1 workload at κ = 0.6 and 0.8 (w = 20 s, ς = 2w, τ = 5/8·ς),
measures both match distributions — f_2 (R probing W_S, expected peak at lag ς − τ =
0.75·w) and f_1 (S probing W_R, whose matches are τ = 1.25·w back, outside the window:
expected to rise towards lag w) — and prints where the peaks are against the expected lags
("not measured" for a run no longer than w, whose far lags are never observed, or one
without matches).

    python -m adaptcq.bench.shedding_analysis fig5 [--source workload|normal]
        [--ratios 0.02,0.04,...] [--loads 0.05,0.1,...] [--out results/shedding]
    python -m adaptcq.bench.shedding_analysis fig6 [--duration 60] [--rate 500]
        [--sample 2000] [--bins 20] [--out results/shedding]

Writes ``fig5.csv`` (distribution, b_over_w, r_prime, phi), ``fig5_f.csv`` (the two
densities), ``fig5.png`` (fig5) and ``fig6.csv`` (kappa, f, lag bin, mass, rate),
``fig6.png`` (fig6) under OUT.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

from adaptcq.bench._args import nonnegative_int, positive_float, positive_int, refuse_unused
from adaptcq.bench.spark_scale import write_csv  # the benchmarks' one CSV writer

WINDOW = 20.0                      # §6.4: 20 s windows
KAPPAS = (0.6, 0.8)                # Figure 6
NAMES = ("less skewed", "more skewed")
DEFAULT_RATIOS = tuple(round(x, 3) for x in np.arange(0.02, 0.501, 0.02))
DEFAULT_LOADS = tuple(round(x, 3) for x in np.arange(0.05, 1.001, 0.05))


def _floats(text: str, what: str = "value", high: float | None = None,
            why: str = "") -> list[float]:
    """A comma-separated list of finite numbers in (0, ``high``], sorted ascending with
    repeats dropped (the trends of ``fig5_checks`` and the "smallest"/"largest" lines read
    the list in order)."""
    try:
        out = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"a comma-separated list of numbers, got {text!r}") from None
    if not out or any(not np.isfinite(x) or x <= 0 for x in out):
        raise argparse.ArgumentTypeError(f"positive numbers, got {text!r}")
    if high is not None and max(out) > high:
        raise argparse.ArgumentTypeError(
            f"{what} {max(out):g} is above {high:g}: {why}")
    return sorted(set(out))


def _ratios(text: str) -> list[float]:
    """``--ratios``: b/w values in (0, 1]."""
    return _floats(text, "b/w", 1.0, "a basic window cannot be longer than the window "
                   "it divides (Figure 5 spans b/w up to 0.5)")


def _loads(text: str) -> list[float]:
    """``--loads``: r' values in (0, 1]."""
    return _floats(text, "r'", 1.0, "r' is the fraction of the windows that can be "
                   "processed; above 1 nothing is shed and phi is not what Figure 5 plots")


# ----- distributions ---------------------------------------------------------------------------


def density_cdf(edges: list[float], weights: list[float]) -> Callable:
    """The CDF of the piecewise-constant density with ``weights`` (normalised) on the bins
    ``edges``: piecewise linear, F(edges[0]) = 0, F(edges[-1]) = 1."""
    e = np.asarray(edges, dtype=np.float64)
    wts = np.asarray(weights, dtype=np.float64)
    cum = np.concatenate([[0.0], np.cumsum(wts / wts.sum())])
    return lambda y: np.interp(y, e, cum)


def normal_cdf(mu: float, sd: float, w: float) -> Callable:
    """The CDF of Normal(mu, sd) truncated to [0, w]."""
    from scipy.special import ndtr
    lo, hi = ndtr(-mu / sd), ndtr((w - mu) / sd)
    return lambda y: (ndtr((np.clip(y, 0.0, w) - mu) / sd) - lo) / (hi - lo)


def _workload(kappa: float, args):
    from adaptcq.stream.shed_workload import shed_two_way
    return shed_two_way(duration=args.duration, rate=args.rate, window=WINDOW, kappa=kappa,
                        seed=args.seed)


def _distributions(args) -> list[tuple[str, Callable, list[float], list[float], str]]:
    """(name, cdf, edges, density weights, description) for the two distributions."""
    out = []
    if args.source == "normal":
        for name, sd in zip(NAMES, (0.2, 0.05), strict=True):
            cdf = normal_cdf(0.75 * WINDOW, sd * WINDOW, WINDOW)
            edges = np.linspace(0, WINDOW, 41)
            out.append((name, cdf, edges.tolist(), np.diff(cdf(edges)).tolist(),
                        f"normal(0.75w, {sd:g}w) truncated to [0, w]"))
        return out
    from adaptcq.stream.shed_workload import match_distribution
    for name, kappa in zip(NAMES, KAPPAS, strict=True):
        m = match_distribution(_workload(kappa, args), window=WINDOW, bins=args.bins,
                               sample=args.sample, seed=args.seed)
        rate = np.asarray(m["f_2"]["rate"])
        if rate.sum() <= 0:
            raise SystemExit(f"kappa {kappa:g}: no matches measured; raise --duration, "
                             f"--rate or --sample")
        out.append((name, density_cdf(m["edges"], rate.tolist()), m["edges"],
                    (rate / rate.sum()).tolist(),
                    f"f_2 of the §6.1 workload, kappa {kappa:g}"))
    return out


# ----- fig5 ------------------------------------------------------------------------------------


def _slope(x, y) -> float:
    """The least-squares slope of y against x: the trend through the sawtooth that the
    discrete basic windows put on ϕ."""
    return float(np.polyfit(np.asarray(x, dtype=np.float64), np.asarray(y), 1)[0])


def _monotone(ys, sign: int, tol: float = 1e-6) -> bool:
    """Every step of ``ys`` goes the way of ``sign`` (+1 up, −1 down), to ``tol``."""
    return all(sign * (b - a) >= -tol for a, b in itertools.pairwise(ys))


def fig5_checks(grid: dict[str, np.ndarray], ratios: list[float], loads: list[float]
                ) -> list[tuple[str, bool | None, str]]:
    """The paper's three observations on Figure 5 (§5.1.1) as checks on ϕ[b index, r'
    index] per distribution, ``ratios`` and ``loads`` ascending. ϕ is a sawtooth in b/w and
    r' (whether r'·w/b is a whole number of basic windows matters), so a trend is its
    least-squares slope; how often it is also monotone step by step is printed alongside.
    A trend needs at least two values along its axis: with one, the verdict is None (not
    measured) and the detail says which option to widen."""
    less, more = grid[NAMES[0]], grid[NAMES[1]]
    checks: list[tuple[str, bool | None, str]] = []
    # 1. Fewer resources, lower ϕ, for each fixed b: ϕ rises with r'.
    what = "decreasing resources lower the optimality for a fixed basic window size"
    if len(loads) < 2:
        checks.append((what, None, (f"a trend in r' needs at least 2 --loads values, got "
                                   f"{len(loads)}")))
    else:
        cols = [grid[n][k] for n in NAMES for k in range(len(ratios))]
        up = [_slope(loads, c) >= -1e-6 for c in cols]
        step1 = sum(_monotone(c, +1) for c in cols)
        checks.append((what, all(up),
                       (f"phi rises with r' (least-squares slope >= 0) in {sum(up)} of "
                       f"{len(up)} (distribution, b/w) columns; step by step in {step1}")))
    # 2. More skew, lower ϕ, for each fixed b (on average over the loads): a comparison
    # at each b/w, measured from one value on.
    lower = [float(np.mean(more[k])) <= float(np.mean(less[k])) + 1e-9
             for k in range(len(ratios))]
    points = float(np.mean(more <= less + 1e-6))
    excess = float(np.max(more - less, initial=0.0))
    checks.append(("more skew lowers the optimality for a fixed basic window size",
                   all(lower),
                   (f"mean phi over r' lower for the more skewed f at {sum(lower)} of "
                   f"{len(lower)} b/w values; pointwise at {points:.0%} of the grid, "
                   f"elsewhere higher by at most {excess:.3f}")))
    # 3. Smaller basic windows better at low loads (r' <= 0.3) or for the skewed f: ϕ
    # falls with b/w there.
    what = "smaller basic windows are better at low resources or for a skewed f"
    if len(ratios) < 2:
        checks.append((what, None, (f"a trend in b/w needs at least 2 --ratios values, got "
                                   f"{len(ratios)}")))
    else:
        low = [j for j, r in enumerate(loads) if r <= 0.3]
        rows = [grid[n][:, j] for n in NAMES for j in low] + [
            more[:, j] for j in range(len(loads)) if j not in low]
        down = [_slope(ratios, r) <= 1e-6 for r in rows]
        step3 = sum(_monotone(r, -1) for r in rows)
        checks.append((what, all(down),
                       (f"phi falls with b/w (least-squares slope <= 0) in {sum(down)} of "
                       f"{len(down)} rows (r' <= 0.3 for both f, every r' for the skewed "
                       f"one); step by step in {step3}")))
    return checks


def fig5(args) -> int:
    from adaptcq.adapt.shedding import phi
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ratios, loads = list(args.ratios), list(args.loads)
    dists = _distributions(args)
    rows, f_rows, grid = [], [], {}
    for name, cdf, edges, weights, what in dists:
        print(f"{name}: {what}")
        g = np.array([[phi(cdf, WINDOW, x * WINDOW, rp) for rp in loads] for x in ratios])
        grid[name] = g
        rows += [{"distribution": name, "source": what, "b_over_w": x, "r_prime": rp,
                  "phi": round(float(g[k, j]), 6)}
                 for k, x in enumerate(ratios) for j, rp in enumerate(loads)]
        f_rows += [{"distribution": name, "lag_lo": round(lo, 6), "lag_hi": round(hi, 6),
                    "mass": round(m, 6)}
                   for lo, hi, m in zip(edges[:-1], edges[1:], weights, strict=True)]
        print(f"  phi at the smallest b/w ({ratios[0]:g}): "
              + ", ".join(f"r'={rp:g}: {g[0, j]:.3f}" for j, rp in enumerate(loads)
                          if j in (0, len(loads) // 2, len(loads) - 1)))
        print(f"  phi at the largest b/w ({ratios[-1]:g}): "
              + ", ".join(f"r'={rp:g}: {g[-1, j]:.3f}" for j, rp in enumerate(loads)
                          if j in (0, len(loads) // 2, len(loads) - 1)))
    write_csv(rows, out / "fig5.csv")
    write_csv(f_rows, out / "fig5_f.csv")
    _plot_fig5(out / "fig5.png", grid, ratios, loads)
    checks = fig5_checks(grid, ratios, loads)
    for what, ok, detail in checks:
        verdict = "not measured" if ok is None else "HOLDS" if ok else "DOES NOT HOLD"
        print(f"paper's observation: {what}: {verdict} ({detail})")
    measured = [ok for _, ok, _ in checks if ok is not None]
    unmeasured = len(checks) - len(measured)
    print(f"{sum(measured)} of {len(measured)} "
          + (f"measured observations hold ({unmeasured} not measured)" if unmeasured
             else "observations hold")
          + f"; files under {out}")
    return 0


def _plot_fig5(path: Path, grid, ratios, loads) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig = plt.figure(figsize=(11, 4.8))
    x, y = np.meshgrid(ratios, loads, indexing="ij")
    for k, name in enumerate(NAMES):
        ax = fig.add_subplot(1, 2, k + 1, projection="3d")
        ax.plot_surface(x, y, grid[name], cmap="viridis", vmin=0, vmax=1)
        ax.set_xlabel("b / w")
        ax.set_ylabel("r'")
        ax.set_zlabel("phi")
        ax.set_zlim(0, 1)
        ax.set_title(f"Figure 5: {name} f")
    plt.tight_layout()
    plt.savefig(path, dpi=110)
    plt.close()


# ----- fig6 ------------------------------------------------------------------------------------


def fig6(args) -> int:
    from adaptcq.stream.shed_workload import match_distribution
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows, results, verdicts = [], {}, []
    # Lags up to w are observed only by probes w seconds into the workload: a shorter one
    # leaves the far lag bins without a comparison, and every peak would sit too early.
    short = (f"a --duration of {args.duration:g} s does not fill the w = {WINDOW:g} s "
             f"windows: lags up to w are not observed; give more than {WINDOW:g}"
             if args.duration <= WINDOW else None)
    cycle = 2 * WINDOW
    shift = 5 / 8 * cycle
    expect = {"f_2": cycle - shift, "f_1": WINDOW}
    for kappa in KAPPAS:
        wl = _workload(kappa, args)
        m = match_distribution(wl, window=WINDOW, bins=args.bins, sample=args.sample,
                               seed=args.seed)
        results[kappa] = m
        width = WINDOW / args.bins
        print(f"kappa {kappa:g}: {wl.n_updates:,} tuples over {wl.params['duration']:g} s, "
              f"w = {WINDOW:g} s, cycle = {cycle:g} s, shift = {shift:g} s")
        for f in ("f_2", "f_1"):
            d = m[f]
            rows += [{"kappa": f"{kappa:g}", "f": f, "probe": d["probe"],
                      "window_of": d["window_of"], "lag_lo": round(lo, 6),
                      "lag_hi": round(hi, 6), "mass": round(x, 6), "rate": d["rate"][k]}
                     for k, (lo, hi, x) in enumerate(zip(m["edges"][:-1], m["edges"][1:],
                                                         d["mass"], strict=True))]
            ok = None if short or d["peak_lag"] is None else \
                abs(d["peak_lag"] - expect[f]) <= 1.5 * width
            verdicts.append(ok)
            why = ("cycle - shift" if f == "f_2" else
                   "matches are shift = 1.25w back, out of the window: the edge, lag w")
            peak = "none" if d["peak_lag"] is None else f"{d['peak_lag']:g} s"
            print(f"  {f} ({d['probe']} probing W_{d['window_of']}): peak at lag {peak}, "
                  f"expected {expect[f]:g} s ({why}): {_verdict(ok, short, d)}; "
                  f"peak mass {max(d['mass']):.3f}, "
                  f"match probability {d['match_probability']:.2e} per comparison "
                  f"({d['matches']:,} matches, {d['sampled']:,} probes)")
    f2 = [results[k]["f_2"] for k in KAPPAS]
    empty = next((d for d in f2 if not d["matches"]), None)
    more = None if short or empty else max(f2[1]["mass"]) > max(f2[0]["mass"])
    verdicts.append(more)
    print(f"paper's observation: kappa {KAPPAS[1]:g} is more skewed than {KAPPAS[0]:g} "
          f"(higher peak of f_2): {_verdict(more, short, empty or f2[0])}")
    write_csv(rows, out / "fig6.csv")
    _plot_fig6(out / "fig6.png", results)
    measured = [ok for ok in verdicts if ok is not None]
    unmeasured = len(verdicts) - len(measured)
    print(f"{sum(measured)} of {len(measured)} "
          + (f"measured checks hold ({unmeasured} not measured)" if unmeasured
             else "checks hold") + f"; files under {out}")
    return 0


def _verdict(ok: bool | None, short: str | None, d: dict) -> str:
    """A fig6 check's verdict; "not measured" with the reason where the run cannot tell:
    ``short`` (the windows never filled) or no matches in ``d`` (no peak to place)."""
    if ok is not None:
        return "HOLDS" if ok else "DOES NOT HOLD"
    return "not measured (" + (short or "no matches measured; raise --duration, --rate or "
                               "--sample") + ")"


def _plot_fig6(path: Path, results) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    _fig, axes = plt.subplots(1, len(results), figsize=(11, 4), sharey=True)
    for ax, (kappa, m) in zip(np.atleast_1d(axes), results.items(), strict=True):
        edges = np.asarray(m["edges"])
        width = edges[1] - edges[0]
        for f, color in (("f_2", "tab:blue"), ("f_1", "tab:orange")):
            d = m[f]
            ax.bar(edges[:-1], d["mass"], width=width, align="edge", alpha=0.6, color=color,
                   label=f"{f}: {d['probe']} probing W_{d['window_of']}")
        ax.set_xlabel("lag T(t) - T(t_o) (seconds)")
        ax.set_title(f"Figure 6: kappa = {kappa:g}")
        ax.legend()
    np.atleast_1d(axes)[0].set_ylabel("share of matches per bin")
    plt.tight_layout()
    plt.savefig(path, dpi=110)
    plt.close()


# ----- command line ----------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="python -m adaptcq.bench.shedding_analysis",
                                description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    f5 = sub.add_parser("fig5", help="phi of §5.1.1 over b/w and r' (Figure 5)")
    f5.add_argument("--source", choices=("workload", "normal"), default="workload",
                    help="the two match distributions: measured on the §6.1 workload at "
                    "kappa 0.6 and 0.8 (default), or two truncated normals")
    f5.add_argument("--ratios", type=_ratios, default=list(DEFAULT_RATIOS),
                    help="b/w values in (0, 1], comma-separated, taken in ascending order "
                    "(default 0.02 .. 0.5); the b/w trend needs at least 2")
    f5.add_argument("--loads", type=_loads, default=list(DEFAULT_LOADS),
                    help="r' values in (0, 1], comma-separated, taken in ascending order "
                    "(default 0.05 .. 1); the r' trend needs at least 2")
    f6 = sub.add_parser("fig6", help="the match distributions of the §6.1 workload")
    for sp in (f5, f6):
        what = "with --source workload" if sp is f5 else "the §6.1 workload"
        sp.add_argument("--duration", type=positive_float, default=60.0,
                        help=f"{what}: seconds of workload generated (default 60)")
        sp.add_argument("--rate", type=positive_float, default=500.0,
                        help=f"{what}: tuples per second per stream (default 500)")
        sp.add_argument("--sample", type=positive_int, default=2000,
                        help=f"{what}: probing tuples sampled per direction (default 2000)")
        sp.add_argument("--bins", type=positive_int, default=20,
                        help=f"{what}: lag bins over [0, w] (default 20)")
        sp.add_argument("--seed", type=nonnegative_int, default=0,
                        help=f"{what}: seed of the workload and the sample (default 0)")
        sp.add_argument("--out", default="results/shedding",
                        help="folder for the CSV and PNG files (default %(default)s)")
    args = p.parse_args(argv)
    if args.what == "fig5" and args.source == "normal":
        # the normals are fixed: no workload is generated or measured
        refuse_unused(f5, ("duration", "rate", "sample", "bins", "seed"),
                      "with --source normal (the workload's options)",
                      argv=argv[argv.index("fig5") + 1:])  # (f5 parses what follows fig5)
    return {"fig5": fig5, "fig6": fig6}[args.what](args)


if __name__ == "__main__":
    sys.exit(main())
