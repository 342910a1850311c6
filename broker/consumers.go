package broker

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"
)

// Consumer is one consumer of a subscription as the operators see it: the
// name it gave its claims, how many deliveries it holds leased now, and
// when it took the oldest of those leases.
type Consumer struct {
	Consumer      string // "" for claims that gave no consumer name
	InFlight      int64
	OldestLeaseAt time.Time
}

// maxConsumers bounds the consumers one answer lists (per cluster, then
// merged).
const maxConsumers = 1000

// Consumers lists who holds a subscription's leases now, summed over every
// cluster — the durable leases in the table and the first attempts held
// in this router's owners' memory (docs/consume.md, "Owners") — most
// deliveries in flight first; missing names the clusters that did not
// answer (their durable leases are not counted).
func (b *Broker) Consumers(ctx context.Context, topic, sub string) (list []Consumer, missing []string, err error) {
	if _, err := b.GetSubscription(ctx, topic, sub); err != nil {
		return nil, nil, err
	}
	var mu sync.Mutex
	by := map[string]*Consumer{}
	missing, err = b.eachClusterMissing(ctx, func(ctx context.Context, name string, sh Cluster) error {
		hs, err := sh.LeaseHolders(ctx, topic, sub, b.now().UTC(), maxConsumers)
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		for _, h := range hs {
			c := by[h.Consumer]
			if c == nil {
				c = &Consumer{Consumer: h.Consumer}
				by[h.Consumer] = c
			}
			c.InFlight += h.InFlight
			if !h.OldestLeaseAt.IsZero() && (c.OldestLeaseAt.IsZero() || h.OldestLeaseAt.Before(c.OldestLeaseAt)) {
				c.OldestLeaseAt = h.OldestLeaseAt
			}
		}
		return nil
	})
	if err != nil && len(missing) == len(b.table.Load().Clusters()) {
		return nil, missing, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	for _, o := range b.owners.Owners("") {
		if u := o.Unit(); u.Topic != topic || u.Subscription != sub {
			continue
		}
		for _, h := range o.Holders() {
			c := by[h.Consumer]
			if c == nil {
				c = &Consumer{Consumer: h.Consumer}
				by[h.Consumer] = c
			}
			c.InFlight += int64(h.InFlight)
			if c.OldestLeaseAt.IsZero() || h.OldestClaimAt.Before(c.OldestLeaseAt) {
				c.OldestLeaseAt = h.OldestClaimAt
			}
		}
	}
	list = make([]Consumer, 0, len(by))
	for _, c := range by {
		list = append(list, *c)
	}
	sort.Slice(list, func(i, j int) bool {
		if list[i].InFlight != list[j].InFlight {
			return list[i].InFlight > list[j].InFlight
		}
		return list[i].Consumer < list[j].Consumer
	})
	return list[:min(len(list), maxConsumers)], missing, nil
}
