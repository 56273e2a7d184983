"""The reference pipeline's pure Spark transforms on small hand-made data.

Every expected output is written out by hand from the rules in the job docstrings,
never computed by the code under test.
"""

from __future__ import annotations

import pytest
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

from falkirk.config import REPO_ROOT
from falkirk.io.kafka import source_schema
from falkirk.job import arrow_schema, load_job

JOBS = REPO_ROOT / "examples" / "reference" / "jobs"  # loading one resolves its schemas

ingest = load_job(JOBS / "ingest.py")
popularity = load_job(JOBS / "popularity.py")
communities = load_job(JOBS / "communities.py")
serve = load_job(JOBS / "serve.py")

ORIGIN = 1_000_000  # origin_ms
E = 1_000  # epoch_ms: epoch k is [ORIGIN + k*E, ORIGIN + (k+1)*E)


def table_schema(name: str):
    return from_arrow_schema(arrow_schema("tables", name, (JOBS.parent / "schemas",)))


def rows(df, *order: str) -> list[tuple]:
    return [tuple(r) for r in df.orderBy(*(order or df.columns)).collect()]


def schema_of(df) -> list[tuple[str, str]]:
    return [(f.name, f.dataType.simpleString()) for f in df.schema.fields]


def expected_schema(name: str) -> list[tuple[str, str]]:
    return [(f.name, f.dataType.simpleString()) for f in table_schema(name).fields]


# --- ingest -------------------------------------------------------------------------------

EVENTS_COLUMNS = ["event_id", "user_id", "item_id", "category", "kind", "amount", "ts", "epoch"]


def source_row(offset, event_id="e", user=1, item=2, category="c2", kind="view", amount=0.0,
               ts=ORIGIN + 2_000, error=None, key=None, partition=0):  # fmt: skip
    """A row as kafka_io.read_range returns it; raw value = f"raw{offset}"."""
    if error is not None:
        event_id = user = item = category = kind = amount = ts = None
    key = str(user) if key is None else key
    return ("events", partition, offset, key, 0 if ts is None else ts, f"raw{offset}",
            event_id, user, item, category, kind, amount, ts, error)  # fmt: skip


def test_validate_reports_each_reason_and_keeps_valid_events(spark):
    not_json = "value is not JSON: Expecting value: line 1 column 1 (char 0)"
    raw = spark.createDataFrame(
        [
            source_row(0, "a", ts=ORIGIN + 2_000),  # first ms of epoch 2: valid
            source_row(1, "b", kind="purchase", amount=9.99, ts=ORIGIN + 2_999),  # last ms: valid
            source_row(2, error=not_json),
            source_row(3, user=None, key="7"),
            source_row(4, ts=None),
            source_row(5, kind="refund"),
            source_row(6, kind="purchase", amount=-5.0),
            source_row(7, kind="click", amount=2.5),
            source_row(8, ts=ORIGIN + 500),  # epoch 0
            source_row(9, ts=ORIGIN + 1_999),  # last ms of epoch 1
            source_row(10, ts=ORIGIN + 3_000),  # epoch 3: after the epoch being processed
            source_row(11, ts=ORIGIN - 1),  # before the origin: epoch -1
            source_row(12, kind="purchase", amount=float("nan")),
            source_row(13, kind="refund", amount=-1.0),  # only the first failure is told
            source_row(15, kind=None, partition=2),
        ],
        source_schema(ingest.value_schema()),
    )
    events, dead = ingest.validate(raw, 2, ORIGIN, E)
    assert schema_of(events) == list(
        zip(EVENTS_COLUMNS, ["string", "bigint", "bigint", "string", "string", "double",
                             "bigint", "bigint"], strict=True)  # fmt: skip
    )
    assert schema_of(dead) == expected_schema("dead_letters")
    assert rows(events, "event_id") == [
        ("a", 1, 2, "c2", "view", 0.0, ORIGIN + 2_000, 2),
        ("b", 1, 2, "c2", "purchase", 9.99, ORIGIN + 2_999, 2),
    ]
    assert rows(dead, "partition", "offset") == [
        (2, "events", 0, 2, "raw2", not_json),
        (2, "events", 0, 3, "raw3", "missing field user_id"),
        (2, "events", 0, 4, "raw4", "missing field ts"),
        (2, "events", 0, 5, "raw5", "unknown kind 'refund'"),
        (2, "events", 0, 6, "raw6", "negative amount -5.0"),
        (2, "events", 0, 7, "raw7", "non-zero amount 2.5 on a click"),
        (2, "events", 0, 8, "raw8", "late: event epoch 0 < epoch 2"),
        (2, "events", 0, 9, "raw9", "late: event epoch 1 < epoch 2"),
        (2, "events", 0, 10, "raw10", "early: event epoch 3 > epoch 2"),
        (2, "events", 0, 11, "raw11", "late: event epoch -1 < epoch 2"),
        (2, "events", 0, 12, "raw12", "non-finite amount NaN"),
        (2, "events", 0, 13, "raw13", "unknown kind 'refund'"),
        (2, "events", 2, 15, "raw15", "missing field kind"),
    ]
    kinds = dict(
        dead.groupBy(ingest.reason_kind(F.col("reason")).alias("k")).count().collect()
    )
    assert kinds == {"source": 1, "missing field": 3, "unknown kind": 2, "negative amount": 1,
                     "non-zero amount": 1, "late": 3, "early": 1,
                     "non-finite amount": 1}  # fmt: skip


