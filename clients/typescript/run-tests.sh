#!/usr/bin/env bash
# Tests of the TypeScript client (clients/typescript), for `make test` and
# CI: installs its packages from the lockfile (npm ci), generates the API
# code from api/norn/v1 when src/gen is missing or else checks that the
# committed code is current (as `make proto-check` does for Go), builds
# with tsc, and runs the tests (Node's test runner) against a real 3-node
# cluster with TLS that the tests start themselves from the built binaries
# bin/nornd and bin/nornctl at the repository root (NORN_BIN: another
# directory holding them). Exits non-zero on any failure.
#
#   clients/typescript/run-tests.sh            # from anywhere
#   NORN_KEEP=1 ...                            # keep the clusters' data and logs (in $TMPDIR)
set -euo pipefail
cd "$(dirname "$0")"

GO=${GO:-go}
BUF=${BUF:-github.com/bufbuild/buf/cmd/buf@v1.73.0}
start=$(date +%s)

echo "== npm ci"
npm ci --no-audit --no-fund

if [ ! -f src/gen/norn/v1/task_service_pb.ts ]; then
	echo "== generate src/gen (missing)"
	"$GO" run "$BUF" generate --template buf.gen.yaml
else
	echo "== check that src/gen is current"
	tmp=$(mktemp -d)
	trap 'rm -rf "$tmp"' EXIT
	"$GO" run "$BUF" generate --template buf.gen.yaml -o "$tmp"
	if ! diff -r src/gen "$tmp/src/gen" >/dev/null; then
		diff -ru src/gen "$tmp/src/gen" | head -40 >&2 || true
		echo "run-tests.sh: clients/typescript/src/gen is stale (the protos changed): run 'npm run generate' in clients/typescript and commit it" >&2
		exit 1
	fi
fi

echo "== build"
npm run --silent build

echo "== test"
npm test
echo "== TypeScript client: tests passed in $(( $(date +%s) - start )) s"
