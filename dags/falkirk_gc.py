"""Garbage collection of every declared pipeline: wiring only."""

from __future__ import annotations

from datetime import datetime

from airflow.providers.standard.operators.python import PythonOperator
from airflow.sdk import DAG

from falkirk.airflow.defaults import DEFAULT_ARGS, TAGS, pipeline_names
from falkirk.airflow.maintenance import collect_garbage

DOC = """
# Garbage collection

Hourly, per declared pipeline (one task each): compute every region's low watermark
(how far back any future failure could take it), then drop what no rollback can need:
checkpoints older than the newest one at or below the watermark, rows of logged Delta
edges the receiver has passed, Kafka offsets acknowledged for the input topics, and
Delta files no retained version uses (vacuum keeps files younger than an hour, so a
writer in the middle of a commit is safe). The task's XCom is the report.

No params. `falkirk gc` (a dry run by default) shows the same report without applying it.
"""

with DAG(
    dag_id="falkirk_gc",
    description="Low watermarks; drop checkpoints, logged rows, offsets, files",
    doc_md=DOC,
    schedule="@hourly",
    start_date=datetime(2024, 1, 1),
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    tags=[*TAGS, "maintenance"],
):
    for name in pipeline_names():
        PythonOperator(task_id=f"gc_{name}", python_callable=collect_garbage,
                       op_kwargs={"pipeline": name})
