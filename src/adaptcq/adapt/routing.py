"""Routing policies of the CACQ eddy (cacq.txt §3.1.1, §4, §4.1–4.2).

One eddy routes every tuple among the operators shared by many continuous queries
(grouped filters and SteMs). The eddy *mechanism* (``engine.eddy``) keeps each tuple's
ready/done bits and asks a policy here which ready operator takes the tuple next; it
reports back what each operator did. Policies never touch tuples or operators: they keep
tickets (statistics of their own) and read the queue estimate of ``stats.queues``.

The protocol (:class:`RoutingPolicy`), called by the eddy once per routing decision:

* ``choose(ready)`` → one of ``ready`` (op ids, non-empty, in the eddy's order);
* ``routed(op, weight)`` — the eddy gave ``op`` one tuple (``weight`` = the number of
  predicates, i.e. query clauses, ``op`` applies);
* ``returned(op, n, weight, work)`` — for that tuple ``op`` handed ``n`` tuples back (0:
  dropped for every query; > 1: a SteM's join results) and spent ``work`` work units;
* ``add_op`` / ``remove_op`` as queries are registered and removed (§3.2.1);
* ``tickets()``, ``state()`` / ``from_state()``, and ``route_table(groups)``;
* ``account(batch)`` — an epoch's totals per operator at once, for an eddy following a
  :class:`RoutingTable` (instead of ``routed``/``returned`` per tuple).

The policies (``make_routing(name, seed=..., **options)``):

* ``random`` — uniform among the ready operators (§4.1's "random scheme").
* ``fixed`` — a priority order (``order``; default ascending op id): the first ready one.
* ``lottery`` — the original eddies' ticket scheme (Avnur and Hellerstein, SIGMOD 2000,
  ref. [1] of cacq.txt, as §4 recounts it): +1 ticket when an operator consumes a tuple,
  −1 per tuple it returns, and a lottery among the ready operators with chances
  proportional to tickets. Tickets never fall below 1, so every operator keeps a chance.
* ``tickets`` — CACQ's variant (§4): an operator gains ``weight`` tickets per tuple it
  consumes and loses ``weight`` per tuple it returns, never below one: "we favor
  low-selectivity via tickets and quick work via back pressure. We weight the value of
  that work by the number of predicates applied by each operator."

Both lotteries take ``decay`` (default 1.0: none) and ``decay_every`` (default 1000
routings): every ``decay_every`` routings all tickets are multiplied by ``decay`` (floor
1), so old evidence fades and a newly added or newly selective operator can overtake an
incumbent (§4.2, Figure 9). Without decay tickets grow without bound with the selective
operators' gains, and a new operator needs about as many routings as the incumbent has
seen to catch up.

**Back-pressure** (§4: "limits the size of the input queues of operators, capping the rate
at which the eddy can route tuples to slow operators"): with ``backpressure=True``
(the default of ``lottery`` and ``tickets``; available to ``random`` and ``fixed``) an
operator whose estimated input queue is full (``stats.queues.QueueModel``) is skipped unless
every ready operator is full; then the choice is made among all of them and the model has
the eddy wait for room. Options ``queue_capacity``, ``queue_clock``, ``eddy_cost``,
``cost_smoothing`` configure the model (only with back-pressure on). With the default
``"eddy"`` clock it diverts tuples from slow operators and leaves cheap filters in ticket
order; it balances load rather than minimising work, so in a single-threaded engine it
can cost work in joins (measured in docs/cacq-routing.md).

Everything is deterministic for a given ``seed``: one ``random.Random`` per policy, drawn
only when there is a choice (never for a single ready operator), whose state is part of
``state()``. docs/cacq-routing.md has the defaults, the measured throughput and the
trade-off of :class:`RoutingTable`.
"""

from __future__ import annotations

import math
import random
import sys
from collections.abc import Hashable, Iterator, Mapping, Sequence
from typing import Protocol, Self, runtime_checkable

