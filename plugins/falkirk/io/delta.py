"""The durable output layer: exactly-once Delta tables, delta-rs their one writing engine.

Spark writes each epoch's rows as Parquet files; delta-rs commits them, creates, fences,
restores and deletes (so no commit of another engine can race a rollback), and reads the
tables where no Spark runs (the CLI, Airflow tasks, checks, the report):

* :class:`EpochWriter` appends one epoch (or a pass of several, each committed apart)
  with an app transaction: ``falkirk:{region}:g{generation}`` at the epoch. An epoch whose
  version the app id has reached is skipped, so one replayed after a crash is written
  once; the epoch's commit is found again by its ``txn`` action.
* :func:`rollback_table` restores a table with delta-rs's ``restore``: the same RESTORE
  commit as delta-spark's ``restoreToVersion``, without a Spark session (a rollback that
  started one paid 30 s for it: docs/faults.md). A RESTORE keeps every app's transaction
  version (delta-io/delta#1813): writers that must write epochs after the restored
  version again do so under a new generation (a new app id).
* :func:`read_version` reads one version: the Parquet files its log lists (delta-rs lists
  them), or delta-spark's ``versionAsOf`` for a table plain Parquet cannot read exactly;
  :func:`read_appends` reads only the rows one epoch appended: the files its commit
  added.
* :func:`vacuum_orphans` removes data files no kept version references (a write killed
  before its commit leaves such files); :func:`orphan_files` lists them with their sizes.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import threading
import time
import uuid
import zlib
from contextlib import suppress
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import DeltaTable as RsTable

from falkirk.errors import FalkirkError
from falkirk.faults import maybe_crash, maybe_hold
from falkirk.io.lake import (
    LOG_DIR,
    TABLE_CONFIGURATION,
    DeltaLogReader,
    NullViolation,
    TableSchemaError,
    data_files,
    file_path,
    local_path,
    log_version,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

_CREATE_ATTEMPTS = 5
_COMMIT_ATTEMPTS = 5  # an epoch's commit against a fresh snapshot, after losing a race
COMMIT_TAG = "falkirk"  # the userMetadata key of an epoch's commit: region, generation, epoch
#: The folder (inside a table's) where Spark writes the Parquet files the commits name.
FILES_DIR = "epochs"
#: The column that carries each row's epoch in a DataFrame of several epochs (a pass):
#: the writer makes a subfolder per epoch of it and commits each apart.
PASS_COLUMN = "falkirk_epoch"
logger = logging.getLogger(__name__)


def app_id_for(region: str, generation: int) -> str:
    """The app id of a writer: one per (region, generation), so a new generation rewrites."""
    return f"falkirk:{region}:g{generation}"


def fenced_below_id(region: str) -> str:
    """The app id whose transaction version is the region's generation below which every
    writer is fenced (or expired): where :func:`fence_older_generations` stops looking."""
    return f"falkirk:{region}:fenced-below"


#: How long Delta keeps an app id's transaction after its last commit (the table property
#: ``delta.setTransactionRetentionDuration``; delta-rs leaves expired ones out of the
#: snapshot). Each generation of a region writes under a new app id (:func:`app_id_for`),
#: so without it a table's snapshot kept one per rollback for ever. A live writer renews
#: its own with every commit; a dead generation's, fenced or not, goes a week after its
#: last commit, when no write of it can be in flight any more.
TRANSACTION_RETENTION = "interval 7 days"


def _now_ms() -> int:
    """The ``lastUpdated`` of a transaction written now (tests move the clock)."""
    return int(time.time() * 1000)


#: The transaction version of a fenced writer: above any epoch, so Delta would skip the
#: fenced app id's every later write as done.
FENCED = 2**62


def fence_older_generations(table_uri: str, region: str, generation: int,
                            storage_options: dict[str, str] | None = None) -> list[str]:
    """Fence the region's writers of generations before ``generation`` out of the table;
    return the app ids fenced now.

    Why: a job whose process died may leave a write running where its process was not
    (Spark Connect keeps an execution whose client went away), and it could commit after
    a rollback restored the table, or beside the epoch a newer generation wrote again.
    Delta's own transactions fence it: one commit sets the transaction version of every
    older app id of the region (one per generation, :func:`app_id_for`) to
    :data:`FENCED`. A write of such an app id in flight read its version when it began, so
    Delta's conflict check fails its commit (a concurrent ``txn`` of an app id it depends
    on); one begun later is skipped as done. Generations fenced before are not again: the
    commit names only those after the newest fenced one. The commit is tagged as the
    region's fence (``userMetadata``), which :meth:`EpochWriter.discard_orphans` steps
    over."""
    from deltalake import CommitProperties, Transaction, write_deltalake

    table = RsTable(table_uri, storage_options=storage_options)
    floor = table.transaction_version(fenced_below_id(region)) or 0
    ids = []
    for older in range(generation - 1, floor - 1, -1):  # newest first, down to a fenced one
        version = table.transaction_version(app_id_for(region, older))
        if version is not None and version >= FENCED:
            break
        ids.append(app_id_for(region, older))
    if not ids:
        return []
    first = generation - len(ids)
    tag = {COMMIT_TAG: {"region": region, "generation": generation, "fence": first}}
    empty = pa.schema(table.schema().to_arrow()).empty_table()
    now = _now_ms()
    write_deltalake(table, empty, mode="append", storage_options=storage_options,
                    commit_properties=CommitProperties(
                        app_transactions=[
                            *(Transaction(app_id, FENCED, last_updated=now) for app_id in ids),
                            Transaction(fenced_below_id(region), generation, last_updated=now)],
                        custom_metadata={"userMetadata": json.dumps(tag,
                                                                    separators=(",", ":"))}))
    return ids


def spark_uri(uri: str) -> str:
    """A location as Spark's Hadoop file systems name it (s3:// is s3a:// there)."""
    if uri.startswith("s3://"):
        return "s3a://" + uri[len("s3://") :]
    return uri


