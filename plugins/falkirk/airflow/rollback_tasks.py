"""The rollback DAG's steps: plan → (dry run stops) → pause → roll back → rerun/replay →
resume → validate.

Each step is a plain function of the run's params and the earlier steps' XComs, wired in
falkirk.airflow.factory.rollback_dag. The work is falkirk's own: RollbackExecutor plans and carries
out the rollback, procs stops and starts the jobs.
"""

from __future__ import annotations

import logging
from typing import Any

from airflow.sdk.exceptions import AirflowFailException

from falkirk.airflow import streams
from falkirk.airflow.render import plan_markdown
from falkirk.errors import FalkirkError
from falkirk.log.epochlog import EpochLog
from falkirk.model.times import DOMAINS
from falkirk.model.topology import Pipeline, load_pipeline
from falkirk.recovery.rollback import RollbackExecutor, RollbackPlan, RollbackRequest
from falkirk.runtime import procs

log = logging.getLogger(__name__)


def request_from_params(params: dict[str, Any], dry_run: bool | None = None
                        ) -> tuple[Pipeline, RollbackRequest]:
    """The RollbackRequest the run's params ask for; refuses regions of another pipeline."""
    pipeline = load_pipeline(params["pipeline"])
    regions = list(params.get("failed_regions") or [])
    outside = [r for r in regions if r not in pipeline.regions]
    if outside:
        raise AirflowFailException(
            f"pipeline {pipeline.name!r} has no region(s) {', '.join(outside)}; its regions "
            f"are {', '.join(pipeline.regions)}. Nothing was changed.")
    to_epoch = params.get("to_epoch")
    common = {"reason": params.get("reason") or "",
              "dry_run": params["dry_run"] if dry_run is None else dry_run}
    if to_epoch is None:
        return pipeline, RollbackRequest(pipeline.name, failed=regions, **common)
    if len(regions) != 1:
        raise AirflowFailException(
            f"with to_epoch, name exactly one region to take back to epoch {to_epoch} "
            f"(got {len(regions)}: {', '.join(regions)}). Nothing was changed.")
    return pipeline, RollbackRequest(pipeline.name, region=regions[0], to_epoch=to_epoch,
                                     **common)


def _publish(ti: Any, plan: RollbackPlan, pipeline: Pipeline) -> dict:
    """Log the plan as a table and hand it on (XCom: the plan page and later steps)."""
    markdown = plan_markdown(plan.to_json(), pipeline)
    log.info("rollback plan:\n%s", markdown)
    ti.xcom_push(key="plan_markdown", value=markdown)
    return plan.to_json()


def plan(params: dict[str, Any], ti: Any) -> dict:
    """Solve the frontiers from the epoch log; changes nothing (refusals end the run)."""
    pipeline, request = request_from_params(params)
    try:
        result = RollbackExecutor(pipeline).plan(request)
    except FalkirkError as exc:
        raise AirflowFailException(f"{exc}. Nothing was changed.") from None
    return _publish(ti, result, pipeline)


def carry_on(params: dict[str, Any]) -> bool:
    """False in a dry run: the run ends after the plan (later steps are skipped)."""
    if params["dry_run"]:
        log.info("dry run: the plan is in this run (plan page, plan task's XCom); "
                 "nothing was stopped or changed")
    return not params["dry_run"]


def pause_streams(params: dict[str, Any], ti: Any) -> list[str]:
    """Stop the jobs hosting the plan's affected regions; the jobs stopped."""
    pipeline = load_pipeline(params["pipeline"])
    affected = RollbackPlan.from_json(ti.xcom_pull(task_ids="plan")).affected
    marker = streams.pause_marker(pipeline)
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(ti.run_id)
    stopped = procs.stop_regions(pipeline, affected)
    log.info("stopped %s for %s", ", ".join(stopped) or "no running job",
             ", ".join(sorted(affected)))
    return stopped


