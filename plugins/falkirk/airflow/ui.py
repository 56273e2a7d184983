"""The "Rollback plan" tab of a DAG run in the Airflow UI.

Airflow 3 renders task fields as code and XComs as JSON; what it does show as a page of
its own is a plugin's external view, an iframe tab on every DAG run. This FastAPI app
(mounted by falkirk_plugin.py under /falkirk) answers that iframe with the run's plan:
the region table and the region graph, drawn by falkirk.airflow.render. It runs inside
the api-server, behind Airflow's own login (the UI's token cookie) and DAG permissions.
"""

from __future__ import annotations

import html
from typing import Any

from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
from airflow.api_fastapi.common.db.common import SessionDep
from airflow.api_fastapi.core_api.security import requires_access_dag
from fastapi import Depends, FastAPI
from fastapi.responses import HTMLResponse

# Where a run keeps its plan: the last of these found wins (carried out over planned).
PLAN_XCOMS = (("plan", "return_value"), ("roll_back", "return_value"), ("recover", "plan"))

STYLE = """
body{font-family:system-ui,sans-serif;margin:16px;color:#0f172a}
table{border-collapse:collapse;margin:8px 0 12px}
th,td{border:1px solid #cbd5e1;padding:4px 10px;text-align:left}
th{background:#f1f5f9} code{background:#f1f5f9;padding:0 3px}
h2{font-size:18px} .muted{color:#64748b}
svg{display:block;max-width:100%;height:auto}
"""


def run_plans(dag_id: str, run_id: str, session: Any) -> list[tuple[str, dict]]:
    """(task id, plan JSON) of every plan XCom the run holds, in PLAN_XCOMS order."""
    from airflow.models.xcom import XComModel
    from sqlalchemy import select

    found = []
    for task_id, key in PLAN_XCOMS:
        row = session.scalars(select(XComModel).where(
            XComModel.dag_id == dag_id, XComModel.run_id == run_id,
            XComModel.task_id == task_id, XComModel.key == key)).first()
        if row is None:
            continue
        value = XComModel.deserialize_value(row)
        if isinstance(value, dict) and "frontiers" in value:
            found.append((task_id, value))
    return found


def watch_plans(dag_id: str, run_id: str) -> list[tuple[str, dict]]:
    """("watch", plan JSON) of every rollback the watch's trigger carried out in this run
    of a streams DAG, oldest first: it recovers in the triggerer and pushes no XCom, so
    they are read from the epoch log (their reason names the run)."""
    from falkirk.airflow.names import streams_pipeline
    from falkirk.airflow.supervisor import watch_by
    from falkirk.log.epochlog import EpochLog

    pipeline = streams_pipeline(dag_id)
    if pipeline is None:
        return []
    by = f"({watch_by(run_id)})"
    return [("watch", r["plan"]) for r in EpochLog.from_config().rollbacks(pipeline)
            if r["status"] == "done" and by in (r["request"].get("reason") or "")]


def page(dag_id: str, run_id: str, plans: list[tuple[str, dict]]) -> str:
    """The HTML of the tab: the newest plan, or why there is none."""
    from falkirk.airflow.render import plan_html
    from falkirk.model.topology import load_pipeline

    e = html.escape
    if not plans:
        body = (f"<p class='muted'>Run <code>{e(run_id)}</code> of <code>{e(dag_id)}</code> "
                "has no rollback plan (yet): the plan appears here once the rollback DAG's "
                "<code>plan</code> task, or the supervisor's <code>watch</code> or "
                "<code>recover</code> task, has rolled back.</p>")
    else:
        task_id, plan = plans[-1]
        label = {"plan": "planned", "roll_back": "carried out",
                 "recover": "carried out by the supervisor",
                 "watch": "carried out by the supervisor's watch, in the triggerer"}[task_id]
        body = (f"<p class='muted'>From task <code>{e(task_id)}</code> ({label}).</p>"
                + plan_html(plan, load_pipeline(plan["pipeline"])))
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>Rollback plan</title>"
            f"<style>{STYLE}</style></head><body>{body}</body></html>")


app = FastAPI(title="falkirk", description="falkirk's pages inside the Airflow UI")


@app.get("/plan/{dag_id}/{run_id}", response_class=HTMLResponse,
         dependencies=[Depends(requires_access_dag("GET", DagAccessEntity.XCOM))])
def plan_page(dag_id: str, run_id: str, session: SessionDep) -> HTMLResponse:
    """The run's rollback plan as a page (table and region graph)."""
    plans = run_plans(dag_id, run_id, session) or watch_plans(dag_id, run_id)
    return HTMLResponse(page(dag_id, run_id, plans))
