"""Announcements, assets and lineage without a running Airflow: on the reference pipeline's
sandbox epoch log (delta-rs, no Spark), with falkirk's real rollbacks.

What the epoch log announces (falkirk.log.announcements), in the same order however it is
read; the assets' URIs; the epoch log watcher's trigger run as the triggerer runs it
(a shared stream, each asset's trigger filtering it); a batch run's outlet extras; the
OpenLineage events the jobs send with the file transport, and the lineage Airflow's tasks
hand the provider. tests/test_assets_live.py does it on a live Airflow."""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from falkirk.config import ConfigError, load
from falkirk.log.announcements import Announcements, Place, pipeline_places
from falkirk.log.epochlog import EpochLog, EpochRecord
from falkirk.model.topology import load_pipeline

PIPELINE = "reference"


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """The reference sandbox (tests/reference_world.py), selected through FALKIRK_*."""
    from reference_world import make_reference_world

    cfg = make_reference_world(tmp_path)
    monkeypatch.setenv("FALKIRK_LAKE", cfg.lake)
    monkeypatch.setenv("FALKIRK_VAR_DIR", cfg.var_dir)
    return cfg


def _rollback(cfg, **request):
    from falkirk.recovery.rollback import RollbackExecutor, RollbackRequest

    return RollbackExecutor(load_pipeline(PIPELINE), cfg=cfg).run(
        RollbackRequest(PIPELINE, reason="test", **request))


def _read(cfg) -> Announcements:
    feed = Announcements(load_pipeline(PIPELINE))
    feed.read(EpochLog.from_config(cfg))
    return feed


def test_every_stream_commit_is_announced_once_per_table_it_wrote(sandbox):
    from reference_world import DONE

    feed = _read(sandbox)
    got = [(a.place.name, a.extra["region"], a.extra["epoch"]) for a in feed.commits]
    pipeline = load_pipeline(PIPELINE)
    writers = pipeline_places(pipeline)
    expected = sorted((p.name, r, e) for p, r in writers.items() for e in range(DONE[r] + 1)
                      if p.kind == "table" and r != "popularity")  # the sandbox sends nothing
    assert sorted(got) == expected and len(got) == 31
    assert all(a.kind == "commit" and a.extra["generation"] == 0 for a in feed.commits)
    # the batch region's epochs are its runs' to announce
    assert not [a for a in feed.commits if a.extra["region"] == "popularity"]
    # a region that checkpoints an epoch it already committed (caught up) wrote nothing new
    log = EpochLog.from_config(sandbox)
    row = log.regions(pipeline)["stats"].entries[3]
    log.record(EpochRecord(PIPELINE, "stats", 3, 0, "checkpointed", outputs=row.outputs,
                           state_ref="checkpoint:3", note="caught up"))
    assert not feed.read(log)


def test_a_rollback_restates_its_regions_outputs_and_their_reruns_are_announced(sandbox):
    log = EpochLog.from_config(sandbox)
    feed = _read(sandbox)
    commits = len(feed.commits)
    assert _rollback(sandbox, region="popularity", to_epoch=1, dry_run=True)
    assert not feed.read(log)  # a dry run records nothing, so announces nothing
    plan = _rollback(sandbox, region="popularity", to_epoch=1, dry_run=False)
    assert feed.read(log)
    restated = {(a.place.name, a.extra["region"], a.extra["from_epoch"], a.extra["to_epoch"])
                for a in feed.restatements}
    # serve read item_popularity's epoch e - 1 in its epoch e: it goes back too, with stats
    assert restated == {("item_popularity", "popularity", 2, 4),
                        ("responses", "serve", 3, 3), ("query_dead_letters", "serve", 3, 3),
                        ("query_stats", "stats", 3, 3)}
    table = next(a for a in feed.restatements if a.place == Place("table", "item_popularity"))
    assert table.extra == {"pipeline": PIPELINE, "region": "popularity", "restated": True,
                           "from_epoch": 2, "to_epoch": 4, "generation": plan.generation,
                           "rollback_id": plan.rollback_id, "table": "item_popularity",
                           "restored_to_version": 2}
    assert len(feed.commits) == commits
    # the batch region's reruns (after the invalidation of their epochs) are announced here
    log.record(EpochRecord(PIPELINE, "popularity", 2, plan.generation, "committed",
                           outputs={"item_popularity": {"table": "item_popularity",
                                                        "version": 9}}))
    assert feed.read(log)
    assert feed.commits[-1].extra == {"pipeline": PIPELINE, "region": "popularity",
                                      "epoch": 2, "generation": plan.generation,
                                      "table": "item_popularity", "table_version": 9}
    # the same log read anew gives the same announcements in the same places
    fresh = _read(sandbox)
    assert fresh.commits == feed.commits and fresh.restatements == feed.restatements