def test_validate_an_empty_epoch(spark):
    empty = spark.createDataFrame([], source_schema(ingest.value_schema()))
    events, dead = ingest.validate(empty, 0, ORIGIN, E)
    assert events.columns == EVENTS_COLUMNS and events.count() == 0
    assert schema_of(dead) == expected_schema("dead_letters") and dead.count() == 0


def events_df(spark, data: list[tuple]):
    schema = ", ".join(
        f"{n} {t}"
        for n, t in zip(EVENTS_COLUMNS, ["string", "long", "long", "string", "string",
                                         "double", "long", "long"], strict=True)  # fmt: skip
    )
    return spark.createDataFrame(
        [(f"e{i}", *row[:-1], ORIGIN + row[-1] * E, row[-1]) for i, row in enumerate(data)], schema
    )


def test_purchases_and_interactions(spark):
    # (user, item, category, kind, amount, epoch)
    ev = events_df(
        spark,
        [
            (1, 10, "c0", "purchase", 10.10, 1),
            (2, 10, "c0", "purchase", 0.20, 1),
            (1, 10, "c0", "click", 0.0, 1),
            (1, 11, "c1", "view", 0.0, 1),  # a view is no interaction
            (3, 11, "c1", "click", 0.0, 1),
            (3, 11, "c1", "click", 0.0, 1),
            (3, 12, "c2", "purchase", 0.1, 1),
            (3, 12, "c2", "purchase", 0.2, 1),  # 0.1 + 0.2 is 0.30000000000000004 in doubles
            (1, 10, "c0", "purchase", 1.0, 2),
        ],
    )
    p = ingest.purchases(ev)
    assert schema_of(p) == expected_schema("purchases")
    assert rows(p) == [
        (1, "c0", 10, 2, 10.3),
        (1, "c2", 12, 2, 0.3),
        (2, "c0", 10, 1, 1.0),
    ]
    i = ingest.interactions(ev)
    assert schema_of(i) == expected_schema("interactions")
    assert rows(i) == [
        (1, 1, 10, "c0", True),
        (1, 2, 10, "c0", True),
        (1, 3, 11, "c1", False),
        (1, 3, 12, "c2", True),
        (2, 1, 10, "c0", True),
    ]
    empty = events_df(spark, [])
    assert ingest.purchases(empty).count() == 0 and ingest.interactions(empty).count() == 0


