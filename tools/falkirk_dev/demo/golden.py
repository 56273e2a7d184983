"""The failure-free run (the reference for the comparison, cached while input and code are
the same) and the direct mode (no Airflow)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from argparse import Namespace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from falkirk.config import REPO_ROOT
from falkirk_dev.demo.base import DEMO_INPUT, KILL_EPOCH, KILLED_REGION, DemoError
from falkirk_dev.demo.report import report_html, throughput_per_epoch
from falkirk_dev.harness import profile


def fingerprint(inputs: dict) -> str:
    """What the failure-free outputs depend on: the input options and the code and
    declarations that compute them (the reference app's jobs and schemas, the framework)."""
    h = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode())
    app = REPO_ROOT / "examples" / "reference"
    files = [*sorted(app.rglob("*.py")), app / "pipeline.yaml",
             *sorted((app / "schemas").glob("[!e]*/*")),  # not expectations/
             *sorted((REPO_ROOT / "plugins" / "falkirk").rglob("*.py")),
             *sorted((REPO_ROOT / "plugins" / "falkirk" / "schemas").glob("*/*"))]
    for path in files:
        if path.is_file():
            h.update(path.relative_to(REPO_ROOT).as_posix().encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:16]


def golden_outputs(root: Path, console, fresh: bool) -> tuple[dict, str, float]:
    """The failure-free run's outputs: cached in ``root/golden.json`` with the fingerprint
    of the input and code that made them; run again when anything differs (or ``fresh``).
    Returns (outputs, a sentence for the report, seconds spent)."""
    from falkirk_dev.harness import LocalRun

    cache = root / "golden.json"
    key = fingerprint(DEMO_INPUT)
    if not fresh and cache.exists():
        try:
            saved = json.loads(cache.read_text())
        except json.JSONDecodeError:
            saved = {}
        if saved.get("fingerprint") == key:
            console.log(f"failure-free run: reusing the outputs of {saved['made']} (same "
                        f"input and code, fingerprint {key}; --fresh-golden runs it again)")
            return saved["outputs"], (
                f"The failure-free outputs come from a run made {saved['made']} in "
                f"{saved['seconds']:.0f} s on the same seeded input {DEMO_INPUT} with the same "
                f"code (fingerprint {key} over examples/reference/ and plugins/falkirk/), reused "
                f"from {cache}."), 0.0
    t0 = time.monotonic()
    shutil.rmtree(root / "failure-free", ignore_errors=True)
    with LocalRun(root / "failure-free") as run, \
            console.status("failure-free run: generating input, running the 4 Spark jobs…"):
        run.generate(**DEMO_INPUT)
        run.start(until_epoch=DEMO_INPUT["epochs"] - 1)
        run.wait(progress=lambda m: console.log(f"failure-free run: {m}"))
        outputs = run.outputs()
    seconds = time.monotonic() - t0
    made = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    # rows as JSON (compare() serialises values with default=str: the same strings)
    outputs = json.loads(json.dumps(outputs, default=str))
    cache.write_text(json.dumps({"fingerprint": key, "made": made, "seconds": seconds,
                                 "input": DEMO_INPUT, "outputs": outputs}))
    console.log(f"failure-free run done in {seconds:.0f} s (cached in {cache})")
    return outputs, (f"The failure-free run ran now ({seconds:.0f} s, LocalRun, no Airflow) "
                     f"on the same seeded input {DEMO_INPUT}."), seconds




def engines(cluster: bool, airflow: bool = False) -> tuple[Any, str]:
    """The broker of the run with the failure (None: its own embedded one) and what the
    report says it ran on; on the cluster, refuses unless it is up and healthy."""
    if not cluster:
        from falkirk.config import load

        cfg = load()
        spark = (f"one Spark engine ({cfg.engine_master}, Spark Connect at {cfg.spark_remote}) "
                 "every job is a client of" if cfg.spark_remote
                 else f"a {cfg.spark_master} Spark driver per job")
        return None, (f"Engines: this machine's embedded defaults ({spark}, "
                      "one Apache Kafka broker in KRaft mode, Delta on local files" +
                      (", Airflow's LocalExecutor on SQLite)." if airflow else ")."))
    from falkirk_dev import cluster as local_cluster

    if os.environ.get("FALKIRK_ENV", "cluster") != "cluster":
        raise DemoError(f"--cluster runs on FALKIRK_ENV=cluster, not "
                        f"{os.environ['FALKIRK_ENV']!r}")
    up = local_cluster.engines()  # refuses when no healthy cluster is up
    return local_cluster.ClusterKafka("reference"), (
        f"Engines of the run with the failure: the local cluster of bin/cluster up, {up}; "
        f"jobs submitted to its Spark master (FALKIRK_ENV=cluster), topics with 3 replicas, "
        f"the Delta tables in its object store (s3a:// for Spark, put-if-absent commits "
        f"for delta-rs)" + ("; Airflow with the CeleryExecutor (its metadata in the "
                           "cluster's PostgreSQL, Redis as broker, 2 Celery workers)"
                           if airflow else "") + ". The failure-free run: the embedded "
        "defaults.")


