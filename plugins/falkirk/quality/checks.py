"""Data checks: Great Expectations suites per output table and epoch, cross-region
invariants, and quarantine of the epochs that fail.

Why per epoch and per version: a region's epoch is what the epoch log vouches for and what
a rollback restores, so a check judges exactly the rows of that epoch in the Delta version
the region committed for it (never "the table now"). A failing epoch is marked
``quarantined`` in the epoch log: receivers do not consume it (side inputs fall back to the
last good epoch), no frontier is chosen at or past it, and a rollback to the last good
epoch followed by a rerun in a new generation releases it once its checks pass.

Suites are Great Expectations 1.x suite files in ``schemas/expectations/<table>.json``,
run in an ephemeral GX context (no GX project folder) on the epoch's rows: as a pandas
frame read with delta-rs when the epoch has at most ``settings.checks.pandas_max_rows``
rows (default 1,000,000), else as a Spark DataFrame. The suites are the same; GX's Spark
engine makes ~2,000 JVM calls per suite (~2.3 s for a few hundred rows), its pandas
engine takes ~0.1 s.
Invariants state facts across regions that no single table can: events conserved,
purchases conserved, every query answered once, running totals, community labels.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from falkirk.config import Config
from falkirk.log.epochlog import EpochLog, EpochRecord, RegionLog
from falkirk.model.topology import Pipeline
from falkirk.quality.invariants import SAMPLE, CheckError, load_invariants

log = logging.getLogger(__name__)

@dataclass
class Outcome:
    """One check of one table's epoch: the row written to the ``checks`` table."""

    region: str
    table: str
    epoch: int
    generation: int
    version: int | None
    check: str
    success: bool
    observed: dict = field(default_factory=dict)
    sample: list = field(default_factory=list)
    seconds: float = 0.0

    def row(self, pipeline: str) -> dict:
        return {"pipeline": pipeline, "region": self.region, "table": self.table,
                "epoch": self.epoch, "generation": self.generation, "version": self.version,
                "check": self.check, "success": self.success,
                "observed": json.dumps(self.observed, default=str, sort_keys=True),
                "sample": json.dumps(self.sample[:SAMPLE], default=str),
                "seconds": round(self.seconds, 3), "checked_at": datetime.now(UTC)}


def load_suite(table: str, folder: Path) -> dict:
    """The suite file of a table, as written by a data engineer (GX 1.x suite JSON)."""
    path = folder / f"{table}.json"
    if not path.exists():
        raise CheckError(f"no expectation suite for table {table!r}: expected {path}")
    try:
        suite = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise CheckError(f"{path}: not JSON: {err}") from err
    if not isinstance(suite, dict) or not isinstance(suite.get("expectations"), list):
        raise CheckError(f"{path}: a suite is an object with an 'expectations' list")
    for i, exp in enumerate(suite["expectations"]):
        if not isinstance(exp, dict) or not isinstance(exp.get("type"), str):
            raise CheckError(f"{path}: expectations[{i}] needs a 'type' (e.g. "
                             f"'expect_column_values_to_not_be_null') and 'kwargs'")
    suite.setdefault("name", table)
    return suite


def check_name(exp_type: str, kwargs: dict) -> str:
    """A readable, stable name for one expectation: its type and the columns it is about."""
    cols = [kwargs[k] for k in ("column", "column_A", "column_B") if k in kwargs]
    cols += kwargs.get("column_list", [])
    return f"suite:{exp_type}({','.join(map(str, cols))})"


