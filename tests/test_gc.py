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
from falkirk.log.epochlog import EpochLog, EpochRecord
from falkirk.model.topology import Pipeline, TopologyError
from falkirk.recovery.gc import GarbageCollector, Housekeeping, Watermarks, collect, group_id
from falkirk.recovery.rollback import RollbackError, RollbackRequest
from falkirk.solver.frontier import low_watermark

#: Two regions joined by a topic declared a log: relay (ephemeral) sends 10 records an
#: epoch to ``mid``; sink (lazy, a checkpoint every 2 epochs) reads them.
RELAY = Pipeline.from_dict({
    "pipeline": "relay",
    "settings": {"epoch_seconds": 10, "origin_ms": 0},
    "regions": {"relay": {"regime": "ephemeral", "job": "jobs/a.py"},
                "sink": {"regime": "lazy", "checkpoint_every": 2, "job": "jobs/b.py"}},
    "edges": {"src": {"kind": "kafka", "to": "relay", "topic": "relay_src"},
              "mid": {"kind": "kafka", "from": "relay", "to": "sink", "topic": "relay_mid",
                      "retain_epochs": 1},
              "out": {"kind": "delta", "from": "sink", "table": "relay_out"}},
})


def relay_epochs(log: EpochLog, epochs: range, generation: int = 0) -> None:
    """Both regions' rows for ``epochs``: relay read 1 record of src and sent 10 to mid,
    sink read them (and checkpointed every other epoch)."""
    rows = []
    for k in epochs:
        rows.append(EpochRecord("relay", "relay", k, generation, "committed",
                                inputs={"src": {"from": {"0": k}, "to": {"0": k + 1}}}))
        rows.append(EpochRecord(
            "relay", "sink", k, generation, "checkpointed" if k % 2 else "committed",
            inputs={"mid": {"from": {"0": 10 * k}, "to": {"0": 10 * (k + 1)}}},
            state_ref=f"checkpoint:{k}" if k % 2 else None))
    log.record(*rows)


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


def test_retain_epochs_is_declared_on_a_log_between_regions():
    bad = copy.deepcopy(PIPE_DICT)
    bad["edges"]["src"]["retain_epochs"] = 2  # the user's input topic: never trimmed
    with pytest.raises(TopologyError, match="edge 'src': retain_epochs declares a log between "
                                            "regions .* this edge is kafka with no region "
                                            "writing it"):
        Pipeline.from_dict(bad)
    bad = copy.deepcopy(PIPE_DICT)
    bad["edges"]["link"]["retain_epochs"] = 2
    with pytest.raises(TopologyError, match="this edge is unlogged"):
        Pipeline.from_dict(bad)
    assert RELAY.edges["mid"].retain_epochs == 1  # a topic between two regions may be one
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


def _committed(broker, group: str, topic: str = "src") -> int:
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        return admin.list_group_offsets({group: None})[group][TopicPartition(topic, 0)].offset
    finally:
        admin.close()


def test_watermarks_kept_incrementally_are_those_of_a_full_solve(tmp_path):
    """The continuous collector's watermarks: new frontiers are added to one solver, a
    region whose older entries changed (a collection recorded) is refreshed alone, a new
    generation solves anew; at every step they equal a solve from scratch."""
    log = EpochLog(str(tmp_path / "log"))
    marks = Watermarks(RELAY, log)

    def full() -> dict:
        return low_watermark(log.problem(RELAY, replay=False))

    relay_epochs(log, range(3))
    assert marks.update() == full()
    assert marks.update()["sink"].to_json() == 1  # its newest checkpoint
    relay_epochs(log, range(3, 8))
    assert marks.update() == full()
    assert marks.update()["sink"].to_json() == 7
    assert (marks.rebuilt, marks.added) == (1, 8)  # relay: 5 epochs; sink: checkpoints 3, 5, 7
    log.record_collected("relay", "mid", 5)  # relay's entries now say what is gone
    assert marks.update() == full()
    assert marks.refreshed == 1 and marks.rebuilt == 1
    log.record_rollback("relay", "r1", 1, "done", {}, {})
    relay_epochs(log, range(8, 10), generation=1)
    assert marks.update() == full()
    assert marks.rebuilt == 2


