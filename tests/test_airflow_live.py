"""A real local Airflow (bin/airflow) on a sandbox epoch log: auth stays on, the REST API
refuses bad params and runs a dry-run rollback, and the run's plan page shows the plan.
The browser test does the same as a user would, in Debian's chromium driven by Playwright,
and keeps a screenshot of every step in var/artifacts/browser/."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from falkirk.config import REPO_ROOT

pytestmark = pytest.mark.slow

TEST_PASSWORD = "falkirk-test"  # this test's own Airflow login (bin/airflow generates one)


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
           "FALKIRK_LAKE": cfg.lake, "FALKIRK_VAR_DIR": cfg.var_dir,
           "FALKIRK_AIRFLOW_PASSWORD": TEST_PASSWORD}
    for k in [k for k in env if k.startswith("AIRFLOW")]:
        env.pop(k)  # the instance's own settings only
    bin_airflow = str(REPO_ROOT / "bin" / "airflow")
    try:
        subprocess.run([bin_airflow, "start", "--port", str(port)], env=env, check=True,
                       timeout=300)
        yield f"http://127.0.0.1:{port}", cfg, env
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
    status, body = _call(f"{url}/auth/token",
                         body={"username": "admin", "password": TEST_PASSWORD})
    assert status in (200, 201), body
    return json.loads(body)["access_token"]


def test_rest_api_dry_run_and_plan_page(live_airflow):
    from reference_world import snapshot

    url, cfg, _ = live_airflow
    before = snapshot(cfg)
    assert _call(f"{url}/api/v2/dags")[0] == 401  # auth stays on
    token = _token(url)
    runs = f"{url}/api/v2/dags/falkirk_reference_rollback/dagRuns"
    deadline = time.monotonic() + 120  # the dag-processor's first parse
    while _call(f"{url}/api/v2/dags/falkirk_reference_rollback", token)[0] != 200:
        assert time.monotonic() < deadline, "falkirk_reference_rollback never appeared"
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
        try:
            state = json.loads(_call(f"{runs}/{quoted}", token)[1])["state"]
        except (TimeoutError, urllib.error.URLError):  # a shared machine's slow moment
            state = "unknown"
        if state in ("success", "failed"):
            break
        assert time.monotonic() < deadline, f"run still {state}"
        time.sleep(2)
    assert state == "success"
    assert snapshot(cfg) == before

    page = f"{url}/falkirk/plan/falkirk_reference_rollback/{quoted}"
    assert _call(page)[0] == 401
    status, html = _call(page, token)
    assert status == 200
    # communities committed epochs 3 and 4 after its checkpoint at 2: it replays them
    assert "<td>communities</td><td>lazy</td><td>epoch 4 (converged)</td>" \
           "<td>epoch 4 (converged)</td><td>restarts from epoch 2 (converged)" in html
    assert "<svg" in html and "REST test" in html


# ---- the browser test ------------------------------------------------------------------

CHROMIUM = "/usr/bin/chromium"  # Debian's; never a downloaded browser (no `playwright install`)
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 # without these Chromium phones home and the closed network refuses it
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]
ARTIFACTS = REPO_ROOT / "var" / "artifacts" / "browser"
UI_TIMEOUT_MS = 60_000  # a slow, shared machine
STATE_BADGE = "state-badge"  # data-testid of Airflow's state badges
TERMINAL = ("Success", "Failed")
VIEWPORT = {"width": 1440, "height": 1000}  # a laptop: the plan tab is ~1000 px wide
REGIONS = ("ingest", "popularity", "communities", "serve", "stats")  # as declared

# What a person would see wrong in the region graph, measured by the browser that drew it
# (its fonts, not render.py's estimate of them): a line of text sticking out of its box, an
# edge label under a box, an edge whose ends are not on a box's border or that boxes could
# hide (painted before them), text outside the SVG.
GRAPH_PROBLEMS = """svg => {
  const r = el => el.getBoundingClientRect();
  const inside = (a, b) => a.left >= b.left - 0.5 && a.right <= b.right + 0.5
    && a.top >= b.top - 0.5 && a.bottom <= b.bottom + 0.5;
  const hits = (a, b) => a.left < b.right && b.left < a.right && a.top < b.bottom
    && b.top < a.bottom;
  const problems = [];
  const groups = [...svg.querySelectorAll("g.region, g.topic")];
  const boxes = groups.map(g => g.querySelector("rect"));
  for (const g of groups)
    for (const t of g.querySelectorAll("text"))
      if (!inside(r(t), r(g.querySelector("rect"))))
        problems.push(`"${t.textContent}" sticks out of its box`);
  for (const t of svg.querySelectorAll("g.edge-label text"))
    if (boxes.some(b => hits(r(t), r(b)))) problems.push(`label "${t.textContent}" under a box`);
  const onBorder = p => boxes.some(b => {
    const x = b.x.baseVal.value, y = b.y.baseVal.value;
    const w = b.width.baseVal.value, h = b.height.baseVal.value;
    return (Math.abs(p.x - x) < 1.5 || Math.abs(p.x - x - w) < 1.5)
      && p.y >= y - 0.5 && p.y <= y + h + 0.5;
  });
  const edges = [...svg.querySelectorAll("path.edge")];
  for (const e of edges) {
    const name = e.querySelector("title").textContent;
    if (!onBorder(e.getPointAtLength(0)) || !onBorder(e.getPointAtLength(e.getTotalLength())))
      problems.push(`edge ${name} does not end on boxes`);
    if (!(boxes.at(-1).compareDocumentPosition(e) & Node.DOCUMENT_POSITION_FOLLOWING))
      problems.push(`edge ${name} painted under a box`);
  }
  for (const t of svg.querySelectorAll("text"))
    if (!inside(r(t), r(svg))) problems.push(`"${t.textContent}" outside the graph`);
  return {problems, edges: edges.length};
}"""


def _shot(page, name: str, target=None) -> Path:
    """Screenshot the page (or one element) to var/artifacts/browser/NAME.png; its path."""
    path = ARTIFACTS / f"{name}.png"
    if target is None:
        page.screenshot(path=str(path), full_page=True)
    else:
        target.screenshot(path=str(path))
    print(f"screenshot: {path}")
    return path


def _open_dag(page, url: str, timeout_s: float = 180) -> None:
    """The rollback DAG's page, reloaded until the dag-processor has parsed the DAG (a 404
    page until then) and its Trigger button shows."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    page.goto(f"{url}/dags/falkirk_reference_rollback")
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            page.get_by_role("button", name="Trigger Dag").wait_for(timeout=10_000)
            return
        except PlaywrightTimeout:
            assert time.monotonic() < deadline, \
                "falkirk_reference_rollback never appeared in the UI"
            page.reload()


