"""The ``falkirk`` command.

Verbs import what they need when they run, so ``falkirk plan`` never loads Spark
or Airflow and answers in a fraction of a second.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from falkirk.errors import FalkirkError
from falkirk.solver.frontier import Plan, Problem, regions_in_order, solve

PROBLEMS_DIR = Path(__file__).resolve().parent / "solver" / "problems"


class CliError(FalkirkError):
    """A user-facing error: printed as one line, exit status 2, no traceback."""


def _print_plan(plan: Plan, title: str | None = None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    problem = plan.problem
    table = Table(title=title, title_justify="left")
    for col in ("region", "regime", "domain", "status", "current", "frontier", "low watermark"):
        table.add_column(col)
    for name in regions_in_order(problem):
        r = problem.regions[name]
        f = plan.frontiers[name]
        status = "failed" if r.failed else ("live" if r.live is not None else "stopped")
        current = "?" if r.current is None else r.domain.describe(r.current)
        colour = "green" if f.is_top else ("red" if f.is_bottom else "yellow")
        wm = plan.low_watermark[name] if plan.low_watermark else None
        table.add_row(name, r.regime or "", r.domain.name, status, current,
                      f"[{colour}]{f}[/{colour}]", "" if wm is None else str(wm))
    console.print(table)
    if plan.replay:
        console.print("[bold]replay[/bold] (logged edges send again from their log):")
        for r in plan.replay:
            src = r.src or "(input)"
            console.print(f"  {r.edge}: {src} → {r.dst}, times after {r.after} through {r.through}")
    if plan.rerun:
        console.print("[bold]rerun[/bold] (regions restart from their frontier):")
        for r in plan.rerun:
            upto = "as far as its input goes" if r.through is None else f"through {r.through}"
            console.print(f"  {r.region}: after {r.after}, {upto}")
    if not plan.replay and not plan.rerun:
        console.print("nothing to roll back: every region keeps its live state")


def _pipeline(name: str | None):
    """The pipeline a verb acts on: named, or the only one declared."""
    from falkirk.model.topology import declared, load_pipeline

    if name is None:
        names = list(declared())
        if len(names) != 1:
            raise CliError(
                f"say which pipeline with --pipeline (declared: {', '.join(names) or 'none'})"
            )
        name = names[0]
    return load_pipeline(name)


def _split(value: str | None) -> list[str]:
    return [v.strip() for v in (value or "").split(",") if v.strip()]


def cmd_plan(args: argparse.Namespace) -> int:
    if args.problem is not None:
        problem = Problem.load(args.problem)
    else:
        from falkirk.log.epochlog import EpochLog

        pipeline = _pipeline(args.pipeline)
        problem = EpochLog.from_config().problem(pipeline, failed=_split(args.failed))
    if args.save_problem is not None:
        args.save_problem.write_text(json.dumps(problem.to_json(), indent=1))
    plan = solve(problem)
    if args.json:
        print(json.dumps(plan.to_json()))
    else:
        _print_plan(plan, title=problem.description or str(args.problem))
    return 0


def cmd_examples(args: argparse.Namespace) -> int:
    """Solve the worked examples shipped in falkirk/solver/problems and print their plans."""
    files = sorted(PROBLEMS_DIR.glob("*.json"))
    if not files:
        raise CliError(f"no worked examples found in {PROBLEMS_DIR}")
    for path in files:
        problem = Problem.load(path)
        plan = solve(problem)
        if args.json:
            print(json.dumps({"example": path.stem, **plan.to_json()}))
        else:
            _print_plan(plan, title=f"{path.stem}: {problem.description}")
            print()
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    """Regions, regimes, latest epochs, checkpoints, frontiers and low watermarks."""
    from falkirk.log.epochlog import EpochLog
    from falkirk.runtime.procs import running
    from falkirk.solver.frontier import low_watermark

    pipeline = _pipeline(args.pipeline)
    log = EpochLog.from_config()
    logs = log.regions(pipeline)
    problem = log.problem(pipeline, replay=False)  # the watermarks gc collects by
    wm = low_watermark(problem)
    jobs = {r: j["job"] for j in running(pipeline) for r in j["regions"]}
    status = {"pipeline": pipeline.name, "generation": log.generation(pipeline.name),
              "regions": {}}
    for name, spec in pipeline.regions.items():
        rlog = logs[name]
        restorable = rlog.restorable(spec.regime)
        latest = rlog.latest
        status["regions"][name] = {
            "regime": spec.regime, "domain": spec.domain,
            "latest": None if latest is None else {"time": latest.time, "status": latest.status,
                                                   "generation": latest.generation},
            "frontier": restorable[-1].time if restorable else -1,
            "checkpoints": [r.time for r in restorable if r.state_ref],
            "low_watermark": wm[name].to_json(),
            "running": jobs.get(name),
            "quarantined": [{"epoch": r.epoch, "generation": r.generation, "why": r.note}
                            for r in rlog.quarantined()],
        }
    if args.json:
        print(json.dumps(status))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"pipeline {pipeline.name}, generation {status['generation']}",
                  title_justify="left")
    for col in ("region", "regime", "latest epoch", "frontier", "checkpoints",
                "low watermark", "job"):
        table.add_column(col)
    for name, s in status["regions"].items():
        latest = "—" if s["latest"] is None else f"{s['latest']['time']} {s['latest']['status']}"
        table.add_row(name, s["regime"], latest, json.dumps(s["frontier"]),
                      ", ".join(json.dumps(c) for c in s["checkpoints"][-4:]),
                      json.dumps(s["low_watermark"]), s["running"] or "stopped")
    console = Console()
    console.print(table)
    for name, s in status["regions"].items():
        for q in s["quarantined"]:
            console.print(f"[red]quarantined[/red] {name} epoch {q['epoch']} (generation "
                          f"{q['generation']}): {q['why']}")
    return 0


def cmd_rollback(args: argparse.Namespace) -> int:
    from falkirk.recovery.rollback import RollbackExecutor, RollbackRequest
    from falkirk.runtime.procs import stop_regions

    pipeline = _pipeline(args.pipeline)
    request = RollbackRequest(pipeline.name, failed=_split(args.failed), region=args.region,
                              to_epoch=args.to_epoch, reason=args.reason or "",
                              dry_run=args.dry_run)
    executor = RollbackExecutor(pipeline,
                                stop_regions=lambda regions: stop_regions(pipeline, regions))
    from rich.console import Console

    console = Console(stderr=args.json)
    with console.status("rolling back…" if not args.dry_run else "planning…") as status:
        plan = executor.run(request, progress=lambda msg: (status.update(msg), console.log(msg)))
    if args.json:
        print(json.dumps(plan.to_json()))
        return 0
    from rich.table import Table

    table = Table(title=("dry run: nothing changed — " if args.dry_run else "")
                  + f"rollback {plan.rollback_id} of {plan.pipeline} → generation "
                  f"{plan.generation}", title_justify="left")
    for col in ("region", "regime", "current", "frontier"):
        table.add_column(col)
    for name, f in plan.frontiers.items():
        table.add_row(name, pipeline.regions[name].regime, json.dumps(plan.current[name]),
                      "⊤ (keeps its live state)" if f == "top" else json.dumps(f))
    console.print(table)
    for t in plan.tables:
        console.print(f"restore {t.table} to version {t.to_version} ({t.region})")
    for r in plan.replay:
        console.print(f"replay {r['edge']}: after {r['after']} through {r['through']}")
    for r in plan.rerun:
        console.print(f"rerun {r['region']}: after {r['after']}"
                      + (f" through {r['through']}" if r["through"] is not None else ""))
    return 0


def cmd_gc(args: argparse.Namespace) -> int:
    from rich.console import Console

    from falkirk.recovery.gc import collect, follow

    pipeline = _pipeline(args.pipeline)
    console = Console()
    if args.follow:
        def heard(report) -> None:
            if args.json:
                print(json.dumps(report.to_json()), flush=True)
            else:
                _print_gc(console, pipeline.name, report)

        console.print(f"collecting garbage of {pipeline.name} every {args.every:g} s "
                      "(Ctrl-C ends it)", style="dim")
        try:
            follow(pipeline, every_s=args.every, retention_hours=args.retention_hours,
                   on_report=heard)
        except KeyboardInterrupt:
            return 0
    report = collect(pipeline, apply=args.apply,
                     vacuum_retention_hours=args.retention_hours)
    if args.json:
        print(json.dumps(report.to_json()))
        return 0
    _print_gc(console, pipeline.name, report)
    return 0


def _print_gc(console, name: str, report) -> None:
    """A collection as a table of its items, the watermarks and the tables kept whole."""
    from rich.table import Table

    title = (f"garbage collection of {name} "
             + ("(applied)" if report.applied else "(dry run: nothing changed; --apply to "
                "do it)"))
    table = Table(title=title, title_justify="left")
    for col in ("store", "name", "rows", "files", "bytes", "rule"):
        table.add_column(col)
    for item in report.items:
        table.add_row(item.store, item.name, f"{item.rows:,}", f"{item.files:,}",
                      f"{item.bytes:,}", item.rule)
    console.print(table if report.items else f"{title}: nothing to remove")
    console.print(f"low watermarks: {json.dumps(report.watermarks)}")
    if report.kept_tables:
        console.print(f"tables kept whole (products; declare retain_epochs on an edge to "
                      f"make one a log): {', '.join(report.kept_tables)}")


def cmd_jars(args: argparse.Namespace) -> int:
    """Fetch the JVM jars (Spark's Kafka connector, delta-spark, the Kafka broker,
    hadoop-aws with the AWS SDK, the cluster's object store) from Maven Central into the
    jar folder, or only check them (--check)."""
    from falkirk.config import load
    from falkirk.io import classdata, jars

    try:
        for name in jars.SETS:
            if not args.check and jars.fetch(name):
                print(f"fetched the {name} jars into {jars.lib_dir() / name}")
            found = jars.jars(name)
            print(f"{name}: {len(found)} jars in {jars.lib_dir() / name}, complete")
        cfg = load()
        if not args.check and not args.no_class_data:
            classdata.train(cfg)
        archive = classdata.archive(cfg)
        print(f"class-data archive for profile {cfg.env!r}: " + (
            str(archive) if archive is not None and archive.is_file() else
            "none (falkirk jars trains it)"))
    except (jars.JarsError, classdata.ClassDataError) as err:
        raise CliError(str(err)) from None
    return 0


def cmd_engine(args: argparse.Namespace) -> int:
    """Start, stop or show the Spark Connect engine the jobs are clients of."""
    import json as _json

    from falkirk.config import load
    from falkirk.runtime import engine
    from falkirk.runtime.launcher import launcher

    cfg = load()
    try:
        if args.action == "start":  # before a pipeline's jobs: an engine it starts warms up
            launcher(cfg).ensure(warm=True)
        elif args.action == "stop":
            print("stopped" if engine.stop_local(cfg) else
                  f"no engine started by falkirk in {engine.folder(cfg)}")
            return 0
    except engine.EngineError as err:
        raise CliError(str(err)) from None
    info = engine.status(cfg)
    if args.json:
        print(_json.dumps(info))
    elif not info["remote"]:
        print(f"profile {cfg.env!r} runs every job as a Spark application of its own "
              "(no spark_remote)")
    else:
        print(f"engine {info['remote']}: {'answering' if info['answering'] else 'down'}"
              + (f", pid {info['pid']}" if info["pid"] else "")
              + f"; log {info['log']}")
    return 0


def cmd_broker(args: argparse.Namespace) -> int:
    """Start, stop or show the embedded Kafka broker at the profile's address."""
    from falkirk.config import load
    from falkirk.local import broker

    cfg = load()
    try:
        if args.action == "start":
            found, started = broker.start_embedded(cfg)
            print(f"broker {found.bootstrap}: " + ("started" if started else
                                                   "already answering")
                  + f" (data {found.data_dir}, log {found.log_path})")
            return 0
        if args.action == "stop":
            print("stopped" if broker.stop_embedded(cfg) else
                  "no broker started by falkirk broker start is running")
            return 0
        info = broker.embedded_status(cfg)
    except broker.BrokerError as err:
        raise CliError(str(err)) from None
    if args.json:
        print(json.dumps(info))
    else:
        print(f"broker {info['bootstrap']}: {'answering' if info['answering'] else 'down'}"
              + (f", process group {info['pgid']}" if info["pgid"] else "")
              + f"; log {info['log']}")
    return 0 if info["answering"] else 1


def cmd_produce(args: argparse.Namespace) -> int:
    """Send a file of JSON records to a pipeline's input topic (the records' ``ts`` is
    their Kafka timestamp); ``falkirk bound`` then declares the input ended."""
    from kafka.errors import KafkaError

    from falkirk.config import load
    from falkirk.local.run import input_records, send_records

    pipeline = _pipeline(args.pipeline)
    inputs = {e.topic: e.partitions for e in pipeline.edges.values()
              if e.kind == "kafka" and e.src is None}
    path = Path(args.file)
    topic = args.topic or path.name.split(".")[0]
    if topic not in inputs:
        raise CliError(f"{pipeline.name} has no input topic {topic!r} (its inputs: "
                       f"{', '.join(inputs) or 'none'}); name it with --topic or the file "
                       "(<topic>.jsonl)")
    if not path.is_file():
        raise CliError(f"{path}: no such file")
    records = input_records(path, int(pipeline.settings["origin_ms"]), note=print)
    bootstrap = load().kafka_bootstrap
    try:
        sent = send_records(bootstrap, {topic: inputs[topic]}, {topic: records},
                            client_id="falkirk-produce")
    except KafkaError as err:
        raise CliError(f"cannot send to {bootstrap}: {err} (falkirk broker start runs the "
                       "embedded one)") from None
    print(f"{pipeline.name}: sent {sent[topic]} records to {topic} at {bootstrap}")
    return 0


def cmd_airflow(args: argparse.Namespace) -> int:
    """falkirk's local Airflow: start, stop, status, respawn a component, or its CLI."""
    from falkirk.local.airflow import LocalAirflow

    action = args.action or "start"
    airflow = LocalAirflow(port=args.port if action == "start" else None)
    if action == "start":
        airflow.start()
    elif action == "stop":
        airflow.stop()
    elif action == "status":
        return 0 if airflow.status() else 1
    elif action == "respawn":
        airflow.respawn(args.component)
    else:
        airflow.cli(args.args)
    return 0


def cmd_bound(args: argparse.Namespace) -> int:
    """Declare the pipeline's input ended where its topics end now (a bounded run)."""
    from falkirk.runtime.bounds import declare_bounds

    pipeline = _pipeline(args.pipeline)
    try:
        bounds = declare_bounds(pipeline, topics=_split(args.topics) or None)
    except ValueError as err:
        raise CliError(str(err)) from None
    for topic, offsets in bounds.items():
        print(f"{pipeline.name}: input {topic} ends at {json.dumps(offsets, sort_keys=True)} "
              f"({sum(offsets.values())} records); its jobs end after the last epoch there")
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    """Data checks of committed epochs; failing epochs are quarantined (exit status 1)."""
    from rich.console import Console
    from rich.table import Table

    from falkirk.config import load
    from falkirk.quality.checks import Validator
    from falkirk.runtime.launcher import session

    pipeline = _pipeline(args.pipeline)
    console = Console(stderr=args.json)
    with console.status("starting Spark and Great Expectations…") as status:
        spark = session("falkirk-validate")
        validator = Validator(pipeline, spark, load(), docs=not args.no_docs)
        def progress(row) -> None:
            status.update(f"checking {row.region} epoch {row.epoch} "
                          f"(generation {row.generation})…")

        if args.follow:  # long-running: progress goes to the log, one line per epoch
            import logging

            logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                                format="%(asctime)s %(levelname)s %(name)s: %(message)s")
            report = validator.follow(args.until_epoch, progress=progress)
        else:
            report = validator.run(
                epochs=None if args.epoch is None else [args.epoch],
                regions=_split(args.region) or None, quarantine=not args.no_quarantine,
                progress=progress)
    if args.json:
        print(json.dumps(report.as_dict(), default=str))
        return 1 if report.failures else 0
    table = Table(title=f"data checks of {pipeline.name}")
    for col in ("region", "epoch", "gen", "checks", "seconds", "result"):
        table.add_column(col)
    for region, epoch, gen, seconds, outcomes in report.epochs:
        bad = [o for o in outcomes if not o.success]
        table.add_row(region, str(epoch), str(gen), str(len(outcomes)), f"{seconds:.1f}",
                      "[green]passed[/green]" if not bad else
                      "[red]failed: " + "; ".join(f"{o.table} {o.check} {o.observed}"
                                                  for o in bad[:3]) + "[/red]")
    if report.epochs:
        console.print(table)
    elif not validator.suite_files() and not validator.invariants:
        console.print(f"nothing to check: pipeline {pipeline.name!r} declares no expectation "
                      f"suite (schemas/expectations/<table>.json beside its declaration) and "
                      f"no invariant")
    else:
        console.print("nothing to check: every committed epoch has been checked (--epoch N "
                      "checks one again)")
    unsuited = sorted(set(validator.tables) - set(validator.suite_files()))
    if unsuited and (validator.suite_files() or validator.invariants):
        console.print(f"no expectation suite for table(s) {', '.join(unsuited)} (only "
                      f"invariants check them; a suite goes in schemas/expectations/<table>"
                      f".json beside the declaration)")
    for region, epoch in report.quarantined:
        console.print(f"[red]quarantined[/red] {region} epoch {epoch}: readers hold back; "
                      f"roll back to the last good epoch and rerun to release it")
    for conf in report.rollbacks:
        console.print(f"rollback requested: {json.dumps(conf)}")
    if report.docs:
        console.print(f"Data Docs: {report.docs}")
    return 1 if report.failures else 0


