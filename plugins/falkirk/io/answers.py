"""An output topic read as falkirk's answers: the latest record per (key, epoch).

Kafka has no restore, so an epoch redone after a rollback is sent again, in a higher
``falkirk-generation`` (docs/outputs.md). An answer is therefore named by its key *and*
its ``falkirk-epoch``: keys may repeat across epochs (an alert per device per epoch), and
a consumer that keys on the key alone drops a later epoch's answer as if it were a
re-send. Per (key, epoch) the highest generation wins (a restatement replaces the first
value); within one generation (an at-least-once re-send) the later record wins.

* :func:`reduce_answers` does it over records already read (kafka-python
  ``ConsumerRecord``\\ s, or plain mappings with ``key``, ``value``, ``headers``): no broker.
* :func:`read_answers` reads a whole topic, up to its end offsets, and reduces it.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import closing
from dataclasses import dataclass
from typing import Any

from falkirk.errors import FalkirkError
from falkirk.io.kafka import (
    CLIENT_CONFIG,
    EPOCH_HEADER,
    GENERATION_HEADER,
    QUESTION_TIMEOUT_MS,
)

#: A record's key or value as the records carry it: bytes from kafka-python (without a
#: deserializer), text from :func:`read_answers` or a test's mappings.
Data = bytes | str | None


class AnswerError(FalkirkError, ValueError):
    """A record that falkirk did not send (no or bad falkirk headers), or a topic that
    cannot be read."""


@dataclass(frozen=True)
class Answer:
    """The winning record of one (key, epoch). ``partition``/``offset`` are None for a
    plain mapping that has none."""

    key: Data
    epoch: int
    generation: int
    value: Data
    partition: int | None
    offset: int | None


def reduce_answers(records: Iterable[Any], *, per_epoch_generation: bool = False
                   ) -> dict[tuple[Data, int], Answer]:
    """The latest answer per (key, epoch) among ``records``: highest generation wins;
    in the same generation the higher offset of the same partition wins, else the
    record that comes later in ``records``.

    ``per_epoch_generation``: also keep, per epoch, only the answers of the highest
    generation seen for that epoch. A restatement (a rollback on purpose and a fixed job)
    that no longer produces some key of an epoch otherwise leaves the older generation's
    answer for it. Only right once the newest generation has sent the whole epoch: read
    in the middle of a re-send, the epoch's answers not re-sent yet are left out.

    Raises :class:`AnswerError` naming the record (topic, partition, offset) when it lacks
    the falkirk headers: it was not sent by falkirk.
    """
    won: dict[tuple[Data, int], Answer] = {}
    for i, record in enumerate(records):
        a = _answer(record, i)
        old = won.get((a.key, a.epoch))
        if old is None or a.generation > old.generation or (
                a.generation == old.generation and not _earlier(a, old)):
            won[(a.key, a.epoch)] = a
    if per_epoch_generation:
        newest: dict[int, int] = {}
        for a in won.values():
            newest[a.epoch] = max(newest.get(a.epoch, a.generation), a.generation)
        won = {k: a for k, a in won.items() if a.generation == newest[a.epoch]}
    return won


def _earlier(a: Answer, old: Answer) -> bool:
    """``a`` (read after ``old``) was stored before it: a lower offset of the same
    partition. Offsets of different partitions say nothing; then the later read wins."""
    return (a.partition == old.partition and a.offset is not None and old.offset is not None
            and a.offset < old.offset)


def _answer(record: Any, index: int) -> Answer:
    """One record as an :class:`Answer`, from a ConsumerRecord or a mapping."""
    if isinstance(record, Mapping):
        get = record.get
    else:
        def get(name: str, default: Any = None) -> Any:
            return getattr(record, name, default)
    topic, partition, offset = get("topic"), get("partition"), get("offset")
    headers = _headers(get("headers"))
    where = (f"topic {topic!r} partition {partition} offset {offset}"
             if offset is not None else f"record {index} of the input")
    values: dict[str, int] = {}
    for name in (GENERATION_HEADER, EPOCH_HEADER):
        text = headers.get(name)
        if text is None:
            raise AnswerError(f"{where} has no {name!r} header: it was not sent by falkirk "
                              f"(every record falkirk sends carries {GENERATION_HEADER!r} "
                              f"and {EPOCH_HEADER!r})")
        try:
            values[name] = int(text)
        except ValueError:
            raise AnswerError(f"{where}: header {name!r} is {text!r}, not an integer") from None
    return Answer(key=get("key"), epoch=values[EPOCH_HEADER],
                  generation=values[GENERATION_HEADER], value=get("value"),
                  partition=partition, offset=offset)


def _headers(headers: Mapping[str, Any] | Sequence[tuple[str, Any]] | None) -> dict[str, str]:
    """Headers as text: kafka-python's list of (str, bytes), or a mapping."""
    pairs = headers.items() if isinstance(headers, Mapping) else headers or ()
    out: dict[str, str] = {}
    for name, value in pairs:
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        if value is not None:
            out[name] = str(value)
    return out


def read_answers(bootstrap: str, topic: str, *, per_epoch_generation: bool = False,
                 decode: bool = True, stall_seconds: float = 30.0
                 ) -> dict[tuple[Data, int], Answer]:
    """Every record of ``topic`` now (from the beginning to the end offsets read first,
    later records left out), reduced by :func:`reduce_answers` as it is read (only the
    answers are held, not the records).

    ``decode``: keys and values as text (falkirk sends UTF-8 strings), else bytes. A read
    that makes no progress for ``stall_seconds`` (a broker gone) raises
    :class:`AnswerError` rather than waiting forever.
    """
    with closing(_each_record(bootstrap, topic, stall_seconds)) as records:
        if decode:
            records = ({"topic": r.topic, "partition": r.partition, "offset": r.offset,
                        "key": _text(r.key), "value": _text(r.value), "headers": r.headers}
                       for r in records)
        return reduce_answers(records, per_epoch_generation=per_epoch_generation)


def _each_record(bootstrap: str, topic: str, stall_seconds: float) -> Iterator[Any]:
    """The kafka-python records of every partition of ``topic`` up to the end offsets it
    had when asked (each partition in offset order); the consumer closes with the
    generator."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                             enable_auto_commit=False, client_id="falkirk-answers",
                             **CLIENT_CONFIG)
    try:
        parts = consumer.partitions_for_topic(topic)
        if not parts:
            raise AnswerError(f"topic {topic!r} does not exist on {bootstrap}")
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        ends = consumer.end_offsets(tps, timeout_ms=QUESTION_TIMEOUT_MS)
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        progress = time.monotonic()
        left = {tp for tp in tps if consumer.position(tp) < ends[tp]}
        while left:
            for tp, batch in consumer.poll(timeout_ms=1000).items():
                progress = time.monotonic()
                yield from (r for r in batch if r.offset < ends[tp])
            for tp in list(left):
                if consumer.position(tp) >= ends[tp]:
                    left.discard(tp)
                    consumer.pause(tp)  # read to its end: what came since is not asked for
            if left and time.monotonic() - progress > stall_seconds:
                raise AnswerError(
                    f"reading topic {topic!r} on {bootstrap}: no progress for "
                    f"{stall_seconds:.0f} s; partitions not read to their end: "
                    f"{sorted(tp.partition for tp in left)}")
    finally:
        consumer.close()


def _text(data: bytes | None) -> str | None:
    return None if data is None else data.decode("utf-8")
