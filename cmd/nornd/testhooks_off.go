//go:build !testhooks

package main

import (
	"flag"
	"log/slog"
	"net/http"

	"github.com/norn-dev/norn/node"
)

// A release build: no test hook flags, routes or seeded bugs (see
// testhooks.go, built only with the tag testhooks).
type testHooks struct{}

func addTestHookFlags(*flag.FlagSet) *testHooks { return &testHooks{} }

func (*testHooks) configure(*node.Config, *slog.Logger) error { return nil }

func (*testHooks) wrap(api http.Handler, _ *node.Node, _ *slog.Logger) http.Handler { return api }
