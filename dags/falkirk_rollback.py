"""Rollback DAG: wiring only; the steps are falkirk.airflow.rollback_tasks."""

from __future__ import annotations

from airflow.providers.standard.operators.python import PythonOperator, ShortCircuitOperator
from airflow.sdk import DAG

from falkirk.airflow import rollback_tasks as steps
from falkirk.airflow.defaults import DEFAULT_ARGS, TAGS, rollback_params

DOC = """
# Roll a pipeline back

Trigger this DAG (▶ *Trigger*) to recover after a failure, or to take a region back on
purpose (a bad deploy). Airflow checks the form before anything runs; then:

1. **plan** solves, from the epoch log, the frontier every region restores to. It
   changes nothing. The plan appears in the run's **Rollback plan** tab (a table of
   regions with their current epoch and chosen frontier, and the region graph coloured
   by regime) and in the plan task's log and XCom.
2. **carry_on** ends the run here when *Dry run* is ticked (the default).
3. **pause_streams** stops the streaming jobs hosting affected regions.
4. **roll_back** restores their Delta tables and checkpoints and invalidates the later
   epochs in the epoch log (falkirk's RollbackExecutor; a crashed rollback resumes).
5. **rerun_and_replay** restarts the stopped streams (they replay from their frontier)
   and reruns the batch epochs the rollback invalidated.
6. **resume** lifts the pause and checks the restarted streams run.
7. **validate** checks the epoch log shows every affected region at or past its frontier.

Only one rollback runs at a time.

## Params
- **Pipeline**: which declared pipeline (`schemas/pipelines/*.yaml`).
- **Regions**: one region name per line. After a failure: the regions whose jobs died
  (the solver finds what else must follow). With *Back to epoch*: exactly one region.
  A region of another pipeline is refused by the plan, before anything changes.
- **Back to epoch** (optional): an epoch number ≥ -1 to take the region back to on
  purpose; -1 means "before the first epoch". An epoch the region has not reached is
  refused. Leave it empty after a failure.
- **Dry run** (default on): only show the plan. Untick it to carry the rollback out.
- **Reason** (required): why; recorded with the rollback in the epoch log.
"""

with DAG(
    dag_id="falkirk_rollback",
    description="Roll a pipeline back to a consistent frontier (dry run by default)",
    doc_md=DOC,
    schedule=None,
    catchup=False,
    max_active_runs=1,
    is_paused_upon_creation=False,  # manual only: ready to trigger from the UI or the API
    default_args=DEFAULT_ARGS,
    params=rollback_params(),
    tags=[*TAGS, "rollback"],
    render_template_as_native_obj=True,
):
    plan = PythonOperator(task_id="plan", python_callable=steps.plan, retries=0)
    carry_on = ShortCircuitOperator(task_id="carry_on", python_callable=steps.carry_on)
    pause = PythonOperator(task_id="pause_streams", python_callable=steps.pause_streams)
    roll_back = PythonOperator(task_id="roll_back", python_callable=steps.roll_back)
    rerun = PythonOperator(task_id="rerun_and_replay", python_callable=steps.rerun_and_replay)
    resume = PythonOperator(task_id="resume", python_callable=steps.resume)
    validate = PythonOperator(task_id="validate", python_callable=steps.validate)

    plan >> carry_on >> pause >> roll_back >> rerun >> resume >> validate
