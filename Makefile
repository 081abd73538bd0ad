# Norn build, test and lint targets. `make test` is the test command CI runs.

GO          ?= go
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2
# buf (protobuf lint and code generation) runs through `go run` at this
# version; its plugins are `tool` directives in go.mod. See api/norn/v1/doc.go.
BUF         ?= github.com/bufbuild/buf/cmd/buf@v1.73.0
# goimports checks that imports are grouped: standard library, then other
# modules, then this module (make lint).
GOIMPORTS   ?= golang.org/x/tools/cmd/goimports@v0.52.0
MODULE      := github.com/norn-dev/norn
# Core packages run under the race detector.
CORE_PKGS   := ./access/... ./crdt/... ./ring/... ./faultfs/... ./storage/... ./claims/... ./cluster/... ./antientropy/... ./transport/... ./client/... ./apierr/... ./replicas/... ./coord/... ./dispatch/... ./server/... ./rebalance/... ./node/...
BIN         := bin
# Tests build with the Jepsen harness's test hooks and seeded bugs (package
# testhooks), so the seeded-bug tests run; `make build` and the release
# binaries never carry them (cmd/nornd's TestReleaseHasNoTestHooks).
TEST_TAGS   := testhooks

.PHONY: all build test test-core test-rest test-clients test-stress lint kubeconform promtool fmt proto proto-check bench bench-move bench-peers bench-scale bench-console bench-idle fuzz cluster cluster-add cluster-stop run clean jepsen jepsen-short

all: build

build:
	$(GO) build ./...
	$(GO) build -o $(BIN)/nornd ./cmd/nornd
	$(GO) build -o $(BIN)/nornctl ./cmd/nornctl

# The console's browser tests need Debian's chromium (.ci/run installs it);
# without it they skip, and make test says so at its start and end.
# Their screenshots, and any test's artifacts, go under test-output/.
ARTIFACTS   := -artifacts -outputdir $(CURDIR)/test-output
NOBROWSER   := command -v chromium >/dev/null 2>&1 || echo "*** NO BROWSER TESTS: chromium is not installed, the console's browser tests skip (apt-get install chromium) ***" >&2

test:
	@$(NOBROWSER)
	@$(MAKE) --no-print-directory test-core test-rest test-clients
	@$(NOBROWSER)

# The clients beyond Go (clients/typescript, clients/python), each tested
# against real clusters of the binaries built here. Without Node.js or
# Python 3 the client's tests cannot run: said loudly, and make test fails
# (.ci/run installs both).
test-clients: build
	@command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 || { echo "*** Node.js and npm are needed for clients/typescript's tests (apt-get install nodejs npm) ***" >&2; exit 1; }
	bash clients/typescript/run-tests.sh
	@if [ -f clients/python/run-tests.sh ]; then \
		command -v python3 >/dev/null 2>&1 || { echo "*** Python 3 is needed for clients/python's tests (apt-get install python3) ***" >&2; exit 1; }; \
		bash clients/python/run-tests.sh; \
	fi

test-core:
	@mkdir -p test-output
	$(GO) test -race -tags $(TEST_TAGS) -timeout 10m $(ARTIFACTS) $(CORE_PKGS)

# Everything that is not a core package (the architecture test, cmd/, jepsen/).
test-rest:
	@core="$$($(GO) list $(CORE_PKGS))"; \
	mkdir -p test-output; $(GO) test -tags $(TEST_TAGS) -timeout 10m $(ARTIFACTS) $$($(GO) list ./... | grep -vxF "$$core")

# The multi-node tests again and again, several at once, under the race
# detector, for STRESS_TIME (default 10m); prints every failure. Not part of
# CI: run it when hunting a flake or before landing a change to the cluster
# paths (scripts/test-stress.sh has the knobs).
test-stress:
	bash scripts/test-stress.sh

