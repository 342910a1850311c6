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
	"sort"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/shardmq/shardmq/api"
	"github.com/shardmq/shardmq/broker"
	"github.com/shardmq/shardmq/deadletter"
	"github.com/shardmq/shardmq/internal/idgen"
	"github.com/shardmq/shardmq/rebalance"
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
	// Broker tunes routing and claims (see broker.Config).
	Broker broker.Config
	// Store sizes each cluster's pool (see store.Options).
	Store store.Options
	// Subscriptions is where subscriptions are kept. Defaults to the
	// subscription table on every cluster's primary.
	Subscriptions subscription.Store
	// SubscriptionRefresh is how often subscriptions made through other
	// routers are picked up. Defaults to 1s.
	SubscriptionRefresh time.Duration
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
	return c, nil
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
	ha       *ha      // replicas, breakers, failover, trace, reconciliation (ha.go)
	jobs     *jobs    // dead-letter upkeep and produce metrics (jobs.go)
	reshard  *reshard // resharding jobs and the barrier registration (reshard.go)
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
	r := &Router{cfg: cfg, ids: idgen.New(cfg.Now), conns: map[string]*clusterConn{}}
	r.replicas = &replicaWaiter{r: r, pools: map[string]*store.Store{}}
	r.ha = newHA(r)
	r.jobs = &jobs{}
	if cfg.Store.IDs == nil {
		r.cfg.Store.IDs = r.ids
	}
	if cfg.Store.OnRetry == nil {
		r.cfg.Store.OnRetry = r.jobs.countRetry
	}
	shards, err := r.connect(ctx, top)
	if err != nil {
		r.Close()
		return nil, err
	}
	r.table = routing.NewTable(top.Map)
	subStore := cfg.Subscriptions
	if subStore == nil {
		subStore = &subscription.MySQLStore{Primaries: r.Stores, Now: cfg.Now}
	}
	r.subs = subscription.NewRegistry(subStore, cfg.SubscriptionRefresh, cfg.Now, cfg.Log)
	if err := r.subs.Start(ctx); err != nil {
		r.Close()
		return nil, err
	}
	r.broker = broker.New(cfg.Broker, r.table, shards, r.subs, r.replicas, r.ids, cfg.Now, cfg.Log)
	r.api = api.New(r.broker, cfg.Limits, r.ready, cfg.Log)
	if err := r.ha.start(top); err != nil {
		r.Close()
		return nil, err
	}
	if err := r.setupReshard(ctx); err != nil {
		r.Close()
		return nil, err
	}
	r.startJobs()
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
			st, err := store.Open(gctx, c.Primary, r.cfg.Store)
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
	for name, cc := range r.conns {
		shards[name] = r.ha.shard(name, cc.dsn, cc.store)
	}
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
	if !r.table.Store(top.Map) {
		r.cfg.Log.Warn("reloaded shard map is older than the one in use; map kept", "version", top.Map.Version(), "current", r.table.Load().Version())
	}
	r.ha.applied(top)
}

// Handler is the router's HTTP handler.
func (r *Router) Handler() http.Handler { return r.api }

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
	OK      bool   `json:"ok"`
	Error   string `json:"error,omitempty"`
}

// ready answers /readyz: ready while at least one cluster answers, since
// every other cluster's vshards keep serving when one is down.
func (r *Router) ready(ctx context.Context) (any, error) {
	stores := r.Stores()
	names := make([]string, 0, len(stores))
	for n := range stores {
		names = append(names, n)
	}
	sort.Strings(names)
	out := make([]ClusterHealth, len(names))
	var wg sync.WaitGroup
	for i, n := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			out[i] = ClusterHealth{Cluster: n, OK: true}
			if err := stores[n].Ping(cctx); err != nil {
				out[i] = ClusterHealth{Cluster: n, Error: err.Error()}
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
	r.reshard.stop()
	r.jobs.stop()
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
	r.replicas.close()
}

// Run serves until ctx is done, following topology file changes, then
// drains in-flight requests (up to 10s) and closes the pools.
func (r *Router) Run(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{Handler: r.api, ReadHeaderTimeout: 10 * time.Second}
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go r.cfg.Source.Watch(wctx, func(t *topology.Topology) { r.apply(wctx, t) })
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		r.Close()
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := srv.Shutdown(sctx)
	r.Close()
	return err
}

// Listen opens the configured address.
func (r *Router) Listen() (net.Listener, error) {
	ln, err := net.Listen("tcp", r.cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", r.cfg.Listen, err)
	}
	return ln, nil
}
