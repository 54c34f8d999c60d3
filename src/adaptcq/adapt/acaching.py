"""A-Caching: the adaptive cache selection policy (a-caching.txt Figure 4, §4.3–§4.5, §5).

Profiler: a sample of tuples (probability p_i) is profiled through each pipeline without
caches (``MJoin.profile_insert``); the query's one Profiler (``stats.profiler``, shared
with A-Greedy and the initial plan when they run too) keeps d_ij and c_ij (Appendix A).
The miss probability of a cache in use is observed, that of a candidate not in use is
estimated with a Bloom filter of alpha·W_d bits over windows of W_d probe keys, watched
on the complete probe stream by an observer the executor compiles into the pipeline.

Cost model (§4.1, §4.3; ``adapt.caching.model.cache_estimate``). A cache C_ijk's

    benefit = Σ_{l=j..k} d_il·c_il − d_ij·probe_cost − miss·(Σ_{l=j..k} d_il·c_il
              + d_{i,k+1}·update_cost)
    cost    = update_cost · Σ_{R_l ∈ Z} d_{l,|Z|-1}

are in *CPU seconds per unit time*: c_il is the executor's counted work per tuple at
operator l (sum(w_l)/sum(δ_l) over the W most recent profiled tuples, ``PipelineStats.c``;
the virtual work clock of ``engine.interp``), split into hash probes, bucket entries and
scanned rows, each priced at the seconds per operation measured on the compiled pipelines
as they run (``stats.costs.OperationCosts``: each interval's CPU against the operations it
counted, ``_interval_counts``), and so are probe_cost (a cache probe) and update_cost (a
tuple stored in a cache, a CacheUpdate); beyond the paper, a hit's yielded tuples, a
miss's entry built, deletions and append-mode maintenance joins are priced too. Until an
interval has been measured, and with ``verify=False`` (``--no-cache-verify``), the same
formulas run on the work clock (every unit 1: the paper's policy, deterministic and
machine-independent). Event time measures the rates d.

Re-optimizer (§4.5): candidates (§4.2: the caches satisfying the prefix invariant, plus
§6's globally-consistent ones up to the quota m with ``caches="global"``) start
*profiled*; once each has W observations of every statistic the offline algorithm
(``adapt.caching.select``) picks the *used* ones, the rest become *unused* (beyond the
paper, after one interval I it runs over those that are ready, and the others stay
profiled, keeping their Bloom filters, until they are: ``_stop_profiling``). A used cache
whose benefit minus cost turns negative is dropped at once (§4.5 a). Every re-optimization
interval I the unused candidates are profiled again (used ones keep being observed:
§4.5 b), and the offline algorithm runs again only if some benefit or cost changed by more
than ``change`` (p = 20%, §4.5 c). A re-ordering of a pipeline (by A-Greedy or the initial
plan, other policies in the same query) removes its caches and restarts its candidates as
profiled (§4.5 step 5); list A-Caching after them (``adapt.make_policies`` does) so it
sees a re-ordering at the tick it happens.

Memory (§5): caches are chosen as if memory were unlimited, then memory is granted greedily
by priority, (benefit − cost) per expected byte; the budget can change while the query
runs (``set_memory``), and caches shrink (fewer buckets) or are dropped to stay within it.
"""

from __future__ import annotations

import math
import numbers
from collections import deque
from dataclasses import dataclass, field

from adaptcq.adapt.base import PolicyBase, log_bounded
from adaptcq.adapt.caching import (
    METHODS,
    Candidate,
    Estimate,
    check_method,
    enumerate_candidates,
    select,
)
from adaptcq.adapt.caching.model import OpCosts, cache_estimate, operator_cost
from adaptcq.adapt.caching.verify import (
    MIN_BEFORE,
    NOISE_FLOOR,
    P_MIN,
    SHARE_TICKS,
    backoff,
    before_mean,
    before_ratio,
    clear,
    decisive,
    keep_change,
    profile_share,
    profiling_scale,
    resolution,
    share_ready,
)
from adaptcq.checks import is_finite
from adaptcq.engine.rules import cache_key, probe_plan
from adaptcq.stats.costs import KINDS, OperationCosts
from adaptcq.stats.estimators import W_DEFAULT, BloomMissRate, WindowAverage

P_DEFAULT = 0.01          # profiling probability p_i (the paper gives no default)
REOPT_INTERVAL = 10_000   # I in tuples (a-caching.txt §7.4: "I was set to 10,000 tuples")
CHANGE = 0.20             # p of §4.5 c: re-select only after a change of more than 20%
M_DEFAULT = 6             # §6 quota m (§7.3: m = 6)
PROBE_COST = 1.0          # work units of one cache probe (§4.3 probe_cost)
UPDATE_COST = 1.0         # work units of one cache insert (§4.3 update_cost)
TRIAL = 20                # intervals a change runs, and then its control, before a verdict
EARLY = 4                 # a trial phase can end after this many intervals when clear
MAX_KEYS = 1 << 17        # a cache's expected keys are capped here (its buckets at 8×)
REPROFILE_MAX = 16        # the re-profiling interval stretches to at most this many I
PENDING_MAX = 3           # selections a candidate stays profiled past without an estimate
QUIET_STRETCH = 8         # quiet ticks come up to this many times less often
WATCH_STRETCH = 4         # ticks that only watch used caches with a margin (``_watch_only``)
WATCH_MARGIN = 0.5        # ... come up to 4x less often: net benefit >= half the benefit
COST_WINDOW = 4           # per-operation costs are fitted over this many W intervals
COUNT_SPAN = 4            # ticks one counted interval spans while nothing is being decided
GROWTH = 1.10             # state growth beyond which counted intervals are not steady
TICK_BUDGET = 0.02        # the policy's own CPU at its ticks, as a share of the query's,
                          # beyond which optional work (counting for the fit) is spread out


@dataclass
class CandidateState:
    candidate: Candidate
    state: str = "profiled"                 # used | profiled | unused (§4.5)
    bloom: BloomMissRate | None = None
    cache: object | None = None             # the engine's JoinCache while used
    seen: tuple[int, int] = (0, 0)          # (hits, misses) at the last tick, while used
    observed_miss: WindowAverage = field(default_factory=WindowAverage)
    estimate: Estimate | None = None
    fails: int = 0                          # changes of it undone by measurement
    banned_until: int = 0                   # arrivals: not used again before (an add undone)
    pinned_until: int = 0                   # arrivals: not dropped again before (a drop undone)
    pending: int = 0                        # selections passed while not yet estimated


