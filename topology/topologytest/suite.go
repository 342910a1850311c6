// Package topologytest is the one test suite that every topology backend
// passes (the static file, Consul against the in-process double, Consul
// against a real agent): a backend's test calls Run with a way to make a
// fresh store for each test.
package topologytest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardmq/shardmq/internal/testtime"
	"github.com/shardmq/shardmq/routing"
	"github.com/shardmq/shardmq/shard"
	"github.com/shardmq/shardmq/topology"
)

// Seed is the starting state of one test's store: clusters c1 and c2 with
// a primary each, and Map (version 1, c1 owns 0-511, c2 owns 512-1023).
type Seed struct {
	Primaries map[string]string // cluster → primary "host:port"
	Map       *routing.Map
}

// Env is one test's store (a file, a Consul prefix), shared by the backends
// it makes.
type Env interface {
	// Backend returns a new backend over the store. With
	// Features.MultiRouter each one stands for another router.
	Backend(t *testing.T) topology.Backend
	// SetPrimary makes the instance at addr (host:port) the primary of
	// cluster; the previous primary leaves that role.
	SetPrimary(t *testing.T, cluster, addr string)
	// WriteMap stores a shard map as an operator editing the store by hand
	// would, without validation or check-and-set, so that invalid maps
	// can be stored.
	WriteMap(t *testing.T, version int64, ranges []routing.Range)
}

// Features says what a backend supports beyond the common contract.
type Features struct {
	// MultiRouter: backends from one Env are separate routers that see
	// each other (Consul). The static file serves a single router.
	MultiRouter bool
	// Within bounds how long a change may take to reach a watcher.
	// Defaults to 1s.
	Within time.Duration
}

// Run runs the suite. newEnv makes a fresh store holding seed; each test
// gets its own and runs in parallel with the others.
func Run(t *testing.T, f Features, newEnv func(t *testing.T, seed Seed) Env) {
	if f.Within <= 0 {
		f.Within = time.Second
	}
	tests := []struct {
		name  string
		multi bool
		fn    func(*testing.T, Features, Env)
	}{
		{"LoadReturnsTheSeed", false, testLoad},
		{"UpdateReachesWatch", false, testUpdateReachesWatch},
		{"ConflictingUpdateRefused", false, testConflict},
		{"InvalidUpdateRefused", false, testInvalidUpdate},
		{"InvalidStoredMapSkipped", false, testInvalidStoredMap},
		{"PrimaryChangeReachesWatch", false, testPrimaryChange},
		{"BarrierWaitsForRegisteredRouter", false, testBarrier},
		{"LeaderLeadsUntilStopped", false, testLeader},
		{"WritersGoAboveLiveRouters", false, testWritersAboveRouters},
		{"UpdateReachesEveryRouter", true, testUpdateReachesAll},
		{"BarrierWaitsForEveryLiveRouter", true, testBarrierTwoRouters},
		{"LeaderIsExclusiveAndHandsOver", true, testLeaderHandover},
		{"StartRefusesMapBehindLiveRouters", true, testStartRefusesBehind},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.multi && !f.MultiRouter {
				t.Skip("backend serves a single router")
			}
			t.Parallel()
			tc.fn(t, f, newEnv(t, NewSeed()))
		})
	}
}

// Addresses of the seed's primaries and of the instances tests promote.
// Nothing listens there: backends only hand the addresses out.
const (
	C1Primary = "127.0.0.1:13301"
	C2Primary = "127.0.0.1:13302"
	C1Other   = "127.0.0.1:13311"
)

// SeedRanges are the seed map's ranges.
var SeedRanges = []routing.Range{{From: 0, To: 511, Cluster: "c1"}, {From: 512, To: 1023, Cluster: "c2"}}

// NewSeed returns the standard seed.
func NewSeed() Seed {
	return Seed{
		Primaries: map[string]string{"c1": C1Primary, "c2": C2Primary},
		Map:       MustMap(1, SeedRanges...),
	}
}

