"""Airflow glue for falkirk: operators, sensors, task callables, the plan page.

The DAG file in dags/ (falkirk_pipelines.py) only wires these together, so the DAGs,
the CLI and the tests run one copy of the logic. ``render`` imports no Airflow (the demo
report reuses it).
"""
