"""adaptcq: an adaptive continuous-query engine for multi-way stream joins.

>>> import adaptcq
>>> result = adaptcq.run(sql, sources={"R": "r.parquet", "S": "s.parquet"}, timestamp="ts")
>>> result.table, result.stats
"""

from adaptcq import stream  # callable: adaptcq.stream(sql, sources, ...) yields result batches
from adaptcq.errors import AdaptcqError, InputError, QueryError

__version__ = "0.1.0"


def run(sql, sources, timestamp="ts", executor="auto", mode="append", **options):
    """Run a continuous query over finite inputs in this process; see
    ``adaptcq.runtime.local.run``. Returns a RunResult (``.table``, ``.stats``,
    ``.rejected``)."""
    from adaptcq.runtime.local import run as _run
    return _run(sql, sources, timestamp=timestamp, executor=executor, mode=mode, **options)


def __getattr__(name):
    # adaptcq.Engine: many queries on one engine (CACQ), imported on first use.
    if name == "Engine":
        from adaptcq.runtime.multi import Engine
        return Engine
    raise AttributeError(f"module 'adaptcq' has no attribute {name!r}")


__all__ = ["AdaptcqError", "Engine", "InputError", "QueryError", "__version__", "run",
           "stream"]
