"""The durable output layer: exactly-once Delta tables written by Spark, committed by delta-rs.

delta-spark's JVM side cannot load here, so Spark only writes Parquet files and the
driver commits them through delta-rs (see shared/design/platform-notes.md):

* :class:`EpochWriter` writes one epoch at a time. Executors write the epoch's Parquet
  files in parallel into a staging folder inside the table folder (``e00000005-g2-1a2b3c4d/``:
  not ``_``/``.``-prefixed, or vacuum would never clean it, and not ``key=value``, which
  readers take for a partition). The driver then commits them in one Delta commit that also
  carries the app transaction ``(falkirk:{region}:g{generation}, epoch)``; an epoch whose
  transaction is already in the table is skipped, so a replayed epoch is written once.
* A crash between the files and the commit leaves orphan files no version references;
  :func:`vacuum_orphans` removes them.
* :func:`rollback_table` makes readers see the table exactly as at an older version; the
  writers then need a new generation (a RESTORE keeps transaction markers, delta-io/delta#1813).
* :func:`read_version` reads one version into Spark from its file list, never a folder scan.
* ``falkirk_delta`` (:class:`FalkirkDeltaDataSource`) streams the rows that table versions
  added, with table versions as offsets; :func:`read_added` gives the same rows as one
  pyarrow Table, to replay a logged edge.
"""

from __future__ import annotations

import datetime as dt_
import decimal
import json
import math
import os
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import AddAction, CommitProperties, Transaction
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxFiles,
    SupportsTriggerAvailableNow,
)

from falkirk.faults import maybe_crash
from falkirk.lake import ensure_table, file_path, local_path, table_filesystem

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

SOURCE_NAME = "falkirk_delta"
_LOG_DIR = "_delta_log"
_STATS_MAX_STRING = 32  # Delta truncates longer strings in stats
_COMMIT_ATTEMPTS = 5


def app_id_for(region: str, generation: int) -> str:
    """The app id of a writer: one per (region, generation), so a new generation rewrites."""
    return f"falkirk:{region}:g{generation}"


def staging_name(epoch: int, generation: int) -> str:
    """A staging folder name unique per attempt that still says which epoch/generation it held."""
    return f"e{epoch:08d}-g{generation}-{uuid.uuid4().hex[:8]}"


# ---------------------------------------------------------------------------------------------
# Locations


def _spark_uri(uri: str) -> str:
    """A location as Spark's Hadoop file systems name it (s3:// is s3a:// there)."""
    if uri.startswith("s3://"):
        return "s3a://" + uri[len("s3://") :]
    return uri


def _spark_schema(table: DeltaTable) -> StructType:
    """The Spark schema of a Delta table: Delta's schema JSON is Spark's StructType JSON."""
    from pyspark.sql.types import StructType

    return StructType.fromJson(json.loads(table.schema().to_json()))


def _arrow_schema(schema: StructType) -> pa.Schema:
    """The Arrow schema Spark expects from a Python data source (string, not large_string)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


# ---------------------------------------------------------------------------------------------
# Parquet footer statistics


def _json_scalar(value: Any, arrow_type: pa.DataType, is_max: bool) -> Any:
    """A min/max value in Delta's stats JSON form, or None when it cannot be given safely."""
    if pa.types.is_boolean(arrow_type) or value is None:
        return None  # Delta keeps no min/max for booleans
    if pa.types.is_integer(arrow_type):
        return int(value)
    if pa.types.is_floating(arrow_type):
        value = float(value)
        return None if math.isnan(value) or math.isinf(value) else value
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        # Delta truncates long strings and bumps the max; we give no bounds for those instead.
        return value if len(value) <= _STATS_MAX_STRING else None
    if pa.types.is_date32(arrow_type):
        return value.isoformat()
    if pa.types.is_timestamp(arrow_type) and arrow_type.tz is not None:
        # Delta keeps milliseconds: round the min down and the max up so the bounds still hold.
        value = value.astimezone(dt_.UTC)
        micros = value.microsecond
        value = value.replace(microsecond=micros - micros % 1000)
        if is_max and micros % 1000:
            value += dt_.timedelta(milliseconds=1)
        return value.strftime("%Y-%m-%dT%H:%M:%S.") + f"{value.microsecond // 1000:03d}Z"
    if pa.types.is_decimal(arrow_type) and isinstance(value, decimal.Decimal):
        as_float = float(value)
        return as_float if decimal.Decimal(as_float) == value else None
    return None  # binary, timestamp without zone, nested: no min/max (nullCount still given)


