"""The reference pipeline's input: a seeded, deterministic stream of events and queries.

The same arguments always give the same records, byte for byte, in the same production
order, so a run that was rolled back can be checked against the ground truth of the
stream (:func:`ground_truth`) and two runs can be compared record by record.

Records are ``(key, value, timestamp_ms)``: key ``str(user_id)`` (UTF-8), value a JSON
object (``schemas/records/events.json`` or ``queries.json``), timestamp the event time,
which is also the Kafka record timestamp: epochs are cut by Kafka record timestamps.

Event times are non-decreasing in production order over ``epochs`` epochs of
``epoch_ms`` from ``origin_ms``, except the LATE records, whose time lies in an epoch
before the one their partition has already reached. The cut this generator (and
:func:`ground_truth`) assumes: on each partition, epoch e takes the records from the
first whose timestamp reaches epoch e's start up to (excluding) the first whose
timestamp reaches epoch e + 1's start. So a record is processed in the epoch of the
largest timestamp at or before it on its partition, and a late record is read in a
later epoch than its own and dead-lettered by ingest as ``late``. Late records are only
placed where that holds (the partition is computed with the producer's own hash).

The input is bounded: once it is all produced, ``falkirk generate`` (and the harness)
declare the pipeline's input ended there (:mod:`falkirk.runtime.bounds`), so its last
epoch closes and its jobs end.
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import ModuleType
from typing import Any

from falkirk.io.kafka import CLIENT_CONFIG, ensure_topics

Record = tuple[bytes, bytes, int]  # (key, value, timestamp_ms)

EVENTS_TOPIC = "events"
QUERIES_TOPIC = "queries"
EVENT_PARTITIONS = 3
QUERY_PARTITIONS = 1

KINDS = ("view", "click", "purchase")
KIND_WEIGHTS = (0.6, 0.3, 0.1)
# Users u and items i with u ≡ i (mod communities) only: the interaction graph then
# has at least that many components, so communities (and their favourite categories)
# differ. Within one, components merge over the epochs as edges accrue.
DEFAULT_COMMUNITIES = 4
UNKNOWN_USER_FRACTION = 0.1  # of queries, from users that never appear in events
DEFAULT_ORIGIN_MS = 1_704_067_200_000  # 2024-01-01T00:00:00Z: fixed, so runs repeat

# How a malformed event is broken (chosen per record, uniformly).
MALFORMED_VARIANTS = (
    "bad_json",
    "missing_field",
    "wrong_type",
    "unknown_kind",
    "negative_amount",
    "amount_on_non_purchase",
)


def category_of(item_id: int, categories: int) -> str:
    """An item's category: a fixed function, so every event of an item agrees."""
    return f"c{item_id % categories}"


def price_of(item_id: int) -> float:
    """An item's price (1.00 to 100.99), fixed per item so revenues are reproducible."""
    return round(1.0 + (item_id * 7919 % 10_000) / 100, 2)


def partition_of(key: bytes, partitions: int) -> int:
    """The partition the producer's default partitioner sends a keyed record to."""
    from kafka.partitioner.default import murmur2

    return (murmur2(key) & 0x7FFFFFFF) % partitions


def epoch_of(ts: int, origin_ms: int, epoch_ms: int) -> int:
    """The epoch of a time: floor((ts - origin) / epoch_ms) (negative before the origin)."""
    return (ts - origin_ms) // epoch_ms


@dataclass
class Generated:
    """The records with what the generator did to them, for summaries and tests."""

    events: list[Record]
    queries: list[Record]
    malformed: Counter = field(default_factory=Counter)  # variant -> count
    late: int = 0
    unknown_user_queries: int = 0
    events_per_epoch: Counter = field(default_factory=Counter)  # by Kafka timestamp
    queries_per_epoch: Counter = field(default_factory=Counter)


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def _kind(u: float) -> str:
    acc = 0.0
    for kind, weight in zip(KINDS, KIND_WEIGHTS, strict=True):
        acc += weight
        if u < acc:
            return kind
    return KINDS[-1]


