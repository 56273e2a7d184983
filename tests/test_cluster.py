"""The local cluster (``bin/cluster``): Spark standalone and a 3-broker Kafka cluster, each
component its own process; a lost broker loses no acknowledged record, executors on the
workers read the topics with the shipped connector jars, and ``down`` leaves nothing."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest

from falkirk.config import REPO_ROOT
from falkirk.runtime.procs import group_members

pytestmark = pytest.mark.slow

CLUSTER = str(REPO_ROOT / "bin" / "cluster")

# Runs with FALKIRK_ENV=cluster in its own interpreter (a fresh driver JVM on the master).
CLIENT = textwrap.dedent("""
    import json, sys
    from kafka import KafkaAdminClient, KafkaProducer
    from falkirk.config import load
    from falkirk.io.kafka import end_offsets, ensure_topics, read_range
    from falkirk.io.spark import session
    from falkirk.model.times import Offsets
    from falkirk_dev import cluster

    cfg = load()
    ensure_topics(cfg.kafka_bootstrap, {"orders": 3})
    admin = KafkaAdminClient(bootstrap_servers=cfg.kafka_bootstrap)
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
    spark.stop()
    print(json.dumps(out))
""")


def _cluster(env, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([CLUSTER, *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


@pytest.fixture
def env(tmp_path):
    yield {**os.environ, "FALKIRK_VAR_DIR": str(tmp_path / "var")}
    # whatever a failed test left up
    subprocess.run([CLUSTER, "down"], capture_output=True,
                   env={**os.environ, "FALKIRK_VAR_DIR": str(tmp_path / "var")}, timeout=120)


def test_cluster_up_runs_spark_on_the_workers_survives_a_lost_broker_and_down_ends_it(env):
    up = _cluster(env, "up")
    assert up.returncode == 0, up.stdout + up.stderr
    status = json.loads(_cluster(env, "status", "--json").stdout)["components"]
    assert {c["name"]: (c["kind"], c["healthy"]) for c in status} == {
        "spark-master": ("spark-master", True), "spark-worker-1": ("spark-worker", True),
        "spark-worker-2": ("spark-worker", True), "kafka-1": ("kafka", True),
        "kafka-2": ("kafka", True), "kafka-3": ("kafka", True)}
    assert len({c["pgid"] for c in status}) == 6  # each in its own process group
    again = _cluster(env, "up")
    assert again.returncode != 0 and "a cluster is already up here" in again.stderr

    run = subprocess.run([sys.executable, "-c", CLIENT], capture_output=True, text=True,
                         env={**env, "FALKIRK_ENV": "cluster"}, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert seen == {"master": "spark://127.0.0.1:27077", "replicas": [3, 3, 3],
                    "rows": 1000, "distinct": 1000, "executors": 1}  # spark.cores.max=1
    after = {c["name"]: c["healthy"] for c in
             json.loads(_cluster(env, "status", "--json").stdout)["components"]}
    assert not after.pop("kafka-2") and all(after.values())

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
