"""The epoch log on real delta-rs tables: rows, generations, the live problem, concurrency."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import replace

import pytest
import yaml
from test_topology import SMALL, write_table_schemas

from falkirk.config import load
from falkirk.log.epochlog import EpochLog, EpochLogError, EpochRecord
from falkirk.model.topology import Pipeline
from falkirk.solver.frontier import solve

PIPE_DICT = {**SMALL, "edges": {k: v for k, v in SMALL["edges"].items() if k != "feedback"}}
PIPE = Pipeline.from_dict(PIPE_DICT)


def fill(log: EpochLog) -> None:
    rows = []
    for k in range(5):
        rows.append(EpochRecord("small", "ingest", k, 0, "committed",
                                inputs={"events": {"offsets": [{"0": 10 * k}, {"0": 10 * k + 10}]}},
                                delivered={"events": k},
                                outputs={"purchases": {"table": "purchases", "version": k + 1}}))
    for k in range(4):
        rows.append(EpochRecord("small", "popularity", k, 0, "committed",
                                delivered={"purchases": k}))
        rows.append(EpochRecord("small", "stats", k, 0, "committed", state_ref=f"v{k}"))
    rows.append(EpochRecord("small", "communities", [2, "inf"], 0, "checkpointed",
                            state_ref="ckpt-2"))
    rows.append(EpochRecord("small", "communities", [3, 1], 0, "running"))
    rows.append(EpochRecord("small", "communities", [4, 0], 0, "running"))
    log.record(*rows)
    log.record_collected("small", "purchases", 1)
    log.record_collected("small", "interactions", [0, "inf"])


def test_rows_round_trip_and_the_effective_log(tmp_path):
    log = EpochLog(str(tmp_path / "log"))
    fill(log)
    records = log.records("small")
    assert len(records) == 16
    assert records[0].inputs == {"events": {"offsets": [{"0": 0}, {"0": 10}]}}
    assert log.records("other") == []
    regions = log.regions(PIPE)
    assert [r.time for r in regions["ingest"].restorable("ephemeral")] == [0, 1, 2, 3, 4]
    assert [r.time for r in regions["communities"].restorable("lazy")] == [[2, "inf"]]
    assert regions["communities"].latest.time == [4, 0]
    assert log.collected("small")["purchases"] == (1, None)


def test_live_problem_from_the_log_gives_the_plan(tmp_path):
    log = EpochLog(str(tmp_path / "log"))
    fill(log)
    problem = log.problem(PIPE, failed={"communities"})
    plan = solve(problem).to_json()
    # communities restores its checkpoint (2, ∞); stats is fed through an unlogged edge
    # and had committed epoch 3, which communities at (2, ∞) may send differently.
    assert plan["frontiers"] == {"ingest": "top", "popularity": "top",
                                 "communities": [2, "inf"], "stats": 2}
    assert {"edge": "interactions", "from": "ingest", "to": "communities",
            "after": [2, "inf"], "through": "top"} in plan["replay"]
    assert {"region": "communities", "after": [2, "inf"], "through": [4, 0]} in plan["rerun"]
    # What garbage collection dropped is what ingest can no longer send again.
    assert problem.regions["ingest"].live.discarded == {
        "purchases": 1, "interactions": (0, float("inf"))}


def test_a_failed_lazy_region_goes_back_to_its_last_committed_epoch_by_replay(tmp_path):
    """Communities committed epochs 3 and 4 after its checkpoint at 2, then died in epoch
    5. Its input (interactions) is a table another job writes, so it can redo 3 and 4 from
    its checkpoint for the state only: its frontier is epoch 4 (the paper's replay of a
    deterministic processor's logged history), and stats, fed through an unlogged edge,
    stays where it is. Without replay (what garbage collection solves) it goes back to
    its checkpoint and takes stats back with it."""
    log = EpochLog(str(tmp_path / "log"))
    fill(log)
    log.record(*(EpochRecord("small", "communities", [k, "inf"], 0, "committed")
                 for k in (3, 4)),
               EpochRecord("small", "communities", [5, 0], 0, "running"))
    plan = solve(log.problem(PIPE, failed={"communities"})).to_json()
    assert plan["frontiers"]["communities"] == [4, "inf"]
    assert plan["frontiers"]["stats"] == "top"
    assert {"region": "communities", "after": [4, "inf"], "through": [5, 0]} in plan["rerun"]
    kept = solve(log.problem(PIPE, failed={"communities"}, replay=False)).to_json()
    assert kept["frontiers"]["communities"] == [2, "inf"] and kept["frontiers"]["stats"] == 2
    # an input of its own job (the feedback table) cannot be read again on its own
    looped = Pipeline.from_dict(SMALL)
    assert not looped.replays_inputs("communities") and PIPE.replays_inputs("communities")
    assert solve(log.problem(looped, failed={"communities"})).to_json()[
        "frontiers"]["communities"] == [2, "inf"]
    # epoch 3 not committed (its redo died): no replay reaches epoch 4 past it
    log.record(EpochRecord("small", "communities", [3, "inf"], 0, "running"))
    assert solve(log.problem(PIPE, failed={"communities"})).to_json()[
        "frontiers"]["communities"] == [2, "inf"]


def test_invalidated_epochs_drop_out_and_a_new_generation_counts(tmp_path):
    log = EpochLog(str(tmp_path / "log"))
    fill(log)
    log.record(EpochRecord("small", "stats", 3, 0, "invalidated", note="rollback to 2"))
    assert [r.time for r in log.regions(PIPE)["stats"].restorable("eager")] == [0, 1, 2]
    log.record(EpochRecord("small", "stats", 3, 1, "committed", state_ref="v3-g1"))
    stats = log.regions(PIPE)["stats"]
    assert [(r.time, r.generation) for r in stats.restorable("eager")] == [
        (0, 0), (1, 0), (2, 0), (3, 1)]
    assert log.generation("small") == 1


def test_unknown_failed_region_is_refused(tmp_path):
    with pytest.raises(EpochLogError, match=r"has no region\(s\) \['comunities'\]"):
        EpochLog(str(tmp_path / "log")).problem(PIPE, failed={"comunities"})


def test_falkirk_plan_without_a_problem_plans_from_the_live_log(tmp_path):
    lake = tmp_path / "lake"
    fill(EpochLog.from_config(replace(load(), lake=str(lake))))
    declaration = tmp_path / "small.yaml"
    declaration.write_text(yaml.safe_dump(PIPE_DICT))
    write_table_schemas(tmp_path, PIPE_DICT)  # and its jobs: a declaration names files
    run = subprocess.run(
        [sys.executable, "-m", "falkirk.cli", "plan", "--pipeline", str(declaration),
         "--failed", "communities", "--json"],
        capture_output=True, text=True, env={**os.environ, "FALKIRK_LAKE": str(lake)})
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["frontiers"] == {
        "ingest": "top", "popularity": "top", "communities": [2, "inf"], "stats": 2}


WRITER = textwrap.dedent("""
    import sys
    from falkirk.log.epochlog import EpochLog, EpochRecord
    log = EpochLog(sys.argv[1])
    for k in range(int(sys.argv[3])):
        log.record(EpochRecord("small", sys.argv[2], k, 0, "committed"))
""")


def test_two_processes_committing_at_once_lose_no_row(tmp_path):
    root = str(tmp_path / "log")
    EpochLog(root).record(EpochRecord("small", "ingest", 0, 0, "running"))  # the table exists
    n = 25
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, root, region, str(n)],
                              stderr=subprocess.PIPE, text=True)
             for region in ("popularity", "stats")]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    records = EpochLog(root).records("small")
    for region in ("popularity", "stats"):
        assert sorted(r.time for r in records if r.region == region) == list(range(n))


def test_a_declared_bound_is_kept_per_topic_and_a_later_one_moves_it_on(world):
    _, log, _, _ = world
    assert log.bounds("tiny") == {}
    log.record_bound("tiny", "src", {"0": 10, "1": 4})
    log.record_bound("other", "src", {"0": 1})
    log.record_bound("tiny", "src", {"0": 12, "1": 4})  # more input was added
    assert log.bounds("tiny") == {"src": {"0": 12, "1": 4}}
    assert log.bounds("other") == {"src": {"0": 1}}


def test_the_end_of_a_regions_input_is_kept_across_generations(world):
    """Receivers reading only Delta edges end once every sender's input ended: the end row
    says the last epoch, the latest end wins, and a rollback's new generation keeps it
    (the input is the same)."""
    _, log, _, _ = world
    assert log.ends("tiny") == {}
    log.record_end("tiny", ["ingest"], 5, 0)
    log.record_end("tiny", ["agg", "report"], 4, 1)
    assert log.ends("tiny") == {"ingest": 5, "agg": 4, "report": 4}
    log.record_end("tiny", ["ingest"], 3, 2)  # a shorter run does not move the end back
    assert log.ends("tiny")["ingest"] == 5


def test_a_clock_stepped_back_cannot_reorder_the_log(tmp_path):
    """Rows are read in the order they were appended (Delta versions), not by their
    wall-clock ``recorded_at``: an invalidation written after a clock step back (NTP, a
    VM resumed) still comes after the commit it invalidates."""
    from datetime import UTC, datetime, timedelta

    log = EpochLog(str(tmp_path / "log"))
    now = datetime.now(UTC)
    log.record(EpochRecord("small", "popularity", 0, 0, "committed", recorded_at=now))
    log.record(EpochRecord("small", "popularity", 1, 0, "committed", recorded_at=now))
    log.record(EpochRecord("small", "popularity", 1, 0, "invalidated", note="rollback r1",
                           recorded_at=now - timedelta(hours=1)))  # the clock went back
    assert [r.status for r in log.records("small")] == ["committed", "committed", "invalidated"]
    assert sorted(log.regions(PIPE)["popularity"].entries) == [0]
    log.record_rollback("small", "r2", 1, "started", {}, {})
    log.record_rollback("small", "r1", 1, "done", {}, {})
    assert [r["rollback_id"] for r in log.rollbacks("small")] == ["r2", "r1"]


def _files_opened(monkeypatch) -> list[str]:
    """The list every file a log reader opens from now on is added to."""
    from falkirk.io import lake

    opened: list[str] = []
    real = lake.ds.dataset

    def spy(files, **kwargs):
        opened.extend(files)
        return real(files, **kwargs)

    monkeypatch.setattr(lake.ds, "dataset", spy)
    return opened


def test_a_read_opens_only_the_files_added_since_the_last_one(tmp_path, monkeypatch):
    """Delta data files never change, so a reader keeps the rows of each file it read: a
    later read opens only the files appended since (the log is read every epoch by every
    job, and was read whole each time: 0.73 s of CPU a read at 700 appends).
    Files a restore (or compaction) took out of the table drop out of the reads."""
    from deltalake import DeltaTable

    opened = _files_opened(monkeypatch)
    log = EpochLog(str(tmp_path / "log"))
    for k in range(3):
        log.record(EpochRecord("small", "popularity", k, 0, "committed"))
    assert [r.time for r in log.records("small")] == [0, 1, 2]
    assert len(opened) == 3
    opened.clear()
    log.record(EpochRecord("small", "popularity", 3, 0, "committed"))
    log.record(EpochRecord("small", "popularity", 3, 0, "invalidated"))
    assert [(r.time, r.status) for r in log.records("small")] == [
        (0, "committed"), (1, "committed"), (2, "committed"), (3, "committed"),
        (3, "invalidated")]
    assert len(opened) == 2
    opened.clear()
    assert len(log.records("small")) == 5 and opened == []
    assert log.records("small") == EpochLog(str(tmp_path / "log")).records("small")

    DeltaTable(log.uri("epochs")).restore(1)  # the rows of versions 0 and 1 are left
    assert [r.time for r in log.records("small")] == [0, 1]
    assert log.records("small") == EpochLog(str(tmp_path / "log")).records("small")


def test_two_threads_never_read_one_table_of_the_log_at_once(tmp_path, monkeypatch):
    """A lease's renewing thread reads the log beside the rollback it guards. The kept rows
    are shared: a read that took the table's files, then paused while another read dropped
    the files a restore took away, would look for rows no longer kept. The fault point
    pauses the first read after it listed the files; the second must wait for it."""
    import threading

    from deltalake import DeltaTable

    from falkirk.io import lake

    log = EpochLog(str(tmp_path / "log"))
    for k in range(3):
        log.record(EpochRecord("small", "popularity", k, 0, "committed"))
    log.records("small")  # every file read and kept
    log.record(EpochRecord("small", "popularity", 3, 0, "committed"))
    paused, resume = threading.Event(), threading.Event()
    real = lake.ds.dataset

    def fault_point(files, **kwargs):  # the first read, reading the one new file
        if threading.current_thread().name == "first":
            paused.set()
            resume.wait()
        return real(files, **kwargs)

    monkeypatch.setattr(lake.ds, "dataset", fault_point)
    got: dict[str, object] = {}

    def read(name: str) -> None:
        try:
            got[name] = [r.time for r in log.records("small")]
        except Exception as e:  # noqa: BLE001 - the failure is what the test reports
            got[name] = e

    first = threading.Thread(target=read, args=("first",), name="first")
    first.start()
    assert paused.wait(30)
    DeltaTable(log.uri("epochs")).restore(1)  # versions 2 and 3 leave the table
    second = threading.Thread(target=read, args=("second",), name="second")
    second.start()
    second.join(timeout=2)
    overlapped = not second.is_alive()  # it read while the first was inside its read
    resume.set()
    first.join(30)
    second.join(30)
    assert not overlapped, got
    assert got == {"first": [0, 1, 2, 3], "second": [0, 1]}, got


def _rows(log: EpochLog) -> list[tuple]:
    return [(r.pipeline, r.region, r.epoch, r.status) for r in log.records("small")] + [
        (r.pipeline, r.region, r.epoch, r.status) for r in log.records("other")]


def test_a_compacted_log_table_keeps_its_rows_in_their_order_in_one_file(tmp_path, monkeypatch):
    """Each append adds a file, and a new reader (a restarted job, an Airflow task) opened
    them all: ~1 s a table at the hour's campaign's 700 appends, on every recovery's path.
    A compaction folds them into one file; every reader, new or kept, reads the same rows
    in the same order, and rows appended after it come after them (the compacted file
    takes the place of the version it read, not of its own commit)."""
    from falkirk.io import lake

    root = str(tmp_path / "log")
    log, kept = EpochLog(root), EpochLog(root)
    for k in range(6):  # two pipelines interleaved, an invalidation after its commit
        log.record(EpochRecord("small", "popularity", k, 0, "committed"),
                   EpochRecord("other", "stats", k, 0, "committed"))
    log.record(EpochRecord("small", "popularity", 5, 0, "invalidated"))
    log.record_rollback("small", "r1", 1, "started", {}, {})
    before = _rows(kept)
    assert log.compact(min_files=100) == {}  # too few files yet: nothing changes
    assert log.compact(min_files=3) == {"epochs": 7}  # rollbacks has one file: left
    opened = _files_opened(monkeypatch)
    commits: list[int] = []
    commit = lake.DeltaLogReader.commit

    def commit_read(self, version: int):
        commits.append(version)
        return commit(self, version)

    monkeypatch.setattr(lake.DeltaLogReader, "commit", commit_read)
    assert _rows(EpochLog(root)) == before  # a new reader: one file of epochs
    assert len(set(opened)) == 1
    assert set(commits) == {7}  # and one commit's file: the compaction's, not all eight
    assert _rows(kept) == before  # a kept reader drops the folded files, reads the new one
    log.record(EpochRecord("small", "popularity", 5, 1, "committed"))
    log.record(EpochRecord("other", "stats", 6, 0, "committed"))
    after = before[:7] + [("small", "popularity", 5, "committed")] + before[7:] + [
        ("other", "stats", 6, "committed")]
    assert _rows(EpochLog(root)) == _rows(kept) == after
    assert log.compact(min_files=3) == {"epochs": 3}  # the compacted file and two appends
    assert _rows(EpochLog(root)) == _rows(kept) == after


def test_a_compaction_deletes_the_files_earlier_ones_took_out_once_an_hour_old(
        tmp_path, monkeypatch):
    """The files a compaction folds stay on disk (a reader that listed them a moment ago
    still opens them) until a later compaction finds them taken out an hour or more
    before: then they are deleted, and only the live files are left. Every reader, new
    or kept, reads the same rows throughout."""
    from deltalake import DeltaTable

    from falkirk.io import lake

    root = str(tmp_path / "log")
    log, kept = EpochLog(root), EpochLog(root)
    for k in range(6):
        log.record(EpochRecord("small", "popularity", k, 0, "committed"))
    table_dir = tmp_path / "log" / "epochs"

    def on_disk() -> set[str]:
        return {p.name for p in table_dir.glob("*.parquet")}

    def live() -> set[str]:
        return {u.rsplit("/", 1)[-1] for u in DeltaTable(str(table_dir)).file_uris()}

    before = _rows(kept)
    assert log.compact(min_files=3) == {"epochs": 6}
    assert len(on_disk()) == 7 and len(live()) == 1  # taken out just now: kept
    log.record(EpochRecord("small", "popularity", 6, 0, "committed"))
    log.record(EpochRecord("small", "popularity", 7, 0, "committed"))
    monkeypatch.setattr(lake, "VACUUM_AFTER_HOURS", 0)  # as if an hour had passed
    assert log.compact(min_files=3) == {"epochs": 3}
    assert on_disk() == live() and len(live()) == 1
    after = before + [("small", "popularity", 6, "committed"),
                      ("small", "popularity", 7, "committed")]
    assert _rows(EpochLog(root)) == _rows(kept) == after
    log.record(EpochRecord("small", "popularity", 8, 0, "committed"))  # and appends go on
    assert _rows(EpochLog(root)) == _rows(kept) == after + [("small", "popularity", 8,
                                                              "committed")]


def test_an_append_during_a_compaction_is_neither_lost_nor_put_before_what_it_read(
        tmp_path, monkeypatch):
    """Forced interleaving: a compaction read the table, and before it commits the file
    that replaces what it read, a job appends an epoch. The append must survive the
    compaction's overwrite (which removes only the files it read) and still come after
    every row compacted; the compaction either commits or gives way, never loses a row."""
    import threading

    from falkirk.faults import HOLD_DIR_ENV, HOLD_ENV, hold_file

    root = str(tmp_path / "log")
    log = EpochLog(root)
    for k in range(4):
        log.record(EpochRecord("small", "popularity", k, 0, "committed"))
    before = _rows(EpochLog(root))
    point = "log:before-compaction-commit"
    monkeypatch.setenv(HOLD_ENV, point)
    monkeypatch.setenv(HOLD_DIR_ENV, str(tmp_path))
    compactor = EpochLog(root)
    folded: dict = {}
    thread = threading.Thread(target=lambda: folded.update(compactor.compact(min_files=3)))
    thread.start()
    reached = hold_file(tmp_path, point, "reached")
    for _ in range(600):
        if reached.exists():
            break
        thread.join(0.05)
    assert reached.exists(), "the compaction never reached its commit"
    EpochLog(root).record(EpochRecord("small", "popularity", 4, 0, "committed"))  # the job
    hold_file(tmp_path, point, "release").write_text("")
    thread.join(60)
    assert not thread.is_alive()
    after = before + [("small", "popularity", 4, "committed")]
    assert _rows(EpochLog(root)) == _rows(compactor) == after
    assert folded in ({"epochs": 4}, {})  # committed beside the append, or gave way


def test_a_compaction_drops_rows_no_rollback_can_need_and_replaced_collected_rows(tmp_path):
    """With garbage collection's reach back (a region -> its oldest epoch needed), a fold
    drops that region's ``epochs`` rows before it, and only those: other regions and
    pipelines keep every row, in their order. ``collected`` rows a later row of the same
    pipeline and edge replaced go too; what the log answers from them stays the same."""
    root = str(tmp_path / "log")
    log = EpochLog(root)
    for k in range(10):
        log.record(EpochRecord("small", "popularity", k, 0, "committed"),
                   EpochRecord("small", "stats", k, 0, "committed"),
                   EpochRecord("other", "popularity", k, 0, "committed"))
    for through in (1, 3, 5):
        log.record_collected("small", "purchases", through)
    log.record_collected("other", "purchases", 2)
    log.record_fold("small", "communities", 2)
    log.record_fold("small", "communities", 4)
    before = _rows(EpochLog(root))
    answers = (log.collected("small"), log.folds("small"), log.collected("other"))
    assert set(log.compact(min_files=3, keep_from={"small": {"popularity": 6}})) == {
        "epochs", "collected"}
    after = [r for r in before if not (r[0] == "small" and r[1] == "popularity" and r[2] < 6)]
    assert _rows(EpochLog(root)) == _rows(log) == after
    assert [r[2] for r in after if r[:2] == ("small", "popularity")] == [6, 7, 8, 9]
    assert len([r for r in after if r[:2] == ("small", "stats")]) == 10
    fresh = EpochLog(root)
    assert (fresh.collected("small"), fresh.folds("small"), fresh.collected("other")) == answers
    assert len(fresh._read("collected", "small")) == 2  # one row per edge and fold


def test_compactions_keep_the_tables_delta_log_about_one_compaction_long(tmp_path):
    """Each append leaves a commit file in the table's Delta log (Delta's own cleanup keeps
    them 30 days). A compaction checkpoints the log and deletes its files older than the
    previous compaction's checkpoint: the log stays bounded, and readers, new or kept from
    before both compactions, read every row in order."""
    from falkirk.io.lake import log_version

    root = str(tmp_path / "log")
    log, kept = EpochLog(root), EpochLog(root)
    log_dir = tmp_path / "log" / "epochs" / "_delta_log"

    def versions() -> list[int]:
        return sorted(v for p in log_dir.iterdir() if p.name.endswith(".json")
                      and (v := log_version(p.name)) is not None)

    for k in range(20):
        log.record(EpochRecord("small", "popularity", k, 0, "committed"))
    before = _rows(kept)
    assert log.compact(min_files=3) == {"epochs": 20}
    first = versions()
    assert first[0] == 0  # the first compaction has no earlier checkpoint to go back to
    checkpoint = max(log_version(p.name) for p in log_dir.glob("*.checkpoint.parquet"))
    for k in range(20, 40):
        log.record(EpochRecord("small", "popularity", k, 0, "committed"))
    assert log.compact(min_files=3) == {"epochs": 21}
    # what is left: from the first compaction's checkpoint on (its 20 appends' commits gone)
    assert versions() == list(range(checkpoint, versions()[-1] + 1)) and checkpoint == first[-1]
    rows = before + [("small", "popularity", k, "committed") for k in range(20, 40)]
    assert _rows(EpochLog(root)) == _rows(kept) == rows
