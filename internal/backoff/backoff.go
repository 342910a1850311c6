// Package backoff is how long shardmq waits before retrying a failed call
// to something outside it (Consul, a router, MySQL): exponentially longer
// after each failure, capped, and spread by jitter so that clients that
// failed together do not retry together. It uses the standard library
// only, so the client packages can use it too; ctxwait does the waiting.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/shardmq/shardmq/internal/ctxwait"
)

// Policy is a schedule of retry waits: Initial before the first retry,
// twice the previous wait before each next one, never more than Max, each
// then moved by up to ±Jitter of itself at random.
type Policy struct {
	Initial time.Duration
	Max     time.Duration // caps every wait, Initial's too
	// Jitter is a fraction in [0, 1): 0.2 draws each wait uniformly from
	// 80 % to 120 % of the schedule's. Zero waits exactly the schedule.
	Jitter float64
}

// Wait is the wait before retry n, counted from 1 (the wait after the
// n-th consecutive failure): Initial·2^(n-1), at most Max, with jitter.
// An n below 1 waits as n = 1.
func (p Policy) Wait(n int) time.Duration {
	d := p.Initial
	for i := 1; i < n && d < p.Max; i++ {
		d *= 2
	}
	d = min(d, p.Max)
	if p.Jitter > 0 {
		d = time.Duration(float64(d) * (1 - p.Jitter + 2*p.Jitter*rand.Float64()))
	}
	return d
}

// Sleep waits Wait(n), or less when ctx ends first, and returns ctx's
// error then (ctxwait.Sleep).
func (p Policy) Sleep(ctx context.Context, n int) error {
	return ctxwait.Sleep(ctx, p.Wait(n))
}
