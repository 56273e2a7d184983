"""Batch epochs under Airflow: one DAG run per epoch, whose data interval is the epoch.

Epochs are event-time windows of the pipeline's settings: epoch k covers
[origin + k·length, origin + (k+1)·length). The batch DAG's timetable has exactly those
intervals, so its run for a data interval runs that epoch, and a cleared run reruns it.
"""

from __future__ import annotations

import logging
import os
from datetime import UTC, datetime, timedelta
from typing import Any

from airflow.sdk import DeltaDataIntervalTimetable
from airflow.sdk.exceptions import AirflowFailException

from falkirk.config import load
from falkirk.log.epochlog import EpochLog
from falkirk.model.times import DOMAINS, time_of
from falkirk.model.topology import Pipeline, load_pipeline

log = logging.getLogger(__name__)
# How many epochs the DAG schedules (catchup runs them all); the generator's default.
DEFAULT_EPOCHS = 10


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


def schedule(pipeline_name: str) -> dict[str, Any]:
    """timetable, start_date and end_date for one run per epoch: epochs
    FALKIRK_BATCH_FIRST_EPOCH (default 0) to FALKIRK_BATCH_EPOCHS − 1 (default 10); a
    start in the past makes catchup run them one after another. A later first epoch hands
    a region to Airflow mid-stream, after its earlier epochs were run another way."""
    pipeline = load_pipeline(pipeline_name)
    first, epochs = (_epoch_setting(name, default) for name, default in
                     (("FALKIRK_BATCH_FIRST_EPOCH", 0), ("FALKIRK_BATCH_EPOCHS", DEFAULT_EPOCHS)))
    if first >= epochs:
        raise ValueError(f"FALKIRK_BATCH_FIRST_EPOCH={first} must be below "
                         f"FALKIRK_BATCH_EPOCHS={epochs}: no epoch would be scheduled")
    start = origin(pipeline)
    return {"schedule": DeltaDataIntervalTimetable(epoch_length(pipeline)),
            "start_date": start + first * epoch_length(pipeline),
            "end_date": start + epochs * epoch_length(pipeline) - timedelta(seconds=1)}


def _epoch_setting(name: str, default: int) -> int:
    raw = os.environ.get(name, str(default))
    if not raw.isdigit():
        raise ValueError(f"{name}={raw!r} in the environment: must be a whole number ≥ 0")
    return int(raw)


def submit_kwargs(pipeline_name: str, region: str) -> dict[str, Any]:
    """SparkSubmitOperator arguments for one epoch of a batch region (the epoch comes from
    the run's data interval through the ``falkirk_epoch`` macro)."""
    pipeline = load_pipeline(pipeline_name)
    cfg = load()
    return {
        "application": str(pipeline.job_path(pipeline.regions[region].job)),
        "conn_id": "spark_default",
        "name": f"falkirk-{pipeline.name}-{region}",
        "application_args": ["--pipeline", pipeline.name, "--epoch",
                             "{{ falkirk_epoch(data_interval_start) }}",
                             "--idle-timeout", "600"],
        "conf": cfg.spark_launch_conf,
    }


#: How often one try of a batch epoch runs the epoch again after the engine died under it
#: (:func:`run_epoch`) before it fails as any other failure does.
ENGINE_LOSSES_PER_TRY = 20


def run_epoch(pipeline: str, region: str, data_interval_start: datetime) -> int:
    """Run this DAG run's epoch of a batch region in the task's own process, a client of
    the Spark Connect engine (``Config.spark_remote``): no spark-submit, no driver JVM to
    start for each epoch. Fails the task unless the job ended well; returns the epoch.

    When the engine that falkirk runs died under the epoch (it is dead, or another process
    serves now: :func:`falkirk.local.engine.died`, :func:`~falkirk.local.engine.serving`),
    the epoch runs again in this try once the engine answers, up to
    :data:`ENGINE_LOSSES_PER_TRY` times: the loss was not the epoch's, and an hour of
    strikes with the engine among the targets (README) spent all 9 tries of one epoch in
    14 minutes, half of them on engine kills, leaving every region downstream waiting. Its
    rerun is safe: the epoch's outputs are written exactly once."""
    from falkirk.local.engine import died, ensure, serving
    from falkirk.runtime.runner import job_logic, run_job

    spec = load_pipeline(pipeline)
    cfg = load()
    epoch = epoch_of(pipeline, data_interval_start)
    for run in range(1, ENGINE_LOSSES_PER_TRY + 2):
        before = serving(cfg)
        code = run_job(job_logic(spec.job_path(spec.regions[region].job)),
                       ["--pipeline", spec.source or spec.name, "--epoch", str(epoch),
                        "--idle-timeout", "600"])
        if code == 0:
            return epoch
        lost = died(cfg) or (before is not None and serving(cfg) != before)
        if not lost or run > ENGINE_LOSSES_PER_TRY:
            break
        log.warning("%s epoch %d: the Spark engine died under it (%d time(s) in this try); "
                    "running it again once the engine answers", region, epoch, run)
        ensure(cfg)
    # retried as SparkSubmitOperator's failures are (DEFAULT_ARGS)
    raise RuntimeError(f"{region} epoch {epoch}: the job failed with exit code {code}; "
                       "its error is above in this log and in the epoch log's job_runs")


def macros(pipeline_name: str) -> dict[str, Any]:
    """user_defined_macros of a batch DAG: ``falkirk_epoch(data_interval_start)``."""
    return {"falkirk_epoch": lambda start: epoch_of(pipeline_name, start)}


def verify_committed(pipeline: str, region: str, data_interval_start: datetime) -> int:
    """Fail unless the epoch log shows this run's epoch committed by ``region``."""
    spec = load_pipeline(pipeline).regions[region]
    epoch = epoch_of(pipeline, data_interval_start)
    dom = DOMAINS[spec.domain]
    entries = EpochLog.from_config().regions(load_pipeline(pipeline))[region].entries
    row = entries.get(dom.parse(time_of(spec.domain, epoch)))
    if row is None or row.status not in spec.regime_rules.restorable:
        raise AirflowFailException(
            f"{region} epoch {epoch}: the epoch log shows "
            f"{'nothing' if row is None else row.status!r}, not committed")
    log.info("%s epoch %d committed in generation %d", region, epoch, row.generation)
    return epoch
