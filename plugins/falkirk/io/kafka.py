"""Kafka edges through Spark's own Kafka connector (spark-sql-kafka-0-10).

* :func:`read_range` reads exactly one epoch's offset range of a topic (the range the epoch
  log records, ``endingOffsets`` exclusive) with ``spark.read.format("kafka")``;
* :func:`parse_values` turns the connector's binary records into the columns every job
  reads: ``topic, partition, offset, key, timestamp`` (epoch ms), ``value`` and, with a
  record schema, its typed fields plus ``error``. It runs in Spark (``from_json``; no
  Python on the data path). ``error`` is null when Spark's JSON reader reads the value as
  an object of the record schema, else it names the problem (found through a VARIANT,
  for those records only) and the typed fields are all null: malformed records are
  dead-lettered by the jobs, never a crashed job. A missing (or JSON null) field is just
  null, not an error: whether it is required is the job's business. Numbers are strict (a
  JSON string is no long or double, a fraction no long, a long out of range is an error);
  a string field takes any scalar as its text, as Spark's JSON reader does (``3`` is
  ``"3"``).
* :func:`produce` writes a DataFrame of ``key``/``value`` strings to a topic with the
  connector (``acks=all``, idempotent producer): a send that fails fails the write, so the
  epoch fails before its input is acknowledged.
* :func:`commit_group_offsets` acknowledges input (garbage collection) with kafka-python.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from falkirk.errors import FalkirkError
from falkirk.model.times import Offsets

_log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType

#: The JSON types (as ``schema_of_variant`` names them) each declared type accepts.
_INTEGERS = ("TINYINT", "SMALLINT", "INT", "BIGINT")
_NUMBERS = (*_INTEGERS, "DOUBLE", "FLOAT", "DECIMAL")
_ACCEPTS = {
    # Spark's JSON reader gives a string field any value's JSON text: so do we.
    "string": ("STRING", "BOOLEAN", "ARRAY", "OBJECT", *_NUMBERS),
    "bigint": _INTEGERS,
    "int": _INTEGERS,
    "smallint": _INTEGERS,
    "tinyint": _INTEGERS,
    "double": _NUMBERS,
    "float": _NUMBERS,
    "boolean": ("BOOLEAN",),
}
_NAMES = {"bigint": "long", "int": "int", "smallint": "short", "tinyint": "byte",
          "double": "double", "float": "float", "string": "string", "boolean": "boolean"}


class KafkaIOError(FalkirkError, ValueError):
    """A record schema or an offset range the connector cannot read as asked."""


def value_schema(value_ddl: str) -> StructType:
    """The struct of a record schema's DDL (``"event_id string, user_id long, ..."``),
    flat and of the types the parser knows (parsed by Spark: needs an active session)."""
    from pyspark.sql.types import StructType

    try:
        schema = StructType.fromDDL(value_ddl)
    except Exception as exc:
        raise KafkaIOError(f"record schema {value_ddl!r} does not parse: {exc}") from None
    for f in schema.fields:
        if f.dataType.simpleString() not in _ACCEPTS:
            raise KafkaIOError(f"record schema field {f.name!r} has type "
                               f"{f.dataType.simpleString()}; supported: "
                               f"{', '.join(sorted(set(_NAMES.values())))}")
        if f.name in ("topic", "partition", "offset", "key", "timestamp", "value", "error"):
            raise KafkaIOError(f"record schema field {f.name!r} clashes with a source column")
    return schema


def source_schema(value_ddl: str | None) -> StructType:
    """The columns :func:`parse_values` (and so :func:`read_range`) returns."""
    from pyspark.sql.types import StructType

    schema = StructType.fromDDL("topic string, partition int, offset long, key string, "
                                "timestamp long, value string")
    if value_ddl is not None:
        for f in value_schema(value_ddl).fields:
            schema = schema.add(f.name, f.dataType, True)
        schema = schema.add("error", "string", True)
    return schema


def parse_values(raw: DataFrame, value_ddl: str | None) -> DataFrame:
    """The connector's rows (binary ``key``/``value``, ``timestamp``) as jobs read them."""
    from pyspark.sql import functions as F

    # Bytes that are not UTF-8 become U+FFFD: a string column every reader can decode
    # (a Connect client's Arrow, delta-rs, GX's pandas), where the raw bytes made each of
    # them fail on the dead letters that keep them.
    value = F.make_valid_utf8(F.col("value").cast("string"))
    base = [F.col("topic"), F.col("partition").cast("int").alias("partition"),
            F.col("offset").cast("long").alias("offset"),
            F.make_valid_utf8(F.col("key").cast("string")).alias("key"),
            F.unix_millis(F.col("timestamp")).alias("timestamp"), value.alias("value")]
    if value_ddl is None:
        return raw.select(*base)
    schema = value_schema(value_ddl)
    # Spark's JSON reader types every value (fast); only the records it cannot read (a
    # rare few) are looked at again, through a VARIANT, to say exactly what is wrong.
    from pyspark.sql.types import StringType, StructField, StructType

    with_corrupt = StructType([*schema.fields, StructField("_corrupt", StringType(), True)])
    parsed = raw.select(*base, F.from_json(value, with_corrupt, {
        "mode": "PERMISSIVE", "columnNameOfCorruptRecord": "_corrupt",
        "allowNonNumericNumbers": "false"}).alias("_j"))
    error = (
        F.when(F.col("value").isNull(), F.lit("value is null (a tombstone), not a JSON object"))
        .when(F.col("_j").isNull() | F.col("_j._corrupt").isNotNull(),
              F.coalesce(_reason(F.col("value"), schema),
                         F.lit("value does not fit the record schema")))
    )
    return parsed.withColumn("error", error).select(
        *[F.col(c) for c in ("topic", "partition", "offset", "key", "timestamp", "value")],
        *[F.when(F.col("error").isNull(), F.col(f"_j.{f.name}")).alias(f.name)
          for f in schema.fields],
        "error",
    )


