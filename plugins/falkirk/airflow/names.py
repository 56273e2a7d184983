"""The ids of the DAGs falkirk generates for a declared pipeline.

No Airflow import here: the demo, the CLI and the tests name DAGs without loading Airflow.
"""

from __future__ import annotations


def streams(pipeline: str) -> str:
    """Starts, watches and recovers the pipeline's streaming jobs."""
    return f"falkirk_{pipeline}_streams"


def streams_pipeline(dag_id: str) -> str | None:
    """The pipeline whose streams DAG ``dag_id`` is (None for another DAG)."""
    name = dag_id.removeprefix("falkirk_").removesuffix("_streams")
    return name if name and streams(name) == dag_id else None


def stream_checks(pipeline: str) -> str:
    """Checks the streaming regions' epochs as they commit (beside the supervisor)."""
    return f"falkirk_{pipeline}_stream_checks"


def batch(pipeline: str, region: str) -> str:
    """One run per epoch of a batch region."""
    return f"falkirk_{pipeline}_batch_{region}"


def rollback(pipeline: str) -> str:
    """Rolls the pipeline back to a consistent frontier (dry run by default)."""
    return f"falkirk_{pipeline}_rollback"


def outputs(pipeline: str) -> str:
    """Scheduled on every output's asset: keeps their epoch log watchers on (Airflow runs
    an asset's watcher only while an unpaused DAG is scheduled on it)."""
    return f"falkirk_{pipeline}_outputs"


def gc(pipeline: str) -> str:
    """Garbage collection by low watermark."""
    return f"falkirk_{pipeline}_gc"
