"""A SparkSession configured for adaptcq's Spark runtime (ARCHITECTURE.md "The Spark pipeline").

``get_spark`` checks for Java and the master URL before starting the JVM, so a missing
runtime or a bad ``--master`` gives one clear message instead of a py4j stack trace (and a
failure to start is one line too), and sets what the runtime depends on:

- the RocksDB state store provider, which ``transformWithStateInPandas`` requires (each
  partition group's engine state lives there, state-spill.txt §2.1);
- ``spark.pyspark.python`` = this interpreter, so the Python workers import the same
  adaptcq (an editable install is only visible to this interpreter);
- few shuffle partitions (the partition groups are the unit of parallelism; Spark's default
  of 200 shuffle partitions would mostly run empty tasks), no UI, quiet logs, UTC session time
  (timestamps become epoch seconds exactly as the local runtime computes them).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys

from adaptcq.errors import AdaptcqError, JavaMissingError

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"

JAVA_FIX = ("install Java 17 (e.g. `apt-get install openjdk-17-jre-headless`, or "
            "`brew install openjdk@17`) or set JAVA_HOME to a Java 17+ installation")


def find_java() -> str:
    """The java executable Spark will use: ``$JAVA_HOME/bin/java`` when JAVA_HOME is set
    (that is what spark-submit runs), else ``java`` on PATH. Raises JavaMissingError, naming
    the fix, when there is none or it does not run."""
    home = os.environ.get("JAVA_HOME")
    if home:
        java = os.path.join(home, "bin", "java")
        if not os.access(java, os.X_OK):
            raise JavaMissingError(f"JAVA_HOME is {home!r} but {java} does not exist or is not "
                                   f"executable; the Spark runtime needs Java: {JAVA_FIX}")
    else:
        java = shutil.which("java")
        if java is None:
            raise JavaMissingError("the Spark runtime needs a Java runtime and none was found "
                                   f"(no `java` on PATH, JAVA_HOME not set): {JAVA_FIX}")
    try:
        proc = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise JavaMissingError(f"cannot run {java} -version ({e}); {JAVA_FIX}") from None
    if proc.returncode != 0:
        raise JavaMissingError(f"{java} -version failed: {proc.stderr.strip()[:200]}; {JAVA_FIX}")
    _VERSION_TEXT[java] = proc.stderr + proc.stdout
    return java


_VERSION_TEXT: dict[str, str] = {}  # java -> its last ``-version`` output (check_java)


def java_version_text(java: str) -> str:
    """``java -version``'s output for ``java``, as ``find_java`` last read it."""
    if java not in _VERSION_TEXT:
        find_java()
    return _VERSION_TEXT.get(java, "")


def java_major(version_text: str) -> int | None:
    """The major version in ``java -version`` output ('1.8.0_392' -> 8, '17.0.15' -> 17)."""
    import re
    m = re.search(r'version "(\d+)(?:\.(\d+))?', version_text)
    if not m:
        return None
    major = int(m.group(1))
    return int(m.group(2) or 0) if major == 1 else major


def check_java() -> str:
    """``find_java`` plus a version check: Spark 4 needs Java 17 or newer."""
    java = find_java()  # (runs ``java -version`` once: its output is kept)
    major = java_major(_VERSION_TEXT.get(java, ""))
    if major is not None and major < 17:
        raise JavaMissingError(f"{java} is Java {major}; Spark 4 needs Java 17 or newer: "
                               f"{JAVA_FIX}")
    return java


class SparkStartError(AdaptcqError):
    """Spark could not start (a bad master URL, a cluster that cannot be reached, ...)."""


_MASTER = re.compile(r"local(\[(\d+|\*)(,\s*\d+)?\])?|local-cluster\[\d+,\s*\d+,\s*\d+\]"
                     r"|(spark|k8s|mesos)://\S+|yarn")


def check_master(master) -> str:
    """A Spark master URL (``local``, ``local[N]``, ``local[*]``, ``local[N,F]``,
    ``spark://HOST:PORT``, ``yarn``, ``k8s://...``); anything else is refused before a JVM
    starts (Spark's own refusal is a stack trace)."""
    if not isinstance(master, str) or not _MASTER.fullmatch(master.strip()):
        raise SparkStartError(f"--master {master!r} is not a Spark master URL; use local, "
                              "local[N], local[*], spark://HOST:PORT, yarn or k8s://HOST:PORT")
    return master.strip()


