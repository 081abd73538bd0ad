#!/usr/bin/env bash
# Starts (or restarts, from its data) a local 3-node Norn cluster on
# 127.0.0.1, or stops it. Used by `make cluster` and `make cluster-stop`.
#
#   node   API    Raft   gossip   data              log
#   n1     7400   7401   7402     data/node1        data/logs/node1.log
#   n2     7410   7411   7412     data/node2        data/logs/node2.log
#   n3     7420   7421   7422     data/node3        data/logs/node3.log
#
# `add N` (N = 4 to 9) starts one more node nN on ports 74N0-74N2 (data
# data/nodeN) that gossips with the cluster without being a member:
# `nornctl join nN` admits it (docs/OPERATIONS.md). Pids are kept in
# data/pids/; stop signals exactly those processes, added nodes included.
# PPROF=1 also serves net/http/pprof on 127.0.0.1:7409, 7419, 7429 (for
# profiling benchmarks). NORND_ARGS adds nornd flags to every node started
# (for example NORND_ARGS='-raft-log-level warn').
#
# The nodes run TLS 1.3 and an encrypted gossip (docs/SECURITY.md): a dev
# CA, node certificates, a client certificate "admin" and a gossip key are
# made under data/certs on first start (kept afterwards), with
# data/certs/env, the NORN_CA, NORN_CERT and NORN_KEY exports that nornctl
# needs (`. data/certs/env`). TLS=0, or -insecure in NORND_ARGS, runs them
# in cleartext instead (loopback only; the benchmarks next to NATS, which
# runs without TLS, do). `add` starts a node the way the cluster was
# started, as recorded in data/tls.
set -euo pipefail

BIN=${BIN:-bin}
DATA=${DATA:-data}
NODES=(1 2 3)
CERTS=$DATA/certs

# tls_wanted: TLS unless TLS=0 (or no, off, false) or -insecure is among
# NORND_ARGS.
tls_wanted() {
	case "${TLS:-}" in 0 | no | off | false) return 1 ;; esac
	case " ${NORND_ARGS:-} " in *" -insecure "* | *" --insecure "* | *" -insecure=true "*) return 1 ;; esac
	return 0
}
# A cluster keeps the settings it was started with: a restart (make
# cluster after a kill -9 or after make cluster-stop) without TLS or
# NORND_ARGS in the environment starts its nodes with the ones recorded
# in data/tls and data/args at the last start, so a node brought back
# never runs without the access file or TLS the others have. Given
# again, they replace the recorded ones (with a warning while nodes run
# with the old ones).
ARGS_GIVEN=${NORND_ARGS+1}
if [ -z "$ARGS_GIVEN" ] && [ -f "$DATA/args" ]; then
	NORND_ARGS=$(cat "$DATA/args")
fi
USE_TLS=
if [ -z "${TLS:-}" ] && [ -z "$ARGS_GIVEN" ] && [ -f "$DATA/tls" ]; then
	USE_TLS=$(cat "$DATA/tls")
elif tls_wanted; then
	USE_TLS=1
fi
SCHEME=http
CURL=(curl -fsS)
if [ -n "$USE_TLS" ]; then
	SCHEME=https
	CURL=(curl -fsS --cacert "$CERTS/ca.crt" --cert "$CERTS/client-admin.crt" --key "$CERTS/client-admin.key")
fi

# certs makes the dev CA, a gossip key and the client certificate once,
# and node $1's certificate when missing.
certs() {
	if [ ! -f "$CERTS/ca.crt" ]; then
		"$BIN/nornctl" cert create-ca --dir "$CERTS" --name "Norn dev CA" >/dev/null
		"$BIN/nornctl" cert create-gossip-key --dir "$CERTS" >/dev/null
		"$BIN/nornctl" cert create-client admin --dir "$CERTS" >/dev/null
	fi
	if [ ! -f "$CERTS/env" ]; then
		local abs
		abs=$(cd "$CERTS" && pwd)
		printf 'export NORN_CA=%s NORN_CERT=%s NORN_KEY=%s\n' "$abs/ca.crt" "$abs/client-admin.crt" "$abs/client-admin.key" >"$CERTS/env"
	fi
	if [ ! -f "$CERTS/node-n$1.crt" ]; then
		"$BIN/nornctl" cert create-node "n$1" --host 127.0.0.1,localhost --dir "$CERTS" >/dev/null
	fi
}

