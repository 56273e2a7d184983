"""Warm standby drivers (falkirk.runtime.standby): how a starter hands a job to one.

These tests stand a plain process in for the standby's JVM: what they check is the
hand-over's bookkeeping (only warm standbys, one claimer each, dead ones forgotten, the
job findable where a rollback stops jobs). A real standby taking a killed job's place and
the outputs it commits are tested in tests/test_trials.py (its CI trial keeps one).
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from falkirk.config import load
from falkirk.model.topology import load_pipeline
from falkirk.runtime import procs, standby

JOB = "jobs/communities.py"


@pytest.fixture
def cfg(tmp_path):
    """A profile whose jobs are applications of their own (standbys keep their JVMs)."""
    return replace(load(), var_dir=str(tmp_path / "var"), lake=str(tmp_path / "lake"),
                   standby_drivers=1, spark_remote="")


@pytest.fixture
def pipeline():
    return load_pipeline("reference")


@pytest.fixture
def stand_in(pipeline, cfg):
    """A live process registered as a standby of ``pipeline``, as ``spawn`` registers one
    (not yet warm)."""
    proc = subprocess.Popen(["sleep", "300"], start_new_session=True)
    where = standby.folder(pipeline, cfg)
    where.mkdir(parents=True)
    (where / f"{proc.pid}.json").write_text(json.dumps(
        {"pid": proc.pid, "process_started": procs.process_started(proc.pid)}))
    yield proc
    proc.kill()
    proc.wait()


def warm(pipeline, cfg, proc) -> None:
    (standby.folder(pipeline, cfg) / f"{proc.pid}.ready").write_text("{}")


def test_only_a_warm_standby_takes_a_job_and_it_is_found_as_the_job(pipeline, cfg, stand_in):
    assert standby.hand_over(pipeline, JOB, ["--pipeline", "reference"], cfg) is None
    assert standby.warm(pipeline, cfg) == set()  # registered, still warming
    warm(pipeline, cfg, stand_in)
    assert standby.warm(pipeline, cfg) == {stand_in.pid}
    handle = standby.hand_over(pipeline, JOB, ["--pipeline", "reference"], cfg,
                               env={"FALKIRK_CRASH_AT": "writer:before-commit"})
    assert handle is not None and handle.pid == stand_in.pid and handle.poll() is None
    task = json.loads((standby.folder(pipeline, cfg) / f"{stand_in.pid}.job").read_text())
    assert task["job"] == str(pipeline.job_path(JOB))
    assert task["args"] == ["--pipeline", "reference"]
    assert task["env"] == {"FALKIRK_CRASH_AT": "writer:before-commit"}
    assert task["log"] == str(procs.log_file(pipeline, JOB, cfg))
    # a rollback stops the jobs hosting its regions: it finds the standby as this job
    [found] = procs.running(pipeline, cfg)
    assert (found["job"], found["pid"], found["regions"]) == (JOB, stand_in.pid,
                                                               ["communities"])
    assert standby.standbys(pipeline, cfg) == []  # claimed: a job now, not a standby
    assert standby.hand_over(pipeline, "jobs/serve.py", ["--pipeline", "reference"],
                             cfg) is None
    stand_in.kill()
    stand_in.wait()
    assert handle.poll() == -9  # killed: no end in the log of runs


def test_two_starters_never_share_a_standby(pipeline, cfg, stand_in, monkeypatch):
    """The interleaving forced: starter A lists the standby as ready, then starter B claims
    it, then A goes on with its stale list. A must not also hand it a job."""
    warm(pipeline, cfg, stand_in)
    listed = standby.standbys
    handed: dict[str, object] = {}

    def a_lists_then_b_claims(p, c=None):
        seen = listed(p, c)
        if "b" not in handed:  # A's listing (B's own goes straight through)
            handed["b"] = None
            handed["b"] = standby.hand_over(p, "jobs/serve.py", ["--pipeline", "b"], c)
        return seen

    monkeypatch.setattr(standby, "standbys", a_lists_then_b_claims)
    a = standby.hand_over(pipeline, JOB, ["--pipeline", "a"], cfg)
    assert handed["b"] is not None and handed["b"].pid == stand_in.pid
    assert a is None
    task = json.loads((standby.folder(pipeline, cfg) / f"{stand_in.pid}.job").read_text())
    assert task["args"] == ["--pipeline", "b"] and task["job"].endswith("serve.py")


def test_a_dead_standby_is_skipped_and_forgotten(pipeline, cfg, stand_in):
    warm(pipeline, cfg, stand_in)
    stand_in.kill()
    stand_in.wait()
    assert standby.standbys(pipeline, cfg) == []
    assert standby.hand_over(pipeline, JOB, ["--pipeline", "reference"], cfg) is None
    assert list(standby.folder(pipeline, cfg).iterdir()) == []


def test_stopping_the_standbys_leaves_the_jobs_they_took(pipeline, cfg, stand_in):
    other = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        where = standby.folder(pipeline, cfg)
        (where / f"{other.pid}.json").write_text(json.dumps(
            {"pid": other.pid, "process_started": procs.process_started(other.pid)}))
        warm(pipeline, cfg, stand_in)
        handle = standby.hand_over(pipeline, JOB, ["--pipeline", "reference"], cfg)
        assert handle is not None
        assert standby.stop_all(pipeline, cfg) == [other.pid]
        assert other.wait(timeout=30) is not None
        assert stand_in.poll() is None  # the job it took runs on
    finally:
        other.kill()
        other.wait()


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


def test_a_standby_starts_in_a_session_whose_autogroup_is_niced_too():
    """As spawn starts one: with autogroups, the threads' nice alone would not yield the
    CPU to the jobs, each in a session of its own (set_group_priority's docstring)."""
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True,
                            preexec_fn=procs.lower_priority)
    try:
        assert os.getpriority(os.PRIO_PROCESS, proc.pid) == procs.WARM_UP_NICE
        autogroup = Path(f"/proc/{proc.pid}/autogroup")
        assert not autogroup.exists() or autogroup.read_text().split()[-1] == str(
            procs.WARM_UP_NICE)
    finally:
        proc.kill()
        proc.wait()


def test_standby_drivers_are_refused_for_jobs_that_are_clients_of_an_engine(monkeypatch,
                                                                          tmp_path):
    """A standby keeps a driver JVM warm; a client of the engine has none to keep: asking
    for both is refused when the settings are read, naming the two and the way out."""
    from falkirk.config import ConfigError

    monkeypatch.setenv("FALKIRK_STANDBY_DRIVERS", "1")
    with pytest.raises(ConfigError, match="standby_drivers=1 .* clients of the engine .*"
                                          "FALKIRK_SPARK_REMOTE="):
        load("local")
    monkeypatch.setenv("FALKIRK_LOCAL_SPARK_REMOTE", "")
    assert load("local").standby_drivers == 1
    # a run that asks for standby drivers itself is refused the same way, before its
    # broker starts
    from falkirk.local.run import LocalRun

    monkeypatch.delenv("FALKIRK_STANDBY_DRIVERS")
    monkeypatch.setenv("FALKIRK_LOCAL_SPARK_REMOTE", "sc://127.0.0.1:1")
    root = tmp_path / "run"
    with pytest.raises(ConfigError, match=r"LocalRun\(standby=2\): standby_drivers=2"):
        LocalRun(root, "reference", standby=2).__enter__()
    assert not root.exists()
