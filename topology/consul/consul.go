// Package consul is the production topology backend: MySQL instances are
// Consul services, the shard map and subscriptions live in Consul KV written
// only with check-and-set, routers register under sessions with the
// shard-map version they have applied, and a session lock elects the router
// that runs the background jobs (see docs/consul.md).
package consul

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/hashicorp/consul/api"

	"github.com/shardmq/shardmq/internal/backoff"
	"github.com/shardmq/shardmq/internal/ctxwait"
	"github.com/shardmq/shardmq/routing"
	"github.com/shardmq/shardmq/topology"
)

// Service meta keys and roles of a MySQL instance.
const (
	MetaCluster = "cluster"
	MetaRole    = "role"
	RolePrimary = "primary"
	RoleReplica = "replica"
)

// DSN holds the parts of a MySQL DSN that come from the router's
// configuration; Consul supplies the address.
type DSN struct {
	User     string
	Password string
	Database string
	// Params are extra go-sql-driver/mysql parameters (tls, timeout, …).
	Params map[string]string
}

// Config is the Consul backend's configuration. Zero fields take the
// defaults named.
type Config struct {
	// Address is Consul's HTTP address ("host:port" or a URL). Defaults to
	// CONSUL_HTTP_ADDR, else 127.0.0.1:8500 (the consul/api defaults, which
	// also read CONSUL_HTTP_TOKEN and the TLS variables).
	Address string
	// Token is the ACL token. Defaults to CONSUL_HTTP_TOKEN.
	Token string
	// HTTPClient overrides the HTTP client (tests cut connectivity with it).
	HTTPClient *http.Client
	// Prefix is where shardmq's keys live in KV. Defaults to "shardmq/"; a
	// missing trailing slash is added.
	Prefix string
	// Service is the Consul service name of the MySQL instances. Defaults
	// to "mysql".
	Service string
	// DSN is how the router logs in to every instance.
	DSN DSN
	// SessionTTL is the TTL of router and leader sessions; a dead router's
	// registration and lock go after it (Consul waits up to twice as
	// long). Defaults to 10s, Consul's minimum: a real agent refuses a
	// shorter one (the in-process double accepts it, for tests).
	SessionTTL time.Duration
	// Instance says where this router process runs, e.g. "host
	// 10.0.0.5:8080" (the router binds its listen address before it
	// registers). A router that finds its id registered by a process of
	// the same instance takes that registration over at once: the
	// previous process crashed, since two live ones cannot share a listen
	// address. Empty: a registration held by another session is always
	// refused until its session ends.
	Instance string
	// LockDelay is Consul's lock-delay on the leader lock after its holder's
	// session is invalidated. Defaults to 1ms, in effect none: a leader
	// steps down on its own once it could not renew its session for a TTL,
	// before Consul can invalidate it.
	LockDelay time.Duration
	// Wait is the longest a blocking query waits for a change. Defaults to
	// 1m.
	Wait time.Duration
	// MinBackoff and MaxBackoff bound the wait between retries when Consul
	// fails. Default 100ms and 5s.
	MinBackoff, MaxBackoff time.Duration
	// Log defaults to discarding.
	Log *slog.Logger
}

