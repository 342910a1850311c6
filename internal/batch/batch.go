// Package batch runs items submitted one by one as batches: the group
// commit every write path of shardmq shares (produce, acks, owners'
// flushes).
//
// The policy is the same everywhere: a batch starts at once when nothing
// runs (an item alone on an idle batcher waits for nobody), at most
// InFlight batches run at a time, and the items that arrive while they
// run wait and go together in the next one — up to MaxItems items and
// MaxBytes bytes — after lingering up to Linger for more (0: no linger).
// Under load batches grow by themselves; idle, latency is one run.
package batch

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Config tunes a Batcher. Zero fields take the defaults named.
type Config struct {
	// MaxItems caps the items of one batch. Defaults to 1000.
	MaxItems int
	// MaxBytes caps the summed sizes of one batch's items (as Size
	// reports them); an item bigger than it runs alone. 0: no cap.
	MaxBytes int
	// InFlight is how many batches may run at once. Defaults to 1.
	InFlight int
	// Linger is how long a batch that could take more items waits for
	// them once it is due. Defaults to 0: it starts at once.
	Linger time.Duration
}

func (c Config) withDefaults() Config {
	if c.MaxItems <= 0 {
		c.MaxItems = 1000
	}
	if c.InFlight <= 0 {
		c.InFlight = 1
	}
	return c
}

// ErrStopped answers items submitted after Stop.
var ErrStopped = errors.New("batcher stopped")

// Batcher runs items of type T through run, in batches. run answers one
// R per item, in order; it is called from the batcher's own goroutines
// with a context that is not the callers' (a batch is shared: one
// caller's cancellation must not fail the others).
type Batcher[T, R any] struct {
	cfg  Config
	run  func(ctx context.Context, items []T) []R
	size func(T) int

	mu      sync.Mutex
	queue   []*call[T, R]
	queued  int // bytes queued
	running int
	stopped bool
	idle    *sync.Cond
	runs    int64
	items   int64
}

type call[T, R any] struct {
	item T
	done chan R
}

// New returns a batcher over run; size reports an item's bytes for
// MaxBytes (nil: items count 0 bytes).
func New[T, R any](cfg Config, run func(ctx context.Context, items []T) []R, size func(T) int) *Batcher[T, R] {
	b := &Batcher[T, R]{cfg: cfg.withDefaults(), run: run, size: size}
	b.idle = sync.NewCond(&b.mu)
	return b
}

// Submit queues item and returns a channel that receives its answer once
// its batch ran. ok is false after Stop (the item was not queued).
func (b *Batcher[T, R]) Submit(item T) (<-chan R, bool) {
	c := &call[T, R]{item: item, done: make(chan R, 1)}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.stopped {
		return nil, false
	}
	b.queue = append(b.queue, c)
	b.queued += b.sizeOf(item)
	if b.running < b.cfg.InFlight {
		b.running++
		go b.work()
	}
	return c.done, true
}

// Do submits item and waits for its answer. When ctx ends first it
// returns ctx's error; the item still runs (its batch may already have
// started), and its answer is dropped.
func (b *Batcher[T, R]) Do(ctx context.Context, item T) (R, error) {
	var zero R
	done, ok := b.Submit(item)
	if !ok {
		return zero, ErrStopped
	}
	select {
	case r := <-done:
		return r, nil
	case <-ctx.Done():
		return zero, ctx.Err()
	}
}

func (b *Batcher[T, R]) sizeOf(item T) int {
	if b.size == nil {
		return 0
	}
	return b.size(item)
}

// work runs batches while items wait, then returns.
func (b *Batcher[T, R]) work() {
	for {
		b.mu.Lock()
		if len(b.queue) == 0 {
			b.running--
			if b.running == 0 {
				b.idle.Broadcast()
			}
			b.mu.Unlock()
			return
		}
		if b.cfg.Linger > 0 && !b.stopped && len(b.queue) < b.cfg.MaxItems && (b.cfg.MaxBytes <= 0 || b.queued < b.cfg.MaxBytes) {
			b.mu.Unlock()
			time.Sleep(b.cfg.Linger)
			b.mu.Lock()
		}
		take, bytes := 0, 0
		for take < len(b.queue) && take < b.cfg.MaxItems {
			s := b.sizeOf(b.queue[take].item)
			if take > 0 && b.cfg.MaxBytes > 0 && bytes+s > b.cfg.MaxBytes {
				break
			}
			bytes += s
			take++
		}
		calls := b.queue[:take:take]
		b.queue = b.queue[take:]
		b.queued -= bytes
		b.runs++
		b.items += int64(take)
		b.mu.Unlock()

		items := make([]T, len(calls))
		for i, c := range calls {
			items[i] = c.item
		}
		res := b.run(context.Background(), items)
		for i, c := range calls {
			c.done <- res[i]
		}
	}
}

// Stop refuses new items and waits until everything queued has run. Safe
// to call twice.
func (b *Batcher[T, R]) Stop() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.stopped = true
	for b.running > 0 {
		b.idle.Wait()
	}
}

// Stats reports how many batches ran and how many items they carried.
func (b *Batcher[T, R]) Stats() (runs, items int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.runs, b.items
}
