"""Eq. 3 as a batch join: the heavy part of the clean-up (state-spill.txt §4) over Arrow.

A partition group's generations are self-contained, so merging generation Δ into a base
yields Σ over the non-empty proper subsets S of the operator's children of
(⋈_{i∈S} Δ_i) ⋈ (⋈_{i∉S} base_i) (Eq. 3, Lemma 4.1), and the order in which generations
are merged does not matter (Lemma 4.2). Equal partition-column values fall in one
partition group, so the terms of many groups are computed at once: one hash join per
term over every group of a run, not one per group (issue 12: the heavy part of the
paper's clean-up "is exactly a batch join"). ``SpillTree`` reads a run's spilled
generations as Arrow (slices of the spill files' own batches), adds its memory generation
and the missing subresults its children handed over, and calls :func:`missing`; the rows
become Python objects only as results to emit (just the SELECT's columns) or as groups
kept in memory.

The tables here hold one child's inputs: ``pid``, each of the child's streams'
``S#rid``, ``S#t`` and ``S.col`` columns (the spill format, ``state/spill_store``), and
``_key`` (the partition column, NULL and NaN dropped: they never join), ``_exp`` (the
input's window end, min(t_c + w_c) over its components; with integer times an unbounded
window's end is ``NO_END``) and ``_t`` (its newest component's time). A combination is
valid when its newest time is at most every component's end (docs/semantics.md), and when
the operator's other equalities between children hold (``Shape.checks``: compared as
SQL does, so NULL and NaN never match).

:func:`align` decides whether a run can take this path: every column must have one Arrow
type across the generations, and each compared pair of columns a type in which Arrow's
equality is Python's (the engine's). Anything else (integers beyond 2^53 against floats,
strings against numbers, nested or dictionary values) is cleaned up group by group in
Python by ``SpillTree`` instead, with the same results; so are integer times whose window
is fractional or whose end would pass int64 (:func:`child_inputs`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from adaptcq.state.spill_store import stream_names
from adaptcq.stream.arrays import engine_values

INF = math.inf
NO_END = int(np.iinfo(np.int64).max)  # the window end of an unbounded input, integer times
EXACT = 2**53  # integers up to this compare with doubles as Python compares them


@dataclass(frozen=True)
class Shape:
    """What the batch join needs of one operator: per child its streams (``layouts``) and
    partition column (``keys``, a spill-format column name), the equalities between two
    children other than the partition column's (``checks``: (child, column, child,
    column)), per stream its window (``windows``, inf when unbounded) and column names
    (``columns``)."""

    layouts: tuple[tuple[str, ...], ...]
    keys: tuple[str, ...]
    checks: tuple[tuple[int, str, int, str], ...]
    windows: dict
    columns: dict

    @property
    def m(self) -> int:
        return len(self.layouts)

    def names(self, k: int) -> list[str]:
        """Child k's spill-format columns."""
        return [n for a in self.layouts[k] for n in stream_names(a, self.columns[a])]


def shape_of(op, query, windows: dict) -> Shape:
    """The :class:`Shape` of a ``spill_tree.Operator`` (its equalities between children
    as ``_wire`` found them)."""
    m = len(op.children)
    layouts = tuple(op.child_streams(k) for k in range(m))
    keys = []
    for k, (ci, cc) in enumerate(op.key_slots):
        s = layouts[k][ci]
        keys.append(f"{s}.{query.columns[s][cc]}")
    checks = [(kx, f"{x.stream}.{x.column}", ky, f"{y.stream}.{y.column}")
              for kx, x, ky, y in op.equalities]
    return Shape(layouts, tuple(keys), tuple(checks),
                 {s: windows[s] for lay in layouts for s in lay},
                 {s: tuple(query.columns[s]) for lay in layouts for s in lay})


