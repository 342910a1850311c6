package recovery_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/shardmq/shardmq/internal/recovery"
	"github.com/shardmq/shardmq/routing"
	"github.com/shardmq/shardmq/store"
	"github.com/shardmq/shardmq/topology"
	"github.com/shardmq/shardmq/topology/topologytest"
)

func TestRebuildTakesEachVShardsNewestRecord(t *testing.T) {
	t.Parallel()
	rec := func(from, to int, cluster string, v int64) []store.VShardOwner {
		var out []store.VShardOwner
		for i := from; i <= to; i++ {
			out = append(out, store.VShardOwner{VShard: i, Cluster: cluster, MapVersion: v})
		}
		return out
	}
	// c1 recorded map 3 (c1 0-511, c2 512-1023); c2 recorded map 4, which
	// moved 400-511 to c2.
	records := map[string][]store.VShardOwner{
		"c1": append(rec(0, 511, "c1", 3), rec(512, 1023, "c2", 3)...),
		"c2": append(append(rec(0, 399, "c1", 4), rec(400, 511, "c2", 4)...), rec(512, 1023, "c2", 4)...),
	}
	rb, err := recovery.Rebuild(records, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []routing.Range{{From: 0, To: 399, Cluster: "c1"}, {From: 400, To: 1023, Cluster: "c2"}}
	if rb.Newest != 4 || len(rb.Ranges) != 2 || rb.Ranges[0] != want[0] || rb.Ranges[1] != want[1] {
		t.Fatalf("rebuilt %+v (newest %d), want %+v at 4", rb.Ranges, rb.Newest, want)
	}
	m := topologytest.MustMap(4, want...)
	if err := recovery.CheckRebuilt(rb, []topology.AppliedMap{{Router: "a", Version: 4, Digest: m.Digest()}}); err != nil {
		t.Fatalf("router on the recorded map 4: %v", err)
	}
	if err := recovery.CheckRebuilt(rb, []topology.AppliedMap{{Router: "a", Version: 5}}); !errors.Is(err, topology.ErrBehind) {
		t.Fatalf("router ahead of every record: %v, want ErrBehind", err)
	}
	if err := recovery.CheckRebuilt(rb, []topology.AppliedMap{{Router: "a", Version: 4, Digest: "other"}}); !errors.Is(err, topology.ErrBehind) {
		t.Fatalf("router on another map 4: %v, want ErrBehind", err)
	}

	// Two owners under one version: refused.
	records["c1"] = append(records["c1"], store.VShardOwner{VShard: 7, Cluster: "c2", MapVersion: 4})
	if _, err := recovery.Rebuild(records, nil); err == nil || !strings.Contains(err.Error(), "vshard 7 has two owners in version 4") {
		t.Fatalf("conflicting records: %v", err)
	}

	// Vshards nobody recorded follow the fallback, or fail without one.
	partial := map[string][]store.VShardOwner{"c1": rec(0, 99, "c1", 2)}
	if _, err := recovery.Rebuild(partial, nil); err == nil {
		t.Fatal("rebuilt a map with 924 vshards unaccounted for")
	}
	rb, err = recovery.Rebuild(partial, topologytest.MustMap(1, routing.Range{From: 0, To: 1023, Cluster: "c2"}))
	if err != nil || rb.FromFallback != 924 || rb.Ranges[0] != (routing.Range{From: 0, To: 99, Cluster: "c1"}) {
		t.Fatalf("with a fallback: %+v, %v", rb, err)
	}
}
