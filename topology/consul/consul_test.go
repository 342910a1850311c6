package consul_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/shardmq/shardmq/internal/consuldouble"
	"github.com/shardmq/shardmq/internal/testtime"
	"github.com/shardmq/shardmq/routing"
	"github.com/shardmq/shardmq/subscription"
	"github.com/shardmq/shardmq/topology"
	"github.com/shardmq/shardmq/topology/consul"
	"github.com/shardmq/shardmq/topology/topologytest"
)

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// env is one test's Consul state: its own KV prefix, service name and
// catalog node, on the double or on a real agent.
type env struct {
	addr    string
	api     *api.Client
	prefix  string
	service string
	node    string
	ttl     time.Duration
	double  *consuldouble.Server // nil on a real agent

	mu        sync.Mutex
	primaries map[string]string // cluster → primary address
	rec       clusterRecord
}

// newDoubleEnv starts a double for one test.
func newDoubleEnv(t *testing.T) *env {
	t.Helper()
	d := consuldouble.New(consuldouble.Options{})
	t.Cleanup(d.Close)
	// The test's own client opens a connection per request, so that one
	// cut by Wipe (as an agent restart cuts them) is never reused.
	c, err := api.NewClient(&api.Config{Address: d.Addr(), HttpClient: &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}})
	if err != nil {
		t.Fatal(err)
	}
	return &env{addr: d.Addr(), api: c, double: d, ttl: time.Second,
		prefix: "shardmq-test/", service: "mysql", node: "db-node", primaries: map[string]string{}}
}

// newAgentEnv uses the agent at CONSUL_HTTP_ADDR under a unique prefix.
func newAgentEnv(t *testing.T) *env {
	t.Helper()
	addr := os.Getenv("CONSUL_HTTP_ADDR")
	cfg := api.DefaultConfig()
	c, err := api.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	id := randomHex(4)
	e := &env{addr: addr, api: c, ttl: 10 * time.Second,
		prefix: "shardmq-test-" + id + "/", service: "mysql-test-" + id, node: "shardmq-test-" + id, primaries: map[string]string{}}
	t.Cleanup(func() {
		c.KV().DeleteTree(e.prefix, nil)
		c.Catalog().Deregister(&api.CatalogDeregistration{Node: e.node}, nil)
	})
	return e
}

func (e *env) config(t *testing.T) consul.Config {
	return consul.Config{
		Address: e.addr, Prefix: e.prefix, Service: e.service,
		DSN:        consul.DSN{User: "root", Database: "shardmq"},
		SessionTTL: e.ttl, MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond,
		Log: testLog(t),
	}
}

