"""Region ``communities``: connected components of the user-item interaction graph.

Users and items share one node id space so a component can hold both:
user ``u`` is node ``2u`` (even), item ``i`` is node ``2i + 1`` (odd). A community's label
is the smallest node id in its component (an item's odd id when that is smallest).

Label propagation iterates inside each epoch to a fixed point (the region's times are
``(epoch, iteration)``): every node takes the minimum label over itself and its
neighbours, then the label of the node its label names (pointer jumping). Edges only
ever grow, so starting from the previous epoch's labels is sound (a label is the minimum
of a component that is still inside the new one) and converges in a few rounds when
little changed. The result depends only on the graph, never on
partitioning or on the order rows arrive in.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from falkirk.job import EpochContext, EpochResult, JobLogic, conform, cut_lineage, main

log = logging.getLogger("falkirk.jobs.communities")

REGION = "communities"
DEFAULT_CHECKPOINT_EVERY = 3


def user_node(user_id: int) -> int:
    return 2 * user_id


def item_node(item_id: int) -> int:
    return 2 * item_id + 1


def edges(interactions_df: DataFrame) -> DataFrame:
    """The distinct (user_id, item_id) edges of an ``interactions`` table (all its epochs)."""
    return interactions_df.select("user_id", "item_id").distinct()


def transform(
    edges_df: DataFrame,
    labels_df: DataFrame,
    checkpoint_every: int = DEFAULT_CHECKPOINT_EVERY,
    on_iteration: Callable[[int, int], None] | None = None,
    seeds_df: DataFrame | None = None,
) -> tuple[DataFrame, int]:
    """Labels ``(node_id, label)`` of every node at the fixed point, and the rounds it took.

    ``edges_df``: every user-item edge so far (``user_id, item_id``; duplicates are fine).
    ``labels_df``: the previous labels ``(node_id, label)``, or empty; its nodes are kept
    even if no edge touches them. Each round only nodes whose label changed in the
    previous round send their label; the loop stops after the first round in which no
    label changed, and that round is counted (a converged warm start takes 1 round; no
    nodes at all takes 0). ``on_iteration(round, changed)`` is called after every round,
    e.g. to log ``(epoch, round)`` progress. Lineage is cut with ``cut_lineage``
    every ``checkpoint_every`` rounds (rounds in between are cached), so plans stay small.

    ``seeds_df`` (``node_id``): the workset, as Flink's delta iterations keep one: when
    ``labels_df`` is the fixed point of the graph without some new edges, the endpoints
    of those edges. Only they (and nodes without a previous label) send in the first
    round, so an epoch that adds a few edges does not relabel the whole graph; None:
    every node sends first.
    """
    if checkpoint_every < 1:
        raise ValueError(f"checkpoint_every must be ≥ 1, got {checkpoint_every}")
    user = (F.col("user_id") * 2).cast("long")
    item = (F.col("item_id") * 2 + 1).cast("long")
    pairs = edges_df.select(user.alias("u"), item.alias("i"))
    adjacency = cut_lineage(
        pairs.select(F.col("u").alias("src"), F.col("i").alias("dst"))
        .union(pairs.select(F.col("i").alias("src"), F.col("u").alias("dst")))
        .distinct()
    )
    previous = labels_df.select(F.col("node_id").cast("long"), F.col("label").cast("long"))
    nodes = adjacency.select(F.col("src").alias("node_id")).distinct()
    known = nodes.join(previous, "node_id", "full")
    first = F.lit(True)
    if seeds_df is not None:
        seeds = seeds_df.select(F.col("node_id").cast("long")).distinct()
        known = known.join(seeds.withColumn("_seed", F.lit(True)), "node_id", "left")
        first = F.col("_seed").isNotNull() | F.col("label").isNull()
    labels = cut_lineage(
        known.select(
            "node_id",
            F.least(F.col("node_id"), F.coalesce(F.col("label"), F.col("node_id"))).alias("label"),
            first.alias("changed"),
        )
    )
    if labels.isEmpty():
        return labels.select("node_id", "label"), 0

    rounds = 0
    # A round is one aggregation (the changed nodes' messages and every node's own label,
    # grouped by node) and the pointer jump, not a join, a grouping and a second join: on
    # small epochs the Spark stages, not the rows, are what a round costs.
    while True:
        rounds += 1
        current = labels.select("node_id", "label")
        messages = (
            labels.filter("changed")
            .select(F.col("node_id").alias("src"), F.col("label").alias("msg"))
            .join(adjacency, "src")
            .select(F.col("dst").alias("node_id"), F.col("msg").alias("label"),
                    F.lit(None).cast("long").alias("old"))
        )
        own = current.select("node_id", "label", F.col("label").alias("old"))
        proposed = (own.unionByName(messages).groupBy("node_id")
                    .agg(F.min("old").alias("old"), F.min("label").alias("label")))
        # Pointer jumping: a node's label names a node of its component; that node's label
        # is as good and often smaller, so long chains converge in ~log rounds, not ~length.
        hop = current.select(F.col("node_id").alias("label"), F.col("label").alias("jump"))
        jumped = F.least(F.col("label"), F.coalesce(F.col("jump"), F.col("label")))
        new = proposed.join(hop, "label", "left").select(
            "node_id", jumped.alias("label"), (jumped < F.col("old")).alias("changed"))
        checkpointed = rounds % checkpoint_every == 0
        new = cut_lineage(new) if checkpointed else new.persist()  # the former is eager
        changed = new.filter("changed").count()
        labels.unpersist()  # a no-op for a checkpointed one; its blocks go with the session
        labels = new
        if on_iteration is not None:
            on_iteration(rounds, changed)
        if changed == 0:
            result = labels.select("node_id", "label")
            if not checkpointed:  # hand back a short lineage, and free the cache
                result = cut_lineage(result)
                labels.unpersist()
            return result, rounds


def user_community(labels_df: DataFrame, epoch: int) -> DataFrame:
    """The ``user_community`` rows of ``epoch``: every user node with its label."""
    out = (
        labels_df.filter(F.col("node_id") % 2 == 0)
        .withColumn("user_id", F.shiftright(F.col("node_id"), 1))
        .withColumn("epoch", F.lit(epoch))
    )
    return conform(out, "user_community")


STATE_SCHEMA = pa.schema([("user_id", pa.int64()), ("item_id", pa.int64()),
                          ("node_id", pa.int64()), ("label", pa.int64())])


class CommunitiesJob(JobLogic):
    """Lazy checkpoint: the graph and the labels live in the job between checkpoints.

    The state is a keyed table for the incremental checkpoints: ``e:<user>:<item>`` rows
    hold the edges, ``n:<node>`` rows the labels, so a checkpoint writes only the new
    edges and the labels that changed since the previous one.
    """

    regions = (REGION,)

    def initial_state(self, region: str, spark) -> dict:
        empty_edges = spark.createDataFrame([], "user_id long, item_id long")
        empty_labels = spark.createDataFrame([], "node_id long, label long")
        return {"edges": empty_edges, "labels": empty_labels}

    def process(self, ctx: EpochContext) -> EpochResult:
        state = ctx.state[REGION]
        new = edges(ctx.inputs["interactions"].filter(F.col("epoch") == ctx.epoch))
        graph = cut_lineage(state["edges"].unionByName(new).distinct())
        seeds = new.select(F.col("user_id") * 2).union(new.select(F.col("item_id") * 2 + 1))
        labels, rounds = transform(
            graph, state["labels"], seeds_df=seeds.toDF("node_id"),
            on_iteration=lambda i, changed: log.info("epoch %d iteration %d: %d label(s) "
                                                     "changed", ctx.epoch, i, changed))
        log.info("epoch %d converged after %d iteration(s)", ctx.epoch, rounds)
        return EpochResult(outputs={"user_community": user_community(labels, ctx.epoch)},
                           state={REGION: {"edges": graph, "labels": labels}})

    def state_schema(self, region: str) -> pa.Schema:
        return STATE_SCHEMA

    def state_to_frame(self, region: str, state: dict) -> DataFrame:
        e = state["edges"].select(
            F.concat(F.lit("e:"), F.col("user_id").cast("string"), F.lit(":"),
                     F.col("item_id").cast("string")).alias("key"),
            "user_id", "item_id", F.lit(None).cast("long").alias("node_id"),
            F.lit(None).cast("long").alias("label"))
        n = state["labels"].select(
            F.concat(F.lit("n:"), F.col("node_id").cast("string")).alias("key"),
            F.lit(None).cast("long").alias("user_id"), F.lit(None).cast("long").alias("item_id"),
            "node_id", "label")
        return e.unionByName(n)

    def state_from_frame(self, region: str, df: DataFrame, spark) -> dict:
        return {
            "edges": cut_lineage(df.filter(F.col("key").startswith("e:"))
                                 .select("user_id", "item_id")),
            "labels": cut_lineage(df.filter(F.col("key").startswith("n:"))
                                  .select("node_id", "label")),
        }


if __name__ == "__main__":
    sys.exit(main(CommunitiesJob()))
