"""The garbage-collection DAG's step: falkirk's own gc.collect, applied."""

from __future__ import annotations

import json
import logging
from typing import Any

from falkirk.model.topology import load_pipeline
from falkirk.recovery.gc import collect

log = logging.getLogger(__name__)


def collect_garbage(pipeline: str, retention_hours: float = 1.0) -> dict[str, Any]:
    """Low watermarks, then drop what they allow: checkpoints, logged rows, acknowledged
    Kafka offsets, vacuumed files. The report is the task's XCom."""
    report = collect(load_pipeline(pipeline), apply=True, vacuum_retention_hours=retention_hours)
    log.info("garbage collection of %s: %s", pipeline, json.dumps(report.to_json()))
    return report.to_json()
