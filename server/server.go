// Package server assembles one router process: it loads the topology, opens
// and migrates a connection pool per cluster primary, and serves the API
// through the broker, following topology changes as they come.
package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/shardmq/shardmq/api"
	"github.com/shardmq/shardmq/broker"
	"github.com/shardmq/shardmq/circuit"
	"github.com/shardmq/shardmq/cluster"
	"github.com/shardmq/shardmq/deadletter"
	"github.com/shardmq/shardmq/internal/forward"
	"github.com/shardmq/shardmq/internal/idgen"
	"github.com/shardmq/shardmq/lookup"
	"github.com/shardmq/shardmq/observe"
	"github.com/shardmq/shardmq/rebalance"
	"github.com/shardmq/shardmq/reconcile"
	"github.com/shardmq/shardmq/retention"
	"github.com/shardmq/shardmq/routing"
	"github.com/shardmq/shardmq/sqs"
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
	// Cluster tunes each cluster's group commits (see cluster.Config).
	Cluster cluster.Config
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
	// SelfFence, when set, is the router's registration among the live
	// routers (Consul): while it is not current (not renewed within two
	// thirds of its TTL) the router refuses writes and claims (unavailable) and
	// writes the leases it holds in memory to the tables; /readyz says
	// not ready (docs/consul.md, "Self-fencing"). Nil: never (the static
	// file's single router).
	SelfFence topology.SelfFencer
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
	ReshardState rebalance.StateDoc
	// Reshard tunes resharding jobs (see rebalance.Config for each
	// default); its Leader defaults to Leader.
	Reshard rebalance.Config
	// Retention tunes partition upkeep, the warm and cold archive and
	// table upkeep (see retention.Config for each default); the archive
	// cluster comes from the topology (docs/retention.md).
	Retention retention.Config
	// UI tunes the operators' page at /ui (docs/ui.md).
	UI UIConfig
	// SQS tunes the SQS API on the same listener (docs/sqs.md): the
	// account id and region of queue URLs and ARNs, the body cap. Its
	// credentials come from Security.AWSCredentialsFile.
	SQS sqs.Config
	// PeerCA verifies other routers' certificates when consume operations
	// are forwarded to the owners of their units over TLS; empty: the
	// system's roots.
	PeerCA string
	// Log defaults to discarding.
	Log *slog.Logger
	// Now is the clock. Defaults to time.Now.
	Now func() time.Time
}

func (c Config) withDefaults() (Config, error) {
	if c.Broker.Owners.Addr == "" && c.Listen != "" {
		// Other routers reach this one where it listens, when that names
		// a host (not 0.0.0.0 or [::]): the owners' address
		// (docs/consume.md, "Owners").
		if host, _, err := net.SplitHostPort(c.Listen); err == nil && host != "" && !net.ParseIP(host).IsUnspecified() {
			c.Broker.Owners.Addr = c.Listen
		}
	}
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
	if c.Security.MaxInFlight, err = inFlightCap(c.Security.MaxInFlight, c.HTTP.MaxConns); err != nil {
		return c, err
	}
	return c, nil
}

// inFlightCap fills and checks the cap on requests in flight against the
// cap on connections. Over HTTP/1.1 every request in flight holds a
// connection, so a cap on requests at or above the cap on connections
// could never shed: the connections would run out first and refuse
// everyone, health checks included. The default is three quarters of the
// connections (768 of 1024), leaving a quarter for connections between
// requests and for new ones, whose requests are shed or served at once.
func inFlightCap(maxInFlight, maxConns int) (int, error) {
	switch {
	case maxInFlight == 0 && maxConns > 0:
		return max(1, maxConns*3/4), nil
	case maxInFlight == 0:
		return 4096, nil
	case maxInFlight > 0 && maxConns > 0 && maxInFlight >= maxConns:
		return 0, fmt.Errorf("config: -max-in-flight %d must be below -max-conns %d: every request in flight holds a connection, so the connections would run out before any request is shed", maxInFlight, maxConns)
	}
	return maxInFlight, nil
}

