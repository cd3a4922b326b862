# shellcheck shell=bash
# PostgreSQL from the Debian package binaries, a private cluster in var/postgres, plus the tidegate
# role, database and migrations. Sourced by infra/stack.sh (needs infra/lib.sh).
#
# postgres refuses to run as root, so the server and admin commands run as the `postgres` OS user.

PG_DIR=$STACK_VAR/postgres
PG_DATA=$PG_DIR/data
PG_LOG=$PG_DIR/log/postgres.log
# The unix socket stays inside this stack's folder: two stacks (and a system cluster) never clash.
PG_SOCKET_DIR=$PG_DIR/run
# postgres writes its own PID file; var/run/postgres.pid mirrors it for people and tests.
PG_POSTMASTER_PID=$PG_DATA/postmaster.pid
PG_PIDFILE=$STACK_RUN/postgres.pid
PG_TIMEOUT=${TIDEGATE_STACK_PG_TIMEOUT:-60}
PG_WORD=postgres
PG_URL=postgresql+psycopg://tidegate:tidegate@$STACK_HOST:$PG_PORT/tidegate

pg_bin() {
  if [[ -n "${TIDEGATE_STACK_PG_BIN:-}" ]]; then
    echo "$TIDEGATE_STACK_PG_BIN"
    return 0
  fi
  local newest
  newest=$(compgen -G '/usr/lib/postgresql/*/bin/postgres' | sort -V | tail -n1) ||
    die "postgres: no server binaries in /usr/lib/postgresql/*/bin: run \`make setup\`"
  dirname "$newest"
}

# as_postgres CMD...: runs CMD as the postgres OS user, from / (it may not be allowed into our cwd).
as_postgres() { (cd / && runuser -u postgres -- "$@"); }

pg_pid() {
  local pid
  pid=$(running_pid postgres "$PG_POSTMASTER_PID" "$PG_DATA" "$PG_WORD") || {
    rm -f "$PG_PIDFILE"
    return 1
  }
  echo "$pid" >"$PG_PIDFILE"
  echo "$pid"
}

