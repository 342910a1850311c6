package consuldouble

import (
	"context"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/shardmq/shardmq/internal/testtime"
)

func setup(t *testing.T) (*Server, *api.Client) {
	t.Helper()
	s := New(Options{})
	t.Cleanup(s.Close)
	c, err := s.Client()
	if err != nil {
		t.Fatal(err)
	}
	return s, c
}

func TestKVCheckAndSet(t *testing.T) {
	t.Parallel()
	_, c := setup(t)
	kv := c.KV()
	if ok, _, err := kv.CAS(&api.KVPair{Key: "a/b", Value: []byte("1"), ModifyIndex: 0}, nil); !ok || err != nil {
		t.Fatalf("create with cas=0: %v %v", ok, err)
	}
	if ok, _, _ := kv.CAS(&api.KVPair{Key: "a/b", Value: []byte("x"), ModifyIndex: 0}, nil); ok {
		t.Fatal("cas=0 on an existing key succeeded")
	}
	p, meta, err := kv.Get("a/b", nil)
	if err != nil || string(p.Value) != "1" || meta.LastIndex != p.ModifyIndex || p.CreateIndex != p.ModifyIndex {
		t.Fatalf("get = %+v %+v %v", p, meta, err)
	}
	if ok, _, _ := kv.CAS(&api.KVPair{Key: "a/b", Value: []byte("2"), ModifyIndex: p.ModifyIndex + 1}, nil); ok {
		t.Fatal("cas with a wrong index succeeded")
	}
	if ok, _, _ := kv.CAS(&api.KVPair{Key: "a/b", Value: []byte("2"), ModifyIndex: p.ModifyIndex}, nil); !ok {
		t.Fatal("cas with the right index failed")
	}
	kv.Put(&api.KVPair{Key: "a/c/d", Value: []byte("3")}, nil)
	keys, _, _ := kv.Keys("a/", "/", nil)
	if len(keys) != 2 || keys[0] != "a/b" || keys[1] != "a/c/" {
		t.Fatalf("keys with separator = %v", keys)
	}
	if ok, _, _ := kv.DeleteCAS(&api.KVPair{Key: "a/b", ModifyIndex: 1}, nil); ok {
		t.Fatal("delete-cas with a wrong index succeeded")
	}
	kv.DeleteTree("a/", nil)
	if pairs, _, _ := kv.List("a/", nil); len(pairs) != 0 {
		t.Fatalf("after delete tree: %v", pairs)
	}
}

