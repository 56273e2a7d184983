"""A job's process: its driver across rollbacks, and its command line.

:class:`JobDriver` runs a job's regions in one Spark session across generations: a new
:class:`~falkirk.runtime.loop.JobRunner` per generation, parking (instead of exiting)
when a rollback fences the job. :func:`main` is every job script's entry point
(``python jobs/<job>.py --pipeline NAME``); :func:`run_job` runs a job in this process
(its entry point, or an Airflow task) and records how it ended in the epoch log.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from typing import Any

from falkirk.config import Config, load
from falkirk.errors import FalkirkError
from falkirk.io.spark import quiet
from falkirk.log.epochlog import EpochLog
from falkirk.model.topology import Pipeline
from falkirk.runtime.job import JobLogic, RuntimeFailure
from falkirk.runtime.launcher import Launcher, launcher
from falkirk.runtime.loop import Fenced, JobRunner
from falkirk.runtime.park import ENGINE_LOST_EXIT, PARK_WAIT_S, FenceWatch, wait_for_rollback

log = logging.getLogger("falkirk.runtime")


class JobDriver:
    """Runs a job's regions in one driver across rollbacks: a :class:`JobRunner` per
    generation. With ``park``, a rollback that fences the regions parks the job
    (:mod:`falkirk.runtime.park`) instead of ending it, and a new runner resumes from the
    frontier in the rollback's generation, in the same warm Spark session. ``launch``:
    how the session was made (default: the profile's launcher), which says the engine
    the fence watch looks after, if any."""

    def __init__(self, pipeline: Pipeline, logic: JobLogic, spark: Any, park: bool = True,
                 cfg: Config | None = None, watch_interval_s: float = 1.0,
                 exit_on_engine_loss: bool = False, launch: Launcher | None = None):
        self.pipeline, self.logic, self.spark, self.cfg = pipeline, logic, spark, cfg
        self.launch = launch
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
                launch = self.launch or launcher(runner.cfg)
                watch = runner.watch = FenceWatch(
                    runner.log, self.pipeline.name, runner.regions, runner.generation,
                    self.spark, self.watch_interval_s, engine=launch.engine,
                    on_engine_lost=self.exit_engine_lost if self.exit_on_engine_loss
                    else None,
                    engine_process=launch.engine_process).start()
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
                   help="run exactly this epoch (a batch region's run for one data "
                        "interval), or from it through --until-epoch (a run that catches up)")
    p.add_argument("--idle-timeout", type=float,
                   help="fail when the next epoch is not complete after this many seconds")
    p.add_argument("--poll", type=float, default=0.5, help="seconds between input checks")
    return p


def epoch_args(epochs: list[int]) -> list[str]:
    """A job's arguments for exactly these consecutive ``epochs`` (a batch region's run):
    ``--epoch k``, and ``--until-epoch K`` for several (processed in one pass)."""
    args = ["--epoch", str(epochs[0])]
    return args if len(epochs) == 1 else [*args, "--until-epoch", str(epochs[-1])]


def epochs_named(epochs: list[int]) -> str:
    """``epoch k`` or ``epochs k-K``: how logs and errors name a batch run's epochs."""
    return f"epoch {epochs[0]}" if len(epochs) == 1 else f"epochs {epochs[0]}-{epochs[-1]}"


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
    from falkirk.model.topology import load_pipeline

    args = parser(logic).parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    driver: JobDriver | None = None
    last: int | None = None
    spark = None
    try:
        pipeline = load_pipeline(args.pipeline)
        launch = launcher()  # the job's session: on the engine, or its own driver
        spark = launch.session(f"falkirk-{pipeline.name}-{'+'.join(logic.regions)}")
        start = None
        until = args.until_epoch
        if args.epoch is not None:  # exactly this epoch, or these (--until-epoch too)
            start = {r: args.epoch - 1 for r in logic.regions}
            until = max(args.epoch, args.until_epoch if until is not None else args.epoch)
        # A stream job parks when a rollback fences it; a batch run of one epoch (--epoch)
        # ends on the fence instead: the rollback reruns it if it must.
        driver = JobDriver(pipeline, logic, spark, park=args.epoch is None,
                           exit_on_engine_loss=own_process, launch=launch)
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