func testLog(t *testing.T) *slog.Logger {
	if os.Getenv("SHARDMQ_TEST_LOG") == "" {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("test", t.Name())
}

func (e *env) source(t *testing.T, cfg consul.Config) *consul.Source {
	t.Helper()
	s, err := consul.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func (e *env) Backend(t *testing.T) topology.Backend { return e.source(t, e.config(t)) }

func serviceID(addr string) string {
	return "mysql-" + strings.NewReplacer(":", "-", ".", "-").Replace(addr)
}

// register puts the instance at addr in the catalog with one check.
func (e *env) register(t *testing.T, addr, cluster, role, status string) {
	t.Helper()
	host, port, _ := net.SplitHostPort(addr)
	p, _ := strconv.Atoi(port)
	id := serviceID(addr)
	_, err := e.api.Catalog().Register(&api.CatalogRegistration{
		Node: e.node, Address: "127.0.0.1",
		Service: &api.AgentService{ID: id, Service: e.service, Address: host, Port: p,
			Meta: map[string]string{consul.MetaCluster: cluster, consul.MetaRole: role}},
		Checks: api.HealthChecks{{Node: e.node, CheckID: "check-" + id, Name: "mysql alive", Status: status, ServiceID: id}},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
}

func (e *env) SetPrimary(t *testing.T, cluster, addr string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	old := e.primaries[cluster]
	e.register(t, addr, cluster, consul.RolePrimary, api.HealthPassing)
	if old != "" && old != addr {
		e.register(t, old, cluster, consul.RoleReplica, api.HealthPassing)
	}
	e.primaries[cluster] = addr
}

func (e *env) WriteMap(t *testing.T, version int64, ranges []routing.Range) {
	t.Helper()
	data, _ := json.Marshal(map[string]any{"version": version, "ranges": ranges})
	if _, err := e.api.KV().Put(&api.KVPair{Key: e.prefix + "shardmap", Value: data}, nil); err != nil {
		t.Fatal(err)
	}
}

func (e *env) seed(t *testing.T, seed topologytest.Seed) {
	t.Helper()
	for c, addr := range seed.Primaries {
		e.SetPrimary(t, c, addr)
	}
	if _, err := e.api.KV().Put(&api.KVPair{Key: e.prefix + "shardmap", Value: consul.EncodeMap(seed.Map)}, nil); err != nil {
		t.Fatal(err)
	}
}

func TestSuiteOnDouble(t *testing.T) {
	t.Parallel()
	topologytest.Run(t, topologytest.Features{MultiRouter: true}, func(t *testing.T, seed topologytest.Seed) topologytest.Env {
		e := newDoubleEnv(t)
		e.seed(t, seed)
		return e
	})
}

// TestSuiteOnAgent runs the same suite against a real Consul agent, e.g.
// `consul agent -dev` with CONSUL_HTTP_ADDR=127.0.0.1:8500.
func TestSuiteOnAgent(t *testing.T) {
	if os.Getenv("CONSUL_HTTP_ADDR") == "" {
		t.Skip("CONSUL_HTTP_ADDR is not set: no real Consul agent to test against")
	}
	t.Parallel()
	topologytest.Run(t, topologytest.Features{MultiRouter: true}, func(t *testing.T, seed topologytest.Seed) topologytest.Env {
		e := newAgentEnv(t)
		e.seed(t, seed)
		return e
	})
}

// setup returns a seeded env on the double.
func setup(t *testing.T) *env {
	t.Helper()
	e := newDoubleEnv(t)
	e.seed(t, topologytest.NewSeed())
	return e
}

// TestFailoverOnAgent runs the failover scenarios (leader handover, primary
// swap and failing checks) against a real agent at CONSUL_HTTP_ADDR.
func TestFailoverOnAgent(t *testing.T) {
	if os.Getenv("CONSUL_HTTP_ADDR") == "" {
		t.Skip("CONSUL_HTTP_ADDR is not set: no real Consul agent to test against")
	}
	t.Parallel()
	for name, fn := range map[string]func(*testing.T, *env){
		"LeaderSessionDestroyed": leaderSessionDestroyed,
		"OnlyPassingInstances":   onlyPassingInstances,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := newAgentEnv(t)
			e.seed(t, topologytest.NewSeed())
			fn(t, e)
		})
	}
}

// cutTransport simulates a router cut off from Consul: once cut, every
// request fails and requests in flight are aborted.
type cutTransport struct {
	base http.RoundTripper

	mu       sync.Mutex
	cut      bool
	inflight map[*http.Request]context.CancelFunc
}

func newCutTransport() *cutTransport {
	return &cutTransport{base: &http.Transport{}, inflight: map[*http.Request]context.CancelFunc{}}
}

func (c *cutTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	ctx, cancel := context.WithCancel(r.Context())
	r = r.WithContext(ctx)
	c.mu.Lock()
	if c.cut {
		c.mu.Unlock()
		cancel()
		return nil, errors.New("network cut")
	}
	c.inflight[r] = cancel
	c.mu.Unlock()
	resp, err := c.base.RoundTrip(r)
	c.mu.Lock()
	delete(c.inflight, r)
	c.mu.Unlock()
	if err != nil {
		cancel()
		return nil, err
	}
	resp.Body = &cancelOnClose{ReadCloser: resp.Body, cancel: cancel}
	return resp, nil
}

func (c *cutTransport) Cut() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cut = true
	for _, cancel := range c.inflight {
		cancel()
	}
}

type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (c *cancelOnClose) Close() error { err := c.ReadCloser.Close(); c.cancel(); return err }

func TestLeaderDeathHandsLockOverWithinTTL(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := testtime.Context(t)
	cut := newCutTransport()
	cfg1 := e.config(t)
	cfg1.HTTPClient = &http.Client{Transport: cut}
	l1 := e.source(t, cfg1).Leader("router-1")
	l2 := e.source(t, e.config(t)).Leader("router-2")
	l1.Start(ctx)
	defer l1.Stop()
	lost1, err := l1.Leading(ctx)
	if err != nil {
		t.Fatal(err)
	}
	l2.Start(ctx)
	defer l2.Stop()

	start := time.Now()
	cut.Cut() // router-1 can no longer renew: as good as dead to Consul
	// The double invalidates a session one TTL after its last renewal,
	// which came at most a third of a TTL before the cut; allow scheduling
	// slack on top.
	wctx, cancel := context.WithTimeout(ctx, e.ttl+500*time.Millisecond)
	defer cancel()
	if _, err := l2.Leading(wctx); err != nil {
		t.Fatalf("router-2 did not take the lock within the session TTL (%s): %v", e.ttl, err)
	}
	took := time.Since(start)
	select {
	case <-lost1:
	case <-ctx.Done():
		t.Fatal("router-1 never stepped down")
	}
	if l1.IsLeader() {
		t.Fatal("router-1 still believes it leads")
	}
	t.Logf("lock handed over %s after router-1 was cut off (TTL %s)", took, e.ttl)
}

func TestLeaderSessionDestroyedHandsOverAtOnce(t *testing.T) {
	t.Parallel()
	leaderSessionDestroyed(t, setup(t))
}

func leaderSessionDestroyed(t *testing.T, e *env) {
	ctx := testtime.Context(t)
	l1 := e.source(t, e.config(t)).Leader("router-1")
	l2 := e.source(t, e.config(t)).Leader("router-2")
	l1.Start(ctx)
	defer l1.Stop()
	lost1, err := l1.Leading(ctx)
	if err != nil {
		t.Fatal(err)
	}
	l2.Start(ctx)
	defer l2.Stop()
	pair, _, err := e.api.KV().Get(e.prefix+"leader", nil)
	if err != nil || pair == nil || string(pair.Value) != "router-1" {
		t.Fatalf("leader key = %+v, %v; want held for router-1", pair, err)
	}
	start := time.Now()
	if _, err := e.api.Session().Destroy(pair.Session, nil); err != nil {
		t.Fatal(err)
	}
	<-lost1
	wctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if _, err := l2.Leading(wctx); err != nil {
		t.Fatalf("router-2 did not lead within 1s of router-1's session ending: %v", err)
	}
	t.Logf("handed over in %s", time.Since(start))
	// router-1 campaigns again with a new session and waits its turn.
	l2.Stop()
	if _, err := l1.Leading(wctx); err != nil {
		t.Fatalf("router-1 did not lead again after router-2 resigned: %v", err)
	}
}

func TestDeadRouterDoesNotHoldTheBarrier(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := testtime.Context(t)
	cut := newCutTransport()
	cfg2 := e.config(t)
	cfg2.HTTPClient = &http.Client{Transport: cut}
	b1, b2 := e.source(t, e.config(t)), e.source(t, cfg2)
	r1, err := b1.Register(ctx, "router-1")
	if err != nil {
		t.Fatal(err)
	}
	defer r1.Stop()
	r2, err := b2.Register(ctx, "router-2")
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Stop()
	r1.Publish(5)
	routers, err := b1.Routers(ctx)
	if err != nil || len(routers) != 2 {
		t.Fatalf("Routers = %+v, %v; want 2", routers, err)
	}
	start := time.Now()
	cut.Cut()
	wctx, cancel := context.WithTimeout(ctx, e.ttl+time.Second)
	defer cancel()
	if err := b1.WaitApplied(wctx, 5); err != nil {
		t.Fatalf("barrier still held by the dead router-2: %v", err)
	}
	t.Logf("dead router dropped from the barrier after %s (TTL %s)", time.Since(start), e.ttl)
}

func TestRegistrationComesBackAfterItsSessionIsLost(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := testtime.Context(t)
	b := e.source(t, e.config(t))
	r, err := b.Register(ctx, "router-1")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	r.Publish(3)
	var first string
	testtime.Until(t, "registration at version 3", func() bool {
		rs, err := b.Routers(ctx)
		if err == nil && len(rs) == 1 && rs[0].Applied == 3 {
			first = rs[0].Session
			return true
		}
		return false
	})
	if _, err := e.api.Session().Destroy(first, nil); err != nil {
		t.Fatal(err)
	}
	testtime.Until(t, "registration under a new session", func() bool {
		rs, err := b.Routers(ctx)
		return err == nil && len(rs) == 1 && rs[0].Session != first && rs[0].Applied == 3
	})
	r.Stop()
	rs, err := b.Routers(ctx)
	if err != nil || len(rs) != 0 {
		t.Fatalf("after Stop: Routers = %+v, %v; want none", rs, err)
	}
}

func TestStaleWhileConsulIsDown(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := testtime.Context(t)
	s := e.source(t, e.config(t))
	if _, err := s.Load(ctx); err != nil {
		t.Fatal(err)
	}
	applied := make(chan *topology.Topology, 16)
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); s.Watch(wctx, func(t *topology.Topology) { applied <- t }) }()
	defer func() { cancel(); <-done }()

	if stale, err := s.Stale(); stale {
		t.Fatalf("stale before any failure: %v", err)
	}
	e.double.SetDown(true)
	testtime.Until(t, "stale while Consul is down", func() bool { stale, _ := s.Stale(); return stale })
	_, err := s.Stale()
	if err == nil || !strings.Contains(err.Error(), "500") {
		t.Fatalf("Stale error = %v, want Consul's failure", err)
	}
	e.double.SetDown(false)
	testtime.Until(t, "fresh once Consul answers", func() bool { stale, _ := s.Stale(); return !stale })
	e.SetPrimary(t, "c1", topologytest.C1Other)
	select {
	case top := <-applied:
		if !strings.Contains(top.Clusters["c1"].Primary, topologytest.C1Other) {
			t.Fatalf("applied %+v, want c1 at %s", top.Clusters["c1"], topologytest.C1Other)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("change after the outage not applied")
	}
}

