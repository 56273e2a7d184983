"""Airflow plugin entry point (the only file plugins/.airflowignore lets Airflow load):
mounts falkirk's pages and adds the "Rollback plan" tab to every DAG run."""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from falkirk.airflow.ui import app


class FalkirkPlugin(AirflowPlugin):
    """The plan page (falkirk.airflow.ui) as a tab of the DAG run view."""

    name = "falkirk"
    fastapi_apps = [{"app": app, "url_prefix": "/falkirk", "name": "falkirk"}]
    external_views = [{
        "name": "Rollback plan",
        "href": "/falkirk/plan/{DAG_ID}/{RUN_ID}",
        "destination": "dag_run",
        "url_route": "falkirk-plan",
    }]
