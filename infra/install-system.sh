#!/usr/bin/env bash
# Installs the Debian packages the local stack and the tests need (run once by `make setup`).
#
# Idempotent and quick when everything is present: `apt-get update` runs only when a package must be
# installed. Java 17+ and Maven are checked, not installed: `make setup` needs Maven before this runs.
set -euo pipefail

die() {
  echo "install-system: ERROR: $*" >&2
  exit 1
}

# Java 17+ runs the Kafka broker (Kafka 4.x refuses older runtimes).
command -v java >/dev/null || die "java not found: install a JDK/JRE 17+ (e.g. apt-get install openjdk-17-jre-headless)"
java_version=$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n1)
[[ -n "$java_version" && "$java_version" -ge 17 ]] ||
  die "java 17+ needed for Kafka 4, found: $(java -version 2>&1 | head -n1)"
command -v mvn >/dev/null || die "mvn not found: install Maven (apt-get install maven); it fetches the Kafka jars"

missing=()
# Any PostgreSQL major with server binaries will do; infra/postgres.sh picks the newest one.
if ! compgen -G '/usr/lib/postgresql/*/bin/postgres' >/dev/null; then
  missing+=(postgresql-15)
fi
# pg_isready and psql come from the client package, which postgresql-15 pulls in.
command -v pg_isready >/dev/null || missing+=(postgresql-client-15)
# redis-server depends on redis-tools, which brings redis-cli.
command -v redis-server >/dev/null || missing+=(redis-server)
command -v redis-cli >/dev/null || missing+=(redis-tools)
# promtool runs the alert rules' unit tests (tests/unit/deploy); the server itself is not used.
command -v promtool >/dev/null || missing+=(prometheus)

if ((${#missing[@]} == 0)); then
  echo "install-system: all system packages present (java $java_version, mvn, postgresql, redis, promtool)"
  exit 0
fi

[[ $(id -u) -eq 0 ]] || die "need root to install: ${missing[*]} (run: sudo bash $0)"
echo "install-system: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
# The Debian packages create and start a default cluster/server through their maintainer scripts
# when an init system runs; policy-rc.d stops that, our stack runs its own servers under var/.
policy=/usr/sbin/policy-rc.d
created_policy=0
if [[ ! -e "$policy" ]]; then
  printf '#!/bin/sh\nexit 101\n' >"$policy"
  chmod 755 "$policy"
  created_policy=1
fi
status=0
apt-get install -y -q --no-install-recommends "${missing[@]}" || status=$?
((created_policy)) && rm -f "$policy"
((status == 0)) || die "apt-get install ${missing[*]} failed (exit $status)"

compgen -G '/usr/lib/postgresql/*/bin/postgres' >/dev/null || die "postgres binaries still missing"
command -v redis-server >/dev/null || die "redis-server still missing"
command -v promtool >/dev/null || die "promtool still missing (Debian package prometheus)"
id postgres >/dev/null 2>&1 || die "the postgres OS user is missing (postgresql-common creates it)"
echo "install-system: done"