func TestBlockingQueryWaitsForAChange(t *testing.T) {
	t.Parallel()
	_, c := setup(t)
	kv := c.KV()
	kv.Put(&api.KVPair{Key: "k", Value: []byte("1")}, nil)
	_, meta, _ := kv.Get("k", nil)

	// Nothing changes: the query returns after wait with the same index.
	start := time.Now()
	_, m2, err := kv.Get("k", &api.QueryOptions{WaitIndex: meta.LastIndex, WaitTime: 100 * time.Millisecond})
	if err != nil || m2.LastIndex != meta.LastIndex || time.Since(start) < 100*time.Millisecond {
		t.Fatalf("timed-out query: %+v %v after %s", m2, err, time.Since(start))
	}
	// A write elsewhere does not end it early (the key's index is unchanged).
	got := make(chan *api.KVPair, 1)
	go func() {
		p, _, _ := kv.Get("k", &api.QueryOptions{WaitIndex: meta.LastIndex, WaitTime: 5 * time.Second})
		got <- p
	}()
	kv.Put(&api.KVPair{Key: "other", Value: []byte("x")}, nil)
	kv.Put(&api.KVPair{Key: "k", Value: []byte("2")}, nil)
	select {
	case p := <-got:
		if string(p.Value) != "2" {
			t.Fatalf("woke with %q, want 2", p.Value)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("blocking query not woken by the write")
	}
}

func TestSessionsLocksAndLockDelay(t *testing.T) {
	t.Parallel()
	_, c := setup(t)
	kv, ses := c.KV(), c.Session()
	s1, _, err := ses.Create(&api.SessionEntry{TTL: "200ms", Behavior: api.SessionBehaviorRelease, LockDelay: time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	s2, _, _ := ses.CreateNoChecks(&api.SessionEntry{TTL: "10s", Behavior: api.SessionBehaviorDelete, LockDelay: time.Millisecond}, nil)
	if ok, _, _ := kv.Acquire(&api.KVPair{Key: "lock", Value: []byte("one"), Session: s1}, nil); !ok {
		t.Fatal("first acquire failed")
	}
	if ok, _, _ := kv.Acquire(&api.KVPair{Key: "lock", Session: s2}, nil); ok {
		t.Fatal("second session acquired a held lock")
	}
	p, _, _ := kv.Get("lock", nil)
	if p.Session != s1 || p.LockIndex != 1 {
		t.Fatalf("lock = %+v", p)
	}
	// s1 stops renewing: it expires, the lock is released and lock-delay
	// keeps s2 out for a while.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for {
		p, _, err := kv.Get("lock", (&api.QueryOptions{WaitIndex: p.ModifyIndex}).WithContext(ctx))
		if err != nil {
			t.Fatal(err)
		}
		if p.Session == "" {
			break
		}
	}
	if e, _, _ := ses.Renew(s1, nil); e != nil {
		t.Fatal("an expired session was renewed")
	}
	if ok, _, _ := kv.Acquire(&api.KVPair{Key: "lock", Session: s2}, nil); ok {
		t.Fatal("acquired during the lock-delay")
	}
	testtime.Within(t, 3*time.Second, "the lock acquired after the lock-delay", func() bool {
		ok, _, _ := kv.Acquire(&api.KVPair{Key: "lock", Session: s2}, nil)
		return ok
	})
	// Release by the holder needs no lock-delay; destroying a
	// delete-behavior session deletes its keys.
	if ok, _, _ := kv.Release(&api.KVPair{Key: "lock", Session: s1}, nil); ok {
		t.Fatal("a non-holder released the lock")
	}
	kv.Acquire(&api.KVPair{Key: "reg", Session: s2}, nil)
	ses.Destroy(s2, nil)
	if p, _, _ := kv.Get("reg", nil); p != nil {
		t.Fatalf("key of a destroyed delete-behavior session survives: %+v", p)
	}
}

func TestHealthPassingFilter(t *testing.T) {
	t.Parallel()
	_, c := setup(t)
	err := c.Agent().ServiceRegister(&api.AgentServiceRegistration{ID: "db1", Name: "mysql", Port: 3306,
		Meta: map[string]string{"role": "primary"}, Check: &api.AgentServiceCheck{TTL: "10s"}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Catalog().Register(&api.CatalogRegistration{Node: "n2", Address: "10.0.0.2",
		Service: &api.AgentService{ID: "db2", Service: "mysql", Port: 3306},
		Checks:  api.HealthChecks{{CheckID: "node-ok", Status: api.HealthPassing}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	count := func() int {
		es, _, err := c.Health().Service("mysql", "", true, nil)
		if err != nil {
			t.Fatal(err)
		}
		return len(es)
	}
	if n := count(); n != 1 { // db1's TTL check starts critical
		t.Fatalf("%d passing, want 1", n)
	}
	c.Agent().PassTTL("service:db1", "")
	if n := count(); n != 2 {
		t.Fatalf("%d passing, want 2", n)
	}
	// A failing node check takes down the node's services.
	c.Catalog().Register(&api.CatalogRegistration{Node: "n2", Address: "10.0.0.2",
		Checks: api.HealthChecks{{CheckID: "node-ok", Status: api.HealthCritical}}}, nil)
	if n := count(); n != 1 {
		t.Fatalf("%d passing after n2's node check failed, want 1", n)
	}
	all, _, _ := c.Health().Service("mysql", "", false, nil)
	if len(all) != 2 {
		t.Fatalf("%d without the passing filter, want 2", len(all))
	}
}

func TestDownFailsRequests(t *testing.T) {
	t.Parallel()
	s, c := setup(t)
	s.SetDown(true)
	if _, _, err := c.KV().Get("k", nil); err == nil {
		t.Fatal("request succeeded while down")
	}
	s.SetDown(false)
	if _, _, err := c.KV().Get("k", nil); err != nil {
		t.Fatal(err)
	}
}