def test_the_watchers_shared_stream_gives_each_asset_its_announcements_once(airflow_env,
                                                                          sandbox):
    """Two assets' triggers on one shared stream, as the triggerer runs them: each yields
    the announcements naming its place; a trigger that starts again with the cursor the
    first kept yields only what came since."""
    from falkirk.airflow.assets import EpochLogTrigger

    class Store:  # the asset state store's two calls, kept in memory
        def __init__(self):
            self.values = {}

        async def aget(self, key, default=None):
            return self.values.get(key, default)

        async def aset(self, key, value):
            self.values[key] = value

    async def collect(trigger, seconds=3.0):
        """What the trigger yields in ``seconds`` (the stream reads every 0.1 s)."""
        stream = trigger.filter_shared_stream(EpochLogTrigger.open_shared_stream(
            {**trigger.serialize()[1], "interval_s": 0.1}))
        got = []

        async def take():
            async for event in stream:
                got.append(event.payload)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(take(), seconds)
        return got

    interactions = EpochLogTrigger(PIPELINE, "table", "interactions")
    interactions.asset_state_store = Store()
    events = asyncio.run(collect(interactions))
    assert [e["epoch"] for e in events] == list(range(6))
    assert interactions.asset_state_store.values["falkirk_epoch_log_cursor"]["commits"] == 31
    # a restart with that cursor: only the kill's restatement, not the history again
    log = EpochLog.from_config(sandbox)
    log.record(EpochRecord(PIPELINE, "ingest", 6, 0, "running"))
    plan = _rollback(sandbox, failed=["ingest"], dry_run=False)
    again = EpochLogTrigger(PIPELINE, "table", "interactions")
    again.asset_state_store = interactions.asset_state_store
    events = asyncio.run(collect(again))
    assert events == [{"pipeline": PIPELINE, "region": "ingest", "restated": True,
                       "from_epoch": 6, "to_epoch": 6, "generation": plan.generation,
                       "rollback_id": plan.rollback_id, "table": "interactions",
                       "restored_to_version": 6}]


def test_assets_are_named_by_the_stores_uri(airflow_env, sandbox):
    from falkirk.airflow.assets import output_asset

    pipeline = load_pipeline(PIPELINE)
    table = output_asset(pipeline, "item_popularity")
    assert (table.name, table.uri) == ("reference.item_popularity",
                                       f"file://{sandbox.lake}/item_popularity")
    topic = output_asset(pipeline, Place("topic", "responses"))
    assert (topic.name, topic.uri) == ("reference.topic.responses",
                                       f"kafka://{sandbox.kafka_bootstrap}/responses")
    store = replace(sandbox, lake="s3://falkirk/lake",
                    kafka_bootstrap="k1:9092,k2:9092,k3:9092")
    assert output_asset(pipeline, "item_popularity", store).uri == \
        "s3://falkirk/lake/item_popularity"
    assert output_asset(pipeline, Place("topic", "responses"), store).uri == \
        "kafka://k1:9092/responses"
    assert [w.trigger.serialize()[1] for w in table.watchers] == [
        {"pipeline": PIPELINE, "kind": "table", "name": "item_popularity", "interval_s": 2.0}]
    with pytest.raises(ValueError, match="pipeline 'reference' writes no table events"):
        output_asset(pipeline, "events")


