"""Window operators: append-only streams to update streams ΔR (a-caching.txt §3.1, §7.1).

Each arrival is an insertion into its stream's window; each tuple leaving a window is a
deletion. STREAM's window operator [1] defines when tuples leave:

- ``[RANGE w]`` (time): a tuple with timestamp t is in the window at time tau when
  ``tau - w <= t <= tau`` (both ends inclusive). It leaves when time passes ``t + w``: the
  deletion is processed just before the first update whose timestamp is greater than
  ``t + w`` (or when a driver advances time past it), and carries timestamp ``t + w``.
  Deletions due at the same instant are processed in arrival order.
- ``[ROWS n]`` (count): the n most recent rows of the stream, counted before the stream's
  selection (CQL applies the window first). The arrival of row k + n deletes row k, just
  before row k + n is inserted; the deletion carries the new row's timestamp.
- unbounded: nothing leaves; explicit deletions in the input (a sign column) delete one
  earlier row with equal values.
"""

from __future__ import annotations

import heapq
from collections import deque


class ExpiryClock:
    """Pending time-window deletions of all streams, ordered by (t + w, arrival order).
    ``ContinuousQuery.process`` pushes (t + w, arrival, stream, row id) onto ``heap``
    itself: that push is on the hot path."""

    __slots__ = ("heap",)

    def __init__(self):
        self.heap: list[tuple[float, int, int, int]] = []

    def due(self, now: float):
        """Pop, in order, every pending deletion with ``t + w < now``."""
        heap = self.heap
        while heap and heap[0][0] < now:
            yield heapq.heappop(heap)

    def __len__(self) -> int:
        return len(self.heap)


class CountWindow:
    """``[ROWS n]``: row ids of the last n rows (None for rows the selection dropped)."""

    __slots__ = ("n", "rids")

    def __init__(self, n: int):
        self.n = n
        self.rids: deque = deque()

    def admit(self, rid: int | None) -> int | None | bool:
        """Add a row; return the row id it pushes out, None if that row was filtered,
        False if nothing leaves."""
        rids = self.rids
        rids.append(rid)
        if len(rids) > self.n:
            return rids.popleft()
        return False
