package loadtest

import (
	"context"
	"github.com/shardmq/shardmq/internal/testbed"
	"math"
	"strings"
	"testing"
)

func recs(rs ...record) []byte {
	var b []byte
	for _, r := range rs {
		b = r.append(b)
	}
	return b
}

// The coordinator gets each worker's stream in its own order: a delivery
// may come in before the Sent record of the worker that produced the key.
// Whatever the order, the books come out the same; only a key nobody sent
// is unexpected.
func TestCoordinatorOrdersStreams(t *testing.T) {
	k, other, stray := newKeyID(0, 1), newKeyID(8, 1), newKeyID(3, 9)
	producer := recs(record{kind: recSent, k: k}, record{kind: recCreated, k: k, id: 7},
		record{kind: recSent, k: other}, record{kind: recCreated, k: other, id: 8})
	consumer := recs(record{kind: recReceived, k: k, id: 7, attempt: 1}, record{kind: recAcked, k: k, status: statusCode("ok")},
		record{kind: recReceived, k: other, id: 8, attempt: 1}, record{kind: recAcked, k: other, status: statusCode("ok")})
	strayRecs := recs(record{kind: recReceived, k: stray, id: 9, attempt: 1}, record{kind: recAcked, k: stray, status: statusCode("ok")})
	for _, tc := range []struct {
		name    string
		batches [][]byte
	}{
		{"producer first", [][]byte{producer, consumer, strayRecs}},
		{"consumer first", [][]byte{consumer, strayRecs, producer}},
		{"interleaved", [][]byte{consumer[:recLen], producer[:2*recLen], consumer[recLen:], strayRecs, producer[2*recLen:]}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &coordinator{n: 1, v: NewVerifier(1, ConsumerPolicy{}), done: []bool{true}, limbo: map[keyID][]record{}}
			for _, b := range tc.batches {
				c.apply(b)
			}
			if c.settledLocked() {
				t.Fatal("settled with a stray delivery in limbo")
			}
			c.flushLimbo()
			v := c.v.Finish(context.Background(), true, 0, nil, func(k keyID) string { return "" })
			if v.Acknowledged != 2 || v.Consumed != 2 || v.Lost != 0 || v.Unexpected != 1 || v.Duplicated != 0 {
				t.Fatalf("books: %+v", v)
			}
		})
	}
}

// The capacity model: cores from the CPU per message at the target, hosts
// from the cores, and the limit named from where the cores went.
func TestCapacityModel(t *testing.T) {
	testbed.Need(t)
	rep := &Report{Host: Host{CPUs: 2}, Phases: []PhaseReport{{Name: "router mixed", Target: "router", Kind: "mixed", ElapsedS: 100,
		Produce: &Flow{PerSecond: 8000, Target: 100000}, Consume: &Flow{PerSecond: 3000, Target: 50000},
		Timeline: []Point{{Produced: 600000, Consumed: 400000}},
		CPU: []CPUUse{{Name: "machine", Seconds: 195, Cores: 1.95}, {Name: "loadtest", Seconds: 10}, {Name: "router", Seconds: 40},
			{Name: "mariadbd", Seconds: 130}, {Name: "primary", Seconds: 100}, {Name: "replica", Seconds: 30}}}}}
	c := capacity(rep, CapacityTarget{}, 1)
	// 1M messages moved: router 40 µs, primary 100 µs, replica 30 µs,
	// generator 10 µs each; 150k/s at 70 %.
	want := map[string]float64{"router": 150000 * 40e-6 / 0.7, "primary": 150000 * 100e-6 / 0.7, "replica": 150000 * 30e-6 / 0.7, "generator": 150000 * 10e-6 / 0.7}
	for _, p := range c.Inputs {
		if d := p.Cores - want[p.Name]; d > 0.01 || d < -0.01 {
			t.Fatalf("%s: %.2f cores, want %.2f", p.Name, p.Cores, want[p.Name])
		}
	}
	// 21.4 primary cores on 16-core hosts: 2 clusters; 8.6 router cores
	// on 8: 2 routers.
	if c.Clusters != 2 || c.Routers != 2 || c.Generators != 1 || c.Limit != "machine" {
		t.Fatalf("fleet %+v", c)
	}
	// A worker that saturated its own machine is named, whatever the
	// coordinator's machine saw.
	busy := rep.Phases[0]
	busy.Generators = []GeneratorUse{{Worker: 0, CPUs: 8, Cores: 1, MachineCores: 2}, {Worker: 1, CPUs: 4, Cores: 3.8, MachineCores: 3.9}}
	if got, text := limitOf(&busy, map[string]CPUUse{"machine": {Seconds: 100, Cores: 1}}, 10, 2); got != "generator" || !strings.Contains(text, "worker 1") {
		t.Fatalf("limit %s (%s), want worker 1's generator", got, text)
	}
	// With a drain long enough, produced and consumed messages are costed
	// apart: a primary that spent 60 µs per produced and 40 µs per
	// consumed message needs (100k × 60 + 50k × 40) µs/s at 70 %.
	split := &Report{Host: Host{CPUs: 2}, Settings: Settings{DurationS: 60}, Phases: []PhaseReport{{Name: "router mixed", Target: "router", Kind: "mixed",
		Timeline: []Point{{Second: 0, Produced: 600000, Consumed: 300000}, {Second: 60, Consumed: 300000}},
		CPU:      []CPUUse{{Name: "machine", Seconds: 100, Cores: 1}, {Name: "primary", Seconds: 60, MixSeconds: 48}}}}}
	sc := capacity(split, CapacityTarget{}, 0)
	if !sc.Split || sc.DrainConsumed != 300000 {
		t.Fatalf("not split: %+v", sc)
	}
	for _, p := range sc.Inputs {
		if p.Name == "primary" && (math.Abs(p.ProduceUS-60) > 0.01 || math.Abs(p.ConsumeUS-40) > 0.01 || math.Abs(p.Cores-8/0.7) > 0.01) {
			t.Fatalf("primary: %+v, want 60 and 40 µs, %.2f cores", p, 8/0.7)
		}
	}
	// A commit rate of 40k moved/s per cluster asks for 4 clusters.
	if c := capacity(rep, CapacityTarget{ClusterRate: 40000}, 1); c.Clusters != 4 || c.ByCommitRate != 4 {
		t.Fatalf("with a cluster rate: %+v", c)
	}
	for _, tc := range []struct {
		name     string
		gen      float64
		machine  float64
		produced float64
		want     string
	}{
		{"reached", 10, 1.95, 100000, "none"},
		{"cores busy, system took them", 10, 1.95, 8000, "machine"},
		{"cores busy, generator took a quarter", 60, 1.95, 8000, "generator"},
		{"cores busy, others took a quarter", 10, 1.95 * 1.5, 8000, "shared"},
		{"cores idle", 10, 1.0, 8000, "system"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := rep.Phases[0]
			p.Produce = &Flow{PerSecond: tc.produced, Target: 100000}
			p.Consume = &Flow{PerSecond: tc.produced / 2, Target: 50000}
			by := map[string]CPUUse{"machine": {Seconds: tc.machine * 100, Cores: min(tc.machine, 2)}, "router": {Seconds: 40}, "mariadbd": {Seconds: 130}}
			if got, text := limitOf(&p, by, tc.gen, 2); got != tc.want {
				t.Fatalf("limit %s (%s), want %s", got, text, tc.want)
			}
		})
	}
}
