package server

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/shardmq/shardmq/internal/testbed"
	"github.com/shardmq/shardmq/subscription"
)

func (e *env) do(t *testing.T, method, path string, body any) (int, map[string]any) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		data, _ := json.Marshal(body)
		rd = bytes.NewReader(data)
	}
	req, _ := http.NewRequest(method, e.url+path, rd)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	data, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(data, &out); err != nil {
		t.Fatalf("%s %s: status %d, body %q is not JSON", method, path, resp.StatusCode, data)
	}
	return resp.StatusCode, out
}

// ack acks msgs and fails the test unless each is ok; a receipt answered
// unavailable is sent again, as the contract asks of a client (a cluster
// or an owner busy on a loaded machine), for a few seconds at most.
func (e *env) ack(t *testing.T, msgs ...map[string]any) {
	t.Helper()
	var rs []any
	for _, m := range msgs {
		rs = append(rs, m["receipt"])
	}
	for try := 0; len(rs) > 0; try++ {
		_, _, body := e.post(t, "/v1/ack", map[string]any{"receipts": rs})
		var again []any
		for i, r := range results(t, body) {
			switch {
			case r["status"] == "ok":
			case r["status"] == "unavailable" && try < 15:
				again = append(again, rs[i])
			default:
				t.Fatalf("ack: %v", r)
			}
		}
		rs = again
		if len(rs) > 0 {
			time.Sleep(200 * time.Millisecond)
		}
	}
}

func TestSubscriptionsFanOutAndPersist(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	e := setup(t)
	st, body := e.do(t, "PUT", "/v1/topics/orders/subscriptions/billing", map[string]any{
		"max_attempts": 3, "backoff": map[string]any{"initial_ms": 10, "max_ms": 100, "multiplier": 3, "jitter": 0}, "ordered": true})
	if st != 201 || body["max_attempts"].(float64) != 3 || body["ordered"] != true {
		t.Fatalf("PUT: %d %v", st, body)
	}
	if st, _ := e.do(t, "PUT", "/v1/topics/orders/subscriptions/shipping", map[string]any{}); st != 201 {
		t.Fatalf("PUT shipping: %d", st)
	}
	if st, body := e.do(t, "PUT", "/v1/topics/orders/subscriptions/shipping", map[string]any{"max_attempts": 0}); st != 400 {
		t.Fatalf("PUT with max_attempts 0: %d %v", st, body)
	}
	if st, _ := e.do(t, "PUT", "/v1/topics/orders/subscriptions/shipping", map[string]any{"max_attempts": 7}); st != 200 {
		t.Fatalf("replace: %d", st)
	}
	e.post(t, "/v1/topics/orders/messages", map[string]any{"messages": []any{msg("o-1", 1)}})
	for _, sub := range []string{"billing", "shipping"} {
		got := e.claim(t, "orders", sub, map[string]any{"max": 10})
		if len(got) != 1 || got[0]["key"] != "o-1" {
			t.Fatalf("%s claimed %v", sub, got)
		}
		e.ack(t, got[0])
	}
	if st, _, _ := e.post(t, "/v1/topics/orders/subscriptions/default/claim", map[string]any{"max": 10}); st != 404 {
		t.Fatalf("a topic with subscriptions has no implicit default one; claim answered %d", st)
	}
	// A second router over the same clusters sees the subscriptions.
	other, err := New(t.Context(), e.r.cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	s, ok, _ := other.subs.Get(t.Context(), "orders", "shipping")
	if !ok || s.MaxAttempts != 7 {
		t.Fatalf("a new router sees shipping as %+v (ok %v)", s, ok)
	}
	if st, _ := e.do(t, "DELETE", "/v1/topics/orders/subscriptions/shipping", nil); st != 200 {
		t.Fatalf("DELETE: %d", st)
	}
	if st, body := e.do(t, "GET", "/v1/topics/orders/subscriptions/shipping", nil); st != 404 || body["error"].(map[string]any)["code"] != "unknown_subscription" {
		t.Fatalf("GET after DELETE: %d %v", st, body)
	}
	if err := other.subs.Refresh(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := other.subs.Get(t.Context(), "orders", "shipping"); ok {
		t.Fatal("the other router still sees the deleted subscription")
	}
}

// Three interleaved order keys, four concurrent consumers: each key is
// delivered strictly in produce order, never two of a key in flight.
func TestOrderedSubscriptionUnderConcurrentConsumers(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	e := setup(t)
	e.do(t, "PUT", "/v1/topics/ord/subscriptions/s", map[string]any{"ordered": true})
	const per = 15
	keys := []string{"A", "B", "C"}
	var batch []any
	for i := 0; i < per; i++ {
		for _, k := range keys {
			batch = append(batch, map[string]any{"key": fmt.Sprintf("%s-%02d", k, i), "order_key": k, "payload": i,
				"priority": (i * 7) % 10}) // priorities must not reorder a key
		}
	}
	e.post(t, "/v1/topics/ord/messages", map[string]any{"messages": batch})

	var mu sync.Mutex
	inFlight := map[string]int{}
	seen := map[string][]int{}
	var violations []string
	var wg sync.WaitGroup
	deadline := time.Now().Add(30 * time.Second)
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				mu.Lock()
				done := len(seen["A"])+len(seen["B"])+len(seen["C"]) == 3*per
				mu.Unlock()
				if done {
					return
				}
				_, _, out := e.post(t, "/v1/topics/ord/subscriptions/s/claim", map[string]any{"max": 5, "wait_ms": 200, "consumer": fmt.Sprint("w", w)})
				msgs, _ := out["messages"].([]any)
				for _, raw := range msgs {
					m := raw.(map[string]any)
					k := m["order_key"].(string)
					mu.Lock()
					inFlight[k]++
					if inFlight[k] > 1 {
						violations = append(violations, "two of "+k+" in flight")
					}
					mu.Unlock()
				}
				for _, raw := range msgs {
					m := raw.(map[string]any)
					k := m["order_key"].(string)
					mu.Lock()
					seen[k] = append(seen[k], int(m["payload"].(float64)))
					inFlight[k]--
					mu.Unlock()
					e.post(t, "/v1/ack", map[string]any{"receipts": []any{m["receipt"]}})
				}
			}
		}()
	}
	wg.Wait()
	if len(violations) > 0 {
		t.Fatalf("ordering violated: %v", violations[:1])
	}
	for _, k := range keys {
		if len(seen[k]) != per {
			t.Fatalf("key %s: %d of %d delivered", k, len(seen[k]), per)
		}
		for i, v := range seen[k] {
			if v != i {
				t.Fatalf("key %s delivered out of order: %v", k, seen[k])
			}
		}
	}
}

