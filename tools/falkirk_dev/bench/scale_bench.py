"""Throughput at scale: the four regimes, all-ephemeral and a plain PySpark job, per size.

For each input size (events; a tenth as many queries; 10 s epochs; the reference
generator's proportions) the input is produced once to a sandbox broker and its bound
declared. Then, per round, in one Spark session:

- (a) the reference pipeline with its four regimes, as one Spark application
  (``CompositeJob``: epoch log, exactly-once Delta commits, checkpoints);
- (b) the same pipeline all-ephemeral (nothing persisted; outputs computed and dropped);
- (c) a plain PySpark batch job computing the same output tables from the same topics in
  one pass, with no epochs and no fault tolerance (``plain_spark.py``: the limit).

The order rotates across rounds (the first variant in a fresh JVM pays the warm-up; an
engine the bench starts warms up first, as for a pipeline's start) and figures are
medians over rounds. (a) and (b): input events over the seconds of their
epochs after the first; (c): input events over its whole run. On the smallest size the
plain job's tables are compared with the pipeline's (they must be equal). Per size the
JSON has ``events, four_regimes_eps, all_ephemeral_eps, plain_spark_eps,
overhead_ratio (a/b), vs_plain_ratio (a/c), per_region_s, driver_rss_mb_max,
epoch_s_first10, epoch_s_last10`` and, for (a) and (b), a ``profile`` of their median run
(per epoch: seconds and Spark jobs per phase and per job part, and every epoch's seconds).
Each run's frames are released before the next (``run_once``), so no variant runs beside
the blocks of another. The plot (SVG) draws events/s against events.

Run: ``falkirk bench scale --events 10000,100000,1000000 --json OUT`` (the full sizes take
about an hour on 2 cores; ``--events 2000 --rounds 1`` is a smoke run).
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from argparse import Namespace
from pathlib import Path
from typing import Any

from falkirk_dev.bench import write_figures
from falkirk_dev.bench.memory import RssSampler

VARIANTS = ("four regimes", "all-ephemeral", "plain spark")
KEYS = {"four regimes": "four_regimes_eps", "all-ephemeral": "all_ephemeral_eps",
        "plain spark": "plain_spark_eps"}


def _mean(xs: list[float]) -> float:
    return statistics.fmean(xs) if xs else 0.0


def compare_with_plain(run, four_lake: Path, plain_lake: Path) -> dict[str, bool]:
    """Per output table (and the responses topic as clients read it): does the plain job
    give exactly the pipeline's rows?"""
    from deltalake import DeltaTable

    from falkirk.io.lake import read_table
    from falkirk_dev.bench import plain_spark

    out: dict[str, bool] = {}
    for edge in run.pipeline.edges.values():
        if edge.kind != "delta" or edge.table in out:
            continue
        uri = str(four_lake / edge.table)
        mine = (sorted(read_table(uri).to_pylist(), key=lambda r: json.dumps(
            r, sort_keys=True, default=str)) if DeltaTable.is_deltatable(uri) else [])
        out[edge.table] = mine == plain_spark.as_rows(str(plain_lake), edge.table)
    topic = {k: json.loads(v) for k, v in run.latest_by_key("responses").items()}
    out["topic:responses"] = topic == plain_spark.responses_by_key(str(plain_lake))
    return out


def per_region(runner) -> dict[str, float]:
    """Seconds per job part over the run: its transforms (``CompositeJob.seconds``) and
    its regions' writes, sends and checkpoints (the runner's profile). An epoch's commits
    run side by side, so the parts' seconds add up to more than the run's."""
    out = {}
    for key, seconds in runner.logic.seconds.items():
        regions = key.split(":", 1)[1].split("+")
        spent = sum(v for k, v in runner.profile.items()
                    if " " in k and k.split(" ", 1)[1] in regions)
        out["+".join(regions)] = round(seconds + spent, 2)
    return out


def _profile(runner) -> dict[str, Any]:
    """Per epoch: the runner's phases and its parts' transforms, in seconds and Spark jobs;
    and every epoch's seconds."""
    n = len(runner.timings)
    return {
        "phases_s_per_epoch": {k: round(v / n, 2) for k, v in sorted(
            {**runner.profile, **runner.logic.seconds}.items())},
        "spark_jobs_per_epoch": {k: round(v / n, 1) for k, v in sorted(
            {**runner.spark_jobs, **runner.logic.spark_jobs}.items())},
        "epoch_s": [round(t[1], 2) for t in runner.timings],
    }


