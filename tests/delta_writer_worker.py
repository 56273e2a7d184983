"""An EpochWriter in its own process, so a test can kill it between the files and the commit.

Usage: ``python delta_writer_worker.py TABLE REGION GENERATION FIRST_EPOCH LAST_EPOCH ROWS``.
Prints one JSON line per epoch (``{"epoch": e, "version": v}``, version null when skipped).
With ``FALKIRK_CRASH_BEFORE_COMMIT=E`` it SIGKILLs itself once epoch E's Parquet files are
written and before they are committed, as a crashed driver would.
"""

from __future__ import annotations

import json
import os
import signal
import sys

import pyarrow as pa

SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("epoch", pa.int64()),
        ("name", pa.string()),
        ("ts", pa.timestamp("us", tz="UTC")),
        ("score", pa.float64()),
    ]
)


def epoch_frame(spark, epoch: int, rows: int):
    """The deterministic rows of one epoch: ids epoch*rows .. (epoch+1)*rows-1, 2 partitions."""
    from pyspark.sql import functions as F

    return spark.range(epoch * rows, (epoch + 1) * rows, numPartitions=2).select(
        F.col("id"),
        F.lit(epoch).cast("long").alias("epoch"),
        F.concat(F.lit("row-"), F.col("id").cast("string")).alias("name"),
        F.timestamp_seconds(F.col("id") * 60).alias("ts"),
        (F.col("id") / 7.0).alias("score"),
    )


def main(argv: list[str]) -> int:
    table, region, generation, first, last, rows = argv
    from falkirk.delta import EpochWriter, StagedEpoch
    from falkirk.spark import session

    spark = session("falkirk-delta-worker")
    writer = EpochWriter(table, region, int(generation), SCHEMA)
    writer.ensure_table()
    crash_at = os.environ.get("FALKIRK_CRASH_BEFORE_COMMIT")
    if crash_at is not None:
        commit = writer.commit

        def commit_or_die(staged: StagedEpoch):
            if staged.epoch == int(crash_at):
                print(json.dumps({"crashing": staged.epoch, "staging": staged.staging}), flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            return commit(staged)

        writer.commit = commit_or_die  # type: ignore[method-assign]
    for epoch in range(int(first), int(last) + 1):
        result = writer.write_epoch(epoch_frame(spark, epoch, int(rows)), epoch)
        print(json.dumps({"epoch": epoch, "version": result and result.version}), flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