func TestRejectedMapMakesStaleAndKeepsLastGood(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := testtime.Context(t)
	s := e.source(t, e.config(t))
	if _, err := s.Load(ctx); err != nil {
		t.Fatal(err)
	}
	applied := make(chan *topology.Topology, 16)
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); s.Watch(wctx, func(t *topology.Topology) { applied <- t }) }()
	defer func() { cancel(); <-done }()

	if _, err := e.api.KV().Put(&api.KVPair{Key: e.prefix + "shardmap", Value: []byte(`{"version": 2, "ranges": [{"from": 0, "to": 5, "cluster": "c1"}]}`)}, nil); err != nil {
		t.Fatal(err)
	}
	testtime.Until(t, "rejected map reported", func() bool {
		stale, err := s.Stale()
		return stale && errors.Is(err, topology.ErrInvalid) && strings.Contains(err.Error(), "keeping version 1")
	})
	// An older version than the one in use is refused as well.
	e.WriteMap(t, 3, topologytest.SeedRanges)
	var top *topology.Topology
	select {
	case top = <-applied:
	case <-time.After(5 * time.Second):
		t.Fatal("valid map 3 not applied")
	}
	if top.Map.Version() != 3 {
		t.Fatalf("applied version %d, want 3 (2 is invalid)", top.Map.Version())
	}
	if stale, err := s.Stale(); stale {
		t.Fatalf("still stale after a valid map: %v", err)
	}
	// An older map is refused and the router writes its own back.
	e.WriteMap(t, 2, topologytest.SeedRanges)
	testtime.Until(t, "map 3 written back over the older one", func() bool {
		m, err := s.ShardMap(ctx)
		return err == nil && m.Version() == 3
	})
	select {
	case top := <-applied:
		t.Fatalf("applied version %d after the older map", top.Map.Version())
	default:
	}
}

