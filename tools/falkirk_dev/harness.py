"""The test harness: a local run (``falkirk.local.run``) of a pipeline with the reference
input generated, and every output read back for comparison with a failure-free run.

Used by the integration tests, the fault-injection trials, the benchmarks and the demo,
so they all run the pipeline the same way: generate input, start every job as its own
process (spark-submit), kill one with SIGKILL in the middle of an epoch, roll back, restart,
and read every output back for comparison with a failure-free run.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from falkirk.local.run import CHECKS
from falkirk.local.run import LocalRun as BaseRun
from falkirk.model.topology import Pipeline

__all__ = ["CHECKS", "LocalRun", "SteadyInput", "compare", "count_sent", "each_message",
           "generate_args", "profile"]


@contextlib.contextmanager
def profile(env: str) -> Iterator[None]:
    """Run the block (and the jobs it starts) under the config profile ``env``."""
    before = os.environ.get("FALKIRK_ENV")
    os.environ["FALKIRK_ENV"] = env
    try:
        yield
    finally:
        if before is None:
            del os.environ["FALKIRK_ENV"]
        else:
            os.environ["FALKIRK_ENV"] = before


class LocalRun(BaseRun):
    """One sandboxed run of a pipeline under ``root``, with the reference input and the
    outputs read back for comparison."""

    def __init__(self, root: Path, pipeline: str | Path = "reference", broker=None):
        super().__init__(root, pipeline, broker)

    # -- input --------------------------------------------------------------------------

    def generate(self, **options: Any) -> dict:
        """Produce seeded input to the pipeline's topics (see ``falkirk generate``)."""
        import contextlib
        import io

        from falkirk_dev import generate
        args = generate_args(self.pipeline, bootstrap=self.cfg.kafka_bootstrap, **options)
        with contextlib.redirect_stdout(io.StringIO()) as out:
            generate.cli(args)
        info = json.loads(out.getvalue())
        if "sent" in info:  # produced, not only summarised: the run is bounded there
            info["bounds"] = self.declare_bounds()
        return info

    # -- outputs ------------------------------------------------------------------------

    def tables(self) -> dict[str, list[dict]]:
        """Every Delta output table of the pipeline, rows sorted (for exact comparison)."""
        from deltalake import DeltaTable

        from falkirk.io.lake import read_table

        out = {}
        opts = self.cfg.delta_storage_options or None
        for edge in self.pipeline.edges.values():
            if edge.kind != "delta" or edge.table in out:
                continue
            uri = self.cfg.table(edge.table)
            if not DeltaTable.is_deltatable(uri, storage_options=opts):
                out[edge.table] = []
                continue
            rows = read_table(uri, storage_options=opts).to_pylist()
            out[edge.table] = sorted(rows, key=lambda r: json.dumps(r, sort_keys=True,
                                                                    default=str))
        return out

    def messages(self, topic: str) -> list[tuple[str, str, int | None]]:
        """Every message on a topic, in partition order: (key, value, generation header)."""
        from falkirk.io.kafka import GENERATION_HEADER

        out: list[tuple[str, str, int | None]] = []
        for r in each_message(self.cfg.kafka_bootstrap, topic):
            gen = dict(r.headers or []).get(GENERATION_HEADER)
            out.append((r.key.decode(), r.value.decode(), None if gen is None else int(gen)))
        return out

    def latest_by_key(self, topic: str) -> dict[str, str]:
        """A topic read as clients read it: the latest value per key."""
        return {key: value for key, value, _ in self.messages(topic)}

    def sent(self) -> dict[str, dict[str, Any]]:
        """Per output topic, every message counted: what a consumer that does not keep
        the latest per key sees (see :func:`count_sent`)."""
        return {edge.topic: count_sent(self.messages(edge.topic))
                for edge in self.pipeline.edges.values()
                if edge.kind == "kafka" and edge.src is not None}

    def outputs(self) -> dict[str, Any]:
        """What a failure-free run and a run with rollbacks must agree on."""
        out: dict[str, Any] = dict(self.tables())
        for edge in self.pipeline.edges.values():
            if edge.kind == "kafka" and edge.src is not None:
                out[f"topic:{edge.topic}"] = self.latest_by_key(edge.topic)
        return out


