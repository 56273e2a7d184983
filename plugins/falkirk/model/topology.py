"""Pipeline declarations: regions with their regime, and the edges between them.

A pipeline is declared once, in a YAML file (``<folder>/pipeline.yaml``, see
docs/pipeline-yaml.md); every path it names is relative to its folder. Loading
validates it and every error names the file and the region or edge at fault.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from falkirk.errors import FalkirkError
from falkirk.model.times import DOMAINS, ITERATION
from falkirk.regimes import REGIMES, Regime

PIPELINES_DIR = Path(__file__).resolve().parents[3] / "examples"  # in a checkout: its examples

EDGE_KINDS = ("kafka", "delta", "unlogged")
DELTA_READS = ("snapshot", "appends")  # how a receiver reads a delta edge (EdgeSpec.read)
NAME_RULE = re.compile(r"^[a-z][a-z0-9_]*$")  # pipeline and region names


class TopologyError(FalkirkError, ValueError):
    """A pipeline declaration that cannot run; the message says where and why."""


class ChecksSettings(BaseModel):
    """``settings.checks``: how data checks gate and react (docs/pipeline-yaml.md)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    hold: bool = False  # receivers read only epochs whose checks passed
    on_failure: Literal["quarantine", "rollback"] = "quarantine"
    pandas_max_rows: int = Field(1_000_000, ge=0)  # larger epochs go to GX's Spark engine


class PipelineSettings(BaseModel):
    """``settings``: what every region's epochs depend on. No defaults for what changes
    results: an epoch length or origin a user forgot would cut other epochs silently.
    The application's own settings go under ``app`` (read by its jobs as
    ``pipeline.app``): any other key is a typo, refused with the nearest known key."""

    model_config = ConfigDict(extra="forbid", strict=True)
    epoch_seconds: float = Field(gt=0)  # epochs are event-time windows of this length
    origin_ms: int = Field(ge=0)  # the start of epoch 0, in epoch milliseconds
    checks: ChecksSettings = Field(default_factory=ChecksSettings)
    # how often the streams supervisor's watch collects garbage as epochs commit (0: only
    # when an operator runs the gc DAG or ``falkirk gc --apply``)
    gc_every_seconds: float = Field(60.0, ge=0)
    app: dict[str, Any] = Field(default_factory=dict)  # the application's own settings


def _settings_error(exc: ValidationError) -> str:
    """Pydantic's errors as 'settings.<key>: <rule> (got <value>)'; an unknown key with
    the known key it most likely meant."""
    import difflib

    parts = []
    for err in exc.errors():
        key = ".".join(str(x) for x in ("settings", *err["loc"]))
        if err["type"] == "extra_forbidden":
            model = ChecksSettings if err["loc"][:1] == ("checks",) else PipelineSettings
            near = difflib.get_close_matches(str(err["loc"][-1]), model.model_fields, n=1)
            hint = f"did you mean {near[0]!r}? " if near else ""
            parts.append(f"{key}: unknown setting ({hint}the pipeline's own settings go "
                         "under settings.app)" if model is PipelineSettings else
                         f"{key}: unknown setting ({hint}known: "
                         f"{', '.join(model.model_fields)})")
            continue
        got = "" if err["type"] == "missing" else f" (got {err['input']!r})"
        parts.append(f"{key}: {err['msg'].lower()}{got}")
    return "; ".join(parts)


@dataclass(frozen=True)
class RegionSpec:
    name: str
    regime: str
    domain: str = "epoch"
    job: str | None = None  # entry point in jobs/ (spark-submit)
    stateful: bool = False  # keeps state between epochs (lazy and eager regions do)
    checkpoint_every: int | None = None  # K: a lazy region checkpoints every K epochs
    checkpoint_seconds: float | None = None  # or every T seconds
    # Checkpoints garbage collection keeps older than the newest one at or below the
    # region's low watermark (the oldest a rollback can need).
    retain_checkpoints: int = 3
    options: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

    @property
    def iterating(self) -> bool:
        return DOMAINS[self.domain] is ITERATION

    @property
    def regime_rules(self) -> Regime:
        """What this region's regime saves, acknowledges and restores (falkirk.regimes)."""
        return REGIMES[self.regime]

    @property
    def keeps_state(self) -> bool:
        return self.regime_rules.keeps_state


