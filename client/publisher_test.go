package client_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardmq/shardmq/client"
	"github.com/shardmq/shardmq/internal/routertest"
	"github.com/shardmq/shardmq/internal/testbed"
)

// produceFaults sits between a client and a router and breaks produce
// requests the ways a network and a router break them, each with its
// probability (a seeded source, so a failure can be replayed):
//   - refuse: answered 503 before the router sees it (nothing stored);
//   - drop: an item is not forwarded and answered unavailable (not
//     stored); with byKey, all items of one order key in the request are;
//   - unknown: a stored item is answered unknown (as when the router
//     lost the connection during COMMIT);
//   - lose: the request is served and its answer lost (everything stored,
//     the client sees a transport error).
//
// With byKey, drop and unknown strike all items of one order key in a
// request alike, as the router's own failures do (one transaction per
// cluster). force names the faults of the first requests, in order
// ("refuse", "lose", "" for none), so that a test sees each at least once.
//
// gate, when set, holds produce requests until it is closed; onLost, when
// set, is called once, by the next request whose answer is lost on
// purpose (loseNext), after the router served it.
type produceFaults struct {
	base                        http.RoundTripper
	refuse, drop, unknown, lose float64
	byKey                       bool
	force                       []string

	mu   sync.Mutex
	rnd  *rand.Rand
	gate chan struct{}

	loseNext atomic.Bool
	onLost   func()

	requests, refused, dropped, unknowns, lost, failed atomic.Int64
}

