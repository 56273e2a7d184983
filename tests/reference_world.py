"""The reference pipeline's epoch log and (empty) Delta tables after a few epochs, without
Spark or a broker: enough for the rollback DAG to plan, and for tests to prove that a
refused or dry-run rollback changed nothing.

ingest did epochs 0..5, popularity and communities 0..4 (communities checkpointed at
epoch 2), serve and stats 0..3. Each commit appends an empty batch, so every epoch has a
table version of its own to restore to.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from deltalake import DeltaTable, write_deltalake

from falkirk.config import Config, load
from falkirk.log.epochlog import EpochLog, EpochRecord
from falkirk.model.schemas import arrow_schema
from falkirk.model.times import time_of
from falkirk.model.topology import load_pipeline

DONE = {"ingest": 5, "popularity": 4, "communities": 4, "serve": 3, "stats": 3}
CHECKPOINTS = {"communities": {2}}


def make_reference_world(root: Path) -> Config:
    """Build the sandbox under ``root``; its Config (point FALKIRK_LAKE/VAR_DIR at it)."""
    pipeline = load_pipeline("reference")
    cfg = replace(load(), lake=str(root / "lake"), var_dir=str(root / "var"))
    log = EpochLog.from_config(cfg)

    def empty(edge):
        return arrow_schema("tables", edge.table_schema, pipeline.schema_roots).empty_table()

    versions: dict[str, int] = {}
    for edge in pipeline.edges.values():
        if edge.kind == "delta" and edge.table not in versions:
            write_deltalake(cfg.table(edge.table), empty(edge), mode="error")
            versions[edge.table] = 0
    rows = []
    for region, last in DONE.items():
        spec = pipeline.regions[region]
        for epoch in range(last + 1):
            outputs = {}
            for edge in pipeline.out_edges(region):
                if edge.kind != "delta":
                    continue
                if versions[edge.table] < epoch + 1:
                    write_deltalake(cfg.table(edge.table), empty(edge), mode="append")
                    versions[edge.table] += 1
                outputs[edge.name] = {"table": edge.table, "version": versions[edge.table]}
            checkpoint = epoch in CHECKPOINTS.get(region, set()) or spec.regime == "eager"
            rows.append(EpochRecord(
                "reference", region, time_of(spec.domain, epoch), 0,
                "checkpointed" if checkpoint and spec.regime == "lazy" else "committed",
                outputs=outputs, state_ref=f"checkpoint:{epoch}" if checkpoint else None))
    log.record(*rows)
    return cfg


def snapshot(cfg: Config) -> dict[str, int]:
    """Version of every Delta table under the lake (epoch log included): equal snapshots
    mean nothing was written."""
    out = {}
    for path in sorted(Path(cfg.lake).rglob("_delta_log")):
        out[str(path.parent.relative_to(cfg.lake))] = DeltaTable(str(path.parent)).version()
    return out
