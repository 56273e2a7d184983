"""``falkirk trials``: fault-injection trials of the reference pipeline.

One failure-free ("golden") run on seeded input, then N trials on the same input, each in
its own sandbox (:class:`~falkirk_dev.harness.LocalRun`: its own broker, lake and process
folders). Each trial picks, with a seeded random generator, a region and a phase, and
kills that region's job with SIGKILL there:

* ``mid-epoch``: once the region is in the middle of a chosen epoch (its epoch log row
  says ``running``), the harness SIGKILLs the job's whole process group;
* ``before-commit``: the job is started with ``FALKIRK_CRASH_AT=writer:before-commit@N``
  (:mod:`falkirk.faults`) and SIGKILLs its own driver between writing an epoch's Parquet
  files and the Delta commit, in the chosen epoch and before the chosen table;
* ``mid-checkpoint`` (regions with state: lazy or eager, in an epoch whose checkpoint is
  due): ``checkpoint:before-save@N``, after the epoch's outputs are committed and before
  its checkpoint is committed and logged;
* ``mid-rollback``: a mid-epoch kill, then ``falkirk rollback`` in a subprocess with
  ``FALKIRK_CRASH_AT=rollback:after-first-table``, which dies after restoring one table;
  the recovery then resumes that unfinished rollback.

Recovery does what the Airflow supervisor's ``recover`` step does
(:mod:`falkirk.airflow.supervisor`): find the dead jobs (exited with a non-zero code),
roll their regions back as failed with the :class:`~falkirk.recovery.rollback.RollbackExecutor`
(through :meth:`LocalRun.rollback`, which stops the jobs of affected regions), restart the
dead and stopped jobs, and wait for the pipeline to finish. The trials drive these steps
directly, in this process; they do not go through Airflow: its sensor, XComs and
scheduling delays are not exercised here. Like the supervisor, a job that had already
finished its input is restarted too when the rollback moved one of its regions back. One
difference: the harness stops affected jobs with SIGKILL (the supervisor: SIGTERM, then
SIGKILL).

Every output (each Delta table, and the latest response per key of each output topic) is
compared with the golden run's: records lost, records duplicated, the outputs that differ.
Times are counted from the kill (for a crash point: from when its death is noticed, within
a poll interval): to the end of the rollback and the restart ("recovered"), to the failed
region committing again the epoch it died in ("back", the restarted Spark job's start-up
included), and to the end of the pipeline ("finished"). A trial whose outputs differ, or
that fails, keeps its sandbox and says where.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from argparse import Namespace
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from falkirk.faults import ENV as CRASH_ENV
from falkirk.faults import crash_at
from falkirk.model.topology import Pipeline, RegionSpec

PHASES = ("mid-epoch", "before-commit", "mid-checkpoint", "mid-rollback")
INPUT_SEED = 3  # the input is the same in every trial; --seed picks regions and phases
WAIT_MOMENT_S = 900.0  # longest wait for the moment to kill
WAIT_END_S = 1500.0  # longest wait for a run's jobs to finish
POLL_S = 0.3


class TrialError(RuntimeError):
    """A trial could not be carried out as planned (not a wrong output: a broken run)."""


# -- picking trials (pure: no Spark, no broker) ----------------------------------------------


@dataclass(frozen=True)
class Trial:
    """One planned trial: where and when the region's job dies."""

    index: int
    region: str
    phase: str
    epoch: int
    job: str
    crash_at: str | None = None  # FALKIRK_CRASH_AT of the job (before-commit, mid-checkpoint)
    # before-commit: the table whose commit never happens (one of its round's: see
    # delta_writes)
    table: str | None = None


def checkpoint_due(spec: RegionSpec, epoch: int) -> bool:
    """Whether the region saves a checkpoint at the end of ``epoch``, as its regime says
    (by epochs: the trials' pipelines time no checkpoint)."""
    return spec.regime_rules.checkpoint_due(spec, epoch)


def job_regions(pipeline: Pipeline, job: str) -> list[str]:
    """A job's regions in the order its runner handles them each epoch (sorted)."""
    return sorted(r for r, spec in pipeline.regions.items() if spec.job == job)


