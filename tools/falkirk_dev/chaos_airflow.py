"""``falkirk chaos --airflow``: the fault campaign with Airflow doing the recovery.

Where :mod:`falkirk_dev.chaos` recovers each death itself (as the supervisor's ``recover``
would), here a local Airflow (``bin/airflow``, LocalExecutor) runs the reference pipeline:
the streams DAG starts, watches and recovers the stream jobs, the batch DAG runs popularity
once per epoch. Once every region has committed an epoch (the pipeline is running; a kill
before it would time the jobs' cold first epochs, not a recovery) the campaign only breaks
things, at moments drawn from ``--seed``:

* ``job``: SIGKILL of a random stream job's process group;
* ``scheduler``: SIGKILL of Airflow's scheduler with its executor and the task processes
  it runs, then of a stream job while it is down; a few seconds later the scheduler is
  started again (``bin/airflow respawn scheduler``). The triggerer is still up, so the
  death is seen at once, but nothing is scheduled until the scheduler is back;
* ``broker``: the Apache Kafka broker SIGKILLed and started again on its ports.

Recovery is from the kill to when every region the supervisor's rollback moved has
committed an epoch in its generation (or its job finished at the end of its input); for
``broker``, to the pipeline's next commit. A kill not recovered within
:data:`RECOVERY_TIMEOUT_S` is stuck; it is still watched, and when it does recover its time
counts in the percentiles like any other (``stuck_recovered_later``); one not recovered
that long after the strikes ended never recovers (``never_recovered``). At the end the
pipeline runs to the end of its input and every output and every message on the output
topics is compared with a failure-free run of the same input, as in the campaign without
Airflow. As in the demo, the data checks run once at the end (the stream checks DAG stays
paused and each batch run's data_checks task is marked skipped): on 2 cores they cost more
than the jobs.
"""

from __future__ import annotations

import collections
import contextlib
import os
import random
import signal
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

TARGETS = ("job", "scheduler", "broker")
#: With the profile's own Spark Connect engine (falkirk.runtime.engine) it is a target too:
#: every job's session dies with it.
ENGINE = "engine"


def default_targets() -> tuple[str, ...]:
    """What a campaign breaks: jobs, the scheduler, the broker, and the engine when the
    profile runs one."""
    from falkirk.config import load

    cfg = load()
    return (*TARGETS, ENGINE) if cfg.spark_remote and cfg.local_engine else TARGETS
