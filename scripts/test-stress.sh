#!/usr/bin/env bash
# make test-stress: run the multi-node tests (restarts, leader changes,
# partitions, moves) again and again, several at once, under the race
# detector, for a bounded time, and print the output of every failure.
# Not part of CI: run it before landing a change to the cluster paths
# (replicas, coord, dispatch, rebalance, antientropy) or to these tests,
# and when hunting a flake (CONTRIBUTING in README.md).
#
#   STRESS_TIME   how long to run (default 10m; Go duration syntax: 90s, 20m)
#   STRESS_PAR    runs at once (default: the number of cores)
#   STRESS_RUN    the tests (a -run pattern; default the multi-node ones)
#   STRESS_PKG    the package (default ./node/)
#   STRESS_OUT    where failures are kept (default a temporary directory)
#
# It builds the test binary once, then each of STRESS_PAR workers runs it
# (-test.count=1) until the time is up. It stops only the processes it
# started.
set -euo pipefail
cd "$(dirname "$0")/.."

time_spec=${STRESS_TIME:-10m}
par=${STRESS_PAR:-$(nproc)}
run=${STRESS_RUN:-'Cluster|Rebalance|Restart|Leader|Failover|Remote|ClaimCheck|AntiEntropy|Clock|Cancel|LiveClaim|SeededBug'}
pkg=${STRESS_PKG:-./node/}
out=${STRESS_OUT:-$(mktemp -d -t norn-stress.XXXXXX)}
mkdir -p "$out"

seconds() { # a Go-like duration (90s, 20m, 1h) in seconds
  local d=$1
  case $d in
    *h) echo $(( ${d%h} * 3600 )) ;;
    *m) echo $(( ${d%m} * 60 )) ;;
    *s) echo "${d%s}" ;;
    *) echo "$d" ;;
  esac
}
end=$(( $(date +%s) + $(seconds "$time_spec") ))

bin="$out/stress.test"
echo "test-stress: building $pkg with -race"
go test -c -race -tags testhooks -o "$bin" "$pkg"
pkgdir=$(go list -f '{{.Dir}}' "$pkg")

pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -- "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT INT TERM

worker() {
  local w=$1 i=0
  while [ "$(date +%s)" -lt "$end" ]; do
    i=$((i + 1))
    local log="$out/w$w-run$i.log"
    # Tests run in their package directory, as go test runs them.
    if (cd "$pkgdir" && "$bin" -test.run "$run" -test.count=1 -test.timeout 10m) >"$log" 2>&1; then
      echo pass >>"$out/w$w.results"
      rm -f "$log"
    else
      echo fail >>"$out/w$w.results"
      echo "test-stress: FAIL (worker $w, run $i): $log"
      grep -E -e '^(--- FAIL|panic:|FAIL|WARNING: DATA RACE)' -A 12 "$log" | head -60 || true
    fi
  done
}

echo "test-stress: $par at once for $time_spec, -run '$run'; failures kept in $out"
for w in $(seq 1 "$par"); do
  worker "$w" &
  pids+=($!)
done
wait "${pids[@]}" || true
pids=()

runs=$(cat "$out"/w*.results 2>/dev/null | wc -l)
fails=$(cat "$out"/w*.results 2>/dev/null | grep -c fail || true)
echo "test-stress: $runs runs, $fails failed (each run is every matching test once)"
[ "$fails" -eq 0 ]
