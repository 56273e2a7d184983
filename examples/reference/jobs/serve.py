"""Region ``serve``: answer the queries of epoch e from the state as of epoch e - 1, and count.

Serving and its statistics run in one Spark job, so both transforms live here. The
runtime reads the epoch's queries from the queries topic (``valueSchema`` =
:func:`value_schema`) and the side inputs cut at e - 1 (``user_community``,
``interactions``, ``item_popularity``), and writes ``responses`` and ``query_stats``.
Answers depend only on those rows: every choice has a total order for its ties.
"""

from __future__ import annotations

import sys

import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from falkirk.job import (
    EpochContext,
    EpochResult,
    JobLogic,
    arrow_schema,
    conform,
    cut_lineage,
    ddl,
    dead_letters,
    main,
)

REGION = "serve"
STATS = "stats"
TOP_ITEMS = 3
NONE = "none"  # query_stats value for a null label or category


def value_schema() -> str:
    """The record schema the queries topic's values are parsed against (Spark DDL), from
    this pipeline's ``schemas/records/queries.json`` (resolved when a job runs, not on import)."""
    return ddl("records", "queries")


def query_fields() -> tuple[str, ...]:
    """The fields of a querie record, in the order its schema declares them."""
    return tuple(f.name for f in arrow_schema("records", "queries"))


def validate_queries_at(raw_df: DataFrame, epoch: Column) -> tuple[DataFrame, DataFrame]:
    """:func:`validate_queries` with the epoch as a column (the benchmark's plain job
    validates every epoch at once)."""
    check = F.when(F.col("error").isNotNull(), F.col("error"))
    for name in query_fields():
        check = check.when(F.col(name).isNull(), F.lit(f"missing field {name}"))
    df = raw_df.withColumn("_epoch", epoch.cast("long")).withColumn("_reason", check)
    queries = df.filter(F.col("_reason").isNull()).select(
        *query_fields(), F.col("_epoch").alias("epoch")
    )
    return queries, dead_letters(df.filter(F.col("_reason").isNotNull()), F.col("_epoch"))


def validate_queries(raw_df: DataFrame, epoch: int) -> tuple[DataFrame, DataFrame]:
    """Split the source rows of the queries topic into ``(queries_df, dead_letters_df)``.

    A row the source could not parse (reason: its
    error) or with a missing field ("missing field <name>") is a dead letter of
    ``epoch``. A query is answered in the epoch it is read in, whatever its ``ts``:
    lateness does not apply to requests. ``queries_df``: the query fields plus ``epoch``.
    """
    return validate_queries_at(raw_df, F.lit(epoch))


def _as_of(df: DataFrame, epoch: int) -> DataFrame:
    """The snapshot of epoch ``epoch`` of a full-snapshot table: its rows of that epoch.

    Not "the latest rows before": an epoch its region committed with no rows is an empty
    snapshot (e.g. no purchases in the popularity window), not a reason to answer from an
    older one. The runtime reads the table at the version where its region committed
    ``epoch`` (the epoch log says so), so the snapshot is complete, empty or not.
    """
    return df.filter(F.col("epoch") == epoch)


def _json_ids(sorted_structs: Column) -> Column:
    """The first :data:`TOP_ITEMS` item ids of a sorted array of structs, as a JSON list."""
    top = F.slice(sorted_structs, 1, TOP_ITEMS)
    return F.to_json(F.transform(top, lambda s: s["item_id"]))


def answer(
    queries_df: DataFrame,
    user_community_df: DataFrame,
    interactions_df: DataFrame,
    item_popularity_df: DataFrame,
    epoch: int,
) -> DataFrame:
    """One ``responses`` row per distinct (query_id, user_id) of epoch ``epoch``.

    The state is as of ``epoch - 1``: ``user_community`` and ``item_popularity`` are full
    snapshots, of which exactly the one of ``epoch - 1`` is used (empty if that epoch
    committed no rows); all ``interactions`` before ``epoch`` count; rows of ``epoch`` or
    later are ignored whatever the caller passes.

    - label: the user's community label; null when the user is in no community.
    - category: the category with the most ``purchased`` interaction rows among users of
      that community (a row per epoch and user-item pair; users counted by their current
      community), ties to the smaller category; null for an unknown user or a community
      that bought nothing.
    - items: with a category, its top :data:`TOP_ITEMS` items by rank (then item id) in
      the popularity snapshot of ``epoch - 1``: fewer if it ranks fewer, ``[]`` if it ranks
      none (the community's taste is kept, not replaced by the overall best sellers);
      without a category, the top items overall in that snapshot by revenue descending,
      then item id (``[]`` if the snapshot is empty). A JSON list such as ``[4,12,9]``.
    """
    communities = (
        _as_of(user_community_df, epoch - 1)
        .groupBy("user_id")
        .agg(F.min("label").alias("label"))
    )
    popularity = _as_of(item_popularity_df, epoch - 1)
    bought = (
        interactions_df.filter((F.col("epoch") < epoch) & F.col("purchased"))
        .join(communities, "user_id")
        .groupBy("label", "category")
        .agg(F.count(F.lit(1)).alias("n"))
    )
    favourite = bought.groupBy("label").agg(
        F.min(F.struct((-F.col("n")).alias("neg_n"), F.col("category"))).alias("best")
    ).select("label", F.col("best.category").alias("category"))
    category_items = popularity.groupBy("category").agg(
        _json_ids(F.sort_array(F.collect_list(F.struct("rank", "item_id")))).alias("cat_items")
    )
    overall = (
        popularity.groupBy("item_id")
        .agg(F.max(F.round(F.col("revenue") * 100).cast("long")).alias("cents"))
        .agg(  # one row, even when empty: "[]"
            _json_ids(
                F.sort_array(F.collect_list(F.struct((-F.col("cents")).alias("neg"), "item_id")))
            ).alias("overall_items")
        )
    )
    out = (
        queries_df.select("query_id", "user_id")
        .distinct()
        .join(communities, "user_id", "left")
        .join(favourite, "label", "left")
        .join(category_items, "category", "left")
        .crossJoin(overall)
        .withColumn(
            "items",
            F.when(F.col("category").isNotNull(), F.coalesce("cat_items", F.lit("[]"))).otherwise(
                F.col("overall_items")
            ),
        )
        .withColumn("epoch", F.lit(epoch))
    )
    return conform(out, "responses")


