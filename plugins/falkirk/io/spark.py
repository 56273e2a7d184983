"""Spark sessions, built here so jobs and tests run with the same settings, and what every
job does with one. Nothing here starts an engine or chooses which kind of session a
process gets: that is falkirk.runtime.launcher's."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import MutableMapping

from falkirk.config import Config, ConfigError, load
from falkirk.io.launch import launch_conf


def conform(df, table: str):
    """``df`` with the columns of ``schemas/tables/<table>.json``, in order, with its types
    (and a pass's epoch column after them, when ``df`` has one: a job's transforms conform
    a pass's rows as they conform one epoch's)."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema

    from falkirk.io.delta import PASS_COLUMN
    from falkirk.model.schemas import arrow_schema

    schema = from_arrow_schema(arrow_schema("tables", table))
    keep = [F.col(PASS_COLUMN)] if PASS_COLUMN in df.columns else []
    return df.select([F.col(f.name).cast(sql_type(f.dataType)).alias(f.name)
                      for f in schema.fields] + keep)


def sql_type(data_type) -> str:
    """A Spark type as SQL names it, for a cast: a Python ``StringType()`` reaches a Spark
    Connect engine as an *explicitly* collated string (its client sends the collation
    name), whose Delta schema is then ``string collate UTF8_BINARY``, a type delta-rs and
    other readers refuse; the engine parses ``string`` as the plain one."""
    return data_type.simpleString()


def dead_letters(rows, epoch):
    """The ``dead_letters`` rows of source records that failed a check.

    ``rows``: records as ``falkirk.io.kafka.read_range`` returns them, with a ``_reason``
    column (the first check they failed); ``epoch``: the epoch being processed (a Column).
    The raw value is kept, with its topic, partition and offset, so nothing malformed is
    lost. A pass's epoch column goes along.
    """
    from pyspark.sql import functions as F

    from falkirk.io.delta import PASS_COLUMN

    keep = [PASS_COLUMN] if PASS_COLUMN in rows.columns else []
    return conform(rows.select(
        epoch.alias("epoch"), F.col("topic").alias("source"), "partition", "offset",
        F.col("value").alias("raw"), F.col("_reason").alias("reason"), *keep,
    ), "dead_letters")


def split_checked(checked, fields):
    """``(valid, dead)`` of source rows a job checked: ``checked`` carries the epoch each
    row is checked against (``_epoch``) and why it is not valid (``_reason``, null when it
    is). ``valid``: ``fields`` and ``epoch``; ``dead``: :func:`dead_letters` rows. A job that
    writes both cuts ``checked``'s lineage first, so the records are read and parsed once
    (docs/jobs.md, "Parse once")."""
    from pyspark.sql import functions as F

    valid = checked.filter(F.col("_reason").isNull()).select(
        *fields, F.col("_epoch").alias("epoch"))
    return valid, dead_letters(checked.filter(F.col("_reason").isNotNull()), F.col("_epoch"))


def null_violations(df, schema, table: str, epoch):
    """``(rows, refused)``: the rows of ``df`` with a value in every column ``schema``
    declares non-nullable, and the others as ``dead_letters`` rows whose reason names the
    first such column that is null, the source being the table and the raw value the row
    as JSON (partition and offset -1: the row came from a job, not from a topic).
    ``epoch``: the epoch, or a pass's epochs (each row's then in its pass column, which the
    refused rows keep)."""
    from functools import reduce

    from pyspark.sql import functions as F

    from falkirk.io.delta import PASS_COLUMN

    required = [f.name for f in schema if not f.nullable and f.name in df.columns]
    if not required:
        return df, None
    many = PASS_COLUMN in df.columns
    null = reduce(lambda a, b: a | b, [F.col(f"`{c}`").isNull() for c in required])
    reason = F.coalesce(*[
        F.when(F.col(f"`{c}`").isNull(), F.lit(
            f"column {c!r} is null, but table {table!r} declares it non-nullable"))
        for c in required])
    data = [c for c in df.columns if c != PASS_COLUMN]
    at = F.col(PASS_COLUMN) if many else F.lit(epoch if isinstance(epoch, int) else epoch[0])
    refused = df.filter(null).select(
        at.alias("epoch"), F.lit(f"table {table}").alias("source"),
        F.lit(-1).alias("partition"), F.lit(-1).alias("offset"),
        F.to_json(F.struct(*[F.col(f"`{c}`") for c in data])).alias("raw"),
        reason.alias("reason"), *([F.col(PASS_COLUMN)] if many else []))
    return df.filter(~null), conform(refused, "dead_letters")


