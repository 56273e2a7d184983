"""Edges behind one interface: where an epoch's input is, reading it, committing outputs.

The epoch loop (:mod:`falkirk.runtime.loop`) asks each input connector for the places of
the ready epochs (a prefix of the epochs it asks about), reads them in one go (a pass of
several epochs: their rows carry :data:`PASS_COLUMN`), and hands each output connector a
region's DataFrame to commit, epoch by epoch. A connector per edge kind:

- :class:`KafkaInput`: an epoch ends in each partition at the first offset whose record
  timestamp is at or past the epoch's end (the broker's time index), or at the topic's
  declared bound; the records in between are read with Spark's Kafka connector;
- :class:`DeltaInput`: the sender's epoch ``e - delay`` committed in the epoch log; read
  as the table at that version (``snapshot``) or the rows that commit appended
  (``appends``);
- :class:`DeltaOutput`: the exactly-once writer (Spark's Parquet files, delta-rs commits);
- :class:`KafkaOutput`: produced with Spark's Kafka connector, each record stamped with
  its generation, epoch and region.

The loop never branches on an edge's kind: :func:`input_for` and :func:`output_for` pick
the connector.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from falkirk.config import Config
from falkirk.io.delta import PASS_COLUMN
from falkirk.io.kafka import CLIENT_CONFIG, QUESTION_TIMEOUT_MS, broker_retry
from falkirk.log.epochlog import EpochLog, RegionLog
from falkirk.model.schemas import arrow_schema, ddl, find
from falkirk.model.times import DOMAINS, OFFSETS, Offsets, time_of
from falkirk.model.topology import EdgeSpec, Pipeline
from falkirk.runtime.job import RuntimeFailure, spark_schema

log = logging.getLogger("falkirk.runtime")

SENDER_CHECK_S = 5.0  # how often a waiting region looks whether its sender's job died
BOUND_CHECK_S = 2.0  # how often a waiting job re-reads the declared bounds of its inputs
WAIT = False  # an input not complete yet at the first epoch asked about
ENDED = None  # an input that ended before it: no epoch will ever come


@dataclass(frozen=True)
class EpochClock:
    """Epochs are event-time windows: epoch = floor((ts - origin) / length)."""

    origin_ms: int
    length_ms: int

    def epoch_of(self, ts_ms: int) -> int:
        return (ts_ms - self.origin_ms) // self.length_ms

    def end_ms(self, epoch: int) -> int:
        """The first timestamp after ``epoch``."""
        return self.origin_ms + (epoch + 1) * self.length_ms

    @classmethod
    def of(cls, pipeline: Pipeline) -> EpochClock:
        s = pipeline.settings  # both validated as required (topology.PipelineSettings)
        return cls(int(s["origin_ms"]), int(s["epoch_seconds"] * 1000))


@dataclass
class Wiring:
    """What every connector of one job shares: its session, config, pipeline, epoch log,
    generation, and one look at the log per round of readiness checks."""

    spark: Any
    cfg: Config
    pipeline: Pipeline
    log: EpochLog
    generation: int
    regions: list[str]
    _look: dict[str, Any] = field(default_factory=dict)
    _bounds: dict[str, Offsets] = field(default_factory=dict)
    _bounds_read: float = float("-inf")
    _sender_checked: dict[str, float] = field(default_factory=dict)
    _said_dead: set[tuple] = field(default_factory=set)

    def new_look(self) -> None:
        """Forget the last round's reads of the log: the next questions read it again."""
        self._look.clear()

    def logs(self) -> dict[str, RegionLog]:
        if "logs" not in self._look:
            self._look["logs"] = self.log.regions(self.pipeline)
        return self._look["logs"]

    def passed(self) -> dict[str, set[tuple[int, int]]] | None:
        """With ``settings.checks.hold``: per region, the (epoch, generation) whose data
        checks passed (receivers read only those); None when epochs are not held."""
        if not self.pipeline.checks_setting("hold"):
            return None
        if "passed" not in self._look:
            self._look["passed"] = self.log.passed_checks(self.pipeline.name)
        return self._look["passed"]

    def ends(self) -> dict[str, int]:
        if "ends" not in self._look:
            self._look["ends"] = self.log.ends(self.pipeline.name)
        return self._look["ends"]

    def bound(self, topic: str) -> Offsets | None:
        """The declared end of input ``topic`` (a bounded run), or None (a continuous run);
        read from the log at most every :data:`BOUND_CHECK_S` seconds."""
        now = time.monotonic()
        if now - self._bounds_read >= BOUND_CHECK_S:
            self._bounds = {t: Offsets(o) for t, o in self.log.bounds(self.pipeline.name).items()}
            self._bounds_read = now
        return self._bounds.get(topic)

    def say_if_sender_died(self, edge: EdgeSpec, needed: int) -> None:
        """Waiting on a region whose job is dead: say so at once (once per job run), not
        only when the idle timeout runs out. The wait goes on: a supervisor or a rollback
        restarts the sender, and this region then carries on."""
        now = time.monotonic()
        if now - self._sender_checked.get(edge.name, 0.0) < SENDER_CHECK_S:
            return
        self._sender_checked[edge.name] = now
        from falkirk.model.process import this_process
        from falkirk.runtime.park import RUNNING_STATUSES
        from falkirk.runtime.procs import is_process

        job = self.pipeline.regions[edge.src].job
        run = self.log.job_runs(self.pipeline.name).get(job or "")
        if run is None:
            return
        dead = run["status"] == "failed" or (
            run["status"] in RUNNING_STATUSES and run["host"] == this_process()["host"]
            and not is_process(run["pid"], run["process_started"]))
        said = (job, run["pid"], run["process_started"])
        if dead and said not in self._said_dead:
            self._said_dead.add(said)
            how = (f"failed (exit {run['exit_code']}: {run['message']})"
                   if run["status"] == "failed" else f"was killed (pid {run['pid']} is gone)")
            log.warning("pipeline %s: %s waits for epoch %d of region %r, whose job %s %s; "
                        "it carries on once that job is recovered (falkirk rollback --failed "
                        "%s, or the streams DAG's recover)", self.pipeline.name,
                        "+".join(self.regions), needed, edge.src, job, how, edge.src)

    def time(self, region: str, epoch: int) -> Any:
        return time_of(self.pipeline.regions[region].domain, epoch)

    def row(self, region: str, epoch: int, logs: dict[str, RegionLog] | None = None):
        """The region's effective epoch log row of ``epoch``, or None."""
        spec = self.pipeline.regions[region]
        return (logs or self.logs())[region].entries.get(
            DOMAINS[spec.domain].parse(time_of(spec.domain, epoch)))


