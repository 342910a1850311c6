package main

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shardmq/shardmq/internal/consuldouble"
	"github.com/shardmq/shardmq/topology"
	"github.com/shardmq/shardmq/topology/consul"
)

// Nothing listens at the instances' addresses (port 1 refuses at once):
// the seed finds no record of the map on the clusters.
const static = `clusters:
  - name: c1
    primary: "app@tcp(127.0.0.11:1)/shardmq"
    replicas: ["app@tcp(127.0.0.12:1)/shardmq"]
  - name: c2
    primary: "app@tcp(127.0.0.13:1)/shardmq"
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
	if err := run(ctx, o, &out, &out); err != nil {
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
	err = run(ctx, o, &out, &out)
	if !errors.Is(err, topology.ErrConflict) {
		t.Fatalf("second seed: err = %v, want a conflict", err)
	}
	o.replace = true
	out.Reset()
	if err := run(ctx, o, &out, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), `"role": "replica"`) || !strings.Contains(out.String(), "shard map version 8 stored") {
		t.Fatalf("output:\n%s", out.String())
	}
}

// The printed definitions are one agent configuration document whose
// services carry the field names of Consul's configuration files (not Go's
// field names), and -out writes one such file per instance.
func TestPrintedDefinitionsAreAgentConfigFiles(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := consuldouble.New(consuldouble.Options{})
	defer d.Close()
	dir := t.TempDir()
	path := filepath.Join(dir, "topology.yaml")
	if err := os.WriteFile(path, []byte(static), 0o644); err != nil {
		t.Fatal(err)
	}
	o := options{file: path, addr: d.Addr(), prefix: "shardmq/", service: "mysql", skipMap: true}
	var out, info strings.Builder
	if err := run(ctx, o, &out, &info); err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(strings.NewReader(out.String()))
	var doc map[string][]map[string]any
	if err := dec.Decode(&doc); err != nil {
		t.Fatalf("output is not one JSON document: %v\n%s", err, out.String())
	}
	if dec.More() {
		t.Fatalf("output holds more than one JSON document:\n%s", out.String())
	}
	services := doc["services"]
	if len(doc) != 1 || len(services) != 3 {
		t.Fatalf("want {\"services\": [3 instances]}, got:\n%s", out.String())
	}
	checkService(t, services[0], "mysql-c1-primary", "127.0.0.11", "c1", "primary")
	checkService(t, services[1], "mysql-c1-replica1", "127.0.0.12", "c1", "replica")
	checkService(t, services[2], "mysql-c2-primary", "127.0.0.13", "c2", "primary")

	o.outDir = filepath.Join(dir, "consul.d")
	if err := os.Mkdir(o.outDir, 0o755); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := run(ctx, o, &out, &info); err != nil {
		t.Fatal(err)
	}
	if out.Len() != 0 {
		t.Fatalf("with -out nothing is printed, got:\n%s", out.String())
	}
	data, err := os.ReadFile(filepath.Join(o.outDir, "mysql-c2-primary.json"))
	if err != nil {
		t.Fatal(err)
	}
	var one map[string]map[string]any
	if err := json.Unmarshal(data, &one); err != nil || len(one) != 1 {
		t.Fatalf("file is not {\"service\": …}: %v\n%s", err, data)
	}
	checkService(t, one["service"], "mysql-c2-primary", "127.0.0.13", "c2", "primary")

	// With a consul binary at hand (CONSUL_BIN or PATH), the agent's own
	// validator must accept the files.
	bin := os.Getenv("CONSUL_BIN")
	if bin == "" {
		bin, _ = exec.LookPath("consul")
	}
	if bin == "" {
		t.Log("no consul binary (CONSUL_BIN): consul validate not run")
		return
	}
	single := filepath.Join(dir, "all.json")
	o.outDir = ""
	out.Reset()
	if err := run(ctx, o, &out, &info); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(single, []byte(out.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	// An agent's configuration needs a data directory besides services.
	base := filepath.Join(dir, "agent.json")
	if err := os.WriteFile(base, []byte(`{"data_dir": "`+filepath.Join(dir, "data")+`"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, target := range []string{single, filepath.Join(dir, "consul.d")} {
		cmd := exec.Command(bin, "validate", "-quiet", base, target)
		if msg, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("consul validate %s: %v\n%s", target, err, msg)
		}
	}
}

func checkService(t *testing.T, svc map[string]any, id, host, cluster, role string) {
	t.Helper()
	want := map[string]bool{"id": true, "name": true, "address": true, "port": true, "meta": true, "checks": true}
	for k := range svc {
		if !want[k] {
			t.Errorf("service %s: unexpected field %q", id, k)
		}
	}
	meta, _ := svc["meta"].(map[string]any)
	if svc["id"] != id || svc["name"] != "mysql" || svc["address"] != host || meta["cluster"] != cluster || meta["role"] != role {
		t.Errorf("service = %v, want id %s at %s, meta cluster=%s role=%s", svc, id, host, cluster, role)
	}
	checks, _ := svc["checks"].([]any)
	if len(checks) != 1 {
		t.Fatalf("service %s: checks = %v, want one", id, svc["checks"])
	}
	c, _ := checks[0].(map[string]any)
	if tcp, _ := c["tcp"].(string); !strings.HasPrefix(tcp, host+":") || c["interval"] != "5s" || c["timeout"] != "2s" {
		t.Errorf("service %s: check = %v, want a TCP check on its port", id, c)
	}
}