# tlsargs prints node $1's TLS flags (none without TLS).
tlsargs() {
	if [ -n "$USE_TLS" ]; then
		certs "$1"
		echo "-tls-ca $CERTS/ca.crt -tls-cert $CERTS/node-n$1.crt -tls-key $CERTS/node-n$1.key -gossip-key $CERTS/gossip.key"
	fi
}

api()    { echo "127.0.0.1:74$(( ($1 - 1) * 1 ))0"; }
raft()   { echo "127.0.0.1:74$(( ($1 - 1) * 1 ))1"; }
gossip() { echo "127.0.0.1:74$(( ($1 - 1) * 1 ))2"; }
pprof()  { echo "127.0.0.1:74$(( ($1 - 1) * 1 ))9"; }

# running PIDFILE: the process is alive (a killed one not yet reaped by
# its parent is a zombie: not running).
running() {
	[ -f "$1" ] || return 1
	local st
	st=$(ps -o stat= -p "$(cat "$1")" 2>/dev/null) || return 1
	[ -n "$st" ] && [ "${st:0:1}" != Z ]
}

# record_settings keeps this start's TLS choice and NORND_ARGS for the
# next one, warning when they change under running nodes.
record_settings() {
	local old_args="" old_tls="" i
	[ -f "$DATA/args" ] && old_args=$(cat "$DATA/args")
	[ -f "$DATA/tls" ] && old_tls=$(cat "$DATA/tls")
	if [ -f "$DATA/tls" ] && { [ "$old_args" != "${NORND_ARGS:-}" ] || [ "$old_tls" != "$USE_TLS" ]; }; then
		for i in 1 2 3 4 5 6 7 8 9; do
			if running "$DATA/pids/node$i.pid"; then
				echo "warning: n$i runs with NORND_ARGS='$old_args' TLS=${old_tls:-0}; nodes started now get NORND_ARGS='${NORND_ARGS:-}' TLS=${USE_TLS:-0} (make cluster-stop first to change every node)" >&2
				break
			fi
		done
	fi
	printf '%s\n' "${NORND_ARGS:-}" >"$DATA/args"
	echo "$USE_TLS" >"$DATA/tls"
}

start() {
	mkdir -p "$DATA/logs" "$DATA/pids"
	record_settings
	for i in "${NODES[@]}"; do
		pidf="$DATA/pids/node$i.pid"
		if running "$pidf"; then
			echo "node n$i already running (pid $(cat "$pidf"))"
			continue
		fi
		extra=()
		if [ -n "${PPROF:-}" ]; then extra+=(-pprof-addr "$(pprof "$i")"); fi
		joins=()
		for j in "${NODES[@]}"; do [ "$j" != "$i" ] && joins+=("$(gossip "$j")"); done
		targs=$(tlsargs "$i") # here, not in the background line: the nodes would race to make the CA
		"$BIN/nornd" -node-id "n$i" -machine-id "$i" -data-dir "$DATA/node$i" \
			-listen "$(api "$i")" -raft-addr "$(raft "$i")" -gossip-addr "$(gossip "$i")" \
			-bootstrap-expect 3 -join "$(IFS=,; echo "${joins[*]}")" ${extra[@]+"${extra[@]}"} $targs ${NORND_ARGS:-} \
			>>"$DATA/logs/node$i.log" 2>&1 &
		echo $! >"$pidf"
		echo "started n$i (pid $!): API $(api "$i"), log $DATA/logs/node$i.log"
	done
	echo -n "waiting for the cluster to be healthy"
	for _ in $(seq 1 120); do
		ok=0
		for i in "${NODES[@]}"; do
			if "${CURL[@]}" -o /dev/null "$SCHEME://$(api "$i")/healthz" 2>/dev/null; then ok=$((ok + 1)); fi
		done
		if [ "$ok" = 3 ]; then
			echo " ok"
			id=$("${CURL[@]}" -H 'Content-Type: application/json' -d '{}' \
				"$SCHEME://$(api 1)/norn.v1.AdminService/Status" | grep -o '"ringEpoch":"[0-9]*"' || true)
			cat <<MSG

Norn cluster of 3 nodes is up ($id). Try:
MSG
			if [ -n "$USE_TLS" ]; then
				cat <<MSG

  . $CERTS/env    # TLS: nornctl's NORN_CA, NORN_CERT, NORN_KEY (the dev CA, client "admin")
MSG
			else
				echo "  (the nodes run in cleartext: TLS=0 or -insecure)"
			fi
			cat <<MSG

  $BIN/nornctl enqueue emails 'hello world' --addr 127.0.0.1:7400   # prints the task id
  $BIN/nornctl claim emails --lease 30s --addr 127.0.0.1:7410        # any node: prints id and claim id
  $BIN/nornctl complete <id> <claim-id> --addr 127.0.0.1:7420
  $BIN/nornctl get <id>
  $BIN/nornctl status                                                # nodes, ring epoch, partitions

  web console: $SCHEME://127.0.0.1:7400/ui/   (with TLS a browser needs a client certificate or a token: docs/CONSOLE.md)

  kill -9 \$(cat $DATA/pids/node2.pid)   # the other two keep serving
  make cluster-stop                      # stops exactly these processes
MSG
			return 0
		fi
		for i in "${NODES[@]}"; do
			if ! running "$DATA/pids/node$i.pid"; then
				echo; echo "node n$i exited; last lines of its log:" >&2
				tail -n 20 "$DATA/logs/node$i.log" >&2
				return 1
			fi
		done
		echo -n .
		sleep 0.5
	done
	echo; echo "the cluster did not become healthy within 60 s; see $DATA/logs/" >&2
	return 1
}

