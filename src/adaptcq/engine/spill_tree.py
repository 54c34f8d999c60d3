"""A plan of stateful operators whose partition groups can be spilled to disk, and the
exact clean-up of what was spilled (state-spill.txt, D-CAPE).

**The plan** (§2, Figures 4, 13, 15). A tree whose leaves are streams and whose internal
nodes are *operators*: m-way symmetric hash joins over their children. One node over every
stream is an MJoin; binary nodes are an XJoin; ``(((A, B, C), D), E)`` is the paper's
plan. An operator stores its inputs — base rows of its stream children, join subresults
(composite tuples) of its operator children — and an arrival joins with the other
children's stored inputs and is then stored itself. A result of an operator goes to its
parent as an input; the root's results are the query's output.

**Partition groups** (§2.1). Every operator has one *partition column*: an attribute class
with a column in each of its children (the join column all its inputs share), hashed into
``partitions`` partition ids (300 by default, §6.1). The inputs with partition id i of all
children form partition group i of the operator: every result of the operator is made of
inputs of one group, so a group can be pushed to disk and later merged back without
looking at the others. A tuple may belong to different partition ids in different
operators (non-transitive predicates: Figure 6). Spark partition groups (one engine
each, ``runtime/spark_split``) are the coarse level above this one; these are the fine
level inside an engine.

**Spilling** (§3). ``spill([(operator, pid), ...])`` writes those groups, as one spill
event, to the :class:`~adaptcq.state.spill_store.SpillStore` and drops them from memory; the
partition id starts a new, empty *generation* in memory. Which groups go is a policy's
choice (``adapt/spilling.py``); the statistics it reads are kept here per (operator, pid)
across generations (``stats/partitions.py``).

**Clean-up** (§4). Every generation of a partition group is *self-contained*: the results
among its own inputs were produced while it was in memory. Merging a generation Δ into a
base yields the missing results Σ over the non-empty proper subsets S of the children of
(⋈_{i∈S} Δ_i) ⋈ (⋈_{i∉S} base_i) (Eq. 3, Lemmas 4.1–4.2; the paper's Lemma 4.1 says
"ΔV − V^{r,s}" where it means "− V^s"). Bags are never differenced: every combination is
enumerated exactly once. Operators are cleaned from the leaves up (§4.2): an operator
starts when every operator child has sent its End-of-Cleanup control tuple, joins the
missing subresults its children sent with its complete stored inputs, and passes its own
missing results up, then its End-of-Cleanup.

**Windows** (beyond the paper, which has unbounded state). ``[RANGE w]`` windows in append
mode: a result is valid when its newest component's time t_L satisfies t_L ≤ t_c + w_c
for every component c (docs/semantics.md). Every stored input carries exp = min(t_c + w_c)
over its components and is skipped by probes once exp < now; clean-up applies the same
test to every combination it forms. An input that expires while a spill is pending and
could still complete a missing result is *retired* rather than dropped: kept (and counted)
until the clean-up, or written with its group's next spill (docs/spill.md, "Windows").

Only append mode, ``[RANGE w]`` and unbounded windows, and insertions are supported; the
rest is refused by :func:`check_query` with the reason.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
import re
import sys
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from adaptcq.engine import eq3_batch as eq3
from adaptcq.engine.codegen import compile_source, projection_source
from adaptcq.errors import AdaptcqError, OptionError
from adaptcq.query.logical import ColumnRef, LogicalQuery
from adaptcq.state.spill_store import BLOCKS, SpillError, block_of, stream_names
from adaptcq.stats.partitions import PartitionStatistics, partition_ids, partition_of

INF = math.inf
PARTITIONS_DEFAULT = 300  # state-spill.txt §6.1: "All input streams are partitioned into 300"
# Model bytes of missing subresults a clean-up keeps in memory before handing them over
# through disk (``_SentUp``): f × the budget, but not below this (writing and reading one
# back costs about 6 µs a subresult, and the model counts a subresult's rows as copies).
HANDOVER_MIN = 64 * 10**6
# Model bytes of merged groups a write-back clean-up holds, at least, before writing them
# (``SpillTree._writeback_limit``).
WRITEBACK_MIN = 4 * 10**6
# Clean up runs of partition groups as one batch join where their columns allow
# (``eq3_batch``); False: group by group in Python (the tests compare the two).
BATCH_CLEANUP = True
OUTPUT_ROWS = 65_536  # late results of a batch clean-up made Python rows at once

Tree = str | tuple  # a stream alias, or a tuple of two or more trees


# ----- the plan --------------------------------------------------------------------------
def parse_plan(text: str) -> Tree:
    """``"(((A, B, C), D), E)"`` -> ((("A", "B", "C"), "D"), "E"): nodes of two or more
    inputs, separated by commas. A missing or doubled comma, a trailing one, and any other
    misplaced token is refused with its position (column, from 1): ``((A B), C)`` and
    ``((A,, B), C)`` once read as ``((A, B), C)``."""
    tokens = [(m.group(), m.start() + 1) for m in _PLAN_TOKEN.finditer(text)]
    pos = 0

    def fail(why: str, at: int | None = None) -> ValueError:
        where = f" at column {at}" if at is not None else ""
        return ValueError(f"tree {text!r}: {why}{where}")

    def node() -> Tree:
        nonlocal pos
        if pos >= len(tokens):
            raise fail("ends early: a stream name or '(' is missing", len(text) + 1)
        tok, at = tokens[pos]
        pos += 1
        if tok in "),":
            raise fail(f"expected a stream name or '(', got {tok!r}", at)
        if tok != "(":
            return tok
        kids = [node()]
        while pos < len(tokens) and tokens[pos][0] != ")":
            tok, at = tokens[pos]
            if tok != ",":
                raise fail(f"expected ',' or ')' before {tok!r}", at)
            pos += 1
            kids.append(node())
        if pos >= len(tokens):
            raise fail("a '(' is never closed", len(text) + 1)
        pos += 1
        if len(kids) < 2:
            raise fail("a join takes at least two inputs", at)
        return tuple(kids)

    tree = node()
    if pos != len(tokens):
        raise fail(f"unexpected {tokens[pos][0]!r} after the tree", tokens[pos][1])
    return tree


# a parenthesis, a comma, or a name (a run of anything else but white space)
_PLAN_TOKEN = re.compile(r"[(),]|[^\s(),]+")


def plan_leaves(tree: Tree) -> list[str]:
    return [tree] if isinstance(tree, str) else [s for t in tree for s in plan_leaves(t)]


def plan_str(tree: Tree) -> str:
    return tree if isinstance(tree, str) else "(" + " ⋈ ".join(map(plan_str, tree)) + ")"


def check_plan(tree) -> Tree:
    """A plan given in Python (lists or tuples of two or more), as tuples; a string with
    parentheses or commas is the CLI's text (``parse_plan``), not a stream name."""
    if isinstance(tree, str):
        return parse_plan(tree) if any(c in tree for c in "(),") else tree
    if isinstance(tree, (tuple, list)) and len(tree) >= 2:
        return tuple(check_plan(t) for t in tree)
    raise ValueError(f"tree: a join takes at least two inputs, got {tree!r}")


def default_plan(query: LogicalQuery) -> Tree:
    """The operator tree ``--executor tree`` runs when none is given: an m-way operator over
    the streams of the largest attribute class, then, while streams remain, one operator
    joining the tree built so far with every remaining stream of the class (that the tree
    already has a column of) reaching most of them. The paper's query gives its plan
    ((A ⋈ B ⋈ C) ⋈ D) ⋈ E (Figure 15)."""
    order = {a: k for k, a in enumerate(query.aliases)}
    classes = [sorted({c.stream for c in cls}, key=order.get) for cls in query.classes]
    classes = [c for c in classes if len(c) >= 2]
    if not classes:
        raise ValueError("the query has no join predicate")
    first = max(classes, key=len)
    tree: Tree = tuple(first) if len(first) > 1 else first[0]
    have = set(first)
    while len(have) < len(query.aliases):
        best = None
        for cls in classes:
            if not have & set(cls):
                continue
            new = [s for s in cls if s not in have]
            if new and (best is None or len(new) > len(best)):
                best = new
        if best is None:  # a predicate of two columns of one class only within the tree
            raise ValueError("the join graph is not connected")
        tree = (tree, *best)
        have |= set(best)
    return tree


@dataclass(eq=False)
class Operator:
    """One stateful operator: an m-way symmetric hash join over its children (stream
    aliases or operators), partitioned on one column of its inputs (state-spill.txt §2.1).

    ``streams`` is the layout of its results (composite tuples): its children's streams in
    child order. ``id`` numbers operators bottom-up, as the paper's Join_1, Join_2, ...
    """

    id: int
    children: list
    streams: tuple[str, ...]
    part_class: frozenset
    key_slots: list = field(default_factory=list)    # per child: (component, column)
    probes: list = field(default_factory=list)       # per child: [(child j, checks)]
    joiners: list = field(default_factory=list)      # per child: components -> result
    parent: Operator | None = None
    index_in_parent: int = 0
    depth: int = 0                                    # distance from the root
    parts: dict = field(default_factory=dict)         # pid -> Group (the memory generation)
    below: list = field(default_factory=list)         # operators strictly below
    trace_slots: list = field(default_factory=list)   # (operator, component, column)
    equalities: list = field(default_factory=list)   # (child, ColumnRef, child, ColumnRef)
    unit: list = field(default_factory=list)          # per child: model bytes per input

    @property
    def label(self) -> str:
        return f"Join{self.id}"

    def child_streams(self, k: int) -> tuple[str, ...]:
        c = self.children[k]
        return (c,) if isinstance(c, str) else c.streams

    def describe(self) -> str:
        kids = ", ".join(c if isinstance(c, str) else c.label for c in self.children)
        col = sorted(map(str, self.part_class))
        return f"{self.label} = ⋈({kids}) partitioned on {' = '.join(col)}"


class Group:
    """The memory generation of one partition group: per child, key -> {entry id: (exp,
    composite)}; ``retired``: inputs past their window kept for a pending clean-up."""

    __slots__ = ("counts", "retired", "states")

    def __init__(self, m: int):
        self.states: list[dict] = [{} for _ in range(m)]
        self.counts = [0] * m
        self.retired: list[tuple[int, tuple]] = []   # (child, (exp, composite))

    def entries(self, k: int):
        for bucket in self.states[k].values():
            yield from bucket.values()

    def held(self) -> list[list[tuple]]:
        """Per child, every (exp, composite) the group holds: its entries, then the
        retired ones (what a spill writes, a merge takes, an eviction drops)."""
        out = [list(self.entries(k)) for k in range(len(self.states))]
        for k, entry in self.retired:
            out[k].append(entry)
        return out