def _reason(value: Column, schema: StructType) -> Column:
    """Why a value that Spark's JSON reader refused does not fit ``schema`` (null when no
    reason is found): evaluated only for those values. Kept small: it is compiled into
    the same generated code as the job's own transforms."""
    from pyspark.sql import functions as F

    v = F.try_parse_json(value)
    problems: list[Column] = []
    for f in schema.fields:
        sub = F.variant_get(v, f"$.{f.name}", "variant")
        kind = _kind(sub)
        declared = f.dataType.simpleString()
        fits = sub.isNull() | kind.isin("VOID", *_ACCEPTS[declared])  # VOID: JSON null
        problems.append(F.when(~fits, F.concat(
            F.lit(f"field '{f.name}' is not a {_NAMES[declared]} (got "), _json_kind(kind),
            F.lit(" "), F.substring(F.to_json(sub), 1, 40), F.lit(")"))))
    top = _kind(v)
    return (
        F.when(v.isNull(), F.lit("value is not JSON"))
        .when(top != "OBJECT", F.concat(
            F.lit("value is a JSON "), _json_kind(top), F.lit(", not an object")))
        .otherwise(F.nullif(F.concat_ws("; ", *problems), F.lit("")))
    )


def _kind(variant: Column) -> Column:
    """The type of a variant without its parameters: OBJECT, ARRAY, STRING, BIGINT, ..."""
    from pyspark.sql import functions as F

    return F.regexp_extract(F.schema_of_variant(variant), r"^([A-Z]+)", 1)


def _json_kind(variant_type: Column) -> Column:
    """A variant type name (BIGINT, DECIMAL, ...) as the JSON kind a user wrote (number)."""
    from pyspark.sql import functions as F

    return (F.when(variant_type.isin(*_NUMBERS), F.lit("number"))
            .when(variant_type == "VOID", F.lit("null")).otherwise(F.lower(variant_type)))


#: Input topics keep every record until garbage collection says otherwise, whatever its
#: (event) timestamp (replayed input may be far in the past or the future).
TOPIC_CONFIGS = {
    "retention.ms": "-1",
    "message.timestamp.after.max.ms": str(2**63 - 1),
}


#: Every kafka-python client of falkirk reconnects to a restarted broker within a second.
#: kafka-python backs off up to 30 s between attempts (the Java client: 1 s); in the fault
#: campaign a job's cut then waited up to 30 s more after its broker was back.
CLIENT_CONFIG: dict[str, Any] = {"reconnect_backoff_max_ms": 1000}

#: One question to the broker (a cut, an offset look-up) gives up after this long, and
#: :func:`broker_retry` asks again on a fresh attempt. kafka-python's default is its
#: request timeout, 30 s, which a question asked while the broker restarts waited out.
QUESTION_TIMEOUT_MS = 5000