# add starts node $1 joining the cluster's gossip (not its ring).
add() {
	local i=${1:-}
	if ! [[ "$i" =~ ^[4-9]$ ]]; then
		echo "usage: $0 add N   (N from 4 to 9; n1-n3 are the cluster's first nodes)" >&2
		exit 2
	fi
	mkdir -p "$DATA/logs" "$DATA/pids"
	pidf="$DATA/pids/node$i.pid"
	if running "$pidf"; then
		echo "node n$i already running (pid $(cat "$pidf"))"
		return 0
	fi
	targs=$(tlsargs "$i")
	"$BIN/nornd" -node-id "n$i" -machine-id "$i" -data-dir "$DATA/node$i" \
		-listen "$(api "$i")" -raft-addr "$(raft "$i")" -gossip-addr "$(gossip "$i")" \
		-join "$(gossip 1),$(gossip 2),$(gossip 3)" $targs ${NORND_ARGS:-} >>"$DATA/logs/node$i.log" 2>&1 &
	echo $! >"$pidf"
	echo -n "started n$i (pid $!): API $(api "$i"), log $DATA/logs/node$i.log; waiting for it to see the cluster"
	for _ in $(seq 1 60); do
		if "${CURL[@]}" -o /dev/null "$SCHEME://$(api "$i")/healthz" 2>/dev/null; then
			echo " ok"
			echo "admit it with: $BIN/nornctl join n$i   (then $BIN/nornctl rebalance)"
			return 0
		fi
		if ! running "$pidf"; then
			echo; echo "node n$i exited; last lines of its log:" >&2
			tail -n 20 "$DATA/logs/node$i.log" >&2
			return 1
		fi
		echo -n .
		sleep 0.5
	done
	echo; echo "n$i did not become healthy within 30 s; see $DATA/logs/node$i.log" >&2
	return 1
}

stop() {
	local all=("${NODES[@]}")
	for f in "$DATA"/pids/node*.pid; do
		[ -e "$f" ] || continue
		j=${f##*/node}; j=${j%.pid}
		[[ " ${all[*]} " == *" $j "* ]] || all+=("$j")
	done
	for i in "${all[@]}"; do
		pidf="$DATA/pids/node$i.pid"
		if running "$pidf"; then
			pid=$(cat "$pidf")
			kill -TERM "$pid"
			for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
			if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid"; fi
			echo "stopped n$i (pid $pid)"
		fi
		rm -f "$pidf"
	done
}

case "${1:-start}" in
start) start ;;
add) add "${2:-}" ;;
stop) stop ;;
*) echo "usage: $0 start|add N|stop" >&2; exit 2 ;;
esac
