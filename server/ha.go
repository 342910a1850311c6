package server

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/shardmq/shardmq/broker"
	"github.com/shardmq/shardmq/circuit"
	"github.com/shardmq/shardmq/lookup"
	"github.com/shardmq/shardmq/reconcile"
	"github.com/shardmq/shardmq/replica"
	"github.com/shardmq/shardmq/store"
	"github.com/shardmq/shardmq/subscription"
	"github.com/shardmq/shardmq/topology"
)

// HAConfig tunes what keeps the router serving when an endpoint fails and
// off the primaries for reads: replica lag measurement and read routing,
// circuit breakers, failover, and reconciliation. Zero fields take the
// defaults their types name.
type HAConfig struct {
	// Replicas: heartbeat interval (Every, 250ms), lag limit for reads
	// (MaxLag, 5s), check timeout (1s). Open, Now and Log are filled by
	// the router unless set.
	Replicas replica.Config
	// Breakers: one per MySQL endpoint; 5 consecutive failures open it for
	// 2s, every call is bounded by 10s.
	Breakers circuit.Config
	// Lookups: scatter concurrency (8) and per-cluster timeout (2s).
	Lookups lookup.Config
	// Reconcile: window (48h), schedule (every 24h), page size, samples.
	// Subscriptions, Now and Log are filled by the router.
	Reconcile reconcile.Config
	// NoSchedule turns the daily reconciliation off (it still runs on
	// POST /v1/admin/reconcile).
	NoSchedule bool
	// WritableTimeout bounds the check that a newly named primary accepts
	// writes before the router switches to it. Defaults to 2s.
	WritableTimeout time.Duration
	// ReplicaReadTimeout bounds each trace and lookup read on a replica
	// (instead of the breakers' CallTimeout): a replica that stops
	// answering (a hung process, a partition) costs a read this long, the
	// timeout counts as a failure of its breaker, and the read goes to the
	// primary at once. Defaults to 1s.
	ReplicaReadTimeout time.Duration
}

// ha wires replicas, breakers, failover, trace and reconciliation into a
// router.
type ha struct {
	r        *Router
	cfg      HAConfig
	breakers *circuit.Set
	monitor  *replica.Monitor
	lookups  *lookup.Service
	recon    *reconcile.Runner
	bg       context.Context
	stopBg   context.CancelFunc
	metrics  *prometheus.Registry

	// Lock order: applyMu, then the router's mu, then mu.
	mu    sync.Mutex
	prim  map[string]*primaryEndpoint // cluster → its primary in use
	retry *time.Timer                 // pending retryApply

	applyMu  sync.Mutex
	latest   *topology.Topology // newest topology handed to apply
	retrying *topology.Topology // the one a pending retry will apply
}

// primaryEndpoint is a cluster's primary in use.
type primaryEndpoint struct {
	cluster  string
	dsn      string
	endpoint string
	store    *store.Store
	shard    *circuit.Shard
}

// WriteHeartbeat implements replica.Primary through the breaker.
func (p *primaryEndpoint) WriteHeartbeat(ctx context.Context, router string, at time.Time) error {
	return p.shard.Breaker().Do(ctx, func(ctx context.Context) error { return p.store.WriteHeartbeat(ctx, router, at) })
}

// PurgeHeartbeats lets the monitor purge rows of departed routers.
func (p *primaryEndpoint) PurgeHeartbeats(ctx context.Context, before time.Time) error {
	return p.store.PurgeHeartbeats(ctx, before)
}

