"""Multi-epoch passes (the Falkirk Wheel paper's selective rollback made real): a region
that is behind processes its ready epochs in one Spark pass, and every table, topic and
epoch log row still records each epoch apart, exactly as epoch-by-epoch processing does."""

from __future__ import annotations

import re

import pytest
from reference_runs import EPOCHS, INPUT, assert_ranges_tile_the_input, assert_same

from falkirk.local.broker import LocalBroker
from falkirk_dev.harness import LocalRun

pytestmark = [pytest.mark.slow, pytest.mark.system]


def run_with(root, max_pass: int) -> tuple[dict, dict, dict[str, list[str]], dict[str, str]]:
    """The reference pipeline with its input waiting; (outputs, messages per topic, each
    job's log lines saying what it did at once, each job's log)."""
    with LocalBroker(root / "broker") as b, LocalRun(root, broker=b) as run:
        # passes of this small input still read enough records for generated code
        run.env = {**run.env, "FALKIRK_MAX_PASS": str(max_pass),
                   "FALKIRK_CODEGEN_RECORDS": "1000"}
        run.generate(**INPUT)
        run.start(until_epoch=EPOCHS - 1)
        codes = run.wait(timeout_s=1200)
        assert set(codes.values()) == {0}, {j: str(run.log_file(j)) for j in codes}
        assert_ranges_tile_the_input(run)
        logs = {job: run.log_file(job).read_text() for job in run.procs}
        done = {job: re.findall(r"(epochs? [\d-]+(?: \(\d+ in one pass\))?) done by", text)
                for job, text in logs.items()}
        rows = run.log.regions(run.pipeline)
        for region, log in rows.items():  # an epoch log row per epoch, passes or not
            assert sorted(r.epoch for r in log.entries.values() if r.status in (
                "committed", "checkpointed")) == list(range(EPOCHS)), region
        return run.outputs(), run.sent(), done, logs


def test_passes_give_every_table_and_answer_of_epoch_by_epoch_processing(golden, tmp_path):
    passes, sent, done, logs = run_with(tmp_path / "passes", max_pass=30)
    assert any("in one pass" in line for line in done["jobs/ingest.py"]), done
    assert any("in one pass" in line for line in done["jobs/serve.py"]), done
    # big passes ran with Spark's generated code, and gave the same tables (below)
    assert "generated code on" in logs["jobs/ingest.py"]
    one, _, done_one, logs_one = run_with(tmp_path / "one", max_pass=1)
    assert not any("in one pass" in line for lines in done_one.values() for line in lines)
    # serve, behind with its input waiting, prepared each next epoch while the one before
    # committed (its counts then those that commit moved on to): the same answers
    assert re.search(r"prepared by serve\+stats in [\d.]+ s, beside the commits",
                     logs_one["jobs/serve.py"]), logs_one["jobs/serve.py"][-3000:]
    assert_same(golden, passes)
    assert_same(golden, one)
    assert_same(one, passes)
    assert sent["responses"]["resent"] == 0  # a pass sends each answer once


def test_a_job_killed_in_the_middle_of_a_pass_recovers_to_the_failure_free_outputs(
        golden, tmp_path):
    """ingest, its input all waiting, takes its five epochs in one pass and is SIGKILLed
    between two of the pass's Delta commits (``writer:after-commit``, the second of the
    process): some tables hold some of the pass's epochs, the epoch log none of them. The
    rollback plans from the log, ingest starts again from its frontier and redoes the
    pass; every output equals the failure-free run's, nothing lost or doubled."""
    root = tmp_path / "mid-pass"
    with LocalBroker(root / "broker") as b, LocalRun(root, broker=b) as run:
        run.generate(**INPUT)
        plain = dict(run.env)
        run.env = {**plain, "FALKIRK_CRASH_AT": "writer:after-commit@2"}
        run.start(jobs=["jobs/ingest.py"], until_epoch=EPOCHS - 1)
        ingest = run.procs["jobs/ingest.py"]
        assert ingest.wait(timeout=600) == -9  # killed at the crash point, mid-pass
        log = run.log_file("jobs/ingest.py").read_text()
        assert re.search(r"epochs 0-\d+ ", log) is None  # the pass never finished
        assert "done by ingest" not in log
        run.env = plain
        plan = run.rollback(failed=["ingest"], reason="test: ingest killed mid-pass")
        run.start()  # ingest again, and every other job
        codes = run.wait(timeout_s=1200)
        assert set(codes.values()) == {0}, {j: str(run.log_file(j)) for j in codes}
        assert_ranges_tile_the_input(run)
        rows = run.log.regions(run.pipeline)["ingest"].entries.values()
        assert sorted(r.epoch for r in rows if r.status == "committed") == list(range(EPOCHS))
        assert re.search(r"epochs 0-\d+ \(\d+ in one pass\) done by ingest",
                         run.log_file("jobs/ingest.py").read_text())
        assert_same(golden, run.outputs())
    assert plan is not None
