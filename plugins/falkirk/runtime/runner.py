"""Running regions: one epoch at a time, each under its own fault-tolerance regime.

A *job* (one Spark application, ``jobs/<name>.py``) hosts one region, or several joined
by unlogged edges (records passed inside the job). The runner drives the job's epochs:

1. wait until epoch e is complete at every input: a Kafka input has a record at or after
   the epoch's end in every partition (found with the broker's time index, records are
   stamped with their event time), or the partition reached its declared bound (a bounded
   run: the end offsets in the log's ``bounds`` table); a logged Delta edge has the
   sender's epoch ``e - delay`` committed in the epoch log;
2. log ``running``; read the epoch's input (Kafka: exactly the offset range of the cut,
   with Spark's Kafka connector; Delta: the table at the version the sender logged);
3. run the job's pure transforms (the job's :class:`JobLogic`);
4. commit outputs: Delta edges through the exactly-once writer (delta-spark, app
   transaction per region and generation), Kafka outputs produced with Spark's Kafka
   connector (acks=all; clients keep the latest per key);
5. persist state as the regime says: eager every epoch, lazy every K epochs (incremental
   checkpoints: only keys that changed); ephemeral and batch keep none;
6. log ``committed`` (or ``checkpointed``) with the input ranges, output versions and
   state reference: what the rollback solver needs.

The epoch log, not Spark's checkpoint folder, is the source of truth: a region always
(re)starts from the frontier the log (or a rollback plan) names.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial, reduce
from pathlib import Path
from types import ModuleType
from typing import Any

import pyarrow as pa

from falkirk.config import Config, load
from falkirk.errors import FalkirkError
from falkirk.faults import maybe_hold
from falkirk.io.kafka import CLIENT_CONFIG, QUESTION_TIMEOUT_MS, broker_retry
from falkirk.io.spark import (
    current_group,
    cut_lineage,
    jobs_in_group,
    label_jobs,
    quiet,
    work_unit,
)
from falkirk.local.engine import serving
from falkirk.log.epochlog import EpochLog, EpochRecord, RegionLog
from falkirk.model.schemas import arrow_schema, ddl, find, use_pipeline
from falkirk.model.times import DOMAINS, OFFSETS, Offsets, epoch_of_key, time_of
from falkirk.model.topology import EdgeSpec, Pipeline
from falkirk.runtime.park import (
    ENGINE_LOST_EXIT,
    PARK_WAIT_S,
    RUNNING_STATUSES,
    FenceWatch,
    wait_for_rollback,
)

log = logging.getLogger("falkirk.runtime")



SENDER_CHECK_S = 5.0  # how often a waiting region looks whether its sender's job died
BOUND_CHECK_S = 2.0  # how often a waiting job re-reads the declared bounds of its inputs


class RuntimeFailure(FalkirkError):
    """A region cannot go on (its input is gone, its declaration does not fit the job)."""


# ---- epochs and Kafka cuts ------------------------------------------------------------


class Fenced(RuntimeFailure):
    """A rollback to ``generation`` fenced the job's regions: it records no more epochs."""

    def __init__(self, message: str, generation: int):
        super().__init__(message)
        self.generation = generation


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


# ---- what a job provides ---------------------------------------------------------------


@dataclass
class EpochContext:
    """Everything a job's transforms get for one epoch."""

    epoch: int
    generation: int
    spark: Any
    pipeline: Pipeline
    inputs: dict[str, Any]  # input edge -> DataFrame of this epoch (Kafka) or "as of" (Delta)
    state: dict[str, Any]  # stateful region -> its state (the job's own representation)
    active: set[str]  # regions of the job that process this epoch (others are past it)


@dataclass
class EpochResult:
    """What a job's transforms return: outputs per edge, and new state per region."""

    outputs: dict[str, Any] = field(default_factory=dict)  # edge -> DataFrame
    state: dict[str, Any] = field(default_factory=dict)


class JobLogic(ABC):
    """A job's pure part. Subclasses set ``regions`` and implement ``process``.

    Stateful regions also say how their state becomes a DataFrame with a unique string
    ``key`` column and the ``state_schema`` value columns (for the incremental checkpoints,
    which Spark computes and writes) and back.
    """

    regions: tuple[str, ...] = ()

    @abstractmethod
    def process(self, ctx: EpochContext) -> EpochResult:
        """Run the job's transforms on one epoch's inputs."""

    def finish_epoch(self, ctx: EpochContext) -> None:  # noqa: B027 - an optional hook
        """Called once the epoch's outputs are committed (free cached data here)."""

    def release(self) -> None:  # noqa: B027 - an optional hook
        """Let go of frames held across epochs (the runner is closing)."""

    def initial_state(self, region: str, spark: Any) -> Any:
        return None

    def state_schema(self, region: str) -> pa.Schema:
        """Value columns of the region's checkpoints (besides the string ``key``)."""
        raise RuntimeFailure(f"{type(self).__name__} keeps state for {region!r} but declares "
                             "no state_schema")

    def state_to_frame(self, region: str, state: Any) -> Any:
        raise RuntimeFailure(f"{type(self).__name__} cannot checkpoint {region!r}")

    def state_from_frame(self, region: str, frame: Any, spark: Any) -> Any:
        raise RuntimeFailure(f"{type(self).__name__} cannot restore {region!r}")


# ---- the runner ------------------------------------------------------------------------