def parquet_stats(metadata: pq.FileMetaData) -> dict[str, Any]:
    """Delta file statistics (numRecords, minValues, maxValues, nullCount) from a footer.

    Without them delta-rs counts 0 rows and prunes nothing (platform-notes). Only top-level
    primitive columns get entries; a column missing from any row group's statistics is left
    out rather than guessed.
    """
    schema = metadata.schema.to_arrow_schema()
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    leaf_index = {metadata.schema.column(i).path: i for i in range(metadata.num_columns)}
    for arrow_field in schema:
        index = leaf_index.get(arrow_field.name)
        if index is None:
            continue  # nested column: several leaves, no flat stats
        low = high = None
        null_count: int | None = 0
        min_max_ok = True
        for rg in range(metadata.num_row_groups):
            column = metadata.row_group(rg).column(index)
            stats = column.statistics
            if column.num_values == 0 and stats is None:
                continue
            if stats is None:
                null_count, min_max_ok = None, False
                break
            if stats.has_null_count and null_count is not None:
                null_count += stats.null_count
            else:
                null_count = None
            all_null = stats.has_null_count and stats.null_count == column.num_values
            if all_null:
                continue
            if not stats.has_min_max:
                min_max_ok = False
                continue
            low = stats.min if low is None or stats.min < low else low
            high = stats.max if high is None or stats.max > high else high
        if null_count is not None:
            nulls[arrow_field.name] = null_count
        if min_max_ok and low is not None:
            lo = _json_scalar(low, arrow_field.type, is_max=False)
            hi = _json_scalar(high, arrow_field.type, is_max=True)
            if lo is not None and hi is not None:
                mins[arrow_field.name] = lo
                maxs[arrow_field.name] = hi
    return {
        "numRecords": metadata.num_rows,
        "minValues": mins,
        "maxValues": maxs,
        "nullCount": nulls,
    }


# ---------------------------------------------------------------------------------------------
# The writer


@dataclass(frozen=True)
class StagedEpoch:
    """An epoch's Parquet files, written but not yet committed (invisible to readers)."""

    epoch: int
    staging: str  # folder relative to the table root
    actions: list[AddAction]
    rows: int
    bytes: int


@dataclass(frozen=True)
class CommitResult:
    """What one committed epoch became: the table version the epoch log records."""

    version: int
    epoch: int
    generation: int
    app_id: str
    files: int
    rows: int
    bytes: int
    staging: str


