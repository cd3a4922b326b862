#!/usr/bin/env bash
# Installs what the deployment tests (tests/unit/deploy/) validate with, into var/ (run by
# `make setup`; idempotent: does nothing when var/ already holds these exact versions).
#
#   var/bin/kubeconform      github.com/yannh/kubeconform, built from the Go module proxy
#   var/bin/kustomize        sigs.k8s.io/kustomize/kustomize/v5, likewise (renders deploy/k8s)
#   var/schemas/kubernetes/  Kubernetes JSON schemas, from the PyPI wheel kubernetes-validate
#   var/schemas/crds/        KEDA's CRDs as JSON schemas, from the Go module github.com/kedacore/keda/v2
#   var/schemas/compose-spec.json
#                            the Compose specification's schema, from the Go module
#                            github.com/compose-spec/compose-go/v2
#
# Every source is a package registry (Go module proxy, PyPI); nothing is fetched from elsewhere.
# infra/deploy_schemas.py does the conversion. promtool comes from Debian (infra/install-system.sh).
set -euo pipefail

KUBECONFORM_VERSION=v0.8.0
# v5.8.3 needs Go 1.27.
KUSTOMIZE_VERSION=v5.8.2
KEDA_VERSION=v2.21.0
# v2.17.0 needs Go 1.26.11; the machine has 1.26.8.
COMPOSE_GO_VERSION=v2.16.2
KUBERNETES_VALIDATE_VERSION=1.37.0
# The oldest and the newest Kubernetes the manifests are checked against.
KUBERNETES_VERSIONS=1.31.0,1.37.0

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
var=$repo/var
python=$repo/.venv/bin/python

die() {
  echo "deploy-tools: ERROR: $*" >&2
  exit 1
}

go=$(command -v go || true)
[[ -n "$go" ]] || { [[ -x /usr/local/go/bin/go ]] && go=/usr/local/go/bin/go; }
[[ -n "$go" ]] || die "go not found: kubeconform and the KEDA and Compose schemas come from the Go module proxy"
[[ -x "$python" ]] || die "$python missing: run \`make setup\` (the venv comes first)"
export GOFLAGS=-buildvcs=false GOTOOLCHAIN=local

pins="kubeconform=$KUBECONFORM_VERSION kustomize=$KUSTOMIZE_VERSION keda=$KEDA_VERSION"
pins+=" compose-go=$COMPOSE_GO_VERSION"
pins+=" kubernetes-validate=$KUBERNETES_VALIDATE_VERSION kubernetes=$KUBERNETES_VERSIONS"
# A change to the converter rebuilds the schemas too.
pins+=" converter=$(sha256sum "$repo/infra/deploy_schemas.py" | cut -c1-12)"
if [[ -x "$var/bin/kubeconform" && -x "$var/bin/kustomize" && -f "$var/schemas/pins" &&
  "$(cat "$var/schemas/pins")" == "$pins" ]]; then
  echo "deploy-tools: up to date ($pins)"
  exit 0
fi

mkdir -p "$var/bin" "$var/cache/deploy"
echo "deploy-tools: building kubeconform $KUBECONFORM_VERSION"
GOBIN=$var/bin "$go" install "github.com/yannh/kubeconform/cmd/kubeconform@$KUBECONFORM_VERSION"
echo "deploy-tools: building kustomize $KUSTOMIZE_VERSION"
GOBIN=$var/bin "$go" install "sigs.k8s.io/kustomize/kustomize/v5@$KUSTOMIZE_VERSION"

module_dir() { # module_dir MODULE@VERSION: its folder in the module cache, downloaded if needed
  local json dir
  json=$("$go" mod download -json "$1") || true
  dir=$("$python" -c 'import json, sys; d = json.loads(sys.argv[1] or "{}"); print(d.get("Error") and "ERROR: " + d["Error"] or d.get("Dir", "ERROR: no Dir"))' "$json")
  [[ "$dir" != ERROR:* && -d "$dir" ]] || die "go mod download $1: $dir"
  echo "$dir"
}
keda=$(module_dir "github.com/kedacore/keda/v2@$KEDA_VERSION")
compose=$(module_dir "github.com/compose-spec/compose-go/v2@$COMPOSE_GO_VERSION")

wheel=$var/cache/deploy/kubernetes_validate-$KUBERNETES_VALIDATE_VERSION-py3-none-any.whl
if [[ ! -f "$wheel" ]]; then
  echo "deploy-tools: downloading kubernetes-validate $KUBERNETES_VALIDATE_VERSION (schemas only)"
  "$python" -m pip download -q --no-deps --only-binary=:all: -d "$var/cache/deploy" \
    "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION"
fi
[[ -f "$wheel" ]] || die "pip download did not produce $wheel"

sources=$(printf '{"kubeconform": "github.com/yannh/kubeconform@%s", "kustomize": "sigs.k8s.io/kustomize/kustomize/v5@%s", "crds": "github.com/kedacore/keda/v2@%s config/crd/bases", "compose": "github.com/compose-spec/compose-go/v2@%s schema/compose-spec.json", "kubernetes": "PyPI kubernetes-validate==%s"}' \
  "$KUBECONFORM_VERSION" "$KUSTOMIZE_VERSION" "$KEDA_VERSION" "$COMPOSE_GO_VERSION" "$KUBERNETES_VALIDATE_VERSION")
"$python" "$repo/infra/deploy_schemas.py" --out "$var/schemas" \
  --kubernetes-wheel "$wheel" --kubernetes-versions "$KUBERNETES_VERSIONS" \
  --crd-dir "$keda/config/crd/bases" --compose-schema "$compose/schema/compose-spec.json" \
  --sources "$sources"
echo "$pins" >"$var/schemas/pins"
echo "deploy-tools: done ($pins)"
