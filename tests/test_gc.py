"""Garbage collection by low watermark, on the small pipeline and a real broker: it removes
only what falkirk owns or what the pipeline declares a log, and itemises it."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
from deltalake import DeltaTable
from kafka import KafkaAdminClient, KafkaProducer, TopicPartition
from tiny_pipeline import PIPE, PIPE_DICT

from falkirk.io.lake import read_table
from falkirk.model.topology import Pipeline, TopologyError
from falkirk.recovery.gc import collect, group_id
from falkirk.recovery.rollback import RollbackError, RollbackRequest


def declared_log(retain: int) -> Pipeline:
    """The small pipeline with t_in declared a log keeping its newest ``retain`` epochs."""
    raw = copy.deepcopy(PIPE_DICT)
    raw["edges"]["t_in"]["retain_epochs"] = retain
    return Pipeline.from_dict(raw)


def epochs(cfg, table: str) -> list[int]:
    return sorted(read_table(cfg.table(table))["epoch"].to_pylist())


def test_by_default_every_table_is_a_product_and_no_row_is_listed(world):
    cfg, log, _, _ = world
    version = DeltaTable(cfg.table("t_in")).version()
    report = collect(PIPE, cfg, log, apply=False)
    # As if everything failed: agg can restore at most its checkpoint 3, and report (fed
    # through an unlogged edge) must then be at 3 as well; ingest keeps every epoch.
    assert report.watermarks == {"ingest": 5, "agg": 3, "report": 3}
    assert report.deleted_through == {}
    assert report.kept_tables == ["t_in", "t_mid", "t_out"]
    assert report.acknowledged == {"src": {"0": 6}}  # what ingest's epochs ≤ 5 read
    [ack] = report.items
    assert (ack.store, ack.name, ack.kind) == ("topic", "src", "acknowledge")
    assert "retention stays its owner's" in ack.rule
    assert DeltaTable(cfg.table("t_in")).version() == version
    assert log.collected("tiny") == {}


def test_a_dry_run_itemises_the_rows_of_a_declared_log_with_their_rule(world):
    cfg, log, _, _ = world
    report = collect(declared_log(0), cfg, log, apply=False)
    assert report.deleted_through == {"t_in": 3}  # agg never needs epochs ≤ 3 again
    [rows] = [i for i in report.items if i.kind == "log rows"]
    assert (rows.store, rows.name, rows.rows, rows.files) == ("table", "t_in", 4, 4)
    assert rows.bytes > 0
    assert rows.rule.startswith("declared a log (retain_epochs: 0)")
    assert report.kept_tables == ["t_mid", "t_out"]
    assert report.to_json()["freed_bytes"] == rows.bytes
    assert epochs(cfg, "t_in") == [0, 1, 2, 3, 4, 5]  # a dry run
    # retain_epochs keeps the sender's newest epochs even where the receiver passed them
    assert collect(declared_log(3), cfg, log).deleted_through == {"t_in": 2}
    assert collect(declared_log(6), cfg, log).deleted_through == {}


def test_apply_keeps_every_row_of_a_product_and_acknowledges_input(world, broker, spark):
    cfg, log, _, _ = world
    _produce(broker, 6)
    cfg = replace(cfg, kafka_bootstrap=broker.bootstrap)
    before = {t: read_table(cfg.table(t)).to_pylist() for t in ("t_in", "t_mid", "t_out")}
    collect(PIPE, cfg, log, apply=True, vacuum_retention_hours=0, spark=spark)
    assert {t: read_table(cfg.table(t)).to_pylist() for t in before} == before
    assert set(log.collected("tiny")) == {"src"}
    assert _committed(broker, group_id("tiny", "ingest")) == 6


def test_apply_drops_a_declared_log_and_then_constrains_rollbacks(world, broker, spark):
    cfg, log, executor, _ = world
    _produce(broker, 6)
    cfg = replace(cfg, kafka_bootstrap=broker.bootstrap)
    pipe = declared_log(0)
    collect(pipe, cfg, log, apply=True, vacuum_retention_hours=0, spark=spark)
    assert epochs(cfg, "t_in") == [4, 5]
    assert log.collected("tiny")["t_in"] == (3, None)
    assert log.collected("tiny")["src"] == (5, {"0": 6})
    # What was collected is now part of the problem: ingest can no longer resend t_in's
    # epochs ≤ 3, so agg cannot go below 3 without ingest below its acknowledged input.
    problem = log.problem(pipe)
    assert problem.regions["ingest"].live.discarded == {"t_in": 3}
    with pytest.raises(RollbackError, match="acknowledged through epoch 5"):
        executor.run(RollbackRequest("tiny", region="agg", to_epoch=1, reason="too far",
                                     dry_run=True))


def test_retain_epochs_is_declared_on_a_delta_edge_a_region_writes(world):
    bad = copy.deepcopy(PIPE_DICT)
    bad["edges"]["src"]["retain_epochs"] = 2
    with pytest.raises(TopologyError, match="edge 'src': retain_epochs declares a Delta table"):
        Pipeline.from_dict(bad)
    bad = copy.deepcopy(PIPE_DICT)
    bad["edges"]["t_in"]["retain_epochs"] = -1
    with pytest.raises(TopologyError, match="retain_epochs must be an integer ≥ 0, got -1"):
        Pipeline.from_dict(bad)
    bad = copy.deepcopy(PIPE_DICT)
    bad["edges"]["t_in"]["retain_epochs"] = 2
    bad["edges"]["t_in_too"] = {"kind": "delta", "from": "ingest", "to": "report",
                                "table": "t_in", "retain_epochs": 3}
    with pytest.raises(TopologyError, match=r"table 't_in': its edges declare retain_epochs "
                                            r"\[2, 3\]"):
        Pipeline.from_dict(bad)


def test_an_orphan_file_is_itemised_and_vacuumed_and_time_travel_stays(world, broker):
    """A file no version references (a write killed before its commit) goes; every version
    of the table stays readable (Delta's own retention decides about time travel)."""
    import shutil
    from pathlib import Path

    cfg, log, _, _ = world
    _produce(broker, 6)
    cfg = replace(cfg, kafka_bootstrap=broker.bootstrap)

    table = Path(cfg.table("t_mid"))
    live = sorted(p for p in table.rglob("*.parquet") if "_delta_log" not in p.parts)[0]
    shutil.copy(live, table / "part-00000-orphan.c000.snappy.parquet")
    report = collect(PIPE, cfg, log, apply=True, vacuum_retention_hours=0)
    [orphan] = [i for i in report.items if i.kind == "orphan files"]
    assert (orphan.name, orphan.files) == ("t_mid", 1)
    assert orphan.bytes == live.stat().st_size
    assert not (table / "part-00000-orphan.c000.snappy.parquet").exists()
    for version in range(DeltaTable(str(table)).version() + 1):
        read_table(str(table), version=version)


def _produce(broker, n: int) -> None:
    broker.create_topic("src", 1)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap)
    for i in range(n):
        producer.send("src", b"%d" % i)
    producer.flush()
    producer.close()


def _committed(broker, group: str) -> int:
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        return admin.list_group_offsets({group: None})[group][TopicPartition("src", 0)].offset
    finally:
        admin.close()
