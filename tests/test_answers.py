"""falkirk.io.answers: an output topic read as the latest answer per (key, epoch).

Issue 59, item 3: a user whose keys repeat across epochs (an alert per device per epoch)
followed docs/outputs.md's old rule ("drop a record whose key it has already seen with a
generation at least as high") and lost real alerts; keying on (key, epoch) keeps them all.
"""

from __future__ import annotations

from typing import Any

import pytest
from kafka import KafkaProducer
from kafka.consumer.fetcher import ConsumerRecord

from falkirk.io.answers import Answer, AnswerError, read_answers, reduce_answers
from falkirk.io.kafka import EPOCH_HEADER, GENERATION_HEADER, REGION_HEADER

DEVICES = [f"device-{d}" for d in range(8)]
EPOCHS = range(10)


def alert(device: str, epoch: int) -> str:
    return f'{{"device":"{device}","epoch":{epoch},"level":"high"}}'


class Topic:
    """Records as a generation of a job sends them: per partition in offset order, each
    with falkirk's headers. Plain mappings: no broker."""

    def __init__(self, partitions: int = 1):
        self.partitions = partitions
        self.records: list[dict[str, Any]] = []
        self.next: dict[int, int] = {}

    def send(self, generation: int, epochs: range | list[int], devices: list[str],
             value=alert) -> None:
        for e in epochs:
            for d in devices:
                p = DEVICES.index(d) % self.partitions
                offset = self.next.get(p, 0)
                self.next[p] = offset + 1
                self.records.append({
                    "topic": "alerts", "partition": p, "offset": offset, "key": d,
                    "value": value(d, e),
                    "headers": [(GENERATION_HEADER, str(generation).encode()),
                                (EPOCH_HEADER, str(e).encode()), (REGION_HEADER, b"alerts")]})


def values(answers: dict) -> dict[tuple[str, int], str]:
    return {k: a.value for k, a in answers.items()}