func newFaults(seed uint64) *produceFaults {
	return &produceFaults{base: http.DefaultTransport, rnd: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

func (f *produceFaults) roll(p float64) bool {
	if p <= 0 {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.rnd.Float64() < p
}

func (f *produceFaults) closeGate() { f.mu.Lock(); f.gate = make(chan struct{}); f.mu.Unlock() }

func (f *produceFaults) openGate() {
	f.mu.Lock()
	if f.gate != nil {
		close(f.gate)
		f.gate = nil
	}
	f.mu.Unlock()
}

func jsonResponse(r *http.Request, status int, body []byte, h http.Header) *http.Response {
	if h == nil {
		h = http.Header{}
	}
	h.Set("Content-Type", "application/json")
	return &http.Response{StatusCode: status, Status: strconv.Itoa(status) + " " + http.StatusText(status), Header: h,
		Body: io.NopCloser(bytes.NewReader(body)), ContentLength: int64(len(body)), Request: r,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1}
}

func (f *produceFaults) RoundTrip(r *http.Request) (*http.Response, error) {
	if !strings.HasSuffix(r.URL.Path, "/messages") || r.Method != http.MethodPost {
		return f.base.RoundTrip(r)
	}
	f.requests.Add(1)
	f.mu.Lock()
	gate := f.gate
	f.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-r.Context().Done():
			return nil, r.Context().Err()
		}
	}
	body, err := io.ReadAll(r.Body)
	r.Body.Close()
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	var forced string
	if len(f.force) > 0 {
		forced, f.force = f.force[0], f.force[1:]
	}
	f.mu.Unlock()
	if forced == "refuse" || f.roll(f.refuse) {
		f.refused.Add(1)
		return jsonResponse(r, http.StatusServiceUnavailable, []byte(`{"error":{"code":"unavailable","message":"injected"}}`), nil), nil
	}
	var req struct {
		Messages   []json.RawMessage `json:"messages"`
		Durability string            `json:"durability,omitempty"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, err
	}
	// Which items are dropped, and which answered unknown if stored.
	dropped, unknown := make([]bool, len(req.Messages)), make([]bool, len(req.Messages))
	type fate struct{ drop, unknown bool }
	byKey := map[string]fate{}
	keys := make([]string, len(req.Messages))
	for i, raw := range req.Messages {
		var m struct {
			Key      string `json:"key"`
			OrderKey string `json:"order_key"`
		}
		json.Unmarshal(raw, &m)
		keys[i] = m.Key
		fa, seen := byKey[m.OrderKey]
		if !seen || !f.byKey || m.OrderKey == "" {
			fa = fate{f.roll(f.drop), f.roll(f.unknown)}
			byKey[m.OrderKey] = fa
		}
		dropped[i], unknown[i] = fa.drop, fa.unknown
	}
	var fwd []json.RawMessage
	for i, raw := range req.Messages {
		if !dropped[i] {
			fwd = append(fwd, raw)
		}
	}
	var served []map[string]any
	if len(fwd) > 0 {
		out, _ := json.Marshal(struct {
			Messages   []json.RawMessage `json:"messages"`
			Durability string            `json:"durability,omitempty"`
		}{fwd, req.Durability})
		r2 := r.Clone(r.Context())
		r2.Body, r2.ContentLength, r2.GetBody = io.NopCloser(bytes.NewReader(out)), int64(len(out)), nil
		resp, err := f.base.RoundTrip(r2)
		if err != nil {
			f.failed.Add(1)
			return nil, err
		}
		data, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			f.failed.Add(1)
			return nil, err
		}
		if f.loseNext.CompareAndSwap(true, false) {
			f.lost.Add(1)
			if f.onLost != nil {
				f.onLost()
			}
			return nil, errors.New("injected: the answer was lost")
		}
		if forced == "lose" || f.roll(f.lose) {
			f.lost.Add(1)
			return nil, errors.New("injected: the answer was lost")
		}
		if resp.StatusCode != http.StatusOK {
			return jsonResponse(r, resp.StatusCode, data, resp.Header), nil
		}
		var ans struct {
			Results []map[string]any `json:"results"`
		}
		if err := json.Unmarshal(data, &ans); err != nil {
			return nil, err
		}
		served = ans.Results
	}
	results := make([]map[string]any, 0, len(req.Messages))
	for i := range req.Messages {
		if dropped[i] {
			f.dropped.Add(1)
			results = append(results, map[string]any{"key": keys[i], "vshard": 0, "status": "unavailable",
				"error": map[string]any{"code": "unavailable", "message": "injected"}})
			continue
		}
		res := served[0]
		served = served[1:]
		if res["status"] == "created" && unknown[i] {
			f.unknowns.Add(1)
			res = map[string]any{"key": res["key"], "vshard": res["vshard"], "status": "unknown",
				"error": map[string]any{"code": "unavailable", "message": "injected: commit outcome unknown"}}
		}
		results = append(results, res)
	}
	out, _ := json.Marshal(map[string]any{"results": results})
	return jsonResponse(r, http.StatusOK, out, nil), nil
}

// budget is a context ending a little before the test's deadline.
func budget(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.Background(), context.CancelFunc(func() {})
	if d, ok := t.Deadline(); ok {
		ctx, cancel = context.WithDeadline(ctx, d.Add(-time.Until(d)/10))
	} else {
		ctx, cancel = context.WithTimeout(ctx, 5*time.Minute)
	}
	t.Cleanup(cancel)
	return ctx
}

func newPublisher(t *testing.T, c *client.Client, cfg client.PublisherConfig) *client.Publisher {
	t.Helper()
	p, err := c.NewPublisher(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close(context.Background()) })
	return p
}

// seqMsg is a test message: its key, order key and place in its order
// key's sequence, carried in the payload.
type seqMsg struct {
	Key      string `json:"k"`
	OrderKey string `json:"o,omitempty"`
	Seq      int    `json:"i"`
}

func (s seqMsg) message() client.Message {
	payload, _ := json.Marshal(s)
	return client.Message{Key: s.Key, OrderKey: s.OrderKey, Payload: payload}
}

// drain claims and acks from sub until want deliveries came (or the
// budget ends), and returns them in the order they were claimed.
func drain(t *testing.T, ctx context.Context, c *client.Client, topic, sub string, want int) []seqMsg {
	t.Helper()
	var out []seqMsg
	for len(out) < want {
		if ctx.Err() != nil {
			t.Fatalf("drained %d of %d from %s/%s: %v", len(out), want, topic, sub, ctx.Err())
		}
		ds, err := c.Claim(ctx, client.ClaimRequest{Topic: topic, Subscription: sub, Max: 200, Wait: 500 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		receipts := make([]string, len(ds))
		for i, d := range ds {
			var s seqMsg
			if err := json.Unmarshal(d.Body(), &s); err != nil {
				t.Fatalf("delivery %s: %v", d.Key, err)
			}
			out = append(out, s)
			receipts[i] = d.Receipt
		}
		if len(receipts) > 0 {
			if _, err := c.Ack(ctx, receipts...); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Nothing more: one more short claim finds nothing.
	ds, err := c.Claim(ctx, client.ClaimRequest{Topic: topic, Subscription: sub, Max: 10, Wait: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range ds {
		t.Errorf("delivered beyond the %d expected: %s", want, d.Key)
	}
	return out
}

// checkOnce fails unless every key of want was delivered exactly once.
func checkOnce(t *testing.T, got []seqMsg, want map[string]bool) {
	t.Helper()
	seen := map[string]int{}
	for _, s := range got {
		seen[s.Key]++
	}
	for k := range want {
		if seen[k] != 1 {
			t.Errorf("%s delivered %d times, want once", k, seen[k])
		}
	}
	for k, n := range seen {
		if !want[k] {
			t.Errorf("%s delivered %d times, never published", k, n)
		}
	}
}

// TestPublisherKeepsOrderPerKeyThroughRetries: one goroutine publishes
// interleaved order keys (and messages with only a key) while requests
// are refused, items dropped (not stored, answered unavailable), stored
// items answered unknown, and answers lost. Every message ends stored
// once, and per order key the stored messages' ids — the router's order,
// which an ordered subscription follows — rise in publish order: no
// message was stored before an earlier one of its key that was retried.
// With MaxPerKey 4 the faults keep one fate per key and request, as the
// router does, and the runs keep order as well.
func TestPublisherKeepsOrderPerKeyThroughRetries(t *testing.T) {
	testbed.Need(t)
	for _, tc := range []struct {
		name      string
		maxPerKey int
		byKey     bool
	}{{"one per key", 1, false}, {"runs of four", 4, true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := budget(t)
			r := routertest.Start(t, bed, routertest.Options{})
			f := newFaults(uint64(tc.maxPerKey))
			f.refuse, f.drop, f.unknown, f.lose, f.byKey = 0.05, 0.15, 0.05, 0.05, tc.byKey
			f.force = []string{"", "refuse", "", "lose"}
			c := newClient(t, r, f)
			topic := topicName(t)
			if err := c.PutSubscription(ctx, topic, "ord", client.Subscription{Ordered: true}); err != nil {
				t.Fatal(err)
			}
			p := newPublisher(t, c, client.PublisherConfig{Linger: time.Millisecond, MaxBatch: 40, MaxPerKey: tc.maxPerKey,
				MaxAttempts: 100, InitialBackoff: time.Millisecond, MaxBackoff: 20 * time.Millisecond})
			const orderKeys, each, keyOnly = 8, 60, 60
			type sent struct {
				s   seqMsg
				pub *client.Publication
			}
			var all []sent
			want := map[string]bool{}
			rnd := rand.New(rand.NewPCG(7, 7))
			next := make([]int, orderKeys)
			for n := 0; n < orderKeys*each+keyOnly; n++ {
				var s seqMsg
				switch k := rnd.IntN(orderKeys + 1); {
				case k == orderKeys || next[k] == each:
					s = seqMsg{Key: fmt.Sprintf("solo-%d", n), Seq: n}
				default:
					s = seqMsg{Key: fmt.Sprintf("ok%d-%03d", k, next[k]), OrderKey: fmt.Sprintf("ok%d", k), Seq: next[k]}
					next[k]++
				}
				pub, err := p.Publish(ctx, topic, s.message())
				if err != nil {
					t.Fatal(err)
				}
				all = append(all, sent{s, pub})
				want[s.Key] = true
			}
			if err := p.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			lastID := map[string]uint64{}
			lastSeq := map[string]int{}
			for _, x := range all {
				res, err := x.pub.Wait(ctx)
				if err != nil || (res.Status != client.StatusCreated && res.Status != client.StatusDuplicate) || res.Key != x.s.Key {
					t.Fatalf("%s: %+v, %v", x.s.Key, res, err)
				}
				if x.s.OrderKey == "" {
					continue
				}
				id, _ := strconv.ParseUint(res.ID, 10, 64)
				if prev, ok := lastID[x.s.OrderKey]; ok && id <= prev {
					t.Errorf("%s (seq %d) stored with id %d, before seq %d (id %d)", x.s.Key, x.s.Seq, id, lastSeq[x.s.OrderKey], prev)
				}
				lastID[x.s.OrderKey], lastSeq[x.s.OrderKey] = id, x.s.Seq
			}
			st := p.Stats()
			t.Logf("stats %+v; faults: %d requests, %d refused, %d items dropped, %d unknown, %d answers lost",
				st, f.requests.Load(), f.refused.Load(), f.dropped.Load(), f.unknowns.Load(), f.lost.Load())
			if f.refused.Load() == 0 || f.dropped.Load() == 0 || f.unknowns.Load() == 0 || f.lost.Load() == 0 || st.Resent == 0 {
				t.Fatalf("not every fault happened: the test proves nothing")
			}
			if st.Stored != int64(len(all)) || st.Failed != 0 || st.Overtaken != 0 || st.Buffered != 0 {
				t.Errorf("stats %+v, want %d stored, none failed or overtaken, nothing buffered", st, len(all))
			}
			// The ordered subscription hands each order key's messages out
			// in publish order, each once.
			got := drain(t, ctx, c, topic, "ord", len(all))
			checkOnce(t, got, want)
			seq := map[string]int{}
			for _, s := range got {
				if s.OrderKey == "" {
					continue
				}
				if s.Seq != seq[s.OrderKey] {
					t.Errorf("%s delivered as message %d of %s, want %d", s.Key, s.Seq, s.OrderKey, seq[s.OrderKey])
				}
				seq[s.OrderKey] = s.Seq + 1
			}
		})
	}
}

// TestPublisherRetriesAcrossRouterRestart: the router is restarted while
// requests are in flight — one of them served and its answer lost to the
// restart — and the publisher, retrying with the same keys against the
// new router, ends with every message stored exactly once; the messages
// whose answer was lost come back duplicate.
func TestPublisherRetriesAcrossRouterRestart(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	ctx := budget(t)
	r := routertest.Start(t, bed, routertest.Options{})
	f := newFaults(1)
	c := newClient(t, r, f)
	topic := topicName(t)
	restarted := make(chan struct{})
	served := make(chan struct{})
	f.onLost = func() {
		close(served)
		<-restarted
	}
	p := newPublisher(t, c, client.PublisherConfig{Linger: time.Millisecond, MaxBatch: 50,
		MaxAttempts: 200, InitialBackoff: 5 * time.Millisecond, MaxBackoff: 100 * time.Millisecond})
	const n = 2000
	pubs := make([]*client.Publication, n)
	want := map[string]bool{}
	publish := func(from, to int) {
		for i := from; i < to; i++ {
			s := seqMsg{Key: fmt.Sprintf("r-%04d", i), Seq: i}
			pub, err := p.Publish(ctx, topic, s.message())
			if err != nil {
				t.Error(err)
				return
			}
			pubs[i] = pub
			want[s.Key] = true
		}
	}
	publish(0, n/2)
	f.loseNext.Store(true) // the next request is served and its answer lost…
	done := make(chan struct{})
	go func() { defer close(done); publish(n/2, n) }()
	select {
	case <-served:
	case <-ctx.Done():
		t.Fatal("no request was served after arming the fault")
	}
	r.Restart(t) // …by this restart; other requests in flight are cut
	close(restarted)
	<-done
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	statuses := map[string]int{}
	for i, pub := range pubs {
		res, err := pub.Wait(ctx)
		if err != nil {
			t.Fatalf("message %d: %+v, %v", i, res, err)
		}
		statuses[res.Status]++
	}
	st := p.Stats()
	t.Logf("statuses %v, stats %+v, transport failures %d", statuses, st, f.failed.Load())
	if statuses[client.StatusDuplicate] == 0 || st.Resent == 0 {
		t.Errorf("no message was answered duplicate after the restart: the lost answer was not retried")
	}
	if statuses[client.StatusCreated]+statuses[client.StatusDuplicate] != n {
		t.Errorf("statuses %v, want %d stored", statuses, n)
	}
	checkOnce(t, drain(t, ctx, c, topic, "default", n), want)
}

// TestPublisherBackPressure: at the buffer's limit in messages or in
// bytes, Publish waits for room — it answers its ctx's error if that ends
// first — or, with ErrorWhenFull, answers ErrBufferFull at once; room
// frees as messages are answered.
func TestPublisherBackPressure(t *testing.T) {
	testbed.Need(t)
	r := routertest.Start(t, bed, routertest.Options{})
	payload := func(n int) json.RawMessage { return json.RawMessage(`"` + strings.Repeat("x", n) + `"`) }
	for _, tc := range []struct {
		name  string
		cfg   client.PublisherConfig
		size  int // payload bytes
		holds int // messages that fit
	}{
		{"messages", client.PublisherConfig{BufferMessages: 5}, 10, 5},
		{"bytes", client.PublisherConfig{BufferBytes: 3500}, 1000, 3},
	} {
		for _, errorMode := range []bool{false, true} {
			name := tc.name + "/wait"
			if errorMode {
				name = tc.name + "/error"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				ctx := budget(t)
				f := newFaults(3)
				f.closeGate()
				c := newClient(t, r, f)
				cfg := tc.cfg
				cfg.ErrorWhenFull = errorMode
				p := newPublisher(t, c, cfg)
				topic := topicName(t)
				msg := func(i int) client.Message {
					return client.Message{Key: fmt.Sprintf("bp-%d", i), Payload: payload(tc.size)}
				}
				var pubs []*client.Publication
				for i := range tc.holds {
					pub, err := p.Publish(ctx, topic, msg(i))
					if err != nil {
						t.Fatalf("message %d of %d that fit: %v", i, tc.holds, err)
					}
					pubs = append(pubs, pub)
				}
				if st := p.Stats(); st.Buffered != tc.holds {
					t.Fatalf("buffered %d, want %d", st.Buffered, tc.holds)
				}
				var extra *client.Publication
				if errorMode {
					if _, err := p.Publish(ctx, topic, msg(tc.holds)); !errors.Is(err, client.ErrBufferFull) {
						t.Fatalf("publish past the limit: %v, want ErrBufferFull", err)
					}
					f.openGate()
					if err := p.Flush(ctx); err != nil {
						t.Fatal(err)
					}
					// Room again.
					pub, err := p.Publish(ctx, topic, msg(tc.holds))
					if err != nil {
						t.Fatalf("publish after the flush: %v", err)
					}
					extra = pub
				} else {
					cancelled, cancel := context.WithCancel(ctx)
					cancel()
					if _, err := p.Publish(cancelled, topic, msg(tc.holds)); !errors.Is(err, context.Canceled) {
						t.Fatalf("publish past the limit with an ended ctx: %v, want it to wait and answer Canceled", err)
					}
					type answer struct {
						pub *client.Publication
						err error
					}
					back := make(chan answer, 1)
					go func() {
						pub, err := p.Publish(ctx, topic, msg(tc.holds))
						back <- answer{pub, err}
					}()
					waitFor(t, time.Until(deadlineOf(ctx)), "the publish to wait for room", func() bool { return p.Stats().Waiting == 1 })
					select {
					case a := <-back:
						t.Fatalf("publish past the limit returned while nothing was answered: %v", a.err)
					default:
					}
					f.openGate() // the held requests are answered: room frees up
					a := <-back
					if a.err != nil {
						t.Fatalf("the waiting publish: %v", a.err)
					}
					extra = a.pub
				}
				if err := p.Close(ctx); err != nil {
					t.Fatal(err)
				}
				for i, pub := range append(pubs, extra) {
					if res, err := pub.Wait(ctx); err != nil || res.Status != client.StatusCreated {
						t.Errorf("message %d: %+v, %v", i, res, err)
					}
				}
			})
		}
	}
	t.Run("larger than the buffer", func(t *testing.T) {
		c := newClient(t, r, nil)
		p := newPublisher(t, c, client.PublisherConfig{BufferBytes: 500})
		if _, err := p.Publish(context.Background(), topicName(t), client.Message{Key: "big", Payload: payload(1000)}); !errors.Is(err, client.ErrBufferFull) {
			t.Fatalf("a message larger than the whole buffer: %v, want ErrBufferFull at once", err)
		}
	})
}

func deadlineOf(ctx context.Context) time.Time {
	d, _ := ctx.Deadline()
	return d
}

// TestPublisherCloseLosesNothing: Close right after the last Publish of
// four goroutines, under faults, returns once every message is answered:
// every handle and callback resolved, every message stored once. Close
// whose ctx ends while requests hang still resolves every handle (with
// ErrClosed) and calls every callback once, and refuses later publishes.
func TestPublisherCloseLosesNothing(t *testing.T) {
	testbed.Need(t)
	r := routertest.Start(t, bed, routertest.Options{})
	t.Run("everything answered", func(t *testing.T) {
		t.Parallel()
		ctx := budget(t)
		f := newFaults(11)
		f.refuse, f.drop, f.lose = 0.05, 0.1, 0.05
		f.force = []string{"", "lose"}
		c := newClient(t, r, f)
		p, err := c.NewPublisher(client.PublisherConfig{Linger: 20 * time.Millisecond, MaxAttempts: 100,
			InitialBackoff: time.Millisecond, MaxBackoff: 20 * time.Millisecond, BufferMessages: 300})
		if err != nil {
			t.Fatal(err)
		}
		topic := topicName(t)
		const workers, each = 4, 500
		var calls, stored atomic.Int64
		pubs := make([][]*client.Publication, workers)
		want := map[string]bool{}
		var mu sync.Mutex
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() {
				for i := range each {
					s := seqMsg{Key: fmt.Sprintf("c-%d-%03d", w, i), Seq: i}
					mu.Lock()
					want[s.Key] = true
					mu.Unlock()
					if i%2 == 0 {
						pub, err := p.Publish(ctx, topic, s.message())
						if err != nil {
							t.Error(err)
							return
						}
						pubs[w] = append(pubs[w], pub)
						continue
					}
					err := p.PublishFunc(ctx, topic, s.message(), func(res client.Result, err error) {
						calls.Add(1)
						if err == nil {
							stored.Add(1)
						}
					})
					if err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		if err := p.Close(ctx); err != nil {
			t.Fatal(err)
		}
		// Close returned: every callback has run, every handle is done.
		if calls.Load() != workers*each/2 || stored.Load() != workers*each/2 {
			t.Errorf("after Close: %d callbacks, %d stored, want %d each", calls.Load(), stored.Load(), workers*each/2)
		}
		for w := range pubs {
			for _, pub := range pubs[w] {
				select {
				case <-pub.Done():
				default:
					t.Fatal("a handle is open after Close returned")
				}
				if res, err := pub.Wait(ctx); err != nil {
					t.Errorf("%+v, %v", res, err)
				}
			}
		}
		if _, err := p.Publish(ctx, topic, seqMsg{Key: "late"}.message()); !errors.Is(err, client.ErrClosed) {
			t.Errorf("publish after Close: %v, want ErrClosed", err)
		}
		if f.dropped.Load() == 0 || f.lost.Load() == 0 {
			t.Fatalf("no fault happened: dropped %d, lost %d", f.dropped.Load(), f.lost.Load())
		}
		checkOnce(t, drain(t, ctx, c, topic, "default", workers*each), want)
	})
	t.Run("ctx ends first", func(t *testing.T) {
		t.Parallel()
		ctx := budget(t)
		f := newFaults(12)
		f.closeGate() // requests hang until the publisher cancels them
		c := newClient(t, r, f)
		p, err := c.NewPublisher(client.PublisherConfig{})
		if err != nil {
			t.Fatal(err)
		}
		topic := topicName(t)
		var pubs []*client.Publication
		var calls atomic.Int64
		for i := range 100 {
			s := seqMsg{Key: fmt.Sprintf("h-%d", i), OrderKey: fmt.Sprintf("o%d", i%3)}
			if i%2 == 0 {
				pub, err := p.Publish(ctx, topic, s.message())
				if err != nil {
					t.Fatal(err)
				}
				pubs = append(pubs, pub)
				continue
			}
			if err := p.PublishFunc(ctx, topic, s.message(), func(_ client.Result, err error) {
				if calls.Add(1) > 50 || !errors.Is(err, client.ErrClosed) {
					t.Errorf("callback: %v (call %d)", err, calls.Load())
				}
			}); err != nil {
				t.Fatal(err)
			}
		}
		waitFor(t, time.Until(deadlineOf(ctx)), "a request in flight", func() bool { return f.requests.Load() > 0 })
		short, cancel := context.WithCancel(ctx)
		cancel()
		if err := p.Close(short); !errors.Is(err, context.Canceled) {
			t.Fatalf("Close with an ended ctx: %v", err)
		}
		if calls.Load() != 50 {
			t.Errorf("%d callbacks after Close, want 50", calls.Load())
		}
		for _, pub := range pubs {
			select {
			case <-pub.Done():
			default:
				t.Fatal("a handle is open after Close returned")
			}
			if _, err := pub.Wait(ctx); !errors.Is(err, client.ErrClosed) {
				t.Errorf("abandoned message: %v, want ErrClosed", err)
			}
		}
		if err := p.Close(ctx); err != nil {
			t.Errorf("second Close: %v", err)
		}
		f.openGate()
	})
}

// TestPublisherAnswersEachMessage: one request carries messages whose
// answers differ — created, duplicate (the key stored before with the
// same payload), conflict (another payload), one the router answers
// unavailable until the publisher gives up — and each handle gets its own
// outcome. A message the router refuses whole-request (priority 12) costs
// the others nothing: the publisher sends each alone to find it.
func TestPublisherAnswersEachMessage(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	ctx := budget(t)
	r := routertest.Start(t, bed, routertest.Options{})
	tr := &itemStatusTransport{base: http.DefaultTransport, status: map[string]string{"gone": client.StatusUnavailable}}
	c := newClient(t, r, tr)
	topic := topicName(t)
	if res, err := c.Produce(ctx, topic, "", []client.Message{{Key: "old", Payload: json.RawMessage(`{"v":1}`)}}); err != nil || res[0].Status != client.StatusCreated {
		t.Fatalf("first produce: %+v, %v", res, err)
	}
	p := newPublisher(t, c, client.PublisherConfig{Linger: time.Hour, MaxAttempts: 2, InitialBackoff: time.Millisecond})
	bad := 12
	msgs := []client.Message{
		{Key: "new-1", Payload: json.RawMessage(`{"v":1}`)},
		{Key: "old", Payload: json.RawMessage(`{"v":1}`)},
		{Key: "gone", Payload: json.RawMessage(`{"v":1}`)},
		{Key: "new-2", Payload: json.RawMessage(`{"v":2}`)},
	}
	pubs := make([]*client.Publication, len(msgs))
	for i, m := range msgs {
		var err error
		if pubs[i], err = p.Publish(ctx, topic, m); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if st := p.Stats(); st.Requests != 2 {
		t.Errorf("%d requests, want 2: the four in one, then the retry of the unavailable one", st.Requests)
	}
	check := func(i int, status string, want error) {
		t.Helper()
		res, err := pubs[i].Wait(ctx)
		if res.Status != status || (want == nil) != (err == nil) || (want != nil && !errors.Is(err, want)) {
			t.Errorf("%s: %+v, %v; want %s, %v", msgs[i].Key, res, err, status, want)
		}
	}
	check(0, client.StatusCreated, nil)
	check(1, client.StatusDuplicate, nil)
	check(2, client.StatusUnavailable, client.ErrUnavailable)
	check(3, client.StatusCreated, nil)
	if a := pubs[2].Attempts(); a != 2 {
		t.Errorf("the unavailable one was sent %d times, want MaxAttempts 2", a)
	}

	// Conflict and a whole-request refusal in one batch.
	more := []client.Message{
		{Key: "old", Payload: json.RawMessage(`{"v":"other"}`)},
		{Key: "new-3", Payload: json.RawMessage(`{"v":3}`)},
		{Key: "bad", Payload: json.RawMessage(`{"v":4}`), Priority: &bad},
		{Key: "new-4", Payload: json.RawMessage(`{"v":5}`)},
	}
	pubs = make([]*client.Publication, len(more))
	for i, m := range more {
		var err error
		if pubs[i], err = p.Publish(ctx, topic, m); err != nil {
			t.Fatal(err)
		}
	}
	msgs = more
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	check(0, client.StatusConflict, client.ErrConflict)
	check(1, client.StatusCreated, nil)
	check(2, "", client.ErrInvalidRequest)
	check(3, client.StatusCreated, nil)
	st := p.Stats()
	if st.Stored != 5 || st.Conflicts != 1 || st.Failed != 2 || st.Duplicates != 1 {
		t.Errorf("stats %+v", st)
	}
}

// itemStatusTransport forwards produce requests and answers the items
// whose key it names with that status instead of the router's (they are
// stored all the same, as when a commit's outcome could not be learned).
type itemStatusTransport struct {
	base   http.RoundTripper
	status map[string]string
}

func (s *itemStatusTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := s.base.RoundTrip(r)
	if err != nil || !strings.HasSuffix(r.URL.Path, "/messages") || resp.StatusCode != http.StatusOK {
		return resp, err
	}
	data, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	var ans struct {
		Results []map[string]any `json:"results"`
	}
	if err := json.Unmarshal(data, &ans); err != nil {
		return nil, err
	}
	for i, res := range ans.Results {
		key, _ := res["key"].(string)
		if st := s.status[key]; st != "" {
			ans.Results[i] = map[string]any{"key": key, "vshard": res["vshard"], "status": st,
				"error": map[string]any{"code": "unavailable", "message": "injected"}}
		}
	}
	out, _ := json.Marshal(ans)
	return jsonResponse(r, http.StatusOK, out, nil), nil
}

// TestPublisherPausesAFailedOrderKey: when a message of an order key
// fails with its outcome open, the key's queued messages are not sent
// (they could be stored before it, were it published again) and later
// ones are refused until Resume; other keys go on.
func TestPublisherPausesAFailedOrderKey(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	ctx := budget(t)
	r := routertest.Start(t, bed, routertest.Options{})
	tr := &itemStatusTransport{base: http.DefaultTransport, status: map[string]string{"a-0": client.StatusUnknown}}
	c := newClient(t, r, tr)
	topic := topicName(t)
	p := newPublisher(t, c, client.PublisherConfig{Linger: time.Hour, MaxAttempts: 3, InitialBackoff: time.Millisecond})
	publish := func(key, orderKey string) *client.Publication {
		t.Helper()
		pub, err := p.Publish(ctx, topic, client.Message{Key: key, OrderKey: orderKey, Payload: json.RawMessage(`{}`)})
		if err != nil {
			t.Fatal(err)
		}
		return pub
	}
	a0, a1, a2, b0 := publish("a-0", "a"), publish("a-1", "a"), publish("a-2", "a"), publish("b-0", "b")
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := a0.Wait(ctx); err == nil || errors.Is(err, client.ErrOrderKeyPaused) || a0.Attempts() != 3 {
		t.Errorf("a-0: %v after %d attempts, want the open outcome after 3", err, a0.Attempts())
	}
	for _, pub := range []*client.Publication{a1, a2} {
		if _, err := pub.Wait(ctx); !errors.Is(err, client.ErrOrderKeyPaused) || pub.Attempts() != 0 {
			t.Errorf("queued behind a-0: %v, %d attempts; want ErrOrderKeyPaused, never sent", err, pub.Attempts())
		}
	}
	if res, err := b0.Wait(ctx); err != nil || res.Status != client.StatusCreated {
		t.Errorf("b-0: %+v, %v", res, err)
	}
	if _, err := publish("a-3", "a").Wait(ctx); !errors.Is(err, client.ErrOrderKeyPaused) {
		t.Errorf("published after the failure: %v, want ErrOrderKeyPaused", err)
	}
	delete(tr.status, "a-0")
	p.Resume(topic, "a")
	again := []*client.Publication{publish("a-0", "a"), publish("a-1", "a"), publish("a-2", "a")}
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	for i, pub := range again {
		// a-0 was stored by each attempt the transport answered unknown.
		want := client.StatusCreated
		if i == 0 {
			want = client.StatusDuplicate
		}
		if res, err := pub.Wait(ctx); err != nil || res.Status != want {
			t.Errorf("after Resume, a-%d: %+v, %v; want %s", i, res, err, want)
		}
	}
}
