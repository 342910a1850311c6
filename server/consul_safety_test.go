package server

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/shardmq/shardmq/internal/consuldouble"
	"github.com/shardmq/shardmq/internal/recovery"
	"github.com/shardmq/shardmq/internal/testbed"
	"github.com/shardmq/shardmq/routing"
	"github.com/shardmq/shardmq/subscription"
	"github.com/shardmq/shardmq/topology"
	"github.com/shardmq/shardmq/topology/consul"
)

// consulRouter is a router wired to Consul as cmd/router wires it:
// registered, publishing what it applies, subscriptions mirrored on the
// clusters, refusing a map older than the clusters' record.
type consulRouter struct {
	r    *Router
	base string
	stop func()
}

func startConsulRouter(t *testing.T, addr, database, id string) (*consulRouter, error) {
	t.Helper()
	ctx := context.Background()
	src, err := consul.New(consul.Config{Address: addr, DSN: consul.DSN{User: "root", Database: database}, SessionTTL: time.Second,
		MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	reg, err := src.Register(ctx, id)
	if err != nil {
		return nil, err
	}
	c := &consulRouter{}
	cfg := Config{
		Source: topology.Publishing(src, reg, func() *routing.Map {
			if c.r == nil {
				return nil
			}
			return c.r.ShardMap()
		}),
		Subscriptions: src.Subscriptions(), MirrorSubscriptions: true,
	}
	ln := listen(t)
	cfg.Broker.Owners.Addr = ln.Addr().String()
	r, err := New(ctx, cfg)
	if err != nil {
		reg.Stop()
		ln.Close()
		return nil, err
	}
	c.r = r
	topology.PublishMap(reg, r.ShardMap())
	rctx, cancel := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- r.Run(rctx, ln) }()
	c.base = "http://" + ln.Addr().String()
	stopped := false
	c.stop = func() {
		if !stopped {
			stopped = true
			cancel()
			<-ran
			reg.Stop()
		}
	}
	t.Cleanup(c.stop)
	return c, nil
}

func ownerRows(t *testing.T, db *sql.DB) (n int, versions []int64, owner50 string) {
	t.Helper()
	if err := db.QueryRow("SELECT COUNT(*) FROM vshard_owner").Scan(&n); err != nil {
		t.Fatal(err)
	}
	rows, err := db.Query("SELECT DISTINCT map_version FROM vshard_owner ORDER BY map_version")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var v int64
		rows.Scan(&v)
		versions = append(versions, v)
	}
	db.QueryRow("SELECT cluster FROM vshard_owner WHERE vshard = 50").Scan(&owner50)
	return n, versions, owner50
}

type readiness struct {
	Status string `json:"status"`
	Detail struct {
		Clusters []ClusterHealth `json:"clusters"`
	} `json:"detail"`
}

