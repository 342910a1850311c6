package broker

import (
	"sync"
	"time"
)

// Shared long-poll re-polls. Claims that wait on an empty subscription
// re-poll the databases with a backoff (Config.PollMin to PollMax); each
// on its own timer, N waiting claims would poll N times as often as one
// (measured: 200 waiting claims on an empty subscription cost ~24k
// queries per primary in 20 s). pollGate remembers when a poll of a
// subscription last found it empty on every cluster; a waiting claim
// whose timer fires within its own interval of that poll does not poll
// again — the one that polled stands for all of them — and a new claim
// within PollMin of it starts waiting at once. So a subscription costs
// about one poll per interval whatever the number of waiting claims. A
// produce through this router still wakes every waiting claim of the
// topic at once (their polls coalesce into one transaction per cluster:
// cluster/claim.go), and what another router produced is found by the next
// poll, within PollMax as before.

type pollKey struct {
	topic, sub string
	dead       bool
	errorCode  string
}

type pollGate struct {
	mu    sync.Mutex
	empty map[pollKey]time.Time // when a poll last found nothing
}

func newPollGate() *pollGate { return &pollGate{empty: map[pollKey]time.Time{}} }

// fresh reports whether a poll of k found nothing less than within ago.
func (g *pollGate) fresh(k pollKey, now time.Time, within time.Duration) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	t, ok := g.empty[k]
	return ok && now.Sub(t) < within
}

// polled records a poll's outcome: empty, or it found deliveries (the
// next waiting claim polls too: there may be more).
func (g *pollGate) polled(k pollKey, at time.Time, found bool, keep time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if found {
		delete(g.empty, k)
		return
	}
	g.empty[k] = at
	if len(g.empty) > 4096 {
		// Forget subscriptions nobody polled lately (any later claim
		// polls them again), so that the map stays small.
		for k, t := range g.empty {
			if at.Sub(t) > keep {
				delete(g.empty, k)
			}
		}
	}
}

// size is how many subscriptions the gate remembers (tests).
func (g *pollGate) size() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.empty)
}
