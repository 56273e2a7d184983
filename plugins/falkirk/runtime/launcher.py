"""How a job's driver starts, and where every Spark session comes from: one place.

Whatever needs Spark asks the launcher of its profile (:func:`launcher`): the start of a
job's process (:func:`start_job`: the streams supervisor, the rollback's restarts, the
batch reruns, ``falkirk run``), the job's own session (falkirk.runtime.driver.run_job),
an Airflow batch task (falkirk.airflow.batch.run_epoch; the batch DAG asks
:attr:`Launcher.client` which operator runs the epoch), the CLI's ``validate`` and
``engine start``, the data checks, the supervisor when the engine died, and the tests.
falkirk.io.spark builds sessions and starts nothing.

How a job's driver starts, by profile:

* **A client of the engine** (``Config.spark_remote``; the local profile). One
  long-running Spark application, the engine (falkirk.runtime.engine, docs/engine.md),
  serves every job, each in a Spark Connect session of its own. A job is a Python process
  (this interpreter runs its entry point); its start is that process and a session,
  about a second, and its first epoch runs warm. Before the job starts, the launcher
  makes sure the engine answers (with ``Config.local_engine`` it starts this machine's
  engine when nothing does, one starter at a time), releases the session of the job's
  predecessor (whose calls must not run on beside it), and names the new job's session
  (``$FALKIRK_SPARK_SESSION``, recorded beside its process, so whoever stops the job
  releases it). An Airflow batch task runs its epoch as a client in its own process.
* **A driver of its own** (no ``spark_remote``; the cluster and compose profiles). A
  job is a Spark application started by spark-submit on the profile's master with its
  launch settings (falkirk.io.launch); an Airflow batch task is a SparkSubmitOperator
  with the same settings; a session built in a process (a test, the CLI) has its driver
  in that process. Each such driver maps the class-data archive (falkirk.io.classdata,
  trained by ``falkirk jars``), which shortens its cold start (docs/jvm.md); the engine
  maps it too.

Where park fits: the **warm hand-over after a rollback**. A running stream job that a
rollback moves back is not started again: it parks (falkirk.runtime.park), cancelling
its epoch and acknowledging the fence, waits for the rollback, and resumes in the new
generation in the same warm session, whichever way it was started. The launcher starts
a job again only when it died, or did not park in time and was stopped.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from abc import ABC, abstractmethod
from dataclasses import replace
from pathlib import Path
from typing import Any

from falkirk.config import Config, load
from falkirk.io.launch import launch_conf, spark_submit
from falkirk.io.spark import SESSION_ENV, application_session, driver_env, remote_session
from falkirk.model.process import process_started
from falkirk.model.topology import Pipeline
from falkirk.runtime import engine, procs

#: A recorded engine process: (pid, its start time).
EngineProcess = tuple[int, float]


class Launcher(ABC):
    """How one profile starts a job's driver and builds a process's Spark session: an
    interface, made by :class:`EngineClient` and :class:`OwnDriver`."""

    #: A job is a client of an engine: its process runs its entry point as a Python
    #: client (an Airflow batch task runs the epoch in its own process).
    client = False

    def __init__(self, cfg: Config):
        self.cfg = cfg

    @abstractmethod
    def session(self, app_name: str = "falkirk", **conf: str) -> Any:
        """This process's Spark session."""

    @abstractmethod
    def command(self, job: str | Path, args: list[str]) -> list[str]:
        """The command that runs a job entry point (a path, e.g. ``Pipeline.job_path``'s)."""

    def prepare(self, pipeline: Pipeline, job: str) -> dict[str, str]:
        """What must happen before ``job`` of ``pipeline`` starts; the environment it
        starts with beyond :func:`job_env` (its engine session's name, if any)."""
        return {}

    # -- the engine, for who watches a job or reruns an epoch ---------------------------

    @property
    def engine(self) -> str | None:
        """The Spark Connect URL the jobs are clients of, or None."""
        return None

    def ensure(self, warm: bool = False) -> None:  # noqa: B027 - an optional hook
        """Make sure the engine the jobs need answers (nothing to do without one);
        ``warm``: a pipeline's first start, which lets an engine it starts warm up."""

    def engine_process(self) -> EngineProcess | None:
        """The process serving as this machine's engine now, when falkirk runs it: a
        client whose engine became another process has lost its session."""
        return None

    def engine_died(self) -> bool:
        """This machine's engine, which falkirk runs, has died (every session on it,
        so every job on it, is gone)."""
        return False

    def engine_lost(self, before: EngineProcess | None) -> bool:
        """The engine died, or another process serves since ``before``
        (:meth:`engine_process` when the work began): the work's session is gone."""
        return False


