"""Latency at a steady rate: from a query's production to its answer on ``responses``.

The reference pipeline runs as it is deployed (every job its own process, spark-submit,
the local broker); once every job has started (its JVM up, waiting for epoch 0), the
input is produced in real time at ``--rate`` events per second (and a tenth as many
queries) for ``--minutes``: event time and wall time advance together, so epoch ``e``
closes ``epoch_seconds`` after it opened. Every query's production time is when the
producer sent it (its place in the paced stream); its answer time is the Kafka timestamp
of the first ``responses`` message with its ``query_id`` as key. Latency: p50, p95 and
p99 in seconds and in epochs; a query not answered within ``--drain-minutes`` after the
input ended counts as unanswered (its latency is at least that: the percentiles it would
change are reported as None). The achieved production rate is reported too: on 2 cores
one Python producer may not keep up with the rate asked for.

Run: ``falkirk bench latency --rate 5000 --minutes 5 --json OUT`` (OUT.svg beside it: the
latency of answers over the time their queries were produced).
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
    """Until every job recorded its start in the epoch log (its JVM and session are up)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        runs = run.log.job_runs(run.pipeline.name)
        if all(runs.get(j, {}).get("status") == "started" for j in jobs):
            return
        dead = {j: p.returncode for j, p in run.procs.items() if p.poll() is not None}
        if dead:
            raise RuntimeError(f"jobs ended before the input began: {dead}; see "
                               f"{run.log_file(next(iter(dead)))}")
        time.sleep(0.5)
    raise RuntimeError(f"jobs not started after {timeout_s:.0f} s")


def main(args: Namespace) -> dict:
    from rich.console import Console

    from falkirk.io.kafka import ensure_topics
    from falkirk_dev import generate
    from falkirk_dev.harness import LocalRun
    from falkirk_dev.plot import lines_svg

    console = Console()
    rate = float(args.rate or 5000)
    minutes = float(args.minutes or 5)
    drain_s = float(args.drain_minutes or 15) * 60
    started_at = time.time()
    with tempfile.TemporaryDirectory(prefix="falkirk-latency-") as tmp, \
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
        with console.status(f"{minutes:g} min of input in real time ({rate:,.0f} events/s, "
                            f"{paced:,.0f} records/s in all)…"):
            producer.start()
            producer.join()
        with console.status("waiting for the last answers…"):
            try:
                codes = run.wait(timeout_s=drain_s)
            except Exception as exc:  # still running: what is answered by now counts
                codes = {"not finished": str(exc)}
                run.stop_all()
        answered = answer_times(run.cfg.kafka_bootstrap, "responses")
    # Production order is the merge by timestamp that produce() sends in, paced.
    merged = heapq.merge(((ts, 0, i) for i, (_, _, ts) in enumerate(g.events)),
                         ((ts, 1, i) for i, (_, _, ts) in enumerate(g.queries)))
    sent_at = {i: fed["start"] + n / paced for n, (_, stream, i) in enumerate(merged)
               if stream == 1}
    latencies, points, unanswered = [], [], 0
    for i, (_, value, _) in enumerate(g.queries):
        query_id = json.loads(value)["query_id"]
        if query_id in answered:
            lat = max(0.0, answered[query_id] - sent_at[i])
            latencies.append(lat)
            points.append((sent_at[i] - fed["start"], lat))
        else:
            unanswered += 1
    pct = percentiles(latencies, unanswered)
    produced_s = fed["end"] - fed["start"]
    out: dict[str, Any] = {
        "rate_asked_events_per_s": rate, "events": len(g.events), "queries": len(g.queries),
        "epochs": epochs, "epoch_seconds": epoch_s,
        "rate_achieved_events_per_s": round(len(g.events) / produced_s, 1),
        "producer_lag_s": round(produced_s - epochs * epoch_s, 1),
        "answered": len(latencies), "unanswered": unanswered,
        **{f"latency_{k}_s": None if v is None else round(v, 2) for k, v in pct.items()},
        **{f"latency_{k}_epochs": None if v is None else round(v / epoch_s, 2)
           for k, v in pct.items()},
        "job_exit_codes": codes, "seconds": round(time.time() - started_at, 1),
    }
    console.print(json.dumps(out, indent=1))
    if args.json:
        path = write_figures(args.json, out)
        points.sort()
        step = max(1, len(points) // 400)  # at most ~400 points drawn
        path.with_suffix(".svg").write_text(lines_svg(
            f"falkirk latency: {rate:,.0f} events/s for {minutes:g} min, query → answer",
            "seconds since the input began (when the query was produced)", "latency (s)",
            {"answer latency": points[::step]}))
        console.print(f"JSON: {path}; plot: {path.with_suffix('.svg')}")
    return out
