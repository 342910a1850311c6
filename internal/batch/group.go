package batch

import (
	"context"
	"sync"
	"sync/atomic"
)

// Group is a batcher per key: items of one key run in batches of their
// own (a claim's topic and subscription, say). A key's batcher exists
// only while items of it wait or run, so keys used once (a made-up topic
// name) leave nothing behind.
type Group[K comparable, T, R any] struct {
	cfg  Config
	run  func(ctx context.Context, k K, items []T) []R
	size func(T) int
	opts []Option[T]
	runs atomic.Int64

	mu      sync.Mutex
	keys    map[K]*member[T, R]
	stopped bool
}

// member is one key's batcher and how many callers hold it between
// finding it and queuing on it (it is not dropped under them).
type member[T, R any] struct {
	b    *Batcher[T, R]
	refs int
}

// NewGroup returns a group whose keys' batchers run items through run,
// each with cfg, size and opts (see New).
func NewGroup[K comparable, T, R any](cfg Config, run func(ctx context.Context, k K, items []T) []R, size func(T) int, opts ...Option[T]) *Group[K, T, R] {
	return &Group[K, T, R]{cfg: cfg, run: run, size: size, opts: opts, keys: map[K]*member[T, R]{}}
}

// Enqueue queues item on k's batcher (see Batcher.Enqueue).
func (g *Group[K, T, R]) Enqueue(ctx context.Context, k K, item T) (<-chan R, error) {
	g.mu.Lock()
	if g.stopped {
		g.mu.Unlock()
		return nil, ErrStopped
	}
	m, ok := g.keys[k]
	if !ok {
		m = &member[T, R]{}
		run := func(ctx context.Context, items []T) []R {
			g.runs.Add(1)
			return g.run(ctx, k, items)
		}
		m.b = New(g.cfg, run, g.size, append(g.opts, func(h *hooks[T]) { h.onIdle = func() { g.drop(k, m, false) } })...)
		g.keys[k] = m
	}
	m.refs++
	g.mu.Unlock()
	done, err := m.b.Enqueue(ctx, item)
	g.drop(k, m, true)
	return done, err
}

// drop forgets k's batcher once nobody holds it and it has nothing to
// do; release lets go of a caller's hold first (false: the batcher just
// fell idle).
func (g *Group[K, T, R]) drop(k K, m *member[T, R], release bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if release {
		m.refs--
	}
	m.b.mu.Lock()
	busy := m.b.busy()
	m.b.mu.Unlock()
	if m.refs == 0 && !busy && g.keys[k] == m {
		delete(g.keys, k)
	}
}

// Do queues item on k's batcher and waits for its answer (see
// Batcher.Do).
func (g *Group[K, T, R]) Do(ctx context.Context, k K, item T) (R, error) {
	var zero R
	done, err := g.Enqueue(ctx, k, item)
	if err != nil {
		return zero, err
	}
	select {
	case r := <-done:
		return r, nil
	case <-ctx.Done():
		return zero, ctx.Err()
	}
}

// Stop refuses new items and waits until everything queued on any key
// has run. Safe to call twice.
func (g *Group[K, T, R]) Stop() {
	g.mu.Lock()
	g.stopped = true
	ms := make([]*member[T, R], 0, len(g.keys))
	for _, m := range g.keys {
		ms = append(ms, m)
	}
	g.mu.Unlock()
	for _, m := range ms {
		m.b.Stop()
	}
}

// Stopped says whether Stop was called.
func (g *Group[K, T, R]) Stopped() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.stopped
}

// Len is how many keys have items waiting or running.
func (g *Group[K, T, R]) Len() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.keys)
}

// Runs is how many batches ran over all keys.
func (g *Group[K, T, R]) Runs() int64 { return g.runs.Load() }