def spark_schema(schema: pa.Schema) -> StructType:
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(schema)


def _shape(fields: list[dict[str, Any]]) -> list[tuple[str, str, bool]]:
    return [(f["name"], json.dumps(f["type"], sort_keys=True), bool(f["nullable"]))
            for f in fields]


# ---------------------------------------------------------------------------------------------
# The writer


@dataclass(frozen=True)
class CommitResult:
    """What one committed epoch became: the table version the epoch log records."""

    version: int
    epoch: int
    generation: int
    app_id: str


@dataclass
class Prepared:
    """An epoch's (or a pass's) files written for a table, not committed yet."""

    epochs: list[int]
    todo: list[int]  # the epochs this generation has not committed
    folder: str
    files: dict[int, list[DataFile]]


class EpochWriter:
    """Appends a region's epochs to a Delta table exactly once per generation.

    Spark writes an epoch's rows as Parquet files into a folder of their own inside the
    table folder (``epochs/<generation>-<region>-<id>/``; a pass of several epochs, one
    subfolder per epoch); the job's process then commits each epoch's files with delta-rs,
    an ``add`` per file with its statistics read from the file's footer, and the app
    transaction (``falkirk:<region>:g<generation>``, the epoch). delta-spark's idempotent
    append rebuilt the snapshot's state with Spark jobs on every write (Delta 4.4:
    ``txnVersion`` → ``Snapshot.setTransactions``), 2-5 Spark jobs and ~0.85 s a commit;
    a delta-rs commit is a JSON file, milliseconds, no Spark job.

    Exactly once: the writer skips an epoch its app id has committed already; delta-rs's
    commit refuses (a concurrent transaction) when another commit for the same app id
    landed after the snapshot it checked, as :func:`fence_older_generations`' fence does
    for a writer of an older generation. The commit runs in the job's own process, so a
    killed job commits nothing afterwards (its Parquet files, never named by a commit, are
    vacuumed as orphans). The table's one writing engine is delta-rs: it creates the
    table, commits epochs, fences, restores and deletes; Spark only writes Parquet files
    and reads.
    """

    def __init__(
        self,
        spark: SparkSession,
        table_uri: str,
        region: str,
        generation: int,
        schema: pa.Schema,
        storage_options: dict[str, str] | None = None,
        pipeline: str = "",
    ) -> None:
        self.spark = spark
        self.table_uri = table_uri.rstrip("/")
        self.region = region
        # how errors name the writer: "pipeline p, region r, "
        self.where = (f"pipeline {pipeline!r}, " if pipeline else "") + f"region {region!r}, "
        self.generation = generation
        self.schema = schema
        self.app_id = app_id_for(region, generation)
        self.log = DeltaLogReader(self.table_uri, storage_options)
        self._ensured = False
        self._fenced_below: int | None = None  # the fence's floor, renewed by each commit

    # -- table ---------------------------------------------------------------------------

    def ensure_table(self) -> None:
        """Create the table (an empty version 0) if missing; refuse a table of another
        schema. On a table it did not create, fence the region's writers of older
        generations (:func:`fence_older_generations`) before this one writes: every
        writer ensures its table before writing, so a write of an older generation can
        still be in flight only where the table was there already."""
        if not ensure_table(self.table_uri, self.schema, self.log.storage_options):
            fence_older_generations(self.table_uri, self.region, self.generation,
                                    self.log.storage_options)
        self._fenced_below = self.log.table().transaction_version(
            fenced_below_id(self.region))
        self._ensured = True

    def committed_epoch(self) -> int | None:
        """The last epoch this (region, generation) committed, or None."""
        if not self._ensured:
            self.ensure_table()
        return self.log.table().transaction_version(self.app_id)

    def is_committed(self, epoch: int) -> bool:
        """Whether ``epoch`` is already in the table for this generation (epochs of one
        generation are committed in order)."""
        done = self.committed_epoch()
        return done is not None and done >= epoch

    # -- writing -------------------------------------------------------------------------

    def write_epoch(self, df: DataFrame, epoch: int) -> CommitResult | None:
        """Append and commit one epoch; None when this generation already committed it."""
        return self.write_epochs(df, [epoch])[epoch]

    def write_epochs(self, df: DataFrame, epochs: list[int]) -> dict[int, CommitResult | None]:
        """Append and commit several epochs written by one Spark job (a pass): ``df``'s
        rows carry their epoch in :data:`PASS_COLUMN` when there is more than one; each
        epoch is committed apart, in order, so the table has a version per epoch (a
        rollback can restore any of them). None for an epoch already committed."""
        return self.commit(self.prepare(df, epochs))

    def prepare(self, df: DataFrame, epochs: list[int]) -> Prepared:
        """The first half of :meth:`write_epochs`: Spark writes the epochs' files (not
        yet in the table), refused here when a row has a null the table declares none
        (:class:`~falkirk.io.lake.NullViolation`, nothing left behind). The loop writes
        every table of an epoch so, side by side, before it commits any."""
        epochs = sorted(epochs)
        if not self._ensured:
            self.ensure_table()
        table = self.log.table()
        done = table.transaction_version(self.app_id)
        todo = [e for e in epochs if done is None or e > done]
        if not todo:
            return Prepared(epochs, [], "", {})
        self.discard_orphans(todo[0], table.version())
        folder = f"{FILES_DIR}/g{self.generation}-{self.region}-{uuid.uuid4().hex[:12]}"
        return Prepared(epochs, todo, folder, self._write_files(df, todo, folder))

    def commit(self, prepared: Prepared) -> dict[int, CommitResult | None]:
        """The second half: commit each prepared epoch apart, in order (delta-rs, no Spark
        job); None for an epoch already committed."""
        out: dict[int, CommitResult | None] = dict.fromkeys(prepared.epochs)
        if not prepared.todo:
            return out
        maybe_crash("writer:before-commit")
        try:
            for e in prepared.todo:
                out[e] = self._commit(e, prepared.files.get(e, []))
                maybe_crash("writer:after-commit")
        finally:
            tidy_folder(self.log.fs, prepared.folder)
        return out

    def discard(self, prepared: Prepared) -> None:
        """Forget prepared files that will not be committed (their epoch is written again)."""
        if prepared.folder:
            _delete_folder(self.log.fs, prepared.folder)

    def _write_files(self, df: DataFrame, epochs: list[int], folder: str
                     ) -> dict[int, list[DataFile]]:
        """Spark writes the epochs' rows under ``folder``; epoch -> its data files. A row
        with a null where the table declares none is refused here, from the footers' null
        counts: nothing of the pass is committed."""
        many = len(epochs) > 1 or PASS_COLUMN in df.columns
        frame = self._conform(df, keep=(PASS_COLUMN,) if many else ())
        files = spark_files(frame, self.table_uri, self.log.fs, folder, epochs,
                            PASS_COLUMN if many else None)
        for epoch, parts in files.items():
            nulls = null_columns(parts, self.schema)
            if nulls:
                _delete_folder(self.log.fs, folder)
                raise NullViolation(
                    f"{self.where}epoch {epoch}: column {nulls[0]!r} of table "
                    f"{self.table_uri.rsplit('/', 1)[-1]!r} is null in a row, but the table "
                    f"declares it non-nullable; nothing of the epoch was committed (fix the "
                    f"job, or declare a dead-letter table for the region, an edge with "
                    f"schema: dead_letters, and such rows go there)")
        return files

    def _commit(self, epoch: int, parts: list[DataFile]) -> CommitResult | None:
        """One delta-rs commit of ``epoch``'s files with the app transaction, against the
        table as just read; None when a commit of this app id reached the epoch first (it
        is done, or the writer is fenced). A commit that lost to another kind (a restore,
        another writer's fence) is made again on the new snapshot."""
        from deltalake import CommitProperties, Transaction
        from deltalake.exceptions import CommitFailedError

        actions = add_actions(parts, self.schema)
        tag = {COMMIT_TAG: {"region": self.region, "generation": self.generation,
                            "epoch": epoch}}
        for attempt in range(_COMMIT_ATTEMPTS):
            table = self.log.table()  # the snapshot this commit is checked against
            done = table.transaction_version(self.app_id)
            if done is not None and done >= epoch:
                return None
            maybe_hold("writer:checked")
            try:
                table.create_write_transaction(
                    actions, mode="append", schema=self.schema,
                    commit_properties=CommitProperties(
                        # renewed by every commit (TRANSACTION_RETENTION), with the
                        # fence's floor as it was when the writer ensured its table
                        app_transactions=[
                            Transaction(self.app_id, epoch, last_updated=_now_ms()),
                            *([] if self._fenced_below is None else [Transaction(
                                fenced_below_id(self.region), self._fenced_below,
                                last_updated=_now_ms())])],
                        custom_metadata={"userMetadata": json.dumps(
                            tag, separators=(",", ":"))}))
            except CommitFailedError as exc:  # another commit landed after that snapshot
                logger.warning("%sepoch %d: commit to %s lost a race (%s); looking again",
                               self.where, epoch, self.table_uri, str(exc).splitlines()[0])
                if attempt == _COMMIT_ATTEMPTS - 1:
                    raise
                continue
            return CommitResult(version=self.log.table().version(), epoch=epoch,
                                generation=self.generation, app_id=self.app_id)
        raise AssertionError("unreachable")

    def discard_orphans(self, epoch: int, newest: int) -> int:
        """Cut off the commits of this region's ``epoch`` or later that an older generation
        left at the tail of the table (at version ``newest``); return its version after.

        A writer killed between its commit and its epoch log row leaves such a commit (the
        log does not know it, so no rollback restores it away). Its own generation finds it
        again (:meth:`version_of`); a retry in a newer generation (a batch epoch's task
        retried after a rollback of other regions) would append the epoch beside it (the
        60-minute campaign under Airflow, docs/faults.md). Each table has one writing
        region, and a rollback's RESTORE carries no region tag, so the walk stops there."""
        oldest = None
        for version in range(newest, 0, -1):
            tag = self.log.commit_tag(version, COMMIT_TAG)
            mine = isinstance(tag, dict) and tag.get("region") == self.region
            if mine and "fence" in tag:  # a fence of older writers adds no rows
                continue
            if not (mine and int(tag.get("generation", self.generation)) < self.generation
                    and int(tag.get("epoch", -1)) >= epoch):
                break
            oldest = version
        if oldest is None:
            return newest
        logger.warning("%sepoch %d: versions %d-%d of %s are its commits of epoch %d or "
                       "later in an older generation that the epoch log does not know (a "
                       "writer killed before its log row); restoring version %d first",
                       self.where, epoch, oldest, newest, self.table_uri, epoch, oldest - 1)
        return rollback_table(self.table_uri, oldest - 1, self.log.storage_options)

    def version_of(self, epoch: int) -> int | None:
        """The version that committed ``epoch`` in this generation (for a writer restarted
        after a crash between its commit and the epoch log's row), or None."""
        return self.log.find_txn(self.app_id, epoch, self.log.table().version())

    def _conform(self, df: DataFrame, keep: tuple[str, ...] = ()) -> DataFrame:
        """The DataFrame with the table's columns, in order and of the table's types (and
        the ``keep`` columns after them)."""
        from pyspark.sql import functions as F

        target = spark_schema(self.schema)
        kept = [c for c in keep if c in df.columns]
        if [(f.name, f.dataType) for f in df.schema] == \
                [(f.name, f.dataType) for f in target] + [(c, df.schema[c].dataType)
                                                          for c in kept]:
            return df
        missing = [f.name for f in target if f.name not in df.columns]
        if missing:
            raise TableSchemaError(
                f"epoch DataFrame of region {self.region!r} lacks columns {missing} of "
                f"{self.table_uri}")
        from falkirk.io.spark import sql_type

        return df.select([F.col(f"`{f.name}`").cast(sql_type(f.dataType)).alias(f.name)
                          for f in target] + [F.col(c) for c in kept])