def test_a_batch_run_announces_its_epoch_as_its_outlets_extra(airflow_env, sandbox):
    from airflow.sdk.exceptions import AirflowFailException
    from airflow.sdk.execution_time.context import OutletEventAccessors

    from falkirk.airflow.assets import announce_epoch, output_asset

    pipeline = load_pipeline(PIPELINE)
    context = {"outlet_events": OutletEventAccessors()}
    lineage = announce_epoch(context, pipeline, "popularity", [3])
    extra = context["outlet_events"][output_asset(pipeline, "item_popularity")].extra
    assert extra == {"pipeline": PIPELINE, "region": "popularity", "epoch": 3,
                     "generation": 0, "table": "item_popularity", "table_version": 4}
    assert [(d.namespace, d.name) for d in lineage.inputs] == [
        ("file", f"{sandbox.lake}/purchases")]
    assert [(d.namespace, d.name, d.facets["version"].datasetVersion)
            for d in lineage.outputs] == [("file", f"{sandbox.lake}/item_popularity", "4")]
    facet = lineage.run_facets["falkirk"]
    assert (facet.pipeline, facet.region, facet.epoch, facet.generation) == (
        PIPELINE, "popularity", 3, 0)
    with pytest.raises(AirflowFailException, match="popularity epoch 7: the epoch log "
                                                   "shows nothing, not committed"):
        announce_epoch(context, pipeline, "popularity", [7])
    announce_epoch(context, pipeline, "popularity", [2, 3])  # a run that caught up
    extra = context["outlet_events"][output_asset(pipeline, "item_popularity")].extra
    assert (extra["from_epoch"], extra["epoch"], extra["table_version"]) == (2, 3, 4)


def test_a_consumer_gets_the_same_extras_from_a_run_and_from_the_watcher(airflow_env):
    from airflow.sdk.execution_time.comms import AssetEventDagRunReferenceResult
    from airflow.sdk.execution_time.context import TriggeringAssetEventsAccessor

    from falkirk.airflow.assets import epoch_events, output_asset

    asset = output_asset(PIPELINE, "item_popularity")
    commit = {"pipeline": PIPELINE, "region": "popularity", "epoch": 2, "generation": 0,
              "table": "item_popularity", "table_version": 3}
    restated = {"pipeline": PIPELINE, "region": "popularity", "restated": True,
                "from_epoch": 2, "to_epoch": 4, "generation": 1, "rollback_id": "r1",
                "table": "item_popularity", "restored_to_version": 2}
    t0 = datetime(2026, 1, 1, tzinfo=UTC)

    def event(extra, seconds):
        return AssetEventDagRunReferenceResult(
            asset={"name": asset.name, "uri": asset.uri, "extra": {}}, extra=extra,
            source_task_id=None, source_dag_id=None, source_run_id=None,
            source_map_index=None, source_aliases=[], timestamp=t0 + timedelta(seconds=seconds))

    events = TriggeringAssetEventsAccessor.build([
        event({"from_trigger": True, "payload": restated}, 2), event(commit, 1),
        event({"note": "an event of someone else's"}, 3)])
    assert epoch_events(events, asset) == [commit, restated]
    assert epoch_events(events, output_asset(PIPELINE, "user_community")) == []


