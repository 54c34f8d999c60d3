"""One partition group on Spark: event-time order across micro-batches, lateness, expiry,
and its state kept **as changes** (docs/spark.md, "State as changes").

A group receives, per micro-batch, the Arrow batches the split sent it (``spark_split``) and
one punctuation per input batch. It runs the unchanged engine (``ContinuousQuery``) on the
rows it can release in the local runtime's order, and keeps in Spark's state store:

* per (stream, micro-batch) the rows it accepted that can still matter — an **entry** of
  Arrow IPC pieces in a MapState keyed (stream, entry, piece) — written once, when the
  micro-batch has run (a row it released that already left its ``[RANGE w]`` window is not
  written: with micro-batches longer than the window, most are not);
* an entry is removed, whole, when none of its rows can matter again: all released, and
  expired from a ``[RANGE w]`` window (its newest row's ``t + w`` is below the group's
  expiry frontier) or pushed out of a ``[ROWS n]`` window by n later rows; entries of
  unbounded windows stay (their rows are the state);
* a ValueState ``meta``: version, a random token, which group's state it is, and the
  group's scalars (frontier, release bound, expiry frontier, counters, the executor's plan)
  with one small record per entry: bounded for windowed streams, growing by one record per
  micro-batch and stream of an unbounded window (its entries stay);
* with adaptive policies, a ValueState ``adapt``: the profiler and policies, pickled
  (bounded by their W most recent observations);
* with spilling (``cfg.spill``), in ``meta``: the spill events the group's folder holds at
  this version, the operator tree's journal of spill events (a rebuild replays the rows
  with them in place: ``engine.spill_tree.replay``) and the files to remove once this
  version is committed (docs/spill.md, "On Spark").

So a micro-batch writes what it received and deletes what expired: its cost follows its
input and output, not the state. The live engine stays in the Python worker (``_LIVE``) and
is used while the stored token matches; when a worker has no live copy (a restart, another
worker got the group, a retried batch) the engine is **rebuilt** from the entries
(``ContinuousQuery.rebuild``: the rows still in their windows are loaded, not joined). The
store is the source of truth.

The operator logic (``PartitionGroup``) is apart from the storage (``MemoryStore`` for
tests, ``SparkStore`` over the StatefulProcessor's handle), as Flink's multi-join operator
keeps its logic apart from its state backend.
"""

from __future__ import annotations

import functools
import io
import json
import math
import os
import pickle
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
from pyspark.sql.streaming import StatefulProcessor

from adaptcq import collector
from adaptcq.errors import AdaptcqError, InputError
from adaptcq.query.logical import LogicalQuery
from adaptcq.runtime.shed import engine_options
from adaptcq.runtime.spark_daemon import freeze_imports
from adaptcq.runtime.spark_split import PUNCT, _Config, _file_of, _ipc
from adaptcq.stream.merge import first_misfit_row, python_misfit

__all__ = ["MemoryStore", "PartitionGroup", "SparkStore", "read_part", "release"]

PIECE = 8 << 20  # bytes per state-store value: an entry is cut into pieces of about this
TIME_UNIT = 1e-9  # seconds per engine time unit: event times are int64 nanoseconds
_EARLIER = 4  # reports of earlier policy generations kept per group
_HISTORY = 32  # (version, token)s a group's meta remembers: how stale a copy may catch up
_ORDER = ["_t", "_s", "_q", "_o1", "_o2"]  # the local runtime's order of equal timestamps
_QUERIES: dict[str, LogicalQuery] = {}


def _logical(cfg: _Config) -> LogicalQuery:
    q = _QUERIES.get(cfg.qid)
    if q is None:
        from adaptcq.runtime.local import parse_signed
        q = _QUERIES[cfg.qid] = parse_signed(cfg.sql, cfg.schemas, cfg.sign)
    return q


def release(pool: list, frontier: list, prev: tuple, end: bool, lateness: int
            ) -> tuple[list, list, tuple, float]:
    """The rows of ``pool`` (tuples keyed ``(ts, stream, micro-batch, file, row, ...)``)
    that can be processed now: those at or before the release bound (``bound``). At the end
    of input everything goes, control events (stream -1) after the last row too, and the
    bound passes the last of them (a removal with no time, "after all data": +inf): a row
    arriving later before it would follow it out of order. Returns (go, pending, bound,
    advance): deletions due before ``advance`` can then be processed. (The query-set
    runtime's row form of ``bound``.)"""
    (bound_ts, bound_s), advance = bound(frontier, prev, end, lateness)
    pool.sort(key=lambda r: r[:5])
    if end:
        last = max((r[:2] for r in pool), default=(bound_ts, bound_s))
        return pool, [], max((bound_ts, bound_s), last), advance
    n = 0
    for r in pool:
        if r[0] < bound_ts or (r[0] == bound_ts and r[1] <= bound_s):
            n += 1
        else:
            break
    return pool[:n], pool[n:], (bound_ts, bound_s), advance


def bound(frontier: list, prev: tuple, end: bool, lateness: int) -> tuple[tuple, float]:
    """The release bound ``(ts, stream)``: a pending row x can go once ``(x.ts, x.stream) <=
    (frontier[i] - lateness, i)`` for every stream i (a row of stream i arriving later is
    accepted only at ``frontier[i] - lateness`` or after). It never goes below ``prev``, the
    bound so far: rows up to it were processed, so a later row is accepted only at or after
    it (``is_before``). At the end of input everything goes, as the local runtime processes
    its whole input: the bound becomes (the largest event time, the last stream in FROM
    order whose rows reach it). Rows arriving after that (a restart over files added since)
    then wait for the frontier again, or the next end of input. Returns (bound, advance):
    expiries due before ``advance`` can be processed."""
    if end:
        top = max(frontier)
        if top == -math.inf:  # no row yet: nothing to release
            return prev, prev[0]
        b = max(prev, (top, max(i for i, f in enumerate(frontier) if f == top)))
        return b, b[0]
    b = max(prev, min((f - lateness, i) for i, f in enumerate(frontier)))
    # (A query set's bound can pass the rows: a control event an end applied, ``release``.)
    return b, min(b[0], max(frontier))


def is_before(ts, i: int, bound: tuple):
    """Whether rows of stream i at times ``ts`` (an array, or one time) come before the
    release bound in the local runtime's order, i.e. before rows already processed: only
    rows arriving after an end of input can (below the frontier minus the lateness they
    are late anyway)."""
    bts, bs = bound
    return (ts < bts) | ((ts == bts) & (i < bs))


def reopened_bound(info: dict, lateness: int) -> tuple[list, tuple]:
    """The (frontier, bound) of a stored group. A group closed by an earlier version has the
    bound +inf and its frontier raised to the largest time plus the lateness in every
    stream: its bound becomes that time, with every stream's rows at it taken as processed
    (which stream's were is not recorded), so that rows arriving later are ordered again."""
    frontier, b = list(info["frontier"]), tuple(info["bound"])
    if b[0] == math.inf:
        top = max(frontier) - lateness
        frontier, b = [top] * len(frontier), (top, len(frontier) - 1)
    return frontier, b


# ----- Arrow pieces ---------------------------------------------------------------------------

def read_part(blob) -> object:
    """An Arrow IPC stream (a split part, or a stored piece) as a table."""
    import pyarrow as pa
    return pa.ipc.open_stream(pa.py_buffer(blob)).read_all()


def _pieces(table) -> list[bytes]:
    """``table`` as IPC blobs of at most about ``PIECE`` bytes each."""
    n = table.num_rows
    per = max(1, int(n * PIECE / max(table.nbytes, 1)))
    return [_ipc(table.slice(a, per)) for a in range(0, n, per)] or [_ipc(table)]


# ----- storage ---------------------------------------------------------------------------------

class MemoryStore:
    """A group's state store in memory (tests; the same interface as ``SparkStore``)."""

    def __init__(self):
        self.meta: tuple | None = None
        self.entries: dict[tuple, tuple] = {}
        self.adapt: bytes | None = None
        self.writes = 0  # values written (pieces and meta): the cost of a micro-batch

    def get_meta(self):
        return self.meta

    def put_meta(self, meta: tuple) -> None:
        self.meta = meta
        self.writes += 1

    def put(self, key: tuple, value: tuple) -> None:
        self.entries[key] = value
        self.writes += 1

    def remove(self, key: tuple) -> None:
        del self.entries[key]

    def get(self, key: tuple) -> tuple:
        return self.entries[key]

    def items(self) -> Iterator[tuple]:
        yield from self.entries.items()

    def get_adapt(self) -> bytes | None:
        return self.adapt

    def put_adapt(self, blob: bytes | None) -> None:
        self.adapt = blob


