"""The reference pipeline on the real broker and Spark, with failures and rollbacks.

A golden failure-free run; then a region's job is killed with SIGKILL in the middle of
an epoch (the batch region after a lost broker, the lazy one after its first checkpoint),
the rollback executor plans from the epoch log and restores, the stopped jobs restart from
their frontiers, and the pipeline finishes: every output table and the latest response
per query id equal the golden run's (nothing lost, nothing doubled). One more run kills
the rollback itself half-way and runs it again. The default run (CI's) makes one of these
runs, the rollback DAG's; bin/test --full makes the other two.
"""

from __future__ import annotations

import json

import pytest
from reference_runs import EPOCHS, INPUT, assert_ranges_tile_the_input, assert_same, run_pipeline

from falkirk.local.broker import LocalBroker
from falkirk_dev.harness import LocalRun

pytestmark = [pytest.mark.slow, pytest.mark.system]


def assert_resent_with_a_newer_generation(sent, plan):
    """Counting every message, not the latest per key: answers of epochs serve redid after
    the rollback were sent again, each with the rollback's generation, and equal to the
    first ones (consumers that keep every message can drop a key's older generations)."""
    responses = sent["responses"]
    assert responses["resent_same_generation"] == 0, responses
    assert set(responses["resent_by_generation"]) <= {str(plan.generation)}, responses
    assert responses["changed"] == 0, responses
    if plan.frontiers.get("serve", "top") == "top":
        assert responses["resent"] == 0, responses  # serve did not go back: nothing re-sent




# Each kill here is a whole run (~3-4.5 min of CI), so the kills are spread over the suite:
# the broker and then the lazy region after its first checkpoint and a commit since
# (communities mid-epoch 4: a replay frontier) in the rollback DAG's run below; the batch
# region after a lost broker and a rollback crashed half-way in bin/test --full;
# communities before its checkpoint (mid-epoch 0) in tests/test_trials.py's trial;
# popularity's rerun after a quarantined epoch in tests/test_checks.py; jobs at random in
# tests/test_chaos.py; each compared with a failure-free run.
@pytest.mark.full(reason=(
    "a whole run (~4.5 min on a slow CI machine); in the default run the broker is "
    "SIGKILLed under the pipeline before the rollback DAG's kill below, the campaign "
    "(tests/test_chaos.py) kills jobs at random, and tests/test_checks.py rolls popularity "
    "back and reruns it"))
def test_a_broker_lost_then_the_batch_region_killed_mid_epoch_then_roll_back(golden,
                                                                            tmp_path):
    """Apache Kafka is SIGKILLed while ingest is in epoch 1 and started again on the same
    ports: the jobs ride it out (their broker questions are retried, the connector's reads
    and acks=all sends wait for it), no job fails of it (run_pipeline asserts it before
    the kill and every job's exit 0 at the end). Then popularity is killed mid-epoch 2 and
    rolled back: it goes back to its newest restorable frontier before the kill and
    nothing else needs to move (stats, in serve's job, may); every output equals the
    failure-free run."""
    outputs, plan, sent = run_pipeline(tmp_path, kill=("popularity", 2),
                                       crash_broker=("ingest", 1))
    assert_same(golden, outputs)
    assert_resent_with_a_newer_generation(sent, plan)
    latest = {r: (times[-1] if times else -1) for r, times in plan.restorable_before.items()}
    assert plan.frontiers["popularity"] == latest["popularity"]
    moved = {r for r, f in plan.frontiers.items() if f != "top"}
    assert moved <= {"popularity", "stats"}, plan.frontiers


@pytest.mark.full(reason=(
    "a whole run (~4.5 min on a slow CI machine); the default run kills a rollback at the same "
    "point and runs it again on the small world (tests/test_rollback.py::"
    "test_a_crashed_rollback_is_resumed_to_the_same_end_state), and kills communities "
    "after its checkpoint in the rollback DAG's run below"))