class EpochWriter:
    """Writes a region's epochs to a Delta table exactly once per generation.

    The transaction check and the commit are two steps but read one snapshot: delta-rs's
    conflict check rejects a commit if a commit of the same app id landed after the snapshot
    it read ("Concurrent transaction failed"), so a racing writer of the same (region,
    generation) makes us reload, find the epoch done and skip it. Commits of other app ids
    are rebased by delta-rs (several regions may append to one table).
    """

    def __init__(
        self,
        table_uri: str,
        region: str,
        generation: int,
        schema: pa.Schema,
        storage_options: dict[str, str] | None = None,
    ) -> None:
        self.table_uri = table_uri.rstrip("/")
        self.region = region
        self.generation = generation
        self.schema = schema
        self.storage_options = storage_options
        self.app_id = app_id_for(region, generation)
        self._fs = table_filesystem(self.table_uri, storage_options)
        self._table: DeltaTable | None = None

    # -- table ---------------------------------------------------------------------------

    def ensure_table(self) -> DeltaTable:
        """Create the table (an empty version 0) if missing; refuse a table of another schema."""
        self._table = ensure_table(self.table_uri, self.schema, self.storage_options)
        return self._table

    def _fresh_table(self) -> DeltaTable:
        """The table at its latest version (a stale handle fails to commit: 'Concurrent
        transaction failed', and would read old transaction markers)."""
        if self._table is None:
            return self.ensure_table()
        self._table.update_incremental()
        return self._table

    def committed_epoch(self) -> int | None:
        """The last epoch this (region, generation) committed, or None."""
        return self._fresh_table().transaction_version(self.app_id)

    def is_committed(self, epoch: int) -> bool:
        """Whether ``epoch`` is already in the table for this generation."""
        return self._done(self._fresh_table(), epoch)

    def _done(self, table: DeltaTable, epoch: int) -> bool:
        # Epochs of one generation are committed in order: a marker >= epoch means done.
        done = table.transaction_version(self.app_id)
        return done is not None and done >= epoch

    # -- writing -------------------------------------------------------------------------

    def write_epoch(self, df: DataFrame, epoch: int) -> CommitResult | None:
        """Write and commit one epoch; None when this generation already committed it.

        Usable as ``foreachBatch(lambda df, epoch_id: writer.write_epoch(df, epoch_id))``.
        """
        if self.is_committed(epoch):
            return None
        staged = self.stage(df, epoch)
        maybe_crash("writer:before-commit")
        return self.commit(staged)

    def stage(self, df: DataFrame, epoch: int) -> StagedEpoch:
        """Executors write the epoch's Parquet files into a new staging folder (no collect)."""
        staging = staging_name(epoch, self.generation)
        frame = self._conform(df)
        with _parquet_timestamps_micros(frame.sparkSession, self.schema):
            frame.write.mode("errorifexists").parquet(_spark_uri(f"{self.table_uri}/{staging}"))
        return self._collect_staged(epoch, staging)

    def _conform(self, df: DataFrame) -> DataFrame:
        """The DataFrame with the table's columns, in order and of the table's types."""
        from pyspark.sql import functions as F
        from pyspark.sql.pandas.types import from_arrow_schema

        target = from_arrow_schema(self.schema)
        if [(f.name, f.dataType) for f in df.schema] == [(f.name, f.dataType) for f in target]:
            return df
        missing = [f.name for f in target if f.name not in df.columns]
        if missing:
            raise ValueError(f"epoch DataFrame lacks columns {missing} of {self.table_uri}")
        return df.select([F.col(f"`{f.name}`").cast(f.dataType).alias(f.name) for f in target])

    def _collect_staged(self, epoch: int, staging: str) -> StagedEpoch:
        """Add actions for the staged data files, with stats from their Parquet footers."""
        actions: list[AddAction] = []
        rows = size = 0
        infos = self._fs.get_file_info(pafs.FileSelector(staging, recursive=False))
        for info in sorted(infos, key=lambda i: i.path):
            name = info.base_name
            if (
                info.type != pafs.FileType.File
                or name.startswith(("_", "."))  # _SUCCESS, .part-*.crc
                or name.endswith(".crc")
                or info.size == 0
            ):
                continue
            metadata = pq.read_metadata(info.path, filesystem=self._fs)
            if metadata.num_rows == 0:
                continue  # Spark writes an empty file for an empty batch or partition
            mtime_ms = info.mtime_ns // 1_000_000 if info.mtime_ns else int(time.time() * 1000)
            actions.append(
                AddAction(
                    path=f"{staging}/{name}",  # relative: absolute paths make it unreadable
                    size=info.size,
                    partition_values={},  # not None: unpartitioned tables need {}
                    modification_time=mtime_ms,
                    data_change=True,
                    stats=json.dumps(parquet_stats(metadata), separators=(",", ":")),
                )
            )
            rows += metadata.num_rows
            size += info.size
        return StagedEpoch(epoch=epoch, staging=staging, actions=actions, rows=rows, bytes=size)

    def commit(self, staged: StagedEpoch) -> CommitResult | None:
        """Commit staged files and the (app id, epoch) transaction in one Delta commit.

        An empty epoch commits only the transaction. Returns None if this generation has
        committed the epoch meanwhile. The commit carries a token in its commitInfo so the
        committed version is found exactly even if another app committed in between.
        """
        token = staged.staging
        first_read_version: int | None = None
        for attempt in range(_COMMIT_ATTEMPTS):
            table = self._fresh_table()
            if first_read_version is None:
                first_read_version = table.version()
            if self._done(table, staged.epoch):
                version = self._find_commit(table, first_read_version, token)
                return None if version is None else self._result(staged, version)
            read_version = table.version()
            try:
                table.create_write_transaction(
                    staged.actions,
                    mode="append",
                    schema=self.schema,
                    commit_properties=CommitProperties(
                        app_transactions=[Transaction(self.app_id, staged.epoch)],
                        custom_metadata={
                            "falkirk": {
                                "region": self.region,
                                "generation": self.generation,
                                "epoch": staged.epoch,
                                "token": token,
                            }
                        },
                    ),
                )
            except CommitFailedError:
                if attempt == _COMMIT_ATTEMPTS - 1:
                    raise
                time.sleep(0.05 * (attempt + 1))
                continue
            table.update_incremental()
            if table.version() == read_version + 1:
                return self._result(staged, read_version + 1)
            version = self._find_commit(table, read_version, token)
            if version is None:
                raise RuntimeError(f"committed epoch {staged.epoch} not found in the log")
            return self._result(staged, version)
        raise AssertionError("unreachable")

    def version_of(self, epoch: int) -> int | None:
        """The version that committed ``epoch`` in this generation (for a writer restarted
        after a crash between its commit and the epoch log's row), or None."""
        table = self._fresh_table()
        for info in table.history():
            mark = info.get("falkirk") or {}
            if (mark.get("region"), mark.get("generation"), mark.get("epoch")) == (
                self.region, self.generation, epoch
            ):
                return int(info["version"])
        return None

    @staticmethod
    def _find_commit(table: DeltaTable, after_version: int, token: str) -> int | None:
        """The version whose commitInfo carries ``token``, searching after ``after_version``."""
        table.update_incremental()
        newer = table.version() - after_version
        if newer <= 0:
            return None
        for info in table.history(limit=newer):
            if info.get("falkirk", {}).get("token") == token:
                return int(info["version"])
        return None

    def _result(self, staged: StagedEpoch, version: int) -> CommitResult:
        return CommitResult(
            version=version,
            epoch=staged.epoch,
            generation=self.generation,
            app_id=self.app_id,
            files=len(staged.actions),
            rows=staged.rows,
            bytes=staged.bytes,
            staging=staged.staging,
        )


