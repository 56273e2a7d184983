"""Solver benchmark: a full solve on a large random pipeline graph, then incremental updates.

Run: ``falkirk bench solver`` (defaults: 10,000 regions, 30,000 edges, 50 frontiers
each). Goals: full solve < 1 s, incremental update after one new checkpoint < 10 ms.
"""

from __future__ import annotations

import random
import statistics
import time
from argparse import Namespace

from falkirk.model.times import EPOCH, INF
from falkirk.solver.frontier import Edge, Entry, Problem, Region, Solver


def random_problem(regions: int, edges: int, frontiers: int, seed: int,
                   failed_fraction: float = 0.01) -> Problem:
    """A random pipeline graph: edges mostly run forward (a dataflow), half are logged.

    Every region can restore to epochs 0…frontiers-1; its live state has gone two epochs
    further. Unlogged edges discard what they sent (D = π), logged ones keep their log
    from epoch 5 on, so failures cascade upstream only through unlogged edges.
    """
    rng = random.Random(seed)
    names = [f"r{i}" for i in range(regions)]
    edge_list: list[Edge] = []
    for j in range(edges):
        a, b = rng.sample(range(regions), 2)
        if rng.random() < 0.9 and a > b:  # mostly forward; some back edges make cycles
            a, b = b, a
        edge_list.append(Edge(f"e{j}", names[a], names[b], EPOCH, logged=rng.random() < 0.5))
    ins: dict[str, list[Edge]] = {n: [] for n in names}
    outs: dict[str, list[Edge]] = {n: [] for n in names}
    for e in edge_list:
        ins[e.dst].append(e)
        outs[e.src].append(e)
    region_map = {}
    for n in names:
        def entry(k: int | float, live: bool = False, n=n) -> Entry:
            gc = min(k, 5)
            return Entry(
                at=INF if live else k,
                delivered={e.name: (frontiers + 1 if live else k) for e in ins[n]},
                projected={e.name: k for e in outs[n]},
                discarded={e.name: (gc if e.logged else k) for e in outs[n]},
            )

        region_map[n] = Region(
            n, EPOCH, failed=rng.random() < failed_fraction,
            frontiers=[entry(k) for k in range(frontiers)], live=entry(INF, live=True),
        )
    return Problem(region_map, {e.name: e for e in edge_list})


def new_checkpoint(problem: Problem, name: str, frontiers: int) -> Entry:
    region = problem.regions[name]
    last = region.frontiers[-1]
    return Entry(
        at=frontiers,
        delivered={e: frontiers for e in last.delivered},
        projected={e: frontiers for e in last.projected},
        discarded={e: (v if v < last.at else frontiers) for e, v in last.discarded.items()},
    )


def _update_times(solver: Solver, problem: Problem, picks: list[str],
                  frontiers: int) -> list[float]:
    times = []
    for name in picks:
        entry = new_checkpoint(problem, name, frontiers)
        t0 = time.perf_counter()
        solver.add_frontier(name, entry)
        times.append(time.perf_counter() - t0)
    return times


def main(args: Namespace) -> dict:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    with console.status("building the random problem…"):
        t0 = time.perf_counter()
        problem = random_problem(args.regions, args.edges, args.frontiers, args.seed)
        build = time.perf_counter() - t0
    failed = sum(r.failed for r in problem.regions.values())

    t0 = time.perf_counter()
    solver = Solver(problem)
    index = time.perf_counter() - t0
    t0 = time.perf_counter()
    frontiers = solver.frontiers()
    solve_s = time.perf_counter() - t0
    lowered = sum(not f.is_top for f in frontiers.values())

    t0 = time.perf_counter()
    monitor = Solver(problem, all_failed=True)
    monitor.frontiers()
    wm_s = time.perf_counter() - t0

    rng = random.Random(args.seed + 1)
    picks = rng.sample(sorted(problem.regions), 20)
    incr = _update_times(solver, problem, picks[:10], args.frontiers)
    incr_gc = _update_times(monitor, problem, picks[10:], args.frontiers)

    figures = {
        "regions": args.regions, "edges": args.edges, "frontiers_per_region": args.frontiers,
        "failed_regions": failed, "regions_rolled_back": lowered,
        "build_problem_s": build, "index_s": index, "solve_s": solve_s,
        "low_watermark_s": wm_s,
        "incremental_ms_median": statistics.median(incr) * 1e3,
        "incremental_ms_max": max(incr) * 1e3,
        "gc_monitor_incremental_ms_median": statistics.median(incr_gc) * 1e3,
        "gc_monitor_incremental_ms_max": max(incr_gc) * 1e3,
    }
    table = Table(title=f"solver: {args.regions} regions, {args.edges} edges, "
                        f"{args.frontiers} frontiers each, {failed} failed "
                        f"({lowered} regions rolled back)", title_justify="left")
    table.add_column("figure")
    table.add_column("value", justify="right")
    table.add_column("goal", justify="right")
    table.add_row("build the problem (Python objects)", f"{build:.3f} s", "")
    table.add_row("index it (Solver(problem))", f"{index:.3f} s", "")
    table.add_row("solve (fixed point)", f"{solve_s:.3f} s", "")
    table.add_row("index + solve", f"{index + solve_s:.3f} s", "< 1 s")
    table.add_row("low watermark (all failed, index + solve)", f"{wm_s:.3f} s", "< 1 s")
    table.add_row("incremental: new checkpoint, median of 10",
                  f"{figures['incremental_ms_median']:.2f} ms", "< 10 ms")
    table.add_row("incremental: new checkpoint, max of 10",
                  f"{figures['incremental_ms_max']:.2f} ms", "< 10 ms")
    table.add_row("GC monitor incremental, median of 10",
                  f"{figures['gc_monitor_incremental_ms_median']:.2f} ms", "< 10 ms")
    table.add_row("GC monitor incremental, max of 10",
                  f"{figures['gc_monitor_incremental_ms_max']:.2f} ms", "< 10 ms")
    console.print(table)
    return figures
