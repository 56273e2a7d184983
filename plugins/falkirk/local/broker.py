"""The embedded broker: Apache Kafka 4.2 in KRaft mode, run from the jars bin/setup fetched.

One node is broker and controller at once, on two free loopback ports (clients, and the
KRaft controller quorum). Its storage lives in ``data_dir`` and is formatted once, with a
cluster id kept there; restarting on the same folder keeps every record. A folder formatted
by another cluster is refused, nothing deleted. Records are never deleted by retention
(``log.retention.ms=-1``): the epochs are event-time windows, and records stamped with an
old event time must stay until garbage collection acknowledges them.

The JVM runs with a small heap and C1 with the serial collector, like the local Spark
drivers (four Spark JVMs and the broker share 2 cores). Measured here
(``LocalBroker(tmp).start()`` in a loop, psutil RSS after start): ready in 2.7-3.5 s,
~280 MB resident.
"""

from __future__ import annotations

import base64
import contextlib
import os
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path
from types import TracebackType

from falkirk.errors import FalkirkError
from falkirk.io.jars import kafka_classpath
from falkirk.runtime.procs import free_port, group_members

STARTUP_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
LOG_NAME = "broker.log"
CLUSTER_ID_NAME = "cluster.id"
JVM_OPTIONS = ("-Xms64m", "-Xmx512m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC",
               "-XX:ReservedCodeCacheSize=128m")
LOG4J2 = """\
Configuration:
  Appenders:
    Console:
      name: STDOUT
      PatternLayout:
        pattern: "[%d] %p %m (%c)%n"
  Loggers:
    Root:
      level: INFO
      AppenderRef:
        - ref: STDOUT
    Logger:
      - name: org.apache.kafka
        level: WARN
"""


class BrokerError(FalkirkError, RuntimeError):
    """The local broker did not start, stop or accept a request."""


def _new_cluster_id() -> str:
    """A random KRaft cluster id (URL-safe base64 of a UUID, as Kafka's ``random-uuid``) that
    does not start with "-": the storage tool's option parser would read that as an option,
    which Kafka's own ``Uuid.randomUuid`` avoids the same way (one in 64 ids)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


class LocalBroker:
    """One Apache Kafka broker+controller (KRaft) on 127.0.0.1, in its own process group."""

    def __init__(
        self,
        data_dir: Path | str,
        port: int | None = None,
        startup_timeout: float = STARTUP_TIMEOUT_S,
    ):
        self.data_dir = Path(data_dir).resolve()
        self.port = port
        self.controller_port: int | None = None
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

    # -- starting ------------------------------------------------------------------------

    def start(self) -> LocalBroker:
        """Format the storage if new, start the broker and wait until a client is answered."""
        if self.running:
            return self
        self.data_dir.mkdir(parents=True, exist_ok=True)
        attempts = 1 if self._fixed_port else 3
        for attempt in range(attempts):
            if not self._fixed_port:
                self.port = free_port()
            self.controller_port = self._controller_port(fresh=attempt > 0)
            try:
                self._launch_and_wait()
                return self
            except BrokerError as e:
                if "already in use" not in str(e) or attempt == attempts - 1:
                    raise
        raise AssertionError("unreachable")

    def _controller_port(self, fresh: bool) -> int:
        """The controller's port: the one this storage was formatted with (the quorum
        records its voter's endpoint), else a free one, remembered in the folder."""
        path = self.data_dir / "controller.port"
        if path.exists() and not fresh:
            return int(path.read_text())
        port = free_port()
        if not (self.data_dir / "logs" / "meta.properties").exists() or not path.exists():
            path.write_text(str(port))
            return port
        return int(path.read_text())

    def _properties(self) -> Path:
        path = self.data_dir / "server.properties"
        path.write_text("\n".join([
            "process.roles=broker,controller",
            "node.id=1",
            f"controller.quorum.bootstrap.servers=127.0.0.1:{self.controller_port}",
            f"listeners=PLAINTEXT://127.0.0.1:{self.port},"
            f"CONTROLLER://127.0.0.1:{self.controller_port}",
            f"advertised.listeners=PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names=CONTROLLER",
            "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            f"log.dirs={self.data_dir / 'logs'}",
            # One node: every internal topic has one replica.
            "offsets.topic.replication.factor=1",
            "transaction.state.log.replication.factor=1",
            "transaction.state.log.min.isr=1",
            "share.coordinator.state.topic.replication.factor=1",
            "share.coordinator.state.topic.min.isr=1",
            "group.initial.rebalance.delay.ms=0",
            # A SIGKILLed node restarts as a new incarnation that the controller refuses
            # (DUPLICATE_BROKER_REGISTRATION) until the old one's lease ends: 9 s by
            # default, with every partition leaderless meanwhile. One node on loopback
            # heartbeats within milliseconds. Measured (falkirk bench broker): from the
            # kill to the broker's answer 11.8 s with the defaults, 3.7 s with these.
            "broker.session.timeout.ms=2000",
            "broker.heartbeat.interval.ms=500",
            # Records are kept until garbage collection says otherwise, whatever their
            # (event) timestamps: the default 7-day retention would delete old event times.
            "log.retention.ms=-1",
            "log.retention.bytes=-1",
            "num.partitions=1",
            "",
        ]))
        (self.data_dir / "log4j2.yaml").write_text(LOG4J2)
        return path

    def _format(self, properties: Path, classpath: str) -> None:
        """Format the storage once; the cluster id stays in the folder."""
        id_file = self.data_dir / CLUSTER_ID_NAME
        meta = self.data_dir / "logs" / "meta.properties"
        if id_file.exists():
            cluster_id = id_file.read_text().strip()
        elif meta.exists():
            raise BrokerError(f"{self.data_dir} holds Kafka storage of another broker (no "
                              f"{CLUSTER_ID_NAME} of ours): not formatting over it; use an "
                              "empty folder")
        else:
            cluster_id = _new_cluster_id()
            id_file.write_text(cluster_id)
        if meta.exists():
            found = dict(line.split("=", 1) for line in meta.read_text().splitlines()
                         if "=" in line and not line.startswith("#"))
            if found.get("cluster.id", cluster_id) != cluster_id:
                raise BrokerError(
                    f"{meta} belongs to cluster {found.get('cluster.id')}, not to "
                    f"{cluster_id} ({id_file}): the folder mixes two brokers' storage; "
                    "nothing was deleted")
            return
        cmd = ["java", "-cp", classpath, "kafka.tools.StorageTool", "format", "-t",
               cluster_id, "-c", str(properties), "--standalone"]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
        if done.returncode != 0:
            raise BrokerError(f"formatting the broker's storage in {self.data_dir} failed: "
                              f"{(done.stdout + done.stderr).strip()[-2000:]}")

    def _launch_and_wait(self) -> None:
        for port in (self.port, self.controller_port):
            if _listening(port):
                # Else the readiness check below could be answered by whoever holds the port.
                raise BrokerError(f"port {port} on 127.0.0.1 is already in use")
        classpath = kafka_classpath()
        properties = self._properties()
        self._format(properties, classpath)
        cmd = ["java", *JVM_OPTIONS,
               f"-Dlog4j2.configurationFile={self.data_dir / 'log4j2.yaml'}",
               "-cp", classpath, "kafka.Kafka", str(properties)]
        with open(self.log_path, "ab") as log:
            log.write(f"\n--- {time.strftime('%Y-%m-%d %H:%M:%S')} broker on "
                      f"{self.bootstrap}\n".encode())
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
                time.sleep(0.2)
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

    # -- stopping ------------------------------------------------------------------------

    def stop(self) -> None:
        """A controlled shutdown (SIGTERM: the broker flushes and closes its logs), then
        SIGKILL whatever of the process group is left."""
        if self._proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=STOP_TIMEOUT_S)
        self._kill_group()

    def kill(self) -> None:
        """SIGKILL the broker (a crash, for fault tests): acknowledged records are in the
        OS's page cache and survive a process crash."""
        if self._proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._proc.pid, signal.SIGKILL)
        self._kill_group()

    def restart(self, crash: bool = False) -> LocalBroker:
        """Stop (or with ``crash``, SIGKILL), then start on the same ports and folder:
        clients keep their bootstrap."""
        if crash:
            self.kill()
        else:
            self.stop()
        fixed = self._fixed_port
        self._fixed_port = True
        try:
            return self.start()
        finally:
            self._fixed_port = fixed

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

    # -- topics --------------------------------------------------------------------------

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



