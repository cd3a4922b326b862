# shellcheck shell=bash
# Kafka 4.x in KRaft mode, run from the Maven jars that `make setup` puts in var/kafka/lib: one
# combined broker+controller node, or with KAFKA_NODES=3 a cluster of three such nodes, each a voter
# of the controller quorum. Sourced by infra/stack.sh (needs infra/lib.sh).
#
# Each layout keeps its own state, so switching between them never mixes two clusters' metadata:
#   1 node   var/kafka/{data,logs,server.properties}, var/run/kafka.pid
#   3 nodes  var/kafka/cluster-3/node-K/{data,logs,server.properties}, var/run/kafka-K.pid
# Without KAFKA_NODES, a 3-node cluster of this stack that runs is the one `up`, `down` and `status`
# act on; otherwise the single node. `down` stops every node of either layout.
#
# The single node also listens on SASL_SSL (SCRAM-SHA-512) and on mutual TLS, with certificates
# made at the first start (KAFKA_SECURITY, infra/kafka-tls.sh).

KAFKA_ROOT=$STACK_VAR/kafka
KAFKA_CLUSTER_DIR=$KAFKA_ROOT/cluster-3
# The jars belong to the checkout, not to a stack: a second stack (TIDEGATE_STACK_VAR) shares them.
KAFKA_LIB=${TIDEGATE_STACK_KAFKA_LIB:-$STACK_REPO/var/kafka/lib}
KAFKA_HEAP=${TIDEGATE_STACK_KAFKA_HEAP:-1g}
KAFKA_TIMEOUT=${TIDEGATE_STACK_KAFKA_TIMEOUT:-90}
# Extra server.properties lines for every node (key=value, one per line), after the template's, so
# they win: e.g. a test's shorter broker.session.timeout.ms.
KAFKA_CONFIG=${TIDEGATE_STACK_KAFKA_CONFIG:-}
# Extra JVM options for every node (space-separated), after the defaults, so they win.
read -r -a KAFKA_JVM_OPTS <<<"${TIDEGATE_STACK_KAFKA_JVM_OPTS:-}"
# Matches /proc/PID/cmdline of our broker (see `ours` in lib.sh).
KAFKA_WORD=kafka.Kafka

# kafka_node LAYOUT K: sets KN_* to node K of the LAYOUT-node cluster (name, id, folder, PID file,
# ports). The single node keeps the names and paths it always had.
kafka_node() {
  KN_ID=$2
  if (($1 == 1)); then
    KN_NAME=kafka KN_DIR=$KAFKA_ROOT KN_PIDFILE=$STACK_RUN/kafka.pid
    KN_PORT=$KAFKA_PORT KN_CONTROLLER_PORT=$CONTROLLER_PORT
  else
    KN_NAME=kafka-$2 KN_DIR=$KAFKA_CLUSTER_DIR/node-$2 KN_PIDFILE=$STACK_RUN/kafka-$2.pid
    KN_PORT=${KAFKA_PORTS[$2 - 1]} KN_CONTROLLER_PORT=${CONTROLLER_PORTS[$2 - 1]}
  fi
  KN_LOG=$KN_DIR/logs/server.log
}

# kafka_jvm DIR: sets KAFKA_JVM, the command line shared by the storage tool and the broker of the
# node in DIR; log4j2 writes to DIR/logs. The JIT stays HotSpot's tiered C1 and C2 (decision 030).
kafka_jvm() {
  KAFKA_JVM=(
    java -Xms128m "-Xmx$KAFKA_HEAP" -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:+ExitOnOutOfMemoryError
    -Djava.awt.headless=true "${KAFKA_JVM_OPTS[@]}"
    "-Dlog4j2.configurationFile=$STACK_INFRA/kafka/log4j2.properties"
    "-Dkafka.logs.dir=$1/logs"
    -cp "$KAFKA_LIB/*"
  )
}

kafka_node_pid() { running_pid "$KN_NAME" "$KN_PIDFILE" "$KN_DIR" "$KAFKA_WORD"; }

