package topology_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/shardmq/shardmq/routing"
	"github.com/shardmq/shardmq/topology"
	"github.com/shardmq/shardmq/topology/topologytest"
)

func TestNextVersionIsAboveStoredAndEveryRouter(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		stored  int64
		applied []topology.AppliedMap
		want    int64
	}{
		{"nothing stored, no router", 0, nil, 1},
		{"stored ahead", 7, []topology.AppliedMap{{Router: "a", Version: 3}}, 8},
		{"a router ahead of the store", 3, []topology.AppliedMap{{Router: "a", Version: 4}, {Router: "b", Version: 9}}, 10},
		{"store lost, routers remember", 0, []topology.AppliedMap{{Router: "a", Version: 9}}, 10},
		{"a router still starting", 2, []topology.AppliedMap{{Router: "a", Version: 0}}, 3},
	} {
		if got := topology.NextVersion(tc.stored, tc.applied); got != tc.want {
			t.Errorf("%s: NextVersion = %d, want %d", tc.name, got, tc.want)
		}
	}
}

func TestCheckStoredRefusesWhatWouldSplitRouting(t *testing.T) {
	t.Parallel()
	m4 := topologytest.MustMap(4, topologytest.SeedRanges...)
	other4 := topologytest.MustMap(4, routing.Range{From: 0, To: 1023, Cluster: "c1"})
	for _, tc := range []struct {
		name    string
		stored  *routing.Map
		applied []topology.AppliedMap
		refuse  string // part of the error; "" when accepted
	}{
		{"same map", m4, []topology.AppliedMap{{Router: "a", Version: 4, Digest: m4.Digest()}}, ""},
		{"router behind", m4, []topology.AppliedMap{{Router: "a", Version: 3, Digest: "x"}}, ""},
		{"no digest published", m4, []topology.AppliedMap{{Router: "a", Version: 4}}, ""},
		{"stored older", topologytest.MustMap(3, topologytest.SeedRanges...), []topology.AppliedMap{{Router: "a", Version: 4}}, "older than what live routers apply (a at 4)"},
		{"rewritten under the same version", other4, []topology.AppliedMap{{Router: "a", Version: 4, Digest: m4.Digest()}}, "differs from the map of that version applied by a"},
	} {
		err := topology.CheckStored(tc.stored, tc.applied)
		switch {
		case tc.refuse == "" && err != nil:
			t.Errorf("%s: refused: %v", tc.name, err)
		case tc.refuse != "" && (!errors.Is(err, topology.ErrBehind) || !strings.Contains(err.Error(), tc.refuse) || !strings.Contains(err.Error(), "consul-seed -recover")):
			t.Errorf("%s: err = %v, want ErrBehind saying %q and how to recover", tc.name, err, tc.refuse)
		}
	}
	if err := topology.CheckAbove(topologytest.MustMap(4, topologytest.SeedRanges...), []topology.AppliedMap{{Router: "a", Version: 4}}); !errors.Is(err, topology.ErrBehind) {
		t.Fatalf("CheckAbove of the version a router applies: %v, want ErrBehind", err)
	}
}

func TestDigestFollowsAssignmentNotVersion(t *testing.T) {
	t.Parallel()
	a := topologytest.MustMap(1, topologytest.SeedRanges...)
	b := topologytest.MustMap(2, topologytest.SeedRanges...)
	c := topologytest.MustMap(1, routing.Range{From: 0, To: 512, Cluster: "c1"}, routing.Range{From: 513, To: 1023, Cluster: "c2"})
	d := topologytest.MustMap(1, routing.Range{From: 0, To: 511, Cluster: "c1", Frozen: true}, routing.Range{From: 512, To: 1023, Cluster: "c2"})
	if a.Digest() != b.Digest() {
		t.Fatal("same ranges under two versions have different digests")
	}
	if a.Digest() == c.Digest() || a.Digest() == d.Digest() {
		t.Fatal("a moved boundary or a frozen range left the digest unchanged")
	}
}

func TestRebuildTakesEachVShardsNewestRecord(t *testing.T) {
	t.Parallel()
	rec := func(from, to int, cluster string, v int64) []topology.OwnerRecord {
		var out []topology.OwnerRecord
		for i := from; i <= to; i++ {
			out = append(out, topology.OwnerRecord{VShard: i, Cluster: cluster, Version: v})
		}
		return out
	}
	// c1 recorded map 3 (c1 0-511, c2 512-1023); c2 recorded map 4, which
	// moved 400-511 to c2.
	records := map[string][]topology.OwnerRecord{
		"c1": append(rec(0, 511, "c1", 3), rec(512, 1023, "c2", 3)...),
		"c2": append(append(rec(0, 399, "c1", 4), rec(400, 511, "c2", 4)...), rec(512, 1023, "c2", 4)...),
	}
	rb, err := topology.Rebuild(records, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []routing.Range{{From: 0, To: 399, Cluster: "c1"}, {From: 400, To: 1023, Cluster: "c2"}}
	if rb.Newest != 4 || len(rb.Ranges) != 2 || rb.Ranges[0] != want[0] || rb.Ranges[1] != want[1] {
		t.Fatalf("rebuilt %+v (newest %d), want %+v at 4", rb.Ranges, rb.Newest, want)
	}
	m := topologytest.MustMap(4, want...)
	if err := topology.CheckRebuilt(rb, []topology.AppliedMap{{Router: "a", Version: 4, Digest: m.Digest()}}); err != nil {
		t.Fatalf("router on the recorded map 4: %v", err)
	}
	if err := topology.CheckRebuilt(rb, []topology.AppliedMap{{Router: "a", Version: 5}}); !errors.Is(err, topology.ErrBehind) {
		t.Fatalf("router ahead of every record: %v, want ErrBehind", err)
	}
	if err := topology.CheckRebuilt(rb, []topology.AppliedMap{{Router: "a", Version: 4, Digest: "other"}}); !errors.Is(err, topology.ErrBehind) {
		t.Fatalf("router on another map 4: %v, want ErrBehind", err)
	}

	// Two owners under one version: refused.
	records["c1"] = append(records["c1"], topology.OwnerRecord{VShard: 7, Cluster: "c2", Version: 4})
	if _, err := topology.Rebuild(records, nil); err == nil || !strings.Contains(err.Error(), "vshard 7 has two owners in version 4") {
		t.Fatalf("conflicting records: %v", err)
	}

	// Vshards nobody recorded follow the fallback, or fail without one.
	partial := map[string][]topology.OwnerRecord{"c1": rec(0, 99, "c1", 2)}
	if _, err := topology.Rebuild(partial, nil); err == nil {
		t.Fatal("rebuilt a map with 924 vshards unaccounted for")
	}
	rb, err = topology.Rebuild(partial, topologytest.MustMap(1, routing.Range{From: 0, To: 1023, Cluster: "c2"}))
	if err != nil || rb.FromFallback != 924 || rb.Ranges[0] != (routing.Range{From: 0, To: 99, Cluster: "c1"}) {
		t.Fatalf("with a fallback: %+v, %v", rb, err)
	}
}
