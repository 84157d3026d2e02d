#!/usr/bin/env bash
# Start a local Spark Connect server in the FOREGROUND (the caller owns the pid).
# usage: start-connect.sh PORT WORKDIR [extra spark-submit args...]
set -euo pipefail
PORT=${1:?port}; WORK=${2:?workdir}; shift 2
V=${TALLY_SPARK_VENV:-$HOME/.cache/tally-spark/4.3.0}
export SPARK_HOME=$V/lib/python3.11/site-packages/pyspark
export SPARK_LOCAL_IP=127.0.0.1 SPARK_LOCAL_DIRS=$WORK/local SPARK_LOG_DIR=$WORK/logs SPARK_CONF_DIR=$WORK/conf
export PYSPARK_PYTHON=$V/bin/python
mkdir -p "$WORK/local" "$WORK/logs" "$WORK/conf" "$WORK/warehouse" "$WORK/derby"
exec "$SPARK_HOME/bin/spark-submit" \
  --class org.apache.spark.sql.connect.service.SparkConnectServer \
  --name tally-spark-connect \
  --master 'local[2]' \
  --driver-memory "${TALLY_SPARK_DRIVER_MEMORY:-1g}" \
  --conf spark.connect.grpc.binding.address=127.0.0.1 \
  --conf spark.connect.grpc.binding.port="$PORT" \
  --conf spark.driver.host=127.0.0.1 \
  --conf spark.driver.bindAddress=127.0.0.1 \
  --conf spark.ui.enabled=false \
  --conf spark.sql.session.timeZone=UTC \
  --conf spark.sql.ansi.enabled=true \
  --conf spark.sql.shuffle.partitions=2 \
  --conf spark.sql.warehouse.dir="$WORK/warehouse" \
  --conf spark.driver.extraJavaOptions="-Dderby.system.home=$WORK/derby -Duser.timezone=UTC" \
  "$@"
