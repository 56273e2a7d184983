"""Data checks under Airflow: per batch epoch, and continuously beside the streams.

The checks run ``falkirk validate --json`` in a child process: Spark and Great
Expectations then live in that process, not in the Airflow worker. A failing epoch is
quarantined by the validator itself; the task then either fails (setting
``checks.on_failure: quarantine``, the default: the operator sees why in the log and the
``checks`` table) or hands rollback confs to a mapped TriggerDagRunOperator that starts
the rollback DAG (``on_failure: rollback``, ``to_epoch`` = the region's last good epoch).
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from datetime import datetime
from typing import Any

from airflow.sdk import PokeReturnValue
from airflow.sdk.exceptions import AirflowFailException

from falkirk.airflow.batch import epochs_of
from falkirk.airflow.supervisor import PipelineSensor
from falkirk.model.topology import load_pipeline

log = logging.getLogger(__name__)


def run_validate(pipeline: str, epoch: int | None = None, region: str | None = None
                 ) -> dict[str, Any]:
    """``falkirk validate --json`` in a child process; its report."""
    cmd = [sys.executable, "-m", "falkirk.cli", "validate", "--pipeline", pipeline, "--json"]
    if epoch is not None:
        cmd += ["--epoch", str(epoch)]
    if region is not None:
        cmd += ["--region", region]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if done.returncode not in (0, 1) or not done.stdout.strip():
        raise AirflowFailException(f"falkirk validate exited {done.returncode}: "
                                   f"{done.stderr.strip().splitlines()[-1:]}")
    report = json.loads(done.stdout.strip().splitlines()[-1])
    for e in report["epochs"]:
        log.info("%s epoch %d (generation %d): %d checks in %.1f s%s", e["region"], e["epoch"],
                 e["generation"], e["checks"], e["seconds"],
                 "" if not e["failed"] else " FAILED: " + json.dumps(e["failed"])[:2000])
    if report.get("data_docs"):
        log.info("GX Data Docs: %s", report["data_docs"])
    return report


def _outcome(report: dict[str, Any]) -> list[dict]:
    """Rollback confs to trigger; raises when the pipeline only quarantines."""
    if report["quarantined"] and not report["rollbacks"]:
        raise AirflowFailException(
            "data checks failed; quarantined " + ", ".join(
                f"{q['region']} epoch {q['epoch']}" for q in report["quarantined"])
            + " (see the log above for the failing expectations and observed values)")
    return report["rollbacks"]


def check_batch_epoch(pipeline: str, region: str, data_interval_start: datetime,
                      data_interval_end: datetime | None = None) -> list[dict]:
    """The batch run's epochs: their checks, in order, up to the first that fails (again,
    if the run was cleared and rerun)."""
    for epoch in epochs_of(pipeline, data_interval_start, data_interval_end):
        confs = _outcome(run_validate(pipeline, epoch, region))
        if confs:
            return confs
    return []


class EpochChecksSensor(PipelineSensor):
    """Checks every newly committed epoch of the streaming regions.

    At each poke it first reads the epoch log for epochs no check has judged (no Spark);
    only when there are some does it run ``falkirk validate``. Done when an epoch failed
    (XCom: rollback confs, with ``on_failure: rollback``; else the task fails). Otherwise
    it keeps waiting, also once every stream job finished: ending would only make the
    @continuous DAG start a run after run, and a rollback may start the jobs again."""

    def poke(self, context: Any) -> PokeReturnValue | bool:
        from falkirk.config import load
        from falkirk.quality.checks import Validator

        pipeline = load_pipeline(self.pipeline)
        if not Validator(pipeline, None, load(), docs=False).pending():
            return False
        report = run_validate(self.pipeline)
        if report["quarantined"]:
            return PokeReturnValue(is_done=True, xcom_value=_outcome(report))
        return False