RECOVERY_TIMEOUT_S = 600.0
POLL_S = 0.5
DURABLE = ("committed", "checkpointed")  # the statuses that end a recovery


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
    """The run under Airflow, the random draws, what happened.

    Strikes come on a clock (:meth:`step`): by default the next one waits until every
    earlier kill has recovered (then 1-8 s more); with ``every_s`` one comes every
    ``every_s`` seconds on average (0.5-1.5 times it) whether or not the last ones have
    recovered, so kills land in the middle of recoveries: a restarted job still starting,
    a ``recover`` task in its rollback, the scheduler down while a job is dead. With
    ``mid_recovery`` a strike after the first comes as soon as the campaign sees a kill
    whose rollback is done and whose regions have not committed again: in the middle of
    a recovery by the epoch log's word, however fast recoveries are (a clock's gap can be
    longer than a recovery on a fast machine)."""

    def __init__(self, demo, rng: random.Random, say: Callable[[str], None],
                 targets: tuple[str, ...] = TARGETS, every_s: float | None = None,
                 mid_recovery: bool = False):
        self.demo, self.rng, self.say = demo, rng, say
        self.targets = targets
        self.every_s = every_s
        self.mid_recovery = mid_recovery
        self.kills: list[dict[str, Any]] = []
        self.pending: list[dict[str, Any]] = []  # kills not recovered yet
        self._asked = 0.0
        self._settled = 0.0
        self.next_at = time.monotonic() + self._gap()
        self.respawn_at: float | None = None  # the scheduler is down until then

    @property
    def run(self):
        return self.demo.run

    def pipeline_running(self, progress: dict[str, Any]) -> bool:
        """Every region of the pipeline committed an epoch. Strikes begin then: a kill
        before it would time the pipeline's start (every job's cold first epoch, 25 s and
        more on 2 cores), not a recovery."""
        regions = progress.get("regions", {})
        return all(regions.get(name, ((), ()))[0] for name in self.run.pipeline.regions)

    def begin(self) -> None:
        """The pipeline is running: the first strike comes one gap from now."""
        self.next_at = time.monotonic() + self._gap()

    def _gap(self) -> float:
        return (self.rng.uniform(1.0, 8.0) if self.every_s is None
                else self.rng.uniform(0.5, 1.5) * self.every_s)

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
        if time.monotonic() - self._asked < 5.0 or self.respawn_at is not None:
            return  # (nothing asks Airflow while its scheduler is down)
        self._asked = time.monotonic()
        self.demo.check_failures(self.demo.progress(airflow=True))

    def step(self) -> None:
        """One turn of the campaign: start the scheduler again when its time came, look at
        the pending recoveries, strike when the clock says so."""
        now = time.monotonic()
        if self.respawn_at is not None and now >= self.respawn_at:
            self._respawn()
        self.tick()
        self.settle()
        if self._due(now):
            self.strike()  # (the broker's restart takes seconds: the clock runs meanwhile)
            self.next_at = (now if self.every_s is not None else time.monotonic()) + self._gap()
        else:
            time.sleep(POLL_S)

    def _due(self, now: float) -> bool:
        """Whether the next strike comes now (see the class)."""
        if self.mid_recovery and self.kills:
            return any("rollback_done_s" in k for k in self.recovering())
        return now >= self.next_at and (self.every_s is not None or not self.recovering())

    @property
    def stuck(self) -> int:
        """Kills not recovered within :data:`RECOVERY_TIMEOUT_S` (some did later)."""
        return sum(1 for k in self.kills if k.get("stuck"))

    def recovering(self) -> list[dict[str, Any]]:
        """The pending kills not counted stuck yet (a strike without ``every_s`` waits for
        them, not for a stuck one)."""
        return [k for k in self.pending if not k.get("stuck")]

    def drain(self) -> None:
        """No more strikes: wait until every kill has recovered. A kill still not
        recovered :data:`RECOVERY_TIMEOUT_S` after the strikes ended never recovers (its
        pipeline stayed stopped): it keeps no recovery time and is counted in
        ``never_recovered``."""
        deadline = time.monotonic() + RECOVERY_TIMEOUT_S
        while self.pending or self.respawn_at is not None:
            if self.respawn_at is not None and time.monotonic() >= self.respawn_at:
                self._respawn()
            self.tick()
            self.settle()
            if time.monotonic() > deadline:
                for kill in self.pending:
                    kill["recovery_s"], kill["never_recovered"] = None, True
                    kill["stuck"] = True  # (also one struck just before the drain began)
                    self.say(f"[red]{kill.get('job', kill['target'])} killed at "
                             f"{kill['at'] - self.kills[0]['at']:.0f} s never recovered")
                self.pending.clear()
                break
            time.sleep(POLL_S)

    # -- faults ---------------------------------------------------------------------------

    def strike(self) -> None:
        """Break something (the target drawn from the seed)."""
        target = self.rng.choice(self.targets)
        log, name = self.run.log, self.run.pipeline.name
        before = {"records_before": len(log.records(name)), "wall": datetime.now(UTC),
                  "rollbacks_before": len(self._rollbacks_done())}
        if target == "broker":
            t = time.monotonic()
            self.demo.broker.restart(crash=True)
            self._kill_recorded({"target": "broker", "at": t, **before})
            self.say("broker SIGKILLed and started again")
            return
        alive = self.stream_jobs_alive()
        if not alive:
            return  # between a death and its restart, or the streams ended
        if target == ENGINE:
            from falkirk.runtime.engine import kill_local

            t = time.monotonic()
            if (pid := kill_local(self.run.cfg)) is None:
                return  # being started again after the last one
            self._kill_recorded({"target": ENGINE, "job": ENGINE, "at": t, "pid": pid,
                                 "regions": sorted(r for i in alive for r in i["regions"]),
                                 **before})
            self.say("the Spark engine SIGKILLed: every job's session is gone")
            return
        victim = self.rng.choice(alive)
        t = time.monotonic()
        kill: dict[str, Any] = {"target": target, "job": victim["job"], "at": t,
                                "regions": sorted(victim["regions"]), **before}
        if target == "scheduler" and self.respawn_at is None:
            pids = scheduler_processes(self.demo.home)
            for pid in pids:
                _kill(pid)
            self.say(f"Airflow's scheduler SIGKILLed ({len(pids)} processes with its "
                     f"executor and tasks)")
            self.respawn_at = t + self.rng.uniform(2.0, 6.0)
            self._down_since = t
        elif target == "scheduler":
            kill["target"] = "job"  # the scheduler is down already: only the job
        # what the job was in the middle of: one epoch, or the epochs of a pass
        from falkirk_dev.trials import running_epochs

        kill["running_epochs"] = {r: e for r in victim["regions"]
                                  if (e := running_epochs(self.run, r))}
        _kill_group(victim["pgid"])
        self.say(f"{Path(victim['job']).stem} SIGKILLed")
        self._kill_recorded(kill)

    def _kill_recorded(self, kill: dict[str, Any]) -> None:
        self.kills.append(kill)
        self.pending.append(kill)

    def _respawn(self) -> None:
        done = self.demo.bin_airflow("respawn", "scheduler", timeout=60)
        if done.returncode != 0:
            raise RuntimeError(f"bin/airflow respawn scheduler failed: {done.stderr}")
        down_s = time.monotonic() - self._down_since
        for k in self.kills:
            if k["target"] == "scheduler" and k["at"] == self._down_since:
                k["scheduler_down_s"] = round(down_s, 2)
        self.respawn_at = None
        self.say(f"scheduler started again after {down_s:.1f} s")

    # -- recovery -------------------------------------------------------------------------

    def _rollbacks_done(self) -> list[dict]:
        return [r for r in self.run.log.rollbacks(self.run.pipeline.name)
                if r["status"] == "done"]

    def _watched(self, plan: dict) -> set[str]:
        """The regions whose next commit ends the recovery: the moved stream regions, and
        the batch regions whose epochs the rollback reran."""
        pipe = self.run.pipeline
        moved = {r for r, f in plan["frontiers"].items() if f != "top"}
        rerun = {i["region"] for i in plan["invalidate"]}
        return {r for r in moved if not pipe.regions[r].regime_rules.runs_per_epoch
                or r in rerun}

    def _back(self, regions: set[str], generation: int, new: list, runs: dict,
              since: datetime) -> set[str]:
        """Regions with a commit (or checkpoint) in ``new`` (the epoch log's records since
        the kill) in ``generation`` or later, or whose job finished at the end of its input
        since then in it."""
        from falkirk.runtime.procs import jobs_of

        out = {r.region for r in new if r.region in regions and r.generation >= generation
               and r.status in DURABLE}
        for job, hosted in jobs_of(self.run.pipeline).items():
            row = runs.get(job) or {}
            if (row.get("status") == "finished" and row.get("exit_code") == 0
                    and (row.get("generation") or 0) >= generation
                    and row["recorded_at"] > since):
                out |= set(hosted) & regions
        return out

    def settle(self) -> None:
        """Each pending kill that has recovered gets its recovery time (the epoch log read
        once a second for all of them): from the kill to the next commit of every region
        it hit (a broker's: of any region) and, when a rollback named one of them as failed
        after the kill (the supervisor's watch, or its next run's start step), of every
        region that rollback moved, in its generation. A job killed before it wrote its
        start row did nothing yet: it is only started again, with no rollback."""
        if not self.pending or time.monotonic() - self._settled < 1.0:
            return
        self._settled = time.monotonic()
        log, name = self.run.log, self.run.pipeline.name
        rollbacks = self._rollbacks_done()
        records = log.records(name)
        runs = log.job_runs(name)
        now = time.monotonic()
        for kill in list(self.pending):
            new = records[kill["records_before"]:]
            if kill["target"] == "broker":
                back = (any(r.status in DURABLE for r in new)
                        or self.all_done())
            else:
                regions, generation = set(kill["regions"]), 0
                rollback = next((r for r in rollbacks[kill["rollbacks_before"]:]
                                 if set(r["request"].get("failed") or []) & regions), None)
                if rollback is not None:
                    kill.setdefault("rollback_done_s", round(now - kill["at"], 2))
                    plan = rollback["plan"]
                    kill["generation"] = generation = plan["generation"]
                    regions |= self._watched(plan)
                back = self._back(regions, generation, new, runs, kill["wall"]) >= regions
            if back:
                kill["recovery_s"] = round(now - kill["at"], 2)
                if kill["target"] != "broker":
                    kill["watched"] = sorted(regions)
                self.pending.remove(kill)
                what = (f" (the supervisor's rollback after {kill['rollback_done_s']:.1f} s, "
                        f"generation {kill['generation']})" if "generation" in kill
                        else "" if kill["target"] == "broker" else " (no rollback)")
                self.say(f"{kill.get('job', kill['target'])} killed at "
                         f"{kill['at'] - self.kills[0]['at']:.0f} s: recovered in "
                         f"{kill['recovery_s']:.1f} s{what}"
                         + (" [red](stuck)[/red]" if kill.get("stuck") else ""))
            elif now - kill["at"] > RECOVERY_TIMEOUT_S and not kill.get("stuck"):
                # Stuck, and still watched: when it does recover, its time counts in the
                # percentiles (leaving it out would flatter the p95).
                kill["stuck"] = True
                self.say(f"[red]stuck: {kill.get('job', kill['target'])} not recovered "
                         f"within {RECOVERY_TIMEOUT_S:.0f} s")
        if not self.recovering() and self.every_s is None:
            self.next_at = time.monotonic() + self._gap()


