package loadtest

import (
	"math"
	"testing"
	"time"
)

// Buckets are contiguous, each value's bucket middle is within 6 % of it,
// and the last bucket holds the cap.
func TestLatencyBuckets(t *testing.T) {
	prev := -1
	for us := int64(0); us <= 1<<20; us++ {
		b := latBucket(us)
		if b != prev && b != prev+1 {
			t.Fatalf("%d µs: bucket %d after %d", us, b, prev)
		}
		prev = b
		if us > 0 {
			if m := latBucketMiddle(b); math.Abs(m-float64(us))/float64(us) > 0.0625 {
				t.Fatalf("%d µs: bucket %d's middle %.1f is off by more than 6 %%", us, b, m)
			}
		}
	}
	if b := latBucket(maxLatencyUS); b >= latBuckets {
		t.Fatalf("the cap's bucket %d is past %d", b, latBuckets)
	}
}

// A second's p50 and p99 come from its own answers only, and survive an
// export and merge (the fleet's workers).
func TestLatencySeriesQuantiles(t *testing.T) {
	s := newLatencySeries(3)
	for i := range 100 {
		s.record(1, time.Duration(i+1)*time.Millisecond) // 1..100 ms
	}
	s.record(2, 5*time.Second)
	if _, _, ok := s.quantiles(0); ok {
		t.Fatal("second 0 has no answers")
	}
	check := func(s *latencySeries) {
		t.Helper()
		p50, p99, ok := s.quantiles(1)
		if !ok || math.Abs(p50-50)/50 > 0.07 || math.Abs(p99-99)/99 > 0.07 {
			t.Fatalf("second 1: p50 %.2f p99 %.2f %v", p50, p99, ok)
		}
		if p50, p99, _ := s.quantiles(2); math.Abs(p50-5000)/5000 > 0.07 || p99 != p50 {
			t.Fatalf("second 2: p50 %.2f p99 %.2f", p50, p99)
		}
	}
	check(s)
	m := newLatencySeries(3)
	m.merge(s.export())
	check(m)
}
