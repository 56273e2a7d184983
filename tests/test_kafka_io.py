"""Kafka edges through Spark's Kafka connector, on the embedded Apache Kafka broker."""

from __future__ import annotations

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from falkirk.io.kafka import (
    KafkaIOError,
    end_offsets,
    produce,
    read_range,
    source_schema,
)
from falkirk.model.times import Offsets

pytestmark = pytest.mark.slow  # Spark and the broker

SCHEMA = "id string, n long, x double, ok boolean"


def send(bootstrap: str, topic: str, values: list[bytes | None], partition: int = 0) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    for i, v in enumerate(values):
        producer.send(topic, key=b"k%d" % i, value=v, partition=partition,
                      timestamp_ms=1_704_067_200_000 + i)
    producer.flush()
    producer.close()


@pytest.fixture(scope="module")
def malformed(broker):
    """One value of each kind a producer may send, on partition 0 of a fresh topic."""
    values = [
        b'{"id":"a","n":1,"x":2.5,"ok":true}',
        b'{"id":"b","n":"abc","x":1}',
        b"[1]",
        b'"x"',
        b"3",
        b"{not json",
        None,
        b'{"id":"c","n":1.5}',
        b'{"id":"d","n":99999999999999999999}',
        b'{"id":"e","extra":[1,2]}',
        b"\xff\xfe",
        b'{"id":"f","n":null}',
        b'{"id":"g","x":"12.00","ok":1}',
        b'{"id":"h","x":7}',
        b'{"id":5,"x":"NaN"}',
        b'{"id":true}',
    ]
    broker.create_topic("kio-malformed", 1)
    send(broker.bootstrap, "kio-malformed", values)
    return values


EXPECTED = [  # (id, n, x, ok, error) per offset
    ("a", 1, 2.5, True, None),
    (None, None, None, None, "field 'n' is not a long (got string \"abc\")"),
    (None, None, None, None, "value is a JSON array, not an object"),
    (None, None, None, None, "value is a JSON string, not an object"),
    (None, None, None, None, "value is a JSON number, not an object"),
    (None, None, None, None, "value is not JSON"),
    (None, None, None, None, "value is null (a tombstone), not a JSON object"),
    (None, None, None, None, "field 'n' is not a long (got number 1.5)"),
    (None, None, None, None, "field 'n' is not a long (got number 99999999999999999999)"),
    ("e", None, None, None, None),  # extra fields are ignored, missing ones are null
    (None, None, None, None, "value is not JSON"),  # not UTF-8
    ("f", None, None, None, None),  # JSON null: just null
    (None, None, None, None, "field 'x' is not a double (got string \"12.00\"); "
                             "field 'ok' is not a boolean (got number 1)"),
    ("h", None, 7.0, None, None),  # an integer is a double
    (None, None, None, None, "field 'x' is not a double (got string \"NaN\")"),
    ("true", None, None, None, None),  # a string field takes a scalar's text, as Spark does
]


def test_every_malformed_value_is_a_row_with_its_reason(spark, broker, malformed):
    df = read_range(spark, broker.bootstrap, "kio-malformed", Offsets(),
                    Offsets({"0": len(malformed)}), SCHEMA)
    assert df.schema.simpleString() == source_schema(SCHEMA).simpleString()
    rows = sorted(df.collect(), key=lambda r: r.offset)
    assert [r.offset for r in rows] == list(range(len(malformed)))
    assert [(r.id, r.n, r.x, r.ok, r.error) for r in rows] == EXPECTED
    first = rows[0]
    assert (first.topic, first.partition, first.key, first.timestamp) == (
        "kio-malformed", 0, "k0", 1_704_067_200_000)
    assert rows[6].value is None and rows[5].value == "{not json"
    assert rows[10].value == "\ufffd\ufffd"  # not UTF-8: readable, each bad byte marked


