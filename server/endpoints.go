package server

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/shardmq/shardmq/broker"
	"github.com/shardmq/shardmq/circuit"
	"github.com/shardmq/shardmq/cluster"
	"github.com/shardmq/shardmq/replica"
	"github.com/shardmq/shardmq/store"
	"github.com/shardmq/shardmq/topology"
)

// endpoints are the router's MySQL endpoints as the call points that reach
// them: each cluster's primary in use (a cluster.Primary, the broker's call
// point), one breaker per endpoint, and the replica monitor that measures
// lag and picks replicas for reads. It is built from the HA configuration
// alone and given the pools it guards; it knows nothing of the router.
type endpoints struct {
	cfg      HAConfig
	log      *slog.Logger
	now      func() time.Time
	breakers *circuit.Set
	monitor  *replica.Monitor // a background service (Start/Stop)

	mu   sync.Mutex
	prim map[string]*primaryEndpoint // cluster → its primary in use
}

// primaryEndpoint is a cluster's primary in use.
type primaryEndpoint struct {
	cluster  string
	dsn      string
	endpoint string
	store    *store.Store
	guard    *cluster.Primary
	conn     *cluster.Cluster // guard with its group commits: what the broker uses
}

// The monitor writes heartbeats on a primary's store through the
// primary's call point.
var (
	_ replica.Primary    = circuit.Endpoint[replica.Heartbeats]{}
	_ replica.Heartbeats = (*store.Store)(nil)
)

// newEndpoints returns the endpoints of cfg (defaults filled).
func newEndpoints(cfg HAConfig) *endpoints {
	return &endpoints{cfg: cfg, log: cfg.Replicas.Log, now: cfg.Replicas.Now, breakers: circuit.NewSet(cfg.Breakers),
		monitor: replica.New(cfg.Replicas), prim: map[string]*primaryEndpoint{}}
}

// primaryCluster returns the broker's view of a cluster: its primary's
// breaker-guarded endpoint, observed by observe, with the group commits
// tuned by cfg. A changed primary gets a new one and the old endpoint
// hands over to it (cluster.Primary.Retire).
func (e *endpoints) primaryCluster(name, dsn string, st *store.Store, observe cluster.Observer, cfg cluster.Config) broker.Cluster {
	e.mu.Lock()
	defer e.mu.Unlock()
	if p, ok := e.prim[name]; ok && p.dsn == dsn && p.store == st {
		return p.conn
	}
	ep := replica.Addr(dsn)
	guard := cluster.NewPrimary(st, e.breakers.For(ep))
	p := &primaryEndpoint{cluster: name, dsn: dsn, endpoint: ep, store: st, guard: guard,
		conn: cluster.New(name, cluster.Observe(guard, observe), cfg)}
	if old, ok := e.prim[name]; ok {
		old.guard.Retire(p.guard)
		e.log.Info("cluster primary switched", "cluster", name, "from", old.endpoint, "to", ep)
	}
	e.prim[name] = p
	return p.conn
}

// checkWritable makes sure a primary accepts writes before the router
// switches to it: it writes this router's heartbeat there.
func (e *endpoints) checkWritable(ctx context.Context, cluster string, st *store.Store) error {
	ctx, cancel := context.WithTimeout(ctx, e.cfg.WritableTimeout)
	defer cancel()
	if err := st.WriteHeartbeat(ctx, e.monitor.Config().Router, e.now()); err != nil {
		return fmt.Errorf("cluster %s primary is not writable: %w", cluster, err)
	}
	return nil
}

// applied follows a topology now in use: the monitor watches its replicas,
// breakers of endpoints that left are dropped, clusters that left retire.
func (e *endpoints) applied(top *topology.Topology) {
	e.mu.Lock()
	var watch []replica.Cluster
	keep := map[string]bool{}
	for name, p := range e.prim {
		c, ok := top.Clusters[name]
		if !ok {
			p.guard.Retire(nil)
			delete(e.prim, name)
			continue
		}
		keep[p.endpoint] = true
		for _, dsn := range c.Replicas {
			keep[replica.Addr(dsn)] = true
		}
		// The monitor's heartbeats go through the primary's breaker.
		primary := circuit.Endpoint[replica.Heartbeats]{S: p.store, Breaker: p.guard.Breaker()}
		watch = append(watch, replica.Cluster{Name: name, Primary: primary, Replicas: append([]string(nil), c.Replicas...)})
	}
	e.mu.Unlock()
	e.breakers.Retain(keep)
	e.monitor.Update(watch)
}

func (e *endpoints) primary(cluster string) (*primaryEndpoint, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	p, ok := e.prim[cluster]
	return p, ok
}

// primaries is a snapshot of the primaries in use, by cluster.
func (e *endpoints) primaries() map[string]*primaryEndpoint {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make(map[string]*primaryEndpoint, len(e.prim))
	for n, p := range e.prim {
		out[n] = p
	}
	return out
}