def test_a_log_topic_between_regions_is_trimmed_below_what_its_receiver_passed(
        tmp_path, broker):
    """sink checkpointed epoch 7: no failure takes it below, so relay_mid's records that
    its epochs through 6 read (retain_epochs: 1 keeps epoch 7's) go with DeleteRecords;
    the topic starts there after, and the input topic (the user's) is only acknowledged."""
    from falkirk.config import load

    cfg = replace(load(), lake=str(tmp_path / "lake"), kafka_bootstrap=broker.bootstrap)
    log = EpochLog.from_config(cfg)
    relay_epochs(log, range(8))
    for topic, n in (("relay_src", 8), ("relay_mid", 80)):
        broker.create_topic(topic, 1)
        producer = KafkaProducer(bootstrap_servers=broker.bootstrap)
        for i in range(n):
            producer.send(topic, b"%d" % i)
        producer.flush()
        producer.close()

    dry = collect(RELAY, cfg, log)
    [trim] = [i for i in dry.items if i.kind == "log records"]
    assert (trim.store, trim.name, trim.detail["offsets"]) == ("topic", "relay_mid", {"0": 70})
    assert "retain_epochs: 1" in trim.rule and "through 6" in trim.rule
    assert _log_start(broker, "relay_mid") == 0  # a dry run

    collector = GarbageCollector(RELAY, cfg, log, retention_hours=0)
    assert collector.step() is not None
    assert _log_start(broker, "relay_mid") == 70
    assert _log_start(broker, "relay_src") == 0  # the user's topic keeps its records
    assert _committed(broker, group_id("relay", "relay"), "relay_src") == 8
    assert log.collected("relay")["mid"][0] == 6  # relay can no longer resend epochs ≤ 6
    assert collector.step() is None  # the watermarks stood: nothing looked at again
    relay_epochs(log, range(8, 10))
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap)
    for i in range(20):
        producer.send("relay_mid", b"%d" % i)
    producer.flush()
    producer.close()
    assert collector.step() is not None
    assert _log_start(broker, "relay_mid") == 90
    assert collector.marks.rebuilt == 1  # kept incrementally


def test_the_app_transactions_of_dead_generations_expire_and_the_fence_stops_at_its_floor(
        tmp_path, monkeypatch):
    """Each generation writes under its own app id; a table keeps an app id's transaction
    a week after its last commit (delta.setTransactionRetentionDuration). A fence records
    the generation below which all are fenced, so a later fence does not walk (and write)
    every expired generation again."""
    import time

    import pyarrow as pa
    from deltalake import CommitProperties, Transaction, write_deltalake
    from deltalake import DeltaTable as RsTable

    from falkirk.io import delta
    from falkirk.io.delta import FENCED, app_id_for, fence_older_generations, fenced_below_id

    uri = str(tmp_path / "t")
    assert delta.ensure_table(uri, pa.schema([("epoch", pa.int64())]))
    day = 24 * 3600 * 1000
    now = int(time.time() * 1000)
    monkeypatch.setattr(delta, "_now_ms", lambda: now - 8 * day)
    assert len(fence_older_generations(uri, "agg", 5)) == 5  # g4..g0, 8 days ago
    # generation 5's writer commits epoch 3 two days ago, renewing its own transaction
    # and the fence's floor as EpochWriter._commit does
    write_deltalake(uri, pa.schema([("epoch", pa.int64())]).empty_table(), mode="append",
                    commit_properties=CommitProperties(app_transactions=[
                        Transaction(app_id_for("agg", 5), 3, last_updated=now - 2 * day),
                        Transaction(fenced_below_id("agg"), 5, last_updated=now - 2 * day)]))
    monkeypatch.setattr(delta, "_now_ms", lambda: now - day)
    assert fence_older_generations(uri, "agg", 9) == [app_id_for("agg", g)
                                                      for g in (8, 7, 6, 5)]
    table = RsTable(uri)
    assert [table.transaction_version(app_id_for("agg", g)) for g in range(9)] == \
        [None] * 5 + [FENCED] * 4  # a week gone: g0..g4 are out of the snapshot
    monkeypatch.setattr(delta, "_now_ms", lambda: now)
    assert fence_older_generations(uri, "agg", 10) == [app_id_for("agg", 9)]
    assert RsTable(uri).transaction_version(app_id_for("agg", 0)) is None


def _log_start(broker, topic: str) -> int:
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap)
    try:
        [start] = consumer.beginning_offsets([TopicPartition(topic, 0)]).values()
        return start
    finally:
        consumer.close()