func (c Config) withDefaults() Config {
	if c.Prefix == "" {
		c.Prefix = "shardmq/"
	}
	if !strings.HasSuffix(c.Prefix, "/") {
		c.Prefix += "/"
	}
	c.Prefix = strings.TrimPrefix(c.Prefix, "/")
	if c.Service == "" {
		c.Service = "mysql"
	}
	if c.SessionTTL <= 0 {
		c.SessionTTL = 10 * time.Second
	}
	if c.LockDelay <= 0 {
		c.LockDelay = time.Millisecond
	}
	if c.Wait <= 0 {
		c.Wait = time.Minute
	}
	if c.MinBackoff <= 0 {
		c.MinBackoff = 100 * time.Millisecond
	}
	if c.MaxBackoff < c.MinBackoff {
		c.MaxBackoff = max(5*time.Second, c.MinBackoff)
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	return c
}

// Source is the Consul backend. Load and Watch give the router its
// topology; the other methods coordinate routers (see topology.Backend).
// Safe for concurrent use; one Source serves one router.
type Source struct {
	cfg Config
	api *api.Client
	log *slog.Logger

	mu        sync.Mutex
	good      *routing.Map // last valid shard map
	mapIndex  uint64       // KV index it was read at
	instances []*api.ServiceEntry
	hIndex    uint64            // health index the instances were read at
	primaries map[string]string // cluster → chosen primary address
	lastKnown map[string]known  // cluster → its last usable endpoints
	states    []topology.ClusterState
	problems  string           // last logged discovery problems
	errs      map[string]error // watcher → last failure; nil entries are healthy
	rejected  error            // why the stored shard map is not in use
	kick      chan struct{}    // a watcher has news for the apply loop
	resetc    chan struct{}    // closed by ResetWatches
	resets    uint64           // ResetWatches calls so far
}

var _ topology.Backend = (*Source)(nil)

// New returns a Consul source. It does not contact Consul.
func New(cfg Config) (*Source, error) {
	cfg = cfg.withDefaults()
	ac := api.DefaultConfig()
	if cfg.Address != "" {
		ac.Address = cfg.Address
	}
	if cfg.Token != "" {
		ac.Token = cfg.Token
	}
	if cfg.HTTPClient != nil {
		ac.HttpClient = cfg.HTTPClient
	}
	c, err := api.NewClient(ac)
	if err != nil {
		return nil, fmt.Errorf("consul client: %w", err)
	}
	return &Source{
		cfg: cfg, api: c, log: cfg.Log,
		primaries: map[string]string{},
		lastKnown: map[string]known{},
		errs:      map[string]error{},
		kick:      make(chan struct{}, 1),
	}, nil
}

// API returns the consul/api client (for tooling such as the seed command).
func (s *Source) API() *api.Client { return s.api }

// Prefix returns the KV prefix, with its trailing slash.
func (s *Source) Prefix() string { return s.cfg.Prefix }

func (s *Source) mapKey() string     { return s.cfg.Prefix + "shardmap" }
func (s *Source) subsPrefix() string { return s.cfg.Prefix + "subscriptions/" }
func (s *Source) routersKey() string { return s.cfg.Prefix + "routers/" }
func (s *Source) leaderKey() string  { return s.cfg.Prefix + "leader" }

// Load implements topology.Source: it reads the shard map and the passing
// instances, and fails when there is no valid shard map (a router does not
// start without one).
func (s *Source) Load(ctx context.Context) (*topology.Topology, error) {
	pair, meta, err := s.api.KV().Get(s.mapKey(), (&api.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return nil, fmt.Errorf("consul: read shard map: %w", err)
	}
	applied, err := s.Applied(ctx)
	if err != nil {
		return nil, err
	}
	m, err := decodeMap(pair)
	if err != nil {
		if top, who := topology.HighestApplied(applied); top > 0 {
			return nil, fmt.Errorf("consul: shard map %s: %w; live routers apply version %d (%s): %s", s.mapKey(), err, top, strings.Join(who, ", "), topology.RecoveryHint)
		}
		return nil, fmt.Errorf("consul: shard map %s: %w", s.mapKey(), err)
	}
	if err := topology.CheckStored(m, applied); err != nil {
		return nil, fmt.Errorf("consul: shard map %s: %w", s.mapKey(), err)
	}
	entries, hmeta, err := s.api.Health().Service(s.cfg.Service, "", false, (&api.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return nil, fmt.Errorf("consul: discover service %q: %w", s.cfg.Service, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.good == nil || m.Version() >= s.good.Version() {
		s.good = m
	}
	s.mapIndex = meta.LastIndex
	s.instances, s.hIndex = entries, hmeta.LastIndex
	return s.buildLocked(), nil
}

// Watch implements topology.Source with blocking queries on the shard map
// and on the service's health: a change reaches apply as soon as Consul
// answers. While Consul fails it retries with backoff, keeping the last
// known topology and reporting itself Stale.
func (s *Source) Watch(ctx context.Context, apply func(*topology.Topology)) {
	s.mu.Lock()
	last := (*topology.Topology)(nil)
	if s.good != nil {
		last = s.buildLocked()
	}
	s.mu.Unlock()

	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); s.watchMap(ctx) }()
	go func() { defer wg.Done(); s.watchHealth(ctx) }()
	defer wg.Wait()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.kick:
		}
		s.mu.Lock()
		var t *topology.Topology
		if s.good != nil {
			t = s.buildLocked()
		}
		s.mu.Unlock()
		if t == nil || (last != nil && last.Map == t.Map && reflect.DeepEqual(last.Clusters, t.Clusters)) {
			continue
		}
		s.log.Info("consul topology changed", "shard_map_version", t.Map.Version(), "clusters", len(t.Clusters))
		apply(t)
		last = t
	}
}

func (s *Source) signal() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// Stale reports whether the topology in use may be behind Consul's: Consul
// cannot be reached, or the stored shard map was rejected. The error says
// why. The router keeps serving with the last known topology meanwhile.
func (s *Source) Stale() (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	for _, w := range []string{"shard map", "discovery"} {
		if err := s.errs[w]; err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", w, err))
		}
	}
	if s.rejected != nil {
		errs = append(errs, s.rejected)
	}
	err := errors.Join(errs...)
	return err != nil, err
}

