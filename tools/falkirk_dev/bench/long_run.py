"""A long run: does the cost of an epoch stay flat as state grows?

The reference pipeline with its four regimes, as one Spark application (``CompositeJob``,
as in ``falkirk bench scale``), over many epochs of steady input (the same number of
events in every epoch; the communities graph and the stats state grow all along). It
reports each epoch's seconds and Spark jobs, the mean of the last 10 epochs over the first
10 (goal ≤ 1.3×: the communities region relabels only the workset of each epoch, not the
whole graph), and the driver's memory (this Python process and its JVM) at the end of
every epoch (goal: flat). The first epoch pays the JVM's warm-up and is left out of the
first 10.

Run: ``falkirk bench long --epochs 50 --events 25000 --json OUT`` (OUT.svg beside it);
about 30 s per epoch on 2 cores.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from argparse import Namespace
from pathlib import Path
from typing import Any

from falkirk_dev.bench import write_figures


def summary(timings: list[tuple], rss: list[tuple[float, float]],
            jobs: list[int]) -> dict[str, Any]:
    """The figures of a run from its per-epoch timings ``(epoch, seconds, finished at,
    counts)``, memory samples ``(time, MB)`` and Spark jobs per epoch."""
    seconds = [t[1] for t in timings]
    steady = seconds[1:]  # epoch 0 pays the warm-up
    first, last = steady[:10], steady[-10:]
    mean = statistics.fmean
    rss_at_end, i = [], 0  # the largest sample up to each epoch's end
    peak = 0.0
    for t in timings:
        while i < len(rss) and rss[i][0] <= t[2]:
            peak = max(peak, rss[i][1])
            i += 1
        rss_at_end.append(round(peak, 1))
    ratio = mean(last) / mean(first) if first and last else None
    grown = rss_at_end[-1] - rss_at_end[len(rss_at_end) // 2] if rss_at_end else 0.0
    return {
        "epochs": len(seconds),
        "epoch_s": [round(s, 2) for s in seconds],
        "spark_jobs_per_epoch": jobs,
        "epoch_s_first10": round(mean(first), 3) if first else None,
        "epoch_s_last10": round(mean(last), 3) if last else None,
        "last10_over_first10": round(ratio, 3) if ratio is not None else None,
        "driver_rss_mb_at_epoch_end": rss_at_end,
        "driver_rss_mb_second_half_growth": round(grown, 1),
    }


def main(args: Namespace) -> dict:
    from rich.console import Console

    from falkirk.runtime.launcher import session
    from falkirk_dev.bench.memory import RssSampler
    from falkirk_dev.bench.regimes_bench import run_once
    from falkirk_dev.harness import LocalRun
    from falkirk_dev.plot import lines_svg, stack_svg

    console = Console()
    epochs = args.epochs or 50
    events = int(args.events or 25_000)
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="falkirk-long-") as tmp, \
            LocalRun(Path(tmp) / "sandbox") as run:
        with console.status(f"producing {events:,} events over {epochs} epochs…"):
            info = run.generate(events=events, queries=max(events // 10, 1), epochs=epochs,
                                seed=17, late=0.0)
        spark = session("falkirk-bench-long")
        try:
            with console.status(f"four regimes, {epochs} epochs…"), \
                    RssSampler(every_s=1.0, keep=True) as sampler:
                runner = run_once(run, spark, Path(tmp) / "lake", True, epochs - 1)
        finally:
            spark.stop()
    out = summary(runner.timings, sampler.samples, runner.epoch_jobs)
    out.update(events=info["events"], events_per_epoch=round(info["events"] / epochs),
               seconds=round(time.time() - started, 1))
    console.print(f"{epochs} epochs of ~{out['events_per_epoch']:,} events: mean epoch "
                  f"{out['epoch_s_first10']:.2f} s (epochs 1–10) → {out['epoch_s_last10']:.2f} s "
                  f"(last 10): {out['last10_over_first10']:.2f}× (goal ≤ 1.3×); driver RSS "
                  f"{out['driver_rss_mb_at_epoch_end'][0]:,.0f} → "
                  f"{out['driver_rss_mb_at_epoch_end'][-1]:,.0f} MB")
    if args.json:
        path = write_figures(args.json, out)
        n = range(out["epochs"])
        svg = stack_svg([
            lines_svg(f"falkirk long run: {epochs} epochs, four regimes", "epoch",
                      "seconds per epoch", {"epoch seconds": list(zip(n, out["epoch_s"],
                                                                      strict=True))}),
            lines_svg("driver memory (Python + its JVM) at the end of each epoch", "epoch",
                      "MB", {"driver RSS": list(zip(n, out["driver_rss_mb_at_epoch_end"],
                                                    strict=True))})])
        path.with_suffix(".svg").write_text(svg)
        console.print(f"JSON: {path}; plot: {path.with_suffix('.svg')}")
    return out