def _break(event: dict, variant: str, u: float) -> bytes:
    """A malformed value for ``event``; ``u`` picks the detail."""
    if variant == "bad_json":
        text = _dumps(event)
        return text[: max(1, int(len(text) * (0.2 + 0.6 * u)))]  # truncated: not JSON
    bad = dict(event)
    if variant == "missing_field":
        names = list(event)
        del bad[names[int(u * len(names))]]
    elif variant == "wrong_type":
        name, value = [("user_id", "abc"), ("item_id", 1.5), ("ts", "yesterday"),
                       ("amount", "12.00"), ("kind", 3)][int(u * 5)]  # fmt: skip
        bad[name] = value
    elif variant == "unknown_kind":
        bad["kind"] = ("refund", "like", "PURCHASE")[int(u * 3)]
    elif variant == "negative_amount":
        bad["kind"] = "purchase"
        bad["amount"] = -max(abs(event["amount"]), 1.0)
    elif variant == "amount_on_non_purchase":
        bad["kind"] = ("view", "click")[int(u * 2)]
        bad["amount"] = round(1.0 + 50 * u, 2)
    else:  # pragma: no cover - a programming error
        raise ValueError(f"unknown malformed variant {variant!r}")
    return _dumps(bad)


def generate_detailed(
    seed: int,
    events: int,
    queries: int,
    users: int,
    items: int,
    categories: int,
    origin_ms: int,
    epoch_ms: int,
    epochs: int,
    malformed_fraction: float,
    late_fraction: float = 0.01,
    partitions: int = EVENT_PARTITIONS,
    communities: int = DEFAULT_COMMUNITIES,
) -> Generated:
    """:func:`generate`, also saying which records are malformed or late (for summaries).

    Every event draws the same number of random values whatever becomes of it, so
    changing a fraction changes which records are broken but not the others' content.
    """
    if min(users, items, categories, epochs, epoch_ms, partitions, communities) < 1:
        raise ValueError(
            "users, items, categories, epochs, epoch_ms, partitions and communities must be ≥ 1"
        )
    clusters = min(communities, users, items)
    if not (0 <= malformed_fraction < 1 and 0 <= late_fraction < 1):
        raise ValueError("malformed_fraction and late_fraction must be in [0, 1)")
    rng = random.Random(seed)
    span = epochs * epoch_ms
    out = Generated(events=[], queries=[])

    # Late records are placed only after their partition reached epoch ≥ 1 (about
    # (epochs - 1)/epochs of the valid records), so scale the draw to hit the fraction.
    eligible = (1 - malformed_fraction) * (epochs - 1) / epochs
    late_p = min(1.0, late_fraction / eligible) if eligible > 0 else 0.0

    times = sorted(int(rng.random() * span) for _ in range(events))
    reached = [-1] * partitions  # per partition: the largest epoch of a timestamp so far
    for i, offset in enumerate(times):
        u_user, u_item, u_kind, u_bad, u_variant, u_detail, u_late, u_late_ts = (
            rng.random() for _ in range(8)
        )
        user = int(u_user * users)
        cluster = user % clusters
        in_cluster = (items - cluster + clusters - 1) // clusters  # items ≡ cluster mod clusters
        item = cluster + clusters * int(in_cluster * u_item * u_item)  # skewed to low ids
        kind = _kind(u_kind)
        ts = origin_ms + offset
        event = {
            "event_id": f"e{seed}-{i:08d}",
            "user_id": user,
            "item_id": item,
            "category": category_of(item, categories),
            "kind": kind,
            "amount": price_of(item) if kind == "purchase" else 0.0,
            "ts": ts,
        }
        key = str(user).encode()
        p = partition_of(key, partitions)
        if u_bad < malformed_fraction:
            variant = MALFORMED_VARIANTS[int(u_variant * len(MALFORMED_VARIANTS))]
            value = _break(event, variant, u_detail)
            out.malformed[variant] += 1
        elif reached[p] >= 1 and u_late < late_p:
            ts = origin_ms + (reached[p] - 1) * epoch_ms + int(u_late_ts * epoch_ms)
            event["ts"] = ts
            value = _dumps(event)
            out.late += 1
        else:
            value = _dumps(event)
        k = epoch_of(ts, origin_ms, epoch_ms)
        reached[p] = max(reached[p], k)
        out.events.append((key, value, ts))
        out.events_per_epoch[k] += 1

    qtimes = sorted(int(rng.random() * span) for _ in range(queries))
    for i, offset in enumerate(qtimes):
        u_unknown, u_user = rng.random(), rng.random()
        if u_unknown < UNKNOWN_USER_FRACTION:
            user = users + int(u_user * users)  # ids ≥ users never appear in events
            out.unknown_user_queries += 1
        else:
            user = int(u_user * users)
        ts = origin_ms + offset
        value = _dumps({"query_id": f"q{seed}-{i:08d}", "user_id": user, "ts": ts})
        out.queries.append((str(user).encode(), value, ts))
        out.queries_per_epoch[epoch_of(ts, origin_ms, epoch_ms)] += 1
    return out


