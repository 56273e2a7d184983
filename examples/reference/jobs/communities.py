"""Region ``communities``: connected components of the user-item interaction graph.

Users and items share one node id space so a component can hold both:
user ``u`` is node ``2u`` (even), item ``i`` is node ``2i + 1`` (odd). A community's label
is the smallest node id in its component (an item's odd id when that is smallest).

The labels iterate inside each epoch to a fixed point (the region's times are
``(epoch, iteration)``). Edges only ever grow, so starting from the previous epoch's
labels is sound: a label is the minimum of a component that is still inside the new one.
Two ways reach the same fixed point, and the result depends only on the graph, never on
partitioning or on the order rows arrive in:

- :func:`components`, for a graph that fits one task (up to ``ONE_TASK_MAX_EDGES``
  edges): the whole fixed point in one Spark task. On a small graph a round of label
  propagation costs its Spark stages, not its rows, and an epoch redone in a recovery
  paid ~100 of them (examples/reference/README.md,
  "Communities in one task").
- :func:`transform`, label propagation across the cluster for a larger graph: every node
  takes the minimum label over itself and its neighbours, then the label of the node its
  label names (pointer jumping), round after round.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable

import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from falkirk.job import (
    PASS_COLUMN,
    EpochContext,
    EpochResult,
    JobLogic,
    conform,
    cut_lineage,
    main,
)

log = logging.getLogger("falkirk.jobs.communities")

REGION = "communities"
DEFAULT_CHECKPOINT_EVERY = 3
#: The largest graph :func:`components` takes in one task: 5 M edges took 6 s and under
#: 0.3 GiB in one Python process (examples/reference/README.md); a larger one propagates
#: across the cluster.
ONE_TASK_MAX_EDGES = 5_000_000


def user_node(user_id: int | Column) -> int | Column:
    """User ``user_id``'s node id (an int, or a Column of them)."""
    return 2 * user_id


def item_node(item_id: int | Column) -> int | Column:
    """Item ``item_id``'s node id (an int, or a Column of them)."""
    return 2 * item_id + 1


def node_pairs(edges_df: DataFrame) -> DataFrame:
    """The ``(u, i)`` node ids of user-item edges ``(user_id, item_id)``."""
    return edges_df.select(user_node(F.col("user_id")).cast("long").alias("u"),
                           item_node(F.col("item_id")).cast("long").alias("i"))


def endpoints(edges_df: DataFrame) -> DataFrame:
    """The ``node_id`` of each end of user-item edges: label propagation's seeds."""
    pairs = node_pairs(edges_df)
    return pairs.select(F.col("u").alias("node_id")).union(
        pairs.select(F.col("i").alias("node_id")))


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
    pairs = node_pairs(edges_df)
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


def components(edges_df: DataFrame, labels_df: DataFrame) -> DataFrame:
    """Labels ``(node_id, label)`` at the fixed point :func:`transform` reaches, in one task.

    The edges and the previous labels (a node and its label are in one component, as
    edges only grow) are brought to one partition and handed to SciPy's connected
    components; a component's label is its smallest node id. One Spark stage whatever the
    graph's diameter, so the graph must fit one task (``ONE_TASK_MAX_EDGES``).
    """
    pairs = node_pairs(edges_df).unionByName(labels_df.select(
        F.col("node_id").cast("long").alias("u"), F.col("label").cast("long").alias("i")))

    def fixed_point(batches):  # nested, so Spark ships it by value, not by module name
        import numpy as np
        import pyarrow as pa
        from scipy.sparse import coo_matrix
        from scipy.sparse.csgraph import connected_components

        table = pa.Table.from_batches([b for b in batches if b.num_rows],
                                      schema=pa.schema([("u", pa.int64()), ("i", pa.int64())]))
        if table.num_rows == 0:
            return
        a, b = table.column("u").to_numpy(), table.column("i").to_numpy()
        nodes, index = np.unique(np.concatenate([a, b]), return_inverse=True)  # sorted ids
        m = len(a)
        graph = coo_matrix((np.ones(m, dtype=np.int8), (index[:m], index[m:])),
                           shape=(len(nodes), len(nodes)))
        _, component = connected_components(graph, directed=False)
        _, first = np.unique(component, return_index=True)  # each one's smallest node
        yield pa.RecordBatch.from_arrays([pa.array(nodes), pa.array(nodes[first][component])],
                                         names=["node_id", "label"])

    return pairs.coalesce(1).mapInArrow(fixed_point, "node_id long, label long")


