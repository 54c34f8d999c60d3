"""The Profiler of a-caching.txt Figure 4: online statistics of a running MJoin.

Everything here is *statistics*: it reads profiled tuples (``engine.interp.Observation``,
produced by the executor for a sample of insertions) and periodic ticks, and never changes
the plan. Policies in ``adapt/`` read it and ask the executor to change its plan. A running
query has **one** Profiler (``ContinuousQuery.profiler``), fed by the query itself — every
observation once, one tick per interval — and shared by all its policies.

Every estimate is "the average of its W most recent measurements" (a-caching.txt Table 1,
§4.3; W = 10 by default, §7.1). Per pipeline (:class:`PipelineStats`, for its *current*
order):

* δ_j and the work w_j of each join operator ⋈_{i_j} (Appendix A, with work units for
  τ_j): tuples it processed for one profiled tuple, and the work units it did for them
  (the executor's virtual work clock: one per probe, one per bucket entry scanned);
  d_ij = rate(R_i) · sum(δ_j)/W and c_ij = sum(w_j)/sum(δ_j), work units per tuple —
  counted, so deterministic and the same on every machine (Appendix A times τ_j in
  seconds instead);
* the output per profiled tuple (the rate past the last operator, d_{i,n} for caches
  that end there);
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
``adapt.graph.join_graph_from_stats`` turns all of it into the optimizer's ``JoinGraph``.
"""

from __future__ import annotations

import numbers
from collections import deque
from collections.abc import Mapping, Sequence

from adaptcq.checks import is_real
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


class PipelineStats:
    """Statistics of one MJoin pipeline ΔR_i: ⋈_{i_1}, …, ⋈_{i_(n-1)} for its current order.

    Position k (0-based) is the operator joining ``order[k]``. ``set_order`` keeps the
    statistics of the positions before the first change (their prefixes are unchanged, so
    are their δ, work and fan-outs) and resets the rest. The σ observations from position
    0 and the output per tuple do not depend on the order and are never reset.
    """

    def __init__(self, stream: str, order: Sequence[str], W: int = W_DEFAULT):
        self.stream = stream
        self.W = W
        self.order: tuple[str, ...] = tuple(order)
        n = len(self.order)
        self.delta = [WindowAverage(W) for _ in range(n)]
        self.work = [WindowRatio(W) for _ in range(n)]  # (work units, δ) per observation
        self.results = WindowAverage(W)                  # output rows per profiled tuple
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
            self.work[j] = WindowRatio(self.W)
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
        self.results.update(obs.results)
        work = obs.work
        for k, d in enumerate(obs.delta):
            self.delta[k].update(d)
            if k < len(work):
                self.work[k].update(work[k], d)
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
        """c_ij = sum(w_j)/sum(δ_j) over the W most recent observations: work units per
        tuple at position k (Appendix A's sum(τ_j)/sum(δ_j) on the work clock); None while
        no tuple reached position k in the window."""
        return self.work[k].get()

    def output(self) -> float | None:
        """Output rows per profiled tuple (None before any observation)."""
        return self.results.get() if self.results.n else None

    def selectivity(self, s: str) -> tuple[float, int] | None:
        """(sum, count) of the σ_(stream, s) observations in the window, or None."""
        avg = self.sigma.get(s)
        count = _count(avg)
        return (avg.sum(), count) if count else None


def _count(avg: WindowAverage | None) -> int:
    """Observations in a never-reset WindowAverage's window."""
    return 0 if avg is None else min(avg.n, avg.W)


def check_schedule(W, p, interval) -> None:
    """Refuse a window W, profiling probability p or tick interval that cannot work (the
    messages every policy and the Profiler give). ``interval`` may be None (no ticks)."""
    if isinstance(W, bool) or not isinstance(W, numbers.Integral) or W < 1:
        raise ValueError(f"W must be at least 1, got {W!r}")
    if not is_real(p) or not 0 <= p <= 1:
        raise ValueError(f"the profiling probability p must be in [0, 1], got {p!r}")
    if interval is not None and (isinstance(interval, bool)
                                 or not isinstance(interval, numbers.Integral) or interval < 1):
        raise ValueError(f"the tick interval must be at least 1 arrival, got {interval!r}")