@contextmanager
def _parquet_timestamps_micros(spark: SparkSession, schema: pa.Schema) -> Iterator[None]:
    """Spark writes timestamps as INT96 by default: no footer stats and not Delta's type.

    Switches the session to TIMESTAMP_MICROS for the write (only if the schema has
    timestamps) and puts the previous setting back.
    """
    if not any(pa.types.is_timestamp(f.type) for f in schema):
        yield
        return
    key = "spark.sql.parquet.outputTimestampType"
    previous = spark.conf.get(key, None)
    spark.conf.set(key, "TIMESTAMP_MICROS")
    try:
        yield
    finally:
        if previous is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, previous)


# ---------------------------------------------------------------------------------------------
# Recovery


def rollback_table(
    table_uri: str, to_version: int, storage_options: dict[str, str] | None = None
) -> int:
    """Make readers see exactly the table as at ``to_version``; return the version that does.

    Uses ``DeltaTable.restore`` rather than hand-made RemoveActions: one atomic commit that
    also restores metadata and schema, re-adds files removed since (RemoveActions could only
    remove), and fails instead of silently succeeding when vacuum has deleted files of
    ``to_version``. The earlier versions stay readable by time travel until vacuumed.
    A RESTORE keeps every writer's transaction marker (delta-io/delta#1813): writers that must
    write epochs after ``to_version`` again have to run under a new generation. A no-op when
    the table is at ``to_version``, and when version 0 (the empty table its writer creates
    first) is asked for and the table does not exist: its writer died before creating it,
    so nothing was committed (found by ``falkirk trials``: a kill in epoch 0).
    """
    if to_version == 0 and not DeltaTable.is_deltatable(table_uri, storage_options):
        return 0
    table = DeltaTable(table_uri, storage_options=storage_options)
    current = table.version()
    if to_version > current or to_version < 0:
        raise ValueError(f"cannot roll {table_uri} at version {current} back to {to_version}")
    if to_version == current:
        return current
    table.restore(to_version)
    table.update_incremental()
    # The RESTORE is the newest commit whose target is to_version (writers are stopped).
    for info in table.history(limit=table.version() - current):
        if info.get("operation") == "RESTORE" and _restore_target(info) == to_version:
            return int(info["version"])
    raise RuntimeError(f"RESTORE of {table_uri} to {to_version} not found in its log")


