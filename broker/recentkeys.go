package broker

import (
	"sync"
	"time"
)

// recentKeys remembers keys this router registered or found registered
// lately, so that a re-sent key is answered duplicate (or conflict)
// without a round trip. It never says a key is new: a key it does not
// hold goes to the database.
//
// Two generations of plain maps instead of an LRU list: every created
// message is added, and an expiring LRU's list and bucket bookkeeping on
// each add cost the router 8.5% of its CPU in a batched produce, where a
// map assignment costs a fraction of that. A key is added to the current
// generation; once that holds half the size, or is half the TTL old, it
// becomes the previous one and the one before is dropped. So at most size
// keys are held, and a key is held for at least half the TTL (unless half
// the size of newer keys came after it) and never longer than the TTL.
type recentKeys struct {
	mu        sync.Mutex
	half      int
	ttl       time.Duration
	now       func() time.Time
	cur, prev map[recentName]recentKey
	curSince  time.Time
	prevSince time.Time
}

// recentName is a key of a topic.
type recentName struct{ topic, key string }

func newRecentKeys(size int, ttl time.Duration, now func() time.Time) *recentKeys {
	half := max(size/2, 1)
	t := now()
	return &recentKeys{half: half, ttl: ttl, now: now, cur: make(map[recentName]recentKey, half), curSince: t, prevSince: t}
}

// getAll looks topic's keys key(0) … key(n-1) up under one lock and calls
// held(i, v) with what is remembered of each key held (under the lock:
// held must not use the cache).
func (r *recentKeys) getAll(topic string, n int, key func(i int) string, held func(i int, v recentKey)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	if now.Sub(r.curSince) >= r.ttl {
		// No key was added for half the TTL: both generations are old.
		r.prev, r.cur, r.curSince = nil, make(map[recentName]recentKey, r.half), now
		return
	}
	if r.prev != nil && now.Sub(r.prevSince) >= r.ttl {
		r.prev = nil // its oldest key is a TTL old
	}
	for i := range n {
		name := recentName{topic, key(i)}
		if v, ok := r.cur[name]; ok {
			held(i, v)
		} else if v, ok := r.prev[name]; ok {
			held(i, v)
		}
	}
}

// addAll remembers, under one lock, the keys of topic that entry(0) …
// entry(n-1) answer with ok.
func (r *recentKeys) addAll(topic string, n int, entry func(i int) (key string, v recentKey, ok bool)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	for i := range n {
		key, v, ok := entry(i)
		if !ok {
			continue
		}
		if len(r.cur) >= r.half || now.Sub(r.curSince) >= r.ttl/2 {
			r.prev, r.prevSince = r.cur, r.curSince
			r.cur, r.curSince = make(map[recentName]recentKey, r.half), now
		}
		r.cur[recentName{topic, key}] = v
	}
}

// len is how many keys are held (the two generations may hold one twice).
func (r *recentKeys) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.cur) + len(r.prev)
}
