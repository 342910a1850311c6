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
