package broker

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shardmq/shardmq/internal/reqid"
	"github.com/shardmq/shardmq/store"
)

// Ack coalescing, the consume side's group commit. The acks that reach
// one cluster while its previous ack transaction runs wait and then go
// together, as one transaction (store.AckMany: each statement multi-row, one
// commit), instead of one transaction each: a commit costs the servers
// far more than the rows it carries (docs/performance.md). An ack alone
// on an idle cluster starts at once; nothing lingers.

// maxAckBatch caps the leases one coalesced ack transaction carries.
const maxAckBatch = 1000

// ackTimeout bounds one coalesced ack transaction (its callers wait for
// it whatever their own deadlines: the ack may commit).
const ackTimeout = 10 * time.Second

type ackCall struct {
	group store.AckGroup
	fence store.Fence // the map the ack was routed with
	now   time.Time
	done  chan store.AckResult // buffered 1
}

// acker queues one cluster's acks; a worker goroutine runs while any are
// queued and exits when none is, so an idle cluster holds no goroutine.
type acker struct {
	conn Cluster

	mu      sync.Mutex
	queue   []*ackCall
	running bool

	transactions, leases atomic.Int64 // what ran (tests, stats)
}

func newAcker(conn Cluster) *acker { return &acker{conn: conn} }

// ack queues leases and waits for their statuses.
func (a *acker) ack(ctx context.Context, leases []store.Lease, now time.Time) ([]store.LeaseStatus, error) {
	f, _ := store.FenceFrom(ctx)
	call := &ackCall{group: store.AckGroup{Leases: leases, RequestID: reqid.From(ctx)}, fence: f, now: now, done: make(chan store.AckResult, 1)}
	a.mu.Lock()
	a.queue = append(a.queue, call)
	if !a.running {
		a.running = true
		go a.work()
	}
	a.mu.Unlock()
	r := <-call.done
	return r.Statuses, r.Err
}

// work runs coalesced transactions until the queue is empty.
func (a *acker) work() {
	for {
		a.mu.Lock()
		if len(a.queue) == 0 {
			a.running = false
			a.mu.Unlock()
			return
		}
		// One transaction carries acks routed with one map: a stale one
		// refused by the fence fails none of the others.
		n, take := 0, 0
		for take < len(a.queue) && (take == 0 || n+len(a.queue[take].group.Leases) <= maxAckBatch && a.queue[take].fence == a.queue[0].fence) {
			n += len(a.queue[take].group.Leases)
			take++
		}
		batch := a.queue[:take:take]
		a.queue = a.queue[take:]
		a.mu.Unlock()
		a.run(batch)
	}
}

func (a *acker) run(batch []*ackCall) {
	groups := make([]store.AckGroup, len(batch))
	n := 0
	for i, c := range batch {
		groups[i] = c.group
		n += len(c.group.Leases)
	}
	ctx, cancel := context.WithTimeout(store.WithFence(reqid.With(context.Background(), groups[0].RequestID), batch[0].fence), ackTimeout)
	defer cancel()
	var res []store.AckResult
	err := a.conn.Do(ctx, OpAck, func(ctx context.Context, s Store) error {
		res = s.AckMany(ctx, groups, batch[0].now)
		for _, r := range res {
			if r.Err != nil {
				return r.Err // the call point (breaker, metrics) sees the batch's failure
			}
		}
		return nil
	})
	if res == nil {
		res = make([]store.AckResult, len(groups))
		for i := range res {
			res[i].Err = err
		}
	}
	a.transactions.Add(1)
	a.leases.Add(int64(n))
	for i, c := range batch {
		c.done <- res[i]
	}
}
