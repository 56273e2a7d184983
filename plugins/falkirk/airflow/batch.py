"""Batch epochs under Airflow: a DAG run per epoch, whose data interval is the epoch (or
the epochs ready together, when the region is behind: :class:`EpochTimetable`).

Epochs are event-time windows of the pipeline's settings: epoch k covers
[origin + k·length, origin + (k+1)·length). The batch DAG's timetable has exactly those
intervals, so its run for a data interval runs that epoch, and a cleared run reruns it.

Which epochs get a run: every epoch the region's inputs can be complete for, however
many (no fixed count: a 20-epoch pipeline once got 10 runs, silently). The origin is in
the past, so an interval timetable bounded by nothing would make a run for every epoch up
to the wall clock (millions). :class:`EpochTimetable` bounds it instead by the epoch log:
a run for epoch k is due once every input of the region can deliver epoch k
(:func:`schedulable_through`: a Delta edge's sender committed k − delay, or its input
ended; a Kafka input's epochs as far as the regions reading the topic got, up to its
declared bound), and the job waits up to 10 minutes for the rest, as it always did.

Why a timetable of our own (registered by the falkirk plugin) rather than an end_date
worked out when the DAG file is parsed, which would also work: Airflow 3.3 recomputes a
DAG's next run at every parse (dag_processing/collection.py ``update_dags`` →
``DagModel.calculate_dagrun_date_fields``), so a growing end_date is picked up, and an
end_date before the start_date is not refused, only schedules nothing
(timetables/interval.py: a start past ``restriction.latest`` is no run). But the
end_date is part of the serialized DAG: each change is a new DAG hash, so a new DAG
version (with its code) as soon as a run used the previous one
(models/serialized_dag.py ``write_dag``): up to one a parse, for days, for a pipeline
that streams; and the scheduler reckons the next run from the serialized DAG, written
at most every 30 s (``min_serialized_dag_update_interval``). The timetable's serialized
form never changes (pipeline, region, epoch length, origin); it reads the log when asked
for the next run: by the DAG processor at every parse (every ~30 s) and by the scheduler
after it made a run, so new epochs get runs as the inputs commit. Nothing is read while
the DAG file is parsed (nor by a task parsing it to run). A read that fails (no lake yet,
an object store away) schedules nothing until the next one.

``FALKIRK_BATCH_FIRST_EPOCH`` (default 0) is the start_date: it hands a region to Airflow
mid-stream; ``FALKIRK_BATCH_EPOCHS``, when set, is an explicit end_date: no run for
epoch N or later (unset: no cap).
"""

from __future__ import annotations

import logging
import os
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pendulum
from airflow.sdk.exceptions import AirflowFailException
from airflow.timetables.base import DagRunInfo, DataInterval, TimeRestriction
from airflow.timetables.interval import DeltaDataIntervalTimetable

from falkirk.config import load
from falkirk.io.launch import launch_conf
from falkirk.log.epochlog import EpochLog, RegionLog
from falkirk.model.times import DOMAINS, Offsets, is_whole_epoch, time_of
from falkirk.model.topology import EdgeSpec, Pipeline, load_pipeline

log = logging.getLogger(__name__)
#: How long a timetable keeps what it read of the epoch log: the scheduler and the UI
#: ask one timetable again and again; each parse of the DAG file makes a new one.
FRONTIER_TTL_S = 5.0
GOOD = ("committed", "checkpointed")  # what a receiver reads (RegionLog.readable)


def origin(pipeline: Pipeline) -> datetime:
    return datetime.fromtimestamp(pipeline.settings["origin_ms"] / 1000, tz=UTC)


def epoch_length(pipeline: Pipeline) -> timedelta:
    return timedelta(seconds=pipeline.settings["epoch_seconds"])


def epoch_of(pipeline_name: str, data_interval_start: datetime) -> int:
    """The epoch whose window starts at ``data_interval_start``."""
    pipeline = load_pipeline(pipeline_name)
    # In whole microseconds: Airflow passes a pendulum DateTime, whose difference is a
    # pendulum Interval that divmod with a stdlib timedelta refuses.
    offset_us = round((data_interval_start.timestamp() - origin(pipeline).timestamp()) * 1e6)
    length_us = round(epoch_length(pipeline).total_seconds() * 1e6)
    epoch, rest = divmod(offset_us, length_us)
    if rest or epoch < 0:
        raise AirflowFailException(
            f"data interval starting {data_interval_start.isoformat()} is not an epoch of "
            f"{pipeline.name!r} (origin {origin(pipeline).isoformat()}, "
            f"{epoch_length(pipeline)} each)")
    return int(epoch)


