"""A running job that a rollback moves back parks in its warm driver and resumes there
(falkirk.runtime.park), instead of being killed and started cold; and the rollback plans
only after the job acknowledged, so a row the job recorded late is in the plan."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import replace

import pytest
from tiny_pipeline import SCHEMA, TABLE_SCHEMA

from falkirk import faults
from falkirk.config import load
from falkirk.io.delta import EpochWriter
from falkirk.io.lake import read_table
from falkirk.log.epochlog import EpochLog, EpochRecord
from falkirk.model.topology import Pipeline
from falkirk.recovery.rollback import RollbackExecutor, RollbackRequest
from falkirk.runtime import park, procs
from falkirk.runtime.driver import JobDriver
from falkirk.runtime.job import EpochContext, EpochResult, JobLogic

#: ingest's epochs are logged (no job runs it here); mirror copies each epoch of t_in.
PIPE = Pipeline.from_dict({
    "pipeline": "parkway",
    "settings": {"epoch_seconds": 10, "origin_ms": 0},
    "regions": {"ingest": {"regime": "ephemeral", "job": "jobs/a.py"},
                "mirror": {"regime": "ephemeral", "job": "jobs/mirror.py"}},
    "edges": {"src": {"kind": "kafka", "to": "ingest", "topic": "src"},
              "t_in": {"kind": "delta", "from": "ingest", "to": "mirror", "table": "t_in"},
              "t_copy": {"kind": "delta", "from": "mirror", "table": "t_copy"}},
})
EPOCHS = 6


class Mirror(JobLogic):
    regions = ("mirror",)

    def process(self, ctx: EpochContext) -> EpochResult:
        rows = ctx.inputs["t_in"]
        return EpochResult(outputs={"t_copy": rows.filter(rows["epoch"] == ctx.epoch)})


@pytest.fixture
def lane(tmp_path, monkeypatch, spark):
    """ingest's epochs 0..5 in t_in and the log; the schemas where the pipeline finds them."""
    monkeypatch.chdir(tmp_path)
    tables = tmp_path / "schemas" / "tables"
    tables.mkdir(parents=True)
    for name in ("t_in", "t_copy"):
        (tables / f"{name}.json").write_text(json.dumps(TABLE_SCHEMA))
    cfg = replace(load(), lake=str(tmp_path / "lake"))
    log = EpochLog.from_config(cfg)
    w = EpochWriter(spark, cfg.table("t_in"), "ingest", 0, SCHEMA)
    w.ensure_table()
    for k in range(EPOCHS):
        w.write_epoch(spark.createDataFrame([(k, f"in{k}")], "epoch long, value string"), k)
    log.record(*(EpochRecord("parkway", "ingest", k, 0, "committed",
                             inputs={"src": {"from": {"0": k}, "to": {"0": k + 1}}},
                             outputs={"t_in": {"table": "t_in", "version": k + 1}})
                 for k in range(EPOCHS)))
    return cfg, log


