"""falkirk's local Airflow in one command: ``falkirk airflow start|stop|status|respawn|cli``.

Why here, in the framework: a user who installed falkirk from its wheel has no checkout,
so no ``bin/airflow`` and no ``dags/``. The one DAG file (wiring only) ships in the package
(:data:`DAGS_FOLDER`), Airflow finds falkirk's plugin through the ``airflow.plugins``
entry point the installation declares, and these are the embedded defaults a checkout's
``bin/airflow`` runs too (it only calls ``falkirk airflow``).

``start`` runs api-server, scheduler, dag-processor and triggerer of one Airflow home
(``$FALKIRK_AIRFLOW_HOME``, default ``<falkirk's folder>/airflow``: ``var/airflow`` in a
checkout, ``~/.falkirk/airflow`` or ``$FALKIRK_HOME/airflow`` for a wheel) in one session
(``setsid``) whose id is kept in ``airflow.pid``, so ``stop`` ends every one of them and
their tasks, and nothing else (a stream job a task started runs in a session of its own and
outlives a stop). The API listens on 127.0.0.1 only (``--port``, else
``$FALKIRK_AIRFLOW_PORT``, else 8080; its log servers on the next two ports) and auth stays
on: user admin, with a password generated on first start into ``passwords.json`` (readable
by its owner only; ``$FALKIRK_AIRFLOW_PASSWORD`` sets it). SQLite unless
``AIRFLOW__DATABASE__SQL_ALCHEMY_CONN`` names another database.

The profile (``FALKIRK_ENV``) chooses the executor: LocalExecutor on one machine; on the
local cluster (``bin/cluster up``, a checkout) the CeleryExecutor with the cluster's
PostgreSQL and Redis, asked of ``falkirk cluster airflow-env``, plus Celery workers, each
in a session of its own (``celery-worker-N.pgid``) so one can be lost while the rest run.
``respawn`` starts a component that died again (the fault campaign kills the scheduler);
``stop`` ends it too.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from falkirk.config import CHECKOUT, STATE_DIR, Config, load
from falkirk.errors import FalkirkError
from falkirk.runtime.procs import session_members

#: The folder Airflow's DAG processor reads: the package's, which holds the one DAG file
#: (a wheel and a checkout find it the same way).
DAGS_FOLDER = Path(__file__).resolve().parents[1] / "airflow" / "dags"
DAG_FILE = "falkirk_pipelines.py"
DEFAULT_PORT = 8080
COMPONENTS = ("scheduler", "dag-processor", "triggerer")  # beside the api-server
CELERY_WORKERS = 2  # FALKIRK_CELERY_WORKERS overrides (the cluster profile only)
CELERY_CONCURRENCY = 2  # FALKIRK_CELERY_CONCURRENCY overrides
START_TIMEOUT_S = 120
USER = "admin"  # SimpleAuthManager's one user

#: Settings the environment may override (name: default), and why each differs from
#: Airflow's default.
TUNABLE = {
    # A lost task (its worker, or the scheduler running it, died) is failed, then retried,
    # after this long without a heartbeat (Airflow's default: 300 s).
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "90",
    # A scheduler counts as dead once it has not heartbeat (every 5 s) for this long
    # (Airflow's: 30 s); then its tasks are reset and run again. With LocalExecutor the
    # tasks die with it: a batch epoch's task killed with the scheduler waited 34 s for its
    # next try in an 8-minute fault campaign (with 30 s and 20 s), and the streams waited
    # on that epoch. One scheduler runs here, so a slow heartbeat under load resets
    # nothing of a live one.
    "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD": "12",
    # A live scheduler looks this often for a dead one's tasks (Airflow's: 300 s, which
    # left a supervisor without its watch for 5 minutes after a scheduler crash).
    "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "5",
    # A loaded 2-core machine can take longer than the default 5 s to answer a task's call.
    "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": "30",
    # How often the DAG processor parses the DAG file again (new pipeline folders).
    "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "30",
    # How often it parses a known DAG file (Airflow's: 30 s), which is when a batch DAG
    # whose last run was made before its next epoch was ready gets that run: every 30 s,
    # a batch region that keeps up ran its epochs up to 30 s late and every reader after
    # it too (the 8-minute campaign's answers waited for it). A parse of the pipelines'
    # file took 0.4 s.
    "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "5",
}

#: Settings that hold for every local Airflow of falkirk's.
FIXED = {
    "AIRFLOW__CORE__PARALLELISM": "4",
    "AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG": "4",
    "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    "AIRFLOW__CORE__AUTH_MANAGER":
        "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
    "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{USER}:admin",
    "AIRFLOW__API__HOST": "127.0.0.1",
    "AIRFLOW__API__WORKERS": "1",
    "AIRFLOW__SCHEDULER__STANDALONE_DAG_PROCESSOR": "True",
}


class AirflowError(FalkirkError):
    """falkirk's local Airflow cannot do what was asked (printed as one line)."""