InputReady = Callable[[str, int], datetime | None]  # (topic, epoch) -> when complete


def _input_ready(first, records: list, pipeline, hit: set[str],
                 input_ready: InputReady | None) -> tuple[datetime | None, str | None]:
    """When what epoch record ``first`` committed reads was there, and what came last:
    the commits of upstream regions not in ``hit`` (a kill's recovery waits for those,
    it does not redo them) and, with a steady input, its topics' records of the epoch
    (``input_ready``: :meth:`falkirk_dev.harness.SteadyInput.ready_at`). None: nothing it
    reads came after its region was ready for it, as far as the log tells."""
    ready, waited_on = None, None
    for edge in pipeline.edges.values():
        if edge.dst != first.region or (edge.src is not None and edge.src in hit):
            continue
        if edge.src is None:  # an input topic
            if edge.kind != "kafka" or input_ready is None:
                continue
            when = input_ready(edge.topic, first.epoch)
            if when is not None and when <= first.recorded_at and (ready is None
                                                                    or when > ready):
                ready, waited_on = when, f"topic {edge.topic}"
            continue
        commits = [r.recorded_at for r in records
                   if r.region == edge.src and r.status in DURABLE
                   and r.epoch == first.epoch - edge.delay
                   and r.recorded_at <= first.recorded_at]
        if commits and (ready is None or max(commits) > ready):
            ready, waited_on = max(commits), edge.src
    return ready, waited_on


