"""A short fault campaign (CI's variant of ``falkirk chaos``): one run of the reference
pipeline, jobs, rollbacks and the broker killed at seeded moments, every output compared
with a failure-free run's (the session's shared one: the campaign runs on the same
input), every message on the output topics counted."""

from __future__ import annotations

import random
import time
from types import SimpleNamespace

import pytest
from reference_runs import INPUT

from falkirk_dev import chaos_airflow
from falkirk_dev.chaos import campaign, outcome, recovery_svg
from falkirk_dev.chaos_airflow import airflow_campaign


@pytest.mark.slow
@pytest.mark.system
def test_a_short_campaign_loses_duplicates_and_sticks_nothing(golden, tmp_path):
    result = campaign(tmp_path, minutes=1.5, seed=2, data=INPUT, say=print, golden=golden)
    assert result["kills"] >= 1, result["events"]
    assert result["rollbacks"] >= 1 or set(result["kills_by_target"]) == {"broker"}
    for kill in result["events"]:  # a recovery's parts (from the epoch log) add up to it
        if "parts" in kill:
            assert abs(sum(kill["parts"].values()) - kill["recovery_s"]) < 0.05, kill
    assert any("parts" in kill for kill in result["events"]), result["events"]
    summary = {k: result[k] for k in ("lost", "duplicated", "stuck", "changed_on_resend",
                                      "outputs_differ")}
    assert summary == {"lost": 0, "duplicated": 0, "stuck": 0, "changed_on_resend": 0,
                       "outputs_differ": []}, result
    # every recovery says where its time went (the campaign's profile of recovery)
    recovered = [k for k in result["events"] if k.get("recovery_s") is not None
                 and "parts" in k]
    if result["rollbacks"]:
        assert recovered, result["events"]
        assert {"detect_s", "rollback_s", "start_s", "catch_up_s"} <= set(
            result["recovery_parts_s_p50"]), result["recovery_parts_s_p50"]
        for k in recovered:
            assert all(v >= 0 for v in k["parts"].values()), k


@pytest.mark.slow
@pytest.mark.system
def test_under_airflow_kills_in_the_middle_of_a_recovery_are_recovered_too(golden, tmp_path):
    """CI's variant of ``falkirk chaos --airflow --every``: a local Airflow runs the
    pipeline. Its scheduler (with its executor and tasks) and a stream job are SIGKILLed
    together, the scheduler is started again seconds later; once the epoch log shows that
    kill's rollback done and its regions not committed again, another stream job is
    SIGKILLed (forced mid-recovery: on a clock of 10 s on average, the second strike
    once came 13.1 s after the first, whose recovery had ended at 12.6 s). The streams
    supervisor (its watch deferred to the triggerer, which outlived the scheduler; a job
    dead since its last watch rolled back by its next start step) recovers both, and the
    run ends with the failure-free outputs, every message on the output topics counted.
    The input is produced at a steady rate (all of it waiting, the batch region now takes
    every ready epoch in one run, and the run ended before a strike)."""
    from rich.console import Console

    result = airflow_campaign(tmp_path, minutes=5, seed=1, data=INPUT, console=Console(),
                              golden=golden, targets=("scheduler", "job"), strikes=2,
                              every_s=10.0, mid_recovery=True, rate=20.0)
    first, second = result["events"]
    assert (first["target"], second["target"]) == ("scheduler", "job"), result["events"]
    assert first["recovery_s"] is not None and second["recovery_s"] is not None, result
    assert second["at"] < first["at"] + first["recovery_s"]  # it came mid-recovery
    for kill in (first, second):
        assert kill.get("rollback_done_s", 0) <= kill["recovery_s"], kill
    for kill in result["events"]:  # a recovery's parts (from the epoch log) add up to it
        if "parts" in kill:
            assert abs(sum(kill["parts"].values()) - kill["recovery_s"]) < 0.05, kill
    assert any("parts" in kill for kill in result["events"]), result["events"]
    summary = {k: result[k] for k in ("lost", "duplicated", "stuck", "changed_on_resend",
                                      "outputs_differ")}
    assert summary == {"lost": 0, "duplicated": 0, "stuck": 0, "changed_on_resend": 0,
                       "outputs_differ": []}, result