// UIConfig tunes the operators' page (docs/ui.md).
type UIConfig struct {
	// SampleEvery is the time between two samples of the queue
	// sparklines. Defaults to 1m.
	SampleEvery time.Duration
	// Samples is how many are kept. Defaults to 60 (the last hour).
	Samples int
}

// Router is one running router. New is its composition root: it builds
// the parts bottom-up and hands each the values it needs — pools, then
// the clusters' call points over them, then the broker, then the reads and
// background jobs over the broker and the endpoints, then the API over all
// of them — so that no part points back at the router or at a part built
// after it. The background services share one Start/Stop shape and stop in
// the reverse order of their start.
type Router struct {
	cfg       Config
	ids       *idgen.Gen
	metrics   *prometheus.Registry // GET /metrics; every part registers here
	obs       *observability       // request, message, cluster and queue metrics (observe.go)
	retries   *txRetries           // transaction retries by cluster (jobs.go)
	pools     *pools               // connection pools of the primaries and replicas (pools.go)
	eps       *endpoints           // call points, breakers, replica monitor (endpoints.go)
	counts    *queueCounts         // where queue health counts each cluster (queue_counts.go)
	applier   *applier             // topology applications and their retries (apply.go)
	table     *routing.Table
	subs      *subscription.Registry
	broker    *broker.Broker
	lookups   *lookup.Service
	recon     *reconcile.Runner
	upkeep    *deadletter.Upkeep // dead-letter alarms and archive
	record    *mapRecorder
	fence     *fenceWatch // refusals by the clusters' shard fences (fence.go)
	reloads   *reloader   // re-reads of the topology after a refusal
	api       *api.Server
	sec       *security
	reshard   *reshard       // resharding jobs and the barrier registration (reshard.go)
	retention *retention.Job // retention's jobs (retention.go); the archive cluster's pool is in pools
	services  services       // background services, stopped by Close in reverse order

	mu     sync.Mutex
	closed bool

	listener atomic.Pointer[connLimit] // while Run serves with a connection cap
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
	r := &Router{cfg: cfg, ids: idgen.New(cfg.Now), metrics: prometheus.NewRegistry(), applier: &applier{every: cfg.ReloadEvery}}
	if err := r.build(ctx, top); err != nil {
		r.Close()
		return nil, err
	}
	r.start(ctx, top)
	return r, nil
}

