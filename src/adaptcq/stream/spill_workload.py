"""The workload of state-spill.txt §6.1: five streams of two columns joined by the plan of
Figure 15, ((A ⋈ B ⋈ C) ⋈ D) ⋈ E, with Join1 on A.x = B.x = C.x, Join2 on C.y = D.x and
Join3 on D.y = E.x; 50 ms between two tuples of a stream.

**Tuple range and join ratio.** "A data value V appears R times for every K input
tuples": each join column is a sequence of blocks of K tuples; in every block each value
v of the column's domain appears exactly R_v times, in random order, so a value's
frequency is R_v / K whatever the block. R_v is the *range join ratio* of v; "different
values (partitions) in each join operator can have different range join ratios", and we
read that literally: a value's ratio is its partition's, R_v = R[v mod P] with P the
operator's 300 partition ids (an integer's partition is its value modulo P: ``stats.
partitions.partition_of``), each R[p] drawn uniformly from {1, ..., 2R̄ − 1} so that the
*average join ratio* of the operator is R̄ (R̄ = 1: every ratio is 1). The two columns of
an operator share one domain and one ratio table.

**K** is not given in the paper; we take K = the tuples of one stream in the whole run
for the paper's unbounded run (each value appears R_v times in all: the join's output
stays proportional to the input, as the paper's figures show), and K = the tuples of one
window for a windowed run (``window`` seconds: each window holds about K tuples of a
stream). Both are recorded in the workload's parameters.
"""

from __future__ import annotations

import numpy as np

from adaptcq.stream.workloads import (
    Workload,
    WorkloadError,
    _check_n_updates,
    _check_seed,
    _table,
)

STREAMS = ("A", "B", "C", "D", "E")
INTERARRIVAL = 0.05   # §6.1: "The average tuple interarrival time is set to be 50 ms"
PARTITIONS = 300      # §6.1: "All input streams are partitioned into 300 partitions"


def _ratios(mean: int, partitions: int, rng: np.random.Generator) -> np.ndarray:
    if mean < 1 or int(mean) != mean:
        raise WorkloadError(f"a join ratio must be a whole number >= 1, got {mean!r}")
    return rng.integers(1, 2 * int(mean), size=partitions)   # uniform on {1..2R-1}


def _column(n: int, k: int, ratios: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """n values in blocks of k: in each block, value v appears ratios[v % P] times (the
    block's last values are cut to make k)."""
    p = len(ratios)
    # The domain: values 0, 1, 2, ... with their ratios, until they fill a block.
    reps = np.tile(ratios, k // int(ratios.sum()) + 1)
    cum = np.cumsum(reps)
    d = int(np.searchsorted(cum, k)) + 1
    block = np.repeat(np.arange(d, dtype=np.int64), reps[:d])[:k]
    assert (block % p == np.arange(d).repeat(reps[:d])[:k] % p).all()
    out = np.empty(n, dtype=np.int64)
    for start in range(0, n, k):
        stop = min(n, start + k)
        out[start:stop] = rng.permutation(block)[:stop - start]
    return out


def spill_five_way(n_updates: int = 300_000, ratios=(3, 1, 1), seed: int = 0,
                   window: float | None = None, tuple_range: int | None = None,
                   partitions: int = PARTITIONS) -> Workload:
    """§6.1's workload: ``n_updates`` arrivals over the five streams (50 ms apart in each),
    average join ratios ``ratios`` of Join1, Join2, Join3 (Figure 16: (3, 1, 1); Figure 19:
    (1, 3, 3); Figure 20: (3, 2, 3)); unbounded windows unless ``window`` (seconds)."""
    if len(ratios) != 3:
        raise WorkloadError(f"ratios: three average join ratios (Join1, Join2, Join3), "
                            f"got {ratios!r}")
    seed = _check_seed(seed)
    per = _check_n_updates(n_updates, len(STREAMS)) // len(STREAMS)
    k = tuple_range or (per if window is None else max(1, round(window / INTERARRIVAL)))
    rng = np.random.default_rng(seed)
    table = [_ratios(r, partitions, rng) for r in ratios]
    ts = np.arange(per, dtype=np.float64) * INTERARRIVAL
    cols = {
        "A": {"x": _column(per, k, table[0], rng), "y": rng.integers(0, 1 << 30, per)},
        "B": {"x": _column(per, k, table[0], rng), "y": rng.integers(0, 1 << 30, per)},
        "C": {"x": _column(per, k, table[0], rng), "y": _column(per, k, table[1], rng)},
        "D": {"x": _column(per, k, table[1], rng), "y": _column(per, k, table[2], rng)},
        "E": {"x": _column(per, k, table[2], rng), "y": rng.integers(0, 1 << 30, per)},
    }
    # Streams take turns within each 50 ms (A first): a shared clock, like the paper's.
    tables = {s: _table(ts + i * INTERARRIVAL / len(STREAMS), **cols[s])
              for i, s in enumerate(STREAMS)}
    win = "" if window is None else f" [RANGE {window:g} SECONDS]"
    sql = ("SELECT A.id AS a, B.id AS b, C.id AS c, D.id AS d, E.id AS e, "
           "A.x AS x1, C.y AS x2, D.y AS x3 "
           f"FROM A{win}, B{win}, C{win}, D{win}, E{win} "
           "WHERE A.x = B.x AND B.x = C.x AND C.y = D.x AND D.y = E.x")
    return Workload("spill", sql, tables, params={
        "n_updates": per * len(STREAMS), "ratios": list(ratios), "seed": seed,
        "window": window, "tuple_range": k, "partitions": partitions,
        "interarrival": INTERARRIVAL, "plan": "(((A, B, C), D), E)"})