def test_the_jobs_lineage_goes_to_the_file_of_the_setting(tmp_path, monkeypatch):
    from falkirk.io.lineage import epochs_committed, run_id

    path = tmp_path / "lineage.jsonl"
    monkeypatch.setenv("FALKIRK_LINEAGE", f"file:{path}")
    cfg = load()
    pipeline = load_pipeline(PIPELINE)
    rows = [EpochRecord(PIPELINE, "serve", 4, 2, "committed",
                        inputs={"queries": {"from": {"0": 10}, "to": {"0": 20}}},
                        outputs={"responses": {"topic": "responses", "records": 10},
                                 "query_dead_letters": {"table": "query_dead_letters",
                                                        "version": 8}}),
            EpochRecord(PIPELINE, "stats", 4, 2, "running")]
    assert epochs_committed(cfg, pipeline, rows) == 1
    [event] = [json.loads(line) for line in path.read_text().splitlines()]
    assert event["eventType"] == "COMPLETE" and event["job"] == {
        "namespace": "falkirk", "name": "reference.serve", "facets": {}}
    assert event["run"]["runId"] == run_id(PIPELINE, "serve", 4, 2)
    facet = event["run"]["facets"]["falkirk"]
    assert {k: facet[k] for k in ("pipeline", "region", "epoch", "generation")} == {
        "pipeline": PIPELINE, "region": "serve", "epoch": 4, "generation": 2}
    assert facet["_schemaURL"].startswith("urn:falkirk:")
    lake, kafka = cfg.lake, f"kafka://{cfg.kafka_bootstrap.split(',')[0]}"
    # serve reads the queries topic and three tables (item_popularity, user_community and
    # interactions, each a day late)
    assert sorted((d["namespace"], d["name"]) for d in event["inputs"]) == sorted([
        (kafka, "queries"), ("file", f"{lake}/item_popularity"),
        ("file", f"{lake}/user_community"), ("file", f"{lake}/interactions")])
    outputs = {(d["namespace"], d["name"]): d["facets"] for d in event["outputs"]}
    assert outputs == {(kafka, "responses"): {}, ("file", f"{lake}/query_dead_letters"): {
        "version": {**outputs[("file", f"{lake}/query_dead_letters")]["version"],
                    "datasetVersion": "8"}}}
    monkeypatch.setenv("FALKIRK_LINEAGE", "")
    assert epochs_committed(load(), pipeline, rows) == 0


def test_a_rollbacks_lineage_names_what_it_restated(airflow_env, sandbox):
    from falkirk.airflow.assets import rollback_lineage

    plan = _rollback(sandbox, region="popularity", to_epoch=1, dry_run=False)
    lineage = rollback_lineage(load_pipeline(PIPELINE), plan.to_json())
    names = sorted(d.name.rsplit("/", 1)[-1] for d in lineage.outputs)
    assert names == ["item_popularity", "query_dead_letters", "query_stats", "responses"]
    facet = lineage.run_facets["falkirk"]
    assert (facet.generation, facet.restated) == (plan.generation, {
        "rollback_id": plan.rollback_id,
        "regions": {"popularity": [2, 4], "serve": [3, 3], "stats": [3, 3]}})


@pytest.mark.parametrize("setting", ["marquez", "file:relative.jsonl", "ftp://host/x",
                                     "http://", "file:/tmp/folder/"])
def test_a_bad_lineage_setting_is_refused_naming_it(setting, monkeypatch):
    monkeypatch.setenv("FALKIRK_LINEAGE", setting)
    with pytest.raises(ConfigError, match=f"FALKIRK_LINEAGE={setting!r} is not a lineage "
                                          "setting: use one of '' \\(off\\); file:<path>"):
        load()


def test_airflow_gets_the_lineage_setting_as_its_providers(monkeypatch):
    from falkirk.local.airflow import lineage_settings

    monkeypatch.setenv("FALKIRK_LINEAGE", "http://127.0.0.1:5000")
    assert lineage_settings(load(), {}) == {
        "AIRFLOW__OPENLINEAGE__TRANSPORT": '{"type": "http", "url": "http://127.0.0.1:5000"}',
        "AIRFLOW__OPENLINEAGE__NAMESPACE": "falkirk"}
    given = {"AIRFLOW__OPENLINEAGE__NAMESPACE": "mine"}
    assert lineage_settings(load(), given)["AIRFLOW__OPENLINEAGE__NAMESPACE"] == "mine"
    monkeypatch.setenv("FALKIRK_LINEAGE", "")
    assert lineage_settings(load(), {}) == {}
