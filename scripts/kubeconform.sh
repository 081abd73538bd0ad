#!/usr/bin/env bash
# Validates every Kubernetes manifest under deploy/k8s with kubeconform
# -strict, offline: the schemas are made from the OpenAPI document of
# Kubernetes $K8S_VERSION (the module k8s.io/kubernetes, through the Go
# module proxy and the checksum database) by deploy/tools/k8sschemas, and
# kubeconform is the tool pinned in deploy/tools/go.mod. Nothing is fetched
# from elsewhere (kubeconform's default schema location is not used).
# make lint runs it; docs/DEPLOY.md, "Validation".
set -euo pipefail
cd "$(dirname "$0")/.."

K8S_VERSION=${K8S_VERSION:-v1.32.0}
GO=${GO:-go}

spec_dir=$(cd deploy/tools && $GO mod download -json "k8s.io/kubernetes@$K8S_VERSION" |
  sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')
spec=$spec_dir/api/openapi-spec/swagger.json
[ -f "$spec" ] || { echo "kubeconform: no OpenAPI document at $spec" >&2; exit 1; }

schemas=$(mktemp -d)
trap 'rm -rf "$schemas"' EXIT
manifests=()
for f in deploy/k8s/*.yaml; do
  [ "$(basename "$f")" = kustomization.yaml ] && continue # kustomize's, not an object of the API
  manifests+=("$PWD/$f")
done
(cd deploy/tools && $GO run ./k8sschemas -spec "$spec" -out "$schemas" "${manifests[@]}")
(cd deploy/tools && $GO tool kubeconform -strict -summary -kubernetes-version "${K8S_VERSION#v}" \
  -schema-location "$schemas/{{.ResourceKind}}{{.KindSuffix}}.json" "${manifests[@]}")
