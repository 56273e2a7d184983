"""Data checks: suite files, GX suites and cross-region invariants on a real reference run,
broken data caught with the expectation named, and quarantine → rollback → release."""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from dataclasses import replace

import pyarrow as pa
import pytest
from reference_runs import EPOCHS

from falkirk.log.epochlog import EpochRecord
from falkirk.model.topology import Pipeline, load_pipeline
from falkirk.quality.checks import CheckError, Validator, load_suite

# ---- suite files (no Spark) -------------------------------------------------------------


def test_every_output_table_of_the_reference_pipeline_has_a_suite_gx_accepts():
    from falkirk.quality.checks import Suites

    pipeline = load_pipeline("reference")
    tables = sorted({e.table for e in pipeline.edges.values() if e.kind == "delta"})
    folder = pipeline.schema_roots[0] / "expectations"
    assert sorted(p.stem for p in folder.glob("*.json")) == tables
    suites = Suites({t: folder / f"{t}.json" for t in tables})  # in an ephemeral GX context
    assert sorted(suites.checkpoints) == sorted(
        (engine, t) for engine in ("pandas", "spark") for t in tables)


def test_a_missing_or_malformed_suite_is_refused_naming_the_file(tmp_path):
    with pytest.raises(CheckError, match="no expectation suite for table 'nope'"):
        load_suite("nope", tmp_path)
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(CheckError, match=r"bad\.json: not JSON"):
        load_suite("bad", tmp_path)
    (tmp_path / "typeless.json").write_text(json.dumps({"expectations": [{"kwargs": {}}]}))
    with pytest.raises(CheckError, match=r"typeless\.json: expectations\[0\] needs a 'type'"):
        load_suite("typeless", tmp_path)


def test_a_quarantined_epoch_bounds_what_a_region_can_restore_to(world):
    """No frontier at or past a quarantined epoch: a frontier vouches for all before it."""
    from tiny_pipeline import PIPE

    from falkirk.solver.frontier import solve

    _, log, _, _ = world
    before = [r.epoch for r in log.regions(PIPE)["ingest"].restorable("ephemeral")]
    row = log.regions(PIPE)["ingest"].entries[3]
    log.record(replace(row, status="quarantined", recorded_at=None, note="test"))
    rlog = log.regions(PIPE)["ingest"]
    assert [r.epoch for r in rlog.quarantined()] == [3]
    assert [r.epoch for r in rlog.restorable("ephemeral")] == [e for e in before if e < 3]
    plan = solve(log.problem(PIPE, failed=["ingest"]))
    assert plan.frontiers["ingest"].key == 2


def test_receivers_never_read_a_quarantined_or_unchecked_epoch(world):
    """readable(): a receiver waits on a quarantined epoch, a side input falls back to the
    last good one; with hold, only epochs whose checks passed are read."""
    from tiny_pipeline import PIPE

    _, log, _, _ = world
    row = log.regions(PIPE)["ingest"].entries[3]
    log.record(replace(row, status="quarantined", recorded_at=None, note="test"))
    rlog = log.regions(PIPE)["ingest"]
    assert rlog.readable(2, 2) is rlog.entries[2]
    assert rlog.readable(3, 3) is False  # a receiver waits
    assert rlog.readable(4, 4) is False  # and cannot skip past it
    assert rlog.readable(4, 4, side_input=True).epoch == 2  # a side input: last good
    assert rlog.readable(9, 9) is False  # not committed yet
    # hold: only checked epochs (a side input waits too); past a quarantined epoch a side
    # input falls back to the last good epoch that was checked
    checked = {(0, 0), (1, 0)}
    assert rlog.readable(2, 2, checked=checked) is False
    assert rlog.readable(2, 2, side_input=True, checked=checked) is False
    assert rlog.readable(1, 1, checked=checked) is rlog.entries[1]
    assert rlog.readable(4, 4, side_input=True, checked=checked).epoch == 1
    assert rlog.readable(4, 4, side_input=True, checked=set()) is None