class Profiler:
    """All statistics of one running MJoin query (the Profiler of a-caching.txt Fig. 4).

    A ``ContinuousQuery`` has one (``cq.profiler``), created when the first policy is
    attached, fed by the query (:meth:`observe` for every profiled insertion, :meth:`tick`
    once per interval) and shared by every policy (``Policy.bind``). It can also be
    attached on its own, to observe only (``adaptcq explain`` does): then it *is* the
    query's profiler, and as a policy it asks for profiling with probability
    ``sample_probability`` and ticks every ``interval`` arrivals; its hooks do nothing
    (the query has fed it before they run).

    * ``W`` — the number of recent observations every estimate averages (one W per query:
      ``ContinuousQuery.attach`` refuses a policy with another W);
    * ``sample_probability`` — p_i of Appendix A (the same for every pipeline) when
      attached as a policy; a profiler the query creates asks for nothing itself (0: the
      policies' p_i decide);
    * ``interval`` — arrivals between ticks, at which rates and state sizes are measured.
    """

    needs_fanouts = True  # σ and the conditional fan-outs

    def __init__(self, W: int = W_DEFAULT, p: float = P_DEFAULT,
                 interval: int = INTERVAL_DEFAULT, seed: int = 0):
        check_schedule(W, p, interval)
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
    def start(self, executor) -> Profiler:
        """Start profiling ``executor`` (an MJoin) with its current orders (once: later
        calls with the same query do nothing). A profiler restored from a checkpoint is
        given the restored executor, whose query is an equal but new object: it keeps its
        statistics and follows the executor's orders (``PipelineStats.set_order``)."""
        q = executor.query
        if self.query is q:
            return self
        if self.query is not None and (self.query.sql, self.query.aliases) == (q.sql, q.aliases):
            self.query = q
            for a, stats in self.pipelines.items():
                stats.set_order(executor.orders[a])
            return self
        self.query = executor.query
        self.pipelines = {a: PipelineStats(a, executor.orders[a], self.W)
                          for a in self.query.aliases}
        self.rates = {a: Rate(self.W) for a in self.query.aliases}
        self.sizes = {a: WindowAverage(self.W) for a in self.query.aliases}
        return self

    # ----- the policy hooks (observing only: the query feeds its profiler itself) --------
    def stream_probability(self, i: int) -> float:
        return self.sample_probability

    def bind(self, profiler: Profiler) -> None:
        if profiler is not self:
            raise ValueError("a Profiler attached to a query is that query's profiler; "
                             "this query already has another one (read cq.profiler)")

    def on_profile(self, cq, obs, ts) -> None:
        pass

    def on_interval(self, cq, ts) -> None:
        pass

    def report(self) -> dict:
        return {"profiled_tuples": sum(p.observations for p in self.pipelines.values()),
                "profiler_ticks": self.ticks}

    # ----- updates -----------------------------------------------------------------------
    def observe(self, obs, executor) -> PipelineStats:
        """Add a profiled tuple; follows a re-ordering of its pipeline first (resetting the
        positions from the first change on). Returns the pipeline's statistics."""
        self.start(executor)
        stats = self.pipelines[obs.stream]
        if tuple(obs.order) != stats.order:
            stats.set_order(obs.order)
        sizes = {stem.name: len(stem) for stem in executor.stems}
        return stats.update(obs, sizes)

    def tick(self, per_stream: Sequence[int], executor, ts: float) -> None:
        """Measure rates (insertions so far per stream, at event time ``ts``) and state
        sizes |R_i|."""
        self.start(executor)
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

