"""The two interfaces between a running query and what plugs into it, as typed protocols
(a-caching.txt Figure 4: the *Executor*, and the *Re-optimizer* that reads the
*Profiler*'s statistics and changes the executor's plan).

* :class:`Executor` — what :class:`~adaptcq.engine.continuous.ContinuousQuery` calls on
  every join executor (MJoin, XJoin): updates, output, checkpoints, state size.
* :class:`AdaptiveExecutor` — an executor a policy can profile and re-order (MJoin):
  ``profile_insert`` gives one :class:`~adaptcq.engine.interp.Observation` per profiled
  insertion, ``set_order`` changes a pipeline between two updates.
* :class:`CachingExecutor` — an adaptive executor with join-subresult caches (MJoin,
  a-caching.txt §3.2): the mechanism A-Caching moves.
* :class:`Policy` — an adaptive policy (``adapt/``): A-Greedy, the initial plan,
  A-Caching, or the Profiler itself attached to only observe.

The protocols are ``runtime_checkable``; :func:`missing` names what an object lacks (an
``isinstance`` check only says yes or no), so ``ContinuousQuery.attach`` can refuse with a
message naming the missing hooks. Nothing here imports ``adapt/``, ``runtime/`` or
``optimizer/``: the engine defines the interfaces, the layers above implement them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from adaptcq.engine.interp import Observation
from adaptcq.query.logical import LogicalQuery


@runtime_checkable
class Executor(Protocol):
    """A join executor run by ``ContinuousQuery``: one SteM per stream, in the query's
    FROM order (stream index i is ``query.aliases[i]``)."""

    name: str
    query: LogicalQuery
    stems: Sequence[Any]
    #: Per stream i, ``inserts[i](rid, row, ts)`` and ``deletes[i](rid, ts)``: the same as
    #: ``insert(i, ...)`` and ``delete(i, ...)``, one call less (the update loop's hot path).
    #: The lists are updated in place when the plan changes.
    inserts: Sequence[Callable[[int, tuple, Any], None]]
    deletes: Sequence[Callable[[int, Any], None]]

    def insert(self, i: int, rid: int, row: tuple, ts) -> None:
        """Process the insertion of ``row`` (row id ``rid``) into stream i at time ``ts``
        to completion, emitting its results, then store the row."""

    def delete(self, i: int, rid: int, ts) -> None:
        """Process the deletion of stream i's row ``rid`` to completion."""

    def set_emit(self, emit: Callable[[tuple], None]) -> None:
        """Where result tuples ``(*select values, sign, ts)`` go."""

    def plan_state(self) -> dict:
        """The plan as executor keyword options (orders, tree...), for checkpoints."""

    def load(self, i: int, rows: Mapping[int, tuple],
             times: Mapping[int, Any] | None = None) -> None:
        """Restore stream i's window contents (row id -> row, row id -> event time)
        without producing output."""

    def state_tuples(self) -> int:
        """Tuples held in state (SteMs, subresults)."""

    def state_bytes(self) -> int:
        """Approximate bytes held in state."""

    def describe(self) -> str:
        """The current plan, one line per pipeline."""


@runtime_checkable
class AdaptiveExecutor(Executor, Protocol):
    """An executor a policy can profile and re-order (MJoin, a-caching.txt §3.1)."""

    orders: Mapping[str, Sequence[str]]

    def profile_insert(self, i: int, rid: int, row: tuple, ts,
                       fanouts: bool = True) -> Observation:
        """Process an insertion exactly as ``insert`` would (same output, same state), and
        measure it per operator: tuples, work units, and with ``fanouts`` the conditional
        fan-out of every stream not yet joined (a-caching.txt Appendix A)."""

    def set_order(self, stream: str, order: Sequence[str]) -> None:
        """Re-order ``stream``'s pipeline; valid between any two updates."""


