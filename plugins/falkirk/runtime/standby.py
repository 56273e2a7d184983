"""Warm standby drivers: a Spark driver started ahead of need that takes a job's place when
the job is (re)started (docs/standby.md).

Why: most of a recovery is a cold driver (docs/faults.md): spark-submit, the JVM, the Spark
session, and a first epoch that pays class loading and the JIT's warm-up. A standby has
paid all of that before the failure: it builds its session, runs a warm-up through the
paths an epoch takes (a Kafka range read and parse, Delta writes, reads and a join), then
waits. A starter claims it (an exclusive file create, so two starters never share one),
hands it the job's entry point and arguments, and the standby runs that file as
spark-submit would (``__main__``, same ``sys.argv``) in its warm session. Everything that
depends on the failure (the generation, the frontier, the state restore) happens after
the hand-over, exactly as in a fresh driver.

Files, under ``var/run/<pipeline>/standby/``, per standby (named by its process group,
which is its spark-submit's pid): ``<pid>.json`` (the spawner: pid and start time),
``<pid>.ready`` (the standby, once warm), ``<pid>.claim`` (the claimer, created
exclusively), ``<pid>.job`` (the claimer's assignment). A standby is one-shot: it ends
with the job it took, and the starter spawns the next one.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from falkirk.config import Config, load
from falkirk.model.topology import Pipeline
from falkirk.runtime import launcher, procs

log = logging.getLogger(__name__)

# Standbys this process spawned: a hand-over returns the Popen, so its exit code is known.
_spawned: dict[int, subprocess.Popen] = {}


def folder(pipeline: Pipeline, cfg: Config | None = None) -> Path:
    return Path((cfg or load()).var_dir) / "run" / pipeline.name / "standby"


def spawn(pipeline: Pipeline, cfg: Config | None = None,
          env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start a standby driver for ``pipeline`` (its output: var/log/<pipeline>-standby.log)."""
    from falkirk import faults

    cfg = cfg or load()
    where = folder(pipeline, cfg)
    where.mkdir(parents=True, exist_ok=True)
    path = procs.log_file(pipeline, "standby", cfg)
    path.parent.mkdir(parents=True, exist_ok=True)
    cfg, classic = launcher.as_application(cfg)  # a standby keeps a driver JVM warm
    cmd = launcher.job_command(Path(__file__), ["--pipeline", pipeline.source or pipeline.name],
                            cfg)
    environ = {**launcher.job_env(), **(env or {}), **classic}
    environ.pop(faults.ENV, None)  # a crash point is the job's, handed over with it
    nice = procs.may_lower_priority()
    with open(path, "ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=environ,
                                start_new_session=True,
                                preexec_fn=procs.lower_priority if nice else None)
    procs.write_whole(where / f"{proc.pid}.json", {
        "pid": proc.pid, "process_started": procs.process_started(proc.pid),
        "spawned": time.time(), "niced": nice})
    _spawned[proc.pid] = proc
    return proc


def standbys(pipeline: Pipeline, cfg: Config | None = None) -> list[dict[str, Any]]:
    """The live, unclaimed standbys of ``pipeline`` (``ready``: warm), oldest first; the
    files of dead ones are removed."""
    where = folder(pipeline, cfg)
    out = []
    for f in sorted(where.glob("*.json")) if where.exists() else []:
        try:
            info = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        pid = info["pid"]
        if not procs.is_process(pid, info.get("process_started")):
            _forget(where, pid)
            continue
        if (where / f"{pid}.claim").exists():
            continue
        info["ready"] = (where / f"{pid}.ready").exists()
        out.append(info)
    return out


def warm(pipeline: Pipeline, cfg: Config | None = None) -> set[int]:
    """The pids of the standbys ready to take a job now."""
    return {s["pid"] for s in standbys(pipeline, cfg) if s["ready"]}


def _forget(where: Path, pid: int) -> None:
    for suffix in ("json", "ready", "claim", "job"):
        (where / f"{pid}.{suffix}").unlink(missing_ok=True)
    _spawned.pop(pid, None)


def replenish(pipeline: Pipeline, cfg: Config | None = None,
              env: dict[str, str] | None = None) -> list[int]:
    """Spawn standbys until ``cfg.standby_drivers`` are live (warming or ready)."""
    cfg = cfg or load()
    missing = cfg.standby_drivers - len(standbys(pipeline, cfg))
    return [spawn(pipeline, cfg, env).pid for _ in range(max(0, missing))]


class Adopted:
    """A job running in a standby another process spawned: not this process's child, so
    its end is read from the log of runs (a kill leaves no end there: -9)."""

    def __init__(self, pipeline: Pipeline, job: str, pid: int, started: float | None,
                 cfg: Config):
        self.pipeline, self.job, self.pid, self._started, self.cfg = (
            pipeline, job, pid, started, cfg)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and not procs.is_process(self.pid, self._started):
            from falkirk.log.epochlog import EpochLog

            row = EpochLog.from_config(self.cfg).job_runs(self.pipeline.name).get(self.job)
            code = None if row is None else row.get("exit_code")
            self.returncode = -9 if code is None else int(code)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"standby {self.pid}", timeout or 0)
            time.sleep(0.2)
        return self.returncode  # type: ignore[return-value]