class SparkStore(MemoryStore):
    """The state of one group in ``transformWithStateInPandas``'s store (RocksDB):
    ValueState ``meta`` (version, token, info), MapState ``rows`` ((stream, entry, piece) ->
    (newest time, Arrow IPC)), ValueState ``adapt`` (pickled policies)."""

    def __init__(self, meta, rows, adapt):
        self._meta, self._rows, self._adapt = meta, rows, adapt
        self.writes = 0

    def get_meta(self):
        return self._meta.get()

    def put_meta(self, meta: tuple) -> None:
        self._meta.update(meta)
        self.writes += 1

    def put(self, key: tuple, value: tuple) -> None:
        self._rows.updateValue(key, value)
        self.writes += 1

    def remove(self, key: tuple) -> None:
        self._rows.removeKey(key)

    def get(self, key: tuple) -> tuple:
        return self._rows.getValue(key)

    def items(self) -> Iterator[tuple]:
        yield from self._rows.iterator()

    def get_adapt(self) -> bytes | None:
        v = self._adapt.get()
        return None if v is None else v[0]

    def put_adapt(self, blob: bytes | None) -> None:
        self._adapt.update((blob,))


# ----- the group -------------------------------------------------------------------------------

@dataclass
class PartitionGroup:
    """A partition group's engine, the rows waiting in front of it, and the bookkeeping that
    keeps its stored changes (module docstring).

    ``frontier[i]`` is the largest event time of stream i over all micro-batches so far (the
    same in every group: it comes from the split's punctuation). Rows wait in ``pending``
    (per stream, an Arrow table) until no row that could still arrive would precede them in
    the local runtime's order (timestamp, FROM position, micro-batch, file, row).

    ``policies`` are the group's adaptive policies (docs/spark.md, "Adaptivity"). A rebuild
    from the store continues them: the orders in force are in ``meta`` (the executor's
    ``plan_state``), and the profiler with the ordering policies (the optimizer's initial
    plan, A-Greedy) are pickled in ``adapt`` (the logical query they refer to is re-bound to
    the worker's copy). A-Caching starts afresh: its caches are join subresults the rebuilt
    engine does not have; its report before is kept in ``earlier``. Policies that do not
    pickle restart too, with an optimizer whose plan was set (``planned``) not planning
    again. Results never depend on any of this: MJoin is exact under any order and cache.
    """

    cq: object
    frontier: list[float]
    pending: list = field(default_factory=list)  # per stream: Arrow table or None
    seq: int = 0
    closed: bool = False
    late: int = 0
    peak_tuples: int = 0
    peak_bytes: int = 0
    bound: tuple = (-math.inf, 0)  # the release bound so far (ts, stream): rows up to it went
    expired: float = -math.inf  # every row with t + w below this has left its window
    # (stream, entry) -> (newest t, pieces, released rows of its stream when it was released
    # in full (count windows), rows)
    entries: dict = field(default_factory=dict)
    next_entry: int = 0
    released: list = field(default_factory=list)  # per stream: rows released so far
    policies: list = field(default_factory=list)
    planned: dict | None = None  # the optimizer's report once its initial plan is set
    earlier: list = field(default_factory=list)  # reports of policies restarted by a rebuild
    restores: int = 0  # rebuilds with policies
    continued: int = 0  # of them, rebuilds that continued the saved profiler and policies
    rebuilt_rows: int = 0  # rows loaded by the last rebuild or catch-up
    history: list = field(default_factory=list)  # the last (version, token)s it wrote
    shed_now: float = -math.inf  # the load-shedding join: its newest arrival's time
    shed_expired: float = -math.inf  # and its expiry frontier (ShedJoin.frontier)
    # Spilling (cfg.spill): the tree's spill events since its last clean-up, each placed
    # by the order key of the row at which it happened ((t, stream, micro-batch, file,
    # row, rank among equal keys), event time, groups): what a rebuild replays; and the
    # spill files the last micro-batch's clean-ups merged, removed once that micro-batch
    # is committed.
    journal: list = field(default_factory=list)
    folded: dict | None = None  # the markers of journal events no row replayed follows
    edge: float = -math.inf  # rows whose window ended before this are not replayed
    trash: list = field(default_factory=list)
    # The order key of the last row processed: where a clean-up on demand in a micro-batch
    # without rows of this group places the spill event of the groups it wrote back.
    last_key: tuple | None = None
    # A batch clean-up's late results of the last step, as Arrow tables of the output's
    # types (``_cleanup``): they leave with the step's results (``take_late_tables``).
    late_tables: list = field(default_factory=list)

    # ----- creation ----------------------------------------------------------------------
    @classmethod
    def new(cls, cfg: _Config, gkey: int = 0) -> PartitionGroup:
        from adaptcq.engine.continuous import ContinuousQuery
        if cfg.spill is not None:
            cq = _spill_engine(cfg, gkey, [])
        elif cfg.executor == "vector":
            cq = vector_engine(_logical(cfg), cfg.mode, cfg.inputs, cfg.signed, cfg.options)
        else:
            cq = ContinuousQuery(_logical(cfg), cfg.executor, cfg.mode, time_unit=TIME_UNIT,
                                 explicit_deletions=cfg.signed,
                                 **_engine_options(cfg))
        n = cfg.n_streams
        g = cls(cq, [-math.inf] * n, [None] * n, released=[0] * n)
        g.attach(cfg)
        return g

    @classmethod
    def rebuild(cls, cfg: _Config, store: MemoryStore, gkey: int = 0) -> PartitionGroup:
        """The group as its stored changes leave it (module docstring). A spilling
        group's tree is rebuilt by replaying its rows with its spill events in place, over
        its spill folder as the checkpoint recorded it (``_replay_spilling``)."""
        import pyarrow.compute as pc

        from adaptcq.engine.continuous import ContinuousQuery
        meta = store.get_meta()
        info = pickle.loads(meta[2])
        if info["groups"] != cfg.groups:
            raise AdaptcqError(
                f"the checkpoint was written with {info['groups']} partition groups and the "
                f"query now has {cfg.groups}; restart with the same --partitions (rows would "
                "otherwise meet state of other keys)")
        n = cfg.n_streams
        pieces: dict[tuple, list] = {}
        for (i, e, k), (_, blob) in store.items():
            pieces.setdefault((i, e), []).append((k, blob))
        tables: list[list] = [[] for _ in range(n)]
        for (i, e) in sorted(pieces):
            for _, blob in sorted(pieces[(i, e)]):
                tables[i].append(read_part(blob))
        go, pending = _released([_concat(ts) for ts in tables], info["bound"])
        if cfg.executor == "vector":
            cq = vector_engine(_logical(cfg), cfg.mode, cfg.inputs, cfg.signed,
                               {**cfg.options, **info["plan"]})
            batch, _, _ = _batch(cfg, go, pc)
            cq.load(batch, info["expired"])
            loaded = len(batch.streams)
            _take_scalars(cq, info)
        elif cfg.spill is not None:
            cq, loaded, last = _replay_spilling(cfg, gkey, go, info, pc)
        else:
            streams, signs, tss, rows, _ = _ordered(cfg, go, pc)
            loaded = len(rows)
            cq = ContinuousQuery.rebuild(
                _logical(cfg), cfg.executor, cfg.mode, streams, signs, tss, rows,
                expired_before=info["expired"], now=info["now"], stats=info["stats"],
                plan=info["plan"], time_unit=TIME_UNIT, explicit_deletions=cfg.signed,
                next_rid=info["next_rid"],
                **{k: v for k, v in _engine_options(cfg, store).items()
                   if k not in info["plan"]})
        frontier, upto = reopened_bound(info, cfg.lateness_ns)
        g = cls(cq, frontier, pending, info["seq"], info["closed"], info["late"],
                info["peak"][0], info["peak"][1], upto, info["expired"],
                dict(info["entries"]), info["next_entry"], list(info["released"]))
        g.rebuilt_rows = loaded
        g.history = list(info["history"])
        g.shed_now, g.shed_expired = info.get("shed", (-math.inf, -math.inf))
        if cfg.spill is not None:
            sp = info["spill"]
            # (A checkpoint of the first version has no folded events and kept every row
            # since its oldest pending spill: replaying them all is what it did.)
            g.journal, g.folded, g.trash = list(sp["journal"]), sp.get("folded"), \
                list(sp["trash"])
            g.edge = sp.get("edge", -math.inf)
            # (A checkpoint older than clean-ups on demand: the last row replayed.)
            g.last_key = sp.get("last_key", last)
        g._carry(cfg, info.get("adapt"), store.get_adapt())
        return g

    def take_late_tables(self) -> list:
        """The last step's late results as Arrow tables (``_cleanup``), handed over once."""
        tables, self.late_tables = self.late_tables, []
        return tables

    def rows_since(self, info: dict) -> int:
        """Rows a catch-up to ``info`` would read and load: those pending here and those
        of the entries written since (a rebuild reads every entry's)."""
        return (sum(0 if t is None else t.num_rows for t in self.pending)
                + sum(e[3] for k, e in info["entries"].items() if k[1] >= self.next_entry))

    def catch_up(self, cfg: _Config, store: MemoryStore, info: dict) -> None:
        """Bring a stale live copy (a worker ran this group some micro-batches ago; another
        worker ran the ones since) up to the store: load the rows the other worker
        released since, from the entries it wrote, without joining them (their results
        were emitted there), expire what it expired, and take its scalars. Costs the
        missed micro-batches' input, not the state (``can_catch_up`` says when it is
        allowed)."""
        import pyarrow.compute as pc

        from adaptcq.engine.continuous import Counters
        tables: list[list] = [[] if t is None else [t] for t in self.pending]
        fresh = sorted(k for k in info["entries"] if k[1] >= self.next_entry)
        for key in fresh:
            for k in range(info["entries"][key][1]):
                tables[key[0]].append(read_part(store.get((*key, k))[1]))
        go, pending = _released([_concat(ts) for ts in tables], info["bound"])
        loaded = sum(t.num_rows for _, t in go)
        cq = self.cq
        if cfg.executor == "vector":
            cq.load(_batch(cfg, go, pc)[0], info["expired"])
            _take_scalars(cq, info)
        else:
            streams, signs, tss, rows, _ = _ordered(cfg, go, pc)
            cq.load_arrivals(streams, signs, tss, rows, info["expired"])
            cq.next_rid = max(cq.next_rid, info["next_rid"])
            cq.now = info["now"]
            cq.stats = Counters(**info["stats"])
            cq._next_sample = cq.stats.updates + cq.sample_every
        self.pending = pending
        self.frontier, self.bound = reopened_bound(info, cfg.lateness_ns)
        self.seq, self.closed = info["seq"], info["closed"]
        self.late = info["late"]
        self.peak_tuples = max(self.peak_tuples, info["peak"][0])
        self.peak_bytes = max(self.peak_bytes, info["peak"][1])
        self.expired = info["expired"]
        self.entries, self.next_entry = dict(info["entries"]), info["next_entry"]
        self.released = list(info["released"])
        self.history = list(info["history"])
        self.rebuilt_rows = loaded

    # ----- one micro-batch ---------------------------------------------------------------
    def step(self, cfg: _Config, parts: dict, maxima: list, end: bool, store: MemoryStore,
             cleanup: bool = False
             ) -> tuple[list, list, int, int]:
        """One micro-batch: lateness, stored changes, ordering, release, expiry. ``parts``
        maps a stream to the Arrow tables the split sent this group. Returns (results,
        rejected rows, input rows (primary replicas), rows received)."""
        import pyarrow as pa
        import pyarrow.compute as pc
        t0 = time.thread_time()  # the batch's CPU time, for shedding per micro-batch
        self.late_tables = []  # (the last step's left with its output, or were dropped)
        L = cfg.lateness_ns
        seq = self.seq
        self.seq += 1
        old = list(self.frontier)
        bmax = list(old)
        for i, m, _ in maxima:
            bmax[i] = max(bmax[i], m)
        rejected = []
        new = []  # this micro-batch's rows per stream, stored once processed
        rows_in = received = 0
        for i in sorted(parts):
            t = pa.concat_tables(parts[i]) if len(parts[i]) > 1 else parts[i][0]
            received += t.num_rows
            primary = t.column("_pr").to_numpy(zero_copy_only=False)
            rows_in += int(primary.sum())
            ts = t.column("_t").to_numpy()
            late = ts < old[i] - L
            # Not late, yet before rows processed already: only after an end of input.
            after = is_before(ts, i, self.bound) & ~late
            if self.closed and cfg.spill is not None:
                after[:] = True  # the end of input's clean-up has run: nothing joins now
            if self.closed:
                after |= late
            late |= after
            if late.any():
                self._reject_late(cfg, i, t, late & primary, rejected, after)
                self.late += int((late & primary).sum())
                t = t.filter(pa.array(~late))
            if not t.num_rows:
                continue
            t = t.append_column("_q", pa.array(np.full(t.num_rows, seq, np.int64)))
            new.append(((i, self.next_entry), t))
            self.next_entry += 1
            self.pending[i] = t if self.pending[i] is None else \
                pa.concat_tables([self.pending[i], t])
        if maxima and cfg.spill is None:
            # Input after an end of input (a restart over files added since) re-opens
            # the group: its rows wait for the frontier again, or the next end of input.
            # A spilling group's end-of-input clean-up has run: it stays closed.
            self.closed = False
        self.frontier = bmax
        self.bound, advance = bound(bmax, self.bound, end, L)
        self.closed |= end
        go, self.pending = _released(self.pending, self.bound)
        for i, t in go:
            self.released[i] += t.num_rows
        cq = self.cq
        if cfg.executor == "vector":
            return self._step_vector(cfg, go, advance, store, rejected, rows_in, received, pc,
                                     new)
        spilling = cfg.spill is not None
        streams, signs, tss, rows, secondary, *keys = _ordered(cfg, go, pc, spilling)
        late_rows: list = []
        if spilling:
            ex = cq.executor
            base, n0, c0 = cq.next_rid, len(ex.journal), ex.counters.cleanups
            ex.emit_table = functools.partial(self._emit_late, cfg.results, late_rows)
        out = []
        n_rej = len(cq.rejected_rows)
        if rows:
            out = cq.process(streams, signs, tss, rows)
            self.expired = max(self.expired, tss[-1])
        if advance > -math.inf:
            cq.advance_to(advance)
            self.expired = max(self.expired, advance)
            out.extend(cq.drain())
        if spilling:
            self._note_spills(ex, base, keys[0], n0, c0)
            if keys[0]:
                self.last_key = keys[0][-1]
            off = cfg.spill["cleanup"] == "off"
            if self.closed and off and ex.state_tuples():
                self._spill_memory(ex)
            if ex.pending() and (cleanup or self.closed and not off):
                # The end of input (``cleanup="off"``: only when asked), or on demand: what
                # the spills held back, as a barrier after this micro-batch's rows.
                self._cleanup(cfg, ex)
                out.extend(cq.drain())
            out.extend(late_rows)
            if self.closed and ex.state_tuples():
                # Nothing pending (the end's clean-up ran): no row will join the memory
                # generations again, and the store need keep no rows for them
                # (``_store_changes``).
                ex.drop_memory()
            self.trash += ex.store.trash
            ex.store.trash = []
        if cfg.executor == "shed":
            self._shed_step(cq, tss[-1] if rows else None, out, t0)
        for i, ts, row, why in cq.rejected_rows[n_rej:]:
            primary, f1, r = secondary.get(id(row), (True, None, -1))
            if primary and cfg.reported[i]:  # an unmatched deletion, reported once
                rejected.append(_rejected_row(cfg, i, f1, r, ts, why))
        del cq.rejected_rows[:]
        self._store_changes(cfg, store, new)
        tup, byt = cq.executor.state_tuples(), cq.executor.state_bytes()
        pt, pb = cq.peak_state()
        self.peak_tuples = max(self.peak_tuples, tup, pt)
        self.peak_bytes = max(self.peak_bytes, byt, pb)
        return out, rejected, rows_in, received

    def _shed_step(self, cq, last, out: list, t0: float) -> None:
        """The load-shedding join's end of a micro-batch: at the end of input the tuples
        still in its input buffers; with a CPU budget per micro-batch, r for the next one
        from this one's CPU time; the expiry frontier held back to what buffered tuples
        and basic windows still reach (``ShedJoin.frontier``)."""
        ex = cq.executor
        if self.closed:
            out.extend(cq.finish())
        if last is not None:
            ex.end_batch(time.thread_time() - t0, last)
            self.shed_now = max(self.shed_now, last)
        self.expired = max(self.shed_expired, ex.frontier(self.shed_now))
        self.shed_expired = self.expired

    def _step_vector(self, cfg, go, advance, store, rejected, rows_in, received, pc, new):
        """``step``'s engine part with the vectorized executor: the released rows as one
        column batch, their output and the expiries' as Arrow (no row tuples)."""
        import pyarrow as pa
        cq = self.cq
        batch, primary, origin = _batch(cfg, go, pc)
        n_rej = len(cq.rejected_rows)
        outs = [cq.process_batch(batch)]  # (an empty batch: an empty table)
        if len(batch):
            self.expired = max(self.expired, int(batch.timestamps[-1]))
        if advance > -math.inf:
            outs.append(cq.advance_to(advance))
            self.expired = max(self.expired, advance)
        for (i, ts, _, why), k in zip(cq.rejected_rows[n_rej:], cq.rejected_at[n_rej:],
                                      strict=True):
            if primary[k] and cfg.reported[i]:  # an unmatched deletion, reported once
                rejected.append(_rejected_row(cfg, i, origin[0][k], origin[1][k], ts, why))
        del cq.rejected_rows[:], cq.rejected_at[:]
        self._store_changes(cfg, store, new)
        pt, pb = cq.peak_state()
        self.peak_tuples = max(self.peak_tuples, pt)
        self.peak_bytes = max(self.peak_bytes, pb)
        out = pa.concat_tables(outs) if len(outs) > 1 else outs[0]
        return out, rejected, rows_in, received

    def _emit_late(self, schema, rows: list, t) -> None:
        """``SpillTree.emit_table`` of the engine during a step: a batch clean-up's late
        results (at the end of input, on demand or while running) go to ``late_tables``
        as Arrow when their columns have the output's types (``late_table_fits``), else
        to ``rows``, which leave with the step's results the way every result goes."""
        from adaptcq.runtime.local import late_table_fits, table_rows
        if late_table_fits(t, schema):
            self.late_tables.append(t)
        else:
            rows.extend(table_rows(t))

    def _cleanup(self, cfg: _Config, ex) -> None:
        """The spills' held-back results (state-spill.txt §4) after this micro-batch's rows:
        at the end of the input everything is merged and nothing stays in memory; before
        it, merged groups come back into memory up to what a spill leaves free ((1 − f)
        of the group's budget, as a clean-up while running does) and the rest is written
        back to disk (``SpillTree.cleanup(keep=)``), its spill event in the journal."""
        if self.closed:
            ex.cleanup(final=True)
            self.journal, self.folded = [], None
            return
        ex.cleanup(keep=(1 - cfg.spill["fraction"]) * cfg.spill["budget"])
        # The journal restarts; the clean-up came after the last row processed (the tree's
        # own last row id may be earlier: rows its selections drop are not inserted).
        self.journal, self.folded = [(self.last_key, ts, groups)
                                     for _, ts, groups in ex.journal], None

    def _note_spills(self, ex, base: int, keys: list, n0: int, c0: int) -> None:
        """This micro-batch's spill events into the journal, each placed by the order key
        of the row at which it happened (row ids ``base + 1 ...`` are this batch's rows, in
        ``keys``' order); a clean-up in the batch restarts the journal."""
        if ex.counters.cleanups > c0:
            self.journal, self.folded, fresh = [], None, ex.journal
        else:
            fresh = ex.journal[n0:]
        for rid, ts, groups in fresh:
            at = rid - base - 1
            if not 0 <= at < len(keys):
                raise AdaptcqError(f"internal: spill event at row {rid} outside this "
                                   f"micro-batch's rows {base + 1}..{base + len(keys)}")
            self.journal.append((keys[at], ts, groups))

    def purge_trash(self) -> None:
        """Remove the spill files the committed micro-batch's clean-ups merged (no
        checkpoint names them any more)."""
        if self.trash:
            self.cq.executor.store.purge(self.trash)
            self.trash = []

    def _reject_late(self, cfg, i: int, t, report: np.ndarray, rejected: list,
                     after: np.ndarray) -> None:
        """Late rows (below the stream's frontier of earlier micro-batches minus the allowed
        lateness; ``after``: after an end of input, below the rows it processed), reported
        once per source by its first alias and once per update by its primary replica."""
        if not cfg.reported[i] or not report.any():
            return
        idx = np.flatnonzero(report)
        o1 = t.column("_o1").take(idx).to_pylist()
        o2 = t.column("_o2").take(idx).to_pylist()
        ts = t.column("_t").take(idx).to_pylist()
        whys = ("arrived after end of input",
                f"late by more than the allowed lateness ({cfg.lateness:g} s)")
        for f1, r, x, a in zip(o1, o2, ts, after[idx].tolist(), strict=True):
            rejected.append(_rejected_row(cfg, i, f1, r, x, whys[0] if a else whys[1]))

    def _store_changes(self, cfg: _Config, store: MemoryStore, new: list) -> None:
        """The micro-batch's changes to the store, once the engine has run it: its rows
        that can still matter as new entries (a row released and out of its ``[RANGE w]``
        window for good is never written: with micro-batches longer than the window most
        rows are, and a rebuild would read them only to drop them), and the entries none
        of whose rows can matter removed (module docstring)."""
        import pyarrow as pa
        if cfg.spill is not None and self.closed and not self.cq.executor.state_tuples():
            self._finished(store)
            return
        edge = self.edge = self._edge(cfg)
        for key, t in new:
            ts = t.column("_t").to_numpy()
            gone = self._gone(cfg, key[0], ts, edge)
            if gone.all():
                continue
            if gone.any():
                t, ts = t.filter(pa.array(~gone)), ts[~gone]
            blobs = _pieces(t)
            top = int(ts.max())
            for k, blob in enumerate(blobs):
                store.put((*key, k), (top, blob))
            self.entries[key] = (top, len(blobs), 0, t.num_rows)
        self._forget(cfg, store, edge)
        if cfg.spill is not None:
            self._fold_journal(cfg, edge)

    def _spill_memory(self, ex) -> None:
        """``cleanup="off"`` at the end of the input: every partition group still in memory
        goes to disk as a last spill event, as the local runtime's does, for the clean-up
        to come (a clean-up asked for in the same micro-batch then merges it at once); the
        store need keep no rows for them (``_store_changes``)."""
        n0 = len(ex.journal)
        ex.spill([(op.id, pid) for op in ex.ops for pid in op.parts])
        self.journal += [(self.last_key, ts, groups) for _, ts, groups in ex.journal[n0:]]

    def _finished(self, store: MemoryStore) -> None:
        """A spilling group at the end of its input with nothing in memory (cleaned up, or
        everything spilled): no row can matter to it again, not even to a rebuild, which
        then replays none, only the spill events' markers (``spill_tree.fold``). Its rows
        leave the store: a restart, or ``adaptcq cleanup``, rebuilds it at once."""
        from adaptcq.engine.spill_tree import fold
        for key, (_, n, _, _) in self.entries.items():
            for k in range(n):
                store.remove((*key, k))
        self.entries = {}
        if self.journal:
            self.folded, self.journal = fold(self.folded, self.journal), []

    def _edge(self, cfg: _Config) -> float:
        """Rows whose ``[RANGE w]`` window ended before this can never matter again: the
        expiry frontier, or with spilling the earliest window end of an input retired for a
        pending clean-up, when earlier (a rebuild replays its rows: ``spill_tree.horizon``)."""
        if cfg.spill is None:
            return self.expired
        from adaptcq.engine.spill_tree import horizon
        return horizon(self.cq.executor, self.expired)

    def _fold_journal(self, cfg: _Config, edge: float) -> None:
        """Spill events placed before every row the store keeps (row time below ``edge``
        minus the longest window) leave the journal; their markers stay (``folded``), which
        is all a rebuild needs of them (``spill_tree.replay``). Keeps the journal, and the
        meta it is written in, as long as the state the store keeps."""
        from adaptcq.engine.spill_tree import fold
        q = _logical(cfg)
        if any(s.window.kind != "range" for s in q.streams) or not self.journal:
            return
        oldest = edge - max(s.window.in_units(TIME_UNIT) for s in q.streams)
        n = next((k for k, e in enumerate(self.journal) if e[0][0] >= oldest),
                 len(self.journal))
        if n:
            self.folded = fold(self.folded, self.journal[:n])
            self.journal = self.journal[n:]

    def _gone(self, cfg: _Config, i: int, ts: np.ndarray, edge: float) -> np.ndarray:
        """Which of stream i's rows (times ``ts``) can never matter again: released, and
        expired from a ``[RANGE w]`` window (``t + w`` below the expiry frontier), the rule
        ``_forget`` applies to a whole entry by its newest row. Rows of other windows, and
        of the load-shedding join (whose stored fates follow its rows one by one), stay."""
        win = _logical(cfg).streams[i].window
        if win.kind != "range" or cfg.executor == "shed":
            return np.zeros(len(ts), bool)
        return is_released(ts, i, self.bound) & self._left_window(win, ts, edge)

    @staticmethod
    def _left_window(win, ts, edge: float):
        """Rows at times ``ts`` that left their ``[RANGE w]`` window for good: ``t + w``
        below ``edge`` (``_edge``: every arrival from here on is later than ``t + w``, and
        no input in memory holds them)."""
        return ts + win.in_units(TIME_UNIT) < edge

    def _forget(self, cfg: _Config, store: MemoryStore, edge: float) -> None:
        """Remove the entries none of whose rows can matter again (module docstring)."""
        q = _logical(cfg)
        for key, (top, n, done, rows) in list(self.entries.items()):
            i = key[0]
            if not is_released(top, i, self.bound):
                continue  # some rows still pending
            win = q.streams[i].window
            if win.kind == "range":
                dead = self._left_window(win, top, edge)
            elif win.kind == "rows":
                if not done:  # released in full now: n later rows push it out
                    self.entries[key] = (top, n, self.released[i], rows)
                    continue
                dead = self.released[i] - done >= int(win.size)
            else:
                dead = False
            if dead:
                for k in range(n):
                    store.remove((*key, k))
                del self.entries[key]

    def info(self, cfg: _Config, gkey: int | None = None) -> bytes:
        """The group's scalars for ``meta`` (no rows; but one entry record per (stream,
        micro-batch) whose rows can still matter: with unbounded windows they add up).
        ``group``: which partition group (its index) this state is of, and the grouping
        key and shuffle partitions it was written under (``check_group``)."""
        import dataclasses
        cq = self.cq
        return pickle.dumps({
            "v": 2, "groups": cfg.groups, "group": _group_index(cfg, gkey), "key": gkey,
            "key_partitions": cfg.key_partitions, "frontier": self.frontier, "seq": self.seq,
            "closed": self.closed, "late": self.late, "peak": (self.peak_tuples, self.peak_bytes),
            "bound": self.bound, "expired": self.expired, "entries": self.entries,
            "next_entry": self.next_entry, "released": self.released, "now": cq.now,
            "next_rid": cq.next_rid, "history": self.history,
            "stats": dataclasses.asdict(cq.stats), "plan": cq.executor.plan_state(),
            "shed": (self.shed_now, self.shed_expired),
            "spill": self._spill_info(cfg),
            "adapt": self._adapt_info()}, protocol=pickle.HIGHEST_PROTOCOL)

    def _spill_info(self, cfg: _Config) -> dict | None:
        """A spilling group's part of ``meta``: its spill folder's events (the files this
        version names), the journal, the tree's counters and the files to remove once this
        version is committed."""
        if cfg.spill is None:
            return None
        import dataclasses
        ex = self.cq.executor
        return {"events": [dict(ev) for ev in ex.store.events], "journal": self.journal,
                "folded": self.folded, "edge": self.edge, "last_key": self.last_key,
                "counters": dataclasses.asdict(ex.counters), "trash": self.trash}

    # ----- adaptivity --------------------------------------------------------------------
    def attach(self, cfg: _Config, saved: tuple | None = None) -> None:
        """Attach the group's policies: fresh ones from ``cfg.adaptivity``, or those of
        ``saved`` (the pickled profiler and policies) with fresh ones where it has None."""
        from adaptcq.runtime.spark import make_policies
        spec = cfg.adaptivity
        if spec is None:
            return
        if saved is None and self.planned is not None and spec.get("optimizer") is not None:
            # The initial plan was set before the rebuild and is in the restored orders.
            # (and the parameters only it took: make_policies refuses unused ones)
            from adaptcq.adapt.compose import params_used
            named = ("optimizer", "reorder", "caching")
            params = {k: v for k, v in spec.items() if k not in named}
            kept = params_used(None, spec.get("reorder"), spec.get("caching"), params)
            spec = {**{k: spec.get(k) for k in named}, "optimizer": None,
                    **{k: params[k] for k in kept}}
            if spec["reorder"] == "off" and spec["caching"] is None:
                return
        fresh = make_policies(spec)
        if saved is not None:
            profiler, kept = saved
            if len(kept) != len(fresh):
                raise AdaptcqError("the group's saved policies do not match the query's "
                                   "adaptivity; restart with a new --checkpoint")
            self.cq.attach(profiler)  # the query's profiler, statistics and all
            fresh = [f if k is None else k for k, f in zip(kept, fresh, strict=True)]
        self.policies = fresh
        for policy in self.policies:
            self.cq.attach(policy)

    def report(self, policies: list | None = None) -> dict:
        """What the group's policies decided: their ``report()`` dicts merged (JSON-able),
        with the optimizer's once its plan is set, even from before a rebuild."""
        from adaptcq.runtime.spark import _jsonable_report
        merged: dict = {} if policies is not None else dict(self.planned or {})
        for policy in self.policies if policies is None else policies:
            if type(policy).__name__ == "InitialPlan" and getattr(policy, "done", False):
                self.planned = _jsonable_report(policy.report())
            merged.update(policy.report())
        return _jsonable_report(merged)

    def policy_state(self) -> tuple | None:
        """(the query's profiler, each policy or None where it restarts after a rebuild)."""
        if not self.policies or getattr(self.cq, "profiler", None) is None:
            return None
        from adaptcq.adapt.acaching import ACaching
        return (self.cq.profiler,
                [None if isinstance(p, ACaching) else p for p in self.policies])

    def dump_policies(self) -> bytes | None:
        """The profiler and policies that continue after a rebuild, pickled (None: none,
        or they do not pickle and restart)."""
        saved = self.policy_state()
        return _dump_policies(self.cq, saved) if saved is not None else None

    def _adapt_info(self) -> dict | None:
        if not self.policies and self.planned is None:
            return None
        full = self.report()  # (also records ``planned``)
        saved = self.policy_state()
        kept = saved[1] if saved is not None else [None] * len(self.policies)
        restarting = [p for p, k in zip(self.policies, kept, strict=True) if k is None]
        return {"full": full, "restarting_kept": self.report(restarting) if restarting else {},
                "planned": self.planned, "earlier": self.earlier, "restores": self.restores,
                "continued": self.continued}

    def _carry(self, cfg: _Config, adapt: dict | None, blob: bytes | None) -> None:
        """Attach the policies after a rebuild: the saved ones continue when they load."""
        if adapt is None:
            self.attach(cfg)
            return
        self.planned, self.restores = adapt["planned"], adapt["restores"] + 1
        self.earlier = list(adapt["earlier"])
        if blob is not None:
            try:
                saved = _load_policies(cfg, blob)
            except Exception:  # noqa: BLE001 - saved policies that no longer load: fresh ones
                saved = None
            if saved is not None:
                restarted = adapt["restarting_kept"]
                self.continued = adapt["continued"] + 1
                if restarted:
                    self.earlier = [*self.earlier, restarted][-_EARLIER:]
                self.attach(cfg, saved)
                return
        self.continued = adapt["continued"]
        self.earlier = [*self.earlier, adapt["full"]][-_EARLIER:]
        self.attach(cfg)