def say(message: str) -> None:
    prefix = "\033[1m[airflow]\033[0m" if sys.stdout.isatty() else "[airflow]"
    print(f"{prefix} {message}", flush=True)


def default_home() -> Path:
    """``$FALKIRK_AIRFLOW_HOME``, else ``airflow/`` in falkirk's folder of this machine."""
    return Path(os.environ.get("FALKIRK_AIRFLOW_HOME") or STATE_DIR / "airflow")


def airflow_command() -> list[str]:
    """How to run Airflow's CLI: the ``airflow`` script beside this interpreter (an
    environment falkirk was installed into), else its module (an interpreter that reaches
    Airflow's package through a path file, as the tests' wheel install does)."""
    script = Path(sys.executable).parent / "airflow"
    return [str(script)] if script.exists() else [sys.executable, "-m", "airflow"]


def plugins_folder() -> str | None:
    """Airflow's plugin folder, or None to leave Airflow's default.

    Airflow loads falkirk's plugin through the ``airflow.plugins`` entry point the
    installation declares (pyproject.toml); a folder holding it as well would register it
    twice. Only an editable install made before the entry point existed (``bin/setup``
    installs it again) needs the checkout's ``plugins/``, whose ``.airflowignore`` lets
    Airflow import the plugin's file only."""
    from importlib.metadata import entry_points

    if any(ep.value.startswith("falkirk.") for ep in entry_points(group="airflow.plugins")):
        return None
    if CHECKOUT is not None:
        return str(CHECKOUT / "plugins")
    raise AirflowError("this falkirk installation declares no airflow.plugins entry point: "
                       "install falkirk again (its wheel declares one)")