# bench/ is a module of its own (make bench-peers), outside ./...: lint
# vets it too, so that a client change that breaks its driver shows here.
# deploy/tools is one too (kubeconform and the schema maker of the
# Kubernetes manifests' check, and the Grafana dashboard's checker, which
# lint runs).
lint: proto-check
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi
	@out=$$($(GO) run $(GOIMPORTS) -local $(MODULE) -l $$(git ls-files '*.go' | grep -v -e '\.pb\.go$$' -e '\.connect\.go$$')); \
	if [ -n "$$out" ]; then echo "imports not grouped the goimports way (standard library, others, then $(MODULE)) in:"; echo "$$out"; \
	echo "run: go run $(GOIMPORTS) -local $(MODULE) -w <file>"; exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags $(TEST_TAGS) ./...
	$(GO) run $(STATICCHECK) ./...
	$(GO) run $(STATICCHECK) -tags $(TEST_TAGS) ./...
	cd bench && $(GO) vet ./...
	cd deploy/tools && $(GO) vet ./...
	GO=$(GO) bash scripts/kubeconform.sh
	GO=$(GO) bash scripts/promtool.sh

# The Kubernetes manifests (deploy/k8s) against the schemas of Kubernetes
# K8S_VERSION (default in the script), offline (scripts/kubeconform.sh; docs/DEPLOY.md).
kubeconform:
	GO=$(GO) bash scripts/kubeconform.sh

# The alerting rules (promtool check rules and test rules) and the Grafana
# dashboard (deploy/tools/dashcheck, its queries parsed by promtool), with
# promtool pinned in the script (scripts/promtool.sh; docs/OPERATIONS.md,
# "Dashboards and alerts").
promtool:
	GO=$(GO) bash scripts/promtool.sh

fmt:
	gofmt -w $$(git ls-files '*.go')

