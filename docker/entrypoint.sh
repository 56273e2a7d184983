#!/bin/sh
# Entry point of the falkirk image. On one machine falkirk binds Spark to 127.0.0.1
# (SPARK_LOCAL_IP's default in falkirk.procs); in compose a driver must be reachable
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
exec "$@"
