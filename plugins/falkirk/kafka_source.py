"""A Spark 4 Python streaming source over kafka-python (``format("falkirk_kafka")``).

Spark's own Kafka connector is a jar we cannot download here, so this source reads a
topic of a Kafka-compatible broker with kafka-python. It is built for replay:

- Offsets are per-partition positions (the next offset to read), as JSON with string
  keys in partition order, so equal offsets serialise equally and Spark's offset log
  can be compared and parsed into :class:`falkirk.times.Offsets`. A partition missing
  from an offset is at 0, as in ``Offsets`` (whose vectors drop zero entries).
- The reader keeps no cursor: every batch is ``[start, end)`` from Spark's own offset
  log, so a query restarted after a crash re-reads exactly the batch it had planned.
- ``commit()`` acknowledges nothing to the broker: input is acknowledged only by
  garbage collection (:func:`commit_group_offsets`) once no rollback can need it.

Options: ``bootstrap`` and ``topic`` (required); ``maxRecordsPerBatch`` (default
100000; the read limit, shared fairly by the partitions); ``startingOffsets``
(``earliest`` (default), ``latest``, or JSON ``{"0": 120, "1": 98}``, unlisted
partitions at 0); ``minPartitions`` (split the batch into about this many tasks; default:
one per Kafka partition); ``valueSchema`` (a DDL string such as ``"event_id string, user_id
long, amount double"``) to parse each value as a JSON object into typed columns.

Output: ``topic, partition, offset, key, timestamp`` (ms), ``value``, and with
``valueSchema`` its fields plus ``error``. ``error`` is null when the value is a JSON
object whose present fields have the declared types, else it names the problem and the
typed fields are all null: malformed records are kept, never dropped. A declared field
that is missing (or JSON null) is just null, not an error: whether it is required is
the consumer's business. Keys, and values without ``valueSchema``, that are not UTF-8
are decoded with replacement characters.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    BooleanType,
    ByteType,
    DataType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructField,
    StructType,
)

from falkirk.times import Offsets

NAME = "falkirk_kafka"
DEFAULT_MAX_RECORDS = 100_000
ARROW_BATCH_ROWS = 20_000  # rows per RecordBatch yielded by read()
READ_STALL_TIMEOUT_S = 120.0  # read() fails after this long without progress

BASE_FIELDS = [
    StructField("topic", StringType(), False),
    StructField("partition", IntegerType(), False),
    StructField("offset", LongType(), False),
    StructField("key", StringType(), True),
    StructField("timestamp", LongType(), True),  # None for pre-0.10 message formats
    StructField("value", StringType(), True),
]

# DDL type name -> (Spark type, name in messages, exact Python type of a valid JSON value,
# integer range or None)
_TYPES: dict[str, tuple[DataType, str, type, tuple[int, int] | None]] = {
    "string": (StringType(), "string", str, None),
    "long": (LongType(), "long", int, (-(2**63), 2**63 - 1)),
    "int": (IntegerType(), "int", int, (-(2**31), 2**31 - 1)),
    "short": (ShortType(), "short", int, (-(2**15), 2**15 - 1)),
    "byte": (ByteType(), "byte", int, (-128, 127)),
    "double": (DoubleType(), "double", float, None),
    "float": (FloatType(), "float", float, None),
    "boolean": (BooleanType(), "boolean", bool, None),
}
_ALIASES = {
    "bigint": "long", "integer": "int", "smallint": "short",
    "tinyint": "byte", "real": "float", "bool": "boolean",
}  # fmt: skip
_FIELD_RE = re.compile(r"^\s*`?([A-Za-z_][A-Za-z0-9_]*)`?\s*:?\s+(\S.*?)\s*$")


class KafkaSourceError(ValueError):
    """Bad options, or a topic the source cannot read as asked."""


def parse_value_schema(ddl: str) -> StructType:
    """Parse ``"name type, ..."`` for flat JSON objects (no JVM in the planner process)."""
    fields: list[StructField] = []
    reserved = {f.name for f in BASE_FIELDS} | {"error"}
    for part in re.split(r",(?![^<(]*[>)])", ddl):  # commas outside <...> and (...)
        m = _FIELD_RE.match(part)
        if not m:
            raise KafkaSourceError(
                f"valueSchema: cannot parse {part.strip()!r}; expected 'name type' with a "
                f"type among {', '.join(_TYPES)}"
            )
        name, type_name = m.group(1), m.group(2).lower()
        type_name = _ALIASES.get(type_name, type_name)
        if type_name not in _TYPES:
            raise KafkaSourceError(
                f"valueSchema: field {name!r} has type {m.group(2)!r}; supported: "
                f"{', '.join(_TYPES)}"
            )
        if name in reserved or any(f.name == name for f in fields):
            raise KafkaSourceError(
                f"valueSchema: field {name!r} clashes with another column "
                f"({', '.join(sorted(reserved))} are taken)"
            )
        fields.append(StructField(name, _TYPES[type_name][0], True))
    return StructType(fields)


def source_schema(value_schema: StructType | None) -> StructType:
    fields = list(BASE_FIELDS)
    if value_schema is not None:
        fields += [*value_schema.fields, StructField("error", StringType(), True)]
    return StructType(fields)


def dump_offsets(positions: Mapping[int | str, int]) -> dict[str, int]:
    """The source's offset form: string partition keys in numeric order."""
    return {str(p): int(positions[p]) for p in sorted(positions, key=int)}


