"""The epoch log: what every region persisted for every frontier it can restore to.

Delta tables written through delta-rs (schemas in ``falkirk/schemas/tables``):

- ``epochs``: one row per change of a region's epoch in a generation (running,
  committed, checkpointed, invalidated), with the metadata of docs/model.md:
  the input range each edge delivered, N_e, π_e, D_e, the output versions, S(f).
- ``collected``: garbage collection's progress per logged edge (what a sender can no
  longer send again) and the Kafka offsets acknowledged.

Both are append-only: concurrent regions never update each other's rows, so two
commits at once only race for the next table version, which delta-rs retries; we
retry on top of that when it gives up. Rows are read in the log's own order (the version
that appended them), never by their ``recorded_at`` wall clock. delta-rs is the log's one
writing engine (jobs, the CLI and Airflow tasks all append through it). From the log we
build the solver's problem for the live pipeline.
"""

from __future__ import annotations

import json
import random
import time as _time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa

from falkirk.errors import FalkirkError
from falkirk.io.lake import COMPACT_MIN_FILES, TABLE_CONFIGURATION, AppendOrder
from falkirk.model.schemas import arrow_schema
from falkirk.model.times import DOMAINS, Domain, Offsets, is_whole_epoch, project, shift
from falkirk.model.topology import Pipeline
from falkirk.regimes import REGIMES
from falkirk.solver.frontier import Edge, Entry, Problem, Region

STATUSES = ("running", "committed", "checkpointed", "invalidated", "quarantined")
#: Rows of the ``collected`` table that are fold requests (a region's, not an edge's).
FOLD_PREFIX = "checkpoints:"
#: The log's tables (each append-only, one file an append).
LOG_TABLES = ("epochs", "rollbacks", "fences", "leases", "job_runs", "ends", "bounds",
              "collected", "checks")


def _epochs_from(keep_from: dict[str, dict[str, int]]) -> Any:
    """``epochs`` rows but those of a region of ``keep_from`` before its epoch there."""
    def select(rows: list[dict]) -> list[dict]:
        return [r for r in rows
                if (bound := keep_from.get(r["pipeline"], {}).get(r["region"])) is None
                or EpochRecord.from_row(r).epoch >= bound]
    return select


def _latest_collected(rows: list[dict]) -> list[dict]:
    """``collected`` rows but those a later row of the same pipeline and edge replaced."""
    last = {(r["pipeline"], r["edge"]): i for i, r in enumerate(rows)}
    return [r for i, r in enumerate(rows) if last[(r["pipeline"], r["edge"])] == i]


class EpochLogError(FalkirkError):
    """The epoch log cannot answer as asked (unknown region, bad row)."""


@dataclass
class EpochRecord:
    """One row of the epoch log. Times are JSON values in the region's domain."""

    pipeline: str
    region: str
    time: Any
    generation: int
    status: str
    inputs: dict | None = None
    delivered: dict | None = None
    outputs: dict | None = None
    projected: dict | None = None
    discarded: dict | None = None
    state_ref: str | None = None
    notification: Any = None
    recorded_at: datetime | None = None
    note: str | None = None

    @property
    def epoch(self) -> int:
        return self.time[0] if isinstance(self.time, list) else int(self.time)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise EpochLogError(
                f"epoch log: region {self.region!r} epoch {self.time!r}: unknown status "
                f"{self.status!r} (known: {', '.join(STATUSES)})"
            )

    def to_row(self) -> dict:
        def js(v: Any) -> str | None:
            return None if v is None else json.dumps(v, sort_keys=True)

        return {
            "pipeline": self.pipeline, "region": self.region, "epoch": self.epoch,
            "time": json.dumps(self.time), "generation": self.generation, "status": self.status,
            "inputs": js(self.inputs), "delivered": js(self.delivered),
            "outputs": js(self.outputs), "projected": js(self.projected),
            "discarded": js(self.discarded), "state_ref": self.state_ref,
            "notification": js(self.notification),
            "recorded_at": self.recorded_at or datetime.now(UTC), "note": self.note,
        }

    @classmethod
    def from_row(cls, row: dict) -> EpochRecord:
        def unjs(v: str | None) -> Any:
            return None if v is None else json.loads(v)

        return cls(
            row["pipeline"], row["region"], json.loads(row["time"]), row["generation"],
            row["status"], unjs(row["inputs"]), unjs(row["delivered"]), unjs(row["outputs"]),
            unjs(row["projected"]), unjs(row["discarded"]), row["state_ref"],
            unjs(row["notification"]), row["recorded_at"], row["note"],
        )