def build_operators(query: LogicalQuery, tree: Tree) -> list[Operator]:
    """The operators of ``tree``, bottom-up (the root last), wired: partition columns,
    probe orders with the join checks each step applies, and lineage slots."""
    ops: list[Operator] = []

    def build(t: Tree) -> Operator | str:
        if isinstance(t, str):
            return t
        kids = [build(c) for c in t]
        streams = tuple(s for c in kids for s in ((c,) if isinstance(c, str) else c.streams))
        kid_streams = [{c} if isinstance(c, str) else set(c.streams) for c in kids]
        common = [cls for cls in query.classes
                  if all(any(r.stream in ks for r in cls) for ks in kid_streams)]
        if not common:
            raise ValueError(
                f"operator {plan_str(t)} has no join column shared by all its inputs: a "
                "partition group needs one (state-spill.txt §2.1); split it into smaller "
                "operators, e.g. binary ones")
        op = Operator(0, kids, streams, common[0])
        for k, c in enumerate(kids):
            if not isinstance(c, str):
                c.parent, c.index_in_parent = op, k
        ops.append(op)
        return op

    root = build(tree)
    if isinstance(root, str):
        raise ValueError("the tree needs at least one join")  # noqa: TRY004
    for k, op in enumerate(ops, 1):
        op.id = k
    for op in ops:
        _wire(query, op)
        op.depth = 0 if op.parent is None else None
    for op in reversed(ops):  # the root first: depths from the top
        for c in op.children:
            if not isinstance(c, str):
                c.depth = op.depth + 1
    for op in ops:
        below, todo = [], [c for c in op.children if not isinstance(c, str)]
        while todo:
            c = todo.pop()
            below.append(c)
            todo += [g for g in c.children if not isinstance(g, str)]
        op.below = below
        # Lineage (§3.2.2, Algorithm 1): where each operator at or below this one finds its
        # partition value in this operator's results.
        op.trace_slots = [(o, *_slot_in(query, op.streams, o.part_class))
                          for o in [op, *below]]
    return ops


def _slot_in(query: LogicalQuery, streams: Sequence[str], cls) -> tuple[int, int]:
    ref = min((r for r in cls if r.stream in streams), key=lambda r: streams.index(r.stream))
    return streams.index(ref.stream), query.columns[ref.stream].index(ref.column)


def _wire(query: LogicalQuery, op: Operator) -> None:
    m = len(op.children)
    comps = [op.child_streams(k) for k in range(m)]
    op.key_slots = [_slot_in(query, comps[k], op.part_class) for k in range(m)]
    # Every equality between two different children, except the partition column's own
    # (equal keys already guarantee it), is checked when its second side is bound.
    op.equalities = []
    for x, y in query.equalities():
        kx = next((k for k in range(m) if x.stream in comps[k]), None)
        ky = next((k for k in range(m) if y.stream in comps[k]), None)
        if kx is None or ky is None or kx == ky:
            continue
        if x in op.part_class and y in op.part_class:
            continue
        op.equalities.append((kx, x, ky, y))
    eqs = [(kx, comps[kx].index(x.stream), query.columns[x.stream].index(x.column),
            ky, comps[ky].index(y.stream), query.columns[y.stream].index(y.column))
           for kx, x, ky, y in op.equalities]
    op.probes, op.joiners = [], []
    for k in range(m):
        order = [k] + [j for j in range(m) if j != k]
        steps = []
        for pos in range(1, m):
            j = order[pos]
            bound = order[:pos]
            checks = []
            for a, ia, ca, b, ib, cb in eqs:
                if a == j and b in bound:
                    checks.append((bound.index(b), ib, cb, ia, ca))
                elif b == j and a in bound:
                    checks.append((bound.index(a), ia, ca, ib, cb))
            steps.append((j, tuple(checks)))
        op.probes.append(steps)
        # The result in child order from the components in probe order: c[1] + c[0] + ...
        op.joiners.append(eval("lambda c: " + " + ".join(
            f"c[{order.index(c)}]" for c in range(m))))


def max_time(comp: tuple) -> float:
    return max(rec[1] for rec in comp)


# ----- the executor ----------------------------------------------------------------------
@dataclass
class SpillCounters:
    spills: int = 0              # spill events
    groups_spilled: int = 0      # partition groups written
    spilled_bytes: int = 0       # model bytes spilled (§2.2; write-backs: writeback_bytes)
    spilled_inputs: int = 0      # stored inputs written (write-backs included)
    file_bytes: int = 0          # bytes on disk (compressed Arrow IPC; write-backs included)
    cleanups: int = 0
    cleanup_seconds: float = 0.0
    end_cleanup_seconds: float = 0.0  # of them, the end of input's (``final``)
    late_results: int = 0
    retired: int = 0             # inputs kept past their window for a pending clean-up
    handover_flushes: int = 0    # clean-up hand-overs written to disk (``_SentUp``)
    writebacks: int = 0          # merged groups a clean-up wrote back to disk (``keep``)
    writeback_bytes: int = 0     # their model bytes
    batch_runs: int = 0          # runs of groups a clean-up merged as one batch join
    python_runs: int = 0         # runs it merged group by group (columns unfit for Arrow)
    first_pending: float | None = None   # event time of the oldest spill not cleaned up


