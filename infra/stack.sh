#!/usr/bin/env bash
# The local stack: Kafka (KRaft), the schema registry, PostgreSQL and Redis, all state in var/.
#
#   bash infra/stack.sh up       start what is not running, wait until all is healthy (idempotent)
#   bash infra/stack.sh down     stop what `up` started, by PID file
#   bash infra/stack.sh status   each server and each topic; exit 1 if something is down
#
# KAFKA_NODES=3 (`make up KAFKA_NODES=3`) runs Kafka as a 3-node cluster whose topics have 3
# replicas and min.insync.replicas=2 (docs/kafka-cluster.md); the default, 1, is the single node.
#
# Overrides (a second stack, e.g. in tests): TIDEGATE_STACK_VAR, TIDEGATE_STACK_KAFKA_PORT,
# TIDEGATE_STACK_CONTROLLER_PORT, TIDEGATE_STACK_KAFKA_PORTS and TIDEGATE_STACK_CONTROLLER_PORTS
# (the cluster's, comma lists), TIDEGATE_STACK_PG_PORT, TIDEGATE_STACK_REDIS_PORT,
# TIDEGATE_STACK_REGISTRY_PORT, TIDEGATE_STACK_SERVICES (default kafka,registry,postgres,redis),
# TIDEGATE_STACK_{KAFKA,PG,REDIS,REGISTRY}_TIMEOUT, TIDEGATE_STACK_STOP_TIMEOUT,
# TIDEGATE_STACK_KAFKA_HEAP (default 1g), TIDEGATE_STACK_KAFKA_CONFIG (extra server.properties
# lines), TIDEGATE_STACK_KAFKA_JVM_OPTS (extra JVM options). `prometheus` in
# TIDEGATE_STACK_SERVICES (`make observe`) adds a local Prometheus
# (TIDEGATE_STACK_PROMETHEUS_{PORT,TARGETS,SCRAPE}, infra/prometheus.sh).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
# shellcheck source=infra/lib.sh
source "$here/lib.sh"
# shellcheck source=infra/kafka.sh
source "$here/kafka.sh"
# shellcheck source=infra/postgres.sh
source "$here/postgres.sh"
# shellcheck source=infra/redis.sh
source "$here/redis.sh"
# shellcheck source=infra/registry.sh
source "$here/registry.sh"
# shellcheck source=infra/prometheus.sh
source "$here/prometheus.sh"

stack_topics() {
  local out
  out=$("$STACK_BIN/tidegate" stack topics 2>&1) || {
    echo "$out" >&2
    die "topics: \`tidegate stack topics\` failed"
  }
  local line
  while IFS= read -r line; do log "topics: $line"; done <<<"$out"
}

stack_up() {
  if enabled registry && ! enabled kafka; then
    die "the registry needs Kafka: add kafka to TIDEGATE_STACK_SERVICES"
  fi
  # Kafka's JVM is the slowest to boot: start it first and let postgres and redis start meanwhile.
  if enabled kafka; then kafka_start; fi
  if enabled postgres; then pg_up; fi
  if enabled redis; then redis_up; fi
  if enabled kafka; then
    kafka_wait
    stack_topics
  fi
  if enabled registry; then registry_up; fi
  if enabled prometheus; then prom_up; fi
  log "stack: up ($STACK_SERVICES; state in $STACK_VAR)"
}

# Reverse dependency order: the registry writes to Kafka, so it goes first.
stack_down() {
  # Started only on request (`make observe`), so stopped whenever it runs.
  if enabled prometheus || prom_pid >/dev/null 2>&1; then prom_stop; fi
  if enabled registry; then registry_stop; fi
  if enabled kafka; then kafka_stop; fi
  if enabled redis; then redis_stop; fi
  if enabled postgres; then pg_stop; fi
}

stack_status() {
  local failed=0
  server_line SERVER STATE PID ADDRESS
  if enabled kafka; then kafka_status || failed=1; fi
  if enabled registry; then registry_status || failed=1; fi
  if enabled postgres; then pg_status || failed=1; fi
  if enabled redis; then redis_status || failed=1; fi
  if enabled prometheus || prom_pid >/dev/null 2>&1; then prom_status || failed=1; fi
  if enabled kafka && kafka_any_running; then
    echo
    "$STACK_BIN/tidegate" stack status || failed=1
  fi
  return "$failed"
}

case "${1:-}" in
up) stack_up ;;
down) stack_down ;;
status) stack_status ;;
*)
  echo "usage: bash infra/stack.sh up|down|status" >&2
  exit 2
  ;;
esac
