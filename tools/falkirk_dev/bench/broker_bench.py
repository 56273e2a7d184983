"""Broker restart benchmark: from a SIGKILL of the embedded broker to its clients' answers.

Run: ``falkirk bench broker`` (``--events N``: kills per setting, default 4). The fault
campaign kills the broker every few minutes; every job waits for it before its next cut.
Two settings, one after the other in one run, each on a fresh broker:

* ``defaults``: Kafka's controller lease (``broker.session.timeout.ms`` 9 s) and
  kafka-python's clients as they come (reconnects backing off to 30 s, a question
  waiting up to its 30 s request timeout);
* ``falkirk``: :class:`falkirk.local.broker.LocalBroker` as it ships, with clients made
  with :data:`falkirk.io.kafka.CLIENT_CONFIG` and :data:`~falkirk.io.kafka.QUESTION_TIMEOUT_MS`.

Per kill: seconds until the restarted broker answers metadata (``restart``), until a
consumer kept from before the kill answers a cut (``offsets_for_times`` under
:func:`falkirk.io.kafka.broker_retry`, as a job asks it), and until a kept producer's
record is acknowledged; at the end the topic holds every acknowledged record once.
Printed: medians per setting and their ratio; ``--json`` writes them with every kill's
figures.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from argparse import Namespace
from pathlib import Path

from falkirk.io.kafka import (
    CLIENT_CONFIG,
    QUESTION_TIMEOUT_MS,
    broker_retry,
    end_offsets,
    ensure_topics,
)
from falkirk.local.broker import LocalBroker

TOPIC = "bench"
PARTITIONS = 3
KILLS = 4
#: The broker properties falkirk sets that Kafka's defaults leave out.
LEASE_PROPERTIES = ("broker.session.timeout.ms", "broker.heartbeat.interval.ms")


class DefaultLeaseBroker(LocalBroker):
    """The embedded broker with Kafka's default controller lease."""

    def _properties(self) -> Path:
        path = super()._properties()
        lines = path.read_text().splitlines()
        path.write_text("\n".join(x for x in lines if not x.startswith(LEASE_PROPERTIES))
                        + "\n")
        return path


def _kills(broker: LocalBroker, client: dict, timeout_ms: int | None, kills: int,
           say=print) -> list[dict]:
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    ensure_topics(broker.bootstrap, {TOPIC: PARTITIONS})
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", **client)
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=None,
                             enable_auto_commit=False, **client)
    tps = {TopicPartition(TOPIC, p): 0 for p in range(PARTITIONS)}
    try:
        producer.send(TOPIC, b"before").get(timeout=60)
        consumer.offsets_for_times(tps, timeout_ms=timeout_ms)
        out = []
        for _ in range(kills):
            t0 = time.monotonic()
            broker.restart(crash=True)
            restart = time.monotonic() - t0
            broker_retry(consumer.offsets_for_times)(tps, timeout_ms=timeout_ms)  # a job's
            cut = time.monotonic() - t0
            producer.send(TOPIC, b"after").get(timeout=120)
            produce = time.monotonic() - t0
            out.append({"restart_s": round(restart, 2), "cut_s": round(cut, 2),
                        "produce_s": round(produce, 2)})
            say(f"    kill {len(out)}/{kills}: restart {restart:.1f} s, cut {cut:.1f} s, "
                f"produce {produce:.1f} s")
            time.sleep(2)  # the next kill hits a broker that settled, as the campaign's
        stored = sum(end_offsets(broker.bootstrap, TOPIC).values())
        assert stored == kills + 1, f"{stored} records stored, {kills + 1} acknowledged"
        return out
    finally:
        producer.close(timeout=5)
        consumer.close()


def measure(kills: int = KILLS, say=print) -> dict:
    settings = {
        "defaults": (DefaultLeaseBroker, {}, None),
        "falkirk": (LocalBroker, CLIENT_CONFIG, QUESTION_TIMEOUT_MS),
    }
    figures: dict[str, dict] = {}
    for name, (cls, client, timeout_ms) in settings.items():
        say(f"  {name}: {kills} kills")
        with tempfile.TemporaryDirectory(prefix="falkirk-broker-bench-") as tmp:
            broker = cls(Path(tmp) / "broker")
            broker.start()
            try:
                rows = _kills(broker, client, timeout_ms, kills, say)
            finally:
                broker.stop()
        figures[name] = {k: round(statistics.median(r[k] for r in rows), 2)
                         for k in rows[0]} | {"kills": rows}
    ratio = {k: round(figures["falkirk"][k] / figures["defaults"][k], 3)
             for k in ("restart_s", "cut_s", "produce_s")}
    return {"kills_per_setting": kills, **figures, "ratio": ratio}


def main(args: Namespace) -> None:
    kills = args.events or KILLS
    print(f"the embedded broker SIGKILLed and restarted, {kills} times per setting…")
    figures = measure(kills)
    for name in ("defaults", "falkirk"):
        f = figures[name]
        print(f"{name:9s} median: answers metadata {f['restart_s']:.1f} s, a kept consumer's "
              f"cut {f['cut_s']:.1f} s, a kept producer's record {f['produce_s']:.1f} s")
    print(f"ratio falkirk/defaults: {figures['ratio']}")
    print(json.dumps({k: {kk: vv for kk, vv in v.items() if kk != "kills"}
                      if k in ("defaults", "falkirk") else v for k, v in figures.items()}))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
