#!/usr/bin/env bash
# Idle cost of partitions (make bench-idle P=1024): a 3-node cluster
# (scripts/cluster.sh, the ports of `make cluster`: stop that one first)
# with -partitions P and no load. Once every partition has a leader and
# a settling time has passed, it samples each node for WINDOW seconds:
# CPU (utime+stime from /proc, as a share of one core) and RSS, and
# prints them per node with the replicas and Raft leaders each holds.
# Then (FAILOVER=1, the default) it kills n1 with -9 and reports how long
# until n2 sees a leader for every partition again, polling its Status
# every 50 ms: the failover time of idle groups.
#
# P (default 1024), SETTLE (default 20 s), WINDOW (default 30 s), DATA
# (default data-benchidle, removed first), NORND_ARGS (more nornd flags).
set -euo pipefail
# In cleartext, like the numbers before TLS (docs/BENCHMARKS.md has its cost).
export TLS=0

BIN=${BIN:-bin}
export BIN
export DATA=${DATA:-data-benchidle}
P=${P:-1024}
SETTLE=${SETTLE:-20}
WINDOW=${WINDOW:-30}
export NORND_ARGS="-partitions $P ${NORND_ARGS:-}"

rm -rf "$DATA"
trap 'bash scripts/cluster.sh stop >/dev/null 2>&1 || true' EXIT
bash scripts/cluster.sh start >/dev/null
for _ in $(seq 1 600); do
	if curl -fsS http://127.0.0.1:7400/healthz >/dev/null 2>&1 &&
		curl -fsS http://127.0.0.1:7410/healthz >/dev/null 2>&1 &&
		curl -fsS http://127.0.0.1:7420/healthz >/dev/null 2>&1; then
		break
	fi
	sleep 0.5
done
sleep "$SETTLE"

hz=$(getconf CLK_TCK)
# ticks PID: utime + stime of the process, in clock ticks.
ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
declare -A before
for i in 1 2 3; do
	pid=$(cat "$DATA/pids/node$i.pid")
	before[$i]=$(ticks "$pid")
done
sleep "$WINDOW"
printf '%-6s %-10s %-10s %-12s %-10s %-10s\n' node P replicas leaders "CPU %" "RSS MB"
for i in 1 2 3; do
	pid=$(cat "$DATA/pids/node$i.pid")
	cpu=$(awk -v a="${before[$i]}" -v b="$(ticks "$pid")" -v hz="$hz" -v w="$WINDOW" 'BEGIN { printf "%.1f", 100 * (b - a) / hz / w }')
	rss=$(awk '/VmRSS/ { printf "%.0f", $2 / 1024 }' "/proc/$pid/status")
	st=$("$BIN/nornctl" --addr "127.0.0.1:74$((i - 1))0" status -o json 2>/dev/null | tr -d ' \n')
	reps=$(echo "$st" | grep -o '"cohort":' | wc -l)
	leads=$(echo "$st" | grep -o "\"leader\":\"n$i\"" | wc -l)
	printf '%-6s %-10s %-10s %-12s %-10s %-10s\n' "n$i" "$P" "$reps" "$leads" "$cpu" "$rss"
done

[ "${FAILOVER:-1}" = 1 ] || exit 0
# leaderless: partitions n2 sees without a leader, or led by n1.
leaderless() {
	local st
	st=$(curl -fsS -m 2 -H 'Content-Type: application/json' -d '{"skipCounts":true}' \
		http://127.0.0.1:7410/norn.v1.AdminService/Status 2>/dev/null | tr -d ' \n') || { echo "?"; return; }
	echo $(( $(echo "$st" | grep -o '"cohort":' | wc -l) - $(echo "$st" | grep -o '"leader":"n[23]"' | wc -l) ))
}
pid=$(cat "$DATA/pids/node1.pid")
t0=$(date +%s%N)
kill -9 "$pid"
while :; do
	n=$(leaderless)
	if [ "$n" = 0 ]; then break; fi
	if [ $(( ($(date +%s%N) - t0) / 1000000 )) -gt 60000 ]; then echo "failover: $n partitions still without a leader after 60 s"; exit 1; fi
	sleep 0.05
done
echo "failover: every partition led again $(( ($(date +%s%N) - t0) / 1000000 )) ms after kill -9 of n1"