@dataclass(frozen=True)
class EdgeSpec:
    name: str
    kind: str  # kafka | delta | unlogged
    src: str | None  # None: produced outside the pipeline
    dst: str | None  # None: read outside the pipeline (clients)
    topic: str | None = None
    partitions: int = 1
    table: str | None = None
    # The receiver uses the sender's epoch k at its own epoch k + delay (a side input read
    # "as of the previous epoch" has delay 1). Records keep the sender's epochs; the
    # receiver at epoch e has delivered them up to e - delay.
    delay: int = 0
    schema: str | None = None  # schemas/tables/<schema>.json when it differs from the table
    # How the receiver reads a Delta edge each epoch: "snapshot", the table as of the
    # sender's epoch (the version the epoch log names); "appends", only the rows the
    # sender appended for that epoch, followed through Delta's streaming source (for a
    # region that reads a growing table continuously and needs each epoch's increment).
    read: str = "snapshot"
    # A Delta table is a product: garbage collection never deletes its rows. Declaring
    # ``retain_epochs: N`` makes it a log between regions: rows of epochs every receiver
    # has passed for good (below its low watermark) and older than the sender's newest N
    # epochs may be deleted (docs/pipeline-yaml.md, "Garbage collection"). On a Kafka
    # edge between regions, the topic's records its receiver has passed for good are.
    retain_epochs: int | None = None
    # ``read: snapshot`` of only the sender's last ``window`` epochs (by the table's
    # ``epoch`` column, files chosen by their statistics): a receiver that needs a sliding
    # window reads the window, not the table's whole history, every epoch.
    window: int | None = None

    @property
    def table_schema(self) -> str:
        return self.schema or self.table

    @property
    def logged(self) -> bool:
        """What the sender sent can be sent again (a Delta table, a topic's retention)."""
        return self.kind in ("kafka", "delta")