def vacuum_orphans(
    table_uri: str,
    retention_hours: int | None = None,
    *,
    keep_from_version: int | None = None,
    dry_run: bool = False,
    storage_options: dict[str, str] | None = None,
) -> list[str]:
    """Delete files no kept version references (orphans of crashed writes); return them.

    delta-rs needs ``full=True`` to look at files never named in the log (the default vacuum
    only deletes removed files), and ``enforce_retention_duration=False`` below the table's
    retention (7 days). ``keep_versions`` protects every version from ``keep_from_version``
    (default: every version still in the log), so by default only files no version ever
    referenced go, and rolled-back versions stay readable. Folders starting with ``_`` or
    ``.`` are never cleaned by delta-rs (hence the staging names). With a short retention,
    run it only while no writer of the table is between its Parquet write and its commit:
    those files are orphans too until committed. A real vacuum adds two commits to the log.
    """
    table = DeltaTable(table_uri, storage_options=storage_options)
    fs = table_filesystem(table_uri.rstrip("/"), storage_options)
    first = _earliest_log_version(fs) if keep_from_version is None else keep_from_version
    removed = table.vacuum(
        retention_hours=retention_hours,
        dry_run=dry_run,
        enforce_retention_duration=retention_hours is None,
        full=True,
        keep_versions=list(range(first, table.version() + 1)),
    )
    local = local_path(table_uri)
    if local is not None and not dry_run:
        _remove_empty_folders(local)
    return sorted(removed)


def _earliest_log_version(fs: pafs.FileSystem) -> int:
    """The oldest version whose commit file is still in the log."""
    infos = fs.get_file_info(pafs.FileSelector(_LOG_DIR, recursive=False))
    versions = [
        int(i.base_name[:20])
        for i in infos
        if i.base_name.endswith(".json") and i.base_name[:20].isdigit()
    ]
    return min(versions) if versions else 0


def _remove_empty_folders(root: str) -> None:
    """Drop the empty staging folders vacuum leaves behind (a local file system keeps them)."""
    for name in os.listdir(root):
        if name.startswith(("_", ".")):
            continue
        top = os.path.join(root, name)
        if not os.path.isdir(top):
            continue
        for folder, _dirs, _files in os.walk(top, topdown=False):
            with suppress(OSError):
                os.rmdir(folder)  # fails unless empty


# ---------------------------------------------------------------------------------------------
# Reading


def read_version(
    spark: SparkSession,
    table_uri: str,
    version: int | None = None,
    storage_options: dict[str, str] | None = None,
) -> DataFrame:
    """Exactly the rows of one table version (default: latest) as a Spark DataFrame.

    Reads the version's file list: a bare folder read would also see removed and orphan files.
    """
    table = DeltaTable(table_uri, version=version, storage_options=storage_options)
    schema = _spark_schema(table)
    uris = [_spark_uri(file_path(u)) for u in table.file_uris()]
    if not uris:
        return spark.createDataFrame([], schema)
    reader = spark.read.schema(schema)
    if table.metadata().partition_columns:
        reader = reader.option("basePath", _spark_uri(table_uri.rstrip("/")))
    return reader.parquet(*uris)


@dataclass(frozen=True)
class AddedFile:
    """A data file a table version added."""

    version: int
    path: str  # relative to the table root, URL-decoded
    size: int


def _restore_target(commit_info: dict[str, Any]) -> int:
    """The version a RESTORE commit restored to."""
    params = commit_info.get("operationParameters") or {}
    target = params.get("version")
    if target is None:
        raise ValueError(f"RESTORE without a target version (by timestamp?): {commit_info}")
    return int(target)