from adaptcq.checks import is_finite, is_int
from adaptcq.errors import OptionError
from adaptcq.stats.queues import (
    CAPACITY_DEFAULT,
    CLOCK_DEFAULT,
    CLOCKS,
    EDDY_COST_DEFAULT,
    SMOOTHING_DEFAULT,
    QueueModel,
)

#: The policies ``make_routing`` builds.
ROUTINGS = ("random", "fixed", "lottery", "tickets")
#: Ticket decay: multiply all tickets by DECAY every DECAY_EVERY routings (1.0: none).
DECAY_DEFAULT = 1.0
DECAY_EVERY_DEFAULT = 1000

_QUEUE_OPTIONS = ("queue_capacity", "queue_clock", "eddy_cost", "cost_smoothing")
#: The options each policy accepts (any other is an OptionError naming these).
OPTIONS: dict[str, tuple[str, ...]] = {
    "random": ("seed", "backpressure", *_QUEUE_OPTIONS),
    "fixed": ("seed", "order", "backpressure", *_QUEUE_OPTIONS),
    "lottery": ("seed", "backpressure", *_QUEUE_OPTIONS, "decay", "decay_every"),
    "tickets": ("seed", "backpressure", *_QUEUE_OPTIONS, "decay", "decay_every"),
}


@runtime_checkable
class RoutingPolicy(Protocol):
    """What the eddy calls (module docstring). Op ids are small non-negative ints, stable
    while the operator exists; every op passed to ``choose``/``routed``/``returned`` must
    have been added with ``add_op`` and not removed."""

    name: str

    def choose(self, ready: Sequence[int]) -> int: ...

    def routed(self, op: int, weight: int) -> None: ...

    def returned(self, op: int, n: int, weight: int, work: float) -> None: ...

    def add_op(self, op: int) -> None: ...

    def remove_op(self, op: int) -> None: ...

    def tickets(self) -> dict[int, float]: ...

    def state(self) -> dict: ...

    @classmethod
    def from_state(cls, d: dict) -> Self: ...


class RoutingTable(Mapping):
    """A routing table written by a policy and sampled by the mechanism.

    ``policy.route_table(groups)`` maps each key of ``groups`` (e.g. a virtual source id)
    to an order of its operators, drawn from the policy's current state: for the
    lotteries, a lottery *without replacement* on the current tickets; operators whose
    queue is full (with back-pressure) come after all the others. The eddy can then route
    a whole epoch of tuples (say 1000) by the order — ``table.choose(key, ready)``, the
    first ready operator in it — and ask for a fresh table at the next epoch, reporting
    what the operators did (``routed``/``returned`` per tuple, or ``policy.account`` with
    the epoch's totals) so the tickets and queues keep learning.

    Trade-off (docs/cacq-routing.md): one lottery per key per epoch instead of one per
    routing decision, and a routing step that is a dict lookup per ready operator; but
    within an epoch every tuple of a key follows one order, so the policy reacts to new
    selectivities and to full queues only at epoch boundaries (coarser adaptivity: a
    per-tuple lottery also spreads tuples over operators in proportion to tickets, a
    table sends the whole epoch one way, chosen with those proportions).
    """

    __slots__ = ("_orders", "_ranks")

    def __init__(self, orders: Mapping[Hashable, Sequence[int]]):
        self._orders = {k: tuple(v) for k, v in orders.items()}
        self._ranks = {k: {op: i for i, op in enumerate(v)} for k, v in self._orders.items()}

    def __getitem__(self, key: Hashable) -> tuple[int, ...]:
        return self._orders[key]

    def __iter__(self) -> Iterator[Hashable]:
        return iter(self._orders)

    def __len__(self) -> int:
        return len(self._orders)

    def rank(self, key: Hashable) -> Mapping[int, int]:
        """op -> its position in ``key``'s order (for an eddy keeping its own loop)."""
        return self._ranks[key]

    def choose(self, key: Hashable, ready: Sequence[int]) -> int:
        """The first operator of ``key``'s order that is in ``ready`` (ready operators
        missing from the order come after, in ``ready``'s order)."""
        rank = self._ranks[key]
        big = len(rank)
        if len(ready) == 2:  # no loop for the common case
            x, y = ready
            return y if rank.get(y, big) < rank.get(x, big) else x
        best = ready[0]
        best_rank = rank.get(best, big)
        for op in ready:
            r = rank.get(op, big)
            if r < best_rank:
                best, best_rank = op, r
        return best

    def __repr__(self) -> str:
        return f"RoutingTable({self._orders!r})"