@dataclass(frozen=True)
class DataFile:
    """A Parquet file Spark wrote into a table's folder, before a commit names it."""

    path: str  # relative to the table's folder
    meta: pq.FileMetaData  # its footer
    size: int


def spark_files(df: DataFrame, table_uri: str, fs: pafs.FileSystem, folder: str,
                keys: list[int], column: str | None = None) -> dict[int, list[DataFile]]:
    """Spark writes ``df`` as Parquet under ``<table>/<folder>`` (one Spark job; with
    ``column``, a subfolder per value of it, the column left out of the files); key ->
    the files with rows (a single key without ``column``). Footers are read from the
    client: a commit needs their row counts and statistics."""
    from pyspark.sql import functions as F

    writer = df.write.mode("error")
    if column is not None:
        writer = df.filter(F.col(column).isin(keys)).write.mode("error").partitionBy(column)
    writer.parquet(spark_uri(f"{table_uri.rstrip('/')}/{folder}"))
    files: dict[int, list[DataFile]] = {}
    for info in fs.get_file_info(pafs.FileSelector(folder, recursive=True,
                                                    allow_not_found=True)):
        name = info.path.lstrip("/")
        inside = name[len(folder):]
        if info.type != pafs.FileType.File or not name.endswith(".parquet") \
                or "/_" in inside or "/." in inside:
            continue
        key = keys[0] if column is None else int(inside.lstrip("/").split("/", 1)[0]
                                                 .split("=", 1)[1])
        with fs.open_input_file(name) as f:
            meta = pq.read_metadata(f)
        if meta.num_rows:
            files.setdefault(key, []).append(DataFile(name, meta, info.size or 0))
    return files


