"""State spill policies (state-spill.txt §3): which partition groups to push to disk when
memory runs out, and when to bring them back.

The four strategies are pure functions of the candidates — every partition group in
memory with its statistics (``stats/partitions.py``) — and the bytes to free; each returns
the groups to spill, in the order chosen, until their model sizes (§2.2) reach the amount:

* :func:`bottom_up` (§3.1.1): operator-level; groups of the bottom operators (furthest from
  the root) first, in random order, then the next level up.
* :func:`local_output` (§3.2.1): partition-level; the smallest local productivity
  P_output / P_size first, P_output counted at the operator itself.
* :func:`global_output` (§3.2.2): the smallest global productivity first, P_output counted
  in final results traced back through the tree (Algorithm 1).
* :func:`global_penalty` (§3.2.3): the smallest P_output / (P_size + P_inter) first, P_inter
  the bytes of subresults the group made downstream operators store.

:class:`SpillPolicy` is the controller: every ``every`` insertions (the paper's k) it reads
the tree's memory by the model, and when it exceeds the budget it asks the executor to
spill the strategy's choice, freeing ``fraction`` (f) of the budget; when memory has freed
up enough to take the spilled state back, it asks for a clean-up (beyond the paper: a
barrier between two updates; ``cleanup_when_free``). When it has not, but at least half of
what is on disk (and at least f of the budget) holds only inputs past their window, it asks
for a clean-up that writes back the merged groups memory cannot hold: a windowed run's
ended spilled state is dropped while memory stays full, so its disk, and the final
clean-up, stay about a window's state rather than growing with the run.
"""

from __future__ import annotations

import numbers
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction

from adaptcq.errors import OptionError

MAX_SAMPLES = 4096


@dataclass(frozen=True)
class Candidate:
    """A partition group in memory: operator id, partition id, distance of the operator
    from the root, model bytes (P_size), local and global P_output, P_inter in bytes."""

    op: int
    pid: int
    depth: int
    size: float
    local: float
    output: float
    inter: float


Strategy = Callable[[Sequence[Candidate], float, random.Random], list[tuple[int, int]]]


def _take(ordered: Sequence[Candidate], need: float) -> list[tuple[int, int]]:
    out, freed = [], 0.0
    for c in ordered:
        if freed >= need:
            break
        out.append((c.op, c.pid))
        freed += c.size
    return out


def bottom_up(cands: Sequence[Candidate], need: float, rng: random.Random
              ) -> list[tuple[int, int]]:
    """§3.1.1: the bottom operators' groups, each with an equal chance, then upwards."""
    ordered = []
    for depth in sorted({c.depth for c in cands}, reverse=True):
        level = sorted((c for c in cands if c.depth == depth), key=lambda c: (c.op, c.pid))
        rng.shuffle(level)
        ordered += level
    return _take(ordered, need)


def _by_productivity(key: Callable[[Candidate], float]) -> Strategy:
    def strategy(cands: Sequence[Candidate], need: float, rng: random.Random):
        return _take(sorted(cands, key=lambda c: (key(c), c.op, c.pid)), need)
    return strategy


local_output = _by_productivity(lambda c: c.local / c.size)
local_output.__doc__ = "§3.2.1: the smallest local productivity P_output / P_size first."
global_output = _by_productivity(lambda c: c.output / c.size)
global_output.__doc__ = ("§3.2.2: the smallest global productivity P_output / P_size first "
                         "(P_output traced from the final results).")
global_penalty = _by_productivity(lambda c: c.output / (c.size + c.inter))
global_penalty.__doc__ = ("§3.2.3: the smallest P_output / (P_size + P_inter) first "
                          "(P_inter: bytes of the subresults it made others store).")

STRATEGIES: dict[str, Strategy] = {
    "bottom-up": bottom_up,
    "local-output": local_output,
    "global-output": global_output,
    "global-penalty": global_penalty,
}


_SIZE = re.compile(r"([+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)([a-zA-Z]*)")
_UNITS = {"": 1, "b": 1}
for _k, _p in enumerate("kmgtpe", 1):  # k, kb: 10**3 ... eb: 10**18; kib ... eib: 2**10k
    _UNITS.update({_p: 10**(3 * _k), _p + "b": 10**(3 * _k), _p + "ib": 2**(10 * _k)})
del _UNITS["e"], _k, _p  # ("1e" is no size: an E alone reads as an exponent's)
MAX_BYTES = 2**63 - 1
"""The largest budget (8 EiB less a byte): sizes are int64 counts."""


