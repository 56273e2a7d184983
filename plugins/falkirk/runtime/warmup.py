"""A fresh engine's warm-up: epochs of synthetic events through the paths every job's
epochs take, before the first job's.

A fresh engine runs its first minutes of work interpreted and compiling: at 5,000
events/s the reference pipeline then fell behind for 1.5 to 4.5 minutes (its first
epochs 2-3x slower, the JVM's C2 compiler taking ~40% of the engine's CPU), and caught up
from the start on an engine that had run before (docs/engine.md "A warm engine").
:func:`warm` gives that work to a session of its own before any job starts: the same
kinds of Spark Connect plans (JSON parsed from strings, filters, aggregations, joins,
a window, a union), Parquet written by :class:`~falkirk.io.delta.EpochWriter` and
committed by delta-rs, the appends read back and results collected as Arrow, epoch after
epoch, in a scratch table beside the engine's log, deleted at the end.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

from falkirk.config import Config

log = logging.getLogger("falkirk.runtime.warmup")

#: Events an epoch of the warm-up makes (a 10-s epoch at 5,000 events/s: its plans and
#: row counts are a real epoch's).
EVENTS_PER_EPOCH = 50_000
USERS, ITEMS = 500, 200

SCHEMA = pa.schema([("epoch", pa.int64()), ("user", pa.int64()), ("item", pa.int64()),
                    ("events", pa.int64()), ("amount", pa.float64()), ("rank", pa.int32())])


def events(spark: Any, epoch: int, n: int = EVENTS_PER_EPOCH) -> Any:
    """``n`` events of ``epoch`` as a job reads them from a topic: JSON strings, parsed."""
    from pyspark.sql import functions as F

    raw = spark.range(n).select(F.to_json(F.struct(
        (F.col("id") % USERS).alias("user"), (F.col("id") * 7 % ITEMS).alias("item"),
        F.when(F.col("id") % 3 == 0, "buy").otherwise("view").alias("kind"),
        (F.col("id") % 97 / 10).alias("amount"),
        (F.lit(epoch * 10_000) + F.col("id") % 10_000).alias("ts"))).alias("value"))
    shape = "user BIGINT, item BIGINT, kind STRING, amount DOUBLE, ts BIGINT"
    return (raw.select(F.from_json("value", shape).alias("e")).select("e.*")
            .filter(F.col("user").isNotNull()).withColumn("epoch", F.lit(epoch)))


def epoch_output(spark: Any, epoch: int) -> Any:
    """One epoch's work on :func:`events`: per (user, item) counts joined with a per-item
    dimension and ranked within each user, the same rows as a union of two halves."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    ev = events(spark, epoch)
    items = (spark.range(ITEMS).select(F.col("id").alias("item"),
                                       (F.col("id") % 8).alias("category")))
    per = (ev.groupBy("epoch", "user", "item")
           .agg(F.count("*").alias("events"), F.sum("amount").alias("amount"))
           .join(items, "item"))
    ranked = per.withColumn("rank", F.row_number().over(
        Window.partitionBy("user").orderBy(F.desc("events"), "item")))
    return (ranked.filter(F.col("category") < 4)
            .unionByName(ranked.filter(F.col("category") >= 4))
            .select("epoch", "user", "item", "events", "amount", "rank"))


def warm(cfg: Config, seconds: float, where: Path,
         say: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run warm-up epochs on the engine at ``cfg.spark_remote`` for about ``seconds`` (the
    epoch under way finishes); what was done. Its session is released and its scratch
    table under ``where`` deleted, whatever happens."""
    from pyspark.sql import functions as F

    from falkirk.io.delta import EpochWriter, read_appends_of
    from falkirk.io.spark import release_session, remote_session

    say = say or log.info
    started = time.monotonic()
    scratch = where / "warmup"
    shutil.rmtree(scratch, ignore_errors=True)
    spark = remote_session(cfg, None)
    session_id = spark.session_id
    writer = EpochWriter(spark, str(scratch / "epochs"), "warmup", 1, SCHEMA)
    epochs, times = 0, []
    say(f"warming the fresh engine for {seconds:g} s before the jobs start: epochs of "
        f"{EVENTS_PER_EPOCH:,} synthetic events in {scratch}")
    try:
        while time.monotonic() - started < seconds:
            t0 = time.monotonic()
            done = writer.write_epoch(epoch_output(spark, epochs), epochs)
            back = read_appends_of(spark, writer.table_uri, [(done.version, epochs)])
            back.groupBy("user").agg(F.max("rank"), F.sum("events")).toArrow()
            times.append(time.monotonic() - t0)
            epochs += 1
    finally:
        release_session(cfg.spark_remote, session_id)
        shutil.rmtree(scratch, ignore_errors=True)
    out = {"epochs": epochs, "seconds": round(time.monotonic() - started, 1),
           "first_epoch_s": round(times[0], 2) if times else None,
           "last_epoch_s": round(times[-1], 2) if times else None}
    say(f"engine warmed: {epochs} epochs in {out['seconds']} s (the first "
        f"{out['first_epoch_s']} s, the last {out['last_epoch_s']} s)")
    return out
