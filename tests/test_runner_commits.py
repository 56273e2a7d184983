"""An epoch's commits (Delta outputs, Kafka sends, checkpoints) run side by side: each
commit's fixed cost (Delta's log work, its small Spark jobs) overlaps the others'. Their
Spark jobs and seconds still go to their own phases, and one that fails fails the epoch
only once the others have ended."""

from __future__ import annotations

import threading

import pytest

from falkirk.io.spark import jobs_in_group
from falkirk.runtime.loop import JobRunner, name_spark_jobs


def runner_for(spark) -> JobRunner:
    """Only what the commits use: the session, the epoch's job group, the profile."""
    runner = JobRunner.__new__(JobRunner)
    runner.spark, runner.profile, runner.spark_jobs = spark, {}, {}
    runner._group = name_spark_jobs(spark, "tiny", {"agg", "report"}, 3, 1)
    runner._jobs_seen = jobs_in_group(spark, runner._group)
    runner._jobs_aside = 0
    return runner


@pytest.mark.slow
def test_an_epochs_commits_run_at_once_and_keep_their_phases(spark):
    """Forced interleaving: each commit waits at a barrier for the others, which only
    passes when all run at once (one after another, the first would wait alone and time
    out). Each commit's Spark jobs are counted in its phase and in the epoch's."""
    import time

    runner = runner_for(spark)
    together = threading.Barrier(3, timeout=30)

    def commit(rows: int):
        def run() -> None:
            together.wait()
            spark.range(rows).selectExpr("id % 3 AS k").groupBy("k").count().collect()
        return run

    t0 = time.monotonic()
    runner._side_by_side([("write agg", commit(10)), ("write report", commit(20)),
                          ("checkpoint agg", commit(30))], t0)
    assert {"write agg", "write report", "checkpoint agg"} <= set(runner.profile)
    jobs = {p: runner.spark_jobs[p] for p in ("write agg", "write report", "checkpoint agg")}
    assert all(n >= 1 for n in jobs.values()), jobs
    assert runner._jobs_aside == sum(jobs.values())
    assert jobs_in_group(spark, runner._group) == runner._jobs_seen  # none in the epoch's own
    assert runner.profile["commits side by side"] <= time.monotonic() - t0


@pytest.mark.slow
def test_a_failed_commit_fails_the_epoch_after_the_others_end(spark):
    """The failure is raised, but not before the other commits have ended: the job's
    exit must not leave a commit running behind it."""
    runner = runner_for(spark)
    ended = threading.Event()
    started = threading.Event()

    def fails() -> None:
        started.wait(30)
        raise RuntimeError("Delta refused the write")

    def slow() -> None:
        started.set()
        spark.range(1000).selectExpr("sum(id)").collect()
        threading.Event().wait(1.0)
        ended.set()

    with pytest.raises(RuntimeError, match="Delta refused the write"):
        runner._side_by_side([("write agg", fails), ("write report", slow)], 0.0)
    assert ended.is_set()


def test_commits_that_fail_while_the_next_epoch_is_prepared_beside_them_wait_for_it():
    """Forced interleaving: the next epoch's preparation (a job behind prepares it beside
    the commits: ``JobRunner._prepare_beside``) is held; the commits fail meanwhile. The
    failure is raised only once the preparation has ended, or the job would exit with a
    thread of its still running on its session. Without the wait the error came at
    once, the preparation still held."""
    from concurrent.futures import ThreadPoolExecutor

    preparing, release, failed = threading.Event(), threading.Event(), threading.Event()

    def prepare() -> None:
        preparing.set()
        release.wait(60)

    def commit() -> None:
        failed.set()
        raise RuntimeError("Delta refused the commit")

    raised: list[bool] = []  # whether the preparation had ended when the error came

    def epoch() -> None:
        try:
            JobRunner._while_preparing(beside, commit)
        except RuntimeError:
            raised.append(beside.done())

    with ThreadPoolExecutor(1) as pool:
        beside = pool.submit(prepare)
        assert preparing.wait(30)
        runs = threading.Thread(target=epoch)
        runs.start()
        assert failed.wait(30)
        runs.join(2.0)  # without the wait, the error is out by now
        assert runs.is_alive() and raised == []
        release.set()
        runs.join(30)
    assert raised == [True]