def add_actions(files: list[DataFile], schema: pa.Schema) -> list[Any]:
    """The ``add`` actions that commit these files, with their statistics."""
    from deltalake.transaction import AddAction

    now = int(time.time() * 1000)
    return [AddAction(f.path, f.size, {}, now, True, _stats(f.meta, schema)) for f in files]


def tidy_folder(fs: pafs.FileSystem, folder: str) -> None:
    """Drop what Spark's committer leaves beside the data files (``_SUCCESS``, the local
    file system's ``.crc`` checksums): files no commit names, forever."""
    with suppress(OSError, FileNotFoundError):
        for info in fs.get_file_info(pafs.FileSelector(folder, recursive=True)):
            base = info.base_name
            if info.type == pafs.FileType.File and (base == "_SUCCESS"
                                                    or base.endswith(".crc")):
                fs.delete_file(info.path)


def _delete_folder(fs: pafs.FileSystem, folder: str) -> None:
    with suppress(OSError, FileNotFoundError):
        fs.delete_dir(folder)


def null_columns(files: list[DataFile], schema: pa.Schema) -> list[str]:
    """The columns the table declares non-nullable that hold a null in these files (from
    the footers' null counts; a footer without statistics counts as none)."""
    required = [f.name for f in schema if not f.nullable]
    found = []
    for file in files:
        names = file.meta.schema.names
        for rg in range(file.meta.num_row_groups):
            group = file.meta.row_group(rg)
            for name in required:
                if name in names and name not in found:
                    stats = group.column(names.index(name)).statistics
                    if stats is not None and stats.has_null_count and stats.null_count:
                        found.append(name)
    return found