def ensure_topics(bootstrap: str, topics: dict[str, int], outputs: bool = False) -> None:
    """Create the topics that do not exist with their declared partitions (with
    :data:`TOPIC_CONFIGS`, and the profile's ``topic_replication``: 3 replicas on a
    cluster), instead of leaving them to a broker's auto-creation (one partition).

    An existing input topic with another partition count is an error: records are placed
    in partitions (and so in epochs' offset ranges) by the count they were produced with.
    For ``outputs`` (topics a job sends to) it is only logged: a consumer reads every
    partition, and a topic made before the declaration changed keeps its records.
    """
    from kafka import KafkaAdminClient
    from kafka.errors import TopicAlreadyExistsError

    from falkirk.config import load

    replicas = load().topic_replication
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="falkirk-topics",
                             **CLIENT_CONFIG)
    try:
        for name, partitions in topics.items():
            try:
                admin.create_topics(
                    {name: {"num_partitions": partitions, "replication_factor": replicas,
                            "configs": TOPIC_CONFIGS}},  # fmt: skip
                    wait_for_metadata=True,
                )
            except TopicAlreadyExistsError:
                [described] = admin.describe_topics([name])
                if len(described["partitions"]) != partitions:
                    message = (f"topic {name!r} exists with {len(described['partitions'])} "
                               f"partitions, not {partitions}")
                    if not outputs:
                        raise KafkaIOError(message) from None
                    _log.warning("%s (declared); its records keep their partitions", message)
    finally:
        admin.close()


def end_offsets(bootstrap: str, topic: str) -> dict[str, int]:
    """Per partition of ``topic``: the offset after its last record (where a bounded
    input that is all produced ends; see ``EpochLog.record_bound``)."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                             enable_auto_commit=False, client_id="falkirk-bound",
                             **CLIENT_CONFIG)
    try:
        parts = consumer.partitions_for_topic(topic)
        if not parts:
            raise KafkaIOError(f"topic {topic!r} does not exist on {bootstrap}")
        ends = consumer.end_offsets([TopicPartition(topic, p) for p in sorted(parts)],
                                   timeout_ms=QUESTION_TIMEOUT_MS)
        return {str(tp.partition): offset for tp, offset in ends.items()}
    finally:
        consumer.close()


#: Options of every batch read of an offset range. ``failOnDataLoss``: a range the epoch log
#: recorded must still be there. ``kafka.fetch.max.wait.ms``: with the consumer's default
#: (500 ms) an epoch's read of a few hundred records took ~1 s more (``falkirk bench
#: kafka``, docs/jobs.md "What an epoch cost"); a range's records are all there before it
#: is read, so a short wait costs nothing but quicker empty fetches.
# maxRecordsPerPartition: a big range (a catch-up pass: 1.5 million events in 3
# partitions) is read in tasks of at most this many records, not one task per Kafka
# partition: the engine's scheduler shares cores between jobs task by task, and three
# tasks of a minute each held both cores from the other jobs (a pass of serve's waited
# 230 s). An epoch at 5,000 events/s (~17,000 records a partition) is read in tasks of
# ~0.4 s, not ~1.5 s: the answering job's small stages, which take the next free core,
# wait no longer than that for one (the engine's stage timings, docs/engine.md).
READ_OPTIONS = {"failOnDataLoss": "true", "kafka.fetch.max.wait.ms": "10",
                "maxRecordsPerPartition": "5000"}


def read_range(spark: SparkSession, bootstrap: str, topic: str, start: Offsets, end: Offsets,
               value_ddl: str | None, options: dict[str, str] | None = None) -> DataFrame:
    """Exactly the records ``[start, end)`` of ``topic`` (per partition), parsed.

    Partitions where the range is empty are not assigned at all; an empty range reads no
    broker and yields an empty DataFrame of the same columns. ``options``: the reader's
    options instead of :data:`READ_OPTIONS` (the Kafka benchmark compares the two).
    """
    parts = sorted((p for p in end.as_dict() if end.get(p) > start.get(p)), key=int)
    for p in end.as_dict():
        if end.get(p) < start.get(p):
            raise KafkaIOError(f"topic {topic!r} partition {p}: range ends at {end.get(p)} "
                               f"before it starts ({start.get(p)})")
    reader = (spark.read.format("kafka").option("kafka.bootstrap.servers", bootstrap)
              .options(**(READ_OPTIONS if options is None else options)))
    if not parts:
        return parse_values(_empty_source(spark), value_ddl)
    raw = (reader.option("assign", json.dumps({topic: [int(p) for p in parts]}))
           .option("startingOffsets", json.dumps({topic: {p: start.get(p) for p in parts}}))
           .option("endingOffsets", json.dumps({topic: {p: end.get(p) for p in parts}}))
           .load())
    return parse_values(raw, value_ddl)


def _empty_source(spark: SparkSession) -> DataFrame:
    """No records, with the connector's columns."""
    return spark.createDataFrame(
        [], "key binary, value binary, topic string, partition int, offset long, "
            "timestamp timestamp, timestampType int")


#: The headers every output record carries (docs/outputs.md): which run of which epoch sent it.
GENERATION_HEADER, EPOCH_HEADER, REGION_HEADER = ("falkirk-generation", "falkirk-epoch",
                                                  "falkirk-region")