func TestPriorityDelayAndLongPoll(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	// Claims re-poll every second, never sooner: a long poll answered
	// within 500ms of a produce was woken by it, not found by a re-poll.
	e := setupOn(t, bed, func(c *Config) { c.Broker.PollMin, c.Broker.PollMax = time.Second, time.Second })
	e.post(t, "/v1/topics/pri/messages", map[string]any{"messages": []any{
		map[string]any{"key": "old-low", "payload": 1, "priority": 1},
		map[string]any{"key": "young-high", "payload": 2, "priority": 8},
		map[string]any{"key": "later", "payload": 3, "priority": 9, "delay_ms": 1500},
	}})
	got := e.claim(t, "pri", "default", map[string]any{"max": 10})
	if len(got) != 2 || got[0]["key"] != "young-high" || got[1]["key"] != "old-low" {
		t.Fatalf("claim order %v, want young-high then old-low, later hidden", got)
	}
	e.ack(t, got...)
	began := time.Now()
	late := e.claim(t, "pri", "default", map[string]any{"max": 10, "wait_ms": 5000})
	if len(late) != 1 || late[0]["key"] != "later" || time.Since(began) < 900*time.Millisecond {
		t.Fatalf("delayed message: %v after %v", late, time.Since(began))
	}

	// Long poll: a produce on this router wakes a waiting claim promptly.
	type claimed struct {
		msgs []map[string]any
		at   time.Time
	}
	ch := make(chan claimed, 1)
	go func() {
		_, _, out := e.post(t, "/v1/topics/lp/subscriptions/default/claim", map[string]any{"max": 1, "wait_ms": 10000})
		var msgs []map[string]any
		for _, m := range out["messages"].([]any) {
			msgs = append(msgs, m.(map[string]any))
		}
		ch <- claimed{msgs, time.Now()}
	}()
	// Produce once the claim waits (its first re-poll is a second away).
	waitFor(t, 10*time.Second, func() bool { topics, _ := e.r.Broker().Waiting(); return topics == 1 })
	produced := time.Now()
	e.post(t, "/v1/topics/lp/messages", map[string]any{"messages": []any{msg("wake", 1)}})
	c := <-ch
	// Well under the re-poll second, on a loaded machine too.
	if len(c.msgs) != 1 || c.at.Sub(produced) > 500*time.Millisecond {
		t.Fatalf("long poll returned %d messages %v after the produce", len(c.msgs), c.at.Sub(produced))
	}
}

