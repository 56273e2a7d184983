"""The JVM jars from Maven Central: present and complete, or a clear error naming bin/setup."""

from __future__ import annotations

import shutil

import pytest

from falkirk.config import load
from falkirk.io import jars
from falkirk.io.launch import launch_conf


@pytest.fixture
def jar_root(tmp_path, monkeypatch):
    """A copy of the fetched jar folders that a test may damage (the object-store sets,
    ~740 MB and never damaged here, are linked)."""
    for name in jars.SETS:
        if name in ("s3", "objectstore"):
            (tmp_path / name).symlink_to(jars.lib_dir() / name)
        else:
            shutil.copytree(jars.lib_dir() / name, tmp_path / name)
    monkeypatch.setenv("FALKIRK_JARS_DIR", str(tmp_path))
    jars._checked.cache_clear()
    yield tmp_path
    jars._checked.cache_clear()


def test_the_fetched_jars_are_the_pinned_ones(jar_root):
    names = {p.rsplit("/", 1)[-1] for p in jars.jars("spark")}
    assert "spark-sql-kafka-0-10_2.13-4.2.0.jar" in names
    assert "delta-spark_4.2_2.13-4.4.0.jar" in names
    assert not any(n.startswith(("scala-library", "hadoop-client")) for n in names), \
        "jars pyspark ships must not be given twice"
    assert "kafka_2.13-4.2.0.jar" in jars.kafka_classpath()
    assert launch_conf(load())["spark.jars"] == jars.spark_jars()


def test_missing_jars_name_bin_setup(jar_root):
    shutil.rmtree(jar_root / "spark")
    with pytest.raises(jars.JarsError, match="run bin/setup") as err:
        launch_conf(load())  # what every Spark driver's settings come from
    assert str(jar_root / "spark") in str(err.value)


def test_an_incomplete_fetch_is_refused(jar_root):
    (jar_root / "kafka" / jars.STAMP).unlink()  # the copy never finished
    with pytest.raises(jars.JarsError, match="do not match falkirk/jvm/kafka/pom.xml"):
        jars.kafka_classpath()


def test_a_corrupt_jar_is_named(jar_root):
    jar = next((jar_root / "spark").glob("delta-spark*.jar"))
    jar.write_bytes(jar.read_bytes()[:1000])  # a cut download
    with pytest.raises(jars.JarsError, match="delta-spark.*is corrupt"):
        jars.spark_jars()


def test_using_the_jars_reads_the_stamp_not_the_archives(jar_root, monkeypatch):
    """Every Airflow task parses the DAG file, which computes the Spark settings: opening
    the AWS SDK bundle's archive index there once took longer than Airflow's 30 s parse
    timeout on a loaded machine, and the task failed. The archives are read once, when
    fetched; use checks the stamp and the sizes."""
    for name in jars.SETS:
        jars.fetch(name)  # complete already: at most adds the sizes to an older stamp

    def no_archive_reads(*args, **kwargs):
        raise AssertionError("an archive was read to use the jars")

    monkeypatch.setattr(jars.zipfile, "ZipFile", no_archive_reads)
    jars._checked.cache_clear()
    for name in jars.SETS:
        assert jars.jars(name)
    assert "hadoop-aws" in launch_conf(load("cluster"))["spark.executor.extraClassPath"]


def test_a_stamp_without_sizes_is_completed_without_fetching_again(jar_root):
    stamp = jar_root / "kafka" / jars.STAMP
    stamp.write_text(jars.pom_digest("kafka") + "\n")  # as an older falkirk wrote it
    assert jars.fetch("kafka") is False  # nothing fetched
    sizes = dict(line.split(" ", 1)[::-1] for line in stamp.read_text().splitlines()[1:])
    assert sizes == {p.name: str(p.stat().st_size) for p in (jar_root / "kafka").glob("*.jar")}


def test_a_jar_that_was_not_fetched_is_refused(jar_root):
    jars.fetch("kafka")  # the stamp lists what was fetched
    shutil.copy(next((jar_root / "kafka").glob("kafka_*.jar")), jar_root / "kafka" / "x.jar")
    jars._checked.cache_clear()
    with pytest.raises(jars.JarsError, match=r"not fetched for its pom \(x\.jar\)"):
        jars.kafka_classpath()
