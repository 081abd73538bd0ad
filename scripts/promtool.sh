#!/usr/bin/env bash
# Checks the monitoring that comes with Norn, offline but for the Go
# module proxy: the alerting rules of deploy/prometheus with promtool
# (check rules: syntax, PromQL, templates; test rules: alerts_test.yaml),
# and the Grafana dashboard deploy/grafana/norn.json with
# deploy/tools/dashcheck (its shape, its variables, every series it and
# the rules name listed in docs/OPERATIONS.md's Metrics), whose queries
# promtool then parses too. make lint runs it; docs/OPERATIONS.md,
# "Dashboards and alerts".
#
# promtool is built by `go run` at PROMTOOL_VERSION, the Go module
# version of a Prometheus release (v0.316.0 is Prometheus v3.16.0),
# through the Go module proxy and the checksum database, with the build
# tag remove_all_sd, which leaves out the cloud service discoveries (AWS,
# Azure, GCE and the like: a third of the build) that rule checks never
# use. First run on an empty module and build cache: about 2 minutes on 2
# cores; later runs reuse the cached binary.
set -euo pipefail
cd "$(dirname "$0")/.."

PROMTOOL_VERSION=${PROMTOOL_VERSION:-v0.316.0}
GO=${GO:-go}

promtool() {
  $GO run -tags remove_all_sd "github.com/prometheus/prometheus/cmd/promtool@$PROMTOOL_VERSION" "$@"
}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

(cd deploy/tools && $GO run ./dashcheck -dashboard ../grafana/norn.json -docs ../../docs/OPERATIONS.md \
  -rules-out "$tmp/dashboard-queries.yaml" ../prometheus/alerts.yaml)
promtool check rules deploy/prometheus/alerts.yaml "$tmp/dashboard-queries.yaml"
promtool test rules deploy/prometheus/alerts_test.yaml
