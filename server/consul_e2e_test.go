package server

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/shardmq/shardmq/internal/consuldouble"
	"github.com/shardmq/shardmq/internal/testbed"
	"github.com/shardmq/shardmq/routing"
	"github.com/shardmq/shardmq/topology/consul"
)

// consulRegister puts a MySQL instance in the double's catalog as Consul
// would list it: service "mysql" with meta cluster and role, one check.
func consulRegister(t *testing.T, c *api.Client, inst *testbed.Instance, role string) {
	t.Helper()
	_, err := c.Catalog().Register(&api.CatalogRegistration{
		Node: "db-" + inst.Name, Address: inst.Host,
		Service: &api.AgentService{ID: "mysql-" + inst.Name, Service: "mysql", Address: inst.Host, Port: inst.Port,
			Meta: map[string]string{consul.MetaCluster: inst.Cluster, consul.MetaRole: role}},
		Checks: api.HealthChecks{{CheckID: "mysql-alive-" + inst.Name, Name: "mysql alive", Status: api.HealthPassing, ServiceID: "mysql-" + inst.Name}},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
}

// consulProduce produces one message and returns its result's status.
func consulProduce(t *testing.T, base, key string) string {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"messages": []any{map[string]any{"key": key, "payload": map[string]any{"k": key}}}})
	resp, err := http.Post(base+"/v1/topics/failover/messages", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Results []struct{ Status string } `json:"results"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || len(out.Results) != 1 {
		t.Fatalf("produce %s: status %d, %v", key, resp.StatusCode, err)
	}
	return out.Results[0].Status
}

func consulHas(t *testing.T, db *sql.DB, key string) bool {
	t.Helper()
	var n int
	if err := db.QueryRow("SELECT COUNT(*) FROM message_store WHERE msg_key = ?", key).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n > 0
}

// A router on Consul (the double) over real MariaDB: when the catalog names
// the promoted replica as the cluster's primary, writes go to it.
func TestConsulPrimarySwapMovesWrites(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	own, err := testbed.Start(ctx, testbed.Spec{Clusters: 1, Replicas: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { own.Stop() })
	const database = "t_consul_failover"
	if err := testbed.CreateDatabase(ctx, own, database); err != nil {
		t.Fatal(err)
	}
	c := own.Clusters[0]
	oldP, newP := c.Primary, c.Replicas[0]

	d := consuldouble.New(consuldouble.Options{})
	t.Cleanup(d.Close)
	capi, err := d.Client()
	if err != nil {
		t.Fatal(err)
	}
	consulRegister(t, capi, oldP, consul.RolePrimary)
	consulRegister(t, capi, newP, consul.RoleReplica)
	m, err := routing.NewMap(1, []routing.Range{{From: 0, To: 1023, Cluster: c.Name}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	src, err := consul.New(consul.Config{Address: d.Addr(), DSN: consul.DSN{User: "root", Database: database}, SessionTTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := src.UpdateShardMap(ctx, 0, m); err != nil {
		t.Fatal(err)
	}

	r, err := New(ctx, Config{Source: src, Subscriptions: src.Subscriptions()})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- r.Run(rctx, ln) }()
	t.Cleanup(func() { stop(); <-ran })
	base := "http://" + ln.Addr().String()

	oldDB, err := sql.Open("mysql", oldP.DSN(database))
	if err != nil {
		t.Fatal(err)
	}
	defer oldDB.Close()
	newDB, err := sql.Open("mysql", newP.DSN(database))
	if err != nil {
		t.Fatal(err)
	}
	defer newDB.Close()

	if st := consulProduce(t, base, "before-swap"); st != "created" {
		t.Fatalf("produce before the swap: %s", st)
	}
	if !consulHas(t, oldDB, "before-swap") {
		t.Fatal("message produced before the swap is not on the old primary")
	}
	if err := testbed.WaitReplicated(ctx, own); err != nil {
		t.Fatal(err)
	}

	// Fail over: promote the replica, then swap the roles in the catalog.
	if err := own.Promote(ctx, newP); err != nil {
		t.Fatal(err)
	}
	swapped := time.Now()
	consulRegister(t, capi, newP, consul.RolePrimary)
	consulRegister(t, capi, oldP, consul.RoleReplica)

	// Writes reach the new primary once the router has applied the change.
	var moved time.Duration
	for i := 0; ; i++ {
		key := "after-swap-" + strconv.Itoa(i)
		if st := consulProduce(t, base, key); st == "created" && consulHas(t, newDB, key) {
			moved = time.Since(swapped)
			break
		}
		if time.Since(swapped) > 10*time.Second {
			t.Fatal("writes did not move to the new primary within 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	for i := 0; i < 5; i++ {
		key := fmt.Sprint("settled-", i)
		if st := consulProduce(t, base, key); st != "created" {
			t.Fatalf("produce %s: %s", key, st)
		}
		if !consulHas(t, newDB, key) || consulHas(t, oldDB, key) {
			t.Fatalf("%s: want it on the new primary only", key)
		}
	}
	t.Logf("writes moved to the new primary %s after the catalog swap", moved)
}
