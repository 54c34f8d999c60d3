"""XJoin executor (a-caching.txt §1, Figure 1(b); Urhan and Franklin [28]).

A tree of binary symmetric hash joins, left-deep or bushy, that materializes the join
subresult of every internal node below the root. An update to R_i travels from R_i's leaf
to the root: at each node it is joined with the sibling subtree's state (a SteM at a leaf,
the materialized subresult above), and the resulting delta is applied to that node's
subresult before going up. Deletions are propagated the same way, so the subresults stay
exact in both output modes.

A subresult row ("composite tuple") is a tuple of base rows, one per stream of the node in
the node's stream order, identified by the tuple of their row ids. Base rows are shared
with the SteMs, never copied.
"""

from __future__ import annotations

from collections.abc import Sequence

from adaptcq.engine.codegen import compile_source, projection_source
from adaptcq.engine.rules import composite_key, connected_order
from adaptcq.query.logical import ColumnRef, LogicalQuery
from adaptcq.state.stem import SteM

Tree = str | tuple  # an alias, or a pair (left, right) of trees


def parse_tree(text: str) -> Tree:
    """``"((R, S), T)"`` -> (("R", "S"), "T"): the operator tree's syntax
    (``engine.spill_tree.parse_plan``), every join with exactly two inputs."""
    from adaptcq.engine.spill_tree import parse_plan
    try:
        tree = parse_plan(text)
    except ValueError as e:
        raise ValueError(f"XJoin {e}") from None
    return check_tree(tree)


def check_tree(tree) -> Tree:
    """A tree given in Python: a stream alias, or a pair (list or tuple) of trees; returned
    with tuples for pairs; a string with parentheses or commas is the CLI's text
    (``parse_tree``), not a stream name. Anything else (a join of one or of three inputs)
    is refused."""
    if isinstance(tree, str):
        return parse_tree(tree) if any(c in tree for c in "(),") else tree
    pair = isinstance(tree, (tuple, list))
    if pair and len(tree) == 2:
        return (check_tree(tree[0]), check_tree(tree[1]))
    what = f"each join takes exactly two inputs, got {len(tree)}:" if pair else \
        "a leaf must be a stream name, got"
    raise ValueError(f"XJoin tree: {what} {tree!r}")


def left_deep(order: Sequence[str]) -> Tree:
    tree: Tree = order[0]
    for s in order[1:]:
        tree = (tree, s)
    return tree


def tree_leaves(tree: Tree) -> list[str]:
    return [tree] if isinstance(tree, str) else tree_leaves(tree[0]) + tree_leaves(tree[1])


def tree_str(tree: Tree) -> str:
    return tree if isinstance(tree, str) else f"({tree_str(tree[0])} ⋈ {tree_str(tree[1])})"


class _Node:
    __slots__ = (
        "indexes",
        "keyfns",
        "left",
        "parent",
        "right",
        "stem",
        "store",
        "streams",
        "up",
    )

    def __init__(self, streams: tuple[str, ...]):
        self.streams = streams
        self.parent: _Node | None = None
        self.left = self.right = None
        self.stem: SteM | None = None       # leaves
        self.store: dict | None = None      # internal non-root: ids -> composite
        self.indexes: dict = {}             # key spec -> {key: {ids: composite}}
        self.keyfns: list = []              # (key fn, index) for each index
        self.up = None                      # (sibling, key fn of self, sibling index, self is left)


