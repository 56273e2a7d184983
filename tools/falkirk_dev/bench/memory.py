"""Memory of a benchmark's drivers, sampled while it runs (shared by the scale, long-run
and hosting benchmarks)."""

from __future__ import annotations

import threading
import time


class RssSampler:
    """The largest resident memory of the driver: this Python process and the JVM PySpark
    started for it (not the sandbox's broker), or the Spark Connect engine its session is
    on (``Config.spark_remote``: the JVM that runs every job), sampled every ``every_s``
    seconds."""

    def __init__(self, every_s: float = 0.5, keep: bool = False, jvms_only: bool = False):
        self.every_s, self.max_mb = every_s, 0.0
        self.keep = keep  # also keep every sample (time.time(), MB) in ``samples``
        self.jvms_only = jvms_only  # only the driver JVMs under this process (every job's)
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        import psutil

        from falkirk.runtime.engine import status

        me = psutil.Process()
        engine = status()["pid"]
        while not self._stop.is_set():
            total = 0 if self.jvms_only else me.memory_info().rss
            jvms = [p for p in me.children(recursive=True) if p.pid != engine]
            if engine is not None:
                jvms.append(psutil.Process(engine))
            for p in jvms:
                try:
                    if any("SparkSubmit" in a for a in p.cmdline()):
                        total += p.memory_info().rss
                except psutil.Error:
                    continue
            self.max_mb = max(self.max_mb, total / 2**20)
            if self.keep:
                self.samples.append((time.time(), total / 2**20))
            self._stop.wait(self.every_s)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
