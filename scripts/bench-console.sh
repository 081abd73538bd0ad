#!/usr/bin/env bash
# The console's pages on one node holding a million tasks (make
# bench-console; docs/BENCHMARKS.md): a node started as `make run` starts
# it fills queue big with TASKS tasks (default 1,000,000: nornctl bench
# --workload enqueue), completes 2,000 of them, lets 20 tasks of queue
# flaky go DEAD with their errors, and then times each console page: the
# median and worst of ROUNDS (default 7) GETs through curl (time_total:
# connect, the page's API calls in process, the render, the transfer),
# and the page's size. The deep page is the tasks page at the cursor
# halfway through the queue (walked to with nornctl list). The search row
# is one search press (a payload text no task holds), bounded by its 2 s
# budget. Its own node under DATA (default data-benchconsole, removed
# first) on 127.0.0.1:7400 (stop `make run` / `make cluster` first);
# stopped by pid.
set -euo pipefail

BIN=${BIN:-bin}
DATA=${DATA:-data-benchconsole}
TASKS=${TASKS:-1000000}
ROUNDS=${ROUNDS:-7}
ADDR=127.0.0.1:7400
URL=http://$ADDR
ctl() { "$BIN/nornctl" --addr "$ADDR" "$@"; }

rm -rf "$DATA"
mkdir -p "$DATA"
"$BIN/nornd" --data-dir "$DATA/node" --listen "$ADDR" >"$DATA/nornd.log" 2>&1 &
PID=$!
trap 'kill "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do
	if curl -fsS "$URL/healthz" >/dev/null 2>&1; then break; fi
	sleep 0.1
done
curl -fsS "$URL/healthz" >/dev/null

echo "filling queue big with $TASKS tasks"
ctl bench --workload enqueue --count "$TASKS" --concurrency 256 --queue big --payload-size 64 --timeout 120s -o json >"$DATA/enqueue.json"
ctl bench --workload claim-complete --queue big --count 2000 --workers 4 --timeout 60s -o json >"$DATA/complete.json"
for i in $(seq 1 20); do
	ctl enqueue flaky "{\"n\":$i}" --max-attempts 1 >/dev/null
	claim=$(ctl claim flaky --max 1 --worker bench-console -o json)
	cid=$(echo "$claim" | jq -r '.tasks[0].claimId')
	tid=$(echo "$claim" | jq -r '.tasks[0].task.id')
	ctl abort "$tid" "$cid" --retry --code timeout --description "upstream took too long ($i)" >/dev/null
done
# A task with its claims and errors, for the task page.
task=$tid
# The cursor halfway through big: nornctl list pages of 1,000.
tok=""
for _ in $(seq 1 $((TASKS / 2000))); do
	tok=$(ctl list --queue big --page-size 1000 ${tok:+--page-token "$tok"} -o json | jq -r '.nextPageToken')
done
sleep 2

# time PATH: "median worst bytes" of ROUNDS GETs of PATH.
time_page() {
	local out times=() bytes=0
	for _ in $(seq 1 "$ROUNDS"); do
		out=$(curl -fsS -o /dev/null -w '%{time_total} %{size_download}' "$URL$1")
		times+=("$(echo "$out" | cut -d' ' -f1)")
		bytes=$(echo "$out" | cut -d' ' -f2)
	done
	sorted=$(printf '%s\n' "${times[@]}" | sort -g)
	median=$(echo "$sorted" | sed -n "$(((ROUNDS + 1) / 2))p")
	worst=$(echo "$sorted" | tail -1)
	printf '%-34s %10.1f %10.1f %10s\n' "$2" "$(echo "$median * 1000" | bc -l)" "$(echo "$worst * 1000" | bc -l)" "$bytes"
}

printf '%-34s %10s %10s %10s\n' "page ($TASKS tasks)" "median ms" "worst ms" "bytes"
time_page "/ui/" "overview"
time_page "/ui/queues" "queues"
time_page "/ui/tasks?queue=big" "tasks, first page (50)"
time_page "/ui/tasks?queue=big&size=500" "tasks, first page (500)"
time_page "/ui/tasks?queue=big&page=$tok" "tasks, halfway (cursor)"
time_page "/ui/tasks?queue=big&newest=1" "tasks, newest first"
time_page "/ui/tasks?queue=big&status=DEAD&newest=1" "tasks, DEAD newest first (none)"
time_page "/ui/tasks/$task" "a task (claims, errors)"
time_page "/ui/dead?queue=flaky" "dead (20 DEAD tasks)"
time_page "/ui/dead?queue=big" "dead (big: none of 1M)"
time_page "/ui/schedules" "schedules"
time_page "/ui/cluster" "cluster (rebalance dry run)"
ROUNDS=1 time_page "/ui/tasks?queue=big&text=no-such-text" "search, one press (2 s budget)"
printf 'RSS %s MB\n' "$(awk '/VmRSS/ { printf "%.0f", $2 / 1024 }' "/proc/$PID/status")"
