"""A small pipeline with a real epoch log and delta-rs tables, for tests without Spark.

ingest (ephemeral) → t_in → agg (lazy, checkpoints every 2 epochs) → report (eager, same
job, unlogged edge) → t_out; agg also writes t_mid. ``make_world`` builds the state after
ingest did epochs 0..5 and agg/report 0..4 (the ``world`` fixture in conftest.py).
"""

from __future__ import annotations

from dataclasses import replace

import pyarrow as pa
from deltalake import write_deltalake

from falkirk.config import load
from falkirk.epochlog import EpochLog, EpochRecord
from falkirk.rollback import RollbackExecutor
from falkirk.topology import Pipeline

PIPE_DICT = {
    "pipeline": "tiny",
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


def make_world(tmp_path):
    """Tables and log after ingest did epochs 0..5 and agg/report 0..4."""
    cfg = replace(load(), lake=str(tmp_path / "lake"))
    log = EpochLog.from_config(cfg)
    for table in ("t_in", "t_mid", "t_out"):
        write_deltalake(cfg.table(table), SCHEMA.empty_table(), mode="error")  # version 0
    rows = []
    for k in range(6):
        write_deltalake(cfg.table("t_in"), pa.table({"epoch": [k], "value": [f"in{k}"]},
                                                    schema=SCHEMA), mode="append")
        rows.append(EpochRecord("tiny", "ingest", k, 0, "committed",
                                inputs={"src": {"from": {"0": k}, "to": {"0": k + 1}}},
                                outputs={"t_in": {"table": "t_in", "version": k + 1}}))
    for k in range(5):
        for table in ("t_mid", "t_out"):
            write_deltalake(cfg.table(table), pa.table({"epoch": [k], "value": [f"{table}{k}"]},
                                                       schema=SCHEMA), mode="append")
        checkpoint = k % 2 == 1
        rows.append(EpochRecord("tiny", "agg", k, 0,
                                "checkpointed" if checkpoint else "committed",
                                outputs={"t_mid": {"table": "t_mid", "version": k + 1}},
                                state_ref=f"checkpoint:{k}" if checkpoint else None))
        rows.append(EpochRecord("tiny", "report", k, 0, "committed", state_ref=f"checkpoint:{k}",
                                outputs={"t_out": {"table": "t_out", "version": k + 1}}))
    log.record(*rows)
    stopped: list[set] = []
    executor = RollbackExecutor(PIPE, cfg, log, stop_regions=stopped.append,
                                lock_dir=tmp_path / "locks")
    return cfg, log, executor, stopped