class SpillTree:
    """The operator-tree executor (``--executor tree``): state-spill.txt's plans, with
    partition groups, spilling and clean-up. See the module docstring."""

    name = "tree"

    def __init__(self, query: LogicalQuery, mode: str = "append", tree: Tree | None = None,
                 out: list | None = None, time_unit: float = 1.0,
                 partitions: int = PARTITIONS_DEFAULT, store=None, late_column: bool = False,
                 sample: float = 1.0, seed: int = 0):
        check_query(query, mode)
        if not isinstance(partitions, int) or partitions < 1:
            raise OptionError(f"partitions must be a positive whole number, got {partitions!r}")
        self.query = query
        self.mode = mode
        self.out = [] if out is None else out
        self._emit = self.out.append
        self.tree = check_plan(tree) if tree is not None else default_plan(query)
        leaves = plan_leaves(self.tree)
        if sorted(leaves) != sorted(query.aliases):
            raise ValueError(f"tree {plan_str(self.tree)} must hold each of "
                             f"{', '.join(query.aliases)} exactly once")
        self.ops = build_operators(query, self.tree)
        self.root = self.ops[-1]
        self.partitions = partitions
        self.time_unit = time_unit
        self.w = {s.alias: (INF if s.window.kind == "unbounded" else
                            s.window.in_units(time_unit))
                  for s in query.streams}
        self.store = store
        self.late_column = late_column
        self.stats = PartitionStatistics(len(self.ops), partitions)
        self.counters = SpillCounters()
        self.sample = float(sample)
        self._rng = random.Random(seed)
        self.controller = None       # a spill policy: check(executor, ts) every k updates
        self._check_every = 0
        self._until_check = 0
        self._heap: list = []        # (exp, eid, operator id, pid, child, key) of subresults
        self._eid = itertools.count(1)
        self.now = -INF
        # Where each stream enters: (operator, child index); its partition column.
        self._entry = {}
        for op in self.ops:
            for k, c in enumerate(op.children):
                if isinstance(c, str):
                    self._entry[c] = (op, k)
        # Model tuple sizes (state-spill.txt §2.2): measured per stream on a sample of rows.
        self._row_bytes = {a: _RowSize() for a in query.aliases}
        self._refresh_units()
        self.stems = [_Rows(a) for a in query.aliases]
        self._stem_of = dict(zip(query.aliases, self.stems, strict=True))  # alias -> _Rows
        self.inserts = [self._inserter(i, a) for i, a in enumerate(query.aliases)]
        self.deletes = [self._deleter(i, a) for i, a in enumerate(query.aliases)]
        # Pending spills (for retirement and "complete until"): per operator, the earliest
        # spill time and the largest exp written; per (operator, pid), the largest exp.
        self._pending_t = {op.id: INF for op in self.ops}
        self._pending_exp = {op.id: -INF for op in self.ops}
        self._disk_exp: dict[tuple[int, int], float] = {}
        # The spill events since the last clean-up, (row id of the last insertion, event
        # time, ((operator id, pid, latest window end), ...)): what a rebuild of this
        # tree from its rows replays (``replay_spill``, ``replay``).
        self.journal: list[tuple] = []
        self._rid = -1
        self._project = self._compile_projection()
        self._shapes: dict = {}  # operator id -> its eq3_batch.Shape
        self._late = None        # (late projection by column, its columns), on first use
        # Where a batch clean-up's late results may leave as Arrow tables (the SELECT
        # columns, ``_sign``, ``_ts`` and ``_late`` when ``late_column``), set by a runtime
        # that writes Arrow (``runtime.local``); None: as output rows through the emit
        # function, like every other result. Only for a SELECT of plain columns.
        self.emit_table = None
        self._late_columns = self._plain_outputs()

    # ----- construction ------------------------------------------------------------------
    def _compile_projection(self):
        q, streams = self.query, self.root.streams

        def resolve(ref: ColumnRef) -> str:
            return f"c[{streams.index(ref.stream)}][2][{q.columns[ref.stream].index(ref.column)}]"

        late = ", late" if self.late_column else ""
        return compile_source("project", "<operator tree projection>", "\n".join([
            "def project(comps, ts, emit, late=False):",
            "    for c in comps:",
            f"        emit(({projection_source(q, resolve)}1, ts{late}))", ""]), {}).fn

    def _compile_late_projection(self):
        """The projection of late results given by column (``_emit_missing``): the
        SELECT values from the value lists of just the columns it reads, so that a batch
        clean-up's results become output rows without becoming composites. Returns the
        function and the spill-format names of those columns."""
        q = self.query
        names: list[str] = []

        def resolve(ref: ColumnRef) -> str:
            name = f"{ref.stream}.{ref.column}"
            if name not in names:
                names.append(name)
            return f"v{names.index(name)}"

        values = projection_source(q, resolve)
        late = ", True" if self.late_column else ""
        unpack = ", ".join(f"v{i}" for i in range(len(names)))
        head = (f"    for ({unpack},), ts in zip(zip(*cols), times):" if names
                else "    for ts in times:")
        fn = compile_source("project_late", "<operator tree late projection>", "\n".join([
            "def project_late(cols, times, emit):", head,
            f"        emit(({values}1, ts{late}))", ""]), {}).fn
        return fn, names

    def _plain_outputs(self) -> list[tuple[str, str]] | None:
        """(output name, spill-format column) per SELECT item when every item is a
        column; None when one is an expression (late results then go through the
        compiled projection)."""
        import sqlglot.expressions as exp
        out = []
        for o in self.query.outputs:
            if not isinstance(o.expr, exp.Column):
                return None
            out.append((o.name, f"{o.expr.table}.{o.expr.name}"))
        return out

    def _late_table(self, part: pa.Table) -> pa.Table:
        """Late results (rows of a batch clean-up's root term) as an output table: the
        SELECT columns as stored (NULL when absent from every input), ``_sign`` 1,
        ``_ts`` their newest component's time, ``_late`` true."""
        n = part.num_rows
        have = set(part.column_names)
        cols = [part[c] if c in have else pa.nulls(n) for _, c in self._late_columns]
        names = [name for name, _ in self._late_columns]
        cols += [pa.array(np.ones(n, np.int8)), part["_t"]]
        names += ["_sign", "_ts"]
        if self.late_column:
            cols.append(pa.array(np.ones(n, np.bool_)))
            names.append("_late")
        return pa.table(cols, names=names)

    def set_emit(self, emit) -> None:
        self._emit = emit

    def set_controller(self, controller, every: int) -> None:
        """A spill policy's ``check(executor, ts)`` runs every ``every`` insertions."""
        self.controller = controller
        self._check_every = self._until_check = int(every)

    # ----- updates ---------------------------------------------------------------------
    def insert(self, i: int, rid: int, row: tuple, ts) -> None:
        self.inserts[i](rid, row, ts)

    def delete(self, i: int, rid: int, ts) -> None:
        self.deletes[i](rid, ts)

    def _inserter(self, i: int, alias: str):
        op, k = self._entry[alias]
        w = self.w[alias]
        rows = self.stems[i].rows
        size = self._row_bytes[alias]
        arrive = self._arrive

        def insert(rid: int, row: tuple, ts) -> None:
            self.now = ts
            self._rid = rid
            rows[rid] = row
            if rid & 1023 == 0:
                size.update(row)
            arrive(op, k, rid, ts + w, ((rid, ts, row),), ts)
            if self.controller is not None:
                self._until_check -= 1
                if self._until_check <= 0:
                    self._until_check = self._check_every
                    self.controller.check(self, ts)
        return insert

    def _deleter(self, i: int, alias: str):
        op, k = self._entry[alias]
        rows = self.stems[i].rows
        kcol = op.key_slots[k][1]

        def delete(rid: int, ts) -> None:
            row = rows.pop(rid, None)
            if row is not None:
                key = row[kcol]
                if key is not None and key == key:  # noqa: PLR0124 (not a NaN)
                    self._expire(op, partition_of(key, self.partitions), k, key, rid)
            self._purge(ts)
        return delete

    def _arrive(self, op: Operator, k: int, eid: int, exp, comp: tuple, ts,
                emit: bool = True) -> None:
        """An input ``comp`` (composite over child k's streams, valid until ``exp``) at
        operator ``op``: join it with the other children's inputs in its partition group,
        store it, and pass the results on (to the parent, or out at the root)."""
        ci, cc = op.key_slots[k]
        key = comp[ci][2][cc]
        if key is None or key != key:  # noqa: PLR0124 (a NaN)
            return  # NULL (and NaN) never joins, and is never stored
        pid = partition_of(key, self.partitions)
        g = op.parts.get(pid)
        if g is None:
            g = op.parts[pid] = Group(len(op.children))
        results = None
        partial = [(exp, (comp,))]
        for j, checks in op.probes[k]:
            bucket = g.states[j].get(key)
            if not bucket:
                partial = None
                break
            nxt = []
            for pexp, comps in partial:
                for e2, c2 in bucket.values():
                    if e2 < ts:
                        continue  # past its window: purged at its expiry
                    if checks and not _passes(checks, comps, c2):
                        continue
                    nxt.append((pexp if pexp < e2 else e2, comps + (c2,)))  # noqa: FURB136 (hot)
            if not nxt:
                partial = None
                break
            partial = nxt
        if partial is not None:
            join = op.joiners[k]
            results = [(e, join(comps)) for e, comps in partial]
        self._put(op, g, pid, k, key, eid, exp, comp)
        if not results:
            return
        st = self.stats
        st.local_output(op.id, pid, len(results))
        parent = op.parent
        if parent is None:
            if self.sample > 0:
                for _, c in results:
                    if self._rng.random() < self.sample:
                        st.trace_output(op.trace_slots, c, self.partitions, 1 / self.sample)
            if emit:
                self._project([c for _, c in results], ts, self._emit)
            return
        if self.sample > 0:
            unit = sum(self._unit_of(s) for s in op.streams)
            for _, c in results:
                if self._rng.random() < self.sample:
                    st.trace_inter(op.trace_slots, c, self.partitions, unit / self.sample)
        pk = op.index_in_parent
        for e, c in results:
            self._arrive(parent, pk, next(self._eid), e, c, ts, emit)

    # ----- expiry ----------------------------------------------------------------------
    def _purge(self, ts) -> None:
        """Drop the stored subresults whose window ended at or before ``ts`` (their first
        component's deletion is being processed)."""
        heap = self._heap
        ops = self.ops
        while heap and heap[0][0] <= ts:
            _, eid, oid, pid, k, key = heapq.heappop(heap)
            op = ops[oid - 1]
            child = op.children[k]
            if isinstance(child, str):  # a base row a clean-up put back (``_store``)
                self._stem_of[child].rows.pop(eid, None)
            self._expire(op, pid, k, key, eid)

    def _expire(self, op: Operator, pid: int, k: int, key, eid: int) -> None:
        g = op.parts.get(pid)
        if g is None:
            return
        bucket = g.states[k].get(key)
        if not bucket:
            return
        entry = bucket.pop(eid, None)
        if entry is None:
            return
        if not bucket:
            del g.states[k][key]
        if self._needed(op, pid, entry):
            g.retired.append((k, entry))  # still counted: it is still held
            self.counters.retired += 1
            return
        g.counts[k] -= 1

    def _needed(self, op: Operator, pid: int, entry) -> bool:
        """Could this input, past its window, still complete a result the clean-up of a
        pending spill must produce? With its own partition's spilled generations when it
        arrived before their last input expired; with missing subresults from below when
        it was alive after a spill there began (docs/spill.md, "Windows")."""
        if self.counters.first_pending is None:
            return False
        exp, comp = entry
        t = max_time(comp)
        if t <= self._disk_exp.get((op.id, pid), -INF):
            return True
        lo = min((self._pending_t[b.id] for b in op.below), default=INF)
        hi = max((self._pending_exp[b.id] for b in op.below), default=-INF)
        return exp >= lo and t <= hi

    # ----- memory (state-spill.txt §2.2) -------------------------------------------------
    def _unit_of(self, stream: str) -> float:
        return self._row_bytes[stream].get()

    def _refresh_units(self) -> None:
        for op in self.ops:
            op.unit = [sum(self._unit_of(s) for s in op.child_streams(k))
                       for k in range(len(op.children))]

    def group_bytes(self, op: Operator, g: Group) -> float:
        """S = Σ u_x · s_x over the group's children (§2.2): u_x the model size of one
        input of child x (a subresult counts the sum of its components' sizes)."""
        return sum(u * n for u, n in zip(op.unit, g.counts))

    def memory_usage(self) -> float:
        """The state size of the whole tree by §2.2's model, in bytes."""
        self._refresh_units()
        return sum(self.group_bytes(op, g) for op in self.ops for g in op.parts.values())

    def candidates(self) -> list[tuple]:
        """Every partition group in memory with its statistics: (operator id, pid, depth,
        model bytes, local output, global output, intermediate bytes)."""
        self._refresh_units()
        st = self.stats
        out = []
        for op in self.ops:
            for pid, g in op.parts.items():
                size = self.group_bytes(op, g)
                if size > 0:
                    out.append((op.id, pid, op.depth, size, st.local[op.id - 1][pid],
                                st.output[op.id - 1][pid], st.inter[op.id - 1][pid]))
        return out

    # ----- spilling (§3) -----------------------------------------------------------------
    def spill(self, groups: Iterable[tuple[int, int]], ts=None) -> float:
        """Write these (operator id, pid) groups to disk as one spill event and drop them
        from memory; returns the model bytes freed. Nothing is dropped unless the event's
        file and manifest were written (a failing disk raises ``SpillError`` and leaves
        memory as it was)."""
        if self.store is None:
            raise OptionError("spilling needs a spill store (a folder for the spilled state)")
        ts = self.now if ts is None else ts
        self._refresh_units()
        batch = []
        for oid, pid in sorted(set(groups)):
            op = self.ops[oid - 1]
            g = op.parts.get(pid)
            if g is None:
                continue
            per_child = g.held()
            if not any(per_child):
                continue
            top = max((e for entries in per_child for e, _ in entries), default=-INF)
            batch.append((op, pid, per_child, self.group_bytes(op, g), top))
        if not batch:
            return 0.0
        event = self.store.write_event(
            [(op.id, pid, [[c for _, c in entries] for entries in per_child],
              [op.child_streams(k) for k in range(len(op.children))], size, top)
             for op, pid, per_child, size, top in batch], ts)
        freed = 0.0
        c = self.counters
        for op, pid, _, size, top in batch:
            c.spilled_inputs += self._drop(op, pid, top, ts)
            freed += size
        self.journal.append((self._rid, ts, tuple((op.id, pid, top)
                                                  for op, pid, _, _, top in batch)))
        c.spills += 1
        c.groups_spilled += len(batch)
        c.spilled_bytes += int(freed)
        c.file_bytes += event.bytes
        return freed

    def _drop(self, op: Operator, pid: int, top, ts) -> int:
        """Partition group (op, pid) went to disk at ``ts`` with inputs valid until at most
        ``top``: drop it from memory (its base rows leave the stream's row map too) and
        mark it pending for the clean-up. Returns the inputs dropped."""
        n = self._evict(op, pid)
        self._mark(op.id, pid, top, ts)
        return n

    def _evict(self, op: Operator, pid: int) -> int:
        """Drop group (op, pid) from memory, its base rows from the stream's row map too;
        returns the inputs dropped."""
        g = op.parts.pop(pid, None)
        n = 0
        if g is not None:
            for child, held in zip(op.children, g.held(), strict=True):
                n += len(held)
                if isinstance(child, str):
                    rows = self._stem_of[child].rows
                    for _, comp in held:
                        rows.pop(comp[0][0], None)
        return n

    def _mark(self, oid: int, pid: int, top, ts) -> None:
        """Group (oid, pid) is pending for the clean-up since ``ts``, with inputs valid
        until at most ``top``: what ``_needed`` decides retirement by."""
        self._disk_exp[(oid, pid)] = max(self._disk_exp.get((oid, pid), -INF), top)
        self._pending_t[oid] = min(self._pending_t[oid], ts)
        self._pending_exp[oid] = max(self._pending_exp[oid], top)
        first = self.counters.first_pending
        self.counters.first_pending = ts if first is None else min(first, ts)

    def replay_spill(self, ts, groups: Sequence[tuple]) -> None:
        """A spill event of the tree this one is rebuilt from, replayed: its groups
        ((operator id, pid, latest window end), ...) are on disk already (the store holds
        them), so they only leave memory (``replay``)."""
        for oid, pid, top in groups:
            self._drop(self.ops[oid - 1], pid, top, ts)
        self.journal.append((self._rid, ts, tuple(groups)))

    def pending(self) -> bool:
        return self.counters.first_pending is not None

    def drop_memory(self) -> None:
        """The end of the input with nothing pending on disk: the state in memory can join
        no later row (none will come), so it goes (a Spark group then keeps no rows for a
        rebuild: ``runtime.spark_group``)."""
        if self.pending():
            raise AdaptcqError("internal: the memory generations of a tree with spills "
                               "pending are needed by its clean-up")
        for op in self.ops:
            for pid in list(op.parts):
                self._evict(op, pid)

    def pending_ended_bytes(self, now) -> float:
        """Model bytes on disk whose inputs are all past their window at ``now``: what a
        clean-up now would merge and drop."""
        return self.store.ended_bytes(now) if self.store is not None else 0.0

    def pending_live_bytes(self, now) -> float:
        """Model bytes on disk whose inputs are not all past their window at ``now``: what
        a clean-up now would bring back into memory."""
        return self.store.live_bytes(now) if self.store is not None else 0.0

    # ----- clean-up (§4) -----------------------------------------------------------------
    def cleanup(self, now=None, final: bool = False, log: list | None = None,
                keep: float | None = None) -> int:
        """Produce every result the spills held back, exactly once, and merge the spilled
        generations back (§4: Eq. 3 per partition group, operators from the leaves up with
        End-of-Cleanup control tuples). ``final``: at the end of the input, nothing is kept
        in memory afterwards; otherwise (a barrier between two updates) each merged group
        becomes the memory generation, without its inputs past their window. Late results
        go to the output with ``_ts`` = their newest component's time (and ``_late``).
        ``log`` receives the control flow: ("start", Join_k), ("eoc", Join_k -> Join_p).
        ``keep`` (not final; beyond the paper): the model bytes the tree may hold in memory
        afterwards; a merged group that does not fit goes back to disk as one generation
        (:class:`_WriteBack`) — what lets a windowed run drop its ended spilled state
        while memory stays full. Returns the number of late results."""
        steps = self.cleanup_steps(now, final, log, keep)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                return done.value

    def cleanup_steps(self, now=None, final: bool = False, log: list | None = None,
                      keep: float | None = None):
        """:meth:`cleanup` a step at a time: a generator that pauses after each partition
        group cleaned up in Python, after each ``OUTPUT_ROWS`` late results of a batch
        clean-up and after each run, so that a caller can pass on the late results emitted
        so far (an iterator over the output otherwise holds them all until the end);
        returns the number of late results. Its CPU time, without the caller's between
        steps, goes to the counters."""
        inner = self._cleanup(now, final, log, keep)
        c = self.counters
        spent = 0.0
        t0 = time.process_time()
        while True:
            try:
                next(inner)
            except StopIteration as done:
                spent += time.process_time() - t0
                c.cleanup_seconds += spent
                if final:
                    c.end_cleanup_seconds += spent
                return done.value
            spent += time.process_time() - t0
            yield
            t0 = time.process_time()

    def _cleanup(self, now, final: bool, log: list | None, keep: float | None):
        now = self.now if now is None else now
        sent = _SentUp(self, self._handover_limit())
        merged = list(self.store.events) if self.store is not None else []
        spilled = self.store.groups() if self.store is not None else {}
        self._check_spilled(spilled)
        back = None if final or keep is None else \
            _WriteBack(self, now, keep, self._writeback_limit(), spilled)
        waiting = {op.id: sum(not isinstance(c, str) for c in op.children) for op in self.ops}
        ready = deque(op for op in self.ops if waiting[op.id] == 0)
        late = 0
        while ready:
            op = ready.popleft()
            if log is not None:
                log.append(("start", op.label))
            late += yield from self._cleanup_operator(op, spilled.get(op.id, {}), sent, now,
                                                      final, back)
            if back is not None:
                back.flush()
            if op.parent is not None:
                # End-of-Cleanup: no more subresults from this operator (§4.2).
                if log is not None:
                    log.append(("eoc", f"{op.label} -> {op.parent.label}"))
                waiting[op.parent.id] -= 1
                if waiting[op.parent.id] == 0:
                    ready.append(op.parent)
        sent.close()
        failed = None
        if self.store is not None:
            try:
                self.store.clear(merged)
            except SpillError as e:  # merged all the same: finish, then say so
                failed = e
        c = self.counters
        c.cleanups += 1
        c.handover_flushes += sent.flushes
        c.first_pending = None
        c.retired = 0
        self._disk_exp.clear()
        self.journal.clear()  # a rebuild replays from here without spills (``replay``)
        for op in self.ops:
            self._pending_t[op.id], self._pending_exp[op.id] = INF, -INF
            for g in op.parts.values():
                for k, _ in g.retired:
                    g.counts[k] -= 1
                g.retired.clear()
        if back is not None and back.marks:
            # The groups written back are pending again, from now: a spill event of this
            # row for the journal (a rebuild drops them from memory here, ``replay``).
            for oid, pid, top in back.marks:
                self._mark(oid, pid, top, now)
            self.journal.append((self._rid, now, tuple(back.marks)))
            c.writebacks += len(back.marks)
            c.writeback_bytes += int(back.written)
        if back is not None and back.failed is not None:
            failed = failed or back.failed
        if sent.failed is not None and failed is None:
            failed = SpillError(
                f"a clean-up could not write its hand-over of missing subresults to disk "
                f"({sent.failed}); it held them in memory instead and finished: every late "
                "result was produced once and the spilled generations were merged")
        if failed is not None:
            # The clean-up is complete and consistent (groups the disk refused to take
            # back are in memory, over ``keep``); now say the disk failed.
            raise failed
        return late

    def _check_spilled(self, spilled: dict) -> None:
        """Every spilled group (``SpillStore.groups``) must be of an operator of this plan
        and a pid below its partition count: a spill folder whose files were written under
        another plan (its manifest edited by hand) is refused naming a file, before any
        result is produced."""
        n = len(self.ops)
        for oid, pids in spilled.items():
            if not 1 <= oid <= n:
                where, why = next(iter(pids.values()))[0][0], \
                    f"operator {oid}, and the plan {plan_str(self.tree)} has {n}"
            else:
                pid = max(pids)
                if pid < self.partitions:
                    continue
                where, why = pids[pid][0][0], (f"partition id {pid} of operator {oid}, and "
                                               f"there are {self.partitions} partitions")
            raise SpillError(f"spill file {self.store.directory / where} holds a partition "
                             f"group of {why}: it was not spilled under this plan; the "
                             "spilled results cannot be produced")

    def _handover_limit(self) -> float:
        """Model bytes of missing subresults a clean-up holds in memory before writing them
        to disk: at least ``HANDOVER_MIN`` (also without a controller, as in ``adaptcq
        cleanup``)."""
        return self._freed_at_least(HANDOVER_MIN)

    def _writeback_limit(self) -> float:
        """Model bytes of merged groups a write-back holds before writing them: at least
        ``WRITEBACK_MIN`` (a fixed overhead: each write is a file, an fsync and a compressed
        batch; under a 1 MB budget, f × M alone cost a quarter more clean-up CPU than 4 MB
        in ``bench.spill perf``)."""
        return self._freed_at_least(WRITEBACK_MIN)

    def _freed_at_least(self, floor: float) -> float:
        """What a spill frees (the spill fraction of the budget, f × M), but at least
        ``floor``; ``floor`` without a controller."""
        ctl = self.controller
        budget, fraction = getattr(ctl, "budget", None), getattr(ctl, "fraction", None)
        if budget and fraction:
            return max(float(budget) * float(fraction), float(floor))
        return float(floor)

    def _cleanup_operator(self, op: Operator, disk: dict, sent: _SentUp, now,
                          final: bool, back: _WriteBack | None = None):
        """One operator's clean-up, a run of partition ids at a time (about
        ``DECODE_ROWS`` spilled rows, cut from the spill events' batches in block order),
        with the missing subresults its children handed over, from memory or disk. A run
        goes through Eq. 3 as a batch join (``eq3_batch``) when its columns allow, else
        group by group in Python (``_cleanup_group``); a generator pausing after each run
        (or group), returning the late results' count."""
        handed = sent.take(op.id)
        from_below = handed.counts()  # rows per pid
        by_block: dict[int, list[int]] = {}
        for pid in sorted(set(disk) | set(from_below)):
            by_block.setdefault(block_of(pid, BLOCKS), []).append(pid)
        order = {ev["file"]: i for i, ev in enumerate(self.store.events)} \
            if self.store is not None else {}
        late = 0
        for pids, slices in _runs_of(self.store, [by_block[b] for b in sorted(by_block)],
                                     disk, from_below, len(op.children)):
            # A run: its pids and, per batch of a spill event, the slice holding them.
            by_file: dict[str, list] = {}
            for ref, rows in slices.items():
                by_file.setdefault(ref[0], []).append(rows)
            spilled = [pa.Table.from_batches(by_file[f])
                       for f in sorted(by_file, key=order.__getitem__)]
            tables, items = handed.tables(pids), handed.python(pids)
            prepared = self._batch_inputs(op, pids, spilled, tables, items, sent)
            if prepared is None:  # not as a batch: group by group
                self.counters.python_runs += 1
                late += yield from self._cleanup_groups(op, pids, disk, slices, tables,
                                                        items, sent, now, final, back)
            else:
                self.counters.batch_runs += 1
                late += yield from self._cleanup_run(op, prepared, sent, now, final, back)
                yield
        return late

    def _cleanup_groups(self, op: Operator, pids: list[int], disk: dict, slices: dict,
                        tables: list, items: dict, sent: _SentUp, now, final: bool,
                        back: _WriteBack | None):
        """A run's groups one at a time in Python (``_cleanup_group``), its spilled slices
        and hand-over decoded into the engine's composites; pauses after each group. A
        group's generations keep their spill order: ``disk[pid]`` lists them so."""
        layouts = [op.child_streams(k) for k in range(len(op.children))]
        decoded = {ref: self.store.decode(rows, layouts, self.w)
                   for ref, rows in slices.items()}
        below: dict[int, dict[int, list]] = {pid: {k: list(v) for k, v in per.items()}
                                             for pid, per in items.items()}
        for t in tables:
            for pid, per_child in sent.codec().decode(t, layouts, self.w).items():
                got = below.setdefault(pid, {})
                for k, entries in enumerate(per_child):
                    if entries:
                        got.setdefault(k, []).extend(entries)
        late = 0
        for pid in pids:
            gens = [decoded[ref][pid] for ref in disk.get(pid, [])]
            dk = below.get(pid)
            late += self._cleanup_group(op, pid, gens, dk, now, final, sent, back)
            yield
        return late

    def _batch_inputs(self, op: Operator, pids: list[int], spilled: list, tables: list,
                      items: dict, sent: _SentUp):
        """A run's inputs for the batch join (``eq3_batch``): the spilled generations
        (Arrow, per spill event), the memory one, the hand-over (its Arrow ``tables`` and
        Python ``items``), per child, aligned: (memory groups, generations, hand-over per
        child, comparison types). None when the run's values cannot take the batch path:
        Python objects that do not make one Arrow type per column, or columns Arrow
        would not compare as the engine does (``eq3_batch.align``)."""
        if not BATCH_CLEANUP:
            return None
        shape = self._shape(op)
        m = shape.m
        mem = [(pid, op.parts[pid]) for pid in pids if pid in op.parts]
        codec = self.store if self.store is not None else sent.codec()
        encoded = []
        try:
            if mem:
                groups = []
                for pid, g in mem:
                    groups.append((op.id, pid, [[c for _, c in entries] for entries in
                                                g.held()], shape.layouts, 0.0, INF))
                encoded.append(pa.Table.from_batches([codec.rows_batch(groups)]))
            else:
                encoded.append(None)
            if items:
                encoded.append(pa.Table.from_batches([codec.rows_batch([
                    (op.id, pid, [[c for _, _, c in per.get(k, ())] for k in range(m)],
                     shape.layouts, 0.0, INF) for pid, per in sorted(items.items())])]))
        except SpillError:
            return None  # a value list Arrow cannot type: group by group
        mem_rows, below_rows = encoded[0], encoded[1:]
        inputs = [eq3.inputs(t, shape) for t in [*spilled, mem_rows, *below_rows, *tables]]
        if any(t is None for t in inputs):
            return None
        aligned = eq3.align(inputs, shape)
        if aligned is None:
            return None
        gens = aligned.tables[:len(spilled) + 1]
        below = aligned.tables[len(spilled) + 1:]
        deltas = [eq3.concat([b[k] for b in below]) for k in range(m)]
        return mem, gens, deltas, aligned.compare

    def _cleanup_run(self, op: Operator, prepared: tuple, sent: _SentUp, now, final: bool,
                     back: _WriteBack | None):
        """A run of partition groups cleaned up as one batch join, from its
        ``_batch_inputs``: missing results out or up, merged groups back to memory or
        disk, as ``_cleanup_group`` does for one group; a generator pausing after each
        slice of late results, returning their count."""
        mem, gens, deltas, compare = prepared
        m = len(op.children)
        late = 0
        # Each slice's results leave (out, or up to the parent) before the next is joined:
        # a run holds one slice's, not all of them.
        for t in eq3.missing(gens, deltas, self._shape(op), compare):
            late += yield from self._emit_missing(op, t, sent)
        for pid, g in mem:  # merged: the live inputs come back below, if the group stays
            if back is not None:
                back.release(op, pid, g)
            self._evict(op, pid)
        if not final:
            merged = eq3.merged_inputs(gens, deltas, m)
            if back is None:
                self._restore_rows(op, [eq3.still_valid(t, now) for t in merged])
            else:
                back.place_rows(op, merged)
        return late

    def _shape(self, op: Operator):
        got = self._shapes.get(op.id)
        if got is None:
            got = self._shapes[op.id] = eq3.shape_of(op, self.query, self.w)
        return got

    def _restore_rows(self, op: Operator, live: list) -> None:
        """Merged groups given as Arrow (per child, the inputs of many pids, ``pid``
        and ``_exp`` columns) become memory generations (``_restore``)."""
        shape = self._shape(op)
        per_pid: dict[int, list] = {}
        for k, t in enumerate(live):
            if t is None:
                continue
            ci, cc = op.key_slots[k]
            comps = eq3.composites(t, shape.layouts[k], shape.columns)
            for pid, exp, comp in zip(t["pid"].to_pylist(), eq3.ends(t), comps,
                                      strict=True):
                got = per_pid.get(pid)
                if got is None:
                    got = per_pid[pid] = [[] for _ in range(shape.m)]
                got[k].append((comp[ci][2][cc], exp, comp))
        for pid in sorted(per_pid):
            self._restore(op, pid, per_pid[pid])

    def _spill_rows(self, op: Operator, live: list) -> pa.Table:
        """The inputs ``live`` (per child, Arrow) in the spill format (``pid``, ``child``,
        every stream's columns, NULL where absent): what a write-back writes."""
        parts = []
        for k, t in enumerate(live):
            if t is None:
                continue
            t = t.set_column(t.column_names.index("pid"), "pid", t["pid"].cast(pa.int32()))
            parts.append(t.drop_columns(["_key", "_exp", "_t"])
                         .append_column("child", pa.array(np.full(t.num_rows, k, np.int16))))
        return _spill_format(pa.concat_tables(parts, promote_options="default"),
                             self.store.columns)

    def _emit_missing(self, op: Operator, t: pa.Table, sent: _SentUp):
        """Missing results of a batch clean-up (a slice of one term of Eq. 3 over a run
        of groups, Arrow): counted for the local statistics per group, a sample traced for
        the global ones, then out (late) at the root, else up to the parent. A generator
        pausing after each ``OUTPUT_ROWS`` late results (so that the caller of
        ``cleanup_steps`` can pass them on), returning how many it emitted."""
        st = self.stats
        streams, columns = op.streams, {s: self.query.columns[s] for s in op.streams}
        n = t.num_rows
        counts = np.bincount(t["pid"].to_numpy(), minlength=self.partitions)
        for pid in np.flatnonzero(counts).tolist():
            st.local_output(op.id, pid, int(counts[pid]))
        if self.sample > 0:  # the late results count for the global statistics too
            # the sample's traced columns only (the results hold every component's)
            chosen = None if self.sample >= 1 else pa.array(
                np.random.default_rng(self._rng.getrandbits(63)).random(n) < self.sample)
            names = [f"{streams[i]}.{columns[streams[i]][c]}" for _, i, c in op.trace_slots]
            have = set(t.column_names)
            keys = [None if name not in have else t[name] if chosen is None
                    else t[name].filter(chosen) for name in names]
            if op.parent is None:
                st.trace_batch("output", op.trace_slots, keys, self.partitions,
                               1 / self.sample)
            else:
                unit = sum(self._unit_of(s) for s in op.streams)
                st.trace_batch("inter", op.trace_slots, keys, self.partitions,
                               unit / self.sample)
        if op.parent is None and self.emit_table is not None and \
                self._late_columns is not None:
            for at in range(0, n, OUTPUT_ROWS):  # a slice at a time, as Arrow
                part = t.slice(at, OUTPUT_ROWS)
                self.counters.late_results += part.num_rows  # (counted as they leave)
                self.emit_table(self._late_table(part))
                yield
            return n
        if op.parent is None:
            if self._late is None:
                self._late = self._compile_late_projection()
            project, names = self._late
            have = set(t.column_names)
            for at in range(0, n, OUTPUT_ROWS):  # Python rows for a slice at a time
                part = t.slice(at, OUTPUT_ROWS)
                self.counters.late_results += part.num_rows
                project([part[c].to_pylist() if c in have else [None] * part.num_rows
                         for c in names], part["_t"].to_pylist(), self._emit)
                yield
            return n
        sent.add_table(op.parent, op.index_in_parent, t)
        return 0

    def _cleanup_group(self, op: Operator, pid: int, gens: list, dk: dict | None, now,
                       final: bool, sent: _SentUp, back: _WriteBack | None = None) -> int:
        """Eq. 3 over one partition group's generations (spilled ones, then the memory
        one), then the children's missing subresults against the merged inputs; the
        missing results go up (or out, late, at the root)."""
        m = len(op.children)
        g = op.parts.get(pid)
        mem = [[] for _ in range(m)] if g is None else \
            [[(exp, max_time(comp), comp) for exp, comp in entries] for entries in g.held()]
        gens.append(mem)
        missing: list = []
        # Each generation by key, with its time range: the earliest newest-time and the
        # latest window end of its inputs. Two inputs can only meet in a valid result when
        # each one's newest time is at most the other's end, so a generation is merged
        # with the earlier ones whose range reaches it (all of them for unbounded state;
        # a window's worth otherwise, which keeps a long windowed run's clean-up linear).
        keyed, lo, hi = [], [], []
        for gen in gens:
            kg = [_keyed(op, k, gen[k]) for k in range(m)]
            keyed.append([d for d, _, _ in kg])
            lo.append(min((t for _, t, _ in kg), default=INF))
            hi.append(max((e for _, _, e in kg), default=-INF))
        base = [{} for _ in range(m)]      # every generation before j, merged
        for k in range(m):
            _merge_into(base[k], keyed[0][k])
        for j in range(1, len(keyed)):
            d = keyed[j]
            if any(d):
                near = [i for i in range(j) if hi[i] >= lo[j]]
                view = base if len(near) == j else _merged([keyed[i] for i in near], m)
                for subset in _subsets(m, proper=True):
                    missing += _combine(op, subset, d, view)
            for k in range(m):
                _merge_into(base[k], d[k])
        if dk:
            missing += self._join_deltas(op, dk, keyed, lo, hi, base)
            for k, entries in dk.items():
                _merge_into(base[k], _keyed(op, k, entries)[0])
        if g is not None:
            if back is not None:
                back.release(op, pid, g)
            self._evict(op, pid)  # the live ones come back with the group, if it stays
        if not final:  # the merged group is the memory generation again
            live = [[(key, exp, comp) for key, entries in base[k].items()
                     for exp, _, comp in entries if exp >= now] for k in range(m)]
            if back is None:
                self._restore(op, pid, live)
            else:  # in memory if it fits, else straight from the merge to disk
                back.place(op, pid, live)
        if not missing:
            return 0
        st = self.stats
        st.local_output(op.id, pid, len(missing))
        if self.sample > 0:  # the late results count for the global statistics too
            unit = sum(self._unit_of(s) for s in op.streams)
            for _, _, comp in missing:
                if self._rng.random() < self.sample:
                    if op.parent is None:
                        st.trace_output(op.trace_slots, comp, self.partitions, 1 / self.sample)
                    else:
                        st.trace_inter(op.trace_slots, comp, self.partitions,
                                       unit / self.sample)
        if op.parent is None:
            self.counters.late_results += len(missing)
            for _, t, comp in missing:
                self._project([comp], t, self._emit, True)
            return len(missing)
        sent.add(op.parent, op.index_in_parent, missing)
        return 0

    def _join_deltas(self, op: Operator, dk: dict, keyed: list, lo: list, hi: list,
                     base: list) -> list:
        """The children's missing subresults joined with the group's stored inputs: every
        combination holding at least one of them, once. With missing subresults from one
        child only, they are taken in time order a chunk at a time, each against the
        generations whose time range reaches the chunk's."""
        m = len(op.children)
        have = sorted(k for k, entries in dk.items() if entries)
        out: list = []
        if len(have) != 1:
            d = [_keyed(op, k, dk.get(k, []))[0] for k in range(m)]
            for subset in eq3.subsets(have):
                out += _combine(op, subset, d, base)
            return out
        (k,) = have
        entries = sorted(dk[k], key=_newest)
        for at in range(0, len(entries), 4096):
            chunk = entries[at:at + 4096]
            t_lo = chunk[0][1]
            e_hi = max(e for e, _, _ in chunk)
            near = [i for i in range(len(keyed)) if hi[i] >= t_lo and lo[i] <= e_hi]
            view = base if len(near) == len(keyed) else _merged([keyed[i] for i in near], m)
            d = [_keyed(op, j, chunk)[0] if j == k else {} for j in range(m)]
            out += _combine(op, (k,), d, view)
        return out

    def _restore(self, op: Operator, pid: int, live: list) -> None:
        """A merged group (per child, its (key, exp, composite) inputs) becomes the memory
        generation of (op, pid)."""
        ng = Group(len(op.children))
        for k, items in enumerate(live):
            for key, exp, comp in items:
                self._store(op, ng, pid, k, key, exp, comp)
        if any(ng.counts):
            op.parts[pid] = ng

    def _store(self, op: Operator, g: Group, pid: int, k: int, key, exp, comp) -> None:
        if len(comp) == 1:  # a base row: its stream's row map again
            rid = comp[0][0]
            self._stem_of[op.children[k]].rows[rid] = comp[0][2]
            self._put(op, g, pid, k, key, rid, exp, comp)
            if exp != INF:
                # Its expiry, here too: after a rebuild (``replay``) the query's window
                # clock knows the row under another id (the tree's is the id spilled).
                heapq.heappush(self._heap, (exp, rid, op.id, pid, k, key))
            return
        self._put(op, g, pid, k, key, next(self._eid), exp, comp)

    def _put(self, op: Operator, g: Group, pid: int, k: int, key, eid: int, exp, comp
             ) -> None:
        """Store an input in its group; a subresult with a window end goes on the expiry
        heap (a base row is deleted by its stream's expiry)."""
        b = g.states[k].get(key)
        if b is None:
            g.states[k][key] = {eid: (exp, comp)}
        else:
            b[eid] = (exp, comp)
        g.counts[k] += 1
        if len(comp) > 1 and exp != INF:
            heapq.heappush(self._heap, (exp, eid, op.id, pid, k, key))

    # ----- checkpoints / protocol --------------------------------------------------------
    def plan_state(self) -> dict:
        return {"tree": self.tree}

    def load(self, i: int, rows: dict, times: dict | None = None) -> None:
        """Restore stream i's rows (and the subresults they take part in) without output;
        symmetric joins: the order of loading does not matter."""
        alias = self.query.aliases[i]
        op, k = self._entry[alias]
        for rid, row in rows.items():
            ts = (times or {}).get(rid, 0)
            self.stems[i].rows[rid] = row
            self._arrive(op, k, rid, ts + self.w[alias], ((rid, ts, row),), ts, emit=False)

    def state_tuples(self) -> int:
        return sum(sum(g.counts) for op in self.ops for g in op.parts.values())

    def state_bytes(self) -> int:
        return int(self.memory_usage())

    def describe(self) -> str:
        return "operator tree " + plan_str(self.tree) + "\n" + "\n".join(
            "  " + op.describe() for op in reversed(self.ops))


