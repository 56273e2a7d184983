"""A fresh engine's warm-up (falkirk.runtime.warmup): who gets one, and what it does."""

from __future__ import annotations

from dataclasses import replace

import pytest

from falkirk.config import ConfigError, load
from falkirk.runtime import engine, warmup


@pytest.fixture
def starts(monkeypatch, tmp_path):
    """engine.ensure with the server's start and the warm-up recorded, not run: a list of
    what happened, and whether the engine answers before the call."""
    happened: list[str] = []
    answers = {"now": False}
    monkeypatch.setattr(engine, "answering", lambda remote: answers["now"])
    monkeypatch.setattr(engine.LocalEngine, "start",
                        lambda self: happened.append("start") or self)
    monkeypatch.setattr(warmup, "warm",
                        lambda cfg, seconds, where: happened.append(f"warm {seconds:g}"))
    cfg = replace(load("local"), spark_remote="sc://127.0.0.1:1", local_engine=True,
                  engine_dir=str(tmp_path / "engine"), engine_warmup_s=7.0)
    return cfg, happened, answers


def test_an_engine_a_pipelines_start_starts_warms_up_first(starts):
    cfg, happened, _ = starts
    engine.ensure(cfg, warm=True)
    assert happened == ["start", "warm 7"]


def test_an_engine_a_recovery_starts_answers_at_once(starts):
    cfg, happened, _ = starts
    engine.ensure(cfg)  # a job's launch or the supervisor's restart: warm=False
    assert happened == ["start"]


def test_a_running_engine_is_not_warmed_again_and_zero_seconds_means_none(starts):
    cfg, happened, answers = starts
    engine.ensure(replace(cfg, engine_warmup_s=0.0), warm=True)
    assert happened == ["start"]
    answers["now"] = True
    engine.ensure(cfg, warm=True)
    assert happened == ["start"]  # nothing more: it runs, warm or in use


def test_a_warm_up_setting_that_is_not_a_number_is_refused_by_name(monkeypatch):
    monkeypatch.setenv("FALKIRK_ENGINE_WARMUP_S", "a minute")
    with pytest.raises(ConfigError, match="FALKIRK_ENGINE_WARMUP_S='a minute'.*not a number"):
        load("local")
    monkeypatch.setenv("FALKIRK_ENGINE_WARMUP_S", "12.5")
    assert load("local").engine_warmup_s == 12.5


@pytest.mark.slow
def test_a_warm_up_runs_epochs_through_the_jobs_paths_and_leaves_nothing(spark, tmp_path):
    """On the suite's engine: epochs written by the epoch writer and read back; its
    session released and its scratch table gone at the end. An epoch's output is the
    per (user, item) count of its events, ranked within each user from 1."""
    from pyspark.sql import functions as F

    out = warmup.warm(load(), 1.0, tmp_path)
    assert out["epochs"] >= 1 and out["first_epoch_s"] is not None
    assert not (tmp_path / "warmup").exists()
    rows = warmup.epoch_output(spark, 4).toArrow().to_pylist()
    pairs = {(i % warmup.USERS, i * 7 % warmup.ITEMS) for i in range(warmup.EVENTS_PER_EPOCH)}
    assert {(r["user"], r["item"]) for r in rows} == pairs and len(rows) == len(pairs)
    assert sum(r["events"] for r in rows) == warmup.EVENTS_PER_EPOCH
    assert {r["epoch"] for r in rows} == {4}
    by_user: dict[int, list[int]] = {}
    for r in rows:
        by_user.setdefault(r["user"], []).append(r["rank"])
    assert all(sorted(ranks) == list(range(1, len(ranks) + 1)) for ranks in by_user.values())
    assert warmup.events(spark, 0, 10).agg(F.count("*")).first()[0] == 10
