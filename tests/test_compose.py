"""docker-compose.yml, validated offline (no docker engine here): docker-compose v1 accepts it,
and it agrees with the code's "compose" profile (falkirk.config), bin/airflow and uv.lock.

Nothing here starts a container; every test reads files only (plus one `docker-compose config`).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml

from falkirk.config import PROFILES, REPO_ROOT

COMPOSE_FILE = REPO_ROOT / "docker-compose.yml"
DOCKERFILE = REPO_ROOT / "docker" / "falkirk.Dockerfile"
SPARK_DEFAULTS = REPO_ROOT / "docker" / "spark" / "spark-defaults.conf"
CFG = PROFILES["compose"]
STORAGE = dict(CFG.storage_options)  # without the credentials: those come from .env
SECRETS = {"FALKIRK_S3_ACCESS_KEY": "AWS_ACCESS_KEY_ID", "FALKIRK_S3_SECRET_KEY":
           "AWS_SECRET_ACCESS_KEY", "FALKIRK_POSTGRES_PASSWORD": None,
           "FALKIRK_AIRFLOW_SECRET": None, "FALKIRK_AIRFLOW_PASSWORD": None}


def _secret(variable: str) -> str:
    """How compose reads a secret: from .env, refusing to start without it."""
    return "${" + variable + ":?set in .env, see docs/compose.md}"
AIRFLOW_COMPONENTS = {"api-server", "scheduler", "dag-processor", "triggerer"}


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


def _uv_lock_versions() -> dict[str, str]:
    lock = tomllib.loads((REPO_ROOT / "uv.lock").read_text())
    return {p["name"]: p["version"] for p in lock["package"] if "version" in p}


def _bin_airflow_exports() -> dict[str, str]:
    """AIRFLOW__* settings bin/airflow exports (values as written, unexpanded)."""
    text = (REPO_ROOT / "bin" / "airflow").read_text()
    return dict(re.findall(r"^export (AIRFLOW__\w+)=(\S*)", text, re.MULTILINE))


def _named_volume(entry) -> str | None:
    """The named volume of a service's volume entry (None for a bind mount)."""
    if isinstance(entry, dict):
        return entry["source"] if entry.get("type", "volume") == "volume" else None
    source = str(entry).split(":", 1)[0]
    if ":" not in str(entry) or source.startswith((".", "/", "~", "$")):
        return None
    return source


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


def test_no_secret_is_written_in_the_compose_files():
    """Credentials and passwords are read from .env, never kept in the repository."""
    text = COMPOSE_FILE.read_text() + SPARK_DEFAULTS.read_text() + DOCKERFILE.read_text()
    for word in ("falkirk-secret", "change-me", '"admin": "admin"',
                 "access.key", "secret.key", "POSTGRES_PASSWORD: airflow"):
        assert word not in text, word


# --- consistency with falkirk.config's compose profile ----------------------------------------


def test_kafka_bootstrap_is_the_kafka_service_and_its_advertised_listener(services):
    host, port = CFG.kafka_bootstrap.rsplit(":", 1)
    assert host in services, f"no service {host!r} for kafka_bootstrap {CFG.kafka_bootstrap}"
    env = _env(services[host])
    advertised = dict(reversed(item.split("://", 1))
                      for item in env["KAFKA_ADVERTISED_LISTENERS"].split(","))
    assert CFG.kafka_bootstrap in advertised, env["KAFKA_ADVERTISED_LISTENERS"]
    name = advertised[CFG.kafka_bootstrap]
    listeners = dict(item.split("://", 1) for item in env["KAFKA_LISTENERS"].split(","))
    assert listeners[name].rsplit(":", 1)[1] == port, "the listener binds another port"
    protocols = dict(item.split(":") for item in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"]
                     .split(","))
    assert protocols[name] == "PLAINTEXT"  # falkirk's kafka-python clients set no security
    assert CFG.kafka_bootstrap in " ".join(services[host]["healthcheck"]["test"])


def test_topics_no_one_creates_get_their_declared_partitions_on_auto_create(services):
    from falkirk.model.topology import declared, load_pipeline
    from falkirk_dev.generate import EVENTS_TOPIC, QUERIES_TOPIC

    env = _env(services[CFG.kafka_bootstrap.rsplit(":", 1)[0]])
    created_by_generate = {EVENTS_TOPIC, QUERIES_TOPIC}
    auto = {(e.topic, e.partitions) for name in declared()
            for e in load_pipeline(name).edges.values()
            if e.kind == "kafka" and e.topic not in created_by_generate}
    assert auto, "every topic is created explicitly: drop this test"
    assert env.get("KAFKA_AUTO_CREATE_TOPICS_ENABLE") == "true"
    for topic, partitions in auto:
        assert env["KAFKA_NUM_PARTITIONS"] == str(partitions), topic


