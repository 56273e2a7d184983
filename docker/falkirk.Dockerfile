# syntax=docker/dockerfile:1
# The falkirk image: one Python environment for Airflow (api-server, scheduler,
# dag-processor, triggerer, Celery workers) AND the Spark master/workers of
# docker-compose.yml. Spark
# runs from the pyspark wheel of the same venv, so the driver (in an Airflow task),
# the executors and their Python workers all have pyspark 4.2.0, deltalake and falkirk
# at the same path (/opt/venv/bin/python), exactly as uv.lock pins them.
#
#   docker compose build          (or: docker build -f docker/falkirk.Dockerfile .)
#
# Bookworm, not trixie: Spark 4 needs Java 17+, and bookworm ships openjdk-17.
FROM python:3.11-slim-bookworm

# The uv bin/setup installs, so the image resolves uv.lock the same way.
ARG UV_VERSION=0.13.8

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    UV_PROJECT_ENVIRONMENT=/opt/venv \
    UV_PYTHON_DOWNLOADS=never \
    UV_LINK_MODE=copy \
    UV_COMPILE_BYTECODE=1

# Java for Spark (driver, master, worker, executors); procps for ps in Spark's scripts.
# The man1 folder: the JRE's postinst links its man pages there (absent on slim images).
RUN set -eux; \
    mkdir -p /usr/share/man/man1; \
    apt-get update; \
    apt-get install -y --no-install-recommends openjdk-17-jre-headless procps maven; \
    rm -rf /var/lib/apt/lists/*; \
    java -version

RUN pip install --no-cache-dir "uv==${UV_VERSION}"

WORKDIR /opt/falkirk

# Dependencies first (cached until pyproject.toml or uv.lock change): exactly uv.lock,
# with the cluster extra (Airflow's Celery executor and PostgreSQL drivers).
COPY pyproject.toml uv.lock ./
RUN uv sync --locked --no-dev --extra cluster --no-install-project

# The repository, then falkirk itself (editable: compose mounts examples/ and
# plugins/ over these copies, so an edit on the host is what every service runs).
COPY . .
RUN uv sync --locked --no-dev --extra cluster

# The JVM parts (Spark's Kafka connector, delta-spark, hadoop-aws with the AWS SDK, the
# Kafka and S3Proxy jars) from Maven Central with `falkirk jars`, as bin/setup does: jobs
# load them with spark.jars and the class path (the compose profile's object_store_jars),
# never at start. No class-data archive (falkirk.io.classdata): a build runs no JVM.
RUN set -eux; \
    FALKIRK_JARS_DIR=/opt/falkirk/jvm/lib /opt/venv/bin/falkirk jars --no-class-data; \
    rm -rf /root/.m2

# A non-root user (uid 50000, group 0 as in Airflow's own image); the folders that
# compose mounts named volumes on are created here so the volumes inherit the owner.
# passwords.json: written at start by docker/entrypoint.sh from FALKIRK_AIRFLOW_PASSWORD.
RUN set -eux; \
    useradd --uid 50000 --gid 0 --create-home --home-dir /home/falkirk falkirk; \
    mkdir -p /opt/airflow/logs /opt/falkirk/var; \
    chown -R falkirk:0 /opt/airflow /opt/falkirk/var; \
    chmod -R g+rwX /opt/airflow /opt/falkirk/var

ENV PATH=/opt/venv/bin:$PATH \
    AIRFLOW_HOME=/opt/airflow \
    PYSPARK_PYTHON=/opt/venv/bin/python \
    PYSPARK_DRIVER_PYTHON=/opt/venv/bin/python \
    SPARK_WORKER_DIR=/tmp/spark-work

USER falkirk
ENTRYPOINT ["/bin/sh", "/opt/falkirk/docker/entrypoint.sh"]
CMD ["falkirk", "--help"]
