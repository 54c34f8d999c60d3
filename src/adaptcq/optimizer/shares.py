"""Shares (HyperCube) partitioning: how many groups each attribute class is hashed into.

Afrati and Ullman, "Optimizing joins in a map-reduce environment" (EDBT 2010), §3; Beame,
Koutris and Suciu's HyperCube algorithm. The P partition groups are the cells of a grid with
one dimension per attribute class c, of size p_c, with ∏ p_c = P. A tuple of stream s is
hashed, on every class it has, to one coordinate, and replicated over every coordinate of
the classes it lacks: it goes to ∏_{c ∌ s} p_c groups. The tuples of any result agree on
every class, so they meet in exactly one group (the cell of their hash values), and every
group runs the unchanged engine.

The cost the shares minimize is the number of tuples shipped per unit time,

    Σ_s  r_s · ∏_{c ∌ s} p_c

(Afrati–Ullman's communication cost, with the streams' rates r_s for relation sizes), over
integer shares whose product is exactly P. These are small pure functions over the classes
(each given as the set of streams it covers) and the rates; the runtime turns them into
hash columns (``runtime.spark_split``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

from adaptcq.optimizer.graph import OptimizerError

__all__ = ["MAX_GROUPS", "check_groups", "choose_shares", "divisors", "factorizations", "replication",
           "shipped"]

MAX_GROUPS = 100_000
"""The most partition groups a query is split into. A group is a run's unit of parallelism
(one engine, one grouping key), so groups beyond a cluster's cores only add per-group
overhead and replication, and the largest Spark clusters have some ten thousand cores. The
Spark runtime also places every group's grouping key in a shuffle partition of its own on
the driver (64 candidate keys per group, ``runtime.spark._group_keys``, in numpy: a tenth
of a second at this limit), and unbounded before it (``--partitions 1000000000`` never
returned)."""


def check_groups(P: int, what: str, error: type[Exception] = OptimizerError) -> None:
    """Refuse (``error``) more than MAX_GROUPS partition groups; ``what`` names them as the
    caller's user gave them (``--partitions 1,000,000,000``, the shares, ...)."""
    if P > MAX_GROUPS:
        raise error(f"{what}: at most {MAX_GROUPS:,} partition groups (a group runs on one "
                    "core at a time, and no cluster has that many; docs/spark.md)")


def divisors(P: int) -> list[int]:
    """The divisors of P >= 1, ascending, from its prime factorization (trial division up
    to √P, not P steps)."""
    out, n, p = [1], P, 2
    while p * p <= n:
        if n % p == 0:
            k = 0
            while n % p == 0:
                n //= p
                k += 1
            out = [d * p ** e for d in out for e in range(k + 1)]
        p += 1 if p == 2 else 2
    if n > 1:
        out = [d * f for d in out for f in (1, n)]
    return sorted(out)


def factorizations(P: int, k: int) -> Iterator[tuple[int, ...]]:
    """Every ordered k-tuple of positive integers whose product is P (in lexicographic
    order), taken from P's divisors: as many steps as there are tuples, not P per class."""
    if k == 0:
        if P == 1:
            yield ()
        return
    yield from _factorizations(P, k, divisors(P))


