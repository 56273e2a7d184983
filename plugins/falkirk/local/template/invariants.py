"""Cross-region checks of this pipeline, run on every committed epoch beside the suites
(declared in pipeline.yaml as ``invariants: invariants.py``)."""

from __future__ import annotations

from pyspark.sql import functions as F

from falkirk.quality.invariants import SAMPLE, epoch_rows, output, read_input


def clicks_conserved(v, row, logs) -> tuple:
    """Records clean read in the epoch = clean clicks + dead letters it committed."""
    read = read_input(v, row, "clicks").count()
    table, version = output(row, "clean_clicks")
    clean = epoch_rows(v, table, version, row.epoch).count()
    dead_table, dead_version = output(row, "dead_letters")
    dead = epoch_rows(v, dead_table, dead_version, row.epoch).count()
    observed = {"read": read, "clean": clean, "dead_lettered": dead}
    return table, read == clean + dead, observed, [], version


def totals_add_up(v, row, logs) -> tuple:
    """Each user's total = the sum of the user's clicks through the epoch."""
    table, version = output(row, "user_totals")
    rows = epoch_rows(v, table, version, row.epoch, through=True)
    summed = rows.groupBy("user").agg(F.sum("clicks").alias("summed"))
    now = rows.filter(F.col("epoch") == row.epoch).join(summed, "user")
    bad = now.filter(F.col("total") != F.col("summed")).limit(SAMPLE).collect()
    return table, not bad, {"mismatches": len(bad)}, [r.asDict() for r in bad], version


INVARIANTS = {"clean": [clicks_conserved], "user_totals": [totals_add_up]}
