"""Assets, restatements and lineage on a real local Airflow (bin/airflow), on the reference
pipeline's sandbox epoch log (tests/reference_world.py: its tables, no Spark, no broker).

What a running pipeline leaves in its log is written here as its jobs would: epochs
committed in the sandbox, a job killed mid-epoch (its ``running`` row), batch reruns after
a rollback (rows appended to item_popularity and ``committed`` rows in the new
generation). The rollbacks are falkirk's RollbackExecutor, as the supervisor, the rollback
DAG and ``falkirk rollback`` run it. Airflow sees all of it only through the generated
DAGs: the asset events of every committed epoch (count = epochs × outputs), the
restatements of each rollback carried out (none of a dry run), the example consumer
(examples/reference/dags/category_leaders.py) recomputing what each restatement
invalidated, and the OpenLineage events of its tasks in FALKIRK_LINEAGE's file. A browser
then screenshots the asset graph for docs/assets.md.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from test_airflow_live import (
    ARTIFACTS,
    CHROMIUM,
    CHROMIUM_ARGS,
    TEST_PASSWORD,
    _call,
    _free_port,
    _token,
)

from falkirk.config import REPO_ROOT

pytestmark = pytest.mark.slow

PIPELINE = "reference"
CONSUMER = "reference_category_leaders"
OUTPUTS = "falkirk_reference_outputs"
FIGURE = REPO_ROOT / "docs" / "figures" / "asset-graph.png"
WAIT_S = 300  # the dag-processor's first parse, the triggerer's first read, a task's start


@pytest.fixture(scope="module")
def airflow_on_sandbox(tmp_path_factory):
    """bin/airflow with its own home and port on a reference sandbox, lineage to a file."""
    from reference_world import make_reference_world

    root = tmp_path_factory.mktemp("assets_live")
    cfg = make_reference_world(root / "world")
    lineage = root / "lineage.jsonl"
    port = _free_port()
    env = {**os.environ, "FALKIRK_AIRFLOW_HOME": str(root / "airflow"),
           "FALKIRK_LAKE": cfg.lake, "FALKIRK_VAR_DIR": cfg.var_dir,
           "FALKIRK_LINEAGE": f"file:{lineage}", "FALKIRK_AIRFLOW_PASSWORD": TEST_PASSWORD}
    for k in [k for k in env if k.startswith("AIRFLOW")]:
        env.pop(k)
    bin_airflow = str(REPO_ROOT / "bin" / "airflow")
    try:
        subprocess.run([bin_airflow, "start", "--port", str(port)], env=env, check=True,
                       timeout=300)
        url = f"http://127.0.0.1:{port}"
        yield {"url": url, "cfg": cfg, "env": env, "lineage": lineage, "token": _token(url)}
    finally:
        subprocess.run([bin_airflow, "stop"], env=env, timeout=120)


def _get(live: dict, path: str) -> dict:
    status, body = _call(f"{live['url']}/api/v2/{path}", live["token"])
    assert status == 200, (path, body)
    return json.loads(body)


def _assets(live: dict) -> dict[str, int]:
    """Asset name -> id, of the pipeline's assets Airflow knows."""
    found = _get(live, "assets?limit=100&name_pattern=reference.")["assets"]
    return {a["name"]: a["id"] for a in found}


def _events(live: dict, asset_id: int) -> list[dict]:
    """An asset's events, oldest first, each with falkirk's extra (a watcher's payload)."""
    out, offset = [], 0
    while True:
        page = _events_page(live, f"assets/events?asset_id={asset_id}&limit=100"
                                  f"&offset={offset}&order_by=timestamp")
        out += page
        offset += len(page)
        if len(page) < 100:
            break
    for e in out:
        e["falkirk"] = e["extra"].get("payload", e["extra"])
    return out


def _events_page(live: dict, path: str, timeout_s: float = 120) -> list[dict]:
    """One page of asset events. Airflow 3.3.2's endpoint answers 500 while an event has a
    DAG run created but not started yet (AssetEventResponse: "created_dagruns.0.start_date
    Input should be a valid datetime", in the api-server's log): asked again until the
    scheduler starts the run."""
    deadline = time.monotonic() + timeout_s
    while True:
        status, body = _call(f"{live['url']}/api/v2/{path}", live["token"])
        if status == 200:
            return json.loads(body)["asset_events"]
        assert status == 500 and time.monotonic() < deadline, (path, status, body)
        time.sleep(2)


def _wait(what: str, check, timeout_s: float = WAIT_S):
    deadline = time.monotonic() + timeout_s
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(3)