# ----- one child's inputs ------------------------------------------------------------------
def child_inputs(rows: pa.Table, k: int, shape: Shape) -> pa.Table | None:
    """Child k's inputs among ``rows`` (spill format: ``pid``, ``child`` and the streams'
    columns), with ``_key``, ``_exp`` and ``_t``; None when there are none. Raises
    ``_Unfit`` when their times cannot give window ends exactly in Arrow (integer times
    with a window that is not whole, or an end past int64)."""
    have = set(rows.column_names)
    names = [n for n in shape.names(k) if n in have]
    if shape.keys[k] not in names:
        return None  # NULL partition values never join (nor are they ever stored)
    # The child's rows with a partition value, filtered once (its columns only), and not
    # at all when every row is one (a hand-over holds one child's).
    keep = rows["child"].to_numpy() == k
    if not keep.any():
        return None
    key = rows[shape.keys[k]]
    if key.null_count or pa.types.is_floating(key.type):
        keep &= pc.fill_null(joinable(key), False).to_numpy(zero_copy_only=False)
    t = where(compact(rows.select(["pid", *names])), keep)
    if t is None:
        return None
    key = t[shape.keys[k]]
    if pa.types.is_floating(key.type):
        key = pc.add(key, pa.scalar(0.0, key.type))  # -0.0 is 0.0, as in a dict
    times, ends = [], []
    for a in shape.layouts[k]:
        ts = t[f"{a}#t"]
        w = shape.windows[a]
        if pa.types.is_integer(ts.type):
            if w != INF and w != int(w):
                raise _Unfit
            times.append(ts.to_numpy().astype(np.int64, copy=False))
            if w == INF:
                ends.append(None)
                continue
            # t + w must stay below NO_END (int64 would wrap around, and NO_END reads as
            # no end): a longer window goes the Python way, whose integers do not overflow.
            if int(w) >= NO_END or (len(times[-1]) and times[-1].max() >= NO_END - int(w)):
                raise _Unfit
            ends.append(times[-1] + int(w))
        elif pa.types.is_floating(ts.type):
            times.append(ts.to_numpy().astype(np.float64, copy=False))
            ends.append(times[-1] + w)
        else:
            raise _Unfit
    newest = times[0] if len(times) == 1 else np.maximum.reduce(times)
    finite = [e for e in ends if e is not None]
    if not finite:
        end = np.full(len(newest), NO_END, dtype=np.int64)
    else:
        end = finite[0] if len(finite) == 1 else np.minimum.reduce(finite)
    return t.append_column("_key", key).append_column("_exp", pa.array(end)) \
            .append_column("_t", pa.array(newest))


def joinable(key) -> pa.Array:
    """Which partition values can join: not NULL, not NaN (the engine never stores or
    matches those)."""
    keep = pc.is_valid(key)
    if pa.types.is_floating(key.type):
        keep = pc.and_(keep, pc.invert(pc.is_nan(key)))
    return keep


class _Unfit(Exception):
    """These rows cannot take the batch path (see :func:`align`)."""


def inputs(rows: pa.Table | None, shape: Shape) -> list[pa.Table] | None:
    """Per child, its inputs among ``rows`` (None for a child without any); None when
    they cannot take the batch path."""
    if rows is None:
        return [None] * shape.m
    try:
        return [child_inputs(rows, k, shape) for k in range(shape.m)]
    except _Unfit:
        return None


def _family(t: pa.DataType) -> str:
    if pa.types.is_integer(t):
        return "int"
    if pa.types.is_floating(t):
        return "float"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "str"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return "bytes"
    if pa.types.is_boolean(t):
        return "bool"
    return ""


def _comparable(arrays: Sequence) -> pa.DataType | None:
    """One type in which these columns compare as Python compares their values, or
    None. Integers and doubles compare exactly while the integers stay within 2^53."""
    types = {a.type for a in arrays if a.type != pa.null()}
    if not types:
        return pa.int64()  # NULL everywhere: nothing matches
    fams = {_family(t) for t in types}
    if fams == {"int", "float"}:
        for a in arrays:
            if pa.types.is_integer(a.type) and len(a):
                lo, hi = (v.as_py() for v in pc.min_max(a).values())
                if lo is not None and max(-lo, hi) > EXACT:
                    return None
        return pa.float64()
    if len(fams) > 1 or "" in fams:
        return None
    (fam,) = fams
    if fam == "int":
        if pa.uint64() in types:
            return pa.uint64() if len(types) == 1 else None
        return pa.int64()
    return {"float": pa.float64(), "str": pa.large_string(), "bytes": pa.large_binary(),
            "bool": pa.bool_()}[fam]


def _flat(t: pa.DataType) -> bool:
    """A type the hash join carries as payload (no nesting, no dictionary)."""
    return not (pa.types.is_nested(t) or pa.types.is_dictionary(t)
                or isinstance(t, pa.ExtensionType))


@dataclass(frozen=True)
class Aligned:
    """What :func:`align` gives: the tables (as nested) and, per check of
    ``Shape.checks``, the type its two columns are compared in."""

    tables: list
    compare: dict


