package client_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardmq/shardmq/client"
	"github.com/shardmq/shardmq/internal/routertest"
	"github.com/shardmq/shardmq/internal/testbed"
)

var bed *testbed.Bed

func TestMain(m *testing.M) {
	os.Exit(testbed.Main(m, testbed.Spec{Clusters: 2, Replicas: 1}, func(b *testbed.Bed) { bed = b }))
}

// countingTransport counts produce requests and can fail the first ones
// with 503 + Retry-After, as a router with a dead cluster answers.
type countingTransport struct {
	base      http.RoundTripper
	produces  atomic.Int64
	fail503   atomic.Int64 // produce requests still to refuse
	refusedAt atomic.Int64 // unix nanos of the last refusal
	retriedAt atomic.Int64 // unix nanos of the first request after it
}

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if strings.HasSuffix(r.URL.Path, "/messages") {
		c.produces.Add(1)
		if c.fail503.Add(-1) >= 0 {
			c.refusedAt.Store(time.Now().UnixNano())
			body := `{"error":{"code":"unavailable","message":"injected"}}`
			return &http.Response{StatusCode: 503, Header: http.Header{"Retry-After": {"1"}, "Content-Type": {"application/json"}},
				Body: io.NopCloser(strings.NewReader(body)), Request: r, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
				Status: "503 Service Unavailable"}, nil
		}
		if c.refusedAt.Load() != 0 {
			c.retriedAt.CompareAndSwap(0, time.Now().UnixNano())
		}
	}
	return c.base.RoundTrip(r)
}

func newClient(t *testing.T, r *routertest.Router, tr http.RoundTripper) *client.Client {
	t.Helper()
	cfg := client.Config{URL: r.URL, Token: r.Token}
	if tr != nil {
		cfg.HTTPClient = &http.Client{Transport: tr}
	}
	c, err := client.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func topicName(t *testing.T) string {
	return strings.NewReplacer("/", "-", "_", "-", "=", "-").Replace(t.Name()) + fmt.Sprint(time.Now().UnixNano()%100000)
}

// TestProducerGathersSingleSends: 64 goroutines sending one message at a
// time share requests, each gets its own item's answer, and a repeated
// key answers duplicate with the original's id.
func TestProducerGathersSingleSends(t *testing.T) {
	testbed.Need(t)
	r := routertest.Start(t, bed, routertest.Options{})
	tr := &countingTransport{base: http.DefaultTransport}
	c := newClient(t, r, tr)
	p, err := c.NewProducer(client.ProducerConfig{Linger: 2 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(context.Background())
	ctx := context.Background()
	topic := topicName(t)
	const workers, each = 64, 20
	ids := make([][]string, workers)
	var wg sync.WaitGroup
	var failed atomic.Int64
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				key := fmt.Sprintf("k-%d-%d", w, i)
				res, err := p.Send(ctx, topic, client.Message{Key: key, Payload: json.RawMessage(fmt.Sprintf(`{"w":%d,"i":%d}`, w, i))})
				if err != nil || res.Status != client.StatusCreated || res.Key != key || res.ID == "" {
					t.Errorf("send %s: %+v, %v", key, res, err)
					failed.Add(1)
					return
				}
				ids[w] = append(ids[w], res.ID)
			}
		})
	}
	wg.Wait()
	if failed.Load() > 0 {
		t.FailNow()
	}
	n := tr.produces.Load()
	t.Logf("%d messages in %d requests", workers*each, n)
	if n > workers*each/4 {
		t.Errorf("%d requests for %d messages: the producer did not gather them", n, workers*each)
	}
	// The same key again: duplicate, the original id.
	res, err := p.Send(ctx, topic, client.Message{Key: "k-3-7", Payload: json.RawMessage(`{"w":3,"i":7}`)})
	if err != nil || res.Status != client.StatusDuplicate || res.ID != ids[3][7] {
		t.Errorf("resend: %+v, %v; want duplicate of %s", res, err, ids[3][7])
	}
	// Another payload under that key: a conflict, as an error.
	_, err = p.Send(ctx, topic, client.Message{Key: "k-3-7", Payload: json.RawMessage(`{"other":1}`)})
	if !errors.Is(err, client.ErrConflict) {
		t.Errorf("conflicting resend: %v, want ErrConflict", err)
	}
}