# ---- inputs ----------------------------------------------------------------------------


class InputConnector(ABC):
    """One input edge of a job."""

    def __init__(self, wiring: Wiring, edge: EdgeSpec):
        self.w = wiring
        self.edge = edge

    @abstractmethod
    def places(self, epochs: list[int]) -> list[Any] | bool | None:
        """Where the input of each of ``epochs`` (consecutive) is, for the ready prefix
        of them: a list (maybe shorter than ``epochs``, never empty), :data:`WAIT` or
        :data:`ENDED`."""

    @abstractmethod
    def read(self, epochs: list[int], places: list[Any]) -> Any:
        """The input of these epochs as one DataFrame (several: :data:`PASS_COLUMN` says
        each row's epoch)."""

    def logged(self, place: Any) -> dict | None:
        """What the epoch log records of this input for an epoch (its range or version)."""
        return None

    def may_have_closed(self, epoch: int) -> bool:
        """Whether ``epoch`` may be complete here already, asked without a look-up (False
        only where it surely is not): a cheap test before a :meth:`places` that costs a
        round trip, where only a chance is lost when it says no."""
        return True

    def consumed(self, place: Any) -> None:  # noqa: B027 - an optional hook
        """The epoch at ``place`` is done: later epochs start after it."""

    def history(self, epoch: int) -> Any:
        """Every row this edge delivered before ``epoch``."""
        raise RuntimeFailure(f"edge {self.edge.name!r} has no history to read")

    def close(self) -> None:  # noqa: B027 - an optional hook
        """Let go of connections."""


