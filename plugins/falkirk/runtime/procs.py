"""Job processes: find them, stop them (a job is started by falkirk.runtime.launcher).

Each running job leaves a small JSON file under ``var/run/<pipeline>/`` naming its pid,
process group, the regions it hosts and its engine session, so a rollback can stop
exactly the jobs that host affected regions (and release their sessions), and the
supervisor can tell a dead region from a slow one.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING

from falkirk.config import Config, load
from falkirk.model.process import process_started
from falkirk.model.topology import Pipeline

if TYPE_CHECKING:
    from falkirk.log.epochlog import EpochLog

logger = logging.getLogger("falkirk.runtime")


def _dirs(cfg: Config | None) -> tuple[Path, Path]:
    """(pid files, logs) of this machine's profile."""
    var = Path((cfg or load()).var_dir)
    return var / "run", var / "log"



def jobs_of(pipeline: Pipeline) -> dict[str, list[str]]:
    """Job entry point -> the regions it hosts (in declaration order)."""
    out: dict[str, list[str]] = {}
    for name, spec in pipeline.regions.items():
        if spec.job:
            out.setdefault(spec.job, []).append(name)
    return out


def log_file(pipeline: Pipeline, job: str, cfg: Config | None = None) -> Path:
    """Where a job's output goes: var/log/<pipeline>-<job>.log."""
    return _dirs(cfg)[1] / f"{pipeline.name}-{Path(job).stem}.log"


def write_whole(path: Path, value: dict) -> None:
    """Write whole or not at all: a reader (the watch looks every second) never sees half
    a file. The new content goes to a side file, then replaces the old one at once."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(value))
    os.replace(tmp, path)


def record_job_process(pipeline: Pipeline, job: str, pid: int, started: float | None,
                       cmd: list[str], cfg: Config | None = None,
                       spark_session: str | None = None) -> None:
    """Name the process (group) that runs ``job`` now, and its Spark Connect session if
    any, for ``running``, the stops and :func:`release_sessions`."""
    run_dir = _dirs(cfg)[0] / pipeline.name
    run_dir.mkdir(parents=True, exist_ok=True)
    write_whole(run_dir / f"{Path(job).stem}.json", {
        "pid": pid, "pgid": pid, "job": job, "regions": jobs_of(pipeline).get(job, []),
        "started": time.time(), "process_started": started, "command": cmd,
        "spark_session": spark_session,
    })


def recorded(pipeline: Pipeline, cfg: Config | None = None) -> list[dict]:
    """The last process recorded for each job of a pipeline, alive or not."""
    folder = _dirs(cfg)[0] / pipeline.name
    return [json.loads(f.read_text())
            for f in sorted(folder.glob("*.json"))] if folder.exists() else []


def release_sessions(pipeline: Pipeline, regions: set[str], cfg: Config | None = None
                     ) -> list[str]:
    """Release the engine sessions of the jobs hosting ``regions`` whose process is gone
    (killed, stopped, crashed); the jobs whose session was released.

    A Connect job killed in the middle of a call leaves that call running on the engine
    (Spark keeps an execution whose client went away, for it to reattach), where it could
    still commit after the rollback that follows. A rollback calls this after its stop:
    the session's operations are interrupted and the session closed. What an
    interruption cannot stop (a commit already writing its log entry) the rollback's
    fence of the writers' transactions refuses (falkirk.io.delta.fence_older_generations)."""
    cfg = cfg or load()
    if not cfg.spark_remote:
        return []
    from falkirk.io.spark import release_session

    released = []
    for info in recorded(pipeline, cfg):
        sid = info.get("spark_session")
        if (sid and set(info.get("regions", ())) & regions
                and not is_process(info["pid"], info.get("process_started"))):
            release_session(cfg.spark_remote, sid)
            released.append(info["job"])
    return released


def running(pipeline: Pipeline, cfg: Config | None = None) -> list[dict]:
    """The job processes of a pipeline that are alive now."""
    return [info for info in recorded(pipeline, cfg)
            if is_process(info["pid"], info.get("process_started"))]


def is_process(pid: object, started: float | None) -> bool:
    """``pid`` still names the process that started at ``started`` (the OS reuses pids: a
    reused one has another start time)."""
    return isinstance(pid, int) and alive(pid) and process_started(pid) == started


def alive(pid: int) -> bool:
    """True while the process runs (a zombie, dead but not yet reaped, counts as dead)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except FileNotFoundError:
        return False
    return stat[stat.rfind(")") + 2 :][:1] not in ("Z", "X", "")


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) pids in process group ``pgid``; zombies hold no port or memory."""
    return _live_with(2, pgid)


def session_members(sid: int) -> list[int]:
    """Live (non-zombie) pids in session ``sid`` (a ``setsid`` start and all it ran, each
    task in a process group of its own included)."""
    return _live_with(3, sid)


def session_of(pid: int) -> int | None:
    """The session of ``pid`` (None once it is gone)."""
    try:
        return os.getsid(pid)
    except OSError:
        return None


def _live_with(field: int, value: int) -> list[int]:
    """Live pids whose /proc stat field ``field`` (after the name: 0 state, 1 ppid,
    2 process group, 3 session) is ``value``."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid pgrp session ...; comm may contain spaces and parentheses.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > field and int(fields[field]) == value and fields[0] not in ("Z", "X"):
            members.append(int(entry.name))
    return members


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on right now (racy: a starter retries or
    refuses a port taken meanwhile)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def group_alive(pgid: int) -> bool:
    """Some process of the group still runs (zombies do not count)."""
    return bool(group_members(pgid))


def stop_group(pgid: int, timeout_s: float = 30.0) -> None:
    """SIGTERM the process group, SIGKILL what is left after ``timeout_s``."""
    for sig, wait in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not group_alive(pgid):
                return
            time.sleep(0.2)


def stop_regions(pipeline: Pipeline, regions: set[str], cfg: Config | None = None,
                 park_s: float = 0.0, epoch_log: EpochLog | None = None) -> list[str]:
    """Stop every running job that hosts one of ``regions``; return the jobs stopped.

    With ``park_s`` (the regions are fenced already) a stream job is first given that
    long to park (:mod:`falkirk.runtime.park`): it keeps its warm driver and resumes by
    itself when the rollback is done, so it is neither stopped nor returned. Each stopped
    job gets a ``stopped`` row in the log of job runs: the supervisor must not take it for
    a death (and roll its regions back as failed) if the one who stopped it dies before
    starting it again. ``epoch_log``: the caller's (the rollback's), already read."""
    from falkirk.log.epochlog import EpochLog

    log = epoch_log or EpochLog.from_config(cfg or load())
    hosting = [info for info in running(pipeline, cfg) if set(info["regions"]) & regions]
    parked: set[str] = set()
    if park_s > 0:
        from falkirk.runtime.park import wait_parked

        streams = [info for info in hosting if "--epoch" not in (info.get("command") or [])]
        parked = wait_parked(log, pipeline.name, streams, park_s)
        if parked:
            logger.info("parked for the rollback, in their drivers: %s", sorted(parked))
    stopped = [info for info in hosting if info["job"] not in parked]
    for info in stopped:
        stop_group(info["pgid"])
    release_sessions(pipeline, regions, cfg)
    if stopped:
        runs = log.job_runs(pipeline.name)
        for info in stopped:
            log.record_job_run(pipeline.name, info["job"], info["regions"],
                               (runs.get(info["job"]) or {}).get("generation") or 0,
                               "stopped", message="stopped by a rollback",
                               process={"host": info.get("host"), "pid": info["pid"],
                                        "started": info.get("process_started")})
    return [info["job"] for info in stopped]