func TestDeadLettersListRedriveClaimPurge(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	e := setup(t)
	e.do(t, "PUT", "/v1/topics/dl/subscriptions/s", map[string]any{"max_attempts": 2})
	var batch []any
	for i := 0; i < 6; i++ {
		batch = append(batch, msg(fmt.Sprint("d-", i), i))
	}
	e.post(t, "/v1/topics/dl/messages", map[string]any{"messages": batch})
	for attempt := 0; attempt < 2; attempt++ {
		got := e.claim(t, "dl", "s", map[string]any{"max": 10, "wait_ms": 2000})
		if len(got) != 6 {
			t.Fatalf("attempt %d: claimed %d", attempt, len(got))
		}
		var items []any
		for _, m := range got {
			code := "E_STOCK"
			if int(m["payload"].(float64))%2 == 1 {
				code = "E_PRICE"
			}
			items = append(items, map[string]any{"receipt": m["receipt"], "error_code": code, "error": "failed", "retry_after_ms": 1})
		}
		e.post(t, "/v1/nack", map[string]any{"items": items})
	}
	st, body := e.do(t, "GET", "/v1/topics/dl/subscriptions/s/dead-letters?error_code=E_STOCK&limit=2", nil)
	page := body["dead_letters"].([]any)
	if st != 200 || len(page) != 2 || body["next_cursor"] == "" {
		t.Fatalf("list: %d %v", st, body)
	}
	first := page[0].(map[string]any)
	if first["error_code"] != "E_STOCK" || first["attempts"].(float64) != 2 || first["key"] == "" {
		t.Fatalf("dead letter %v", first)
	}
	_, body2 := e.do(t, "GET", "/v1/topics/dl/subscriptions/s/dead-letters?error_code=E_STOCK&limit=2&cursor="+body["next_cursor"].(string), nil)
	if n := len(body2["dead_letters"].([]any)); n != 1 || body2["next_cursor"] != "" {
		t.Fatalf("second page: %v", body2)
	}
	// Redrive the E_STOCK ones: attempts reset, consumable, consumed.
	_, out := e.do(t, "POST", "/v1/topics/dl/subscriptions/s/dead-letters/redrive", map[string]any{"error_code": "E_STOCK"})
	if out["redriven"].(float64) != 3 {
		t.Fatalf("redrive: %v", out)
	}
	if n := total(e.count(t, "SELECT COUNT(*) FROM message_store WHERE msg_status = 0")); n != 3 {
		t.Fatalf("%d messages pending after redrive, want 3", n)
	}
	got := e.claim(t, "dl", "s", map[string]any{"max": 10})
	if len(got) != 3 || got[0]["attempt"].(float64) != 1 {
		t.Fatalf("after redrive claimed %v", got)
	}
	e.ack(t, got...)
	if n := total(e.count(t, "SELECT COUNT(*) FROM message_store WHERE msg_status = 1")); n != 3 {
		t.Fatalf("%d consumed, want 3", n)
	}
	if n := total(e.count(t, "SELECT COUNT(*) FROM message_trace WHERE event = 'redriven'")); n != 3 {
		t.Fatalf("%d redriven events, want 3", n)
	}
	// The dead-letter channel: claim the E_PRICE ones, nack one, ack two.
	dl := e.claim(t, "dl", "s", map[string]any{"max": 10})
	if len(dl) != 0 {
		t.Fatal("a dead letter was offered on the normal channel")
	}
	st, out = e.do(t, "POST", "/v1/topics/dl/subscriptions/s/dead-letters/claim", map[string]any{"max": 10, "error_code": "E_PRICE"})
	raw := out["messages"].([]any)
	if st != 200 || len(raw) != 3 {
		t.Fatalf("dead-letter claim: %d %v", st, out)
	}
	m0, m1, m2 := raw[0].(map[string]any), raw[1].(map[string]any), raw[2].(map[string]any)
	if m0["error_code"] != "E_PRICE" || m0["key"] == "" || m0["receipt"] == "" {
		t.Fatalf("dead-letter claim message %v: want its error_code, key and receipt", m0)
	}
	_, _, nk := e.post(t, "/v1/nack", map[string]any{"items": []any{map[string]any{"receipt": m0["receipt"], "retry_after_ms": 60000}}})
	if r := results(t, nk)[0]; r["status"] != "retry_scheduled" {
		t.Fatalf("dead-letter nack: %v", r)
	}
	e.ack(t, m1, m2)
	if n := total(e.count(t, "SELECT COUNT(*) FROM message_queue WHERE is_dead = 1")); n != 1 {
		t.Fatalf("%d dead letters left, want 1", n)
	}
	_, out = e.do(t, "DELETE", "/v1/topics/dl/subscriptions/s/dead-letters", nil)
	if out["purged"].(float64) != 1 {
		t.Fatalf("purge: %v", out)
	}
	if st, _ := e.do(t, "POST", "/v1/topics/dl/subscriptions/s/dead-letters/redrive", map[string]any{"all": true, "error_code": "E"}); st != 400 {
		t.Fatalf("redrive with two selectors: %d", st)
	}
}

