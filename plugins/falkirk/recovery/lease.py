"""Leases in the epoch log: one holder of a pipeline's exclusive action, on any machine.

A lock file means nothing to a process on another machine, and "its holder died" can only be
judged on the holder's own host. The ``leases`` table of the epoch log is seen by every
process of the pipeline (the jobs on a cluster, Airflow's workers, the CLI). A lease is taken
in two steps, as with any lock built on an append-only log:

1. *offer*: append a row (a fresh token, the holder, ``expires_at`` = now + ttl);
2. *settle*: replay the lease's rows in commit order (the Delta log's own order, not the
   writers' clocks). An offer wins if, when it was committed, nobody held an unexpired lease;
   a renewal extends the holder's lease; a release ends it. Every contender replays the
   same rows and so agrees on one winner; a loser withdraws its offer (a release row).

The holder renews every ttl/3 from a background thread. A holder that died on this host (its
pid and process start time no longer name a running process) is taken over at once; on
another host, when its lease has expired. A holder paused past its lease can still act after
another took over: the generation fences of the rollback protocol refuse its late records.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from falkirk.errors import FalkirkError

if TYPE_CHECKING:
    from falkirk.log.epochlog import EpochLog

log = logging.getLogger(__name__)

DEFAULT_TTL_S = 120.0


class LeaseHeldError(FalkirkError):
    """Another process holds the lease."""


@dataclass(frozen=True)
class Holding:
    """Who holds a lease, and until when."""

    token: str
    holder: dict[str, Any]
    expires_at: datetime

    def describe(self) -> str:
        h = self.holder
        return (f"pid {h.get('pid')} on {h.get('host')}, lease until "
                f"{self.expires_at.isoformat(timespec='seconds')}")


def _dead_here(holder: dict[str, Any]) -> bool:
    """The holder ran on this host and no running process is it any more."""
    from falkirk.runtime.procs import is_process

    return (holder.get("host") == socket.gethostname()
            and not is_process(holder.get("pid"), holder.get("started")))


def current(rows: list[dict[str, Any]]) -> Holding | None:
    """Replay one lease's rows (in commit order) and return its holder at the end, if any.

    Each row is judged at its own ``recorded_at`` against the lease as it then stood, so
    every reader of the same rows reaches the same answer, whatever its own clock says;
    whether that holding has since expired is the caller's question.
    """
    held: Holding | None = None
    for r in rows:
        at = r["recorded_at"]
        if r["action"] == "offer":
            if held is None or held.expires_at <= at:
                held = Holding(r["token"], json.loads(r["holder"]), r["expires_at"])
        elif held is not None and r["token"] == held.token:
            if r["action"] == "renew":
                held = Holding(held.token, held.holder, r["expires_at"])
            elif r["action"] == "release":
                held = None
    return held


class Lease:
    """A pipeline's lease on one exclusive action (``with Lease(...).held(): ...``)."""

    def __init__(self, epoch_log: EpochLog, pipeline: str, name: str,
                 ttl_s: float = DEFAULT_TTL_S):
        self.log = epoch_log
        self.pipeline = pipeline
        self.name = name
        self.ttl = timedelta(seconds=ttl_s)
        self.token = uuid.uuid4().hex
        from falkirk.model.process import this_process

        self.holder = this_process()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the two steps -------------------------------------------------------------------

    def _row(self, action: str, token: str | None = None,
             holder: dict[str, Any] | None = None) -> None:
        now = datetime.now(UTC)
        self.log.record_lease(self.pipeline, self.name, token or self.token, action,
                              holder or self.holder,
                              None if action == "release" else now + self.ttl)

    def offer(self) -> None:
        self._row("offer")

    def settle(self) -> Holding | None:
        """Whether this offer won: None if it did, else the holding that beat it (this
        offer is then withdrawn)."""
        held = current(self.log.lease_rows(self.pipeline, self.name))
        if held is not None and held.token == self.token:
            return None
        self._row("release")
        return held

    def break_if_dead(self) -> bool:
        """Release the current holding if its holder is gone (died on this host, or its
        lease ran out); True if it did."""
        held = current(self.log.lease_rows(self.pipeline, self.name))
        if held is None:
            return False
        expired = held.expires_at <= datetime.now(UTC)
        if not (expired or _dead_here(held.holder)):
            return False
        why = "expired" if expired else "holder died"
        log.warning("lease %s of %s: taking over from %s (%s)", self.name, self.pipeline,
                    held.describe(), why)
        self._row("release", held.token, {**held.holder, "released_by": self.holder,
                                          "why": why})
        return True

    # -- holding -------------------------------------------------------------------------

    @contextmanager
    def held(self) -> Iterator[Lease]:
        """Hold the lease for the block, or raise :class:`LeaseHeldError` naming the holder."""
        self.break_if_dead()
        self.offer()
        beaten_by = self.settle()
        if beaten_by is not None:
            raise LeaseHeldError(
                f"{self.name} of pipeline {self.pipeline!r} is held by "
                f"{beaten_by.describe()}")
        self._thread = threading.Thread(target=self._renew, name=f"lease-{self.name}",
                                        daemon=True)
        self._thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            self._thread.join()
            self._row("release")

    def _renew(self) -> None:
        while not self._stop.wait(self.ttl.total_seconds() / 3):
            held = current(self.log.lease_rows(self.pipeline, self.name))
            if held is None or held.token != self.token:
                log.error("lease %s of %s was taken over (now %s): this holder is fenced by "
                          "generation", self.name, self.pipeline,
                          held.describe() if held else "free")
                return
            self._row("renew")
