"""Reading Delta tables without Spark: a version's file list, read with pyarrow.

delta-rs's own ``to_pyarrow_table``/``to_pyarrow_dataset`` read through a Python file
system that its threads call back into; on this platform the process then often aborts at
exit ("terminate called without an active exception", delta-io/delta-rs#2184). Reading the
version's ``file_uris()`` with pyarrow's own file systems is exact (removed files are not
listed) and exits cleanly. Light on imports: no Spark.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from falkirk.errors import FalkirkError

#: Table properties of every table we create: delta-rs deletes and overwrites fail with
#: deletion vectors, and column mapping would make the Parquet column names differ from
#: the logical ones (and from Spark's).
TABLE_CONFIGURATION: dict[str, str | None] = {
    "delta.enableDeletionVectors": "false",
    "delta.columnMapping.mode": "none",
}


class TableSchemaError(FalkirkError, ValueError):
    """A table exists with another schema than the one its writer writes."""


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
    root = table_uri.rstrip("/")
    files = [uri[len(root) + 1:] if uri.startswith(root + "/") else uri
             for uri in (file_path(u) for u in table.file_uris())]
    return ds.dataset(files, schema=schema, format="parquet",
                      filesystem=table_filesystem(root, storage_options))


def read_table(table_uri: str, version: int | None = None,
               filters: list[tuple[str, str, Any]] | None = None,
               storage_options: dict[str, str] | None = None) -> pa.Table:
    """Exactly the rows of one version of a Delta table (default: the latest)."""
    dataset = version_dataset(table_uri, version, storage_options)
    return dataset.to_table(filter=pq.filters_to_expression(filters) if filters else None)


def file_path(uri: str) -> str:
    """file:///x/y -> /x/y; /x/a%20b -> /x/a b (file_uris() percent-encodes local paths)."""
    parsed = urlparse(uri)
    return unquote(parsed.path) if parsed.scheme in ("file", "") else uri