def measure_size(events: int, args: Namespace, spark, tmp: Path, console) -> dict[str, Any]:
    """Every figure of one input size."""
    from falkirk.io.spark import generated_code
    from falkirk_dev.bench import plain_spark
    from falkirk_dev.bench.regimes_bench import run_once, throughput
    from falkirk_dev.harness import LocalRun

    epochs = args.epochs or 20
    last = epochs - 1
    root = tmp / f"size-{events}"
    with LocalRun(root / "sandbox") as run:
        with console.status(f"{events:,} events: producing the input…"):
            summary = run.generate(events=events, queries=max(events // 10, 1), epochs=epochs,
                                   seed=11)
        rates: dict[str, list[float]] = {v: [] for v in VARIANTS}
        runs: dict[str, list[Any]] = {"four regimes": [], "all-ephemeral": []}  # profiles
        rss = 0.0
        checked: dict[str, bool] | None = None
        for rnd in range(args.rounds):
            order = VARIANTS[rnd % 3:] + VARIANTS[:rnd % 3]
            for variant in order:
                lake = root / f"{variant.replace(' ', '-')}-{rnd}"
                with console.status(f"{events:,} events, round {rnd + 1}: {variant}…"), \
                        RssSampler() as sampler:
                    started = time.monotonic()
                    if variant == "plain spark":
                        # with generated code, as a plain job has it (the pipeline's passes
                        # turn it on too: Config.codegen_records)
                        with generated_code(spark):
                            facts = plain_spark.run(spark, run.cfg.kafka_bootstrap,
                                                    run.pipeline, str(lake), last)
                        rates[variant].append(summary["events"] / (time.monotonic() - started))
                    else:
                        runner = run_once(run, spark, lake, variant == "four regimes", last)
                        rates[variant].append(throughput(runner.timings))
                        runs[variant].append(runner)
                if variant == "four regimes":
                    rss = max(rss, sampler.max_mb)
            if rnd == 0 and args.check:
                with console.status("comparing the plain job's tables with the pipeline's…"):
                    checked = compare_with_plain(run, root / "four-regimes-0",
                                                 root / "plain-spark-0")
    figures: dict[str, Any] = {"events": summary["events"], "epochs": epochs}
    for variant in VARIANTS:
        figures[KEYS[variant]] = statistics.median(rates[variant])
    four = figures["four_regimes_eps"]
    figures["overhead_ratio"] = four / figures["all_ephemeral_eps"]
    figures["vs_plain_ratio"] = four / figures["plain_spark_eps"]
    median_run = {v: sorted(rs, key=lambda r: throughput(r.timings))[len(rs) // 2]
                  for v, rs in runs.items()}
    four_run = median_run["four regimes"]
    seconds = [t[1] for t in four_run.timings]
    figures.update(
        per_region_s=per_region(four_run),
        driver_rss_mb_max=round(rss, 1),
        epoch_s_first10=round(_mean(seconds[:10]), 3),
        epoch_s_last10=round(_mean(seconds[-10:]), 3),
        rates=rates, component_rounds=facts.get("component_rounds"),
        # where each variant's epochs go (its median run): seconds and Spark jobs per
        # epoch, per phase and per job part's transform
        profile={v: _profile(r) for v, r in median_run.items()})
    if checked is not None:
        figures["plain_equals_pipeline"] = checked
    return figures


def scale_svg(sizes: list[dict], title: str) -> str:
    """Events/s against events (log scale), one line per variant."""
    from falkirk_dev.plot import lines_svg

    return lines_svg(title, "events of input (log scale)", "events/s",
                     {v: [(s["events"], s[KEYS[v]]) for s in sizes] for v in VARIANTS},
                     log_x=True, x_ticks=[s["events"] for s in sizes])


def main(args: Namespace) -> dict:
    from rich.console import Console
    from rich.table import Table

    from falkirk.runtime.launcher import launcher, session

    console = Console()
    sizes = [int(x) for x in str(args.events or "10000,100000,1000000").split(",")]
    args.check = not getattr(args, "no_check", False)
    results: list[dict] = []
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="falkirk-scale-") as tmp:
        launcher().ensure(warm=True)  # an engine started here warms up, as for a pipeline
        spark = session("falkirk-bench-scale")
        try:
            for n, events in enumerate(sorted(sizes)):
                args.check = args.check and n == 0  # the smallest size only
                results.append(measure_size(events, args, spark, Path(tmp), console))
                console.print(f"{events:,} events: {json.dumps(results[-1], default=str)}")
        finally:
            spark.stop()
    table = Table(title=f"throughput by input size ({args.rounds} round(s), medians)",
                  title_justify="left")
    for col in ("events", "four regimes", "all-ephemeral", "plain spark", "4r / eph",
                "4r / plain", "epoch s first 10 → last 10", "driver RSS"):
        table.add_column(col, justify="right")
    for s in results:
        table.add_row(f"{s['events']:,}", f"{s['four_regimes_eps']:,.0f}/s",
                      f"{s['all_ephemeral_eps']:,.0f}/s", f"{s['plain_spark_eps']:,.0f}/s",
                      f"{s['overhead_ratio']:.2f}×", f"{s['vs_plain_ratio']:.2f}×",
                      f"{s['epoch_s_first10']:.2f} → {s['epoch_s_last10']:.2f}",
                      f"{s['driver_rss_mb_max']:,.0f} MB")
    console.print(table)
    for s in results:
        console.print(f"{s['events']:,} events, four regimes, seconds per region: "
                      f"{s['per_region_s']}")
        for variant, prof in s["profile"].items():
            console.print(f"  {variant}, per epoch: seconds {prof['phases_s_per_epoch']}; "
                          f"Spark jobs {prof['spark_jobs_per_epoch']}")
        if "plain_equals_pipeline" in s:
            console.print(f"plain job's tables equal the pipeline's: {s['plain_equals_pipeline']}")
    out = {"started": started, "seconds": time.time() - started, "rounds": args.rounds,
           "sizes": results}
    if args.json:
        path = write_figures(args.json, out)
        svg = path.with_suffix(".svg")
        svg.write_text(scale_svg(results, "falkirk: events/s by input size (reference "
                                          "pipeline, 2 cores)"))
        console.print(f"JSON: {path}; plot: {svg}")
    return out
