package main

import (
	"flag"
	"fmt"
	"strings"
)

// envPrefix starts the environment variable of every nornd flag: NORN_
// and the flag's name upper-cased, dashes made underscores
// (-skew-buffer: NORN_SKEW_BUFFER).
const envPrefix = "NORN_"

// envName is the environment variable of the flag named name.
func envName(name string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// noEnv lists the flags that have no environment variable: -version is
// an action, not a setting.
var noEnv = map[string]bool{"version": true}

// applyEnv sets every flag not given on the command line whose variable
// is in environ ("KEY=value" entries, as os.Environ). Other NORN_*
// variables are ignored: nornctl's (NORN_ADDR, NORN_CA, ...) and those
// Kubernetes makes for a Service named norn (NORN_PORT, ...) share the
// prefix.
func applyEnv(fs *flag.FlagSet, environ []string) error {
	env := map[string]string{}
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok && strings.HasPrefix(k, envPrefix) {
			env[k] = v
		}
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if err != nil || given[f.Name] || noEnv[f.Name] {
			return
		}
		if v, ok := env[envName(f.Name)]; ok {
			if serr := fs.Set(f.Name, v); serr != nil {
				err = fmt.Errorf("%s=%q (-%s): %w", envName(f.Name), v, f.Name, serr)
			}
		}
	})
	return err
}
