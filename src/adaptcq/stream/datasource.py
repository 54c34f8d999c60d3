"""``spark.readStream.format("adaptcq")``: the papers' synthetic workloads as a Spark source.

A Spark 4 Python data source (``pyspark.sql.datasource``) emitting one stream of a workload of
``adaptcq.stream.workloads`` (a-caching.txt §7's generator): batch reads give the whole stream,
streaming reads emit it in event-time order, ``rowsPerBatch`` rows per micro-batch, with
offsets ``{"row": k}`` so a restarted query continues exactly (generation is deterministic for a
seed, so every worker regenerates the same rows).

Options (all strings, as Spark passes them):

- ``workload``: ``three-way`` (default), ``nway``, ``table2`` or ``default``;
- ``stream``: which stream to emit (default: the workload's first);
- ``n_updates`` (alias ``nUpdates``), ``seed``, and the generator's own parameters: ``r``,
  ``rate``, ``window``, ``domain`` (three-way), ``n``, ``rates`` (comma-separated, or
  ``R:1,S:2``), ``selectivity`` (one σ for every pair; nway), ``point`` (table2);
- ``rowsPerBatch`` (streaming only; default 10000); ``numPartitions`` (default 2).

>>> from adaptcq.stream.datasource import register
>>> register(spark)
>>> r = spark.readStream.format("adaptcq").option("workload", "three-way") \\
...         .option("stream", "R").option("n_updates", 70000).load()
"""

from __future__ import annotations

import functools
import json

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import ReadMaxRows, SupportsTriggerAvailableNow

from adaptcq.errors import AdaptcqError

NAME = "adaptcq"


def register(spark) -> None:
    """Register the ``adaptcq`` format with ``spark`` (``spark.dataSource.register``)."""
    spark.dataSource.register(AdaptcqDataSource)


def _opt(options, *names, default=None):
    """An option by any of its names; Spark hands options over with lower-cased keys."""
    low = {str(k).lower(): v for k, v in options.items()}
    for n in names:
        if n.lower() in low:
            return low[n.lower()]
    return default


def _kwargs(options) -> tuple[str, dict]:
    """Generator name and keyword arguments from the source's options."""
    name = str(_opt(options, "workload", default="three-way")).lower()
    kw: dict = {}
    n = _opt(options, "n_updates", "nUpdates", "nupdates")
    if n is not None:
        kw["n_updates"] = int(n)
    if name != "default":
        for key, cast in (("seed", int), ("rate", float), ("window", float)):
            v = _opt(options, key)
            if v is not None:
                kw[key] = cast(v)
    else:
        v = _opt(options, "seed")
        if v is not None:
            kw["seed"] = int(v)
    if name == "three-way":
        for key, cast in (("r", int), ("domain", int)):
            v = _opt(options, key)
            if v is not None:
                kw[key] = cast(v)
    elif name == "nway":
        v = _opt(options, "n")
        if v is not None:
            kw["n"] = int(v)
        rates = _opt(options, "rates")
        if rates:
            parts = [p.strip() for p in str(rates).split(",")]
            if not all(parts):  # (an empty item was dropped: "1,,2" read as two rates)
                raise ValueError(f"option rates={rates!r}: item {parts.index('') + 1} is "
                                 "empty; give a rate in each comma-separated item")
            if all(":" in p for p in parts):
                kw["rates"] = {k: float(x) for k, x in (p.split(":", 1) for p in parts)}
            else:
                kw["rates"] = [float(p) for p in parts]
        sel = _opt(options, "selectivity")
        if sel is not None:
            kw["selectivity"] = float(sel)
    elif name == "table2":
        v = _opt(options, "point")
        if v is not None:
            kw["name"] = str(v)
    return name, kw


