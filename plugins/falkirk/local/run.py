"""A local run of a whole pipeline on the embedded defaults: its own Kafka broker (KRaft),
lake and process folders under one root; every job is its own process, started as the
profile's launcher starts a driver (falkirk.runtime.launcher: a client of the engine, or
spark-submit).

``falkirk run <dir>`` uses it; so do the dev tools (the test harness, trials, chaos, the
demo), which add input generation, kills and output comparison on top.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from falkirk.config import Config, load
from falkirk.errors import FalkirkError
from falkirk.log.epochlog import EpochLog
from falkirk.model.topology import Pipeline, load_pipeline

CHECKS = "checks"  # the validator's entry in LocalRun.procs (settings.checks.hold)


class LocalRunError(FalkirkError):
    pass


class LocalRun:
    """One sandboxed run of a pipeline under ``root``."""

    def __init__(self, root: Path, pipeline: str | Path, broker=None):
        self.root = Path(root).resolve()  # jobs run elsewhere: no relative lake paths
        self.pipeline: Pipeline = load_pipeline(pipeline)
        self._own_broker = broker is None
        self.broker = broker
        self.procs: dict[str, subprocess.Popen] = {}
        self.until_epoch: int | None = None
        # How long a job waits for its inputs' next epoch before it fails (a sandbox must
        # not hang forever; the streams supervisor's jobs wait as long as it takes).
        self.idle_timeout_s = 300.0
        self._house: Any = None  # keep_house's thread
        self._house_stop: Any = None

    # -- lifecycle ----------------------------------------------------------------------

    def __enter__(self) -> LocalRun:
        from falkirk.local.broker import LocalBroker

        cfg = load()
        self.root.mkdir(parents=True, exist_ok=True)
        if self.broker is None:
            self.broker = LocalBroker(self.root / "broker")
            self.broker.start()
        self.cfg: Config = replace(cfg, lake=self._lake(cfg),
                                   var_dir=str(self.root / "var"),
                                   kafka_bootstrap=self.broker.bootstrap)
        self.env = {"FALKIRK_LAKE": self.cfg.lake, "FALKIRK_VAR_DIR": self.cfg.var_dir,
                    "FALKIRK_KAFKA_BOOTSTRAP": self.cfg.kafka_bootstrap}
        if self.cfg.storage_options:  # the jobs' var_dir is the run's: hand them the
            # object store's credentials the way a scheduler would, in the environment
            from falkirk.config import SECRET_OPTIONS

            opts = self.cfg.delta_storage_options
            self.env.update({k: opts[k] for k in SECRET_OPTIONS})
        self.log = EpochLog.from_config(self.cfg)
        return self

    def _lake(self, cfg: Config) -> str:
        """The run's lake: ``<root>/lake``, or on an object store (the profile's lake is a
        URI) a prefix of its own under it, kept in ``<root>/lake.uri`` so the run finds its
        tables again."""
        if "://" not in cfg.lake:
            return str(self.root / "lake")
        marker = self.root / "lake.uri"
        if marker.exists():
            return marker.read_text().strip()
        import uuid

        uri = f"{cfg.lake.rstrip('/')}/runs/{self.root.name}-{uuid.uuid4().hex[:8]}"
        marker.write_text(uri + "\n")
        return uri

    def __exit__(self, *exc: Any) -> None:
        self.stop_all()
        if self._own_broker and self.broker is not None:
            self.broker.stop()

    # -- jobs ---------------------------------------------------------------------------

    @property
    def jobs(self) -> dict[str, list[str]]:
        from falkirk.runtime.procs import jobs_of

        return jobs_of(self.pipeline)

    def start(self, jobs: list[str] | None = None, until_epoch: int | None = None) -> None:
        """Start jobs (default: all) that are not running, each in its own process group."""
        from falkirk.runtime.launcher import launcher, start_job

        if until_epoch is not None:
            self.until_epoch = until_epoch
        held = bool(self.pipeline.checks_setting("hold"))
        # Readers of a held pipeline also wait for the validator: give them longer.
        idle = max(self.idle_timeout_s, 1200.0) if held else self.idle_timeout_s
        args = ["--idle-timeout", f"{idle:.0f}"]
        if self.until_epoch is not None:
            args += ["--until-epoch", str(self.until_epoch)]
        if not self.procs:  # the run's first start: an engine started now warms up first
            launcher(self.cfg).ensure(warm=True)
        for job in jobs or list(self.jobs):
            proc = self.procs.get(job)
            if proc is not None and proc.poll() is None:
                continue
            self.procs[job] = start_job(self.pipeline, job, args, self.cfg, self.env)
        if held and jobs is None:
            self._start_checks()

    def keep_house(self, compact_every_s: float = 60.0) -> None:
        """Beside the jobs, in a thread, what the streams supervisor's watch does beside a
        deployed pipeline (:class:`falkirk.recovery.gc.Housekeeping`): compact the epoch
        log every ``compact_every_s`` and collect garbage every ``gc_every_seconds`` (the
        pipeline's setting; 0: never) as the low watermarks move. :meth:`stop_all` ends
        it."""
        import threading

        from falkirk.recovery.gc import Housekeeping

        if self._house is not None and self._house.is_alive():
            return
        stop = self._house_stop = threading.Event()
        # its own epoch log: the caller's is not shared between threads
        house = Housekeeping(self.pipeline, self.cfg, EpochLog.from_config(self.cfg),
                             compact_every_s=compact_every_s)

        def run() -> None:
            while not stop.wait(1.0):
                house.step()

        self._house = threading.Thread(target=run, name="falkirk-house", daemon=True)
        self._house.start()

    def _start_checks(self) -> None:
        """Epochs are held until checked: run the validator beside the jobs (it ends once
        every checked region passed ``until_epoch``)."""
        if self.until_epoch is None:
            raise LocalRunError("settings.checks.hold needs an until_epoch: the validator "
                               "must know when to stop")
        proc = self.procs.get(CHECKS)
        if proc is not None and proc.poll() is None:
            return
        path = self.log_file(CHECKS)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "ab") as out:
            self.procs[CHECKS] = subprocess.Popen(
                [sys.executable, "-m", "falkirk.cli", "validate", "--pipeline",
                 self.pipeline.source or self.pipeline.name, "--follow", "--until-epoch",
                 str(self.until_epoch), "--no-docs"],
                stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **self.env},
                start_new_session=True)

    def wait(self, timeout_s: float = 900, progress: Callable[[str], None] | None = None
             ) -> dict[str, int]:
        """Wait for every started job to exit; their exit codes (0 = done)."""
        deadline = time.monotonic() + timeout_s
        codes: dict[str, int] = {}
        for job, proc in self.procs.items():
            left = max(1.0, deadline - time.monotonic())
            try:
                codes[job] = proc.wait(timeout=left)
            except subprocess.TimeoutExpired:
                raise LocalRunError(f"job {job} still running after {timeout_s:.0f} s; "
                                   f"see {self.log_file(job)}") from None
            if progress:
                progress(f"{job} exited {codes[job]}")
        return codes

    def log_file(self, job: str) -> Path:
        from falkirk.runtime.procs import log_file

        return log_file(self.pipeline, job, self.cfg)

    def kill(self, job: str) -> None:
        """SIGKILL a job's whole process group (its Spark driver JVM included)."""
        proc = self.procs[job]
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        proc.wait()
        from falkirk.runtime.procs import group_alive

        deadline = time.monotonic() + 30
        while group_alive(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.1)

    def wait_for(self, predicate: Callable[[], bool], timeout_s: float = 600,
                 what: str = "a condition", allowed: set[str] = frozenset()) -> None:
        """Poll ``predicate``; fail if a job (but ``allowed``) dies meanwhile."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if predicate():
                return
            for job, code in self.failed_jobs(allowed).items():
                raise LocalRunError(f"job {job} failed (exit {code}) while waiting for "
                                    f"{what}; see {self.log_file(job)}")
            time.sleep(0.3)
        raise LocalRunError(f"timed out waiting for {what}")

    def failed_jobs(self, allowed: set[str] = frozenset()) -> dict[str, int]:
        """Jobs (but ``allowed``) that ended with a non-zero code, killed ones included."""
        return {job: proc.returncode for job, proc in self.procs.items()
                if job not in allowed and proc.poll() not in (None, 0)}

    def epoch_running(self, region: str, epoch: int) -> bool:
        """The region has started ``epoch`` and not finished it (a mid-epoch moment)."""
        spec = self.pipeline.regions[region]
        from falkirk.model.times import DOMAINS, time_of

        key = DOMAINS[spec.domain].parse(time_of(spec.domain, epoch))
        row = self.log.regions(self.pipeline)[region].entries.get(key)
        return row is not None and row.status == "running"

    def stop_all(self) -> None:
        if self._house is not None:
            self._house_stop.set()
            self._house.join(timeout=120)
            self._house = None
        for job in list(self.procs):
            if self.procs[job].poll() is None:
                self.kill(job)

    # -- recovery -----------------------------------------------------------------------

    def rollback(self, failed: list[str] | None = None, region: str | None = None,
                 to_epoch: int | None = None, reason: str = "harness",
                 progress: Callable[[str], None] | None = None):
        """Roll back (stopping the jobs of affected regions), then restart stopped jobs."""
        from falkirk.recovery.rollback import RollbackExecutor, RollbackRequest

        def stop(regions: set[str]) -> None:
            for job, hosted in self.jobs.items():
                if set(hosted) & regions and job in self.procs:
                    self.kill(job)

        executor = RollbackExecutor(self.pipeline, self.cfg, self.log, stop_regions=stop)
        request = RollbackRequest(self.pipeline.name, failed=failed or [], region=region,
                                  to_epoch=to_epoch, reason=reason, dry_run=False)
        return executor.run(request, progress=progress)

    # -- input from files -----------------------------------------------------------

    def produce_files(self, folder: Path, note: Callable[[str], None] | None = None
                      ) -> dict[str, int]:
        """Send ``<folder>/<topic>.jsonl`` to each input topic, then declare the input
        bounded there (:func:`falkirk.runtime.bounds.declare_bounds`: its last epoch
        closes, jobs end).

        One record per line; the value is the line as it is, the Kafka timestamp is the
        record's ``ts`` field (event time, epoch ms). A line that is not a JSON object, or
        whose ``ts`` is missing, null or not a whole number ≥ 0, is sent too, at the
        previous line's time (the pipeline's origin for a first line): the job
        dead-letters it with its reason. ``note`` hears each such line as
        ``file:line: what``. A record with a ``key`` field is keyed (partitioned by the
        key's hash); the others go round-robin by line, so the same file always lands the
        same way. Returns the records sent per topic.
        """
        inputs = {e.topic: e.partitions for e in self.pipeline.edges.values()
                  if e.kind == "kafka" and e.src is None}
        missing = [t for t in inputs if not (folder / f"{t}.jsonl").is_file()]
        if missing:
            raise LocalRunError(f"no input file for topic(s) {', '.join(missing)}: expected "
                                f"{', '.join(str(folder / f'{t}.jsonl') for t in missing)}")
        batches = {topic: list(input_records(folder / f"{topic}.jsonl",
                                             int(self.pipeline.settings["origin_ms"]), note))
                   for topic in inputs}
        sent = send_records(self.cfg.kafka_bootstrap, inputs, batches)
        self.declare_bounds()
        return sent

    def declare_bounds(self) -> dict[str, dict[str, int]]:
        """The input is all produced: bound every input topic where it ends now."""
        from falkirk.runtime.bounds import declare_bounds

        return declare_bounds(self.pipeline, self.cfg, self.log)


def send_records(bootstrap: str, topics: dict[str, int],
                 batches: dict[str, list[tuple[bytes, int, str | None]]],
                 client_id: str = "falkirk-run") -> dict[str, int]:
    """Send each topic's ``(value, timestamp, key)`` records (as :func:`input_records`
    reads them), creating missing topics with their declared partitions first; the
    records sent per topic. A keyed record goes by its key's hash, the others round-robin
    by their place in the batch, so the same file always lands the same way; every send
    is acknowledged by the broker (acks=all) or the call fails."""
    from kafka import KafkaProducer

    from falkirk.io.kafka import CLIENT_CONFIG, ensure_topics

    ensure_topics(bootstrap, topics)
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", client_id=client_id,
                             **CLIENT_CONFIG)
    sent: dict[str, int] = {}
    try:
        for topic, partitions in topics.items():
            futures = [producer.send(topic, value=value, timestamp_ms=ts,
                                     key=None if key is None else key.encode(),
                                     partition=None if key is not None else i % partitions)
                       for i, (value, ts, key) in enumerate(batches[topic])]
            producer.flush()
            for f in futures:
                f.get(timeout=60)  # a send that failed fails the call
            sent[topic] = len(futures)
    finally:
        producer.close()
    return sent


def input_records(path: Path, origin_ms: int, note: Callable[[str], None] | None = None
                  ) -> list[tuple[bytes, int, str | None]]:
    """(value, timestamp, key) of each non-blank line of an input file, as
    :meth:`LocalRun.produce_files` sends them; ``note`` hears each line the job will
    dead-letter, by file and line number."""
    out: list[tuple[bytes, int, str | None]] = []
    ts = origin_ms
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        key, problem = None, None
        try:
            record = json.loads(line)
        except ValueError as exc:
            record, problem = None, f"not JSON ({exc.msg})"
        if record is not None and not isinstance(record, dict):
            problem = f"not a JSON object (a {type(record).__name__})"
        elif isinstance(record, dict):
            given = record.get("ts")
            if isinstance(given, int | float) and not isinstance(given, bool) \
                    and given >= 0 and given == int(given):
                ts = int(given)
            else:
                problem = ("no ts" if "ts" not in record else
                           f"ts is {json.dumps(given)}, not a whole number of epoch ms ≥ 0")
            key = None if record.get("key") is None else str(record["key"])
        if problem is not None and note is not None:
            note(f"{path}:{n}: {problem}: sent at the previous line's time; the job "
                 "dead-letters it")
        out.append((line.encode(), ts, key))
    return out
