"""Fault injection for the trials and tests: die with SIGKILL at a named point.

``FALKIRK_CRASH_AT=<point>`` makes the process kill itself the first time it reaches that
point (e.g. ``rollback:after-first-table``, ``writer:before-commit``);
``FALKIRK_CRASH_AT=<point>@<N>`` the N-th time this process reaches it (N ≥ 1), so a trial
can crash a job in a chosen epoch: a job reaches ``writer:before-commit`` once per Delta
table per epoch (an epoch's tables are committed side by side, in no fixed order, but all
of one epoch before any of the next). Nothing happens when the variable is unset, which is
always the case outside the trials and tests.

The points:

* ``writer:before-commit``: an epoch's output is computed (lazily) but not written: no
  Delta commit made;
* ``writer:after-commit``: the epoch's Delta commit is made, its epoch log row is not;
* ``checkpoint:before-save``: the epoch's outputs are committed and its checkpoint's rows
  are ready, but the checkpoint's Delta commit (and so its epoch log row) is not made;
* ``rollback:before-stop``: a rollback fenced the regions its plan affects, and is about to
  stop their jobs;
* ``rollback:after-first-table``: a rollback restored its first table and nothing more.
"""

from __future__ import annotations

import os
import signal
import threading

POINTS = ("rollback:before-stop", "rollback:after-first-table", "writer:before-commit",
          "writer:after-commit", "checkpoint:before-save")
ENV = "FALKIRK_CRASH_AT"

_reached: dict[str, int] = {}  # point -> times this process reached it
_counting = threading.Lock()  # an epoch's commits reach their points from several threads


def parse(value: str) -> tuple[str, int]:
    """``point`` or ``point@N`` → (point, N); N is 1 when not given."""
    point, sep, nth = value.partition("@")
    if not sep:
        return point, 1
    try:
        n = int(nth)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"{ENV}={value!r}: the count after '@' must be an integer ≥ 1")
    return point, n


def crash_at(point: str, nth: int = 1) -> str:
    """The ``FALKIRK_CRASH_AT`` value that crashes at the ``nth`` time ``point`` is reached."""
    if point not in POINTS:
        raise ValueError(f"unknown crash point {point!r} (known: {', '.join(POINTS)})")
    return point if nth == 1 else f"{point}@{int(nth)}"


def maybe_crash(point: str) -> None:
    """SIGKILL this process if the trial asked to crash at ``point`` (this time)."""
    value = os.environ.get(ENV)
    if not value:
        return
    target, nth = parse(value)
    if target != point:
        return
    with _counting:
        _reached[point] = _reached.get(point, 0) + 1
        now = _reached[point] == nth
    if now:
        os.kill(os.getpid(), signal.SIGKILL)
