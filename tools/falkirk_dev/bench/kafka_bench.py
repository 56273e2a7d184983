"""How fast Spark's Kafka connector reads Kafka edges, next to a raw kafka-python consumer.

One run against a fresh embedded Apache Kafka broker: produce ``records`` JSON events
(~130 B) over 3 partitions, read them all with one raw consumer that parses each value
(the ceiling for one Python process), then with the connector as falkirk reads Kafka
edges in a stream (``readStream.format("kafka")``, availableNow, ``maxOffsetsPerTrigger``
100k, values parsed by ``falkirk.io.kafka.parse_values``, noop sink). The first batch
pays JVM warm-up, so the figure compared with the goal is the sustained rate of the later
batches. Goal: sustained Spark rate ≥ 0.7 × raw consumer.

It then reads an epoch-sized range at the topic's end (:data:`EPOCH_RECORDS` over the 3
partitions) with ``falkirk.io.kafka.read_range``, as a running job reads its latest epoch,
alternately with the connector's default consumer options and with ``READ_OPTIONS``: the
seconds per read of each in one run, and their ratio (every epoch pays its reads).

    python -m falkirk_dev.bench.kafka_bench [records [minPartitions]]
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

from falkirk.local.broker import LocalBroker

TOPIC = "bench"
PARTITIONS = 3
BATCH = 100_000
GOAL_RATIO = 0.7
EPOCH_RECORDS = 600
EPOCH_ROUNDS = 5
SCHEMA = "event_id string, user_id long, kind string, amount double, ts long"


def _event(i: int) -> bytes:
    return json.dumps(
        {
            "event_id": f"evt-{i:012d}",
            "user_id": 100_000 + i % 50_000,
            "kind": ("view", "click", "purchase")[i % 3],
            "amount": round((i % 10_000) * 0.37, 2),
            "ts": 1_767_225_600_000 + i,
            "page": f"/catalog/item/{i % 5_000:05d}",
        }
    ).encode()


def produce(bootstrap: str, records: int) -> float:
    """Keyed produce; returns records/s."""
    from kafka import KafkaProducer

    producer = KafkaProducer(
        bootstrap_servers=bootstrap, linger_ms=20, batch_size=512 * 1024, acks=1
    )
    t0 = time.perf_counter()
    for i in range(records):
        producer.send(TOPIC, key=f"user-{i % 50_000}".encode(), value=_event(i))
    producer.flush()
    elapsed = time.perf_counter() - t0
    producer.close()
    return records / elapsed


def raw_consume(bootstrap: str) -> tuple[int, float]:
    """One consumer over all partitions, json.loads on every value; (records, records/s)."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        max_partition_fetch_bytes=16 * 1024 * 1024,
        fetch_max_bytes=64 * 1024 * 1024,
    )
    tps = [TopicPartition(TOPIC, p) for p in sorted(consumer.partitions_for_topic(TOPIC))]
    ends = consumer.end_offsets(tps)
    consumer.assign(tps)
    consumer.seek_to_beginning()
    loads = json.loads
    count = 0
    t0 = time.perf_counter()
    while any(consumer.position(tp) < ends[tp] for tp in tps):
        for batch in consumer.poll(timeout_ms=1000, max_records=20_000).values():
            for record in batch:
                loads(record.value)
            count += len(batch)
    elapsed = time.perf_counter() - t0
    consumer.close()
    return count, count / elapsed


