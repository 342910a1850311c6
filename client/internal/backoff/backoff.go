// Package backoff is how long the client waits before retrying a request
// to the router or a write to the service's database: exponentially
// longer after each failure, capped, spread by jitter, and cut short by
// the context. It is the client's own copy of the router's
// internal/backoff, because the client imports nothing but the standard
// library (imports_test.go): a service that uses it pulls in nothing of
// the router.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
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

// Sleep waits d, or less when ctx ends first, and then returns ctx's
// error (nil when the whole of d passed). A d of zero or less does not
// wait.
func Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