def delta_writes(pipeline: Pipeline, job: str) -> list[tuple[str, str]]:
    """(region, table) in the order a job's epoch reaches ``writer:before-commit``: its
    regions' tables (sorted by region, each once), then their dead-letter tables, which
    take the rows the others refused. Every table's files are written side by side; the
    commits follow one after another in this order (falkirk.runtime.loop)."""
    first, last = [], []
    for r in job_regions(pipeline, job):
        dead = pipeline.dead_letter_edge(r)
        seen: set[str] = set()
        for edge in pipeline.out_edges(r):
            if edge.kind == "delta" and edge.table not in seen:
                seen.add(edge.table)
                (last if dead is not None and edge.table == dead.table else first).append(
                    (r, edge.table))
    return first + last


def checkpoint_saves(pipeline: Pipeline, job: str, epoch: int) -> list[str]:
    """The regions of a job that save a checkpoint at the end of ``epoch``, in order."""
    return [r for r in job_regions(pipeline, job)
            if checkpoint_due(pipeline.regions[r], epoch)]


def eligible(pipeline: Pipeline, phase: str, epochs: int) -> dict[str, list[int]]:
    """Region → the epochs a trial of ``phase`` may pick (regions with none are left out)."""
    out: dict[str, list[int]] = {}
    for name, spec in pipeline.regions.items():
        if not spec.job:
            continue
        if phase in ("mid-epoch", "mid-rollback"):
            # A rollback always restores a table of the failed region: it needs one.
            has_delta = any(e.kind == "delta" for e in pipeline.out_edges(name))
            chosen = list(range(epochs)) if phase == "mid-epoch" or has_delta else []
        elif phase == "before-commit":
            has_delta = any(e.kind == "delta" for e in pipeline.out_edges(name))
            chosen = list(range(epochs)) if has_delta else []
        elif phase == "mid-checkpoint":
            chosen = [e for e in range(epochs) if checkpoint_due(spec, e)]
        else:
            raise ValueError(f"unknown phase {phase!r} (phases: {', '.join(PHASES)})")
        if chosen:
            out[name] = chosen
    return out


def plan_trial(pipeline: Pipeline, index: int, region: str, phase: str, epoch: int,
               rng: random.Random | None = None) -> Trial:
    """The trial of ``phase`` at ``region``'s ``epoch``; its crash point if self-inflicted."""
    job = pipeline.regions[region].job
    assert job is not None
    if phase == "before-commit":
        writes = delta_writes(pipeline, job)
        mine = [i for i, (r, _) in enumerate(writes) if r == region]
        at = (rng or random.Random(0)).choice(mine)
        return Trial(index, region, phase, epoch, job,
                     crash_at("writer:before-commit", epoch * len(writes) + at + 1),
                     table=writes[at][1])
    if phase == "mid-checkpoint":
        before = sum(len(checkpoint_saves(pipeline, job, e)) for e in range(epoch))
        nth = before + checkpoint_saves(pipeline, job, epoch).index(region) + 1
        return Trial(index, region, phase, epoch, job, crash_at("checkpoint:before-save", nth))
    return Trial(index, region, phase, epoch, job)


def pick(pipeline: Pipeline, n: int, seed: int, epochs: int) -> list[Trial]:
    """``n`` trials: each a phase, then an eligible region and epoch, from ``seed``."""
    rng = random.Random(seed)
    phases = [p for p in PHASES if eligible(pipeline, p, epochs)]
    if not phases:
        raise TrialError(f"pipeline {pipeline.name!r} has no region to kill in {epochs} epochs")
    trials = []
    for i in range(n):
        phase = rng.choice(phases)
        options = eligible(pipeline, phase, epochs)
        region = rng.choice(sorted(options))
        epoch = rng.choice(options[region])
        trials.append(plan_trial(pipeline, i + 1, region, phase, epoch, rng))
    return trials


# -- running --------------------------------------------------------------------------------