def offsets_from_json(value: str | Mapping[str, int] | None) -> Offsets:
    """A source offset (as Spark logs or reports it) as an ``Offsets`` frontier."""
    if value is None:
        return Offsets()
    if isinstance(value, str):
        value = json.loads(value)
    return Offsets(value or {})


def batch_offsets(
    progress: Mapping[str, Any], initial: Offsets | None = None, source: int = 0
) -> tuple[int, Offsets, Offsets]:
    """``(batchId, start, end)`` of one micro-batch, from a streaming query progress.

    Spark reports a null start for a query's first batch: that is the source's initial
    offset, which only the caller knows (``initial``; bottom for ``earliest`` on a topic
    whose records all still exist).
    """
    src = progress["sources"][source]
    start, end = (_json_or_none(src.get(k)) for k in ("startOffset", "endOffset"))
    return (
        int(progress["batchId"]),
        (initial or Offsets()) if start is None else Offsets(start),
        offsets_from_json(end),
    )


def _json_or_none(value: str | Mapping | None) -> Mapping | None:
    """Progress objects hold offsets as JSON text; a first batch's start is "null"."""
    return json.loads(value) if isinstance(value, str) else value


def share_limit(available: Mapping[str, int], limit: int) -> dict[str, int]:
    """Split ``limit`` records fairly over partitions, never beyond what each has.

    Water-filling: the partitions with least available are served first and what they
    leave goes to the others; deterministic, and at least one record when any is there.
    """
    take = {p: 0 for p in available}
    waiting = sorted((n, int(p)) for p, n in available.items() if n > 0)
    remaining = max(limit, 1)
    for i, (n, p) in enumerate(waiting):
        share = min(n, max(remaining // (len(waiting) - i), 1 if remaining else 0))
        take[str(p)] = share
        remaining -= share
    return take


def split_ranges(
    ranges: Sequence[tuple[int, int, int]], min_partitions: int = 0
) -> list[tuple[int, int, int]]:
    """Non-empty ``(partition, start, end)`` ranges, split into about ``min_partitions`` tasks.

    As Spark's Kafka ``minPartitions``: one task per Kafka partition by default; with
    more wanted, each range is cut into pieces in proportion to its size (largest
    remainder), for clusters with more cores than the topic has partitions. On local[2]
    with 3 partitions, 4 tasks were no faster than 3 (the JVM uses the idle core).
    """
    ranges = [(p, s, e) for p, s, e in ranges if e > s]
    total = sum(e - s for _, s, e in ranges)
    if min_partitions <= len(ranges) or total == 0:
        return ranges
    # largest remainder: whole shares first (at least 1), then the biggest fractions
    shares = [(e - s) * min_partitions / total for _, s, e in ranges]
    parts = [max(1, int(x)) for x in shares]
    by_fraction = sorted(range(len(ranges)), key=lambda i: (parts[i] - shares[i], i))
    for i in by_fraction[: max(0, min_partitions - sum(parts))]:
        parts[i] += 1
    pieces = []
    for (p, s, e), k in zip(ranges, parts, strict=True):
        k = min(k, e - s)
        cuts = [s + (e - s) * i // k for i in range(k + 1)]
        pieces += [(p, a, b) for a, b in zip(cuts, cuts[1:], strict=False)]
    return pieces


def _json_type(x: Any) -> str:
    if isinstance(x, bool):
        return "boolean"
    if isinstance(x, int):
        return "integer"
    if isinstance(x, float):
        return "number"
    if isinstance(x, str):
        return "string"
    if isinstance(x, list):
        return "array"
    if isinstance(x, dict):
        return "object"
    return type(x).__name__


def _describe_value(v: Any) -> str:
    text = json.dumps(v)
    return text if len(text) <= 40 else text[:37] + "..."


class _ValueParser:
    """Parses JSON values into typed columns plus an error column (runs on executors).

    Two paths that agree: :meth:`parse_one` is the plain, general one, and gives the
    error messages; the fast path is compiled per schema (like namedtuple) and takes
    only values that ``parse_one`` would accept unchanged: a JSON object parsed by the
    C scanner whose present fields have exactly the declared Python types and ranges.
    Everything else falls through to ``parse_one``. It roughly halves the parse cost,
    which is most of what the source adds to kafka-python's own decoding.
    """

    def __init__(self, schema: StructType):
        self.names = schema.fieldNames()
        specs = []
        for f in schema.fields:
            _, kind, exact, bounds = next(t for t in _TYPES.values() if t[0] == f.dataType)
            specs.append((f.name, kind, exact, bounds))
        self.specs = specs
        self._fast = self._compile()

    def parse_one(self, v: bytes | None) -> tuple[list, str | None]:
        """Typed values (all None on error) and the problem, or None."""
        nulls = [None] * len(self.specs)
        if v is None:
            return nulls, "value is null (a tombstone), not a JSON object"
        try:
            obj = json.loads(v)
        except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError
            return nulls, f"value is not JSON: {e}"
        if type(obj) is not dict:
            return nulls, f"value is a JSON {_json_type(obj)}, not an object"
        row = []
        problems = []
        for name, kind, exact, bounds in self.specs:
            x = obj.get(name)
            if x is None or (type(x) is exact and (bounds is None or bounds[0] <= x <= bounds[1])):
                row.append(x)
            elif exact is float and type(x) is int:
                row.append(float(x))
            elif exact is int and type(x) is int:
                problems.append(f"field {name!r} is out of the {kind} range ({x})")
            else:
                problems.append(
                    f"field {name!r} is not a {kind} (got {_json_type(x)} {_describe_value(x)})"
                )
        if problems:
            return nulls, "; ".join(problems)
        return row, None

    def _compile(self):
        n = len(self.specs)
        xs = ", ".join(f"x{i}" for i in range(n))
        gets = "; ".join(f"x{i} = get({name!r})" for i, (name, *_rest) in enumerate(self.specs))
        checks = []
        for i, (_, _, exact, bounds) in enumerate(self.specs):
            test = f"type(x{i}) is {exact.__name__}"
            if bounds is not None:
                test += f" and {bounds[0]} <= x{i} <= {bounds[1]}"
            checks.append(f"(x{i} is None or ({test}))")
        appends = "; ".join(f"a{i}(x{i})" for i in range(n))
        source = f"""
def fast(values, scan, slow, add_error, {", ".join(f"a{i}" for i in range(n))}):
    for v in values:
        if v is not None:
            try:
                text = v.decode()
                obj, end = scan(text, 0)
            except Exception:  # not UTF-8, not JSON (StopIteration), ...: parse_one says why
                obj = end = None
            if end is not None and end == len(text) and type(obj) is dict:
                get = obj.get
                {gets}
                if {" and ".join(checks)}:
                    {appends}; add_error(None)
                    continue
        slow(v)
"""
        namespace: dict[str, Any] = {}
        exec(compile(source, f"<falkirk value parser {xs}>", "exec"), namespace)
        return namespace["fast"]

    def parse(self, values: Sequence[bytes | None]) -> tuple[list[list], list[str | None]]:
        columns: list[list] = [[] for _ in self.specs]
        appends = [c.append for c in columns]
        errors: list[str | None] = []
        add_error = errors.append

        def slow(v: bytes | None) -> None:
            row, problem = self.parse_one(v)
            for append, x in zip(appends, row, strict=True):
                append(x)
            add_error(problem)

        self._fast(values, json.JSONDecoder().scan_once, slow, add_error, *appends)
        return columns, errors


@dataclass
class KafkaPartition(InputPartition):
    """One Kafka partition's records ``[start, end)`` of one micro-batch."""

    partition: int
    start: int
    end: int


def _consumer(bootstrap: str, **config: Any):
    from kafka import KafkaConsumer

    return KafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        allow_auto_create_topics=False,
        client_id="falkirk-source",
        **config,
    )


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans batches from the broker's end offsets; reads each partition range on executors."""

    def __init__(self, options: Mapping[str, str], schema: StructType):
        self.bootstrap = options["bootstrap"]
        self.topic = options["topic"]
        self.max_records = int(options.get("maxRecordsPerBatch", DEFAULT_MAX_RECORDS))
        if self.max_records < 1:
            raise KafkaSourceError(f"maxRecordsPerBatch must be ≥ 1, got {self.max_records}")
        self.starting = options.get("startingOffsets", "earliest")
        self.min_partitions = int(options.get("minPartitions", 0))
        ddl = options.get("valueSchema")
        self.value_schema = parse_value_schema(ddl) if ddl else None
        self.schema = schema
        self._metadata = None  # driver-side consumer, made on first use, never pickled
        self._target: dict[str, int] | None = None  # availableNow: where this run stops

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_metadata"] = None
        return state

    # --- planning (driver side) -------------------------------------------------------

    def _client(self):
        if self._metadata is None:
            # Metadata refreshed every 30 s, so partitions added to the topic are picked up.
            self._metadata = _consumer(
                self.bootstrap, metadata_max_age_ms=30_000, request_timeout_ms=30_000
            )
        return self._metadata

    def _partitions(self) -> list[int]:
        parts = self._client().partitions_for_topic(self.topic)  # asks the broker if unknown
        if not parts:
            raise KafkaSourceError(f"topic {self.topic!r} does not exist on {self.bootstrap}")
        return sorted(parts)

    def _end_offsets(self) -> dict[str, int]:
        from kafka import TopicPartition

        tps = [TopicPartition(self.topic, p) for p in self._partitions()]
        ends = self._client().end_offsets(tps)
        return dump_offsets({tp.partition: o for tp, o in ends.items()})

    def _beginning_offsets(self) -> dict[str, int]:
        from kafka import TopicPartition

        tps = [TopicPartition(self.topic, p) for p in self._partitions()]
        begins = self._client().beginning_offsets(tps)
        return dump_offsets({tp.partition: o for tp, o in begins.items()})

    def initialOffset(self) -> dict:
        if self.starting == "earliest":
            return self._beginning_offsets()
        if self.starting == "latest":
            return self._end_offsets()
        try:
            given = json.loads(self.starting)
        except ValueError as e:
            raise KafkaSourceError(
                f"startingOffsets must be 'earliest', 'latest' or JSON like "
                f'{{"0": 120}}, got {self.starting!r}'
            ) from e
        partitions = self._partitions()
        if not isinstance(given, dict) or not all(
            isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in given.values()
        ):
            raise KafkaSourceError(
                f"startingOffsets must map partitions to offsets ≥ 0, got {self.starting!r}"
            )
        unknown = sorted(set(given) - {str(p) for p in partitions})
        if unknown:
            raise KafkaSourceError(
                f"startingOffsets names partitions {unknown} that topic {self.topic!r} "
                f"does not have (it has {partitions})"
            )
        return dump_offsets({p: given.get(str(p), 0) for p in partitions})

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_records)

    def prepareForTriggerAvailableNow(self) -> None:
        """Fix where this availableNow run ends: the end offsets now."""
        self._target = self._end_offsets()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        ends = self._end_offsets()
        for p, o in start.items():
            if p not in ends:
                raise KafkaSourceError(
                    f"partition {p} of topic {self.topic!r} is in the query's offsets but "
                    "not on the broker: the topic was recreated"
                )
            if ends[p] < o:
                raise KafkaSourceError(
                    f"partition {p} of topic {self.topic!r} ends at {ends[p]}, below the "
                    f"query's position {o}: records the query already read are gone (the "
                    "topic was recreated, or the broker lost writes)"
                )
        if self._target is not None:  # availableNow: nothing that arrived after the start
            ends = {
                p: min(e, max(self._target.get(p, 0), start.get(p, 0))) for p, e in ends.items()
            }
        available = {p: e - start.get(p, 0) for p, e in ends.items()}
        if isinstance(limit, ReadMaxRows):
            take = share_limit(available, limit.max_rows)
        elif isinstance(limit, ReadAllAvailable):
            take = available
        else:
            raise KafkaSourceError(f"read limit {limit!r} is not supported by {NAME}")
        return dump_offsets({p: start.get(p, 0) + take[p] for p in ends})

    def reportLatestOffset(self) -> dict | None:
        return self._end_offsets()

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        ranges = [(int(p), start.get(p, 0), e) for p, e in dump_offsets(end).items()]
        return [KafkaPartition(*r) for r in split_ranges(ranges, self.min_partitions)]

    def commit(self, end: dict) -> None:
        """Deliberately nothing: input is acknowledged by garbage collection only."""

    def stop(self) -> None:
        if self._metadata is not None:
            self._metadata.close()
            self._metadata = None

    # --- reading (executor side) ------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator:
        """Exactly the records ``[start, end)`` of one partition, as Arrow record batches."""
        import pyarrow as pa
        from kafka import TopicPartition
        from kafka.errors import OffsetOutOfRangeError
        from pyspark.sql.pandas.types import to_arrow_schema

        assert isinstance(partition, KafkaPartition)
        arrow_schema = to_arrow_schema(self.schema, timezone="UTC")
        parser = _ValueParser(self.value_schema) if self.value_schema is not None else None
        tp = TopicPartition(self.topic, partition.partition)
        end = partition.end
        consumer = _consumer(
            self.bootstrap,
            auto_offset_reset="none",  # a missing range is an error, never a silent skip
            max_partition_fetch_bytes=16 * 1024 * 1024,
            fetch_max_bytes=64 * 1024 * 1024,
        )
        try:
            consumer.assign([tp])
            consumer.seek(tp, partition.start)
            records: list = []
            stalled_since = time.monotonic()
            position = partition.start
            while position < end:
                try:
                    polled = consumer.poll(timeout_ms=1000, max_records=ARROW_BATCH_ROWS)
                except OffsetOutOfRangeError as e:
                    raise KafkaSourceError(
                        f"records [{position}, {end}) of {self.topic}[{partition.partition}] "
                        "are no longer on the broker (deleted, or the broker lost writes)"
                    ) from e
                got = polled.get(tp, ())
                if got:
                    if got[-1].offset >= end:
                        got = [r for r in got if r.offset < end]
                    records.extend(got)
                    if len(records) >= ARROW_BATCH_ROWS:
                        yield self._batch(records, arrow_schema, parser, pa)
                        records = []
                elif time.monotonic() - stalled_since > READ_STALL_TIMEOUT_S:
                    raise KafkaSourceError(
                        f"reading {self.topic}[{partition.partition}] "
                        f"[{partition.start}, {end}): no progress at offset {position} "
                        f"for {READ_STALL_TIMEOUT_S:.0f} s"
                    )
                moved = consumer.position(tp)
                if moved != position:
                    position = moved
                    stalled_since = time.monotonic()
            if records:
                yield self._batch(records, arrow_schema, parser, pa)
        finally:
            consumer.close()

    def _batch(self, records: list, arrow_schema, parser: _ValueParser | None, pa):
        n = len(records)
        values = [r.value for r in records]
        arrays = [
            pa.repeat(pa.scalar(self.topic, pa.string()), n),
            pa.repeat(pa.scalar(records[0].partition, pa.int32()), n),
            pa.array([r.offset for r in records], pa.int64()),
            _utf8([r.key for r in records], pa),
            pa.array([r.timestamp for r in records], pa.int64()),
            _utf8(values, pa),
        ]
        if parser is not None:
            columns, errors = parser.parse(values)
            for col, field in zip(columns, list(arrow_schema)[len(BASE_FIELDS) : -1], strict=True):
                arrays.append(pa.array(col, field.type))
            arrays.append(pa.array(errors, pa.string()))
        return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema)


