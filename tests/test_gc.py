"""Garbage collection by low watermark, on the small pipeline and a real broker."""

from __future__ import annotations

from dataclasses import replace

import pytest
from deltalake import DeltaTable
from kafka import KafkaAdminClient, KafkaProducer, TopicPartition
from tiny_pipeline import PIPE

from falkirk.io.lake import read_table
from falkirk.recovery.gc import collect, group_id
from falkirk.recovery.rollback import RollbackError, RollbackRequest


def test_dry_run_reports_what_the_low_watermarks_allow_and_changes_nothing(world):
    cfg, log, _, _ = world
    version = DeltaTable(cfg.table("t_in")).version()
    report = collect(PIPE, cfg, log, apply=False)
    # As if everything failed: agg can restore at most its checkpoint 3, and report (fed
    # through an unlogged edge) must then be at 3 as well; ingest keeps every epoch.
    assert report.watermarks == {"ingest": 5, "agg": 3, "report": 3}
    assert report.checkpoints == {"agg": 3, "report": 3}
    assert report.deleted_through == {"t_in": 3}  # agg never needs epochs ≤ 3 again
    assert report.acknowledged == {"src": {"0": 6}}  # what ingest's epochs ≤ 5 read
    assert DeltaTable(cfg.table("t_in")).version() == version
    assert log.collected("tiny") == {}


def test_apply_drops_acknowledges_and_then_constrains_rollbacks(world, broker, spark):
    cfg, log, executor, _ = world
    broker.create_topic("src", 1)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap)
    for i in range(6):
        producer.send("src", b"%d" % i)
    producer.flush()
    producer.close()
    cfg = replace(cfg, kafka_bootstrap=broker.bootstrap)
    report = collect(PIPE, cfg, log, apply=True, vacuum_retention_hours=0, spark=spark)
    kept = read_table(cfg.table("t_in"))["epoch"].to_pylist()
    assert sorted(kept) == [4, 5]
    assert log.collected("tiny")["t_in"] == (3, None)
    assert log.collected("tiny")["src"] == (5, {"0": 6})
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    group = group_id("tiny", "ingest")
    committed = admin.list_group_offsets({group: None})[group]
    admin.close()
    assert committed[TopicPartition("src", 0)].offset == 6
    assert set(report.vacuumed) == {"t_in", "t_mid", "t_out"}
    # What was collected is now part of the problem: ingest can no longer resend t_in's
    # epochs ≤ 3, so agg cannot go below 3 without ingest below its acknowledged input.
    problem = log.problem(PIPE)
    assert problem.regions["ingest"].live.discarded == {"t_in": 3}
    with pytest.raises(RollbackError, match="acknowledged through epoch 5"):
        executor.run(RollbackRequest("tiny", region="agg", to_epoch=1, reason="too far",
                                     dry_run=True))
