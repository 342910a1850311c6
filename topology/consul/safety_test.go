package consul_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/shardmq/shardmq/internal/testtime"
	"github.com/shardmq/shardmq/routing"
	"github.com/shardmq/shardmq/topology"
	"github.com/shardmq/shardmq/topology/consul"
	"github.com/shardmq/shardmq/topology/topologytest"
)

// safetyCases are the scenarios of issue 12, run on the double
// (TestSafetyOnDouble) and on a real agent (TestSafetyOnAgent) alike.
var safetyCases = map[string]func(*testing.T, *env){
	"LeaderSessionDestroyed":         leaderSessionDestroyed,
	"RestartedRouterTakesOver":       restartedRouterTakesOver,
	"VanishedClusterKeepsEndpoints":  vanishedClusterKeepsEndpoints,
	"AgentDataLossKeepsServing":      agentDataLossKeepsServing,
	"StaleHandEditNeverSplits":       staleHandEditNeverSplits,
	"NoSequenceSplitsRouting":        func(t *testing.T, e *env) { noSequenceSplitsRouting(t, e, 1, 25) },
	"RegistrationComesBackAfterWipe": registrationComesBackAfterWipe,
	"EmptyStoreRefusedWithHint":      emptyStoreRefusedWithHint,
}

func TestSafetyOnDouble(t *testing.T) {
	t.Parallel()
	for name, fn := range safetyCases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			fn(t, setup(t))
		})
	}
}

// TestSafetyOnAgent runs the same scenarios against a real Consul agent
// at CONSUL_HTTP_ADDR (`consul agent -dev`).
func TestSafetyOnAgent(t *testing.T) {
	if os.Getenv("CONSUL_HTTP_ADDR") == "" {
		t.Skip("CONSUL_HTTP_ADDR is not set: no real Consul agent to test against")
	}
	t.Parallel()
	for name, fn := range safetyCases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := newAgentEnv(t)
			e.seed(t, topologytest.NewSeed())
			fn(t, e)
		})
	}
}

// More random sequences on the double, where they are cheap.
func TestNoSequenceSplitsRoutingOnDouble(t *testing.T) {
	t.Parallel()
	for seed := uint64(2); seed <= 5; seed++ {
		t.Run(fmt.Sprint("seed-", seed), func(t *testing.T) {
			t.Parallel()
			noSequenceSplitsRouting(t, setup(t), seed, 30)
		})
	}
}

// wipe loses the agent's data as a restarted -dev agent does: on the
// double everything goes; on a shared real agent, this test's keys, the
// sessions holding them and its catalog node.
func (e *env) wipe(t *testing.T) {
	t.Helper()
	if e.double != nil {
		e.double.Wipe()
	} else {
		pairs, _, err := e.api.KV().List(e.prefix, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range pairs {
			if p.Session != "" {
				e.api.Session().Destroy(p.Session, nil)
			}
		}
		if _, err := e.api.KV().DeleteTree(e.prefix, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := e.api.Catalog().Deregister(&api.CatalogDeregistration{Node: e.node}, nil); err != nil {
			t.Fatal(err)
		}
	}
	e.mu.Lock()
	e.primaries = map[string]string{}
	e.mu.Unlock()
}

// clusterRecord stands for the clusters' own record of the shard map
// (store.VShardOwners, written by server.mapRecorder before a router
// routes with a map): it outlives the agent's data.
type clusterRecord struct {
	mu      sync.Mutex
	newest  int64
	digests map[int64]string
}

func (c *clusterRecord) record(m *routing.Map) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.digests == nil {
		c.digests = map[int64]string{}
	}
	c.newest = max(c.newest, m.Version())
	c.digests[m.Version()] = m.Digest()
}

// check is server.checkRecorded: a map older than the record, or another
// map under a recorded version, is refused.
func (c *clusterRecord) check(m *routing.Map) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if m.Version() < c.newest {
		return fmt.Errorf("%w: map %d older than the clusters' record %d", topology.ErrBehind, m.Version(), c.newest)
	}
	if d, ok := c.digests[m.Version()]; ok && d != m.Digest() {
		return fmt.Errorf("%w: map %d differs from the one recorded under its version", topology.ErrBehind, m.Version())
	}
	return nil
}

