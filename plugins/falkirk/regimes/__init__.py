"""The four fault-tolerance regimes, one module each, and the lookup by name."""

from falkirk.regimes.base import Regime
from falkirk.regimes.batch import BATCH
from falkirk.regimes.eager import EAGER
from falkirk.regimes.ephemeral import EPHEMERAL
from falkirk.regimes.lazy import LAZY

REGIMES: dict[str, Regime] = {r.name: r for r in (EPHEMERAL, BATCH, LAZY, EAGER)}

__all__ = ["REGIMES", "Regime", "regime"]


def regime(name: str) -> Regime:
    """The regime of that name (declarations are checked against :data:`REGIMES`)."""
    return REGIMES[name]
