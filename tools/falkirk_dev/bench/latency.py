"""Latency at a steady rate, and catch-up after an outage: from a query's production to its
answer on ``responses``.

The reference pipeline runs as it is deployed (every job its own process, a client of the
engine, the local broker); once every job has started (waiting for epoch 0), the input is
produced in real time at ``--rate`` events per second (and a tenth as many queries) for
``--minutes``: event time and wall time advance together, so epoch ``e`` closes
``epoch_seconds`` after it opened. A query's production time is when the producer sent it
(its place in the paced stream); its answer time is the Kafka timestamp of the first
``responses`` message with its ``query_id`` as key.

- ``falkirk bench latency --rate R --minutes M --json OUT``: p50, p95 and p99 in seconds
  and epochs, and ``growth``: the p95 of the queries produced in the last third of the run
  over that of the first third (a pipeline that keeps up stays near 1). The ``M`` minutes
  measured follow ``--warmup-minutes`` (default 2) of input at the same rate, whose
  latencies are reported apart (``warmup_p95_s``): the start of a cold engine and jobs.
- ``falkirk bench catchup --rate R --outage-minutes O --json OUT``: after the first
  ``--minutes`` (default 2) every job is killed and stays down for ``O`` minutes while the
  input keeps coming; then the jobs are rolled back and started again (what the streams
  supervisor does), and the run goes on until every answer is in. Reports how long after
  the restart the latency is back within 1.5 epochs for good (the p95 of each 30 s of
  queries produced after it, from the first such window on), and the drain rate: events
  produced until then over the time it took.

A query not answered within ``--drain-minutes`` after the input ended counts as unanswered
(its latency is at least that: the percentiles it would change are None). The achieved
production rate is reported too: on 2 cores one Python producer may lag the rate asked.
"""

from __future__ import annotations

import heapq
import json
import math
import tempfile
import threading
import time
from argparse import Namespace
from pathlib import Path
from typing import Any

from falkirk_dev.bench import write_figures

USERS, ITEMS, CATEGORIES = 500, 200, 8
WINDOW_S = 30.0  # catch-up: the span of production time each p95 is taken over
# Latency: minutes of input before the measured ones. A deployed pipeline runs for days;
# its first epochs (a cold engine compiling, jobs catching up in passes from their start)
# are a start-up cost, reported apart (warmup_p95_s), not the steady latency.
WARMUP_MINUTES = 2.0


def percentiles(latencies: list[float], unanswered: int) -> dict[str, float | None]:
    """p50/p95/p99 of the latencies, the unanswered counted as longer than any: a
    percentile that falls among them is None (unknown, and longer than the run waited)."""
    ordered = sorted(latencies)
    n = len(ordered) + unanswered
    out: dict[str, float | None] = {}
    for q in (50, 95, 99):
        rank = math.ceil(q / 100 * n) - 1 if n else -1
        out[f"p{q}"] = ordered[rank] if 0 <= rank < len(ordered) else None
    return out


def answer_times(bootstrap: str, topic: str) -> dict[str, float]:
    """Per key, the Kafka timestamp (s) of its first message on ``topic``."""
    from falkirk_dev.harness import each_message

    out: dict[str, float] = {}
    for r in each_message(bootstrap, topic):
        key = r.key.decode()
        out[key] = min(out.get(key, math.inf), r.timestamp / 1000)
    return out


