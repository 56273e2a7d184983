"""The streams supervisor's steps: start the stream jobs, watch them (a deferrable sensor:
the triggerer checks every second and no worker slot is held while it waits), roll back
and restart the dead ones."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator, PokeReturnValue
from airflow.triggers.base import BaseTrigger, TaskSuccessEvent, TriggerEvent

from falkirk.airflow import streams
from falkirk.airflow.render import plan_markdown
from falkirk.model.topology import Pipeline, load_pipeline
from falkirk.recovery.rollback import RollbackExecutor, RollbackRequest
from falkirk.runtime import procs
from falkirk.runtime.park import ENGINE_LOST_EXIT

if TYPE_CHECKING:
    from falkirk.log.epochlog import EpochLog
    from falkirk.runtime.launcher import Launcher

log = logging.getLogger(__name__)


def start(pipeline: str) -> dict[str, int]:
    """Start the stream jobs that are neither running nor finished (their input ended).

    Not while a rollback run has paused the streams (it starts them itself), and not before
    a rollback that crashed half-way is finished: it is resumed first, from the epoch log
    (the generation it moved to is the one the jobs must start in). A job that died since
    the last watch (between runs of this DAG, or during the last ``recover``) is not just
    started again: its regions are rolled back as failed first, as ``recover`` does, or
    its restart would redo epochs whose output its consumers already read.
    """
    from falkirk.log.epochlog import EpochLog

    pipe = load_pipeline(pipeline)
    if streams.pause_marker(pipe).exists():
        log.info("a rollback run paused the streams (%s): it restarts them; starting nothing",
                 streams.pause_marker(pipe))
        return {}
    pending = EpochLog.from_config().unfinished_rollback(pipe.name)
    if pending is not None:
        log.info("rollback %s did not finish: resuming it before any job starts",
                 pending["rollback_id"])
        request = RollbackRequest(**{**pending["request"], "dry_run": False})
        RollbackExecutor(pipe, stop_regions=lambda regions: procs.stop_regions(pipe, regions)
                         ).run(request, progress=log.info)
    started: dict[str, int] = {}
    dead = streams.dead_jobs(pipe, killed_only=True)
    if dead:
        log.info("died since the last watch: %s; rolling their regions back first", dead)
        started.update(roll_back_and_restart(pipe, dead, "the start of a supervisor run")
                       ["restarted"])
    else:  # a start, not a recovery: an engine started now warms up before the jobs
        from falkirk.runtime.launcher import launcher

        launcher().ensure(warm=True)
    started.update(streams.start_streams(pipe))
    log.info("started %s", started or "nothing: every stream job runs or has finished")
    return started


def roll_back_and_restart(pipe: Pipeline, dead: dict[str, list[str]], by: str,
                          say: Callable[[str], None] | None = None,
                          epoch_log: EpochLog | None = None) -> dict[str, Any]:
    """Roll back the dead jobs' regions (as failed), restart every job stopped or moved,
    and rerun the batch epochs the rollback invalidated (as the rollback DAG does).
    A running job the rollback moves back parks in its warm driver and resumes by itself
    (:mod:`falkirk.runtime.park`; the config's ``park_moved_jobs``); one that does not
    park in time is stopped and restarted. ``say``: where progress goes (default: this
    module's log). ``epoch_log``: the watch's own, kept across its recoveries."""
    from falkirk.log.epochlog import EpochLog
    from falkirk.runtime.launcher import launcher
    from falkirk.runtime.park import PARK_WAIT_S

    say = say or log.info
    epoch_log = epoch_log or EpochLog.from_config()  # the rollback's and the stops' one
    stopped: list[str] = []
    launch = launcher()
    cfg = launch.cfg
    engine_died = launch.engine_died()
    # nothing parks on a dead engine: its jobs are stopped at once
    park_s = PARK_WAIT_S if cfg.park_moved_jobs and not engine_died else 0.0
    # The rollback needs no Spark (delta-rs and the epoch log): the engine starts again
    # beside it, not after it when the first job is started.
    starting = _start_engine_beside(launch) if engine_died else None

    def stop(regions: set[str]) -> None:
        stopped.extend(procs.stop_regions(pipe, regions, park_s=park_s, epoch_log=epoch_log))

    failed = sorted({r for regions in dead.values() for r in regions})
    request = RollbackRequest(pipe.name, failed=failed, dry_run=False,
                              reason=f"supervisor ({by}): job(s) {', '.join(sorted(dead))} died")
    done = RollbackExecutor(pipe, epoch_log=epoch_log, stop_regions=stop
                            ).run(request, progress=say)
    if starting is not None:
        starting.result()  # its error, if it failed to start, here and not in each job
        say("the Spark engine started again beside the rollback")
    restart = set(dead) | set(stopped) | set(streams.hosting(pipe, done.affected))
    restarted = streams.start_streams(pipe, only=sorted(restart))
    say(f"restarted {restarted}")
    reran = streams.rerun_batch_epochs(pipe, done.invalidate)
    say(f"reran batch epochs {reran or 'none'}")
    return {"rollback_id": done.rollback_id, "restarted": restarted, "reran": reran,
            "plan": done}


def _start_engine_beside(launch: Launcher) -> Future[None]:
    """Start this machine's engine in a thread (:meth:`Launcher.ensure`: one starter at a
    time, so the jobs started next wait for it rather than start another)."""
    pool = ThreadPoolExecutor(1, thread_name_prefix="falkirk-engine-start")
    try:
        return pool.submit(launch.ensure)
    finally:
        pool.shutdown(wait=False)


class PipelineSensor(BaseSensorOperator):
    """A sensor on one pipeline, in reschedule mode (no worker slot held between pokes)."""

    template_fields = ("pipeline",)

    def __init__(self, *, pipeline: str, **kwargs: Any) -> None:
        kwargs.setdefault("mode", "reschedule")
        kwargs.setdefault("poke_interval", 30)
        super().__init__(**kwargs)
        self.pipeline = pipeline


#: How often the watch looks for a dead stream job, in seconds. It is the detection part of
#: every recovery: the former reschedule-mode poke every 30 s added 15 s on average.
WATCH_INTERVAL_S = 1.0


def dead_or_finished(pipeline: Pipeline, epoch_log: EpochLog | None = None
                     ) -> dict[str, list[str]]:
    """One look at the stream jobs: the dead ones (job -> regions), or {} while they run.
    Pauses by a rollback run are not deaths. ``epoch_log``: the watch's own, kept across
    its looks."""
    running = procs.running(pipeline)  # one read of the pid files for this look
    return with_the_engines_jobs(pipeline, streams.dead_jobs(pipeline, epoch_log=epoch_log),
                                 running)


def with_the_engines_jobs(pipeline: Pipeline, dead: dict[str, list[str]],
                          running: list[dict] | None = None) -> dict[str, list[str]]:
    """``dead`` and, when this machine's engine died, every stream job still running on
    it: each is a client whose session died with the engine and is about to fail (its
    fence watch finds the engine gone within seconds). One rollback then recovers them
    all, instead of one per job as each one's death is seen. The engine's death is a
    death of its jobs even before any of them exits: the watch does not wait for their
    fence watches' three looks. ``running``: the live job processes, when the caller has
    just read them."""
    from falkirk.runtime.launcher import launcher

    running = procs.running(pipeline) if running is None else running
    if not dead and (not running or streams.pause_marker(pipeline).exists()):
        return dead  # nothing runs, or a rollback run paused the jobs: it restarts them
    if not launcher().engine_died():
        return dead
    mine = streams.stream_jobs(pipeline)
    return {**{info["job"]: mine[info["job"]] for info in running if info["job"] in mine},
            **dead}


class RestartBackoff:
    """How long the trigger waits before recovering jobs that failed on their own (their
    ``failed`` row: they exited non-zero, nobody killed them). The first such failure is
    recovered at once; each further one within :attr:`reset_s` of the job's last restart
    waits twice as long as the one before (``first_s``, doubling, at most ``max_s``): a job
    that cannot start must not make a rollback and a new generation every second. A job
    killed (no end row) is recovered at once, whatever came before."""

    def __init__(self, first_s: float = 2.0, max_s: float = 60.0, reset_s: float = 300.0,
                 clock: Callable[[], float] = time.monotonic):
        self.first_s, self.max_s, self.reset_s, self.clock = first_s, max_s, reset_s, clock
        self.failures: dict[str, int] = {}  # job -> failures on its own in a row
        self.restarted: dict[str, float] = {}  # job -> when it was last restarted

    def delay(self, failed: set[str]) -> float:
        """Seconds to wait before restarting, ``failed`` being the dead jobs that failed
        on their own (the others count as killed: their run of failures ends)."""
        now, wait = self.clock(), 0.0
        for job in failed:
            last = self.restarted.get(job)
            again = last is not None and now - last < self.reset_s
            n = self.failures[job] = self.failures.get(job, 0) + 1 if again else 1
            if n > 1:
                wait = max(wait, min(self.first_s * 2 ** (n - 2), self.max_s))
        return wait

    def restarting(self, jobs: list[str], failed: set[str]) -> None:
        """``jobs`` are restarted now; those not in ``failed`` start a new count."""
        for job in jobs:
            self.restarted[job] = self.clock()
            if job not in failed:
                self.failures.pop(job, None)


def failed_on_their_own(pipeline: Pipeline, jobs: set[str],
                        epoch_log: EpochLog | None = None) -> set[str]:
    """Those of ``jobs`` whose latest row in the log of job runs is their own failure."""
    from falkirk.log.epochlog import EpochLog

    runs = (epoch_log or EpochLog.from_config()).job_runs(pipeline.name)
    return {job for job in jobs if (runs.get(job) or {}).get("status") == "failed"
            and runs[job].get("exit_code") != ENGINE_LOST_EXIT}


def watch_by(run_id: str) -> str:
    """Who asked, in the reason of a rollback the watch's trigger carries out: it names the
    streams run, so the run's Rollback plan tab finds it in the epoch log (a trigger that
    watches on pushes no XCom)."""
    return f"the watch of {run_id or 'a streams run'}"


class StreamDeathTrigger(BaseTrigger):
    """Watches the stream jobs of ``pipeline`` from the triggerer: one cheap look (pid
    files, then the log of job runs for jobs not alive) every ``interval_s``, in a thread
    so the triggerer's loop never blocks.

    With ``recover`` (the config's ``recover_in_trigger``) a death is recovered here, as
    ``recover`` would (:func:`roll_back_and_restart`, in a thread), and the watch goes on:
    no scheduling, no task process that parses the DAG file first (3 s idle, 10-50 s under
    the fault campaign's load), no wait for a scheduler that died with the job. The
    rollback holds the pipeline's lease like any other, and one that crashes here is
    resumed by the next. A job that keeps failing on its own right after its restarts is
    recovered after a growing delay (:class:`RestartBackoff`). Should the recovery fail,
    the trigger ends the watch and the ``recover`` task, with its retries, takes over.
    Without ``recover`` it ends the watch on the first death (``TaskSuccessEvent``: no
    worker resumes it) for ``recover``. It keeps one epoch log for its life, and compacts
    the log's tables between its looks (``compact_every_s``), so neither its recoveries
    nor the jobs they restart read every append the pipeline ever made."""

    def __init__(self, pipeline: str, interval_s: float = WATCH_INTERVAL_S,
                 recover: bool = False, run_id: str = ""):
        super().__init__()
        self.pipeline = pipeline
        self.interval_s = interval_s
        self.recover = recover
        self.run_id = run_id

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{__name__}.StreamDeathTrigger",
                {"pipeline": self.pipeline, "interval_s": self.interval_s,
                 "recover": self.recover, "run_id": self.run_id})

    #: How often the watch compacts the epoch log's tables (:meth:`EpochLog.compact`): each
    #: append adds a file, and a restarted job reads every file of the tables it reads.
    compact_every_s = 60.0

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from falkirk.log.epochlog import EpochLog
        from falkirk.recovery.gc import Housekeeping

        pipeline = await asyncio.to_thread(load_pipeline, self.pipeline)  # once, not per look
        # One epoch log for the watch's life: it keeps the rows it read, so a recovery
        # reads only what was appended since the last one. A new reader each time opened
        # every file of five log tables, ~1 s each at the hour's campaign's 700 appends,
        # between a death and the stop of its regions (README, "Reading the epoch log").
        epoch_log = EpochLog.from_config()
        backoff = RestartBackoff()
        # Between looks: the log's compaction, and garbage collection with its own
        # watermarks kept incrementally (the pipeline's gc_every_seconds; 0: only the gc
        # DAG's runs)
        house = Housekeeping(pipeline, log=epoch_log, compact_every_s=self.compact_every_s,
                             say=self.log)
        while True:
            await asyncio.to_thread(house.step)
            dead = await asyncio.to_thread(dead_or_finished, pipeline, epoch_log)
            if dead:
                self.log.info("dead: %s", dead)
                if not self.recover:
                    yield TaskSuccessEvent()  # recover looks again: no XCom (see there)
                    return
                failed = await asyncio.to_thread(failed_on_their_own, pipeline, set(dead),
                                                 epoch_log)
                wait = backoff.delay(failed)
                if wait:
                    self.log.warning("%s failed on its own again soon after its restart: "
                                     "recovering it in %.0f s", sorted(failed), wait)
                    await asyncio.sleep(wait)
                try:
                    out = await asyncio.to_thread(roll_back_and_restart, pipeline, dead,
                                                  watch_by(self.run_id), self.log.info,
                                                  epoch_log)
                except Exception:  # the recover task (and its retries) takes over
                    self.log.exception("recovering %s in the triggerer failed: ending the "
                                       "watch, the recover task takes over", sorted(dead))
                    yield TaskSuccessEvent()
                    return
                backoff.restarting(sorted(dead), failed)
                self.log.info("recovered %s: rollback %s, restarted %s; watching on",
                              sorted(dead), out["rollback_id"], out["restarted"])
                continue  # look again at once: another job may have died meanwhile
            await asyncio.sleep(self.interval_s)


class StreamsSensor(PipelineSensor):
    """Done when a stream job died (``recover`` looks the dead jobs up again; a look of its
    own also leaves them as its XCom, job -> regions). Pauses by a rollback run are
    not deaths. When every stream job finished because its input ended it keeps watching:
    ending would only make the @continuous DAG start a run after run with nothing to start,
    and a rollback run may start the jobs again.

    Deferrable by default: after one look of its own it hands the watching to the
    triggerer (:class:`StreamDeathTrigger`, every second), which recovers each death
    itself and watches on (``recover_here``, default: the config's
    ``recover_in_trigger``), or ends the watch when a job died. ``deferrable=False``
    (default: the config's ``watch_deferred``) keeps the reschedule-mode poke (every
    ``poke_interval``) for a deployment without a triggerer."""

    def __init__(self, *, pipeline: str, deferrable: bool | None = None,
                 interval_s: float = WATCH_INTERVAL_S, recover_here: bool | None = None,
                 **kwargs: Any) -> None:
        super().__init__(pipeline=pipeline, **kwargs)
        from falkirk.config import load

        cfg = load()
        self.deferrable = cfg.watch_deferred if deferrable is None else deferrable
        self.recover_here = cfg.recover_in_trigger if recover_here is None else recover_here
        self.interval_s = interval_s

    def poke(self, context: Any) -> PokeReturnValue | bool:
        dead = dead_or_finished(load_pipeline(self.pipeline))
        if dead:
            self.log.info("dead: %s", dead)
            return PokeReturnValue(is_done=True, xcom_value=dead)
        return False

    def execute(self, context: Any) -> Any:
        if not self.deferrable:
            return super().execute(context)
        done = self.poke(context)
        if done:
            return done.xcom_value
        # The trigger ends the task (no worker resumes it); a deferral names a method all
        # the same: a resumed watch would look again.
        self.defer(trigger=StreamDeathTrigger(self.pipeline, self.interval_s,
                                              recover=self.recover_here,
                                              run_id=str(context.get("run_id") or "")),
                   method_name="execute", timeout=self.timeout)


def recover(pipeline: str, ti: Any) -> dict[str, Any]:
    """Roll back the dead jobs' regions (as failed), restart every job stopped, and rerun
    the batch epochs the rollback invalidated.

    The dead jobs are looked up again here, as the watch looked (job processes, then the
    log of job runs), not taken from the watch's XCom: the trigger ends the watch in the
    triggerer, and Airflow 3.3 stores a trigger's XCom JSON-encoded twice (it reads back as
    a string)."""
    pipe = load_pipeline(pipeline)
    dead = with_the_engines_jobs(pipe, streams.dead_jobs(pipe))  # as the watch looked
    if not dead:
        log.info("nothing died")
        return {}
    out = roll_back_and_restart(pipe, dead, ti.run_id)
    done = out.pop("plan")
    markdown = plan_markdown(done.to_json(), pipe)
    log.info("rollback plan:\n%s", markdown)
    ti.xcom_push(key="plan_markdown", value=markdown)
    ti.xcom_push(key="plan", value=done.to_json())
    return out