@runtime_checkable
class CachingExecutor(AdaptiveExecutor, Protocol):
    """An adaptive executor with join-subresult caches (a-caching.txt §3.2, §6)."""

    placements: Mapping[str, Sequence[tuple]]

    def place_cache(self, pipeline: str, start: int, end: int,
                    extra: frozenset[str] | set[str] = frozenset(),
                    buckets: int = 1024) -> Any:
        """Use a cache over operators ``start``..``end`` (1-based) of ``pipeline``; returns
        the cache. Raises ValueError when the placement is not valid for the orders."""

    def drop_cache(self, pipeline: str, cache: Any) -> None:
        """Stop using ``cache`` in ``pipeline``."""

    def resize_cache(self, cache: Any, buckets: int) -> None:
        """Change a cache's bucket count."""

    def observe_probes(self, watches: Iterable[tuple]) -> None:
        """For each (pipeline, start, key, fn): call fn(u) with the cache key u of every
        tuple reaching operator ``start`` of ``pipeline`` (a candidate's probe stream)."""

    def clear_observers(self) -> None:
        """Remove every probe observer."""


@runtime_checkable
class Policy(Protocol):
    """An adaptive policy attached to a running query (``ContinuousQuery.attach``).

    The query owns **one Profiler** (``cq.profiler``, ``stats.profiler``) and feeds it every
    profiled observation exactly once and one tick per interval, *before* the policies'
    hooks run: a policy reads its statistics there and never feeds them itself.

    Attributes (read by the query on every scheduling decision, so they may change):

    * ``sample_probability`` — p: the rate at which the policy wants insertions profiled
      (0 stops asking; the query samples with the maximum over its policies);
    * ``needs_fanouts`` — whether observations must carry conditional fan-outs (they cost
      one extra probe per remaining stream and level);
    * ``interval`` — arrivals between ticks (None: no ticks wanted); the query ticks at the
      smallest interval of its policies;
    * ``W`` — the number of recent observations every estimate averages (a-caching.txt
      Table 1), or None for no preference: the query's profiler has one W, and a policy
      whose W differs is refused;
    * ``seed`` — seeds the query's sampling when this is the first policy attached.

    Hooks:

    * ``stream_probability(i)`` — p_i of pipeline i (Appendix A), at most
      ``sample_probability``;
    * ``bind(profiler)`` — called once by ``attach``, before any other hook, with the
      query's profiler (already following the executor);
    * ``on_profile(cq, obs, ts)`` — a profiled insertion's Observation (ts: seconds of
      event time);
    * ``on_interval(cq, ts)`` — a tick;
    * ``report()`` — a JSON-serialisable dict of what the policy did (merged into a run's
      statistics).

    A policy changes the plan only through the executor's narrow interface
    (:class:`AdaptiveExecutor`, :class:`CachingExecutor`).
    """

    sample_probability: float
    needs_fanouts: bool
    interval: int | None
    W: int | None
    seed: int

    def stream_probability(self, i: int) -> float: ...

    def bind(self, profiler: Any) -> None: ...

    def on_profile(self, cq: Any, obs: Observation, ts: float) -> None: ...

    def on_interval(self, cq: Any, ts: float) -> None: ...

    def report(self) -> dict: ...


def members(protocol: type) -> tuple[str, ...]:
    """The attributes and methods ``protocol`` requires (its own and inherited ones), in
    the order they are declared."""
    out: list[str] = []
    for cls in reversed(protocol.__mro__):
        if cls is object or cls is Protocol or getattr(cls, "_is_protocol", False) is False:
            continue
        for name in (*getattr(cls, "__annotations__", {}), *vars(cls)):
            if not name.startswith("_") and name not in out:
                out.append(name)
    return tuple(out)


def missing(obj: object, protocol: type) -> list[str]:
    """The members of ``protocol`` that ``obj`` lacks (empty when it conforms): what
    ``isinstance(obj, protocol)`` checks, with names."""
    return [name for name in members(protocol) if not hasattr(obj, name)]
