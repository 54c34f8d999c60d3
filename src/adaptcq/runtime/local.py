"""The single-process runtime: a streaming driver around one ContinuousQuery.

Inputs are read a chunk at a time and merged into the arrival order (``stream.merge``);
results leave as Arrow record batches as soon as a few thousand have been produced. Memory
is the query's state plus a few chunks, never the size of the input or of the output
(ARCHITECTURE.md, "Streaming runtimes"):

* ``LocalRun(...)`` checks everything that can be checked before any row is read (sources,
  query, options, output schema); iterating it runs the query and yields result batches.
* ``adaptcq.stream(...)`` returns a ``LocalRun``: a generator of result batches for callers
  who consume results live (sources may be generators that never end).
* ``adaptcq.run(...)`` collects the batches into a ``RunResult`` (a Table: for finite
  inputs whose output fits in memory).
* The CLI writes each batch to a Parquet, CSV or JSON-lines file (or stdout) as it comes.

A run can be stopped between two updates (``stop()``, which the CLI calls on Ctrl-C and
SIGTERM): the output then holds exactly the results of the arrivals processed, and
``stats`` says where the input stopped. ``max_results`` stops a run whose output exceeds a
bound.
"""

from __future__ import annotations

import contextlib
import inspect
import numbers
import os
import resource
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from adaptcq import collector
from adaptcq.checks import whole
from adaptcq.engine.continuous import ContinuousQuery
from adaptcq.errors import AdaptcqError, InputError, OptionError, QueryError
from adaptcq.query.logical import LogicalQuery
from adaptcq.runtime.output import OutputClosed
from adaptcq.stream.arrays import to_numpy
from adaptcq.stream.eventtime import (
    NS_MAX,
    check_unit,
    from_nanoseconds,
    lateness_ns,
    output_time_type,
)
from adaptcq.stream.merge import ArrivalMerger, Arrivals, _Feed
from adaptcq.stream.sources import CHUNK_ROWS, Source, open_source, schema_kinds, value_type

TIME_UNIT = 1e-9  # the engine runs on int64 nanoseconds: exact window boundaries
MAX_BATCH = 32_768  # arrivals per call into the engine, at most
OUT_CHUNK = 65_536  # result rows per output batch (and the bound on buffered results)
CHUNK_ROWS_MAX = 2**63 - 1  # the largest chunk_rows Arrow's readers take (int64)

# A rejected input row: its source, its row number in its file (in the input, for a source
# that is not files) and the file, as the Spark runtime names it; ts in seconds.
REJECTED_SCHEMA = pa.schema([("stream", pa.string()), ("row", pa.int64()),
                             ("file", pa.string()), ("ts", pa.float64()),
                             ("reason", pa.string())])

RUN_OPTIONS = ("orders", "tree", "nested_loop", "policies", "cache_options", "trace",
               "sample_every", "batch_rows", "batch_seconds", "ordering", "spill", "shed",
               "seed")
"""Keyword options of ``run``/``stream`` passed on to the engine (anything else is refused).
``seed`` seeds the profiling sample of the policy ``ordering`` becomes when ``auto`` falls
back to MJoin; a run that would not use it refuses it."""


@dataclass
class RunResult:
    """The output of a run and its statistics."""

    table: pa.Table
    stats: dict
    rejected: pa.Table
    samples: list = field(default_factory=list)
    query: LogicalQuery | None = None
    plan: str = ""

    def to_pandas(self):
        return self.table.to_pandas()


