"""The operator's verbs on a live epoch log: status, plan, rollback --dry-run, gc."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import yaml
from tiny_pipeline import PIPE_DICT, TABLE_SCHEMA


def falkirk(world, tmp_path, *args: str) -> subprocess.CompletedProcess:
    cfg = world[0]
    declaration = tmp_path / "tiny.yaml"
    declaration.write_text(yaml.safe_dump(PIPE_DICT))
    for spec in PIPE_DICT["regions"].values():  # the verbs here read the log, never run a job
        job = tmp_path / spec["job"]
        job.parent.mkdir(exist_ok=True)
        job.write_text('"""tiny pipeline job: declared, not started by these tests."""\n')
    tables = tmp_path / "schemas" / "tables"
    tables.mkdir(parents=True, exist_ok=True)
    for name in ("t_in", "t_mid", "t_out"):  # the schema the world's tables were written with
        (tables / f"{name}.json").write_text(json.dumps(TABLE_SCHEMA))
    env = {**os.environ, "FALKIRK_LAKE": cfg.lake, "FALKIRK_VAR_DIR": str(tmp_path / "var")}
    return subprocess.run([sys.executable, "-m", "falkirk.cli", args[0], "--pipeline",
                           str(declaration), *args[1:]], capture_output=True, text=True,
                          env=env, timeout=120)


def test_status_lists_regions_epochs_checkpoints_and_watermarks(world, tmp_path):
    run = falkirk(world, tmp_path, "status", "--json")
    assert run.returncode == 0, run.stderr
    status = json.loads(run.stdout)
    assert status["generation"] == 0
    agg = status["regions"]["agg"]
    assert agg["regime"] == "lazy" and agg["frontier"] == 3 and agg["checkpoints"] == [1, 3]
    assert agg["latest"] == {"time": 4, "status": "committed", "generation": 0}
    assert status["regions"]["report"]["low_watermark"] == 3
    assert falkirk(world, tmp_path, "status").returncode == 0  # the table form


def test_rollback_dry_run_prints_the_plan_and_gc_dry_run_its_report(world, tmp_path):
    run = falkirk(world, tmp_path, "rollback", "--failed", "agg", "--dry-run", "--json")
    assert run.returncode == 0, run.stderr
    plan = json.loads(run.stdout)
    # agg committed epoch 4 after its checkpoint at 3 and reads another job's table: it
    # reaches epoch 4 again by replay, so report (unlogged from agg) keeps its state
    assert plan["frontiers"] == {"ingest": "top", "agg": 4, "report": "top"}
    assert world[1].rollbacks("tiny") == []  # a dry run records nothing
    table = falkirk(world, tmp_path, "rollback", "--failed", "agg", "--dry-run")
    assert "dry run: nothing changed" in table.stdout
    gc = falkirk(world, tmp_path, "gc", "--json")
    # garbage collection keeps what a replay starts from: agg's checkpoint at 3
    assert json.loads(gc.stdout)["watermarks"] == {"ingest": 5, "agg": 3, "report": 3}


def test_bad_rollback_requests_are_one_clear_line(world, tmp_path):
    run = falkirk(world, tmp_path, "rollback", "--failed", "agg,nope", "--reason", "x")
    assert run.returncode == 2
    assert "has no region(s) ['nope']" in run.stderr and "Traceback" not in run.stderr


def test_validate_says_when_a_pipeline_declares_nothing_to_check(world, tmp_path):
    run = falkirk(world, tmp_path, "validate", "--no-docs")
    assert run.returncode == 0, run.stderr
    assert "pipeline 'tiny' declares no expectation suite" in " ".join(run.stdout.split())


def test_a_suite_beside_the_declaration_is_the_one_checked(world, tmp_path):
    """A pipeline's own schemas/expectations/<table>.json (not falkirk's) checks its table."""
    folder = tmp_path / "schemas" / "expectations"
    folder.mkdir(parents=True)
    (folder / "t_out.json").write_text(json.dumps({"expectations": [
        {"type": "expect_column_values_to_be_in_set",
         "kwargs": {"column": "value", "value_set": ["t_out0", "t_out1"]}}]}))
    run = falkirk(world, tmp_path, "validate", "--no-docs", "--json", "--no-quarantine")
    report = json.loads(run.stdout)
    checked = {(e["region"], e["epoch"]): e for e in report["epochs"]}
    assert set(checked) == {("report", k) for k in range(5)}, report
    failed = sorted(k for (_, k), e in checked.items() if e["failed"])
    assert failed == [2, 3, 4], report  # values t_out2.. are outside the set
