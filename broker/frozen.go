package broker

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shardmq/shardmq/routing"
	"github.com/shardmq/shardmq/shard"
	"github.com/shardmq/shardmq/store"
)

// Requests during a resharding cut-over.
//
// Two things make a cut-over safe on this router:
//
//   - Pins. Every operation routes with one shard map, pinned while its
//     writes are in flight. Applied reports the oldest map still pinned (or
//     the current one), and that is the version the router publishes to the
//     resharding barrier: when a job sees every router at the frozen
//     version, no write routed with an older map can still land on the
//     source cluster.
//   - The buffer. Items of frozen vshards are held, without a pin, until the
//     map changes (a signal from routing.Table, not a poll), for at most
//     FrozenWait per request, and then answered unavailable with
//     Retry-After. At most FrozenMaxHeld requests are held at once; more are
//     answered unavailable at once.

// pins counts operations in flight by the shard-map version they routed
// with.
type pins struct {
	mu       sync.Mutex
	n        map[int64]int
	released chan struct{} // closed and replaced when a version's last pin goes
}

func newPins() *pins { return &pins{n: map[int64]int{}, released: make(chan struct{})} }

// pin returns the current map, counted until release is called.
func (b *Broker) pin() (*routing.Map, func()) {
	p := b.pins
	p.mu.Lock()
	m := b.table.Load()
	p.n[m.Version()]++
	p.mu.Unlock()
	return m, b.unpinner(m.Version())
}

// pinVersion adds a pin on version v, which an operation already holds.
func (b *Broker) pinVersion(v int64) func() {
	p := b.pins
	p.mu.Lock()
	p.n[v]++
	p.mu.Unlock()
	return b.unpinner(v)
}

func (b *Broker) unpinner(v int64) func() {
	p := b.pins
	var once sync.Once
	return func() {
		once.Do(func() {
			p.mu.Lock()
			defer p.mu.Unlock()
			if p.n[v]--; p.n[v] == 0 {
				delete(p.n, v)
				// Only the last pin of an older map can move Applied (a
				// newer map signals through the table): the common case,
				// pins of the current map, costs no wake-up.
				if v < b.table.Load().Version() {
					close(p.released)
					p.released = make(chan struct{})
				}
			}
		})
	}
}

// Applied is the shard-map version this router can vouch for: the oldest
// version an operation in flight routed with, or the current one. The
// resharding barrier waits on it.
func (b *Broker) Applied() int64 {
	p := b.pins
	p.mu.Lock()
	defer p.mu.Unlock()
	v := b.table.Load().Version()
	for pv := range p.n {
		if pv < v {
			v = pv
		}
	}
	return v
}

// AppliedChanged returns a channel closed when Applied may have grown: the
// last operation routed with an older map finished, or the map changed.
func (b *Broker) AppliedChanged() <-chan struct{} {
	p := b.pins
	p.mu.Lock()
	rel := p.released
	p.mu.Unlock()
	changed := b.table.Changed()
	out := make(chan struct{})
	go func() {
		select {
		case <-rel:
		case <-changed:
		}
		close(out)
	}()
	return out
}

// FrozenStats counts requests held on frozen vshards.
type FrozenStats struct {
	Held        int64         // held now
	HeldTotal   uint64        // ever held
	TimedOut    uint64        // answered unavailable after FrozenWait
	Overflow    uint64        // answered unavailable at once: FrozenMaxHeld were held
	HeldSeconds float64       // time spent held, summed
	MaxHeld     time.Duration // longest hold
}

type frozenCounters struct {
	held      atomic.Int64
	heldTotal atomic.Uint64
	timedOut  atomic.Uint64
	overflow  atomic.Uint64
	mu        sync.Mutex
	heldSecs  float64
	maxHeld   time.Duration
}

// FrozenStats returns the buffer's counters.
func (b *Broker) FrozenStats() FrozenStats {
	f := &b.frozen
	f.mu.Lock()
	defer f.mu.Unlock()
	return FrozenStats{Held: f.held.Load(), HeldTotal: f.heldTotal.Load(), TimedOut: f.timedOut.Load(),
		Overflow: f.overflow.Load(), HeldSeconds: f.heldSecs, MaxHeld: f.maxHeld}
}

