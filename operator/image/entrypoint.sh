#!/bin/bash
# Entrypoint of the dstream image. Spark on Kubernetes starts executor pods from this image with
# the single argument `executor` and describes the executor in SPARK_* variables; this starts
# the executor JVM the way Spark's own image does (apache/spark-docker entrypoint.sh). Anything
# else (the operator, `python -m dstream.service.driver`, `dstream run`) runs as given.
set -eo pipefail

if [ -z "${JAVA_HOME:-}" ]; then
  JAVA_HOME="$(java -XshowSettings:properties -version 2>&1 >/dev/null | awk '/java.home/ {print $3}')"
fi

SPARK_CLASSPATH="${SPARK_CLASSPATH:+$SPARK_CLASSPATH:}${SPARK_HOME}/jars/*"
if [ -n "${SPARK_EXTRA_CLASSPATH:-}" ]; then
  SPARK_CLASSPATH="$SPARK_CLASSPATH:$SPARK_EXTRA_CLASSPATH"
fi
if [ -n "${SPARK_CONF_DIR:-}" ]; then
  SPARK_CLASSPATH="$SPARK_CONF_DIR:$SPARK_CLASSPATH"
fi
# SPARK-43540: the working directory is on the executor's classpath.
SPARK_CLASSPATH="$SPARK_CLASSPATH:$PWD"

# Spark passes executor JVM options as SPARK_JAVA_OPT_0, SPARK_JAVA_OPT_1, ...
SPARK_EXECUTOR_JAVA_OPTS=()
for option in "${!SPARK_JAVA_OPT_@}"; do
  SPARK_EXECUTOR_JAVA_OPTS+=("${!option}")
done

case "${1:-}" in
  executor)
    shift
    exec "${JAVA_HOME}/bin/java" \
      "${SPARK_EXECUTOR_JAVA_OPTS[@]}" \
      -Xms"$SPARK_EXECUTOR_MEMORY" \
      -Xmx"$SPARK_EXECUTOR_MEMORY" \
      -cp "$SPARK_CLASSPATH${SPARK_DIST_CLASSPATH:+:$SPARK_DIST_CLASSPATH}" \
      org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
      --driver-url "$SPARK_DRIVER_URL" \
      --executor-id "$SPARK_EXECUTOR_ID" \
      --cores "$SPARK_EXECUTOR_CORES" \
      --app-id "$SPARK_APPLICATION_ID" \
      --hostname "$SPARK_EXECUTOR_POD_IP" \
      --resourceProfileId "$SPARK_RESOURCE_PROFILE_ID" \
      --podName "$SPARK_EXECUTOR_POD_NAME"
    ;;
  *)
    exec "$@"
    ;;
esac
