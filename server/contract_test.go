package server

import (
	"fmt"
	"testing"
	"time"

	"github.com/shardmq/shardmq/internal/testbed"
	"github.com/shardmq/shardmq/internal/testtime"
	"github.com/shardmq/shardmq/shard"
)

// keysAlternating returns n keys whose vshards alternate between the
// clusters of e (c1, c2, c1, …), so that what a test produces spans both.
func (e *env) keysAlternating(t *testing.T, prefix string, n int) []string {
	t.Helper()
	owners := []string{"c1", "c2"}
	var out []string
	for i := 0; len(out) < n && i < 100000; i++ {
		k := fmt.Sprint(prefix, i)
		if e.owner(shard.Of(k)) == owners[len(out)%2] {
			out = append(out, k)
		}
	}
	if len(out) < n {
		t.Fatalf("found %d keys alternating between clusters, want %d", len(out), n)
	}
	return out
}

// DESIGN §6: unordered subscriptions deliver by priority, then age, over
// every cluster: a claim that spans clusters must not answer the best of
// whichever cluster it visits first.
func TestClaimPriorityThenAgeAcrossClusters(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	e := setup(t)
	keys := e.keysAlternating(t, "prio-", 10)
	produce := func(topic string, prio func(i int) int) {
		t.Helper()
		var msgs []any
		for i, k := range keys {
			msgs = append(msgs, map[string]any{"key": k, "payload": i, "priority": prio(i)})
		}
		if st, _, body := e.post(t, "/v1/topics/"+topic+"/messages", map[string]any{"messages": msgs}); st != 200 {
			t.Fatalf("produce: %d %v", st, body)
		}
	}
	byPriority := func(i int) int { return i } // the lowest first, c1 and c2 taking turns
	payloads := func(got []map[string]any) []int {
		var out []int
		for _, m := range got {
			out = append(out, int(m["payload"].(float64)))
		}
		return out
	}
	want := func(what string, got []int, want ...int) {
		t.Helper()
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("%s: payloads %v, want %v", what, got, want)
		}
	}

	// One claim of everything answers in priority order.
	produce("prio-all", byPriority)
	want("claim of 10", payloads(e.claim(t, "prio-all", "default", map[string]any{"max": 10})), 9, 8, 7, 6, 5, 4, 3, 2, 1, 0)

	// Claims of 1 and of 3 take the highest priority left on any cluster.
	produce("prio-one", byPriority)
	var got []int
	for range 10 {
		got = append(got, payloads(e.claim(t, "prio-one", "default", map[string]any{"max": 1}))...)
	}
	want("claims of 1", got, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0)
	produce("prio-three", byPriority)
	want("claim of 3", payloads(e.claim(t, "prio-three", "default", map[string]any{"max": 3})), 9, 8, 7)
	want("next claim of 3", payloads(e.claim(t, "prio-three", "default", map[string]any{"max": 3})), 6, 5, 4)

	// Equal priorities: the oldest first, whichever cluster holds it.
	produce("prio-age", func(int) int { return 4 })
	got = nil
	for range 5 {
		got = append(got, payloads(e.claim(t, "prio-age", "default", map[string]any{"max": 2}))...)
	}
	want("claims of 2 at one priority", got, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9)

	// Nothing claimable anywhere: the documented empty answer.
	if st, _, body := e.post(t, "/v1/topics/prio-age/subscriptions/default/claim", map[string]any{"max": 5}); st != 200 || len(body["messages"].([]any)) != 0 {
		t.Fatalf("empty claim: %d %v", st, body)
	}
}