def default_conf(master: str) -> dict[str, str]:
    cores = local_cores(master)
    return {
        "spark.sql.streaming.stateStore.providerClass": ROCKSDB,
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
        # One shuffle partition per core: partition groups are hashed onto these.
        "spark.sql.shuffle.partitions": str(cores),
        "spark.default.parallelism": str(cores),
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        # transformWithStateInPandas exchanges Arrow batches with the Python worker, plus
        # Arrow for toPandas/createDataFrame. The split (mapInArrow) gets 100,000 rows per
        # Arrow batch, not Spark's 10,000: its per-batch work (one IPC part per group and
        # stream) is then amortized over ten times the rows (bench.spark_vs_native case d:
        # 43.2 s -> 40.8 s).
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.execution.arrow.maxRecordsPerBatch": "100000",
        # No byte limit on those batches (Int.MaxValue turns the check off): with one,
        # Spark measures the Arrow batch's size after every row it writes, walking every
        # column vector (JFR on bench.spark_vs_native case d: a quarter of the executor
        # threads' samples; their CPU 10.7 -> 7.4 s). The row limit above bounds a batch.
        "spark.sql.execution.arrow.maxBytesPerBatch": "2147483647",
        "spark.sql.execution.pythonUDF.arrow.enabled": "false",
        "spark.python.worker.reuse": "true",
        # The workers' daemon imports pyspark from its installed package (compiled
        # bytecode), not from Spark's zip, when the versions agree (runtime.spark_daemon).
        "spark.python.daemon.module": "adaptcq.runtime.spark_daemon",
        # One daemon, one pool of Python workers for the split and the groups. Spark keeps a
        # daemon per worker environment, and its SQL UDF runner (the split's mapInArrow)
        # adds SPARK_SIMPLIFIED_TRACEBACK=1 where transformWithStateInPandas' runner does
        # not: two daemons, and the groups' first tasks forked workers that imported
        # pyarrow and adaptcq again (docs/spark.md, "Start-up"). Python errors keep their
        # whole traceback; ``spark.spark_error`` reads the raised error from it either way.
        "spark.sql.execution.pyspark.udf.simplifiedTraceback.enabled": "false",
        "spark.sql.streaming.noDataMicroBatches.enabled": "false",
        "spark.driver.memory": "4g",
    }


def local_cores(master: str) -> int:
    """The cores of a local master (``local[4]``: 4); this machine's for any other."""
    m = re.fullmatch(r"local\[(\d+|\*)(?:,\s*\d+)?\]", master.strip())
    if master.strip() == "local":
        return 1
    if m and m.group(1) != "*":
        return max(1, int(m.group(1)))
    return max(1, os.cpu_count() or 1)


def get_spark(master: str = "local[*]", app: str = "adaptcq", *, jvm_archive: bool = True,
              **conf):
    """A SparkSession for the adaptcq runtime (reuses an active one, adding ``conf``).

    ``conf`` keys may use underscores for dots (``spark_sql_shuffle_partitions=4``) or be
    given as a ``{"spark.x": ...}`` mapping through ``**{"spark.x": ...}``. Raises
    ``JavaMissingError`` naming the fix when no Java 17+ runtime is found. A new driver JVM
    maps the class-data archive of ``runtime.jvm_archive`` when there is one for this Java
    and pyspark (``adaptcq spark-archive`` builds it; ``jvm_archive=False`` or
    ``ADAPTCQ_JVM_ARCHIVE=off`` do without): only its start-up is faster.
    """
    master = check_master(master)
    java = check_java()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    settings = default_conf(master)
    for k, v in conf.items():
        settings[k if "." in k else k.replace("_", ".")] = str(v)
    if jvm_archive and SparkContext._active_spark_context is None:  # a JVM will start
        from adaptcq.runtime.jvm_archive import driver_options
        opts = driver_options(settings, java, java_version_text(java))
        if opts is not None:
            settings["spark.driver.extraJavaOptions"] = opts
    builder = SparkSession.builder.master(master).appName(app)
    for k, v in settings.items():
        builder = builder.config(k, v)
    try:
        spark = builder.getOrCreate()
    except Exception as e:  # noqa: BLE001 - py4j/JVM errors: one line, not a stack trace
        text = str(getattr(e, "desc", None) or e).strip()
        line = next((x.strip() for x in text.splitlines() if x.strip()), type(e).__name__)
        raise SparkStartError(f"cannot start Spark with master {master!r}: {line}") from None
    spark.sparkContext.setLogLevel("ERROR")
    # getOrCreate returns an existing session unchanged for static settings; the runtime's
    # SQL settings can still be applied to it.
    for k in ("spark.sql.streaming.stateStore.providerClass", "spark.sql.session.timeZone",
              "spark.sql.shuffle.partitions"):
        with contextlib.suppress(Exception):  # a static conf of a running session stays
            spark.conf.set(k, settings[k])
    return spark
