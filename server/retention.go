package server

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/shardmq/shardmq/lookup"
	"github.com/shardmq/shardmq/rebalance"
	"github.com/shardmq/shardmq/retention"
	"github.com/shardmq/shardmq/store"
	"github.com/shardmq/shardmq/topology"
)

// Retention (DESIGN §8, docs/retention.md): the jobs run on the leading
// router over the hot clusters' primaries and the archive cluster named by
// the topology. The archive cluster's pool (archiveConn, one of the
// router's pools) is connected lazily and again when its DSN changes: a
// router serves without it, and the warm and cold jobs and the archive
// lookups wait for it.

type archiveConn struct {
	opts func() store.Options
	now  func() time.Time
	log  *slog.Logger

	mu       sync.Mutex
	dsn      string // wanted, from the topology in use
	open     string // the DSN st was opened with
	st       *store.Store
	failedAt time.Time
}

// follow takes the archive cluster of a topology.
func (a *archiveConn) follow(top *topology.Topology) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.dsn = ""
	if top.Archive != nil {
		a.dsn = top.Archive.Primary
	}
}

// archiveStore returns the archive cluster's primary, connecting (and
// migrating) it on first use; nil when the topology names none or it
// cannot be reached (tried again after 10 s).
func (a *archiveConn) store() *store.Store {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.dsn == a.open && a.st != nil {
		return a.st
	}
	if a.st != nil {
		old := a.st
		time.AfterFunc(30*time.Second, func() { old.Close() })
		a.st, a.open = nil, ""
	}
	if a.dsn == "" || a.now().Sub(a.failedAt) < 10*time.Second {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := store.Open(ctx, a.dsn, a.opts())
	if err == nil {
		if err = st.Migrate(ctx, a.now()); err != nil {
			st.Close()
		}
	}
	if err != nil {
		a.failedAt = a.now()
		a.log.Warn("archive cluster not reachable: archiving and archive lookups wait", "err", err)
		return nil
	}
	a.st, a.open = st, a.dsn
	return st
}

// named says whether the topology in use names an archive cluster.
func (a *archiveConn) named() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.dsn != ""
}

func (a *archiveConn) close() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.st != nil {
		a.st.Close()
		a.st = nil
	}
}

// lookup is the lookups' view of the archive cluster (a nil interface,
// not a nil store, when there is none).
func (a *archiveConn) lookup() lookup.Archive {
	if st := a.store(); st != nil {
		return st
	}
	return nil
}

// moving says whether a resharding job is unfinished (paused ones too:
// their rows may be on two clusters); false without resharding.
func (rs *reshard) moving() bool {
	if rs == nil || rs.manager == nil {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	jobs, err := rs.manager.List(ctx)
	if err != nil {
		return true // unknown: wait
	}
	for _, j := range jobs {
		if !rebalance.Terminal(j.State) {
			return true
		}
	}
	return false
}

// setupRetention builds the retention jobs and serves their endpoints;
// the jobs run as one of the router's services.
func (r *Router) setupRetention() error {
	cfg := r.cfg.Retention
	if cfg.Now == nil {
		cfg.Now = r.cfg.Now
	}
	if cfg.Log == nil {
		cfg.Log = r.cfg.Log
	}
	job, err := retention.New(cfg, retention.Deps{Hot: r.pools.Stores, Archive: r.pools.archive.store, ArchiveNamed: r.pools.archive.named, Leading: leader(r.cfg.Leader), Moving: r.reshard.moving})
	if err != nil {
		return err
	}
	r.retention = job
	r.metrics.MustRegister(job.Collectors()...)
	r.api.RouteRetention(retentionOps{job})
	return nil
}

// Retention exposes the retention jobs (tests, admin).
func (r *Router) Retention() *retention.Job { return r.retention }

// retentionOps serves the retention endpoints.
type retentionOps struct{ j *retention.Job }

func (o retentionOps) Status() retention.Status         { return o.j.Status() }
func (o retentionOps) RunNow(ctx context.Context) error { return o.j.RunOnce(ctx) }

func (o retentionOps) Restore(ctx context.Context, month string) (*retention.RestoreReport, error) {
	m, err := retention.ParseMonth(month)
	if err != nil {
		return nil, err
	}
	rep, err := o.j.Restore(ctx, m)
	if err != nil {
		return rep, fmt.Errorf("restore %s: %w", month, err)
	}
	return rep, nil
}

func (o retentionOps) Release(ctx context.Context, month string) error {
	m, err := retention.ParseMonth(month)
	if err != nil {
		return err
	}
	return o.j.Release(ctx, m)
}
