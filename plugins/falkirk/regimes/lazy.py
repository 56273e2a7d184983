"""Lazy checkpoint: stateful, checkpoints incrementally every K epochs or T seconds.

Saves: its outputs every epoch, its state (only the keys that changed) after every
``checkpoint_every``-th epoch, and after the first epoch that ends ``checkpoint_seconds``
or more after its last checkpoint (or its start); whichever comes first.
Acknowledges: its input up to the last checkpoint. Restores: a checkpoint, then redoes
the epochs after it (their outputs are live already, so they are redone for the state
only). So when every input can be read again
(:meth:`Pipeline.replays_inputs`) its frontiers are also its committed epochs: the
paper's replay of a deterministic processor's logged history (docs/model.md, "Replay").
"""

from __future__ import annotations

from typing import Any

from falkirk.regimes.base import Fail, Regime


class Lazy(Regime):
    def checkpoint_due(self, spec: Any, epoch: int, since_s: float | None = None) -> bool:
        every, seconds = spec.checkpoint_every, getattr(spec, "checkpoint_seconds", None)
        if every is not None and (epoch + 1) % every == 0:
            return True  # on epoch multiples: a rerun checkpoints the same epochs
        return seconds is not None and since_s is not None and since_s >= seconds

    def check(self, spec: dict[str, Any], fail: Fail) -> None:
        super().check(spec, fail)
        every, seconds = spec.get("checkpoint_every"), spec.get("checkpoint_seconds")
        if every is None and seconds is None:
            raise fail("a lazy region needs checkpoint_every (K epochs) or "
                       "checkpoint_seconds (T)")
        if every is not None and (not isinstance(every, int) or isinstance(every, bool)
                                  or every < 1):
            raise fail(f"checkpoint_every must be an integer ≥ 1, got {every!r}")
        if seconds is not None and (not isinstance(seconds, int | float)
                                    or isinstance(seconds, bool) or seconds <= 0):
            raise fail(f"checkpoint_seconds must be a number > 0, got {seconds!r}")


LAZY = Lazy("lazy", keeps_state=True, restorable=("checkpointed",), replays=("committed",),
            own_keys=("checkpoint_every", "checkpoint_seconds"))