func (s *Source) setErr(watcher string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	prev := s.errs[watcher]
	s.errs[watcher] = err
	switch {
	case err != nil && prev == nil:
		s.log.Warn("consul unreachable; keeping the last known topology", "watch", watcher, "err", err)
	case err == nil && prev != nil:
		s.log.Info("consul reachable again", "watch", watcher)
	}
}

// resettable returns a context for one blocking query that ResetWatches
// cuts short, the number of resets so far, and a func that ends the
// context, reporting whether it was cut.
func (s *Source) resettable(ctx context.Context) (context.Context, uint64, func() bool) {
	s.mu.Lock()
	if s.resetc == nil {
		s.resetc = make(chan struct{})
	}
	resetc, gen := s.resetc, s.resets
	s.mu.Unlock()
	qctx, cancel := context.WithCancel(ctx)
	cut := make(chan struct{})
	go func() {
		select {
		case <-resetc:
			close(cut)
			cancel()
		case <-qctx.Done():
		}
	}()
	return qctx, gen, func() bool {
		cancel()
		select {
		case <-cut:
			return true
		default:
			return false
		}
	}
}

// ResetWatches cuts every blocking query of this source short, so that it
// starts again from index 0. A registration calls it when its session
// vanished: the agent may have lost its data and restarted its indexes
// low, and a query still waiting for an index above them would not
// return before its wait time.
func (s *Source) ResetWatches() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.resetc != nil {
		close(s.resetc)
	}
	s.resetc = make(chan struct{})
	s.resets++
}

// backoff is the retry wait after n consecutive failures.
func (s *Source) backoff(n int) time.Duration {
	return backoff.Policy{Initial: s.cfg.MinBackoff, Max: s.cfg.MaxBackoff}.Wait(n)
}

// sleep waits d or until ctx is done; false when ctx is done.
func sleep(ctx context.Context, d time.Duration) bool {
	return ctxwait.Sleep(ctx, d) == nil
}

// nextIndex applies Consul's rules for the index of the next blocking
// query: an index that went backwards restarts from 0.
func nextIndex(prev, got uint64) uint64 {
	if got < prev {
		return 0
	}
	return got
}