def stats(
    responses_df: DataFrame, previous_totals_df: DataFrame, epoch: int
) -> tuple[DataFrame, DataFrame]:
    """``(query_stats rows of epoch, totals)``: answered per community and per category.

    dimension ``community`` counts by ``str(label)``, ``category`` by the recommended
    category, either ``'none'`` when null. ``total`` = previous total + answered.
    ``previous_totals_df`` holds ``(dimension, value, total)``: the totals returned for
    epoch - 1, or the ``query_stats`` rows themselves (the largest total per value is its
    latest; rows with an ``epoch`` column at ``epoch`` or later are ignored). Values with
    nothing answered now get no query_stats row but stay in the returned totals.
    """
    if "epoch" in responses_df.columns:
        responses_df = responses_df.filter(F.col("epoch") == epoch)
    if "epoch" in previous_totals_df.columns:
        previous_totals_df = previous_totals_df.filter(F.col("epoch") < epoch)
    answered = (
        responses_df.select(
            F.lit("community").alias("dimension"),
            F.coalesce(F.col("label").cast("string"), F.lit(NONE)).alias("value"),
        )
        .unionByName(
            responses_df.select(
                F.lit("category").alias("dimension"),
                F.coalesce(F.col("category"), F.lit(NONE)).alias("value"),
            )
        )
        .groupBy("dimension", "value")
        .agg(F.count(F.lit(1)).alias("answered"))
    )
    previous = previous_totals_df.groupBy("dimension", "value").agg(
        F.max("total").alias("previous")
    )
    totals = answered.join(previous, ["dimension", "value"], "full").select(
        "dimension",
        "value",
        F.coalesce("answered", F.lit(0)).alias("answered"),
        (F.coalesce("previous", F.lit(0)) + F.coalesce("answered", F.lit(0))).alias("total"),
    )
    query_stats = conform(
        totals.filter(F.col("answered") > 0).withColumn("epoch", F.lit(epoch)), "query_stats"
    )
    return query_stats, totals.select("dimension", "value", F.col("total").cast("long"))


TOTALS_SCHEMA = pa.schema([("dimension", pa.string()), ("value", pa.string()),
                           ("total", pa.int64())])


class ServeJob(JobLogic):
    """serve (ephemeral) and stats (eager) in one Spark job, joined by an unlogged edge.

    serve answers the epoch's queries from the side inputs as of e - 1 and sends the
    responses (clients keep the latest per query id); stats folds them into running
    totals, committed with its state every epoch.
    """

    regions = (REGION, STATS)

    def initial_state(self, region: str, spark):
        return spark.createDataFrame([], "dimension string, value string, total long")

    def process(self, ctx: EpochContext) -> EpochResult:
        queries, dead = validate_queries(ctx.inputs["queries"], ctx.epoch)
        responses = answer(queries, ctx.inputs["user_community"], ctx.inputs["bought"],
                           ctx.inputs["item_popularity"], ctx.epoch).persist()
        self._cached = [responses]
        outputs = {
            "responses": responses.select(
                F.col("query_id").alias("key"),
                F.to_json(F.struct(*responses.columns)).alias("value")),
            "query_dead_letters": dead,
        }
        state = {}
        if STATS in ctx.active:
            query_stats, totals = stats(responses, ctx.state[STATS], ctx.epoch)
            outputs["query_stats"] = query_stats
            state[STATS] = cut_lineage(totals)
        return EpochResult(outputs=outputs, state=state)

    def finish_epoch(self, ctx: EpochContext) -> None:
        for df in self._cached:
            df.unpersist()

    def state_schema(self, region: str) -> pa.Schema:
        return TOTALS_SCHEMA

    def state_to_frame(self, region: str, state: DataFrame) -> DataFrame:
        return state.select(F.concat_ws(":", "dimension", "value").alias("key"),
                            "dimension", "value", "total")

    def state_from_frame(self, region: str, frame: DataFrame, spark) -> DataFrame:
        return cut_lineage(frame.select("dimension", "value", "total"))


if __name__ == "__main__":
    sys.exit(main(ServeJob()))
