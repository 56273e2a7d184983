"""A pipeline's outputs as Airflow assets, and the asset events that announce its epochs
and its rollbacks' restatements (docs/assets.md).

Every Delta table and Kafka topic a pipeline writes is an asset (:func:`output_asset`):
its URI is the store's (``file:///…/lake/item_popularity``, ``s3://bucket/lake/…``,
``kafka://host:port/responses``: :func:`falkirk.io.lineage.dataset_uri`, the same place
OpenLineage names), its name ``<pipeline>.<table>`` (``<pipeline>.topic.<topic>``).
Events reach them two ways, each the supported one for where the commit happens:

- a **batch** region's run (its task in ``falkirk_<p>_batch_<region>``) declares the
  region's outputs as outlets and sets each event's extra from the epoch log row of its
  epoch (:func:`announce_epoch`): ``{pipeline, region, epoch, generation, table,
  table_version}``;
- everything else, which happens outside any task (stream regions' commits, the reruns
  and restatements of every rollback, whoever ran it), comes from the epoch log through
  an **asset watcher** on each asset (:class:`EpochLogTrigger`): the triggerer reads the
  log once for all of a pipeline's assets (a shared stream: one reader, every table
  left alone) and each asset's trigger yields the announcements naming it
  (:mod:`falkirk.log.announcements`). Airflow keeps such an event's extra under
  ``payload`` (``{"from_trigger": true, "payload": {…}}``); :func:`epoch_events` gives a
  consumer the same dicts from both.

Airflow runs an asset's watcher only while an unpaused DAG is scheduled on the asset:
``falkirk_<p>_outputs`` (made unpaused by the factory) is, so the events flow whether or
not any consumer DAG is on; its runs, an EmptyOperator each (no worker runs it), list
the events as they come.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from airflow.sdk import Asset, AssetWatcher
from airflow.sdk.exceptions import AirflowFailException
from airflow.triggers.base import BaseEventTrigger, TriggerEvent

from falkirk.config import Config, load
from falkirk.io.lineage import dataset_uri, region_datasets, run_facet, table_dataset, topic_dataset
from falkirk.log.announcements import (
    Announcement,
    Announcements,
    Place,
    commit_extra,
    epoch_outputs,
    in_order,
    output_places,
    pipeline_places,
    restated_epochs,
)
from falkirk.model.topology import Pipeline, load_pipeline

log = logging.getLogger(__name__)

#: How often the triggerer reads the epoch log for new commits and rollbacks, in seconds.
POLL_S = 2.0
#: How often the shared stream hands its subscribers the log as read even when nothing
#: changed: a trigger that joined after the last change (a triggerer restart, a new
#: asset) catches up from its cursor within this long.
HEARTBEAT_S = 30.0
CURSOR_KEY = "falkirk_epoch_log_cursor"


def asset_name(pipeline: str, place: Place) -> str:
    return (f"{pipeline}.{place.name}" if place.kind == "table"
            else f"{pipeline}.topic.{place.name}")


def asset_uri(cfg: Config, place: Place) -> str:
    ds = table_dataset(cfg, place.name) if place.kind == "table" else topic_dataset(
        cfg, place.name)
    return dataset_uri(*ds)


def output_asset(pipeline: str | Pipeline, place: Place | str, cfg: Config | None = None
                 ) -> Asset:
    """The asset of one output of a pipeline (``place``: a Place, or a table's name), with
    its epoch log watcher. Every DAG that names it (the generated ones, a consumer's)
    declares the same asset."""
    pipe = pipeline if isinstance(pipeline, Pipeline) else load_pipeline(pipeline)
    writers = pipeline_places(pipe)
    if isinstance(place, str):
        place = Place("table", place)
    if place not in writers:
        raise ValueError(f"pipeline {pipe.name!r} writes no {place} (its outputs: "
                         f"{', '.join(sorted(str(p) for p in writers))})")
    cfg = cfg or load()
    trigger = EpochLogTrigger(pipe.name, place.kind, place.name)
    return Asset(name=asset_name(pipe.name, place), uri=asset_uri(cfg, place),
                 group=f"falkirk.{pipe.name}",
                 extra={"pipeline": pipe.name, "region": writers[place], "kind": place.kind},
                 watchers=[AssetWatcher(name=f"falkirk_{pipe.name}_epoch_log", trigger=trigger)])


def lake_asset(name: str, table: str, cfg: Config | None = None) -> Asset:
    """The asset of a table of the lake that no pipeline writes (a consumer's own), its
    URI of the same kind as the pipelines' tables'."""
    return Asset(name=name, uri=asset_uri(cfg or load(), Place("table", table)))


def lake_table(table: str, cfg: Config | None = None) -> tuple[str, dict[str, str] | None]:
    """Where a table of the lake is and the storage options to open it with (delta-rs),
    so a consumer DAG reads and writes the tables where the pipeline does."""
    cfg = cfg or load()
    return cfg.table(table), cfg.delta_storage_options or None


def pipeline_assets(pipeline: Pipeline, cfg: Config | None = None) -> dict[Place, Asset]:
    """Every output of the pipeline as its asset."""
    cfg = cfg or load()
    return {place: output_asset(pipeline, place, cfg)
            for place in sorted(pipeline_places(pipeline))}


def region_assets(pipeline: Pipeline, region: str, cfg: Config | None = None) -> list[Asset]:
    """The assets a region writes (a batch run's outlets)."""
    return [output_asset(pipeline, place, cfg)
            for place in sorted(set(output_places(pipeline, region).values()))]


# ---- a batch run's outlet events -----------------------------------------------------


def announce_epoch(context: Mapping[str, Any], pipeline: Pipeline, region: str,
                   epochs: list[int]) -> Any:
    """Set the extra of each outlet event of a batch run from its last epoch's committed
    row (a run that caught up over several epochs: with ``from_epoch``, its first; the
    table's version is the last epoch's, which holds them all); the run's OpenLineage
    metadata (inputs, outputs, the falkirk run facet)."""
    from airflow.providers.openlineage.extractors import OperatorLineage

    from falkirk.log.epochlog import EpochLog
    from falkirk.model.times import DOMAINS, time_of

    spec = pipeline.regions[region]
    epoch = epochs[-1]
    entries = EpochLog.from_config().regions(pipeline)[region].entries
    row = entries.get(DOMAINS[spec.domain].parse(time_of(spec.domain, epoch)))
    if row is None or row.status not in ("committed", "checkpointed"):
        raise AirflowFailException(
            f"{region} epoch {epoch}: the epoch log shows "
            f"{'nothing' if row is None else repr(row.status)}, not committed: nothing "
            "announced")
    cfg = load()
    for place, written in epoch_outputs(pipeline, row).items():
        extra = commit_extra(pipeline.name, row, place, written)
        if len(epochs) > 1:
            extra["from_epoch"] = epochs[0]
        context["outlet_events"][output_asset(pipeline, place, cfg)].extra = extra
        log.info("announced %s: %s", asset_name(pipeline.name, place), extra)
    inputs, outputs = region_datasets(cfg, pipeline, region, row.inputs, row.outputs)
    return OperatorLineage(inputs=inputs, outputs=outputs, run_facets={
        "falkirk": run_facet(pipeline.name, region, row.epoch, row.generation)})


def rollback_lineage(pipeline: Pipeline, plan: dict) -> Any:
    """A carried-out rollback's OpenLineage metadata: the tables and topics it restated
    as outputs, the falkirk run facet with its generation and restated epochs."""
    from airflow.providers.openlineage.extractors import OperatorLineage

    cfg = load()
    restated = restated_epochs(plan)
    outputs = [ds for region in sorted(restated)
               for ds in region_datasets(cfg, pipeline, region)[1]]
    return OperatorLineage(outputs=outputs, run_facets={"falkirk": run_facet(
        pipeline.name, generation=plan["generation"], restated={
            "rollback_id": plan["rollback_id"],
            "regions": {r: list(span) for r, span in sorted(restated.items())}})})


# ---- a consumer's view ---------------------------------------------------------------


def epoch_events(triggering_asset_events: Mapping[Any, Sequence[Any]],
                 asset: Asset) -> list[dict[str, Any]]:
    """The falkirk extras of a run's triggering events of ``asset``, oldest first: a
    commit's ``{pipeline, region, epoch, generation, table, table_version}`` (a topic:
    ``topic, records``) or a restatement's ``{restated: true, from_epoch, to_epoch,
    generation, rollback_id, …}``. A batch run's outlet event carries them as its extra,
    the epoch log watcher's under ``payload``; other events of the asset are left out."""
    if asset not in triggering_asset_events:
        return []
    out = []
    for event in sorted(triggering_asset_events[asset], key=lambda e: e.timestamp):
        extra = dict(event.extra or {})
        if extra.get("from_trigger"):
            extra = dict(extra.get("payload") or {})
        if "pipeline" in extra and "generation" in extra:
            out.append(extra)
    return out


# ---- the epoch log's watcher ---------------------------------------------------------


@dataclass(frozen=True)
class LogView:
    """The epoch log as the shared stream read it: its announcements so far (the lists
    only grow, so a trigger reads ``[cursor:n]`` of them safely while the next read
    appends)."""

    log: str
    commits: list[Announcement]
    n_commits: int
    restatements: list[Announcement]
    n_restatements: int


class EpochLogTrigger(BaseEventTrigger):
    """Yields an event for each announcement of its pipeline's epoch log that names its
    place (a table or topic): commits outside the batch runs, and restatements.

    The triggers of one pipeline share one reader of the log (``shared_stream_key``): the
    triggerer reads it every :data:`POLL_S` seconds, incrementally, and hands each trigger
    the announcements so far. How far each asset got is kept in Airflow's asset state
    store (``asset_state_store``), so a restarted triggerer goes on from there: events
    are announced at least once (an event yielded but not yet stored when the triggerer
    dies comes again)."""

    def __init__(self, pipeline: str, kind: str, name: str, interval_s: float = POLL_S):
        super().__init__()
        self.pipeline, self.kind, self.name, self.interval_s = pipeline, kind, name, interval_s

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{__name__}.EpochLogTrigger", {"pipeline": self.pipeline, "kind": self.kind,
                                                "name": self.name,
                                                "interval_s": self.interval_s})

    def shared_stream_key(self) -> tuple[str, str, float]:
        return ("falkirk.epoch_log", self.pipeline, self.interval_s)

    @classmethod
    async def open_shared_stream(cls, kwargs: dict[str, Any]) -> AsyncIterator[LogView]:
        """Read the pipeline's log as it grows; a view after each read that announced
        something, and every :data:`HEARTBEAT_S` seconds. A read that fails (no lake yet, a
        store away) is logged and tried again: the stream never ends of it."""
        from falkirk.log.epochlog import EpochLog

        pipeline = await asyncio.to_thread(load_pipeline, kwargs["pipeline"])
        feed = Announcements(pipeline)
        epoch_log = EpochLog.from_config()
        shown, failing = float("-inf"), ""
        while True:
            try:
                grew = await asyncio.to_thread(feed.read, epoch_log)
                failing = ""
            except Exception as exc:  # tried again at the next look
                if str(exc) != failing:
                    log.warning("reading the epoch log of %s failed (tried again every "
                                "%.0f s): %s", pipeline.name, kwargs["interval_s"], exc)
                failing, grew = str(exc), False
            if grew or time.monotonic() - shown >= HEARTBEAT_S:
                shown = time.monotonic()
                yield LogView(epoch_log.root, feed.commits, len(feed.commits),
                              feed.restatements, len(feed.restatements))
            await asyncio.sleep(kwargs["interval_s"])

    async def _cursor(self) -> dict[str, Any] | None:
        if self.asset_state_store is None:
            return None
        return await self.asset_state_store.aget(CURSOR_KEY)

    async def _keep(self, cursor: dict[str, Any]) -> None:
        if self.asset_state_store is not None:
            await self.asset_state_store.aset(CURSOR_KEY, cursor)

    async def filter_shared_stream(self, shared_stream: AsyncIterator[Any]
                                   ) -> AsyncIterator[TriggerEvent]:
        place = Place(self.kind, self.name)
        cursor = await self._cursor()
        async for view in shared_stream:
            start = (0, 0)
            if cursor is not None:
                start = (cursor["commits"], cursor["restatements"])
                if cursor["log"] != view.log or start[0] > view.n_commits \
                        or start[1] > view.n_restatements:
                    log.warning("%s: the epoch log at %s is not the one announced up to "
                                "%s: announcing it from its first row", place, view.log,
                                cursor)
                    start = (0, 0)
            new = [a for a in view.commits[start[0]:view.n_commits] if a.place == place]
            new += [a for a in view.restatements[start[1]:view.n_restatements]
                    if a.place == place]
            for announcement in in_order(new):
                yield TriggerEvent(announcement.extra)
            if start != (view.n_commits, view.n_restatements) or cursor is None:
                cursor = {"log": view.log, "commits": view.n_commits,
                          "restatements": view.n_restatements}
                await self._keep(cursor)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Alone (a triggerer that shares no stream): its own reader of the log."""
        async for event in self.filter_shared_stream(
                self.open_shared_stream(self.serialize()[1])):
            yield event