# -- option checking -------------------------------------------------------------------


def _bad(option: str, value, wanted: str) -> OptionError:
    return OptionError(f"routing option {option} must be {wanted}, got {value!r}")


# -- the policies ------------------------------------------------------------------------

class _Routing:
    """Shared by every policy: the live operators, the seeded RNG, the optional queue
    model, options, checkpoints and routing tables. Subclasses write the hot path."""

    __slots__ = ("_admit", "_ops", "_options", "_q", "_random", "_rng", "_update", "seed")
    name = ""
    _BACKPRESSURE_DEFAULT = False

    def __init__(self, *, seed: int = 0, backpressure: bool | None = None,
                 queue_capacity: float | None = None, queue_clock: str | None = None,
                 eddy_cost: float | None = None, cost_smoothing: float | None = None):
        if not is_int(seed):
            raise _bad("seed", seed, "an int")
        bp = self._BACKPRESSURE_DEFAULT if backpressure is None else backpressure
        if not isinstance(bp, bool):
            raise _bad("backpressure", backpressure, "True or False")
        given = {k: v for k, v in (("queue_capacity", queue_capacity),
                                   ("queue_clock", queue_clock), ("eddy_cost", eddy_cost),
                                   ("cost_smoothing", cost_smoothing)) if v is not None}
        # Options that do not apply are refused, never ignored (the project's rule).
        if given and not bp:
            raise OptionError(f"routing option{'s' if len(given) > 1 else ''} "
                              f"{', '.join(given)} appl{'y' if len(given) > 1 else 'ies'} "
                              f"only with backpressure=True")
        self.seed = seed
        self._rng = random.Random(seed)
        self._random = self._rng.random  # bound once: one attribute load on the hot path
        self._ops: dict[int, None] = {}  # live operators, in order of addition
        self._options: dict = {"backpressure": bp}
        self._q: QueueModel | None = None
        self._admit = self._update = None  # the model's admit/update, bound once
        if bp:
            capacity = given.get("queue_capacity", CAPACITY_DEFAULT)
            # (the model computes in floats: an int past float's range is refused here)
            if not is_finite(capacity) or not 0 < capacity <= sys.float_info.max:
                raise _bad("queue_capacity", capacity, "a positive number of tuples")
            clock = given.get("queue_clock", CLOCK_DEFAULT)
            if clock not in CLOCKS:
                raise _bad("queue_clock", clock, f"one of {', '.join(CLOCKS)}")
            if "eddy_cost" in given and clock != "eddy":
                raise OptionError("routing option eddy_cost applies only with "
                                  "queue_clock='eddy'")
            cost = given.get("eddy_cost", EDDY_COST_DEFAULT)
            if not is_finite(cost) or not 0 < cost <= sys.float_info.max:
                raise _bad("eddy_cost", cost, "a positive number of work units")
            smoothing = given.get("cost_smoothing", SMOOTHING_DEFAULT)
            if not is_finite(smoothing) or not 0 < smoothing <= 1:
                raise _bad("cost_smoothing", smoothing, "a number in (0, 1]")
            self._set_queues(QueueModel(capacity, clock=clock, eddy_cost=cost,
                                        smoothing=smoothing))
            self._options.update(queue_capacity=capacity, queue_clock=clock,
                                 cost_smoothing=smoothing)
            if clock == "eddy":
                self._options["eddy_cost"] = cost

    def _set_queues(self, q: QueueModel) -> None:
        self._q = q
        self._admit = q.admit
        self._update = q.update

    # -- operators ---------------------------------------------------------------------

    def add_op(self, op: int) -> None:
        """Register ``op`` (idempotent; a re-added op id starts afresh only if it was
        removed)."""
        if not is_int(op) or op < 0:
            raise ValueError(f"op ids are non-negative ints, got {op!r}")
        if op in self._ops:
            return
        self._ops[op] = None
        if self._q is not None:
            self._q.add(op)
        self._added(op)

    def remove_op(self, op: int) -> None:
        """Forget ``op`` (no-op if unknown)."""
        if op not in self._ops:
            return
        del self._ops[op]
        if self._q is not None:
            self._q.remove(op)
        self._removed(op)

    def _added(self, op: int) -> None:
        pass

    def _removed(self, op: int) -> None:
        pass

    @property
    def ops(self) -> tuple[int, ...]:
        """The live operators, in order of addition."""
        return tuple(self._ops)

    @property
    def queues(self) -> QueueModel | None:
        """The queue model (None without back-pressure): backlogs, clock, waits."""
        return self._q

    # -- the hot path (subclasses) -----------------------------------------------------

    def choose(self, ready: Sequence[int]) -> int:
        raise NotImplementedError

    def routed(self, op: int, weight: int) -> None:
        admit = self._admit
        if admit is not None:
            admit(op)

    def returned(self, op: int, n: int, weight: int, work: float) -> None:
        update = self._update
        if update is not None:
            update(op, work)

    def account(self, batch: Mapping[int, tuple[int, int, float, float]]) -> None:
        """The batch form of ``routed`` + ``returned`` for a routing epoch (an eddy
        following a :class:`RoutingTable` and reporting totals at the epoch's end):
        ``batch[op] = (consumed, returned, weight, work)`` — ``op`` consumed ``consumed``
        tuples applying ``weight`` predicates each, handed ``returned`` tuples back in all
        and spent ``work`` units. Tickets change by the epoch's net gain, floored at one
        once (per-tuple reports floor after every tuple, so an op whose tickets would dip
        below one mid-epoch ends a little lower here); the decay counter advances by the
        tuples consumed; the queue model takes the epoch at once
        (``QueueModel.update_epoch``)."""
        self._account_tickets(batch)
        q = self._q
        if q is not None:
            q.update_epoch({op: (b[0], b[3]) for op, b in batch.items()})

    def _account_tickets(self, batch) -> None:
        pass

    def _free(self, ready: Sequence[int]) -> Sequence[int]:
        """The ready operators whose queue is not full, or all of them if every one is."""
        q = self._q
        if q is None:
            return ready
        fu = q.full_until
        now = q.clock
        free = [op for op in ready if fu[op] <= now]
        return free if free else ready

    # -- reading ---------------------------------------------------------------------------

    def tickets(self) -> dict[int, float]:
        raise NotImplementedError

    def options(self) -> dict:
        """The options in force (defaults filled in), as ``make_routing`` takes them."""
        return {"seed": self.seed, **self._options}

    def report(self) -> dict:
        """A JSON-serialisable summary for explain: options, tickets, and with
        back-pressure the virtual clock, the time blocked and every backlog."""
        out: dict = {"routing": self.name, "options": self.options(),
                     "tickets": {str(op): t for op, t in self.tickets().items()}}
        q = self._q
        if q is not None:
            out["queues"] = {"clock": q.clock, "waited": q.waited,
                             "backlog": {str(op): b for op, b in q.backlogs().items()},
                             "full": [op for op in self._ops if q.full(op)]}
        return out

    # -- routing tables ------------------------------------------------------------------

    def route_table(self, groups: Mapping[Hashable, Sequence[int]]) -> RoutingTable:
        """A :class:`RoutingTable`: per key of ``groups``, an order of its operators drawn
        from the current state (operators with a full queue last, under back-pressure).
        Draws from the policy's RNG (deterministic), changes no tickets."""
        q = self._q
        orders = {}
        for key, ops in groups.items():
            ops = list(dict.fromkeys(ops))
            if q is None:
                orders[key] = self._order(ops)
            else:
                free = [op for op in ops if not q.full(op)]
                full = [op for op in ops if q.full(op)]
                orders[key] = self._order(free) + self._order(full)
        return RoutingTable(orders)

    def _order(self, ops: list[int]) -> list[int]:
        raise NotImplementedError

    # -- checkpoints -----------------------------------------------------------------------

    def state(self) -> dict:
        """A picklable snapshot (plain builtins, sharing nothing with the policy): options,
        live operators, RNG state, tickets, queue model."""
        d = {"name": self.name, "options": self.options(), "ops": list(self._ops),
             "rng": self._rng.getstate(),
             "queues": None if self._q is None else self._q.state()}
        self._save(d)
        return d

    def _save(self, d: dict) -> None:
        pass

    def _load(self, d: dict) -> None:
        pass

    @classmethod
    def from_state(cls, d: dict) -> Self:
        """The policy ``d`` was taken from; its future choices are the same as the
        original's would have been. Called on the base class or any policy class, it
        builds the class named in ``d`` (which must be ``cls`` or a subclass)."""
        klass = _CLASSES.get(d.get("name"))
        if klass is None or not issubclass(klass, cls):
            raise OptionError(f"a state of routing policy {d.get('name')!r} cannot be "
                              f"restored as {cls.__name__}")
        pol = klass(**d["options"])
        for op in d["ops"]:
            pol.add_op(op)
        pol._rng.setstate(d["rng"])
        if d["queues"] is not None:
            pol._set_queues(QueueModel.from_state(d["queues"]))
        pol._load(d)
        return pol

    def __reduce__(self):
        # Pickling a policy pickles its state (the cached bound method is not picklable).
        return restore_routing, (self.state(),)

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={v!r}" for k, v in self.options().items())
        return f"make_routing({self.name!r}, {opts})"