class KafkaCut:
    """Where each epoch ends in each partition of a topic, from the broker's time index.

    The cut of epoch e in a partition is the first offset whose record timestamp is at or
    after the end of e; the same input always gives the same cut. A record of an earlier
    epoch that arrives after the cut is *late*: it falls into a later epoch's range,
    where the region dead-letters it. Every question to the broker is retried while it
    restarts (:func:`falkirk.io.kafka.broker_retry`).
    """

    def __init__(self, bootstrap: str, topic: str):
        self.topic = topic
        self.consumer, parts = self._connect(bootstrap, topic)
        if not parts:
            raise RuntimeFailure(f"topic {topic!r} does not exist on {bootstrap}")
        from kafka import TopicPartition

        self.tps = [TopicPartition(topic, p) for p in sorted(parts)]

    @staticmethod
    @broker_retry
    def _connect(bootstrap: str, topic: str) -> tuple[Any, set[int] | None]:
        """A consumer and the topic's partitions; a broker restarting as the job starts
        is waited for (kafka-python gives up bootstrapping after 30 s)."""
        from kafka import KafkaConsumer

        consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                                 enable_auto_commit=False, client_id="falkirk-cut",
                                 **CLIENT_CONFIG)
        try:
            return consumer, consumer.partitions_for_topic(topic)
        except Exception:
            consumer.close()
            raise

    @broker_retry
    def beginning(self) -> Offsets:
        return Offsets({str(tp.partition): o
                        for tp, o in self.consumer.beginning_offsets(
                            self.tps, timeout_ms=QUESTION_TIMEOUT_MS).items()})

    @broker_retry
    def cut(self, end_ms: int, bound: Offsets | None = None) -> Offsets | None:
        """Offsets where the epoch ending at ``end_ms`` stops; None while incomplete.

        With a ``bound`` (a bounded run), a partition with no record at or after the end is
        complete at its bound, and no cut goes past it."""
        found = self.consumer.offsets_for_times({tp: end_ms for tp in self.tps},
                                               timeout_ms=QUESTION_TIMEOUT_MS)
        cut = {}
        for tp, v in found.items():
            p = str(tp.partition)
            if bound is None:
                if v is None:
                    return None
                cut[p] = v.offset
            else:
                cut[p] = bound.get(p) if v is None else min(v.offset, bound.get(p))
        return Offsets(cut)

    @staticmethod
    def ended(position: Offsets, bound: Offsets | None) -> bool:
        """Every partition reached the declared bound: no epoch will ever come."""
        return bound is not None and all(position.get(p) >= bound.get(p)
                                         for p in bound.as_dict())

    def close(self) -> None:
        self.consumer.close()


def record_ddl(topic: str, roots: tuple = ()) -> str | None:
    """The value schema of a topic's records, from schemas/records/<topic>.json if any."""
    if find("records", topic, roots) is None:
        return None
    return ddl("records", topic, roots)


