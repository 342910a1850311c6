package ui

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/shardmq/shardmq/store"
)

func qs(topic, sub string, ready, inFlight, dead int64) store.QueueStats {
	return store.QueueStats{Topic: topic, Subscription: sub, Ready: ready, InFlight: inFlight, Dead: dead}
}

// A count within the step overwrites the newest sample; one a step later
// starts the next; the ring keeps the last keep samples, oldest first.
func TestHistoryRing(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC)
	h := NewHistory(time.Minute, 3)
	for i, c := range []struct {
		after time.Duration
		depth int64
		want  []uint32
	}{
		{0, 5, []uint32{5}},
		{20 * time.Second, 7, []uint32{7}}, // same sample, newer value
		{time.Minute, 8, []uint32{7, 8}},
		{2 * time.Minute, 9, []uint32{7, 8, 9}},
		{3 * time.Minute, 10, []uint32{8, 9, 10}}, // wrapped
		{3*time.Minute + 59*time.Second, 11, []uint32{8, 9, 11}},
		{5 * time.Minute, 12, []uint32{9, 11, 12}},
	} {
		h.Record(t0.Add(c.after), []store.QueueStats{qs("t", "s", c.depth, 1, 2)}, nil)
		p := h.Page(Query{Limit: 10})
		if len(p.Rows) != 1 || !slices.Equal(p.Rows[0].DepthHist, c.want) || p.Rows[0].Depth != c.depth || len(p.Times) != len(c.want) {
			t.Fatalf("step %d: %+v, want depth history %v", i, p, c.want)
		}
		if !p.At.Equal(t0.Add(c.after)) {
			t.Fatalf("step %d: at %v", i, p.At)
		}
	}
}

// A subscription missing from the newest count is not listed (deleted),
// and one absent a whole ring is forgotten; one that appears late has
// zeros before it.
func TestHistoryDeletedAndNew(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC)
	h := NewHistory(time.Minute, 3)
	h.Record(t0, []store.QueueStats{qs("a", "s", 1, 0, 0)}, nil)
	h.Record(t0.Add(time.Minute), []store.QueueStats{qs("b", "s", 4, 0, 0)}, nil)
	p := h.Page(Query{Limit: 10})
	if p.Total != 1 || p.Rows[0].Topic != "b" || !slices.Equal(p.Rows[0].DepthHist, []uint32{0, 4}) {
		t.Fatalf("%+v", p)
	}
	h.Record(t0.Add(2*time.Minute), []store.QueueStats{qs("b", "s", 4, 0, 0)}, nil)
	h.Record(t0.Add(3*time.Minute), []store.QueueStats{qs("b", "s", 4, 0, 0)}, nil)
	if _, ok := h.series[key{"a", "s"}]; ok {
		t.Fatal("a subscription absent for a whole ring is still kept")
	}
}

// Filter, sort and paging over many subscriptions.
func TestHistoryPage(t *testing.T) {
	t.Parallel()
	h := NewHistory(time.Minute, 60)
	var subs []store.QueueStats
	for i := range 10000 {
		subs = append(subs, qs(fmt.Sprintf("topic-%02d", i%100), fmt.Sprintf("sub-%04d", i), int64(i), int64(i%7), int64(i%13)))
	}
	h.Record(time.Now(), subs, nil)
	for _, c := range []struct {
		name      string
		q         Query
		total     int
		firstSub  string
		rows      int
		firstSort int64
	}{
		{"first page by name", Query{Limit: 50}, 10000, "sub-0000", 50, 0},
		{"last partial page", Query{Offset: 9990, Limit: 50}, 10000, "sub-9099", 10, 9099},
		{"past the end", Query{Offset: 20000, Limit: 50}, 10000, "", 0, 0},
		{"filter", Query{Filter: "topic-07/", Limit: 500}, 100, "sub-0007", 100, 7},
		{"deepest first", Query{Sort: "depth", Limit: 5}, 10000, "sub-9999", 5, 9999},
		{"most dead first", Query{Sort: "dead", Limit: 1}, 10000, "sub-1000", 1, 1000},
	} {
		p := h.Page(c.q)
		if p.Total != c.total || len(p.Rows) != c.rows {
			t.Fatalf("%s: total %d rows %d, want %d %d", c.name, p.Total, len(p.Rows), c.total, c.rows)
		}
		if c.rows > 0 && (p.Rows[0].Subscription != c.firstSub || p.Rows[0].Ready != c.firstSort) {
			t.Fatalf("%s: first row %+v, want %s", c.name, p.Rows[0].QueueStats, c.firstSub)
		}
	}
}

// A count that missed a cluster is smaller than the truth: after a
// complete one it is not recorded (the last complete count stays, its
// time too) and the clusters are named; a complete count clears them.
// With no complete count yet, the partial one is all there is.
func TestHistoryPartialCountKeepsTheLastCompleteOne(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC)
	h := NewHistory(time.Minute, 5)
	h.Record(t0, []store.QueueStats{qs("t", "s", 3, 0, 0)}, []string{"c2"})
	p := h.Page(Query{Limit: 10})
	if len(p.Rows) != 1 || p.Rows[0].Depth != 3 || !slices.Equal(p.Missing, []string{"c2"}) || !p.At.Equal(t0) {
		t.Fatalf("first, partial: %+v", p)
	}
	h.Record(t0.Add(time.Minute), []store.QueueStats{qs("t", "s", 10, 0, 0)}, nil)
	h.Record(t0.Add(2*time.Minute), []store.QueueStats{qs("t", "s", 4, 0, 0)}, []string{"c2"})
	p = h.Page(Query{Limit: 10})
	if p.Rows[0].Depth != 10 || !slices.Equal(p.Rows[0].DepthHist, []uint32{3, 10}) || !p.At.Equal(t0.Add(time.Minute)) ||
		!slices.Equal(p.Missing, []string{"c2"}) || !p.MissingAt.Equal(t0.Add(2*time.Minute)) {
		t.Fatalf("partial after complete: %+v", p)
	}
	h.Record(t0.Add(3*time.Minute), []store.QueueStats{qs("t", "s", 12, 0, 0)}, nil)
	p = h.Page(Query{Limit: 10})
	if p.Rows[0].Depth != 12 || len(p.Missing) != 0 || !slices.Equal(p.Rows[0].DepthHist, []uint32{3, 10, 12}) {
		t.Fatalf("complete again: %+v", p)
	}
}

// Sorted by lag, the subscription whose oldest ready message is oldest
// (the smallest id) comes first; one with nothing ready comes last.
func TestHistorySortByLag(t *testing.T) {
	t.Parallel()
	h := NewHistory(time.Minute, 5)
	a, b, c := qs("t", "a", 1, 0, 0), qs("t", "b", 0, 0, 0), qs("t", "c", 1, 0, 0)
	a.OldestReady, c.OldestReady = 500, 100
	h.Record(time.Now(), []store.QueueStats{a, b, c}, nil)
	var got []string
	for _, r := range h.Page(Query{Sort: "lag", Limit: 10}).Rows {
		got = append(got, r.Subscription)
	}
	if !slices.Equal(got, []string{"c", "a", "b"}) {
		t.Fatalf("by lag: %v", got)
	}
}