def _stats(meta: pq.FileMetaData, schema: pa.Schema) -> str:
    """The ``add`` action's statistics of one Parquet file (Delta's ``stats`` JSON):
    numRecords, and per column its min, max and null count where the footer has them, so
    readers can count rows and prune files."""
    names = meta.schema.names
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    for field in schema:
        if field.name not in names:
            continue
        i = names.index(field.name)
        lo = hi = None
        count, complete = 0, True
        for rg in range(meta.num_row_groups):
            st = meta.row_group(rg).column(i).statistics
            if st is None or not st.has_null_count:
                complete = False
                break
            count += st.null_count
            if st.has_min_max:
                lo = st.min if lo is None else min(lo, st.min)
                hi = st.max if hi is None else max(hi, st.max)
        if not complete:
            continue
        nulls[field.name] = count
        value = _stat_value(field.type, lo), _stat_value(field.type, hi)
        if None not in value:
            mins[field.name], maxs[field.name] = value
    return json.dumps({"numRecords": meta.num_rows, "minValues": mins, "maxValues": maxs,
                       "nullCount": nulls}, separators=(",", ":"))


def _stat_value(typ: pa.DataType, value: Any) -> Any:
    """A footer's min or max as Delta's stats JSON holds it, or None to leave it out
    (strings longer than Delta's 32-character prefix, floats that are not finite, types
    whose footer value is not the logical one)."""
    if value is None:
        return None
    if pa.types.is_boolean(typ):
        return bool(value)
    if pa.types.is_integer(typ):
        return int(value)
    if pa.types.is_floating(typ):
        return float(value) if value == value and abs(value) != float("inf") else None
    if pa.types.is_string(typ):
        text = value.decode() if isinstance(value, bytes) else str(value)
        return text if len(text) <= 32 else None
    return None


