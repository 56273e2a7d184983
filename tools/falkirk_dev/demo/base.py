"""What every part of the demo shares: its input, what it kills, the DAGs it drives."""

from __future__ import annotations

from falkirk.airflow import names
from falkirk.errors import FalkirkError

DEMO_INPUT = {"events": 3000, "queries": 300, "epochs": 6, "seed": 21}
KILL_EPOCH = 3  # communities (lazy, checkpoint every 3 epochs) is killed in the middle of it
SUPERVISOR, BATCH = names.streams("reference"), names.batch("reference", "popularity")
STREAM_CHECKS = names.stream_checks("reference")
KILLED_REGION = "communities"
AIRFLOW_USER = "admin"  # bin/airflow's SimpleAuthManager user; its password is generated
TERMINAL = ("success", "failed", "skipped", "upstream_failed", "removed")




class DemoError(FalkirkError):
    """The demo could not go on; the message says where to look."""
