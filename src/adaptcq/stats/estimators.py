"""Online estimators with one tiny interface: ``update(...)`` and ``get()``.

a-caching.txt Table 1 and Appendix A: "our online estimate of any statistic is the average
of its W most recent measurements" (default W = 10, §7.1). Each estimator here is one such
statistic; ``ready`` says whether W observations have been seen (§4.5 step 2).
"""

from __future__ import annotations

import math
from collections import deque

W_DEFAULT = 10  # a-caching.txt §7.1: default window W for statistics


class WindowAverage:
    """The average of the W most recent observations (a-caching.txt Table 1)."""

    __slots__ = ("W", "_mean", "_values", "n")

    def __init__(self, W: int = W_DEFAULT):
        if W < 1:
            raise ValueError("W must be at least 1")
        self.W = W
        self._values: deque[float] = deque(maxlen=W)
        self.n = 0  # observations ever seen
        self._mean: float | None = 0.0  # get()'s value until the next update

    def update(self, x: float) -> WindowAverage:
        self._values.append(x)
        self.n += 1
        self._mean = None
        return self

    def get(self) -> float:
        # fsum over at most W values: exact enough, and no drift over a long run. Kept
        # until the next update: a policy reads the same estimate many times per tick.
        try:
            mean = self._mean
        except AttributeError:  # pickled before the slot existed (a Spark checkpoint)
            mean = None
        if mean is None:
            mean = self._mean = math.fsum(self._values) / len(self._values)
        return mean

    def sum(self) -> float:
        return math.fsum(self._values)

    @property
    def ready(self) -> bool:
        return len(self._values) >= self.W


class Ratio:
    """Σ numerators / Σ denominators over the W most recent observations: a selectivity
    measured as matches per (probe × window tuple), batch by batch (the vectorized
    executor's per-batch ordering; join-ordering.txt §2.2's σ)."""

    __slots__ = ("W", "_obs", "n")

    def __init__(self, W: int = W_DEFAULT):
        if W < 1:
            raise ValueError("W must be at least 1")
        self.W = W
        self._obs: deque[tuple[float, float]] = deque(maxlen=W)
        self.n = 0

    def update(self, num: float, den: float) -> Ratio:
        if den > 0:
            self._obs.append((num, den))
            self.n += 1
        return self

    def get(self) -> float:
        den = math.fsum(d for _, d in self._obs)
        return math.fsum(x for x, _ in self._obs) / den if den > 0 else 0.0

    @property
    def ready(self) -> bool:
        return len(self._obs) >= 1


class Rate:
    """Tuples per unit time of one stream: the average of the W most recent
    (count, elapsed) measurements, as count / elapsed over them (Appendix A's rate(R_i))."""

    __slots__ = ("W", "_last", "_obs", "_rate")

    def __init__(self, W: int = W_DEFAULT):
        self.W = W
        self._obs: deque[tuple[float, float]] = deque(maxlen=W)
        self._last: tuple[float, float] | None = None
        self._rate: float | None = 0.0  # get()'s value until the next measurement

    def update(self, count: float, ts: float) -> Rate:
        """``count``: tuples of the stream processed so far (cumulative); ``ts``: now."""
        if self._last is not None and ts > self._last[1]:
            self._obs.append((count - self._last[0], ts - self._last[1]))
            self._rate = None
        if self._last is None or ts > self._last[1]:
            self._last = (count, ts)
        return self

    def get(self) -> float:
        try:
            rate = self._rate
        except AttributeError:  # pickled before the slot existed (a Spark checkpoint)
            rate = None
        if rate is None:  # (kept until the next measurement: read many times per tick)
            elapsed = sum(e for _, e in self._obs)
            rate = self._rate = sum(c for c, _ in self._obs) / elapsed if elapsed > 0 else 0.0
        return rate

    @property
    def ready(self) -> bool:
        return len(self._obs) >= self.W


class BloomMissRate:
    """Estimated miss probability of a cache that is not in use (a-caching.txt §4.3, App. A).

    The stream of probe keys is cut into nonoverlapping windows of ``W_d`` keys; each window
    hashes its keys into a Bloom filter of ``alpha * W_d`` bits (alpha >= 1). With b bits set
    at the end of a window, b distinct keys were probed and each missed once: the window's
    observation is b / W_d. The estimate is the average of the W most recent observations.

    ``observe`` (a list's ``append``: no Python frame per probe, which in a compiled
    pipeline cost about as much as the probe) queues keys; they are hashed into the windows,
    in order, when an estimate is read, so the estimates are those of hashing each key as it
    came.
    """

    __slots__ = ("W_d", "_avg", "_open", "_pending", "_seen", "bits", "observe")

    def __init__(self, W_d: int = 100, alpha: float = 4.0, W: int = W_DEFAULT):
        if alpha < 1:
            raise ValueError("alpha must be at least 1 (App. A: alpha * W_d bits, alpha >= 1)")
        self.W_d = W_d
        self.bits = max(1, int(alpha * W_d))
        # The open window's filter, as the set of its bit positions that are set: the bits
        # set at a window's end are the distinct positions its keys hashed to.
        self._open: set[int] = set()
        self._seen = 0
        self._avg = WindowAverage(W)
        self._pending: list = []
        self.observe = self._pending.append

    def update(self, key) -> BloomMissRate:
        self._pending.append(key)
        return self

    @property
    def avg(self) -> WindowAverage:
        """The window observations b / W_d (the queued keys hashed first)."""
        self.flush()
        return self._avg

    def flush(self) -> None:
        """Hash the queued keys into their windows (the owner calls it now and then, so
        that the queue stays short when no estimate is read for a while). A window's
        bits are a set of positions filled a slice at a time (no Python step per key:
        this ran at every tick of A-Caching while candidates were profiled)."""
        pending = self._pending
        if not pending:
            return
        bits, W_d, avg = self.bits, self.W_d, self._avg
        hashed = [hash(k) % bits for k in pending]
        pending.clear()  # (cleared, not replaced: ``observe`` appends to this list)
        i, n = 0, len(hashed)
        window, seen = self._open, self._seen
        while i < n:
            take = min(W_d - seen, n - i)
            window.update(hashed[i:i + take])
            seen += take
            i += take
            if seen == W_d:
                avg.update(len(window) / W_d)
                window = set()
                seen = 0
        self._open, self._seen = window, seen

    def distinct(self) -> float:
        """Estimated distinct keys per window of W_d probes (for cache memory needs)."""
        return self.avg.get() * self.W_d

    def get(self) -> float:
        return self.avg.get()

    @property
    def ready(self) -> bool:
        return self.avg.ready
