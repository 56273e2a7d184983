"""A cluster on this machine, as separate processes, the way it runs on many: ``bin/cluster``.

``up`` starts, on loopback, a Spark standalone master and 2 workers (from the installed
Spark: ``spark-class org.apache.spark.deploy.master.Master`` / ``…worker.Worker``; pip's
pyspark has no start scripts), 3 Apache Kafka nodes in KRaft mode (each broker and
controller, a quorum of 3 voters; topics get 3 replicas and ``min.insync.replicas=2``) and
S3Proxy, the S3-compatible object store that holds the lake (its filesystem backend keeps
the objects in the cluster folder; credentials generated at the first ``up`` into a file
only its owner reads, never in the repository).
Each component runs in its own process group, recorded in ``<var>/cluster/cluster.json``
with its address, so ``down`` (another process) ends every one of them and nothing else;
``status [--json]`` says which are up. ``FALKIRK_ENV=cluster`` points falkirk at them
(``falkirk.config``): jobs go to the master with the JVM jars shipped to the executors.

Ports are fixed (below; the ``cluster`` profile names them): a port in use, a component
that does not come up in time, or a stale folder stops ``up``, which then stops what it
started and names the component with the tail of its log. Not here yet (issue 18):
Airflow with Celery workers.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from falkirk.config import PROFILES
from falkirk.errors import FalkirkError
from falkirk.local.broker import _listening
from falkirk.runtime.procs import stop_group

SPARK_MASTER_PORT, SPARK_MASTER_UI = 27077, 28080
SPARK_WORKER_UIS = (28081, 28082)
KAFKA_PORTS = (29092, 29093, 29094)
KAFKA_CONTROLLER_PORTS = (29192, 29193, 29194)
# Sized for 2 cores and 24 GiB: each worker offers 3 executor slots (more than the cores:
# a pipeline's streaming jobs each hold one for good, the cluster profile caps an
# application at 1 core) and 3 GiB (768 MB per executor).
WORKER_CORES, WORKER_MEMORY = "3", "3g"
DAEMON_MEMORY = "256m"
KAFKA_JVM = ("-Xms64m", "-Xmx512m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")
START_TIMEOUT_S = 90.0
# The object store: where the cluster profile's storage options point, and its lake's bucket.
_PROFILE = PROFILES["cluster"]
OBJECTSTORE_URL = dict(_PROFILE.storage_options)["AWS_ENDPOINT_URL"]
OBJECTSTORE_PORT = int(OBJECTSTORE_URL.rsplit(":", 1)[1])
BUCKET = _PROFILE.lake.removeprefix("s3://").split("/", 1)[0]
OBJECTSTORE_JVM = ("-Xms32m", "-Xmx256m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")


class ClusterError(FalkirkError, RuntimeError):
    """A component of the local cluster did not start, or the cluster folder is stale."""


@dataclass
class Component:
    """One process of the cluster: how to start it and where it answers."""

    name: str
    kind: str  # spark-master, spark-worker, kafka, objectstore
    cmd: list[str]
    port: int  # where it answers (its health check connects here)
    address: str
    env: dict[str, str] = field(default_factory=dict)
    pgid: int | None = None
    started_at: float | None = None

    def state(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k not in ("cmd", "env")}


def folder() -> Path:
    from falkirk.config import load

    return Path(load().var_dir) / "cluster"


def _spark_class() -> str:
    import pyspark

    return str(Path(pyspark.__file__).parent / "bin" / "spark-class")


def spark_components(root: Path) -> list[Component]:
    env = {"SPARK_LOCAL_IP": "127.0.0.1", "SPARK_DAEMON_MEMORY": DAEMON_MEMORY,
           "PYSPARK_PYTHON": sys.executable, "SPARK_LOG_DIR": str(root / "spark"),
           "SPARK_WORKER_DIR": str(root / "spark" / "work")}
    master = f"spark://127.0.0.1:{SPARK_MASTER_PORT}"
    out = [Component("spark-master", "spark-master",
                     [_spark_class(), "org.apache.spark.deploy.master.Master", "--host",
                      "127.0.0.1", "--port", str(SPARK_MASTER_PORT), "--webui-port",
                      str(SPARK_MASTER_UI)], SPARK_MASTER_PORT, master, env)]
    for i, ui in enumerate(SPARK_WORKER_UIS, start=1):
        out.append(Component(
            f"spark-worker-{i}", "spark-worker",
            [_spark_class(), "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
             "--cores", WORKER_CORES, "--memory", WORKER_MEMORY, "--webui-port", str(ui),
             "--work-dir", str(root / "spark" / f"work-{i}"), master],
            ui, f"http://127.0.0.1:{ui}", env))
    return out


def kafka_properties(node: int, data: Path) -> str:
    """server.properties of node ``node`` (1..3) of the 3-node KRaft quorum."""
    voters = ",".join(f"{i}@127.0.0.1:{p}" for i, p in enumerate(KAFKA_CONTROLLER_PORTS, 1))
    port, cport = KAFKA_PORTS[node - 1], KAFKA_CONTROLLER_PORTS[node - 1]
    return "\n".join([
        "process.roles=broker,controller", f"node.id={node}",
        f"controller.quorum.voters={voters}",
        f"listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{cport}",
        f"advertised.listeners=PLAINTEXT://127.0.0.1:{port}",
        "controller.listener.names=CONTROLLER",
        "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        f"log.dirs={data / 'logs'}",
        # Replicated: a lost broker loses no acknowledged record (acks=all, 2 in sync).
        "default.replication.factor=3", "min.insync.replicas=2",
        "offsets.topic.replication.factor=3", "transaction.state.log.replication.factor=3",
        "transaction.state.log.min.isr=2", "share.coordinator.state.topic.replication.factor=3",
        "share.coordinator.state.topic.min.isr=2", "unclean.leader.election.enable=false",
        "group.initial.rebalance.delay.ms=0", "log.retention.ms=-1", "log.retention.bytes=-1",
        "num.partitions=1", ""])


def kafka_components(root: Path) -> list[Component]:
    from falkirk.io.jars import kafka_classpath
    from falkirk.local.broker import LOG4J2, _new_cluster_id

    classpath = kafka_classpath()
    id_file = root / "kafka" / "cluster.id"
    id_file.parent.mkdir(parents=True, exist_ok=True)
    if not id_file.exists():
        id_file.write_text(_new_cluster_id())
    cluster_id = id_file.read_text().strip()
    out = []
    for node in (1, 2, 3):
        data = root / "kafka" / f"node-{node}"
        data.mkdir(parents=True, exist_ok=True)
        props = data / "server.properties"
        props.write_text(kafka_properties(node, data))
        (data / "log4j2.yaml").write_text(LOG4J2)
        meta = data / "logs" / "meta.properties"
        if meta.exists():  # formatted before: by this cluster, or it is a stale folder
            found = dict(line.split("=", 1) for line in meta.read_text().splitlines()
                         if "=" in line and not line.startswith("#"))
            if found.get("cluster.id") != cluster_id:
                raise ClusterError(
                    f"kafka-{node}: {data} holds the storage of another Kafka cluster "
                    f"({found.get('cluster.id')}, not {cluster_id} of {id_file}): a stale "
                    f"cluster folder; nothing was started or deleted (remove {root} to "
                    "start afresh)")
        else:
            done = subprocess.run(["java", "-cp", classpath, "kafka.tools.StorageTool",
                                   "format", "-t", cluster_id, "-c", str(props)],
                                  capture_output=True, text=True, timeout=120, check=False)
            if done.returncode != 0:
                raise ClusterError(f"kafka-{node}: formatting {data} failed: "
                                   f"{(done.stdout + done.stderr).strip()[-1500:]}")
        port = KAFKA_PORTS[node - 1]
        out.append(Component(
            f"kafka-{node}", "kafka",
            ["java", *KAFKA_JVM, f"-Dlog4j2.configurationFile={data / 'log4j2.yaml'}", "-cp",
             classpath, "kafka.Kafka", str(props)], port, f"127.0.0.1:{port}"))
    return out


def credentials_file(root: Path) -> Path:
    """Where ``up`` keeps the object store's credentials (the cluster profile reads them
    from there when the environment has none): ``<var_dir>/cluster/objectstore/…``."""
    return root.parent / _PROFILE.object_store_credentials


def objectstore_credentials(root: Path) -> dict[str, str]:
    """The object store's key pair: generated at the first ``up``, owner-only, then kept."""
    path = credentials_file(root)
    if path.exists():
        return json.loads(path.read_text())
    path.parent.mkdir(parents=True, exist_ok=True)
    creds = {"AWS_ACCESS_KEY_ID": f"falkirk-{secrets.token_hex(4)}",
             "AWS_SECRET_ACCESS_KEY": secrets.token_urlsafe(30)}
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(creds, out)
    return creds


