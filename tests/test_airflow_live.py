"""A real local Airflow (bin/airflow) on a sandbox epoch log: auth stays on, the REST API
refuses bad params and runs a dry-run rollback, and the run's plan page shows the plan."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

from falkirk.config import REPO_ROOT

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def live_airflow(tmp_path_factory):
    """bin/airflow with its own home and port, on a reference sandbox; stopped after."""
    from reference_world import make_reference_world

    root = tmp_path_factory.mktemp("live_airflow")
    cfg = make_reference_world(root / "world")
    port = _free_port()
    env = {**os.environ, "FALKIRK_AIRFLOW_HOME": str(root / "airflow"),
           "FALKIRK_LAKE": cfg.lake, "FALKIRK_VAR_DIR": cfg.var_dir}
    for k in [k for k in env if k.startswith("AIRFLOW")]:
        env.pop(k)  # the instance's own settings only
    bin_airflow = str(REPO_ROOT / "bin" / "airflow")
    try:
        subprocess.run([bin_airflow, "start", "--port", str(port)], env=env, check=True,
                       timeout=300)
        yield f"http://127.0.0.1:{port}", cfg
    finally:
        subprocess.run([bin_airflow, "stop"], env=env, timeout=120)


def _call(url: str, token: str | None = None, body: dict | None = None) -> tuple[int, str]:
    req = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode(),
                                 method="GET" if body is None else "POST")
    req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def _token(url: str) -> str:
    status, body = _call(f"{url}/auth/token", body={"username": "admin", "password": "admin"})
    assert status in (200, 201), body
    return json.loads(body)["access_token"]


def test_rest_api_dry_run_and_plan_page(live_airflow):
    from reference_world import snapshot

    url, cfg = live_airflow
    before = snapshot(cfg)
    assert _call(f"{url}/api/v2/dags")[0] == 401  # auth stays on
    token = _token(url)
    runs = f"{url}/api/v2/dags/falkirk_rollback/dagRuns"
    deadline = time.monotonic() + 120  # the dag-processor's first parse
    while _call(f"{url}/api/v2/dags/falkirk_rollback", token)[0] != 200:
        assert time.monotonic() < deadline, "falkirk_rollback never appeared"
        time.sleep(2)

    status, body = _call(runs, token, {"logical_date": None, "conf": {
        "pipeline": "reference", "failed_regions": ["nope"], "reason": "x"}})
    assert status == 400 and "Invalid input for param failed_regions" in body

    status, body = _call(runs, token, {"logical_date": None, "conf": {
        "pipeline": "reference", "failed_regions": ["communities"], "reason": "REST test"}})
    assert status == 200, body
    run_id = json.loads(body)["dag_run_id"]
    quoted = urllib.parse.quote(run_id, safe="")
    deadline = time.monotonic() + 180
    while True:
        state = json.loads(_call(f"{runs}/{quoted}", token)[1])["state"]
        if state in ("success", "failed"):
            break
        assert time.monotonic() < deadline, f"run still {state}"
        time.sleep(2)
    assert state == "success"
    assert snapshot(cfg) == before

    page = f"{url}/falkirk/plan/falkirk_rollback/{quoted}"
    assert _call(page)[0] == 401
    status, html = _call(page, token)
    assert status == 200
    assert "<td>communities</td><td>lazy</td><td>epoch 4 (converged)</td>" \
           "<td>epoch 2 (converged)</td>" in html
    assert "<svg" in html and "REST test" in html
