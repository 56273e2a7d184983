"""The exactly-once Delta layer: real Spark writes, real delta-rs commits, in tmp_path tables."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from delta_writer_worker import SCHEMA, epoch_frame
from deltalake import DeltaTable

from falkirk.delta import (
    EpochWriter,
    StagedEpoch,
    app_id_for,
    parquet_stats,
    read_added,
    read_version,
    register_source,
    rollback_table,
    vacuum_orphans,
)

ROWS = 1000  # per epoch
WORKER = Path(__file__).with_name("delta_writer_worker.py")
STAGING = re.compile(r"^e\d{8}-g\d+-[0-9a-f]{8}$")


def expected_ids(epochs) -> list[int]:
    return sorted(i for e in epochs for i in range(e * ROWS, (e + 1) * ROWS))


def table_ids(spark, uri: str, version: int | None = None) -> list[int]:
    return sorted(r.id for r in read_version(spark, uri, version).select("id").collect())


def write_epochs(spark, writer: EpochWriter, epochs) -> dict[int, int]:
    """Epoch -> committed table version."""
    versions = {}
    for epoch in epochs:
        result = writer.write_epoch(epoch_frame(spark, epoch, ROWS), epoch)
        assert result is not None
        versions[epoch] = result.version
    return versions


def referenced_files(uri: str) -> set[str]:
    """Every data file any version in the log added."""
    files: set[str] = set()
    for name in os.listdir(os.path.join(uri, "_delta_log")):
        if name.endswith(".json"):
            with open(os.path.join(uri, "_delta_log", name)) as log:
                for line in log:
                    action = json.loads(line)
                    if "add" in action:
                        files.add(action["add"]["path"])
    return files


# -- no Spark ----------------------------------------------------------------------------------


def test_parquet_stats_from_footer(tmp_path):
    ts = [
        dt.datetime(2024, 1, 1, 0, 0, 0, 1500, tzinfo=dt.UTC),
        None,
        dt.datetime(2023, 5, 5, tzinfo=dt.UTC),
    ]
    table = pa.table(
        {
            "id": pa.array([3, None, 1], pa.int64()),
            "name": pa.array(["b", "a", None]),
            "long": pa.array(["x" * 40, "y" * 40, None]),
            "ts": pa.array(ts, pa.timestamp("us", tz="UTC")),
            "flag": pa.array([True, False, None]),
            "nothing": pa.array([None, None, None], pa.float64()),
        }
    )
    path = tmp_path / "f.parquet"
    pq.write_table(table, path, row_group_size=2)  # two row groups to merge
    stats = parquet_stats(pq.read_metadata(path))
    assert stats["numRecords"] == 3
    # Strings over 32 characters get no bounds (a safe max would need Delta's tie-breaker).
    assert stats["minValues"] == {"id": 1, "name": "a", "ts": "2023-05-05T00:00:00.000Z"}
    # The max timestamp (1.5 ms) is rounded up to whole milliseconds so the bound still holds.
    assert stats["maxValues"] == {"id": 3, "name": "b", "ts": "2024-01-01T00:00:00.002Z"}
    assert stats["nullCount"] == {"id": 1, "name": 1, "long": 1, "ts": 1, "flag": 1, "nothing": 3}


def test_racing_writers_of_one_app_id_commit_an_epoch_once(tmp_path, monkeypatch):
    """The marker check and the commit read one snapshot: delta-rs rejects the late commit."""
    uri = str(tmp_path / "out")
    first = EpochWriter(uri, "agg", 1, SCHEMA)
    first.ensure_table()
    late = EpochWriter(uri, "agg", 1, SCHEMA)
    stale = late.ensure_table()  # checked the marker before `first` committed
    tried: list[int] = []
    commit_stale = stale.create_write_transaction

    def spy(*args, **kwargs):
        tried.append(stale.version())
        return commit_stale(*args, **kwargs)

    monkeypatch.setattr(stale, "create_write_transaction", spy)
    fresh = late._fresh_table
    calls = iter([lambda: stale])
    monkeypatch.setattr(late, "_fresh_table", lambda: next(calls, fresh)())

    def staged(name: str) -> StagedEpoch:
        return StagedEpoch(epoch=0, staging=name, actions=[], rows=0, bytes=0)

    assert first.commit(staged("e00000000-g1-aaaaaaaa")) is not None
    # CommitFailedError, reload, epoch done by another attempt: skipped.
    assert late.commit(staged("e00000000-g1-bbbbbbbb")) is None
    assert tried == [0]  # it did try to commit from the stale snapshot
    assert DeltaTable(uri).version() == 1


# -- Spark -------------------------------------------------------------------------------------


@pytest.mark.slow
def test_write_epochs_and_read_back(spark, tmp_path):
    uri = str(tmp_path / "out")
    writer = EpochWriter(uri, "agg", 1, SCHEMA)
    writer.ensure_table()
    assert DeltaTable(uri).version() == 0
    versions = write_epochs(spark, writer, range(5))
    assert list(versions.values()) == [1, 2, 3, 4, 5]

    table = DeltaTable(uri)
    assert table.transaction_version(app_id_for("agg", 1)) == 4
    assert table.metadata().configuration["delta.enableDeletionVectors"] == "false"
    assert table.protocol().reader_features is None  # no deletion vectors, no column mapping
    assert table.count() == 5 * ROWS  # real stats: delta-rs counts from them
    adds = pa.table(table.get_add_actions(flatten=True)).to_pydict()  # arro3 -> pyarrow
    for path in adds["path"]:
        folder, name = path.split("/")
        assert STAGING.match(folder) and name.startswith("part-") and name.endswith(".parquet")
    assert min(adds["min.id"]) == 0 and max(adds["max.id"]) == 5 * ROWS - 1

    assert table_ids(spark, uri) == expected_ids(range(5))
    assert table_ids(spark, uri, versions[2]) == expected_ids(range(3))
    empty = read_version(spark, uri, 0)
    assert empty.count() == 0 and empty.schema.fieldNames() == SCHEMA.names
    row = read_version(spark, uri).where("id = 1001").collect()[0]
    assert (row.epoch, row.name, row.score) == (1, "row-1001", 1001 / 7.0)
    assert row.ts == dt.datetime(1970, 1, 1) + dt.timedelta(minutes=1001)  # UTC session


def test_a_lake_folder_with_a_space_reads_back(spark, tmp_path):
    """delta-rs percent-encodes local file URIs (a%20b): both readers must undo that."""
    from falkirk.lake import read_table

    uri = str(tmp_path / "four regimes" / "out")
    writer = EpochWriter(uri, "agg", 1, SCHEMA)
    writer.ensure_table()
    versions = write_epochs(spark, writer, range(2))
    assert "%20" in DeltaTable(uri).file_uris()[0]
    assert sorted(read_table(uri).column("id").to_pylist()) == expected_ids(range(2))
    assert table_ids(spark, uri, versions[1]) == expected_ids(range(2))


@pytest.mark.slow
def test_replayed_epoch_is_skipped_in_same_generation(spark, tmp_path):
    uri = str(tmp_path / "out")
    writer = EpochWriter(uri, "agg", 1, SCHEMA)
    writer.ensure_table()
    write_epochs(spark, writer, range(3))
    version = DeltaTable(uri).version()
    # A replay (Spark re-running the last batch after a crash), also from a fresh writer.
    assert writer.write_epoch(epoch_frame(spark, 2, ROWS), 2) is None
    assert EpochWriter(uri, "agg", 1, SCHEMA).write_epoch(epoch_frame(spark, 1, ROWS), 1) is None
    assert DeltaTable(uri).version() == version
    assert table_ids(spark, uri) == expected_ids(range(3))


@pytest.mark.slow
def test_empty_epoch_commits_only_the_transaction(spark, tmp_path):
    uri = str(tmp_path / "out")
    writer = EpochWriter(uri, "agg", 1, SCHEMA)
    writer.ensure_table()
    result = writer.write_epoch(epoch_frame(spark, 0, ROWS).limit(0), 0)
    assert result is not None and (result.version, result.files, result.rows) == (1, 0, 0)
    table = DeltaTable(uri)
    assert table.transaction_version(writer.app_id) == 0 and table.file_uris() == []
    assert read_version(spark, uri).count() == 0


def run_worker(uri: str, generation: int, first: int, last: int, crash_at: int | None = None):
    env = dict(os.environ)
    env.pop("FALKIRK_CRASH_BEFORE_COMMIT", None)
    if crash_at is not None:
        env["FALKIRK_CRASH_BEFORE_COMMIT"] = str(crash_at)
    proc = subprocess.run(
        [
            sys.executable,
            str(WORKER),
            uri,
            "agg",
            str(generation),
            str(first),
            str(last),
            str(ROWS),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return proc, lines


@pytest.mark.slow
def test_kill_between_files_and_commit(spark, tmp_path):
    uri = str(tmp_path / "out")
    proc, lines = run_worker(uri, 1, 0, 4, crash_at=3)
    assert proc.returncode == -9, proc.stderr[-2000:]
    assert [line["epoch"] for line in lines[:3]] == [0, 1, 2]
    orphan = lines[3]["staging"]
    orphan_files = [f for f in os.listdir(os.path.join(uri, orphan)) if f.endswith(".parquet")]
    assert orphan_files, "the Parquet files were written before the kill"
    # Nothing of epoch 3 is visible: the files were never committed.
    assert table_ids(spark, uri) == expected_ids(range(3))
    assert DeltaTable(uri).transaction_version(app_id_for("agg", 1)) == 2

    # The restarted run replays every epoch: the committed ones are skipped.
    proc, lines = run_worker(uri, 1, 0, 4)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [line["version"] is None for line in lines] == [True, True, True, False, False]
    assert table_ids(spark, uri) == expected_ids(range(5))  # no duplicates, no loss

    referenced = referenced_files(uri)
    assert not any(path.startswith(orphan + "/") for path in referenced)
    # A kill during Spark's write leaves a _temporary folder inside the staging folder: it is
    # not hidden from vacuum (only top-level _ and . folders are).
    partial = os.path.join(uri, "e00000009-g1-0badc0de", "_temporary", "0")
    os.makedirs(partial)
    pq.write_table(pa.table({"id": [1]}), os.path.join(partial, "part-00000.parquet"))
    removed = vacuum_orphans(uri, retention_hours=0)
    assert {f"{orphan}/{name}" for name in orphan_files} <= set(removed)
    assert "e00000009-g1-0badc0de/_temporary/0/part-00000.parquet" in removed
    assert not os.path.exists(os.path.join(uri, "e00000009-g1-0badc0de"))
    assert not set(removed) & referenced  # only files no version ever referenced
    assert not os.path.exists(os.path.join(uri, orphan))
    assert table_ids(spark, uri) == expected_ids(range(5))
    assert vacuum_orphans(uri, retention_hours=0, dry_run=True) == []


def rolled_back_table(spark, uri: str) -> dict[int, int]:
    """Epochs 0..4 in generation 1, then rolled back to the version of epoch 2."""
    writer = EpochWriter(uri, "agg", 1, SCHEMA)
    writer.ensure_table()
    versions = write_epochs(spark, writer, range(5))
    restored = rollback_table(uri, versions[2])
    assert restored == versions[4] + 1
    assert table_ids(spark, uri) == expected_ids(range(3))
    return versions


@pytest.mark.slow
def test_rollback_then_rewrite_in_new_generation(spark, tmp_path):
    uri = str(tmp_path / "out")
    rolled_back_table(spark, uri)
    writer = EpochWriter(uri, "agg", 2, SCHEMA)
    writer.ensure_table()
    write_epochs(spark, writer, [3, 4])
    assert table_ids(spark, uri) == expected_ids(range(5))  # every row exactly once
    assert DeltaTable(uri).count() == 5 * ROWS


@pytest.mark.slow
def test_rollback_keeps_transaction_markers_so_same_generation_loses_rows(spark, tmp_path):
    """delta-io/delta#1813: a RESTORE keeps the writers' transaction markers.

    Rewriting in the same generation after a rollback skips the epochs that must be
    written again: their rows are missing. This is why a rollback starts a new generation.
    """
    uri = str(tmp_path / "out")
    rolled_back_table(spark, uri)
    assert DeltaTable(uri).transaction_version(app_id_for("agg", 1)) == 4  # not reset to 2
    writer = EpochWriter(uri, "agg", 1, SCHEMA)
    assert writer.write_epoch(epoch_frame(spark, 3, ROWS), 3) is None
    assert writer.write_epoch(epoch_frame(spark, 4, ROWS), 4) is None
    assert table_ids(spark, uri) == expected_ids(range(3))  # epochs 3 and 4 are lost


@pytest.mark.slow
def test_rolling_back_a_table_its_writer_never_created(tmp_path):
    """A writer killed in epoch 0 before creating its table: going back to version 0 (the
    empty table) has nothing to undo; any later version is an error naming the table."""
    from deltalake.exceptions import TableNotFoundError

    uri = str(tmp_path / "never_created")
    assert rollback_table(uri, 0) == 0
    assert not (tmp_path / "never_created").exists()
    with pytest.raises(TableNotFoundError, match="never_created"):
        rollback_table(uri, 2)


def test_read_added_is_the_union_of_epochs(spark, tmp_path):
    uri = str(tmp_path / "out")
    versions = rolled_back_table(spark, uri)
    latest = DeltaTable(uri).version()

    def ids(table: pa.Table) -> list[int]:
        assert table.schema.equals(
            pa.schema([pa.field(f.name, f.type) for f in SCHEMA])
        )  # string, not large_string
        return sorted(table.column("id").to_pylist())

    # Before the rewrite: the range holds epochs 0..2 only, the rolled-back ones are skipped.
    assert ids(read_added(uri, -1, latest)) == expected_ids(range(3))
    assert ids(read_added(uri, versions[0], versions[2])) == expected_ids([1, 2])

    writer = EpochWriter(uri, "agg", 2, SCHEMA)
    new = write_epochs(spark, writer, [3, 4])
    latest = new[4]
    assert ids(read_added(uri, -1, latest)) == expected_ids(range(5))
    # A consumer that had read through epoch 2 replays only the rewritten epochs.
    assert ids(read_added(uri, versions[2], latest)) == expected_ids([3, 4])
    # Same rows however the range is split.
    split = [read_added(uri, v, v + 1) for v in range(-1, latest)]
    assert sorted(i for t in split for i in t.column("id").to_pylist()) == expected_ids(range(5))
    assert ids(read_added(uri, new[3], new[4])) == expected_ids([4])


@pytest.mark.slow
def test_source_reads_every_row_once_in_micro_batches(spark, tmp_path):
    uri = str(tmp_path / "out")
    rolled_back_table(spark, uri)  # versions 1..5, RESTORE at 6
    writer = EpochWriter(uri, "agg", 2, SCHEMA)
    write_epochs(spark, writer, [3, 4])  # versions 7, 8
    register_source(spark)

    seen: list[tuple[int, int]] = []
    batch_sizes: list[int] = []

    def sink(df, batch_id):
        rows = [(r.id, r.epoch) for r in df.select("id", "epoch").collect()]
        batch_sizes.append(len(rows))
        seen.extend(rows)

    def run() -> None:
        query = (
            spark.readStream.format("falkirk_delta")
            .option("maxVersionsPerBatch", 1)
            .load(uri)
            .writeStream.foreachBatch(sink)
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(300)
        assert query.exception() is None

    run()
    assert sorted(i for i, _ in seen) == expected_ids(range(5))
    assert len(batch_sizes) == 9  # versions 0..8, one a batch
    assert max(batch_sizes) == ROWS  # one epoch a batch, never two

    # A restart resumes from the checkpointed offset and reads only what is new.
    write_epochs(spark, writer, [5])
    seen.clear()
    run()
    assert sorted(i for i, _ in seen) == expected_ids([5])
