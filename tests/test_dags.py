"""The Airflow DAGs: they load, Airflow refuses bad rollback params before anything runs,
and a dry run shows the plan and changes nothing (dag.test on a sandbox epoch log)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from datetime import timedelta
from pathlib import Path

import pytest

from falkirk.local.airflow import DAGS_FOLDER

ROLLBACK = "falkirk_reference_rollback"
STREAMS = "falkirk_reference_streams"
BATCH = "falkirk_reference_batch_popularity"
STREAM_CHECKS = "falkirk_reference_stream_checks"
OUTPUTS = "falkirk_reference_outputs"
DAG_IDS = {ROLLBACK, BATCH, STREAMS, STREAM_CHECKS, OUTPUTS, "falkirk_reference_gc"}
CONSUMER = "reference_category_leaders"  # examples/reference/dags/: the pipeline's consumer


@pytest.fixture(scope="session")
def dagbag(airflow_env):
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(DAGS_FOLDER))


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """The reference pipeline's epoch log and tables after a few epochs, selected through
    the FALKIRK_* variables falkirk.config.load() reads."""
    from reference_world import make_reference_world

    cfg = make_reference_world(tmp_path)
    monkeypatch.setenv("FALKIRK_LAKE", cfg.lake)
    monkeypatch.setenv("FALKIRK_VAR_DIR", cfg.var_dir)
    return cfg


def test_every_dag_imports_with_tags_retries_and_docs(dagbag):
    assert dagbag.import_errors == {}
    assert set(dagbag.dags) == DAG_IDS | {CONSUMER}
    for dag in (dagbag.dags[d] for d in DAG_IDS):
        assert dag.tags and "falkirk" in dag.tags, dag.dag_id
        assert dag.default_args.get("retries", 0) >= 1, dag.dag_id
        assert dag.doc_md and len(dag.doc_md) > 200, dag.dag_id
    rollback = dagbag.dags[ROLLBACK]
    for param in ("Pipeline", "Regions", "Back to epoch", "Dry run", "Reason"):
        assert f"**{param}**" in rollback.doc_md
    assert rollback.max_active_runs == 1
    assert dagbag.dags[STREAMS].max_active_runs == 1


def test_a_supervisor_run_ends_with_its_recovery_so_the_next_death_is_watched(dagbag):
    """The streams DAG is @continuous with one run at a time: a run that stayed open after
    its recover (the stream checks sensor used to sit beside watch, waiting for the streams
    to end) left every later death unwatched. Its run is start, watch, recover and nothing
    else; the checks are a DAG of their own, which never ends because the streams ended."""
    streams = dagbag.dags[STREAMS]
    assert set(streams.task_ids) == {"start_streams", "watch", "recover"}
    assert streams.get_task("recover").upstream_task_ids == {"watch"}
    assert streams.get_task("watch").upstream_task_ids == {"start_streams"}
    checks = dagbag.dags[STREAM_CHECKS]
    assert set(checks.task_ids) == {"data_checks", "trigger_rollback"}
    assert checks.max_active_runs == 1 and STREAM_CHECKS in streams.doc_md


def test_the_stream_checks_validate_only_new_epochs_and_outlive_the_streams(sandbox,
                                                                           monkeypatch):
    """A poke runs ``falkirk validate`` (a Spark session) only when the epoch log has
    epochs no check judged; with none, and every stream job gone, it keeps waiting
    (ending would start run after run of the @continuous DAG)."""
    from falkirk.airflow import checks_tasks
    from falkirk.quality.checks import Validator

    ran: list[str] = []

    def validate(pipeline, epoch=None, region=None):
        ran.append(pipeline)
        return {"quarantined": [], "rollbacks": [], "epochs": []}

    monkeypatch.setattr(checks_tasks, "run_validate", validate)
    sensor = checks_tasks.EpochChecksSensor(task_id="data_checks", pipeline="reference")
    pending = Validator.pending
    assert sensor.poke({}) is False and ran == ["reference"]  # the sandbox's epochs
    monkeypatch.setattr(Validator, "pending", lambda self, logs=None: [])
    assert sensor.poke({}) is False and ran == ["reference"]  # nothing new: no validate
    monkeypatch.setattr(Validator, "pending", pending)
    monkeypatch.setattr(checks_tasks, "run_validate", lambda *a, **k: {
        "quarantined": [{"region": "communities", "epoch": 1}], "epochs": [],
        "rollbacks": [{"pipeline": "reference", "region": "communities", "to_epoch": 0}]})
    done = sensor.poke({})
    assert done.is_done and done.xcom_value == [
        {"pipeline": "reference", "region": "communities", "to_epoch": 0}]


CLICKS = """
pipeline: clicks
settings: {epoch_seconds: 5, origin_ms: 0}
regions:
  ingest: {regime: ephemeral, job: jobs/ingest.py}
  counts: {regime: batch, job: jobs/counts.py}
  totals: {regime: eager, job: jobs/totals.py}
edges:
  clicks: {kind: kafka, to: ingest, topic: clicks}
  clean:  {kind: delta, from: ingest, to: counts, table: clean}
  per_page: {kind: delta, from: counts, to: totals, table: per_page}
  user_totals: {kind: delta, from: totals, table: user_totals}
