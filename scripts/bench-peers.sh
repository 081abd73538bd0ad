#!/usr/bin/env bash
# Norn next to NATS JetStream (make bench-peers; docs/BENCHMARKS.md): both
# as 3-node clusters on 127.0.0.1, every write fsynced, the same three
# workloads through each system's own Go client, RUNS rounds interleaved
# (NATS, Norn, NATS, Norn, ...) so that machine noise falls on both alike.
#
# Each round:
#   1. a fresh NATS JetStream cluster (bench/peers/conf/nats: stream R3,
#      work-queue retention, sync_interval: always), nats-server
#      $NATS_SERVER_VERSION installed into $BIN with `go install` if absent;
#      enqueue (N tasks of PAYLOAD bytes, INFLIGHT publishes in flight),
#      claim with acks one after another (WORKERS workers, fetch 16,
#      DoubleAck each in turn), claim with 16 acks in flight per worker;
#      stopped (by pid).
#   2. a fresh Norn cluster (scripts/cluster.sh, DATA in a temporary
#      directory, NORND_ARGS passed on to every nornd, W=2): the same three
#      through Norn's client (bench/peers/norn.go; enqueue and, with 16 in
#      flight, complete batching with a 1 ms linger); stopped (by pid).
#
# It prints a markdown table of the medians over the rounds: tasks/s, the
# Norn/NATS ratio, p99 latency of the ack (enqueue) or complete (claim),
# and the servers' CPU time per task (utime+stime of the 3 server
# processes, summed, from the start of the timed part to when they are
# back to their idle rate after it; before it the driver waits for that
# rate too, so a claim run's preload is not counted). The idle rate is
# measured once per cluster, after it started, and printed; the CPU
# columns include it. The raw JSON lines are kept in OUT.
#
# Knobs: RUNS=3 N=50000 INFLIGHT=256 WORKERS=8 PAYLOAD=64
# OUT=<file>.jsonl NORND_ARGS=... BIN=bin KEEP=1 (keep the clusters' data
# and logs) SYSTEMS="nats norn" (SYSTEMS=norn: Norn alone, for comparing
# two Norn builds by their CPU per task). It needs the ports of `make cluster` (7400-7422) and
# 14222-14224, 16222-16224, 18222-18224 free, and bin/nornd (make build).
set -uo pipefail
# In cleartext, like the numbers before TLS (docs/BENCHMARKS.md has its cost).
export TLS=0
cd "$(dirname "$0")/.."
ROOT=$PWD

SYSTEMS=${SYSTEMS:-nats norn}
RUNS=${RUNS:-3} N=${N:-50000} INFLIGHT=${INFLIGHT:-256} WORKERS=${WORKERS:-8} PAYLOAD=${PAYLOAD:-64}
BIN=${BIN:-bin}
NATS_SERVER_VERSION=${NATS_SERVER_VERSION:-v2.15.2}
OUT=${OUT:-${TMPDIR:-/tmp}/bench-peers-$(date +%Y%m%d-%H%M%S).jsonl}
export NORND_ARGS=${NORND_ARGS:-}

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "FATAL: $*"; exit 1; }

mkdir -p "$BIN"
BIN=$(cd "$BIN" && pwd)
[ -x "$BIN/nornd" ] || die "$BIN/nornd is missing: run make build (or make bench-peers)"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/bench-peers.XXXXXX")
: >"$OUT" || die "cannot write $OUT"
CLK_TCK=$(getconf CLK_TCK 2>/dev/null || echo 100)

# The driver (a module of its own under bench/) and nats-server.
log "building the driver (bench/peers)"
(cd bench && go build -o "$BIN/bench-peers" ./peers) || die "building bench/peers"
NATS_SERVER=$BIN/nats-server
if [[ " $SYSTEMS " == *" nats "* ]] && ! "$NATS_SERVER" --version 2>/dev/null | grep -qF "$NATS_SERVER_VERSION"; then
	log "installing nats-server $NATS_SERVER_VERSION into $BIN"
	GOBIN=$BIN go install "github.com/nats-io/nats-server/v2@$NATS_SERVER_VERSION" || die "go install nats-server"
fi

