"""Ephemeral: keeps nothing.

Saves: nothing between epochs; its outputs are made durable downstream (a Delta table, a
topic) before anything else happens. Acknowledges: its input (Kafka offsets) only once
those outputs are committed. Restores: to any epoch it committed, by recomputing from its
input, which the source still holds.
"""

from falkirk.regimes.base import Regime

EPHEMERAL = Regime("ephemeral", keeps_state=False, restorable=("committed",))
