"""The one place Spark sessions are built, so jobs and tests run with the same settings."""

from __future__ import annotations

import os
import sys

from falkirk.config import Config, load


def conform(df, table: str):
    """``df`` with the columns of ``schemas/tables/<table>.json``, in order, with its types."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema

    from falkirk.model.schemas import arrow_schema

    schema = from_arrow_schema(arrow_schema("tables", table))
    return df.select([F.col(f.name).cast(f.dataType).alias(f.name) for f in schema.fields])


def dead_letters(rows, epoch):
    """The ``dead_letters`` rows of source records that failed a check.

    ``rows``: records as ``falkirk.io.kafka.read_range`` returns them, with a ``_reason``
    column (the first check they failed); ``epoch``: the epoch being processed (a Column).
    The raw value is kept, with its topic, partition and offset, so nothing malformed is
    lost.
    """
    from pyspark.sql import functions as F

    return conform(rows.select(
        epoch.alias("epoch"), F.col("topic").alias("source"), "partition", "offset",
        F.col("value").alias("raw"), F.col("_reason").alias("reason"),
    ), "dead_letters")


def null_violations(df, schema, table: str, epoch: int):
    """``(rows, refused)``: the rows of ``df`` with a value in every column ``schema``
    declares non-nullable, and the others as ``dead_letters`` rows whose reason names the
    first such column that is null, the source being the table and the raw value the row
    as JSON (partition and offset -1: the row came from a job, not from a topic)."""
    from functools import reduce

    from pyspark.sql import functions as F

    required = [f.name for f in schema if not f.nullable and f.name in df.columns]
    if not required:
        return df, None
    null = reduce(lambda a, b: a | b, [F.col(f"`{c}`").isNull() for c in required])
    reason = F.coalesce(*[
        F.when(F.col(f"`{c}`").isNull(), F.lit(
            f"column {c!r} is null, but table {table!r} declares it non-nullable"))
        for c in required])
    refused = df.filter(null).select(
        F.lit(epoch).alias("epoch"), F.lit(f"table {table}").alias("source"),
        F.lit(-1).alias("partition"), F.lit(-1).alias("offset"),
        F.to_json(F.struct(*[F.col(f"`{c}`") for c in df.columns])).alias("raw"),
        reason.alias("reason"))
    return df.filter(~null), conform(refused, "dead_letters")


def cut_lineage(df):
    """``df`` with its lineage cut, so state kept across epochs and loops (label
    propagation's rounds) do not replay their history at every use.

    On ``local[2]`` the rows stay in the executor's memory (``localCheckpoint``): it dies
    only with its driver. Where executors can be lost (a profile with
    ``spark_checkpoint_dir``: a cluster) a local checkpoint is lost with its executor and
    every later job that reads it fails (``CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND``), so the rows
    are written to the checkpoint folder instead (``checkpoint``), which outlives them.
    """
    if df.sparkSession.sparkContext.getCheckpointDir():
        return df.checkpoint(eager=True)
    return df.localCheckpoint()


def session(app_name: str = "falkirk", cfg: Config | None = None, **conf: str):
    """A Spark session for this machine's profile.

    local[2] with 2 shuffle partitions (2 cores), bound to 127.0.0.1, the Python
    workers on this venv's interpreter (else they cannot import pyarrow), the RocksDB
    state store with changelog checkpointing for Spark's own in-query recovery, and (from
    ``Config.spark_launch_conf``) the Kafka connector and delta-spark jars bin/setup fetched.
    """
    from pyspark.sql import SparkSession

    cfg = cfg or load()
    local = cfg.spark_master.startswith("local")
    if local:  # on a cluster the driver must be reachable from the workers
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.appName(app_name)
        .master(cfg.spark_master)
        .config("spark.default.parallelism", "2")
        .config("spark.ui.showConsoleProgress", "false")  # progress goes to the logs
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config(
            "spark.sql.streaming.stateStore.providerClass",
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
        )
        .config("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
    )
    if local:
        builder = builder.config("spark.driver.host", "127.0.0.1")
    for key, value in {**cfg.spark_launch_conf, **conf}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    if cfg.spark_checkpoint_dir:  # executors can be lost: cut_lineage writes rows there
        sc = spark.sparkContext
        sc.setCheckpointDir(f"{cfg.spark_checkpoint_dir.rstrip('/')}/{sc.applicationId}")
    if cfg.lake.startswith("s3://"):  # the credentials, never on a command line (config)
        hadoop = spark.sparkContext._jsc.hadoopConfiguration()
        for key, value in cfg.s3a_settings(secrets=True).items():
            hadoop.set(key, value)
    return spark
