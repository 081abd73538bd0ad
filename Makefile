# Norn build, test and lint targets. `make test` is the test command CI runs.

GO          ?= go
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2
# Core packages run under the race detector.
CORE_PKGS   := ./crdt/... ./ring/... ./storage/... ./claims/...
BIN         := bin

.PHONY: all build test test-core test-rest lint fmt bench fuzz cluster run clean

all: build

build:
	$(GO) build ./...

test: test-core test-rest

test-core:
	$(GO) test -race -timeout 10m $(CORE_PKGS)

# Everything that is not a core package (the architecture test for now).
test-rest:
	$(GO) test -timeout 10m $$($(GO) list ./... | grep -v -e '/crdt' -e '/ring' -e '/storage' -e '/claims')

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...

fmt:
	gofmt -w $$(git ls-files '*.go')

# Benchmarks (numbers go in docs/BENCHMARKS.md). BENCH narrows them.
BENCH ?= .
bench:
	$(GO) test -run '^$$' -bench '$(BENCH)' -benchmem -timeout 60m ./...

# A short coverage-guided fuzz run of every decoder.
FUZZTIME ?= 30s
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzDecode$$' -fuzztime $(FUZZTIME) ./crdt/
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeLog$$' -fuzztime $(FUZZTIME) ./storage/
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeCommand$$' -fuzztime $(FUZZTIME) ./claims/
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeRecord$$' -fuzztime $(FUZZTIME) ./claims/

cluster run:
	@echo "make $@: nornd does not exist yet (see README.md, 'State of the project')."; exit 1

clean:
	rm -rf $(BIN) data
