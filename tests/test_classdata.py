"""The Spark drivers' class-data archive (falkirk.io.classdata): trained by ``falkirk jars``
(bin/setup), mapped by every driver of the profile, and never offered to a JVM it was not
made for."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from falkirk.config import load
from falkirk.io import classdata
from falkirk.io.launch import launch_conf

pytestmark = pytest.mark.slow  # a Spark driver


def test_the_engine_maps_the_archive_falkirk_jars_trained(spark):
    """The suite's engine (started with the profile's launch settings, which every driver
    of its own gets too) has the archive's file mapped: its classes came from there."""
    from falkirk.runtime.engine import status

    path = classdata.archive(load())
    assert path is not None and path.is_file(), "bin/setup (falkirk jars) trains it"
    assert spark.range(1).count() == 1  # the suite's engine runs
    jvm = status()["pid"]
    assert jvm is not None
    assert str(path) in Path(f"/proc/{jvm}/maps").read_text()


def test_the_archive_is_keyed_by_what_it_was_made_for(tmp_path):
    """Other JVM options or another jar set name another archive, which no JVM is given
    until it is trained: an archive never reaches a JVM it was not made for."""
    cfg = load()
    trained = classdata.archive(cfg)
    other = replace(cfg, spark_driver_java_options="-XX:+UseSerialGC")
    assert classdata.archive(other) != trained
    assert classdata.java_options(other) == ""
    assert "SharedArchiveFile" not in launch_conf(other)["spark.driver.extraJavaOptions"]
    more_jars = replace(cfg, spark_conf=(("spark.jars", f"{trained}"),))  # one more file
    assert classdata.key(more_jars) != classdata.key(cfg)
    # what the key is computed from leaves the archive out (it cannot depend on itself)
    assert "SharedArchiveFile" not in launch_conf(cfg, class_data=False).get(
        "spark.driver.extraJavaOptions", "")
    assert launch_conf(cfg)["spark.driver.extraJavaOptions"].endswith(
        f"-XX:SharedArchiveFile={trained}")


def test_a_jvm_given_a_missing_or_corrupt_archive_runs_without_it(tmp_path):
    """-Xshare:auto, the default: an archive deleted or cut short under a starting driver
    (a retrain, a full disk) costs the driver its speed-up, not its start."""
    import subprocess

    corrupt = tmp_path / "cut.jsa"
    corrupt.write_bytes(b"\0" * 4096)
    java = str(classdata.java_binary())
    for path in (tmp_path / "missing.jsa", corrupt):
        ran = subprocess.run([java, f"-XX:SharedArchiveFile={path}", "-version"],
                             capture_output=True, text=True, timeout=60)
        assert ran.returncode == 0, ran.stderr
