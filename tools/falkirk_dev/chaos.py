"""``falkirk chaos``: one long run of the reference pipeline under repeated faults.

Where ``falkirk trials`` runs one kill per sandbox, the campaign keeps one pipeline running
and keeps breaking it, at moments drawn from ``--seed``, until ``--minutes`` have passed:

* ``job``: SIGKILL of a random job's process group at a random moment (mid-epoch, or
  wherever it happens to be: in a commit, a checkpoint, a Kafka read);
* ``rollback``: a job killed, then the rollback of its regions killed too, at one of the
  rollback's own crash points (:mod:`falkirk.faults`: before it stops the jobs, after its
  first table); the recovery resumes that rollback;
* ``commit`` and ``checkpoint``: a job restarted by a recovery is armed with a crash point
  (``writer:before-commit@N``, ``checkpoint:before-save@N``) and kills itself there;
* ``broker``: the Apache Kafka broker SIGKILLed and started again on its ports (no job
  needs to die: their broker questions are retried).

With ``--cluster`` the run is on the local cluster of ``bin/cluster up``
(``FALKIRK_ENV=cluster``) and the infrastructure faults join the targets, in place of
``broker``: ``kafka-node`` (one of the 3 KRaft nodes SIGKILLed, started again seconds
later: the replicas hold every acknowledged record), ``spark-worker`` (a worker and its
executors SIGKILLed, then started again: Spark reruns the lost tasks) and ``objectstore``
(S3Proxy SIGKILLed and started again: s3a and delta-rs retry). No job should die of
them and nothing should be rolled back: each counts ``failed_a_job`` when one did.

Each death is recovered as the streams supervisor does (roll the dead jobs' regions back as
failed, restart the dead and stopped jobs). Recovery time is from the kill to when every
region the rollback moved has committed an epoch in the new generation (or ended). Here
the campaign drives recovery itself, as the trials do; with ``--airflow``
(:mod:`falkirk_dev.chaos_airflow`) Airflow's streams supervisor recovers and its scheduler
is among the targets. At the end the pipeline runs to the end of its input with no more faults and
every output is compared with a failure-free run of the same input: tables and the latest
answer per key (lost, duplicated), and every message on the output topics (re-sent in the
same generation: a duplicate a consumer cannot tell; re-sent with another value).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from argparse import Namespace
from collections.abc import Callable
from pathlib import Path
from typing import Any

from falkirk.faults import ENV as CRASH_ENV
from falkirk_dev.trials import died_by, golden_run, input_of, job_regions

TARGETS = ("job", "rollback", "commit", "checkpoint", "broker")
#: On the local cluster: its components, by target (``bin/cluster`` names).
INFRASTRUCTURE = {"kafka-node": ("kafka-1", "kafka-2", "kafka-3"),
                  "spark-worker": ("spark-worker-1", "spark-worker-2"),
                  "objectstore": ("objectstore",)}
ROLLBACK_POINTS = ("rollback:before-stop", "rollback:after-first-table")
RECOVERY_TIMEOUT_S = 600.0
POLL_S = 0.5


def _stateful_jobs(run) -> list[str]:
    return sorted(j for j in run.jobs if any(run.pipeline.regions[r].keeps_state
                                             for r in job_regions(run.pipeline, j)))


def _committed_in(run, regions: set[str], generation: int) -> set[str]:
    """Regions with an epoch committed (or checkpointed) in ``generation``."""
    out = set()
    for r, rlog in run.log.regions(run.pipeline).items():
        if r in regions and any(row.generation >= generation and row.status != "running"
                                for row in rlog.entries.values()):
            out.add(r)
    return out


def _ended(run, regions: set[str]) -> set[str]:
    """Regions whose job exited 0 (its input ended)."""
    return {r for job, proc in run.procs.items() if proc.poll() == 0
            for r in job_regions(run.pipeline, job) if r in regions}


def _all_done(run) -> bool:
    return bool(run.procs) and all(p.poll() == 0 for p in run.procs.values())


class Campaign:
    """The campaign's state: the run, the random draws, what happened."""

    def __init__(self, run, broker, rng: random.Random, say: Callable[[str], None],
                 cluster: bool = False):
        self.run, self.broker, self.rng = run, broker, rng
        self.say = say
        self.targets = ((*(t for t in TARGETS if t != "broker"), *INFRASTRUCTURE)
                        if cluster else TARGETS)
        self.kills: list[dict[str, Any]] = []
        self.rollbacks = 0
        self.stuck = 0
        self.armed: dict[str, str] = {}  # job -> the crash point it was restarted with

    # -- faults ---------------------------------------------------------------------------

    def strike(self) -> None:
        """Wait a random moment, then break something (the target drawn from the seed)."""
        deadline = time.monotonic() + self.rng.uniform(1.0, 8.0)
        while time.monotonic() < deadline:
            if self.run.failed_jobs() or _all_done(self.run):
                return  # something died by itself meanwhile (an armed crash point)
            time.sleep(POLL_S)
        running = sorted(j for j, p in self.run.procs.items() if p.poll() is None)
        target = self.rng.choice(self.targets)
        if target in INFRASTRUCTURE:
            self._break_infrastructure(target)
            return
        if target == "broker":
            t = time.monotonic()
            self.broker.restart(crash=True)
            self.kills.append({"target": "broker", "at": t, "recovery_s": None})
            self.say("broker SIGKILLed and started again")
            self._wait_any_commit(t)
            return
        if not running:
            return
        job = self.rng.choice(running)
        if target in ("commit", "checkpoint"):
            self._arm(job, target)
            return
        self.run.kill(job)
        self.kills.append({"target": target, "job": job, "at": time.monotonic()})
        self.say(f"{job} SIGKILLed")

    def _break_infrastructure(self, target: str) -> None:
        """SIGKILL one component of the cluster, start it again a few seconds later (as
        an operator or a supervisor would), and time it to the pipeline's next commit."""
        from falkirk_dev import cluster

        name = self.rng.choice(INFRASTRUCTURE[target])
        t = time.monotonic()
        cluster.kill(name)
        time.sleep(self.rng.uniform(1.0, 5.0))
        cluster.start(name)
        self.kills.append({"target": target, "component": name, "at": t,
                           "recovery_s": None})
        self.say(f"{name} SIGKILLed and started again")
        self._wait_any_commit(t)
        self.kills[-1]["failed_a_job"] = bool(self.run.failed_jobs())

    def _arm(self, job: str, target: str) -> None:
        """Kill ``job`` and, after the recovery's rollback, restart it with a crash point:
        it kills itself at its N-th commit or checkpoint."""
        point = "writer:before-commit" if target == "commit" else "checkpoint:before-save"
        if target == "checkpoint" and job not in _stateful_jobs(self.run):
            job = self.rng.choice(_stateful_jobs(self.run))
            if self.run.procs[job].poll() is not None:
                return
        armed = f"{point}@{self.rng.randint(1, 3)}"
        self.run.kill(job)
        self.kills.append({"target": f"restart for {target}", "job": job,
                           "at": time.monotonic(), "counted": False})
        self.recover(arm={job: armed})
        self.say(f"{job} restarted armed with {armed}")

    # -- recovery -------------------------------------------------------------------------

    def recover(self, arm: dict[str, str] | None = None) -> None:
        """What the supervisor does after a death: roll back the dead jobs' regions as
        failed, restart the dead and stopped jobs (those in ``arm`` with that crash point),
        and time it to the next commit."""
        dead = self.run.failed_jobs()
        if not dead:
            return
        t_detect = time.monotonic()
        t_kill = min((k["at"] for k in self.kills if "recovery_s" not in k),
                     default=t_detect)
        for job, code in dead.items():
            point = self.armed.pop(job, None)
            if point is not None:  # it killed itself: that is this kill
                self.kills.append({"target": "commit" if "writer" in point else "checkpoint",
                                   "job": job, "at": time.monotonic(), "point": point,
                                   "died_by": died_by(code)})
        failed = sorted({r for job in dead for r in job_regions(self.run.pipeline, job)})
        pending = [k for k in self.kills if k.get("target") == "rollback"
                   and "rollback_point" not in k]
        if pending:
            self._crash_a_rollback(failed, pending[-1])
        t_rollback = time.monotonic()
        plan = self.run.rollback(failed=failed, reason=f"chaos: {', '.join(sorted(dead))} died")
        self.rollbacks += 1
        t_restart = time.monotonic()
        restart = sorted(job for job, proc in self.run.procs.items()
                         if proc.poll() is not None and (
                             proc.returncode != 0
                             or set(job_regions(self.run.pipeline, job)) & plan.affected))
        arm = arm or {}
        self.run.start([j for j in restart if j not in arm])
        for job in restart:
            if job in arm:
                self.run.env[CRASH_ENV] = arm[job]
                try:
                    self.run.start([job])
                finally:
                    del self.run.env[CRASH_ENV]
                self.armed[job] = arm[job]
        self.say(f"rolled back {', '.join(failed)} (frontiers {plan.frontiers}); restarted "
                 f"{', '.join(restart) or 'nothing'}")
        recovered, started = self._wait_recovered(plan.affected, plan.generation, restart)
        # Where the time went: noticing the death, the rollback (plan, stop, restore), the
        # restarted jobs' start (JVM, Spark session, state restored: their start row in
        # the log of runs), their catch-up to the first commit in the new generation.
        parts = {"detect_s": t_detect - t_kill, "rollback_s": t_restart - t_rollback}
        if pending:  # the rollback killed at one of its crash points, before this one
            parts["crashed_rollback_s"] = t_rollback - t_detect
        if started is not None:
            parts["start_s"] = started - t_restart
            if recovered is not None:
                parts["catch_up_s"] = recovered - started
        for k in self.kills:
            if "recovery_s" not in k:
                k["recovery_s"] = (round(recovered - t_kill, 2)
                                   if recovered is not None else None)
                k["parts"] = {n: round(v, 2) for n, v in parts.items()}

    def _crash_a_rollback(self, failed: list[str], kill: dict[str, Any]) -> None:
        point = self.rng.choice(ROLLBACK_POINTS)
        kill["rollback_point"] = point
        run = self.run
        crashed = subprocess.run(
            [sys.executable, "-m", "falkirk.cli", "rollback", "--pipeline",
             run.pipeline.source or run.pipeline.name, "--failed", ",".join(failed),
             "--reason", "chaos: crash me"],
            env={**os.environ, **run.env, CRASH_ENV: point},
            capture_output=True, text=True, timeout=600)
        kill["rollback_died_by"] = died_by(crashed.returncode)
        if crashed.returncode == -signal.SIGKILL:
            self.kills.append({"target": "rollback executor", "point": point,
                               "at": time.monotonic()})
            self.say(f"the rollback of {', '.join(failed)} SIGKILLed at {point}")
        # The crashed rollback may have stopped (killed) jobs: the recovery restarts them.

    def _wait_recovered(self, affected: set[str], generation: int, restarted: list[str]
                        ) -> tuple[float | None, float | None]:
        """When every affected region committed in ``generation`` or ended (None if a job
        died first: the next recovery handles it, or nothing happened for too long), and
        when every restarted job had recorded its start in that generation."""
        deadline = time.monotonic() + RECOVERY_TIMEOUT_S
        started = None if restarted else time.monotonic()
        while time.monotonic() < deadline:
            if started is None:
                runs = self.run.log.job_runs(self.run.pipeline.name)
                if all(runs.get(j, {}).get("generation") == generation for j in restarted):
                    started = time.monotonic()
            back = _committed_in(self.run, affected, generation) | _ended(self.run, affected)
            if back >= affected:
                now = time.monotonic()
                return now, started if started is not None else now
            if self.run.failed_jobs():
                return None, started
            time.sleep(POLL_S)
        self.stuck += 1
        self.say(f"[red]stuck: {sorted(affected)} did not commit within "
                 f"{RECOVERY_TIMEOUT_S:.0f} s")
        return None, started

    def _wait_any_commit(self, t_kill: float) -> None:
        before = len(self.run.log.records(self.run.pipeline.name))
        deadline = time.monotonic() + RECOVERY_TIMEOUT_S
        while time.monotonic() < deadline:
            if (len(self.run.log.records(self.run.pipeline.name)) > before
                    or _all_done(self.run) or self.run.failed_jobs()):
                self.kills[-1]["recovery_s"] = round(time.monotonic() - t_kill, 2)
                return
            time.sleep(POLL_S)
        self.stuck += 1


