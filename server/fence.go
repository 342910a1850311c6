package server

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardmq/shardmq/cluster"
	"github.com/shardmq/shardmq/routing"
	"github.com/shardmq/shardmq/store"
	"github.com/shardmq/shardmq/topology"
)

// fenceWatch is the router's side of the clusters' shard fences
// (store/shard_fence.go, docs/resharding.md "Fencing"). A cluster refuses
// a write routed with a map older than its fence; the refusal reaches the
// client as unavailable (retry) and reaches this through the clusters'
// call points. Each refusal is counted (shardmq_fence_refusals_total),
// logged, and makes the router read its topology source again; until
// the router holds a map at least as new as the newest fence it met,
// /readyz says not ready, topology_stale true, and names the fence.
type fenceWatch struct {
	log      *slog.Logger
	refusals *prometheus.CounterVec
	reload   func() // asks for the topology to be read again; never blocks

	mu      sync.Mutex
	table   *routing.Table // set once the router routes
	need    int64          // newest fence met
	cluster string         // the cluster that had it
	at      time.Time
	logged  time.Time
}

func newFenceWatch(reg prometheus.Registerer, log *slog.Logger, reload func()) *fenceWatch {
	f := &fenceWatch{log: log, reload: reload,
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shardmq_fence_refusals_total",
			Help: "Calls a cluster refused because the router's shard map was older than the cluster's fence (retryable; the router re-reads its topology)."},
			[]string{"cluster"})}
	reg.MustRegister(f.refusals)
	return f
}

func (f *fenceWatch) setTable(t *routing.Table) {
	f.mu.Lock()
	f.table = t
	f.mu.Unlock()
}

// observer wraps a cluster's call observer with the watch.
func (f *fenceWatch) observer(name string, inner cluster.Observer) cluster.Observer {
	return func(op string, took time.Duration, err error) {
		if inner != nil {
			inner(op, took, err)
		}
		var fe *store.FenceError
		if err != nil && errors.As(err, &fe) {
			f.refused(name, op, fe)
		}
	}
}

// refused records one refusal and asks for a reload.
func (f *fenceWatch) refused(cluster, op string, fe *store.FenceError) {
	f.refusals.WithLabelValues(cluster).Inc()
	now := time.Now()
	f.mu.Lock()
	if fe.Need > f.need {
		f.need, f.cluster, f.at = fe.Need, cluster, now
	}
	logIt := now.Sub(f.logged) >= time.Second
	if logIt {
		f.logged = now
	}
	f.mu.Unlock()
	if logIt {
		f.log.Warn("a cluster refused a write: this router's shard map is older than the cluster's fence; re-reading the topology",
			"cluster", cluster, "op", op, "map_version", fe.Have, "fence", fe.Need)
	}
	f.reload()
}

// fenceStatus is what /readyz says of the fences.
type fenceStatus struct {
	Stale      bool   `json:"stale"`
	Cluster    string `json:"cluster"`
	Fence      int64  `json:"fence"`
	MapVersion int64  `json:"map_version"`
	Since      string `json:"since"`
}

