"""Shared fixtures.

``spark``: one local[2] SparkSession for the whole test run, started lazily by the first
test that asks for it (tests that do not use Spark never start a JVM), and skipped, not
failed, when no Java runtime is installed (the missing-Java message has its own test).

Hypothesis profiles (docs/testing.md):

- ``ci``, loaded for every run: derandomized (each test draws the same examples on every
  run and machine), no example database (no ``.hypothesis`` folder is read or written), no
  deadline and no timing health check (a loaded machine must not fail a test), and the
  reproduction blob printed on failure.
- ``fuzz`` (``python -m pytest --hypothesis-profile=fuzz``): randomized, with an example
  database under ``.hypothesis/`` (failures found are replayed first next time), and
  ``FUZZ_FACTOR`` (env ``ADAPTCQ_FUZZ_FACTOR``, default 100) times the examples.

Property tests give their example counts through :func:`examples`, relative to the profile:
``@settings(max_examples=examples(150))`` is 150 examples under ``ci`` and 150 × the factor
under ``fuzz`` (a per-test ``max_examples`` would otherwise override the profile's).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.database import DirectoryBasedExampleDatabase

BASE_EXAMPLES = 100  # hypothesis's default max_examples: the ``ci`` profile keeps it
FUZZ_FACTOR = int(os.environ.get("ADAPTCQ_FUZZ_FACTOR", "100"))

settings.register_profile(
    "ci", derandomize=True, database=None, deadline=None, print_blob=True,
    max_examples=BASE_EXAMPLES, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile(
    "fuzz", derandomize=False, deadline=None, print_blob=True,
    database=DirectoryBasedExampleDatabase(
        str(Path(__file__).resolve().parent.parent / ".hypothesis" / "examples")),
    max_examples=BASE_EXAMPLES * FUZZ_FACTOR,
    suppress_health_check=[HealthCheck.too_slow])
# ``--hypothesis-profile NAME`` is loaded by hypothesis's pytest plugin after this file is
# imported; without it, ``ci``. (Test modules are imported later, so the settings they
# create inherit the profile loaded by then.)
if settings.get_current_profile_name() == "default":
    settings.load_profile("ci")


def examples(n: int) -> int:
    """``n`` examples under the ``ci`` profile, scaled by the loaded profile's
    ``max_examples`` (``fuzz``: n × FUZZ_FACTOR)."""
    return max(1, n * settings().max_examples // BASE_EXAMPLES)


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    pytest.importorskip("pyspark")
    from adaptcq.errors import JavaMissingError
    from adaptcq.runtime.spark_session import get_spark

    try:
        session = get_spark("local[2]", "adaptcq-tests",
                            **{"spark.sql.shuffle.partitions": "2",
                               "spark.sql.warehouse.dir": str(tmp_path_factory.mktemp("wh"))})
    except JavaMissingError as e:
        pytest.skip(f"Spark tests need Java: {e}")
    yield session
    session.stop()


def run_to_end(spark, frame, name: str, end_folder):
    """Run a streaming result frame into a memory sink until its input is exhausted, then
    signal the end of input (``end_folder``) and let it finish; its rows as Arrow."""
    from adaptcq.runtime.spark import signal_end
    q = frame.writeStream.format("memory").queryName(name).start()
    try:
        q.processAllAvailable()
        signal_end(end_folder)
        q.processAllAvailable()
    finally:
        q.stop()
    return spark.table(name).toArrow()


def refused(main, argv, capsys, *words) -> str:
    """A benchmark's ``main(argv)`` stops with argparse's exit 2 (before any work), its
    message naming every one of ``words``; returns the message."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    for w in words:
        assert w in err, err
    return err


def read_csv(path) -> list[dict]:
    """A benchmark's CSV output, one dict per row."""
    import csv
    with open(path, newline="") as f:
        return list(csv.DictReader(f))