def _wait_for_run(page, run_id: str, timeout_s: float = 300) -> str:
    """The run's final state as its page's header badge shows it. The page refreshes itself
    while the run is active; a reload every 30 s covers a refresh that stalls."""
    header = page.get_by_role("heading", name=run_id, exact=True).locator("xpath=..")
    badge = header.get_by_test_id(STATE_BADGE)
    deadline = time.monotonic() + timeout_s
    reloaded = time.monotonic()
    while True:
        state = badge.inner_text().strip() if badge.count() else ""
        if state in TERMINAL:
            return state
        assert time.monotonic() < deadline, f"run {run_id} still {state or 'unknown'}"
        if time.monotonic() - reloaded > 30:
            page.reload()
            reloaded = time.monotonic()
        page.wait_for_timeout(2000)


@pytest.mark.skipif(not Path(CHROMIUM).exists() and not os.environ.get("CI"),
                    reason="Debian chromium not installed: run bin/setup (under CI, "
                           "which runs bin/setup, the test runs and fails instead)")
def test_browser_dry_run_and_plan_tab(live_airflow):
    """Log in, trigger a dry-run rollback through the DAG's trigger form, wait for it, and
    read the plan in the run's "Rollback plan" tab: the region table and the region graph."""
    from playwright.sync_api import expect, sync_playwright
    from reference_world import snapshot

    url, cfg, _ = live_airflow
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    before = snapshot(cfg)
    reason = f"browser test {time.strftime('%H:%M:%S')}"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        # narrower than the region graph's own width: it must shrink to fit the tab
        context = browser.new_context(viewport=VIEWPORT)
        context.set_default_timeout(UI_TIMEOUT_MS)
        expect.set_options(timeout=UI_TIMEOUT_MS)
        page = context.new_page()
        try:
            # 1. auth stays on: the DAG's page sends a stranger to the login form
            page.goto(f"{url}/dags/falkirk_reference_rollback")
            page.wait_for_url(re.compile(r"/auth/login\?next=.*falkirk_reference_rollback"))
            expect(page.get_by_role("button", name="Sign in")).to_be_visible()
            _shot(page, "01-login-redirect")
            page.get_by_label("Username").fill("admin")
            page.get_by_label("Password").fill(TEST_PASSWORD)
            page.get_by_role("button", name="Sign in").click()
            page.wait_for_url(f"{url}/dags/falkirk_reference_rollback")

            # 2. the rollback DAG (once parsed) and its trigger form
            _open_dag(page, url)
            expect(page.get_by_role("heading", name="falkirk_reference_rollback")).to_be_visible()
            _shot(page, "02-dag-page")
            page.get_by_role("button", name="Trigger Dag").click()
            form = page.get_by_role("dialog")
            expect(form.get_by_text("Run Parameters")).to_be_visible()
            trigger = form.get_by_role("button", name="Trigger", exact=True)
            expect(trigger).to_be_disabled()  # Regions and Reason are required

            def field(label: str):
                """The row of the form whose label starts with LABEL. (Airflow's Regions
                and Reason inputs are not tied to their labels, so get_by_label misses
                them.)"""
                return form.get_by_role("group").filter(
                    has=page.locator("label", has_text=re.compile(f"^{re.escape(label)}")))

            form.get_by_role("combobox", name="Pipeline").click()
            page.get_by_role("option", name="reference", exact=True).click()
            # Regions: a multi-select of the param's examples (not the textarea Airflow
            # gives an array param without them), offering every declared region
            regions = field("Regions")
            expect(regions.get_by_role("textbox")).to_have_count(0)
            regions.get_by_role("combobox").click()
            expect(page.get_by_role("option")).to_have_text(list(REGIONS))
            page.get_by_role("option", name="communities", exact=True).click()
            expect(regions).to_contain_text("communities")
            for other in (r for r in REGIONS if r != "communities"):
                expect(regions).not_to_contain_text(other)
            field("Reason").get_by_role("textbox").fill(reason)
            expect(form.get_by_role("checkbox", name="Dry run")).to_be_checked()  # default
            expect(field("Pipeline")).to_contain_text("reference")
            expect(trigger).to_be_enabled()
            _shot(page, "03-trigger-form", form)

            # 3. trigger: the UI opens the new run's page
            trigger.click()
            page.wait_for_url(re.compile(r"/dags/falkirk_reference_rollback/runs/[^/]+$"))
            run_id = urllib.parse.unquote(page.url.rsplit("/runs/", 1)[1])
            expect(page.get_by_role("heading", name=run_id, exact=True)).to_be_visible()
            _shot(page, "04-run-triggered")
            started = time.monotonic()
            state = _wait_for_run(page, run_id)
            print(f"run {run_id}: {state} after {time.monotonic() - started:.0f} s")
            _shot(page, "05-run-finished")
            assert state == "Success"

            # 4. the plan, in the run's "Rollback plan" tab (an iframe of the plan page)
            page.get_by_role("link", name="Rollback plan").click()
            page.wait_for_url(re.compile(r"/runs/[^/]+/plugin/falkirk-plan$"))
            plan = page.locator("iframe[title='Rollback plan']").content_frame
            table = plan.get_by_role("table")
            expect(table).to_be_visible()
            expect(plan.get_by_role("heading", name=re.compile(r"Rollback \w+ of reference")
                                    )).to_be_visible()
            expect(plan.get_by_text(f"failed: communities; reason: {reason} "
                                    "(dry run: nothing changed)")).to_be_visible()
            expect(table.get_by_role("row")).to_have_count(6)  # header + 5 regions
            expect(table.get_by_role("row").filter(has_text="communities").get_by_role("cell")
                   ).to_have_text(["communities", "lazy", "epoch 4 (converged)",
                                   "epoch 4 (converged)",
                                   "restarts from epoch 2 (converged), replays to its "
                                   "frontier for its state, reruns"])
            for region in ("ingest", "popularity", "serve", "stats"):
                expect(table.get_by_role("row").filter(has_text=region).get_by_role("cell")
                       .nth(3)).to_have_text("⊤ keeps its live state")
            graph = plan.locator("svg")
            expect(graph).to_be_visible()
            expect(graph).to_contain_text("pipeline reference: regions by regime")
            expect(graph).to_contain_text("epoch 4 (converged) → epoch 4 (converged)")
            for region in ("ingest", "popularity", "communities", "serve", "stats"):
                expect(graph.locator("text", has_text=re.compile(f"^{region}$"))
                       ).to_have_count(1)
            # the graph fits the tab (no horizontal scrolling) and is drawn legibly
            fit = graph.evaluate("svg => ({svg: svg.getBoundingClientRect().width, "
                                 "right: svg.getBoundingClientRect().right, "
                                 "viewport: document.documentElement.clientWidth, "
                                 "scroll: document.documentElement.scrollWidth})")
            print(f"region graph in the plan tab: {fit}")
            assert fit["svg"] <= fit["viewport"] and fit["right"] <= fit["viewport"], fit
            assert fit["scroll"] <= fit["viewport"], fit
            assert graph.bounding_box()["width"] <= fit["viewport"]
            drawn = graph.evaluate(GRAPH_PROBLEMS)  # 8 edges have a box at each end
            assert drawn["problems"] == [] and drawn["edges"] == 8, drawn
            _shot(page, "06-plan-tab")
            _shot(page, "07-plan-table", table)
            _shot(page, "08-region-graph", graph)
        except Exception:
            _shot(page, "failure")
            raise
        finally:
            expect.set_options(timeout=None)  # back to Playwright's default
            context.close()
            browser.close()
    assert snapshot(cfg) == before  # a dry run changes nothing


