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
			addKey(r, "t", "a", v(1))
			addKey(r, "u", "b", v(2))
		}, []string{"a"}, []string{"b"}},
		{"one generation back is still held", func(r *recentKeys) {
			for i := range 6 { // size 10: generations of 5
				addKey(r, "t", fmt.Sprint(i), v(uint64(i)))
			}
		}, []string{"0", "4", "5"}, nil},
		{"two generations back are dropped", func(r *recentKeys) {
			for i := range 11 {
				addKey(r, "t", fmt.Sprint(i), v(uint64(i)))
			}
		}, []string{"5", "9", "10"}, []string{"0", "4"}},
		{"half the TTL starts a generation", func(r *recentKeys) {
			addKey(r, "t", "old", v(1))
			at = at.Add(31 * time.Minute)
			addKey(r, "t", "new", v(2))
		}, []string{"old", "new"}, nil},
		{"nothing outlives the TTL", func(r *recentKeys) {
			addKey(r, "t", "old", v(1))
			at = at.Add(31 * time.Minute)
			addKey(r, "t", "new", v(2))
			at = at.Add(30 * time.Minute)
		}, []string{"new"}, []string{"old"}},
		{"a quiet cache forgets after the TTL", func(r *recentKeys) {
			addKey(r, "t", "old", v(1))
			at = at.Add(time.Hour)
		}, nil, []string{"old"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRecentKeys(10, time.Hour, now)
			tc.steps(r)
			for _, k := range tc.held {
				if _, ok := getKey(r, "t", k); !ok {
					t.Errorf("key %s not held", k)
				}
			}
			for _, k := range tc.gone {
				if _, ok := getKey(r, "t", k); ok {
					t.Errorf("key %s still held", k)
				}
			}
			if n := r.len(); n > 10 {
				t.Errorf("%d keys held, size 10", n)
			}
		})
	}
}

func addKey(r *recentKeys, topic, key string, v recentKey) {
	r.addAll(topic, 1, func(int) (string, recentKey, bool) { return key, v, true })
}

func getKey(r *recentKeys, topic, key string) (v recentKey, ok bool) {
	r.getAll(topic, 1, func(int) string { return key }, func(_ int, held recentKey) { v, ok = held, true })
	return v, ok
}

// A batch is looked up and added under one lock with the answers one
// key at a time would give: entries not ok are not added, each key is
// answered from the newest generation that holds it.
func TestRecentKeysBatches(t *testing.T) {
	r := newRecentKeys(4, time.Hour, time.Now) // generations of 2
	keys := []string{"a", "b", "c", "d", "e"}
	r.addAll("t", len(keys), func(i int) (string, recentKey, bool) {
		return keys[i], recentKey{id: uint64(i)}, keys[i] != "b"
	})
	r.addAll("t", 1, func(int) (string, recentKey, bool) { return "e", recentKey{id: 9}, true })
	got := map[string]uint64{}
	r.getAll("t", len(keys), func(i int) string { return keys[i] }, func(i int, v recentKey) { got[keys[i]] = v.id })
	// a and c filled the first generation, d and e the second; the
	// third holds e again (id 9), so the first was dropped.
	if want := map[string]uint64{"d": 3, "e": 9}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("held %v, want %v", got, want)
	}
	r.getAll("u", len(keys), func(i int) string { return keys[i] }, func(i int, v recentKey) { t.Errorf("%s held for topic u", keys[i]) })
}

// BenchmarkRecentKeys is the cache's work for one batched produce of 100
// new keys into a full cache of the default size: each key looked up
// (a miss) and added once created.
func BenchmarkRecentKeys(b *testing.B) {
	keys := make([]string, 400000)
	for i := range keys {
		keys[i] = fmt.Sprintf("run1.k%d", i*7919)
	}
	r := newRecentKeys(100000, time.Hour, time.Now)
	next := 0
	batch := func() {
		ks := keys[next : next+100]
		next = (next + 100) % len(keys)
		r.getAll("loadtest-t3", len(ks), func(i int) string { return ks[i] }, func(int, recentKey) { b.Fatal("a new key was held") })
		r.addAll("loadtest-t3", len(ks), func(i int) (string, recentKey, bool) { return ks[i], recentKey{id: uint64(i)}, true })
	}
	for range 100000 / 100 {
		batch()
	}
	b.ReportAllocs()
	for b.Loop() {
		batch()
	}
}
