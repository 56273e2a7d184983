"""The Spark settings a driver must be given when it starts: one builder, read from the
profile's values (falkirk.config) and the jars ``falkirk jars`` fetched (falkirk.io.jars).

Every driver gets the same: a job's (``spark-submit --conf``, or the builder of a session
of its own before the JVM exists), an Airflow batch task's (SparkSubmitOperator's
``conf``), the engine's (falkirk.runtime.engine) and the tests'. The config holds values
only; which settings a driver needs is decided here.
"""

from __future__ import annotations

import sys
from pathlib import Path

from falkirk.config import Config
from falkirk.io.classdata import java_options
from falkirk.io.jars import s3_classpath, spark_jars


def launch_conf(cfg: Config, class_data: bool = True) -> dict[str, str]:
    """The launch settings of ``cfg``'s drivers; with ``class_data``, the driver maps the
    profile's class-data archive when ``falkirk jars`` trained it (falkirk.io.classdata)."""
    conf = {"spark.sql.shuffle.partitions": str(cfg.spark_shuffle_partitions),
            "spark.ui.enabled": "true" if cfg.spark_ui else "false",
            # Spark's Kafka connector and delta-spark, fetched by bin/setup: the driver
            # ships them to executors, and no job resolves packages at start.
            "spark.jars": spark_jars(),
            "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
            "spark.sql.catalog.spark_catalog":
                "org.apache.spark.sql.delta.catalog.DeltaCatalog",
            # Delta rebuilds a table's snapshot with 50 tasks by default: 2 cores here.
            "spark.databricks.delta.snapshotPartitions": str(cfg.spark_shuffle_partitions)}
    if not cfg.lake.startswith("s3://"):
        # falkirk.io.delta.read_version hands Spark a version's data files: above 32
        # paths Spark would check them with a Spark job of a task per path, where the
        # driver checks local files in microseconds (an object store keeps the job).
        conf["spark.sql.sources.parallelPartitionDiscovery.threshold"] = "1000000"
    options = cfg.spark_driver_java_options
    if class_data:
        options = " ".join(filter(None, [options, java_options(cfg)]))
    if options:
        conf["spark.driver.extraJavaOptions"] = options
    if "://127.0.0.1:" in cfg.spark_master:  # a cluster on loopback: stay on it
        conf["spark.driver.host"] = "127.0.0.1"
    if cfg.lake.startswith("s3://"):
        conf.update({f"spark.hadoop.{k}": v for k, v in cfg.s3a_settings().items()})
    if cfg.object_store_jars:
        conf["spark.driver.extraClassPath"] = conf["spark.executor.extraClassPath"] = (
            s3_classpath())
    conf.update(cfg.spark_conf)
    return conf


def spark_submit() -> Path:
    """pip's pyspark's spark-submit (next to the interpreter, else in the package): what
    starts a driver of its own (a job's, the engine's)."""
    submit = Path(sys.executable).parent / "spark-submit"
    if submit.exists():
        return submit
    import pyspark

    return Path(pyspark.__file__).parent / "bin" / "spark-submit"