class _WriteBack:
    """The merged groups a clean-up while running sends back to disk (``cleanup(keep=)``,
    beyond the paper). A windowed run under a full budget never has room to take its
    spilled state back, so without this its spilled generations, ended or not, would pile
    up on disk until the end of the input, and the final clean-up would hold a whole run's
    generations of a group at once. With it a clean-up merges every group (Eq. 3: the late
    results), drops the inputs past their window, keeps in memory the groups that fit in
    ``room`` model bytes and writes each other group, whole, as one new generation:
    self-contained, like any spilled one, so later clean-ups stay exact. The groups are
    written a spill event per operator (or per ``limit`` model bytes), after their merge;
    they are marked pending once the clean-up has reset its markers.

    The room starts as ``keep`` less the memory groups no merge will touch: a group in
    memory with spilled generations is merged, so its bytes count as free from the start
    (otherwise the groups merged first would find the room taken by groups merged later).

    A write the disk refuses (``SpillError``) stops the writing back: those groups and
    every later one stay in memory, the clean-up finishes (nothing merged twice, nothing
    lost), and then the error is raised."""

    def __init__(self, tree: SpillTree, now, keep: float, limit: float, spilled: dict):
        self.tree, self.now = tree, now
        tree._refresh_units()
        self.credited = {(op.id, pid) for op in tree.ops for pid in spilled.get(op.id, ())
                         if pid in op.parts}
        self.room = keep - sum(tree.group_bytes(op, g) for op in tree.ops
                               for pid, g in op.parts.items()
                               if (op.id, pid) not in self.credited)
        self.limit = limit
        self.waiting: list[tuple] = []  # (operator, pid, per child inputs, model bytes)
        self.parts: list[tuple] = []    # merged groups as Arrow: write_batches' parts
        self.bytes = 0.0
        self.marks: list[tuple] = []
        self.written = 0.0
        self.failed: Exception | None = None

    def release(self, op: Operator, pid: int, g: Group) -> None:
        """Memory group (op, pid) is being merged: its bytes are free (unless counted so
        from the start)."""
        if (op.id, pid) not in self.credited:
            self.room += self.tree.group_bytes(op, g)

    def place(self, op: Operator, pid: int, live: list) -> None:
        """A merged group (per child, its (key, exp, composite) inputs still in their
        window): into memory if it fits in the room left (taking it), else back to disk
        with the next flush."""
        size = sum(u * len(items) for u, items in zip(op.unit, live, strict=True))
        if not size:
            return  # every input past its window: nothing to keep
        if size <= self.room or self.failed is not None:
            self.room -= size
            self.tree._restore(op, pid, live)
            return
        self.waiting.append((op, pid, live, size))
        self.bytes += size
        if self.bytes >= self.limit:
            self.flush()

    def place_rows(self, op: Operator, merged: list) -> None:
        """``place`` for the groups of a batch clean-up (per child, the merged inputs of
        many pids, as Arrow; those past their window now are dropped): pid by pid, in
        memory while they fit in the room left, the others written back as they are,
        without becoming Python objects."""
        tree = self.tree
        P = tree.partitions
        pids = [None if t is None else t["pid"].to_numpy() for t in merged]
        valid = [None if t is None else eq3.valid_rows(t, self.now) for t in merged]
        sizes = np.zeros(P)
        counts = np.zeros(P, dtype=np.int64)
        for u, p, v in zip(op.unit, pids, valid, strict=True):
            if p is not None:
                n = np.bincount(p[v], minlength=P)
                sizes += u * n
                counts += n
        keep, write = [], []
        # In block order, as the group-by-group clean-up places them.
        for pid in sorted(np.flatnonzero(counts).tolist(),
                          key=lambda p: (block_of(p, BLOCKS), p)):
            size = float(sizes[pid])
            if size <= self.room or self.failed is not None:
                self.room -= size
                keep.append(pid)
            else:
                write.append(pid)
        kept = np.zeros(P, dtype=bool)
        kept[keep] = True
        if keep:
            tree._restore_rows(op, [eq3.where(t, None if p is None else v & kept[p])
                                    for t, p, v in zip(merged, pids, valid, strict=True)])
        if not write:
            return
        live = [eq3.where(t, None if p is None else v & ~kept[p])
                for t, p, v in zip(merged, pids, valid, strict=True)]
        tops = _tops(live, P)
        self.parts += _block_parts(op.id, tree._spill_rows(op, live),
                                   lambda pid, _: (float(sizes[pid]), tops[pid]))
        self.bytes += float(sizes[write].sum())
        if self.bytes >= self.limit:
            self.flush()

    def flush(self) -> None:
        if not self.waiting and not self.parts:
            return
        tree = self.tree
        groups = []
        for op, pid, live, size in self.waiting:
            top = max((e for items in live for _, e, _ in items), default=-INF)
            groups.append((op.id, pid, [[c for _, _, c in items] for items in live],
                           [op.child_streams(k) for k in range(len(live))], size, top))
        parts = [*tree.store.encode(groups), *self.parts]
        try:
            # The manifest is rewritten once, when the clean-up ends (``SpillStore.clear``).
            event = tree.store.write_batches(parts, self.now, save=False)
        except SpillError as e:
            self.failed = e
            for op, pid, live, _ in self.waiting:
                tree._restore(op, pid, live)
            for oid, _, batch, _ in self.parts:  # back from Arrow into memory
                op = tree.ops[oid - 1]
                layouts = [op.child_streams(k) for k in range(len(op.children))]
                ci_cc = op.key_slots
                for pid, per_child in tree.store.decode(batch, layouts, tree.w).items():
                    tree._restore(op, pid, [
                        [(c[ci_cc[k][0]][2][ci_cc[k][1]], e, c) for e, _, c in items]
                        for k, items in enumerate(per_child)])
            self.waiting, self.parts, self.bytes = [], [], 0.0
            return
        c = tree.counters
        c.file_bytes += event.bytes
        index = [row for _, _, _, rows in parts for row in rows]
        c.spilled_inputs += sum(n for *_, n in index)
        self.marks += [(oid, pid, top) for oid, pid, _, top, _ in index]
        self.written += sum(size for _, _, size, _, _ in index)
        self.waiting, self.parts, self.bytes = [], [], 0.0