def test_exactly_the_offset_range_of_each_partition(spark, broker):
    broker.create_topic("kio-range", 3)
    for p in range(3):
        send(broker.bootstrap, "kio-range", [b'{"id":"%d-%d"}' % (p, i) for i in range(10)], p)
    start, end = Offsets({"0": 2, "1": 0, "2": 5}), Offsets({"0": 7, "1": 0, "2": 10})
    df = read_range(spark, broker.bootstrap, "kio-range", start, end, "id string")
    got = sorted((r.partition, r.offset, r.id) for r in df.collect())
    assert got == [(0, o, f"0-{o}") for o in range(2, 7)] + [(2, o, f"2-{o}") for o in
                                                             range(5, 10)]
    empty = read_range(spark, broker.bootstrap, "kio-range", end, end, "id string")
    assert empty.count() == 0
    assert empty.schema.simpleString() == source_schema("id string").simpleString()
    with pytest.raises(KafkaIOError, match="partition 0: range ends at 2 before it starts"):
        read_range(spark, broker.bootstrap, "kio-range", end, start, None)


def test_a_bounded_input_cuts_its_last_epochs_at_the_bound_and_then_ends(broker):
    """No record marks the end: the declared bound (the topic's end offsets once all is
    produced) closes the epochs with no later record, caps every cut, and ends the input;
    without a bound the same cut waits (a continuous run)."""
    from falkirk.runtime.connectors import KafkaCut

    broker.create_topic("kio-bound", 2)
    send(broker.bootstrap, "kio-bound", [b"a", b"b", b"c"], partition=0)  # ts +0, +1, +2 ms
    send(broker.bootstrap, "kio-bound", [b"d"], partition=1)
    bound = Offsets(end_offsets(broker.bootstrap, "kio-bound"))
    assert bound == Offsets({"0": 3, "1": 1})
    with pytest.raises(KafkaIOError, match="topic 'nowhere' does not exist"):
        end_offsets(broker.bootstrap, "nowhere")
    cut = KafkaCut(broker.bootstrap, "kio-bound")
    try:
        t0 = 1_704_067_200_000
        assert cut.cut(t0 + 2) is None  # partition 1 has nothing at or after +2 ms yet
        assert cut.cut(t0 + 2, bound) == Offsets({"0": 2, "1": 1})
        assert cut.cut(t0 + 10_000, bound) == bound
        send(broker.bootstrap, "kio-bound", [b"late"], partition=1)  # after the bound
        assert cut.cut(t0 + 10_000, bound) == bound  # never past it
        assert not cut.ended(Offsets({"0": 3}), bound)
        assert cut.ended(bound, bound) and not cut.ended(bound, None)
    finally:
        cut.close()


def test_a_job_starting_while_the_broker_is_down_waits_for_it(tmp_path, caplog):
    """A job cuts its input topic from its start (KafkaCut). The campaign under Airflow
    killed the broker as ingest started: kafka-python gave up bootstrapping after 30 s
    and the job died. Its first attempt now fails (the broker stays down until it did)
    and is asked again, like every later question to the broker."""
    import logging
    import threading
    import time

    from falkirk.local.broker import LocalBroker, free_port
    from falkirk.runtime.connectors import KafkaCut

    caplog.set_level(logging.WARNING, logger="falkirk.io.kafka")
    with LocalBroker(tmp_path / "b", port=free_port()) as b:
        b.create_topic("kio-down", 2)
        b.kill()
        made: list[KafkaCut] = []
        failed: list[BaseException] = []

        def start() -> None:
            try:
                made.append(KafkaCut(b.bootstrap, "kio-down"))
            except BaseException as e:  # noqa: BLE001 - the test reports it
                failed.append(e)

        job = threading.Thread(target=start)
        job.start()
        deadline = time.monotonic() + 120
        while not failed and time.monotonic() < deadline and not any(
                "broker not answering" in r.getMessage() for r in caplog.records):
            time.sleep(0.2)  # the first attempt to end, not a timing guess
        b.start()
        job.join(timeout=180)
    assert failed == [] and made, failed
    assert sorted(tp.partition for tp in made[0].tps) == [0, 1]
    made[0].consumer.close()