// build assembles the router's parts, bottom-up (see Router).
func (r *Router) build(ctx context.Context, top *topology.Topology) error {
	cfg := r.cfg
	leading := leader(cfg.Leader)

	// Metrics and the primaries' pools, with the call points guarding them.
	r.obs = newObservability(cfg.Observe, cfg.UI, r.metrics)
	r.retries = newTxRetries(r.metrics)
	opts := storeOptions(cfg.Store, r.ids, r.obs.msgs, r.retries)
	// The clusters' primaries: their pools, call points (breakers from the
	// endpoints, metrics and the fence watch as observers) and batching.
	prim := cluster.NewSet(cluster.SetConfig{Options: opts, Cluster: cfg.Cluster, Now: cfg.Now, Log: cfg.Log,
		Breaker: func(endpoint string) *circuit.Breaker { return r.eps.breakers.For(endpoint) },
		Observe: func(name string) cluster.Observer { return r.fence.observer(name, r.obs.clusters.For(name)) }})
	r.pools = newPools(prim, opts, cfg.HA.ReplicaPools, cfg.Now, cfg.Log)
	r.metrics.MustRegister(observe.NewPoolCollector(r.pools.dbs))
	r.eps = newEndpoints(cfg.HA.withDefaults(cfg.Log, cfg.Now, r.pools.replicas))
	r.eps.set = prim
	r.reloads = &reloader{source: cfg.Source, every: 200 * time.Millisecond, log: cfg.Log, apply: func(ctx context.Context, top *topology.Topology) {
		if top.Map.Version() > r.table.Load().Version() {
			r.apply(ctx, top)
		}
	}}
	r.fence = newFenceWatch(r.metrics, cfg.Log, r.reloads.kick)
	clusters, err := r.connect(ctx, top)
	if err != nil {
		return err
	}
	if err := r.checkRecorded(ctx, top.Map); err != nil {
		return fmt.Errorf("load topology: %w", err)
	}

	// Routing, subscriptions and the broker over the clusters.
	r.table = routing.NewTable(top.Map)
	r.fence.setTable(r.table)
	subStore := cfg.Subscriptions
	switch {
	case subStore == nil:
		subStore = &subscription.MySQLStore{Primaries: r.pools.Stores, Now: cfg.Now}
	case cfg.MirrorSubscriptions:
		subStore = &subscription.Mirrored{Shared: subStore, Durable: &subscription.MySQLStore{Primaries: r.pools.Stores, Now: cfg.Now}, Log: cfg.Log}
	}
	r.subs = subscription.NewRegistry(subStore, cfg.SubscriptionRefresh, cfg.Now, cfg.Log)
	r.subs.SetLimits(cfg.SubscriptionLimits)
	if err := r.subs.Start(ctx); err != nil {
		return err
	}
	bc, err := r.ownersConfig(cfg.Broker)
	if err != nil {
		return err
	}
	r.broker = broker.New(bc, r.table, clusters, r.subs, replicaWaiter{r.pools.replicas}, r.ids, cfg.Now, cfg.Log)

	// Reads and background jobs over the broker and the endpoints.
	lc := r.eps.cfg.Lookups
	if lc.Archive == nil {
		lc.Archive = r.pools.archive.lookup
	}
	if lc.Leases == nil {
		lc.Leases = leasesOf(r.broker)
	}
	r.lookups = lookup.New(lc, lookupEndpoints{r.eps}, r.table)
	rc := r.eps.cfg.Reconcile
	if rc.Subscriptions == nil {
		rc.Subscriptions = subscriptionsAt(r.subs)
	}
	if rc.ShouldRun == nil {
		rc.ShouldRun = leading // only the router that runs the background jobs
	}
	if r.recon, err = reconcile.New(rc, reconcileEndpoints{r.eps}, r.table); err != nil {
		return err
	}
	r.upkeep = deadletter.New(cfg.DeadLetters, r.broker, r.subs, leading, cfg.Now, cfg.Log)
	r.record = newMapRecorder(r.table, r.pools.Stores, cfg.ReloadEvery, cfg.Now, cfg.Log)
	r.counts = newQueueCounts(r.broker, r.eps)
	r.obs.newQueueHealth(r.metrics, r.counts, r.subs, leading, cfg.Now, cfg.Log)
	r.metrics.MustRegister(haCollector{r.eps, r.recon}, commitCollector{r.broker}, rejectedCollector{r.broker}, ownerCollector{r.broker})
	r.metrics.MustRegister(r.upkeep.Collectors()...)

	// The API over all of it, behind the security checks.
	view := topologyView{source: cfg.Source, table: r.table, fence: r.fence, selfFenced: r.broker.SelfFenced}
	r.api = api.New(observe.WrapBroker(r.broker, r.obs.msgs), cfg.Limits, readyCheck{r.pools, view, cfg.Log}.check, cfg.Log)
	r.api.RouteUI(&api.UISources{History: r.obs.history, Alarms: r.upkeep, Flow: r.obs.msgs})
	r.api.RouteOps(r.lookups, adminOps{eps: r.eps, table: r.table, view: view, stores: r.pools.Stores, recon: r.recon, lookups: r.lookups,
		ready: readyCheck{r.pools, view, cfg.Log}})
	r.api.RouteMetrics(promhttp.HandlerFor(r.metrics, promhttp.HandlerOpts{}))
	r.api.Instrument(api.NewHTTPMetrics(r.metrics))
	if err := r.secure(); err != nil {
		return err
	}
	if err := r.setupReshard(ctx); err != nil {
		return err
	}
	return r.setupRetention()
}

