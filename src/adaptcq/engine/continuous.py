"""One running continuous query: window operators, selections and a join executor.

Drivers (the local runtime, a Spark partition group) hand it arrivals in batches, in
timestamp order (ARCHITECTURE.md "Batches at the boundary"). Inside, every update is
processed to completion before the next (a-caching.txt §3.1): first the time-window
deletions due before the arrival, then the arrival's own count-window deletion, then the
arrival. Each processed update gets the next global sequence number.
"""

from __future__ import annotations

import dataclasses
import hashlib
import heapq
import math
import pickle
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from adaptcq.checks import is_int
from adaptcq.errors import OptionError
from adaptcq.query.logical import LogicalQuery, require_equi_joins
from adaptcq.stats.estimators import W_DEFAULT
from adaptcq.stats.profiler import INTERVAL_DEFAULT
from adaptcq.stream.windows import CountWindow, ExpiryClock

EXECUTORS = ("mjoin", "xjoin", "tree", "shed")

MODES = ("append", "retract")

MAX_SAMPLES = 2048  # state-size samples kept (thinned beyond: see ContinuousQuery.sample)

# The options each executor takes (keyword arguments of ContinuousQuery / make_executor).
EXECUTOR_OPTIONS: dict[str, tuple[str, ...]] = {
    "mjoin": ("orders", "nested_loop"),
    "xjoin": ("tree",),
    # The operator tree of state-spill.txt (engine.spill_tree): its plan, partitions per
    # operator, the spill store, the spill policy, lineage sampling.
    "tree": ("tree", "partitions", "store", "spill", "late_column", "sample", "seed",
             "time_unit"),
    # The load-shedding join of load-shedding.txt (engine.shed_join): the shedding mode,
    # the CPU capacity, basic windows, the index, input buffers, γ, the policy.
    "shed": ("shed", "capacity", "basic_window", "index", "buffer", "gamma", "controller",
             "types", "seed", "time_unit", "track", "state"),
}
# Executors that take insertions only and keep time in the engine's unit themselves.
_INSERTIONS_ONLY = {"tree": "the operator tree (--executor tree, --spill)",
                    "shed": "the load-shedding join"}
# ContinuousQuery's own keyword arguments, named in the message for an unknown option.
_OWN_OPTIONS = ("trace", "sample_every", "time_unit", "explicit_deletions")
# Where an option that belongs elsewhere goes, for the message.
_HINTS = {
    "policies": "attach adaptive policies with ContinuousQuery.attach(policy)",
    "cache_options": "cache options belong to the A-Caching policy (adapt.acaching.ACaching)",
}



@dataclass
class Counters:
    arrivals: int = 0          # input rows accepted
    insertions: int = 0        # ΔR insertions processed (rows that passed their selection)
    deletions: int = 0         # ΔR deletions processed (expiries and explicit deletions)
    filtered: int = 0          # arrivals dropped by their stream's selection
    results: int = 0           # output rows emitted
    rejected: int = 0          # explicit deletions of rows that were not there
    samples: list = field(default_factory=list)  # (updates, ts, state tuples, state bytes)
    peak_tuples: int = 0       # the largest state seen by ``sample`` (tuples, bytes)
    peak_bytes: int = 0

    @property
    def updates(self) -> int:
        """Updates processed: insertions and deletions of all ΔR (the papers' load)."""
        return self.insertions + self.deletions


def check_options(executor: str, options: dict, own: tuple[str, ...] = ()) -> None:
    """Refuse an unknown executor, and options ``executor`` does not take, naming them and
    the accepted ones (``own``: further keywords the caller accepts, for the message)."""
    if executor not in EXECUTOR_OPTIONS:
        hint = ("; acaching is mjoin with the A-Caching policy attached "
                "(adapt.acaching.ACaching)" if executor == "acaching" else "")
        raise OptionError(f"unknown executor {executor!r}; choose one of "
                          f"{', '.join(EXECUTORS)}{hint}")
    accepted = EXECUTOR_OPTIONS[executor]
    unknown = [k for k in options if k not in accepted]
    if not unknown:
        return
    hints = [_HINTS[k] for k in unknown if k in _HINTS]
    for other, opts in EXECUTOR_OPTIONS.items():
        theirs = [k for k in unknown if k in opts and other != executor]
        if theirs:
            hints.append(f"{', '.join(theirs)} {'is' if len(theirs) == 1 else 'are'} for "
                         f"the {other} executor")
    names = ", ".join(accepted + own)
    plural = "s" if len(unknown) > 1 else ""
    raise OptionError(f"unknown option{plural} {', '.join(unknown)} for the {executor} executor "
                      f"(accepted: {names})" + "".join(f"; {h}" for h in hints))


def make_executor(query: LogicalQuery, executor: str, mode: str, out: list, **options):
    """The join executor ``executor`` (see :data:`EXECUTOR_OPTIONS` for the options each
    takes; any other option is an :class:`OptionError`)."""
    check_options(executor, options)
    if executor != "shed":
        require_equi_joins(query, f"the {executor} executor")
    if executor == "mjoin":
        from adaptcq.engine.mjoin import MJoin
        return MJoin(query, mode, orders=options.get("orders"), out=out,
                     nested_loop=options.get("nested_loop") or ())
    if executor == "shed":  # two streams: the paper's join; more: MJoin pipelines
        if len(query.streams) > 2:
            from adaptcq.engine.shed_mjoin import ShedMJoin
            return ShedMJoin(query, mode, out=out, **options)
        from adaptcq.engine.shed_join import ShedJoin
        return ShedJoin(query, mode, out=out, **options)
    if executor == "tree":
        from adaptcq.engine.spill_tree import SpillTree
        spill = options.pop("spill", None)
        ex = SpillTree(query, mode, out=out, **options)
        if spill is not None:
            ex.set_controller(spill, spill.every)
        return ex
    from adaptcq.engine.xjoin import XJoin
    return XJoin(query, mode, tree=options.get("tree"), out=out)


