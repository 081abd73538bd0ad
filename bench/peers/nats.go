package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

const (
	natsStream   = "TASKS"
	natsSubject  = "tasks.q"
	natsConsumer = "workers"
)

func natsMain(c *Common, fs *flag.FlagSet, args []string) error {
	urls := fs.String("urls", "nats://127.0.0.1:14222", "comma-separated server URLs")
	replicas := fs.Int("replicas", 1, "stream replicas (1 or 3)")
	batch := fs.Int("batch", 16, "claim: messages per Fetch (pull request batch)")
	pipeline := fs.Int("pipeline", 1, "claim: DoubleAck calls in flight per worker (1: one after another)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.Timeout)
	defer cancel()

	nc, err := nats.Connect(*urls, nats.Name("peerbench"), nats.Timeout(5*time.Second))
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(c.Inflight))
	if err != nil {
		return err
	}
	s, err := natsResetStream(ctx, js, *replicas)
	if err != nil {
		return err
	}
	res := newResult(c)
	res.Params["replicas"] = *replicas
	res.Params["connected_url"] = nc.ConnectedUrlRedacted()
	payload := payloadBytes(c.Payload)

	switch c.Workload {
	case "enqueue":
		rec := NewRecorder(c.N)
		if err := c.CPU.begin(); err != nil {
			return err
		}
		start := time.Now()
		errs, err := natsPublishAsync(ctx, js, c.N, payload, rec)
		elapsed := time.Since(start)
		if err != nil {
			return err
		}
		if err := c.CPU.endWindow(); err != nil {
			return err
		}
		res.Errors = errs
		res.finish(int64(rec.Len()), elapsed)
		res.Lat["ack"] = rec.Stats()
		res.LatDesc["ack"] = fmt.Sprintf("PublishAsync -> PubAck, %d in flight", c.Inflight)
		if err := c.CPU.finish(res); err != nil {
			return err
		}
	case "claim":
		if _, err := natsPublishAsync(ctx, js, c.N, payload, nil); err != nil {
			return fmt.Errorf("preload: %w", err)
		}
		if err := natsWaitMsgs(ctx, s, uint64(c.N)); err != nil {
			return err
		}
		if err := natsClaim(ctx, c, s, *urls, *batch, *pipeline, res); err != nil {
			return err
		}
		if err := c.CPU.finish(res); err != nil {
			return err
		}
		res.Params["batch"] = *batch
		// Work-queue retention: acked messages are removed from the stream.
		time.Sleep(200 * time.Millisecond)
		if info, err := s.Info(ctx); err == nil {
			res.Params["msgs_left_in_stream"] = info.State.Msgs
		}
	default:
		return fmt.Errorf("unknown workload %q", c.Workload)
	}
	return res.write(c.Out)
}