def recovery_parts(kill: dict[str, Any], records: list, job_runs: list[dict],
                   pipeline, input_ready: InputReady | None = None) -> dict[str, Any] | None:
    """Where one job kill's recovery went, from the epoch log after the run: the
    supervisor's part (``rollback_s``: to its rollback done), the restarted job's start
    (``start_s``: to its start row, the JVM and the Spark session), the time it then
    waited for an input (``waited_s``: until the upstream regions the kill did not hit had
    committed what the first epoch of its generation reads, and with a steady input until
    that epoch's records were produced, when they had not yet: no recovery, however fast,
    commits before its input is there) and the rest (``work_s``:
    the restore, the epochs redone, the commit), over the regions it watched (the first
    epoch each committed in the generation); None for a kill without a rollback or a
    recovery. The wait may overlap the restore: the rest is then a lower bound.
    ``resumed_in_place``: the jobs the rollback moved back that parked in their running
    drivers and resumed there (falkirk.runtime.park: a ``resumed`` row in the recovery)."""
    from falkirk.runtime.procs import jobs_of

    if kill.get("recovery_s") is None or "generation" not in kill:
        return None
    t_kill, g = kill["wall"], kill["generation"]
    watched = set(kill.get("watched", kill["regions"]))
    firsts = {}
    for r in records:
        if (r.region in watched and r.region not in firsts
                and r.status in DURABLE and r.generation >= g and r.recorded_at > t_kill):
            firsts[r.region] = r
    if not firsts:
        return None
    last = max(firsts.values(), key=lambda r: r.recorded_at)
    started = next((row["recorded_at"] for row in job_runs
                    if row["job"] == kill.get("job") and row["status"] == "started"
                    and row["generation"] >= g and row["recorded_at"] > t_kill), None)
    hit = set(watched)
    for hosted in jobs_of(pipeline).values():  # a job's regions feed each other in an epoch
        if hit & set(hosted):
            hit |= set(hosted)
    ready, waited_on = None, None
    for first in firsts.values():
        when, what = _input_ready(first, records, pipeline, hit, input_ready)
        if when is not None and (ready is None or when > ready):
            ready, waited_on = when, what
    total, rollback = kill["recovery_s"], kill.get("rollback_done_s", 0.0)
    start = (max(0.0, (started - t_kill).total_seconds() - rollback)
             if started is not None else 0.0)
    since = started if started is not None else t_kill
    waited = max(0.0, (ready - since).total_seconds()) if ready is not None else 0.0
    waited = min(waited, max(0.0, total - rollback - start))
    end = t_kill + timedelta(seconds=total)
    within = [row for row in job_runs  # the recovery's rows of its generation or later
              if row["generation"] >= g and t_kill < row["recorded_at"] <= end]
    resumed = sorted({row["job"] for row in within if row["status"] == "resumed"})
    return {"region": last.region, "epoch": last.epoch,
            "waited_on": waited_on if waited else None, "resumed_in_place": resumed,
            "rollback_s": round(rollback, 2), "start_s": round(start, 2),
            "waited_s": round(waited, 2),
            "work_s": round(max(0.0, total - rollback - start - waited), 2)}