// The dead-letter alarm over real dead letters: quiet while the count is
// steady, raised when a burst of messages dies.
func TestDeadLetterAlarmOnBurst(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	e := setup(t)
	e.do(t, "PUT", "/v1/topics/alarm/subscriptions/s", map[string]any{"max_attempts": 1})
	up := e.r.DeadLetters()
	ctx := t.Context()
	up.Check(ctx)
	up.Check(ctx)
	if up.Firing("alarm", "s") {
		t.Fatal("alarm raised with no dead letters")
	}
	var batch []any
	for i := 0; i < 10; i++ {
		batch = append(batch, msg(fmt.Sprint("a-", i), i))
	}
	e.post(t, "/v1/topics/alarm/messages", map[string]any{"messages": batch})
	got := e.claim(t, "alarm", "s", map[string]any{"max": 10})
	var items []any
	for _, m := range got {
		items = append(items, map[string]any{"receipt": m["receipt"], "error_code": "E_BOOM"})
	}
	e.post(t, "/v1/nack", map[string]any{"items": items})
	up.Check(ctx)
	if !up.Firing("alarm", "s") {
		t.Fatal("a burst of 10 dead letters did not raise the alarm")
	}
	resp, err := http.Get(e.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	data, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`shardmq_dead_letters{subscription="s",topic="alarm"} 10`, `shardmq_dead_letter_alarm_firing{subscription="s",topic="alarm"} 1`} {
		if !bytes.Contains(data, []byte(want)) {
			t.Fatalf("/metrics lacks %s", want)
		}
	}
}

