"""Region ``page_counts`` (batch): clicks per page in one epoch.

Stateless: each epoch is computed from that epoch's clean clicks alone, so a rerun of any
epoch (a cleared Airflow run, a rollback) writes the same rows.
"""

from __future__ import annotations

import sys

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from falkirk.job import EpochContext, EpochResult, JobLogic, main


def transform(clean_clicks: DataFrame, epoch: int) -> DataFrame:
    """Clicks per page among the rows of ``epoch`` (other epochs' rows are ignored)."""
    return (clean_clicks.filter(F.col("epoch") == epoch).groupBy("page")
            .agg(F.count(F.lit(1)).alias("clicks"))
            .select(F.lit(epoch).cast("long").alias("epoch"), "page", "clicks"))


class PageCountsJob(JobLogic):
    regions = ("page_counts",)

    def process(self, ctx: EpochContext) -> EpochResult:
        return EpochResult(outputs={"page_counts": transform(ctx.inputs["clean_clicks"],
                                                             ctx.epoch)})


if __name__ == "__main__":
    sys.exit(main(PageCountsJob()))
