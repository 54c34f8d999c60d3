"""SteM: the state of one stream (cacq.txt §3.3; a-caching.txt §3.1's relation R_i).

A SteM holds the current window contents of one stream as rows under a row id, and hash
indexes on the column sets that joins probe. Every executor builds on SteMs; join
subresults and caches hold references to these row objects, never copies.

A row is its *source's* row (the columns any alias of the source needs, in the order of
``LogicalQuery.columns``), so one layout serves every alias and, later, every query. Each
row carries its time: its row id is its **arrival sequence number** (the global sequence of
arrivals, ``ContinuousQuery.next_rid``) and ``times[rid]`` its **event time**. Side arrays
rather than two more fields: measured on insert + expiry of 100K rows with one index, the
side dict costs +17% of the SteM's own time, two appended fields +31% (a new tuple per
row), and side arrays leave every column position unchanged.

An index on columns (c1, ..., ck) maps a key to a bucket ``{rid: row}``. The key is the
bare value for one column and a tuple for several. Rows with a NULL in any key column are
left out of that index: NULL never joins.
"""

from __future__ import annotations

import sys

from adaptcq.engine.codegen import exec_source
from adaptcq.engine.rules import key_function

Index = dict  # key -> {rid: row}


class SteM:
    """Window contents of one stream with hash indexes.

    ``rows`` maps rid -> row for every tuple now in the window (that passed the stream's
    selection), ``times`` rid -> its event time. ``index(positions)`` returns (creating on demand, built from the current
    contents) the hash index on those column positions.
    """

    __slots__ = ("_indexes", "columns", "delete", "insert", "listeners", "name", "rows",
                 "times")

    def __init__(self, name: str, columns: tuple[str, ...]):
        self.name = name
        self.columns = columns
        self.rows: dict[int, tuple] = {}
        self.times: dict[int, object] = {}
        self.listeners: list = []  # called after insert/delete are recompiled
        self._indexes: dict[tuple[int, ...], Index] = {}
        self._compile()

    # ----- indexes ---------------------------------------------------------------------
    def index(self, positions: tuple[int, ...]) -> Index:
        idx = self._indexes.get(positions)
        if idx is None:
            idx = {}
            keyfn = key_function(positions)
            for rid, row in self.rows.items():
                k = keyfn(row)
                if k is not None:
                    b = idx.get(k)
                    if b is None:
                        idx[k] = {rid: row}
                    else:
                        b[rid] = row
            self._indexes[positions] = idx
            self._compile()
        return idx

    def drop_index(self, positions: tuple[int, ...]) -> None:
        if self._indexes.pop(positions, None) is not None:
            self._compile()

    @property
    def indexed(self) -> tuple[tuple[int, ...], ...]:
        return tuple(self._indexes)

    # ----- updates ---------------------------------------------------------------------
    # ``insert(rid, row, ts)`` and ``delete(rid, ts=None) -> row`` are compiled for the
    # current index set (straight-line code, one block per index): they are the hottest
    # code in every executor. They are instance attributes, replaced whenever an index is
    # added or dropped; ``listeners`` are then called (an executor that calls ``delete``
    # directly from its update loop re-binds it). ``ts`` is unused by ``delete``: it lets
    # the function stand for an executor's whole deletion when that is all there is.
    def _compile(self) -> None:
        ins = ["def insert(rid, row, ts):", "    rows[rid] = row", "    times[rid] = ts"]
        dele = ["def delete(rid, ts=None):", "    row = rows.pop(rid)", "    del times[rid]"]
        ns: dict = {"rows": self.rows, "times": self.times}
        for n, (positions, idx) in enumerate(self._indexes.items()):
            ns[f"I{n}"] = idx
            if len(positions) == 1:
                key, null = f"row[{positions[0]}]", "k is not None"
            else:
                key = "(" + "".join(f"row[{p}], " for p in positions) + ")"
                null = "None not in k" if positions else "True"
            ins += [f"    k = {key}", f"    if {null}:", f"        b = I{n}.get(k)",
                    "        if b is None:", f"            I{n}[k] = {{rid: row}}",
                    "        else:", "            b[rid] = row"]
            dele += [f"    k = {key}", f"    if {null}:", f"        b = I{n}[k]",
                     "        del b[rid]", "        if not b:", f"            del I{n}[k]"]
        dele.append("    return row")
        ns, _ = exec_source(f"<SteM {self.name}>",
                            "\n".join(ins) + "\n\n" + "\n".join(dele) + "\n", ns)
        self.insert, self.delete = ns["insert"], ns["delete"]
        for fn in self.listeners:
            fn()

    def make_rows_distinct(self) -> None:
        """Replace every row object held under a second row id by a copy (in ``rows`` and
        every index): caches identify rows by object identity (engine.cache)."""
        seen: set[int] = set()
        for rid, row in list(self.rows.items()):
            if id(row) not in seen:
                seen.add(id(row))
                continue
            new = (*row,)
            self.rows[rid] = new
            for positions, idx in self._indexes.items():
                k = key_function(positions)(row)
                if k is not None:
                    idx[k][rid] = new

    def __len__(self) -> int:
        return len(self.rows)

    # ----- size ------------------------------------------------------------------------
    def size_bytes(self, sample: int = 64) -> int:
        """Honest estimate of the memory this SteM holds: the row dict and the index
        dicts measured exactly, rows and buckets estimated from a sample of ``sample``."""
        n = len(self.rows)
        total = sys.getsizeof(self.rows)
        if n:
            it = iter(self.rows.values())
            rows = [next(it) for _ in range(min(sample, n))]
            per_row = sum(sys.getsizeof(r) + sum(sys.getsizeof(v) for v in r) for r in rows)
            total += per_row * n // len(rows)
        for idx in self._indexes.values():
            total += sys.getsizeof(idx)
            if idx:
                it = iter(idx.values())
                buckets = [next(it) for _ in range(min(sample, len(idx)))]
                total += sum(sys.getsizeof(b) for b in buckets) * len(idx) // len(buckets)
        return total


class ScanIndex:
    """A nested-loop "index": the same ``get(key)`` as a hash index, answered by scanning
    the SteM's window, so a join into this stream costs time proportional to its window
    (a-caching.txt §7.2, Figure 10: the hash index on S.B dropped)."""

    __slots__ = ("keyfn", "stem")

    def __init__(self, stem: SteM, positions: tuple[int, ...]):
        self.stem = stem
        self.keyfn = key_function(positions)

    def get(self, key):
        if key is None:
            return None
        keyfn = self.keyfn
        found = {rid: row for rid, row in self.stem.rows.items() if keyfn(row) == key}
        return found or None
