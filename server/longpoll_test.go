package server

import (
	"github.com/shardmq/shardmq/internal/testbed"
	"sync"
	"testing"
	"time"
)

// Claims waiting on an empty subscription share their re-polls: many
// waiting claims, started at different moments so that their polls do not
// coalesce by chance, cost about what one costs, and a produce still
// wakes them.
func TestWaitingClaimsShareTheirPolls(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	e := setup(t)
	// A known subscription (not implicit): its waiting claims re-poll.
	e.post(t, "/v1/topics/lpshare/messages", map[string]any{"messages": []any{msg("first", 1)}})
	e.ack(t, e.claim(t, "lpshare", "default", map[string]any{"max": 10})...)

	const waiters = 40
	const wait = 1500 * time.Millisecond
	b := e.r.Broker()
	before := b.ClaimTransactions()
	var wg sync.WaitGroup
	for i := range waiters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if got := e.claim(t, "lpshare", "default", map[string]any{"max": 10, "wait_ms": wait.Milliseconds()}); len(got) != 0 {
				t.Errorf("waiter %d got %d messages from an empty subscription", i, len(got))
			}
		}()
		time.Sleep(7 * time.Millisecond) // spread the starts: this is the load, not a wait for an effect
	}
	wg.Wait()
	runs := b.ClaimTransactions() - before
	// Each waiter alone polls about 7 times in 1.5 s (backoff 20 ms to
	// 500 ms), on each of the 2 clusters: ~560 transactions for 40. Shared,
	// a poll is made about once per interval.
	t.Logf("%d waiting claims for %s: %d claim transactions", waiters, wait, runs)
	if runs > 120 {
		t.Fatalf("%d claim transactions for %d waiting claims, want at most 120 (shared polls)", runs, waiters)
	}
	// A produce still wakes a waiting claim at once.
	ch := make(chan int, 1)
	go func() {
		ch <- len(e.claim(t, "lpshare", "default", map[string]any{"max": 10, "wait_ms": 5000}))
	}()
	waitFor(t, 5*time.Second, func() bool { topics, _ := b.Waiting(); return topics > 0 })
	e.post(t, "/v1/topics/lpshare/messages", map[string]any{"messages": []any{msg("wake", 2)}})
	select {
	case n := <-ch:
		if n != 1 {
			t.Fatalf("woken claim got %d messages, want 1", n)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("a produce did not wake the waiting claim")
	}
}
