"""DAGs generated for every declared pipeline (wiring only; the steps live beside this).

For a pipeline ``p`` (found in ``$FALKIRK_PIPELINES`` or a checkout's ``examples/``):

- ``falkirk_p_streams``: start, watch and recover its streaming jobs, and
  ``falkirk_p_stream_checks``: check their epochs as they commit (only when it has
  regions that are not batch);
- ``falkirk_p_batch_<region>``: a run per epoch of each batch region (per batch of
  epochs ready together when it is behind);
- ``falkirk_p_rollback``: roll it back (its regions in the params; dry run by default);
- ``falkirk_p_gc``: garbage collection by low watermark;
- ``falkirk_p_outputs``: scheduled on every output's asset, which keeps their epoch log
  watchers on (falkirk.airflow.assets); one run per batch of asset events.

The DAG files in a pipeline folder's ``dags/`` (its consumers: DAGs scheduled on its
assets) are loaded beside them (:func:`consumer_dags`).

``falkirk/airflow/dags/falkirk_pipelines.py`` only calls :func:`declared_dags`, so a new
pipeline folder shows up in Airflow with no DAG file written or copied.
"""

from __future__ import annotations

import importlib.util
import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.providers.standard.operators.python import PythonOperator, ShortCircuitOperator
from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator
from airflow.sdk import DAG, AssetAny, BaseOperator

from falkirk.airflow import assets, batch, checks_tasks, names, streams, supervisor
from falkirk.airflow import rollback_tasks as steps
from falkirk.airflow.defaults import BATCH_EPOCH_RETRIES, DEFAULT_ARGS, TAGS, rollback_params
from falkirk.airflow.maintenance import collect_garbage
from falkirk.errors import FalkirkError
from falkirk.model.topology import Pipeline, declared, load_pipeline
from falkirk.runtime.launcher import launcher

log = logging.getLogger(__name__)

STREAMS_DOC = """
# Streams: the `{p}` pipeline's streaming jobs

Runs continuously (one run after another) while unpaused. Jobs: {jobs}.

1. **start_streams** starts every streaming job that is not running and has not finished
   (a job whose input ended stays finished), each as its own `spark-submit` process group
   (logs under `var/log/`).
2. **watch** hands the watching to Airflow's triggerer (a deferred task holds no worker
   slot), which checks every second whether a job died; watch ends when one did. A job
   stopped by a rollback run (`{rollback}` pauses the streams) is not a death. When every
   job finished because its input ended, watch goes on waiting: pause the DAG to stop
   supervising.
3. **recover** rolls back the dead job's regions (as failed) with falkirk's
   RollbackExecutor, then restarts the jobs it stopped. Its plan appears in the run's
   **Rollback plan** tab. The run then ends and the next one watches again.

The data checks of the stream epochs are `{checks}`'s: a run of this DAG never waits
for them, so a death right after a recovery is watched for at once.

No params. Pause this DAG to stop supervising (the jobs keep running).
"""

STREAM_CHECKS_DOC = """
# Stream checks: the `{p}` pipeline's streaming epochs, as they commit

Runs continuously (one run after another) while unpaused, beside `{streams}`.

1. **data_checks** looks every 30 s for newly committed epochs of the streaming regions
   (a read of the epoch log), and when there are some runs `falkirk validate`: each
   epoch of every output table against its expectation suite, plus the pipeline's
   cross-region invariants. A failing epoch is quarantined: readers hold back and fall
   back to the last good epoch. The task then fails and says why (results also in the
   `checks` table, `falkirk validate` and GX Data Docs under `var/checks/`), or, with
   `checks: {{on_failure: rollback}}` in the pipeline settings, **trigger_rollback**
   starts `{rollback}` for that region back to its last good epoch.

No params. Pause this DAG to stop checking.
"""

