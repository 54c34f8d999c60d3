"""Join-ordering policies for the MJoin executor: A-Greedy at run time and an initial plan
from the optimizer.

Both follow a-caching.txt Figure 4: the *Profiler* (``stats.profiler``) keeps online
estimates from a sample of profiled tuples, the *Re-optimizer* (the policies here) reads
them and asks the *Executor* to change its plan through ``MJoin.set_order`` — valid between
any two updates, since an MJoin keeps no join subresults (a-caching.txt §3.1), so results
stay exact.

**A-Greedy** (Babu et al., "Adaptive ordering of pipelined stream filters", SIGMOD 2004,
reference [5] of a-caching.txt, which uses it for MJoin ordering in §4 and §7.3). We only
have the a-caching and join-ordering papers' descriptions of it; what they say:

* profile a sample of tuples through their whole pipeline (a-caching.txt §4.3, App. A:
  each tuple with probability p_i), keeping per statistic the average of its W most recent
  observations (Table 1);
* keep the *greedy invariant* on conditional selectivities: the operator at position k
  has the smallest conditional selectivity (for joins: fan-out, matches per input tuple)
  among the operators not yet applied, given the prefix before it;
* re-order when it breaks ("A-Greedy", join-ordering.txt §1.1 calls these "Adaptive
  Greedy" heuristics).

What we filled in (ours, not the papers'):

* the invariant is checked with a tolerance α ≥ 1 (a name from [5]'s relaxed invariant,
  our reading of it): position k is *violated* when some admissible stream s later in the
  order has conditional fan-out f_k(s) with α·f_k(s) < f_k(order[k]);
* only *admissible* streams are candidates — those sharing a predicate with the prefix, or
  all remaining ones when none does — so A-Greedy never introduces a cartesian product
  the optimizer would not (``engine.rules.admissible``, the one definition the engine and
  the optimizer use too); fan-outs are compared without a
  per-operator cost (every operator is one hash probe per input tuple, and its output
  size is what the fan-out measures);
* statistics at position k count as ready after W profiled tuples reached position k
  since its last change (a-caching.txt §4.5 step 2 uses the same rule for caches);
* on a violation at the first violated position k, the prefix is kept, s moves to
  position k and the rest keep their relative order; the statistics of positions k, k+1,
  … are reset, so later positions are re-checked with fresh conditional fan-outs given
  the new prefix (we have no conditional statistics for prefixes that were never run,
  so we do not re-rank the rest at once).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence

from adaptcq.adapt.base import PolicyBase, log_bounded
from adaptcq.adapt.caching.verify import (
    P_MIN,
    SHARE_TICKS,
    profile_share,
    profiling_scale,
    share_ready,
)
from adaptcq.adapt.graph import join_graph_from_stats
from adaptcq.engine import rules
from adaptcq.errors import AdaptcqError
from adaptcq.stats.estimators import W_DEFAULT
from adaptcq.stats.profiler import INTERVAL_DEFAULT, P_DEFAULT, PipelineStats

#: Default tolerance α (our choice; see docs/adaptive-ordering.md for its effect).
ALPHA_DEFAULT = 1.25

REORDER_CHOICES = ("agreedy", "off")
#: Cheap profiling (beyond [5], issue 14): while no re-ordering happens, p is scaled so
#: that profiling (the profiled tuples and their statistics) takes this share of the CPU,
#: down to ``verify.P_MIN``; a re-ordering restores the full p.
PROFILE_SHARE = 0.02


def admissible_table(stream: str, order: Sequence[str],
                     adjacency: Mapping[str, Iterable[str]]) -> tuple[tuple[str, ...], ...]:
    """Per position k of ``stream``'s pipeline in ``order``, the streams that may join
    there (``rules.admissible`` after the prefix ``stream, order[:k]``)."""
    return tuple(tuple(rules.admissible(adjacency, {stream, *order[:k]}, order[k:]))
                 for k in range(len(order)))


def greedy_violation(stats: PipelineStats, adjacency: Mapping[str, Iterable[str]],
                     alpha: float = ALPHA_DEFAULT,
                     admissible: Sequence[Sequence[str]] | None = None
                     ) -> tuple[int, str] | None:
    """The first position k whose greedy invariant is violated by more than ``alpha``, and
    the admissible stream with the smallest conditional fan-out there; None if it holds
    at every position with ready statistics. Ties keep the current order. ``admissible``:
    ``admissible_table`` of the pipeline's current order, when the caller keeps it (the
    check runs on every profiled tuple)."""
    order = stats.order
    if admissible is None:
        admissible = admissible_table(stats.stream, order, adjacency)
    for k, current in enumerate(order):
        if not stats.ready(k):
            return None  # a later position never has more observations than this one
        windows = stats.fanouts[k]
        f_cur = windows[current].get()
        if f_cur:  # None (no data) or 0 (nothing is smaller) cannot be violated
            best, f_best = None, None
            for s in admissible[k]:
                if s != current:
                    f = windows[s].get()
                    if f is not None and (f_best is None or f < f_best):
                        best, f_best = s, f
            if best is not None and alpha * f_best < f_cur:
                return k, best
    return None


def move_to(order: tuple[str, ...] | list[str], k: int, s: str) -> list[str]:
    """The order with ``s`` moved to position k; the prefix and the rest keep their order."""
    rest = [x for x in order[k:] if x != s]
    return [*order[:k], s, *rest]


class AGreedy(PolicyBase):
    """A-Greedy (Babu et al. [5]; a-caching.txt §4) as a policy of a running query.

    Parameters, with the papers' names where they have one:

    * ``p`` — profiling probability p_i (a-caching.txt App. A);
    * ``W`` — estimates average the W most recent observations (Table 1; default 10, §7.1);
    * ``alpha`` — tolerance α ≥ 1 before re-ordering (our reading of [5]);
    * ``interval`` — arrivals between ticks, at which rates and state sizes are measured
      (they feed d_ij and the optimizer, not the invariant);
    * ``wait_for`` — another policy with a ``done`` flag (``InitialPlan``): no re-ordering
      before it has set the initial plan;
    * ``cheap`` — cheap profiling (beyond [5]): while the invariant holds (no re-ordering
      over the ticks the share is measured over, ``verify.share_ready``), p is
      scaled down so that profiling takes about
      ``PROFILE_SHARE`` of the CPU (measured: ``ContinuousQuery.profile_cpu``); the first
      re-ordering restores p. A change is then seen later (fewer profiled tuples), and
      which tuples are profiled depends on measured CPU. ``cheap=False``: p throughout.

    The statistics are the query's Profiler's (``bind``). The invariant is checked on
    every profiled tuple of a pipeline (the check is O(n²) on at most n-1 positions, cheap
    beside profiling itself).
    """

    def __init__(self, p: float = P_DEFAULT, W: int = W_DEFAULT, alpha: float = ALPHA_DEFAULT,
                 interval: int = INTERVAL_DEFAULT, seed: int = 0, wait_for=None,
                 cheap: bool = True):
        if alpha < 1:
            raise ValueError(f"the tolerance alpha must be at least 1, got {alpha!r}")
        if not isinstance(cheap, bool):
            raise TypeError(f"A-Greedy option cheap (cheap profiling) must be True or False, "
                             f"got {cheap!r}")
        super().__init__(p=p, W=W, interval=interval, seed=seed)
        self.p = p
        self.alpha = float(alpha)
        self.wait_for = wait_for
        self.reorderings = 0
        self.history: list[dict] = []  # the latest re-orderings (base.HISTORY_MAX)
        self._adjacency: dict[str, tuple[str, ...]] | None = None
        # admissible_table per (stream, order): a pipeline has few orders in a run
        self._admissible: dict[tuple, tuple[tuple[str, ...], ...]] = {}
        self.cheap = cheap
        self.p_scale = 1.0
        # (profile CPU, CPU, profiled tuples) per tick since the last re-ordering or scaling
        self._shares: deque = deque(maxlen=SHARE_TICKS + 1)
        self._stable_since = 0  # re-orderings when the share window started

    @property
    def sample_probability(self) -> float:
        return self.p * self.p_scale

    @sample_probability.setter
    def sample_probability(self, value: float) -> None:  # PolicyBase sets it
        self.p = value

    def on_interval(self, cq, ts) -> None:
        """Cheap profiling: profiling's share of the CPU over the ticks since the last
        re-ordering or scaling (``verify.share_ready``) scales p towards PROFILE_SHARE."""
        if not self.cheap or self.p <= 0:
            return
        if self.wait_for is not None and not getattr(self.wait_for, "done", True):
            self._shares.clear()  # the initial plan's profiling is not ours to scale
            return
        tick = (cq.profile_cpu, cq.cpu(), self._profiled())  # the query's own clock
        if self.reorderings != self._stable_since:  # measure the new plan from here
            self._stable_since = self.reorderings
            self._shares.clear()
        self._shares.append(tick)
        if not share_ready(self._shares, self.W):  # (the ticks since the last change)
            return
        share = profile_share(self._shares)
        if share is not None:
            self.p_scale = profiling_scale(self.p_scale, share, min(1.0, P_MIN / self.p),
                                           PROFILE_SHARE)
        self._shares.clear()
        self._shares.append(tick)  # the next window starts here, at the new scale

    # ----- hooks -------------------------------------------------------------------------
    def on_profile(self, cq, obs, ts) -> None:
        if self.wait_for is not None and not getattr(self.wait_for, "done", True):
            return
        stats = self.profiler.pipelines[obs.stream]
        if self._adjacency is None:
            self._adjacency = rules.adjacency(cq.executor.query)
        key = (stats.stream, stats.order)
        table = self._admissible.get(key)
        if table is None:
            table = self._admissible[key] = admissible_table(*key, self._adjacency)
        found = greedy_violation(stats, self._adjacency, self.alpha, table)
        if found is None:
            return
        k, s = found
        old = stats.order
        new = move_to(old, k, s)
        cq.executor.set_order(stats.stream, new)
        stats.set_order(new)
        self.reorderings += 1
        if self.p_scale < 1.0:  # something changed: profile at the full p from now on
            self.p_scale = 1.0
            cq.reschedule()
        log_bounded(self.history, {"arrival": cq.next_rid, "ts": ts, "stream": stats.stream,
                                   "position": k, "old": list(old), "new": new})

    def report(self) -> dict:
        orders = "; ".join(f"ΔR {h['stream']}@{h['arrival']}: " + " ⋈ ".join(h["new"])
                           for h in self.history[-5:])
        return {"agreedy_reorderings": self.reorderings,
                "agreedy_profiled": self._profiled(),
                "agreedy_profiling_scale": self.p_scale,
                "agreedy_last_reorderings": orders}


class InitialPlan(PolicyBase):
    """The MJoin's initial plan from the optimizer over measured statistics (issue 4,
    ``--optimizer``): join-ordering.txt's algorithms on the join graph of §2.1–2.2.

    Profiles (probability ``p``) and ticks until the query's profiler is ready — W
    observations at position 0 of every pipeline and W rate measurements per stream,
    a-caching.txt §4.5 step 2 — then builds the join graph (``adapt.graph``), calls
    ``optimizer.plan(graph, algorithm)`` and sets every pipeline's order once. After that
    it stops asking for profiling (``sample_probability`` becomes 0) and ``done`` is True.
    DMJoin on more than ``optimizer.DMJOIN_MAX_STREAMS`` streams is refused when the policy
    is attached, before any profiling.
    """

    def __init__(self, algorithm: str = "qaware", p: float = P_DEFAULT * 5,
                 W: int = W_DEFAULT, interval: int = INTERVAL_DEFAULT, seed: int = 0,
                 objective: str = "cost"):
        from adaptcq.optimizer import ALGORITHMS, OBJECTIVES
        if algorithm not in ALGORITHMS:
            raise AdaptcqError(f"unknown optimizer {algorithm!r}; choose one of "
                               f"{', '.join(ALGORITHMS)}")
        if objective not in OBJECTIVES:
            raise AdaptcqError(f"unknown objective {objective!r}; choose one of "
                               f"{', '.join(OBJECTIVES)}")
        super().__init__(p=p, W=W, interval=interval, seed=seed)
        self.algorithm = algorithm
        self.objective = objective
        self.done = False
        self.graph = None
        self.plan: dict[str, list[str]] | None = None
        self.cost: float | None = None
        self.chosen: str | None = None  # the algorithm Q-Aware picked
        self.planned_at: int | None = None

    def bind(self, profiler) -> None:
        """Refuse an intractable DMJoin before profiling for nothing."""
        super().bind(profiler)
        if profiler.query is None:
            return
        from adaptcq.optimizer import DMJOIN_MAX_STREAMS
        n = len(profiler.query.aliases)
        if self.algorithm == "dmjoin" and n > DMJOIN_MAX_STREAMS:
            raise AdaptcqError(f"--optimizer dmjoin is exponential and allows at most "
                               f"{DMJOIN_MAX_STREAMS} streams; this query joins {n}. Use "
                               "qaware, fab or treeopt")

    def on_profile(self, cq, obs, ts) -> None:
        if not self.done:
            self._maybe_plan(cq)

    def on_interval(self, cq, ts) -> None:
        if not self.done:
            self._maybe_plan(cq)

    def _maybe_plan(self, cq) -> None:
        if not self.profiler.ready():
            return
        from adaptcq.optimizer import plan, plan_cost, qaware_algorithm
        query = cq.executor.query
        self.graph = join_graph_from_stats(query, self.profiler)
        self.plan = plan(self.graph, self.algorithm, objective=self.objective)
        self.cost = plan_cost(self.graph, self.plan)
        self.chosen = (qaware_algorithm(self.graph) if self.algorithm == "qaware"
                       else self.algorithm)
        for stream in query.aliases:
            cq.executor.set_order(stream, self.plan[stream])
        self.planned_at = cq.next_rid
        self.done = True
        self.sample_probability = 0.0

    def report(self) -> dict:
        if not self.done:
            return {"optimizer": self.algorithm, "optimizer_plan": "not set (statistics "
                    "never became ready: W profiled tuples per pipeline and W rate ticks)"}
        return {"optimizer": self.algorithm, "optimizer_chosen": self.chosen,
                "optimizer_plan": "; ".join(f"ΔR {s}: " + " ⋈ ".join(o)
                                            for s, o in self.plan.items()),
                "optimizer_plan_cost": self.cost, "optimizer_planned_at_arrival": self.planned_at}