class JobRunner:
    """Runs a job's regions epoch by epoch; see the module docstring."""

    def __init__(self, pipeline: Pipeline, logic: JobLogic, spark: Any,
                 cfg: Config | None = None, epoch_log: EpochLog | None = None,
                 start: dict[str, int] | None = None, persist: bool = True,
                 generation: int | None = None):
        self.pipeline = pipeline
        use_pipeline(pipeline.schema_roots)  # the job's transforms name its tables bare
        # persist=False runs the same transforms with nothing made durable (no epoch log,
        # no Delta commits, no checkpoints): the all-ephemeral baseline of the benchmarks.
        self.persist = persist
        # Per epoch: (epoch, seconds, finished at (wall clock), records read per Kafka edge).
        self.timings: list[tuple[int, float, float, dict[str, int]]] = []
        # Seconds per phase over the run (epoch-log bookkeeping, input set-up, the job's
        # process, each region's commits, sends and checkpoints): the benchmarks' profile.
        self.profile: dict[str, float] = {}
        # Spark jobs per phase over the run (counted in the epoch's job group): the same
        # split, in the unit Spark's scheduler pays a fixed cost for.
        self.spark_jobs: dict[str, int] = {}
        self._group, self._jobs_seen = "", 0
        self._jobs_aside = 0  # Spark jobs of an epoch's commits, in job groups of their own
        self.epoch_jobs: list[int] = []  # Spark jobs of each epoch, in order
        self.logic = logic
        self.spark = spark
        self.cfg = cfg or load()
        self.log = epoch_log or EpochLog.from_config(self.cfg)
        self.clock = EpochClock.of(pipeline)
        unknown = set(logic.regions) - set(pipeline.regions)
        if unknown:
            raise RuntimeFailure(f"job {type(logic).__name__} runs regions {sorted(unknown)} "
                                 f"that pipeline {pipeline.name!r} does not declare")
        self.regions = list(logic.regions)
        # The log's current generation, or a rollback's done (a job resuming after it: a
        # newer rollback that fenced it meanwhile then parks it again at once).
        self.generation = (self.log.generation(pipeline.name) if generation is None
                           else generation)
        logs = self.log.regions(pipeline)
        # Each region restarts after its frontier: given by a rollback, else its latest
        # restorable entry in the log.
        self.done: dict[str, int] = {}
        for r in self.regions:
            if start and r in start:
                self.done[r] = start[r]
            else:
                rows = logs[r].restorable(pipeline.regions[r].regime)
                spec = pipeline.regions[r]
                self.done[r] = -1 if not rows else epoch_of_key(
                    spec.domain, DOMAINS[spec.domain].parse(rows[-1].time))
        self.state: dict[str, Any] = {}
        self.state_frames: dict[str, Any] = {}  # region -> its state at its last checkpoint
        # region -> when it last checkpointed or was restored (checkpoint_seconds)
        self.checkpointed_at: dict[str, float] = dict.fromkeys(self.regions, time.monotonic())
        self.checkpoints: dict[str, Any] = {}
        for r in self.regions:
            if pipeline.regions[r].keeps_state:
                self._restore_state(r, logs[r])
        self.positions: dict[str, Offsets] = {}  # Kafka input edge -> where the next epoch starts
        self.cuts: dict[str, KafkaCut] = {}
        self._sender_checked: dict[str, float] = {}  # edge -> when its sender was last checked
        self._said_dead: set[tuple] = set()  # (job, pid, started) already said to be dead
        self._bounds: dict[str, Offsets] = {}  # input topic -> its declared end
        self._bounds_read = float("-inf")
        for e in self._external_inputs():
            self.cuts[e.name] = KafkaCut(self.cfg.kafka_bootstrap, e.topic)
            self.positions[e.name] = self._start_offsets(e, logs)
        self.writers: dict[tuple[str, str], Any] = {}
        self.topics_made: set[str] = set()  # output topics known to exist as declared
        self.watch: FenceWatch | None = None  # set when the job parks (JobDriver)

    # -- setup --------------------------------------------------------------------------

    def internal(self, edge: EdgeSpec) -> bool:
        """Records passed inside this job (unlogged, or a table its own region writes)."""
        return edge.kind == "unlogged" or (edge.kind == "delta" and edge.src in self.regions)

    def _external_inputs(self) -> list[EdgeSpec]:
        out = []
        for r in self.regions:
            for e in self.pipeline.in_edges(r):
                if e.kind == "kafka":
                    out.append(e)
        return out

    def _start_offsets(self, edge: EdgeSpec, logs: dict[str, RegionLog]) -> Offsets:
        """Where epoch done+1 starts: the end of the range logged for the frontier epoch."""
        region = edge.dst
        done = self.done[region]
        if done < 0:
            return self.cuts[edge.name].beginning()
        spec = self.pipeline.regions[region]
        row = logs[region].entries.get(DOMAINS[spec.domain].parse(time_of(spec.domain, done)))
        rng = None if row is None else (row.inputs or {}).get(edge.name)
        if rng is None:
            raise RuntimeFailure(
                f"region {region!r} restarts after epoch {done}, but the epoch log has no "
                f"offset range of {edge.name!r} for that epoch: cannot know where to resume"
            )
        return Offsets(rng["to"])

    def checkpoint_store(self, region: str):
        from falkirk.regimes.checkpoints import CheckpointStore

        if region not in self.checkpoints:
            self.checkpoints[region] = CheckpointStore(
                self.cfg.table("_falkirk_state", self.pipeline.name, region),
                self.logic.state_schema(region), self.cfg.delta_storage_options or None)
        return self.checkpoints[region]

    def _restore_state(self, region: str, rlog: RegionLog) -> None:
        done = self.done[region]
        if done < 0:
            self.state[region] = self.logic.initial_state(region, self.spark)
            self.state_frames[region] = None
            return
        spec = self.pipeline.regions[region]
        row = rlog.entries.get(DOMAINS[spec.domain].parse(time_of(spec.domain, done)))
        if row is None or row.state_ref is None:
            raise RuntimeFailure(
                f"region {region!r} restarts after epoch {done}, but the epoch log names no "
                "state checkpoint for it"
            )
        # Read once and kept: the job's state is built from it and the next checkpoint's
        # diff compares with it. Uncut, each use read the store again and ranked its rows
        # (stats' checkpoint in the first epoch after a restore: 15-28 Spark stages, 14
        # cut), and a state of several parts (communities') read it once per part.
        frame = cut_lineage(self.checkpoint_store(region).restore_frame(
            self.spark, int(row.state_ref.split(":")[-1])))
        self.state_frames[region] = frame
        self.state[region] = self.logic.state_from_frame(region, frame, self.spark)
        log.info("region %s: state restored from %s", region, row.state_ref)

    def writer(self, region: str, edge: EdgeSpec):
        from falkirk.io.delta import EpochWriter

        key = (region, edge.table)
        if key not in self.writers:
            w = EpochWriter(self.spark, self.cfg.table(edge.table), region, self.generation,
                            arrow_schema("tables", edge.table_schema, self.pipeline.schema_roots),
                            self.cfg.delta_storage_options or None, pipeline=self.pipeline.name)
            w.ensure_table()
            self.writers[key] = w
        return self.writers[key]

    # -- the loop -----------------------------------------------------------------------

    @property
    def next_epoch(self) -> int:
        return min(self.done.values()) + 1

    def run(self, until_epoch: int | None = None, poll_s: float = 0.5,
            idle_timeout_s: float | None = None, on_epoch: Callable[[int], None] | None = None
            ) -> int:
        """Process epochs until ``until_epoch`` (inclusive) or the input ends; return the
        last epoch done."""
        idle_since = time.monotonic()
        while until_epoch is None or self.next_epoch <= until_epoch:
            e = self.next_epoch
            if self.watch is not None and self.watch.fenced is not None:
                self._fenced(self.watch.fenced, f"epoch {e} is not started")
            if self.watch is not None and self.watch.engine_lost:
                raise RuntimeFailure(
                    f"job {'+'.join(self.regions)}: the Spark engine at "
                    f"{self.cfg.spark_remote} stopped answering before epoch {e}; the job's "
                    "session (its state) is gone with it")
            ready = self._ready(e)
            if ready is None:  # the input ended: nothing more will come
                self._record_end(e - 1)
                break
            if ready is False:
                if idle_timeout_s is not None and time.monotonic() - idle_since > idle_timeout_s:
                    raise RuntimeFailure(
                        f"job {'+'.join(self.regions)}: epoch {e} not complete at its inputs "
                        f"after {idle_timeout_s:.0f} s")
                time.sleep(poll_s)
                continue
            self.process_epoch(e, ready)
            idle_since = time.monotonic()
            if on_epoch is not None:
                on_epoch(e)
        else:  # stopped at until_epoch: say so if the input also ends there
            if self._ready(self.next_epoch) is None:
                self._record_end(self.next_epoch - 1)
        return self.next_epoch - 1

    def _record_end(self, through: int) -> None:
        """The input ended after epoch ``through``: receivers that read only our Delta
        outputs (and would wait for the next epoch forever) end too."""
        if self.persist:
            self.log.record_end(self.pipeline.name, self.regions, through, self.generation)

    def _ready(self, e: int) -> dict | None | bool:
        """Input locations of epoch e when complete; False while not; None when ended."""
        where: dict[str, Any] = {}
        logs = None
        passed: dict[str, set[tuple[int, int]]] | bool | None = None
        for r in self.regions:
            for edge in self.pipeline.in_edges(r):
                if self.internal(edge):
                    continue
                if edge.kind == "kafka":
                    cut = self.cuts[edge.name]
                    position = self.positions[edge.name]
                    bound = self._bound(edge.topic)
                    if cut.ended(position, bound):
                        return None
                    end = cut.cut(self.clock.end_ms(e), bound)
                    if end is None:
                        return False
                    # Never before where the previous epoch stopped (cuts only move on).
                    where[edge.name] = (position, OFFSETS.join(position, end))
                else:  # a logged Delta edge from another job's region
                    needed = e - edge.delay
                    if needed < 0:
                        where[edge.name] = None  # nothing yet: read as empty
                        continue
                    logs = logs if logs is not None else self.log.regions(self.pipeline)
                    sender = self.pipeline.regions[edge.src]
                    if passed is None:
                        passed = self._passed()
                    row = logs[edge.src].readable(
                        DOMAINS[sender.domain].parse(time_of(sender.domain, needed)), needed,
                        side_input=edge.delay > 0,
                        checked=None if passed is False else passed.get(edge.src, set()))
                    if row is False:
                        ended = self.log.ends(self.pipeline.name).get(edge.src)
                        if ended is not None and ended < needed:
                            return None  # the sender's input ended before this epoch
                        self._say_if_sender_died(edge, needed)
                        return False  # not committed (or not checked) yet, or quarantined
                    if row is None:  # a side input with no good epoch yet: read as empty
                        where[edge.name] = None
                        continue
                    version = (row.outputs or {}).get(edge.name, {}).get("version")
                    if version is None:
                        raise RuntimeFailure(
                            f"region {edge.src!r} logged epoch {needed} without a version for "
                            f"edge {edge.name!r}")
                    where[edge.name] = version
        return where

    def _bound(self, topic: str) -> Offsets | None:
        """The declared end of input ``topic`` (a bounded run), or None (a continuous run);
        read from the log at most every :data:`BOUND_CHECK_S` seconds."""
        now = time.monotonic()
        if now - self._bounds_read >= BOUND_CHECK_S:
            self._bounds = {t: Offsets(o) for t, o in self.log.bounds(self.pipeline.name).items()}
            self._bounds_read = now
        return self._bounds.get(topic)

    def _say_if_sender_died(self, edge: EdgeSpec, needed: int) -> None:
        """Waiting on a region whose job is dead: say so at once (once per job run), not
        only when the idle timeout runs out. The wait goes on: a supervisor or a rollback
        restarts the sender, and this region then carries on."""
        now = time.monotonic()
        if now - self._sender_checked.get(edge.name, 0.0) < SENDER_CHECK_S:
            return
        self._sender_checked[edge.name] = now
        from falkirk.runtime.procs import is_process, this_process

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

    def _passed(self) -> dict[str, set[tuple[int, int]]] | bool:
        """With ``settings.checks.hold``: per region, the (epoch, generation) whose data
        checks all passed (receivers read only those); False when epochs are not held."""
        if not self.pipeline.checks_setting("hold"):
            return False
        return self.log.passed_checks(self.pipeline.name)

    def _spent(self, phase: str, since: float) -> float:
        """Add the seconds since ``since`` to ``phase`` in the profile; now."""
        now = time.monotonic()
        self.profile[phase] = self.profile.get(phase, 0.0) + now - since
        seen = jobs_in_group(self.spark, self._group)
        self.spark_jobs[phase] = self.spark_jobs.get(phase, 0) + seen - self._jobs_seen
        self._jobs_seen = seen
        return now

    def process_epoch(self, e: int, where: dict) -> None:
        from falkirk.io.delta import read_appends, read_version
        from falkirk.io.kafka import read_range

        started = time.monotonic()
        active = {r for r in self.regions if self.done[r] < e}
        self._group = name_spark_jobs(self.spark, self.pipeline.name, active, e,
                                      self.generation)
        self._jobs_seen = jobs_before_epoch = jobs_in_group(self.spark, self._group)
        self._jobs_aside = 0
        profile_before, jobs_before = dict(self.profile), dict(self.spark_jobs)
        # A region that restarted from a checkpoint older than epochs it already committed
        # (and no rollback invalidated) redoes them for its state only: their outputs are
        # live, and committing them again (in a new generation) would duplicate them.
        redo: dict[str, EpochRecord] = {}
        if self.persist:
            logs = self.log.regions(self.pipeline)
            for r in active:
                row = logs[r].entries.get(DOMAINS[self.pipeline.regions[r].domain].parse(
                    self._time(r, e)))
                if row is not None and row.status in ("committed", "checkpointed"):
                    redo[r] = row
            self.log.record(*(EpochRecord(self.pipeline.name, r, self._time(r, e),
                                          self.generation, "running",
                                          note=f"pid {os.getpid()}")
                              for r in active if r not in redo))
        t = self._spent("epoch log", started)
        inputs: dict[str, Any] = {}
        ranges: dict[str, dict] = {}
        for r in self.regions:
            for edge in self.pipeline.in_edges(r):
                if self.internal(edge):
                    continue
                if edge.kind == "kafka":
                    start, end = where[edge.name]
                    ranges[edge.name] = {"from": start.as_dict(), "to": end.as_dict()}
                    inputs[edge.name] = read_range(
                        self.spark, self.cfg.kafka_bootstrap, edge.topic, start, end,
                        record_ddl(edge.topic, self.pipeline.schema_roots))
                elif edge.kind == "delta":
                    version = where[edge.name]
                    uri = self.cfg.table(edge.table)
                    if version is None:
                        inputs[edge.name] = self.spark.createDataFrame(
                            [], _empty_schema(self.pipeline, edge))
                    elif edge.read == "appends":
                        inputs[edge.name] = read_appends(
                            self.spark, uri, version, e - edge.delay,
                            self.cfg.delta_storage_options or None)
                        ranges[edge.name] = {"version": version, "read": "appends"}
                    else:
                        inputs[edge.name] = read_version(self.spark, uri, version,
                                                         self.cfg.delta_storage_options or None)
                        ranges[edge.name] = {"version": version}
        ctx = EpochContext(e, self.generation, self.spark, self.pipeline, inputs,
                           dict(self.state), active)
        t = self._spent("inputs", t)
        result = self.logic.process(ctx)
        t = self._spent("process", t)

        # The epoch's commits (Delta outputs, Kafka sends, checkpoints) go to different
        # tables and topics: they run side by side (:meth:`_side_by_side`), each commit's
        # fixed cost (Delta's log work, its small Spark jobs) overlapping the others'.
        # A region's dead letters come last: they take the rows its other outputs refused.
        outputs: dict[str, dict[str, Any]] = {r: {} for r in self.regions}
        refused: dict[str, list[Any]] = {r: [] for r in self.regions}
        first: list[tuple[str, Callable[[], Any]]] = []
        last: list[tuple[str, Callable[[], Any]]] = []
        for r in sorted(active):
            if r in redo:  # its outputs of this epoch are live already
                outputs[r] = dict(redo[r].outputs or {})
                continue
            dead = self.pipeline.dead_letter_edge(r)
            tables: dict[str, list[EdgeSpec]] = {}  # table -> its edges (edges may share one)
            for edge in self.pipeline.out_edges(r):
                if edge.kind == "delta":
                    tables.setdefault(edge.table, []).append(edge)
                elif edge.kind == "kafka":
                    first.append((f"send {r}", partial(
                        self._send, r, edge, self._output(result, r, edge, e), e, outputs)))
            for edges in tables.values():
                edge = next((x for x in edges if result.outputs.get(x.name) is not None),
                            edges[0])
                is_dead = dead is not None and edge.table == dead.table
                (last if is_dead else first).append((f"write {r}", partial(
                    self._write, r, edges, self._output(result, r, edge, e), e, outputs,
                    refused[r], dead is not None, is_dead)))
        state_refs: dict[str, str] = {}
        for r in sorted(active):
            spec = self.pipeline.regions[r]
            if spec.keeps_state:
                self.state[r] = result.state.get(r, self.state.get(r))
                due = spec.regime_rules.checkpoint_due(
                    spec, e, time.monotonic() - self.checkpointed_at[r])
                if due and self.persist and not (r in redo and redo[r].status == "checkpointed"):
                    first.append((f"checkpoint {r}", partial(self._checkpoint, r, e,
                                                             state_refs)))
        t = self._side_by_side(first, t)
        t = self._side_by_side(last, t)
        rows = []
        for r in sorted(active):
            state_ref = state_refs.get(r)
            status = "committed" if state_ref is None else "checkpointed"
            if r in redo and state_ref is None:  # nothing new to say about this epoch
                self.done[r] = e
                continue
            mine = {k: v for k, v in ranges.items()
                    if self.pipeline.edges[k].dst == r}
            rows.append(EpochRecord(self.pipeline.name, r, self._time(r, e), self.generation,
                                    status, inputs=mine or None, outputs=outputs[r] or None,
                                    state_ref=state_ref, note=f"pid {os.getpid()}"))
            self.done[r] = e
        if self.persist:
            self._check_fence(e)
            maybe_hold("runner:fence-checked")
            self.log.record(*rows)
        t = self._spent("epoch log", t)
        self.logic.finish_epoch(ctx)
        self._spent("finish", t)
        for name, (_, end) in ((k, v) for k, v in where.items() if k in self.positions):
            self.positions[name] = end
        seconds = time.monotonic() - started
        counts = {k: sum(Offsets(v["to"]).get(p) - Offsets(v["from"]).get(p)
                         for p in Offsets(v["to"]).as_dict())
                  for k, v in ranges.items() if "to" in v}
        self.timings.append((e, seconds, time.time(), counts))
        # as of the last phase (Spark's status store is fed asynchronously: a later look
        # could count a job no phase did)
        self.epoch_jobs.append(self._jobs_seen - jobs_before_epoch + self._jobs_aside)
        log.info("epoch %d done by %s in %.1f s (%d %s; %s)", e,
                 "+".join(sorted(active)), seconds, self.epoch_jobs[-1], work_unit(self.spark),
                 epoch_profile(self.profile, profile_before, self.spark_jobs, jobs_before))

    def _check_fence(self, e: int) -> None:
        """Refuse to record epoch ``e`` once a rollback fenced one of our regions: it is
        stopping this job and plans from the log as it is, so a row recorded now could
        say ``committed`` over data its restore removes."""
        newer = self.log.fenced(self.pipeline.name, self.regions, self.generation)
        if newer is not None:
            self._fenced(newer, f"epoch {e} is not recorded")

    def _fenced(self, newer: int, what: str) -> None:
        raise Fenced(f"pipeline {self.pipeline.name!r}, job {'+'.join(self.regions)} "
                     f"(generation {self.generation}): a rollback to generation {newer} "
                     f"fenced it; {what}", newer)

    def _output(self, result: EpochResult, region: str, edge: EdgeSpec, e: int) -> Any:
        """The DataFrame a job produced for an output edge (by edge, else by its table)."""
        df = result.outputs.get(edge.name)
        if df is None and edge.kind == "delta":
            df = result.outputs.get(edge.table)
        if df is None:
            raise RuntimeFailure(f"job {type(self.logic).__name__} produced nothing for "
                                 f"edge {edge.name!r} of region {region!r} in epoch {e}")
        return df

    def _write(self, region: str, edges: list[EdgeSpec], df: Any, e: int,
               outputs: dict[str, dict[str, Any]], refused: list[Any], has_dead: bool,
               is_dead: bool) -> None:
        """Commit one Delta table of the region's epoch; every edge on it gets its version.
        The dead-letter table also takes the rows the region's other tables refused."""
        if is_dead and refused:
            df = reduce(lambda a, b: a.unionByName(b), refused, df)
        version = (self._commit(region, edges[0], df, e,
                                refused if has_dead and not is_dead else None)
                   if self.persist else _materialize(df))
        for edge in edges:
            outputs[region][edge.name] = {"table": edge.table, "version": version}

    def _send(self, region: str, edge: EdgeSpec, df: Any, e: int,
              outputs: dict[str, dict[str, Any]]) -> None:
        """Produce the region's epoch to an output topic (acks=all: a failed send raises)."""
        from falkirk.io.kafka import ensure_topics, produce

        if edge.topic not in self.topics_made:  # not a broker's auto-creation
            broker_retry(ensure_topics)(self.cfg.kafka_bootstrap,
                                        {edge.topic: edge.partitions}, outputs=True)
            self.topics_made.add(edge.topic)
        outputs[region][edge.name] = {"topic": edge.topic, "records": produce(
            df, self.cfg.kafka_bootstrap, edge.topic, self._headers(region, e))}

    def _side_by_side(self, tasks: list[tuple[str, Callable[[], Any]]], since: float
                      ) -> float:
        """Run ``(phase, task)`` pairs at once, each in a thread of its own; now.

        Each task's Spark jobs run in a job group of their own (``<epoch group>|<i>:<phase>``,
        local properties are per thread), so its seconds and Spark jobs still go to its
        phase in the profile (phases then overlap: their seconds add up to more than the
        epoch's). When one fails, the others are let finish, then the first failure is
        raised: no commit is left running behind the job's exit."""
        if not tasks:
            return since
        if len(tasks) == 1:  # nothing to overlap: in this thread, as before
            phase, task = tasks[0]
            task()
            return self._spent(phase, since)
        from concurrent.futures import ThreadPoolExecutor

        from pyspark import inheritable_thread_target

        group = self._group

        def run(i: int, phase: str, task: Callable[[], Any]) -> tuple[float, int]:
            sub = label_jobs(self.spark, f"{group}|{i}:{phase}")
            t0 = time.monotonic()
            task()
            return time.monotonic() - t0, jobs_in_group(self.spark, sub)

        with ThreadPoolExecutor(len(tasks), thread_name_prefix="falkirk-commit") as pool:
            futures = [(phase, pool.submit(inheritable_thread_target(self.spark)(run),
                                           i, phase, task))
                       for i, (phase, task) in enumerate(tasks)]
            errors = [f.exception() for _, f in futures if f.exception() is not None]
        if errors:
            raise errors[0]
        for phase, f in futures:
            seconds, jobs = f.result()
            self.profile[phase] = self.profile.get(phase, 0.0) + seconds
            self.spark_jobs[phase] = self.spark_jobs.get(phase, 0) + jobs
            self._jobs_aside += jobs
        now = time.monotonic()
        self.profile["commits side by side"] = (self.profile.get("commits side by side", 0.0)
                                               + now - since)
        return now

    def _headers(self, region: str, e: int) -> dict[str, str]:
        from falkirk.io.kafka import EPOCH_HEADER, GENERATION_HEADER, REGION_HEADER

        return {GENERATION_HEADER: str(self.generation), EPOCH_HEADER: str(e),
                REGION_HEADER: region}

    def _time(self, region: str, e: int) -> Any:
        return time_of(self.pipeline.regions[region].domain, e)

    def _commit(self, region: str, edge: EdgeSpec, df: Any, e: int,
                refused: list | None = None) -> int:
        """Commit one output of epoch e; its table's version. With ``refused`` (the region
        has a dead-letter table), rows with a null where the table declares none are taken
        out and added to ``refused`` when Delta refuses them: the rest commits."""
        from falkirk.io.lake import NullViolation
        from falkirk.io.spark import null_violations

        w = self.writer(region, edge)
        try:
            result = w.write_epoch(df, e)
        except NullViolation as err:
            if refused is None:
                raise
            df, bad = null_violations(df, w.schema, edge.table, e)
            log.warning("%s; those rows go to the region's dead letters", err)
            refused.append(bad)
            result = w.write_epoch(df, e)
        if result is not None:
            return result.version
        version = w.version_of(e)  # committed before a crash, in this generation
        if version is None:
            raise RuntimeFailure(f"{edge.table}: epoch {e} marked committed but not found")
        return version

    def _checkpoint(self, region: str, e: int, refs: dict[str, str]) -> None:
        """Save the region's state of epoch ``e``; ``refs[region]`` names the checkpoint."""
        frame = self.logic.state_to_frame(region, self.state[region])
        self.checkpoint_store(region).save_frame(e, frame, self.state_frames.get(region))
        self.state_frames[region] = frame
        self.checkpointed_at[region] = time.monotonic()
        refs[region] = f"checkpoint:{e}"

    def close(self) -> None:
        """Close the Kafka cuts and let go of the state frames (their checkpointed blocks):
        a session that runs another pipeline next must not hold this one's."""
        for cut in self.cuts.values():
            cut.close()
        self.state.clear()
        self.state_frames.clear()
        self.logic.release()


