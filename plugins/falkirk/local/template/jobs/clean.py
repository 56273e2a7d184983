"""Region ``clean`` (ephemeral): the valid clicks of each epoch, the rest dead-lettered.

Pure transforms; the runtime reads the epoch's records of the ``clicks`` topic (parsed
against ``schemas/records/clicks.json``) and writes the outputs exactly once.
"""

from __future__ import annotations

import sys

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from falkirk.job import EpochContext, EpochResult, JobLogic, dead_letters, main

FIELDS = ("user", "page", "ts")


def reason(epoch: int, origin_ms: int, epoch_ms: int) -> Column:
    """Why a record cannot be used (null: it can): its parse error, a missing field, or an
    event time outside the epoch being processed (a late or early click)."""
    own = F.floor((F.col("ts") - F.lit(origin_ms)) / F.lit(epoch_ms))
    check = F.when(F.col("error").isNotNull(), F.col("error"))
    for name in FIELDS:
        check = check.when(F.col(name).isNull(), F.lit(f"missing field {name}"))
    return check.when(own != epoch, F.concat(
        F.lit("event epoch "), own.cast("string"), F.lit(f" is not epoch {epoch}")))


def validate(raw: DataFrame, epoch: int, origin_ms: int, epoch_ms: int
             ) -> tuple[DataFrame, DataFrame]:
    """Split one epoch's records into (clean clicks, dead letters)."""
    df = raw.withColumn("_reason", reason(epoch, origin_ms, epoch_ms))
    clicks = df.filter(F.col("_reason").isNull()).select(
        F.lit(epoch).cast("long").alias("epoch"), *FIELDS)
    return clicks, dead_letters(df.filter(F.col("_reason").isNotNull()),
                                F.lit(epoch).cast("long"))


class CleanJob(JobLogic):
    regions = ("clean",)

    def process(self, ctx: EpochContext) -> EpochResult:
        s = ctx.pipeline.settings
        clicks, dead = validate(ctx.inputs["clicks"], ctx.epoch, int(s["origin_ms"]),
                                int(s["epoch_seconds"] * 1000))
        return EpochResult(outputs={"clean_clicks": clicks, "dead_letters": dead})


if __name__ == "__main__":
    sys.exit(main(CleanJob()))
