package broker

import (
	"context"
	"sort"
	"sync"
	"time"

	"github.com/shardmq/shardmq/routing"
	"github.com/shardmq/shardmq/store"
)

// ShardMap is the shard map in use.
func (b *Broker) ShardMap() *routing.Map { return b.table.Load() }

// Stats is the queue depth of every subscription summed over clusters,
// with the clusters that did not answer named rather than left out
// silently.
type Stats struct {
	Subscriptions []store.QueueStats
	Missing       []string
	// Took is how long each cluster's count took, where it ran.
	Took map[string]time.Duration
	// OnReplica are the clusters counted on a replica (StatsVia).
	OnReplica []string
}

// statsTimeout bounds each cluster's answer.
const statsTimeout = 5 * time.Second

// CountReader counts one cluster's deliveries somewhere other than its
// primary; ok false (none fit, or it failed) counts on the primary.
type CountReader func(ctx context.Context, cluster string, now time.Time) (st []store.QueueStats, ok bool)

// Stats counts deliveries by state on every cluster's primary at once and
// sums them per subscription.
func (b *Broker) Stats(ctx context.Context) Stats { return b.StatsVia(ctx, nil) }

// StatsVia is Stats with each cluster counted by read where it can, else
// on its primary. A count reads the whole of message_queue (about 2 s of
// a server's CPU for 700,000 deliveries on the test machine); the
// periodic queue-health count of a large backlog reads a replica with it,
// so that the primary every write of the cluster waits for does not pay.
// What it costs: the counts lag the primary by the replica's lag, within
// the replicas' read limit.
func (b *Broker) StatsVia(ctx context.Context, read CountReader) Stats {
	var mu sync.Mutex
	sum := map[[2]string]*store.QueueStats{}
	out := Stats{Took: map[string]time.Duration{}}
	out.Missing, _ = b.eachClusterMissing(ctx, func(ctx context.Context, name string, sh Cluster) error {
		now := b.now().UTC()
		start := time.Now()
		var st []store.QueueStats
		onReplica := false
		if read != nil {
			st, onReplica = read(ctx, name, now)
		}
		if !onReplica {
			start = time.Now() // the primary's own time, not a failed read's
			cctx, cancel := context.WithTimeout(ctx, statsTimeout)
			defer cancel()
			var err error
			if st, err = sh.Stats(cctx, now); err != nil {
				return err
			}
		}
		mu.Lock()
		defer mu.Unlock()
		out.Took[name] = time.Since(start)
		if onReplica {
			out.OnReplica = append(out.OnReplica, name)
		}
		for _, s := range st {
			k := [2]string{s.Topic, s.Subscription}
			t := sum[k]
			if t == nil {
				t = &store.QueueStats{Topic: s.Topic, Subscription: s.Subscription}
				sum[k] = t
			}
			t.Ready += s.Ready
			t.Delayed += s.Delayed
			t.InFlight += s.InFlight
			t.Parked += s.Parked
			t.Dead += s.Dead
			if s.OldestReady != 0 && (t.OldestReady == 0 || s.OldestReady < t.OldestReady) {
				t.OldestReady = s.OldestReady
			}
		}
		return nil
	})
	// Leases held in this router's memory are ready rows to the table:
	// they are in flight.
	for _, o := range b.owners.Owners("") {
		u := o.Unit()
		t := sum[[2]string{u.Topic, u.Subscription}]
		if t == nil {
			continue
		}
		n := int64(o.InFlight())
		n = min(n, t.Ready)
		t.Ready -= n
		t.InFlight += n
	}
	// Subscriptions without deliveries are listed too, at zero.
	for _, s := range b.subs.List("") {
		k := [2]string{s.Topic, s.Name}
		if sum[k] == nil {
			sum[k] = &store.QueueStats{Topic: s.Topic, Subscription: s.Name}
		}
	}
	for _, s := range sum {
		out.Subscriptions = append(out.Subscriptions, *s)
	}
	sort.Slice(out.Subscriptions, func(i, j int) bool {
		a, c := out.Subscriptions[i], out.Subscriptions[j]
		if a.Topic != c.Topic {
			return a.Topic < c.Topic
		}
		return a.Subscription < c.Subscription
	})
	sort.Strings(out.OnReplica)
	return out
}
