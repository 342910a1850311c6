package topology

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const good = `clusters:
  - name: c1
    primary: "root@tcp(127.0.0.1:1)/shardmq"
    replicas: ["root@tcp(127.0.0.1:2)/shardmq"]
  - name: c2
    primary: "root@tcp(127.0.0.1:3)/shardmq"
shard_map:
  version: 4
  ranges:
    - {from: 0, to: 511, cluster: c1}
    - {from: 512, to: 1023, cluster: c2}
`

func TestParseGood(t *testing.T) {
	t.Parallel()
	top, err := Parse("t.yaml", []byte(good))
	if err != nil {
		t.Fatal(err)
	}
	if top.Map.Version() != 4 || len(top.Clusters) != 2 || len(top.Clusters["c1"].Replicas) != 1 {
		t.Fatalf("unexpected topology %+v", top)
	}
	if c, _ := top.Map.Lookup(512); c != "c2" {
		t.Fatalf("vshard 512 on %s", c)
	}
}

func TestParseErrorsNameLineAndField(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, old, new, want string
	}{
		{"overlap", "from: 512, to", "from: 500, to", "t.yaml:11: shard_map.ranges[1]: vshard 500 is also assigned by ranges[0]"},
		{"unknown cluster", "cluster: c2}", "cluster: c9}", `t.yaml:11: shard_map.ranges[1]: unknown cluster "c9"`},
		{"gap", "to: 1023", "to: 1000", "vshards not assigned to any cluster: 1001-1023"},
		{"duplicate cluster", "name: c2", "name: c1", `t.yaml:5: clusters[1].name: cluster "c1" is listed twice`},
		{"no primary", `primary: "root@tcp(127.0.0.1:3)/shardmq"`, `primary: ""`, "t.yaml:6: clusters[1].primary: primary DSN is required"},
		{"unknown field", "version: 4", "version: 4\n  extra: 1", "field extra not found"},
		{"version", "version: 4", "version: 0", "t.yaml:8: shard_map.version"},
	}
	for _, c := range cases {
		_, err := Parse("t.yaml", []byte(strings.Replace(good, c.old, c.new, 1)))
		if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want it to contain %q", c.name, err, c.want)
		}
	}
}

func TestWatchFileAppliesGoodAndIgnoresBad(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "topology.yaml")
	if err := os.WriteFile(path, []byte(good), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := make(chan *Topology, 4)
	go WatchFile(ctx, path, 10*time.Millisecond, slog.New(slog.NewTextHandler(io.Discard, nil)), nil, func(t *Topology) { got <- t })

	if err := os.WriteFile(path, []byte(strings.Replace(good, "to: 1023", "to: 10", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(strings.Replace(good, "version: 4", "version: 5", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	// The watcher reads its first file when its goroutine starts, which may
	// be after the writes above: until it applies one, rewrite version 5
	// (with a comment that changes) so that it sees a change.
	deadline := time.After(5 * time.Second)
	for i := 0; ; i++ {
		select {
		case top := <-got:
			if top.Map.Version() != 5 {
				t.Fatalf("applied version %d, want 5 (the bad file must be skipped)", top.Map.Version())
			}
			return
		case <-deadline:
			t.Fatal("reload not applied within 5s")
		case <-time.After(100 * time.Millisecond):
			if err := os.WriteFile(path, []byte(strings.Replace(good, "version: 4", fmt.Sprintf("version: 5 # %d", i), 1)), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func TestParseArchive(t *testing.T) {
	t.Parallel()
	top, err := Parse("t.yaml", []byte(good+"archive:\n  primary: \"root@tcp(127.0.0.1:9)/archive\"\n  replicas: [\"root@tcp(127.0.0.1:10)/archive\"]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if a := top.Archive; a == nil || a.Name != ArchiveName || a.Primary != "root@tcp(127.0.0.1:9)/archive" || len(a.Replicas) != 1 {
		t.Fatalf("archive = %+v", top.Archive)
	}
	if _, ok := top.Clusters[ArchiveName]; ok || len(top.Clusters) != 2 {
		t.Fatalf("the archive cluster is among the vshard clusters: %v", top.Clusters)
	}
	if top, _ := Parse("t.yaml", []byte(good)); top.Archive != nil {
		t.Fatalf("archive %+v without archive:", top.Archive)
	}
	cases := []struct{ name, doc, want string }{
		{"no primary", good + "archive:\n  replicas: []\n", "t.yaml:12: archive.primary: primary DSN is required"},
		{"named like the archive", strings.Replace(good, "name: c2", "name: archive", 1), `clusters[1].name: "archive" names the archive cluster`},
	}
	for _, c := range cases {
		if _, err := Parse("t.yaml", []byte(c.doc)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want %q", c.name, err, c.want)
		}
	}
}
