// Command nornctl is the command-line client of Norn: it enqueues, reads,
// claims and settles tasks, reports a node's status, changes the cluster's
// placement (join, rebalance, drain, decommission, remove) and generates
// load (bench). It talks to one node over the Go client library (package
// client), so it retries what the library retries and nothing else.
//
//	nornctl [global flags] <command> [flags] [args]
//
//	nornctl enqueue emails 'hello' --priority 5      # prints the task id
//	nornctl claim emails --max 10 --lease 1m -o json # scripts parse claimId
//	nornctl complete <id> <claim-id> --result done
//	nornctl get <id>                                  # the task and its history
//	nornctl status                                    # the node and its partitions
//	nornctl health --addr 10.0.0.1:7400,10.0.0.2:7400 # exit 0 once both are ready
//	nornctl join n4                                   # admit a started node
//	nornctl rebalance                                 # show the plan, ask, apply, watch
//	nornctl rebalance status                          # the moves under way
//	nornctl rebalance cancel                          # roll back the moves not yet promoted
//	nornctl drain n2 --dry-run                        # what draining n2 would move
//	nornctl decommission n2 --yes                     # move everything off n2, then remove it
//	nornctl remove n3 --dead                          # replace a node gone for good
//	nornctl bench                                     # enqueue, then claim+complete, 50,000 tasks
//	nornctl export tasks.jsonl                        # every task, one JSON line each
//	nornctl --addr new:7400 import tasks.jsonl        # into another cluster: ids kept, no claims
//	nornctl backup /var/backups/norn/today            # a checkpoint on every node's own disk
//	source <(nornctl completion bash)                 # also zsh and fish
//
// The node is --addr, else the environment variable NORN_ADDR, else
// 127.0.0.1:7400. Output is a human-readable table unless -o json, which
// prints the response message as protojson, one document per command (bench
// prints its own JSON summary). Global flags may also follow the command.
//
// The placement commands (rebalance, drain, decommission, remove) first ask
// for the plan without applying it and print it: the replica moves and each
// node's replica count before and after. --dry-run stops there; otherwise
// nornctl asks "apply this plan? [y/N]" on standard error (--yes does not
// ask), applies the plan (the node may plan again if the ring changed in
// between: the applied plan is printed), then polls Status every 500 ms and
// prints each move's state changes until every move is done or failed
// (--watch=false returns at once). They send every call to --addr only,
// so the watch sees one node's view of the ring.
//
// Exit status: 0 on success, 2 on a usage error (with the usage text on
// standard error), 1 on any other error, which is printed on standard error
// as "nornctl: <message>" (with the server's code, for example NOT_FOUND).
// A plan not applied (the answer was not yes) and a move that failed are
// errors.
//
// Files: main.go (dispatch, global flags, errors), commands.go (one function
// per task and status command), placement.go (the placement commands, the
// prompt and the watch), args.go (parsing of flag values and positional
// arguments), output.go (tables and JSON), bench.go (the load generator),
// health.go (the health check of containers and scripts), backup.go
// (export, import, backup), version.go, completion.go (the shell scripts,
// made from the commands table).
package main
