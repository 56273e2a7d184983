"""Runs of the reference pipeline for the tests that compare a run with faults against a
failure-free one (``golden`` in conftest): the input, the failure-free run, the run with
kills, the checks."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from contextlib import contextmanager

from falkirk.local.broker import LocalBroker
from falkirk.model.times import EpochRange, EpochRanges, Offsets
from falkirk_dev.harness import LocalRun, compare

EPOCHS = 5
INPUT = {"events": 1500, "queries": 150, "epochs": EPOCHS, "seed": 3}


@contextmanager
def held_run(root):
    """The failure-free run every other run is compared with, with ``settings.checks.hold``
    (the validator runs beside the jobs; receivers read only epochs whose checks passed:
    the outputs are those of the pipeline as declared). Its broker stays up while the
    context is open, so tests/test_checks.py can break, roll back and rerun its epochs.
    Yields the run, its outputs in ``run.golden`` and its output topics counted in
    ``run.golden_sent``."""
    import yaml

    from falkirk.model.topology import declared

    app = shutil.copytree(declared()["reference"].parent, root / "reference-held",
                          ignore=shutil.ignore_patterns("__pycache__"))
    held = app / "pipeline.yaml"
    declaration = yaml.safe_load(held.read_text())
    declaration["settings"]["checks"] = {"hold": True}
    held.write_text(yaml.safe_dump(declaration))
    with LocalBroker(root / "broker") as b, LocalRun(root, pipeline=str(held), broker=b) as run:
        run.generate(**INPUT)
        run.start(until_epoch=EPOCHS - 1)
        codes = run.wait(timeout_s=1500)
        assert set(codes.values()) == {0}, {j: str(run.log_file(j)) for j in codes}
        assert_ranges_tile_the_input(run)
        run.golden, run.golden_sent = run.outputs(), run.sent()
        yield run


def run_pipeline(root, kill=None, crash_rollback=False, crash_broker=None):
    """Run the pipeline; with ``kill=(region, epoch)`` kill that region's job mid-epoch
    and recover; with ``crash_broker=(region, epoch)`` SIGKILL the broker while that region
    is in that epoch and start it again. Each run has its own broker, lake and process
    folders. Returns (outputs, rollback plan or None, messages counted per output topic)."""
    with LocalBroker(root / "broker") as b, LocalRun(root, broker=b) as run:
        run.generate(**INPUT)
        run.start(until_epoch=EPOCHS - 1)
        plan = None
        if crash_broker is not None:
            region, epoch = crash_broker
            run.wait_for(lambda: run.epoch_running(region, epoch), timeout_s=900,
                         what=f"{region} in the middle of epoch {epoch}")
            b.restart(crash=True)
        if kill is not None:
            region, epoch = kill
            run.wait_for(lambda: run.epoch_running(region, epoch), timeout_s=900,
                         what=f"{region} in the middle of epoch {epoch}")
            restorable_before = {
                r: [row.time for row in log.restorable(run.pipeline.regions[r].regime)]
                for r, log in run.log.regions(run.pipeline).items()}
            # Nothing failed before the kill (a broker crash must not fail a job): the
            # restart after the rollback would start a failed job again and hide it.
            ended = run.failed_jobs()
            assert not ended, {j: (c, str(run.log_file(j))) for j, c in ended.items()}
            run.kill(run.pipeline.regions[region].job)
            if crash_rollback:
                crashed = subprocess.run(
                    [sys.executable, "-m", "falkirk.cli", "rollback", "--failed", region,
                     "--reason", "test: crash me", "--pipeline", "reference"],
                    env={**os.environ, **run.env, "FALKIRK_CRASH_AT":
                         "rollback:after-first-table"},
                    capture_output=True, text=True, timeout=300)
                assert crashed.returncode == -9, crashed.stderr
                assert [r["status"] for r in run.log.rollbacks("reference")] == ["started"]
            plan = run.rollback(failed=[region], reason=f"test: {region} killed")
            plan.restorable_before = restorable_before
            run.start()
        codes = run.wait(timeout_s=1200)
        assert set(codes.values()) == {0}, {j: str(run.log_file(j)) for j in codes}
        assert_ranges_tile_the_input(run)
        return run.outputs(), plan, run.sent()


def assert_ranges_tile_the_input(run):
    """The epoch log's offset ranges of the events topic: no gap, no overlap, from the
    first record to the declared bound (the topic's end)."""
    from kafka import KafkaConsumer, TopicPartition

    rows = run.log.regions(run.pipeline)["ingest"].restorable("ephemeral")
    assert [r.epoch for r in rows] == list(range(EPOCHS))
    ranges = EpochRanges([EpochRange(r.epoch, Offsets(r.inputs["events"]["from"]),
                                     Offsets(r.inputs["events"]["to"])) for r in rows])
    consumer = KafkaConsumer(bootstrap_servers=run.cfg.kafka_bootstrap)
    tps = [TopicPartition("events", p) for p in consumer.partitions_for_topic("events")]
    ends = {str(tp.partition): o for tp, o in consumer.end_offsets(tps).items()}
    consumer.close()
    assert ranges.ranges[0].start == Offsets({})
    assert ranges.ranges[-1].end == Offsets(ends)
    assert run.log.bounds("reference")["events"] == ends


def assert_same(golden, outputs):
    report = compare(golden, outputs)
    bad = {k: v for k, v in report.items() if v["lost"] or v["duplicated"]}
    assert not bad, json.dumps(bad, indent=1)