@functools.lru_cache(maxsize=8)
def _workload(key: str):
    """The generated workload for an option set (cached per Python worker)."""
    from adaptcq.stream.workloads import WORKLOADS, nway
    name, kw = json.loads(key)
    if name not in WORKLOADS:
        raise AdaptcqError(f"unknown workload {name!r}; choose one of {', '.join(WORKLOADS)}")
    if name == "nway" and "selectivity" in kw:
        import itertools
        sel = kw.pop("selectivity")
        n = kw.get("n", 4)
        names = list(kw["rates"]) if isinstance(kw.get("rates"), dict) else \
            [f"R{i}" for i in range(1, n + 1)]
        kw["selectivities"] = {frozenset(p): sel for p in itertools.combinations(names, 2)}
        return nway(**kw)
    return WORKLOADS[name](**kw)


def workload_table(options):
    """(stream name, pyarrow Table) that a source with ``options`` emits."""
    name, kw = _kwargs(options)
    wl = _workload(json.dumps([name, kw], sort_keys=True))
    stream = _opt(options, "stream", default=next(iter(wl.tables)))
    if stream not in wl.tables:
        raise AdaptcqError(f"workload {name} has streams {', '.join(wl.tables)}, "
                           f"not {stream!r}")
    return stream, wl.tables[stream]


def _ddl(table) -> str:
    import pyarrow as pa
    kinds = {pa.float64(): "double", pa.int64(): "long", pa.string(): "string"}
    return ", ".join(f"{f.name} {kinds.get(f.type, 'double')}" for f in table.schema)


class _Range(InputPartition):
    def __init__(self, start: int, end: int):
        super().__init__((start, end))
        self.start, self.end = start, end


def _split(start: int, end: int, parts: int) -> list[_Range]:
    if end <= start:
        return []
    parts = max(1, min(parts, end - start))
    step = -(-(end - start) // parts)
    return [_Range(a, min(end, a + step)) for a in range(start, end, step)]


def _read(options, part: _Range):
    _, table = workload_table(options)
    yield from table.slice(part.start, part.end - part.start).to_batches(max_chunksize=65536)


class AdaptcqDataSource(DataSource):
    """The ``adaptcq`` format: one stream of a synthetic workload (a-caching.txt §7)."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return _ddl(workload_table(self.options)[1])

    def reader(self, schema) -> DataSourceReader:
        return _BatchReader(dict(self.options))

    def streamReader(self, schema) -> DataSourceStreamReader:
        return _StreamReader(dict(self.options))


class _BatchReader(DataSourceReader):
    def __init__(self, options: dict):
        self.options = options

    def partitions(self):
        n = workload_table(self.options)[1].num_rows
        return _split(0, n, int(_opt(self.options, "numPartitions", default=2)))

    def read(self, partition):
        return _read(self.options, partition)


class _StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Emits the stream in row order, at most ``rowsPerBatch`` rows per micro-batch."""

    def __init__(self, options: dict):
        self.options = options
        self.total = workload_table(options)[1].num_rows
        self.per_batch = int(_opt(options, "rowsPerBatch", "rows_per_batch", default=10000))

    def initialOffset(self) -> dict:
        return {"row": 0}

    def prepareForTriggerAvailableNow(self) -> None:
        # A generated stream is complete from the start: the target offset is its end, and
        # Trigger.AvailableNow then still reads it rowsPerBatch rows per micro-batch.
        pass

    def getDefaultReadLimit(self):
        return ReadMaxRows(self.per_batch)

    def latestOffset(self, start: dict, limit) -> dict:
        # Spark passes the default limit (rowsPerBatch) for ordinary micro-batches and
        # ReadAllAvailable where a trigger needs everything; both are honoured, as the
        # reader contract requires.
        if isinstance(limit, ReadMaxRows):
            return {"row": min(self.total, int(start["row"]) + int(limit.max_rows))}
        return {"row": self.total}

    def partitions(self, start: dict, end: dict):
        return _split(int(start["row"]), int(end["row"]),
                      int(_opt(self.options, "numPartitions", default=2)))

    def read(self, partition):
        return _read(self.options, partition)

    def commit(self, end: dict) -> None:
        pass
