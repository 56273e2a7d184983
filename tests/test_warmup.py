"""A cold driver warms up on scratch data (falkirk.runtime.warmup): a standby before it
takes a job, and a job whose first epoch waits for its inputs. The warm-up ends early once
the real work can start, and leaves no scratch table behind, not even one of a driver that
died warming up."""

from __future__ import annotations

import os
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from falkirk.config import load
from falkirk.model.topology import Pipeline
from falkirk.runtime import procs, warmup
from falkirk.runtime.runner import JobRunner

# no Kafka edge: the warm-up's steps are its two Delta rounds
PIPE = Pipeline.from_dict({
    "pipeline": "warm",
    "settings": {"epoch_seconds": 10, "origin_ms": 0},
    "regions": {"a": {"regime": "ephemeral", "job": "jobs/a.py"},
                "b": {"regime": "eager", "job": "jobs/b.py"}},
    "edges": {"t": {"kind": "delta", "from": "a", "to": "b", "table": "t"}},
})


@pytest.fixture
def cold(monkeypatch):
    monkeypatch.setattr(warmup, "_warmed", False)


@pytest.mark.slow
def test_a_warm_up_told_to_stop_ends_before_its_next_step_and_leaves_no_scratch(
        spark, tmp_path, cold):
    cfg = replace(load(), lake=str(tmp_path / "lake"))
    root = Path(cfg.table(warmup.SCRATCH, PIPE.name))
    dead = subprocess.Popen(["true"], start_new_session=True)
    dead.wait()
    live = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        for pgid in (dead.pid, live.pid):  # scratch tables of two other drivers
            (root / str(pgid) / "_delta_log").mkdir(parents=True)
        asked = []

        def stop() -> bool:
            asked.append(len(asked))
            return len(asked) > 1  # the inputs are ready after the first step

        spent = warmup.warm_up(spark, PIPE, cfg, stop=stop)
        assert len(asked) == 2 and spent["stopped_early"] == 1.0 and spent["delta_s"] > 0
        assert not warmup.warmed()  # stopped early: a later driver's warm-up is not skipped
        assert not (root / str(os.getpgrp())).exists()  # its own scratch table removed
        assert not (root / str(dead.pid)).exists()  # a dead driver's removed
        assert (root / str(live.pid)).exists()  # a live one's kept: it may be warming up
    finally:
        live.kill()
        live.wait()


@pytest.mark.slow
def test_a_whole_warm_up_marks_the_driver_warm(spark, tmp_path, cold):
    cfg = replace(load(), lake=str(tmp_path / "lake"))
    spent = warmup.warm_up(spark, PIPE, cfg)
    assert spent["stopped_early"] == 0.0 and spent["delta_s"] > 0 and warmup.warmed()
    assert list(Path(cfg.table(warmup.SCRATCH, PIPE.name)).glob("*")) == []


def scripted_runner(readiness: list, **cfg_changes) -> JobRunner:
    """A runner whose inputs' readiness follows ``readiness`` (False: not yet, None: the
    input ended), one value per look; nothing else of a runner is needed to wait."""
    runner = JobRunner.__new__(JobRunner)
    runner.pipeline, runner.regions, runner.spark = PIPE, ["b"], None
    runner.cfg = replace(load(), **cfg_changes)
    runner.persist, runner.timings, runner._warm_up_tried = True, [], False
    runner.done = {"b": -1}
    runner.looks = []

    def ready(e: int):
        runner.looks.append(e)
        return readiness.pop(0)

    runner._ready = ready
    runner._record_end = lambda through: None
    return runner


def test_a_cold_runner_warms_up_once_while_its_first_epoch_waits(monkeypatch, cold):
    calls = []

    def warm_up(spark, pipeline, cfg, stop, yielding):
        assert yielding  # at a low priority: the regions it waits for keep the CPU
        calls.append(stop())  # the warm-up asks whether epoch 0's inputs are ready
        return {"kafka_s": 0.0, "delta_s": 1.0, "stopped_early": 0.0}

    monkeypatch.setattr(warmup, "warm_up", warm_up)
    runner = scripted_runner([False, False, False, False, None])
    assert runner.run(poll_s=0) == -1
    assert calls == [False]  # once, though the epoch waited on after it
    assert runner.looks == [0] * 5


@pytest.mark.parametrize("why", ["epoch done", "driver warm", "setting off"])
def test_no_warm_up_after_an_epoch_in_a_warm_driver_or_when_set_off(monkeypatch, cold, why):
    monkeypatch.setattr(warmup, "warm_up", lambda *a, **k: pytest.fail("warmed up"))
    runner = scripted_runner([False, None],
                             warm_up_while_waiting=why != "setting off")
    if why == "epoch done":
        runner.timings = [(0, 1.0, 0.0, {})]
    if why == "driver warm":
        monkeypatch.setattr(warmup, "_warmed", True)
    assert runner.run(poll_s=0) == -1 and runner.looks == [0, 0]


def test_a_yielding_warm_up_lowers_its_sessions_priority_and_then_restores_it(
        tmp_path, cold, monkeypatch, caplog):
    cfg = replace(load(), lake=str(tmp_path / "lake"))
    set_to = []
    monkeypatch.setattr(procs, "set_group_priority", lambda pgid, nice: set_to.append(
        (pgid, nice)))
    monkeypatch.setattr(procs, "may_lower_priority", lambda: True)
    before = os.getpriority(os.PRIO_PROCESS, 0)
    me = os.getpgrp()
    monkeypatch.setattr(os, "getsid", lambda pid: me)  # a job in a session of its own
    warmup.warm_up(None, PIPE, cfg, stop=lambda: True, yielding=True)
    assert set_to == [(me, max(before, procs.WARM_UP_NICE)), (me, before)]
    set_to.clear()
    monkeypatch.setattr(os, "getsid", lambda pid: me + 1)  # e.g. an Airflow task's group
    warmup.warm_up(None, PIPE, cfg, stop=lambda: True, yielding=True)
    assert set_to == []
    assert "warm-up failed" not in caplog.text  # told to stop before any step: none ran


def test_a_groups_priority_is_set_for_its_threads_and_its_sessions_autogroup():
    job = subprocess.Popen(["sleep", "60"], start_new_session=True)  # as start_job starts one
    try:
        procs.set_group_priority(job.pid, 10)
        assert os.getpriority(os.PRIO_PROCESS, job.pid) == 10
        autogroup = Path(f"/proc/{job.pid}/autogroup")
        if autogroup.exists():  # a kernel with autogroups: the session's share of the CPU
            assert autogroup.read_text().split()[-1] == "10"
        if procs.may_lower_priority():  # allowed to raise it again
            procs.set_group_priority(job.pid, 0)
            assert os.getpriority(os.PRIO_PROCESS, job.pid) == 0
            assert not autogroup.exists() or autogroup.read_text().split()[-1] == "0"
    finally:
        job.kill()
        job.wait()
