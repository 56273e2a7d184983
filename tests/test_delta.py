"""The exactly-once Delta layer: delta-spark writes and restores, delta-rs reads, in tmp_path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from delta_writer_worker import SCHEMA, epoch_frame
from deltalake import DeltaTable

from falkirk.errors import FalkirkError
from falkirk.io.delta import (
    EpochWriter,
    RestoreError,
    app_id_for,
    read_appends,
    read_version,
    rollback_table,
    vacuum_orphans,
)
from falkirk.io.lake import TableSchemaError, read_table

pytestmark = pytest.mark.slow  # every test here starts Spark

ROWS = 1000  # per epoch
WORKER = Path(__file__).with_name("delta_writer_worker.py")


def expected_ids(epochs) -> list[int]:
    return sorted(i for e in epochs for i in range(e * ROWS, (e + 1) * ROWS))


def table_ids(spark, uri: str, version: int | None = None) -> list[int]:
    return sorted(r.id for r in read_version(spark, uri, version).select("id").collect())


def by_delta_spark(spark, uri: str, version: int | None = None):
    """A version as delta-spark's own reader reads it (``versionAsOf``)."""
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    return reader.load(uri)


def delta_spark_ids(spark, uri: str, version: int | None = None) -> list[int]:
    return sorted(r.id for r in by_delta_spark(spark, uri, version).select("id").collect())


def write_epochs(spark, writer: EpochWriter, epochs) -> dict[int, int]:
    """Epoch -> committed table version."""
    versions = {}
    for epoch in epochs:
        result = writer.write_epoch(epoch_frame(spark, epoch, ROWS), epoch)
        assert result is not None
        versions[epoch] = result.version
    return versions


def commits(uri: str) -> list[dict]:
    """Every commit of a table's log, oldest first, as {version: actions}."""
    log = os.path.join(uri, "_delta_log")
    out = []
    for name in sorted(n for n in os.listdir(log) if n.endswith(".json")):
        with open(os.path.join(log, name)) as f:
            out.append([json.loads(line) for line in f if line.strip()])
    return out


def test_write_epochs_and_read_back(spark, tmp_path):
    uri = str(tmp_path / "out")
    writer = EpochWriter(spark, uri, "agg", 1, SCHEMA)
    writer.ensure_table()
    versions = write_epochs(spark, writer, range(3))
    assert versions == {0: 1, 1: 2, 2: 3}
    for epoch, version in versions.items():
        assert table_ids(spark, uri, version) == expected_ids(range(epoch + 1))
    assert read_version(spark, uri, 0).count() == 0
    assert DeltaTable(uri).transaction_version(app_id_for("agg", 1)) == 2
    row = read_version(spark, uri).where("id = 1001").collect()[0]
    assert (row.epoch, row.name, row.ts.timestamp()) == (1, "row-1001", 1001 * 60)
    meta = json.loads(commits(uri)[2][0]["commitInfo"]["userMetadata"])
    assert meta == {"falkirk": {"region": "agg", "generation": 1, "epoch": 1}}


def test_an_epochs_spark_jobs_are_named_by_pipeline_region_epoch_and_generation(spark,
                                                                                tmp_path):
    from falkirk.runtime.loop import name_spark_jobs

    writer = EpochWriter(spark, str(tmp_path / "named"), "agg", 2, SCHEMA)
    writer.ensure_table()
    group = name_spark_jobs(spark, "tiny", {"report", "agg"}, 7, 2)
    assert group == "falkirk/tiny/agg+report/e7/g2"
    write_epochs(spark, writer, [7])
    from falkirk.io.spark import current_group, jobs_in_group

    assert current_group(spark) == group
    assert jobs_in_group(spark, group) > 0  # the write's Spark jobs (Connect: stages)