def ensure_table(table_uri: str, schema: pa.Schema,
                 storage_options: dict[str, str] | None = None) -> bool:
    """Create a data table with delta-rs (an empty version 0) if missing; refuse one of
    another schema (names, types and nullability). Whether this call created it."""
    expected = _shape(json.loads(spark_schema(schema).json())["fields"])
    created = False
    for attempt in range(_CREATE_ATTEMPTS):
        if RsTable.is_deltatable(table_uri, storage_options):
            break
        _clear_unborn_log(table_uri)
        try:
            RsTable.create(table_uri, schema, mode="error", storage_options=storage_options,
                           configuration={**{k: v for k, v in TABLE_CONFIGURATION.items()
                                             if v is not None},
                                          "delta.setTransactionRetentionDuration":
                                              TRANSACTION_RETENTION,
                                          **checkpoint_interval(table_uri)})
            created = True
            break
        except Exception:  # another job created it at the same moment: look again
            if attempt == _CREATE_ATTEMPTS - 1:
                raise
            time.sleep(0.1 * (attempt + 1))
    found = json.loads(RsTable(table_uri, storage_options=storage_options).schema().to_json())
    if _shape(found["fields"]) != expected:
        raise TableSchemaError(f"{table_uri} has schema {json.dumps(found)}, its writer "
                               f"writes {spark_schema(schema).json()}")
    return created


def checkpoint_interval(table_uri: str) -> dict[str, str]:
    """``delta.checkpointInterval`` of a table: 50-99 commits, by the table's name. Every
    table commits once an epoch, so one interval for all made every table write its log
    checkpoint in the same epoch."""
    name = table_uri.rstrip("/").rsplit("/", 1)[-1]
    return {"delta.checkpointInterval": str(50 + zlib.crc32(name.encode()) % 50)}