def test_revenue_does_not_depend_on_partitioning(spark):
    # 0.01 + 0.02 + ... + 3.00 = 300 * 301 / 2 cents = 451.50 exactly, however Spark splits it
    ev = events_df(spark, [(k % 7, 5, "c1", "purchase", k / 100, 0) for k in range(1, 301)])
    expected = [(0, "c1", 5, 300, 451.5)]
    assert rows(ingest.purchases(ev.repartition(7))) == expected
    assert rows(ingest.purchases(ev.coalesce(1))) == expected


# --- popularity ---------------------------------------------------------------------------


def purchases_df(spark, data: list[tuple]):
    return spark.createDataFrame(data, table_schema("purchases"))


def test_popularity_window_ranks_ties_and_top_n(spark):
    # (epoch, category, item_id, purchases, revenue)
    df = purchases_df(
        spark,
        [
            (1, "c0", 1, 1, 50.0),  # before the window (2..4 for epoch 4, window 3)
            (2, "c0", 2, 1, 10.0),
            (2, "c0", 3, 2, 10.0),
            (2, "c1", 7, 1, 3.0),
            (3, "c0", 4, 1, 4.0),
            (3, "c0", 2, 1, 2.5),
            (4, "c0", 5, 1, 12.5),  # ties item 2 (10.0 + 2.5): the smaller id ranks first
            (4, "c1", 8, 1, 3.0),
            (4, "c1", 6, 1, 3.0),
            (5, "c0", 1, 9, 99.0),  # after the epoch
        ],
    )
    out = popularity.transform(df, 4, 3, 2)
    assert schema_of(out) == expected_schema("item_popularity")
    assert rows(out, "category", "rank") == [
        (4, "c0", 2, 12.5, 2, 1),
        (4, "c0", 5, 12.5, 1, 2),
        (4, "c1", 6, 3.0, 1, 1),
        (4, "c1", 7, 3.0, 1, 2),
    ]
    assert rows(popularity.transform(df, 1, 1, 5)) == [(1, "c0", 1, 50.0, 1, 1)]
    assert popularity.transform(df, 9, 3, 2).count() == 0  # an epoch with no purchases
    assert popularity.transform(purchases_df(spark, []), 4, 3, 2).count() == 0
    with pytest.raises(ValueError):
        popularity.transform(df, 4, 0, 2)


# --- communities --------------------------------------------------------------------------

EDGES = "user_id long, item_id long"
LABELS = "node_id long, label long"