def test_tables_committed_by_delta_rs_read_by_delta_spark_at_each_version(spark, tmp_path):
    """Cross-engine: delta-spark reads what the writer committed (Spark's Parquet files,
    delta-rs's commits) at every version, including a RESTORE, as delta-rs reads it:
    time travel keeps working for delta-spark readers."""
    uri = str(tmp_path / "out")
    writer = EpochWriter(spark, uri, "agg", 1, SCHEMA)
    writer.ensure_table()
    versions = write_epochs(spark, writer, range(4))
    restored = rollback_table(uri, versions[1])
    for version in [0, *versions.values(), restored]:
        by_rs = sorted(read_table(uri, version)["id"].to_pylist())
        assert by_rs == delta_spark_ids(spark, uri, version), version
    assert sorted(read_table(uri)["id"].to_pylist()) == expected_ids(range(2))
    by_engine = {(c[0]["commitInfo"].get("operation"),
                  c[0]["commitInfo"].get("engineInfo", c[0]["commitInfo"].get(
                      "clientVersion", "?")).split(" ")[0].split(":")[0])
                 for c in commits(uri) if "commitInfo" in c[0]}
    # delta-rs is the table's one writing engine: creation, epochs, the RESTORE
    assert by_engine == {("CREATE TABLE", "delta-rs"), ("WRITE", "delta-rs"),
                         ("RESTORE", "delta-rs")}, by_engine
    # and the writer goes on after the RESTORE, exactly once per epoch
    writer2 = EpochWriter(spark, uri, "agg", 2, SCHEMA)
    write_epochs(spark, writer2, range(2, 4))
    for epoch in range(2, 4):  # replayed: skipped by its txn
        assert writer2.write_epoch(epoch_frame(spark, epoch, ROWS), epoch) is None
    assert delta_spark_ids(spark, uri) == expected_ids(range(4))


def jobs_of(spark, group: str, action, tries: int = 3) -> tuple[object, int]:
    """What ``action()`` returned and how many Spark jobs (Connect: stages) it ran.

    Connect's count is a lower bound: a stage that begins and ends between two of the
    engine's progress reports is not counted (docs/engine.md, "Limits"; under the full
    suite's load a one-stage read was once counted 0). The action runs ``tries`` times,
    each in a job group of its own, and the largest count is kept."""
    from falkirk.io.spark import jobs_in_group, label_jobs

    counts = []
    for i in range(tries):
        label_jobs(spark, f"{group}-{i}")
        try:
            out = action()
        finally:
            label_jobs(spark, "")
        counts.append(jobs_in_group(spark, f"{group}-{i}"))
    return out, max(counts)


def test_a_version_is_read_from_the_files_its_log_lists_as_delta_spark_reads_it(spark,
                                                                                tmp_path):
    """read_version reads a plain table's version as the Parquet files its log lists:
    the same rows and columns as delta-spark's versionAsOf at every version (the empty
    version 0, appends, a RESTORE, epochs written again after it), in one Spark job where
    delta-spark's read runs more to build the version's snapshot and filter its files."""
    uri = str(tmp_path / "out")
    writer = EpochWriter(spark, uri, "agg", 1, SCHEMA)
    writer.ensure_table()
    versions = list(write_epochs(spark, writer, range(3)).values())
    versions.append(rollback_table(uri, versions[0]))
    versions += write_epochs(spark, EpochWriter(spark, uri, "agg", 2, SCHEMA),
                             range(1, 3)).values()
    for version in [0, *versions]:
        df = read_version(spark, uri, version)
        by_delta = by_delta_spark(spark, uri, version)
        assert df.schema.simpleString() == by_delta.schema.simpleString()
        assert sorted(df.collect()) == sorted(by_delta.collect()), version
    rows, jobs = jobs_of(spark, "read-by-files", read_version(spark, uri, versions[-1]).collect)
    _, delta_jobs = jobs_of(spark, "read-by-delta-spark",
                            by_delta_spark(spark, uri, versions[-1]).collect)
    assert len(rows) == 3 * ROWS and jobs == 1 and delta_jobs > 1, (jobs, delta_jobs)


