"""The epoch loop: a job's regions, one epoch (or one pass of several) at a time.

For each epoch e (or the ready epochs e..e+k, a *pass*):

1. ask every input connector (:mod:`falkirk.runtime.connectors`) where e's input is: a
   Kafka input is complete when every partition has a record at or after the epoch's end
   (or reached its declared bound); a Delta input when the sender's epoch ``e - delay``
   is committed in the epoch log. When several epochs are ready at once and the job can
   process a pass (:meth:`JobLogic.process_pass`), they go together, up to
   ``Config.max_pass`` (30; ``FALKIRK_MAX_PASS``);
2. log ``running``; read the inputs (one read per edge for the whole pass);
3. run the job's pure transforms;
4. commit outputs through the output connectors, each epoch apart (a table gets a
   version per epoch, a topic's records their epoch in a header);
5. persist state as the regime says (eager every epoch, lazy every K epochs or T
   seconds): in a pass, the state as of each due epoch (selective checkpoints), so a
   rollback can land on any of them although they were computed together;
6. log ``committed`` (or ``checkpointed``) per epoch with its input ranges, output
   versions and state reference: what the rollback solver needs.

The epoch log, not Spark's checkpoint folder, is the source of truth: a region always
(re)starts from the frontier the log (or a rollback plan) names.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from datetime import UTC, datetime
from functools import partial, reduce
from typing import Any

from falkirk.config import Config, load
from falkirk.faults import maybe_hold
from falkirk.io.delta import PASS_COLUMN
from falkirk.io.lineage import epochs_committed
from falkirk.io.spark import (
    cut_lineage,
    generated_code,
    jobs_in_group,
    label_jobs,
    work_unit,
)
from falkirk.log.epochlog import EpochLog, EpochRecord, RegionLog
from falkirk.model.schemas import use_pipeline
from falkirk.model.times import DOMAINS, Offsets, epoch_of_key, time_of
from falkirk.model.topology import EdgeSpec, Pipeline
from falkirk.runtime.connectors import (
    ENDED,
    WAIT,
    InputConnector,
    OutputConnector,
    Wiring,
    input_for,
    outputs_for,
)
from falkirk.runtime.job import EpochContext, EpochResult, JobLogic, RuntimeFailure

log = logging.getLogger("falkirk.runtime")
#: How often a job reads garbage collection's fold requests (between epochs; a read of
#: the epoch log costs an epoch tens of ms, collection runs every minute or so): every
#: 20 s, or every 5 epochs where epochs are shorter, so short epochs do not pile up
#: dozens of checkpoint layers between folds.
FOLDS_EVERY_S = 20.0
FOLDS_EVERY_EPOCHS = 5

class Fenced(RuntimeFailure):
    """A rollback to ``generation`` fenced the job's regions: it records no more epochs."""

    def __init__(self, message: str, generation: int):
        super().__init__(message)
        self.generation = generation


