"""The DAGs of every declared pipeline: wiring only (falkirk.airflow.factory builds them).

Per pipeline p: falkirk_p_streams, falkirk_p_stream_checks, falkirk_p_batch_<region> per
batch region, falkirk_p_rollback and falkirk_p_gc. Pipelines are found in
$FALKIRK_PIPELINES, then in the checkout's examples/; `falkirk pipelines` says why one gets
no DAGs.

This file ships in falkirk's package so an installed wheel has it: `falkirk airflow start`
points Airflow's DAG folder at this folder (falkirk.local.airflow.DAGS_FOLDER).
"""

from __future__ import annotations

from falkirk.airflow.factory import declared_dags

globals().update(declared_dags())
