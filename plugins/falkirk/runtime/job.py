"""What a job author writes against: the epoch's context, its result, and ``JobLogic``.

A *job* (one Spark application, ``jobs/<name>.py``) hosts one region, or several joined
by unlogged edges. Its pure part is a :class:`JobLogic`: given one epoch's inputs (or a
pass of several, :meth:`JobLogic.process_pass`) it returns DataFrames per output edge and
the new state of its stateful regions. Everything else (which epochs are ready, reading
them, committing outputs exactly once, checkpoints, the epoch log) is the epoch loop's
(:mod:`falkirk.runtime.loop`). Job modules import this through :mod:`falkirk.job`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pyarrow as pa

from falkirk.errors import FalkirkError

# The column that carries a row's epoch in a pass of several epochs: on every input of
# JobLogic.process_pass (Kafka: the epoch whose range the record is in; a Delta edge read
# as appends: the receiver's epoch the row is delivered in), and on every output it
# returns (the epoch each row belongs to). The writer makes a subfolder per epoch of it.
from falkirk.io.delta import PASS_COLUMN
from falkirk.model.schemas import arrow_schema, use_pipeline
from falkirk.model.topology import EdgeSpec, Pipeline

__all__ = ["PASS_COLUMN", "CompositeJob", "EpochContext", "EpochResult", "JobLogic",
           "RuntimeFailure", "job_logic", "load_job"]


class RuntimeFailure(FalkirkError):
    """A region cannot go on (its input is gone, its declaration does not fit the job)."""


@dataclass
class EpochContext:
    """Everything a job's transforms get for one epoch (or, in a pass, several)."""

    epoch: int  # the (first) epoch
    generation: int
    spark: Any
    pipeline: Pipeline
    inputs: dict[str, Any]  # input edge -> DataFrame of this epoch (a pass: of its epochs)
    state: dict[str, Any]  # stateful region -> its state before the epoch (the job's own)
    active: set[str]  # regions of the job that process this epoch (others are past it)
    #: The epochs of a pass, in order (one epoch: ``[epoch]``).
    epochs: list[int] = field(default_factory=list)
    #: Per stateful region, the epochs of the pass whose state is checkpointed: the job
    #: returns each one's state in :attr:`EpochResult.states` (selective checkpoints).
    checkpoints: dict[str, list[int]] = field(default_factory=dict)
    #: ``history(edge)``: every row an ``appends`` edge delivered before this context's
    #: first epoch, for a job that keeps an aggregate of them in memory and was just
    #: (re)started (it pays for the history once, then follows the appends).
    history: Callable[[str], Any] | None = None

    def __post_init__(self) -> None:
        if not self.epochs:
            self.epochs = [self.epoch]

    @property
    def last(self) -> int:
        return self.epochs[-1]


@dataclass
class EpochResult:
    """What a job's transforms return: outputs per edge, and new state per region."""

    outputs: dict[str, Any] = field(default_factory=dict)  # edge -> DataFrame
    state: dict[str, Any] = field(default_factory=dict)  # region -> state after the last epoch
    #: A pass: region -> {epoch: its state after that epoch}, for the epochs the context
    #: asked for in :attr:`EpochContext.checkpoints`.
    states: dict[str, dict[int, Any]] = field(default_factory=dict)


