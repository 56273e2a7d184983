"""A figure file's provenance: which command, commit, date and machine made its numbers.

Every JSON under ``docs/figures/`` that a generated doc shows (``falkirk bench report``)
carries a ``"provenance"`` object, so a table in docs/benchmarks.md or
docs/faults-results.md can say where each number comes from, and a number without a
source is refused instead of quoted::

    "provenance": {"command": "falkirk bench broker --json F", "commit": "21f0acb",
                   "date": "2026-12-07T09:12:44Z",
                   "machine": "Linux x86_64, 2 cores, 23.5 GiB memory, Python 3.11.7"}

``write_figure`` is how a benchmark or a campaign writes one; records back-filled by hand
from an older account of a run write "unknown" where that account said nothing, and may
add a ``"note"`` (the conditions the account gave).
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypedDict

PROVENANCE_KEY = "provenance"
FIELDS = ("command", "commit", "date", "machine")
REPO_ROOT = Path(__file__).resolve().parents[3]


class Provenance(TypedDict, total=False):
    """Where a figure file's numbers come from (``note`` is optional)."""

    command: str
    commit: str
    date: str
    machine: str
    note: str


class FigureError(ValueError):
    """A figure file the report cannot quote: unreadable, or without its provenance."""


def current_commit(root: Path = REPO_ROOT) -> str:
    """``git rev-parse --short HEAD`` of the checkout, or "unknown" outside one."""
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root,
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def tree_is_dirty(root: Path = REPO_ROOT) -> bool:
    """Whether the checkout has uncommitted changes: then the commit alone does not
    reproduce the run, and the record says so."""
    try:
        out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                             cwd=root, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return False
    return bool(out.strip())


def machine() -> str:
    """The machine in a line, without its host name: the figures of a 2-core machine and
    of a 32-core one are not the same figures."""
    try:
        import psutil

        memory = psutil.virtual_memory().total
    except ImportError:  # a bare interpreter: the same number from the OS
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return (f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores, "
            f"{memory / 2**30:.1f} GiB memory, Python {platform.python_version()}")


def this_command() -> str:
    """The command line of this process, as ``falkirk …`` when it is the falkirk script."""
    argv = list(sys.argv)
    if argv and Path(argv[0]).name == "falkirk":
        return shlex.join(["falkirk", *argv[1:]])
    return shlex.join([Path(sys.executable).name, *argv])


def provenance(command: str | None = None) -> Provenance:
    """A provenance record for figures measured now, by ``command`` (default: this
    process's command line)."""
    record = Provenance(command=command or this_command(), commit=current_commit(),
                        date=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                        machine=machine())
    if tree_is_dirty():
        record["note"] = "the checkout had uncommitted changes"
    return record


def write_figure(path: str | Path, data: dict[str, Any], command: str | None = None) -> Path:
    """Write a benchmark's or a campaign's figures as JSON to ``path`` (folders made),
    with a ``"provenance"`` record first: ``command`` (default: this process's command
    line), the commit (``git rev-parse --short HEAD``), the date (UTC, ISO 8601) and the
    machine (cores, memory, Python; no host name). Returns the path, beside which a
    benchmark may put its plot (``.svg``).

    This is what ``falkirk bench report`` needs to quote a file in docs/benchmarks.md or
    docs/faults-results.md; a file written by ``falkirk_dev.bench.write_figures`` has no
    provenance and is refused there. A record ``data`` already carries is replaced."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    body = {k: v for k, v in data.items() if k != PROVENANCE_KEY}
    out.write_text(json.dumps({PROVENANCE_KEY: provenance(command), **body}, indent=1,
                              default=str))
    return out


def read_figure(path: Path) -> tuple[dict[str, Any], Provenance]:
    """A figure file's data and its provenance, or a ``FigureError`` that names the file
    and what is missing."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise FigureError(f"{path}: not a readable JSON figure file ({exc})") from None
    if not isinstance(data, dict):
        raise FigureError(f"{path}: a figure file holds one JSON object, not "
                          f"{type(data).__name__}")
    record = data.get(PROVENANCE_KEY)
    if not isinstance(record, dict):
        raise FigureError(
            f"{path} has no provenance: add a \"{PROVENANCE_KEY}\" object with "
            f"{', '.join(FIELDS)} (falkirk_dev.bench.figures.write_figure writes it; by "
            f"hand, write \"unknown\" for what is not known)")
    missing = [f for f in FIELDS if not isinstance(record.get(f), str) or not record[f]]
    if missing:
        raise FigureError(f"{path}: its provenance lacks {', '.join(missing)} (each a "
                          f"non-empty string; \"unknown\" when it is not known)")
    return data, Provenance(**record)
