package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shardmq/shardmq/internal/consuldouble"
	"github.com/shardmq/shardmq/topology"
	"github.com/shardmq/shardmq/topology/consul"
)

const static = `clusters:
  - name: c1
    primary: "app@tcp(10.0.0.1:3306)/shardmq"
    replicas: ["app@tcp(10.0.0.2:3306)/shardmq"]
  - name: c2
    primary: "app@tcp(10.0.0.3:3307)/shardmq"
shard_map:
  version: 7
  ranges:
    - {from: 0, to: 99, cluster: c1}
    - {from: 100, to: 1023, cluster: c2}
`

func TestSeedFromStaticFile(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := consuldouble.New(consuldouble.Options{})
	defer d.Close()
	path := filepath.Join(t.TempDir(), "topology.yaml")
	if err := os.WriteFile(path, []byte(static), 0o644); err != nil {
		t.Fatal(err)
	}
	o := options{file: path, addr: d.Addr(), prefix: "shardmq/", service: "mysql", register: true}
	var out strings.Builder
	if err := run(ctx, o, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "shard map version 7 stored") {
		t.Fatalf("output:\n%s", out.String())
	}
	src, err := consul.New(consul.Config{Address: d.Addr(), DSN: consul.DSN{User: "app", Database: "shardmq"}})
	if err != nil {
		t.Fatal(err)
	}
	top, err := src.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := topology.LoadFile(path)
	for name, c := range want.Clusters {
		got := top.Clusters[name]
		if got.Primary != c.Primary || strings.Join(got.Replicas, ",") != strings.Join(c.Replicas, ",") {
			t.Errorf("cluster %s from Consul = %+v, want %+v", name, got, c)
		}
	}
	if c, _ := top.Map.Lookup(100); top.Map.Version() != 7 || c != "c2" {
		t.Fatalf("map version %d, vshard 100 on %s", top.Map.Version(), c)
	}

	// Seeding again is refused unless asked to replace.
	o.register = false
	err = run(ctx, o, &out)
	if !errors.Is(err, topology.ErrConflict) {
		t.Fatalf("second seed: err = %v, want a conflict", err)
	}
	o.replace = true
	out.Reset()
	if err := run(ctx, o, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), `"role": "replica"`) || !strings.Contains(out.String(), "shard map version 8 stored") {
		t.Fatalf("output:\n%s", out.String())
	}
}