// MustMap builds a valid map or panics (test data only).
func MustMap(version int64, ranges ...routing.Range) *routing.Map {
	m, err := routing.NewMap(version, ranges, nil)
	if err != nil {
		panic(err)
	}
	return m
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// watcher runs b.Watch and collects what it applies.
type watcher struct {
	mu   sync.Mutex
	seen []*topology.Topology
	news chan struct{}
}

func watch(t *testing.T, b topology.Backend) *watcher {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w := &watcher{news: make(chan struct{}, 1)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		b.Watch(ctx, func(top *topology.Topology) {
			w.mu.Lock()
			w.seen = append(w.seen, top)
			w.mu.Unlock()
			select {
			case w.news <- struct{}{}:
			default:
			}
		})
	}()
	t.Cleanup(func() { cancel(); <-done })
	return w
}

// await waits up to d for an applied topology satisfying ok and returns it.
func (w *watcher) await(t *testing.T, d time.Duration, what string, ok func(*topology.Topology) bool) *topology.Topology {
	t.Helper()
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for {
		w.mu.Lock()
		for _, top := range w.seen {
			if ok(top) {
				w.mu.Unlock()
				return top
			}
		}
		w.mu.Unlock()
		select {
		case <-w.news:
		case <-deadline.C:
			t.Fatalf("%s: not applied within %s", what, d)
		}
	}
}

func (w *watcher) all() []*topology.Topology {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]*topology.Topology(nil), w.seen...)
}

func version(v int64) func(*topology.Topology) bool {
	return func(t *topology.Topology) bool { return t.Map.Version() == v }
}

func hasPrimary(top *topology.Topology, cluster, addr string) bool {
	return strings.Contains(top.Clusters[cluster].Primary, "tcp("+addr+")")
}

func testLoad(t *testing.T, _ Features, env Env) {
	top, err := env.Backend(t).Load(testContext(t))
	if err != nil {
		t.Fatal(err)
	}
	if top.Map.Version() != 1 {
		t.Fatalf("version %d, want 1", top.Map.Version())
	}
	for _, v := range []int{0, 511} {
		if c, _ := top.Map.Lookup(shard.ID(v)); c != "c1" {
			t.Fatalf("vshard %d on %s, want c1", v, c)
		}
	}
	if c, _ := top.Map.Lookup(1023); c != "c2" {
		t.Fatalf("vshard 1023 on %s, want c2", c)
	}
	if !hasPrimary(top, "c1", C1Primary) || !hasPrimary(top, "c2", C2Primary) {
		t.Fatalf("primaries %+v, want c1 at %s and c2 at %s", top.Clusters, C1Primary, C2Primary)
	}
}

func testUpdateReachesWatch(t *testing.T, f Features, env Env) {
	ctx := testContext(t)
	b := env.Backend(t)
	if _, err := b.Load(ctx); err != nil {
		t.Fatal(err)
	}
	w := watch(t, b)
	next := MustMap(2, routing.Range{From: 0, To: 99, Cluster: "c1"}, routing.Range{From: 100, To: 1023, Cluster: "c2"})
	if err := b.UpdateShardMap(ctx, 1, next); err != nil {
		t.Fatal(err)
	}
	top := w.await(t, f.Within, "shard map 2", version(2))
	if c, _ := top.Map.Lookup(100); c != "c2" {
		t.Fatalf("vshard 100 on %s after the update, want c2", c)
	}
	got, err := b.ShardMap(ctx)
	if err != nil || got.Version() != 2 {
		t.Fatalf("ShardMap = %v, %v; want version 2", got, err)
	}
}