def components_epochs(pairs_df: DataFrame, labels_df: DataFrame, epochs: list[int]
                      ) -> DataFrame:
    """:func:`components` after each of ``epochs`` (a pass), in one task: ``pairs_df``
    holds the new edges ``(e, user_id, item_id)`` of the pass, tagged with their epoch;
    ``labels_df`` the labels before it. Returns ``(e, node_id, label)``: every node's
    label at the fixed point of the graph through epoch e, for each e of ``epochs``
    (connected components of the growing graph, recomputed epoch by epoch in one Python
    worker: the labels each epoch would get alone)."""
    pairs = pairs_df.select(F.col("e").cast("long"),
                            user_node(F.col("user_id")).cast("long").alias("u"),
                            item_node(F.col("item_id")).cast("long").alias("i"))
    previous = labels_df.select(F.lit(-1).cast("long").alias("e"),
                                F.col("node_id").cast("long").alias("u"),
                                F.col("label").cast("long").alias("i"))
    wanted = sorted(epochs)

    def fixed_points(batches):  # nested, so Spark ships it by value, not by module name
        import numpy as np
        import pyarrow as pa
        from scipy.sparse import coo_matrix
        from scipy.sparse.csgraph import connected_components

        schema = pa.schema([("e", pa.int64()), ("u", pa.int64()), ("i", pa.int64())])
        table = pa.Table.from_batches([b for b in batches if b.num_rows], schema=schema)
        e, a, b = (table.column(n).to_numpy() for n in ("e", "u", "i"))
        for epoch in wanted:
            keep = e <= epoch
            ua, ub = a[keep], b[keep]
            if len(ua) == 0:
                continue
            nodes, index = np.unique(np.concatenate([ua, ub]), return_inverse=True)
            m = len(ua)
            graph = coo_matrix((np.ones(m, dtype=np.int8), (index[:m], index[m:])),
                               shape=(len(nodes), len(nodes)))
            _, component = connected_components(graph, directed=False)
            _, first = np.unique(component, return_index=True)  # each one's smallest node
            yield pa.RecordBatch.from_arrays(
                [pa.array(np.full(len(nodes), epoch, dtype=np.int64)), pa.array(nodes),
                 pa.array(nodes[first][component])], names=["e", "node_id", "label"])

    return (pairs.unionByName(previous).coalesce(1)
            .mapInArrow(fixed_points, "e long, node_id long, label long"))


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

    def __init__(self, one_task_max_edges: int = ONE_TASK_MAX_EDGES):
        super().__init__()
        self.one_task_max_edges = one_task_max_edges

    def initial_state(self, region: str, spark) -> dict:
        empty_edges = spark.createDataFrame([], "user_id long, item_id long")
        empty_labels = spark.createDataFrame([], "node_id long, label long")
        return {"edges": empty_edges, "labels": empty_labels}

    def process(self, ctx: EpochContext) -> EpochResult:
        state = ctx.state[REGION]
        new = edges(ctx.inputs["interactions"].filter(F.col("epoch") == ctx.epoch))
        graph = cut_lineage(state["edges"].unionByName(new).distinct())
        size = graph.count()
        if size <= self.one_task_max_edges:
            labels = cut_lineage(components(graph, state["labels"]))  # one task, run once
            log.info("epoch %d converged in one task (%d edge(s))", ctx.epoch, size)
        else:
            labels, rounds = transform(
                graph, state["labels"], seeds_df=endpoints(new),
                on_iteration=lambda i, changed: log.info(
                    "epoch %d iteration %d: %d label(s) changed", ctx.epoch, i, changed))
            log.info("epoch %d converged after %d iteration(s) (%d edge(s))", ctx.epoch,
                     rounds, size)
        return EpochResult(outputs={"user_community": user_community(labels, ctx.epoch)},
                           state={REGION: {"edges": graph, "labels": labels}})

    def process_pass(self, ctx: EpochContext) -> EpochResult:
        """Several epochs: the labels after each (in one task while the graph fits one,
        else by label propagation epoch by epoch), and the state as of each epoch whose
        checkpoint is due."""
        state = ctx.state[REGION]
        tagged = ctx.inputs["interactions"].select(
            F.col(PASS_COLUMN).alias("e"), "user_id", "item_id").distinct()
        graph = cut_lineage(state["edges"].unionByName(tagged.select("user_id", "item_id"))
                            .distinct())
        size = graph.count()
        if size <= self.one_task_max_edges:
            labels = cut_lineage(components_epochs(tagged, state["labels"], ctx.epochs))
            log.info("epochs %d-%d converged in one task (%d edge(s))", ctx.epoch, ctx.last,
                     size)
        else:
            per_epoch, edges, previous = [], state["edges"], state["labels"]
            for e in ctx.epochs:
                new = tagged.filter(F.col("e") == e).select("user_id", "item_id")
                edges = cut_lineage(edges.unionByName(new).distinct())
                previous, rounds = transform(edges, previous, seeds_df=endpoints(new))
                per_epoch.append(previous.withColumn("e", F.lit(e).cast("long")))
                log.info("epoch %d converged after %d iteration(s)", e, rounds)
            labels = per_epoch[0]
            for more in per_epoch[1:]:
                labels = labels.unionByName(more)
            labels = cut_lineage(labels)
        out = conform(
            labels.filter(F.col("node_id") % 2 == 0)
            .withColumn("user_id", F.shiftright(F.col("node_id"), 1))
            .withColumn("epoch", F.col("e")), "user_community")

        # each edge with the first epoch it came in (before the pass: -1), so the graph
        # as of any epoch of the pass is a filter, not a distinct of its own
        first_seen = cut_lineage(
            state["edges"].select(F.lit(-1).cast("long").alias("e"), "user_id", "item_id")
            .unionByName(tagged.select(F.col("e").cast("long"), "user_id", "item_id"))
            .groupBy("user_id", "item_id").agg(F.min("e").alias("e")))

        def as_of(e: int) -> dict:
            return {"edges": first_seen.filter(F.col("e") <= e).select("user_id", "item_id"),
                    "labels": labels.filter(F.col("e") == e).select("node_id", "label")}

        last = {"edges": graph,
                "labels": cut_lineage(labels.filter(F.col("e") == ctx.last)
                                      .select("node_id", "label"))}
        return EpochResult(outputs={"user_community": out}, state={REGION: last},
                           states={REGION: {e: as_of(e) for e in
                                            ctx.checkpoints.get(REGION, [])}})

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
