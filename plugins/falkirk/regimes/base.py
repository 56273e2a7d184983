"""What a fault-tolerance regime is: what a region under it saves, acknowledges and restores.

The runtime, the epoch log, the supervisor and the declaration checks ask a region's
:class:`Regime` instead of branching on its name (docs/model.md, "Which frontiers each
regime offers").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Fail = Callable[[str], Exception]  # raise fail("what is wrong") names the region and file


@dataclass(frozen=True)
class Regime:
    name: str
    #: keeps state between epochs (checkpointed by falkirk, restored after a failure)
    keeps_state: bool
    #: the epoch log statuses of the epochs it can restore to (its frontiers F(p))
    restorable: tuple[str, ...]
    #: the statuses of epochs it can also be rolled back to by replay: its newest
    #: restorable epoch before them restored, then the epochs after it redone from their
    #: logged inputs for the state only, their outputs kept (docs/model.md, "Replay")
    replays: tuple[str, ...] = ()
    #: one run per epoch scheduled by Airflow (a batch DAG), not a supervised stream job
    runs_per_epoch: bool = False
    #: the declaration keys only this regime takes
    own_keys: tuple[str, ...] = ()

    def checkpoint_due(self, spec: Any, epoch: int, since_s: float | None = None) -> bool:
        """Whether the region's state is checkpointed once ``epoch`` is done, ``since_s``
        seconds after its last checkpoint (or its start; None: not timed)."""
        return False

    def check(self, spec: dict[str, Any], fail: Fail) -> None:
        """Refuse a declaration this regime cannot run (called at load)."""
        stateful = spec.get("stateful", self.keeps_state)
        if stateful and not self.keeps_state:
            raise fail(f"an {self.name} region keeps no state between epochs; declare it "
                       "lazy or eager to keep state")
        given = [k for k in ("checkpoint_every", "checkpoint_seconds")
                 if spec.get(k) is not None and k not in self.own_keys]
        if given:
            why = "commit every epoch" if self.keeps_state else "keep no state"
            raise fail(f"only lazy regions take checkpoint_every/seconds ({self.name} "
                       f"regions {why})")
