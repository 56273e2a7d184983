"""Delta writer benchmark: EpochWriter.write_epoch against Spark's plain ``df.write.parquet``.

Run: ``python -m falkirk_dev.bench.delta_bench [ROWS] [EPOCHS]`` (defaults: 1,000,000 rows in 5
epochs). Both write the same DataFrames in the same session, epoch by epoch and alternating
which goes first, so JVM warm-up and drift hit both alike. Goal: the exactly-once writer keeps
at least 0.8 of plain Spark's records/s (its extra work: a transaction check read by
delta-rs, delta-spark's snapshot update, file statistics and commit, and finding the
epoch's commit in the log). A plain Delta append of the same rows (no ``txnAppId``) is timed
too, which splits the writer's extra time into Delta's own commit and the rest (the
idempotent write's transaction lookup, the epoch's commit found by delta-rs).

Then every version of the writer's table is read whole, as an epoch reads a side input:
by delta-spark's ``versionAsOf`` and by ``falkirk.io.delta.read_version`` (the Parquet
files the log lists there), alternating which goes first: seconds and Spark jobs per read.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time

import pyarrow as pa

from falkirk.io.delta import EpochWriter
from falkirk.runtime.launcher import session

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
        reads = compare_reads(spark, writer.table_uri, writer.log.table().version())
        return {"plain_rate": plain_rate, "writer_rate": writer_rate, "ratio": ratio,
                "delta_rate": written / delta_s, "writer_over_delta_ms": over_delta_ms,
                **reads}
    finally:
        shutil.rmtree(root, ignore_errors=True)
        spark.stop()


def compare_reads(spark, uri: str, newest: int) -> dict[str, float]:
    """Versions 1..``newest`` of ``uri`` each read whole (a count) by delta-spark's
    ``versionAsOf`` and by ``read_version``; per read: mean seconds and Spark jobs."""
    from falkirk.io.delta import read_version, spark_uri
    from falkirk.io.spark import jobs_in_group, label_jobs

    ways = {
        "versionAsOf": lambda v: spark.read.format("delta").option("versionAsOf", v).load(
            spark_uri(uri)),
        "file_list": lambda v: read_version(spark, uri, v),
    }
    seconds = dict.fromkeys(ways, 0.0)
    jobs = dict.fromkeys(ways, 0)
    for i, version in enumerate(range(1, newest + 1)):
        counts = set()
        for name in (list(ways) if i % 2 == 0 else list(reversed(ways))):
            group = f"falkirk-delta-bench-{name}-{version}"
            label_jobs(spark, group)
            t0 = time.perf_counter()
            counts.add(ways[name](version).count())
            seconds[name] += time.perf_counter() - t0
            jobs[name] += jobs_in_group(spark, group)
        assert len(counts) == 1, f"version {version} read differently: {counts}"
    label_jobs(spark, "")
    out = {}
    for name in ways:
        out[f"read_{name}_ms"] = seconds[name] / newest * 1000
        out[f"read_{name}_jobs"] = jobs[name] / newest
    delta_ms, files_ms = out["read_versionAsOf_ms"], out["read_file_list_ms"]
    from falkirk.io.spark import work_unit

    out["unit"] = work_unit(spark)
    print(f"a version read whole ({newest} versions): delta-spark versionAsOf "
          f"{delta_ms:.0f} ms / {out['read_versionAsOf_jobs']:.1f} {out['unit']}, its file list "
          f"{files_ms:.0f} ms / {out['read_file_list_jobs']:.1f} ({files_ms / delta_ms:.2f}x)")
    return out


if __name__ == "__main__":
    args = [int(a.replace("_", "")) for a in sys.argv[1:3]]
    main(*args)
