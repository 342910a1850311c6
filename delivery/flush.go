package delivery

import (
	"context"
	"time"

	"github.com/shardmq/shardmq/store"
)

// flushItem is one request's (or one expiry tick's) outcomes of one unit,
// queued for its cluster's next flush.
type flushItem struct {
	owner *Owner
	// fence is the shard map the item's outcomes were decided with (see
	// Config.MapVersion).
	fence  store.Fence
	acks   []store.OwnedAck
	nacks  []store.OwnedNack
	leases []store.OwnedLease
	parks  []store.OwnedPark
}

// fenced returns item with its fence: ctx's (the request's), else the
// map in use.
func (o *Owner) fenced(ctx context.Context, item flushItem) flushItem {
	if f, ok := store.FenceFrom(ctx); ok {
		item.fence = f
	} else if o.m.cfg.MapVersion != nil {
		item.fence = store.Fence{MapVersion: o.m.cfg.MapVersion()}
	}
	return item
}

// leavesReady says the item's outcomes leave deliveries claimable in the
// table (leases written out, retries), not only deleted or dead ones.
func (it flushItem) leavesReady() bool {
	if len(it.leases) > 0 {
		return true
	}
	for _, n := range it.nacks {
		if !n.Dead {
			return true
		}
	}
	return false
}

func (it flushItem) ops() int { return len(it.acks) + len(it.nacks) + len(it.leases) + len(it.parks) }

// flushTimeout bounds one flush; its callers wait for it whatever their
// own deadlines (it may commit).
const flushTimeout = 10 * time.Second

// runFlush writes a batch of items, of any units of the cluster, in one
// transaction (store.FlushOwned): each unit's items merged into one share,
// each item answered with its slice of its unit's outcome.
func (cl *clusterState) runFlush(ctx context.Context, items []flushItem) []flushAnswer {
	type span struct{ share, acks, nacks, leases int }
	at := map[*Owner]int{}
	var batch []store.OwnedFlush
	spans := make([]span, len(items))
	for i, it := range items {
		f, ok := at[it.owner]
		if !ok {
			f = len(batch)
			at[it.owner] = f
			batch = append(batch, store.OwnedFlush{Unit: it.owner.storeUnit()})
		}
		b := &batch[f]
		spans[i] = span{f, len(b.Acks), len(b.Nacks), len(b.Leases)}
		b.Acks = append(b.Acks, it.acks...)
		b.Nacks = append(b.Nacks, it.nacks...)
		b.Leases = append(b.Leases, it.leases...)
		b.Park = append(b.Park, it.parks...)
	}
	for _, it := range items {
		ctx = store.WithFence(ctx, it.fence) // the oldest wins
	}
	ctx, cancel := context.WithTimeout(ctx, flushTimeout)
	defer cancel()
	var res []store.OwnedResult
	err := cl.conn.Do(ctx, OpFlush, func(ctx context.Context, s Store) (err error) {
		res, err = s.FlushOwned(ctx, batch, cl.m.now().UTC())
		return err
	})
	if err == nil {
		var done []uint64 // acked or dead: no claim needs their bodies again
		for _, it := range items {
			for _, a := range it.acks {
				done = append(done, a.MessageID)
			}
			for _, n := range it.nacks {
				if n.Dead {
					done = append(done, n.MessageID)
				}
			}
		}
		cl.m.cfg.Bodies.forget(done)
	}
	out := make([]flushAnswer, len(items))
	for i, it := range items {
		if err != nil {
			out[i].err = err
			continue
		}
		sp := spans[i]
		r := res[sp.share]
		if r.Stale {
			out[i].stale = true
			continue
		}
		out[i].res = store.OwnedResult{
			Acks:   r.Acks[sp.acks : sp.acks+len(it.acks)],
			Nacks:  r.Nacks[sp.nacks : sp.nacks+len(it.nacks)],
			Leases: r.Leases[sp.leases : sp.leases+len(it.leases)],
		}
	}
	return out
}