class KafkaInput(InputConnector):
    """A topic from outside the pipeline; a place is the ``(start, end)`` offsets."""

    def __init__(self, wiring: Wiring, edge: EdgeSpec, done: int):
        super().__init__(wiring, edge)
        self.clock = EpochClock.of(wiring.pipeline)
        self.cutter = KafkaCut(wiring.cfg.kafka_bootstrap, edge.topic)
        self.position = self._start(done)

    def _start(self, done: int) -> Offsets:
        """Where epoch done+1 starts: the end of the range logged for the frontier epoch."""
        if done < 0:
            return self.cutter.beginning()
        row = self.w.row(self.edge.dst, done)
        rng = None if row is None else (row.inputs or {}).get(self.edge.name)
        if rng is None:
            raise RuntimeFailure(
                f"region {self.edge.dst!r} restarts after epoch {done}, but the epoch log has "
                f"no offset range of {self.edge.name!r} for that epoch: cannot know where to "
                "resume")
        return Offsets(rng["to"])

    def places(self, epochs: list[int]) -> list[Any] | bool | None:
        bound = self.w.bound(self.edge.topic)
        if self.cutter.ended(self.position, bound):
            return ENDED
        out, start = [], self.position
        for e in epochs:
            end = self.cutter.cut(self.clock.end_ms(e), bound)
            if end is None:
                break
            end = OFFSETS.join(start, end)  # never before where the previous epoch stopped
            out.append((start, end))
            start = end
            if self.cutter.ended(end, bound):
                break  # the input ends here: later epochs wait for ENDED
        return out or WAIT

    def may_have_closed(self, epoch: int) -> bool:
        """Unbounded, an epoch closes at the first record stamped at or after its end:
        not before that time comes (event time runs behind wall time, or with it)."""
        return (self.w.bound(self.edge.topic) is not None
                or self.clock.end_ms(epoch) <= time.time() * 1000)

    def read(self, epochs: list[int], places: list[Any]) -> Any:
        from pyspark.sql import functions as F

        from falkirk.io.kafka import read_range

        df = read_range(self.w.spark, self.w.cfg.kafka_bootstrap, self.edge.topic,
                        places[0][0], places[-1][1],
                        record_ddl(self.edge.topic, self.w.pipeline.schema_roots))
        if len(epochs) == 1:
            return df
        # The epoch of a record: the first epoch of the pass plus how many of its
        # partition's epoch ends are at or before its offset (one flat expression: a
        # CASE per epoch and partition nested too deep for Spark Connect's plan message).
        ends = F.create_map(*[x for p in places[-1][1].as_dict() for x in (
            F.lit(int(p)), F.array(*[F.lit(end.get(p)) for _, end in places]))])
        before = F.filter(F.element_at(ends, F.col("partition")),
                          lambda x: x <= F.col("offset"))
        return df.withColumn(PASS_COLUMN, (F.lit(epochs[0]) + F.size(before)).cast("long"))

    def logged(self, place: Any) -> dict:
        start, end = place
        return {"from": start.as_dict(), "to": end.as_dict()}

    def consumed(self, place: Any) -> None:
        self.position = place[1]

    def close(self) -> None:
        self.cutter.close()


