"""The local Kafka-compatible broker helper: start, stop, restart, topics."""

from __future__ import annotations

import socket

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from falkirk.broker import BrokerError, LocalBroker
from falkirk.procs import group_members


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
