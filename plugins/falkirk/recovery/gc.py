"""Garbage collection: drop what no rollback can need any more, and nothing a user keeps.

Solve as if every region had failed: the result w(p) is p's low watermark, below which no
failure can take p (docs/model.md, "Garbage collection"). What falkirk then removes, each
item with the rule that allows it (:data:`RULES`):

- **checkpoints** (falkirk's own): a stateful region keeps its newest checkpoint at or
  below w(p), every later one, and ``retain_checkpoints`` older ones; older layers are
  folded into one base and their files deleted, by the region's own job after its next
  epoch (the store's one writer: a fold beside its save would delete the save's files;
  ``EpochLog.record_fold``);
- **rows of declared logs**: a Delta table is a product, and its rows are never deleted
  unless the pipeline declares it a log (``retain_epochs: N`` on an edge of the table).
  Then rows of epochs that every receiver has passed for good (inside w(receiver), less
  the edge's delay) and older than the sender's newest N epochs are deleted;
- **orphan files**: data files that no version in a table's log references (a write
  killed before its commit), older than the retention; time travel on a table is left
  to Delta's own retention. A declared log's files its deletes took out go the same way
  once older than the retention;
- **acknowledgements**: an input topic read by p is acknowledged where the epochs inside
  w(p) ended (the consumer group's offsets); its retention stays its owner's;
- **records of declared log topics**: a topic between two regions declared a log
  (``retain_epochs: N`` on its Kafka edge) loses the records its receiver's epochs inside
  w(receiver) read, but for its newest N epochs (Kafka's DeleteRecords).

Dry run by default: the report lists each item (store, name, rows, files, bytes, rule).
:class:`GarbageCollector` does it continuously as epochs commit, keeping the watermarks
with the incremental solver (:class:`Watermarks`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from falkirk.config import Config, load
from falkirk.log.epochlog import EpochLog, RegionLog
from falkirk.model.times import DOMAINS, Frontier, Offsets, epoch_of_key, shift, time_of
from falkirk.model.topology import Pipeline
from falkirk.solver.frontier import Solver, low_watermark

_log = logging.getLogger(__name__)

#: Why each kind of item may go (formatted with the item's details).
RULES = {
    "checkpoints": "layers older than checkpoint {keep_from}: the newest at or below the "
                   "low watermark is {needed}, and retain_checkpoints keeps {retain} older",
    "log rows": "declared a log (retain_epochs: {retain}): every receiver has passed epochs "
                "≤ {through} for good, and the sender's newest {retain} epochs are kept",
    "orphan files": "data files no version in the table's log references (writes killed "
                    "before their commit), older than {hours:g} h",
    "log files": "files the log's deletes took out of versions before {keep_from}, older "
                 "than {hours:g} h",
    "acknowledge": "offsets the region's epochs through its low watermark {epoch} read (the "
                   "consumer group's commit; the topic's retention stays its owner's)",
    "log records": "declared a log (retain_epochs: {retain}): records the receiver's epochs "
                   "through {epoch} read, below its low watermark and older than its newest "
                   "{retain} epochs (Kafka's DeleteRecords)",
}


@dataclass
class GcItem:
    """One thing garbage collection removes (or, in a dry run, would remove)."""

    store: str  # "table", "checkpoints", "topic"
    name: str  # the table, region or topic
    kind: str  # a key of RULES
    rule: str  # why it may go
    rows: int = 0
    files: int = 0
    bytes: int = 0
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class GcReport:
    pipeline: str
    applied: bool
    watermarks: dict[str, Any] = field(default_factory=dict)  # region -> JSON frontier
    items: list[GcItem] = field(default_factory=list)
    kept_tables: list[str] = field(default_factory=list)  # products: no row deleted
    # region -> the oldest epoch whose epoch-log rows a rollback may still need
    log_keep_from: dict[str, int] = field(default_factory=dict)

    def of(self, kind: str) -> dict[str, GcItem]:
        """The items of one kind, by name."""
        return {i.name: i for i in self.items if i.kind == kind}

    @property
    def checkpoints(self) -> dict[str, int]:
        """region -> the checkpoint kept from."""
        return {n: i.detail["keep_from"] for n, i in self.of("checkpoints").items()}

    @property
    def deleted_through(self) -> dict[str, int]:
        """declared log table -> the sender epoch through which its rows go."""
        return {n: i.detail["through"] for n, i in self.of("log rows").items()}

    @property
    def acknowledged(self) -> dict[str, dict]:
        """input topic -> the offsets acknowledged."""
        return {n: i.detail["offsets"] for n, i in self.of("acknowledge").items()}

    def to_json(self) -> dict:
        return {"pipeline": self.pipeline, "applied": self.applied,
                "watermarks": self.watermarks, "kept_tables": self.kept_tables,
                "log_keep_from": self.log_keep_from,
                "items": [asdict(i) for i in self.items],
                "freed_bytes": sum(i.bytes for i in self.items)}


def group_id(pipeline: str, region: str) -> str:
    """The consumer group through which a region acknowledges its input topic."""
    return f"falkirk-{pipeline}-{region}"


def collect(pipeline: Pipeline, cfg: Config | None = None, epoch_log: EpochLog | None = None,
            apply: bool = False, vacuum_retention_hours: float = 1.0,
            spark: Any = None, watermarks: dict[str, Frontier] | None = None) -> GcReport:
    """Compute the low watermarks, itemise what they allow and (with ``apply``) drop it.

    Rows of declared logs are deleted with delta-rs (the tables' one writing engine); no
    Spark session is needed (``spark`` is accepted for callers that pass one)."""
    cfg = cfg or load()
    log = epoch_log or EpochLog.from_config(cfg)
    # without replay: keep what a replay starts from (a continuous monitor passes its own)
    wm = watermarks if watermarks is not None else low_watermark(
        log.problem(pipeline, replay=False))
    logs = log.regions(pipeline)
    report = GcReport(pipeline.name, apply, {r: f.to_json() for r, f in wm.items()})
    done_epoch = {r: epoch_of_key(pipeline.regions[r].domain, f.key) for r, f in wm.items()}
    opts = cfg.delta_storage_options or None
    collected: dict[str, Any] = {}  # logged edge -> the time its receiver no longer needs

    _checkpoints(pipeline, cfg, logs, done_epoch, report, opts)
    report.log_keep_from = log_keep_from(pipeline, logs, done_epoch)
    log_tables = pipeline.log_tables()
    report.kept_tables = sorted({e.table for e in pipeline.edges.values()
                                 if e.kind == "delta" and e.table not in log_tables})
    for table, retain in log_tables.items():
        through = _log_through(pipeline, table, retain, logs, done_epoch)
        if through is None:
            continue
        report.items.append(_log_rows(cfg.table(table), table, through, retain, opts))
        for edge in pipeline.edges.values():  # what its sender can no longer send again
            if edge.table == table and edge.dst is not None:
                dom = wm[edge.dst].domain
                gone = dom.parse(time_of(dom.name, through))
                collected[edge.name] = dom.dump(dom.meet(
                    shift(dom, wm[edge.dst].key, -edge.delay), gone))
    _acknowledgements(pipeline, logs, done_epoch, wm, report, collected)
    _log_topics(pipeline, logs, done_epoch, wm, report, collected)
    _vacuums(pipeline, cfg, logs, report, log_tables, vacuum_retention_hours, opts)
    if apply:
        _apply(pipeline, cfg, log, report, collected, opts, vacuum_retention_hours, spark)
    return report


def _row(pipeline: Pipeline, logs: dict[str, RegionLog], region: str, epoch: int):
    spec = pipeline.regions[region]
    return logs[region].entries.get(DOMAINS[spec.domain].parse(time_of(spec.domain, epoch)))


def _checkpoints(pipeline: Pipeline, cfg: Config, logs: dict[str, RegionLog],
                 done_epoch: dict[str, int], report: GcReport, opts) -> None:
    """Keep the newest checkpoint at or below the watermark, ``retain_checkpoints`` older
    ones and every later one."""
    from falkirk.state.checkpoints import CheckpointStore

    for name, spec in pipeline.regions.items():
        ids = _checkpoint_ids(pipeline, logs, done_epoch, name)
        if not ids:
            continue
        keep_from = _kept_from(ids, spec.retain_checkpoints)
        store = CheckpointStore.open(cfg.table("_falkirk_state", pipeline.name, name), opts)
        if store is None:
            continue
        dropped, files, rows, size = store.retain_plan(keep_from)
        if not dropped:
            continue
        rule = RULES["checkpoints"].format(keep_from=keep_from, needed=ids[-1],
                                           retain=spec.retain_checkpoints)
        report.items.append(GcItem("checkpoints", name, "checkpoints", rule, rows, files, size,
                                   {"keep_from": keep_from, "dropped": dropped}))


def _checkpoint_ids(pipeline: Pipeline, logs: dict[str, RegionLog],
                    done_epoch: dict[str, int], region: str) -> list[int]:
    """A stateful region's checkpoints at or below its low watermark, oldest first."""
    spec = pipeline.regions[region]
    if not spec.keeps_state:
        return []
    return sorted({int(r.state_ref.split(":")[-1]) for r in logs[region].restorable(spec.regime)
                   if r.state_ref and r.epoch <= max(done_epoch[region], -1)})


def _kept_from(ids: list[int], retain: int) -> int:
    """The oldest checkpoint kept of ``ids`` (those at or below the watermark, oldest
    first): the newest, and ``retain`` older."""
    return ids[max(0, len(ids) - 1 - retain)]


def log_keep_from(pipeline: Pipeline, logs: dict[str, RegionLog],
                  done_epoch: dict[str, int]) -> dict[str, int]:
    """Per region, the oldest epoch whose rows in the epoch log a rollback may still need
    (older ones go with the log's next compaction, ``EpochLog.compact``): its low
    watermark; for a stateful region the oldest checkpoint garbage collection keeps
    (``retain_checkpoints`` older than the newest at or below the watermark: a restore
    starts from one and replays the epochs after it); and for every receiver of its
    outputs the epoch after the receiver's watermark, less the edge's delay (a receiver
    restored there reads the sender's epochs from then on, each found by its row). -1
    keeps every row (a region with nothing below its watermark yet)."""
    out = {}
    for name, spec in pipeline.regions.items():
        keep = done_epoch[name]
        ids = _checkpoint_ids(pipeline, logs, done_epoch, name)
        if ids:
            keep = min(keep, _kept_from(ids, spec.retain_checkpoints))
        for edge in pipeline.out_edges(name):
            if edge.dst is not None:
                keep = min(keep, done_epoch[edge.dst] + 1 - edge.delay)
        out[name] = max(keep, -1)
    return out


def _log_through(pipeline: Pipeline, table: str, retain: int, logs: dict[str, RegionLog],
                 done_epoch: dict[str, int]) -> int | None:
    """The sender epoch through which a declared log's rows may go, or None."""
    edges = [e for e in pipeline.edges.values() if e.kind == "delta" and e.table == table]
    sender = edges[0].src
    committed = [r.epoch for r in logs[sender].restorable(pipeline.regions[sender].regime)]
    if not committed:
        return None
    through = max(committed) - retain
    for edge in edges:
        if edge.dst is not None:  # what the receiver can never need again
            through = min(through, done_epoch[edge.dst] - edge.delay)
    return through if through >= 0 else None


def _log_rows(uri: str, table: str, through: int, retain: int, opts) -> GcItem:
    """The rows of epochs ≤ ``through`` in a declared log, with the files holding them."""
    import pyarrow.dataset as ds

    from falkirk.io.lake import version_dataset

    rule = RULES["log rows"].format(retain=retain, through=through)
    item = GcItem("table", table, "log rows", rule, detail={"through": through})
    try:
        dataset = version_dataset(uri, storage_options=opts)
    except Exception:  # no table yet (its writer never ran): nothing to delete
        return item
    below = ds.field("epoch") <= through
    for fragment in dataset.get_fragments():
        n = fragment.count_rows(filter=below)
        if n:
            total = fragment.count_rows()
            size = fragment.filesystem.get_file_info(fragment.path).size or 0
            item.rows += n
            item.files += 1
            item.bytes += round(size * n / total) if total else 0
    return item


def _acknowledgements(pipeline: Pipeline, logs: dict[str, RegionLog],
                      done_epoch: dict[str, int], wm, report: GcReport,
                      collected: dict[str, Any]) -> None:
    """Input topics: acknowledge what the watermark's epochs took."""
    for edge in pipeline.edges.values():
        if edge.kind != "kafka" or edge.dst is None or edge.src is not None:
            continue
        e = done_epoch[edge.dst]
        row = _row(pipeline, logs, edge.dst, e) if e >= 0 else None
        rng = None if row is None else (row.inputs or {}).get(edge.name)
        if rng is None:
            continue
        rule = RULES["acknowledge"].format(epoch=e)
        report.items.append(GcItem("topic", edge.topic, "acknowledge", rule,
                                   rows=sum(rng["to"].values()),
                                   detail={"offsets": rng["to"], "region": edge.dst}))
        collected[edge.name] = wm[edge.dst].to_json()


def _log_topics(pipeline: Pipeline, logs: dict[str, RegionLog], done_epoch: dict[str, int],
                wm, report: GcReport, collected: dict[str, Any]) -> None:
    """Topics declared logs between regions (``retain_epochs`` on a Kafka edge with a
    sender and a receiver): trimmed below what the receiver's epochs through its low
    watermark read, keeping its newest ``retain_epochs`` epochs, as Kafka Streams purges
    its repartition topics."""
    for edge in pipeline.edges.values():
        if edge.kind != "kafka" or edge.src is None or edge.dst is None \
                or edge.retain_epochs is None:
            continue
        committed = [r.epoch for r in logs[edge.dst].restorable(
            pipeline.regions[edge.dst].regime)]
        e = min(done_epoch[edge.dst], max(committed, default=-1) - edge.retain_epochs)
        row = _row(pipeline, logs, edge.dst, e) if e >= 0 else None
        rng = None if row is None else (row.inputs or {}).get(edge.name)
        if rng is None:
            continue
        rule = RULES["log records"].format(retain=edge.retain_epochs, epoch=e)
        report.items.append(GcItem("topic", edge.topic, "log records", rule,
                                   rows=sum(rng["to"].values()),
                                   detail={"offsets": rng["to"], "region": edge.dst}))
        dom = wm[edge.dst].domain
        # what its sender can no longer send again: its epochs the dropped ones came from
        collected[edge.name] = dom.dump(shift(dom, dom.meet(
            wm[edge.dst].key, dom.parse(time_of(dom.name, e))), -edge.delay))


def _vacuums(pipeline: Pipeline, cfg: Config, logs: dict[str, RegionLog], report: GcReport,
             log_tables: dict[str, int], hours: float, opts) -> None:
    """Orphan files of every table; a declared log's files from versions before the one
    its sender committed at its low watermark, too."""
    from deltalake import DeltaTable

    from falkirk.io.delta import orphan_files

    for table in sorted({e.table for e in pipeline.edges.values() if e.kind == "delta"}):
        uri = cfg.table(table)
        if not DeltaTable.is_deltatable(uri, storage_options=opts):
            continue
        keep_from, kind = None, "orphan files"
        if table in log_tables:
            keep_from, kind = _log_keep_from(pipeline, table, logs, report), "log files"
        files = orphan_files(uri, retention_hours=hours, keep_from_version=keep_from,
                             storage_options=opts)
        if files:
            rule = RULES[kind].format(hours=hours, keep_from=keep_from)
            report.items.append(GcItem("table", table, kind, rule, files=len(files),
                                       bytes=sum(files.values()),
                                       detail={"keep_from_version": keep_from}))


def _log_keep_from(pipeline: Pipeline, table: str, logs: dict[str, RegionLog],
                   report: GcReport) -> int:
    """The oldest version of a declared log a rollback may still restore: the one its
    sender committed at its low watermark (every later one is kept too)."""
    edge = next(e for e in pipeline.edges.values() if e.kind == "delta" and e.table == table)
    w = report.watermarks[edge.src]
    if w == -1:
        return 0
    spec = pipeline.regions[edge.src]
    row = logs[edge.src].entries.get(DOMAINS[spec.domain].parse(w))
    version = ((row.outputs or {}).get(edge.name) or {}).get("version") if row else None
    return version if version is not None else 0


def _apply(pipeline: Pipeline, cfg: Config, log: EpochLog, report: GcReport,
           collected: dict[str, Any], opts, retention_hours: float, spark: Any) -> None:
    from deltalake import DeltaTable

    from falkirk.io.delta import vacuum_orphans
    from falkirk.io.kafka import commit_group_offsets, delete_records

    asked = log.folds(pipeline.name)
    for region, keep_from in report.checkpoints.items():
        if asked.get(region, -1) < keep_from:  # its job folds them (the store's writer)
            log.record_fold(pipeline.name, region, keep_from)
    acknowledged = report.of("acknowledge")
    before = log.collected(pipeline.name)
    for edge, through in collected.items():
        topic = pipeline.edges[edge].topic
        item = acknowledged.get(topic) if topic else None
        offsets = None if item is None else Offsets(item.detail["offsets"])
        if before.get(edge) == (through, None if offsets is None else offsets.as_dict()):
            continue  # a continuous collector's look that moved nothing on this edge
        log.record_collected(pipeline.name, edge, through, offsets)
    for table, item in report.of("log rows").items():
        if item.rows:
            DeltaTable(cfg.table(table), storage_options=opts).delete(
                f"epoch <= {int(item.detail['through'])}")
    for topic, item in acknowledged.items():
        commit_group_offsets(cfg.kafka_bootstrap, topic,
                             group_id(pipeline.name, item.detail["region"]),
                             Offsets(item.detail["offsets"]))
    for topic, item in report.of("log records").items():
        delete_records(cfg.kafka_bootstrap, topic, Offsets(item.detail["offsets"]))
    for item in report.items:
        if item.kind in ("orphan files", "log files"):
            vacuum_orphans(cfg.table(item.name), retention_hours=retention_hours,
                           keep_from_version=item.detail["keep_from_version"],
                           storage_options=opts)


class Watermarks:
    """Every region's low watermark, kept up to date as epochs commit: one incremental
    solver (every region failed) told only what changed in the epoch log since its last
    look: a region's new frontiers are added (:meth:`Solver.add_frontier`), a region whose
    older entries changed (garbage collection dropped what they sent, a rollback took
    some away) is refreshed alone; a new generation, or a change of edges, solves anew."""

    def __init__(self, pipeline: Pipeline, log: EpochLog):
        self.pipeline, self.log = pipeline, log
        self.solver: Solver | None = None
        self.generation: int | None = None
        self.rebuilt = self.added = self.refreshed = 0  # how they were kept (tests, report)

    def update(self) -> dict[str, Frontier]:
        problem = self.log.problem(self.pipeline, replay=False)
        generation = self.log.generation(self.pipeline.name)
        solver = self.solver
        if solver is None or generation != self.generation \
                or solver.problem.edges != problem.edges:
            self.solver, self.generation = Solver(problem, all_failed=True), generation
            self.rebuilt += 1
            return self.solver.frontiers()
        for name, region in problem.regions.items():
            held = solver.problem.regions[name]
            # ⊤ is no candidate here (every region failed), but new frontiers are checked
            # against it: the live state as the log shows it now
            held.live, held.current = region.live, region.current
            old, new = held.frontiers, region.frontiers
            if new[:len(old)] == old:
                for entry in new[len(old):]:
                    solver.add_frontier(name, entry)
                    self.added += 1
            else:
                held.frontiers = list(new)
                solver.refresh(name)
                self.refreshed += 1
        return solver.frontiers()


class GarbageCollector:
    """Garbage collection as the pipeline runs (the streams supervisor's watch, ``falkirk
    gc --follow``): each :meth:`step` moves the low watermarks on (:class:`Watermarks`)
    and, when they moved, drops what they allow (:func:`collect`, applied)."""

    def __init__(self, pipeline: Pipeline, cfg: Config | None = None,
                 log: EpochLog | None = None, retention_hours: float = 1.0):
        self.pipeline, self.cfg = pipeline, cfg or load()
        self.log = log or EpochLog.from_config(self.cfg)
        self.marks = Watermarks(pipeline, self.log)
        self.retention_hours = retention_hours
        self.last: dict[str, Any] | None = None

    def step(self) -> GcReport | None:
        """One look: the report of what was dropped, or None when the watermarks stood."""
        wm = self.marks.update()
        now = {r: f.to_json() for r, f in wm.items()}
        if now == self.last:
            return None
        report = collect(self.pipeline, self.cfg, self.log, apply=True,
                         vacuum_retention_hours=self.retention_hours, watermarks=wm)
        self.last = now
        return report


class Housekeeping:
    """What runs beside a deployed pipeline, each part when it is due: the epoch log's
    compaction every ``compact_every_s`` (None: never; 0: at every step) and garbage
    collection every ``gc_every_s`` (default: the pipeline's ``gc_every_seconds``; 0:
    never) as the low watermarks move. The streams supervisor's watch, a sandbox's
    ``keep_house`` and ``falkirk gc --follow`` call :meth:`step` between their looks: one
    loop's rules in one place. A part that fails is logged and tried again when next
    due: a compaction commits whole or not at all, and what a collection did not drop
    waits for the next."""

    def __init__(self, pipeline: Pipeline, cfg: Config | None = None,
                 log: EpochLog | None = None, compact_every_s: float | None = 60.0,
                 gc_every_s: float | None = None, retention_hours: float = 1.0,
                 say: logging.Logger | None = None, at_once: bool = False):
        self.cfg = cfg or load()
        self.log = log or EpochLog.from_config(self.cfg)
        if gc_every_s is None:
            gc_every_s = float(pipeline.settings.get("gc_every_seconds") or 0)
        self.compact_every_s, self.gc_every_s = compact_every_s, gc_every_s
        self.collector = (GarbageCollector(pipeline, self.cfg, self.log, retention_hours)
                          if gc_every_s else None)
        self.say = say or _log
        # at_once: the first step does everything (else each part waits its interval)
        started = time.monotonic() - (max(compact_every_s or 0, gc_every_s) if at_once
                                       else 0)
        self._compacted = self._collected = started
        self.pipeline = pipeline
        # the last collection's reach back: epoch-log rows before it go with a compaction
        self.log_keep_from: dict[str, int] = {}

    def step(self) -> GcReport | None:
        """Whatever is due now; the garbage collection's report when one ran and the
        watermarks had moved, else None."""
        now = time.monotonic()
        if (self.compact_every_s is not None
                and now - self._compacted >= self.compact_every_s):
            self._compacted = now
            keep = {self.pipeline.name: self.log_keep_from} if self.log_keep_from else None
            folded = self._attempt("compacting the epoch log", self.compact_every_s,
                                   lambda: self.log.compact(keep_from=keep))
            if folded:
                self.say.info("epoch log compacted (table: files folded): %s", folded)
        if self.collector is None or now - self._collected < self.gc_every_s:
            return None
        self._collected = now
        report = self._attempt("collecting garbage", self.gc_every_s, self.collector.step)
        if report is not None:
            self.log_keep_from = report.log_keep_from
        if report is not None and report.items:
            self.say.info("garbage collected below watermarks %s: %s", report.watermarks,
                          "; ".join(f"{i.kind} {i.name}: {i.rows} rows, {i.bytes} bytes"
                                    for i in report.items))
        return report

    def _attempt(self, what: str, every_s: float, part: Callable[[], Any]) -> Any:
        """``part()``, or None when it failed (logged: it is tried again when next due)."""
        try:
            return part()
        except Exception:
            self.say.exception("%s failed; tried again in %.0f s", what, every_s)
            return None


def follow(pipeline: Pipeline, cfg: Config | None = None, every_s: float = 60.0,
           retention_hours: float = 1.0, stop: Callable[[], bool] | None = None,
           on_report: Callable[[GcReport], None] | None = None) -> None:
    """Garbage collection (:class:`Housekeeping`'s, no compaction) every ``every_s``
    seconds until ``stop()`` (default: never)."""
    house = Housekeeping(pipeline, cfg, compact_every_s=None, gc_every_s=every_s,
                         retention_hours=retention_hours, at_once=True)
    while stop is None or not stop():
        report = house.step()
        if report is not None and on_report is not None:
            on_report(report)
        time.sleep(every_s)