def generate(*args: Any, **kwargs: Any) -> tuple[list[Record], list[Record]]:
    """``(event_records, query_records)`` of :func:`generate_detailed` (same arguments),
    each ``(key, value, timestamp_ms)`` in production order.

    Kinds are drawn view 60% / click 30% / purchase 10%; a purchase's amount is the
    item's fixed price, other kinds have 0.0. A ``malformed_fraction`` of events is
    broken (bad JSON, a missing field, a wrong type, an unknown kind, a negative amount,
    an amount on a non-purchase); about ``late_fraction`` are late (see the module doc).
    About 10% of queries come from users that never appear in events. Users only touch
    items of their own cluster (user ≡ item mod ``communities``), so there are several
    communities; items are skewed towards low ids within a cluster.
    """
    g = generate_detailed(*args, **kwargs)
    return g.events, g.queries


# --- producing to Kafka --------------------------------------------------------------


#: How long a record may wait for the broker before the producer gives it up (30 min).
DELIVERY_TIMEOUT_MS = 30 * 60 * 1000


#: How far ahead of its due time a paced producer may be before it sleeps.
PACE_SLICE_S = 0.005


def produce(
    bootstrap: str,
    topic_events: str,
    topic_queries: str,
    event_records: Sequence[Record],
    query_records: Sequence[Record],
    rate: float | None = None,
    on_acked: Callable[[int, datetime, Any], None] | None = None,
) -> dict[str, dict[int, int]]:
    """Send both streams, interleaved by time, with Kafka timestamps = record timestamps.

    Each stream keeps its production order (late records stay where they are); the
    producer's default partitioner places records by key hash, and the idempotent
    producer keeps each partition's order through retries. ``rate`` None sends as fast as
    the broker takes them, else about ``rate`` records per second in total. ``on_acked``
    is told ``(timestamp_ms, handed, record metadata)`` as the broker acknowledges each
    record (in the producer's thread), ``handed`` being when the record was handed to the
    producer: its due time at the rate, even when a broker down delays the acknowledgement.
    Returns ``{topic: {partition: records}}``; raises if any record was not acknowledged.
    """
    from kafka import KafkaProducer

    if rate is not None and rate <= 0:
        raise ValueError(f"rate must be > 0 records/s, got {rate}")
    merged = heapq.merge(
        ((ts, 0, i, topic_events, k, v) for i, (k, v, ts) in enumerate(event_records)),
        ((ts, 1, i, topic_queries, k, v) for i, (k, v, ts) in enumerate(query_records)),
    )
    producer = KafkaProducer(
        bootstrap_servers=bootstrap,
        client_id="falkirk-generate",
        acks="all",
        # 20 ms, paced or not: at 5,500 records/s batches of 5 ms cost the producer
        # noticeably more CPU a record, taken from the pipeline measured (CHANGELOG.md)
        linger_ms=20,
        batch_size=256 * 1024,
        # A live source keeps its records until the broker takes them. With the defaults
        # (120 s, reconnects backing off to 30 s) a burst of broker kills in the hour's
        # campaign expired a batch of 217 records and failed the run at its end.
        delivery_timeout_ms=DELIVERY_TIMEOUT_MS,
        **CLIENT_CONFIG,
    )
    sent: dict[str, dict[int, int]] = {topic_events: {}, topic_queries: {}}
    failed: list[BaseException] = []

    def acked(topic: str, meta: Any) -> None:  # in the producer's thread
        per = sent[topic]
        per[meta.partition] = per.get(meta.partition, 0) + 1

    try:
        start = time.monotonic()
        for n, (ts, _, _, topic, key, value) in enumerate(merged):
            if rate is not None:
                # paced in slices of a few ms, not a sleep per record: at 5,500 records/s
                # the sleeps alone took a good part of a core from the pipeline measured
                ahead = start + n / rate - time.monotonic()
                if ahead > PACE_SLICE_S:
                    time.sleep(ahead)
            future = producer.send(topic, key=key, value=value, timestamp_ms=ts)
            future.add_callback(acked, topic)
            future.add_errback(failed.append)
            if on_acked is not None:
                future.add_callback(on_acked, ts, datetime.now(UTC))
        producer.flush(timeout=DELIVERY_TIMEOUT_MS / 1000)
    finally:
        producer.close()
    if failed:
        raise failed[0]  # the first send the broker did not acknowledge
    return sent


