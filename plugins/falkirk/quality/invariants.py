"""Cross-region invariants a pipeline declares (``invariants: <file>.py`` in its YAML).

The file maps regions to checks run on each epoch the region commits, beside the
expectation suites of its tables::

    from falkirk.quality.invariants import epoch_rows, output

    def totals_match(v, row, logs):
        # each total equals the sum of its parts
        table, version = output(row, "totals")
        ...
        return table, ok, observed, sample, version

    INVARIANTS = {"report": [totals_match]}

Each check gets the validator ``v`` (its ``spark``, ``cfg`` and ``pipeline``), the
committed epoch's row of the epoch log and every region's log, and returns ``(table
judged, success, observed, sample rows, table version)``; its name is the function's.
The helpers below read exactly what the epoch committed or consumed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from falkirk.errors import FalkirkError
from falkirk.log.epochlog import EpochRecord
from falkirk.model.times import Offsets
from falkirk.model.topology import Pipeline

if TYPE_CHECKING:
    from falkirk.quality.checks import Validator

SAMPLE = 5  # offending rows or values kept per failed check

Invariant = Callable[..., tuple]


class CheckError(FalkirkError):
    """A check could not run (its input is missing or unreadable), not a failed check."""


def load_invariants(pipeline: Pipeline) -> dict[str, list[tuple[str, Invariant]]]:
    """Region -> [(name, check)] from the pipeline's invariants file (none declared: {})."""
    if not pipeline.invariants:
        return {}
    from falkirk.runtime.job import load_job

    path = pipeline.job_path(pipeline.invariants)
    module = load_job(path)
    declared: Any = getattr(module, "INVARIANTS", None)
    if not isinstance(declared, dict):
        raise CheckError(f"{path}: defines no INVARIANTS mapping (region -> list of checks)")
    unknown = sorted(set(declared) - set(pipeline.regions))
    if unknown:
        raise CheckError(f"{path}: INVARIANTS names regions {unknown} that pipeline "
                         f"{pipeline.name!r} does not declare")
    return {region: [(fn.__name__, fn) for fn in fns] for region, fns in declared.items()}


def output(row: EpochRecord, edge: str) -> tuple[str, int]:
    out = (row.outputs or {}).get(edge)
    if not out:
        raise CheckError(f"{row.region} epoch {row.epoch}: the epoch log has no output "
                         f"version for edge {edge!r}")
    return out["table"], out["version"]


def epoch_rows(v: Validator, table: str, version: int, epoch: int | None = None,
                through: bool = False):
    from pyspark.sql import functions as F

    from falkirk.io.delta import read_version

    df = read_version(v.spark, v.cfg.table(table), version, v.cfg.delta_storage_options or None)
    if epoch is None:
        return df
    return df.filter(F.col("epoch") <= epoch if through else F.col("epoch") == epoch)


def read_input(v: Validator, row: EpochRecord, edge: str):
    """The exact Kafka records the region read for this epoch (its logged offset range)."""
    from falkirk.io.kafka import read_range
    from falkirk.runtime.connectors import record_ddl

    rng = (row.inputs or {}).get(edge)
    if not rng or "from" not in rng:
        raise CheckError(f"{row.region} epoch {row.epoch}: the epoch log has no offset range "
                         f"for input {edge!r}")
    topic = v.pipeline.edges[edge].topic
    try:
        return read_range(v.spark, v.cfg.kafka_bootstrap, topic, Offsets(rng["from"]),
                          Offsets(rng["to"]), record_ddl(topic, v.pipeline.schema_roots))
    except Exception as err:
        raise CheckError(f"cannot read topic {topic!r} at {v.cfg.kafka_bootstrap} to check "
                         f"{row.region} epoch {row.epoch}: {err}") from err


def epoch_settings(v: Validator) -> tuple[int, int]:
    s = v.pipeline.settings
    return int(s["origin_ms"]), int(s["epoch_seconds"] * 1000)
