"""What docs/guide.md tells a new user, done with falkirk installed from its wheel and from
a folder outside the checkout: `falkirk jars`, `falkirk init`, its own unit tests,
`falkirk pipelines`, `falkirk run` on the embedded defaults, its DAGs in Airflow, a job
killed mid-epoch and rolled back with outputs equal to the failure-free run, malformed
records and rows the writer refused in its dead-letter table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from falkirk.config import REPO_ROOT
from falkirk.local.airflow import DAGS_FOLDER

pytestmark = [pytest.mark.slow, pytest.mark.system]  # Spark jobs and the broker

TABLES = ("clean_clicks", "page_counts", "user_totals", "clicks_dead_letters")


#: falkirk as a user has it (see ``installed``): its interpreter and environment.
USER: dict = {"python": sys.executable, "env": {}}


def falkirk(*args: str, env: dict | None = None, timeout: float = 900
            ) -> subprocess.CompletedProcess:
    return subprocess.run([USER["python"], "-m", "falkirk.cli", *args], capture_output=True,
                          text=True, timeout=timeout,
                          env={**os.environ, **USER["env"], **(env or {})})


@pytest.fixture(scope="module", autouse=True)
def as_user(installed):
    """Every command of this module runs falkirk as a user has it: installed from its
    wheel (tests/conftest.py's ``installed``)."""
    USER.update(python=installed["python"], env=installed["env"])
    yield
    USER.update(python=sys.executable, env={})


def rows(lake: Path) -> dict[str, list[str]]:
    from falkirk.io.lake import read_table

    return {t: sorted(json.dumps(r, sort_keys=True) for r in
                      read_table(str(lake / t)).to_pylist()) for t in TABLES}


@pytest.fixture(scope="module")
def clicks(tmp_path_factory):
    """`falkirk init` in a temporary folder outside the checkout, then `falkirk run`."""
    pipes = tmp_path_factory.mktemp("my_pipelines")
    folder = pipes / "clicks"
    done = falkirk("init", str(folder))
    assert done.returncode == 0, done.stderr
    assert "pipeline.yaml" in done.stdout and "next: falkirk run" in done.stdout
    assert not str(folder).startswith(str(REPO_ROOT))
    again = falkirk("init", str(folder))
    assert again.returncode == 2 and "exists and is not empty" in again.stderr
    run = falkirk("run", str(folder))
    assert run.returncode == 0, run.stdout + run.stderr
    return folder, run.stdout


def test_init_writes_a_pipeline_that_validates_and_whose_own_tests_pass(clicks):
    folder, _ = clicks
    listed = falkirk("pipelines", "--json", env={"FALKIRK_PIPELINES": str(folder.parent)})
    assert json.loads(listed.stdout)["clicks"]["error"] is None
    own = subprocess.run([USER["python"], "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          str(folder / "tests")], capture_output=True, text=True, timeout=600,
                         cwd=folder, env={**os.environ, **USER["env"]})
    assert own.returncode == 0, own.stdout[-3000:]
    assert "2 passed" in own.stdout


def test_run_commits_every_epoch_and_dead_letters_malformed_records(clicks):
    folder, out = clicks
    for region, regime in (("clean", "ephemeral"), ("page_counts", "batch"),
                           ("user_totals", "eager")):
        assert f"region {region:16} {regime:9} epochs committed: 4" in out, out
    got = rows(folder / ".falkirk" / "run" / "lake")
    reasons = sorted(json.loads(r)["reason"] for r in got["clicks_dead_letters"])
    assert len(reasons) == 3, reasons
    assert reasons[0].startswith("event epoch 1 is not epoch")  # the late click
    assert reasons[1] == "missing field page"
    assert reasons[2].startswith("value is not JSON")
    sent = sum(1 for line in (folder / "input" / "clicks.jsonl").read_text().splitlines()
               if line.strip())
    assert len(got["clean_clicks"]) + len(reasons) == sent
    # the line that is not JSON is named before anything runs (the others are JSON)
    assert f"{folder / 'input' / 'clicks.jsonl'}:66: not JSON (Expecting value): sent at " \
           "the previous line's time; the job dead-letters it" in out


def test_each_table_has_one_writing_engine(clicks):
    """Every commit of the epoch log's tables and of the data tables is delta-rs's (jobs,
    CLI and Airflow tasks append to the log; the jobs' writers commit the Parquet files
    Spark wrote): one writing engine per table."""
    lake = clicks[0] / ".falkirk" / "run" / "lake"

    def engines(table: Path) -> set[str]:
        infos = [json.loads(line)["commitInfo"] for f in (table / "_delta_log").glob("*.json")
                 for line in f.read_text().splitlines() if '"commitInfo"' in line]
        return {i.get("engineInfo", "?").split("/")[0].split(":")[0] for i in infos}

    log_tables = [t for t in (lake / "_falkirk_log").iterdir() if (t / "_delta_log").is_dir()]
    assert {"epochs", "job_runs", "bounds"} <= {t.name for t in log_tables}
    for table in log_tables:
        assert engines(table) == {"delta-rs"}, table.name
    for name in TABLES:
        assert engines(lake / name) == {"delta-rs"}, name


def test_a_failing_job_stops_the_run_at_once_naming_it(clicks, tmp_path):
    """Without a supervisor the other jobs would only wait for the dead one until their
    idle timeout: falkirk run stops them and names the job, its exit and its error."""
    import shutil

    folder, _ = clicks
    broken = tmp_path / "clicks"
    shutil.copytree(folder, broken, ignore=shutil.ignore_patterns(".falkirk"))
    job = broken / "jobs" / "user_totals.py"
    job.write_text(job.read_text().replace(
        "        rows, totals = transform(",
        "        raise ValueError('broken on purpose')\n        rows, totals = transform("))
    run = falkirk("run", str(broken))
    assert run.returncode == 2, run.stdout + run.stderr
    assert "job(s) failed, the others stopped: jobs/user_totals.py (exit" in run.stderr
    assert "broken on purpose" in run.stderr


def test_rows_a_job_let_through_with_a_null_in_a_non_nullable_column_are_dead_lettered(
        clicks, tmp_path):
    """The user's own job forgets a check: the click without a page reaches clean_clicks,
    whose page is declared non-nullable. The writer takes that row out, the rest of the
    epoch commits, and the row lands in the region's dead-letter table with the reason."""
    import shutil

    folder, _ = clicks
    golden = rows(folder / ".falkirk" / "run" / "lake")
    careless = tmp_path / "clicks"
    shutil.copytree(folder, careless, ignore=shutil.ignore_patterns(".falkirk"))
    job = careless / "jobs" / "clean.py"
    forgetful = job.read_text().replace("for name in FIELDS:", 'for name in ("user", "ts"):')
    assert forgetful != job.read_text()
    job.write_text(forgetful)
    run = falkirk("run", str(careless))
    assert run.returncode == 0, run.stdout + run.stderr
    got = rows(careless / ".falkirk" / "run" / "lake")
    assert {t: got[t] for t in TABLES if t != "clicks_dead_letters"} == {
        t: golden[t] for t in TABLES if t != "clicks_dead_letters"}
    letters = {json.loads(r)["reason"]: json.loads(r) for r in got["clicks_dead_letters"]}
    assert "missing field page" not in letters
    refused = letters["column 'page' is null, but table 'clean_clicks' declares it "
                      "non-nullable"]
    assert refused["source"] == "table clean_clicks" and refused["offset"] == -1
    assert json.loads(refused["raw"])["user"] and "page" not in json.loads(refused["raw"])
    assert len(letters) == 3


def test_a_job_killed_mid_epoch_and_rolled_back_ends_with_the_failure_free_outputs(
        clicks, tmp_path):
    from falkirk.faults import ENV, crash_at
    from falkirk.local.run import LocalRun

    folder, _ = clicks
    golden = rows(folder / ".falkirk" / "run" / "lake")
    with LocalRun(tmp_path / "run", folder / "pipeline.yaml") as run:
        run.produce_files(folder / "input")
        run.start(jobs=["jobs/clean.py", "jobs/page_counts.py"])
        plain = run.env
        # user_totals dies in epoch 3 before its Delta commit (its 4th table write)
        run.env = {**plain, ENV: crash_at("writer:before-commit", 4)}
        run.start(jobs=["jobs/user_totals.py"])
        run.env = plain
        # SIGKILL (spark-submit, a shell script, reports its child's as 128 + 9)
        assert run.procs["jobs/user_totals.py"].wait(timeout=900) in (-9, 137)
        rows_before = run.log.regions(run.pipeline)["user_totals"].entries.values()
        assert max(r.epoch for r in rows_before if r.status == "checkpointed") == 2, \
            [(r.epoch, r.status) for r in rows_before]
        done = run.rollback(failed=["user_totals"], reason="test: killed mid epoch 3")
        assert done.frontiers["user_totals"] == 2
        run.start(jobs=["jobs/user_totals.py"])
        codes = run.wait(timeout_s=900)
        assert set(codes.values()) == {0}, codes
        assert rows(Path(run.cfg.lake)) == golden
        # the guide's step 6: the suite and the invariants on every committed epoch
        checked = falkirk("validate", "--pipeline", str(folder / "pipeline.yaml"), "--no-docs",
                          env=run.env)
        assert checked.returncode == 0, checked.stdout[-2000:] + checked.stderr[-2000:]
        assert "no expectation suite for table(s) clean_clicks, clicks_dead_letters, " \
               "user_totals" in " ".join(checked.stdout.split())
        outcomes = run.log.checks("clicks")
        assert {"invariant:clicks_conserved", "invariant:totals_add_up"} <= {
            r["check"] for r in outcomes}
        assert all(r["success"] for r in outcomes)


def test_airflow_gets_the_new_pipelines_dags_with_nothing_copied(clicks, airflow_env,
                                                                 monkeypatch):
    from airflow.dag_processing.dagbag import DagBag

    folder, _ = clicks
    monkeypatch.setenv("FALKIRK_PIPELINES", str(folder.parent))
    bag = DagBag(dag_folder=str(DAGS_FOLDER))
    assert bag.import_errors == {}
    assert {"falkirk_clicks_streams", "falkirk_clicks_stream_checks",
            "falkirk_clicks_batch_page_counts", "falkirk_clicks_rollback",
            "falkirk_clicks_gc"} <= set(bag.dags)
    streams = bag.dags["falkirk_clicks_streams"]
    assert "`jobs/clean.py` (clean)" in streams.doc_md
    assert "`jobs/user_totals.py` (user_totals)" in streams.doc_md


def test_airflow_runs_the_new_pipeline_with_its_generated_dags(clicks, tmp_path):
    """The guide's step 4 with a live Airflow (bin/airflow: scheduler, API server, dag
    processor, LocalExecutor on SQLite): the pipeline folder is found through
    FALKIRK_PIPELINES with nothing copied; unpaused, its streams DAG starts and watches the
    stream jobs and its batch DAG runs page_counts once per epoch; every region commits
    every epoch and the tables equal the ones `falkirk run` made."""
    from falkirk.local.run import LocalRun
    from falkirk_dev.demo.airflow import AirflowAPI, _free_port_block

    folder, _ = clicks
    golden = rows(folder / ".falkirk" / "run" / "lake")
    home = tmp_path / "airflow"
    bin_airflow = str(REPO_ROOT / "bin" / "airflow")
    dags = ("falkirk_clicks_streams", "falkirk_clicks_batch_page_counts")
    with LocalRun(tmp_path / "run", folder / "pipeline.yaml") as run:
        run.produce_files(folder / "input")  # and the bound: the jobs end after epoch 3
        env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
        env.update(run.env, FALKIRK_AIRFLOW_HOME=str(home), FALKIRK_BATCH_EPOCHS="4",
                   FALKIRK_PIPELINES=str(folder.parent))
        port = _free_port_block()
        try:
            subprocess.run([bin_airflow, "start", "--port", str(port)], env=env, check=True,
                           timeout=300, capture_output=True)
            api = AirflowAPI(f"http://127.0.0.1:{port}", home)
            run.wait_for(lambda: all(api._request("GET", f"/api/v2/dags/{d}")[0] == 200
                                     for d in dags), timeout_s=300,
                         what="the dag processor to parse the generated DAGs")
            for dag_id in dags:
                api.pause(dag_id, False)

            def committed() -> dict[str, int]:
                return {r: sum(x.status in ("committed", "checkpointed")
                               for x in log.entries.values())
                        for r, log in run.log.regions(run.pipeline).items()}

            def batch_states() -> list[str]:
                return [r["state"] for r in api.runs("falkirk_clicks_batch_page_counts")]

            run.wait_for(lambda: set(committed().values()) == {4}, timeout_s=900,
                         what="every region's 4 epochs under Airflow")
            def batch_epochs() -> int:  # the epochs the runs covered (a run that
                # catches up covers every epoch ready when it was made)
                from datetime import datetime

                return sum(round((datetime.fromisoformat(r["data_interval_end"])
                                  - datetime.fromisoformat(r["data_interval_start"]))
                                 .total_seconds() / run.pipeline.settings["epoch_seconds"])
                           for r in api.runs("falkirk_clicks_batch_page_counts"))

            run.wait_for(lambda: (set(batch_states()) == {"success"} and batch_epochs() == 4)
                         or "failed" in batch_states(), timeout_s=300,
                         what="the batch runs of the 4 epochs to end")
            assert set(batch_states()) == {"success"} and batch_epochs() == 4, api.runs(
                "falkirk_clicks_batch_page_counts")
            assert api.runs("falkirk_clicks_streams"), "the streams DAG never ran"
        finally:
            subprocess.run([bin_airflow, "stop"], env=env, timeout=120, capture_output=True)
        assert rows(Path(run.cfg.lake)) == golden