# Executors whose state a snapshot does not hold, and what it would miss.
_NO_SNAPSHOT = {
    "shed": "its basic windows, buffers and shedding controller (docs/shedding.md)",
    "tree": "its spilled generations and operator state (docs/spill.md)",
}
_SNAPSHOT_KEYS = ("executor", "plan", "rows", "heap", "counts", "values", "next_rid", "now",
                  "next_sample", "stats")


def _query_fingerprint(query: LogicalQuery) -> tuple:
    """What a snapshot's state depends on: each stream's alias, source and window, the
    rows' layouts, the predicates, selections and outputs (their SQL)."""
    def sql(e):
        return None if e is None else e.sql()
    return (tuple((s.alias, s.source, s.window.kind, s.window.size) for s in query.streams),
            tuple(sorted((a, tuple(c)) for a, c in query.columns.items())),
            tuple(sorted((str(p.left), str(p.right)) for p in query.predicates)),
            tuple(sorted((a, sql(e)) for a, e in query.selections.items())),
            tuple((o.name, sql(o.expr)) for o in query.outputs))


# A snapshot: this tag, the SHA-256 of the pickled state, the pickled state (a byte
# flipped on disk may still unpickle, into other rows).
_SNAPSHOT_TAG = b"adaptcq-snapshot-1\n"


def _dump_snapshot(state: dict) -> bytes:
    payload = pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)
    return _SNAPSHOT_TAG + hashlib.sha256(payload).digest() + payload


def _load_snapshot(blob) -> dict:
    """A snapshot's state, or a ValueError saying the blob is none (truncated, damaged or
    another object's: pickle's own errors say neither what nor where). A blob without the
    tag is a snapshot from before it (the pickled state alone)."""
    payload = bytes(blob)
    if payload.startswith(_SNAPSHOT_TAG):
        digest, payload = payload[len(_SNAPSHOT_TAG):][:32], payload[len(_SNAPSHOT_TAG) + 32:]
        if hashlib.sha256(payload).digest() != digest:
            raise ValueError("restore: the snapshot is damaged or truncated (its SHA-256 does "
                             "not match its contents)")
    try:
        state = pickle.loads(payload)
    except Exception as e:  # noqa: BLE001 (a damaged blob raises anything pickle can)
        raise ValueError(f"restore: not a ContinuousQuery snapshot (it does not unpickle: "
                         f"{type(e).__name__}: {e})") from None
    if not isinstance(state, dict):
        raise ValueError(  # noqa: TRY004 (one exception type for every bad blob)
            f"restore: not a ContinuousQuery snapshot (a {type(state).__name__})")
    if state.get("version") != 1:
        raise ValueError(f"restore: unknown snapshot version {state.get('version')!r}")
    missing = [k for k in _SNAPSHOT_KEYS if k not in state]
    if missing:
        raise ValueError(f"restore: not a whole ContinuousQuery snapshot (no {missing[0]!r})")
    return state


# What to do instead of passing a setting to ``ContinuousQuery.restore`` (for its message).
_RESTORE_HINTS = {
    "orders": "leave orders out and re-order after restoring with "
              "executor.set_order(stream, order)",
    "nested_loop": "leave nested_loop out; a different one needs a new query fed the input "
                   "again",
    "tree": "leave tree out; a different tree needs a new query fed the input again",
    "time_unit": "its window contents and pending expiries are in that unit",
    "explicit_deletions": "it kept the rows explicit deletions match, or did not",
}


def _same_setting(executor: str, name: str, given, saved) -> bool:
    """Whether ``given`` (a keyword of ``ContinuousQuery.restore``) asks for what the
    snapshot's setting ``saved`` already is, in any form the executor accepts (an order as
    a tuple, one nested-loop stream as a string, a tree as text): restoring with it then
    ignores nothing."""
    try:
        if name == "orders":
            return isinstance(given, Mapping) and all(
                isinstance(o, (list, tuple)) and list(o) == saved.get(a)
                for a, o in given.items())
        if name == "nested_loop":
            return frozenset([given] if isinstance(given, str) else given) == frozenset(saved)
        if name == "tree":
            if executor == "xjoin":
                from adaptcq.engine.xjoin import check_tree as check
            else:
                from adaptcq.engine.spill_tree import check_plan as check
            return check(given) == saved
        return bool(given == saved)
    except (TypeError, ValueError):  # not a form of the setting at all: refused as differing
        return False


def row_key(row: tuple, nan_at: Sequence[int] | None = None) -> tuple:
    """A hashable key equal for equal rows: the row itself, or, when it holds lists or
    dicts (Arrow list, struct and map values), a frozen copy of it (lists -> (list, tuple),
    dicts -> (dict, frozenset of items)). NaN becomes ``NAN_KEY``: a deletion of a row
    holding NaN must find that row, though NaN equals nothing (docs/semantics.md).
    ``nan_at``: the positions that may hold a NaN (``nan_positions``; None: any). Only
    used to match explicit deletions."""
    try:
        hash(row)
    except TypeError:
        return tuple(_freeze(v) for v in row)
    for k in range(len(row)) if nan_at is None else nan_at:
        v = row[k]
        if v != v:  # noqa: PLR0124 (NaN, float or decimal: the one value unequal to itself)
            return tuple(_freeze(v) for v in row)
    return row


