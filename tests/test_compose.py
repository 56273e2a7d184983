"""docker-compose.yml, validated offline (no docker engine here): it is exactly what
`bin/cluster compose` generates from the local cluster's description, docker-compose v1
accepts it, and it runs the topology, versions and settings of `bin/cluster up`, the
addresses of the code's "compose" profile (falkirk.config), bin/airflow's Airflow and
uv.lock's packages.

Nothing here starts a container; every test reads files only (plus one `docker-compose config`).
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import shutil
import subprocess
import tomllib
from pathlib import PurePosixPath
from urllib.parse import urlparse

import pytest
import yaml

from falkirk.config import PROFILES, REPO_ROOT
from falkirk.io.launch import launch_conf
from falkirk_dev import cluster
from falkirk_dev import compose as generator

COMPOSE_FILE = REPO_ROOT / "docker-compose.yml"
DOCKERFILE = REPO_ROOT / "docker" / "falkirk.Dockerfile"
CFG = PROFILES["compose"]
STORAGE = dict(CFG.storage_options)  # without the credentials: those come from .env
# The secrets compose reads from .env, and the variable each becomes in falkirk's processes.
SECRETS = {"FALKIRK_S3_ACCESS_KEY": "AWS_ACCESS_KEY_ID", "FALKIRK_S3_SECRET_KEY":
           "AWS_SECRET_ACCESS_KEY", "FALKIRK_POSTGRES_PASSWORD": None,
           "FALKIRK_REDIS_PASSWORD": None, "FALKIRK_AIRFLOW_SECRET": None,
           "FALKIRK_AIRFLOW_PASSWORD": None}


def _secret(variable: str) -> str:
    """How compose reads a secret: from .env, refusing to start without it."""
    return "${" + variable + ":?set in .env, see docs/compose.md}"


AIRFLOW_COMPONENTS = {"api-server", "scheduler", "dag-processor", "triggerer", "celery"}
KAFKA_ADDRESS_KEYS = {"node.id", "controller.quorum.voters", "listeners",
                      "advertised.listeners", "listener.security.protocol.map",
                      "controller.listener.names", "log.dirs", "process.roles"}


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE_FILE.read_text())


@pytest.fixture(scope="module")
def services(compose) -> dict[str, dict]:
    return compose["services"]


def _env(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):  # KEY=value form
        env = dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


def _command(service: dict) -> list[str]:
    cmd = service.get("command") or []
    return shlex.split(cmd) if isinstance(cmd, str) else [str(c) for c in cmd]


def _falkirk_services(services: dict[str, dict]) -> dict[str, dict]:
    """Services that run the falkirk image (Airflow and Spark)."""
    return {name: s for name, s in services.items()
            if (s.get("build") or {}).get("dockerfile") == "docker/falkirk.Dockerfile"}


def _airflow_services(services: dict[str, dict]) -> dict[str, dict]:
    return {name: s for name, s in _falkirk_services(services).items()
            if _command(s)[:1] == ["airflow"]}


def _kafka_services(services: dict[str, dict]) -> dict[str, dict]:
    return {name: s for name, s in services.items()
            if s["image"].startswith("apache/kafka:")}


def _uv_lock_versions() -> dict[str, str]:
    lock = tomllib.loads((REPO_ROOT / "uv.lock").read_text())
    return {p["name"]: p["version"] for p in lock["package"] if "version" in p}


def _bin_airflow_exports() -> dict[str, str]:
    """AIRFLOW__* settings ``falkirk airflow`` (which bin/airflow runs) gives a local Airflow,
    for a home of its own, without the environment's overrides."""
    import tempfile
    from pathlib import Path

    from falkirk.local.airflow import LocalAirflow

    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("AIRFLOW__")}
    try:
        with tempfile.TemporaryDirectory() as home:
            env = LocalAirflow(Path(home), port=8080).environment()
    finally:
        os.environ.update(saved)
    return {k: v for k, v in env.items() if k.startswith("AIRFLOW__")}


