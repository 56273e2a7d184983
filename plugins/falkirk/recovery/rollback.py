"""The rollback executor: from a failure (or an operator's "go back to epoch N") to a
consistent pipeline.

1. Build the solver's problem from the epoch log and solve it: per region, the frontier
   it restores to. In a dry run, stop here and show the plan.
2. Take the pipeline's rollback lease in the epoch log (a second rollback, from any
   machine, is refused while one runs).
3. Fence the affected regions (their jobs may no longer record an epoch: the new
   generation is recorded for them) and stop the jobs hosting them (a hook: the
   supervisor's lets a running stream job park and waits for its acknowledgement,
   falkirk.runtime.park; the caller's kills); then plan again from the log as it is,
   until the plan affects no region that still runs.
4. Record the rollback (with its plan and the new generation) before changing anything.
5. Restore every Delta output table of an affected region to the version its frontier
   epoch committed (a RESTORE commit, by delta-rs: no Spark session to start); invalidate
   the later epochs in the log.
6. Record it done. Restarted regions read the new generation and their frontier from the
   log: their writers tag commits with it, so epochs they must write again are written
   (a RESTORE keeps the old transaction markers, delta-io/delta#1813).

Every step is idempotent, and a rollback that crashed is resumed with the plan it
recorded, so running it again ends in the same state as an uninterrupted run.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

from falkirk.config import Config, load
from falkirk.errors import FalkirkError
from falkirk.faults import maybe_crash
from falkirk.log.epochlog import EpochLog, EpochRecord
from falkirk.model.times import DOMAINS, epoch_of_key
from falkirk.model.topology import Pipeline
from falkirk.solver.frontier import Plan, check_plan, solve


class RollbackError(FalkirkError):
    """A rollback refused (bad request, another one running) or unable to finish."""


@dataclass
class RollbackRequest:
    pipeline: str
    failed: list[str] = field(default_factory=list)
    region: str | None = None  # with to_epoch: take this region back on purpose
    to_epoch: int | None = None
    reason: str = ""
    dry_run: bool = True

    def validate(self, pipeline: Pipeline) -> None:
        """Refuse a bad request before anything changes, naming what is wrong."""
        unknown = sorted(set(self.failed) - set(pipeline.regions))
        if unknown:
            raise RollbackError(f"pipeline {pipeline.name!r} has no region(s) {unknown} "
                                f"(regions: {', '.join(pipeline.regions)})")
        if (self.region is None) != (self.to_epoch is None):
            raise RollbackError("--region and --to-epoch go together")
        if self.region is not None and self.region not in pipeline.regions:
            raise RollbackError(f"pipeline {pipeline.name!r} has no region {self.region!r}")
        if self.to_epoch is not None and self.to_epoch < -1:
            raise RollbackError(f"to_epoch must be ≥ -1 (-1: before the first epoch), "
                                f"got {self.to_epoch}")
        if not self.failed and self.region is None:
            raise RollbackError("say which regions failed, or which region to take back to "
                                "which epoch")
        if not self.dry_run and not self.reason.strip():
            raise RollbackError("give a reason: it is recorded with the rollback")


@dataclass
class TableRestore:
    region: str
    table: str
    to_version: int


@dataclass
class RollbackPlan:
    rollback_id: str
    pipeline: str
    generation: int
    request: RollbackRequest
    frontiers: dict[str, Any]  # region -> JSON frontier
    current: dict[str, Any]  # region -> JSON latest time reached
    tables: list[TableRestore]
    invalidate: list[dict]  # {region, time, generation}
    replay: list[dict]
    rerun: list[dict]
    #: region -> the restorable time it restarts from when its frontier is reached by
    #: replay (a lazy region's committed epoch: its checkpoint before, then the epochs
    #: since redone for the state only)
    restarts_from: dict[str, Any] = field(default_factory=dict)

    @property
    def affected(self) -> set[str]:
        return {r for r, f in self.frontiers.items() if f != "top"}

    def to_json(self) -> dict:
        out = asdict(self)
        out["request"] = asdict(self.request)
        return out

    @classmethod
    def from_json(cls, data: dict) -> RollbackPlan:
        return cls(
            data["rollback_id"], data["pipeline"], data["generation"],
            RollbackRequest(**data["request"]), data["frontiers"], data["current"],
            [TableRestore(**t) for t in data["tables"]], data["invalidate"],
            data["replay"], data["rerun"], data.get("restarts_from", {}),
        )


def build_plan(pipeline: Pipeline, log: EpochLog, request: RollbackRequest,
               generation: int | None = None) -> RollbackPlan:
    """Solve the live problem and turn the frontiers into table restores and invalidations
    (in ``generation``, default: the one after the log's current generation)."""
    request.validate(pipeline)
    at_most = {}
    if request.region is not None:
        spec = pipeline.regions[request.region]
        if request.to_epoch == -1:
            at_most[request.region] = -1
        else:
            at_most[request.region] = ([request.to_epoch, "inf"]
                                       if DOMAINS[spec.domain].name == "epoch.iteration"
                                       else request.to_epoch)
    problem = log.problem(pipeline, failed=request.failed, at_most=at_most)
    if request.region is not None:
        current = problem.regions[request.region].current
        dom = problem.regions[request.region].domain
        if current is None or not dom.leq(dom.parse(at_most[request.region]), current):
            raise RollbackError(
                f"region {request.region!r} has not reached epoch {request.to_epoch} "
                f"(latest: {'nothing' if current is None else dom.describe(current)}): "
                "nothing to go back from")
    plan: Plan = solve(problem, with_low_watermark=False)
    _refuse_acknowledged_input(pipeline, log, problem, plan)
    violations = check_plan(problem, {n: f.key for n, f in plan.frontiers.items()})
    if violations:  # the solver's own guarantee; checked again before anything changes
        raise RollbackError(f"inconsistent plan: {violations}")
    logs = log.regions(pipeline)
    tables: dict[str, TableRestore] = {}
    invalidate: list[dict] = []
    restarts_from: dict[str, Any] = {}
    for name, frontier in plan.frontiers.items():
        if frontier.is_top:
            continue
        spec = pipeline.regions[name]
        dom = DOMAINS[spec.domain]
        rlog = logs[name]
        row = None if frontier.is_bottom else rlog.entries.get(frontier.key)
        if row is not None and row.status in spec.regime_rules.replays:
            before = [r for r in rlog.restorable(spec.regime)
                      if dom.leq(dom.parse(r.time), frontier.key)]
            restarts_from[name] = before[-1].time if before else -1
        for edge in pipeline.out_edges(name):
            if edge.kind != "delta":
                continue
            if frontier.is_bottom:
                version = 0  # the empty table the writer created
            else:
                version = ((row.outputs or {}).get(edge.name) or {}).get("version") if row else None
                if version is None:
                    raise RollbackError(
                        f"region {name!r}: the epoch log has no version of {edge.table!r} for "
                        f"frontier {frontier}: cannot restore the table")
            tables[edge.table] = TableRestore(name, edge.table, version)
        for key, r in sorted(rlog.entries.items(), key=lambda kv: kv[0]):
            if not dom.leq(key, frontier.key):
                invalidate.append({"region": name, "time": r.time, "generation": r.generation})
    return RollbackPlan(
        rollback_id=uuid.uuid4().hex[:12], pipeline=pipeline.name,
        generation=log.generation(pipeline.name) + 1 if generation is None else generation,
        request=request,
        frontiers={n: f.to_json() for n, f in plan.frontiers.items()},
        current={n: (None if r.current is None else r.domain.dump(r.current))
                 for n, r in problem.regions.items()},
        tables=sorted(tables.values(), key=lambda t: t.table),
        invalidate=invalidate,
        replay=[r.to_json() for r in plan.replay], rerun=[r.to_json() for r in plan.rerun],
        restarts_from=restarts_from,
    )


def _refuse_acknowledged_input(pipeline: Pipeline, log: EpochLog, problem, plan: Plan) -> None:
    """A region cannot go back to before input that garbage collection acknowledged.

    Edges between regions carry that in D_e for the solver; an input topic from outside
    has no sender in the problem, so it is checked here.
    """
    collected = log.collected(pipeline.name)
    for edge in pipeline.edges.values():
        if edge.kind != "kafka" or edge.src is not None or edge.name not in collected:
            continue
        dom = problem.regions[edge.dst].domain
        gone = dom.parse(collected[edge.name][0])
        chosen = plan.frontiers[edge.dst]
        if not dom.leq(gone, chosen.key):
            raise RollbackError(
                f"region {edge.dst!r} would go back to {chosen}, but its input topic "
                f"{edge.topic!r} was acknowledged through epoch {dom.describe(gone)} by "
                "garbage collection: those records may be gone. Choose a later epoch.")


class RollbackExecutor:
    """Runs rollbacks of one pipeline; see the module docstring."""

    def __init__(self, pipeline: Pipeline, cfg: Config | None = None,
                 epoch_log: EpochLog | None = None,
                 stop_regions: Callable[[set[str]], None] | None = None,
                 lease_ttl_s: float = 120.0):
        self.pipeline = pipeline
        self.cfg = cfg or load()
        self.log = epoch_log or EpochLog.from_config(self.cfg)
        self.stop_regions = stop_regions
        self.lease_ttl_s = lease_ttl_s

    # -- the lock -------------------------------------------------------------------------

    @contextmanager
    def lock(self) -> Iterator[None]:
        """One rollback per pipeline at a time, on any machine: a lease in the epoch log
        (:mod:`falkirk.recovery.lease`). A holder that died is taken over (the rollback it held is
        then resumed from the log)."""
        from falkirk.recovery.lease import Lease, LeaseHeldError

        try:
            with Lease(self.log, self.pipeline.name, "rollback", self.lease_ttl_s).held():
                yield
        except LeaseHeldError as exc:
            raise RollbackError(f"a rollback of pipeline {self.pipeline.name!r} is already "
                                f"running ({exc}); try again when it has finished") from None

    # -- running --------------------------------------------------------------------------

    def plan(self, request: RollbackRequest, generation: int | None = None) -> RollbackPlan:
        return build_plan(self.pipeline, self.log, request, generation)

    def run(self, request: RollbackRequest,
            progress: Callable[[str], None] | None = None,
            confirmed: dict[str, Any] | None = None) -> RollbackPlan:
        """Plan, and unless it is a dry run, carry the plan out. Returns the plan.

        The regions a plan affects are fenced (their jobs may no longer record epochs) and
        stopped *before* the plan that is carried out is made, from the log as it is then:
        an epoch committed between a first plan and the stop is in the final plan, never
        left ``committed`` over data the restore removes. ``confirmed``: the frontiers the
        operator confirmed (a dry run's); a plan that differs is refused, the difference
        shown, nothing restored.
        """
        say = progress or (lambda _msg: None)
        if request.dry_run:
            return self.plan(request)
        with self.lock():
            pending = self.log.unfinished_rollback(self.pipeline.name)
            if pending is not None:
                plan = RollbackPlan.from_json(pending["plan"])
                say(f"resuming rollback {plan.rollback_id} that did not finish")
                if plan.affected and self.stop_regions is not None:
                    self.stop_regions(plan.affected)  # restarted meanwhile, maybe
                self._release(plan.affected)
                self._carry_out(plan, say)
                self._done(plan, say)
                if asdict(plan.request) == asdict(request):
                    return plan
                # The newer request waited for the crashed one; it is planned from the log
                # as that left it (a confirmed plan that no longer holds is refused below).
                say(f"rollback {plan.rollback_id} ({plan.request.reason!r}) had crashed and "
                    f"was resumed first; now this request ({request.reason!r})")
            plan = self._stop_then_plan(request, say)
            if confirmed is not None and confirmed != plan.frontiers:
                moved = {r: {"confirmed": confirmed.get(r), "now": f}
                         for r, f in plan.frontiers.items() if confirmed.get(r) != f}
                raise RollbackError(
                    f"the plan changed since it was confirmed (the streams ran on until "
                    f"stopped): {json.dumps(moved, sort_keys=True)}; nothing was restored. "
                    "Look at a new dry run, then ask again")
            self.log.record_rollback(self.pipeline.name, plan.rollback_id, plan.generation,
                                     "started", asdict(plan.request), plan.to_json())
            self._carry_out(plan, say)
            self._done(plan, say)
        return plan

    def _stop_then_plan(self, request: RollbackRequest,
                        say: Callable[[str], None]) -> RollbackPlan:
        """Fence and stop every region a plan affects, then plan again from the log as it
        is, until the plan affects no region that still runs (a fixed point: each round
        stops at least one more region)."""
        fenced: set[str] = set()
        generation = self.log.generation(self.pipeline.name) + 1
        while True:
            plan = self.plan(request, generation)
            more = plan.affected - fenced
            if not more:
                return plan
            fenced |= more
            self.log.record_fence(self.pipeline.name, plan.generation, sorted(fenced))
            if self.stop_regions is not None:
                say(f"stopping {', '.join(sorted(more))}")
                maybe_crash("rollback:before-stop")
                self.stop_regions(more)
            self._release(more)

    def _release(self, regions: set[str]) -> None:
        """Interrupt and close the engine sessions the stopped (or dead) jobs of
        ``regions`` left (Spark Connect keeps running a call whose client died)."""
        from falkirk.runtime.procs import release_sessions

        release_sessions(self.pipeline, regions, self.cfg)

    def _done(self, plan: RollbackPlan, say: Callable[[str], None]) -> None:
        self.log.record_rollback(self.pipeline.name, plan.rollback_id, plan.generation,
                                 "done", asdict(plan.request), plan.to_json())
        say(f"rollback {plan.rollback_id} done: generation {plan.generation}")

    def _carry_out(self, plan: RollbackPlan, say: Callable[[str], None]) -> None:
        from deltalake import DeltaTable

        from falkirk.io.delta import fence_older_generations, rollback_table

        affected = plan.affected
        opts = self.cfg.delta_storage_options or None
        for t in plan.tables:
            uri = self.cfg.table(t.table)
            # A write of a stopped job still in flight on the engine cannot commit after
            # this fence, and one that committed before it is restored away below.
            if DeltaTable.is_deltatable(uri, storage_options=opts):
                fence_older_generations(uri, t.region, plan.generation, opts)
            say(f"restoring table {t.table} to version {t.to_version} ({t.region})")
            rollback_table(uri, t.to_version, opts)
            maybe_crash("rollback:after-first-table")
        for region in sorted(affected):
            spec = self.pipeline.regions[region]
            if spec.keeps_state:
                key = DOMAINS[spec.domain].parse(plan.frontiers[region])
                self._truncate_checkpoints(region, epoch_of_key(spec.domain, key))
        rows = [EpochRecord(plan.pipeline, i["region"], i["time"], i["generation"],
                            "invalidated", note=f"rollback {plan.rollback_id}")
                for i in plan.invalidate]
        if rows:
            say(f"invalidating {len(rows)} epoch(s) after the frontiers")
            self.log.record(*rows)

    def _truncate_checkpoints(self, region: str, through: int) -> None:
        """Drop the region's checkpoints after its frontier: it will take them again."""
        from falkirk.state.checkpoints import CheckpointStore

        uri = self.cfg.table("_falkirk_state", self.pipeline.name, region)
        store = CheckpointStore.open(uri, self.cfg.delta_storage_options or None)
        if store is not None:
            store.truncate_after(through)
