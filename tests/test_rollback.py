"""The rollback executor on a real epoch log and real delta-rs tables (no Spark needed),
on the small pipeline of tests/tiny_pipeline.py."""

from __future__ import annotations

import json
import os

import pytest
from deltalake import DeltaTable
from tiny_pipeline import PIPE

from falkirk.lake import read_table
from falkirk.rollback import RollbackError, RollbackRequest


def epochs_in(cfg, table: str) -> list[int]:
    return sorted(read_table(cfg.table(table))["epoch"].to_pylist())


def test_dry_run_prints_the_plan_and_changes_nothing(world):
    cfg, log, executor, stopped = world
    rows_before = len(log.records("tiny"))
    versions = {t: DeltaTable(cfg.table(t)).version() for t in ("t_in", "t_mid", "t_out")}
    plan = executor.run(RollbackRequest("tiny", failed=["agg"], dry_run=True))
    assert plan.frontiers == {"ingest": "top", "agg": 3, "report": 3}
    assert [(t.table, t.to_version) for t in plan.tables] == [("t_mid", 4), ("t_out", 4)]
    assert len(log.records("tiny")) == rows_before
    assert {t: DeltaTable(cfg.table(t)).version() for t in versions} == versions
    assert stopped == [] and log.rollbacks("tiny") == []


def test_rollback_restores_tables_invalidates_and_bumps_the_generation(world):
    cfg, log, executor, stopped = world
    plan = executor.run(RollbackRequest("tiny", failed=["agg"], reason="agg died",
                                        dry_run=False))
    assert stopped == [{"agg", "report"}]
    assert epochs_in(cfg, "t_mid") == [0, 1, 2, 3] and epochs_in(cfg, "t_out") == [0, 1, 2, 3]
    assert epochs_in(cfg, "t_in") == [0, 1, 2, 3, 4, 5]  # ingest kept its live state
    regions = log.regions(PIPE)
    assert max(regions["agg"].entries) == 3 and max(regions["report"].entries) == 3
    assert log.generation("tiny") == plan.generation == 1
    assert [r["status"] for r in log.rollbacks("tiny")] == ["started", "done"]
    assert plan.rerun == [{"region": "agg", "after": 3, "through": 4},
                          {"region": "report", "after": 3, "through": 4}]


def test_going_back_on_purpose_to_an_epoch(world):
    cfg, log, executor, _ = world
    plan = executor.run(RollbackRequest("tiny", region="ingest", to_epoch=2,
                                        reason="bad deploy after epoch 2", dry_run=False))
    # agg read epochs 3, 4 of t_in that ingest will send again: it goes back to its
    # checkpoint at 1; report (unlogged from agg) with it.
    assert plan.frontiers == {"ingest": 2, "agg": 1, "report": 1}
    assert epochs_in(cfg, "t_in") == [0, 1, 2]
    assert epochs_in(cfg, "t_mid") == [0, 1]


@pytest.mark.parametrize("request_args, words", [
    ({"failed": ["nope"]}, "has no region(s) ['nope']"),
    ({"region": "ingest", "to_epoch": 9}, "has not reached epoch 9"),
    ({"region": "ingest", "to_epoch": -4}, "to_epoch must be ≥ -1"),
    ({"failed": ["agg"], "reason": "  "}, "give a reason"),
    ({}, "say which regions failed"),
])
def test_bad_requests_are_refused_before_anything_changes(world, request_args, words):
    cfg, log, executor, stopped = world
    rows_before = len(log.records("tiny"))
    args = {"reason": "test", **request_args}
    with pytest.raises(RollbackError) as err:
        executor.run(RollbackRequest("tiny", dry_run=False, **args))
    assert words in str(err.value)
    assert len(log.records("tiny")) == rows_before and stopped == []


def test_a_second_rollback_is_refused_while_one_runs(world, tmp_path):
    _, _, executor, _ = world
    lock = tmp_path / "locks" / "tiny.rollback.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.write_text(json.dumps({"pid": os.getppid(), "host": os.uname().nodename}))
    with pytest.raises(RollbackError, match="already running"):
        executor.run(RollbackRequest("tiny", failed=["agg"], reason="x", dry_run=False))


def test_a_crashed_rollback_is_resumed_to_the_same_end_state(world, tmp_path):
    cfg, log, executor, _ = world
    # A rollback that recorded its plan, restored one table, then died (its lock is stale).
    plan = executor.plan(RollbackRequest("tiny", failed=["agg"], reason="agg died",
                                         dry_run=False))
    log.record_rollback("tiny", plan.rollback_id, plan.generation, "started",
                        {**plan.request.__dict__}, plan.to_json())
    from falkirk.delta import rollback_table

    rollback_table(cfg.table("t_mid"), plan.tables[0].to_version)
    lock = tmp_path / "locks" / "tiny.rollback.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.write_text(json.dumps({"pid": 2**22 + 12345, "host": os.uname().nodename}))
    # Running a rollback again resumes that plan, not a new one.
    resumed = executor.run(RollbackRequest("tiny", failed=["agg"], reason="again",
                                           dry_run=False))
    assert resumed.rollback_id == plan.rollback_id
    assert epochs_in(cfg, "t_mid") == [0, 1, 2, 3] and epochs_in(cfg, "t_out") == [0, 1, 2, 3]
    assert log.generation("tiny") == 1
    assert [r["status"] for r in log.rollbacks("tiny")] == ["started", "done"]
    assert not lock.exists()
