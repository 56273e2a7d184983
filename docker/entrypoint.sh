#!/bin/sh
# Entry point of the falkirk image. On one machine falkirk binds Spark to 127.0.0.1
# (SPARK_LOCAL_IP's default in falkirk.runtime.procs); in compose a driver must be reachable
# from the spark-worker container, so Spark binds and advertises this container's own
# address and name unless the service sets them.
set -eu
if [ -z "${SPARK_LOCAL_IP:-}" ]; then
  SPARK_LOCAL_IP=$(python -c 'import socket; print(socket.gethostbyname(socket.gethostname()))')
  export SPARK_LOCAL_IP
fi
if [ -z "${SPARK_LOCAL_HOSTNAME:-}" ]; then
  SPARK_LOCAL_HOSTNAME=$(python -c 'import socket; print(socket.gethostname())')
  export SPARK_LOCAL_HOSTNAME
fi
# The Airflow admin's password comes from the environment (.env), never from the image.
if [ -n "${FALKIRK_AIRFLOW_PASSWORD:-}" ] && [ -n "${AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE:-}" ]; then
  (umask 077; printf '{"admin": "%s"}\n' "$FALKIRK_AIRFLOW_PASSWORD" \
    > "$AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE")
fi
exec "$@"
