package server

import (
	"context"
	"sync"
	"time"

	"github.com/shardmq/shardmq/topology"
)

// applier serializes topology applications and retries one that could
// not be applied (say, its new primary is not writable yet) every
// interval, until it applies or a newer one arrives.
//
// Lock order: applier.mu, then the pools', then the endpoints'.
type applier struct {
	every time.Duration

	mu       sync.Mutex
	latest   *topology.Topology // newest topology handed to apply
	retrying *topology.Topology // the one a pending retry will apply

	timerMu sync.Mutex
	retry   *time.Timer
	stopped bool
}

// begin serializes topology applications and tells a retry whether its
// topology is still the newest. The caller defers release.
func (a *applier) begin(top *topology.Topology) (release func(), current bool) {
	a.mu.Lock()
	current = true
	if top == a.retrying {
		a.retrying = nil
		current = a.latest == top
	} else {
		a.latest = top
	}
	return a.mu.Unlock, current
}

// retryLater applies top again after the interval. The caller holds the
// application (between begin and release).
func (a *applier) retryLater(ctx context.Context, top *topology.Topology, apply func(context.Context, *topology.Topology)) {
	a.retrying = top
	a.timerMu.Lock()
	defer a.timerMu.Unlock()
	if a.retry != nil {
		a.retry.Stop()
	}
	if a.stopped {
		return
	}
	a.retry = time.AfterFunc(a.every, func() {
		a.timerMu.Lock()
		stopped := a.stopped
		a.timerMu.Unlock()
		if ctx.Err() != nil || stopped {
			return
		}
		apply(ctx, top)
	})
}

// Stop cancels a pending retry; none is started afterwards. Safe to call
// twice. It does not wait for an application in progress (the router's
// Close stops the watch that applies first).
func (a *applier) Stop() {
	a.timerMu.Lock()
	defer a.timerMu.Unlock()
	a.stopped = true
	if a.retry != nil {
		a.retry.Stop()
	}
}
