"""The Profiler of a-caching.txt Figure 4: online statistics of a running MJoin.

Everything here is *statistics*: it reads profiled tuples (``engine.mjoin.Observation``,
produced by the executor for a sample of insertions) and periodic ticks, and never changes
the plan. Policies in ``adapt/`` read it and ask the executor to change its plan.

Every estimate is "the average of its W most recent measurements" (a-caching.txt Table 1,
§4.3; W = 10 by default, §7.1). Per pipeline (:class:`PipelineStats`, for its *current*
order):

* δ_j and τ_j of each join operator ⋈_{i_j} (Appendix A): tuples it processed for one
  profiled tuple, and seconds spent in it; d_ij = rate(R_i) · sum(δ_j)/W and
  c_ij = sum(τ_j)/sum(δ_j);
* the conditional fan-out of every stream s not yet joined before position k: matches of s
  per tuple reaching position k, given the prefix (the conditional selectivities of
  A-Greedy's greedy invariant, Babu et al. [5] of a-caching.txt). Estimated as
  sum(matches)/sum(δ_k) over the W most recent profiled tuples *that reach position k*
  (δ_k > 0): a tuple that never reaches position k says nothing about fan-outs there. (Our
  choice; [5] keeps a window of profiled tuples evaluated against every filter, which for
  joins is only possible at the first position.)
* σ_is, the pairwise join selectivities the optimizer's cost model needs
  (join-ordering.txt §2.2): at position 0 a profiled R_i tuple is the whole prefix, so its
  matches of s divided by |R_s| (the size of s's SteM at that moment) is one observation of
  σ_is.

Per stream (:class:`Profiler`): rate(R_i) from the insertions counted by the running query
(``ContinuousQuery.per_stream``) at periodic ticks, and the state size |R_i|.
:func:`join_graph_from_stats` turns all of it into the optimizer's :class:`JoinGraph`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence

from adaptcq.stats.estimators import W_DEFAULT, Rate, WindowAverage

#: Default profiling probability p_i (a-caching.txt Appendix A). Our choice: the papers
#: give no value; 2% keeps the profiling overhead to a few percent of the run (see
#: docs/adaptive-ordering.md).
P_DEFAULT = 0.02
#: Default tick interval, in arrivals, for rates and state sizes (our choice).
INTERVAL_DEFAULT = 1000


class WindowRatio:
    """sum(numerators)/sum(denominators) over the W most recent (num, den) observations:
    the ratio-of-sums form of a-caching.txt Appendix A's c_ij = sum(τ_j)/sum(δ_j).

    Running sums make ``get`` O(1) (it is read on every invariant check); the values it
    is given are tuple counts, so the sums stay exact."""

    __slots__ = ("W", "_den", "_num", "_obs", "n")

    def __init__(self, W: int = W_DEFAULT):
        if W < 1:
            raise ValueError("W must be at least 1")
        self.W = W
        self._obs: deque[tuple[float, float]] = deque()
        self._num = 0.0
        self._den = 0.0
        self.n = 0  # observations ever seen

    def update(self, num: float, den: float) -> WindowRatio:
        obs = self._obs
        if len(obs) == self.W:
            old_num, old_den = obs.popleft()
            self._num -= old_num
            self._den -= old_den
        obs.append((num, den))
        self._num += num
        self._den += den
        self.n += 1
        return self

    def get(self) -> float | None:
        """The ratio, or None while the denominators sum to 0 (nothing to estimate from)."""
        return self._num / self._den if self._den > 0 else None

    def __len__(self) -> int:
        return len(self._obs)

    @property
    def ready(self) -> bool:
        return len(self._obs) >= self.W

    def reset(self) -> None:
        self._obs.clear()
        self._num = self._den = 0.0


class PipelineStats:
    """Statistics of one MJoin pipeline ΔR_i: ⋈_{i_1}, …, ⋈_{i_(n-1)} for its current order.

    Position k (0-based) is the operator joining ``order[k]``. ``set_order`` keeps the
    statistics of the positions before the first change (their prefixes are unchanged, so
    are their δ, τ and fan-outs) and resets the rest. The σ observations from position 0
    do not depend on the order and are never reset.
    """

    def __init__(self, stream: str, order: Sequence[str], W: int = W_DEFAULT):
        self.stream = stream
        self.W = W
        self.order: tuple[str, ...] = tuple(order)
        n = len(self.order)
        self.delta = [WindowAverage(W) for _ in range(n)]
        self.tau = [WindowAverage(W) for _ in range(n)]
        self.fanouts: list[dict[str, WindowRatio]] = [
            {s: WindowRatio(W) for s in self.order[k:]} for k in range(n)]
        self.sigma: dict[str, WindowAverage] = {s: WindowAverage(W) for s in self.order}
        self.observations = 0  # profiled tuples since the pipeline was created

    # ----- plan changes ------------------------------------------------------------------
    def set_order(self, order: Sequence[str]) -> int | None:
        """Follow a re-ordering: returns the first changed position k (None if unchanged)
        and resets the statistics of positions k, k+1, … ."""
        order = tuple(order)
        if sorted(order) != sorted(self.order):
            raise ValueError(f"pipeline {self.stream}: {list(order)} is not a permutation "
                             f"of {list(self.order)}")
        k = next((j for j, (a, b) in enumerate(zip(order, self.order)) if a != b), None)
        if k is None:
            return None
        self.order = order
        for j in range(k, len(order)):
            self.delta[j] = WindowAverage(self.W)
            self.tau[j] = WindowAverage(self.W)
            self.fanouts[j] = {s: WindowRatio(self.W) for s in order[j:]}
        return k

    # ----- observations ------------------------------------------------------------------
    def update(self, obs, sizes: Mapping[str, int] | None = None) -> PipelineStats:
        """Add one profiled tuple's ``Observation`` (its order must be the current one).

        ``sizes``: |R_s| per stream when the tuple was profiled, for the σ observations;
        without it σ is not updated."""
        if obs.stream != self.stream or tuple(obs.order) != self.order:
            raise ValueError(f"observation of {obs.stream} along {list(obs.order)} does not "
                             f"match pipeline {self.stream} along {list(self.order)}")
        self.observations += 1
        for k, (d, t) in enumerate(zip(obs.delta, obs.tau)):
            self.delta[k].update(d)
            self.tau[k].update(t)
            if d > 0 and k < len(obs.fanout):
                for s, matches in obs.fanout[k].items():
                    self.fanouts[k][s].update(matches, d)
        if sizes is not None and obs.fanout and obs.delta and obs.delta[0] > 0:
            for s, matches in obs.fanout[0].items():
                size = sizes.get(s, 0)
                if size > 0:
                    self.sigma[s].update(matches / (obs.delta[0] * size))
        return self

    # ----- estimates ---------------------------------------------------------------------
    def reached(self, k: int) -> int:
        """Profiled tuples (within the last W that did) reaching position k since the
        statistics there were last reset."""
        return len(next(iter(self.fanouts[k].values())))

    def ready(self, k: int) -> bool:
        """W profiled tuples reached position k since its last reset (a-caching.txt §4.5
        step 2: act only on statistics with W observations)."""
        return self.reached(k) >= self.W

    def fanout(self, k: int, s: str) -> float | None:
        """Conditional fan-out of ``s`` at position k: its matches per tuple reaching k,
        given the prefix order[:k] (None before any tuple reached k)."""
        return self.fanouts[k][s].get()

    def d(self, k: int, rate: float) -> float:
        """d_ij = rate(R_i) · sum(δ_j)/W (Appendix A): tuples per unit time processed by
        the operator at position k. (The average over the window, i.e. /len while the
        window is not yet full.)"""
        return rate * self.delta[k].get()

    def c(self, k: int) -> float | None:
        """c_ij = sum(τ_j)/sum(δ_j) (Appendix A): seconds per tuple at position k."""
        den = self.delta[k].sum()
        return self.tau[k].sum() / den if den > 0 else None

    def selectivity(self, s: str) -> tuple[float, int] | None:
        """(sum, count) of the σ_(stream, s) observations in the window, or None."""
        avg = self.sigma.get(s)
        count = _count(avg)
        return (avg.sum(), count) if count else None


def _count(avg: WindowAverage | None) -> int:
    """Observations in a never-reset WindowAverage's window."""
    return 0 if avg is None else min(avg.n, avg.W)


