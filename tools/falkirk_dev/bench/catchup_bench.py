"""``falkirk bench catchup``: every job down for minutes while input keeps coming, then
back (falkirk_dev.bench.latency, whose machinery it shares)."""

from falkirk_dev.bench.latency import catchup as main

__all__ = ["main"]