func (c *clusterRecord) floor() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.newest
}

// testRouter is a router as far as topology goes: registered, loading,
// watching and publishing what it routes with, and keeping a log of the
// maps it applied. Like server.Router on Consul, it records a map on the
// clusters before routing with it and refuses to start on a map the
// clusters' record is past.
type testRouter struct {
	id    string
	src   *consul.Source
	reg   topology.Registration
	table *routing.Table
	stop  func()

	mu       sync.Mutex
	applied  []*routing.Map
	clusters map[string]topology.Cluster
}

// startRouter starts router id of instance as cmd/router does: register,
// load (refused when the stored map is behind the live routers), watch.
func startRouter(t *testing.T, e *env, id, instance string, client *http.Client) (*testRouter, error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cfg := e.config(t)
	cfg.Instance, cfg.HTTPClient = instance, client
	cfg.Log = cfg.Log.With("router", id)
	src := e.source(t, cfg)
	reg, err := src.Register(ctx, id)
	if err != nil {
		cancel()
		return nil, err
	}
	top, err := src.Load(ctx)
	if err == nil {
		err = e.rec.check(top.Map)
	}
	if err != nil {
		reg.Stop()
		cancel()
		return nil, err
	}
	e.rec.record(top.Map)
	r := &testRouter{id: id, src: src, reg: reg, table: routing.NewTable(top.Map), applied: []*routing.Map{top.Map}, clusters: top.Clusters}
	topology.PublishMap(reg, top.Map)
	pub := topology.Publishing(src, reg, r.table.Load)
	done := make(chan struct{})
	go func() {
		defer close(done)
		pub.Watch(ctx, func(top *topology.Topology) {
			if top.Map.Version() > r.table.Load().Version() {
				e.rec.record(top.Map)
			}
			r.table.Store(top.Map)
			r.mu.Lock()
			defer r.mu.Unlock()
			if last := r.applied[len(r.applied)-1]; top.Map != last {
				r.applied = append(r.applied, top.Map)
			}
			r.clusters = top.Clusters
		})
	}()
	var once sync.Once
	r.stop = func() { once.Do(func() { cancel(); <-done; reg.Stop() }) }
	t.Cleanup(r.stop)
	return r, nil
}

func (r *testRouter) current() (*routing.Map, map[string]topology.Cluster) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.table.Load(), r.clusters
}

func (r *testRouter) log() []*routing.Map {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*routing.Map(nil), r.applied...)
}

func restartedRouterTakesOver(t *testing.T, e *env) {
	ctx := testtime.Context(t)
	cut := newCutTransport()
	old, err := startRouter(t, e, "router-1", "host-a 127.0.0.1:8080", &http.Client{Transport: cut})
	if err != nil {
		t.Fatal(err)
	}
	l1 := old.src.Leader("router-1")
	l1.Start(ctx)
	defer l1.Stop()
	if _, err := l1.Leading(ctx); err != nil {
		t.Fatal(err)
	}
	cut.Cut() // the process dies: its sessions live on until their TTL

	// Another process claiming the same id elsewhere is refused...
	if _, err := startRouter(t, e, "router-1", "host-b 127.0.0.1:8080", nil); err == nil || !strings.Contains(err.Error(), "registered by another live router") {
		t.Fatalf("a second live router-1 on another host: err = %v, want refused", err)
	}
	// ...while the restarted process at the same address takes over at
	// once, well before the TTL, and can lead.
	start := time.Now()
	again, err := startRouter(t, e, "router-1", "host-a 127.0.0.1:8080", nil)
	if err != nil {
		t.Fatalf("restarted router-1: %v", err)
	}
	took := time.Since(start)
	if took >= e.ttl {
		t.Fatalf("restart took %s, not less than the session TTL %s", took, e.ttl)
	}
	l2 := again.src.Leader("router-1")
	l2.Start(ctx)
	defer l2.Stop()
	wctx, cancel := context.WithTimeout(ctx, e.ttl/2)
	defer cancel()
	if _, err := l2.Leading(wctx); err != nil {
		t.Fatalf("restarted router-1 does not lead within half a TTL: %v", err)
	}
	routers, err := again.src.Routers(ctx)
	if err != nil || len(routers) != 1 || routers[0].Instance != "host-a 127.0.0.1:8080" {
		t.Fatalf("Routers = %+v, %v; want the restarted router-1 only", routers, err)
	}
	t.Logf("restarted router registered in %s (TTL %s)", took, e.ttl)
}