NATS_PIDS=()
NORN_DATA=""
# alive PID: the process runs (an exited child not yet reaped is a zombie).
alive() {
	local st
	st=$(ps -o stat= -p "$1" 2>/dev/null) && [ -n "$st" ] && [ "${st:0:1}" != Z ]
}
nats_stop() {
	local p i
	for p in "${NATS_PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
	for p in "${NATS_PIDS[@]}"; do
		for i in $(seq 1 100); do alive "$p" || break; sleep 0.1; done
		if alive "$p"; then kill -KILL "$p" 2>/dev/null; fi
		wait "$p" 2>/dev/null
	done
	NATS_PIDS=()
}
norn_stop() {
	[ -n "$NORN_DATA" ] && DATA=$NORN_DATA BIN=$BIN bash scripts/cluster.sh stop >/dev/null 2>&1
	NORN_DATA=""
}
cleanup() {
	nats_stop
	norn_stop
	if [ -n "${KEEP:-}" ]; then log "kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ports_free PORT...: none of them is listening on 127.0.0.1 (else a
# cluster of someone else's would answer the health checks and be measured).
ports_free() {
	local p busy=()
	for p in "$@"; do
		if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then busy+=("$p"); fi
	done
	[ ${#busy[@]} -eq 0 ] || die "ports in use: ${busy[*]} (another cluster running?)"
}

nats_start() {
	local dir=$WORK/nats i port
	ports_free 14222 14223 14224 16222 16223 16224 18222 18223 18224
	rm -rf "$dir"
	mkdir -p "$dir"
	cp bench/peers/conf/nats/sync-always.conf "$dir/sync.conf"
	for i in 1 2 3; do
		sed "s|@STORE@|$dir/store|" "bench/peers/conf/nats/n$i.conf" >"$dir/n$i.conf"
		"$NATS_SERVER" -c "$dir/n$i.conf" >"$dir/n$i.log" 2>&1 &
		NATS_PIDS+=($!)
	done
	for port in 18222 18223 18224; do
		for i in $(seq 1 300); do curl -sf "http://127.0.0.1:$port/healthz" >/dev/null && break; sleep 0.1; done
		curl -sf "http://127.0.0.1:$port/healthz" >/dev/null || { tail -n 5 "$dir"/n*.log >&2; die "NATS did not become healthy"; }
	done
}

norn_start() {
	local i
	ports_free 7400 7401 7402 7410 7411 7412 7420 7421 7422
	NORN_DATA=$WORK/norn
	rm -rf "$NORN_DATA"
	DATA=$NORN_DATA BIN=$BIN timeout 300 bash scripts/cluster.sh start >"$WORK/norn-start.log" 2>&1 ||
		{ tail -n 20 "$WORK/norn-start.log" >&2; die "starting the Norn cluster"; }
	NORN_PIDS=()
	for i in 1 2 3; do NORN_PIDS+=("$(cat "$NORN_DATA/pids/node$i.pid")"); done
}

# run NAME CMD...: one driver run; a failure is reported and the rounds go on.
run() {
	local name=$1
	shift
	timeout 300 "$@" || log "FAILED: $name (exit $?)"
}

pids() { (IFS=,; echo "$*"); }
# idle PID...: the servers' CPU rate with no requests, in cores.
idle() { "$BIN/bench-peers" idle -clk-tck "$CLK_TCK" -server-pids "$(pids "$@")" || echo 0; }
common=(-n "$N" -inflight "$INFLIGHT" -workers "$WORKERS" -payload "$PAYLOAD" -out "$OUT" -timeout 280s -clk-tck "$CLK_TCK")
log "results: $OUT"
for r in $(seq 1 "$RUNS"); do
	if [[ " $SYSTEMS " == *" nats "* ]]; then
		log "round $r/$RUNS: NATS JetStream R3, sync always"
		nats_start
		idle_cores=$(idle "${NATS_PIDS[@]}")
		log "NATS idle: $idle_cores cores"
		nb=("$BIN/bench-peers" nats -system nats-r3 -setting always -replicas 3 -run "$r"
			-server-pids "$(pids "${NATS_PIDS[@]}")" -idle-cores "$idle_cores"
			-urls nats://127.0.0.1:14222,nats://127.0.0.1:14223,nats://127.0.0.1:14224 "${common[@]}")
		run "NATS enqueue" "${nb[@]}" -workload enqueue
		run "NATS claim, 1 in flight" "${nb[@]}" -workload claim -setting "always, acks 1 in flight" -pipeline 1
		run "NATS claim, 16 in flight" "${nb[@]}" -workload claim -setting "always, acks 16 in flight" -pipeline 16
		nats_stop
	fi

	[[ " $SYSTEMS " == *" norn "* ]] || continue
	log "round $r/$RUNS: Norn, 3 nodes, W=2${NORND_ARGS:+ (NORND_ARGS=$NORND_ARGS)}"
	norn_start
	idle_cores=$(idle "${NORN_PIDS[@]}")
	log "Norn idle: $idle_cores cores"
	nn=("$BIN/bench-peers" norn -system norn-3 -setting "W=2" -run "$r"
		-server-pids "$(pids "${NORN_PIDS[@]}")" -idle-cores "$idle_cores"
		-addrs 127.0.0.1:7400,127.0.0.1:7410,127.0.0.1:7420 "${common[@]}")
	run "Norn enqueue" "${nn[@]}" -workload enqueue
	run "Norn claim, 1 in flight" "${nn[@]}" -workload claim -setting "W=2, completes 1 in flight" -pipeline 1
	run "Norn claim, 16 in flight" "${nn[@]}" -workload claim -setting "W=2, completes 16 in flight" -pipeline 16
	norn_stop
done

echo
echo "Medians of $RUNS round(s); N=$N tasks of $PAYLOAD B, enqueue $INFLIGHT in flight, claim $WORKERS workers; CPU = the 3 servers' CPU time per task."
echo
"$BIN/bench-peers" table -in "$OUT" | tee "${OUT%.jsonl}.md"
echo
echo "raw results: $OUT"
