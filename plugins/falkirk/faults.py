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
* ``writer:checked``: a writer found its epoch not committed in the snapshot it read and
  is about to commit against it (a fence landing now must still stop the commit);
* ``writer:after-commit``: the epoch's Delta commit is made, its epoch log row is not;
* ``checkpoint:before-save``: the epoch's outputs are committed and its checkpoint's rows
  are ready, but the checkpoint's Delta commit (and so its epoch log row) is not made;
* ``rollback:before-stop``: a rollback fenced the regions its plan affects, and is about to
  stop their jobs;
* ``rollback:after-first-table``: a rollback restored its first table and nothing more;
* ``runner:fence-checked``: a job found no fence of its regions and is about to record its
  epoch's rows (its outputs are committed): a rollback that fences it now meets a late row;
* ``log:before-compaction-commit``: a compaction of an epoch log table read its rows and
  is about to commit the file that replaces them: an append now comes after its read.

``FALKIRK_HOLD_AT=<point>[@<N>]`` (with ``FALKIRK_HOLD_DIR=<folder>``) holds the process
instead, the N-th time it reaches the point (any of the points above): it writes
``<point>.reached`` in the folder and waits until a test writes ``<point>.release``
there. A test forces an interleaving so (another process or thread acts while this one
is held), with no sleeps.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

POINTS = ("rollback:before-stop", "rollback:after-first-table", "writer:before-commit",
          "writer:checked", "writer:after-commit", "checkpoint:before-save", "runner:fence-checked",
          "log:before-compaction-commit")
ENV = "FALKIRK_CRASH_AT"
HOLD_ENV, HOLD_DIR_ENV = "FALKIRK_HOLD_AT", "FALKIRK_HOLD_DIR"

_reached: dict[str, int] = {}  # point -> times this process reached it
_counting = threading.Lock()  # an epoch's commits reach their points from several threads
_held: dict[str, int] = {}  # point -> times this process reached it, for holds


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


def _now(env: str, point: str, counts: dict[str, int]) -> bool:
    """The variable ``env`` names ``point`` and this is the time it asks for (counted in
    ``counts``, per point)."""
    value = os.environ.get(env)
    if not value:
        return False
    target, nth = parse(value)
    if target != point:
        return False
    with _counting:
        counts[point] = counts.get(point, 0) + 1
        return counts[point] == nth


def maybe_crash(point: str) -> None:
    """SIGKILL this process if the trial asked to crash at ``point`` (this time); hold it
    there if a test asked to hold (:func:`maybe_hold`)."""
    if _now(ENV, point, _reached):
        os.kill(os.getpid(), signal.SIGKILL)
    maybe_hold(point)


def hold_file(folder: str | os.PathLike, point: str, what: str) -> Path:
    """``<folder>/<point>.<what>`` (what: reached or release), the point's ':' made '-'."""
    return Path(folder) / f"{point.replace(':', '-')}.{what}"


def maybe_hold(point: str) -> None:
    """Wait at ``point`` until released, if a test asked to hold there (this time:
    ``FALKIRK_HOLD_AT=<point>@<N>`` holds the N-th time, as a crash does)."""
    if not _now(HOLD_ENV, point, _held):
        return
    folder = os.environ[HOLD_DIR_ENV]
    hold_file(folder, point, "reached").write_text(str(os.getpid()))
    release = hold_file(folder, point, "release")
    while not release.exists():
        time.sleep(0.05)
