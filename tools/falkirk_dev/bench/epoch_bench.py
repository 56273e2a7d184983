"""The fixed cost of an epoch: the deployed reference pipeline with its input waiting.

Every job its own process (a client of the engine), the local broker, ``--events`` (default
500 an epoch) over ``--epochs`` (default 120) produced before the jobs start. Reports the
wall time per epoch of the whole pipeline (from the jobs' start to the last epoch's last
commit, and per window of 10 epochs: median and p90), and per region its seconds and Spark
stages per epoch (Spark Connect reports stages, each at least a job's worth), read from the
jobs' own log lines. Twice: with multi-epoch passes (what a deployment does when input
waits) and one epoch at a time (``FALKIRK_MAX_PASS=1``: every epoch pays its fixed costs).

Run: ``falkirk bench epoch --epochs 120 --json OUT``.
"""

from __future__ import annotations

import re
import statistics
import tempfile
import time
from argparse import Namespace
from pathlib import Path
from typing import Any

from falkirk_dev.bench import write_figures

#: A job's line per epoch or pass (falkirk.runtime.loop).
DONE = re.compile(r"epochs? (\d+)(?:-(\d+))?(?: \(\d+ in one pass\))? done by (\S+) in "
                  r"([\d.]+) s \((\d+) ")
WINDOW = 10  # epochs per window of the median and p90


def one_run(root: Path, epochs: int, events: int, max_pass: int) -> dict[str, Any]:
    from falkirk_dev.harness import LocalRun

    with LocalRun(root) as run:
        run.env = {**run.env, "FALKIRK_MAX_PASS": str(max_pass)}
        run.generate(events=events, queries=max(events // 10, 1), epochs=epochs, seed=23,
                     late=0.0)
        started = time.time()
        run.start(until_epoch=epochs - 1)
        codes = run.wait(timeout_s=7200)
        wall = time.time() - started
        if set(codes.values()) != {0}:
            raise RuntimeError(f"jobs failed: {codes}; logs under {root}")
        per_region: dict[str, dict[str, float]] = {}
        for job in run.procs:
            for _first, _last, regions, seconds, stages in DONE.findall(
                    run.log_file(job).read_text()):
                row = per_region.setdefault(regions, {"s": 0.0, "spark_jobs": 0.0})
                row["s"] += float(seconds)
                row["spark_jobs"] += int(stages)
                row["passes"] = row.get("passes", 0) + 1
        done: dict[int, float] = {}  # epoch -> when its last region committed it
        for log in run.log.regions(run.pipeline).values():
            for r in log.entries.values():
                if r.status in ("committed", "checkpointed") and r.recorded_at is not None:
                    done[r.epoch] = max(done.get(r.epoch, 0.0), r.recorded_at.timestamp())
    ends = [done[e] for e in sorted(done)]
    spans = [(ends[i + WINDOW - 1] - (ends[i - 1] if i else started)) / WINDOW
             for i in range(0, len(ends) - WINDOW + 1, WINDOW)]
    for row in per_region.values():
        row["s"] = round(row["s"] / epochs, 3)
        row["spark_jobs"] = round(row["spark_jobs"] / epochs, 2)
    return {
        "epochs": epochs, "events_per_epoch": events // epochs,
        "wall_s": round(wall, 1), "epoch_s_mean": round(wall / epochs, 3),
        "epoch_s_median": round(statistics.median(spans), 3) if spans else None,
        "epoch_s_p90": round(sorted(spans)[int(0.9 * (len(spans) - 1))], 3) if spans else None,
        "spark_jobs_per_epoch": round(sum(r["spark_jobs"] for r in per_region.values()), 2),
        "per_region": per_region,
    }


def main(args: Namespace) -> dict:
    from rich.console import Console

    console = Console()
    epochs = int(args.epochs or 120)
    events = int(args.events or 500 * epochs)
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="falkirk-epoch-") as tmp:
        with console.status(f"{epochs} epochs of {events // epochs} events, in passes…"):
            out = one_run(Path(tmp) / "passes", epochs, events, 30)
        with console.status(f"{epochs} epochs of {events // epochs} events, one by one…"):
            out["one_by_one"] = one_run(Path(tmp) / "one", epochs, events, 1)
    console.print(out)
    one = out["one_by_one"]
    console.print(
        f"{epochs} epochs of {events // epochs} events, input waiting: "
        f"{out['epoch_s_median']} s an epoch in passes (median of {WINDOW}-epoch windows; "
        f"goal ≤ 2 s), {out['spark_jobs_per_epoch']} Spark stages an epoch (goal ≤ 30); one "
        f"by one {one['epoch_s_median']} s and {one['spark_jobs_per_epoch']} stages")
    if args.json:
        path = write_figures(args.json, out)
        console.print(f"JSON: {path}")
    return out