def objectstore_component(root: Path) -> Component:
    """S3Proxy on the filesystem backend: objects are files under the cluster folder, so a
    restarted store serves every object written before (S3Proxy honours If-None-Match,
    which the lake's Delta commits rely on: config, AWS_CONDITIONAL_PUT)."""
    from falkirk.io.jars import objectstore_jar

    store = root / "objectstore"
    (store / "data").mkdir(parents=True, exist_ok=True)
    creds = objectstore_credentials(root)
    conf = store / "s3proxy.conf"
    fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write("\n".join([
            f"s3proxy.endpoint={OBJECTSTORE_URL}", "s3proxy.authorization=aws-v2-or-v4",
            f"s3proxy.identity={creds['AWS_ACCESS_KEY_ID']}",
            f"s3proxy.credential={creds['AWS_SECRET_ACCESS_KEY']}",
            # "filesystem", not "filesystem-nio2": nio2 stores s3a's directory markers
            # ("…/_delta_log/_staged_commits/") as files, and delta-spark's first commit
            # then fails with "Path is a file".
            "jclouds.provider=filesystem", f"jclouds.filesystem.basedir={store / 'data'}",
            ""]))
    return Component("objectstore", "objectstore",
                     ["java", *OBJECTSTORE_JVM, "-jar", objectstore_jar(), "--properties",
                      str(conf)], OBJECTSTORE_PORT, OBJECTSTORE_URL)