def test_passed_checks_takes_the_latest_result_of_every_check(world):
    from datetime import UTC, datetime, timedelta

    _, log, _, _ = world
    t0 = datetime(2026, 1, 1, tzinfo=UTC)

    def result(epoch, check, success, minutes):
        return {"pipeline": "tiny", "region": "ingest", "table": "t_in", "epoch": epoch,
                "generation": 0, "version": 1, "check": check, "success": success,
                "observed": "{}", "sample": "[]", "seconds": 0.1,
                "checked_at": t0 + timedelta(minutes=minutes)}

    log.record_checks([result(0, "a", True, 0), result(0, "b", True, 0),
                       result(1, "a", True, 0), result(1, "b", False, 0),
                       result(2, "a", False, 0), result(2, "a", True, 1)])
    assert log.passed_checks("tiny") == {"ingest": {(0, 0), (2, 0)}}


def test_on_failure_rollback_asks_the_rollback_dag_for_the_last_good_epoch(world, airflow_env):
    from tiny_pipeline import PIPE_DICT

    from falkirk.airflow.checks_tasks import _outcome
    from falkirk.quality.checks import Report

    cfg, log, _, _ = world
    settings = {**PIPE_DICT["settings"], "checks": {"on_failure": "rollback"}}
    pipe = Pipeline.from_dict({**PIPE_DICT, "settings": settings})
    row = log.regions(pipe)["ingest"].entries[3]
    log.record(replace(row, status="quarantined", recorded_at=None, note="test"))
    v = Validator(pipe, None, cfg, log, docs=False)
    report = Report("tiny", quarantined=[("ingest", 3)])
    confs = v.rollback_requests(report)
    assert confs == [{"pipeline": "tiny", "failed_regions": ["ingest"], "to_epoch": 2,
                      "dry_run": False, "reason": "data checks failed: ingest epoch 3"}]
    # the Airflow task hands them to the mapped trigger; without them it fails, saying why
    report.rollbacks = confs
    assert _outcome(report.as_dict()) == confs
    report.rollbacks = []
    from airflow.sdk.exceptions import AirflowFailException

    with pytest.raises(AirflowFailException, match="quarantined ingest epoch 3"):
        _outcome(report.as_dict())


# ---- on a real reference run (broker, Spark, delta-rs) ----------------------------------


@pytest.fixture(scope="module")
def reference(reference_run):
    """The session's failure-free reference run (conftest), whose broker is still up, run
    with ``settings.checks.hold``: the validator ran beside the jobs and receivers read only
    epochs whose checks passed. ``run.golden``: its outputs."""
    return reference_run


@pytest.fixture(scope="module")
def validator(reference, spark):
    return Validator(reference.pipeline, spark, reference.cfg, reference.log)


def _row(run, region: str, epoch: int) -> EpochRecord:
    return next(r for r in run.log.regions(run.pipeline)[region].entries.values()
                if r.epoch == epoch)


def _replace_epoch(run, spark, table: str, epoch: int, rows: list[dict]) -> int:
    """A new version of ``table`` whose rows of ``epoch`` are ``rows`` (a bad commit),
    committed by delta-rs as every commit of a data table is."""
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    from falkirk.model.schemas import arrow_schema

    schema = arrow_schema("tables", run.pipeline.edges[table].table_schema,
                          run.pipeline.schema_roots)
    write_deltalake(run.cfg.table(table), pa.Table.from_pylist(rows, schema=schema),
                    mode="overwrite", predicate=f"epoch = {epoch}")
    return DeltaTable(run.cfg.table(table)).version()


@contextmanager
def bad_commit(run, table: str, epoch: int, rows: list[dict]):
    """A bad version of ``table`` for one test; the table is restored after it."""
    from deltalake import DeltaTable
    from pyspark.sql import SparkSession

    from falkirk.io.delta import rollback_table

    spark = SparkSession.getActiveSession()
    before = DeltaTable(run.cfg.table(table)).version()
    try:
        yield _replace_epoch(run, spark, table, epoch, rows)
    finally:
        rollback_table(run.cfg.table(table), before)


def _epoch_rows(run, table: str, epoch: int) -> list[dict]:
    return [r for r in run.golden[table] if r["epoch"] == epoch]


def _failed(outcomes) -> dict[str, dict]:
    return {o.check: o.observed for o in outcomes if not o.success}


