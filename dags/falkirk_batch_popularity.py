"""Batch epochs of the reference pipeline's popularity region: wiring only."""

from __future__ import annotations

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.providers.standard.operators.python import PythonOperator
from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator
from airflow.sdk import DAG

from falkirk.airflow import batch, checks_tasks
from falkirk.airflow.defaults import DEFAULT_ARGS, TAGS

PIPELINE, REGION = "reference", "popularity"

DOC = """
# Batch epochs: `popularity` of the `reference` pipeline

One run per epoch. Epochs are event-time windows of the pipeline settings
(`epoch_seconds`, `origin_ms` in `schemas/pipelines/reference.yaml`): the run whose data
interval starts at `origin + k × epoch_seconds` computes epoch *k*. The reference origin
is fixed (2024-01-01), so catchup runs the epochs one after another
(`FALKIRK_BATCH_EPOCHS`, default 10, bounds how many).

- **popularity**: `spark-submit jobs/popularity.py --pipeline reference --epoch k` on the
  `spark_default` connection (local[2] here). The job waits for the epoch's purchases
  (up to 10 minutes) and writes the epoch's `item_popularity` snapshot exactly once, so
  clearing a run reruns its epoch safely. The epoch number is in the task's *Rendered
  Templates*.
- **check_committed**: fails unless the epoch log shows the epoch committed.
- **data_checks**: `falkirk validate --epoch k --region popularity`: the
  `item_popularity` suite (`schemas/expectations/item_popularity.json`) on exactly the
  epoch's Delta version. A failing epoch is quarantined (serve keeps answering from the
  last good epoch) and the task fails, naming the expectation and the observed value.
  With `checks: {on_failure: rollback}` in the pipeline settings it instead hands a
  rollback request (`to_epoch` = the last good epoch) to **trigger_rollback**, which
  starts `falkirk_rollback`.

No params. A rollback that invalidates popularity epochs reruns them itself; clearing
the runs of those epochs here does the same.
"""

with DAG(
    dag_id="falkirk_batch_popularity",
    description="One popularity run per epoch (data interval = epoch window)",
    doc_md=DOC,
    catchup=True,
    max_active_runs=1,  # epochs in order: each waits for its input anyway
    default_args=DEFAULT_ARGS,
    user_defined_macros=batch.macros(PIPELINE),
    tags=[*TAGS, "batch", PIPELINE],
    **batch.schedule(PIPELINE),
):
    run = SparkSubmitOperator(task_id=REGION, **batch.submit_kwargs(PIPELINE, REGION))
    check = PythonOperator(task_id="check_committed", python_callable=batch.verify_committed,
                           op_kwargs={"pipeline": PIPELINE, "region": REGION})
    checks = PythonOperator(task_id="data_checks", python_callable=checks_tasks.check_batch_epoch,
                            op_kwargs={"pipeline": PIPELINE, "region": REGION})
    trigger = TriggerDagRunOperator.partial(
        task_id="trigger_rollback", trigger_dag_id="falkirk_rollback",
    ).expand(conf=checks.output)
    run >> check >> checks >> trigger