def _ensure_bucket(root: Path, deadline: float) -> None:
    """The lake's bucket exists (created at the first ``up``; kept by a restart)."""
    import pyarrow.fs as pafs

    creds = objectstore_credentials(root)
    fs = pafs.S3FileSystem(access_key=creds["AWS_ACCESS_KEY_ID"],
                           secret_key=creds["AWS_SECRET_ACCESS_KEY"],
                           endpoint_override=OBJECTSTORE_URL, scheme="http",
                           region=dict(_PROFILE.storage_options)["AWS_REGION"],
                           allow_bucket_creation=True)
    while True:
        try:
            fs.create_dir(BUCKET)
            return
        except OSError as exc:
            if time.monotonic() > deadline:
                raise ClusterError(f"objectstore: bucket {BUCKET!r} could not be created at "
                                   f"{OBJECTSTORE_URL}: {exc}") from exc
            time.sleep(0.5)


def components(root: Path) -> list[Component]:
    return [*spark_components(root), *kafka_components(root), objectstore_component(root)]


def _log(root: Path, c: Component) -> Path:
    return root / "logs" / f"{c.name}.log"


def _tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _alive(pgid: int | None) -> bool:
    from falkirk.runtime.procs import group_members

    return pgid is not None and bool(group_members(pgid))


def _save(root: Path, comps: list[Component]) -> None:
    (root / "cluster.json").write_text(json.dumps([c.state() for c in comps], indent=1))


def recorded(root: Path | None = None) -> list[dict]:
    path = (root or folder()) / "cluster.json"
    return json.loads(path.read_text()) if path.exists() else []


