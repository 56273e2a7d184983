"""``falkirk chaos --airflow``: the fault campaign with Airflow doing the recovery.

Where :mod:`falkirk_dev.chaos` recovers each death itself (as the supervisor's ``recover``
would), here a local Airflow (``bin/airflow``, LocalExecutor) runs the reference pipeline:
the streams DAG starts, watches and recovers the stream jobs, the batch DAG runs popularity
once per epoch. The campaign only breaks things, at moments drawn from ``--seed``:

* ``job``: SIGKILL of a random stream job's process group;
* ``scheduler``: SIGKILL of Airflow's scheduler with its executor and the task processes
  it runs, then of a stream job while it is down; a few seconds later the scheduler is
  started again (``bin/airflow respawn scheduler``). The triggerer is still up, so the
  death is seen at once, but nothing is scheduled until the scheduler is back;
* ``broker``: the Apache Kafka broker SIGKILLed and started again on its ports.

Recovery is from the kill to when every region the supervisor's rollback moved has
committed an epoch in its generation (or its job finished at the end of its input); for
``broker``, to the pipeline's next commit. At the end the pipeline runs to the end of its
input and every output and every message on the output topics is compared with a
failure-free run of the same input, as in the campaign without Airflow. As in the
demo, the data checks run once at the end (the stream checks DAG stays paused and each
batch run's data_checks task is marked skipped): on 2 cores they cost more than the jobs.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

TARGETS = ("job", "scheduler", "broker")
RECOVERY_TIMEOUT_S = 600.0
POLL_S = 0.5


def scheduler_processes(home: Path) -> list[int]:
    """The pids of Airflow's scheduler under ``home`` and of everything it runs in its
    session (LocalExecutor workers, their task processes); stream jobs, in sessions of
    their own, are not among them."""
    import psutil

    from falkirk.runtime.procs import session_of

    sessions = {int(f.read_text()) for f in [home / "airflow.pid", *home.glob("*.pgid")]
                if f.exists() and f.read_text().strip()}
    tops = []
    for p in psutil.process_iter(["cmdline", "pid"]):
        cmd = p.info["cmdline"] or []
        try:
            if ("scheduler" in cmd and any(c.endswith("/airflow") for c in cmd)
                    and session_of(p.pid) in sessions):
                tops.append(p)
        except (ProcessLookupError, psutil.Error):
            continue
    out: list[int] = []
    for top in tops:
        try:
            sid = session_of(top.pid)
            out.append(top.pid)
            out.extend(c.pid for c in top.children(recursive=True)
                       if session_of(c.pid) == sid)
        except (ProcessLookupError, psutil.Error):
            continue
    return sorted(set(out))


class AirflowCampaign:
    """The run under Airflow, the random draws, what happened."""

    def __init__(self, demo, rng: random.Random, say: Callable[[str], None],
                 targets: tuple[str, ...] = TARGETS):
        self.demo, self.rng, self.say = demo, rng, say
        self.targets = targets
        self.kills: list[dict[str, Any]] = []
        self.stuck = 0
        self.seen_rollbacks = 0
        self._asked = 0.0

    @property
    def run(self):
        return self.demo.run

    def stream_jobs_alive(self) -> list[dict]:
        from falkirk.airflow import streams
        from falkirk.runtime import procs

        jobs = streams.stream_jobs(self.run.pipeline)
        return [i for i in procs.running(self.run.pipeline, self.run.cfg) if i["job"] in jobs]

    def all_done(self) -> bool:
        """Every region committed the last epoch (the input is done)."""
        last = self.demo.epochs - 1
        committed = {n: max((e for e in d), default=-1)
                     for n, (d, _) in self.demo.progress(airflow=False)["regions"].items()}
        return all(e >= last for e in committed.values())

    def tick(self) -> None:
        """Every 5 s: Airflow's runs, as the demo reads them. It marks each new batch
        run's data_checks skipped (the checks run once at the end, as in the demo; the
        stream checks DAG stays paused) and fails the campaign on a failed run or task."""
        if time.monotonic() - self._asked < 5.0:
            return
        self._asked = time.monotonic()
        self.demo.check_failures(self.demo.progress(airflow=True))

    def pause(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.tick()
            time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))

    # -- faults ---------------------------------------------------------------------------

    def strike(self) -> None:
        """Wait a random moment, then break something (the target drawn from the seed)."""
        self.pause(self.rng.uniform(1.0, 8.0))
        target = self.rng.choice(self.targets)
        if target == "broker":
            t = time.monotonic()
            self.demo.broker.restart(crash=True)
            self.kills.append({"target": "broker", "at": t})
            self.say("broker SIGKILLed and started again")
            self._wait_any_commit(t)
            return
        alive = self.stream_jobs_alive()
        if not alive:
            return  # between a death and its restart, or the streams ended
        victim = self.rng.choice(alive)
        t = time.monotonic()
        down_s = None
        if target == "scheduler":
            pids = scheduler_processes(self.demo.home)
            for pid in pids:
                _kill(pid)
            self.say(f"Airflow's scheduler SIGKILLed ({len(pids)} processes with its "
                     f"executor and tasks)")
        _kill_group(victim["pgid"])
        self.say(f"{Path(victim['job']).stem} SIGKILLed")
        if target == "scheduler":
            time.sleep(self.rng.uniform(2.0, 6.0))  # nothing asks Airflow meanwhile
            done = self.demo.bin_airflow("respawn", "scheduler", timeout=60)
            if done.returncode != 0:
                raise RuntimeError(f"bin/airflow respawn scheduler failed: {done.stderr}")
            down_s = time.monotonic() - t
            self.say(f"scheduler started again after {down_s:.1f} s")
        kill = {"target": target, "job": victim["job"], "at": t}
        if down_s is not None:
            kill["scheduler_down_s"] = round(down_s, 2)
        self.kills.append(kill)
        self._wait_recovered(kill, set(victim["regions"]))

    # -- recovery -------------------------------------------------------------------------

    def _new_rollback(self, regions: set[str]) -> dict | None:
        """The first finished rollback since the last one seen that names a dead region."""
        done = [r for r in self.run.log.rollbacks(self.run.pipeline.name)
                if r["status"] == "done"]
        for r in done[self.seen_rollbacks:]:
            if set(r["request"].get("failed") or []) & regions:
                self.seen_rollbacks = done.index(r) + 1
                return r
        return None

    def _watched(self, plan: dict) -> set[str]:
        """The regions whose next commit ends the recovery: the moved stream regions, and
        the batch regions whose epochs the rollback reran."""
        pipe = self.run.pipeline
        moved = {r for r, f in plan["frontiers"].items() if f != "top"}
        rerun = {i["region"] for i in plan["invalidate"]}
        return {r for r in moved if not pipe.regions[r].regime_rules.runs_per_epoch
                or r in rerun}

    def _back(self, regions: set[str], generation: int) -> set[str]:
        """Regions with a commit in ``generation`` (or later), or whose job finished at the
        end of its input in it."""
        from falkirk.runtime.procs import jobs_of

        out = {r for r, rlog in self.run.log.regions(self.run.pipeline).items()
               if r in regions and any(row.generation >= generation and row.status != "running"
                                       for row in rlog.entries.values())}
        runs = self.run.log.job_runs(self.run.pipeline.name)
        for job, hosted in jobs_of(self.run.pipeline).items():
            row = runs.get(job) or {}
            if (row.get("status") == "finished" and row.get("exit_code") == 0
                    and (row.get("generation") or 0) >= generation):
                out |= set(hosted) & regions
        return out

    def _wait_recovered(self, kill: dict[str, Any], dead: set[str]) -> None:
        deadline = time.monotonic() + RECOVERY_TIMEOUT_S
        rollback = None
        while time.monotonic() < deadline:
            if rollback is None:
                rollback = self._new_rollback(dead)
                if rollback is not None:
                    kill["rollback_done_s"] = round(time.monotonic() - kill["at"], 2)
                    kill["generation"] = rollback["plan"]["generation"]
            if rollback is not None:
                plan = rollback["plan"]
                watched = self._watched(plan)
                if self._back(watched, plan["generation"]) >= watched:
                    kill["recovery_s"] = round(time.monotonic() - kill["at"], 2)
                    self.say(f"recovered in {kill['recovery_s']:.1f} s (the supervisor's "
                             f"rollback after {kill['rollback_done_s']:.1f} s, generation "
                             f"{plan['generation']})")
                    return
            self.pause(POLL_S)
        kill["recovery_s"] = None
        self.stuck += 1
        self.say(f"[red]stuck: {sorted(dead)} not recovered within "
                 f"{RECOVERY_TIMEOUT_S:.0f} s")

    def _wait_any_commit(self, t_kill: float) -> None:
        before = len(self.run.log.records(self.run.pipeline.name))
        deadline = time.monotonic() + RECOVERY_TIMEOUT_S
        while time.monotonic() < deadline:
            if len(self.run.log.records(self.run.pipeline.name)) > before or self.all_done():
                self.kills[-1]["recovery_s"] = round(time.monotonic() - t_kill, 2)
                return
            self.pause(POLL_S)
        self.kills[-1]["recovery_s"] = None
        self.stuck += 1


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _kill_group(pgid: int) -> None:
    from falkirk.runtime import procs

    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 30
    while procs.group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)


def airflow_campaign(workdir: Path, minutes: float, seed: int, data: dict[str, int],
                     console, golden: dict[str, Any], standby: int = 0,
                     targets: tuple[str, ...] = TARGETS, strikes: int | None = None
                     ) -> dict[str, Any]:
    """Run the campaign under Airflow; its figures (the keys of the campaign without
    Airflow, plus each kill's ``rollback_done_s``: the supervisor's part). ``targets`` and
    ``strikes`` (at most that many) narrow it for CI's short variant."""
    from falkirk_dev.chaos import outcome
    from falkirk_dev.demo.airflow import AirflowDemo
    from falkirk_dev.harness import compare

    t0 = time.monotonic()

    def say(m: str) -> None:
        console.log(f"[{(time.monotonic() - t0) / 60:5.1f} min] {m}")

    demo = AirflowDemo(workdir, console, keep_airflow=False, live_checks=False, port=None,
                       timeout_s=RECOVERY_TIMEOUT_S * 3, data=data,
                       standby=standby or None)
    demo.sandbox = workdir / "chaos-airflow"
    demo.clean()
    failed = True
    try:
        demo.start_sandbox()
        demo.start_airflow()
        demo.unpause()
        c = AirflowCampaign(demo, random.Random(seed), say, targets)
        demo.wait("waiting for the stream jobs to start…",
                  lambda p: len(c.stream_jobs_alive()) == 3, interval=1)
        t_start = time.monotonic()
        end = t_start + minutes * 60
        while (time.monotonic() < end and not c.all_done()
               and (strikes is None or len(c.kills) < strikes)):
            c.strike()
        say("no more faults: running to the end of the input")
        demo.until_done()
        minutes_run = (time.monotonic() - t_start) / 60
        demo.end_supervision()
        report = compare(golden, demo.run.outputs())
        sent = demo.run.sent()
        failed = False
    finally:
        demo.shutdown(failed)
    jobs = [k for k in c.kills if k["target"] != "broker" and "rollback_done_s" in k]
    return {
        **outcome(c.kills, report, sent), "stuck": c.stuck,
        "rollbacks": len([r for r in demo.run.log.rollbacks(demo.run.pipeline.name)
                          if r["status"] == "done"]),
        # the supervisor's part: kill -> its rollback done (detection, scheduling, rollback)
        "rollback_done_s_p50": (statistics.median(k["rollback_done_s"] for k in jobs)
                                if jobs else None),
        "minutes": round(minutes_run, 1), "seed": seed, "input": data,
        "standby_drivers": standby, "engines": "local", "airflow": True,
        "sent": sent, "events": c.kills,
    }

