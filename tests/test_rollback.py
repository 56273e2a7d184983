"""The rollback executor on a real epoch log and real delta-spark tables, on the small
pipeline of tests/tiny_pipeline.py."""

from __future__ import annotations

import os
import socket

import pytest
from deltalake import DeltaTable
from tiny_pipeline import PIPE

from falkirk.airflow.render import plan_markdown
from falkirk.io.lake import read_table
from falkirk.recovery.lease import Lease, current
from falkirk.recovery.rollback import RollbackError, RollbackRequest


def epochs_in(cfg, table: str) -> list[int]:
    return sorted(read_table(cfg.table(table))["epoch"].to_pylist())


def test_dry_run_prints_the_plan_and_changes_nothing(world):
    cfg, log, executor, stopped = world
    rows_before = len(log.records("tiny"))
    versions = {t: DeltaTable(cfg.table(t)).version() for t in ("t_in", "t_mid", "t_out")}
    plan = executor.run(RollbackRequest("tiny", region="agg", to_epoch=3, dry_run=True))
    assert plan.frontiers == {"ingest": "top", "agg": 3, "report": 3}
    assert [(t.table, t.to_version) for t in plan.tables] == [("t_mid", 4), ("t_out", 4)]
    assert len(log.records("tiny")) == rows_before
    assert {t: DeltaTable(cfg.table(t)).version() for t in versions} == versions
    assert stopped == [] and log.rollbacks("tiny") == []


def test_rollback_restores_tables_invalidates_and_bumps_the_generation(world):
    cfg, log, executor, stopped = world
    plan = executor.run(RollbackRequest("tiny", region="agg", to_epoch=3,
                                        reason="agg's epoch 4 was wrong", dry_run=False))
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
    # agg read epochs 3, 4 of t_in that ingest will send again: it goes back to epoch 2,
    # its checkpoint at 1 and epoch 2 replayed (t_in's epoch 2 stays); report (unlogged
    # from agg) with it.
    assert plan.frontiers == {"ingest": 2, "agg": 2, "report": 2}
    assert epochs_in(cfg, "t_in") == [0, 1, 2]
    assert epochs_in(cfg, "t_mid") == [0, 1, 2]


def test_a_dead_job_with_a_lazy_region_replays_and_moves_nothing_else(world):
    """agg's job (agg and report) died after both committed epoch 4. agg's input t_in is
    another job's table, so agg can reach epoch 4 again from its checkpoint at 3 by
    replaying t_in's epoch 4 for its state only: its frontier is 4, no table is restored
    to an earlier version, no epoch is invalidated, and ingest keeps running."""
    cfg, log, executor, stopped = world
    plan = executor.run(RollbackRequest("tiny", failed=["agg", "report"], reason="died",
                                        dry_run=False))
    assert plan.frontiers == {"ingest": "top", "agg": 4, "report": 4}
    assert plan.restarts_from == {"agg": 3}
    assert plan.invalidate == [] and stopped == [{"agg", "report"}]
    assert "| agg | lazy | epoch 4 | epoch 4 | restarts from epoch 3, replays to its " \
           "frontier for its state, reruns |" in plan_markdown(plan.to_json(), PIPE)
    assert epochs_in(cfg, "t_mid") == [0, 1, 2, 3, 4] == epochs_in(cfg, "t_out")
    regions = log.regions(PIPE)
    assert regions["agg"].restorable("lazy")[-1].time == 3  # a restart restores epoch 3
    assert log.generation("tiny") == plan.generation == 1


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


def test_a_second_rollback_from_another_machine_is_refused_while_one_runs(world):
    """The lease lives in the epoch log: a holder on another host (which a lock file in this
    machine's var/ would never see) keeps a second rollback out until its lease ends."""
    _, log, executor, _ = world
    other = Lease(log, "tiny", "rollback")
    other.holder = {"host": "worker-2", "pid": os.getpid(), "started": 0.0}
    other.offer()
    assert other.settle() is None
    with pytest.raises(RollbackError, match="already running .*pid .* on worker-2, lease "
                                            "until"):
        executor.run(RollbackRequest("tiny", failed=["agg"], reason="x", dry_run=False))


def test_two_offers_settle_on_one_holder_whatever_the_order_they_read(world):
    """Forced interleaving: both contenders append their offer before either reads."""
    _, log, _, _ = world
    first, second = Lease(log, "tiny", "rollback"), Lease(log, "tiny", "rollback")
    first.offer()
    second.offer()
    beaten = second.settle()  # the later offer reads first, and loses
    assert beaten is not None and beaten.token == first.token
    assert first.settle() is None
    assert current(log.lease_rows("tiny", "rollback")).token == first.token


def test_an_expired_lease_of_another_host_is_taken_over(world):
    _, log, executor, _ = world
    gone = Lease(log, "tiny", "rollback", ttl_s=0.0)  # expired as soon as offered
    gone.holder = {"host": "worker-2", "pid": 1, "started": 0.0}
    gone.offer()
    assert gone.settle() is None
    plan = executor.run(RollbackRequest("tiny", failed=["agg"], reason="x", dry_run=False))
    assert plan.generation == 1
    assert current(log.lease_rows("tiny", "rollback")) is None  # released at the end


