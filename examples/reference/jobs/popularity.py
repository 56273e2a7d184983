"""Region ``popularity``: the top items per category over a sliding window of epochs.

A pure transform from the ``purchases`` table to one ``item_popularity`` snapshot per
epoch; the runtime reads the window's purchases and writes the snapshot. It keeps no
state between epochs (each snapshot is recomputed from the window), so any epoch can be
recomputed alone after a rollback and gives the same rows.
"""

from __future__ import annotations

import sys

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from falkirk.job import EpochContext, EpochResult, JobLogic, conform, main

REGION = "popularity"
DEFAULT_WINDOW = 3
DEFAULT_TOP_N = 10


def transform(purchases_df: DataFrame, epoch: int, window: int, top_n: int) -> DataFrame:
    """Items ranked by revenue per category over epochs (epoch - window, epoch].

    Revenue is summed in integer cents (exact, order-independent) and ranks are unique:
    revenue descending, then item_id ascending. Only ranks <= ``top_n`` are kept; the
    output's ``epoch`` is ``epoch``. Rows of ``purchases_df`` outside the window are
    ignored, so the caller may pass more than the window.
    """
    return transform_epochs(purchases_df, [epoch], window, top_n)


def transform_epochs(purchases_df: DataFrame, epochs: list[int], window: int,
                     top_n: int) -> DataFrame:
    """:func:`transform` for each of ``epochs`` at once (a pass): a purchase row of epoch
    k counts in the windows of epochs k .. k + window - 1, so each row is sent to those of
    ``epochs`` and every window is ranked apart; the same rows as one call per epoch."""
    if window < 1 or top_n < 1:
        raise ValueError(f"window and top_n must be ≥ 1, got window={window}, top_n={top_n}")
    lo, hi = min(epochs), max(epochs)
    target = F.explode(F.sequence(F.col("epoch"), F.col("epoch") + window - 1)).alias("t")
    totals = (
        purchases_df.select("category", "item_id", "purchases", "revenue", target)
        .filter(F.col("t").isin(epochs) & F.col("t").between(lo, hi))
        .groupBy("t", "category", "item_id")
        .agg(
            F.sum("purchases").alias("purchases"),
            F.sum(F.round(F.col("revenue") * 100).cast("long")).alias("cents"),
        )
    )
    order = Window.partitionBy("t", "category").orderBy(F.col("cents").desc(),
                                                        F.col("item_id").asc())
    ranked = (
        totals.withColumn("rank", F.row_number().over(order))
        .filter(F.col("rank") <= top_n)
        .withColumn("revenue", F.col("cents") / F.lit(100.0))
        .withColumn("epoch", F.col("t"))
    )
    return conform(ranked, "item_popularity")


class PopularityJob(JobLogic):
    """Batch: one epoch per run (an Airflow data interval); recomputed from the window."""

    regions = (REGION,)

    def process(self, ctx: EpochContext) -> EpochResult:
        return self.process_pass(ctx)

    def process_pass(self, ctx: EpochContext) -> EpochResult:
        """The window is the purchases edge's (``window:`` in pipeline.yaml): the runtime
        reads only those epochs' files."""
        window = ctx.pipeline.edges["purchases"].window or DEFAULT_WINDOW
        top = transform_epochs(ctx.inputs["purchases"], ctx.epochs, window,
                               int(ctx.pipeline.app.get("top_n", DEFAULT_TOP_N)))
        return EpochResult(outputs={"item_popularity": top})


if __name__ == "__main__":
    sys.exit(main(PopularityJob()))
