"""Online statistics for CPU load shedding (load-shedding.txt §4.1, §5.1), in the
``update``/``get`` shape of the other estimators.

* :class:`PeriodCount` — events counted since the last adaptation step (α_i of
  Algorithm 1; arrivals for λ_i), reset by the step that reads them.
* :class:`BasicWindowMatches` — ô_{i,j} of Algorithms 2–3: matches found by fully processed
  tuples in each basic window position of one window, per time-correlation period.
* :class:`HorvitzThompson` — the unbiased estimate of a total from a sample drawn with
  known inclusion probabilities π (each fully processed tuple is drawn with π = r·γ): it
  estimates the output the join would have produced with every tuple fully processed, so
  that a run can say which fraction of the results load shedding lost, with a confidence
  interval (beyond the paper, which reports output rates only).
"""

from __future__ import annotations

import math


class PeriodCount:
    """A count since the last :meth:`take` (one adaptation period)."""

    __slots__ = ("n",)

    def __init__(self) -> None:
        self.n = 0

    def update(self, k: int = 1) -> None:
        self.n += k

    def get(self) -> int:
        return self.n

    def take(self) -> int:
        """The count, and a new period begins."""
        n, self.n = self.n, 0
        return n


class BasicWindowMatches:
    """ô_{i,j}: matches per basic-window position j (0 = the newest) found by the fully
    processed tuples of one time-correlation period (Algorithm 3, lines 2–5)."""

    __slots__ = ("counts",)

    def __init__(self, n: int) -> None:
        self.counts = [0.0] * n

    def update(self, j: int, matches: int) -> None:
        self.counts[j] += matches

    def get(self) -> list[float]:
        return list(self.counts)

    def take(self) -> list[float]:
        """The counts, reset for the next period (Algorithm 2, lines 7–8)."""
        out = self.counts
        self.counts = [0.0] * len(out)
        return out


class HorvitzThompson:
    """Σ y over a population from a sample where each unit was drawn independently with
    probability π: the estimate Σ y/π is unbiased, its variance estimated by
    Σ (1 − π)·y²/π² (Horvitz and Thompson, 1952).

    Units with π = 1 are counted exactly. Of the others, ``estimated`` counts the units
    drawn or not (``skip``) and ``hits`` the drawn ones with y > 0: the variance estimate
    is only as good as the hits behind it (from no hit it is 0, an empty sample claiming
    certainty), so ``measured`` asks for enough of them."""

    __slots__ = ("estimated", "hits", "n", "total", "var")

    def __init__(self) -> None:
        self.total = 0.0
        self.var = 0.0
        self.n = 0
        self.estimated = 0
        self.hits = 0

    def update(self, y: float, pi: float) -> None:
        if pi <= 0.0:
            raise ValueError(f"an inclusion probability must be positive, got {pi}")
        self.total += y / pi
        self.var += (1.0 - pi) * y * y / (pi * pi)
        self.n += 1
        if pi < 1.0:
            self._sampled(1, 1 if y > 0 else 0)

    def skip(self) -> None:
        """A unit of the population that was not drawn (its y is estimated)."""
        self._sampled(1, 0)

    def __setstate__(self, state) -> None:
        # An estimator pickled before ``estimated`` and ``hits`` existed has neither: 0.
        self.estimated = self.hits = 0
        slots = state[1] if isinstance(state, tuple) else state
        for name, value in (slots or {}).items():
            setattr(self, name, value)

    def _sampled(self, units: int, hits: int) -> None:
        self.estimated += units
        self.hits += hits

    def measured(self, min_hits: int) -> bool:
        """Whether the estimate rests on counts alone, or on at least ``min_hits``
        drawn units with y > 0."""
        return self.estimated == 0 or self.hits >= min_hits

    def get(self) -> float:
        return self.total

    def stderr(self) -> float:
        return math.sqrt(self.var)
