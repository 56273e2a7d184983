"""What every falkirk DAG shares: default args, tags and the rollback DAGs' params.

The params' enums come from the pipeline declaration, so Airflow itself refuses an
unknown region (in the trigger form, the REST API and ``dags test``) before
any task runs.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from airflow.sdk import Param

from falkirk.model.topology import Pipeline

DEFAULT_ARGS: dict[str, Any] = {
    "owner": "falkirk",
    "retries": 1,  # a flaky start (JVM, broker) gets one more try; refusals do not retry
    "retry_delay": timedelta(seconds=20),
}
TAGS = ["falkirk"]
#: The retries of a batch epoch's task. Its rerun is safe (the epoch's outputs are written
#: exactly once) and is the batch regime's recovery, so a try killed with the engine, the
#: broker or the worker is tried again, each wait twice the one before (10 s to 2 min, about
#: 10 minutes in all): one retry 20 s later left an epoch failed under repeated faults, and
#: every region downstream waiting for it. Refusals (AirflowFailException) never retry.
BATCH_EPOCH_RETRIES: dict[str, Any] = {
    "retries": 8,
    "retry_delay": timedelta(seconds=10),
    "retry_exponential_backoff": 2.0,
    "max_retry_delay": timedelta(minutes=2),
}


def rollback_params(pipeline: Pipeline) -> dict[str, Param]:
    """A pipeline's rollback DAG's params, validated by Airflow's JSON schema before a run
    starts: its name is fixed, its regions are the enum."""
    regions = list(pipeline.regions)
    return {
        "pipeline": Param(
            pipeline.name, type="string", enum=[pipeline.name],
            title="Pipeline", description="The declared pipeline this DAG rolls back."),
        "failed_regions": Param(
            # examples: the trigger form offers a multi-select of them (an array param
            # without examples or a top-level enum gets a textarea); items.enum is what
            # Airflow validates against
            [], type="array", minItems=1, uniqueItems=True,
            items={"type": "string", "enum": regions}, examples=regions,
            title="Regions",
            description="The regions that failed (pick one or more). With 'to_epoch': "
                        "exactly one region, the one to take back on purpose."),
        "to_epoch": Param(
            None, type=["null", "integer"], minimum=-1,
            title="Back to epoch (optional)",
            description="Take the region back to this epoch on purpose (e.g. after a bad "
                        "deploy); -1 means before the first epoch. Leave empty after a failure."),
        "dry_run": Param(
            True, type="boolean", title="Dry run",
            description="Only compute and show the plan; nothing is stopped or changed."),
        "reason": Param(
            type="string", minLength=1, maxLength=500, title="Reason",
            description="Why: recorded with the rollback in the epoch log."),
    }