def _tops(live: list, partitions: int) -> list:
    """Per pid, the latest window end among the inputs of ``live`` (per child, Arrow with
    ``pid`` and ``_exp``), as the engine's values (inf for none); -inf where none."""
    top: np.ndarray | None = None
    for t in live:
        if t is None:
            continue
        exp = t["_exp"].to_numpy()
        if top is None:
            top = np.full(partitions, np.iinfo(np.int64).min if exp.dtype.kind == "i"
                          else -np.inf, dtype=exp.dtype)
        np.maximum.at(top, t["pid"].to_numpy(), exp)
    if top is None:
        return [-INF] * partitions
    vals = top.tolist()
    if top.dtype.kind == "i":
        lo = int(np.iinfo(np.int64).min)
        vals = [INF if v == eq3.NO_END else -INF if v == lo else v for v in vals]
    return vals


class _SentUp:
    """The missing subresults operators send their parents during a clean-up (§4.2: an
    operator's are consumed only when its parent starts, after every sibling's
    End-of-Cleanup), as Arrow tables in the spill format (``pid``: the parent's partition
    id, ``child``: which input of the parent). Beyond the paper, which holds them in
    memory: once they pass ``limit`` model bytes (§2.2's sizes) they are written to disk,
    as generations of the parent's partition groups in a spill store of their own (same
    format, one file per flush), so a clean-up's memory stays bounded however many results
    the spills held back. The parent reads them a run of pids at a time, beside its
    spilled generations."""

    def __init__(self, tree: SpillTree, limit: float):
        self.tree, self.limit = tree, limit
        # Per parent: Arrow tables in the spill format (from batch clean-ups) and Python
        # objects, pid -> child -> [(exp, newest time, composite)] (from groups cleaned
        # up in Python).
        self.tables: dict[int, list[pa.Table]] = {op.id: [] for op in tree.ops}
        self.items: dict[int, dict] = {op.id: {} for op in tree.ops}
        self.bytes = 0.0
        self.store = None
        self.flushes = 0
        # The first write of a hand-over the disk refused: from then on this clean-up holds
        # its hand-over in memory, over the limit (the clean-up finishes exactly, then
        # raises it, as ``_WriteBack.failed``).
        self.failed: Exception | None = None

    def codec(self):
        """The spill store that encodes hand-overs (the hand-over store, made on first
        use: the tree's own may be absent, as in ``adaptcq cleanup``'s)."""
        if self.store is None:
            from adaptcq.state.spill_store import SpillStore
            tree = self.tree
            main = tree.store
            where = None if main is None or main.temporary else main.directory
            self.store = SpillStore(_scratch(where), tree.query.columns,
                                    main.types if main is not None else None, durable=False,
                                    time_type=main.time_type if main is not None else None)
        return self.store

    def add(self, parent: Operator, pk: int, missing: list) -> None:
        """``missing`` ((exp, newest time, composite) of child ``pk``, from a group cleaned
        up in Python) go to ``parent``'s groups by its partition column, kept as Python
        objects (Arrow would infer a type per value list and could refuse a mix the engine
        joins); NULL keys never join, so they go nowhere."""
        tree = self.tree
        ci, cc = parent.key_slots[pk]
        box = self.items[parent.id]
        for item in missing:
            key = item[2][ci][2][cc]
            if key is not None and key == key:  # noqa: PLR0124 (not a NaN)
                box.setdefault(partition_of(key, tree.partitions), {}).setdefault(
                    pk, []).append(item)
        self._grew(parent.unit[pk] * len(missing))

    def add_table(self, parent: Operator, pk: int, t: pa.Table) -> None:
        """``add`` for a batch clean-up's missing results (Arrow, with the columns of
        child ``pk``'s streams): the parent's partition ids computed by column."""
        tree = self.tree
        ci, cc = parent.key_slots[pk]
        s = parent.child_streams(pk)[ci]
        name = f"{s}.{tree.query.columns[s][cc]}"
        if name not in t.column_names:
            return  # NULL in every row: nothing joins
        t = t.filter(eq3.joinable(t[name]))
        if not t.num_rows:
            return
        pid = pa.array(partition_ids(t[name], tree.partitions).astype(np.int32))
        t = t.drop_columns(["pid", "_key", "_exp", "_t"]).append_column("pid", pid) \
             .append_column("child", pa.array(np.full(t.num_rows, pk, np.int16)))
        self.tables[parent.id].append(_spill_format(t, self.codec().columns))
        self._grew(parent.unit[pk] * t.num_rows)

    def _grew(self, model_bytes: float) -> None:
        self.bytes += model_bytes
        if self.bytes > self.limit:
            self.flush()

    def flush(self) -> None:
        """Every subresult held in memory, written as one event of the hand-over store.
        A write the disk refuses leaves them all in memory (nothing is half taken) and
        stops the flushing (``failed``)."""
        if self.failed is not None:
            return
        try:
            store = self.codec()
        except (OSError, AdaptcqError) as e:  # (no room even for the scratch folder)
            self.failed = e
            return
        parts = []
        written = []  # parents whose Python subresults are in ``parts``
        kept = 0.0
        for oid, box in self.items.items():
            if box:
                op = self.tree.ops[oid - 1]
                m = len(op.children)
                layouts = [op.child_streams(k) for k in range(m)]
                try:
                    parts += store.encode([(oid, ppid, [[c for _, _, c in per.get(k, ())]
                                                        for k in range(m)], layouts, 0.0,
                                            INF) for ppid, per in box.items()])
                except SpillError:
                    # Values without a declared type that Arrow cannot type together (an
                    # int beyond 2^53 beside a float): they stay in memory, over the
                    # limit, rather than fail the clean-up half-way.
                    kept += sum(op.unit[k] * len(v) for per in box.values()
                                for k, v in per.items())
                    continue
                written.append(oid)
        for oid, tables in self.tables.items():
            for t in tables:
                parts += _block_parts(oid, t, lambda _pid, _n: (0.0, INF))
        if parts:
            # A pid may be in several batches of one event (a part per add); each is a
            # part of the same hand-over, which the parent reads whole.
            try:
                store.write_batches(parts, self.tree.now)
            except SpillError as e:  # (a full disk): all of it stays where it was
                self.failed = e
                return
            self.flushes += 1
        for oid in written:
            self.items[oid] = {}
        for oid in self.tables:
            self.tables[oid] = []
        self.bytes = kept

    def take(self, oid: int) -> _Handed:
        """Operator ``oid``'s hand-over, in memory and on disk."""
        handed = _Handed(self.tables[oid], self.items[oid], self.store, oid)
        self.tables[oid], self.items[oid] = [], {}
        return handed

    def close(self) -> None:
        if self.store is not None:
            self.store.close()
            self.store = None


