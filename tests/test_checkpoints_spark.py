"""The jobs' checkpoint path: state kept in Spark, changes found and written as Parquet by
Spark and committed by delta-rs; restored in Spark, and read back by delta-rs as well."""

from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from test_checkpoints import STATE, VALUES, diff, states

from falkirk.io.lake import read_table
from falkirk.state.checkpoints import CheckpointError, CheckpointStore


def frame(spark, table: pa.Table):
    return spark.createDataFrame(table.to_pylist(), "key string, label long, size long, "
                                                    "updated double")


def rows(table: pa.Table) -> list[tuple]:
    return sorted(tuple(r.values()) for r in table.select(STATE.names).to_pylist())


def test_each_checkpoint_writes_only_what_changed_and_restores_exactly(spark, tmp_path):
    store = CheckpointStore(str(tmp_path / "state"), VALUES)
    previous, prev_table = None, None
    seq = states()
    for cid, table in seq:
        current = frame(spark, table)
        version = store.save_frame(cid, current, previous)
        changed, gone = diff(prev_table, table)
        written = read_table(store.uri, version).filter(pa.compute.equal(
            read_table(store.uri, version)["checkpoint"], cid))
        assert written.num_rows == changed.num_rows + len(gone), cid  # incremental
        assert sorted(written.filter(written["deleted"])["key"].to_pylist()) == sorted(gone)
        previous, prev_table = current, table
    assert store.checkpoints() == [cid for cid, _ in seq]
    for cid, table in seq:
        assert rows(store.restore_frame(spark, cid).toArrow()) == rows(table), cid
        assert rows(store.restore(cid)) == rows(table), cid  # delta-rs reads the same


def test_a_checkpoint_is_not_saved_twice_and_is_saved_again_after_truncation(spark, tmp_path):
    store = CheckpointStore(str(tmp_path / "state"), VALUES)
    (c0, s0), (c3, s3) = states()[:2]
    store.save_frame(c0, frame(spark, s0), None)
    store.save_frame(c3, frame(spark, s3), frame(spark, s0))
    with pytest.raises(CheckpointError, match="not after the latest one, 3"):
        store.save_frame(c3, frame(spark, s3), frame(spark, s0))  # a replayed epoch
    assert store.truncate_after(c0) == [c3]  # a rollback to 0 (a delta-rs commit)
    changed = s3.filter(pa.compute.not_equal(s3["key"], "k001"))
    # The same id again, with other state: Delta's txn marker went back with the manifest.
    store.save_frame(c3, frame(spark, changed), frame(spark, s0))
    assert rows(store.restore_frame(spark, c3).toArrow()) == rows(changed)
    assert store.checkpoints() == [c0, c3]


@pytest.mark.parametrize("keys, message", [(["a", "a"], "state key repeated: a"),
                                           ([None, "b"], "a state row has a null key")])
def test_a_state_with_bad_keys_commits_nothing_and_says_why(spark, tmp_path, keys, message):
    store = CheckpointStore(str(tmp_path / "state"), VALUES)
    bad = pa.table({"key": keys, "label": [1, 2], "size": [1, 2], "updated": [0.0, 1.0]},
                   schema=STATE)
    version = DeltaTable(store.uri).version()
    with pytest.raises(Exception, match=message):
        store.save_frame(0, frame(spark, bad), None)
    assert DeltaTable(store.uri).version() == version and store.checkpoints() == []


def test_a_state_without_the_declared_columns_is_refused(spark, tmp_path):
    store = CheckpointStore(str(tmp_path / "state"), VALUES)
    wrong = spark.createDataFrame([("a", 1)], "key string, label long")
    with pytest.raises(CheckpointError, match=r"missing \['size', 'updated'\]"):
        store.save_frame(0, wrong, None)


