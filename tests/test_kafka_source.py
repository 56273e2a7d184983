"""The falkirk_kafka streaming source against a real local broker and local[2] Spark."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition

from falkirk.kafka_source import (
    KafkaDataSource,
    KafkaSourceError,
    _ValueParser,
    batch_offsets,
    commit_group_offsets,
    dump_offsets,
    parse_value_schema,
    share_limit,
    split_ranges,
)
from falkirk.times import EpochRange, EpochRanges, Offsets

SCHEMA = "event_id string, user_id long, kind string, amount double, ts long"
WORKER = Path(__file__).with_name("kafka_sink_worker.py")


def event(i: int) -> bytes:
    return json.dumps(
        {
            "event_id": f"e{i:08d}",
            "user_id": i % 1009,
            "kind": ("view", "click", "buy")[i % 3],
            "amount": round(i * 0.37, 2),
            "ts": 1_700_000_000_000 + i,
        }
    ).encode()


def produce(bootstrap: str, topic: str, records: list[tuple[str | None, bytes | None]]):
    """Send keyed records; returns {(partition, offset): (key, value)} as the broker stored them."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, batch_size=256 * 1024)
    futures = [
        (key, value, producer.send(topic, key=None if key is None else key.encode(), value=value))
        for key, value in records
    ]
    producer.flush()
    sent = {}
    for key, value, future in futures:
        meta = future.get(timeout=30)
        sent[(meta.partition, meta.offset)] = (key, None if value is None else value.decode())
    producer.close()
    return sent


def end_offsets(bootstrap: str, topic: str) -> Offsets:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        tps = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic)]
        return Offsets({str(tp.partition): o for tp, o in consumer.end_offsets(tps).items()})
    finally:
        consumer.close()


def stream(spark, broker, topic: str, **options: str | int):
    reader = (
        spark.readStream.format("falkirk_kafka")
        .option("bootstrap", broker.bootstrap)
        .option("topic", topic)
    )
    for key, value in options.items():
        reader = reader.option(key, str(value))
    return reader.load()


@pytest.fixture(scope="module")
def kspark(spark):
    spark.dataSource.register(KafkaDataSource)
    return spark


# --- pure functions (no Spark, no broker) ------------------------------------------------


def test_share_limit_is_fair_bounded_and_makes_progress():
    assert share_limit({"0": 100, "1": 100, "2": 100}, 90) == {"0": 30, "1": 30, "2": 30}
    # a short partition leaves its share to the others
    assert share_limit({"0": 5, "1": 100, "2": 100}, 90) == {"0": 5, "1": 42, "2": 43}
    assert share_limit({"0": 0, "1": 7}, 1000) == {"0": 0, "1": 7}
    # a limit smaller than the partition count still moves on
    assert sum(share_limit({"0": 9, "1": 9, "2": 9}, 2).values()) == 2
    for avail, limit in [({"0": 3, "1": 50, "2": 1, "3": 0}, 20), ({"0": 10**6}, 7)]:
        take = share_limit(avail, limit)
        assert sum(take.values()) == min(limit, sum(avail.values()))
        assert all(0 <= take[p] <= avail[p] for p in avail)


def test_split_ranges_tiles_each_range_into_the_wanted_task_count():
    ranges = [(0, 0, 100), (1, 10, 110), (2, 50, 150), (3, 7, 7)]
    assert split_ranges(ranges) == ranges[:3]  # one task per non-empty partition
    for wanted in (4, 5, 6, 9, 50):
        pieces = split_ranges(ranges, wanted)
        assert len(pieces) == wanted
        assert not any(q == 3 for q, _, _ in pieces)  # the empty range has no task
        for p, s, e in ranges[:3]:
            mine = sorted((a, b) for q, a, b in pieces if q == p)
            ends = [s] + [b for _, b in mine]
            assert [a for a, _ in mine] == ends[:-1] and ends[-1] == e  # no gap, no overlap
            assert all(b > a for a, b in mine)
    assert split_ranges([(0, 0, 2)], 5) == [(0, 0, 1), (0, 1, 2)]  # never an empty piece