// status reports whether the map in use is older than the newest fence
// met (ok false: no fence was ever met).
func (f *fenceWatch) status() (fenceStatus, bool) {
	if f == nil {
		return fenceStatus{}, false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.need == 0 || f.table == nil {
		return fenceStatus{}, false
	}
	v := f.table.Load().Version()
	return fenceStatus{Stale: v < f.need, Cluster: f.cluster, Fence: f.need, MapVersion: v, Since: f.at.UTC().Format(time.RFC3339Nano)}, true
}

// reloader reads the topology source again and applies what it says, at
// most one read at a time and one per interval, for fence refusals.
type reloader struct {
	source topology.Source
	apply  func(ctx context.Context, top *topology.Topology)
	every  time.Duration
	log    *slog.Logger

	mu      sync.Mutex
	running bool
	last    time.Time
	ctx     context.Context
}

// kick starts a read unless one runs or ran within the interval.
func (l *reloader) kick() {
	l.mu.Lock()
	ctx := l.ctx
	if l.running || ctx == nil || ctx.Err() != nil || time.Since(l.last) < l.every {
		l.mu.Unlock()
		return
	}
	l.running, l.last = true, time.Now()
	l.mu.Unlock()
	go func() {
		defer func() {
			l.mu.Lock()
			l.running = false
			l.mu.Unlock()
		}()
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		top, err := l.source.Load(rctx)
		if err != nil {
			l.log.Warn("topology not re-read after a fence refusal; the router stays unready for the fenced cluster until it is", "err", err)
			return
		}
		l.apply(ctx, top)
	}()
}

// run lets kick read the source until ctx ends (Run's watch context: no
// topology is applied while the router closes).
func (l *reloader) run(ctx context.Context) {
	l.mu.Lock()
	l.ctx = ctx
	l.mu.Unlock()
}

// selfFencer is the router's side of Config.SelfFence: every tick it asks
// whether the registration among the live routers is current; when it is
// not, the router self-fences (broker.SetSelfFenced: writes and claims answer
// unavailable) and hands every lease it holds in memory to the tables,
// so that a resharding job that no longer waits for it copies them with
// their rows. It lifts the fence once the registration is current again;
// a map older than a cluster's fence is refused there (fenceWatch) until
// the watch delivers the current one. A service (Start/Stop).
type selfFencer struct {
	reg    topology.SelfFencer
	broker interface {
		SetSelfFenced(bool)
		SelfFenced() bool
	}
	writeOut func(ctx context.Context) error // every in-memory lease to the tables
	every    time.Duration
	log      *slog.Logger

	runMu  sync.Mutex
	cancel context.CancelFunc
	done   chan struct{}
}

// Start runs the checks until Stop. Safe to call twice.
func (f *selfFencer) Start(ctx context.Context) {
	f.runMu.Lock()
	defer f.runMu.Unlock()
	if f.cancel != nil {
		return
	}
	ctx, f.cancel = context.WithCancel(ctx)
	f.done = make(chan struct{})
	go f.run(ctx)
}

// Stop ends the checks and waits. Safe to call twice, and without Start.
func (f *selfFencer) Stop() {
	f.runMu.Lock()
	cancel, done := f.cancel, f.done
	f.runMu.Unlock()
	if cancel == nil {
		return
	}
	cancel()
	<-done
}

func (f *selfFencer) run(ctx context.Context) {
	defer close(f.done)
	t := time.NewTicker(f.every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		f.check(ctx)
	}
}

// current reports whether the router may write: its registration is
// current. A source that is stale for another reason (a stored map it
// refused) does not fence it: the router keeps the map it vouches for,
// and the clusters' fences refuse it if that map is behind.
func (f *selfFencer) current() bool { return f.reg.Current(time.Now()) }

func (f *selfFencer) check(ctx context.Context) {
	ok := f.current()
	switch {
	case !ok && !f.broker.SelfFenced():
		f.broker.SetSelfFenced(true)
		f.log.Warn("router registration not renewed within two thirds of its TTL: not writing until it is; writing the leases held in memory to the tables")
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := f.writeOut(wctx)
		cancel()
		if err != nil {
			f.log.Error("leases held in memory not all written to the tables while self-fenced; their deliveries come back after their lease deadline", "err", err)
		}
	case ok && f.broker.SelfFenced():
		f.broker.SetSelfFenced(false)
		f.log.Info("router registered again: writing again")
	case !ok:
		// Still fenced: a claim under way when the fence went up may
		// have leased more in memory since. Cheap when there is none.
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		if err := f.writeOut(wctx); err != nil {
			f.log.Debug("leases held in memory not written while self-fenced", "err", err)
		}
		cancel()
	}
}