def _bin_airflow_default(variable: str) -> str:
    """The default ``falkirk airflow`` gives ``variable`` when the environment does not."""
    from falkirk.local import airflow

    return {**airflow.TUNABLE, "FALKIRK_CELERY_WORKERS": str(airflow.CELERY_WORKERS),
            "FALKIRK_CELERY_CONCURRENCY": str(airflow.CELERY_CONCURRENCY)}[variable]


def _named_volume(entry) -> str | None:
    """The named volume of a service's volume entry (None for a bind mount)."""
    if isinstance(entry, dict):
        return entry["source"] if entry.get("type", "volume") == "volume" else None
    source = str(entry).split(":", 1)[0]
    if ":" not in str(entry) or source.startswith((".", "/", "~", "$")):
        return None
    return source


# --- one source: the file is what bin/cluster compose writes -------------------------------


def test_docker_compose_yml_is_what_bin_cluster_compose_generates():
    """The cluster's description (tools/falkirk_dev/cluster.py) and the compose profile
    are the one source: an edit of either, or of the file by hand, fails here until the
    file is generated again."""
    assert COMPOSE_FILE.read_text() == generator.render(), (
        "docker-compose.yml is not what `bin/cluster compose` generates: run it")
    assert set(generator.SECRETS) == set(SECRETS)


def test_compose_profile_is_the_cluster_profile_but_for_addresses_and_credentials():
    """Same settings: only where the parts are, where the credentials come from and the
    drivers' JVM options (the local cluster shares 2 cores) may differ."""
    local = PROFILES["cluster"]
    differ = {"env", "kafka_bootstrap", "spark_master", "storage_options",
              "object_store_credentials", "spark_driver_java_options", "spark_ui"}
    assert dataclasses.replace(CFG, **{f: getattr(local, f) for f in differ}) == local
    assert {k for k, _ in CFG.storage_options} == {k for k, _ in local.storage_options}
    assert {(k, v) for k, v in CFG.storage_options if k != "AWS_ENDPOINT_URL"} == \
        {(k, v) for k, v in local.storage_options if k != "AWS_ENDPOINT_URL"}


# --- docker-compose accepts the file ----------------------------------------------------------