def up(root: Path | None = None, console=None) -> list[dict]:
    """Start every component and wait until each answers; on any failure stop what
    started and raise naming the component, with the tail of its log."""
    root = root or folder()
    running = [c for c in recorded(root) if _alive(c["pgid"])]
    if running:
        raise ClusterError(f"a cluster is already up here ({', '.join(c['name'] for c in running)}"
                           f"; {root}): `bin/cluster down` first")
    (root / "logs").mkdir(parents=True, exist_ok=True)
    comps = components(root)
    for c in comps:
        ports = [c.port] + ([KAFKA_CONTROLLER_PORTS[KAFKA_PORTS.index(c.port)]]
                            if c.kind == "kafka" else [])
        busy = [p for p in ports if _listening(p)]
        if busy:
            raise ClusterError(f"{c.name}: port {busy[0]} on 127.0.0.1 is already in use "
                               "(another cluster, or another program): nothing was started")
    started: list[Component] = []
    try:
        for c in comps:
            _start(root, c)
            started.append(c)
            _save(root, started)
            if console is not None:
                console.print(f"started {c.name} (process group {c.pgid})")
        deadline = time.monotonic() + START_TIMEOUT_S
        for c in started:
            _wait_for_port(root, c, deadline)
        _wait_for_workers(deadline)
        _wait_for_brokers(deadline)
        _ensure_bucket(root, deadline)
    except BaseException:
        for c in reversed(started):
            stop_group(c.pgid, timeout_s=20.0)
        (root / "cluster.json").unlink(missing_ok=True)
        raise
    return status(root)


def _start(root: Path, c: Component) -> None:
    """Start one component in its own process group, its output appended to its log."""
    with open(_log(root, c), "ab") as log:
        log.write(f"\n--- {time.strftime('%F %T')} {c.name}: {' '.join(c.cmd)}\n".encode())
        log.flush()
        proc = subprocess.Popen(c.cmd, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, **c.env})
    c.pgid, c.started_at = proc.pid, time.time()


def _wait_for_port(root: Path, c: Component, deadline: float) -> None:
    while not _listening(c.port):
        if not _alive(c.pgid):
            raise ClusterError(f"{c.name} exited while starting; last lines of "
                               f"{_log(root, c)}:\n{_tail(_log(root, c))}")
        if time.monotonic() > deadline:
            raise ClusterError(f"{c.name} did not answer on port {c.port} within "
                               f"{START_TIMEOUT_S:.0f} s; last lines of "
                               f"{_log(root, c)}:\n{_tail(_log(root, c))}")
        time.sleep(0.3)


def start(name: str, root: Path | None = None) -> None:
    """Start a stopped component again (after ``kill``), as an operator's restart would:
    on the same port, with the data it kept."""
    root = root or folder()
    recs = recorded(root)
    [rec] = [r for r in recs if r["name"] == name] or [None]
    if rec is None:
        raise ClusterError(f"no component {name!r} in the cluster")
    if _alive(rec["pgid"]):
        raise ClusterError(f"{name} is running (process group {rec['pgid']}): kill it first")
    [c] = [c for c in components(root) if c.name == name]
    deadline = time.monotonic() + START_TIMEOUT_S
    _start(root, c)
    (root / "cluster.json").write_text(json.dumps(
        [c.state() if r["name"] == name else r for r in recs], indent=1))
    _wait_for_port(root, c, deadline)


def _wait_for_workers(deadline: float) -> None:
    """The master lists both workers as ALIVE (its JSON page)."""
    import urllib.request

    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{SPARK_MASTER_UI}/json/",
                                        timeout=3) as r:
                alive = [w for w in json.load(r).get("workers", []) if w["state"] == "ALIVE"]
            if len(alive) >= len(SPARK_WORKER_UIS):
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise ClusterError("spark-master: its workers did not register in time")
        time.sleep(0.5)


def _wait_for_brokers(deadline: float) -> None:
    """The quorum answers metadata with all 3 brokers."""
    from kafka import KafkaAdminClient

    while True:
        try:
            admin = KafkaAdminClient(bootstrap_servers=bootstrap(), request_timeout_ms=3000,
                                     client_id="falkirk-cluster")
            try:
                if len(admin.describe_cluster()["brokers"]) == len(KAFKA_PORTS):
                    return
            finally:
                admin.close()
        except Exception:  # not answering yet
            pass
        if time.monotonic() > deadline:
            raise ClusterError("kafka: the 3 brokers did not form a cluster in time")
        time.sleep(0.5)


