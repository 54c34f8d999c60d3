"""A deterministic model of the operators' input queues, for back-pressure routing.

cacq.txt §3.1 and §4: in Telegraph every operator runs in its own thread with an input
queue; the eddy puts tuples on those queues and *back-pressure* "limits the size of the
input queues of operators, capping the rate at which the eddy can route tuples to slow
operators" (the original eddies' scheme, Avnur and Hellerstein, SIGMOD 2000, ref. [1]).
adaptcq's eddy is one Python thread that runs each operator to completion, so there are
no real queues: this module *estimates* what they would hold. It is a statistic with the
tiny interface of ``stats.estimators`` (``update``/``get``); the routing policies in
``adapt.routing`` read it, the eddy mechanism feeds it through them.

The model (docs/cacq-routing.md, "Back-pressure and the queue model", has it with
measurements):

* **Servers.** Each operator is its own server with an unbounded FIFO input queue. It
  serves 1 work unit per unit of virtual time, in parallel with every other operator.
  ``busy[op]`` is the virtual time at which it will have finished everything it was
  given; its *backlog* at time T is ``max(0, busy[op] - T)`` work units plus
  ``pending[op] × cost[op]`` for tuples admitted and not yet reported (an eddy that routes
  ahead of processing); a synchronous eddy reports each tuple before its next decision,
  so there ``pending`` is 0 whenever a decision is taken.
* **Work.** ``update(op, work)`` — the operator finished one input tuple and spent
  ``work`` units (the engine's virtual work clock, docs/architecture.md): it starts at
  ``max(busy, T)`` and ends ``work`` later. ``cost[op]`` is an exponentially weighted mean
  of those ``work`` values (smoothing ``smoothing``; the first observation sets it;
  0 before any, so an operator never seen is never full).
* **Full.** An operator is full when its backlog exceeds ``capacity`` tuples of its mean
  cost: ``backlog > capacity × cost[op]``. Kept as one number per operator,
  ``full_until[op]`` = the virtual time until which it stays full if nothing else
  happens, so the routing hot path tests ``full_until[op] > clock`` (no arithmetic).
* **Blocking.** ``admit(op)`` — the eddy puts a tuple on op's queue. When the queue is full
  the eddy *blocks* until there is room, as a bounded queue would make it: the clock
  jumps to ``full_until[op]`` and every server drains meanwhile (``waited`` adds the
  jump). Routing policies only admit to a full operator when every ready operator is full,
  so this bounds every backlog by ``capacity`` tuples plus one tuple's work.
* **Epochs.** ``update_epoch`` takes a routing epoch's totals at once (an eddy following a
  routing table): a fluid approximation of the same tuples reported one by one.
* **Virtual time** (``clock``; see :data:`CLOCKS`). What paces the eddy against its
  operators decides what ever fills, so it is a parameter:

  - ``"eddy"`` (the default): the eddy itself is a server that spends ``eddy_cost`` work
    units per routing decision (``admit``), with a saturated source (a tuple is always
    waiting); virtual time is the eddy's time, ``eddy_cost`` × routings plus the time it
    was blocked. An operator fills when the eddy hands it more than ``eddy_cost`` work per
    decision on average: an operator whose tuples cost more than a routing decision and
    that receives a large share of them — the slow operator of §4 — and never an operator
    costing at most ``eddy_cost`` per tuple, however popular.
  - ``"work"``: virtual time = total work reported (``update`` adds ``work``). The literal
    reading of "time from work units". In a synchronous eddy no queue ever fills: an
    operator receives at most the total work, and serves as fast as the total grows, so
    its backlog never exceeds the tuple it is processing (back-pressure does nothing).
  - ``"share"``: the operators' threads share one processor in equal round-robin slices
    (an idle thread's slice is lost): virtual time = total work / number of operators.
    An operator fills when it does more than 1/n of all work — which is the most
    *selective* filter as soon as the tickets send every tuple to it first: measured on
    cacq.txt Table 3 it moves routing from 1.24 to 1.98 filters per tuple.

What it abstracts away: the processor(s) the threads really share and their scheduler
(each server has a full processor; under ``"share"`` exactly 1/n of one), the source's
rate (always a tuple waiting), the eddy's tuple pool (a blocked eddy here waits; Telegraph's
eddy would route another tuple from its pool meanwhile), batching, memory, and time itself:
costs are the engine's deterministic work units, so the model gives the same answer on any
machine and after a restore.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

#: Queue capacity in tuples (of the operator's mean cost). Ours: 8 lets a burst of a few
#: tuples through without diverting routing, and is small enough that a slow operator
#: stops receiving first visits within a few dozen tuples.
CAPACITY_DEFAULT = 8.0
#: Smoothing of the mean cost per tuple (an EWMA: weight of the newest observation).
#: Ours: 0.05 remembers about the last 20 tuples, so a SteM's cost follows its fan-out.
SMOOTHING_DEFAULT = 0.05
#: The eddy's own work per routing decision under the ``"eddy"`` clock. Ours: 1 work unit,
#: the cost of one hash probe in the engine's work clock (a decision is a bit-vector
#: update and a lottery, of the same order).
EDDY_COST_DEFAULT = 1.0
#: The virtual clocks (module docstring): what advances virtual time.
CLOCKS = ("eddy", "work", "share")
CLOCK_DEFAULT = "eddy"

_INF = math.inf


class QueueModel:
    """Estimated input queues of the eddy's operators (module docstring; cacq.txt §4).

    ``admit(op)`` when the eddy routes a tuple to ``op``, ``update(op, work)`` when ``op``
    reports the tuple done; ``full(op)`` / ``get(op)`` read the estimate. Operators are
    small ints, registered with ``add`` / ``remove``. Deterministic: no randomness, no
    wall-clock time; ``state()`` / ``from_state()`` round-trip it exactly.
    """

    __slots__ = ("_ops", "_per_route", "_per_work", "capacity", "clock", "clock_kind",
                 "eddy_cost", "full_until", "smoothing", "waited")

    def __init__(self, capacity: float = CAPACITY_DEFAULT, *, clock: str = CLOCK_DEFAULT,
                 eddy_cost: float = EDDY_COST_DEFAULT, smoothing: float = SMOOTHING_DEFAULT):
        if not capacity > 0:
            raise ValueError(f"capacity must be a positive number of tuples, got {capacity!r}")
        if clock not in CLOCKS:
            raise ValueError(f"unknown clock {clock!r}; choose one of {', '.join(CLOCKS)}")
        if not eddy_cost > 0:
            raise ValueError(f"eddy_cost must be positive work units, got {eddy_cost!r}")
        if not 0 < smoothing <= 1:
            raise ValueError(f"smoothing must be in (0, 1], got {smoothing!r}")
        self.capacity = float(capacity)
        self.clock_kind = clock
        self.eddy_cost = float(eddy_cost)
        self.smoothing = float(smoothing)
        self.clock = 0.0          # virtual time
        self.waited = 0.0         # virtual time the eddy spent blocked on full queues
        #: op -> virtual time until which its queue stays full (full iff > clock)
        self.full_until: dict[int, float] = {}
        # op -> [busy, cost, count, pending]: the time its server finishes the work it was
        # given, its mean work per tuple (EWMA), tuples reported (0: cost unknown), tuples
        # admitted and not yet reported. One list per op: one dict lookup per call.
        self._ops: dict[int, list] = {}
        # The clock's advance as two coefficients, so admit/update never branch on the kind.
        self._per_route = self.eddy_cost if clock == "eddy" else 0.0
        self._per_work = 0.0
        self._rates()

    def _rates(self) -> None:
        if self.clock_kind == "work":
            self._per_work = 1.0
        elif self.clock_kind == "share":
            self._per_work = 1.0 / len(self._ops) if self._ops else 1.0

    # -- operators ---------------------------------------------------------------------

    def add(self, op: int) -> None:
        """Register ``op`` with an empty queue (no-op if present)."""
        if op in self._ops:
            return
        self._ops[op] = [self.clock, 0.0, 0, 0]
        self._refresh(op)
        self._rates()

    def remove(self, op: int) -> None:
        """Forget ``op`` and its queue (no-op if absent)."""
        if op not in self._ops:
            return
        del self._ops[op]
        del self.full_until[op]
        self._rates()

    def __contains__(self, op: int) -> bool:
        return op in self._ops

    def _refresh(self, op: int) -> None:
        # full iff max(0, busy - T) > (capacity - pending) * cost. With room for at least
        # the pending tuples the right side is >= 0, so full iff T < busy - slack; with more
        # pending than capacity (an eddy routing ahead) it is full until they are reported.
        # (admit and update inline this: they run once per routing.)
        busy, cost, _, pending = self._ops[op]
        slack = (self.capacity - pending) * cost
        self.full_until[op] = busy - slack if slack >= 0.0 else _INF

    # -- the estimator -------------------------------------------------------------------

    def admit(self, op: int) -> float:
        """The eddy puts one tuple on ``op``'s input queue. If the queue is full the eddy
        blocks until it has room (the clock jumps; every server drains meanwhile). Returns
        the virtual time waited (0.0 when there was room)."""
        clock = self.clock
        wait = 0.0
        f = self.full_until[op]
        if f > clock and f != _INF:
            wait = f - clock
            clock = f
            self.waited += wait
        self.clock = clock + self._per_route
        rec = self._ops[op]
        pending = rec[3] + 1
        rec[3] = pending
        slack = (self.capacity - pending) * rec[1]
        self.full_until[op] = rec[0] - slack if slack >= 0.0 else _INF
        return wait

    def update(self, op: int, work: float) -> QueueModel:
        """``op`` finished one input tuple, spending ``work`` units: its server's busy time,
        its mean cost and (``"work"``/``"share"`` clocks) the virtual clock advance."""
        rec = self._ops[op]
        busy, cost, n, pending = rec
        if pending:
            pending -= 1
            rec[3] = pending
        clock = self.clock
        # max() is a call, 7x slower than the conditional: this runs once per routing
        busy = (busy if busy > clock else clock) + work  # noqa: FURB136
        rec[0] = busy
        cost = work if n == 0 else cost + self.smoothing * (work - cost)
        rec[1] = cost
        rec[2] = n + 1
        self.clock = clock + work * self._per_work
        slack = (self.capacity - pending) * cost
        self.full_until[op] = busy - slack if slack >= 0.0 else _INF
        return self

    def update_epoch(self, batch: Mapping[int, tuple[int, float]]) -> QueueModel:
        """A whole routing epoch at once (an eddy following a routing table reports its
        totals at the epoch's end): ``batch[op] = (tuples, work)``, the tuples ``op``
        took and the work it spent. A fluid approximation of the same tuples reported one
        by one: the epoch lasts ``dt`` (``eddy_cost`` × all its tuples under the eddy
        clock; its work × the clock's rate otherwise), arrivals are spread over it, so
        every op's backlog becomes ``max(0, backlog + work - dt)``; the mean cost moves
        as ``tuples`` EWMA steps towards the epoch's mean. No blocking: the eddy followed
        the table whatever the queues held."""
        t0 = self.clock
        routings = 0
        total = 0.0
        a = self.smoothing
        for op, (k, work) in batch.items():
            if k <= 0:
                continue
            rec = self._ops[op]
            busy = rec[0]
            rec[0] = (busy if busy > t0 else t0) + work  # noqa: FURB136 - as in update
            mean = work / k
            rec[1] = mean if rec[2] == 0 else rec[1] + (1.0 - (1.0 - a) ** k) * (
                mean - rec[1])
            rec[2] += k
            routings += k
            total += work
        self.clock = t0 + routings * self._per_route + total * self._per_work
        for op in batch:
            if op in self._ops:
                self._refresh(op)
        return self

    def get(self, op: int) -> float:
        """``op``'s backlog now, in work units (queued work not yet served)."""
        busy, cost, _, pending = self._ops[op]
        return max(0.0, busy - self.clock) + pending * cost

    def full(self, op: int) -> bool:
        """Whether ``op``'s backlog exceeds ``capacity`` tuples of its mean cost."""
        return self.full_until[op] > self.clock

    def mean_cost(self, op: int) -> float:
        """``op``'s mean work per tuple (0.0 before its first report)."""
        return self._ops[op][1]

    def backlogs(self) -> dict[int, float]:
        """Every operator's backlog now, in work units (for explain)."""
        return {op: self.get(op) for op in self._ops}

    # -- checkpoints ------------------------------------------------------------------

    def state(self) -> dict:
        """A snapshot of plain builtins (picklable; shares nothing with the model)."""
        return {"capacity": self.capacity, "clock_kind": self.clock_kind,
                "eddy_cost": self.eddy_cost, "smoothing": self.smoothing,
                "clock": self.clock, "waited": self.waited,
                "ops": {op: tuple(rec) for op, rec in self._ops.items()}}

    @classmethod
    def from_state(cls, d: dict) -> QueueModel:
        """The model ``d`` was taken from, continuing identically."""
        q = cls(d["capacity"], clock=d["clock_kind"], eddy_cost=d["eddy_cost"],
                smoothing=d["smoothing"])
        q.clock = d["clock"]
        q.waited = d["waited"]
        for op, rec in d["ops"].items():
            q._ops[op] = list(rec)
            q._refresh(op)
        q._rates()
        return q