def _python_values(value: Any) -> Any:
    """numpy scalars (pandas results) as Python values, so JSON keeps numbers numbers."""
    if isinstance(value, dict):
        return {k: _python_values(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_python_values(v) for v in value]
    item = getattr(value, "item", None)
    if callable(item) and type(value).__module__ == "numpy":
        return item()
    return value


class Suites:
    """An ephemeral GX context holding every suite, a pandas and a Spark data source (a
    checkpoint per table on each), and Data Docs."""

    def __init__(self, tables: dict[str, Path], docs_dir: Path | None = None,
                 spark: Any = None):
        import great_expectations as gx
        from great_expectations.core.expectation_suite import ExpectationSuite
        from great_expectations.data_context.types.base import ProgressBarsConfig

        if spark is None:
            # GX's Spark source takes the active session or makes a bare one (whose Python
            # workers would not find this venv's packages): make ours first.
            from falkirk.runtime.launcher import session

            session("falkirk-checks")
        self.gx = gx
        self.context = gx.get_context(mode="ephemeral")
        self.context.variables.progress_bars = ProgressBarsConfig(globally=False)
        sources = {"pandas": self.context.data_sources.add_pandas("falkirk_pandas"),
                   "spark": self.context.data_sources.add_spark("falkirk_spark")}
        self.docs_dir = docs_dir
        if docs_dir is not None:
            self.context.add_data_docs_site(site_name="falkirk", site_config={
                "class_name": "SiteBuilder",
                "store_backend": {"class_name": "TupleFilesystemStoreBackend",
                                  "base_directory": str(docs_dir)},
                "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"}})
        self.checkpoints: dict[tuple[str, str], Any] = {}
        for table, path in tables.items():
            raw = load_suite(table, path.parent)
            try:
                suite = self.context.suites.add(ExpectationSuite(
                    name=raw["name"], expectations=raw["expectations"],
                    meta=raw.get("meta") or {}))
            except Exception as err:  # GX names the bad expectation; say which file
                raise CheckError(f"{path}: {err}") from err
            for engine, source in sources.items():
                batch = source.add_dataframe_asset(table).add_batch_definition_whole_dataframe(
                    "epoch")
                definition = self.context.validation_definitions.add(
                    gx.ValidationDefinition(name=f"{table}:{engine}", data=batch, suite=suite))
                self.checkpoints[(engine, table)] = self.context.checkpoints.add(gx.Checkpoint(
                    name=f"{table}:{engine}", validation_definitions=[definition],
                    result_format="SUMMARY"))

    def validate(self, table: str, df: Any) -> list[tuple[str, bool, dict, list]]:
        """(check, success, observed, sample) per expectation of the table's suite, on a
        pandas or a Spark DataFrame."""
        import pandas as pd

        engine = "pandas" if isinstance(df, pd.DataFrame) else "spark"
        result = self.checkpoints[(engine, table)].run(batch_parameters={"dataframe": df})
        out = []
        for suite_result in result.run_results.values():
            for r in suite_result.results:
                cfg = r.expectation_config
                observed = {k: v for k, v in (r.result or {}).items()
                            if k not in ("partial_unexpected_list", "partial_unexpected_counts",
                                         "partial_unexpected_index_list")}
                if r.exception_info and r.exception_info.get("raised_exception"):
                    observed["exception"] = r.exception_info.get("exception_message")
                sample = list((r.result or {}).get("partial_unexpected_list") or [])
                out.append((check_name(cfg.type, cfg.kwargs), bool(r.success),
                            _python_values(observed), _python_values(sample)))
        return out

    def build_docs(self) -> Path | None:
        """Render GX Data Docs for the validations run in this context."""
        if self.docs_dir is None:
            return None
        self.context.build_data_docs(site_names=["falkirk"])
        return self.docs_dir / "index.html"