def bootstrap() -> str:
    return ",".join(f"127.0.0.1:{p}" for p in KAFKA_PORTS)


class ClusterKafka:
    """The cluster's Kafka as a sandbox's broker (``LocalRun(broker=...)``): started and
    stopped by ``bin/cluster``, not by the run. A run owns its pipeline's topics: ``start``
    deletes those an earlier run left, so every run begins on empty ones."""

    def __init__(self, pipeline: str, servers: str | None = None):
        from falkirk.model.topology import load_pipeline

        self.bootstrap = servers or bootstrap()
        self.topics = sorted({e.topic for e in load_pipeline(pipeline).edges.values()
                              if e.kind == "kafka"})

    def start(self) -> ClusterKafka:
        from kafka import KafkaAdminClient

        admin = KafkaAdminClient(bootstrap_servers=self.bootstrap, client_id="falkirk-demo")
        try:
            old = sorted(set(self.topics) & set(admin.list_topics()))
            if old:
                admin.delete_topics(old)
            deadline = time.monotonic() + 60
            while set(old) & set(admin.list_topics()):  # deletion is asynchronous
                if time.monotonic() > deadline:
                    raise ClusterError(f"kafka: topics {old} not deleted within 60 s")
                time.sleep(0.5)
        finally:
            admin.close()
        return self

    def stop(self) -> None:
        """Nothing: the cluster outlives the run."""


def engines(servers: str | None = None) -> str:
    """What a run on the cluster ran on, for reports: each component's address and health."""
    comps = status()
    if not comps:
        raise ClusterError("no local cluster is up: run bin/cluster up first")
    sick = [c["name"] for c in comps if not c["healthy"]]
    if sick:
        raise ClusterError(f"the local cluster is not healthy: {', '.join(sick)} down "
                           "(bin/cluster status)")
    by_kind: dict[str, list[str]] = {}
    for c in comps:
        by_kind.setdefault(c["kind"], []).append(c["address"])
    return "; ".join(f"{kind} × {len(addrs)} ({', '.join(addrs)})"
                     for kind, addrs in by_kind.items())


def status(root: Path | None = None) -> list[dict]:
    """Each recorded component: name, kind, address, process group, and health (its
    process group lives and its port answers)."""
    out = []
    for c in recorded(root):
        alive = _alive(c["pgid"])
        out.append({**c, "alive": alive, "healthy": alive and _listening(c["port"])})
    return out


def down(root: Path | None = None) -> list[str]:
    """Stop every recorded component (its whole process group); the names stopped."""
    root = root or folder()
    comps = recorded(root)
    for c in reversed(comps):
        if c["pgid"] is not None:
            stop_group(c["pgid"], timeout_s=20.0)
    (root / "cluster.json").unlink(missing_ok=True)
    return [c["name"] for c in comps]


def kill(name: str, root: Path | None = None) -> None:
    """SIGKILL one component's process group (a fault, for tests); returns once it is gone."""
    for c in recorded(root):
        if c["name"] == name:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(c["pgid"], signal.SIGKILL)
            deadline = time.monotonic() + 20
            while _alive(c["pgid"]) and time.monotonic() < deadline:
                time.sleep(0.1)
            return
    raise ClusterError(f"no component {name!r} in the cluster")


def main(args) -> int:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if args.action == "up":
        comps = up(console=console)
    elif args.action == "down":
        console.print(f"stopped: {', '.join(down()) or 'nothing was up'}")
        return 0
    else:
        comps = status()
    if getattr(args, "json", False):
        print(json.dumps({"folder": str(folder()), "components": comps}, indent=1))
    else:
        table = Table(title=f"local cluster ({folder()})", title_justify="left")
        for col in ("component", "address", "process group", "health"):
            table.add_column(col)
        for c in comps:
            table.add_row(c["name"], c["address"], str(c["pgid"]),
                          "[green]up[/green]" if c["healthy"] else "[red]down[/red]")
        console.print(table if comps else "no cluster is up")
    return 0 if all(c["healthy"] for c in comps) else 1
