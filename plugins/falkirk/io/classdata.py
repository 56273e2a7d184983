"""The Spark driver's class-data archive: the classes a driver loads, mapped from one file.

The engine (falkirk.runtime.engine) is a driver of the profile's class path and options too,
and maps it as well.

Why: a driver JVM starts by loading and verifying some 20,000 classes (Spark, delta-spark,
the Kafka connector). On this machine's 2 shared cores that is most of a job's start and
of its first epoch, and so of every recovery (docs/faults.md: a restarted job's start and
its first epoch are most of a recovery). HotSpot's dynamic class-data sharing (JDK 13+)
writes the loaded classes, parsed and verified, into an archive when a JVM exits
(``-XX:ArchiveClassesAtExit``); later JVMs map it (``-XX:SharedArchiveFile``), read-only
and shared between the drivers running at once.

``falkirk jars`` trains one archive per profile after fetching the jars: a driver with the
profile's class path and JVM options writes a few Delta epochs and reads them back, then
exits and leaves the archive. Its name is a digest of what it depends on (the JVM, the
driver's options, the Spark jars and class path), so a changed JVM or jar set is simply
not matched, and the launch settings (falkirk.io.launch) pass the archive only when it
exists. A JVM that finds an archive it cannot use runs without it (``-Xshare:auto``, the
default).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import replace
from importlib.metadata import version
from pathlib import Path

from falkirk.config import Config, load
from falkirk.errors import FalkirkError
from falkirk.io.jars import lib_dir, s3_classpath, spark_jars

FOLDER = "cds"  # under the jar folder (falkirk.io.jars.lib_dir), ignored by git


class ClassDataError(FalkirkError):
    """The training driver failed: its archive was not written."""


def java_binary() -> Path | None:
    """The java Spark's launcher runs: $JAVA_HOME/bin/java, else the one on PATH."""
    home = os.environ.get("JAVA_HOME")
    found = Path(home, "bin", "java") if home else shutil.which("java")
    return Path(found).resolve() if found and Path(found).exists() else None


