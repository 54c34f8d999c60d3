"""The load-shedding controller: partial processing (rate adaptation, Algorithm 1) and
selective processing (time correlation, Algorithm 2; join direction, Algorithm 4) of
load-shedding.txt, run every T_r and T_c seconds of event time on the statistics the
load-shedding join keeps (``engine.shed_join``). The algorithms themselves are the pure
functions of ``adapt.shedding``; this class only schedules them and moves the join's
fractions r_i and basic-window orders s_i.
"""

from __future__ import annotations

import math
import time

from adaptcq.adapt.shedding import (
    _number,
    join_direction,
    micro_batch_rate,
    rate_adapt,
    time_correlation,
    utility_knapsack,
)
from adaptcq.errors import OptionError

T_R_DEFAULT = 5.0      # T_r, the rate adaptation period (§6.1)
T_C_DEFAULT = 5.0      # T_c, the time correlation adaptation period (§6.1)
DELTA_R_DEFAULT = 1.2  # δ_r, the fraction boost factor (§6.1)
SERIES_MAX = 100_000   # time-series points kept (one per T_r)
R_MIN = 1e-3           # r's floor: in Algorithm 1, r = 0 would be absorbing (0·δ_r = 0)
CATCH_UP = 64          # empty rate steps run after a gap in the data; the rest skipped
# The shortest T_r, T_c (seconds of event time). The paper's are 5 s (§6.1); a period must
# span arrivals for λ_i, α_i and ô to mean anything, and below a millisecond the steps
# would outnumber the arrivals of any stream this engine keeps up with.
MIN_PERIOD = 1e-3


def _later(at: float, period: float, name: str) -> float:
    """``at + period``: the next step's time, refused when the period is below the
    floating-point spacing of the event time (it would never advance the schedule)."""
    nxt = at + period
    if not nxt > at:
        raise OptionError(f"{name} = {period:g} s is below the resolution of event time "
                          f"{at:g} s in floating point: the adaptation schedule could not "
                          f"advance; give a longer {name}")
    return nxt


def _past(at: float, seconds: float, period: float, name: str) -> float:
    """The first time ``at + k·period`` (k ≥ 1) after ``seconds``, in one jump."""
    k = max(1, math.floor((seconds - at) / period) + 1)
    nxt = at + k * period
    while not nxt > seconds:  # (rounding in k·period)
        nxt = _later(nxt, period, name)
    return nxt