func TestOnlyPassingInstancesAreUsed(t *testing.T) {
	t.Parallel()
	onlyPassingInstances(t, setup(t))
}

func onlyPassingInstances(t *testing.T, e *env) {
	ctx := testtime.Context(t)
	s := e.source(t, e.config(t))
	if _, err := s.Load(ctx); err != nil {
		t.Fatal(err)
	}
	applied := make(chan *topology.Topology, 16)
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); s.Watch(wctx, func(t *topology.Topology) { applied <- t }) }()
	defer func() { cancel(); <-done }()
	next := func(what string) *topology.Topology {
		t.Helper()
		select {
		case top := <-applied:
			return top
		case <-time.After(time.Second):
			t.Fatalf("%s: not applied within 1s", what)
			return nil
		}
	}

	e.register(t, "127.0.0.1:13321", "c1", consul.RoleReplica, api.HealthPassing)
	if top := next("replica added"); len(top.Clusters["c1"].Replicas) != 1 || !strings.Contains(top.Clusters["c1"].Replicas[0], "127.0.0.1:13321") {
		t.Fatalf("c1 = %+v, want the new replica", top.Clusters["c1"])
	}
	// The primary's check fails: c1 has no primary and leaves the
	// topology (its vshards answer unavailable), c2 stays.
	e.register(t, topologytest.C1Primary, "c1", consul.RolePrimary, api.HealthCritical)
	top := next("primary critical")
	if _, ok := top.Clusters["c1"]; ok || top.Clusters["c2"].Primary == "" {
		t.Fatalf("clusters %+v, want c2 only", top.Clusters)
	}
	e.register(t, topologytest.C1Primary, "c1", consul.RolePrimary, api.HealthPassing)
	if top := next("primary passing again"); !strings.Contains(top.Clusters["c1"].Primary, topologytest.C1Primary) {
		t.Fatalf("c1 = %+v, want its primary back", top.Clusters["c1"])
	}
	// A second instance claiming to be c1's primary does not take over
	// from the one in use; once the old one steps down, it does.
	e.register(t, "127.0.0.1:13321", "c1", consul.RolePrimary, api.HealthPassing)
	if top := next("two primaries"); !strings.Contains(top.Clusters["c1"].Primary, topologytest.C1Primary) {
		t.Fatalf("c1 = %+v, want the primary in use kept", top.Clusters["c1"])
	}
	e.register(t, topologytest.C1Primary, "c1", consul.RoleReplica, api.HealthPassing)
	if top := next("old primary demoted"); !strings.Contains(top.Clusters["c1"].Primary, "127.0.0.1:13321") {
		t.Fatalf("c1 = %+v, want 127.0.0.1:13321 as primary", top.Clusters["c1"])
	}
}