// blockingLoop runs one blocking query after another from index, calling
// fetch with the index to wait on; fetch returns the result's index. On
// error it retries with backoff, reporting through setErr under name.
func (s *Source) blockingLoop(ctx context.Context, name string, index uint64, fetch func(q *api.QueryOptions) (uint64, error)) {
	fails := 0
	var lastGen uint64
	for ctx.Err() == nil {
		qctx, gen, reset := s.resettable(ctx)
		if gen != lastGen {
			// Reset between two queries: this one must not wait on
			// an index from before.
			index, lastGen = 0, gen
		}
		q := (&api.QueryOptions{WaitIndex: index, WaitTime: s.cfg.Wait}).WithContext(qctx)
		got, err := fetch(q)
		wasReset := reset()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if wasReset {
				index = 0
				continue
			}
			fails++
			s.setErr(name, err)
			if !sleep(ctx, s.backoff(fails)) {
				return
			}
			index = 0 // after an outage, read the current state at once
			continue
		}
		if fails > 0 {
			fails = 0
			s.setErr(name, nil)
		}
		index = nextIndex(index, got)
	}
}

func (s *Source) watchMap(ctx context.Context) {
	s.mu.Lock()
	index := s.mapIndex
	s.mu.Unlock()
	s.blockingLoop(ctx, "shard map", index, func(q *api.QueryOptions) (uint64, error) {
		pair, meta, err := s.api.KV().Get(s.mapKey(), q)
		if err != nil {
			return 0, err
		}
		changed, rejected := s.takeMap(pair, meta.LastIndex)
		if changed {
			s.signal()
		}
		if rejected {
			s.restoreMap(q.Context(), pair)
		}
		return meta.LastIndex, nil
	})
}

// restoreMap writes the map this router routes with back over a stored
// map it rejected as missing (gone with the agent's data) or older than
// the one in use (a hand edit, a store restored from an old backup), with
// check-and-set on what it read: the live routers re-publish what they
// hold, so the store converges on the newest map any of them applied
// and routers that start meanwhile are refused (their map would be older
// than a live router's) rather than split off. A writer's newer map is
// never overwritten: it is not rejected.
func (s *Source) restoreMap(ctx context.Context, pair *api.KVPair) {
	s.mu.Lock()
	good := s.good
	s.mu.Unlock()
	if good == nil {
		return
	}
	var index uint64
	if pair != nil {
		index = pair.ModifyIndex
	}
	ok, _, err := s.api.KV().CAS(&api.KVPair{Key: s.mapKey(), Value: EncodeMap(good), ModifyIndex: index}, (&api.WriteOptions{}).WithContext(ctx))
	switch {
	case err != nil:
		s.log.Warn("consul: shard map not restored", "version", good.Version(), "err", err)
	case ok:
		s.log.Warn("consul: restored the shard map in use over the rejected stored one", "key", s.mapKey(), "version", good.Version())
	}
}

// takeMap validates the stored map and, when it is a newer valid one,
// makes it current (changed). A bad map is logged and the last good one
// kept (rejected, when there is one).
func (s *Source) takeMap(pair *api.KVPair, index uint64) (changed, rejected bool) {
	m, err := decodeMap(pair)
	decodeErr := err
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mapIndex = index
	if err == nil && s.good != nil {
		switch {
		case m.Version() < s.good.Version():
			err = fmt.Errorf("%w: version %d is older than version %d in use", topology.ErrInvalid, m.Version(), s.good.Version())
		case m.Version() == s.good.Version() && !reflect.DeepEqual(m.Ranges(), s.good.Ranges()):
			err = fmt.Errorf("%w: version %d was rewritten with other ranges (a change needs a new version)", topology.ErrInvalid, m.Version())
		}
	}
	if err != nil {
		err = fmt.Errorf("shard map %s rejected, keeping version %d: %w", s.mapKey(), versionOf(s.good), err)
		if s.rejected == nil || s.rejected.Error() != err.Error() {
			s.log.Error("consul shard map rejected; keeping the last good one", "err", err)
		}
		s.rejected = err
		// Written back: a map gone with the agent's data, or an older
		// one. An invalid document or another map under the version
		// in use may be an operator's mistake in progress: reported,
		// left alone (a starting router refuses both).
		older := decodeErr == nil && s.good != nil && m.Version() < s.good.Version()
		return false, s.good != nil && (pair == nil || older)
	}
	if s.rejected != nil {
		s.log.Info("consul shard map valid again", "version", m.Version())
		s.rejected = nil
	}
	if s.good != nil && m.Version() == s.good.Version() {
		return false, false
	}
	s.good = m
	return true, false
}

