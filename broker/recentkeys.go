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

// get answers what is remembered of topic's key.
func (r *recentKeys) get(topic, key string) (recentKey, bool) {
	n := recentName{topic, key}
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	if now.Sub(r.curSince) >= r.ttl {
		// No key was added for half the TTL: both generations are old.
		r.prev, r.cur, r.curSince = nil, make(map[recentName]recentKey, r.half), now
		return recentKey{}, false
	}
	if v, ok := r.cur[n]; ok {
		return v, true
	}
	if r.prev == nil || now.Sub(r.prevSince) >= r.ttl {
		r.prev = nil // its oldest key is a TTL old
		return recentKey{}, false
	}
	v, ok := r.prev[n]
	return v, ok
}

// add remembers topic's key.
func (r *recentKeys) add(topic, key string, v recentKey) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.cur) >= r.half || r.now().Sub(r.curSince) >= r.ttl/2 {
		r.prev, r.prevSince = r.cur, r.curSince
		r.cur, r.curSince = make(map[recentName]recentKey, r.half), r.now()
	}
	r.cur[recentName{topic, key}] = v
}

// len is how many keys are held (the two generations may hold one twice).
func (r *recentKeys) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.cur) + len(r.prev)
}
