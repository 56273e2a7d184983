"""The seeded generator: determinism, the shape of its stream, and its ground truth.

No broker is needed except by the one test marked slow, which checks that records land
where the ground truth assumes (partition and offset).
"""

from __future__ import annotations

import argparse
import json
from collections import Counter

import pytest
from kafka.partitioner.default import murmur2
from pyspark.sql import functions as F

from falkirk.io.kafka import source_schema
from falkirk.model.schemas import ddl, definition
from falkirk.model.topology import load_pipeline
from falkirk_dev import generate as G

ROOTS = load_pipeline("reference").schema_roots  # the reference app's record schemas

ORIGIN = G.DEFAULT_ORIGIN_MS
EPOCH_MS = 10_000
EPOCHS = 6
N = 6_000
FIELDS = [f["name"] for f in definition("records", "events", ROOTS)["fields"]]
PARAMS = dict(events=N, queries=600, users=120, items=80, categories=6, origin_ms=ORIGIN,
              epoch_ms=EPOCH_MS, epochs=EPOCHS, malformed_fraction=0.05)  # fmt: skip


@pytest.fixture(scope="module")
def generated() -> G.Generated:
    return G.generate_detailed(seed=11, late_fraction=0.02, **PARAMS)


def test_same_seed_same_records_and_another_seed_differs():
    a = G.generate(3, late_fraction=0.02, **PARAMS)
    assert a == G.generate(3, late_fraction=0.02, **PARAMS)
    assert a != G.generate(4, late_fraction=0.02, **PARAMS)
    events, queries = a
    assert len(events) == N and len(queries) == 600
    assert all(type(k) is bytes and type(v) is bytes and type(ts) is int for k, v, ts in events)


def test_fractions_and_shape_of_the_stream(generated):
    g = generated
    assert 0.04 * N < sum(g.malformed.values()) < 0.06 * N
    assert set(g.malformed) == set(G.MALFORMED_VARIANTS)
    assert 0.015 * N < g.late < 0.025 * N
    assert 0.07 * 600 < g.unknown_user_queries < 0.13 * 600

    valid = []  # well-formed events (what the malformed variants break, checked simply)
    for key, value, ts in g.events:
        try:
            e = json.loads(value)
        except ValueError:
            continue
        if (set(e) == set(FIELDS) and type(e["user_id"]) is type(e["item_id"]) is int
                and type(e["ts"]) is int and type(e["amount"]) is float
                and e["kind"] in G.KINDS and e["amount"] >= 0
                and (e["kind"] == "purchase") == (e["amount"] > 0)):  # fmt: skip
            valid.append((e, key, ts))
    assert len(valid) == N - sum(g.malformed.values())
    kinds = Counter(e["kind"] for e, _, _ in valid)
    n = sum(kinds[k] for k in G.KINDS)
    assert abs(kinds["view"] / n - 0.6) < 0.03
    assert abs(kinds["click"] / n - 0.3) < 0.03
    assert abs(kinds["purchase"] / n - 0.1) < 0.02
    for e, key, ts in valid:
        assert e["ts"] == ts  # the Kafka timestamp is the event time
        assert key == str(e["user_id"]).encode()
        assert e["category"] == f"c{e['item_id'] % 6}"
        assert e["amount"] == (G.price_of(e["item_id"]) if e["kind"] == "purchase" else 0.0)

    # time: every epoch has events; non-decreasing except the late records, each of
    # which is in an earlier epoch than its partition had reached
    assert sorted(g.events_per_epoch) == list(range(EPOCHS))
    assert min(g.events_per_epoch.values()) > N / EPOCHS / 2
    reached = [-1, -1, -1]
    late = 0
    previous = ORIGIN
    for key, _, ts in g.events:
        p = (murmur2(key) & 0x7FFFFFFF) % 3
        k = (ts - ORIGIN) // EPOCH_MS
        assert 0 <= k < EPOCHS
        if ts < previous:
            late += 1
            assert k < reached[p]
        else:
            previous = ts
        reached[p] = max(reached[p], k)
    assert late == g.late
    assert [ts for _, _, ts in g.queries] == sorted(ts for _, _, ts in g.queries)
    event_users = {k for k, _, _ in g.events}
    unknown = sum(1 for k, _, _ in g.queries if k not in event_users)
    assert unknown >= g.unknown_user_queries


def test_value_schema_and_origin_parsing():
    assert ddl("records", "events", ROOTS) == (
        "event_id string, user_id long, item_id long, category string, kind string, "
        "amount double, ts long"
    )
    assert ddl("records", "queries", ROOTS) == "query_id string, user_id long, ts long"
    assert G.parse_origin("2024-01-01T00:00:00Z") == 1_704_067_200_000
    assert G.parse_origin("2024-01-01T01:00:00+01:00") == 1_704_067_200_000
    assert G.parse_origin("2024-01-01 00:00:01") == 1_704_067_201_000  # UTC without a zone
    assert G.parse_origin("1704067200000") == G.parse_origin(None) == 1_704_067_200_000
    with pytest.raises(ValueError, match="neither"):
        G.parse_origin("yesterday")


