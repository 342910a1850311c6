// Package server assembles one router process: it loads the topology, opens
// and migrates a connection pool per cluster primary, and serves the API
// through the broker, following topology changes as they come.
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/shardmq/shardmq/api"
	"github.com/shardmq/shardmq/broker"
	"github.com/shardmq/shardmq/deadletter"
	"github.com/shardmq/shardmq/internal/idgen"
	"github.com/shardmq/shardmq/observe"
	"github.com/shardmq/shardmq/rebalance"
	"github.com/shardmq/shardmq/retention"
	"github.com/shardmq/shardmq/routing"
	"github.com/shardmq/shardmq/store"
	"github.com/shardmq/shardmq/subscription"
	"github.com/shardmq/shardmq/topology"
)

// Config is a router's configuration. Zero fields take the defaults named.
type Config struct {
	// Listen is the HTTP address. Defaults to 127.0.0.1:8080.
	Listen string
	// TopologyFile is the static topology, used when Source is nil.
	TopologyFile string
	// ReloadEvery is how often the topology file is checked for changes.
	// Defaults to 1s.
	ReloadEvery time.Duration
	// Source is where the topology comes from. Defaults to the file
	// TopologyFile.
	Source topology.Source
	// Limits bound requests (see api.Limits for each default).
	Limits api.Limits
	// HTTP bounds connections: timeouts, a connection cap, the shutdown
	// wait (see HTTPConfig for each default).
	HTTP HTTPConfig
	// Broker tunes routing and claims (see broker.Config).
	Broker broker.Config
	// Store sizes each cluster's pool (see store.Options).
	Store store.Options
	// Subscriptions is where subscriptions are kept. Defaults to the
	// subscription table on every cluster's primary.
	Subscriptions subscription.Store
	// MirrorSubscriptions keeps a copy of every subscription of the
	// Subscriptions store on every cluster's primary and repairs the
	// store from it (subscription.Mirrored), so that subscriptions
	// outlive a loss of Consul's data.
	MirrorSubscriptions bool
	// SubscriptionRefresh is how often subscriptions made through other
	// routers are picked up. Defaults to 1s.
	SubscriptionRefresh time.Duration
	// SubscriptionLimits cap topics and subscriptions per topic (see
	// subscription.Limits for each default).
	SubscriptionLimits subscription.Limits
	// Leader elects the router that runs background jobs. Defaults to
	// none: this router always runs them (the static topology's single
	// router).
	Leader topology.Leader
	// DeadLetters tunes the dead-letter alarm and archive (see
	// deadletter.Config for each default).
	DeadLetters deadletter.Config
	// HA tunes replica reads, circuit breakers, failover and
	// reconciliation (see HAConfig).
	HA HAConfig
	// Security: tokens, TLS, browser rules, load shedding (security.go).
	Security SecurityConfig
	// CheckMapRecords makes the router refuse to start on a shard map
	// older than one recorded on its clusters (vshard_owner), or
	// different from the one recorded under its version: the topology
	// store lost or rolled back its map while other routers route with a
	// newer one. Set for Consul, where several routers must agree; the
	// static file's single router follows its file.
	CheckMapRecords bool
	// Observe tunes metrics: the cap on topic and subscription label
	// values, the queue-health interval, disk paths (see observe.Config).
	Observe observe.Config
	// Backend is the topology backend resharding jobs coordinate through
	// (shard-map check-and-set, the barrier on every live router).
	// Defaults to the static file when Source is that file; nil otherwise
	// disables resharding.
	Backend topology.Backend
	// ReshardState is where resharding jobs are recorded. Defaults, on
	// the static file, to a file beside it (TopologyFile + ".reshard.json").
	ReshardState rebalance.StateStore
	// Reshard tunes resharding jobs (see rebalance.Config for each
	// default); its Leader defaults to Leader.
	Reshard rebalance.Config
	// Retention tunes partition upkeep, the warm and cold archive and
	// table upkeep (see retention.Config for each default); the archive
	// cluster comes from the topology (docs/retention.md).
	Retention retention.Config
	// UI tunes the operators' page at /ui (docs/ui.md).
	UI UIConfig
	// Log defaults to discarding.
	Log *slog.Logger
	// Now is the clock. Defaults to time.Now.
	Now func() time.Time
}