@pytest.mark.slow
def test_every_check_passed_before_any_reader_relied_on_the_epoch(reference):
    """The validator ran beside the jobs (hold): every region-epoch passed every check,
    and each receiver started an epoch only after the epoch it reads had passed."""
    from falkirk.runtime.procs import jobs_of

    run = reference
    results = run.log.checks("reference")
    assert results and all(r["success"] for r in results), [
        (r["region"], r["epoch"], r["check"], r["observed"]) for r in results
        if not r["success"]]
    checked = {(r["region"], r["epoch"]) for r in results}
    for region in ("ingest", "popularity", "communities", "serve", "stats"):
        assert {(region, e) for e in range(EPOCHS)} <= checked, region
    assert {"invariant:events_conserved", "invariant:purchases_conserved",
            "invariant:queries_answered_once", "invariant:running_totals",
            "invariant:labels_cover_users"} <= {r["check"] for r in results}
    passed_at: dict[tuple[str, int], object] = {}
    for r in results:
        key = (r["region"], r["epoch"])
        passed_at[key] = max(passed_at.get(key, r["checked_at"]), r["checked_at"])
    job = {region: j for j, regions in jobs_of(run.pipeline).items() for region in regions}
    started = [r for r in run.log.records("reference") if r.status == "running"]
    relied = 0
    for edge in run.pipeline.edges.values():
        if edge.kind != "delta" or edge.dst is None or job[edge.src] == job[edge.dst]:
            continue
        for r in (r for r in started if r.region == edge.dst):
            needed = r.epoch - edge.delay
            if needed >= 0:
                assert passed_at[(edge.src, needed)] < r.recorded_at, (edge.name, r.epoch)
                relied += 1
    assert relied >= 3 * EPOCHS


@pytest.mark.slow
def test_the_scale_benchmarks_plain_spark_job_computes_the_pipelines_tables(reference, spark,
                                                                           tmp_path):
    """The scale benchmark compares falkirk with one plain PySpark pass over the same topics
    (no epochs, no fault tolerance): a fair limit only if it computes the same tables and
    answers, which it must on this run's input."""
    import json

    from falkirk_dev.bench import plain_spark

    lake = str(tmp_path / "plain")
    facts = plain_spark.run(spark, reference.cfg.kafka_bootstrap, reference.pipeline, lake,
                            EPOCHS - 1)
    assert facts["component_rounds"] >= 1
    tables = {t: rows for t, rows in reference.golden.items() if not t.startswith("topic:")}
    assert {t: plain_spark.as_rows(lake, t) == rows for t, rows in tables.items()} == {
        t: True for t in tables}
    assert all(tables[t] for t in ("purchases", "interactions", "dead_letters",
                                   "item_popularity", "user_community", "query_stats"))
    answers = {k: json.loads(v) for k, v in reference.golden["topic:responses"].items()}
    assert answers and plain_spark.responses_by_key(lake) == answers


def test_checking_every_epoch_again_passes_and_takes_seconds(reference, validator, capsys):
    started = time.monotonic()
    report = validator.run(epochs=range(EPOCHS))
    seconds = time.monotonic() - started
    assert not report.failures, json.dumps(report.as_dict()["epochs"], indent=1)[:3000]
    assert len(report.epochs) == 5 * EPOCHS  # every region writes a checked table
    # Data Docs built for these runs
    assert report.docs is not None and report.docs.exists()
    assert "item_popularity" in report.docs.read_text()
    # nothing pending: the validator beside the jobs checked every committed epoch
    assert validator.run().epochs == []
    with capsys.disabled():
        per = sorted(s for *_, s, _ in report.epochs)
        print(f"\n[checks] {len(per)} region-epochs in {seconds:.1f} s; per region-epoch "
              f"median {per[len(per) // 2]:.2f} s, max {per[-1]:.2f} s")


@pytest.mark.slow
def test_the_pandas_and_the_spark_engine_judge_an_epoch_alike(reference, validator,
                                                              monkeypatch):
    """Epochs up to settings.checks.pandas_max_rows rows go to GX's pandas engine, larger
    ones to its Spark engine: the same suite gives the same verdicts and counts either way
    (here on a broken epoch, so failures are compared too)."""
    row = _row(reference, "popularity", 3)
    rows = _epoch_rows(reference, "item_popularity", 3)
    rows[0] = {**rows[0], "revenue": -1.5}
    checks = reference.pipeline.settings.setdefault("checks", {})
    with bad_commit(reference, "item_popularity", 3, rows) as version:
        bad = replace(row, outputs={"item_popularity": {"table": "item_popularity",
                                                        "version": version}})
        logs = reference.log.regions(reference.pipeline)
        verdicts = {}
        for engine, limit in (("pandas", len(rows)), ("spark", len(rows) - 1)):
            monkeypatch.setitem(checks, "pandas_max_rows", limit)
            verdicts[engine] = sorted(
                (o.check, o.success, o.observed.get("unexpected_count"), o.sample)
                for o in validator.check_epoch(bad, logs) if o.check.startswith("suite:"))
    assert verdicts["pandas"] == verdicts["spark"]
    assert [v[:2] for v in verdicts["pandas"] if not v[1]] == [
        ("suite:expect_column_values_to_be_between(revenue)", False)]


