"""The Airflow mode: a real local Airflow drives the pipeline; the demo kills a job and
watches the DAGs recover."""

from __future__ import annotations

import contextlib
import html
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from argparse import Namespace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from falkirk.config import REPO_ROOT
from falkirk_dev.demo.base import (
    AIRFLOW_USER,
    BATCH,
    DEMO_INPUT,
    KILL_EPOCH,
    KILLED_REGION,
    STREAM_CHECKS,
    SUPERVISOR,
    TERMINAL,
    DemoError,
)
from falkirk_dev.demo.golden import _save_figures, _verdict, engines, golden_outputs
from falkirk_dev.demo.report import (
    checks_summary,
    progress_over_time,
    progress_svg,
    report_html,
    throughput_per_epoch,
)
from falkirk_dev.harness import profile


def airflow_password(home: Path) -> str:
    """The admin password bin/airflow generated for this Airflow home (passwords.json)."""
    path = Path(home) / "passwords.json"
    try:
        return json.loads(path.read_text())[AIRFLOW_USER]
    except (OSError, ValueError, KeyError) as exc:
        raise DemoError(f"no admin password in {path} ({exc}): start Airflow with "
                        "bin/airflow start") from None

class AirflowAPI:
    """The Airflow REST API (v2) with a token from /auth/token."""

    def __init__(self, url: str, home: Path):
        self.url = url
        self.home = home  # the Airflow home whose passwords.json holds the login
        self._token: str | None = None

    def _request(self, method: str, path: str, body: Any = None,
                 token: bool = True) -> tuple[int, Any]:
        req = urllib.request.Request(
            self.url + path, method=method,
            data=None if body is None else json.dumps(body).encode())
        req.add_header("Content-Type", "application/json")
        if token:
            req.add_header("Authorization", f"Bearer {self.token()}")
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                status, text = resp.status, resp.read().decode()
        except urllib.error.HTTPError as err:
            status, text = err.code, err.read().decode()
        try:
            return status, json.loads(text) if text else None
        except json.JSONDecodeError:
            return status, text

    def token(self) -> str:
        if self._token is None:
            user, password = AIRFLOW_USER, airflow_password(self.home)
            status, body = self._request("POST", "/auth/token",
                                         {"username": user, "password": password}, token=False)
            if status not in (200, 201):
                raise DemoError(f"Airflow refused the demo's login: {status} {body}")
            self._token = body["access_token"]
        return self._token

    def call(self, method: str, path: str, body: Any = None, ok=(200,)) -> Any:
        for attempt in range(5):
            try:
                status, data = self._request(method, path, body)
            except (urllib.error.URLError, TimeoutError, ConnectionError) as err:
                if attempt == 4:  # a busy api-server on a loaded machine: a few tries
                    raise DemoError(f"Airflow API {method} {path}: {err}") from err
                time.sleep(2)
                continue
            if status == 401 and attempt == 0:
                self._token = None  # expired: log in again
                continue
            if status in ok:
                return data
            if status >= 500 and attempt < 4:
                time.sleep(2)
                continue
            raise DemoError(f"Airflow API {method} {path}: {status} {data}")
        raise AssertionError("unreachable")

    def runs(self, dag_id: str) -> list[dict]:
        data = self.call("GET", f"/api/v2/dags/{dag_id}/dagRuns?limit=100")
        return sorted(data["dag_runs"], key=lambda r: (r.get("run_after") or "",
                                                       r["dag_run_id"]))

    def tasks(self, dag_id: str, run_id: str) -> dict[str, dict]:
        q = urllib.parse.quote(run_id, safe="")
        data = self.call("GET", f"/api/v2/dags/{dag_id}/dagRuns/{q}/taskInstances?limit=100")
        return {t["task_id"] if t.get("map_index", -1) == -1
                else f"{t['task_id']}[{t['map_index']}]": t for t in data["task_instances"]}

    def failed_tasks(self, dag_id: str) -> list[dict]:
        """The DAG's task instances that failed for good (no try left), in any run."""
        data = self.call("GET", f"/api/v2/dags/{dag_id}/dagRuns/~/taskInstances"
                                "?state=failed&state=upstream_failed&limit=100")
        return data["task_instances"]

    def xcom(self, dag_id: str, run_id: str, task_id: str, key: str = "return_value") -> Any:
        q = urllib.parse.quote(run_id, safe="")
        data = self.call("GET", f"/api/v2/dags/{dag_id}/dagRuns/{q}/taskInstances/{task_id}/"
                                f"xcomEntries/{key}?deserialize=true", ok=(200, 404))
        return None if not isinstance(data, dict) else data.get("value")

    def pause(self, dag_id: str, paused: bool) -> None:
        self.call("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": paused})

    def run_url(self, dag_id: str, run_id: str) -> str:
        return f"{self.url}/dags/{dag_id}/runs/{urllib.parse.quote(run_id, safe='')}"