def _utf8(raw: list[bytes | None], pa):
    """bytes -> Arrow strings; a vectorised check, per-record replacement only if needed."""
    binary = pa.array(raw, pa.binary())
    try:
        return binary.cast(pa.string())
    except pa.ArrowInvalid:
        return pa.array(
            [None if b is None else b.decode("utf-8", errors="replace") for b in raw], pa.string()
        )


class KafkaBatchReader(DataSourceReader):
    """A batch read of exactly ``[startingOffsets, endingOffsets)`` (both JSON, required).

    What a region's epoch reads: the cut the epoch log records. Reading is the stream
    reader's, so both paths parse and report malformed records the same way.
    """

    def __init__(self, options: Mapping[str, str], schema: StructType):
        missing = [k for k in ("startingOffsets", "endingOffsets") if not options.get(k)]
        if missing:
            raise KafkaSourceError(f"a batch read of {NAME} needs {', '.join(missing)} (JSON)")
        self.stream = KafkaStreamReader(options, schema)
        start = offsets_from_json(options["startingOffsets"])
        end = offsets_from_json(options["endingOffsets"])
        if not start <= end:
            raise KafkaSourceError(f"endingOffsets {end.as_dict()} is before "
                                   f"startingOffsets {start.as_dict()}")
        self.ranges = [KafkaPartition(int(p), start.get(p), e) for p, e in end.items
                       if e > start.get(p)]

    def partitions(self) -> Sequence[InputPartition]:
        return self.ranges or [KafkaPartition(0, 0, 0)]  # an empty read still needs a task

    def read(self, partition: InputPartition) -> Iterator:
        return self.stream.read(partition)