@pytest.mark.slow
def test_a_duplicated_epoch_commit_is_caught(reference, validator):
    row = _row(reference, "ingest", 2)
    dup = _epoch_rows(reference, "purchases", 2)
    with bad_commit(reference, "purchases", 2, dup + dup) as version:  # committed twice
        bad = replace(row, outputs={**row.outputs,
                                    "purchases": {"table": "purchases", "version": version}})
        failed = _failed(validator.check_epoch(bad, reference.log.regions(reference.pipeline)))
    assert "suite:expect_compound_columns_to_be_unique(epoch,category,item_id)" in failed
    got = failed["invariant:purchases_conserved"]
    assert got["purchases"] == 2 * got["purchase_events"]


@pytest.mark.slow
def test_a_dropped_partition_of_events_is_caught(reference, validator, spark):
    """ingest read partitions 0 and 2 only: its purchases miss partition 1's."""
    from falkirk.io.kafka import read_range
    from falkirk.model.times import Offsets
    from falkirk.runtime.connectors import record_ddl
    from falkirk.runtime.job import load_job

    row = _row(reference, "ingest", 2)
    rng = row.inputs["events"]
    start, end = Offsets(rng["from"]), Offsets(rng["to"])
    kept_end = Offsets({p: (start.get(p) if p == "1" else o) for p, o in end.as_dict().items()})
    raw = read_range(spark, reference.cfg.kafka_bootstrap, "events", start, kept_end,
                     record_ddl("events", reference.pipeline.schema_roots))
    ingest = load_job(reference.pipeline.job_path("jobs/ingest.py"))
    s = reference.pipeline.settings
    events, _ = ingest.validate(raw, 2, s["origin_ms"], s["epoch_seconds"] * 1000)
    rows = [r.asDict() for r in ingest.purchases(events).collect()]
    assert rows and len(rows) < len(_epoch_rows(reference, "purchases", 2))
    with bad_commit(reference, "purchases", 2, rows) as version:
        bad = replace(row, outputs={**row.outputs,
                                    "purchases": {"table": "purchases", "version": version}})
        failed = _failed(validator.check_epoch(bad, reference.log.regions(reference.pipeline)))
    assert list(failed) == ["invariant:purchases_conserved"]
    assert failed["invariant:purchases_conserved"]["purchases"] < \
        failed["invariant:purchases_conserved"]["purchase_events"]


@pytest.mark.slow
def test_a_negative_revenue_is_caught(reference, validator):
    row = _row(reference, "popularity", 3)
    rows = _epoch_rows(reference, "item_popularity", 3)
    rows[0] = {**rows[0], "revenue": -rows[0]["revenue"] - 1.0}
    with bad_commit(reference, "item_popularity", 3, rows) as version:
        bad = replace(row, outputs={"item_popularity": {"table": "item_popularity",
                                                        "version": version}})
        outcomes = validator.check_epoch(bad, reference.log.regions(reference.pipeline))
    failed = _failed(outcomes)
    assert list(failed) == ["suite:expect_column_values_to_be_between(revenue)"]
    bad_outcome = next(o for o in outcomes if not o.success)
    assert bad_outcome.observed["unexpected_count"] == 1
    assert bad_outcome.sample == [rows[0]["revenue"]]