#: The session settings of Spark's generated code (whole-stage codegen), and their values
#: where it pays: the local engine interprets expressions (its small queries each compiled
#: new code), a pass over many records is faster compiled (docs/engine.md).
CODEGEN = {"spark.sql.codegen.wholeStage": "true",
           "spark.sql.codegen.factoryMode": "FALLBACK"}


@contextlib.contextmanager
def generated_code(spark):
    """Within: ``spark``'s session runs with generated code (:data:`CODEGEN`); after, with
    its own settings again."""
    saved = {k: spark.conf.get(k, None) for k in CODEGEN}
    for k, v in CODEGEN.items():
        spark.conf.set(k, v)
    try:
        yield spark
    finally:
        for k, v in saved.items():
            if v is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, v)


def cut_lineage(df):
    """``df`` with its lineage cut, so state kept across epochs and loops (label
    propagation's rounds) do not replay their history at every use.

    On ``local[2]`` the rows stay in the executor's memory (``localCheckpoint``): it dies
    only with its driver. Where executors can be lost (a profile with
    ``spark_checkpoint_dir``: a cluster) a local checkpoint is lost with its executor and
    every later job that reads it fails (``CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND``), so the rows
    are written to the checkpoint folder instead (``checkpoint``), which outlives them.
    """
    if _checkpoint_dir(df.sparkSession):
        return df.checkpoint(eager=True)
    return df.localCheckpoint()


def _checkpoint_dir(spark) -> str | None:
    """The session's reliable checkpoint folder, if any (Connect: the engine's
    ``spark.checkpoint.dir``, asked once per session)."""
    if not is_remote(spark):
        return spark.sparkContext.getCheckpointDir()
    if not hasattr(spark, "_falkirk_checkpoint_dir"):
        spark._falkirk_checkpoint_dir = spark.conf.get("spark.checkpoint.dir", None) or None
    return spark._falkirk_checkpoint_dir


def address(remote: str) -> tuple[str, int]:
    """(host, port) of a Spark Connect URL (``sc://host:port[/;params]``)."""
    from urllib.parse import urlparse

    parsed = urlparse(remote.split("/;", 1)[0])
    if parsed.scheme != "sc" or not parsed.hostname:
        raise ConfigError(f"spark_remote {remote!r} is not a Spark Connect URL "
                          "(sc://host:port)")
    return parsed.hostname, parsed.port or 15002


def answering(remote: str) -> bool:
    """Something listens at a Spark Connect server's address (an engine's gRPC service
    starts last)."""
    import socket

    host, port = address(remote)
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


#: The environment variable that names a job's Spark Connect session (the launcher's
#: ``start_job`` sets it and records it beside the job's process, so whoever stops the
#: job releases it).
SESSION_ENV = "FALKIRK_SPARK_SESSION"