func TestStatsShardMapAndPolicyChange(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	e := setup(t)
	e.do(t, "PUT", "/v1/topics/st/subscriptions/s", map[string]any{"max_attempts": 5, "backoff": map[string]any{"initial_ms": 1}})
	var batch []any
	for i := 0; i < 5; i++ {
		batch = append(batch, msg(fmt.Sprint("s-", i), i))
	}
	batch = append(batch, map[string]any{"key": "later", "payload": 1, "delay_ms": 600000})
	e.post(t, "/v1/topics/st/messages", map[string]any{"messages": batch})
	got := e.claim(t, "st", "s", map[string]any{"max": 2})
	// A changed retry policy applies to the next attempt: one attempt is
	// now the last, so this nack kills the delivery.
	if st, _ := e.do(t, "PUT", "/v1/topics/st/subscriptions/s", map[string]any{"max_attempts": 1}); st != 200 {
		t.Fatalf("PUT: %d", st)
	}
	_, _, out := e.post(t, "/v1/nack", map[string]any{"items": []any{map[string]any{"receipt": got[0]["receipt"], "error_code": "E"}}})
	if r := results(t, out)[0]; r["status"] != "dead" {
		t.Fatalf("nack after max_attempts fell to 1: %v", r)
	}
	st, body := e.do(t, "GET", "/v1/admin/stats", nil)
	if st != 200 {
		t.Fatalf("stats: %d %v", st, body)
	}
	var found map[string]any
	for _, raw := range body["subscriptions"].([]any) {
		if s := raw.(map[string]any); s["topic"] == "st" && s["subscription"] == "s" {
			found = s
		}
	}
	want := map[string]float64{"ready": 3, "delayed": 1, "in_flight": 1, "dead": 1, "depth": 4}
	for k, v := range want {
		if found == nil || found[k].(float64) != v {
			t.Fatalf("stats for st/s = %v, want %v", found, want)
		}
	}
	st, body = e.do(t, "GET", "/v1/admin/shardmap", nil)
	if st != 200 || body["version"].(float64) != 1 || len(body["ranges"].([]any)) != 2 {
		t.Fatalf("shardmap: %d %v", st, body)
	}
	r0 := body["ranges"].([]any)[0].(map[string]any)
	if r0["from"].(float64) != 0 || r0["cluster"] != "c1" || r0["state"] != "serving" {
		t.Fatalf("first range %v", r0)
	}
}

// A lease taken before a subscription became ordered still releases its
// key's next delivery when acked.
func TestSwitchToOrderedDoesNotStickAKey(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	e := setup(t)
	e.do(t, "PUT", "/v1/topics/sw/subscriptions/s", map[string]any{"ordered": false})
	e.post(t, "/v1/topics/sw/messages", map[string]any{"messages": []any{
		map[string]any{"key": "m1", "order_key": "k", "payload": 1},
		map[string]any{"key": "m2", "order_key": "k", "payload": 2},
	}})
	first := e.claim(t, "sw", "s", map[string]any{"max": 1})
	if len(first) != 1 || first[0]["key"] != "m1" {
		t.Fatalf("first claim %v", first)
	}
	e.do(t, "PUT", "/v1/topics/sw/subscriptions/s", map[string]any{"ordered": true})
	if got := e.claim(t, "sw", "s", map[string]any{"max": 10}); len(got) != 0 {
		t.Fatalf("m2 delivered while m1 of its key is in flight: %v", got)
	}
	e.ack(t, first[0])
	got := e.claim(t, "sw", "s", map[string]any{"max": 10, "wait_ms": 2000})
	if len(got) != 1 || got[0]["key"] != "m2" {
		t.Fatalf("after m1's ack claimed %v, want m2", got)
	}
}

// A router whose clock runs an hour behind still replaces a subscription
// another router wrote: versions grow above every stored one.
func TestSubscriptionWriteFromSlowClockWins(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	e := setup(t)
	if st, _ := e.do(t, "PUT", "/v1/topics/clk/subscriptions/s", map[string]any{"max_attempts": 3}); st != 201 {
		t.Fatalf("PUT: %d", st)
	}
	slow := &subscription.MySQLStore{Primaries: e.r.Stores, Now: func() time.Time { return time.Now().Add(-time.Hour) }}
	if err := slow.Put(t.Context(), subscription.Subscription{Topic: "clk", Name: "s", MaxAttempts: 9}.WithDefaults()); err != nil {
		t.Fatal(err)
	}
	list, err := slow.List(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range list {
		if s.Topic == "clk" && s.Name == "s" && s.MaxAttempts != 9 {
			t.Fatalf("the slow router's write was ignored: max_attempts %d", s.MaxAttempts)
		}
	}
}
