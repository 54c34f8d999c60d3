"""Per-partition-group statistics of an operator tree (state-spill.txt §3.2), kept per
(operator, partition id) across generations: a group spilled and refilled keeps its history.

* ``local[op][pid]`` — P_output of the *local output* strategy (§3.2.1): results the
  operator produced from that group.
* ``output[op][pid]`` — P_output of the *global output* strategies (§3.2.2): final results
  of the query that the group took part in, found by tracing a random sample of the final
  results down the tree (Algorithm 1: apply each operator's partition function to the
  result's join columns), each sampled result weighted 1/p so the counts stay unbiased.
* ``inter[op][pid]`` — P_inter of the *global output with penalty* strategy (§3.2.3), in
  bytes: subresults stored downstream that the group took part in, traced the same way
  from every sampled subresult and weighted by its model size (§2.2) over p.

P_size is not kept here: it is the group's current memory size, which the executor knows
(``SpillTree.group_bytes``).
"""

from __future__ import annotations

import datetime
import numbers
import zlib

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from adaptcq.checks import is_int
from adaptcq.errors import OptionError


def partition_of(value, n: int) -> int:
    """The partition id of a join value (state-spill.txt §2.1's split function): a stable
    hash — the same in every process — modulo ``n``. Values that compare equal get one
    partition whatever their types (a join matches them): numbers and durations by Python's
    own hash (equal for 1, 1.0 and Decimal("1.00"), and not randomized per process),
    dates, times and datetimes by their count of days or microseconds (Python's hash of
    these is randomized per process, as a string's is: ``adaptcq cleanup`` and a Spark
    group rebuilt elsewhere gave their values other ids than the run had), strings and
    bytes by CRC-32, anything else by the CRC-32 of its repr."""
    t = type(value)
    if t is int or t is float or t is bool:
        return hash(value) % n
    if t is str:
        return zlib.crc32(value.encode("utf-8", "surrogatepass")) % n
    if t is bytes:
        return zlib.crc32(value) % n
    if isinstance(value, _HASHED):
        return hash(value) % n
    if isinstance(value, _TIMES):
        return hash((_time_count(value),)) % n  # (a tuple mixes: whole hours all % 300 == 0)
    return zlib.crc32(repr(value).encode()) % n


_HASHED = (numbers.Number, datetime.timedelta)
_TIMES = (datetime.date, datetime.time)  # (datetime.datetime is a date)
_EPOCH = datetime.datetime(1970, 1, 1)


def _time_count(value) -> int:
    """A date, time or datetime as an integer that equal values share: microseconds since
    the epoch (an aware datetime at its UTC instant: equal to the naive UTC one, which a
    join never finds equal, but a shared partition is harmless), days for a date,
    microseconds since midnight for a time."""
    if isinstance(value, datetime.datetime):
        if value.utcoffset() is not None:
            value = value.astimezone(datetime.UTC).replace(tzinfo=None)
        return (value - _EPOCH) // datetime.timedelta(microseconds=1)
    if isinstance(value, datetime.date):
        return value.toordinal()
    return ((value.hour * 60 + value.minute) * 60 + value.second) * 1_000_000 \
        + value.microsecond


MAX_PARTITIONS = 1_000_000
"""The most partition ids per operator (``--spill-partitions``): three counters per id and
operator are allocated up front (about 24 MB per operator at the limit; the paper uses 300),
and a spill file stores the id as int32."""


def check_partitions(partitions, name: str = "partitions per operator") -> None:
    """Partition ids per operator: a whole number from 1 to :data:`MAX_PARTITIONS`."""
    if not is_int(partitions) or not 1 <= partitions <= MAX_PARTITIONS:
        raise OptionError(f"{name} must be a whole number from 1 to {MAX_PARTITIONS:,}, got "
                          f"{partitions!r}")


class PartitionStatistics:
    """Counters per (operator id, partition id); operators are numbered from 1."""

    __slots__ = ("inter", "local", "output", "partitions")

    def __init__(self, operators: int, partitions: int):
        check_partitions(partitions)
        self.partitions = partitions
        self.local = [[0.0] * partitions for _ in range(operators)]
        self.output = [[0.0] * partitions for _ in range(operators)]
        self.inter = [[0.0] * partitions for _ in range(operators)]

    def local_output(self, op: int, pid: int, n: int) -> None:
        self.local[op - 1][pid] += n

    def trace_output(self, slots, comp: tuple, n: int, weight: float) -> None:
        """A sampled final result ``comp`` (records in the root's stream order): +weight to
        P_output of the group it came through in every operator (Algorithm 1)."""
        output = self.output
        for op, idx, col in slots:
            key = comp[idx][2][col]
            if key is not None:
                output[op.id - 1][partition_of(key, n)] += weight

    def trace_inter(self, slots, comp: tuple, n: int, weight: float) -> None:
        """A sampled subresult stored downstream: +weight bytes to P_inter of the group it
        came through in the producing operator and every operator below it (§3.2.3)."""
        inter = self.inter
        for op, idx, col in slots:
            key = comp[idx][2][col]
            if key is not None:
                inter[op.id - 1][partition_of(key, n)] += weight

    def trace_batch(self, kind: str, slots, keys: list, n: int, weight: float) -> None:
        """``trace_output`` (``kind`` "output") or ``trace_inter`` ("inter") of many sampled
        results at once: ``keys`` gives, per slot of ``slots``, their partition values as an
        Arrow array (None: NULL in every one)."""
        counts = self.output if kind == "output" else self.inter
        for (op, _, _), values in zip(slots, keys, strict=True):
            if values is None:
                continue
            values = values.filter(pc.is_valid(values))
            if not len(values):
                continue
            hits = np.bincount(partition_ids(values, n), minlength=n)
            row = counts[op.id - 1]
            for pid in np.flatnonzero(hits).tolist():
                row[pid] += weight * int(hits[pid])

    def get(self, op: int, pid: int) -> dict[str, float]:
        return {"local": self.local[op - 1][pid], "output": self.output[op - 1][pid],
                "inter": self.inter[op - 1][pid]}


HASH_MODULUS = 2**61 - 1  # CPython hashes an int as itself below this (and -1 as -2)


def partition_ids(values, n: int):
    """:func:`partition_of` of every value of an Arrow array (no NULLs) as a numpy array:
    by column for integers within CPython's hash modulus, value by value otherwise."""
    if pa.types.is_integer(values.type) and values.type != pa.uint64() and len(values):
        lo, hi = (v.as_py() for v in pc.min_max(values).values())
        if -HASH_MODULUS < lo and hi < HASH_MODULUS:
            h = values.to_numpy().astype(np.int64)
            h[h == -1] = -2
            return h % n
    return np.array([partition_of(v, n) for v in values.to_pylist()], dtype=np.int64)