def _materialize(df: Any) -> int:
    """Compute a DataFrame without keeping it (what a write costs, minus the write)."""
    df.write.format("noop").mode("overwrite").save()
    return -1


class CompositeJob(JobLogic):
    """Several jobs' logics in one process, in dataflow order.

    Tables one part writes and a later part reads are handed over in memory (the epoch's
    output, accumulated over epochs, cut at ``e - delay``), so a whole pipeline runs as one
    Spark application: what the benchmarks compare with and without persistence.
    """

    def __init__(self, pipeline: Pipeline, parts: list[JobLogic]):
        self.pipeline = pipeline
        self.parts = parts
        self.regions = tuple(r for part in parts for r in part.regions)
        self.memory: dict[str, Any] = {}  # table -> every epoch's output so far
        # Seconds per part ("transform:<regions>"): its process and the materialization of
        # the tables it hands over (the rest of its work is in the runner's write phases).
        self.seconds: dict[str, float] = {}
        self.spark_jobs: dict[str, int] = {}  # the same split, in Spark jobs

    def initial_state(self, region: str, spark: Any) -> Any:
        return self._owner(region).initial_state(region, spark)

    def _owner(self, region: str) -> JobLogic:
        return next(p for p in self.parts if region in p.regions)

    def state_schema(self, region: str) -> pa.Schema:
        return self._owner(region).state_schema(region)

    def state_to_frame(self, region: str, state: Any) -> Any:
        return self._owner(region).state_to_frame(region, state)

    def state_from_frame(self, region: str, frame: Any, spark: Any) -> Any:
        return self._owner(region).state_from_frame(region, frame, spark)

    def process(self, ctx: EpochContext) -> EpochResult:
        from pyspark.sql import functions as F

        result = EpochResult()
        state = dict(ctx.state)
        for part in self.parts:
            inputs = dict(ctx.inputs)
            for r in part.regions:
                for edge in self.pipeline.in_edges(r):
                    if edge.kind == "delta" and edge.src in self.regions:
                        held = self.memory.get(edge.table)
                        if held is None:
                            held = ctx.spark.createDataFrame(
                                [], _empty_schema(self.pipeline, edge))
                        inputs[edge.name] = held.filter(F.col("epoch") <= ctx.epoch - edge.delay)
            sub = EpochContext(ctx.epoch, ctx.generation, ctx.spark, ctx.pipeline, inputs,
                               state, ctx.active)
            t0 = time.monotonic()
            group = current_group(ctx.spark)
            jobs0 = jobs_in_group(ctx.spark, group)
            out = part.process(sub)
            for name, df in out.outputs.items():
                edge = self.pipeline.edges.get(name)
                if edge is not None and edge.kind == "delta":
                    df = cut_lineage(df)
                    held = self.memory.get(edge.table)
                    self.memory[edge.table] = df if held is None else held.unionByName(df)
                result.outputs[name] = df
            state.update(out.state)
            result.state.update(out.state)
            key = f"transform:{'+'.join(part.regions)}"
            self.seconds[key] = self.seconds.get(key, 0.0) + time.monotonic() - t0
            self.spark_jobs[key] = (self.spark_jobs.get(key, 0)
                                    + jobs_in_group(ctx.spark, group) - jobs0)
        return result

    def finish_epoch(self, ctx: EpochContext) -> None:
        for part in self.parts:
            part.finish_epoch(ctx)

    def release(self) -> None:
        self.memory.clear()
        for part in self.parts:
            part.release()