func newHA(r *Router) *ha {
	cfg := r.cfg.HA
	if cfg.WritableTimeout <= 0 {
		cfg.WritableTimeout = 2 * time.Second
	}
	if cfg.ReplicaReadTimeout <= 0 {
		cfg.ReplicaReadTimeout = time.Second
	}
	if cfg.Replicas.Now == nil {
		cfg.Replicas.Now = r.cfg.Now
	}
	if cfg.Replicas.Log == nil {
		cfg.Replicas.Log = r.cfg.Log
	}
	if cfg.Lookups.Now == nil {
		cfg.Lookups.Now = r.cfg.Now
	}
	if cfg.Reconcile.Now == nil {
		cfg.Reconcile.Now = r.cfg.Now
	}
	if cfg.Reconcile.Log == nil {
		cfg.Reconcile.Log = r.cfg.Log
	}
	if cfg.Breakers.OnStateChange == nil {
		log := r.cfg.Log
		cfg.Breakers.OnStateChange = func(endpoint, from, to string) {
			log.Warn("circuit breaker changed state", "endpoint", endpoint, "from", from, "to", to)
		}
	}
	h := &ha{r: r, cfg: cfg, breakers: circuit.NewSet(cfg.Breakers), monitor: replica.New(cfg.Replicas), prim: map[string]*primaryEndpoint{},
		metrics: prometheus.NewRegistry()}
	h.metrics.MustRegister(haCollector{h})
	h.bg, h.stopBg = context.WithCancel(context.Background())
	return h
}

// shard returns the broker's shard for a cluster's primary: its breaker-
// guarded endpoint. A changed primary gets a new endpoint and the old one
// hands over to it (circuit.Shard.Retire).
func (h *ha) shard(cluster, dsn string, st *store.Store) broker.Shard {
	h.mu.Lock()
	defer h.mu.Unlock()
	if p, ok := h.prim[cluster]; ok && p.dsn == dsn && p.store == st {
		return p.shard
	}
	ep := replica.Addr(dsn)
	p := &primaryEndpoint{cluster: cluster, dsn: dsn, endpoint: ep, store: st, shard: circuit.NewShard(st, h.breakers.For(ep))}
	if old, ok := h.prim[cluster]; ok {
		old.shard.Retire(p.shard)
		h.r.cfg.Log.Info("cluster primary switched", "cluster", cluster, "from", old.endpoint, "to", ep)
	}
	h.prim[cluster] = p
	return p.shard
}

// checkWritable makes sure a primary accepts writes before the router
// switches to it: it writes this router's heartbeat there.
func (h *ha) checkWritable(ctx context.Context, cluster string, st *store.Store) error {
	ctx, cancel := context.WithTimeout(ctx, h.cfg.WritableTimeout)
	defer cancel()
	if err := st.WriteHeartbeat(ctx, h.monitor.Config().Router, h.r.cfg.Now()); err != nil {
		return fmt.Errorf("cluster %s primary is not writable: %w", cluster, err)
	}
	return nil
}

// start runs the background work and mounts the trace and admin endpoints,
// once the router's table, broker and API exist.
func (h *ha) start(top *topology.Topology) error {
	r := h.r
	lc := h.cfg.Lookups
	if lc.Archive == nil {
		lc.Archive = r.lookupArchive
	}
	h.lookups = lookup.New(lc, lookupEndpoints{h}, r.table)
	rc := h.cfg.Reconcile
	if rc.Subscriptions == nil {
		rc.Subscriptions = r.subscriptionsAt
	}
	if rc.ShouldRun == nil {
		rc.ShouldRun = r.leading // only the router that runs the background jobs
	}
	recon, err := reconcile.New(rc, reconcileEndpoints{h}, r.table)
	if err != nil {
		return err
	}
	h.recon = recon
	r.api.RouteOps(h.lookups, adminOps{h})
	r.api.Handle("GET /metrics", promhttp.HandlerFor(h.metrics, promhttp.HandlerOpts{}))
	h.applied(top)
	h.monitor.Start(h.bg)
	if !h.cfg.NoSchedule {
		h.recon.Start(h.bg)
	}
	return nil
}

