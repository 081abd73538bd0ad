// Command norn-jepsen runs Norn's Jepsen harness (package jepsen): real
// nornd processes on 127.0.0.(10+i), a workload of concurrent clients,
// nemeses (faults) on a seeded schedule, and checkers over the recorded
// history (package jepsen/check; --check runs them again on a saved
// history). It needs root and iptables. `norn-jepsen --help` lists the
// scenarios and nemeses; see docs/JEPSEN.md.
package main
