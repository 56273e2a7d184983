"""A cluster on this machine, as separate processes, the way it runs on many: ``bin/cluster``.

``up`` starts, on loopback, a Spark standalone master and 2 workers (from the installed
Spark: ``spark-class org.apache.spark.deploy.master.Master`` / ``…worker.Worker``; pip's
pyspark has no start scripts), 3 Apache Kafka nodes in KRaft mode (each broker and
controller, a quorum of 3 voters; topics get 3 replicas and ``min.insync.replicas=2``) and
S3Proxy, the S3-compatible object store that holds the lake (its filesystem backend keeps
the objects in the cluster folder; credentials generated at the first ``up`` into a file
only its owner reads, never in the repository), PostgreSQL and Redis.
Each component runs in its own process group, recorded in ``<var>/cluster/cluster.json``
with its address, so ``down`` (another process) ends every one of them and nothing else;
``status [--json]`` says which are up. ``FALKIRK_ENV=cluster`` points falkirk at them
(``falkirk.config``): jobs go to the master with the JVM jars shipped to the executors.

Ports are fixed (below; the ``cluster`` profile names them): a port in use, a component
that does not come up in time, or a stale folder stops ``up``, which then stops what it
started and names the component with the tail of its log.

Airflow runs on it with ``bin/airflow`` under ``FALKIRK_ENV=cluster``: its metadata in the
cluster's PostgreSQL (Debian's server, one database per Airflow home), the CeleryExecutor
with Redis (Debian's ``redis-server``) as broker and 2 Celery workers, each in its own
process group so a test can lose one (``airflow_settings``).
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
from collections.abc import Callable
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
# Airflow's metadata database and Celery broker (Debian's postgresql and redis-server).
POSTGRES_PORT, REDIS_PORT = 29432, 29379
OBJECTSTORE_JVM = ("-Xms32m", "-Xmx256m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")

# What the cluster runs with, here and in docker-compose.yml (tools/falkirk_dev/compose.py
# generates that file from these; tests/test_compose.py checks it): one description, so
# the two cannot drift.
#: Every Kafka node's settings beside its addresses: replicated, so a lost broker loses no
#: acknowledged record (acks=all, 2 in sync). Topics nobody creates (the serve job's
#: responses) are auto-created with the 3 partitions the pipeline declares for them.
KAFKA_SETTINGS = {
    "default.replication.factor": "3", "min.insync.replicas": "2",
    "offsets.topic.replication.factor": "3", "transaction.state.log.replication.factor": "3",
    "transaction.state.log.min.isr": "2", "share.coordinator.state.topic.replication.factor": "3",
    "share.coordinator.state.topic.min.isr": "2", "unclean.leader.election.enable": "false",
    "group.initial.rebalance.delay.ms": "0", "log.retention.ms": "-1",
    "log.retention.bytes": "-1", "auto.create.topics.enable": "true", "num.partitions": "3",
}
#: S3Proxy on its filesystem backend ("filesystem", not "filesystem-nio2": nio2 stores
#: s3a's directory markers ("…/_delta_log/_staged_commits/") as files, and delta-spark's
#: first commit then fails with "Path is a file").
#: Unknown headers ignored: S3Proxy 3.0.0 answers 501 NotImplemented to the flexible
#: checksum every current client puts on a bulk delete (DeleteObjects): the AWS SDK 2.35
#: of hadoop-aws 3.5 sends x-amz-checksum-crc32 whatever s3a's checksum options say, and
#: delta-rs x-amz-checksum-sha256. Spark's Parquet commit deletes its _temporary folder so
#: (s3a: AWSUnsupportedFeatureException "Remove S3 Dir Markers"), and delta-rs's deletes
#: failed after their retries. Real S3 accepts both headers; the store just ignores them.
#: That delete still costs ~10 s a write here (20 s with a folder per epoch): s3a deletes
#: _temporary/0/ before what is in it, and the filesystem backend retries deleting a
#: folder that is not empty for 10 s (jclouds' Utils.delete).
OBJECTSTORE_SETTINGS = {"s3proxy.authorization": "aws-v2-or-v4", "jclouds.provider": "filesystem",
                        "s3proxy.ignore-unknown-headers": "true"}
#: Airflow's scheduler, API server, dag processor and Celery workers each pool
#: connections; the default 100 is tight for two Airflows on one database server.
POSTGRES_SETTINGS = {"max_connections": "300"}
#: Queued Celery messages survive a restart of Redis.
REDIS_SETTINGS = {"appendonly": "yes", "save": '""'}
#: The Debian (bookworm) server versions bin/setup installs; compose runs the same.
POSTGRES_MAJOR, REDIS_VERSION = "15", "7.0"
#: Celery workers of the cluster's Airflow (bin/airflow's FALKIRK_CELERY_WORKERS default),
#: the task slots of each, and how long a worker may be silent before its task is failed
#: and retried (a lost worker).
CELERY_WORKERS, CELERY_CONCURRENCY, TASK_HEARTBEAT_TIMEOUT_S = 2, 2, 90
#: A scheduler silent this long counts as dead, and its orphaned tasks are looked for this
#: often: bin/airflow's values (its comment says why), for compose's one scheduler too.
SCHEDULER_HEALTH_CHECK_S, ORPHANED_TASKS_CHECK_S = 12, 5


class ClusterError(FalkirkError, RuntimeError):
    """A component of the local cluster did not start, or the cluster folder is stale."""


@dataclass
class Component:
    """One process of the cluster: how to start it and where it answers."""

    name: str
    kind: str  # spark-master, spark-worker, kafka, objectstore, postgres, redis
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
        *(f"{k}={v}" for k, v in KAFKA_SETTINGS.items()), ""])


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


def _generated(path: Path, make) -> dict[str, str]:
    """Secrets generated once into ``path`` (owner-only), then kept: never in the repo."""
    if path.exists():
        return json.loads(path.read_text())
    path.parent.mkdir(parents=True, exist_ok=True)
    values = make()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(values, out)
    return values


def objectstore_credentials(root: Path) -> dict[str, str]:
    """The object store's key pair: generated at the first ``up``, owner-only, then kept."""
    return _generated(credentials_file(root), lambda: {
        "AWS_ACCESS_KEY_ID": f"falkirk-{secrets.token_hex(4)}",
        "AWS_SECRET_ACCESS_KEY": secrets.token_urlsafe(30)})


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
            f"s3proxy.endpoint={OBJECTSTORE_URL}",
            f"s3proxy.identity={creds['AWS_ACCESS_KEY_ID']}",
            f"s3proxy.credential={creds['AWS_SECRET_ACCESS_KEY']}",
            *(f"{k}={v}" for k, v in OBJECTSTORE_SETTINGS.items()),
            f"jclouds.filesystem.basedir={store / 'data'}", ""]))
    return Component("objectstore", "objectstore",
                     ["java", *OBJECTSTORE_JVM, "-jar", objectstore_jar(), "--properties",
                      str(conf)], OBJECTSTORE_PORT, OBJECTSTORE_URL)


