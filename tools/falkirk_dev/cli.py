"""The dev commands of ``falkirk`` (demo, generate, trials, chaos, bench).

They drive the reference pipeline and the sandboxes of the test harness, so they ship with
the checkout, not with the framework's wheel; ``falkirk.cli`` adds them when this package
can be imported.
"""

from __future__ import annotations

import argparse

from falkirk.cli import _pipeline


def cmd_generate(args: argparse.Namespace) -> int:
    """Seeded input for a pipeline, cut into the pipeline's epochs, produced to its topics."""
    from falkirk_dev import generate
    pipeline = _pipeline(args.pipeline)
    s = pipeline.settings
    if args.origin is None:
        args.origin = s.get("origin_ms")
    if args.epoch_seconds is None:
        args.epoch_seconds = s.get("epoch_seconds", 10)
    code = generate.cli(args)
    if code == 0 and args.bootstrap != "-":  # all produced: the run ends after its last epoch
        from dataclasses import replace

        from falkirk.config import load
        from falkirk.runtime.bounds import declare_bounds

        cfg = load()
        declare_bounds(pipeline, replace(cfg, kafka_bootstrap=args.bootstrap or
                                         cfg.kafka_bootstrap))
    return code

def cmd_demo(args: argparse.Namespace) -> int:
    from falkirk_dev import demo
    return demo.main(args)

def cmd_cluster(args: argparse.Namespace) -> int:
    from falkirk_dev import cluster
    return cluster.main(args)

def cmd_chaos(args: argparse.Namespace) -> int:
    from falkirk_dev import chaos
    return chaos.main(args)

def cmd_soak(args: argparse.Namespace) -> int:
    from falkirk_dev import soak
    return soak.main(args)

def cmd_trials(args: argparse.Namespace) -> int:
    from falkirk_dev import trials
    return trials.main(args)

def cmd_bench(args: argparse.Namespace) -> int:
    import importlib

    module, takes_args = BENCHES[args.what]
    if args.what != "scale" and args.events is not None:
        try:
            args.events = int(args.events)
        except ValueError:
            raise SystemExit(f"falkirk bench {args.what}: --events takes one number, got "
                             f"{args.events!r}") from None
    bench = importlib.import_module(f"falkirk_dev.bench.{module}")
    bench.main(args) if takes_args else bench.main()
    return 0