def epochs_of(pipeline_name: str, data_interval_start: datetime,
              data_interval_end: datetime | None = None) -> list[int]:
    """The epochs of a run's data interval, in order: one epoch's window, or the several
    of a run that catches up (:class:`EpochTimetable` widens a run's interval over the
    epochs ready when it is made). Without an end: the epoch at the start."""
    first = epoch_of(pipeline_name, data_interval_start)
    if data_interval_end is None:
        return [first]
    return list(range(first, max(first + 1, epoch_of(pipeline_name, data_interval_end))))


def schedule(pipeline_name: str, region: str) -> dict[str, Any]:
    """timetable, start_date and end_date of a batch region's DAG: a run per epoch from
    FALKIRK_BATCH_FIRST_EPOCH (default 0), for every epoch its inputs can be complete for
    (:class:`EpochTimetable`), below FALKIRK_BATCH_EPOCHS when that is set (an explicit
    cap; unset: none). A start in the past makes catchup run them one after another. A
    later first epoch hands a region to Airflow mid-stream, after its earlier epochs were
    run another way."""
    pipeline = load_pipeline(pipeline_name)
    first = _epoch_setting("FALKIRK_BATCH_FIRST_EPOCH", "0")
    epochs = _epoch_setting("FALKIRK_BATCH_EPOCHS", "")
    if epochs is not None and first is not None and first >= epochs:
        raise ValueError(f"FALKIRK_BATCH_FIRST_EPOCH={first} must be below "
                         f"FALKIRK_BATCH_EPOCHS={epochs}: no epoch would be scheduled")
    start, length = origin(pipeline), epoch_length(pipeline)
    return {"schedule": EpochTimetable(pipeline.name, region, length,
                                       pipeline.settings["origin_ms"]),
            "start_date": start + (first or 0) * length,
            "end_date": None if epochs is None else start + epochs * length
            - timedelta(seconds=1)}


def _epoch_setting(name: str, default: str) -> int | None:
    raw = os.environ.get(name, default)
    if raw == "":
        return None
    if not raw.isdigit():
        raise ValueError(f"{name}={raw!r} in the environment: must be a whole number ≥ 0")
    return int(raw)


def schedulable_through(pipeline: Pipeline, region: str, epoch_log: EpochLog) -> int | None:
    """The last epoch of batch region ``region`` whose every input can be complete now,
    from the epoch log (-1: none yet); None when no input bounds its epochs.

    Per input of the job hosting the region (what its runner waits for), the minimum of:

    - a Delta edge: the sender's latest committed epoch (for ``delay`` 0 not past one
      held back by its data checks; with ``checks.hold`` only epochs that passed them),
      or its end once its input ended, plus the edge's ``delay``;
    - a Kafka input: the epochs of the topic the regions reading it committed (a cut is
      the topic's, the same for every reader), and one past the region's own latest (a
      region alone on its topic: its job waits for the epoch's records); no further than
      the epoch a reader reached the topic's declared bound in (``falkirk bound``);

    and never past the region's own end (its input ended there).
    """
    spec = pipeline.regions[region]
    hosted = {r for r, s in pipeline.regions.items() if spec.job and s.job == spec.job}
    hosted.add(region)
    logs = epoch_log.regions(pipeline)
    ends = epoch_log.ends(pipeline.name)
    passed = (epoch_log.passed_checks(pipeline.name) if pipeline.checks_setting("hold")
              else None)
    bounds: dict[str, dict[str, int]] | None = None
    lasts: list[int] = []
    for r in sorted(hosted):
        for edge in pipeline.in_edges(r):
            if edge.kind == "kafka":
                if bounds is None:
                    bounds = epoch_log.bounds(pipeline.name)
                lasts.append(_topic_through(pipeline, edge, logs, bounds.get(edge.topic),
                                            _latest(logs[r])))
            elif edge.kind == "delta" and edge.src not in hosted:
                done = _latest(logs[edge.src], stop_at_held=edge.delay == 0,
                               passed=None if passed is None else passed.get(edge.src, set()))
                if edge.src in ends:
                    done = min(done, ends[edge.src])
                lasts.append(done + edge.delay)
    if region in ends:
        lasts.append(ends[region])
    return min(lasts) if lasts else None


def _latest(region_log: RegionLog, stop_at_held: bool = False,
            passed: set[tuple[int, int]] | None = None) -> int:
    """A region's latest epoch a receiver can read (-1: none): committed, below its first
    quarantined epoch with ``stop_at_held``, among ``passed`` when given."""
    held = [r.epoch for r in region_log.quarantined()] if stop_at_held else []
    return max((r.epoch for r in region_log.entries.values()
                if r.status in GOOD and is_whole_epoch(r.time)
                and (not held or r.epoch < held[0])
                and (passed is None or (r.epoch, r.generation) in passed)), default=-1)