def test_a_version_of_many_files_is_read_without_a_listing_job(spark, tmp_path):
    """Above 32 paths Spark lists the files it is handed with a Spark job (a task per
    path); a local lake's driver checks them itself (the launch settings), so a version of
    40 appends still reads in one job."""
    from deltalake import write_deltalake

    uri = str(tmp_path / "many")
    for epoch in range(40):
        write_deltalake(uri, pa.table({"epoch": [epoch], "id": [epoch]}), mode="append")
    rows, jobs = jobs_of(spark, "read-40-files", read_version(spark, uri).collect)
    assert sorted(r.id for r in rows) == list(range(40)) and jobs == 1


def test_a_table_plain_parquet_cannot_read_exactly_is_read_by_delta_spark(spark, tmp_path):
    """A partitioned table (its partition values are not in its files) and one with a
    deletion vector (a deleted row is still in its file) read as delta-spark reads them."""
    from deltalake import write_deltalake

    parted = str(tmp_path / "parted")
    write_deltalake(parted, pa.table({"epoch": [0, 1], "id": [10, 11]}), partition_by=["epoch"])
    assert sorted((r.epoch, r.id) for r in read_version(spark, parted).collect()) == [
        (0, 10), (1, 11)]
    vectors = str(tmp_path / "vectors")
    spark.sql(f"CREATE TABLE delta.`{vectors}` (id BIGINT) USING delta "
              "TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')")
    spark.sql(f"INSERT INTO delta.`{vectors}` VALUES (1), (2), (3)")
    spark.sql(f"DELETE FROM delta.`{vectors}` WHERE id = 2")
    assert DeltaTable(vectors).protocol().min_reader_version == 3
    # the deleted row is still in the version's files: only its vector drops it
    assert spark.read.parquet(*DeltaTable(vectors).file_uris()).count() == 3
    assert sorted(r.id for r in read_version(spark, vectors).collect()) == [1, 3]


def test_a_null_in_a_non_nullable_column_is_refused_naming_where(spark, tmp_path):
    """Delta enforces the declared NOT NULL columns; the error names the pipeline, region,
    table, epoch and column, and nothing of the epoch is committed."""
    uri = str(tmp_path / "user_totals")
    schema = pa.schema([pa.field("epoch", pa.int64(), nullable=False),
                        pa.field("user", pa.string(), nullable=False),
                        pa.field("total", pa.int64())])
    writer = EpochWriter(spark, uri, "user_totals", 0, schema, pipeline="clicks")
    writer.ensure_table()
    bad = spark.createDataFrame([(3, "u1", 1), (3, None, 2)],
                                "epoch long, user string, total long")
    with pytest.raises(TableSchemaError, match=r"pipeline 'clicks', region 'user_totals', "
                       r"epoch 3: column 'user' of table 'user_totals' is null in a row, but "
                       r"the table declares it non-nullable; nothing of the epoch was "
                       r"committed"):
        writer.write_epoch(bad, 3)
    assert DeltaTable(uri).version() == 0 and not writer.is_committed(3)
    good = spark.createDataFrame([(3, "u1", None)], "epoch long, user string, total long")
    assert writer.write_epoch(good, 3).version == 1  # a nullable column may be null


def test_an_existing_table_of_another_schema_is_refused(spark, tmp_path):
    uri = str(tmp_path / "out")
    EpochWriter(spark, uri, "agg", 1, SCHEMA).ensure_table()
    other = pa.schema([("id", pa.int64()), ("epoch", pa.int64())])
    with pytest.raises(TableSchemaError, match="out has schema"):
        EpochWriter(spark, uri, "other", 1, other).ensure_table()


def test_a_lake_folder_with_a_space_reads_back(spark, tmp_path):
    uri = str(tmp_path / "four regimes-0" / "out")
    writer = EpochWriter(spark, uri, "agg", 1, SCHEMA)
    writer.ensure_table()
    write_epochs(spark, writer, range(2))
    assert table_ids(spark, uri) == expected_ids(range(2))
    assert sorted(read_table(uri)["id"].to_pylist()) == expected_ids(range(2))


