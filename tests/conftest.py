"""Shared fixtures.

``spark``: one local[2] SparkSession for the whole test run, started lazily by the first
test that asks for it (tests that do not use Spark never start a JVM), and skipped, not
failed, when no Java runtime is installed (the missing-Java message has its own test).
"""

from __future__ import annotations

import pytest


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