def align(tables: Sequence[Sequence[pa.Table | None]], shape: Shape) -> Aligned | None:
    """The generations' (and hand-overs') tables per child made one schema per child
    (a column NULL in one table takes the type it has in the others), the partition
    column (``_key``) one type across children; columns NULL in every table are dropped
    (read back as NULL). Values keep their types: a checked column is compared in a common
    type (``Aligned.compare``) without being cast. None when some column has two types or
    a comparison in Arrow would not be Python's."""
    per_child: list[dict[str, pa.DataType]] = []
    for k in range(shape.m):
        col_types: dict[str, set] = {}
        for gen in tables:
            t = gen[k]
            if t is None:
                continue
            for f in t.schema:
                col_types.setdefault(f.name, set()).add(f.type)
        target = {}
        for name, types in col_types.items():
            if name == "_key":
                continue
            real = types - {pa.null()}
            if len(real) > 1 or not all(_flat(t) for t in real):
                return None
            if real:
                target[name] = real.pop()
        per_child.append(target)
    # Window ends and times: one type for all (integers with integers).
    if len({c[n] for c in per_child for n in ("_exp", "_t") if n in c}) > 1:
        return None
    # The partition column and the checked ones: one comparable type across children.
    keyed = [[t[k]["_key"] for t in tables if t[k] is not None] for k in range(shape.m)]
    key_type = _comparable([a for arrays in keyed for a in arrays])
    if key_type is None:
        return None
    cast_to: list[dict[str, pa.DataType]] = [dict(c) for c in per_child]
    for k in range(shape.m):
        cast_to[k]["_key"] = key_type
    compare = {}  # per check, the type its two columns are compared in
    for kx, x, ky, y in shape.checks:
        cols = [t[k][n] for k, n in ((kx, x), (ky, y)) for t in tables
                if t[k] is not None and n in t[k].column_names]
        typ = _comparable(cols)
        if typ is None:
            return None
        compare[(kx, x, ky, y)] = typ
    out = []
    for gen in tables:
        row = []
        for k, t in enumerate(gen):
            if t is None:
                row.append(None)
                continue
            cols, names = [], []
            for f in t.schema:
                typ = cast_to[k].get(f.name)
                if typ is None:
                    continue  # NULL in every table
                col = t[f.name]
                cols.append(col if col.type == typ else col.cast(typ))
                names.append(f.name)
            row.append(pa.table(cols, names=names))
        out.append(row)
    return Aligned(out, compare)


# ----- Eq. 3 ----------------------------------------------------------------------------
SLICE_ROWS = 65_536  # rows of the smallest input joined at once: bounds a term's output


def combine(sources: Sequence[pa.Table | None], shape: Shape, compare: dict
            ) -> Iterator[pa.Table]:
    """(⋈_k sources[k]) on the partition column: every combination of equal keys whose
    newest component is no later than any component's end and that passes the checks,
    with ``pid``, ``_exp`` (the earliest end), ``_t`` (the newest time) and the
    components' columns; yielded for ``SLICE_ROWS`` rows of the smallest input at a time,
    so that memory holds a slice's combinations, not the term's.

    The joins run over narrow tables (key, end, newest time, row number and the checked
    columns); a combination's other columns are taken from the inputs only once it has
    passed every test. Most combinations of equal keys fail the window test, and the
    hash join would otherwise copy every column of each of them."""
    if any(s is None or s.num_rows == 0 for s in sources):
        return
    order = sorted(range(shape.m), key=lambda k: sources[k].num_rows)
    narrow = [_narrow(t, k, shape) for k, t in enumerate(sources)]
    first = narrow[order[0]]
    first = first.filter(pc.less_equal(first["_t"], first["_exp"]))
    for at in range(0, first.num_rows, SLICE_ROWS):
        got = _combine_from(first.slice(at, SLICE_ROWS), order, narrow, shape, compare)
        if got is not None:
            yield _materialize(got, order, sources)


def _narrow(t: pa.Table, k: int, shape: Shape) -> pa.Table:
    """What a join of child k's inputs ``t`` needs: ``_key``, ``_exp``, ``_t``, the row
    number ``_r{k}`` and the columns of the checks that involve child k."""
    checked = {name for kx, x, ky, y in shape.checks
               for c, name in ((kx, x), (ky, y)) if c == k}
    cols = ["_key", "_exp", "_t", *sorted(c for c in checked if c in t.column_names)]
    return t.select(cols).append_column(f"_r{k}", pa.array(np.arange(t.num_rows)))


