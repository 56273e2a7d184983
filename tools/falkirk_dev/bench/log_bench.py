"""Epoch log benchmark: what a read of the log costs as it grows.

Run: ``falkirk bench log`` (default: 700 appends, about the epochs table of an hour's
fault campaign). Every job reads the log at each look for its inputs (every 0.5 s while
it waits), the supervisor and the campaign read it too. A reader keeps the rows of the
files it read (:class:`falkirk.io.lake.AppendOrder`), so a later read opens only the new
files; a new reader (a new process, and every read before that was kept) opens them all,
until the log is compacted (:meth:`falkirk.log.epochlog.EpochLog.compact`, which the
streams supervisor's watch does as it goes): then it opens one.
Printed: the CPU seconds of a new reader's read and of a kept reader's read after one more
append, then of a new reader's read once the log is compacted, medians of a few rounds,
and the ratios to the first; ``--json`` writes them.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from argparse import Namespace
from pathlib import Path

from falkirk.log.epochlog import EpochLog, EpochRecord

PIPELINE = "bench"
ROUNDS = 5


def _cpu(fn) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


def measure(appends: int, rounds: int = ROUNDS, say=print) -> dict:
    with tempfile.TemporaryDirectory(prefix="falkirk-log-bench-") as tmp:
        root = str(Path(tmp) / "log")
        writer = EpochLog(root)
        t0 = time.monotonic()
        for k in range(appends):  # one commit each, as jobs append their epochs
            writer.record(EpochRecord(PIPELINE, f"r{k % 5}", k // 5, 0, "committed"))
            if (k + 1) % 100 == 0:
                say(f"  {k + 1}/{appends} appends ({time.monotonic() - t0:.0f} s)")
        kept = EpochLog(root)
        kept.records(PIPELINE)  # its first read opens every file
        whole, incremental = [], []
        for i in range(rounds):
            whole.append(_cpu(lambda: EpochLog(root).records(PIPELINE)))
            writer.record(EpochRecord(PIPELINE, "r0", appends + i, 0, "committed"))
            incremental.append(_cpu(lambda: kept.records(PIPELINE)))
        assert kept.records(PIPELINE) == EpochLog(root).records(PIPELINE)
        expected = kept.records(PIPELINE)
        writer.compact(min_files=2)
        compacted = [_cpu(lambda: EpochLog(root).records(PIPELINE)) for _ in range(rounds)]
        assert EpochLog(root).records(PIPELINE) == expected  # the same rows, in order
    whole_s, kept_s = statistics.median(whole), statistics.median(incremental)
    compacted_s = statistics.median(compacted)
    return {"appends": appends, "rounds": rounds, "new_reader_cpu_s": round(whole_s, 4),
            "kept_reader_cpu_s": round(kept_s, 4), "ratio": round(kept_s / whole_s, 4),
            "compacted_new_reader_cpu_s": round(compacted_s, 4),
            "compacted_ratio": round(compacted_s / whole_s, 4)}


def main(args: Namespace) -> None:
    appends = args.events or 700
    print(f"an epoch log of {appends:,} appends (delta-rs, one file each)…")
    figures = measure(appends)
    print(f"a new reader's read (opens every file)   {figures['new_reader_cpu_s']:.3f} s CPU")
    print(f"a kept reader's, after one more append   {figures['kept_reader_cpu_s']:.3f} s CPU")
    print(f"ratio {figures['ratio']:.3f} (median of {figures['rounds']} rounds)")
    print(f"a new reader's read once compacted       "
          f"{figures['compacted_new_reader_cpu_s']:.3f} s CPU "
          f"(ratio {figures['compacted_ratio']:.3f})")
    print(json.dumps(figures))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