class _Handed:
    """One operator's hand-over from its children (``_SentUp.take``): Arrow tables and
    Python objects held in memory, and what was written to the hand-over store."""

    def __init__(self, tables: list, items: dict, store, oid: int):
        self.mem, self.items, self.store = tables, items, store
        self.flushed = store.groups().get(oid, {}) if store is not None else {}
        self.rows_of = store.group_rows(oid) if store is not None else {}

    def counts(self) -> dict[int, int]:
        """Rows per pid, every pid handed over (a run's size counts them besides its
        spilled rows)."""
        n: dict[int, int] = dict(self.rows_of)
        for pid, per in self.items.items():
            n[pid] = n.get(pid, 0) + sum(len(v) for v in per.values())
        for t in self.mem:
            c = np.bincount(t["pid"].to_numpy())
            for pid in np.flatnonzero(c).tolist():
                n[pid] = n.get(pid, 0) + int(c[pid])
        return n

    def tables(self, pids: list[int]) -> list[pa.Table]:
        """The Arrow rows of these pids, in memory and on disk, as tables (each of one
        schema; not concatenated, so that a column typed differently in two of them stays
        as it was)."""
        out = []
        for t in self.mem:  # (a run of every pid takes each table as it is)
            got = eq3.where(t, np.isin(t["pid"].to_numpy(), pids))
            if got is not None:
                out.append(got)
        want = set(pids)
        for ref in sorted({ref for pid in pids for ref in self.flushed.get(pid, ())}):
            batch = self.store.batch(ref)
            ranges = [r for pid, r in self.store.pid_ranges(batch).items() if pid in want]
            if not ranges:
                continue
            # One table per batch, not per pid: a table of a few rows costs Arrow about a
            # kilobyte of objects per column, and a clean-up of many pids held hundreds of
            # thousands of them (63 of its 146 MB at the peak, on the unbounded workload).
            # A batch holds one block's pids in pid order and a run is a stretch of a
            # block's pids, so the wanted rows are one range; ``take`` if they are not.
            lo, hi = min(a for a, _ in ranges), max(b for _, b in ranges)
            if sum(b - a for a, b in ranges) == hi - lo:
                part = batch.slice(lo, hi - lo)
            else:
                part = batch.take(pa.array(np.concatenate(
                    [np.arange(a, b) for a, b in ranges])))
            out.append(pa.Table.from_batches([part]))
        return out

    def python(self, pids: list[int]) -> dict:
        """The Python objects of these pids: pid -> child -> [(exp, newest time, comp)]."""
        return {pid: self.items[pid] for pid in pids if pid in self.items}