func versionOf(m *routing.Map) int64 {
	if m == nil {
		return 0
	}
	return m.Version()
}

func (s *Source) watchHealth(ctx context.Context) {
	s.mu.Lock()
	index := s.hIndex
	s.mu.Unlock()
	s.blockingLoop(ctx, "discovery", index, func(q *api.QueryOptions) (uint64, error) {
		entries, meta, err := s.api.Health().Service(s.cfg.Service, "", false, q)
		if err != nil {
			return 0, err
		}
		s.mu.Lock()
		changed := meta.LastIndex != s.hIndex || !reflect.DeepEqual(entries, s.instances)
		s.instances, s.hIndex = entries, meta.LastIndex
		s.mu.Unlock()
		if changed {
			s.signal()
		}
		return meta.LastIndex, nil
	})
}

// addr is where an instance listens: the service address, else its node's.
func addr(e *api.ServiceEntry) string {
	host := e.Service.Address
	if host == "" && e.Node != nil {
		host = e.Node.Address
	}
	return net.JoinHostPort(host, strconv.Itoa(e.Service.Port))
}

// For returns the go-sql-driver DSN of the instance at hostport.
func (d DSN) For(hostport string) string {
	c := mysql.NewConfig()
	c.User, c.Passwd, c.Net, c.Addr, c.DBName = d.User, d.Password, "tcp", hostport, d.Database
	if len(d.Params) > 0 {
		c.Params = make(map[string]string, len(d.Params))
		for k, v := range d.Params {
			c.Params[k] = v
		}
	}
	return c.FormatDSN()
}

// known is a cluster as last seen with a usable primary.
type known struct {
	cluster topology.Cluster
	primary string // address
}

// critical reports whether any check of an instance (node checks and
// maintenance mode included) is critical.
func critical(e *api.ServiceEntry) bool {
	for _, c := range e.Checks {
		if c.Status == api.HealthCritical {
			return true
		}
	}
	return false
}

