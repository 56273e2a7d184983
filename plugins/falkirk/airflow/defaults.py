"""What every falkirk DAG shares: default args, tags and the rollback DAG's params.

The params' enums come from the pipeline declarations, so Airflow itself refuses an
unknown pipeline or region (in the trigger form, the REST API and ``dags test``) before
any task runs.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from airflow.sdk import Param

from falkirk.model.topology import declared, load_pipeline

DEFAULT_ARGS: dict[str, Any] = {
    "owner": "falkirk",
    "retries": 1,  # a flaky start (JVM, broker) gets one more try; refusals do not retry
    "retry_delay": timedelta(seconds=20),
}
TAGS = ["falkirk"]


def pipeline_names() -> list[str]:
    """Declared pipelines (schemas/pipelines/*.yaml), sorted."""
    return list(declared())


def all_regions() -> list[str]:
    """Every region of every declared pipeline, sorted (the plan task narrows it)."""
    return sorted({r for name in declared() for r in load_pipeline(name).regions})


def rollback_params() -> dict[str, Param]:
    """The rollback DAG's params, validated by Airflow's JSON schema before a run starts."""
    pipelines = pipeline_names()
    return {
        "pipeline": Param(
            pipelines[0] if pipelines else None, type="string", enum=pipelines,
            title="Pipeline", description="The declared pipeline to roll back."),
        "failed_regions": Param(
            # examples: the trigger form offers a multi-select of them (an array param
            # without examples or a top-level enum gets a textarea); items.enum is what
            # Airflow validates against
            [], type="array", minItems=1, uniqueItems=True,
            items={"type": "string", "enum": all_regions()}, examples=all_regions(),
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
