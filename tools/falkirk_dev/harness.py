"""A local sandbox that runs a whole pipeline: its own broker, lake and process folders.

Used by the integration tests, the fault-injection trials, the benchmarks and the demo,
so they all run the pipeline the same way: generate input, start every job as its own
process (spark-submit), kill one with SIGKILL in the middle of an epoch, roll back, restart,
and read every output back for comparison with a failure-free run.
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


class HarnessError(FalkirkError):
    pass


class LocalRun:
    """One sandboxed run of a pipeline under ``root``."""

    def __init__(self, root: Path, pipeline: str = "reference", broker=None):
        self.root = Path(root)
        self.pipeline: Pipeline = load_pipeline(pipeline)
        self._own_broker = broker is None
        self.broker = broker
        self.procs: dict[str, subprocess.Popen] = {}
        self.until_epoch: int | None = None

    # -- lifecycle ----------------------------------------------------------------------

    def __enter__(self) -> LocalRun:
        from falkirk.local.broker import LocalBroker

        self.root.mkdir(parents=True, exist_ok=True)
        if self.broker is None:
            self.broker = LocalBroker(self.root / "broker")
            self.broker.start()
        self.cfg: Config = replace(load(), lake=str(self.root / "lake"),
                                   var_dir=str(self.root / "var"),
                                   kafka_bootstrap=self.broker.bootstrap)
        self.env = {"FALKIRK_LAKE": self.cfg.lake, "FALKIRK_VAR_DIR": self.cfg.var_dir,
                    "FALKIRK_KAFKA_BOOTSTRAP": self.cfg.kafka_bootstrap}
        self.log = EpochLog.from_config(self.cfg)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop_all()
        if self._own_broker and self.broker is not None:
            self.broker.stop()

    # -- input --------------------------------------------------------------------------

    def generate(self, **options: Any) -> dict:
        """Produce seeded input to the pipeline's topics (see ``falkirk generate``)."""
        import contextlib
        import io

        from falkirk_dev import generate
        args = generate_args(self.pipeline, bootstrap=self.cfg.kafka_bootstrap, **options)
        with contextlib.redirect_stdout(io.StringIO()) as out:
            generate.cli(args)
        return json.loads(out.getvalue())

    # -- jobs ---------------------------------------------------------------------------

    @property
    def jobs(self) -> dict[str, list[str]]:
        from falkirk.runtime.procs import jobs_of

        return jobs_of(self.pipeline)

    def start(self, jobs: list[str] | None = None, until_epoch: int | None = None) -> None:
        """Start jobs (default: all) that are not running, each in its own process group."""
        from falkirk.runtime.procs import start_job

        if until_epoch is not None:
            self.until_epoch = until_epoch
        held = bool(self.pipeline.checks_setting("hold"))
        # Readers of a held pipeline also wait for the validator: give them longer.
        args = ["--idle-timeout", "1200" if held else "300"]
        if self.until_epoch is not None:
            args += ["--until-epoch", str(self.until_epoch)]
        for job in jobs or list(self.jobs):
            proc = self.procs.get(job)
            if proc is not None and proc.poll() is None:
                continue
            self.procs[job] = start_job(self.pipeline, job, args, self.cfg, self.env)
        if held and jobs is None:
            self._start_checks()

    def _start_checks(self) -> None:
        """Epochs are held until checked: run the validator beside the jobs (it ends once
        every checked region passed ``until_epoch``)."""
        if self.until_epoch is None:
            raise HarnessError("settings.checks.hold needs an until_epoch: the validator "
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
                raise HarnessError(f"job {job} still running after {timeout_s:.0f} s; "
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
                 what: str = "a condition") -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if predicate():
                return
            for job, proc in self.procs.items():
                if proc.poll() not in (None, 0):
                    raise HarnessError(f"job {job} failed (exit {proc.returncode}) while "
                                       f"waiting for {what}; see {self.log_file(job)}")
            time.sleep(0.3)
        raise HarnessError(f"timed out waiting for {what}")

    def epoch_running(self, region: str, epoch: int) -> bool:
        """The region has started ``epoch`` and not finished it (a mid-epoch moment)."""
        spec = self.pipeline.regions[region]
        from falkirk.model.times import DOMAINS
        from falkirk.runtime.runner import time_of

        key = DOMAINS[spec.domain].parse(time_of(spec.domain, epoch))
        row = self.log.regions(self.pipeline)[region].entries.get(key)
        return row is not None and row.status == "running"

    def stop_all(self) -> None:
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

    # -- outputs ------------------------------------------------------------------------

    def tables(self) -> dict[str, list[dict]]:
        """Every Delta output table of the pipeline, rows sorted (for exact comparison)."""
        from deltalake import DeltaTable

        from falkirk.io.lake import read_table

        out = {}
        for edge in self.pipeline.edges.values():
            if edge.kind != "delta" or edge.table in out:
                continue
            uri = self.cfg.table(edge.table)
            if not DeltaTable.is_deltatable(uri):
                out[edge.table] = []
                continue
            rows = read_table(uri).to_pylist()
            out[edge.table] = sorted(rows, key=lambda r: json.dumps(r, sort_keys=True,
                                                                    default=str))
        return out

    def messages(self, topic: str) -> list[tuple[str, str, int | None]]:
        """Every message on a topic, in partition order: (key, value, generation header)."""
        from kafka import KafkaConsumer, TopicPartition

        from falkirk.io.kafka import GENERATION_HEADER

        consumer = KafkaConsumer(bootstrap_servers=self.cfg.kafka_bootstrap, group_id=None,
                                 enable_auto_commit=False, consumer_timeout_ms=2000)
        out: list[tuple[str, str, int | None]] = []
        try:
            parts = consumer.partitions_for_topic(topic) or set()
            tps = [TopicPartition(topic, p) for p in sorted(parts)]
            if not tps:
                return out
            consumer.assign(tps)
            consumer.seek_to_beginning(*tps)
            ends = consumer.end_offsets(tps)
            while any(consumer.position(tp) < ends[tp] for tp in tps):
                for records in consumer.poll(timeout_ms=1000).values():
                    for r in records:
                        gen = dict(r.headers or []).get(GENERATION_HEADER)
                        out.append((r.key.decode(), r.value.decode(),
                                    None if gen is None else int(gen)))
            return out
        finally:
            consumer.close()

    def latest_by_key(self, topic: str) -> dict[str, str]:
        """A topic read as clients read it: the latest value per key."""
        return {key: value for key, value, _ in self.messages(topic)}

    def sent(self) -> dict[str, dict[str, Any]]:
        """Per output topic, every message counted: what a consumer that does not keep
        the latest per key sees (see :func:`count_sent`)."""
        return {edge.topic: count_sent(self.messages(edge.topic))
                for edge in self.pipeline.edges.values()
                if edge.kind == "kafka" and edge.src is not None}

    def outputs(self) -> dict[str, Any]:
        """What a failure-free run and a run with rollbacks must agree on."""
        out: dict[str, Any] = dict(self.tables())
        for edge in self.pipeline.edges.values():
            if edge.kind == "kafka" and edge.src is not None:
                out[f"topic:{edge.topic}"] = self.latest_by_key(edge.topic)
        return out


def count_sent(messages: list[tuple[str, str, int | None]]) -> dict[str, Any]:
    """Messages, keys, and the re-sends among them (a key's messages after its first).

    ``resent_by_generation``: re-sends per generation header; a rollback's redone epochs
    re-send with the new generation. ``resent_same_generation``: re-sends carrying the
    generation of an earlier message of the key (a job restarted without a rollback);
    ``changed``: re-sends whose value differs from the key's previous one.
    """
    seen: dict[str, tuple[str, set[int | None]]] = {}
    by_gen: dict[str, int] = {}
    same = changed = 0
    for key, value, gen in messages:
        if key in seen:
            last, gens = seen[key]
            by_gen[str(gen)] = by_gen.get(str(gen), 0) + 1
            same += gen in gens
            changed += value != last
            gens.add(gen)
            seen[key] = (value, gens)
        else:
            seen[key] = (value, {gen})
    return {"messages": len(messages), "keys": len(seen), "resent": len(messages) - len(seen),
            "resent_by_generation": dict(sorted(by_gen.items())),
            "resent_same_generation": same, "changed": changed}


def generate_args(pipeline: Pipeline, **options: Any):
    """``falkirk generate``'s arguments for a pipeline (its origin and epoch length)."""
    import argparse

    s = pipeline.settings
    return argparse.Namespace(**{"origin": s.get("origin_ms"),
                                 "epoch_seconds": s.get("epoch_seconds", 10), **options})


def compare(golden: dict[str, Any], other: dict[str, Any]) -> dict[str, dict[str, int]]:
    """Per output: rows missing from ``other`` and rows it has in excess (0, 0 = equal)."""
    from collections import Counter

    report = {}
    for name in sorted(set(golden) | set(other)):
        a, b = golden.get(name, []), other.get(name, [])
        if isinstance(a, dict):
            a = [json.dumps([k, v]) for k, v in a.items()]
            b = [json.dumps([k, v]) for k, v in b.items()]
        else:
            a = [json.dumps(r, sort_keys=True, default=str) for r in a]
            b = [json.dumps(r, sort_keys=True, default=str) for r in b]
        ca, cb = Counter(a), Counter(b)
        report[name] = {"rows": len(a), "lost": sum((ca - cb).values()),
                        "duplicated": sum((cb - ca).values())}
    return report