def test_a_lake_folder_spark_would_take_for_a_pattern_reads_back(spark, tmp_path):
    """Spark globs the paths it reads as Parquet: a table under a folder named like a
    pattern is read by delta-spark, not by its file list."""
    uri = str(tmp_path / "lake[1]" / "out")
    writer = EpochWriter(spark, uri, "agg", 1, SCHEMA)
    writer.ensure_table()
    write_epochs(spark, writer, range(2))
    assert table_ids(spark, uri) == expected_ids(range(2))


def test_replayed_epoch_is_skipped_in_same_generation(spark, tmp_path):
    uri = str(tmp_path / "out")
    writer = EpochWriter(spark, uri, "agg", 1, SCHEMA)
    writer.ensure_table()
    write_epochs(spark, writer, range(2))
    again = EpochWriter(spark, uri, "agg", 1, SCHEMA)
    assert again.write_epoch(epoch_frame(spark, 1, ROWS), 1) is None
    assert table_ids(spark, uri) == expected_ids(range(2))
    assert again.version_of(1) == 2 and again.version_of(5) is None


def test_a_fence_landing_between_a_writers_check_and_its_commit_stops_the_commit(
        spark, tmp_path, monkeypatch):
    """A writer of generation 1 (a job a rollback is stopping) found epoch 2 not committed
    and is about to commit; the rollback's fence of generation 1 lands now (forced with a
    hold point). delta-rs refuses the commit (a concurrent transaction of its app id), the
    writer looks again, finds itself fenced and commits nothing; generation 2 then writes
    the epoch once."""
    import threading

    from falkirk.faults import HOLD_DIR_ENV, HOLD_ENV, hold_file
    from falkirk.io.delta import fence_older_generations

    uri = str(tmp_path / "out")
    old = EpochWriter(spark, uri, "agg", 1, SCHEMA)
    old.ensure_table()
    write_epochs(spark, old, range(2))
    monkeypatch.setenv(HOLD_ENV, "writer:checked")
    monkeypatch.setenv(HOLD_DIR_ENV, str(tmp_path))
    done: dict = {}
    zombie = threading.Thread(target=lambda: done.update(
        result=old.write_epoch(epoch_frame(spark, 2, ROWS), 2)))
    zombie.start()
    reached = hold_file(tmp_path, "writer:checked", "reached")
    deadline = time.monotonic() + 120
    while not reached.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert reached.exists(), "the old writer never reached its commit"
    monkeypatch.delenv(HOLD_ENV)
    assert fence_older_generations(uri, "agg", 2) == [app_id_for("agg", 1),
                                                      app_id_for("agg", 0)]
    hold_file(tmp_path, "writer:checked", "release").write_text("")
    zombie.join(timeout=120)
    assert done == {"result": None}  # fenced: nothing committed
    assert table_ids(spark, uri) == expected_ids(range(2))
    new = EpochWriter(spark, uri, "agg", 2, SCHEMA)
    new.ensure_table()
    assert new.write_epoch(epoch_frame(spark, 2, ROWS), 2) is not None
    assert table_ids(spark, uri) == expected_ids(range(3))


def test_a_pass_of_several_epochs_is_one_spark_write_and_a_commit_per_epoch(spark,
                                                                           tmp_path):
    """A multi-epoch pass: one Spark job writes every epoch's files, and each epoch is its
    own commit (its own version and transaction), so a rollback can restore any one;
    an epoch with no rows commits only its transaction, and a replayed pass commits
    only what is missing."""
    from pyspark.sql import functions as F

    from falkirk.io.delta import PASS_COLUMN

    uri = str(tmp_path / "out")
    writer = EpochWriter(spark, uri, "agg", 1, SCHEMA)
    writer.ensure_table()
    frames = [epoch_frame(spark, e, ROWS).withColumn(PASS_COLUMN, F.lit(e))
              for e in (0, 1, 3)]
    both = frames[0].unionByName(frames[1]).unionByName(frames[2])
    results = writer.write_epochs(both, [0, 1, 2, 3])
    assert [results[e].version for e in range(4)] == [1, 2, 3, 4]
    for e in range(4):
        assert table_ids(spark, uri, results[e].version) == expected_ids(
            [x for x in (0, 1, 3) if x <= e])
    assert DeltaTable(uri).transaction_version(writer.app_id) == 3
    again = writer.write_epochs(both, [2, 3, 4])
    assert again[2] is None and again[3] is None and again[4].version == 5
    assert table_ids(spark, uri) == expected_ids([0, 1, 3])