def broker_wait(kill: dict[str, Any], records: list, pipeline,
                input_ready: InputReady | None) -> float:
    """Of a broker kill's recovery (to the next commit of any region), the time that
    commit's epoch waited for its input after the kill (see :func:`_input_ready`)."""
    first = next((r for r in records[kill["records_before"]:]
                  if r.status in DURABLE and r.recorded_at > kill["wall"]), None)
    if first is None or kill.get("recovery_s") is None:
        return 0.0
    ready, _ = _input_ready(first, records, pipeline, set(), input_ready)
    waited = (ready - kill["wall"]).total_seconds() if ready is not None else 0.0
    return round(min(kill["recovery_s"], max(0.0, waited)), 2)


def waited_s(kill: dict[str, Any]) -> float:
    """The part of a kill's recovery spent waiting for its input: a job kill's in its
    ``parts``, a broker kill's beside them (:func:`broker_wait`), else none."""
    return kill["parts"]["waited_s"] if "parts" in kill else kill.get("waited_s", 0.0)


def _profile(kills: list[dict[str, Any]], log, pipeline,
             input_ready: InputReady | None = None) -> dict[str, Any]:
    """Each job kill's ``parts`` (see :func:`recovery_parts`) and their medians, over all
    and over the slowest twentieth; the percentiles of recovery less the wait for inputs,
    over every recovered kill (a broker kill's: :func:`broker_wait`)."""
    from falkirk_dev.chaos import _parts_median, p95, parts_of_the_slowest

    records, runs = log.records(pipeline.name), log.job_run_rows(pipeline.name)
    for kill in kills:
        if (parts := recovery_parts(kill, records, runs, pipeline, input_ready)) is not None:
            kill["parts"] = {k: v for k, v in parts.items() if k.endswith("_s")}
            kill["recovered_by"] = {k: parts[k] for k in ("region", "epoch", "waited_on")}
            kill["resumed_in_place"] = parts["resumed_in_place"]
        elif kill["target"] == "broker":
            kill["waited_s"] = broker_wait(kill, records, pipeline, input_ready)
    timed = [k for k in kills if "parts" in k]
    own = sorted(round(k["recovery_s"] - waited_s(k), 2)
                 for k in kills if k.get("recovery_s") is not None)
    return {
        "recovery_parts_s_p50": _parts_median(timed),
        "recovery_parts_s_slowest": parts_of_the_slowest(timed),
        # a kill's recovery less the time it waited for inputs: from upstream regions it
        # did not hit, and with a steady input for records not produced yet (every
        # recovered kill; its p95 by the rule of recovery_s_p95, so the two compare)
        "recovery_less_waiting_s_p50": round(statistics.median(own), 2) if own else None,
        "recovery_less_waiting_s_p95": p95(own),
        "waited_on": dict(sorted(collections.Counter(
            k["recovered_by"]["waited_on"] for k in timed
            if k["recovered_by"]["waited_on"]).items())),
    }


