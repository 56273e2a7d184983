"""Unit tests of the jobs' pure transforms on small data (run: pytest tests/)."""

from __future__ import annotations

from pathlib import Path

import pytest

from falkirk.job import load_job, session

JOBS = Path(__file__).resolve().parents[1] / "jobs"
ORIGIN, EPOCH_MS = 1_767_225_600_000, 10_000


@pytest.fixture(scope="module")
def spark():
    s = session("template-tests")
    yield s
    s.stop()


def test_clean_keeps_valid_clicks_and_dead_letters_the_rest(spark):
    clean = load_job(JOBS / "clean.py")
    cols = ("topic string, partition int, offset long, key string, timestamp long, "
            "value string, error string, user string, page string, ts long")
    t = ORIGIN + 12_000  # epoch 1
    raw = spark.createDataFrame([
        ("clicks", 0, 0, None, t, "{...}", None, "u1", "/home", t),
        ("clicks", 0, 1, None, t, "oops", "value is not JSON", None, None, None),
        ("clicks", 1, 0, None, t, "{...}", None, "u2", None, t),
        ("clicks", 1, 1, None, t, "{...}", None, "u3", "/docs", ORIGIN + 1),  # epoch 0
    ], cols)
    clicks, dead = clean.validate(raw, 1, ORIGIN, EPOCH_MS)
    assert [tuple(r) for r in clicks.collect()] == [(1, "u1", "/home", t)]
    assert sorted((r.partition, r.offset, r.reason) for r in dead.collect()) == [
        (0, 1, "value is not JSON"), (1, 0, "missing field page"),
        (1, 1, "event epoch 0 is not epoch 1")]


def test_user_totals_run_through_epochs(spark):
    totals_job = load_job(JOBS / "user_totals.py")
    clicks = spark.createDataFrame([(0, "u1"), (0, "u1"), (0, "u2"), (1, "u1")],
                                   "epoch long, user string")
    state = spark.createDataFrame([], "user string, total long")
    rows0, state = totals_job.transform(clicks, state, 0)
    rows1, state = totals_job.transform(clicks, state, 1)
    assert sorted(tuple(r) for r in rows0.collect()) == [(0, "u1", 2, 2), (0, "u2", 1, 1)]
    assert [tuple(r) for r in rows1.collect()] == [(1, "u1", 1, 3)]
    assert sorted(tuple(r) for r in state.collect()) == [("u1", 3), ("u2", 1)]
