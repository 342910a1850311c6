package ui

import (
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/shardmq/shardmq/store"
)

// History keeps the last hour of every subscription's depth, in-flight
// and dead counts for the page's sparklines: one sample per Step in a
// ring of Keep samples, the newest of which is overwritten by every count
// until Step has passed, so that a sparkline ends at the current value.
// The leading router's queue-health count (observe.QueueHealth) feeds it;
// nothing here queries a database.
//
// Memory: 12 bytes per subscription and sample (three uint32 counts,
// clamped), 7.2 MB for 10,000 subscriptions over 60 samples. A
// subscription absent from a whole ring's counts is forgotten.
type History struct {
	step time.Duration
	keep int

	mu    sync.Mutex
	times []time.Time // ring of sample times; zero: not taken yet
	pos   int         // the newest sample's index in the ring
	taken int         // samples taken, at most keep
	at    time.Time   // the newest count recorded
	// missing names the clusters the newest count did not reach (at
	// missingAt); that count was not recorded when a complete one was
	// held. Empty once a complete count came.
	missing   []string
	missingAt time.Time
	series    map[key]*series
	partial   bool  // the newest recorded count missed clusters (none complete yet)
	order     []key // sorted by topic, subscription; rebuilt when a series is added or removed
	sorted    bool
}

type key struct{ topic, sub string }

// series is one subscription's ring, aligned with History.times.
type series struct {
	now      store.QueueStats // the newest count
	depth    []uint32
	inFlight []uint32
	dead     []uint32
	seen     int // History.taken when it was last counted
}

// NewHistory returns a history of keep samples step apart. Defaults: one
// minute, 60 samples (the last hour).
func NewHistory(step time.Duration, keep int) *History {
	if step <= 0 {
		step = time.Minute
	}
	if keep <= 1 {
		keep = 60
	}
	return &History{step: step, keep: keep, times: make([]time.Time, keep), series: map[key]*series{}}
}

// Step is the time between two samples.
func (h *History) Step() time.Duration { return h.step }

func clamp(n int64) uint32 {
	switch {
	case n < 0:
		return 0
	case n > 1<<32-1:
		return 1<<32 - 1
	}
	return uint32(n)
}

// Record takes one count of every subscription at time at; missing names
// the clusters it did not reach. Such a count is smaller than the truth:
// while an earlier complete count is held it is not recorded (the page
// shows the last complete count, marked stale, and names the clusters).
func (h *History) Record(at time.Time, subs []store.QueueStats, missing []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.missing, h.missingAt = append([]string(nil), missing...), at
	if len(missing) == 0 {
		h.missing, h.missingAt = nil, time.Time{}
	} else if h.taken > 0 && !h.partial {
		return
	}
	h.partial = len(missing) > 0
	h.at = at
	if h.taken == 0 || at.Sub(h.times[h.pos]) >= h.step {
		if h.taken > 0 {
			h.pos = (h.pos + 1) % h.keep
		}
		h.taken++
		h.times[h.pos] = at
		for k, s := range h.series {
			if h.taken-s.seen >= h.keep {
				delete(h.series, k)
				h.sorted = false
				continue
			}
			s.depth[h.pos], s.inFlight[h.pos], s.dead[h.pos] = 0, 0, 0
		}
	}
	for _, q := range subs {
		k := key{q.Topic, q.Subscription}
		s := h.series[k]
		if s == nil {
			s = &series{depth: make([]uint32, h.keep), inFlight: make([]uint32, h.keep), dead: make([]uint32, h.keep)}
			h.series[k] = s
			h.sorted = false
		}
		s.now = q
		s.seen = h.taken
		s.depth[h.pos] = clamp(q.Ready + q.Delayed + q.Parked)
		s.inFlight[h.pos] = clamp(q.InFlight)
		s.dead[h.pos] = clamp(q.Dead)
	}
}

// Query selects one page of subscriptions.
type Query struct {
	// Filter keeps subscriptions whose "topic/subscription" contains it.
	Filter string
	// Sort is "name" (topic, then subscription; the default), or "depth",
	// "in_flight" or "dead", largest first, or "lag": the oldest ready
	// message first.
	Sort          string
	Offset, Limit int
}

// Row is one subscription's newest count and its samples, oldest first.
type Row struct {
	store.QueueStats
	Depth        int64
	DepthHist    []uint32
	InFlightHist []uint32
	DeadHist     []uint32
}

// Page is one page of a Query.
type Page struct {
	At time.Time // the newest count recorded; zero before the first
	// Missing names the clusters the newest count did not reach, at
	// MissingAt (after At when that count was not recorded).
	Missing   []string
	MissingAt time.Time
	Times     []time.Time
	Total     int // subscriptions that pass the filter
	Rows      []Row
}

// Page answers q from the samples held.
func (h *History) Page(q Query) Page {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.sorted {
		h.order = h.order[:0]
		for k := range h.series {
			h.order = append(h.order, k)
		}
		sort.Slice(h.order, func(i, j int) bool {
			if h.order[i].topic != h.order[j].topic {
				return h.order[i].topic < h.order[j].topic
			}
			return h.order[i].sub < h.order[j].sub
		})
		h.sorted = true
	}
	var keys []key
	for _, k := range h.order {
		s := h.series[k]
		if s.seen != h.taken {
			continue // not in the newest count: deleted
		}
		if q.Filter == "" || strings.Contains(k.topic+"/"+k.sub, q.Filter) {
			keys = append(keys, k)
		}
	}
	var by func(s *series) int64
	switch q.Sort {
	case "depth":
		by = func(s *series) int64 { return s.now.Ready + s.now.Delayed + s.now.Parked }
	case "in_flight":
		by = func(s *series) int64 { return s.now.InFlight }
	case "dead":
		by = func(s *series) int64 { return s.now.Dead }
	}
	if by != nil {
		sort.SliceStable(keys, func(i, j int) bool { return by(h.series[keys[i]]) > by(h.series[keys[j]]) })
	}
	if q.Sort == "lag" {
		// Ids grow with their produce time: the smallest is the oldest; none
		// ready (0) goes last.
		oldest := func(k key) uint64 { return h.series[k].now.OldestReady - 1 }
		sort.SliceStable(keys, func(i, j int) bool { return oldest(keys[i]) < oldest(keys[j]) })
	}
	n := min(h.taken, h.keep)
	p := Page{At: h.at, Total: len(keys), Missing: h.missing, MissingAt: h.missingAt}
	first := (h.pos - n + 1 + h.keep) % h.keep
	for i := 0; i < n; i++ {
		p.Times = append(p.Times, h.times[(first+i)%h.keep])
	}
	lo := min(max(q.Offset, 0), len(keys))
	hi := min(lo+max(q.Limit, 0), len(keys))
	for _, k := range keys[lo:hi] {
		s := h.series[k]
		r := Row{QueueStats: s.now, Depth: s.now.Ready + s.now.Delayed + s.now.Parked}
		for i := 0; i < n; i++ {
			j := (first + i) % h.keep
			r.DepthHist = append(r.DepthHist, s.depth[j])
			r.InFlightHist = append(r.InFlightHist, s.inFlight[j])
			r.DeadHist = append(r.DeadHist, s.dead[j])
		}
		p.Rows = append(p.Rows, r)
	}
	return p
}
