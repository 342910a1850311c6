package loadtest

import (
	"encoding/json"
	"testing"

	"github.com/shardmq/shardmq/shard"
)

func TestKeysRoundTrip(t *testing.T) {
	t.Parallel()
	ks := newKeyspace("lt0a1b2c", Dist{Kind: "fixed", A: 50}, KeyDist{})
	for _, k := range []keyID{newKeyID(0, 0), newKeyID(7, 12345), newKeyID(maxWorkers-1, 1<<seqBits-1)} {
		key := ks.key(k)
		got, err := ks.parse(key)
		if err != nil || got != k {
			t.Fatalf("parse(%q) = %v, %v; want %v", key, got, err, k)
		}
	}
	for _, bad := range []string{"other.1.2", "lt0a1b2c.x.1", "lt0a1b2c.1", "lt0a1b2c.1.-2", ""} {
		if _, err := ks.parse(bad); err == nil {
			t.Fatalf("parse(%q) accepted a foreign key", bad)
		}
	}
	// One worker's keys sort in sequence order (inserted in index order).
	if a, b := ks.key(newKeyID(1, 9)), ks.key(newKeyID(1, 10)); a >= b {
		t.Fatalf("%q sorts after %q", a, b)
	}
}

func TestPayloadIsDeterministicJSON(t *testing.T) {
	t.Parallel()
	for _, d := range []Dist{{Kind: "fixed", A: 200}, {Kind: "uniform", A: 10, B: 1000}, {Kind: "exp", A: 300, B: 4000}, {Kind: "fixed", A: 0}} {
		ks := newKeyspace("r", d, KeyDist{})
		var total int
		for i := range 2000 {
			k := newKeyID(1, uint64(i))
			key := ks.key(k)
			p := ks.payloadJSON(key, k)
			if string(p) != string(ks.payloadJSON(key, k)) {
				t.Fatal("payload differs between two calls: a resend would be a conflict")
			}
			var v map[string]string
			if err := json.Unmarshal(p, &v); err != nil || v["k"] != key {
				t.Fatalf("payload %s: %v", p, err)
			}
			if len(p) > max(d.Max(), len(key)+15) {
				t.Fatalf("%v: payload of %d bytes", d, len(p))
			}
			total += len(p)
		}
		mean := float64(total) / 2000
		want := map[string]float64{"fixed": float64(d.A), "uniform": float64(d.A+d.B) / 2, "exp": float64(d.A)}[d.Kind]
		if want > 100 && (mean < 0.8*want || mean > 1.2*want) {
			t.Fatalf("%v: mean payload %.0f bytes, want about %.0f", d, mean, want)
		}
	}
}

func TestHotKeysConcentrateOnFewVShards(t *testing.T) {
	t.Parallel()
	ks := newKeyspace("r", Dist{Kind: "fixed", A: 10}, KeyDist{HotVShards: 4, HotShare: 0.8})
	counts := map[shard.ID]int{}
	for i := range 10000 {
		k := newKeyID(0, uint64(i))
		counts[shard.Of(shard.Key(ks.orderKey(k), ks.key(k)))]++
	}
	// The 4 busiest vshards hold about 80 %.
	var top [4]int
	for _, n := range counts {
		for j := range top {
			if n > top[j] {
				copy(top[j+1:], top[j:3])
				top[j] = n
				break
			}
		}
	}
	sum := top[0] + top[1] + top[2] + top[3]
	if sum < 7500 || sum > 8500 {
		t.Fatalf("the 4 busiest vshards hold %d of 10000, want about 8000", sum)
	}
}

func TestParseDist(t *testing.T) {
	t.Parallel()
	good := map[string]Dist{
		"200": {Kind: "fixed", A: 200}, "fixed:10": {Kind: "fixed", A: 10},
		"uniform:1:9": {Kind: "uniform", A: 1, B: 9}, "exp:100": {Kind: "exp", A: 100, B: 1600}, "exp:100:500": {Kind: "exp", A: 100, B: 500},
	}
	for s, want := range good {
		if got, err := ParseDist(s); err != nil || got != want {
			t.Errorf("ParseDist(%q) = %v, %v; want %v", s, got, err, want)
		}
	}
	for _, s := range []string{"", "x", "-1", "uniform:9:1", "uniform:1", "exp", "gauss:1:2"} {
		if _, err := ParseDist(s); err == nil {
			t.Errorf("ParseDist(%q) accepted", s)
		}
	}
	if k, err := ParseKeyDist("hot:8:0.8"); err != nil || k != (KeyDist{HotVShards: 8, HotShare: 0.8}) {
		t.Errorf("ParseKeyDist(hot:8:0.8) = %v, %v", k, err)
	}
	for _, s := range []string{"hot", "hot:0:0.5", "hot:4:2", "zipf"} {
		if _, err := ParseKeyDist(s); err == nil {
			t.Errorf("ParseKeyDist(%q) accepted", s)
		}
	}
}
