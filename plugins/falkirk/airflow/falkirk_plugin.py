"""Airflow plugin entry point (the only file plugins/.airflowignore lets Airflow load):
mounts falkirk's pages, adds the "Rollback plan" tab to every DAG run and registers the
batch DAGs' timetable (Airflow serializes and schedules a custom one only when a plugin
registers it)."""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from falkirk.airflow.batch import EpochTimetable
from falkirk.airflow.ui import app


class FalkirkPlugin(AirflowPlugin):
    """The plan page (falkirk.airflow.ui) as a tab of the DAG run view; the batch DAGs'
    timetable: one run per epoch as the inputs commit (falkirk.airflow.batch)."""

    name = "falkirk"
    fastapi_apps = [{"app": app, "url_prefix": "/falkirk", "name": "falkirk"}]
    external_views = [{
        "name": "Rollback plan",
        "href": "/falkirk/plan/{DAG_ID}/{RUN_ID}",
        "destination": "dag_run",
        "url_route": "falkirk-plan",
    }]
    timetables = [EpochTimetable]