// start follows top and starts the background services.
func (r *Router) start(ctx context.Context, top *topology.Topology) {
	r.eps.applied(top)
	svcs := []service{r.eps.monitor}
	if !r.eps.cfg.NoSchedule {
		svcs = append(svcs, r.recon)
	}
	svcs = append(svcs, r.upkeep, r.record, r.obs.queue)
	if r.cfg.SelfFence != nil {
		svcs = append(svcs, &selfFencer{reg: r.cfg.SelfFence, broker: r.broker, every: 50 * time.Millisecond, log: r.cfg.Log,
			writeOut: func(ctx context.Context) error {
				var errs []error
				for name := range r.pools.Stores() {
					errs = append(errs, r.broker.Owners().WriteOut(ctx, name, func(uint16) bool { return true }))
				}
				return errors.Join(errs...)
			}})
	}
	if r.reshard != nil {
		svcs = append(svcs, r.reshard.manager)
	}
	svcs = append(svcs, r.retention)
	r.services.start(context.Background(), svcs...)
	r.record.now(ctx, top.Map)
}

// connect opens (and migrates) pools for clusters that are new or whose
// primary changed, and returns every cluster for top.
func (r *Router) connect(ctx context.Context, top *topology.Topology) (map[string]broker.Cluster, error) {
	conns, err := r.pools.update(ctx, top, r.eps.checkWritable)
	if err != nil {
		return nil, err
	}
	clusters := make(map[string]broker.Cluster, len(conns))
	for name, c := range conns {
		clusters[name] = c
	}
	return clusters, nil
}

// apply switches to a reloaded topology: connections first, then the map,
// so that no request is routed to a cluster without a pool.
func (r *Router) apply(ctx context.Context, top *topology.Topology) {
	release, current := r.applier.begin(top)
	defer release()
	if !current {
		return // a newer topology arrived while this one waited for a retry
	}
	clusters, err := r.connect(ctx, top)
	if err != nil {
		r.cfg.Log.Error("topology change not applied: cannot reach its clusters; keeping the last one and retrying", "err", err)
		r.applier.retryLater(ctx, top, r.apply)
		return
	}
	r.broker.SetClusters(clusters)
	if top.Map.Version() > r.table.Load().Version() {
		r.record.now(ctx, top.Map) // on the clusters before it routes
	}
	if !r.broker.ApplyMap(ctx, top.Map) {
		r.cfg.Log.Warn("reloaded shard map is older than the one in use; map kept", "version", top.Map.Version(), "current", r.table.Load().Version())
	}
	r.record.kick()
	r.eps.applied(top)
}

// Metrics is the router's Prometheus registry, served on GET /metrics:
// breaker states, replica lag and health, reconciliation counts, and every
// other part's collectors.
func (r *Router) Metrics() *prometheus.Registry { return r.metrics }

// Handler is the router's HTTP handler: the API behind the security
// checks (security.go).
func (r *Router) Handler() http.Handler { return r.sec.handler }

// Broker exposes the broker (tests, load tester).
func (r *Router) Broker() *broker.Broker { return r.broker }

// Stores returns each cluster's primary store by cluster name.
func (r *Router) Stores() map[string]*store.Store { return r.pools.Stores() }

// ClusterHealth is one cluster's readyCheck detail.
type ClusterHealth struct {
	Cluster string `json:"cluster"`
	// State is the cluster's standing in the topology (see
	// clusterStates): serving, stale, no_primary or unknown.
	State  string `json:"state"`
	OK     bool   `json:"ok"`
	Error  string `json:"error,omitempty"`
	Detail string `json:"detail,omitempty"`
}

// readyCheck answers /readyz.
type readyCheck struct {
	pools *pools
	view  topologyView
	log   *slog.Logger
}

// check answers /readyz with every cluster of the shard map and every
// cluster the router holds a pool for: ready while at least one cluster
// answers, since every other cluster's vshards keep serving when one is
// down, but with the clusters that do not answer named as missing
// (degraded).
func (rd readyCheck) check(ctx context.Context) (api.Readiness, error) {
	out := rd.clusters(ctx)
	var missing []string
	for _, h := range out {
		if !h.OK {
			missing = append(missing, h.Cluster)
		}
	}
	detail := rd.view.withStatus(map[string]any{"clusters": out})
	if rd.view.selfFenced != nil && rd.view.selfFenced() {
		return api.Readiness{Detail: detail, Missing: missing}, errors.New("router registration among the live routers is not current: not writing until it is")
	}
	if fs, ok := rd.view.fence.status(); ok && fs.Stale {
		// Writes to the fenced cluster are refused until the map is
		// re-read: not ready (a load balancer sends them elsewhere).
		return api.Readiness{Detail: detail, Missing: missing}, fmt.Errorf("shard map version %d is older than cluster %s's fence %d; re-reading the topology", fs.MapVersion, fs.Cluster, fs.Fence)
	}
	if len(missing) == len(out) {
		return api.Readiness{Detail: detail, Missing: missing}, errors.New("no cluster answers")
	}
	return api.Readiness{Detail: detail, Missing: missing}, nil
}

