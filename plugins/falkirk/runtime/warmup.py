"""A cold driver's first-epoch costs, paid ahead of that epoch on scratch data.

Why: a driver's first epoch is slow whatever the data. Its classes are loaded and verified
and the JIT compiles as it runs, and Delta's first commit in the JVM pays the most. In the
fault campaign's recovery profile, a restarted serve+stats's first epoch took 28 s where a
warm one takes 6 s (docs/faults.md, "Where a recovery goes under Airflow"). Two drivers pay
it ahead of time:

- a standby driver (falkirk.runtime.standby), before it takes a job;
- a job started cold whose first epoch waits for its inputs. This is the common case for a
  job a rollback moved but did not kill: it waits while an upstream region restores and
  redoes its epochs, and its JVM would otherwise sit idle through that wait.

The warm-up runs in steps: a small range of each input topic read with the Kafka connector,
then a scratch Delta table written, read back, joined and aggregated, twice. Between steps
``stop`` is asked whether the real work can start; once it can, the warm-up ends early. The
scratch table is ``_falkirk_warm_up/<pipeline>/<process group>`` under the lake. A local one
is removed afterwards, together with any left by a driver that died while warming up.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from falkirk.config import Config
from falkirk.model.topology import Pipeline

log = logging.getLogger(__name__)

SCRATCH = "_falkirk_warm_up"
_warmed = False  # this interpreter's driver warmed up (a standby's job does not again)


def warmed() -> bool:
    return _warmed


def _steps(spark: Any, pipeline: Pipeline, cfg: Config, scratch: str
           ) -> Iterator[tuple[str, Callable[[], None]]]:
    """(kind, work) in the order they run; kinds: ``kafka``, ``delta``."""
    from pyspark.sql import functions as F

    from falkirk.io.kafka import end_offsets, read_range
    from falkirk.model.times import Offsets
    from falkirk.runtime.runner import record_ddl

    def read_topic(topic: str) -> None:
        try:
            ends = end_offsets(cfg.kafka_bootstrap, topic)
        except Exception as exc:  # noqa: BLE001 - no topic yet: nothing to warm up with
            log.info("warm-up skips topic %s: %s", topic, exc)
            return
        rows = read_range(spark, cfg.kafka_bootstrap, topic, Offsets(),
                          Offsets({p: min(o, 200) for p, o in ends.items()}),
                          record_ddl(topic, pipeline.schema_roots))
        rows.groupBy("partition").count().collect()

    def delta_round(round_: int) -> None:
        df = spark.range(2000).select((F.col("id") % 50).alias("key"), F.col("id").alias(
            "value"), F.col("id").cast("string").alias("text"))
        df.write.format("delta").mode("overwrite" if round_ == 0 else "append").save(scratch)
        table = spark.read.format("delta").load(scratch)
        counts = table.groupBy("key").agg(F.count("*").alias("n"), F.sum("value").alias("s"))
        counts.join(table, "key").groupBy("key").agg(F.max("n")).collect()
        table.toPandas()

    for topic in sorted({e.topic for e in pipeline.edges.values() if e.kind == "kafka"}):
        yield "kafka", lambda topic=topic: read_topic(topic)
    for round_ in range(2):
        yield "delta", lambda round_=round_: delta_round(round_)


def _clear_dead_scratch(cfg: Config, pipeline: Pipeline) -> None:
    """Remove the local scratch tables of drivers no longer alive (killed mid-warm-up)."""
    from falkirk.runtime.procs import group_alive

    root = Path(cfg.table(SCRATCH, pipeline.name))
    for path in root.glob("*") if "://" not in str(root) else ():
        if path.name.isdigit() and not group_alive(int(path.name)):
            shutil.rmtree(path, ignore_errors=True)


def warm_up(spark: Any, pipeline: Pipeline, cfg: Config,
            stop: Callable[[], bool] = lambda: False, yielding: bool = False
            ) -> dict[str, float]:
    """Run the warm-up's steps until done or ``stop()`` is true; seconds per kind of step
    (``kafka_s``, ``delta_s``) and ``stopped_early`` (1.0 when ``stop`` ended it). A step
    that fails ends the warm-up (it is only ever an optimisation) and is logged.

    ``yielding``: this driver's process group runs the warm-up at a low priority and goes
    back to the normal one after it. On 2 cores the regions a waiting job waits for are
    the recovery's critical path: a warm-up at the normal priority took their CPU (in the
    8-minute campaign, communities' first epochs after a restart went from 17.9 s to
    23.9 s at the median, as much as serve's first epochs gained)."""
    global _warmed
    from falkirk.runtime import procs

    scratch = cfg.table(SCRATCH, pipeline.name, str(os.getpgrp()))
    spent: dict[str, float] = {"kafka_s": 0.0, "delta_s": 0.0, "stopped_early": 0.0}
    # only a job in a session of its own (procs.start_job), never an Airflow task's group
    yielding = yielding and procs.may_lower_priority() and os.getpgrp() == os.getsid(0)
    before = os.getpriority(os.PRIO_PROCESS, 0)
    if yielding:
        procs.set_group_priority(os.getpgrp(), max(before, procs.WARM_UP_NICE))
    try:
        _clear_dead_scratch(cfg, pipeline)
        for kind, work in _steps(spark, pipeline, cfg, scratch):
            if stop():
                spent["stopped_early"] = 1.0
                break
            t = time.monotonic()
            spark.sparkContext.setJobGroup("falkirk-warm-up", "warm-up on scratch data")
            work()
            spent[f"{kind}_s"] += time.monotonic() - t
        else:
            _warmed = True
    except Exception:  # noqa: BLE001 - a driver that did not warm up still works
        log.exception("warm-up failed; going on cold")
    finally:
        if yielding:
            procs.set_group_priority(os.getpgrp(), before)
        if "://" not in scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    return spent