// A nack's retry_after_ms replaces the backoff (docs/design.md, the
// OpenAPI document, the Go client's release): an explicit 0 makes the
// delivery claimable again at once; without it the backoff applies.
func TestNackRetryAfterZeroIsAtOnce(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	e := setup(t)
	if st, body := e.do(t, "PUT", "/v1/topics/nack-now/subscriptions/s", map[string]any{
		"max_attempts": 5, "backoff": map[string]any{"initial_ms": 600000, "max_ms": 600000, "multiplier": 1, "jitter": 0}}); st != 201 {
		t.Fatalf("PUT: %d %v", st, body)
	}
	e.post(t, "/v1/topics/nack-now/messages", map[string]any{"messages": []any{msg("n-1", 1)}})
	nack := func(item map[string]any) map[string]any {
		t.Helper()
		_, _, body := e.post(t, "/v1/nack", map[string]any{"items": []any{item}})
		r := results(t, body)[0]
		if r["status"] != "retry_scheduled" {
			t.Fatalf("nack %v: %v", item, r)
		}
		return r
	}
	got := e.claim(t, "nack-now", "s", map[string]any{"max": 1})
	if len(got) != 1 {
		t.Fatalf("first claim: %v", got)
	}
	before := time.Now()
	r := nack(map[string]any{"receipt": got[0]["receipt"], "error_code": "E_RELEASED", "retry_after_ms": 0})
	if at, err := time.Parse(time.RFC3339Nano, r["next_attempt_at"].(string)); err != nil || at.After(before.Add(time.Minute)) {
		t.Fatalf("retry_after_ms 0: next_attempt_at %v (%v), want now, not the 10-minute backoff", r["next_attempt_at"], err)
	}
	got = e.claim(t, "nack-now", "s", map[string]any{"max": 1, "wait_ms": 5000})
	if len(got) != 1 || got[0]["attempt"].(float64) != 2 {
		t.Fatalf("claim after a nack with retry_after_ms 0: %v", got)
	}
	r = nack(map[string]any{"receipt": got[0]["receipt"], "error_code": "E"})
	if at, err := time.Parse(time.RFC3339Nano, r["next_attempt_at"].(string)); err != nil || at.Before(before.Add(9*time.Minute)) {
		t.Fatalf("without retry_after_ms: next_attempt_at %v (%v), want the 10-minute backoff", r["next_attempt_at"], err)
	}
	if got := e.claim(t, "nack-now", "s", map[string]any{"max": 1}); len(got) != 0 {
		t.Fatalf("claimed during the backoff: %v", got)
	}
}

// A duplicate or a conflict answers the holder's id and the holder's
// vshard (where its trace lives), also when the retry's order_key puts it
// on another vshard of the same cluster, and whether the database or the
// router's recent-keys cache answers.
func TestDuplicateAnswersTheHoldersVShard(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	e := setup(t)
	first, other := "ok-a", ""
	for i := 0; other == ""; i++ {
		k := fmt.Sprint("ok-b", i)
		if shard.Of(k) != shard.Of(first) && e.owner(shard.Of(k)) == e.owner(shard.Of(first)) {
			other = k
		}
	}
	produce := func(key, orderKey string, payload int) map[string]any {
		t.Helper()
		_, _, body := e.post(t, "/v1/topics/dup-vshard/messages", map[string]any{"messages": []any{
			map[string]any{"key": key, "order_key": orderKey, "payload": payload}}})
		return results(t, body)[0]
	}
	orig := produce("dv-1", first, 1)
	if orig["status"] != "created" || int(orig["vshard"].(float64)) != int(shard.Of(first)) {
		t.Fatalf("first produce: %v", orig)
	}
	for _, c := range []struct {
		name    string
		payload int
		status  string
	}{{"duplicate", 1, "duplicate"}, {"again", 1, "duplicate"}, {"conflict", 2, "conflict"}} {
		r := produce("dv-1", other, c.payload)
		if r["status"] != c.status || r["id"] != orig["id"] || r["vshard"] != orig["vshard"] {
			t.Fatalf("%s with order_key %s: %v, want %s of %v", c.name, other, r, c.status, orig)
		}
	}
}

