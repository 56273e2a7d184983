"""Reading Delta tables without Spark: a version's file list, read with pyarrow.

delta-rs's own ``to_pyarrow_table``/``to_pyarrow_dataset`` read through a Python file
system that its threads call back into; on this platform the process then often aborts at
exit ("terminate called without an active exception", delta-io/delta-rs#2184). Reading the
version's ``file_uris()`` with pyarrow's own file systems is exact (removed files are not
listed) and exits cleanly. Light on imports: no Spark.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from falkirk.errors import FalkirkError
from falkirk.faults import maybe_crash

#: Table properties of every table we create: delta-rs deletes and overwrites fail with
#: deletion vectors, and column mapping would make the Parquet column names differ from
#: the logical ones (and from Spark's).
TABLE_CONFIGURATION: dict[str, str | None] = {
    "delta.enableDeletionVectors": "false",
    "delta.columnMapping.mode": "none",
}


LOG_DIR = "_delta_log"
#: What a compaction's commit (:meth:`AppendOrder.compact`) carries in its commit info: the
#: version it read. The one file it adds holds the rows of every file live then, in their
#: order, so it takes their place in the log's order: before every file added since.
COMPACTED_THROUGH = "falkirk.compactedThrough"
#: An append-only table is compacted once it has this many files (each append adds one).
COMPACT_MIN_FILES = 64
#: A compaction deletes the files earlier compactions took out of the table this many
#: hours before (Delta's VACUUM; only those files: it never lists files no commit names).
#: A reader opens the files of the version it just read within seconds, so an hour is
#: ample; without it a pipeline that runs for weeks keeps every one-row file it appended.
VACUUM_AFTER_HOURS = 1


class TableSchemaError(FalkirkError, ValueError):
    """A table exists with another schema than the one its writer writes."""


class NullViolation(TableSchemaError):
    """An epoch's rows hold a null in a column the table declares non-nullable (Delta
    refused the commit: nothing of the epoch was written)."""


def ensure_table(table_uri: str, schema: pa.Schema,
                 storage_options: dict[str, str] | None = None, commit_properties=None):
    """The table at ``table_uri``, created (an empty version 0) if missing; a table of
    another schema is refused."""
    import json

    from deltalake import DeltaTable
    from deltalake import Schema as DeltaSchema

    if not DeltaTable.is_deltatable(table_uri, storage_options):
        DeltaTable.create(
            table_uri, schema,
            mode="ignore",  # another process may create it at the same moment
            configuration=TABLE_CONFIGURATION, storage_options=storage_options,
            commit_properties=commit_properties,
        )
    table = DeltaTable(table_uri, storage_options=storage_options)
    expected = json.loads(DeltaSchema.from_arrow(schema).to_json())
    if json.loads(table.schema().to_json()) != expected:
        raise TableSchemaError(f"{table_uri} has schema {table.schema().to_json()}, "
                               f"its writer writes {json.dumps(expected)}")
    return table


def local_path(table_uri: str) -> str | None:
    """The local folder of a table URI, or None for an object store."""
    if "://" not in table_uri:
        return os.path.abspath(table_uri)
    parsed = urlparse(table_uri)
    if parsed.scheme == "file":
        return unquote(parsed.path)
    return None


def table_filesystem(table_uri: str, storage_options: dict[str, str] | None) -> pafs.FileSystem:
    """A pyarrow file system rooted at the table folder (paths are relative to the root).

    Local tables use pyarrow's own file system (fast footer and data reads); object stores go
    through delta-rs's storage handler so the same ``storage_options`` work as for the table.
    """
    local = local_path(table_uri)
    if local is not None:
        return pafs.SubTreeFileSystem(local, pafs.LocalFileSystem())
    from deltalake.fs import DeltaStorageHandler

    return pafs.PyFileSystem(DeltaStorageHandler(table_uri, storage_options))


def version_dataset(table_uri: str, version: int | None = None,
                    storage_options: dict[str, str] | None = None) -> ds.Dataset:
    """Exactly the files of one version of a Delta table (default: the latest), as a
    pyarrow dataset: count or read rows with a filter without loading the rest."""
    from deltalake import DeltaTable

    table = DeltaTable(table_uri, version=version, storage_options=storage_options)
    schema = pa.schema(table.schema().to_arrow())
    return ds.dataset(data_files(table, table_uri), schema=schema, format="parquet",
                      filesystem=table_filesystem(table_uri.rstrip("/"), storage_options))


def data_files(table: Any, table_uri: str) -> list[str]:
    """The data files of a delta-rs table as loaded, relative to its folder (the paths
    :func:`table_filesystem` takes)."""
    root = table_uri.rstrip("/")
    return [uri[len(root) + 1:] if uri.startswith(root + "/") else uri
            for uri in (file_path(u) for u in table.file_uris())]


def read_table(table_uri: str, version: int | None = None,
               filters: list[tuple[str, str, Any]] | None = None,
               storage_options: dict[str, str] | None = None) -> pa.Table:
    """Exactly the rows of one version of a Delta table (default: the latest)."""
    dataset = version_dataset(table_uri, version, storage_options)
    return dataset.to_table(filter=pq.filters_to_expression(filters) if filters else None)


def log_version(name: str) -> int | None:
    """The version a Delta log file is of, by its name's 20 digits (``…0042.json``,
    ``…0040.checkpoint.parquet``, ``…0042.crc``); None for another file."""
    head = name.split(".", 1)[0]
    return int(head) if head.isdigit() and len(head) == 20 else None


def drop_log_before(table_uri: str, version: int,
                    storage_options: dict[str, str] | None = None) -> list[str]:
    """Delete the Delta log files no version ≥ ``version`` needs; the names deleted.

    A version is read from the newest Delta checkpoint at or below it and the commits after
    that checkpoint, so every log file (commit, checksum, checkpoint) older than the newest
    checkpoint at or below ``version`` goes; nothing goes without such a checkpoint. Delta's
    own cleanup (``delta.logRetentionDuration``) goes by age and would delete the commits of
    versions a store still time-travels to; this goes by version, the caller's bound.
    """
    fs = table_filesystem(table_uri.rstrip("/"), storage_options)
    names = [info.base_name for info in fs.get_file_info(pafs.FileSelector(LOG_DIR))
             if info.type == pafs.FileType.File]
    checkpoints = [v for n in names if ".checkpoint" in n
                   and (v := log_version(n)) is not None and v <= version]
    if not checkpoints:
        return []
    base = max(checkpoints)
    gone = sorted(n for n in names if (v := log_version(n)) is not None and v < base)
    for name in gone:
        with contextlib.suppress(FileNotFoundError):  # another cleanup was first
            fs.delete_file(f"{LOG_DIR}/{name}")
    return gone


def file_path(uri: str) -> str:
    """file:///x/y -> /x/y; /x/a%20b -> /x/a b (file_uris() percent-encodes local paths)."""
    parsed = urlparse(uri)
    return unquote(parsed.path) if parsed.scheme in ("file", "") else uri


