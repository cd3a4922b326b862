#!/usr/bin/env bash
# Installs what `make bench` drives load with, into var/bin (idempotent):
#
#   var/bin/vegeta   github.com/tsenart/vegeta, an open-loop HTTP load generator in Go, built from
#                    the Go module proxy: the overload part offers 3x the gateway's sustained rate,
#                    more than the Python generator makes on these 2 cores (tests/bench/vegeta.py).
set -euo pipefail

VEGETA_VERSION=v12.12.0

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
bin=$repo/var/bin
go=$(command -v go || true)
[[ -n "$go" ]] || { [[ -x /usr/local/go/bin/go ]] && go=/usr/local/go/bin/go; }
[[ -n "$go" ]] || { echo "bench-tools: ERROR: go not found: vegeta comes from the Go module proxy" >&2; exit 1; }
export GOFLAGS=-buildvcs=false GOTOOLCHAIN=local

stamp=$bin/.vegeta-$VEGETA_VERSION
if [[ -x $bin/vegeta && -f $stamp ]]; then
  exit 0
fi
mkdir -p "$bin"
GOBIN=$bin "$go" install "github.com/tsenart/vegeta/v12@$VEGETA_VERSION"
rm -f "$bin"/.vegeta-*
touch "$stamp"
