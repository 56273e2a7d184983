"""The demo: the reference pipeline with a failure and a rollback, and a report.

Two modes, on the same seeded input; both write ``var/demo/report.html`` (the region
graph coloured by regime with each region's chosen frontier, the rollback plan that ran,
input records per second per epoch, and the comparison with a failure-free run: rows
lost, rows duplicated).

``--airflow`` (the default, what ``bin/demo`` runs): a failure-free run (or its cached
outputs, when the input and the code are the same), then the pipeline driven by a real
local Airflow (``bin/airflow``) on a sandbox with its own broker, lake and Airflow home:
the streams supervisor DAG starts the stream jobs and the batch DAG runs popularity once
per epoch; the demo kills the communities job with SIGKILL in the middle of an epoch and
waits for the supervisor to notice, roll back and restart it; once every epoch is done it
runs the data checks and adds their summary to the report, then prints where the report
and the Airflow UI are.

``--direct``: the same failure and recovery without Airflow: the rollback executor is
called by the demo itself (falkirk_dev.harness.LocalRun).

``--cluster`` (with either mode): the run with the failure on the local cluster of
``bin/cluster up`` (``FALKIRK_ENV=cluster``: Spark standalone, 3 Kafka brokers, the lake
on its object store; with Airflow, the CeleryExecutor on its PostgreSQL and Redis); the
report says which engines ran; ``figures.json`` beside it has the run's events/s.

Run it as ``bin/demo`` (Airflow) or ``python -m falkirk_dev.demo --direct``. The parts:
``base`` (input, what is killed), ``golden`` (the failure-free run and the direct mode),
``airflow`` (the Airflow mode), ``report`` (charts and the HTML report, from the Jinja2
templates in ``templates/``).
"""

from __future__ import annotations

import argparse
import os
import sys
from argparse import Namespace

from falkirk.errors import FalkirkError


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``falkirk demo``'s options."""
    p.add_argument("--root", help="where the demo's sandboxes and report go (default var/demo)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--airflow", dest="mode", action="store_const", const="airflow",
                      help="drive the pipeline through the Airflow DAGs (the default)")
    mode.add_argument("--direct", dest="mode", action="store_const", const="direct",
                      help="no Airflow: the demo calls the rollback executor itself")
    p.add_argument("--cluster", action="store_true",
                   help="run on the local cluster of bin/cluster up (FALKIRK_ENV=cluster: "
                        "Spark standalone, 3 Kafka brokers, the object store; Airflow with "
                        "the CeleryExecutor); the failure-free run stays on the embedded "
                        "defaults")
    p.add_argument("--keep-airflow", action=argparse.BooleanOptionalAction, default=True,
                   help="leave Airflow running at the end to look at the runs (default: "
                        "keep; --no-keep-airflow stops it)")
    p.add_argument("--live-checks", action=argparse.BooleanOptionalAction, default=False,
                   help="run the DAGs' data checks as they are: the stream checks DAG "
                        "(a new falkirk validate, Spark and GX, every 30 s with new epochs, "
                        "beside the jobs) and the batch DAG's data_checks task after each "
                        "epoch, in its run, before the next epoch. Default: --no-live-checks, "
                        "the first stays paused, the batch tasks are marked skipped and "
                        "falkirk validate runs once at the end (the "
                        "same checks; several times faster on 2 cores)")
    p.add_argument("--fresh-golden", action="store_true",
                   help="run the failure-free reference again even if its cached outputs "
                        "match the input and code")
    p.add_argument("--port", type=int, help="Airflow's port (default: a free one)")
    p.add_argument("--timeout", type=float, default=1800,
                   help="seconds to wait for any one step of the Airflow run (default 1800)")


def main(args: Namespace) -> int:
    from rich.console import Console

    console = Console(width=None if sys.stdout.isatty() else 110)
    cluster = bool(getattr(args, "cluster", False))
    if getattr(args, "mode", None) == "direct":
        from falkirk_dev.demo.golden import main_direct

        return main_direct(args, console, cluster=cluster)
    from falkirk_dev.demo.airflow import main_airflow

    return main_airflow(args, console, cluster=cluster)


def run(argv: list[str] | None = None) -> None:
    """``python -m falkirk_dev.demo``: parse, run, exit hard once output is flushed (delta-rs
    can abort an interpreter at exit after all work is done, delta-io/delta-rs#2184)."""
    p = argparse.ArgumentParser(prog="falkirk demo", description=__doc__.split("\n\n")[0])
    add_arguments(p)
    args = p.parse_args(argv)
    try:
        code = main(args)
    except FalkirkError as exc:
        print(f"falkirk demo: error: {exc}", file=sys.stderr)
        code = 2
    except KeyboardInterrupt:
        code = 130
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