// dispatch routes items (by vs; skip[i] leaves item i out) to the clusters
// serving them and runs each cluster's share with run, clusters
// concurrently, each share under a pin of the map it was routed with and
// with a context fenced by that map (store.WithFence): run's writes are
// refused by a cluster whose fence is newer. A
// share whose writes may land after run returns (a produce given up while
// queued) calls keep for one more pin, released when they have landed.
// Items of frozen vshards are held until their vshard serves again, at most
// FrozenWait for the whole request; errs[i] says why item i was not run.
func (b *Broker) dispatch(ctx context.Context, vs []shard.ID, skip []bool, run func(ctx context.Context, name string, cs *clusterConn, idx []int, keep func() func())) []error {
	errs := make([]error, len(vs))
	if b.selfFenced.Load() {
		for i := range errs {
			errs[i] = errSelfFenced
		}
		return errs
	}
	pending := make([]int, 0, len(vs))
	for i := range vs {
		if skip == nil || !skip[i] {
			pending = append(pending, i)
		}
	}
	var deadline time.Time
	var heldSince time.Time
	defer func() {
		if !heldSince.IsZero() {
			b.frozen.held.Add(-1)
			d := time.Since(heldSince)
			b.frozen.mu.Lock()
			b.frozen.heldSecs += d.Seconds()
			b.frozen.maxHeld = max(b.frozen.maxHeld, d)
			b.frozen.mu.Unlock()
		}
	}()
	for len(pending) > 0 {
		changed := b.table.Changed()
		m, release := b.pin()
		keep := func() func() { return b.pinVersion(m.Version()) }
		clusters := *b.clusters.Load()
		groups := map[string][]int{}
		var frozen []int
		for _, i := range pending {
			name, state := m.Lookup(vs[i])
			if state == routing.Frozen {
				frozen = append(frozen, i)
				continue
			}
			if _, ok := clusters[name]; !ok {
				errs[i] = fmt.Errorf("%w: cluster %s has no connection", ErrUnavailable, name)
				continue
			}
			groups[name] = append(groups[name], i)
		}
		fctx := store.WithFence(ctx, store.Fence{MapVersion: m.Version()})
		var wg sync.WaitGroup
		for name, idx := range groups {
			wg.Add(1)
			go func() {
				defer wg.Done()
				run(fctx, name, clusters[name], idx, keep)
			}()
		}
		wg.Wait()
		release()
		pending = frozen
		if len(pending) == 0 {
			break
		}
		if heldSince.IsZero() {
			if b.frozen.held.Add(1) > int64(b.cfg.FrozenMaxHeld) {
				b.frozen.held.Add(-1)
				b.frozen.overflow.Add(1)
				for _, i := range pending {
					errs[i] = fmt.Errorf("%w: vshard %d is frozen for resharding and %d requests are held already", ErrUnavailable, vs[i], b.cfg.FrozenMaxHeld)
				}
				return errs
			}
			b.frozen.heldTotal.Add(1)
			heldSince = time.Now()
			deadline = heldSince.Add(b.cfg.FrozenWait)
		}
		timer := time.NewTimer(time.Until(deadline))
		select {
		case <-changed:
			timer.Stop()
			continue
		case <-ctx.Done():
			timer.Stop()
			for _, i := range pending {
				errs[i] = ctx.Err()
			}
		case <-timer.C:
			b.frozen.timedOut.Add(1)
			for _, i := range pending {
				errs[i] = fmt.Errorf("%w: vshard %d is frozen for resharding", ErrUnavailable, vs[i])
			}
		}
		break
	}
	return errs
}

// ApplyMap switches the router to shard map next (false when it is not
// newer than the one in use). Leases held in owners' memory on a vshard
// that next freezes, or gives to another cluster, are first written to
// the table as durable leases, so that a resharding cut-over copies them
// with their rows: a consumer holding one keeps it across the move.
// The switch holds a pin of the map it replaces until they are written
// (and until every operation routed with that map is done), so the
// resharding barrier does not pass before.
func (b *Broker) ApplyMap(ctx context.Context, next *routing.Map) bool {
	old, release := b.pin()
	if !b.table.Store(next) {
		release()
		return false
	}
	moving := map[string]map[uint16]bool{}
	for v := 0; v < shard.Count; v++ {
		was, wasState := old.Lookup(shard.ID(v))
		now, state := next.Lookup(shard.ID(v))
		if (state == routing.Frozen && wasState != routing.Frozen) || now != was {
			if moving[was] == nil {
				moving[was] = map[uint16]bool{}
			}
			moving[was][uint16(v)] = true
		}
	}
	if len(moving) == 0 {
		release()
		return true
	}
	go func() {
		defer release()
		// Claims and flushes routed with the old map may still add or end
		// leases on those vshards: wait for them (ours is the last pin).
		b.awaitOnlyPin(ctx, old.Version())
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		for cluster, vs := range moving {
			if err := b.owners.WriteOut(wctx, cluster, func(v uint16) bool { return vs[v] }); err != nil {
				b.log.Error("leases in memory on moving vshards not written to the table; the cut-over waits for their owner's horizon",
					"cluster", cluster, "vshards", len(vs), "err", err)
			}
		}
	}()
	return true
}

// awaitOnlyPin waits until the caller's pin is the only one left on
// version v (bounded: an operation never outlives its own timeouts).
func (b *Broker) awaitOnlyPin(ctx context.Context, v int64) {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		b.pins.mu.Lock()
		n := b.pins.n[v]
		b.pins.mu.Unlock()
		if n <= 1 {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// errSelfFenced answers every write while the router self-fences.
var errSelfFenced = fmt.Errorf("%w: this router lost its registration among the live routers; it writes again once registered with the current shard map", ErrUnavailable)

// SetSelfFenced makes the router refuse (unavailable) every write and
// claim while fenced is true: its registration among the live routers
// lapsed, so a resharding barrier may pass without it (docs/consul.md,
// "Self-fencing"). Reads go on. Meanwhile the router steps aside from
// delivery state (delivery.Manager.SetAside): the units it owns pass to
// the other routers, which serve their consumers through the cut.
func (b *Broker) SetSelfFenced(fenced bool) {
	b.selfFenced.Store(fenced)
	b.owners.SetAside(fenced)
}

// SelfFenced reports SetSelfFenced's state.
func (b *Broker) SelfFenced() bool { return b.selfFenced.Load() }
