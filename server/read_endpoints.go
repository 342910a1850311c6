package server

import (
	"context"
	"time"

	"github.com/shardmq/shardmq/circuit"
	"github.com/shardmq/shardmq/lookup"
	"github.com/shardmq/shardmq/reconcile"
	"github.com/shardmq/shardmq/replica"
	"github.com/shardmq/shardmq/store"
	"github.com/shardmq/shardmq/subscription"
)

// Where trace lookups and reconciliation read: each read goes through the
// call point of the endpoint it reads (circuit.Endpoint: its breaker and
// time bound), replicas included.

// lookupEndpoints implements lookup.Endpoints.
type lookupEndpoints struct{ e *endpoints }

func (l lookupEndpoints) Primary(cluster string) (lookup.Target, bool) {
	p, ok := l.e.primary(cluster)
	if !ok {
		return lookup.Target{}, false
	}
	return lookup.Target{Conn: circuit.Endpoint[lookup.Reader]{S: p.Store, Breaker: p.Primary.Breaker()}, Endpoint: p.Endpoint}, true
}

func (l lookupEndpoints) Replica(cluster string) (lookup.Target, bool) {
	return l.target(l.e.monitor.Pick(cluster))
}

func (l lookupEndpoints) AnyReplica(cluster string) (lookup.Target, bool) {
	return l.target(l.e.monitor.Best(cluster))
}

func (l lookupEndpoints) target(rep replica.Replica, ok bool) (lookup.Target, bool) {
	if !ok {
		return lookup.Target{}, false
	}
	// A replica read falls back to the primary when it fails, so a hung
	// replica must cost little: its reads are bounded by
	// ReplicaReadTimeout, and their timeouts open its breaker all the same.
	return lookup.Target{Conn: circuit.Endpoint[lookup.Reader]{S: rep.Store, Breaker: l.e.breakers.For(rep.Endpoint), Timeout: l.e.cfg.ReplicaReadTimeout},
		Endpoint: rep.Endpoint, Lag: max(rep.Lag, 0)}, true
}

// reconcileEndpoints implements reconcile.Endpoints.
type reconcileEndpoints struct{ e *endpoints }

func (r reconcileEndpoints) Scan(cluster string) (reconcile.ScanConn, string, string, bool) {
	if rep, ok := r.e.monitor.Pick(cluster); ok {
		return circuit.Endpoint[reconcile.Scanner]{S: rep.Store, Breaker: r.e.breakers.For(rep.Endpoint)}, lookup.FromReplica, rep.Endpoint, true
	}
	p, ok := r.e.primary(cluster)
	if !ok {
		return nil, "", "", false
	}
	return circuit.Endpoint[reconcile.Scanner]{S: p.Store, Breaker: p.Primary.Breaker()}, lookup.FromPrimary, p.Endpoint, true
}

func (r reconcileEndpoints) Primary(cluster string) (reconcile.RepairConn, bool) {
	p, ok := r.e.primary(cluster)
	if !ok {
		return nil, false
	}
	return circuit.Endpoint[reconcile.Repairer]{S: p.Store, Breaker: p.Primary.Breaker()}, true
}

// subscriptionsAt answers reconciliation's question "which subscriptions
// did a message of topic produced at this time get": those created at or
// before it (to the millisecond: message times are milliseconds); a topic
// with none stored has its implicit default one.
func subscriptionsAt(subs *subscription.Registry) store.SubscriptionsAt {
	return func(_ context.Context, topic string, at time.Time) ([]string, error) {
		list := subs.List(topic)
		if len(list) == 0 {
			return []string{subscription.Default}, nil
		}
		var out []string
		for _, s := range list {
			if !s.CreatedAt.Truncate(time.Millisecond).After(at) {
				out = append(out, s.Name)
			}
		}
		return out, nil
	}
}
