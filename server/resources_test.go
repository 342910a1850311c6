package server

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardmq/shardmq/broker"
	"github.com/shardmq/shardmq/internal/testbed"
)

// waitUntil polls cond until it holds or the deadline passes.
func waitUntil(t *testing.T, within time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Log(string(buf[:runtime.Stack(buf, true)]))
			t.Fatalf("%s: not within %v (%s)", what, within, state)
		}
		time.Sleep(20 * time.Millisecond) // polling a condition, not waiting for an effect
	}
}

// goroutines counts the process's goroutines, leaving out the MySQL
// driver's one per pooled connection: the pools grow and shrink with load
// on their own, bounded by their size.
func goroutines() int {
	buf := make([]byte, 8<<20)
	stacks := strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n")
	n := 0
	for _, st := range stacks {
		if strings.TrimSpace(st) != "" && !strings.Contains(st, "mysqlConn).startWatcher") {
			n++
		}
	}
	return n
}

// Claims on thousands of made-up topic names leave nothing behind: once
// they are answered, the notifier holds no topic, no claim worker is left
// and the goroutine count is back where it was. (Not parallel: it counts
// the process's goroutines.)
func TestClaimsOnManyUnknownTopicsLeaveNothingBehind(t *testing.T) {
	testbed.Need(t)
	e := setup(t)
	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	client := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	claim := func(topic string) error {
		resp, err := client.Post(e.url+"/v1/topics/"+topic+"/subscriptions/default/claim", "application/json",
			bytes.NewReader([]byte(`{"max":1,"wait_ms":30}`)))
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		var out struct{ Messages []any }
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != 200 || len(out.Messages) != 0 {
			return fmt.Errorf("claim on %s: status %d, %v, %v", topic, resp.StatusCode, out, err)
		}
		return nil
	}
	const workers = 32
	run := func(prefix string, names int) {
		var wg sync.WaitGroup
		errs := make(chan error, workers)
		next := make(chan int)
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range next {
					if err := claim(fmt.Sprintf("%s-%d", prefix, i)); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
	feed:
		for i := 0; i < names; i++ {
			select {
			case next <- i:
			case err := <-errs:
				t.Error(err)
				break feed
			}
		}
		close(next)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
	}
	// Warm up with the same concurrency, so that the baseline counts the
	// connections the pools keep (each has a goroutine of the driver).
	run("warm-up", 200)
	tr.CloseIdleConnections()
	base := goroutines()
	run("made-up", 3000)
	tr.CloseIdleConnections()
	b := e.r.Broker()
	waitUntil(t, 5*time.Second, "notifier and claim workers empty, goroutines back to the baseline", func() (bool, string) {
		topics, claimers := b.Waiting()
		g := goroutines()
		return topics == 0 && claimers == 0 && g <= base+10,
			fmt.Sprintf("%d topics waited on, %d claim workers, %d goroutines against %d before", topics, claimers, g, base)
	})
}

// The implicit default subscription of a topic nobody produced to yet
// still delivers what another router produces to it later: the waiting
// claim notices the topic's stored default subscription and reads the
// databases again.
func TestClaimOnUnknownTopicSeesLaterProduceFromAnotherRouter(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	e := setup(t)
	other, err := New(t.Context(), Config{TopologyFile: e.r.cfg.TopologyFile, SubscriptionRefresh: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	got := make(chan []map[string]any, 1)
	go func() {
		got <- e.claim(t, "later", "default", map[string]any{"max": 1, "wait_ms": 15000})
	}()
	waitUntil(t, 5*time.Second, "claim waiting", func() (bool, string) {
		topics, _ := e.r.Broker().Waiting()
		return topics == 1, fmt.Sprint(topics, " topics waited on")
	})
	res, err := other.Broker().Produce(t.Context(), "later", []broker.Message{{Key: "k1", Payload: []byte("1"), PayloadJSON: true}}, broker.DurabilityPrimary)
	if err != nil || res[0].Status != "created" {
		t.Fatalf("produce through the other router: %v %v", res, err)
	}
	select {
	case msgs := <-got:
		if len(msgs) != 1 || msgs[0]["key"] != "k1" {
			t.Fatalf("claim answered %v, want k1", msgs)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("claim not answered")
	}
}

// A claim answer stops at max_bytes (the first message always goes, even
// when it alone is larger); what did not fit stays ready, not leased, and
// its next claim is its first attempt. The dead-letter channel keeps the
// same cap.
func TestClaimByteCap(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	e := setupOn(t, bed, func(c *Config) { c.Limits.MaxClaimBytes = 1 << 20 })
	const size = 300 << 10
	payload := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{'x'}, size))
	e.do(t, "PUT", "/v1/topics/big/subscriptions/s", map[string]any{"max_attempts": 1})
	var batch []any
	for i := 0; i < 5; i++ {
		batch = append(batch, map[string]any{"key": fmt.Sprint("big-", i), "payload_base64": payload})
	}
	if st, _, body := e.post(t, "/v1/topics/big/messages", map[string]any{"messages": batch}); st != 200 {
		t.Fatalf("produce: %d %v", st, body)
	}
	cases := []struct {
		name string
		body map[string]any
		want int
	}{
		// 300 KiB of bytes are 400 KiB of base64 in the answer: the cap
		// counts what is sent.
		{"default cap of 1 MiB", map[string]any{"max": 10}, 2},
		{"max_bytes below one message still gives one", map[string]any{"max": 10, "max_bytes": 1000}, 1},
		{"the rest", map[string]any{"max": 10, "max_bytes": 1 << 20}, 2},
	}
	var all []map[string]any
	for _, c := range cases {
		got := e.claim(t, "big", "s", c.body)
		if len(got) != c.want {
			t.Fatalf("%s: claimed %d, want %d", c.name, len(got), c.want)
		}
		for _, m := range got {
			if m["attempt"].(float64) != 1 {
				t.Fatalf("%s: %s at attempt %v, want 1 (a message left out of an answer must not lose an attempt)", c.name, m["key"], m["attempt"])
			}
		}
		all = append(all, got...)
	}
	if st, body := e.do(t, "POST", "/v1/topics/big/subscriptions/s/claim", map[string]any{"max_bytes": 1 << 21}); st != 400 {
		t.Fatalf("max_bytes above the limit: %d %v", st, body)
	}
	// Kill all five (max_attempts 1), then claim them on the dead-letter channel.
	var items []any
	for _, m := range all {
		items = append(items, map[string]any{"receipt": m["receipt"], "error_code": "E", "error": "no"})
	}
	_, _, body := e.post(t, "/v1/nack", map[string]any{"items": items})
	for _, r := range results(t, body) {
		if r["status"] != "dead" {
			t.Fatalf("nack: %v", r)
		}
	}
	_, out := e.do(t, "POST", "/v1/topics/big/subscriptions/s/dead-letters/claim", map[string]any{"max": 10, "max_bytes": 700 << 10})
	if n := len(out["messages"].([]any)); n != 2 {
		t.Fatalf("dead-letter claim with max_bytes 700 KiB: %d messages, want 2", n)
	}
	_, out = e.do(t, "POST", "/v1/topics/big/subscriptions/s/dead-letters/claim", map[string]any{"max": 10})
	if n := len(out["messages"].([]any)); n != 3 {
		t.Fatalf("dead-letter claim of the rest: %d messages, want 3", n)
	}
}

// Subscriptions per topic and topics are capped with clear codes; a
// produce refused for the topic cap writes nothing; a replaced
// subscription and a freed slot are fine.
func TestTopicAndSubscriptionCaps(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	e := setupOn(t, bed, func(c *Config) {
		c.SubscriptionLimits.MaxTopics = 2
		c.SubscriptionLimits.MaxPerTopic = 2
	})
	code := func(body map[string]any) any {
		if er, ok := body["error"].(map[string]any); ok {
			return er["code"]
		}
		return nil
	}
	steps := []struct {
		method, path string
		body         any
		status       int
		code         any
	}{
		{"PUT", "/v1/topics/t1/subscriptions/a", map[string]any{}, 201, nil},
		{"PUT", "/v1/topics/t1/subscriptions/b", map[string]any{}, 201, nil},
		{"PUT", "/v1/topics/t1/subscriptions/c", map[string]any{}, 409, "too_many_subscriptions"},
		{"PUT", "/v1/topics/t1/subscriptions/a", map[string]any{"max_attempts": 3}, 200, nil},
		{"POST", "/v1/topics/t2/messages", map[string]any{"messages": []any{msg("k", 1)}}, 200, nil},
		{"POST", "/v1/topics/t3/messages", map[string]any{"messages": []any{msg("k", 1)}}, 409, "too_many_topics"},
		{"PUT", "/v1/topics/t3/subscriptions/x", map[string]any{}, 409, "too_many_topics"},
		{"DELETE", "/v1/topics/t1/subscriptions/a", nil, 200, nil},
		{"PUT", "/v1/topics/t1/subscriptions/c", map[string]any{}, 201, nil},
	}
	for _, s := range steps {
		st, body := e.do(t, s.method, s.path, s.body)
		if st != s.status || code(body) != s.code {
			t.Fatalf("%s %s: %d %v, want %d %v", s.method, s.path, st, body, s.status, s.code)
		}
	}
	if n := total(e.count(t, "SELECT COUNT(*) FROM message_store WHERE topic = 't3'")); n != 0 {
		t.Fatalf("%d messages of t3 stored after its produce was refused", n)
	}
}
