package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/norn-dev/norn/client"
)

const healthHelp = `
health asks GET /healthz of the node at --addr (of each node of a
comma-separated list) and exits 0 when every one answers 200: the node's
cluster is formed and every partition it replicates has a leader. With
--live it asks GET /livez instead, which answers 200 whenever the node's
HTTP server runs (the cluster's state and the disk do not matter). It
speaks TLS when --ca (or NORN_CA) is given; these endpoints need no client
certificate. Container health checks and scripts use it: the images have
no shell or curl (deploy/Dockerfile).`

// healthTimeout bounds one health request when --timeout is 0 (none).
const healthTimeout = 10 * time.Second

// runHealth serves `nornctl health [--live]`.
func runHealth(e *env, cmd *command, args []string) error {
	fs := e.flagSet(cmd)
	live := fs.Bool("live", false, "ask /livez (the process serves) instead of /healthz (the node is ready)")
	if _, err := e.parse(cmd, fs, args, 0, 0); err != nil {
		return err
	}
	path := "/healthz"
	if *live {
		path = "/livez"
	}
	hc := &http.Client{Timeout: e.g.timeout}
	if hc.Timeout == 0 {
		hc.Timeout = healthTimeout
	}
	scheme := "http://"
	if e.g.ca != "" {
		conf, err := client.LoadTLSConfig(e.g.ca, e.g.cert, e.g.key)
		if err != nil {
			return err
		}
		hc.Transport = &http.Transport{TLSClientConfig: conf}
		scheme = "https://"
	} else if e.g.cert != "" || e.g.key != "" {
		return errors.New("--cert and --key need --ca (or NORN_CA)")
	}
	var errs []error
	var report healthReport
	for _, addr := range strings.Split(e.g.addr, ",") {
		if addr = strings.TrimSpace(addr); addr == "" {
			continue
		}
		if !strings.Contains(addr, "://") {
			addr = scheme + addr
		}
		err := checkHealth(e.ctx, hc, strings.TrimSuffix(addr, "/")+path)
		report.Nodes = append(report.Nodes, healthNode{Address: addr, OK: err == nil, Error: errString(err)})
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if !e.json() {
			fmt.Fprintf(e.stdout, "%s: ok\n", addr)
		}
	}
	if e.json() {
		b, _ := json.Marshal(report)
		fmt.Fprintf(e.stdout, "%s\n", b)
	}
	return errors.Join(errs...)
}

// healthReport is `nornctl health -o json`'s answer: every address asked,
// whether it answered OK, and why not.
type healthReport struct {
	Nodes []healthNode `json:"nodes"`
}

type healthNode struct {
	Address string `json:"address"`
	OK      bool   `json:"ok"`
	Error   string `json:"error,omitempty"`
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// checkHealth GETs url and returns nil on 200, else an error naming url
// with the status and the start of the body.
func checkHealth(ctx context.Context, hc *http.Client, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s: %s", url, resp.Status, strings.TrimSpace(string(body)))
	}
	return nil
}