@pytest.mark.slow
@pytest.mark.system
def test_under_airflow_the_engine_killed_under_every_job_is_recovered(golden, tmp_path):
    """CI's variant of the campaign's ``engine`` target: the local Spark Connect engine
    every stream job is a client of is SIGKILLed while they run. Every session is gone
    with it; the kill is recovered (with a rollback where a job failed, without one where
    the jobs had nothing in their sessions yet), a new engine answers, and the run ends
    with the failure-free outputs, every message on the output topics counted. The input
    is produced at a steady rate while the pipeline runs (``--rate``), kill included: the
    outputs do not depend on the pace."""
    from rich.console import Console

    from falkirk.config import load
    from falkirk.runtime.engine import status

    result = airflow_campaign(tmp_path, minutes=5, seed=1, data=INPUT, console=Console(),
                              golden=golden, targets=("engine",), strikes=1, rate=30.0)
    assert result["input_rate"] == 30.0
    (kill,) = result["events"]
    assert kill["target"] == "engine" and kill["recovery_s"] is not None, kill
    after = status(load())
    assert after["answering"] and after["pid"] not in (None, kill["pid"]), (after, kill)
    summary = {k: result[k] for k in ("lost", "duplicated", "stuck", "changed_on_resend",
                                      "outputs_differ")}
    assert summary == {"lost": 0, "duplicated": 0, "stuck": 0, "changed_on_resend": 0,
                       "outputs_differ": []}, result


