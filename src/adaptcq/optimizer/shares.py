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
the driver (64 candidate keys per group, ``runtime.spark._group_keys``): a few seconds at
this limit, and unbounded before it (``--partitions 1000000000`` never returned)."""


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
    first such class, which is the split on a key common to all streams.
    """
    if P < 1:
        raise ValueError(f"P must be at least 1, got {P}")
    check_groups(P, f"{P:,} partition groups")
    k = len(covers)
    if k == 0:
        if P != 1:
            raise ValueError("no attribute class to hash on: only P = 1 is possible")
        return ()
    best = None
    for shares in factorizations(P, k):
        if caps is not None and any(c is not None and p > c
                                    for p, c in zip(shares, caps, strict=True)):
            continue
        cost = shipped(covers, rates, shares)
        replicated = sum(replication(covers, shares, s) > 1 for s in rates)
        key = (round(cost, 9), replicated, tuple(-p for p in shares))
        if best is None or key < best[0]:
            best = (key, shares)
    if best is None:
        raise ValueError(f"no shares with product {P} fit the caps {list(caps or ())}")
    return best[1]
