"""The limit to compare with: one plain PySpark batch job computing the reference
pipeline's output tables from its input topics in one pass.

No epochs, no epoch log, no exactly-once commits, no checkpoints, no acknowledgements:
the whole input is read once (Spark's Kafka source, earliest to latest), each record is
given the epoch the pipeline would process it in (on its partition, the epoch of the
largest timestamp up to it: the cut the broker's time index gives), and every output
table is computed for all epochs at once with the epoch as a grouping key, reusing the
reference jobs' pure transforms where they take the epoch as a column. The one place
that needs iterating is ``user_community`` (connected components of the graph as it
grows): a label propagation over (node, from-epoch, label) steps that converges for every
epoch together (:func:`temporal_components`).

Written for the scale benchmark only (dev tooling, not the framework): it is what a user
would write without falkirk, so the benchmark can say what falkirk's regimes cost.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F


def read_topic(spark: SparkSession, bootstrap: str, topic: str, value_ddl: str,
               origin_ms: int, epoch_ms: int, last_epoch: int, epoch_of) -> DataFrame:
    """Every record of ``topic`` parsed, with ``_pe``: the epoch the pipeline processes it
    in (records past ``last_epoch`` are left out, as a bounded run leaves them)."""
    from falkirk.io.kafka import READ_OPTIONS, parse_values

    raw = (spark.read.format("kafka").option("kafka.bootstrap.servers", bootstrap)
           .options(**READ_OPTIONS).option("subscribe", topic).option("startingOffsets", "earliest")
           .option("endingOffsets", "latest").load())
    upto = Window.partitionBy("partition").orderBy("offset").rowsBetween(
        Window.unboundedPreceding, Window.currentRow)
    parsed = parse_values(raw, value_ddl)
    pe = F.greatest(F.lit(0).cast("long"),
                    epoch_of(F.max("timestamp").over(upto), origin_ms, epoch_ms))
    return parsed.withColumn("_pe", pe).filter(F.col("_pe") <= last_epoch)


def popularity_all(purchases: DataFrame, window: int, top_n: int, last_epoch: int,
                   conform) -> DataFrame:
    """``item_popularity`` of every epoch: each purchase row counts in the ``window``
    epochs from its own; ranks per (epoch, category) as the popularity job ranks."""
    spread = purchases.withColumn("epoch", F.explode(F.sequence(
        F.col("epoch"), F.least(F.col("epoch") + window - 1, F.lit(last_epoch).cast("long")))))
    totals = spread.groupBy("epoch", "category", "item_id").agg(
        F.sum("purchases").alias("purchases"),
        F.sum(F.round(F.col("revenue") * 100).cast("long")).alias("cents"))
    order = Window.partitionBy("epoch", "category").orderBy(F.col("cents").desc(),
                                                            F.col("item_id").asc())
    ranked = (totals.withColumn("rank", F.row_number().over(order))
              .filter(F.col("rank") <= top_n)
              .withColumn("revenue", F.col("cents") / F.lit(100.0)))
    return conform(ranked, "item_popularity")


def temporal_components(interactions: DataFrame, last_epoch: int, max_rounds: int = 200
                        ) -> tuple[DataFrame, int]:
    """Per node: ``(node_id, epoch, label)`` for every epoch from the node's first, where
    ``label`` is the smallest node of its connected component in the graph of all
    interactions up to that epoch (users ``2·id``, items ``2·id + 1``, as the
    communities job numbers them); and the rounds it took.

    A node's label only falls as the graph grows, so it is a step function: a few
    (from-epoch, label) steps. A step travels along an edge first seen in epoch t as
    (max(from, t), label); each round keeps, per node, the steps no other step beats
    (earlier and not larger). The fixed point holds every epoch's components at once.
    """
    user = (F.col("user_id") * 2).cast("long")
    item = (F.col("item_id") * 2 + 1).cast("long")
    pairs = interactions.groupBy(user.alias("u"), item.alias("i")).agg(
        F.min("epoch").alias("t"))
    edges = (pairs.select(F.col("u").alias("src"), F.col("i").alias("dst"), "t")
             .union(pairs.select(F.col("i").alias("src"), F.col("u").alias("dst"), "t"))
             .localCheckpoint())
    steps = (edges.groupBy(F.col("src").alias("node_id")).agg(F.min("t").alias("since"))
             .withColumn("label", F.col("node_id")).localCheckpoint())
    rounds = 0
    while True:
        rounds += 1
        if rounds > max_rounds:
            raise RuntimeError(f"temporal components: no fixed point in {max_rounds} rounds")
        sent = (steps.join(edges, steps.node_id == edges.src)
                .select(F.col("dst").alias("node_id"),
                        F.greatest("since", "t").alias("since"), "label"))
        best = (steps.unionByName(sent).groupBy("node_id", "since")
                .agg(F.min("label").alias("label")))
        earlier = Window.partitionBy("node_id").orderBy("since").rowsBetween(
            Window.unboundedPreceding, -1)
        kept = (best.withColumn("_before", F.min("label").over(earlier))
                .filter(F.col("_before").isNull() | (F.col("label") < F.col("_before")))
                .drop("_before").localCheckpoint())
        if kept.exceptAll(steps).isEmpty():
            break
        steps = kept
    nxt = Window.partitionBy("node_id").orderBy("since")
    per_epoch = (steps.withColumn("_until", F.coalesce(F.lead("since").over(nxt) - 1,
                                                       F.lit(last_epoch).cast("long")))
                 .withColumn("epoch", F.explode(F.sequence(F.col("since"), F.col("_until")))))
    return per_epoch.select("node_id", "epoch", "label"), rounds


def answer_all(queries: DataFrame, user_community: DataFrame, interactions: DataFrame,
               item_popularity: DataFrame, last_epoch: int, serve: ModuleType,
               conform) -> DataFrame:
    """``responses`` of every epoch: serve's :func:`answer` with the query's epoch as a
    key, each query answered from the snapshots of the epoch before its own."""
    communities = (user_community.withColumn("q", F.col("epoch") + 1)
                   .groupBy("q", "user_id").agg(F.min("label").alias("label")))
    popularity = item_popularity.withColumn("q", F.col("epoch") + 1)
    bought = (interactions.filter(F.col("purchased") & (F.col("epoch") < last_epoch))
              # (sequence(a, b) counts down when a > b: the filter keeps a ≤ b)
              .withColumn("q", F.explode(F.sequence(F.col("epoch") + 1,
                                                    F.lit(last_epoch).cast("long"))))
              .join(communities, ["q", "user_id"])
              .groupBy("q", "label", "category").agg(F.count(F.lit(1)).alias("n")))
    favourite = bought.groupBy("q", "label").agg(
        F.min(F.struct((-F.col("n")).alias("neg_n"), F.col("category"))).alias("best")
    ).select("q", "label", F.col("best.category").alias("category"))
    category_items = popularity.groupBy("q", "category").agg(serve._json_ids(
        F.sort_array(F.collect_list(F.struct("rank", "item_id")))).alias("cat_items"))
    overall = (popularity.groupBy("q", "item_id")
               .agg(F.max(F.round(F.col("revenue") * 100).cast("long")).alias("cents"))
               .groupBy("q").agg(serve._json_ids(F.sort_array(F.collect_list(
                   F.struct((-F.col("cents")).alias("neg"), "item_id")))).alias("overall_items")))
    out = (queries.select(F.col("epoch").alias("q"), "query_id", "user_id").distinct()
           .join(communities, ["q", "user_id"], "left")
           .join(favourite, ["q", "label"], "left")
           .join(category_items, ["q", "category"], "left")
           .join(overall, "q", "left")
           .withColumn("items", F.when(F.col("category").isNotNull(),
                                       F.coalesce("cat_items", F.lit("[]")))
                       .otherwise(F.coalesce("overall_items", F.lit("[]"))))
           .withColumn("epoch", F.col("q")))
    return conform(out, "responses")


def stats_all(responses: DataFrame, none: str, conform) -> DataFrame:
    """``query_stats`` of every epoch: answered per dimension value, and the running total."""
    answered = (responses.select("epoch", F.lit("community").alias("dimension"),
                                 F.coalesce(F.col("label").cast("string"),
                                            F.lit(none)).alias("value"))
                .unionByName(responses.select("epoch", F.lit("category").alias("dimension"),
                                              F.coalesce(F.col("category"),
                                                         F.lit(none)).alias("value")))
                .groupBy("epoch", "dimension", "value").agg(F.count(F.lit(1)).alias("answered")))
    upto = Window.partitionBy("dimension", "value").orderBy("epoch").rowsBetween(
        Window.unboundedPreceding, Window.currentRow)
    return conform(answered.withColumn("total", F.sum("answered").over(upto)), "query_stats")


def compute(spark: SparkSession, bootstrap: str, pipeline, jobs: dict[str, ModuleType],
            last_epoch: int) -> tuple[dict[str, DataFrame], dict[str, Any]]:
    """Every output table of the reference pipeline (table -> DataFrame, not yet
    computed) and facts about the computation (the components' rounds)."""
    from falkirk.job import conform

    ingest, serve = jobs["ingest"], jobs["serve"]
    s = pipeline.settings
    origin, epoch_ms = int(s["origin_ms"]), int(s["epoch_seconds"] * 1000)
    raw = read_topic(spark, bootstrap, "events", ingest.value_schema(), origin, epoch_ms,
                     last_epoch, ingest.event_epoch).persist()
    events, dead = ingest.validate_at(raw, F.col("_pe"), origin, epoch_ms)
    events = events.persist()
    purchases = ingest.purchases(events).persist()
    interactions = ingest.interactions(events).persist()
    popularity = popularity_all(purchases, int(pipeline.edges["purchases"].window),
                                int(pipeline.app["top_n"]), last_epoch, conform).persist()
    labels, rounds = temporal_components(interactions, last_epoch)
    user_community = conform(labels.filter(F.col("node_id") % 2 == 0)
                             .withColumn("user_id", F.shiftright(F.col("node_id"), 1)),
                             "user_community").persist()
    qraw = read_topic(spark, bootstrap, "queries", serve.value_schema(), origin, epoch_ms,
                      last_epoch, ingest.event_epoch).persist()
    queries, query_dead = serve.validate_queries_at(qraw, F.col("_pe"))
    responses = answer_all(queries, user_community, interactions, popularity, last_epoch,
                           serve, conform).persist()
    return ({"purchases": purchases, "interactions": interactions, "dead_letters": dead,
             "item_popularity": popularity, "user_community": user_community,
             "responses": responses, "query_stats": stats_all(responses, serve.NONE, conform),
             "query_dead_letters": query_dead}, {"component_rounds": rounds})


def run(spark: SparkSession, bootstrap: str, pipeline, lake: str, last_epoch: int
        ) -> dict[str, Any]:
    """Compute and write every output table as a Delta table under ``lake`` (overwrite,
    one commit each); facts about the run."""
    from falkirk.job import load_job

    jobs = {name: load_job(pipeline.job_path(f"jobs/{name}.py")) for name in ("ingest", "serve")}
    tables, facts = compute(spark, bootstrap, pipeline, jobs, last_epoch)
    for name, df in tables.items():
        df.write.format("delta").mode("overwrite").save(f"{lake}/{name}")
    spark.catalog.clearCache()
    return facts


def as_rows(lake: str, table: str) -> list[dict]:
    """A table's rows sorted, as the harness compares tables (read with delta-rs)."""
    import json

    from falkirk.io.lake import read_table

    rows = read_table(f"{lake}/{table}").to_pylist()
    return sorted(rows, key=lambda r: json.dumps(r, sort_keys=True, default=str))


def responses_by_key(lake: str) -> dict[str, dict]:
    """The plain job's responses as clients of the ``responses`` topic see them: the
    latest (largest epoch) per query id, as a dict."""
    out: dict[str, dict] = {}
    for r in sorted(as_rows(lake, "responses"), key=lambda r: r["epoch"]):
        out[r["query_id"]] = {k: v for k, v in r.items() if v is not None}  # as to_json
    return out

