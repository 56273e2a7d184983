"""The long, the latency, the log and the Delta benchmarks: their figures from known
timings, and a short run of each on the real parts (CI runs these short variants; the full
runs are in the README)."""

from __future__ import annotations

import json
from argparse import Namespace

import pytest

from falkirk_dev.bench.latency import percentiles
from falkirk_dev.bench.long_run import summary


def test_latency_percentiles_count_the_unanswered_as_longer_than_any_answer():
    answered = [float(s) for s in range(1, 91)]  # 90 answers, 1..90 s
    assert percentiles(answered, 0)["p50"] == 45.0
    got = percentiles(answered, 10)  # 100 queries, the 10 slowest never answered
    assert got["p50"] == 50.0
    assert got["p95"] is None and got["p99"] is None  # among the unanswered: unknown
    assert percentiles([], 0) == {"p50": None, "p95": None, "p99": None}


def test_long_run_compares_the_last_ten_epochs_with_the_first_ten_after_warm_up():
    # epoch 0 (warm-up) 50 s, then 10 epochs of 2 s, 10 of 3 s; one memory sample per epoch
    seconds = [50.0] + [2.0] * 10 + [3.0] * 10
    timings = [(e, s, 100.0 + e, {}) for e, s in enumerate(seconds)]
    rss = [(100.0 + e - 0.5, 1000.0 + 10 * e) for e in range(len(seconds))]
    out = summary(timings, rss, [7] * len(seconds))
    assert out["epoch_s_first10"] == 2.0 and out["epoch_s_last10"] == 3.0
    assert out["last10_over_first10"] == 1.5
    assert out["driver_rss_mb_at_epoch_end"][0] == 1000.0
    assert out["driver_rss_mb_at_epoch_end"][-1] == 1200.0
    assert out["driver_rss_mb_second_half_growth"] == 1200.0 - 1100.0


def test_a_closed_runner_lets_go_of_every_frame_it_held_across_epochs():
    """A benchmark runs variants one after another in one Spark session: a closed runner
    must hold no state frames and its composite job no handed-over tables, else the next
    variant shares the driver's heap with their checkpointed blocks (issue 16)."""
    from falkirk.runtime.job import CompositeJob, JobLogic
    from falkirk.runtime.loop import JobRunner

    class Part(JobLogic):
        regions = ("a",)
        released = False

        def process(self, ctx):
            raise AssertionError("not run")

        def release(self) -> None:
            self.released = True

    part = Part()
    logic = CompositeJob.__new__(CompositeJob)
    logic.parts, logic.memory = [part], {"t": object()}
    runner = JobRunner.__new__(JobRunner)
    runner.inputs, runner.logic = {}, logic
    runner.state, runner.state_frames = {"a": object()}, {"a": object()}
    runner.close()
    assert runner.state == {} and runner.state_frames == {} and logic.memory == {}
    assert part.released


@pytest.mark.slow
@pytest.mark.system
def test_a_short_long_run_reports_every_epoch_with_its_spark_jobs_and_memory(tmp_path):
    from falkirk_dev.bench import long_run

    out = long_run.main(Namespace(epochs=2, events=300, json=str(tmp_path / "long.json")))
    assert out["epochs"] == 2 and len(out["epoch_s"]) == 2
    assert all(n > 0 for n in out["spark_jobs_per_epoch"])  # named and counted per epoch
    assert all(mb > 0 for mb in out["driver_rss_mb_at_epoch_end"])
    assert json.loads((tmp_path / "long.json").read_text())["epochs"] == 2
    assert (tmp_path / "long.svg").read_text().startswith("<svg")


