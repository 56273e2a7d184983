"""The embedded Apache Kafka broker (KRaft): start, stop, restart, crash, topics, bad input."""

from __future__ import annotations

import socket

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from falkirk.local.broker import BrokerError, LocalBroker
from falkirk.runtime.procs import group_members


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.slow
def test_create_topic_is_idempotent_and_checks_the_partition_count(broker):
    broker.create_topic("topics-a", 3)
    broker.create_topic("topics-a", 3)  # same count: fine
    with pytest.raises(BrokerError, match="already exists with 3 partitions, not the 2"):
        broker.create_topic("topics-a", 2)
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap)
    try:
        assert consumer.partitions_for_topic("topics-a") == {0, 1, 2}
    finally:
        consumer.close()


@pytest.mark.slow
def test_stop_leaves_nothing_running_and_a_restart_keeps_the_data(tmp_path):
    with LocalBroker(tmp_path / "b") as b:
        port, pgid = b.port, b._proc.pid
        b.create_topic("kept", 2)
        producer = KafkaProducer(bootstrap_servers=b.bootstrap)
        for i in range(10):
            producer.send("kept", key=str(i).encode(), value=b"x", partition=i % 2)
        producer.flush()
        producer.close()
    assert not b.running
    assert group_members(pgid) == []  # zombies (reaped or not) hold nothing
    assert not _port_open(port)
    b.stop()  # stopping twice is harmless

    with LocalBroker(tmp_path / "b", port=port) as again:
        consumer = KafkaConsumer(bootstrap_servers=again.bootstrap)
        try:
            tps = [TopicPartition("kept", p) for p in (0, 1)]
            assert sum(consumer.end_offsets(tps).values()) == 10
        finally:
            consumer.close()


@pytest.mark.slow
def test_a_taken_port_is_a_clear_error(broker, tmp_path):
    with pytest.raises(BrokerError, match=f"port {broker.port} .* already in use"):
        LocalBroker(tmp_path / "other", port=broker.port).start()
    with pytest.raises(BrokerError, match="call start"):
        _ = LocalBroker(tmp_path / "unstarted").bootstrap


def _produce(bootstrap: str, topic: str, first: int, n: int) -> None:
    """n records acknowledged by the broker (acks=all: written to its log)."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    futures = [producer.send(topic, key=b"%d" % i, value=b"v%d" % i)
               for i in range(first, first + n)]
    producer.flush()
    for f in futures:
        f.get(timeout=30)  # raises if the broker did not acknowledge
    producer.close()


def _values(bootstrap: str, topic: str) -> list[bytes]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                             consumer_timeout_ms=3000, enable_auto_commit=False)
    consumer.assign([TopicPartition(topic, 0)])
    try:
        return [r.value for r in consumer]
    finally:
        consumer.close()


@pytest.mark.slow
def test_a_restarted_or_killed_broker_loses_no_acknowledged_record(tmp_path):
    """Apache Kafka keeps what it acknowledged through a clean restart and a SIGKILL
    (records are in the OS's page cache); clients reconnect on the same bootstrap."""
    with LocalBroker(tmp_path / "b") as b:
        b.create_topic("acked", 1)
        _produce(b.bootstrap, "acked", 0, 100)
        b.restart()
        _produce(b.bootstrap, "acked", 100, 100)
        b.kill()
        assert not b.running
        b.start()
        assert _values(b.bootstrap, "acked") == [b"v%d" % i for i in range(200)]


@pytest.mark.slow
def test_storage_of_another_cluster_is_refused_and_kept(tmp_path):
    with LocalBroker(tmp_path / "b"):
        pass
    (tmp_path / "b" / "cluster.id").write_text("AAAAAAAAAAAAAAAAAAAAAA")
    kept = sorted(p.name for p in (tmp_path / "b" / "logs").iterdir())
    with pytest.raises(BrokerError, match="belongs to cluster .* nothing was deleted"):
        LocalBroker(tmp_path / "b").start()
    assert sorted(p.name for p in (tmp_path / "b" / "logs").iterdir()) == kept


def test_missing_broker_jars_name_bin_setup(tmp_path, monkeypatch):
    from falkirk.io import jars
    monkeypatch.setenv("FALKIRK_JARS_DIR", str(tmp_path / "nothing"))
    jars._checked.cache_clear()
    try:
        with pytest.raises(jars.JarsError, match="run bin/setup"):
            LocalBroker(tmp_path / "b").start()
    finally:
        jars._checked.cache_clear()


def test_a_cluster_id_never_starts_with_a_dash(monkeypatch):
    """The storage tool reads ``-t -abc…`` as a missing value (seen: 1 format in 64 failed)."""
    import uuid

    from falkirk.local import broker as broker_module
    dash_first = uuid.UUID(bytes=b"\xf8" + bytes(15))  # urlsafe base64 "-A…"
    plain = uuid.UUID(bytes=bytes(16))
    drawn = iter([dash_first, plain])
    monkeypatch.setattr(broker_module.uuid, "uuid4", lambda: next(drawn))
    assert broker_module._new_cluster_id() == "AAAAAAAAAAAAAAAAAAAAAA"


@pytest.mark.slow
def test_falkirk_broker_starts_one_that_outlives_the_command_and_stops_it(tmp_path):
    """Under Airflow the jobs talk to the profile's broker address: `falkirk broker start`
    puts the embedded one there, in a session of its own, and `stop` ends it."""
    import json
    import os
    import subprocess
    import sys

    from falkirk.local.broker import free_port

    port = free_port()
    env = {**os.environ, "FALKIRK_VAR_DIR": str(tmp_path / "var"),
           "FALKIRK_BROKER_DATA_DIR": str(tmp_path / "var" / "broker"),
           "FALKIRK_KAFKA_BOOTSTRAP": f"127.0.0.1:{port}"}

    def falkirk(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "falkirk.cli", "broker", *args],
                              capture_output=True, text=True, timeout=120, env=env)

    down = falkirk("status")
    assert down.returncode == 1 and f"broker 127.0.0.1:{port}: down" in down.stdout
    started = falkirk("start")
    assert started.returncode == 0, started.stderr
    assert started.stdout.startswith(f"broker 127.0.0.1:{port}: started")
    try:
        assert _port_open(port)  # the command has exited; its broker has not
        status = json.loads(falkirk("status", "--json").stdout)
        assert status["answering"] and group_members(status["pgid"])
        assert "already answering" in falkirk("start").stdout
    finally:
        stopped = falkirk("stop")
    assert stopped.stdout.strip() == "stopped"
    assert not _port_open(port) and not group_members(status["pgid"])
    assert "no broker started by falkirk broker start" in falkirk("stop").stdout
    env["FALKIRK_KAFKA_BOOTSTRAP"] = "10.0.0.5:9092,10.0.0.6:9092"
    refused = falkirk("start")
    assert refused.returncode == 2
    assert "not one embedded broker on this machine" in refused.stderr