func testConflict(t *testing.T, _ Features, env Env) {
	ctx := testContext(t)
	b := env.Backend(t)
	first := MustMap(2, routing.Range{From: 0, To: 99, Cluster: "c1"}, routing.Range{From: 100, To: 1023, Cluster: "c2"})
	if err := b.UpdateShardMap(ctx, 1, first); err != nil {
		t.Fatal(err)
	}
	second := MustMap(2, routing.Range{From: 0, To: 1023, Cluster: "c1"})
	err := b.UpdateShardMap(ctx, 1, second)
	var ce *topology.ConflictError
	if !errors.As(err, &ce) || !errors.Is(err, topology.ErrConflict) || ce.Want != 1 || ce.Have != 2 {
		t.Fatalf("second write from version 1: err = %v, want a ConflictError{Want: 1, Have: 2}", err)
	}
	got, err := b.ShardMap(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if c, _ := got.Lookup(1023); got.Version() != 2 || c != "c2" {
		t.Fatalf("stored map version %d with vshard 1023 on %s: the refused write changed it", got.Version(), c)
	}
}

func testInvalidUpdate(t *testing.T, _ Features, env Env) {
	ctx := testContext(t)
	b := env.Backend(t)
	if err := b.UpdateShardMap(ctx, 1, MustMap(1, SeedRanges...)); !errors.Is(err, topology.ErrInvalid) {
		t.Fatalf("same version: err = %v, want ErrInvalid", err)
	}
	if err := b.UpdateShardMap(ctx, 1, nil); !errors.Is(err, topology.ErrInvalid) {
		t.Fatalf("nil map: err = %v, want ErrInvalid", err)
	}
	if got, err := b.ShardMap(ctx); err != nil || got.Version() != 1 {
		t.Fatalf("ShardMap = %v, %v; want version 1 kept", got, err)
	}
}

func testInvalidStoredMap(t *testing.T, f Features, env Env) {
	ctx := testContext(t)
	b := env.Backend(t)
	if _, err := b.Load(ctx); err != nil {
		t.Fatal(err)
	}
	w := watch(t, b)
	env.WriteMap(t, 2, []routing.Range{{From: 0, To: 1000, Cluster: "c1"}}) // vshards 1001-1023 unassigned
	if _, err := b.ShardMap(ctx); !errors.Is(err, topology.ErrInvalid) {
		t.Fatalf("ShardMap of an invalid stored map: err = %v, want ErrInvalid", err)
	}
	env.WriteMap(t, 3, []routing.Range{{From: 0, To: 1023, Cluster: "c2"}})
	w.await(t, f.Within, "shard map 3", version(3))
	for _, top := range w.all() {
		if top.Map.Version() == 2 {
			t.Fatal("the invalid map 2 was applied")
		}
	}
}

func testPrimaryChange(t *testing.T, f Features, env Env) {
	ctx := testContext(t)
	b := env.Backend(t)
	if _, err := b.Load(ctx); err != nil {
		t.Fatal(err)
	}
	w := watch(t, b)
	env.SetPrimary(t, "c1", C1Other)
	top := w.await(t, f.Within, "new primary of c1", func(top *topology.Topology) bool { return hasPrimary(top, "c1", C1Other) })
	if !hasPrimary(top, "c2", C2Primary) {
		t.Fatalf("c2's primary changed too: %+v", top.Clusters["c2"])
	}
}

func testBarrier(t *testing.T, _ Features, env Env) {
	ctx := testContext(t)
	b := env.Backend(t)
	reg, err := b.Register(ctx, "router-1")
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Stop()
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if err := b.WaitApplied(short, 1); err == nil {
		t.Fatal("WaitApplied passed while the only router has applied nothing")
	}
	reg.Publish(2)
	reg.Publish(1) // lower: ignored
	if err := b.WaitApplied(ctx, 2); err != nil {
		t.Fatal(err)
	}
	reg.Stop()
	reg.Stop()
	if err := b.WaitApplied(ctx, 99); err != nil {
		t.Fatalf("WaitApplied with no live router: %v", err)
	}
}

func testLeader(t *testing.T, _ Features, env Env) {
	ctx := testContext(t)
	l := env.Backend(t).Leader("router-1")
	if l.IsLeader() {
		t.Fatal("leads before Start")
	}
	l.Start(ctx)
	defer l.Stop()
	lost, err := l.Leading(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !l.IsLeader() {
		t.Fatal("Leading returned but IsLeader is false")
	}
	l.Stop()
	select {
	case <-lost:
	case <-ctx.Done():
		t.Fatal("leadership not ended by Stop")
	}
	if l.IsLeader() {
		t.Fatal("still leads after Stop")
	}
	l.Stop()
}

func testUpdateReachesAll(t *testing.T, f Features, env Env) {
	ctx := testContext(t)
	b1, b2 := env.Backend(t), env.Backend(t)
	for _, b := range []topology.Backend{b1, b2} {
		if _, err := b.Load(ctx); err != nil {
			t.Fatal(err)
		}
	}
	w1, w2 := watch(t, b1), watch(t, b2)
	next := MustMap(2, routing.Range{From: 0, To: 1023, Cluster: "c2"})
	start := time.Now()
	if err := b1.UpdateShardMap(ctx, 1, next); err != nil {
		t.Fatal(err)
	}
	w1.await(t, f.Within, "router 1: shard map 2", version(2))
	w2.await(t, f.Within, "router 2: shard map 2", version(2))
	t.Logf("shard map 2 reached both routers in %s", time.Since(start))
	err := b2.UpdateShardMap(ctx, 1, MustMap(2, SeedRanges...))
	if !errors.Is(err, topology.ErrConflict) {
		t.Fatalf("router 2 writing from version 1 after router 1 wrote 2: err = %v, want ErrConflict", err)
	}
}

func testBarrierTwoRouters(t *testing.T, _ Features, env Env) {
	ctx := testContext(t)
	b1, b2 := env.Backend(t), env.Backend(t)
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
	if _, err := b2.Register(ctx, "router-1"); err == nil {
		t.Fatal("a second live registration of router-1 was accepted")
	}
	r1.Publish(2)
	r2.Publish(1)
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if err := b1.WaitApplied(short, 2); err == nil {
		t.Fatal("WaitApplied(2) passed while router-2 is at 1")
	}
	done := make(chan error, 1)
	go func() { done <- b1.WaitApplied(ctx, 2) }()
	r2.Publish(2)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// A router that leaves no longer holds a barrier up.
	go func() { done <- b2.WaitApplied(ctx, 3) }()
	r1.Publish(3)
	r2.Stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func testLeaderHandover(t *testing.T, f Features, env Env) {
	ctx := testContext(t)
	l1, l2 := env.Backend(t).Leader("router-1"), env.Backend(t).Leader("router-2")
	l1.Start(ctx)
	defer l1.Stop()
	if _, err := l1.Leading(ctx); err != nil {
		t.Fatal(err)
	}
	l2.Start(ctx)
	defer l2.Stop()
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if _, err := l2.Leading(short); err == nil {
		t.Fatal("two leaders at once")
	}
	start := time.Now()
	l1.Stop()
	wctx, cancel2 := context.WithTimeout(ctx, f.Within)
	defer cancel2()
	if _, err := l2.Leading(wctx); err != nil {
		t.Fatalf("router-2 did not lead within %s after router-1 resigned: %v", f.Within, err)
	}
	t.Logf("leadership handed over in %s", time.Since(start))
	if l1.IsLeader() {
		t.Fatal("router-1 still leads")
	}
}

// awaitApplied polls b until a live router reports version v.
func awaitApplied(t *testing.T, b topology.Backend, v int64) {
	t.Helper()
	testtime.WithinState(t, 5*time.Second, fmt.Sprint("a live router reporting version ", v), func() (bool, string) {
		applied, err := b.Applied(testContext(t))
		if err == nil {
			if top, _ := topology.HighestApplied(applied); top >= v {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%+v, %v", applied, err)
	})
}

// A router routes with version 5 while the store holds 1 (the store was
// rolled back): a write of version 2 is refused, and WriteShardMap writes
// above 5.
func testWritersAboveRouters(t *testing.T, _ Features, env Env) {
	ctx := testContext(t)
	b := env.Backend(t)
	reg, err := b.Register(ctx, "router-1")
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Stop()
	topology.PublishMap(reg, MustMap(5, SeedRanges...))
	awaitApplied(t, b, 5)
	next := MustMap(2, routing.Range{From: 0, To: 1023, Cluster: "c1"})
	if err := b.UpdateShardMap(ctx, 1, next); !errors.Is(err, topology.ErrBehind) {
		t.Fatalf("writing version 2 under a router at 5: err = %v, want ErrBehind", err)
	}
	written, err := topology.WriteShardMap(ctx, b, func(cur *routing.Map) ([]routing.Range, error) {
		if cur == nil || cur.Version() != 1 {
			t.Errorf("change saw %v, want the stored map 1", cur)
		}
		return next.Ranges(), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if written.Version() != 6 {
		t.Fatalf("WriteShardMap wrote version %d, want 6 (above the router's 5)", written.Version())
	}
	if got, err := b.ShardMap(ctx); err != nil || got.Version() != 6 {
		t.Fatalf("ShardMap = %v, %v; want version 6", got, err)
	}
}

// A router started while live routers apply a newer map than the stored
// one, or another map under the stored version, refuses to load and says
// how to recover.
func testStartRefusesBehind(t *testing.T, _ Features, env Env) {
	ctx := testContext(t)
	b1 := env.Backend(t)
	reg, err := b1.Register(ctx, "router-1")
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Stop()
	applied := MustMap(4, routing.Range{From: 0, To: 99, Cluster: "c1"}, routing.Range{From: 100, To: 1023, Cluster: "c2"})
	topology.PublishMap(reg, applied)
	awaitApplied(t, b1, 4)
	for _, tc := range []struct {
		name    string
		version int64
		ranges  []routing.Range
		refuse  bool
	}{
		{"older map", 3, applied.Ranges(), true},
		{"another map under version 4", 4, SeedRanges, true},
		{"the map router-1 applies", 4, applied.Ranges(), false},
		{"a newer map", 5, SeedRanges, false},
	} {
		env.WriteMap(t, tc.version, tc.ranges)
		_, err := env.Backend(t).Load(ctx)
		switch {
		case tc.refuse && (!errors.Is(err, topology.ErrBehind) || !strings.Contains(err.Error(), "consul-seed -recover")):
			t.Fatalf("%s: Load err = %v, want ErrBehind with the recovery hint", tc.name, err)
		case !tc.refuse && err != nil:
			t.Fatalf("%s: Load: %v", tc.name, err)
		}
	}
}