@pytest.mark.slow
@pytest.mark.system
def test_a_short_latency_run_answers_every_query_produced_in_real_time(tmp_path):
    from falkirk_dev.bench import latency

    out = latency.main(Namespace(rate=60, minutes=20 / 60, warmup_minutes=10 / 60,
                                 drain_minutes=6, json=str(tmp_path / "latency.json")))
    assert out["epochs"] == 3 and out["unanswered"] == 0
    assert out["answered"] == out["queries"] > 0
    # the warm-up's queries are answered too, and reported apart from the measured ones
    assert out["warmup_minutes"] == 10 / 60 and out["warmup_p95_s"] > 0
    # an answer comes after its query, and within the run
    assert 0 < out["p50_s"] <= out["p99_s"] < 6 * 60
    assert out["p95_epochs"] == round(out["p95_s"] / out["epoch_seconds"], 2)
    written = json.loads((tmp_path / "latency.json").read_text())
    assert written["provenance"]["command"] and written["p95_s"] == out["p95_s"]
    assert out["job_exit_codes"] and set(out["job_exit_codes"].values()) == {0}


def test_catchup_is_measured_from_the_restart_until_every_later_window_is_back():
    """The catch-up's figure: the first 30 s window of production time after the restart
    from which every window's p95 stays within the limit (a later bad window starts the
    count again)."""
    from falkirk_dev.bench.latency import back_within, growth

    slow = [(t, 200.0 - t) for t in range(100, 190)]  # the backlog drains
    fast = [(t, 5.0) for t in range(190, 400)]
    assert back_within(slow + fast, 100.0, 15.0) == 90.0
    relapse = [(t, 5.0) for t in range(190, 250)] + [(t, 60.0) for t in range(250, 280)] + [
        (t, 5.0) for t in range(280, 400)]
    assert back_within(slow + relapse, 100.0, 15.0) == 180.0
    assert back_within(slow, 100.0, 15.0) is None
    steady = [(t, 5.0) for t in range(0, 300)]
    assert growth(steady, 300.0) == 1.0
    assert growth([(t, 5.0 + t / 10) for t in range(0, 300)], 300.0) > 2


def test_a_short_log_run_reports_both_reads_and_they_agree(tmp_path):
    """``falkirk bench log``'s short variant: a kept reader and a new one read the same rows,
    and a new one the same again once the log is compacted (the benchmark asserts it); the
    three costs are reported."""
    from falkirk_dev.bench.log_bench import main

    out = tmp_path / "log.json"
    main(Namespace(events=12, json=str(out)))
    figures = json.loads(out.read_text())
    assert figures["appends"] == 12 and figures["rounds"] >= 1
    assert figures["new_reader_cpu_s"] > 0 and figures["kept_reader_cpu_s"] >= 0
    assert figures["compacted_new_reader_cpu_s"] > 0


@pytest.mark.slow
def test_a_short_broker_run_times_each_kill_of_both_settings_and_keeps_every_record(tmp_path):
    """``falkirk bench broker``'s short variant: one SIGKILL of the real broker per setting,
    each timed to the broker's, a kept consumer's and a kept producer's answers (in that
    order), and every acknowledged record stored once (the benchmark asserts it)."""
    from falkirk_dev.bench.broker_bench import main

    out = tmp_path / "broker.json"
    main(Namespace(events=1, json=str(out)))
    figures = json.loads(out.read_text())
    for setting in ("defaults", "falkirk"):
        [kill] = figures[setting]["kills"]
        assert 0 < kill["restart_s"] <= kill["cut_s"] <= kill["produce_s"], figures
    assert set(figures["ratio"]) == {"restart_s", "cut_s", "produce_s"}

@pytest.mark.slow
def test_a_short_delta_run_reads_every_version_both_ways_alike():
    """``falkirk bench delta``'s short variant: each version read by delta-spark's
    versionAsOf and by its file list counts the same rows (the benchmark asserts it), and
    the file list's read runs fewer Spark jobs (no snapshot built, no files filtered)."""
    from falkirk_dev.bench.delta_bench import main

    out = main(rows=2_000, epochs=2)
    assert out["read_versionAsOf_ms"] > 0 and out["read_file_list_ms"] > 0
    assert out["read_file_list_jobs"] < out["read_versionAsOf_jobs"], out