# benchmark -> (module in falkirk_dev.bench, whether its main takes the parsed arguments)
BENCHES = {
    "solver": ("solver_bench", True),
    "kafka": ("kafka_bench", False),
    "delta": ("delta_bench", False),
    "checkpoints": ("checkpoint_bench", False),
    "rework": ("rework_bench", True),
    "regimes": ("regimes_bench", True),
    "scale": ("scale_bench", True),
    "long": ("long_run", True),
    "latency": ("latency", True),
    "catchup": ("catchup_bench", True),
    "epoch": ("epoch_bench", True),
    "hosting": ("hosting", True),
    "driver": ("driver_start", True),
    "log": ("log_bench", True),
    "broker": ("broker_bench", True),
    "all": ("all_bench", True),
    "report": ("report", True),  # docs/benchmarks.md, docs/faults-results.md from the figures
}


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="the reference pipeline with a failure, a rollback and a "
                                    "report (var/demo/report.html)")
    p.add_argument("--root", help="where the demo's sandboxes and report go (default var/demo)")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("generate", help="seeded, deterministic input for the reference pipeline")
    p.add_argument("--pipeline", help="declared pipeline (default: the only one declared)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--events", type=int, default=10_000)
    p.add_argument("--queries", type=int, default=1_000)
    p.add_argument("--users", type=int, default=500)
    p.add_argument("--items", type=int, default=200)
    p.add_argument("--categories", type=int, default=8)
    p.add_argument("--epochs", type=int, default=10, help="epochs the event times span")
    p.add_argument("--epoch-seconds", type=float, help="default: the pipeline's setting")
    p.add_argument("--origin", help="ISO time or ms (default: the pipeline's setting)")
    p.add_argument("--malformed", type=float, default=0.01, help="fraction of bad records")
    p.add_argument("--late", type=float, default=0.01, help="fraction of late records")
    p.add_argument("--rate", type=float, help="records/s (default: one bounded burst)")
    p.add_argument("--bootstrap", help="broker (default: the config's; '-' = only summarise)")
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("trials", help="fault-injection trials: kill a random region at a "
                       "random phase, recover, compare with a failure-free run")
    p.add_argument("-n", "--trials", type=int, default=5, help="how many trials (default 5)")
    p.add_argument("--seed", type=int, default=1, help="picks regions and phases")
    p.add_argument("--events", type=int, default=1500, help="events of input per run")
    p.add_argument("--epochs", type=int, default=5, help="epochs of input per run")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON here")
    p.set_defaults(func=cmd_trials)

    p = sub.add_parser("chaos", help="fault campaign: one long run, killing jobs, rollbacks "
                       "and the broker at random moments; compare with a failure-free run")
    p.add_argument("--minutes", type=float, default=60, help="how long to keep breaking "
                   "things (default 60)")
    p.add_argument("--seed", type=int, default=1, help="draws the targets and moments")
    p.add_argument("--events", type=int, default=60000, help="events of input")
    p.add_argument("--epochs", type=int, default=120, help="epochs of input")
    p.add_argument("--workdir", help="where the sandboxes go (default: a new temp folder)")
    p.add_argument("--json", metavar="FILE", help="also write the figures as JSON here")
    p.add_argument("--cluster", action="store_true",
                   help="run on the local cluster of bin/cluster up, its Kafka nodes, Spark "
                        "workers and object store among the targets")
    p.add_argument("--airflow", action="store_true",
                   help="a local Airflow's streams supervisor recovers (bin/airflow, "
                        "LocalExecutor); its scheduler among the targets")
    p.add_argument("--golden", metavar="FILE",
                   help="the failure-free run's outputs: read from FILE when it holds this "
                        "input's, else made and written there (a long campaign's is long)")
    p.add_argument("--every", type=float, metavar="S",
                   help="with --airflow: a strike every S seconds on average, whether or "
                        "not the last one has recovered (default: each strike waits for "
                        "its recovery)")
    p.add_argument("--rate", type=float, metavar="R",
                   help="with --airflow: produce the input at R records/s while the "
                        "pipeline runs, as a live source would (default: all of it before "
                        "the pipeline starts, a backlog to drain); a recovery's wait for "
                        "records not produced yet is counted apart")
    p.add_argument("--targets", metavar="T,T",
                   help="with --airflow: what to break, of job, scheduler, broker, engine "
                        "(default: all four; the engine when the profile runs one)")
    p.set_defaults(func=cmd_chaos)

    p = sub.add_parser("soak", help="thousands of short epochs under kills with garbage "
                       "collection running: bytes per store, restore and epoch time, driver "
                       "memory per quarter; compare with a failure-free run")
    p.add_argument("--epochs", type=int, default=2000, help="epochs of input (default 2000)")
    p.add_argument("--epoch-seconds", type=float, default=1.0,
                   help="the pipeline's epoch length for the soak (default 1)")
    p.add_argument("--kill-every", type=int, default=100,
                   help="a strike at a random moment every K epochs of progress (0: none)")
    p.add_argument("--events-per-epoch", type=int, default=25,
                   help="events of input per epoch (default 25)")
    p.add_argument("--seed", type=int, default=1, help="draws the targets and moments")
    p.add_argument("--workdir", help="where the sandboxes go (default: a new temp folder)")
    p.add_argument("--json", metavar="FILE", help="write the figures here (its chart beside "
                   "it, .svg)")
    p.set_defaults(func=cmd_soak)

    p = sub.add_parser("cluster", help="a local cluster as separate processes: Spark "
                       "standalone (master + 2 workers), 3 Kafka brokers, an S3 object store, "
                       "PostgreSQL and Redis for Airflow with Celery (FALKIRK_ENV=cluster)")
    p.add_argument("action", choices=("up", "down", "status", "airflow-env", "compose"),
                   help="airflow-env: the shell exports bin/airflow uses for the "
                        "CeleryExecutor on this cluster (with --home); compose: write "
                        "docker-compose.yml, the same cluster in containers")
    p.add_argument("--json", action="store_true", help="status as JSON on stdout")
    p.add_argument("--home", help="airflow-env: the Airflow home (its own database and queue)")
    p.set_defaults(func=cmd_cluster)

    p = sub.add_parser("bench", help="print performance figures")
    p.add_argument("what", choices=list(BENCHES), help="which benchmark")
    p.add_argument("--regions", type=int, default=10_000, help="solver: regions")
    p.add_argument("--edges", type=int, default=30_000, help="solver: edges")
    p.add_argument("--frontiers", type=int, default=50, help="solver: frontiers per region")
    p.add_argument("--seed", type=int, default=7, help="solver: random graph seed")
    p.add_argument("--epochs", type=int, help="rework, regimes (default 9), scale (default "
                   "20), long (default 50), hosting (default 8), epoch (default 120): "
                   "epochs of input")
    p.add_argument("--kill-epoch", type=int, default=7, help="rework: kill communities in it")
    p.add_argument("--events", help="rework, regimes, long, hosting: events of input "
                   "(defaults 3,000, 20,000, 25,000, 20,000); scale: sizes, comma-separated "
                   "(default 10000,100000,1000000); log: appends to the log (default 700)")
    p.add_argument("--rounds", type=int, default=2, help="regimes, scale, hosting, driver: "
                   "rounds of each variant")
    p.add_argument("--rate", type=float, help="latency: events/s produced in real time "
                   "(default 5,000)")
    p.add_argument("--minutes", type=float, help="latency: minutes of input measured "
                   "(default 5); catchup: minutes before the outage (default 2)")
    p.add_argument("--warmup-minutes", type=float, help="latency: minutes of input before "
                   "the measured ones, reported apart (default 2)")
    p.add_argument("--outage-minutes", type=float, help="catchup: minutes every job is "
                   "down while input keeps coming (default 5)")
    p.add_argument("--after-minutes", type=float, help="catchup: minutes of input after the "
                   "outage (default 4)")
    p.add_argument("--drain-minutes", type=float, help="latency: how long to wait for the "
                   "last answers after the input ended (default 15)")
    p.add_argument("--json", help="scale, long, latency, hosting, driver, log: write the figures "
                   "here (and the plot beside it, .svg)")
    p.add_argument("--no-check", action="store_true", help="scale: skip comparing the plain "
                   "job's tables with the pipeline's")
    p.add_argument("--latency-events", type=int, default=3000, help="regimes: live events")
    p.add_argument("--latency-epochs", type=int, default=6, help="regimes: live epochs")
    p.add_argument("--quick", action="store_true", help="all: small inputs (a smoke run)")
    p.add_argument("--out", help="all: where to write the JSON (default var/bench/<commit>.json)")
    p.set_defaults(func=cmd_bench)

