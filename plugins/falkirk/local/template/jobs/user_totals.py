"""Region ``user_totals`` (eager): running clicks per user, state committed every epoch.

The state is a DataFrame ``(user, total)``; falkirk checkpoints the users whose total
changed and restores it after a failure, so the running totals never count an epoch twice.
"""

from __future__ import annotations

import sys

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from falkirk.job import EpochContext, EpochResult, JobLogic, cut_lineage, main

STATE_SCHEMA = pa.schema([("user", pa.string()), ("total", pa.int64())])


def transform(clean_clicks: DataFrame, totals: DataFrame, epoch: int
              ) -> tuple[DataFrame, DataFrame]:
    """(rows of ``epoch`` for the users who clicked in it, the new totals)."""
    now = (clean_clicks.filter(F.col("epoch") == epoch).groupBy("user")
           .agg(F.count(F.lit(1)).alias("clicks")))
    merged = now.join(totals, "user", "full").select(
        "user", F.coalesce("clicks", F.lit(0)).alias("clicks"),
        (F.coalesce("total", F.lit(0)) + F.coalesce("clicks", F.lit(0))).alias("total"))
    rows = merged.filter(F.col("clicks") > 0).select(
        F.lit(epoch).cast("long").alias("epoch"), "user", "clicks", "total")
    return rows, merged.select("user", F.col("total").cast("long"))


class UserTotalsJob(JobLogic):
    regions = ("user_totals",)

    def initial_state(self, region: str, spark) -> DataFrame:
        return spark.createDataFrame([], "user string, total long")

    def process(self, ctx: EpochContext) -> EpochResult:
        rows, totals = transform(ctx.inputs["clicks_for_totals"], ctx.state["user_totals"],
                                 ctx.epoch)
        return EpochResult(outputs={"user_totals": rows},
                           state={"user_totals": cut_lineage(totals)})

    def state_schema(self, region: str) -> pa.Schema:
        return STATE_SCHEMA

    def state_to_frame(self, region: str, state: DataFrame) -> DataFrame:
        return state.select(F.col("user").alias("key"), "user", "total")

    def state_from_frame(self, region: str, frame: DataFrame, spark) -> DataFrame:
        return cut_lineage(frame.select("user", "total"))


if __name__ == "__main__":
    sys.exit(main(UserTotalsJob()))
