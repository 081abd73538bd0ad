package node

import "log/slog"

// LogComponentKey is the attribute that names the part of the node a log
// line comes from: each part logs through Config.Logger.With(
// LogComponentKey, name), so that a handler can set a level per part
// (nornd -log-level info,dispatch=debug).
const LogComponentKey = "component"

// LogComponents are the names the node's parts log under, sorted.
// hashicorp/raft and memberlist log as "raft" (NewRaftLogger), at the
// level of Config.RaftLogger (nornd -raft-log-level).
var LogComponents = []string{"antientropy", "clock", "coord", "dispatch", "raft", "rebalance", "replicas", "server", "storage", "transport"}

// logger is the logger of one of the node's parts (a LogComponents name).
func (c *Config) logger(component string) *slog.Logger {
	return c.Logger.With(LogComponentKey, component)
}