def _wait_started(run, jobs: list[str], timeout_s: float) -> None:
    """Until every job recorded its start in the epoch log (its session is up)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        runs = run.log.job_runs(run.pipeline.name)
        if all(runs.get(j, {}).get("status") in ("started", "resumed") for j in jobs):
            return
        dead = {j: p.returncode for j, p in run.procs.items() if p.poll() is not None}
        if dead:
            raise RuntimeError(f"jobs ended before the input began: {dead}; see "
                               f"{run.log_file(next(iter(dead)))}")
        time.sleep(0.5)
    raise RuntimeError(f"jobs not started after {timeout_s:.0f} s")


def live(rate: float, minutes: float, drain_s: float, console,
         outage: tuple[float, float] | None = None, logs_to: Path | None = None
         ) -> dict[str, Any]:
    """Run the deployed pipeline on input produced in real time; with ``outage=(at_s,
    for_s)`` kill every job ``at_s`` seconds into the input and start them again (after a
    rollback) ``for_s`` seconds later. Returns the queries' (produced, latency) points,
    the unanswered count and the run's facts."""
    from falkirk.io.kafka import ensure_topics
    from falkirk_dev import generate
    from falkirk_dev.harness import LocalRun

    # ignore_cleanup_errors: a killed job's last files can land while the folder goes
    # (a catch-up run crashed at its end on "Directory not empty" after its figures)
    with tempfile.TemporaryDirectory(prefix="falkirk-latency-",
                                     ignore_cleanup_errors=True) as tmp, \
            LocalRun(Path(tmp) / "live") as run:
        s = run.pipeline.settings
        epoch_s = float(s["epoch_seconds"])
        epochs = max(1, math.ceil(minutes * 60 / epoch_s))
        events = int(rate * epochs * epoch_s)
        with console.status(f"generating {events:,} events over {epochs} epochs…"):
            g = generate.generate_detailed(
                seed=19, events=events, queries=max(events // 10, 1), users=USERS,
                items=ITEMS, categories=CATEGORIES, origin_ms=int(s["origin_ms"]),
                epoch_ms=int(epoch_s * 1000), epochs=epochs, malformed_fraction=0.01,
                late_fraction=0.0)
        ensure_topics(run.cfg.kafka_bootstrap, {"events": generate.EVENT_PARTITIONS,
                                                "queries": generate.QUERY_PARTITIONS})
        with console.status("starting the jobs…"):
            run.start(until_epoch=epochs - 1)
            run.keep_house()  # compaction and garbage collection, as a deployment's watch
            _wait_started(run, list(run.jobs), 600)
        total = len(g.events) + len(g.queries)
        paced = total / (epochs * epoch_s)  # records/s: event time = wall time
        fed: dict[str, float] = {}

        def feed() -> None:
            fed["start"] = time.time()
            generate.produce(run.cfg.kafka_bootstrap, "events", "queries", g.events,
                             g.queries, rate=paced)
            fed["end"] = time.time()
            run.declare_bounds()  # the input ends here: the jobs end after its last epoch

        producer = threading.Thread(target=feed, daemon=True)
        restarted_at = None
        with console.status(f"{minutes:g} min of input in real time ({rate:,.0f} events/s, "
                            f"{paced:,.0f} records/s in all)…"):
            producer.start()
            if outage is not None:
                at_s, for_s = outage
                while "start" not in fed:
                    time.sleep(0.05)
                time.sleep(max(0.0, fed["start"] + at_s - time.time()))
                console.log(f"outage: every job killed, for {for_s / 60:g} min")
                run.stop_all()
                time.sleep(max(0.0, fed["start"] + at_s + for_s - time.time()))
                run.rollback(failed=list(run.pipeline.regions), reason="bench: outage")
                run.start()
                run.keep_house()  # stop_all ended it with the jobs
                restarted_at = time.time()
                console.log("outage over: jobs rolled back and started again")
            producer.join()
        with console.status("waiting for the last answers…"):
            try:
                codes = run.wait(timeout_s=drain_s)
            except Exception as exc:  # still running: what is answered by now counts
                codes = {"not finished": str(exc)}
                run.stop_all()
        answered = answer_times(run.cfg.kafka_bootstrap, "responses")
        if logs_to is not None:  # the jobs' own logs: where each epoch's time went
            import shutil

            shutil.rmtree(logs_to, ignore_errors=True)
            shutil.copytree(run.log_file(next(iter(run.jobs))).parent, logs_to)
            console.log(f"the jobs' logs: {logs_to}")
    # Production order is the merge by timestamp that produce() sends in, paced.
    merged = heapq.merge(((ts, 0, i) for i, (_, _, ts) in enumerate(g.events)),
                         ((ts, 1, i) for i, (_, _, ts) in enumerate(g.queries)))
    sent_at = {i: fed["start"] + n / paced for n, (_, stream, i) in enumerate(merged)
               if stream == 1}
    points, unanswered = [], 0
    for i, (_, value, _) in enumerate(g.queries):
        query_id = json.loads(value)["query_id"]
        if query_id in answered:
            points.append((sent_at[i] - fed["start"], max(0.0, answered[query_id] - sent_at[i])))
        else:
            unanswered += 1
    points.sort()
    produced_s = fed["end"] - fed["start"]
    return {"points": points, "unanswered": unanswered, "epoch_s": epoch_s, "epochs": epochs,
            "events": len(g.events), "queries": len(g.queries), "paced": paced,
            "produced_s": produced_s, "codes": codes,
            "restarted_s": None if restarted_at is None else restarted_at - fed["start"]}


def growth(points: list[tuple[float, float]], span_s: float) -> float | None:
    """p95 of the queries produced in the last third of the run over the first third's."""
    first = [lat for t, lat in points if t < span_s / 3]
    last = [lat for t, lat in points if t >= 2 * span_s / 3]
    p_first, p_last = percentiles(first, 0)["p95"], percentiles(last, 0)["p95"]
    if not p_first or p_last is None:
        return None
    return round(p_last / p_first, 3)


def back_within(points: list[tuple[float, float]], since_s: float, limit_s: float
                ) -> float | None:
    """Seconds after ``since_s`` until the p95 of every later window of
    :data:`WINDOW_S` of production time is at most ``limit_s``; None if never."""
    after = [(t, lat) for t, lat in points if t >= since_s]
    if not after:
        return None
    windows: list[tuple[float, float | None]] = []
    start = since_s
    while start <= after[-1][0]:
        lats = [lat for t, lat in after if start <= t < start + WINDOW_S]
        windows.append((start, percentiles(lats, 0)["p95"] if lats else None))
        start += WINDOW_S
    good_from = None
    for start, p95 in windows:
        if p95 is None:
            continue
        # a window over the limit starts the count again
        good_from = (good_from if good_from is not None else start) if p95 <= limit_s else None
    return None if good_from is None else round(good_from - since_s, 1)


def main(args: Namespace) -> dict:
    """``falkirk bench latency``."""
    from rich.console import Console

    from falkirk_dev.plot import lines_svg

    console = Console()
    rate = float(args.rate or 5000)
    minutes = float(args.minutes or 5)
    warmup = float(args.warmup_minutes if args.warmup_minutes is not None else WARMUP_MINUTES)
    started_at = time.time()
    got = live(rate, warmup + minutes, float(args.drain_minutes or 15) * 60, console,
               logs_to=_logs_folder(args))
    epoch_s, points = got["epoch_s"], got["points"]
    # The measured run: the queries produced after the warm-up, timed from its end.
    w0 = warmup * 60
    measured = [(t - w0, lat) for t, lat in points if t >= w0]
    pct = percentiles([lat for _, lat in measured], got["unanswered"])
    warming = percentiles([lat for t, lat in points if t < w0], 0)
    # The start: cold jobs and a cold engine fall behind on their first epochs and catch up
    # in passes. From when the latency is back within 1.5 epochs for good: the run as a
    # pipeline that has been running sees it.
    warm = back_within(points, 0.0, 1.5 * epoch_s)
    warm_pct = percentiles([lat for t, lat in points if warm is not None and t >= warm], 0)
    out: dict[str, Any] = {
        "rate": rate, "minutes": minutes, "epoch_seconds": epoch_s,
        "queries": len(measured) + got["unanswered"], "answered": len(measured),
        "p50_s": _round(pct["p50"]), "p95_s": _round(pct["p95"]), "p99_s": _round(pct["p99"]),
        "p95_epochs": None if pct["p95"] is None else round(pct["p95"] / epoch_s, 2),
        "growth": growth(measured, got["produced_s"] - w0),
        "warmup_minutes": warmup, "warmup_p95_s": _round(warming["p95"]),
        "warmup_p99_s": _round(warming["p99"]),
        "caught_up_after_s": warm, "p95_s_caught_up": _round(warm_pct["p95"]),
        "p95_epochs_caught_up": None if warm_pct["p95"] is None
        else round(warm_pct["p95"] / epoch_s, 2),
        "events": got["events"], "epochs": got["epochs"], "unanswered": got["unanswered"],
        "rate_achieved_events_per_s": round(got["events"] / got["produced_s"], 1),
        "producer_lag_s": round(got["produced_s"] - got["epochs"] * epoch_s, 1),
        "job_exit_codes": got["codes"], "seconds": round(time.time() - started_at, 1),
    }
    console.print(json.dumps(out, indent=1))
    console.print(f"latency at {rate:,.0f} events/s for {minutes:g} min after {warmup:g} min of "
                  f"warm-up (p95 then {out['warmup_p95_s']} s): p95 {out['p95_s']} s "
                  f"({out['p95_epochs']} epochs; goal ≤ 1.5), growth {out['growth']} "
                  f"(goal ≤ 1.2); caught up with its start after {warm} s, p95 from then "
                  f"{out['p95_s_caught_up']} s")
    if args.json:
        path = write_figures(args.json, out)
        folder = _logs_folder(args)
        if folder is not None:  # every query's (produced at, latency), beside the logs
            (folder / "points.json").write_text(json.dumps(points))
        step = max(1, len(points) // 400)  # at most ~400 points drawn
        path.with_suffix(".svg").write_text(lines_svg(
            f"falkirk latency: {rate:,.0f} events/s, {warmup:g} min warm-up + {minutes:g} min "
            "measured, query → answer",
            "seconds since the input began (when the query was produced)", "latency (s)",
            {"answer latency": points[::step]}, guide=("1.5 epochs", 1.5 * epoch_s)))
        console.print(f"JSON: {path}; plot: {path.with_suffix('.svg')}")
    return out


def catchup(args: Namespace) -> dict:
    """``falkirk bench catchup``."""
    from rich.console import Console

    from falkirk_dev.plot import lines_svg

    console = Console()
    rate = float(args.rate or 5000)
    outage_min = float(args.outage_minutes if args.outage_minutes is not None else 5)
    before_min = float(args.minutes or 2)
    after_min = float(args.after_minutes if args.after_minutes is not None else 4)
    started_at = time.time()
    got = live(rate, before_min + outage_min + after_min,
               float(args.drain_minutes or 15) * 60, console,
               outage=(before_min * 60, outage_min * 60), logs_to=_logs_folder(args))
    epoch_s, points = got["epoch_s"], got["points"]
    restarted = got["restarted_s"]
    back = back_within(points, restarted, 1.5 * epoch_s)
    # events produced from the outage's start until the latency was back, over the time
    # from the restart until then: the rate the backlog and the new input were drained at
    drained = None
    if back is not None and back > 0:
        drained = round(rate * (restarted - before_min * 60 + back) / back, 1)
    # where the latency stood when the input ended (a catch-up not over by then)
    end_s = max((t for t, _ in points), default=0.0)
    at_end = percentiles([lat for t, lat in points if t >= end_s - WINDOW_S], 0)["p95"]
    out: dict[str, Any] = {
        "rate": rate, "outage_minutes": outage_min, "back_within_1_5_epochs_s": back,
        "p95_s_at_input_end": _round(at_end),
        "drain_eps": drained, "epoch_seconds": epoch_s, "minutes_before": before_min,
        "minutes_after": after_min, "queries": got["queries"], "answered": len(points),
        "unanswered": got["unanswered"], "restarted_s": round(restarted, 1),
        "job_exit_codes": got["codes"], "seconds": round(time.time() - started_at, 1),
    }
    console.print(json.dumps(out, indent=1))
    console.print(f"catch-up after {outage_min:g} min down at {rate:,.0f} events/s: latency "
                  f"within 1.5 epochs {back} s after the restart (goal ≤ 120 s), drained at "
                  f"{drained} events/s")
    if args.json:
        path = write_figures(args.json, out)
        step = max(1, len(points) // 400)
        path.with_suffix(".svg").write_text(lines_svg(
            f"falkirk catch-up: {rate:,.0f} events/s, every job down {outage_min:g} min",
            "seconds since the input began (when the query was produced)", "latency (s)",
            {"answer latency": points[::step]}))
        console.print(f"JSON: {path}; plot: {path.with_suffix('.svg')}")
    return out


def _logs_folder(args: Namespace) -> Path | None:
    """Where a run's job logs are kept: ``var/bench/logs/<the JSON's name>`` (not beside
    the figures: they are large and not figures)."""
    if not getattr(args, "json", None):
        return None
    from falkirk.config import load

    return Path(load().var_dir) / "bench" / "logs" / Path(args.json).stem


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 2)