def epoch_profile(seconds: dict[str, float], seconds_before: dict[str, float],
                  jobs: dict[str, int], jobs_before: dict[str, int]) -> str:
    """One epoch's share of the runner's profile, "phase s/jobs" by phase: a slow epoch in
    a job's log says where its time and Spark jobs went (reads, transforms, commits,
    checkpoints), without a benchmark."""
    parts = []
    for phase in seconds:
        spent = seconds[phase] - seconds_before.get(phase, 0.0)
        ran = jobs.get(phase, 0) - jobs_before.get(phase, 0)
        if spent >= 0.05 or ran:
            parts.append(f"{phase} {spent:.1f} s/{ran}")
    return ", ".join(parts) or "no phase"


def name_spark_jobs(spark: Any, pipeline: str, regions: set[str] | list[str], epoch: int,
                    generation: int) -> str:
    """Name the Spark jobs that follow (the epoch's reads, transforms, writes, commits) by
    pipeline, regions, epoch and generation: the Spark UI, its REST API and the event log
    then show the same split as falkirk's own timings. Returns the job group id."""
    hosted = "+".join(sorted(regions))
    group = f"falkirk/{pipeline}/{hosted}/e{epoch}/g{generation}"
    return label_jobs(spark, group,
                      f"falkirk {pipeline}: {hosted} epoch {epoch} (generation {generation})")