// DESIGN §6 "Dedup": the same key on the same topic is stored once. A key
// repeated in one request with order_keys that hash to different clusters
// is answered duplicate or conflict, not stored on both clusters.
func TestKeyRepeatedInOneBatchAcrossClusters(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	e := setup(t)
	on := e.keysAlternating(t, "okey-", 2) // on[0] on c1, on[1] on c2
	cases := []struct {
		key        string
		first      map[string]any
		then       map[string]any
		wantStatus string
	}{
		{"rep-dup", map[string]any{"order_key": on[0], "payload": 1}, map[string]any{"order_key": on[1], "payload": 1}, "duplicate"},
		{"rep-conflict", map[string]any{"order_key": on[1], "payload": 1}, map[string]any{"order_key": on[0], "payload": 2}, "conflict"},
		{"rep-plain-first", map[string]any{"payload": 1}, map[string]any{"order_key": on[0], "payload": 1}, "duplicate"},
	}
	for _, c := range cases {
		c.first["key"], c.then["key"] = c.key, c.key
		st, _, body := e.post(t, "/v1/topics/rep-batch/messages", map[string]any{"messages": []any{c.first, c.then}})
		if st != 200 {
			t.Fatalf("%s: %d %v", c.key, st, body)
		}
		r := results(t, body)
		if r[0]["status"] != "created" || r[1]["status"] != c.wantStatus || r[1]["id"] != r[0]["id"] || r[1]["vshard"] != r[0]["vshard"] {
			t.Fatalf("%s: %v, want created then %s of it", c.key, r, c.wantStatus)
		}
		if n := total(e.count(t, "SELECT COUNT(*) FROM message_store WHERE topic = 'rep-batch' AND msg_key = ?", c.key)); n != 1 {
			t.Fatalf("%s stored %d times", c.key, n)
		}
	}
}

// The trace shows every attempt's claim: a lease that lapsed is traced
// claimed (when and by whom) and lease_expired, like an acked or nacked
// one, also when it lapses on the last attempt.
func TestTraceShowsTheClaimOfALapsedLease(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	e := setup(t)
	if st, body := e.do(t, "PUT", "/v1/topics/lapse/subscriptions/s", map[string]any{"max_attempts": 2}); st != 201 {
		t.Fatalf("PUT: %d %v", st, body)
	}
	e.post(t, "/v1/topics/lapse/messages", map[string]any{"messages": []any{msg("l-1", 1)}})
	for attempt := 1; attempt <= 2; attempt++ {
		got := e.claim(t, "lapse", "s", map[string]any{"max": 1, "visibility_timeout_ms": 1, "consumer": fmt.Sprint("w", attempt), "wait_ms": 5000})
		if len(got) != 1 {
			t.Fatalf("claim %d: %v", attempt, got)
		}
		lease, _ := time.Parse(time.RFC3339Nano, got[0]["lease_expires_at"].(string))
		testtime.Within(t, 5*time.Second, "the 1 ms lease lapsing", func() bool { return time.Now().After(lease) })
	}
	// The next claim finds the lease lapsed on the last attempt: dead.
	if got := e.claim(t, "lapse", "s", map[string]any{"max": 1}); len(got) != 0 {
		t.Fatalf("claimed after the last attempt: %v", got)
	}
	// The trace reads a replica: poll until it has caught up.
	var body map[string]any
	testtime.WithinState(t, 10*time.Second, "trace of the dead message", func() (bool, string) {
		var st int
		st, body = e.do(t, "GET", "/v1/messages/l-1/trace?topic=lapse", nil)
		return st == 200 && body["message"].(map[string]any)["status"] == "dead", fmt.Sprint(st, " ", body)
	})
	var seq []string
	for _, ev := range body["events"].([]any) {
		m := ev.(map[string]any)
		seq = append(seq, fmt.Sprint(m["type"], "/", m["attempt"], "/", m["consumer"]))
	}
	want := "[produced/<nil>/<nil> claimed/1/w1 lease_expired/1/w1 claimed/2/w2 lease_expired/2/w2 dead_lettered/2/w2]"
	if fmt.Sprint(seq) != want {
		t.Fatalf("events %v, want %s", seq, want)
	}
}