// TestProducerRetriesAfterRetryAfter: a request refused 503 with
// Retry-After 1 is sent again, not before a second has passed, and the
// caller sees only the final answer.
func TestProducerRetriesAfterRetryAfter(t *testing.T) {
	testbed.Need(t)
	r := routertest.Start(t, bed, routertest.Options{})
	tr := &countingTransport{base: http.DefaultTransport}
	tr.fail503.Store(2)
	c := newClient(t, r, tr)
	p, err := c.NewProducer(client.ProducerConfig{InitialBackoff: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(context.Background())
	res, err := p.Send(context.Background(), topicName(t), client.Message{Key: "a", Payload: json.RawMessage(`1`)})
	if err != nil || res.Status != client.StatusCreated {
		t.Fatalf("send: %+v, %v", res, err)
	}
	if got := tr.produces.Load(); got != 3 {
		t.Errorf("%d produce requests, want 3 (two refused, one served)", got)
	}
	if wait := time.Duration(tr.retriedAt.Load() - tr.refusedAt.Load()); wait < 900*time.Millisecond {
		t.Errorf("retried %s after a refusal with Retry-After 1", wait)
	}

	// MaxAttempts bounds the retries; the last error says unavailable.
	tr.fail503.Store(100)
	p2, err := c.NewProducer(client.ProducerConfig{MaxAttempts: 2, InitialBackoff: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer p2.Close(context.Background())
	_, err = p2.Send(context.Background(), topicName(t), client.Message{Key: "b", Payload: json.RawMessage(`1`)})
	var e *client.Error
	if !errors.As(err, &e) || e.Code != client.CodeUnavailable || !errors.Is(err, client.ErrUnavailable) {
		t.Errorf("send against a refusing router: %v, want an unavailable *Error", err)
	}
}

// TestErrorsAndToken: a router with a token file refuses a client without
// the token with a typed error, and serves one with it over TLS.
func TestErrorsAndToken(t *testing.T) {
	testbed.Need(t)
	r := routertest.Start(t, bed, routertest.Options{Token: true, TLS: true})
	ctx := context.Background()
	tlsCfg := &tls.Config{RootCAs: r.CA}
	cases := []struct {
		name  string
		token string
		want  *client.Error
	}{
		{"no token", "", client.ErrUnauthorized},
		{"wrong token", "smq_nope", client.ErrUnauthorized},
		{"admin token", r.Token, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := client.New(client.Config{URL: r.URL, Token: tc.token, TLS: tlsCfg})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			res, err := c.Produce(ctx, "tok-topic", "", []client.Message{{Key: "x", Payload: json.RawMessage(`{}`)}})
			if tc.want == nil {
				if err != nil || res[0].Status == client.StatusUnavailable {
					t.Fatalf("produce: %+v, %v", res, err)
				}
				return
			}
			var e *client.Error
			if !errors.As(err, &e) || !errors.Is(err, tc.want) || e.Status != http.StatusUnauthorized {
				t.Fatalf("produce: %v, want %s", err, tc.want.Code)
			}
		})
	}
	// A request the router finds invalid: its code, as a typed error.
	c, _ := client.New(client.Config{URL: r.URL, Token: r.Token, TLS: tlsCfg})
	_, err := c.Produce(ctx, "bad topic!", "", []client.Message{{Key: "x", Payload: json.RawMessage(`{}`)}})
	if !errors.Is(err, client.ErrInvalidTopic) {
		t.Errorf("produce to an invalid topic: %v", err)
	}
	// Without the CA the handshake fails: the client verifies the router.
	c2, _ := client.New(client.Config{URL: r.URL, Token: r.Token})
	if _, err := c2.Produce(ctx, "tok-topic", "", []client.Message{{Key: "y", Payload: json.RawMessage(`{}`)}}); err == nil {
		t.Error("produce over TLS without trusting the router's certificate succeeded")
	}
}

// consumed records what a handler saw.
type consumed struct {
	mu       sync.Mutex
	attempts map[string][]int
}

func (c *consumed) add(d *client.Delivery) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.attempts[d.Key] = append(c.attempts[d.Key], d.Attempt)
	return len(c.attempts[d.Key])
}

func (c *consumed) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.attempts)
}