def test_offsets_serialise_sorted_and_parse_from_progress():
    assert json.dumps(dump_offsets({10: 1, 2: 5, "1": 0})) == '{"1": 0, "2": 5, "10": 1}'
    progress = {
        "batchId": 4,
        "sources": [{"startOffset": '{"0": 3, "1": 0}', "endOffset": '{"0": 9, "1": 2}'}],
    }
    assert batch_offsets(progress) == (4, Offsets({"0": 3}), Offsets({"0": 9, "1": 2}))
    first = {"batchId": 0, "sources": [{"startOffset": "null", "endOffset": '{"0": 1}'}]}
    assert batch_offsets(first, initial=Offsets({"0": 0})) == (0, Offsets(), Offsets({"0": 1}))


def test_value_schema_parsing_rejects_what_it_cannot_type():
    schema = parse_value_schema(SCHEMA)
    assert schema.simpleString() == (
        "struct<event_id:string,user_id:bigint,kind:string,amount:double,ts:bigint>"
    )
    with pytest.raises(KafkaSourceError, match="'tags' has type 'array<string>'"):
        parse_value_schema("id string, tags array<string>")
    with pytest.raises(KafkaSourceError, match="'offset' clashes"):
        parse_value_schema("offset long")


def test_value_parser_types_and_errors():
    parser = _ValueParser(parse_value_schema("id string, n long, x double, ok boolean"))
    values = [
        b'{"id": "a", "n": 1, "x": 2.5, "ok": true}',
        b'{"id": "b", "n": 2, "x": 3}',  # int for a double is fine; missing ok is null
        b"not json",
        b"[1, 2]",
        b'{"id": 7, "n": "2"}',
        b'{"n": 1.5}',
        b'{"n": 9223372036854775808}',
        b'{"x": true}',
        b"\xff\xfe{",
        None,
    ]
    columns, errors = parser.parse(values)
    ids, ns, xs, oks = columns
    assert errors[:2] == [None, None]
    assert (ids[:2], ns[:2], xs[:2], oks[:2]) == (["a", "b"], [1, 2], [2.5, 3.0], [True, None])
    assert type(xs[1]) is float
    assert errors[2].startswith("value is not JSON")
    assert errors[3] == "value is a JSON array, not an object"
    assert "field 'id' is not a string (got integer 7)" in errors[4]
    assert "field 'n' is not a long (got string \"2\")" in errors[4]
    assert errors[5] == "field 'n' is not a long (got number 1.5)"
    assert errors[6] == "field 'n' is out of the long range (9223372036854775808)"
    assert errors[7] == "field 'x' is not a double (got boolean true)"
    assert errors[8].startswith("value is not JSON")
    assert errors[9].startswith("value is null")
    for col in columns:  # a malformed record keeps no partial typed values
        assert col[2:] == [None] * 8
    # the compiled fast path and parse_one agree, whichever record comes first
    for v in values:
        row, problem = parser.parse_one(v)
        assert parser.parse([v]) == ([[x] for x in row], [problem]), v


# --- against the broker and Spark ---------------------------------------------------------


