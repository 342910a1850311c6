package server

import (
	"fmt"
	"net/http"
	"sync"
	"testing"

	"github.com/shardmq/shardmq/auth"
	"github.com/shardmq/shardmq/internal/testbed"
	"github.com/shardmq/shardmq/subscription"
)

// concurrently runs n requests at once (each its own token, method, path
// and body from req) and returns their answers in order.
func concurrently(t *testing.T, e *secureEnv, n int, req func(i int) (token, method, path, body string)) []answer {
	t.Helper()
	out := make([]answer, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tok, method, path, body := req(i)
			<-start
			out[i] = e.send(t, tok, method, path, body, nil)
		}()
	}
	close(start)
	wg.Wait()
	return out
}

// tally counts answers by "status code" (e.g. "201 ", "409 too_many_subscriptions").
func tally(as []answer) map[string]int {
	out := map[string]int{}
	for _, a := range as {
		out[fmt.Sprint(a.status, " ", a.code())]++
	}
	return out
}

// Caps hold under concurrency: 45 subscription PUTs at once on a topic
// capped at 32 store exactly 32 (the others 409 too_many_subscriptions);
// 20 first produces at once to new topics under a cap of 12 topics make
// exactly 12; and a scoped producer's new topics stop at its quota while
// the operator (admin on every topic) has none.
func TestCapsHoldUnderConcurrency(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	const perTopic, maxTopics, quota = 32, 12, 3
	e := setupSecure(t, map[string]map[auth.Scope][]string{
		"admin":  {auth.Admin: {"*"}},
		"scoped": {auth.Produce: {"q.*"}},
	}, nil, func(c *Config) {
		c.SubscriptionLimits = subscription.Limits{MaxPerTopic: perTopic, MaxTopics: maxTopics, MaxTopicsPerCreator: quota}
	})
	admin := e.secrets["admin"]

	got := tally(concurrently(t, e, 45, func(i int) (string, string, string, string) {
		return admin, "PUT", fmt.Sprintf("/v1/topics/capped/subscriptions/s%02d", i), `{}`
	}))
	if got["201 "] != perTopic || got["409 too_many_subscriptions"] != 45-perTopic {
		t.Fatalf("45 PUTs at once under a cap of %d: %v", perTopic, got)
	}
	if n := e.count(t, "SELECT COUNT(*) FROM subscription WHERE topic = 'capped' AND deleted = 0"); n["c1"] != perTopic {
		t.Fatalf("stored subscriptions of capped: %v, want %d", n, perTopic)
	}

	// The scoped producer makes at most its quota of topics, at once.
	scoped := concurrently(t, e, 6, func(i int) (string, string, string, string) {
		return e.secrets["scoped"], "POST", fmt.Sprintf("/v1/topics/q.%d/messages", i), `{"messages":[{"payload":1}]}`
	})
	made := ""
	for i, a := range scoped {
		if a.status == 200 {
			made = fmt.Sprintf("q.%d", i)
		}
	}
	got = tally(scoped)
	if got["200 "] != quota || got["409 too_many_topics"] != 6-quota {
		t.Fatalf("6 new topics at once by a producer with a quota of %d: %v", quota, got)
	}
	// Topics so far: capped and the quota's. Then 20 new ones at once by
	// the operator (admin on every topic: no quota, it makes more than 3)
	// fill the cap exactly.
	left := maxTopics - 1 - quota
	got = tally(concurrently(t, e, 20, func(i int) (string, string, string, string) {
		return admin, "POST", fmt.Sprintf("/v1/topics/t.%d/messages", i), `{"messages":[{"payload":1}]}`
	}))
	if got["200 "] != left || got["409 too_many_topics"] != 20-left {
		t.Fatalf("20 new topics at once with room for %d: %v", left, got)
	}
	if n := e.count(t, "SELECT COUNT(DISTINCT topic) FROM subscription WHERE deleted = 0"); n["c1"] != maxTopics {
		t.Fatalf("stored topics: %v, want %d", n, maxTopics)
	}
	// Producing to a topic that exists needs no room.
	if a := e.send(t, e.secrets["scoped"], "POST", "/v1/topics/"+made+"/messages", `{"messages":[{"payload":2}]}`, nil); a.status != 200 {
		t.Fatalf("produce to an existing topic at the caps: %d %s", a.status, a.raw)
	}
	// The cap holds for the operator too.
	a := e.send(t, admin, "PUT", "/v1/topics/another/subscriptions/s", `{}`, nil)
	if a.status != http.StatusConflict || a.code() != "too_many_topics" {
		t.Fatalf("admin PUT past the topic cap: %d %s", a.status, a.raw)
	}
}
