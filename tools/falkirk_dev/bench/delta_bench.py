"""Delta writer benchmark: EpochWriter.write_epoch against Spark's plain ``df.write.parquet``.

Run: ``python -m falkirk_dev.bench.delta_bench [ROWS] [EPOCHS]`` (defaults: 1,000,000 rows in 5
epochs). Both write the same DataFrames in the same session, epoch by epoch and alternating
which goes first, so JVM warm-up and drift hit both alike. Goal: the exactly-once writer keeps
at least 0.8 of plain Spark's records/s (its extra work: a transaction check read by
delta-rs, delta-spark's snapshot update, file statistics and commit, and finding the
epoch's commit in the log). A plain Delta append of the same rows (no ``txnAppId``) is timed
too, which splits the writer's extra time into Delta's own commit and the rest (the
idempotent write's transaction lookup, the epoch's commit found by delta-rs).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time

import pyarrow as pa

from falkirk.io.delta import EpochWriter
from falkirk.io.spark import session

GOAL = 0.8
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
    """The deterministic rows of one epoch: ids epoch*rows .. (epoch+1)*rows-1, in two
    partitions (two cores). The writer tests use the same rows."""
    from pyspark.sql import functions as F

    return spark.range(epoch * rows, (epoch + 1) * rows, numPartitions=2).select(
        F.col("id"),
        F.lit(epoch).cast("long").alias("epoch"),
        F.concat(F.lit("row-"), F.col("id").cast("string")).alias("name"),
        F.timestamp_seconds(F.col("id") * 60).alias("ts"),
        (F.col("id") / 7.0).alias("score"),
    )


def main(rows: int = 1_000_000, epochs: int = 5) -> dict[str, float]:
    spark = session("falkirk-delta-bench")
    # Delta writes timestamps as TIMESTAMP_MICROS: plain Spark does too.
    spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
    root = tempfile.mkdtemp(prefix="falkirk-delta-bench-")
    try:
        writer = EpochWriter(spark, f"{root}/table", "bench", 1, SCHEMA)
        writer.ensure_table()
        warm = epoch_frame(spark, 0, 10_000)  # warm both paths up (JIT, Python workers)
        warm.write.parquet(f"{root}/plain/warm")
        writer.write_epoch(warm, 0)
        warm.write.format("delta").mode("append").save(f"{root}/delta")

        per_epoch = rows // epochs
        plain_s = writer_s = delta_s = 0.0
        for i in range(epochs):
            epoch = i + 1
            df = epoch_frame(spark, epoch, per_epoch)

            def plain(df=df, epoch=epoch) -> float:
                t0 = time.perf_counter()
                df.write.parquet(f"{root}/plain/e{epoch}")
                return time.perf_counter() - t0

            def delta_append(df=df) -> float:
                t0 = time.perf_counter()
                df.write.format("delta").mode("append").save(f"{root}/delta")
                return time.perf_counter() - t0

            def exactly_once(df=df, epoch=epoch) -> float:
                t0 = time.perf_counter()
                result = writer.write_epoch(df, epoch)
                elapsed = time.perf_counter() - t0
                assert result is not None
                return elapsed

            if i % 2 == 0:
                plain_s += plain()
                delta_s += delta_append()
                writer_s += exactly_once()
            else:
                writer_s += exactly_once()
                delta_s += delta_append()
                plain_s += plain()

        written = per_epoch * epochs
        plain_rate = written / plain_s
        writer_rate = written / writer_s
        ratio = writer_rate / plain_rate
        overhead_ms = (writer_s - plain_s) / epochs * 1000
        over_delta_ms = (writer_s - delta_s) / epochs * 1000  # the writer's own part
        print(f"rows {written:,} in {epochs} epochs of {per_epoch:,} (local[2])")
        print(f"spark df.write.parquet     {plain_rate:>12,.0f} records/s  ({plain_s:.2f} s)")
        print(f"plain Delta append         {written / delta_s:>12,.0f} records/s  "
              f"({delta_s:.2f} s)")
        print(f"EpochWriter.write_epoch    {writer_rate:>12,.0f} records/s  ({writer_s:.2f} s)")
        verdict = "ok" if ratio >= GOAL else "BELOW GOAL"
        print(f"ratio {ratio:.2f} (goal >= {GOAL}: {verdict}); {overhead_ms:+.0f} ms per epoch, "
              f"of which {over_delta_ms:+.0f} ms over a plain Delta append")
        return {"plain_rate": plain_rate, "writer_rate": writer_rate, "ratio": ratio,
                "delta_rate": written / delta_s, "writer_over_delta_ms": over_delta_ms}
    finally:
        shutil.rmtree(root, ignore_errors=True)
        spark.stop()


if __name__ == "__main__":
    args = [int(a.replace("_", "")) for a in sys.argv[1:3]]
    main(*args)