@dataclass
class _DeltaLog:
    """Reads and caches commit files (immutable once written) of one table."""

    table_uri: str
    storage_options: dict[str, str] | None = None
    _commits: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    _fs: pafs.FileSystem | None = None
    _table: DeltaTable | None = None

    @property
    def fs(self) -> pafs.FileSystem:
        if self._fs is None:
            self._fs = table_filesystem(self.table_uri, self.storage_options)
        return self._fs

    def latest_version(self) -> int:
        if self._table is None:
            self._table = DeltaTable(self.table_uri, storage_options=self.storage_options)
        else:
            self._table.update_incremental()
        return self._table.version()

    def commit(self, version: int) -> list[dict[str, Any]]:
        if version not in self._commits:
            path = f"{_LOG_DIR}/{version:020d}.json"
            try:
                with self.fs.open_input_stream(path) as stream:
                    text = stream.read().decode("utf-8")
            except FileNotFoundError as exc:
                raise FileNotFoundError(
                    f"commit {version} of {self.table_uri} is no longer in its log "
                    "(log retention): replay from a newer version"
                ) from exc
            self._commits[version] = [json.loads(line) for line in text.splitlines() if line]
        return self._commits[version]

    def commit_info(self, version: int) -> dict[str, Any]:
        for action in self.commit(version):
            if "commitInfo" in action:
                return action["commitInfo"]
        return {}

    def lineage(self, after: int, latest: int) -> set[int]:
        """The versions in (after, latest] that the table at ``latest`` descends from.

        A RESTORE at version r to version t abandons the versions in (t, r): walking back
        from ``latest``, a RESTORE jumps to its target. Rows of abandoned versions were
        rolled back and must not be read again by a consumer that restarts from an older
        offset, or replayed from the log.
        """
        kept: set[int] = set()
        version = latest
        while version > after:
            kept.add(version)
            info = self.commit_info(version)
            version = _restore_target(info) if info.get("operation") == "RESTORE" else version - 1
        return kept

    def added_files(self, after: int, through: int, latest: int | None = None) -> list[AddedFile]:
        """Data files added by the live versions in (after, through], oldest first.

        Counts ``add`` actions with dataChange (not compaction rewrites); a RESTORE's re-adds
        are skipped (their rows came from older versions). A data-changing ``remove`` outside
        a RESTORE means the table is not append-only: rows cannot be streamed as appends.
        """
        if through <= after:
            return []
        latest = max(through, self.latest_version() if latest is None else latest)
        live = self.lineage(after, latest)
        files: list[AddedFile] = []
        for version in range(after + 1, through + 1):
            if version not in live:
                continue
            actions = self.commit(version)
            info = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
            if info.get("operation") == "RESTORE":
                continue
            for action in actions:
                if "remove" in action and action["remove"].get("dataChange", True):
                    raise ValueError(
                        f"version {version} of {self.table_uri} removes rows "
                        f"({info.get('operation')}): {SOURCE_NAME} reads append-only tables"
                    )
                add = action.get("add")
                if add is not None and add.get("dataChange", True):
                    files.append(AddedFile(version, unquote(add["path"]), int(add["size"])))
        return files


def _read_files(
    table_uri: str,
    storage_options: dict[str, str] | None,
    paths: Sequence[str],
    schema: pa.Schema,
    batch_size: int = 65_536,
) -> Iterator[pa.RecordBatch]:
    """Record batches of exactly ``schema`` from data files (missing columns become nulls)."""
    fs = table_filesystem(table_uri, storage_options)
    for path in paths:
        parquet = pq.ParquetFile(path, filesystem=fs)
        present = set(parquet.schema_arrow.names)
        columns = [f.name for f in schema if f.name in present]
        for batch in parquet.iter_batches(batch_size=batch_size, columns=columns):
            arrays = [
                batch.column(f.name).cast(f.type)
                if f.name in present
                else pa.nulls(batch.num_rows, type=f.type)
                for f in schema
            ]
            yield pa.RecordBatch.from_arrays(arrays, schema=schema)


def read_added(
    table_uri: str,
    after_version: int,
    through_version: int,
    storage_options: dict[str, str] | None = None,
) -> pa.Table:
    """The rows that the live versions in (after_version, through_version] added.

    Replays a logged edge exactly: the same rows as the ``falkirk_delta`` source yields over
    the same range, however it splits the range into micro-batches.
    """
    table_uri = table_uri.rstrip("/")
    log = _DeltaLog(table_uri, storage_options)
    latest = log.latest_version()
    through_version = min(through_version, latest)
    at = DeltaTable(table_uri, version=max(through_version, 0), storage_options=storage_options)
    schema = _arrow_schema(_spark_schema(at))
    files = log.added_files(after_version, through_version, latest)
    batches = list(_read_files(table_uri, storage_options, [f.path for f in files], schema))
    return pa.Table.from_batches(batches, schema=schema)


# ---------------------------------------------------------------------------------------------
# The streaming source


