"""An EpochWriter in its own process, so a test can kill it at a fault point.

Usage: ``python delta_writer_worker.py TABLE REGION GENERATION FIRST_EPOCH LAST_EPOCH ROWS``.
Prints one JSON line per epoch (``{"epoch": e, "version": v}``, version null when skipped).
``FALKIRK_CRASH_AT=writer:before-commit@N`` or ``writer:after-commit@N`` (falkirk.faults)
SIGKILLs it the N-th time it reaches that point, as a crashed driver would.
"""

from __future__ import annotations

import json
import sys

from falkirk_dev.bench.delta_bench import SCHEMA, epoch_frame  # the same rows as the bench


def main(argv: list[str]) -> int:
    table, region, generation, first, last, rows = argv
    from falkirk.io.delta import EpochWriter
    from falkirk.runtime.launcher import session

    spark = session("falkirk-delta-worker")
    writer = EpochWriter(spark, table, region, int(generation), SCHEMA)
    writer.ensure_table()
    for epoch in range(int(first), int(last) + 1):
        result = writer.write_epoch(epoch_frame(spark, epoch, int(rows)), epoch)
        print(json.dumps({"epoch": epoch, "version": result and result.version}), flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