def driver_env(env: MutableMapping[str, str], cfg: Config) -> None:
    """Make ``env`` fit for a process that may start a Spark driver (this one, or a job):
    Spark's Python on this interpreter (else its workers cannot import pyarrow), loopback on
    local masters (on a cluster the workers must reach the driver), and without the mark
    pyspark leaves in a process that made a Connect session, and in every process it starts:
    under it a builder refuses to start a JVM (a Connect client sets the mark itself)."""
    env.pop("SPARK_CONNECT_MODE_ENABLED", None)
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if cfg.spark_master.startswith("local"):
        env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def application_session(app_name: str = "falkirk", cfg: Config | None = None, **conf: str):
    """A Spark session that is an application of its own, its driver in this process:
    local[2] with 2 shuffle partitions (2 cores), bound to 127.0.0.1, the Python workers
    on this venv's interpreter (else they cannot import pyarrow), the RocksDB state store
    with changelog checkpointing for Spark's own in-query recovery, and (from the launch
    settings, falkirk.io.launch) the Kafka connector and delta-spark jars bin/setup
    fetched. Which kind of session a process gets is the launcher's choice
    (falkirk.runtime.launcher.session).
    """
    from pyspark.sql import SparkSession

    cfg = cfg or load()
    driver_env(os.environ, cfg)  # this session is an application of its own
    local = cfg.spark_master.startswith("local")
    builder = (
        SparkSession.builder.appName(app_name)
        .master(cfg.spark_master)
        .config("spark.default.parallelism", "2")
        .config("spark.ui.showConsoleProgress", "false")  # progress goes to the logs
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config(
            "spark.sql.streaming.stateStore.providerClass",
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
        )
        .config("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
    )
    if local:
        builder = builder.config("spark.driver.host", "127.0.0.1")
    for key, value in {**launch_conf(cfg), **conf}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    if cfg.spark_checkpoint_dir:  # executors can be lost: cut_lineage writes rows there
        sc = spark.sparkContext
        sc.setCheckpointDir(f"{cfg.spark_checkpoint_dir.rstrip('/')}/{sc.applicationId}")
    if cfg.lake.startswith("s3://"):  # the credentials, never on a command line (config)
        hadoop = spark.sparkContext._jsc.hadoopConfiguration()
        for key, value in cfg.s3a_settings(secrets=True).items():
            hadoop.set(key, value)
    return spark


def remote_session(cfg: Config, session_id: str | None = None, **conf: str):
    """A Spark Connect session on the engine at ``cfg.spark_remote``, which must answer
    (the launcher starts this machine's engine first when falkirk runs it:
    falkirk.runtime.launcher). Its id is ``session_id``, else the one the job was started
    with (``$FALKIRK_SPARK_SESSION``), else a new one. The session counts the Spark stages
    each job group runs (:func:`jobs_in_group`)."""
    import uuid

    from pyspark.sql import SparkSession

    sid = session_id or os.environ.get(SESSION_ENV) or str(uuid.uuid4())
    builder = SparkSession.builder.remote(f"{cfg.spark_remote.rstrip('/')}/;session_id={sid}")
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.create()
    # The newest session is this process's default and this thread's active one: pyspark
    # binds a checkpointed frame to the active-or-default session (not to the frame's),
    # so a process that made another session before (a test module, an Airflow task
    # process) would get frames of that one, and joins fail with SESSION_NOT_SAME.
    connect = type(spark)  # pyspark.sql.connect.session.SparkSession
    with connect._lock:
        connect._default_session = spark
    connect._active_session.session = spark
    if cfg.local_engine:  # an engine that does not answer here is gone: fail, be recovered
        from pyspark.sql.connect.client.retries import DefaultPolicy

        spark.client.set_retry_policies([DefaultPolicy(
            max_retries=LOCAL_ENGINE_RETRIES, backoff_multiplier=2.0, initial_backoff=100,
            max_backoff=2000)])
    spark.registerProgressHandler(_StageCounter(spark))
    return spark


#: A client of this machine's engine retries a call that found it not answering this many
#: times (0.1 s doubling to 2 s: about 6 s in all). Spark's default waits up to 10
#: minutes for a remote server; a local engine that does not answer for seconds has died
#: with every session on it, and the job's death is what makes the supervisor recover it
#: (and start the engine again).
LOCAL_ENGINE_RETRIES = 6


def is_remote(spark) -> bool:
    """A Spark Connect session (no JVM in this process: no SparkContext, no py4j)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


class _StageCounter:
    """Counts the Spark stages of a Connect session's operations by job group (its
    thread's tag): Connect reports an operation's stages, never its Spark jobs. The
    engine reports progress as it goes and once more at the end, with every stage."""

    KEEP = 256  # job groups remembered (an epoch names a dozen): a job runs for weeks

    def __init__(self, spark):
        import threading
        from collections import OrderedDict

        self.spark = spark
        self.seen: OrderedDict[str, set[tuple[str, int]]] = OrderedDict()
        self.lock = threading.Lock()

    def __call__(self, stages=(), inflight_tasks=0, operation_id=None, done=False, **_):
        tags = self.spark.getTags()  # the thread that runs the operation calls us
        if not tags or not stages:
            return
        with self.lock:
            for tag in tags:
                if tag not in self.seen:
                    self.seen[tag] = set()
                    while len(self.seen) > self.KEEP:
                        self.seen.popitem(last=False)
                self.seen[tag].update((operation_id or "", s.stage_id) for s in stages)


def work_unit(spark) -> str:
    """What :func:`jobs_in_group` counts in this session."""
    return "Spark stages" if is_remote(spark) else "Spark jobs"


def label_jobs(spark, group: str, description: str | None = None) -> str:
    """Put the Spark jobs this thread runs next in job group ``group`` (Connect: a tag),
    replacing the thread's previous one ("": none); the UI, the event log and
    :func:`jobs_in_group` then see them together."""
    if is_remote(spark):
        spark.clearTags()
        if group:
            spark.addTag(group)
    elif group:
        spark.sparkContext.setJobGroup(group, description or group)
    else:
        spark.sparkContext.clearJobGroup()
    return group


def current_group(spark) -> str:
    """This thread's job group (:func:`label_jobs`), or ""."""
    if is_remote(spark):
        return next(iter(sorted(spark.getTags())), "")
    return spark.sparkContext.getLocalProperty("spark.jobGroup.id") or ""


def jobs_in_group(spark, group: str) -> int:
    """How many Spark jobs (Connect: stages) the job group has run so far (Spark's status
    store keeps the last ``spark.ui.retainedJobs``, 1,000 by default: more than an epoch
    runs)."""
    if not group:
        return 0
    if is_remote(spark):
        counter = next((h for h in spark.client._progress_handlers
                        if isinstance(h, _StageCounter)), None)
        if counter is None:
            return 0
        with counter.lock:
            return len(counter.seen.get(group, ()))
    return len(spark.sparkContext.statusTracker().getJobIdsForGroup(group))


def cancel_all(spark) -> None:
    """Cancel everything the session runs now (Connect: this session's operations only;
    an application's session: every Spark job of the application)."""
    if is_remote(spark):
        spark.interruptAll()
    else:
        spark.sparkContext.cancelAllJobs()


def quiet(spark, timeout_s: float = 30.0) -> bool:
    """Wait until the session runs no Spark stage and no task (a cancelled task may run
    on a moment); whether it got there within ``timeout_s``. A Connect operation that was
    interrupted answers its client only once it ended on the engine: a session whose
    threads all returned runs nothing there."""
    import time

    if is_remote(spark):
        return True
    tracker = spark.sparkContext._jsc.sc().statusTracker()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        infos = tracker.getExecutorInfos()
        tasks = sum(infos[i].numRunningTasks() for i in range(len(infos)))
        if not tracker.getActiveStageIds() and tasks == 0:
            return True
        time.sleep(0.1)
    return False


def release_session(remote: str, session_id: str) -> bool:
    """Interrupt every operation of a Connect session on the engine and close it: a job
    killed in the middle of a call leaves its work running there (Connect keeps an
    execution whose client went away, for it to reattach). Whether the engine answered
    (one that does not answer has lost every session anyway)."""
    from pyspark.errors.exceptions.connect import SparkConnectException
    from pyspark.sql.connect.client import SparkConnectClient

    if not answering(remote):
        return False
    client = SparkConnectClient(f"{remote.rstrip('/')}/;session_id={session_id}")
    try:
        try:
            client.interrupt_all()
        except SparkConnectException as exc:  # closed already (released, timed out)
            if "SESSION_CLOSED" not in str(exc) and "INVALID_HANDLE" not in str(exc):
                raise
            return True
        with contextlib.suppress(SparkConnectException):
            client.release_session()
        return True
    finally:
        client.close()
