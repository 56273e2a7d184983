"""Table and record schemas, kept as JSON files (one place for each).

Data engineers read and edit the files; the code builds Arrow schemas from them. A name is
looked up in a pipeline's own ``schemas/`` folders, then in the checkout's ``schemas/``
(the reference pipeline's), then in the framework's (``falkirk/schemas``: the epoch log's
tables and ``dead_letters``, shipped in the wheel).
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pyarrow as pa

SCHEMAS_DIR = Path(__file__).resolve().parents[3] / "schemas"
FRAMEWORK_SCHEMAS_DIR = Path(__file__).resolve().parents[1] / "schemas"

_TYPES = {
    "string": pa.string(),
    "int32": pa.int32(),
    "int64": pa.int64(),
    "double": pa.float64(),
    "bool": pa.bool_(),
    "timestamp[us, tz=UTC]": pa.timestamp("us", tz="UTC"),
}


def find(kind: str, name: str, roots: tuple[Path, ...] = ()) -> Path | None:
    """``<root>/<kind>/<name>.json`` in the first of ``roots`` (a pipeline's own ``schemas/``
    folders) that has it, else in the checkout's, else in the framework's; None if none
    has it."""
    for root in (*roots, SCHEMAS_DIR, FRAMEWORK_SCHEMAS_DIR):
        path = root / kind / f"{name}.json"
        if path.is_file():
            return path
    return None


@cache
def definition(kind: str, name: str, roots: tuple[Path, ...] = ()) -> dict:
    """The JSON definition ``schemas/<kind>/<name>.json`` (see :func:`find`)."""
    path = find(kind, name, roots)
    if path is None:
        looked = ", ".join(str(r / kind) for r in (*roots, SCHEMAS_DIR, FRAMEWORK_SCHEMAS_DIR))
        raise FileNotFoundError(f"no schema file {name}.json (looked in {looked})")
    return json.loads(path.read_text())


_DDL = {"string": "string", "int32": "int", "int64": "long", "double": "double",
        "bool": "boolean"}


def ddl(kind: str, name: str, roots: tuple[Path, ...] = ()) -> str:
    """A Spark DDL string of the schema (for the Kafka source's valueSchema)."""
    parts = []
    for f in definition(kind, name, roots)["fields"]:
        if f["type"] not in _DDL:
            raise ValueError(f"schemas/{kind}/{name}.json: {f['name']!r} has no DDL type")
        parts.append(f"{f['name']} {_DDL[f['type']]}")
    return ", ".join(parts)


@cache
def arrow_schema(kind: str, name: str, roots: tuple[Path, ...] = ()) -> pa.Schema:
    """The Arrow schema of ``schemas/<kind>/<name>.json`` (field order as written)."""
    fields = []
    for f in definition(kind, name, roots)["fields"]:
        try:
            typ = _TYPES[f["type"]]
        except KeyError:
            raise ValueError(
                f"schemas/{kind}/{name}.json: field {f['name']!r} has unknown type {f['type']!r} "
                f"(known: {', '.join(_TYPES)})"
            ) from None
        fields.append(pa.field(f["name"], typ, nullable=f.get("nullable", True)))
    return pa.schema(fields)
