"""Four Spark applications or one: what hosting a pipeline's regions costs on 2 cores.

The reference pipeline on the same bounded input, two ways, each from nothing (its JVMs
started inside the measured time):

- **four jobs**, as deployed (``pipeline.yaml``): ingest, popularity, communities and
  serve+stats, each its own ``spark-submit`` and driver JVM, handing tables over through
  Delta, in a sandbox (``LocalRun``);
- **four engine clients** (a profile with a Spark Connect engine, docs/engine.md): the
  same four jobs, each a client of the one engine, already running as it is in a
  deployment (its start is not timed; its JVM's memory counts);
- **one application**: the same regions hosted by one Spark session (``CompositeJob``, as
  in ``falkirk bench scale``), tables handed over in memory, commits and checkpoints as
  deployed.

Per variant: wall seconds from start to the last epoch's commit, events/s over them, and
the largest sum of its driver JVMs' resident memory. The order rotates across rounds;
figures are medians. Issue 16 asks whether fewer jobs per pipeline is faster.

Run: ``falkirk bench hosting --events 20000 --epochs 8 --rounds 2 --json OUT``.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from argparse import Namespace
from pathlib import Path

from falkirk_dev.bench import write_figures

VARIANTS = ("four jobs", "one application")
CLIENTS = "four engine clients"


def variants() -> tuple[str, ...]:
    """The hosting variants this profile can run: with an engine, its clients too."""
    from falkirk.config import load

    return (*VARIANTS, CLIENTS) if load().spark_remote else VARIANTS


def four_jobs(run, last: int, timeout_s: float, clients: bool = False) -> float:
    """The deployed jobs to ``last``; their wall seconds. A job that fails fails the run.
    Without ``clients`` each job is a driver of its own even where the profile runs an
    engine (``launcher.as_application``'s environment, as a user would set it)."""
    from unittest import mock

    from falkirk.config import load
    from falkirk.io.spark import answering
    from falkirk.runtime.engine import stop_local
    from falkirk.runtime.launcher import as_application, launcher

    cfg = load()
    was_up = clients and answering(cfg.spark_remote)
    if clients:
        launcher(cfg).ensure()  # running before, as in a deployment: its start is not the jobs'
    env = {}
    if not clients:  # the jobs' spark-submits, and the profile they load, without it
        run.cfg, env = as_application(run.cfg)
    try:
        with mock.patch.dict(os.environ, env):  # the jobs LocalRun starts read it
            run.declare_bounds()
            started = time.monotonic()
            run.start(until_epoch=last)
            codes = run.wait(timeout_s=timeout_s)
            seconds = time.monotonic() - started
    finally:
        if clients and not was_up:
            stop_local(cfg)  # its JVM would count in the other variants' memory
    if set(codes.values()) != {0}:
        raise RuntimeError(f"four jobs: exit codes {codes}; logs in {run.root / 'var'}")
    return seconds


def one_application(run, lake: Path, last: int) -> float:
    """The regions in one fresh Spark session to ``last``; its wall seconds, its JVM's
    start included."""
    from falkirk.runtime.launcher import as_application, session
    from falkirk_dev.bench.regimes_bench import run_once

    # a driver of its own even where the profile runs an engine: a Connect session would
    # measure a client of the engine (and leave the engine it started running)
    run.cfg, _ = as_application(run.cfg)
    started = time.monotonic()
    spark = session("falkirk-bench-hosting", cfg=run.cfg)
    try:
        run_once(run, spark, lake, True, last)
    finally:
        spark.stop()
    return time.monotonic() - started


def main(args: Namespace) -> dict:
    from rich.console import Console

    from falkirk_dev.bench.memory import RssSampler
    from falkirk_dev.harness import LocalRun

    console = Console()
    events, epochs = int(args.events or 20_000), int(args.epochs or 8)
    rounds = int(args.rounds or 1)
    kinds = variants()
    seconds: dict[str, list[float]] = {v: [] for v in kinds}
    rss: dict[str, list[float]] = {v: [] for v in kinds}
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="falkirk-hosting-") as tmp:
        for rnd in range(rounds):
            order = kinds[rnd % len(kinds):] + kinds[:rnd % len(kinds)]
            for variant in order:
                # a sandbox per variant: the jobs' lake and epoch log start empty each time
                with LocalRun(Path(tmp) / f"round-{rnd}-{kinds.index(variant)}") as run:
                    with console.status(f"round {rnd + 1}: producing {events:,} events…"):
                        info = run.generate(events=events, queries=max(events // 10, 1),
                                            epochs=epochs, seed=23)
                    with console.status(f"round {rnd + 1}: {variant}…"), \
                            RssSampler(every_s=1.0, jvms_only=True) as sampler:
                        if variant == "one application":
                            s = one_application(run, Path(tmp) / f"one-{rnd}", epochs - 1)
                        else:
                            s = four_jobs(run, epochs - 1, timeout_s=120 * epochs + 600,
                                          clients=variant == CLIENTS)
                    seconds[variant].append(s)
                    rss[variant].append(sampler.max_mb)
                    console.print(f"round {rnd + 1}: {variant} {s:.1f} s, JVM RSS "
                                  f"{sampler.max_mb:,.0f} MB")
    med = {v: statistics.median(seconds[v]) for v in kinds}
    out = {
        "events": info["events"], "epochs": epochs, "rounds": rounds,
        "seconds": {v: [round(s, 1) for s in seconds[v]] for v in kinds},
        "four_jobs_s": round(med["four jobs"], 1),
        "one_application_s": round(med["one application"], 1),
        "four_jobs_eps": round(info["events"] / med["four jobs"], 1),
        "one_application_eps": round(info["events"] / med["one application"], 1),
        "one_over_four_speed": round(med["four jobs"] / med["one application"], 2),
        "jvm_rss_mb_max": {v: round(max(rss[v]), 1) for v in kinds},
        "wall_s": round(time.time() - started, 1),
    }
    if CLIENTS in med:
        out["four_engine_clients_s"] = round(med[CLIENTS], 1)
        out["four_engine_clients_eps"] = round(info["events"] / med[CLIENTS], 1)
        out["clients_over_four_speed"] = round(med["four jobs"] / med[CLIENTS], 2)
    console.print(f"{out['events']:,} events over {epochs} epochs: four jobs "
                  f"{out['four_jobs_s']} s ({out['four_jobs_eps']:,.0f} events/s), one "
                  f"application {out['one_application_s']} s ({out['one_application_eps']:,.0f} "
                  f"events/s): one application {out['one_over_four_speed']}× as fast")
    if CLIENTS in med:
        console.print(f"four engine clients {out['four_engine_clients_s']} s "
                      f"({out['four_engine_clients_eps']:,.0f} events/s): "
                      f"{out['clients_over_four_speed']}× as fast as four jobs")
    if args.json:
        path = write_figures(args.json, out)
        console.print(f"JSON: {path}")
    return out