def _materialize(part: pa.Table, order: list[int], sources: Sequence[pa.Table]) -> pa.Table:
    """The combinations ``part`` (row numbers per child) with their components' columns:
    the first child's (``pid``, its streams', ``_key``) with the combinations' ``_exp``
    and ``_t``, then each other child's streams' columns, in join order."""
    head = sources[order[0]].take(part[f"_r{order[0]}"])
    cols, names = [], []
    for name in head.column_names:
        cols.append(part[name] if name in ("_exp", "_t") else head[name])
        names.append(name)
    for k in order[1:]:
        other = sources[k]
        rest = [n for n in other.column_names if n not in ("pid", "_key", "_exp", "_t")]
        taken = other.select(rest).take(part[f"_r{k}"])
        cols.extend(taken.columns)
        names.extend(rest)
    return pa.table(cols, names=names)


def _key_matches(left: pa.ChunkedArray, right: pa.ChunkedArray
                 ) -> tuple[np.ndarray, np.ndarray]:
    """The row pairs (left row, right row) whose ``_key`` values are equal (NULL and NaN
    already dropped: ``child_inputs``). Numeric keys with numpy: the right keys sorted
    once, each left key's run of equal keys found by binary search, so equality is the
    engine's (Python's: -0.0 = 0.0); pairs come by left row, then in the right side's key
    order. Other key types with Acero's hash join of the keys and their row numbers."""
    if (left.type != right.type or left.null_count or right.null_count
            or not (pa.types.is_integer(left.type) or pa.types.is_floating(left.type))):
        joined = pa.table({"_key": left, "_li": pa.array(np.arange(len(left)))}).join(
            pa.table({"_key": right, "_ri": pa.array(np.arange(len(right)))}), "_key",
            join_type="inner", use_threads=False)
        return (joined["_li"].to_numpy().astype(np.int64, copy=False),
                joined["_ri"].to_numpy().astype(np.int64, copy=False))
    lv, rv = left.to_numpy(), right.to_numpy()
    order = np.argsort(rv, kind="stable")
    ranked = rv[order]
    lo = np.searchsorted(ranked, lv, "left")
    runs = np.searchsorted(ranked, lv, "right") - lo
    first = np.cumsum(runs) - runs  # where each left row's pairs start
    li = np.repeat(np.arange(len(lv)), runs)
    ri = order[np.repeat(lo - first, runs) + np.arange(int(runs.sum()))]
    return li, ri


def _combine_from(part: pa.Table, order: list[int], sources: Sequence[pa.Table],
                  shape: Shape, compare: dict) -> pa.Table | None:
    """``combine`` over the narrow inputs (``_narrow``) for some of the first source's
    rows (``part``); None when empty. Each step matches the next child on ``_key``
    (``_key_matches``) and keeps the combinations whose newest time is at most their
    earliest end (the window test, on the row pairs before any column is copied: a
    clean-up joins thousands of small tables, most of whose pairs fail it, and a hash join
    of the whole narrow tables cost Acero about a third of a millisecond to set up for
    each), then those passing the operator's other equalities."""
    bound = {order[0]}
    for k in order[1:]:
        right = sources[k]
        li, ri = _key_matches(part["_key"], right["_key"])
        end = np.minimum(part["_exp"].to_numpy()[li], right["_exp"].to_numpy()[ri])
        newest = np.maximum(part["_t"].to_numpy()[li], right["_t"].to_numpy()[ri])
        valid = newest <= end
        li, ri = li[valid], ri[valid]
        if not len(li):
            return None
        joined = part.take(li)
        rest = right.drop_columns(["_key", "_exp", "_t"]).take(ri)
        for name, col in zip(rest.column_names, rest.columns, strict=True):
            joined = joined.append_column(name, col)
        joined = joined.set_column(joined.column_names.index("_exp"), "_exp",
                                   pa.array(end[valid]))
        joined = joined.set_column(joined.column_names.index("_t"), "_t",
                                   pa.array(newest[valid]))
        keep = None
        for kx, x, ky, y in shape.checks:
            if (kx == k and ky in bound) or (ky == k and kx in bound):
                if x not in joined.column_names or y not in joined.column_names:
                    return None  # NULL in every row: no combination passes
                typ = compare[(kx, x, ky, y)]
                eq = pc.fill_null(pc.equal(joined[x].cast(typ), joined[y].cast(typ)), False)
                keep = eq if keep is None else pc.and_(keep, eq)
        if keep is not None:
            joined = joined.filter(keep)
        if not joined.num_rows:
            return None
        part = joined
        bound.add(k)
    return part


def concat(tables: Sequence[pa.Table | None]) -> pa.Table | None:
    have = [t for t in tables if t is not None and t.num_rows]
    if not have:
        return None
    return have[0] if len(have) == 1 else pa.concat_tables(have, promote_options="default")


