"""The embedded engine: one Spark Connect server that every job of this machine uses.

Why: with a Spark application per job, every start and every recovery paid a driver JVM
(spark-submit, the session, a first epoch in a cold JVM: 9-23 s here, most of a
recovery; docs/faults.md), and four drivers shared 2 cores with their compilers and
collectors. With Spark Connect a job is a thin Python client in a session of its own on
one long-running, warm Spark application: a job starts in about a second and its first
epoch runs warm (README, "One engine").

The server is Spark's own (``org.apache.spark.sql.connect.service.SparkConnectServer``,
in pyspark's jars), started by spark-submit with the profile's launch settings (the
Kafka connector, delta-spark, the drivers' class-data archive), on loopback. Its jobs
share the cores by Spark's FAIR scheduler, so one job's long stage does not hold the
others' small ones.

``Config.local_engine``: when nothing answers at ``Config.spark_remote``, whoever starts a
job (or a session) starts the engine (:func:`ensure`), once per machine (a file lock),
in a session of its own that outlives the starter, as an operator would start any
server. ``falkirk engine stop`` stops it. :class:`LocalEngine` runs one for a sandbox (the
test suite, the demo, the campaigns), which stops it when done. Who starts it is the
launcher (falkirk.runtime.launcher), the one place a job's driver starts.

A job tells an engine started again in the meantime (by someone's :func:`ensure`, on the
same port) from its own by the recorded process (:func:`serving`): its session died with
the old one.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from falkirk.config import Config, load
from falkirk.errors import FalkirkError
from falkirk.io.launch import launch_conf, spark_submit
from falkirk.io.spark import address, answering
from falkirk.runtime.procs import (
    free_port,
    group_members,
    is_process,
    process_started,
    write_whole,
)

STARTUP_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 30.0
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
# Every job's Spark jobs go to the default pool, which Spark schedules FIFO unless told:
# a job's long stage would then hold every other job's small ones.
FAIR_POOLS = """<?xml version="1.0"?>
<allocations>
  <pool name="default"><schedulingMode>FAIR</schedulingMode><weight>1</weight></pool>
</allocations>
"""


class EngineError(FalkirkError, RuntimeError):
    """The engine did not start, or does not answer where the config says it is."""


def engine_conf(cfg: Config, host: str, port: int, where: Path) -> dict[str, str]:
    """The server's Spark settings: the profile's launch settings (jars, Delta, the
    class-data archive) with the engine's master, heap and Connect service (its FAIR
    pools' file goes to ``where``)."""
    pools = where / "fair-pools.xml"
    pools.write_text(FAIR_POOLS)
    conf = {
        **launch_conf(cfg),
        "spark.master": cfg.engine_master,
        "spark.app.name": "falkirk-engine",
        "spark.driver.memory": cfg.engine_memory,
        "spark.connect.grpc.binding.address": host,
        "spark.connect.grpc.binding.port": str(port),
        "spark.connect.grpc.port.maxRetries": "0",  # its port or nothing: clients know it
        "spark.scheduler.mode": "FAIR",
        "spark.scheduler.allocation.file": str(pools),
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        # An epoch's queries are small and each new one (its literals are the epoch's)
        # compiled its generated Java code: Janino took 22% of the engine's CPU in the
        # reference pipeline's run (a JFR profile, README "One engine"). Interpreted.
        "spark.sql.codegen.wholeStage": "false",
        "spark.sql.codegen.factoryMode": "NO_CODEGEN",
        # Adaptive execution runs each shuffle stage as a Spark job of its own and
        # re-plans between them; an epoch's small shuffles gain nothing from it and paid
        # its stages (the reference pipeline deployed: 80 -> 42 stages an epoch).
        "spark.sql.adaptive.enabled": "false",
        # A session whose job died without its session being released (nobody stopped
        # it) goes after 10 minutes, an execution whose client died after 1 (Spark's
        # defaults: 60 and 5 minutes, long for a machine of 2 cores to carry them).
        "spark.connect.session.manager.defaultSessionTimeout": "10min",
        "spark.connect.execute.manager.detachedTimeout": "60s",
        # Each call's stages reach its client as progress reports (what a job's log counts
        # per phase, falkirk.io.spark.jobs_in_group): every 2 s by default, so a call that
        # ended sooner reported none.
        "spark.connect.progress.reportInterval": "50ms",
    }
    if host in ("127.0.0.1", "localhost"):
        conf["spark.driver.host"] = "127.0.0.1"
        conf["spark.driver.bindAddress"] = "127.0.0.1"
    conf["spark.driver.extraJavaOptions"] = engine_java_options(
        conf.get("spark.driver.extraJavaOptions", ""), where)
    return conf