func (c Config) withDefaults() (Config, error) {
	if c.Listen == "" {
		c.Listen = "127.0.0.1:8080"
	}
	if c.ReloadEvery <= 0 {
		c.ReloadEvery = time.Second
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.Source == nil {
		if c.TopologyFile == "" {
			return c, errors.New("config: TopologyFile or Source is required")
		}
		c.Source = topology.NewFileBackend(c.TopologyFile, c.ReloadEvery, c.Log)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	var err error
	if c.HTTP, err = c.HTTP.withDefaults(c.Limits); err != nil {
		return c, err
	}
	return c, nil
}

// UIConfig tunes the operators' page (docs/ui.md).
type UIConfig struct {
	// SampleEvery is the time between two samples of the queue
	// sparklines. Defaults to 1m.
	SampleEvery time.Duration
	// Samples is how many are kept. Defaults to 60 (the last hour).
	Samples int
}

// Router is one running router.
type Router struct {
	cfg    Config
	ids    *idgen.Gen
	table  *routing.Table
	broker *broker.Broker
	api    *api.Server

	subs     *subscription.Registry
	mu       sync.Mutex
	conns    map[string]*clusterConn // by cluster name
	closed   bool
	replicas *replicaWaiter
	ha       *ha   // replicas, breakers, failover, trace, reconciliation (ha.go)
	jobs     *jobs // dead-letter upkeep and produce metrics (jobs.go)
	sec      *security
	record   *mapRecorder

	obs *observability // request, message, cluster and queue metrics (observe.go)
	// ownRetries: transaction retries go to shardmq_tx_retries_total by
	// cluster (Config.Store.OnRetry was not set).
	ownRetries bool

	listener atomic.Pointer[connLimit] // while Run serves with a connection cap
	reshard  *reshard                  // resharding jobs and the barrier registration (reshard.go)
	archive  *archiveConn              // the archive cluster of retention (retention.go)
}

// replicaDSNs lists a cluster's replicas in the topology in use.
func (r *Router) replicaDSNs(cluster string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if cc, ok := r.conns[cluster]; ok {
		return cc.replicas
	}
	return nil
}

type clusterConn struct {
	dsn      string
	replicas []string
	store    *store.Store
}

// New loads the topology, connects to and migrates every primary, and
// returns a router ready to serve. It fails if any primary cannot be
// reached: a router does not start on a topology it cannot verify.
func New(ctx context.Context, cfg Config) (*Router, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	top, err := cfg.Source.Load(ctx)
	if err != nil {
		return nil, fmt.Errorf("load topology: %w", err)
	}
	r := &Router{cfg: cfg, ids: idgen.New(cfg.Now), conns: map[string]*clusterConn{}, archive: &archiveConn{}}
	r.replicas = &replicaWaiter{r: r, pools: map[string]*store.Store{}}
	r.ha = newHA(r)
	r.jobs = &jobs{}
	r.obs = newObservability(r)
	if cfg.Store.IDs == nil {
		r.cfg.Store.IDs = r.ids
	}
	r.ownRetries = cfg.Store.OnRetry == nil
	if cfg.Store.OnDeliveries == nil {
		r.cfg.Store.OnDeliveries = r.obs.msgs.Delivered
	}
	shards, err := r.connect(ctx, top)
	if err != nil {
		r.Close()
		return nil, err
	}
	r.setArchive(top)
	if cfg.CheckMapRecords {
		if err := r.checkRecorded(ctx, top.Map); err != nil {
			r.Close()
			return nil, fmt.Errorf("load topology: %w", err)
		}
	}
	r.table = routing.NewTable(top.Map)
	subStore := cfg.Subscriptions
	switch {
	case subStore == nil:
		subStore = &subscription.MySQLStore{Primaries: r.Stores, Now: cfg.Now}
	case cfg.MirrorSubscriptions:
		subStore = &subscription.Mirrored{Shared: subStore, Durable: &subscription.MySQLStore{Primaries: r.Stores, Now: cfg.Now}, Log: cfg.Log}
	}
	r.subs = subscription.NewRegistry(subStore, cfg.SubscriptionRefresh, cfg.Now, cfg.Log)
	r.subs.SetLimits(cfg.SubscriptionLimits)
	if err := r.subs.Start(ctx); err != nil {
		r.Close()
		return nil, err
	}
	r.broker = broker.New(cfg.Broker, r.table, shards, r.subs, r.replicas, r.ids, cfg.Now, cfg.Log)
	r.api = api.New(observe.WrapBroker(r.broker, r.obs.msgs), cfg.Limits, r.ready, cfg.Log)
	r.api.RouteUI(r.obs.history)
	if err := r.ha.start(top); err != nil {
		r.Close()
		return nil, err
	}
	if err := r.secure(); err != nil {
		r.Close()
		return nil, err
	}
	if err := r.setupReshard(ctx); err != nil {
		r.Close()
		return nil, err
	}
	r.startJobs()
	if err := r.startRetention(context.Background()); err != nil {
		r.Close()
		return nil, err
	}
	r.record = startMapRecorder(r)
	r.obs.start(r)
	r.record.now(ctx, top.Map)
	r.reshard.start()
	return r, nil
}

// connect opens (and migrates) pools for clusters that are new or whose
// primary changed, and returns the shard set for top.
func (r *Router) connect(ctx context.Context, top *topology.Topology) (map[string]broker.Shard, error) {
	r.mu.Lock()
	have := make(map[string]*clusterConn, len(r.conns))
	for k, v := range r.conns {
		have[k] = v
	}
	r.mu.Unlock()

	var mu sync.Mutex
	fresh := map[string]*clusterConn{}
	g, gctx := errgroup.WithContext(ctx)
	for name, c := range top.Clusters {
		if cc, ok := have[name]; ok && cc.dsn == c.Primary {
			r.mu.Lock()
			cc.replicas = append([]string(nil), c.Replicas...)
			r.mu.Unlock()
			continue
		}
		g.Go(func() error {
			st, err := store.Open(gctx, c.Primary, r.storeOptions(name))
			if err != nil {
				return fmt.Errorf("cluster %s primary: %w", name, err)
			}
			if err := st.Migrate(gctx, r.cfg.Now()); err != nil {
				st.Close()
				return fmt.Errorf("cluster %s primary: %w", name, err)
			}
			if err := r.ha.checkWritable(gctx, name, st); err != nil {
				st.Close()
				return err
			}
			if warn, err := st.DurabilityWarnings(gctx); err == nil {
				for _, w := range warn {
					r.cfg.Log.Warn("primary is not fully durable: acknowledged messages can be lost in a crash", "cluster", name, "setting", w)
				}
			}
			mu.Lock()
			fresh[name] = &clusterConn{dsn: c.Primary, replicas: append([]string(nil), c.Replicas...), store: st}
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

	r.mu.Lock()
	defer r.mu.Unlock()
	var retired []*clusterConn
	for name, cc := range r.conns {
		if _, still := top.Clusters[name]; !still || fresh[name] != nil {
			retired = append(retired, cc)
			delete(r.conns, name)
		}
	}
	for name, cc := range fresh {
		r.conns[name] = cc
	}
	shards := make(map[string]broker.Shard, len(r.conns))
	inner := make(map[string]broker.Shard, len(r.conns))
	for name, cc := range r.conns {
		inner[name] = r.ha.shard(name, cc.dsn, cc.store)
		shards[name] = r.obs.shards.Wrap(name, inner[name]) // timed per cluster
	}
	r.obs.shards.Retain(inner)
	// Requests already routed to a retired pool finish on it; close it
	// once they are surely done.
	for _, cc := range retired {
		time.AfterFunc(30*time.Second, func() { cc.store.Close() })
	}
	return shards, nil
}

// apply switches to a reloaded topology: connections first, then the map,
// so that no request is routed to a cluster without a pool.
func (r *Router) apply(ctx context.Context, top *topology.Topology) {
	release, current := r.ha.beginApply(top)
	defer release()
	if !current {
		return // a newer topology arrived while this one waited for a retry
	}
	shards, err := r.connect(ctx, top)
	if err != nil {
		r.cfg.Log.Error("topology change not applied: cannot reach its clusters; keeping the last one and retrying", "err", err)
		r.ha.retryApply(ctx, top, r.apply)
		return
	}
	r.broker.SetShards(shards)
	r.setArchive(top)
	if top.Map.Version() > r.table.Load().Version() {
		r.record.now(ctx, top.Map) // on the clusters before it routes
	}
	if !r.table.Store(top.Map) {
		r.cfg.Log.Warn("reloaded shard map is older than the one in use; map kept", "version", top.Map.Version(), "current", r.table.Load().Version())
	}
	r.record.kick()
	r.ha.applied(top)
}

// Handler is the router's HTTP handler: the API behind the security
// checks (security.go).
func (r *Router) Handler() http.Handler { return r.sec.handler }

// Broker exposes the broker (tests, load tester).
func (r *Router) Broker() *broker.Broker { return r.broker }

// Stores returns each cluster's primary store by cluster name.
func (r *Router) Stores() map[string]*store.Store {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]*store.Store, len(r.conns))
	for k, v := range r.conns {
		out[k] = v.store
	}
	return out
}

// ClusterHealth is one cluster's readiness detail.
type ClusterHealth struct {
	Cluster string `json:"cluster"`
	// State is the cluster's standing in the topology (see
	// clusterStates): serving, stale, no_primary or unknown.
	State  string `json:"state"`
	OK     bool   `json:"ok"`
	Error  string `json:"error,omitempty"`
	Detail string `json:"detail,omitempty"`
}

// ready answers /readyz with every cluster of the shard map and every
// cluster the router holds a pool for: ready while at least one cluster
// answers, since every other cluster's vshards keep serving when one is
// down.
func (r *Router) ready(ctx context.Context) (any, error) {
	stores := r.Stores()
	states := r.clusterStates(stores)
	out := make([]ClusterHealth, len(states))
	var wg sync.WaitGroup
	for i, st := range states {
		out[i] = ClusterHealth{Cluster: st.Name, State: st.State, Detail: st.Detail, Error: st.Detail}
		store, ok := stores[st.Name]
		if !ok {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			out[i].OK, out[i].Error = true, ""
			if err := store.Ping(cctx); err != nil {
				// /readyz is open: the driver's text (addresses) stays in the log.
				r.cfg.Log.Debug("readiness: cluster does not answer", "cluster", st.Name, "err", err)
				out[i].OK, out[i].Error = false, "not answering"
			}
		}()
	}
	wg.Wait()
	for _, h := range out {
		if h.OK {
			return r.withTopologyStatus(map[string]any{"clusters": out}), nil
		}
	}
	return r.withTopologyStatus(map[string]any{"clusters": out}), errors.New("no cluster answers")
}

// Close releases every pool. Safe to call twice.
func (r *Router) Close() {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return
	}
	r.closed = true
	r.mu.Unlock()
	// Services stop without r.mu held: their goroutines may need it (the
	// subscription refresh reads the pools through Stores).
	if r.record != nil {
		r.record.stop()
	}
	r.reshard.stop()
	r.jobs.stop()
	r.sec.stop()
	r.obs.stop()
	r.ha.stop()
	if r.subs != nil {
		r.subs.Stop()
	}
	if r.broker != nil {
		r.broker.Close() // commits what is queued before the pools close
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, cc := range r.conns {
		cc.store.Close()
	}
	r.closeArchive()
	r.replicas.close()
}

// Run serves until ctx is done, following topology file changes, then
// shuts down without dropping anything silently:
//
//  1. it stops accepting connections and answers every waiting long-poll
//     claim at once (an empty answer, as when wait_ms runs out);
//  2. it waits up to HTTP.ShutdownTimeout for the requests in flight to be
//     answered — a produce is answered after its group commit, as always;
//  3. past that wait it closes the remaining connections: their clients
//     see a connection error and retry with the same keys, which
//     deduplication makes safe;
//  4. Close then answers or refuses every claim and produce still inside
//     the broker (the group committers commit what is queued first) and
//     closes the pools.
func (r *Router) Run(ctx context.Context, ln net.Listener) error {
	srv := r.httpServer()
	if r.cfg.HTTP.MaxConns > 0 {
		l := limitConns(ln, r.cfg.HTTP.MaxConns)
		r.listener.Store(l)
		ln = l
	}
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		r.cfg.Source.Watch(wctx, func(t *topology.Topology) { r.apply(wctx, t) })
	}()
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(api.JSONErrorListener(ln)) }() // net/http's own early answers in the JSON shape too
	select {
	case err := <-errc:
		r.Close()
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	// No topology is applied while the router closes (it would open pools
	// and committers after Close stopped them); a watch stuck in I/O is
	// not waited for past a few seconds.
	stopWatch()
	select {
	case <-watched:
	case <-time.After(5 * time.Second):
		r.cfg.Log.Warn("topology watch did not stop within 5s; shutting down anyway")
	}
	return r.shutdown(srv)
}

// shutdown is Run's ending (see Run).
func (r *Router) shutdown(srv *http.Server) error {
	r.cfg.Log.Info("router shutting down: no new connections; answering long-polls and in-flight requests")
	r.broker.Drain()
	sctx, cancel := context.WithTimeout(context.Background(), r.cfg.HTTP.ShutdownTimeout)
	defer cancel()
	var err error
	if err = srv.Shutdown(sctx); err != nil {
		r.cfg.Log.Warn("requests still in flight after the shutdown wait; closing their connections (their clients retry with the same keys)",
			"wait", r.cfg.HTTP.ShutdownTimeout, "err", err)
		srv.Close()
		err = fmt.Errorf("shutdown: requests in flight after %v: %w", r.cfg.HTTP.ShutdownTimeout, err)
	}
	r.Close()
	r.cfg.Log.Info("router stopped")
	return err
}

// Listen opens the configured address.
func (r *Router) Listen() (net.Listener, error) {
	if err := r.checkListen(); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", r.cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", r.cfg.Listen, err)
	}
	return r.secureListener(ln)
}

// SecureListener applies the listen policy (an open router, one without
// tokens, serves only on loopback unless Insecure) and TLS to a listener
// bound by the caller, for mains that must bind before the router exists.
func (r *Router) SecureListener(ln net.Listener) (net.Listener, error) {
	if err := checkListen(ln.Addr().String(), r.sec.tokens == nil, r.cfg.Security.Insecure); err != nil {
		return nil, err
	}
	return r.secureListener(ln)
}
