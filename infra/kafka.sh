# shellcheck shell=bash
# Kafka 4.x in KRaft mode, one combined broker+controller node, run from the Maven jars that
# `make setup` puts in var/kafka/lib. Sourced by infra/stack.sh (needs infra/lib.sh).

KAFKA_DIR=$STACK_VAR/kafka
KAFKA_PIDFILE=$STACK_RUN/kafka.pid
KAFKA_LOG=$KAFKA_DIR/logs/server.log
# The jars belong to the checkout, not to a stack: a second stack (TIDEGATE_STACK_VAR) shares them.
KAFKA_LIB=${TIDEGATE_STACK_KAFKA_LIB:-$STACK_REPO/var/kafka/lib}
KAFKA_HEAP=${TIDEGATE_STACK_KAFKA_HEAP:-1g}
KAFKA_TIMEOUT=${TIDEGATE_STACK_KAFKA_TIMEOUT:-90}
# Matches /proc/PID/cmdline of our broker (see `ours` in lib.sh).
KAFKA_WORD=kafka.Kafka

# The JVM command line shared by the storage tool and the broker; log4j2 writes to var/kafka/logs.
KAFKA_JVM=(
  java -Xms128m "-Xmx$KAFKA_HEAP" -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:+ExitOnOutOfMemoryError
  -Djava.awt.headless=true
  "-Dlog4j2.configurationFile=$STACK_INFRA/kafka/log4j2.properties"
  "-Dkafka.logs.dir=$KAFKA_DIR/logs"
  -cp "$KAFKA_LIB/*"
)

kafka_java() { "${KAFKA_JVM[@]}" "$@"; }

kafka_pid() { running_pid kafka "$KAFKA_PIDFILE" "$KAFKA_DIR" "$KAFKA_WORD"; }

kafka_configure() {
  mkdir -p "$KAFKA_DIR/data" "$KAFKA_DIR/logs"
  sed -e "s|@KAFKA_PORT@|$KAFKA_PORT|g" -e "s|@CONTROLLER_PORT@|$CONTROLLER_PORT|g" \
    -e "s|@DATA_DIR@|$KAFKA_DIR/data|g" \
    "$STACK_INFRA/kafka/server.properties.template" >"$KAFKA_DIR/server.properties"
}

# Formats the metadata log once; the cluster id is kept so a rebuilt config finds the same cluster.
kafka_format() {
  [[ -f "$KAFKA_DIR/data/meta.properties" ]] && return 0
  local cid_file=$KAFKA_DIR/cluster-id cid
  if [[ ! -s "$cid_file" ]]; then
    kafka_java kafka.tools.StorageTool random-uuid >"$cid_file.tmp" 2>>"$KAFKA_DIR/logs/format.log"
    mv "$cid_file.tmp" "$cid_file"
  fi
  cid=$(tr -d '[:space:]' <"$cid_file")
  # No --standalone: the voters are static (controller.quorum.voters), which 4.x requires.
  if ! kafka_java kafka.tools.StorageTool format -t "$cid" -c "$KAFKA_DIR/server.properties" \
    >>"$KAFKA_DIR/logs/format.log" 2>&1; then
    fail_with_log kafka "$KAFKA_DIR/logs/format.log" "formatting the storage failed"
  fi
  log "kafka: formatted storage $KAFKA_DIR/data (cluster id $cid)"
}

# Starts the broker without waiting: postgres and redis start while the JVM boots.
kafka_start() {
  local pid
  if pid=$(kafka_pid); then
    log "kafka: already running (pid $pid)"
    return 0
  fi
  compgen -G "$KAFKA_LIB/kafka_2.13-*.jar" >/dev/null ||
    die "kafka: no Kafka jars in $KAFKA_LIB: run \`make setup\`"
  require_free_port kafka "$KAFKA_PORT"
  require_free_port kafka-controller "$CONTROLLER_PORT"
  kafka_configure
  kafka_format
  # stdout.log catches what log4j2 does not: JVM errors and crashes.
  spawn "$KAFKA_PIDFILE" "$KAFKA_DIR" "$KAFKA_DIR/logs/stdout.log" \
    "${KAFKA_JVM[@]}" "$KAFKA_WORD" "$KAFKA_DIR/server.properties"
  log "kafka: starting (pid $(cat "$KAFKA_PIDFILE")) on $STACK_HOST:$KAFKA_PORT, controller $CONTROLLER_PORT"
}

kafka_probe() { "$STACK_BIN/tidegate" stack check kafka --wait 3; }

kafka_wait() {
  local started=$SECONDS
  wait_healthy kafka "$KAFKA_TIMEOUT" "$KAFKA_PIDFILE" "$KAFKA_LOG" kafka_probe
  log "kafka: healthy ($((SECONDS - started))s)"
}

kafka_stop() { stop_pid kafka "$KAFKA_PIDFILE" "$KAFKA_DIR" "$KAFKA_WORD" TERM; }

kafka_status() {
  local pid
  if ! pid=$(kafka_pid 2>/dev/null); then
    server_line kafka down "" "$STACK_HOST:$KAFKA_PORT"
    return 1
  fi
  if ! "$STACK_BIN/tidegate" stack check kafka >/dev/null 2>&1; then
    server_line kafka unhealthy "$pid" "$STACK_HOST:$KAFKA_PORT (log: $KAFKA_LOG)"
    return 1
  fi
  server_line kafka up "$pid" "$STACK_HOST:$KAFKA_PORT (controller $CONTROLLER_PORT)"
}