class Profiler:
    """All statistics of one running MJoin query (the Profiler of a-caching.txt Fig. 4).

    It can be attached to a ``ContinuousQuery`` on its own (it has the policy hooks but
    changes nothing: ``adaptcq explain`` uses it that way), or be owned by a policy that
    forwards its hooks (``adapt.reorder``).

    * ``sample_probability`` — p_i of Appendix A (the same for every pipeline);
    * ``interval`` — arrivals between ticks, at which rates and state sizes are measured;
    * ``W`` — the number of recent observations every estimate averages.
    """

    def __init__(self, W: int = W_DEFAULT, p: float = P_DEFAULT,
                 interval: int = INTERVAL_DEFAULT, seed: int = 0):
        if W < 1:
            raise ValueError("W must be at least 1")
        if not 0 <= p <= 1:
            raise ValueError(f"the profiling probability p must be in [0, 1], got {p!r}")
        if interval < 1:
            raise ValueError(f"the tick interval must be at least 1 arrival, got {interval!r}")
        self.W = W
        self.sample_probability = p
        self.interval = interval
        self.seed = seed
        self.query = None
        self.pipelines: dict[str, PipelineStats] = {}
        self.rates: dict[str, Rate] = {}
        self.sizes: dict[str, WindowAverage] = {}
        self.ticks = 0

    # ----- set-up ------------------------------------------------------------------------
    def bind(self, executor) -> Profiler:
        """Start profiling ``executor`` (an MJoin) with its current orders."""
        if self.query is executor.query:
            return self
        self.query = executor.query
        self.pipelines = {a: PipelineStats(a, executor.orders[a], self.W)
                          for a in self.query.aliases}
        self.rates = {a: Rate(self.W) for a in self.query.aliases}
        self.sizes = {a: WindowAverage(self.W) for a in self.query.aliases}
        return self

    # ----- the policy hooks (observing only) ---------------------------------------------
    def on_profile(self, cq, obs, ts) -> PipelineStats:
        return self.observe(obs, cq.executor)

    def on_interval(self, cq, ts) -> None:
        self.tick(cq.per_stream, cq.executor, ts)

    # ----- updates -----------------------------------------------------------------------
    def observe(self, obs, executor) -> PipelineStats:
        """Add a profiled tuple; follows a re-ordering of its pipeline first (resetting the
        positions from the first change on). Returns the pipeline's statistics."""
        self.bind(executor)
        stats = self.pipelines[obs.stream]
        if tuple(obs.order) != stats.order:
            stats.set_order(obs.order)
        sizes = {stem.name: len(stem) for stem in executor.stems}
        return stats.update(obs, sizes)

    def tick(self, per_stream: Sequence[int], executor, ts: float) -> None:
        """Measure rates (insertions so far per stream, at event time ``ts``) and state
        sizes |R_i|."""
        self.bind(executor)
        self.ticks += 1
        for a, count, stem in zip(self.query.aliases, per_stream, executor.stems):
            self.rates[a].update(count, ts)
            self.sizes[a].update(len(stem))

    # ----- estimates ---------------------------------------------------------------------
    def rate(self, s: str) -> float:
        """rate(R_s): insertions per second of event time, over the last W ticks."""
        return self.rates[s].get()

    def state_size(self, s: str) -> float:
        """|R_s|: the average SteM size over the last W ticks."""
        return self.sizes[s].get()

    def selectivity(self, a: str, b: str) -> float | None:
        """σ_ab: the average of the position-0 observations of both pipelines ΔR_a (matches
        in R_b) and ΔR_b (matches in R_a), W most recent of each; None without any."""
        total, n = 0.0, 0
        for x, y in ((a, b), (b, a)):
            got = self.pipelines[x].selectivity(y) if x in self.pipelines else None
            if got is not None:
                total += got[0]
                n += got[1]
        return total / n if n else None

    def sigma_floor(self, a: str, b: str) -> float:
        """A positive stand-in for a measured σ_ab of 0 (no match seen): half a match over
        all the probes observed, 0.5/Σ|R| (a continuity correction; our choice, since the
        cost model needs σ > 0)."""
        probes = 0.0
        for x, y in ((a, b), (b, a)):
            avg = self.pipelines[x].sigma.get(y) if x in self.pipelines else None
            probes += _count(avg) * max(1.0, self.state_size(y))
        return 0.5 / probes if probes > 0 else 1.0

    def observations_at_start(self) -> dict[str, int]:
        """Per pipeline, profiled tuples in its position-0 window (at most W)."""
        return {a: (p.reached(0) if p.order else self.W) for a, p in self.pipelines.items()}

    def ready(self) -> bool:
        """W observations at position 0 of every pipeline and W rate measurements of every
        stream (a-caching.txt §4.5 step 2), so the optimizer can be run."""
        if self.query is None:
            return False
        return (all(p.ready(0) for p in self.pipelines.values() if p.order)
                and all(r.ready for r in self.rates.values()))


