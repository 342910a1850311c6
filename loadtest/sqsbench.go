package loadtest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shardmq/shardmq/sqs"
)

// The SQS leg of bench-consume (docs/sqs.md, docs/loadtest.md): the same
// backlog drained through the router's SQS API — ReceiveMessage of 10,
// DeleteMessageBatch of what came — and through its own API with the same
// batches — claim 10, ack them — by Consumers consumers each, in the same
// run; each backlog (SQSPreload) is loaded in batches of 10
// (SendMessageBatch, and a produce of 10) before its drain is timed. Its line is
// `sqs consume ratio sqs/native: R`.

const (
	sqsBatch   = 10
	sqsBody    = 100 // bytes of every message body, on both legs
	sqsFigure  = "consume batches of 10 (sqs: ReceiveMessage + DeleteMessageBatch; native: claim + ack)"
	sqsRatioID = "sqs"
)

// sqsLeg talks to one router over plain HTTP: the SQS API's JSON protocol
// (signed when the run has an access key) and the router's own API.
type sqsLeg struct {
	base  string
	token string
	key   string
	sec   string
	hc    *http.Client
}

func (r *runner) newSQSLeg() *sqsLeg {
	base := "http://127.0.0.1:8080"
	if len(r.cfg.Routers) > 0 {
		base = strings.TrimSuffix(r.cfg.Routers[0], "/")
	}
	conns := r.cfg.Consumers + r.cfg.Producers + 2
	return &sqsLeg{base: base, token: r.cfg.Token, key: r.cfg.SQSAccessKey, sec: r.cfg.SQSSecret,
		hc: &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: conns, MaxConnsPerHost: conns}}}
}

// call sends one SQS action and decodes its answer into out.
func (l *sqsLeg) call(ctx context.Context, action string, in, out any) error {
	body, err := json.Marshal(in)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, "POST", l.base+"/", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/x-amz-json-1.0")
	req.Header.Set("X-Amz-Target", "AmazonSQS."+action)
	if l.key != "" {
		sqs.Sign(req, body, l.key, l.sec, "us-east-1", time.Now())
	}
	return l.send(req, out)
}

// native sends one request to the router's own API.
func (l *sqsLeg) native(ctx context.Context, path string, in, out any) error {
	body, err := json.Marshal(in)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, "POST", l.base+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if l.token != "" {
		req.Header.Set("Authorization", "Bearer "+l.token)
	}
	return l.send(req, out)
}

func (l *sqsLeg) send(req *http.Request, out any) error {
	resp, err := l.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s %s: %d %s", req.Method, req.URL.Path, resp.StatusCode, bytes.TrimSpace(data))
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(data, out)
}

// leg is one side's load and drain.
type leg struct {
	name    string
	load    func(ctx context.Context, n int) error
	consume func(ctx context.Context) (int, error) // one batch: how many were consumed
}