def test_checkpoints_are_folded_by_their_own_job_when_garbage_collection_asks(world, broker):
    """agg (lazy, retain_checkpoints: 0) has checkpoints 1 and 3 and no failure takes it
    below 3: collection itemises checkpoint 1 and asks agg's job to fold it (the store's
    one writer: a fold beside a save deletes the save's files); the store is untouched
    until the job, between two epochs, folds it, once."""
    import pyarrow as pa

    from falkirk.runtime.loop import JobRunner
    from falkirk.state.checkpoints import CheckpointStore

    cfg, log, _, _ = world
    _produce(broker, 6)
    cfg = replace(cfg, kafka_bootstrap=broker.bootstrap)
    raw = copy.deepcopy(PIPE_DICT)
    raw["regions"]["agg"]["retain_checkpoints"] = 0
    pipe = Pipeline.from_dict(raw)
    values = pa.schema([("total", pa.int64())])
    store = CheckpointStore(cfg.table("_falkirk_state", "tiny", "agg"), values)
    for k in (1, 3):
        store.save(k, pa.table({"key": ["a"], "total": [k]},
                               schema=pa.schema([("key", pa.string()), *values])))
    report = collect(pipe, cfg, log, apply=True)
    [item] = [i for i in report.items if i.kind == "checkpoints"]
    assert (item.name, item.detail["keep_from"], item.detail["dropped"]) == ("agg", 3, [1])
    assert log.folds("tiny") == {"agg": 3}
    assert store.checkpoints() == [1, 3]  # asked, not done: its job folds them

    job = JobRunner.__new__(JobRunner)  # what the fold uses of a running job
    job.pipeline, job.log, job.persist, job.folded = pipe, log, True, {}
    job.folds_read_at = float("-inf")
    job.checkpoint_store = lambda region: store
    job._fold_checkpoints({"agg", "report"})
    assert store.checkpoints() == [3]
    assert store.restore(3).to_pylist() == [{"key": "a", "total": 3}]
    version = DeltaTable(store.uri).version()
    job.folds_read_at = float("-inf")  # (requests are read every FOLDS_EVERY_S)
    job._fold_checkpoints({"agg", "report"})  # asked once, done once
    assert DeltaTable(store.uri).version() == version
    assert log.collected("tiny").keys() <= set(PIPE.edges)  # fold requests are no edge's


def test_housekeeping_compacts_the_log_when_due_and_logs_a_failure_without_raising(
        tmp_path, caplog, monkeypatch):
    """The one loop beside a deployed pipeline (the supervisor's watch, a sandbox's
    keep_house, gc --follow): nothing before its interval, the log's files folded into one
    when due, and a compaction that fails is logged and waits for its next turn."""
    from falkirk.config import load
    from falkirk.io.lake import COMPACT_MIN_FILES

    cfg = replace(load(), lake=str(tmp_path / "lake"))
    log = EpochLog.from_config(cfg)
    for k in range(COMPACT_MIN_FILES + 1):  # an append, a file
        relay_epochs(log, range(k, k + 1))
    uri = log.uri("epochs")
    files = len(DeltaTable(uri).file_uris())
    assert files > COMPACT_MIN_FILES
    assert Housekeeping(RELAY, cfg, log, compact_every_s=3600, gc_every_s=0).step() is None
    assert len(DeltaTable(uri).file_uris()) == files  # not due yet
    Housekeeping(RELAY, cfg, log, compact_every_s=3600, gc_every_s=0, at_once=True).step()
    assert len(DeltaTable(uri).file_uris()) == 1

    def broken() -> dict:
        raise OSError("the store is away")

    monkeypatch.setattr(log, "compact", broken)
    house = Housekeeping(RELAY, cfg, log, compact_every_s=0, gc_every_s=0)
    assert house.step() is None
    assert "compacting the epoch log failed" in caplog.text


def test_the_epoch_log_keeps_each_regions_rows_from_what_a_rollback_may_still_need():
    """A region's rows go from the oldest of: its low watermark; for a stateful region the
    oldest checkpoint kept (retain_checkpoints older than the newest at or below its
    watermark); the epoch after each receiver's watermark, less the edge's delay (the
    receiver, restored there, finds the sender's epochs by their rows)."""
    from falkirk.log.epochlog import RegionLog
    from falkirk.model.times import DOMAINS
    from falkirk.recovery.gc import log_keep_from

    pipe = Pipeline.from_dict({**PIPE_DICT, "regions": {
        name: {**spec, "retain_checkpoints": 1} if spec["regime"] in ("lazy", "eager")
        else spec for name, spec in PIPE_DICT["regions"].items()}})
    logs = {name: RegionLog(name, DOMAINS[spec.domain]) for name, spec in pipe.regions.items()}
    for name, spec in pipe.regions.items():
        dom = DOMAINS[spec.domain]
        for k in range(12):
            ref = f"checkpoint:{k}" if spec.keeps_state and k % 3 == 0 else None
            status = "checkpointed" if ref else "committed"
            logs[name].entries[dom.parse(k)] = EpochRecord(pipe.name, name, k, 0, status,
                                                           state_ref=ref)
    done = dict.fromkeys(pipe.regions, 10)
    keep = log_keep_from(pipe, logs, done)
    stateful = [n for n, s in pipe.regions.items() if s.keeps_state]
    assert stateful and all(keep[n] == 6 for n in stateful)  # checkpoints 9 and 6 kept
    sender = next(e for e in pipe.edges.values() if e.src is not None and e.dst is not None)
    behind = {**done, sender.dst: 2}
    assert log_keep_from(pipe, logs, behind)[sender.src] == min(3 - sender.delay,
                                                                keep[sender.src])
    assert log_keep_from(pipe, logs, dict.fromkeys(pipe.regions, -1)) == dict.fromkeys(
        pipe.regions, -1)