def test_empty_epoch_commits_the_transaction(spark, tmp_path):
    uri = str(tmp_path / "out")
    writer = EpochWriter(spark, uri, "agg", 1, SCHEMA)
    writer.ensure_table()
    result = writer.write_epoch(epoch_frame(spark, 0, ROWS).limit(0), 0)
    assert result is not None and result.version == 1
    assert DeltaTable(uri).transaction_version(writer.app_id) == 0
    assert read_version(spark, uri).count() == 0
    assert writer.write_epoch(epoch_frame(spark, 0, ROWS), 0) is None  # epoch 0 is done


def run_worker(uri: str, generation: int, first: int, last: int, crash_at: str | None = None):
    env = dict(os.environ)
    env.pop("FALKIRK_CRASH_AT", None)
    if crash_at is not None:
        env["FALKIRK_CRASH_AT"] = crash_at
    proc = subprocess.run(
        [sys.executable, str(WORKER), uri, "agg", str(generation), str(first), str(last),
         str(ROWS)],
        env=env, capture_output=True, text=True, timeout=300,
    )
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return proc, lines


def test_kill_after_the_commit_before_the_log_is_found_again(spark, tmp_path):
    """A driver killed right after its epoch's Delta commit: the restarted writer skips the
    epoch and finds the version that committed it (what the epoch log then records)."""
    uri = str(tmp_path / "out")
    proc, lines = run_worker(uri, 1, 0, 4, crash_at="writer:after-commit@3")
    assert proc.returncode == -9, proc.stderr[-2000:]
    assert [line["epoch"] for line in lines] == [0, 1]  # epoch 2 committed, not reported
    assert table_ids(spark, uri) == expected_ids(range(3))
    proc, lines = run_worker(uri, 1, 0, 4)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [line["version"] is None for line in lines] == [True, True, True, False, False]
    assert EpochWriter(spark, uri, "agg", 1, SCHEMA).version_of(2) == 3
    assert table_ids(spark, uri) == expected_ids(range(5))  # no duplicates, no loss


def test_kill_before_the_commit_then_rerun(spark, tmp_path):
    uri = str(tmp_path / "out")
    proc, lines = run_worker(uri, 1, 0, 4, crash_at="writer:before-commit@4")
    assert proc.returncode == -9, proc.stderr[-2000:]
    assert [line["epoch"] for line in lines] == [0, 1, 2]
    assert DeltaTable(uri).transaction_version(app_id_for("agg", 1)) == 2
    proc, lines = run_worker(uri, 1, 0, 4)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [line["version"] is None for line in lines] == [True, True, True, False, False]
    assert table_ids(spark, uri) == expected_ids(range(5))


def test_vacuum_removes_only_files_no_version_references(spark, tmp_path):
    """A write killed before its commit leaves data files in the table folder that no
    version names: vacuum deletes them (once older than the retention), nothing else."""
    uri = str(tmp_path / "out")
    writer = EpochWriter(spark, uri, "agg", 1, SCHEMA)
    writer.ensure_table()
    versions = write_epochs(spark, writer, range(3))
    rollback_table(uri, versions[0])  # versions 2, 3 stay readable by time travel
    orphan = os.path.join(uri, "part-00000-0badc0de-c000.snappy.parquet")
    pq.write_table(pa.table({"id": [1]}), orphan)
    fresh = os.path.join(uri, "part-00001-0badc0de-c000.snappy.parquet")
    pq.write_table(pa.table({"id": [2]}), fresh)
    old = time.time() - 3 * 3600
    os.utime(orphan, (old, old))
    assert vacuum_orphans(uri, retention_hours=1, dry_run=True) == [os.path.basename(orphan)]
    assert os.path.exists(orphan)
    assert vacuum_orphans(uri, retention_hours=1) == [os.path.basename(orphan)]
    assert not os.path.exists(orphan) and os.path.exists(fresh)  # fresh: maybe mid-write
    for version in versions.values():
        assert table_ids(spark, uri, version) == expected_ids(range(version))