def _clear_unborn_log(table_uri: str) -> None:
    """Remove the ``_delta_log`` folder a creation killed before its first commit left.

    delta-spark makes the folder first: with no commit in it, delta-spark takes the path
    for a table and refuses to create one (DELTA_TABLE_NOT_FOUND), delta-rs takes it for
    none, so the table's job failed at every restart (the fault campaign's serve, killed as
    it created ``query_stats``). Only a local folder can be left so: an object store has
    no empty folders. A concurrent creator whose temporary file goes with it retries."""
    local = local_path(table_uri)
    if local is None:
        return
    log_dir = os.path.join(local, LOG_DIR)
    try:
        names = os.listdir(log_dir)
    except (FileNotFoundError, NotADirectoryError):
        return
    if any(n[:1].isdigit() or n == "_last_checkpoint" for n in names):
        return  # a commit or checkpoint: a table, not an unborn one
    logger.warning("%s: a _delta_log with no commit (%s), left by a creation killed before "
                   "its first commit; creating the table again", table_uri,
                   ", ".join(sorted(names)) or "empty")
    shutil.rmtree(log_dir, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# Recovery


class RestoreError(FalkirkError, ValueError):
    """A table cannot be restored to the version asked for."""


def rollback_table(table_uri: str, to_version: int,
                   storage_options: dict[str, str] | None = None) -> int:
    """Make readers see exactly the table as at ``to_version``; return the version that does.

    The RESTORE is one atomic commit that also restores metadata and schema and re-adds
    files removed since; it fails when vacuum has deleted files of ``to_version``. The
    rolled-back versions stay readable by time travel until vacuumed. A no-op when the
    table is at ``to_version``, and when version 0 (the empty table its writer creates
    first) is asked for and the table does not exist: its writer died before creating it,
    so nothing was committed (found by ``falkirk trials``: a kill in epoch 0).
    """
    if to_version == 0 and not RsTable.is_deltatable(table_uri, storage_options):
        return 0
    log = DeltaLogReader(table_uri, storage_options)
    current = log.table().version()
    if to_version > current or to_version < 0:
        raise RestoreError(f"cannot roll {table_uri} at version {current} back to {to_version}")
    if to_version == current:
        return current
    RsTable(table_uri, storage_options=storage_options).restore(to_version)
    # The RESTORE is the newest commit whose target is to_version (writers are stopped).
    newest = log.table().version()
    for version in range(newest, current, -1):
        info = log.commit_info(version)
        target = (info.get("operationParameters") or {}).get("version")
        if info.get("operation") == "RESTORE" and target is not None \
                and int(target) == to_version:
            return version
    raise RestoreError(f"RESTORE of {table_uri} to {to_version} not found in its log")


def orphan_files(
    table_uri: str,
    retention_hours: float | None = None,
    *,
    keep_from_version: int | None = None,
    storage_options: dict[str, str] | None = None,
) -> dict[str, int]:
    """Data files no kept version references, older than ``retention_hours`` (default
    168): relative path -> bytes.

    Every version from ``keep_from_version`` (default: the oldest still in the log) stays
    readable: the files live at that version and every file a later commit added are
    kept (one table load and one read of each later commit file, not a load per version).
    A writer between its file write and its commit has such files too until it commits:
    hence the retention.
    """
    log = DeltaLogReader(table_uri, storage_options)
    latest = log.table().version()
    first = _earliest_log_version(log.fs) if keep_from_version is None else keep_from_version
    first = min(max(first, 0), latest)
    kept = {_relative(table_uri, uri) for uri in
            RsTable(table_uri, version=first, storage_options=storage_options).file_uris()}
    kept.update(log.add_versions(first, latest))
    horizon = time.time() - 3600 * (168 if retention_hours is None else retention_hours)
    found: dict[str, int] = {}
    for info in log.fs.get_file_info(pafs.FileSelector("", recursive=True)):
        path = info.path.lstrip("/")
        top = path.split("/", 1)[0]
        if (info.type != pafs.FileType.File or top.startswith(("_", "."))
                or not path.endswith(".parquet") or path in kept):
            continue
        if info.mtime_ns is not None and info.mtime_ns / 1e9 > horizon:
            continue
        found[path] = info.size or 0
    return found


def vacuum_orphans(
    table_uri: str,
    retention_hours: float | None = None,
    *,
    keep_from_version: int | None = None,
    dry_run: bool = False,
    storage_options: dict[str, str] | None = None,
) -> list[str]:
    """Delete the :func:`orphan_files` of a table; return them, relative to the table root.

    Files only: the table's log is not written (data tables are written by delta-spark;
    delta-rs only restores them), so time travel to every kept version still works."""
    found = orphan_files(table_uri, retention_hours, keep_from_version=keep_from_version,
                         storage_options=storage_options)
    if not dry_run:
        fs = DeltaLogReader(table_uri, storage_options).fs
        for path in found:
            fs.delete_file(path)
        local = local_path(table_uri)
        if local is not None:
            _remove_empty_folders(local)
    return sorted(found)


def _relative(table_uri: str, uri: str) -> str:
    """A file of ``table_uri`` named relative to the table root."""
    root = table_uri.rstrip("/")
    local = local_path(root)
    path = file_path(uri)
    if local is not None:
        root = local
    return path[len(root) + 1:] if path.startswith(root + "/") else path


def _earliest_log_version(fs: pafs.FileSystem) -> int:
    """The oldest version whose commit file is still in the log."""
    infos = fs.get_file_info(pafs.FileSelector(LOG_DIR, recursive=False))
    versions = [v for i in infos
                if i.base_name.endswith(".json") and (v := log_version(i.base_name)) is not None]
    return min(versions) if versions else 0


def _remove_empty_folders(root: str) -> None:
    """Drop empty folders under the table root (a local file system keeps them)."""
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
    epochs: tuple[int, int] | None = None,
) -> DataFrame:
    """Exactly the rows of one table version (default: latest) as a Spark DataFrame; with
    ``epochs=(lo, hi)`` only the rows of those epochs (inclusive), reading only the files
    whose statistics say they hold some (a window over a growing table reads its window,
    not its history).

    A table of reader version 1 without partition columns (every table falkirk creates:
    no deletion vectors, no column mapping) is, by the Delta protocol, the union of the
    Parquet files its log lists at that version. delta-rs lists them in the driver (bounded
    metadata, no Spark job) and Spark reads them as Parquet with that version's schema.
    delta-spark's ``versionAsOf`` read first builds the version's snapshot and filters its
    file list with two Spark jobs per read, and an epoch reads each side input at a new
    version: a serve epoch paid 6 of its 45 Spark jobs for its three (docs/jobs.md). Any
    other table (other reader features, partitions) is read by delta-spark.
    """
    from pyspark.sql import functions as F

    uri = table_uri.rstrip("/")
    files = _plain_files(uri, version, storage_options, epochs)
    if files is None:
        reader = spark.read.format("delta")
        if version is not None:
            reader = reader.option("versionAsOf", version)
        df = reader.load(spark_uri(uri))
    else:
        schema, paths = files
        if not paths:
            return spark.createDataFrame([], schema)
        df = spark.read.schema(schema).parquet(*(spark_uri(path) for path in paths))
    if epochs is not None:
        df = df.filter(F.col("epoch").between(*epochs))
    return df


_TABLES: dict[tuple[str, str], Any] = {}  # (uri, options) -> a delta-rs table kept open
_TABLES_LOCK = threading.Lock()


