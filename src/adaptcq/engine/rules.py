"""The rules every pipeline plan obeys, each defined once (ARCHITECTURE.md "The engine
core"). ``engine.plan`` builds plans with them; ``adapt/`` and ``optimizer/`` import them
from here, so a policy and the executor can never disagree on what a valid order, a cache
key or a NULL key is.

* Orders: :func:`check_order` (the one check of an order; :func:`check_given_orders` for
  an executor's ``orders`` option), :func:`connected_order`, :func:`admissible`.
* The prefix invariant (a-caching.txt Def. 3.2; §6 for X ∪ Y): :func:`prefix_invariant`.
* The cache key K_ijk (§3.2): :func:`cache_key`, :func:`probe_ref`.
* Probes and keys: :func:`probe_plan`, :func:`key_function`, :func:`composite_key`.
* NULL keys: a key with a NULL in any part never joins (SQL equality): :func:`is_null_key`.
  A one-column key is the bare value (``None`` is NULL); a several-column key is a tuple,
  and the key builders return ``None`` for it when any part is NULL, so every user tests
  ``key is None`` only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import lru_cache

from adaptcq.query.logical import ColumnRef, LogicalQuery


# ----- orders ---------------------------------------------------------------------------
def check_order(streams: Iterable[str], start: str, order: Sequence[str]) -> list[str]:
    """``order`` as a new list when it is a list or tuple of stream names listing every
    stream of ``streams`` other than ``start`` exactly once; otherwise a ValueError naming
    ``start``, the streams expected and what was given. The one check of a pipeline order:
    the executors' ``orders`` option (:func:`check_given_orders`), their ``set_order``, the
    runtime's ``--order`` and the caching policies' candidate orders all come here.

    Only a list or tuple is an order: a string would be taken letter by letter, a set in
    its hash order (a plan that changes with PYTHONHASHSEED), and a one-shot iterator
    would be used up by the check itself."""
    streams = list(streams)
    if start not in streams:
        raise ValueError(f"pipeline order for {start}: no stream {start} in the query "
                         f"(streams: {', '.join(streams)})")
    others = sorted(s for s in streams if s != start)
    if not isinstance(order, (list, tuple)) or not all(isinstance(s, str) for s in order):
        raise ValueError(f"orders[{start!r}] must be a list of the other streams "
                         f"({', '.join(others) or 'none'}) in the order {start}'s pipeline "
                         f"joins them, got {order!r}")
    if sorted(order) != others:
        raise ValueError(
            f"pipeline order for {start} must list each of {', '.join(others)} once, "
            f"got {', '.join(order) or 'nothing'}")
    return list(order)


def check_given_orders(streams: Sequence[str], orders: Mapping[str, Sequence[str]] | None,
                       error: type[ValueError] = ValueError) -> dict[str, list[str]]:
    """The ``orders`` option of an executor that takes fixed pipeline orders (MJoin, the
    vectorized executor, ``ContinuousQuery``, ``adaptcq.run``'s ``orders=`` / ``--order``):
    None, or a mapping from streams of the query to orders, each checked by
    :func:`check_order`. Returns the checked orders of the streams given (new lists);
    ``error`` (the callers pass ``errors.OptionError``: this module imports only the query
    layer) names a stream not in the query, or the stream whose order is bad."""
    if orders is None:
        return {}
    streams = list(streams)
    if not isinstance(orders, Mapping):
        raise error(f"orders must map streams to their pipeline orders, e.g. "
                    f"{{{streams[0]!r}: {streams[1:]!r}}}, got {orders!r}")
    unknown = sorted((s for s in orders if s not in streams), key=str)
    if unknown:
        names = [str(s) for s in unknown]
        raise error(f"pipeline order for {', '.join(names)}: no stream "
                    f"{' or '.join(names)} in the query (streams: {', '.join(streams)})")
    try:
        return {a: check_order(streams, a, orders[a]) for a in streams if a in orders}
    except ValueError as e:
        raise error(str(e)) from None


def admissible(neighbors: Mapping[str, Iterable[str]], prefix: Iterable[str],
               remaining: Sequence[str]) -> list[str]:
    """The streams of ``remaining`` (in the order given) that may join next without a
    needless cartesian product: those sharing a predicate with ``prefix``, or all of them
    when none does (the prefix's connected component is exhausted). Ties between them are
    the caller's to break; callers holding a set pass it sorted."""
    prefix = set(prefix)
    rest = list(remaining)
    linked = [s for s in rest if any(t in prefix for t in neighbors.get(s, ()))]
    return linked or rest


def adjacency(query: LogicalQuery) -> dict[str, tuple[str, ...]]:
    """The query's join graph as neighbour lists (what :func:`admissible` reads)."""
    return query.adjacency()


def connected_order(query: LogicalQuery, start: str) -> list[str]:
    """The default pipeline order: repeatedly the first stream in FROM order that is
    admissible after the prefix (never a cartesian product while a connected stream
    remains)."""
    neighbors = adjacency(query)
    prefix, rest = [start], [a for a in query.aliases if a != start]
    while rest:
        nxt = admissible(neighbors, prefix, rest)[0]
        prefix.append(nxt)
        rest.remove(nxt)
    return prefix[1:]


def prefix_invariant(orders: Mapping[str, Sequence[str]], z: Iterable[str]) -> bool:
    """Def. 3.2: for each R_l in Z, the first |Z| - 1 joins of ΔR_l's pipeline are with the
    other relations of Z (for a globally-consistent cache, Z = X ∪ Y: §6)."""
    zs = frozenset(z)
    return all(frozenset(orders[s][:len(zs) - 1]) == zs - {s} for s in zs)


# ----- keys ----------------------------------------------------------------------------
def probe_plan(query: LogicalQuery, stream: str, prefix: Iterable[str]):
    """How ``stream`` is probed from a composite of ``prefix``: (the index's column
    positions in ``stream``'s rows, the prefix ColumnRefs whose values form the key).
    Empty positions: no predicate links them (a cartesian product step)."""
    pairs = query.join_key(stream, frozenset(prefix))
    cols = query.columns[stream]
    return tuple(cols.index(c) for c, _ in pairs), [ref for _, ref in pairs]


def _column_order(query: LogicalQuery, c: ColumnRef):
    return (query.aliases.index(c.stream), query.columns[c.stream].index(c.column))


def cache_key(query: LogicalQuery, before: Iterable[str],
              members: Iterable[str]) -> tuple[ColumnRef, ...]:
    """K_ijk (a-caching.txt §3.2): the join attributes between the relations ``before``
    the segment and those in it, as segment-side columns, one per attribute class (the
    first in FROM and column order: all columns of a class are equal within a segment
    tuple), sorted by stream then column. Empty when no predicate links them."""
    before, members = set(before), set(members)
    key = []
    for cls in query.classes:
        if any(c.stream in before for c in cls):
            mine = sorted((c for c in cls if c.stream in members),
                          key=lambda c: _column_order(query, c))
            if mine:
                key.append(mine[0])
    return tuple(sorted(key, key=lambda c: (query.aliases.index(c.stream), c.column)))


def probe_ref(query: LogicalQuery, ref: ColumnRef, prefix: Sequence[str]) -> ColumnRef:
    """The prefix column a cache probe reads for key column ``ref``: the first column of
    ``ref``'s attribute class in the prefix (prefix order, then column name)."""
    prefix = list(prefix)
    for cls in query.classes:
        if ref in cls:
            return min((c for c in cls if c.stream in prefix),
                       key=lambda c: (prefix.index(c.stream), c.column))
    raise ValueError(f"{ref} is not a join attribute")


def is_null_key(key) -> bool:
    """A key that joins nothing: NULL, or a several-column key with a NULL part."""
    return key is None or (type(key) is tuple and None in key)


def key_function(positions: tuple[int, ...]) -> Callable[[tuple], object]:
    """row -> the key on those column positions: the bare value for one, a tuple for
    several (None when any part is NULL), () for none."""
    if len(positions) == 1:
        (p,) = positions
        return lambda row: row[p]
    if not positions:
        return lambda row: ()

    def key(row, _ps=tuple(positions)):
        k = tuple(row[p] for p in _ps)
        return None if None in k else k

    return key


@lru_cache(maxsize=4096)
def _composite_key(slots: tuple[tuple[int, int], ...]):
    if not slots:
        return None
    if len(slots) == 1:
        ((a, c),) = slots
        return lambda comp: comp[a][c]

    def key(comp):
        k = tuple(comp[a][c] for a, c in slots)
        return None if None in k else k
    return key


def composite_key(slots: Iterable[tuple[int, int]]) -> Callable[[tuple], object] | None:
    """composite (a tuple of base rows) -> key, from (slot, column position) pairs, with
    the NULL rule of :func:`key_function`; None when there are no pairs (a cartesian
    step). Built once per distinct key (the interpreter asks for them per update)."""
    return _composite_key(tuple(slots))


def row_key_positions(query: LogicalQuery, key: Sequence[ColumnRef],
                      stream: str) -> tuple[int, ...] | None:
    """Positions in ``stream``'s rows that determine cache key ``key`` (one column of each
    key column's attribute class), or None when ``stream``'s row alone does not."""
    cols = query.columns[stream]
    positions = []
    for ref in key:
        cls = next(c for c in query.classes if ref in c)
        mine = [c for c in cls if c.stream == stream]
        if not mine:
            return None
        positions.append(cols.index(mine[0].column))
    return tuple(positions)
