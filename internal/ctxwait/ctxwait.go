// Package ctxwait holds the one way shardmq waits for a while: until the
// time is up or the context ends, whichever comes first.
package ctxwait

import (
	"context"
	"time"
)

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