def produce(df: DataFrame, bootstrap: str, topic: str,
            headers: dict[str, Any] | None = None,
            by: tuple[str, list[int]] | None = None) -> dict[int, int]:
    """Send a DataFrame of ``key`` and ``value`` strings to a topic; how many were sent.

    Written from the executors by the connector, acks=all with the idempotent producer;
    a failed send fails the write. ``headers`` (name -> a string or a Column) go on every
    record (the runtime sends the generation, epoch and region). The count: in all under
    key ``-1``, or with ``by=(column, values)`` per value of that column (a pass of several
    epochs; the column itself is not sent). (An ``Observation`` of the write would save
    the count's job, but Spark Connect 4.2 reports none for a Kafka write: measured.)
    At-least-once across a rerun: an epoch redone after a
    rollback sends its records again with the new generation (docs/outputs.md: consumers
    keep the latest answer per key and epoch).
    """
    from pyspark.sql import functions as F

    extra = [] if by is None else [by[0]]
    if [c for c in df.columns if c not in extra] != ["key", "value"]:
        raise KafkaIOError(f"output for topic {topic!r} must have columns key, value; "
                           f"got {df.columns}")
    if headers:
        df = df.withColumn("headers", F.array(*(
            F.struct(F.lit(k).alias("key"),
                     (v if not isinstance(v, str) else F.lit(v)).cast("binary").alias("value"))
            for k, v in headers.items())))
    # Sent, then counted from the cache the send filled: computed once, and the count's
    # Spark job is off the path of the records (an answer is read the moment it is sent;
    # its count only goes to the epoch log).
    df = df.persist()
    try:
        sent = df if by is None else df.drop(by[0])
        (sent.write.format("kafka").option("kafka.bootstrap.servers", bootstrap)
         .option("topic", topic).option("kafka.acks", "all")
         .option("kafka.enable.idempotence", "true").save())
        if by is None:
            counts = {-1: df.count()}
        else:
            column, values = by
            found = {int(r[0]): int(r[1])
                     for r in df.groupBy(column).count().collect()}
            counts = {v: found.get(v, 0) for v in values}
    finally:
        df.unpersist()
    return counts


def broker_retry(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Ride out a broker that is restarting or still electing a coordinator (up to ~2 min):
    only for questions and commits that are safe to repeat; a broker gone for longer fails
    the caller."""
    from kafka.errors import RetriableError
    from tenacity import (
        retry,
        retry_if_exception_type,
        stop_after_delay,
        wait_exponential,
    )

    return retry(
        retry=retry_if_exception_type(RetriableError),  # timeouts, lost connections, ...
        wait=wait_exponential(multiplier=0.2, max=5), stop=stop_after_delay(120),
        reraise=True,
        before_sleep=lambda state: _log.warning("broker not answering (%s); asking again",
                                               state.outcome.exception()),
    )(fn)


def commit_group_offsets(bootstrap: str, topic: str, group: str, offsets: Offsets) -> None:
    """Commit consumer group ``group``'s positions on ``topic`` (garbage collection's ack).

    Partitions absent from ``offsets`` (position 0) are left alone. The group must have
    no active members, as for any offset reset.
    """
    from kafka import KafkaAdminClient, TopicPartition
    from kafka.errors import NoError, RetriableError
    from kafka.structs import OffsetAndMetadata

    wanted = {TopicPartition(topic, int(p)): OffsetAndMetadata(o, "", -1) for p, o in offsets.items}
    if not wanted:
        return
    @broker_retry
    def commit() -> None:  # the same positions again: safe to repeat
        admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="falkirk-gc",
                                 **CLIENT_CONFIG)
        try:
            result = admin.alter_group_offsets(group, wanted)
        finally:
            admin.close()
        for err in result.values():
            if err is not NoError and issubclass(err, RetriableError):
                raise err()
        failed = {tp.partition: err.__name__ for tp, err in result.items() if err is not NoError}
        if failed:
            raise KafkaIOError(
                f"committing group {group!r} offsets on {topic!r} failed for partitions {failed}"
            )

    commit()


def delete_records(bootstrap: str, topic: str, offsets: Offsets) -> None:
    """Drop ``topic``'s records below ``offsets`` (per partition; Kafka's DeleteRecords):
    the log start moves up, as Kafka Streams purges a repartition topic its tasks have
    committed past. Partitions absent from ``offsets`` are left alone; deleting below a
    log start already past is a no-op, so a repeat is safe."""
    from kafka import KafkaAdminClient, TopicPartition

    wanted = {TopicPartition(topic, int(p)): o for p, o in offsets.items if o > 0}
    if not wanted:
        return

    @broker_retry
    def delete() -> None:
        admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="falkirk-gc",
                                 **CLIENT_CONFIG)
        try:
            admin.delete_records(wanted, timeout_ms=QUESTION_TIMEOUT_MS)
        finally:
            admin.close()

    delete()
