"""A class-data sharing (CDS) archive for Spark's driver JVM: start-up without loading and
verifying Spark's classes from its jars every time.

A Spark job started from Python spends seconds before its first micro-batch loading the
same few thousand classes from about 280 jars (the session, then Catalyst, the streaming
engine, Parquet, Arrow, the state store). Java 13+ can write the classes a JVM loaded into
an archive when it exits (``-XX:ArchiveClassesAtExit``) and map that archive at the next
start (``-XX:SharedArchiveFile``). Measured on ``bench.spark_vs_native`` case d
(``local[2]``, 2026-11-26): the session started in 3.2 s instead of 4.6 s, and the whole
process ended about 2 s earlier.

- ``build()`` writes the archive by running a small training job in a fresh process: an
  adaptcq query in two partition groups and one of Spark's own stream-stream joins over a
  tiny workload, so that the classes of both are in it (the benchmarks compare the two,
  and both start from the same archive). It takes about half a minute and writes about
  200 MB to the cache folder (``ADAPTCQ_CACHE``, else ``$XDG_CACHE_HOME/adaptcq``, else
  ``~/.cache/adaptcq``): ``adaptcq spark-archive`` runs it.
- ``get_spark`` maps the archive when one exists for this Java, this pyspark and these
  jars (the key hashes the java binary, its version, and the jars' names, sizes and
  modification times; the archive also records the class path, and the JVM itself
  refuses one that does not match, then starts without it). Nothing changes without an
  archive, with ``ADAPTCQ_JVM_ARCHIVE=off``, or when the session adds jars or class path
  (``spark.jars``, ``spark.jars.packages``, ``spark.driver.extraClassPath``).

The archive only changes how fast classes load: never what runs.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

ENV_SWITCH = "ADAPTCQ_JVM_ARCHIVE"  # "off": never map or build one
CLASSPATH_CONF = ("spark.jars", "spark.jars.packages", "spark.driver.extraClassPath")
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"  # the JVM's CDS notes, not ours to print


def cache_dir() -> Path:
    """Where archives live: ``$ADAPTCQ_CACHE``, ``$XDG_CACHE_HOME/adaptcq`` or
    ``~/.cache/adaptcq``."""
    if os.environ.get("ADAPTCQ_CACHE"):
        return Path(os.environ["ADAPTCQ_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "adaptcq"


def _spark_jars() -> list[Path]:
    from pyspark.find_spark_home import _find_spark_home
    return sorted((Path(_find_spark_home()) / "jars").glob("*.jar"))


def archive_key(java: str, version_text: str, jars: list[Path] | None = None) -> str:
    """What an archive is valid for: the java binary and its version, and the jars (names,
    sizes, modification times) of this pyspark."""
    import pyspark
    h = hashlib.sha256()
    h.update(os.path.realpath(java).encode())
    h.update(version_text.encode())
    h.update(pyspark.__version__.encode())
    for j in _spark_jars() if jars is None else jars:
        st = j.stat()
        h.update(f"{j}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


def archive_path(java: str, version_text: str) -> Path:
    import pyspark
    return cache_dir() / "jvm" / f"spark-{pyspark.__version__}-{archive_key(java, version_text)}.jsa"


def usable(conf: Mapping[str, str]) -> bool:
    """Whether a session with these settings may map an archive: not switched off, and no
    jars or class path added (the archive holds the classes of Spark's own jars)."""
    if os.environ.get(ENV_SWITCH, "").strip().lower() in ("off", "0", "false", "no"):
        return False
    return not any(conf.get(k) for k in CLASSPATH_CONF)


def driver_options(conf: Mapping[str, str], java: str, version_text: str) -> str | None:
    """``spark.driver.extraJavaOptions`` for a session with ``conf``: the options given,
    plus the archive's when one exists and may be used; None when nothing changes."""
    if not usable(conf):
        return None
    path = archive_path(java, version_text)
    if not path.is_file():
        return None
    flag = f"-XX:SharedArchiveFile={path}"
    if any(c.isspace() for c in str(path)):
        flag = f'"{flag}"'  # (Spark splits extraJavaOptions like a shell)
    given = conf.get("spark.driver.extraJavaOptions", "").strip()
    return " ".join(x for x in (given, flag, QUIET) if x)


def build(master: str = "local[2]", force: bool = False, timeout: float = 600.0,
          log=None) -> Path:
    """Write the archive for this Java and pyspark (module docstring): a training job in
    a fresh process, its JVM dumping the classes it loaded when it exits; the file is
    renamed into place once that JVM has exited. Returns its path. Raises
    ``JvmArchiveError`` with the training job's last lines when it fails."""
    from adaptcq.runtime.spark_session import check_java, java_version_text
    java = check_java()
    path = archive_path(java, java_version_text(java))
    if path.is_file() and not force:
        return path
    if not usable({}):
        raise JvmArchiveError(f"{ENV_SWITCH} is {os.environ.get(ENV_SWITCH)!r}: "
                              "no archive is built")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise JvmArchiveError(f"cannot create {path.parent} ({e.strerror}); set "
                              "ADAPTCQ_CACHE to a writable folder") from None
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp")
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-m", "adaptcq.runtime.jvm_archive", str(tmp),
                               master], capture_output=True, text=True, timeout=timeout,
                              check=False)
        if proc.returncode != 0 or not tmp.is_file() or tmp.stat().st_size == 0:
            tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
            raise JvmArchiveError(f"the training job did not write an archive (exit "
                                  f"{proc.returncode}): {tail}")
        os.replace(tmp, path)
    except subprocess.TimeoutExpired:
        raise JvmArchiveError(f"the training job took over {timeout:.0f} s") from None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()
    if log is not None:
        log(f"JVM class-data archive: {path} ({path.stat().st_size / 2**20:.0f} MiB, "
            f"built in {time.perf_counter() - t0:.0f} s)")
    return path