"""


def test_every_declared_pipeline_outside_the_checkout_gets_its_dags(airflow_env, tmp_path,
                                                                     monkeypatch):
    """A pipeline folder in $FALKIRK_PIPELINES shows up in Airflow with its own streams,
    batch (one per batch region), rollback and gc DAGs, no DAG file copied; a declaration
    that does not load gets none and leaves the others alone."""
    import json

    from airflow.dag_processing.dagbag import DagBag

    folder = tmp_path / "pipelines"
    clicks = folder / "clicks"
    (clicks / "jobs").mkdir(parents=True)
    (clicks / "schemas" / "tables").mkdir(parents=True)
    (clicks / "pipeline.yaml").write_text(CLICKS)
    for job in ("ingest", "counts", "totals"):
        (clicks / "jobs" / f"{job}.py").write_text("")
    for table in ("clean", "per_page", "user_totals"):
        (clicks / "schemas" / "tables" / f"{table}.json").write_text(json.dumps(
            {"table": table, "fields": [{"name": "epoch", "type": "int64"}]}))
    (folder / "broken.yaml").write_text(CLICKS.replace("clicks", "broken").replace(
        "jobs/", "missing/"))
    monkeypatch.setenv("FALKIRK_PIPELINES", str(folder))

    bag = DagBag(dag_folder=str(DAGS_FOLDER))
    assert bag.import_errors == {}
    assert set(bag.dags) == DAG_IDS | {CONSUMER} | {
        "falkirk_clicks_streams", "falkirk_clicks_batch_counts", "falkirk_clicks_rollback",
        "falkirk_clicks_gc", "falkirk_clicks_stream_checks", "falkirk_clicks_outputs"}
    batch = bag.dags["falkirk_clicks_batch_counts"]
    assert batch.get_task("counts").op_kwargs == {"pipeline": "clicks", "region": "counts"}
    assert batch.get_task("trigger_rollback").partial_kwargs["trigger_dag_id"] == \
        "falkirk_clicks_rollback"
    rollback = bag.dags["falkirk_clicks_rollback"]
    assert rollback.params["pipeline"] == "clicks"
    assert rollback.params.get_param("failed_regions").schema["items"]["enum"] == [
        "ingest", "counts", "totals"]
    streams = bag.dags["falkirk_clicks_streams"]
    assert streams.get_task("start_streams").op_kwargs == {"pipeline": "clicks"}
    assert "`jobs/ingest.py` (ingest)" in streams.doc_md


def _conf(**overrides):
    conf = {"pipeline": "reference", "failed_regions": ["communities"], "reason": "test"}
    conf.update(overrides)
    return {k: v for k, v in conf.items() if v is not ...}


@pytest.mark.parametrize("conf, names", [
    (_conf(failed_regions=["nope"]), "failed_regions: 'nope' is not one of"),
    (_conf(failed_regions=[]), "failed_regions: [] should be non-empty"),
    (_conf(to_epoch=-2), "to_epoch: -2 is less than the minimum of -1"),
    (_conf(to_epoch="3"), "to_epoch: '3' is not of type"),
    (_conf(to_epoch=2.5), "to_epoch: 2.5 is not of type"),
    (_conf(reason=...), "reason: No value passed"),
    (_conf(reason=""), "reason: '' should be non-empty"),
    (_conf(pipeline="other"), "pipeline: 'other' is not one of"),
], ids=["unknown-region", "no-region", "to-epoch-below-bottom", "to-epoch-string",
        "to-epoch-float", "no-reason", "empty-reason", "unknown-pipeline"])
def test_bad_params_are_refused_by_airflow_and_change_nothing(rollback_dag, sandbox, conf, names):
    from airflow.sdk.exceptions import ParamValidationError
    from reference_world import snapshot

    before = snapshot(sandbox)
    with pytest.raises(ParamValidationError) as err:
        rollback_dag.test(run_conf=conf, logical_date=None)
    assert f"Invalid input for param {names}" in str(err.value)
    assert snapshot(sandbox) == before


def test_future_to_epoch_is_refused_by_the_plan_and_changes_nothing(rollback_dag, sandbox):
    from reference_world import snapshot

    before = snapshot(sandbox)
    run = rollback_dag.test(
        run_conf=_conf(failed_regions=["ingest"], to_epoch=99, dry_run=False),
        logical_date=None)
    states = {ti.task_id: ti.state for ti in run.get_task_instances()}
    assert run.state == "failed"
    assert states["plan"] == "failed"
    assert states["roll_back"] in ("upstream_failed", None)
    assert snapshot(sandbox) == before


def test_region_of_another_pipeline_is_refused_before_anything_changes():
    from airflow.sdk.exceptions import AirflowFailException

    from falkirk.airflow.rollback_tasks import request_from_params

    with pytest.raises(AirflowFailException, match="has no region.*its regions are ingest"):
        request_from_params({"pipeline": "reference", "failed_regions": ["agg"],
                             "dry_run": True, "reason": "x"})
    with pytest.raises(AirflowFailException, match="exactly one region"):
        request_from_params({"pipeline": "reference", "failed_regions": ["ingest", "serve"],
                             "to_epoch": 2, "dry_run": True, "reason": "x"})


def test_dry_run_shows_the_plan_and_changes_nothing(rollback_dag, sandbox):
    from airflow import settings
    from reference_world import snapshot

    from falkirk.airflow.ui import page, run_plans

    before = snapshot(sandbox)
    run = rollback_dag.test(run_conf=_conf(to_epoch=2), logical_date=None)
    states = {ti.task_id: ti.state for ti in run.get_task_instances()}
    assert run.state == "success"
    assert states["plan"] == states["carry_on"] == "success"
    assert {states[t] for t in ("pause_streams", "roll_back", "rerun_and_replay", "resume",
                                "validate")} == {"skipped"}
    assert snapshot(sandbox) == before
    with settings.Session() as session:
        plans = run_plans(ROLLBACK, run.run_id, session)
    (task_id, plan), = plans
    assert task_id == "plan"
    assert plan["frontiers"]["communities"] == [2, "inf"]
    assert plan["frontiers"]["ingest"] == "top"
    assert plan["request"]["dry_run"] is True and plan["request"]["reason"] == "test"
    html = page(ROLLBACK, run.run_id, plans)
    assert "<td>communities</td><td>lazy</td><td>epoch 4 (converged)</td>" \
           "<td>epoch 2 (converged)</td>" in html
    assert "<svg" in html and "dry run: nothing changed" in html


def test_plan_markdown_and_graph(sandbox):
    from falkirk.airflow.render import plan_markdown, region_graph_svg
    from falkirk.model.topology import load_pipeline
    from falkirk.recovery.rollback import RollbackExecutor, RollbackRequest

    pipeline = load_pipeline("reference")
    plan = RollbackExecutor(pipeline).plan(
        RollbackRequest("reference", region="ingest", to_epoch=2, reason="bad deploy")).to_json()
    md = plan_markdown(plan, pipeline)
    assert "| ingest | ephemeral | epoch 5 | epoch 2 | restores and reruns |" in md
    assert "| serve | ephemeral | epoch 3 | ⊤ keeps its live state | keeps running |" in md
    svg = region_graph_svg(pipeline, plan["frontiers"], plan["current"])
    root = ET.fromstring(svg)  # well-formed
    texts = " ".join(t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}text"))
    for region in pipeline.regions:
        assert region in texts
    assert "epoch 5 → epoch 2" in texts


def test_batch_epochs_follow_the_data_interval(airflow_env, dagbag):
    from airflow.sdk.exceptions import AirflowFailException

    from falkirk.airflow.batch import epoch_of, origin
    from falkirk.model.topology import load_pipeline

    start = origin(load_pipeline("reference"))
    assert epoch_of("reference", start) == 0
    assert epoch_of("reference", start + timedelta(seconds=30)) == 3
    with pytest.raises(AirflowFailException, match="not an epoch"):
        epoch_of("reference", start + timedelta(seconds=31))
    # what Airflow passes: a pendulum DateTime (its differences are pendulum Intervals)
    import pendulum

    assert epoch_of("reference", pendulum.instance(start).add(seconds=50)) == 5
    dag = dagbag.dags[BATCH]
    assert dag.catchup and dag.start_date == start
    task = dag.get_task("popularity")  # run_epoch takes the run's data_interval_start
    from falkirk.airflow.batch import run_epoch

    assert task.python_callable is run_epoch
    assert task.op_kwargs == {"pipeline": "reference", "region": "popularity"}
    assert dag.user_defined_macros["falkirk_epoch"](start + timedelta(seconds=40)) == 4


def test_a_batch_epoch_killed_again_and_again_is_retried_for_minutes(airflow_env, dagbag):
    """A batch epoch's tries are what reruns it (the batch regime's recovery). With one
    retry 20 s later, the 30-minute campaign killed both tries of an epoch and every region
    downstream waited for it forever. Its tries now span minutes, the first soon, none
    more than 2 min after the one before (Airflow's own reckoning of each wait)."""
    from datetime import UTC, datetime

    from airflow.models.taskinstance import TaskInstance

    task = dagbag.dags[BATCH].get_task("popularity")
    ti = TaskInstance(task=task, run_id="r", dag_version_id=None)
    ti.end_date = end = datetime(2026, 1, 1, tzinfo=UTC)
    waits = []
    for ti.try_number in range(1, task.retries + 1):
        waits.append((ti.next_retry_datetime() - end).total_seconds())
    assert task.retries >= 8
    assert waits[0] <= 20 and max(waits) <= 120
    assert sum(waits) >= 8 * 60, waits


def test_a_batch_epoch_whose_engine_dies_under_it_runs_again_in_the_same_try(
        tmp_path, monkeypatch):
    """The hour of strikes with the engine among the targets spent all tries of one batch
    epoch in 14 minutes, half of them on engine kills, and the campaign ended there. A try
    whose epoch failed because the engine died under it (dead, or another process serving
    since) now runs the epoch again once the engine answers; a failure with the engine as
    it was fails the try at once, as before."""
    import subprocess

    from falkirk.airflow import batch
    from falkirk.local.broker import free_port
    from falkirk.model.topology import load_pipeline
    from falkirk.runtime import driver, procs

    monkeypatch.setenv("FALKIRK_LOCAL_ENGINE_DIR", str(tmp_path / "engine"))
    monkeypatch.setenv("FALKIRK_LOCAL_SPARK_REMOTE", f"sc://127.0.0.1:{free_port()}")
    monkeypatch.setenv("FALKIRK_LOCAL_LOCAL_ENGINE", "1")
    (tmp_path / "engine").mkdir()
    engines: list[subprocess.Popen] = []

    def new_engine() -> None:  # a process recorded as the engine (nothing need answer)
        engines.append(subprocess.Popen(["sleep", "300"], start_new_session=True))
        pid = engines[-1].pid
        procs.write_whole(tmp_path / "engine" / "engine.json", {
            "pid": pid, "pgid": pid, "process_started": procs.process_started(pid)})

    runs: list[list[str]] = []

    def job(logic, argv):  # the epoch: the engine killed and started again under it, once
        runs.append(argv)
        if len(runs) == 1:
            engines[-1].kill()
            engines[-1].wait()
            new_engine()
            return 1
        return 0

    monkeypatch.setattr(driver, "run_job", job)
    monkeypatch.setattr("falkirk.runtime.engine.ensure", lambda cfg=None, warm=False: None)
    start = batch.origin(load_pipeline("reference")) + timedelta(seconds=20)
    new_engine()
    try:
        assert batch.run_epoch("reference", "popularity", start) == [2]
        assert len(runs) == 2 and runs[0] == runs[1] and "2" in runs[0]
        runs.clear()
        monkeypatch.setattr(driver, "run_job", lambda logic, argv: runs.append(argv) or 1)
        with pytest.raises(RuntimeError, match="popularity epoch 2: the job failed with "
                                               "exit code 1"):
            batch.run_epoch("reference", "popularity", start)
        assert len(runs) == 1  # the engine as it was: the try fails at once
    finally:
        for e in engines:
            e.kill()
            e.wait()


def _empty_lake(tmp_path, monkeypatch):
    """FALKIRK_LAKE and FALKIRK_VAR_DIR at folders of this test (the lake not made yet)."""
    from falkirk.config import load

    monkeypatch.setenv("FALKIRK_LAKE", str(tmp_path / "lake"))
    monkeypatch.setenv("FALKIRK_VAR_DIR", str(tmp_path / "var"))
    return load()


def _ingest_committed(cfg, epochs: range) -> None:
    """ingest (the reference pipeline's region that popularity reads, delay 0) committed
    these epochs in the epoch log."""
    from falkirk.log.epochlog import EpochLog, EpochRecord

    EpochLog.from_config(cfg).record(*(EpochRecord("reference", "ingest", e, 0, "committed")
                                       for e in epochs))


def _batch_dag():
    """The batch DAG as the scheduler holds it, from a fresh parse of the DAG file (what
    the DAG processor does every ~30 s): serialized and read back, so its timetable is the
    one the falkirk plugin registered."""
    from airflow.dag_processing.dagbag import DagBag
    from airflow.serialization.serialized_objects import DagSerialization

    bag = DagBag(dag_folder=str(DAGS_FOLDER / "falkirk_pipelines.py"))
    assert bag.import_errors == {}
    return DagSerialization.from_dict(DagSerialization.to_dict(bag.dags[BATCH]))


def _runs(dag, after=None, most: int = 200) -> list:
    """The runs the scheduler makes, one after another: each asks the DAG for the run
    after the last one made (its start_date, end_date and timetable), until there is none.
    ``after``: the last run made before."""
    infos, info = [], after
    while (info := dag.next_dagrun_info(last_automated_run_info=info)) is not None:
        infos.append(info)
        assert len(infos) <= most, "the runs do not end"
    return infos


def _epochs(infos) -> list[int]:
    """The epochs runs cover, in order, each run checked to be whole consecutive epochs'
    windows (one, or up to ``max_pass`` for a run that catches up), after the run before."""
    from falkirk.airflow.batch import epochs_of
    from falkirk.config import load

    covered: list[int] = []
    for info in infos:
        span = info.data_interval.end.timestamp() - info.data_interval.start.timestamp()
        assert span % 10 == 0 and 10 <= span <= 10 * load().max_pass
        assert info.run_after == info.data_interval.end
        epochs = epochs_of("reference", info.data_interval.start, info.data_interval.end)
        assert not covered or epochs[0] == covered[-1] + 1
        covered += epochs
    return covered


def test_every_epoch_the_inputs_committed_gets_a_batch_run_however_many(airflow_env,
                                                                        tmp_path, monkeypatch):
    """Issue 59: a 20-epoch pipeline got 10 batch runs, silently (a fixed default cap).
    The batch DAG now runs every epoch its input has: with 25 epochs committed, epochs
    0..24, none skipped, none after; once more are committed the next parse makes their
    runs, after the last one made. Epochs ready together get one run (the region is
    behind: its job does them in one pass), up to max_pass; with max_pass 1, a run each."""
    from falkirk.airflow.batch import origin
    from falkirk.model.topology import load_pipeline

    monkeypatch.delenv("FALKIRK_BATCH_EPOCHS", raising=False)
    monkeypatch.delenv("FALKIRK_BATCH_FIRST_EPOCH", raising=False)
    cfg = _empty_lake(tmp_path, monkeypatch)
    _ingest_committed(cfg, range(25))
    dag = _batch_dag()
    assert dag.end_date is None  # no cap
    runs = _runs(dag)
    assert _epochs(runs) == list(range(25)) and len(runs) == 1  # 25 ready: one pass
    assert runs[0].data_interval.start == origin(load_pipeline("reference"))
    monkeypatch.setenv("FALKIRK_MAX_PASS", "10")
    assert [len(_epochs([r])) for r in _runs(_batch_dag())] == [10, 10, 5]
    monkeypatch.setenv("FALKIRK_MAX_PASS", "1")
    assert len(_runs(_batch_dag())) == 25
    monkeypatch.delenv("FALKIRK_MAX_PASS")
    # what a backfill over all time would make, too (Airflow's iteration of the timetable)
    assert _epochs(dag.iter_dagrun_infos_between(None, runs[-1].data_interval.end
                                                 + timedelta(days=365))) == list(range(25))
    _ingest_committed(cfg, range(25, 31))
    assert _epochs(_runs(_batch_dag(), after=runs[-1])) == list(range(25, 31))
    assert _runs(_batch_dag(), after=_runs(_batch_dag())[-1]) == []


def test_with_nothing_committed_the_batch_dag_parses_and_schedules_nothing(airflow_env,
                                                                         tmp_path,
                                                                         monkeypatch):
    """No lake yet, then a lake whose log has no epoch of the input: the DAG parses and
    no run is due (not one per 10 s since the origin, in 2024). The first committed epoch
    makes the first run."""
    from airflow.models.dag import DagModel

    from falkirk.airflow.batch import origin
    from falkirk.log.epochlog import EpochLog, EpochRecord
    from falkirk.model.topology import load_pipeline

    monkeypatch.delenv("FALKIRK_BATCH_EPOCHS", raising=False)
    monkeypatch.delenv("FALKIRK_BATCH_FIRST_EPOCH", raising=False)
    cfg = _empty_lake(tmp_path, monkeypatch)
    dag = _batch_dag()
    assert _runs(dag) == []
    assert list(dag.iter_dagrun_infos_between(None, dag.start_date + timedelta(days=9999))) \
        == []
    assert not (tmp_path / "lake").exists()  # looked for, not made
    # what the DAG processor records after a parse (and the scheduler after a run): no run
    dm = DagModel(dag_id=BATCH)
    dm.calculate_dagrun_date_fields(dag, reference_run=None)
    assert dm.next_dagrun is None and dm.next_dagrun_create_after is None
    EpochLog.from_config(cfg).record(EpochRecord("reference", "serve", 0, 0, "committed"))
    assert _runs(_batch_dag()) == []  # another region's epochs are not popularity's input
    _ingest_committed(cfg, range(1))
    dm.calculate_dagrun_date_fields(_batch_dag(), reference_run=None)
    start = origin(load_pipeline("reference"))
    assert (dm.next_dagrun, dm.next_dagrun_create_after) == (start,
                                                             start + timedelta(seconds=10))
    assert _epochs(_runs(_batch_dag())) == [0]


def test_batch_runs_end_where_the_input_ended_and_follow_each_kind_of_input(tmp_path,
                                                                           monkeypatch):
    """The last epoch a batch region's inputs can be complete for, per kind of input: a
    Delta edge's sender's latest committed epoch plus its delay (not past an epoch held
    back for delay 0), or its end once its input ended; a Kafka input as far as the
    topic's readers got, one past the region's own latest, never past the epoch a reader
    reached the declared bound in; never past the region's own end."""
    import json

    from falkirk.airflow.batch import schedulable_through
    from falkirk.log.epochlog import EpochLog, EpochRecord
    from falkirk.model.topology import Pipeline

    folder = tmp_path / "p"
    (folder / "jobs").mkdir(parents=True)
    (folder / "schemas" / "tables").mkdir(parents=True)
    (folder / "pipeline.yaml").write_text(CLICKS.replace(
        "  totals: {regime: eager, job: jobs/totals.py}",
        "  totals: {regime: eager, job: jobs/totals.py}\n"
        "  dims: {regime: eager, job: jobs/dims.py}").replace(
        "  clicks: {kind: kafka, to: ingest, topic: clicks}",
        "  clicks: {kind: kafka, to: ingest, topic: clicks}\n"
        "  raw: {kind: kafka, to: counts, topic: clicks}\n"
        "  dim_feed: {kind: kafka, to: dims, topic: dims}\n"
        "  sides: {kind: delta, from: dims, to: counts, table: sides, delay: 2}"))
    for job in ("ingest", "counts", "totals", "dims"):
        (folder / "jobs" / f"{job}.py").write_text("")
    for table in ("clean", "per_page", "user_totals", "sides"):
        (folder / "schemas" / "tables" / f"{table}.json").write_text(json.dumps(
            {"table": table, "fields": [{"name": "epoch", "type": "int64"}]}))
    pipeline = Pipeline.load(folder / "pipeline.yaml")
    log = EpochLog(str(tmp_path / "lake" / "_falkirk_log"))

    def commit(region, epochs, status="committed", inputs=None):
        log.record(*(EpochRecord("clicks", region, e, 0, status,
                                 inputs=inputs(e) if inputs else None) for e in epochs))

    def through():
        return schedulable_through(pipeline, "counts", log)

    # nothing yet: clean (delay 0) has nothing; raw: counts' own first epoch may run
    assert through() == -1
    commit("dims", range(10))  # the side input (delay 2) is far ahead
    commit("ingest", range(4), inputs=lambda e: {"clicks": {"from": {"0": e * 10},
                                                            "to": {"0": e * 10 + 10}}})
    assert through() == 3  # clean: ingest committed 0..3; the topic too
    commit("ingest", [4], "quarantined")
    commit("ingest", range(5, 8))
    assert through() == 3  # epoch 4 held back: no run reads past it
    commit("ingest", [4])  # its checks passed on a rerun
    assert through() == 7
    commit("counts", range(8))
    assert through() == 7  # clean still bounds it (the topic alone: epoch 8)
    log.record_end("clicks", ["ingest"], 7, 0)
    assert through() == 7  # ingest ended after epoch 7: nothing after it for clean
    commit("ingest", range(8, 12))  # (a rerun went further: the end still bounds)
    assert through() == 7
    # the side input bounds when it is the one behind: dims' epoch 4 + delay 2
    log2 = EpochLog(str(tmp_path / "lake2" / "_falkirk_log"))
    log2.record(*(EpochRecord("clicks", "dims", e, 0, "committed") for e in range(5)))
    log2.record(*(EpochRecord("clicks", "ingest", e, 0, "committed") for e in range(20)))
    assert schedulable_through(pipeline, "counts", log2) == 6
    # the topic declared ended at offset 45: ingest's epoch 4 reached it; no run after
    log2.record(*(EpochRecord("clicks", "dims", e, 0, "committed") for e in range(5, 30)))
    assert schedulable_through(pipeline, "counts", log2) == 19
    log2.record_bound("clicks", "clicks", {"0": 45})
    assert schedulable_through(pipeline, "counts", log2) == 19  # no range logged: unknown
    log2.record(EpochRecord("clicks", "ingest", 4, 0, "committed",
                            inputs={"clicks": {"from": {"0": 40}, "to": {"0": 45}}}))
    assert schedulable_through(pipeline, "counts", log2) == 4
    # the region's own end bounds it whatever its inputs say
    log.record_end("clicks", ["counts"], 5, 0)
    assert through() == 5


def test_batch_runs_can_start_at_a_later_epoch_and_bad_bounds_are_refused(airflow_env,
                                                                            tmp_path,
                                                                            monkeypatch):
    """FALKIRK_BATCH_FIRST_EPOCH hands a region to Airflow mid-stream: the first run's data
    interval is that epoch's window, and the runs go on through every epoch committed;
    FALKIRK_BATCH_EPOCHS, when set, caps them; bounds that schedule nothing, or are not
    numbers, are refused naming the variable."""
    from falkirk.airflow.batch import origin, schedule
    from falkirk.model.topology import load_pipeline

    start = origin(load_pipeline("reference"))
    monkeypatch.delenv("FALKIRK_BATCH_EPOCHS", raising=False)
    monkeypatch.setenv("FALKIRK_BATCH_FIRST_EPOCH", "20")
    cfg = _empty_lake(tmp_path, monkeypatch)
    _ingest_committed(cfg, range(25))
    dag = _batch_dag()
    assert dag.start_date == start + timedelta(seconds=200) and dag.end_date is None
    assert _epochs(_runs(dag)) == [20, 21, 22, 23, 24]
    monkeypatch.setenv("FALKIRK_BATCH_FIRST_EPOCH", "3")
    monkeypatch.setenv("FALKIRK_BATCH_EPOCHS", "5")
    got = schedule("reference", "popularity")
    assert got["start_date"] == start + timedelta(seconds=30)
    assert got["end_date"] == start + timedelta(seconds=49)
    assert _epochs(_runs(_batch_dag())) == [3, 4]
    monkeypatch.setenv("FALKIRK_BATCH_FIRST_EPOCH", "5")
    with pytest.raises(ValueError, match="FALKIRK_BATCH_FIRST_EPOCH=5 must be below"):
        schedule("reference", "popularity")
    monkeypatch.setenv("FALKIRK_BATCH_FIRST_EPOCH", "three")
    with pytest.raises(ValueError, match="FALKIRK_BATCH_FIRST_EPOCH='three'"):
        schedule("reference", "popularity")


def test_batch_tasks_and_stream_jobs_start_spark_with_the_same_launch_settings(
        airflow_env, dagbag, monkeypatch, tmp_path):
    """One source for the settings a driver must get at start (shuffle partitions, UI, the
    driver JVM's options): with the engine, its own settings, and every job a client
    (``python <job>``; a batch epoch in its Airflow task's process); without one, the
    DAG's spark-submit and the supervisor's job command."""
    import sys

    from airflow.dag_processing.dagbag import DagBag

    from falkirk.airflow.batch import run_epoch
    from falkirk.config import load
    from falkirk.io.launch import launch_conf
    from falkirk.runtime.engine import engine_conf
    from falkirk.runtime.launcher import job_command

    cfg = load()
    assert cfg.spark_remote
    assert job_command("jobs/ingest.py", ["--pipeline", "reference"], cfg) == [
        sys.executable, str(Path("jobs/ingest.py").resolve()), "--pipeline", "reference"]
    assert dagbag.dags[BATCH].get_task("popularity").python_callable is run_epoch
    served = engine_conf(cfg, "127.0.0.1", 15002, tmp_path)
    options = "spark.driver.extraJavaOptions"
    assert {k: served[k] for k in launch_conf(cfg) if k != options} == {
        k: v for k, v in launch_conf(cfg).items() if k != options}
    # the engine, one JVM running every job's work for hours, compiles with C2 as well,
    # and logs its collections beside its log
    drivers = launch_conf(cfg)[options].split()
    assert "-XX:TieredStopAtLevel=1" in drivers
    assert served[options].split()[:-1] == [o for o in drivers
                                            if o != "-XX:TieredStopAtLevel=1"]
    assert served[options].split()[-1].startswith(f"-Xlog:gc:file={tmp_path / 'gc.log'}:")

    monkeypatch.setenv("FALKIRK_LOCAL_SPARK_REMOTE", "")  # every job an application
    cfg = load()
    cmd = job_command("jobs/ingest.py", ["--pipeline", "reference"], cfg)
    given = dict(cmd[i + 1].split("=", 1) for i, arg in enumerate(cmd) if arg == "--conf")
    assert given == launch_conf(cfg)
    classic = DagBag(dag_folder=str(DAGS_FOLDER))
    assert classic.dags[BATCH].get_task("popularity").conf == given
    # local drivers: C1 only, serial GC (2 cores shared by four JVMs), and the code cache
    # of tiered compilation (C1 alone gets 48 MB, which long streaming queries fill)
    # and the class-data archive `falkirk jars` trained for them (falkirk.io.classdata)
    from falkirk.io.classdata import archive

    assert given["spark.driver.extraJavaOptions"].split() == [
        "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-XX:ReservedCodeCacheSize=240m",
        f"-XX:SharedArchiveFile={archive(cfg)}"]


def _job_ended(pipeline, job: str, status: str, code: int | None) -> None:
    """The row a job writes about itself when it starts (code None) or ends."""
    from falkirk.log.epochlog import EpochLog

    EpochLog.from_config().record_job_run(pipeline.name, job, ["x"], 0, status, exit_code=code)


def _record_launches(monkeypatch) -> list[str]:
    """Jobs are not started: each start is recorded in the returned list (pid 1)."""

    launched: list[str] = []

    class Launched:  # what launcher.start_job returns that start_streams reads
        pid = 1

    def launch(pipe, job, args, cfg=None):
        launched.append(job)
        return Launched()

    monkeypatch.setattr("falkirk.runtime.launcher.start_job", launch)
    return launched


def test_a_stream_that_finished_is_not_dead(tmp_path, monkeypatch):
    """Finished or dead is read from the job's own rows in the log of job runs: a job
    killed after it started wrote no end row; log lines prove nothing."""
    from falkirk.airflow import streams
    from falkirk.model.topology import load_pipeline

    monkeypatch.setenv("FALKIRK_VAR_DIR", str(tmp_path))
    monkeypatch.setenv("FALKIRK_LAKE", str(tmp_path / "lake"))
    pipeline = load_pipeline("reference")
    assert set(streams.stream_jobs(pipeline)) == {"jobs/ingest.py", "jobs/communities.py",
                                                  "jobs/serve.py"}
    log = streams.log_file(pipeline, "jobs/ingest.py")
    log.parent.mkdir(parents=True)
    log.write_text("2026-01-01 10:00:00,001 INFO falkirk.runtime: ingest: done through "
                   "epoch 9\n")  # a log line is not an end row
    assert not streams.finished_cleanly(pipeline, "jobs/ingest.py")
    _job_ended(pipeline, "jobs/ingest.py", "started", None)
    _job_ended(pipeline, "jobs/ingest.py", "finished", 0)
    assert streams.finished_cleanly(pipeline, "jobs/ingest.py")
    _job_ended(pipeline, "jobs/ingest.py", "started", None)  # restarted, then killed
    assert not streams.finished_cleanly(pipeline, "jobs/ingest.py")
    _job_ended(pipeline, "jobs/ingest.py", "failed", 2)
    assert not streams.finished_cleanly(pipeline, "jobs/ingest.py")
    assert set(streams.dead_jobs(pipeline)) == set(streams.stream_jobs(pipeline))
    streams.pause_marker(pipeline).parent.mkdir(parents=True, exist_ok=True)
    streams.pause_marker(pipeline).write_text("a rollback run")
    assert streams.dead_jobs(pipeline) == {}


def test_a_reused_pid_is_not_the_job(tmp_path, monkeypatch):
    """A pid file whose pid now belongs to another process (the OS reused it): the job is
    not running, whatever lives under that pid."""
    import json
    import os

    from falkirk.model.topology import load_pipeline
    from falkirk.runtime import procs

    monkeypatch.setenv("FALKIRK_VAR_DIR", str(tmp_path))
    pipeline = load_pipeline("reference")
    folder = tmp_path / "run" / "reference"
    folder.mkdir(parents=True)
    info = {"pid": os.getpid(), "pgid": os.getpid(), "job": "jobs/ingest.py",
            "regions": ["ingest"], "process_started": procs.process_started(os.getpid())}
    (folder / "ingest.json").write_text(json.dumps(info))
    assert [i["job"] for i in procs.running(pipeline)] == ["jobs/ingest.py"]
    info["process_started"] -= 3600  # the job that wrote it started an hour earlier
    (folder / "ingest.json").write_text(json.dumps(info))
    assert procs.running(pipeline) == []


def test_a_pid_file_being_written_is_never_read_half_written(tmp_path, monkeypatch):
    """Forced interleaving: the watch looks at the pid files every second, while a
    restart rewrites one. The write is stopped half-way (half its text on disk) and the
    watch's look runs right then: it must see the old file whole (the campaign under
    Airflow died of a JSONDecodeError here), then the new one."""
    import json
    import os
    import pathlib

    from falkirk.model.topology import load_pipeline
    from falkirk.runtime import procs

    monkeypatch.setenv("FALKIRK_VAR_DIR", str(tmp_path))
    pipeline = load_pipeline("reference")
    me = os.getpid()
    procs.record_job_process(pipeline, "jobs/ingest.py", me, procs.process_started(me), ["x"])
    seen: list[list[dict]] = []
    write_text = pathlib.Path.write_text

    def torn(path, text, *args, **kwargs):  # half on disk, the look, then the rest
        write_text(path, text[: len(text) // 2], *args, **kwargs)
        seen.append(procs.running(pipeline))
        return write_text(path, text, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "write_text", torn)
    procs.record_job_process(pipeline, "jobs/ingest.py", me, procs.process_started(me),
                             ["y"])
    monkeypatch.setattr(pathlib.Path, "write_text", write_text)
    assert [[info["command"] for info in look] for look in seen] == [[["x"]]]
    assert [info["command"] for info in procs.running(pipeline)] == [["y"]]
    assert json.loads((tmp_path / "run" / "reference" / "ingest.json").read_text())


def _an_engine_of_its_own(tmp_path, monkeypatch) -> None:
    """The local profile with its var, lake and engine folder under ``tmp_path`` and its
    engine's address on a free port, where nothing answers."""
    from falkirk.local.broker import free_port

    monkeypatch.setenv("FALKIRK_VAR_DIR", str(tmp_path))
    monkeypatch.setenv("FALKIRK_LAKE", str(tmp_path / "lake"))
    monkeypatch.setenv("FALKIRK_LOCAL_ENGINE_DIR", str(tmp_path / "engine"))
    monkeypatch.setenv("FALKIRK_LOCAL_SPARK_REMOTE", f"sc://127.0.0.1:{free_port()}")
    monkeypatch.setenv("FALKIRK_LOCAL_LOCAL_ENGINE", "1")


def test_when_the_engine_died_every_job_on_it_is_recovered_with_the_first_dead_one(
        tmp_path, monkeypatch):
    """The engine's kill takes every job's session: the jobs then died seconds apart, and
    each death was rolled back on its own (three rollbacks, one after the other). Once the
    engine's recorded process is gone and nothing answers, the watch counts every running
    stream job with the first dead one, for one rollback; an engine still starting (its
    process alive) does not count as dead. A job that exited because its engine died
    failed, but not on its own: the restart backoff does not count it."""
    import subprocess

    from falkirk.airflow import supervisor
    from falkirk.model.topology import load_pipeline
    from falkirk.runtime import procs
    from falkirk.runtime.engine import died
    from falkirk.runtime.park import ENGINE_LOST_EXIT
    from falkirk.runtime.procs import write_whole

    _an_engine_of_its_own(tmp_path, monkeypatch)  # nothing answers at its address yet
    pipeline = load_pipeline("reference")
    live = {job: subprocess.Popen(["sleep", "300"], start_new_session=True)
            for job in ("jobs/serve.py", "jobs/communities.py")}
    engine = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        for job, p in live.items():
            procs.record_job_process(pipeline, job, p.pid, procs.process_started(p.pid), ["x"])
        _job_ended(pipeline, "jobs/ingest.py", "started", None)  # then killed
        (tmp_path / "engine").mkdir()
        write_whole(tmp_path / "engine" / "engine.json",
                    {"pid": engine.pid, "pgid": engine.pid,
                     "process_started": procs.process_started(engine.pid)})
        assert not died()  # its process lives: starting, not dead
        assert supervisor.dead_or_finished(pipeline) == {"jobs/ingest.py": ["ingest"]}
        engine.kill()
        engine.wait()
        assert died()
        assert supervisor.dead_or_finished(pipeline) == {
            "jobs/ingest.py": ["ingest"], "jobs/serve.py": ["serve", "stats"],
            "jobs/communities.py": ["communities"]}
    finally:
        for p in (*live.values(), engine):
            p.kill()
            p.wait()
    _job_ended(pipeline, "jobs/ingest.py", "failed", ENGINE_LOST_EXIT)
    _job_ended(pipeline, "jobs/serve.py", "failed", 2)
    assert supervisor.failed_on_their_own(pipeline, {"jobs/ingest.py", "jobs/serve.py"}) == {
        "jobs/serve.py"}


def test_the_engines_death_is_seen_before_any_of_its_jobs_exits(tmp_path, monkeypatch):
    """The watch looked for dead jobs only, so an engine's kill was seen once a job's fence
    watch had looked three times and the job had exited. Now the engine's death is the
    death of every stream job running on it, at the watch's next look; not while a
    rollback run has paused the jobs (it restarts them), and not when nothing runs."""
    import subprocess

    from falkirk.airflow import streams, supervisor
    from falkirk.model.topology import load_pipeline
    from falkirk.runtime import procs
    from falkirk.runtime.procs import write_whole

    _an_engine_of_its_own(tmp_path, monkeypatch)  # nothing answers at its address yet
    pipeline = load_pipeline("reference")
    assert supervisor.with_the_engines_jobs(pipeline, {}) == {}  # no engine, no job either
    jobs = streams.stream_jobs(pipeline)
    live = {job: subprocess.Popen(["sleep", "300"], start_new_session=True) for job in jobs}
    engine = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        for job, p in live.items():
            procs.record_job_process(pipeline, job, p.pid, procs.process_started(p.pid), ["x"])
        (tmp_path / "engine").mkdir()
        write_whole(tmp_path / "engine" / "engine.json",
                    {"pid": engine.pid, "pgid": engine.pid,
                     "process_started": procs.process_started(engine.pid)})
        assert supervisor.dead_or_finished(pipeline) == {}
        engine.kill()
        engine.wait()
        assert supervisor.dead_or_finished(pipeline) == jobs  # every job still alive
        recovered: list[dict] = []  # the recover task (the watch ended for it) sees them too
        monkeypatch.setattr(supervisor, "plan_markdown", lambda plan, pipe: "")

        class Task:
            run_id = "manual__1"

            def xcom_push(self, key, value) -> None:
                pass

        class Plan:
            def to_json(self) -> dict:
                return {}

        monkeypatch.setattr(supervisor, "roll_back_and_restart",
                            lambda pipe, dead, by, say=None: recovered.append(dead) or {
                                "plan": Plan()})
        supervisor.recover("reference", Task())
        assert recovered == [jobs]
        streams.pause_marker(pipeline).parent.mkdir(parents=True, exist_ok=True)
        streams.pause_marker(pipeline).write_text("a rollback run")
        assert supervisor.dead_or_finished(pipeline) == {}
    finally:
        for p in (*live.values(), engine):
            p.kill()
            p.wait()


def test_after_the_engines_death_it_starts_again_beside_the_rollback(tmp_path, monkeypatch):
    """Forced interleaving: the rollback's stop of the jobs waits for the engine's start
    to begin, which only happens in time when the start runs beside the rollback (it used
    to begin when the first job was started, after it). A start that fails fails the
    recovery before any job is started, naming why."""
    import threading

    from falkirk.airflow import supervisor
    from falkirk.model.topology import load_pipeline
    from falkirk.runtime import engine, procs

    _an_engine_of_its_own(tmp_path, monkeypatch)  # nothing answers at its address yet
    pipeline = load_pipeline("reference")
    launched = _record_launches(monkeypatch)
    starting = threading.Event()
    seen_in_the_rollback: list[bool] = []

    def start_engine(cfg=None, warm=False) -> None:
        assert not warm  # a recovery's restart: no warm-up
        starting.set()

    def stop_regions(pipe, regions, cfg=None, park_s=0.0, epoch_log=None) -> list[str]:
        seen_in_the_rollback.append(starting.wait(timeout=20))
        return []

    monkeypatch.setattr(engine, "ensure", start_engine)
    monkeypatch.setattr(procs, "stop_regions", stop_regions)
    said: list[str] = []
    out = supervisor.roll_back_and_restart(
        pipeline, {"jobs/serve.py": ["serve", "stats"]}, "a test", said.append)
    assert seen_in_the_rollback == [True]
    assert "the Spark engine started again beside the rollback" in said
    assert launched == ["jobs/serve.py"] and out["restarted"] == {"jobs/serve.py": 1}

    def fails(cfg=None, warm=False) -> None:
        raise engine.EngineError("the engine on port 1 exited with code 1 while starting")

    monkeypatch.setattr(engine, "ensure", fails)
    launched.clear()
    with pytest.raises(engine.EngineError, match="exited with code 1 while starting"):
        supervisor.roll_back_and_restart(pipeline, {"jobs/serve.py": ["serve", "stats"]},
                                         "a test", said.append)
    assert launched == []


def test_the_supervisor_leaves_finished_streams_finished(tmp_path, monkeypatch):
    """start_streams starts only jobs that neither run nor finished (unless a rollback names
    them); watch keeps waiting when every job finished, and ends on a death."""
    from falkirk.airflow import streams, supervisor
    from falkirk.model.topology import load_pipeline

    monkeypatch.setenv("FALKIRK_VAR_DIR", str(tmp_path))
    monkeypatch.setenv("FALKIRK_LAKE", str(tmp_path / "lake"))
    pipeline = load_pipeline("reference")
    launched = _record_launches(monkeypatch)
    for job in streams.stream_jobs(pipeline):
        _job_ended(pipeline, job, "finished", 0)
    assert streams.start_streams(pipeline) == {} and launched == []
    assert streams.start_streams(pipeline, only=["jobs/communities.py"]) == {
        "jobs/communities.py": 1}
    sensor = supervisor.StreamsSensor(task_id="watch", pipeline="reference")
    assert sensor.poke({}) is False  # every job finished: go on waiting
    _job_ended(pipeline, "jobs/serve.py", "started", None)  # then killed: no end row
    assert streams.start_streams(pipeline) == {"jobs/serve.py": 1}
    done = sensor.poke({})
    assert done.is_done and done.xcom_value == {"jobs/serve.py": ["serve", "stats"]}


def test_the_watch_defers_to_a_trigger_that_ends_it_on_a_death(tmp_path, monkeypatch):
    """The watch holds no worker slot while the jobs run: it defers to the triggerer, whose
    trigger looks every second (the reschedule poke every 30 s was the detection part of
    every recovery) and, once the job's process is gone, ends the watch itself: no worker
    process resumes it and parses the DAG file first (``recover`` looks the dead jobs up)."""
    import asyncio
    import subprocess

    from airflow.sdk.exceptions import TaskDeferred
    from airflow.triggers.base import TaskSuccessEvent
    from airflow.utils.state import TaskInstanceState

    from falkirk.airflow import streams, supervisor
    from falkirk.model.topology import load_pipeline
    from falkirk.runtime import procs

    monkeypatch.setenv("FALKIRK_VAR_DIR", str(tmp_path))
    monkeypatch.setenv("FALKIRK_LAKE", str(tmp_path / "lake"))
    # jobs as drivers of their own: no engine whose absence would make the stand-in dead
    monkeypatch.setenv("FALKIRK_LOCAL_SPARK_REMOTE", "")
    pipeline = load_pipeline("reference")
    for job in streams.stream_jobs(pipeline):
        if job != "jobs/serve.py":
            _job_ended(pipeline, job, "finished", 0)
    serve = subprocess.Popen(["sleep", "300"], start_new_session=True)  # the job's stand-in
    try:
        procs.record_job_process(pipeline, "jobs/serve.py", serve.pid,
                                 procs.process_started(serve.pid), ["sleep", "300"])
        _job_ended(pipeline, "jobs/serve.py", "started", None)
        sensor = supervisor.StreamsSensor(task_id="watch", pipeline="reference",
                                          recover_here=False)
        with pytest.raises(TaskDeferred) as deferred:
            sensor.execute({})
        trigger = deferred.value.trigger
        assert trigger.serialize() == ("falkirk.airflow.supervisor.StreamDeathTrigger",
                                       {"pipeline": "reference", "interval_s": 1.0,
                                        "recover": False, "run_id": ""})

        async def watch() -> tuple[bool, dict]:
            events = trigger.run()
            first = asyncio.ensure_future(anext(events))
            done, _ = await asyncio.wait({first}, timeout=2.5)  # two looks: serve runs
            fired_early = bool(done)
            serve.kill()
            serve.wait()
            event = await asyncio.wait_for(first, timeout=30)
            return fired_early, event

        fired_early, event = asyncio.run(watch())
    finally:
        serve.kill()
        serve.wait()
    assert not fired_early
    assert isinstance(event, TaskSuccessEvent)
    assert event.task_instance_state == TaskInstanceState.SUCCESS
    assert streams.dead_jobs(pipeline) == {"jobs/serve.py": ["serve", "stats"]}  # recover's


def test_the_watch_compacts_the_epoch_log_as_it_goes(tmp_path, monkeypatch):
    """Each append to the epoch log adds a file, and every job the watch restarts reads
    every file of the tables it reads: the watch compacts them between its looks, and the
    rows read back are the same, in the same order."""
    import asyncio
    import subprocess

    from deltalake import DeltaTable

    from falkirk.airflow import streams, supervisor
    from falkirk.io.lake import COMPACT_MIN_FILES
    from falkirk.log.epochlog import EpochLog
    from falkirk.model.topology import load_pipeline
    from falkirk.runtime import procs

    monkeypatch.setenv("FALKIRK_VAR_DIR", str(tmp_path))
    monkeypatch.setenv("FALKIRK_LAKE", str(tmp_path / "lake"))
    monkeypatch.setenv("FALKIRK_LOCAL_SPARK_REMOTE", "")  # no engine to find dead
    pipeline = load_pipeline("reference")
    for k in range(COMPACT_MIN_FILES):  # a job's starts and ends, one append each
        _job_ended(pipeline, "jobs/ingest.py", "started" if k % 2 else "finished", 0)
    for job in streams.stream_jobs(pipeline):
        if job != "jobs/serve.py":
            _job_ended(pipeline, job, "finished", 0)
    before = EpochLog.from_config().job_run_rows("reference")
    uri = EpochLog.from_config().uri("job_runs")
    assert len(DeltaTable(uri).file_uris()) > COMPACT_MIN_FILES
    serve = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        procs.record_job_process(pipeline, "jobs/serve.py", serve.pid,
                                 procs.process_started(serve.pid), ["sleep", "300"])
        _job_ended(pipeline, "jobs/serve.py", "started", None)
        trigger = supervisor.StreamDeathTrigger("reference", recover=False)
        trigger.compact_every_s = 0.0

        async def watch():
            events = trigger.run()
            first = asyncio.ensure_future(anext(events))
            for _ in range(100):
                if len(DeltaTable(uri).file_uris()) == 1:
                    break
                await asyncio.sleep(0.1)
            serve.kill()
            serve.wait()
            return await asyncio.wait_for(first, timeout=30)

        asyncio.run(watch())
    finally:
        serve.kill()
        serve.wait()
    assert len(DeltaTable(uri).file_uris()) == 1
    assert EpochLog.from_config().job_run_rows("reference")[:len(before)] == before


def test_recover_looks_up_the_dead_jobs_itself_not_in_the_watchs_xcom(sandbox, monkeypatch):
    """The trigger ends the watch in the triggerer, and Airflow 3.3 stores a trigger's XCom
    JSON-encoded twice: ``recover`` read a string where it expected job -> regions and
    failed (the 8-minute campaign under Airflow; the next run's start step then recovered
    the job, later). It looks the dead jobs up itself, whatever the watch's XCom holds."""
    from falkirk.airflow import streams, supervisor
    from falkirk.log.epochlog import EpochLog
    from falkirk.model.topology import load_pipeline
    from falkirk.runtime import procs

    pipeline = load_pipeline("reference")
    log = EpochLog.from_config(sandbox)
    for job in streams.stream_jobs(pipeline):
        _job_ended(pipeline, job, "finished", 0)
    _job_ended(pipeline, "jobs/ingest.py", "started", None)  # then SIGKILLed: no end row
    started = _record_launches(monkeypatch)

    class WatchEndedByItsTrigger:  # the task instance recover gets
        run_id = "scheduled__2026-11-29T16:13:27+00:00"
        pushed: dict = {}

        def xcom_pull(self, task_ids=None, key="return_value"):
            return '{"jobs/ingest.py": ["ingest"]}'  # as Airflow 3.3 hands it back

        def xcom_push(self, key, value):
            self.pushed[key] = value

    monkeypatch.setattr(procs, "stop_regions",
                        lambda pipe, regions, cfg=None, park_s=0.0, epoch_log=None: [])
    monkeypatch.setattr(streams, "rerun_batch_epochs", lambda pipe, inv, cfg=None: {})
    out = supervisor.recover("reference", WatchEndedByItsTrigger())
    rollbacks = log.rollbacks("reference")
    assert [r["status"] for r in rollbacks] == ["started", "done"]
    assert rollbacks[-1]["request"]["failed"] == ["ingest"]
    assert "jobs/ingest.py" in started and out["restarted"]


def test_the_watchs_trigger_recovers_each_death_itself_and_watches_on(sandbox, monkeypatch):
    """With ``recover_in_trigger`` a death is rolled back and its job restarted in the
    triggerer, and the trigger keeps watching: no task process, DAG parse or scheduler
    on the recovery's path (the ``recover`` task's path took 3 s idle and 10-50 s under
    the fault campaign's load). Two deaths in a row are recovered with no event; the
    run's Rollback plan tab finds their plans in the epoch log. When a recovery fails
    here, the trigger ends the watch so that the ``recover`` task takes over.
    The watch keeps one epoch log for its life: no file of the log is read twice by its
    looks and recoveries (a new reader each time read every file of five log tables
    again: ~1 s each at the hour's campaign's 700 appends, on every recovery's path)."""
    import asyncio
    import subprocess
    import threading

    from airflow.sdk.exceptions import TaskDeferred
    from airflow.triggers.base import TaskSuccessEvent

    from falkirk.airflow import streams, supervisor
    from falkirk.airflow.ui import watch_plans
    from falkirk.io import lake
    from falkirk.log.epochlog import EpochLog
    from falkirk.model.topology import load_pipeline
    from falkirk.recovery import rollback
    from falkirk.runtime import procs

    pipeline = load_pipeline("reference")
    log = EpochLog.from_config(sandbox)
    for job in streams.stream_jobs(pipeline):
        _job_ended(pipeline, job, "finished", 0)
    jobs: list[subprocess.Popen] = []
    read_by_the_watch: list[str] = []  # the log's files, as the watch's threads open them
    dataset = lake.ds.dataset

    def opened(files, **kwargs):
        if threading.current_thread() is not threading.main_thread():  # not the test's
            read_by_the_watch.extend(files)
        return dataset(files, **kwargs)

    monkeypatch.setattr(lake.ds, "dataset", opened)

    def launch(pipe, job, args=None, cfg=None, env=None):  # a live stand-in for the job
        proc = subprocess.Popen(["sleep", "300"], start_new_session=True)
        jobs.append(proc)
        procs.record_job_process(pipe, job, proc.pid, procs.process_started(proc.pid),
                                 ["sleep", "300"])
        _job_ended(pipe, job, "started", None)
        return proc

    monkeypatch.setattr("falkirk.runtime.launcher.start_job", launch)
    monkeypatch.setattr(procs, "stop_regions",
                        lambda pipe, regions, cfg=None, park_s=0.0, epoch_log=None: [])
    monkeypatch.setattr(streams, "rerun_batch_epochs", lambda pipe, inv, cfg=None: {})
    run_id = "scheduled__2026-12-03T14:00:00+00:00"
    try:
        launch(pipeline, "jobs/ingest.py")
        sensor = supervisor.StreamsSensor(task_id="watch", pipeline="reference",
                                          recover_here=True)
        with pytest.raises(TaskDeferred) as deferred:
            sensor.execute({"run_id": run_id})
        trigger = deferred.value.trigger
        assert trigger.serialize()[1] == {"pipeline": "reference", "interval_s": 1.0,
                                          "recover": True, "run_id": run_id}

        def done_rollbacks() -> int:
            return sum(r["status"] == "done" for r in log.rollbacks("reference"))

        async def watch():
            events = trigger.run()
            nxt = asyncio.ensure_future(anext(events))
            for n in (1, 2):  # kill the job that runs; wait for its recovery
                jobs[-1].kill()
                jobs[-1].wait()
                deadline = asyncio.get_running_loop().time() + 60
                while done_rollbacks() < n or len(jobs) < n + 1:
                    assert not nxt.done(), "the trigger ended the watch on a recovery"
                    assert asyncio.get_running_loop().time() < deadline, "not recovered"
                    await asyncio.sleep(0.2)
            await asyncio.sleep(2.5)  # two more looks: the restarted job runs
            assert not nxt.done()

            def refuse(self, request, progress=None, confirmed=None):
                raise rollback.RollbackError("a rollback of pipeline 'reference' is "
                                             "already running")

            monkeypatch.setattr(rollback.RollbackExecutor, "run", refuse)
            jobs[-1].kill()
            jobs[-1].wait()
            return await asyncio.wait_for(nxt, timeout=30)

        event = asyncio.run(watch())
    finally:
        for proc in jobs:
            proc.kill()
            proc.wait()
    assert isinstance(event, TaskSuccessEvent)  # the recover task takes over
    assert read_by_the_watch and len(read_by_the_watch) == len(set(read_by_the_watch))
    rollbacks = [r for r in log.rollbacks("reference") if r["status"] == "done"]
    assert [r["request"]["failed"] for r in rollbacks] == [["ingest"], ["ingest"]]
    assert len(jobs) == 3  # the first job and its two restarts
    plans = watch_plans(STREAMS, run_id)
    assert [p["rollback_id"] for _, p in plans] == [r["rollback_id"] for r in rollbacks]
    assert watch_plans(STREAMS, "another run") == [] and watch_plans(ROLLBACK, run_id) == []


def test_a_job_failing_on_its_own_after_each_restart_is_recovered_ever_later():
    """The trigger recovers within a second; a job that cannot start (it fails on its own
    each time) would make a rollback and a new generation every few seconds. The first
    failure is recovered at once, each next one in a row waits twice as long (capped);
    a kill, or a failure long after the last restart, is recovered at once again."""
    from falkirk.airflow.supervisor import RestartBackoff

    now = [0.0]
    b = RestartBackoff(first_s=2.0, max_s=10.0, reset_s=300.0, clock=lambda: now[0])
    waits = []
    for _ in range(6):
        waits.append(b.delay({"jobs/ingest.py"}))
        b.restarting(["jobs/ingest.py"], {"jobs/ingest.py"})
        now[0] += 5.0  # it fails 5 s after each restart
    assert waits == [0.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert b.delay(set()) == 0.0  # killed, not failed: at once
    b.restarting(["jobs/ingest.py"], set())  # and its run of failures ends
    now[0] += 5.0
    assert b.delay({"jobs/ingest.py"}) == 0.0
    b.restarting(["jobs/ingest.py"], {"jobs/ingest.py"})
    now[0] += 5.0
    assert b.delay({"jobs/ingest.py"}) == 2.0
    b.restarting(["jobs/ingest.py"], {"jobs/ingest.py"})
    now[0] += 301.0  # long after its last restart: a new count
    assert b.delay({"jobs/ingest.py"}) == 0.0
    assert b.delay({"jobs/serve.py"}) == 0.0  # another job's first failure


def test_real_rollback_runs_every_step_on_the_sandbox(rollback_dag, sandbox):
    """No job runs in the sandbox, so nothing is stopped and no batch epoch reruns
    (communities alone goes back, to epoch 2 on purpose: failed alone it would replay to
    epoch 4 and nothing would move): plan, roll back, resume and validate for real. The
    job hosting communities is started again (it must redo epochs 3 and 4 even though it
    is not running); the test stops it afterwards."""
    from reference_world import snapshot

    from falkirk.log.epochlog import EpochLog
    from falkirk.model.topology import load_pipeline
    from falkirk.runtime import procs

    before = snapshot(sandbox)
    try:
        run = rollback_dag.test(run_conf=_conf(dry_run=False, to_epoch=2,
                                               reason="test: communities died"),
                                logical_date=None)
    finally:
        procs.stop_regions(load_pipeline("reference"), {"communities"})
    states = {ti.task_id: ti.state for ti in run.get_task_instances()}
    assert run.state == "success", states
    rerun = next(ti for ti in run.get_task_instances() if ti.task_id == "rerun_and_replay")
    assert list(rerun.xcom_pull(task_ids="rerun_and_replay")["restarted"]) == [
        "jobs/communities.py"]
    after = snapshot(sandbox)
    # the older generation's writers fenced (a commit of no rows), then the table restored
    assert after["user_community"] == before["user_community"] + 2
    assert after["item_popularity"] == before["item_popularity"]  # untouched
    log = EpochLog.from_config(sandbox)
    assert [r["status"] for r in log.rollbacks("reference")] == ["started", "done"]
    entries = log.regions(load_pipeline("reference"))["communities"].entries
    assert max(k[0] for k in entries) == 2  # epochs 3 and 4 invalidated


def test_invalidated_batch_epochs_are_rerun_in_order(tmp_path, monkeypatch):
    """What the rollback DAG and the streams supervisor both do after a rollback: every
    invalidated epoch of a batch region is run again (one --epoch run each, in order);
    stream regions are left to their restarted jobs; a failed rerun names its log."""
    from falkirk.airflow import streams
    from falkirk.errors import FalkirkError
    from falkirk.model.topology import load_pipeline

    monkeypatch.setenv("FALKIRK_VAR_DIR", str(tmp_path))
    pipeline = load_pipeline("reference")
    runs: list[tuple[str, list[str]]] = []
    codes = iter([0, 0, 3])  # the pass of epochs 2-3, epoch 5's run, epoch 4's

    class Finished:
        def wait(self):
            return next(codes)

    def launch(pipe, job, args, cfg=None):
        runs.append((job, args))
        return Finished()

    monkeypatch.setattr("falkirk.runtime.launcher.start_job", launch)
    invalidated = [{"region": "popularity", "time": 3, "generation": 0},
                   {"region": "communities", "time": [3, "inf"], "generation": 0},
                   {"region": "popularity", "time": 2, "generation": 0}]
    invalidated.append({"region": "popularity", "time": 5, "generation": 0})
    assert streams.rerun_batch_epochs(pipeline, invalidated) == {"popularity": [2, 3, 5]}
    assert [(job, args[:4]) for job, args in runs] == [  # consecutive epochs in one pass
        ("jobs/popularity.py", ["--epoch", "2", "--until-epoch", "3"]),
        ("jobs/popularity.py", ["--epoch", "5", "--idle-timeout", "300"])]
    with pytest.raises(FalkirkError, match="rerun of popularity epoch 4 exited 3; see .*"
                                           "reference-popularity.log"):
        streams.rerun_batch_epochs(pipeline, [{"region": "popularity", "time": 4}])


def test_the_supervisor_starts_nothing_while_paused_and_resumes_a_crashed_rollback_first(
        sandbox, monkeypatch):
    """Forced interleaving: a rollback recorded its plan and died (its lease holder is
    gone); the supervisor's start step runs next. It finishes that rollback before it
    starts any job; while a rollback run's pause marker exists it starts nothing."""
    from falkirk.airflow import streams, supervisor
    from falkirk.log.epochlog import EpochLog
    from falkirk.model.topology import load_pipeline
    from falkirk.recovery.rollback import RollbackExecutor, RollbackRequest
    from falkirk.runtime import procs

    pipeline = load_pipeline("reference")
    log = EpochLog.from_config(sandbox)
    executor = RollbackExecutor(pipeline, sandbox, log, stop_regions=lambda regions: None)
    request = RollbackRequest("reference", failed=["communities"], reason="died",
                              dry_run=False)
    plan = executor.plan(request)
    log.record_rollback("reference", plan.rollback_id, plan.generation, "started",
                        {**request.__dict__}, plan.to_json())
    at_start: list[dict | None] = []

    def start_streams(pipe, cfg=None, only=None):
        at_start.append(log.unfinished_rollback("reference"))
        return {}

    monkeypatch.setattr(streams, "start_streams", start_streams)
    monkeypatch.setattr(procs, "stop_regions",
                        lambda pipe, regions, cfg=None, park_s=0.0, epoch_log=None: [])
    marker = streams.pause_marker(pipeline)
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.touch()
    assert supervisor.start("reference") == {} and at_start == []  # paused: nothing at all
    assert log.unfinished_rollback("reference") is not None  # the rollback run's to finish
    marker.unlink()
    supervisor.start("reference")
    assert at_start == [None]  # the crashed rollback was finished before any start
    assert [r["status"] for r in log.rollbacks("reference")] == ["started", "done"]
    assert log.generation("reference") == plan.generation


def test_a_job_killed_between_watches_is_rolled_back_before_it_starts_again(
        sandbox, monkeypatch):
    """Forced interleaving: ingest was killed after the last watch had fired (during the
    last ``recover``, or between two supervisor runs), so no watch saw it. The next run's
    start step must roll its regions back as failed before starting it (restarted as is,
    it would redo epochs whose output its consumers had read). A job a rollback stopped
    (its ``stopped`` row) and one that finished are not deaths: nothing rolls them back."""
    import json
    import subprocess
    from pathlib import Path

    from falkirk.airflow import streams, supervisor
    from falkirk.log.epochlog import EpochLog
    from falkirk.model.topology import load_pipeline
    from falkirk.runtime import procs

    pipeline = load_pipeline("reference")
    log = EpochLog.from_config(sandbox)
    started: list[tuple[str, int]] = []  # job, rollbacks done when it was started

    class Launched:  # what launcher.start_job returns that start_streams reads
        pid = 1

    def launch(pipe, job, args, cfg=None):
        started.append((job, len(log.rollbacks("reference"))))
        return Launched()

    serve = subprocess.Popen(["sleep", "300"], start_new_session=True)  # stands for serve
    try:
        folder = Path(sandbox.var_dir) / "run" / "reference"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "serve.json").write_text(json.dumps(
            {"pid": serve.pid, "pgid": serve.pid, "job": "jobs/serve.py",
             "regions": ["serve", "stats"], "process_started": procs.process_started(serve.pid)}))
        assert procs.stop_regions(pipeline, {"stats"}) == ["jobs/serve.py"]  # as a rollback
        assert serve.wait(timeout=30) is not None
    finally:
        serve.kill()
    assert log.job_runs("reference")["jobs/serve.py"]["status"] == "stopped"
    assert streams.dead_jobs(pipeline, killed_only=True) == {}  # stopped: not a death

    monkeypatch.setattr("falkirk.runtime.launcher.start_job", launch)
    monkeypatch.setattr(procs, "stop_regions",
                        lambda pipe, regions, cfg=None, park_s=0.0, epoch_log=None: [])
    monkeypatch.setattr(streams, "rerun_batch_epochs", lambda pipe, inv, cfg=None: {})
    supervisor.start("reference")  # nothing ran yet: only starts, no rollback
    assert sorted(j for j, _ in started) == sorted(streams.stream_jobs(pipeline))
    assert log.rollbacks("reference") == []
    started.clear()
    _job_ended(pipeline, "jobs/ingest.py", "started", None)  # then SIGKILLed: no end row
    _job_ended(pipeline, "jobs/communities.py", "finished", 0)
    supervisor.start("reference")
    rollbacks = log.rollbacks("reference")
    assert [r["status"] for r in rollbacks] == ["started", "done"]
    assert rollbacks[-1]["request"]["failed"] == ["ingest"]
    assert ("jobs/ingest.py", 2) in started  # after the rollback was done
    assert ("jobs/serve.py", 0) not in started and ("jobs/serve.py", 2) in started
