"""A local Kafka-compatible broker (noida-db) for tests and the demo.

noida-db's ``up`` daemonizes: it spawns ``noida-db start`` as a grandchild that is
reparented to pid 1, which does not reap it here, so after ``down`` it lingers as a
zombie and we could never tell "stopped" from "still running" by its pid. So we run
``noida-db start`` (the same server, in the foreground) ourselves, in its own process
group, with its output in ``DATA_DIR/broker.log``: we own the pid, reap it, and can
kill the group if ``noida-db down`` does not stop it. ``down`` is still the normal
stop, because it saves the data snapshot (a kill -9 may lose the last second).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

from falkirk.procs import group_members

STARTUP_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 10.0
LOG_NAME = "broker.log"


class BrokerError(RuntimeError):
    """The local broker did not start, stop or accept a request."""


def noida_db_executable() -> str:
    """The ``noida-db`` next to this interpreter (the venv), else the one on PATH."""
    beside = Path(sys.executable).parent / "noida-db"
    if beside.exists():
        return str(beside)
    found = shutil.which("noida-db")
    if found is None:
        raise BrokerError("noida-db is not installed (pip install noida-db)")
    return found


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on right now (racy; start() retries)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


class LocalBroker:
    """One noida-db server with only its Kafka-compatible service, on 127.0.0.1."""

    def __init__(
        self,
        data_dir: Path | str,
        port: int | None = None,
        startup_timeout: float = STARTUP_TIMEOUT_S,
    ):
        self.data_dir = Path(data_dir).resolve()
        self.port = port
        self._fixed_port = port is not None
        self.startup_timeout = startup_timeout
        self._proc: subprocess.Popen | None = None

    @property
    def log_path(self) -> Path:
        return self.data_dir / LOG_NAME

    @property
    def bootstrap(self) -> str:
        if self.port is None:
            raise BrokerError("the broker has no port yet: call start() first")
        return f"127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> LocalBroker:
        """Start the server and wait until a Kafka client can fetch metadata."""
        if self.running:
            return self
        self.data_dir.mkdir(parents=True, exist_ok=True)
        attempts = 1 if self._fixed_port else 3
        for attempt in range(attempts):
            if not self._fixed_port:
                self.port = free_port()
            try:
                self._launch_and_wait()
                return self
            except BrokerError as e:
                port_taken = "already in use" in str(e)
                if not port_taken or attempt == attempts - 1:
                    raise
        raise AssertionError("unreachable")

    def _launch_and_wait(self) -> None:
        if _listening(self.port):
            # Else the readiness check below could be answered by whoever holds the port.
            raise BrokerError(f"port {self.port} on 127.0.0.1 is already in use")
        cmd = [
            noida_db_executable(), "start", "--only", "kafka",
            "--kafka-port", str(self.port), "--data-dir", str(self.data_dir),
        ]  # fmt: skip
        with open(self.log_path, "ab") as log:
            log.write(f"\n--- {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(cmd)}\n".encode())
            log.flush()
            self._proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # own process group: stop() can kill all of it
            )
        deadline = time.monotonic() + self.startup_timeout
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            code = self._proc.poll()
            if code is not None:
                self._proc = None
                raise BrokerError(
                    f"the broker on port {self.port} exited with code {code} while starting; "
                    f"last lines of {self.log_path}:\n{self.log_tail()}"
                )
            try:
                self._fetch_metadata()
                return
            except Exception as e:  # not listening yet, or not answering yet
                last_error = e
                time.sleep(0.1)
        self._kill_group()
        raise BrokerError(
            f"the broker on port {self.port} did not answer a metadata request within "
            f"{self.startup_timeout:.0f} s (last error: {last_error!r}); last lines of "
            f"{self.log_path}:\n{self.log_tail()}"
        )

    def _fetch_metadata(self) -> None:
        if not _listening(self.port):  # cheap check first: kafka-python's timeouts are long
            raise BrokerError(f"nothing listens on port {self.port} yet")
        admin = self.admin(request_timeout_ms=3000)
        try:
            admin.list_topics()
        finally:
            admin.close()

    def admin(self, **config):
        """A kafka-python admin client for this broker (the caller closes it)."""
        from kafka import KafkaAdminClient

        return KafkaAdminClient(bootstrap_servers=self.bootstrap, client_id="falkirk", **config)

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """``noida-db down`` (saves the data), then make sure our process group is gone."""
        if self._proc is None:
            return
        with contextlib.suppress(subprocess.TimeoutExpired):
            subprocess.run(
                [noida_db_executable(), "down", "--data-dir", str(self.data_dir)],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=STOP_TIMEOUT_S,
                check=False,
            )
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=STOP_TIMEOUT_S)
        self._kill_group()

    def _kill_group(self) -> None:
        """TERM, then KILL, whatever still lives in our process group; reap our child."""
        if self._proc is None:
            return
        pgid = self._proc.pid
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if not group_members(pgid):
                break
            try:
                os.killpg(pgid, sig)
                if sig == signal.SIGTERM:
                    os.killpg(pgid, signal.SIGCONT)  # a stopped process only sees TERM once resumed
            except ProcessLookupError:
                break
            deadline = time.monotonic() + 5
            while group_members(pgid) and time.monotonic() < deadline:
                self._proc.poll()  # reap our child so it does not count as alive
                time.sleep(0.05)
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired as e:
            raise BrokerError(f"the broker process {pgid} did not exit after SIGKILL") from e
        self._proc = None

    def create_topic(self, name: str, partitions: int, replication: int = 1) -> None:
        """Create ``name`` with exactly ``partitions`` partitions (idempotent).

        An existing topic with the same partition count is fine; a different count is an
        error, because silently reading 1 partition where 3 were meant hides bugs.
        """
        from kafka.errors import TopicAlreadyExistsError

        if partitions < 1:
            raise ValueError(f"a topic needs at least 1 partition, got {partitions}")
        admin = self.admin()
        try:
            try:
                admin.create_topics(
                    {name: {"num_partitions": partitions, "replication_factor": replication}},
                    wait_for_metadata=True,
                )
                return
            except TopicAlreadyExistsError:
                pass
            [topic] = admin.describe_topics([name])
            existing = len(topic["partitions"])
            if existing != partitions:
                raise BrokerError(
                    f"topic {name!r} already exists with {existing} partitions, "
                    f"not the {partitions} asked for"
                )
        finally:
            admin.close()

    def __enter__(self) -> LocalBroker:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"LocalBroker({str(self.data_dir)!r}, port={self.port}, {state})"