def remove() -> list[Path]:
    """Delete every archive in the cache folder; returns what was deleted."""
    gone = []
    for p in sorted((cache_dir() / "jvm").glob("*.jsa")):
        with contextlib.suppress(OSError):
            p.unlink()
            gone.append(p)
    return gone


class JvmArchiveError(RuntimeError):
    pass


def _train(tmp: str, master: str) -> None:
    """The training job, in its own process: Spark with ``-XX:ArchiveClassesAtExit``, an
    adaptcq query and a Spark stream-stream join over a tiny workload, then the JVM is
    ended and waited for (it writes the archive as it exits)."""
    import tempfile

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from adaptcq.runtime.spark import run_files
    from adaptcq.runtime.spark_session import get_spark

    spark = get_spark(master, "adaptcq-jvm-archive", jvm_archive=False, **{
        "spark.driver.extraJavaOptions": f"-XX:ArchiveClassesAtExit={tmp} {QUIET}"})
    gateway = spark.sparkContext._gateway
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(prefix="adaptcq-jvm-archive-") as d:
        root = Path(d)
        for s in "RST":
            (root / s).mkdir()
            for k in range(2):  # two files: two micro-batches
                n = 200
                ts = np.sort(rng.uniform(10.0 * k, 10.0 * (k + 1), n))
                t = pa.table({"ts": ts, "id": np.arange(n) + n * k,
                              "a": rng.integers(0, 20, n), "b": rng.integers(0, 20, n)})
                p = root / s / f"part-{k}.parquet"
                pq.write_table(t, p)
                os.utime(p, (1_600_000_000 + k, 1_600_000_000 + k))
        srcs = {s: str(root / s) for s in "RST"}
        run_files(spark, "SELECT R.id AS r, S.id AS s, T.id AS t FROM R [RANGE 2 SECONDS], "
                  "S [RANGE 2 SECONDS], T [RANGE 2 SECONDS] WHERE R.a = S.a AND S.b = T.b",
                  srcs, str(root / "ck"), str(root / "out"), partitions=2,
                  max_files_per_trigger=1)
        _native_join(spark, srcs, root)
    spark.stop()
    gateway.shutdown()
    proc = gateway.proc  # the JVM (spark-submit execs it): end it, wait for its dump
    proc.stdin.close()
    proc.wait(timeout=300)


def _native_join(spark, srcs: dict, root: Path) -> None:
    """Spark's own stream-stream join (what ``bench.spark_vs_native`` compares with)."""
    from pyspark.sql import functions as F
    schema = spark.read.parquet(srcs["R"]).schema

    def side(name):
        df = spark.readStream.schema(schema).parquet(srcs[name])
        return (df.select(F.timestamp_seconds(F.col("ts") + 1e9).alias(f"{name}_et"),
                          F.col("a").alias(f"{name}_a"))
                .withWatermark(f"{name}_et", "0 seconds"))
    r, s = side("R"), side("S")
    j = r.join(s, F.expr("R_a = S_a AND S_et BETWEEN R_et - INTERVAL 2 SECONDS "
                         "AND R_et + INTERVAL 2 SECONDS"))
    q = (j.writeStream.format("parquet").option("path", str(root / "native"))
         .option("checkpointLocation", str(root / "native_ck"))
         .trigger(availableNow=True).start())
    q.awaitTermination()


if __name__ == "__main__":
    _train(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "local[2]")
