"""The Spark Connect engine every job is a client of (falkirk.runtime.engine): started once,
a killed job's calls on it interrupted when its session is released, and a write still in
flight there refused by Delta once a newer generation fenced its writer.

The interleavings are forced with a hold in the engine: a Python UDF of the write's
plan waits for a file the test makes, after telling the test (another file) that the
write is there and which Python worker runs it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from falkirk.config import load

pytestmark = pytest.mark.slow  # the engine


def hold(folder: Path):
    """A UDF that, in the engine's Python worker, writes its pid to ``folder/entered`` and
    waits until ``folder/go`` exists: the write whose plan uses it stops there."""
    from pyspark.sql import functions as F

    where = str(folder)

    def held(x):
        import os
        import time

        with open(os.path.join(where, "entered"), "w") as f:
            f.write(str(os.getpid()))
        while not os.path.exists(os.path.join(where, "go")):
            time.sleep(0.02)
        return x

    return F.udf(held, "long")


def wait_until(predicate, what: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def held_write(spark, uri: str, app_id: str, folder: Path):
    """A one-row Delta append of ``app_id`` (transaction version 0) that stops in the
    engine until ``folder/go``: (the thread running it, what it raised)."""
    from pyspark.sql import functions as F

    raised: list[BaseException] = []
    frame = spark.range(1).select(hold(folder)(F.col("id")).alias("id"))

    def write() -> None:
        try:
            (frame.write.format("delta").mode("append").option("txnAppId", app_id)
             .option("txnVersion", 0).save(uri))
        except BaseException as exc:  # noqa: BLE001 - the test looks at it
            raised.append(exc)

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    wait_until(lambda: (folder / "entered").exists(), "the write to reach the hold")
    return thread, raised


def test_jobs_are_clients_of_one_engine(spark):
    """The suite's sessions are Connect sessions on the local profile's engine, which
    answers where the config says; the engine reports itself running."""
    from falkirk.io.spark import is_remote, work_unit
    from falkirk.runtime.engine import status

    cfg = load()
    assert cfg.spark_remote and is_remote(spark)
    assert work_unit(spark) == "Spark stages"
    info = status(cfg)
    assert info["answering"] and info["remote"] == cfg.spark_remote
    assert spark.range(5).count() == 5


def test_a_write_in_flight_when_a_newer_generation_fences_it_does_not_commit(spark,
                                                                            tmp_path):
    """A write of generation 0 that began before the fence (it read its transaction
    version) fails at its commit: Delta sees the fence's transaction of its app id as a
    concurrent change. The same write of an app id not fenced commits: the fence is what
    refused it."""
    from deltalake import DeltaTable

    from falkirk.io.delta import FENCED, app_id_for, fence_older_generations

    uri = str(tmp_path / "table")
    spark.range(0).write.format("delta").save(uri)
    before = DeltaTable(uri).version()

    first = tmp_path / "fenced"
    first.mkdir()
    thread, raised = held_write(spark, uri, app_id_for("r", 0), first)
    assert fence_older_generations(uri, "r", 1) == [app_id_for("r", 0)]
    (first / "go").touch()
    thread.join(120)
    assert raised and "CONCURRENT" in str(raised[0]).upper(), raised
    assert DeltaTable(uri).version() == before + 1  # the fence only
    assert DeltaTable(uri).transaction_version(app_id_for("r", 0)) == FENCED
    assert DeltaTable(uri).to_pyarrow_table().num_rows == 0

    second = tmp_path / "not-fenced"
    second.mkdir()
    thread, raised = held_write(spark, uri, app_id_for("r", 1), second)
    (second / "go").touch()
    thread.join(120)
    assert not raised, raised
    assert DeltaTable(uri).to_pyarrow_table().num_rows == 1
    assert fence_older_generations(uri, "r", 1) == []  # generation 0 is fenced already


def test_a_killed_clients_call_is_interrupted_when_its_session_is_released(tmp_path):
    """A job killed in the middle of a write leaves the write running on the engine
    (Connect keeps an execution whose client went away). Releasing the job's session
    interrupts it: its task's Python worker is stopped, and the write never commits."""
    from deltalake import DeltaTable

    from falkirk.io.spark import SESSION_ENV, release_session
    from falkirk.runtime.launcher import session

    cfg = load()
    spark = session("killed-client-test")
    uri = str(tmp_path / "table")
    spark.range(0).write.format("delta").save(uri)
    spark.stop()
    folder = tmp_path / "hold"
    folder.mkdir()
    client = textwrap.dedent(f"""
        import sys
        sys.path[:0] = {sys.path!r}
        from falkirk.runtime.launcher import session
        from pyspark.sql import functions as F
        import test_engine
        spark = session("killed-client")
        frame = spark.range(1).select(
            test_engine.hold(__import__("pathlib").Path({str(folder)!r}))(F.col("id")).alias("id"))
        frame.write.format("delta").mode("append").save({uri!r})
        """)
    sid = "5e55ed00-0000-4000-8000-000000000001"
    proc = subprocess.Popen([sys.executable, "-c", client],
                            env={**os.environ, SESSION_ENV: sid,
                                 "PYTHONPATH": str(Path(__file__).parent)},
                            start_new_session=True)
    try:
        wait_until(lambda: (folder / "entered").exists() or proc.poll() is not None,
                   "the killed job's write to reach the hold")
        assert proc.poll() is None, "the client ended before its write was held"
        worker = int((folder / "entered").read_text())
        os.killpg(proc.pid, 9)
        proc.wait()
        assert release_session(cfg.spark_remote, sid)
        from falkirk.runtime.procs import alive

        wait_until(lambda: not alive(worker), "the held task's Python worker to stop")
    finally:
        (folder / "go").touch()
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
    assert DeltaTable(uri).version() == 0
    assert DeltaTable(uri).to_pyarrow_table().num_rows == 0


