"""A consumer of the reference pipeline: each category's leading item per epoch, kept in
the ``category_leaders`` Delta table beside the pipeline's tables.

It is scheduled on ``item_popularity``'s asset, so it runs when an epoch of the table is
announced (popularity's run in the batch DAG, or a rerun after a rollback) and when a
rollback restates epochs of it. Each run reads exactly the epochs its triggering events
name, oldest first:

- a commit (``epoch``, ``table_version``): the epoch's rows of item_popularity as of that
  version, whose rank-1 rows replace the epoch's leaders;
- a restatement (``restated``, ``from_epoch`` to ``to_epoch``): those epochs' results were
  withdrawn, so their leaders are recomputed from the table as it is now. Right after the
  rollback the table has no rows for them (restored to before them): their leaders are
  dropped, and the reruns' commits announce them again.

So the table always equals what item_popularity says, however often an epoch is restated.
falkirk loads this file beside the pipeline's own DAGs (the pipeline folder's ``dags/``,
falkirk.airflow.factory.consumer_dags); it is created paused, like any DAG.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from airflow.sdk import DAG, task

from falkirk.airflow.assets import epoch_events, lake_asset, lake_table, output_asset

PIPELINE = "reference"
ITEM_POPULARITY = output_asset(PIPELINE, "item_popularity")
LEADERS_TABLE = "category_leaders"
CATEGORY_LEADERS = lake_asset(f"{PIPELINE}.{LEADERS_TABLE}", LEADERS_TABLE)


def leaders_schema() -> Any:
    import pyarrow as pa

    return pa.schema([("epoch", pa.int64(), False), ("category", pa.string(), False),
                      ("item_id", pa.int64(), False), ("revenue", pa.float64(), False),
                      ("source_version", pa.int64(), False),
                      ("generation", pa.int64(), False)])


def read_epochs(first: int, last: int, version: int | None) -> tuple[Any, int]:
    """item_popularity's rank-1 rows of epochs first..last, as of ``version`` (None: now);
    the version read."""
    from deltalake import DeltaTable

    uri, opts = lake_table("item_popularity")
    table = DeltaTable(uri, version=version, storage_options=opts)
    rows = table.to_pyarrow_table(filters=[("epoch", ">=", first), ("epoch", "<=", last),
                                           ("rank", "=", 1)],
                                  columns=["epoch", "category", "item_id", "revenue"])
    return rows, table.version()


def replace_epochs(first: int, last: int, rows: Any, version: int, generation: int) -> int:
    """The leaders of epochs first..last become ``rows`` (none: dropped); rows written."""
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    uri, opts = lake_table(LEADERS_TABLE)
    schema = leaders_schema()
    n = rows.num_rows
    out = pa.table({"epoch": rows["epoch"], "category": rows["category"],
                    "item_id": rows["item_id"], "revenue": rows["revenue"],
                    "source_version": pa.array([version] * n, pa.int64()),
                    "generation": pa.array([generation] * n, pa.int64())}, schema=schema)
    predicate = f"epoch >= {first} AND epoch <= {last}"
    if not DeltaTable.is_deltatable(uri, storage_options=opts):
        write_deltalake(uri, out, mode="append", storage_options=opts)
    elif n:
        write_deltalake(uri, out, mode="overwrite", predicate=predicate, storage_options=opts)
    else:
        DeltaTable(uri, storage_options=opts).delete(predicate)
    return n


with DAG(
    dag_id="reference_category_leaders",
    description="Each category's leading item per epoch of item_popularity; recomputed "
                "when a rollback restates epochs",
    doc_md=__doc__,
    schedule=ITEM_POPULARITY,
    start_date=datetime(2024, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,  # events in the order they came
    tags=["example", PIPELINE],
) as dag:

    @task(outlets=[CATEGORY_LEADERS])
    def leaders(triggering_asset_events: Any = None) -> list[dict[str, Any]]:
        """Apply each triggering event in order; what each did."""
        done = []
        for event in epoch_events(triggering_asset_events, ITEM_POPULARITY):
            if event.get("restated"):
                first, last, version = event["from_epoch"], event["to_epoch"], None
            else:
                first = last = event["epoch"]
                version = event["table_version"]
            rows, read = read_epochs(first, last, version)
            n = replace_epochs(first, last, rows, read, event["generation"])
            done.append({"epochs": [first, last], "restated": bool(event.get("restated")),
                         "item_popularity_version": read, "leaders": n})
            print(f"epochs {first}..{last}"
                  f"{' (restated)' if event.get('restated') else ''}: {n} leaders from "
                  f"item_popularity version {read}")
        return done

    leaders()