def _free_port_block(n: int = 3) -> int:
    """A port P with P..P+n-1 free (bin/airflow uses P+1, P+2 for its log servers)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + n > 65535:
            continue
        free = True
        for p in range(port + 1, port + n):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    free = False
        if free:
            return port
    raise DemoError("no free block of 3 ports on 127.0.0.1")


class AirflowDemo:
    """One Airflow-driven run of the reference pipeline on a sandbox under ``root``."""

    def __init__(self, root: Path, console, keep_airflow: bool, live_checks: bool,
                 port: int | None, timeout_s: float, cluster: bool = False,
                 cluster_broker=None, data: dict[str, int] | None = None,
                 rate: float | None = None):
        self.root = root
        self.cluster = cluster  # on bin/cluster up's engines, with the CeleryExecutor
        self.cluster_broker = cluster_broker  # its Kafka (ClusterKafka) when on it
        self.sandbox = root / "airflow-run"
        self.home = root / "airflow"
        self.console = console
        self.keep_airflow = keep_airflow
        self.live_checks = live_checks
        self.port = port
        self.timeout_s = timeout_s
        self.input = data or DEMO_INPUT  # the generator's options (the fault campaign's)
        self.epochs = self.input["epochs"]
        self.rate = rate  # records/s of input produced while it runs (None: all at first)
        self.steady = None  # its SteadyInput
        self.t0 = time.monotonic()
        self.timings: dict[str, float] = {}
        self.events: list[str] = []  # for the report, in order
        self.notes: list[str] = []  # what the demo had to do around the DAGs, and why
        self.env: dict[str, str] = {}
        self.api: AirflowAPI | None = None
        self.broker = None
        self.run = None
        self.airflow_started = False
        self._seen: dict[str, str] = {}
        self.recover_run: str | None = None
        self._airflow: dict[str, Any] | None = None
        self._skipped: set[str] = set()
        self._labels: dict[str, dict[str, int]] = {}
        self.killed_at: datetime | None = None
        self.rollbacks_before = 0  # finished rollbacks in the epoch log before the kill
        self.engine_was_up = _engine_answering()  # then it is someone else's to stop

    # -- helpers ----------------------------------------------------------------------

    def log(self, message: str, event: bool = False) -> None:
        t = time.monotonic() - self.t0
        self.console.log(f"[dim]{t:5.0f} s[/dim] {message}")
        if event:
            self.events.append(f"{t:.0f} s: {html.escape(_plain(message))}")

    def phase(self, name: str, since: float) -> float:
        now = time.monotonic()
        self.timings[name] = now - since
        return now

    def bin_airflow(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        return subprocess.run([str(REPO_ROOT / "bin" / "airflow"), *args], env=self.env,
                              capture_output=True, text=True, timeout=timeout)

    def job_info(self, job: str = "communities") -> dict | None:
        path = Path(self.run.cfg.var_dir) / "run" / self.run.pipeline.name / f"{job}.json"
        return json.loads(path.read_text()) if path.exists() else None

    # -- phases -----------------------------------------------------------------------

    def clean(self) -> None:
        """Stop what a previous demo left running here (Airflow kept for the user, jobs),
        then start from empty folders."""
        from falkirk.runtime import procs
        self.env = self._airflow_env()
        if (self.home / "airflow.pid").exists():
            self.log("stopping the Airflow a previous demo left running")
            self.bin_airflow("stop", timeout=120)
        run_dir = self.sandbox / "var" / "run" / "reference"
        for f in sorted(run_dir.glob("*.json")) if run_dir.exists() else []:
            info = json.loads(f.read_text())
            if procs.alive(info["pid"]):
                procs.stop_group(info["pgid"], timeout_s=10)
        shutil.rmtree(self.sandbox, ignore_errors=True)
        shutil.rmtree(self.home, ignore_errors=True)

    def _airflow_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
        env.update({"FALKIRK_AIRFLOW_HOME": str(self.home),
                    "FALKIRK_LAKE": str(self.sandbox / "lake"),
                    "FALKIRK_VAR_DIR": str(self.sandbox / "var"),
                    "FALKIRK_BATCH_EPOCHS": str(self.epochs)})
        if self.run is not None:  # the run's lake (on the cluster: its object store
            env.update(self.run.env)  # prefix and credentials), var folder and broker
        if self.cluster:
            from falkirk_dev import cluster

            env["FALKIRK_ENV"] = "cluster"
            if self.run is not None:  # what bin/airflow would ask the cluster for; the
                # cluster's folder is not the sandbox's FALKIRK_VAR_DIR
                env.update(cluster.airflow_settings(self.home))
        return env

    def start_sandbox(self) -> None:
        from falkirk.local.broker import LocalBroker
        from falkirk_dev.harness import LocalRun

        self.broker = (self.cluster_broker or LocalBroker(self.sandbox / "broker")).start()
        self.run = LocalRun(self.sandbox, broker=self.broker).__enter__()
        if self.rate is None:
            info, how = self.run.generate(**self.input), "input generated"
        else:
            from falkirk_dev.harness import SteadyInput

            self.steady = SteadyInput(self.run, self.rate, **self.input).start()
            info = self.steady.info
            how = (f"input produced at {self.rate:g} records/s while it runs (one epoch "
                   f"every {self.steady.seconds / self.epochs:.0f} s)")
        self.env = self._airflow_env()
        self.log(f"sandbox {self.sandbox}: broker on {self.broker.bootstrap}; {how} "
                 f"({self.input['events']} events, {self.input['queries']} queries, "
                 f"{self.epochs} epochs, seed {self.input['seed']}; {info['malformed']} "
                 f"malformed, {info['late']} late)")

    def start_airflow(self) -> None:
        self.port = self.port or _free_port_block()
        url = f"http://127.0.0.1:{self.port}"
        with self.console.status(f"starting Airflow on {url} (bin/airflow start: database "
                                 f"migration, api-server, scheduler, dag-processor, "
                                 f"triggerer)…"):
            done = self.bin_airflow("start", "--port", str(self.port))
        self.airflow_started = True
        if done.returncode != 0:
            raise DemoError(f"bin/airflow start failed ({done.returncode}):\n"
                            f"{done.stdout[-2000:]}{done.stderr[-2000:]}")
        self.api = AirflowAPI(url, self.home)
        self.version = self.api.call("GET", "/api/v2/version").get("version", "?")
        self.log(f"Airflow {self.version} ready at {url} (AIRFLOW_HOME={self.home})",
                 event=True)

    def unpause(self) -> None:
        api = self.api
        deadline = time.monotonic() + 300
        with self.console.status("waiting for the dag-processor to parse falkirk's DAG file…"):
            while True:
                missing = [d for d in (SUPERVISOR, BATCH)
                           if api._request("GET", f"/api/v2/dags/{d}")[0] != 200]
                if not missing:
                    break
                errors = api.call("GET", "/api/v2/importErrors").get("import_errors", [])
                ours = [e for e in errors if any(m.removeprefix("falkirk_") in e["filename"]
                                                 for m in missing)]
                if ours:
                    raise DemoError("DAG import errors:\n" + "\n".join(
                        f"{e['filename']}: {e['stack_trace'][-1500:]}" for e in ours))
                if time.monotonic() > deadline:
                    raise DemoError(f"Airflow never parsed {missing} (see {self.home}/logs/"
                                    f"dag-processor.log)")
                time.sleep(2)
        for dag_id in (SUPERVISOR, BATCH, *((STREAM_CHECKS,) if self.live_checks else ())):
            api.pause(dag_id, False)
        self.log(f"unpaused {SUPERVISOR} (start, watch, recover the stream jobs) and {BATCH} "
                 f"(popularity: one Spark run per epoch, catchup over {self.epochs} epochs)"
                 + (f" and {STREAM_CHECKS} (checks of the stream epochs as they commit)"
                    if self.live_checks else ""),
                 event=True)

    # -- watching ---------------------------------------------------------------------

    def progress(self, airflow: bool = True) -> dict[str, Any]:
        """Where everything is: regions' epochs, stream jobs, the batch runs, the supervisor
        run (Airflow's part only when ``airflow``, else the last one read: the api-server
        has one worker, shared with the tasks' execution API, on a busy machine)."""
        from falkirk.airflow import streams
        from falkirk.runtime import procs

        logs = self.run.log.regions(self.run.pipeline)
        regions = {}
        for name, rlog in logs.items():
            done = sorted({r.epoch for r in rlog.entries.values()
                           if r.status in ("committed", "checkpointed")})
            running = sorted({r.epoch for r in rlog.entries.values() if r.status == "running"})
            regions[name] = (done, running)
        alive = {Path(i["job"]).stem for i in procs.running(self.run.pipeline, self.run.cfg)}
        jobs = {}
        for job in streams.stream_jobs(self.run.pipeline):
            name = Path(job).stem
            jobs[name] = ("running" if name in alive else
                          "finished" if streams.finished_cleanly(self.run.pipeline, job,
                                                                 self.run.cfg)
                          else "not running" if self.job_info(name) else "not started")
        if airflow or self._airflow is None:
            sup = self.api.runs(SUPERVISOR)
            self._airflow = {"batch": self.api.runs(BATCH), "supervisor": sup,
                             "batch_failed_tasks": self.api.failed_tasks(BATCH)}
            if not self.live_checks:
                self.skip_live_checks(self._airflow)
            self._airflow["supervisor_tasks"] = {
                r["dag_run_id"]: self.api.tasks(SUPERVISOR, r["dag_run_id"])
                for r in sup if r["state"] in ("queued", "running")}
        return {"regions": regions, "jobs": jobs, **self._airflow}

    def describe(self, p: dict[str, Any]) -> str:
        parts = []
        for name, (done, running) in p["regions"].items():
            last = done[-1] if done else -1
            parts.append(f"{name} {last + 1}/{self.epochs}" + (f"▸{running[-1]}" if running
                                                              and running[-1] > last else ""))
        parts.append(f"batch epochs {self.batch_epochs_done(p)}/{self.epochs}")
        return "epochs done: " + ", ".join(parts)

    def run_epochs(self, run: dict) -> list[int]:
        """The epochs of a batch run's data interval (several for a run that caught up)."""
        s = self.run.pipeline.settings  # (not falkirk.airflow.batch: importing Airflow
        length = s.get("epoch_seconds", 10) * 1000  # takes logging over)

        def epoch(key: str) -> int:
            at = datetime.fromisoformat(run[key].replace("Z", "+00:00"))
            return round((at.timestamp() * 1000 - s["origin_ms"]) / length)

        first = epoch("data_interval_start")
        return list(range(first, max(first + 1, epoch("data_interval_end"))))

    def batch_epochs_done(self, p: dict[str, Any]) -> int:
        """How many epochs the successful batch runs covered."""
        return len({e for r in p["batch"] if r["state"] == "success"
                    for e in self.run_epochs(r)})

    def label(self, dag_id: str, run: dict) -> str:
        """A short name for a DAG run: the batch run's epochs, the supervisor run's number."""
        if dag_id == BATCH:
            epochs = self.run_epochs(run)
            return (f"batch run for epoch {epochs[0]}" if len(epochs) == 1 else
                    f"batch run for epochs {epochs[0]}-{epochs[-1]}")
        names = self._labels.setdefault(dag_id, {})
        return f"supervisor run {names.setdefault(run['dag_run_id'], len(names) + 1)}"

    def report_changes(self, p: dict[str, Any]) -> None:
        """Log what changed since last time: jobs, DAG runs, supervisor tasks (not every
        poke of a sensor)."""
        now: dict[str, str] = {}
        for job, state in p["jobs"].items():
            now[f"job {job}"] = state
        for r in p["batch"]:
            now[self.label(BATCH, r)] = r["state"]
        names = {}
        for r in p["supervisor"]:
            names[r["dag_run_id"]] = self.label(SUPERVISOR, r)
            now[names[r["dag_run_id"]]] = r["state"]
        for run_id, tasks in p["supervisor_tasks"].items():
            for task, ti in tasks.items():
                state = ti["state"] or "none"
                if state in ("up_for_reschedule", "deferred"):
                    state = "running"  # a sensor between pokes, or deferred to a trigger
                now[f"{names.get(run_id, run_id)}: {task}"] = state
        for key, state in now.items():
            if state in ("none", "scheduled", "queued") and key in self._seen:
                continue  # a sensor between pokes, a retry on its way
            if self._seen.get(key) != state:
                if state not in ("none", "scheduled", "queued"):
                    self.log(f"{key}: {state}")
                self._seen[key] = state

    def wait(self, what: str, done, interval: float = 5.0, timeout_s: float | None = None,
             airflow_every: float = 5.0):
        """Poll ``done(progress)`` until it returns something truthy; show progress. The
        epoch log is read every ``interval`` s, Airflow's REST API every ``airflow_every``."""
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        asked = 0.0
        with self.console.status(what) as status:
            while True:
                fresh = time.monotonic() - asked >= airflow_every
                if fresh:
                    asked = time.monotonic()
                p = self.progress(airflow=fresh)
                self.report_changes(p)
                self.check_failures(p)
                status.update(f"{what}  [dim]{self.describe(p)}[/dim]")
                result = done(p)
                if result:
                    return result
                if time.monotonic() > deadline:
                    raise DemoError(f"timed out ({timeout_s or self.timeout_s:.0f} s) "
                                    f"{what}; {self.describe(p)}")
                time.sleep(interval)

    def check_failures(self, p: dict[str, Any]) -> None:
        """Fail on a failed batch run, and on a batch task that failed for good even when
        its run says success (a run whose data_checks the demo marked skipped ends
        `success` though its epoch's task failed: nothing would ever rerun that epoch).
        And on a steady input whose producer failed: the pipeline would wait for it."""
        if self.steady is not None:
            self.steady.check()
        failed = [r for r in p["batch"] if r["state"] == "failed"]
        if failed:
            raise DemoError(f"{BATCH} run {failed[0]['dag_run_id']} failed: see "
                            f"{self.api.run_url(BATCH, failed[0]['dag_run_id'])} and "
                            f"{self.home}/logs/")
        if p.get("batch_failed_tasks"):
            ti = p["batch_failed_tasks"][0]
            raise DemoError(f"{BATCH} task {ti['task_id']} {ti['state']} after "
                            f"{ti.get('try_number')} tries in run {ti['dag_run_id']}: see "
                            f"{self.api.run_url(BATCH, ti['dag_run_id'])} and "
                            f"{self.home}/logs/")
        for run_id, tasks in p["supervisor_tasks"].items():
            for task, ti in tasks.items():
                if ti["state"] in ("failed", "upstream_failed"):
                    raise DemoError(f"{SUPERVISOR} task {task} {ti['state']} in run {run_id}: "
                                    f"see {self.api.run_url(SUPERVISOR, run_id)}")
        if any(r["state"] == "failed" for r in p["supervisor"]):
            raise DemoError(f"a {SUPERVISOR} run failed: see {self.api.url}")

    # -- the story --------------------------------------------------------------------

    def skip_live_checks(self, p: dict[str, Any]) -> None:
        """Without live checks (the stream checks DAG stays paused): mark the data_checks
        task of every new batch run skipped as soon as the run exists (before it starts: a
        task marked skipped while it runs is killed, and its validate child could outlive
        it); the checks run once at the end instead."""
        for dag_id, runs in ((BATCH, p["batch"]),):
            for r in runs:
                key = f"{dag_id}/{r['dag_run_id']}"
                if r["state"] not in ("queued", "running") or key in self._skipped:
                    continue
                q = urllib.parse.quote(r["dag_run_id"], safe="")
                done = self.api.call(
                    "PATCH", f"/api/v2/dags/{dag_id}/dagRuns/{q}/taskInstances/data_checks",
                    {"new_state": "skipped", "note": "falkirk demo: the data checks run "
                                                     "once at the end (--live-checks runs "
                                                     "this task)"},
                    ok=(200, 404, 409))
                if isinstance(done, dict) and done.get("task_instances"):
                    self._skipped.add(key)
                    self.log(f"{self.label(dag_id, r)}: data_checks marked skipped (checks "
                             f"run once at the end)")

    def until_kill_point(self) -> tuple[str, int]:
        """Wait for communities to be in the middle of epoch KILL_EPOCH (or a later one, if
        it raced past); the supervisor run watching it and the job's pid file."""
        def ready(p):
            info = self.job_info()
            running = [r for r, tasks in p["supervisor_tasks"].items()
                       if tasks.get("watch", {}).get("state") in ("running", "up_for_reschedule",
                                                                  "deferred")]
            if info is None or not running:
                return None
            done, now = p["regions"][KILLED_REGION]
            mid = [e for e in now if e >= KILL_EPOCH and e not in done]
            if mid and self.run.epoch_running(KILLED_REGION, mid[-1]):
                return running[-1], mid[-1]
            if done and done[-1] >= self.epochs - 1:
                raise DemoError("communities finished every epoch before the demo could "
                                "kill it")
            return None

        return self.wait(f"waiting for communities to be in the middle of epoch "
                         f"{KILL_EPOCH}…", ready, interval=0.5, airflow_every=10)

    def kill(self, epoch: int) -> None:
        from falkirk.runtime import procs
        info = self.job_info()
        pgid = info["pgid"]
        # (counted before the kill: the watch's trigger may roll back within a second)
        self.rollbacks_before = sum(r["status"] == "done" for r in
                                    self.run.log.rollbacks(self.run.pipeline.name))
        os.killpg(pgid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while procs.group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        self.killed_at = datetime.now(UTC)
        self.log(f"[red]killed communities with SIGKILL (process group {pgid}) in the "
                 f"middle of epoch {epoch}", event=True)

    def until_recovered(self, run_id: str, killed_at: float) -> dict:
        """The supervisor notices the death and rolls back: its watch's trigger does it in
        the triggerer (``recover_in_trigger``), or its ``recover`` task when that is off or
        the trigger's recovery failed. Done when the epoch log has a finished rollback,
        made since the kill, that names the killed region as failed: its plan."""
        before = self.rollbacks_before

        def rolled_back(p):
            done = [r for r in self.run.log.rollbacks(self.run.pipeline.name)
                    if r["status"] == "done"][before:]
            return next((r for r in done if KILLED_REGION in (r["request"].get("failed")
                                                              or [])), None)

        row = self.wait("waiting for the supervisor to notice (its watch is deferred to the "
                        "triggerer) and roll back…", rolled_back, interval=1, airflow_every=3)
        self.timings["kill → rolled back"] = time.monotonic() - killed_at
        self.recover_run = run_id
        plan = row["plan"]
        from falkirk.airflow.supervisor import watch_by

        by_watch = f"({watch_by(run_id)})" in (row["request"].get("reason") or "")
        if by_watch:
            who = "its watch, in the triggerer,"
        else:  # the recover task: its XCom says what it restarted
            def recover_done(p):
                tasks = p["supervisor_tasks"].get(run_id) or self.api.tasks(SUPERVISOR, run_id)
                return tasks if tasks["recover"]["state"] == "success" else None

            tasks = self.wait("waiting for the supervisor's recover task…", recover_done,
                              interval=3, airflow_every=3)
            xcom = self.api.xcom(SUPERVISOR, run_id, "recover", key="plan")
            if xcom is not None and xcom.get("rollback_id") != plan["rollback_id"]:
                self.notes.append(f"the recover task's plan ({xcom.get('rollback_id')}) is "
                                  f"not the epoch log's ({plan['rollback_id']})")
            who = f"its recover task ({tasks['recover']['state']})"
        frontiers = {r: f for r, f in plan["frontiers"].items() if f != "top"}
        self.log(f"supervisor: {who} rolled back {self.timings['kill → rolled back']:.0f} s "
                 f"after the kill ({plan['rollback_id']}, generation {plan['generation']}, "
                 f"frontiers {frontiers or 'all ⊤'}) and restarted the jobs it stopped",
                 event=True)
        return plan

    def until_committed_again(self, generation: int, killed_at: float) -> None:
        """The killed region's first commit in the rollback's generation: the end of its
        recovery (detection, the rollback, the restart, the catch-up)."""
        def again(p):
            rlog = self.run.log.regions(self.run.pipeline)[KILLED_REGION]
            return any(r.generation >= generation and r.status in ("committed", "checkpointed")
                       for r in rlog.entries.values())

        self.wait(f"waiting for {KILLED_REGION} to commit in generation {generation}…", again,
                  interval=0.5, airflow_every=10)
        self.timings["kill → committed again"] = time.monotonic() - killed_at
        self.log(f"{KILLED_REGION} committed an epoch in generation {generation} "
                 f"{self.timings['kill → committed again']:.0f} s after the kill", event=True)

    def until_done(self, timeout_s: float | None = None) -> None:
        """Every epoch done: batch runs, stream jobs finished, communities' last epoch.
        ``timeout_s``: a long campaign leaves many epochs to run after its last fault."""
        last = self.epochs - 1

        def done(p):
            committed = {n: (d[-1] if d else -1) for n, (d, _) in p["regions"].items()}
            streams_done = all(p["jobs"][j] == "finished" for j in ("ingest", "serve"))
            return (self.batch_epochs_done(p) >= self.epochs and streams_done
                    and all(e >= last for e in committed.values()))

        self.wait(f"waiting for every region to finish epoch {last} (the batch DAG, the "
                  f"stream jobs)…", done, timeout_s=timeout_s)
        self.log(f"every region finished epoch {last}; ingest and serve ended at the end of "
                 f"their input", event=True)

    def end_supervision(self) -> None:
        """Pause the supervisor once every epoch is done, then close what is left open.

        The supervisor DAG is @continuous and its watch goes on waiting once every stream
        job finished at the end of its input (a rollback could start them again), so its
        run never ends by itself. The demo pauses the DAG (what its doc says stops
        supervising), lets an in-flight task finish, stops a stream job still alive, and
        marks the run left open success, with a note."""
        from falkirk.runtime import procs
        api = self.api
        api.pause(SUPERVISOR, True)
        self.log(f"paused {SUPERVISOR}: every epoch is done", event=True)

        def settled(p):
            open_runs = [r for r in p["supervisor"] if r["state"] in ("queued", "running")]
            busy = [t for r in open_runs for t in p["supervisor_tasks"].get(r["dag_run_id"],
                                                                            {}).values()
                    if t["state"] in ("running", "queued")]
            return (open_runs or [None]) if not busy else None

        open_runs = self.wait("waiting for an in-flight supervisor task to finish…", settled,
                              interval=3, airflow_every=3, timeout_s=900)
        for info in procs.running(self.run.pipeline, self.run.cfg):
            procs.stop_group(info["pgid"], timeout_s=20)
            self.log(f"stopped {info['job']}: still running after every epoch was done",
                     event=True)
        for r in open_runs:
            if r is None:
                continue
            tasks = self.api.tasks(SUPERVISOR, r["dag_run_id"])
            waiting = sorted(t for t, ti in tasks.items() if ti["state"] not in TERMINAL)
            note = ("Ended by the falkirk demo after every epoch was done: every stream job "
                    "finished at the end of its input, and it paused the DAG; "
                    f"{', '.join(waiting) or 'no task'} still waiting.")
            q = urllib.parse.quote(r["dag_run_id"], safe="")
            api.call("PATCH", f"/api/v2/dags/{SUPERVISOR}/dagRuns/{q}",
                     {"state": "success", "note": note})
            self.notes.append(f"The demo marked {SUPERVISOR} run {r['dag_run_id']} success: "
                              f"{note}")
            self.log(f"marked {self.label(SUPERVISOR, r)} success (see its note in the UI)")

    def validate(self) -> dict:
        """``falkirk validate`` on the sandbox: the epochs not checked yet (all of them
        without live checks), with GX Data Docs."""
        cmd = [sys.executable, "-m", "falkirk.cli", "validate", "--pipeline", "reference",
               "--json"]
        with self.console.status("data checks: falkirk validate (Spark + Great "
                                 "Expectations)…"):
            done = subprocess.run(cmd, env=self.env, capture_output=True, text=True,
                                  timeout=1800)
        if done.returncode not in (0, 1) or not done.stdout.strip():
            raise DemoError(f"falkirk validate exited {done.returncode}: "
                            f"{done.stderr[-2000:]}")
        report = json.loads(done.stdout.strip().splitlines()[-1])
        rows = self.run.log.checks(self.run.pipeline.name)
        summary = checks_summary(rows)
        docs = report.get("data_docs")
        if docs is None:
            found = Path(self.run.cfg.var_dir) / "checks" / "reference" / "data_docs" / \
                "index.html"
            docs = str(found) if found.exists() else None
        failed = [r for r in summary if r["failed"]]
        self.log(f"data checks: {len(report['epochs'])} region epoch(s) checked now; "
                 f"in all {len(summary)} region epochs, {sum(r['checks'] for r in summary)} "
                 f"checks, {len(failed)} failed", event=True)
        if self.live_checks:
            how = ("From the epoch log's checks table. Live checks: the batch DAG's "
                   "data_checks task checked each popularity epoch after its run, "
                   f"{STREAM_CHECKS} checked stream epochs as they were "
                   "committed, and the demo ran falkirk validate once at the end for what was "
                   f"left ({len(report['epochs'])} region epochs).")
        else:
            how = ("From the epoch log's checks table. Checks once at the end (the default; "
                   f"--live-checks runs the DAGs' own): {STREAM_CHECKS} stayed paused, "
                   "the demo marked the batch DAG's data_checks tasks skipped and ran "
                   f"falkirk validate once at the end, over every committed epoch "
                   f"({len(report['epochs'])} region "
                   "epochs).")
        return {"summary": summary, "data_docs": docs, "how": how}

    def airflow_section(self) -> dict:
        runs = []
        for dag_id in (SUPERVISOR, BATCH):
            for r in self.api.runs(dag_id):
                tasks = self.api.tasks(dag_id, r["dag_run_id"])
                runs.append({"dag_id": dag_id, "run_id": r["dag_run_id"], "state": r["state"],
                             "url": self.api.run_url(dag_id, r["dag_run_id"]),
                             "tasks": ", ".join(f"{t} {ti['state']}" + (
                                 f" (try {ti['try_number']})" if ti.get("try_number", 1) > 1
                                 else "") for t, ti in tasks.items())})
        restarts = []
        for i, r in enumerate(self.api.runs(SUPERVISOR)):
            started = self.api.xcom(SUPERVISOR, r["dag_run_id"], "start_streams") if i else None
            if started:
                restarts.append(f"run {i + 1}: {', '.join(sorted(started))}")
        if restarts:
            self.notes.append(
                "Later supervisor runs started stream jobs (after a death, or a rollback): "
                + "; ".join(restarts) + ".")
        log = self.home / "logs" / "scheduler.log"
        if log.exists():
            text = log.read_text(errors="replace")
            skipped = sum(1 for line in text.splitlines()
                          if "run already exists; skipping dagrun creation" in line
                          and f"dag_id={SUPERVISOR}" in line)
            if skipped:
                self.notes.append(
                    f"Airflow's scheduler never created a second {SUPERVISOR} run after the "
                    f"first one ended: it logged 'run already exists; skipping dagrun "
                    f"creation' {skipped} times (the @continuous DAG has no start_date, so "
                    f"its next run gets the same logical date as the first). Nothing "
                    f"supervised the stream jobs after that.")
        return {"url": self.api.url, "home": str(self.home), "version": self.version,
                "events": self.events, "runs": runs, "notes": self.notes}

    def shutdown(self, failed: bool) -> None:
        """Stop the jobs and the broker; Airflow too unless it is kept for the user, and
        then first: pausing a DAG does not stop its running task, whose start step could
        start a job after the jobs were stopped (a failed campaign left one running)."""
        from falkirk.runtime import procs
        if self.api is not None:
            for dag_id in (SUPERVISOR, BATCH) if failed else (SUPERVISOR,):
                with contextlib.suppress(Exception):
                    self.api.pause(dag_id, True)
        if self.airflow_started and not self.keep_airflow:
            with self.console.status("stopping Airflow…"):
                self.bin_airflow("stop", timeout=180)
        if self.run is not None:
            for info in procs.running(self.run.pipeline, self.run.cfg):
                procs.stop_group(info["pgid"], timeout_s=10)
            self.run.stop_all()  # the jobs it started itself
        if self.broker is not None:
            self.broker.stop()
        if not self.keep_airflow and self.run is not None and not self.engine_was_up:
            from falkirk.runtime.engine import stop_local  # it started it; nobody is left

            stop_local(self.run.cfg)


def _engine_answering() -> bool:
    """Whether the profile's Spark Connect engine already answers (a test suite's, a
    campaign's, the user's ``falkirk engine start``)."""
    from falkirk.config import load
    from falkirk.io.spark import answering

    cfg = load()
    return bool(cfg.spark_remote and cfg.local_engine and answering(cfg.spark_remote))


def main_airflow(args: Namespace, console, cluster: bool = False) -> int:
    """The Airflow-driven demo; with ``cluster``, on the engines of ``bin/cluster up``
    (the failure-free run stays on the embedded defaults)."""
    broker, engines_note = engines(cluster, airflow=True)  # refuses before anything changes
    with profile("cluster" if cluster else os.environ.get("FALKIRK_ENV", "local")):
        return _main_airflow(args, console, cluster, broker, engines_note)


def _main_airflow(args: Namespace, console, cluster: bool, broker, engines_note: str) -> int:
    from falkirk_dev.harness import compare

    root = Path(getattr(args, "root", None) or REPO_ROOT / "var" / "demo").resolve()
    root.mkdir(parents=True, exist_ok=True)
    demo = AirflowDemo(root, console, keep_airflow=getattr(args, "keep_airflow", True),
                       live_checks=getattr(args, "live_checks", False),
                       port=getattr(args, "port", None),
                       timeout_s=getattr(args, "timeout", 1800), cluster=cluster,
                       cluster_broker=broker)
    t = demo.t0
    demo.clean()
    t = demo.phase("clean up a previous demo", t)
    with profile("local"):
        golden, golden_note, _ = golden_outputs(root, console,
                                                getattr(args, "fresh_golden", False))
    golden_note = f"{golden_note} {engines_note}"
    console.log(engines_note)
    t = demo.phase("failure-free run", t)
    failed = True
    try:
        t_run = t
        demo.start_sandbox()
        t = demo.phase("broker and input", t)
        demo.start_airflow()
        t = demo.phase("Airflow start", t)
        demo.unpause()
        t = demo.phase("DAGs parsed and unpaused", t)
        run_id, epoch = demo.until_kill_point()
        t = demo.phase(f"until communities was mid epoch {epoch}", t)
        demo.kill(epoch)
        killed = t
        plan = demo.until_recovered(run_id, t)
        t = demo.phase("kill → recovered (supervisor)", t)
        demo.until_committed_again(plan["generation"], killed)
        t = time.monotonic()
        demo.until_done()
        t = demo.phase("committed again → every epoch done", t)
        run_s = t - t_run
        demo.end_supervision()
        t = demo.phase("end supervision", t)
        checks = demo.validate()
        t = demo.phase("data checks (falkirk validate)", t)
        outputs = demo.run.outputs()
        comparison = compare(golden, outputs)
        series = throughput_per_epoch(demo.run)
        steps, first = progress_over_time(demo.run)
        marks = [] if first is None or demo.killed_at is None else [
            ((demo.killed_at - first).total_seconds(), "communities killed")]
        progress = progress_svg(steps, demo.epochs, marks, "epochs done per region over time "
                                "(dashed: the kill)")
        airflow = demo.airflow_section()
        t = demo.phase("outputs, comparison", t)
        demo.timings["total"] = time.monotonic() - demo.t0
        report = root / "report.html"
        sent = demo.run.sent()
        report.write_text(report_html(demo.run.pipeline, plan, comparison, series,
                                      demo.timings, golden_note, airflow, checks, progress,
                                      sent))
        _save_figures(root, cluster, {**demo.timings, "run with the failure": run_s},
                      series, comparison, airflow=True)
        failed = False
    finally:
        demo.shutdown(failed)
        if failed and demo.airflow_started:
            console.print(f"[red]the demo failed[/red]; Airflow logs: {demo.home}/logs, job "
                          f"logs: {demo.sandbox}/var/log")
            if demo.keep_airflow and demo.api is not None:
                console.print(f"Airflow is still up for a look: {demo.api.url} (login admin, "
                              f"password in {demo.home}/passwords.json); stop it with: "
                              f"FALKIRK_AIRFLOW_HOME={demo.home} bin/airflow stop")
    code = _verdict(console, comparison, plan["frontiers"], report, demo.timings)
    bad_checks = [r for r in checks["summary"] if r["failed"]]
    console.print(f"data checks: {len(checks['summary'])} region epochs, "
                  f"{'all passed' if not bad_checks else f'{len(bad_checks)} failed'}"
                  + (f"; GX Data Docs: {checks['data_docs']}" if checks["data_docs"] else ""))
    if demo.keep_airflow:
        console.print(f"Airflow UI: {demo.api.url}  (login admin, password in "
                      f"{demo.home}/passwords.json)")
        console.print(f"the supervisor run that rolled back (its Rollback plan tab): "
                      f"{demo.api.run_url(SUPERVISOR, demo.recover_run)}")
        console.print(f"stop Airflow with: FALKIRK_AIRFLOW_HOME={demo.home} bin/airflow stop")
    else:
        console.print(f"Airflow stopped (its logs stay in {demo.home}/logs)")
    return code if not bad_checks else 1



def _plain(message: str) -> str:
    """Rich markup off (for the report)."""
    import re

    return re.sub(r"\[/?[a-z ]+\]", "", message)