def _private_file(path: Path, text: str) -> None:
    """Write ``text`` readable by its owner only."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


class LocalAirflow:
    """One Airflow home of falkirk's local Airflow, and the processes it runs."""

    def __init__(self, home: Path | None = None, port: int | None = None):
        self.home = (home or default_home()).resolve()
        self.logs = self.home / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.pidfile = self.home / "airflow.pid"
        self.portfile = self.home / "airflow.port"
        if port is None:  # a running instance's port, else the default
            saved = self.portfile.read_text().strip() if self.portfile.exists() else ""
            port = int(saved) if saved.isdigit() else int(
                os.environ.get("FALKIRK_AIRFLOW_PORT") or DEFAULT_PORT)
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.passwords = self.home / "passwords.json"
        self._login()

    def _login(self) -> None:
        """One secret per home, shared by every component (tokens signed by one are read
        by all), and the admin's password: generated on first start, or
        ``$FALKIRK_AIRFLOW_PASSWORD`` (the tests' known login). No password is kept in a
        repository."""
        secret = self.home / "secret"
        if not secret.exists() or not secret.stat().st_size:
            _private_file(secret, os.urandom(32).hex())
        given = os.environ.get("FALKIRK_AIRFLOW_PASSWORD")
        if given:
            _private_file(self.passwords, json.dumps({USER: given}) + "\n")
        elif not self.passwords.exists() or not self.passwords.stat().st_size:
            _private_file(self.passwords, json.dumps({USER: os.urandom(12).hex()}) + "\n")

    # -- the environment every component runs in ------------------------------------

    def environment(self, cluster_settings: bool = False) -> dict[str, str]:
        """The environment of Airflow's processes: this one's, with Airflow's settings for
        this home and port and the profile's executor (``cluster_settings``: the local
        cluster's database and queue for the CeleryExecutor, unless the environment names
        a database)."""
        cfg = load()  # the profile chooses the executor and the master Spark jobs go to
        self.executor, self.master = cfg.airflow_executor, cfg.spark_master
        env = dict(os.environ)
        if (cluster_settings and self.executor == "CeleryExecutor"
                and not env.get("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN")):
            env.update(self._cluster_settings())
        python_bin = str(Path(sys.executable).parent)  # spark-submit, the environment's python
        env.update({k: env.get(k) or v for k, v in TUNABLE.items()})
        env.update(FIXED)
        plugins = plugins_folder()
        if plugins is not None:
            env["AIRFLOW__CORE__PLUGINS_FOLDER"] = plugins
        env.update(lineage_settings(cfg, env))
        secret = (self.home / "secret").read_text().strip()
        env.update({
            "AIRFLOW_HOME": str(self.home),
            "PATH": python_bin + os.pathsep + env.get("PATH", ""),
            "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS_FOLDER),
            "AIRFLOW__CORE__EXECUTOR": self.executor,
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(self.passwords),
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.url}/execution/",
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__API__BASE_URL": self.url,
            "AIRFLOW__API__SECRET_KEY": secret,
            "AIRFLOW__API_AUTH__JWT_SECRET": secret,
            "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(self.logs),
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(self.port + 1),
            "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(self.port + 2),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN":
                env.get("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN")
                or f"sqlite:///{self.home}/airflow.db",
            "SPARK_LOCAL_IP": env.get("SPARK_LOCAL_IP") or "127.0.0.1",
            "PYSPARK_PYTHON": env.get("PYSPARK_PYTHON") or sys.executable,
        })
        return env

    def _cluster_settings(self) -> dict[str, str]:
        """What ``falkirk cluster airflow-env`` exports for this home (the local cluster's
        PostgreSQL database and Redis queue of its own; a checkout's dev tooling)."""
        done = subprocess.run([sys.executable, "-m", "falkirk.cli", "cluster", "airflow-env",
                               "--home", str(self.home)], stdout=subprocess.PIPE, text=True)
        if done.returncode != 0:  # its own error went to stderr already
            raise AirflowError("the CeleryExecutor needs the local cluster's PostgreSQL and "
                               "Redis: bin/cluster up (or name Airflow's database in "
                               "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN)")
        out = {}
        for line in done.stdout.splitlines():
            words = shlex.split(line)
            if len(words) == 2 and words[0] == "export" and "=" in words[1]:
                key, _, value = words[1].partition("=")
                out[key] = value
        return out

    # -- the session ----------------------------------------------------------------

    def running_session(self) -> int | None:
        """The session of the running instance (some process still belongs to it: the
        leader may have gone first), else None."""
        sid = _read_int(self.pidfile)
        return sid if sid is not None and session_members(sid) else None

    def extra_sessions(self) -> dict[str, int | None]:
        """Celery workers and respawned components, each a session of its own: name ->
        session id."""
        return {f.stem: _read_int(f) for f in sorted(self.home.glob("*.pgid"))}

    def start(self) -> None:
        """Migrate the database, then start the four components in one new session (and
        the Celery workers of a CeleryExecutor, each in its own); return once the API
        answers."""
        env = self.environment(cluster_settings=True)
        sid = self.running_session()
        if sid is not None:
            say(f"already running (session {sid}): {self.url}")
            return
        if _listening(self.port):
            raise AirflowError(f"port {self.port} is taken: choose another with --port (or "
                               "FALKIRK_AIRFLOW_PORT)")
        airflow = airflow_command()
        database = env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].split("://", 1)[0]
        say(f"AIRFLOW_HOME={self.home}; database {database}")
        say("migrating the metadata database")
        migrate_log = self.logs / "db-migrate.log"
        with open(migrate_log, "w") as out:
            done = subprocess.run([*airflow, "db", "migrate"], env=env, stdout=out,
                                  stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            print(_tail(migrate_log), file=sys.stderr)
            raise AirflowError(f"airflow db migrate failed (log: {migrate_log})")
        profile = os.environ.get("FALKIRK_ENV", "local")
        added = subprocess.run(
            [*airflow, "connections", "add", "spark_default", "--conn-type", "spark",
             "--conn-host", self.master, "--conn-description",
             f"falkirk: Spark of the {profile} profile"],
            env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if added.returncode != 0 and "already exists" not in (added.stdout + added.stderr):
            print(added.stdout + added.stderr, file=sys.stderr)
            raise AirflowError("cannot add the spark_default connection")
        self.portfile.write_text(f"{self.port}\n")
        commands = {"api-server": [*airflow, "api-server", "--host", "127.0.0.1", "--port",
                                   str(self.port)],
                    **{c: [*airflow, c] for c in COMPONENTS}}
        # One new session holds all four; its id is the leader's pid. Each component logs
        # to its own file.
        leader = subprocess.Popen(
            [sys.executable, "-m", "falkirk.local.airflow", str(self.logs), json.dumps(commands)],
            env=env, start_new_session=True, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.pidfile.write_text(f"{leader.pid}\n")
        say(f"started session {leader.pid} (logs: {self.logs}/*.log)")
        if self.executor == "CeleryExecutor":
            self._start_celery_workers(env, airflow)
        self._wait_healthy()

    def _start_celery_workers(self, env: dict[str, str], airflow: list[str]) -> None:
        workers = int(os.environ.get("FALKIRK_CELERY_WORKERS") or CELERY_WORKERS)
        concurrency = os.environ.get("FALKIRK_CELERY_CONCURRENCY") or str(CELERY_CONCURRENCY)
        queue = env.get("AIRFLOW__OPERATORS__DEFAULT_QUEUE") or "default"
        for i in range(1, workers + 1):
            with open(self.logs / f"celery-worker-{i}.log", "w") as out:
                proc = subprocess.Popen(
                    [*airflow, "celery", "worker", "--celery-hostname",
                     f"celery-worker-{i}@127.0.0.1", "--concurrency", concurrency,
                     "--skip-serve-logs", "--queues", queue,
                     "--pid", str(self.home / f"celery-worker-{i}.pid")],
                    env=env, start_new_session=True, stdin=subprocess.DEVNULL, stdout=out,
                    stderr=subprocess.STDOUT)
            (self.home / f"celery-worker-{i}.pgid").write_text(f"{proc.pid}\n")
            say(f"started Celery worker {i}, session {proc.pid}")

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.url}/api/v2/monitor/health", timeout=5):
                    say(f"ready: {self.url}  (login {USER}, password in {self.passwords})")
                    say("stop with: falkirk airflow stop")
                    return
            except OSError:
                pass
            if self.running_session() is None:
                print(_tail(self.logs / "api-server.log"), file=sys.stderr)
                raise AirflowError("airflow exited during start (logs: "
                                   f"{self.logs}/*.log)")
            time.sleep(1)
        print(_tail(self.logs / "api-server.log"), file=sys.stderr)
        raise AirflowError(f"the API did not answer within {START_TIMEOUT_S} s (it is still "
                           "starting; falkirk airflow stop ends it)")

    def stop(self) -> None:
        """End the session, then the Celery workers' and respawned components' (SIGTERM,
        SIGKILL after a while)."""
        for f in sorted(self.home.glob("*.pgid")):
            sid = _read_int(f)
            if sid is not None and session_members(sid):
                _stop_session(sid, 30)
            f.unlink(missing_ok=True)
        sid = self.running_session()
        if sid is None:
            self.pidfile.unlink(missing_ok=True)
            say("not running")
            return
        say(f"stopping session {sid}")
        _stop_session(sid, 60)
        self.pidfile.unlink(missing_ok=True)
        say("stopped")

    def status(self) -> bool:
        """Say whether it runs, where, and the memory its sessions hold; whether it runs."""
        sid = self.running_session()
        if sid is None:
            say(f"not running (AIRFLOW_HOME={self.home})")
            return False
        say(f"running: session {sid} ({_rss_mb(sid)} MB resident), {self.url} (login "
            f"{USER}, password in {self.passwords}), AIRFLOW_HOME={self.home}")
        for name, other in self.extra_sessions().items():
            if other is not None and session_members(other):
                say(f"{name}: session {other} ({_rss_mb(other)} MB resident)")
            else:
                say(f"{name}: not running")
        return True

    def respawn(self, component: str | None) -> None:
        """Start ``component`` again after it died, in a session of its own (the stopped
        one cannot be joined), recorded for ``stop``."""
        if component not in COMPONENTS:
            raise AirflowError(f"respawn: name the component ({', '.join(COMPONENTS)}), "
                               f"got {component or ''!r}")
        env = self.environment(cluster_settings=True)
        if self.running_session() is None:
            raise AirflowError(f"not running (AIRFLOW_HOME={self.home}): falkirk airflow "
                               "start")
        with open(self.logs / f"{component}.log", "a") as out:
            proc = subprocess.Popen([*airflow_command(), component], env=env,
                                    start_new_session=True, stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=subprocess.STDOUT)
        (self.home / f"{component}.pgid").write_text(f"{proc.pid}\n")
        # Popen returns once the child has exec'd, after its setsid: it leads its session.
        if os.getsid(proc.pid) != proc.pid:
            raise AirflowError(f"respawn: {component} (pid {proc.pid}) does not lead a "
                               "session of its own")
        say(f"started {component} again: session {proc.pid}")

    def cli(self, args: list[str]) -> None:
        """Run Airflow's CLI against this instance, in place of this process."""
        command = [*airflow_command(), *args]
        os.execve(command[0], command, self.environment())


def lineage_settings(cfg: Config, env: dict[str, str]) -> dict[str, str]:
    """Airflow's OpenLineage provider sends its tasks' run events where ``cfg.lineage``
    (``FALKIRK_LINEAGE``) says, in falkirk's namespace: the jobs its tasks start send
    theirs there too. Settings the environment gives Airflow itself are kept."""
    from falkirk.config import lineage_transport
    from falkirk.io.lineage import NAMESPACE

    transport = lineage_transport(cfg.lineage)
    if transport is None:
        return {}
    return {k: env.get(k) or v for k, v in (
        ("AIRFLOW__OPENLINEAGE__TRANSPORT", json.dumps(transport)),
        ("AIRFLOW__OPENLINEAGE__NAMESPACE", NAMESPACE))}


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _stop_session(sid: int, timeout_s: float) -> None:
    """SIGTERM every process of session ``sid``; SIGKILL what is left after ``timeout_s``."""
    for sig, wait in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 10.0)):
        if sig == signal.SIGKILL:
            say(f"session {sid} still running after {timeout_s:.0f} s: SIGKILL")
        for pid in session_members(sid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not session_members(sid):
                return
            time.sleep(0.5)


def _rss_mb(sid: int) -> int:
    """Resident memory of a session's processes, in MB."""
    import psutil

    total = 0
    for pid in session_members(sid):
        try:
            total += psutil.Process(pid).memory_info().rss
        except psutil.Error:
            continue
    return total // (1024 * 1024)


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"(no log at {path})"


def _lead(logs: Path, commands: dict[str, list[str]]) -> int:
    """The session's leader: start each component, logging to its own file, and wait
    for them all."""
    procs = []
    for name, command in commands.items():
        with open(logs / f"{name}.log", "w") as out:
            procs.append(subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out,
                                          stderr=subprocess.STDOUT))
    return max(p.wait() for p in procs)


if __name__ == "__main__":
    sys.exit(_lead(Path(sys.argv[1]), json.loads(sys.argv[2])))
