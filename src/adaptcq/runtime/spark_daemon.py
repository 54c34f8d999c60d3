"""pyspark's worker daemon, importing pyspark from its installed package, not from Spark's zip.

Spark starts Python workers through ``python -m pyspark.daemon pyspark.worker`` with
``$SPARK_HOME/python/lib/pyspark.zip`` and ``py4j-*-src.zip`` first on ``PYTHONPATH``.
Python's zip importer keeps no compiled bytecode, so every worker the daemon forks compiles
each pyspark (and py4j) module it imports from source (pandas and pyarrow are imported after
the fork, by design: they start threads), and every task's ``importlib.invalidate_caches()``
re-reads the zip's directory. With a pip-installed pyspark the same files are installed with
their ``.pyc`` caches: ``get_spark`` runs the daemon through this module
(``spark.python.daemon.module``), which drops the zips from ``sys.path`` when the installed
pyspark and py4j are the same versions as the zipped ones, and then runs pyspark's daemon
unchanged. Where they differ or are not installed (a cluster whose workers only have Spark's
zips) nothing changes. Profiled on ``bench.spark_vs_native`` case c (py-spy, 2026-11-25):
zip imports took about 3.6 of the workers' 25 CPU-seconds.

``freeze_imports`` is for the workers themselves: pyspark's daemon runs a full
``gc.collect()`` after every task of a reused worker, and that walks every object the
worker's imports made (pandas, pyarrow, pyspark, adaptcq: about 90,000 of them).
"""

from __future__ import annotations

import gc
import os
import re
import sys
import zipfile

_FROZEN = False


def freeze_imports() -> None:
    """Move what this process holds now into the collector's permanent generation, once per
    process. Called by the split and the partition groups at their first task in a worker,
    when the imports are done: pyspark's daemon calls ``gc.collect()`` after every task of a
    reused worker (pyspark/daemon.py), which otherwise walks all the modules' objects each
    time (measured with py-spy on ``bench.spark_vs_native`` case b: 30-80 ms a task, about
    5 of the workers' 15 CPU-seconds). Objects frozen here are never collected as cycles;
    they are the modules, classes and functions that live as long as the worker anyway, plus
    the first task's few objects: a bounded, one-off cost."""
    global _FROZEN
    if not _FROZEN:
        _FROZEN = True
        gc.freeze()


def _version(text: str) -> str | None:
    m = re.search(r"""__version__[^=]*=\s*['"]([^'"]+)['"]""", text)
    return m.group(1) if m else None


def _installed_version(package: str, entries: list[str]) -> str | None:
    for p in entries:
        f = os.path.join(p, package, "version.py")
        if os.path.isfile(f):
            with open(f, encoding="utf-8") as fh:
                return _version(fh.read())
    return None


def _zipped_version(path: str, package: str) -> str | None:
    try:
        with zipfile.ZipFile(path) as z:
            return _version(z.read(f"{package}/version.py").decode("utf-8"))
    except (OSError, KeyError, zipfile.BadZipFile, UnicodeDecodeError):
        return None


def prefer_installed(path: list[str]) -> list[str]:
    """``path`` without Spark's ``pyspark.zip`` and ``py4j-*-src.zip`` entries whose
    package is installed, at the same version, on another entry of ``path``."""
    plain = [p for p in path if not p.endswith(".zip")]
    out = []
    for p in path:
        name = os.path.basename(p)
        package = ("pyspark" if name == "pyspark.zip" else
                   "py4j" if name.startswith("py4j-") and name.endswith("-src.zip") else None)
        if package is not None:
            zipped = _zipped_version(p, package)
            if zipped is not None and zipped == _installed_version(package, plain):
                continue
        out.append(p)
    return out


def main() -> None:
    kept = prefer_installed(sys.path)
    for p in set(sys.path) - set(kept):
        sys.path_importer_cache.pop(p, None)
    sys.path[:] = kept
    from pyspark import daemon
    daemon.manager()


if __name__ == "__main__":
    main()