class JobLogic(ABC):
    """A job's pure part. Subclasses set ``regions`` and implement ``process``.

    Stateful regions also say how their state becomes a DataFrame with a unique string
    ``key`` column and the ``state_schema`` value columns (for the incremental checkpoints,
    which Spark computes and writes) and back.
    """

    regions: tuple[str, ...] = ()

    @abstractmethod
    def process(self, ctx: EpochContext) -> EpochResult:
        """Run the job's transforms on one epoch's inputs."""

    def process_pass(self, ctx: EpochContext) -> EpochResult | None:
        """Run the transforms on several ready epochs at once (``ctx.epochs``), the epoch
        a column (:data:`PASS_COLUMN`) of every input and output; None: this job does not
        (the loop then runs ``process`` once per epoch). A region that is behind (after an
        outage, a rollback, a slow start) then pays each fixed cost once for the pass,
        while the epoch log and every table still record each epoch apart."""
        return None

    def prepare_epoch(self, ctx: EpochContext) -> None:  # noqa: B027 - an optional hook
        """Called once per epoch as soon as its Delta inputs (the state other regions
        committed) are ready while a Kafka input (the epoch's own records) is not: the
        context holds only those inputs. A job computes here what does not need the
        epoch's records (a lookup table of the state), so that when they close only their
        part is left: the epoch's latency. ``process`` must not rely on it being called.
        A job that is behind (its next epoch's records closed already) is asked to prepare
        epoch e in a thread of its own while epoch e - 1 commits, after ``process`` of
        e - 1 and before its ``finish_epoch``: what e - 1 moves on to is known then."""

    def finish_epoch(self, ctx: EpochContext) -> None:  # noqa: B027 - an optional hook
        """Called once the epoch's outputs are committed (free cached data here)."""

    def release(self) -> None:  # noqa: B027 - an optional hook
        """Let go of frames held across epochs (the runner is closing)."""

    def settle_state(self, region: str, state: Any) -> Any:
        """The state to keep once the epoch is committed (default: as returned). A job
        whose state is a lazy DataFrame cuts its lineage here, after the outputs are
        sent and committed, not in ``process`` on the way to them."""
        return state

    def initial_state(self, region: str, spark: Any) -> Any:
        return None

    def state_schema(self, region: str) -> pa.Schema:
        """Value columns of the region's checkpoints (besides the string ``key``)."""
        raise RuntimeFailure(f"{type(self).__name__} keeps state for {region!r} but declares "
                             "no state_schema")

    def state_to_frame(self, region: str, state: Any) -> Any:
        raise RuntimeFailure(f"{type(self).__name__} cannot checkpoint {region!r}")

    def state_from_frame(self, region: str, frame: Any, spark: Any) -> Any:
        raise RuntimeFailure(f"{type(self).__name__} cannot restore {region!r}")

    @property
    def passes(self) -> bool:
        """Whether this job processes several epochs in one pass."""
        return type(self).process_pass is not JobLogic.process_pass

    @property
    def prepares(self) -> bool:
        """Whether this job prepares an epoch before its records close."""
        return type(self).prepare_epoch is not JobLogic.prepare_epoch


