"""One configuration object, chosen by one environment variable.

``FALKIRK_ENV=local`` (the default) keeps every Delta table under this machine's falkirk
folder (``var/`` of a checkout, ``$FALKIRK_HOME`` or ~/.falkirk otherwise), talks to a
local Kafka broker and runs every job as a client of one Spark Connect engine on this
machine (local[2]).
``FALKIRK_ENV=cluster`` is the local cluster of ``bin/cluster up`` (Spark standalone, 3
Kafka brokers, the lake on an S3-compatible object store), or a remote one by overrides.
``FALKIRK_ENV=compose`` is the same cluster in the containers of docker-compose.yml (which
is generated from it). Single values can be overridden with
``FALKIRK_<FIELD>``, or for one profile only with ``FALKIRK_<PROFILE>_<FIELD>`` (for tests
that need their own folder, broker or engine port).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace
from pathlib import Path

from falkirk.errors import FalkirkError

REPO_ROOT = Path(__file__).resolve().parents[2]
#: The checkout falkirk runs from (an editable install), or None for an installed wheel.
CHECKOUT: Path | None = REPO_ROOT if (REPO_ROOT / "plugins" / "falkirk").is_dir() else None
#: This machine's falkirk folder: pid files, logs, the local lake and broker, the JVM
#: jars of a wheel install. ``var/`` in a checkout, else ``$FALKIRK_HOME`` or ~/.falkirk.
STATE_DIR = Path(os.environ.get("FALKIRK_HOME") or (
    REPO_ROOT / "var" if CHECKOUT else Path.home() / ".falkirk"))


@dataclass(frozen=True)
class Config:
    env: str
    lake: str  # root of the Delta tables (a folder, or s3://bucket/prefix)
    kafka_bootstrap: str
    spark_master: str
    spark_shuffle_partitions: int = 2
    spark_ui: bool = False
    # The driver JVM's options. Locally: C1 only and the serial collector, because four
    # Spark JVMs share 2 cores and C2's compiler threads and G1's GC threads cost them more
    # than they give back (a failure-free run of the reference pipeline: 138 s -> 80 s).
    # C1 alone reserves a 48 MB code cache, which a long streaming query's generated code
    # fills (the JVM then stops compiling): keep the tiered default, 240 MB.
    spark_driver_java_options: str = ""
    broker_data_dir: str = ""  # where the local broker keeps its data (local only)
    var_dir: str = str(STATE_DIR)  # pid files, logs, locks of this machine
    storage_options: tuple[tuple[str, str], ...] = ()  # for delta-rs on an object store
    topic_replication: int = 1  # replicas of the input topics falkirk creates
    spark_conf: tuple[tuple[str, str], ...] = ()  # more launch settings of this profile
    # Folders of the user's pipelines ($FALKIRK_PIPELINES, separated by ":"), searched
    # before a checkout's examples/: <folder>/<name>.yaml or
    # <folder>/<name>/pipeline.yaml (a pipeline folder with its jobs and schemas).
    pipelines: str = ""
    # hadoop-aws and the AWS SDK (bin/setup's ``s3`` jar set) on the class path of drivers
    # and executors, for a lake on an object store (a remote cluster's nodes need the
    # jars at the same path, as with any hadoop-aws install).
    object_store_jars: bool = False
    # Where the object store's credentials are read when the environment has none: a
    # file under var_dir written by `bin/cluster up` (never in the repository).
    object_store_credentials: str = ""
    # Where Spark writes the rows whose lineage falkirk.io.spark.cut_lineage cuts, when
    # executors can be lost (a cluster): a folder every executor reaches. Empty: in the
    # executors' memory (local[2], where they die only with the driver).
    spark_checkpoint_dir: str = ""
    # The executor bin/airflow runs Airflow with: LocalExecutor on one machine; the
    # CeleryExecutor on a cluster (tasks go to Celery workers through a broker).
    airflow_executor: str = "LocalExecutor"
    # The streams supervisor's watch defers to Airflow's triggerer, which looks for a dead
    # job every second (bin/airflow runs a triggerer). False: an Airflow without one; the
    # watch then pokes in reschedule mode every 30 s, which adds to every detection.
    watch_deferred: bool = True
    # The deferred watch's trigger also recovers: on a death it rolls the dead jobs'
    # regions back and restarts them in the triggerer, then watches on. A recovery then
    # waits for no scheduling, task process or DAG parse (the ``recover`` task's path:
    # 3 s idle, 10-50 s under the fault campaign's load), and not for a scheduler that
    # died with the job. False: the trigger only ends the watch and ``recover`` does it.
    recover_in_trigger: bool = True
    # The supervisor's rollback lets a running stream job it moves back park in its warm
    # driver and resume there (falkirk.runtime.park) instead of killing and restarting it
    # cold. False ($FALKIRK_PARK_MOVED_JOBS=0): such jobs are killed, as the rollback DAG
    # and the CLI do.
    park_moved_jobs: bool = True
    # Spark Connect (``sc://host:port``): every job is a thin client of one long-running
    # Spark application, the engine, in a Spark session of its own. A job's start is then
    # a Python process and a session (about a second), not a driver JVM, and its epochs run
    # warm; a killed job's server-side work is interrupted and its session released by
    # the rollback that stops it (falkirk.io.spark.release_session). Empty: every job is
    # a Spark application of its own (spark-submit, a driver JVM each). The launcher
    # (falkirk.runtime.launcher) starts jobs and builds sessions by this choice.
    spark_remote: str = ""
    # falkirk starts the engine at ``spark_remote`` itself (falkirk.runtime.engine) when
    # nothing answers there: the embedded default, like the local broker.
    local_engine: bool = False
    # The engine's master and heap (its JVM hosts every job's session).
    engine_master: str = "local[2]"
    engine_memory: str = "3g"
    # Seconds a fresh engine works through warm-up epochs (falkirk.runtime.warmup) when a
    # pipeline's first start starts it, before any job: a cold engine's first minutes ran
    # the reference pipeline 2-3x slower. Not when a job's recovery restarts it (that
    # waits for nobody's warm-up). 0: no warm-up.
    engine_warmup_s: float = 60.0
    # Where the engine falkirk starts keeps its log and process record (default:
    # <var_dir>/engine): one engine per machine serves sandboxes with var folders of
    # their own.
    engine_dir: str = ""
    # The most ready epochs a job processes in one pass (falkirk.runtime.loop): a region
    # that is behind pays each fixed cost once per pass. 1: one epoch at a time.
    max_pass: int = 30
    # A pass reading at least this many records from topics runs with Spark's generated
    # code (whole-stage codegen), which the local engine turns off for the small queries
    # of single epochs: over many records compiled code is faster (docs/engine.md); a
    # small pass pays its compilation and gains little.
    # 0: never.
    codegen_records: int = 250_000
    # Where OpenLineage run events go (docs/assets.md): "" (off), ``file:<path>`` (each
    # event a JSON line appended to the file: no server), ``http(s)://…`` (an OpenLineage
    # server, e.g. Marquez) or ``console`` (the process's log). Both the jobs' epochs
    # (falkirk.io.lineage) and, through `falkirk airflow start`, Airflow's tasks (its
    # OpenLineage provider) send there. Checked when the configuration loads.
    lineage: str = ""

    def table(self, *parts: str) -> str:
        """The location of a Delta table under the lake."""
        return "/".join([self.lake.rstrip("/"), *parts])

    def s3a_settings(self, secrets: bool = False) -> dict[str, str]:
        """Hadoop's s3a settings for the lake, from the same storage options delta-rs
        gets, so Spark and delta-rs cannot point at different stores. The credentials
        only with ``secrets``: launch settings (falkirk.io.launch) show on command lines
        and in Airflow's task fields, so a session of its own gets them in the running
        driver (falkirk.io.spark.application_session)."""
        opts = dict(self.storage_options)
        # No committer settings: Spark's Parquet writes (falkirk.io.delta.spark_files)
        # commit with Hadoop's FileOutputCommitter, renames and then a delete of
        # _temporary, so a failed task attempt's files never reach the folder the commit
        # lists. The S3A magic committer would skip the renames, but Spark binds it only
        # through spark-hadoop-cloud, which pip's pyspark does not ship. The local
        # cluster's store needed a setting for that delete (falkirk_dev.cluster).
        out = {"fs.s3a.endpoint.region": opts.get("AWS_REGION", "us-east-1"),
               # Hadoop retries a failed call 7 times 0.5 s apart: a store away for
               # longer (a restart, a network blip) failed the job. 2 minutes, as delta-rs
               # gets (OBJECT_STORE_RETRIES).
               "fs.s3a.retry.limit": "40", "fs.s3a.retry.interval": "3s",
               # Hadoop 3.5 reads through the analytics accelerator by default, whose
               # GETs retry only in the AWS SDK (6 attempts in ~1 s) and not by the limit
               # above: a Delta streaming source failed during a store restart. The
               # classic stream's reads go through s3a's retry policy (Flink pins it too).
               "fs.s3a.input.stream.type": "classic"}
        if "AWS_ENDPOINT_URL" in opts:  # an S3-compatible store: buckets are not host names
            out["fs.s3a.endpoint"] = opts["AWS_ENDPOINT_URL"]
            out["fs.s3a.path.style.access"] = "true"
            out["fs.s3a.connection.ssl.enabled"] = str(
                opts["AWS_ENDPOINT_URL"].startswith("https:")).lower()
        if secrets:
            creds = self.delta_storage_options
            out["fs.s3a.access.key"] = creds["AWS_ACCESS_KEY_ID"]
            out["fs.s3a.secret.key"] = creds["AWS_SECRET_ACCESS_KEY"]
        return out

    @property
    def delta_storage_options(self) -> dict[str, str]:
        opts = dict(self.storage_options)
        missing = [k for k in SECRET_OPTIONS if self.lake.startswith("s3://") and k not in opts]
        if missing:
            where = (f", or in {self.object_store_credentials} (bin/cluster up writes it)"
                     if self.object_store_credentials else "")
            raise ConfigError(f"FALKIRK_ENV={self.env}: the lake {self.lake} needs "
                              f"{' and '.join(missing)} in the environment{where}: the object "
                              "store's credentials are never kept in the repository "
                              "(docs/cluster.md, docs/compose.md)")
        return opts


# delta-rs retries a failed request 10 times within about 2 s by default: a store away for
# longer (a restart, a network blip) failed the commit. Keep trying for 2 minutes, as s3a
# does (Config.s3a_settings).
OBJECT_STORE_RETRIES = (("max_retries", "100"), ("retry_timeout", "120s"),
                        ("backoff_config.init_backoff", "500ms"),
                        ("backoff_config.max_backoff", "4s"))

# Drivers sharing this machine's 2 cores: C1 only, the serial collector, the tiered code
# cache (see Config.spark_driver_java_options); the local and the cluster profile use them.
LOCAL_DRIVER_JAVA_OPTIONS = ("-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
                             " -XX:ReservedCodeCacheSize=240m")

PROFILES: dict[str, Config] = {
    "local": Config(
        env="local",
        lake=str(STATE_DIR / "lake"),
        kafka_bootstrap="127.0.0.1:19092",
        spark_master="local[2]",
        spark_driver_java_options=LOCAL_DRIVER_JAVA_OPTIONS,
        broker_data_dir=str(STATE_DIR / "broker"),
        spark_remote="sc://127.0.0.1:15002",
        local_engine=True,
        engine_dir=str(STATE_DIR / "engine"),
    ),
    # The local cluster of `bin/cluster up` (tools/falkirk_dev/cluster.py): a Spark
    # standalone master with 2 workers, 3 Kafka brokers and S3Proxy, each a separate
    # process. A remote cluster is the same profile with FALKIRK_SPARK_MASTER,
    # FALKIRK_KAFKA_BOOTSTRAP, FALKIRK_LAKE, FALKIRK_S3_ENDPOINT and the AWS_* credentials
    # in the environment (docs/cluster.md).
    "cluster": Config(
        env="cluster",
        lake="s3://falkirk/lake",
        storage_options=(
            ("AWS_ENDPOINT_URL", "http://127.0.0.1:29300"),
            ("AWS_REGION", "us-east-1"),
            ("AWS_ALLOW_HTTP", "true"),
            # Commits by put-if-absent (If-None-Match), which S3Proxy honours: two writers
            # of one Delta version cannot both win, without AWS_S3_ALLOW_UNSAFE_RENAME.
            ("AWS_CONDITIONAL_PUT", "etag"),
            *OBJECT_STORE_RETRIES,
        ),
        object_store_jars=True,
        object_store_credentials="cluster/objectstore/credentials.json",
        # The workers share this machine's disk; a remote cluster names shared storage
        # (FALKIRK_SPARK_CHECKPOINT_DIR=hdfs://… or s3a://…).
        spark_checkpoint_dir=str(STATE_DIR / "cluster" / "spark-checkpoints"),
        kafka_bootstrap="127.0.0.1:29092,127.0.0.1:29093,127.0.0.1:29094",
        spark_master="spark://127.0.0.1:27077",
        spark_driver_java_options=LOCAL_DRIVER_JAVA_OPTIONS,
        topic_replication=3,
        airflow_executor="CeleryExecutor",
        # Every job is an application of its own and streaming jobs never end: each takes
        # one executor core, so the workers' cores go round (tools/falkirk_dev/cluster.py).
        spark_conf=(("spark.cores.max", "1"), ("spark.executor.memory", "768m"),
                    # checkpointed rows are deleted once their frame is gone
                    ("spark.cleaner.referenceTracking.cleanCheckpoints", "true")),
    ),
}


# docker-compose.yml (generated by `bin/cluster compose`): the cluster profile's topology
# and settings, in containers on one network. Only the addresses differ, the credentials
# come from the environment (compose reads them from .env), and the drivers keep the JVM's
# defaults (the local ones share 2 cores with everything else).
PROFILES["compose"] = replace(
    PROFILES["cluster"], env="compose",
    kafka_bootstrap="kafka-1:9092,kafka-2:9092,kafka-3:9092",
    spark_master="spark://spark-master:7077",
    spark_driver_java_options="",
    spark_ui=True,
    storage_options=tuple(("AWS_ENDPOINT_URL", "http://objectstore:29300")
                          if k == "AWS_ENDPOINT_URL" else (k, v)
                          for k, v in PROFILES["cluster"].storage_options),
    object_store_credentials="",
)


#: Storage options that are credentials: never in the repository, read from the
#: environment by every profile with an object store.
SECRET_OPTIONS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")


class ConfigError(FalkirkError, ValueError):
    """FALKIRK_ENV or an override names something that does not exist."""


def _credentials(cfg: Config, var_dir: str) -> dict[str, str]:
    """The object store's credentials: from the environment, else from the profile's
    credentials file under ``var_dir`` (written by `bin/cluster up`); none when neither has
    them (``Config.delta_storage_options`` then says where to put them)."""
    found = {k: os.environ[k] for k in SECRET_OPTIONS if os.environ.get(k)}
    if len(found) < len(SECRET_OPTIONS) and cfg.object_store_credentials:
        import json

        path = Path(var_dir) / cfg.object_store_credentials
        try:
            saved = json.loads(path.read_text())
        except FileNotFoundError:
            return found
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{path}: the object store's credentials file is unreadable "
                              f"({exc}); delete it and the next `bin/cluster up` writes a new "
                              "one") from exc
        found = {k: str(saved[k]) for k in SECRET_OPTIONS if k in saved}
    return found


def load(env: str | None = None) -> Config:
    """The configuration for ``env`` (default: $FALKIRK_ENV, else local)."""
    name = env or os.environ.get("FALKIRK_ENV", "local")
    if name not in PROFILES:
        raise ConfigError(
            f"FALKIRK_ENV={name!r} is not a known profile (known: {', '.join(PROFILES)})"
        )
    cfg = PROFILES[name]
    overrides = {}
    for f in fields(Config):
        # FALKIRK_<PROFILE>_<FIELD> overrides a field of that profile only (the test suite
        # gives the local engine a port of its own and leaves the cluster profile's be),
        # FALKIRK_<FIELD> of any profile.
        value = os.environ.get(f"FALKIRK_{name.upper()}_{f.name.upper()}",
                               os.environ.get(f"FALKIRK_{f.name.upper()}"))
        if value is None or f.name in ("env", "storage_options", "object_store_credentials"):
            continue
        if f.type in ("int", int, "float", float):
            number = int if f.type in ("int", int) else float
            try:
                overrides[f.name] = number(value)
            except ValueError:
                raise ConfigError(
                    f"FALKIRK_{f.name.upper()}={value!r} (from the environment) is not "
                    f"{'an integer' if number is int else 'a number'}") from None
        elif f.type in ("bool", bool):
            overrides[f.name] = value.lower() in ("1", "true", "yes")
        else:
            overrides[f.name] = value
    if cfg.storage_options:  # an object store: its credentials are never in the repository
        endpoint = os.environ.get("FALKIRK_S3_ENDPOINT")
        opts = dict(cfg.storage_options)
        if endpoint:
            opts["AWS_ENDPOINT_URL"] = endpoint
        opts.update(_credentials(cfg, overrides.get("var_dir", cfg.var_dir)))
        overrides["storage_options"] = tuple(opts.items())
        if cfg.object_store_credentials:
            overrides["object_store_credentials"] = str(
                Path(overrides.get("var_dir", cfg.var_dir)) / cfg.object_store_credentials)
    cfg = replace(cfg, **overrides)
    lineage_transport(cfg.lineage)  # a bad setting is refused before anything runs
    return cfg


#: What FALKIRK_LINEAGE accepts, as said when it is refused.
LINEAGE_FORMS = ("'' (off)", "file:<path> (JSON lines appended to the file)",
                 "http(s)://<server>[:port] (an OpenLineage server, e.g. Marquez)",
                 "console (the process's log)")


def lineage_transport(setting: str) -> dict | None:
    """The OpenLineage transport (the Python client's and Airflow provider's
    configuration) that ``setting`` (``Config.lineage``) names; None when lineage is off.
    Anything else is refused, naming the setting and what it accepts."""
    from urllib.parse import urlsplit

    value = setting.strip()
    if not value:
        return None
    if value == "console":
        return {"type": "console"}
    if value.startswith("file:"):
        path = urlsplit(value).path if value.startswith("file://") else value[5:]
        if path and Path(path).is_absolute() and not path.endswith("/"):
            return {"type": "file", "log_file_path": path, "append": True}
    else:
        url = urlsplit(value)
        if url.scheme in ("http", "https") and url.hostname:
            return {"type": "http", "url": value.rstrip("/")}
    raise ConfigError(f"FALKIRK_LINEAGE={setting!r} is not a lineage setting: use one of "
                      f"{'; '.join(LINEAGE_FORMS)}; a file's path must be absolute")