def test_docker_compose_config_accepts_the_file():
    exe = shutil.which("docker-compose")
    if exe is None:  # bin/setup installs it: under CI a missing one is a failure
        (pytest.fail if os.environ.get("CI") else pytest.skip)(
            "docker-compose not installed: run bin/setup")
    env = {**os.environ, **{v: f"test-{v.lower()}" for v in SECRETS}}  # as .env would
    result = subprocess.run([exe, "-f", str(COMPOSE_FILE), "config", "-q"], cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, f"docker-compose config -q failed:\n{result.stderr}"
    bare = {k: v for k, v in os.environ.items() if k not in SECRETS}
    refused = subprocess.run([exe, "-f", str(COMPOSE_FILE), "config", "-q"], cwd=REPO_ROOT,
                             capture_output=True, text=True, timeout=120, env=bare)
    assert refused.returncode != 0 and "see docs/compose.md" in refused.stderr


def test_no_secret_is_written_in_the_compose_files(services):
    """Credentials and passwords are read from .env, never kept in the repository."""
    text = COMPOSE_FILE.read_text() + DOCKERFILE.read_text()
    for word in ("falkirk-secret", "change-me", '"admin": "admin"', "local-credential",
                 "access.key", "secret.key", "POSTGRES_PASSWORD: airflow"):
        assert word not in text, word
    for name, service in services.items():
        for key, value in _env(service).items():
            if re.search(r"PASSWORD|SECRET|CREDENTIAL|IDENTITY|ACCESS_KEY", key) and \
                    not key.endswith("_FILE"):
                assert value.startswith("${FALKIRK_"), f"{name}: {key} is written in the file"


# --- Kafka: the local cluster's 3 nodes ------------------------------------------------------


def test_kafka_nodes_are_the_profiles_bootstrap_servers_in_one_quorum(services):
    kafka = _kafka_services(services)
    nodes = [a.rsplit(":", 1) for a in CFG.kafka_bootstrap.split(",")]
    assert sorted(kafka) == sorted(host for host, _ in nodes) and len(kafka) == 3
    voters = set()
    for (host, port), host_port in zip(nodes, cluster.KAFKA_PORTS, strict=True):
        env = _env(kafka[host])
        advertised = dict(reversed(item.split("://", 1))
                          for item in env["KAFKA_ADVERTISED_LISTENERS"].split(","))
        name = advertised[f"{host}:{port}"]
        listeners = dict(item.split("://", 1) for item in env["KAFKA_LISTENERS"].split(","))
        assert listeners[name] == f":{port}", "the listener binds another port"
        protocols = dict(item.split(":") for item in
                         env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
        assert protocols[name] == "PLAINTEXT"  # falkirk's kafka-python clients set no security
        # From the host, each node answers where the local cluster's does.
        assert advertised[f"127.0.0.1:{host_port}"] in listeners
        assert f"127.0.0.1:{host_port}:{host_port}" in kafka[host]["ports"]
        assert f"{host}:{port}" in " ".join(kafka[host]["healthcheck"]["test"])
        voters.add(env["KAFKA_CONTROLLER_QUORUM_VOTERS"])
    [quorum] = voters
    assert sorted(v.split("@")[1].split(":")[0] for v in quorum.split(",")) == sorted(kafka)
    assert len({_env(s)["KAFKA_NODE_ID"] for s in kafka.values()}) == 3


def test_kafka_nodes_have_the_settings_of_the_local_clusters_brokers(services, tmp_path):
    """What `bin/cluster up` writes into each node's server.properties, beside addresses,
    is what every compose node gets (the image maps KAFKA_A_B to a.b)."""
    props = dict(line.split("=", 1) for line in
                 cluster.kafka_properties(1, tmp_path).splitlines() if "=" in line)
    want = {k: v for k, v in props.items() if k not in KAFKA_ADDRESS_KEYS}
    assert want["min.insync.replicas"] == "2" and want["default.replication.factor"] == "3"
    for name, service in _kafka_services(services).items():
        env = _env(service)
        got = {k.removeprefix("KAFKA_").lower().replace("_", "."): v
               for k, v in env.items() if k.startswith("KAFKA_")}
        for key, value in want.items():
            assert got.get(key) == value, f"{name}: {key}={got.get(key)!r}, cluster: {value!r}"


def test_topics_no_one_creates_get_their_declared_partitions_on_auto_create(services):
    from falkirk.model.topology import declared, load_pipeline
    from falkirk_dev.generate import EVENTS_TOPIC, QUERIES_TOPIC

    created_by_generate = {EVENTS_TOPIC, QUERIES_TOPIC}
    auto = {(e.topic, e.partitions) for name in declared()
            for e in load_pipeline(name).edges.values()
            if e.kind == "kafka" and e.topic not in created_by_generate}
    assert auto, "every topic is created explicitly: drop this test"
    for name, service in _kafka_services(services).items():
        env = _env(service)
        assert env.get("KAFKA_AUTO_CREATE_TOPICS_ENABLE") == "true"
        for topic, partitions in auto:
            assert env["KAFKA_NUM_PARTITIONS"] == str(partitions), (name, topic)


def test_compose_runs_the_kafka_version_the_embedded_broker_runs(services):
    """One Kafka version: the embedded broker's and the cluster's jars
    (falkirk/jvm/kafka/pom.xml) and compose's."""
    from falkirk.io.jars import pom

    version = re.search(r"<kafka.version>([^<]+)</kafka.version>",
                        pom("kafka").read_text()).group(1)
    for name, service in _kafka_services(services).items():
        assert service["image"] == f"apache/kafka:{version}", name


# --- Spark: the master and the local cluster's workers ------------------------------------------


def test_spark_master_url_is_the_spark_master_service_on_its_port(services):
    url = urlparse(CFG.spark_master)
    assert url.scheme == "spark"
    assert url.hostname in services, f"no service {url.hostname!r} for {CFG.spark_master}"
    cmd = _command(services[url.hostname])
    assert "org.apache.spark.deploy.master.Master" in cmd
    assert cmd[cmd.index("--port") + 1] == str(url.port)
    assert cmd[cmd.index("--host") + 1] == url.hostname


def test_spark_workers_are_the_local_clusters_workers(services, tmp_path):
    """As many workers as `bin/cluster up` starts, each offering its cores and memory."""
    local = [c.cmd for c in cluster.spark_components(tmp_path) if c.kind == "spark-worker"]
    workers = [_command(s) for s in services.values()
               if "org.apache.spark.deploy.worker.Worker" in _command(s)]
    assert len(workers) == len(local) == 2
    for cmd, want in zip(workers, local, strict=True):
        assert cmd[-1] == CFG.spark_master
        for flag in ("--cores", "--memory"):
            assert cmd[cmd.index(flag) + 1] == want[want.index(flag) + 1], flag


def test_executors_reach_the_spark_checkpoint_folder_and_the_jobs(services):
    """The profile's spark_checkpoint_dir is under var/, which every worker mounts."""
    assert CFG.spark_checkpoint_dir.startswith(str(REPO_ROOT / "var"))
    for name, service in services.items():
        if "org.apache.spark.deploy.worker.Worker" in _command(service):
            assert "falkirk-var:/opt/falkirk/var" in service["volumes"], name
            assert "./examples:/opt/falkirk/examples:ro" in service["volumes"], name


def test_cluster_drivers_keep_the_jvms_default_compilers_and_collector(monkeypatch):
    """The local profile's C1-only, serial-GC driver options are for four short-lived JVMs
    on 2 cores; the compose profile's long-lived drivers keep the JVM defaults."""
    from falkirk.config import load

    assert "spark.driver.extraJavaOptions" not in launch_conf(CFG)
    monkeypatch.setenv("FALKIRK_SPARK_DRIVER_JAVA_OPTIONS", "")
    assert "spark.driver.extraJavaOptions" not in launch_conf(load("local"))


def test_drivers_and_executors_get_the_object_store_jars_from_the_image_not_at_start():
    """hadoop-aws and the AWS SDK are on the class path (the image fetched them with
    `falkirk jars`, as bin/setup does): no spark.jars.packages, nothing resolved at start."""
    conf = launch_conf(CFG)
    assert "spark.jars.packages" not in conf
    assert "hadoop-aws" in conf["spark.executor.extraClassPath"]
    assert conf["spark.driver.extraClassPath"] == conf["spark.executor.extraClassPath"]
    assert conf["spark.hadoop.fs.s3a.endpoint"] == STORAGE["AWS_ENDPOINT_URL"]
    assert "falkirk jars" in DOCKERFILE.read_text()


def test_airflow_spark_default_connection_is_the_profiles_spark_master(services):
    # SparkSubmitHook reads the URI spark://host:port as master spark://host:port.
    for name, service in _airflow_services(services).items():
        assert _env(service).get("AIRFLOW_CONN_SPARK_DEFAULT") == CFG.spark_master, name


# --- the object store ---------------------------------------------------------------------------


def test_every_storage_option_is_in_the_env_of_every_falkirk_service(services):
    falkirk = _falkirk_services(services)
    assert set(_airflow_services(services)) < set(falkirk)  # the Spark services too
    for name, service in falkirk.items():
        env = _env(service)
        # AWS_*, as every S3 client reads them; the retry settings (OBJECT_STORE_RETRIES)
        # are not environment variables: falkirk's processes get them from the profile.
        for key, value in ((k, v) for k, v in STORAGE.items() if k.startswith("AWS_")):
            assert env.get(key) == value, f"{name}: {key}={env.get(key)!r}, config: {value!r}"
        for variable, key in SECRETS.items():
            if key is not None:
                assert env.get(key) == _secret(variable), f"{name}: {key}"


def test_object_store_is_the_local_clusters_s3proxy(services, tmp_path):
    """The endpoint's service runs S3Proxy of the version `bin/cluster up` runs (the
    objectstore pom), with its settings, the .env key pair, plain HTTP on the port."""
    from falkirk.io.jars import pom

    endpoint = urlparse(STORAGE["AWS_ENDPOINT_URL"])
    store = services[endpoint.hostname]
    version = re.search(r"<artifactId>s3proxy</artifactId>\s*<version>([^<]+)</version>",
                        pom("objectstore").read_text()).group(1)
    assert store["image"] == f"andrewgaul/s3proxy:s3proxy-{version}"
    env = _env(store)
    assert env["S3PROXY_IDENTITY"] == _secret("FALKIRK_S3_ACCESS_KEY")
    assert env["S3PROXY_CREDENTIAL"] == _secret("FALKIRK_S3_SECRET_KEY")
    assert env["S3PROXY_ENDPOINT"] == f"http://0.0.0.0:{endpoint.port}"
    assert endpoint.scheme == "http" and STORAGE["AWS_ALLOW_HTTP"] == "true"
    (tmp_path / "objectstore").mkdir()
    cluster.objectstore_component(tmp_path)
    conf = dict(line.split("=", 1) for line in
                (tmp_path / "objectstore" / "s3proxy.conf").read_text().splitlines() if line)
    # The variables the image's start script (run-docker-container.sh) reads for them.
    variables = {"s3proxy.authorization": "S3PROXY_AUTHORIZATION",
                 "jclouds.provider": "JCLOUDS_PROVIDER",
                 "s3proxy.ignore-unknown-headers": "S3PROXY_IGNORE_UNKNOWN_HEADERS"}
    assert set(cluster.OBJECTSTORE_SETTINGS) == set(variables)
    for key, variable in variables.items():
        assert env[variable] == conf[key], key
    assert f"objectstore-data:{env['JCLOUDS_FILESYSTEM_BASEDIR']}" in store["volumes"]


def test_lake_bucket_is_created_by_a_one_shot_service_before_the_scheduler(services):
    lake = urlparse(CFG.lake)
    assert lake.scheme == "s3"
    init = services["objectstore-init"]
    assert _command(init) == ["python", "-m", "falkirk_dev.compose", "bucket"]
    assert init.get("restart") == "no"
    endpoint = urlparse(STORAGE["AWS_ENDPOINT_URL"])
    assert endpoint.hostname in init["depends_on"]
    scheduler = services["airflow-scheduler"]["depends_on"]
    assert scheduler["objectstore-init"]["condition"] == "service_completed_successfully"


def test_every_falkirk_service_runs_with_falkirk_env_compose(services):
    for name, service in _falkirk_services(services).items():
        assert _env(service).get("FALKIRK_ENV") == "compose", name


# --- Airflow ----------------------------------------------------------------------------------


def test_airflow_has_every_component_and_a_one_shot_db_migrate(services):
    airflow = _airflow_services(services)
    commands = {name: _command(s)[1:] for name, s in airflow.items()}
    assert {c[0] for c in commands.values()} >= AIRFLOW_COMPONENTS
    [init] = [name for name, c in commands.items() if c == ["db", "migrate"]]
    assert services[init].get("restart") == "no"
    for name in set(airflow) - {init}:
        assert airflow[name]["depends_on"][init]["condition"] == "service_completed_successfully"


def test_airflow_runs_celery_on_postgres_and_redis_as_bin_airflow_does(services):
    """The cluster profile's executor, bin/airflow's number of Celery workers and task
    slots, Redis as broker and PostgreSQL for metadata and results."""
    workers = {name: _command(s) for name, s in _airflow_services(services).items()
               if _command(s)[1:3] == ["celery", "worker"]}
    assert len(workers) == cluster.CELERY_WORKERS == int(
        _bin_airflow_default("FALKIRK_CELERY_WORKERS"))
    for cmd in workers.values():
        assert cmd[cmd.index("--concurrency") + 1] == str(cluster.CELERY_CONCURRENCY) == \
            _bin_airflow_default("FALKIRK_CELERY_CONCURRENCY")
    password = _secret("FALKIRK_POSTGRES_PASSWORD")
    for name, service in _airflow_services(services).items():
        env = _env(service)
        assert env["AIRFLOW__CORE__EXECUTOR"] == PROFILES["cluster"].airflow_executor \
            == "CeleryExecutor"
        assert env["AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT"] == str(
            cluster.TASK_HEARTBEAT_TIMEOUT_S) == _bin_airflow_default(
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT")
        for key in ("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "AIRFLOW__CELERY__RESULT_BACKEND"):
            db = urlparse(env[key].replace(password, "PASSWORD"))  # urlparse cannot read ${...}
            assert db.scheme.startswith(("postgresql", "db+postgresql")), (name, key)
            pg = _env(services[db.hostname])
            assert (db.username, db.path.lstrip("/")) == (pg["POSTGRES_USER"], pg["POSTGRES_DB"])
            assert db.password == "PASSWORD" and pg["POSTGRES_PASSWORD"] == password
        broker = urlparse(env["AIRFLOW__CELERY__BROKER_URL"].replace(
            _secret("FALKIRK_REDIS_PASSWORD"), "PASSWORD"))
        assert (broker.scheme, broker.password) == ("redis", "PASSWORD")
        assert _env(services[broker.hostname])["REDIS_PASSWORD"] == _secret(
            "FALKIRK_REDIS_PASSWORD")
        assert int(env["AIRFLOW__CORE__PARALLELISM"]) <= 4
        if name != "airflow-init":
            for dep in ("postgres", "redis"):
                assert service["depends_on"][dep]["condition"] == "service_healthy", name


def test_database_and_broker_are_the_debian_servers_of_the_local_cluster(services, tmp_path):
    """The major PostgreSQL and the Redis release bin/setup installs from Debian, with
    the local cluster's server settings."""
    pg_version = subprocess.run([str(cluster._postgres_bin() / "postgres"), "--version"],
                                capture_output=True, text=True, check=True).stdout
    assert re.search(r"\) (\d+)\.", pg_version).group(1) == cluster.POSTGRES_MAJOR
    redis_version = subprocess.run(["redis-server", "--version"], capture_output=True,
                                   text=True, check=True).stdout
    assert re.search(r"v=(\d+\.\d+)\.", redis_version).group(1) == cluster.REDIS_VERSION
    assert services["postgres"]["image"] == f"postgres:{cluster.POSTGRES_MAJOR}-bookworm"
    assert services["redis"]["image"] == f"redis:{cluster.REDIS_VERSION}-bookworm"
    cmd = _command(services["postgres"])
    for key, value in cluster.POSTGRES_SETTINGS.items():
        assert f"{key}={value}" in cmd
    redis_cmd = " ".join(_command(services["redis"]))
    for key, value in cluster.REDIS_SETTINGS.items():
        assert f"--{key} {value}" in redis_cmd


def test_airflow_dag_folder_is_the_packages_and_its_plugin_comes_from_the_entry_point(
        services):
    """Airflow's DAG folder is the package's (where `falkirk airflow start` points it), in
    the checkout's plugins/ that compose mounts; the image installs falkirk with its
    airflow.plugins entry point, so no plugin folder registers the plugin a second time."""
    from falkirk.local.airflow import DAGS_FOLDER

    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    assert project["entry-points"]["airflow.plugins"]["falkirk"].startswith("falkirk.")
    for name, service in _airflow_services(services).items():
        env = _env(service)
        assert "AIRFLOW__CORE__PLUGINS_FOLDER" not in env, name
        dags = PurePosixPath(env["AIRFLOW__CORE__DAGS_FOLDER"])
        binds = [str(e).split(":")[:2] for e in service["volumes"] if _named_volume(e) is None]
        [(source, target)] = [(s, t) for s, t in binds if dags.is_relative_to(t)]
        assert REPO_ROOT / source / dags.relative_to(target) == DAGS_FOLDER, name
        assert (DAGS_FOLDER / "falkirk_pipelines.py").is_file()


def test_airflow_settings_mirror_bin_airflow(services):
    exported = _bin_airflow_exports()
    # Values that hold anywhere; the others name this machine's paths and ports.
    same = ["AIRFLOW__CORE__EXECUTOR", "AIRFLOW__CORE__PARALLELISM",
            "AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG", "AIRFLOW__CORE__LOAD_EXAMPLES",
            "AIRFLOW__CORE__AUTH_MANAGER", "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS",
            "AIRFLOW__API__WORKERS", "AIRFLOW__SCHEDULER__STANDALONE_DAG_PROCESSOR",
            "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD",
            "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL"]
    # Log folder and log-server ports: Airflow's defaults under AIRFLOW_HOME suit containers.
    not_needed = {"AIRFLOW__LOGGING__BASE_LOG_FOLDER", "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT",
                  "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT"}
    assert set(same) <= set(exported), "bin/airflow no longer exports these: update the test"
    for name, service in _airflow_services(services).items():
        env = _env(service)
        missing = set(exported) - not_needed - set(env)
        assert not missing, f"{name} lacks what bin/airflow sets: {sorted(missing)}"
        for key in same:
            want = exported[key]
            if key == "AIRFLOW__CORE__EXECUTOR":  # the profile's (FALKIRK_ENV)
                want = PROFILES[env["FALKIRK_ENV"]].airflow_executor
            assert env[key] == want, f"{name}: {key}={env[key]!r}, bin/airflow: {want!r}"
        assert env["AIRFLOW__API__SECRET_KEY"] == env["AIRFLOW__API_AUTH__JWT_SECRET"]
        api = urlparse(env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"])
        assert _command(services[api.hostname])[1] == "api-server"


# --- compose hygiene ---------------------------------------------------------------------------


def test_every_named_volume_used_is_declared_and_every_declared_one_used(compose, services):
    used = {v for s in services.values() for entry in s.get("volumes", [])
            if (v := _named_volume(entry))}
    declared = set(compose.get("volumes") or {})
    assert used == declared, f"undeclared: {used - declared}, unused: {declared - used}"
    stateful = ["postgres", "redis", *_kafka_services(services),
                urlparse(STORAGE["AWS_ENDPOINT_URL"]).hostname]
    for name in stateful:
        assert any(_named_volume(e) for e in services[name].get("volumes", [])), \
            f"{name} keeps its data in no named volume"


def test_every_bind_mount_names_a_folder_of_the_repo(services):
    for name, service in services.items():
        for entry in service.get("volumes", []):
            if _named_volume(entry) is None:
                source = str(entry).split(":", 1)[0]
                assert (REPO_ROOT / source).is_dir(), f"{name}: {source} is not in the repo"


def test_every_image_is_pinned_to_a_tag_not_latest(services):
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    for name, service in services.items():
        image = service.get("image")
        assert image, f"{name} has no image"
        repo, _, tag = image.rpartition(":")
        assert repo and "/" not in tag and tag not in ("", "latest"), f"{name}: {image}"
    for name, service in _falkirk_services(services).items():
        assert service["image"] == f"falkirk:{project['version']}", name
    base = re.search(r"^FROM\s+(\S+)", DOCKERFILE.read_text(), re.MULTILINE).group(1)
    assert ":" in base and not base.endswith(":latest"), base


def test_every_depends_on_names_a_service(services):
    for name, service in services.items():
        for dep in service.get("depends_on") or []:
            assert dep in services, f"{name} depends on {dep!r}, which is not a service"


def test_depends_on_conditions_have_a_healthcheck_or_a_one_shot_service(services):
    for name, service in services.items():
        deps = service.get("depends_on") or {}
        for dep, spec in (deps.items() if isinstance(deps, dict) else []):
            if spec["condition"] == "service_healthy":
                assert "healthcheck" in services[dep], f"{name} waits for {dep}'s health"
            elif spec["condition"] == "service_completed_successfully":
                assert services[dep].get("restart") == "no", f"{dep} is not one-shot"


def test_every_published_port_binds_127_0_0_1(services):
    for name, service in services.items():
        for port in service.get("ports", []):
            if isinstance(port, dict):
                assert port.get("host_ip") == "127.0.0.1", f"{name}: {port}"
            else:
                assert str(port).startswith("127.0.0.1:"), f"{name}: {port}"


# --- the falkirk image ---------------------------------------------------------------------


def test_falkirk_dockerfile_installs_exactly_the_uv_lock_versions():
    text = "\n".join(line for line in DOCKERFILE.read_text().splitlines()
                     if not line.lstrip().startswith("#"))
    assert re.search(r"^COPY pyproject\.toml uv\.lock ", text, re.MULTILINE)
    syncs = re.findall(r"^RUN uv sync[^\n]*", text, re.MULTILINE)
    assert syncs and all("--locked" in s and "--no-dev" in s and "--extra cluster" in s
                         for s in syncs), syncs
    locked = _uv_lock_versions()
    for name, version in re.findall(r"([A-Za-z0-9_.\-]+)==([\w.\-]+)", text):
        key = name.lower().replace("_", "-")
        if key in locked:  # anything added on top must not change a locked package
            assert locked[key] == version, f"{name}=={version}, uv.lock: {locked[key]}"
    for pin in ("apache-airflow", "pyspark"):
        assert pin in locked, f"{pin} is not in uv.lock"


def test_falkirk_dockerfile_installs_airflows_celery_and_postgres_drivers(services):
    text = DOCKERFILE.read_text()
    locked = _uv_lock_versions()
    # Airflow 3 derives its async URL from the sync one: postgresql+<driver> -> +asyncpg.
    drivers = {"psycopg2": "psycopg2-binary", "asyncpg": "asyncpg"}
    for name, service in _airflow_services(services).items():
        scheme = urlparse(_env(service)["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]).scheme
        assert scheme.split("+")[1] in drivers, f"{name}: {scheme}"
    extra = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]["cluster"]
    assert any(d.startswith("apache-airflow[celery,postgres]") for d in extra), extra
    for package in [*drivers.values(), "apache-airflow-providers-celery", "redis"]:
        assert package in locked, f"uv.lock lacks {package}"  # locked through the extra
    assert "--extra cluster" in text


def test_falkirk_dockerfile_uses_bin_setups_uv_and_the_projects_python():
    text = DOCKERFILE.read_text()
    setup_uv = re.search(r'"uv==([\w.]+)"', (REPO_ROOT / "bin" / "setup").read_text()).group(1)
    assert re.search(rf"^ARG UV_VERSION={re.escape(setup_uv)}$", text, re.MULTILINE)
    requires = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"][
        "requires-python"]  # ==3.11.*
    python = requires.removeprefix("==").removesuffix(".*")
    base = re.search(r"^FROM\s+(\S+)", text, re.MULTILINE).group(1)
    assert base.startswith(f"python:{python}-"), base
    assert "openjdk-17-jre-headless" in text  # Spark 4 needs Java 17+
