# shellcheck shell=bash
# Shared settings and helpers of the local stack scripts; sourced by infra/stack.sh.
#
# Every path derives from the repo root (this file's parent folder), so the scripts work from any cwd
# and in a clone anywhere. Ports and the state folder can be overridden to run a second, separate
# stack (the integration tests do): TIDEGATE_STACK_VAR, TIDEGATE_STACK_{KAFKA,CONTROLLER,PG,REDIS,
# REGISTRY}_PORT, TIDEGATE_STACK_{KAFKA,CONTROLLER}_PORTS. TIDEGATE_STACK_SERVICES (comma list)
# limits which servers are managed. KAFKA_NODES=3 runs a 3-node Kafka cluster (infra/kafka.sh).

STACK_INFRA=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
STACK_REPO=$(dirname "$STACK_INFRA")
STACK_VAR=${TIDEGATE_STACK_VAR:-$STACK_REPO/var}
mkdir -p "$STACK_VAR"
# Canonical path: the ownership checks compare it with /proc/PID/cwd, which is always resolved.
STACK_VAR=$(cd "$STACK_VAR" && pwd -P)
STACK_RUN=$STACK_VAR/run
STACK_BIN=${TIDEGATE_STACK_VENV:-$STACK_REPO/.venv}/bin
STACK_HOST=127.0.0.1
STACK_SERVICES=${TIDEGATE_STACK_SERVICES:-kafka,registry,postgres,redis}

KAFKA_PORT=${TIDEGATE_STACK_KAFKA_PORT:-9092}
CONTROLLER_PORT=${TIDEGATE_STACK_CONTROLLER_PORT:-9093}
# The nodes of KAFKA_NODES=3, one port each: node 1 keeps the single node's ports, so clients
# configured for 127.0.0.1:9092 reach the cluster too (9092/9093, 9094/9095, 9096/9097).
KAFKA_NODES=${KAFKA_NODES:-}
IFS=, read -r -a KAFKA_PORTS \
  <<<"${TIDEGATE_STACK_KAFKA_PORTS:-$KAFKA_PORT,$((KAFKA_PORT + 2)),$((KAFKA_PORT + 4))}"
IFS=, read -r -a CONTROLLER_PORTS \
  <<<"${TIDEGATE_STACK_CONTROLLER_PORTS:-$CONTROLLER_PORT,$((CONTROLLER_PORT + 2)),$((CONTROLLER_PORT + 4))}"
PG_PORT=${TIDEGATE_STACK_PG_PORT:-5432}
REDIS_PORT=${TIDEGATE_STACK_REDIS_PORT:-6379}
REGISTRY_PORT=${TIDEGATE_STACK_REGISTRY_PORT:-8081}
STOP_TIMEOUT=${TIDEGATE_STACK_STOP_TIMEOUT:-60}

# The python commands (`tidegate stack ...`, `tidegate registry`) read their settings from the env:
# point them at this stack's servers, whatever the caller's environment says.
export TIDEGATE_KAFKA_BOOTSTRAP_SERVERS=$STACK_HOST:$KAFKA_PORT
export TIDEGATE_REGISTRY_HOST=$STACK_HOST TIDEGATE_REGISTRY_PORT=$REGISTRY_PORT
export TIDEGATE_SCHEMA_REGISTRY_URL=http://$STACK_HOST:$REGISTRY_PORT
export TIDEGATE_SCHEMA_REGISTRY_LOCAL_CREDENTIALS=$STACK_VAR/registry/client.env
export TIDEGATE_POSTGRES_HOST=$STACK_HOST TIDEGATE_POSTGRES_PORT=$PG_PORT
export TIDEGATE_POSTGRES_USER=tidegate TIDEGATE_POSTGRES_PASSWORD=tidegate
export TIDEGATE_POSTGRES_DBNAME=tidegate
export TIDEGATE_REDIS_URL=redis://$STACK_HOST:$REDIS_PORT/0

mkdir -p "$STACK_RUN"

log() { echo "$*"; }

die() {
  echo "stack: ERROR: $*" >&2
  exit 1
}

enabled() { [[ ",$STACK_SERVICES," == *",$1,"* ]]; }

# fail_with_log NAME LOGFILE MESSAGE: a loud failure that shows why the server did not come up.
fail_with_log() {
  echo "stack: ERROR: $1: $3" >&2
  if [[ -s "$2" ]]; then
    echo "---- last lines of $2 ----" >&2
    tail -n 40 "$2" >&2
    echo "----" >&2
  fi
  # A JVM that dies before its logger is up (a port it cannot bind, a crash) says why here.
  local stdout
  stdout="$(dirname "$2")/stdout.log"
  if [[ "$stdout" != "$2" && -s "$stdout" ]]; then
    echo "---- last lines of $stdout ----" >&2
    tail -n 20 "$stdout" >&2
    echo "----" >&2
  fi
  exit 1
}

# alive PID: the process exists and is not a zombie.
alive() {
  local state
  state=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 1
  [[ -n "$state" && "$state" != Z ]]
}

