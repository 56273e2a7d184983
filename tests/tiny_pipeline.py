"""A small pipeline with a real epoch log and delta-spark tables.

ingest (ephemeral) → t_in → agg (lazy, checkpoints every 2 epochs) → report (eager, same
job, unlogged edge) → t_out; agg also writes t_mid. ``make_world`` builds the state after
ingest did epochs 0..5 and agg/report 0..4 (the ``world`` fixture in conftest.py copies one
built per test module: delta-spark writes take a while).
"""

from __future__ import annotations

from dataclasses import replace

import pyarrow as pa

from falkirk.config import load
from falkirk.io.delta import EpochWriter
from falkirk.log.epochlog import EpochLog, EpochRecord
from falkirk.model.topology import Pipeline
from falkirk.recovery.rollback import RollbackExecutor

PIPE_DICT = {
    "pipeline": "tiny",
    "settings": {"epoch_seconds": 10, "origin_ms": 0},
    "regions": {
        "ingest": {"regime": "ephemeral", "job": "jobs/a.py"},
        "agg": {"regime": "lazy", "checkpoint_every": 2, "job": "jobs/b.py"},
        "report": {"regime": "eager", "job": "jobs/b.py"},
    },
    "edges": {
        "src": {"kind": "kafka", "to": "ingest", "topic": "src"},
        "t_in": {"kind": "delta", "from": "ingest", "to": "agg", "table": "t_in"},
        "t_mid": {"kind": "delta", "from": "agg", "table": "t_mid"},
        "link": {"kind": "unlogged", "from": "agg", "to": "report"},
        "t_out": {"kind": "delta", "from": "report", "table": "t_out"},
    },
}
PIPE = Pipeline.from_dict(PIPE_DICT)
SCHEMA = pa.schema([("epoch", pa.int64()), ("value", pa.string())])
TABLE_SCHEMA = {"fields": [{"name": "epoch", "type": "int64"}, {"name": "value", "type": "string"}]}


def build_world(root, spark) -> None:
    """Tables (written by delta-spark, as jobs write them) and log after ingest did epochs
    0..5 and agg/report 0..4, under ``root``."""
    cfg = replace(load(), lake=str(root / "lake"))
    log = EpochLog.from_config(cfg)
    writers = {(region, table): EpochWriter(spark, cfg.table(table), region, 0, SCHEMA)
               for region, table in (("ingest", "t_in"), ("agg", "t_mid"),
                                     ("report", "t_out"))}
    for w in writers.values():
        w.ensure_table()  # version 0

    def write(region: str, table: str, k: int) -> None:
        frame = spark.createDataFrame([(k, f"{'in' if table == 't_in' else table}{k}")],
                                      "epoch long, value string")
        assert writers[region, table].write_epoch(frame, k).version == k + 1

    rows = []
    for k in range(6):
        write("ingest", "t_in", k)
        rows.append(EpochRecord("tiny", "ingest", k, 0, "committed",
                                inputs={"src": {"from": {"0": k}, "to": {"0": k + 1}}},
                                outputs={"t_in": {"table": "t_in", "version": k + 1}}))
    for k in range(5):
        write("agg", "t_mid", k)
        write("report", "t_out", k)
        checkpoint = k % 2 == 1
        rows.append(EpochRecord("tiny", "agg", k, 0,
                                "checkpointed" if checkpoint else "committed",
                                outputs={"t_mid": {"table": "t_mid", "version": k + 1}},
                                state_ref=f"checkpoint:{k}" if checkpoint else None))
        rows.append(EpochRecord("tiny", "report", k, 0, "committed", state_ref=f"checkpoint:{k}",
                                outputs={"t_out": {"table": "t_out", "version": k + 1}}))
    log.record(*rows)


def make_world(tmp_path, template, spark):
    """A copy of the world built in ``template``, under ``tmp_path``, with its executor."""
    import shutil

    shutil.copytree(template / "lake", tmp_path / "lake")
    cfg = replace(load(), lake=str(tmp_path / "lake"))
    log = EpochLog.from_config(cfg)
    stopped: list[set] = []
    executor = RollbackExecutor(PIPE, cfg, log, stop_regions=stopped.append)
    return cfg, log, executor, stopped
