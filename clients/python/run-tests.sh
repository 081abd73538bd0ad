#!/usr/bin/env bash
# Tests of the Python client (clients/python), for `make test` and CI: runs
# test_norn.py with unittest against real nornd processes the tests start
# themselves (a 3-node cluster with TLS and a single node with an access
# file) from the built binaries bin/nornd and bin/nornctl at the
# repository root (NORN_BIN: another directory holding them; missing
# binaries fail the tests, naming what to build). Standard library only:
# nothing to install. Exits non-zero on any failure.
#
#   clients/python/run-tests.sh          # from anywhere
#   PYTHON=python3.12 ...                # another interpreter (3.11 or later)
#   NORN_KEEP=1 ...                      # keep the clusters' data and logs (in $TMPDIR)
set -euo pipefail
cd "$(dirname "$0")"

PY=${PYTHON:-python3}
export PYTHONDONTWRITEBYTECODE=1 # no __pycache__ in the tree
start=$(date +%s)
"$PY" - <<'PYCHECK'
import sys
if sys.version_info < (3, 11):
    sys.exit(f"clients/python needs Python 3.11 or later; {sys.executable} is {sys.version.split()[0]}")
PYCHECK
"$PY" -m unittest -v test_norn
echo "== Python client: tests passed in $(( $(date +%s) - start )) s"
