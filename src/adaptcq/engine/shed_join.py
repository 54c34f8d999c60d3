"""The load-shedding windowed join of load-shedding.txt: two streams, windows split into
basic windows, a CPU capacity on a virtual work clock, input buffers, and the mechanism
that partial and selective processing move (§3.2, §4, §5).

**Mechanism, not policy.** This executor keeps the windows and does the work; what it
exposes to a policy (``adapt.shed_control``) is the fraction of each window a new tuple
is processed against (``fractions``: r_1, r_2 of §5.2),
the order in which basic windows are visited (``orders``: s_i^j of §5.1) and the sampling
probability γ of full processing; with tuple types (§5.3), ``type_fractions``: r_{i,z}. The policy reads the period statistics kept here
(``arrived``, ``fetched``: α_i and λ_i of Algorithm 1; ``matches``: ô_{i,j} of Algorithm 2)
at every T_r and T_c seconds of event time.

**Overload on a virtual clock** (§3.2, §6.1). Arrivals enter per-stream input buffers at
their timestamps; the join fetches them in arrival order and is busy for ``work / capacity``
seconds of event time per tuple, where work is counted in units (one tuple comparison; one
identifier-list lookup or entry visited with an index; one insertion). A buffer holds as
many tuples as its stream delivered in the last ``buffer`` seconds: beyond that it
overflows and drops the excess (the oldest, or with ``shed="random"`` as many random
tuples of the buffer: the random-drop baseline of §6.1). With ``capacity="wall"`` a tuple costs the
CPU time it really took. Everything else is deterministic, so a run replays exactly.

**Windows and exactness.** Window W_i is a circular buffer of n_i = 1 + ⌈w_i/b⌉ basic
windows (§5.1), each with its own index: none (a list scanned newest first), ``hash`` for
equi-joins, ``inverted`` (identifier lists in time order, §4.2.2: O(1) insertion, a search
stops at a time) or ``inverted-id`` (identifier-sorted lists, §4.2.1: a search must read
whole lists). A shift empties the oldest basic window, whose rows are all expired (its
newest row is more than w_i older than the tuple that caused the shift). Inside the kept
basic windows rows still expire one by one: a row joins a tuple t only when
``T(t) − w_i ≤ T(row)`` (the windows of ``stream.windows``, both ends inclusive). A tuple
is processed at its own timestamp, so with ample capacity every tuple is fully processed
and the output equals the oracle's, update by update (append mode). Under overload the
output is a sub-multiset of it: every emitted pair is a true result.

**Set-valued joins** (§3.2). A list column is a set (duplicates count once), a map column
a weighted set. ``OVERLAP(R.s, S.s) >= k``, ``SET_EQUAL``, ``SUBSET``, ``SUPERSET`` and
``INNER_PRODUCT(R.w, S.w) >= θ`` next to equi-joins; NULL sets and keys never join, and a
set is its non-NULL items (a NULL item equals nothing, so it is never shared).
"""

from __future__ import annotations

import bisect
import math
import random
import sys
import time
from collections import deque
from collections.abc import Callable

from adaptcq.checks import is_real
from adaptcq.engine.codegen import compile_source, projection_source
from adaptcq.errors import InputError, OptionError
from adaptcq.query.logical import ColumnRef, LogicalQuery, SetPredicate
from adaptcq.stats.shedding import BasicWindowMatches, HorvitzThompson, PeriodCount
from adaptcq.stream.eventtime import to_units

SHED_MODES = ("none", "random", "partial", "selective")
INDEXES = ("auto", "none", "hash", "inverted", "inverted-id")
BUFFER_DEFAULT = 1.0  # seconds of input buffered in front of the join (§6.1)
GAMMA_DEFAULT = 0.1   # γ, the sampling probability of full processing (§6.1)
INF = float("inf")
MAX_BASIC_WINDOWS = 100_000  # per window: each tuple visits them (expiry, sizes)
MIN_CAPACITY = 1e-3          # work units per second: below, one tuple outlasts any run
DROPPED, PROCESSED, BUFFERED = 0, 1, 2  # an arrival's fate (``ShedJoin.fates``)
# What ``shed_state`` keeps of the join besides its windows, fates and controller.
_SHED_STATE = ("fractions", "type_fractions", "sample_r", "keep", "orders", "arrived",
               "fetched", "matches", "recent", "clock", "work", "drops", "arrivals",
               "processed", "full", "max_delay", "period_delay", "results", "estimate",
               "utility", "type_counts", "u_stats", "restore_mismatches", "cleared",
               "latest")


def _seconds(name: str, value) -> float:
    try:  # (a bool is no number of seconds, though float(True) is 1)
        v = float("nan") if isinstance(value, bool) else float(value)
    except (TypeError, ValueError):
        v = float("nan")
    if not 0 < v < INF:
        raise OptionError(f"{name} must be a positive, finite number of seconds, got "
                          f"{value!r}")
    return v


def check_capacity(capacity) -> float | str | None:
    """The capacity option: None (unlimited), "wall", "batch", or work units per second
    of event time from ``MIN_CAPACITY`` up (a number, or its text from the command
    line), else OptionError naming it."""
    if capacity is None or capacity in ("wall", "batch"):
        return capacity
    try:  # (True is no capacity, though float(True) is 1)
        c = float("nan") if isinstance(capacity, bool) else float(capacity)
    except (TypeError, ValueError):
        c = float("nan")
    if not MIN_CAPACITY <= c < INF:
        raise OptionError(f"--capacity must be a number of work units per second from "
                          f"{MIN_CAPACITY:g} up, or 'wall', got {capacity!r}")
    return c


