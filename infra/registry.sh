# shellcheck shell=bash
# tidegate's schema registry (`tidegate registry`), which keeps its state in Kafka's `_schemas`
# topic: started once Kafka is healthy. Sourced by infra/stack.sh (needs infra/lib.sh).

REGISTRY_DIR=$STACK_VAR/registry
REGISTRY_LOG=$REGISTRY_DIR/registry.log
REGISTRY_PIDFILE=$STACK_RUN/registry.pid
REGISTRY_TIMEOUT=${TIDEGATE_STACK_REGISTRY_TIMEOUT:-60}
REGISTRY_WORD=tidegate

registry_pid() { running_pid registry "$REGISTRY_PIDFILE" "$REGISTRY_DIR" "$REGISTRY_WORD"; }

registry_probe() { "$STACK_BIN/tidegate" stack check registry --wait 2; }

registry_up() {
  local pid started=$SECONDS
  if pid=$(registry_pid); then
    log "registry: already running (pid $pid)"
  else
    require_free_port registry "$REGISTRY_PORT"
    mkdir -p "$REGISTRY_DIR"
    # Host, port and brokers come from the TIDEGATE_* variables exported by lib.sh.
    spawn "$REGISTRY_PIDFILE" "$REGISTRY_DIR" "$REGISTRY_LOG" "$STACK_BIN/tidegate" registry
    log "registry: starting (pid $(cat "$REGISTRY_PIDFILE")) on $STACK_HOST:$REGISTRY_PORT"
  fi
  wait_healthy registry "$REGISTRY_TIMEOUT" "$REGISTRY_PIDFILE" "$REGISTRY_LOG" registry_probe
  [[ -n "${pid:-}" ]] || log "registry: healthy ($((SECONDS - started))s)"
  registry_credentials
}

# The registry authenticates every caller: this stack's own processes present the key that
# `tidegate stack registry-credentials` keeps in $REGISTRY_DIR/client.env (keys live in PostgreSQL).
registry_credentials() {
  if ! enabled postgres; then
    log "registry: no local credentials (postgres is not part of this stack)"
    return 0
  fi
  local out
  out=$("$STACK_BIN/tidegate" stack registry-credentials "$REGISTRY_DIR/client.env" 2>&1) || {
    echo "$out" >&2
    die "registry: the local credentials could not be made"
  }
  log "$out"
}

registry_stop() { stop_pid registry "$REGISTRY_PIDFILE" "$REGISTRY_DIR" "$REGISTRY_WORD" TERM; }

registry_status() {
  local pid
  if ! pid=$(registry_pid 2>/dev/null); then
    server_line registry down "" "http://$STACK_HOST:$REGISTRY_PORT"
    return 1
  fi
  if ! "$STACK_BIN/tidegate" stack check registry >/dev/null 2>&1; then
    server_line registry unhealthy "$pid" "http://$STACK_HOST:$REGISTRY_PORT (log: $REGISTRY_LOG)"
    return 1
  fi
  server_line registry up "$pid" "http://$STACK_HOST:$REGISTRY_PORT"
}