class XJoin:
    """The XJoin executor for a given join tree (default: left-deep in a connected order)."""

    name = "xjoin"

    def __init__(self, query: LogicalQuery, mode: str = "append", tree: Tree | None = None,
                 out: list | None = None):
        self.query = query
        self.retract = mode == "retract"
        self.out = [] if out is None else out
        self._emit = self.out.append
        self.tree = check_tree(tree) if tree is not None else left_deep(
            [query.aliases[0], *connected_order(query, query.aliases[0])])
        leaves = tree_leaves(self.tree)
        if sorted(leaves) != sorted(query.aliases):
            raise ValueError(f"XJoin tree {tree_str(self.tree)} must hold each of "
                             f"{', '.join(query.aliases)} exactly once")
        self.stems = [SteM(a, query.columns[a]) for a in query.aliases]
        # Per-stream update functions (engine.protocols.Executor): closures over the
        # stream's SteM and alias, so the update loop's call does no lookups.
        self.inserts = [self._inserter(a, s) for a, s in zip(query.aliases, self.stems)]
        self.deletes = [self._deleter(a, s) for a, s in zip(query.aliases, self.stems)]
        self._leaves: dict[str, _Node] = {}
        self.root = self._build(self.tree)
        self.root.store = None
        self._wire(self.root)
        self._project = self._compile_projection()

    # ----- construction ----------------------------------------------------------------
    def _build(self, tree: Tree) -> _Node:
        if isinstance(tree, str):
            node = _Node((tree,))
            node.stem = self.stems[self.query.aliases.index(tree)]
            self._leaves[tree] = node
            return node
        left, right = self._build(tree[0]), self._build(tree[1])
        node = _Node(left.streams + right.streams)
        node.left, node.right = left, right
        left.parent = right.parent = node
        node.store = {}
        return node

    def _wire(self, node: _Node) -> None:
        for child, sib, is_left in ((node.left, node.right, True), (node.right, node.left, False)):
            if child is None:
                continue
            pairs = [(a, b) for a, b in self.query.equalities()
                     if a.stream in child.streams and b.stream in sib.streams] + \
                    [(b, a) for a, b in self.query.equalities()
                     if b.stream in child.streams and a.stream in sib.streams]
            mine = [self._slot(child, r) for r, _ in pairs]
            theirs = tuple(self._slot(sib, r) for _, r in pairs)
            child.up = (sib, composite_key(mine), self._index(sib, theirs), is_left)
            self._wire(child)

    def _slot(self, node: _Node, ref: ColumnRef) -> tuple[int, int]:
        return (node.streams.index(ref.stream), self.query.columns[ref.stream].index(ref.column))

    def _index(self, node: _Node, spec: tuple[tuple[int, int], ...]):
        """The sibling state probed with key ``spec``: a SteM index at a leaf (buckets of
        rid -> row) or an index on the materialized subresult (ids -> composite)."""
        if not spec:
            return None
        if node.stem is not None:
            return node.stem.index(tuple(c for _, c in spec))
        idx = node.indexes.get(spec)
        if idx is None:
            idx = node.indexes[spec] = {}
            node.keyfns.append((composite_key(list(spec)), idx))
        return idx

    def _compile_projection(self):
        q, streams = self.query, self.root.streams

        def resolve(ref: ColumnRef) -> str:
            return f"c[{streams.index(ref.stream)}][{q.columns[ref.stream].index(ref.column)}]"

        return compile_source("project", f"<XJoin projection {tree_str(self.tree)}>", "\n".join([
            "def project(delta, sign, ts, emit):",
            "    for c in delta:",
            f"        emit(({projection_source(q, resolve)}sign, ts))", ""]), {}).fn

    def set_emit(self, emit) -> None:
        """Where result tuples go (``out.append`` by default). An XJoin materializes each
        update's results at its root before emitting them, so a bound applies between
        result tuples of the projection, not to that list."""
        self._emit = emit

    # ----- updates ---------------------------------------------------------------------
    def insert(self, i: int, rid: int, row: tuple, ts) -> None:
        self.inserts[i](rid, row, ts)

    def delete(self, i: int, rid: int, ts) -> None:
        self.deletes[i](rid, ts)

    def _inserter(self, alias: str, stem: SteM):
        propagate = self._propagate

        def insert(rid: int, row: tuple, ts) -> None:
            propagate(alias, rid, row, 1, ts)
            stem.insert(rid, row, ts)  # an attribute: SteM recompiles it per index set
        return insert

    def _deleter(self, alias: str, stem: SteM):
        propagate = self._propagate

        def delete(rid: int, ts) -> None:
            propagate(alias, rid, stem.delete(rid), -1, ts)
        return delete

    def _propagate(self, stream: str, rid: int, row: tuple, sign: int, ts,
                   emit: bool = True) -> None:
        node = self._leaves[stream]
        delta = [((rid,), (row,))]
        while node.parent is not None and delta:
            sib, keyfn, index, is_left = node.up
            joined = []
            for ids, comp in delta:
                if index is None:
                    bucket = _all(sib)
                else:
                    k = keyfn(comp)
                    bucket = index.get(k) if k is not None else None
                    if not bucket:
                        continue
                if sib.stem is not None:
                    items = (((r,), (v,)) for r, v in bucket.items())
                else:
                    items = bucket.items()
                if is_left:
                    joined.extend((ids + sids, comp + scomp) for sids, scomp in items)
                else:
                    joined.extend((sids + ids, scomp + comp) for sids, scomp in items)
            node, delta = node.parent, joined
            if node.store is not None:
                (_store_insert if sign > 0 else _store_delete)(node, delta)
        if emit and node.parent is None and delta and (sign > 0 or self.retract):
            self._project([c for _, c in delta], sign, ts, self._emit)

    # ----- checkpoints -----------------------------------------------------------------
    def plan_state(self) -> dict:
        return {"tree": self.tree}

    def load(self, i: int, rows: dict, times: dict | None = None) -> None:
        """Restore stream i's window contents (rid -> row) and the subresults they take
        part in, without producing output (symmetric joins: load order does not matter)."""
        alias = self.query.aliases[i]
        for rid, row in rows.items():
            self._propagate(alias, rid, row, 1, 0.0, emit=False)
            self.stems[i].insert(rid, row, (times or {}).get(rid))

    # ----- introspection ---------------------------------------------------------------
    def subresults(self) -> dict[str, int]:
        out: dict[str, int] = {}

        def walk(n: _Node):
            if n.store is not None:
                out["⋈".join(n.streams)] = len(n.store)
            for c in (n.left, n.right):
                if c is not None:
                    walk(c)
        walk(self.root)
        return out

    def state_tuples(self) -> int:
        return sum(len(s) for s in self.stems) + sum(self.subresults().values())

    def state_bytes(self) -> int:
        import sys
        total = sum(s.size_bytes() for s in self.stems)

        def walk(n: _Node):
            nonlocal total
            if n.store:
                # The store holds references; count its dict, id tuples and composite tuples.
                ids, comp = next(iter(n.store.items()))
                per = sys.getsizeof(ids) + sys.getsizeof(comp)
                total += sys.getsizeof(n.store) + per * len(n.store)
                for idx in n.indexes.values():
                    total += sys.getsizeof(idx) + 232 * len(idx)
            for c in (n.left, n.right):
                if c is not None:
                    walk(c)
        walk(self.root)
        return total

    def describe(self) -> str:
        return "XJoin " + tree_str(self.tree)


def _all(node: _Node) -> dict:
    return node.stem.rows if node.stem is not None else node.store


def _store_insert(node: _Node, delta) -> None:
    store = node.store
    for ids, comp in delta:
        store[ids] = comp
        for keyfn, idx in node.keyfns:
            k = keyfn(comp)
            if k is not None:
                b = idx.get(k)
                if b is None:
                    idx[k] = {ids: comp}
                else:
                    b[ids] = comp


def _store_delete(node: _Node, delta) -> None:
    store = node.store
    for ids, comp in delta:
        del store[ids]
        for keyfn, idx in node.keyfns:
            k = keyfn(comp)
            if k is not None:
                b = idx[k]
                del b[ids]
                if not b:
                    del idx[k]
