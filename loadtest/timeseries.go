package loadtest

import (
	"math/bits"
	"sync/atomic"
	"time"
)

// The per-second latency of a phase, for the report's charts: every
// second of the timeline keeps a small histogram of the latencies of the
// answers that came in it. The whole-window percentiles stay with the
// HdrHistograms (Latency); these only draw the curve over time.
//
// A histogram has 224 buckets of microseconds: exact below 8 µs, then
// eight per power of two (each an eighth of an octave wide), up to the 10
// minutes Latency caps at. A bucket's middle is within 6 % of any value
// in it, which is what a chart can show. 896 bytes per second and series,
// made on first use: a 10-minute run with a 20-minute drain keeps under
// 5 MB for its three series.

// Series of the timeline's latencies.
const (
	latProduce = iota // produce requests, from their intended send time
	latClaim          // claims that returned deliveries, from theirs
	latE2E            // end to end: production to first delivery
	nLat
)

// latNames name the series where they travel (a worker's result).
var latNames = [nLat]string{"produce", "claim", "e2e"}

const latBuckets = 224

type secondHist [latBuckets]atomic.Uint32

// latBucket is the bucket of a latency of us microseconds.
func latBucket(us int64) int {
	if us < 8 {
		return int(max(us, 0))
	}
	e := bits.Len64(uint64(us)) - 4 // us>>e is 8..15
	return min((e+1)*8+int(us>>e)-8, latBuckets-1)
}

// latBucketMiddle is the middle of bucket b, in microseconds.
func latBucketMiddle(b int) float64 {
	if b < 8 {
		return float64(b)
	}
	e := uint(b/8 - 1)
	lo := int64(b%8+8) << e
	hi := int64(b%8+9)<<e - 1
	return float64(lo+hi) / 2
}

// latencySeries is one latency's histograms, a second each.
type latencySeries struct {
	secs []atomic.Pointer[secondHist]
}

func newLatencySeries(n int) *latencySeries {
	return &latencySeries{secs: make([]atomic.Pointer[secondHist], n)}
}

func (s *latencySeries) record(i int, d time.Duration) {
	h := s.secs[i].Load()
	if h == nil {
		s.secs[i].CompareAndSwap(nil, new(secondHist))
		h = s.secs[i].Load()
	}
	h[latBucket(min(max(d.Microseconds(), 1), maxLatencyUS))].Add(1)
}

// quantiles answers the p50 and p99 of second i in milliseconds; ok is
// false when nothing was recorded then.
func (s *latencySeries) quantiles(i int) (p50, p99 float64, ok bool) {
	h := s.secs[i].Load()
	if h == nil {
		return 0, 0, false
	}
	var counts [latBuckets]uint32
	var n uint64
	for b := range h {
		counts[b] = h[b].Load()
		n += uint64(counts[b])
	}
	if n == 0 {
		return 0, 0, false
	}
	at := func(q float64) float64 {
		rank := uint64(q*float64(n-1)) + 1 // the rank-th smallest, 1-based
		var seen uint64
		for b, c := range counts {
			if seen += uint64(c); seen >= rank {
				return latBucketMiddle(b) / 1000
			}
		}
		return latBucketMiddle(latBuckets-1) / 1000
	}
	return at(0.50), at(0.99), true
}

// export is the histograms as sparse [bucket, count] pairs per second
// (the fleet's workers send them to the coordinator).
func (s *latencySeries) export() [][][2]uint32 {
	out := make([][][2]uint32, len(s.secs))
	for i := range s.secs {
		h := s.secs[i].Load()
		if h == nil {
			continue
		}
		for b := range h {
			if c := h[b].Load(); c > 0 {
				out[i] = append(out[i], [2]uint32{uint32(b), c})
			}
		}
	}
	return out
}

// merge adds exported histograms.
func (s *latencySeries) merge(x [][][2]uint32) {
	for i, sec := range x {
		if i >= len(s.secs) {
			return
		}
		for _, bc := range sec {
			if int(bc[0]) >= latBuckets {
				continue
			}
			h := s.secs[i].Load()
			if h == nil {
				s.secs[i].CompareAndSwap(nil, new(secondHist))
				h = s.secs[i].Load()
			}
			h[bc[0]].Add(bc[1])
		}
	}
}

// latency records one latency d of series which, answered at t.
func (t *Timeline) latency(which int, at time.Time, d time.Duration) {
	t.lat[which].record(t.index(at), d)
}

// fillLatency sets the points' percentiles from the series.
func (t *Timeline) fillLatency(pts []Point) {
	for i := range pts {
		set := func(which int, p50, p99 *float64) {
			if a, b, ok := t.lat[which].quantiles(i); ok {
				*p50, *p99 = a, b
			}
		}
		set(latProduce, &pts[i].ProduceP50, &pts[i].ProduceP99)
		set(latClaim, &pts[i].ClaimP50, &pts[i].ClaimP99)
		set(latE2E, &pts[i].E2EP50, &pts[i].E2EP99)
	}
}