def _factorizations(P: int, k: int, divs: list[int]) -> Iterator[tuple[int, ...]]:
    if k == 1:
        yield (P,)
        return
    for d in divs:  # (the divisors of P's divisors are among P's)
        if d > P:
            break
        if P % d == 0:
            for rest in _factorizations(P // d, k - 1, divs):
                yield (d, *rest)


def replication(covers: Sequence[frozenset], shares: Sequence[int], stream) -> int:
    """How many groups a tuple of ``stream`` goes to: the product of the shares of the
    classes it lacks."""
    return math.prod(p for c, p in zip(covers, shares, strict=True) if stream not in c)


def shipped(covers: Sequence[frozenset], rates: dict, shares: Sequence[int]) -> float:
    """Tuples shipped per unit time: Σ_s r_s · ∏_{c ∌ s} p_c (Afrati–Ullman §3)."""
    return sum(r * replication(covers, shares, s) for s, r in rates.items())


def choose_shares(covers: Sequence[frozenset], rates: dict, P: int,
                  caps: Sequence[int | None] | None = None) -> tuple[int, ...]:
    """The integer shares (one per class, product P) that ship the fewest tuples.

    ``covers[c]`` is the set of streams class c has a column in; ``rates[s]`` each stream's
    arrival rate (any positive weights: only their ratios matter); ``caps[c]``, when given,
    bounds p_c (a class with d distinct values cannot use more than d groups). Ties go to
    the shares that replicate the fewest streams, then to the earliest classes holding the
    largest shares: with one class covering every stream the answer is (P, 1, …) on the
    first such class, which is the split on a key common to all streams. Costs within
    float noise of each other (a relative 1e-12) are a tie.

    Dynamic programming over the classes in order (Afrati–Ullman §3's cost is a sum of
    one term per stream, r_s · P / ∏_{c ∋ s} p_c, each over the classes covering s): the
    best shares of classes j.. depend only on the product Q left for them and, for each
    stream covered by classes on both sides of j, the product of its shares so far. So
    each such state is solved once, not once per factorization reaching it: a chain of
    ten streams (nine classes) at P = 55,440 visits 17,131 states where the enumeration
    of every factorization visited 16 million. A query whose streams each span many
    classes still has as many states as distinct such products.
    """
    if P < 1:
        raise ValueError(f"P must be at least 1, got {P}")
    check_groups(P, f"{P:,} partition groups")
    k = len(covers)
    if k == 0:
        if P != 1:
            raise ValueError("no attribute class to hash on: only P = 1 is possible")
        return ()
    got = _Shares(covers, rates, P, caps).best(0, P, ())
    if got is None:
        raise ValueError(f"no shares with product {P} fit the caps {list(caps or ())}")
    return tuple(-x for x in got[2])


class _Shares:
    """``choose_shares``' dynamic program: ``best(j, Q, partial)`` is the cheapest choice
    of p_j.. (product Q) as (cost, streams replicated, the shares negated), ``partial`` the
    products so far of the streams open at j (covered by a class before j and one from j
    on), in ``open[j]``'s order."""

    def __init__(self, covers, rates: dict, P: int, caps):
        k = len(covers)
        self.P, self.k = P, k
        streams = list(rates)
        self.scope = [[c for c in range(k) if s in covers[c]] for s in streams]
        self.rate = [float(rates[s]) for s in streams]
        self.at = [[i for i, sc in enumerate(self.scope) if c in sc] for c in range(k)]
        self.open = [[i for i, sc in enumerate(self.scope) if sc and sc[0] < j <= sc[-1]]
                     for j in range(k + 1)]
        self.cap = [None if caps is None else caps[c] for c in range(k)]
        # room[j]: the largest product classes j.. can hold (None: unbounded)
        self.room: list[int | None] = [1] * (k + 1)
        for j in range(k - 1, -1, -1):
            self.room[j] = None if self.cap[j] is None or self.room[j + 1] is None \
                else self.cap[j] * self.room[j + 1]
        self.divs = divisors(P)[::-1]  # largest first: the tie-break's preferred order
        self.memo: dict = {}

    @staticmethod
    def _better(a, b) -> bool:
        ca, cb = a[0], b[0]
        if abs(ca - cb) > 1e-12 * max(abs(ca), abs(cb)):
            return ca < cb
        return (a[1], a[2]) < (b[1], b[2])

    def best(self, j: int, Q: int, partial: tuple):
        key = (j, Q, partial)
        if key in self.memo:
            return self.memo[key]
        P, k, cap, room, scope, rate = self.P, self.k, self.cap, self.room, self.scope, self.rate
        part = dict(zip(self.open[j], partial, strict=True))
        out = None
        for d in self.divs:
            if d > Q or Q % d or (cap[j] is not None and d > cap[j]) or \
                    (j == k - 1 and d != Q):
                continue
            if room[j + 1] is not None and Q // d > room[j + 1]:
                break  # (smaller shares leave more for the classes after j)
            cost, replicated, nxt = 0.0, 0, dict(part)
            for i in self.at[j]:
                h = nxt.pop(i, 1) * d
                if scope[i][-1] == j:  # its last class: its term is known
                    cost += rate[i] * (P // h)
                    replicated += h < P
                else:
                    nxt[i] = h
            if j + 1 < k:
                sub = self.best(j + 1, Q // d, tuple(nxt[i] for i in self.open[j + 1]))
                if sub is None:
                    continue
                cand = (cost + sub[0], replicated + sub[1], (-d, *sub[2]))
            else:
                cand = (cost, replicated, (-d,))
            if out is None or self._better(cand, out):
                out = cand
        self.memo[key] = out
        return out
