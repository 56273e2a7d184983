"""Cross-region invariants of the reference pipeline (declared in its YAML as
``invariants: invariants.py``; see ``falkirk.quality.invariants``)."""

from __future__ import annotations

from falkirk.job import load_job
from falkirk.quality.invariants import (
    SAMPLE,
    CheckError,
    epoch_rows,
    epoch_settings,
    output,
    read_input,
)


def _job(v, name: str):
    return load_job(v.pipeline.job_path(f"jobs/{name}.py"))


def events_conserved(v, row, logs) -> tuple:
    """Records ingest read = valid events + dead letters committed for the epoch."""
    ingest = _job(v, "ingest")
    raw = read_input(v, row, "events").cache()
    read = raw.count()
    valid = ingest.validate(raw, row.epoch, *epoch_settings(v))[0].count()
    table, version = output(row, "dead_letters")
    dead = epoch_rows(v, table, version, row.epoch).filter("source = 'events'").count()
    raw.unpersist()
    observed = {"read": read, "valid": valid, "dead_lettered": dead}
    return table, read == valid + dead, observed, [], version


def purchases_conserved(v, row, logs) -> tuple:
    """Purchases committed for the epoch = valid purchase events of the epoch."""
    from pyspark.sql import functions as F

    ingest = _job(v, "ingest")
    events = ingest.validate(read_input(v, row, "events"), row.epoch, *epoch_settings(v))[0]
    expected = events.filter(F.col("kind") == "purchase").count()
    table, version = output(row, "purchases")
    got = epoch_rows(v, table, version, row.epoch).agg(F.sum("purchases")).first()[0] or 0
    return table, expected == got, {"purchase_events": expected, "purchases": got}, [], version


def queries_answered_once(v, row, logs) -> tuple:
    """Every valid query of the epoch counted once per dimension in query_stats."""
    from pyspark.sql import functions as F

    serve_row = next((r for r in logs["serve"].entries.values() if r.epoch == row.epoch), None)
    if serve_row is None:
        raise CheckError(f"stats epoch {row.epoch}: serve has no row for that epoch")
    serve = _job(v, "serve")
    queries = serve.validate_queries(read_input(v, serve_row, "queries"), row.epoch)[0]
    expected = queries.select("query_id", "user_id").distinct().count()
    table, version = output(row, "query_stats")
    counts = {r["dimension"]: r["n"] for r in epoch_rows(v, table, version, row.epoch)
              .groupBy("dimension").agg(F.sum("answered").alias("n")).collect()}
    bad = {d: n for d, n in counts.items() if n != expected}
    ok = not bad and (expected == 0 or set(counts) == {"community", "category"})
    return table, ok, {"queries": expected, "answered": counts}, [], version


def running_totals(v, row, logs) -> tuple:
    """Each total in query_stats = the sum of its per-epoch counts through the epoch."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    table, version = output(row, "query_stats")
    df = epoch_rows(v, table, version, row.epoch, through=True)
    w = Window.partitionBy("dimension", "value").orderBy("epoch")
    bad = (df.withColumn("summed", F.sum("answered").over(w))
           .filter((F.col("epoch") == row.epoch) & (F.col("summed") != F.col("total")))
           .select("dimension", "value", "answered", "total", "summed").limit(SAMPLE)
           .collect())
    return table, not bad, {"mismatches": len(bad)}, [r.asDict() for r in bad], version


def labels_cover_users(v, row, logs) -> tuple:
    """Every user seen in interactions through the epoch has a label <= its node id."""
    from pyspark.sql import functions as F

    ingest_row = next((r for r in logs["ingest"].entries.values() if r.epoch == row.epoch),
                      None)
    if ingest_row is None:
        raise CheckError(f"communities epoch {row.epoch}: ingest has no row for that epoch")
    itable, iversion = output(ingest_row, "interactions")
    users = epoch_rows(v, itable, iversion, row.epoch, through=True).select("user_id").distinct()
    table, version = output(row, "user_community")
    labels = epoch_rows(v, table, version, row.epoch)
    bad = (users.join(labels, "user_id", "left")
           .filter(F.col("label").isNull() | (F.col("label") > F.col("user_id") * 2))
           .select("user_id", "label").limit(SAMPLE).collect())
    n = users.count()
    return table, not bad, {"users": n, "bad": len(bad)}, [r.asDict() for r in bad], version


INVARIANTS = {
    "ingest": [events_conserved, purchases_conserved],
    "communities": [labels_cover_users],
    "stats": [queries_answered_once, running_totals],
}