@pytest.mark.slow
def test_a_null_or_missing_label_is_caught(reference, validator, spark):
    from falkirk.model.schemas import arrow_schema

    # The suite on a snapshot with a null label (the table's schema refuses nulls, so the
    # DataFrame is checked directly, as the validator does with an epoch's rows).
    rows = _epoch_rows(reference, "user_community", 2)
    nullable = pa.schema([f.with_nullable(True)
                          for f in arrow_schema("tables", "user_community",
                                               reference.pipeline.schema_roots)])
    broken = [{**rows[0], "label": None}, *rows[1:]]
    df = spark.createDataFrame(pa.Table.from_pylist(broken, schema=nullable).to_pandas())
    results = validator.suites.validate("user_community", df)
    assert [name for name, ok, *_ in results if not ok] == [
        "suite:expect_column_values_to_not_be_null(label)"]
    # A user seen in interactions left out of the snapshot: the invariant names the user.
    row = _row(reference, "communities", 2)
    with bad_commit(reference, "user_community", 2, rows[1:]) as version:
        bad = replace(row, outputs={"user_community": {"table": "user_community",
                                                       "version": version}})
        outcomes = validator.check_epoch(bad, reference.log.regions(reference.pipeline))
    assert _failed(outcomes) == {"invariant:labels_cover_users": {
        "users": len(rows), "bad": 1}}
    assert next(o for o in outcomes if not o.success).sample == [
        {"user_id": rows[0]["user_id"], "label": None}]


@pytest.mark.slow
def test_a_failing_epoch_is_quarantined_held_back_then_released_after_a_rollback(
        reference, validator, spark):
    """popularity commits a bad epoch 2: checks quarantine it, serve reads epoch 1 instead,
    no frontier reaches it; a rollback and rerun write it again, the checks pass, and every
    output equals the failure-free run's."""
    from falkirk.runtime.job import job_logic
    from falkirk.runtime.loop import JobRunner

    run = reference
    good = _row(run, "popularity", 2)
    rows = _epoch_rows(run, "item_popularity", 2)
    rows[0] = {**rows[0], "revenue": -5.0}
    version = _replace_epoch(run, spark, "item_popularity", 2, rows)
    run.log.record(replace(good, recorded_at=None, outputs={
        "item_popularity": {"table": "item_popularity", "version": version}}))

    report = validator.run(epochs=[2], regions=["popularity"])
    assert report.quarantined == [("popularity", 2)]
    results = [r for r in run.log.checks("reference")
               if r["region"] == "popularity" and r["epoch"] == 2 and not r["success"]]
    assert [r["check"] for r in results] == ["suite:expect_column_values_to_be_between(revenue)"]
    assert json.loads(results[0]["sample"]) == [-5.0]
    logs = run.log.regions(run.pipeline)
    assert logs["popularity"].entries[2].status == "quarantined"
    assert "expect_column_values_to_be_between" in logs["popularity"].entries[2].note

    # serve's epoch 3 reads item_popularity as of epoch 2: it gets epoch 1's version.
    # (A runner of serve+stats resuming after epoch 2, so its queries input has not ended.)
    serve = JobRunner(run.pipeline, job_logic(run.pipeline.job_path("jobs/serve.py")), spark,
                      run.cfg, run.log, start={"serve": 2, "stats": 2})
    try:
        epochs, places = serve._ready(3, 3)
    finally:
        serve.close()
    assert epochs == [3]
    assert places["item_popularity"] == [_row(run, "popularity", 1).outputs[
        "item_popularity"]["version"]]

    done = run.rollback(failed=["popularity"], reason="test: quarantined epoch 2")
    assert done.frontiers["popularity"] == 1
    run.start()
    codes = run.wait(timeout_s=1500)
    assert set(codes.values()) == {0}, {j: str(run.log_file(j)) for j in codes}

    # The validator beside the rerun (hold) checked the new generation: all passed.
    row = _row(run, "popularity", 2)
    rerun = [r for r in run.log.checks("reference") if r["generation"] == row.generation]
    assert rerun and all(r["success"] for r in rerun)
    assert {"popularity", "serve", "stats"} <= {r["region"] for r in rerun}
    assert any(r["region"] == "popularity" and r["epoch"] == 2 for r in rerun)
    assert not validator.run().failures  # nothing left failing, nothing pending
    assert row.status == "committed" and row.generation > good.generation
    assert run.log.regions(run.pipeline)["popularity"].quarantined() == []
    from falkirk_dev.harness import compare

    diff = {k: v for k, v in compare(run.golden, run.outputs()).items()
            if v["lost"] or v["duplicated"]}
    assert not diff, diff