func stateOf(s *consul.Source, cluster string) string {
	for _, st := range s.ClusterStates() {
		if st.Name == cluster {
			return st.State
		}
	}
	return ""
}

func vanishedClusterKeepsEndpoints(t *testing.T, e *env) {
	ctx := testtime.Context(t)
	r, err := startRouter(t, e, "router-1", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	testtime.Until(t, "both clusters serving", func() bool {
		return stateOf(r.src, "c1") == topology.StateServing && stateOf(r.src, "c2") == topology.StateServing
	})
	// c1's only instance leaves the catalog (deregistered by mistake):
	// empty, not dead, so the router keeps routing to it.
	if _, err := e.api.Catalog().Deregister(&api.CatalogDeregistration{Node: e.node, ServiceID: serviceID(topologytest.C1Primary)}, nil); err != nil {
		t.Fatal(err)
	}
	testtime.Until(t, "c1 stale", func() bool { return stateOf(r.src, "c1") == topology.StateStale })
	if _, clusters := r.current(); !strings.Contains(clusters["c1"].Primary, topologytest.C1Primary) {
		t.Fatalf("c1 = %+v, want its last known primary kept", clusters["c1"])
	}
	if stale, err := r.src.Stale(); stale {
		t.Fatalf("source stale: %v", err)
	}
	// c2's primary turns critical: dead, dropped.
	e.register(t, topologytest.C2Primary, "c2", consul.RolePrimary, api.HealthCritical)
	testtime.Until(t, "c2 without primary", func() bool {
		_, clusters := r.current()
		_, has := clusters["c2"]
		return !has && stateOf(r.src, "c2") == topology.StateNoPrimary
	})
	// A map naming a cluster the catalog never listed (a typo): unknown.
	e.WriteMap(t, 2, []routing.Range{{From: 0, To: 511, Cluster: "c1"}, {From: 512, To: 1000, Cluster: "c2"}, {From: 1001, To: 1023, Cluster: "c3-typo"}})
	testtime.Until(t, "c3-typo unknown", func() bool { return stateOf(r.src, "c3-typo") == topology.StateUnknown })
	// A map that no longer names c1 removes it for good.
	e.WriteMap(t, 3, []routing.Range{{From: 0, To: 1023, Cluster: "c2"}})
	testtime.Until(t, "c1 gone", func() bool {
		_, clusters := r.current()
		_, has := clusters["c1"]
		return !has && stateOf(r.src, "c1") == ""
	})
	// Registered again with a new map naming it, it serves again.
	e.SetPrimary(t, "c1", topologytest.C1Primary)
	e.WriteMap(t, 4, topologytest.SeedRanges)
	testtime.Until(t, "c1 back", func() bool { return stateOf(r.src, "c1") == topology.StateServing })
	_ = ctx
}

func agentDataLossKeepsServing(t *testing.T, e *env) {
	ctx := testtime.Context(t)
	r1, err := startRouter(t, e, "router-1", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := startRouter(t, e, "router-2", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	admin := e.source(t, e.config(t))
	m, err := topology.WriteShardMap(ctx, admin, func(*routing.Map) ([]routing.Range, error) {
		return []routing.Range{{From: 0, To: 99, Cluster: "c1"}, {From: 100, To: 1023, Cluster: "c2"}}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []*testRouter{r1, r2} {
		testtime.Until(t, r.id+" on the new map", func() bool { cur, _ := r.current(); return cur.Version() == m.Version() })
	}

	e.wipe(t) // the agent restarts without its data: no map, no catalog, no sessions

	// The routers re-register with the map they hold and keep routing
	// to every cluster.
	testtime.Until(t, "routers registered again at their version", func() bool {
		applied, err := admin.Applied(ctx)
		top, who := topology.HighestApplied(applied)
		return err == nil && top == m.Version() && len(who) == 2
	})
	for _, r := range []*testRouter{r1, r2} {
		cur, clusters := r.current()
		if cur.Version() != m.Version() || !strings.Contains(clusters["c1"].Primary, topologytest.C1Primary) || !strings.Contains(clusters["c2"].Primary, topologytest.C2Primary) {
			t.Fatalf("%s after the data loss: map %d, clusters %+v; want map %d and both clusters kept", r.id, cur.Version(), clusters, m.Version())
		}
		if st := stateOf(r.src, "c1"); st != topology.StateStale {
			t.Fatalf("%s: c1 is %q, want stale", r.id, st)
		}
	}
	// The routers write the map they hold back: the store has it again
	// and a new router starts on it.
	testtime.Until(t, "map written back by the routers", func() bool {
		got, err := admin.ShardMap(ctx)
		return err == nil && got.Version() == m.Version() && got.Digest() == m.Digest()
	})
	e.SetPrimary(t, "c1", topologytest.C1Primary)
	e.SetPrimary(t, "c2", topologytest.C2Primary)
	r3, err := startRouter(t, e, "router-3", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if cur, _ := r3.current(); cur.Version() != m.Version() {
		t.Fatalf("router-3 started on version %d, want %d", cur.Version(), m.Version())
	}
	// Seeding again as on day one is refused; with -replace it writes
	// above the routers' version, and everyone takes it.
	if _, err := consul.SeedMap(ctx, admin, topologytest.MustMap(1, topologytest.SeedRanges...), false); !errors.Is(err, topology.ErrConflict) {
		t.Fatalf("seeding again: err = %v, want a conflict", err)
	}
	v, err := consul.SeedMap(ctx, admin, topologytest.MustMap(1, topologytest.SeedRanges...), true)
	if err != nil {
		t.Fatal(err)
	}
	if v <= m.Version() {
		t.Fatalf("re-seed wrote version %d, not above the routers' %d", v, m.Version())
	}
	for _, r := range []*testRouter{r1, r2, r3} {
		testtime.Until(t, r.id+" on the re-seeded map", func() bool { cur, _ := r.current(); return cur.Version() == v })
	}
}

// With no router left to write it back, a router does not start on an
// empty store: it says how to recover.
func emptyStoreRefusedWithHint(t *testing.T, e *env) {
	r1, err := startRouter(t, e, "router-1", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	cut := newCutTransport()
	r2, err := startRouter(t, e, "router-2", "", &http.Client{Transport: cut})
	if err != nil {
		t.Fatal(err)
	}
	r1.stop()
	cut.Cut() // router-2 is alive but cut off: it cannot write the map back
	if _, err := e.api.KV().Delete(e.prefix+"shardmap", nil); err != nil {
		t.Fatal(err)
	}
	_, err = startRouter(t, e, "router-3", "", nil)
	if err == nil || !strings.Contains(err.Error(), "consul-seed -recover") || !strings.Contains(err.Error(), "router-2") {
		t.Fatalf("router-3 on an empty store while router-2 applies version 1: err = %v, want refused with the recovery hint", err)
	}
	_ = r2
}

func registrationComesBackAfterWipe(t *testing.T, e *env) {
	ctx := testtime.Context(t)
	b := e.source(t, e.config(t))
	reg, err := b.Register(ctx, "router-1")
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Stop()
	topology.PublishMap(reg, topologytest.MustMap(7, topologytest.SeedRanges...))
	testtime.Until(t, "registration at 7", func() bool {
		rs, err := b.Routers(ctx)
		return err == nil && len(rs) == 1 && rs[0].Applied == 7
	})
	start := time.Now()
	e.wipe(t)
	testtime.Until(t, "registration back at 7", func() bool {
		rs, err := b.Routers(ctx)
		return err == nil && len(rs) == 1 && rs[0].Applied == 7
	})
	t.Logf("registration back %s after the wipe (TTL %s)", time.Since(start), e.ttl)
}

// staleHandEditNeverSplits is the first case of the issue: an older map
// written by hand, then consul-seed -replace, while a router runs on a
// newer one. The running router writes its map back over the older one;
// a router started meanwhile is refused or starts on the newer map, never
// on the older; the re-seed goes above the running router.
func staleHandEditNeverSplits(t *testing.T, e *env) {
	ctx := testtime.Context(t)
	admin := e.source(t, e.config(t))
	r1, err := startRouter(t, e, "router-1", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	for v := int64(2); v <= 4; v++ {
		e.WriteMap(t, v, topologytest.SeedRanges)
	}
	testtime.Until(t, "router-1 at 4", func() bool { cur, _ := r1.current(); return cur.Version() == 4 })
	awaitVersion(t, admin, 4)
	e.WriteMap(t, 2, []routing.Range{{From: 0, To: 1023, Cluster: "c1"}}) // by hand, older
	switch r2, err := startRouter(t, e, "router-2", "", nil); {
	case err == nil:
		if cur, _ := r2.current(); cur.Version() != 4 {
			t.Fatalf("router-2 started on version %d while router-1 routes with 4", cur.Version())
		}
		r2.stop()
	case !errors.Is(err, topology.ErrBehind):
		t.Fatalf("router-2 on the older map: err = %v, want ErrBehind", err)
	}
	testtime.Until(t, "map 4 written back", func() bool {
		m, err := admin.ShardMap(ctx)
		return err == nil && m.Version() == 4 && m.Digest() == topologytest.MustMap(4, topologytest.SeedRanges...).Digest()
	})
	v, err := consul.SeedMap(ctx, admin, topologytest.MustMap(3, []routing.Range{{From: 0, To: 1023, Cluster: "c2"}}...), true)
	if err != nil {
		t.Fatal(err)
	}
	if v != 5 {
		t.Fatalf("consul-seed -replace wrote version %d, want 5 (above router-1's 4)", v)
	}
	r2, err := startRouter(t, e, "router-2", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []*testRouter{r1, r2} {
		testtime.Until(t, r.id+" at 5", func() bool { cur, _ := r.current(); return cur.Version() == 5 })
	}
}

func awaitVersion(t *testing.T, s *consul.Source, v int64) {
	t.Helper()
	testtime.Until(t, fmt.Sprint("a router at ", v), func() bool {
		applied, err := s.Applied(context.Background())
		top, _ := topology.HighestApplied(applied)
		return err == nil && top >= v
	})
}

// noSequenceSplitsRouting drives a random sequence of what operators and
// failures do — seeds (with -replace), writes through WriteShardMap,
// hand edits of any version, agent data loss, router restarts and new
// routers — and checks after every step that the live routers settle on
// one map (the stored one), that no version was ever applied with two
// assignments, and that no router ever went back to a lower version.
// Each step starts once the previous one settled: a hand edit racing a
// write of the same version while it propagates is beyond what
// check-and-set can order (a starting router still refuses the map a live
// router applied differently under its version).
func noSequenceSplitsRouting(t *testing.T, e *env, seed uint64, steps int) {
	ctx := testtime.Context(t)
	rng := rand.New(rand.NewPCG(seed, 12))
	admin := e.source(t, e.config(t))
	randomRanges := func() []routing.Range {
		cut := rng.IntN(1023)
		a, b := "c1", "c2"
		if rng.IntN(2) == 0 {
			a, b = b, a
		}
		return []routing.Range{{From: 0, To: cut, Cluster: a}, {From: cut + 1, To: 1023, Cluster: b}}
	}
	live := map[string]*testRouter{}
	next := 1
	start := func() {
		id := fmt.Sprint("router-", next)
		next++
		r, err := startRouter(t, e, id, "test "+id, nil)
		if err != nil {
			t.Logf("  %s refused: %v", id, err)
			return
		}
		live[id] = r
	}
	start()
	start()
	var highest int64 = 1
	digestOf := map[int64]string{} // every version applied anywhere → its digest
	for step := 0; step < steps; step++ {
		switch op := rng.IntN(7); op {
		case 0: // as consul-seed does: the file's map above the clusters' record
			v, err := consul.SeedMap(ctx, admin, topologytest.MustMap(e.rec.floor()+1, randomRanges()...), true)
			t.Logf("step %d: consul-seed -replace → %d, %v", step, v, err)
		case 1:
			m, err := topology.WriteShardMapAbove(ctx, admin, e.rec.floor(), func(*routing.Map) ([]routing.Range, error) { return randomRanges(), nil })
			t.Logf("step %d: WriteShardMap → %v, %v", step, versionOf(m), err)
		case 2:
			v := int64(1 + rng.IntN(int(highest)+2))
			t.Logf("step %d: hand edit version %d", step, v)
			e.WriteMap(t, v, randomRanges())
		case 3:
			t.Logf("step %d: agent loses its data", step)
			e.wipe(t)
			e.SetPrimary(t, "c1", topologytest.C1Primary)
			e.SetPrimary(t, "c2", topologytest.C2Primary)
		case 4, 5:
			for id, r := range live { // restart one router under its id
				t.Logf("step %d: restart %s", step, id)
				r.stop()
				delete(live, id)
				if again, err := startRouter(t, e, id, "test "+id, nil); err == nil {
					live[id] = again
				} else {
					t.Logf("  %s refused: %v", id, err)
				}
				break
			}
		case 6:
			if len(live) < 3 {
				t.Logf("step %d: start a router", step)
				start()
			}
		}
		// Settle: the live routers agree on one map, the one stored
		// (written back by them if the store lost it or went back).
		// Then the next step: operators act one after the other.
		var agreed *routing.Map
		testtime.WithinState(t, 5*time.Second, fmt.Sprintf("step %d: the live routers routing with the stored map", step), func() (bool, string) {
			agreed = nil
			same := true
			for _, r := range live {
				cur, _ := r.current()
				if agreed == nil {
					agreed = cur
				} else if cur.Version() != agreed.Version() || cur.Digest() != agreed.Digest() {
					same = false
				}
			}
			if stored, err := admin.ShardMap(ctx); same && len(live) > 0 && (err != nil || stored.Version() != agreed.Version()) {
				same = false
			}
			if same {
				return true, ""
			}
			var seen []string
			for id, r := range live {
				cur, _ := r.current()
				seen = append(seen, fmt.Sprintf("%s routes with version %d (%v)", id, cur.Version(), cur.Ranges()))
			}
			return false, strings.Join(seen, "; ")
		})
		for id, r := range live {
			var prev int64
			for _, m := range r.log() {
				if m.Version() < prev {
					t.Fatalf("step %d: %s went from version %d back to %d", step, id, prev, m.Version())
				}
				prev = m.Version()
				if d, ok := digestOf[m.Version()]; ok && d != m.Digest() {
					t.Fatalf("step %d: version %d applied with two assignments", step, m.Version())
				}
				digestOf[m.Version()] = m.Digest()
				highest = max(highest, m.Version())
			}
		}
		if len(live) == 0 {
			start()
		}
	}
	t.Logf("%d steps, %d live routers at the end, highest version %d", steps, len(live), highest)
}

func versionOf(m *routing.Map) int64 {
	if m == nil {
		return 0
	}
	return m.Version()
}
