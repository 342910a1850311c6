package rebalance

import (
	"errors"
	"testing"

	"github.com/shardmq/shardmq/routing"
	"github.com/shardmq/shardmq/shard"
)

func twoClusters(t *testing.T) *routing.Map {
	t.Helper()
	m, err := routing.NewMap(1, []routing.Range{{From: 0, To: 511, Cluster: "c1"}, {From: 512, To: 1023, Cluster: "c2"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestPlanChecksRanges(t *testing.T) {
	t.Parallel()
	m := twoClusters(t)
	known := map[string]bool{"c1": true, "c2": true, "c3": true}
	cases := []struct {
		name   string
		ranges []Range
		busy   map[uint16]string
		want   error
		moves  int
	}{
		{"none", nil, nil, ErrInvalid, 0},
		{"negative", []Range{{From: -1, To: 3, Target: "c2"}}, nil, ErrInvalid, 0},
		{"past 1023", []Range{{From: 1000, To: 1024, Target: "c1"}}, nil, ErrInvalid, 0},
		{"reversed", []Range{{From: 9, To: 3, Target: "c2"}}, nil, ErrInvalid, 0},
		{"unknown target", []Range{{From: 0, To: 3, Target: "c9"}}, nil, ErrInvalid, 0},
		{"no target", []Range{{From: 0, To: 3}}, nil, ErrInvalid, 0},
		{"overlap", []Range{{From: 0, To: 10, Target: "c2"}, {From: 10, To: 12, Target: "c3"}}, nil, ErrInvalid, 0},
		{"already owned", []Range{{From: 510, To: 512, Target: "c2"}}, nil, ErrInvalid, 0},
		{"busy", []Range{{From: 0, To: 10, Target: "c2"}}, map[uint16]string{10: "rs-x"}, ErrBusy, 0},
		{"edges", []Range{{From: 0, To: 0, Target: "c3"}, {From: 1023, To: 1023, Target: "c3"}}, nil, nil, 2},
		{"one move", []Range{{From: 0, To: 63, Target: "c2"}}, map[uint16]string{64: "rs-x"}, nil, 1},
		{"two sources", []Range{{From: 500, To: 520, Target: "c3"}}, nil, nil, 2},
	}
	for _, c := range cases {
		moves, err := Plan(c.ranges, m, known, c.busy)
		if c.want != nil {
			if !errors.Is(err, c.want) {
				t.Errorf("%s: err %v, want %v", c.name, err, c.want)
			}
			continue
		}
		if err != nil || len(moves) != c.moves {
			t.Errorf("%s: %v %v, want %d moves", c.name, moves, err, c.moves)
		}
	}
	moves, _ := Plan([]Range{{From: 500, To: 520, Target: "c3"}}, m, known, nil)
	if moves[0].Source != "c1" || len(moves[0].VShards) != 12 || moves[1].Source != "c2" || len(moves[1].VShards) != 9 {
		t.Fatalf("moves across the c1/c2 edge: %+v", moves)
	}
}

func count(rs []Range) int {
	n := 0
	for _, r := range rs {
		n += r.To - r.From + 1
	}
	return n
}

func TestPlanAddTakesAnEvenShareWithFewestMoves(t *testing.T) {
	t.Parallel()
	m := twoClusters(t)
	rs := PlanAdd(m, "c3", nil)
	if got := count(rs); got != shard.Count/3 {
		t.Fatalf("c3 takes %d vshards, want %d: %v", got, shard.Count/3, rs)
	}
	moves, err := Plan(rs, m, map[string]bool{"c1": true, "c2": true, "c3": true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	per := map[string]int{}
	for _, mv := range moves {
		per[mv.Source] += len(mv.VShards)
	}
	if d := per["c1"] - per["c2"]; d < -1 || d > 1 {
		t.Fatalf("taken unevenly: %v", per)
	}
	if len(rs) != 2 {
		t.Fatalf("want one contiguous range from each cluster, got %v", rs)
	}
	// A cluster at its share already takes nothing.
	if rs := PlanAdd(m, "c1", nil); len(rs) != 0 {
		t.Fatalf("c1 at its share: %v", rs)
	}
}

func TestPlanDrainGivesEverythingAway(t *testing.T) {
	t.Parallel()
	m, err := routing.NewMap(1, []routing.Range{{From: 0, To: 299, Cluster: "c1"}, {From: 300, To: 699, Cluster: "c2"}, {From: 700, To: 1023, Cluster: "c3"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	rs := PlanDrain(m, "c2", nil, nil)
	if count(rs) != 400 {
		t.Fatalf("drained %d of 400: %v", count(rs), rs)
	}
	to := map[string]int{}
	for _, r := range rs {
		to[r.Target] += r.To - r.From + 1
	}
	if to["c1"] != 200 || to["c3"] != 200 || to["c2"] != 0 {
		t.Fatalf("spread %v", to)
	}
	if _, err := Plan(rs, m, map[string]bool{"c1": true, "c2": true, "c3": true}, nil); err != nil {
		t.Fatal(err)
	}
}

// Weighed by load, a new cluster takes fewer of the heavy vshards and more
// of the light ones; a drain cuts by weight too.
func TestPlansWeighVShards(t *testing.T) {
	t.Parallel()
	m := twoClusters(t)
	w := Weights{}
	for v := 412; v <= 511; v++ { // c1's top 100 vshards carry 10 each
		w[uint16(v)] = 10
	}
	// c1 weighs 412 + 1000 = 1412, c2 512: 1924 in all, a third is 641.
	rs := PlanAdd(m, "c3", w)
	taken := map[string]float64{}
	for _, r := range rs {
		for v := r.From; v <= r.To; v++ {
			owner, _ := m.Lookup(shard.ID(v))
			taken[owner] += w.of(shard.ID(v))
		}
	}
	got := taken["c1"] + taken["c2"]
	if got < 600 || got > 680 {
		t.Fatalf("c3 takes weight %v (%v), want about 641: %v", got, taken, rs)
	}
	if taken["c2"] != 0 {
		t.Fatalf("c2, below its share already, gave %v", taken["c2"])
	}
	if len(rs) != 1 || rs[0].To != 511 {
		t.Fatalf("want one range at c1's heavy top, got %v", rs)
	}
	// Drain c1 over c2 and c3 by weight: the heavy top goes to one side.
	m3, err := routing.NewMap(2, []routing.Range{{From: 0, To: 511, Cluster: "c1"}, {From: 512, To: 767, Cluster: "c2"}, {From: 768, To: 1023, Cluster: "c3"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	drained := PlanDrain(m3, "c1", nil, w)
	per := map[string]float64{}
	n := 0
	for _, r := range drained {
		for v := r.From; v <= r.To; v++ {
			per[r.Target] += w.of(shard.ID(v))
			n++
		}
	}
	if n != 512 || per["c2"] < 650 || per["c2"] > 760 || per["c3"] < 650 || per["c3"] > 760 {
		t.Fatalf("drain by weight: %d vshards, %v", n, per)
	}
}