def hand_over(pipeline: Pipeline, job: str, args: list[str], cfg: Config | None = None,
              env: dict[str, str] | None = None) -> subprocess.Popen | Adopted | None:
    """Give ``job`` to a warm standby; its handle, or None when none is ready."""
    cfg = cfg or load()
    where = folder(pipeline, cfg)
    for info in standbys(pipeline, cfg):
        pid = info["pid"]
        if not info["ready"]:
            continue
        try:  # exclusive: of two starters, one gets this standby
            os.close(os.open(where / f"{pid}.claim", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            continue
        procs.write_whole(where / f"{pid}.job", {
            "job": str(pipeline.job_path(job)), "args": args, "env": env or {},
            "log": str(procs.log_file(pipeline, job, cfg)), "claimed": time.time()})
        procs.record_job_process(pipeline, job, pid, info.get("process_started"),
                                 ["standby", str(pid), *args], cfg)
        log.info("%s: handed to standby driver %d", job, pid)
        handle = _spawned.pop(pid, None)
        return handle if handle is not None else Adopted(
            pipeline, job, pid, info.get("process_started"), cfg)
    return None


def stop_all(pipeline: Pipeline, cfg: Config | None = None) -> list[int]:
    """Stop every unclaimed standby of ``pipeline`` (claimed ones are jobs now)."""
    where = folder(pipeline, cfg)
    stopped = []
    for info in standbys(pipeline, cfg):
        procs.stop_group(info["pid"])
        _spawned.pop(info["pid"], None)
        _forget(where, info["pid"])
        stopped.append(info["pid"])
    return stopped


# ---- the standby process ----------------------------------------------------------------


def warm_up(spark: Any, pipeline: Pipeline, cfg: Config) -> dict[str, float]:
    """Run an epoch's kinds of work on scratch data: seconds per part."""


    from falkirk.io.kafka import end_offsets, read_range
    from falkirk.model.times import Offsets
    from falkirk.runtime.connectors import record_ddl
    from falkirk.runtime.job import load_job

    spent: dict[str, float] = {}
    t = time.monotonic()
    for job in {spec.job for spec in pipeline.regions.values() if spec.job}:
        load_job(pipeline.job_path(job))  # its imports, once
    spent["imports_s"] = time.monotonic() - t
    t = time.monotonic()
    for edge in pipeline.edges.values():
        if edge.kind != "kafka":  # the input topics (a region's input read from Kafka)
            continue
        try:
            ends = end_offsets(cfg.kafka_bootstrap, edge.topic)
        except Exception as exc:  # noqa: BLE001 - no topic yet: nothing to warm up with
            log.info("warm-up skips topic %s: %s", edge.topic, exc)
            continue
        rows = read_range(spark, cfg.kafka_bootstrap, edge.topic, Offsets(),
                          Offsets({p: min(o, 200) for p, o in ends.items()}),
                          record_ddl(edge.topic, pipeline.schema_roots))
        rows.groupBy("partition").count().collect()
    spent["kafka_s"] = time.monotonic() - t
    t = time.monotonic()
    warm_up_delta(spark, cfg.table("_falkirk_standby", pipeline.name, str(os.getpgrp())))
    spent["delta_s"] = time.monotonic() - t
    return spent


def warm_up_delta(spark: Any, scratch: str) -> None:
    """Delta writes (an idempotent append among them), reads, aggregates and a join on a
    scratch table at ``scratch``, removed after (a local one)."""
    import shutil

    from pyspark.sql import functions as F

    for round_ in range(2):
        df = spark.range(2000).select((F.col("id") % 50).alias("key"), F.col("id").alias(
            "value"), F.col("id").cast("string").alias("text"))
        (df.write.format("delta").mode("overwrite" if round_ == 0 else "append")
         .option("txnAppId", "falkirk:warm-up").option("txnVersion", round_).save(scratch))
        table = spark.read.format("delta").load(scratch)
        counts = table.groupBy("key").agg(F.count("*").alias("n"), F.sum("value").alias("s"))
        counts.join(table, "key").groupBy("key").agg(F.max("n")).collect()
        table.toPandas()
    if "://" not in scratch:
        shutil.rmtree(scratch, ignore_errors=True)


def serve(argv: list[str] | None = None) -> None:
    """The standby's life: warm up, wait for a job, become it (never returns)."""
    import runpy

    from falkirk import faults
    from falkirk.runtime.launcher import session
    from falkirk.model.topology import load_pipeline

    p = argparse.ArgumentParser(description="A warm Spark driver waiting for a job.")
    p.add_argument("--pipeline", required=True)
    p.add_argument("--poll", type=float, default=0.1)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg = load()
    pipeline = load_pipeline(args.pipeline)
    me = os.getpgrp()  # spark-submit's pid: the name the spawner gave this standby
    where = folder(pipeline, cfg)
    t0 = time.monotonic()
    spark = session(f"falkirk-{pipeline.name}-standby", cfg)
    spent = {"session_s": time.monotonic() - t0}
    try:
        spent.update(warm_up(spark, pipeline, cfg))
    except Exception:  # a standby that did not warm up is still a started driver
        log.exception("standby %d: warm-up failed", me)
    procs.write_whole(where / f"{me}.ready", {
        "ready_at": time.time(), **{k: round(v, 2) for k, v in spent.items()}})
    log.info("standby %d ready for pipeline %s: %s", me, pipeline.name, spent)
    job_file = where / f"{me}.job"
    while not job_file.exists():
        time.sleep(args.poll)
    task = json.loads(job_file.read_text())
    _forget(where, me)
    out = os.open(task["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    log.info("standby driver %d takes %s %s (its JVM's own output stays in %s)", me,
             task["job"], " ".join(task["args"]),
             procs.log_file(pipeline, "standby", cfg))
    procs.set_group_priority(me, 0)  # the job it becomes runs at the normal priority
    os.environ.pop(faults.ENV, None)
    os.environ.update(task["env"])
    sys.argv = [task["job"], *task["args"]]
    runpy.run_path(task["job"], run_name="__main__")
    os._exit(0)  # a job's main ends the process itself; a script that returns is done


if __name__ == "__main__":
    serve()