def outcome(kills: list[dict[str, Any]], report: dict[str, dict[str, int]],
            sent: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The figures every campaign reports: kills by target, what the outputs lost or got
    twice against the failure-free run (every message on the output topics counted), the
    recovery percentiles and the moved jobs that parked and resumed in their drivers
    (``resumed_in_place``)."""
    recoveries = sorted(k["recovery_s"] for k in kills if k.get("recovery_s") is not None)
    by_target: dict[str, int] = {}
    for k in kills:
        by_target[k["target"]] = by_target.get(k["target"], 0) + 1
    return {
        "kills": len(kills), "kills_by_target": by_target,
        "lost": sum(v["lost"] for v in report.values()),
        "duplicated": sum(v["duplicated"] for v in report.values())
                      + sum(t["resent_same_generation"] for t in sent.values()),
        "changed_on_resend": sum(t["changed"] for t in sent.values()),
        "recovery_s_p50": statistics.median(recoveries) if recoveries else None,
        "recovery_s_p95": p95(recoveries),
        # moved jobs that parked for the rollback and resumed in their warm drivers
        "resumed_in_place": sum(len(k.get("resumed_in_place", [])) for k in kills),
        "outputs_differ": sorted(k for k, v in report.items() if v["lost"] or v["duplicated"]),
    }


def _parts_median(kills: list[dict[str, Any]]) -> dict[str, float]:
    """Per part of a recovery (detect, rollback, start, catch-up), its median over kills."""
    names = sorted({n for k in kills for n in k.get("parts", {})})
    return {n: round(statistics.median(vs), 2) for n in names
            if (vs := [k["parts"][n] for k in kills if n in k.get("parts", {})])}


def p95(ordered: list[float]) -> float | None:
    """The 95th percentile of sorted values (the nearest rank at or above), None if none."""
    return ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))] if ordered else None


def parts_of_the_slowest(kills: list[dict[str, Any]]) -> dict[str, float]:
    """:func:`_parts_median` over the slowest twentieth of the recovered kills."""
    recoveries = sorted(k["recovery_s"] for k in kills if k.get("recovery_s") is not None)
    cut = recoveries[int(0.95 * (len(recoveries) - 1))] if recoveries else 0
    return _parts_median([k for k in kills
                          if k.get("recovery_s") is not None and k["recovery_s"] >= cut])


def campaign(workdir: Path, minutes: float, seed: int, data: dict[str, int],
             say: Callable[[str], None],
             golden: dict[str, Any] | None = None, cluster: bool = False) -> dict[str, Any]:
    """Run the campaign; its figures (see the module docstring). ``golden``: the
    failure-free run's outputs of the same input when the caller has them already (the
    tests share one), else the campaign makes that run first (on the embedded defaults).
    ``cluster``: the run under faults on the local cluster, with its infrastructure among
    the targets."""
    import contextlib

    from falkirk.local.broker import LocalBroker
    from falkirk_dev.harness import LocalRun, compare, profile

    last = data["epochs"] - 1
    if golden is None:
        golden = failure_free(workdir, data, say)

    rng = random.Random(seed)
    t_start = time.monotonic()
    with contextlib.ExitStack() as stack:
        if cluster:
            from falkirk_dev import cluster as local_cluster

            say(f"on the local cluster: {local_cluster.engines()}")
            stack.enter_context(profile("cluster"))
            broker = local_cluster.ClusterKafka("reference").start()
        else:
            broker = stack.enter_context(LocalBroker(workdir / "chaos" / "broker"))
        run = stack.enter_context(LocalRun(workdir / "chaos", broker=broker))
        if cluster:  # a recovery there took over 5 min (JVMs, executors, S3 round trips):
            run.idle_timeout_s = 1800.0  # its readers wait for it instead of failing too
        run.generate(**data)
        run.start(until_epoch=last)
        c = Campaign(run, broker, rng, say, cluster=cluster)
        end = t_start + minutes * 60
        while time.monotonic() < end and not _all_done(run):
            if run.failed_jobs():
                c.recover()
            else:
                c.strike()
        say("no more faults: running to the end of the input")
        while not _all_done(run):  # a death between the last strike and now
            if run.failed_jobs():
                c.recover()
                continue
            if time.monotonic() > end + 3600:
                c.stuck += 1
                break
            time.sleep(POLL_S)
        minutes_run = (time.monotonic() - t_start) / 60
        report = compare(golden, run.outputs())
        sent = run.sent()
    counted = [k for k in c.kills if k.get("counted", True)]
    return {
        **outcome(counted, report, sent), "rollbacks": c.rollbacks, "stuck": c.stuck,
        # the median of each part of a recovery, and of the slowest twentieth's
        "recovery_parts_s_p50": _parts_median(counted),
        "recovery_parts_s_slowest": parts_of_the_slowest(counted),
        "minutes": round(minutes_run, 1), "seed": seed, "input": data,
        "engines": "cluster" if cluster else "local",
        "infrastructure_faults_that_failed_a_job": sum(
            1 for k in counted if k.get("failed_a_job")),
        "sent": sent, "events": c.kills,
    }


def failure_free(workdir: Path, data: dict[str, int], say: Callable[[str], None],
                 keep: Path | None = None) -> dict[str, Any]:
    """The failure-free run's outputs of ``data``, on the embedded defaults. ``keep``: a
    file that holds them for this input (read, not run again), or where to write them."""
    from falkirk_dev.harness import profile

    if keep is not None and keep.exists():
        kept = json.loads(keep.read_text())
        if kept.get("input") == data:
            say(f"failure-free run's outputs read from {keep}")
            return kept["outputs"]
        say(f"{keep} holds the outputs of another input ({kept.get('input')}): running")
    t0 = time.monotonic()
    with profile("local"):
        golden = golden_run(workdir / "golden", data, timeout_s=3600)
    say(f"failure-free run done in {time.monotonic() - t0:.0f} s")
    shutil.rmtree(workdir / "golden", ignore_errors=True)
    if keep is not None:
        keep.parent.mkdir(parents=True, exist_ok=True)
        keep.write_text(json.dumps({"input": data, "outputs": golden}, default=str))
        golden = json.loads(keep.read_text())["outputs"]  # as a later campaign reads it
    return golden


GOAL_S = 30.0  # issue 15: recovery p95 within 30 s


def recovery_svg(result: dict[str, Any]) -> str:
    """Each kill's recovery against the minute of its kill, by target, with the 30-s goal:
    where the slow recoveries fall in a campaign (early, clustered, one target) shows
    there and not in its percentiles. A kill that never recovered is left out (the
    title counts it)."""
    from falkirk_dev.plot import lines_svg

    kills = result.get("events") or []
    start = min((k["at"] for k in kills), default=0.0)
    series: dict[str, list[tuple[float, float]]] = {}
    for k in sorted(kills, key=lambda k: k["at"]):
        if k.get("recovery_s") is not None:
            series.setdefault(k["target"], []).append(
                (round((k["at"] - start) / 60, 2), float(k["recovery_s"])))
    missing = sum(1 for k in kills if k.get("recovery_s") is None)
    title = (f"recovery of each of {len(kills)} kills, by target (p50 "
             f"{result.get('recovery_s_p50')} s, p95 {result.get('recovery_s_p95')} s"
             + (f"; {missing} not recovered" if missing else "") + ")")
    last = max((x for pts in series.values() for x, _ in pts), default=0.0)
    return lines_svg(title, "minutes since the first kill", "seconds to recover", series,
                     x_ticks=[0.0, last], join=False, guide=(f"goal {GOAL_S:.0f} s", GOAL_S),
                     width=720)


def main(args: Namespace) -> int:
    """Run a campaign; 0 when nothing was lost, duplicated or stuck."""
    from rich.console import Console

    console = Console()
    if getattr(args, "every", None) is not None and not getattr(args, "airflow", False):
        console.print("[red]--every is for the campaign under Airflow (--airflow): without "
                      "it the campaign recovers each death itself, one at a time")
        return 2
    rate = getattr(args, "rate", None)
    if rate is not None and (not getattr(args, "airflow", False) or not rate > 0):
        console.print(f"[red]--rate {rate}: " + ("must be above 0 records/s" if
                      getattr(args, "airflow", False) else "is for the campaign under "
                      "Airflow (--airflow)"))
        return 2
    targets = getattr(args, "targets", None)
    if targets is not None:
        from falkirk_dev.chaos_airflow import ENGINE
        from falkirk_dev.chaos_airflow import TARGETS as AIRFLOW_TARGETS

        unknown = sorted(set(targets.split(",")) - {*AIRFLOW_TARGETS, ENGINE})
        if unknown or not getattr(args, "airflow", False):
            console.print(f"[red]--targets {targets}: " + (
                f"unknown target(s) {', '.join(unknown)} (known: "
                f"{', '.join((*AIRFLOW_TARGETS, ENGINE))})" if unknown
                else "is for the campaign under Airflow (--airflow)"))
            return 2
    data = input_of(int(args.events), int(args.epochs))
    given = getattr(args, "workdir", None)
    workdir = Path(given) if given else Path(tempfile.mkdtemp(prefix="falkirk-chaos-"))
    workdir.mkdir(parents=True, exist_ok=True)
    console.print(f"[bold]fault campaign[/]: {args.minutes} min, seed {args.seed}, input "
                  f"{json.dumps(data)}; sandboxes under {workdir}")
    t0 = time.monotonic()

    def say(m: str) -> None:
        console.log(f"[{(time.monotonic() - t0) / 60:5.1f} min] {m}")

    keep = Path(args.golden) if getattr(args, "golden", None) else None
    if getattr(args, "airflow", False):
        from falkirk_dev.chaos_airflow import airflow_campaign

        golden = failure_free(workdir, data, say, keep)
        result = airflow_campaign(workdir, float(args.minutes), int(args.seed), data, console,
                                  golden,
                                  targets=tuple(targets.split(",")) if targets else None,
                                  every_s=getattr(args, "every", None), rate=rate)
    else:
        result = campaign(workdir, float(args.minutes), int(args.seed), data, say,
                          golden=failure_free(workdir, data, say, keep),
                          cluster=bool(getattr(args, "cluster", False)))
    summary = {k: v for k, v in result.items() if k not in ("sent", "events")}
    console.print_json(json.dumps(summary))
    if args.json:
        from falkirk_dev.bench.figures import write_figure

        write_figure(args.json, result)  # with its provenance: the docs quote it
        Path(args.json).with_suffix(".svg").write_text(recovery_svg(result))
        console.print(f"written: {args.json} (and its chart, "
                      f"{Path(args.json).with_suffix('.svg')})")
    ok = result["lost"] == result["duplicated"] == result["stuck"] == 0
    return 0 if ok else 1