# ---------------------------------------------------------------------------------------------
# A table's commit log


class DeltaLogReader:
    """Reads one table's commit files (immutable once written), caching them."""

    def __init__(self, table_uri: str, storage_options: dict[str, str] | None = None):
        self.table_uri = table_uri.rstrip("/")
        self.storage_options = storage_options
        self._fs: pafs.FileSystem | None = None
        self._table: Any = None
        self._commits: dict[int, list[dict[str, Any]]] = {}

    @property
    def fs(self) -> pafs.FileSystem:
        if self._fs is None:
            self._fs = table_filesystem(self.table_uri, self.storage_options)
        return self._fs

    def table(self, refresh: bool = True) -> Any:
        """The table at its latest version (a delta-rs ``DeltaTable``, reading only);
        ``refresh=False``: as last read, when the caller has just refreshed it."""
        from deltalake import DeltaTable

        if self._table is None:
            self._table = DeltaTable(self.table_uri, storage_options=self.storage_options)
        elif refresh:
            self._table.update_incremental()
        return self._table

    def commit(self, version: int) -> list[dict[str, Any]]:
        if version not in self._commits:
            path = f"{LOG_DIR}/{version:020d}.json"
            with self.fs.open_input_stream(path) as stream:
                text = stream.read().decode("utf-8")
            self._commits[version] = [json.loads(line) for line in text.splitlines() if line]
        return self._commits[version]

    def added_files(self, version: int) -> list[str]:
        """The data files the commit of ``version`` added, relative to the table's folder
        (the protocol's ``add.path`` is a relative URI, percent-encoded)."""
        return [unquote(a["add"]["path"]) for a in self.commit(version)
                if "add" in a and a["add"].get("dataChange", True)]

    def commit_info(self, version: int) -> dict[str, Any]:
        return next((a["commitInfo"] for a in self.commit(version) if "commitInfo" in a), {})

    def commit_tag(self, version: int, key: str) -> Any:
        """What the commit of ``version`` carries under ``key`` in its ``userMetadata``
        (falkirk's writers tag their commits there), or None."""
        return user_metadata(self.commit_info(version).get("userMetadata"), key)

    def find_txn(self, app_id: str, epoch: int, newest: int, oldest: int = 0) -> int | None:
        """The version whose commit carries the transaction ``(app_id, epoch)``, searching
        from ``newest`` down to ``oldest``."""
        for version in range(newest, oldest - 1, -1):
            try:
                actions = self.commit(version)
            except FileNotFoundError:  # older commits left the log (log retention)
                return None
            for action in actions:
                txn = action.get("txn")
                if txn is not None and txn.get("appId") == app_id and txn.get("version") == epoch:
                    return version
        return None

    def add_versions(self, since: int, through: int,
                     wanted: set[str] | None = None) -> dict[str, int]:
        """Data file (relative path) -> the version that added it, for versions in
        (since, through] whose commit files are still in the log; a compaction's file ->
        the version it read (:data:`COMPACTED_THROUGH`). With ``wanted``, only those files,
        the newest commits first, stopping once all are found: a compacted table's live
        files are all recent, so a new reader does not read every commit since the first."""
        out: dict[str, int] = {}
        versions = range(since + 1, through + 1)
        for version in versions if wanted is None else reversed(versions):
            try:
                actions = self.commit(version)
            except FileNotFoundError:  # left the log (log retention): older than the rest
                continue
            read = self.commit_info(version).get(COMPACTED_THROUGH)
            for action in actions:
                path = unquote(action["add"]["path"]) if "add" in action else None
                if path is not None and (wanted is None or path in wanted):
                    out[path] = version if read is None else int(read)
            if wanted is not None and len(out) == len(wanted):
                break
        return out


