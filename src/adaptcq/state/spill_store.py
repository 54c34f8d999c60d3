"""Spilled partition groups on disk (state-spill.txt §3, §4): written once, read at clean-up.

One **spill event** is one Arrow IPC file (``spill-000001.arrow``, lz4-compressed), holding
one record batch per (operator, block of partition ids) (``BLOCKS`` blocks: pid mod 16), in
operator order, so a clean-up decodes one block of an operator at a time. A batch's rows are
the stored inputs of its groups: ``pid``, ``child`` (which input of the operator), then per
stream of the query its row id (``S#rid``), event time (``S#t``) and columns (``S.col``),
null where the input (a subresult of some streams) does not hold that stream. Values keep
their input types; nothing is pickled. The group index (operator, pid, batch, model bytes,
the latest window end among its inputs, inputs) is in the file's schema metadata.

``manifest.json`` lists the events in order, each with its file's size and SHA-256, and
what ``adaptcq cleanup`` needs (the query, plan and schemas). A file is written under a
temporary name, flushed to disk and renamed, then the manifest is replaced the same way:
the manifest never names a file that is not whole, and a failed write (a full disk) leaves
the previous manifest in force and raises :class:`SpillError` before any group leaves
memory, so no result is lost or repeated.

The format was chosen by measurement (``python -m adaptcq.bench.spill formats``,
docs/spill.md): Arrow IPC with lz4 against IPC with zstd or none and Parquet with zstd or
snappy, on the spill events of a Figure 16 run.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import json
import os
import re
import shutil
import tempfile
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter
from pathlib import Path

import numpy as np
import pyarrow as pa
from pyarrow import ipc

from adaptcq.checks import is_int
from adaptcq.collector import pausing
from adaptcq.errors import AdaptcqError
from adaptcq.paths import make_folders
from adaptcq.stream.arrays import engine_values

MANIFEST = "manifest.json"
VERSION = 1
BLOCKS = 16  # record batches per operator in a spill event: a clean-up decodes one at a time
# Compression and decompression in the calling thread: Arrow would hand each column buffer
# of a batch to its thread pool, and a spill batch holds a few hundred rows in a few dozen
# buffers, so the hand-offs cost more than the codec (a 150-row batch of 22 columns read in
# about 30 µs in this thread against 130-270 µs through the pool).
WRITE_THREADS = READ_THREADS = False


def stream_names(alias: str, columns) -> list[str]:
    """A stream's columns in the spill format: its row id, event time and columns."""
    return [f"{alias}#rid", f"{alias}#t", *(f"{alias}.{c}" for c in columns)]


def block_of(pid: int, blocks: int) -> int:
    return pid % blocks


class SpillError(AdaptcqError):
    """A spill that could not be written, or spilled state that cannot be read back
    (missing or corrupt file, a manifest of another query): names the file and why."""


@dataclass
class Event:
    file: str
    bytes: int
    groups: list


def _write_scratch(path: Path, data: bytes) -> None:
    """Write a file that lives only while this process runs (a crash restarts the work
    from durable files): no fsync, no rename."""
    with open(path, "wb") as f:
        f.write(data)


