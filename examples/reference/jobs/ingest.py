"""Region ``ingest``: validate the events of one epoch, dead-letter the rest, aggregate.

Pure transforms (no I/O); the runtime reads the epoch's records from the events topic
(Spark's Kafka connector, values parsed against :func:`value_schema` by
``falkirk.io.kafka``), calls them and writes
``purchases``, ``interactions`` and ``dead_letters``. Every output is a function of the
input rows only (no ordering, no floating-point sums that depend on partitioning), so
running an epoch again after a rollback writes the same rows.
"""

from __future__ import annotations

import sys

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from falkirk.job import (
    PASS_COLUMN,
    EpochContext,
    EpochResult,
    JobLogic,
    arrow_schema,
    conform,
    cut_lineage,
    ddl,
    main,
    split_checked,
)

REGION = "ingest"
KINDS = ("view", "click", "purchase")
INTERACTION_KINDS = ("click", "purchase")

# Reason kinds, in the order the checks run (only the first failure is reported):
# the source's parse error verbatim (a JSON problem or a wrong type), then
# "missing field <name>", "unknown kind '<kind>'", "non-finite amount <amount>",
# "negative amount <amount>", "non-zero amount <amount> on a <kind>",
# "late: event epoch k < epoch e", "early: event epoch k > epoch e".
REASON_KINDS = ("source", "missing field", "unknown kind", "non-finite amount",
                "negative amount", "non-zero amount", "late", "early")  # fmt: skip


def value_schema() -> str:
    """The record schema the events topic's values are parsed against (Spark DDL), from
    this pipeline's ``schemas/records/events.json`` (resolved when a job runs, not on import)."""
    return ddl("records", "events")


def event_fields() -> tuple[str, ...]:
    """The fields of a event record, in the order its schema declares them."""
    return tuple(f.name for f in arrow_schema("records", "events"))


def event_epoch(ts: Column, origin_ms: int, epoch_ms: int) -> Column:
    """floor((ts - origin) / epoch_ms) in exact integer arithmetic (negative before origin)."""
    d = ts - F.lit(origin_ms)
    return ((d - F.pmod(d, F.lit(epoch_ms))) / F.lit(epoch_ms)).cast("long")


def reason(epoch: Column, origin_ms: int, epoch_ms: int) -> Column:
    """Why a source row is not a valid event of ``epoch``, or null when it is."""
    kind, amount = F.col("kind"), F.col("amount")
    k = event_epoch(F.col("ts"), origin_ms, epoch_ms)
    check = F.when(F.col("error").isNotNull(), F.col("error"))
    for name in event_fields():
        check = check.when(F.col(name).isNull(), F.lit(f"missing field {name}"))
    return (
        check.when(~kind.isin(*KINDS), F.concat(F.lit("unknown kind '"), kind, F.lit("'")))
        .when(
            F.isnan(amount) | (F.abs(amount) == float("inf")),
            F.concat(F.lit("non-finite amount "), amount.cast("string")),
        )
        .when(amount < 0, F.concat(F.lit("negative amount "), amount.cast("string")))
        .when(
            (kind != "purchase") & (amount != 0),
            F.concat(F.lit("non-zero amount "), amount.cast("string"), F.lit(" on a "), kind),
        )
        .when(k < epoch, F.format_string("late: event epoch %d < epoch %d", k, epoch))
        .when(k > epoch, F.format_string("early: event epoch %d > epoch %d", k, epoch))
    )


def reason_kind(reason_col: Column) -> Column:
    """The kind of a dead-letter reason (one of :data:`REASON_KINDS`), for counting."""
    out = None
    for kind in REASON_KINDS[1:]:
        cond = reason_col.startswith(kind)
        out = F.when(cond, F.lit(kind)) if out is None else out.when(cond, F.lit(kind))
    return out.otherwise(F.lit("source"))


def checked_at(raw_df: DataFrame, epoch: Column, origin_ms: int, epoch_ms: int) -> DataFrame:
    """The source rows with the epoch they are validated against (``_epoch``) and why each
    is not a valid event (``_reason``, null for a valid one), as ``split_checked`` splits
    them. A job cuts this frame's lineage, so the records are parsed once however many
    outputs read them."""
    return (
        raw_df
        .withColumn("_epoch", epoch.cast("long"))
        .withColumn("_reason", reason(F.col("_epoch"), origin_ms, epoch_ms))
    )