class ACaching(PolicyBase):
    """The A-Caching policy for an MJoin executor (attach with ``ContinuousQuery.attach``,
    alone or after A-Greedy and the initial plan: ``adapt.make_policies``)."""

    needs_fanouts = False  # d_ij and c_ij only
    method_fallbacks = 0  # selections a forced method could not make (greedy ran instead)

    def __init__(self, W: int = W_DEFAULT, p: float = P_DEFAULT,
                 reopt_interval: int = REOPT_INTERVAL, change: float = CHANGE,
                 caches: str = "prefix", m: int = M_DEFAULT, memory: int | None = None,
                 W_d: int = 100, alpha: float = 4.0, method: str = "auto",
                 interval: int = 500, seed: int = 0, trial: int = TRIAL,
                 verify: bool = True):
        _check_options(W=W, p=p, reopt_interval=reopt_interval, change=change, caches=caches,
                       m=m, memory=memory, W_d=W_d, alpha=alpha, method=method,
                       interval=interval)
        if not (_is_count(trial) and trial >= 1):
            raise ValueError(f"A-Caching option trial (intervals a cache change is measured "
                             f"over) must be a whole number ≥ 1, got {trial!r}")
        if not _is_count(seed):  # (1.5 or "x" reached the random generator unchecked)
            raise TypeError(f"A-Caching option seed must be a whole number, got {seed!r}")
        if not isinstance(verify, bool):  # ("false" or "no" would be true, None off)
            raise TypeError(f"A-Caching option verify (--no-cache-verify: check decisions "
                            f"by measurement) must be True or False, got {verify!r}")
        self.W, self.W_d, self.alpha = W, W_d, alpha
        self.p = p
        self._p_i: dict[int, float] = {}
        self.interval = self.base_interval = interval
        self.seed = seed
        self.profiler = None                # the query's, from ``bind``
        self.reopt_interval = reopt_interval
        self.change = change
        self.caches = caches
        self.m = m
        self.memory = memory
        self.method = method
        self.states: dict[Candidate, CandidateState] = {}
        self.orders: dict[str, tuple[str, ...]] = {}
        # §4.3's probe_cost and update_cost: the work units of a cache probe and a cache
        # insert on the work clock; on the measured clock, factors (1) on the measured
        # seconds of a cache probe and of storing and maintaining cached tuples.
        self.probe_cost, self.update_cost = PROBE_COST, UPDATE_COST
        # Seconds per operation of each kind, fitted to the CPU of the intervals between
        # ticks (stats.costs; issue 14, item 1), and what the interval counts start from.
        self.op_costs = OperationCosts(W=COST_WINDOW * W, every=2 * W)
        self._snap: dict | None = None
        self._grown: tuple[int, dict] = (0, {})  # state size, profiled tuples at its growth
        self._costs: OpCosts | None = None  # self.costs(), until the fit changes
        self._fit_used = None                # the fit self._costs was made from
        self._ex = None                     # the executor, for its orders and scans
        self._scan_flags: dict = {}
        self.next_reopt = reopt_interval
        self.selections = 0
        self.chosen: set[Candidate] = set()     # the last offline selection
        self._arrivals = 0                      # arrivals at the last tick
        self.profiling_since = 0                # arrivals when profiling last started
        self.history: list[dict] = []        # the latest cache events (base.HISTORY_MAX)
        self.logged = 0                      # cache events ever logged
        self.changes = 0                     # of them, changes (use, drop, shrink, grow)
        self.peak_bytes = 0
        # Decisions checked by measurement (adapt.caching.verify): the trial under way,
        # the changes the re-optimizer just made, the CPU clock at the last tick's end.
        self.verify, self.trial_intervals = verify, trial
        self.trial: dict | None = None
        self._changes: list | None = None
        self._clock: tuple[float, int, float] | None = None  # (CPU s, arrivals, event s)
        # The model against the compiled code: CPU seconds per work unit of the plan in
        # force, and arrivals per second of event time, measured at the ticks.
        self.seconds_per_unit = WindowAverage(W)  # on the work clock
        self.measured_over_predicted = WindowAverage(W)  # on the measured clock
        self.arrival_rate = WindowAverage(W)
        # How far the model's predicted CPU ratio of a new cache fell short of the measured
        # one, over the W most recent trials of new caches (``_credible``).
        self.model_error = WindowAverage(W)
        # The noise band of the trials run against a control (two standard errors of the
        # difference of the means, no floor), over the W most recent: the smallest
        # difference a trial can tell from noise (``_credible``).
        self.trial_band = WindowAverage(W)
        self._band_predicted = 0.0  # the latest band predicted before any trial (_resolution)
        self._window: dict | None = None  # pipeline -> its [RANGE w] window, seconds
        self._pending_orders: tuple | None = None  # (orders, re-orderings) seen last,
        self._pending_since = 0                     # and since when (``_unsettled``)
        self._reorders_seen = 0  # the executor's re-orderings when candidates were made
        self.trials = self.undone = 0
        self.measured: list[dict] = []  # the latest verdicts' figures (explain, report)
        # CPU per arrival of the latest intervals without a trial: a change's "before"
        self._before: deque = deque(maxlen=max(MIN_BEFORE, trial // 2))
        # Cheap profiling: a factor on p_i while estimates are stable.
        self.p_scale = 1.0
        self.reprofile_scale = 1  # I times this between re-profilings (doubles while stable)
        # (profile CPU, CPU, profiled tuples) per tick since the estimates became stable or
        # p was last scaled
        self._shares: deque = deque(maxlen=SHARE_TICKS + 1)
        self._ticks = 0
        # The policy's own CPU at its ticks (``_tick_done``): (own, since the last tick's
        # end) per tick over the latest SHARE_TICKS, and the total so far.
        self._own: deque = deque(maxlen=SHARE_TICKS)
        self._own_total = 0.0
        self._tick_start = 0.0
        self.rows_counted = 0  # intervals counted for the cost fit (steady or not)

    # ----- policy hooks ------------------------------------------------------------------
    @property
    def sample_probability(self) -> float:
        if self._idle():
            return 0.0
        return min(1.0, max([self.p, *self._p_i.values()]) * self.p_scale)

    def _idle(self) -> bool:
        """Beyond the paper: with a cache memory budget of 0 bytes no cache can hold a tuple,
        so nothing is profiled, estimated or selected and the query runs as the MJoin it
        is (Figure 13's leftmost point). A trial or a cache in use first ends the usual
        way (the budget drops the cache); ``set_memory`` with room wakes the policy."""
        return self.memory == 0 and self.trial is None and not any(
            st.state == "used" for st in self.states.values())

    def stream_probability(self, i: int) -> float:
        """p_i (App. A): at least p, and high enough that a pipeline whose stream brings a
        small share of the arrivals still collects 2W profiled tuples per re-optimization
        interval I (§4.5 step 2 needs W observations of each statistic); times
        ``p_scale`` while the estimates are stable (cheap profiling); 0 while idle."""
        if self._idle():
            return 0.0
        return min(1.0, self._p_i.get(i, self.p) * self.p_scale)

    def _set_p_i(self, per_stream) -> None:
        total = sum(per_stream)
        if total:
            self._p_i = {i: min(1.0, max(self.p, 2 * self.W * total /
                                         (self.reopt_interval * max(c, 1))))
                         for i, c in enumerate(per_stream)}

    def on_interval(self, cq, ts) -> None:
        now = self._tick_start = cq.cpu()  # the query's own clock, not the process's
        ex = self._ex = cq.executor
        self._sample_peak()  # every tick, before anything below may drop a cache
        arrivals = cq.next_rid
        if self._idle():  # no cache memory: nothing to watch, profile or decide
            if any(st.state == "profiled" for st in self.states.values()):
                ex.clear_observers()  # (the budget fell to 0 while they were profiled)
                for st in self.states.values():
                    st.state, st.bloom = "unused", None
            self._snap, self._clock = None, None
            self._before.clear()
            return
        if self._quiet(ex, arrivals):  # (most ticks, once the caches are decided)
            self._snap = None  # quiet stretches are not counted (nothing to decide)
            self._before.clear()  # a change's "before" is the intervals just before it
            # Ticks cost the profiler's rates too: while nothing can happen, they come
            # less often (the re-profiling, a re-ordering or a budget of 0 wakes the policy
            # within QUIET_STRETCH intervals).
            self.interval = min(self.base_interval * QUIET_STRETCH, self.interval * 2)
            self._shares.append((cq.profile_cpu, now, self._profiled()))
            if share_ready(self._shares, self.W):
                self._set_p_i(cq.per_stream)
                self._adapt_profiling(cq, now)
            self._clock = (self._tick_done(cq), arrivals, ts)
            return
        stretch, self.interval = self.interval, self.base_interval
        logged = self.logged
        for st in self.states.values():  # the observers' queued keys (a short queue)
            if st.bloom is not None:
                st.bloom.flush()
        sample = self._sample(cq, now)
        if self.verify:
            self._follow_growth(ex)
            self._count_interval(cq, ex, now)
        self._arrivals = arrivals
        self._set_p_i(cq.per_stream)
        # Re-orderings by another policy, seen by the orders and by the executor's count of
        # them (a pipeline re-ordered and put back between two ticks lost its caches too).
        orders = {a: tuple(o) for a, o in ex.orders.items()}
        version = getattr(ex, "reorders", 0)
        if (orders, version) != self._pending_orders:  # (see _unsettled)
            self._pending_orders, self._pending_since = (orders, version), arrivals
        if orders != self.orders or version != self._reorders_seen:
            self._before.clear()  # intervals of another plan
            self._end_trial(arrivals, ts, "re-ordered")  # its caches are gone
            if self.orders and self._unsettled(arrivals):
                placed = {id(c) for c in ex.caches.values()}
                for st in self.states.values():  # the re-ordered pipelines' caches are gone
                    if st.state == "used" and id(st.cache) not in placed:
                        st.state, st.cache = "unused", None
                        self._log(arrivals, ts, "drop", f"{st.candidate.name}: its pipeline "
                                  "was re-ordered")
                self._enforce_memory(ex, arrivals, ts)  # the budget holds meanwhile
                self._end_tick(cq, ex, ts)
                return
            self._new_candidates(ex, arrivals, ts)
        elif self.trial is None and sample is not None:
            self._before.append(sample)
            self._measure_rates(now, arrivals, ts)
        if self.trial is not None:  # nothing else changes while a change is measured
            self._watch_used(ex, arrivals, ts, drop=False)
            self._trial_step(ex, arrivals, ts, sample)
        else:
            self._changes = []
            self._watch_used(ex, arrivals, ts)
            if arrivals >= self.next_reopt:       # §4.5 step 4: profile the unused again
                self.next_reopt = arrivals + self.reopt_interval * self.reprofile_scale
                again = [st for st in self.states.values()
                         if st.state == "unused" and self._may_pay(st)]
                if again:
                    self.profiling_since = arrivals  # a new round: its own interval I
                ex.observe_probes([w for st in again for w in self._profile(ex, st)])
                if not again and not self._pending():
                    # none may pay: as a re-profiling that changed no cache (candidates
                    # still being profiled are not "none": their selection is to come)
                    self.reprofile_scale = min(REPROFILE_MAX, self.reprofile_scale * 2)
            # §4.5 step 2 waits for W observations of every statistic; a candidate whose
            # probe position is rarely reached would hold up the others for ever, so after
            # one interval I the selection runs over the candidates that are ready (ours),
            # and those not yet ready stay profiled (``_reselect_with``).
            profiled = self._pending()
            if profiled and (self._ready()
                             or arrivals - self.profiling_since >= self.reopt_interval):
                self._reselect(ex, arrivals, ts)
            elif not profiled and self.selections == 0 and self.states:
                self._reselect(ex, arrivals, ts)  # none may pay (``_may_pay``): none chosen
            changes, self._changes = _net_changes(self._changes), None
            if changes and self.verify:
                self.trial = {"actions": changes, "phase": "after", "settle": 1,
                              "after": [], "control": [], "since": arrivals,
                              "before": list(self._before), "early": [],
                              "predicted_ratio": self._predicted_ratio(changes)}
                self._before.clear()
        if self._enforce_memory(ex, arrivals, ts):
            self._end_trial(arrivals, ts, "memory budget")  # the budget decides now
        longer = min(self.base_interval * WATCH_STRETCH, stretch * 2)
        if self._watch_only(arrivals, logged, longer):
            self.interval = longer
        self._adapt_profiling(cq, now)
        self._end_tick(cq, ex, ts)

    def _watch_only(self, arrivals, logged: int, longer: int) -> bool:
        """Beyond the paper: this tick only watched the caches in use (§4.5 a), and every
        one of them keeps a net benefit of at least ``WATCH_MARGIN`` of its benefit, so
        the next ticks may come up to ``WATCH_STRETCH`` times less often (each costs about
        a hundred microseconds: on Figure 10 every 500 arrivals were 4% of the cached
        plan's CPU). §4.5 a still reacts at the next tick, up to 2,000 arrivals later by
        default; anything else to decide (a trial, a change, profiled candidates, a
        re-profiling due before the ``longer`` interval ends, a memory budget) brings the
        ticks back to every ``interval``."""
        if (self.trial is not None or self.logged != logged or self.memory is not None
                or arrivals + longer >= self.next_reopt
                or any(st.state == "profiled" for st in self.states.values())):
            return False
        used = [st for st in self.states.values() if st.state == "used"]
        return bool(used) and all(
            st.estimate is not None and st.estimate.benefit > 0
            and st.estimate.benefit - st.estimate.cost >= WATCH_MARGIN * st.estimate.benefit
            for st in used)

    def _end_tick(self, cq, ex, ts) -> None:
        """The CPU clock (trials) and the operation counts (``_count_interval``) start
        again here, after the policy's own work (the counts only when the last interval
        was counted, or the plan changed at this tick)."""
        fresh = self.verify and (self._snap is None or self._snap["plan"] != self._plan_key(ex))
        if fresh:
            self._snap = self._snapshot(cq, ex)
        end = self._tick_done(cq)
        if fresh:  # the interval starts after this tick's own work
            self._snap["cpu"], self._snap["own"] = end, self._own_total
        self._clock = (end, cq.next_rid, ts)

    def _tick_done(self, cq) -> float:
        """The end of a tick: its own CPU (from ``on_interval``'s start) and the CPU since
        the previous tick's end, for ``_thrifty``. Returns the clock (``cq.cpu``)."""
        end = cq.cpu()
        own = end - self._tick_start
        if self._clock is not None:
            self._own.append((own, end - self._clock[0]))
        self._own_total += own
        return end

    def _thrifty(self) -> bool:
        """Beyond the paper: the policy's own CPU at its latest ticks (estimates, counting,
        selections, plan changes) is above ``TICK_BUDGET`` of the query's CPU over them
        (issue 14 asks profiling to stay under 2%; the policy's bookkeeping gets the same
        budget). Work that only refines the cost model is then spread out
        (``_count_interval``). Never before the first interval has been counted (until
        then the model is on the work clock), nor with ``--no-cache-verify`` (the paper's
        policy: its decisions must not depend on measured CPU). (Ticking less often while
        over budget was tried and is not done: on Figure 10 it delayed the first
        selection from arrival 4,000 to 5,500 and left too few intervals before the
        change to keep it without a control; A-Caching / forced cache fell to about 0.5.)"""
        if not self.verify or not self.rows_counted:
            return False
        total = math.fsum(t for _, t in self._own)
        return total > 0 and math.fsum(o for o, _ in self._own) > TICK_BUDGET * total

    # ----- the model against the compiled code (issue 14, item 1) ------------------------
    def units_rate(self) -> float:
        """The model's cost of the plan in force per second of event time: every
        operator's d_ij·c_ij, less the net benefit of each cache in use (§4.1), and on the
        measured clock every arrival's fixed work (insertion and expiry), which no cache
        changes. In work units, or in CPU seconds on the measured clock (``costs``)."""
        used = math.fsum(st.estimate.benefit - st.estimate.cost for st in self.states.values()
                         if st.state == "used" and st.estimate is not None)
        costs = self.costs()
        fixed = 0.0
        if costs.clock == "seconds" and self.profiler is not None:
            fixed = (costs.insert + costs.expiry) * math.fsum(
                self.profiler.rate(a) for a in self.orders)
        return math.fsum(self.operator_costs().values()) + fixed - used

    def costs(self) -> OpCosts:
        """The cost of each operation §4.1's estimates use now: CPU seconds measured on
        the compiled pipelines (``stats.costs.OperationCosts``, fitted to the intervals
        between ticks) once an interval has been measured; the work clock before that
        and with ``--no-cache-verify`` (the paper's policy, deterministic)."""
        if self._costs is None:
            fit = self._fit_used = self.op_costs.get() if self.verify else None
            retract = bool(getattr(self._ex, "retract", False))
            self._costs = (OpCosts.work_clock(self.probe_cost, self.update_cost)
                           if fit is None else
                           OpCosts.measured(fit.seconds, retract=retract,
                                            probe_cost=self.probe_cost,
                                            update_cost=self.update_cost))
        return self._costs

    # ----- counting the operations of an interval (issue 14, item 1) ---------------------
    def _snapshot(self, cq, ex) -> dict:
        """The counters an interval's operations are counted from (all O(streams +
        caches)): arrivals and SteM sizes per stream, profiled tuples per pipeline, every
        used cache's hits and misses, the CPU clocks, and the plan in force."""
        return {"ins": list(cq.per_stream), "size": [len(st) for st in ex.stems],
                "obs": {a: p.observations for a, p in self.profiler.pipelines.items()},
                "cache": {id(st.cache): tuple(st.cache.counts) for st in self._used()},
                "cpu": cq.cpu(), "profile_cpu": cq.profile_cpu,
                "own": self._own_total, "plan": self._plan_key(ex)}

    def _used(self) -> list[CandidateState]:
        return [st for st in self.states.values() if st.state == "used" and st.cache is not None]

    def _plan_key(self, ex) -> tuple:
        return (tuple((a, tuple(o)) for a, o in ex.orders.items()), getattr(ex, "reorders", 0),
                tuple(sorted(id(c) for c in ex.caches.values())),
                tuple(sorted((k, len(v)) for k, v in ex.observers.items())),
                tuple(sorted(id(st.cache) for st in self._used())))

    def _count_interval(self, cq, ex, now: float) -> None:
        """One row of the per-operation cost fit: the operations of each kind the compiled
        pipelines did since the last counted tick (``_interval_counts``) and the CPU
        seconds they took (profiled tuples left out: they run another pipeline), both per
        arrival. While nothing is being decided (no trial, no candidate profiled) an
        interval spans ``COUNT_SPAN`` ticks, so that counting costs less. An interval
        whose plan changed under it (another policy re-ordered) is skipped, and one that
        is not ``_steady`` sets only the overall scale (until a steady interval comes;
        ``OperationCosts.update(steady=False)``): while windows fill, and until every
        pipeline has profiled W tuples since, the profiled per-tuple counts (averages over
        the W latest profiled tuples, made against smaller windows) lag the work the
        pipelines do, and the fit charges the growing cost to whatever kind happened to
        grow with it (on Figure 10's nested-loop join, expiries and probes instead of
        scanned rows; or to nothing: scanned rows counted rising from 100 to 145 per
        arrival at a constant CPU, so a scanned row came out at 5 ns)."""
        snap = self._snap
        if snap is None:
            return
        snap["ticks"] = snap.get("ticks", 0) + 1
        if snap["ticks"] < COUNT_SPAN and (self._thrifty() or self.trial is None and not any(
                st.state == "profiled" for st in self.states.values())):
            return  # nothing being decided, or over budget: one row per COUNT_SPAN ticks
        self._snap = None
        if snap["plan"] != self._plan_key(ex):
            return
        # (the policy's own CPU at the ticks the row spans left out, as profiling is)
        cpu = (now - snap["cpu"] - (cq.profile_cpu - snap["profile_cpu"])
               - (self._own_total - snap["own"]))
        counts = self._interval_counts(cq, ex, snap)
        arrivals = counts["insert"]
        if arrivals <= 0 or cpu <= 0:
            return
        self.op_costs.update({k: v / arrivals for k, v in counts.items()}, cpu / arrivals,
                             steady=self._steady(snap, ex))
        self.rows_counted += 1
        if self.op_costs.stale:  # refitted every 2W intervals (``OperationCosts.every``),
            self._costs = None   # and at every selection (``_reselect``)

    def _follow_growth(self, ex) -> None:
        """Note when the state last grew by more than ``GROWTH`` (10%: windows filling,
        not a window's random ups and downs; and how many tuples each pipeline had
        profiled then)."""
        size = ex.state_tuples()
        if size > GROWTH * self._grown[0]:
            self._grown = (size, {a: p.observations for a, p in self.profiler.pipelines.items()})

    def _steady(self, snap: dict, ex) -> bool:
        """An interval whose counts are not biased by windows filling: the state did not
        grow by more than ``GROWTH`` during it, and every pipeline has profiled W tuples
        since it last did (its per-tuple averages are over the W latest: made before,
        they lag the work its pipeline does now)."""
        if sum(snap["size"]) * GROWTH < ex.state_tuples():
            return False
        grown = self._grown[1]
        return all(p.observations - grown.get(a, 0) >= self.W
                   for a, p in self.profiler.pipelines.items())

    def _interval_counts(self, cq, ex, snap: dict) -> dict[str, float]:
        """Operations of each kind (``stats.costs.KINDS``) the compiled pipelines did
        since ``snap``. Exact where the engine counts: insertions (profiled ones left
        out), expiries (insertions less the SteMs' growth; a tick comes as an arrival is
        counted but not yet stored, so a stream's figure can be one tuple off, which the
        next interval gives back), cache probes and entries built
        (each cache's hits and misses). The rest from the profiled tuples' per-operator
        counts (``_split``) times the pipeline runs (insertions, and deletions in retract
        mode): probes, bucket entries and scanned rows, those of a cached segment only on
        its misses, plus the tuples a cache yields or stores; CacheUpdates on the tuples
        reaching them in the pipelines of Z (insertions and deletions); in append mode the
        joins deletions run only to reach CacheUpdates; observed probe keys."""
        n = dict.fromkeys(KINDS, 0.0)
        ins, dele, runs = {}, {}, {}
        for i, a in enumerate(ex.query.aliases):
            k = cq.per_stream[i] - snap["ins"][i]
            stats = self.profiler.pipelines.get(a)
            prof = (stats.observations if stats else 0) - snap["obs"].get(a, 0)
            ins[a] = max(0, k - prof)
            dele[a] = max(0, k - (len(ex.stems[i]) - snap["size"][i]))
            runs[a] = ins[a] + (dele[a] if ex.retract else 0)
            n["insert"] += ins[a]
            n["expiry"] += dele[a]
        used = self._used()
        delta, sharers = {}, {}
        for st in used:
            c = st.cache
            h0, m0 = snap["cache"].get(id(c), (0, 0))
            delta[id(c)] = (c.counts[0] - h0, c.counts[1] - m0)
            sharers[id(c)] = sharers.get(id(c), 0) + 1
        for dh, dm in delta.values():
            n["cache_probe"] += dh + dm
            n["entry_build"] += dm
        covered: dict[str, dict[int, float]] = {}
        for st in used:
            c, (dh, dm) = st.candidate, delta[id(st.cache)]
            m = dm / (dh + dm) if dh + dm else 0.0
            covered.setdefault(c.pipeline, {}).update(
                dict.fromkeys(range(c.start - 1, c.end), m))
            # the entry's tuples, yielded on a hit or stored on a miss
            n["entry"] += (dh + dm) * self._tuples_per_entry(c) / sharers[id(st.cache)]
        maintain: dict[str, int] = {}  # append mode: joins run by deletions for CacheUpdates
        for st in {id(st.cache): st for st in used}.values():
            c = st.candidate
            z = set(c.segment) | set(c.extra)
            for lp in z:
                n["cache_update"] += (ins[lp] + dele[lp]) * self._passes(lp, len(z) - 1)
                maintain[lp] = max(maintain.get(lp, 0), len(z) - 1)
        for a, stats in self.profiler.pipelines.items():
            if a not in runs:
                continue
            cov = covered.get(a, {})
            for j in range(len(stats.order)):
                split = self._split(a, j)
                if split is None:
                    continue
                dj = stats.delta[j].get()
                times = runs[a] * cov.get(j, 1.0)
                if not ex.retract and j < maintain.get(a, 0):
                    times += dele[a]
                n["probe"] += dj * times * split[0]
                n["entry"] += dj * times * split[1]
                n["scan_row"] += dj * times * split[2]
        for (a, position), watchers in ex.observers.items():
            stats = self.profiler.pipelines.get(a)
            if stats is not None and a in runs and 0 < position <= len(stats.order):
                n["observe"] += len(watchers) * runs[a] * stats.delta[position - 1].get()
        return n

    def _split(self, pipeline: str, j: int) -> tuple[float, float, float] | None:
        """(hash probes, bucket entries, scanned rows) per tuple reaching the operator at
        0-based position j, from its profiled work units per tuple c_ij (``engine.interp``
        counts a probe 1 and each entry 1, or each row a scan examines 1, and charges the
        operator for the results emitted after it and the tuples passing a CacheUpdate
        right after it, which are not its own). None until a tuple reached it."""
        stats = self.profiler.pipelines.get(pipeline)
        c = stats.c(j) if stats is not None else None
        if c is None:
            return None
        dj = stats.delta[j].get()
        extra = 0.0
        if dj > 0:
            if j == len(stats.order) - 1:
                extra += (stats.output() or 0.0) / dj
            for st in {id(st.cache): st for st in self._used()}.values():
                z = set(st.candidate.segment) | set(st.candidate.extra)
                if pipeline in z and max(len(z) - 1, 1) - 1 == j:
                    extra += self._passes(pipeline, len(z) - 1) / dj
        w = max(0.0, c - extra)
        if self._is_scan(pipeline, j):
            return 0.0, 0.0, w
        return 1.0, max(0.0, w - 1.0), 0.0

    def _is_scan(self, pipeline: str, j: int) -> bool:
        """Whether operator j of ``pipeline`` examines window rows (a nested-loop join or
        a cartesian step) rather than probing a hash index."""
        ex = self._ex
        if ex is None:
            return False
        order = tuple(ex.orders[pipeline])
        key = (pipeline, order, j)
        got = self._scan_flags.get(key)
        if got is None:
            positions, _ = probe_plan(ex.query, order[j], [pipeline, *order[:j]])
            got = self._scan_flags[key] = not positions or ex.scans(order[j], positions)
        return got

    def _passes(self, pipeline: str, pos0: int) -> float:
        """Tuples per profiled tuple of ``pipeline`` reaching 0-based position pos0 (past
        the last operator: its results): those a CacheUpdate after pos0 joins sees."""
        stats = self.profiler.pipelines.get(pipeline)
        if stats is None:
            return 0.0
        if pos0 < len(stats.order):
            return stats.delta[pos0].get()
        return stats.output() or 0.0

    def _tuples_per_entry(self, c: Candidate) -> float:
        """Tuples of one cache entry: those leaving the segment per tuple entering it."""
        before = self._passes(c.pipeline, c.start - 1)
        return self._passes(c.pipeline, c.end) / before if before > 0 else 0.0

    def _credible(self, e: Estimate) -> bool:
        """Whether a cache not in use may be chosen, given how far the model has been
        wrong and how finely a trial can measure (beyond the paper): its predicted saving,
        net benefit over the plan's predicted cost, must exceed the mean amount by which
        the model's predicted CPU ratio of the caches tried so far fell short of the
        measured one (``model_error``, the W most recent trials of a new cache) plus the
        trial's resolution (``_resolution``). A saving the trial cannot tell from noise
        is a coin flip when tried (a new cache is kept when not slower at all), and its
        trial costs more than the saving: on the A-Greedy drift benchmark caches predicted
        to save 5–7% were tried against bands of 4–10% and kept or undone at random, two
        or three trials a run. With neither known (no trial yet, too few intervals
        before), every candidate may be chosen, as in the paper."""
        bar = self._bar()
        if bar <= 0:
            return True
        units = self.units_rate()
        return units <= 0 or (e.benefit - e.cost) / units > bar

    def _bar(self) -> float:
        """The predicted saving (net benefit over the plan's predicted CPU) a cache not in
        use must exceed to be chosen: the model's mean error (``model_error``) plus the
        trial's resolution (``_resolution``)."""
        return (self.model_error.get() if self.model_error.n else 0.0) + self._resolution()

    def _may_pay(self, st: CandidateState) -> bool:
        """Beyond the paper: whether profiling a candidate can lead to choosing it. The
        Bloom filter's miss probability is the only statistic profiling it adds; §4.1's
        net benefit is linear in it (``model.cache_estimate``), so with the other terms
        known (the segment's operators, the tuples reaching and leaving it, the CacheUpdates'
        tuples) the net benefit is at most its value at a miss probability of 0 or of 1
        (``_best_net``). When that over the plan's predicted CPU does not exceed the bar
        of ``_credible``, no Bloom filter, miss estimate or selection can make the
        candidate credible: it is not profiled (no observer compiled into its pipeline).
        With only its operators known, the bound is their cost (every probe a hit and
        caching free). Profiled as in the paper while its operators are not yet profiled
        or the bar is 0."""
        bar = self._bar()
        if bar <= 0:
            return True
        c = st.candidate
        ops = [self._operator_cost(c.pipeline, j) for j in range(c.start, c.end + 1)]
        units = self.units_rate()
        if None in ops or units <= 0:
            return True
        best = self._best_net(st)
        return (math.fsum(ops) if best is None else best) / units > bar

    def _best_net(self, st: CandidateState) -> float | None:
        """The largest net benefit §4.1 can give the candidate over miss probabilities in
        [0, 1] (the estimate at 0 or at 1: it is linear in the miss probability); None
        while a term other than the miss probability is unknown."""
        terms = self._terms(st)
        if terms is None:
            return None
        return max(e.benefit - e.cost for e in (
            cache_estimate(*terms[:3], miss, *terms[3:]) for miss in (0.0, 1.0)))

    def _resolution(self) -> float:
        """The smallest change of the CPU per arrival a trial can tell from noise: the
        mean band of the trials run against a control so far (``trial_band``), before any
        the band a trial would have, predicted from the spread of the intervals just
        before (``verify.resolution``), or, while too few intervals are (after a quiet
        stretch, or another plan), the last band so predicted; 0 when none is known (or
        with ``--no-cache-verify``: the paper's policy). (Quiet ticks count no interval, so
        at a re-profiling after one the bar used to fall to 0, and every candidate was
        profiled again however far below the bar its best case was: ``_may_pay``.)"""
        if not self.verify:
            return 0.0
        if self.trial_band.n:
            return self.trial_band.get()
        band = resolution(list(self._before), self.trial_intervals)
        if band is not None:
            self._band_predicted = band
        return self._band_predicted

    def _measure_rates(self, now: float, arrivals: int, ts: float) -> None:
        """At a tick without a trial: the CPU seconds per second of event time since the
        last tick over the model's cost per second of the plan in force. On the work
        clock this is seconds per work unit, the rate that converts the model's benefits
        into CPU time; on the measured clock it is measured over predicted CPU (1 when
        the model is right; reported, never used to rescale)."""
        if self._clock is None or ts <= self._clock[2]:
            return
        elapsed = ts - self._clock[2]
        self.arrival_rate.update((arrivals - self._clock[1]) / elapsed)
        work = self.costs().clock == "work"
        if not work and self._ticks % COUNT_SPAN:
            return  # (a diagnostic on the measured clock: every COUNT_SPAN ticks is enough)
        units = self.units_rate()
        if units > 0:
            rate = (now - self._clock[0]) / elapsed / units
            (self.seconds_per_unit if work else self.measured_over_predicted).update(rate)

    def _predicted_ratio(self, changes) -> float | None:
        """The CPU ratio with/without ``changes`` the model predicts: the plan's work
        units after them over those before (uses save their net benefit, drops give it
        back)."""
        after = self.units_rate()
        before = after + _saved(changes)
        return after / before if before > 0 else None

    def _unsettled(self, arrivals) -> bool:
        """Beyond the paper (§4.5 step 5 restarts the candidates at every re-ordering):
        while another policy is still re-ordering (A-Greedy converging takes several steps,
        a few thousand arrivals apart), wait until the orders have held for half an
        interval I before enumerating and profiling the new candidates: each round of
        Bloom observers recompiles the pipelines and profiles at the full p for orders
        about to change again. Caches in pipelines that were not re-ordered stay as they
        are meanwhile; the executor removed those of the re-ordered ones. (The orders are
        followed at every tick that is not quiet: ``_pending_since``.)"""
        return arrivals - self._pending_since < self.reopt_interval // 2

    def _quiet(self, ex, arrivals) -> bool:
        """Nothing can happen at this tick: no trial, no cache in use to watch, no
        candidate being profiled, no re-profiling due, the orders as they were. (A tick
        then costs two clock reads.) A memory budget does not keep ticks busy: §5 allocates
        memory to the caches in use, and with none in use it has nothing to check (a budget
        of 0 makes the policy idle, ``_idle``, which every tick checks first). Quiet ticks
        under a budget need the band the bar keeps across them (``_resolution``): without
        it each re-profiling profiled every candidate again at the full p."""
        return (self.trial is None and self.selections > 0 and arrivals < self.next_reopt
                and not self._watching
                and getattr(ex, "reorders", 0) == self._reorders_seen
                and all(tuple(ex.orders[a]) == o for a, o in self.orders.items()))

    @property
    def _watching(self) -> bool:
        return any(st.state in ("used", "profiled") for st in self.states.values())

    # ----- decisions checked by measurement (adapt.caching.verify) -------------------------
    def _sample(self, cq, now: float) -> float | None:
        """CPU seconds per arrival since the last tick ended (the policy's own time at the
        ticks left out)."""
        if self._clock is None:
            return None
        n = cq.next_rid - self._clock[1]
        return (now - self._clock[0]) / n if n > 0 else None

    def _trial_step(self, ex, arrivals, ts, sample) -> None:
        """Measure a change A/B/A: ``trial``/2 intervals with it, ``trial`` intervals
        without it (the control), ``trial``/2 with it again, so that a steady drift of
        the cost per arrival cancels; then keep the cheaper. A change slower than its
        control by more than the noise band is undone, and its candidates wait
        ``verify.backoff`` arrivals. Measuring starts once the state has stopped growing
        (windows still filling make later intervals dearer) and skips the interval that
        recompiled the pipelines. When the change is clearly faster or clearly slower than
        its control (``verify.clear``), the control ends after ``EARLY`` intervals, the
        change kept or left undone: the change goes first, and its control is cut short,
        because a good cache taken away costs its full price every interval, and a bad one
        tried again as much. A change that halves the CPU per arrival of the intervals just
        before it (``verify.decisive``) is kept without a control."""
        t = self.trial
        size = ex.state_tuples()
        growing, t["size"] = size > 1.02 * t.get("size", 0), size
        if sample is None:
            return
        if t["settle"]:
            t["settle"] -= 1
            return
        half = max(1, self.trial_intervals // 2)
        if t["phase"] == "after" and len(t["early"]) < 2 * self.trial_intervals:
            # Growing or not: intervals with the change against those just before it
            # (windows filling only make the later ones dearer).
            t["early"].append(sample)
            if decisive(t["early"], t["before"]):
                self._verdict(ex, arrivals, ts, t, t["early"], t["before"], "before")
                return
        if growing:
            return
        if t["phase"] == "after":
            t["after"].append(sample)
            if len(t["after"]) >= half:
                self._apply(ex, t["actions"], arrivals, ts, revert=True, why="control")
                t["phase"], t["settle"] = "control", 1
        elif t["phase"] == "control":
            t["control"].append(sample)
            early = clear(t["after"], t["control"]) if len(t["control"]) >= EARLY else None
            if early is True:
                self._apply(ex, t["actions"], arrivals, ts, why="clearly faster")
                self._verdict(ex, arrivals, ts, t, t["after"], t["control"])
            elif early is False:  # clearly slower: undone as it stands (no "again" phase)
                self._verdict(ex, arrivals, ts, t, t["after"], t["control"])
            elif len(t["control"]) >= self.trial_intervals:
                self._apply(ex, t["actions"], arrivals, ts, why="trial")
                t["phase"], t["settle"] = "again", 1
        else:
            t["after"].append(sample)
            if len(t["after"]) >= 2 * half:
                self._verdict(ex, arrivals, ts, t, t["after"], t["control"])

    def _verdict(self, ex, arrivals, ts, t: dict, after: list, control: list,
                 against: str = "control") -> None:
        # A new cache must not be slower at all (it costs memory and every update of its
        # inputs; a tie keeps the plain pipeline); a drop stays unless it was slower by
        # more than the noise band.
        adds = any(action == "use" for action, _ in t["actions"])
        if against == "before":  # verify.decisive: no control was run
            keep, ratio, band = True, before_ratio(after, control), 0.0
        else:
            keep, ratio, band = keep_change(after, control, floor=0.0 if adds else
                                            NOISE_FLOOR, strict=adds)
        what = ", ".join(f"{a} {st.candidate.name}" for a, st in t["actions"])
        with_ = sum(after) / len(after)
        without = (sum(control) / len(control) if against == "control"
                   else before_mean(control))
        # The model against the measurement: the CPU ratio with/without the change, and the
        # CPU seconds it saves per second of event time (predicted: its net benefit in work
        # units at the measured seconds per unit; measured: per-arrival CPU × arrival rate).
        figures = {"arrival": arrivals, "change": what, "ratio": ratio, "band": band,
                   "kept": keep, "cpu_per_arrival_with": with_,
                   "cpu_per_arrival_without": without, "against": against,
                   "predicted_ratio": t.get("predicted_ratio"),
                   "predicted_cpu_saved_per_s": self._seconds(_saved(t["actions"])),
                   "measured_cpu_saved_per_s": ((without - with_) * self.arrival_rate.get()
                                                if self.arrival_rate.n else None),
                   "predicted_net_benefit": [_net(st) for _, st in t["actions"]],
                   "clock": self.costs().clock}
        log_bounded(self.measured, figures)
        if against == "control":  # the trial's resolution, whatever the change
            self.trial_band.update(keep_change(after, control, floor=0.0)[2])
        if all(a == "use" for a, _ in t["actions"]) and None not in (
                ratio, figures["predicted_ratio"]):
            self.model_error.update(ratio - figures["predicted_ratio"])
        self.trials += 1
        self.trial = None
        # (the change is in force here: the after and again phases run with it)
        if keep:
            self._log(arrivals, ts, "keep", f"{what}: {ratio:.3f}× the CPU per arrival "
                      + ("before it (no control needed)" if against == "before" else
                         f"without it (band {band:.1%})"))
            return
        self._apply(ex, t["actions"], arrivals, ts, revert=True, why="undone")
        self.undone += 1
        for action, st in t["actions"]:
            st.fails += 1
            until = arrivals + backoff(st.fails, self.reopt_interval)
            if action == "use":
                st.banned_until = until
                self.chosen.discard(st.candidate)
            else:
                st.pinned_until = until
                self.chosen.add(st.candidate)
        self._log(arrivals, ts, "undo", f"{what}: {ratio:.3f}× the CPU per arrival "
                  f"without it (band {band:.1%}); not chosen again for "
                  f"{backoff(t['actions'][0][1].fails, self.reopt_interval):,} arrivals, "
                  "then when its estimates next change")

    def _apply(self, ex, actions, arrivals, ts, revert: bool = False, why: str = "") -> None:
        for action, st in actions:
            if (action == "use") != revert:
                if st.state != "used":
                    self._use(ex, st, arrivals, ts)
            elif st.state == "used":
                self._drop(ex, st, arrivals, ts, why)

    def _seconds(self, units: float) -> float | None:
        """The model's cost per second of event time as CPU seconds per second: as it is
        on the measured clock, at the measured seconds per work unit on the work clock."""
        if self.costs().clock == "seconds":
            return units
        return units * self.seconds_per_unit.get() if self.seconds_per_unit.n else None

    def _end_trial(self, arrivals, ts, why: str) -> None:
        """A trial cut short (a re-ordering removed its caches, or the memory budget
        acted): the current state stands."""
        if self.trial is not None:  # (in its control phase the change stays reverted)
            self.trial = None
            self._log(arrivals, ts, "trial ended", why)

    def _adapt_profiling(self, cq, now: float) -> None:
        """Cheap profiling: while the estimates are stable (a selection made, no trial, no
        candidate without an estimate), scale p_i so that profiling takes at most
        ``verify.TARGET_SHARE`` of the CPU; otherwise profile at the full p_i."""
        tick = (cq.profile_cpu, now, self._profiled())
        stable = (self.verify and self.selections > 0 and self.trial is None and all(
            st.estimate is not None for st in self.states.values()
            if st.state == "profiled"))  # (verify=False: the paper's policy, p throughout)
        if not stable:
            self._shares.clear()  # the share is measured from the first stable tick on
            self._shares.append(tick)
            if self.p_scale < 1.0:  # profile at the full p_i from the next arrival on,
                self.p_scale = 1.0  # not after a gap drawn at the scaled-down p
                cq.reschedule()
            return
        if not self._shares or self._shares[-1][1] != now:
            self._shares.append(tick)
        if share_ready(self._shares, self.W):
            share = profile_share(self._shares) or 0.0
            full = max([self.p, *self._p_i.values()])
            self.p_scale = profiling_scale(self.p_scale, share, min(1.0, P_MIN / full))
            self._shares.clear()
            self._shares.append(tick)  # the next window starts here, at the new scale

    # ----- candidates ----------------------------------------------------------------------
    def _new_candidates(self, ex, arrivals, ts) -> None:
        """(Re)compute candidates for the current orders; keep the state of unchanged ones
        (the executor already removed caches whose pipeline was re-ordered)."""
        self.orders = {a: tuple(o) for a, o in ex.orders.items()}
        self._reorders_seen = getattr(ex, "reorders", 0)
        m = self.m if self.caches == "global" else None
        fresh = enumerate_candidates(ex.query, ex.orders, m)
        placed = {(p, j, k, c.extra) for p, lst in ex.placements.items() for j, k, c in lst}
        old = self.states
        self.states = {}
        ex.clear_observers()
        watches = []
        for cand in fresh:
            st = old.get(cand)
            if st is not None and st.state == "used" and \
                    (cand.pipeline, cand.start, cand.end, cand.extra) in placed:
                self.states[cand] = st
                continue
            st = CandidateState(cand, state="unused")
            if cand in old:  # a measured penalty outlives a re-ordering
                o = old[cand]
                st.fails, st.banned_until, st.pinned_until = (o.fails, o.banned_until,
                                                              o.pinned_until)
            self.states[cand] = st
            if self._may_pay(st):
                watches += self._profile(ex, st)
        ex.observe_probes(watches)
        self._log(arrivals, ts, "candidates", f"{len(fresh)} candidates for the new orders")

    def _profile(self, ex, st: CandidateState) -> list:
        """Move a candidate to *profiled*: a Bloom filter to watch its probe stream with
        (returned as the watch to give ``MJoin.observe_probes``), a fresh one unless its
        last is still filling (it kept counting across re-profilings: ``_stop_profiling``)."""
        if not any(x.state == "profiled" for x in self.states.values() if x is not st):
            self.profiling_since = self._arrivals
        st.state = "profiled"
        if st.bloom is None or st.bloom.ready:
            st.bloom = BloomMissRate(self.W_d, self.alpha, self.W)
        return self._watch(ex, st)

    def _watch(self, ex, st: CandidateState) -> list:
        """The watch of a profiled candidate's probe stream by its Bloom filter."""
        c = st.candidate
        prefix = [c.pipeline, *ex.orders[c.pipeline][:c.start - 1]]
        key = cache_key(ex.query, prefix, c.segment)  # c.key as the engine orders it
        return [(c.pipeline, c.start, key, st.bloom.observe)] if key else []

    # ----- estimates (§4.1, §4.3, App. A) ----------------------------------------------------
    def _d(self, pipeline: str, pos0: int) -> float | None:
        """Tuples per unit time reaching 0-based position pos0 of ``pipeline`` (the
        pipeline's output rate when pos0 is past its last operator)."""
        stats = self.profiler.pipelines.get(pipeline)
        rate = self.profiler.rate(pipeline)
        if stats is None:
            return None
        if pos0 < len(stats.order):
            # δ is observed (zeros included) for every profiled tuple at every position.
            return stats.d(pos0, rate) if stats.delta[pos0].ready else None
        out = stats.output()
        return None if out is None else rate * out

    def _operator_cost(self, pipeline: str, pos1: int) -> float | None:
        """d_ij·c_ij of the operator at 1-based position pos1 per unit time: in work units
        on the work clock, in CPU seconds from its operations (``_split``) at their
        measured costs on the measured clock (``model.operator_cost``)."""
        stats = self.profiler.pipelines.get(pipeline)
        d = self._d(pipeline, pos1 - 1)
        if stats is None or d is None:
            return None
        if d == 0:  # no tuple reaches this operator: it costs nothing
            return 0.0
        costs = self.costs()
        if costs.clock == "work":
            c = stats.c(pos1 - 1)
            return None if c is None else d * c
        split = self._split(pipeline, pos1 - 1)
        return None if split is None else operator_cost(d, split, costs)

    def estimate(self, st: CandidateState) -> Estimate | None:
        """benefit(C_ijk) and cost(C_ijk) of §4.1 from the current statistics
        (``model.cache_estimate``), per second of event time: CPU seconds at the measured
        per-operation costs, or work units on the work clock (``costs``). None until every
        statistic has W observations (§4.5 step 2)."""
        c = st.candidate
        if st.state == "used" and st.observed_miss.ready:
            miss = st.observed_miss.get()  # observed once W intervals have been seen
        elif st.state == "used":           # until then: the estimate it was chosen on
            miss = st.bloom.get() if st.bloom is not None and st.bloom.ready else 1.0
        else:
            miss = st.bloom.get() if st.bloom is not None and st.bloom.ready else None
        if miss is None and self._d(c.pipeline, c.start - 1) == 0:
            miss = 1.0  # no tuple reaches the segment: nothing to probe
        terms = None if miss is None else self._terms(st)
        if terms is None:
            return None
        return cache_estimate(*terms[:3], miss, *terms[3:])

    def _terms(self, st: CandidateState) -> tuple | None:
        """The arguments of ``model.cache_estimate`` besides the miss probability: Σ
        d_il·c_il over the segment, d_ij, d_{i,k+1}, the CacheUpdates' d_{l,|Z|-1}, the
        costs and the append-mode maintenance joins; None while one is unknown."""
        c = st.candidate
        ops = [self._operator_cost(c.pipeline, j) for j in range(c.start, c.end + 1)]
        d_in = self._d(c.pipeline, c.start - 1)
        d_out = self._d(c.pipeline, c.end)
        z = set(c.segment) | set(c.extra)
        ups = [self._d(lp, len(z) - 1) for lp in z]
        if None in ops or None in ups or d_in is None or d_out is None:
            return None
        costs = self.costs()
        maintain = 0.0
        if costs.clock == "seconds" and not getattr(self._ex, "retract", True):
            # append mode: deletions of Z's streams run their first |Z| - 1 joins only to
            # reach the CacheUpdates (a plan without the cache runs nothing for them)
            joins = [self._operator_cost(lp, j) for lp in z for j in range(1, len(z))]
            if None in joins:
                return None
            maintain = math.fsum(joins)
        return math.fsum(ops), d_in, d_out, ups, costs, maintain

    def _ready(self) -> bool:
        """Every profiled candidate has W observations of each statistic."""
        return all(self.estimate(st) is not None
                   for st in self.states.values() if st.state == "profiled")

    def _pending(self) -> bool:
        """Some candidate is being profiled (§4.5: its selection is still to come)."""
        return any(st.state == "profiled" for st in self.states.values())

    def operator_costs(self) -> dict:
        return {(a, j): self._operator_cost(a, j) or 0.0
                for a, order in self.orders.items() for j in range(1, len(order) + 1)}

    # ----- the re-optimizer ------------------------------------------------------------------
    def _reselect(self, ex, arrivals, ts) -> None:
        if self.verify and self.op_costs.n:  # the freshest per-operation costs decide
            fit = self.op_costs.get(fresh=True)
            if self._costs is None or self._costs.clock == "work" or fit is not self._fit_used:
                self._costs = None
        estimates = {c: self.estimate(st) for c, st in self.states.items()}
        estimates = {c: e for c, e in estimates.items() if e is not None
                     and self.states[c].banned_until <= arrivals  # undone: waits
                     and (self.states[c].state == "used" or self._credible(e))}
        changed = self.selections == 0 or any(
            _changed(self.states[c].estimate, e, self.change) for c, e in estimates.items())
        for c, e in estimates.items():
            if self.states[c].state == "profiled" or changed:
                self.states[c].estimate = e
        # Beyond the paper (cheap profiling): while re-profiling changes no cache, the next
        # one waits twice as long (up to REPROFILE_MAX·I): its Bloom observers and the
        # pipelines' recompilation cost CPU every time.
        before = {c for c, st in self.states.items() if st.state == "used"}
        self._reselect_with(ex, arrivals, ts, estimates, changed)
        after = {c for c, st in self.states.items() if st.state == "used"}
        pending = self._pending()  # (a selection on timeout: the round is not over)
        if pending:
            self.profiling_since = arrivals  # the next on timeout I later, not every tick
        if after != before:
            self.reprofile_scale = 1
        elif not pending:
            self.reprofile_scale = min(REPROFILE_MAX, self.reprofile_scale * 2)

    def _stop_profiling(self, ex) -> None:
        """At a selection: the profiled candidates whose estimates are ready are done
        (unused until chosen); one still without an estimate (the selection ran on
        timeout, ``on_interval``) stays profiled and keeps its observer and Bloom filter
        until it has W observations of every statistic (§4.5 step 2). (Unprofiled at the
        timeout, it was given a fresh filter at the next re-profiling: with I below the
        W·W_d probes the filter needs, 1,000 by default, no candidate was ever estimated,
        and none chosen.) Past ``PENDING_MAX`` selections without one (its probe position is rarely reached,
        e.g. behind a used cache's hits) it becomes unused too, so that ticks may stretch
        again; its unfinished filter is kept for its next re-profiling (``_profile``)."""
        for st in self.states.values():
            if st.state != "profiled":
                continue
            if self.estimate(st) is not None:
                st.state, st.pending = "unused", 0
            else:
                st.pending += 1
                if st.pending > PENDING_MAX:
                    st.state, st.pending = "unused", 0
        self._sync_observers(ex)

    def _sync_observers(self, ex) -> None:
        """Only the profiled candidates' probe streams are watched: the other observers
        go (one recompilation of their pipelines, and none when none must go)."""
        want = [st for st in self.states.values()
                if st.state == "profiled" and st.bloom is not None]
        live = {id(fn) for watchers in ex.observers.values() for _, fn in watchers}
        if live <= {id(st.bloom.observe) for st in want}:
            return
        ex.clear_observers()
        ex.observe_probes([w for st in want for w in self._watch(ex, st)])

    def _reselect_with(self, ex, arrivals, ts, estimates: dict, changed: bool) -> None:
        if not changed:  # §4.5 c: nothing moved by more than p: keep the selection
            self._stop_profiling(ex)
            for c, st in self.states.items():
                if c in self.chosen and st.state != "used" and st.banned_until <= arrivals \
                        and st.estimate is not None and self._credible(st.estimate):
                    self._use(ex, st, arrivals, ts)  # e.g. dropped for memory earlier
            self._sync_observers(ex)  # (one re-profiled, used on its earlier estimate)
            return
        try:
            sel = select(list(estimates), estimates, self.operator_costs(), self.method,
                         rng=self.seed + self.selections)
        except ValueError as e:
            # A forced method the candidates of a re-ordered plan no longer fit (checked
            # at attach for the first plan: check_executor): greedy takes any, and the
            # report and history say so.
            self.method_fallbacks += 1
            self._log(arrivals, ts, "method", f"greedy instead of {self.method}: {e}")
            sel = select(list(estimates), estimates, self.operator_costs(), "greedy",
                         rng=self.seed + self.selections)
        self.selections += 1
        self.chosen = set(sel.chosen)
        self._stop_profiling(ex)
        for c, st in self.states.items():
            if c in sel.chosen and st.state != "used":
                self._use(ex, st, arrivals, ts)
            elif c not in sel.chosen:
                if st.state == "used" and st.pinned_until > arrivals:
                    continue  # its drop was undone by measurement: it stays for now
                if st.state == "used":
                    self._drop(ex, st, arrivals, ts, "not selected")
                if st.state != "profiled":  # (not yet estimated: stays, _stop_profiling)
                    st.state = "unused"
        self._log(arrivals, ts, "select", f"{sel.method}: {len(sel.chosen)} chosen, "
                  f"net benefit {sel.net_benefit:.3g}")

    def _use(self, ex, st: CandidateState, arrivals, ts) -> None:
        c = st.candidate
        if self._window is None:
            self._window = {s_.alias: float(s_.window.size) for s_ in ex.query.streams
                            if s_.window.kind == "range"}
        buckets = self._buckets(st, ex.retract)
        try:
            st.cache = ex.place_cache(c.pipeline, c.start, c.end, c.extra, buckets=buckets)
        except ValueError as e:  # e.g. a CacheUpdate inside another cached segment
            st.state = "unused"
            self._log(arrivals, ts, "refused", f"{c.name}: {e}")
            return
        st.state = "used"
        st.seen = tuple(st.cache.counts)
        st.observed_miss = WindowAverage(self.W)
        e = st.estimate
        if self._changes is not None:
            self._changes.append(("use", st))
        self._log(arrivals, ts, "use", f"{c.name} (benefit {e.benefit:.3g}, cost {e.cost:.3g})"
                  if e is not None else c.name)

    def _drop(self, ex, st: CandidateState, arrivals, ts, why: str) -> None:
        if st.cache is not None:
            ex.drop_cache(st.candidate.pipeline, st.cache)
        st.cache = None
        st.state = "unused"
        if self._changes is not None:
            self._changes.append(("drop", st))
        self._log(arrivals, ts, "drop", f"{st.candidate.name}: {why}")

    def _watch_used(self, ex, arrivals, ts, drop: bool = True) -> None:
        """§4.5 a: benefit − cost of used caches, with the observed miss probability; a
        cache that turned negative is dropped at once (not during a trial, and not while
        an undone drop pins it)."""
        for st in self.states.values():
            if st.state != "used" or st.cache is None:
                continue
            hits, misses = st.cache.counts
            dh, dm = hits - st.seen[0], misses - st.seen[1]
            st.seen = (hits, misses)
            if dh + dm:
                st.observed_miss.update(dm / (dh + dm))
            e = self.estimate(st)
            if e is not None:
                st.estimate = e
                if e.benefit - e.cost < 0 and drop and st.pinned_until <= arrivals:
                    self.chosen.discard(st.candidate)  # (not used again unselected)
                    self._drop(ex, st, arrivals, ts, f"net benefit {e.benefit - e.cost:.3g} < 0")

    # ----- memory (§5) -------------------------------------------------------------------------
    def expected_bytes(self, st: CandidateState) -> float:
        """Expected memory: expected entries (distinct keys, from the Bloom filter) times
        the expected entry size (d_{i,k+1}/d_ij tuples per entry, Appendix A)."""
        c = st.candidate
        distinct = st.bloom.distinct() if st.bloom is not None and st.bloom.ready else 64
        d_in, d_out = self._d(c.pipeline, c.start - 1), self._d(c.pipeline, c.end)
        per_entry = (d_out / d_in) if d_in and d_out is not None else 1.0
        tuple_bytes = 2 * (40 + 8 * len(c.segment)) + 16
        return max(1.0, distinct) * (200 + per_entry * tuple_bytes)

    def _buckets(self, st: CandidateState, retract: bool = False) -> int:
        """§3.3: the bucket count from the expected size (a prime: ``_prime_at_least``).
        The Bloom filter counts distinct keys among W_d probes. In retract mode an entry
        is probed again when its probing tuple leaves the window, so the keys that must
        fit are those of a whole window: the distinct share of the probes times the
        probes per window length (a cache sized for W_d probes would miss on nearly every
        deletion, and a miss recomputes the segment)."""
        distinct = st.bloom.distinct() if st.bloom is not None and st.bloom.ready else 64
        if retract and self._window is not None:
            c = st.candidate
            rate = self._d(c.pipeline, c.start - 1)
            w = self._window.get(c.pipeline)
            if rate and w:
                distinct = max(distinct, min(MAX_KEYS, distinct / self.W_d * rate * w))
        return _prime_at_least(max(17, int(8 * distinct)))

    def set_memory(self, memory: int | None) -> None:
        """Change the cache memory budget (bytes; None = unlimited) while the query runs."""
        if memory is not None and not (is_finite(memory) and memory >= 0):
            raise ValueError(f"--cache-memory must be >= 0 bytes, got {memory!r}")
        self.memory = memory

    def _sample_peak(self) -> int:
        """The caches in use now: their total size (bytes), taken into the peak
        (``cache_memory_peak_bytes``: the largest total seen at a tick, before the tick's
        drops, or after a resize, or at the end)."""
        total = sum(st.cache.size_bytes() for st in self.states.values()
                    if st.state == "used" and st.cache is not None)
        self.peak_bytes = max(self.peak_bytes, total)
        return total

    def _enforce_memory(self, ex, arrivals, ts) -> bool:
        """§5's budget; returns whether a cache was dropped or shrunk. Without a budget
        shrunk caches are grown back every SHARE_TICKS ticks only (the peak is sampled at
        every tick: ``_sample_peak``)."""
        self._ticks += 1
        if self.memory is None and self._ticks % SHARE_TICKS:
            return False
        logged = self.logged
        used = [st for st in self.states.values() if st.state == "used" and st.cache is not None]
        total = sum(st.cache.size_bytes() for st in used)
        if self.memory is not None:
            # Lowest priority first: (benefit − cost) per expected byte.
            used.sort(key=lambda st: _net(st) / self.expected_bytes(st))
            victims = list(used)
            while total > self.memory and victims:
                st = victims[0]
                if st.cache is None:
                    victims.pop(0)
                    continue
                before = st.cache.size_bytes()
                if st.cache.buckets > 17:
                    ex.resize_cache(st.cache, _prime_at_least(max(17, st.cache.buckets // 4)))
                    self._log(arrivals, ts, "shrink", f"{st.candidate.name} to "
                              f"{st.cache.buckets} buckets (budget {self.memory:,} B)")
                else:
                    self._drop(ex, st, arrivals, ts, f"memory budget {self.memory:,} B")
                total -= before - (st.cache.size_bytes() if st.cache is not None else 0)
        # Grow shrunk caches back, highest priority first, while the budget allows.
        for st in sorted((x for x in used if x.cache is not None),
                         key=lambda x: -_net(x) / self.expected_bytes(x)):
            want = self._buckets(st, ex.retract)
            if st.cache.buckets >= want:
                continue
            before = st.cache.size_bytes()
            per_bucket = before / st.cache.buckets
            grown = min(want, _prime_at_least(st.cache.buckets * 4))
            if self.memory is None or total + per_bucket * (grown - st.cache.buckets) \
                    <= self.memory:
                old_buckets = st.cache.buckets
                ex.resize_cache(st.cache, grown)
                after = st.cache.size_bytes()
                if self.memory is not None and total + after - before > self.memory:
                    ex.resize_cache(st.cache, old_buckets)  # the estimate was too low
                    break
                total += after - before
                self._log(arrivals, ts, "grow", f"{st.candidate.name} to {grown} buckets")
        self.peak_bytes = max(self.peak_bytes, total)
        return any(h["event"] in ("shrink", "drop") for h in self._logged_since(logged))

    # ----- reporting -------------------------------------------------------------------------
    def cost_model(self) -> str:
        """Which costs §4.1's estimates use, in one line (the run summary, explain)."""
        if not self.verify:
            return "work clock (--no-cache-verify: the paper's policy, counted work units)"
        fit = self.op_costs.get()
        if fit is None:
            return "work clock (no interval measured yet)"
        return f"CPU seconds per operation, measured: {fit.status}"

    def predicted(self, st: CandidateState) -> tuple[float | None, float | None]:
        """A candidate's predicted net benefit in CPU seconds per second of input (None
        before it can be converted) and the CPU ratio of the plan with it over the plan
        without it (§4.1's net benefit against the plan's predicted cost)."""
        e = st.estimate or self.estimate(st)
        if e is None:
            return None, None
        net, units = e.benefit - e.cost, self.units_rate()
        with_, without = (units, units + net) if st.state == "used" else (units - net, units)
        return self._seconds(net), (with_ / without if without > 0 else None)

    def describe_predictions(self, top: int = 5) -> list[str]:
        """The candidates the model likes best, each with its predicted net CPU saving and
        CPU ratio (the run summary's ``cache_predicted``; what was measured of them is in
        ``cache_measured``)."""
        rows = []
        for st in self.states.values():
            net, ratio = self.predicted(st)
            if ratio is not None:
                rows.append((ratio, f"{st.candidate.name} ({st.state}): predicted CPU ratio "
                             f"{ratio:.2f}×" + ("" if net is None else
                                               f", net {net * 1e3:+.3g} ms per second of input")))
        return [text for _, text in sorted(rows, key=lambda r: r[0])[:top]]

    def seconds_per_operation(self) -> dict | None:
        """The measured seconds per operation of each kind (ns, rounded), the kinds the
        intervals determined marked with *, the rest on the prior's split."""
        fit = self.op_costs.get() if self.verify else None
        if fit is None:
            return None
        return {k + ("*" if k in fit.determined else ""): round(v * 1e9, 1)
                for k, v in fit.seconds.items()}

    def _log(self, arrivals, ts, event, what) -> None:
        log_bounded(self.history, {"arrival": arrivals, "ts": ts, "event": event, "what": what})
        self.logged += 1
        self.changes += event in ("use", "drop", "shrink", "grow")

    def _logged_since(self, logged: int) -> list[dict]:
        """The events logged since ``self.logged`` was ``logged`` that the history still
        keeps (all of them, unless one tick logged more than it keeps)."""
        n = self.logged - logged
        return self.history[max(0, len(self.history) - n):] if n else []

    def check_executor(self, ex) -> None:
        """At attach (``ContinuousQuery.attach``): a forced selection method that cannot take
        the query's candidates under its current orders is refused now, not at the first
        selection mid-run (``caching.check_method``). Keeps the executor (``report``)."""
        check_method(self.method, enumerate_candidates(
            ex.query, ex.orders, self.m if self.caches == "global" else None))
        self._ex = ex

    def candidate_count(self) -> int:
        """The query's candidate caches (§4.2, and §6's up to m with ``caches="global"``)
        under the orders the policy follows: once a tick has made them, those it keeps
        (``states``); before (an input that ends before the first tick, or a budget of 0
        bytes: ``_idle``) those of the executor's orders, enumerated without profiling
        any. 0 only when the query has nothing to cache (a pipeline of two or more joins
        is needed)."""
        ex = self._ex
        if self.orders or ex is None:
            return len(self.states)
        return len(enumerate_candidates(ex.query, ex.orders,
                                        self.m if self.caches == "global" else None))

    def report(self) -> dict:
        used = [st for st in self.states.values() if st.state == "used" and st.cache]
        self._sample_peak()  # (sizes are sampled at ticks: the peak includes now)
        return {
            "caches_used": [f"{st.candidate.name} hit rate {st.cache.hits / st.cache.probes:.1%}"
                            if st.cache.probes else st.candidate.name for st in used],
            "cache_candidates": self.candidate_count(),
            "cache_selections": self.selections,
            "cache_changes": self.changes,
            "cache_memory_peak_bytes": self.peak_bytes,
            "cache_method_fallbacks": self.method_fallbacks,
            "cache_trials": self.trials,
            "cache_changes_undone": self.undone,
            "cache_measured": [dict(m) for m in self.measured[-5:]],
            "cache_predicted": self.describe_predictions(),
            "profiling_scale": self.p_scale,
            "cpu_seconds_per_work_unit": (self.seconds_per_unit.get()
                                          if self.seconds_per_unit.n else None),
            "cache_cost_model": self.cost_model(),
            "cpu_ns_per_operation": self.seconds_per_operation(),
            "cpu_measured_over_predicted": (self.measured_over_predicted.get()
                                            if self.measured_over_predicted.n else None),
            "cache_model_error": self.model_error.get() if self.model_error.n else None,
            "cache_history": [dict(h) for h in self.history],
        }


def describe_measured(m: dict) -> str:
    """One trial's verdict, the model's prediction beside the measurement (the run
    summary and ``adaptcq explain --caches`` print it)."""
    def ratio(x):
        return "—" if x is None else f"{x:.2f}×"

    def ms(x):
        return "—" if x is None else f"{x * 1e3:+.3g} ms"
    verdict = "kept" if m["kept"] else "undone"
    against = "the intervals before it" if m.get("against") == "before" else "a control"
    return (f"at arrival {m['arrival']:,}: {m['change']} {verdict}; CPU per arrival "
            f"{ratio(m['ratio'])} against {against}, model {ratio(m.get('predicted_ratio'))}; "
            f"CPU saved per second of input {ms(m.get('measured_cpu_saved_per_s'))} "
            f"measured, {ms(m.get('predicted_cpu_saved_per_s'))} predicted")


def _is_count(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _check_options(*, W, p, reopt_interval, change, caches, m, memory, W_d, alpha, method,
                   interval) -> None:
    """Refuse bad A-Caching options up front, naming each as the user writes it (the
    command-line option where there is one): a zero interval I divided by zero in p_i, a
    negative I or memory budget was accepted and silently meant "never" or "no caches"."""
    if not (_is_count(reopt_interval) and reopt_interval > 0):
        raise ValueError(f"--reopt-interval must be a positive number of tuples, "
                         f"got {reopt_interval!r}")
    if memory is not None and not (is_finite(memory) and memory >= 0):
        raise ValueError(f"--cache-memory must be >= 0 bytes, got {memory!r}")
    if caches not in ("prefix", "global"):
        raise ValueError(f"--caches must be prefix or global, got {caches!r}")
    if method not in METHODS:
        raise ValueError(f"unknown cache selection method {method!r}; choose one of "
                         f"{', '.join(METHODS)}")
    for name, value in (("W", W), ("W_d", W_d), ("interval", interval)):
        if not (_is_count(value) and value >= 1):
            raise ValueError(f"A-Caching option {name} must be a whole number ≥ 1, got {value!r}")
    if not (_is_count(m) and m >= 0):
        raise ValueError(f"A-Caching option m (the §6 quota) must be a whole number ≥ 0, got {m!r}")
    if not (is_finite(p) and 0 <= p <= 1):
        raise ValueError(f"A-Caching option p (the profiling probability) must be in [0, 1], "
                         f"got {p!r}")
    if not (is_finite(change) and change >= 0):
        raise ValueError(f"A-Caching option change must be a number ≥ 0, got {change!r}")
    if not (is_finite(alpha) and alpha >= 1):
        raise ValueError(f"A-Caching option alpha (Bloom-filter bits per key) must be ≥ 1 "
                         f"(App. A: alpha·W_d bits), got {alpha!r}")


def _net_changes(changes: list) -> list:
    """The changes of one tick, net: a cache dropped and used again in the same tick (a
    §4.5 a drop, then a re-selection that picks it) is no change to measure."""
    out: dict = {}
    for action, st in changes:
        first = out.get(id(st))
        if first is not None and first[0] != action:
            del out[id(st)]
        elif first is None:
            out[id(st)] = (action, st)
    return list(out.values())


def _saved(changes) -> float:
    """The work units per second the model says ``changes`` ((action, state) pairs) save:
    each use its cache's net benefit, each drop minus it."""
    return math.fsum((1 if action == "use" else -1) * _net(st) for action, st in changes)


def _net(st: CandidateState) -> float:
    return (st.estimate.benefit - st.estimate.cost) if st.estimate else 0.0


def _changed(old: Estimate | None, new: Estimate, p: float) -> bool:
    if old is None:
        return True
    return any(abs(n - o) > p * max(abs(o), 1e-12)
               for o, n in ((old.benefit, new.benefit), (old.cost, new.cost)))


def _prime_at_least(n: int) -> int:
    """Bucket counts are primes: a slot is hash(u) mod buckets, and an integer hashes to
    itself, so evenly spaced keys would share a few slots of a power-of-two table."""
    n = max(2, n)
    while any(n % d == 0 for d in range(2, int(n ** 0.5) + 1)):
        n += 1
    return n
