"""This process as others can find it again: its host, pid and start time (a pid and its
start time name one process, even after the OS reuses the pid). A value the epoch log
stamps its job runs and leases with, below the runtime that starts processes."""

from __future__ import annotations

import os


def process_started(pid: int) -> float | None:
    """When the OS started process ``pid`` (None if there is none): a pid and its start
    time name one process, even after the OS reuses the pid."""
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except psutil.NoSuchProcess:
        return None


def this_process() -> dict:
    """This process as other processes can find it again: host, pid and start time."""
    import socket

    return {"host": socket.gethostname(), "pid": os.getpid(),
            "started": process_started(os.getpid())}