@dataclass
class RegionLog:
    """The effective log of one region: per time, the row that counts."""

    region: str
    domain: Domain
    entries: dict[Any, EpochRecord] = field(default_factory=dict)  # key -> latest valid row

    def restorable(self, regime: str, replay: bool = False) -> list[EpochRecord]:
        """Rows the region can restore to: never at or past a quarantined epoch (a frontier
        vouches for every epoch up to it). With ``replay``, also the rows its regime
        reaches by replay (a lazy region's committed epochs; only the solver's problem
        asks: a restart and garbage collection need the checkpoints)."""
        rules = REGIMES[regime]
        rows: list[EpochRecord] = []
        chain: int | None = -1  # the last epoch a replay can reach (⊥: the initial state)
        for _, r in sorted(self.entries.items(), key=lambda kv: kv[0]):
            if r.status == "quarantined":
                break
            whole = is_whole_epoch(r.time)
            if r.status in rules.restorable:
                rows.append(r)
                chain = r.epoch if whole else None
            elif replay and whole and r.status in rules.replays and chain == r.epoch - 1:
                rows.append(r)  # every epoch since the restorable row before is committed
                chain = r.epoch
            elif whole:
                chain = None  # an epoch not committed: no replay reaches past it
        return rows

    def readable(self, key: Any, epoch: int, side_input: bool = False,
                 checked: set[tuple[int, int]] | None = None) -> EpochRecord | None | bool:
        """What a receiver reads for this region's epoch (``key``: its time): the row;
        ``None`` (read nothing: a side input with no good epoch yet); ``False`` (wait).

        A quarantined epoch, and every later one, is never read: a receiver waits; a side
        input (a delayed edge, read as of an earlier epoch) reads the last good epoch
        before it. With ``checked`` (the pipeline holds epochs until their data checks
        pass: the (epoch, generation) pairs that passed), an epoch not checked yet is not
        read (a side input waits too: answers must not depend on when checks ran).
        """
        def good(r: EpochRecord) -> bool:
            return r.status in ("committed", "checkpointed") and (
                checked is None or (r.epoch, r.generation) in checked)

        held = self.quarantined()
        if held and held[0].epoch <= epoch:  # held back with everything after it
            if not side_input:
                return False
            ok = [r for r in self.entries.values() if r.epoch < held[0].epoch and good(r)]
            return max(ok, key=lambda r: r.epoch) if ok else None
        row = self.entries.get(key)
        return row if row is not None and good(row) else False

    def quarantined(self) -> list[EpochRecord]:
        """Epochs held back because their data checks failed."""
        return [r for _, r in sorted(self.entries.items(), key=lambda kv: kv[0])
                if r.status == "quarantined"]

    @property
    def latest(self) -> EpochRecord | None:
        if not self.entries:
            return None
        return self.entries[max(self.entries)]


def _with_retry(what: str, fn, attempts: int = 20) -> Any:
    """Run a Delta commit, retrying when another writer took the version we wanted."""
    from deltalake.exceptions import CommitFailedError

    for attempt in range(attempts):
        try:
            return fn()
        except CommitFailedError:
            if attempt == attempts - 1:
                raise
            _time.sleep(min(0.5, 0.01 * 2 ** attempt) * (0.5 + random.random()))
    raise AssertionError("unreachable")