def cmd_init(args: argparse.Namespace) -> int:
    """Write a small working pipeline (falkirk.local's template) into a new folder."""
    import shutil

    from falkirk.model.topology import NAME_RULE

    target = Path(args.dir)
    name = target.resolve().name
    if not NAME_RULE.match(name):
        raise CliError(f"{target}: the folder's name is the pipeline's name and must be a "
                       f"lower-case identifier (got {name!r})")
    if target.exists() and any(target.iterdir()):
        raise CliError(f"{target}: exists and is not empty; nothing was written")
    template = Path(__file__).resolve().parent / "local" / "template"
    shutil.copytree(template, target, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    declaration = target / "pipeline.yaml"
    declaration.write_text(declaration.read_text().replace("__PIPELINE__", name))
    (target / ".gitignore").write_text(".falkirk/\n__pycache__/\n")
    print(f"wrote pipeline {name!r} in {target}:")
    for path in sorted(p for p in target.rglob("*") if p.is_file()):
        print(f"  {path.relative_to(target)}")
    print(f"next: falkirk run {target}   (docs/guide.md walks through the rest)")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    """Run a pipeline folder on the embedded defaults: its own broker and lake under
    <dir>/.falkirk/run (made anew), its input from <dir>/input/<topic>.jsonl."""
    import shutil
    import time

    from falkirk.io.lake import read_table
    from falkirk.local.run import LocalRun
    from falkirk.model.topology import load_pipeline

    folder = Path(args.dir).resolve()
    declaration = folder if folder.suffix in (".yaml", ".yml") else folder / "pipeline.yaml"
    pipeline = load_pipeline(declaration)  # refused here, before anything starts
    folder = declaration.parent
    root = folder / ".falkirk" / "run"
    if root.exists():
        shutil.rmtree(root)
    with LocalRun(root, declaration) as run:
        print(f"broker {run.cfg.kafka_bootstrap}, lake {run.cfg.lake}")
        sent = run.produce_files(folder / "input", note=print)
        print("input: " + ", ".join(f"{n} records to {t}" for t, n in sent.items()))
        run.start()
        for job in run.procs:
            print(f"started {job} (log {run.log_file(job)})")
        def committed() -> dict[str, int]:
            return {region: len([r for r in rlog.entries.values()
                                 if r.status in ("committed", "checkpointed")])
                    for region, rlog in run.log.regions(pipeline).items()}

        deadline, seen = time.monotonic() + args.timeout, committed()
        while any(p.poll() is None for p in run.procs.values()):  # progress as epochs commit
            if time.monotonic() > deadline:
                break  # run.wait below names the job still running
            dead = {j: p.returncode for j, p in run.procs.items() if p.poll() not in (None, 0)}
            if dead:  # no supervisor here: the others would only wait for it
                run.stop_all()
                raise CliError("job(s) failed, the others stopped: " + "; ".join(
                    f"{job} (exit {code}): " + _tail(run.log_file(job))
                    for job, code in dead.items()))
            time.sleep(3)
            now = committed()
            if now != seen:
                print("epochs committed: " + ", ".join(f"{r} {n}" for r, n in now.items()))
                seen = now
        codes = run.wait(timeout_s=max(1.0, deadline - time.monotonic()), progress=print)
        for region, n in committed().items():
            print(f"region {region:16} {pipeline.regions[region].regime:9} epochs committed: "
                  f"{n}")
        opts = run.cfg.delta_storage_options or None
        for table in sorted({e.table for e in pipeline.edges.values()
                             if e.kind == "delta" and e.src is not None}):
            rows = read_table(run.cfg.table(table), storage_options=opts).num_rows
            print(f"table  {table:20} {rows} rows")
    failed = {job: code for job, code in codes.items() if code != 0}
    if failed:
        raise CliError("job(s) failed: " + "; ".join(
            f"{job} (exit {code}): " + _tail(run.log_file(job)) for job, code in failed.items()))
    return 0


def _tail(log: Path, lines: int = 3) -> str:
    """The last lines of a job's log, and where the rest is."""
    text = log.read_text(errors="replace").strip().splitlines() if log.exists() else []
    return " | ".join(text[-lines:]) + f" (log {log})"


def cmd_pipelines(args: argparse.Namespace) -> int:
    from falkirk.model.topology import check_declared

    found = check_declared()
    if args.json:
        print(json.dumps({n: {"file": str(p), "error": e} for n, (p, e) in found.items()}))
    else:
        for name, (path, error) in found.items():
            print(f"{name:20} {'ok   ' if error is None else 'ERROR'} {path}")
            if error is not None:
                print(f"{'':20}       {error}")
    return 0 if all(e is None for _, e in found.values()) else 1







def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="falkirk",
        description="Rollback recovery for Spark pipelines with a fault-tolerance regime "
        "per region.",
    )
    sub = parser.add_subparsers(dest="verb", required=True)

    p = sub.add_parser("plan", help="compute the consistent frontiers and the rollback plan")
    p.add_argument("--problem", type=Path,
                   help="an offline problem (JSON, see falkirk/solver/problems); "
                        "without it, plan from the live epoch log")
    p.add_argument("--pipeline", help="declared pipeline (default: the only one declared)")
    p.add_argument("--failed", help="comma-separated regions that failed (live log only)")
    p.add_argument("--save-problem", type=Path, help="also write the problem solved (JSON)")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("examples", help="solve the worked examples and print their plans")
    p.add_argument("--json", action="store_true", help="one JSON object per example")
    p.set_defaults(func=cmd_examples)

    p = sub.add_parser("status", help="regions, epochs, checkpoints, frontiers, watermarks")
    p.add_argument("--pipeline", help="declared pipeline (default: the only one declared)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("rollback", help="roll the pipeline back to a consistent frontier")
    p.add_argument("--pipeline", help="declared pipeline (default: the only one declared)")
    p.add_argument("--failed", help="comma-separated regions that failed")
    p.add_argument("--region", help="a region to take back on purpose (with --to-epoch)")
    p.add_argument("--to-epoch", type=int, help="the epoch to take --region back to")
    p.add_argument("--reason", help="why (recorded with the rollback; required unless dry run)")
    p.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_rollback)

    p = sub.add_parser("gc", help="garbage collection by low watermark (dry run by default)")
    p.add_argument("--pipeline", help="declared pipeline (default: the only one declared)")
    p.add_argument("--apply", action="store_true", help="really drop and vacuum")
    p.add_argument("--retention-hours", type=float, default=1.0,
                   help="vacuum only files older than this (writers may be mid-commit)")
    p.add_argument("--follow", action="store_true",
                   help="keep collecting as epochs commit (applies; Ctrl-C ends it)")
    p.add_argument("--every", type=float, default=60.0,
                   help="with --follow: seconds between looks (default 60)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_gc)

    p = sub.add_parser("jars", help="fetch the JVM jars (Kafka connector, delta-spark, the "
                       "Kafka broker) from Maven Central, once, and train the drivers' "
                       "class-data archive")
    p.add_argument("--check", action="store_true", help="only check them; fetch nothing")
    p.add_argument("--no-class-data", action="store_true", help="do not train the Spark "
                   "drivers' class-data archive (falkirk.io.classdata; about a minute, once)")
    p.set_defaults(func=cmd_jars)

    p = sub.add_parser("engine", help="the Spark Connect engine every job is a client of "
                       "(the embedded default starts by itself with the first job)")
    p.add_argument("action", choices=("start", "stop", "status"), nargs="?",
                   default="status")
    p.add_argument("--json", action="store_true", help="status as JSON")
    p.set_defaults(func=cmd_engine)

    p = sub.add_parser("broker", help="the embedded Apache Kafka broker (KRaft) at the "
                       "profile's address (127.0.0.1:19092 locally), for jobs under Airflow; "
                       "FALKIRK_KAFKA_BOOTSTRAP points falkirk at an existing cluster instead")
    p.add_argument("action", choices=("start", "stop", "status"), nargs="?", default="status")
    p.add_argument("--json", action="store_true", help="status as JSON")
    p.set_defaults(func=cmd_broker)

    p = sub.add_parser("bound", help="declare the input ended where its topics end now: "
                       "jobs end after its last epoch (a bounded run)")
    p.add_argument("--pipeline", help="declared pipeline (default: the only one declared)")
    p.add_argument("--topics", help="comma-separated input topics (default: all inputs)")
    p.set_defaults(func=cmd_bound)

    p = sub.add_parser("produce", help="send a file of JSON records (one a line, its ts the "
                       "Kafka timestamp) to a pipeline's input topic")
    p.add_argument("file", help="<topic>.jsonl: the topic is the file's name unless --topic")
    p.add_argument("--pipeline", help="declared pipeline or its folder (default: the only "
                   "one declared)")
    p.add_argument("--topic", help="the input topic (default: the file's name)")
    p.set_defaults(func=cmd_produce)

    p = sub.add_parser("airflow", help="falkirk's local Airflow (api-server, scheduler, "
                       "dag-processor, triggerer; the DAGs of every declared pipeline)")
    p.add_argument("--port", type=int, help="the API's port (default: $FALKIRK_AIRFLOW_PORT, "
                   "else 8080; its log servers use the next two)")
    actions = p.add_subparsers(dest="action", metavar="{start,stop,status,respawn,cli}")
    a = actions.add_parser("start", help="start it (the default) and wait for its API")
    a.add_argument("--port", type=int, default=argparse.SUPPRESS, help="the API's port")
    actions.add_parser("stop", help="stop it all: its session and its Celery workers")
    actions.add_parser("status", help="running or not, and where (exit 1: not running)")
    a = actions.add_parser("respawn", help="start a component that died again")
    a.add_argument("component", nargs="?", help="scheduler, triggerer or dag-processor")
    a = actions.add_parser("cli", help="Airflow's CLI against this instance (e.g. dags list)")
    a.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    p.set_defaults(func=cmd_airflow)

    p = sub.add_parser("validate", help="data checks of committed epochs (GX suites and "
                       "cross-region invariants); quarantines failing epochs")
    p.add_argument("--pipeline", help="declared pipeline (default: the only one)")
    p.add_argument("--epoch", type=int, help="check this epoch again (default: every "
                   "committed epoch not checked yet)")
    p.add_argument("--region", help="only these regions (comma-separated)")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.add_argument("--no-quarantine", action="store_true",
                   help="record results only; do not quarantine failing epochs")
    p.add_argument("--no-docs", action="store_true", help="skip building GX Data Docs")
    p.add_argument("--follow", action="store_true", help="keep checking epochs as they are "
                   "committed (what readers wait for with settings.checks.hold)")
    p.add_argument("--until-epoch", type=int, help="with --follow: stop once every checked "
                   "region passed this epoch")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("init", help="write a small working pipeline (3 regions, 3 regimes, "
                       "a Kafka input, Delta outputs, a suite, invariants, tests) into DIR")
    p.add_argument("dir", help="a new folder; its name is the pipeline's name")
    p.set_defaults(func=cmd_init)

    p = sub.add_parser("run", help="run a pipeline folder on the embedded defaults (its own "
                       "Kafka broker and lake under DIR/.falkirk/run; input from DIR/input/)")
    p.add_argument("dir", help="the pipeline's folder (or its YAML file)")
    p.add_argument("--timeout", type=float, default=1800, help="seconds to wait for the jobs")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("pipelines", help="the declared pipelines ($FALKIRK_PIPELINES, then "
                       "a checkout's examples/), each checked: its jobs, schemas and settings")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.set_defaults(func=cmd_pipelines)
    _add_dev_commands(sub)
    return parser


def _add_dev_commands(sub: argparse._SubParsersAction) -> None:
    """demo, generate, trials, chaos and bench live in the dev tooling (not in the
    wheel): a checkout has them, an installed falkirk does not."""
    import importlib.util

    if importlib.util.find_spec("falkirk_dev") is not None:
        from falkirk_dev.cli import add_commands

        add_commands(sub)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except FalkirkError as exc:
        print(f"falkirk {args.verb}: error: {exc}", file=sys.stderr)
        return 2


def run() -> None:
    """The console script: ``main`` then a hard exit once output is flushed.

    delta-rs can abort an interpreter at exit after all work is done (threads still
    alive at finalisation, delta-io/delta-rs#2184); nothing is left to finalise here.
    """
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    run()
