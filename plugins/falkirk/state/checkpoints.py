"""Incremental checkpoints of a region's keyed state in one Delta table.

Jobs save and restore with Spark (:meth:`CheckpointStore.save_frame`,
:meth:`CheckpointStore.restore_frame`): the state never leaves Spark, the changed keys are found
by a join and written by delta-spark. Where no Spark runs (garbage collection's compaction, a
rollback's truncation, the CLI) the same table and manifest are read and written with delta-rs
(:meth:`~CheckpointStore.save` and :meth:`~CheckpointStore.restore` are the Arrow forms).

A lazy-checkpoint region saves its state every K epochs, an eager one every epoch; either
must be able to restore exactly the state of *any* checkpoint it still offers (the frontier
solver may pick an old one), and its checkpoints must cost what changed, not the whole state.
That is Flink's incremental RocksDB checkpointing (shared/seeds/001_…txt) in Delta terms:

* The state is a table of ``key`` (string) → value columns (``value_schema``). The Delta table
  holds ``checkpoint`` (int64), ``key``, ``deleted`` (bool) and the value columns.
* :meth:`CheckpointStore.save` appends only the keys changed since the previous checkpoint
  (new or updated values, tombstones for deleted keys) as one Delta commit; the files of
  earlier checkpoints are shared by every later one, like Flink's shared SST files.
* :meth:`CheckpointStore.restore` rebuilds checkpoint ``c`` from the table version ``c``
  committed: per key the row of the newest checkpoint ``≤ c``, tombstones removed.
* :meth:`CheckpointStore.retain` is the compaction: the state at ``keep_from`` is rewritten as
  one full base, the rows of older checkpoints are removed in the same commit, and a vacuum
  deletes the files no retained checkpoint uses (Flink drops shared files no retained
  checkpoint references).

Which checkpoints exist, and the Delta version each one reads, is a *manifest* carried in the
commitInfo (custom metadata) of the very commit that writes the checkpoint's rows, so the data
and the record of it become visible together or not at all: a crash after the Parquet files
are written but before the commit leaves orphan files no version references and no listed
checkpoint (the next :meth:`~CheckpointStore.retain` vacuums the orphans). Every falkirk commit
carries the *whole* manifest (retained ids → versions, a few bytes each), not only its own
entry, so the newest falkirk commit alone answers and Delta's log cleanup of old commit files
can never lose a checkpoint. Every falkirk commit also carries the app transaction
``(falkirk.checkpoints, latest id)``: delta-rs rejects a commit when a commit of the same app id
landed after the snapshot it read, so a second writer (or a stale one) fails instead of
committing a manifest that forgets the other's checkpoint. One writer per store is the model.
"""

from __future__ import annotations

import io
import json
import operator
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import CommitProperties, Transaction