// clusters asks every cluster of the shard map, and every cluster the
// router holds a pool for, whether it answers now (a ping of its primary
// within a second, all at once), sorted by name.
func (rd readyCheck) clusters(ctx context.Context) []ClusterHealth {
	stores := rd.pools.Stores()
	states := rd.view.clusterStates(stores)
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
				rd.log.Debug("readyCheck: cluster does not answer", "cluster", st.Name, "err", err)
				out[i].OK, out[i].Error = false, "not answering"
			}
		}()
	}
	wg.Wait()
	return out
}

// Close stops the background services, then the broker (which commits
// what is queued), then releases every pool. Safe to call twice, and on a
// router that New did not finish building.
func (r *Router) Close() {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return
	}
	r.closed = true
	r.mu.Unlock()
	r.applier.Stop()
	r.services.Stop()
	r.reshard.stop()
	r.sec.stop()
	if r.eps != nil {
		r.eps.monitor.Stop() // also when New failed before starting it
	}
	if r.subs != nil {
		r.subs.Stop()
	}
	if r.broker != nil {
		r.broker.Close() // commits (and waits for replicas) before the pools close
	}
	if r.pools != nil {
		r.pools.close() // primaries and replicas
	}
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
	if r.cfg.HTTP.MaxConns > 0 {
		l := limitConns(ln, r.cfg.HTTP.MaxConns)
		r.listener.Store(l)
		ln = l
	}
	srv := r.httpServer()
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	r.reloads.run(wctx)
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

// leasesOf answers, for traces, the leases the broker's owners hold in
// memory.
func leasesOf(b *broker.Broker) func(cluster, topic, sub string, id uint64) (lookup.Lease, bool) {
	return func(cluster, topic, sub string, id uint64) (lookup.Lease, bool) {
		for _, o := range b.Owners().Owners(cluster) {
			if u := o.Unit(); u.Topic != topic || u.Subscription != sub {
				continue
			}
			if c, at, exp, ok := o.LeaseOf(id); ok {
				return lookup.Lease{Consumer: c, ClaimedAt: at, Expires: exp}, true
			}
		}
		return lookup.Lease{}, false
	}
}

// ownersConfig completes the owners' configuration (docs/consume.md,
// "Owners"): with an address for other routers (Broker.Owners.Addr), the
// peer that forwards to theirs.
func (r *Router) ownersConfig(bc broker.Config) (broker.Config, error) {
	if bc.Receipts == nil {
		k, err := r.cfg.Security.receipts()
		if err != nil {
			return bc, err
		}
		if r.cfg.Security.ReceiptKeyFile == "" && bc.Owners.Addr != "" {
			r.cfg.Log.Warn("no receipt key file: receipts are signed with a key of this router's own, and other routers refuse them; give every router of a fleet the same -receipt-key-file")
		}
		bc.Receipts = k
	}
	if bc.Owners.Addr == "" || bc.Peer != nil {
		return bc, nil
	}
	var tc *tls.Config
	if r.cfg.Security.TLSCert != "" {
		tc = &tls.Config{MinVersion: tls.VersionTLS12}
		if r.cfg.PeerCA != "" {
			pem, err := os.ReadFile(r.cfg.PeerCA)
			if err != nil {
				return bc, fmt.Errorf("config: peer CA: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return bc, fmt.Errorf("config: peer CA %s holds no certificate", r.cfg.PeerCA)
			}
			tc.RootCAs = pool
		}
	}
	bc.Peer = forward.New(tc, 30*time.Second, bc.Receipts)
	return bc, nil
}