def test_a_killed_scheduler_is_respawned_and_stopped_with_the_rest(live_airflow):
    """The fault campaign SIGKILLs Airflow's scheduler and starts it again with
    ``bin/airflow respawn scheduler``: the new one runs in a session recorded under the
    home, heartbeats again, and ``bin/airflow stop`` ends it with the rest. (Last in this
    module: it stops the instance.)"""
    import signal
    from datetime import UTC, datetime

    import psutil

    from falkirk.runtime import procs
    from falkirk_dev.chaos_airflow import scheduler_processes

    url, _, env = live_airflow
    home = Path(env["FALKIRK_AIRFLOW_HOME"])
    bin_airflow = str(REPO_ROOT / "bin" / "airflow")
    refused = subprocess.run([bin_airflow, "respawn", "api-server"], env=env,
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "respawn: name the component" in refused.stderr
    old = scheduler_processes(home)
    assert old, "no scheduler found in the instance's session"
    for pid in old:
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
              for p in old) and time.monotonic() < deadline:
        time.sleep(0.2)
    killed_at = datetime.now(UTC)
    done = subprocess.run([bin_airflow, "respawn", "scheduler"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    session = int((home / "scheduler.pgid").read_text())
    new = scheduler_processes(home)
    assert new and not set(new) & set(old) and os.getsid(min(new)) == session, (old, new)
    beat = None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        status, body = _call(f"{url}/api/v2/monitor/health")
        latest = json.loads(body)["scheduler"].get("latest_scheduler_heartbeat") \
            if status == 200 else None
        if latest and datetime.fromisoformat(latest.replace("Z", "+00:00")) > killed_at:
            beat = latest
            break
        time.sleep(1)
    assert beat, f"the respawned scheduler never heartbeat (logs: {home}/logs/scheduler.log)"
    subprocess.run([bin_airflow, "stop"], env=env, check=True, timeout=180)
    assert procs.session_members(session) == [] and not (home / "scheduler.pgid").exists()
