"""The streams supervisor's steps: start the stream jobs, watch them (a reschedule-mode
sensor: it holds no worker slot between pokes), roll back and restart the dead ones."""

from __future__ import annotations

import logging
from typing import Any

from airflow.sdk import BaseSensorOperator, PokeReturnValue

from falkirk.airflow import streams
from falkirk.airflow.render import plan_markdown
from falkirk.model.topology import load_pipeline
from falkirk.recovery.rollback import RollbackExecutor, RollbackRequest
from falkirk.runtime import procs

log = logging.getLogger(__name__)


def start(pipeline: str) -> dict[str, int]:
    """Start the stream jobs that are neither running nor finished (their input ended).

    Not while a rollback run has paused the streams (it starts them itself), and not before
    a rollback that crashed half-way is finished: it is resumed first, from the epoch log
    (the generation it moved to is the one the jobs must start in).
    """
    from falkirk.log.epochlog import EpochLog

    pipe = load_pipeline(pipeline)
    if streams.pause_marker(pipe).exists():
        log.info("a rollback run paused the streams (%s): it restarts them; starting nothing",
                 streams.pause_marker(pipe))
        return {}
    pending = EpochLog.from_config().unfinished_rollback(pipe.name)
    if pending is not None:
        log.info("rollback %s did not finish: resuming it before any job starts",
                 pending["rollback_id"])
        request = RollbackRequest(**{**pending["request"], "dry_run": False})
        RollbackExecutor(pipe, stop_regions=lambda regions: procs.stop_regions(pipe, regions)
                         ).run(request, progress=log.info)
    started = streams.start_streams(pipe)
    log.info("started %s", started or "nothing: every stream job runs or has finished")
    return started


class PipelineSensor(BaseSensorOperator):
    """A sensor on one pipeline, in reschedule mode (no worker slot held between pokes)."""

    template_fields = ("pipeline",)

    def __init__(self, *, pipeline: str, **kwargs: Any) -> None:
        kwargs.setdefault("mode", "reschedule")
        kwargs.setdefault("poke_interval", 30)
        super().__init__(**kwargs)
        self.pipeline = pipeline


class StreamsSensor(PipelineSensor):
    """Done when a stream job died (its XCom: job -> regions). Pauses by a rollback run are
    not deaths. When every stream job finished because its input ended it keeps watching:
    ending would only make the @continuous DAG start a run after run with nothing to start,
    and a rollback run may start the jobs again."""

    def poke(self, context: Any) -> PokeReturnValue | bool:
        pipeline = load_pipeline(self.pipeline)
        dead = streams.dead_jobs(pipeline)
        if dead:
            self.log.info("dead: %s", dead)
            return PokeReturnValue(is_done=True, xcom_value=dead)
        if not procs.running(pipeline) and not streams.pause_marker(pipeline).exists():
            from falkirk.runtime import standby

            self.log.info("every stream job finished: its input ended (pause the DAG to "
                          "stop supervising); standby drivers stopped: %s",
                          standby.stop_all(pipeline) or "none")
        return False


def recover(pipeline: str, ti: Any) -> dict[str, Any]:
    """Roll back the dead jobs' regions (as failed), restart every job stopped, and rerun
    the batch epochs the rollback invalidated."""
    dead: dict[str, list[str]] = ti.xcom_pull(task_ids="watch") or {}
    if not dead:
        log.info("nothing died")
        return {}
    pipe = load_pipeline(pipeline)
    stopped: list[str] = []

    def stop(regions: set[str]) -> None:
        stopped.extend(procs.stop_regions(pipe, regions))

    failed = sorted({r for regions in dead.values() for r in regions})
    request = RollbackRequest(pipe.name, failed=failed, dry_run=False,
                              reason=f"supervisor ({ti.run_id}): job(s) "
                                     f"{', '.join(sorted(dead))} died")
    done = RollbackExecutor(pipe, stop_regions=stop).run(request, progress=log.info)
    markdown = plan_markdown(done.to_json(), pipe)
    log.info("rollback plan:\n%s", markdown)
    ti.xcom_push(key="plan_markdown", value=markdown)
    ti.xcom_push(key="plan", value=done.to_json())
    restart = set(dead) | set(stopped) | set(streams.hosting(pipe, done.affected))
    restarted = streams.start_streams(pipe, only=sorted(restart))
    log.info("restarted %s", restarted)
    reran = streams.rerun_batch_epochs(pipe, done.invalidate)  # as the rollback DAG does
    log.info("reran batch epochs %s", reran or "none")
    return {"rollback_id": done.rollback_id, "restarted": restarted, "reran": reran}
