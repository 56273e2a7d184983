"""An EpochWriter in its own process, so a test can kill it between the files and the commit.

Usage: ``python delta_writer_worker.py TABLE REGION GENERATION FIRST_EPOCH LAST_EPOCH ROWS``.
Prints one JSON line per epoch (``{"epoch": e, "version": v}``, version null when skipped).
With ``FALKIRK_CRASH_BEFORE_COMMIT=E`` it SIGKILLs itself once epoch E's Parquet files are
written and before they are committed, as a crashed driver would.
"""

from __future__ import annotations

import json
import os
import signal
import sys

from falkirk.bench.delta_bench import SCHEMA, epoch_frame  # the same rows as the bench


def main(argv: list[str]) -> int:
    table, region, generation, first, last, rows = argv
    from falkirk.delta import EpochWriter, StagedEpoch
    from falkirk.spark import session

    spark = session("falkirk-delta-worker")
    writer = EpochWriter(table, region, int(generation), SCHEMA)
    writer.ensure_table()
    crash_at = os.environ.get("FALKIRK_CRASH_BEFORE_COMMIT")
    if crash_at is not None:
        commit = writer.commit

        def commit_or_die(staged: StagedEpoch):
            if staged.epoch == int(crash_at):
                print(json.dumps({"crashing": staged.epoch, "staging": staged.staging}), flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            return commit(staged)

        writer.commit = commit_or_die  # type: ignore[method-assign]
    for epoch in range(int(first), int(last) + 1):
        result = writer.write_epoch(epoch_frame(spark, epoch, int(rows)), epoch)
        print(json.dumps({"epoch": epoch, "version": result and result.version}), flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