def main_direct(args: Namespace, console, cluster: bool = False) -> int:
    """The failure and its recovery without Airflow; with ``cluster``, the run with the
    failure goes to the local cluster of ``bin/cluster up`` (Spark standalone, 3 Kafka
    brokers; FALKIRK_ENV=cluster), the failure-free run stays on the embedded defaults
    (its outputs do not depend on the engines: that is what the comparison shows)."""
    from falkirk_dev.harness import LocalRun, compare

    root = Path(getattr(args, "root", None) or REPO_ROOT / "var" / "demo")
    root.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(root / "with-failure", ignore_errors=True)
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    broker, engines_note = engines(cluster)
    with profile("local"):
        golden, golden_note, seconds = golden_outputs(root, console,
                                                      getattr(args, "fresh_golden", True))
    timings["failure-free run"] = seconds
    console.log(engines_note)

    t1 = time.monotonic()
    with profile("cluster" if cluster else os.environ.get("FALKIRK_ENV", "local")), \
            LocalRun(root / "with-failure",
                     broker=broker.start() if broker is not None else None) as run:
        with console.status("run with a failure: generating input, starting the jobs…"):
            run.generate(**DEMO_INPUT)
            run.start(until_epoch=DEMO_INPUT["epochs"] - 1)
        with console.status(f"waiting for communities to be in the middle of epoch "
                            f"{KILL_EPOCH}…"):
            run.wait_for(lambda: run.epoch_running(KILLED_REGION, KILL_EPOCH), timeout_s=900,
                         what=f"communities mid epoch {KILL_EPOCH}")
        run.kill(run.pipeline.regions[KILLED_REGION].job)
        console.log(f"[red]killed communities (SIGKILL) in the middle of epoch {KILL_EPOCH}")
        t2 = time.monotonic()
        plan = run.rollback(failed=[KILLED_REGION], reason="demo: communities killed",
                            progress=lambda m: console.log(m))
        timings["rollback"] = time.monotonic() - t2
        run.start()
        with console.status("finishing the pipeline from the frontiers…"):
            run.wait(progress=lambda m: console.log(m))
        outputs = run.outputs()
        sent = run.sent()
        series = throughput_per_epoch(run)
        pipeline = run.pipeline
    timings["run with the failure"] = time.monotonic() - t1
    comparison = compare(golden, outputs)
    timings["total"] = time.monotonic() - t0
    report = root / "report.html"
    report.write_text(report_html(pipeline, plan.to_json(), comparison, series, timings,
                                  f"{golden_note} {engines_note}", sent=sent))
    _save_figures(root, cluster, timings, series, comparison)
    return _verdict(console, comparison, plan.to_json()["frontiers"], report, timings)


def _save_figures(root: Path, cluster: bool, timings: dict, series: dict,
                  comparison: dict, airflow: bool = False) -> None:
    """The run's figures as JSON beside the report (``figures.json``): timings, input
    records per second per epoch, lost and duplicated, and where it ran."""
    (root / "figures.json").write_text(json.dumps({
        "engines": "cluster" if cluster else "local", "airflow": airflow, "timings_s": timings,
        "input": DEMO_INPUT,
        # the demo's input over the run with the failure (start, kill, rollback, restart)
        "events_per_s": DEMO_INPUT["events"] / timings["run with the failure"],
        "series": series, "lost": sum(v["lost"] for v in comparison.values()),
        "duplicated": sum(v["duplicated"] for v in comparison.values())},
        indent=1, default=str))


def _verdict(console, comparison: dict, frontiers: dict, report: Path, timings: dict) -> int:
    lost = sum(v["lost"] for v in comparison.values())
    dup = sum(v["duplicated"] for v in comparison.values())
    console.print(f"[bold]{'✓' if lost == dup == 0 else '✗'} {lost} lost, {dup} duplicated "
                  f"across {len(comparison)} outputs; frontiers {frontiers}")
    console.print(f"report: {report}   (total {timings['total']:.0f} s)")
    return 0 if lost == dup == 0 else 1