def ensure_bucket(cfg, credentials: dict[str, str], deadline: float) -> None:
    """The bucket of ``cfg``'s lake exists on its object store (created once; kept by a
    restart); waits for the store to answer until ``deadline`` (``time.monotonic``)."""
    import pyarrow.fs as pafs

    endpoint = dict(cfg.storage_options)["AWS_ENDPOINT_URL"]
    bucket = cfg.lake.removeprefix("s3://").split("/", 1)[0]
    fs = pafs.S3FileSystem(access_key=credentials["AWS_ACCESS_KEY_ID"],
                           secret_key=credentials["AWS_SECRET_ACCESS_KEY"],
                           endpoint_override=endpoint, scheme=endpoint.split(":", 1)[0],
                           region=dict(cfg.storage_options)["AWS_REGION"],
                           allow_bucket_creation=True)
    while True:
        try:
            fs.create_dir(bucket)
            return
        except OSError as exc:
            if time.monotonic() > deadline:
                raise ClusterError(f"objectstore: bucket {bucket!r} could not be created at "
                                   f"{endpoint}: {exc}") from exc
            time.sleep(0.5)


def airflow_credentials(root: Path) -> dict[str, str]:
    """The Airflow metadata database's and the Celery broker's passwords (generated)."""
    return _generated(root / "airflow" / "credentials.json", lambda: {
        "postgres_user": "falkirk", "postgres_password": secrets.token_urlsafe(24),
        "redis_password": secrets.token_urlsafe(24)})