func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func produceN(t *testing.T, c *client.Client, topic string, n int) {
	t.Helper()
	msgs := make([]client.Message, n)
	for i := range msgs {
		msgs[i] = client.Message{Key: fmt.Sprintf("m%03d", i), Payload: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))}
	}
	res, err := c.Produce(context.Background(), topic, "", msgs)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res {
		if r.Status != client.StatusCreated {
			t.Fatalf("produce: %+v", r)
		}
	}
}

// TestConsumerAcksNacksWithCodes: every message is handled; one failing
// with a HandlerError is nacked with its code and retried at the time it
// asked for; nothing is left afterwards.
func TestConsumerAcksNacksWithCodes(t *testing.T) {
	testbed.Need(t)
	r := routertest.Start(t, bed, routertest.Options{Token: true})
	c := newClient(t, r, nil)
	topic := topicName(t)
	ctx := context.Background()
	if err := c.PutSubscription(ctx, topic, "work", client.Subscription{MaxAttempts: 3}); err != nil {
		t.Fatal(err)
	}
	produceN(t, c, topic, 40)
	seen := &consumed{attempts: map[string][]int{}}
	var running, most atomic.Int64
	cn, err := c.NewConsumer(client.ConsumerConfig{Topic: topic, Subscription: "work", Concurrency: 4, Wait: 200 * time.Millisecond},
		func(ctx context.Context, d *client.Delivery) error {
			now := running.Add(1)
			defer running.Add(-1)
			for {
				m := most.Load()
				if now <= m || most.CompareAndSwap(m, now) {
					break
				}
			}
			if seen.add(d) == 1 && d.Key == "m007" {
				retry := 10 * time.Millisecond
				return &client.HandlerError{Code: "E_STOCK", Err: errors.New("no stock"), RetryAfter: &retry}
			}
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	if err := cn.Start(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "every message handled and m007 retried", func() bool {
		seen.mu.Lock()
		defer seen.mu.Unlock()
		return len(seen.attempts) == 40 && len(seen.attempts["m007"]) == 2
	})
	if err := cn.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if most.Load() > 4 {
		t.Errorf("%d handlers ran at once, Concurrency 4", most.Load())
	}
	seen.mu.Lock()
	if got := seen.attempts["m007"]; got[0] != 1 || got[1] != 2 {
		t.Errorf("m007 attempts %v, want [1 2]", got)
	}
	for k, a := range seen.attempts {
		if k != "m007" && len(a) != 1 {
			t.Errorf("%s handled %d times", k, len(a))
		}
	}
	seen.mu.Unlock()
	left, err := c.Claim(ctx, client.ClaimRequest{Topic: topic, Subscription: "work", Max: 100})
	if err != nil || len(left) != 0 {
		t.Errorf("after the run: %d claimable, %v", len(left), err)
	}
}

// TestConsumerExtendsLeases: a handler running four leases long keeps its
// delivery — nobody else can claim it — and its ack is accepted.
func TestConsumerExtendsLeases(t *testing.T) {
	testbed.Need(t)
	r := routertest.Start(t, bed, routertest.Options{})
	c := newClient(t, r, nil)
	topic := topicName(t)
	ctx := context.Background()
	produceN(t, c, topic, 1)
	release := make(chan struct{})
	started := make(chan struct{})
	var handled atomic.Int64
	cn, err := c.NewConsumer(client.ConsumerConfig{Topic: topic, Subscription: "default", Concurrency: 1,
		Visibility: time.Second, ExtendEvery: 200 * time.Millisecond, Wait: 100 * time.Millisecond},
		func(ctx context.Context, d *client.Delivery) error {
			if handled.Add(1) == 1 {
				close(started)
			}
			select {
			case <-release:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})
	if err != nil {
		t.Fatal(err)
	}
	if err := cn.Start(ctx); err != nil {
		t.Fatal(err)
	}
	<-started
	deadline := time.Now().Add(3 * time.Second) // three leases
	for time.Now().Before(deadline) {
		ds, err := c.Claim(ctx, client.ClaimRequest{Topic: topic, Subscription: "default", Max: 1, Wait: 100 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		if len(ds) > 0 {
			t.Fatalf("claimed %s while its handler ran: the lease was not extended", ds[0].Key)
		}
	}
	close(release)
	if err := cn.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if handled.Load() != 1 {
		t.Errorf("handled %d times", handled.Load())
	}
	left, err := c.Claim(ctx, client.ClaimRequest{Topic: topic, Subscription: "default", Max: 1, Visibility: time.Second})
	if err != nil || len(left) != 0 {
		t.Errorf("after the ack: %d claimable, %v", len(left), err)
	}
}

// TestConsumerStopReleases: Stop with a grace period shorter than a
// handler cancels it, and its delivery is nacked for at once: another
// consumer claims it immediately as attempt 2.
func TestConsumerStopReleases(t *testing.T) {
	testbed.Need(t)
	r := routertest.Start(t, bed, routertest.Options{})
	c := newClient(t, r, nil)
	topic := topicName(t)
	ctx := context.Background()
	produceN(t, c, topic, 1)
	started := make(chan struct{})
	cn, err := c.NewConsumer(client.ConsumerConfig{Topic: topic, Subscription: "default", Concurrency: 2, Wait: 100 * time.Millisecond},
		func(ctx context.Context, d *client.Delivery) error {
			close(started)
			<-ctx.Done()
			return ctx.Err()
		})
	if err != nil {
		t.Fatal(err)
	}
	if err := cn.Start(ctx); err != nil {
		t.Fatal(err)
	}
	<-started
	sctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if err := cn.Stop(sctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Stop past its grace: %v, want DeadlineExceeded", err)
	}
	// The lease was 30 s; only the release makes it claimable now.
	ds, err := c.Claim(ctx, client.ClaimRequest{Topic: topic, Subscription: "default", Max: 1, Wait: 2 * time.Second})
	if err != nil || len(ds) != 1 || ds[0].Attempt != 2 {
		t.Fatalf("claim after Stop: %v, %v; want the released delivery as attempt 2", ds, err)
	}
	if _, err := c.AckOne(ctx, ds[0].Receipt); err != nil {
		t.Fatal(err)
	}
	// Stop again: a no-op.
	if err := cn.Stop(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("second Stop: %v", err)
	}
}

// itemFaultTransport answers the first produce request's first item
// "unavailable" although the router stored it (as when a replica did not
// confirm in time), and counts the messages each produce request carried.
type itemFaultTransport struct {
	base    http.RoundTripper
	mu      sync.Mutex
	faulted bool
	sent    []int // messages per produce request
}

func (f *itemFaultTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if !strings.HasSuffix(r.URL.Path, "/messages") {
		return f.base.RoundTrip(r)
	}
	body, _ := io.ReadAll(r.Body)
	var req struct{ Messages []json.RawMessage }
	json.Unmarshal(body, &req)
	r.Body = io.NopCloser(strings.NewReader(string(body)))
	resp, err := f.base.RoundTrip(r)
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sent = append(f.sent, len(req.Messages))
	if f.faulted {
		return resp, nil
	}
	f.faulted = true
	data, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var out map[string][]map[string]any
	json.Unmarshal(data, &out)
	out["results"][0]["status"] = "unavailable"
	data, _ = json.Marshal(out)
	resp.Body = io.NopCloser(strings.NewReader(string(data)))
	resp.ContentLength = int64(len(data))
	resp.Header.Del("Content-Length")
	return resp, nil
}

// TestProducerRetriesOnlyUnavailableItems: of a batch, only the item
// answered unavailable is sent again — with its key, so the router answers
// duplicate with the id of the copy it had stored — and its caller sees
// that answer; the others' callers got theirs from the first request.
func TestProducerRetriesOnlyUnavailableItems(t *testing.T) {
	testbed.Need(t)
	r := routertest.Start(t, bed, routertest.Options{})
	tr := &itemFaultTransport{base: http.DefaultTransport}
	c := newClient(t, r, tr)
	p, err := c.NewProducer(client.ProducerConfig{Linger: 50 * time.Millisecond, MaxInFlight: 1, InitialBackoff: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(context.Background())
	topic := topicName(t)
	const n = 10
	msgs := make([]client.Message, n)
	for i := range msgs {
		msgs[i] = client.Message{Key: fmt.Sprintf("u%d", i), Payload: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))}
	}
	out := p.SendMany(context.Background(), topic, msgs)
	statuses := map[string]int{}
	for _, o := range out {
		if o.Err != nil || o.ID == "" {
			t.Fatalf("%s: %+v", o.Key, o)
		}
		statuses[o.Status]++
	}
	if statuses[client.StatusCreated] != n-1 || statuses[client.StatusDuplicate] != 1 {
		t.Errorf("statuses %v: want %d created and the retried one duplicate", statuses, n-1)
	}
	total := 0
	for _, k := range tr.sent {
		total += k
	}
	if total != n+1 {
		t.Errorf("requests carried %v messages: want %d, only the unavailable one again", tr.sent, n+1)
	}
}

// TestProducerDurability: each durability level is sent and answered;
// an unknown one is refused before anything is sent.
func TestProducerDurability(t *testing.T) {
	testbed.Need(t)
	r := routertest.Start(t, bed, routertest.Options{})
	c := newClient(t, r, nil)
	for _, tc := range []struct {
		durability string
		ok         bool
	}{{"", true}, {client.DurabilityPrimary, true}, {client.DurabilityReplicated, true}, {"quorum", false}} {
		t.Run("durability="+tc.durability, func(t *testing.T) {
			p, err := c.NewProducer(client.ProducerConfig{Durability: tc.durability})
			if !tc.ok {
				if err == nil {
					t.Fatal("an unknown durability was accepted")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close(context.Background())
			res, err := p.Send(context.Background(), topicName(t), client.Message{Key: "d", Payload: json.RawMessage(`{}`)})
			if err != nil || res.Status != client.StatusCreated {
				t.Fatalf("send: %+v, %v", res, err)
			}
		})
	}
}

// TestProducerStopsLingeringWhenCallersAreBack: once every caller the
// last request answered has sent again, the next request leaves without
// waiting out the linger. Eight callers send three messages each, one at
// a time, with a 2 s linger: only the first request waits it out (no
// answer has come back yet), so the whole takes well under three lingers
// and every round is one request.
func TestProducerStopsLingeringWhenCallersAreBack(t *testing.T) {
	testbed.Need(t)
	r := routertest.Start(t, bed, routertest.Options{})
	tr := &countingTransport{base: http.DefaultTransport}
	c := newClient(t, r, tr)
	const linger = 2 * time.Second
	p, err := c.NewProducer(client.ProducerConfig{Linger: linger, MaxInFlight: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(context.Background())
	ctx := context.Background()
	topic := topicName(t)
	const workers, rounds = 8, 3
	start := time.Now()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range rounds {
				key := fmt.Sprintf("k-%d-%d", w, i)
				if res, err := p.Send(ctx, topic, client.Message{Key: key, Payload: json.RawMessage(`1`)}); err != nil || res.Status != client.StatusCreated {
					t.Errorf("send %s: %+v, %v", key, res, err)
				}
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	if took < linger {
		t.Errorf("took %v: the first request did not linger (%v)", took, linger)
	}
	if took >= (rounds-1)*linger+linger/2 {
		t.Errorf("took %v for %d rounds: later requests waited out the %v linger", took, rounds, linger)
	}
	if n := tr.produces.Load(); n != rounds {
		t.Errorf("%d produce requests for %d rounds of %d callers, want %d", n, rounds, workers, rounds)
	}
}