def _spill_format(t: pa.Table, columns: dict) -> pa.Table:
    """``t`` (``pid``, ``child`` and some streams' columns) with every stream's columns
    in the spill format's order, NULL where absent (rows in their order: ``_block_parts``
    sorts what goes to disk)."""
    n = t.num_rows
    names = ["pid", "child"] + [f for a, cols in columns.items() for f in stream_names(a, cols)]
    have = set(t.column_names)
    return pa.table([t[f] if f in have else pa.nulls(n) for f in names], names=names)


def _block_parts(oid: int, rows: pa.Table, sized) -> list[tuple]:
    """``rows`` (spill format, in any order) as ``SpillStore.write_batches`` parts: a
    record batch per block of pids, its rows in pid order, with an index row per pid;
    ``sized(pid, inputs)`` gives its (model bytes, latest window end)."""
    pid = rows["pid"].to_numpy()
    block = pid % BLOCKS
    # The rows in (block, pid) order with one take, then a slice per block, rather than
    # a filter of every column per block (and a sort before it).
    order = np.lexsort((pid, block))
    rows, block = rows.take(pa.array(order)), block[order]
    cut = np.flatnonzero(np.diff(block)) + 1
    parts = []
    for lo, hi in zip([0, *cut.tolist()], [*cut.tolist(), len(block)], strict=True):
        if lo == hi:
            continue
        b = int(block[lo])
        part = rows.slice(lo, hi - lo)
        counts = np.bincount(part["pid"].to_numpy())
        parts.append((oid, b, _one_batch(part),
                      [(oid, pid, *sized(pid, int(counts[pid])), int(counts[pid]))
                       for pid in np.flatnonzero(counts).tolist()]))
    return parts


def _one_batch(t: pa.Table) -> pa.RecordBatch:
    """``t`` as one record batch (its chunks combined)."""
    batches = t.combine_chunks().to_batches()
    if not batches:
        return pa.RecordBatch.from_pylist([], t.schema)
    if len(batches) > 1:
        raise AssertionError(f"{len(batches)} batches after combine_chunks")
    return batches[0]


DECODE_ROWS = 262_144  # spilled rows a clean-up takes at once (a run of partition groups)


