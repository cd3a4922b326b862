# shellcheck shell=bash
# Redis from the Debian package, with its own config and data in var/redis. Sourced by
# infra/stack.sh (needs infra/lib.sh).

REDIS_DIR=$STACK_VAR/redis
REDIS_CONF=$REDIS_DIR/redis.conf
REDIS_LOG=$REDIS_DIR/redis.log
REDIS_PIDFILE=$STACK_RUN/redis.pid
REDIS_TIMEOUT=${TIDEGATE_STACK_REDIS_TIMEOUT:-30}
REDIS_WORD=redis-server

redis_pid() { running_pid redis "$REDIS_PIDFILE" "$REDIS_DIR" "$REDIS_WORD"; }

redis_configure() {
  mkdir -p "$REDIS_DIR"
  # Rewritten on every start so port changes take effect. Bound to loopback only, so protected mode
  # (which refuses only non-loopback clients without a password) never gets in the way.
  cat >"$REDIS_CONF" <<EOF
# Written by infra/redis.sh on every start; edit that script, not this file.
bind $STACK_HOST
port $REDIS_PORT
protected-mode yes
daemonize yes
supervised no
pidfile "$REDIS_PIDFILE"
dir "$REDIS_DIR"
logfile "$REDIS_LOG"
appendonly yes
appendfsync everysec
save 3600 1 300 100 60 10000
EOF
}

redis_start() {
  local pid
  if pid=$(redis_pid); then
    log "redis: already running (pid $pid)"
    return 0
  fi
  require_free_port redis "$REDIS_PORT"
  redis_configure
  # redis daemonizes itself (chdir to `dir`, PID file) once the config is read.
  (cd "$REDIS_DIR" && redis-server "$REDIS_CONF") </dev/null >/dev/null 2>>"$REDIS_LOG" ||
    fail_with_log redis "$REDIS_LOG" "redis-server refused to start"
  local deadline=$((SECONDS + 10))
  until [[ -s "$REDIS_PIDFILE" ]]; do
    ((SECONDS < deadline)) || fail_with_log redis "$REDIS_LOG" "no PID file $REDIS_PIDFILE"
    sleep 0.05
  done
  log "redis: starting (pid $(cat "$REDIS_PIDFILE")) on $STACK_HOST:$REDIS_PORT"
}

redis_probe() { [[ $(redis-cli -h "$STACK_HOST" -p "$REDIS_PORT" ping 2>&1) == PONG ]]; }

redis_up() {
  redis_start
  wait_healthy redis "$REDIS_TIMEOUT" "$REDIS_PIDFILE" "$REDIS_LOG" redis_probe
  log "redis: healthy"
}

redis_stop() { stop_pid redis "$REDIS_PIDFILE" "$REDIS_DIR" "$REDIS_WORD" TERM; }

redis_status() {
  local pid
  if ! pid=$(redis_pid 2>/dev/null); then
    server_line redis down "" "$STACK_HOST:$REDIS_PORT"
    return 1
  fi
  if ! redis_probe; then
    server_line redis unhealthy "$pid" "$STACK_HOST:$REDIS_PORT (log: $REDIS_LOG)"
    return 1
  fi
  server_line redis up "$pid" "$STACK_HOST:$REDIS_PORT"
}