from falkirk.errors import FalkirkError
from falkirk.faults import maybe_crash
from falkirk.io.lake import (
    TableSchemaError,
    drop_log_before,
    ensure_table,
    read_table,
    table_filesystem,
    user_metadata,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

CHECKPOINT = "checkpoint"
KEY = "key"
DELETED = "deleted"
RESERVED = (CHECKPOINT, KEY, DELETED)
#: The commitInfo key of the manifest, and the app id of the writer's transaction marker.
MANIFEST_KEY = "falkirk.checkpoints"
APP_ID = "falkirk.checkpoints"
MANIFEST_FORMAT = 1
FILES_DIR = "layers"  # where Spark writes a checkpoint's Parquet files, before the commit
_HISTORY_STEPS = (4, 64, None)  # how far back to look for the newest falkirk commit


class CheckpointError(FalkirkError):
    """A checkpoint store cannot do what was asked (unknown id, bad input, wrong table)."""


class CheckpointDroppedError(CheckpointError):
    """The checkpoint asked for is older than the oldest retained one (dropped by retention)."""


class CheckpointConflictError(CheckpointError):
    """Another writer committed to the store meanwhile: one writer per store."""


@dataclass(frozen=True)
class CheckpointInfo:
    """What one :meth:`CheckpointStore.save` committed."""

    checkpoint: int
    version: int  # the Delta version the checkpoint's rows were committed in
    rows: int  # rows written: upserts + tombstones
    upserts: int
    tombstones: int
    bytes: int  # bytes of the Parquet files the commit added
    files: int


@dataclass(frozen=True)
class RetainInfo:
    """What one :meth:`CheckpointStore.retain` did."""

    keep_from: int
    dropped: list[int]
    version: int | None  # the compaction commit; None if nothing was older than keep_from
    base_rows: int = 0
    base_bytes: int = 0
    files_removed: list[str] = field(default_factory=list)
    log_files_removed: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Manifest:
    """The retained checkpoints → the Delta version :meth:`CheckpointStore.restore` reads."""

    versions: dict[int, int]

    @property
    def ids(self) -> list[int]:
        return sorted(self.versions)

    @property
    def latest(self) -> int | None:
        return max(self.versions) if self.versions else None

    def entry(self, op: str, own: Iterable[int], **extra: Any) -> dict[str, Any]:
        """The commitInfo of a commit keeping these checkpoints; ``own`` ones read this commit.

        ``None`` stands for "the version of this commit", unknown until it is committed
        (delta-rs may rebase it past commits of other writers).
        """
        own = set(own)
        retained = {str(c): (None if c in own else v) for c, v in sorted(self.versions.items())}
        retained.update({str(c): None for c in sorted(own)})
        body = {"format": MANIFEST_FORMAT, "op": op, **extra, "retained": retained}
        return {MANIFEST_KEY: body}


def table_schema(value_schema: pa.Schema) -> pa.Schema:
    """The Delta table's schema: checkpoint, key, deleted, then the values (nullable, for
    tombstones)."""
    clash = [name for name in value_schema.names if name in RESERVED]
    if clash:
        raise CheckpointError(f"value columns {clash} clash with the store's own {list(RESERVED)}")
    return pa.schema(
        [
            pa.field(CHECKPOINT, pa.int64(), nullable=False),
            pa.field(KEY, pa.string(), nullable=False),
            pa.field(DELETED, pa.bool_(), nullable=False),
            *(f.with_nullable(True) for f in value_schema),
        ]
    )


def state_schema(value_schema: pa.Schema) -> pa.Schema:
    """The schema of a state table as callers hold it: key, then the value columns."""
    return pa.schema([pa.field(KEY, pa.string()), *value_schema])


class CheckpointStore:
    """Incremental checkpoints of one region's keyed state in one Delta table."""

    def __init__(
        self,
        uri: str,
        value_schema: pa.Schema,
        storage_options: dict[str, str] | None = None,
    ) -> None:
        self.uri = str(uri).rstrip("/")
        self.value_schema = value_schema
        self.storage_options = storage_options
        self.schema = table_schema(value_schema)
        self.state_schema = state_schema(value_schema)
        self._ensure_table()

    @classmethod
    def open(cls, uri: str, storage_options: dict[str, str] | None = None
             ) -> CheckpointStore | None:
        """The store at ``uri`` with the value schema it was created with; None if none."""
        if not DeltaTable.is_deltatable(str(uri), storage_options):
            return None
        schema = pa.schema(DeltaTable(str(uri), storage_options=storage_options).schema()
                           .to_arrow())
        return cls(uri, pa.schema([f for f in schema if f.name not in RESERVED]),
                   storage_options)

    # -- table and manifest ------------------------------------------------------------------

    def _ensure_table(self) -> None:
        """Create the table with an empty manifest if missing; refuse one of another schema."""
        empty = _Manifest({}).entry("create", ())
        try:
            ensure_table(self.uri, self.schema, self.storage_options,
                         CommitProperties(custom_metadata=empty))
        except TableSchemaError as exc:
            raise CheckpointError(f"{exc}: not this checkpoint store's table") from None

    def _table(self, version: int | None = None) -> DeltaTable:
        return DeltaTable(self.uri, version=version, storage_options=self.storage_options)

    def _manifest(self, table: DeltaTable) -> _Manifest:
        """The manifest of the newest falkirk commit at or below ``table``'s version.

        Only vacuum's own commits (which carry no manifest) follow a falkirk commit, so the
        first few history entries almost always contain it.
        """
        for limit in _HISTORY_STEPS:
            history = table.history(limit=limit)
            for info in history:  # newest first
                body = (info.get(MANIFEST_KEY)
                        or user_metadata(info.get("userMetadata"), MANIFEST_KEY))
                if body is not None:
                    return _parse_manifest(body, int(info["version"]), self.uri)
            if limit is None or len(history) < limit:
                break
        raise CheckpointError(f"{self.uri} is a Delta table but no falkirk checkpoint store")

    def checkpoints(self) -> list[int]:
        """The retained checkpoint ids, oldest first."""
        return self._manifest(self._table()).ids

    def latest(self) -> int | None:
        """The newest checkpoint id, or None before the first save."""
        return self._manifest(self._table()).latest

    def version_of(self, checkpoint_id: int) -> int:
        """The Delta version :meth:`restore` reads for ``checkpoint_id``.

        The version the checkpoint committed, until a :meth:`retain` moves every retained
        checkpoint to the compaction's version (older versions lose their files): an epoch
        log should name a checkpoint by its id, not by this version.
        """
        return self._version(self._manifest(self._table()), checkpoint_id)

    def _version(self, manifest: _Manifest, checkpoint_id: int) -> int:
        if checkpoint_id in manifest.versions:
            return manifest.versions[checkpoint_id]
        ids = manifest.ids
        if not ids:
            raise CheckpointError(f"no checkpoint {checkpoint_id} in {self.uri}: it has none yet")
        if checkpoint_id < ids[0]:
            raise CheckpointDroppedError(
                f"checkpoint {checkpoint_id} of {self.uri} is not retained: the oldest retained "
                f"checkpoint is {ids[0]} (older ones were dropped by retention)"
            )
        raise CheckpointError(
            f"no checkpoint {checkpoint_id} in {self.uri} (retained: {_describe(ids)})"
        )

    # -- save ------------------------------------------------------------------------------

    def save(
        self,
        checkpoint_id: int,
        changed: pa.Table,
        deleted_keys: Sequence[str] | pa.Array | pa.ChunkedArray = (),
    ) -> CheckpointInfo:
        """Commit checkpoint ``checkpoint_id``: the rows of ``changed`` and tombstones.

        ``changed`` holds the keys whose value is new or different since the previous
        checkpoint (:func:`diff` computes it); ``deleted_keys`` the keys removed since. Ids
        must increase: an id at or below the latest raises (a replayed epoch whose checkpoint
        committed must not write it twice). A checkpoint with no changes still commits (its
        manifest entry), with no data file.
        """
        checkpoint_id = _as_id(checkpoint_id)
        upserts = self._conform(changed)
        deleted = _key_array(deleted_keys)
        _check_keys(upserts[KEY], "changed")
        _check_keys(deleted, "deleted_keys")
        if len(deleted) and len(upserts):
            both = deleted.filter(pc.is_in(deleted, value_set=upserts[KEY].combine_chunks()))
            if len(both):
                raise CheckpointError(
                    f"keys both changed and deleted in checkpoint {checkpoint_id}: "
                    f"{both.slice(0, 5).to_pylist()}"
                )
        rows = self._rows(checkpoint_id, upserts, deleted)

        table = self._table()
        manifest = self._manifest(table)
        if manifest.latest is not None and checkpoint_id <= manifest.latest:
            raise CheckpointError(
                f"checkpoint {checkpoint_id} of {self.uri} is not after the latest one, "
                f"{manifest.latest}: checkpoint ids must increase"
            )
        before = _file_sizes(table)
        metadata = manifest.entry(
            "save",
            (checkpoint_id,),
            checkpoint=checkpoint_id,
            upserts=len(upserts),
            tombstones=len(deleted),
        )
        # Trials: die mid-checkpoint (the epoch's outputs committed, this checkpoint not).
        maybe_crash("checkpoint:before-save")
        self._commit(table, rows, metadata, checkpoint_id, mode="append")
        added = {p: s for p, s in _file_sizes(table).items() if p not in before}
        return CheckpointInfo(
            checkpoint=checkpoint_id,
            version=table.version(),
            rows=rows.num_rows,
            upserts=len(upserts),
            tombstones=len(deleted),
            bytes=sum(added.values()),
            files=len(added),
        )

    def _check_columns(self, columns: list[str], what: str) -> list[str]:
        """The store's key + value column names, if ``columns`` are exactly those."""
        expected = self.state_schema.names
        missing = [n for n in expected if n not in columns]
        extra = [n for n in columns if n not in expected]
        if missing or extra:
            raise CheckpointError(
                f"{what} must have columns {expected}: missing {missing}, extra {extra}")
        return expected

    def _conform(self, changed: pa.Table) -> pa.Table:
        """``changed`` as key + value columns of the store's types, or a clear error."""
        expected = self._check_columns(changed.column_names, "changed rows")
        try:
            return changed.select(expected).cast(self.state_schema)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise CheckpointError(f"changed rows do not fit {self.state_schema}: {exc}") from exc

    def _rows(self, checkpoint_id: int, upserts: pa.Table, deleted: pa.Array) -> pa.Table:
        """The rows a checkpoint writes, sorted by key (smaller files, tight key stats)."""
        n_up, n_del = len(upserts), len(deleted)
        ids = _filled(n_up + n_del, pa.int64(), checkpoint_id)
        keys = pa.chunked_array([*upserts[KEY].chunks, deleted], type=pa.string())
        flags = pa.concat_arrays(
            [_filled(n_up, pa.bool_(), False), _filled(n_del, pa.bool_(), True)]
        )
        values = [
            pa.chunked_array([*upserts[f.name].chunks, pa.nulls(n_del, f.type)], type=f.type)
            for f in self.value_schema
        ]
        rows = pa.Table.from_arrays([ids, keys, flags, *values], schema=self.schema)
        return rows.sort_by(KEY) if rows.num_rows > 1 else rows

    def _commit(
        self,
        table: DeltaTable,
        rows: pa.Table,
        metadata: dict[str, Any],
        latest_id: int,
        *,
        mode: Literal["append", "overwrite"],
        predicate: str | None = None,
    ) -> None:
        """One Delta commit of ``rows`` and the manifest, against the snapshot ``table`` read.

        The app transaction makes delta-rs refuse the commit if another falkirk commit
        landed after that snapshot (its manifest would be lost).
        """
        properties = CommitProperties(
            custom_metadata=metadata,
            app_transactions=[Transaction(APP_ID, latest_id)],
            max_commit_retries=3,
        )
        try:
            write_deltalake(
                table,
                rows,
                mode=mode,
                predicate=predicate,
                storage_options=self.storage_options,
                commit_properties=properties,
            )
        except CommitFailedError as exc:
            raise CheckpointConflictError(
                f"another writer committed to {self.uri} while this one wrote "
                f"({exc}): one writer per checkpoint store"
            ) from exc

    # -- restore ---------------------------------------------------------------------------

    def restore(self, checkpoint_id: int) -> pa.Table:
        """The exact state at ``checkpoint_id``, sorted by key.

        Reads the table at the version the checkpoint was committed in (files of later
        checkpoints are not even listed), keeps rows of checkpoints ≤ the id, and per key the
        row of the newest one; keys whose newest row is a tombstone are absent.
        """
        checkpoint_id = _as_id(checkpoint_id)
        version = self._version(self._manifest(self._table()), checkpoint_id)
        return self._restore_at(version, checkpoint_id)

    def _restore_at(self, version: int, checkpoint_id: int) -> pa.Table:
        rows = read_table(self.uri, version, filters=[(CHECKPOINT, "<=", checkpoint_id)],
                          storage_options=self.storage_options)
        return latest_rows(rows).select(self.state_schema.names).cast(self.state_schema)

    # -- rollback --------------------------------------------------------------------------

    def truncate_after(self, through: int) -> list[int]:
        """Drop the checkpoints after ``through`` (a rollback took the region back to it).

        The region will take those checkpoints again, with the same ids, from state that
        may differ; one commit removes their rows (each save wrote its own files) and
        records the manifest without them. Returns the dropped ids.

        The commit is made even when nothing is dropped: its app transaction fences a save
        still in flight for the stopped job (Spark Connect keeps running a call whose
        client died), whose commit Delta then refuses as concurrent.
        """
        table = self._table()
        manifest = self._manifest(table)
        dropped = [c for c in manifest.ids if c > through]
        kept = _Manifest({c: v for c, v in manifest.versions.items() if c <= through})
        metadata = kept.entry("truncate", (), through=through, dropped=dropped)
        self._commit(table, self.schema.empty_table(), metadata,
                     kept.latest if kept.latest is not None else -1,
                     mode="overwrite" if dropped else "append",
                     predicate=f"{CHECKPOINT} > {int(through)}" if dropped else None)
        return dropped

    # -- retention -------------------------------------------------------------------------

    def retain_plan(self, keep_from: int) -> tuple[list[int], int, int, int]:
        """What :meth:`retain` would do, changing nothing: (the checkpoints it drops, and
        the files, rows and bytes of the layers it folds into the new base)."""
        manifest = self._manifest(self._table())
        dropped = [c for c in manifest.ids if c < keep_from]
        if not dropped:
            return [], 0, 0, 0
        actions = pa.table(self._table().get_add_actions(flatten=True))
        folded = [i for i, top in enumerate(actions[f"max.{CHECKPOINT}"].to_pylist())
                  if top is not None and top <= keep_from]
        rows = sum(actions["num_records"][i].as_py() or 0 for i in folded)
        size = sum(actions["size_bytes"][i].as_py() or 0 for i in folded)
        return dropped, len(folded), rows, size

    def retain(self, keep_from: int) -> RetainInfo:
        """Drop every checkpoint older than ``keep_from`` and delete the files only they used.

        ``keep_from`` is the newest checkpoint at or below the region's garbage-collection low
        watermark: no rollback can go below it. One commit replaces the rows of all
        checkpoints ≤ ``keep_from`` with the full state at ``keep_from`` (so the incremental
        checkpoints after it still restore exactly) and records the new manifest: every
        retained checkpoint now reads that commit's version, since the versions before it lose
        their files. Then a full vacuum with zero retention deletes removed files and the
        orphans of crashed saves; it must not run while another save is between its Parquet
        write and its commit (one writer per store). Last, the Delta log is checkpointed and
        its files older than the versions the *previous* retain left readable are deleted
        (one retain behind, so a restore that read the manifest before this one still
        finds its version): the log stays as long as the retained checkpoints need, where
        Delta keeps 30 days of commits.
        """
        keep_from = _as_id(keep_from)
        table = self._table()
        manifest = self._manifest(table)
        if keep_from not in manifest.versions:
            self._version(manifest, keep_from)  # raises the clearer error
        dropped = [c for c in manifest.ids if c < keep_from]
        if not dropped:
            return RetainInfo(keep_from=keep_from, dropped=[], version=None)
        base = self._restore_at(manifest.versions[keep_from], keep_from)
        n = base.num_rows
        rows = pa.Table.from_arrays(
            [
                _filled(n, pa.int64(), keep_from),
                base[KEY],
                _filled(n, pa.bool_(), False),
                *(base[f.name] for f in self.value_schema),
            ],
            schema=self.schema,
        )
        kept = _Manifest({c: v for c, v in manifest.versions.items() if c >= keep_from})
        before = _file_sizes(table)
        metadata = kept.entry("retain", kept.ids, keep_from=keep_from, dropped=dropped)
        assert manifest.latest is not None
        self._commit(
            table,
            rows,
            metadata,
            manifest.latest,
            mode="overwrite",
            predicate=f"{CHECKPOINT} <= {keep_from}",
        )
        version = table.version()
        added = {p: s for p, s in _file_sizes(table).items() if p not in before}
        removed = table.vacuum(
            retention_hours=0,
            dry_run=False,
            enforce_retention_duration=False,
            full=True,
        )
        table.create_checkpoint()
        readable_before = manifest.versions[manifest.ids[0]]
        logs = drop_log_before(self.uri, readable_before, self.storage_options)
        return RetainInfo(
            keep_from=keep_from,
            dropped=dropped,
            version=version,
            base_rows=n,
            base_bytes=sum(added.values()),
            files_removed=sorted(removed),
            log_files_removed=logs,
        )

    # -- Spark: how jobs save and restore ---------------------------------------------------

    def save_frame(self, checkpoint_id: int, current: DataFrame,
                   previous: DataFrame | None) -> int:
        """Commit checkpoint ``checkpoint_id`` of the state ``current``; its Delta version
        (:meth:`save_frames` of one)."""
        return self.save_frames([(checkpoint_id, current)], previous)

    def save_frames(self, states: list[tuple[int, DataFrame]],
                    previous: DataFrame | None) -> int:
        """Commit checkpoints of the states ``[(id, state), ...]`` (ids increasing) in one
        Delta commit; its version.

        The job's path: the state stays in Spark. What changed since the state before
        (``previous`` for the first, the one before it for each next; None before the
        first checkpoint ever) is found by a join on ``key`` in Spark (:func:`changes`)
        and written as Parquet by Spark in one job; delta-rs commits the files with the
        manifest naming every id and the app transaction (``falkirk.checkpoints``, the
        last id), against the snapshot whose manifest it read: a save that raced another
        commit is refused, and a replay of the same checkpoints finds them done and
        commits nothing. A pass of several epochs saves the state as of each of its due
        epochs so: one Spark job and one commit, each still restorable on its own.
        """
        from deltalake.exceptions import CommitFailedError

        from falkirk.io.delta import add_actions, spark_files, tidy_folder

        ids = [_as_id(c) for c, _ in states]
        if ids != sorted(set(ids)):
            raise CheckpointError(f"checkpoint ids of one save must increase, got {ids}")
        table = self._table()
        manifest = self._manifest(table)
        if manifest.latest is not None and ids[0] <= manifest.latest:
            raise CheckpointError(
                f"checkpoint {ids[0]} of {self.uri} is not after the latest one, "
                f"{manifest.latest}: checkpoint ids must increase"
            )
        if len(states) == 1:
            rows = changes(previous, self._conform_frame(states[0][1]), self.value_schema,
                           ids[0])
        else:
            rows = changes_many(previous, [(c, self._conform_frame(f)) for c, f in states],
                                self.value_schema)
        rows = rows.sortWithinPartitions(CHECKPOINT, KEY)
        folder = f"{FILES_DIR}/c{ids[0]}-{ids[-1]}-{uuid.uuid4().hex[:12]}"
        fs = table_filesystem(self.uri, self.storage_options)
        files = spark_files(rows, self.uri, fs, folder, [ids[0]]).get(ids[0], [])
        metadata = manifest.entry("save", ids, checkpoint=ids[-1],
                                  **({"checkpoints": ids} if len(ids) > 1 else {}))
        maybe_crash("checkpoint:before-save")
        try:
            table.create_write_transaction(
                add_actions(files, self.schema), mode="append", schema=self.schema,
                commit_properties=CommitProperties(
                    custom_metadata=metadata,
                    app_transactions=[Transaction(APP_ID, ids[-1])]))
        except CommitFailedError as exc:
            raise CheckpointConflictError(
                f"checkpoints {_describe(ids)} of {self.uri} were not committed: another "
                f"writer's commit landed after the manifest it read ({exc}; one writer per "
                "checkpoint store)") from exc
        finally:
            tidy_folder(fs, folder)
        return self._manifest(self._table()).versions[ids[-1]]

    def restore_frame(self, spark: SparkSession, checkpoint_id: int) -> DataFrame:
        """The exact state at ``checkpoint_id`` as a DataFrame (key + value columns).

        Reads the table at the version the checkpoint names (``falkirk.io.delta.read_version``),
        keeps rows of checkpoints ≤ the id and per key the newest, tombstones dropped: as
        :meth:`restore`, in Spark.
        """
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        from falkirk.io.delta import read_version

        checkpoint_id = _as_id(checkpoint_id)
        version = self._version(self._manifest(self._table()), checkpoint_id)
        rows = read_version(spark, self.uri, version, self.storage_options).filter(
            F.col(CHECKPOINT) <= checkpoint_id)
        newest = Window.partitionBy(KEY).orderBy(F.col(CHECKPOINT).desc())
        return (rows.withColumn("_falkirk_rank", F.row_number().over(newest))
                .filter((F.col("_falkirk_rank") == 1) & ~F.col(DELETED))
                .select(*self.state_schema.names))

    def _conform_frame(self, current: DataFrame) -> DataFrame:
        """``current`` as key + value columns of the store's types, or a clear error."""
        from pyspark.sql import functions as F

        expected = self._check_columns(current.columns, f"a state of {self.uri}")
        target = _spark_types(self.state_schema)
        from falkirk.io.spark import sql_type

        return current.select([F.col(f"`{n}`").cast(sql_type(target[n])).alias(n)
                               for n in expected])

    # -- comparison ------------------------------------------------------------------------

    @staticmethod
    def full_snapshot_bytes(state: pa.Table) -> int:
        """Bytes of ``state`` as one full Parquet snapshot (:func:`full_snapshot_bytes`)."""
        return full_snapshot_bytes(state)


# ---------------------------------------------------------------------------------------------
# Vectorised helpers


def latest_rows(rows: pa.Table) -> pa.Table:
    """Per key, the row of the highest checkpoint, tombstones dropped; sorted by key.

    One sort by (key, checkpoint descending) and a "first of each key" mask: no joins (Arrow
    joins refuse list/struct payload columns) and no Python loop per row.
    """
    if rows.num_rows == 0:
        return rows
    order = pc.sort_indices(
        rows.select([KEY, CHECKPOINT]),
        sort_keys=[(KEY, "ascending"), (CHECKPOINT, "descending")],
    )
    keys = rows[KEY].take(order).combine_chunks()
    first = pa.concat_arrays(
        [pa.array([True]), pc.not_equal(keys.slice(1), keys.slice(0, len(keys) - 1))]
    )
    newest = rows.take(order.filter(first))
    return newest.filter(pc.invert(newest[DELETED]))


def diff(previous: pa.Table | None, current: pa.Table) -> tuple[pa.Table, list[str]]:
    """What changed from ``previous`` to ``current`` (full states keyed by ``key``).

    Returns the rows of ``current`` whose key is new or whose value differs (in
    ``current``'s row order), and the keys of ``previous`` missing from ``current``.
    Floating-point values compare by their bits, so NaN equals NaN and ``-0.0`` differs from
    ``0.0``: a restore gives back exactly what was saved. Vectorised: a hash lookup of each
    key in the previous state and one comparison per column.
    """
    if KEY not in current.column_names:
        raise CheckpointError(f"a state needs a {KEY!r} column, got {current.column_names}")
    _check_keys(current[KEY], "current")
    if previous is None:
        return current, []
    if sorted(previous.column_names) != sorted(current.column_names):
        raise CheckpointError(
            f"states differ in columns: {previous.column_names} vs {current.column_names}"
        )
    _check_keys(previous[KEY], "previous")
    cur_keys = current[KEY].combine_chunks()
    prev_keys = previous[KEY].combine_chunks()
    if cur_keys.type != prev_keys.type:
        prev_keys = prev_keys.cast(cur_keys.type)
    position = pc.index_in(cur_keys, value_set=prev_keys)
    changed = pc.is_null(position)
    aligned = previous.take(position)  # null rows where the key is new
    for name in current.column_names:
        if name == KEY:
            continue
        same = _same(current[name], aligned[name].cast(current[name].type))
        changed = pc.or_(changed, pc.invert(same))
    kept = np.zeros(len(prev_keys), dtype=bool)  # scatter: the previous rows still present
    kept[pc.drop_null(position).to_numpy()] = True
    gone = prev_keys.filter(pa.array(~kept))
    return current.filter(changed), gone.to_pylist()


def changes(previous: DataFrame | None, current: DataFrame, value_schema: pa.Schema,
            checkpoint_id: int) -> DataFrame:
    """The rows checkpoint ``checkpoint_id`` writes, computed in Spark: the keys of
    ``current`` that are new or whose values differ from ``previous`` (null-safe equality;
    unlike :func:`diff`, Spark's, where NaN equals NaN and -0.0 equals 0.0), and a tombstone
    for each key of ``previous`` missing from ``current``.

    A null or repeated key in ``current`` fails the write of the checkpoint (a Spark
    ``raise_error`` in the plan), naming the key, so a broken state is never committed.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    values = value_schema.names
    per_key = Window.partitionBy(KEY)
    checked = current.withColumn(
        "_falkirk_check",
        F.when(F.col(KEY).isNull(), F.raise_error(F.lit("a state row has a null key")))
        .when(F.count(F.lit(1)).over(per_key) > 1,
              F.raise_error(F.concat(F.lit("state key repeated: "), F.col(KEY))))
        .otherwise(F.lit(True)),
    ).filter(F.col("_falkirk_check")).drop("_falkirk_check")
    stamp = [F.lit(checkpoint_id).cast("long").alias(CHECKPOINT), F.col(KEY)]
    if previous is None:
        return checked.select(*stamp, F.lit(False).alias(DELETED), *values)
    cur = checked.withColumn("_falkirk_cur", F.lit(True))
    prev = previous.select(F.col(KEY), *(F.col(v).alias(f"_falkirk_prev_{v}") for v in values),
                           F.lit(True).alias("_falkirk_prev"))
    joined = cur.join(prev, KEY, "full_outer")
    same = F.lit(True)
    for v in values:
        same = same & F.col(v).eqNullSafe(F.col(f"_falkirk_prev_{v}"))
    is_new = F.col("_falkirk_cur").isNotNull() & (F.col("_falkirk_prev").isNull() | ~same)
    is_gone = F.col("_falkirk_cur").isNull()
    return joined.filter(is_new | is_gone).select(
        *stamp, is_gone.alias(DELETED),
        *(F.when(is_gone, F.lit(None)).otherwise(F.col(v)).alias(v) for v in values))


def changes_many(previous: DataFrame | None, states: list[tuple[int, DataFrame]],
                 value_schema: pa.Schema) -> DataFrame:
    """:func:`changes` of each state of ``states`` (``(id, state)`` in order) against the
    one before it (``previous`` for the first), in one plan: every state tagged with its
    place and one window over the keys, instead of a join per pair (a pass of 19 epochs
    checkpointed its eager region's states pair by pair in 323 Spark stages and 105 s).

    A key gets a row at a checkpoint where it is new, back after an absence, or its values
    differ from its row in the state just before; a tombstone at the first checkpoint it
    is missing from. A key repeated in one state fails the write, naming it."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    from falkirk.io.spark import sql_type

    values = value_schema.names
    types = _spark_types(value_schema)
    ids = [c for c, _ in states]
    tagged = None
    for place, (_, state) in enumerate(states):
        part = state.select(F.lit(place).alias("_falkirk_place"), KEY, *values)
        tagged = part if tagged is None else tagged.unionByName(part)
    if previous is not None:
        tagged = previous.select(F.lit(-1).alias("_falkirk_place"), KEY, *values).unionByName(
            tagged)
    order = Window.partitionBy(KEY).orderBy("_falkirk_place")
    place = F.col("_falkirk_place")
    before, after = F.lag(place).over(order), F.lead(place).over(order)
    same = F.lit(True)
    for v in values:
        same = same & F.col(v).eqNullSafe(F.lag(F.col(v)).over(order))
    stamp = F.element_at(F.array(*[F.lit(c).cast("long") for c in ids]), place + 1)
    checked = tagged.withColumn(
        "_falkirk_check",
        F.when(F.col(KEY).isNull(), F.raise_error(F.lit("a state row has a null key")))
        .when(before == place, F.raise_error(F.concat(F.lit("state key repeated: "),
                                                      F.col(KEY))))
        .otherwise(F.lit(True)))
    marked = checked.filter("_falkirk_check").select(
        "*", before.alias("_falkirk_before"), after.alias("_falkirk_after"),
        same.alias("_falkirk_same"))
    upserts = marked.filter(
        (place >= 0) & (F.col("_falkirk_before").isNull()
                        | (F.col("_falkirk_before") != place - 1) | ~F.col("_falkirk_same"))
    ).select(stamp.alias(CHECKPOINT), F.col(KEY), F.lit(False).alias(DELETED), *values)
    gone_at = place + 1  # the next state lacks the key
    tombstones = marked.filter(
        (gone_at < len(ids)) & (F.col("_falkirk_after").isNull()
                                | (F.col("_falkirk_after") > gone_at))
    ).select(F.element_at(F.array(*[F.lit(c).cast("long") for c in ids]), gone_at + 1)
             .alias(CHECKPOINT), F.col(KEY), F.lit(True).alias(DELETED),
             *(F.lit(None).cast(sql_type(types[v])).alias(v) for v in values))
    return upserts.unionByName(tombstones)


def _spark_types(schema: pa.Schema) -> dict[str, Any]:
    from pyspark.sql.pandas.types import from_arrow_schema

    return {f.name: f.dataType for f in from_arrow_schema(schema)}


def _same(a: pa.ChunkedArray | pa.Array, b: pa.ChunkedArray | pa.Array) -> pa.Array:
    """Row-wise "equal or both null", never null; exact for floats (compared as bits)."""
    a = _combined(a)
    b = _combined(b)
    if pa.types.is_floating(a.type):
        bits = {16: pa.int16(), 32: pa.int32(), 64: pa.int64()}[a.type.bit_width]
        a, b = a.view(bits), b.view(bits)
    try:
        equal = pc.fill_null(pc.equal(a, b), False)
    except pa.ArrowNotImplementedError:
        # Nested types have no equality kernel: compare as Python values (slow, rare).
        equal = pa.array([x == y for x, y in zip(a.to_pylist(), b.to_pylist(), strict=True)])
    return pc.or_(equal, pc.and_(pc.is_null(a), pc.is_null(b)))


def full_snapshot_bytes(state: pa.Table) -> int:
    """Bytes of ``state`` written as one full Parquet snapshot, as a non-incremental store would
    write every checkpoint (same codec as delta-rs's default, snappy)."""
    sink = io.BytesIO()
    pq.write_table(state, sink, compression="snappy")
    return sink.tell()


def _filled(n: int, type_: pa.DataType, value: Any) -> pa.Array:
    """An array of ``n`` copies of ``value`` (vectorised, no Python list)."""
    return pc.fill_null(pa.nulls(n, type_), pa.scalar(value, type_))


def _combined(values: pa.ChunkedArray | pa.Array) -> pa.Array:
    if isinstance(values, pa.ChunkedArray):
        return values.combine_chunks() if values.num_chunks != 1 else values.chunk(0)
    return values


def _key_array(keys: Sequence[str] | pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(keys, pa.ChunkedArray | pa.Array):
        return _combined(keys).cast(pa.string())
    if isinstance(keys, str):
        raise CheckpointError(f"deleted_keys must be a list of keys, got the string {keys!r}")
    return pa.array(list(keys), type=pa.string())


def _check_keys(keys: pa.ChunkedArray | pa.Array, what: str) -> None:
    """Keys must be non-null and unique, or "the row of a key" means nothing."""
    if keys.null_count:
        raise CheckpointError(f"{what} has {keys.null_count} null keys")
    distinct = len(pc.unique(keys))  # a hash pass; ~3x faster than count_distinct
    if distinct != len(keys):
        counts = pc.value_counts(_combined(keys))
        dupes = counts.filter(pc.greater(counts.field("counts"), 1)).field("values")
        raise CheckpointError(
            f"{what} has {len(keys) - distinct} duplicate keys, "
            f"e.g. {dupes.slice(0, 5).to_pylist()}"
        )


def _as_id(checkpoint_id: int) -> int:
    try:
        value = operator.index(checkpoint_id)  # ints and numpy integers, not floats or bools
    except TypeError:
        value = -1
    if isinstance(checkpoint_id, bool) or value < 0:
        raise CheckpointError(f"a checkpoint id is an epoch (an int ≥ 0), got {checkpoint_id!r}")
    return value


def _file_sizes(table: DeltaTable) -> dict[str, int]:
    """Data file path → size of the table's current version."""
    actions = pa.table(table.get_add_actions(flatten=True))
    if actions.num_rows == 0:
        return {}
    return dict(zip(actions["path"].to_pylist(), actions["size_bytes"].to_pylist(), strict=True))


def _parse_manifest(body: Any, version: int, uri: str) -> _Manifest:
    if isinstance(body, str):  # tolerate a JSON string, should a writer serialise it
        body = json.loads(body)
    if not isinstance(body, dict) or body.get("format") != MANIFEST_FORMAT:
        raise CheckpointError(f"version {version} of {uri} has an unreadable manifest: {body!r}")
    versions = {int(c): (version if v is None else int(v)) for c, v in body["retained"].items()}
    return _Manifest(versions)


def _describe(ids: list[int]) -> str:
    if len(ids) <= 8:
        return ", ".join(map(str, ids))
    return f"{ids[0]}, {ids[1]}, …, {ids[-1]} ({len(ids)} in all)"
