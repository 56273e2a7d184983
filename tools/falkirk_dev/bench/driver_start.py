"""A driver's start with and without the class-data archive (falkirk.io.classdata).

What a restarted job pays before its first commit: spark-submit, the JVM, the Spark
session, then its first Delta epoch (written, read back, aggregated) in a cold JVM. Each
round starts one driver of each variant, alternating which goes first, with nothing else
of falkirk running; the ratio is taken within the run (the machine is shared).

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

VARIANTS = ("without archive", "with archive")

# Run by spark-submit: the session (its JVM already started with the variant's options),
# then one epoch; prints monotonic times (one clock for every process on Linux) and RSS.
DRIVER = textwrap.dedent("""
    import json, sys, time
    import psutil
    from pyspark.sql import functions as F
    from falkirk.io.spark import session
    spark = session("falkirk-bench-driver")
    ready = time.monotonic()
    table = sys.argv[1]
    (spark.range(1000).select(F.lit(0).cast("long").alias("epoch"),
                              (F.col("id") % 17).alias("k"), F.col("id").alias("v"))
     .write.format("delta").mode("append").option("txnAppId", "bench")
     .option("txnVersion", 0).save(table))
    rows = spark.read.format("delta").load(table).groupBy("k").count().collect()
    done = time.monotonic()
    jvm = psutil.Process(spark.sparkContext._jvm.ProcessHandle.current().pid())
    print("DRIVER " + json.dumps({"ready": ready, "done": done, "groups": len(rows),
                                  "rss_mb": jvm.memory_info().rss / 2**20}), flush=True)
    spark.stop()
""")


def one_driver(class_data: bool, scratch: Path) -> dict[str, float]:
    from falkirk.config import load
    from falkirk.runtime.procs import job_command, job_env

    cfg = load()
    script = scratch / "driver.py"
    script.write_text(DRIVER)
    table = scratch / f"t-{time.time_ns()}"
    cmd = job_command(script, [str(table)], cfg, conf=cfg.launch_conf(class_data=class_data))
    started = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, env=job_env(), timeout=900)
    ended = time.monotonic()
    line = next((x for x in done.stdout.splitlines() if x.startswith("DRIVER ")), None)
    if done.returncode != 0 or line is None:
        raise SystemExit(f"the bench driver failed (exit {done.returncode}):\n"
                         + "\n".join(done.stderr.strip().splitlines()[-15:]))
    got = json.loads(line.removeprefix("DRIVER "))
    return {"session_s": got["ready"] - started, "first_epoch_s": got["done"] - got["ready"],
            "until_first_epoch_s": got["done"] - started, "process_s": ended - started,
            "rss_mb": got["rss_mb"]}


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
        for rnd in range(rounds):
            order = VARIANTS[rnd % 2:] + VARIANTS[:rnd % 2]
            for variant in order:
                with console.status(f"round {rnd + 1}/{rounds}: a driver {variant}…"):
                    got = one_driver(variant == "with archive", Path(tmp))
                runs[variant].append(got)
                console.print(f"round {rnd + 1}: {variant}: session {got['session_s']:.1f} s, "
                              f"first epoch {got['first_epoch_s']:.1f} s, JVM RSS "
                              f"{got['rss_mb']:,.0f} MB")
    medians = {v: {k: statistics.median(r[k] for r in runs[v]) for k in runs[v][0]}
               for v in VARIANTS}
    ratio = (medians["with archive"]["until_first_epoch_s"]
             / medians["without archive"]["until_first_epoch_s"])
    out = {"profile": cfg.env, "rounds": rounds, "archive": str(archive(cfg)),
           "archive_mb": round(archive(cfg).stat().st_size / 2**20),
           "medians": {v: {k: round(x, 2) for k, x in m.items()} for v, m in medians.items()},
           "until_first_epoch_ratio": round(ratio, 3), "runs": runs,
           "date": time.strftime("%Y-%m-%d")}
    for v in VARIANTS:
        m = medians[v]
        console.print(f"{v:16} median: session {m['session_s']:5.1f} s, first epoch "
                      f"{m['first_epoch_s']:5.1f} s, until it {m['until_first_epoch_s']:5.1f} s, "
                      f"JVM RSS {m['rss_mb']:,.0f} MB")
    console.print(f"with/without, until the first epoch: {ratio:.2f}×")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    json.dump(out, sys.stdout)
    print()
    return out
