"""Fault injection for the trials and tests: die with SIGKILL at a named point.

``FALKIRK_CRASH_AT=<point>`` makes the process kill itself the first time it reaches that
point (e.g. ``rollback:after-first-table``, ``writer:before-commit``). Nothing happens when
the variable is unset, which is always the case outside the trials and tests.
"""

from __future__ import annotations

import os
import signal

POINTS = ("rollback:after-first-table", "writer:before-commit", "checkpoint:before-save")


def maybe_crash(point: str) -> None:
    """SIGKILL this process if the trial asked to crash at ``point``."""
    if os.environ.get("FALKIRK_CRASH_AT") == point:
        os.kill(os.getpid(), signal.SIGKILL)