def test_a_job_waiting_for_input_learns_that_the_engine_is_gone(tmp_path):
    """A job that waits for its input makes no call that would find its session gone with
    a dead engine: its fence watch looks for the engine every second and, after a few
    looks without an answer, says it is lost (the runner then fails the job, for the
    supervisor to recover it)."""
    from falkirk.local.broker import free_port
    from falkirk.log.epochlog import EpochLog
    from falkirk.runtime.park import FenceWatch

    log = EpochLog(str(tmp_path / "lake" / "_falkirk"))
    watch = FenceWatch(log, "tiny", ["agg"], 0, spark=None, interval_s=0.05,
                       engine=f"sc://127.0.0.1:{free_port()}").start()
    try:
        wait_until(lambda: watch.engine_lost, "the watch to find the engine gone", 10)
    finally:
        watch.stop()
    assert watch.fenced is None


def test_a_job_whose_engine_was_started_again_learns_its_session_is_gone(tmp_path):
    """The engine died and another process serves on its port (someone's ensure started
    it again between two looks of a busy job's watch): the address answers again, but
    the job's session died with the old process. The fence watch compares the engine's
    recorded process with the one at its start and says the engine is lost at the first
    look that finds another, without waiting for looks without an answer."""
    import socket

    from falkirk.log.epochlog import EpochLog
    from falkirk.runtime.park import FenceWatch

    log = EpochLog(str(tmp_path / "lake" / "_falkirk"))
    with socket.socket() as listener:  # an engine that answers all along
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        process = [(111, 1.0)]
        watch = FenceWatch(log, "tiny", ["agg"], 0, spark=None, interval_s=0.05,
                           engine=f"sc://127.0.0.1:{listener.getsockname()[1]}",
                           engine_process=lambda: process[0]).start()
        try:
            time.sleep(0.3)
            assert not watch.engine_lost  # the same process: nothing lost
            process[0] = (222, 2.0)  # another engine process serves on the port
            wait_until(lambda: watch.engine_lost, "the watch to find the engine replaced", 5)
            assert watch._unanswered == 0
        finally:
            watch.stop()


def test_a_big_pass_runs_with_generated_code_and_the_session_gets_its_own_back(spark):
    """The engine interprets expressions (small epochs compiled new code each); a pass of
    ``Config.codegen_records`` records or more runs within ``generated_code``, which turns
    generated code on in the job's session and puts the session's own settings back
    after it."""
    from falkirk.io.spark import CODEGEN, generated_code

    before = {k: spark.conf.get(k, None) for k in CODEGEN}
    assert before["spark.sql.codegen.wholeStage"] == "false"  # the engine's default
    with generated_code(spark):
        assert {k: spark.conf.get(k) for k in CODEGEN} == CODEGEN
    assert {k: spark.conf.get(k, None) for k in CODEGEN} == before