#: Options of short-lived drivers the engine does not take: it is one JVM that runs every
#: job's work for hours, where C1 alone (``-XX:TieredStopAtLevel=1``, for drivers that
#: start often and share the cores with others: falkirk.config) leaves its hot code a
#: third slower or more once warm.
NOT_FOR_THE_ENGINE = ("-XX:TieredStopAtLevel=1",)


def engine_java_options(options: str, where: Path) -> str:
    """The engine's JVM options: the profile's drivers' without :data:`NOT_FOR_THE_ENGINE`,
    and its collections logged to ``gc.log`` beside its log (rotated, 5 files of 10 MB),
    which shows whether a slow stretch of a run was the collector's."""
    kept = [o for o in options.split() if o not in NOT_FOR_THE_ENGINE]
    kept.append(f"-Xlog:gc:file={where / 'gc.log'}:uptime,time:filecount=5,filesize=10m")
    return " ".join(kept)


class LocalEngine:
    """A Spark Connect server on loopback, in a process group of its own, with its log
    and a record of its process (``engine.json``) in ``folder``."""

    def __init__(self, folder: Path | str, port: int | None = None,
                 cfg: Config | None = None, startup_timeout_s: float = STARTUP_TIMEOUT_S):
        self.folder = Path(folder).resolve()
        self.cfg = cfg or load()
        self.port = port
        self.startup_timeout_s = startup_timeout_s
        self._proc: subprocess.Popen | None = None

    @property
    def remote(self) -> str:
        if self.port is None:
            raise EngineError("the engine has no port yet: call start() first")
        return f"sc://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.folder / "engine.log"

    @property
    def record(self) -> Path:
        return self.folder / "engine.json"

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def start(self) -> LocalEngine:
        """Start the server and wait until it answers (a cold start: 10-20 s here)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        if self.port is None:
            self.port = free_port()
        if answering(self.remote):
            raise EngineError(f"port {self.port} on 127.0.0.1 is already in use")
        props = self.folder / "engine.conf"
        props.write_text("".join(f"{k}={v}\n" for k, v in
                                 engine_conf(self.cfg, "127.0.0.1", self.port,
                                             self.folder).items()))
        cmd = [str(spark_submit()), "--properties-file", str(props), "--class", SERVER_CLASS,
               "spark-internal"]
        env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1",
               "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable)}
        with open(self.log_path, "ab") as out:
            out.write(f"\n--- {time.strftime('%Y-%m-%d %H:%M:%S')} engine on "
                      f"{self.remote}\n".encode())
            out.flush()
            self._proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out,
                                          stderr=subprocess.STDOUT, env=env,
                                          start_new_session=True)
        proc = self._proc
        # Reap it when it ends, whoever outlives whom: a dead engine must not linger as a
        # zombie of a long-lived starter (the triggerer), which would look alive.
        threading.Thread(target=proc.wait, name="falkirk-engine-reaper", daemon=True).start()
        write_whole(self.record, {"pid": proc.pid, "pgid": proc.pid, "port": self.port,
                                  "remote": self.remote,
                                  "process_started": process_started(proc.pid),
                                  "started": time.time()})
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise EngineError(f"the engine on port {self.port} exited with code "
                                  f"{proc.returncode} while starting; last lines of "
                                  f"{self.log_path}:\n{self.log_tail()}")
            if answering(self.remote):
                write_whole(self.record, {**json.loads(self.record.read_text()),
                                          "serving": time.time()})
                return self
            time.sleep(0.2)
        self.kill()
        raise EngineError(f"the engine on port {self.port} did not answer within "
                          f"{self.startup_timeout_s:.0f} s; last lines of {self.log_path}:\n"
                          f"{self.log_tail()}")

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        """SIGTERM (Spark stops its context), then SIGKILL what is left; and the engine
        recorded in its folder, if another process serves there now."""
        if self._proc is not None:
            stop_group(self._proc.pid)
            self._proc = None
        info = _recorded(self.folder)
        if info is not None:
            stop_group(info["pgid"])

    def kill(self) -> None:
        """SIGKILL the server (a crash, for fault tests): every session on it is gone."""
        if self._proc is not None:
            stop_group(self._proc.pid, signals=(signal.SIGKILL,))
            self._proc = None

    def restart(self, crash: bool = False) -> LocalEngine:
        """Stop (or SIGKILL), then start on the same port: clients keep their URL."""
        if crash:
            self.kill()
        else:
            self.stop()
        return self.start()

    def __enter__(self) -> LocalEngine:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def stop_group(pgid: int, signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGKILL),
               wait_s: float = STOP_TIMEOUT_S) -> None:
    """Signal the engine's process group, escalating until none of it is left."""
    for sig in signals:
        if not group_members(pgid):
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, sig)
        deadline = time.monotonic() + wait_s
        while group_members(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)