def input_of(events: int, epochs: int) -> dict[str, int]:
    """The seeded input of every run (``falkirk generate``'s options)."""
    return {"events": events, "queries": max(1, events // 10), "epochs": epochs,
            "seed": INPUT_SEED}


def running_epochs(run, region: str) -> list[int]:
    """The epochs ``region`` is in the middle of (their log rows say running): one, or the
    epochs of a pass."""
    return sorted(r.epoch for r in run.log.regions(run.pipeline)[region].entries.values()
                  if r.status == "running")


def running_epoch(run, region: str) -> int | None:
    """The newest epoch ``region`` is in the middle of, or None."""
    return max(running_epochs(run, region), default=None)


def died_by(code: int | None) -> str:
    """How a job process ended: -9 is SIGKILL of the job (spark-submit's JVM); 137 is the
    JVM passing on its Python driver's SIGKILL (a crash point)."""
    if code is None:
        return "running"
    if code in (-signal.SIGKILL, 128 + signal.SIGKILL):
        return "SIGKILL"
    if code < 0:
        return signal.Signals(-code).name
    return f"exit {code}"


def finish(run, timeout_s: float = WAIT_END_S) -> None:
    """Wait for every job to exit; each must have finished its input (exit 0)."""
    codes = run.wait(timeout_s=timeout_s)
    bad = {j: c for j, c in codes.items() if c != 0}
    if bad:
        raise TrialError("job(s) failed: " + ", ".join(
            f"{j} ({died_by(c)}, see {run.log_file(j)})" for j, c in bad.items()))


def golden_run(root: Path, data: dict[str, int], timeout_s: float = WAIT_END_S,
               pipeline: str | Path = "reference") -> dict[str, Any]:
    """The failure-free run's outputs (of the reference pipeline, or of ``pipeline``)."""
    from falkirk_dev.harness import LocalRun

    with LocalRun(root, pipeline) as run:
        run.generate(**data)
        run.start(until_epoch=data["epochs"] - 1)
        finish(run, timeout_s)
        return run.outputs()


def kill_and_recover(run, trial: Trial, data: dict[str, int],
                     say: Callable[[str], None]) -> dict[str, Any]:
    """Start the pipeline, make ``trial.job`` die as planned, recover as the supervisor
    does, and wait for the end. Returns what happened (times in seconds)."""
    last = data["epochs"] - 1
    out: dict[str, Any] = {}
    if trial.crash_at:  # only the trial's job gets the crash point
        run.env[CRASH_ENV] = trial.crash_at
        try:
            run.start([trial.job], until_epoch=last)
        finally:
            del run.env[CRASH_ENV]
        others = [j for j in run.jobs if j != trial.job]
        if others:  # (start([]) would start every job)
            run.start(others)
    else:
        run.start(until_epoch=last)

    # 1. The failure.
    if trial.crash_at:
        say(f"waiting for {trial.job} to reach {trial.crash_at}")
        run.wait_for(lambda: run.procs[trial.job].poll() is not None, WAIT_MOMENT_S,
                     f"{trial.job} to crash at {trial.crash_at}", {trial.job})
        if run.procs[trial.job].returncode == 0:
            raise TrialError(f"{trial.job} finished without reaching {trial.crash_at}")
        t_kill, kill_wall = time.monotonic(), time.time()  # noticed: within POLL_S + JVM exit
        out["killed_in_epoch"] = running_epoch(run, trial.region)
    else:
        seen: list[int] = []

        def moment() -> bool:
            running = running_epochs(run, trial.region)
            if trial.epoch in running:  # alone, or inside a pass of several epochs
                seen.append(trial.epoch)
                return True
            if running and running[0] > trial.epoch:
                seen.append(running[0])
                return True
            if run.procs[trial.job].poll() == 0:
                raise TrialError(f"{trial.job} finished before {trial.region} was seen in "
                                 f"epoch {trial.epoch}")
            return False

        say(f"waiting for {trial.region} to be in the middle of epoch {trial.epoch}")
        run.wait_for(moment, WAIT_MOMENT_S,
                     f"{trial.region} in the middle of epoch {trial.epoch}")
        t_kill, kill_wall = time.monotonic(), time.time()
        run.kill(trial.job)
        out["killed_in_epoch"] = seen[-1]
        say(f"killed {trial.job} (SIGKILL) in the middle of {trial.region}'s epoch {seen[-1]}")

    # 2. The supervisor's sensor: which jobs died.
    dead = run.failed_jobs()
    out["exit_codes"] = dead
    out["died_by"] = died_by(dead.get(trial.job))
    failed = sorted({r for job in dead for r in job_regions(run.pipeline, job)})
    out["failed"] = failed

    # 3. mid-rollback: a first rollback that dies after restoring one table.
    if trial.phase == "mid-rollback":
        say(f"rollback of {', '.join(failed)} with {CRASH_ENV}=rollback:after-first-table")
        crashed = subprocess.run(
            [sys.executable, "-m", "falkirk.cli", "rollback", "--pipeline",
             run.pipeline.source or run.pipeline.name, "--failed", ",".join(failed),
             "--reason", f"trial {trial.index}: crash me"],
            env={**os.environ, **run.env, CRASH_ENV: "rollback:after-first-table"},
            capture_output=True, text=True, timeout=600)
        out["rollback_exit"] = crashed.returncode
        out["rollback_died_by"] = died_by(crashed.returncode)
        if crashed.returncode != -signal.SIGKILL:
            raise TrialError(f"the rollback meant to crash exited {crashed.returncode}: "
                             f"{crashed.stderr[-2000:]}")
        unfinished = run.log.unfinished_rollback(run.pipeline.name)
        if unfinished is None:
            raise TrialError("the crashed rollback left no unfinished rollback in the log")
        out["crashed_rollback_id"] = unfinished["rollback_id"]

    # 4. The supervisor's recover step: roll back the dead jobs' regions, restart.
    say(f"rolling back {', '.join(failed)} as failed")
    t_rb = time.monotonic()
    plan = run.rollback(failed=failed, reason=f"trial {trial.index}: {trial.phase} "
                                              f"{trial.region} epoch {trial.epoch}")
    t_rolled = time.monotonic()
    affected = plan.affected
    restart = sorted(job for job, proc in run.procs.items()
                     if proc.poll() is not None
                     and (proc.returncode != 0 or set(job_regions(run.pipeline, job)) & affected))
    if restart:
        run.start(restart)
    t_restarted = time.monotonic()
    say(f"rollback {plan.rollback_id} done; restarted {', '.join(restart) or 'nothing'}")
    out.update(rollback_id=plan.rollback_id, frontiers=plan.frontiers, restarted=restart,
               resumed=plan.rollback_id == out.get("crashed_rollback_id"))
    finish(run)
    t_done = time.monotonic()
    out.update(rollback_s=round(t_rolled - t_rb, 2), recover_s=round(t_restarted - t_kill, 2),
               redone_s=redone_after(run, trial.region, out["killed_in_epoch"], kill_wall),
               finish_s=round(t_done - t_kill, 2))
    return out


def redone_after(run, region: str, epoch: int | None, kill_wall: float) -> float | None:
    """Seconds from the kill until ``region`` committed again the epoch it died in (back
    where it was: the restarted job's Spark start-up included)."""
    from datetime import UTC

    from falkirk.model.times import DOMAINS, time_of

    if epoch is None:
        return None
    domain = run.pipeline.regions[region].domain
    row = run.log.regions(run.pipeline)[region].entries.get(
        DOMAINS[domain].parse(time_of(domain, epoch)))
    if row is None or row.recorded_at is None or row.status == "running":
        return None
    at = row.recorded_at
    if getattr(at, "tzinfo", None) is None:
        at = at.replace(tzinfo=UTC)
    return round(at.timestamp() - kill_wall, 2)


def run_trial(trial: Trial, root: Path, data: dict[str, int], golden: dict[str, Any],
              say: Callable[[str], None]) -> dict[str, Any]:
    """One trial in its own sandbox; its row of the report (``ok`` false if anything
    differs or broke; ``error`` then says what broke)."""
    from falkirk_dev.harness import LocalRun, compare

    result: dict[str, Any] = {**asdict(trial), "ok": False, "lost": None, "duplicated": None,
                              "tables_differ": [], "sandbox": str(root)}
    t0 = time.monotonic()
    try:
        with LocalRun(root) as run:
            run.generate(**data)
            result.update(kill_and_recover(run, trial, data, say))
            report = compare(golden, run.outputs())
            result["sent"] = run.sent()  # every message, not only the latest per key
        result["lost"] = sum(v["lost"] for v in report.values())
        result["duplicated"] = sum(v["duplicated"] for v in report.values())
        result["tables_differ"] = sorted(k for k, v in report.items()
                                         if v["lost"] or v["duplicated"])
        result["differences"] = {k: report[k] for k in result["tables_differ"]}
        problems = []
        if result.get("died_by") != "SIGKILL":
            problems.append(f"{trial.job} did not die by SIGKILL: {result.get('died_by')}")
        if trial.phase == "mid-rollback" and not result.get("resumed"):
            problems.append("the recovery did not resume the crashed rollback")
        if problems:
            result["error"] = "; ".join(problems)
        result["ok"] = not result["tables_differ"] and not problems
    except Exception as exc:  # a broken trial is reported, and the next one runs
        result["error"] = f"{type(exc).__name__}: {exc}"
    result["seconds"] = round(time.monotonic() - t0, 1)
    return result


def totals(results: list[dict[str, Any]]) -> dict[str, Any]:
    def values(key: str) -> list[float]:
        return [r[key] for r in results if r.get(key) is not None]

    def stats(values: list[float]) -> dict[str, float | None]:
        if not values:
            return {"mean": None, "max": None}
        return {"mean": round(sum(values) / len(values), 2), "max": max(values)}

    return {
        "trials": len(results),
        "ok": sum(1 for r in results if r["ok"]),
        "errors": sum(1 for r in results if r.get("error")),
        "lost": sum(r["lost"] or 0 for r in results),
        "duplicated": sum(r["duplicated"] or 0 for r in results),
        "tables_differ": sorted({t for r in results for t in r["tables_differ"]}),
        "resent": sum(t["resent"] for r in results for t in (r.get("sent") or {}).values()),
        "resent_same_generation": sum(t["resent_same_generation"] for r in results
                                      for t in (r.get("sent") or {}).values()),
        "trials_with_differences": sum(1 for r in results if r["tables_differ"]),
        "recover_s": stats(values("recover_s")),
        "redone_s": stats(values("redone_s")),
        "finish_s": stats(values("finish_s")),
        "by_phase": {p: sum(1 for r in results if r["phase"] == p) for p in PHASES},
    }


def _table(results: list[dict[str, Any]], total: dict[str, Any]):
    from rich.table import Table

    def num(v: Any) -> str:
        return "–" if v is None else str(v)

    def spread(key: str) -> str:
        return f"{num(total[key]['mean'])} / {num(total[key]['max'])}"

    table = Table(title="fault-injection trials (times in s from the kill)",
                  title_justify="left")
    for col, justify in (("#", "right"), ("region", "left"), ("phase", "left"),
                         ("epoch", "right"), ("died", "left"), ("lost", "right"),
                         ("dup.", "right"), ("outputs that differ", "left"),
                         ("recovered", "right"), ("back", "right"), ("finished", "right"),
                         ("", "left")):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for r in results:
        died = r.get("died_by", "–")
        if r.get("exit_codes", {}).get(r["job"]) is not None:
            died += f" ({r['exit_codes'][r['job']]})"
        if "rollback_died_by" in r:
            died += f", rollback {r['rollback_died_by']}"
        verdict = "[green]✓" if r["ok"] else "[red]✗ " + (r.get("error") or "differs")[:80]
        table.add_row(str(r["index"]), r["region"], r["phase"],
                      num(r.get("killed_in_epoch", r["epoch"])), died, num(r["lost"]),
                      num(r["duplicated"]), ", ".join(r["tables_differ"]) or "none",
                      num(r.get("recover_s")), num(r.get("redone_s")), num(r.get("finish_s")),
                      verdict)
    table.add_section()
    table.add_row("Σ", f"{total['ok']}/{total['trials']} ok", "", "", "mean / max",
                  str(total["lost"]), str(total["duplicated"]),
                  ", ".join(total["tables_differ"]) or "none", spread("recover_s"),
                  spread("redone_s"), spread("finish_s"), "")
    return table


def write_json(path: Path, results: list[dict[str, Any]], t0: float, seed: int,
               data: dict[str, int], pipeline: str, planned: int) -> Path:
    """The results so far, with their totals (``planned``: how many trials were asked for)."""
    total = totals(results)
    total["seconds"] = round(time.monotonic() - t0, 1)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"trials": results, "totals": total, "planned": planned,
                                "seed": seed, "input": data, "pipeline": pipeline},
                               indent=1, default=str))
    return path


