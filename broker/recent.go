package broker

import (
	"hash/maphash"
	"sync"
	"time"
)

// recentShards splits the recent-keys cache so that concurrent requests
// rarely wait on one another's lock.
const recentShards = 16

// recentKeys is the recent-keys cache: (topic, key) → the registered key,
// for at most ttl and about size entries. It answers known duplicates and
// conflicts early and never decides that a key is new, so what it evicts
// only costs a round trip to the database.
//
// Each shard keeps two generations of one map each: entries go into the
// current one; when it is full it becomes the previous one and the
// oldest generation is dropped whole; a hit in the previous generation
// moves the entry to the current one. That evicts roughly the least
// recently used half at a time, for one map write per Add. It replaced
// hashicorp's expirable LRU, whose list, expiry buckets and single lock
// took 9 % of the router's CPU under single-message produce load
// (docs/performance.md).
type recentKeys struct {
	seed   maphash.Seed
	ttl    time.Duration
	now    func() time.Time
	epoch  time.Time // base of the entries' times
	perGen int       // entries of one generation of one shard
	shards [recentShards]recentShard
}

type recentShard struct {
	mu        sync.Mutex
	cur, prev map[string]recentEntry
}

type recentEntry struct {
	v  recentKey
	at time.Duration // since epoch
}

// newRecentKeys holds at most size entries (the two generations of every
// shard together), each for at most ttl.
func newRecentKeys(size int, ttl time.Duration) *recentKeys {
	r := &recentKeys{seed: maphash.MakeSeed(), ttl: ttl, now: time.Now, perGen: max(1, size/(2*recentShards))}
	r.epoch = r.now()
	for i := range r.shards {
		r.shards[i].cur = make(map[string]recentEntry)
	}
	return r
}

func (r *recentKeys) shard(key string) *recentShard {
	return &r.shards[maphash.String(r.seed, key)%recentShards]
}

// Get answers key's entry if it was added less than ttl ago and is still
// held.
func (r *recentKeys) Get(key string) (recentKey, bool) {
	s := r.shard(key)
	now := r.now().Sub(r.epoch)
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.cur[key]
	if !ok {
		if e, ok = s.prev[key]; ok && now-e.at < r.ttl {
			delete(s.prev, key)
			r.put(s, key, e)
		}
	}
	if !ok || now-e.at >= r.ttl {
		return recentKey{}, false
	}
	return e.v, true
}

// Add holds v for key, replacing what was held.
func (r *recentKeys) Add(key string, v recentKey) {
	s := r.shard(key)
	e := recentEntry{v: v, at: r.now().Sub(r.epoch)}
	s.mu.Lock()
	delete(s.prev, key)
	r.put(s, key, e)
	s.mu.Unlock()
}

// put writes into the current generation, turning it into the previous
// one when full. s.mu is held.
func (r *recentKeys) put(s *recentShard, key string, e recentEntry) {
	if _, ok := s.cur[key]; !ok && len(s.cur) >= r.perGen {
		s.prev = s.cur
		s.cur = make(map[string]recentEntry, r.perGen)
	}
	s.cur[key] = e
}

// Len counts the entries held, expired ones included.
func (r *recentKeys) Len() int {
	n := 0
	for i := range r.shards {
		s := &r.shards[i]
		s.mu.Lock()
		n += len(s.cur) + len(s.prev)
		s.mu.Unlock()
	}
	return n
}
