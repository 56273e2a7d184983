"""What the epoch log tells a pipeline's consumers: every epoch a region committed, per
table or topic it wrote, and every rollback carried out, per table and topic it restated.

Airflow turns these into asset events (falkirk.airflow.assets); nothing here knows Airflow.
They are derived from the log alone, in the log's own order (each table's rows as they
were appended, :class:`falkirk.io.lake.AppendOrder`), so reading the log again from its
first row gives the same announcements in the same places of the same two lists: a reader
that kept how far it got (a count per list) goes on from there after a restart.

- A **commit** is announced once per (region, epoch) and place, by the first row that
  commits it (``committed`` or ``checkpointed``) since the epoch was last invalidated: a
  region that checkpoints an epoch it committed before (caught up, or redoing epochs for
  its state after a restart) wrote nothing new. Its extra is :func:`commit_extra`.
- A **restatement** is announced for every output place of every region whose epochs a
  rollback invalidated, once its ``done`` row is in the log (a dry run records nothing):
  those epochs' results are withdrawn, and the region writes them again. Its extra says
  which epochs (``from_epoch`` to ``to_epoch``), the rollback's generation and id, and for
  a table the version it was restored to.

Batch regions (one run per epoch) are announced by their own runs (the batch DAG's task
declares its outputs as outlets), so with ``batch_runs_announce`` their commits are
announced here only when they follow an invalidation of the same epoch: the reruns a
rollback makes itself. Within one read, restatements of generation g come before the
commits of generation g (made after the rollback that raised it): :func:`in_order`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from falkirk.log.epochlog import EpochRecord
from falkirk.model.times import is_whole_epoch
from falkirk.model.topology import Pipeline

if TYPE_CHECKING:
    from falkirk.log.epochlog import EpochLog

GOOD = ("committed", "checkpointed")


@dataclass(frozen=True, order=True)
class Place:
    """An output of a pipeline: a Delta table or a Kafka topic."""

    kind: str  # "table" or "topic"
    name: str

    def __str__(self) -> str:
        return f"{self.kind} {self.name}"


def output_places(pipeline: Pipeline, region: str) -> dict[str, Place]:
    """A region's outputs, by the name of the edge that carries each (edges may share a
    table); unlogged edges are none."""
    out = {}
    for edge in pipeline.out_edges(region):
        if edge.kind == "delta":
            out[edge.name] = Place("table", edge.table)
        elif edge.kind == "kafka":
            out[edge.name] = Place("topic", edge.topic)
    return out


def pipeline_places(pipeline: Pipeline) -> dict[Place, str]:
    """Every output of the pipeline and the region that writes it."""
    return {place: region for region in pipeline.regions
            for place in output_places(pipeline, region).values()}


def commit_extra(pipeline: str, row: EpochRecord, place: Place, written: dict) -> dict[str, Any]:
    """The extra of a commit's announcement: which epoch of which region in which
    generation, and for a table the version that epoch committed (a topic: its records)."""
    extra: dict[str, Any] = {"pipeline": pipeline, "region": row.region, "epoch": row.epoch,
                             "generation": row.generation, place.kind: place.name}
    if place.kind == "table":
        extra["table_version"] = written.get("version")
    else:
        extra["records"] = written.get("records")
    return extra


def epoch_outputs(pipeline: Pipeline, row: EpochRecord) -> dict[Place, dict]:
    """What an epoch log row says its epoch wrote, per place (one entry per table)."""
    places = output_places(pipeline, row.region)
    return {places[edge]: written for edge, written in (row.outputs or {}).items()
            if edge in places}


@dataclass(frozen=True)
class Announcement:
    place: Place
    kind: str  # "commit" or "restatement"
    extra: dict[str, Any]

    @property
    def order(self) -> tuple[int, int]:
        """Restatements of a generation before the commits made in it."""
        return (int(self.extra["generation"]), 0 if self.kind == "restatement" else 1)


def in_order(announcements: list[Announcement]) -> list[Announcement]:
    """New commits and restatements of one read, merged: by generation, a rollback's
    restatements before the commits of the generation it raised, the log's order kept
    otherwise."""
    return sorted(announcements, key=lambda a: a.order)


@dataclass
class Announcements:
    """The announcements of one pipeline's log, derived incrementally as it grows."""

    pipeline: Pipeline
    batch_runs_announce: bool = True
    commits: list[Announcement] = field(default_factory=list)
    restatements: list[Announcement] = field(default_factory=list)
    epoch_rows: int = 0  # rows of the ``epochs`` table read
    rollback_rows: int = 0  # rows of the ``rollbacks`` table read
    _live: set[tuple[str, int]] = field(default_factory=set)  # announced, not invalidated
    _invalidated: set[tuple[str, int]] = field(default_factory=set)  # ever invalidated
    _done: set[str] = field(default_factory=set)  # rollbacks announced

    def read(self, epoch_log: EpochLog) -> bool:
        """Read what the log appended since the last read; whether anything was announced."""
        before = (len(self.commits), len(self.restatements))
        rows = epoch_log.records(self.pipeline.name)
        self.feed_epochs(rows[self.epoch_rows:])
        rollbacks = epoch_log.rollbacks(self.pipeline.name)
        self.feed_rollbacks(rollbacks[self.rollback_rows:])
        return (len(self.commits), len(self.restatements)) != before

    def feed_epochs(self, rows: list[EpochRecord]) -> None:
        for row in rows:
            self.epoch_rows += 1
            if row.region not in self.pipeline.regions:
                continue
            key = (row.region, row.epoch)
            if row.status == "invalidated":
                self._live.discard(key)
                self._invalidated.add(key)
                continue
            if (row.status not in GOOD or key in self._live or not row.outputs
                    or not is_whole_epoch(row.time)):
                continue
            self._live.add(key)
            batch = self.pipeline.regions[row.region].regime_rules.runs_per_epoch
            if batch and self.batch_runs_announce and key not in self._invalidated:
                continue  # its run in the batch DAG announces it
            for place, written in sorted(epoch_outputs(self.pipeline, row).items()):
                self.commits.append(Announcement(
                    place, "commit", commit_extra(self.pipeline.name, row, place, written)))

    def feed_rollbacks(self, rows: list[dict]) -> None:
        for row in rows:
            self.rollback_rows += 1
            if row["status"] != "done" or row["rollback_id"] in self._done:
                continue
            self._done.add(row["rollback_id"])
            self.restatements.extend(restatements(self.pipeline, row["plan"]))