def _write_file(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` durably: a temporary name, fsync, rename."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def purge_files(directory: Path, files) -> None:
    """Remove these files of a spill folder; those already gone are no error (a purge
    repeated after a restart)."""
    for name in files:
        try:
            (Path(directory) / name).unlink()
        except OSError:
            pass


class SpillStore:
    """The spilled generations of one query's operator tree, in ``directory``.

    ``columns``: per stream alias, its row's column names (``LogicalQuery.columns``);
    ``types``: per stream alias, an Arrow schema giving those columns' types (inferred from
    the values when absent); ``fingerprint``: what the spilled state belongs to (the query
    and plan), checked when an existing folder is opened. ``writer(path, data)`` writes a
    file (a test passes one that fails, as a full disk would)."""

    def __init__(self, directory: str | Path | None, columns: Mapping[str, Sequence[str]],
                 types: Mapping[str, pa.Schema] | None = None, fingerprint: str = "",
                 writer: Callable[[Path, bytes], None] | None = None,
                 compression: str | None = "lz4", meta: dict | None = None,
                 fresh: bool = False, time_type: pa.DataType | None = None,
                 durable: bool = True, deferred: bool = False, hold: bool = False):
        # Not durable: scratch files of one process (a clean-up's hand-over): no manifest,
        # no checksums, no fsync, the folder removed by ``close``.
        self.durable = durable
        # Deferred: files a clean-up merged are not removed but listed in ``trash``, for
        # the caller to ``purge`` once its own checkpoint no longer names them (a Spark
        # group: a retried micro-batch is rebuilt from the last committed version, whose
        # events must still be on disk: ``restore``).
        self.deferred = deferred
        self.trash: list[str] = []
        # Held: a clean-up's ``clear`` only notes what it merged, and ``release`` clears it
        # (``adaptcq cleanup``: the folder must stay whole until the late results are
        # written, or a failed write loses them for good).
        self.hold = hold
        self._held: list[dict] = []
        self._merged: list[str] = []  # files of merged events a saved manifest still names
        if writer is None:
            writer = _write_file if durable else _write_scratch
        self.temporary = directory is None or not durable
        self.directory = Path(tempfile.mkdtemp(prefix="adaptcq-spill-")) if directory is None \
            else Path(directory)
        self.columns = {a: tuple(c) for a, c in columns.items()}
        self.types = dict(types or {})
        self.fingerprint = fingerprint
        self.time_type = time_type  # the engine's event times (int64 ns in the runtimes)
        self.meta = dict(meta or {})   # what ``adaptcq cleanup`` needs: query, plan, schema
        self.writer = writer
        self.options = ipc.IpcWriteOptions(compression=compression, use_threads=WRITE_THREADS)
        self.events: list[dict] = []
        self._verified: set[str] = set()
        # The spill files this store wrote: a clean-up checks the batches of the others
        # (left by an earlier process) against its plan (``spill_tree._runs_of``).
        self.written: set[str] = set()
        self._readers: dict[str, ipc.RecordBatchFileReader] = {}
        self._index: dict[str, tuple[list, int]] = {}  # file -> (group index, blocks)
        # (latest window end, model bytes) of every spilled group, the earliest end first,
        # and their total: ``live_bytes`` drops the ended ones as time passes.
        self._live: list | None = None
        self._live_total = 0.0
        self._all_total = 0.0  # every spilled group's model bytes, ended or not
        self._next = 1
        # The folders made here, the deepest last: ``discard`` removes them again.
        self.made: list[Path] = []
        try:
            self._make_folder()
        except OSError as e:  # a file of that name, a path through a file, no permission
            raise AdaptcqError(f"spill folder {str(self.directory)!r} cannot be made: "
                               f"{e.strerror or e}") from None
        # A temporary folder goes with its store even when ``close`` is never called (a
        # run that failed while it was set up, or that nobody iterated): a process that
        # runs for days must not leave a folder behind per query.
        self._remove = weakref.finalize(self, shutil.rmtree, str(self.directory), True) \
            if self.temporary else None
        manifest = self.directory / MANIFEST
        self._had_manifest = manifest.exists()  # (``discard`` removes only its own)
        if self._had_manifest:
            self._open(manifest)
            if fresh and self.events:
                raise SpillError(
                    f"spill folder {self.directory} holds the spilled state of an earlier "
                    f"run ({len(self.events)} spill events): produce its results with "
                    f"`adaptcq cleanup {self.directory}`, or give an empty folder")
            if fresh:
                # An emptied folder's query is not this run's: kept, a crash of this run
                # would leave its spill files under the earlier query for `adaptcq cleanup`.
                self.meta, self.fingerprint = dict(meta or {}), fingerprint

    def _make_folder(self) -> None:
        """``directory`` and its missing parents, each one made recorded in ``made``."""
        make_folders(self.directory, self.made)
        if not self.directory.is_dir():  # (a file of that name: mkdir would say so)
            self.directory.mkdir(exist_ok=True)

    # ----- the manifest ------------------------------------------------------------------
    def _open(self, manifest: Path) -> None:
        try:
            doc = json.loads(manifest.read_text())
        except (OSError, ValueError) as e:
            raise SpillError(f"spill manifest {manifest} cannot be read: {e}") from None
        if not isinstance(doc, dict):
            raise SpillError(f"spill manifest {manifest} is damaged: it holds "
                             f"{type(doc).__name__}, not an object")
        if doc.get("version") != VERSION:
            raise SpillError(f"spill manifest {manifest}: unknown version "
                             f"{doc.get('version')!r}")
        recorded = doc.get("fingerprint", "")
        if not isinstance(recorded, str):
            raise SpillError(f"spill manifest {manifest} is damaged: its 'fingerprint' is "
                             f"{type(recorded).__name__}, not a string")
        if self.fingerprint and recorded != self.fingerprint:
            raise SpillError(f"spill folder {self.directory} holds the spilled state of "
                             "another query or plan; give an empty folder")
        # A store opened without one keeps the folder's (its manifest rewritten with it):
        # ``adaptcq cleanup`` checks it against the recorded query (runtime.spill).
        self.fingerprint = self.fingerprint or recorded
        self.events = _checked_events(doc, manifest, self.durable)
        self._next = _next_number(self.events)
        meta = doc.get("meta", {})
        if not isinstance(meta, dict):
            raise SpillError(f"spill manifest {manifest} is damaged: its 'meta' is "
                             f"{type(meta).__name__}, not an object")
        self.meta = {**meta, **self.meta}
        for ev in self.events:  # every file the manifest names must be there
            if not (self.directory / ev["file"]).exists():
                raise SpillError(f"spill file {self.directory / ev['file']} named in the "
                                 "manifest is missing: the spilled results cannot be "
                                 "produced")

    def _save(self) -> None:
        if self.durable:
            doc = {"version": VERSION, "fingerprint": self.fingerprint, "meta": self.meta,
                   "events": self.events}
            self.writer(self.directory / MANIFEST, json.dumps(doc, indent=1).encode())
        if self._merged:
            self._release_merged()

    # ----- writing -----------------------------------------------------------------------
    @pausing  # a tuple per input (adaptcq.collector; Figure 20's clean-up: 0.70×)
    def rows_batch(self, groups: Sequence[tuple]) -> pa.RecordBatch:
        """The stored inputs of ``groups`` (one operator's, in pid order) as one record
        batch: ``pid``, ``child``, and each stream's ``#rid``, ``#t`` and columns. Built a
        (group, child) segment at a time, its records transposed with ``zip`` (C loops,
        not a Python loop per value)."""
        pids, child, segments = [], [], []
        for _, pid, per_child, layouts, _, _ in groups:
            for k, comps in enumerate(per_child):
                if comps:
                    pids += [pid] * len(comps)
                    child += [k] * len(comps)
                    segments.append((layouts[k], comps))
        arrays = [pa.array(pids, pa.int32()), pa.array(child, pa.int16())]
        names = ["pid", "child"]
        for alias, cols in self.columns.items():
            rid, t = [], []
            vals: list[list] = [[] for _ in cols]
            for streams, comps in segments:
                if alias not in streams:
                    none = [None] * len(comps)
                    rid += none
                    t += none
                    for v in vals:
                        v += none
                    continue
                j = streams.index(alias)
                rids, times, rows = zip(*[c[j] for c in comps], strict=True)
                rid += rids
                t += times
                if cols:
                    for v, col in zip(vals, zip(*rows, strict=True), strict=True):
                        v += col
            arrays += [pa.array(rid, pa.int64()),
                       _array(t, self.time_type, f"{alias} event time")]
            names += [f"{alias}#rid", f"{alias}#t"]
            known = self.types.get(alias)
            for c, col in enumerate(cols):
                typ = known.field(col).type if known is not None and col in known.names \
                    else None
                arrays.append(_array(vals[c], typ, f"column {alias}.{col}"))
                names.append(f"{alias}.{col}")
        return pa.RecordBatch.from_arrays(arrays, names=names)

    def write_event(self, groups: Sequence[tuple], ts, blocks: int = BLOCKS,
                    save: bool = True) -> Event:
        """One spill event: ``groups`` are (operator id, pid, per-child composites, child
        layouts, model bytes, latest window end), written as one file: a record batch per
        (operator, block of pids), the group index in the file's metadata. Raises
        :class:`SpillError` when the disk refuses it; the manifest then still lists only
        whole files. ``save=False``: the manifest is rewritten later (by ``clear``, at the
        end of the clean-up that writes groups back), not once per event; until then the
        file is named by no manifest, which a crash leaves as a stray file."""
        return self.write_batches(self.encode(groups, blocks), ts, blocks, save)

    def encode(self, groups: Sequence[tuple], blocks: int = BLOCKS) -> list[tuple]:
        """``groups`` as ``write_batches`` takes them: per (operator, block of pids), the
        record batch of its groups' inputs (``rows_batch``) and their index rows
        (operator id, pid, model bytes, latest window end, inputs)."""
        by_batch: dict[tuple[int, int], list] = {}
        for g in sorted(groups, key=lambda g: (g[0], g[1])):
            by_batch.setdefault((g[0], block_of(g[1], blocks)), []).append(g)
        return [(oid, block, self.rows_batch(members),
                 [(oid, pid, size, top, sum(len(c) for c in per_child))
                  for _, pid, per_child, _, size, top in members])
                for (oid, block), members in sorted(by_batch.items())]

    def write_batches(self, parts: Sequence[tuple], ts, blocks: int = BLOCKS,
                      save: bool = True) -> Event:
        """One spill event from record batches already built: ``parts`` are (operator id,
        block, batch, index rows), a batch's rows in pid order in the spill format
        (``rows_batch``), index rows (operator id, pid, model bytes, latest window end,
        inputs); a clean-up writing merged groups back hands its Arrow batches over as
        they are (``write_event`` otherwise)."""
        name = f"spill-{self._next:06d}.arrow"
        path = self.directory / name
        batches, index = [], []
        for b, (_, _, batch, rows) in enumerate(sorted(parts, key=lambda p: (p[0], p[1]))):
            batches.append(batch)
            index += [[oid, pid, b, float(size), None if top == float("inf") else top,
                       int(n)] for oid, pid, size, top, n in rows]
        # One schema for the file: a column inferred as int64 in one batch and double in
        # another (values without a declared type) is double in all.
        try:
            schema = pa.unify_schemas([bt.schema for bt in batches],
                                      promote_options="permissive")
            sink = pa.BufferOutputStream()
            with ipc.new_file(sink, schema.with_metadata(
                    {"adaptcq.groups": json.dumps(index), "adaptcq.blocks": str(blocks)}),
                    options=self.options) as w:
                for bt in batches:
                    w.write_batch(bt.cast(schema) if bt.schema != schema else bt)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as e:
            raise SpillError(f"cannot spill: the stored values do not fit one Arrow type per "
                             f"column ({e}); give the inputs an Arrow schema") from None
        data = sink.getvalue().to_pybytes()
        event = {"file": name, "bytes": len(data), "ts": ts,
                 "sha256": hashlib.sha256(data).hexdigest() if self.durable else ""}
        try:
            self.writer(path, data)
            self.events.append(event)
            if save:
                self._save()
        except OSError as e:
            if self.events and self.events[-1] is event:
                self.events.pop()
            for p in (path, path.with_name(path.name + ".tmp")):
                try:
                    p.unlink()
                except OSError:
                    pass
            # (a clean-up's hand-over, not durable, says what it kept: ``_SentUp``)
            raise SpillError(f"cannot write spill file {path}: {e.strerror or e}" + (
                " (no partition group was dropped from memory)" if self.durable else "")) \
                from None
        self._next += 1
        self._index[name] = (index, blocks)
        self.written.add(name)
        if self._live is not None:
            self._track(index)
        return Event(name, len(data), index)

    # ----- reading -----------------------------------------------------------------------
    def _group_index(self, name: str) -> tuple[list, int]:
        """A spill file's group index (``write_batches``) and block count, read from its
        schema metadata once and checked (a file rewritten by hand with its SHA-256
        updated is refused naming it, not met as a raw KeyError later); whether its
        operators and pids fit the plan is the tree's check (``SpillTree._cleanup``)."""
        got = self._index.get(name)
        if got is None:
            r = self._reader(name)
            md = r.schema.metadata or {}
            where = f"spill file {self.directory / name}"
            try:
                index = json.loads(md[b"adaptcq.groups"])
                blocks = int(md[b"adaptcq.blocks"])
            except KeyError as e:
                raise SpillError(f"{where} has no group index (its schema metadata has no "
                                 f"{e.args[0].decode()!r}): the spilled results cannot be "
                                 "produced") from None
            except (ValueError, TypeError) as e:
                raise SpillError(f"{where} has a damaged group index ({e}): the spilled "
                                 "results cannot be produced") from None
            bad = None if name in self.written else \
                _bad_index(index, blocks, r.num_record_batches)
            if bad is not None:
                raise SpillError(f"{where} has a damaged group index ({bad}): the spilled "
                                 "results cannot be produced")
            got = self._index[name] = (index, blocks)
        return got

    def unlisted(self) -> list[str]:
        """The spill files in the folder that no event of the manifest names (a manifest
        edited by hand, or the files of a clean-up that stopped before removing them)."""
        listed = {ev["file"] for ev in self.events}
        try:
            names = [p.name for p in self.directory.iterdir()]
        except OSError:
            return []
        return sorted(n for n in names if _SPILL_FILE.fullmatch(n) and n not in listed)

    def groups(self) -> dict[int, dict[int, list[tuple[str, int]]]]:
        """{operator id: {pid: [(file, batch), ...] in spill order}}."""
        out: dict[int, dict[int, list]] = {}
        for ev in self.events:
            for oid, pid, b, *_ in self._group_index(ev["file"])[0]:
                out.setdefault(oid, {}).setdefault(pid, []).append((ev["file"], b))
        return out

    def group_rows(self, oid: int) -> dict[int, int]:
        """{pid: stored inputs} of operator ``oid``'s spilled groups, from the index."""
        out: dict[int, int] = {}
        for ev in self.events:
            for o, pid, _, _, _, n in self._group_index(ev["file"])[0]:
                if o == oid:
                    out[pid] = out.get(pid, 0) + n
        return out

    def _reader(self, name: str) -> ipc.RecordBatchFileReader:
        r = self._readers.get(name)
        if r is not None:
            return r
        path = self.directory / name
        try:
            if self.durable and name not in self._verified:
                ev = next(e for e in self.events if e["file"] == name)
                digest = hashlib.sha256()
                with open(path, "rb") as f:
                    for chunk in iter(lambda: f.read(1 << 20), b""):
                        digest.update(chunk)
                if digest.hexdigest() != ev["sha256"]:
                    raise SpillError(f"spill file {path} is corrupt (its SHA-256 differs "
                                     "from the manifest's): the spilled results cannot be "
                                     "produced")
                self._verified.add(name)
            r = ipc.open_file(pa.memory_map(str(path)),  # pages are read as batches are
                              options=ipc.IpcReadOptions(use_threads=READ_THREADS))
            # Every column of the spill format for this query's streams, in a file this
            # store did not write (one of another query would otherwise fail later as a
            # raw KeyError, or decode wrongly).
            if name not in self.written:
                have = set(r.schema.names)
                missing = [n for n in self._format_names() if n not in have]
                if missing:
                    raise SpillError(
                        f"spill file {path} does not hold this query's columns (no "
                        f"{', '.join(map(repr, missing[:3]))}"
                        f"{' ...' if len(missing) > 3 else ''}): it is not this query's "
                        "spilled state")
        except OSError as e:
            raise SpillError(f"spill file {path} cannot be read ({e.strerror or e}): the "
                             "spilled results cannot be produced") from None
        except pa.ArrowInvalid as e:
            raise SpillError(f"spill file {path} is not a readable Arrow file: {e}") from None
        self._readers[name] = r
        return r

    def _format_names(self) -> list[str]:
        """The spill format's columns (``rows_batch``)."""
        return ["pid", "child"] + [n for a, cols in self.columns.items()
                                   for n in stream_names(a, cols)]

    def batch(self, ref: tuple[str, int]) -> pa.RecordBatch:
        """One batch of a spill event as Arrow (its rows in pid order: ``pid_ranges``)."""
        name, b = ref
        return self._reader(name).get_batch(b)

    @staticmethod
    def pid_ranges(batch: pa.RecordBatch) -> dict[int, tuple[int, int]]:
        """The row range [start, end) of each pid of ``batch`` (written in pid order:
        ``write_event``)."""
        pid = batch.column(0).to_numpy()
        if not len(pid):
            return {}
        cut = np.flatnonzero(pid[1:] != pid[:-1]) + 1
        starts = np.concatenate([[0], cut]).tolist()
        ends = np.concatenate([cut, [len(pid)]]).tolist()
        return {int(pid[a]): (a, b) for a, b in zip(starts, ends, strict=True)}

    @pausing  # a tuple per input (adaptcq.collector; Figure 20's clean-up: 0.70×)
    def decode(self, batch: pa.RecordBatch, layouts: Sequence[Sequence[str]],
               windows: Mapping[str, float] | None = None) -> dict[int, list[list[tuple]]]:
        """Rows of a spill event (``batch``, or a slice of it): per pid, per child, its
        composites (tuples of (rid, t, row) records in the child's stream layout). With
        ``windows`` (per stream its window w), each comes as (exp, newest time, composite),
        exp = min(t + w) over its records: what the clean-up sorts and tests by. Built a
        child at a time, the columns gathered and zipped (C loops, not a Python loop per
        value); only the columns of the streams in ``layouts`` are read."""
        used = {a for lay in layouts for a in lay}
        names = ["pid", "child"] + [n for a in self.columns if a in used
                                    for n in stream_names(a, self.columns[a])]
        cols = {n: engine_values(batch.column(n)) for n in names}
        pids, child = cols["pid"], cols["child"]
        out: dict[int, list[list[tuple]]] = {}
        m = len(layouts)
        for k, lay in enumerate(layouts):
            idx = [r for r, c in enumerate(child) if c == k]
            if not idx:
                continue
            take = _take(idx)
            per_stream, times = [], []
            for a in lay:
                t = take(cols[f"{a}#t"])
                vals = [take(cols[f"{a}.{c}"]) for c in self.columns[a]]
                rows = zip(*vals, strict=True) if vals else itertools.repeat((), len(idx))
                per_stream.append(zip(take(cols[f"{a}#rid"]), t, rows, strict=True))
                times.append(t)
            comps = list(zip(*per_stream, strict=True))
            if windows is not None:
                ws = [windows[a] for a in lay]
                if len(lay) == 1:
                    (t,), (w,) = times, ws
                    items = [(tr + w, tr, c) for tr, c in zip(t, comps, strict=True)]
                else:
                    exps = map(min, *[[tr + w for tr in t] for t, w in zip(times, ws,
                                                                       strict=True)])
                    items = list(zip(exps, map(max, *times), comps, strict=True))
            else:
                items = comps
            for r, item in zip(take(pids), items, strict=True):
                g = out.get(r)
                if g is None:
                    g = out[r] = [[] for _ in range(m)]
                g[k].append(item)
        return out

    def live_bytes(self, now) -> float:
        """Model bytes of the spilled groups holding an input whose window has not ended
        at ``now`` (unbounded inputs never end); ``now`` never decreases between calls."""
        if self._live is None:
            self._live, self._live_total, self._all_total = [], 0.0, 0.0
            for ev in self.events:
                self._track(self._group_index(ev["file"])[0])
        live = self._live
        while live and live[0][0] < now:
            self._live_total -= heapq.heappop(live)[1]
        return max(self._live_total, 0.0)

    def ended_bytes(self, now) -> float:
        """Model bytes of the spilled groups whose every input's window has ended at
        ``now``: what a clean-up would merge and drop (``now`` as in ``live_bytes``)."""
        live = self.live_bytes(now)
        return max(self._all_total - live, 0.0)

    def _track(self, index: list) -> None:
        for g in index:
            heapq.heappush(self._live, (float("inf") if g[4] is None else g[4], g[3]))
            self._live_total += g[3]
            self._all_total += g[3]

    def clear(self, events: Sequence[dict] | None = None) -> None:
        """After a clean-up: every spilled generation was merged (or those of ``events``,
        the ones the clean-up read: it may have written groups back as new events); the
        manifest is rewritten first (it must never name a missing file), then the files
        are removed."""
        self._readers.clear()
        if self.hold:
            held = {ev["file"] for ev in self._held}
            self._held += [ev for ev in (self.events if events is None else events)
                           if ev["file"] not in held]
            return
        if not self.events:
            return
        if self._remove is not None and not self._remove.alive:
            self.events = []  # the temporary folder is gone (the process exits): no files
            return
        merged = {ev["file"] for ev in (self.events if events is None else events)}
        gone = [ev for ev in self.events if ev["file"] in merged]
        if not gone:
            return
        self.events = [ev for ev in self.events if ev["file"] not in merged]
        self.written -= merged  # (never read again: the set stays as small as the events)
        self._forget_files()
        # Merged: they are no longer this store's events, whatever the disk says. Their
        # files go once a manifest without them is written (now, or at the next save).
        self._merged += [ev["file"] for ev in gone]
        try:
            self._save()
        except OSError as e:
            raise SpillError(f"the clean-up is done but the spill manifest in "
                             f"{self.directory} cannot be rewritten ({e.strerror or e}): its "
                             "merged files stay until it can be") from None

    def release(self) -> None:
        """A held store (``hold``): what the clean-ups merged is cleared now (the caller's
        output is safe), and later clean-ups clear at once. Raises :class:`SpillError` as
        ``clear`` does."""
        held, self._held, self.hold = self._held, [], False
        if held:
            self.clear(held)

    def discard(self) -> None:
        """A run that did not finish: every spill file goes (``clear``), and so do the
        manifest this store wrote into a folder that had none and the folders it made, so
        that a refused run leaves the disk as it found it (a folder the user had made
        stays, as do files of others in it)."""
        self.hold = False
        self.clear()
        self._readers.clear()
        if self.temporary:
            return  # (``close`` removes the whole folder)
        if not self._had_manifest:
            try:
                (self.directory / MANIFEST).unlink(missing_ok=True)
            except OSError:
                pass
        for d in reversed(self.made):
            try:
                d.rmdir()  # (only when empty: a file someone else put there stays)
            except OSError:
                break
        self.made = []

    def _release_merged(self) -> None:
        """A manifest without the merged events is on disk: their files can go (a deferred
        store lists them in ``trash``)."""
        files, self._merged = self._merged, []
        if self.deferred:
            self.trash += files
        else:
            self.purge(files)

    def purge(self, files) -> None:
        """Remove these spill files (a deferred store's ``trash``, once no checkpoint
        names them)."""
        purge_files(self.directory, files)

    def restore(self, events: list[dict]) -> None:
        """Make ``events`` (the manifest entries a checkpoint recorded) the store's events,
        as they were when it was written: each file must be there (checked, with its
        SHA-256, when read); every other spill file or clean-up scratch folder in the
        folder is from work never committed (a failed or retried attempt) and is removed.
        Raises :class:`SpillError` naming a missing file."""
        for ev in events:
            if not (self.directory / ev["file"]).exists():
                raise SpillError(f"spill file {self.directory / ev['file']} named in the "
                                 "checkpoint is missing: the spilled results cannot be "
                                 "produced")
        keep = {ev["file"] for ev in events} | {MANIFEST}
        for p in self.directory.iterdir():
            if p.name in keep:
                continue
            if p.is_dir() and p.name.startswith("cleanup-"):
                shutil.rmtree(p, ignore_errors=True)
            elif owns(p.name):
                p.unlink(missing_ok=True)
        self.events = [dict(ev) for ev in events]
        self._merged = []
        self.written.clear()
        self._next = _next_number(self.events)
        self._forget_files()
        self._save()

    def _forget_files(self) -> None:
        """Drop what was read from the files (readers, checks, group indexes, the live
        total, rebuilt from the index when asked): the events changed."""
        self._readers.clear()
        self._verified.clear()
        self._index.clear()
        self._live, self._live_total, self._all_total = None, 0.0, 0.0

    def close(self) -> None:
        self._readers.clear()
        if self._remove is not None:
            self._remove()  # the temporary folder, once


def _checked_events(doc: dict, manifest: Path, durable: bool) -> list[dict]:
    """The manifest's events, each checked for what reading it back needs (a file named
    as ``write_batches`` names them, its size and, in a durable store, its SHA-256): a
    manifest edited or damaged by hand is refused naming it and what is wrong, not met
    later as a raw KeyError."""
    events = doc.get("events")
    if not isinstance(events, list):
        what = "has no 'events'" if events is None else \
            f"has 'events' of type {type(events).__name__}, not a list"
        raise SpillError(f"spill manifest {manifest} is damaged: it {what}")
    for i, ev in enumerate(events):
        where = f"spill manifest {manifest} is damaged: event {i + 1}"
        if not isinstance(ev, dict):
            raise SpillError(f"{where} is {type(ev).__name__}, not an object")
        name = ev.get("file")
        if not isinstance(name, str) or not _SPILL_FILE.fullmatch(name):
            raise SpillError(f"{where} names no spill file (its 'file' is {name!r}, "
                             "not spill-NNNNNN.arrow)")
        if not is_int(ev.get("bytes")) or ev["bytes"] < 0:
            raise SpillError(f"{where} ({name}) has no size (its 'bytes' is "
                             f"{ev.get('bytes')!r})")
        digest = ev.get("sha256")
        if durable and (not isinstance(digest, str) or not _SHA256.fullmatch(digest)):
            raise SpillError(f"{where} ({name}) has no SHA-256 to check the file by (its "
                             f"'sha256' is {digest!r})")
    return events


def _bad_index(index, blocks: int, batches: int) -> str | None:
    """What is wrong with a spill file's group index (rows of operator id, pid, batch,
    model bytes, latest window end or null, inputs), or None."""
    if blocks < 1:
        return f"{blocks} blocks"
    if not isinstance(index, list):
        return f"{type(index).__name__}, not a list"
    for i, row in enumerate(index):
        if not isinstance(row, list) or len(row) != 6:
            return f"row {i + 1} is {row!r}, not 6 fields"
        oid, pid, b, size, top, n = row
        if not (is_int(oid) and oid >= 1 and is_int(pid) and pid >= 0 and is_int(n) and
                n >= 0 and is_int(b) and 0 <= b < batches and _number(size) and
                (top is None or _number(top))):
            return f"row {i + 1} is {row!r}"
    return None


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def owns(name: str) -> bool:
    """Whether a file named ``name`` in a spill folder is one the store writes, replaces or
    clears (spill files, the manifest and its temporary copies, a clean-up's scratch
    folders): nothing else may be written there under such a name."""
    return name.startswith(("spill-", MANIFEST, "cleanup-"))


_SPILL_FILE = re.compile(r"spill-(\d{6,})\.arrow")
_SHA256 = re.compile(r"[0-9a-f]{64}")


def _next_number(events: list[dict]) -> int:
    """The number of the next spill file (``spill-NNNNNN.arrow``) after ``events``'."""
    return 1 + max((int(_SPILL_FILE.fullmatch(ev["file"])[1]) for ev in events), default=0)


def _take(idx: list[int]):
    """A function gathering the items at ``idx`` of a list, as a sequence (itemgetter
    returns a bare item for one index)."""
    if len(idx) == 1:
        (i,) = idx
        return lambda xs: (xs[i],)
    return itemgetter(*idx)


def _array(values: list, typ: pa.DataType | None, what: str) -> pa.Array:
    try:
        return pa.array(values, typ) if typ is not None else pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as e:
        raise SpillError(f"cannot spill {what}: its values do not fit one Arrow type "
                         f"({e}); give the input an Arrow schema") from None
