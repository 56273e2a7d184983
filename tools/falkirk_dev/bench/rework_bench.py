"""Re-executed work after a failure of the lazy region: falkirk's plan vs a global rollback.

Runs the reference pipeline in a sandbox and, at three moments (communities, the lazy
region, in the middle of each epoch of one checkpoint interval), takes the plan a failure
of communities gets: dry runs of the executor at the first two, a real SIGKILL and
rollback at the last. Work to redo is counted in region·epochs: for each region, the
epochs between the frontier it restores to and the epoch it had started. A global rollback
takes every region back to the last checkpoint all of them share (the lazy region's
newest checkpoint). Goal: ≥ 5× less work with falkirk.

Run: ``falkirk bench rework`` (about 3 minutes on 2 cores).
"""

from __future__ import annotations

import tempfile
import time
from argparse import Namespace
from pathlib import Path

from falkirk.model.times import DOMAINS, epoch_of_key


def epochs_reached(run, region: str) -> int:
    """The latest epoch the region started (a running epoch counts: a failure loses it)."""
    latest = run.log.regions(run.pipeline)[region].latest
    if latest is None:
        return -1
    spec = run.pipeline.regions[region]
    key = DOMAINS[spec.domain].parse(latest.time)
    return key[0] if spec.domain == "epoch.iteration" else key


def redo(run, plan, reached: dict[str, int]) -> tuple[dict[str, int], dict[str, int]]:
    """Region·epochs to redo per region: falkirk's plan, and a global rollback of every
    region to the lazy region's newest checkpoint (the last checkpoint all share)."""
    spec = run.pipeline.regions
    checkpoint = epoch_of_key("epoch.iteration",
                              DOMAINS["epoch.iteration"].parse(plan.frontiers["communities"]))
    ours, theirs = {}, {}
    for region, s in spec.items():
        frontier = plan.frontiers[region]
        # ``reached`` counts the epoch in progress too: a failure loses it.
        f = (None if frontier == "top"
             else epoch_of_key(s.domain, DOMAINS[s.domain].parse(frontier)))
        ours[region] = 0 if f is None else max(0, reached[region] - f)
        theirs[region] = max(0, reached[region] - checkpoint)
    return ours, theirs


def main(args: Namespace) -> dict:
    from rich.console import Console
    from rich.table import Table

    from falkirk.recovery.rollback import RollbackExecutor, RollbackRequest
    from falkirk_dev.harness import LocalRun

    console = Console()
    epochs = args.epochs or 9
    moments = list(range(args.kill_epoch - 2, args.kill_epoch + 1))
    results = []
    with tempfile.TemporaryDirectory(prefix="falkirk-rework-") as tmp, \
            LocalRun(Path(tmp)) as run:
        with console.status("generating input and starting the pipeline…"):
            events = args.events or 3000
            run.generate(events=events, queries=events // 10, epochs=epochs, seed=5)
            run.start(until_epoch=epochs - 1)
        executor = RollbackExecutor(run.pipeline, run.cfg, run.log)
        for k in moments:
            with console.status(f"waiting for communities in the middle of epoch {k}…"):
                run.wait_for(lambda k=k: run.epoch_running("communities", k), timeout_s=1800,
                             what=f"communities mid epoch {k}")
            # The plan a failure of communities now gets (a dry run: the same solver and
            # log the executor uses); the last moment is a real kill and rollback.
            reached = {r: epochs_reached(run, r) for r in run.pipeline.regions}
            if k == moments[-1]:
                run.kill(run.pipeline.regions["communities"].job)
                t0 = time.monotonic()
                plan = run.rollback(failed=["communities"], reason="bench: killed")
                rollback_s = time.monotonic() - t0
            else:
                plan = executor.plan(RollbackRequest(run.pipeline.name, ["communities"]))
            results.append((k, reached, plan, *redo(run, plan, reached)))
        run.stop_all()

    table = Table(title="re-executed work (region·epochs) when communities (lazy, checkpoint "
                        f"every {run.pipeline.regions['communities'].checkpoint_every} epochs) "
                        "fails in the middle of an epoch", title_justify="left")
    for col in ("failure in epoch", "reached (epoch in progress)", "falkirk frontiers moved",
                "falkirk redo", "global redo", "ratio"):
        table.add_column(col)
    total_ours = total_theirs = 0
    for k, reached, plan, ours, theirs in results:
        a, b = sum(ours.values()), sum(theirs.values())
        total_ours, total_theirs = total_ours + a, total_theirs + b
        moved = {r: f for r, f in plan.frontiers.items() if f != "top"}
        table.add_row(str(k), " ".join(f"{r}:{e}" for r, e in reached.items()),
                      str(moved), str(a), str(b), f"{b / a:.1f}×" if a else "∞")
    ratio = total_theirs / total_ours if total_ours else float("inf")
    table.add_row("all", "", "", str(total_ours), str(total_theirs), f"{ratio:.1f}×")
    console.print(table)
    console.print(f"global rollback / falkirk over the {len(results)} failure moments = "
                  f"{ratio:.1f}× (goal ≥ 5×); the real rollback took {rollback_s:.2f} s")
    return {"falkirk_region_epochs": total_ours, "global_region_epochs": total_theirs,
            "ratio": ratio, "rollback_s": rollback_s}