# The postgres user must be able to reach var/postgres: grant traverse (not read) on the ancestors
# that lack it, e.g. a clone under /root. Nothing is made readable.
pg_make_reachable() {
  as_postgres test -x "$PG_DIR" && return 0
  local dir=$PG_DIR chain=() i
  while [[ "$dir" != / ]]; do
    chain+=("$dir")
    dir=$(dirname "$dir")
  done
  # From the top down, so only the folders that really block the way are changed.
  for ((i = ${#chain[@]} - 1; i >= 0; i--)); do
    if ! as_postgres test -x "${chain[i]}"; then
      log "postgres: granting traverse permission (o+x) on ${chain[i]} so the postgres user reaches its data"
      chmod o+x "${chain[i]}"
    fi
  done
  as_postgres test -x "$PG_DIR" || die "postgres: the postgres OS user cannot reach $PG_DIR"
}

pg_init() {
  mkdir -p "$PG_DIR/log" "$PG_SOCKET_DIR"
  pg_make_reachable
  mkdir -p "$PG_DATA"
  chown -R postgres:postgres "$PG_DIR/log" "$PG_SOCKET_DIR"
  chown postgres:postgres "$PG_DATA"
  chmod 700 "$PG_DATA"
  if [[ ! -f "$PG_DATA/PG_VERSION" ]]; then
    # Local (socket) logins by OS identity for the admin; TCP logins by password for the app.
    as_postgres "$(pg_bin)/initdb" -D "$PG_DATA" -U postgres -E UTF8 --locale=C.UTF-8 \
      --auth-local=peer --auth-host=scram-sha-256 >"$PG_DIR/log/initdb.log" 2>&1 ||
      fail_with_log postgres "$PG_DIR/log/initdb.log" "initdb failed"
    echo "include_if_exists = 'tidegate.conf'" >>"$PG_DATA/postgresql.conf"
    log "postgres: initialised cluster in $PG_DATA"
  fi
  # Rewritten on every start so port changes (TIDEGATE_STACK_PG_PORT) take effect.
  cat >"$PG_DATA/tidegate.conf" <<EOF
# Written by infra/postgres.sh on every start; edit that script, not this file.
listen_addresses = '$STACK_HOST'
port = $PG_PORT
unix_socket_directories = '$PG_SOCKET_DIR'
max_connections = 200
EOF
  chown postgres:postgres "$PG_DATA/tidegate.conf"
}

pg_start() {
  local pid
  if pid=$(pg_pid); then
    log "postgres: already running (pid $pid)"
    return 0
  fi
  require_free_port postgres "$PG_PORT"
  pg_init
  local started=$SECONDS
  local out
  # -w: pg_ctl returns once the server accepts connections (or fails after -t seconds).
  if ! out=$(as_postgres "$(pg_bin)/pg_ctl" -D "$PG_DATA" -l "$PG_LOG" -w -t "$PG_TIMEOUT" -s \
    start </dev/null 2>&1); then
    fail_with_log postgres "$PG_LOG" "did not start within ${PG_TIMEOUT}s: $out"
  fi
  pid=$(pg_pid) || fail_with_log postgres "$PG_LOG" "started but its PID file is missing"
  log "postgres: started (pid $pid) on $STACK_HOST:$PG_PORT in $((SECONDS - started))s"
}

pg_admin_sql() {
  as_postgres psql -X -q -v ON_ERROR_STOP=1 -h "$PG_SOCKET_DIR" -p "$PG_PORT" -d postgres
}

# The role and database the app uses; \gexec runs the CREATE only when the object is missing.
pg_bootstrap() {
  pg_admin_sql >/dev/null <<'SQL'
SELECT 'CREATE ROLE tidegate LOGIN PASSWORD ''tidegate'''
WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'tidegate')\gexec
SELECT 'CREATE DATABASE tidegate OWNER tidegate'
WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = 'tidegate')\gexec
SQL
}

pg_migrate() {
  local out
  # The package's own migrations (package data of tidegate.core, decision 007).
  local migrations="$STACK_INFRA/../core/migrations"
  if ! out=$("$STACK_BIN/yoyo" apply --batch --no-config-file --database "$PG_URL" \
    "$migrations" 2>&1); then
    echo "$out" >&2
    die "postgres: migrations in core/migrations failed"
  fi
  local applied
  applied=$("$STACK_BIN/yoyo" list --no-config-file --database "$PG_URL" "$migrations" \
    2>/dev/null | grep -c '^A ' || true)
  log "postgres: migrations up to date ($applied applied from core/migrations)"
}

# Healthy = accepting connections, and the app's role can log in and query its database.
pg_probe() {
  pg_isready -q -h "$STACK_HOST" -p "$PG_PORT" -t 3 &&
    PGPASSWORD=tidegate PGCONNECT_TIMEOUT=3 psql -X -q -tA -h "$STACK_HOST" -p "$PG_PORT" \
      -U tidegate -d tidegate -c 'SELECT 1' >/dev/null
}

pg_up() {
  pg_start
  pg_bootstrap
  wait_healthy postgres "$PG_TIMEOUT" "$PG_PIDFILE" "$PG_LOG" pg_probe
  pg_migrate
}

# SIGINT is postgres' "fast" shutdown; SIGTERM ("smart") would wait for every client to leave.
pg_stop() {
  pg_pid >/dev/null 2>&1 || true
  stop_pid postgres "$PG_PIDFILE" "$PG_DATA" "$PG_WORD" INT
}

pg_status() {
  local pid
  if ! pid=$(pg_pid 2>/dev/null); then
    server_line postgres down "" "$STACK_HOST:$PG_PORT"
    return 1
  fi
  if ! pg_probe 2>/dev/null; then
    server_line postgres unhealthy "$pid" "$STACK_HOST:$PG_PORT (log: $PG_LOG)"
    return 1
  fi
  server_line postgres up "$pid" "$STACK_HOST:$PG_PORT (db tidegate, socket $PG_SOCKET_DIR)"
}