class JobRunner:
    """Runs a job's regions epoch by epoch (or pass by pass); see the module docstring."""

    #: The job's one preparing thread (:meth:`_prepare_beside`), made when first needed.
    _preparing: ThreadPoolExecutor | None = None

    def __init__(self, pipeline: Pipeline, logic: JobLogic, spark: Any,
                 cfg: Config | None = None, epoch_log: EpochLog | None = None,
                 start: dict[str, int] | None = None, persist: bool = True,
                 generation: int | None = None, max_pass: int | None = None):
        self.pipeline = pipeline
        use_pipeline(pipeline.schema_roots)  # the job's transforms name its tables bare
        # persist=False runs the same transforms with nothing made durable (no epoch log,
        # no Delta commits, no checkpoints): the all-ephemeral baseline of the benchmarks.
        self.persist = persist
        self.cfg = cfg or load()
        # the profile's (FALKIRK_MAX_PASS), unless the caller says
        self.max_pass = max(1, self.cfg.max_pass if max_pass is None else max_pass) \
            if logic.passes else 1
        # Per epoch: (epoch, seconds, finished at (wall clock), records read per Kafka edge);
        # an epoch of a pass gets the pass's seconds shared out.
        self.timings: list[tuple[int, float, float, dict[str, int]]] = []
        self.passes: list[tuple[list[int], float]] = []  # each pass's epochs and seconds
        # Seconds per phase over the run (epoch-log bookkeeping, input set-up, the job's
        # process, each region's commits, sends and checkpoints): the benchmarks' profile.
        self.profile: dict[str, float] = {}
        # Spark jobs per phase over the run (counted in the epoch's job group): the same
        # split, in the unit Spark's scheduler pays a fixed cost for.
        self.spark_jobs: dict[str, int] = {}
        self._group, self._jobs_seen = "", 0
        self._jobs_aside = 0  # Spark jobs of an epoch's commits, in job groups of their own
        self.epoch_jobs: list[int] = []  # Spark jobs of each epoch, in order (a pass shared)
        self.logic = logic
        self.spark = spark
        self.cfg = cfg or load()
        self.log = epoch_log or EpochLog.from_config(self.cfg)
        unknown = set(logic.regions) - set(pipeline.regions)
        if unknown:
            raise RuntimeFailure(f"job {type(logic).__name__} runs regions {sorted(unknown)} "
                                 f"that pipeline {pipeline.name!r} does not declare")
        self.regions = list(logic.regions)
        # The log's current generation, or a rollback's done (a job resuming after it: a
        # newer rollback that fenced it meanwhile then parks it again at once).
        self.generation = (self.log.generation(pipeline.name) if generation is None
                           else generation)
        self.wiring = Wiring(spark, self.cfg, pipeline, self.log, self.generation,
                             self.regions)
        logs = self.wiring.logs()
        # Each region restarts after its frontier: given by a rollback, else its latest
        # restorable entry in the log.
        self.done: dict[str, int] = {}
        for r in self.regions:
            if start and r in start:
                self.done[r] = start[r]
            else:
                spec = pipeline.regions[r]
                rows = logs[r].restorable(spec.regime)
                self.done[r] = -1 if not rows else epoch_of_key(
                    spec.domain, DOMAINS[spec.domain].parse(rows[-1].time))
        self.state: dict[str, Any] = {}
        self.state_frames: dict[str, Any] = {}  # region -> its state at its last checkpoint
        # region -> when it last checkpointed or was restored (checkpoint_seconds)
        self.checkpointed_at: dict[str, float] = dict.fromkeys(self.regions, time.monotonic())
        # region -> epochs it processed since it was restored from a checkpoint (a restart,
        # a rollback) without checkpointing: such a region checkpoints once it has caught
        # up, so repeated kills cannot keep it redoing the same epochs (FLIP-76's lesson:
        # recovery must guarantee progress). None: not recovering.
        self.unsaved: dict[str, int | None] = dict.fromkeys(self.regions)
        self.checkpoints: dict[str, Any] = {}
        for r in self.regions:
            if pipeline.regions[r].keeps_state:
                self._restore_state(r, logs[r])
                if self.done[r] >= 0:
                    self.unsaved[r] = 0
        self.inputs: dict[str, InputConnector] = {
            e.name: input_for(self.wiring, e, self.done[e.dst])
            for r in self.regions for e in pipeline.in_edges(r) if not self.internal(e)}
        self.outputs: dict[str, list[OutputConnector]] = {
            r: outputs_for(self.wiring, r, persist) for r in self.regions}
        self.watch = None  # a FenceWatch, set when the job parks (JobDriver)
        self.prepared: int | None = None  # the epoch the job prepared ahead
        self.until: int | None = None  # the last epoch run() processes (None: no end)
        self.folded: dict[str, int] = {}  # region -> the fold request carried out last
        self.folds_read_at = float("-inf")  # monotonic: when the fold requests were read

    # -- setup --------------------------------------------------------------------------

    def internal(self, edge: EdgeSpec) -> bool:
        """Records passed inside this job (unlogged, or a table its own region writes)."""
        return edge.kind == "unlogged" or (edge.kind == "delta" and edge.src in self.regions)

    def checkpoint_store(self, region: str):
        from falkirk.state.checkpoints import CheckpointStore

        if region not in self.checkpoints:
            self.checkpoints[region] = CheckpointStore(
                self.cfg.table("_falkirk_state", self.pipeline.name, region),
                self.logic.state_schema(region), self.cfg.delta_storage_options or None)
        return self.checkpoints[region]

    def _restore_state(self, region: str, rlog: RegionLog) -> None:
        done = self.done[region]
        if done < 0:
            self.state[region] = self.logic.initial_state(region, self.spark)
            self.state_frames[region] = None
            return
        spec = self.pipeline.regions[region]
        row = rlog.entries.get(DOMAINS[spec.domain].parse(time_of(spec.domain, done)))
        if row is None or row.state_ref is None:
            raise RuntimeFailure(
                f"region {region!r} restarts after epoch {done}, but the epoch log names no "
                "state checkpoint for it"
            )
        # Read once and kept: the job's state is built from it and the next checkpoint's
        # diff compares with it. Uncut, each use read the store again and ranked its rows
        # (stats' checkpoint in the first epoch after a restore: 15-28 Spark stages, 14
        # cut), and a state of several parts (communities') read it once per part.
        frame = cut_lineage(self.checkpoint_store(region).restore_frame(
            self.spark, int(row.state_ref.split(":")[-1])))
        self.state_frames[region] = frame
        self.state[region] = self.logic.state_from_frame(region, frame, self.spark)
        log.info("region %s: state restored from %s", region, row.state_ref)

    # -- the loop -----------------------------------------------------------------------

    @property
    def next_epoch(self) -> int:
        return min(self.done.values()) + 1

    def run(self, until_epoch: int | None = None, poll_s: float = 0.5,
            idle_timeout_s: float | None = None, on_epoch: Callable[[int], None] | None = None
            ) -> int:
        """Process epochs until ``until_epoch`` (inclusive) or the input ends; return the
        last epoch done."""
        idle_since = time.monotonic()
        self.until = until_epoch
        while until_epoch is None or self.next_epoch <= until_epoch:
            e = self.next_epoch
            if self.watch is not None and self.watch.fenced is not None:
                self._fenced(self.watch.fenced, f"epoch {e} is not started")
            if self.watch is not None and self.watch.engine_lost:
                raise RuntimeFailure(
                    f"job {'+'.join(self.regions)}: the Spark engine at "
                    f"{self.cfg.spark_remote} stopped answering before epoch {e}; the job's "
                    "session (its state) is gone with it")
            ready = self._ready(e, until_epoch)
            if ready is ENDED or ready is WAIT:
                self._checkpoint_caught_up()
            if ready is ENDED:  # the input ended: nothing more will come
                self._record_end(e - 1)
                break
            if ready is WAIT:
                self._prepare_ahead(e)
                if idle_timeout_s is not None and time.monotonic() - idle_since > idle_timeout_s:
                    raise RuntimeFailure(
                        f"job {'+'.join(self.regions)}: epoch {e} not complete at its inputs "
                        f"after {idle_timeout_s:.0f} s")
                time.sleep(poll_s)
                continue
            epochs, places = ready
            self.process(epochs, places)
            idle_since = time.monotonic()
            if on_epoch is not None:
                for done in epochs:
                    on_epoch(done)
        else:  # stopped at until_epoch: say so if the input also ends there
            if self._ready(self.next_epoch, None) is ENDED:
                self._record_end(self.next_epoch - 1)
        return self.next_epoch - 1

    def _prepare_ahead(self, e: int) -> None:
        """Let the job prepare epoch ``e`` (:meth:`JobLogic.prepare_epoch`) once its Delta
        inputs are ready, while its Kafka inputs are not yet."""
        if any(d != e - 1 for d in self.done.values()):
            return
        places = self._side_places(e)
        if places is not None:
            self._prepare_epoch(e, places)

    def _side_places(self, e: int) -> dict[str, Any] | None:
        """Where the Delta inputs of epoch ``e`` are, if they are all committed and the job
        prepares epochs and has Kafka inputs too (what is left when its records close);
        else None."""
        if not self.logic.prepares or self.prepared == e:
            return None
        from falkirk.runtime.connectors import DeltaInput

        side = {n: c for n, c in self.inputs.items() if isinstance(c, DeltaInput)}
        if not side or len(side) == len(self.inputs):
            return None
        places = {}
        for name, c in side.items():
            found = c.places([e])
            if found is WAIT or found is ENDED:
                return None
            places[name] = found
        return places

    def _prepare_epoch(self, e: int, places: dict[str, Any],
                       when: str = "before its records closed") -> None:
        started = time.monotonic()
        inputs = {n: self.inputs[n].read([e], found) for n, found in places.items()}
        ctx = EpochContext(e, self.generation, self.spark, self.pipeline, inputs,
                           dict(self.state), {r for r in self.regions if self.done[r] < e},
                           history=lambda edge: self.inputs[edge].history(e))
        self.logic.prepare_epoch(ctx)
        self.prepared = e
        log.info("epoch %d prepared by %s in %.1f s, %s", e, "+".join(self.regions),
                 time.monotonic() - started, when)

    def _prepare_beside(self, epochs: list[int]) -> Future | None:
        """When the epoch after ``epochs`` is complete already (the job is behind: after an
        outage, a rollback, a cold start), prepare it in the job's preparing thread while
        these epochs commit, so it is then processed as a prepared epoch is: a job one
        epoch behind otherwise processed each epoch whole, prepare and all, after the
        commits of the one before, and stayed behind. Caught up, the job prepares while it
        waits for the records to close instead (:meth:`_prepare_ahead`): off the commits,
        and the inputs say so without a look-up (:meth:`InputConnector.may_have_closed`)."""
        n = epochs[-1] + 1
        if self.until is not None and n > self.until:
            return None
        if not all(c.may_have_closed(n) for c in self.inputs.values()):
            return None
        places = self._side_places(n)
        if places is None:
            return None
        for name, c in self.inputs.items():
            if name not in places and c.places([n]) in (WAIT, ENDED):
                return None
        from pyspark import inheritable_thread_target

        group = f"{self._group}|prepare"

        def run() -> None:
            label_jobs(self.spark, group)
            t0 = time.monotonic()
            self._prepare_epoch(n, places, f"beside the commits of epoch {n - 1}")
            self.profile["prepare beside"] = (self.profile.get("prepare beside", 0.0)
                                              + time.monotonic() - t0)

        if self._preparing is None:  # one thread for the job's life, made when first needed
            self._preparing = ThreadPoolExecutor(1, thread_name_prefix="falkirk-prepare")
        return self._preparing.submit(inheritable_thread_target(self.spark)(run))

    def _prepared_beside(self, future: Future | None) -> None:
        """Wait for :meth:`_prepare_beside`'s thread; a preparation that failed is only
        logged (the epoch is then processed whole, as without it)."""
        if future is None:
            return
        error = future.exception()
        if error is not None:
            self.prepared = None
            log.warning("preparing the next epoch beside the commits failed (%s: %s); it "
                        "is processed whole", type(error).__name__, error)

    @staticmethod
    def _while_preparing(beside: Future | None, work: Callable[[], Any]) -> Any:
        """``work()`` (an epoch's commits and its epoch-log rows) while the next epoch is
        prepared beside it; a failure waits for the preparation before it is raised, so
        no thread of the job's is left running on its session behind its exit."""
        try:
            return work()
        except BaseException:
            wait([beside] if beside is not None else [])
            raise

    def _record_end(self, through: int) -> None:
        """The input ended after epoch ``through``: receivers that read only our Delta
        outputs (and would wait for the next epoch forever) end too."""
        if self.persist:
            self.log.record_end(self.pipeline.name, self.regions, through, self.generation)

    def _ready(self, e: int, until: int | None) -> tuple[list[int], dict] | bool | None:
        """The ready epochs from ``e`` on (a pass when the job's regions are all at ``e``
        and it takes passes) with each input's places; :data:`WAIT`; or :data:`ENDED`."""
        aligned = all(d == e - 1 for d in self.done.values())
        n = self.max_pass if aligned else 1
        if until is not None:
            n = max(1, min(n, until - e + 1))
        epochs = list(range(e, e + n))
        self.wiring.new_look()
        places: dict[str, list[Any]] = {}
        for name, connector in self.inputs.items():
            found = connector.places(epochs)
            if found is ENDED or found is WAIT:
                return found
            places[name] = found
            epochs = epochs[:len(found)]
        return epochs, {name: found[:len(epochs)] for name, found in places.items()}

    def _spent(self, phase: str, since: float) -> float:
        """Add the seconds since ``since`` to ``phase`` in the profile; now."""
        now = time.monotonic()
        self.profile[phase] = self.profile.get(phase, 0.0) + now - since
        seen = jobs_in_group(self.spark, self._group)
        self.spark_jobs[phase] = self.spark_jobs.get(phase, 0) + seen - self._jobs_seen
        self._jobs_seen = seen
        return now

    def process_epoch(self, e: int, where: dict) -> None:
        """One epoch at places already found (tests and tools drive the loop by hand)."""
        self.process([e], {k: [v] for k, v in where.items()})

    def process(self, epochs: list[int], places: dict[str, list[Any]]) -> None:
        """Process the ready ``epochs`` (one, or a pass) whose inputs are at ``places``; a
        pass reading ``Config.codegen_records`` records or more from topics with Spark's
        generated code (its compilation pays for itself over them)."""
        read = sum(_records_read(c, place) or 0 for name, c in self.inputs.items()
                   for place in places[name])
        if not 0 < self.cfg.codegen_records <= read:
            self._process(epochs, places)
            return
        log.info("a pass of %d records or more: Spark's generated code on",
                 self.cfg.codegen_records)
        with generated_code(self.spark):
            self._process(epochs, places)

    def _process(self, epochs: list[int], places: dict[str, list[Any]]) -> None:
        started = time.monotonic()
        e = epochs[0]
        active = {r for r in self.regions if self.done[r] < e}
        self._group = name_spark_jobs(self.spark, self.pipeline.name, active, epochs,
                                      self.generation)
        self._jobs_seen = jobs_before = jobs_in_group(self.spark, self._group)
        self._jobs_aside = 0
        profile_before, jobs_before_phase = dict(self.profile), dict(self.spark_jobs)
        # A region that restarted from a checkpoint older than epochs it already committed
        # (and no rollback invalidated) redoes them for its state only: their outputs are
        # live, and committing them again (in a new generation) would duplicate them.
        redo: dict[tuple[str, int], EpochRecord] = {}
        if self.persist:
            logs = self.log.regions(self.pipeline)
            for r in active:
                for x in epochs:
                    row = self.wiring.row(r, x, logs)
                    if row is not None and row.status in ("committed", "checkpointed"):
                        redo[(r, x)] = row
            begun = datetime.now(UTC)  # one time for the pass's rows: they began together
            self.log.record(*(EpochRecord(self.pipeline.name, r, self._time(r, x),
                                          self.generation, "running", recorded_at=begun,
                                          note=f"pid {os.getpid()}")
                              for r in sorted(active) for x in epochs
                              if (r, x) not in redo))
        t = self._spent("epoch log", started)
        inputs = {name: c.read(epochs, places[name]) for name, c in self.inputs.items()}
        due = {r: self._due(r, epochs) for r in sorted(active)
               if self.pipeline.regions[r].keeps_state}
        ctx = EpochContext(e, self.generation, self.spark, self.pipeline, inputs,
                           dict(self.state), active, epochs=list(epochs), checkpoints=due,
                           history=lambda edge: self.inputs[edge].history(e))
        t = self._spent("inputs", t)
        result = (self.logic.process_pass(ctx) if len(epochs) > 1
                  else self.logic.process(ctx))
        if result is None:
            raise RuntimeFailure(f"job {type(self.logic).__name__} returned no result for "
                                 f"epochs {epochs}")
        t = self._spent("process", t)
        beside = self._prepare_beside(epochs)

        def commit(t: float) -> float:
            outputs, state_refs = self._commit_all(result, epochs, active, redo, due, t)
            t = time.monotonic()
            rows = []
            for r in sorted(active):
                for x in epochs:
                    ref = state_refs.get((r, x))
                    if (r, x) in redo and ref is None:  # nothing new to say about this epoch
                        continue
                    mine = {name: logged for name, c in self.inputs.items()
                            if c.edge.dst == r
                            and (logged := c.logged(places[name][epochs.index(x)])) is not None}
                    rows.append(EpochRecord(
                        self.pipeline.name, r, self._time(r, x), self.generation,
                        "committed" if ref is None else "checkpointed", inputs=mine or None,
                        outputs=({**redo[(r, x)].outputs} if (r, x) in redo and
                                 redo[(r, x)].outputs else outputs.get((r, x))) or None,
                        state_ref=ref, note=f"pid {os.getpid()}"))
            if self.persist:
                self._check_fence(epochs[-1])
                maybe_hold("runner:fence-checked")
                self.log.record(*rows)
                # OpenLineage, when set (FALKIRK_LINEAGE): the epochs written, not those redone
                epochs_committed(self.cfg, self.pipeline,
                                 [w for w in rows if (w.region, w.epoch) not in redo])
            for r in active:
                self.done[r] = epochs[-1]
                if self.unsaved[r] is not None:  # recovering: saved at last, or one more
                    saved = (r, epochs[-1]) in state_refs
                    self.unsaved[r] = None if saved else self.unsaved[r] + len(epochs)
            t = self._spent("epoch log", t)
            return t

        t = self._while_preparing(beside, lambda: commit(t))
        self._prepared_beside(beside)  # before the job moves on: it reads what moves
        self._fold_checkpoints(active)
        self.logic.finish_epoch(ctx)
        for r in active:
            if self.pipeline.regions[r].keeps_state:
                self.state[r] = self.logic.settle_state(r, self.state[r])
        self._spent("finish", t)
        for name, c in self.inputs.items():
            c.consumed(places[name][-1])
        self._account(epochs, places, started, jobs_before, profile_before, jobs_before_phase,
                      active)

    def _account(self, epochs: list[int], places: dict[str, list[Any]], started: float,
                 jobs_before: int, profile_before: dict, jobs_before_phase: dict,
                 active: set[str]) -> None:
        """Timings, Spark jobs and the log line of an epoch or a pass."""
        seconds = time.monotonic() - started
        now = time.time()
        # as of the last phase (Spark's status store is fed asynchronously: a later look
        # could count a job no phase did)
        jobs = self._jobs_seen - jobs_before + self._jobs_aside
        for i, x in enumerate(epochs):
            counts = {name: n for name, c in self.inputs.items()
                      if (n := _records_read(c, places[name][i])) is not None}
            self.timings.append((x, seconds / len(epochs), now, counts))
            self.epoch_jobs.append(round(jobs / len(epochs)))
        self.passes.append((list(epochs), seconds))
        what = (f"epoch {epochs[0]}" if len(epochs) == 1
                else f"epochs {epochs[0]}-{epochs[-1]} ({len(epochs)} in one pass)")
        log.info("%s done by %s in %.1f s (%d %s; %s)", what, "+".join(sorted(active)),
                 seconds, jobs, work_unit(self.spark),
                 epoch_profile(self.profile, profile_before, self.spark_jobs,
                               jobs_before_phase))

    def _checkpoint_caught_up(self) -> None:
        """A stateful region that processed epochs since it (re)started and has not
        checkpointed since, and has now caught up with its input, checkpoints its state as
        of its last epoch: the next restart starts from here, not from where it was
        restored (its epoch log row becomes ``checkpointed``, its outputs unchanged)."""
        if not self.persist:
            return
        waiting = [r for r, n in self.unsaved.items() if n and self.done[r] >= 0]
        if not waiting:
            return
        logs = self.log.regions(self.pipeline)
        refs: dict[tuple[str, int], str] = {}
        rows = []
        for r in waiting:
            e = self.done[r]
            row = self.wiring.row(r, e, logs)
            latest = self.checkpoint_store(r).latest()
            if row is None or row.status not in ("committed", "checkpointed") \
                    or row.state_ref is not None or (latest is not None and latest >= e):
                self.unsaved[r] = None
                continue
            self._checkpoint(r, [(e, self.state[r])], refs)
            rows.append(EpochRecord(self.pipeline.name, r, row.time, self.generation,
                                    "checkpointed", inputs=row.inputs, outputs=row.outputs,
                                    state_ref=refs[(r, e)],
                                    note=f"pid {os.getpid()}: caught up"))
            self.unsaved[r] = None
            log.info("region %s caught up: checkpointed its state as of epoch %d", r, e)
        if rows:
            self._check_fence(rows[-1].epoch)
            self.log.record(*rows)

    def _due(self, region: str, epochs: list[int]) -> list[int]:
        """The epochs whose state the region checkpoints, as its regime says (by time: the
        pass's last epoch, once due)."""
        if not self.persist:
            return []
        spec = self.pipeline.regions[region]
        since = time.monotonic() - self.checkpointed_at[region]
        rules = spec.regime_rules
        due = [x for x in epochs[:-1] if rules.checkpoint_due(spec, x)]
        if rules.checkpoint_due(spec, epochs[-1], since):
            due.append(epochs[-1])
        return due

    def _commit_all(self, result: EpochResult, epochs: list[int], active: set[str],
                    redo: dict[tuple[str, int], EpochRecord], due: dict[str, list[int]],
                    since: float
                    ) -> tuple[dict[tuple[str, int], dict], dict[tuple[str, int], str]]:
        """Make every output and checkpoint of the epochs durable; per (region, epoch) its
        outputs and state reference.

        The topics' sends go first; then every table's Spark work (its Parquet files)
        and every checkpoint run side by side, each in a thread of its own; then the
        tables' commits follow (delta-rs, no Spark job). A region's dead-letter table also takes
        the rows its other tables refused (a null where a table declares none): when
        there are some, its files are written again with them before the commits."""
        from pyspark.sql import functions as F

        outputs: dict[tuple[str, int], dict] = {}
        state_refs: dict[tuple[str, int], str] = {}
        tasks: list[tuple[str, Callable[[], Any]]] = []
        prepared: dict[int, tuple[OutputConnector, Any, list[int]]] = {}
        letters: dict[str, tuple[OutputConnector, Any, list[int]]] = {}  # region -> its own
        refused: dict[str, list[Any]] = {}
        order: list[int] = []  # the outputs as the job's regions list them
        many = len(epochs) > 1
        for r in sorted(active):
            fresh = [x for x in epochs if (r, x) not in redo]
            if not fresh:
                continue
            dead = self.pipeline.dead_letter_edge(r)
            refused[r] = []
            for c in self.outputs[r]:
                df = self._output(result, r, c.edge, epochs, c.edges)
                if many and len(fresh) < len(epochs):
                    df = df.filter(F.col(PASS_COLUMN).isin(fresh))
                is_dead = dead is not None and c.edge.table == dead.table
                if is_dead:
                    letters[r] = (c, df, fresh)
                order.append(id(c))
                phase = f"{'send' if c.edge.kind == 'kafka' else 'write'} {r}"
                tasks.append((phase, partial(self._prepare, c, df, fresh, prepared,
                                             refused[r] if dead is not None and not is_dead
                                             else None)))
        for r in sorted(active):
            spec = self.pipeline.regions[r]
            if not spec.keeps_state:
                continue
            self.state[r] = result.state.get(r, self.state.get(r))
            states = []
            for x in due.get(r, []):
                if (r, x) in redo and redo[(r, x)].status == "checkpointed":
                    continue  # a redone epoch whose checkpoint is there already
                state = result.states.get(r, {}).get(x) if many else self.state[r]
                if state is None:
                    raise RuntimeFailure(
                        f"job {type(self.logic).__name__} processed epochs {epochs} in "
                        f"one pass but returned no state of {r!r} for epoch {x}, whose "
                        "checkpoint is due (EpochResult.states)")
                states.append((x, state))
            if states:
                tasks.append((f"checkpoint {r}", partial(self._checkpoint, r, states,
                                                         state_refs)))
        # the sends first, alone: what consumers wait for does not share the engine's
        # slots with the epoch's own table writes (answers under 5,000 events/s: the send
        # took 4 s beside them, under a second before them)
        sends = [task for task in tasks if task[0].startswith("send ")]
        t = self._side_by_side(sends, since)
        t = self._side_by_side([task for task in tasks if task not in sends], t)
        again = []  # dead letters written again with the rows the other tables refused
        for r, rows in refused.items():
            if rows and r in letters:
                c, df, fresh = letters[r]
                c.discard(prepared.pop(id(c))[1])
                df = reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), rows, df)
                again.append((f"write {r}", partial(self._prepare, c, df, fresh, prepared,
                                                    None)))
        t = self._side_by_side(again, t)
        # committed in a fixed order, every dead-letter table last (the fault trials count
        # the commits they crash at: falkirk_dev.trials.delta_writes)
        dead_ids = {id(c) for c, _, _ in letters.values()}
        for key in sorted(prepared, key=lambda k: (k in dead_ids, order.index(k))):
            c, handle, _ = prepared[key]
            for x, record in c.commit(handle).items():
                for edge in c.edges:
                    outputs.setdefault((c.region, x), {})[edge.name] = record
        self._spent("commit", t)
        return outputs, state_refs
    def _check_fence(self, e: int) -> None:
        """Refuse to record epoch ``e`` once a rollback fenced one of our regions: it is
        stopping this job and plans from the log as it is, so a row recorded now could
        say ``committed`` over data its restore removes."""
        newer = self.log.fenced(self.pipeline.name, self.regions, self.generation)
        if newer is not None:
            self._fenced(newer, f"epoch {e} is not recorded")

    def _fenced(self, newer: int, what: str) -> None:
        raise Fenced(f"pipeline {self.pipeline.name!r}, job {'+'.join(self.regions)} "
                     f"(generation {self.generation}): a rollback to generation {newer} "
                     f"fenced it; {what}", newer)

    def _output(self, result: EpochResult, region: str, edge: EdgeSpec, epochs: list[int],
                edges: list[EdgeSpec] | None = None) -> Any:
        """The DataFrame a job produced for an output (by edge, else by its table)."""
        names = [x.name for x in (edges or [edge])]
        df = next((result.outputs[n] for n in names if result.outputs.get(n) is not None),
                  None)
        if df is None and edge.kind == "delta":
            df = result.outputs.get(edge.table)
        if df is None:
            raise RuntimeFailure(f"job {type(self.logic).__name__} produced nothing for "
                                 f"edge {edge.name!r} of region {region!r} in epoch(s) "
                                 f"{epochs}")
        if len(epochs) > 1 and PASS_COLUMN not in df.columns:
            from pyspark.sql import functions as F

            if "epoch" not in df.columns:
                raise RuntimeFailure(f"job {type(self.logic).__name__}'s output for edge "
                                     f"{edge.name!r} of a pass of epochs {epochs} has "
                                     f"neither a {PASS_COLUMN} nor an epoch column (each "
                                     "row's epoch)")
            df = df.withColumn(PASS_COLUMN, F.col("epoch"))  # its rows' epoch column
        return df

    def _prepare(self, c: OutputConnector, df: Any, epochs: list[int],
                 prepared: dict[int, tuple[OutputConnector, Any, list[int]]],
                 refused: list[Any] | None) -> None:
        """Prepare one output of the region's epochs (its Spark work). With ``refused``
        (the region has a dead-letter table), rows with a null where this table declares
        none are taken out and added there when the table refuses them: the rest goes
        on."""
        from falkirk.io.lake import NullViolation
        from falkirk.io.spark import null_violations

        try:
            handle = c.prepare(df, epochs)
        except NullViolation as err:
            if refused is None:
                raise
            df, bad = null_violations(df, c.schema, c.edge.table, epochs)
            log.warning("%s; those rows go to the region's dead letters", err)
            refused.append(bad)
            handle = c.prepare(df, epochs)
        prepared[id(c)] = (c, handle, epochs)

    @property
    def folds_every_s(self) -> float:
        """Seconds between two reads of the fold requests (:data:`FOLDS_EVERY_S`, or
        :data:`FOLDS_EVERY_EPOCHS` epochs where that is sooner)."""
        epoch_s = float(self.pipeline.settings.get("epoch_seconds") or FOLDS_EVERY_S)
        return min(FOLDS_EVERY_S, FOLDS_EVERY_EPOCHS * epoch_s)

    def _fold_checkpoints(self, active: set[str]) -> None:
        """Fold the checkpoints garbage collection no longer needs (its request in the
        epoch log, :meth:`EpochLog.record_fold`): here, between epochs, since this job is
        its stores' one writer and a fold beside a save would delete the save's files."""
        keeping = [r for r in active if self.pipeline.regions[r].keeps_state]
        if not self.persist or not keeping \
                or time.monotonic() - self.folds_read_at < self.folds_every_s:
            return
        self.folds_read_at = time.monotonic()
        asked = self.log.folds(self.pipeline.name)
        for r in keeping:
            keep_from = asked.get(r)
            if keep_from is None or keep_from <= self.folded.get(r, -1):
                continue
            store = self.checkpoint_store(r)
            if keep_from not in store.checkpoints():  # gone already, or not this store's
                self.folded[r] = keep_from
                continue
            info = store.retain(keep_from)
            self.folded[r] = keep_from
            if info.dropped:
                log.info("%s: checkpoints %s folded into %d (garbage collection)", r,
                         info.dropped, keep_from)

    def _checkpoint(self, region: str, states: list[tuple[int, Any]], refs: dict) -> None:
        """Save the region's state as of each of these epochs (one commit); ``refs`` names
        each checkpoint."""
        frames = [(x, self.logic.state_to_frame(region, state)) for x, state in states]
        self.checkpoint_store(region).save_frames(frames, self.state_frames.get(region))
        self.state_frames[region] = frames[-1][1]
        self.checkpointed_at[region] = time.monotonic()
        for x, _ in states:
            refs[(region, x)] = f"checkpoint:{x}"

    def _side_by_side(self, tasks: list[tuple[str, Callable[[], Any]]], since: float
                      ) -> float:
        """Run ``(phase, task)`` pairs at once, each in a thread of its own; now.

        Each task's Spark jobs run in a job group of their own (``<epoch group>|<i>:<phase>``,
        local properties are per thread), so its seconds and Spark jobs still go to its
        phase in the profile (phases then overlap: their seconds add up to more than the
        epoch's). When one fails, the others are let finish, then the first failure is
        raised: no commit is left running behind the job's exit."""
        if not tasks:
            return since
        if len(tasks) == 1:  # nothing to overlap: in this thread
            phase, task = tasks[0]
            task()
            return self._spent(phase, since)
        from pyspark import inheritable_thread_target

        group = self._group

        def run(i: int, phase: str, task: Callable[[], Any]) -> tuple[float, int]:
            sub = label_jobs(self.spark, f"{group}|{i}:{phase}")
            t0 = time.monotonic()
            task()
            return time.monotonic() - t0, jobs_in_group(self.spark, sub)

        with ThreadPoolExecutor(len(tasks), thread_name_prefix="falkirk-commit") as pool:
            futures = [(phase, pool.submit(inheritable_thread_target(self.spark)(run), i,
                                           phase, task))
                       for i, (phase, task) in enumerate(tasks)]
            errors = [f.exception() for _, f in futures if f.exception() is not None]
        if errors:
            raise errors[0]
        for phase, f in futures:
            seconds, jobs = f.result()
            self.profile[phase] = self.profile.get(phase, 0.0) + seconds
            self.spark_jobs[phase] = self.spark_jobs.get(phase, 0) + jobs
            self._jobs_aside += jobs
        now = time.monotonic()
        self.profile["commits side by side"] = (self.profile.get("commits side by side", 0.0)
                                               + now - since)
        return now

    def _time(self, region: str, e: int) -> Any:
        return time_of(self.pipeline.regions[region].domain, e)

    def close(self) -> None:
        """Close the inputs and let go of the state frames (their checkpointed blocks): a
        session that runs another pipeline next must not hold this one's."""
        if self._preparing is not None:  # idle: every preparation is waited for
            self._preparing.shutdown()
            self._preparing = None
        for c in self.inputs.values():
            c.close()
        self.state.clear()
        self.state_frames.clear()
        self.logic.release()