def _engine_options(cfg: _Config, store: MemoryStore | None = None) -> dict:
    """The group's executor options; the load-shedding join's with its arrivals' fates
    tracked and, on a rebuild, the shedder's saved state (``ShedJoin.shed_state``)."""
    options = engine_options(cfg.options)
    if cfg.executor == "shed":
        options["track"] = True
        if store is not None:
            options["state"] = store.get_adapt()
    return options


def _spill_engine(cfg: _Config, gkey: int, events: list):
    """Group ``gkey``'s operator tree spilling under its share of the budget
    (``runtime.spill.spark_spill_spec``) into its folder ``<directory>/group-NNNNN``, the
    folder holding exactly ``events`` (a checkpoint's; [] for a new group): files of work
    never committed are removed (``SpillStore.restore``). Clean-ups defer removing the
    files they merged (``PartitionGroup.trash``)."""
    from pathlib import Path

    import pyarrow as pa

    from adaptcq.adapt.spilling import SpillPolicy
    from adaptcq.engine.continuous import ContinuousQuery
    from adaptcq.state.spill_store import MANIFEST, SpillStore
    sp = cfg.spill
    q = _logical(cfg)
    _claim(Path(sp["directory"]), cfg)
    folder = group_folder(cfg, gkey)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / MANIFEST).unlink(missing_ok=True)  # the checkpoint's events are the truth
    store = SpillStore(folder, q.columns, cfg.inputs, time_type=pa.int64(), deferred=True)
    store.restore(events)
    policy = SpillPolicy(sp["strategy"], sp["budget"], fraction=sp["fraction"],
                         every=sp["every"], seed=sp["seed"] + gkey,
                         cleanup_when_free=sp["when_free"])
    return ContinuousQuery(q, "tree", cfg.mode, time_unit=TIME_UNIT,
                           explicit_deletions=cfg.signed, partitions=sp["partitions"],
                           store=store, spill=policy, late_column=True,
                           sample=sp["sample"], seed=sp["seed"] + gkey,
                           **_engine_options(cfg))