def test_label_propagation_two_components_then_a_merge(spark):
    assert (communities.user_node(5), communities.item_node(3)) == (10, 7)
    # component A: users 0, 1 and item 0 (nodes 0, 2, 1); B: users 5, 6 and item 3 (10, 12, 7)
    edges = spark.createDataFrame([(0, 0), (1, 0), (5, 3), (6, 3), (6, 3)], EDGES)
    progress: list[tuple[int, int]] = []
    labels, rounds = communities.transform(
        edges, spark.createDataFrame([], LABELS), on_iteration=lambda i, n: progress.append((i, n))
    )
    assert rows(labels) == [(0, 0), (1, 0), (2, 0), (7, 7), (10, 7), (12, 7)]
    # round 1: 1 takes 0, 2 takes 1, 10 and 12 take 7; round 2: 2 takes 0; round 3: quiet
    assert progress == [(1, 4), (2, 1), (3, 0)] and rounds == 3
    uc = communities.user_community(labels, 0)
    assert schema_of(uc) == expected_schema("user_community")
    assert rows(uc) == [(0, 0, 0, 0), (0, 1, 2, 0), (0, 5, 10, 7), (0, 6, 12, 7)]

    # user 1 buys item 3: the components merge under label 0; warm start from the labels,
    # plus an isolated node (user 20) known only from the previous labels, which stays
    merged_edges = edges.union(spark.createDataFrame([(1, 3)], EDGES))
    previous = labels.union(spark.createDataFrame([(40, 40)], LABELS))
    progress.clear()
    labels2, rounds2 = communities.transform(
        merged_edges, previous, checkpoint_every=2,
        on_iteration=lambda i, n: progress.append((i, n)),
    )  # fmt: skip
    assert rows(labels2) == [(0, 0), (1, 0), (2, 0), (7, 0), (10, 0), (12, 0), (40, 40)]
    # round 1: 7 takes 0 from 2; round 2: 10 and 12 take 0; round 3: quiet
    assert progress == [(1, 1), (2, 2), (3, 0)] and rounds2 == 3
    assert rows(communities.user_community(labels2, 1)) == [
        (1, 0, 0, 0), (1, 1, 2, 0), (1, 5, 10, 0), (1, 6, 12, 0), (1, 20, 40, 40),
    ]  # fmt: skip

    # nothing new: one round confirms the fixed point
    labels3, rounds3 = communities.transform(merged_edges, labels2, checkpoint_every=1)
    assert rows(labels3) == rows(labels2) and rounds3 == 1

    # the same merge from a workset: only the new edge's endpoints (user 1 = node 2, item
    # 3 = node 7) send first; nodes 0, 1, 10 and 12 only receive, the labels are the same
    progress.clear()
    seeded, rounds4 = communities.transform(
        merged_edges, previous, seeds_df=spark.createDataFrame([(2,), (7,)], "node_id long"),
        on_iteration=lambda i, n: progress.append((i, n)))
    assert rows(seeded) == rows(labels2) and progress == [(1, 1), (2, 2), (3, 0)]
    # an empty workset over a fixed point: nothing sends, one quiet round
    quiet, rounds5 = communities.transform(
        merged_edges, labels2, seeds_df=spark.createDataFrame([], "node_id long"))
    assert rows(quiet) == rows(labels2) and rounds5 == 1


def test_label_propagation_jumps_along_a_chain(spark):
    """A chain user 0 - item 0 - user 1 - item 1 - ... (nodes 0, 1, 2, ... 40): plain
    propagation moves label 0 one node per round (41 rounds); pointer jumping takes a
    node's label's label too, so the whole chain gets label 0 in far fewer rounds."""
    chain = [(u, u) for u in range(20)] + [(u + 1, u) for u in range(20)]
    progress: list[tuple[int, int]] = []
    labels, rounds = communities.transform(
        spark.createDataFrame(chain, EDGES), spark.createDataFrame([], LABELS),
        on_iteration=lambda i, n: progress.append((i, n)))
    assert rows(labels) == [(n, 0) for n in range(41)]
    assert rounds == len(progress) and progress[-1] == (rounds, 0)
    assert rounds <= 12, progress


def test_label_propagation_on_nothing(spark):
    labels, rounds = communities.transform(
        spark.createDataFrame([], EDGES), spark.createDataFrame([], LABELS)
    )
    assert labels.count() == 0 and rounds == 0
    assert communities.user_community(labels, 3).count() == 0


