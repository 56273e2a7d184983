"""A driver's start: cold without and with the class-data archive (falkirk.io.classdata),
and a client of the Spark Connect engine (falkirk.runtime.engine: a job's start as the
local profile runs it), each started as the launcher starts a job
(falkirk.runtime.launcher).

What a restarted job pays before its first commit: spark-submit, the JVM, the Spark
session, then its first Delta epoch (written, read back, aggregated) in a cold JVM. Each
round runs one driver of each variant, rotating which goes first, with nothing else of
falkirk running. The ratios are taken within the run (the machine is shared).

Run: ``falkirk bench driver [--rounds 3] [--json F]`` (``falkirk jars`` must have trained
the archive).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from argparse import Namespace
from pathlib import Path

VARIANTS = ("without archive", "with archive", "engine client")

# Run by spark-submit: the session (its JVM already started with the variant's options),
# then one epoch; prints monotonic times (one clock for every process on Linux) and RSS.
DRIVER = textwrap.dedent("""
    import json, sys, time
    import psutil
    from pyspark.sql import functions as F
    from falkirk.runtime.launcher import session
    spark = session("falkirk-bench-driver")
    ready = time.monotonic()
    table = sys.argv[1]
    (spark.range(1000).select(F.lit(0).cast("long").alias("epoch"),
                              (F.col("id") % 17).alias("k"), F.col("id").alias("v"))
     .write.format("delta").mode("append").option("txnAppId", "bench")
     .option("txnVersion", 0).save(table))
    rows = spark.read.format("delta").load(table).groupBy("k").count().collect()
    done = time.monotonic()
    from falkirk.io.spark import is_remote
    jvm = (psutil.Process() if is_remote(spark)  # a client: its JVM is the engine's
           else psutil.Process(spark.sparkContext._jvm.ProcessHandle.current().pid()))
    print("DRIVER " + json.dumps({"ready": ready, "done": done, "groups": len(rows),
                                  "rss_mb": jvm.memory_info().rss / 2**20}), flush=True)
    spark.stop()
""")


def one_driver(class_data: bool | None, scratch: Path) -> dict[str, float]:
    """One driver of its own (``class_data``: with the archive or without), or with None
    a client of the engine."""
    from falkirk.config import load
    from falkirk.io.launch import launch_conf
    from falkirk.runtime.launcher import as_application, job_command, job_env

    cfg, env = load(), {}
    if class_data is not None:
        cfg, env = as_application(cfg)
    script = scratch / "driver.py"
    script.write_text(DRIVER)
    table = scratch / f"t-{time.time_ns()}"
    cmd = job_command(script, [str(table)], cfg, conf=None if class_data is None
                      else launch_conf(cfg, class_data=class_data))
    started = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, env={**job_env(), **env},
                          timeout=900)
    ended = time.monotonic()
    got = _driver_line(done.stdout)
    if done.returncode != 0 or got is None:
        raise SystemExit(f"the bench driver failed (exit {done.returncode}):\n"
                         + "\n".join(done.stderr.strip().splitlines()[-15:]))
    return {"session_s": got["ready"] - started, "first_epoch_s": got["done"] - got["ready"],
            "until_first_epoch_s": got["done"] - started, "process_s": ended - started,
            "rss_mb": got["rss_mb"]}


def _driver_line(text: str) -> dict[str, float] | None:
    line = next((x for x in reversed(text.splitlines()) if x.startswith("DRIVER ")), None)
    return None if line is None else json.loads(line.removeprefix("DRIVER "))


def main(args: Namespace) -> dict:
    from rich.console import Console

    from falkirk.config import load
    from falkirk.io.classdata import archive, java_options

    console = Console()
    cfg = load()
    if not java_options(cfg):
        raise SystemExit(f"no class-data archive for profile {cfg.env!r} (expected "
                         f"{archive(cfg)}): run falkirk jars first")
    rounds = int(args.rounds or 3)
    runs: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="falkirk-bench-driver-") as tmp:
        with console.status("the engine, warmed by a client (not timed)…"):
            one_driver(None, Path(tmp))
        for rnd in range(rounds):
            turn = rnd % len(VARIANTS)
            for variant in VARIANTS[turn:] + VARIANTS[:turn]:
                with console.status(f"round {rnd + 1}/{rounds}: a driver {variant}…"):
                    got = one_driver(None if variant == "engine client"
                                     else variant == "with archive", Path(tmp))
                runs[variant].append(got)
                console.print(f"round {rnd + 1}: {variant}: session {got['session_s']:.1f} s, "
                              f"first epoch {got['first_epoch_s']:.1f} s, JVM RSS "
                              f"{got['rss_mb']:,.0f} MB")
    medians = {v: {k: statistics.median(r[k] for r in runs[v]) for k in runs[v][0]}
               for v in VARIANTS}
    def until(variant: str) -> float:
        return medians[variant]["until_first_epoch_s"]

    ratio = until("with archive") / until("without archive")
    client_ratio = until("engine client") / until("with archive")
    out = {"profile": cfg.env, "rounds": rounds, "archive": str(archive(cfg)),
           "archive_mb": round(archive(cfg).stat().st_size / 2**20),
           "medians": {v: {k: round(x, 2) for k, x in m.items()} for v, m in medians.items()},
           "until_first_epoch_ratio": round(ratio, 3),
           "engine_client_until_first_epoch_ratio": round(client_ratio, 3), "runs": runs,
           "date": time.strftime("%Y-%m-%d")}
    for v in VARIANTS:
        m = medians[v]
        console.print(f"{v:16} median: session {m['session_s']:5.1f} s, first epoch "
                      f"{m['first_epoch_s']:5.1f} s, until it {m['until_first_epoch_s']:5.1f} s, "
                      f"JVM RSS {m['rss_mb']:,.0f} MB")
    console.print(f"with/without archive, until the first epoch: {ratio:.2f}×; a client "
                  f"of the engine/cold with archive: {client_ratio:.2f}× (its RSS: the "
                  "client's Python; the engine's JVM is shared)")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    json.dump(out, sys.stdout)
    print()
    return out