def test_spark_master_url_is_the_spark_master_service_on_its_port(services):
    url = urlparse(CFG.spark_master)
    assert url.scheme == "spark"
    assert url.hostname in services, f"no service {url.hostname!r} for {CFG.spark_master}"
    master = services[url.hostname]
    cmd = _command(master)
    assert "org.apache.spark.deploy.master.Master" in cmd
    assert cmd[cmd.index("--port") + 1] == str(url.port)
    assert cmd[cmd.index("--host") + 1] == url.hostname
    workers = [s for s in services.values()
               if "org.apache.spark.deploy.worker.Worker" in _command(s)]
    assert workers, "no Spark worker"
    assert all(CFG.spark_master in _command(w) for w in workers)


def test_cluster_drivers_keep_the_jvms_default_compilers_and_collector(monkeypatch):
    """The local profile's C1-only, serial-GC driver options are for four short-lived JVMs
    on 2 cores; the compose profile's long-lived drivers keep the JVM defaults."""
    from falkirk.config import load

    assert "spark.driver.extraJavaOptions" not in CFG.spark_launch_conf
    monkeypatch.setenv("FALKIRK_SPARK_DRIVER_JAVA_OPTIONS", "")
    assert "spark.driver.extraJavaOptions" not in load("local").spark_launch_conf


def test_airflow_spark_default_connection_is_the_profiles_spark_master(services):
    # SparkSubmitHook reads the URI spark://host:port as master spark://host:port.
    for name, service in _airflow_services(services).items():
        assert _env(service).get("AIRFLOW_CONN_SPARK_DEFAULT") == CFG.spark_master, name


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


def test_storage_options_match_the_minio_service(services):
    endpoint = urlparse(STORAGE["AWS_ENDPOINT_URL"])
    assert endpoint.hostname in services, f"no service {endpoint.hostname!r}"
    minio = services[endpoint.hostname]
    env = _env(minio)
    assert env["MINIO_ROOT_USER"] == _secret("FALKIRK_S3_ACCESS_KEY")
    assert env["MINIO_ROOT_PASSWORD"] == _secret("FALKIRK_S3_SECRET_KEY")
    assert env["MINIO_SITE_REGION"] == STORAGE["AWS_REGION"]
    cmd = _command(minio)
    assert cmd[cmd.index("--address") + 1] == f":{endpoint.port}"
    assert "--certs-dir" not in cmd  # no TLS: plain HTTP, as AWS_ALLOW_HTTP says
    assert endpoint.scheme == "http" and STORAGE["AWS_ALLOW_HTTP"] == "true"


def test_lake_bucket_is_created_by_the_minio_init_service(services):
    lake = urlparse(CFG.lake)
    assert lake.scheme == "s3"
    creators = {name: s for name, s in services.items() if _command(s)[:1] == ["mb"]}
    assert list(creators) == ["minio-init"]
    init = creators["minio-init"]
    alias, bucket = _command(init)[-1].split("/", 1)
    assert bucket == lake.hostname, f"creates bucket {bucket!r}, the lake is in {lake.hostname!r}"
    # mc's alias from the environment: http://KEY:SECRET@host:port, the keys from .env.
    credentials, _, address = _env(init)[f"MC_HOST_{alias}"].rpartition("@")
    endpoint = urlparse(STORAGE["AWS_ENDPOINT_URL"])
    assert f"{endpoint.scheme}://{address}" == STORAGE["AWS_ENDPOINT_URL"]
    assert credentials == (f"{endpoint.scheme}://${{FALKIRK_S3_ACCESS_KEY:?set in .env}}:"
                           "${FALKIRK_S3_SECRET_KEY:?set in .env}")
    assert init["depends_on"][endpoint.hostname]["condition"] == "service_healthy"
    assert init.get("restart") == "no"


def test_spark_s3a_settings_match_the_storage_options():
    conf = {}
    for line in SPARK_DEFAULTS.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, value = line.split(None, 1)
            conf[key] = value.strip()
    s3a = "spark.hadoop.fs.s3a."
    assert conf[s3a + "endpoint"] == STORAGE["AWS_ENDPOINT_URL"]
    assert conf[s3a + "aws.credentials.provider"].endswith(
        "EnvironmentVariableCredentialsProvider")  # AWS_ACCESS_KEY_ID etc. from .env
    assert conf[s3a + "endpoint.region"] == STORAGE["AWS_REGION"]
    assert conf[s3a + "path.style.access"] == "true"  # MinIO buckets are not DNS names
    assert conf[s3a + "connection.ssl.enabled"] == "false"


