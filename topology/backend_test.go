package topology_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardmq/shardmq/routing"
	"github.com/shardmq/shardmq/topology"
	"github.com/shardmq/shardmq/topology/topologytest"
)

// fileEnv is one test's topology file.
type fileEnv struct {
	path string

	mu        sync.Mutex
	primaries map[string]string
}

func (e *fileEnv) Backend(*testing.T) topology.Backend {
	return topology.NewFileBackend(e.path, 10*time.Millisecond, slog.New(slog.DiscardHandler))
}

// write renders the file from the clusters and the given map section.
func (e *fileEnv) write(t *testing.T, version int64, ranges []routing.Range) {
	t.Helper()
	var b strings.Builder
	b.WriteString("# test topology\nclusters:\n")
	for _, c := range []string{"c1", "c2"} {
		fmt.Fprintf(&b, "  - name: %s\n    primary: \"root@tcp(%s)/shardmq\"\n", c, e.primaries[c])
	}
	fmt.Fprintf(&b, "shard_map:\n  version: %d\n  ranges:\n", version)
	for _, r := range ranges {
		fmt.Fprintf(&b, "    - {from: %d, to: %d, cluster: %s}\n", r.From, r.To, r.Cluster)
	}
	tmp := e.path + ".tmp"
	if err := os.WriteFile(tmp, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, e.path); err != nil {
		t.Fatal(err)
	}
}

func (e *fileEnv) SetPrimary(t *testing.T, cluster, addr string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	m, err := topology.LoadFile(e.path)
	if err != nil {
		t.Fatal(err)
	}
	e.primaries[cluster] = addr
	e.write(t, m.Map.Version(), m.Map.Ranges())
}

func (e *fileEnv) WriteMap(t *testing.T, version int64, ranges []routing.Range) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.write(t, version, ranges)
}

func TestFileBackendSuite(t *testing.T) {
	t.Parallel()
	topologytest.Run(t, topologytest.Features{}, func(t *testing.T, seed topologytest.Seed) topologytest.Env {
		e := &fileEnv{path: filepath.Join(t.TempDir(), "topology.yaml"), primaries: seed.Primaries}
		e.write(t, seed.Map.Version(), seed.Map.Ranges())
		return e
	})
}

func TestFileBackendUpdateKeepsTheRestOfTheFile(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "topology.yaml")
	e := &fileEnv{path: path, primaries: map[string]string{"c1": "127.0.0.1:1", "c2": "127.0.0.1:2"}}
	e.write(t, 1, topologytest.SeedRanges)
	b := topology.NewFileBackend(path, 0, nil)
	next := topologytest.MustMap(2, routing.Range{From: 0, To: 9, Cluster: "c2", Frozen: true}, routing.Range{From: 10, To: 1023, Cluster: "c1"})
	if err := b.UpdateShardMap(context.Background(), 1, next); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"# test topology", "root@tcp(127.0.0.1:2)/shardmq", "version: 2", "{from: 0, to: 9, cluster: c2, frozen: true}"} {
		if !strings.Contains(string(data), want) {
			t.Errorf("rewritten file lacks %q:\n%s", want, data)
		}
	}
	top, err := topology.LoadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if c, st := top.Map.Lookup(9); c != "c2" || st != routing.Frozen {
		t.Fatalf("vshard 9: %s %s, want c2 frozen", c, st)
	}
	// A map naming a cluster the file does not list is refused.
	bad := topologytest.MustMap(3, routing.Range{From: 0, To: 1023, Cluster: "c9"})
	if err := b.UpdateShardMap(context.Background(), 2, bad); err == nil || !strings.Contains(err.Error(), `unknown cluster "c9"`) {
		t.Fatalf("map with an unknown cluster: err = %v", err)
	}
}

func TestSoleLeaderStopsWithContext(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	l := topology.NewSoleLeader()
	l.Start(ctx)
	lost, err := l.Leading(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	<-lost
	if l.IsLeader() {
		t.Fatal("leads after its context ended")
	}
}

func TestFileDocSuite(t *testing.T) {
	t.Parallel()
	topologytest.RunDoc(t, func(t *testing.T) topologytest.Doc {
		return topology.NewFileBackend(filepath.Join(t.TempDir(), "topology.yaml"), 0, nil).ReshardState()
	})
}

// The jobs' document lies beside the topology file, indented, and one
// backend hands out one document (one lock over the file).
func TestFileBackendReshardState(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "topology.yaml")
	b := topology.NewFileBackend(path, 0, nil)
	d := b.ReshardState()
	if d != b.ReshardState() || d.Path != path+".reshard.json" {
		t.Fatalf("ReshardState: %p at %s, then %p", d, d.Path, b.ReshardState())
	}
	if ok, err := d.CompareAndSwap(context.Background(), 0, []byte(`{"version":1,"jobs":[]}`)); !ok || err != nil {
		t.Fatal(ok, err)
	}
	data, err := os.ReadFile(path + ".reshard.json")
	if err != nil || string(data) != "{\n  \"version\": 1,\n  \"jobs\": []\n}" {
		t.Fatalf("file: %q %v", data, err)
	}
}