def load_job(job: str | Path) -> ModuleType:
    """A job entry point (a path, e.g. from ``Pipeline.job_path``) as a module: jobs are
    scripts, not a package. Bare table and record names in it then resolve against the
    ``schemas/`` of the nearest folder above it that has one (its pipeline's)."""
    path = Path(job).resolve()
    folder = next((d for d in path.parents if (d / "schemas").is_dir()), None)
    if folder is not None:
        use_pipeline((folder / "schemas",))
    # keyed by the file, not its name: two pipelines may both have a jobs/ingest.py
    name = f"falkirk_job_{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise RuntimeFailure(f"cannot load job {job} from {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def job_logic(job: str | Path) -> JobLogic:
    """The JobLogic a job entry point defines, instantiated."""
    module = load_job(job)
    found = [v for v in vars(module).values() if isinstance(v, type)
             and issubclass(v, JobLogic) and v.__module__ == module.__name__]
    if len(found) != 1:
        raise RuntimeFailure(f"job {job} must define exactly one JobLogic, found {len(found)}")
    return found[0]()


def spark_schema(pipeline: Pipeline, edge: EdgeSpec):
    """The Spark schema of a Delta edge's table (an empty input before its first epoch)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(arrow_schema("tables", edge.table_schema, pipeline.schema_roots))


class CompositeJob(JobLogic):
    """Several jobs' logics in one process, in dataflow order.

    Tables one part writes and a later part reads are handed over in memory (the epoch's
    output, accumulated over epochs, cut at ``e - delay``), so a whole pipeline runs as one
    Spark application: what the benchmarks compare with and without persistence.
    """

    def __init__(self, pipeline: Pipeline, parts: list[JobLogic]):
        self.pipeline = pipeline
        self.parts = parts
        self.regions = tuple(r for part in parts for r in part.regions)
        self.memory: dict[str, Any] = {}  # table -> every epoch's output so far
        # Seconds per part ("transform:<regions>"): its process and the materialization of
        # the tables it hands over (the rest of its work is in the loop's write phases).
        self.seconds: dict[str, float] = {}
        self.spark_jobs: dict[str, int] = {}  # the same split, in Spark jobs

    def initial_state(self, region: str, spark: Any) -> Any:
        return self._owner(region).initial_state(region, spark)

    def _owner(self, region: str) -> JobLogic:
        return next(p for p in self.parts if region in p.regions)

    def state_schema(self, region: str) -> pa.Schema:
        return self._owner(region).state_schema(region)

    def state_to_frame(self, region: str, state: Any) -> Any:
        return self._owner(region).state_to_frame(region, state)

    def state_from_frame(self, region: str, frame: Any, spark: Any) -> Any:
        return self._owner(region).state_from_frame(region, frame, spark)

    @property
    def passes(self) -> bool:
        return all(part.passes for part in self.parts)

    def process(self, ctx: EpochContext) -> EpochResult:
        return self._run(ctx, many=False)

    def process_pass(self, ctx: EpochContext) -> EpochResult | None:
        return self._run(ctx, many=True) if self.passes else None

    def _held(self, ctx: EpochContext, edge: EdgeSpec, many: bool) -> Any:
        """What a part reads of a table an earlier part wrote, from memory, as the loop
        would read it from the table: its appends of the epochs' ``e - delay``, its window,
        or everything through the last epoch's ``e - delay``."""
        from pyspark.sql import functions as F

        held = self.memory.get(edge.table)
        if held is None:
            held = ctx.spark.createDataFrame([], spark_schema(self.pipeline, edge))
        lo, hi = ctx.epoch - edge.delay, ctx.last - edge.delay
        if edge.read == "appends":
            held = held.filter(F.col("epoch").between(lo, hi))
            return held.withColumn(PASS_COLUMN, (F.col("epoch") + edge.delay).cast(
                "long")) if many else held
        if edge.window is not None:
            return held.filter(F.col("epoch").between(lo - edge.window + 1, hi))
        return held.filter(F.col("epoch") <= hi)

    def _history(self, ctx: EpochContext, name: str) -> Any:
        from pyspark.sql import functions as F

        edge = self.pipeline.edges[name]
        if edge.src not in self.regions:
            return ctx.history(name)
        held = self.memory.get(edge.table)
        if held is None:
            return ctx.spark.createDataFrame([], spark_schema(self.pipeline, edge))
        return held.filter(F.col("epoch") < ctx.epoch - edge.delay)

    def _run(self, ctx: EpochContext, many: bool) -> EpochResult:
        from functools import partial

        from falkirk.io.spark import current_group, cut_lineage, jobs_in_group

        result = EpochResult()
        state = dict(ctx.state)
        for part in self.parts:
            inputs = dict(ctx.inputs)
            for r in part.regions:
                for edge in self.pipeline.in_edges(r):
                    if edge.kind == "delta" and edge.src in self.regions:
                        inputs[edge.name] = self._held(ctx, edge, many)
            sub = EpochContext(ctx.epoch, ctx.generation, ctx.spark, ctx.pipeline, inputs,
                               state, ctx.active, epochs=ctx.epochs,
                               checkpoints=ctx.checkpoints,
                               history=partial(self._history, ctx))
            t0 = time.monotonic()
            group = current_group(ctx.spark)
            jobs0 = jobs_in_group(ctx.spark, group)
            out = part.process_pass(sub) if many else part.process(sub)
            for name, df in out.outputs.items():
                edge = self.pipeline.edges.get(name)
                if edge is not None and edge.kind == "delta":
                    df = cut_lineage(df)
                    kept = df.drop(PASS_COLUMN) if PASS_COLUMN in df.columns else df
                    held = self.memory.get(edge.table)
                    self.memory[edge.table] = kept if held is None else held.unionByName(kept)
                result.outputs[name] = df
            state.update(out.state)
            result.state.update(out.state)
            result.states.update(out.states)
            key = f"transform:{'+'.join(part.regions)}"
            self.seconds[key] = self.seconds.get(key, 0.0) + time.monotonic() - t0
            self.spark_jobs[key] = (self.spark_jobs.get(key, 0)
                                    + jobs_in_group(ctx.spark, group) - jobs0)
        return result

    def finish_epoch(self, ctx: EpochContext) -> None:
        for part in self.parts:
            part.finish_epoch(ctx)

    def release(self) -> None:
        self.memory.clear()
        for part in self.parts:
            part.release()