// applied follows a topology now in use: the monitor watches its replicas,
// breakers of endpoints that left are dropped, clusters that left retire.
func (h *ha) applied(top *topology.Topology) {
	h.mu.Lock()
	var watch []replica.Cluster
	keep := map[string]bool{}
	for name, p := range h.prim {
		c, ok := top.Clusters[name]
		if !ok {
			p.shard.Retire(nil)
			delete(h.prim, name)
			continue
		}
		keep[p.endpoint] = true
		for _, dsn := range c.Replicas {
			keep[replica.Addr(dsn)] = true
		}
		watch = append(watch, replica.Cluster{Name: name, Primary: p, Replicas: append([]string(nil), c.Replicas...)})
	}
	h.mu.Unlock()
	h.breakers.Retain(keep)
	h.monitor.Update(watch)
}

// beginApply serializes topology applications and tells a retry whether
// its topology is still the newest. The caller defers release.
func (h *ha) beginApply(top *topology.Topology) (release func(), current bool) {
	h.applyMu.Lock()
	current = true
	if top == h.retrying {
		h.retrying = nil
		current = h.latest == top
	} else {
		h.latest = top
	}
	return h.applyMu.Unlock, current
}

// retryApply tries a topology that could not be applied (say, its new
// primary is not writable yet) again after ReloadEvery, until it applies
// or a newer one arrives. The caller holds applyMu (inside apply).
func (h *ha) retryApply(ctx context.Context, top *topology.Topology, apply func(context.Context, *topology.Topology)) {
	h.retrying = top
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.retry != nil {
		h.retry.Stop()
	}
	if h.bg.Err() != nil {
		return
	}
	h.retry = time.AfterFunc(h.r.cfg.ReloadEvery, func() {
		if ctx.Err() != nil || h.bg.Err() != nil {
			return
		}
		apply(ctx, top)
	})
}

// Metrics is the router's Prometheus registry, served on GET /metrics:
// breaker states, replica lag and health, reconciliation counts. Other
// parts of the router register their collectors here.
func (r *Router) Metrics() *prometheus.Registry { return r.ha.metrics }

// stop ends the background work. Safe to call twice. The router's Close
// calls it holding the router's mu, so it must not take applyMu.
func (h *ha) stop() {
	h.stopBg()
	h.mu.Lock()
	if h.retry != nil {
		h.retry.Stop()
	}
	h.mu.Unlock()
	h.monitor.Stop()
	if h.recon != nil {
		h.recon.Stop()
	}
}

// guarded is a store read through its endpoint's breaker.
type guarded struct {
	st *store.Store
	b  *circuit.Breaker
}

func (g guarded) Trace(ctx context.Context, topic, key string, now time.Time) (t *store.MessageTrace, err error) {
	err = g.b.Do(ctx, func(ctx context.Context) (err error) { t, err = g.st.Trace(ctx, topic, key, now); return err })
	return t, err
}

func (g guarded) Events(ctx context.Context, ids []uint64) (e []store.Event, err error) {
	err = g.b.Do(ctx, func(ctx context.Context) (err error) { e, err = g.st.Events(ctx, ids); return err })
	return e, err
}

func (g guarded) MessagesByTransaction(ctx context.Context, txID string, limit int) (m []*store.Message, err error) {
	err = g.b.Do(ctx, func(ctx context.Context) (err error) {
		m, err = g.st.MessagesByTransaction(ctx, txID, limit)
		return err
	})
	return m, err
}

func (g guarded) FindTransactions(ctx context.Context, ids []string) (f map[string]int, err error) {
	err = g.b.Do(ctx, func(ctx context.Context) (err error) { f, err = g.st.FindTransactions(ctx, ids); return err })
	return f, err
}

func (g guarded) CheckMessages(ctx context.Context, rng store.CheckRange, subs store.SubscriptionsAt) (f []store.Finding, n int, next uint64, err error) {
	err = g.b.Do(ctx, func(ctx context.Context) (err error) {
		f, n, next, err = g.st.CheckMessages(ctx, rng, subs)
		return err
	})
	return f, n, next, err
}

func (g guarded) OrphanDeliveries(ctx context.Context, after store.OrphanCursor, vshards []uint16, limit int) (f []store.Finding, next store.OrphanCursor, err error) {
	err = g.b.Do(ctx, func(ctx context.Context) (err error) {
		f, next, err = g.st.OrphanDeliveries(ctx, after, vshards, limit)
		return err
	})
	return f, next, err
}