def check_mode_and_index(shed, index) -> None:
    """--shed and --index: one of SHED_MODES and of INDEXES (text: a list is refused as
    unknown, not a TypeError)."""
    if not isinstance(shed, str) or shed not in SHED_MODES:
        raise OptionError(f"unknown --shed {shed!r}; choose one of {', '.join(SHED_MODES)}")
    if not isinstance(index, str) or index not in INDEXES:
        raise OptionError(f"unknown --index {index!r}; choose one of {', '.join(INDEXES)}")


def check_gamma(gamma) -> float:
    """γ, the sampling probability of full processing (Algorithm 3): a number in (0, 1]."""
    if not is_real(gamma) or not 0 < gamma <= 1:
        raise OptionError(f"gamma (the sampling probability) must be a number in (0, 1], "
                          f"got {gamma!r}")
    return float(gamma)


# ----- join conditions --------------------------------------------------------------------
def _as_set(v):
    """A list value as a set of its non-NULL items: NULL equals nothing, so a NULL item
    is shared with no set (docs/semantics.md); a NULL set stays NULL (never joins)."""
    if v is None:
        return None
    s = frozenset(v)
    return s - _NULL_ITEM if None in s else s


_NULL_ITEM = frozenset((None,))


def _as_weights(v):
    """A map value as item -> weight, without the items of NULL weight (their products
    are NULL, which a sum skips, as SQL's SUM) or NULL item (never in Arrow maps, but a
    row given directly may hold one: it is shared with no map, as in a set)."""
    if v is None:
        return None
    return {x: w for x, w in (v.items() if isinstance(v, dict) else v)
            if x is not None and w is not None}


def _named(prepare, pred: SetPredicate):
    """``prepare`` that names the condition when a value cannot be a set (items that are
    lists, maps or structs: only scalars can be set items)."""
    def checked(v):
        try:
            return prepare(v)
        except TypeError as e:
            raise InputError(f"{pred}: a set's items must be scalars (numbers, strings, "
                             f"timestamps), got {type(v).__name__} {v!r:.60} ({e})") from None
    return checked


def _inner(a: dict, b: dict) -> float:
    if len(b) < len(a):
        a, b = b, a
    return sum(w * b[x] for x, w in a.items() if x in b)


def _set_test(p: SetPredicate, probe_is_left: bool) -> Callable[[object, object], bool]:
    """``test(probe value, row value)``: the condition with the probing tuple on its side.
    NULL never joins."""
    k, strict = p.threshold, p.strict
    if p.kind == "overlap":
        if strict:
            return lambda q, s: q is not None and s is not None and len(q & s) > k
        return lambda q, s: q is not None and s is not None and len(q & s) >= k
    if p.kind == "inner":
        if strict:
            return lambda q, s: q is not None and s is not None and _inner(q, s) > k
        return lambda q, s: q is not None and s is not None and _inner(q, s) >= k
    if p.kind == "equal":
        return lambda q, s: q is not None and s is not None and q == s
    sub = (p.kind == "subset") == probe_is_left  # the probe is the subset side
    if sub:
        return lambda q, s: q is not None and s is not None and q <= s
    return lambda q, s: q is not None and s is not None and q >= s


class _Condition:
    """One join condition between the two streams: how each side's value is read from a
    row and prepared (a set, a weight map, a key), and its test per probe direction."""

    def __init__(self, query: LogicalQuery, left: ColumnRef, right: ColumnRef,
                 pred: SetPredicate | None):
        self.pred = pred
        self.cols = {}
        for ref in (left, right):
            self.cols[query.aliases.index(ref.stream)] = query.columns[ref.stream].index(
                ref.column)
        self.left = query.aliases.index(left.stream)
        if pred is None:
            self.prepare = lambda v: v
            self.tests = dict.fromkeys(self.cols, lambda q, s: q is not None and q == s)
        else:
            self.prepare = _named(_as_weights if pred.kind == "inner" else _as_set, pred)
            self.tests = {p: _set_test(pred, probe_is_left=(p == self.left))
                          for p in self.cols}  # keyed by the probing stream


# ----- indexes of a basic window ----------------------------------------------------------
class BasicWindow:
    """One basic window B_{i,j} (§5.1): its rows in arrival order (parallel lists) and an
    index on the primary condition. Positions are append order, i.e. time order."""

    __slots__ = ("empty", "ids", "index", "rows", "ts", "types", "vals")

    def __init__(self, index: str):
        self.ts: list = []
        self.rows: list = []
        self.vals: list = []   # per row: the prepared value of every condition
        self.types: list = []  # per row: its tuple type z (utility-based shedding)
        self.index: dict | None = None if index == "none" else {}
        self.ids: list = []    # inverted-id: the row's random identifier
        self.empty: list = []  # inverted: positions of rows with an empty set

    def clear(self) -> None:
        self.ts.clear()
        self.rows.clear()
        self.vals.clear()
        self.types.clear()
        self.ids.clear()
        self.empty.clear()
        if self.index is not None:
            self.index.clear()

    def __len__(self) -> int:
        return len(self.ts)


