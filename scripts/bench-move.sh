#!/usr/bin/env bash
# Rebalancing benchmark on real nornd processes (make bench-move). Two
# modes:
#
#   partition  one partition (-partitions 1) on 3 nodes holding COUNT tasks
#              (default 1,000,000); n4 joins and n1 is drained: exactly one
#              replica move of the whole partition, n1 -> n4.
#   grow       the default 64 partitions holding COUNT tasks on 3 nodes; n4
#              and n5 join and a rebalance spreads the replicas over 5.
#
# For each it reports the move's (or rebalance's) wall time, the
# anti-entropy bytes (requests and responses) of the exchanges the new
# node(s) started, which are the fills, and of all exchanges (the Raft
# catch-up ships only the claim log, not counted), and the cluster's
# throughput during the move against without one: rounds of `nornctl bench`
# (enqueue ROUND_COUNT tasks, then claim+complete them) run back to back
# before the move and while it runs, and the mean rates are compared.
#
# It runs its own cluster under DATA (default data-benchmove, removed
# first) on the ports of `make cluster` (7400-7452): stop that one first.
# Every node it starts is stopped at the end (by pid, scripts/cluster.sh).
set -euo pipefail
# In cleartext, like the numbers before TLS (docs/BENCHMARKS.md has its cost).
export TLS=0

MODE=${1:-partition}
BIN=${BIN:-bin}
export BIN
export DATA=${DATA:-data-benchmove}
COUNT=${COUNT:-1000000}
ROUND_COUNT=${ROUND_COUNT:-20000}
BASE_ROUNDS=${BASE_ROUNDS:-3}
ctl() { "$BIN/nornctl" "$@"; }

case "$MODE" in
partition) export NORND_ARGS="-partitions 1 ${NORND_ARGS:-}"; ADD=(4) ;;
grow) ADD=(4 5) ;;
*) echo "usage: $0 partition|grow" >&2; exit 2 ;;
esac

rm -rf "$DATA"
trap 'bash scripts/cluster.sh stop >/dev/null 2>&1 || true' EXIT
bash scripts/cluster.sh start >/dev/null
echo "mode $MODE: preloading $COUNT tasks"
ctl bench --workload enqueue --count "$COUNT" --concurrency 512 --queue preload -o json >"$DATA/preload.json"
grep -o '"tasksPerSecond": *[0-9.]*' "$DATA/preload.json" | head -1 | sed 's/.*: */  preload enqueue tasks\/s: /'

# metric NODE NAME: the sum of a counter over its labels on node NODE.
metric() {
	curl -fsS "http://127.0.0.1:74$(($1 - 1))0/metrics" |
		awk -v m="$2" '$1 == m || index($1, m "{") == 1 { s += $2 } END { printf "%.0f\n", s }'
}

# round OUT: one bench round (enqueue then claim+complete), JSON to OUT.
# Through n2, which holds a replica throughout in both modes (a drained
# node coordinates every request remotely).
round() { ctl bench --addr 127.0.0.1:7410 --count "$ROUND_COUNT" --timeout 30s -o json >"$1" 2>/dev/null || true; }

# rates FILES...: mean enqueue and claim+complete tasks/s over the rounds.
rates() {
	cat "$@" | grep -o '"tasksPerSecond": *[0-9.]*' | awk -F': *' '
		NR % 2 == 1 { e += $2; ne++ } NR % 2 == 0 { c += $2; nc++ }
		END { printf "%.0f %.0f %d\n", (ne ? e / ne : 0), (nc ? c / nc : 0), ne }'
}

# The new nodes run (as members holding nothing) during the baseline too:
# the same processes share the cores with and without a move.
for i in "${ADD[@]}"; do bash scripts/cluster.sh add "$i" >/dev/null; done
for i in "${ADD[@]}"; do ctl join "n$i" >/dev/null; done
echo "baseline: $BASE_ROUNDS bench rounds of $ROUND_COUNT tasks without a move"
for i in $(seq 1 "$BASE_ROUNDS"); do round "$DATA/base-$i.json"; done
read -r base_e base_c base_n < <(rates "$DATA"/base-*.json)
# aebytes NODES...: the anti-entropy bytes of the exchanges the nodes
# started (requests and responses: the initiator counts both).
aebytes() {
	local s=0 i
	for i in "$@"; do
		s=$((s + $(metric "$i" norn_antientropy_bytes_sent_total) + $(metric "$i" norn_antientropy_bytes_received_total)))
	done
	echo "$s"
}
all=(1 2 3 "${ADD[@]}")
before_new=$(aebytes "${ADD[@]}"); before_all=$(aebytes "${all[@]}")

echo "moving while bench rounds run"
start=$(date +%s.%N)
if [ "$MODE" = partition ]; then
	ctl drain n1 --yes --addr 127.0.0.1:7410 >"$DATA/move.out" 2>&1 &
else
	ctl rebalance --yes >"$DATA/move.out" 2>&1 &
fi
mover=$!
n=0
while kill -0 "$mover" 2>/dev/null; do
	n=$((n + 1))
	round "$DATA/during-$n.json"
done
wait "$mover" || { echo "the move failed:"; cat "$DATA/move.out"; exit 1; }
end=$(date +%s.%N)
after_new=$(aebytes "${ADD[@]}"); after_all=$(aebytes "${all[@]}")
read -r mv_e mv_c mv_n < <(rates "$DATA"/during-*.json)
moves=$(grep -c -- '-> n.: done' "$DATA/move.out" || true)

awk -v mode="$MODE" -v count="$COUNT" -v s="$start" -v e="$end" -v moves="$moves" \
	-v newb=$((after_new - before_new)) -v allb=$((after_all - before_all)) \
	-v be="$base_e" -v bc="$base_c" -v bn="$base_n" -v me="$mv_e" -v mc="$mv_c" -v mn="$mv_n" 'BEGIN {
	printf "\n%s: %d tasks, %d replica moves in %.1f s\n", mode, count, moves, e - s
	printf "  anti-entropy bytes: %.1f MiB in the exchanges the new node(s) started (the fills), %.1f MiB on all nodes\n", newb / 1048576, allb / 1048576
	printf "  enqueue tasks/s:        %6d without a move (%d rounds), %6d during (%d rounds): %.0f%%\n", be, bn, me, mn, (be ? 100 * me / be : 0)
	printf "  claim+complete tasks/s: %6d without a move,            %6d during:            %.0f%%\n", bc, mc, (bc ? 100 * mc / bc : 0)
}'
