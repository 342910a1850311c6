package broker

import (
	"fmt"
	"sync"
	"testing"
	"time"
)

func TestRecentKeysHoldsExpiresAndEvicts(t *testing.T) {
	t.Parallel()
	clock := time.Unix(1e9, 0)
	r := newRecentKeys(2*recentShards*4, time.Hour) // 4 entries per generation and shard
	r.now = func() time.Time { return clock }
	r.epoch = clock

	r.Add("t\x00a", recentKey{id: 1, vshard: 7})
	if got, ok := r.Get("t\x00a"); !ok || got.id != 1 || got.vshard != 7 {
		t.Fatalf("Get after Add: %+v, %v", got, ok)
	}
	r.Add("t\x00a", recentKey{id: 2})
	if got, _ := r.Get("t\x00a"); got.id != 2 {
		t.Fatalf("Add replaces: got id %d, want 2", got.id)
	}
	if _, ok := r.Get("t\x00b"); ok {
		t.Fatal("a key never added is held")
	}
	clock = clock.Add(time.Hour)
	if _, ok := r.Get("t\x00a"); ok {
		t.Fatal("an entry older than the ttl is held")
	}

	// Many more keys than the cache holds: its size stays bounded, and the
	// last keys added are still held (a shard holds at least its last
	// generation's worth, 4 here, whichever shards they fell in).
	const n = 10000
	for i := range n {
		r.Add(fmt.Sprintf("t\x00k%d", i), recentKey{id: uint64(i)})
	}
	if l := r.Len(); l > 2*recentShards*4 {
		t.Fatalf("holds %d entries, at most %d allowed", l, 2*recentShards*4)
	}
	for i := n - 4; i < n; i++ {
		if got, ok := r.Get(fmt.Sprintf("t\x00k%d", i)); !ok || got.id != uint64(i) {
			t.Fatalf("recent key k%d: %+v, %v", i, got, ok)
		}
	}
}

// A key read while it is in the previous generation moves to the current
// one, so keys in use survive the turnover of the others.
func TestRecentKeysKeepsKeysInUse(t *testing.T) {
	t.Parallel()
	r := newRecentKeys(2*recentShards*8, time.Hour)
	r.Add("hot", recentKey{id: 42})
	for i := range 5000 {
		r.Add(fmt.Sprintf("cold%d", i), recentKey{})
		if _, ok := r.Get("hot"); !ok {
			t.Fatalf("the key in use was evicted after %d others", i+1)
		}
	}
}

func TestRecentKeysConcurrent(t *testing.T) {
	t.Parallel()
	r := newRecentKeys(1000, time.Hour)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 2000 {
				k := fmt.Sprintf("%d-%d", g, i%300)
				r.Add(k, recentKey{id: uint64(i)})
				r.Get(k)
			}
		})
	}
	wg.Wait()
	if l := r.Len(); l > 1000 {
		t.Fatalf("holds %d entries, at most 1000 allowed", l)
	}
}