class RandomRouting(_Routing):
    """``random``: each ready operator with equal chance (cacq.txt §4.1's random scheme);
    with back-pressure, among those whose queue is not full."""

    __slots__ = ()
    name = "random"

    def choose(self, ready: Sequence[int]) -> int:
        if len(ready) == 1:
            return ready[0]  # no draw: the RNG only advances when there is a choice
        if self._q is not None:
            ready = self._free(ready)
        return ready[int(self._random() * len(ready))]

    def tickets(self) -> dict[int, float]:
        return {op: 1.0 for op in self._ops}

    def _order(self, ops: list[int]) -> list[int]:
        rnd = self._random
        for i in range(len(ops) - 1, 0, -1):  # Fisher-Yates on the policy's RNG
            j = int(rnd() * (i + 1))
            ops[i], ops[j] = ops[j], ops[i]
        return ops


class FixedRouting(_Routing):
    """``fixed``: a priority order, the first ready operator in it (a static plan, the
    baseline of §4.1). ``order`` lists op ids; operators not in it rank after all listed
    ones, by ascending id. Default: ascending op id. With back-pressure, the first ready
    operator whose queue is not full."""

    __slots__ = ("_order_given", "_rank")
    name = "fixed"

    def __init__(self, *, order: Sequence[int] | None = None, **kw):
        if order is not None:
            if isinstance(order, (str, bytes)) or not isinstance(order, Sequence):
                raise _bad("order", order, "a sequence of op ids")
            order = tuple(order)
            if not all(is_int(op) and op >= 0 for op in order):
                raise _bad("order", order, "a sequence of non-negative int op ids")
            if len(set(order)) != len(order):
                raise _bad("order", order, "a sequence of distinct op ids")
        super().__init__(**kw)
        self._order_given = order
        self._options["order"] = order
        self._rank: dict[int, int] = {}

    def _added(self, op: int) -> None:
        order = self._order_given
        if order is None:
            self._rank[op] = op
        else:
            try:
                self._rank[op] = order.index(op)
            except ValueError:
                self._rank[op] = len(order) + op  # after every listed op, by ascending id

    def _removed(self, op: int) -> None:
        del self._rank[op]

    def choose(self, ready: Sequence[int]) -> int:
        if self._q is not None:
            ready = self._free(ready)
        rank = self._rank
        if len(ready) == 2:  # no loop for the common case
            x, y = ready
            return x if rank[x] < rank[y] else y
        best = ready[0]
        best_rank = rank[best]
        for op in ready:
            r = rank[op]
            if r < best_rank:
                best, best_rank = op, r
        return best

    def tickets(self) -> dict[int, float]:
        """Priorities: the first operator of the order has n, the last 1."""
        ranked = sorted(self._ops, key=self._rank.__getitem__)
        n = len(ranked)
        return {op: float(n - i) for i, op in enumerate(ranked)}

    def _order(self, ops: list[int]) -> list[int]:
        return sorted(ops, key=self._rank.__getitem__)