class AppendOrder:
    """Rows of an append-only table in the order they were committed: by the Delta version
    that added their file, then their place in the file. The log's own order, which no
    clock step can change (a ``recorded_at`` column is only a wall clock).

    A Delta data file never changes once written, so each file is read once and its rows
    kept (per filter): a read opens only the files added since the last one. Reading every
    file each time cost 0.73 s of CPU a call at 700 appends (``falkirk bench log``; an
    hour's campaign leaves about that many), and jobs, the supervisor and the campaign all
    read the log often.
    """

    def __init__(self, table_uri: str, storage_options: dict[str, str] | None = None):
        self.log = DeltaLogReader(table_uri, storage_options)
        self._versions: dict[str, int] = {}
        self._through = -1
        self._schema: pa.Schema | None = None
        self._rows: dict[str, dict[str, list[dict]]] = {}  # filters -> file -> its rows
        self._lock = threading.Lock()  # a lease's renewing thread reads the same log
        self._checkpointed: int | None = None  # the version the last fold checkpointed

    def read(self, filters: list[tuple[str, str, Any]] | None = None) -> list[dict]:
        with self._lock:
            return self._read(filters)

    def compact(self, min_files: int = COMPACT_MIN_FILES,
                select: Callable[[list[dict]], list[dict]] | None = None) -> int | None:
        """Fold every file of the table into one, its rows in the log's order; the number
        of files folded, or None: fewer than ``min_files``, or another writer committed
        first (the next call tries again). ``select``: the rows to keep of those read (in
        their order), the rest dropped with the fold.

        Why: each append adds a file, and a new reader (a restarted job, an Airflow task,
        the CLI) opens them all: ~1 s at the hour's campaign's 700 appends, on every
        recovery's path. The overwrite removes only the files of the version read: an
        append committed meanwhile either conflicts (nothing changes) or stays, after the
        compacted rows (:data:`COMPACTED_THROUGH`). Each append also left a commit file in
        the table's Delta log, which Delta's own cleanup keeps for 30 days: a fold
        checkpoints the log and deletes its files older than the previous fold's
        checkpoint (:func:`drop_log_before`), so the log stays about one fold long."""
        from deltalake import CommitProperties, write_deltalake
        from deltalake.exceptions import CommitFailedError

        with self._lock:
            rows = self._read(None)
            table = self.log.table(refresh=False)  # the version just read
            folded = len(table.file_uris())
            if folded < min_files:
                return None
            read = table.version()
            kept = rows if select is None else select(rows)
            maybe_crash("log:before-compaction-commit")
            try:
                write_deltalake(
                    table, pa.Table.from_pylist(kept, schema=self._schema), mode="overwrite",
                    commit_properties=CommitProperties(
                        custom_metadata={COMPACTED_THROUGH: read}, max_commit_retries=0))
            except CommitFailedError:
                return None
            self._vacuum()
            self._trim_log()
            return folded

    def _trim_log(self) -> None:
        """Checkpoint the Delta log at its latest version and delete its files older than
        the checkpoint the previous fold made: a reader that last looked before that
        (a fold's interval ago) reloads from a checkpoint (delta-rs's update)."""
        table = self.log.table()
        version = table.version()
        table.create_checkpoint()
        if self._checkpointed is not None:
            drop_log_before(self.log.table_uri, self._checkpointed, self.log.storage_options)
        self._checkpointed = version

    def _vacuum(self) -> None:
        """Delete the files compactions took out at least :data:`VACUUM_AFTER_HOURS` ago."""
        from deltalake.exceptions import CommitFailedError

        # (its log entry losing a race to an append: the next compaction's vacuum)
        with contextlib.suppress(CommitFailedError):
            self.log.table().vacuum(retention_hours=VACUUM_AFTER_HOURS, dry_run=False,
                                    enforce_retention_duration=False)

    def _read(self, filters: list[tuple[str, str, Any]] | None) -> list[dict]:
        table = self.log.table()
        latest = table.version()
        files = data_files(table, self.log.table_uri)
        unknown = {f for f in files if f not in self._versions}
        if unknown and latest > self._through:
            self._versions.update(self.log.add_versions(self._through, latest, unknown))
        self._through = max(self._through, latest)
        schema = pa.schema(table.schema().to_arrow())
        if schema != self._schema:  # rows already read would lack a new column
            self._rows.clear()
            self._schema = schema
        kept = self._rows.setdefault(repr(filters), {})
        new = [f for f in files if f not in kept]
        if new:
            # One scan of the new files, its batches tagged with their file and in order:
            # a new reader (a restarted job, each Airflow task) reads hundreds of one-row
            # files, 0.45x the time of a read file by file (README, "Reading the epoch log").
            expression = pq.filters_to_expression(filters) if filters else None
            dataset = ds.dataset(new, schema=schema, format="parquet", filesystem=self.log.fs)
            rows: dict[str, list[dict]] = {f: [] for f in new}
            for tagged in dataset.scanner(filter=expression).scan_batches():
                rows[tagged.fragment.path].extend(tagged.record_batch.to_pylist())
            kept.update(rows)
        live = set(files)
        for gone in [f for f in kept if f not in live]:  # compacted or restored away
            del kept[gone]
        order = sorted((self._versions.get(f, -1), f) for f in files)
        return [dict(row) for _, f in order for row in kept[f]]


def user_metadata(text: Any, key: str) -> Any:
    """The value under ``key`` of a delta-spark commit's ``userMetadata`` (a JSON string),
    or None when it has none (or another writer's text)."""
    if not isinstance(text, str) or key not in text:
        return None
    try:
        return json.loads(text).get(key)
    except (ValueError, AttributeError):
        return None