def read_range(spark, bootstrap: str, topic: str, start: Offsets, end: Offsets,
               value_schema: str | None = None):
    """A DataFrame of the records ``[start, end)`` of a topic (see :class:`KafkaBatchReader`)."""
    reader = (spark.read.format(NAME).option("bootstrap", bootstrap).option("topic", topic)
              .option("startingOffsets", json.dumps(start.as_dict()))
              .option("endingOffsets", json.dumps(end.as_dict())))
    if value_schema:
        reader = reader.option("valueSchema", value_schema)
    return reader.load()


class KafkaDataSource(DataSource):
    """``spark.readStream.format("falkirk_kafka")``: see the module docstring for options."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def __init__(self, options: dict[str, str]):
        super().__init__(options)
        missing = [k for k in ("bootstrap", "topic") if not options.get(k)]
        if missing:
            raise KafkaSourceError(f"{NAME} needs the option(s) {', '.join(missing)}")
        ddl = options.get("valueSchema")
        self.value_schema = parse_value_schema(ddl) if ddl else None

    def schema(self) -> StructType:
        return source_schema(self.value_schema)

    def reader(self, schema: StructType) -> DataSourceReader:
        return KafkaBatchReader(self.options, schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        expected = self.schema()
        if schema != expected:
            raise KafkaSourceError(
                f"{NAME} has a fixed schema ({expected.simpleString()}); "
                f"got {schema.simpleString()}: set valueSchema instead of .schema()"
            )
        return KafkaStreamReader(self.options, schema)


def commit_group_offsets(bootstrap: str, topic: str, group: str, offsets: Offsets) -> None:
    """Commit consumer group ``group``'s positions on ``topic`` (garbage collection's ack).

    Partitions absent from ``offsets`` (position 0) are left alone. The group must have
    no active members, as for any offset reset.
    """
    from kafka import KafkaAdminClient, TopicPartition
    from kafka.errors import NoError
    from kafka.structs import OffsetAndMetadata

    wanted = {TopicPartition(topic, int(p)): OffsetAndMetadata(o, "", -1) for p, o in offsets.items}
    if not wanted:
        return
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="falkirk-gc")
    try:
        result = admin.alter_group_offsets(group, wanted)
    finally:
        admin.close()
    failed = {tp.partition: err.__name__ for tp, err in result.items() if err is not NoError}
    if failed:
        raise KafkaSourceError(
            f"committing group {group!r} offsets on {topic!r} failed for partitions {failed}"
        )
