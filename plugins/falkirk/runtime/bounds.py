"""Bounded runs: a pipeline's input declared to end where its topics end now.

A continuous run never ends. A bounded run (a backfill, a file replayed, a test) ends
after the epoch that holds the last record of every input: someone who knows the input is
all produced declares its end offsets in the epoch log (``bounds`` table), and every job
reads them there, whoever started it (``falkirk run``, the streams DAG, a test harness).
The records carry nothing special: the bound is where the input ends, not a record in it.
"""

from __future__ import annotations

from falkirk.config import Config, load
from falkirk.io.kafka import end_offsets
from falkirk.log.epochlog import EpochLog
from falkirk.model.topology import Pipeline


def input_topics(pipeline: Pipeline) -> list[str]:
    """The topics the pipeline reads from outside (its Kafka inputs)."""
    return sorted({e.topic for e in pipeline.edges.values()
                   if e.kind == "kafka" and e.src is None and e.dst is not None})


def declare_bounds(pipeline: Pipeline, cfg: Config | None = None, log: EpochLog | None = None,
                   topics: list[str] | None = None) -> dict[str, dict[str, int]]:
    """Bound each input topic (default: all of them) at its current end offsets; returns
    them. Declare once every record is produced (acknowledged by the broker)."""
    cfg = cfg or load()
    log = log or EpochLog.from_config(cfg)
    known = input_topics(pipeline)
    unknown = sorted(set(topics or ()) - set(known))
    if unknown:
        raise ValueError(f"pipeline {pipeline.name!r} reads no topic {', '.join(unknown)} "
                         f"(its inputs: {', '.join(known) or 'none'})")
    out = {}
    for topic in topics or known:
        out[topic] = end_offsets(cfg.kafka_bootstrap, topic)
        log.record_bound(pipeline.name, topic, out[topic])
    return out