# ---- the embedded broker at the profile's address (`falkirk broker`) -------------------

PID_NAME = "broker.pgid"


def embedded(cfg) -> LocalBroker:
    """The embedded broker of a profile: on the port of its ``kafka_bootstrap`` (one
    loopback address), its data in ``broker_data_dir`` (``<var_dir>/broker``)."""
    host, _, port = cfg.kafka_bootstrap.partition(":")
    if "," in cfg.kafka_bootstrap or host not in ("127.0.0.1", "localhost") \
            or not port.isdigit():
        raise BrokerError(f"profile {cfg.env!r} names the broker(s) {cfg.kafka_bootstrap}: "
                          "not one embedded broker on this machine (FALKIRK_KAFKA_BOOTSTRAP "
                          "points falkirk at an existing cluster; falkirk broker starts "
                          "only a loopback one)")
    folder = Path(cfg.broker_data_dir or Path(cfg.var_dir) / "broker")
    return LocalBroker(folder, port=int(port))


def start_embedded(cfg) -> tuple[LocalBroker, bool]:
    """Start the profile's embedded broker in a session of its own, which outlives this
    process (its process group is kept in ``<data>/broker.pgid``); (broker, started now).
    One that answers already is left as it is."""
    broker = embedded(cfg)
    if _listening(broker.port):
        return broker, False
    broker.start()
    (broker.data_dir / PID_NAME).write_text(f"{broker._proc.pid}\n")
    return broker, True


def stop_embedded(cfg) -> bool:
    """Stop the embedded broker ``falkirk broker start`` started (SIGTERM: it flushes and
    closes its logs; SIGKILL after 30 s); whether one was running."""
    from falkirk.runtime.procs import stop_group

    broker = embedded(cfg)
    path = broker.data_dir / PID_NAME
    try:
        pgid = int(path.read_text())
    except (OSError, ValueError):
        return False
    running = bool(group_members(pgid))
    if running:
        stop_group(pgid, STOP_TIMEOUT_S)
    path.unlink(missing_ok=True)
    return running


def embedded_status(cfg) -> dict:
    """Where the embedded broker is and whether it answers."""
    broker = embedded(cfg)
    path = broker.data_dir / PID_NAME
    pgid = int(path.read_text()) if path.is_file() and path.read_text().strip() else None
    return {"bootstrap": broker.bootstrap, "answering": _listening(broker.port),
            "pgid": pgid if pgid is not None and group_members(pgid) else None,
            "data": str(broker.data_dir), "log": str(broker.log_path)}