BATCH_DOC = """
# Batch epochs: `{r}` of the `{p}` pipeline

One run per epoch, or per batch of epochs ready together. Epochs are event-time windows
of the pipeline settings (`epoch_seconds`, `origin_ms` in `{source}`): the run whose data
interval is `[origin + k × epoch_seconds, origin + (K + 1) × epoch_seconds)` computes
epochs *k* to *K* (one epoch while the region keeps up; when it is behind, every epoch
ready when the run is made, up to `max_pass`, in one pass: a run per epoch cost ~9 s of
scheduling each, and a region behind stayed behind); catchup runs them one after
another, from `FALKIRK_BATCH_FIRST_EPOCH` (default 0), every epoch the pipeline has,
none skipped: epoch *k* gets its run once the epoch log shows its inputs there (each
Delta input's sender committed *k* − delay, or its input ended; a Kafka input as far as
the topic's readers got, up to its declared bound), checked at every parse of the DAG
file (about every 30 s) and after each run is made. No cap unless `FALKIRK_BATCH_EPOCHS`
is set: then no run for that epoch or later.

- **{r}**: {run}. The job waits for the epochs' inputs (up to 10 minutes) and writes
  each epoch's outputs exactly once, so clearing a run reruns its epochs safely. A
  failed try is tried again up to {retries} times, each wait about twice the one before
  ({first} to {most}); a run whose tries all failed fails, and clearing it reruns the
  epochs. The epoch numbers are in the task's *Rendered Templates*.
- **check_committed**: fails unless the epoch log shows every epoch of the run committed.
- **data_checks**: `falkirk validate --epoch k --region {r}` for each epoch of the run:
  the suites of the region's tables on exactly the epoch's Delta version. A failing
  epoch is quarantined (readers keep using the last good epoch) and the task fails,
  naming the expectation and the observed value. With
  `checks: {{on_failure: rollback}}` in the pipeline settings it instead hands a
  rollback request (`to_epoch` = the last good epoch) to **trigger_rollback**, which
  starts `{rollback}`.

No params. A rollback that invalidates epochs of `{r}` reruns them itself; clearing the
runs of those epochs here does the same.
"""

ROLLBACK_DOC = """
# Roll the `{p}` pipeline back

Trigger this DAG (▶ *Trigger*) to recover after a failure, or to take a region back on
purpose (a bad deploy). Airflow checks the form before anything runs; then:

1. **plan** solves, from the epoch log, the frontier every region restores to. It
   changes nothing. The plan appears in the run's **Rollback plan** tab (a table of
   regions with their current epoch and chosen frontier, and the region graph coloured
   by regime) and in the plan task's log and XCom.
2. **carry_on** ends the run here when *Dry run* is ticked (the default).
3. **pause_streams** stops the streaming jobs hosting affected regions.
4. **roll_back** restores their Delta tables and checkpoints and invalidates the later
   epochs in the epoch log (falkirk's RollbackExecutor; a crashed rollback resumes). It
   carries out exactly the plan shown, or refuses with what changed since.
5. **rerun_and_replay** restarts the stopped streams (they replay from their frontier)
   and reruns the batch epochs the rollback invalidated.
6. **resume** lifts the pause and checks the restarted streams run.
7. **validate** checks the epoch log shows every affected region at or past its frontier.

Only one rollback runs at a time.

## Params
- **Pipeline**: `{p}` (one rollback DAG per declared pipeline).
- **Regions**: the regions of `{p}` ({regions}). After a failure: the regions whose jobs
  died (the solver finds what else must follow). With *Back to epoch*: exactly one region.
- **Back to epoch** (optional): an epoch number ≥ -1 to take the region back to on
  purpose; -1 means "before the first epoch". An epoch the region has not reached is
  refused. Leave it empty after a failure.
- **Dry run** (default on): only show the plan. Untick it to carry the rollback out.
- **Reason** (required): why; recorded with the rollback in the epoch log.
"""

GC_DOC = """
# Garbage collection of the `{p}` pipeline

Created **paused**: unpause it to collect hourly (no catch-up), or trigger one run.
Computes every region's low watermark (how far back any future failure could take it),
then drops only what falkirk owns or what the pipeline declares a log:

- checkpoint layers older than the newest checkpoint at or below the watermark (and
  `retain_checkpoints` older ones);
- rows of tables declared logs (`retain_epochs: N` on an edge) that every receiver has
  passed and that are older than the newest N epochs; **every other table is a product:
  none of its rows is deleted**;
- data files no version of a table's log references (writes killed before their commit),
  older than an hour; time travel on tables follows Delta's own retention;
- the input topics' consumer-group offsets are acknowledged (their retention stays theirs).

The task's log and XCom itemise what was removed: per table, region and topic, its rows,
files and bytes and the rule that allowed it.

No params. `falkirk gc --pipeline {p}` (a dry run by default) shows the same items
without removing anything.
"""