class DeltaInput(InputConnector):
    """A table another job's region writes; a place is the version its sender's epoch
    ``e - delay`` committed (None: nothing yet, read as empty)."""

    def __init__(self, wiring: Wiring, edge: EdgeSpec, done: int):
        super().__init__(wiring, edge)

    def places(self, epochs: list[int]) -> list[Any] | bool | None:
        edge, w = self.edge, self.w
        sender = w.pipeline.regions[edge.src]
        out = []
        for e in epochs:
            needed = e - edge.delay
            if needed < 0:
                out.append(None)  # nothing yet: read as empty
                continue
            passed = w.passed()
            row = w.logs()[edge.src].readable(
                DOMAINS[sender.domain].parse(time_of(sender.domain, needed)), needed,
                side_input=edge.delay > 0,
                checked=None if passed is None else passed.get(edge.src, set()))
            if row is False:
                if out:
                    break
                ended = w.ends().get(edge.src)
                if ended is not None and ended < needed:
                    return ENDED  # the sender's input ended before this epoch
                w.say_if_sender_died(edge, needed)
                return WAIT  # not committed (or not checked) yet, or quarantined
            if row is None:  # a side input with no good epoch yet: read as empty
                out.append(None)
                continue
            version = (row.outputs or {}).get(edge.name, {}).get("version")
            if version is None:
                raise RuntimeFailure(f"region {edge.src!r} logged epoch {needed} without a "
                                     f"version for edge {edge.name!r}")
            out.append(version)
        return out

    def _empty(self) -> Any:
        return self.w.spark.createDataFrame([], spark_schema(self.w.pipeline, self.edge))

    def read(self, epochs: list[int], places: list[Any]) -> Any:
        from pyspark.sql import functions as F

        from falkirk.io.delta import read_appends_of, read_version

        uri = self.w.cfg.table(self.edge.table)
        opts = self.w.cfg.delta_storage_options or None
        if self.edge.read == "snapshot":  # as of the last epoch's version
            last = places[-1]
            if last is None:
                return self._empty()
            window = None
            if self.edge.window is not None:  # the window of every epoch of the pass
                window = (epochs[0] - self.edge.delay - self.edge.window + 1,
                          epochs[-1] - self.edge.delay)
            return read_version(self.w.spark, uri, last, opts, epochs=window)
        # a side input held back may name one version for several epochs: read once
        commits = sorted({(v, e - self.edge.delay) for e, v in zip(epochs, places,
                                                                   strict=True)
                          if v is not None})
        df = (read_appends_of(self.w.spark, uri, commits, opts) if commits
              else self._empty())
        if len(epochs) == 1:
            return df
        return df.withColumn(PASS_COLUMN, (F.col("epoch") + self.edge.delay).cast("long"))

    def logged(self, place: Any) -> dict | None:
        if place is None:
            return None
        return {"version": place, **({"read": "appends"} if self.edge.read == "appends"
                                     else {})}

    def history(self, epoch: int) -> Any:
        """The table as of the sender's epoch before the first one ``epoch`` delivers:
        every row delivered before ``epoch`` (the table is append-only)."""
        from falkirk.io.delta import read_version

        needed = epoch - self.edge.delay - 1
        if needed < 0:
            return self._empty()
        w = self.w
        row = w.row(self.edge.src, needed)
        version = None if row is None else (row.outputs or {}).get(self.edge.name, {}).get(
            "version")
        if version is None:
            raise RuntimeFailure(f"edge {self.edge.name!r}: the epoch log has no version of "
                                 f"{self.edge.src!r}'s epoch {needed}, the history before "
                                 f"epoch {epoch}")
        return read_version(w.spark, w.cfg.table(self.edge.table), version,
                            w.cfg.delta_storage_options or None)


def input_for(wiring: Wiring, edge: EdgeSpec, done: int) -> InputConnector:
    """The connector that reads ``edge`` for a job whose receiving region is at ``done``."""
    return INPUTS[edge.kind](wiring, edge, done)


# ---- outputs ---------------------------------------------------------------------------


class OutputConnector(ABC):
    """One output of a region (a table, which several edges may share, or a topic)."""

    def __init__(self, wiring: Wiring, region: str, edges: list[EdgeSpec]):
        self.w = wiring
        self.region = region
        self.edges = edges

    @property
    def edge(self) -> EdgeSpec:
        return self.edges[0]

    @abstractmethod
    def prepare(self, df: Any, epochs: list[int]) -> Any:
        """The Spark work of making the epochs' rows durable (a table's files, not yet in
        it; a topic's records, sent): the loop prepares every output of an epoch side by
        side, then commits them."""

    @abstractmethod
    def commit(self, prepared: Any) -> dict[int, dict]:
        """Make what :meth:`prepare` wrote durable; per epoch, what the epoch log records
        of it."""

    def discard(self, prepared: Any) -> None:  # noqa: B027 - an optional hook
        """Forget what was prepared and will not be committed (prepared again)."""