def table_at(table_uri: str, version: int | None,
             storage_options: dict[str, str] | None = None) -> Any:
    """A delta-rs table at ``version`` (latest: None), kept open per table in this
    process and moved to each version asked for: a job reads its inputs at a newer
    version every epoch, and opening the table anew replayed its log each time."""
    key = (table_uri, json.dumps(storage_options or {}, sort_keys=True))
    with _TABLES_LOCK:
        table = _TABLES.get(key)
        if table is None:
            table = RsTable(table_uri, version=version, storage_options=storage_options)
            _TABLES[key] = table
        elif version is None:
            table.update_incremental()
        elif table.version() != version:
            table.load_as_version(version)
        return table


_GLOB = re.compile(r"[*?\[\]{}\\]")  # Spark globs a path it reads as Parquet


def _plain_files(table_uri: str, version: int | None,
                 storage_options: dict[str, str] | None,
                 epochs: tuple[int, int] | None = None
                 ) -> tuple[StructType, list[str]] | None:
    """(schema, data files) of a table version that plain Parquet reads exactly, else
    None (reader features such as deletion vectors or column mapping, partition columns,
    a location Spark would take for a glob pattern). With ``epochs``, only the files whose
    ``epoch`` statistics overlap them (files without statistics are kept)."""
    table = table_at(table_uri, version, storage_options)
    with _TABLES_LOCK:  # the table object may be moved by another reader meanwhile
        if version is not None and table.version() != version:
            table.load_as_version(version)
        if table.protocol().min_reader_version > 1 or table.metadata().partition_columns:
            return None
        schema = spark_schema(pa.schema(table.schema().to_arrow()))
        if epochs is None:
            relative = data_files(table, table_uri)
        else:
            actions = pa.table(table.get_add_actions(flatten=True))
            lo = (actions["min.epoch"].to_pylist() if "min.epoch" in actions.column_names
                  else [None] * actions.num_rows)
            hi = (actions["max.epoch"].to_pylist() if "max.epoch" in actions.column_names
                  else [None] * actions.num_rows)
            relative = [unquote(path) for path, a, b in
                        zip(actions["path"].to_pylist(), lo, hi, strict=True)
                        if a is None or b is None or (a <= epochs[1] and b >= epochs[0])]
    paths = [f"{table_uri}/{path}" for path in relative]
    if any(_GLOB.search(path) for path in [table_uri, *paths]):
        return None
    return schema, paths


def read_appends(spark: SparkSession, table_uri: str, version: int, epoch: int,
                 storage_options: dict[str, str] | None = None) -> DataFrame:
    """The rows the sender appended for ``epoch``: those of the files its commit
    ``version`` (the one the epoch log names) added, read as Parquet.

    A region that follows a growing table reads each epoch's increment this way instead of
    the whole snapshot. By the Delta protocol a commit's ``add`` actions are exactly the
    rows it appended (a table without deletion vectors or column mapping: every table
    falkirk creates); the commit file lists them, so the driver reads one small JSON file
    and Spark reads only those Parquet files, filtered by their ``epoch`` column. A table
    plain Parquet cannot read exactly (:func:`_plain_files`) is read as that version,
    filtered by ``epoch`` (the same rows, at the cost of the whole snapshot).
    """
    return read_appends_of(spark, table_uri, [(version, epoch)], storage_options)


def read_appends_of(spark: SparkSession, table_uri: str, commits: list[tuple[int, int]],
                    storage_options: dict[str, str] | None = None) -> DataFrame:
    """:func:`read_appends` of several commits ``(version, epoch)`` in one Parquet read
    (a pass of several epochs: a union of a read per epoch made a plan too deep for Spark
    Connect's messages)."""
    from pyspark.sql import functions as F

    uri = table_uri.rstrip("/")
    newest = max(v for v, _ in commits)
    epochs = sorted({e for _, e in commits})
    files = _plain_files(uri, newest, storage_options)
    if files is None:
        return read_version(spark, uri, newest, storage_options).filter(
            F.col("epoch").isin(epochs))
    schema, _ = files
    if "epoch" not in schema.fieldNames():
        raise FalkirkError(f"{table_uri}: read: appends needs an epoch column, which this "
                           f"table does not have (columns: {', '.join(schema.fieldNames())})")
    log = DeltaLogReader(uri, storage_options)
    paths = [f"{uri}/{path}" for v in sorted({v for v, _ in commits})
             for path in log.added_files(v)]
    if not paths:  # epochs with no rows (or commits that appended nothing)
        return spark.createDataFrame([], schema)
    return (spark.read.schema(schema).parquet(*(spark_uri(p) for p in paths))
            .filter(F.col("epoch").isin(epochs)))