def test_a_restarted_job_reads_its_checkpoint_once(spark, tmp_path):
    """A job restarted from a checkpoint builds its state, and its next checkpoint's diff,
    from one read of the store: once restored, neither reads the store's files again.
    Uncut, each use read and ranked the store's rows anew (stats' first checkpoint after
    an engine's kill: 27 Spark stages against 14), a state of several parts once a part.
    The store's data files are deleted after the restore to show it."""
    from pathlib import Path
    from types import SimpleNamespace

    from falkirk.log.epochlog import EpochRecord, RegionLog
    from falkirk.model.times import DOMAINS
    from falkirk.runtime.loop import JobRunner

    store = CheckpointStore(str(tmp_path / "state"), VALUES)
    seq = states()
    (c0, s0), (c3, s3), (c9, s9) = seq[0], seq[1], seq[3]
    store.save_frame(c0, frame(spark, s0), None)
    store.save_frame(c3, frame(spark, s3), frame(spark, s0))

    runner = JobRunner.__new__(JobRunner)
    runner.spark, runner.done, runner.checkpoints = spark, {"agg": c3}, {"agg": store}
    runner.pipeline = SimpleNamespace(regions={"agg": SimpleNamespace(domain="epoch")})
    # a job whose state is the restored frame as is (no cut of its own)
    runner.logic = SimpleNamespace(state_from_frame=lambda region, df, session: df)
    runner.state, runner.state_frames = {}, {}
    entry = EpochRecord("tiny", "agg", c3, 0, "checkpointed", state_ref=f"checkpoint:{c3}")
    runner._restore_state("agg", RegionLog("agg", DOMAINS["epoch"], {c3: entry}))

    data = [p for p in Path(store.uri).rglob("*.parquet") if "_delta_log" not in p.parts]
    assert data
    for path in data:
        path.unlink()
    assert rows(runner.state["agg"].toArrow()) == rows(s3)
    store.save_frame(c9, frame(spark, s9), runner.state_frames["agg"])
    changed, gone = diff(s3, s9)  # the diff against the restored state: only what changed
    assert store.checkpoints() == [c0, c3, c9]
    import json

    from falkirk.io.lake import DeltaLogReader

    added = [a["add"] for a in DeltaLogReader(store.uri).commit(DeltaTable(store.uri).version())
             if "add" in a]
    assert sum(json.loads(a["stats"])["numRecords"] for a in added) == \
        changed.num_rows + len(gone)


def test_a_pass_saves_each_epochs_state_in_one_commit_as_saved_one_by_one(spark, tmp_path):
    """A pass of several epochs checkpoints the state as of each due epoch in one Spark
    write and one commit: each checkpoint writes exactly what a save of its own would (new
    and changed keys, tombstones of removed ones, a key back after an absence) and each
    restores exactly; a rollback can truncate to any of them."""
    seq = states()
    one = CheckpointStore(str(tmp_path / "one"), VALUES)
    previous = None
    for cid, table in seq:
        one.save_frame(cid, frame(spark, table), previous)
        previous = frame(spark, table)
    many = CheckpointStore(str(tmp_path / "many"), VALUES)
    (c0, s0), rest = seq[0], seq[1:]
    many.save_frame(c0, frame(spark, s0), None)
    version = many.save_frames([(cid, frame(spark, t)) for cid, t in rest], frame(spark, s0))
    assert {many.version_of(cid) for cid, _ in rest} == {version}  # one commit for all

    def written(store, cid):
        rows = read_table(store.uri)
        return sorted(tuple(r.values()) for r in rows.filter(
            pa.compute.equal(rows["checkpoint"], cid)).to_pylist())

    for cid, table in seq:
        assert written(many, cid) == written(one, cid), cid
        assert rows(many.restore_frame(spark, cid).toArrow()) == rows(table), cid
    assert many.truncate_after(rest[0][0]) == [cid for cid, _ in rest[1:]]
    assert rows(many.restore(rest[0][0])) == rows(rest[0][1])
