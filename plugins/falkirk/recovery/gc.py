"""Garbage collection: drop what no rollback can need any more.

Solve as if every region had failed: the result w(p) is p's low watermark, below which no
failure can take p. Then (docs/model.md, "Garbage collection"):

- a stateful region keeps its newest checkpoint at or below w(p) and every later one;
  older checkpoints are compacted away and their files vacuumed;
- a logged Delta edge e = p → q no longer needs its records at times inside w(q): the
  collected frontier is recorded (it becomes D_e for the solver) and those rows deleted;
- an input topic read by p is acknowledged: the consumer group's offsets are committed to
  where the epochs inside w(p) ended;
- Delta VACUUM removes files no retained version uses (versions from the oldest one a
  rollback can still restore are kept).

Dry run by default: the report says what would be done.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from falkirk.config import Config, load
from falkirk.log.epochlog import EpochLog
from falkirk.model.times import DOMAINS, Offsets, epoch_of_key, shift, time_of
from falkirk.model.topology import Pipeline
from falkirk.solver.frontier import low_watermark


@dataclass
class GcReport:
    pipeline: str
    applied: bool
    watermarks: dict[str, Any] = field(default_factory=dict)  # region -> JSON frontier
    checkpoints: dict[str, int] = field(default_factory=dict)  # region -> keep from
    collected: dict[str, Any] = field(default_factory=dict)  # edge -> JSON time
    deleted_through: dict[str, int] = field(default_factory=dict)  # table -> sender epoch
    acknowledged: dict[str, dict] = field(default_factory=dict)  # topic -> offsets
    vacuumed: dict[str, int] = field(default_factory=dict)  # table -> files removed

    def to_json(self) -> dict:
        return self.__dict__.copy()


def group_id(pipeline: str, region: str) -> str:
    """The consumer group through which a region acknowledges its input topic."""
    return f"falkirk-{pipeline}-{region}"


def collect(pipeline: Pipeline, cfg: Config | None = None, epoch_log: EpochLog | None = None,
            apply: bool = False, vacuum_retention_hours: float = 1.0,
            spark: Any = None) -> GcReport:
    """Compute the low watermarks and (with ``apply``) drop what they allow.

    Rows of data tables are deleted with delta-spark (their one writing engine), in
    ``spark`` or a session started only when there is something to delete."""
    cfg = cfg or load()
    log = epoch_log or EpochLog.from_config(cfg)
    problem = log.problem(pipeline, replay=False)  # keep what a replay starts from
    wm = low_watermark(problem)
    logs = log.regions(pipeline)
    report = GcReport(pipeline.name, apply, {r: f.to_json() for r, f in wm.items()})
    opts = cfg.delta_storage_options or None

    done_epoch = {r: epoch_of_key(pipeline.regions[r].domain, f.key) for r, f in wm.items()}

    # Checkpoints: keep the newest at or below the watermark, and everything after it.
    for name, spec in pipeline.regions.items():
        if not spec.keeps_state:
            continue
        kept = [r for r in logs[name].restorable(spec.regime)
                if r.state_ref and r.epoch <= max(done_epoch[name], -1)]
        if kept:
            report.checkpoints[name] = int(kept[-1].state_ref.split(":")[-1])

    # Logged Delta edges: what the receiver can never need again.
    through_by_table: dict[str, list[int]] = {}
    for edge in pipeline.edges.values():
        if edge.kind != "delta" or edge.dst is None:
            continue
        w = wm[edge.dst]
        dom = w.domain
        report.collected[edge.name] = dom.dump(shift(dom, w.key, -edge.delay))
        sender_epoch = done_epoch[edge.dst] - edge.delay
        through_by_table.setdefault(edge.table, []).append(sender_epoch)
    for edge in pipeline.edges.values():  # tables also read outside the pipeline: keep
        if edge.kind == "delta" and edge.dst is None:
            through_by_table.pop(edge.table, None)
    for table, epochs in through_by_table.items():
        if min(epochs) >= 0:
            report.deleted_through[table] = min(epochs)

    # Input topics: acknowledge what the watermark's epochs took.
    for edge in pipeline.edges.values():
        if edge.kind != "kafka" or edge.dst is None:
            continue
        spec = pipeline.regions[edge.dst]
        e = done_epoch[edge.dst]
        if e < 0:
            continue
        row = logs[edge.dst].entries.get(DOMAINS[spec.domain].parse(time_of(spec.domain, e)))
        rng = None if row is None else (row.inputs or {}).get(edge.name)
        if rng is not None:
            report.acknowledged[edge.topic] = rng["to"]
            report.collected[edge.name] = wm[edge.dst].to_json()

    if apply:
        _apply(pipeline, cfg, log, report, logs, opts, vacuum_retention_hours, spark)
    return report


def _apply(pipeline: Pipeline, cfg: Config, log: EpochLog, report: GcReport, logs, opts,
           retention_hours: float, spark: Any) -> None:
    from deltalake import DeltaTable

    from falkirk.io.delta import vacuum_orphans
    from falkirk.io.kafka import commit_group_offsets
    from falkirk.regimes.checkpoints import CheckpointStore

    for region, keep_from in report.checkpoints.items():
        store = CheckpointStore.open(cfg.table("_falkirk_state", pipeline.name, region), opts)
        if store is not None:
            store.retain(keep_from)
    for edge, through in report.collected.items():
        topic = pipeline.edges[edge].topic
        offsets = report.acknowledged.get(topic) if topic else None
        log.record_collected(pipeline.name, edge, through,
                             None if offsets is None else Offsets(offsets))
    for table, epoch in report.deleted_through.items():
        uri = cfg.table(table)
        if DeltaTable.is_deltatable(uri, storage_options=opts):
            from falkirk.io.delta import spark_uri
            from falkirk.io.spark import session

            spark = spark or session(f"falkirk-gc-{pipeline.name}", cfg)
            location = spark_uri(uri).replace("`", "``")  # SQL: a Connect session too
            spark.sql(f"DELETE FROM delta.`{location}` WHERE epoch <= {int(epoch)}")
    for topic, offsets in report.acknowledged.items():
        region = next(e.dst for e in pipeline.edges.values()
                      if e.kind == "kafka" and e.topic == topic and e.dst)
        commit_group_offsets(cfg.kafka_bootstrap, topic, group_id(pipeline.name, region),
                             Offsets(offsets))
    # Vacuum: keep every version a rollback may still restore (from the version each
    # producer committed at its watermark epoch on).
    for edge in pipeline.edges.values():
        if edge.kind != "delta":
            continue
        uri = cfg.table(edge.table)
        if not DeltaTable.is_deltatable(uri, storage_options=opts):
            continue
        spec = pipeline.regions[edge.src]
        w = report.watermarks[edge.src]
        keep_from = 0
        if w != -1:
            row = logs[edge.src].entries.get(DOMAINS[spec.domain].parse(w))
            version = ((row.outputs or {}).get(edge.name) or {}).get("version") if row else None
            keep_from = version if version is not None else 0
        removed = vacuum_orphans(uri, retention_hours=retention_hours,
                                 keep_from_version=keep_from, storage_options=opts)
        report.vacuumed[edge.table] = report.vacuumed.get(edge.table, 0) + len(removed)