def key(cfg: Config) -> str | None:
    """What the archive depends on, digested; None without a JVM. Cheap (a few stats):
    every DAG parse computes the Spark settings."""
    java = java_binary()
    if java is None:
        return None
    conf = keyed_settings(cfg)
    parts = [str(java)]
    for lib in sorted(java.parent.parent.glob("lib/server/*.so")):  # a JVM update
        st = lib.stat()
        parts.append(f"{lib.name} {st.st_size} {st.st_mtime_ns}")
    parts += [version("pyspark"), conf.get("spark.driver.extraJavaOptions", ""),
              conf.get("spark.driver.extraClassPath", "")]
    for jar in conf.get("spark.jars", "").split(","):
        if jar:
            parts.append(f"{Path(jar).name} {Path(jar).stat().st_size}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def keyed_settings(cfg: Config) -> dict[str, str]:
    """The launch settings the archive depends on, as the driver gets them
    (falkirk.io.launch.launch_conf, the profile's ``spark_conf`` last) but for the
    archive's own option: the JVM's options, the jars and the driver's class path."""
    given = dict(cfg.spark_conf)
    return {"spark.driver.extraJavaOptions": given.get(
                "spark.driver.extraJavaOptions", cfg.spark_driver_java_options),
            "spark.driver.extraClassPath": given.get(
                "spark.driver.extraClassPath", s3_classpath() if cfg.object_store_jars else ""),
            "spark.jars": given.get("spark.jars", spark_jars())}


def archive(cfg: Config) -> Path | None:
    """Where the archive for this profile's drivers is (or would be)."""
    digest = key(cfg)
    return lib_dir() / FOLDER / f"driver-{cfg.env}-{digest}.jsa" if digest else None


def java_options(cfg: Config) -> str:
    """The driver's JVM option that maps the archive, when it was trained; else ''."""
    path = archive(cfg)
    return f"-XX:SharedArchiveFile={path}" if path is not None and path.is_file() else ""


def train(cfg: Config | None = None, progress: Callable[[str], None] = print) -> Path | None:
    """Write this profile's archive unless it exists (a training driver, ~1 min); its path,
    or None without a JVM. Old archives of the profile are deleted."""
    cfg = cfg or load()
    path = archive(cfg)
    if path is None or path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    progress(f"training the Spark driver's class-data archive for profile {cfg.env!r} "
             "(a driver writes and reads a few Delta epochs, once; about a minute)")
    # The JVM writes the archive at its exit, into a folder of this training's own beside
    # the archive (the same file system: the rename below is atomic).
    with tempfile.TemporaryDirectory(prefix=f".{path.stem}-", dir=path.parent) as own:
        tmp = os.path.join(own, path.name)
        with tempfile.TemporaryDirectory(prefix="falkirk-cds-") as scratch:
            done = subprocess.run([sys.executable, "-m", "falkirk.io.classdata", tmp, scratch],
                                  capture_output=True, text=True, timeout=900,
                                  env={**os.environ, "FALKIRK_ENV": cfg.env})
        if done.returncode != 0 or not os.path.exists(tmp) or not os.path.getsize(tmp):
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
            raise ClassDataError(f"the training driver wrote no class-data archive "
                                 f"(exit {done.returncode}):\n{tail}")
        for old in path.parent.glob(f"driver-{cfg.env}-*.jsa"):
            old.unlink()
        os.replace(tmp, path)
    progress(f"class-data archive: {path} ({path.stat().st_size / 2**20:.0f} MB)")
    return path


def _training_run(out: str, scratch: str) -> None:
    """What a job's driver does, on small data: Delta epochs written, read, merged and
    restored, Arrow to and from pandas, the Kafka connector's reader built."""
    from delta.tables import DeltaTable
    from pyspark import SparkContext
    from pyspark.sql import functions as F

    from falkirk.io.spark import application_session

    # The profile's class path and JVM options (what the archive is keyed by), on local
    # data: the training needs no cluster, object store or broker.
    # A driver of its own (not a client of the engine): the engine maps the same archive.
    cfg = replace(load(), lake=scratch, spark_master="local[2]", spark_checkpoint_dir="",
                  storage_options=(), spark_ui=False, spark_remote="")
    options = " ".join(filter(None, [cfg.spark_driver_java_options,
                                     f"-XX:ArchiveClassesAtExit={out}"]))
    spark = application_session("falkirk-class-data-training", cfg,
                    **{"spark.driver.extraJavaOptions": options})
    table = f"file://{scratch}/epochs"
    for epoch in range(3):
        (spark.range(200).select(F.lit(epoch).cast("long").alias("epoch"),
                                 (F.col("id") % 17).alias("k"), F.col("id").alias("v"))
         .write.format("delta").mode("append")
         .option("txnAppId", "training").option("txnVersion", epoch).save(table))
    frame = spark.read.format("delta").load(table)
    counts = frame.groupBy("k").agg(F.sum("v").alias("v")).join(
        frame.select("k", "epoch").distinct(), "k")
    counts.toPandas()
    spark.createDataFrame(counts.limit(5).toPandas()).collect()
    (DeltaTable.forPath(spark, table).alias("t")
     .merge(counts.limit(10).withColumnRenamed("v", "v2").alias("s"), "t.k = s.k")
     .whenMatchedUpdate(set={"v": "s.v2"}).execute())
    DeltaTable.forPath(spark, table).history().collect()
    DeltaTable.forPath(spark, table).restoreToVersion(1)
    # the connector's relation, built without a broker
    (spark.read.format("kafka").option("kafka.bootstrap.servers", "127.0.0.1:9")
     .option("subscribe", "training").load().printSchema())
    spark.stop()
    gateway = SparkContext._gateway
    if gateway is not None and getattr(gateway, "proc", None) is not None:
        gateway.proc.stdin.close()  # the JVM exits (and writes the archive) on EOF
        gateway.proc.wait(timeout=600)


if __name__ == "__main__":
    _training_run(sys.argv[1], sys.argv[2])