class EngineClient(Launcher):
    """Every job a client of the Spark Connect engine at ``Config.spark_remote``."""

    client = True

    @property
    def engine(self) -> str | None:
        return self.cfg.spark_remote

    def ensure(self, warm: bool = False) -> None:
        engine.ensure(self.cfg, warm)

    def session(self, app_name: str = "falkirk", session_id: str | None = None,
                **conf: str) -> Any:
        """A Connect session on the engine (started first when falkirk runs it); its id
        is ``session_id``, else the job's (``$FALKIRK_SPARK_SESSION``), else a new one."""
        self.ensure()
        return remote_session(self.cfg, session_id, **conf)

    def command(self, job: str | Path, args: list[str]) -> list[str]:
        return [sys.executable, str(Path(job).resolve()), *args]

    def prepare(self, pipeline: Pipeline, job: str) -> dict[str, str]:
        self.ensure()
        # Its predecessor's calls must not run on beside it (an Airflow retry of a batch
        # epoch whose try was killed, a restart the rollback did not stop).
        procs.release_sessions(pipeline, set(procs.jobs_of(pipeline).get(job, ())), self.cfg)
        return {SESSION_ENV: str(uuid.uuid4())}  # named now, so a stop releases it

    def engine_process(self) -> EngineProcess | None:
        return engine.serving(self.cfg)

    def engine_died(self) -> bool:
        return engine.died(self.cfg)

    def engine_lost(self, before: EngineProcess | None) -> bool:
        return self.engine_died() or (before is not None and self.engine_process() != before)


class OwnDriver(Launcher):
    """Every job a Spark application of its own: spark-submit, a driver JVM each."""

    def session(self, app_name: str = "falkirk", **conf: str) -> Any:
        """A session whose driver is this process (a JVM started here)."""
        return application_session(app_name, self.cfg, **conf)

    def command(self, job: str | Path, args: list[str],
                conf: dict[str, str] | None = None) -> list[str]:
        """spark-submit on the profile's master with its launch settings (or ``conf``)."""
        confs = [arg for k, v in (launch_conf(self.cfg) if conf is None else conf).items()
                 for arg in ("--conf", f"{k}={v}")]
        return [str(spark_submit()), "--master", self.cfg.spark_master, *confs,
                str(Path(job).resolve()), *args]


def launcher(cfg: Config | None = None) -> Launcher:
    """The launcher of ``cfg``'s profile (default: this machine's, ``FALKIRK_ENV``)."""
    cfg = cfg or load()
    return EngineClient(cfg) if cfg.spark_remote else OwnDriver(cfg)


def session(app_name: str = "falkirk", cfg: Config | None = None, **conf: str) -> Any:
    """A Spark session for this process, as its profile's launcher builds it: on the
    engine (a Connect session: about a second), or with a driver in this process."""
    return launcher(cfg).session(app_name, **conf)


def job_command(job: str | Path, args: list[str], cfg: Config | None = None,
                conf: dict[str, str] | None = None) -> list[str]:
    """The command that runs a job entry point: a client of the engine, or spark-submit
    (always with ``conf``: those launch settings instead of the profile's)."""
    chosen = launcher(cfg)
    if conf is not None:
        return OwnDriver(chosen.cfg).command(job, args, conf)
    return chosen.command(job, args)


def as_application(cfg: Config) -> tuple[Config, dict[str, str]]:
    """``cfg`` with every job a Spark application of its own (no engine: what a driver
    benchmark needs), and the environment that makes a child process load its profile
    so."""
    return replace(cfg, spark_remote=""), {
        "FALKIRK_SPARK_REMOTE": "", f"FALKIRK_{cfg.env.upper()}_SPARK_REMOTE": ""}


def job_env(cfg: Config | None = None) -> dict[str, str]:
    """The environment a job starts in: this interpreter for Spark's Python, loopback
    locally."""
    env = dict(os.environ)
    driver_env(env, cfg or load())
    return env


def start_job(pipeline: Pipeline, job: str, args: list[str] | None = None,
              cfg: Config | None = None, env: dict[str, str] | None = None
              ) -> subprocess.Popen:
    """Start a job in its own process group, as its profile's launcher starts a driver;
    its output goes to var/log/<pipeline>-<job>.log, and its process (and engine session)
    is recorded for the stops (falkirk.runtime.procs)."""
    cfg = cfg or load()
    launch = launcher(cfg)
    argv = ["--pipeline", pipeline.source or pipeline.name, *(args or [])]
    path = procs.log_file(pipeline, job, cfg)
    path.parent.mkdir(parents=True, exist_ok=True)
    given = launch.prepare(pipeline, job)
    out = open(path, "ab")  # noqa: SIM115 - the child keeps it
    cmd = launch.command(pipeline.job_path(job), argv)
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                            env={**job_env(cfg), **(env or {}), **given},
                            start_new_session=True)
    out.close()
    procs.record_job_process(pipeline, job, proc.pid, process_started(proc.pid), cmd, cfg,
                             given.get(SESSION_ENV))
    return proc
