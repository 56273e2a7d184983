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
from pyspark.sql import Column, DataFrame, Window
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


def checked_queries_at(raw_df: DataFrame, epoch: Column) -> DataFrame:
    """The queries topic's rows with their epoch (``_epoch``) and why each is not a valid
    query (``_reason``, null for a valid one), as ``split_checked`` splits them."""
    check = F.when(F.col("error").isNotNull(), F.col("error"))
    for name in query_fields():
        check = check.when(F.col(name).isNull(), F.lit(f"missing field {name}"))
    return raw_df.withColumn("_epoch", epoch.cast("long")).withColumn("_reason", check)


def validate_queries_at(raw_df: DataFrame, epoch: Column) -> tuple[DataFrame, DataFrame]:
    """:func:`validate_queries` with the epoch as a column (the benchmark's plain job
    validates every epoch at once)."""
    return split_checked(checked_queries_at(raw_df, epoch), query_fields())


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
    older one. The runtime reads the rows the region appended for ``epoch`` (the version
    the epoch log names), so the snapshot is complete, empty or not.
    """
    return df.filter(F.col("epoch") == epoch)


def _json_ids(sorted_structs: Column) -> Column:
    """The first :data:`TOP_ITEMS` item ids of a sorted array of structs, as a JSON list."""
    top = F.slice(sorted_structs, 1, TOP_ITEMS)
    return F.to_json(F.transform(top, lambda s: s["item_id"]))


def bought_counts(interactions_df: DataFrame) -> DataFrame:
    """Purchased interaction rows per ``(user_id, category)``: what a community's favourite
    category counts (a row per epoch and user-item pair). Kept by the job across epochs:
    each epoch adds its own rows' counts, so an epoch never re-reads the history."""
    keys = [c for c in ("t",) if c in interactions_df.columns]
    return (interactions_df.filter(F.col("purchased"))
            .groupBy(*keys, "user_id", "category").agg(F.count(F.lit(1)).alias("n")))


def add_counts(a: DataFrame, b: DataFrame) -> DataFrame:
    """Two sets of :func:`bought_counts` summed per key."""
    keys = [c for c in a.columns if c != "n"]
    return a.unionByName(b).groupBy(*keys).agg(F.sum("n").alias("n"))


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
    at = F.lit(epoch).cast("long")
    return answer_at(
        queries_df.withColumn("t", at),
        _as_of(user_community_df, epoch - 1).withColumn("t", at),
        bought_counts(interactions_df.filter(F.col("epoch") < epoch)).withColumn("t", at),
        _as_of(item_popularity_df, epoch - 1).withColumn("t", at),
    )


def answer_at(queries_df: DataFrame, communities_df: DataFrame, counts_df: DataFrame,
              popularity_df: DataFrame) -> DataFrame:
    """:func:`answer` for the epochs in the ``t`` column of every input (a pass of several
    epochs): queries of epoch t, the user_community and item_popularity snapshots of t - 1
    and the purchase counts (:func:`bought_counts`) before t, each row tagged with the t it
    serves. The responses' ``epoch`` is t."""
    return answer_users(queries_df, *user_answers(communities_df, counts_df, popularity_df))


def user_answers(communities_df: DataFrame, counts_df: DataFrame, popularity_df: DataFrame
                 ) -> tuple[DataFrame, DataFrame]:
    """What every known user of epoch t is answered, before any query of t is read:
    ``(t, user_id, label, category, items)``, and per t the overall top items (for the
    users it does not know). Depends only on the state as of t - 1, so the job computes
    it as soon as that state is committed, while epoch t's queries are still coming."""
    communities = communities_df.groupBy("t", "user_id").agg(F.min("label").alias("label"))
    bought = (
        counts_df.join(communities, ["t", "user_id"])
        .groupBy("t", "label", "category")
        .agg(F.sum("n").alias("n"))
    )
    favourite = bought.groupBy("t", "label").agg(
        F.min(F.struct((-F.col("n")).alias("neg_n"), F.col("category"))).alias("best")
    ).select("t", "label", F.col("best.category").alias("category"))
    category_items = popularity_df.groupBy("t", "category").agg(
        _json_ids(F.sort_array(F.collect_list(F.struct("rank", "item_id")))).alias("cat_items")
    )
    overall = (
        popularity_df.groupBy("t", "item_id")
        .agg(F.max(F.round(F.col("revenue") * 100).cast("long")).alias("cents"))
        .groupBy("t")
        .agg(_json_ids(
            F.sort_array(F.collect_list(F.struct((-F.col("cents")).alias("neg"), "item_id")))
        ).alias("overall_items"))
    )
    users = (
        communities.join(favourite, ["t", "label"], "left")
        .join(category_items, ["t", "category"], "left")
        .join(F.broadcast(overall), "t", "left")
        .select("t", "user_id", "label", "category", F.when(
            F.col("category").isNotNull(), F.coalesce("cat_items", F.lit("[]")))
            .otherwise(F.coalesce("overall_items", F.lit("[]"))).alias("items"))
    )
    return users, overall