def load_job(job: str | Path) -> ModuleType:
    """A job entry point (a path, e.g. from ``Pipeline.job_path``) as a module: jobs are
    scripts, not a package. Bare table and record names in it then resolve against the
    ``schemas/`` of the nearest folder above it that has one (its pipeline's)."""
    import hashlib
    import importlib.util

    path = Path(job).resolve()
    folder = next((d for d in path.parents if (d / "schemas").is_dir()), None)
    if folder is not None:
        use_pipeline((folder / "schemas",))
    # keyed by the file, not its name: two pipelines may both have a jobs/ingest.py
    name = f"falkirk_job_{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise RuntimeFailure(f"cannot load job {job} from {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def job_logic(job: str | Path) -> JobLogic:
    """The JobLogic a job entry point defines, instantiated."""
    module = load_job(job)
    found = [v for v in vars(module).values() if isinstance(v, type)
             and issubclass(v, JobLogic) and v.__module__ == module.__name__]
    if len(found) != 1:
        raise RuntimeFailure(f"job {job} must define exactly one JobLogic, found {len(found)}")
    return found[0]()


def record_ddl(topic: str, roots: tuple[Path, ...] = ()) -> str | None:
    """The value schema of a topic's records, from schemas/records/<topic>.json if any."""
    if find("records", topic, roots) is None:
        return None
    return ddl("records", topic, roots)


def _empty_schema(pipeline: Pipeline, edge: EdgeSpec):
    """The Spark schema of a Delta edge's table, for the empty input before its first epoch."""
    return _spark_schema(arrow_schema("tables", edge.table_schema, pipeline.schema_roots))


def _spark_schema(schema: pa.Schema):
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(schema)


class JobDriver:
    """Runs a job's regions in one driver across rollbacks: a :class:`JobRunner` per
    generation. With ``park``, a rollback that fences the regions parks the job
    (:mod:`falkirk.runtime.park`) instead of ending it, and a new runner resumes from the
    frontier in the rollback's generation, in the same warm Spark session."""

    def __init__(self, pipeline: Pipeline, logic: JobLogic, spark: Any, park: bool = True,
                 cfg: Config | None = None, watch_interval_s: float = 1.0,
                 exit_on_engine_loss: bool = False):
        self.pipeline, self.logic, self.spark, self.cfg = pipeline, logic, spark, cfg
        self.park, self.watch_interval_s = park, watch_interval_s
        self.exit_on_engine_loss = exit_on_engine_loss  # the job's own process only
        self.job = pipeline.regions[logic.regions[0]].job or type(logic).__name__
        self.runner: JobRunner | None = None
        self.parked = 0  # times this driver parked

    @property
    def runs(self) -> tuple[EpochLog, str, str, int] | None:
        """Where this run's end is recorded (log, pipeline, job, generation), once known."""
        r = self.runner
        return None if r is None else (r.log, self.pipeline.name, self.job, r.generation)

    def _begin(self, start: dict[str, int] | None, status: str,
               generation: int | None = None) -> JobRunner:
        runner = JobRunner(self.pipeline, self.logic, self.spark, self.cfg, start=start,
                           generation=generation)
        self.runner = runner
        runner.log.record_job_run(self.pipeline.name, self.job, self.logic.regions,
                                  runner.generation, status)
        return runner

    def run(self, start: dict[str, int] | None = None, until: int | None = None,
            poll_s: float = 0.5, idle_timeout_s: float | None = None) -> int:
        """Run until ``until`` or the input ends (see :meth:`JobRunner.run`)."""
        runner = self._begin(start, "started")
        while True:
            watch, fence = None, None
            if self.park:
                watch = runner.watch = FenceWatch(
                    runner.log, self.pipeline.name, runner.regions, runner.generation,
                    self.spark, self.watch_interval_s,
                    engine=runner.cfg.spark_remote or None,
                    on_engine_lost=self.exit_engine_lost if self.exit_on_engine_loss
                    else None,
                    engine_process=partial(serving, runner.cfg)).start()
            try:
                return runner.run(until_epoch=until, poll_s=poll_s,
                                  idle_timeout_s=idle_timeout_s)
            except Exception as exc:
                fence = (exc.generation if isinstance(exc, Fenced)
                         else None if watch is None else watch.fenced)
                if not self.park or fence is None:
                    raise
                log.warning("%s: parking (%s: %s)", "+".join(runner.regions),
                            type(exc).__name__, str(exc).splitlines()[0][:300])
            finally:
                if watch is not None:
                    watch.stop()
                runner.close()
            done = self._wait_parked(runner, fence)
            runner = self._begin(None, "resumed", done["generation"])

    def exit_engine_lost(self) -> None:
        """The engine died under this job (its fence watch found it not answering): record
        the failure and exit now, with :data:`ENGINE_LOST_EXIT`. Each call the job has in
        flight would only fail after its retries, and the commit threads' cleanup calls
        after theirs, one after another (8-9 s under the fault campaign): its jobs then
        died seconds apart and were rolled back one by one. The session, and the state in
        it, is gone either way; the exit is a kill's, which recovery is built for."""
        cfg = self.runner.cfg if self.runner is not None else self.cfg or load()
        message = (f"the Spark engine at {cfg.spark_remote} stopped answering: the job's "
                   "session (its state) is gone with it")
        log.error("%s: %s; exiting", "+".join(self.logic.regions), message)
        if (runs := self.runs) is not None:
            epoch_log, name, job, generation = runs
            with contextlib.suppress(Exception):  # a log away too: the death is still seen
                EpochLog(epoch_log.root, epoch_log.storage_options).record_job_run(
                    name, job, self.logic.regions, generation, "failed",
                    exit_code=ENGINE_LOST_EXIT, message=message)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(ENGINE_LOST_EXIT)

    def _wait_parked(self, runner: JobRunner, fence: int) -> dict:
        """Acknowledge the fence once nothing of this job runs, then wait for the rollback
        (the acknowledgement is what the rollback plans after); its done row."""
        if not quiet(self.spark, PARK_WAIT_S / 2):
            raise RuntimeFailure(f"job {'+'.join(runner.regions)}: Spark tasks still ran "
                                 f"{PARK_WAIT_S / 2:.0f} s after the fence's cancel; "
                                 "cannot park")
        self.spark.catalog.clearCache()  # the cancelled epoch's cached frames
        runner.log.record_job_run(self.pipeline.name, self.job, self.logic.regions,
                                  runner.generation, "parked",
                                  message=f"fenced by the rollback to generation {fence}")
        self.parked += 1
        done = wait_for_rollback(runner.log, self.pipeline.name, fence)
        log.info("%s: rollback %s done (generation %d): resuming in this driver",
                 "+".join(runner.regions), done["rollback_id"], done["generation"])
        return done


# ---- the entry point of every job -------------------------------------------------------


def parser(logic: JobLogic) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=type(logic).__name__,
        description=f"Run region(s) {', '.join(logic.regions)} epoch by epoch.")
    p.add_argument("--pipeline", required=True,
                   help="declared pipeline name or declaration file")
    p.add_argument("--until-epoch", type=int,
                   help="stop after this epoch (default: run until the input ends)")
    p.add_argument("--epoch", type=int,
                   help="run exactly this epoch (a batch region's run for one data interval)")
    p.add_argument("--idle-timeout", type=float,
                   help="fail when the next epoch is not complete after this many seconds")
    p.add_argument("--poll", type=float, default=0.5, help="seconds between input checks")
    return p