func (g guarded) RepairMessages(ctx context.Context, ids []uint64, subs store.SubscriptionsAt, now time.Time) (f []store.Finding, err error) {
	err = g.b.Do(ctx, func(ctx context.Context) (err error) { f, err = g.st.RepairMessages(ctx, ids, subs, now); return err })
	return f, err
}

func (h *ha) primary(cluster string) (*primaryEndpoint, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	p, ok := h.prim[cluster]
	return p, ok
}

// lookupEndpoints implements lookup.Endpoints.
type lookupEndpoints struct{ h *ha }

func (e lookupEndpoints) Primary(cluster string) (lookup.Target, bool) {
	p, ok := e.h.primary(cluster)
	if !ok {
		return lookup.Target{}, false
	}
	return lookup.Target{Reader: guarded{p.store, p.shard.Breaker()}, Endpoint: p.endpoint}, true
}

func (e lookupEndpoints) Replica(cluster string) (lookup.Target, bool) {
	return e.target(e.h.monitor.Pick(cluster))
}

func (e lookupEndpoints) AnyReplica(cluster string) (lookup.Target, bool) {
	return e.target(e.h.monitor.Best(cluster))
}

func (e lookupEndpoints) target(rep replica.Replica, ok bool) (lookup.Target, bool) {
	if !ok {
		return lookup.Target{}, false
	}
	return lookup.Target{Reader: replicaRead{rep.Store, e.h.breakers.For(rep.Endpoint), e.h.cfg.ReplicaReadTimeout},
		Endpoint: rep.Endpoint, Lag: max(rep.Lag, 0)}, true
}

// reconcileEndpoints implements reconcile.Endpoints.
type reconcileEndpoints struct{ h *ha }

func (e reconcileEndpoints) Scan(cluster string) (reconcile.Scanner, string, string, bool) {
	if rep, ok := e.h.monitor.Pick(cluster); ok {
		return guarded{rep.Store, e.h.breakers.For(rep.Endpoint)}, lookup.FromReplica, rep.Endpoint, true
	}
	p, ok := e.h.primary(cluster)
	if !ok {
		return nil, "", "", false
	}
	return guarded{p.store, p.shard.Breaker()}, lookup.FromPrimary, p.endpoint, true
}

func (e reconcileEndpoints) Primary(cluster string) (reconcile.Repairer, bool) {
	p, ok := e.h.primary(cluster)
	if !ok {
		return nil, false
	}
	return guarded{p.store, p.shard.Breaker()}, true
}

// subscriptionsAt lists the subscriptions of topic created at or before at
// (to the millisecond: message times are milliseconds); a topic with none
// stored has its implicit default one.
func (r *Router) subscriptionsAt(_ context.Context, topic string, at time.Time) ([]string, error) {
	subs := r.subs.List(topic)
	if len(subs) == 0 {
		return []string{subscription.Default}, nil
	}
	var out []string
	for _, s := range subs {
		if !s.CreatedAt.Truncate(time.Millisecond).After(at) {
			out = append(out, s.Name)
		}
	}
	return out, nil
}

// adminOps implements api.Admin.
type adminOps struct{ h *ha }

// EndpointView is one endpoint in GET /v1/admin/topology.
type EndpointView struct {
	Role     string `json:"role"`
	Endpoint string `json:"endpoint"`
	Health   string `json:"health"` // ok | unreachable | replication_stopped | lagging | …
	Breaker  string `json:"breaker"`
	Error    string `json:"error,omitempty"`
	// Primaries: the newest heartbeat this router wrote there.
	LastHeartbeat string `json:"last_heartbeat,omitempty"`
	// Replicas.
	LagMS         *int64 `json:"lag_ms,omitempty"`
	IORunning     *bool  `json:"io_running,omitempty"`
	SQLRunning    *bool  `json:"sql_running,omitempty"`
	SecondsBehind *int   `json:"seconds_behind_master,omitempty"`
	ServesReads   *bool  `json:"serves_reads,omitempty"`
}