@dataclass(frozen=True)
class Pipeline:
    name: str
    regions: dict[str, RegionSpec]
    edges: dict[str, EdgeSpec]
    settings: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    source: str = ""
    invariants: str = ""  # a file of cross-region checks (falkirk.quality.invariants)

    def in_edges(self, region: str) -> list[EdgeSpec]:
        return [e for e in self.edges.values() if e.dst == region]

    def out_edges(self, region: str) -> list[EdgeSpec]:
        return [e for e in self.edges.values() if e.src == region]

    def replays_inputs(self, region: str) -> bool:
        """Whether every input of ``region`` can be read again on its own: logged (a
        table or a topic) and written by another job (a region of its own job would have
        to run those epochs again with it). A lazy region's replay frontiers need this."""
        job = self.regions[region].job
        return all(e.logged and (e.src is None or (
            job is not None and self.regions[e.src].job != job))
            for e in self.in_edges(region))

    def log_tables(self) -> dict[str, int]:
        """Tables declared logs (``retain_epochs`` on an edge of theirs) -> epochs kept:
        the only tables whose rows garbage collection may delete."""
        return {e.table: e.retain_epochs for e in self.edges.values()
                if e.kind == "delta" and e.retain_epochs is not None}

    def dead_letter_edge(self, region: str) -> EdgeSpec | None:
        """The region's dead-letter table: its Delta output of schema ``dead_letters`` (rows
        it could not use, and rows its other outputs refused), or None."""
        return next((e for e in self.out_edges(region)
                     if e.kind == "delta" and e.table_schema == "dead_letters"), None)

    @property
    def app(self) -> dict[str, Any]:
        """The application's own settings (``settings.app``), read by its jobs."""
        return self.settings.get("app") or {}

    def checks_setting(self, name: str, default: Any = None) -> Any:
        """``settings.checks.<name>`` of the declaration (read by the validator, and by the
        jobs and the harness for ``hold``)."""
        return (self.settings.get("checks") or {}).get(name, default)

    def edge_domain(self, edge: EdgeSpec) -> str:
        """Times on an edge are in its receiver's domain (its sender's, for an output)."""
        return self.regions[edge.dst or edge.src].domain

    # ---- loading --------------------------------------------------------------------

    @classmethod
    def load(cls, path: str | Path) -> Pipeline:
        import yaml

        path = Path(path)
        if path.is_dir():  # a pipeline folder: its declaration inside
            path = path / "pipeline.yaml"
            if not path.is_file():
                raise TopologyError(f"{path.parent}: a folder without a pipeline.yaml (a "
                                    "pipeline folder holds its declaration there)")
        try:
            raw = yaml.safe_load(path.read_text())
        except OSError as exc:
            raise TopologyError(f"{path}: cannot read: {exc.strerror}") from None
        except yaml.YAMLError as exc:
            raise TopologyError(f"{path}: not valid YAML: {exc}") from None
        pipeline = cls.from_dict(raw, origin=str(path))
        pipeline.check_files()
        return pipeline

    @property
    def folder(self) -> Path:
        """The pipeline's folder: every path it declares is relative to it (the current
        directory for a pipeline built from a mapping rather than loaded from a file)."""
        declared = self.source.endswith((".yaml", ".yml"))
        return Path(self.source).resolve().parent if declared else Path.cwd()

    @property
    def schema_roots(self) -> tuple[Path, ...]:
        """The declaration's own ``schemas/`` folder, searched before falkirk's."""
        return (self.folder / "schemas",)

    def job_path(self, job: str) -> Path:
        """A job entry point as declared: relative to the pipeline's folder."""
        return Path(job) if Path(job).is_absolute() else self.folder / job

    def check_files(self) -> None:
        """Every job entry point and table schema the declaration names exists: found now,
        not when a job starts (or, worse, when its first epoch writes)."""
        from falkirk.model.schemas import arrow_schema, ddl, find

        for spec in self.regions.values():
            if spec.job and not self.job_path(spec.job).is_file():
                raise TopologyError(f"{self.source}: region {spec.name!r}: job file "
                                    f"{spec.job} not found (looked in {self.folder})")
        if self.invariants and not self.job_path(self.invariants).is_file():
            raise TopologyError(f"{self.source}: invariants file {self.invariants} not found "
                                f"(looked in {self.folder})")
        for e in self.edges.values():
            if (e.kind == "delta" and e.src is not None
                    and find("tables", e.table_schema, self.schema_roots, others=False) is None):
                    where = " and ".join(str(r / "tables") for r in self.schema_roots)
                    raise TopologyError(f"{self.source}: edge {e.name!r}: table schema "
                                        f"{e.table_schema}.json not found (looked in "
                                        f"{where} and falkirk's schemas/tables)")
        for e in self.edges.values():  # column types: refused now, not 11 s into a run
            try:
                if e.kind == "delta" and e.src is not None:
                    arrow_schema("tables", e.table_schema, self.schema_roots)
                elif (e.kind == "kafka" and e.src is None
                      and find("records", e.topic, self.schema_roots, others=False)):
                    ddl("records", e.topic, self.schema_roots)
            except (ValueError, KeyError) as exc:
                raise TopologyError(f"{self.source}: edge {e.name!r}: {exc}") from None

    @classmethod
    def from_dict(cls, raw: Any, origin: str = "pipeline") -> Pipeline:
        def fail(where: str, what: str) -> TopologyError:
            return TopologyError(f"{origin}: {where}: {what}")

        if not isinstance(raw, dict):
            raise fail("top level", "expected a mapping with pipeline, regions and edges")
        extra = set(raw) - {"pipeline", "regions", "edges", "settings", "invariants"}
        if extra:
            raise fail("top level", f"unknown keys {sorted(extra)}")
        name = raw.get("pipeline")
        if not isinstance(name, str) or not NAME_RULE.match(name):
            raise fail("pipeline", f"expected a lower-case identifier, got {name!r}")
        raw_regions, raw_edges = raw.get("regions") or {}, raw.get("edges") or {}
        if not isinstance(raw_regions, dict) or not raw_regions:
            raise fail("regions", "declare at least one region")

        regions: dict[str, RegionSpec] = {}
        allowed = {"regime", "domain", "job", "stateful", "checkpoint_every",
                   "checkpoint_seconds", "retain_checkpoints", "options"}
        for rname, spec in raw_regions.items():
            where = f"region {rname!r}"
            if not NAME_RULE.match(str(rname)):
                raise fail(where, "names are lower-case identifiers")
            if not isinstance(spec, dict):
                raise fail(where, "expected a mapping")
            extra = set(spec) - allowed
            if extra:
                raise fail(where, f"unknown keys {sorted(extra)}")
            regime = spec.get("regime")
            if regime not in REGIMES:
                raise fail(where, f"regime must be one of {', '.join(REGIMES)}, got {regime!r}")
            domain = spec.get("domain", "epoch")
            if domain not in DOMAINS or domain == "offsets":
                raise fail(where, f"domain must be epoch or epoch.iteration, got {domain!r}")
            REGIMES[regime].check(spec, lambda what, where=where: fail(where, what))
            stateful = spec.get("stateful", REGIMES[regime].keeps_state)
            every, seconds = spec.get("checkpoint_every"), spec.get("checkpoint_seconds")
            retain = spec.get("retain_checkpoints", 3)
            if not isinstance(retain, int) or isinstance(retain, bool) or retain < 0:
                raise fail(where, f"retain_checkpoints must be an integer ≥ 0, got {retain!r}")
            regions[rname] = RegionSpec(
                rname, regime, domain, spec.get("job"), bool(stateful), every, seconds, retain,
                dict(spec.get("options") or {}),
            )

        edges: dict[str, EdgeSpec] = {}
        for ename, spec in raw_edges.items():
            where = f"edge {ename!r}"
            if not isinstance(spec, dict):
                raise fail(where, "expected a mapping")
            extra = set(spec) - {"kind", "from", "to", "topic", "partitions", "table", "delay",
                                 "schema", "read", "retain_epochs", "window"}
            if extra:
                raise fail(where, f"unknown keys {sorted(extra)}")
            kind = spec.get("kind")
            if kind not in EDGE_KINDS:
                raise fail(where, f"kind must be one of {', '.join(EDGE_KINDS)}, got {kind!r}")
            src, dst = spec.get("from"), spec.get("to")
            for end, label in ((src, "from"), (dst, "to")):
                if end is not None and end not in regions:
                    raise fail(where, f"{label!r} names unknown region {end!r}")
            if src is None and dst is None:
                raise fail(where, "needs from or to")
            if kind == "unlogged":
                if src is None or dst is None:
                    raise fail(where, "an unlogged edge passes records between two regions "
                                      "inside one Spark job: it needs both from and to")
                if regions[src].job != regions[dst].job:
                    raise fail(where, f"an unlogged edge passes records inside one Spark job, "
                                      f"but {src!r} and {dst!r} run in different jobs")
            elif kind == "kafka" and not spec.get("topic"):
                raise fail(where, "a kafka edge needs its topic")
            elif kind == "delta" and not spec.get("table"):
                raise fail(where, "a delta edge needs its table")
            if src is None and kind != "kafka":
                raise fail(where, "an input from outside the pipeline must be a kafka topic")
            partitions = spec.get("partitions", 1)
            if not isinstance(partitions, int) or partitions < 1:
                raise fail(where, f"partitions must be an integer ≥ 1, got {partitions!r}")
            delay = spec.get("delay", 0)
            if not isinstance(delay, int) or delay < 0:
                raise fail(where, f"delay must be an integer ≥ 0, got {delay!r}")
            read = spec.get("read", "snapshot")
            if read not in DELTA_READS:
                raise fail(where, f"read must be one of {', '.join(DELTA_READS)}, got {read!r}")
            if read != "snapshot" and (kind != "delta" or dst is None):
                raise fail(where, f"read: {read} is how a region reads a delta edge; this edge "
                                  f"is {kind}{'' if dst else ' and has no receiver'}")
            retain = spec.get("retain_epochs")
            if retain is not None:
                if kind == "unlogged" or src is None or (kind == "kafka" and dst is None):
                    lack = (" with no region writing it" if src is None
                            else " with no receiver" if kind == "kafka" else "")
                    raise fail(where, "retain_epochs declares a log between regions (a Delta "
                                      "table a region writes, or a topic one region sends "
                                      f"and another reads); this edge is {kind}{lack}")
                if not isinstance(retain, int) or isinstance(retain, bool) or retain < 0:
                    raise fail(where, f"retain_epochs must be an integer ≥ 0, got {retain!r}")
            window = spec.get("window")
            if window is not None:
                if kind != "delta" or dst is None or read != "snapshot":
                    raise fail(where, "window is how a region reads a delta edge as a "
                                      "snapshot of the sender's last epochs; this edge is "
                                      f"{kind}{'' if dst else ' with no receiver'}"
                                      f"{', read: ' + read if read != 'snapshot' else ''}")
                if not isinstance(window, int) or isinstance(window, bool) or window < 1:
                    raise fail(where, f"window must be an integer ≥ 1, got {window!r}")
            edges[ename] = EdgeSpec(ename, kind, src, dst, spec.get("topic"), partitions,
                                    spec.get("table"), delay, spec.get("schema"), read, retain,
                                    window)

        writers: dict[str, set[str]] = {}
        for e in edges.values():
            if e.kind == "delta" and e.src is not None:
                writers.setdefault(e.table, set()).add(e.src)
        retained: dict[str, set[int]] = {}
        for e in edges.values():
            if e.retain_epochs is not None and e.kind == "delta":
                retained.setdefault(e.table, set()).add(e.retain_epochs)
        for table, kept in retained.items():
            if len(kept) > 1:
                raise fail(f"table {table!r}", f"its edges declare retain_epochs "
                           f"{sorted(kept)}: declare one value (on one edge is enough)")
        for table, srcs in writers.items():
            if len(srcs) > 1:
                raise fail(f"table {table!r}", f"written by regions {sorted(srcs)}: a rollback "
                           "restores a table as one region wrote it, which would undo the "
                           "other's epochs; give each region its own table")
        raw_settings = raw.get("settings")
        if raw_settings is None:
            raise fail("settings", "missing: declare at least epoch_seconds and origin_ms")
        if not isinstance(raw_settings, dict):
            raise fail("settings", "expected a mapping")
        try:
            settings = PipelineSettings.model_validate(raw_settings)
        except ValidationError as exc:
            raise TopologyError(f"{origin}: {_settings_error(exc)}") from None
        invariants = raw.get("invariants") or ""
        if not isinstance(invariants, str) or (invariants and not invariants.endswith(".py")):
            raise fail("invariants", f"expected the path of a Python file, got {invariants!r}")
        pipeline = cls(name, regions, edges, settings.model_dump(), origin, invariants)
        pipeline._check_cycles(fail)
        return pipeline

    def _check_cycles(self, fail) -> None:
        """Every cycle must pass through an iterating region (it is what ends a loop)."""
        graph: dict[str, list[str]] = {r: [] for r in self.regions}
        for e in self.edges.values():
            if e.src and e.dst and not self.regions[e.dst].iterating:
                graph[e.src].append(e.dst)
        # Edges into an iterating region are cut: a cycle left over has none.
        colour: dict[str, int] = {}
        stack: list[str] = []

        def visit(n: str) -> None:
            colour[n] = 1
            stack.append(n)
            for m in graph[n]:
                if colour.get(m) == 1:
                    loop = stack[stack.index(m):] + [m]
                    raise fail("edges", "a cycle without an iterating region: "
                                        + " → ".join(loop))
                if m not in colour:
                    visit(m)
            stack.pop()
            colour[n] = 2

        for n in self.regions:
            if n not in colour:
                visit(n)


