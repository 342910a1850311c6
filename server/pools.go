package server

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"time"

	"github.com/shardmq/shardmq/cluster"
	"github.com/shardmq/shardmq/rebalance"
	"github.com/shardmq/shardmq/replica"
	"github.com/shardmq/shardmq/store"
	"github.com/shardmq/shardmq/topology"
)

// pools are the router's connection pools: each cluster's primary (prim,
// a cluster.Set, which opens, migrates, checks and retires them with the
// call points over them), one pool per replica DSN (replicas, a
// replica.Pools), which the lag monitor, the replica reads and the
// replicated-durability waits share, and the archive cluster's primary.
// They follow the topology at the same step (update) and close with the
// router (close).
type pools struct {
	opts     func(cluster string) store.Options
	prim     *cluster.Set
	replicas *replica.Pools
	archive  *archiveConn // the archive cluster's primary, connected on first use (retention.go)
}

func newPools(prim *cluster.Set, opts func(cluster string) store.Options, replicas replica.PoolConfig, now func() time.Time, log *slog.Logger) *pools {
	return &pools{opts: opts, prim: prim, replicas: replica.NewPools(replicas),
		archive: &archiveConn{opts: func() store.Options { return opts(topology.ArchiveName) }, now: now, log: log}}
}

// update brings the primaries in line with top (cluster.Set.Update: new
// or changed ones opened, migrated and checked with check, the others
// retired); the replica pools then follow top's replicas (those of
// replicas that left close). On an error nothing changes. It returns
// every cluster in use.
func (p *pools) update(ctx context.Context, top *topology.Topology, check func(ctx context.Context, cluster string, st *store.Store) error) (map[string]*cluster.Cluster, error) {
	primaries := make(map[string]string, len(top.Clusters))
	for name, c := range top.Clusters {
		primaries[name] = c.Primary
	}
	clusters, err := p.prim.Update(ctx, primaries, check)
	if err != nil {
		return nil, err
	}
	follow := make(map[string][]string, len(top.Clusters))
	for name, c := range top.Clusters {
		follow[name] = c.Replicas
	}
	p.replicas.Follow(follow)
	p.archive.follow(top)
	return clusters, nil
}

// Stores returns each cluster's primary store by cluster name.
func (p *pools) Stores() map[string]*store.Store { return p.prim.Stores() }

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
	p.prim.Close()
	p.replicas.Close()
	p.archive.close()
}