def test_spark_packages_match_the_pinned_pyspark_and_the_jars_come_from_the_image():
    packages = dict(p.rsplit(":", 1) for p in re.search(
        r"^spark\.jars\.packages\s+(\S+)", SPARK_DEFAULTS.read_text(), re.MULTILINE
    ).group(1).split(","))
    pyspark = Path(importlib.util.find_spec("pyspark").origin).parent
    [hadoop_jar] = (pyspark / "jars").glob("hadoop-client-api-*.jar")
    hadoop = hadoop_jar.stem.removeprefix("hadoop-client-api-")
    assert packages == {"org.apache.hadoop:hadoop-aws": hadoop}  # the Hadoop inside pyspark
    # delta-spark and the Kafka connector: the image fetches falkirk/jvm/*/pom.xml at build
    # time, as bin/setup does.
    assert "falkirk jars" in DOCKERFILE.read_text()


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


def test_airflow_runs_on_postgres_with_local_executor_and_parallelism_at_most_4(services):
    for name, service in _airflow_services(services).items():
        env = _env(service)
        conn = env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
        password = _secret("FALKIRK_POSTGRES_PASSWORD")
        db = urlparse(conn.replace(password, "PASSWORD"))  # urlparse cannot read ${...}
        assert db.scheme.startswith("postgresql"), name
        pg = _env(services[db.hostname])
        assert (db.username, db.path.lstrip("/")) == (pg["POSTGRES_USER"], pg["POSTGRES_DB"])
        assert db.password == "PASSWORD" and pg["POSTGRES_PASSWORD"] == password
        assert service["depends_on"][db.hostname]["condition"] == "service_healthy"
        assert env["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"
        assert int(env["AIRFLOW__CORE__PARALLELISM"]) <= 4


def test_airflow_dags_and_plugins_folders_are_the_repos_dags_and_plugins(services):
    for name, service in _airflow_services(services).items():
        env = _env(service)
        mounts = {}
        for entry in service["volumes"]:
            source, target = str(entry).split(":")[:2]
            mounts[target] = source
        assert mounts[env["AIRFLOW__CORE__DAGS_FOLDER"]] == "./dags", name
        assert mounts[env["AIRFLOW__CORE__PLUGINS_FOLDER"]] == "./plugins", name


def test_airflow_settings_mirror_bin_airflow(services):
    exported = _bin_airflow_exports()
    # Values that hold anywhere; the others name this machine's paths and ports.
    same = ["AIRFLOW__CORE__EXECUTOR", "AIRFLOW__CORE__PARALLELISM",
            "AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG", "AIRFLOW__CORE__LOAD_EXAMPLES",
            "AIRFLOW__CORE__AUTH_MANAGER", "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS",
            "AIRFLOW__API__WORKERS", "AIRFLOW__SCHEDULER__STANDALONE_DAG_PROCESSOR"]
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
            if want == "$executor":  # bin/airflow takes it from the profile (FALKIRK_ENV)
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
    for name in ("postgres", "kafka", "minio"):
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
    assert syncs and all("--locked" in s and "--no-dev" in s and "--extra postgres" in s
                         for s in syncs), syncs
    locked = _uv_lock_versions()
    for name, version in re.findall(r"([A-Za-z0-9_.\-]+)==([\w.\-]+)", text):
        key = name.lower().replace("_", "-")
        if key in locked:  # anything added on top must not change a locked package
            assert locked[key] == version, f"{name}=={version}, uv.lock: {locked[key]}"
    for pin in ("apache-airflow", "pyspark"):
        assert pin in locked, f"{pin} is not in uv.lock"


def test_falkirk_dockerfile_installs_airflows_sync_and_async_postgres_drivers(services):
    text = DOCKERFILE.read_text()
    locked = _uv_lock_versions()
    # Airflow 3 derives its async URL from the sync one: postgresql+<driver> -> +asyncpg.
    drivers = {"psycopg2": "psycopg2-binary", "asyncpg": "asyncpg"}
    for name, service in _airflow_services(services).items():
        scheme = urlparse(_env(service)["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]).scheme
        assert scheme.split("+")[1] in drivers, f"{name}: {scheme}"
    extra = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]["postgres"]
    assert any(d.startswith("apache-airflow[postgres]") for d in extra), extra
    for package in drivers.values():  # locked through the postgres extra, not pinned apart
        assert package in locked, f"uv.lock lacks {package}"
    assert "--extra postgres" in text


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


def test_compose_runs_the_kafka_version_the_embedded_broker_runs(services):
    """One Kafka version: the embedded broker's jars (falkirk/jvm/kafka/pom.xml) and
    compose's."""
    from falkirk.io.jars import pom

    pom = pom("kafka").read_text()
    version = re.search(r"<kafka.version>([^<]+)</kafka.version>", pom).group(1)
    assert services["kafka"]["image"] == f"apache/kafka:{version}"