@pytest.mark.slow
def test_a_row_recorded_after_the_fence_is_in_the_plan_and_the_job_resumes_warm(
        lane, tmp_path, monkeypatch, spark):
    """Forced interleaving: the job is held after its fence check of epoch 3, its t_copy
    commit made and its row not yet recorded; the rollback (mirror back to epoch 1) fences
    it then, and its stop releases the job, which records epoch 3 *after* the fence. The
    rollback plans only once the job acknowledged (``parked``): the late row is in the
    plan, invalidated, and its commit restored away. Then the job resumes in the same
    driver, in the new generation, and every epoch is in t_copy exactly once. (Planning
    without waiting for the acknowledgement leaves epoch 3 committed over the restored
    table: its rows are lost.)"""
    cfg, log = lane
    monkeypatch.setenv(faults.HOLD_ENV, "runner:fence-checked@4")  # epoch 3's
    monkeypatch.setenv(faults.HOLD_DIR_ENV, str(tmp_path))
    driver = JobDriver(PIPE, Mirror(), spark, cfg=cfg, watch_interval_s=0.2)
    result: dict = {}

    def drive() -> None:
        try:
            result["last"] = driver.run(until=EPOCHS - 1, poll_s=0.1)
        except BaseException as exc:  # the test thread reports it
            result["error"] = exc

    job = threading.Thread(target=drive)
    job.start()
    reached = faults.hold_file(tmp_path, "runner:fence-checked", "reached")
    for _ in range(1200):  # the hold is the sync point; this only bounds a broken run
        if reached.exists() or not job.is_alive():
            break
        job.join(0.1)
    assert reached.exists(), result

    me = {"job": "jobs/mirror.py", "pid": os.getpid(),
          "process_started": procs.process_started(os.getpid())}
    acknowledged: list[set[str]] = []

    def stop(regions: set[str]) -> None:  # what stop_regions(park_s=…) does, in-process
        assert regions == {"mirror"}
        faults.hold_file(tmp_path, "runner:fence-checked", "release").write_text("")
        acknowledged.append(park.wait_parked(log, "parkway", [me], timeout_s=60))

    plan = RollbackExecutor(PIPE, cfg, log, stop_regions=stop).run(RollbackRequest(
        "parkway", region="mirror", to_epoch=1, reason="test: park", dry_run=False))
    job.join(120)
    assert not job.is_alive() and "error" not in result, result
    assert acknowledged == [{"jobs/mirror.py"}]
    # the late row (epoch 3, generation 0) was in the log the plan was made from
    assert {(i["time"], i["generation"]) for i in plan.invalidate} >= {(2, 0), (3, 0)}
    assert plan.frontiers["mirror"] == 1 and plan.generation == 1
    assert result["last"] == EPOCHS - 1 and driver.parked == 1
    copied = sorted(read_table(cfg.table("t_copy")).column("epoch").to_pylist())
    assert copied == list(range(EPOCHS))  # none lost, none twice
    runs = [(r["status"], r["generation"]) for r in log.job_run_rows("parkway")]
    assert runs == [("started", 0), ("parked", 0), ("resumed", 1)]
    good = {(r.time, r.generation) for r in log.regions(PIPE)["mirror"].restorable("ephemeral")}
    assert good == {(0, 0), (1, 0), *((k, 1) for k in range(2, EPOCHS))}


def test_a_job_that_does_not_park_in_time_is_stopped(tmp_path, monkeypatch):
    """A running job that never acknowledges (no driver: a plain sleep here) is stopped
    after ``park_s`` and gets its ``stopped`` row, as without parking; a batch run of one
    epoch (``--epoch``) is not waited for at all."""
    monkeypatch.setenv("FALKIRK_VAR_DIR", str(tmp_path / "var"))
    cfg = replace(load(), lake=str(tmp_path / "lake"), var_dir=str(tmp_path / "var"))
    procs_started = []
    for job, args in (("jobs/mirror.py", []), ("jobs/a.py", ["--epoch", "3"])):
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", *args],
                             start_new_session=True)
        procs_started.append(p)
        procs.record_job_process(PIPE, job, p.pid, procs.process_started(p.pid),
                                 [sys.executable, job, *args], cfg)
    try:
        import time

        t0 = time.monotonic()
        stopped = procs.stop_regions(PIPE, {"mirror", "ingest"}, cfg, park_s=1.5)
        waited = time.monotonic() - t0
        assert sorted(stopped) == ["jobs/a.py", "jobs/mirror.py"]
        assert all(p.wait(5) is not None for p in procs_started)
        runs = EpochLog.from_config(cfg).job_runs("parkway")
        assert {j: r["status"] for j, r in runs.items()} == {"jobs/a.py": "stopped",
                                                            "jobs/mirror.py": "stopped"}
        assert waited >= 1.5  # the stream job was given its time to park
    finally:
        for p in procs_started:
            if p.poll() is None:
                p.kill()


