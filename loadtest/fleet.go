package loadtest

import (
	"context"
	"fmt"
	"hash/fnv"
	"sync"
	"sync/atomic"
)

// Routing modes of a Fleet: how requests are spread over its routers.
const (
	// RouteRoundRobin sends each request to the next router in turn, so a
	// message is often produced through one router, claimed through
	// another and acked through a third: every cross-router guarantee
	// (dedup, leases, subscriptions) is exercised all the time.
	RouteRoundRobin = "rr"
	// RouteByKey sends each message to the router its key hashes to (a
	// produce batch is split), as a client pinning keys to routers would;
	// claims and acks still go round robin.
	RouteByKey = "key"
)

// Fleet is several routers over the same clusters as one Target. Every
// router must serve the same topology: a message produced through any of
// them can be claimed through any other, and a receipt from one is acked
// through another.
type Fleet struct {
	routers []*Router
	mode    string
	next    atomic.Uint64
}

var _ Target = (*Fleet)(nil)

// NewFleet spreads requests over routers as mode says (RouteRoundRobin
// when empty).
func NewFleet(routers []*Router, mode string) (*Fleet, error) {
	if len(routers) == 0 {
		return nil, fmt.Errorf("fleet: no routers")
	}
	switch mode {
	case "":
		mode = RouteRoundRobin
	case RouteRoundRobin, RouteByKey:
	default:
		return nil, fmt.Errorf("fleet: routing %q is not %s or %s", mode, RouteRoundRobin, RouteByKey)
	}
	return &Fleet{routers: routers, mode: mode}, nil
}

// Name implements Target: a fleet is measured as "the router".
func (f *Fleet) Name() string { return "router" }

// Len is the number of routers.
func (f *Fleet) Len() int { return len(f.routers) }

func (f *Fleet) pick() *Router {
	return f.routers[(f.next.Add(1)-1)%uint64(len(f.routers))]
}

func (f *Fleet) byKey(key string) int {
	h := fnv.New32a()
	h.Write([]byte(key))
	return int(h.Sum32() % uint32(len(f.routers)))
}

// Produce implements Target. By key, the batch is split per router and
// the parts sent at once; the answers come back in the batch's order. A
// part that fails fails the whole batch (its outcome is unknown, and the
// caller resends every item with the same key, which dedup answers).
func (f *Fleet) Produce(ctx context.Context, topic string, msgs []Message) ([]ProduceResult, error) {
	if f.mode != RouteByKey || len(f.routers) == 1 {
		return f.pick().Produce(ctx, topic, msgs)
	}
	parts := make([][]int, len(f.routers))
	for i, m := range msgs {
		r := f.byKey(m.Key)
		parts[r] = append(parts[r], i)
	}
	out := make([]ProduceResult, len(msgs))
	errs := make([]error, len(f.routers))
	var wg sync.WaitGroup
	for r, idx := range parts {
		if len(idx) == 0 {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			part := make([]Message, len(idx))
			for j, i := range idx {
				part[j] = msgs[i]
			}
			res, err := f.routers[r].Produce(ctx, topic, part)
			if err != nil {
				errs[r] = err
				return
			}
			for j, i := range idx {
				out[i] = res[j]
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// Claim implements Target.
func (f *Fleet) Claim(ctx context.Context, req ClaimRequest) ([]Delivery, error) {
	return f.pick().Claim(ctx, req)
}

// Ack implements Target: through the next router, rarely the one that
// leased the deliveries.
func (f *Fleet) Ack(ctx context.Context, receipts []Receipt) ([]string, error) {
	return f.pick().Ack(ctx, receipts)
}

// Nack implements Target.
func (f *Fleet) Nack(ctx context.Context, items []NackItem) ([]string, error) {
	return f.pick().Nack(ctx, items)
}

// Subscribe implements Target through the first router only: the others
// must pick the subscriptions up (a produce to a topic they know no
// subscription of refreshes their view first).
func (f *Fleet) Subscribe(ctx context.Context, topic string, subs []string, maxAttempts int) error {
	return f.routers[0].Subscribe(ctx, topic, subs, maxAttempts)
}

// Ready waits until every router is ready.
func (f *Fleet) Ready(ctx context.Context) error {
	for _, r := range f.routers {
		if err := r.Ready(ctx); err != nil {
			return err
		}
	}
	return nil
}

// Close closes every router's connections.
func (f *Fleet) Close() {
	for _, r := range f.routers {
		r.Close()
	}
}
