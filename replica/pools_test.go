package replica

import (
	"context"
	"errors"
	"github.com/shardmq/shardmq/internal/testbed"
	"testing"
	"time"
)

// The registry opens one pool per listed replica DSN and hands out that
// one to every caller; waits are capped so that checks and reads keep
// connections; a replica that leaves the topology has its pool closed, and
// Close closes the rest. A monitor given the registry reads through it and
// leaves it open when it stops.
func TestPoolsOnePerReplica(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	ctx := context.Background()
	_, c, name, primary := setup(t)
	dsn := c.Replicas[0].DSN(name)

	reg := NewPools(PoolConfig{MaxOpen: 4, MaxWaits: 1})
	if _, err := reg.Get(ctx, dsn); !errors.Is(err, ErrNotListed) {
		t.Fatalf("Get before Follow: %v, want ErrNotListed", err)
	}
	reg.Follow(map[string][]string{"c1": {dsn}})
	if got := reg.Replicas("c1"); len(got) != 1 || got[0] != dsn {
		t.Fatalf("Replicas = %v", got)
	}
	a, err := reg.Get(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	b, release, err := reg.Hold(ctx, dsn)
	if err != nil || a != b {
		t.Fatalf("Hold gave %p (%v), Get %p: not the same pool", b, err, a)
	}
	// The one wait slot is taken: a second wait cannot start (its context
	// is already done) until the first gives it back.
	done, cancel := context.WithCancel(ctx)
	cancel()
	if _, _, err := reg.Hold(done, dsn); !errors.Is(err, context.Canceled) {
		t.Fatalf("second Hold with the slot taken: %v", err)
	}
	release()
	_, release, err = reg.Hold(ctx, dsn)
	if err != nil {
		t.Fatalf("Hold after release: %v", err)
	}
	release()

	m := New(Config{Every: 50 * time.Millisecond, MaxLag: 2 * time.Second, Pools: reg})
	m.Update([]Cluster{{Name: "c1", Primary: Direct{primary}, Replicas: []string{dsn}}})
	m.Start(ctx)
	var rep Replica
	waitFor(t, 10*time.Second, "replica offered", func() (ok bool) { rep, ok = m.Pick("c1"); return ok })
	if rep.Store != a || len(reg.DBs()) != 1 {
		t.Fatalf("monitor reads through %p, registry pool %p (%d pools)", rep.Store, a, len(reg.DBs()))
	}
	m.Stop()
	if err := a.Ping(ctx); err != nil {
		t.Fatalf("a registry handed in was closed by the monitor's Stop: %v", err)
	}

	// The replica leaves: its pool closes, and it gets none again.
	reg.Follow(map[string][]string{"c1": nil})
	if _, open := reg.Peek(dsn); open {
		t.Fatal("pool of a replica that left still listed")
	}
	waitFor(t, 5*time.Second, "pool of a replica that left closed", func() bool { return a.Ping(ctx) != nil })
	if _, err := reg.Get(ctx, dsn); !errors.Is(err, ErrNotListed) {
		t.Fatalf("Get after the replica left: %v", err)
	}

	// Listed again: a new pool; Close closes it and refuses later calls.
	reg.Follow(map[string][]string{"c1": {dsn}})
	again, err := reg.Get(ctx, dsn)
	if err != nil || again == a {
		t.Fatalf("Get after the replica came back: %p, %v", again, err)
	}
	reg.Close()
	reg.Close()
	if err := again.Ping(ctx); err == nil {
		t.Fatal("pool open after Close")
	}
	if _, err := reg.Get(ctx, dsn); err == nil {
		t.Fatal("Get after Close")
	}
}