# ours PID DIR WORD: PID is a live process started by these scripts for this stack. Every server runs
# with its cwd in its own state folder, so a recycled PID (or the other stack's server) never matches.
ours() {
  local pid=$1 dir=$2 word=$3 cwd
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  alive "$pid" || return 1
  cwd=$(readlink "/proc/$pid/cwd" 2>/dev/null) || return 1
  [[ "$cwd" == "$dir" ]] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$word"
}

# running_pid NAME PIDFILE DIR WORD: prints the PID if the server runs; removes a stale PID file.
running_pid() {
  local name=$1 pidfile=$2 dir=$3 word=$4 pid
  [[ -f "$pidfile" ]] || return 1
  pid=$(head -n1 "$pidfile" 2>/dev/null | tr -d '[:space:]')
  if ours "$pid" "$dir" "$word"; then
    echo "$pid"
    return 0
  fi
  echo "$name: removing stale PID file $pidfile (pid ${pid:-?} is not ours or gone)" >&2
  rm -f "$pidfile"
  return 1
}

# port_busy PORT: something already accepts connections on 127.0.0.1:PORT.
port_busy() { (exec 3<>"/dev/tcp/$STACK_HOST/$1") 2>/dev/null; }

require_free_port() {
  if port_busy "$2"; then
    die "$1: $STACK_HOST:$2 is already in use by a process these scripts did not start; stop it or set another port (see infra/lib.sh)"
  fi
}

# wait_healthy NAME TIMEOUT PIDFILE LOGFILE PROBE...: polls PROBE until it succeeds; fails fast if the
# server's process dies, and at the deadline, printing the probe's last output and the log's tail.
wait_healthy() {
  local name=$1 timeout=$2 pidfile=$3 logfile=$4 out pid
  shift 4
  local deadline=$((SECONDS + timeout))
  while :; do
    if out=$("$@" 2>&1); then
      return 0
    fi
    pid=$(head -n1 "$pidfile" 2>/dev/null | tr -d '[:space:]') || true
    if [[ -n "$pid" ]] && ! alive "$pid"; then
      rm -f "$pidfile"
      fail_with_log "$name" "$logfile" "exited during startup (pid $pid); last probe: $out"
    fi
    if ((SECONDS >= deadline)); then
      fail_with_log "$name" "$logfile" "not healthy after ${timeout}s; last probe: $out"
    fi
    sleep 0.5
  done
}

# stop_pid NAME PIDFILE DIR WORD SIGNAL: stops our server by its PID file (SIGNAL, then SIGKILL at the
# deadline). Never by name: other stacks and foreign processes on this machine are left alone.
stop_pid() {
  local name=$1 pidfile=$2 dir=$3 word=$4 signal=$5 pid
  if ! pid=$(running_pid "$name" "$pidfile" "$dir" "$word"); then
    log "$name: not running"
    return 0
  fi
  kill -s "$signal" "$pid" 2>/dev/null || true
  await_exit "$name" "$pidfile" "$pid"
}

# await_exit NAME PIDFILE PID: waits for a server that was told to stop to exit (SIGKILL at the
# STOP_TIMEOUT deadline), then removes its PID file.
await_exit() {
  local name=$1 pidfile=$2 pid=$3 deadline
  deadline=$((SECONDS + STOP_TIMEOUT))
  while alive "$pid" && ((SECONDS < deadline)); do
    sleep 0.2
  done
  if alive "$pid"; then
    echo "$name: still running after ${STOP_TIMEOUT}s, sending SIGKILL to pid $pid" >&2
    kill -s KILL "$pid" 2>/dev/null || true
    deadline=$((SECONDS + 10))
    while alive "$pid" && ((SECONDS < deadline)); do
      sleep 0.2
    done
  fi
  if alive "$pid"; then
    die "$name: pid $pid survived SIGKILL"
  fi
  rm -f "$pidfile"
  log "$name: stopped (pid $pid)"
}

# spawn PIDFILE DIR LOGFILE CMD...: starts CMD in the background in its own session, cwd DIR, stdio
# detached (a caller reading our output must not wait for the daemon). The child writes its own PID
# before exec, so the PID file names the server even if setsid has to fork.
spawn() {
  local pidfile=$1 dir=$2 logfile=$3
  shift 3
  rm -f "$pidfile"
  # shellcheck disable=SC2016 # $$ and $@ belong to the inner bash
  (cd "$dir" && exec setsid bash -c 'echo $$ >"$0"; exec "$@"' "$pidfile" "$@") \
    </dev/null >>"$logfile" 2>&1 &
  local deadline=$((SECONDS + 10))
  until [[ -s "$pidfile" ]]; do
    ((SECONDS < deadline)) || die "no PID file $pidfile after spawning $1"
    sleep 0.05
  done
}

# server_line NAME STATE PID ADDRESS: one row of `stack.sh status`.
server_line() { printf '%-9s %-10s %-9s %s\n' "$1" "$2" "${3:--}" "$4"; }