def each_message(bootstrap: str, topic: str) -> Iterator[Any]:
    """Every message on a topic now (kafka-python records), partition by partition in
    offset order; nothing when the topic does not exist."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                             enable_auto_commit=False, consumer_timeout_ms=2000)
    try:
        tps = [TopicPartition(topic, p)
               for p in sorted(consumer.partitions_for_topic(topic) or ())]
        if not tps:
            return
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        ends = consumer.end_offsets(tps)
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            for records in consumer.poll(timeout_ms=1000).values():
                yield from records
    finally:
        consumer.close()


def count_sent(messages: list[tuple[str, str, int | None]]) -> dict[str, Any]:
    """Messages, keys, and the re-sends among them (a key's messages after its first).

    ``resent_by_generation``: re-sends per generation header; a rollback's redone epochs
    re-send with the new generation. ``resent_same_generation``: re-sends carrying the
    generation of an earlier message of the key (a job restarted without a rollback);
    ``changed``: re-sends whose value differs from the key's previous one.
    """
    seen: dict[str, tuple[str, set[int | None]]] = {}
    by_gen: dict[str, int] = {}
    same = changed = 0
    for key, value, gen in messages:
        if key in seen:
            last, gens = seen[key]
            by_gen[str(gen)] = by_gen.get(str(gen), 0) + 1
            same += gen in gens
            changed += value != last
            gens.add(gen)
            seen[key] = (value, gens)
        else:
            seen[key] = (value, {gen})
    return {"messages": len(messages), "keys": len(seen), "resent": len(messages) - len(seen),
            "resent_by_generation": dict(sorted(by_gen.items())),
            "resent_same_generation": same, "changed": changed}


class SteadyInput:
    """The reference input produced at a steady rate, in a thread beside the running
    pipeline, and bounded where it ends once all of it is acknowledged (issue 15's
    campaign: "input produced at a steady rate"; without it every record is there at the
    start and the pipeline drains a backlog).

    It keeps when each epoch's input was due on each topic: every partition got a record
    of a later epoch, the cut ``runtime.connectors.KafkaCut`` closes an epoch with (or the input was
    bounded). The time is when that record was handed to the producer at the rate, not
    when it was acknowledged: a broker killed delays the acknowledgement, and that delay
    is the broker's recovery, not the source's pace. No recovery, however fast, commits an
    epoch before its input was due: the campaign counts a recovery's wait for input that
    was not due yet apart."""

    def __init__(self, run: LocalRun, rate: float, **options: Any):
        from falkirk_dev import generate as G

        if rate <= 0:
            raise ValueError(f"the steady input's rate must be > 0 records/s, got {rate}")
        self.run, self.rate = run, rate
        self.generated, self.origin_ms, self.epoch_ms = G.from_args(
            generate_args(run.pipeline, **options))
        self.info = G.summary(self.generated, self.origin_ms, self.epoch_ms)
        self.partitions = {G.EVENTS_TOPIC: G.EVENT_PARTITIONS,
                           G.QUERIES_TOPIC: G.QUERY_PARTITIONS}
        # (topic, partition) -> [(epoch reached, when its record was due)], increasing
        self._reached: dict[tuple[str, int], list[tuple[int, datetime]]] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.ended_at: datetime | None = None  # bounded: every epoch complete
        self.started_wall: float | None = None  # when the producer began (time.time())

    @property
    def seconds(self) -> float:
        """How long producing all of it takes at the rate."""
        return (len(self.generated.events) + len(self.generated.queries)) / self.rate

    def start(self) -> SteadyInput:
        from falkirk_dev import generate as G

        G.ensure_topics(self.run.cfg.kafka_bootstrap, self.partitions)
        self._thread = threading.Thread(target=self._produce, name="steady-input",
                                        daemon=True)
        self._thread.start()
        return self

    def _produce(self) -> None:
        from falkirk_dev import generate as G

        try:
            started = time.monotonic()
            self.started_wall = time.time()
            sent = G.produce(self.run.cfg.kafka_bootstrap, G.EVENTS_TOPIC, G.QUERIES_TOPIC,
                             self.generated.events, self.generated.queries, rate=self.rate,
                             on_acked=self._acked)
            self.info["seconds"] = round(time.monotonic() - started, 3)
            self.info["sent"] = G.sent_json(sent)
            self.info["bounds"] = self.run.declare_bounds()
            self.ended_at = datetime.now(UTC)
        except BaseException as e:  # (surfaced by check(), in the caller's thread)
            self.error = e

    def _acked(self, ts: int, handed: datetime, meta: Any) -> None:
        from falkirk_dev.generate import epoch_of

        epoch = epoch_of(ts, self.origin_ms, self.epoch_ms)
        with self._lock:  # (acknowledged in each partition's order, not across them)
            marks = self._reached.setdefault((meta.topic, meta.partition), [])
            if not marks or epoch > marks[-1][0]:  # (a late record reaches nothing new)
                marks.append((epoch, handed))

    def ready_at(self, topic: str, epoch: int) -> datetime | None:
        """When ``epoch``'s input on ``topic`` was due whole; None while it is not
        acknowledged whole."""
        times = []
        with self._lock:
            for p in range(self.partitions[topic]):
                when = next((t for e, t in self._reached.get((topic, p), ()) if e > epoch),
                            self.ended_at)
                if when is None:
                    return None
                times.append(when)
        return max(times)

    @property
    def sent_records(self) -> dict[str, list[tuple[bytes, bytes, int]]]:
        """Per input topic, the records sent to it: ``(key, value, timestamp_ms)``."""
        from falkirk_dev import generate as G

        return {G.EVENTS_TOPIC: self.generated.events, G.QUERIES_TOPIC: self.generated.queries}

    def query_times(self) -> dict[str, float]:
        """Per query id, when it was due at the rate (wall-clock seconds): its place in the
        merged stream the producer paces (:func:`falkirk_dev.generate.produce`), as the
        latency benchmark counts it."""
        import heapq
        import json

        g, start = self.generated, getattr(self, "started_wall", None)
        if start is None:
            return {}
        merged = heapq.merge(((ts, 0, i) for i, (_, _, ts) in enumerate(g.events)),
                             ((ts, 1, i) for i, (_, _, ts) in enumerate(g.queries)))
        return {json.loads(g.queries[i][1])["query_id"]: start + n / self.rate
                for n, (_, stream, i) in enumerate(merged) if stream == 1}

    @property
    def done(self) -> bool:
        """All of it produced and bounded."""
        self.check()
        return self.ended_at is not None

    def check(self) -> None:
        """Raise the producer's error, if it failed (the pipeline would wait forever)."""
        if self.error is not None:
            raise RuntimeError(f"the steady input's producer failed: {self.error!r}"
                               ) from self.error


def generate_args(pipeline: Pipeline, **options: Any):
    """``falkirk generate``'s arguments for a pipeline (its origin and epoch length)."""
    import argparse

    s = pipeline.settings
    return argparse.Namespace(**{"origin": s.get("origin_ms"),
                                 "epoch_seconds": s.get("epoch_seconds", 10), **options})


@dataclass
class InputAsStored:
    """The input topics as the broker stored them, against what was produced: the offsets
    of records stored more often than sent (per topic and partition), and the count of
    sent records the topics lack."""

    extra: dict[tuple[str, int], list[int]]
    missing: int

    @property
    def stored_twice(self) -> int:
        return sum(len(v) for v in self.extra.values())

    def as_sent(self, dead_letters: list[dict]) -> list[dict]:
        """Dead letters as the input sent would have given them: a copy's own dropped,
        the offsets after copies in its partition moved back by their number (a dead
        letter names its record's offset)."""
        out = []
        for row in dead_letters:
            copies = self.extra.get((row["source"], row["partition"]), [])
            if row["offset"] in copies:
                continue
            out.append({**row, "offset": row["offset"]
                        - sum(1 for o in copies if o < row["offset"])})
        return out


def input_as_stored(bootstrap: str, sent: dict[str, list[tuple[bytes, bytes, int]]]
                    ) -> InputAsStored:
    """Compare each input topic with the records sent to it, ``(key, value, timestamp)``.

    A broker killed while a producer's batch was in flight can store that batch twice (seen
    once in an hour of broker kills: the same producer id and sequence at two offsets,
    across a leader-epoch change). Then the input itself differs from a failure-free
    run's, and every dead letter after the copy names an offset one later."""
    from collections import Counter

    extra: dict[tuple[str, int], list[int]] = {}
    missing = 0
    for topic, records in sent.items():
        left = Counter(records)
        for r in each_message(bootstrap, topic):
            record = (r.key, r.value, r.timestamp)
            if left[record] > 0:
                left[record] -= 1
            else:
                extra.setdefault((topic, r.partition), []).append(r.offset)
        missing += sum(left.values())
    return InputAsStored(extra, missing)


def compare(golden: dict[str, Any], other: dict[str, Any]) -> dict[str, dict[str, int]]:
    """Per output: rows missing from ``other`` and rows it has in excess (0, 0 = equal)."""
    from collections import Counter

    report = {}
    for name in sorted(set(golden) | set(other)):
        a, b = golden.get(name, []), other.get(name, [])
        if isinstance(a, dict):
            a = [json.dumps([k, v]) for k, v in a.items()]
            b = [json.dumps([k, v]) for k, v in b.items()]
        else:
            a = [json.dumps(r, sort_keys=True, default=str) for r in a]
            b = [json.dumps(r, sort_keys=True, default=str) for r in b]
        ca, cb = Counter(a), Counter(b)
        report[name] = {"rows": len(a), "lost": sum((ca - cb).values()),
                        "duplicated": sum((cb - ca).values())}
    return report