def test_a_rollback_killed_half_way_and_run_again_ends_in_the_same_state(golden, tmp_path):
    outputs, plan, sent = run_pipeline(tmp_path, kill=("communities", 3), crash_rollback=True)
    assert plan.frontiers["communities"] == [2, "inf"]
    assert_same(golden, outputs)
    assert_resent_with_a_newer_generation(sent, plan)


def test_the_rollback_dag_after_a_killed_region_ends_like_the_failure_free_run(
        golden, tmp_path, monkeypatch, rollback_dag):
    """What an operator does from the UI, run with Airflow's own test runner, after the
    broker was SIGKILLed while ingest was in epoch 1 and started again on the same ports
    (the jobs ride it out: their broker questions are retried, the connector's reads and
    acks=all sends wait for it; no job may fail of it): communities is killed mid-epoch;
    a falkirk_reference_rollback run (dry_run false) plans, pauses the affected streams,
    rolls back, restarts them and validates; the pipeline then finishes. Communities dies
    after an epoch committed since its checkpoint: the job restarted redoes it from the
    checkpoint for its state only, and the outputs still equal the failure-free run's."""
    import time

    from falkirk.runtime import procs
    with LocalBroker(tmp_path / "broker") as b, LocalRun(tmp_path, broker=b) as run:
        # Epoch by epoch: the kill lands between communities' commits, after its
        # checkpoint (tests/test_passes.py and the campaign kill in the middle of passes).
        run.env = {**run.env, "FALKIRK_MAX_PASS": "1"}
        for key, value in run.env.items():  # the DAG's tasks read the sandbox's config
            monkeypatch.setenv(key, value)
        run.generate(**INPUT)
        run.start(until_epoch=EPOCHS - 1)
        run.wait_for(lambda: run.epoch_running("ingest", 1), timeout_s=900,
                     what="ingest in the middle of epoch 1")
        b.restart(crash=True)  # the jobs ride it out: none may fail of it
        run.wait_for(lambda: run.epoch_running("communities", 4), timeout_s=900,
                     what="communities in the middle of epoch 4")
        ended = run.failed_jobs()
        assert not ended, {j: (c, str(run.log_file(j))) for j, c in ended.items()}
        run.kill("jobs/communities.py")
        committed = run.log.regions(run.pipeline)["communities"].entries
        last = max(k[0] for k, r in committed.items() if r.status == "committed")
        dagrun = rollback_dag.test(run_conf={
            "pipeline": "reference", "failed_regions": ["communities"], "dry_run": False,
            "reason": "test: communities killed"}, logical_date=None)
        states = {ti.task_id: ti.state for ti in dagrun.get_task_instances()}
        assert dagrun.state == "success", states
        rollbacks = run.log.rollbacks("reference")
        assert [r["status"] for r in rollbacks] == ["started", "done"]
        # Its checkpoint is epoch 2; it goes back to the epoch it last committed (3, or
        # 4 if the kill came after that commit), replaying the epochs after the
        # checkpoint for its state only, so serve, which read them, does not move.
        assert last >= 3
        frontiers = rollbacks[-1]["plan"]["frontiers"]
        assert frontiers["communities"] == [last, "inf"]
        assert frontiers["serve"] == frontiers["stats"] == "top", frontiers
        # The DAG restarted communities itself (a stream job: it runs until the input
        # ends); the jobs the harness started finish as they would have.
        moved = {r for r, f in rollbacks[-1]["plan"]["frontiers"].items() if f != "top"}
        codes = run.wait(timeout_s=1200)
        assert codes.pop("jobs/communities.py") == -9
        for job in [j for j, hosted in run.jobs.items() if set(hosted) & moved]:
            codes.pop(job, None)  # stopped by the DAG's pause, restarted by it
        assert set(codes.values()) <= {0}, {j: str(run.log_file(j)) for j in codes}
        deadline = time.monotonic() + 1200
        while procs.running(run.pipeline, run.cfg):
            assert time.monotonic() < deadline, procs.running(run.pipeline, run.cfg)
            time.sleep(2)
        assert_ranges_tile_the_input(run)
        assert_same(golden, run.outputs())
        # communities recovered (restored from its checkpoint of epoch 2) and, once caught
        # up, checkpointed its last epoch: a next kill would not redo the same epochs
        row = run.log.regions(run.pipeline)["communities"].entries[(EPOCHS - 1, float("inf"))]
        assert row.state_ref == f"checkpoint:{EPOCHS - 1}" and "caught up" in row.note, row