def test_a_crashed_rollback_is_resumed_to_the_same_end_state(world, tmp_path):
    cfg, log, executor, _ = world
    # A rollback that recorded its plan, restored one table, then died (its lock is stale).
    plan = executor.plan(RollbackRequest("tiny", region="agg", to_epoch=3, reason="agg died",
                                         dry_run=False))
    log.record_rollback("tiny", plan.rollback_id, plan.generation, "started",
                        {**plan.request.__dict__}, plan.to_json())
    from falkirk.io.delta import rollback_table

    rollback_table(cfg.table("t_mid"), plan.tables[0].to_version)
    dead = Lease(log, "tiny", "rollback")  # its holder: a pid of this host, not running
    dead.holder = {"host": socket.gethostname(), "pid": 2**22 + 12345, "started": 0.0}
    dead.offer()
    assert dead.settle() is None
    # A newer request waits for that plan to be resumed and finished, then is planned from
    # the log as the resumed one left it (not silently replaced, not run over it).
    said: list[str] = []
    newer = executor.run(RollbackRequest("tiny", region="agg", to_epoch=1, reason="again",
                                         dry_run=False), progress=said.append)
    assert any(f"rollback {plan.rollback_id} ('agg died') had crashed and was resumed first"
               in m for m in said), said
    assert newer.rollback_id != plan.rollback_id and newer.generation == 2
    assert epochs_in(cfg, "t_mid") == [0, 1] and epochs_in(cfg, "t_out") == [0, 1]
    assert log.generation("tiny") == 2
    rows = [(r["rollback_id"], r["status"]) for r in log.rollbacks("tiny")]
    assert rows == [(plan.rollback_id, "started"), (plan.rollback_id, "done"),
                    (newer.rollback_id, "started"), (newer.rollback_id, "done")]
    assert current(log.lease_rows("tiny", "rollback")) is None


def test_an_epoch_committed_before_the_stop_is_in_the_plan_carried_out(world, spark):
    """Forced interleaving: agg and report commit epoch 5 after a first plan was made and
    before their jobs stop (the stop hook commits it, as the job would), in a rollback of
    agg to epoch 3. The plan carried out is made after the stop, so epoch 5 is
    invalidated, never left `committed` over rows the restore removed."""
    from tiny_pipeline import SCHEMA

    from falkirk.io.delta import EpochWriter
    from falkirk.log.epochlog import EpochRecord

    cfg, log, executor, _ = world
    stops: list[set] = []

    def commit_epoch_5_then_stop(regions: set[str]) -> None:
        if not stops:  # the jobs finish one more epoch before they die
            rows = []
            for region, table in (("agg", "t_mid"), ("report", "t_out")):
                frame = spark.createDataFrame([(5, f"{table}5")], "epoch long, value string")
                version = EpochWriter(spark, cfg.table(table), region, 0, SCHEMA).write_epoch(
                    frame, 5).version
                rows.append(EpochRecord("tiny", region, 5, 0, "committed",
                                        state_ref="checkpoint:5" if region == "report" else None,
                                        outputs={table: {"table": table, "version": version}}))
            log.record(*rows)
        stops.append(set(regions))

    executor.stop_regions = commit_epoch_5_then_stop
    plan = executor.run(RollbackRequest("tiny", region="agg", to_epoch=3,
                                        reason="agg's epoch 4 was wrong", dry_run=False))
    assert stops[0] == {"agg", "report"}
    assert {(i["region"], i["time"]) for i in plan.invalidate} >= {("agg", 5), ("report", 5)}
    regions = log.regions(PIPE)
    assert max(regions["agg"].entries) == 3 and max(regions["report"].entries) == 3
    assert epochs_in(cfg, "t_mid") == [0, 1, 2, 3] and epochs_in(cfg, "t_out") == [0, 1, 2, 3]


def test_a_plan_that_moved_since_it_was_confirmed_is_refused(world):
    cfg, log, executor, _ = world
    versions = {t: DeltaTable(cfg.table(t)).version() for t in ("t_in", "t_mid", "t_out")}
    with pytest.raises(RollbackError, match=r"the plan changed since it was confirmed.*"
                                            r'"agg": \{"confirmed": 1, "now": 4\}'):
        executor.run(RollbackRequest("tiny", failed=["agg"], reason="x", dry_run=False),
                     confirmed={"ingest": "top", "agg": 1, "report": 1})
    assert {t: DeltaTable(cfg.table(t)).version() for t in versions} == versions
    assert [r["status"] for r in log.rollbacks("tiny")] == []


def test_fenced_regions_may_not_record_and_restarted_jobs_are_not_fenced(world):
    """The fence a rollback records before it stops jobs: jobs of the old generation
    hosting a fenced region are refused; the generation moves on with the fence, so jobs
    started afterwards (even if the rollback crashed right after fencing) are not."""
    from falkirk import faults
    cfg, log, executor, stopped = world
    assert log.fenced("tiny", ["agg", "report"], 0) is None
    os.environ[faults.ENV] = "rollback:before-stop"
    try:
        import subprocess
        import sys
        import textwrap

        code = textwrap.dedent(f"""
            import sys; sys.path.insert(0, {str(os.path.dirname(__file__))!r})
            from dataclasses import replace
            from pathlib import Path
            from falkirk.config import load
            from falkirk.log.epochlog import EpochLog
            from falkirk.recovery.rollback import RollbackExecutor, RollbackRequest
            from tiny_pipeline import PIPE
            cfg = replace(load(), lake={cfg.lake!r})
            RollbackExecutor(PIPE, cfg, EpochLog.from_config(cfg), stop_regions=print).run(
                RollbackRequest("tiny", region="agg", to_epoch=3, reason="x", dry_run=False))
        """)
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=120)
    finally:
        del os.environ[faults.ENV]
    assert proc.returncode == -9, proc.stderr[-2000:]
    assert log.fenced("tiny", ["agg"], 0) == 1 and log.fenced("tiny", ["report"], 0) == 1
    assert log.fenced("tiny", ["ingest"], 0) is None  # not taken back
    assert log.fenced("tiny", ["agg"], log.generation("tiny")) is None  # a restarted job
    assert log.unfinished_rollback("tiny") is None  # nothing was planned: nothing to resume