func natsResetStream(ctx context.Context, js jetstream.JetStream, replicas int) (jetstream.Stream, error) {
	// Right after start-up the cluster may still be electing its meta leader:
	// retry for a while.
	var (
		s   jetstream.Stream
		err error
	)
	for deadline := time.Now().Add(30 * time.Second); ; {
		err = js.DeleteStream(ctx, natsStream)
		if err == nil || errors.Is(err, jetstream.ErrStreamNotFound) {
			s, err = natsCreateStream(ctx, js, replicas)
			if err == nil {
				break
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil, fmt.Errorf("reset stream: %w", err)
		}
		time.Sleep(250 * time.Millisecond)
	}
	// Wait until the stream has a leader (R3) before timing anything.
	deadline := time.Now().Add(20 * time.Second)
	for {
		info, err := s.Info(ctx)
		if err == nil && (replicas == 1 || (info.Cluster != nil && info.Cluster.Leader != "" && len(info.Cluster.Replicas) == replicas-1)) {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("stream not ready: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return s, nil
}

func natsCreateStream(ctx context.Context, js jetstream.JetStream, replicas int) (jetstream.Stream, error) {
	return js.CreateStream(ctx, jetstream.StreamConfig{
		Name:      natsStream,
		Subjects:  []string{"tasks.>"},
		Retention: jetstream.WorkQueuePolicy,
		Storage:   jetstream.FileStorage,
		Replicas:  replicas,
		Discard:   jetstream.DiscardOld,
		MaxMsgs:   -1,
		MaxBytes:  -1,
	})
}

func natsWaitMsgs(ctx context.Context, s jetstream.Stream, want uint64) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		info, err := s.Info(ctx)
		if err == nil && info.State.Msgs == want {
			return nil
		}
		if time.Now().After(deadline) {
			if err != nil {
				return err
			}
			return fmt.Errorf("stream has %d msgs, want %d", info.State.Msgs, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// natsPublishAsync publishes n messages with at most the JetStream context's
// max-pending outstanding, and waits for every PubAck. If rec is non-nil the
// latency from send to PubAck of every message is recorded.
func natsPublishAsync(ctx context.Context, js jetstream.JetStream, n int, payload []byte, rec *Recorder) (int64, error) {
	type pending struct {
		f jetstream.PubAckFuture
		t time.Time
	}
	ch := make(chan pending, 4096)
	var errs atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for p := range ch {
			select {
			case <-p.f.Ok():
				if rec != nil {
					rec.Add(time.Since(p.t))
				}
			case err := <-p.f.Err():
				if errs.Add(1) == 1 {
					fmt.Fprintln(os.Stderr, "publish error:", err)
				}
			case <-ctx.Done():
				return
			}
		}
	}()
	for i := 0; i < n; i++ {
		f, err := js.PublishAsync(natsSubject, payload, jetstream.WithStallWait(30*time.Second))
		t := time.Now()
		if err != nil {
			close(ch)
			return errs.Load(), fmt.Errorf("publish async %d: %w", i, err)
		}
		ch <- pending{f, t}
	}
	close(ch)
	select {
	case <-done:
	case <-ctx.Done():
		return errs.Load(), ctx.Err()
	}
	if e := errs.Load(); e > 0 {
		return e, fmt.Errorf("%d publish errors", e)
	}
	return 0, nil
}

func natsClaim(ctx context.Context, c *Common, s jetstream.Stream, urls string, batch, pipeline int, res *Result) error {
	_, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable:       natsConsumer,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       60 * time.Second,
		MaxAckPending: 20000,
		MaxWaiting:    512,
	})
	if err != nil {
		return fmt.Errorf("create consumer: %w", err)
	}
	claimRec := NewRecorder(c.N)
	ackRec := NewRecorder(c.N)
	var (
		completed atomic.Int64
		ackErrs   atomic.Int64
		fetches   atomic.Int64
		endOnce   sync.Once
		end       time.Time
		doneCh    = make(chan struct{})
		startCh   = make(chan struct{})
		ready     sync.WaitGroup
		wg        sync.WaitGroup
	)
	n := int64(c.N)
	setupErr := make(chan error, c.Workers)
	for w := 0; w < c.Workers; w++ {
		ready.Add(1)
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			// One connection per worker, like separate worker processes.
			wnc, err := nats.Connect(urls, nats.Name(fmt.Sprintf("peerbench-worker-%d", w)))
			if err != nil {
				setupErr <- err
				ready.Done()
				return
			}
			defer wnc.Close()
			wjs, err := jetstream.New(wnc)
			if err != nil {
				setupErr <- err
				ready.Done()
				return
			}
			cons, err := wjs.Consumer(ctx, natsStream, natsConsumer)
			if err != nil {
				setupErr <- err
				ready.Done()
				return
			}
			ready.Done()
			<-startCh
			for {
				select {
				case <-doneCh:
					return
				case <-ctx.Done():
					return
				default:
				}
				t0 := time.Now()
				b, err := cons.Fetch(batch, jetstream.FetchMaxWait(time.Second))
				if err != nil {
					if ctx.Err() != nil {
						return
					}
					time.Sleep(time.Millisecond)
					continue
				}
				fetches.Add(1)
				first := true
				sem := make(chan struct{}, pipeline)
				var bw sync.WaitGroup
				for msg := range b.Messages() {
					if first {
						claimRec.Add(time.Since(t0))
						first = false
					}
					sem <- struct{}{}
					bw.Add(1)
					go func(msg jetstream.Msg) {
						defer func() { <-sem; bw.Done() }()
						t1 := time.Now()
						// DoubleAck is the jetstream package's AckSync: it waits
						// for the server's confirmation of the ack.
						actx, acancel := context.WithTimeout(ctx, 10*time.Second)
						err := msg.DoubleAck(actx)
						acancel()
						if err != nil {
							if ackErrs.Add(1) == 1 {
								fmt.Fprintln(os.Stderr, "ack error:", err)
							}
							return
						}
						ackRec.Add(time.Since(t1))
						if completed.Add(1) == n {
							endOnce.Do(func() { end = time.Now(); close(doneCh) })
						}
					}(msg)
				}
				bw.Wait()
			}
		}(w)
	}
	ready.Wait()
	select {
	case err := <-setupErr:
		return err
	default:
	}
	if err := c.CPU.begin(); err != nil {
		close(doneCh)
		close(startCh)
		return err
	}
	start := time.Now()
	close(startCh)
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
	// Workers blocked in a Fetch waiting for more messages exit on expiry.
	waitDone := make(chan struct{})
	go func() { wg.Wait(); close(waitDone) }()
	select {
	case <-waitDone:
	case <-time.After(5 * time.Second):
	}
	res.Errors = ackErrs.Load()
	res.finish(completed.Load(), elapsed)
	res.Lat["claim"] = claimRec.Stats()
	res.LatDesc["claim"] = fmt.Sprintf("Fetch(batch=%d) call -> first message received", batch)
	res.Lat["complete"] = ackRec.Stats()
	res.LatDesc["complete"] = "msg.DoubleAck (= AckSync) round trip (1 task)"
	res.Params["fetch_calls"] = fetches.Load()
	res.Params["pipeline"] = pipeline
	return nil
}
