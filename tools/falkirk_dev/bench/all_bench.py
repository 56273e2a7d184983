"""Every performance figure of the project in one run, each next to its goal, as JSON too.

Runs the benchmarks one after another in this process (so they never compete with each
other for the two cores): regime overhead (four regimes vs all-ephemeral), re-executed
work after a lazy-region failure vs a global rollback, incremental vs full checkpoint
bytes at 1% churn, the solver at 10k regions, the Kafka source vs a raw consumer, and the
exactly-once writer vs plain Parquet. The JSON (default ``var/bench/<commit>.json``) keeps
the commit, the machine and every figure, for comparison across commits.

Run: ``falkirk bench all [--quick] [--out FILE]`` (--quick: smaller inputs, for a smoke
run; the figures are then not the ones to quote).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from argparse import Namespace
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from falkirk.config import REPO_ROOT, load


@dataclass(frozen=True)
class Figure:
    """One figure: where it comes from, how it compares with its goal."""

    name: str
    bench: str
    key: str
    goal: float
    higher_is_better: bool
    unit: str

    def met(self, value: float) -> bool:
        return value >= self.goal if self.higher_is_better else value <= self.goal


FIGURES = [
    Figure("regime overhead: four regimes / all-ephemeral throughput", "regimes", "ratio",
           0.87, True, "×"),
    Figure("re-executed work: global rollback / falkirk (lazy region fails)", "rework",
           "ratio", 5.0, True, "×"),
    Figure("checkpoint bytes: full / incremental at 1% churn (smallest)", "checkpoints",
           "min_ratio", 20.0, True, "×"),
    Figure("solver at 10k regions: index + solve", "solver", "index_solve_s", 1.0, False, "s"),
    Figure("solver: incremental update after a new checkpoint (median)", "solver",
           "incremental_ms_median", 10.0, False, "ms"),
    Figure("Kafka connector / raw consumer (sustained)", "kafka", "ratio", 0.7, True, "×"),
    Figure("exactly-once writer / plain Parquet write", "delta", "ratio", 0.8, True, "×"),
]


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT,
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def run_benches(args: Namespace) -> dict[str, dict[str, Any]]:
    """Each benchmark's own figures (each prints its own table as it goes)."""
    from falkirk_dev.bench import (
        checkpoint_bench,
        delta_bench,
        kafka_bench,
        regimes_bench,
        rework_bench,
        solver_bench,
    )

    quick = args.quick
    solver_args = Namespace(**{**vars(args), "regions": 1_000 if quick else args.regions})
    rework_args = Namespace(**{**vars(args), "events": 1_000 if quick else args.events})
    regimes_args = Namespace(**{**vars(args), "events": 3_000 if quick else args.events,
                                "rounds": 1 if quick else args.rounds,
                                "latency_events": 600 if quick else args.latency_events,
                                "latency_epochs": 3 if quick else args.latency_epochs})
    out: dict[str, dict[str, Any]] = {}
    steps = [
        ("solver", lambda: solver_bench.main(solver_args)),
        ("checkpoints", lambda: checkpoint_bench.main(keys=20_000 if quick else 200_000)),
        ("kafka", lambda: kafka_bench.main(records=200_000 if quick else 300_000)),  # 2 batches
        ("delta", lambda: delta_bench.main(rows=100_000 if quick else 1_000_000)),
        ("rework", lambda: rework_bench.main(rework_args)),
        ("regimes", lambda: regimes_bench.main(regimes_args)),
    ]
    for name, step in steps:
        started = time.monotonic()
        figures = dict(step())
        figures["bench_s"] = time.monotonic() - started
        if name == "solver":
            figures["index_solve_s"] = figures["index_s"] + figures["solve_s"]
        out[name] = figures
    return out


def main(args: Namespace) -> dict:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    started = time.time()
    benches = run_benches(args)
    rows = []
    for f in FIGURES:
        value = benches[f.bench][f.key]
        rows.append({"figure": f.name, "value": value, "unit": f.unit,
                     "goal": f"{'≥' if f.higher_is_better else '≤'} {f.goal:g} {f.unit}",
                     "met": f.met(value)})
    table = Table(title="falkirk figures, measured in one run" + (" (--quick)" if args.quick
                                                                 else ""), title_justify="left")
    for col in ("figure", "value", "goal", "met"):
        table.add_column(col, justify="left" if col == "figure" else "right")
    for r in rows:
        table.add_row(r["figure"], f"{r['value']:.2f} {r['unit']}", r["goal"],
                      "[green]yes[/green]" if r["met"] else "[red]no[/red]")
    console.print(table)
    commit = _commit()
    result = {"commit": commit, "started": started, "seconds": time.time() - started,
              "quick": args.quick, "machine": {"cpus": os.cpu_count(),
                                               "python": platform.python_version(),
                                               "load_avg_1m": os.getloadavg()[0]},
              "figures": rows, "benches": benches}
    out = Path(args.out) if args.out else Path(load().var_dir) / "bench" / f"{commit}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, default=str))
    console.print(f"JSON: {out}")
    return result
