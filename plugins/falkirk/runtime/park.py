"""Parking a running job for a rollback instead of killing it.

A rollback moves back regions whose jobs still run (serve+stats after a communities
kill): killing them costs a cold driver (JVM, Spark session, a first epoch three to four
times slower than a warm one). A job that parks keeps its warm session:

1. The rollback fences the regions (the epoch log's ``fences``), as before a kill.
2. The job's :class:`FenceWatch` sees the fence within a second and cancels its running
   Spark jobs; the epoch ends at once (a row it had not recorded is never recorded: the
   runner checks the fence before it records, and a row recorded just before the fence
   is in the log the rollback plans from).
3. When nothing of the job runs any more (every commit thread joined, no Spark task
   left), it records ``parked`` in the log of job runs: the acknowledgement. The
   rollback (:func:`falkirk.runtime.procs.stop_regions` with ``park_s``) waits for it,
   and only then plans from the log as it is; a job that does not acknowledge in time is
   killed, as before.
4. The job waits for the rollback to finish (:func:`wait_for_rollback`), then starts
   again from the frontier in the new generation, in the same driver (``resumed``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from falkirk.errors import FalkirkError
from falkirk.io.spark import cancel_all
from falkirk.log.epochlog import EpochLog

log = logging.getLogger("falkirk.runtime")

#: How long a rollback waits for a running job's ``parked`` before it kills the job: a
#: cancelled epoch ends in about a second; a job stuck elsewhere is killed as before.
PARK_WAIT_S = 20.0
#: How long a parked job waits for its rollback to finish before it fails (exit 2): the
#: supervisor then recovers it as it would a failed job.
PARK_MAX_S = 600.0
#: A job's exit code when the engine it ran on died under it: a failure, but not of its
#: own making (the supervisor's restart backoff does not count it; RestartBackoff).
ENGINE_LOST_EXIT = 3
#: The statuses in the log of job runs of a job process that still runs.
RUNNING_STATUSES = ("started", "resumed", "parked")


class ParkTimeout(FalkirkError):
    """A parked job's rollback did not finish in time."""


class FenceWatch:
    """Looks for a fence of the job's regions every ``interval_s`` (in a thread, with an
    epoch log of its own: the job's caches its reads). Once fenced, it cancels the
    session's Spark jobs every look until :meth:`stop`: an epoch that starts a Spark job
    after a cancel is cancelled too.

    With ``engine`` (a Spark Connect URL) it also looks whether the engine answers, and
    with ``engine_process`` whether the engine is still the process it was: a job
    waiting for its input makes no call that would find its session gone with a dead
    engine, and must fail to be recovered (:attr:`engine_lost`). ``on_engine_lost`` is
    called (in the watch's thread) once the engine counts as gone: a job's own process
    exits there (:meth:`falkirk.runtime.driver.JobDriver.exit_engine_lost`) rather than
    wait for its calls in flight to give up one after another."""

    ENGINE_LOOKS = 3  # looks in a row without an answer before the engine counts as gone

    def __init__(self, epoch_log: EpochLog, pipeline: str, regions: list[str],
                 generation: int, spark: Any, interval_s: float = 1.0,
                 engine: str | None = None,
                 on_engine_lost: Callable[[], None] | None = None,
                 engine_process: Callable[[], Any] | None = None):
        self.log = EpochLog(epoch_log.root, epoch_log.storage_options)
        self.pipeline, self.regions, self.generation = pipeline, regions, generation
        self.spark, self.interval_s, self.engine = spark, interval_s, engine
        self.on_engine_lost = on_engine_lost
        # the engine's process as recorded now (falkirk.runtime.engine.serving): another
        # one serving later (the engine started again on its port) has none of this job's
        # session
        self.engine_process = engine_process
        self._serving = engine_process() if engine_process is not None else None
        self.fenced: int | None = None  # the generation that fenced us
        self.engine_lost = False
        self._unanswered = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="falkirk-fence-watch",
                                        daemon=True)

    def start(self) -> FenceWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        while not self._stop.wait(self.interval_s):
            if self.engine and not self.engine_lost:
                from falkirk.io.spark import answering

                self._unanswered = 0 if answering(self.engine) else self._unanswered + 1
                now = self.engine_process() if self.engine_process is not None else None
                replaced = None not in (now, self._serving) and now != self._serving
                if self._unanswered >= self.ENGINE_LOOKS or replaced:
                    log.error("the Spark engine at %s %s: %s's session is gone with it",
                              self.engine, "is another process now (started again)"
                              if replaced else "does not answer",
                              "+".join(self.regions))
                    self.engine_lost = True
                    if self.on_engine_lost is not None:
                        self.on_engine_lost()
            if self.fenced is None:
                try:
                    self.fenced = self.log.fenced(self.pipeline, self.regions, self.generation)
                except Exception:  # a failed look: the next one (and the commit's) decide
                    log.warning("looking for a fence failed", exc_info=True)
                    continue
                if self.fenced is not None:
                    log.warning("a rollback to generation %d fenced %s: cancelling the "
                                "epoch's Spark jobs to park", self.fenced,
                                "+".join(self.regions))
            if self.fenced is not None:
                cancel_all(self.spark)


def wait_for_rollback(epoch_log: EpochLog, pipeline: str, generation: int,
                      max_s: float = PARK_MAX_S, poll_s: float = 0.5) -> dict:
    """Wait until a rollback to ``generation`` or later is recorded done; its row."""
    deadline = time.monotonic() + max_s
    while True:
        done = [r for r in epoch_log.rollbacks(pipeline)
                if r["status"] == "done" and r["generation"] >= generation]
        if done:
            return done[-1]
        if time.monotonic() > deadline:
            raise ParkTimeout(
                f"pipeline {pipeline!r}: parked for the rollback to generation {generation} "
                f"for {max_s:.0f} s and no rollback finished; exiting so the supervisor "
                "recovers this job")
        time.sleep(poll_s)


def wait_parked(epoch_log: EpochLog, pipeline: str, jobs: list[dict], timeout_s: float,
                poll_s: float = 0.2) -> set[str]:
    """Wait until each of ``jobs`` (process infos, :func:`falkirk.runtime.procs.running`)
    recorded ``parked`` as its latest row of the log of job runs, from its own process
    group (the row names the Python driver, a child of spark-submit's JVM, which the info
    names); the jobs that did within ``timeout_s`` (one that died meanwhile is not waited
    for)."""
    from falkirk.runtime.procs import is_process

    deadline = time.monotonic() + timeout_s
    parked: set[str] = set()
    waiting = {info["job"]: info for info in jobs}
    while waiting:
        runs = epoch_log.job_runs(pipeline)
        for job, info in list(waiting.items()):
            row = runs.get(job) or {}
            if row.get("status") == "parked" and _in_group(row.get("pid"), info):
                parked.add(job)
                del waiting[job]
            elif not is_process(info["pid"], info.get("process_started")):
                del waiting[job]
        if not waiting or time.monotonic() > deadline:
            break
        time.sleep(poll_s)
    return parked


def _in_group(pid: object, info: dict) -> bool:
    """Process ``pid`` is the job's process, or runs in its process group."""
    if not isinstance(pid, int):
        return False
    if pid == info["pid"]:
        return True
    try:
        return os.getpgid(pid) == info.get("pgid", info["pid"])
    except OSError:
        return False
