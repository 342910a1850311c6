package server

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/shardmq/shardmq/circuit"
	"github.com/shardmq/shardmq/cluster"
	"github.com/shardmq/shardmq/replica"
	"github.com/shardmq/shardmq/store"
	"github.com/shardmq/shardmq/topology"
)

// endpoints are the router's MySQL endpoints as the call points that reach
// them: one breaker per endpoint, the clusters' primaries in use (set, a
// cluster.Set whose call points take their breakers from here) and the
// replica monitor that measures lag and picks replicas for reads. It is
// built from the HA configuration alone and given the primaries it
// watches; it knows nothing of the router.
type endpoints struct {
	cfg      HAConfig
	log      *slog.Logger
	now      func() time.Time
	breakers *circuit.Set
	monitor  *replica.Monitor // a background service (Start/Stop)
	set      *cluster.Set     // the primaries in use
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
		monitor: replica.New(cfg.Replicas)}
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
	e.set.Retain()
	var watch []replica.Cluster
	keep := map[string]bool{}
	for name, p := range e.set.Conns() {
		c, ok := top.Clusters[name]
		if !ok {
			continue
		}
		keep[p.Endpoint] = true
		for _, dsn := range c.Replicas {
			keep[replica.Addr(dsn)] = true
		}
		// The monitor's heartbeats go through the primary's breaker.
		primary := circuit.Endpoint[replica.Heartbeats]{S: p.Store, Breaker: p.Primary.Breaker()}
		watch = append(watch, replica.Cluster{Name: name, Primary: primary, Replicas: append([]string(nil), c.Replicas...)})
	}
	e.breakers.Retain(keep)
	e.monitor.Update(watch)
}

func (e *endpoints) primary(cluster string) (*cluster.Conn, bool) { return e.set.Conn(cluster) }

// primaries is a snapshot of the primaries in use, by cluster.
func (e *endpoints) primaries() map[string]*cluster.Conn { return e.set.Conns() }