func TestDSNAndAddressFromConsul(t *testing.T) {
	t.Parallel()
	d := consul.DSN{User: "app", Password: "p@ss/word", Database: "shardmq", Params: map[string]string{"tls": "custom", "timeout": "2s"}}
	got := d.For("10.0.0.7:3306")
	want := "app:p@ss/word@tcp(10.0.0.7:3306)/shardmq?timeout=2s&tls=custom"
	if got != want {
		t.Fatalf("DSN = %q, want %q", got, want)
	}

	// A service registered through the agent without an address takes its
	// node's.
	e := newDoubleEnv(t)
	ctx := testtime.Context(t)
	if _, err := e.api.KV().Put(&api.KVPair{Key: e.prefix + "shardmap", Value: consul.EncodeMap(topologytest.MustMap(1, routing.Range{From: 0, To: 1023, Cluster: "c1"}))}, nil); err != nil {
		t.Fatal(err)
	}
	err := e.api.Agent().ServiceRegister(&api.AgentServiceRegistration{
		ID: "mysql-1", Name: "mysql", Port: 3306, Meta: map[string]string{"cluster": "c1", "role": "primary"},
		Check: &api.AgentServiceCheck{TTL: "30s", Status: api.HealthPassing},
	})
	if err != nil {
		t.Fatal(err)
	}
	top, err := e.source(t, e.config(t)).Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if p := top.Clusters["c1"].Primary; p != "root@tcp(127.0.0.1:3306)/shardmq" {
		t.Fatalf("primary DSN %q", p)
	}
	if err := e.api.Agent().FailTTL("service:mysql-1", "down"); err != nil {
		t.Fatal(err)
	}
	top, err = e.source(t, e.config(t)).Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := top.Clusters["c1"]; ok {
		t.Fatalf("c1 = %+v after its check failed, want none", top.Clusters["c1"])
	}
}