def _postgres_bin() -> Path:
    """Debian's PostgreSQL server programs (``postgresql``: /usr/lib/postgresql/<v>/bin)."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"),
                   key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit()
                   else 0)
    if not found:
        raise ClusterError("postgres: Debian's postgresql package is not installed "
                           "(bin/setup installs it)")
    return found[-1].parent


def _as_postgres_owner(cmd: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root: as root, run it as Debian's ``postgres`` user."""
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


def _owned_by_postgres(*paths: Path) -> None:
    if os.geteuid() == 0:
        import shutil

        for path in paths:
            shutil.chown(path, "postgres", "postgres")


def postgres_component(root: Path) -> Component:
    """PostgreSQL for Airflow's metadata (and Celery's results): a cluster of its own under
    the cluster folder, initialised at the first ``up`` with a generated password,
    password logins only, listening on loopback."""
    pg = root / "postgres"
    data, sockets = pg / "data", pg / "run"
    creds = airflow_credentials(root)
    if not (data / "PG_VERSION").exists():
        import shutil
        import tempfile

        shutil.rmtree(data, ignore_errors=True)
        for d in (pg, data, sockets):
            d.mkdir(parents=True, exist_ok=True)
        _owned_by_postgres(pg, data, sockets)
        if os.geteuid() == 0 and subprocess.run(
                _as_postgres_owner(["test", "-w", str(data)]), timeout=30).returncode != 0:
            raise ClusterError(
                f"postgres: Debian's postgres user cannot reach {data} (PostgreSQL refuses "
                "to run as root, so it runs as that user, which needs search permission on "
                "every folder above it): chmod o+x them, or set FALKIRK_VAR_DIR elsewhere")
        with tempfile.NamedTemporaryFile("w", dir=pg, delete=False) as pw:
            pw.write(creds["postgres_password"] + "\n")
        _owned_by_postgres(Path(pw.name))
        try:
            done = subprocess.run(_as_postgres_owner(
                [str(_postgres_bin() / "initdb"), "-D", str(data), "-U",
                 creds["postgres_user"], "--auth=scram-sha-256", f"--pwfile={pw.name}",
                 "-E", "UTF8", "--no-instructions"]), capture_output=True, text=True,
                timeout=120)
        finally:
            Path(pw.name).unlink(missing_ok=True)
        if done.returncode != 0:
            raise ClusterError(f"postgres: initdb failed ({done.returncode}): "
                               f"{(done.stderr or done.stdout)[-1500:]}")
    return Component("postgres", "postgres", _as_postgres_owner(
        [str(_postgres_bin() / "postgres"), "-D", str(data), "-p", str(POSTGRES_PORT),
         "-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={sockets}",
         *(a for k, v in POSTGRES_SETTINGS.items() for a in ("-c", f"{k}={v}"))]),
        POSTGRES_PORT, f"postgresql://127.0.0.1:{POSTGRES_PORT}")


def redis_component(root: Path) -> Component:
    """Redis as the Celery broker: password from the generated file, in a config file
    only its owner reads (a command-line password shows in ``ps``)."""
    folder_ = root / "redis"
    folder_.mkdir(parents=True, exist_ok=True)
    conf = folder_ / "redis.conf"
    fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write("\n".join([
            "bind 127.0.0.1", f"port {REDIS_PORT}", f"dir {folder_}",
            f"requirepass {airflow_credentials(root)['redis_password']}",
            *(f"{k} {v}" for k, v in REDIS_SETTINGS.items()), ""]))
    return Component("redis", "redis", ["redis-server", str(conf)], REDIS_PORT,
                     f"redis://127.0.0.1:{REDIS_PORT}")


#: Each family of components (a name's first word) and what builds its descriptors.
FAMILIES: dict[str, Callable[[Path], list[Component]]] = {
    "spark": spark_components, "kafka": kafka_components,
    "objectstore": lambda root: [objectstore_component(root)],
    "postgres": lambda root: [postgres_component(root)],
    "redis": lambda root: [redis_component(root)],
}


