"""The local cluster (``bin/cluster``): Spark standalone, a 3-broker Kafka cluster, an
S3-compatible object store, PostgreSQL and Redis, each component its own process; a lost
broker loses no acknowledged record, executors on the workers read the topics with the
shipped connector jars, a lost worker's tasks run again on the other, epochs committed to
Delta tables in the object store survive its restart (a commit made while it was down
completes once it is back), two delta-rs writers of one version cannot both win, and
``down`` leaves nothing. A user's batch epoch run by Airflow with Celery on the cluster
is retried on the other worker when its Celery worker is lost, and committed once; the
reference pipeline rides out a lost broker, Spark worker and object store with the
failure-free outputs (``bin/test --full``)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
from reference_runs import EPOCHS, INPUT, assert_same

from falkirk.config import REPO_ROOT
from falkirk.runtime.procs import group_members, session_members, session_of
from falkirk_dev import cluster
from falkirk_dev.harness import LocalRun

pytestmark = [pytest.mark.slow, pytest.mark.system]

CLUSTER = str(REPO_ROOT / "bin" / "cluster")

# Runs with FALKIRK_ENV=cluster in its own interpreter (a fresh driver JVM on the master).
CLIENT = textwrap.dedent("""
    import json, sys, time
    from kafka import KafkaAdminClient, KafkaProducer
    from falkirk.config import load
    from falkirk.io.kafka import end_offsets, ensure_topics, read_range
    from falkirk.runtime.launcher import session
    from falkirk.model.times import Offsets
    from falkirk_dev import cluster

    cfg = load()
    ensure_topics(cfg.kafka_bootstrap, {"orders": 3})
    admin = KafkaAdminClient(bootstrap_servers=cfg.kafka_bootstrap)
    deadline = time.monotonic() + 60  # the answering broker may not know the new topic yet
    parts = admin.describe_topics(["orders"])[0]["partitions"]
    while len(parts) < 3 and time.monotonic() < deadline:
        time.sleep(0.2)
        parts = admin.describe_topics(["orders"])[0]["partitions"]
    admin.close()
    producer = KafkaProducer(bootstrap_servers=cfg.kafka_bootstrap, acks="all",
                             enable_idempotence=True)
    for i in range(500):
        producer.send("orders", key=str(i).encode(), value=json.dumps({"i": i}).encode())
    producer.flush()
    cluster.kill("kafka-2")  # a broker is lost: the others hold every acknowledged record
    for i in range(500, 1000):
        producer.send("orders", key=str(i).encode(),
                      value=json.dumps({"i": i}).encode()).get(timeout=60)
    producer.close()
    spark = session("falkirk-cluster-test")
    end = Offsets(end_offsets(cfg.kafka_bootstrap, "orders"))
    df = read_range(spark, cfg.kafka_bootstrap, "orders",
                    Offsets({p: 0 for p in end.as_dict()}), end, "i long")
    status = spark.sparkContext.statusTracker()
    out = {"master": spark.sparkContext.master,
           "replicas": sorted(len(p["replica_nodes"]) for p in parts),
           "rows": df.count(), "distinct": df.select("i").distinct().count(),
           "executors": len(status.getExecutorInfos()) - 1}  # minus the driver

    # A worker is lost while its executor runs tasks: Spark runs them again elsewhere; a
    # frame whose lineage was cut before (state, in a job) is still readable after it.
    import threading, time, urllib.request
    from falkirk.io.spark import cut_lineage
    cut = cut_lineage(spark.range(100).selectExpr("id * 2 as v"))
    out["checkpoint_dir"] = spark.sparkContext.getCheckpointDir().startswith(
        "file:" + cfg.spark_checkpoint_dir)
    done = {}
    slow = spark.sparkContext.parallelize(range(8), 8).map(lambda x: (time.sleep(3), x)[1])
    job = threading.Thread(target=lambda: done.update(sum=slow.sum()))
    job.start()
    while not any(status.getStageInfo(s).numActiveTasks for s in status.getActiveStageIds()):
        time.sleep(0.2)  # until a task runs on the executor
    with urllib.request.urlopen("http://127.0.0.1:28080/json/") as r:
        busy = next(w["webuiaddress"] for w in json.load(r)["workers"]
                    if w["state"] == "ALIVE" and w["coresused"] > 0)
    out["killed"] = {c["address"]: c["name"] for c in cluster.status()}[busy]
    cluster.kill(out["killed"])
    job.join(timeout=400)
    out["sum_after_the_loss"] = done.get("sum")
    out["cut_after_the_loss"] = cut.selectExpr("sum(v)").first()[0]

    # The lake is in the object store: falkirk's epoch writer commits through s3a, the
    # store is lost and restarted mid-run, and delta-rs reads what Spark committed.
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake
    from falkirk.io.delta import EpochWriter
    opts = cfg.delta_storage_options
    schema = pa.schema([("epoch", pa.int64()), ("n", pa.int64())])
    writer = EpochWriter(spark, cfg.table("t", "epochs"), "r", 1, schema, opts, pipeline="p")
    failed = {}
    def epoch(e):
        try:
            writer.write_epoch(spark.range(5).selectExpr(f"{e} as epoch", "id as n"), e)
        except Exception as err:  # reported below: the thread's error would be lost
            failed[e] = f"{type(err).__name__}: {str(err)[:2000]}"
    for e in range(2):
        epoch(e)
    # A read opened before the store goes away and read while it is away (what a Delta
    # streaming source's log read met in CI): it waits for the store, as commits do.
    from falkirk.io.delta import spark_uri
    jvm = spark._jvm
    log0 = jvm.org.apache.hadoop.fs.Path(spark_uri(cfg.table("t", "epochs"))
                                         + "/_delta_log/00000000000000000000.json")
    stream = log0.getFileSystem(spark._jsc.hadoopConfiguration()).open(log0)
    read = {}
    def read_log():
        try:
            read["first_byte"] = chr(stream.read())
        except Exception as err:
            failed["read"] = f"{type(err).__name__}: {str(err)[:2000]}"
    cluster.kill("objectstore")
    reading = threading.Thread(target=read_log)
    reading.start()
    during = threading.Thread(target=epoch, args=(2,))  # a commit while the store is down
    during.start()
    time.sleep(10)  # how long the store is away: beyond the retries' defaults (~2-4 s)
    cluster.start("objectstore")
    during.join(timeout=300)
    reading.join(timeout=300)
    out["read_across_the_restart"] = read.get("first_byte")
    epoch(3)
    table = DeltaTable(cfg.table("t", "epochs"), storage_options=opts).to_pyarrow_table()
    out["lake"] = cfg.table("t", "epochs")
    out["epochs"] = sorted(table.column("epoch").to_pylist())
    out["committed_epoch"] = writer.committed_epoch()
    out["failed"] = failed
    # Two delta-rs writers that read the same version: one wins it, the other commits next.
    uri = cfg.table("t", "two")
    write_deltalake(uri, pa.table({"a": [1]}), storage_options=opts)
    a, b = (DeltaTable(uri, storage_options=opts) for _ in range(2))
    write_deltalake(a, pa.table({"a": [2]}), mode="append")
    write_deltalake(b, pa.table({"a": [3]}), mode="append")
    both = DeltaTable(uri, storage_options=opts)
    out["two_writers"] = [both.version(), sorted(both.to_pyarrow_table().column("a").to_pylist())]
    spark.stop()
    print(json.dumps(out))