class ShedController:
    """``selective``: rate, time correlation and (``direction``) join direction
    adaptation; ``partial``: rate adaptation only, windows processed newest first.

    With a ``budget`` (seconds of CPU per micro-batch: a Spark partition group's share of
    the trigger interval) the rate step runs once per micro-batch (``batch_step``, from
    the batch's CPU time) instead of every T_r; the time correlation still runs every T_c
    of event time. Then ``random`` is a mode too: the same r is the share of arrivals
    kept, the rest dropped at random (the §6.1 baseline without an input buffer).

    ``direction`` left out (None) means join direction on where it applies: selective
    processing of a two-way join. Given (True or False), it is refused for an n-way join
    (``bind``): Algorithm 4 (§5.2) is a two-way algorithm, not applied there."""

    # Utility-based shedding (Algorithm 5) replaces join direction: set by ``bind`` (a
    # class default, so a controller restored from an older saved state has it too).
    by_utility = False

    def __init__(self, mode: str = "selective", T_r: float = T_R_DEFAULT,
                 T_c: float = T_C_DEFAULT, delta_r: float = DELTA_R_DEFAULT,
                 direction: bool | None = None, utility: bool = True,
                 budget: float | None = None):
        if mode not in ("partial", "selective") and not (mode == "random" and budget):
            raise OptionError(f"a shedding controller is for --shed partial or selective, "
                              f"not {mode!r}")
        if budget is not None and not (isinstance(budget, int | float) and
                                       0 < budget < math.inf):
            raise OptionError(f"the CPU budget per micro-batch must be a positive number "
                              f"of seconds, got {budget!r}")
        self.budget = budget
        # Every parameter checked here, not at the first step that uses it (mid-run); an
        # infinite period would silently never adapt.
        T_r = _number("T_r (rate adaptation period, seconds)", T_r, low=MIN_PERIOD)
        T_c = _number("T_c (time correlation period, seconds)", T_c, low=MIN_PERIOD)
        delta_r = _number("delta_r (fraction boost factor)", delta_r, low=1.0)
        if direction is not None and not isinstance(direction, bool):
            raise OptionError(f"direction (join direction adaptation) must be True or "
                              f"False, got {direction!r}")
        self.mode, self.T_r, self.T_c, self.delta_r = mode, T_r, T_c, delta_r
        self.direction_option = direction  # as given (None: left out), for ``bind``
        self.direction = direction is not False and mode == "selective"
        self.use_utility = utility  # Algorithm 5 when the join has tuple types
        self.correlation = mode == "selective"
        self.r = 1.0
        self.beta = 1.0
        self.lam = [0.0, 0.0]
        self.o: list[list[float]] = [[], []]
        self.next_rate: float | None = None
        self.start = 0.0
        # Join direction is a two-way algorithm: off for n-way joins. Unknown until the
        # join binds the controller (``bind``); until then nothing is reported as on.
        self.two_way = False
        self.next_corr: float | None = None
        self.last_batch: float | None = None
        self.steps = 0
        self.cpu = 0.0
        self.u: dict = {}  # u_{i,z} last measured (utility-based shedding)
        self.min_r = 1.0
        self.series: list[tuple] = []  # (time, r, r_1, r_2, β, drops, delay, results)

    def bind(self, streams: int, typed: bool = False) -> None:
        """The join this controller moves has ``streams`` streams and, when ``typed``, tuple
        types (called by the join when it is built, so the summary is right before any rate
        step; with types, Algorithm 5 of §5.3 replaces Algorithm 4). A ``direction`` given
        for three or more streams is refused: Algorithm 4 (§5.2) sets r_1, r_2 of a
        two-way join and is not applied to n-way pipelines, so it would change nothing."""
        if streams > 2 and self.direction_option is not None:
            flag = ("direction=True" if self.direction_option else
                    "direction=False (--no-join-direction)")
            raise OptionError(f"{flag}: join direction (Algorithm 4) is a two-way "
                              f"algorithm and is not applied to an n-way join; this query "
                              f"joins {streams} streams, so leave the option out")
        self.two_way = streams == 2
        self.by_utility = typed and bool(self.use_utility) and self.mode == "selective"

    def at(self, join, seconds: float) -> None:
        """Called at every arrival (event time in seconds): the steps now due."""
        if self.budget is not None:  # r moves per micro-batch (batch_step)
            if self.last_batch is None:
                self.last_batch = self.start = seconds
            if self.correlation:
                self._correlate(join, seconds)
            return
        if self.next_rate is None:
            self.next_rate = _later(seconds, self.T_r, "T_r")
            self.next_corr = _later(seconds, self.T_c, "T_c")
            self.start = seconds
            return
        if seconds < self.next_rate and (not self.correlation or seconds < self.next_corr):
            return
        t0 = time.process_time()
        behind = (seconds - self.next_rate) / self.T_r
        if behind > CATCH_UP:  # a gap in the data: nothing arrived for many periods
            # Algorithm 1 would raise r by δ_r once per empty period; CATCH_UP of them
            # reach r = 1 from any r ≥ R_MIN, so the rest are skipped in one jump.
            self.next_rate += (math.floor(behind) - CATCH_UP) * self.T_r
        corr_done = False
        while True:  # in time order; at a tie, time correlation first (Algorithm 4 uses o)
            rate_due = seconds >= self.next_rate
            corr_due = self.correlation and seconds >= self.next_corr
            if corr_due and (not rate_due or self.next_corr <= self.next_rate):
                if corr_done:
                    # Nothing is processed between the steps of one call, so the first
                    # took every match; the others due would find ô = 0, which changes
                    # neither o nor s (time_correlation keeps them): skipped.
                    self.next_corr = _past(self.next_corr, seconds, self.T_c, "T_c")
                    continue
                self.correlation_step(join, self.next_corr)
                corr_done = True
                self.next_corr = _later(self.next_corr, self.T_c, "T_c")
            elif rate_due:
                self.rate_step(join, self.next_rate)
                self.next_rate = _later(self.next_rate, self.T_r, "T_r")
            else:
                break
        self.cpu += time.process_time() - t0  # the shedder's own overhead

    def _correlate(self, join, seconds: float) -> None:
        """The time correlation steps due by ``seconds`` (per-micro-batch rate steps)."""
        if self.next_corr is None:
            self.next_corr = _later(seconds, self.T_c, "T_c")
            return
        if seconds < self.next_corr:
            return
        t0 = time.process_time()
        # One step takes the matches so far; the rest due would find none (see ``at``).
        self.correlation_step(join, self.next_corr)
        self.next_corr = _past(self.next_corr, seconds, self.T_c, "T_c")
        self.cpu += time.process_time() - t0

    def batch_step(self, join, seconds: float, now: float) -> None:
        """Algorithm 1 once per micro-batch (``adapt.shedding.micro_batch_rate``): the
        batch took ``seconds`` of CPU against the budget; ``now`` is its last event time
        (seconds). λ_i for Algorithm 2 are the batch's arrival rates over its time span."""
        t0 = time.process_time()
        k = len(join.arrived)
        span = max(now - (now if self.last_batch is None else self.last_batch), 1e-9)
        self.lam = [join.arrived[i].take() / span for i in range(k)]
        for i in range(k):
            join.fetched[i].take()
        self.last_batch = now
        self.r, self.beta = micro_batch_rate(self.r, seconds, self.budget, self.delta_r)
        self.r = max(self.r, R_MIN)
        if self.mode == "random":
            join.keep = self.r
            self._record(join, now, [1.0] * k)
        else:
            self._apply(join, now, k)
        self.cpu += time.process_time() - t0

    def rate_step(self, join, now: float) -> None:
        """Algorithm 1, then Algorithm 4 (join direction) when it is on."""
        k = len(join.fetched)
        alpha = [join.fetched[i].take() for i in range(k)]
        self.lam = [join.arrived[i].take() / self.T_r for i in range(k)]
        # Algorithm 1 over k streams: β = Σα_i / (Σλ_i·T_r), the sums in one slot
        self.r, self.beta = rate_adapt(self.r, [sum(alpha), 0], [sum(self.lam), 0.0],
                                       self.T_r, self.delta_r)
        self.r = max(self.r, R_MIN)  # beyond the paper: a period with nothing fetched
        # (one tuple costing more than T_r) would set r = 0 for good
        self._apply(join, now, k)

    def _apply(self, join, now: float, k: int) -> None:
        """The new r into the join's fractions: Algorithm 5 or 4 for two streams."""
        if k > 2:  # n-way pipelines: one r for every step
            fractions = [self.r] * k
        elif (join.type_of is not None and self.use_utility and self.mode == "selective"
                and min(join.w_seconds) > 0):
            self.utility_step(join)  # Algorithm 5 replaces Algorithm 4
            fractions = join.fractions
        elif self.direction and min(join.w_seconds) > 0 and all(self.o):
            # (Algorithm 4 divides by w_i, and needs o of both windows)
            means = [sum(o) / len(o) for o in self.o]
            fractions = list(join_direction(self.r, join.w_seconds, means))
        else:
            fractions = [self.r, self.r]
        join.fractions = fractions
        join.sample_r = self.r
        self._record(join, now, fractions)

    def _record(self, join, now: float, fractions: list) -> None:
        r1, r2 = fractions[:2]
        self.steps += 1
        self.min_r = min(self.min_r, self.r)
        if len(self.series) < SERIES_MAX:
            self.series.append((now, self.r, r1, r2, self.beta, sum(join.drops),
                                join.period_delay, join.results))
        join.period_delay = 0.0

    def utility_step(self, join) -> None:
        """Algorithm 5 (§5.3): r_{i,z} by the fractional knapsack, from ω_{i,z} (type
        frequencies of the period's arrivals), u_{i,z} (utility per comparison of sampled
        type-z tuples probing W_i; kept from earlier periods, or V(z) times W_i's match rate
        before any sample) and the time correlation's o and s."""
        nz = len(join.V)
        omega = {}
        for i in (0, 1):
            counts = join.type_counts[i]
            total = sum(counts)
            for z in range(nz):
                omega[(i, z)] = counts[z] / total if total else 1.0 / nz
            join.type_counts[i] = [0] * nz
        for key, (util, comps) in join.u_stats.items():
            if comps:
                self.u[key] = util / comps
        join.u_stats = {}
        u = {}
        for i in (0, 1):
            rate = (sum(self.o[i]) / len(self.o[i])) if self.o[i] else 1.0
            for z in range(nz):
                u[(i, z)] = self.u.get((i, z), join.V[z] * rate)
        if self.r >= 1.0:  # nothing to shed: every window whole for every type
            join.type_fractions = None
            join.fractions = [1.0, 1.0]
            return
        # (Items are 1/n_i of a window but have the volume of b seconds, and n_i·b > w_i:
        # at r = 1 the paper's capacity would not cover them all, hence the case above.)
        o = [self.o[i] or [0.0] * join.n[i] for i in (0, 1)]
        r_iz = utility_knapsack(self.r, self.lam, join.w_seconds, join.b_seconds, o,
                                join.orders, u, omega)
        join.type_fractions = r_iz
        # r_i as the average over the probing stream's types, for the report
        join.fractions = [sum(omega[(1 - i, z)] * r_iz[(i, z)] for z in range(nz))
                          for i in (0, 1)]

    def correlation_step(self, join, now: float) -> None:
        """Algorithm 2 for each window. Line 5 divides ô by the probability a tuple was
        fully processed with, r·γ: the paper writes r_i there when join direction is on,
        but keeps r·γ in Algorithm 3's line 2, and ô must be scaled by the probability
        actually used (with r_i, a window whose r_i reached 0 would divide by zero, and
        one with a small r_i would look r/r_i times more productive than it is)."""
        # λ_i of the last rate step; before the first one, the rates so far
        lam = self.lam if any(self.lam) else [
            join.arrived[i].get() / max(now - self.start, 1e-9)
            for i in range(len(join.arrived))]
        if isinstance(join.matches, dict):  # n-way: per pipeline step (X, Y)
            for (x, y), hat in join.matches.items():
                _, s = time_correlation(hat.take(), join.gamma, join.sample_r,
                                        join.b_seconds, (lam[x], lam[y]), self.T_c,
                                        previous=join.orders[(x, y)])
                join.orders[(x, y)] = list(s)
            return
        for i in (0, 1):
            o, s = time_correlation(join.matches[i].take(), join.gamma, join.sample_r,
                                    join.b_seconds, lam, self.T_c,
                                    previous=join.orders[i])
            if any(o):
                self.o[i] = o
            join.orders[i] = list(s)

    def report(self) -> dict:
        return {"shed_policy": self.mode, "fraction_r_final": round(self.r, 6),
                "fraction_r_min": round(self.min_r, 6), "rate_steps": self.steps,
                "join_direction": self.direction and self.two_way and not self.by_utility,
                **({} if self.budget is None else {"budget_seconds": self.budget,
                                                   "beta_last": round(self.beta, 6)})}

    def series_columns(self) -> dict[str, list]:
        """The time series, one point per rate adaptation step (T_r)."""
        names = ("time", "r", "r_1", "r_2", "beta", "buffer_drops", "max_delay", "results")
        return {n: [p[k] for p in self.series] for k, n in enumerate(names)}
