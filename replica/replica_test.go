package replica

import (
	"context"
	"testing"
	"time"

	"github.com/shardmq/shardmq/internal/testbed"
	"github.com/shardmq/shardmq/store"
)

func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// setup starts a test bed of one cluster with one replica and returns it,
// that cluster, the test's own database on it and its migrated primary.
func setup(t *testing.T) (*testbed.Bed, *testbed.Cluster, string, *store.Store) {
	t.Helper()
	ctx := context.Background()
	bed, err := testbed.Start(ctx, testbed.Spec{Clusters: 1, Replicas: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bed.Stop() })
	name := testbed.TestDatabase(t, bed, "t_replica_")
	c := bed.Clusters[0]
	primary, err := store.Open(ctx, c.Primary.DSN(name), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { primary.Close() })
	if err := primary.Migrate(ctx, time.Now()); err != nil {
		t.Fatal(err)
	}
	return bed, c, name, primary
}

// The monitor measures a replica's lag from heartbeats, stops offering it
// when its SQL thread stops (its lag then grows past the limit), and offers
// it again once it catches up.
func TestMonitorFollowsReplicaLag(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	ctx := context.Background()
	bed, c, name, primary := setup(t)
	m := New(Config{Every: 50 * time.Millisecond, MaxLag: 300 * time.Millisecond})
	m.Update([]Cluster{{Name: "c1", Primary: Direct{primary}, Replicas: []string{c.Replicas[0].DSN(name)}}})
	m.Start(ctx)
	defer m.Stop()

	var rep Replica
	waitFor(t, 10*time.Second, "replica offered", func() (ok bool) { rep, ok = m.Pick("c1"); return ok })
	if rep.Endpoint != c.Replicas[0].Addr() || rep.Lag < 0 || rep.Lag > 300*time.Millisecond {
		t.Fatalf("picked %+v", rep)
	}
	if _, ok := m.Pick("c9"); ok {
		t.Fatal("picked a replica of an unknown cluster")
	}

	if err := bed.StopReplication(ctx, c.Replicas[0]); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "stopped replica withdrawn", func() bool { _, ok := m.Pick("c1"); return !ok })
	waitFor(t, 5*time.Second, "lag over the limit", func() bool {
		st := m.Status()[0].Replicas[0]
		return !st.SQLRunning && st.LagMS > 300 && !st.Eligible && st.Error == ""
	})
	if best, ok := m.Best("c1"); !ok || best.Lag <= 300*time.Millisecond {
		t.Fatalf("last-resort replica = %+v, %v", best, ok)
	}

	if err := bed.StartReplication(ctx, c.Replicas[0]); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "caught-up replica offered again", func() bool { _, ok := m.Pick("c1"); return ok })

	m.Update([]Cluster{{Name: "c1", Primary: Direct{primary}}})
	if _, ok := m.Pick("c1"); ok {
		t.Fatal("picked a replica the topology no longer lists")
	}
	if st := m.Status(); len(st) != 1 || len(st[0].Replicas) != 0 || st[0].LastHeartbeat.IsZero() {
		t.Fatalf("status = %+v", st)
	}
	m.Stop()
	m.Stop()
}
