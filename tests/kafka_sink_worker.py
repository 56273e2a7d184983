"""A Spark driver for the kill-and-restart test: topic -> one Parquet folder per batch.

Each micro-batch is written with foreachBatch to ``OUT/batch_<id>``, overwriting that
folder, so a batch Spark replays after a crash replaces its partial output instead of
adding to it. Run as a subprocess so the test can SIGKILL it mid-stream.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from falkirk.kafka_source import KafkaDataSource
from falkirk.spark import session


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-records", type=int, default=1000)
    ap.add_argument("--value-schema", default=None)
    ap.add_argument("--trigger", choices=["availableNow", "processingTime"], default="availableNow")
    args = ap.parse_args()

    spark = session("falkirk-kafka-sink-worker")
    spark.dataSource.register(KafkaDataSource)
    reader = (
        spark.readStream.format("falkirk_kafka")
        .option("bootstrap", args.bootstrap)
        .option("topic", args.topic)
        .option("maxRecordsPerBatch", str(args.max_records))
    )
    if args.value_schema:
        reader = reader.option("valueSchema", args.value_schema)
    out = Path(args.out)

    def write_batch(df, batch_id: int) -> None:
        df.write.mode("overwrite").parquet(str(out / f"batch_{batch_id:06d}"))

    writer = (
        reader.load()
        .writeStream.foreachBatch(write_batch)
        .option("checkpointLocation", args.checkpoint)
    )
    if args.trigger == "availableNow":
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime="0 seconds")
    query = writer.start()
    query.awaitTermination()
    spark.stop()


if __name__ == "__main__":
    main()