class _Clock:
    """A monotonic clock the test moves; the campaign's sleeps move it too."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


def _campaign_on_a_log(monkeypatch) -> tuple[chaos_airflow.AirflowCampaign, list, _Clock]:
    """An AirflowCampaign over an epoch log the test appends to (no Airflow, no jobs)."""
    clock, records = _Clock(), []
    monkeypatch.setattr(chaos_airflow.time, "monotonic", clock)
    monkeypatch.setattr(chaos_airflow.time, "sleep", clock.sleep)
    log = SimpleNamespace(records=lambda name: list(records), rollbacks=lambda name: [],
                          job_runs=lambda name: {})
    run = SimpleNamespace(log=log, pipeline=SimpleNamespace(
        name="reference", regions={"ingest": None, "communities": None}))
    demo = SimpleNamespace(run=run, check_failures=lambda progress: None,
                           progress=lambda airflow: {})
    c = chaos_airflow.AirflowCampaign(demo, random.Random(0), lambda m: None,
                                      every_s=15.0)
    c.all_done = lambda: False
    return c, records, clock


def _broker_kill(c, records, clock) -> dict:
    kill = {"target": "broker", "at": clock(), "records_before": len(records),
            "wall": None, "rollbacks_before": 0}
    c._kill_recorded(kill)
    return kill


def test_a_stuck_kill_is_still_watched_and_its_late_recovery_counts_in_the_p95(monkeypatch):
    """A kill not recovered within the timeout is counted stuck, and stays watched: its
    recovery time when it comes (700 s here) is in the percentiles. Before, it was dropped
    from them, so a campaign whose slowest recoveries were stuck reported a p95 below them."""
    c, records, clock = _campaign_on_a_log(monkeypatch)
    kill = _broker_kill(c, records, clock)
    clock.now += chaos_airflow.RECOVERY_TIMEOUT_S + 1
    c.settle()
    assert c.stuck == 1 and kill["stuck"] and c.pending == [kill]
    assert c.recovering() == []  # a serial campaign strikes again meanwhile
    clock.now = kill["at"] + 700.0
    records.append(SimpleNamespace(region="ingest", generation=0, status="committed"))
    c.settle()
    assert c.pending == [] and kill["recovery_s"] == 700.0 and c.stuck == 1
    quick = {"target": "broker", "recovery_s": 10.0}
    figures = outcome([quick] * 19 + [kill], {}, {})
    assert figures["recovery_s_p95"] == 700.0, figures


def test_the_campaigns_chart_has_a_point_per_recovered_kill_by_target_and_the_goal():
    """The chart written beside the campaign's JSON: one point per recovered kill at the
    minute of its kill, a series per target, the 30-s goal line; a kill never recovered
    has no point, and the title counts it."""
    kills = [{"target": "job", "at": 100.0, "recovery_s": 20.0},
             {"target": "engine", "at": 160.0, "recovery_s": 55.0},
             {"target": "job", "at": 220.0, "recovery_s": 12.0},
             {"target": "broker", "at": 400.0, "recovery_s": None}]
    svg = recovery_svg({"events": kills, "recovery_s_p50": 20.0, "recovery_s_p95": 55.0})
    assert svg.count("<circle") == 3 and "<polyline" not in svg
    assert ">job<" in svg and ">engine<" in svg and ">broker<" not in svg
    assert "goal 30 s" in svg and "stroke-dasharray" in svg
    assert "4 kills" in svg and "1 not recovered" in svg
    assert ">55<" in svg  # the y axis runs to the slowest recovery
    assert ">2<" in svg  # the x axis to the minute of the last recovered kill: (220-100)/60


def test_strikes_begin_once_every_region_has_committed_an_epoch(monkeypatch):
    """A kill before the pipeline's first commits would time its start, not a recovery:
    the campaign strikes once every declared region committed (or checkpointed) an epoch,
    one gap after that, not one gap after it was made."""
    c, records, clock = _campaign_on_a_log(monkeypatch)
    assert not c.pipeline_running({"regions": {}})  # nothing logged yet
    assert not c.pipeline_running({"regions": {"ingest": ([0, 1], [])}})  # one silent
    assert not c.pipeline_running({"regions": {"ingest": ([0], []), "communities": ([], [0])}})
    assert c.pipeline_running({"regions": {"ingest": ([0], []), "communities": ([0], [1])}})
    clock.now += 600.0
    c.begin()
    assert clock() + 0.5 * 15.0 <= c.next_at <= clock() + 1.5 * 15.0


def test_a_kill_not_recovered_after_the_strikes_end_never_recovers(monkeypatch):
    """The drain waits for every pending kill, stuck ones too, but not forever: one still
    not recovered the timeout after the strikes ended is marked never recovered."""
    c, records, clock = _campaign_on_a_log(monkeypatch)
    kill = _broker_kill(c, records, clock)
    start = clock()
    c.drain()
    assert c.pending == [] and kill["never_recovered"] and kill["recovery_s"] is None
    assert c.stuck == 1
    assert chaos_airflow.RECOVERY_TIMEOUT_S < clock() - start < (
        chaos_airflow.RECOVERY_TIMEOUT_S + 2)


def test_a_recoverys_parts_split_out_the_wait_for_an_upstream_region_it_did_not_hit():
    """Where a serve kill's recovery went, from the epoch log: 3 s to the supervisor's
    rollback, 9 s more to the restarted job's start row, then 18 s waiting for popularity
    (not hit by the kill) to commit the epoch serve's first epoch reads (delay 1), then
    6 s to the commit of serve and 1 s to stats' (its co-hosted region, fed by serve within
    the epoch: no wait). A region the kill hit (here communities, moved by the same
    rollback) is part of the recovery, never counted as waiting."""
    from datetime import UTC, datetime, timedelta

    from falkirk.log.epochlog import EpochRecord
    from falkirk.model.topology import load_pipeline

    pipe = load_pipeline("reference")
    t0 = datetime(2026, 12, 4, tzinfo=UTC)

    def rec(region, epoch, s, generation=5, status="committed"):
        return EpochRecord("reference", region, epoch, generation, status,
                           recorded_at=t0 + timedelta(seconds=s))

    records = [rec("popularity", 8, -20, 4), rec("ingest", 9, -10, 4),
               rec("communities", [9, "inf"], -5, 4, "checkpointed"),
               rec("serve", 9, -2, 4), rec("stats", 9, -2, 4),
               rec("popularity", 9, 30, 4), rec("serve", 10, 36), rec("stats", 10, 37)]
    runs = [{"job": "jobs/serve.py", "status": "started", "generation": 5,
             "recorded_at": t0 + timedelta(seconds=12)}]
    kill = {"target": "job", "job": "jobs/serve.py", "regions": ["serve", "stats"],
            "wall": t0, "generation": 5, "rollback_done_s": 3.0, "recovery_s": 37.0,
            "watched": ["serve", "stats"]}
    parts = chaos_airflow.recovery_parts(kill, records, runs, pipe)
    assert parts == {"region": "stats", "epoch": 10, "waited_on": "popularity",
                     "resumed_in_place": [], "rollback_s": 3.0, "start_s": 9.0,
                     "waited_s": 18.0, "work_s": 7.0}

    # a job the rollback moved back that parked and resumed in its running driver
    parked = [*runs, {"job": "jobs/communities.py", "status": "parked", "generation": 4,
                      "recorded_at": t0 + timedelta(seconds=2)},
              {"job": "jobs/communities.py", "status": "resumed", "generation": 5,
               "recorded_at": t0 + timedelta(seconds=3)}]
    assert chaos_airflow.recovery_parts(kill, records, parked, pipe)["resumed_in_place"] == [
        "jobs/communities.py"]

    # communities' late commit (the kill's rollback moved it too) is recovery, not waiting
    moved = {**kill, "watched": ["communities", "serve", "stats"], "recovery_s": 40.0}
    later = [*records[:5], rec("communities", [10, "inf"], 34, 5, "checkpointed"),
             rec("serve", 11, 39), rec("stats", 11, 40)]
    parts = chaos_airflow.recovery_parts(moved, later, runs, pipe)
    assert parts["waited_s"] == 0.0 and parts["waited_on"] is None, parts
    assert parts["work_s"] == 40.0 - 3.0 - 9.0, parts

    # no rollback (a job killed before it started): nothing to split
    assert chaos_airflow.recovery_parts({**kill, "recovery_s": None}, records, runs,
                                        pipe) is None
    no_rollback = {k: v for k, v in kill.items() if k != "generation"}
    assert chaos_airflow.recovery_parts(no_rollback, records, runs, pipe) is None


def test_with_a_steady_input_the_wait_for_records_not_produced_yet_is_counted_apart():
    """With the input produced while the pipeline runs, an ingest killed while it waited
    for epoch 10's records (the producer closed epoch 10 on every partition 20 s after
    the kill) commits epoch 10 at 26 s: 2 s to the rollback, 2 s to the start, 16 s
    waiting for the records (from the start row to the input), 6 s of work. Without the
    producer's times the whole 24 s after the start is work, as before. A broker kill's
    next commit waits for its input alike; over every kill, recovery less waiting."""
    from datetime import UTC, datetime, timedelta

    from falkirk.log.epochlog import EpochRecord
    from falkirk.model.topology import load_pipeline

    pipe = load_pipeline("reference")
    t0 = datetime(2026, 12, 6, tzinfo=UTC)

    def rec(region, epoch, s, generation=7, status="committed"):
        return EpochRecord("reference", region, epoch, generation, status,
                           recorded_at=t0 + timedelta(seconds=s))

    records = [rec("ingest", 9, -30, 6), rec("ingest", 10, 26)]
    runs = [{"job": "jobs/ingest.py", "status": "started", "generation": 7,
             "recorded_at": t0 + timedelta(seconds=4)}]
    kill = {"target": "job", "job": "jobs/ingest.py", "regions": ["ingest"], "wall": t0,
            "generation": 7, "rollback_done_s": 2.0, "recovery_s": 26.0,
            "watched": ["ingest"], "records_before": 1}
    produced = {("events", 9): t0 - timedelta(seconds=35),
                ("events", 10): t0 + timedelta(seconds=20)}

    def ready(topic, epoch):
        return produced.get((topic, epoch))

    parts = chaos_airflow.recovery_parts(kill, records, runs, pipe, ready)
    assert (parts["waited_on"], parts["start_s"], parts["waited_s"], parts["work_s"]) == (
        "topic events", 2.0, 16.0, 6.0), parts
    blind = chaos_airflow.recovery_parts(kill, records, runs, pipe)
    assert (blind["waited_s"], blind["work_s"]) == (0.0, 22.0), blind

    broker = {"target": "broker", "wall": t0, "records_before": 1, "recovery_s": 26.0}
    assert chaos_airflow.broker_wait(broker, records, pipe, ready) == 20.0
    assert chaos_airflow.broker_wait(broker, records, pipe, None) == 0.0

    class Log:
        def records(self, name):
            return records

        def job_run_rows(self, name):
            return runs

    profiled = chaos_airflow._profile([dict(kill), dict(broker)], Log(), pipe, ready)
    assert profiled["recovery_less_waiting_s_p50"] == 8.0, profiled  # 10 and 6
    assert profiled["waited_on"] == {"topic events": 1}


def test_a_steady_input_closes_each_epoch_when_its_next_records_are_due(broker):
    """The steady producer (the real broker) sends every record, bounds the input once all
    are acknowledged, and keeps when each epoch's records were due whole on each topic:
    when the first record of a later epoch was handed over for every partition, in order
    of epochs, none before the producer got there."""
    from datetime import UTC, datetime

    from falkirk.io.kafka import end_offsets
    from falkirk.model.topology import load_pipeline
    from falkirk_dev import generate as G
    from falkirk_dev.harness import SteadyInput

    bounded = []
    run = SimpleNamespace(pipeline=load_pipeline("reference"),
                          cfg=SimpleNamespace(kafka_bootstrap=broker.bootstrap),
                          declare_bounds=lambda: bounded.append(datetime.now(UTC)) or {})
    steady = SteadyInput(run, 400.0, events=600, queries=60, epochs=4, seed=5)
    G.ensure_topics(broker.bootstrap, steady.partitions)  # (maybe another test's: counted)
    before = {t: end_offsets(broker.bootstrap, t) for t in (G.EVENTS_TOPIC, G.QUERIES_TOPIC)}
    started = datetime.now(UTC)
    steady.start()
    assert steady.ready_at(G.EVENTS_TOPIC, 3) is None  # the last epoch: only the bound
    deadline = time.monotonic() + 60
    while not steady.done:
        assert time.monotonic() < deadline, "the steady input did not end within 60 s"
        time.sleep(0.1)
    assert steady.info["sent"][G.EVENTS_TOPIC] and bounded, steady.info
    after = {t: end_offsets(broker.bootstrap, t) for t in before}
    assert sum(after[G.EVENTS_TOPIC].values()) - sum(before[G.EVENTS_TOPIC].values()) == 600
    assert sum(after[G.QUERIES_TOPIC].values()) - sum(before[G.QUERIES_TOPIC].values()) == 60
    for topic in (G.EVENTS_TOPIC, G.QUERIES_TOPIC):
        times = [steady.ready_at(topic, e) for e in range(4)]
        assert all(t is not None for t in times), times
        assert started < times[0] and times == sorted(times), times
        assert times[3] == steady.ended_at >= bounded[0]  # the last epoch: at its bound
        assert times[0] < times[2]  # spread over the production, not all at its end


def test_a_record_the_broker_stored_twice_is_told_from_a_loss_and_dead_letters_compare_as_sent(
        broker):
    """The campaign reads its input topics back (the real broker) against the records
    sent: a record stored twice is an extra copy at its offset, a record sent but absent
    is missing, and the dead letters compare as the input sent would have given them:
    the copy's dropped, later offsets in its partition moved back by one."""
    from kafka import KafkaProducer

    from falkirk.io.kafka import ensure_topics
    from falkirk_dev.harness import compare, input_as_stored

    topic = "stored-twice"
    ensure_topics(broker.bootstrap, {topic: 1})
    sent = [(b"k%d" % i, b"v%d" % i, 1_000 + i) for i in range(4)]
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all")
    for key, value, ts in [sent[0], sent[1], sent[1], sent[2]]:  # the 2nd stored twice,
        producer.send(topic, key=key, value=value, timestamp_ms=ts, partition=0).get(30)
    producer.close()  # and the 4th never arrives

    stored = input_as_stored(broker.bootstrap, {topic: sent})
    assert stored.extra == {(topic, 0): [2]} and stored.stored_twice == 1
    assert stored.missing == 1

    def letter(offset: int, raw: str) -> dict:
        return {"epoch": 0, "source": topic, "partition": 0, "offset": offset, "raw": raw,
                "reason": "malformed"}

    golden = {"dead_letters": [letter(1, "v1"), letter(2, "v2")]}
    as_stored = [letter(1, "v1"), letter(2, "v1"), letter(3, "v2")]
    assert compare(golden, {"dead_letters": as_stored})["dead_letters"] == {
        "rows": 2, "lost": 1, "duplicated": 2}  # by offset: as a loss and duplicates
    assert stored.as_sent(as_stored) == golden["dead_letters"]
    assert compare(golden, {"dead_letters": stored.as_sent(as_stored)})["dead_letters"] == {
        "rows": 2, "lost": 0, "duplicated": 0}


