// Package batch runs items submitted one by one as batches: the group
// commit every write path of shardmq shares (produce, claims, acks,
// owners' flushes).
//
// The policy is the same everywhere: a batch starts at once when nothing
// runs (an item alone on an idle batcher waits for nobody), at most
// InFlight batches run at a time, and the items that arrive while they
// run wait and go together in the next one — up to MaxItems (as Count
// weighs them) and MaxBytes (as size weighs them) — after lingering up to
// Linger for more when the batcher is busy. Under load batches grow by
// themselves; idle, latency is one run. A batcher holds no goroutine
// while nothing is queued or running.
package batch

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Config tunes a Batcher. Zero fields take the defaults named.
type Config struct {
	// MaxItems caps a batch's items, each weighing what Count says (1
	// without Count). Defaults to 1000. An item heavier than it runs alone.
	MaxItems int
	// MaxBytes caps the summed sizes of one batch's items (as size
	// reports them); an item bigger than it runs alone. 0: no cap.
	MaxBytes int
	// InFlight is how many batches may run at once. Defaults to 1.
	InFlight int
	// Extra says when a batch beyond the first may start (up to
	// InFlight). Defaults to Eager.
	Extra Policy
	// Linger is how long a batch that could take more items waits for
	// them before it runs. Defaults to 0: it runs at once. A lingering
	// batch runs as soon as it is full.
	Linger time.Duration
	// LingerAfter is how many items must be queued as a batch begins for
	// it, and for the batch after it, to linger: a quiet batcher then
	// never makes a lone item wait. Defaults to 0: every batch lingers.
	LingerAfter int
	// MaxQueued bounds the items waiting for a batch; Enqueue blocks
	// while that many wait. 0: no bound.
	MaxQueued int
}

// Policy says when batches beyond the first start.
type Policy int

const (
	// Eager starts another batch whenever items wait and fewer than
	// InFlight batches run.
	Eager Policy = iota
	// WhenFull starts another batch only while a full batch (MaxItems or
	// MaxBytes) waits behind the running ones: further concurrent runs
	// cost contention, and are worth it only when the backlog needs them.
	WhenFull
)

func (c Config) withDefaults() Config {
	if c.MaxItems <= 0 {
		c.MaxItems = 1000
	}
	if c.InFlight <= 0 {
		c.InFlight = 1
	}
	if c.Linger < 0 {
		c.Linger = 0
	}
	return c
}

// ErrStopped answers items submitted after Stop.
var ErrStopped = errors.New("batcher stopped")

// Option adds to how a batcher weighs and groups items of type T.
type Option[T any] func(*hooks[T])

type hooks[T any] struct {
	count  func(T) int
	joins  func(first, next T) bool
	onIdle func()
}

// Count weighs items against MaxItems (a request of many messages
// counts its messages).
func Count[T any](count func(T) int) Option[T] {
	return func(h *hooks[T]) { h.count = count }
}

// Joins says whether next may run in the batch that first begins; the
// batch ends before the first queued item that may not (it begins the
// next), so items keep their order.
func Joins[T any](joins func(first, next T) bool) Option[T] {
	return func(h *hooks[T]) { h.joins = joins }
}

// Batcher runs items of type T through run, in batches. run answers one
// R per item, in order; it is called from the batcher's own goroutines
// with a context that is not the callers' (a batch is shared: one
// caller's cancellation must not fail the others), so run bounds its own
// work.
type Batcher[T, R any] struct {
	cfg  Config
	run  func(ctx context.Context, items []T) []R
	size func(T) int
	hooks[T]

	slots    chan struct{} // MaxQueued > 0: one per queued item
	arrived  chan struct{} // buffered 1: wakes a lingering batch
	stopping chan struct{} // closed by Stop

	mu      sync.Mutex
	queue   []*call[T, R]
	bytes   int // queued, as size weighs them
	counted int // queued, as Count weighs them
	running int
	stopped bool
	idle    *sync.Cond
	// backlog is how many items were queued as the last batch began
	// (LingerAfter).
	backlog int
	runs    int64
	items   int64
}

type call[T, R any] struct {
	item  T
	size  int
	count int
	done  chan R // buffered 1: a batch never blocks on it
}

// New returns a batcher over run; size reports an item's bytes for
// MaxBytes (nil: items count 0 bytes).
func New[T, R any](cfg Config, run func(ctx context.Context, items []T) []R, size func(T) int, opts ...Option[T]) *Batcher[T, R] {
	b := &Batcher[T, R]{cfg: cfg.withDefaults(), run: run, size: size, arrived: make(chan struct{}, 1), stopping: make(chan struct{})}
	for _, o := range opts {
		o(&b.hooks)
	}
	if b.cfg.MaxQueued > 0 {
		b.slots = make(chan struct{}, b.cfg.MaxQueued)
	}
	b.idle = sync.NewCond(&b.mu)
	return b
}

