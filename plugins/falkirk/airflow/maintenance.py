"""The garbage-collection DAG's step: falkirk's own gc.collect, applied."""

from __future__ import annotations

import json
import logging
from typing import Any

from falkirk.model.topology import load_pipeline
from falkirk.recovery.gc import collect

log = logging.getLogger(__name__)


def collect_garbage(pipeline: str, retention_hours: float = 1.0) -> dict[str, Any]:
    """Low watermarks, then drop what they allow (falkirk.recovery.gc: never a row of a
    table not declared a log); each item is logged with its rule. The report is the XCom."""
    report = collect(load_pipeline(pipeline), apply=True, vacuum_retention_hours=retention_hours)
    for item in report.items:
        log.info("%s %s: %s rows, %s files, %s bytes: %s", item.store, item.name, item.rows,
                 item.files, item.bytes, item.rule)
    log.info("garbage collection of %s: %s", pipeline, json.dumps(report.to_json()))
    return report.to_json()