def sent_json(sent: dict[str, dict[int, int]]) -> dict[str, dict[str, int]]:
    """:func:`produce`'s counts as ``falkirk generate`` prints them (partitions as keys)."""
    return {t: {str(p): n for p, n in sorted(per.items())} for t, per in sent.items()}


# --- ground truth ----------------------------------------------------------------------


def processing_epochs(
    records: Sequence[Record], origin_ms: int, epoch_ms: int, partitions: int = EVENT_PARTITIONS
) -> list[tuple[int, int, int]]:
    """``(partition, offset, epoch processed in)`` per record, under the cut of the module doc.

    Offsets assume the records are the only ones on a fresh topic.
    """
    reached = [-(2**63)] * partitions
    next_offset = [0] * partitions
    out = []
    for key, _, ts in records:
        p = partition_of(key, partitions)
        reached[p] = max(reached[p], epoch_of(ts, origin_ms, epoch_ms))
        out.append((p, next_offset[p], reached[p]))
        next_offset[p] += 1
    return out


def _ingest() -> ModuleType:
    """The reference app's ``jobs/ingest.py`` (its validation is the ground truth's)."""
    from falkirk.model.topology import load_pipeline
    from falkirk.runtime.job import load_job

    return load_job(load_pipeline("reference").job_path("jobs/ingest.py"))


@dataclass(frozen=True)
class GroundTruth:
    """What ingest must accept and reject, per epoch it is processed in."""

    valid: dict[int, dict[str, int]]  # epoch -> kind -> valid events
    dead_letters: dict[int, dict[str, int]]  # epoch -> reason kind -> dead letters

    def valid_total(self, kind: str | None = None) -> int:
        return sum(n for per in self.valid.values() for k, n in per.items() if kind in (None, k))

    def dead_total(self, reason: str | None = None) -> int:
        return sum(
            n for per in self.dead_letters.values() for r, n in per.items() if reason in (None, r)
        )

    def to_json(self) -> dict:
        return {
            "valid": {str(e): v for e, v in sorted(self.valid.items())},
            "dead_letters": {str(e): v for e, v in sorted(self.dead_letters.items())},
        }


def source_frame(
    spark,
    records: Sequence[Record],
    topic: str,
    origin_ms: int,
    epoch_ms: int,
    partitions: int = EVENT_PARTITIONS,
):
    """The event records as ``falkirk.io.kafka.read_range`` returns them (parsed by the
    same Spark expressions), plus ``processing_epoch``: the rows ingest sees."""
    import datetime as dt

    from pyspark.sql import functions as F

    from falkirk.io.kafka import parse_values

    placed = processing_epochs(records, origin_ms, epoch_ms, partitions)
    rows = [(k, v, topic, p, o, dt.datetime.fromtimestamp(ts / 1000, dt.UTC), 0, e)
            for (k, v, ts), (p, o, e) in zip(records, placed, strict=True)]
    raw = spark.createDataFrame(rows, "key binary, value binary, topic string, partition int, "
                                      "offset long, timestamp timestamp, timestampType int, "
                                      "processing_epoch long")
    parsed = parse_values(raw, _ingest().value_schema())
    epochs = raw.select("partition", "offset", "processing_epoch")
    return parsed.join(epochs, ["partition", "offset"]).select(*parsed.columns,
                                                                F.col("processing_epoch"))


def ground_truth(
    spark,
    event_records: Sequence[Record],
    origin_ms: int,
    epoch_ms: int,
    partitions: int = EVENT_PARTITIONS,
    topic: str = EVENTS_TOPIC,
) -> GroundTruth:
    """Valid events per epoch and kind, and dead letters per epoch and reason kind.

    Runs the ingest job's own validation (not a copy) over the records as the source
    would return them, each in the epoch the cut of the module doc processes it in, so
    a conservation check compares like with like.
    """
    from pyspark.sql import functions as F

    ingest = _ingest()
    df = source_frame(spark, event_records, topic, origin_ms, epoch_ms, partitions)
    events, dead = ingest.validate_at(df, F.col("processing_epoch"), origin_ms, epoch_ms)
    valid: dict[int, dict[str, int]] = {}
    for row in events.groupBy("epoch", "kind").count().collect():
        valid.setdefault(row["epoch"], {})[row["kind"]] = row["count"]
    rejected: dict[int, dict[str, int]] = {}
    reasons = dead.groupBy("epoch", ingest.reason_kind(F.col("reason")).alias("kind")).count()
    for row in reasons.collect():
        rejected.setdefault(row["epoch"], {})[row["kind"]] = row["count"]
    return GroundTruth(valid=valid, dead_letters=rejected)