def test_a_job_whose_driver_parked_is_left_running(tmp_path):
    """The acknowledgement comes from the job's Python driver, a child of the process
    spark-submit started (the JVM), which the job's process file names: a ``parked`` row
    from that process group counts, and the job is neither stopped nor returned."""
    cfg = replace(load(), lake=str(tmp_path / "lake"), var_dir=str(tmp_path / "var"))
    driver = (f"from falkirk.log.epochlog import EpochLog; "
              f"EpochLog({cfg.table('_falkirk_log')!r}).record_job_run("
              f"'parkway', 'jobs/mirror.py', ['mirror'], 0, 'parked'); "
              f"import time; time.sleep(600)")
    leader = subprocess.Popen(["sh", "-c", f'"{sys.executable}" -c "{driver}"; exit 0'],
                              start_new_session=True)
    try:
        procs.record_job_process(PIPE, "jobs/mirror.py", leader.pid,
                                 procs.process_started(leader.pid), ["spark-submit"], cfg)
        assert procs.stop_regions(PIPE, {"mirror"}, cfg, park_s=60) == []
        assert leader.poll() is None  # left running: it resumes by itself
        row = EpochLog.from_config(cfg).job_runs("parkway")["jobs/mirror.py"]
        assert row["status"] == "parked" and row["pid"] != leader.pid
    finally:
        os.killpg(leader.pid, 9)
        leader.wait(5)


@pytest.mark.slow
def test_a_job_whose_engine_dies_mid_epoch_exits_at_once_saying_why(lane, tmp_path):
    """Forced interleaving: a job's process, on an engine of its own, is held in the middle
    of an epoch (its output computed, its commit not made: ``writer:before-commit``), and
    the engine is SIGKILLed then. A call in flight there would only fail after its
    retries, and the epoch's cleanup calls after theirs (8-9 s under the fault campaign,
    the jobs dying seconds apart). The job's fence watch finds the engine gone and the
    process exits at once, still held, with ``ENGINE_LOST_EXIT`` and a ``failed`` row that
    says why; without the exit it would wait at the hold."""
    from falkirk.local.broker import free_port
    from falkirk.runtime.engine import LocalEngine

    cfg, log = lane
    engine = LocalEngine(tmp_path / "engine", port=free_port(), cfg=cfg).start()
    child = textwrap.dedent(f"""
        import sys
        sys.path[:0] = {sys.path!r}
        from falkirk.config import load
        from falkirk.runtime.launcher import session
        from falkirk.runtime.driver import JobDriver
        import test_park
        spark = session("engine-lost")
        JobDriver(test_park.PIPE, test_park.Mirror(), spark, watch_interval_s=0.2,
                  exit_on_engine_loss=True).run(until={EPOCHS - 1}, poll_s=0.1)
        """)
    env = {**os.environ, "PYTHONPATH": os.path.dirname(__file__),
           "FALKIRK_LOCAL_SPARK_REMOTE": engine.remote,
           "FALKIRK_LOCAL_ENGINE_DIR": str(tmp_path / "engine"),
           "FALKIRK_LOCAL_LAKE": cfg.lake, "FALKIRK_LAKE": cfg.lake,
           faults.HOLD_ENV: "writer:before-commit", faults.HOLD_DIR_ENV: str(tmp_path)}
    job = subprocess.Popen([sys.executable, "-c", child], env=env, cwd=tmp_path,
                           start_new_session=True)
    try:
        reached = faults.hold_file(tmp_path, "writer:before-commit", "reached")
        for _ in range(1200):  # the hold is the sync point; this only bounds a broken run
            if reached.exists() or job.poll() is not None:
                break
            time.sleep(0.1)
        assert reached.exists() and job.poll() is None, job.poll()
        engine.kill()
        code = job.wait(60)  # never released: only the watch's exit ends it
    finally:
        if job.poll() is None:
            os.killpg(job.pid, 9)
        engine.stop()
    assert code == park.ENGINE_LOST_EXIT
    row = log.job_runs("parkway")["jobs/mirror.py"]
    assert (row["status"], row["exit_code"]) == ("failed", park.ENGINE_LOST_EXIT), row
    assert "stopped answering" in row["message"], row
    assert [r.status for r in log.records("parkway") if r.region == "mirror"] == ["running"]
