"""The split: which partition groups an update goes to, and how it travels there.

state-spill.txt §5's *split operators* route every tuple to the partitioned stateful operator
instances that own it; §2.1 asks that "each query result can be generated from tuples within
the same partition". We partition by **shares** (HyperCube; ``optimizer.shares``): every
attribute class c that joins two or more streams gets a share p_c, ∏ p_c = P, and the P
groups are the cells of that grid. An update is hashed on each class it has (Spark's
``pmod(hash(col), p_c)``, computed in Spark by ``runtime.spark._project``) and replicated
over every coordinate of the classes it lacks. The tuples of a result agree on every class,
so they meet in exactly one cell: every group runs the unchanged engine and the union of the
groups' outputs is the query's output, without duplicates. When one class spans every stream
the cheapest shares are (P) on it: the key common to all streams, with no replication.

* An update with a NULL in a class it has never joins: it goes to one group (coordinate 0
  there, no replication), where it still occupies, and leaves, its window.
* A ``[ROWS n]`` window holds the n most recent rows of the whole stream, which no partition
  can know: such a query runs in one group, with a ``SplitWarning``; so does a query whose
  streams share no class (a cross product).
* Of an update's replicas one is **primary** (coordinate 0 on every replicated dimension):
  only it reports the update when it is late or an unmatched deletion, and only it counts
  as an input row, so replication never shows twice in the counts.

Transfer is columnar (``ColumnarSplit``): per input Arrow batch, per group and stream, one
row whose ``_p`` is an Arrow IPC stream of that group's rows of that stream (event time as
int64 ns, order key, sign, primary flag, the query's columns); per group one punctuation row
(each stream's maximum event time and row count in the batch, and the end-of-input flag) so
that every group learns the same event-time frontier each micro-batch. Nothing is pickled;
the group reads the batches back with Arrow (``runtime.spark_group``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import numpy as np

from adaptcq.checks import is_int
from adaptcq.errors import InputError, OptionError
from adaptcq.optimizer import shares as shares_mod
from adaptcq.query.logical import LogicalQuery
from adaptcq.runtime.spark_daemon import freeze_imports
from adaptcq.stream import eventtime as et

__all__ = ["CLEANUP", "END", "MARKERS", "MARKER_CLEANUP", "MARKER_TICK", "PUNCT", "TICK",
           "ColumnarSplit", "SplitPlan", "SplitWarning", "plan_split"]

END = -1  # stream index of an end-of-input control row
CLEANUP = -3  # stream index of a clean-up control row (``spark.signal_cleanup``)
TICK = -4  # stream index of a control row that only makes every group run (``signal_tick``)
PUNCT = -2  # ``_s`` of a punctuation packet (a group's frontier update)
# What an end-of-input folder's marker files say (``spark._marker``): the kind of control
# row each becomes (any other text is an end of input).
MARKER_CLEANUP, MARKER_TICK = "cleanup", "tick"
MARKERS = {MARKER_CLEANUP: CLEANUP, MARKER_TICK: TICK}
_SEP = "\x01"  # replaces "/" in a file path's order key: paths sort as the local runtime's
_NOFILE = "\x00"  # prefix of the order key of a row that comes from no file


class SplitWarning(UserWarning):
    """The query cannot be split into partition groups and runs as one."""


# ---------------------------------------------------------------------------------------------
# Split planning (state-spill.txt §2.1, §5)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SplitPlan:
    """How updates are routed to partition groups.

    ``groups`` is P; ``reason`` says why a query runs in one group. With shares,
    ``classes`` are the attribute classes that join two or more streams (labels such as
    ``R.a = S.a``), ``shares`` their integer shares (∏ = P), ``covers`` the aliases each
    class has a column in, ``keys[alias]`` the (class index, column) pairs the alias is
    hashed on (classes with a share above 1), ``rates`` the per-alias rates the shares were
    chosen for. ``columns[alias]`` is the one column a stream is hashed on when a single
    class takes all P groups (the query-set runtime builds plans with only this).
    """

    groups: int
    columns: dict[str, str | None]
    reason: str = ""
    classes: tuple[str, ...] = ()
    shares: tuple[int, ...] = ()
    covers: tuple[frozenset, ...] = ()
    keys: dict = field(default_factory=dict)
    rates: dict = field(default_factory=dict)

    @property
    def strides(self) -> tuple[int, ...]:
        """Mixed-radix strides: group = Σ coordinate_c · stride_c."""
        out, acc = [], 1
        for p in reversed(self.shares):
            out.append(acc)
            acc *= p
        return tuple(reversed(out))

    def replicas(self, alias: str) -> int:
        return shares_mod.replication(self.covers, self.shares, alias) if self.shares else 1

    def offsets(self, alias: str) -> np.ndarray:
        """The group offsets one update of ``alias`` is replicated over (offset 0 first:
        the primary replica)."""
        offs = np.zeros(1, np.int64)
        for c, (p, st) in enumerate(zip(self.shares, self.strides, strict=True)):
            if p > 1 and alias not in self.covers[c]:
                offs = (offs[:, None] + np.arange(p, dtype=np.int64)[None, :] * st).ravel()
        return offs

    def describe(self) -> dict:
        """JSON-able: the shares, each stream's replication, tuples shipped per input
        tuple (``replication``) at the rates the shares were chosen for."""
        if not self.shares:
            return {"groups": self.groups, "shares": {}, "replicas": {}, "replication": 1.0,
                    "reason": self.reason}
        total = sum(self.rates.values()) or 1.0
        return {"groups": self.groups,
                "shares": dict(zip(self.classes, self.shares, strict=True)),
                "replicas": {a: self.replicas(a) for a in self.rates},
                "rates": dict(self.rates),
                "replication": shares_mod.shipped(self.covers, self.rates, self.shares) / total,
                "reason": self.reason}


def join_classes(query: LogicalQuery) -> list[tuple[str, frozenset, dict]]:
    """The attribute classes joining two or more streams, in FROM and column order of their
    first column: (label, aliases covered, alias -> the column hashed (first in layout))."""
    aliases = query.aliases
    out = []
    for cls in query.classes:
        per: dict[str, str] = {}
        for c in cls:
            if c.stream not in per or (query.columns[c.stream].index(c.column)
                                       < query.columns[c.stream].index(per[c.stream])):
                per[c.stream] = c.column
        if len(per) < 2:
            continue
        first = min(cls, key=lambda c: (aliases.index(c.stream),
                                        query.columns[c.stream].index(c.column)))
        label = " = ".join(sorted(map(str, cls)))
        out.append(((aliases.index(first.stream),
                     query.columns[first.stream].index(first.column)), label,
                    frozenset(per), per))
    out.sort(key=lambda x: x[0])
    return [(label, cov, per) for _, label, cov, per in out]


def _given_shares(classes, given: dict, P: int | None) -> tuple[int, ...]:
    """Shares named by the user: ``{"S.b": 4, "R.a": 2}`` (any column of a class, or its
    label); classes not named get 1. Two names of one class with different shares are
    refused, naming both (the last one was kept silently)."""
    shares = [1] * len(classes)
    named: dict[int, str] = {}  # class -> the name that gave its share
    for name, p in given.items():
        hit = [k for k, (label, _, per) in enumerate(classes)
               if name == label or name in {f"{a}.{c}" for a, c in per.items()}
               or any(name == str(x) for x in label.split(" = "))]
        if not hit:
            known = "; ".join(label for label, _, _ in classes) or "none"
            raise OptionError(f"shares: {name!r} is not a column of a join attribute class "
                              f"(the classes: {known})")
        if not is_int(p) or p < 1:
            raise OptionError(f"shares: {name!r} has share {p!r}; a share is a whole "
                              "number >= 1")
        first = named.get(hit[0])
        if first is not None and shares[hit[0]] != p:
            raise OptionError(f"shares: {first}={shares[hit[0]]} and {name}={p} give the "
                              f"attribute class {classes[hit[0]][0]} two shares; give it "
                              "one")
        named[hit[0]] = name
        shares[hit[0]] = p
    if P is not None and math.prod(shares) != P:
        raise OptionError(f"shares {dict(given)} multiply to {math.prod(shares)} groups, but "
                          f"partitions is {P}; their product must equal it")
    shares_mod.check_groups(math.prod(shares), f"shares {dict(given)} multiply to "
                            f"{math.prod(shares):,} groups", OptionError)
    return tuple(shares)


def plan_split(query: LogicalQuery, partitions: int | None, rates: dict | None = None,
               shares: dict | None = None) -> SplitPlan:
    """The shares for P = ``partitions`` groups (``optimizer.shares.choose_shares``, at
    ``rates``: per source or alias, default equal), or the user's ``shares`` (then
    ``partitions``, when given, must equal their product).

    Count windows are per stream, not per key (the n most recent rows of the whole
    stream), so a query with one runs in one group; so does one whose streams share no
    attribute class.
    """
    aliases = query.aliases
    single = {a: None for a in aliases}
    if not shares and (partitions is None or partitions <= 1):
        return SplitPlan(1, single)
    rows = [s.alias for s in query.streams if s.window.kind == "rows"]
    if rows:
        if shares:
            raise OptionError(f"shares: stream {', '.join(rows)} has a [ROWS n] window, "
                              "which runs in one group")
        return SplitPlan(1, single, (
            f"stream {', '.join(rows)} has a [ROWS n] window: it holds the n most recent rows "
            "of the whole stream, which no partition of the stream can know; use [RANGE ...] "
            "windows to let the query run in partition groups"))
    classes = join_classes(query)
    if not classes:
        if shares:
            raise OptionError("shares: the query joins no two streams on a column")
        return SplitPlan(1, single, (
            "no two streams are joined by an equality of columns, so no hash partitioning "
            "keeps every result in one group; an equality between streams would let it "
            "run in partition groups"))
    rate = {}
    for s in query.streams:
        r = (rates or {}).get(s.alias, (rates or {}).get(s.source, 1.0))
        if isinstance(r, bool) or not (isinstance(r, int | float) and math.isfinite(r)
                                       and r > 0):
            raise OptionError(f"rates: stream {s.alias} has rate {r!r}; a rate is a "
                              "positive number")
        rate[s.alias] = float(r)
    covers = tuple(cov for _, cov, _ in classes)
    if shares:
        chosen = _given_shares(classes, shares, partitions)
    else:
        chosen = shares_mod.choose_shares(covers, rate, partitions)
    P = math.prod(chosen)
    keys = {a: tuple((c, classes[c][2][a]) for c in range(len(classes))
                     if chosen[c] > 1 and a in covers[c]) for a in aliases}
    columns = dict(single)
    big = [c for c, p in enumerate(chosen) if p > 1]
    if len(big) == 1 and len(covers[big[0]]) == len(set(aliases)):
        columns = {a: classes[big[0]][2][a] for a in aliases}
    return SplitPlan(P, columns, "", tuple(label for label, _, _ in classes), chosen, covers,
                     keys, rate)


@dataclass
class _Config:
    qid: str
    sql: str
    schemas: dict
    executor: str
    mode: str
    options: dict
    adaptivity: dict | None
    groups: int
    keys: list[int]
    lateness: float
    lateness_ns: int
    signed: bool
    n_streams: int
    stream_columns: list[list[str]]
    reported: list[bool]
    sources: list[str]
    names: list[str]
    timestamp: str = "ts"
    unit: str | None = None
    ts_kinds: list[str] = field(default_factory=list)
    sign: str | None = None
    plan: SplitPlan | None = None  # the shares (ColumnarSplit)
    aliases: list[str] = field(default_factory=list)
    results: object = None  # the Arrow schema of result rows (``runtime.spark._frames``)
    inputs: dict | None = None  # alias -> Arrow schema of its columns (the vector executor)
    spill: dict | None = None  # the operator tree's spilling (runtime.spill.spark_spill_spec)
    # the session's spark.sql.shuffle.partitions when the plan was built (error messages)
    key_partitions: int | None = None


def _file_key(uri: str | None, cache: dict) -> str:
    """The order key of a row's file: its local path with "/" as ``_SEP``, so that keys sort
    as the local runtime sorts a source's files (``sorted(Path)``). Rows of no file keep
    their ``_NOFILE`` key; rows with an order column have none ("")."""
    if uri is None:
        return ""
    key = cache.get(uri)
    if key is None:
        if uri.startswith(_NOFILE):
            key = uri
        else:
            from urllib.parse import unquote, urlparse
            path = unquote(urlparse(uri).path) if uri.startswith("file:") else uri
            key = path.replace("/", _SEP)
        cache[uri] = key
    return key


def _file_of(key: str | None) -> str | None:
    """The file a row came from (for messages), from its order key."""
    if not key or key.startswith(_NOFILE):
        return None
    return key.replace(_SEP, "/")


class _FileKeys:
    """A batch's file order keys (``_file_key``), dictionary-encoded: the few distinct
    files of a batch are converted once, not once per row."""

    def __init__(self, encoded, cache: dict):
        import pyarrow as pa
        self.codes = encoded.indices.to_numpy(zero_copy_only=False)
        self.keys = [_file_key(u, cache) for u in encoded.dictionary.to_pylist()]
        self.dictionary = pa.array(self.keys, pa.string())

    def __getitem__(self, j: int) -> str:
        return self.keys[self.codes[j]]

    def take(self, idx: np.ndarray):
        """The keys of rows ``idx`` as a dictionary array."""
        import pyarrow as pa
        return pa.DictionaryArray.from_arrays(pa.array(self.codes[idx], pa.int32()),
                                              self.dictionary)


class _Split:
    """The split's helpers shared with the query-set runtime (``runtime.spark_multi``):
    event times as int64 nanoseconds with ``eventtime.to_nanoseconds`` (the local
    runtime's rules and messages), the sign check, and the row order key. One call sees one
    Spark partition in order, which is what numbers the rows of sources without a row index
    (``_oc``)."""

    def __init__(self, cfg: _Config):
        self.cfg = cfg

    def _prepared(self, batches):
        """Per non-empty input batch: (batch, stream index per row, end of input seen, file
        order keys, row order keys, event times in ns, [(stream, max time, rows)])."""
        import pyarrow.compute as pc
        cfg = self.cfg
        counters: dict = {}
        keys: dict = {}
        for batch in batches:
            if batch.num_rows == 0:
                continue
            s = batch.column("_s").to_numpy(zero_copy_only=False)
            end = bool((s == END).any())
            o1 = _FileKeys(pc.fill_null(batch.column("_o1"), "").dictionary_encode(), keys)
            o2 = pc.fill_null(batch.column("_o2"), -1).to_numpy(zero_copy_only=False).copy()
            oc = pc.fill_null(batch.column("_oc"), False).to_numpy(zero_copy_only=False)
            for j in np.flatnonzero(oc & self._numbered(s)).tolist():
                k = (self._order_class(int(s[j])), o1[j], int(o2[j]))
                c = counters.get(k, 0)
                counters[k] = c + 1
                o2[j] += c
            t = np.zeros(len(s), np.int64)
            maxima = []
            for i in np.unique(s[s >= 0]).tolist():
                sel = np.flatnonzero(s == i)
                t[sel] = self._times(batch, i, sel, o1, o2)
                maxima.append((i, int(t[sel].max()), len(sel)))
            if getattr(cfg, "signed", False):
                self._check_signs(batch, s, o1, o2)
            yield batch, s, end, o1, o2, t, maxima

    @staticmethod
    def _numbered(s: np.ndarray) -> np.ndarray:
        """The rows whose order key the split numbers (``_oc``): the data rows."""
        return s >= 0

    @staticmethod
    def _order_class(stream: int):
        """Rows numbered apart from others of the same (file, block): none here."""
        return

    def _times(self, batch, i: int, sel: np.ndarray, o1: list, o2: np.ndarray) -> np.ndarray:
        """Stream i's event times in ``sel`` as int64 ns; a bad one is an InputError naming
        the stream, its file and the row's index there, with ``eventtime``'s wording."""
        import pyarrow as pa
        cfg = self.cfg
        kind = cfg.ts_kinds[i]
        col = batch.column("_td" if kind == "float" else "_ti").take(pa.array(sel))
        if kind == "us":
            col = col.cast(pa.timestamp("us"))
        elif kind == "date":
            col = col.cast(pa.int32()).cast(pa.date32())
        try:
            return et.to_nanoseconds(col, cfg.unit, cfg.sources[i], cfg.timestamp)
        except InputError:
            for j in range(len(col)):  # the first bad row, with its own number and file
                r = int(sel[j])
                f = _file_of(o1[r])
                et.to_nanoseconds(col.slice(j, 1), cfg.unit,
                                  cfg.sources[i] + (f" (file {f})" if f else ""),
                                  cfg.timestamp, first_row=int(o2[r]))
            raise

    def _check_signs(self, batch, s: np.ndarray, o1: list, o2: np.ndarray) -> None:
        cfg = self.cfg
        sg = batch.column("_sg").to_numpy(zero_copy_only=False)
        bad = np.flatnonzero((s >= 0) & (sg != 1) & (sg != -1))
        if len(bad):
            r = int(bad[0])
            f = _file_of(o1[r])
            raise InputError(f"stream {cfg.sources[s[r]]}{f' (file {f})' if f else ''}: row "
                             f"{int(o2[r])} has a sign other than +1 or -1 (NULL, a fraction "
                             f"or another number); the sign column {cfg.sign!r} holds +1 "
                             "or -1")

    def _packet(self, batch, s, t, idx, end, maxima, o1, o2):
        import pyarrow as pa
        cfg = self.cfg
        if len(idx) == 0:
            return (end, maxima, [], [], None, [], [], [])
        sub = batch.take(pa.array(idx))
        ss = s[idx]
        streams, tss, signs, k1, k2, rows = [], [], [], [], [], []
        for i in np.unique(ss).tolist():
            sel = np.flatnonzero(ss == i)
            at = idx[sel]
            part = sub.take(pa.array(sel)) if len(sel) != len(idx) else sub
            cols = [part.column(c).to_pylist() for c in cfg.stream_columns[i]]
            rows.extend(zip(*cols) if cols else [()] * len(sel))
            streams.extend([i] * len(sel))
            tss.extend(t[at].tolist())
            if cfg.signed:
                signs.extend(part.column("_sg").to_pylist())
            k1.extend(o1[j] for j in at.tolist())
            k2.extend(o2[at].tolist())
        return (end, maxima, streams, tss, signs if cfg.signed else None, k1, k2, rows)




class ColumnarSplit(_Split):
    """The split of one query, as ``mapInArrow`` (module docstring): rows go, as Arrow IPC
    batches, to the groups the shares (``cfg.plan``) give them; every group gets a
    punctuation row per input batch."""

    def __call__(self, batches):
        import pyarrow as pa
        cfg = self.cfg
        plan = cfg.plan
        keys = cfg.keys
        offsets = [plan.offsets(a) for a in cfg.aliases]
        strides = plan.strides
        for batch, s, end, o1, o2, t, maxima in self._prepared(batches):
            out_g, out_s, out_p = [], [], []
            punct = json.dumps({"end": end, "maxima": maxima,
                                "cleanup": bool((s == CLEANUP).any())}).encode()
            for g in range(cfg.groups):
                out_g.append(keys[g])
                out_s.append(PUNCT)
                out_p.append(punct)
            for i, _, _ in maxima:
                sel = np.flatnonzero(s == i)
                groups, rows, primary = self._route(batch, i, sel, offsets[i], strides)
                part = self._part(batch, i, sel, t, o1, o2)
                if cfg.groups == 1:
                    out_g.append(keys[0])
                    out_s.append(i)
                    out_p.append(_ipc(part.append_column("_pr", pa.array(primary))))
                    continue
                order = np.argsort(groups, kind="stable")
                groups, rows, primary = groups[order], rows[order], primary[order]
                cuts = np.flatnonzero(np.diff(groups)) + 1
                for lo, hi in zip(np.r_[0, cuts], np.r_[cuts, len(groups)], strict=True):
                    sub = part.take(pa.array(rows[lo:hi]))
                    out_g.append(keys[int(groups[lo])])
                    out_s.append(i)
                    out_p.append(_ipc(sub.append_column("_pr", pa.array(primary[lo:hi]))))
            yield pa.RecordBatch.from_arrays(
                [pa.array(out_g, pa.int32()), pa.array(out_s, pa.int32()),
                 pa.array(out_p, pa.binary())], ["_g", "_s", "_p"])
        freeze_imports()  # the worker's imports are done (spark_daemon.freeze_imports)

    def _route(self, batch, i: int, sel: np.ndarray, offs: np.ndarray, strides):
        """(group, row index within ``sel``, primary) of every replica of stream i's rows:
        the cell of the row's hash coordinates plus each replication offset; a row with a
        NULL key goes to one group only."""
        cfg = self.cfg
        n = len(sel)
        base = np.zeros(n, np.int64)
        null = np.zeros(n, bool)
        for c, _ in cfg.plan.keys.get(cfg.aliases[i], ()):
            h = batch.column(f"_h{c}").take(sel).to_numpy(zero_copy_only=False)
            h = np.asarray(h, np.int64)
            null |= h < 0
            base += np.maximum(h, 0) * strides[c]
        m = len(offs)
        if m == 1:
            return base, np.arange(n), np.ones(n, bool)
        keep = np.flatnonzero(~null)
        groups = (base[keep, None] + offs[None, :]).ravel()
        rows = np.repeat(keep, m)
        primary = np.tile(np.arange(m) == 0, len(keep))
        if null.any():
            lone = np.flatnonzero(null)
            groups = np.concatenate([groups, base[lone]])
            rows = np.concatenate([rows, lone])
            primary = np.concatenate([primary, np.ones(len(lone), bool)])
        return groups, rows, primary

    def _part(self, batch, i: int, sel: np.ndarray, t: np.ndarray, o1: list, o2: np.ndarray):
        """Stream i's rows of the batch in the group layout (``spark_group.read_part``)."""
        import pyarrow as pa
        cfg = self.cfg
        sub = batch.take(pa.array(sel))
        cols = [pa.array(t[sel], pa.int64()), o1.take(sel), pa.array(o2[sel], pa.int64())]
        names = ["_t", "_o1", "_o2"]
        if cfg.signed:
            cols.append(sub.column("_sg"))
            names.append("_sg")
        for c in cfg.stream_columns[i]:
            cols.append(sub.column(c))
            names.append(c)
        return pa.Table.from_arrays(cols, names)


def _ipc(table) -> bytes:
    import pyarrow as pa
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()
