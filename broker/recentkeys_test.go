package broker

import (
	"fmt"
	"testing"
	"time"
)

// The recent-keys cache holds a key until half its size of newer keys or
// half its TTL pushed its generation out, never past the TTL, and never
// more than its size.
func TestRecentKeysGenerations(t *testing.T) {
	at := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	now := func() time.Time { return at }
	v := func(id uint64) recentKey { return recentKey{id: id} }
	for _, tc := range []struct {
		name  string
		steps func(r *recentKeys)
		held  []string // keys of topic t still answered
		gone  []string
	}{
		{"added keys are answered per topic", func(r *recentKeys) {
			r.add("t", "a", v(1))
			r.add("u", "b", v(2))
		}, []string{"a"}, []string{"b"}},
		{"one generation back is still held", func(r *recentKeys) {
			for i := range 6 { // size 10: generations of 5
				r.add("t", fmt.Sprint(i), v(uint64(i)))
			}
		}, []string{"0", "4", "5"}, nil},
		{"two generations back are dropped", func(r *recentKeys) {
			for i := range 11 {
				r.add("t", fmt.Sprint(i), v(uint64(i)))
			}
		}, []string{"5", "9", "10"}, []string{"0", "4"}},
		{"half the TTL starts a generation", func(r *recentKeys) {
			r.add("t", "old", v(1))
			at = at.Add(31 * time.Minute)
			r.add("t", "new", v(2))
		}, []string{"old", "new"}, nil},
		{"nothing outlives the TTL", func(r *recentKeys) {
			r.add("t", "old", v(1))
			at = at.Add(31 * time.Minute)
			r.add("t", "new", v(2))
			at = at.Add(30 * time.Minute)
		}, []string{"new"}, []string{"old"}},
		{"a quiet cache forgets after the TTL", func(r *recentKeys) {
			r.add("t", "old", v(1))
			at = at.Add(time.Hour)
		}, nil, []string{"old"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRecentKeys(10, time.Hour, now)
			tc.steps(r)
			for _, k := range tc.held {
				if _, ok := r.get("t", k); !ok {
					t.Errorf("key %s not held", k)
				}
			}
			for _, k := range tc.gone {
				if _, ok := r.get("t", k); ok {
					t.Errorf("key %s still held", k)
				}
			}
			if n := r.len(); n > 10 {
				t.Errorf("%d keys held, size 10", n)
			}
		})
	}
}