OUTPUTS_DOC = """
# Outputs: the asset events of the `{p}` pipeline

Scheduled on the asset of every table and topic `{p}` writes ({outputs}). Airflow runs an
asset's watcher only while an unpaused DAG is scheduled on it: this DAG keeps them on
(it is made unpaused; pausing it stops the events of stream commits and restatements
unless another DAG is scheduled on the asset).

- Each epoch a stream region commits is an event on each table or topic it wrote, from the
  epoch log's watcher (extra under `payload`: pipeline, region, epoch, generation, table
  and table_version, or topic and records); a batch region's run announces its own epochs
  as its outlets (`falkirk_{p}_batch_<region>`).
- Each rollback carried out (by `{rollback}`, the streams supervisor or `falkirk
  rollback`) is an event on every table and topic of the regions it took back: `restated:
  true`, from_epoch, to_epoch, generation, rollback_id. A dry run is none.

Each run lists the events that triggered it (the run's *Asset Events*); its one task is
an EmptyOperator, which no worker runs. No params.
"""


class _AnnouncesEpoch(BaseOperator):
    """What a batch region's epoch task does once its epoch committed: its outputs are
    its outlets, announced with the epoch's extras, and its OpenLineage metadata the
    epoch's (one place for both ways the epoch runs; an operator, so that Airflow's
    operator machinery wraps its ``__init__`` as it does every operator's)."""

    def __init__(self, *, pipeline: str, region: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pipeline, self.region = pipeline, region
        self._lineage: Any = None

    def _announce(self, context: Any, epochs: list[int]) -> list[int]:
        self._lineage = assets.announce_epoch(context, load_pipeline(self.pipeline),
                                              self.region, epochs)
        return epochs

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        return self._lineage


class EpochRunOperator(_AnnouncesEpoch, PythonOperator):
    """A batch region's epoch in the task's own process (:class:`_AnnouncesEpoch`)."""

    def execute(self, context: Any) -> Any:
        return self._announce(context, super().execute(context))


class EpochSubmitOperator(_AnnouncesEpoch, SparkSubmitOperator):
    """:class:`EpochRunOperator` for a profile without an engine: the epoch by
    spark-submit."""

    def execute(self, context: Any) -> Any:
        super().execute(context)
        return self._announce(context, batch.epochs_of(
            self.pipeline, context["data_interval_start"], context["data_interval_end"]))


class RollBackOperator(PythonOperator):
    """The rollback DAG's roll_back: its OpenLineage metadata names what it restated."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._lineage: Any = None

    def execute(self, context: Any) -> Any:
        plan = super().execute(context)
        self._lineage = assets.rollback_lineage(load_pipeline(plan["pipeline"]), plan)
        return plan

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        return self._lineage


def _continuous(dag_id: str, description: str, doc: str, tag: str, p: str) -> DAG:
    """A DAG that runs one run after another while unpaused (the stream DAGs)."""
    return DAG(
        dag_id=dag_id,
        description=description,
        doc_md=doc,
        schedule="@continuous",
        start_date=datetime(2024, 1, 1, tzinfo=UTC),  # without one, @continuous reuses a date
        catchup=False,
        max_active_runs=1,
        default_args=DEFAULT_ARGS,
        tags=[*TAGS, tag, p],
    )


def streams_dag(pipeline: Pipeline) -> DAG:
    p = pipeline.name
    jobs = streams.stream_jobs(pipeline)
    doc = STREAMS_DOC.format(p=p, rollback=names.rollback(p), checks=names.stream_checks(p),
                             jobs=", ".join(
        f"`{job}` ({', '.join(regions)})" for job, regions in sorted(jobs.items())))
    with _continuous(names.streams(p), f"Start, watch and recover the streaming jobs of {p}",
                     doc, "streams", p) as dag:
        start = PythonOperator(task_id="start_streams", python_callable=supervisor.start,
                               op_kwargs={"pipeline": p})
        watch = supervisor.StreamsSensor(task_id="watch", pipeline=p,
                                         timeout=timedelta(hours=12).total_seconds(),
                                         soft_fail=True)
        recover = PythonOperator(task_id="recover", python_callable=supervisor.recover,
                                 op_kwargs={"pipeline": p})
        start >> watch >> recover
    return dag


def stream_checks_dag(pipeline: Pipeline) -> DAG:
    p = pipeline.name
    doc = STREAM_CHECKS_DOC.format(p=p, streams=names.streams(p), rollback=names.rollback(p))
    with _continuous(names.stream_checks(p),
                     f"Data checks of the streaming epochs of {p} as they commit",
                     doc, "checks", p) as dag:
        checks = checks_tasks.EpochChecksSensor(task_id="data_checks", pipeline=p,
                                                timeout=timedelta(hours=12).total_seconds())
        TriggerDagRunOperator.partial(
            task_id="trigger_rollback", trigger_dag_id=names.rollback(p),
        ).expand(conf=checks.output)
    return dag


def batch_dag(pipeline: Pipeline, region: str) -> DAG:
    p = pipeline.name
    launch = launcher()  # how a job's driver starts in this profile
    job = f"{pipeline.regions[region].job} --pipeline {p} --epoch k --until-epoch K"
    run = (f"`{job}` in the task's own process, a client of the Spark Connect engine at "
           f"`{launch.engine}`" if launch.client else
           f"`spark-submit {job}` on the `spark_default` connection")
    doc = BATCH_DOC.format(p=p, r=region, rollback=names.rollback(p),
                           source=pipeline.source or "the pipeline declaration", run=run,
                           retries=BATCH_EPOCH_RETRIES["retries"],
                           first=f"{BATCH_EPOCH_RETRIES['retry_delay'].total_seconds():.0f} s",
                           most=f"{BATCH_EPOCH_RETRIES['max_retry_delay'].total_seconds():.0f} s")
    with DAG(
        dag_id=names.batch(p, region),
        description=f"One {region} run per epoch of {p} (data interval = epoch window)",
        doc_md=doc,
        catchup=True,
        max_active_runs=1,  # epochs in order: each waits for its input anyway
        default_args=DEFAULT_ARGS,
        user_defined_macros=batch.macros(p),
        tags=[*TAGS, "batch", p],
        **batch.schedule(p, region),
    ) as dag:
        outlets = assets.region_assets(pipeline, region)  # announced with the epoch
        if launch.client:  # a client of the engine, in the task's process
            run = EpochRunOperator(task_id=region, python_callable=batch.run_epoch,
                                   op_kwargs={"pipeline": p, "region": region},
                                   pipeline=p, region=region, outlets=outlets,
                                   **BATCH_EPOCH_RETRIES)
        else:
            run = EpochSubmitOperator(task_id=region, **batch.submit_kwargs(p, region),
                                      pipeline=p, region=region, outlets=outlets,
                                      **BATCH_EPOCH_RETRIES)
        check = PythonOperator(task_id="check_committed", python_callable=batch.verify_committed,
                               op_kwargs={"pipeline": p, "region": region})
        checks = PythonOperator(task_id="data_checks",
                                python_callable=checks_tasks.check_batch_epoch,
                                op_kwargs={"pipeline": p, "region": region})
        trigger = TriggerDagRunOperator.partial(
            task_id="trigger_rollback", trigger_dag_id=names.rollback(p),
        ).expand(conf=checks.output)
        run >> check >> checks >> trigger
    return dag


def rollback_dag(pipeline: Pipeline) -> DAG:
    p = pipeline.name
    with DAG(
        dag_id=names.rollback(p),
        description=f"Roll {p} back to a consistent frontier (dry run by default)",
        doc_md=ROLLBACK_DOC.format(p=p, regions=", ".join(pipeline.regions)),
        schedule=None,
        catchup=False,
        max_active_runs=1,
        is_paused_upon_creation=False,  # manual only: ready to trigger from the UI or the API
        default_args=DEFAULT_ARGS,
        params=rollback_params(pipeline),
        tags=[*TAGS, "rollback", p],
        render_template_as_native_obj=True,
    ) as dag:
        plan = PythonOperator(task_id="plan", python_callable=steps.plan, retries=0)
        carry_on = ShortCircuitOperator(task_id="carry_on", python_callable=steps.carry_on)
        pause = PythonOperator(task_id="pause_streams", python_callable=steps.pause_streams)
        roll_back = RollBackOperator(task_id="roll_back", python_callable=steps.roll_back)
        rerun = PythonOperator(task_id="rerun_and_replay",
                               python_callable=steps.rerun_and_replay)
        resume = PythonOperator(task_id="resume", python_callable=steps.resume)
        validate = PythonOperator(task_id="validate", python_callable=steps.validate)
        plan >> carry_on >> pause >> roll_back >> rerun >> resume >> validate
    return dag


def gc_dag(pipeline: Pipeline) -> DAG:
    p = pipeline.name
    with DAG(
        dag_id=names.gc(p),
        description=f"Low watermarks of {p}; drop old checkpoints, rows of declared logs, "
                    "orphan files; acknowledge input",
        doc_md=GC_DOC.format(p=p),
        schedule="@hourly",
        start_date=datetime(2024, 1, 1, tzinfo=UTC),
        catchup=False,
        is_paused_upon_creation=True,  # removes data: an operator turns it on
        max_active_runs=1,
        default_args=DEFAULT_ARGS,
        tags=[*TAGS, "maintenance", p],
    ) as dag:
        PythonOperator(task_id="collect_garbage", python_callable=collect_garbage,
                       op_kwargs={"pipeline": p})
    return dag


def outputs_dag(pipeline: Pipeline) -> DAG:
    p = pipeline.name
    outputs = assets.pipeline_assets(pipeline)
    with DAG(
        dag_id=names.outputs(p),
        description=f"The asset events of {p}'s outputs: every committed epoch, every "
                    "restatement",
        doc_md=OUTPUTS_DOC.format(p=p, rollback=names.rollback(p), outputs=", ".join(
            f"`{a.name}`" for a in outputs.values())),
        schedule=AssetAny(*outputs.values()),
        catchup=False,
        max_active_runs=1,
        is_paused_upon_creation=False,  # its schedule keeps the assets' watchers on
        default_args=DEFAULT_ARGS,
        tags=[*TAGS, "assets", p],
    ) as dag:
        EmptyOperator(task_id="announced")
    return dag


def pipeline_dags(pipeline: Pipeline) -> dict[str, DAG]:
    """Every DAG of one pipeline, by id."""
    dags = [rollback_dag(pipeline), gc_dag(pipeline)]
    if assets.pipeline_assets(pipeline):
        dags.append(outputs_dag(pipeline))
    if streams.stream_jobs(pipeline):
        dags += [streams_dag(pipeline), stream_checks_dag(pipeline)]
    dags += [batch_dag(pipeline, r) for r, spec in pipeline.regions.items()
             if spec.regime_rules.runs_per_epoch]
    return {d.dag_id: d for d in dags}


def declared_dags() -> dict[str, DAG]:
    """The DAGs of every declared pipeline that loads. A pipeline that does not load gets
    no DAGs and a logged error naming its file (``falkirk pipelines`` lists them), so
    one broken declaration does not take the others out of Airflow."""
    dags: dict[str, DAG] = {}
    for name, path in declared().items():
        try:
            pipeline = load_pipeline(path)  # validated, its files checked
        except FalkirkError as exc:
            log.error("pipeline %s (%s) gets no DAGs: %s", name, path, exc)
            continue
        dags.update(pipeline_dags(pipeline))
        for dag_id, dag in consumer_dags(pipeline).items():
            if dag_id in dags:
                log.error("%s: DAG %s is one of falkirk's own: left out", dag.fileloc, dag_id)
                continue
            dags[dag_id] = dag
    return dags


def consumer_dags(pipeline: Pipeline) -> dict[str, DAG]:
    """The DAGs of the DAG files in the pipeline folder's ``dags/``: its consumers (DAGs
    scheduled on its assets), kept beside the declaration and parsed with falkirk's own,
    so ``falkirk airflow start`` needs no other DAG folder. A file that does not import
    is left out, its error logged naming it."""
    folder = pipeline.folder / "dags"
    found: dict[str, DAG] = {}
    for path in sorted(folder.glob("*.py")) if folder.is_dir() else []:
        try:
            module = _import_file(path, f"falkirk_consumers_{pipeline.name}_{path.stem}")
        except Exception:
            log.exception("pipeline %s: DAG file %s does not import: its DAGs are left out",
                          pipeline.name, path)
            continue
        found.update({d.dag_id: d for d in vars(module).values() if isinstance(d, DAG)})
    return found


def _import_file(path: Path, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path}: not a Python module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