def main(args: Namespace, golden: dict[str, Any] | None = None) -> int:
    """Run the trials; 0 when every trial lost and duplicated nothing, else 1. ``golden``:
    the failure-free run's outputs of the same input when the caller has them already (the
    tests share one), else the trials make that run first."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from falkirk.model.topology import load_pipeline

    console = Console()
    if not console.is_terminal:  # a log or CI: wide enough for the table
        console = Console(width=max(console.width, 150))
    pipeline = load_pipeline(getattr(args, "pipeline", None) or "reference")
    n, seed = int(args.trials), int(args.seed)
    data = input_of(int(args.events), int(args.epochs))
    trials = pick(pipeline, n, seed, data["epochs"])
    given = getattr(args, "workdir", None)
    workdir = Path(given) if given else Path(tempfile.mkdtemp(prefix="falkirk-trials-"))
    workdir.mkdir(parents=True, exist_ok=True)
    console.print(f"[bold]{n} trial(s)[/] of pipeline {pipeline.name}, seed {seed}, input "
                  f"{json.dumps(data)}; sandboxes under {workdir}")

    results: list[dict[str, Any]] = []
    t0 = time.monotonic()
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=False) as progress:
        task = progress.add_task("failure-free run", total=n + 1)
        if golden is None:
            try:
                golden = golden_run(workdir / "golden", data)
            except Exception as exc:
                progress.console.print(f"[red]the failure-free run failed: {exc}; "
                                       f"its sandbox: {workdir / 'golden'}")
                return 1
            shutil.rmtree(workdir / "golden", ignore_errors=True)
            progress.console.log(f"failure-free run done: {len(golden)} outputs, "
                                 f"{sum(len(v) for v in golden.values())} rows")
        progress.advance(task)
        for trial in trials:
            label = f"trial {trial.index}/{n}: {trial.phase} {trial.region} epoch {trial.epoch}"
            progress.update(task, description=label)

            def say(msg: str, _label: str = label) -> None:
                progress.console.log(f"[dim]{_label}:[/] {msg}")

            root = workdir / f"trial-{trial.index:03d}"
            r = run_trial(trial, root, data, golden, say)
            results.append(r)
            if r["ok"]:
                shutil.rmtree(root, ignore_errors=True)
                r["sandbox"] = None
                progress.console.log(f"{label}: [green]✓[/] 0 lost, 0 duplicated; recovered "
                                     f"in {r['recover_s']} s, finished {r['finish_s']} s "
                                     "after the kill")
            else:
                progress.console.log(f"{label}: [red]✗[/] {r.get('error') or 'outputs differ'}"
                                     f"; sandbox kept: {root}")
            progress.advance(task)
            if args.json:  # after every trial: a long run stopped early keeps what it measured
                write_json(Path(args.json), results, t0, seed, data, pipeline.name, n)
        progress.update(task, description=f"{n} trial(s) done")

    total = totals(results)
    total["seconds"] = round(time.monotonic() - t0, 1)
    console.print(_table(results, total))
    ok = total["ok"] == total["trials"]
    console.print(f"[bold]{'✓' if ok else '✗'} {total['ok']}/{total['trials']} trials ok: "
                  f"{total['lost']} record(s) lost, {total['duplicated']} duplicated, "
                  f"outputs that differ: {', '.join(total['tables_differ']) or 'none'}; "
                  f"rollback + restart {total['recover_s']['mean']} s on average "
                  f"(max {total['recover_s']['max']} s), back where it died "
                  f"{total['redone_s']['mean']} s (max {total['redone_s']['max']} s), "
                  f"finished {total['finish_s']['mean']} s (max {total['finish_s']['max']} s) "
                  f"after the kill; total {total['seconds']:.0f} s")
    if args.json:
        path = write_json(Path(args.json), results, t0, seed, data, pipeline.name, n)
        console.print(f"results: {path}")
    if ok and not given:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0 if ok else 1