# --- command line ------------------------------------------------------------------------


def parse_origin(value: str | int | None) -> int:
    """Milliseconds since 1970 from ms (``1704067200000``) or ISO 8601 (UTC if no zone)."""
    if value is None or value == "":
        return DEFAULT_ORIGIN_MS
    if isinstance(value, int):
        return value
    text = str(value).strip()
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"origin {value!r} is neither milliseconds nor an ISO 8601 time") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def _arg(args: argparse.Namespace, name: str, default: Any) -> Any:
    value = getattr(args, name, None)
    return default if value is None else value


def summary(g: Generated, origin_ms: int, epoch_ms: int) -> dict:
    """What was generated, in numbers (printed by :func:`cli`)."""
    origin = datetime.fromtimestamp(origin_ms / 1000, tz=UTC).isoformat()
    return {
        "events": len(g.events),
        "queries": len(g.queries),
        "malformed": sum(g.malformed.values()),
        "malformed_by_variant": dict(sorted(g.malformed.items())),
        "late": g.late,
        "unknown_user_queries": g.unknown_user_queries,
        "origin": origin,
        "origin_ms": origin_ms,
        "epoch_ms": epoch_ms,
        "events_per_epoch": {str(k): n for k, n in sorted(g.events_per_epoch.items())},
        "queries_per_epoch": {str(k): n for k, n in sorted(g.queries_per_epoch.items())},
    }


def from_args(args: argparse.Namespace) -> tuple[Generated, int, int]:
    """The records ``falkirk generate`` makes for these arguments, with origin and epoch ms
    (so a test can regenerate exactly what a run produced)."""
    origin_ms = parse_origin(getattr(args, "origin", None))
    epoch_ms = int(round(float(_arg(args, "epoch_seconds", 10)) * 1000))
    g = generate_detailed(
        seed=int(_arg(args, "seed", 7)),
        events=int(_arg(args, "events", 10_000)),
        queries=int(_arg(args, "queries", 1_000)),
        users=int(_arg(args, "users", 500)),
        items=int(_arg(args, "items", 200)),
        categories=int(_arg(args, "categories", 8)),
        origin_ms=origin_ms,
        epoch_ms=epoch_ms,
        epochs=int(_arg(args, "epochs", 10)),
        malformed_fraction=float(_arg(args, "malformed", 0.01)),
        late_fraction=float(_arg(args, "late", 0.01)),
        communities=int(_arg(args, "communities", DEFAULT_COMMUNITIES)),
    )
    return g, origin_ms, epoch_ms


def cli(args: argparse.Namespace) -> int:
    """``falkirk generate``: generate, create the topics if needed, produce.

    Fields: seed, events, queries, users, items, categories, epochs, epoch_seconds,
    origin (ISO or ms), malformed, late, rate (records/s, None = burst), bootstrap
    (None = the config's broker; "-" = generate and summarise only); optional
    communities, topic_events, topic_queries.
    """
    g, origin_ms, epoch_ms = from_args(args)
    info = summary(g, origin_ms, epoch_ms)
    bootstrap = getattr(args, "bootstrap", None)
    if bootstrap is None:
        from falkirk.config import load

        bootstrap = load().kafka_bootstrap
    if bootstrap != "-":
        topic_events = _arg(args, "topic_events", EVENTS_TOPIC)
        topic_queries = _arg(args, "topic_queries", QUERIES_TOPIC)
        ensure_topics(bootstrap, {topic_events: EVENT_PARTITIONS, topic_queries: QUERY_PARTITIONS})
        rate = getattr(args, "rate", None)
        started = time.monotonic()
        sent = produce(bootstrap, topic_events, topic_queries, g.events, g.queries,
                       rate=None if rate is None else float(rate))  # fmt: skip
        info["seconds"] = round(time.monotonic() - started, 3)
        info["bootstrap"] = bootstrap
        info["sent"] = sent_json(sent)
    print(json.dumps(info, indent=1))
    return 0