def old_rule(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rule docs/outputs.md stated before: drop a record whose key was already seen
    with a generation at least as high."""
    seen: dict[str, int] = {}
    kept = []
    for r in records:
        gen = int(dict(r["headers"])[GENERATION_HEADER])
        if r["key"] in seen and seen[r["key"]] >= gen:
            continue
        seen[r["key"]] = max(seen.get(r["key"], gen), gen)
        kept.append(r)
    return kept


def test_keys_repeating_across_epochs_are_each_an_answer():
    """An alert per device per epoch: 80 alerts over 10 epochs on 8 devices, all kept."""
    topic = Topic(partitions=3)
    topic.send(0, EPOCHS, DEVICES)
    answers = reduce_answers(topic.records)
    assert len(answers) == 80
    assert values(answers) == {(d, e): alert(d, e) for d in DEVICES for e in EPOCHS}
    assert {a.generation for a in answers.values()} == {0}


def test_the_old_rule_loses_alerts_when_keys_repeat_across_epochs():
    """Why the rule changed. Generation 0 sends epochs 0-3; a rollback to epoch 2 and
    generation 1 sends 2-6; a rollback to 5 and generation 2 sends 5-9: 112 messages for
    80 alerts. Keyed on the key alone, a device's next epoch in the same generation looks
    like a re-send: only the first alert of each device per generation survives."""
    topic = Topic(partitions=3)
    topic.send(0, range(0, 4), DEVICES)
    topic.send(1, range(2, 7), DEVICES)
    topic.send(2, range(5, 10), DEVICES)
    assert len(topic.records) == 112

    kept = old_rule(topic.records)
    kept_alerts = {(r["key"], int(dict(r["headers"])[EPOCH_HEADER])) for r in kept}
    assert len(kept) == 24  # 3 per device: epochs 0, 2 and 5
    assert len(kept_alerts) == 24  # 56 of the 80 alerts lost

    answers = reduce_answers(topic.records)
    assert values(answers) == {(d, e): alert(d, e) for d in DEVICES for e in EPOCHS}
    assert {k: a.generation for k, a in answers.items()} == {
        (d, e): 0 if e < 2 else 1 if e < 5 else 2 for d in DEVICES for e in EPOCHS}


def test_a_rollback_resends_epochs_in_a_higher_generation_and_nothing_changes():
    """Generation 1 re-sends epochs >= 6 with the same values: still 80 answers, the same
    ones, the re-sent epochs now of generation 1. Input order does not matter across
    partitions: the lower generation read last does not win."""
    topic = Topic(partitions=2)
    topic.send(0, EPOCHS, DEVICES)
    topic.send(1, range(6, 10), DEVICES)
    assert len(topic.records) == 112
    for records in (topic.records, list(reversed(topic.records))):
        answers = reduce_answers(records)
        assert len(answers) == 80
        assert values(answers) == {(d, e): alert(d, e) for d in DEVICES for e in EPOCHS}
        assert {k: a.generation for k, a in answers.items()} == {
            (d, e): int(e >= 6) for d in DEVICES for e in EPOCHS}


def test_a_restatement_wins_for_that_key_and_epoch_only():
    """A rollback on purpose and a fixed job: generation 1 re-sends epochs >= 4, with
    another value for device-3 in epoch 4. That answer changes; device-3's other epochs,
    and every other device's, keep their values."""
    topic = Topic(partitions=3)
    topic.send(0, EPOCHS, DEVICES)

    def fixed(d: str, e: int) -> str:
        return '{"device":"device-3","epoch":4,"level":"low"}' if (d, e) == (
            "device-3", 4) else alert(d, e)

    topic.send(1, range(4, 10), DEVICES, value=fixed)
    answers = reduce_answers(topic.records)
    expected = {(d, e): alert(d, e) for d in DEVICES for e in EPOCHS}
    expected[("device-3", 4)] = '{"device":"device-3","epoch":4,"level":"low"}'
    assert values(answers) == expected
    assert answers[("device-3", 4)].generation == 1
    assert answers[("device-3", 3)].generation == 0


def test_a_same_generation_resend_keeps_the_later_offset():
    """At-least-once delivery: a job restarted without a rollback sends epoch 7 again in
    the same generation. One answer per (key, epoch); the later offset's value, even when
    the records come out of order."""
    topic = Topic(partitions=1)
    topic.send(0, EPOCHS, DEVICES)
    topic.send(0, [7], DEVICES, value=lambda d, e: alert(d, e).replace("high", "again"))
    for records in (topic.records, list(reversed(topic.records))):
        answers = reduce_answers(records)
        assert len(answers) == 80
        assert answers[("device-0", 7)] == Answer(
            key="device-0", epoch=7, generation=0,
            value=alert("device-0", 7).replace("high", "again"), partition=0, offset=80)
        assert answers[("device-0", 6)].value == alert("device-0", 6)


def test_per_epoch_generation_drops_keys_a_restatement_no_longer_produces():
    """Generation 1 restates epoch 4 without device-7's alert. By default device-7's
    generation-0 answer for epoch 4 stays (nothing on the topic replaces it); with
    ``per_epoch_generation`` an epoch keeps only its newest generation's answers. Epochs
    not re-sent keep generation 0's answers either way."""
    topic = Topic(partitions=2)
    topic.send(0, EPOCHS, DEVICES)
    topic.send(1, [4], DEVICES[:7])
    default = reduce_answers(topic.records)
    assert len(default) == 80
    assert default[("device-7", 4)].generation == 0

    newest = reduce_answers(topic.records, per_epoch_generation=True)
    assert set(default) - set(newest) == {("device-7", 4)}
    assert {a.generation for k, a in newest.items() if k[1] == 4} == {1}
    assert {a.generation for k, a in newest.items() if k[1] != 4} == {0}


def test_kafka_python_records_are_read_as_they_come():
    """ConsumerRecords: bytes keys and values, headers a list of (str, bytes)."""
    def record(offset: int, gen: int, epoch: int, value: bytes) -> ConsumerRecord:
        headers = [(GENERATION_HEADER, str(gen).encode()), (EPOCH_HEADER, str(epoch).encode())]
        return ConsumerRecord("alerts", 1, -1, offset, 0, 0, b"device-1", value, headers,
                              None, 8, len(value), -1)

    answers = reduce_answers([record(0, 0, 3, b"a"), record(1, 0, 4, b"b"),
                              record(2, 1, 3, b"c")])
    assert answers == {
        (b"device-1", 3): Answer(b"device-1", 3, 1, b"c", 1, 2),
        (b"device-1", 4): Answer(b"device-1", 4, 0, b"b", 1, 1),
    }


def test_a_record_falkirk_did_not_send_is_refused_by_name():
    foreign = ConsumerRecord("alerts", 2, -1, 17, 0, 0, b"k", b"v",
                             [(GENERATION_HEADER, b"0")], None, 1, 1, -1)
    with pytest.raises(AnswerError, match=r"topic 'alerts' partition 2 offset 17 has no "
                                          r"'falkirk-epoch' header: it was not sent by falkirk"):
        reduce_answers([foreign])
    with pytest.raises(AnswerError, match=r"record 0 of the input has no 'falkirk-generation'"):
        reduce_answers([{"key": "k", "value": "v", "headers": []}])
    with pytest.raises(AnswerError, match=r"header 'falkirk-epoch' is 'x', not an integer"):
        reduce_answers([{"key": "k", "value": "v",
                         "headers": {GENERATION_HEADER: "0", EPOCH_HEADER: "x"}}])


def produce(bootstrap: str, topic: str, sends: list[tuple[int, int, str, str]],
            partitions: int) -> None:
    """(generation, epoch, key, value), each to its key's partition, with the headers."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    for gen, epoch, key, value in sends:
        producer.send(topic, key=key.encode(), value=value.encode(),
                      partition=DEVICES.index(key) % partitions,
                      headers=[(GENERATION_HEADER, str(gen).encode()),
                               (EPOCH_HEADER, str(epoch).encode()), (REGION_HEADER, b"alerts")])
    producer.flush()
    producer.close()


@pytest.mark.slow  # the broker
def test_read_answers_reduces_a_whole_topic_on_the_broker(broker):
    """Three partitions, 6 devices over 5 epochs in generation 0, then a rollback to
    epoch 3: generation 1 re-sends epochs 3-4, device-2's epoch 3 restated and device-5's
    epoch 4 no longer produced."""
    devices = DEVICES[:6]
    broker.create_topic("answers-alerts", 3)
    sends = [(0, e, d, alert(d, e)) for e in range(5) for d in devices]
    sends += [(1, e, d, "restated" if (d, e) == ("device-2", 3) else alert(d, e))
              for e in (3, 4) for d in devices if (d, e) != ("device-5", 4)]
    produce(broker.bootstrap, "answers-alerts", sends, 3)

    answers = read_answers(broker.bootstrap, "answers-alerts")
    expected = {(d, e): alert(d, e) for d in devices for e in range(5)}
    expected[("device-2", 3)] = "restated"
    assert values(answers) == expected
    assert {k: a.generation for k, a in answers.items()} == {
        (d, e): int(e >= 3 and (d, e) != ("device-5", 4)) for d in devices for e in range(5)}
    assert {a.partition for a in answers.values()} == {0, 1, 2}
    # partition 2 holds device-2 and device-5: 10 records of generation 0, then the re-send
    assert answers[("device-2", 3)].offset == 10

    newest = read_answers(broker.bootstrap, "answers-alerts", per_epoch_generation=True)
    assert set(answers) - set(newest) == {("device-5", 4)}
    raw = read_answers(broker.bootstrap, "answers-alerts", decode=False)
    assert raw[(b"device-2", 3)].value == b"restated"

    with pytest.raises(AnswerError, match="topic 'answers-nowhere' does not exist"):
        read_answers(broker.bootstrap, "answers-nowhere")
    broker.create_topic("answers-foreign", 2)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all")
    producer.send("answers-foreign", key=b"k", value=b"v", partition=1)
    producer.flush()
    producer.close()
    with pytest.raises(AnswerError, match="topic 'answers-foreign' partition 1 offset 0 has "
                                          "no 'falkirk-generation' header"):
        read_answers(broker.bootstrap, "answers-foreign")
