"""Table and record schemas, kept as JSON files (one place for each).

Data engineers read and edit the files; the code builds Arrow schemas from them. A name is
looked up in the folders a caller passes, then in the ``schemas/`` folders of the pipelines
this process runs (:func:`use_pipeline`: a job names its tables bare, ``conform(df,
"purchases")``, and means its own pipeline's), then in the framework's (``falkirk/schemas``:
the epoch log's tables and ``dead_letters``, shipped in the wheel).
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pyarrow as pa

FRAMEWORK_SCHEMAS_DIR = Path(__file__).resolve().parents[1] / "schemas"

_TYPES = {
    "string": pa.string(),
    "int32": pa.int32(),
    "int64": pa.int64(),
    "double": pa.float64(),
    "bool": pa.bool_(),
    "timestamp[us, tz=UTC]": pa.timestamp("us", tz="UTC"),
}


_PIPELINE_ROOTS: list[Path] = []  # the schemas/ folders of the pipelines this process runs


def use_pipeline(roots: tuple[Path, ...]) -> None:
    """Resolve bare names against these ``schemas/`` folders (a pipeline's
    ``schema_roots``) before any used earlier: the runtime calls it when a job starts and
    ``load_job`` when a test loads a job, so a job's transforms find its own tables."""
    for root in reversed(roots):
        root = Path(root).resolve()
        if root in _PIPELINE_ROOTS:
            _PIPELINE_ROOTS.remove(root)
        _PIPELINE_ROOTS.insert(0, root)


def _roots(roots: tuple[Path, ...], others: bool = True) -> tuple[Path, ...]:
    return (*roots, *(_PIPELINE_ROOTS if others else ()), FRAMEWORK_SCHEMAS_DIR)


def find(kind: str, name: str, roots: tuple[Path, ...] = (), others: bool = True
         ) -> Path | None:
    """``<root>/<kind>/<name>.json`` in the first of ``roots``, else (unless ``others`` is
    false) of the pipelines' folders (:func:`use_pipeline`), else of the framework's that
    has it; None if none has it."""
    for root in _roots(roots, others):
        path = root / kind / f"{name}.json"
        if path.is_file():
            return path
    return None


def definition(kind: str, name: str, roots: tuple[Path, ...] = ()) -> dict:
    """The JSON definition ``schemas/<kind>/<name>.json`` (see :func:`find`)."""
    path = find(kind, name, roots)
    if path is None:
        looked = ", ".join(str(r / kind) for r in _roots(roots))
        raise FileNotFoundError(f"no schema file {name}.json (looked in {looked})")
    return _read(path)


@cache
def _read(path: Path) -> dict:
    return json.loads(path.read_text())


_DDL = {"string": "string", "int32": "int", "int64": "long", "double": "double",
        "bool": "boolean"}


def ddl(kind: str, name: str, roots: tuple[Path, ...] = ()) -> str:
    """A Spark DDL string of the schema (for the Kafka source's valueSchema)."""
    parts = []
    for f in definition(kind, name, roots)["fields"]:
        if f["type"] not in _DDL:
            raise ValueError(f"{find(kind, name, roots)}: field {f['name']!r} has type "
                             f"{f['type']!r}, which a record cannot have (known: "
                             f"{', '.join(_DDL)})")
        parts.append(f"{f['name']} {_DDL[f['type']]}")
    return ", ".join(parts)


def arrow_schema(kind: str, name: str, roots: tuple[Path, ...] = ()) -> pa.Schema:
    """The Arrow schema of ``schemas/<kind>/<name>.json`` (field order as written)."""
    fields = []
    for f in definition(kind, name, roots)["fields"]:
        try:
            typ = _TYPES[f["type"]]
        except KeyError:
            raise ValueError(
                f"{find(kind, name, roots)}: field {f['name']!r} has unknown type "
                f"{f['type']!r} (known: {', '.join(_TYPES)})"
            ) from None
        fields.append(pa.field(f["name"], typ, nullable=f.get("nullable", True)))
    return pa.schema(fields)