def folder(cfg: Config) -> Path:
    """Where the engine falkirk starts keeps its log and process record."""
    return Path(cfg.engine_dir or Path(cfg.var_dir) / "engine")


def ensure(cfg: Config | None = None, warm: bool = False) -> None:
    """Start this machine's engine when the config says falkirk runs it and nothing
    answers at ``spark_remote``; return once it answers. One starter at a time (a lock
    under ``var_dir``): the supervisor may restart several jobs at once. ``warm``: a
    pipeline's first start, before any job: an engine started here then works through
    ``engine_warmup_s`` of warm-up epochs first (falkirk.runtime.warmup); a recovery
    does not wait for that."""
    cfg = cfg or load()
    if not cfg.spark_remote:
        return
    host, port = address(cfg.spark_remote)
    if answering(cfg.spark_remote):
        return
    if not cfg.local_engine or host not in ("127.0.0.1", "localhost"):
        raise EngineError(f"no Spark Connect server answers at {cfg.spark_remote} "
                          "(FALKIRK_SPARK_REMOTE): start it, or run with "
                          "FALKIRK_LOCAL_ENGINE=1 to let falkirk start one on this machine")
    where = folder(cfg)
    where.mkdir(parents=True, exist_ok=True)
    with open(where / "engine.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if answering(cfg.spark_remote):  # another starter was first
            return
        running = _recorded(where)  # started, not answering yet: wait for it
        if running is not None:
            deadline = time.monotonic() + STARTUP_TIMEOUT_S
            while time.monotonic() < deadline and is_process(running["pid"],
                                                              running["process_started"]):
                if answering(cfg.spark_remote):
                    return
                time.sleep(0.2)
            stop_group(running["pgid"])
        LocalEngine(where, port, cfg).start()
        if warm and cfg.engine_warmup_s > 0:
            from falkirk.runtime.warmup import warm as warm_up

            warm_up(cfg, cfg.engine_warmup_s, where)


def serving(cfg: Config | None = None) -> tuple[int, float] | None:
    """The process recorded serving as this machine's engine, ``(pid, its start time)``,
    or None: a client whose engine became another process has lost its session. Only for
    a profile whose engine falkirk runs."""
    cfg = cfg or load()
    info = _recorded(folder(cfg)) if cfg.local_engine and cfg.spark_remote else None
    return None if info is None else (info["pid"], info["process_started"])


def died(cfg: Config | None = None) -> bool:
    """This machine's engine, which falkirk runs, has died: nothing answers and no engine
    process is recorded alive (one still starting has not died). Every session on it, so
    every job on it, is gone: the supervisor recovers them all at once."""
    cfg = cfg or load()
    return (cfg.local_engine and bool(cfg.spark_remote) and _recorded(folder(cfg)) is None
            and not answering(cfg.spark_remote))


def _recorded(where: Path) -> dict | None:
    """The engine process recorded in ``where`` while it runs, else None."""
    try:
        info = json.loads((where / "engine.json").read_text())
    except (OSError, ValueError):
        return None
    return info if is_process(info.get("pid"), info.get("process_started")) else None


def stop_local(cfg: Config | None = None) -> bool:
    """Stop the engine :func:`ensure` started under this config's ``var_dir``; whether
    one ran."""
    cfg = cfg or load()
    info = _recorded(folder(cfg))
    if info is None:
        return False
    stop_group(info["pgid"])
    return True


def kill_local(cfg: Config | None = None) -> int | None:
    """SIGKILL the engine :func:`ensure` started (a crash, for fault campaigns); its pid,
    or None when none ran. Every session on it is gone; the next job started starts it
    again."""
    cfg = cfg or load()
    info = _recorded(folder(cfg))
    if info is None:
        return None
    stop_group(info["pgid"], signals=(signal.SIGKILL,))
    return info["pid"]


def status(cfg: Config | None = None) -> dict:
    """Where the engine should be, whether it answers, and its recorded process."""
    cfg = cfg or load()
    info = _recorded(folder(cfg)) if cfg.spark_remote else None
    return {"remote": cfg.spark_remote or None, "local_engine": cfg.local_engine,
            "answering": bool(cfg.spark_remote) and answering(cfg.spark_remote),
            "pid": None if info is None else info["pid"],
            "log": str(folder(cfg) / "engine.log")}

