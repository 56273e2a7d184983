"""The soak (CI's variant of ``falkirk soak``): short epochs under kills with garbage
collection running beside, figures per quarter, outputs equal to a failure-free run's."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest

from falkirk.log.epochlog import EpochRecord
from falkirk_dev import soak


def test_quarters_cover_every_epoch_once():
    assert soak.quarters(10) == [(0, 1), (2, 4), (5, 7), (8, 9)]
    assert [e for first, last in soak.quarters(2000) for e in range(first, last + 1)] == \
        list(range(2000))


def test_an_epochs_cost_is_its_pass_over_its_epochs_and_a_killed_pass_is_left_out():
    t = datetime(2026, 12, 7, tzinfo=UTC)
    rows = [EpochRecord("p", "a", e, 0, "running", recorded_at=t) for e in (0, 1, 2)]
    rows += [EpochRecord("p", "a", e, 0, "committed", recorded_at=t + timedelta(seconds=6))
             for e in (0, 1, 2)]
    rows += [EpochRecord("p", "a", 3, 0, "running", recorded_at=t + timedelta(seconds=7))]
    rows += [EpochRecord("p", "a", 3, 1, "running", recorded_at=t + timedelta(seconds=20)),
             EpochRecord("p", "a", 3, 1, "committed", recorded_at=t + timedelta(seconds=21))]
    run = SimpleNamespace(pipeline=SimpleNamespace(name="p"),
                          log=SimpleNamespace(records=lambda name: rows))
    assert soak.epoch_seconds_by_epoch(run) == {0: [2.0], 1: [2.0], 2: [2.0], 3: [1.0]}


def test_the_figures_of_each_quarter_come_from_its_samples_kills_and_epochs():
    samples = [{"epoch": e, "bytes": dict.fromkeys(soak.STORES, 100 * e), "rss_mb": 10.0 + e}
               for e in range(0, 8)]
    kills = [{"epoch": 1, "recovery_s": 3.0}, {"epoch": 6, "recovery_s": 5.0},
             {"epoch": 6, "recovery_s": None}]
    costs = {e: [float(e)] for e in range(8)}
    out = soak.summarise(8, samples, kills, costs)
    assert out["bytes_by_store"]["topics"] == [100, 300, 500, 700]  # at each quarter's end
    assert out["restore_s"] == [3.0, None, None, 5.0]
    assert out["epoch_s"] == [0.5, 2.5, 4.5, 6.5]
    assert out["rss_mb"] == [10.5, 12.5, 14.5, 16.5]


def test_the_targets_compare_the_last_quarter_with_the_second():
    """Issue 57: bytes ≤ 1.1× and restore and epoch times ≤ 1.2× the second quarter's,
    memory ≤ 1.1×; a quarter without a figure meets nothing; recoveries within 30 s."""
    result = {"bytes_by_store": {"tables": [5, 100, 150, 110], "topics": [1, 10, 12, 12]},
              "restore_s": [2.0, 4.0, 4.0, 4.9], "epoch_s": [1.0, 1.0, 1.0, 1.1],
              "rss_mb": [500.0, None, 600.0, 600.0], "recoveries_s": [3.0, 31.0, None, 30.0]}
    out = soak.against_targets(result)
    assert out["last_over_second"] == {"bytes_by_store": {"tables": 1.1, "topics": 1.2},
                                       "restore_s": 1.225, "epoch_s": 1.1, "rss_mb": None}
    assert out["met"] == {"bytes_by_store": {"tables": True, "topics": False},
                          "restore_s": False, "epoch_s": True, "rss_mb": False}
    assert (out["recovered_within_30s"], out["recoveries"]) == (2, 4)


@pytest.mark.slow
@pytest.mark.system
def test_a_short_soak_keeps_checkpoints_bounded_and_loses_nothing(tmp_path):
    """100 epochs of 1 s with a strike every 25: garbage collection ran beside the jobs
    (the watermarks kept incrementally, rebuilt only after rollbacks), the checkpoints
    stopped growing with the epochs once the first folds came, and the outputs equal the
    failure-free run's."""
    result = soak.soak(tmp_path, epochs=100, epoch_seconds=1.0, kill_every=25,
                       events_per_epoch=20, seed=3, say=print)
    summary = {k: result[k] for k in ("lost", "duplicated", "stuck", "outputs_differ")}
    assert summary == {"lost": 0, "duplicated": 0, "stuck": 0, "outputs_differ": []}, result
    assert result["kills"] >= 2, result["kills_by_target"]
    assert set(result) >= {"epochs", "epoch_seconds", "kills", "lost", "duplicated", "stuck",
                           "bytes_by_store", "restore_s", "epoch_s", "rss_mb"}
    assert all(len(v) == 4 for v in result["bytes_by_store"].values())
    assert all(len(result[k]) == 4 for k in ("restore_s", "epoch_s", "rss_mb"))
    assert result["watermarks_rebuilt"] <= result["rollbacks"] + 1
    checkpoints = result["bytes_by_store"]["checkpoints"]
    # folded every few epochs, their Delta logs cut to what the retained checkpoints
    # read: the last quarter's checkpoints about the second's (issue 57's measure; every
    # layer and commit kept grows them ~2x from the second quarter to the last, and so
    # did folds 20 s apart with the log kept: 1.5-1.6x in 60 epochs). In 60 epochs the
    # stores sometimes reached their level only in the third quarter (1.42x): 100 here
    assert checkpoints[3] <= 1.3 * checkpoints[1], checkpoints
    json.dumps(result)  # the figures are JSON
    assert "<svg" in soak.store_svg(result)


def test_a_folder_deleted_while_its_bytes_are_counted_is_passed_over(tmp_path):
    """A writer's _temporary folder goes while the soak counts a table's bytes: the count
    goes on without it (Path.rglob raised FileNotFoundError and ended a soak)."""
    import shutil

    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "f").write_bytes(b"x" * 10)
    (tmp_path / "b" / "_temporary").mkdir(parents=True)
    (tmp_path / "b" / "_temporary" / "g").write_bytes(b"y" * 5)
    (tmp_path / "c").write_bytes(b"z" * 3)

    def delete_the_other(p):  # the interleaving: in a's file, b goes; in b's, a does
        other = "b" if p.parent.name == "a" else "a" if p.parent.name == "_temporary" \
            else None
        if other:
            shutil.rmtree(tmp_path / other, ignore_errors=True)
        return False

    # whichever folder the walk lists first, the other is gone before it is entered
    assert soak.folder_bytes(tmp_path, skip=delete_the_other) in (13, 8)
    assert soak.folder_bytes(tmp_path / "gone") == 0