class FalkirkDeltaDataSource(DataSource):
    """``spark.readStream.format("falkirk_delta").load(table_uri)``: rows appended by versions.

    Options: ``maxVersionsPerBatch`` (default: all available), ``startingVersion`` (first
    version read; default 0), ``storage.<key>`` (delta-rs storage options).
    """

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def _uri(self) -> str:
        uri = self.options.get("path")
        if not uri:
            raise ValueError(f"{SOURCE_NAME} needs a table: .load(table_uri)")
        return uri.rstrip("/")

    def _storage_options(self) -> dict[str, str] | None:
        prefix = "storage."
        found = {k[len(prefix) :]: v for k, v in self.options.items() if k.startswith(prefix)}
        return found or None

    def schema(self) -> StructType:
        return _spark_schema(DeltaTable(self._uri(), storage_options=self._storage_options()))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        max_versions = self.options.get("maxVersionsPerBatch")
        return FalkirkDeltaStreamReader(
            table_uri=self._uri(),
            schema=schema,
            storage_options=self._storage_options(),
            max_versions_per_batch=int(max_versions) if max_versions else None,
            starting_version=int(self.options.get("startingVersion", 0)),
        )


@dataclass(frozen=True)
class _FilesPartition(InputPartition):
    """One task's files (relative paths)."""

    paths: tuple[str, ...]


class FalkirkDeltaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets are table versions: ``{"version": n}`` means every version ≤ n was read.

    Implements the (start, limit) ``latestOffset`` with a default read limit and
    ``SupportsTriggerAvailableNow`` (the pattern platform-notes prescribes: on the old
    no-argument path availableNow ran only the first batch). The reader keeps no cursor:
    batches are planned from offsets alone, so a crash replays the same range.
    """

    target_partition_bytes = 64 * 1024 * 1024

    def __init__(
        self,
        table_uri: str,
        schema: StructType,
        storage_options: dict[str, str] | None,
        max_versions_per_batch: int | None,
        starting_version: int,
    ) -> None:
        if max_versions_per_batch is not None and max_versions_per_batch < 1:
            raise ValueError("maxVersionsPerBatch must be at least 1")
        self.table_uri = table_uri
        self.storage_options = storage_options
        self.max_versions_per_batch = max_versions_per_batch
        self.starting_version = starting_version
        self.arrow_schema = _arrow_schema(schema)
        self._target: int | None = None  # availableNow: the last version of this run
        self._log: _DeltaLog | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_log"] = None  # file system handles and the commit cache stay on the driver
        return state

    @property
    def log(self) -> _DeltaLog:
        if self._log is None:
            self._log = _DeltaLog(self.table_uri, self.storage_options)
        return self._log

    def initialOffset(self) -> dict:
        return {"version": self.starting_version - 1}

    def getDefaultReadLimit(self) -> ReadLimit:
        # The built-in limit closest to "versions": each version is one commit file.
        if self.max_versions_per_batch is None:
            return ReadAllAvailable()
        return ReadMaxFiles(self.max_versions_per_batch)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self.log.latest_version()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = int(start["version"])
        latest = self._target if self._target is not None else self.log.latest_version()
        end = latest
        if self.max_versions_per_batch is not None and not isinstance(limit, ReadAllAvailable):
            end = min(latest, begin + self.max_versions_per_batch)
        return {"version": max(begin, end)}

    def reportLatestOffset(self) -> dict | None:
        return {"version": self.log.latest_version()}

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        files = self.log.added_files(int(start["version"]), int(end["version"]))
        # Tasks of at most ~64 MiB, but at least two when there are two files (2 cores).
        target = min(self.target_partition_bytes, max(1, sum(f.size for f in files) // 2))
        groups: list[list[str]] = []
        group_bytes = target
        for added in files:
            if group_bytes >= target:
                groups.append([])
                group_bytes = 0
            groups[-1].append(added.path)
            group_bytes += added.size
        return [_FilesPartition(tuple(g)) for g in groups]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, _FilesPartition)
        yield from _read_files(
            self.table_uri, self.storage_options, partition.paths, self.arrow_schema
        )

    def commit(self, end: dict) -> None:
        """Nothing to acknowledge: the table keeps its versions until vacuum."""


def register_source(spark: SparkSession) -> None:
    """Make ``spark.readStream.format("falkirk_delta")`` available in this session."""
    spark.dataSource.register(FalkirkDeltaDataSource)