#: Rates below this are treated as this (the cost model needs λ > 0).
MIN_RATE = 1e-9


def common_range(query) -> float | None:
    """The window length w when every stream has the same ``[RANGE w]`` window, else None."""
    sizes = {(s.window.kind, s.window.size) for s in query.streams}
    if len(sizes) == 1:
        kind, size = next(iter(sizes))
        if kind == "range" and size and size > 0:
            return float(size)
    return None


def join_graph_from_stats(query, profile: Profiler, *, c_insert: float = 1.0,
                          c_delete: float = 1.0, c_join: float = 1.0):
    """The optimizer's join graph (join-ordering.txt §2.1–2.2) from measured statistics.

    * λ_i — measured rate(R_i) (insertions per second of event time);
    * σ_ij — :meth:`Profiler.selectivity` for every pair the query joins (its join graph's
      edges); 0 measured becomes :meth:`Profiler.sigma_floor`, none measured becomes 1
      (nothing known: the pessimistic value);
    * W — when every stream has the same ``[RANGE w]`` window, w (so λ_i·W is the expected
      state size). Otherwise (``[ROWS n]``, unbounded, or different ranges) one W cannot
      make λ_i·W the state size of every stream. Each pipeline's *order* depends only on
      the state sizes λ_j·W of the other streams and the σ's (λ_start scales the whole
      pipeline, Eq. 2), so we keep the measured state sizes exact: W = Σ|R_j| / Σ rate(R_j)
      and λ_j = |R_j| / W. Orders are then those for the true state sizes; the plan's total
      cost weighs pipelines by λ_j ∝ |R_j| rather than by the true rates.

    Unit costs default to 1 (Table 1's C_insert, C_delete, C_join).
    """
    from adaptcq.optimizer import JoinGraph

    aliases = query.aliases
    rates = {a: max(MIN_RATE, profile.rate(a)) for a in aliases}
    window = common_range(query)
    if window is None:
        sizes = {a: profile.state_size(a) for a in aliases}
        total_rate = sum(profile.rate(a) for a in aliases)
        if sum(sizes.values()) > 0 and total_rate > 0:
            window = sum(sizes.values()) / total_rate
            rates = {a: max(MIN_RATE, sizes[a] / window) for a in aliases}
        else:
            window = 1.0
    sel = {}
    for a, b in query.join_graph.edges():
        sigma = profile.selectivity(a, b)
        if sigma is None:
            sigma = 1.0
        elif sigma <= 0:
            sigma = profile.sigma_floor(a, b)
        sel[frozenset((a, b))] = min(1.0, sigma)
    return JoinGraph(rates, sel, window=window, c_insert=c_insert, c_delete=c_delete,
                     c_join=c_join)
