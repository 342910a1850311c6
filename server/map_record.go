package server

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/shardmq/shardmq/routing"
	"github.com/shardmq/shardmq/shard"
	"github.com/shardmq/shardmq/store"
	"github.com/shardmq/shardmq/topology"
)

// mapRecorder writes the shard map the router routes with into every
// cluster primary's vshard_owner table (store/vshard_owner.go), the record
// from which `consul-seed -recover` rebuilds a map that the topology store
// lost, and against which starting routers and writers check versions.
// A new map is written to every primary before the router routes with it
// (now, bounded by a timeout so that an unreachable cluster does not hold
// the change up); a cluster that could not be written is tried again in
// the background every ReloadEvery until it takes the map.
//
// It is a service (Start/Stop); now and kick may be called before Start.
type mapRecorder struct {
	table  *routing.Table
	stores func() map[string]*store.Store
	every  time.Duration
	clock  func() time.Time
	log    *slog.Logger
	kickc  chan struct{}

	runMu  sync.Mutex
	cancel context.CancelFunc
	done   chan struct{}

	mu       sync.Mutex
	recorded map[string]int64 // cluster → version written there
}

func newMapRecorder(table *routing.Table, stores func() map[string]*store.Store, every time.Duration, clock func() time.Time, log *slog.Logger) *mapRecorder {
	return &mapRecorder{table: table, stores: stores, every: every, clock: clock, log: log, kickc: make(chan struct{}, 1),
		recorded: map[string]int64{}}
}

// Start records the map in use, then every map the router is kicked
// about, in the background until Stop. Safe to call twice.
func (m *mapRecorder) Start(ctx context.Context) {
	m.runMu.Lock()
	defer m.runMu.Unlock()
	if m.cancel != nil {
		return
	}
	ctx, m.cancel = context.WithCancel(ctx)
	m.done = make(chan struct{})
	go m.run(ctx)
	m.kick()
}

// now records sm on every primary that lacks it, waiting up to 2s; what
// failed is left to the background retries.
func (m *mapRecorder) now(ctx context.Context, sm *routing.Map) {
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if !m.recordAll(rctx, sm) {
		m.kick()
	}
}

// kick asks for the current map to be recorded.
func (m *mapRecorder) kick() {
	select {
	case m.kickc <- struct{}{}:
	default:
	}
}

// Stop ends the recorder and waits for it. Safe to call twice, and
// without Start.
func (m *mapRecorder) Stop() {
	m.runMu.Lock()
	cancel, done := m.cancel, m.done
	m.runMu.Unlock()
	if cancel == nil {
		return
	}
	cancel()
	<-done
}

func (m *mapRecorder) run(ctx context.Context) {
	defer close(m.done)
	var retry <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-m.kickc:
		case <-retry:
		}
		retry = nil
		if !m.recordAll(ctx, m.table.Load()) && ctx.Err() == nil {
			retry = time.After(m.every)
		}
	}
}

// recordAll writes sm to every primary that lacks it; false when one
// failed.
func (m *mapRecorder) recordAll(ctx context.Context, sm *routing.Map) bool {
	owners := make([]store.VShardOwner, 0, 1024)
	for _, rg := range sm.Ranges() {
		for v := rg.From; v <= rg.To; v++ {
			owners = append(owners, store.VShardOwner{VShard: v, Cluster: rg.Cluster, MapVersion: sm.Version(), Frozen: rg.Frozen})
		}
	}
	ok := true
	for name, st := range m.stores() {
		m.mu.Lock()
		done := m.recorded[name] >= sm.Version()
		m.mu.Unlock()
		if done {
			continue
		}
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := st.RecordVShardOwners(wctx, owners, m.clock())
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				m.log.Warn("shard map not recorded on a cluster yet; retrying", "cluster", name, "version", sm.Version(), "err", err)
			}
			ok = false
			continue
		}
		m.mu.Lock()
		m.recorded[name] = sm.Version()
		m.mu.Unlock()
	}
	return ok
}

// checkRecorded is the start-up check against the clusters' own records,
// for every topology source: m must not be older than a map version
// recorded on any cluster (vshard_owner) or than its shard fence, nor
// differ from the map recorded under its own version. Either means the
// topology store or file lost or rolled back its map (a restored file, a
// sandbox rewritten) while routers were routing with a newer one: routing
// with it would write vshards where they no longer live.
func (r *Router) checkRecorded(ctx context.Context, m *routing.Map) error {
	for name, st := range r.Stores() {
		rows, err := st.VShardOwners(ctx)
		if err != nil {
			return fmt.Errorf("cluster %s: %w", name, err)
		}
		newest, err := st.ShardFence(ctx)
		if err != nil {
			return fmt.Errorf("cluster %s: %w", name, err)
		}
		differ := -1
		for _, o := range rows {
			newest = max(newest, o.MapVersion)
			if c, state := m.Lookup(shard.ID(o.VShard)); o.MapVersion == m.Version() && (c != o.Cluster || o.Frozen != (state == routing.Frozen)) {
				differ = o.VShard
			}
		}
		switch {
		case newest > m.Version():
			return fmt.Errorf("%w: shard map version %d is older than version %d recorded on cluster %s; %s", topology.ErrBehind, m.Version(), newest, name, r.recoveryHint(newest))
		case differ >= 0:
			return fmt.Errorf("%w: shard map version %d assigns vshard %d differently from the map of that version recorded on cluster %s; %s", topology.ErrBehind, m.Version(), differ, name, r.recoveryHint(m.Version()))
		}
	}
	return nil
}

// recoveryHint says what to do when the source's map is behind the
// clusters' records (newest): for a topology file, put the newer map back.
func (r *Router) recoveryHint(newest int64) string {
	if fb, ok := r.cfg.Source.(*topology.FileBackend); ok {
		return fmt.Sprintf("the topology file %s holds an older shard map than its clusters, who were resharded since (a restored or regenerated file): "+
			"put back the file with the map of version %d that the resharding wrote, or write a shard_map of a version above %d that gives every vshard "+
			"to the cluster its vshard_owner rows name (docs/resharding.md, Fencing); the router does not start on it, since it would write vshards "+
			"where they no longer live", fb.Path, newest, newest)
	}
	return topology.RecoveryHint
}

// RecordedMapVersion is the newest shard-map version recorded on any of
// the router's clusters (vshard_owner): the floor a map writer running in
// a router passes to topology.WriteShardMapAbove, so that its version is
// above what the clusters saw even when the topology store lost its data.
func (r *Router) RecordedMapVersion(ctx context.Context) (int64, error) {
	var newest int64
	for name, st := range r.Stores() {
		rows, err := st.VShardOwners(ctx)
		if err != nil {
			return 0, fmt.Errorf("cluster %s: %w", name, err)
		}
		for _, o := range rows {
			newest = max(newest, o.MapVersion)
		}
	}
	return newest, nil
}