def _runs_of(store, blocks: list[list[int]], disk: dict, handed: dict, children: int):
    """The pids of ``blocks`` (each a block's pids, ascending) cut into runs holding
    about ``DECODE_ROWS`` rows each, spilled or handed over (``handed``: pid -> rows; one
    pid alone may hold more): yields (pids, {batch ref: the slice of that batch holding
    them}). A block's batches are read once, when the cut reaches it, and checked against
    their file's group index and the operator's ``children`` (a file rewritten by hand is
    refused naming it)."""
    pids: list[int] = []
    cut: dict[tuple, list] = {}      # ref -> [first row, end row]
    held: dict[tuple, object] = {}   # ref -> batch, for the run being cut
    rows = 0

    def run():
        return pids, {ref: held[ref].slice(lo, hi - lo) for ref, (lo, hi) in cut.items()}

    for block in blocks:
        refs = {ref for pid in block for ref in disk.get(pid, ())}
        batches = {ref: store.batch(ref) for ref in refs}
        for ref, b in batches.items():
            if ref[0] in store.written or not b.num_rows:
                continue  # (this process wrote it: no check on the clean-ups' hot path)
            child = b.column("child")
            c = child.to_numpy(zero_copy_only=False)
            if child.null_count or c.min() < 0 or c.max() >= children:
                raise _damaged(store, ref, f"rows of no input of the operator (its 'child' "
                                           f"column is outside 0..{children - 1})")
        ranges = {ref: store.pid_ranges(b) for ref, b in batches.items()}
        for pid in block:
            mine = disk.get(pid, ())
            try:
                n = sum(ranges[ref][pid][1] - ranges[ref][pid][0] for ref in mine) + \
                    handed.get(pid, 0)
            except KeyError:
                ref = next(r for r in mine if pid not in ranges[r])
                raise _damaged(store, ref, f"no rows of partition id {pid}, which its group "
                                           "index lists") from None
            if pids and rows + n > DECODE_ROWS:
                yield run()
                pids, cut, held, rows = [], {}, {}, 0
            pids.append(pid)
            rows += n
            for ref in mine:
                lo, hi = ranges[ref][pid]
                c = cut.get(ref)
                if c is None:
                    cut[ref] = [lo, hi]
                    held[ref] = batches[ref]
                else:
                    c[1] = hi
    if pids:
        yield run()


def _damaged(store, ref: tuple[str, int], what: str) -> SpillError:
    return SpillError(f"spill file {store.directory / ref[0]} is damaged: its batch {ref[1]} "
                      f"holds {what}; the spilled results cannot be produced")


def _scratch(where) -> str:
    """A fresh folder for a clean-up's hand-over files: inside the spill folder when the
    user chose one (the disk meant for spilled state), else a temporary one."""
    import tempfile
    return tempfile.mkdtemp(prefix="cleanup-", dir=where)


class _Rows:
    """The base rows of one stream now in memory (``stems[i].rows``: rid -> row), as the
    Executor protocol exposes them."""

    __slots__ = ("name", "rows")

    def __init__(self, name: str):
        self.name = name
        self.rows: dict[int, tuple] = {}

    def __len__(self) -> int:
        return len(self.rows)


class _RowSize:
    """Bytes of one stored base input, measured on a sample of rows (the row tuple, its
    values, the (rid, t, row) record, the entry and its bucket slot): the u_x of §2.2."""

    __slots__ = ("n", "total")
    OVERHEAD = 56 + 64 + 56 + 104  # record tuple, composite 1-tuple, (exp, comp), dict slot

    def __init__(self):
        self.n, self.total = 0, 0.0

    def update(self, row: tuple) -> None:
        self.total += sys.getsizeof(row) + sum(sys.getsizeof(v) for v in row) + self.OVERHEAD
        self.n += 1

    def get(self) -> float:
        return self.total / self.n if self.n else 200.0


def _passes(checks, comps, c2) -> bool:
    for pos, ia, ca, ib, cb in checks:
        v = comps[pos][ia][2][ca]
        if v is None or v != c2[ib][2][cb]:
            return False
    return True


def _keyed(op: Operator, k: int, items: list) -> tuple[dict, float, float]:
    """Child k's inputs given as (exp, newest time, composite), by partition-column value,
    with the earliest newest time and the latest exp among them."""
    ci, cc = op.key_slots[k]
    out: dict = {}
    lo, hi = INF, -INF
    for item in items:
        exp, t, comp = item
        key = comp[ci][2][cc]
        if key is not None and key == key:  # noqa: PLR0124 (not a NaN)
            if t < lo:  # noqa: PLR1730 (the hot loop: no call)
                lo = t
            if exp > hi:  # noqa: PLR1730
                hi = exp
            b = out.get(key)
            if b is None:
                out[key] = [item]
            else:
                b.append(item)
    return out, lo, hi


def _newest(item: tuple):
    return item[1]


def _merged(gens: list, m: int) -> list[dict]:
    """Per child, the by-key inputs of several generations together."""
    out = [{} for _ in range(m)]
    for g in gens:
        for k in range(m):
            _merge_into(out[k], g[k])
    return out


def _merge_into(base: dict, delta: dict) -> None:
    for key, entries in delta.items():
        base.setdefault(key, []).extend(entries)


def _subsets(m: int, proper: bool) -> list[tuple[int, ...]]:
    """The non-empty (proper) subsets of range(m)."""
    return [s for s in eq3.subsets(range(m)) if not proper or len(s) < m]


def _combine(op: Operator, subset: tuple[int, ...], delta: list[dict], base: list[dict]
             ) -> list:
    """(⋈_{i∈subset} delta_i) ⋈ (⋈_{i∉subset} base_i) within one partition group: every
    combination of equal keys that passes the operator's checks and the window test
    (newest component no later than any component's end), as (exp, newest time,
    composite)."""
    m = len(op.children)
    sources = [delta[k] if k in subset else base[k] for k in range(m)]
    out = []
    smallest = min(range(m), key=lambda k: len(sources[k]))
    steps = op.probes[0]
    for key in sources[smallest]:
        lists = [sources[k].get(key) for k in range(m)]
        if not all(lists):
            continue
        # (exp, newest time, components): a partial combination whose newest component
        # is past another's window end can never be valid; it is dropped at once.
        partial = [(exp, t, (comp,)) for exp, t, comp in lists[0] if t <= exp]
        for j, checks in steps:
            nxt = []
            for pexp, pt, comps in partial:
                for e2, t2, c2 in lists[j]:
                    e = pexp if pexp < e2 else e2  # noqa: FURB136 (the hot loop)
                    t = pt if pt > t2 else t2  # noqa: FURB136
                    if t > e or (checks and not _passes(checks, comps, c2)):
                        continue
                    nxt.append((e, t, comps + (c2,)))
            partial = nxt
            if not partial:
                break
        join = op.joiners[0]
        for exp, t, comps in partial:
            out.append((exp, t, join(comps)))
    return out


def _discard(_row) -> None:
    pass


def replay(cq, chunks: Iterable[tuple], events: Iterable[tuple],
           folded: dict | None = None) -> None:
    """Rebuild a tree: process into ``cq`` (a fresh ContinuousQuery running a
    :class:`SpillTree` over the same spill folder) rows of the tree it replaces, in that
    tree's order, with that tree's spill events (its ``journal``: (position, event time,
    groups)) replayed where they happened, and no output (every result was produced
    before). ``chunks`` gives the rows in order, a chunk at a time (so that a caller need
    not hold them all as Python rows): (streams, timestamps, rows, positions), where
    ``positions`` place the rows among the events (the replaced tree's row ids, or any
    increasing key in the same order as the journal's).

    The rows must include every row that can still matter: those whose window has not
    ended, and, while a spill is pending, those whose window ended after the oldest
    pending spill's time (an input expiring then may be *retired* for the clean-up:
    ``SpillTree._needed``) — ``horizon`` gives the bound. Spill events placed before every
    row replayed may be given ``folded`` instead (``fold``): only their markers matter, as
    the groups they dropped held none of these rows. Rows before the last clean-up
    need no events: a clean-up leaves every partition group merged, as if nothing had
    been spilled. More rows than needed are harmless: they expire again. The generations
    in memory then hold exactly the inputs they held (each group's spills cut it where
    they cut it before), so the clean-up's Eq. 3 stays exact. The spill policy's
    statistics restart from what the replay saw, and its memory checks restart counting:
    later choices may differ, results do not."""
    ex = cq.executor
    controller, every, emit = ex.controller, ex._check_every, ex._emit
    ex.controller, ex._emit = None, _discard
    pending = deque(sorted(events, key=lambda e: e[0]))
    for (oid, pid), (top, ts) in (folded or {}).items():
        ex._mark(oid, pid, top, ts)
    try:
        for streams, timestamps, rows, positions in chunks:
            start = 0
            for k in range(len(rows)):
                if pending and pending[0][0] < positions[k]:
                    if k > start:
                        cq.process(streams[start:k], None, timestamps[start:k], rows[start:k])
                        start = k
                    while pending and pending[0][0] < positions[k]:
                        _, ts, groups = pending.popleft()
                        ex.replay_spill(ts, groups)
            if start < len(rows):
                cq.process(streams[start:], None, timestamps[start:], rows[start:])
            cq.drain()
        while pending:  # events after the last row
            _, ts, groups = pending.popleft()
            ex.replay_spill(ts, groups)
    finally:
        ex.controller, ex._emit = controller, emit
        ex._until_check = every


def horizon(ex: SpillTree, now) -> float:
    """The earliest window end a row may have and still matter to a rebuild (``replay``):
    ``now`` (the expiry frontier), or the earliest window end of an input *retired* in
    memory for a pending clean-up (its components' rows end no earlier). A row whose
    window ended before both is in no input in memory: expired and dropped, or retired and
    since written to disk with its group."""
    edge = now
    if ex.counters.retired:
        for op in ex.ops:
            for g in op.parts.values():
                for _, (exp, _) in g.retired:
                    edge = min(edge, exp)
    return edge


def fold(folded: dict | None, events: Iterable[tuple]) -> dict:
    """``folded`` (None: none) with ``events`` ((position, event time, ((operator id, pid,
    latest window end), ...)), a journal's) added, as {(operator id, pid): (latest window
    end, earliest event time)}: the pending-spill markers they set (``SpillTree._mark``,
    which combines them by max and min, so one pair per group gives the same markers),
    without replaying them."""
    out = dict(folded or {})
    for _, ts, groups in events:
        for oid, pid, top in groups:
            old = out.get((oid, pid))
            out[(oid, pid)] = (top, ts) if old is None else (max(old[0], top),
                                                               min(old[1], ts))
    return out


def check_query(query: LogicalQuery, mode: str) -> None:
    """What the operator tree cannot run, refused with the reason."""
    if mode != "append":
        raise OptionError(
            "the operator tree (--executor tree, --spill) runs in append mode only: a "
            "result held back by a spill is produced late, at clean-up, and its deletion "
            "could not be emitted before its insertion; use --mode append")
    for s in query.streams:
        if s.window.kind == "rows":
            raise OptionError(
                f"stream {s.alias} has a [ROWS {s.window.size}] window: the operator tree "
                "(--executor tree, --spill) supports [RANGE w] and unbounded windows (a "
                "count window's membership depends on the stream's global order, which a "
                "spilled generation cannot test at clean-up)")