class DeltaOutput(OutputConnector):
    """A table, written exactly once per epoch and generation (:class:`EpochWriter`)."""

    def __init__(self, wiring: Wiring, region: str, edges: list[EdgeSpec]):
        super().__init__(wiring, region, edges)
        from falkirk.io.delta import EpochWriter

        w = wiring
        self.writer = EpochWriter(w.spark, w.cfg.table(self.edge.table), region, w.generation,
                                  arrow_schema("tables", self.edge.table_schema,
                                               w.pipeline.schema_roots),
                                  w.cfg.delta_storage_options or None,
                                  pipeline=w.pipeline.name)
        self.writer.ensure_table()

    @property
    def schema(self):
        return self.writer.schema

    def prepare(self, df: Any, epochs: list[int]) -> Any:
        """Raises :class:`~falkirk.io.lake.NullViolation` when a row has a null where the
        table declares none (nothing left behind)."""
        return self.writer.prepare(df, epochs)

    def discard(self, prepared: Any) -> None:
        self.writer.discard(prepared)

    def commit(self, prepared: Any) -> dict[int, dict]:
        results = self.writer.commit(prepared)
        out = {}
        for e, result in results.items():
            version = result.version if result is not None else self.writer.version_of(e)
            if version is None:  # committed before a crash, in this generation: found
                raise RuntimeFailure(f"{self.edge.table}: epoch {e} marked committed but "
                                     "not found")
            out[e] = {"table": self.edge.table, "version": version}
        return out


class KafkaOutput(OutputConnector):
    """A topic, created as declared; every record carries the generation, epoch and
    region that sent it (docs/outputs.md)."""

    def __init__(self, wiring: Wiring, region: str, edges: list[EdgeSpec]):
        super().__init__(wiring, region, edges)
        from falkirk.io.kafka import ensure_topics

        broker_retry(ensure_topics)(wiring.cfg.kafka_bootstrap,
                                    {self.edge.topic: self.edge.partitions}, outputs=True)

    def commit(self, prepared: Any) -> dict[int, dict]:
        return prepared  # sent when prepared: Kafka has no commit to defer

    def prepare(self, df: Any, epochs: list[int]) -> Any:
        from pyspark.sql import functions as F

        from falkirk.io.kafka import EPOCH_HEADER, GENERATION_HEADER, REGION_HEADER, produce

        epoch = F.lit(str(epochs[0])) if len(epochs) == 1 else F.col(PASS_COLUMN).cast(
            "string")
        headers = {GENERATION_HEADER: F.lit(str(self.w.generation)), EPOCH_HEADER: epoch,
                   REGION_HEADER: F.lit(self.region)}
        counts = produce(df, self.w.cfg.kafka_bootstrap, self.edge.topic, headers,
                         by=None if len(epochs) == 1 else (PASS_COLUMN, epochs))
        if len(epochs) == 1:
            counts = {epochs[0]: counts[-1]}
        return {e: {"topic": self.edge.topic, "records": counts.get(e, 0)} for e in epochs}


class Computed(OutputConnector):
    """A table computed and thrown away (``persist=False``: the benchmarks' all-ephemeral
    baseline pays for the rows, not for their commit)."""

    schema = None

    def prepare(self, df: Any, epochs: list[int]) -> Any:
        df.write.format("noop").mode("overwrite").save()
        return {e: {"table": self.edge.table, "version": -1} for e in epochs}

    def commit(self, prepared: Any) -> dict[int, dict]:
        return prepared


INPUTS: dict[str, type[InputConnector]] = {"kafka": KafkaInput, "delta": DeltaInput}
OUTPUTS: dict[str, type[OutputConnector]] = {"kafka": KafkaOutput, "delta": DeltaOutput}


def outputs_for(wiring: Wiring, region: str, persist: bool = True) -> list[OutputConnector]:
    """A region's output connectors: one per table or topic (edges may share a table);
    unlogged edges have none (records passed inside the job). Without ``persist`` tables
    are only computed (topics are still sent to)."""
    kinds = OUTPUTS if persist else {**OUTPUTS, "delta": Computed}
    places: dict[tuple[str, str], list[EdgeSpec]] = {}
    for edge in wiring.pipeline.out_edges(region):
        if edge.kind in kinds:
            places.setdefault((edge.kind, edge.table or edge.topic), []).append(edge)
    return [kinds[kind](wiring, region, edges) for (kind, _), edges in places.items()]
