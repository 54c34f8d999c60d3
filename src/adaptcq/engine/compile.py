"""Turn a pipeline (a join order) into straight-line Python: the executors' hot path.

A pipeline is compiled once per order into nested loops over hash-index buckets, with the
output projection inlined in the innermost loop; re-ordering a pipeline compiles a new
function. Generated code only reads SteMs; it never mutates them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from adaptcq.query.logical import ColumnRef, LogicalQuery


def projection_source(query: LogicalQuery, resolve: Callable[[ColumnRef], str]) -> str:
    """Python source of the output tuple's SELECT values (before ``sign, ts``)."""
    import sqlglot.expressions as exp

    from adaptcq.query.expr import to_python

    def one(e: exp.Expression) -> str:
        if isinstance(e, exp.Column):  # the common case, kept to a bare subscript
            return resolve(ColumnRef(e.table, e.name))
        return to_python(e, resolve, query.types)

    return "".join(one(o.expr) + ", " for o in query.outputs)


def probe_plan(query: LogicalQuery, stream: str, prefix: Sequence[str]):
    """How ``stream`` is probed from the composite ``prefix``: (index column positions of
    ``stream``, the ColumnRefs in ``prefix`` whose values form the key). Empty positions
    mean no predicate links them (a cartesian product step)."""
    pairs = query.join_key(stream, frozenset(prefix))
    cols = query.columns[stream]
    return tuple(cols.index(c) for c, _ in pairs), [ref for _, ref in pairs]


def key_source(refs: Sequence[ColumnRef], resolve: Callable[[ColumnRef], str]) -> str:
    if len(refs) == 1:
        return resolve(refs[0])
    return "(" + ", ".join(resolve(r) for r in refs) + ",)"


def compile_function(name: str, lines: list[str], namespace: dict) -> Callable:
    src = "\n".join(lines)
    code = compile(src, f"<adaptcq {name}>", "exec")
    ns = dict(namespace)
    exec(code, ns)  # noqa: S102 - generated from the parsed query, not from user text
    fn = ns[name]
    fn.__source__ = src
    return fn


def composite_key(slots):
    """Key of a composite tuple (a tuple of base rows) from (slot, column) pairs: the bare
    value for one pair, a tuple for several (None when any part is NULL: NULL never
    joins); None when there are no pairs (a cartesian step)."""
    slots = tuple(slots)
    if not slots:
        return None
    if len(slots) == 1:
        (a, c), = slots
        return lambda comp: comp[a][c]

    def key(comp):
        k = tuple(comp[a][c] for a, c in slots)
        return None if None in k else k
    return key