def roll_back(params: dict[str, Any], ti: Any) -> dict:
    """Carry the rollback out (the plan's request, for real); resumes one that crashed."""
    pipeline, request = request_from_params(params, dry_run=False)
    executor = RollbackExecutor(pipeline,
                                stop_regions=lambda regions: procs.stop_regions(pipeline, regions))
    planned = ti.xcom_pull(task_ids="plan") or {}
    try:  # exactly the plan the run showed, or a refusal naming what moved
        done = executor.run(request, progress=log.info, confirmed=planned.get("frontiers"))
    except FalkirkError as exc:
        # Nothing was restored: the streams paused for this run go on as they were.
        stopped = ti.xcom_pull(task_ids="pause_streams") or []
        streams.pause_marker(pipeline).unlink(missing_ok=True)
        restarted = streams.start_streams(pipeline, only=sorted(
            set(stopped) & set(streams.stream_jobs(pipeline))))
        raise AirflowFailException(f"{exc} (restarted {sorted(restarted) or 'nothing'})"
                                   ) from None
    return _publish(ti, done, pipeline)


def rerun_and_replay(params: dict[str, Any], ti: Any) -> dict:
    """Restart the stream jobs hosting affected regions (stopped ones, and ones that had
    finished: they replay from their frontiers) and rerun the batch epochs the rollback
    invalidated, one spark-submit --epoch N each."""
    pipeline = load_pipeline(params["pipeline"])
    done = RollbackPlan.from_json(ti.xcom_pull(task_ids="roll_back"))
    stopped = ti.xcom_pull(task_ids="pause_streams") or []
    stream = streams.stream_jobs(pipeline)
    restart = {j for j in stopped if j in stream} | set(streams.hosting(pipeline, done.affected))
    started = streams.start_streams(pipeline, only=sorted(restart))
    log.info("restarted %s", started or "nothing")
    reran = streams.rerun_batch_epochs(pipeline, done.invalidate)
    return {"restarted": started, "reran": reran}


def resume(params: dict[str, Any], ti: Any) -> list[str]:
    """Lift the pause and check the restarted streams run; the stream jobs running."""
    pipeline = load_pipeline(params["pipeline"])
    streams.pause_marker(pipeline).unlink(missing_ok=True)
    dead = streams.dead_jobs(pipeline)
    restarted = (ti.xcom_pull(task_ids="rerun_and_replay") or {}).get("restarted", {})
    failed = sorted(set(dead) & set(restarted))
    if failed:
        raise FalkirkError(f"restarted job(s) {', '.join(failed)} died again; see "
                           + ", ".join(str(streams.log_file(pipeline, j)) for j in failed))
    running = sorted(info["job"] for info in procs.running(pipeline))
    log.info("streams running: %s", ", ".join(running) or "none")
    return running


def validate(params: dict[str, Any], ti: Any) -> dict[str, Any]:
    """The epoch log shows every affected region at or past its frontier, and the rollback
    recorded as done. (Data checks on the outputs come with issue 7.)"""
    pipeline = load_pipeline(params["pipeline"])
    done = RollbackPlan.from_json(ti.xcom_pull(task_ids="roll_back"))
    epoch_log = EpochLog.from_config()
    logs = epoch_log.regions(pipeline)
    behind, reached = [], {}
    for region in sorted(done.affected):
        spec = pipeline.regions[region]
        dom = DOMAINS[spec.domain]
        frontier = dom.parse(done.frontiers[region])
        rows = [r for r in logs[region].entries.values() if r.status in spec.regime_rules.restorable
                or r.status == "committed"]
        latest = max((dom.parse(r.time) for r in rows), default=dom.bottom)
        reached[region] = dom.dump(latest)
        if not dom.leq(frontier, latest):
            behind.append(f"{region} at {dom.describe(latest)}, frontier "
                          f"{dom.describe(frontier)}")
    states = [r["status"] for r in epoch_log.rollbacks(pipeline.name)
              if r["rollback_id"] == done.rollback_id]
    if "done" not in states:
        behind.append(f"rollback {done.rollback_id} is not recorded as done ({states})")
    if behind:
        raise AirflowFailException("validation failed: " + "; ".join(behind))
    log.info("every affected region is at or past its frontier: %s", reached)
    return reached