def declared() -> dict[str, Path]:
    """The declared pipelines (name -> file): in the folders of ``$FALKIRK_PIPELINES``
    (``<folder>/<name>.yaml``, or ``<folder>/<name>/pipeline.yaml`` for a pipeline folder),
    then, in a checkout, its ``examples/``; the first of a name wins."""
    import os

    from falkirk.config import load

    folders = [Path(f) for f in load().pipelines.split(os.pathsep) if f] + [PIPELINES_DIR]
    found: dict[str, Path] = {}
    for folder in folders:
        files = [*sorted(folder.glob("*.yaml")), *sorted(folder.glob("*/pipeline.yaml"))]
        for path in files:
            name = path.parent.name if path.name == "pipeline.yaml" else path.stem
            found.setdefault(name, path)
    return found


def check_declared() -> dict[str, tuple[Path, str | None]]:
    """Every declared pipeline, loaded and checked: name -> (file, None or the error)."""
    out: dict[str, tuple[Path, str | None]] = {}
    for name, path in declared().items():
        try:
            pipe = Pipeline.load(path)
            error = (None if pipe.name == name else f"{path}: declares pipeline "
                     f"{pipe.name!r}, but its file names it {name!r}")
        except TopologyError as exc:
            error = str(exc)
        out[name] = (path, error)
    return out


def load_pipeline(name_or_path: str | Path) -> Pipeline:
    """A declared pipeline by name; else a pipeline folder (its ``pipeline.yaml``) or a
    declaration file by path. A declared name wins over a same-named folder in the
    current directory (the guide's layout has both: ``sensors/`` is that pipeline)."""
    name = str(name_or_path)
    path = Path(name_or_path)
    files = declared() if NAME_RULE.match(name) else {}
    if name in files:
        return Pipeline.load(files[name])
    if path.suffix in (".yaml", ".yml") or path.exists():
        return Pipeline.load(path)
    raise TopologyError(
        f"unknown pipeline {name!r}: not a declared name (declared: "
        f"{', '.join(files or declared()) or 'none'}; falkirk finds declarations in "
        "$FALKIRK_PIPELINES and a checkout's examples/) nor a pipeline folder or file")