def _trigger_and_wait(live: dict, dag_id: str, conf: dict) -> str:
    runs = f"{live['url']}/api/v2/dags/{dag_id}/dagRuns"
    status, body = _call(runs, live["token"], {"logical_date": None, "conf": conf})
    assert status == 200, body
    quoted = urllib.parse.quote(json.loads(body)["dag_run_id"], safe="")
    return _wait(f"{dag_id} run ends", lambda: (s := json.loads(_call(
        f"{runs}/{quoted}", live["token"])[1])["state"]) in ("success", "failed") and s)


def _rollback(cfg, **request) -> dict:
    """A rollback carried out as the supervisor and the rollback DAG do (no job runs)."""
    from falkirk.model.topology import load_pipeline
    from falkirk.recovery.rollback import RollbackExecutor, RollbackRequest

    plan = RollbackExecutor(load_pipeline(PIPELINE), cfg=cfg).run(
        RollbackRequest(PIPELINE, dry_run=False, **request))
    return plan.to_json()


def _rerun_popularity(cfg, epochs: list[int], seed: int) -> dict[int, list[tuple]]:
    """What popularity's reruns leave: each epoch's ranked rows appended to item_popularity
    and its ``committed`` row in the log's current generation; the rank-1 rows written,
    per epoch, as (category, item_id, revenue)."""
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    from falkirk.log.epochlog import EpochLog, EpochRecord
    from falkirk.model.schemas import arrow_schema
    from falkirk.model.topology import load_pipeline

    pipeline = load_pipeline(PIPELINE)
    log = EpochLog.from_config(cfg)
    generation = log.generation(PIPELINE)
    uri = cfg.table("item_popularity")
    schema = arrow_schema("tables", "item_popularity", pipeline.schema_roots)
    leaders = {}
    for e in epochs:
        rows = [{"epoch": e, "category": c, "item_id": 100 * seed + 10 * e + rank + i,
                 "revenue": float(1000 * seed + 100 * e - rank), "purchases": 5 - rank,
                 "rank": rank} for i, c in enumerate(("books", "games")) for rank in (1, 2)]
        write_deltalake(uri, pa.Table.from_pylist(rows, schema=schema), mode="append")
        version = DeltaTable(uri).version()
        log.record(EpochRecord(PIPELINE, "popularity", e, generation, "committed",
                               outputs={"item_popularity": {"table": "item_popularity",
                                                            "version": version}}))
        leaders[e] = sorted((r["category"], r["item_id"], r["revenue"]) for r in rows
                            if r["rank"] == 1)
    return leaders


def _rerun_one_by_one(cfg, epochs: list[int], seed: int) -> dict[int, list[tuple]]:
    """The reruns committed an epoch at a time, each once the consumer applied the one
    before. Airflow gives an asset-triggered run the events up to when it was queued: of
    a burst, a run takes the first and the rest wait for the run the next event queues
    (docs/assets.md), which a live pipeline's next commit brings and this log does not."""
    out: dict[int, list[tuple]] = {}
    for e in epochs:
        rows = _rerun_popularity(cfg, [e], seed)[e]
        out[e] = rows
        _wait(f"the consumer applied epoch {e}",
              lambda e=e, rows=rows: _leaders(cfg).get(e) == rows)
    return out


def _leaders(cfg) -> dict[int, list[tuple]]:
    from deltalake import DeltaTable

    uri = cfg.table("category_leaders")
    if not DeltaTable.is_deltatable(uri):
        return {}
    out: dict[int, list[tuple]] = {}
    for r in DeltaTable(uri).to_pyarrow_table().to_pylist():
        out.setdefault(r["epoch"], []).append((r["category"], r["item_id"], r["revenue"]))
    return {e: sorted(rows) for e, rows in out.items()}


def _restatements(live: dict, asset_id: int) -> list[dict]:
    return [e["falkirk"] for e in _events(live, asset_id) if e["falkirk"].get("restated")]


