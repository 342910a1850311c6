package loadtest

import (
	"errors"
	"maps"
	"net"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// Latency records durations in microseconds, 1 µs to 10 min at 3
// significant digits: the whole measured window, and an interval that the
// progress line reads and resets. Safe for concurrent use; requests are
// batched, so one mutex is far from contended.
type Latency struct {
	mu       sync.Mutex
	total    *hdrhistogram.Histogram
	interval *hdrhistogram.Histogram
}

const maxLatencyUS = int64(10 * time.Minute / time.Microsecond)

// NewLatency returns an empty recorder.
func NewLatency() *Latency {
	return &Latency{total: hdrhistogram.New(1, maxLatencyUS, 3), interval: hdrhistogram.New(1, maxLatencyUS, 3)}
}

// Record adds one observation to the interval, and to the whole window
// when inWindow; longer than 10 min counts as 10 min.
func (l *Latency) Record(d time.Duration, inWindow bool) {
	us := min(max(d.Microseconds(), 1), maxLatencyUS)
	l.mu.Lock()
	if inWindow {
		l.total.RecordValue(us)
	}
	l.interval.RecordValue(us)
	l.mu.Unlock()
}

// export is the whole window's histogram, to merge with other
// generators'.
func (l *Latency) export() *hdrhistogram.Snapshot {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.total.Export()
}

// mergeLatency merges exported histograms into one summary.
func mergeLatency(snaps []*hdrhistogram.Snapshot) Percentiles {
	h := hdrhistogram.New(1, maxLatencyUS, 3)
	for _, s := range snaps {
		if s != nil {
			h.Merge(hdrhistogram.Import(s))
		}
	}
	return percentiles(h)
}

// Percentiles summarises the whole window.
func (l *Latency) Percentiles() Percentiles {
	l.mu.Lock()
	defer l.mu.Unlock()
	return percentiles(l.total)
}

// IntervalP99 is the p99 since the last call, in ms, and resets the
// interval; ok is false when nothing was recorded.
func (l *Latency) IntervalP99() (ms float64, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.interval.TotalCount() == 0 {
		return 0, false
	}
	v := float64(l.interval.ValueAtQuantile(99)) / 1000
	l.interval.Reset()
	return v, true
}

// Percentiles are latencies in milliseconds.
type Percentiles struct {
	Count int64   `json:"count"`
	Mean  float64 `json:"mean_ms"`
	P50   float64 `json:"p50_ms"`
	P90   float64 `json:"p90_ms"`
	P99   float64 `json:"p99_ms"`
	P999  float64 `json:"p99_9_ms"`
	Max   float64 `json:"max_ms"`
}

func percentiles(h *hdrhistogram.Histogram) Percentiles {
	if h.TotalCount() == 0 {
		return Percentiles{}
	}
	ms := func(us int64) float64 { return float64(us) / 1000 }
	return Percentiles{
		Count: h.TotalCount(),
		Mean:  h.Mean() / 1000,
		P50:   ms(h.ValueAtQuantile(50)),
		P90:   ms(h.ValueAtQuantile(90)),
		P99:   ms(h.ValueAtQuantile(99)),
		P999:  ms(h.ValueAtQuantile(99.9)),
		Max:   ms(h.Max()),
	}
}

// Counts counts occurrences by name (error codes, statuses).
type Counts struct {
	mu sync.Mutex
	m  map[string]int64
}

// Add adds n to name.
func (c *Counts) Add(name string, n int64) {
	if n == 0 {
		return
	}
	c.mu.Lock()
	if c.m == nil {
		c.m = map[string]int64{}
	}
	c.m[name] += n
	c.mu.Unlock()
}

// Total is the sum of all counts.
func (c *Counts) Total() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var n int64
	for _, v := range c.m {
		n += v
	}
	return n
}

// Map returns a copy.
func (c *Counts) Map() map[string]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.m)
}

// Timeline counts events per second since a phase's start, and keeps
// each second's latencies (timeseries.go): enough to see a dip and its
// recovery around a fault, and to draw the report's charts.
type Timeline struct {
	start time.Time
	secs  []second
	lat   [nLat]*latencySeries
}

type second struct {
	produced, consumed, errors atomic.Int64
}

func newTimeline(start time.Time, length time.Duration) *Timeline {
	t := &Timeline{start: start, secs: make([]second, int(length/time.Second)+2)}
	for i := range t.lat {
		t.lat[i] = newLatencySeries(len(t.secs))
	}
	return t
}

// index is the second of now, within the timeline.
func (t *Timeline) index(now time.Time) int {
	return min(max(int(now.Sub(t.start)/time.Second), 0), len(t.secs)-1)
}

func (t *Timeline) at(now time.Time) *second { return &t.secs[t.index(now)] }

// Point is one second of a timeline: messages produced and consumed (acks
// confirmed) and errors in it, and the latencies of the answers that came
// in it (0: none), in ms — produce and claim from their intended send
// time, end to end from production to first delivery — to within 6 %
// (timeseries.go).
type Point struct {
	Second     int     `json:"t"`
	Produced   int64   `json:"produced"`
	Consumed   int64   `json:"consumed"`
	Errors     int64   `json:"errors"`
	ProduceP50 float64 `json:"produce_p50_ms,omitempty"`
	ProduceP99 float64 `json:"produce_p99_ms,omitempty"`
	ClaimP50   float64 `json:"claim_p50_ms,omitempty"`
	ClaimP99   float64 `json:"claim_p99_ms,omitempty"`
	E2EP50     float64 `json:"e2e_p50_ms,omitempty"`
	E2EP99     float64 `json:"e2e_p99_ms,omitempty"`
}

// points returns the first n seconds.
func (t *Timeline) points(n int) []Point {
	n = min(n, len(t.secs))
	out := make([]Point, n)
	for i := range n {
		s := &t.secs[i]
		out[i] = Point{Second: i, Produced: s.produced.Load(), Consumed: s.consumed.Load(), Errors: s.errors.Load()}
	}
	t.fillLatency(out)
	return out
}

// vshardCounts counts messages per vshard.
type vshardCounts [1024]atomic.Int64

// Hot is one vshard's share of the messages.
type Hot struct {
	VShard int     `json:"vshard"`
	Count  int64   `json:"count"`
	Share  float64 `json:"share"`
}

func (v *vshardCounts) list() []int64 {
	out := make([]int64, len(v))
	for i := range v {
		out[i] = v[i].Load()
	}
	return out
}

// top returns the n busiest vshards and how many vshards were used.
func (v *vshardCounts) top(n int) ([]Hot, int) {
	var all []Hot
	var total int64
	for i := range v {
		if c := v[i].Load(); c > 0 {
			all = append(all, Hot{VShard: i, Count: c})
			total += c
		}
	}
	sort.Slice(all, func(a, b int) bool { return all[a].Count > all[b].Count })
	used := len(all)
	all = all[:min(n, len(all))]
	for i := range all {
		all[i].Share = float64(all[i].Count) / float64(total)
	}
	return all, used
}

// errorCode names an error for the counts: the API's code when the router
// answered one, else a short name for the transport failure.
func errorCode(err error) string {
	var re *RequestError
	switch {
	case err == nil:
		return ""
	case errors.As(err, &re):
		return re.Code
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection_refused"
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return "connection_reset"
	case isTimeout(err):
		return "timeout"
	}
	return "transport"
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func sortedKeys[V any](m map[string]V) []string {
	return slices.Sorted(maps.Keys(m))
}
