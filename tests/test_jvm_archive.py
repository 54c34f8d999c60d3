"""The driver JVM's class-data archive (runtime.jvm_archive): when a session maps it, what
its key follows, and a real build whose archive a new Spark JVM maps."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from adaptcq.runtime import jvm_archive as ja


def _jars(tmp_path: Path) -> list[Path]:
    d = tmp_path / "jars"
    d.mkdir()
    out = []
    for name, size in (("a.jar", 10), ("b.jar", 20)):
        p = d / name
        p.write_bytes(b"x" * size)
        out.append(p)
    return out


def test_the_key_follows_the_java_binary_its_version_and_the_jars(tmp_path):
    jars = _jars(tmp_path)
    java = sys.executable  # any existing file stands for the binary
    key = ja.archive_key(java, 'openjdk version "17.0.15"', jars)
    assert key == ja.archive_key(java, 'openjdk version "17.0.15"', list(jars))
    assert key != ja.archive_key(java, 'openjdk version "17.0.16"', jars)
    assert key != ja.archive_key(java, 'openjdk version "17.0.15"', jars[:1])
    jars[1].write_bytes(b"y" * 21)  # a jar replaced by another build
    assert key != ja.archive_key(java, 'openjdk version "17.0.15"', jars)


def test_a_session_maps_the_archive_only_when_it_exists_and_may(tmp_path, monkeypatch):
    monkeypatch.setenv("ADAPTCQ_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(ja.ENV_SWITCH, raising=False)
    java, text = sys.executable, 'openjdk version "17.0.15"'
    assert ja.driver_options({}, java, text) is None  # no archive yet
    path = ja.archive_path(java, text)
    assert path.parent == tmp_path / "cache" / "jvm"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\0")
    opts = ja.driver_options({"spark.driver.extraJavaOptions": "-Dx=1"}, java, text)
    assert opts == f"-Dx=1 -XX:SharedArchiveFile={path} {ja.QUIET}"
    assert ja.driver_options({}, java, text) == f"-XX:SharedArchiveFile={path} {ja.QUIET}"
    for key in ja.CLASSPATH_CONF:  # jars or class path added: not Spark's classes alone
        assert ja.driver_options({key: "/opt/x.jar"}, java, text) is None
    monkeypatch.setenv(ja.ENV_SWITCH, "off")
    assert ja.driver_options({}, java, text) is None
    assert ja.remove() == [path] and not path.exists()


def test_a_path_with_spaces_is_quoted_for_spark(tmp_path, monkeypatch):
    monkeypatch.setenv("ADAPTCQ_CACHE", str(tmp_path / "a cache"))
    monkeypatch.delenv(ja.ENV_SWITCH, raising=False)
    java, text = sys.executable, "v"
    path = ja.archive_path(java, text)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\0")
    assert ja.driver_options({}, java, text).startswith(f'"-XX:SharedArchiveFile={path}" ')


def test_an_unwritable_cache_is_named(tmp_path, monkeypatch, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("ADAPTCQ_CACHE", str(blocker / "cache"))
    monkeypatch.delenv(ja.ENV_SWITCH, raising=False)
    from adaptcq.cli import main
    assert main(["spark-archive"]) == 1
    err = capsys.readouterr().err
    assert "cannot create" in err and "ADAPTCQ_CACHE" in err


def test_the_cli_refuses_remove_with_rebuild(capsys):
    from adaptcq.cli import main
    assert main(["spark-archive", "--remove", "--rebuild"]) == 1
    assert "--remove and --rebuild" in capsys.readouterr().err


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/PID/maps")
def test_a_built_archive_is_mapped_by_the_next_spark_jvm(tmp_path):
    """The real thing: ``adaptcq spark-archive`` trains and writes the archive; a Spark JVM
    started afterwards by ``get_spark`` has it mapped into memory (/proc/PID/maps), and
    with ``jvm_archive=False`` it has not."""
    pytest.importorskip("pyspark")
    from adaptcq.errors import JavaMissingError
    from adaptcq.runtime.spark_session import check_java
    try:
        check_java()
    except JavaMissingError as e:
        pytest.skip(f"needs Java: {e}")
    env = {**os.environ, "ADAPTCQ_CACHE": str(tmp_path / "cache")}
    env.pop(ja.ENV_SWITCH, None)
    built = subprocess.run([sys.executable, "-m", "adaptcq.cli", "spark-archive", "--master",
                            "local[1]"], env=env, capture_output=True, text=True, timeout=600,
                           check=False)
    assert built.returncode == 0, built.stderr[-2000:]
    archives = list((tmp_path / "cache" / "jvm").glob("*.jsa"))
    assert len(archives) == 1 and archives[0].stat().st_size > 1 << 20
    assert not list((tmp_path / "cache" / "jvm").glob(".*"))  # no temporary file left
    probe = textwrap.dedent("""
        import sys
        from adaptcq.runtime.spark_session import get_spark
        spark = get_spark("local[1]", "probe", jvm_archive=sys.argv[2] == "1")
        pid = spark.sparkContext._gateway.proc.pid
        print(sys.argv[1] in open(f"/proc/{pid}/maps").read())
        spark.stop()
    """)
    out = subprocess.run([sys.executable, "-c", probe, str(archives[0]), "1"], env=env,
                         capture_output=True, text=True, timeout=300, check=False)
    assert out.stdout.strip().splitlines()[-1:] == ["True"], out.stderr[-2000:]
    # jvm_archive=False: test_get_spark_maps_the_archive_only_when_asked (no JVM needed)


def test_get_spark_maps_the_archive_only_when_asked(tmp_path, monkeypatch):
    """``get_spark(jvm_archive=False)`` starts its JVM without the archive though one exists;
    with the default it passes -XX:SharedArchiveFile (checked on the options given to
    the builder; no JVM is started)."""
    pytest.importorskip("pyspark")
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    from adaptcq.runtime import spark_session as ss
    monkeypatch.setenv("ADAPTCQ_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(ja.ENV_SWITCH, raising=False)
    java = ss.check_java()
    path = ja.archive_path(java, ss.java_version_text(java))
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\0")
    monkeypatch.setattr(SparkContext, "_active_spark_context", None)
    seen = []

    def fake_get_or_create(self):
        seen.append(dict(self._options))
        raise RuntimeError("not started")

    monkeypatch.setattr(SparkSession.Builder, "getOrCreate", fake_get_or_create)
    for use in (True, False):
        with pytest.raises(ss.SparkStartError):
            ss.get_spark("local[1]", "probe", jvm_archive=use)
    mapped = [f"-XX:SharedArchiveFile={path}" in o.get("spark.driver.extraJavaOptions", "")
              for o in seen]
    assert mapped == [True, False]