# Column kinds that may hold a NaN: "number" holds floats, "other" is not known (a decimal,
# string, ... column holds none). Shared by ``nan_positions`` and the eddy's probes.
NAN_KINDS = ("number", "other")


def nan_positions(query: LogicalQuery, alias: str) -> tuple[int, ...]:
    """The positions of ``alias``'s rows (``query.columns``) that may hold a NaN: columns
    of kind number, or of a kind not known; row_key checks only these (a row of ints and
    strings pays for none). Lists, structs and maps are frozen whole (``_freeze``)."""
    kinds = query.types.get(alias, {})
    return tuple(k for k, c in enumerate(query.columns[alias])
                 if kinds.get(c, "other") in NAN_KINDS)


# A NaN's key: a tagged tuple as _freeze's are (no row value is a tuple), so that keys
# pickled into a snapshot still compare equal when restored.
NAN_KEY = (float, "nan")


def _freeze(value):
    if isinstance(value, list | tuple):
        return (list, tuple(_freeze(v) for v in value))
    if isinstance(value, dict):
        return (dict, frozenset((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, set | frozenset):
        return (set, frozenset(_freeze(v) for v in value))
    if value != value:  # noqa: PLR0124 (NaN)
        return NAN_KEY
    return value


class ContinuousQuery:
    """Windows + selections + executor for one logical query.

    ``process`` takes parallel sequences (stream index, sign, timestamp, row) and returns
    the output rows ``(*select values, sign, ts)`` it produced. Explicit deletions
    (sign -1) are allowed on unbounded streams only, and only when the query is built with
    ``explicit_deletions=True`` (a runtime passes it when a sign column is in use): then
    the rows of every unbounded stream are kept by value, so that a deletion can find the
    oldest equal row; without it no such map is kept (it would cost memory, and rows holding
    lists could not be keys). A deletion that matches no earlier row is rejected and
    reported through ``rejected_rows``.

    ``options`` are the executor's (:data:`EXECUTOR_OPTIONS`: ``orders`` and
    ``nested_loop`` for mjoin, ``tree`` for xjoin); any other keyword is an
    :class:`OptionError` naming it and the accepted ones.
    """

    def __init__(self, query: LogicalQuery, executor: str = "mjoin", mode: str = "append",
                 trace: bool = False, sample_every: int = 20_000, time_unit: float = 1.0,
                 explicit_deletions: bool = False, **options):
        if mode not in MODES:
            raise OptionError(f"unknown mode {mode!r}; choose append or retract")
        if not is_int(sample_every) or sample_every < 1:  # (0 or -1 sampled every update)
            raise OptionError(f"sample_every (updates between two state samples) must be a "
                              f"positive whole number, got {sample_every!r}")
        check_options(executor, options, _OWN_OPTIONS)
        from adaptcq.query.expr import compile_predicate

        self.query = query
        self.mode = mode
        self.out: list = []
        if executor in _INSERTIONS_ONLY:  # their windows end at t + w in engine units
            if explicit_deletions:
                raise OptionError(f"{_INSERTIONS_ONLY[executor]} takes insertions only: "
                                  "explicit deletions (--sign) are not supported")
            options = {**options, "time_unit": time_unit}
        self.executor = make_executor(query, executor, mode, self.out, **options)
        self.selections = [
            compile_predicate(query.selections[a], query.columns[a], a, query.types)
            if query.selections.get(a) is not None else None
            for a in query.aliases]
        # Timestamps are in units of ``time_unit`` seconds. The runtimes pass integer
        # nanoseconds (time_unit 1e-9) so that window boundaries are exact: in float
        # seconds 508.138 + 10.0 < 518.138 holds, and an inclusive window would lose a pair
        # exactly w apart.
        self.time_unit = time_unit
        self.ranges = [s.window.in_units(time_unit)
                       if s.window.kind == "range" else None for s in query.streams]
        self.counts = [CountWindow(int(s.window.size)) if s.window.kind == "rows" else None
                       for s in query.streams]
        # The shed join's rows expire inside it, with their basic windows (§3.2): it
        # counts them (``ShedJoin.expired``), the clock here holds none.
        self._expires_inside = executor == "shed"
        if self._expires_inside:
            self.ranges = [None] * len(query.streams)
        # One window length among the windowed streams: deletions fall due in arrival
        # order and queue in a deque (stream.windows.ExpiryClock).
        self.clock = ExpiryClock(fifo=len({w for w in self.ranges if w is not None}) == 1)
        # Explicit deletions: per unbounded stream, row_key(row) -> row ids of the equal
        # rows still there, oldest first (None for one that failed the selection).
        self.explicit_deletions = bool(explicit_deletions)
        self.values: list[dict | None] = [
            {} if explicit_deletions and s.window.kind == "unbounded" else None
            for s in query.streams]
        self.nan_at = [nan_positions(query, a) for a in query.aliases]
        self.stats = Counters()
        self.next_rid = 0
        self.now = float("-inf")
        self.sample_every = sample_every
        self._next_sample = sample_every
        self.rejected_rows: list[tuple[int, float, tuple, str]] = []
        self.trace: list | None = [] if trace else None
        self.per_stream = [0] * len(query.streams)  # arrivals per stream (rates)
        self.policies: list = []      # engine.protocols.Policy objects, in attach order
        self.profiler = None          # the one stats.profiler.Profiler all policies share
        self.profile_cpu = 0.0        # CPU seconds spent on profiled insertions (policies
        # keep profiling cheap with it: adapt.acaching)
        self._next_event = float("inf")  # row id of the next profiling or policy tick
        self._next_profile = float("inf")
        self._next_tick = float("inf")
        self._rng = None

    # ----- policies ----------------------------------------------------------------------
    def attach(self, policy) -> None:
        """Attach an adaptive policy (``engine.protocols.Policy``; adapt/).

        Refused, naming what is wrong: an executor that cannot be profiled (XJoin), an
        object lacking a hook of the Policy protocol, a policy whose W differs from the
        query's profiler's.

        The query has **one** Profiler (``self.profiler``, ``stats.profiler``): created at
        the first attach with that policy's W (or the Profiler itself, when one is
        attached, becomes it), bound to every policy (``policy.bind``), and fed by the
        query — every profiled Observation exactly once and one tick per interval, before
        the policies' hooks run. The policies of one query combine so:

        * profiling: insertion of stream i is profiled with p_i = the maximum over the
          policies of ``stream_probability(i)`` (the schedule draws with p = the maximum
          ``sample_probability`` and keeps a draw with probability p_i / p; read live, so
          a policy may lower or raise its p while running); the observation carries
          fan-outs when any policy ``needs_fanouts``;
        * ticks: every min over the policies of ``interval`` arrivals (None: none wanted);
          every policy's ``on_interval`` is called at each;
        * W: one per query (the profiler's); a policy with ``W`` None accepts it;
        * seed: the first policy's seeds the sampling.

        A policy changes the plan only through the executor's narrow interface
        (``engine.protocols.AdaptiveExecutor``: ``set_order``...)."""
        import random

        from adaptcq.engine.protocols import AdaptiveExecutor, Policy, missing
        from adaptcq.stats.profiler import Profiler

        if not isinstance(self.executor, AdaptiveExecutor):
            raise OptionError(f"the {self.executor.name} executor cannot be profiled; "
                              "adaptive policies need --executor mjoin (or acaching)")
        lacking = missing(policy, Policy)
        if lacking:
            raise OptionError(f"{type(policy).__name__} is not an adaptive policy: it lacks "
                              f"{', '.join(lacking)} (see adaptcq.engine.protocols.Policy)")
        if isinstance(policy, Profiler):
            if self.profiler is not None and self.profiler is not policy:
                raise OptionError("this query already has a profiler (cq.profiler, shared "
                                  "by its policies); attach no second one")
            profiler = policy
        elif self.profiler is None:
            # Created here: it asks for no profiling itself (p = 0), the policies do.
            profiler = Profiler(W=policy.W or W_DEFAULT, p=0.0,
                                interval=policy.interval or INTERVAL_DEFAULT,
                                seed=policy.seed)
        else:
            profiler = self.profiler
        bound = getattr(policy, "profiler", None)
        if bound is not None and bound is not profiler and not isinstance(policy, Profiler):
            # Its state (an initial plan made, a scaled-down profiling rate, measured
            # costs) belongs to the query it served: a second query got no plan while the
            # report said one was set.
            raise OptionError(f"this {type(policy).__name__} already serves another query; "
                              "a policy object serves one query (make new ones for each "
                              "run: adaptcq.adapt.make_policies)")
        if policy.W is not None and policy.W != profiler.W:
            raise OptionError(
                f"{type(policy).__name__} averages W = {policy.W} observations, but this "
                f"query's profiler keeps W = {profiler.W} (set by the first policy "
                "attached); the policies of one query share one profiler: give them the "
                "same W")
        check = getattr(policy, "check_executor", None)
        if check is not None:  # options the policy cannot honour on this query: refused now
            try:
                check(self.executor)
            except ValueError as e:
                raise OptionError(str(e)) from None
        profiler.start(self.executor)
        policy.bind(profiler)
        self.profiler = profiler
        self.policies.append(policy)
        intervals = [pol.interval for pol in self.policies if pol.interval]
        if intervals and profiler not in self.policies:
            profiler.interval = min(intervals)  # it is ticked at the query's ticks
        self._rng = self._rng or random.Random(int(policy.seed))
        # The combined schedule changed: draw the next profiled insertion and tick anew.
        self._next_profile = self._next_tick = float("inf")
        self._schedule()

    def feed_observation(self, obs, ts: float) -> None:
        """One profiled insertion's Observation: to the profiler, then to every policy
        (``ts`` in seconds of event time). ``_event`` calls it; a test or a replay may
        feed hand-built observations the same way."""
        self.profiler.observe(obs, self.executor)
        for pol in self.policies:
            pol.on_profile(self, obs, ts)

    def feed_tick(self, ts: float) -> None:
        """A tick: the profiler measures rates and state sizes, then every policy's
        ``on_interval`` runs (``ts`` in seconds of event time)."""
        self.profiler.tick(self.per_stream, self.executor, ts)
        for pol in self.policies:
            pol.on_interval(self, ts)

    def reschedule(self) -> None:
        """Draw the next profiled insertion anew (a policy raised its p: a gap drawn at
        the old, lower p would otherwise run to its end)."""
        self._next_profile = float("inf")
        self._schedule()

    def _schedule(self) -> None:
        p = max((pol.sample_probability for pol in self.policies), default=0.0)
        if p > 0 and (self._next_profile <= self.next_rid or self._next_profile == float("inf")):
            # Geometric gaps: each insertion is profiled with probability p, independently.
            gap = 1 if p >= 1 else 1 + int(math.log(1.0 - self._rng.random()) / math.log(1.0 - p))
            self._next_profile = self.next_rid + gap
        elif p <= 0:
            self._next_profile = float("inf")
        intervals = [pol.interval for pol in self.policies if pol.interval]
        if not intervals:
            self._next_tick = float("inf")
        elif self._next_tick <= self.next_rid or self._next_tick == float("inf"):
            self._next_tick = self.next_rid + min(intervals)
        self._next_event = min(self._next_profile, self._next_tick)

    def _accept(self, i: int) -> bool:
        """Thinning: the schedule samples insertions with p = max p_i; pipeline i keeps a
        sampled insertion with probability p_i / p, so each is profiled with p_i."""
        p = max(pol.sample_probability for pol in self.policies)
        p_i = max(pol.stream_probability(i) for pol in self.policies)
        return p_i >= p or self._rng.random() < p_i / p

    def _event(self, i: int, rid: int, row: tuple, ts: float) -> bool:
        """A profiling or policy tick is due at this arrival. Returns True when the
        arrival was processed here (profiled) and must not be inserted again."""
        self.next_rid = rid
        done = False
        seconds = ts * self.time_unit  # policies see seconds
        if rid >= self._next_profile and self._accept(i):
            t0 = time.process_time()
            fanouts = any(pol.needs_fanouts for pol in self.policies)
            self.feed_observation(self.executor.profile_insert(i, rid, row, ts, fanouts),
                                  seconds)
            self.profile_cpu += time.process_time() - t0
            done = True
        if rid >= self._next_tick:
            self.feed_tick(seconds)
        self._schedule()
        return done

    # ----- the query's own CPU clock ----------------------------------------------------
    cpu_spent = 0.0      # CPU seconds inside ``process`` and ``advance_to`` (class defaults:
    _cpu_entered = None  # checkpoints pickled before the clock existed still load)
    stopped_at = None    # arrivals the last ``process`` counted before an emit raised

    def cpu(self) -> float:
        """CPU seconds this query has spent in ``process`` and ``advance_to``, up to now.
        The policies measure intervals on this clock, not the process's: the work a driver
        does between batches (reading input, writing output, other queries or plans in the
        same process, as ``bench.adaptive_ordering`` runs them side by side) is not the
        query's and must not enter a comparison of its plans (issue 14, item 2)."""
        entered = self._cpu_entered
        return self.cpu_spent + (0.0 if entered is None else time.process_time() - entered)

    def _clocked(self, work, *args):
        """``work(*args)`` on the query's clock (``cpu``)."""
        if self._cpu_entered is not None:  # (a nested call: the outer one clocks it)
            return work(*args)
        t0 = self._cpu_entered = time.process_time()
        try:
            return work(*args)
        finally:
            self._cpu_entered = None
            self.cpu_spent += time.process_time() - t0

    # ----- the update loop -------------------------------------------------------------
    def process(self, streams: Sequence[int], signs: Sequence[int] | None,
                timestamps: Sequence[float], rows: Sequence[tuple]) -> list:
        """The arrivals in order; returns the output rows (class docstring). A join key
        that is NaN equals nothing because each row read from Arrow holds its own float
        object and NaN is unequal to itself; rows built by hand must do the same: one NaN
        object shared by two rows' join columns matches itself (Python's hash lookup tries
        identity first), and would not after a snapshot's round trip."""
        return self._clocked(self._process, streams, signs, timestamps, rows)

    def _process(self, streams: Sequence[int], signs: Sequence[int] | None,
                 timestamps: Sequence[float], rows: Sequence[tuple]) -> list:
        ex, st = self.executor, self.stats
        inserts, deletes = ex.inserts, ex.deletes  # per stream, replaced in place
        ranges, counts, sels, values = self.ranges, self.counts, self.selections, self.values
        nan_at = self.nan_at
        trace, per_stream = self.trace, self.per_stream
        heap, heappush, heappop = self.clock.heap, heapq.heappush, heapq.heappop
        fifo = self.clock.fifo
        rid = self.next_rid
        n_ins = n_del = n_filtered = 0
        next_sample = self._next_sample - st.updates
        arrivals0 = st.arrivals
        try:
            for k in range(len(rows)):
                i, ts, row = streams[k], timestamps[k], rows[k]
                # Time-window deletions due before this arrival (stream.windows), inlined:
                # this loop is the hot path of every executor (ExpiryClock.due, by hand).
                while True:
                    if fifo and fifo[0][0] < ts and (not heap or fifo[0] < heap[0]):
                        expires_at, _, j, old = fifo.popleft()
                    elif heap and heap[0][0] < ts:
                        expires_at, _, j, old = heappop(heap)
                    else:
                        break
                    n_del += 1
                    if trace is not None:
                        trace.append((j, -1, expires_at, ex.stems[j].rows[old],
                                      self.emitted()))
                    deletes[j](old, expires_at)
                if signs is not None and signs[k] < 0:
                    st.arrivals += 1
                    n_del += self._explicit_delete(i, ts, row)
                    continue
                rid += 1
                sel = sels[i]
                passed = sel is None or sel(row)
                cw = counts[i]
                if cw is not None:
                    gone = cw.admit(rid if passed else None)
                    if gone:
                        n_del += 1
                        if trace is not None:
                            trace.append((i, -1, ts, ex.stems[i].rows[gone],
                                          self.emitted()))
                        deletes[i](gone, ts)
                if not passed:
                    n_filtered += 1
                    if values[i] is not None:
                        values[i].setdefault(row_key(row, nan_at[i]), []).append(None)
                    continue
                n_ins += 1
                per_stream[i] += 1
                if trace is not None:
                    trace.append((i, 1, ts, row, self.emitted()))
                if rid < self._next_event or not self._event(i, rid, row, ts):
                    inserts[i](rid, row, ts)
                w = ranges[i]
                if w is not None:
                    due = ts + w
                    if fifo is not None and (not fifo or fifo[-1][0] <= due):
                        fifo.append((due, rid, i, rid))  # (ExpiryClock.push, inlined)
                    else:
                        heappush(heap, (due, rid, i, rid))
                elif values[i] is not None:
                    values[i].setdefault(row_key(row, nan_at[i]), []).append(rid)
                if n_ins + n_del >= next_sample:
                    self._add_counts(len(rows), n_ins, n_del, n_filtered)
                    n_ins = n_del = n_filtered = 0
                    self.sample(ts)
                    next_sample = self._next_sample - st.updates
        except BaseException:
            # An emit that raised (a result bound reached, a failed write) stopped this
            # call inside an arrival: count what was done, and say where (``stopped_at``:
            # the arrivals of this call counted, the one it stopped in included).
            self._add_counts(len(rows), n_ins, n_del, n_filtered)
            self.next_rid = rid
            self.stopped_at = done = st.arrivals - arrivals0
            if done:
                self.now = timestamps[done - 1]
            self._count_inside_expiries()
            raise
        self._add_counts(len(rows), n_ins, n_del, n_filtered)
        self.next_rid = rid
        self.now = timestamps[-1] if len(timestamps) else self.now
        self._count_inside_expiries()
        return self.drain()

    def _count_inside_expiries(self) -> None:
        """ΔR deletions of an executor whose rows expire inside it (the shed join): the
        rows that left their windows by ``now``, counted as the clock counts the others'
        (a row of W_i expires at T + w_i, when an arrival comes after it); the shed join
        takes neither count windows nor explicit deletions, so these are all of them."""
        if self._expires_inside and self.now is not None:
            self.stats.deletions = self.executor.expired(self.now)

    def _add_counts(self, _n: int, n_ins: int, n_del: int, n_filtered: int) -> None:
        st = self.stats
        st.insertions += n_ins
        st.deletions += n_del
        st.filtered += n_filtered
        st.arrivals += n_ins + n_filtered

    def run_batches(self, streams: Sequence[int], signs: Sequence[int] | None,
                    timestamps: Sequence[float], rows: Sequence[tuple],
                    bounds: Iterable[int], start: int = 0,
                    ) -> Iterator[tuple[int, int, list, float]]:
        """The one loop every driver runs around ``process``: the arrivals in slices
        [start, b1), [b1, b2), … for the increasing ``bounds``; yields (lo, hi, output,
        CPU seconds of the engine) per slice. A driver chooses the bounds (fixed batches,
        marks for a time series, output-driven sizes) and does what it wants between
        slices (a policy change, a flush, a stop)."""
        lo = start
        for hi in bounds:
            if hi <= lo:
                continue
            t0 = time.process_time()
            out = self.process(streams[lo:hi], None if signs is None else signs[lo:hi],
                               timestamps[lo:hi], rows[lo:hi])
            yield lo, hi, out, time.process_time() - t0
            lo = hi

    def advance_to(self, now: float) -> None:
        """Process every time-window deletion due before ``now`` (see stream.windows)."""
        return self._clocked(self._advance_to, now)

    def _advance_to(self, now: float) -> None:
        ex, st, trace = self.executor, self.stats, self.trace
        for expires_at, _, i, rid in self.clock.due(now):
            st.deletions += 1
            if trace is not None:
                trace.append((i, -1, expires_at, ex.stems[i].rows[rid], self.emitted()))
            ex.delete(i, rid, expires_at)

    def _explicit_delete(self, i: int, ts: float, row: tuple) -> int:
        store = self.values[i]
        alias = self.query.aliases[i]
        if store is None:
            if self.query.streams[i].window.kind != "unbounded":
                raise ValueError(f"stream {alias} has a window; explicit deletions are "
                                 "allowed on unbounded streams only")
            raise ValueError(f"stream {alias}: an explicit deletion (sign -1), but the query "
                             "was built without ContinuousQuery(..., explicit_deletions=True)")
        key = row_key(row, self.nan_at[i])
        rids = store.get(key)
        if not rids:
            self.stats.rejected += 1
            self.rejected_rows.append((i, ts, row, f"deletion of a row not in {alias}"))
            return 0
        rid = rids.pop(0)
        if not rids:
            del store[key]
        if rid is None:  # the row never passed the selection: nothing to delete
            return 0
        if self.trace is not None:
            self.trace.append((i, -1, ts, row, self.emitted()))
        self.executor.delete(i, rid, ts)
        return 1

    def emitted(self) -> int:
        """Output rows produced so far (drained or not): a position in the output."""
        return self.stats.results + len(self.out)

    def finish(self) -> list:
        """End of input: what an executor still holds back (the load-shedding join's
        buffered tuples) is processed; returns the output."""
        finish = getattr(self.executor, "finish", None)
        if finish is not None:
            finish()
        return self.drain()

    def drain(self) -> list:
        out = self.out[:]
        self.stats.results += len(out)
        self.out.clear()
        return out

    def bound_output(self, limit: int | None, flush=None) -> None:
        """Hand results to ``flush(rows)`` whenever ``limit`` of them are pending, even in
        the middle of one update, so that an update joining with millions of tuples never
        holds them all (``limit=None``: results wait for ``process`` to return, the fast
        path). ``flush`` may raise to abandon the run (a result bound was reached)."""
        out, append = self.out, self.out.append
        if limit is None:
            self.executor.set_emit(append)
            return

        def emit(row) -> None:
            append(row)
            if len(out) >= limit:
                flush(self.drain())
        self.executor.set_emit(emit)

    # ----- checkpoints -----------------------------------------------------------------
    def snapshot(self) -> bytes:
        """Everything needed to continue exactly where this query is: the window contents
        (SteM rows under their row ids), pending time-window deletions, count windows,
        the rows explicit deletions can match, counters, and the executor's plan. The
        logical query is not included: ``restore`` is given it again, and refuses another
        (its fingerprint, ``_query_fingerprint``, is kept). The load-shedding join and the
        operator tree keep state a snapshot does not hold (basic windows and their
        controller; spilled generations): their snapshot is refused, not taken without it."""
        if self.executor.name in _NO_SNAPSHOT:
            raise OptionError(f"snapshot: the {self.executor.name} executor's state is not in "
                              f"a snapshot ({_NO_SNAPSHOT[self.executor.name]}); snapshots "
                              "cover mjoin (with its policies) and xjoin")
        state = {
            "version": 1,
            "query": _query_fingerprint(self.query),
            "mode": self.mode,
            "executor": self.executor.name,
            "plan": self.executor.plan_state(),
            "rows": [stem.rows for stem in self.executor.stems],
            "times": [stem.times for stem in self.executor.stems],
            "heap": self.clock.pending(),
            "counts": [None if c is None else list(c.rids) for c in self.counts],
            "values": self.values,
            "explicit_deletions": self.explicit_deletions,
            "next_rid": self.next_rid,
            "now": self.now,
            "next_sample": self._next_sample,
            "time_unit": self.time_unit,
            "stats": dataclasses.asdict(self.stats),
        }
        return _dump_snapshot(state)

    @classmethod
    def restore(cls, query: LogicalQuery, blob: bytes, mode: str | None = None,
                **options) -> ContinuousQuery:
        """Rebuild a query from ``snapshot()``; it then behaves exactly as the original
        would have (same outputs for the same further input). ``query`` must be the one
        snapshotted (streams, windows, columns, predicates, selections, outputs; another
        is refused: its rows would land in other streams' windows). The mode, the
        executor, the plan (``orders`` and ``nested_loop``, or ``tree``), ``time_unit``
        and ``explicit_deletions`` come from the snapshot: one of them given that differs
        from the snapshot's is refused (an OptionError naming it), not silently replaced;
        re-order after restoring with ``executor.set_order``. A blob that is not a
        snapshot (truncated, damaged, another object's) is a ValueError saying so."""
        state = _load_snapshot(blob)
        if "executor" in options:
            raise OptionError("restore: executor= is not taken; the snapshot carries its "
                              f"executor ({state['executor']})")
        saved = state.get("query")
        if saved is not None and saved != _query_fingerprint(query):
            raise OptionError("restore: the query differs from the one snapshotted (its "
                              "streams, windows, columns, predicates, selections or outputs); "
                              "restore a snapshot with its own query")
        saved_mode = state.get("mode")
        if mode is not None and saved_mode is not None and mode != saved_mode:
            raise OptionError(f"restore: mode={mode!r} differs from the snapshot's "
                              f"mode={saved_mode!r}; the snapshot carries its mode and is "
                              "restored with it (leave mode out)")
        mode = mode or saved_mode or "append"
        explicit = state.get("explicit_deletions")
        if explicit is None:  # a snapshot from before the flag: the map was always kept
            explicit = any(v is not None for v in state["values"])
        carried = {**state["plan"], "time_unit": state.get("time_unit", 1.0),
                   "explicit_deletions": explicit}
        for name, given in options.items():
            if given is None:  # (the constructor's own "not given": nothing asked for)
                continue
            if name in carried and not _same_setting(state["executor"], name, given,
                                                     carried[name]):
                raise OptionError(
                    f"restore: {name}={given!r} differs from the snapshot's "
                    f"{name}={carried[name]!r}; the snapshot carries its {name} and is "
                    f"restored with it ({_RESTORE_HINTS.get(name, 'leave it out')})")
        options = {**options, **carried}
        cq = cls(query, state["executor"], mode, **options)
        times = state.get("times") or [None] * len(state["rows"])
        for i, rows in enumerate(state["rows"]):
            cq.executor.load(i, rows, times[i])
        cq.clock.heap = state["heap"]
        for cw, rids in zip(cq.counts, state["counts"]):
            if cw is not None:
                cw.rids = deque(rids)
        cq.values = state["values"]
        cq.next_rid, cq.now = state["next_rid"], state["now"]
        cq._next_sample = state["next_sample"]
        cq.stats = Counters(**state["stats"])
        return cq

    @classmethod
    def rebuild(cls, query: LogicalQuery, executor: str, mode: str,
                streams: Sequence[int], signs: Sequence[int] | None,
                timestamps: Sequence[float], rows: Sequence[tuple], expired_before: float,
                now: float, stats: dict | None = None, plan: dict | None = None,
                time_unit: float = 1.0, explicit_deletions: bool = False,
                next_rid: int = 0, **options) -> ContinuousQuery:
        """The query as it stands after ``process`` of every arrival given (in order, as
        it was processed) and ``advance_to(expired_before)``, rebuilt from those arrivals
        **without joining them**: the rows still in their windows are loaded into the
        SteMs (``executor.load``), with their pending expiries, count windows and the rows
        explicit deletions can match. Arrivals whose window ended before ``expired_before``
        (``t + w < expired_before``, the rule of ``process`` and ``advance_to``) may be
        left out by the caller; so may whole runs of arrivals that no window still holds.

        The Spark runtime keeps a partition group's rows as changes and rebuilds its engine
        with this when a worker has no live copy (docs/spark.md, "State as changes"). Row
        ids are renumbered in arrival order (only their order matters to the executors) and
        the next one is ``next_rid`` when given (policies schedule by row id); ``stats`` (``Counters`` as a dict) and ``plan`` (``executor.plan_state()``) carry
        the counters and the adaptive orders over."""
        options = {**options, **(plan or {}), "time_unit": time_unit,
                   "explicit_deletions": explicit_deletions}
        cq = cls(query, executor, mode, **options)
        cq.load_arrivals(streams, signs, timestamps, rows, expired_before)
        cq.next_rid, cq.now = max(cq.next_rid, next_rid), now
        if stats is not None:
            cq.stats = Counters(**stats)
            cq._next_sample = cq.stats.updates + cq.sample_every
        return cq

    def load_arrivals(self, streams: Sequence[int], signs: Sequence[int] | None,
                      timestamps: Sequence[float], rows: Sequence[tuple],
                      expired_before: float) -> None:
        """Bring the windows to where ``process`` of these arrivals (in order) and
        ``advance_to(expired_before)`` would leave them, **without joining** the arrivals:
        their rows are loaded into the SteMs (``executor.load``), rows they push out or
        delete are deleted, and the output this produces (retractions) is dropped. Used by
        ``rebuild`` and to catch a stale copy of a Spark group up with its stored changes
        (an MJoin's SteMs are its whole state; executors holding join subresults, XJoin's
        or A-Caching's, are rebuilt instead)."""
        sels, ranges, counts, values = self.selections, self.ranges, self.counts, self.values
        nan_at = self.nan_at
        ex = self.executor
        n_streams = len(self.query.streams)
        live: list[dict] = [{} for _ in range(n_streams)]
        times: list[dict] = [{} for _ in range(n_streams)]
        clock = self.clock
        rid = self.next_rid

        def gone_row(i: int, r: int, ts: float) -> None:
            if r in live[i]:
                del live[i][r], times[i][r]
            else:
                ex.delete(i, r, ts)

        for k in range(len(rows)):
            i, ts, row = streams[k], timestamps[k], rows[k]
            if signs is not None and signs[k] < 0:
                store = values[i]
                key = row_key(row, nan_at[i]) if store is not None else None
                rids = store.get(key) if store is not None else None
                if rids:
                    gone = rids.pop(0)
                    if not rids:
                        del store[key]
                    if gone is not None:
                        gone_row(i, gone, ts)
                continue
            rid += 1
            passed = sels[i] is None or sels[i](row)
            cw = counts[i]
            if cw is not None:
                gone = cw.admit(rid if passed else None)
                if gone:
                    gone_row(i, gone, ts)
            if not passed:
                if values[i] is not None:
                    values[i].setdefault(row_key(row, nan_at[i]), []).append(None)
                continue
            w = ranges[i]
            if w is not None:
                if ts + w < expired_before:
                    continue
                clock.push((ts + w, rid, i, rid))
            elif values[i] is not None:
                values[i].setdefault(row_key(row, nan_at[i]), []).append(rid)
            live[i][rid] = row
            times[i][rid] = ts
        for i in range(n_streams):
            if live[i]:
                ex.load(i, live[i], times[i])
        self.next_rid = rid
        for expires_at, _, i, r in clock.due(expired_before):
            ex.delete(i, r, expires_at)
        self.out.clear()

    # ----- statistics ------------------------------------------------------------------
    def sample(self, ts: float) -> None:
        """Record the state's size. A query runs for days: past MAX_SAMPLES samples every
        other one is dropped and the interval doubles, so the history stays bounded while
        the peaks are kept exactly."""
        st = self.stats
        tuples, nbytes = self.executor.state_tuples(), self.executor.state_bytes()
        st.samples.append((st.updates, ts, tuples, nbytes))
        st.peak_tuples = max(st.peak_tuples, tuples)
        st.peak_bytes = max(st.peak_bytes, nbytes)
        if len(st.samples) > MAX_SAMPLES:
            del st.samples[1::2]
            self.sample_every *= 2
        self._next_sample = st.updates + self.sample_every

    def peak_state(self) -> tuple[int, int]:
        st = self.stats
        if not st.samples:
            return self.executor.state_tuples(), self.executor.state_bytes()
        return st.peak_tuples, st.peak_bytes