def validate_at(
    raw_df: DataFrame, epoch: Column, origin_ms: int, epoch_ms: int
) -> tuple[DataFrame, DataFrame]:
    """:func:`validate` with the epoch as a column (the generator's ground truth uses it)."""
    return split_checked(checked_at(raw_df, epoch, origin_ms, epoch_ms), event_fields())


def validate(
    raw_df: DataFrame, epoch: int, origin_ms: int, epoch_ms: int
) -> tuple[DataFrame, DataFrame]:
    """Split epoch ``epoch``'s source rows into ``(events_df, dead_letters_df)``.

    ``raw_df`` is ``falkirk.io.kafka.read_range``'s output with the record schema
    :func:`value_schema`. A row is a valid event when the
    source parsed it, no field is missing, its kind is known, its amount is finite and
    not negative, non-zero only on a purchase, and its event time (the ``ts`` field, not
    the Kafka timestamp) falls in ``epoch``; else it is a dead letter with the first
    failed check as reason (see :data:`REASON_KINDS`) and ``epoch`` = the epoch being
    processed. ``events_df``: the event fields plus ``epoch`` (= ``epoch``). Both are
    read from ``raw_df``: a job cuts :func:`checked_at`'s lineage instead (one parse).
    """
    return validate_at(raw_df, F.lit(epoch), origin_ms, epoch_ms)


def purchases(events_df: DataFrame) -> DataFrame:
    """Per (epoch, category, item_id): purchase count and revenue.

    Revenue adds each amount rounded to cents as an integer, so the sum is exact and
    does not depend on the order Spark adds in (a double sum would).
    """
    out = (
        events_df.filter(F.col("kind") == "purchase")
        .groupBy("epoch", "category", "item_id")
        .agg(
            F.count(F.lit(1)).alias("purchases"),
            F.sum(F.round(F.col("amount") * 100).cast("long")).alias("cents"),
        )
        .withColumn("revenue", F.col("cents") / F.lit(100.0))
    )
    return conform(out, "purchases")


def interactions(events_df: DataFrame) -> DataFrame:
    """Distinct (epoch, user_id, item_id) over clicks and purchases; purchased = any purchase.

    Views are not interactions: they neither join users into communities nor count.
    """
    out = (
        events_df.filter(F.col("kind").isin(*INTERACTION_KINDS))
        .groupBy("epoch", "user_id", "item_id")
        .agg(
            F.min("category").alias("category"),
            F.max(F.col("kind") == "purchase").alias("purchased"),
        )
    )
    return conform(out, "interactions")


class IngestJob(JobLogic):
    """Ephemeral: validate and reduce each epoch; nothing is kept between epochs."""

    regions = (REGION,)

    def process(self, ctx: EpochContext) -> EpochResult:
        return self._validated(ctx, F.lit(ctx.epoch))

    def process_pass(self, ctx: EpochContext) -> EpochResult:
        """Several epochs at once: each record validated against the epoch whose range it
        was read in (its pass column); every output is grouped by epoch already."""
        return self._validated(ctx, F.col(PASS_COLUMN))

    def _validated(self, ctx: EpochContext, epoch: Column) -> EpochResult:
        s = ctx.pipeline.settings
        # Parsed and checked once, by one Spark job: the outputs are then written side by
        # side from its rows. A persisted frame instead was parsed again by the writes
        # (each holding a core for seconds, while the answering job's small stages queued
        # behind them) or waited on the blocks another write was filling.
        checked = cut_lineage(checked_at(ctx.inputs["events"], epoch, int(s["origin_ms"]),
                                         int(s["epoch_seconds"] * 1000)))
        events, dead = split_checked(checked, event_fields())
        return EpochResult(outputs={"purchases": purchases(events),
                                    "interactions": interactions(events),
                                    "dead_letters": dead})


if __name__ == "__main__":
    sys.exit(main(IngestJob()))
