"""A region waiting on another job's region says at once when that job is dead, instead of
only when its idle timeout runs out; the wait itself goes on (a recovery restarts it)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from dataclasses import replace

from tiny_pipeline import PIPE

from falkirk.config import load
from falkirk.log.epochlog import EpochLog
from falkirk.runtime.connectors import Wiring


def waiting_runner(lake: str) -> Wiring:
    """What agg's job shares as it waits on t_in (no Spark, no broker)."""
    cfg = replace(load(), lake=lake)
    return Wiring(None, cfg, PIPE, EpochLog.from_config(cfg), 0, ["agg"])


def test_a_region_waiting_on_a_killed_or_failed_senders_job_says_so_once(tmp_path, caplog):
    lake = str(tmp_path / "lake")
    runner = waiting_runner(lake)
    edge = PIPE.edges["t_in"]
    caplog.set_level(logging.WARNING, logger="falkirk.runtime")
    runner.say_if_sender_died(edge, 3)
    assert caplog.text == ""  # the sender's job never ran: nothing to say

    # ingest's job started in another process, which is then gone (SIGKILL: no end row)
    record = ("from dataclasses import replace; from falkirk.config import load; "
              "from falkirk.log.epochlog import EpochLog; "
              f"EpochLog.from_config(replace(load(), lake={lake!r})).record_job_run("
              "'tiny', 'jobs/a.py', ['ingest'], 0, 'started'); "
              "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert subprocess.run([sys.executable, "-c", record], env=dict(os.environ)).returncode == -9
    runner.say_if_sender_died(edge, 3)
    assert caplog.text == ""  # looked less than SENDER_CHECK_S ago: not asked again yet
    runner._sender_checked.clear()
    runner.say_if_sender_died(edge, 3)
    assert ("tiny: agg waits for epoch 3 of region 'ingest', whose job jobs/a.py was killed"
            in caplog.text)
    runner._sender_checked.clear()
    runner.say_if_sender_died(edge, 3)
    assert caplog.text.count("waits for epoch") == 1  # once per dead job run

    # a later run of the job failed with a message
    runner.log.record_job_run("tiny", "jobs/a.py", ["ingest"], 0, "failed", exit_code=1,
                              message="bad input")
    runner._sender_checked.clear()
    runner.say_if_sender_died(edge, 4)
    assert "whose job jobs/a.py failed (exit 1: bad input)" in caplog.text