# Regenerate the Go code of api/ and its OpenAPI document (api/openapi,
# from api/buf.openapi.yaml; the generator is a tool of the module
# api/tools) from its .proto files (commit the result).
proto:
	rm -f api/norn/v1/*.pb.go api/norn/v1/nornv1connect/*.connect.go
	cd api && $(GO) run $(BUF) generate
	cd api && $(GO) run $(BUF) generate --template buf.openapi.yaml
	@if [ -x clients/typescript/node_modules/.bin/protoc-gen-es ]; then (cd clients/typescript && npm run --silent generate); \
	else echo "make proto: clients/typescript/src/gen not regenerated: run 'npm ci' there first (its tests check it is current)" >&2; fi

# Lint the .proto files and fail if the committed generated code or
# OpenAPI document is stale: generate into a temporary directory and compare.
proto-check:
	cd api && $(GO) run $(BUF) lint
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	(cd api && $(GO) run $(BUF) generate -o "$$tmp/new") && \
	(cd api && $(GO) run $(BUF) generate --template buf.openapi.yaml -o "$$tmp/new") && \
	mkdir -p "$$tmp/new" "$$tmp/old" && \
	(cd api && find . -name '*.pb.go' -o -name '*.connect.go' -o -path './openapi/norn.openapi.*' | xargs -r cp --parents -t "$$tmp/old") && \
	if ! diff -ru "$$tmp/old" "$$tmp/new"; then \
		echo "proto-check: the generated code or OpenAPI document in api/ is stale; run 'make proto' and commit it" >&2; exit 1; \
	fi

# Benchmarks (numbers go in docs/BENCHMARKS.md). BENCH narrows them.
BENCH ?= .
bench:
	$(GO) test -run '^$$' -bench '$(BENCH)' -benchmem -timeout 60m ./...

# The rebalancing benchmark on real processes (docs/BENCHMARKS.md):
# MODE=partition moves one partition of COUNT tasks (default 1M) between
# nodes; MODE=grow rebalances 3 -> 5 nodes holding COUNT tasks. It runs
# its own cluster under data-benchmove on make cluster's ports.
MODE ?= partition
bench-move: build
	BIN=$(BIN) bash scripts/bench-move.sh $(MODE)

# Norn next to NATS JetStream, both 3-node clusters on loopback with every
# write fsynced, the same workloads through each one's Go client, RUNS
# rounds interleaved; prints a table of medians (tasks/s, p99, server CPU
# per task). The driver is the separate module bench/ (the main module does
# not depend on NATS); nats-server is installed into bin/ with go install.
# Knobs: RUNS N INFLIGHT WORKERS PAYLOAD OUT NORND_ARGS (scripts/bench-peers.sh).
# It runs on make cluster's ports: stop that one first.
bench-peers: build
	BIN=$(BIN) bash scripts/bench-peers.sh

# One node (as make run) filling one queue to 10 thousand and 1 million
# tasks (SCALE=10M: also 10 million): enqueue rate, count time, claim
# latency, RSS and disk at each size (docs/SCALING.md).
bench-scale: build
	BIN=$(BIN) SCALE=$(SCALE) bash scripts/bench-scale.sh

# The console's pages on one node holding TASKS tasks (default 1,000,000):
# median and worst time of each (docs/BENCHMARKS.md). Needs curl, jq, bc.
bench-console: build
	BIN=$(BIN) bash scripts/bench-console.sh

# Three idle nodes with P partitions (default 1024): CPU share of a core
# and RSS per node (docs/SCALING.md).
P ?= 1024
bench-idle: build
	BIN=$(BIN) P=$(P) bash scripts/bench-idle.sh

# A coverage-guided fuzz run of every decoder (FUZZTIME each); make test
# runs their seed corpora.
FUZZTIME ?= 30s
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzDecode$$' -fuzztime $(FUZZTIME) ./crdt/
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeLog$$' -fuzztime $(FUZZTIME) ./storage/
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeCommand$$' -fuzztime $(FUZZTIME) ./claims/
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeRecord$$' -fuzztime $(FUZZTIME) ./claims/
	$(GO) test -run '^$$' -fuzz '^FuzzRPCFrames$$' -fuzztime $(FUZZTIME) ./transport/
	$(GO) test -run '^$$' -fuzz '^FuzzRaftFrames$$' -fuzztime $(FUZZTIME) ./transport/
	$(GO) test -run '^$$' -fuzz '^FuzzMuxHandshake$$' -fuzztime $(FUZZTIME) ./transport/
	$(GO) test -run '^$$' -fuzz '^FuzzRequestDecoders$$' -fuzztime $(FUZZTIME) ./server/
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeMeta$$' -fuzztime $(FUZZTIME) ./cluster/
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeAckTime$$' -fuzztime $(FUZZTIME) ./cluster/

# One node for quick trials: API on 127.0.0.1:7400, data under ./data.
run:
	$(GO) build -o $(BIN)/nornd ./cmd/nornd
	$(GO) build -o $(BIN)/nornctl ./cmd/nornctl
	$(BIN)/nornd --data-dir ./data/single --listen 127.0.0.1:7400

# A local 3-node cluster on 127.0.0.1 (API ports 7400, 7410, 7420), data
# under ./data/node{1,2,3}, logs under ./data/logs; started again from its
# data when it exists. cluster-stop stops exactly those processes (by pid).
# TLS 1.3 and encrypted gossip, certificates under data/certs (. data/certs/env
# for nornctl); TLS=0 or NORND_ARGS=-insecure: cleartext.
cluster:
	$(GO) build -o $(BIN)/nornd ./cmd/nornd
	$(GO) build -o $(BIN)/nornctl ./cmd/nornctl
	BIN=$(BIN) TLS=$(TLS) bash scripts/cluster.sh start

# One more node (N=4 to 9) for growing the cluster: it gossips with it and
# waits for `nornctl join nN` (docs/OPERATIONS.md).
N ?= 4
cluster-add:
	$(GO) build -o $(BIN)/nornd ./cmd/nornd
	$(GO) build -o $(BIN)/nornctl ./cmd/nornctl
	BIN=$(BIN) TLS=$(TLS) bash scripts/cluster.sh add $(N)

cluster-stop:
	BIN=$(BIN) bash scripts/cluster.sh stop

clean:
	rm -rf $(BIN) data

# The Jepsen harness (docs/JEPSEN.md): real nornd processes on
# 127.0.0.(10+i), faults, checkers. Needs root and iptables. `make jepsen`
# runs every scenario (SCENARIO=name runs one); SEED=0 picks a seed (printed).
SCENARIO ?=
SEED     ?= 0
TIME     ?= 30s
jepsen:
	$(GO) build -o $(BIN)/norn-jepsen ./cmd/norn-jepsen
	$(BIN)/norn-jepsen $(if $(SCENARIO),--scenario $(SCENARIO),--all) --seed $(SEED) --time $(TIME)

# The short subset CI runs (about 3-5 minutes).
jepsen-short:
	$(GO) build -o $(BIN)/norn-jepsen ./cmd/norn-jepsen
	$(BIN)/norn-jepsen --short --seed $(SEED) --time 20s