def restated_epochs(plan: dict) -> dict[str, tuple[int, int]]:
    """Per region, the first and last epoch a rollback plan invalidated."""
    out: dict[str, tuple[int, int]] = {}
    for inv in plan["invalidate"]:
        t = inv["time"]
        epoch = int(t[0] if isinstance(t, list) else t)
        lo, hi = out.get(inv["region"], (epoch, epoch))
        out[inv["region"]] = (min(lo, epoch), max(hi, epoch))
    return out


def restatements(pipeline: Pipeline, plan: dict) -> list[Announcement]:
    """A carried-out rollback's announcements: one per output place of each region whose
    epochs it invalidated."""
    restored = {t["table"]: t["to_version"] for t in plan["tables"]}
    out = []
    for region, (first, last) in sorted(restated_epochs(plan).items()):
        if region not in pipeline.regions:
            continue
        for place in sorted(set(output_places(pipeline, region).values())):
            extra: dict[str, Any] = {
                "pipeline": plan["pipeline"], "region": region, "restated": True,
                "from_epoch": first, "to_epoch": last, "generation": plan["generation"],
                "rollback_id": plan["rollback_id"], place.kind: place.name}
            if place.kind == "table":
                extra["restored_to_version"] = restored.get(place.name)
            out.append(Announcement(place, "restatement", extra))
    return out