def test_components_in_one_task_reach_label_propagations_fixed_point(spark):
    """The one-task path gives exactly the labels of label propagation: two components,
    then a merge warm-started from the labels with an isolated node known only from them,
    a chain, nothing, and random graphs of a few hundred edges."""
    import random

    empty = spark.createDataFrame([], LABELS)
    edges = spark.createDataFrame([(0, 0), (1, 0), (5, 3), (6, 3), (6, 3)], EDGES)
    labels = communities.components(edges, empty)
    assert rows(labels) == [(0, 0), (1, 0), (2, 0), (7, 7), (10, 7), (12, 7)]
    merged = edges.union(spark.createDataFrame([(1, 3)], EDGES))
    previous = labels.union(spark.createDataFrame([(40, 40)], LABELS))
    assert rows(communities.components(merged, previous)) == [
        (0, 0), (1, 0), (2, 0), (7, 0), (10, 0), (12, 0), (40, 40)]
    chain = spark.createDataFrame([(u, u) for u in range(20)] + [(u + 1, u) for u in range(20)],
                                  EDGES)
    assert rows(communities.components(chain, empty)) == [(n, 0) for n in range(41)]
    assert communities.components(spark.createDataFrame([], EDGES), empty).count() == 0
    draw = random.Random(15)
    for size in (50, 300):
        graph = spark.createDataFrame(
            [(draw.randrange(size // 2), draw.randrange(size // 3)) for _ in range(size)], EDGES)
        more = graph.union(spark.createDataFrame(
            [(draw.randrange(size), draw.randrange(size)) for _ in range(size // 5)], EDGES))
        propagated, _ = communities.transform(graph, empty)
        one_task = communities.components(graph, empty)
        assert rows(one_task) == rows(propagated)
        # the next epoch, warm from the previous labels, with the new edges' endpoints as seeds
        assert rows(communities.components(more, one_task)) == rows(communities.transform(
            more, propagated, seeds_df=communities.endpoints(more))[0])


def test_the_job_propagates_labels_across_the_cluster_above_its_one_task_bound(spark, caplog):
    """A graph within ``one_task_max_edges`` converges in one task; a larger one (here the
    bound set to 1 edge) by label propagation; the labels are the same."""
    import logging

    from falkirk.job import EpochContext

    inter = spark.createDataFrame([(0, 1, 0, "c0", False), (0, 2, 0, "c0", True),
                                   (0, 3, 1, "c0", False)], table_schema("interactions"))
    found = []
    for bound in (communities.ONE_TASK_MAX_EDGES, 1):
        job = communities.CommunitiesJob(one_task_max_edges=bound)
        state = {communities.REGION: job.initial_state(communities.REGION, spark)}
        ctx = EpochContext(epoch=0, generation=1, spark=spark, pipeline=None,
                           inputs={"interactions": inter}, state=state,
                           active={communities.REGION})
        with caplog.at_level(logging.INFO, logger="falkirk.jobs.communities"):
            caplog.clear()
            result = job.process(ctx)
        found.append((rows(result.outputs["user_community"]), caplog.messages[-1]))
    # users 1 and 2 share item 0 (node 1), user 3 has item 1 (node 3)
    assert found[0][0] == found[1][0] == [(0, 1, 2, 1), (0, 2, 4, 1), (0, 3, 6, 3)]
    assert found[0][1] == "epoch 0 converged in one task (3 edge(s))"
    assert found[1][1].startswith("epoch 0 converged after ") and "iteration(s)" in found[1][1]


def test_edges_are_the_distinct_pairs_of_all_epochs(spark):
    inter = spark.createDataFrame(
        [(0, 1, 2, "c2", False), (1, 1, 2, "c2", True), (1, 3, 2, "c2", True)],
        table_schema("interactions"),
    )
    assert rows(communities.edges(inter)) == [(1, 2), (3, 2)]


# --- serve --------------------------------------------------------------------------------

QUERIES = "query_id string, user_id long, ts long, epoch long"


@pytest.fixture(scope="module")
def state(spark):
    """Side inputs as of epoch 2 (queries of epoch 3), with stale and future rows mixed in."""
    uc = spark.createDataFrame(
        [
            (1, 1, 2, 2),  # stale snapshot: user 1 was in community 2
            (1, 9, 18, 9),  # user 9 only in the stale snapshot: unknown now
            (2, 1, 2, 0),
            (2, 2, 4, 0),
            (2, 3, 6, 0),  # clicked only
            (2, 5, 10, 7),
            (2, 6, 12, 7),
            (2, 7, 14, 7),  # no interaction rows at all
            (2, 8, 16, 15),  # a community that bought nothing
            (3, 5, 10, 1),  # the future: ignored
        ],
        table_schema("user_community"),
    )
    inter = spark.createDataFrame(
        [
            (1, 1, 10, "c0", True),
            (2, 1, 11, "c1", True),
            (2, 2, 11, "c1", True),
            (1, 2, 10, "c0", False),
            (2, 3, 12, "c2", False),
            (1, 5, 20, "c2", True),  # community 7: c2 and c3 tie, c2 is smaller
            (2, 6, 21, "c3", True),
            (3, 6, 21, "c3", True),  # the future: would make c3 win
            (2, 8, 13, "c3", False),
        ],
        table_schema("interactions"),
    )
    pop = spark.createDataFrame(
        [
            (1, "c2", 22, 99.0, 1, 1),  # stale snapshot
            (2, "c1", 11, 30.0, 3, 1),
            (2, "c1", 15, 20.0, 2, 2),
            (2, "c1", 17, 20.0, 1, 3),
            (2, "c1", 19, 5.0, 1, 4),
            (2, "c2", 20, 50.0, 1, 1),
            (2, "c0", 10, 40.0, 2, 1),
            (2, "c3", 21, 30.0, 1, 1),  # ties item 11 overall: 11 goes first
            (3, "c0", 30, 500.0, 5, 1),  # the future
        ],
        table_schema("item_popularity"),
    )
    return uc, inter, pop


def test_answer_from_the_previous_epoch(spark, state):
    uc, inter, pop = state
    queries = spark.createDataFrame(
        [
            ("q1", 1, ORIGIN + 3_000, 3),
            ("q1", 1, ORIGIN + 3_000, 3),  # delivered twice: answered once
            ("q2", 3, ORIGIN + 3_001, 3),
            ("q3", 5, ORIGIN + 3_002, 3),
            ("q4", 8, ORIGIN + 3_003, 3),
            ("q5", 99, ORIGIN + 3_004, 3),
            ("q6", 9, ORIGIN + 3_005, 3),
            ("q7", 7, ORIGIN + 3_006, 3),
        ],
        QUERIES,
    )
    out = serve.answer(queries, uc, inter, pop, 3)
    assert schema_of(out) == expected_schema("responses")
    overall = "[20,10,11]"
    assert rows(out, "query_id") == [
        (3, "q1", 1, 0, "c1", "[11,15,17]"),
        (3, "q2", 3, 0, "c1", "[11,15,17]"),
        (3, "q3", 5, 7, "c2", "[20]"),
        (3, "q4", 8, 15, None, overall),
        (3, "q5", 99, None, None, overall),
        (3, "q6", 9, None, None, overall),
        (3, "q7", 7, 7, "c2", "[20]"),
    ]


def test_an_epoch_committed_empty_is_the_snapshot_not_an_older_one(spark, state):
    """Sparse input: popularity committed epoch 3 with no rows (nothing bought in its
    window). Queries of epoch 4 get no items, not epoch 2's: the state as of e - 1."""
    uc, inter, pop = state
    uc3 = uc.filter("epoch = 2").withColumn("epoch", F.lit(3).cast("long"))
    queries = spark.createDataFrame([("q1", 1, ORIGIN + 4_000, 4),
                                     ("q5", 99, ORIGIN + 4_001, 4)], QUERIES)
    out = serve.answer(queries, uc.unionByName(uc3), inter, pop.filter("epoch < 3"), 4)
    assert rows(out, "query_id") == [(4, "q1", 1, 0, "c1", "[]"),  # c1 ranks nothing now
                                     (4, "q5", 99, None, None, "[]")]
    # And with no user_community rows at epoch 3 either, nobody is in a community.
    out = serve.answer(queries, uc, inter, pop, 4)
    assert [r[3] for r in rows(out, "query_id")] == [None, None]


def test_answer_an_empty_epoch_and_an_empty_state(spark, state):
    uc, inter, pop = state
    no_queries = spark.createDataFrame([], QUERIES)
    assert serve.answer(no_queries, uc, inter, pop, 3).count() == 0
    queries = spark.createDataFrame([("q1", 1, ORIGIN, 0)], QUERIES)
    # epoch 0: nothing before it, so no community, no category, no items
    assert rows(serve.answer(queries, uc, inter, pop, 0)) == [(0, "q1", 1, None, None, "[]")]


def test_validate_queries(spark):
    schema = source_schema(serve.value_schema())
    raw = spark.createDataFrame(
        [
            ("queries", 0, 0, "1", ORIGIN, "r0", "q1", 1, ORIGIN, None),
            ("queries", 0, 1, "x", ORIGIN, "r1", None, None, None, "value is not JSON: oops"),
            ("queries", 0, 2, "1", ORIGIN, "r2", "q3", None, ORIGIN, None),
        ],
        schema,
    )
    queries, dead = serve.validate_queries(raw, 4)
    assert rows(queries) == [("q1", 1, ORIGIN, 4)]
    assert rows(dead) == [
        (4, "queries", 0, 1, "r1", "value is not JSON: oops"),
        (4, "queries", 0, 2, "r2", "missing field user_id"),
    ]


RESPONSES = table_schema("responses")
TOTALS = "dimension string, value string, total long"


def test_stats_running_totals_over_two_epochs(spark):
    e3 = spark.createDataFrame(
        [
            (3, "q1", 1, 0, "c1", "[]"),
            (3, "q2", 3, 0, "c1", "[]"),
            (3, "q3", 5, 7, "c2", "[]"),
            (3, "q5", 99, None, None, "[]"),
        ],
        RESPONSES,
    )
    stats3, totals3 = serve.stats(e3, spark.createDataFrame([], TOTALS), 3)
    assert schema_of(stats3) == expected_schema("query_stats")
    assert rows(stats3) == [
        (3, "category", "c1", 2, 2),
        (3, "category", "c2", 1, 1),
        (3, "category", "none", 1, 1),
        (3, "community", "0", 2, 2),
        (3, "community", "7", 1, 1),
        (3, "community", "none", 1, 1),
    ]
    e4 = spark.createDataFrame(
        [(4, "qa", 1, 0, "c0", "[]"), (4, "qb", 99, None, None, "[]")], RESPONSES
    )
    stats4, totals4 = serve.stats(e4, totals3, 4)
    assert rows(stats4) == [  # values with nothing answered in epoch 4 have no row
        (4, "category", "c0", 1, 1),
        (4, "category", "none", 1, 2),
        (4, "community", "0", 1, 3),
        (4, "community", "none", 1, 2),
    ]
    assert rows(totals4) == [
        ("category", "c0", 1),
        ("category", "c1", 2),
        ("category", "c2", 1),
        ("category", "none", 2),
        ("community", "0", 3),
        ("community", "7", 1),
        ("community", "none", 2),
    ]
    # the query_stats rows themselves as previous totals: same answer; rows of epoch 4 or
    # later (say, left over from before a rollback) are ignored
    leftover = spark.createDataFrame([(4, "community", "0", 9, 99)], table_schema("query_stats"))
    again, _ = serve.stats(e4, stats3.union(leftover), 4)
    assert rows(again) == rows(stats4)
    # an epoch without queries: no rows, totals carried
    quiet, totals5 = serve.stats(spark.createDataFrame([], RESPONSES), totals4, 5)
    assert quiet.count() == 0 and rows(totals5) == rows(totals4)


def test_job_modules_import_without_the_runtime():
    for job in (ingest, popularity, communities, serve):
        assert callable(job.main)
    assert [j.REGION for j in (ingest, popularity, communities, serve)] == [
        "ingest", "popularity", "communities", "serve",
    ]  # fmt: skip