// benchSQS runs the SQS leg: Rounds rounds, alternating which side goes
// first, each side draining a backlog of Preload messages.
func (r *runner) benchSQS(ctx context.Context) error {
	l := r.newSQSLeg()
	if l.token != "" && l.key == "" {
		// A router of another process with a token file: its SQS API
		// asks for a signature this run has no key for.
		if r.progress.w != nil {
			fmt.Fprintln(r.progress.w, "sqs leg skipped: the router asks for a token and the run has no SQS access key (run it with -router-bin)")
		}
		return nil
	}
	queue := r.run + "-sqs"
	topic := r.run + "-native"
	var created struct{ QueueUrl string }
	if err := l.call(ctx, "CreateQueue", map[string]any{"QueueName": queue}, &created); err != nil {
		return fmt.Errorf("sqs leg: %w", err)
	}
	body := strings.Repeat("s", sqsBody)
	native := strings.Repeat("n", sqsBody-2) // a JSON string of sqsBody bytes
	var seq atomic.Int64
	sides := []leg{
		{name: "sqs",
			load: func(ctx context.Context, n int) error {
				entries := make([]map[string]any, n)
				for i := range entries {
					entries[i] = map[string]any{"Id": fmt.Sprint(i), "MessageBody": body}
				}
				var out struct{ Failed []any }
				if err := l.call(ctx, "SendMessageBatch", map[string]any{"QueueUrl": created.QueueUrl, "Entries": entries}, &out); err != nil {
					return err
				}
				if len(out.Failed) > 0 {
					return fmt.Errorf("sqs leg: %d messages of a batch not sent", len(out.Failed))
				}
				return nil
			},
			consume: func(ctx context.Context) (int, error) {
				var got struct {
					Messages []struct{ ReceiptHandle string }
				}
				if err := l.call(ctx, "ReceiveMessage", map[string]any{"QueueUrl": created.QueueUrl, "MaxNumberOfMessages": sqsBatch, "WaitTimeSeconds": 1}, &got); err != nil {
					return 0, err
				}
				if len(got.Messages) == 0 {
					return 0, nil
				}
				entries := make([]map[string]string, len(got.Messages))
				for i, m := range got.Messages {
					entries[i] = map[string]string{"Id": fmt.Sprint(i), "ReceiptHandle": m.ReceiptHandle}
				}
				var out struct{ Successful []any }
				if err := l.call(ctx, "DeleteMessageBatch", map[string]any{"QueueUrl": created.QueueUrl, "Entries": entries}, &out); err != nil {
					return 0, err
				}
				return len(out.Successful), nil
			}},
		{name: "native",
			load: func(ctx context.Context, n int) error {
				msgs := make([]map[string]any, n)
				for i := range msgs {
					// A key of its own: without one the same payload
					// would be deduplicated.
					msgs[i] = map[string]any{"key": fmt.Sprintf("%s-%d", topic, seq.Add(1)), "payload": native}
				}
				var out struct{ Results []struct{ Status string } }
				if err := l.native(ctx, "/v1/topics/"+topic+"/messages", map[string]any{"messages": msgs}, &out); err != nil {
					return err
				}
				for _, res := range out.Results {
					if res.Status != "created" {
						return fmt.Errorf("native leg: a message was %s", res.Status)
					}
				}
				return nil
			},
			consume: func(ctx context.Context) (int, error) {
				var got struct {
					Messages []struct{ Receipt string }
				}
				if err := l.native(ctx, "/v1/topics/"+topic+"/subscriptions/default/claim", map[string]any{"max": sqsBatch, "wait_ms": 1000}, &got); err != nil {
					return 0, err
				}
				if len(got.Messages) == 0 {
					return 0, nil
				}
				receipts := make([]string, len(got.Messages))
				for i, m := range got.Messages {
					receipts[i] = m.Receipt
				}
				var out struct{ Results []struct{ Status string } }
				if err := l.native(ctx, "/v1/ack", map[string]any{"receipts": receipts}, &out); err != nil {
					return 0, err
				}
				n := 0
				for _, res := range out.Results {
					if res.Status == "ok" {
						n++
					}
				}
				return n, nil
			}},
	}
	backlog := r.cfg.SQSPreload
	for round := range r.cfg.Rounds {
		order := sides
		if round%2 == 1 {
			order = []leg{sides[1], sides[0]}
		}
		for _, s := range order {
			if err := r.loadLeg(ctx, s, backlog); err != nil {
				return err
			}
			n, secs, err := r.drainLeg(ctx, s, backlog)
			if err != nil {
				return err
			}
			if r.progress.w != nil {
				fmt.Fprintf(r.progress.w, "sqs leg: %s drained %d in %.1f s (round %d)\n", s.name, n, secs, round+1)
			}
			r.result(sqsFigure, s.name, int64(n), secs)
		}
	}
	r.ratioOf(sqsRatioID, sqsFigure, "sqs", sqsFigure, "native")
	return nil
}

// loadLeg sends n messages in batches of 10 from Producers workers.
func (r *runner) loadLeg(ctx context.Context, s leg, n int) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, r.cfg.Producers)
	for range r.cfg.Producers {
		wg.Go(func() {
			for {
				start := next.Add(sqsBatch) - sqsBatch
				if start >= int64(n) {
					return
				}
				if err := s.load(ctx, int(min(sqsBatch, int64(n)-start))); err != nil {
					errs <- fmt.Errorf("%s leg: load: %w", s.name, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// drainLeg consumes until n messages were consumed (or Drain passes) with
// Consumers workers, and says how many in how long.
func (r *runner) drainLeg(ctx context.Context, s leg, n int) (int, float64, error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.Drain)
	defer cancel()
	var done atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, r.cfg.Consumers)
	start := time.Now()
	for range r.cfg.Consumers {
		wg.Go(func() {
			for done.Load() < int64(n) && ctx.Err() == nil {
				got, err := s.consume(ctx)
				if err != nil {
					if ctx.Err() == nil {
						errs <- fmt.Errorf("%s leg: consume: %w", s.name, err)
					}
					cancel()
					return
				}
				done.Add(int64(got))
			}
		})
	}
	wg.Wait()
	secs := time.Since(start).Seconds()
	close(errs)
	if err := <-errs; err != nil {
		return int(done.Load()), secs, err
	}
	if done.Load() < int64(n) {
		return int(done.Load()), secs, fmt.Errorf("%s leg: drained %d of %d within %v", s.name, done.Load(), n, r.cfg.Drain)
	}
	return int(done.Load()), secs, nil
}