// buildLocked turns the registered instances and the last good map into a
// topology. Consul telling "dead" from "empty" decides:
//
//   - an instance with a critical check is dead and dropped;
//   - a cluster with instances but without exactly one usable primary is
//     left out (no_primary), so its vshards answer unavailable while
//     every other cluster serves; when two instances claim to be primary
//     the one in use is kept, if it is one of them;
//   - a cluster of the map that vanished from the catalog altogether (an
//     agent that lost its data, a deregistration by mistake) keeps its
//     last known endpoints (stale) until the map stops naming it;
//   - a cluster of the map never seen in the catalog is unknown.
func (s *Source) buildLocked() *topology.Topology {
	type group struct{ primaries, replicas, dead []string }
	groups := map[string]*group{}
	var problems []string
	for _, e := range s.instances {
		if e.Service == nil {
			continue
		}
		cluster, role := e.Service.Meta[MetaCluster], e.Service.Meta[MetaRole]
		if !topology.NameRE.MatchString(cluster) || (role != RolePrimary && role != RoleReplica) {
			problems = append(problems, fmt.Sprintf("instance %s (%s) ignored: meta cluster=%q role=%q", e.Service.ID, addr(e), cluster, role))
			continue
		}
		g := groups[cluster]
		if g == nil {
			g = &group{}
			groups[cluster] = g
		}
		switch {
		case critical(e):
			g.dead = append(g.dead, addr(e))
		case role == RolePrimary:
			g.primaries = append(g.primaries, addr(e))
		default:
			g.replicas = append(g.replicas, addr(e))
		}
	}
	t := &topology.Topology{Clusters: map[string]topology.Cluster{}, Map: s.good}
	// The archive cluster (retention's warm tier) is the instances whose
	// cluster meta is topology.ArchiveName: it holds no vshards.
	if g := groups[topology.ArchiveName]; g != nil {
		delete(groups, topology.ArchiveName)
		if len(g.primaries) == 1 {
			a := topology.Cluster{Name: topology.ArchiveName, Primary: s.cfg.DSN.For(g.primaries[0])}
			sort.Strings(g.replicas)
			for _, r := range g.replicas {
				a.Replicas = append(a.Replicas, s.cfg.DSN.For(r))
			}
			t.Archive = &a
		} else {
			problems = append(problems, fmt.Sprintf("archive cluster has %d usable primaries: archiving waits", len(g.primaries)))
		}
	}
	chosen := map[string]string{}
	states := map[string]topology.ClusterState{}
	for name, g := range groups {
		primary, why := "", ""
		switch {
		case len(g.primaries) == 1:
			primary = g.primaries[0]
		case len(g.primaries) == 0:
			why = fmt.Sprintf("cluster %s has no usable primary (%d critical instances): its vshards are unavailable", name, len(g.dead))
		default:
			sort.Strings(g.primaries)
			for _, p := range g.primaries {
				if p == s.primaries[name] {
					primary = p
				}
			}
			if primary == "" {
				why = fmt.Sprintf("cluster %s has %d usable primaries %v and none is the one in use: its vshards are unavailable", name, len(g.primaries), g.primaries)
			} else {
				problems = append(problems, fmt.Sprintf("cluster %s has %d usable primaries %v: keeping %s", name, len(g.primaries), g.primaries, primary))
			}
		}
		if primary == "" {
			problems = append(problems, why)
			states[name] = topology.ClusterState{Name: name, State: topology.StateNoPrimary, Detail: why}
			delete(s.lastKnown, name)
			continue
		}
		chosen[name] = primary
		sort.Strings(g.replicas)
		c := topology.Cluster{Name: name, Primary: s.cfg.DSN.For(primary)}
		for _, r := range g.replicas {
			c.Replicas = append(c.Replicas, s.cfg.DSN.For(r))
		}
		t.Clusters[name] = c
		s.lastKnown[name] = known{cluster: c, primary: primary}
		states[name] = topology.ClusterState{Name: name, State: topology.StateServing}
	}
	inMap := map[string]bool{}
	if t.Map != nil {
		for _, name := range t.Map.Clusters() {
			inMap[name] = true
			if groups[name] != nil {
				continue
			}
			if k, ok := s.lastKnown[name]; ok {
				why := fmt.Sprintf("cluster %s of shard map %d vanished from the catalog: routing to its last known primary %s until it is registered again, marked critical, or left out of the shard map", name, t.Map.Version(), k.primary)
				problems = append(problems, why)
				t.Clusters[name] = k.cluster
				chosen[name] = k.primary
				states[name] = topology.ClusterState{Name: name, State: topology.StateStale, Detail: why}
				continue
			}
			why := fmt.Sprintf("cluster %s of shard map %d has no instance in the catalog: its vshards are unavailable", name, t.Map.Version())
			problems = append(problems, why)
			states[name] = topology.ClusterState{Name: name, State: topology.StateUnknown, Detail: why}
		}
	}
	for name := range s.lastKnown {
		if groups[name] == nil && !inMap[name] {
			delete(s.lastKnown, name) // left out of the map by an operator
		}
	}
	s.primaries = chosen
	s.states = s.states[:0]
	for _, st := range states {
		s.states = append(s.states, st)
	}
	sort.Slice(s.states, func(i, j int) bool { return s.states[i].Name < s.states[j].Name })
	sort.Strings(problems)
	if p := strings.Join(problems, "; "); p != s.problems {
		s.problems = p
		for _, msg := range problems {
			s.log.Warn("consul discovery: " + msg)
		}
	}
	return t
}

// ClusterStates implements topology.ClusterStater: every cluster of the
// catalog and of the shard map, as the last topology built saw it.
func (s *Source) ClusterStates() []topology.ClusterState {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]topology.ClusterState(nil), s.states...)
}