class Validator:
    """Checks committed epochs of a pipeline and quarantines the ones that fail."""

    def __init__(self, pipeline: Pipeline, spark: Any, cfg: Config,
                 epoch_log: EpochLog | None = None, docs: bool = True):
        self.pipeline = pipeline
        self.spark = spark
        self.cfg = cfg
        self.log = epoch_log or EpochLog.from_config(cfg)
        # table -> region writing it (edges may share a table: one writer each)
        self.tables: dict[str, str] = {}
        for edge in pipeline.edges.values():
            if edge.kind == "delta":
                self.tables[edge.table] = edge.src
        self.docs_dir = Path(cfg.var_dir) / "checks" / pipeline.name / "data_docs"
        self._suites: Suites | None = None
        self._docs = docs
        self.invariants: dict[str, list[tuple[str, Callable]]] = load_invariants(pipeline)

    @property
    def suites(self) -> Suites:
        if self._suites is None:
            self._suites = Suites(self.suite_files(), self.docs_dir if self._docs else None,
                                  self.spark)
        return self._suites

    def suite_files(self) -> dict[str, Path]:
        """Table -> its suite file, in the pipeline's own ``schemas/expectations/``; tables
        without one have none."""
        folders = [r / "expectations" for r in self.pipeline.schema_roots]
        out = {}
        for table in self.tables:
            path = next((f / f"{table}.json" for f in folders
                         if (f / f"{table}.json").exists()), None)
            if path is not None:
                out[table] = path
        return out

    @property
    def pandas_max_rows(self) -> int:
        """Epochs up to this many rows go to GX's pandas engine (validated at load)."""
        return self.pipeline.checks_setting("pandas_max_rows")

    @property
    def on_failure(self) -> str:
        return self.pipeline.checks_setting("on_failure")

    # ---- what to check --------------------------------------------------------------

    def pending(self, logs: dict[str, RegionLog] | None = None) -> list[EpochRecord]:
        """Committed epochs (in their current generation) no check has judged yet."""
        logs = logs or self.log.regions(self.pipeline)
        done = {(r["region"], r["epoch"], r["generation"])
                for r in self.log.checks(self.pipeline.name)}
        return [row for region, rlog in logs.items() for row in rlog.entries.values()
                if row.status in ("committed", "checkpointed") and self._checked(region)
                and (region, row.epoch, row.generation) not in done]

    def _checked(self, region: str) -> bool:
        """A region is checked when a table it writes has a suite or an invariant."""
        return any(self.tables.get(t) == region for t in self._suite_tables()) or \
            region in self.invariants

    def _suite_tables(self) -> list[str]:
        return list(self.suite_files())

    # ---- checking -------------------------------------------------------------------

    def check_epoch(self, row: EpochRecord, logs: dict[str, RegionLog]) -> list[Outcome]:
        """Every suite of the tables the row committed, and the region's invariants."""
        import pyarrow.compute as pc
        from pyspark.sql import functions as F

        from falkirk.io.delta import read_version
        from falkirk.io.lake import version_dataset

        outcomes: list[Outcome] = []
        seen: set[str] = set()
        for out in (row.outputs or {}).values():
            table, version = out.get("table"), out.get("version")
            if table is None or table in seen or table not in self._suite_tables():
                continue
            seen.add(table)
            started = time.monotonic()
            uri, options = self.cfg.table(table), self.cfg.delta_storage_options or None
            dataset = version_dataset(uri, version, options)
            in_epoch = pc.field("epoch") == row.epoch
            if dataset.count_rows(filter=in_epoch) <= self.pandas_max_rows:
                results = self.suites.validate(
                    table, dataset.to_table(filter=in_epoch).to_pandas())
            else:  # too big for one process: GX's Spark engine
                df = read_version(self.spark, uri, version, options).filter(
                    F.col("epoch") == row.epoch).cache()
                try:
                    results = self.suites.validate(table, df)
                finally:
                    df.unpersist()
            seconds = (time.monotonic() - started) / max(len(results), 1)
            outcomes += [Outcome(row.region, table, row.epoch, row.generation, version, name,
                                 ok, observed, sample, seconds)
                         for name, ok, observed, sample in results]
        for name, fn in self.invariants.get(row.region, []):
            started = time.monotonic()
            table, ok, observed, sample, version = fn(self, row, logs)
            outcomes.append(Outcome(row.region, table, row.epoch, row.generation, version,
                                    f"invariant:{name}", ok, observed, sample,
                                    time.monotonic() - started))
        return outcomes

    def run(self, epochs: Iterable[int] | None = None, regions: Iterable[str] | None = None,
            quarantine: bool = True, progress: Callable[[EpochRecord], None] | None = None
            ) -> Report:
        """Check pending epochs (or the given ones again), record results, quarantine."""
        logs = self.log.regions(self.pipeline)
        if epochs is None:
            rows = self.pending(logs)
        else:
            wanted = set(epochs)
            rows = [row for rlog in logs.values() for row in rlog.entries.values()
                    if row.epoch in wanted and row.status in ("committed", "checkpointed")
                    and self._checked(row.region)]
        if regions is not None:
            unknown = set(regions) - set(self.pipeline.regions)
            if unknown:
                raise CheckError(f"pipeline {self.pipeline.name!r} has no region(s) "
                                 f"{sorted(unknown)}")
            rows = [r for r in rows if r.region in set(regions)]
        rows.sort(key=lambda r: (r.epoch, list(self.pipeline.regions).index(r.region)))
        report = Report(self.pipeline.name)
        for row in rows:
            if progress is not None:
                progress(row)
            started = time.monotonic()
            outcomes = self.check_epoch(row, logs)
            self.log.record_checks([o.row(self.pipeline.name) for o in outcomes])
            failed = [o for o in outcomes if not o.success]
            log.info("%s epoch %d (generation %d): %d checks %s in %.1f s", row.region,
                     row.epoch, row.generation, len(outcomes),
                     "passed" if not failed else "FAILED: " + ", ".join(
                         f"{o.table} {o.check} {o.observed}" for o in failed[:3]),
                     time.monotonic() - started)
            report.epochs.append((row.region, row.epoch, row.generation,
                                  time.monotonic() - started, outcomes))
            if failed and quarantine:
                self.quarantine(row, failed)
                report.quarantined.append((row.region, row.epoch))
        if rows and self._docs and self._suites is not None:
            report.docs = self.suites.build_docs()
        if report.quarantined and self.on_failure == "rollback":
            report.rollbacks = self.rollback_requests(report)
        return report

    def follow(self, until_epoch: int | None = None, poll_s: float = 2.0,
               progress: Callable[[EpochRecord], None] | None = None) -> Report:
        """Check epochs as regions commit them, until every checked region committed and
        passed ``until_epoch`` (forever without it). With ``settings.checks.hold`` this is
        what receivers wait for."""
        total = Report(self.pipeline.name)
        while True:
            report = self.run(progress=progress)
            total.epochs += report.epochs
            total.quarantined += report.quarantined
            total.rollbacks += report.rollbacks
            total.docs = report.docs or total.docs
            if until_epoch is not None and self._through(until_epoch):
                return total
            time.sleep(poll_s)

    def _through(self, epoch: int) -> bool:
        """Every checked region has a checked, good row for every epoch up to ``epoch``."""
        passed = self.log.passed_checks(self.pipeline.name)
        logs = self.log.regions(self.pipeline)
        for region, rlog in logs.items():
            if not self._checked(region):
                continue
            good = {(r.epoch, r.generation) for r in rlog.entries.values()
                    if r.status in ("committed", "checkpointed")}
            if not set(range(epoch + 1)) <= {e for e, _ in good & passed.get(region, set())}:
                return False
        return True

    def quarantine(self, row: EpochRecord, failed: list[Outcome]) -> None:
        """Hold the epoch back: receivers wait, frontiers stay below it."""
        why = "; ".join(f"{o.table} {o.check}" for o in failed[:4])
        self.log.record(replace(row, status="quarantined", recorded_at=None,
                                note=f"data checks failed: {why}"))
        log.warning("quarantined %s epoch %d (generation %d): %s", row.region, row.epoch,
                    row.generation, why)

    def rollback_requests(self, report: Report) -> list[dict]:
        """Rollback DAG confs: each quarantined region back to its last good epoch."""
        logs = self.log.regions(self.pipeline)
        confs = []
        for region in sorted({r for r, _ in report.quarantined}):
            spec = self.pipeline.regions[region]
            good = logs[region].restorable(spec.regime)
            if not good:
                log.warning("%s has no good epoch to roll back to", region)
                continue
            confs.append({"pipeline": self.pipeline.name, "failed_regions": [region],
                          "to_epoch": good[-1].epoch, "dry_run": False,
                          "reason": f"data checks failed: {region} epoch "
                                    f"{min(e for r, e in report.quarantined if r == region)}"})
        return confs


@dataclass
class Report:
    """What one validation run did."""

    pipeline: str
    epochs: list[tuple[str, int, int, float, list[Outcome]]] = field(default_factory=list)
    quarantined: list[tuple[str, int]] = field(default_factory=list)
    rollbacks: list[dict] = field(default_factory=list)
    docs: Path | None = None

    @property
    def failures(self) -> list[Outcome]:
        return [o for *_, outcomes in self.epochs for o in outcomes if not o.success]

    def as_dict(self) -> dict:
        return {
            "pipeline": self.pipeline,
            "epochs": [{"region": r, "epoch": e, "generation": g, "seconds": round(s, 2),
                        "checks": len(outs), "failed": [
                            {"table": o.table, "check": o.check, "observed": o.observed,
                             "sample": o.sample[:SAMPLE]} for o in outs if not o.success]}
                       for r, e, g, s, outs in self.epochs],
            "quarantined": [{"region": r, "epoch": e} for r, e in self.quarantined],
            "rollbacks": self.rollbacks,
            "data_docs": None if self.docs is None else str(self.docs),
        }
