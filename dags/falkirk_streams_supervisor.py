"""Streams supervisor of the reference pipeline: wiring only."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from airflow.providers.standard.operators.python import PythonOperator
from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator
from airflow.sdk import DAG

from falkirk.airflow import checks_tasks, supervisor
from falkirk.airflow.defaults import DEFAULT_ARGS, TAGS

PIPELINE = "reference"

DOC = """
# Streams supervisor: the `reference` pipeline's streaming jobs

Runs continuously (one run after another) while unpaused:

1. **start_streams** starts every streaming job (ingest, communities, serve + stats)
   that is not running and has not finished (a job whose input ended stays finished),
   each as its own `spark-submit` process group (logs under `var/log/`).
2. **watch** checks every 30 s (reschedule mode: no worker slot held in between) whether
   a job died, and ends when one did. A job stopped by a rollback run (the rollback DAG
   pauses the streams) is not a death. When every job finished because its input ended,
   watch goes on waiting: pause the DAG to stop supervising.
3. **recover** rolls back the dead job's regions (as failed) with falkirk's
   RollbackExecutor, then restarts the jobs it stopped. Its plan appears in the run's
   **Rollback plan** tab.

4. **data_checks** (beside watch) runs `falkirk validate` every 30 s: every newly
   committed epoch of every output table against its suite in `schemas/expectations/`,
   plus the cross-region invariants (events and purchases conserved, every query answered
   once, running totals, community labels). A failing epoch is quarantined: readers hold
   back, serve answers from the last good epoch. The task then fails and says why
   (results also in the `checks` table, `falkirk validate` and GX Data Docs under
   `var/checks/`), or, with `checks: {on_failure: rollback}` in the pipeline settings,
   **trigger_rollback** starts `falkirk_rollback` for that region back to its last good
   epoch.

No params. Pause this DAG to stop supervising (the jobs keep running).
"""

with DAG(
    dag_id="falkirk_streams_supervisor",
    description="Start, watch and recover the streaming jobs",
    doc_md=DOC,
    schedule="@continuous",
    start_date=datetime(2024, 1, 1, tzinfo=UTC),  # without one, @continuous reuses a date
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    tags=[*TAGS, "streams", PIPELINE],
):
    start = PythonOperator(task_id="start_streams", python_callable=supervisor.start,
                           op_kwargs={"pipeline": PIPELINE})
    watch = supervisor.StreamsSensor(task_id="watch", pipeline=PIPELINE,
                                     timeout=timedelta(hours=12).total_seconds(),
                                     soft_fail=True)
    recover = PythonOperator(task_id="recover", python_callable=supervisor.recover,
                             op_kwargs={"pipeline": PIPELINE})
    checks = checks_tasks.EpochChecksSensor(task_id="data_checks", pipeline=PIPELINE,
                                            timeout=timedelta(hours=12).total_seconds())
    trigger = TriggerDagRunOperator.partial(
        task_id="trigger_rollback", trigger_dag_id="falkirk_rollback",
    ).expand(conf=checks.output)
    start >> watch >> recover
    start >> checks >> trigger