// ClusterView is one cluster in GET /v1/admin/topology.
type ClusterView struct {
	Name    string `json:"name"`
	VShards int    `json:"vshards"`
	// State is serving, stale (routing to the last known endpoints of a
	// cluster that vanished from the catalog), no_primary or unknown.
	State     string         `json:"state"`
	Detail    string         `json:"detail,omitempty"`
	Endpoints []EndpointView `json:"endpoints"`
}

func (a adminOps) Topology(context.Context) (any, error) {
	h := a.h
	m := h.r.table.Load()
	states := map[string]string{}
	for _, s := range h.breakers.States() {
		states[s.Endpoint] = s.State
	}
	breaker := func(ep string) string {
		if s, ok := states[ep]; ok {
			return s
		}
		return "closed"
	}
	mon := map[string]replica.ClusterStatus{}
	for _, c := range h.monitor.Status() {
		mon[c.Cluster] = c
	}
	h.mu.Lock()
	names := make([]string, 0, len(h.prim))
	prims := map[string]*primaryEndpoint{}
	for n, p := range h.prim {
		names = append(names, n)
		prims[n] = p
	}
	h.mu.Unlock()
	sort.Strings(names)
	out := make([]ClusterView, 0, len(names))
	cstates := map[string]topology.ClusterState{}
	for _, cs := range h.r.clusterStates(h.r.Stores()) {
		cstates[cs.Name] = cs
		if _, ok := prims[cs.Name]; !ok {
			out = append(out, ClusterView{Name: cs.Name, VShards: len(m.VShards(cs.Name)), State: cs.State, Detail: cs.Detail, Endpoints: []EndpointView{}})
		}
	}
	for _, n := range names {
		p, st := prims[n], mon[n]
		cv := ClusterView{Name: n, VShards: len(m.VShards(n)), State: cstates[n].State, Detail: cstates[n].Detail}
		pv := EndpointView{Role: "primary", Endpoint: p.endpoint, Health: "ok", Breaker: breaker(p.endpoint), Error: st.HeartbeatError}
		if !st.LastHeartbeat.IsZero() {
			pv.LastHeartbeat = st.LastHeartbeat.Format(time.RFC3339Nano)
		}
		if pv.Error != "" || pv.Breaker == "open" {
			pv.Health = "unreachable"
		}
		cv.Endpoints = append(cv.Endpoints, pv)
		for _, rs := range st.Replicas {
			rv := EndpointView{Role: "replica", Endpoint: rs.Endpoint, Breaker: breaker(rs.Endpoint), Error: rs.Error,
				LagMS: &rs.LagMS, IORunning: &rs.IORunning, SQLRunning: &rs.SQLRunning, SecondsBehind: &rs.SecondsBehind, ServesReads: &rs.Eligible}
			switch {
			case rs.Eligible:
				rv.Health = "ok"
			case rs.Error != "":
				rv.Health = "unreachable"
			case !rs.SQLRunning:
				rv.Health = "replication_stopped"
			default:
				rv.Health = "lagging"
			}
			cv.Endpoints = append(cv.Endpoints, rv)
		}
		out = append(out, cv)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	res := map[string]any{"shard_map_version": m.Version(), "max_replica_lag_ms": h.monitor.Config().MaxLag.Milliseconds(),
		"clusters": out}
	return h.r.withTopologyStatus(res), nil
}

func (a adminOps) Reconcile(ctx context.Context, req reconcile.Request) (*reconcile.Report, error) {
	return a.h.recon.Run(ctx, req)
}

func (a adminOps) LastReconcile() *reconcile.Report { return a.h.recon.Last() }

func (a adminOps) MissingTransactions(ctx context.Context, ids []string) (*lookup.MissingResult, error) {
	return a.h.lookups.MissingTransactions(ctx, ids)
}