def spark_consume(spark, bootstrap: str, min_partitions: int = 0) -> dict:
    """The connector end to end into a noop sink; per-batch figures from query progress."""
    from falkirk.io.kafka import parse_values

    t0 = time.perf_counter()
    raw = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", TOPIC)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(BATCH))
        .option("minPartitions", str(min_partitions or PARTITIONS))
        .load()
    )
    query = (
        parse_values(raw, SCHEMA)
        .writeStream.format("noop")
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    wall = time.perf_counter() - t0
    if query.exception() is not None:
        raise RuntimeError(f"the benchmark query failed: {query.exception()}")
    batches = [
        (p["numInputRows"], p["durationMs"]["triggerExecution"] / 1000)
        for p in sorted(query.recentProgress, key=lambda p: p["batchId"])
        if p["numInputRows"] > 0
    ]
    later = batches[1:]
    rows_later = sum(n for n, _ in later)
    secs_later = sum(s for _, s in later)
    return {
        "records": sum(n for n, _ in batches),
        "wall_s": wall,
        "batches": batches,
        "one_shot_rate": sum(n for n, _ in batches) / wall,
        "sustained_rate": rows_later / secs_later if later else float("nan"),
    }


def epoch_reads(spark, bootstrap: str) -> dict:
    """Seconds per read of an epoch-sized range at the topic's end (where a running job
    reads its latest epoch), the records materialized as a job's first use of its input
    does, with the connector's default consumer options and with falkirk's
    ``READ_OPTIONS``, alternating so both see the same machine."""
    import statistics

    from falkirk.io.kafka import READ_OPTIONS, end_offsets, read_range
    from falkirk.model.times import Offsets

    defaults = {k: v for k, v in READ_OPTIONS.items() if not k.startswith("kafka.")}
    ends = end_offsets(bootstrap, TOPIC)
    per = EPOCH_RECORDS // len(ends)
    total = per * len(ends)
    start, end = Offsets({p: o - per for p, o in ends.items()}), Offsets(ends)
    seconds: dict[str, list[float]] = {"default": [], "falkirk": []}
    for _ in range(EPOCH_ROUNDS):
        for name, options in (("default", defaults), ("falkirk", READ_OPTIONS)):
            t0 = time.perf_counter()
            n = read_range(spark, bootstrap, TOPIC, start, end, SCHEMA,
                           options).localCheckpoint().count()
            seconds[name].append(time.perf_counter() - t0)
            if n != total:
                raise RuntimeError(f"an epoch read gave {n} records, not {total}")
    median = {k: statistics.median(v[1:]) for k, v in seconds.items()}  # the 1st warms up
    return {"epoch_read_records": total, "epoch_read_s": seconds,
            "epoch_read_s_median": median,
            "epoch_read_ratio": median["falkirk"] / median["default"]}


def main(records: int = 300_000, min_partitions: int = 0) -> dict:
    from falkirk.runtime.launcher import session

    with (
        tempfile.TemporaryDirectory(prefix="falkirk-kafka-bench-") as tmp,
        LocalBroker(Path(tmp) / "broker") as broker,
    ):
        broker.create_topic(TOPIC, PARTITIONS)
        produce_rate = produce(broker.bootstrap, records)
        size = len(_event(records // 2))
        print(f"produced {records:,} records of ~{size} B over {PARTITIONS} partitions: "
              f"{produce_rate:,.0f} records/s")  # fmt: skip
        raw_count, raw_rate = raw_consume(broker.bootstrap)
        if raw_count != records:
            raise RuntimeError(f"the raw consumer read {raw_count} records, not {records}")
        print(f"raw kafka-python consumer + json.loads (1 process): {raw_rate:,.0f} records/s")
        spark = session("falkirk-kafka-bench")
        try:
            result = spark_consume(spark, broker.bootstrap, min_partitions)
            reads = epoch_reads(spark, broker.bootstrap)
        finally:
            spark.stop()
    if result["records"] != records:
        raise RuntimeError(f"the connector read {result['records']} records, not {records}")
    for i, (n, secs) in enumerate(result["batches"]):
        print(f"  spark batch {i}: {n:,} records in {secs:.2f} s = {n / secs:,.0f} records/s")
    ratio = result["sustained_rate"] / raw_rate
    print(f"spark connector, availableNow, one shot: {result['one_shot_rate']:,.0f} records/s "
          f"({result['wall_s']:.1f} s wall, includes warm-up)")  # fmt: skip
    print(f"spark connector, sustained after the first batch: {result['sustained_rate']:,.0f} "
          f"records/s = {ratio:.2f} × raw (goal ≥ {GOAL_RATIO}): "
          f"{'met' if ratio >= GOAL_RATIO else 'NOT met'}")  # fmt: skip
    median = reads["epoch_read_s_median"]
    print(f"an epoch's read of {reads['epoch_read_records']} records (median of "
          f"{EPOCH_ROUNDS - 1}): {median['default']:.3f} s with the consumer's defaults, "
          f"{median['falkirk']:.3f} s with falkirk's READ_OPTIONS "
          f"({reads['epoch_read_ratio']:.2f}×)")
    return {
        "records": records,
        "produce_rate": produce_rate,
        "raw_rate": raw_rate,
        **result,
        **reads,
        "ratio": ratio,
        "goal_met": ratio >= GOAL_RATIO,
    }


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
