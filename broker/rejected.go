package broker

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shardmq/shardmq/internal/idgen"
	"github.com/shardmq/shardmq/routing"
	"github.com/shardmq/shardmq/shard"
	"github.com/shardmq/shardmq/store"
)

// rejectedTrace writes the duplicate and conflict events of the produce
// attempts that the recent-keys cache answered without asking the
// database. The answer does not wait for the event: the events are queued
// (a bounded queue; an attempt that finds it full is counted as dropped
// instead of traced) and written in batches, one statement per cluster,
// shortly after. An attempt the database decided is traced in its own
// transaction instead (store.Produce). An event that cannot be written
// (its cluster down, its vshard frozen for resharding longer than a few
// flushes, the router stopping without reaching the database) is counted
// as dropped: the metric says how complete the trace of rejected attempts
// is.
type rejectedTrace struct {
	b       *Broker
	queue   chan store.Event
	quit    chan struct{}
	done    chan struct{}
	once    sync.Once
	written atomic.Int64
	dropped atomic.Int64
}

const (
	// rejectedQueue bounds the events waiting to be written.
	rejectedQueue = 10000
	// rejectedBatch bounds the events of one flush.
	rejectedBatch = 1000
	// rejectedLinger is how long a flush waits after its first event to
	// gather more: a retry storm costs one statement per cluster per
	// linger, not one per attempt.
	rejectedLinger = 50 * time.Millisecond
	// rejectedTimeout bounds one cluster's write.
	rejectedTimeout = 5 * time.Second
	// rejectedFrozenRounds is how many flushes an event of a frozen vshard
	// is kept for before it is dropped.
	rejectedFrozenRounds = 40
)

func newRejectedTrace(b *Broker) *rejectedTrace {
	t := &rejectedTrace{b: b, queue: make(chan store.Event, rejectedQueue), quit: make(chan struct{}), done: make(chan struct{})}
	go t.run()
	return t
}

// add queues the event of an attempt with id answered status from the
// cache entry rk; it never blocks.
func (t *rejectedTrace) add(id uint64, status store.ProduceStatus, rk recentKey, hash []byte) {
	it := store.ProduceItem{Msg: &store.Message{ID: id, CreatedAt: idgen.Time(id)}, Hash: hash}
	ev := store.RejectedEvent(it, status, rk.id, rk.vshard)
	select {
	case t.queue <- ev:
	default:
		t.dropped.Add(1)
	}
}

// Stop writes what is queued (bounded by rejectedTimeout per cluster) and
// ends the writer. Safe to call twice.
func (t *rejectedTrace) Stop() {
	t.once.Do(func() { close(t.quit) })
	<-t.done
}

func (t *rejectedTrace) run() {
	defer close(t.done)
	held := map[uint64]int{} // event id → flushes it waited on a frozen vshard
	var carry []store.Event
	for {
		var first store.Event
		select {
		case first = <-t.queue:
		case <-t.quit:
			t.drain(carry)
			return
		}
		batch := append(carry, first)
		carry = nil
		linger := time.NewTimer(rejectedLinger)
	gather:
		for len(batch) < rejectedBatch {
			select {
			case ev := <-t.queue:
				batch = append(batch, ev)
			case <-linger.C:
				break gather
			case <-t.quit:
				break gather
			}
		}
		linger.Stop()
		carry = t.flush(batch, held)
	}
}

// drain writes the queue's last events on shutdown; frozen ones are dropped.
func (t *rejectedTrace) drain(batch []store.Event) {
collect:
	for {
		select {
		case ev := <-t.queue:
			batch = append(batch, ev)
		default:
			break collect
		}
	}
	for len(batch) > 0 {
		n := min(len(batch), rejectedBatch)
		left := t.flush(batch[:n], map[uint64]int{})
		t.dropped.Add(int64(len(left)))
		batch = batch[n:]
	}
}

// flush writes batch, one statement per cluster, concurrently. It returns
// the events of frozen vshards to try again on the next flush.
func (t *rejectedTrace) flush(batch []store.Event, held map[uint64]int) []store.Event {
	// Pinned like every write, so the resharding barrier waits for these
	// events before the final sync of their vshards.
	table, release := t.b.pin()
	defer release()
	clusters := *t.b.clusters.Load()
	byCluster := map[string][]store.Event{}
	var again []store.Event
	for _, ev := range batch {
		name, state := table.Lookup(shard.ID(ev.VShard))
		if state != routing.Serving {
			if held[ev.ID]++; held[ev.ID] <= rejectedFrozenRounds {
				again = append(again, ev)
				continue
			}
			delete(held, ev.ID)
			t.dropped.Add(1)
			continue
		}
		delete(held, ev.ID)
		byCluster[name] = append(byCluster[name], ev)
	}
	var wg sync.WaitGroup
	for name, evs := range byCluster {
		cs, ok := clusters[name]
		if !ok {
			t.dropped.Add(int64(len(evs)))
			continue
		}
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(store.WithFence(context.Background(), store.Fence{MapVersion: table.Version()}), rejectedTimeout)
			defer cancel()
			err := cs.conn.AppendEvents(ctx, evs)
			if err != nil {
				t.dropped.Add(int64(len(evs)))
				t.b.log.Warn("trace of produce attempts answered from the recent-keys cache not written", "cluster", name,
					"events", len(evs), "err", err)
				return
			}
			t.written.Add(int64(len(evs)))
		})
	}
	wg.Wait()
	return again
}

// RejectedTraceStats counts the duplicate and conflict events of produce
// attempts answered from the recent-keys cache.
type RejectedTraceStats struct {
	Written int64 // written to the trace
	Dropped int64 // not written: queue full, cluster unavailable, vshard frozen too long
}

// RejectedTraceStats returns those counters (zero when the cache is off).
func (b *Broker) RejectedTraceStats() RejectedTraceStats {
	if b.rejected == nil {
		return RejectedTraceStats{}
	}
	return RejectedTraceStats{Written: b.rejected.written.Load(), Dropped: b.rejected.dropped.Load()}
}
