package routing

import (
	"errors"
	"strings"
	"testing"

	"github.com/shardmq/shardmq/shard"
)

func TestNewMapBoundaries(t *testing.T) {
	t.Parallel()
	m, err := NewMap(3, []Range{{0, 0, "a", false}, {1, 511, "b", false}, {512, 1022, "a", true}, {1023, 1023, "c", false}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		v       shard.ID
		cluster string
		state   State
	}{
		{0, "a", Serving}, {1, "b", Serving}, {511, "b", Serving}, {512, "a", Frozen}, {1022, "a", Frozen}, {1023, "c", Serving},
	}
	for _, c := range cases {
		cl, st := m.Lookup(c.v)
		if cl != c.cluster || st != c.state {
			t.Errorf("Lookup(%d) = %s/%s, want %s/%s", c.v, cl, st, c.cluster, c.state)
		}
	}
	if got := strings.Join(m.Clusters(), ","); got != "a,b,c" {
		t.Errorf("Clusters = %s", got)
	}
	if got := len(m.VShards("b")); got != 511 {
		t.Errorf("VShards(b) has %d", got)
	}
	if got := len(m.Ranges()); got != 4 {
		t.Errorf("Ranges = %v", m.Ranges())
	}
}

func TestNewMapOneCluster(t *testing.T) {
	t.Parallel()
	m, err := NewMap(1, []Range{{0, 1023, "only", false}}, map[string]bool{"only": true})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []shard.ID{0, 511, 1023} {
		if c, _ := m.Lookup(v); c != "only" {
			t.Errorf("Lookup(%d) = %s", v, c)
		}
	}
}

func TestNewMapInvalid(t *testing.T) {
	t.Parallel()
	known := map[string]bool{"a": true, "b": true}
	cases := []struct {
		name   string
		ranges []Range
		index  int
		want   string
	}{
		{"gap", []Range{{0, 10, "a", false}, {12, 1023, "b", false}}, -1, "not assigned to any cluster: 11"},
		{"overlap", []Range{{0, 600, "a", false}, {600, 1023, "b", false}}, 1, "vshard 600 is also assigned by ranges[0]"},
		{"unknown", []Range{{0, 1023, "z", false}}, 0, `unknown cluster "z"`},
		{"outside", []Range{{0, 1024, "a", false}}, 0, "outside"},
		{"reversed", []Range{{5, 4, "a", false}}, 0, "greater than"},
		{"empty", nil, -1, "0-1023"},
		{"no cluster", []Range{{0, 1023, "", false}}, 0, "cluster is empty"},
	}
	for _, c := range cases {
		_, err := NewMap(1, c.ranges, known)
		var re *RangeError
		if !errors.As(err, &re) {
			t.Fatalf("%s: err = %v, want RangeError", c.name, err)
		}
		if re.Index != c.index || !strings.Contains(re.Msg, c.want) {
			t.Errorf("%s: got index %d msg %q, want index %d containing %q", c.name, re.Index, re.Msg, c.index, c.want)
		}
	}
}

func TestTableRefusesOlderVersion(t *testing.T) {
	t.Parallel()
	m1, _ := NewMap(1, []Range{{0, 1023, "a", false}}, nil)
	m2, _ := NewMap(2, []Range{{0, 1023, "b", false}}, nil)
	tab := NewTable(m2)
	if tab.Store(m1) {
		t.Fatal("older map replaced a newer one")
	}
	if c, _ := tab.Load().Lookup(0); c != "b" {
		t.Fatalf("cluster = %s", c)
	}
}

// Changed is closed by the next Store of a map, not by a refused stale one.
func TestTableChangedSignalsNewMaps(t *testing.T) {
	t.Parallel()
	one := func(v int64, frozen bool) *Map {
		m, err := NewMap(v, []Range{{From: 0, To: 1023, Cluster: "c1", Frozen: frozen}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	tb := NewTable(one(2, false))
	ch := tb.Changed()
	if tb.Store(one(1, true)) {
		t.Fatal("a stale map was stored")
	}
	select {
	case <-ch:
		t.Fatal("a refused map signalled a change")
	default:
	}
	if !tb.Store(one(3, true)) {
		t.Fatal("a newer map was refused")
	}
	select {
	case <-ch:
	default:
		t.Fatal("a stored map did not signal")
	}
	if got := tb.Load().FrozenVShards(); len(got) != 1024 {
		t.Fatalf("frozen vshards %d, want 1024", len(got))
	}
	moved, err := tb.Load().With(4, []shard.ID{0, 1023}, "c2", Serving)
	if err != nil || moved.Version() != 4 || len(moved.VShards("c2")) != 2 || len(moved.FrozenVShards()) != 1022 {
		t.Fatalf("With: %v, c2 owns %v", err, moved.VShards("c2"))
	}
	if c := moved.Clusters(); len(c) != 2 || c[0] != "c1" || c[1] != "c2" {
		t.Fatalf("clusters after With: %v", c)
	}
	var zero Table // usable without NewTable
	zch := zero.Changed()
	zero.Store(one(1, false))
	<-zch
}