class EpochLog:
    """Reads and appends the epoch log tables under one root (a folder or object-store URI)."""

    def __init__(self, root: str, storage_options: dict[str, str] | None = None):
        self.root = root.rstrip("/")
        self.storage_options = storage_options or None
        self._orders: dict[str, AppendOrder] = {}  # log table -> its commit order, cached

    @classmethod
    def from_config(cls, cfg=None) -> EpochLog:
        from falkirk.config import load

        cfg = cfg or load()
        return cls(cfg.table("_falkirk_log"), cfg.delta_storage_options)

    def uri(self, table: str) -> str:
        return f"{self.root}/{table}"

    # ---- writing --------------------------------------------------------------------

    def _append(self, table: str, rows: list[dict]) -> None:
        from deltalake import CommitProperties, write_deltalake

        if not rows:
            return
        data = pa.Table.from_pylist(rows, schema=arrow_schema("tables", table))
        _with_retry(
            f"append to {table}",
            lambda: write_deltalake(
                self.uri(table), data, mode="append", storage_options=self.storage_options,
                configuration=TABLE_CONFIGURATION,
                commit_properties=CommitProperties(max_commit_retries=50),
            ),
        )

    def record(self, *records: EpochRecord) -> None:
        """Append rows to the epoch log (one commit)."""
        self._append("epochs", [r.to_row() for r in records])

    def record_collected(self, pipeline: str, edge: str, through: Any,
                         offsets: Offsets | None = None) -> None:
        self._append("collected", [{
            "pipeline": pipeline, "edge": edge, "through": json.dumps(through),
            "offsets": None if offsets is None else json.dumps(offsets.as_dict()),
            "recorded_at": datetime.now(UTC),
        }])

    # ---- reading --------------------------------------------------------------------

    def _order(self, table: str) -> AppendOrder | None:
        """The reader of one log table (kept: it keeps what it read), or None while the
        table does not exist."""
        from deltalake import DeltaTable

        uri = self.uri(table)
        if table not in self._orders:
            if not DeltaTable.is_deltatable(uri, storage_options=self.storage_options):
                return None
            self._orders[table] = AppendOrder(uri, self.storage_options)
        return self._orders[table]

    def _read(self, table: str, pipeline: str) -> list[dict]:
        """A pipeline's rows of one log table, in the order they were appended."""
        order = self._order(table)
        return [] if order is None else order.read(filters=[("pipeline", "=", pipeline)])

    def compact(self, min_files: int = COMPACT_MIN_FILES,
                keep_from: dict[str, dict[str, int]] | None = None) -> dict[str, int]:
        """Compact each log table of at least ``min_files`` files into one, keeping the
        order of its rows (:meth:`falkirk.io.lake.AppendOrder.compact`): table -> files
        folded. The streams supervisor's watch calls it as it goes, so a new reader of
        the log opens at most about ``min_files`` files of each table, however long the
        pipeline has run.

        What no reader needs goes with the fold, so the log stays as long as the
        pipeline's reach back, not its age: rows of ``collected`` another row of the same
        pipeline and edge has replaced (its readers take the latest), and with
        ``keep_from`` (pipeline -> region -> epoch: garbage collection's
        :func:`falkirk.recovery.gc.log_keep_from`) a region's ``epochs`` rows of epochs
        before that, which no rollback can restore to or replay from."""
        folded = {}
        for table in LOG_TABLES:
            order = self._order(table)
            select = {"epochs": _epochs_from(keep_from or {}),
                      "collected": _latest_collected}.get(table)
            if order is not None and (n := order.compact(min_files, select)) is not None:
                folded[table] = n
        return folded

    def records(self, pipeline: str) -> list[EpochRecord]:
        """Every row of a pipeline, in the order they were appended to the log."""
        return [EpochRecord.from_row(r) for r in self._read("epochs", pipeline)]

    def generation(self, pipeline: str) -> int:
        """The current generation: the highest any epoch, rollback or fence was recorded in
        (a rollback that fenced regions and crashed before its plan still moved it on)."""
        epochs = (r.generation for r in self.records(pipeline))
        rollbacks = (r["generation"] for r in self._read("rollbacks", pipeline))
        fences = (r["generation"] for r in self._read("fences", pipeline))
        return max((*epochs, *rollbacks, *fences), default=0)

    def record_rollback(self, pipeline: str, rollback_id: str, generation: int, status: str,
                        request: dict, plan: dict) -> None:
        self._append("rollbacks", [{
            "pipeline": pipeline, "rollback_id": rollback_id, "generation": generation,
            "status": status, "request": json.dumps(request, sort_keys=True),
            "plan": json.dumps(plan, sort_keys=True), "recorded_at": datetime.now(UTC),
        }])

    def record_fence(self, pipeline: str, generation: int, regions: list[str]) -> None:
        """A rollback to ``generation`` is about to stop ``regions``: from now on their jobs
        (of older generations) may not record an epoch."""
        self._append("fences", [{"pipeline": pipeline, "generation": generation,
                                 "regions": json.dumps(sorted(regions)),
                                 "recorded_at": datetime.now(UTC)}])

    def record_lease(self, pipeline: str, lease: str, token: str, action: str,
                     holder: dict, expires_at: datetime | None) -> None:
        """One row of a lease's history (see :mod:`falkirk.recovery.lease`)."""
        self._append("leases", [{"pipeline": pipeline, "lease": lease, "token": token,
                                 "action": action, "holder": json.dumps(holder, default=str),
                                 "expires_at": expires_at, "recorded_at": datetime.now(UTC)}])

    def lease_rows(self, pipeline: str, lease: str) -> list[dict]:
        """A lease's rows in commit order."""
        return [r for r in self._read("leases", pipeline) if r["lease"] == lease]

    def fenced(self, pipeline: str, regions: Iterable[str], generation: int) -> int | None:
        """The newest generation after ``generation`` that fenced one of ``regions``, or
        None: a job of ``generation`` hosting them must not record another epoch."""
        mine = set(regions)
        found = [r["generation"] for r in self._read("fences", pipeline)
                 if r["generation"] > generation and mine & set(json.loads(r["regions"]))]
        return max(found, default=None)

    def record_end(self, pipeline: str, regions: Iterable[str], through: int,
                   generation: int) -> None:
        """The regions' input ended: no epoch after ``through`` will ever come."""
        now = datetime.now(UTC)
        self._append("ends", [{"pipeline": pipeline, "region": r, "through": through,
                               "generation": generation, "recorded_at": now} for r in regions])

    def record_bound(self, pipeline: str, topic: str, offsets: dict[str, int]) -> None:
        """The pipeline's input ``topic`` ends at ``offsets`` (per partition, exclusive)."""
        self._append("bounds", [{"pipeline": pipeline, "topic": topic,
                                 "offsets": json.dumps(offsets, sort_keys=True),
                                 "recorded_at": datetime.now(UTC)}])

    def bounds(self, pipeline: str) -> dict[str, dict[str, int]]:
        """Per bounded input topic: its end offsets (the latest declaration)."""
        return {row["topic"]: json.loads(row["offsets"])
                for row in self._read("bounds", pipeline)}

    def record_job_run(self, pipeline: str, job: str, regions: Iterable[str], generation: int,
                       status: str, exit_code: int | None = None,
                       last_epoch: int | None = None, message: str | None = None,
                       process: dict | None = None) -> None:
        """A job process started, finished or failed (written by the job itself), or was
        stopped (written by who stopped it: ``process`` names the job's process then)."""
        from falkirk.model.process import this_process

        me = this_process()
        if process is not None:
            me = {k: process.get(k) if process.get(k) is not None else me[k] for k in me}
        self._append("job_runs", [{
            "pipeline": pipeline, "job": job, "regions": json.dumps(sorted(regions)),
            "generation": generation, "pid": me["pid"], "host": me["host"],
            "process_started": me["started"], "status": status, "exit_code": exit_code,
            "last_epoch": last_epoch, "message": message, "recorded_at": datetime.now(UTC),
        }])

    def job_run_rows(self, pipeline: str) -> list[dict]:
        """Every start and end row of a pipeline's jobs, in commit order."""
        return self._read("job_runs", pipeline)

    def job_runs(self, pipeline: str) -> dict[str, dict]:
        """Per job: its latest start or end row (see falkirk/schemas/tables/job_runs.json)."""
        out: dict[str, dict] = {}
        for row in self.job_run_rows(pipeline):
            out[row["job"]] = row
        return out

    def ends(self, pipeline: str) -> dict[str, int]:
        """Per region whose input ended: its last epoch."""
        out: dict[str, int] = {}
        for row in self._read("ends", pipeline):
            out[row["region"]] = max(out.get(row["region"], row["through"]), row["through"])
        return out

    def record_checks(self, rows: list[dict]) -> None:
        """Append data-check results (see falkirk/schemas/tables/checks.json)."""
        self._append("checks", rows)

    def checks(self, pipeline: str) -> list[dict]:
        """Every data-check result of a pipeline, oldest first."""
        return self._read("checks", pipeline)

    def passed_checks(self, pipeline: str) -> dict[str, set[tuple[int, int]]]:
        """Per region, the (epoch, generation) whose latest result of every check passed."""
        latest: dict[tuple[str, int, int, str], bool] = {}
        for r in self.checks(pipeline):
            latest[(r["region"], r["epoch"], r["generation"], r["check"])] = r["success"]
        ok: dict[tuple[str, int, int], bool] = {}
        for (region, epoch, generation, _), success in latest.items():
            ok[(region, epoch, generation)] = ok.get((region, epoch, generation), True) and success
        out: dict[str, set[tuple[int, int]]] = {}
        for (region, epoch, generation), success in ok.items():
            if success:
                out.setdefault(region, set()).add((epoch, generation))
        return out

    def rollbacks(self, pipeline: str) -> list[dict]:
        """Rollback rows, oldest first, with request and plan decoded."""
        rows = self._read("rollbacks", pipeline)
        return [{**r, "request": json.loads(r["request"]), "plan": json.loads(r["plan"])}
                for r in rows]

    def unfinished_rollback(self, pipeline: str) -> dict | None:
        """The latest rollback that started and never finished (its runner crashed)."""
        state: dict[str, dict] = {}
        for r in self.rollbacks(pipeline):
            state[r["rollback_id"]] = r
        pending = [r for r in state.values() if r["status"] == "started"]
        return pending[-1] if pending else None

    def collected(self, pipeline: str) -> dict[str, tuple[Any, dict | None]]:
        """Per logged edge: the time through which its log was dropped, and acked offsets."""
        out: dict[str, tuple[Any, dict | None]] = {}
        for row in self._read("collected", pipeline):
            if row["edge"].startswith(FOLD_PREFIX):
                continue
            out[row["edge"]] = (json.loads(row["through"]),
                                None if row["offsets"] is None else json.loads(row["offsets"]))
        return out

    def record_fold(self, pipeline: str, region: str, keep_from: int) -> None:
        """Garbage collection asks ``region``'s job to fold its checkpoints older than
        ``keep_from`` (``CheckpointStore.retain``): the job is its store's one writer, so
        it does so itself, after its next epoch (a fold beside its save would lose it)."""
        self.record_collected(pipeline, f"{FOLD_PREFIX}{region}", keep_from)

    def folds(self, pipeline: str) -> dict[str, int]:
        """Per region, the checkpoint garbage collection last asked it to keep from."""
        return {row["edge"][len(FOLD_PREFIX):]: int(json.loads(row["through"]))
                for row in self._read("collected", pipeline)
                if row["edge"].startswith(FOLD_PREFIX)}

    def regions(self, pipeline: Pipeline) -> dict[str, RegionLog]:
        """The effective log per region.

        The latest row per (region, time, generation) is that epoch's status in that
        generation; an invalidated one no longer counts. Among generations the newest
        that still counts wins (the epoch was redone after a rollback).
        """
        latest: dict[tuple[str, Any, int], EpochRecord] = {}
        for r in self.records(pipeline.name):
            if r.region not in pipeline.regions:
                continue
            dom = DOMAINS[pipeline.regions[r.region].domain]
            latest[(r.region, dom.parse(r.time), r.generation)] = r
        logs = {name: RegionLog(name, DOMAINS[spec.domain])
                for name, spec in pipeline.regions.items()}
        for (region, key, generation), r in sorted(latest.items(), key=lambda kv: kv[0][2]):
            if r.status == "invalidated":
                held = logs[region].entries.get(key)
                if held is not None and held.generation <= generation:
                    del logs[region].entries[key]
                continue
            logs[region].entries[key] = r
        return logs

    # ---- the solver's problem -------------------------------------------------------

    def problem(self, pipeline: Pipeline, failed: Iterable[str] = (),
                at_most: dict[str, Any] | None = None, replay: bool = True) -> Problem:
        """The consistent-frontier problem of the live pipeline.

        F(p) comes from the rows that make a frontier under p's regime, and with
        ``replay`` the rows it reaches by replay where every input of p can be read again
        (garbage collection asks without: a replay needs the checkpoint before its
        frontier and the inputs since); ⊤ is offered for a region that has not failed.
        Where a row does not say, π_e follows the domain's default projection and D_e is
        π_e on an unlogged edge and what garbage collection dropped (capped by π_e) on a
        logged one.
        """
        failed = set(failed)
        unknown = failed - set(pipeline.regions)
        if unknown:
            raise EpochLogError(
                f"pipeline {pipeline.name!r} has no region(s) {sorted(unknown)} "
                f"(regions: {', '.join(pipeline.regions)})"
            )
        logs = self.regions(pipeline)
        collected = self.collected(pipeline.name)
        edges = {
            e.name: Edge(e.name, e.src, e.dst, DOMAINS[pipeline.edge_domain(e)], e.logged)
            for e in pipeline.edges.values()
        }
        problem = Problem({}, edges, f"pipeline {pipeline.name} from the epoch log")
        for name, spec in pipeline.regions.items():
            dom = DOMAINS[spec.domain]
            log = logs[name]
            outs, ins = pipeline.out_edges(name), pipeline.in_edges(name)

            def entry(r: EpochRecord | None, live: bool, dom=dom, outs=outs, ins=ins) -> Entry:
                at = dom.top if live else dom.parse(r.time)
                delivered = {}
                for e in ins:
                    ed = edges[e.name].domain
                    given = (r.delivered or {}).get(e.name) if r else None
                    delivered[e.name] = ed.parse(given) if given is not None else (
                        shift(ed, project(dom, ed, at), -e.delay) if not live else ed.bottom)
                projected, discarded = {}, {}
                for e in outs:
                    ed = edges[e.name].domain
                    given = (r.projected or {}).get(e.name) if (r and not live) else None
                    pi = ed.parse(given) if given is not None else project(dom, ed, at)
                    projected[e.name] = pi
                    given_d = (r.discarded or {}).get(e.name) if (r and not live) else None
                    if given_d is not None:
                        discarded[e.name] = ed.parse(given_d)
                    elif e.logged:
                        gone = collected.get(e.name, (-1, None))[0]
                        discarded[e.name] = ed.meet(pi, ed.parse(gone))
                    else:
                        discarded[e.name] = pi
                note = None if (r is None or r.notification is None) else dom.parse(
                    r.notification)
                return Entry(at=at, delivered=delivered, projected=projected,
                             discarded=discarded, notification=note,
                             state=None if r is None else r.state_ref)

            frontiers = [entry(r, False) for r in log.restorable(
                spec.regime, replay=replay and pipeline.replays_inputs(name))]
            live = None
            if name not in failed:
                live = entry(None, True)
                # The live state has delivered everything any of its rows delivered.
                for r in log.entries.values():
                    for e in ins:
                        ed = edges[e.name].domain
                        given = (r.delivered or {}).get(e.name)
                        got = ed.parse(given) if given is not None else shift(
                            ed, project(dom, ed, dom.parse(r.time)), -e.delay)
                        live.delivered[e.name] = ed.join(live.delivered[e.name], got)
            latest = log.latest
            region = Region(
                name, dom, failed=name in failed, frontiers=frontiers, live=live,
                current=None if latest is None else dom.parse(latest.time),
                regime=spec.regime,
            )
            cap = (at_most or {}).get(name)
            if cap is not None:
                region.at_most = dom.parse(cap)
            problem.regions[name] = region
        # The same checks as a problem file: a log that breaks them is reported, not solved.
        return Problem.from_json(problem.to_json(), origin=f"epoch log of {pipeline.name!r}")