""")


def _cluster(env, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([CLUSTER, *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


@pytest.fixture
def env():
    # Not under pytest's tmp_path (its root is owner-only): as root, PostgreSQL runs as
    # Debian's postgres user, which must reach its data folder.
    var = Path(tempfile.mkdtemp(prefix="falkirk-cluster-"))
    var.chmod(0o711)
    yield {**os.environ, "FALKIRK_VAR_DIR": str(var)}
    # whatever a failed test left up
    subprocess.run([CLUSTER, "down"], capture_output=True,
                   env={**os.environ, "FALKIRK_VAR_DIR": str(var)}, timeout=120)
    shutil.rmtree(var, ignore_errors=True)


def test_cluster_up_runs_spark_on_the_workers_survives_a_lost_broker_and_down_ends_it(env):
    up = _cluster(env, "up")
    assert up.returncode == 0, up.stdout + up.stderr
    status = json.loads(_cluster(env, "status", "--json").stdout)["components"]
    assert {c["name"]: (c["kind"], c["healthy"]) for c in status} == {
        "spark-master": ("spark-master", True), "spark-worker-1": ("spark-worker", True),
        "spark-worker-2": ("spark-worker", True), "kafka-1": ("kafka", True),
        "kafka-2": ("kafka", True), "kafka-3": ("kafka", True),
        "objectstore": ("objectstore", True), "postgres": ("postgres", True),
        "redis": ("redis", True)}
    assert len({c["pgid"] for c in status}) == 9  # each in its own process group
    root = Path(env["FALKIRK_VAR_DIR"]) / "cluster"
    for creds in (cluster.credentials_file(root), root / "airflow" / "credentials.json",
                  root / "redis" / "redis.conf"):
        assert creds.stat().st_mode & 0o077 == 0, creds  # generated, owner-only
    secrets = [*json.loads(cluster.credentials_file(root).read_text()).values(),
               *cluster.airflow_credentials(root).values()]
    shown = json.dumps(status) + subprocess.run(["ps", "-eo", "args"], capture_output=True,
                                                text=True).stdout
    assert not [s for s in secrets if len(s) > 12 and s in shown]  # not in status, not in ps
    again = _cluster(env, "up")
    assert again.returncode != 0 and "a cluster is already up here" in again.stderr

    run = subprocess.run([sys.executable, "-c", CLIENT], capture_output=True, text=True,
                         env={**env, "FALKIRK_ENV": "cluster"}, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    killed = seen.pop("killed")
    assert killed in ("spark-worker-1", "spark-worker-2")
    assert seen == {"master": "spark://127.0.0.1:27077", "replicas": [3, 3, 3],
                    "rows": 1000, "distinct": 1000, "executors": 1,  # spark.cores.max=1
                    "sum_after_the_loss": sum(range(8)), "checkpoint_dir": True,
                    "cut_after_the_loss": sum(range(0, 200, 2)),
                    "lake": "s3://falkirk/lake/t/epochs",
                    "epochs": sorted([0, 1, 2, 3] * 5), "committed_epoch": 3, "failed": {},
                    "read_across_the_restart": "{",
                    "two_writers": [2, [1, 2, 3]]}
    after = {c["name"]: c["healthy"] for c in
             json.loads(_cluster(env, "status", "--json").stdout)["components"]}
    assert not after.pop("kafka-2") and not after.pop(killed) and all(after.values())

    down = _cluster(env, "down")
    assert down.returncode == 0, down.stderr
    assert not any(group_members(c["pgid"]) for c in status)
    assert json.loads(_cluster(env, "status", "--json").stdout)["components"] == []


def test_up_refuses_a_port_in_use_naming_the_component_and_starts_nothing(env):
    with socket.socket() as held:
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        held.bind(("127.0.0.1", 29093))
        held.listen()
        up = _cluster(env, "up", timeout=120)
    assert up.returncode != 0
    assert "kafka-2: port 29093 on 127.0.0.1 is already in use" in up.stderr
    assert json.loads(_cluster(env, "status", "--json").stdout)["components"] == []


def test_up_refuses_a_stale_cluster_folder_and_deletes_nothing(env):
    kafka = Path(env["FALKIRK_VAR_DIR"]) / "cluster" / "kafka"
    (kafka / "node-1" / "logs").mkdir(parents=True)
    (kafka / "cluster.id").write_text("ours")
    meta = kafka / "node-1" / "logs" / "meta.properties"
    meta.write_text("version=1\ncluster.id=theirs\nnode.id=1\n")
    up = _cluster(env, "up", timeout=120)
    assert up.returncode != 0
    assert "kafka-1:" in up.stderr and "a stale cluster folder" in up.stderr
    assert meta.read_text() == "version=1\ncluster.id=theirs\nnode.id=1\n"
    assert json.loads(_cluster(env, "status", "--json").stdout)["components"] == []


def test_airflow_on_the_cluster_profile_refuses_to_start_without_the_cluster(env, tmp_path):
    """FALKIRK_ENV=cluster runs Airflow with the CeleryExecutor on the cluster's PostgreSQL
    and Redis: with no cluster up, bin/airflow says so and starts nothing."""
    home = tmp_path / "airflow"
    done = subprocess.run([str(REPO_ROOT / "bin" / "airflow"), "start", "--port", "28590"],
                          capture_output=True, text=True, timeout=120,
                          env={**{k: v for k, v in env.items() if not k.startswith("AIRFLOW")},
                               "FALKIRK_ENV": "cluster", "FALKIRK_AIRFLOW_HOME": str(home)})
    assert done.returncode != 0
    assert "postgres of the local cluster is not up: run bin/cluster up first" in done.stderr
    assert "the CeleryExecutor needs the local cluster's PostgreSQL and Redis" in done.stderr
    assert not (home / "airflow.pid").exists() and not list(home.glob("celery-worker-*"))


def test_a_lost_celery_worker_s_batch_epoch_is_retried_on_the_other_and_committed_once(
        env, tmp_path, monkeypatch):
    """A user's pipeline (``falkirk init``) on the cluster: its stream region clean
    commits epoch 0 on the Spark master, then its batch DAG runs page_counts' epoch 0 in
    Airflow on the cluster (bin/airflow, FALKIRK_ENV=cluster: metadata in the cluster's
    PostgreSQL, the CeleryExecutor on Redis with 2 workers). The Celery worker running it
    is lost with its task and Spark driver, all at once, as when its machine goes away:
    Airflow fails the task when its heartbeats stop and retries it on the other worker.
    The run succeeds on its second try, nothing is rolled back, and the epoch is in the
    table once: its rows are the clicks per page of clean's epoch 0."""
    import psutil

    from falkirk.io.lake import read_table
    from falkirk_dev.demo.airflow import AirflowAPI, _free_port_block

    up = _cluster(env, "up")
    assert up.returncode == 0, up.stdout + up.stderr
    monkeypatch.setenv("FALKIRK_ENV", "cluster")
    monkeypatch.setenv("FALKIRK_VAR_DIR", env["FALKIRK_VAR_DIR"])
    folder = tmp_path / "pipelines" / "clicks"
    made = subprocess.run([sys.executable, "-m", "falkirk.cli", "init", str(folder)],
                          capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    declared = folder / "pipeline.yaml"
    home, bin_airflow = tmp_path / "airflow", str(REPO_ROOT / "bin" / "airflow")
    dag = "falkirk_clicks_batch_page_counts"
    with LocalRun(tmp_path / "run", declared,
                  broker=cluster.ClusterKafka(str(declared)).start()) as run:
        run.produce_files(folder / "input")
        run.start(["jobs/clean.py"], until_epoch=0)  # beside Airflow's start
        aenv = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
        # What `bin/airflow` asks the cluster for itself; here the cluster's folder is not
        # the sandbox's FALKIRK_VAR_DIR, as a remote cluster's would not be.
        aenv.update(cluster.airflow_settings(home), **run.env, FALKIRK_ENV="cluster",
                    FALKIRK_AIRFLOW_HOME=str(home), FALKIRK_PIPELINES=str(folder.parent),
                    FALKIRK_BATCH_EPOCHS="1", FALKIRK_AIRFLOW_PASSWORD="falkirk-test",
                    # the lost task is failed 45 s after its last heartbeat
                    AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT="45")
        port = _free_port_block()
        try:
            started = subprocess.run([bin_airflow, "start", "--port", str(port)], env=aenv,
                                     timeout=600, capture_output=True, text=True)
            assert started.returncode == 0, started.stdout + started.stderr
            assert "Celery worker 2" in started.stdout
            workers = {int((home / f"celery-worker-{i}.pgid").read_text()) for i in (1, 2)}
            api = AirflowAPI(f"http://127.0.0.1:{port}", home)
            run.wait_for(lambda: api._request("GET", f"/api/v2/dags/{dag}")[0] == 200,
                         timeout_s=300, what="the dag processor to parse the batch DAG")
            api.pause(dag, False)

            def page_counts_worker() -> int | None:
                """The Celery worker (its session: Airflow gives each task a process group
                of its own in it) whose task runs page_counts' driver for epoch 0."""
                for proc in psutil.process_iter(["cmdline"]):
                    cmd = proc.info["cmdline"] or []
                    if any(a.endswith("page_counts.py") for a in cmd) and "--epoch" in cmd \
                            and cmd[cmd.index("--epoch") + 1] == "0" \
                            and session_of(proc.pid) in workers:
                        return session_of(proc.pid)
                return None

            run.wait_for(lambda: page_counts_worker() is not None, timeout_s=600,
                         what="page_counts' epoch 0 running on a Celery worker")
            lost = page_counts_worker()
            for pid in session_members(lost):  # the worker's machine is lost: all at once
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            run.wait_for(lambda: not session_members(lost), timeout_s=30,
                         what="the lost worker's processes to end")

            def states() -> list[str]:
                return [r["state"] for r in api.runs(dag)]

            run.wait_for(lambda: states() in (["success"], ["failed"]), timeout_s=600,
                         what="the batch run of epoch 0 to end")
            [only] = api.runs(dag)
            assert only["state"] == "success", only
            assert api.tasks(dag, only["dag_run_id"])["page_counts"]["try_number"] == 2
            assert session_members(next(w for w in workers if w != lost))  # the other one
        finally:
            subprocess.run([bin_airflow, "stop"], env=aenv, timeout=180, capture_output=True)
        assert run.wait(timeout_s=300) == {"jobs/clean.py": 0}
        assert run.log.rollbacks("clicks") == []  # nothing for falkirk to recover
        entries = run.log.regions(run.pipeline)["page_counts"].entries.values()
        assert [(e.epoch, e.status) for e in entries] == [(0, "committed")]
        opts = run.cfg.delta_storage_options
        clean = read_table(run.cfg.table("clean_clicks"), storage_options=opts).to_pylist()
        counts = read_table(run.cfg.table("page_counts"), storage_options=opts).to_pylist()
    per_page: dict[str, int] = {}
    for row in clean:
        if row["epoch"] == 0:
            per_page[row["page"]] = per_page.get(row["page"], 0) + 1
    assert per_page  # the input has clicks in epoch 0
    assert sorted((r["epoch"], r["page"], r["clicks"]) for r in counts) == sorted(
        (0, page, n) for page, n in per_page.items())


@pytest.mark.full(reason=(
    "the whole reference pipeline on the cluster: ~12 min on a slow CI machine. The "
    "default run has the same infrastructure faults on the cluster (a lost broker, a "
    "killed Spark worker, the object store restarted under a read and a commit: "
    "test_cluster_up_runs_spark_on_the_workers_survives_a_lost_broker_and_down_ends_it; "
    "a lost Celery worker under a batch epoch: "
    "test_a_lost_celery_worker_s_batch_epoch_is_retried_on_the_other_and_committed_once)"))
def test_the_reference_pipeline_on_the_cluster_rides_out_infrastructure_faults(
        env, golden, tmp_path, monkeypatch):
    """Infrastructure faults are the engines' to absorb, not falkirk's. The reference
    pipeline runs on the cluster, its jobs on the Spark master, while a Kafka broker is
    lost (mid-epoch 1 of ingest: the other two hold every acknowledged record), a Spark
    worker is killed and started again (mid-epoch 2 of communities: Spark reruns the lost
    tasks) and the object store is killed and started again (mid-epoch 3 of serve: s3a
    and delta-rs retry). No job fails, nothing is rolled back, and every output equals the
    failure-free run on the embedded defaults."""
    up = _cluster(env, "up")
    assert up.returncode == 0, up.stdout + up.stderr
    monkeypatch.setenv("FALKIRK_ENV", "cluster")
    monkeypatch.setenv("FALKIRK_VAR_DIR", env["FALKIRK_VAR_DIR"])
    with LocalRun(tmp_path / "run", broker=cluster.ClusterKafka("reference").start()) as run:
        run.generate(**INPUT)
        run.start(until_epoch=EPOCHS - 1)
        faults = [(lambda: run.epoch_running("ingest", 1), "ingest mid-epoch 1",
                   lambda: cluster.kill("kafka-2")),
                  (lambda: run.epoch_running("communities", 2), "communities mid-epoch 2",
                   lambda: (cluster.kill("spark-worker-1"), cluster.start("spark-worker-1"))),
                  (lambda: run.epoch_running("serve", 3), "serve mid-epoch 3",
                   lambda: (cluster.kill("objectstore"), cluster.start("objectstore")))]
        # Each fault when its moment comes, whatever the order the jobs reach them in.
        deadline = time.monotonic() + 1200
        while faults:
            for f in [f for f in faults if f[0]()]:
                f[2]()
                faults.remove(f)
            assert time.monotonic() < deadline, f"never came: {[f[1] for f in faults]}"
            time.sleep(0.5)
        codes = run.wait(timeout_s=1500)
        assert set(codes.values()) == {0}, {j: str(run.log_file(j)) for j in codes}
        assert run.log.rollbacks("reference") == []  # nothing for falkirk to recover
        outputs, sent = run.outputs(), run.sent()
    assert sent["responses"]["resent"] == 0
    assert_same(golden, outputs)