def test_epochs_and_restatements_reach_airflow_and_the_consumer_recomputes(
        airflow_on_sandbox):
    from reference_world import DONE

    from falkirk.log.announcements import output_places
    from falkirk.log.epochlog import EpochLog, EpochRecord
    from falkirk.model.topology import load_pipeline

    live, cfg = airflow_on_sandbox, airflow_on_sandbox["cfg"]
    pipeline = load_pipeline(PIPELINE)
    _wait("the consumer DAG parsed", lambda: _call(
        f"{live['url']}/api/v2/dags/{CONSUMER}", live["token"])[0] == 200)
    status, body = _call(f"{live['url']}/api/v2/dags/{CONSUMER}", live["token"])
    assert json.loads(body)["is_paused"] is True  # a consumer is turned on by its owner
    req = urllib.request.Request(f"{live['url']}/api/v2/dags/{CONSUMER}",
                                 data=json.dumps({"is_paused": False}).encode(),
                                 method="PATCH", headers={
                                     "Content-Type": "application/json",
                                     "Authorization": f"Bearer {live['token']}"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.status == 200
    assert json.loads(_call(f"{live['url']}/api/v2/dags/{OUTPUTS}", live["token"])[1]
                      )["is_paused"] is False

    # 1. every epoch the sandbox's stream regions committed: one event per output written
    expected: dict[str, list[int]] = {}
    for region, last in DONE.items():
        if pipeline.regions[region].regime_rules.runs_per_epoch:
            continue  # a batch region's runs announce its epochs (none ran here)
        delta = {p.name for p in output_places(pipeline, region).values() if p.kind == "table"}
        for table in delta:  # the sandbox's rows name the tables each epoch committed
            expected[f"{PIPELINE}.{table}"] = list(range(last + 1))
    committed = {(r.region, r.epoch): {o["table"]: o["version"] for o in r.outputs.values()}
                 for r in EpochLog.from_config(cfg).records(PIPELINE)}
    total = sum(len(v) for v in expected.values())
    assert total == 18 + 5 + 4 + 4  # ingest 3 tables × 6, communities 5, serve 4, stats 4
    ids = _wait("every output's asset", lambda: (a := _assets(live)) and
                set(expected) <= set(a) and a)
    assert f"{PIPELINE}.topic.responses" in ids and f"{PIPELINE}.item_popularity" in ids
    assets = _wait("an event for every committed epoch", lambda: (got := {
        name: _events(live, ids[name]) for name in expected}) and sum(
        map(len, got.values())) >= total and got)
    for name, events in assets.items():
        assert [e["falkirk"]["epoch"] for e in events] == expected[name], name
        for e in events:
            extra = e["falkirk"]
            assert extra["pipeline"] == PIPELINE and extra["generation"] == 0
            assert extra["table"] == name.split(".", 1)[1]
            assert extra["table_version"] == committed[(extra["region"], extra["epoch"])][
                name.split(".", 1)[1]]
    assert sum(map(len, assets.values())) == total  # not one more

    # 2. a dry run of the rollback DAG restates nothing; 3. a job killed mid-epoch 5 and
    # the supervisor's rollback of its region: its epoch in flight is restated
    assert _trigger_and_wait(live, "falkirk_reference_rollback", {
        "pipeline": PIPELINE, "failed_regions": ["communities"],
        "reason": "dry run"}) == "success"
    log = EpochLog.from_config(cfg)
    log.record(EpochRecord(PIPELINE, "communities", [5, "inf"], 0, "running",
                           note="a job killed mid-epoch"))
    killed = _rollback(cfg, failed=["communities"], reason="communities killed")
    assert killed["frontiers"]["communities"] == [4, "inf"]
    community = ids[f"{PIPELINE}.user_community"]
    restated = _wait("the kill's restatement", lambda: _restatements(live, community))
    assert restated == [{
        "pipeline": PIPELINE, "region": "communities", "restated": True, "from_epoch": 5,
        "to_epoch": 5, "generation": 1, "rollback_id": killed["rollback_id"],
        "table": "user_community", "restored_to_version": 5}]  # the dry run made none

    # 4. popularity taken back to epoch 1: its table and serve's outputs are restated,
    # the consumer runs on it; the reruns commit 2..4 again and it reads exactly those
    popularity = ids[f"{PIPELINE}.item_popularity"]
    back = _rollback(cfg, region="popularity", to_epoch=1, reason="a bad deploy")
    assert back["generation"] == 2
    got = _wait("popularity's restatement", lambda: _restatements(live, popularity))
    assert [(r["from_epoch"], r["to_epoch"], r["generation"], r["rollback_id"])
            for r in got] == [(2, 4, 2, back["rollback_id"])]
    stats = _restatements(live, ids[f"{PIPELINE}.query_stats"])
    assert [(r["region"], r["from_epoch"], r["to_epoch"]) for r in stats] == [("stats", 3, 3)]
    first = _rerun_one_by_one(cfg, [2, 3, 4], seed=1)
    _wait("the consumer computed the reruns", lambda: _leaders(cfg) == first)

    # 5. popularity back to epoch 2: the consumer drops 3 and 4 at the restatement, then
    # takes the new reruns' rows; epoch 2 keeps the first reruns'
    again = _rollback(cfg, region="popularity", to_epoch=2, reason="another bad deploy")
    _wait("the consumer dropped the restated epochs",
          lambda: _leaders(cfg) == {2: first[2]})
    second = _rerun_one_by_one(cfg, [3, 4], seed=2)
    _wait("the consumer recomputed them", lambda: _leaders(cfg) == {2: first[2], **second})
    commits = [e["falkirk"] for e in _events(live, popularity)]
    assert [(c.get("restated", False), c.get("epoch"), c["generation"]) for c in commits] == [
        (True, None, 2), (False, 2, 2), (False, 3, 2), (False, 4, 2),
        (True, None, 3), (False, 3, 3), (False, 4, 3)]
    assert commits[4]["rollback_id"] == again["rollback_id"]
    # the run that wrote the last rows may still be closing (its state set after its
    # task's commit): every run once ended, none failed
    runs = _wait("every consumer run ended", lambda: (got := _get(
        live, f"dags/{CONSUMER}/dagRuns?limit=100")["dag_runs"]) and not any(
        r["state"] in ("queued", "running") for r in got) and got)
    assert {r["state"] for r in runs} == {"success"}, runs


def test_airflow_tasks_send_openlineage_events_to_the_lineage_file(airflow_on_sandbox):
    """``falkirk airflow start`` hands FALKIRK_LINEAGE to Airflow's OpenLineage provider:
    each task that ran (the rollback DAG's dry run, the consumer's runs) has a START and
    a COMPLETE event in the file, in falkirk's namespace; the consumer's names the table it
    writes as its output dataset."""
    live = airflow_on_sandbox
    _trigger_and_wait(live, "falkirk_reference_rollback", {
        "pipeline": PIPELINE, "failed_regions": ["serve"], "reason": "lineage"})
    events = _wait("lineage events of the dry run", lambda: live["lineage"].exists() and (
        got := [json.loads(line) for line in live["lineage"].read_text().splitlines()])
        and any(e["job"]["name"] == "falkirk_reference_rollback.plan" and
                e["eventType"] == "COMPLETE" for e in got) and got, timeout_s=120)
    by_job: dict[str, set[str]] = {}
    for e in events:
        by_job.setdefault(e["job"]["name"], set()).add(e["eventType"])
    assert {"START", "COMPLETE"} <= by_job["falkirk_reference_rollback.plan"], by_job
    assert {e["job"]["namespace"] for e in events} == {"falkirk"}
    # the consumer ran in the test before this one
    leaders = [e for e in events if e["job"]["name"] == f"{CONSUMER}.leaders"
               and e["eventType"] == "COMPLETE"]
    assert leaders, by_job
    outputs = {(o["namespace"], o["name"]) for e in leaders for o in e["outputs"]}
    assert ("file", live["cfg"].table("category_leaders")) in outputs, outputs


@pytest.mark.skipif(not Path(CHROMIUM).exists() and not os.environ.get("CI"),
                    reason="Debian chromium not installed: run bin/setup (under CI, "
                           "which runs bin/setup, the test runs and fails instead)")
def test_the_asset_graph_in_the_ui(airflow_on_sandbox):
    """The item_popularity asset's page draws its graph: the batch DAG that writes it, the
    consumer and the outputs DAG scheduled on it; kept as docs/figures/asset-graph.png."""
    from playwright.sync_api import expect, sync_playwright

    live = airflow_on_sandbox
    ids = _assets(live)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        page = browser.new_context(viewport={"width": 1440, "height": 900}).new_page()
        page.set_default_timeout(60_000)
        try:
            page.goto(f"{live['url']}/assets/{ids[f'{PIPELINE}.item_popularity']}")
            page.get_by_label("Username").fill("admin")
            page.get_by_label("Password").fill(TEST_PASSWORD)
            page.get_by_role("button", name="Sign in").click()
            page.wait_for_url(f"{live['url']}/assets/*")
            graph = page.locator(".react-flow")
            for name in (f"{PIPELINE}.item_popularity", CONSUMER, OUTPUTS,
                         "falkirk_reference_batch_popularity"):
                expect(graph.get_by_text(name, exact=True).first).to_be_visible()
            page.wait_for_timeout(1500)  # the graph's layout settles
            page.screenshot(path=str(ARTIFACTS / "asset-graph.png"))
            FIGURE.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(FIGURE))
        except Exception:
            page.screenshot(path=str(ARTIFACTS / "asset-graph-failure.png"))
            raise
        finally:
            browser.close()
