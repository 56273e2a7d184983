"""Streaming jobs under Airflow: start them, tell a dead job from a finished one, pause.

A stream job runs until its input ends (no --until-epoch), hosting every region of its
entry point; jobs hosting only batch regions are Airflow's to schedule, one run per epoch.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from falkirk.config import Config, load
from falkirk.model.topology import Pipeline
from falkirk.runtime import launcher, procs

if TYPE_CHECKING:
    from falkirk.log.epochlog import EpochLog

log = logging.getLogger(__name__)
STREAM_ARGS: list[str] = []  # no idle timeout: a stream waits for input as long as it takes


def stream_jobs(pipeline: Pipeline) -> dict[str, list[str]]:
    """Job entry point -> hosted regions, for jobs hosting a non-batch region."""
    return {job: regions for job, regions in procs.jobs_of(pipeline).items()
            if any(not pipeline.regions[r].regime_rules.runs_per_epoch for r in regions)}


log_file = procs.log_file  # where a job writes its output


def finished_cleanly(pipeline: Pipeline, job: str, cfg: Config | None = None,
                     runs: dict[str, dict] | None = None) -> bool:
    """The job's own latest row in the log of job runs says it finished (exit code 0: its
    input ended or it reached its bound): not a death. A killed job wrote no end row.
    ``runs``: that log already read (one read for several jobs)."""
    if runs is None:
        from falkirk.log.epochlog import EpochLog

        runs = EpochLog.from_config(cfg or load()).job_runs(pipeline.name)
    row = runs.get(job)
    return row is not None and row["status"] == "finished" and row["exit_code"] == 0


def pause_marker(pipeline: Pipeline, cfg: Config | None = None) -> Path:
    """While this file exists a rollback DAG run has paused the streams on purpose: the
    supervisor does not treat the jobs it stopped as deaths."""
    return Path((cfg or load()).var_dir) / "run" / f"{pipeline.name}.paused"


def hosting(pipeline: Pipeline, regions: set[str] | list[str]) -> list[str]:
    """The stream jobs hosting any of ``regions``: after a rollback moved those regions back
    they must run again, even a job that had finished because its input ended."""
    return sorted(job for job, hosted in stream_jobs(pipeline).items()
                  if set(hosted) & set(regions))


def start_streams(pipeline: Pipeline, cfg: Config | None = None,
                  only: list[str] | None = None) -> dict[str, int]:
    """Start the stream jobs that are not running and did not finish; job -> pid.

    A job that finished because its input ended stays finished: starting it again would
    only make a Spark job that finds nothing to do (a @continuous supervisor would do so
    every run). ``only`` names jobs to start even so: those a rollback moved back."""
    alive = {info["job"] for info in procs.running(pipeline, cfg)}
    if only is None:
        from falkirk.log.epochlog import EpochLog

        runs = EpochLog.from_config(cfg or load()).job_runs(pipeline.name)  # once for all
        only = [job for job in stream_jobs(pipeline)
                if not finished_cleanly(pipeline, job, cfg, runs)]
    return {job: launcher.start_job(pipeline, job, STREAM_ARGS, cfg).pid
            for job in only if job not in alive}


def dead_jobs(pipeline: Pipeline, cfg: Config | None = None, killed_only: bool = False,
              epoch_log: EpochLog | None = None) -> dict[str, list[str]]:
    """Stream jobs that are not running and did not finish: job -> its regions.
    ``killed_only``: only those killed or crashed (their latest row in the log of job runs
    is a start with no end, or a failure); not those never started nor those a rollback
    stopped (``stopped``): they only need starting. ``epoch_log``: the caller's, kept
    across its looks (a new one reads every file of the log of job runs again)."""
    if pause_marker(pipeline, cfg).exists():
        return {}
    alive = {info["job"] for info in procs.running(pipeline, cfg)}
    gone = {job: regions for job, regions in stream_jobs(pipeline).items() if job not in alive}
    if not gone:
        return {}  # every job runs: the log of job runs is not read
    from falkirk.log.epochlog import EpochLog

    runs = (epoch_log or EpochLog.from_config(cfg or load())).job_runs(pipeline.name)
    return {job: regions for job, regions in gone.items()
            if not finished_cleanly(pipeline, job, cfg, runs)
            and (not killed_only or (job in runs and runs[job]["status"] != "stopped"))}


BATCH_RERUN_ARGS = ["--idle-timeout", "300"]  # a rerun waits this long for replayed input


def rerun_batch_epochs(pipeline: Pipeline, invalidated: list[dict],
                       cfg: Config | None = None) -> dict[str, list[int]]:
    """Rerun every batch epoch a rollback invalidated, in order, consecutive ones in one
    pass (``--epoch k --until-epoch K``): a batch region is not a stream, nothing else
    would redo them. Region -> epochs rerun; a rerun that fails raises, naming its log."""
    from falkirk.errors import FalkirkError
    from falkirk.runtime.driver import epoch_args, epochs_named

    epochs: dict[str, set[int]] = {}
    for inv in invalidated:
        spec = pipeline.regions[inv["region"]]
        if spec.regime_rules.runs_per_epoch and spec.job:
            epoch = inv["time"][0] if isinstance(inv["time"], list) else inv["time"]
            epochs.setdefault(inv["region"], set()).add(int(epoch))
    for region, todo in epochs.items():
        job = pipeline.regions[region].job
        for run in _consecutive(sorted(todo)):
            named = epochs_named(run)
            log.info("rerunning %s %s", region, named)
            code = launcher.start_job(pipeline, job, [*epoch_args(run), *BATCH_RERUN_ARGS],
                                      cfg).wait()
            if code != 0:
                raise FalkirkError(f"rerun of {region} {named} exited {code}; see "
                                   f"{log_file(pipeline, job, cfg)}")
    return {region: sorted(todo) for region, todo in epochs.items()}


def _consecutive(epochs: list[int]) -> list[list[int]]:
    """Sorted epochs in runs of consecutive ones (each rerun in one pass)."""
    runs: list[list[int]] = []
    for e in epochs:
        if runs and e == runs[-1][-1] + 1:
            runs[-1].append(e)
        else:
            runs.append([e])
    return runs
