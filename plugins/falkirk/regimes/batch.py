"""Batch: stateless between epochs, one run per epoch.

Saves: each epoch's output as one Delta version (the epoch log names it). Acknowledges: an
epoch once its run committed it. Restores: to any committed epoch; a failed or invalidated
epoch is rerun (an Airflow DAG run per epoch, whose data interval is the epoch).
"""

from falkirk.regimes.base import Regime

BATCH = Regime("batch", keeps_state=False, restorable=("committed",), runs_per_epoch=True)