def rolled_back_table(spark, uri: str) -> dict[int, int]:
    """Epochs 0..4 in generation 1, then rolled back to the version of epoch 2."""
    writer = EpochWriter(spark, uri, "agg", 1, SCHEMA)
    writer.ensure_table()
    versions = write_epochs(spark, writer, range(5))
    restored = rollback_table(uri, versions[2])
    assert restored == versions[4] + 1
    assert table_ids(spark, uri) == expected_ids(range(3))
    return versions


def test_rollback_then_rewrite_in_new_generation(spark, tmp_path):
    uri = str(tmp_path / "out")
    rolled_back_table(spark, uri)
    writer = EpochWriter(spark, uri, "agg", 2, SCHEMA)
    writer.ensure_table()
    write_epochs(spark, writer, [3, 4])
    assert table_ids(spark, uri) == expected_ids(range(5))  # every row exactly once
    assert DeltaTable(uri).count() == 5 * ROWS


def appended_ids(spark, uri: str, version: int, epoch: int) -> list[int]:
    return sorted(r.id for r in read_appends(spark, uri, version, epoch).select("id").collect())


def test_appends_read_one_epochs_rows_through_the_streaming_source(spark, tmp_path):
    """``read: appends``: the rows the sender appended for an epoch, not the snapshot, with
    later epochs' commits present; an empty epoch reads as no rows, with the table's
    columns."""
    uri = str(tmp_path / "out")
    writer = EpochWriter(spark, uri, "agg", 1, SCHEMA)
    writer.ensure_table()
    versions = write_epochs(spark, writer, range(3))
    empty = writer.write_epoch(epoch_frame(spark, 3, ROWS).limit(0), 3).version
    for epoch in range(3):
        assert appended_ids(spark, uri, versions[epoch], epoch) == expected_ids([epoch])
    nothing = read_appends(spark, uri, empty, 3)
    assert nothing.count() == 0 and nothing.columns == read_version(spark, uri).columns


def test_appends_after_a_rollback_read_the_new_generations_commit_once(spark, tmp_path):
    """The stream skips the RESTORE (a commit that only removes files) and reads the epoch
    as the new generation wrote it again: every row once, the old generation's gone."""
    uri = str(tmp_path / "out")
    old = rolled_back_table(spark, uri)
    writer = EpochWriter(spark, uri, "agg", 2, SCHEMA)
    writer.ensure_table()
    again = write_epochs(spark, writer, [3, 4])
    assert again[3] > old[4] + 1  # after the restore's own commit
    for epoch in (3, 4):
        assert appended_ids(spark, uri, again[epoch], epoch) == expected_ids([epoch])
    assert appended_ids(spark, uri, old[2], 2) == expected_ids([2])  # kept by the restore


def test_appends_of_a_table_without_an_epoch_column_are_refused(spark, tmp_path):
    uri = str(tmp_path / "plain")
    spark.range(3).write.format("delta").save(uri)
    with pytest.raises(FalkirkError, match="needs an epoch column.*columns: id"):
        read_appends(spark, uri, 0, 0)


