package cluster

import (
	"context"
	"time"

	"github.com/shardmq/shardmq/internal/batch"
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
}

// acker queues one cluster's acks: a batcher (internal/batch) whose runs
// are coalesced ack transactions, holding no goroutine while idle.
type acker struct {
	conn  Caller
	batch *batch.Batcher[*ackCall, store.AckResult]
}

func newAcker(conn Caller) *acker {
	a := &acker{conn: conn}
	a.batch = batch.New(batch.Config{MaxItems: maxAckBatch}, a.run, nil,
		batch.Count(func(c *ackCall) int { return len(c.group.Leases) }),
		// One transaction carries acks routed with one map: a stale one
		// refused by the fence fails none of the others.
		batch.Joins(func(first, next *ackCall) bool { return next.fence == first.fence }))
	return a
}

// ack queues leases and waits for their statuses, whatever becomes of ctx
// meanwhile: the ack may commit.
func (a *acker) ack(ctx context.Context, leases []store.Lease, now time.Time) ([]store.LeaseStatus, error) {
	f, _ := store.FenceFrom(ctx)
	call := &ackCall{group: store.AckGroup{Leases: leases, RequestID: reqid.From(ctx)}, fence: f, now: now}
	done, _ := a.batch.Enqueue(context.Background(), call) // never stopped, never full
	r := <-done
	return r.Statuses, r.Err
}

func (a *acker) run(_ context.Context, batch []*ackCall) []store.AckResult {
	groups := make([]store.AckGroup, len(batch))
	for i, c := range batch {
		groups[i] = c.group
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
	return res
}