// Enqueue queues item and returns a channel that receives its answer once
// its batch ran. While MaxQueued items wait it blocks until one is taken,
// ctx ends (ctx's error) or the batcher stops. After Stop it returns
// ErrStopped: the item was not queued. Once queued, an item runs whatever
// becomes of ctx.
func (b *Batcher[T, R]) Enqueue(ctx context.Context, item T) (<-chan R, error) {
	if b.slots != nil {
		select {
		case b.slots <- struct{}{}:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-b.stopping:
			return nil, ErrStopped
		}
	}
	c := &call[T, R]{item: item, size: b.sizeOf(item), count: b.countOf(item), done: make(chan R, 1)}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.stopped {
		if b.slots != nil {
			<-b.slots
		}
		return nil, ErrStopped
	}
	b.queue = append(b.queue, c)
	b.bytes += c.size
	b.counted += c.count
	if b.running == 0 || b.running < b.cfg.InFlight && (b.cfg.Extra == Eager || b.full()) {
		b.running++
		go b.work()
	}
	select {
	case b.arrived <- struct{}{}:
	default:
	}
	return c.done, nil
}

// Submit is Enqueue without a context: ok is false after Stop.
func (b *Batcher[T, R]) Submit(item T) (<-chan R, bool) {
	done, err := b.Enqueue(context.Background(), item)
	return done, err == nil
}

// Do submits item and waits for its answer. When ctx ends first it
// returns ctx's error; the item still runs if it was queued (its batch
// may already have started), and its answer is dropped.
func (b *Batcher[T, R]) Do(ctx context.Context, item T) (R, error) {
	var zero R
	done, err := b.Enqueue(ctx, item)
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

func (b *Batcher[T, R]) sizeOf(item T) int {
	if b.size == nil {
		return 0
	}
	return b.size(item)
}

func (b *Batcher[T, R]) countOf(item T) int {
	if b.count == nil {
		return 1
	}
	return b.count(item)
}

// full says whether what is queued fills a batch. Called with mu held.
func (b *Batcher[T, R]) full() bool {
	return b.counted >= b.cfg.MaxItems || b.cfg.MaxBytes > 0 && b.bytes >= b.cfg.MaxBytes
}

// work runs batches while items wait, then returns.
func (b *Batcher[T, R]) work() {
	for {
		b.mu.Lock()
		// Under WhenFull a further batch ends its goroutine once what
		// waits no longer fills a batch: one goroutine serves the rest.
		if len(b.queue) == 0 || b.running > 1 && b.cfg.Extra == WhenFull && !b.full() {
			b.running--
			last := b.running == 0
			if last {
				b.idle.Broadcast()
			}
			b.mu.Unlock()
			if last && b.onIdle != nil {
				b.onIdle()
			}
			return
		}
		waiting := len(b.queue)
		if b.cfg.Linger > 0 && (waiting >= b.cfg.LingerAfter || b.backlog >= b.cfg.LingerAfter) {
			b.linger()
			if len(b.queue) == 0 {
				b.mu.Unlock() // another batch took them meanwhile
				continue
			}
		}
		// Items gathered while lingering do not count: steady traffic that
		// the batches keep up with never lingers.
		b.backlog = waiting
		calls := b.take()
		b.mu.Unlock()
		if b.slots != nil {
			for range calls {
				<-b.slots
			}
		}

		items := make([]T, len(calls))
		for i, c := range calls {
			items[i] = c.item
		}
		res := b.run(context.Background(), items)
		count := 0
		for _, c := range calls {
			count += c.count
		}
		b.mu.Lock()
		b.runs++
		b.items += int64(count)
		b.mu.Unlock()
		for i, c := range calls {
			c.done <- res[i]
		}
	}
}

// linger waits, with mu held (released meanwhile), until what is queued
// fills a batch, Linger has passed or the batcher stops.
func (b *Batcher[T, R]) linger() {
	timer := time.NewTimer(b.cfg.Linger)
	defer timer.Stop()
	for !b.full() && !b.stopped {
		b.mu.Unlock()
		expired := false
		select {
		case <-timer.C:
			expired = true
		case <-b.arrived:
		case <-b.stopping:
		}
		b.mu.Lock()
		if expired {
			return
		}
	}
}

// take removes the next batch from the queue. Called with mu held.
func (b *Batcher[T, R]) take() []*call[T, R] {
	first := b.queue[0]
	n, bytes, count := 1, first.size, first.count
	for ; n < len(b.queue); n++ {
		c := b.queue[n]
		if count+c.count > b.cfg.MaxItems || b.cfg.MaxBytes > 0 && bytes+c.size > b.cfg.MaxBytes ||
			b.joins != nil && !b.joins(first.item, c.item) {
			break
		}
		bytes += c.size
		count += c.count
	}
	calls := b.queue[:n:n]
	b.queue = b.queue[n:]
	b.bytes -= bytes
	b.counted -= count
	return calls
}

// Stop refuses new items and waits until everything queued has run. Safe
// to call twice.
func (b *Batcher[T, R]) Stop() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.stopped {
		b.stopped = true
		close(b.stopping)
	}
	for b.running > 0 {
		b.idle.Wait()
	}
}

// Stopped says whether Stop was called.
func (b *Batcher[T, R]) Stopped() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.stopped
}

// Stats reports how many batches ran to the end and how many items they
// carried (as Count weighs them); a batch counts before its items are
// answered.
func (b *Batcher[T, R]) Stats() (runs, items int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.runs, b.items
}

// Queued reports the items waiting for a batch: how many, and what they
// weigh (Count).
func (b *Batcher[T, R]) Queued() (items, counted int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.queue), b.counted
}

// Busy says whether items wait or a batch runs (or lingers).
func (b *Batcher[T, R]) Busy() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.busy()
}

// busy is Busy with mu held.
func (b *Batcher[T, R]) busy() bool { return len(b.queue) > 0 || b.running > 0 }