def test_a_batch_task_failed_for_good_fails_the_campaign_though_its_run_succeeded():
    """The campaign marks each batch run's data_checks skipped, so a run whose epoch task
    failed for good still ends `success`; the 30-minute campaign then waited forever for
    that epoch. The task's own state fails the campaign, naming it; so does a steady
    input's failed producer."""
    from falkirk_dev.demo.airflow import AirflowDemo
    from falkirk_dev.demo.base import DemoError

    demo = SimpleNamespace(api=SimpleNamespace(run_url=lambda dag, run: f"{dag}/{run}"),
                           home="airflow-home", steady=None)
    ok = {"batch": [{"dag_run_id": "scheduled__0", "state": "success"}],
          "supervisor": [], "supervisor_tasks": {}, "batch_failed_tasks": []}
    AirflowDemo.check_failures(demo, ok)
    failed = {**ok, "batch_failed_tasks": [{"task_id": "popularity", "state": "failed",
                                            "try_number": 9, "dag_run_id": "scheduled__0"}]}
    with pytest.raises(DemoError, match="popularity failed after 9 tries in run scheduled__0"):
        AirflowDemo.check_failures(demo, failed)

    # a steady input whose producer failed: the pipeline would wait for it forever
    from falkirk_dev.harness import SteadyInput

    demo.steady = SteadyInput.__new__(SteadyInput)
    demo.steady.error = TimeoutError("no broker answered within 120 s")
    with pytest.raises(RuntimeError, match="steady input's producer failed: TimeoutError"):
        AirflowDemo.check_failures(demo, ok)