class LotteryRouting(_Routing):
    """``lottery``: the original eddies' ticket scheme (cacq.txt §4, ref. [1]): +1 ticket
    per tuple consumed, −1 per tuple returned, floor 1; a lottery among the ready
    operators (under back-pressure, those with room) with chances proportional to tickets.
    ``decay``/``decay_every``: module docstring."""

    __slots__ = ("_decay", "_every", "_since", "_t")
    name = "lottery"
    _BACKPRESSURE_DEFAULT = True

    def __init__(self, *, decay: float = DECAY_DEFAULT,
                 decay_every: int = DECAY_EVERY_DEFAULT, **kw):
        if not is_finite(decay) or not 0 < decay <= 1:
            raise _bad("decay", decay, "a number in (0, 1] (1: no decay)")
        if not is_int(decay_every) or decay_every < 1:
            raise _bad("decay_every", decay_every, "a positive int (routings)")
        super().__init__(**kw)
        self._decay = float(decay)
        # With no decay the counter never reaches its bound: no branch taken, no work.
        self._every = decay_every if decay < 1 else math.inf
        self._since = 0  # routings since the last decay
        self._t: dict[int, float] = {}
        self._options.update(decay=decay, decay_every=decay_every)

    def _added(self, op: int) -> None:
        self._t[op] = 1.0  # a new operator starts at the floor (Figure 9: it has none yet)

    def _removed(self, op: int) -> None:
        del self._t[op]

    def choose(self, ready: Sequence[int]) -> int:
        k = len(ready)
        if k == 1:
            return ready[0]  # no draw: the RNG never advances for a single ready operator
        t = self._t
        q = self._q
        if k == 2:
            # The most common case (a filter and a SteM, two SteMs) without loops: 2x faster.
            x, y = ready
            if q is not None:
                now = q.clock
                fx = q.full_until[x] > now
                if fx != (q.full_until[y] > now):
                    return y if fx else x  # back-pressure: the one with room
            tx = t[x]
            return x if self._random() * (tx + t[y]) < tx else y
        if q is not None:
            # Back-pressure: the lottery is among the operators with room; tickets >= 1,
            # so a zero total means every ready operator is full: draw among all of them.
            fu = q.full_until
            now = q.clock
            total = 0.0
            for op in ready:
                if fu[op] <= now:
                    total += t[op]
            if total:
                r = self._random() * total
                last = ready[0]
                for op in ready:
                    if fu[op] <= now:
                        last = op
                        r -= t[op]
                        if r < 0.0:
                            return op
                return last  # rounding left r >= 0: the last eligible operator
        total = 0.0
        for op in ready:
            total += t[op]
        r = self._random() * total
        for op in ready:
            r -= t[op]
            if r < 0.0:
                return op
        return ready[-1]

    def routed(self, op: int, weight: int) -> None:
        self._t[op] += 1.0
        admit = self._admit
        if admit is not None:
            admit(op)
        n = self._since + 1
        if n >= self._every:
            self._decay_all()
            n = 0
        self._since = n

    def returned(self, op: int, n: int, weight: int, work: float) -> None:
        t = self._t
        v = t[op] - n
        t[op] = v if v > 1.0 else 1.0  # noqa: FURB136 - max() costs 7x on the hot path
        update = self._update
        if update is not None:
            update(op, work)

    def _gain(self, consumed: int, returned: int, weight: float) -> float:
        return consumed - returned  # +1 per tuple consumed, -1 per tuple returned

    def _account_tickets(self, batch) -> None:
        t = self._t
        consumed = 0
        for op, (c, n, w, _) in batch.items():
            v = t[op] + self._gain(c, n, w)
            t[op] = v if v > 1.0 else 1.0  # noqa: FURB136 - as in returned
            consumed += c
        since = self._since + consumed
        while since >= self._every:  # once per decay_every routings crossed
            self._decay_all()
            since -= self._every
        self._since = since

    def _decay_all(self) -> None:
        d = self._decay
        t = self._t
        for op, v in t.items():
            v *= d
            t[op] = v if v > 1.0 else 1.0  # noqa: FURB136 - max() costs 7x on the hot path

    def tickets(self) -> dict[int, float]:
        return dict(self._t)

    def _order(self, ops: list[int]) -> list[int]:
        # Lottery without replacement: each position drawn among the operators left,
        # with chances proportional to their tickets.
        out: list[int] = []
        w = [self._t[op] for op in ops]
        while len(ops) > 1:
            r = self._random() * sum(w)
            i = 0
            for i, x in enumerate(w):
                r -= x
                if r < 0.0:
                    break
            out.append(ops.pop(i))
            w.pop(i)
        return out + ops

    def _save(self, d: dict) -> None:
        d["tickets"] = dict(self._t)
        d["since_decay"] = self._since

    def _load(self, d: dict) -> None:
        self._t = dict(d["tickets"])
        self._since = d["since_decay"]


