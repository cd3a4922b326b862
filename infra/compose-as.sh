#!/bin/sh
# The entrypoint of docker-compose.yml's tidegate services that use Kafka:
#
#   compose-as.sh COMPONENT ARGS...
#
# runs `tidegate ARGS...` as COMPONENT's own Kafka principal, with the TIDEGATE_KAFKA_* settings
# (listener, SASL user and password) that the kafka-setup service left in
# $TIDEGATE_KAFKA_ENV_DIR/COMPONENT.env (`tidegate stack kafka-principals`, docs/security.md).
set -eu
component=$1
shift
env_file=${TIDEGATE_KAFKA_ENV_DIR:-/app/var/kafka}/$component.env
if [ ! -r "$env_file" ]; then
  echo "compose-as: $env_file is missing: the kafka-setup service writes it" >&2
  exit 1
fi
set -a
. "$env_file"
set +a
exec tidegate "$@"