def test_latency_after_each_kill_is_back_within_one_and_a_half_epochs_until_the_next():
    """A query every second for 6 minutes, answered 5 s later except for a minute after
    each of two kills (40 s late): the first kill's latency is back 60 s after it, the
    second's too; a kill whose lateness lasts past the next strike is not back."""
    from datetime import UTC, datetime

    start = 1_000_000.0
    kills_at = (60.0, 200.0)
    sent = {f"q{i}": start + i for i in range(360)}
    answered = {q: t + (40.0 if any(k <= t - start < k + 60 for k in kills_at) else 5.0)
                for q, t in sent.items()}
    kills = [{"target": "job", "wall": datetime.fromtimestamp(start + k, UTC)}
             for k in kills_at]
    out = chaos_airflow.latency_after_kills(kills, sent, answered, epoch_s=10.0)
    assert [k["latency_back_s"] for k in kills] == [60.0, 60.0]
    assert out["latency_back_s_p95"] == 60.0
    assert out["latency_not_back_before_next_strike"] == 0
    assert out["latency_p50_s"] == 5.0
    late = [{"target": "job", "wall": datetime.fromtimestamp(start + k, UTC)}
            for k in (60.0, 90.0)]  # the next strike before the first is back
    assert chaos_airflow.latency_after_kills(late, sent, answered, 10.0)[
        "latency_not_back_before_next_strike"] == 1


def test_a_kill_is_mid_pass_when_a_region_of_its_job_had_several_epochs_running():
    kills = [{"target": "job", "running_epochs": {"ingest": [7, 8, 9]}},
             {"target": "job", "running_epochs": {"serve": [4], "stats": [4]}},
             {"target": "job", "running_epochs": {}},
             {"target": "broker"}]
    assert chaos_airflow.kills_mid_pass(kills) == 1