def epoch_profile(seconds: dict[str, float], seconds_before: dict[str, float],
                  jobs: dict[str, int], jobs_before: dict[str, int]) -> str:
    """One epoch's share of the runner's profile, "phase s/jobs" by phase: a slow epoch in
    a job's log says where its time and Spark jobs went (reads, transforms, commits,
    checkpoints), without a benchmark."""
    parts = []
    for phase in seconds:
        spent = seconds[phase] - seconds_before.get(phase, 0.0)
        ran = jobs.get(phase, 0) - jobs_before.get(phase, 0)
        if spent >= 0.05 or ran:
            parts.append(f"{phase} {spent:.1f} s/{ran}")
    return ", ".join(parts) or "no phase"


def name_spark_jobs(spark: Any, pipeline: str, regions: set[str] | list[str],
                    epochs: int | list[int], generation: int) -> str:
    """Name the Spark jobs that follow (the epoch's reads, transforms, writes, commits) by
    pipeline, regions, epoch(s) and generation: the Spark UI, its REST API and the event
    log then show the same split as falkirk's own timings. Returns the job group id."""
    hosted = "+".join(sorted(regions))
    epochs = [epochs] if isinstance(epochs, int) else epochs
    span = f"e{epochs[0]}" if len(epochs) == 1 else f"e{epochs[0]}-{epochs[-1]}"
    group = f"falkirk/{pipeline}/{hosted}/{span}/g{generation}"
    what = (f"epoch {epochs[0]}" if len(epochs) == 1
            else f"epochs {epochs[0]}-{epochs[-1]}")
    return label_jobs(spark, group,
                      f"falkirk {pipeline}: {hosted} {what} (generation {generation})")


def _records_read(connector: InputConnector, place: Any) -> int | None:
    """The records an input read at ``place`` (a topic's offset range); None for an input
    that does not count them (a table)."""
    logged = connector.logged(place)
    if logged is None or "to" not in logged:
        return None
    to, since = Offsets(logged["to"]), Offsets(logged["from"])
    return sum(to.get(p) - since.get(p) for p in to.as_dict())