def main(logic: JobLogic, argv: list[str] | None = None) -> int:
    """Run a job: ``python jobs/<job>.py --pipeline NAME [--until-epoch N]`` on a Spark
    Connect engine, or ``spark-submit jobs/<job>.py …`` as an application of its own."""
    code = run_job(logic, argv, own_process=True)
    # Exit hard: delta-rs can abort an interpreter at exit after all work is done
    # (delta-io/delta-rs#2184), which would look like a failed job.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run_job(logic: JobLogic, argv: list[str] | None = None, own_process: bool = False) -> int:
    """Run a job in this process (its entry point, or an Airflow task); its exit code:
    0 done, 2 a :class:`FalkirkError` (the log of runs has its message), 1 a bug.
    ``own_process`` (the entry point): the job may end the process itself, with
    :data:`ENGINE_LOST_EXIT`, when its engine dies under it."""
    from falkirk.io.spark import session
    from falkirk.model.topology import load_pipeline

    args = parser(logic).parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    driver: JobDriver | None = None
    last: int | None = None
    spark = None
    try:
        pipeline = load_pipeline(args.pipeline)
        spark = session(f"falkirk-{pipeline.name}-{'+'.join(logic.regions)}")
        start = None
        until = args.until_epoch
        if args.epoch is not None:
            start = {r: args.epoch - 1 for r in logic.regions}
            until = args.epoch
        # A stream job parks when a rollback fences it; a batch run of one epoch (--epoch)
        # ends on the fence instead: the rollback reruns it if it must.
        driver = JobDriver(pipeline, logic, spark, park=args.epoch is None,
                           exit_on_engine_loss=own_process)
        last = driver.run(start, until, args.poll, args.idle_timeout)
        log.info("%s: done through epoch %d", "+".join(logic.regions), last)
        code, message = 0, None
    except FalkirkError as exc:
        log.error("%s", exc)
        code, message = 2, str(exc)
    except Exception as exc:  # a bug: say so in the log of runs too, then fail
        log.exception("%s failed", "+".join(logic.regions))
        code, message = 1, f"{type(exc).__name__}: {exc}"
    runs = None if driver is None else driver.runs
    if runs is not None:  # the supervisor reads how the job ended from here
        epoch_log, pipeline_name, job, generation = runs
        epoch_log.record_job_run(pipeline_name, job, logic.regions, generation,
                                 "finished" if code == 0 else "failed", exit_code=code,
                                 last_epoch=last, message=(message or "")[:500] or None)
    if spark is not None:  # a Connect session is released on the engine
        with contextlib.suppress(Exception):  # an engine gone already: nothing to stop
            spark.stop()
    return code