func getReady(t *testing.T, base string) (int, readiness) {
	t.Helper()
	resp, err := testClient.Get(base + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out readiness
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, out
}

// The whole recovery path on real MariaDB: a router records each map on
// the clusters; the agent loses its data and an older map is written; a
// new router refuses it and says how to recover; consul-seed -recover
// rebuilds the newest map from the clusters' records; the router starts
// on it with the subscriptions kept on the clusters; /readyz lists every
// cluster of the map with its state.
func TestConsulRecoveryAfterAgentDataLoss(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	ctx := context.Background()
	database := testbed.TestDatabase(t, bed, "t_csafe_")
	d := consuldouble.New(consuldouble.Options{})
	t.Cleanup(d.Close)
	capi, err := api.NewClient(&api.Config{Address: d.Addr(), HttpClient: &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}})
	if err != nil {
		t.Fatal(err)
	}
	catalog := func() {
		for _, c := range bed.Clusters {
			consulRegister(t, capi, c.Primary, consul.RolePrimary)
		}
	}
	catalog()
	admin, err := consul.New(consul.Config{Address: d.Addr(), DSN: consul.DSN{User: "root", Database: database}})
	if err != nil {
		t.Fatal(err)
	}
	first, _ := routing.NewMap(1, []routing.Range{{From: 0, To: 511, Cluster: "c1"}, {From: 512, To: 1023, Cluster: "c2"}}, nil)
	if err := admin.UpdateShardMap(ctx, 0, first); err != nil {
		t.Fatal(err)
	}
	dbs := map[string]*sql.DB{}
	static := &topology.Topology{Clusters: map[string]topology.Cluster{}, Map: first}
	for _, c := range bed.Clusters {
		db, err := sql.Open("mysql", c.Primary.DSN(database))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		dbs[c.Name] = db
		static.Clusters[c.Name] = topology.Cluster{Name: c.Name, Primary: c.Primary.DSN(database)}
	}

	a, err := startConsulRouter(t, d.Addr(), database, "router-a")
	if err != nil {
		t.Fatal(err)
	}
	for name, db := range dbs {
		if n, versions, _ := ownerRows(t, db); n != 1024 || len(versions) != 1 || versions[0] != 1 {
			t.Fatalf("cluster %s: vshard_owner has %d rows at versions %v, want 1024 at 1", name, n, versions)
		}
	}
	// A reshard-like change: vshards 0-99 move to c2.
	moved, err := topology.WriteShardMap(ctx, admin, func(*routing.Map) ([]routing.Range, error) {
		return []routing.Range{{From: 0, To: 99, Cluster: "c2"}, {From: 100, To: 511, Cluster: "c1"}, {From: 512, To: 1023, Cluster: "c2"}}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, func() bool { return a.r.ShardMapVersion() == moved.Version() })
	if v, err := a.r.RecordedMapVersion(ctx); err != nil || v != moved.Version() {
		t.Fatalf("RecordedMapVersion = %d, %v; want %d", v, err, moved.Version())
	}
	for name, db := range dbs {
		if n, versions, owner := ownerRows(t, db); n != 1024 || len(versions) != 1 || versions[0] != 2 || owner != "c2" {
			t.Fatalf("cluster %s: vshard_owner has %d rows at versions %v, vshard 50 on %q; want 1024 at 2, vshard 50 on c2", name, n, versions, owner)
		}
	}
	req, _ := http.NewRequest(http.MethodPut, a.base+"/v1/topics/orders/subscriptions/billing", strings.NewReader(`{"max_attempts":3}`))
	req.Header.Set("Content-Type", "application/json")
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("PUT subscription: %d", resp.StatusCode)
	}
	code, ready := getReady(t, a.base)
	if code != http.StatusOK || len(ready.Detail.Clusters) != 2 || ready.Detail.Clusters[0].State != topology.StateServing || !ready.Detail.Clusters[1].OK {
		t.Fatalf("/readyz = %d %+v, want c1 and c2 serving", code, ready)
	}

	// Every router stops; the agent restarts without its data; someone
	// writes the first map again by hand.
	a.stop()
	d.Wipe()
	catalog()
	if _, err := capi.KV().Put(&api.KVPair{Key: "shardmq/shardmap", Value: consul.EncodeMap(first)}, nil); err != nil {
		t.Fatal(err)
	}
	_, err = startConsulRouter(t, d.Addr(), database, "router-b")
	if !errors.Is(err, topology.ErrBehind) || !strings.Contains(err.Error(), "consul-seed -recover") {
		t.Fatalf("router on map 1 after map 2 was recorded: err = %v, want refused with the recovery hint", err)
	}

	var report strings.Builder
	recovered, err := recovery.Recover(ctx, static, admin, false, &report)
	if err != nil {
		t.Fatalf("recover: %v\n%s", err, report.String())
	}
	if recovered.Version() <= moved.Version() || recovered.Digest() != moved.Digest() {
		t.Fatalf("recovered version %d %v, want map 2's ranges above version 2\n%s", recovered.Version(), recovered.Ranges(), report.String())
	}
	t.Logf("recovery:\n%s", report.String())

	b, err := startConsulRouter(t, d.Addr(), database, "router-b")
	if err != nil {
		t.Fatal(err)
	}
	if c, _ := b.r.ShardMap().Lookup(50); c != "c2" {
		t.Fatalf("vshard 50 on %s after recovery, want c2", c)
	}
	resp, err = testClient.Get(b.base + "/v1/topics/orders/subscriptions/billing")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("subscription after the agent lost its data: %d, want 200 (kept on the clusters)", resp.StatusCode)
	}
	waitFor(t, 10*time.Second, func() bool {
		p, _, err := capi.KV().Get("shardmq/subscriptions/orders/billing", nil)
		return err == nil && p != nil && bytes.Contains(p.Value, []byte(`"max_attempts":3`))
	})

	// A map naming a cluster the catalog never listed: /readyz lists it
	// as unknown and stays ready on the others.
	if _, err := topology.WriteShardMap(ctx, admin, func(*routing.Map) ([]routing.Range, error) {
		return []routing.Range{{From: 0, To: 99, Cluster: "c2"}, {From: 100, To: 511, Cluster: "c1"}, {From: 512, To: 1000, Cluster: "c2"}, {From: 1001, To: 1023, Cluster: "c3"}}, nil
	}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, func() bool {
		code, ready := getReady(t, b.base)
		states := map[string]string{}
		for _, c := range ready.Detail.Clusters {
			states[c.Cluster] = c.State
		}
		return code == http.StatusOK && states["c1"] == topology.StateServing && states["c2"] == topology.StateServing && states["c3"] == topology.StateUnknown
	})
}