def test_cli_without_a_broker_prints_a_summary(capsys):
    args = argparse.Namespace(seed=1, events=500, queries=50, users=20, items=10, categories=3,
                              epochs=5, epoch_seconds=2, origin="2024-01-01T00:00:00Z",
                              malformed=0.1, late=0.02, rate=None, bootstrap="-")  # fmt: skip
    assert G.cli(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["events"] == 500 and out["queries"] == 50 and out["epoch_ms"] == 2_000
    assert sum(out["events_per_epoch"].values()) == 500
    assert out["malformed"] == sum(out["malformed_by_variant"].values()) > 0


# --- ground truth against the ingest validation --------------------------------------------

TYPES = {"string": (str,), "long": (int,), "double": (float, int)}


def parse_like_the_source(value: bytes, fields: list[tuple[str, str]]) -> tuple[list, str | None]:
    """kafka_io.parse_values' rule, simply: typed fields, or all null and an error."""
    try:
        obj = json.loads(value)
    except ValueError:
        return [None] * len(fields), "value is not JSON"
    if not isinstance(obj, dict):
        return [None] * len(fields), "value is not a JSON object"
    out = []
    for name, typ in fields:
        x = obj.get(name)
        if x is not None and (isinstance(x, bool) or not isinstance(x, TYPES[typ])):
            return [None] * len(fields), f"field {name!r} is not a {typ}"
        out.append(float(x) if typ == "double" and x is not None else x)
    return out, None


def source_like(spark, records: list[G.Record], partitions: int = 3):
    """The records as the source would return them, with the epoch each is processed in:
    on its partition, the epoch of the largest timestamp at or before it."""
    value_ddl = ddl("records", "events", ROOTS)
    fields = [tuple(f.split()) for f in value_ddl.split(", ")]
    reached: dict[int, int] = {}
    offsets: Counter = Counter()
    rows = []
    for key, value, ts in records:
        p = (murmur2(key) & 0x7FFFFFFF) % partitions
        reached[p] = max(reached.get(p, -1), (ts - ORIGIN) // EPOCH_MS)
        parsed, error = parse_like_the_source(value, fields)
        rows.append(("events", p, offsets[p], key.decode(), ts, value.decode(), *parsed, error,
                     reached[p]))  # fmt: skip
        offsets[p] += 1
    schema = source_schema(value_ddl).add("processing_epoch", "long")
    return spark.createDataFrame(rows, schema)


def test_ground_truth_is_what_validate_accepts_epoch_by_epoch(spark, generated):
    g = generated
    truth = G.ground_truth(spark, g.events, ORIGIN, EPOCH_MS)
    ingest = G._ingest()
    raw = source_like(spark, g.events).cache()
    for epoch in range(EPOCHS):
        events, dead = ingest.validate(
            raw.filter(F.col("processing_epoch") == epoch), epoch, ORIGIN, EPOCH_MS
        )
        accepted = dict(events.groupBy("kind").count().collect())
        assert accepted == truth.valid.get(epoch, {}), epoch
        assert dead.count() == sum(truth.dead_letters.get(epoch, {}).values()), epoch
    raw.unpersist()
    # conservation: every record is exactly one valid event or one dead letter, and the
    # dead letters are exactly the malformed and the late records
    assert truth.valid_total() + truth.dead_total() == N
    assert truth.dead_total("late") == g.late
    assert truth.dead_total() == g.late + sum(g.malformed.values())
    assert truth.dead_total("early") == 0
    assert truth.dead_total("negative amount") == g.malformed["negative_amount"]
    assert truth.dead_total("non-zero amount") == g.malformed["amount_on_non_purchase"]


@pytest.mark.slow
def test_records_land_where_the_ground_truth_assumes(broker):
    from kafka import KafkaConsumer, TopicPartition

    events, queries = G.generate(5, 400, 40, 30, 20, 4, ORIGIN, EPOCH_MS, 3, 0.05, 0.05)
    G.ensure_topics(broker.bootstrap, {"gen_events": 3, "gen_queries": 1})
    G.ensure_topics(broker.bootstrap, {"gen_events": 3})  # existing: fine
    with pytest.raises(ValueError, match="partitions"):
        G.ensure_topics(broker.bootstrap, {"gen_events": 2})
    sent = G.produce(broker.bootstrap, "gen_events", "gen_queries", events, queries, rate=2000)
    assert sum(sent["gen_events"].values()) == 400 and sent["gen_queries"] == {0: 40}

    placed = G.processing_epochs(events, ORIGIN, EPOCH_MS)
    expected = {(p, o): record for record, (p, o, _) in zip(events, placed, strict=True)}
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False)
    try:
        tps = [TopicPartition("gen_events", p) for p in range(3)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        got = []
        for _ in range(30):
            got += [r for batch in consumer.poll(1000).values() for r in batch]
            if len(got) >= 400:
                break
    finally:
        consumer.close()
    data = {(r.partition, r.offset): (r.key, r.value, r.timestamp) for r in got}
    assert data == expected