def test_rollback_keeps_transaction_markers_so_same_generation_loses_rows(spark, tmp_path):
    """delta-io/delta#1813: a RESTORE keeps the writers' transaction markers.

    Rewriting in the same generation after a rollback skips the epochs that must be
    written again: their rows are missing. This is why a rollback starts a new generation.
    """
    uri = str(tmp_path / "out")
    rolled_back_table(spark, uri)
    assert DeltaTable(uri).transaction_version(app_id_for("agg", 1)) == 4  # not reset to 2
    writer = EpochWriter(spark, uri, "agg", 1, SCHEMA)
    assert writer.write_epoch(epoch_frame(spark, 3, ROWS), 3) is None
    assert writer.write_epoch(epoch_frame(spark, 4, ROWS), 4) is None
    assert table_ids(spark, uri) == expected_ids(range(3))  # epochs 3 and 4 are lost


def test_rolling_back_a_table_its_writer_never_created(spark, tmp_path):
    """A writer killed in epoch 0 before creating its table: going back to version 0 (the
    empty table) has nothing to undo; any later version is an error naming the table."""
    from deltalake.exceptions import TableNotFoundError

    uri = str(tmp_path / "never_created")
    assert rollback_table(uri, 0) == 0
    assert not (tmp_path / "never_created").exists()
    with pytest.raises(TableNotFoundError, match="never_created"):
        rollback_table(uri, 2)


def test_rolling_forward_is_refused(spark, tmp_path):
    uri = str(tmp_path / "out")
    writer = EpochWriter(spark, uri, "agg", 1, SCHEMA)
    writer.ensure_table()
    write_epochs(spark, writer, range(2))
    with pytest.raises(RestoreError, match="back to 7"):
        rollback_table(uri, 7)


def test_an_epoch_committed_before_a_kill_is_written_once_by_a_newer_generation(spark,
                                                                              tmp_path):
    """A writer killed between its commit of epoch 2 and the epoch log's row, retried in a
    newer generation (a rollback of other regions came between, as for a batch epoch's
    Airflow retry): the epoch is in the table once, not beside the orphan commit."""
    uri = str(tmp_path / "out")
    proc, lines = run_worker(uri, 1, 0, 4, crash_at="writer:after-commit@3")
    assert proc.returncode == -9, proc.stderr[-2000:]
    assert [line["epoch"] for line in lines] == [0, 1]  # epoch 2 committed, not reported
    proc, lines = run_worker(uri, 2, 2, 4)  # the log says 0 and 1: generation 2 goes on at 2
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert table_ids(spark, uri) == expected_ids(range(5))  # epoch 2 once, nothing lost
    history = {c["version"]: c for c in DeltaTable(uri).history()}
    # generation 2 fenced generations 0 and 1 (version 4: no rows), then cut the orphan
    # (version 3) off, stepping over its own fence
    assert json.loads(history[4]["userMetadata"])["falkirk"] == {
        "region": "agg", "generation": 2, "fence": 0}
    assert history[5]["operation"] == "RESTORE"
    # a writer of an older generation never cuts off a newer one's commits
    newest = DeltaTable(uri).version()
    assert EpochWriter(spark, uri, "agg", 1, SCHEMA).discard_orphans(0, newest) == newest
    assert table_ids(spark, uri) == expected_ids(range(5))


def test_a_table_whose_creation_was_killed_before_its_first_commit_is_created(spark,
                                                                              tmp_path):
    """delta-spark makes ``_delta_log`` before it writes version 0: a job killed in between
    left the folder with no commit (and maybe a temporary file), and every restart of the
    job failed to create the table (DELTA_TABLE_NOT_FOUND), so its region never recovered
    (found by the fault campaign under Airflow: serve killed as it created query_stats)."""
    uri = str(tmp_path / "unborn")
    log_dir = tmp_path / "unborn" / "_delta_log"
    log_dir.mkdir(parents=True)
    (log_dir / ".00000000000000000000.json.5b1c.tmp").write_text("")  # a write cut short
    writer = EpochWriter(spark, uri, "agg", 1, SCHEMA)
    writer.ensure_table()
    assert DeltaTable(uri).version() == 0
    write_epochs(spark, writer, [0])
    assert table_ids(spark, uri) == expected_ids([0])