def test_a_big_range_is_read_in_tasks_of_a_bounded_size(spark, broker):
    """A catch-up pass's range is split into Spark tasks of at most
    ``maxRecordsPerPartition`` records, so the engine's scheduler can give other jobs'
    tasks a core between them; every record is read once."""
    from pyspark.sql import functions as F

    from falkirk.io.kafka import READ_OPTIONS

    bound = int(READ_OPTIONS["maxRecordsPerPartition"])
    broker.create_topic("kio-big", 1)
    send(broker.bootstrap, "kio-big", [b'{"id":"%d"}' % i for i in range(2 * bound + 5)], 0)
    df = read_range(spark, broker.bootstrap, "kio-big", Offsets({"0": 0}),
                    Offsets({"0": 2 * bound + 5}), "id string")
    tasks = df.groupBy(F.spark_partition_id().alias("task")).count().collect()
    assert len(tasks) == 3 and max(r["count"] for r in tasks) <= bound
    assert df.select("offset").distinct().count() == 2 * bound + 5


def test_produce_sends_every_row_and_counts_them(spark, broker):
    broker.create_topic("kio-out", 2)
    df = spark.createDataFrame([(f"k{i}", f"v{i}") for i in range(50)], "key string, value string")
    headers = {"falkirk-generation": "2", "falkirk-epoch": "7"}
    assert produce(df, broker.bootstrap, "kio-out", headers) == {-1: 50}
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, consumer_timeout_ms=3000,
                             auto_offset_reset="earliest", enable_auto_commit=False)
    consumer.assign([TopicPartition("kio-out", p) for p in (0, 1)])
    records = list(consumer)
    consumer.close()
    got = sorted((r.key.decode(), r.value.decode()) for r in records)
    assert got == sorted((f"k{i}", f"v{i}") for i in range(50))
    assert {tuple((k, v.decode()) for k, v in r.headers) for r in records} == {
        (("falkirk-generation", "2"), ("falkirk-epoch", "7"))}  # on every record
    with pytest.raises(KafkaIOError, match="must have columns key, value"):
        produce(df.select("value"), broker.bootstrap, "kio-out")


def test_a_failed_send_fails_the_write(spark, tmp_path):
    """No broker answers: the write raises (the epoch fails before its input is
    acknowledged) instead of dropping records."""
    from falkirk.local.broker import free_port

    df = spark.createDataFrame([("k", "v")], "key string, value string")
    with pytest.raises(Exception, match="(?i)timeout|timed out|not present in metadata"):
        (df.write.format("kafka").option("kafka.bootstrap.servers", f"127.0.0.1:{free_port()}")
         .option("topic", "nowhere").option("kafka.max.block.ms", "2000").save())


def test_bad_record_schemas_are_refused(spark):
    with pytest.raises(KafkaIOError, match="field 'tags' has type array<string>"):
        source_schema("id string, tags array<string>")
    with pytest.raises(KafkaIOError, match="'offset' clashes with a source column"):
        source_schema("offset long")


def test_a_pass_of_epochs_is_sent_in_one_write_each_record_with_its_epoch(spark, broker):
    """A pass of several epochs: one write, each record's epoch header from its row, the
    count per epoch observed as it is sent (the pass column itself is not sent)."""
    from pyspark.sql import functions as F

    broker.create_topic("kio-pass", 1)
    df = spark.createDataFrame([(f"k{i}", f"v{i}", 3 + i % 2) for i in range(9)],
                               "key string, value string, falkirk_epoch long")
    counts = produce(df, broker.bootstrap, "kio-pass",
                     {"falkirk-epoch": F.col("falkirk_epoch").cast("string")},
                     by=("falkirk_epoch", [3, 4, 5]))
    assert counts == {3: 5, 4: 4, 5: 0}
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, consumer_timeout_ms=3000,
                             auto_offset_reset="earliest", enable_auto_commit=False)
    consumer.assign([TopicPartition("kio-pass", 0)])
    records = list(consumer)
    consumer.close()
    assert sorted((r.key.decode(), dict(r.headers)["falkirk-epoch"].decode())
                  for r in records) == sorted((f"k{i}", str(3 + i % 2)) for i in range(9))