class TicketRouting(LotteryRouting):
    """``tickets``: CACQ's variant (cacq.txt §4): "a grouped-filter or SteM is given a
    number of tickets equal to the number of predicates it applies, and penalized a number
    of tickets equal to the number of predicates it applies when it returns a tuple back
    to the eddy ... we lower bound the number of tickets any module receives at one." So a
    selective operator applying many queries' predicates wins (§4.2, Table 4 workload 2),
    and SteMs, which return at least as many tuples as they consume, stay near one ticket
    and are ordered by back-pressure."""

    __slots__ = ()
    name = "tickets"

    def _gain(self, consumed: int, returned: int, weight: float) -> float:
        return weight * (consumed - returned)

    def routed(self, op: int, weight: int) -> None:
        self._t[op] += weight
        admit = self._admit
        if admit is not None:
            admit(op)
        n = self._since + 1
        if n >= self._every:
            self._decay_all()
            n = 0
        self._since = n

    def returned(self, op: int, n: int, weight: int, work: float) -> None:
        t = self._t
        v = t[op] - weight * n
        t[op] = v if v > 1.0 else 1.0  # noqa: FURB136 - max() costs 7x on the hot path
        update = self._update
        if update is not None:
            update(op, work)


_CLASSES: dict[str, type[_Routing]] = {
    "random": RandomRouting, "fixed": FixedRouting, "lottery": LotteryRouting,
    "tickets": TicketRouting}


def make_routing(name: str, *, seed: int = 0, **params) -> RoutingPolicy:
    """The routing policy ``name`` (one of :data:`ROUTINGS`) with ``seed`` and
    ``params`` (:data:`OPTIONS` lists each policy's; defaults in docs/cacq-routing.md).
    An unknown name or option, an option that does not apply (a queue option without
    back-pressure) or a bad value is an :class:`OptionError` naming it and what is
    accepted."""
    if not isinstance(name, str) or name not in _CLASSES:
        raise OptionError(f"unknown routing policy {name!r}; choose one of "
                          f"{', '.join(ROUTINGS)}")
    accepted = OPTIONS[name]
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise OptionError(f"unknown option{'s' if len(unknown) > 1 else ''} "
                          f"{', '.join(unknown)} for the {name} routing policy; its options "
                          f"are: {', '.join(accepted)}")
    return _CLASSES[name](seed=seed, **params)


def restore_routing(state: dict) -> RoutingPolicy:
    """The policy a ``state()`` was taken from, whatever its class."""
    return _Routing.from_state(state)