# ----- the executor -----------------------------------------------------------------------
class ShedJoin:
    """The load-shedding binary windowed join (load-shedding.txt §3.2, Figure 3; §4–§5)."""

    name = "shed"

    def __init__(self, query: LogicalQuery, mode: str = "append", out: list | None = None,
                 *, shed: str = "none", capacity: float | str | None = None,
                 basic_window: float | None = None, index: str = "auto",
                 buffer: float = BUFFER_DEFAULT, gamma: float = GAMMA_DEFAULT,
                 controller=None, types=None, seed: int = 0, time_unit: float = 1.0,
                 track: bool = False, state: bytes | None = None):
        self._check(query, mode, shed, index)
        self.query, self.mode, self.shed = query, mode, shed
        self.time_unit = time_unit
        self.out = out if out is not None else []
        self._emit = self.out.append
        self.aliases = query.aliases
        # Windows in engine time units (integers when the runtime passes nanoseconds).
        self.w_seconds = [float(s.window.size) for s in query.streams]
        self.w = [self._units(w) if time_unit == 1.0 else s.window.in_units(time_unit)
                  for s, w in zip(query.streams, self.w_seconds, strict=True)]
        # Default b: a twentieth of the larger window (§6.4: b = 1 s for w = 20 s).
        b = ((max(self.w_seconds) / 20 or 1.0) if basic_window is None
             else _seconds("--basic-window", basic_window))
        self.b_seconds = b
        self.b = self._units(b)
        if not self.b > 0:
            raise OptionError(f"--basic-window {b:g} s is below the time unit")
        # n_i = 1 + ⌈w_i/b⌉, in engine units: a shift must only empty expired rows
        self.n = [1 + math.ceil(w / self.b) if isinstance(w, float) else 1 + -(-w // self.b)
                  for w in self.w]
        if max(self.n) > MAX_BASIC_WINDOWS:
            raise OptionError(f"--basic-window {b:g} s makes {max(self.n):,} basic windows "
                              f"per window (at most {MAX_BASIC_WINDOWS:,}): every tuple "
                              "visits them all")
        # The conditions: equalities first (written order), then the set conditions.
        self.conds = [_Condition(query, a, c, None) for a, c in query.equalities()]
        self.conds += [_Condition(query, p.left, p.right, p) for p in query.set_predicates]
        self.index = self._choose_index(index)
        # The paper's join (one OVERLAP >= k condition) gets an inlined test in _probe.
        only = self.conds[0].pred if len(self.conds) == 1 else None
        self._overlap = (only.threshold if only is not None and only.kind == "overlap"
                         and not only.strict else None)
        self.windows = [deque(BasicWindow(self.index) for _ in range(n)) for n in self.n]
        # Capacity: work units per second of event time, the wall clock, or a CPU budget
        # per micro-batch ("batch": the controller moves r once per micro-batch).
        self.wall = capacity == "wall"
        self.batch = capacity == "batch"
        c = check_capacity(capacity)
        if capacity is None or self.wall or self.batch:
            self.rate = None
        else:
            self.rate = c * time_unit  # work units per engine time unit
        if self.batch and (controller is None or controller.budget is None):
            raise OptionError("capacity 'batch' (a CPU budget per micro-batch) needs a "
                              "shedding controller with that budget")
        if shed != "none" and capacity is None:
            raise OptionError(f"--shed {shed} needs a CPU capacity (--capacity UNITS, work "
                              "units per second of event time, or --capacity wall)")
        self.buffer = self._units(_seconds("--buffer", buffer))
        self.gamma = check_gamma(gamma)
        self.rng = random.Random(seed)
        # What a policy moves (§4.1, §5.1–5.3).
        self.fractions = [1.0, 1.0]                 # r_1, r_2
        self.type_fractions: dict | None = None     # r_{i,z} of Algorithm 5, when set
        self.sample_r = 1.0                         # r of Algorithm 1 (sampling r·γ)
        self.keep = 1.0      # share of arrivals kept (random shedding per micro-batch)
        self.orders = [list(range(n)) for n in self.n]  # s_i: positions by priority
        self.controller = controller
        # Period statistics the policy reads.
        k = len(query.streams)
        self.arrived = [PeriodCount() for _ in range(k)]
        self.fetched = [PeriodCount() for _ in range(k)]
        self.matches = [BasicWindowMatches(n) for n in self.n]
        # Buffers and the clock.
        self.buffers: list[deque] = [deque() for _ in range(k)]
        self.recent: list[deque] = [deque() for _ in range(k)]  # arrival times, last buffer s
        self.clock = -INF
        self.latest = -INF   # the newest arrival's time (engine units)
        self._advancing = False
        # Counters for the report.
        self.work = 0.0
        self.drops = [0] * k
        self.arrivals = [0] * k
        self.processed = [0] * k
        self.full = [0] * k          # tuples fully processed (sampled or r = 1)
        self.max_delay = 0.0
        self.period_delay = 0.0
        self.results = 0
        self.cleared = 0             # rows removed with their basic windows (expired)
        self.estimate = [HorvitzThompson() for _ in range(k)]  # per probed window i
        # Tuple types and utilities (§5.3): per stream a row -> type function, V(z).
        self.type_of, self.V = (None, [0.0]) if types is None else (list(types[0]),
                                                                    list(types[1]))
        self.utility = 0.0                          # output utility: Σ max(V(z_a), V(z_b))
        nz = len(self.V)
        self.type_counts = [[0] * nz for _ in range(k)]  # ω_{i,z}: arrivals per type
        self.u_stats: dict = {}                     # (i, z) -> [utility, comparisons]
        if controller is not None:  # (join direction: two streams, no tuple types)
            controller.bind(k, typed=self.type_of is not None)
        # Each arrival's fate (Spark: what a rebuild from stored rows needs, "On Spark"
        # in docs/shedding.md): per stream, for the arrivals since ``fate_base``, PROCESSED,
        # DROPPED or BUFFERED, with their times (trimmed by ``shed_state``).
        self.track = bool(track)
        self.fates = [bytearray() for _ in range(k)]
        self.fate_ts: list[list] = [[] for _ in range(k)]
        self.fate_base = [0] * k
        self.restore_mismatches = 0
        self._restored: dict | None = None
        if state is not None:
            self._restore(state)
        self.inserts = [self._arrival(i) for i in range(k)]
        self.deletes = [_ignore] * k  # rows expire inside (by basic window and time)
        self.stems = ()
        self._project = self._compile_projection()

    # ----- set-up ------------------------------------------------------------------------
    @staticmethod
    def _check(query: LogicalQuery, mode: str, shed: str, index: str) -> None:
        check_mode_and_index(shed, index)
        if len(query.streams) < 2:
            raise OptionError("the load-shedding join joins two or more streams; this query "
                              "has one")
        if mode != "append":
            raise OptionError("the load-shedding join runs in append mode only: under load "
                              "shedding a result that was never produced cannot be retracted "
                              "consistently (the paper's join has no deletions)")
        for s in query.streams:
            if s.window.kind != "range":
                raise OptionError(f"the load-shedding join needs [RANGE w] windows (basic "
                                  f"windows slice time, §5.1); stream {s.alias} has "
                                  f"{s.window}")
            if s.window.size > sys.float_info.max:  # (an exact int: 1e400 as written)
                raise OptionError(f"stream {s.alias}'s [RANGE w] window is longer than a "
                                  "float holds, and the load-shedding join slices it into "
                                  "basic windows (§5.1); give a window within the span of "
                                  "event times (292 years)")

    def _units(self, seconds: float):
        return to_units(seconds, self.time_unit)

    def _choose_index(self, index: str) -> str:
        primary = self.conds[0].pred if self.conds else None
        if index == "auto":
            return "hash" if primary is None and self.conds else "none"
        if index == "hash" and (primary is not None or not self.conds):
            raise OptionError("--index hash needs an equi-join condition (R.a = S.b)")
        if index.startswith("inverted"):
            setp = next((c for c in self.conds if c.pred is not None), None)
            if setp is None:
                raise OptionError(f"--index {index} needs a set join condition (OVERLAP, "
                                  "SET_EQUAL, SUBSET, SUPERSET, INNER_PRODUCT)")
            self.conds.remove(setp)
            self.conds.insert(0, setp)  # the indexed condition is the primary one
        return index

    def _compile_projection(self):
        q = self.query

        def resolve(ref: ColumnRef) -> str:
            return f"c[{q.aliases.index(ref.stream)}][{q.columns[ref.stream].index(ref.column)}]"

        return compile_source("project", "<load-shedding join projection>", "\n".join([
            "def project(c, ts, emit):",
            f"    emit(({projection_source(q, resolve)}1, ts))", ""]), {}).fn

    def set_emit(self, emit) -> None:
        self._emit = emit

    # ----- arrivals, buffers and the clock ----------------------------------------------
    def insert(self, i: int, rid: int, row: tuple, ts) -> None:
        self.inserts[i](rid, row, ts)

    def delete(self, i: int, rid: int, ts) -> None:
        pass

    def _arrival(self, i: int):
        fates, fate_ts = self.fates[i], self.fate_ts[i]

        def arrive(rid: int, row: tuple, ts) -> None:
            self.latest = ts
            self._advance(ts)
            if self.controller is not None:
                self.controller.at(self, ts * self.time_unit)
            k = self.arrivals[i]
            self.arrivals[i] += 1
            self.arrived[i].update()
            if self.track:
                fates.append(BUFFERED)
                fate_ts.append(ts)
            if self.keep < 1.0 and self.rng.random() >= self.keep:
                self.drops[i] += 1  # random shedding of a micro-batch's arrivals
                self._fate(i, k, DROPPED)
                return
            buf = self.buffers[i]
            buf.append((rid, ts, row, k))
            if self.rate is None and not self.wall:
                self._advance(ts)  # no capacity limit or per batch: processed on arrival
                return
            # The buffer holds as many tuples as arrived in the last `buffer` seconds.
            recent, limit = self.recent[i], ts - self.buffer
            recent.append(ts)
            while recent[0] < limit:
                recent.popleft()
            over = len(buf) - len(recent)
            if over <= 0:
                return
            self.drops[i] += over
            if self.shed == "random":  # §6.1's baseline: that many random tuples of it
                for _ in range(over):
                    j = self.rng.randrange(len(buf))
                    buf.rotate(-j)
                    self._fate(i, buf.popleft()[3], DROPPED)
                    buf.rotate(j)
            else:
                for _ in range(over):
                    self._fate(i, buf.popleft()[3], DROPPED)
        return arrive

    def _fate(self, i: int, k: int, fate: int) -> None:
        if self.track and 0 <= k - self.fate_base[i] < len(self.fates[i]):
            self.fates[i][k - self.fate_base[i]] = fate

    def _advance(self, until) -> None:
        """Process buffered tuples, in arrival order, while the join is free before
        ``until`` (event time): each costs its work / capacity."""
        bufs = self.buffers
        while True:
            i, head = -1, None  # the buffer whose head arrived first
            for k, b in enumerate(bufs):
                if b and (head is None or b[0][0] < head):
                    i, head = k, b[0][0]
            if i < 0 or self.clock > until:
                return
            _, ts, row, k = bufs[i].popleft()
            if self.track:
                self._fate(i, k, PROCESSED)
            start = max(self.clock, ts)
            delay = (start - ts) * self.time_unit
            self.max_delay = max(self.max_delay, delay)
            self.period_delay = max(self.period_delay, delay)
            self.fetched[i].update()
            t0, before = (time.process_time() if self.wall else 0.0), self.work
            self._process(i, row, ts)
            if self.wall:  # the CPU time it took, or its work at the capacity
                spent = (time.process_time() - t0) / self.time_unit
            else:
                spent = 0.0 if self.rate is None else (self.work - before) / self.rate
            self.clock = start + (spent if self.time_unit == 1.0 else round(spent))

    def finish(self) -> None:
        """End of input: the buffered tuples are processed (no more arrivals to drop)."""
        self._advance(INF)

    def end_batch(self, seconds: float, now) -> None:
        """The end of a micro-batch (``capacity="batch"``, the Spark runtime with
        ``--capacity wall``): it took ``seconds`` of CPU; ``now`` is its last event time
        (engine units). The controller moves r for the next one."""
        if self.batch:
            self.controller.batch_step(self, seconds, now * self.time_unit)

    # ----- one tuple (Figure 3; Algorithm 3) --------------------------------------------
    def _process(self, p: int, row: tuple, ts) -> None:
        i = 1 - p
        vals = tuple(c.prepare(row[c.cols[p]]) for c in self.conds)
        self.processed[p] += 1
        z = 0 if self.type_of is None else self.type_of[p](row)
        self.type_counts[p][z] += 1
        self._insert(p, row, ts, vals, z)
        win = self.windows[i]
        self._expire(i, ts)
        size = sum(len(bw) for bw in win)
        r = self.fractions[i]
        if self.type_fractions is not None:
            r = self.type_fractions.get((i, z), r)
        adaptive = self.shed in ("partial", "selective")
        if size == 0:
            # Nothing to compare with: a tuple that would be processed whole (no shedding,
            # or r_i = 1) is, as the n-way join counts it. No sample is drawn for the
            # others: it would record no match, and the random sequence stays as it was.
            if not adaptive or r >= 1.0:
                self.full[p] += 1
            return
        # Full processing with probability r·γ (Algorithm 3, line 2, with the rate
        # adaptation's r in both directions, as the paper keeps it when join direction
        # replaces r by r_i in line 7): its matches feed ô (the time correlation) and the
        # estimate of the exact output. With r_i = 1, or without adaptation, every tuple
        # is processed fully anyway.
        pi = self.sample_r * self.gamma
        sampled = adaptive and self.rng.random() < pi
        if sampled or r >= 1.0 or not adaptive:
            self.full[p] += 1
            total = 0
            before = self.utility
            hat = self.matches[i]
            for j, bw in enumerate(win):
                if bw.ts:
                    m = self._probe(i, p, bw, 0, row, ts, vals, z)
                    if m:
                        total += m
                        if sampled:  # lines 4–5 (ô ← ô + 1: the paper's typo fixed)
                            hat.update(j, m)
            if sampled and self.type_of is not None:  # u_{i,z}: utility per comparison
                u = self.u_stats.setdefault((i, z), [0.0, 0])
                u[0] += self.utility - before
                u[1] += size
            if not adaptive or r >= 1.0:
                self.estimate[i].update(total, 1.0)
            elif sampled:  # only the sampled ones are in the sample (π = r·γ)
                self.estimate[i].update(total, pi)
            return
        # Selective processing (lines 7–15): r·|W_i| tuples, basic windows by priority.
        self.estimate[i].skip()  # (its full output is estimated from the sample)
        for bw, lo in budget_slices(win, self.orders[i], r * size):
            self._probe(i, p, bw, lo, row, ts, vals, z)

    def _append(self, p: int, row: tuple, ts, vals: tuple, z: int) -> tuple:
        """Into the newest basic window of W_p, a full one shifting the circular buffer;
        returns (the basic window, the row's position)."""
        win = self.windows[p]
        bw = win[0]
        if bw.ts and ts >= bw.ts[0] + self.b:
            win.rotate(1)  # the oldest basic window becomes the newest, emptied
            bw = win[0]
            self.cleared += len(bw)
            bw.clear()
        pos = len(bw.ts)
        bw.ts.append(ts)
        bw.rows.append(row)
        bw.vals.append(vals)
        bw.types.append(z)
        self.work += 1
        return bw, pos

    def _insert(self, p: int, row: tuple, ts, vals: tuple, z: int) -> None:
        bw, pos = self._append(p, row, ts, vals, z)
        idx = bw.index
        if idx is None:
            return
        key = vals[0]
        if self.index == "hash":
            if key is not None:
                idx.setdefault(key, []).append(pos)
                self.work += 1
            return
        if key is None:
            return
        if not key:
            bw.empty.append(pos)
            return
        if self.index == "inverted":
            for x in key:
                idx.setdefault(x, []).append(pos)  # O(1): time order is append order
            self.work += len(key)
        else:  # identifier-sorted lists (§4.2.1): a balanced-tree insertion per item
            ident = self.rng.getrandbits(62)
            bw.ids.append(ident)
            for x in key:
                lst = idx.setdefault(x, [])
                bisect.insort(lst, (ident, pos))
                self.work += 1 + math.log2(len(lst))

    def _expire(self, i: int, ts) -> None:
        """Drop the oldest basic windows whose newest row left the window (§3.2's expiry
        check, a basic window at a time); the newest one too when all of it has left (a
        stream that went quiet: its rows must not count in r·|W_i|, nor hold the Spark
        runtime's expiry frontier back)."""
        win, limit = self.windows[i], ts - self.w[i]
        for j in range(len(win) - 1, -1, -1):
            bw = win[j]
            if not bw.ts:
                continue
            if bw.ts[-1] < limit:
                self.cleared += len(bw)
                bw.clear()
            else:
                return

    def _probe(self, i: int, p: int, bw: BasicWindow, lo: int, row: tuple, ts,
               vals: tuple, z: int) -> int:
        """Compare the probing tuple with the rows of ``bw`` from position ``lo`` on (the
        newest part: time-ordered processing stops at a time, §4.2.2); emit and count the
        matches."""
        limit = ts - self.w[i]
        bts, brows, bvals = bw.ts, bw.rows, bw.vals
        index = bw.index
        if index is None:
            cand = range(lo, len(bts))
            self.work += len(bts) - lo
        else:
            cand = self._candidates(bw, lo, vals[0], p)
        emit, project = self._emit, self._project
        V = None if self.type_of is None else self.V
        if self._overlap is not None:  # the paper's join, inlined (no call per row)
            k, q = self._overlap, vals[0]
            if q is None:
                return 0
            hits = [pos for pos in cand
                    if (s := bvals[pos][0]) is not None and len(q & s) >= k
                    and bts[pos] >= limit]
        else:
            tests = [c.tests[p] for c in self.conds]
            hits = [pos for pos in cand if bts[pos] >= limit and
                    all(test(a, b) for test, a, b in zip(tests, vals, bvals[pos]))]
        for pos in hits:
            project((brows[pos], row) if p == 1 else (row, brows[pos]), ts, emit)
            if V is not None:  # a result is worth max(V(t_a), V(t_b)) (§5.3)
                self.utility += max(V[z], V[bw.types[pos]])
        found = len(hits)
        self.results += found
        return found

    def _candidates(self, bw: BasicWindow, lo: int, key, p: int):
        """Positions from ``lo`` on that the index says may match (a superset of the
        matches; each is then tested), charging the lookups and entries visited."""
        idx = bw.index
        if key is None:
            self.work += 1
            return ()
        if self.index == "hash":
            self.work += 1
            lst = idx.get(key)
            if not lst:
                return ()
            start = bisect.bisect_left(lst, lo) if lo else 0
            self.work += len(lst) - start
            return lst[start:]
        pred = self.conds[0].pred
        if not key or not self._index_finds_all(pred):
            # An empty probe set, or a condition met without a shared item: all rows.
            self.work += len(bw.ts) - lo
            return range(lo, len(bw.ts))
        seen: dict[int, None] = {}
        if self.index == "inverted":
            for x in key:
                self.work += 1
                lst = idx.get(x)
                if lst:
                    start = bisect.bisect_left(lst, lo) if lo else 0
                    self.work += len(lst) - start
                    for pos in lst[start:]:
                        seen[pos] = None
        else:  # identifier-sorted: no stop by time, whole lists are read
            for x in key:
                self.work += 1
                lst = idx.get(x)
                if lst:
                    self.work += len(lst)
                    for _, pos in lst:
                        if pos >= lo:
                            seen[pos] = None
        if pred.kind in ("equal", "subset", "superset"):
            seen.update(dict.fromkeys(e for e in bw.empty if e >= lo))
        return sorted(seen)

    @staticmethod
    def _index_finds_all(pred: SetPredicate) -> bool:
        """Whether every match of a non-empty probe set shares an item with it, so that
        the inverted lists of its items find them all (rows with empty sets, which can
        be subsets or equal, are listed apart). OVERLAP and INNER_PRODUCT with a
        threshold that zero shared items meets do not."""
        if pred.kind in ("overlap", "inner"):
            return pred.threshold > 0 or (pred.strict and pred.threshold >= 0)
        return True

    # ----- the Executor protocol ----------------------------------------------------------
    def plan_state(self) -> dict:
        return {}

    def load(self, i, rows, times=None) -> None:
        """A rebuilt engine's window W_i (the Spark runtime's state as changes): ``rows``
        (row id -> row, ids in arrival order) go into the basic windows, indexed, without
        being joined. With the state ``shed_state`` saved, W_i comes back exactly as it
        was: the rows it held in the basic windows it held them in, a dropped row left
        out, a buffered one back in the input buffer (docs/shedding.md, "On Spark")."""
        if times is None:
            raise OptionError("the load-shedding join loads rows with their times "
                              "([RANGE w] windows)")
        order = sorted(rows)
        saved = self._restored
        work, rng = self.work, self.rng.getstate()  # loading is not the join's work, and
        cleared = self.cleared  # (nor are rows it pushes out expiries: counted before)
        try:  # identifiers drawn here (inverted-id) must not move the sampling
            self._load(i, rows, times, order, saved)
        finally:
            self.work, self.cleared = work, cleared
            self.rng.setstate(rng)

    def _load(self, i, rows, times, order, saved) -> None:
        if saved is not None:
            cut, fates = saved["cuts"][i], saved["fates"][i]
            order = [r for r in order if times[r] >= cut]  # older rows were cleared
            if len(order) != len(fates):  # (a bug if it happens: counted and reported)
                self.restore_mismatches += 1
                self.fate_base[i] = self.arrivals[i]  # fates afresh from the next arrival
                saved = None
        if saved is None:  # every row as processed: no result is produced twice
            for rid in order:
                self._load_row(i, rows[rid], times[rid])
            return
        win = self.windows[i]
        starts = saved["starts"][i]  # per deque position, its first row's time or None
        held = sorted((s, j) for j, s in enumerate(starts) if s is not None)
        for n, rid in enumerate(order):
            row, ts = rows[rid], times[rid]
            if fates[n] == BUFFERED:
                self.buffers[i].append((rid, ts, row, self.fate_base[i] + n))
            elif fates[n] == PROCESSED:
                j = held[bisect.bisect_right(held, (ts, math.inf)) - 1][1]
                win.rotate(-j)  # the row's basic window first, where _append puts rows
                self._load_row(i, row, ts)
                win.rotate(j)
        if self.track:
            self.fates[i][:] = fates
            self.fate_ts[i][:] = [times[r] for r in order]

    def _load_row(self, i: int, row: tuple, ts) -> None:
        vals = tuple(c.prepare(row[c.cols[i]]) if i in c.cols else None
                     for c in self.conds)
        z = 0 if self.type_of is None else self.type_of[i](row)
        self._insert(i, row, ts, vals, z)  # (within b of its basic window's first row)

    def cuts(self, now) -> list:
        """Per stream i, the oldest time a row of it can matter from: the first row of
        W_i's oldest basic window, or the oldest tuple in its input buffer, or ``now``
        (the newest arrival so far) when it holds neither."""
        out = []
        for win, buf in zip(self.windows, self.buffers):
            first = [bw.ts[0] for bw in win if bw.ts]
            out.append(min(first) if first else buf[0][1] if buf else now)
        return out

    def frontier(self, now):
        """The time before which no stored row can matter again: a row of stream i older
        than ``min(cuts) + min(w)`` - w_i is older than every cut. The Spark runtime
        forgets stored rows by it instead of by the time of the newest arrival, since
        buffered tuples still probe older rows."""
        return min(self.cuts(now)) + min(self.w)

    def shed_state(self, now) -> bytes:
        """What a rebuild from stored rows needs besides them (``load``): the shedder's
        statistics, counters, clock, random state and controller; per stream its cut, the
        fates of its arrivals since the cut (a byte each) and per basic window its first
        row's time. Fates before the cut are forgotten."""
        import copy
        import pickle
        cuts = self.cuts(now)
        for i, cut in enumerate(cuts):
            k = bisect.bisect_left(self.fate_ts[i], cut)
            if k:
                del self.fates[i][:k], self.fate_ts[i][:k]
                self.fate_base[i] += k
        controller = None
        if self.controller is not None:
            controller = copy.copy(self.controller)
            controller.series = []  # (the time series stays with the live copy)
        return pickle.dumps({
            "attrs": {a: getattr(self, a) for a in _SHED_STATE},
            "fates": [bytes(f) for f in self.fates], "fate_base": self.fate_base,
            "cuts": cuts, "starts": [[bw.ts[0] if bw.ts else None for bw in win]
                                     for win in self.windows],
            "rng": self.rng.getstate(), "controller": controller},
            protocol=pickle.HIGHEST_PROTOCOL)

    def _restore(self, blob: bytes) -> None:
        import pickle
        state = pickle.loads(blob)
        for a, v in state["attrs"].items():
            setattr(self, a, v)
        self.rng.setstate(state["rng"])
        if state["controller"] is not None:
            self.controller = state["controller"]
        self.fate_base = list(state["fate_base"])
        self._restored = state

    def state_tuples(self) -> int:
        return sum(len(bw) for win in self.windows for bw in win) + sum(
            len(b) for b in self.buffers)

    def state_bytes(self, sample: int = 64) -> int:
        """Bytes held in the windows and buffers: per row its tuple, its values and its
        prepared condition values (sets, weight maps), measured on up to ``sample`` rows
        of each window and multiplied out, plus the index lists' slots (8 bytes each)."""
        total = 0
        for win in self.windows:
            rows = [(bw.rows[k], bw.vals[k]) for bw in win for k in range(len(bw))]
            if not rows:
                continue
            step = max(1, len(rows) // sample)
            picked = rows[::step]
            per_row = sum(_deep_size(r) + _deep_size(v) for r, v in picked) / len(picked)
            total += int(per_row * len(rows)) + 8 * 5 * len(rows)  # the parallel lists
            for bw in win:
                if bw.index:
                    total += sys.getsizeof(bw.index) + 8 * sum(
                        len(x) if isinstance(x, list) else sum(map(len, x.values()))
                        for x in bw.index.values())
        return total + 64 * sum(len(b) for b in self.buffers)

    def describe(self) -> str:
        conds = [str(p) for p in self.query.set_predicates]
        conds += [f"{a} = {b}" for a, b in self.query.equalities()]
        return (f"load-shedding join {' ⋈ '.join(self.aliases)} on "
                f"{' AND '.join(conds)}: shed {self.shed}, index {self.index}, basic "
                f"windows {self.b_seconds:g} s (n = {', '.join(map(str, self.n))})")

    def report(self) -> dict:
        """The run summary's shedding figures (JSON-safe)."""
        out = {
            "shed": self.shed, "index": self.index, "basic_window": self.b_seconds,
            "basic_windows": list(self.n),
            "capacity": "wall" if self.wall else "batch" if self.batch else (
                # (rate is per engine time unit: 2000 came back 2000.0000000000002)
                None if self.rate is None else float(f"{self.rate / self.time_unit:.12g}")),
            "work_units": self.work,
            "fraction_r": [round(r, 6) for r in self.fractions],
            "buffer_drops": dict(zip(self.aliases, self.drops)),
            "max_delay_seconds": self.max_delay,
            "fully_processed": sum(self.full),
            "shed_results": self.results,
        }
        if self.type_of is not None:
            out["output_utility"] = round(self.utility, 6)
        out.update(self.loss())
        if self.controller is not None:
            out.update(self.controller.report())
        return out

    def expired(self, now=None) -> int:
        """Rows that left their windows by ``now`` (engine units; default the newest
        arrival it was given), as the other executors count expiries (a row of W_i
        expires at T + w_i, counted when an arrival comes after): the rows removed with
        their basic windows and those still held in one but older than the window (they
        no longer join, §3.2). A dropped arrival never entered a window, so it never
        leaves one."""
        now = self.latest if now is None else max(now, self.latest)
        held = 0
        for win, w in zip(self.windows, self.w, strict=True):
            for bw in win:
                if bw.ts and bw.ts[0] + w < now:
                    held += bisect.bisect_left(bw.ts, now, key=lambda t, w=w: t + w)
        return self.cleared + held

    def loss(self) -> dict:
        """The estimated fraction of the results lost (beyond the paper): the exact
        output is estimated per direction from the fully processed sample (Horvitz–
        Thompson over the fetched tuples: each was fully processed with probability
        r·γ, or 1 while r_i = 1), scaled up for dropped arrivals (the probing stream's,
        and the probed window's rows that were dropped); a 95% interval of the sampling
        only: the scale-up is taken as exact (docs/shedding.md, "What was lost"), so with
        every fetched tuple fully processed (random, none) its width is zero. Unmeasured
        (``loss_summary``) when a direction's output is estimated from fewer than
        ``MIN_LOSS_HITS`` sampled tuples with matches, or when every arrival of a stream
        it needs was dropped."""
        total = var = 0.0
        measured = True
        for i in (0, 1):
            p = 1 - i
            est = self.estimate[i]
            if not self.arrivals[p] or not self.arrivals[i]:
                continue  # no pair of this direction can exist
            kept = 1.0 - self.drops[i] / self.arrivals[i]
            if self.processed[p] == 0 or kept <= 0:
                measured = False  # all of a stream dropped: nothing to scale up
                continue
            scale = self.arrivals[p] / self.processed[p] / kept
            total += est.get() * scale
            var += (est.stderr() * scale) ** 2
            measured = measured and est.measured(MIN_LOSS_HITS)
        return self._loss_summary(total, var, measured)

    def _loss_summary(self, total: float, var: float, measured: bool = True) -> dict:
        return loss_summary(self.results, total, var, measured)


# The fewest sampled tuples with matches an estimate of the output sampled at r·γ < 1 may
# rest on: from fewer (none, at a small r·γ) its variance estimate means nothing.
MIN_LOSS_HITS = 10


def loss_summary(results: int, total: float, var: float, measured: bool = True) -> dict:
    """``results`` emitted against the estimate ``total`` of the exact output (variance
    ``var``): the lost fraction with a 95% interval. Every emitted result is a true one,
    so the exact output is at least ``results``: a smaller estimate is raised to it.
    Not ``measured`` (too small a sample, ``MIN_LOSS_HITS``): the exact output may be
    any larger, so the interval reaches 1 (``estimated_lost_measured`` false says so).
    Estimates of disjoint parts (Spark's partition groups) add up, totals and variances
    alike, and are measured when every part is."""
    total = float(max(total, results))
    top = [] if measured else [1.0]
    if total <= 0:
        return {"estimated_results": 0.0, "estimated_results_var": 0.0,
                "estimated_lost": 0.0, "estimated_lost_interval": [0.0, max([0.0, *top])],
                "estimated_lost_measured": measured}
    half = 1.96 * math.sqrt(var)
    lost = 1.0 - results / total
    lo = 1.0 - results / max(total - half, results or 1e-12)
    hi = 1.0 - results / (total + half)
    return {"estimated_results": round(total, 1), "estimated_results_var": var,
            "estimated_lost": max(0.0, lost),
            "estimated_lost_interval": [max(0.0, min(lo, hi)), max(0.0, lo, hi, *top)],
            "estimated_lost_measured": measured}


def budget_slices(win, order, a: float):
    """Algorithm 3, lines 7–15: the basic windows of ``win`` in the priority ``order``,
    each with the first position to process (0: all of it), until ``a`` rows are spent;
    the last one in part, its newest rows (time-ordered processing stops at a time)."""
    for j in order:
        bw = win[j]
        k = len(bw)
        if not k:
            continue
        a -= k
        if a > 0:
            yield bw, 0
        else:
            yield bw, k - math.ceil((1.0 + a / k) * k)  # r_e = 1 + a/|B| of it
            return


def _deep_size(x) -> int:
    """sys.getsizeof of a value and, for tuples, sets, lists and dicts, of its items."""
    n = sys.getsizeof(x)
    if isinstance(x, (tuple, list, set, frozenset)):
        n += sum(_deep_size(v) for v in x)
    elif isinstance(x, dict):
        n += sum(_deep_size(k) + _deep_size(v) for k, v in x.items())
    return n


def _ignore(*_args) -> None:
    return None
