"""What the regimes cost: throughput with the four regimes next to all-ephemeral, and latency.

The whole reference pipeline runs as one Spark application (``CompositeJob``) on the same
input, twice in one run: once with nothing persisted (every region ephemeral: no epoch
log, no Delta commits, no checkpoints; outputs are computed and dropped) and once with the
four regimes (epoch log, exactly-once Delta commits, incremental checkpoints). Throughput
is input records per second over the steady-state epochs (the first epoch pays Spark's
warm-up). Goal: four regimes ≥ 0.87× all-ephemeral.

Latency: a third run with the four regimes while the input arrives in real time (event
time and wall time advance together); for every event, from the moment it was produced
to the commit of its epoch's ``query_stats`` by the eager region: median and p95.

Run: ``falkirk bench regimes`` (a few minutes on 2 cores).
"""

from __future__ import annotations

import gc
import heapq
import statistics
import tempfile
import threading
import time
from argparse import Namespace
from dataclasses import replace
from pathlib import Path

JOBS = ("jobs/ingest.py", "jobs/popularity.py", "jobs/communities.py", "jobs/serve.py")


def run_once(run, spark, lake: Path, persist: bool, until_epoch: int, bounded: bool = True):
    """The composite pipeline over the sandbox's topics, into its own lake (and epoch log:
    with ``bounded``, the input is all produced and its bound is declared there first);
    the runner, done (its ``timings`` and ``profile``)."""
    from falkirk.log.epochlog import EpochLog
    from falkirk.runtime.bounds import declare_bounds
    from falkirk.runtime.job import CompositeJob, job_logic
    from falkirk.runtime.loop import JobRunner

    cfg = replace(run.cfg, lake=str(lake))
    if bounded:
        declare_bounds(run.pipeline, cfg)
    logic = CompositeJob(run.pipeline, [job_logic(run.pipeline.job_path(j)) for j in JOBS])
    runner = JobRunner(run.pipeline, logic, spark, cfg, EpochLog.from_config(cfg),
                       persist=persist)
    try:
        runner.run(until_epoch=until_epoch, poll_s=0.05)
    finally:
        runner.close()
        # The closed runner let go of its frames: collect them in Python, then in the JVM,
        # whose cleaner then drops their checkpointed blocks. The next variant run in this
        # session would otherwise share the driver's heap with this one's (issue 16).
        gc.collect()
        from falkirk.io.spark import is_remote

        if not is_remote(spark):  # (an engine's collector runs for every session on it)
            spark.sparkContext._jvm.System.gc()
    return runner


def throughput(timings, topic_edge: str = "events") -> float:
    steady = timings[1:]
    records = sum(t[3].get(topic_edge, 0) for t in steady)
    seconds = sum(t[1] for t in steady)
    return records / seconds if seconds else 0.0


def main(args: Namespace) -> dict:
    from rich.console import Console
    from rich.table import Table

    from falkirk.runtime.bounds import declare_bounds
    from falkirk.runtime.launcher import session
    from falkirk_dev import generate
    from falkirk_dev.harness import LocalRun

    console = Console()
    epochs = args.epochs or 9
    figures: dict = {}
    with tempfile.TemporaryDirectory(prefix="falkirk-regimes-") as tmp, \
            LocalRun(Path(tmp) / "burst") as run:
        with console.status("producing the input (one burst)…"):
            events = args.events or 20_000
            summary = run.generate(events=events, queries=events // 10, epochs=epochs, seed=11)
        spark = session("falkirk-bench-regimes")
        rates: dict[str, list[float]] = {"all-ephemeral": [], "four regimes": []}
        for rnd in range(args.rounds):
            for name, persist in (("all-ephemeral", False), ("four regimes", True)):
                with console.status(f"round {rnd + 1}: {name}…"):
                    timings = run_once(run, spark, Path(tmp) / f"{name}-{rnd}", persist,
                                       epochs - 1).timings
                rates[name].append(throughput(timings))
        eph = statistics.median(rates["all-ephemeral"])
        reg = statistics.median(rates["four regimes"])
        figures.update(events=summary["events"], epochs=epochs,
                       ephemeral_events_per_s=eph, regimes_events_per_s=reg,
                       ratio=reg / eph if eph else 0.0)

        # Latency: the same pipeline while the input arrives in real time.
        with LocalRun(Path(tmp) / "live", broker=None) as live:
            s = live.pipeline.settings
            epoch_s = float(s.get("epoch_seconds", 10))
            g = generate.generate_detailed(
                seed=13, events=args.latency_events, queries=args.latency_events // 10,
                users=500, items=200, categories=8, origin_ms=int(s["origin_ms"]),
                epoch_ms=int(epoch_s * 1000), epochs=args.latency_epochs,
                malformed_fraction=0.01)
            generate.ensure_topics(live.cfg.kafka_bootstrap,
                                   {"events": generate.EVENT_PARTITIONS,
                                    "queries": generate.QUERY_PARTITIONS})
            total = len(g.events) + len(g.queries)
            rate = total / (args.latency_epochs * epoch_s)  # event time = wall time
            started = {}

            def feed():
                started["t"] = time.time()
                generate.produce(live.cfg.kafka_bootstrap, "events", "queries", g.events,
                                 g.queries, rate=rate)
                declare_bounds(live.pipeline, replace(live.cfg, lake=str(live_lake)))

            live_lake = Path(tmp) / "live-lake"
            producer = threading.Thread(target=feed, daemon=True)
            with console.status(f"latency: {args.latency_epochs} epochs of "
                                f"{epoch_s:.0f} s in real time ({rate:.0f} records/s)…"):
                producer.start()
                timings = run_once(live, spark, live_lake, True, args.latency_epochs - 1,
                                   bounded=False).timings  # the feed declares the bound
                producer.join()
        spark.stop()
        finished = {t[0]: t[2] for t in timings}
        # Production order is the merge by timestamp that produce() sends in.
        merged = heapq.merge(((ts, 0, i) for i, (_, _, ts) in enumerate(g.events)),
                             ((ts, 1, i) for i, (_, _, ts) in enumerate(g.queries)))
        order = {i: n for n, (_, stream, i) in enumerate(merged) if stream == 0}
        epochs_of = generate.processing_epochs(g.events, int(s["origin_ms"]),
                                               int(epoch_s * 1000))
        lat = [finished[e] - (started["t"] + order[i] / rate)
               for i, (_, _, e) in enumerate(epochs_of) if e in finished]
        lat.sort()
        figures.update(latency_events=len(lat), latency_median_s=statistics.median(lat),
                       latency_p95_s=lat[int(0.95 * (len(lat) - 1))], epoch_seconds=epoch_s)

    table = Table(title=f"reference pipeline as one Spark application: {figures['events']} "
                        f"events over {epochs} epochs, median of {args.rounds} round(s)",
                  title_justify="left")
    table.add_column("figure")
    table.add_column("value", justify="right")
    table.add_column("goal", justify="right")
    table.add_row("all-ephemeral, nothing persisted", f"{eph:,.0f} events/s", "")
    table.add_row("four regimes (log, Delta, checkpoints)", f"{reg:,.0f} events/s", "")
    table.add_row("four regimes / all-ephemeral", f"{figures['ratio']:.2f}×", "≥ 0.87×")
    table.add_row(f"latency event → its epoch's query_stats commit, median "
                  f"({figures['epoch_seconds']:.0f} s epochs, real time)",
                  f"{figures['latency_median_s']:.1f} s", "")
    table.add_row("latency, p95", f"{figures['latency_p95_s']:.1f} s", "")
    console.print(table)
    console.print(f"rates per round: {rates}")
    return figures
