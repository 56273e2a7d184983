"""A short fault campaign (CI's variant of ``falkirk chaos``): one run of the reference
pipeline, jobs, rollbacks and the broker killed at seeded moments, every output compared
with a failure-free run's (the session's shared one: the campaign runs on the same
input), every message on the output topics counted."""

from __future__ import annotations

import pytest
from reference_runs import INPUT

from falkirk_dev.chaos import campaign

pytestmark = pytest.mark.slow


def test_a_short_campaign_loses_duplicates_and_sticks_nothing(golden, tmp_path):
    result = campaign(tmp_path, minutes=1.5, seed=2, data=INPUT, say=print, golden=golden)
    assert result["kills"] >= 1, result["events"]
    assert result["rollbacks"] >= 1 or set(result["kills_by_target"]) == {"broker"}
    summary = {k: result[k] for k in ("lost", "duplicated", "stuck", "changed_on_resend",
                                      "outputs_differ")}
    assert summary == {"lost": 0, "duplicated": 0, "stuck": 0, "changed_on_resend": 0,
                       "outputs_differ": []}, result
    # every recovery says where its time went (the campaign's profile of recovery)
    recovered = [k for k in result["events"] if k.get("recovery_s") is not None
                 and "parts" in k]
    if result["rollbacks"]:
        assert recovered, result["events"]
        assert {"detect_s", "rollback_s", "start_s", "catch_up_s"} <= set(
            result["recovery_parts_s_p50"]), result["recovery_parts_s_p50"]
        for k in recovered:
            assert all(v >= 0 for v in k["parts"].values()), k


def test_under_airflow_kills_in_the_middle_of_a_recovery_are_recovered_too(golden, tmp_path):
    """CI's variant of ``falkirk chaos --airflow --every``: a local Airflow runs the
    pipeline. Its scheduler (with its executor and tasks) and a stream job are SIGKILLed
    together, the scheduler is started again seconds later; about 10 s after that first
    strike, before it has recovered, another stream job is SIGKILLed. The streams
    supervisor (its watch deferred to the triggerer, which outlived the scheduler; a job
    dead since its last watch rolled back by its next start step) recovers both, and the
    run ends with the failure-free outputs, every message on the output topics counted."""
    from rich.console import Console

    from falkirk_dev.chaos_airflow import airflow_campaign

    result = airflow_campaign(tmp_path, minutes=5, seed=1, data=INPUT, console=Console(),
                              golden=golden, targets=("scheduler", "job"), strikes=2,
                              every_s=10.0)
    first, second = result["events"]
    assert (first["target"], second["target"]) == ("scheduler", "job"), result["events"]
    assert first["recovery_s"] is not None and second["recovery_s"] is not None, result
    assert second["at"] < first["at"] + first["recovery_s"]  # it came mid-recovery
    for kill in (first, second):
        assert kill.get("rollback_done_s", 0) <= kill["recovery_s"], kill
    summary = {k: result[k] for k in ("lost", "duplicated", "stuck", "changed_on_resend",
                                      "outputs_differ")}
    assert summary == {"lost": 0, "duplicated": 0, "stuck": 0, "changed_on_resend": 0,
                       "outputs_differ": []}, result
