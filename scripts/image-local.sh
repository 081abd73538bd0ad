#!/usr/bin/env bash
# Builds deploy/Dockerfile where no container registry is reachable
# (docs/DEPLOY.md, "Building without a registry"): the build stage runs
# in a stand-in of the golang image made from this machine's Go
# toolchain and a static busybox (the shell of RUN), and the final stage
# is FROM scratch. Every other line of the Dockerfile runs as in a
# production build; modules come from the Go proxy as on the host.
#
#   scripts/image-local.sh [tag]      # default norn:dev; needs podman or docker,
#                                     # go, and busybox (Debian: busybox-static)
set -euo pipefail
cd "$(dirname "$0")/.."

tag=${1:-norn:dev}
engine=${ENGINE:-$(command -v podman || command -v docker || true)}
[ -n "$engine" ] || { echo "image-local: neither podman nor docker is installed" >&2; exit 1; }
busybox=$(command -v busybox || true)
[ -n "$busybox" ] || { echo "image-local: busybox is not installed (Debian: apt-get install busybox-static)" >&2; exit 1; }
file -L "$busybox" 2>/dev/null | grep -q 'statically linked' || {
  echo "image-local: $busybox is not statically linked (Debian: busybox-static)" >&2; exit 1; }
goroot=$(go env GOROOT)
gover=$(go env GOVERSION)
goimage="localhost/norn-go:${gover#go}"

if ! "$engine" image exists "$goimage" 2>/dev/null && ! "$engine" image inspect "$goimage" >/dev/null 2>&1; then
  root=$(mktemp -d)
  trap 'rm -rf "$root"' EXIT
  mkdir -p "$root"/{bin,tmp,etc/ssl/certs,usr/local,go,src}
  chmod 1777 "$root/tmp"
  cp "$busybox" "$root/bin/busybox"
  for c in sh mkdir cp rm ls cat env; do ln -s busybox "$root/bin/$c"; done
  cp -a "$goroot" "$root/usr/local/go"
  cp -L /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/"
  cp -L /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
  echo "image-local: making $goimage from $goroot"
  tar -C "$root" -c . | "$engine" import \
    --change 'ENV PATH=/go/bin:/usr/local/go/bin:/bin' \
    --change 'ENV GOPATH=/go' \
    --change 'ENV GOTOOLCHAIN=local' \
    --change "ENV GOPROXY=$(go env GOPROXY)" \
    --change 'WORKDIR /go' - "$goimage"
fi

version=$(git describe --always --dirty 2>/dev/null || echo dev)
format=()
[ "$(basename "$engine")" = podman ] && format=(--format docker) # keeps HEALTHCHECK
"$engine" build "${format[@]}" --network host -f deploy/Dockerfile -t "$tag" \
  --build-arg GO_IMAGE="$goimage" --build-arg BASE_IMAGE=scratch \
  --build-arg VERSION="$version" .