def _topic_through(pipeline: Pipeline, edge: EdgeSpec, logs: dict[str, RegionLog],
                   bound: dict[str, int] | None, own: int) -> int:
    """How far a Kafka input's epochs can be complete (``own``: its receiver's latest
    committed epoch): see :func:`schedulable_through`."""
    known, ended = own + 1, None
    for reader in (e for e in pipeline.edges.values()
                   if e.kind == "kafka" and e.topic == edge.topic and e.dst is not None):
        for row in logs[reader.dst].entries.values():
            if row.status not in GOOD or not is_whole_epoch(row.time):
                continue
            known = max(known, row.epoch)
            delivered = (row.inputs or {}).get(reader.name) or {}
            if bound is not None and "to" in delivered and \
                    Offsets(bound) <= Offsets(delivered["to"]):
                ended = row.epoch if ended is None else min(ended, row.epoch)
    return known if ended is None else ended


class EpochTimetable(DeltaDataIntervalTimetable):
    """One data interval per epoch (a :class:`DeltaDataIntervalTimetable` of the epoch
    length from the start_date), through the last epoch the region's inputs can be
    complete for (:func:`schedulable_through`), read from the epoch log when Airflow asks
    for the next run. Registered by the falkirk plugin (Airflow refuses a DAG with a
    timetable no plugin registered)."""

    def __init__(self, pipeline: str, region: str, length: timedelta, origin_ms: int):
        super().__init__(length)
        self.pipeline, self.region, self.origin_ms = pipeline, region, int(origin_ms)
        self.description = (f"One run per {length.total_seconds():g}-s epoch of {pipeline}, "
                            f"as far as the inputs of {region} have committed")
        self._read: tuple[float, int | None] | None = None  # (when, last epoch)

    @property
    def summary(self) -> str:
        return f"epochs of {self._delta}, as the inputs commit"

    def serialize(self) -> dict[str, Any]:
        return {**super().serialize(), "pipeline": self.pipeline, "region": self.region,
                "origin_ms": self.origin_ms}

    @classmethod
    def deserialize(cls, data: dict[str, Any]) -> EpochTimetable:
        return cls(data["pipeline"], data["region"], timedelta(seconds=data["delta"]),
                   data["origin_ms"])

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, EpochTimetable):
            return NotImplemented
        return self.serialize() == other.serialize()

    def __hash__(self) -> int:
        return hash((self.pipeline, self.region, self._delta, self.origin_ms))

    def last_epoch(self) -> int | None:
        """:func:`schedulable_through` for this DAG, read at most every
        :data:`FRONTIER_TTL_S`; -1 (nothing) when the log cannot be read."""
        now = time.monotonic()
        if self._read is None or now - self._read[0] >= FRONTIER_TTL_S:
            try:
                last = schedulable_through(load_pipeline(self.pipeline), self.region,
                                           EpochLog.from_config())
            except Exception:  # no lake yet, an object store away: no run until it answers
                log.warning("%s %s: cannot read the epoch log; no new batch run until it "
                            "answers", self.pipeline, self.region, exc_info=True)
                last = -1
            self._read = (now, last)
        return self._read[1]

    def next_dagrun_info(self, *, last_automated_data_interval: DataInterval | None,
                         restriction: TimeRestriction) -> DagRunInfo | None:
        """The next epoch's run; when more epochs after it are ready already (the region
        is behind: a slow start, an outage, a rollback), one run for all of them, up to
        ``Config.max_pass`` and the end_date: its job processes them in one pass, where a
        run per epoch cost ~9 s of Airflow's scheduling each and a batch region behind
        stayed behind (every reader downstream with it)."""
        last = self.last_epoch()
        if last is None:  # no input bounds the epochs: only an end_date does
            if restriction.latest is None:
                return None
        else:  # the latest run's logical date: the start of epoch ``last``
            through = pendulum.instance(datetime.fromtimestamp(
                self.origin_ms / 1000, tz=UTC) + last * self._delta)
            latest = through if restriction.latest is None else min(restriction.latest,
                                                                     through)
            restriction = restriction._replace(latest=latest)
        info = super().next_dagrun_info(
            last_automated_data_interval=last_automated_data_interval, restriction=restriction)
        if info is None or restriction.latest is None:
            return info
        start = info.data_interval.start
        # epochs from ``start`` on, in seconds (pendulum's intervals refuse a timedelta)
        ready = int((restriction.latest.timestamp() - start.timestamp())
                    // self._delta.total_seconds()) + 1
        epochs = max(1, min(ready, load().max_pass))
        if epochs == 1:
            return info
        return DagRunInfo.interval(start=start, end=start + epochs * self._delta)


def submit_kwargs(pipeline_name: str, region: str) -> dict[str, Any]:
    """SparkSubmitOperator arguments for a run of a batch region (its epochs come from the
    run's data interval through the ``falkirk_epoch`` and ``falkirk_last_epoch``
    macros)."""
    pipeline = load_pipeline(pipeline_name)
    cfg = load()
    return {
        "application": str(pipeline.job_path(pipeline.regions[region].job)),
        "conn_id": "spark_default",
        "name": f"falkirk-{pipeline.name}-{region}",
        "application_args": ["--pipeline", pipeline.name, "--epoch",
                             "{{ falkirk_epoch(data_interval_start) }}", "--until-epoch",
                             "{{ falkirk_last_epoch(data_interval_start, data_interval_end) }}",
                             "--idle-timeout", "600"],
        "conf": launch_conf(cfg),
    }


#: How often one try of a batch epoch runs the epoch again after the engine died under it
#: (:func:`run_epoch`) before it fails as any other failure does.
ENGINE_LOSSES_PER_TRY = 20


def run_epoch(pipeline: str, region: str, data_interval_start: datetime,
              data_interval_end: datetime | None = None) -> list[int]:
    """Run this DAG run's epochs of a batch region (one, or the several of a run that
    catches up, in one pass) in the task's own process, a client of the Spark Connect
    engine (``Config.spark_remote``; falkirk.runtime.launcher): no spark-submit, no
    driver JVM to start for each epoch. Fails the task unless the job ended well; returns
    the epochs.

    When the engine that falkirk runs died under the epoch (it is dead, or another process
    serves now: :meth:`falkirk.runtime.launcher.Launcher.engine_lost`), the epoch runs
    again in this try once the engine answers, up to :data:`ENGINE_LOSSES_PER_TRY` times:
    the loss was not the epoch's, and an hour of strikes with the engine among the targets
    spent all 9 tries of one epoch in 14 minutes, half of them on engine kills, leaving
    every region downstream waiting. Its rerun is safe: the epoch's outputs are written
    exactly once."""
    from falkirk.runtime.driver import epoch_args, epochs_named, run_job
    from falkirk.runtime.job import job_logic
    from falkirk.runtime.launcher import launcher

    spec = load_pipeline(pipeline)
    launch = launcher(load())
    epochs = epochs_of(pipeline, data_interval_start, data_interval_end)
    for run in range(1, ENGINE_LOSSES_PER_TRY + 2):
        before = launch.engine_process()
        code = run_job(job_logic(spec.job_path(spec.regions[region].job)),
                       ["--pipeline", spec.source or spec.name,
                        *epoch_args(epochs), "--idle-timeout", "600"])
        if code == 0:
            return epochs
        lost = launch.engine_lost(before)
        if not lost or run > ENGINE_LOSSES_PER_TRY:
            break
        log.warning("%s %s: the Spark engine died under it (%d time(s) in this try); "
                    "running it again once the engine answers", region, epochs_named(epochs), run)
        launch.ensure()
    # retried as SparkSubmitOperator's failures are (DEFAULT_ARGS)
    raise RuntimeError(f"{region} {epochs_named(epochs)}: the job failed with exit code {code}; "
                       "its error is above in this log and in the epoch log's job_runs")


def macros(pipeline_name: str) -> dict[str, Any]:
    """user_defined_macros of a batch DAG: ``falkirk_epoch(data_interval_start)``, and
    ``falkirk_last_epoch(data_interval_start, data_interval_end)`` (a run that catches
    up covers several epochs)."""
    return {"falkirk_epoch": lambda start: epoch_of(pipeline_name, start),
            "falkirk_last_epoch": lambda start, end: epochs_of(pipeline_name, start, end)[-1]}


def verify_committed(pipeline: str, region: str, data_interval_start: datetime,
                     data_interval_end: datetime | None = None) -> list[int]:
    """Fail unless the epoch log shows every epoch of this run committed by ``region``."""
    spec = load_pipeline(pipeline).regions[region]
    dom = DOMAINS[spec.domain]
    entries = EpochLog.from_config().regions(load_pipeline(pipeline))[region].entries
    epochs = epochs_of(pipeline, data_interval_start, data_interval_end)
    for epoch in epochs:
        row = entries.get(dom.parse(time_of(spec.domain, epoch)))
        if row is None or row.status not in spec.regime_rules.restorable:
            raise AirflowFailException(
                f"{region} epoch {epoch}: the epoch log shows "
                f"{'nothing' if row is None else row.status!r}, not committed")
        log.info("%s epoch %d committed in generation %d", region, epoch, row.generation)
    return epochs