func TestLoadWithoutShardMapFails(t *testing.T) {
	t.Parallel()
	e := newDoubleEnv(t)
	_, err := e.source(t, e.config(t)).Load(testtime.Context(t))
	if !errors.Is(err, topology.ErrInvalid) || !strings.Contains(err.Error(), "no shard map stored") {
		t.Fatalf("err = %v, want no shard map stored", err)
	}
}

func TestSubscriptionsInKV(t *testing.T) {
	t.Parallel()
	e := newDoubleEnv(t)
	ctx := testtime.Context(t)
	st := e.source(t, e.config(t)).Subscriptions()
	other := e.source(t, e.config(t)).Subscriptions()

	seen := make(chan []subscription.Subscription, 16)
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); other.Watch(wctx, func(s []subscription.Subscription) { seen <- s }) }()
	defer func() { cancel(); <-done }()
	if got := <-seen; len(got) != 0 {
		t.Fatalf("first watch call: %+v, want none", got)
	}

	sub := subscription.Subscription{Topic: "orders", Name: "billing", Ordered: true}.WithDefaults()
	if err := st.Put(ctx, sub); err != nil {
		t.Fatal(err)
	}
	got := <-seen
	if len(got) != 1 || got[0].Name != "billing" || !got[0].Ordered || got[0].CreatedAt.IsZero() {
		t.Fatalf("watched %+v, want orders/billing", got)
	}
	created := got[0].CreatedAt
	sub.MaxAttempts = 9
	if err := other.Put(ctx, sub); err != nil {
		t.Fatal(err)
	}
	list, err := st.List(ctx)
	if err != nil || len(list) != 1 || list[0].MaxAttempts != 9 || !list[0].CreatedAt.Equal(created) {
		t.Fatalf("List = %+v, %v; want max_attempts 9 and CreatedAt kept", list, err)
	}
	if err := st.Put(ctx, subscription.Subscription{Topic: "orders", Name: "bad name"}.WithDefaults()); !errors.Is(err, subscription.ErrInvalid) {
		t.Fatalf("invalid subscription: err = %v", err)
	}
	// A hand-written invalid document is skipped, not served.
	e.api.KV().Put(&api.KVPair{Key: e.prefix + "subscriptions/orders/broken", Value: []byte("{")}, nil)
	if list, err := st.List(ctx); err != nil || len(list) != 1 {
		t.Fatalf("List with a broken document = %+v, %v", list, err)
	}
	if ok, err := st.Delete(ctx, "orders", "billing"); !ok || err != nil {
		t.Fatalf("Delete = %v, %v", ok, err)
	}
	if ok, err := st.Delete(ctx, "orders", "billing"); ok || err != nil {
		t.Fatalf("second Delete = %v, %v; want false", ok, err)
	}
}

// The archive cluster is the instances whose cluster meta is "archive": it
// is the topology's Archive, not a vshard cluster; and the seed registers
// a static file's archive that way.
func TestArchiveClusterFromConsul(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := testtime.Context(t)
	e.register(t, "127.0.0.1:13390", topology.ArchiveName, consul.RolePrimary, api.HealthPassing)
	e.register(t, "127.0.0.1:13391", topology.ArchiveName, consul.RoleReplica, api.HealthPassing)
	top, err := e.source(t, e.config(t)).Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if a := top.Archive; a == nil || !strings.Contains(a.Primary, "127.0.0.1:13390") || len(a.Replicas) != 1 {
		t.Fatalf("archive = %+v", top.Archive)
	}
	if _, ok := top.Clusters[topology.ArchiveName]; ok {
		t.Fatalf("the archive cluster is among the vshard clusters: %v", top.Clusters)
	}
	static := &topology.Topology{Clusters: map[string]topology.Cluster{}, Archive: &topology.Cluster{Name: topology.ArchiveName, Primary: "root@tcp(127.0.0.1:13390)/a"}}
	defs, err := consul.ServiceDefinitions(static, "mysql")
	if err != nil || len(defs) != 1 || defs[0].Meta[consul.MetaCluster] != topology.ArchiveName || defs[0].Meta[consul.MetaRole] != consul.RolePrimary {
		t.Fatalf("seed of the archive: %v %+v", err, defs)
	}
}