def latency_after_kills(kills: list[dict[str, Any]], sent_at: dict[str, float],
                        answered: dict[str, float], epoch_s: float) -> dict[str, Any]:
    """With a steady input: the answers' latency (a query's due time to its first answer
    on ``responses``) over the run, and per kill how long after it the latency was back
    within 1.5 epochs for good before the next strike (``latency_back_s``: the p95 of
    every later 30-s window of queries at most 1.5 epochs; None: not before the next).
    Its p95 over the kills is the keep-up issue's "back within 1.5 epochs in ≤ 2 min"."""
    from falkirk_dev.bench.latency import back_within, percentiles
    from falkirk_dev.chaos import p95

    if not sent_at:
        return {}
    start = min(sent_at.values())
    points = sorted((t - start, max(0.0, answered[q] - t)) for q, t in sent_at.items()
                    if q in answered)
    strikes = sorted(k["wall"].timestamp() - start for k in kills if "wall" in k)
    for kill in kills:
        if "wall" not in kill:
            continue
        at = kill["wall"].timestamp() - start
        nxt = next((s for s in strikes if s > at), None)
        span = [p for p in points if nxt is None or p[0] < nxt]
        kill["latency_back_s"] = back_within(span, at, 1.5 * epoch_s)
    backs = sorted(k["latency_back_s"] for k in kills if k.get("latency_back_s") is not None)
    pct = percentiles([lat for _, lat in points], len(sent_at) - len(points))
    return {"latency_p50_s": pct["p50"], "latency_p95_s": pct["p95"],
            "latency_back_s_p95": p95(backs),
            "latency_not_back_before_next_strike": sum(
                1 for k in kills if "wall" in k and k.get("latency_back_s") is None)}