def components(root: Path) -> list[Component]:
    return [c for build in FAMILIES.values() for c in build(root)]


def component(root: Path, name: str) -> Component:
    """One component's descriptor, building only its family's (a restart of one must not
    write the settings of all the others again)."""
    build = FAMILIES.get(name.split("-")[0])
    found = [c for c in build(root) if c.name == name] if build else []
    if not found:
        raise ClusterError(f"no component {name!r} in the cluster")
    return found[0]


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
        ensure_bucket(_PROFILE, objectstore_credentials(root), deadline)
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
    c = component(root, name)
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
        except (OSError, ValueError):  # not up yet, or a page still empty (bin/test saw it)
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


def airflow_settings(home: Path, root: Path | None = None) -> dict[str, str]:
    """Airflow's settings for the CeleryExecutor on this cluster (``bin/airflow`` under
    ``FALKIRK_ENV=cluster``): each Airflow home gets its own database in the cluster's
    PostgreSQL (created empty for a home that has none yet) and its own Celery queue in
    Redis, so two Airflows on one cluster never take each other's tasks."""
    import hashlib

    import psycopg2

    root = root or folder()
    if not any(c["name"] == "postgres" and c["healthy"] for c in status(root)):
        raise ClusterError("postgres of the local cluster is not up: run bin/cluster up first")
    creds = airflow_credentials(root)
    name = "airflow_" + hashlib.sha1(str(home.resolve()).encode()).hexdigest()[:12]
    marker = home / "cluster-database"
    conn = psycopg2.connect(host="127.0.0.1", port=POSTGRES_PORT, dbname="postgres",
                            user=creds["postgres_user"], password=creds["postgres_password"])
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            if not marker.exists() or marker.read_text().strip() != name:
                cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
            if cur.fetchone() is None:
                cur.execute(f'CREATE DATABASE "{name}"')
    finally:
        conn.close()
    home.mkdir(parents=True, exist_ok=True)
    marker.write_text(name + "\n")
    user, pw = creds["postgres_user"], creds["postgres_password"]
    db = f"postgresql+psycopg2://{user}:{pw}@127.0.0.1:{POSTGRES_PORT}/{name}"
    return {
        "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": db,
        "AIRFLOW__CELERY__BROKER_URL": f"redis://:{creds['redis_password']}@127.0.0.1:"
                                       f"{REDIS_PORT}/0",
        "AIRFLOW__CELERY__RESULT_BACKEND": "db+" + db.replace("+psycopg2", ""),
        "AIRFLOW__OPERATORS__DEFAULT_QUEUE": name,
    }


def status(root: Path | None = None) -> list[dict]:
    """Each recorded component: name, kind, address, process group, health (its process
    group lives and its port answers) and resident memory."""
    out = []
    for c in recorded(root):
        alive = _alive(c["pgid"])
        out.append({**c, "alive": alive, "healthy": alive and _listening(c["port"]),
                    "rss_mb": _rss_mb(c["pgid"]) if alive else 0})
    return out


def _rss_mb(pgid: int) -> int:
    """Resident memory of a component: the sum over its process group, in MB."""
    import psutil

    from falkirk.runtime.procs import group_members

    total = 0
    for pid in group_members(pgid):
        with contextlib.suppress(psutil.Error):
            total += psutil.Process(pid).memory_info().rss
    return total // 2**20


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

    if args.action == "airflow-env":
        import shlex

        if not args.home:
            raise ClusterError("airflow-env needs --home (the Airflow home)")
        for key, value in airflow_settings(Path(args.home)).items():
            print(f"export {key}={shlex.quote(value)}")
        return 0
    console = Console()
    if args.action == "compose":
        from falkirk_dev.compose import write

        console.print(f"wrote {write()} (the cluster's topology and settings, in containers)")
        return 0
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
        for col in ("component", "address", "process group", "health", "memory"):
            table.add_column(col, justify="right" if col == "memory" else "left")
        for c in comps:
            table.add_row(c["name"], c["address"], str(c["pgid"]),
                          "[green]up[/green]" if c["healthy"] else "[red]down[/red]",
                          f"{c.get('rss_mb', 0):,} MB")
        console.print(table if comps else "no cluster is up")
    return 0 if all(c["healthy"] for c in comps) else 1