def test_the_golden_run_conserves_events_purchases_and_queries(golden, spark):
    """Valid events + dead letters = events produced; purchases per epoch = valid purchase
    events of that epoch; every query answered exactly once."""
    from falkirk.model.topology import load_pipeline
    from falkirk_dev import generate
    from falkirk_dev.harness import generate_args

    g, origin_ms, epoch_ms = generate.from_args(
        generate_args(load_pipeline("reference"), **INPUT))
    truth = generate.ground_truth(spark, g.events, origin_ms, epoch_ms)
    dead = [r for r in golden["dead_letters"] if r["source"] == "events"]
    # The generator's own count of what it broke or sent late (not the validation code's).
    assert len(dead) == sum(g.malformed.values()) + g.late
    assert truth.valid_total() + len(dead) == len(g.events)
    purchases: dict[int, int] = {}
    for row in golden["purchases"]:
        purchases[row["epoch"]] = purchases.get(row["epoch"], 0) + row["purchases"]
    assert purchases == {e: kinds["purchase"] for e, kinds in truth.valid.items()
                         if kinds.get("purchase")}
    # Clients keep the latest response per query id: one per query produced; and
    # query_stats counted each exactly once (per community, and per category).
    responses = golden["topic:responses"]
    assert set(responses) == {json.loads(v)["query_id"] for _, v, _ in g.queries}
    for dimension in ("community", "category"):
        answered = sum(r["answered"] for r in golden["query_stats"]
                       if r["dimension"] == dimension)
        assert answered == len(responses), dimension


def test_output_topics_are_made_with_their_declared_partitions(reference_run):
    """A job makes the topics it sends to as declared (``responses``: 3 partitions, with
    the profile's replicas) before its first send, instead of the broker auto-creating them
    with one partition."""
    from kafka import KafkaAdminClient

    declared = {e.topic: e.partitions for e in reference_run.pipeline.edges.values()
                if e.kind == "kafka" and e.src is not None}
    assert declared == {"responses": 3}
    admin = KafkaAdminClient(bootstrap_servers=reference_run.cfg.kafka_bootstrap)
    try:
        made = {t["name"]: len(t["partitions"]) for t in admin.describe_topics(list(declared))}
    finally:
        admin.close()
    assert made == declared


def test_each_epochs_log_line_says_where_its_spark_jobs_went(reference_run):
    """A job's log says, per epoch, the seconds and Spark jobs (a client of the engine:
    stages, what Spark Connect reports) of each phase (reads, transforms, commits,
    checkpoints, sends): a slow epoch under load is explained from the log alone. The
    phases' counts add up to the epoch's."""
    import re

    line = re.compile(
        r"epochs? ([\d-]+)(?: \(\d+ in one pass\))? done by (\S+) in [\d.]+ s \((\d+) "
        r"Spark (?:jobs|stages); (.*)\)$")
    seen = {}
    for job in reference_run.jobs:
        for text in reference_run.log_file(job).read_text().splitlines():
            m = line.search(text)
            if not m:
                continue
            phases = dict(re.findall(r"([\w +:]+?) [\d.]+ s/(\d+)(?:, |$)", m.group(4)))
            assert sum(int(n) for n in phases.values()) == int(m.group(3)), text
            seen.setdefault(m.group(2), set()).update(phases)
    assert set(seen) == {"ingest", "popularity", "communities", "serve+stats"}, seen
    assert {"process", "write stats", "send serve", "checkpoint stats"} <= seen["serve+stats"]
    assert {"process", "write communities"} <= seen["communities"]
