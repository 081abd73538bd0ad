package main

// The Norn driver: the same workloads as the NATS driver, through Norn's
// own Go client (the work tree's: go.mod replaces the module with ../).

import (
	"context"
	"flag"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
	"github.com/norn-dev/norn/client"
)

func nornMain(c *Common, fs *flag.FlagSet, args []string) error {
	addrs := fs.String("addrs", "127.0.0.1:7400,127.0.0.1:7410,127.0.0.1:7420", "comma-separated node addresses")
	w := fs.Int("w", 2, "write quorum")
	batch := fs.Int("batch", 16, "claim: tasks per Claim")
	pipeline := fs.Int("pipeline", 1, "claim: Complete calls in flight per worker (1: one after another, like the NATS driver's DoubleAck)")
	framed := fs.Bool("framed", true, "framed calls for the hot methods (client.WithFramedCalls); false: connect for every call")
	linger := fs.Duration("linger", time.Millisecond, "client coalescing linger for Enqueue (and Complete when pipeline > 1); 0: off")
	maxBatch := fs.Int("max-batch", 500, "the most enqueues one coalesced batch holds (with -linger > 0)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.Timeout)
	defer cancel()
	opts := []client.Option{client.WithDefaultQuorum(uint32(*w)), client.WithFramedCalls(*framed)}
	if *linger > 0 {
		opts = append(opts, client.WithEnqueueBatching(*linger, *maxBatch))
		if *pipeline > 1 {
			opts = append(opts, client.WithCompleteBatching(*linger, 1000))
		}
	}
	cl, err := client.New(*addrs, opts...)
	if err != nil {
		return err
	}
	defer cl.Close()
	queue := fmt.Sprintf("peerbench-%d", time.Now().UnixNano())
	res := newResult(c)
	res.Params["w"] = *w
	res.Params["linger"] = linger.String()
	res.Params["framed"] = *framed
	payload := payloadBytes(c.Payload)
	spec := func() *nornv1.TaskSpec { return &nornv1.TaskSpec{Queue: queue, Payload: payload} }

	switch c.Workload {
	case "enqueue":
		rec := NewRecorder(c.N)
		if err := c.CPU.begin(); err != nil {
			return err
		}
		start := time.Now()
		errs := runConcurrent(c.N, c.Inflight, func(int) error {
			t := time.Now()
			if _, err := cl.Enqueue(ctx, spec()); err != nil {
				return err
			}
			rec.Add(time.Since(t))
			return nil
		})
		elapsed := time.Since(start)
		if err := c.CPU.endWindow(); err != nil {
			return err
		}
		res.Errors = errs
		res.finish(int64(rec.Len()), elapsed)
		res.Lat["ack"] = rec.Stats()
		res.LatDesc["ack"] = fmt.Sprintf("Enqueue call -> answer (W=%d, synced), %d in flight", *w, c.Inflight)
		if err := c.CPU.finish(res); err != nil {
			return err
		}
	case "claim":
		if errs := runConcurrent(c.N, c.Inflight, func(int) error { _, err := cl.Enqueue(ctx, spec()); return err }); errs > 0 {
			return fmt.Errorf("preload: %d errors", errs)
		}
		if err := nornClaim(ctx, c, cl, queue, *batch, *pipeline, res); err != nil {
			return err
		}
		if err := c.CPU.finish(res); err != nil {
			return err
		}
		res.Params["batch"] = *batch
		res.Params["pipeline"] = *pipeline
	default:
		return fmt.Errorf("unknown workload %q", c.Workload)
	}
	return res.write(c.Out)
}

func nornClaim(ctx context.Context, c *Common, cl *client.Client, queue string, batch, pipeline int, res *Result) error {
	claimRec, doneRec := NewRecorder(c.N), NewRecorder(c.N)
	var (
		completed, errs atomic.Int64
		endOnce         sync.Once
		end             time.Time
		doneCh          = make(chan struct{})
		wg              sync.WaitGroup
	)
	n := int64(c.N)
	if err := c.CPU.begin(); err != nil {
		return err
	}
	start := time.Now()
	for w := 0; w < c.Workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			sem := make(chan struct{}, pipeline)
			for {
				select {
				case <-doneCh:
					return
				case <-ctx.Done():
					return
				default:
				}
				t0 := time.Now()
				got, err := cl.Claim(ctx, client.ClaimRequest{Queue: queue, Worker: fmt.Sprintf("peerbench-%d", w), Lease: time.Minute, Max: batch, Wait: time.Second})
				if err != nil || len(got) == 0 {
					if err != nil && errs.Add(1) == 1 {
						fmt.Fprintln(os.Stderr, "claim error:", err)
					}
					time.Sleep(time.Millisecond)
					continue
				}
				claimRec.Add(time.Since(t0))
				var bw sync.WaitGroup
				for _, ct := range got {
					sem <- struct{}{}
					bw.Add(1)
					go func(ct *nornv1.ClaimedTask) {
						defer func() { <-sem; bw.Done() }()
						t1 := time.Now()
						if err := cl.Complete(ctx, ct.GetTask().GetId(), ct.GetClaimId(), nil); err != nil {
							if errs.Add(1) == 1 {
								fmt.Fprintln(os.Stderr, "complete error:", err)
							}
							return
						}
						doneRec.Add(time.Since(t1))
						if completed.Add(1) == n {
							endOnce.Do(func() { end = time.Now(); close(doneCh) })
						}
					}(ct)
				}
				bw.Wait()
			}
		}(w)
	}
	var elapsed time.Duration
	select {
	case <-doneCh:
		elapsed = end.Sub(start)
	case <-ctx.Done():
		elapsed = time.Since(start)
		fmt.Fprintln(os.Stderr, "claim: timed out with", completed.Load(), "completed")
	}
	if err := c.CPU.endWindow(); err != nil {
		return err
	}
	waitDone := make(chan struct{})
	go func() { wg.Wait(); close(waitDone) }()
	select {
	case <-waitDone:
	case <-time.After(5 * time.Second):
	}
	res.Errors = errs.Load()
	res.finish(completed.Load(), elapsed)
	res.Lat["claim"] = claimRec.Stats()
	res.LatDesc["claim"] = fmt.Sprintf("Claim(max=%d) call -> answer with tasks", batch)
	res.Lat["complete"] = doneRec.Stats()
	res.LatDesc["complete"] = fmt.Sprintf("Complete call -> answer, %d in flight per worker", pipeline)
	return nil
}
