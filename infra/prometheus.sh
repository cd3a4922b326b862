# shellcheck shell=bash
# A local Prometheus (Debian's package) scraping what tidegate runs on this machine, with the alert
# rules of deploy/prometheus: `make observe`, or `prometheus` in TIDEGATE_STACK_SERVICES. Sourced
# by infra/stack.sh (needs infra/lib.sh).
#
# Targets (TIDEGATE_STACK_PROMETHEUS_TARGETS, a comma list): the gateway (8080), `tidegate worker`
# and its --processes children (9100-9103, the demo's workers are 9101 and 9102) and a controller
# started with --metrics-port 9109. A target that is not running is only reported down.

PROM_DIR=$STACK_VAR/prometheus
PROM_CONF=$PROM_DIR/prometheus.yml
PROM_LOG=$PROM_DIR/prometheus.log
PROM_PIDFILE=$STACK_RUN/prometheus.pid
PROM_PORT=${TIDEGATE_STACK_PROMETHEUS_PORT:-9090}
PROM_TARGETS=${TIDEGATE_STACK_PROMETHEUS_TARGETS:-$STACK_HOST:8080,$STACK_HOST:9100,$STACK_HOST:9101,$STACK_HOST:9102,$STACK_HOST:9103,$STACK_HOST:9109}
PROM_SCRAPE=${TIDEGATE_STACK_PROMETHEUS_SCRAPE:-15s}
PROM_TIMEOUT=${TIDEGATE_STACK_PROMETHEUS_TIMEOUT:-30}
PROM_WORD=prometheus

prom_pid() { running_pid prometheus "$PROM_PIDFILE" "$PROM_DIR" "$PROM_WORD"; }

prom_configure() {
  mkdir -p "$PROM_DIR/data"
  local targets="" target list
  IFS=, read -r -a list <<<"$PROM_TARGETS"
  for target in "${list[@]}"; do targets+="'$target', "; done
  cat >"$PROM_CONF" <<EOF
# Written by infra/prometheus.sh on every start; edit that script, not this file.
global:
  scrape_interval: $PROM_SCRAPE
  evaluation_interval: $PROM_SCRAPE
rule_files:
  - '$STACK_REPO/deploy/prometheus/rules/*.yml'
scrape_configs:
  - job_name: tidegate
    static_configs:
      - targets: [${targets%, }]
EOF
}

prom_start() {
  local pid
  if pid=$(prom_pid); then
    log "prometheus: already running (pid $pid)"
    return 0
  fi
  command -v prometheus >/dev/null ||
    die "prometheus: not installed (the Debian package prometheus; make setup installs it)"
  require_free_port prometheus "$PROM_PORT"
  prom_configure
  spawn "$PROM_PIDFILE" "$PROM_DIR" "$PROM_LOG" prometheus \
    --config.file="$PROM_CONF" --storage.tsdb.path="$PROM_DIR/data" \
    --web.listen-address="$STACK_HOST:$PROM_PORT" --storage.tsdb.retention.time=2d
  log "prometheus: starting (pid $(cat "$PROM_PIDFILE")) on http://$STACK_HOST:$PROM_PORT"
}

prom_probe() { "$STACK_BIN/python" -c "import urllib.request as u; u.urlopen('http://$STACK_HOST:$PROM_PORT/-/ready', timeout=2)"; }

prom_up() {
  prom_start
  wait_healthy prometheus "$PROM_TIMEOUT" "$PROM_PIDFILE" "$PROM_LOG" prom_probe
  log "prometheus: healthy, scraping $PROM_TARGETS"
}

prom_stop() { stop_pid prometheus "$PROM_PIDFILE" "$PROM_DIR" "$PROM_WORD" TERM; }

prom_status() {
  local pid
  if ! pid=$(prom_pid 2>/dev/null); then
    server_line prometheus down "" "$STACK_HOST:$PROM_PORT"
    return 1
  fi
  if ! prom_probe 2>/dev/null; then
    server_line prometheus unhealthy "$pid" "$STACK_HOST:$PROM_PORT (log: $PROM_LOG)"
    return 1
  fi
  server_line prometheus up "$pid" "http://$STACK_HOST:$PROM_PORT"
}
