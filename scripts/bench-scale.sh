#!/usr/bin/env bash
# Scale benchmark on one real nornd (make bench-scale): a node started as
# `make run` starts it (the default P=64; NORND_ARGS adds flags) fills one
# queue step by step, and at each size it reports:
#
#   - the enqueue rate of that step (nornctl bench --workload enqueue,
#     256 calls in flight, the client's default batching);
#   - CountTasks of the queue: median and worst of 5 `nornctl count`
#     calls, timed around the command (so nornctl's own start, a few ms,
#     is in it), and one CountTasks call through curl (connect's JSON);
#   - claims with 4 workers completing one task at a time (2,000 tasks,
#     --pipeline 1, no complete batching): claim p50 / p99;
#   - the node's RSS and the data directory's size.
#
# Sizes: STEPS (default "10000 1000000"); SCALE=10M appends 9,000,000 and
# 10,000,000, so that the last step's rate is the rate at 10 million.
# It runs its own node under DATA (default data-benchscale, removed
# first) on 127.0.0.1:7400 (stop `make run` / `make cluster` first), and
# stops it by pid at the end.
set -euo pipefail

BIN=${BIN:-bin}
DATA=${DATA:-data-benchscale}
STEPS=${STEPS:-"10000 1000000"}
if [ "${SCALE:-}" = "10M" ]; then STEPS="$STEPS 9000000 10000000"; fi
ADDR=127.0.0.1:7400
QUEUE=big
ctl() { "$BIN/nornctl" --addr "$ADDR" "$@"; }

rm -rf "$DATA"
mkdir -p "$DATA"
# shellcheck disable=SC2086
"$BIN/nornd" --data-dir "$DATA/node" --listen "$ADDR" ${NORND_ARGS:-} >"$DATA/nornd.log" 2>&1 &
PID=$!
trap 'kill "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do
	if curl -fsS "http://$ADDR/healthz" >/dev/null 2>&1; then break; fi
	sleep 0.1
done
curl -fsS "http://$ADDR/healthz" >/dev/null

# flat FILE: the JSON in FILE on one line, without spaces.
flat() { tr -d ' \n' <"$1"; }

# field FILE KEY: the first number after "KEY": in FILE.
field() { flat "$1" | grep -o "\"$2\":[0-9.e+-]*" | head -1 | sed 's/.*://'; }

# nowms: wall time in ms.
nowms() { echo $(($(date +%s%N) / 1000000)); }

printf '%-12s %-16s %-22s %-22s %-10s %-10s\n' "tasks" "enqueue tasks/s" "count median/max ms" "claim p50/p99 ms" "RSS MB" "disk MB"
have=0
for n in $STEPS; do
	add=$((n - have))
	ctl bench --workload enqueue --count "$add" --concurrency 256 --queue "$QUEUE" --timeout 60s -o json >"$DATA/enqueue-$n.json"
	rate=$(field "$DATA/enqueue-$n.json" tasksPerSecond)
	have=$n
	# Let the flushes and compactions of the fill settle a little, as a
	# queue that has been filling for a while would be.
	sleep 2
	times=()
	for _ in 1 2 3 4 5; do
		t0=$(nowms)
		ctl count --queue "$QUEUE" --timeout 60s >/dev/null
		times+=($(($(nowms) - t0)))
	done
	sorted=$(printf '%s\n' "${times[@]}" | sort -n)
	median=$(echo "$sorted" | sed -n 3p)
	worst=$(echo "$sorted" | tail -1)
	t0=$(nowms)
	curl -fsS -H 'Content-Type: application/json' -d "{\"queue\":\"$QUEUE\"}" \
		"http://$ADDR/norn.v1.TaskService/CountTasks" >"$DATA/count-$n.json"
	curlms=$(($(nowms) - t0))
	ctl bench --workload claim-complete --queue "$QUEUE" --count 2000 --workers 4 --pipeline 1 --complete-linger 0 \
		--claim-max 1 --timeout 60s -o json >"$DATA/claim-$n.json"
	# The claimComplete phase's calls: claim first, then complete.
	claim=$(flat "$DATA/claim-$n.json" | grep -o '"name":"claim"[^}]*}')
	p50=$(echo "$claim" | grep -o '"p50":[0-9.]*' | sed 's/.*://')
	p99=$(echo "$claim" | grep -o '"p99":[0-9.]*' | sed 's/.*://')
	rss=$(awk '/VmRSS/ { printf "%.0f", $2 / 1024 }' "/proc/$PID/status")
	disk=$(du -sm "$DATA/node" | cut -f1)
	printf '%-12s %-16.0f %-22s %-22s %-10s %-10s\n' "$n" "$rate" "$median / $worst (curl $curlms)" "$p50 / $p99" "$rss" "$disk"
done
