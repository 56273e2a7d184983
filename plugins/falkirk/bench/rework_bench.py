"""Re-executed work after a failure of the lazy region: falkirk's plan vs a global rollback.

Runs the reference pipeline in a sandbox, kills the communities job (lazy checkpoint,
every K epochs) in the middle of an epoch, and asks the rollback executor for its plan.
Work to redo is counted in region·epochs: for each region, the epochs between the
frontier it restores to and the epoch it had reached (plus the epoch in progress for the
failed region). A global rollback takes every region back to the last checkpoint all of
them share (the lazy region's newest checkpoint). Goal: ≥ 5× less work with falkirk.

Run: ``falkirk bench rework`` (about 3 minutes on 2 cores).
"""

from __future__ import annotations

import tempfile
import time
from argparse import Namespace
from pathlib import Path

from falkirk.runtime import epoch_of_key
from falkirk.times import DOMAINS


def epochs_reached(run, region: str) -> int:
    latest = run.log.regions(run.pipeline)[region].latest
    if latest is None:
        return -1
    spec = run.pipeline.regions[region]
    key = DOMAINS[spec.domain].parse(latest.time)
    return key[0] if spec.domain == "epoch.iteration" else key


def main(args: Namespace) -> dict:
    from rich.console import Console
    from rich.table import Table

    from falkirk.harness import LocalRun

    console = Console()
    epochs, kill_epoch = args.epochs, args.kill_epoch
    with tempfile.TemporaryDirectory(prefix="falkirk-rework-") as tmp, \
            LocalRun(Path(tmp)) as run:
        with console.status("generating input and starting the pipeline…"):
            events = args.events or 3000
            run.generate(events=events, queries=events // 10, epochs=epochs, seed=5)
            run.start(until_epoch=epochs - 1)
        with console.status(f"waiting for communities to be in the middle of epoch "
                            f"{kill_epoch}…"):
            run.wait_for(lambda: run.epoch_running("communities", kill_epoch), timeout_s=1800,
                         what=f"communities mid epoch {kill_epoch}")
            reached = {r: epochs_reached(run, r) for r in run.pipeline.regions}
            run.kill(run.pipeline.regions["communities"].job)
        t0 = time.monotonic()
        plan = run.rollback(failed=["communities"], reason="bench: communities killed")
        rollback_s = time.monotonic() - t0
        run.stop_all()

    falkirk_work, global_work = {}, {}
    checkpoint = epoch_of_key("epoch.iteration",
                              DOMAINS["epoch.iteration"].parse(plan.frontiers["communities"]))
    for region, spec in run.pipeline.regions.items():
        frontier = plan.frontiers[region]
        done = reached[region] + (1 if region == "communities" else 0)  # the lost epoch
        if frontier == "top":
            falkirk_work[region] = 0
        else:
            f = epoch_of_key(spec.domain, DOMAINS[spec.domain].parse(frontier))
            falkirk_work[region] = max(0, done - f)
        global_work[region] = max(0, done - checkpoint)
    ours, theirs = sum(falkirk_work.values()), sum(global_work.values())
    ratio = theirs / ours if ours else float("inf")
    table = Table(title=f"re-executed work after killing communities mid epoch {kill_epoch} "
                        f"(checkpoint every {run.pipeline.regions['communities'].checkpoint_every}"
                        f" epochs; newest checkpoint {checkpoint})", title_justify="left")
    for col in ("region", "regime", "reached", "falkirk frontier", "falkirk redo",
                "global redo"):
        table.add_column(col)
    for region, spec in run.pipeline.regions.items():
        table.add_row(region, spec.regime, str(reached[region]), str(plan.frontiers[region]),
                      str(falkirk_work[region]), str(global_work[region]))
    table.add_row("total (region·epochs)", "", "", "", str(ours), str(theirs))
    console.print(table)
    console.print(f"global rollback / falkirk = {ratio:.1f}× (goal ≥ 5×); the rollback itself "
                  f"took {rollback_s:.2f} s")
    return {"falkirk_region_epochs": ours, "global_region_epochs": theirs, "ratio": ratio,
            "rollback_s": rollback_s}