class LocalRun:
    """One continuous query over its sources in this process, run incrementally.

    Iterating yields result record batches (schema ``self.schema``: the SELECT columns with
    their input types, ``_sign`` int8, ``_ts`` of the input's time type). Rejected input rows
    go to ``on_rejected`` (a callable taking a RecordBatch of ``REJECTED_SCHEMA``) or, by
    default, are kept in ``rejected`` batches.
    """

    def __init__(self, sql: str | LogicalQuery, sources: Mapping[str, object],
                 timestamp: str = "ts", executor: str = "auto", mode: str = "append",
                 sign: str | None = None, allowed_lateness: float = 0.0,
                 timestamp_unit: str | None = None, max_results: int | None = None,
                 chunk_rows: int = CHUNK_ROWS,
                 on_rejected: Callable[[pa.RecordBatch], None] | None = None,
                 progress: Callable[[int, int | None], None] | None = None, **options):
        unknown = sorted(set(options) - set(RUN_OPTIONS))
        if unknown:
            raise OptionError(f"unknown option {unknown[0]!r}; the options are: timestamp, "
                               "executor, mode, sign, allowed_lateness, timestamp_unit, "
                               "max_results, chunk_rows, on_rejected, progress, "
                               f"{', '.join(RUN_OPTIONS)}")
        _check_option_types(options)
        t0 = time.process_time()
        self.mode = mode
        self.unit = timestamp_unit
        check_unit(timestamp_unit)
        self.lateness = lateness_ns(allowed_lateness)
        self.max_results = _positive(max_results, "--max-results", allow_none=True)
        for what, fn in (("on_rejected", on_rejected), ("progress", progress)):
            if fn is not None and not callable(fn):  # (it failed at the first late row)
                raise OptionError(f"{what} must be a callable (or None), got {fn!r}")
        if not isinstance(sql, (str, LogicalQuery)):  # (parsing it raised a raw TypeError)
            raise QueryError(f"the query must be its SQL text (a string), got "
                             f"{type(sql).__name__}")
        if not isinstance(sources, Mapping) or not sources:
            raise InputError("no inputs: give a source for each stream of the query")
        check_sign_column(sign, timestamp)
        self.sources = open_sources(sources, timestamp, timestamp_unit, chunk_rows)
        try:  # a set-up error closes the inputs opened (not a later garbage collection)
            if isinstance(sql, LogicalQuery):
                query = sql
            else:
                try:
                    query = parse_signed(sql, {n: schema_kinds(s.schema)
                                               for n, s in self.sources.items()}, sign)
                except QueryError:
                    refuse_missing_inputs(sql, self.sources)
                    raise
            self.query = query
            require_inputs(query, self.sources)
            self._check_columns()
            self.sign = self._check_sign(sign)
            self.executor_name, self.executor_reason = choose_executor(
                executor, query, options, {n: s.schema for n, s in self.sources.items()})
            _check_plan_options(self.executor_name, self.executor_reason, options)
            check_orders(query, options.get("orders"))
            self.schema = output_schema(query, {n: s.schema for n, s in self.sources.items()},
                                        timestamp, timestamp_unit,
                                        late=self.executor_name == "tree")
            self.ts_type = self.schema.field("_ts").type
            self.spill = None  # runtime.spill.SpillSetup of the operator tree
            self.vector = self.executor_name == "vector"
            if self.executor_name != "tree" and options.pop("spill", None) is not None:
                # (for every executor: the vectorized one dropped it, unsaid)
                raise OptionError("spill options (--spill, --memory) need the operator "
                                  f"tree (--executor tree); this run uses {self.executor_name}")
            self.batch_rows, self.batch_seconds = batch_options(
                self.executor_name, options.pop("batch_rows", None),
                options.pop("batch_seconds", None))
            seed = options.pop("seed", None)
            if seed is not None:
                if whole(seed) is None:
                    raise OptionError(f"seed must be a whole number, got {seed!r}")
                seed = whole(seed)  # (random.Random refuses NumPy's integers)
            if self.vector:
                if seed is not None:
                    raise OptionError(
                        f"--seed {seed}: nothing random in this run uses it (--optimizer with "
                        f"--executor {executor} orders the vectorized executor's batches from "
                        f"exact counts, and this run is vectorized: {self.executor_reason}; "
                        "MJoin, when auto falls back to it, profiles a seeded sample)"
                        if options.get("ordering") not in (None, "off") else
                        f"seed={seed!r}: nothing in this run uses it (the vectorized executor "
                        "draws nothing at random)")
                _check_fixed_orders(options, query)
                self.cq = self._vector_engine(mode, options)
            else:
                ordering = options.pop("ordering", None)
                if ordering is not None and ordering != "off":
                    if executor != "auto":
                        raise OptionError("ordering (per-batch pipeline orders) is for the "
                                          f"vectorized executor; {self.executor_name} orders "
                                          "with policies (--optimizer, --reorder)")
                    from adaptcq.adapt import make_policies  # auto fell back: the same algorithm
                    options["policies"] = [*(options.get("policies") or []), *make_policies(
                        optimizer=ordering, **({} if seed is None else {"seed": seed}))]
                elif seed is not None:
                    raise OptionError(f"seed={seed!r}: nothing in this run uses it (it seeds the "
                                      "policy that ordering= becomes when executor='auto' falls "
                                      "back to MJoin; seed the policies you pass with "
                                      "make_policies(seed=...))")
                if self.executor_name == "shed":
                    from adaptcq.runtime.shed import shed_engine_options
                    spec = dict(options.pop("shed", None) or {})
                    _, shed = shed_engine_options(spec)  # checks them all
                    utility = spec.get("utility")
                    if utility is not None:
                        from adaptcq.runtime.shed import utility_types
                        self.query, fns, values, _ = utility_types(
                            self.query, utility, {n: schema_kinds(s.schema)
                                                  for n, s in self.sources.items()})
                        query = self.query
                        shed["types"] = (fns, values)
                    options.update(shed)
                else:  # (choose_executor refused shedding options for another executor)
                    options.pop("shed", None)
                if self.executor_name == "tree":
                    from adaptcq.runtime.spill import SpillSetup
                    self.spill = SpillSetup(query, options.pop("spill", None),
                                            self._stream_schemas(), timestamp_unit, self.schema,
                                            {n: schema_kinds(src.schema)
                                             for n, src in self.sources.items()})
                    options.update(self.spill.engine_options())
                _check_fixed_orders(options)
                self.cq = self._engine(self.executor_name, mode, options)
                if self.executor_name == "tree":  # a batch clean-up's late results as Arrow
                    # (weakly: the engine holding the run closed a cycle that kept it alive)
                    self.cq.executor.emit_table = _weakly(self._emit_late_table)
            # The merger numbers the arrivals: a rejected deletion (with a sign column) is
            # reported by its input row, and a stop says where each input stopped.
            self.merger = _NumberedMerger(query, self.sources, timestamp, timestamp_unit,
                                          self.lateness, self.sign, columnar=self.vector)
            self._numbers: np.ndarray | None = None  # row numbers of the arrivals in process
            self._rest_numbers: np.ndarray | None = None  # and of those from ``_at``'s start
            # An input row reaches every alias of its source, and each alias rejects it alike
            # (one sign column, unbounded windows): it is reported by the source's first alias.
            first: dict[str, int] = {}
            for i, s in enumerate(query.streams):
                first.setdefault(s.source, i)
            self._reporting = frozenset(first.values())
            self.on_rejected = on_rejected
            self.rejected: list[pa.RecordBatch] = []
            self.rejected_count = 0
            self.progress = progress
            self.total_rows = _total(self.sources.values())
            self.engine_cpu = 0.0
            self.open_cpu = time.process_time() - t0
            self.interrupted = False
            self.stopped: str | None = None   # why the run stopped before its input ended
            self.last_ts: int | None = None
            self.rss_samples: list[tuple[int, int]] = []
            self._next_rss, self._rss_every = 0, 100_000  # (``_sample_rss``)
            self.sink = None  # a Sink: batches are written to it instead of being yielded
            self._stop = False
            self._stop_reason = "interrupted"
            self._in_batch = False  # the vectorized executor is inside a batch
            self._started = False
            self._bounded = False
            self._results = 0
            self._delivered = 0  # result rows the iterator yielded (adaptcq.stream)
            self._buf: list = []
            self._ready: list[pa.RecordBatch] = []
            self._done: dict[str, int] | None = None  # at a stop: rows processed, per source
            self._at: tuple | None = None     # (arrivals, end of the last slice processed)
            self._lo = 0                      # and its start
            self.batches = 0  # batches the vectorized executor processed
            # A run dropped without being iterated (or before its end) closes its inputs
            # and removes its spill folder when its last reference goes, not at a garbage
            # collection; a run that ends does both itself and detaches this.
            self._finalizer = weakref.finalize(self, _abandon, self.merger, self.spill)
        except BaseException:
            for src in self.sources.values():
                src.close()
            if getattr(self, "spill", None) is not None:  # (the spill folder it made goes)
                self.spill.close(False)
            raise

    # ----- set-up checks -----------------------------------------------------------------
    def _check_columns(self) -> None:
        for s in self.query.streams:
            names = self.sources[s.source].schema.names
            for c in self.query.columns[s.alias]:
                if c not in names:
                    raise InputError(f"stream {s.alias}: no column {c!r} in its input "
                                     f"{self.sources[s.source].what} (its columns: "
                                     f"{', '.join(names)})")

    def _check_sign(self, sign: str | None) -> str | None:
        """The sign column (``--sign``), checked against the inputs (the clash with the
        timestamp column is refused before they are opened: ``check_sign_column``)."""
        if sign is None:
            return None
        having = [n for n, s in self.sources.items() if sign in s.schema.names]
        if not having:
            raise InputError(f"no input has the sign column {sign!r} (--sign); the inputs' "
                             "columns: " + "; ".join(f"{n}: {', '.join(s.schema.names)}"
                                                     for n, s in self.sources.items()))
        for n in having:
            t = value_type(self.sources[n].schema.field(sign).type)
            if not (pa.types.is_integer(t) or pa.types.is_floating(t)):
                raise InputError(f"stream {n}: the sign column {sign!r} has type {t}; it "
                                 "must hold the numbers +1 (insert) or -1 (delete)")
        for s in self.query.streams:
            if s.source in having and s.window.kind != "unbounded":
                raise InputError(f"stream {s.alias} has a sign column {sign!r} and a window "
                                 f"{s.window}; explicit deletions need an unbounded stream")
        return sign

    def _engine(self, executor: str, mode: str, options: dict) -> ContinuousQuery:
        """The query and its policies. ``executor="acaching"`` is a shorthand for MJoin with
        the A-Caching policy (``cache_options`` are its options, ``adapt.make_policies``'s
        ``caching``) appended after the given ``policies``; every policy shares the
        query's one profiler."""
        policies = list(options.pop("policies", None) or [])
        cache_options = options.pop("cache_options", None) or {}
        engine_executor = executor
        if executor == "acaching":  # MJoin + the A-Caching policy (a-caching.txt §4.5)
            from adaptcq.adapt import make_policies
            try:
                policies += make_policies(caching=dict(cache_options))
            except (TypeError, ValueError, AdaptcqError) as e:
                raise OptionError(str(e)) from None
            engine_executor = "mjoin"
        elif cache_options:
            raise OptionError("cache options (--caches, --cache-memory, --reopt-interval) "
                               "need --executor acaching")
        if self.sign is not None:
            options["explicit_deletions"] = True
        try:
            cq = ContinuousQuery(self.query, engine_executor, mode, time_unit=TIME_UNIT,
                                 **options)
            for policy in policies:
                cq.attach(policy)
        except (TypeError, ValueError, KeyError) as e:
            raise OptionError(str(e).strip('"')) from None
        self.policies = policies
        return cq

    def _stream_schemas(self) -> dict[str, pa.Schema]:
        """Per stream alias, the engine's types of the columns its rows hold."""
        return {s.alias: pa.schema([_engine_schema(self.sources[s.source].schema).field(c)
                                    for c in self.query.columns[s.alias]])
                for s in self.query.streams}

    def _vector_engine(self, mode: str, options: dict):
        """The vectorized executor with its per-batch ordering policy
        (``adapt.batch_order.vector_executor``; ``ordering``: an optimizer algorithm, or
        "off")."""
        from adaptcq.adapt.batch_order import BatchOrdering, vector_executor
        schemas = self._stream_schemas()
        try:
            vj = vector_executor(self.query, mode, schemas, time_unit=TIME_UNIT,
                                 signed=self.sign is not None,
                                 orders=options.pop("orders", None),
                                 ordering=options.pop("ordering", None))
        except (TypeError, ValueError, KeyError) as e:
            raise OptionError(str(e).strip('"')) from None
        self.ordering = next((o for o in vj.observers if isinstance(o, BatchOrdering)), None)
        self.policies = []
        return vj

    # ----- running -----------------------------------------------------------------------
    def stop(self, reason: str = "interrupted") -> None:
        """Stop at the next boundary between two updates (safe from a signal handler);
        ``reason`` becomes ``stats["stopped"]``."""
        self._stop_reason = reason
        self._stop = True

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        if self._started:
            raise AdaptcqError("a run can be iterated once")
        self._started = True
        return _Results(self, self._run())

    def _run(self) -> Iterator[pa.RecordBatch]:
        """The run, whichever executor; how it ended is recorded in ``stats``: closed by
        its consumer, failed, or cut by a KeyboardInterrupt (raised as it is). Its input
        files are closed when it ends, however it ends."""
        try:
            yield from (self._run_vector() if self.vector else self._run_tuples())
        except GeneratorExit:  # the consumer closed the iterator: the summary says so
            self._closed_early()
            raise
        except OutputClosed:  # (where each input stopped is known where it was raised)
            raise
        except BaseException as exc:  # a source, a row, a callback, Ctrl-C: recorded
            self._failed(exc)
            raise
        finally:
            self._release_inputs()

    def _run_tuples(self) -> Iterator[pa.RecordBatch]:
        """The per-tuple executors' loop: slices of arrivals sized so that one slice's
        results stay near OUT_CHUNK."""
        cq, merger = self.cq, self.merger
        batch = 256  # arrivals per call; adapted so that one call's results stay near OUT_CHUNK
        finished = False  # the spills' clean-up (or hand-over) ran
        if self.max_results is not None:
            self._bound()
        try:
            for arr in merger:
                self._numbers = self._rest_numbers = merger.row_numbers
                self._at = (arr, 0)
                self._flush_rejected(arr.streams, self._numbers)
                n, lo = len(arr), 0
                while lo < n:
                    if self._stop:
                        self.interrupted, self.stopped = True, self._stop_reason
                        self._unprocessed(arr, lo)
                        break
                    hi = min(n, lo + batch)
                    self._at, self._lo = (arr, hi), lo
                    out = self._process(arr, lo, hi)
                    lo = hi
                    if len(out) > OUT_CHUNK:
                        batch = max(1, batch * OUT_CHUNK // len(out))
                        if not self._bounded:  # heavy output: bound it inside updates too
                            self._bound()
                    elif len(out) < OUT_CHUNK // 4:
                        batch = min(MAX_BATCH, batch * 2)
                    if out:
                        self._buffer(out)
                    if cq.rejected_rows:
                        self._engine_rejected()
                    yield from self._take_ready()
                # Results of this chunk leave now: a live consumer waits for them.
                yield from self._flush()
                if self.progress:
                    self.progress(sum(merger.positions().values()), self.total_rows)
                self._sample_rss(cq.stats.arrivals)
                if self.stopped:
                    break
            if self.executor_name == "shed" and not self.stopped:
                out = cq.finish()  # the tuples still in the input buffers
                if out:
                    self._buffer(out)
            if self.spill is not None and (not self.stopped or self.interrupted):
                if not self._bounded:  # late results leave as they are produced
                    self._bound()
                t0 = time.process_time()
                try:  # what the spills held back: produced now (or left on disk)
                    for _ in self.spill.finish(cq):  # after each partition group:
                        self.engine_cpu += time.process_time() - t0
                        yield from self._take_ready()  # the late results so far leave
                        t0 = time.process_time()
                finally:
                    self.engine_cpu += time.process_time() - t0
                out = cq.drain()
                if out:
                    self._buffer(out)
                finished = True
        except _ResultBound:
            self._unprocessed(*self._at)
        except OutputClosed:  # the reader closed stdout: say where each input stopped
            self._stopped_at_output()
            raise
        finally:
            if self.spill is not None:
                self.spill.close(finished)
        yield from self._flush()
        self._flush_rejected()
        self._engine_rejected()
        cq.sample(cq.now)
        self.rss_samples.append((cq.stats.arrivals, current_rss()))

    def _failed(self, exc: BaseException) -> None:
        """The summary of a run that raised (a source's own generator, a bad row, a
        KeyboardInterrupt): it names the error, where ``stopped`` was None, as if the
        input had ended, and ``rows_processed`` where each input stopped."""
        if self.stopped is None:
            if isinstance(exc, KeyboardInterrupt):
                self.interrupted, self.stopped = True, "interrupted"
            else:
                self.stopped = f"failed: {type(exc).__name__}: {exc}"
        if self._done is None:
            arr, lo = self._at if self._at is not None else (None, 0)
            self._unprocessed(arr, 0 if self._in_batch else lo)  # (a batch failed: none)
        # The late rows before that point out (the error that ended the run is the one
        # raised, not one of on_rejected's).
        with contextlib.suppress(Exception):
            self._flush_rejected()

    def _stopped_at_output(self) -> None:
        """stdout was closed: where each input stopped, and the late rows before it out."""
        if self._done is None:
            self._unprocessed(*(self._at or (None, 0)))
        self._flush_rejected()

    def _release_inputs(self) -> None:
        """The run is over: its input files are closed now (a stopped run's stayed open as
        long as the run object lived), and the engine lets go of this run's methods (a
        reference cycle that only a garbage collection freed)."""
        self._finalizer.detach()  # (the spill folder's fate was settled by the run)
        close_inputs(self.merger)
        ex = self.cq
        if self.vector:
            ex.emit = None
        else:
            if self._bounded:
                ex.bound_output(None)
            if self.executor_name == "tree":
                ex.executor.emit_table = None

    def _run_vector(self) -> Iterator[pa.RecordBatch]:
        """The vectorized executor's loop: batches of ``batch_rows`` arrivals (or
        ``batch_seconds`` of event time), each processed whole; results leave as Arrow."""
        vj = self.cq
        vj.emit = self._emit_table  # a batch's output leaves a range of updates at a time
        reuse_freed_memory()
        try:
            for batch, rest in self.iter_batches():
                if self._stop:
                    self.interrupted, self.stopped = True, self._stop_reason
                    self._unprocessed(rest, 0)
                    break
                self._at = (rest, len(batch))
                t0 = time.process_time()
                self._in_batch = True
                try:
                    vj.process_batch(batch)  # its output went to _emit_table (vj.emit)
                except _ResultBound:
                    # --max-results reached in this batch: it counts as processed whole
                    # (below), so the summary counts it and its last event time too.
                    self._batch_done(batch)
                    raise
                finally:
                    self.engine_cpu += time.process_time() - t0
                self._batch_done(batch)
                if vj.rejected_rows:
                    self._engine_rejected()
                yield from self._take_ready()
                if self.progress:
                    self.progress(sum(self.merger.positions().values()), self.total_rows)
                if self._sample_rss(vj.stats.arrivals):
                    vj.sample(vj.now)
                if self.stopped:
                    self._unprocessed(rest, len(batch))
                    break
        except _ResultBound:  # (the whole batch counts as processed)
            self._in_batch = False
            self._unprocessed(*self._at)
        except OutputClosed:
            self._in_batch = False
            self._stopped_at_output()
            raise
        yield from self._take_ready()
        self._flush_rejected()
        self._engine_rejected()
        if np.isfinite(vj.now):
            vj.sample(vj.now)
        self.rss_samples.append((vj.stats.arrivals, current_rss()))

    def _batch_done(self, batch) -> None:
        """A batch of the vectorized executor was processed: counted (``batches``), its
        last arrival's time is the run's ``last_event_time``."""
        self._in_batch = False
        self.batches += 1
        self.last_ts = int(batch.timestamps[-1])

    def _sample_rss(self, arrivals: int) -> bool:
        """Record the RSS every ``_rss_every`` arrivals (True when it did): bounded over a
        run of days, every other sample dropped and the interval doubled past 2,048."""
        if arrivals < self._next_rss:
            return False
        self.rss_samples.append((arrivals, current_rss()))
        if len(self.rss_samples) > 2048:
            del self.rss_samples[1::2]
            self._rss_every *= 2
        self._next_rss = arrivals + self._rss_every
        return True

    def iter_batches(self):
        """(batch, the arrivals from its start on) for each batch: ``batch_rows`` arrivals,
        cut earlier when ``batch_seconds`` of event time have passed; the last one may be
        shorter. Arrivals wait in ``buf`` (at most one batch plus one released chunk), their
        row numbers in ``nums``: ``_numbers`` is the batch's, ``_rest_numbers`` the
        buffer's."""
        from adaptcq.stream.merge import ArrivalBatch
        buf = nums = None
        span = None if self.batch_seconds is None else round(self.batch_seconds / TIME_UNIT)
        # Sources of unknown length (iterators, generators: possibly live) close a batch at
        # every release, so their results leave as soon as the per-tuple executors' would:
        # the release's last part is not held for a whole batch (with batch_seconds too; a
        # paused live feed held it back for as long as it paused).
        live = any(s.num_rows is None for s in self.sources.values())
        for arr in self.merger:
            buf = arr if buf is None else ArrivalBatch.concat([buf, arr])
            got = self.merger.row_numbers
            nums = got if nums is None else np.concatenate([nums, got])
            self._at, self._rest_numbers = (buf, 0), nums  # (none of it processed yet)
            self._flush_rejected(buf.streams, nums)
            while buf is not None:
                cut = min(len(buf), self.batch_rows)
                if span is not None:
                    # In Python ints: near the end of int64 time the batch's end would wrap.
                    end = int(buf.timestamps[0]) + span
                    if end <= NS_MAX:
                        cut = min(cut, max(1, int(np.searchsorted(
                            buf.timestamps, np.int64(end), "left"))))
                if cut == len(buf) < self.batch_rows and not live:
                    break  # not a whole batch yet: wait for more arrivals
                self._numbers, self._rest_numbers = nums[:cut], nums
                yield buf.slice(0, cut), buf
                buf = buf.slice(cut, len(buf)) if cut < len(buf) else None
                nums = None if buf is None else nums[cut:]
                if self.stopped or self._stop:
                    break
        if buf is not None and len(buf) and not self.stopped:
            self._numbers = self._rest_numbers = nums
            yield buf, buf

    def _emit_table(self, out: pa.Table) -> None:
        """Engine output (SELECT columns, _sign, _ts in ns) to the run's schema, in batches
        of at most OUT_CHUNK rows; stops the run at ``max_results``."""
        limit = self.max_results
        if limit is not None and self._results + out.num_rows > limit:
            out = out.slice(0, limit - self._results)
            self.stopped = f"--max-results {limit:,} reached"
        self._results += out.num_rows
        table = table_to_schema(out, self.schema, self.unit)
        for b in table.to_batches(max_chunksize=OUT_CHUNK):
            if self.sink is not None:
                self.sink.write(b)
            else:
                self._ready.append(b)
        if self.stopped and not self.interrupted:  # (--max-results reached)
            raise _ResultBound

    def _close_unstarted(self) -> None:
        """The iterator was closed before its first batch: as a close after it would, the
        summary says so, a spill folder is emptied and the inputs are closed."""
        try:
            self._closed_early()
        finally:
            try:
                if self.spill is not None:
                    self.spill.close(False)
            finally:
                self._release_inputs()

    def _closed_early(self) -> None:
        """The iterator was closed (``close()``, or dropped) before the input ended."""
        if self.stopped is None:
            self.stopped = "closed by its consumer"
        if self._done is None:
            self._unprocessed(*(self._at or (None, 0)))
        self._flush_rejected()

    def _unprocessed(self, arr: Arrivals | None, lo: int) -> None:
        """At a stop: per source, the rows before its first row not processed
        (``rows_processed``): the arrivals of ``arr`` from ``lo`` on, those the merger
        buffers and a chunk that failed were not. Late rows read past that point were
        not reached: neither processed nor reported (a run resumed there reads them)."""
        streams = numbers = None
        if arr is not None and self._rest_numbers is not None and \
                len(self._rest_numbers) == len(arr):
            streams, numbers = np.asarray(arr.streams)[lo:], self._rest_numbers[lo:]
        self._done = done = self.merger.first_unprocessed(streams, numbers)
        late = self.merger.rejected
        late[:] = [r for r in late if r["row"] < done[r["stream"]]]

    def _bound(self) -> None:
        """Results leave the engine every OUT_CHUNK rows, even within one update."""
        self._bounded = True
        self.cq.bound_output(OUT_CHUNK, self._buffer)

    def _buffer(self, out: list) -> None:
        """Take results from the engine; stop the run once ``max_results`` are out."""
        limit = self.max_results
        if limit is not None and self._results + len(out) > limit:
            out = out[:limit - self._results]
            self.stopped = f"--max-results {limit:,} reached"
        self._results += len(out)
        self._buf.extend(out)
        if len(self._buf) >= OUT_CHUNK or self.stopped:
            self._emit_batch(self._buf)
            self._buf = []
        # --max-results reached: no result more. A stop (Ctrl-C, ``stop()``) still lets
        # the spills' clean-up produce the results of the arrivals processed.
        if self.stopped and not self.interrupted:
            raise _ResultBound

    def _emit_late_table(self, t: pa.Table) -> None:
        """Late results of a batch clean-up as Arrow (``SpillTree.emit_table``): after the
        results produced before them, as one table when its columns have the output's
        types (``_ts`` as int64 nanoseconds), else as rows, the way every result goes."""
        self._buffer(self.cq.drain())  # the results before the clean-up leave first
        if self._buf:
            self._emit_batch(self._buf)
            self._buf = []
        self.cq.stats.results += t.num_rows
        if late_table_fits(t, self.schema):
            self._emit_table(t)
        else:
            self._buffer(table_rows(t))

    def _emit_batch(self, rows: list) -> None:
        batch = rows_to_batch(rows, self.schema, self.unit)
        if self.sink is not None:
            self.sink.write(batch)  # straight out: nothing waits in memory
        else:
            self._ready.append(batch)

    def _flush(self) -> Iterator[pa.RecordBatch]:
        """Every buffered result out, now."""
        if self._buf:
            self._emit_batch(self._buf)
            self._buf = []
        yield from self._take_ready()

    def _take_ready(self) -> Iterator[pa.RecordBatch]:
        while self._ready:
            batch = self._ready.pop(0)
            self._delivered += batch.num_rows  # (counted before: the consumer may close)
            yield batch

    def _process(self, arr: Arrivals, lo: int, hi: int) -> list:
        t0 = time.process_time()
        try:
            with collector.paused():  # one collection a batch, not hundreds (adaptcq.collector)
                ((_, _, out, cpu),) = self.cq.run_batches(arr.streams, arr.signs,
                                                           arr.timestamps, arr.rows, [hi],
                                                           start=lo)
        except BaseException:
            # Stopped inside the slice (the bound reached, stdout closed, an error): the
            # arrivals up to the one it stopped in were processed (``stopped_at``).
            self.engine_cpu += time.process_time() - t0
            done = self.cq.stopped_at or 0
            self._at = (arr, lo + done)
            if done:
                self.last_ts = arr.timestamps[lo + done - 1]
            raise
        self.engine_cpu += cpu
        self.last_ts = arr.timestamps[hi - 1]
        return out

    def _flush_rejected(self, streams=None, numbers=None) -> None:
        """The late rows the run has reached out (every earlier row of their source
        processed; ``streams``, ``numbers``: the arrivals released and not processed yet,
        and their row numbers); the others wait, so that a stop never reports a row
        beyond where its input stopped."""
        merger = self.merger
        if not merger.rejected:
            return
        due = merger.due_rejected(self._done if self._done is not None
                                  else merger.first_unprocessed(streams, numbers))
        if due:
            self._reject(rejected_batch(due, self.sources))

    def _engine_rejected(self) -> None:
        """The engine's rejected rows (unmatched deletions) out, as late rows are: named by
        source and input row number, once per input row (not once per alias)."""
        cq = self.cq
        rows = cq.rejected_rows
        if not rows:
            return
        if self.merger.rejected and self._at is not None:  # the late rows before them first
            arr, lo = self._at
            self._flush_rejected(np.asarray(arr.streams)[lo:], self._rest_numbers[lo:])
        if self.vector:  # each one's arrival in the batch processed
            at = cq.rejected_at
            # (found stream by stream: reported in arrival order, as MJoin does)
            order = sorted(range(len(at)), key=at.__getitem__)
            rows[:] = [rows[j] for j in order]
            at[:] = [at[j] for j in order]
        else:
            arr, hi = self._at
            at = _arrivals_of(rows, arr, self._lo, hi)
        numbers = self._numbers
        q = self.query
        self._reject(rejected_batch(
            [{"stream": q.streams[i].source, "row": int(numbers[k]), "ts": ts / 1e9,
              "reason": why}
             for (i, ts, _, why), k in zip(rows, at, strict=True) if i in self._reporting],
            self.sources))
        rows.clear()
        if self.vector:
            at.clear()

    def _reject(self, batch: pa.RecordBatch) -> None:
        self.rejected_count += batch.num_rows
        if self.on_rejected is not None:
            self.on_rejected(batch)
        else:
            self.rejected.append(batch)

    # ----- results -----------------------------------------------------------------------
    def rejected_table(self) -> pa.Table:
        return pa.Table.from_batches(self.rejected, schema=REJECTED_SCHEMA)

    @property
    def stats(self) -> dict:
        cq, st = self.cq, self.cq.stats
        peak_t, peak_b = cq.peak_state()
        cpu = self.engine_cpu
        stats = {
            "executor": self.executor_name, "executor_reason": self.executor_reason,
            "mode": self.mode,
            "arrivals": st.arrivals, "updates": st.updates, "insertions": st.insertions,
            "deletions": st.deletions, "filtered": st.filtered,
            "results": st.results, "rejected": self.rejected_count,
            "cpu_seconds": cpu, "load_cpu_seconds": self.open_cpu,
            "throughput": st.updates / cpu if cpu > 0 else float("inf"),
            "peak_state_tuples": peak_t, "peak_state_bytes": peak_b,
            "peak_rss_bytes": peak_rss(),
            "rows_read": self.merger.positions(),
            "rows_processed": dict(self._done) if self._done is not None
            else self.merger.positions(),
            "stopped": self.stopped,
        }
        if self.stopped == "closed by its consumer" and self.sink is None:
            # Results made but still buffered when the iterator was closed never left.
            stats["results"], stats["results_computed"] = self._delivered, st.results
        elif self.max_results is not None and st.results != self._results:
            # --max-results cut the output: "results" is what the output holds, and the
            # engine's count (the rest of the update it stopped in) is shown beside it.
            stats["results"], stats["results_computed"] = self._results, st.results
        if self.last_ts is not None:
            stats["last_event_time"] = self.last_ts / 1e9
        if self.spill is not None:
            stats.update(self.spill.report(self.cq, self.last_ts))
        if self.executor_name == "shed":
            stats.update(self.cq.executor.report())
        for policy in self.policies:  # engine.protocols.Policy: report() is JSON-safe
            stats.update(policy.report())
        if self.vector:
            stats["batches"] = self.batches
            stats["batch_rows"] = self.batch_rows
            stats["batch_seconds"] = self.batch_seconds
            ordering = self.ordering
            stats["ordering"] = ordering.algorithm if ordering is not None else "off"
            stats["order_changes"] = ordering.changes if ordering is not None else 0
            stats["orders_used"] = {a: {"⋈".join(o): k for o, k in used.items()}
                                    for a, used in self.cq.order_log.items()}
        return stats

    @property
    def plan(self) -> str:
        """The plan running now, as the summary shows it (``describe()``: pipeline orders
        and nested-loop joins, the XJoin or operator tree; vectorized: the orders the last
        batch ran, not those chosen after it for a batch that may never come)."""
        if self.vector and self.ordering is not None:
            return self.ordering.describe_ran(self.cq.executor)
        return self.cq.executor.describe()

    def result(self, table: pa.Table) -> RunResult:
        return RunResult(table, self.stats, self.rejected_table(), self.cq.stats.samples,
                         self.query, self.plan)


class _Results(Iterator):
    """The iterator of a run (``iter(LocalRun)``): ``_run``'s generator, except that closing
    it before its first batch (``close()``, or dropping it) ends the run as a close after
    it would: its inputs are closed now and ``stats`` says it was closed by its consumer.
    A generator not started runs none of its code when closed, so files opened at set-up
    stayed open until a garbage collection freed the run."""

    def __init__(self, run: LocalRun, gen):
        self._run, self._gen = run, gen

    def __next__(self) -> pa.RecordBatch:
        return next(self._gen)

    def close(self) -> None:
        gen, self._gen = self._gen, iter(())
        unstarted = inspect.getgeneratorstate(gen) == inspect.GEN_CREATED
        gen.close()
        if unstarted:
            self._run._close_unstarted()

    def __del__(self):
        with contextlib.suppress(Exception):  # (at interpreter exit)
            self.close()


class _ResultBound(Exception):
    """``max_results`` reached: the run stops (raised through the engine's emit)."""


# ----- input row numbers of rejected deletions ----------------------------------------------
class _NoColumns(tuple):
    """The row of an alias that reads no column: an object of its own per arrival (``()``
    is one shared object), so that a rejected deletion is found by identity."""

    __slots__ = ()


class _Numbers:
    """What the numbered feeds record for their merger: the row numbers of each alias's
    arrivals in the last release, and each source's first row of a chunk that failed."""

    __slots__ = ("released", "signed", "unread")

    def __init__(self, signed: bool):
        self.released: dict[int, np.ndarray] = {}
        self.unread: dict[str, int] = {}
        self.signed = signed


class _NumberedFeed(_Feed):
    """A feed that records its released arrivals' row numbers and the first row of a
    chunk that failed in ``numbers`` (shared with its merger). A subclass, not closures
    wrapping the feed's methods stored on the feed: those closed a reference cycle (feed,
    closure, merger) that kept the input files open after the run was dropped, until a
    garbage collection."""

    numbers: _Numbers

    def release(self, frontier, columnar: bool = False):
        parts = super().release(frontier, columnar)
        if not parts:
            return parts
        out = []
        for i, ts, pos, signs, rows in parts:
            self.numbers.released[i] = pos
            if self.numbers.signed and not columnar and rows and len(rows[0]) == 0:
                rows = [_NoColumns() for _ in rows]
            out.append((i, ts, pos, signs, rows))
        return out

    def pull(self, rejected) -> None:
        start = self.next_row  # (a chunk that fails may have counted its rows read)
        try:
            super().pull(rejected)
        except BaseException:
            self.numbers.unread.setdefault(self.src.name, start)
            raise


class _NumberedMerger(ArrivalMerger):
    """The merger, also keeping each released arrival's row number in its source's input
    (``row_numbers``, parallel to the last arrivals yielded): a rejected deletion is
    reported by its input row, as a late row is, and a stop knows each input's first row
    not processed (``first_unprocessed``), which late rows it reached (``due_rejected``)."""

    feed_type = _NumberedFeed

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.row_numbers = np.empty(0, np.int64)
        self._numbers = _Numbers(self.signed)
        self._released = self._numbers.released  # alias -> row numbers, last release
        self.unread = self._numbers.unread  # source -> first row of a chunk that failed
        for f in self.feeds:  # a feed's release has the numbers; the merged order drops them
            f.numbers = self._numbers

    def _release(self, frontier):
        self._released.clear()
        merged = super()._release(frontier)
        if merged is not None:
            streams = np.asarray(merged.streams)
            numbers = np.empty(len(streams), np.int64)
            for i, pos in self._released.items():  # an alias's arrivals keep their order
                numbers[streams == i] = pos
            self.row_numbers = numbers
        return merged

    def first_unprocessed(self, streams=None, numbers=None) -> dict[str, int]:
        """Per source, its first row not processed: the least row number among the
        arrivals released but not processed (``streams``: their aliases, ``numbers``: their
        row numbers), the rows buffered here and a chunk that failed; with none, every row
        read."""
        out = self.positions()
        st = None if numbers is None or not len(numbers) else np.asarray(streams)
        for f in self.feeds:
            name = f.src.name
            least = min(out[name], self.unread.get(name, out[name]))
            if len(f.pos):
                least = min(least, int(f.pos.min()))
            if st is not None:
                mine = numbers[np.isin(st, [i for i, _ in f.aliases])]
                if len(mine):
                    least = min(least, int(mine.min()))
            out[name] = least
        return out

    def due_rejected(self, first: Mapping[str, int]) -> list[dict]:
        """The late rows found so far that lie before ``first`` (per source, its first row
        not processed), taken from ``rejected``; the later ones stay there."""
        rows = self.rejected
        due = [r for r in rows if r["row"] < first[r["stream"]]]
        if len(due) == len(rows):
            rows.clear()
        elif due:
            rows[:] = [r for r in rows if r["row"] >= first[r["stream"]]]
        return due


def _weakly(method):
    """``method`` called through a weak reference to its object: an engine's callback into
    the run that does not keep the run alive (the run holds the engine)."""
    ref = weakref.WeakMethod(method)

    def call(*args, **kwargs):
        return ref()(*args, **kwargs)
    return call


def _abandon(merger: ArrivalMerger, spill) -> None:
    """A run dropped before it ended (``LocalRun._finalizer``): its inputs closed and its
    spill folder removed (what it spilled cannot be cleaned up: the groups in memory are
    gone; ``SpillSetup.close``)."""
    try:
        close_inputs(merger)
    finally:
        if spill is not None:
            spill.close(False)


def close_inputs(merger: ArrivalMerger) -> None:
    """Close a run's input files now (a stopped or failed run's stayed open until it was
    collected): each source's chunk generators, and a file opened at set-up and never read
    (``Source.close``; the iterables a caller gave are left to the caller)."""
    for f in merger.feeds:
        with contextlib.suppress(Exception):  # (a running generator, or its own error)
            f.it.close()
        f.src.close()


def _check_option_types(options: Mapping) -> None:
    """The engine options' shapes, named (a list for ``orders`` or one policy for
    ``policies`` reached the executors as an AttributeError or a TypeError)."""
    orders, policies = options.get("orders"), options.get("policies")
    if orders is not None and not isinstance(orders, Mapping):
        raise OptionError(f"orders must map a stream to its pipeline's order, e.g. "
                          f"{{'T': ['S', 'R']}}; got {type(orders).__name__}")
    if policies is not None and not isinstance(policies, (list, tuple)):
        raise OptionError(f"policies must be a list of policy objects (make_policies gives "
                          f"one), got {type(policies).__name__}")
    nested = options.get("nested_loop")
    if nested is not None and (isinstance(nested, (str, bytes, bool)) or
                               not isinstance(nested, (list, tuple, set, frozenset))):
        raise OptionError("nested_loop must be a list of STREAM or STREAM.COLUMN names, got "
                          f"{nested!r}")
    # (a string or a number reached dict() as a raw TypeError or ValueError)
    for key, example in _DICT_OPTIONS.items():
        value = options.get(key)
        if value is not None and not isinstance(value, Mapping):
            raise OptionError(f"{key} must be a dict of options, e.g. {key}={example}; got "
                              f"{value!r}")


# The options that are dicts of further options, with an example for the message.
_DICT_OPTIONS = {"spill": "{'strategy': 'global-penalty', 'memory': '64MB'}",
                 "shed": "{'mode': 'selective', 'capacity': 156250}",
                 "cache_options": "{'caches': 'global', 'reopt_interval': 1000}"}


def check_orders(query: LogicalQuery, orders: Mapping | None) -> None:
    """Each fixed pipeline order, checked for every executor (``--order``, ``orders=``)
    before any input is read: the executors' own check (``engine.rules.check_given_orders``:
    a list or tuple naming each other stream once), so the two cannot disagree."""
    from adaptcq.engine.rules import check_given_orders
    check_given_orders(query.aliases, orders, OptionError)


def _check_fixed_orders(options: Mapping, query: LogicalQuery | None = None) -> None:
    """``--order`` fixes pipelines; the per-tuple executors' ordering policies (an initial
    plan, A-Greedy) order every pipeline, so the two together are refused (the orders were
    silently replaced). The vectorized executor (``query`` given) keeps the fixed pipelines
    and orders the others (``adapt.batch_order``): with every one fixed its ``--optimizer``
    would order nothing, so that is refused too."""
    if query is not None:
        orders, ordering = options.get("orders") or {}, options.get("ordering")
        if ordering not in (None, "off") and set(query.aliases) <= set(orders):
            raise OptionError(f"--order fixes every pipeline ({', '.join(query.aliases)}), so "
                              f"--optimizer {ordering} has nothing left to order: give one of "
                              "them (with --order for some pipelines it orders the others)")
        return
    from adaptcq.adapt.reorder import AGreedy, InitialPlan
    if options.get("orders") and any(isinstance(p, (InitialPlan, AGreedy))
                                     for p in options.get("policies") or ()):
        raise OptionError("--order fixes pipelines' orders, and --optimizer / --reorder "
                          "order every pipeline of this executor: give one of them (the "
                          "vectorized executor takes both: it keeps the pipelines --order "
                          "fixes and orders the others)")


# The executors without MJoin pipelines that auto (or an option) can choose, for messages.
_NO_PIPELINES = {"tree": "the operator tree, a plan of m-way operators (--tree)",
                 "shed": "the load-shedding join, which orders its own joins"}


def _check_plan_options(executor: str, reason: str, options: Mapping) -> None:
    """``--order`` and ``--nested-loop`` shape MJoin's pipelines: a run on the operator
    tree or the load-shedding join (chosen by auto for ``--spill`` or ``--shed``) has none,
    so they are refused with the reason (the engine named them as unknown keywords)."""
    given = [flag for key, flag in (("orders", "--order"), ("nested_loop", "--nested-loop"))
             if options.get(key)]
    if given and executor in _NO_PIPELINES:
        raise OptionError(f"{' and '.join(given)} shape{'' if len(given) > 1 else 's'} MJoin's "
                          f"pipelines, and this run uses {_NO_PIPELINES[executor]} ({reason}): "
                          "give one of them")


def _arrivals_of(rejected: list, arr: Arrivals, lo: int, hi: int) -> list[int]:
    """The arrivals (indices into ``arr``, in [lo, hi)) of the per-tuple engine's rejected
    rows: a rejected row is its arrival's row object, and every arrival has its own."""
    where = {id(arr.rows[k]): k for k in range(lo, hi) if arr.signs[k] < 0}
    return [where[id(row)] for _, _, row, _ in rejected]


# ----- output rows to Arrow --------------------------------------------------------------
# ----- which executor ------------------------------------------------------------------------
EXECUTOR_CHOICES = ("auto", "vector", "mjoin", "xjoin", "acaching", "tree", "shed")
BATCH_ROWS_DEFAULT = 20_000  # chosen by python -m adaptcq.bench.vector (docs/vector.md)

# Options only a per-tuple executor honours, and why (the vectorized one refuses them).
_PER_TUPLE = {
    "policies": "adaptive policies (--reorder, A-Caching) act between two tuples",
    "cache_options": "join-subresult caches (A-Caching) are per-tuple state",
    "nested_loop": "--nested-loop chooses how MJoin's per-tuple probes scan a window",
    "tree": "--tree is an XJoin plan",
    "trace": "a per-update trace is an MJoin debugging aid",
    "sample_every": "state samples per update count are the per-tuple engine's",
}


def choose_executor(executor: str, query: LogicalQuery, options: Mapping,
                    schemas: Mapping[str, pa.Schema] | None = None) -> tuple[str, str]:
    """(the executor to run, why). ``auto`` runs the vectorized executor whenever the
    query, the options and the inputs' column types (``schemas``, by source) allow it,
    else MJoin (naming what prevented it); ``vector`` refuses what it cannot honour, with
    the reason."""
    from adaptcq.engine.vector import unsupported, unsupported_keys
    if executor not in EXECUTOR_CHOICES:
        raise OptionError(f"unknown executor {executor!r}; choose one of "
                          f"{', '.join(EXECUTOR_CHOICES)}")
    if options.get("spill") is not None and options.get("shed") is not None:
        raise OptionError("spilling state (--spill, --memory) and load shedding (--shed, "
                          "--capacity, ...) are for two executors (the operator tree, the "
                          "load-shedding join); give one of them")
    if options.get("spill") is not None and executor == "auto":
        return "tree", "auto: spilling state (--spill) runs the operator tree"
    if options.get("tree") is not None and executor in ("auto", "vector", "mjoin"):
        # (auto fell back to MJoin, which then refused "unknown option tree")
        raise OptionError("tree= is a plan of XJoins or of the operator tree: give "
                          "executor='xjoin' or executor='tree' with it")
    if executor == "auto" and (options.get("shed") is not None or query.set_predicates):
        return "shed", ("auto: load-shedding options (--shed, --capacity, --basic-window, "
                        "--index, --buffer) run the load-shedding join"
                        if options.get("shed") is not None else
                        "auto: set join conditions run on the load-shedding join")
    if options.get("shed") is not None and executor != "shed":
        raise OptionError(f"the load-shedding options (--shed, --capacity, --basic-window, "
                          f"--index, --buffer, --utility) are for the load-shedding join "
                          f"(--executor shed), not {executor}")
    if executor not in ("auto", "vector"):
        return executor, f"--executor {executor} was asked for"
    why = unsupported(query)
    if why is None and schemas is not None:
        types = {(st.alias, f.name): value_type(f.type) for st in query.streams
                 if st.source in schemas for f in schemas[st.source]}
        why = unsupported_keys(query, types)
    if why is None:
        # (any sample_every, 0 too, which was taken as not given and silently dropped)
        given = [k for k in _PER_TUPLE if options.get(k) or
                 (k == "sample_every" and options.get(k) is not None)]
        if given:
            why = _PER_TUPLE[given[0]]
    if executor == "vector":
        if why is not None:
            raise OptionError(f"--executor vector cannot run this: {why}")
        return "vector", "--executor vector was asked for"
    if why is not None:
        return "mjoin", f"auto: not vectorized because {why}"
    return "vector", "auto: the query and options allow the vectorized executor"


def batch_options(executor: str, rows, seconds) -> tuple[int, float | None]:
    """``--batch-rows`` / ``--batch-seconds``, checked: for the vectorized executor only."""
    if executor != "vector":
        if rows is not None or seconds is not None:
            raise OptionError("--batch-rows and --batch-seconds are for the vectorized "
                              f"executor (this run uses {executor}, a tuple at a time)")
        return BATCH_ROWS_DEFAULT, None
    if rows is not None:
        rows = _positive(rows, "--batch-rows")
    if seconds is not None:
        # A number (True was 1 s, "1" 1 s): as lateness_ns takes --allowed-lateness.
        seconds = float(seconds) if isinstance(seconds, numbers.Real) and \
            not isinstance(seconds, bool) else float("nan")
        if not seconds > 0 or seconds == float("inf"):
            raise OptionError(f"--batch-seconds must be a positive number of seconds of "
                              f"event time, got {seconds!r}")
        if seconds / TIME_UNIT >= 2 ** 63:  # (event times are int64 nanoseconds)
            raise OptionError(f"--batch-seconds {seconds:g} s is longer than event times "
                              "span (about 292 years of int64 nanoseconds)")
    return (BATCH_ROWS_DEFAULT if rows is None and seconds is None else
            rows if rows is not None else 2**62), seconds


def output_schema(query: LogicalQuery, schemas: Mapping[str, pa.Schema], timestamp: str,
                  unit: str | None = None, late: bool = False) -> pa.Schema:
    """The output's schema: SELECT columns typed from the input schemas, ``_sign`` (int8)
    and ``_ts`` (see ``stream.eventtime``); with ``late`` (the operator tree), ``_late``
    (bool): the result was held back by a spill and produced at clean-up."""
    from adaptcq.query.logical import output_types
    types = output_types(query, {n: _engine_schema(s) for n, s in schemas.items()})
    time_types = {s.alias: schemas[s.source].field(timestamp).type for s in query.streams}
    windows = [s.window.in_units(TIME_UNIT) for s in query.streams
               if s.window.kind == "range"]
    ts_type = output_time_type(time_types, unit, windows)
    # Timezone-aware input columns come back with their timezone (values are UTC instants).
    fields = [pa.field(o.name, t) for o, t in zip(query.outputs, types, strict=True)]
    tail = [pa.field("_late", pa.bool_())] if late else []
    return pa.schema([*fields, pa.field("_sign", pa.int8()), pa.field("_ts", ts_type), *tail])


def _engine_schema(schema: pa.Schema) -> pa.Schema:
    return pa.schema([pa.field(f.name, value_type(f.type)) for f in schema])


def table_to_schema(out: pa.Table, schema: pa.Schema, unit: str | None) -> pa.Table:
    """Engine output as Arrow (SELECT columns, ``_sign``, ``_ts`` in ns[, ``_late``]) as a
    table of ``schema``: ``_ts`` in the output's time type, other columns cast to it."""
    arrays = []
    for f, col in zip(schema, out.columns):
        if f.name == "_ts":
            arrays.append(from_nanoseconds(to_numpy(col), f.type, unit))
        else:
            col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
            arrays.append(col if col.type == f.type else col.cast(f.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def late_table_fits(t: pa.Table, schema: pa.Schema) -> bool:
    """A batch clean-up's late results (``SpillTree.emit_table``) can leave as Arrow: each
    column has the output's type (``_ts`` as int64 ns). Otherwise (a column typed apart
    from its values, as an expression's is) they leave as rows, the way every result goes,
    so that the output's conversion and its errors are the same."""
    return all(c.type == (pa.int64() if f.name == "_ts" else f.type)
               for f, c in zip(schema, t.columns, strict=True))


def table_rows(t: pa.Table) -> list[tuple]:
    """``t``'s rows as tuples, the engine's output rows (late results that do not
    ``late_table_fits``)."""
    return list(zip(*(c.to_pylist() for c in t.columns), strict=True))


def rows_to_batch(out: list, schema: pa.Schema, unit: str | None) -> pa.RecordBatch:
    """Engine output rows ``(*values, sign, ts_ns[, late])`` as a record batch of
    ``schema``."""
    fields = [pa.field(f"f{k}", f.type) for k, f in enumerate(schema)]
    at = schema.get_field_index("_ts")
    fields[at] = pa.field("_ts", pa.int64())
    try:
        arrays = pa.array(out, type=pa.struct(fields)).flatten()
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        _explain_conversion_error(out, schema)
        raise
    arrays[at] = from_nanoseconds(arrays[at].to_numpy(), schema.field("_ts").type, unit)
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _explain_conversion_error(out: list, schema: pa.Schema) -> None:
    for k, f in enumerate(schema):
        if f.name in ("_sign", "_ts", "_late"):
            continue
        for j, r in enumerate(out):
            try:
                pa.array([r[k]], f.type)
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as e:
                raise AdaptcqError(
                    f"output column {f.name!r} ({f.type}): the value {r[k]!r} of a result at "
                    f"event time {r[schema.get_field_index('_ts')] / 1e9:g} s does not fit ({e}); compute it in "
                    "floating point instead, e.g. R.a * 1.0 + S.b (CAST is not supported)") \
                    from None


# ----- helpers ----------------------------------------------------------------------------
def open_sources(sources: Mapping[str, object], timestamp: str, unit: str | None,
                 chunk_rows) -> dict[str, Source]:
    """The inputs of a run (``LocalRun``) or of a query set (``runtime.multi.Engine``),
    opened (``stream.sources.open_source``): each named by a string, as FROM names it, and
    read ``chunk_rows`` (a positive whole number) at a time."""
    chunk_rows = _positive(chunk_rows, "chunk_rows")
    if chunk_rows > CHUNK_ROWS_MAX:  # (pyarrow's readers raised a raw OverflowError)
        raise OptionError(f"chunk_rows must be at most {CHUNK_ROWS_MAX:,} (2**63 - 1: Arrow "
                          f"counts rows in int64), got {chunk_rows!r}")
    bad = [n for n in sources if not isinstance(n, str) or not n]
    if bad:
        raise InputError(f"source name {bad[0]!r}: a source is named by a string, as FROM "
                         "names it")
    opened: dict[str, Source] = {}
    try:
        for name, src in sources.items():
            opened[name] = open_source(name, src, timestamp, unit, chunk_rows)
    except BaseException:  # a later input's error: the ones opened before it are closed
        for src in opened.values():
            src.close()
        raise
    return opened


def check_sign_column(sign, timestamp) -> None:
    """The sign column is no column of the stream (docs/semantics.md): it cannot also be
    the timestamp column, whose times were read as signs (a row at time 1 an insertion, at
    -1 a deletion, any other time refused as a bad sign)."""
    if sign is not None and sign == timestamp:
        raise OptionError(f"--sign {sign!r} (sign=) names the timestamp column (--timestamp, "
                          "timestamp=): the sign column marks each row an insertion (+1) or a "
                          "deletion (-1) and is no column of the stream; give the signs a "
                          "column of their own")


def _positive(value, name: str, allow_none: bool = False):
    """``value`` as a Python int >= 1 (NumPy's integers too, as the options that take
    seconds take NumPy's floats; never a bool or a float), or an OptionError naming it."""
    if value is None and allow_none:
        return None
    n = whole(value)
    if n is None or n < 1:
        raise OptionError(f"{name} must be a positive whole number, got {value!r}")
    return n


def _total(sources) -> int | None:
    known = [s.num_rows for s in sources]
    return sum(known) if all(k is not None for k in known) else None


def peak_rss() -> int:
    """Peak resident memory of this process, in bytes (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def reuse_freed_memory() -> bool:
    """Keep the arrays a vectorized batch frees for the next batch (glibc malloc; True when
    set). Each batch allocates and frees many temporaries of 100 KB to a few MB; by default
    glibc maps each of them anew and unmaps it when freed (or trims the heap), so every
    batch pays page faults to get zeroed pages back: 0.2 of 1.2 CPU-seconds on the
    selective chain. With blocks up to 32 MB served from the heap and up to 64 MB of free
    heap kept, a batch reuses the previous batch's memory; the peak RSS is the same (the
    memory benchmark). Leaves the process alone when MALLOC_MMAP_THRESHOLD_ or
    MALLOC_TRIM_THRESHOLD_ is set, and on a C library without ``mallopt``."""
    global _MALLOPT_DONE
    if _MALLOPT_DONE is not None:
        return _MALLOPT_DONE
    _MALLOPT_DONE = False
    if any(v in os.environ for v in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")):
        return False
    try:
        import ctypes
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (macOS, Windows)
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # glibc's malloc.h
    _MALLOPT_DONE = bool(mallopt(m_mmap_threshold, 32 << 20)) and \
        bool(mallopt(m_trim_threshold, 64 << 20))
    return _MALLOPT_DONE


_MALLOPT_DONE: bool | None = None


def current_rss() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize()
    except OSError:  # not Linux
        return peak_rss()


def refuse_missing_inputs(sql: str, inputs) -> None:
    """After the query failed to parse against the inputs' schemas: a stream without an
    input is named as such (``require_inputs``), not as an unknown stream, when the query
    parses without schemas."""
    from adaptcq.query.cql import parse_query
    try:
        bare = parse_query(sql)
    except QueryError:
        return
    require_inputs(bare, inputs)


def require_inputs(query: LogicalQuery, names) -> None:
    """Every source the query reads has an input, and every input is read."""
    need = {s.source for s in query.streams}
    missing = sorted(need - set(names))
    if missing:
        raise InputError(f"no input for stream {', '.join(missing)}; give one with "
                         f"--input NAME=PATH (have: {', '.join(sorted(names)) or 'none'})")
    unused = sorted(set(names) - need)
    if unused:
        raise InputError(f"input {unused[0]} is not a stream of the query (its streams: "
                         f"{', '.join(sorted(need))}); remove it or check its name")


# ----- the API ----------------------------------------------------------------------------
def stream(sql: str, sources: Mapping[str, object], timestamp: str = "ts",
           executor: str = "auto", mode: str = "append", **options) -> LocalRun:
    """Run a continuous query and yield its results as Arrow record batches, live.

    >>> for batch in adaptcq.stream(sql, {"R": reader_of_r(), "S": "s.parquet"}):
    ...     consume(batch)        # pyarrow.RecordBatch: SELECT columns, _sign, _ts

    Sources may be generators that never end. Rejected rows go to ``on_rejected`` if given
    (else they are kept: ``run.rejected_table()``); ``run.stats`` is live.
    """
    return LocalRun(sql, sources, timestamp, executor, mode, **options)


def run(sql: str, sources: Mapping[str, object], timestamp: str = "ts",
        executor: str = "auto", mode: str = "append", **options) -> RunResult:
    """Run a continuous query over finite inputs in this process; collect the output.

    >>> result = adaptcq.run(sql, sources={"R": "r.parquet", ...}, timestamp="ts")
    >>> result.table  # pyarrow Table: SELECT columns, _sign, _ts
    >>> result.stats  # updates, results, throughput (updates per CPU-second), peak state...
    """
    r = LocalRun(sql, sources, timestamp, executor, mode, **options)
    batches = list(r)
    return r.result(pa.Table.from_batches(batches, schema=r.schema))


# ----- whole inputs in memory (benchmarks, explain) --------------------------------------
@dataclass
class PreparedInput:
    """Arrivals of all streams merged into processing order, held in memory (for
    benchmarks that replay one input many times, and ``explain``)."""

    query: LogicalQuery
    streams: np.ndarray
    signs: np.ndarray | None
    timestamps: np.ndarray
    rows: list
    rejected: list[dict]
    ts_type: pa.DataType
    load_seconds: float
    time_unit: float = TIME_UNIT  # seconds per unit of ``timestamps`` (give it to the engine)


def prepare(sql: str | LogicalQuery, sources: Mapping[str, object], timestamp: str,
            sign: str | None = None, allowed_lateness: float = 0.0,
            timestamp_unit: str | None = None, limit: int | None = None) -> PreparedInput:
    """Read and merge every input into memory, in processing order; with ``limit``, only
    the first ``limit`` arrivals (``adaptcq explain --prefix``: memory follows the prefix,
    not the input). ``rejected`` holds the rows rejected among those read."""
    t0 = time.process_time()
    r = LocalRun(sql, sources, timestamp, "mjoin",  # rows as tuples: the per-tuple merger
                 sign=sign, allowed_lateness=allowed_lateness, timestamp_unit=timestamp_unit)
    streams, signs, ts, rows = [], [], [], []
    try:
        for arr in r.merger:
            streams.extend(arr.streams)
            ts.extend(arr.timestamps)
            rows.extend(arr.rows)
            if arr.signs is not None:
                signs.extend(arr.signs)
            if limit is not None and len(rows) >= limit:
                del streams[limit:], ts[limit:], rows[limit:], signs[limit:]
                break
    finally:
        close_inputs(r.merger)
    rejected = r.merger.rejected
    return PreparedInput(r.query, np.asarray(streams, np.int64),
                         np.asarray(signs, np.int64) if sign is not None else None,
                         np.asarray(ts, np.int64), rows, rejected, r.ts_type,
                         time.process_time() - t0)


def parse_signed(sql: str, schemas: Mapping[str, Mapping[str, str]],
                 sign: str | None) -> LogicalQuery:
    """``parse_query`` over inputs with a sign column (``--sign``): that column says whether
    a row is an insertion or a deletion and is no column of the stream, so ``*`` leaves it
    out and a query naming it is refused, at the name. (``SELECT *`` kept it: a deletion's
    -1 never equalled its row's +1, so every deletion was rejected.)"""
    from adaptcq.query.cql import parse_query
    if sign is None:
        return parse_query(sql, schemas)
    try:
        return parse_query(sql, {n: {c: k for c, k in cols.items() if c != sign}
                                 for n, cols in schemas.items()})
    except QueryError as e:
        try:
            parse_query(sql, schemas)
        except QueryError:
            raise e from None
        raise QueryError(f"column {sign!r} is the sign column (--sign): it marks each row an "
                         "insertion (+1) or a deletion (-1) and is not a column a query can "
                         "read", e.sql, e.position, e.length) from None


def rejected_batch(rows: list[dict], sources: Mapping[str, Source]) -> pa.RecordBatch:
    """Rejected rows (``stream``, ``row``: its number in the stream, ``ts``, ``reason``) as
    a batch of ``REJECTED_SCHEMA``: a row of a file input is named by its file and its row
    number in that file (``Source.locate``)."""
    out = []
    for r in rows:
        file, row = sources[r["stream"]].locate(r["row"])
        out.append({**r, "row": row, "file": file})
    return pa.RecordBatch.from_pylist(out, schema=REJECTED_SCHEMA)


def source_paths(sources: Mapping[str, object]) -> list[Path]:
    """The file inputs among ``sources`` (outputs must not overwrite them)."""
    out = []
    for src in sources.values():
        if isinstance(src, (str, Path)):
            text = str(src)
            if any(c in text for c in "*?["):
                import glob
                out.extend(Path(p) for p in glob.glob(text, recursive=True))
            else:
                out.append(Path(text))
    return out
