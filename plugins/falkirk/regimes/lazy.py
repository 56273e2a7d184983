"""Lazy checkpoint: stateful, checkpoints incrementally every K epochs.

Saves: its outputs every epoch, its state (only the keys that changed) every
``checkpoint_every`` epochs. Acknowledges: its input up to the last checkpoint. Restores:
a checkpoint, then redoes the epochs after it (their outputs are live already, so they
are redone for the state only). So when every input can be read again
(:meth:`Pipeline.replays_inputs`) its frontiers are also its committed epochs: the
paper's replay of a deterministic processor's logged history (docs/model.md, "Replay").
"""

from __future__ import annotations

from typing import Any

from falkirk.regimes.base import Fail, Regime


class Lazy(Regime):
    def checkpoint_due(self, spec: Any, epoch: int) -> bool:
        # checkpoint_seconds alone is accepted but not timed yet: every epoch then
        return (epoch + 1) % (spec.checkpoint_every or 1) == 0

    def check(self, spec: dict[str, Any], fail: Fail) -> None:
        super().check(spec, fail)
        every, seconds = spec.get("checkpoint_every"), spec.get("checkpoint_seconds")
        if every is None and seconds is None:
            raise fail("a lazy region needs checkpoint_every (K epochs) or "
                       "checkpoint_seconds (T)")
        if every is not None and (not isinstance(every, int) or every < 1):
            raise fail(f"checkpoint_every must be an integer ≥ 1, got {every!r}")


LAZY = Lazy("lazy", keeps_state=True, restorable=("checkpointed",), replays=("committed",),
            own_keys=("checkpoint_every", "checkpoint_seconds"))