def answer_users(queries_df: DataFrame, users_df: DataFrame, overall_df: DataFrame
                 ) -> DataFrame:
    """The responses of the queries (``t``, ``query_id``, ``user_id``): each its user's
    answer (:func:`user_answers`), an unknown user the overall top items. The answers are
    small: broadcast, so the queries are shuffled once (their distinct)."""
    out = (
        queries_df.select("t", "query_id", "user_id")
        .distinct()
        .join(F.broadcast(users_df), ["t", "user_id"], "left")
        .join(F.broadcast(overall_df), "t", "left")
        .withColumn("items", F.coalesce("items", "overall_items", F.lit("[]")))
        .withColumn("epoch", F.col("t"))
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


def stats_epochs(responses_df: DataFrame, previous_totals_df: DataFrame,
                 epochs: list[int]) -> tuple[DataFrame, DataFrame]:
    """:func:`stats` for a pass: ``responses_df`` of several epochs (their ``epoch``
    column), the totals before the first. Returns the ``query_stats`` rows of every epoch
    and the totals after each epoch (``epoch, dimension, value, total``): every value
    known by then, its running total summed in epoch order, in one plan."""
    answered = (
        responses_df.select(
            "epoch", F.lit("community").alias("dimension"),
            F.coalesce(F.col("label").cast("string"), F.lit(NONE)).alias("value"),
        )
        .unionByName(
            responses_df.select(
                "epoch", F.lit("category").alias("dimension"),
                F.coalesce(F.col("category"), F.lit(NONE)).alias("value"),
            )
        )
        .groupBy("epoch", "dimension", "value")
        .agg(F.count(F.lit(1)).alias("answered"))
    )
    previous = previous_totals_df.groupBy("dimension", "value").agg(
        F.max("total").alias("previous"))
    keys = previous.select("dimension", "value").unionByName(
        answered.select("dimension", "value")).distinct()
    grid = (keys.withColumn("epoch", F.explode(F.array(*[F.lit(e).cast("long")
                                                         for e in epochs])))
            .join(answered, ["epoch", "dimension", "value"], "left")
            .join(previous, ["dimension", "value"], "left"))
    running = Window.partitionBy("dimension", "value").orderBy("epoch").rowsBetween(
        Window.unboundedPreceding, Window.currentRow)
    totals = grid.select(
        "epoch", "dimension", "value", F.coalesce("answered", F.lit(0)).alias("answered"),
        (F.coalesce("previous", F.lit(0))
         + F.sum(F.coalesce("answered", F.lit(0))).over(running)).cast("long").alias("total"),
        # a value is known from its first answer on (or before the pass)
        F.max(F.col("previous").isNotNull() | (F.coalesce("answered", F.lit(0)) > 0))
        .over(running).alias("known"))
    query_stats = conform(totals.filter(F.col("answered") > 0), "query_stats")
    return query_stats, totals.filter("known").select("epoch", "dimension", "value", "total")


TOTALS_SCHEMA = pa.schema([("dimension", pa.string()), ("value", pa.string()),
                           ("total", pa.int64())])


class ServeJob(JobLogic):
    """serve (ephemeral) and stats (eager) in one Spark job, joined by an unlogged edge.

    serve answers the epoch's queries from the side inputs as of e - 1 and sends the
    responses (clients keep the latest per query id and epoch); stats folds them into
    running totals, committed with its state every epoch. serve's purchase counts per user
    and category live in the job (a cache, rebuilt from the interactions table when the
    job starts or moves): an epoch reads only the interactions its e - 1 appended.
    """

    regions = (REGION, STATS)

    def __init__(self) -> None:
        super().__init__()
        self.bought: DataFrame | None = None  # bought_counts of sender epochs ≤ through
        self.through: int | None = None
        self._next: tuple[DataFrame, int] | None = None
        # (epoch, its counts, users' answers, overall items): prepare_epoch's
        self._prepared: tuple[int, DataFrame, DataFrame, DataFrame] | None = None

    def initial_state(self, region: str, spark):
        return spark.createDataFrame([], "dimension string, value string, total long")

    def _counts_before(self, ctx: EpochContext) -> DataFrame:
        """The purchase counts of every interaction before the first epoch's own e - 1:
        kept from the last pass, or read once from the table's history. An epoch
        prepared while the one before it commits (the job behind) takes the counts that
        commit moves on to."""
        following = self._next
        if following is not None and following[1] == ctx.epoch - 2:
            return following[0]
        if self.bought is None or self.through != ctx.epoch - 2:
            self.bought = cut_lineage(bought_counts(ctx.history("bought")))
            self.through = ctx.epoch - 2
        return self.bought

    def prepare_epoch(self, ctx: EpochContext) -> None:
        """The state side of epoch e's answers, from the state as of e - 1, computed as
        soon as that is committed, while e's queries are still coming: when they close,
        only their join is left (the answers' latency)."""
        at = F.lit(ctx.epoch).cast("long")
        before = self._counts_before(ctx)
        new = bought_counts(ctx.inputs["bought"].filter(F.col("epoch") == ctx.epoch - 1))
        counts = cut_lineage(add_counts(before, new))
        users, overall = user_answers(
            _as_of(ctx.inputs["user_community"], ctx.epoch - 1).withColumn("t", at),
            counts.withColumn("t", at),
            _as_of(ctx.inputs["item_popularity"], ctx.epoch - 1).withColumn("t", at))
        self._prepared = (ctx.epoch, counts, cut_lineage(users), cut_lineage(overall))

    def process(self, ctx: EpochContext) -> EpochResult:
        at = F.lit(ctx.epoch).cast("long")
        queries, dead = validate_queries(ctx.inputs["queries"], ctx.epoch)
        if self._prepared is None or self._prepared[0] != ctx.epoch:
            self.prepare_epoch(ctx)
        _, counts, users, overall = self._prepared
        # computed once (one Spark job): the answers are sent, counted and checkpointed
        # from here, not planned again by each of the epoch's commits
        responses = cut_lineage(answer_users(queries.withColumn("t", at), users, overall))
        self._next = (counts, ctx.epoch - 1)
        outputs = {"responses": _messages(responses), "query_dead_letters": dead}
        state = {}
        if STATS in ctx.active:
            query_stats, totals = stats(responses, ctx.state[STATS], ctx.epoch)
            outputs["query_stats"] = query_stats
            state[STATS] = totals  # cut once committed (settle_state): off the answers' path
        return EpochResult(outputs=outputs, state=state)

    def process_pass(self, ctx: EpochContext) -> EpochResult:
        """Several epochs: every input carries the epoch t it serves (its pass column);
        the counts before t are those before the pass plus the pass's appends up to t."""
        t = F.col(PASS_COLUMN).cast("long")
        # read and checked once (one Spark job): the answers and the dead letters come
        # from these rows, where the dead letters' write read and parsed the topic again
        # (28 s of a 30-epoch pass's 97 s after an outage)
        checked = cut_lineage(checked_queries_at(ctx.inputs["queries"], t))
        queries, dead = split_checked(checked, query_fields())
        appended = ctx.inputs["bought"]
        before = self._counts_before(ctx)
        epochs = ctx.spark.createDataFrame([(e,) for e in ctx.epochs], "t long")
        # a row delivered at p counts for every t ≥ p of the pass
        spread = bought_counts(appended.withColumn("t", F.explode(
            F.sequence(t, F.lit(ctx.last).cast("long")))))
        counts = add_counts(before.crossJoin(epochs), spread)
        communities = ctx.inputs["user_community"].filter(F.col("epoch") == t - 1)
        popularity = ctx.inputs["item_popularity"].filter(F.col("epoch") == t - 1)
        responses = answer_at(queries.withColumn("t", F.col("epoch")),
                              communities.withColumn("t", t),
                              counts, popularity.withColumn("t", t))
        responses = cut_lineage(responses.withColumn(PASS_COLUMN, F.col("epoch")))
        self._next = (cut_lineage(add_counts(before, bought_counts(appended))), ctx.last - 1)
        outputs = {"responses": _messages(responses), "query_dead_letters": dead}
        result = EpochResult(outputs=outputs)
        if STATS in ctx.active:
            query_stats, totals = stats_epochs(responses, ctx.state[STATS], ctx.epochs)
            totals = cut_lineage(totals)

            def after(e: int) -> DataFrame:
                return totals.filter(F.col("epoch") == e).select("dimension", "value",
                                                                 "total")

            outputs["query_stats"] = query_stats
            result.state[STATS] = after(ctx.last)
            result.states[STATS] = {e: after(e) for e in ctx.checkpoints.get(STATS, [])}
        return result

    def finish_epoch(self, ctx: EpochContext) -> None:
        if self._next is not None:  # committed: the counts move on
            self.bought, self.through = self._next  # cut already
            self._next = None

    def release(self) -> None:
        self.bought, self.through, self._next, self._prepared = None, None, None, None

    def settle_state(self, region: str, state: DataFrame) -> DataFrame:
        return cut_lineage(state)

    def state_schema(self, region: str) -> pa.Schema:
        return TOTALS_SCHEMA

    def state_to_frame(self, region: str, state: DataFrame) -> DataFrame:
        return state.select(F.concat_ws(":", "dimension", "value").alias("key"),
                            "dimension", "value", "total")

    def state_from_frame(self, region: str, frame: DataFrame, spark) -> DataFrame:
        return cut_lineage(frame.select("dimension", "value", "total"))


def _messages(responses: DataFrame) -> DataFrame:
    """The responses as the topic's messages: the query id as key, the row as JSON (and,
    in a pass, each row's epoch)."""
    extra = [PASS_COLUMN] if PASS_COLUMN in responses.columns else []
    data = [c for c in responses.columns if c != PASS_COLUMN]
    return responses.select(F.col("query_id").alias("key"),
                            F.to_json(F.struct(*data)).alias("value"), *extra)


if __name__ == "__main__":
    sys.exit(main(ServeJob()))
