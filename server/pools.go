package server

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/shardmq/shardmq/rebalance"
	"github.com/shardmq/shardmq/replica"
	"github.com/shardmq/shardmq/store"
	"github.com/shardmq/shardmq/topology"
)

// pools are the router's connection pools, all of them owned here: each
// cluster's primary by cluster name — opened and migrated when a cluster
// first appears or its primary changes, checked before use, and closed
// when they are replaced (after the requests already routed to them are
// surely done) — and one pool per replica DSN (replicas, a
// replica.Pools), which the lag monitor, the replica reads and the
// replicated-durability waits share. Both follow the topology at the same
// step (update) and close with the router (close).
type pools struct {
	opts     func(cluster string) store.Options
	now      func() time.Time
	log      *slog.Logger
	replicas *replica.Pools
	archive  *archiveConn // the archive cluster's primary, connected on first use (retention.go)

	mu    sync.Mutex
	conns map[string]*clusterConn // by cluster name
}

type clusterConn struct {
	dsn   string
	store *store.Store
}

func newPools(opts func(cluster string) store.Options, replicas replica.PoolConfig, now func() time.Time, log *slog.Logger) *pools {
	return &pools{opts: opts, now: now, log: log, replicas: replica.NewPools(replicas), conns: map[string]*clusterConn{},
		archive: &archiveConn{opts: func() store.Options { return opts(topology.ArchiveName) }, now: now, log: log}}
}

// update opens pools for the clusters of top that are new or whose primary
// changed, migrates them and runs check on each (is it writable?), then
// swaps them in and retires the pools of primaries that left; the replica
// pools then follow top's replicas (those of replicas that left close).
// On an error nothing changes. It returns every primary's pool in use.
func (p *pools) update(ctx context.Context, top *topology.Topology, check func(ctx context.Context, cluster string, st *store.Store) error) (map[string]*store.Store, error) {
	p.mu.Lock()
	have := make(map[string]*clusterConn, len(p.conns))
	for k, v := range p.conns {
		have[k] = v
	}
	p.mu.Unlock()

	var mu sync.Mutex
	fresh := map[string]*clusterConn{}
	g, gctx := errgroup.WithContext(ctx)
	for name, c := range top.Clusters {
		if cc, ok := have[name]; ok && cc.dsn == c.Primary {
			continue
		}
		g.Go(func() error {
			st, err := store.Open(gctx, c.Primary, p.opts(name))
			if err != nil {
				return fmt.Errorf("cluster %s primary: %w", name, err)
			}
			if err := st.Migrate(gctx, p.now()); err != nil {
				st.Close()
				return fmt.Errorf("cluster %s primary: %w", name, err)
			}
			if err := check(gctx, name, st); err != nil {
				st.Close()
				return err
			}
			if warn, err := st.DurabilityWarnings(gctx); err == nil {
				for _, w := range warn {
					p.log.Warn("primary is not fully durable: acknowledged messages can be lost in a crash", "cluster", name, "setting", w)
				}
			}
			mu.Lock()
			fresh[name] = &clusterConn{dsn: c.Primary, store: st}
			mu.Unlock()
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		for _, cc := range fresh {
			cc.store.Close()
		}
		return nil, err
	}

	follow := make(map[string][]string, len(top.Clusters))
	for name, c := range top.Clusters {
		follow[name] = c.Replicas
	}
	p.replicas.Follow(follow)
	p.archive.follow(top)

	p.mu.Lock()
	defer p.mu.Unlock()
	var retired []*clusterConn
	for name, cc := range p.conns {
		if _, still := top.Clusters[name]; !still || fresh[name] != nil {
			retired = append(retired, cc)
			delete(p.conns, name)
		}
	}
	for name, cc := range fresh {
		p.conns[name] = cc
	}
	// Requests already routed to a retired pool finish on it; close it
	// once they are surely done.
	for _, cc := range retired {
		time.AfterFunc(30*time.Second, func() { cc.store.Close() })
	}
	return p.storesLocked(), nil
}

// Stores returns each cluster's primary store by cluster name.
func (p *pools) Stores() map[string]*store.Store {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.storesLocked()
}

func (p *pools) storesLocked() map[string]*store.Store {
	out := make(map[string]*store.Store, len(p.conns))
	for k, v := range p.conns {
		out[k] = v.store
	}
	return out
}

// dbs lists every primary's connection pool (the pool collector's view).
func (p *pools) dbs() map[string]*sql.DB {
	out := map[string]*sql.DB{}
	for name, st := range p.Stores() {
		out[name] = st.DB()
	}
	return out
}

// movers are the clusters' primaries as the resharding jobs use them.
func (p *pools) movers() map[string]rebalance.Mover {
	stores := p.Stores()
	out := make(map[string]rebalance.Mover, len(stores))
	for k, v := range stores {
		out[k] = v
	}
	return out
}

// reshardSessions opens a resharding leader's own connections to a
// cluster's primary for its epoch, taking the cluster over from older
// leaders (store.OpenReshardSession); router names the leader in the
// clusters' record.
func (p *pools) reshardSessions(router string, log *slog.Logger) rebalance.OpenSession {
	return func(ctx context.Context, cluster string, epoch int64) (rebalance.Session, error) {
		st, ok := p.Stores()[cluster]
		if !ok {
			return nil, fmt.Errorf("cluster %s has no connection on this router", cluster)
		}
		s, killed, err := st.OpenReshardSession(ctx, store.ReshardSession{Epoch: epoch, Router: router})
		if err != nil {
			return nil, err
		}
		if killed > 0 {
			log.Warn("reshard: ended the connections of an older leader", "cluster", cluster, "epoch", epoch, "killed", killed)
		}
		return s, nil
	}
}

// close closes every pool in use: the primaries', the replicas' and the
// archive cluster's.
func (p *pools) close() {
	p.mu.Lock()
	for _, cc := range p.conns {
		cc.store.Close()
	}
	p.mu.Unlock()
	p.replicas.Close()
	p.archive.close()
}