def group_folder(cfg: _Config, gkey: int):
    """Where partition group ``gkey`` spills: ``<directory>/group-NNNNN``."""
    from pathlib import Path
    return Path(cfg.spill["directory"]) / f"group-{gkey:05d}"


def _claim(root, cfg: _Config) -> None:
    """The spill folder is this query's: ``adaptcq-spill.json`` records the query and its
    groups the first time; a folder recording another stops the group (two queries given
    one folder would remove each other's files)."""
    import hashlib
    from pathlib import Path

    from adaptcq.state.spill_store import SpillError
    want = {"query": hashlib.sha256(" ".join(cfg.sql.split()).encode()).hexdigest()[:16],
            "groups": cfg.groups}
    mark = Path(root) / "adaptcq-spill.json"
    try:
        have = json.loads(mark.read_text())
    except FileNotFoundError:
        mark.parent.mkdir(parents=True, exist_ok=True)
        tmp = mark.with_name(f"{mark.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(want))
        os.replace(tmp, mark)  # (every group writes the same: whichever lands is right)
        return
    except (OSError, ValueError) as e:
        raise SpillError(f"spill folder {root}: {mark.name} cannot be read ({e})") from None
    if have != want:
        raise SpillError(f"spill folder {root} holds the spilled state of another query or "
                         "partitioning; give each query its own folder (next to its "
                         "checkpoint)")


def _replay_spilling(cfg: _Config, gkey: int, go: list, info: dict, pc):
    """A spilling group's engine rebuilt from its stored rows (``go``, released): the tree
    over its spill folder as ``info`` recorded it, the rows processed again without output
    and the journal's spill events replayed where they happened (``spill_tree.replay``),
    then the expiries of the last micro-batch, the counters and the clock. The rows become
    Python rows ``REPLAY_ROWS`` at a time: a rebuild holds the group's stored rows as Arrow
    and one chunk of them as Python rows, besides the tree it rebuilds. Returns (engine,
    the number of rows replayed, the last one's order key or None)."""
    from adaptcq.engine.continuous import Counters
    from adaptcq.engine.spill_tree import SpillCounters, replay
    sp = info["spill"]
    cq = _spill_engine(cfg, gkey, sp["events"])
    # Entries are kept whole while one of their rows can matter: their rows that cannot
    # (window ended before the saved edge) are not replayed; every journal event folded
    # away precedes every row replayed (``PartitionGroup._fold_journal``).
    q = _logical(cfg)
    import pyarrow as pa
    edge, kept = sp.get("edge", -math.inf), []
    for i, t in go:
        win = q.streams[i].window
        if win.kind == "range":
            t = t.filter(pa.array(~PartitionGroup._left_window(
                win, t.column("_t").to_numpy(), edge)))
        if t.num_rows:
            kept.append((i, t))
    cq.next_rid = info["next_rid"]  # fresh row ids: the spilled rows keep theirs
    chunks = _OrderedChunks(cfg, kept, pc)
    replay(cq, chunks, sp["journal"], sp.get("folded"))
    if info["expired"] > -math.inf:
        cq.advance_to(info["expired"])
        cq.drain()
    cq.now = info["now"]
    cq.stats = Counters(**info["stats"])
    cq._next_sample = cq.stats.updates + cq.sample_every
    cq.executor.counters = SpillCounters(**sp["counters"])
    return cq, chunks.rows, chunks.last


REPLAY_ROWS = 65_536  # rows a rebuild turns into Python rows at a time


def _concat(tables: list):
    """One table of a stream's Arrow tables (None for none)."""
    import pyarrow as pa
    if not tables:
        return None
    return tables[0] if len(tables) == 1 else pa.concat_tables(tables)


def is_released(ts, i: int, bound: tuple):
    """Whether rows of stream i at times ``ts`` (a number or an array) are at or before
    the release bound ``(ts, stream)``: the local runtime's order of equal times is the
    streams' FROM order."""
    bts, bs = bound
    return (ts < bts) | ((ts == bts) & (i <= bs))


def _released(tables: list, bound: tuple) -> tuple[list, list]:
    """Split each stream's rows (a table or None) at the release bound ``(ts, stream)``:
    ([(stream, released rows)] for streams with some, [pending rows or None per stream])."""
    import pyarrow as pa
    go, pending = [], [None] * len(tables)
    for i, t in enumerate(tables):
        if t is None:
            continue
        mask = is_released(t.column("_t").to_numpy(), i, bound)
        if mask.all():
            go.append((i, t))
        elif mask.any():
            go.append((i, t.filter(pa.array(mask))))
            pending[i] = t.filter(pa.array(~mask))
        else:
            pending[i] = t
    return go, pending


def _rejected_row(cfg: _Config, i: int, f1, r, ts, why) -> tuple:
    """A rejected row (late, or an unmatched deletion) as the rejected output has it: its
    source, its row in its file and the file (-1 and no file when the input is not a
    file)."""
    f = _file_of(f1)
    return (cfg.sources[i], r if f is not None or not (f1 or "") else -1, f, ts, why)


def _check_python_values(cfg: _Config, i: int, t) -> None:
    """Stream i's released rows become Python values: one Python cannot hold exactly (a date
    past 9999, a time64[ns] below the µs) is refused naming its file, row and column, as
    the local runtime refuses it (``merge.python_misfit``), not a bare OverflowError."""
    for j, c in enumerate(cfg.stream_columns[i]):
        col = t.column(c)
        why = python_misfit(col)
        if why is None:
            continue
        k = first_misfit_row(col)
        f = _file_of(t.column("_o1")[k].as_py())
        try:  # the user's name of the column (it travels as c<i>_<j>)
            name = _logical(cfg).columns[cfg.aliases[i]][j]
        except (AttributeError, KeyError, IndexError):
            name = c
        raise InputError(
            f"stream {cfg.sources[i]}{f' (file {f})' if f else ''}: row "
            f"{t.column('_o2')[k].as_py()} has a value in column {name!r} ({col.type}) {why}; "
            "the tuple-at-a-time executors take each row as Python values and would lose "
            "it, --executor vector keeps columns in Arrow")


def _ordered(cfg: _Config, go: list, pc, keys: bool = False) -> tuple:
    """The released rows of every stream, merged in the local runtime's order: (streams,
    signs or None, times, rows, ids of rows that are not primary replicas of a deletion),
    and with ``keys`` each row's order key (time, stream, micro-batch, file, row) as a
    tuple. Rows become the engine's Python tuples here, column by column."""
    if not go:
        return ([], None, [], [], set(), []) if keys else ([], None, [], [], set())
    per_rows = {}
    for i, t in go:
        _check_python_values(cfg, i, t)
        cols = [t.column(c).to_pylist() for c in cfg.stream_columns[i]]
        per_rows[i] = list(zip(*cols, strict=True)) if cols else [()] * t.num_rows
    k = _order_keys(cfg, go, pc)
    streams = k.column("_s").to_pylist()
    idx = k.column("_k").to_pylist()
    rows = [per_rows[s][j] for s, j in zip(streams, idx, strict=True)]
    tss = k.column("_t").to_pylist()
    signs = None
    secondary: dict = {}
    if cfg.signed:
        signs = k.column("_sg").to_pylist()
        pr = k.column("_pr").to_numpy(zero_copy_only=False)
        sg = np.asarray(signs)
        # every deletion's row object -> (primary replica?, file key, row): an unmatched one
        # is reported by its primary replica, by file and row as a late row is
        neg = np.flatnonzero(sg < 0)
        o1 = k.column("_o1").take(neg).to_pylist()
        o2 = k.column("_o2").take(neg).to_pylist()
        secondary = {id(rows[j]): (bool(pr[j]), f1, r)
                     for j, f1, r in zip(neg.tolist(), o1, o2, strict=True)}
    if keys:
        return streams, signs, tss, rows, secondary, _Ranks().keys(k, tss, streams)
    return streams, signs, tss, rows, secondary


class _Ranks:
    """Rows' order keys as tuples (time, stream, micro-batch, file, row, rank), from their
    sorted order-key table, a slice at a time. A user's order column need not be unique:
    rows of equal key are told apart by their rank among them, the same in a rebuild (the
    sort is stable), across slices too."""

    def __init__(self):
        self.last, self.n = None, 0

    def keys(self, k, tss: list, streams: list) -> list:
        files = [f or "" for f in k.column("_o1").to_pylist()]
        out, last, n = [], self.last, self.n
        for key in zip(tss, streams, k.column("_q").to_pylist(), files,
                       k.column("_o2").to_pylist(), strict=True):
            n = n + 1 if key == last else 0
            last = key
            out.append((*key, n))
        self.last, self.n = last, n
        return out


class _OrderedChunks:
    """``_ordered``'s rows (no signs: the spilling tree runs in append mode) and order keys
    in slices of ``REPLAY_ROWS``: (streams, times, rows, keys) per slice, the rows becoming
    Python tuples only for their slice. Counts the rows (``rows``) and keeps the last
    key (``last``)."""

    def __init__(self, cfg: _Config, go: list, pc):
        self.cfg, self.tables = cfg, dict(go)
        self.order = _order_keys(cfg, go, pc) if go else None
        self.rows, self.last = 0, None

    def __iter__(self):
        import pyarrow as pa
        if self.order is None:
            return
        ranks = _Ranks()
        for a in range(0, self.order.num_rows, REPLAY_ROWS):
            k = self.order.slice(a, REPLAY_ROWS)
            streams = k.column("_s").to_pylist()
            s = np.asarray(streams)
            idx = k.column("_k").to_numpy()
            rows: list = [None] * len(streams)
            for i in np.unique(s).tolist():
                at = np.flatnonzero(s == i)
                part = self.tables[i].take(pa.array(idx[at]))
                cols = [part.column(c).to_pylist() for c in self.cfg.stream_columns[i]]
                for j, row in zip(at.tolist(), zip(*cols, strict=True) if cols
                                  else [()] * len(at), strict=True):
                    rows[j] = row
            tss = k.column("_t").to_pylist()
            keys = ranks.keys(k, tss, streams)
            self.rows += len(rows)
            self.last = keys[-1]
            yield streams, tss, rows, keys


def vector_engine(query: LogicalQuery, mode: str, inputs: dict, signed: bool, options: dict):
    """A group's vectorized executor with its per-batch ordering
    (``adapt.batch_order.vector_executor``; ``options``: ``orders``, ``ordering``)."""
    from adaptcq.adapt.batch_order import vector_executor
    unknown = sorted(set(options) - {"orders", "ordering"})
    if unknown:
        raise ValueError(f"unknown option {unknown[0]!r} for the vectorized executor "
                         "(accepted: orders, ordering)")
    return vector_executor(query, mode, inputs, time_unit=TIME_UNIT, signed=signed,
                           orders=options.get("orders"), ordering=options.get("ordering"))


def _take_scalars(cq, info: dict) -> None:
    """A vectorized executor loaded from stored rows takes the group's counters and time."""
    from adaptcq.engine.continuous import Counters
    cq.stats = Counters(**info["stats"])
    cq.now = info["now"]


def _batch(cfg: _Config, go: list, pc):
    """The released rows of every stream as one ArrivalBatch in the local runtime's order
    (``_ordered``'s order, as columns: each stream's table reordered, its columns named as
    the query's and typed as ``cfg.inputs``), and the primary-replica mask per arrival."""
    import pyarrow as pa

    from adaptcq.stream.merge import ArrivalBatch
    n = cfg.n_streams
    if not go:
        return ArrivalBatch(np.empty(0, np.int64), np.empty(0, np.int64),
                            None, [None] * n), np.empty(0, bool), ([], [])
    k = _order_keys(cfg, go, pc)
    st = k.column("_s").to_numpy().astype(np.int64)
    idx = k.column("_k").to_numpy()
    tables: list = [None] * n
    for i, t in go:
        alias = cfg.aliases[i]
        names = _logical(cfg).columns[alias]
        part = t.select(cfg.stream_columns[i]).rename_columns(list(names))
        want = cfg.inputs[alias]
        if part.schema != want:
            part = part.cast(want)
        take = idx[st == i]
        if len(take) != part.num_rows or (np.diff(take) != 1).any():
            part = part.take(pa.array(take))
        tables[i] = part
    signs = k.column("_sg").to_numpy().astype(np.int64) if cfg.signed else None
    primary = k.column("_pr").to_numpy(zero_copy_only=False)
    # (file key, row) per arrival, for reporting a rejected deletion (signed inputs only)
    origin = ((k.column("_o1").to_pylist(), k.column("_o2").to_pylist()) if cfg.signed
              else ([], []))
    return ArrivalBatch(st, k.column("_t").to_numpy(), signs, tables), primary, origin


def _order_keys(cfg: _Config, go: list, pc):
    """The released rows' order keys (time, stream, micro-batch, file, row; with each row's
    index ``_k`` in its stream's table, its sign and primary flag), sorted in the local
    runtime's order (``_ORDER``). One stream's rows in strictly increasing time need no
    sort."""
    import pyarrow as pa
    keys = []
    for i, t in go:
        keys.append(pa.table({"_t": t.column("_t"),
                              "_s": pa.array(np.full(t.num_rows, i, np.int32)),
                              "_q": t.column("_q"),
                              "_o1": pc.cast(t.column("_o1"), pa.string()),
                              "_o2": t.column("_o2"),
                              "_k": pa.array(np.arange(t.num_rows, dtype=np.int64)),
                              "_sg": t.column("_sg") if cfg.signed else
                              pa.array(np.ones(t.num_rows, np.int8)),
                              "_pr": t.column("_pr")}))
    k = pa.concat_tables(keys) if len(keys) > 1 else keys[0]
    if len(keys) > 1 or not _sorted_by_order(k):
        k = k.take(pc.sort_indices(k, [(c, "ascending") for c in _ORDER]))
    return k


def _sorted_by_order(k) -> bool:
    """One stream's rows in strictly increasing time: already in (time, micro-batch, file,
    row) order, so the sort can be skipped (equal times: the other keys decide, sort)."""
    t = k.column("_t").to_numpy()
    return k.num_rows < 2 or bool((np.diff(t) > 0).all())


class _PolicyPickler(pickle.Pickler):
    """Pickles a group's profiler and policies: the logical query they refer to becomes a
    reference (re-bound on load to the worker's copy, which the rebuilt engine runs); the
    engine itself must not be reachable (it would not survive as the same object)."""

    def __init__(self, file, cq):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.cq = cq

    def persistent_id(self, obj):
        if isinstance(obj, LogicalQuery):
            return "query"
        if obj is self.cq or obj is self.cq.executor:
            raise pickle.PicklingError("a policy holds the engine")
        return None


class _PolicyUnpickler(pickle.Unpickler):
    def __init__(self, file, query: LogicalQuery):
        super().__init__(file)
        self.query = query

    def persistent_load(self, pid):
        if pid == "query":
            return self.query
        raise pickle.UnpicklingError(f"unknown reference {pid!r}")


def _dump_policies(cq, saved: tuple) -> bytes | None:
    """``saved`` pickled, or None when it does not pickle (the policies then restart after a
    rebuild, as A-Caching always does)."""
    buf = io.BytesIO()
    try:
        _PolicyPickler(buf, cq).dump(saved)
    except (pickle.PicklingError, TypeError, AttributeError, RecursionError):
        return None
    return buf.getvalue()


def _load_policies(cfg: _Config, blob: bytes) -> tuple:
    return _PolicyUnpickler(io.BytesIO(blob), _logical(cfg)).load()


# ----- the StatefulProcessor -------------------------------------------------------------------

_LIVE: dict[tuple[str, int], tuple[tuple[int, int], PartitionGroup]] = {}


def decode(packets) -> tuple[dict, list, bool, bool]:
    """A group's packets of one micro-batch, (stream, bytes) pairs from ``ColumnarSplit``:
    (stream -> its Arrow tables, [(stream, max time, rows)], end of input seen, clean-up
    asked for)."""
    parts: dict[int, list] = {}
    maxima: list = []
    end = cleanup = False
    for s, p in packets:
        if s == PUNCT:
            pu = json.loads(p)
            end |= pu["end"]
            cleanup |= pu.get("cleanup", False)
            maxima.extend(pu["maxima"])
        else:
            parts.setdefault(s, []).append(read_part(p))
    return parts, maxima, end, cleanup


def _group_index(cfg: _Config, gkey: int | None) -> int | None:
    """The partition group (index into ``cfg.keys``) whose grouping key is ``gkey``."""
    keys = list(cfg.keys or ())
    return keys.index(gkey) if gkey in keys else None


def check_group(cfg: _Config, gkey: int, info: dict) -> None:
    """Refuse the stored state of another partition group: the state under grouping key
    ``gkey`` was written by the group that had that key then; if that group is not the
    one that has it now (a restart whose grouping keys were chosen for other shuffle
    partitions), its rows are not this group's rows and the results would be wrong."""
    was, now = info.get("group"), _group_index(cfg, gkey)
    if was is None or now is None or was == now:  # (state of an older version: no record)
        return
    then, here = info.get("key_partitions"), cfg.key_partitions
    raise AdaptcqError(
        f"partition group {now} (grouping key {gkey}) found the state of partition group "
        f"{was} in the checkpoint: the groups' grouping keys differ from the first run's "
        "(they are chosen for spark.sql.shuffle.partitions, which was "
        f"{'unknown' if then is None else then} when the state was written and is "
        f"{'unknown' if here is None else here} now); restart with "
        "spark.sql.shuffle.partitions as it was, or pass continuous_query the first run's "
        "group_keys (frame._adaptcq['group_keys'])")


def can_catch_up(cfg: _Config) -> bool:
    """A stale live copy can be caught up when the engine's SteMs (or column windows) are
    its whole state (MJoin, the vectorized executor) and no policy holds statistics the
    copy would lack (without adaptivity); it is, when that reads fewer rows than a rebuild
    (``PartitionGroup.rows_since``)."""
    return cfg.executor in ("mjoin", "vector") and cfg.adaptivity is None


def advance_group(cfg: _Config, gkey: int, store: MemoryStore, packets
                  ) -> tuple[PartitionGroup, list, list, float, dict] | None:
    """One micro-batch of group ``gkey``: the live group if the store's token matches,
    else one rebuilt from the store; its step; its changes and meta written to ``store``.
    Returns (group, results, rejected rows, engine CPU seconds, statistics); None for a
    spilling group's tick, which changes nothing."""
    parts, maxima, end, cleanup = decode(packets)
    meta = store.get_meta()
    live = _LIVE.get((cfg.qid, gkey))
    if cfg.spill is not None and meta is not None and not (parts or maxima or end or cleanup):
        # A tick (``spark.signal_tick``): nothing to process, no state to change; the spill
        # files the committed version's clean-ups merged go, without a rebuild.
        from adaptcq.state.spill_store import purge_files
        purge_files(group_folder(cfg, gkey), pickle.loads(meta[2])["spill"]["trash"])
        if live is not None and live[0] == (meta[0], meta[1]):
            live[1].trash = []
        return None
    t0 = time.process_time()
    caught_up = False
    if meta is None:
        eng, version, hit = PartitionGroup.new(cfg, gkey), 0, False
    elif live is not None and live[0] == (meta[0], meta[1]):
        eng, version, hit = live[1], meta[0], True
    else:  # the state store is the source of truth: catch up with it, or rebuild from it
        hit = False
        info = pickle.loads(meta[2])
        check_group(cfg, gkey, info)
        if (live is not None and can_catch_up(cfg)
                and list(live[0]) in map(list, info["history"])
                and live[1].rows_since(info) <= sum(e[3] for e in info["entries"].values())):
            eng, version, caught_up = live[1], meta[0], True
            eng.catch_up(cfg, store, info)
        else:
            eng, version = PartitionGroup.rebuild(cfg, store, gkey), meta[0]
    rebuild_cpu = time.process_time() - t0
    if cfg.spill is not None:
        eng.purge_trash()  # the version that merged them is committed: the store says so
    # Whatever happens below, the live object is about to change: forget it first, so a
    # failure half-way can never leave a cached engine that disagrees with the store.
    _LIVE.pop((cfg.qid, gkey), None)
    t0 = time.process_time()
    updates0 = eng.cq.stats.updates  # (the stored total: a run reports its own updates)
    with collector.paused():  # one collection a micro-batch (adaptcq.collector)
        out, rejected, rows_in, received = eng.step(cfg, parts, maxima, end, store, cleanup)
    cpu = time.process_time() - t0
    token = int.from_bytes(os.urandom(7), "little")
    eng.history = [*eng.history, (version + 1, token)][-_HISTORY:]
    info = eng.info(cfg, gkey)
    store.put_meta((version + 1, token, info))
    if cfg.adaptivity is not None:
        store.put_adapt(eng.dump_policies())
    elif cfg.executor == "shed":  # the shedder's own state (ShedJoin.shed_state)
        store.put_adapt(eng.cq.executor.shed_state(eng.shed_now))
    _LIVE[(cfg.qid, gkey)] = ((version + 1, token), eng)
    while len(_LIVE) > 256:  # entries of finished queries
        del _LIVE[next(iter(_LIVE))]
    return eng, out, rejected, cpu, {
        "rows_in": rows_in, "shipped": received, "cache_hit": hit,
        "updates_before": updates0,
        "caught_up": caught_up, "rebuild_cpu_seconds": rebuild_cpu,
        "rebuilt_rows": 0 if hit else eng.rebuilt_rows,
        "entries": len(eng.entries), "meta_bytes": len(info)}


class GroupProcessor(StatefulProcessor):
    """The StatefulProcessor run by ``transformWithStateInPandas``: one ``PartitionGroup``
    per grouping key (state-spill.txt §2.1's unit of state; §5's partitioned operator
    instance), its state in a ``SparkStore``. The class lives at module level so that Spark
    pickles it by reference and ``_LIVE`` is the worker module's own dict, which survives
    from one micro-batch to the next in a reused worker."""

    def __init__(self, cfg: _Config):
        self.cfg = cfg

    def init(self, handle) -> None:
        self.store = SparkStore(
            handle.getValueState("meta", "version long, token long, info binary"),
            handle.getMapState("rows", "stream int, entry long, piece int",
                               "top long, data binary"),
            handle.getValueState("adapt", "data binary"))

    def handleInputRows(self, key, rows, timerValues) -> Iterator:
        cfg = self.cfg
        gkey = int(key[0])
        # (By position: pyspark rebuilds these frames from itertuples, which renames
        # columns starting with an underscore.)
        packets = ((s, p) for pdf in rows
                   for s, p in zip(pdf.iloc[:, -2].tolist(), pdf.iloc[:, -1].tolist(),
                                   strict=True))
        done = advance_group(cfg, gkey, self.store, packets)
        if done is not None:
            from adaptcq.runtime.spark import _frames
            yield from _frames(cfg, gkey, *done)
        freeze_imports()  # the worker's imports are done (spark_daemon.freeze_imports)

    def close(self) -> None:
        pass