def kills_mid_pass(kills: list[dict[str, Any]]) -> int:
    """Job kills that landed in the middle of a multi-epoch pass: a region of the job had
    several epochs running (the pass's rows) when it was killed."""
    return sum(1 for k in kills
               if any(len(e) > 1 for e in (k.get("running_epochs") or {}).values()))


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
                     console, golden: dict[str, Any],
                     targets: tuple[str, ...] | None = None, strikes: int | None = None,
                     every_s: float | None = None, mid_recovery: bool = False,
                     rate: float | None = None) -> dict[str, Any]:
    """Run the campaign under Airflow; its figures (the keys of the campaign without
    Airflow, plus each kill's ``rollback_done_s``: the supervisor's part). ``targets`` and
    ``strikes`` (at most that many) narrow it for CI's short variant; ``every_s``: strikes
    on a clock, not waiting for recovery; ``mid_recovery``: each strike after the first
    once a kill's rollback is done and before it recovered (see :class:`AirflowCampaign`);
    ``rate``: the input produced at that many records/s while the pipeline runs
    (:class:`~falkirk_dev.harness.SteadyInput`), else all of it before it starts."""
    from falkirk.config import load
    from falkirk_dev.chaos import outcome
    from falkirk_dev.demo.airflow import AirflowDemo
    from falkirk_dev.harness import compare, input_as_stored

    t0 = time.monotonic()

    def say(m: str) -> None:
        console.log(f"[{(time.monotonic() - t0) / 60:5.1f} min] {m}")

    demo = AirflowDemo(workdir, console, keep_airflow=False, live_checks=False, port=None,
                       timeout_s=RECOVERY_TIMEOUT_S * 3, data=data,
                       rate=rate)
    demo.sandbox = workdir / "chaos-airflow"
    demo.clean()
    failed = True
    try:
        demo.start_sandbox()
        demo.start_airflow()
        demo.unpause()
        targets = targets or default_targets()
        c = AirflowCampaign(demo, random.Random(seed), say, targets, every_s, mid_recovery)
        demo.wait("waiting for the stream jobs to start…",
                  lambda p: len(c.stream_jobs_alive()) == 3, interval=1)
        demo.wait("waiting for every region's first epoch (strikes begin on a running "
                  "pipeline)…", c.pipeline_running, interval=1)
        c.begin()
        t_start = time.monotonic()
        end = t_start + minutes * 60
        looked, done = 0.0, False
        while (time.monotonic() < end and not done
               and (strikes is None or len(c.kills) < strikes)):
            c.step()
            if time.monotonic() - looked > 5.0:  # the epoch log read every 5 s, not per step
                looked, done = time.monotonic(), c.all_done()
        say(f"no more faults ({len(c.kills)} kills); waiting for the {len(c.pending)} "
            f"not recovered yet, then running to the end of the input")
        c.drain()
        # what is left of the input runs at the failure-free pace: allow 60 s an epoch
        demo.until_done(timeout_s=max(demo.timeout_s, 60.0 * demo.epochs))
        minutes_run = (time.monotonic() - t_start) / 60
        demo.end_supervision()
        profiled = _profile(c.kills, demo.run.log, demo.run.pipeline,
                            demo.steady.ready_at if demo.steady is not None else None)
        outputs, stored = demo.run.outputs(), None
        if demo.steady is not None:  # produced while the broker was killed: as stored?
            stored = input_as_stored(demo.run.cfg.kafka_bootstrap, demo.steady.sent_records)
            pipeline = demo.run.pipeline
            for edge in filter(None, map(pipeline.dead_letter_edge, pipeline.regions)):
                outputs[edge.table] = stored.as_sent(outputs.get(edge.table, []))
        report = compare(golden, outputs)
        sent = demo.run.sent()
        latency = {}
        if demo.steady is not None:  # how long after each kill the answers were late
            from falkirk_dev.bench.latency import answer_times

            latency = latency_after_kills(
                c.kills, demo.steady.query_times(),
                answer_times(demo.run.cfg.kafka_bootstrap, "responses"),
                float(demo.run.pipeline.settings["epoch_seconds"]))
        failed = False
    finally:
        demo.shutdown(failed)
    jobs = [k for k in c.kills if k["target"] != "broker" and "rollback_done_s" in k]
    return {
        **outcome(c.kills, report, sent), "stuck": c.stuck,
        # of the stuck: recovered later (their times are in the percentiles), or never
        "stuck_recovered_later": sum(1 for k in c.kills if k.get("stuck")
                                     and k.get("recovery_s") is not None),
        "never_recovered": sum(1 for k in c.kills if k.get("never_recovered")),
        "kills_mid_pass": kills_mid_pass(c.kills),
        "rollbacks": len([r for r in demo.run.log.rollbacks(demo.run.pipeline.name)
                          if r["status"] == "done"]),
        # the supervisor's part: kill -> its rollback done (detection, scheduling, rollback)
        "rollback_done_s_p50": (statistics.median(k["rollback_done_s"] for k in jobs)
                                if jobs else None),
        **profiled, **latency,
        "minutes": round(minutes_run, 1), "seed": seed, "input": data,
        "engines": "local", "airflow": True, "park_moved_jobs": load().park_moved_jobs,
        "strike_every_s": every_s, "input_rate": rate,
        "targets": list(targets), "spark_remote": load().spark_remote or None,
        # input records the broker stored twice (their dead letters compared as sent), and
        # records sent that the input topics lack (None: produced before the pipeline ran)
        "input_stored_twice": None if stored is None else stored.stored_twice,
        "input_stored_twice_at": None if stored is None else {
            f"{t}-{p}": offsets for (t, p), offsets in sorted(stored.extra.items())},
        "input_missing": None if stored is None else stored.missing,
        "sent": sent, "events": c.kills,
    }