# kafka_layout_running LAYOUT: some node of that layout runs.
kafka_layout_running() {
  local k
  for ((k = 1; k <= $1; k++)); do
    kafka_node "$1" "$k"
    kafka_node_pid >/dev/null 2>&1 && return 0
  done
  return 1
}

# The single node's PID (the name every caller of the single-node scripts knew).
kafka_pid() {
  kafka_node 1 1
  kafka_node_pid
}

kafka_voters() {
  local k voters=()
  for ((k = 1; k <= KAFKA_NODES; k++)); do
    kafka_node "$KAFKA_NODES" "$k"
    voters+=("$k@$STACK_HOST:$KN_CONTROLLER_PORT")
  done
  local IFS=,
  echo "${voters[*]}"
}

kafka_configure() {
  mkdir -p "$KN_DIR/data" "$KN_DIR/logs"
  sed -e "s|@NODE_ID@|$KN_ID|g" -e "s|@VOTERS@|$KAFKA_VOTERS|g" \
    -e "s|@KAFKA_PORT@|$KN_PORT|g" -e "s|@CONTROLLER_PORT@|$KN_CONTROLLER_PORT|g" \
    -e "s|@DATA_DIR@|$KN_DIR/data|g" \
    -e "s|@REPLICATION@|$KAFKA_REPLICATION|g" -e "s|@MIN_ISR@|$KAFKA_MIN_ISR|g" \
    "$STACK_INFRA/kafka/server.properties.template" >"$KN_DIR/server.properties"
  if kafka_secure; then kafka_tls_configure; fi
  if [[ -n "$KAFKA_CONFIG" ]]; then
    printf '\n# TIDEGATE_STACK_KAFKA_CONFIG\n%s\n' "$KAFKA_CONFIG" >>"$KN_DIR/server.properties"
  fi
}

# kafka_cluster_id FILE LOG: prints the cluster id kept in FILE, made once, so a rebuilt config (or
# a node formatted later) finds the same cluster.
kafka_cluster_id() {
  local file=$1
  mkdir -p "$(dirname "$file")"
  if [[ ! -s "$file" ]]; then
    kafka_jvm "$(dirname "$file")"
    "${KAFKA_JVM[@]}" kafka.tools.StorageTool random-uuid >"$file.tmp" 2>>"$2" ||
      fail_with_log kafka "$2" "making a cluster id failed"
    mv "$file.tmp" "$file"
  fi
  tr -d '[:space:]' <"$file"
}

# kafka_format CLUSTER_ID: formats the KN_* node's metadata log once.
kafka_format() {
  [[ -f "$KN_DIR/data/meta.properties" ]] && return 0
  kafka_jvm "$KN_DIR"
  # No --standalone: the voters are static (controller.quorum.voters), which 4.x requires.
  if ! "${KAFKA_JVM[@]}" kafka.tools.StorageTool format -t "$1" -c "$KN_DIR/server.properties" \
    >>"$KN_DIR/logs/format.log" 2>&1; then
    fail_with_log "$KN_NAME" "$KN_DIR/logs/format.log" "formatting the storage failed"
  fi
  log "$KN_NAME: formatted storage $KN_DIR/data (cluster id $1)"
}