// Subscriptions on Consul are mirrored on the clusters: after the agent
// lost its data a live router writes them back, a deleted one stays
// deleted, and one that only Consul had is copied to the clusters.
func TestConsulSubscriptionsSurviveAgentDataLoss(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	ctx := context.Background()
	database := testbed.TestDatabase(t, bed, "t_csubs_")
	d := consuldouble.New(consuldouble.Options{})
	t.Cleanup(d.Close)
	capi, err := api.NewClient(&api.Config{Address: d.Addr(), HttpClient: &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range bed.Clusters {
		consulRegister(t, capi, c.Primary, consul.RolePrimary)
	}
	admin, err := consul.New(consul.Config{Address: d.Addr()})
	if err != nil {
		t.Fatal(err)
	}
	m, _ := routing.NewMap(1, []routing.Range{{From: 0, To: 511, Cluster: "c1"}, {From: 512, To: 1023, Cluster: "c2"}}, nil)
	if err := admin.UpdateShardMap(ctx, 0, m); err != nil {
		t.Fatal(err)
	}
	r, err := startConsulRouter(t, d.Addr(), database, "router-a")
	if err != nil {
		t.Fatal(err)
	}
	do := func(method, path, body string) int {
		t.Helper()
		req, _ := http.NewRequest(method, r.base+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := testClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, sub := range []string{"kept", "gone"} {
		if st := do(http.MethodPut, "/v1/topics/orders/subscriptions/"+sub, `{"max_attempts":4}`); st != http.StatusCreated {
			t.Fatalf("PUT %s: %d", sub, st)
		}
	}
	if st := do(http.MethodDelete, "/v1/topics/orders/subscriptions/gone", ""); st != http.StatusOK && st != http.StatusNoContent {
		t.Fatalf("DELETE gone: %d", st)
	}
	// Made in Consul alone, as before the mirror existed.
	legacy, _ := json.Marshal(subscription.Subscription{Topic: "orders", Name: "legacy", MaxAttempts: 2, CreatedAt: time.Now().UTC()}.WithDefaults())
	if _, err := capi.KV().Put(&api.KVPair{Key: "shardmq/subscriptions/orders/legacy", Value: legacy}, nil); err != nil {
		t.Fatal(err)
	}
	primary, err := sql.Open("mysql", bed.Clusters[0].Primary.DSN(database))
	if err != nil {
		t.Fatal(err)
	}
	defer primary.Close()
	waitFor(t, 10*time.Second, func() bool {
		var n int
		primary.QueryRow("SELECT COUNT(*) FROM subscription WHERE topic = 'orders' AND name = 'legacy' AND deleted = 0").Scan(&n)
		return n == 1
	})

	d.Wipe()
	for _, c := range bed.Clusters {
		consulRegister(t, capi, c.Primary, consul.RolePrimary)
	}
	waitFor(t, 10*time.Second, func() bool {
		kept, _, err1 := capi.KV().Get("shardmq/subscriptions/orders/kept", nil)
		leg, _, err2 := capi.KV().Get("shardmq/subscriptions/orders/legacy", nil)
		return err1 == nil && err2 == nil && kept != nil && leg != nil
	})
	if gone, _, err := capi.KV().Get("shardmq/subscriptions/orders/gone", nil); err != nil || gone != nil {
		t.Fatalf("the deleted subscription came back: %v, %v", gone, err)
	}
	for sub, want := range map[string]int{"kept": http.StatusOK, "legacy": http.StatusOK, "gone": http.StatusNotFound} {
		if st := do(http.MethodGet, "/v1/topics/orders/subscriptions/"+sub, ""); st != want {
			t.Fatalf("GET %s after the agent lost its data: %d, want %d", sub, st, want)
		}
	}
	if got, err := admin.ShardMap(ctx); err != nil || got.Version() != 1 {
		t.Fatalf("shard map after the data loss: %v, %v; want version 1 written back by the router", got, err)
	}
}