def compact(t: pa.Table) -> pa.Table:
    """``t`` with each column in one chunk. A filter or take runs per chunk and per
    column: on a table of 48 chunks of 100 rows (the slices of a run's spill batches, or
    the generations of a merged group) a filter took ten times as long as combining the
    chunks and filtering once."""
    return t.combine_chunks() if t.num_columns and t.column(0).num_chunks > 1 else t


def subsets(items: Sequence[int]) -> list[tuple[int, ...]]:
    """The non-empty subsets of ``items`` (as tuples, smallest first)."""
    return [s for r in range(1, len(items) + 1) for s in itertools.combinations(items, r)]


def missing(gens: Sequence[Sequence[pa.Table | None]], deltas: Sequence[pa.Table | None],
            shape: Shape, compare: dict) -> Iterator[pa.Table]:
    """The missing results of merging ``gens`` (per generation in spill order, the memory
    one last, per child its inputs) and of the children's missing subresults
    (``deltas``, per child): Eq. 3 for each generation into the ones before it, then
    every combination holding at least one handed-over subresult with the merged
    inputs (each once: the subsets of the children that have some)."""
    m = shape.m
    deltas = [_compact_or_none(d) for d in deltas]  # each joined in several terms
    base: list[list[pa.Table]] = [[] for _ in range(m)]
    for j, gen in enumerate(gens):
        if j and any(t is not None and t.num_rows for t in gen):
            merged = [_compact_or_none(concat(b)) for b in base]
            for subset in subsets(range(m)):
                if len(subset) == m:
                    continue
                yield from combine([gen[k] if k in subset else merged[k]
                                    for k in range(m)], shape, compare)
        for k in range(m):
            if gen[k] is not None and gen[k].num_rows:
                base[k].append(gen[k])
    have = [k for k in range(m) if deltas[k] is not None and deltas[k].num_rows]
    if have:
        merged = [_compact_or_none(concat(b)) for b in base]
        for subset in subsets(have):
            yield from combine([deltas[k] if k in subset else merged[k] for k in range(m)],
                               shape, compare)


def _compact_or_none(t: pa.Table | None) -> pa.Table | None:
    return None if t is None else compact(t)


def merged_inputs(gens: Sequence[Sequence[pa.Table | None]],
                  deltas: Sequence[pa.Table | None], m: int) -> list[pa.Table | None]:
    """Per child, every input of the merged group: the generations' and the hand-overs'."""
    return [concat([*(g[k] for g in gens), deltas[k]]) for k in range(m)]


def still_valid(t: pa.Table | None, now) -> pa.Table | None:
    """The inputs whose window has not ended at ``now`` (exp ≥ now, compared exactly)."""
    if t is None or not t.num_rows:
        return None
    return where(t, valid_rows(t, now))


def valid_rows(t: pa.Table, now) -> np.ndarray:
    """Which inputs of ``t`` have a window not ended at ``now`` (exp ≥ now, compared
    exactly: with integer ends, against ⌈now⌉)."""
    exp = t["_exp"].to_numpy()
    if exp.dtype.kind in "iu":
        if now == -INF or now == INF:
            return np.full(len(exp), now == -INF)
        now = math.ceil(now)  # exp ≥ now ⟺ exp ≥ ⌈now⌉ for integers
    return exp >= now


def where(t: pa.Table | None, keep: np.ndarray | None) -> pa.Table | None:
    """The rows of ``t`` where ``keep``; None when there are none."""
    if t is None or keep is None or not keep.any():
        return None
    return t if keep.all() else compact(t).filter(pa.array(keep))


def composites(t: pa.Table, streams: Sequence[str], columns: dict) -> list[tuple]:
    """The rows of ``t`` as the engine's composites: per stream of ``streams``, a (rid,
    t, row) record (columns absent from ``t`` are NULL)."""
    n = t.num_rows
    names = set(t.column_names)
    per_stream = []
    for a in streams:
        vals = [engine_values(t[f"{a}.{c}"]) if f"{a}.{c}" in names else [None] * n
                for c in columns[a]]
        rows = zip(*vals, strict=True) if vals else itertools.repeat((), n)
        per_stream.append(zip(t[f"{a}#rid"].to_pylist(), t[f"{a}#t"].to_pylist(), rows,
                              strict=True))
    return list(zip(*per_stream, strict=True))


def ends(t: pa.Table) -> list:
    """``_exp`` as Python values, ``NO_END`` as inf."""
    out = t["_exp"].to_pylist()
    if pa.types.is_integer(t["_exp"].type):
        out = [INF if e == NO_END else e for e in out]
    return out