def parse_bytes(text: str | int) -> int:
    """``512MB``, ``1.5GiB``, ``2TB``, ``64k``, ``1000000`` -> bytes (decimal units for
    k/kB, M/MB, G/GB, T/TB, P/PB, EB; binary for KiB ... EiB; any case), rounded down: at
    least 1 byte and at most :data:`MAX_BYTES`. ``inf``, ``nan`` and words are no sizes."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = Fraction(text)
    else:
        s = str(text).strip().replace(" ", "")
        m = _SIZE.fullmatch(s)
        if m is None or m.group(2).lower() not in _UNITS:
            raise OptionError(f"--memory {text!r}: expected a size such as 512MB, 2GiB, 1TB "
                              "or 1000000 (bytes)")
        value = Fraction(m.group(1)) * _UNITS[m.group(2).lower()]
    if value < 1:  # (0.4 would be a budget of 0 bytes)
        raise OptionError(f"--memory must be at least 1 byte, got {text!r}")
    if value > MAX_BYTES:
        raise OptionError(f"--memory {text!r} is more than 2**63 - 1 bytes (8 EiB); give a "
                          "budget a machine could hold, e.g. 64GB")
    return int(value)


def _number(value) -> bool:
    """A real number (not a boolean, not text)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


class SpillPolicy:
    """The state spill controller (a-caching.txt Figure 4's re-optimizer, for memory).

    ``strategy``: a name of :data:`STRATEGIES`; ``budget``: bytes of state (the model of
    state-spill.txt §2.2) the tree may hold; ``fraction`` (f): a spill frees f of the
    budget; ``every`` (k): insertions between two checks; ``cleanup_when_free``: clean up
    while running once the spilled state still alive fits in (1 - f) of the budget with
    the state in memory, or, writing back what does not fit, once the spilled state past
    its window is at least the spilled state still alive and f of the budget."""

    def __init__(self, strategy: str = "global-penalty", budget: int | str = 64 * 2**20,
                 fraction: float = 0.2, every: int = 1000, seed: int = 0,
                 cleanup_when_free: bool = True):
        if strategy not in STRATEGIES:
            raise OptionError(f"unknown spill strategy {strategy!r}; choose one of "
                              f"{', '.join(STRATEGIES)}")
        # (named by the flags that set them: spill options are typed as flags)
        if not _number(fraction) or not 0 < float(fraction) <= 1:
            raise OptionError(f"--spill-fraction (the spill fraction f) must be in (0, 1], "
                              f"got {fraction!r}")
        if not isinstance(every, int) or isinstance(every, bool) or every < 1:
            raise OptionError(f"--spill-check (the memory check interval k) must be a "
                              f"positive whole number of insertions, got {every!r}")
        self.strategy_name = strategy
        self.strategy = STRATEGIES[strategy]
        self.budget = parse_bytes(budget)
        self.fraction = float(fraction)
        self.every = every
        self.cleanup_when_free = cleanup_when_free
        self.rng = random.Random(seed)
        self.samples: list[tuple[float, float]] = []   # (event time, model bytes) per check
        self._thin = 1
        self._checks = 0

    def check(self, ex, ts) -> None:
        """Called by the executor every k insertions, between two updates."""
        usage = ex.memory_usage()
        self._checks += 1
        if self._checks % self._thin == 0:
            self.samples.append((ts, usage))
            if len(self.samples) > MAX_SAMPLES:
                del self.samples[1::2]
                self._thin *= 2
        room = (1 - self.fraction) * self.budget
        if self.cleanup_when_free and ex.pending():
            live = ex.pending_live_bytes(ts)
            if usage + live <= room:
                ex.cleanup(ts)
                return
            if ex.pending_ended_bytes(ts) >= max(live, self.fraction * self.budget):
                # Most of what is on disk has ended: merge it (the late results), keep
                # what fits and write back the rest (``SpillTree.cleanup(keep=)``); then
                # spill as usual if memory is still over the budget.
                ex.cleanup(ts, keep=room)
                usage = ex.memory_usage()
        if usage > self.budget:
            cands = [Candidate(*c) for c in ex.candidates()]
            largest = max(cands, key=lambda c: c.size)
            if largest.size > self.budget:
                from adaptcq.state.spill_store import SpillError
                raise SpillError(
                    f"the memory budget ({self.budget:,} bytes) is smaller than one partition "
                    f"group (Join{largest.op}, partition {largest.pid}: {largest.size:,.0f} "
                    "bytes by the model of state-spill.txt §2.2): raise --memory or use more "
                    "partitions (--spill-partitions)")
            chosen = self.strategy(cands, usage - room, self.rng)
            ex.spill(chosen, ts)
            self.samples.append((ts, ex.memory_usage()))

    def report(self) -> dict:
        return {"spill_strategy": self.strategy_name, "memory_budget": self.budget,
                "spill_fraction": self.fraction, "spill_check_every": self.every}


# ----- the chain analysis of §3 (Figure 5) ----------------------------------------------
def chain_output(selectivities: Sequence[float], t: float) -> float:
    """Eq. 1: the results OP_n outputs for t input tuples to OP_1, u = (Π s_i) · t."""
    u = t
    for s in selectivities:
        u *= s
    return u


def chain_state_increase(selectivities: Sequence[float], t: float) -> float:
    """Eq. 2: the tuples stored along the chain for t inputs to OP_1,
    I = Σ_{i=1..n} (Π_{j<i} s_j) · t: OP_1 stores t, OP_2 t·s_1, OP_3 t·s_1·s_2, ..."""
    total, stored = 0.0, t
    for s in selectivities:
        total += stored
        stored *= s
    return total