# Starts the nodes that do not run, without waiting: postgres and redis start while the JVMs boot.
# On a cluster whose node died, this starts that node again and leaves the others alone.
kafka_start() {
  local k pid cid other=$((KAFKA_NODES == 1 ? 3 : 1)) todo=()
  kafka_tls_preflight
  if kafka_layout_running "$other"; then
    local which="3-node cluster"
    ((other == 1)) && which="single node"
    die "kafka: this stack's Kafka runs as a $which; stop it first (\`make down\`)"
  fi
  for ((k = 1; k <= KAFKA_NODES; k++)); do
    kafka_node "$KAFKA_NODES" "$k"
    if pid=$(kafka_node_pid); then
      log "$KN_NAME: already running (pid $pid)"
    else
      require_free_port "$KN_NAME" "$KN_PORT"
      require_free_port "$KN_NAME-controller" "$KN_CONTROLLER_PORT"
      if kafka_secure; then
        require_free_port "$KN_NAME-sasl-ssl" "$KAFKA_SASL_SSL_PORT"
        require_free_port "$KN_NAME-mtls" "$KAFKA_MTLS_PORT"
      fi
      todo+=("$k")
    fi
  done
  ((${#todo[@]})) || return 0
  compgen -G "$KAFKA_LIB/kafka_2.13-*.jar" >/dev/null ||
    die "kafka: no Kafka jars in $KAFKA_LIB: run \`make setup\`"
  if ((KAFKA_NODES == 1)); then
    mkdir -p "$KAFKA_ROOT/logs"
    cid=$(kafka_cluster_id "$KAFKA_ROOT/cluster-id" "$KAFKA_ROOT/logs/format.log")
    if kafka_secure; then kafka_tls_setup; fi
  else
    cid=$(kafka_cluster_id "$KAFKA_CLUSTER_DIR/cluster-id" "$KAFKA_CLUSTER_DIR/cluster-id.log")
  fi
  # Each format is a JVM of its own: the nodes format side by side.
  local formats=()
  for k in "${todo[@]}"; do
    kafka_node "$KAFKA_NODES" "$k"
    kafka_configure
    kafka_format "$cid" &
    formats+=("$!")
  done
  for pid in "${formats[@]}"; do
    wait "$pid" || die "kafka: formatting the storage failed"
  done
  for k in "${todo[@]}"; do
    kafka_node "$KAFKA_NODES" "$k"
    kafka_jvm "$KN_DIR"
    # stdout.log catches what log4j2 does not: JVM errors and crashes.
    spawn "$KN_PIDFILE" "$KN_DIR" "$KN_DIR/logs/stdout.log" \
      "${KAFKA_JVM[@]}" "$KAFKA_WORD" "$KN_DIR/server.properties"
    log "$KN_NAME: starting (pid $(cat "$KN_PIDFILE")) on $STACK_HOST:$KN_PORT," \
      "controller $KN_CONTROLLER_PORT"
  done
}

kafka_probe() { "$STACK_BIN/tidegate" stack check kafka --wait 3; }

# kafka_node_probe PORT ID WAIT: the node on PORT answers and lists itself among the cluster's live
# brokers (registered with the quorum, unfenced), so topics with 3 replicas can be created.
kafka_node_probe() {
  local out
  out=$(TIDEGATE_KAFKA_BOOTSTRAP_SERVERS=$STACK_HOST:$1 \
    "$STACK_BIN/tidegate" stack check kafka --wait "$3" 2>&1) || {
    echo "$out"
    return 1
  }
  if [[ "$out" != *"broker $2 at "* ]]; then
    echo "node $2 is not among the live brokers yet: $out"
    return 1
  fi
  echo "$out"
}

kafka_wait() {
  local k started=$SECONDS
  if ((KAFKA_NODES == 1)); then
    kafka_node 1 1
    wait_healthy kafka "$KAFKA_TIMEOUT" "$KN_PIDFILE" "$KN_LOG" kafka_probe
    log "kafka: healthy ($((SECONDS - started))s)"
    if kafka_secure; then kafka_tls_users; fi
    return 0
  fi
  for ((k = 1; k <= KAFKA_NODES; k++)); do
    kafka_node "$KAFKA_NODES" "$k"
    wait_healthy "$KN_NAME" "$KAFKA_TIMEOUT" "$KN_PIDFILE" "$KN_LOG" \
      kafka_node_probe "$KN_PORT" "$KN_ID" 3
  done
  log "kafka: $KAFKA_NODES nodes healthy ($((SECONDS - started))s)"
}

# kafka_nodes_known: "LAYOUT K" of every node of the current layout, and of the other layout's
# nodes that have a PID file (so `down` stops them too, and `status` shows them).
kafka_nodes_known() {
  local layout k
  for layout in 1 3; do
    for ((k = 1; k <= layout; k++)); do
      kafka_node "$layout" "$k"
      if ((layout == KAFKA_NODES)) || [[ -f "$KN_PIDFILE" ]]; then echo "$layout $k"; fi
    done
  done
}

# shellcheck disable=SC2086 # "LAYOUT K" splits into kafka_node's two arguments
kafka_stop() {
  local nodes node pid i names=() pidfiles=() pids=()
  mapfile -t nodes < <(kafka_nodes_known)
  # Every node is told at once: stopped one by one, the last node's broker would wait for a
  # controlled shutdown that a quorum without its majority never approves (until SIGKILL).
  for node in "${nodes[@]}"; do
    kafka_node $node
    if ! pid=$(kafka_node_pid); then
      log "$KN_NAME: not running"
      continue
    fi
    kill -s TERM "$pid" 2>/dev/null || true
    names+=("$KN_NAME") pidfiles+=("$KN_PIDFILE") pids+=("$pid")
  done
  for i in "${!pids[@]}"; do
    await_exit "${names[$i]}" "${pidfiles[$i]}" "${pids[$i]}"
  done
}

# shellcheck disable=SC2086 # as in kafka_stop
kafka_status() {
  local nodes node pid failed=0 probe
  mapfile -t nodes < <(kafka_nodes_known)
  for node in "${nodes[@]}"; do
    kafka_node $node
    if ! pid=$(kafka_node_pid 2>/dev/null); then
      server_line "$KN_NAME" down "" "$STACK_HOST:$KN_PORT"
      failed=1
      continue
    fi
    if [[ "$KN_NAME" == kafka ]]; then probe=(kafka_probe_once); else
      probe=(kafka_node_probe "$KN_PORT" "$KN_ID" 0)
    fi
    if ! "${probe[@]}" >/dev/null 2>&1; then
      server_line "$KN_NAME" unhealthy "$pid" "$STACK_HOST:$KN_PORT (log: $KN_LOG)"
      failed=1
      continue
    fi
    local secure=""
    if kafka_secure && [[ "$KN_NAME" == kafka ]] && kafka_tls_listening; then
      secure="; SASL_SSL $KAFKA_SASL_SSL_PORT, mTLS $KAFKA_MTLS_PORT"
    fi
    server_line "$KN_NAME" up "$pid" "$STACK_HOST:$KN_PORT (controller $KN_CONTROLLER_PORT$secure)"
  done
  return "$failed"
}

kafka_probe_once() { "$STACK_BIN/tidegate" stack check kafka; }

# Some node of the current layout runs (then its topics can be listed).
kafka_any_running() { kafka_layout_running "$KAFKA_NODES"; }

if [[ -z "$KAFKA_NODES" ]]; then
  KAFKA_NODES=1
  if kafka_layout_running 3; then KAFKA_NODES=3; fi
fi
case "$KAFKA_NODES" in
1)
  KAFKA_REPLICATION=1 KAFKA_MIN_ISR=1
  ;;
3)
  ((${#KAFKA_PORTS[@]} == 3 && ${#CONTROLLER_PORTS[@]} == 3)) ||
    die "kafka: TIDEGATE_STACK_{KAFKA,CONTROLLER}_PORTS need one port per node (3 each)"
  KAFKA_REPLICATION=3 KAFKA_MIN_ISR=2
  # Every node is a bootstrap server: clients started while one node is down still find the cluster.
  TIDEGATE_KAFKA_BOOTSTRAP_SERVERS=$(printf "$STACK_HOST:%s," "${KAFKA_PORTS[@]}")
  export TIDEGATE_KAFKA_BOOTSTRAP_SERVERS=${TIDEGATE_KAFKA_BOOTSTRAP_SERVERS%,}
  ;;
*) die "kafka: KAFKA_NODES must be 1 or 3, not '$KAFKA_NODES'" ;;
esac
KAFKA_VOTERS=$(kafka_voters)
# shellcheck source=infra/kafka-tls.sh
source "$STACK_INFRA/kafka-tls.sh"
# `tidegate stack topics` and the registry (for its own topic) give every topic a replica per node.
export TIDEGATE_TOPICS_REPLICATION_FACTOR=$KAFKA_REPLICATION