@pytest.mark.slow
def test_available_now_reads_every_record_once_in_tiling_batches(kspark, broker):
    topic = "tiles"
    broker.create_topic(topic, 3)
    n, limit = 20_000, 3_000
    sent = produce(broker.bootstrap, topic, [(f"user-{i % 997}", event(i)) for i in range(n)])
    assert {p for p, _ in sent} == {0, 1, 2}

    query = (
        stream(kspark, broker, topic, maxRecordsPerBatch=limit, valueSchema=SCHEMA)
        .writeStream.format("memory")
        .queryName("tiles")
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(300)
    assert query.exception() is None

    rows = kspark.table("tiles").select("partition", "offset", "key", "value", "error").collect()
    assert len(rows) == n
    assert {(r.partition, r.offset): (r.key, r.value) for r in rows} == sent
    assert all(r.error is None for r in rows)

    progress = {p["batchId"]: p for p in query.recentProgress if p["numInputRows"] > 0}
    batches = [batch_offsets(progress[b]) for b in sorted(progress)]
    assert len(batches) >= -(-n // limit)
    ranges = EpochRanges(EpochRange(b, s, e) for b, s, e in batches)  # raises on gap/overlap
    assert batches[0][1] == Offsets()
    assert ranges.offsets_of(batches[-1][0]) == end_offsets(broker.bootstrap, topic)
    for b, start, end in batches:
        size = sum(end.get(p) - start.get(p) for p in ("0", "1", "2"))
        assert size == progress[b]["numInputRows"] <= limit


@pytest.mark.slow
def test_malformed_records_are_kept_with_an_error(kspark, broker):
    topic = "malformed"
    broker.create_topic(topic, 1)
    good = b'{"event_id": "g", "user_id": 1, "kind": "view", "amount": 1, "ts": 5}'
    records = [
        ("good", good),
        ("missing", b'{"event_id": "m"}'),
        ("text", b"hello"),
        ("array", b"[1]"),
        ("wrong", b'{"event_id": "w", "user_id": "12", "amount": "x"}'),
        ("tombstone", None),
    ]
    produce(broker.bootstrap, topic, records)
    query = (
        stream(kspark, broker, topic, valueSchema=SCHEMA)
        .writeStream.format("memory")
        .queryName("malformed")
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(300)
    rows = {r.key: r for r in kspark.table("malformed").collect()}
    assert set(rows) == {k for k, _ in records}

    assert rows["good"].error is None
    assert (rows["good"].user_id, rows["good"].amount) == (1, 1.0)
    assert rows["missing"].error is None  # missing fields are null, not errors
    assert (rows["missing"].event_id, rows["missing"].user_id) == ("m", None)
    assert rows["text"].error.startswith("value is not JSON")
    assert rows["text"].value == "hello"
    assert rows["array"].error == "value is a JSON array, not an object"
    assert "field 'user_id' is not a long" in rows["wrong"].error
    assert "field 'amount' is not a double" in rows["wrong"].error
    assert rows["wrong"].event_id is None  # no partial record
    assert rows["tombstone"].error.startswith("value is null")
    assert rows["tombstone"].value is None


@pytest.mark.slow
def test_starting_offsets_and_processing_time_trigger_see_new_records(kspark, broker):
    topic = "starting"
    broker.create_topic(topic, 3)
    sent = produce(broker.bootstrap, topic, [(f"k{i}", event(i)) for i in range(300)])
    starting = {"0": 10, "2": 5}  # partition 1 is not listed: it starts at 0
    query = (
        stream(
            kspark,
            broker,
            topic,
            startingOffsets=json.dumps(starting),
            maxRecordsPerBatch=50,
            minPartitions=4,  # partition ranges are also split into sub-range tasks
        )
        .writeStream.format("memory")
        .queryName("starting")
        .trigger(processingTime="200 milliseconds")
        .start()
    )

    def wait_for(expected: set) -> set:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            got = [(r.partition, r.offset) for r in kspark.table("starting").collect()]
            if len(got) >= len(expected):
                return got
            assert query.exception() is None
            time.sleep(0.5)
        raise AssertionError(f"only {len(got)} of {len(expected)} records arrived")

    try:
        expected = {(p, o) for p, o in sent if o >= starting.get(str(p), 0)}
        got = wait_for(expected)
        assert len(got) == len(set(got)) and set(got) == expected
        more = produce(broker.bootstrap, topic, [(f"k{i}", event(i)) for i in range(300, 400)])
        expected |= set(more)
        got = wait_for(expected)
        assert len(got) == len(set(got)) and set(got) == expected
    finally:
        query.stop()


@pytest.mark.slow
def test_bad_options_fail_clearly(kspark, broker):
    with pytest.raises(Exception, match="does not exist"):
        stream(kspark, broker, "no-such-topic").writeStream.format("noop").trigger(
            availableNow=True
        ).start().awaitTermination(120)
    broker.create_topic("opts", 2)
    with pytest.raises(Exception, match=r"partitions \['5'\]"):
        stream(kspark, broker, "opts", startingOffsets='{"5": 0}').writeStream.format(
            "noop"
        ).trigger(availableNow=True).start().awaitTermination(120)


@pytest.mark.slow
def test_commit_group_offsets(broker):
    topic = "gc"
    broker.create_topic(topic, 3)
    produce(broker.bootstrap, topic, [(f"k{i}", b"{}") for i in range(30)])
    commit_group_offsets(broker.bootstrap, topic, "falkirk-gc-test", Offsets({"0": 4, "2": 1}))
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        committed = admin.list_group_offsets({"falkirk-gc-test": None})["falkirk-gc-test"]
    finally:
        admin.close()
    assert {tp.partition: m.offset for tp, m in committed.items() if tp.topic == topic} == {
        0: 4,
        2: 1,
    }


# --- kill -9 the driver mid-stream, restart from the checkpoint ---------------------------


def _complete_batches(out: Path) -> list[Path]:
    return sorted(d for d in out.glob("batch_*") if (d / "_SUCCESS").exists())


def _worker(broker, topic: str, tmp: Path, trigger: str) -> subprocess.Popen:
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
    log = open(tmp / f"worker-{trigger}.log", "ab")  # noqa: SIM115 - closed by the OS at exit
    return subprocess.Popen(
        [
            sys.executable,
            str(WORKER),
            "--bootstrap",
            broker.bootstrap,
            "--topic",
            topic,
            "--checkpoint",
            str(tmp / "checkpoint"),
            "--out",
            str(tmp / "out"),
            "--max-records",
            "1000",
            "--value-schema",
            SCHEMA,
            "--trigger",
            trigger,
        ],  # fmt: skip
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # SIGKILL the whole driver: Python, JVM and Python workers
        env=env,
    )


@pytest.mark.slow
def test_kill_and_restart_delivers_every_record_exactly_once(broker, tmp_path):
    topic = "killed"
    broker.create_topic(topic, 3)
    sent = produce(broker.bootstrap, topic, [(f"u{i % 101}", event(i)) for i in range(20_000)])
    out = tmp_path / "out"

    first = _worker(broker, topic, tmp_path, "processingTime")
    in_flight = out / "batch_000003"  # made when batch 3's write starts, before Spark commits it
    try:
        deadline = time.monotonic() + 180
        while not in_flight.exists():
            assert first.poll() is None, (tmp_path / "worker-processingTime.log").read_text()
            assert time.monotonic() < deadline, "the worker did not reach batch 3 in 180 s"
            time.sleep(0.01)
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    planned = {
        int(f.name) for f in (tmp_path / "checkpoint" / "offsets").iterdir() if f.name.isdigit()
    }
    committed = {
        int(f.name) for f in (tmp_path / "checkpoint" / "commits").iterdir() if f.name.isdigit()
    }
    assert 3 in planned and 3 not in committed, "batch 3 was not in flight when killed"
    written = sum(pq.read_table(d).num_rows for d in _complete_batches(out))
    assert written < len(sent), "the worker finished before it was killed: not mid-stream"

    # new records arrive while the pipeline is down
    sent |= produce(
        broker.bootstrap, topic, [(f"u{i % 101}", event(i)) for i in range(20_000, 21_000)]
    )

    second = _worker(broker, topic, tmp_path, "availableNow")
    assert second.wait(timeout=300) == 0, (tmp_path / "worker-availableNow.log").read_text()

    batches = _complete_batches(out)
    assert [int(d.name.split("_")[1]) for d in batches] == list(range(len(batches)))
    tables = [pq.read_table(d, columns=["partition", "offset", "key", "value"]) for d in batches]
    got = [
        (p, o, k, v)
        for t in tables
        for p, o, k, v in zip(*(t.column(c).to_pylist() for c in t.column_names), strict=True)
    ]
    assert len(got) == len(sent)  # no duplicates ...
    assert {(p, o): (k, v) for p, o, k, v in got} == sent  # ... and nothing lost

    # each batch took a contiguous range per partition, and the ranges tile the topic
    position = {0: 0, 1: 0, 2: 0}
    for t in tables:
        assert t.num_rows <= 1000  # maxRecordsPerBatch
        taken: dict[int, list[int]] = {}
        for p, o in zip(*(t.column(c).to_pylist() for c in ("partition", "offset")), strict=True):
            taken.setdefault(p, []).append(o)
        for p, offsets in taken.items():
            assert sorted(offsets) == list(range(position[p], position[p] + len(offsets)))
            position[p] += len(offsets)
    assert Offsets({str(p): o for p, o in position.items()}) == end_offsets(broker.bootstrap, topic)
