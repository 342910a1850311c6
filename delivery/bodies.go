package delivery

import (
	"sync"
	"time"

	"github.com/shardmq/shardmq/domain"
	"github.com/shardmq/shardmq/store"
)

// Bodies keeps the messages this router produced lately, so that an owner
// handing them out does not read them back from their primary: a claim of
// fresh messages then costs the cluster nothing until their ack (as a
// broker's consumers read the tail of a log from memory). Messages are
// immutable once stored, so a kept body is exactly what the table holds.
//
// An acked message is dropped at once. Once the byte budget is spent, the
// oldest goes if it was produced more than bodyKeep before the new one,
// else the new one is not kept: under a backlog, consumers take the
// oldest first, so keeping the oldest (and refusing the newest) is what
// they hit; the age bound lets bodies nobody consumes through this router
// (a subscription without consumers, another router's owner) make room.
// A message produced through another router, evicted or refused is read
// from its primary as before. Safe for concurrent use.
type Bodies struct {
	max int

	mu    sync.Mutex
	byID  map[uint64]bodyEntry
	fifo  []uint64 // ids in the order remembered; may name dropped ids
	head  int      // fifo[head:] is live
	bytes int
	hits  uint64
	miss  uint64
	// fullUntil: while the cache is full, a message created no later
	// than this is not kept: the oldest kept body was younger than
	// bodyKeep before it when room last looked (see room). Acks that drop
	// that body since can leave an older one first in line; the messages
	// that could have dropped it until then are not kept either, a loss
	// of a few seconds' bodies to a cache that keeps what it can.
	fullUntil time.Time
}

// bodyKeep is how long a body keeps its place in a full cache.
const bodyKeep = 30 * time.Second

type bodyEntry struct {
	m    *store.Message
	size int
}

// NewBodies returns a cache of at most maxBytes of messages (as
// bodySize counts them); nil when maxBytes <= 0 (no cache: every
// method of a nil *Bodies is a no-op).
func NewBodies(maxBytes int) *Bodies {
	if maxBytes <= 0 {
		return nil
	}
	return &Bodies{max: maxBytes, byID: map[uint64]bodyEntry{}}
}

// bodySize is what a kept message costs the router's memory: its byte
// fields and a fixed share for the struct, its map entry and its id in
// the queue.
func bodySize(m *store.Message) int {
	return 160 + len(m.Topic) + len(m.Key) + len(m.OrderKey) + len(m.TransactionID) + len(m.Headers) + len(m.Payload)
}

// Remember keeps msgs, committed as new messages. The caller must not
// modify them (or their byte slices) afterwards.
func (b *Bodies) Remember(msgs []*store.Message) {
	if b == nil || len(msgs) == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, m := range msgs {
		size := bodySize(m)
		if b.bytes+size > b.max && !m.CreatedAt.After(b.fullUntil) {
			// Full of bodies too young to drop (room said so for one
			// no older than this): not kept, and no lookup in byID. A
			// produce that outgrows the cache would otherwise pay three
			// lookups in a map of some hundred thousand bodies for each
			// message (5 % of the router's CPU in a produce run).
			continue
		}
		if _, ok := b.byID[m.ID]; ok {
			continue
		}
		if size > b.max/4 || !b.room(size, m.CreatedAt.Add(-bodyKeep)) {
			continue
		}
		kept := *m
		kept.Status = domain.MessagePending // as the table reads a new message
		b.byID[m.ID] = bodyEntry{m: &kept, size: size}
		b.fifo = append(b.fifo, m.ID)
		b.bytes += size
	}
	b.compact()
}

// room makes room for size bytes by dropping bodies produced before
// older, oldest first; false when that is not enough.
func (b *Bodies) room(size int, older time.Time) bool {
	for b.bytes+size > b.max {
		for b.head < len(b.fifo) {
			if _, ok := b.byID[b.fifo[b.head]]; ok {
				break
			}
			b.head++ // acked
		}
		if b.head == len(b.fifo) {
			return false
		}
		e := b.byID[b.fifo[b.head]]
		if !e.m.CreatedAt.Before(older) {
			// No message created by then can drop this one: Remember
			// skips them while the cache stays this full.
			b.fullUntil = e.m.CreatedAt.Add(bodyKeep)
			return false
		}
		delete(b.byID, e.m.ID)
		b.bytes -= e.size
		b.head++
	}
	return true
}

// compact drops the queue's dead ids once they are most of it.
func (b *Bodies) compact() {
	if b.head > 1024 && b.head > len(b.fifo)/2 {
		n := copy(b.fifo, b.fifo[b.head:])
		clear(b.fifo[n:])
		b.fifo = b.fifo[:n]
		b.head = 0
	}
	if len(b.fifo)-b.head > 4*len(b.byID)+1024 {
		// Mostly acked ids: keep only the live ones, in order.
		live := b.fifo[:0]
		for _, id := range b.fifo[b.head:] {
			if _, ok := b.byID[id]; ok {
				live = append(live, id)
			}
		}
		clear(b.fifo[len(live):])
		b.fifo, b.head = live, 0
	}
}

// take answers the kept messages of cs (those whose topic, vshard,
// priority and order key match the candidate, so that another router's
// id that happens to equal one of ours is never mistaken for it) and the
// ids it does not keep.
func (b *Bodies) take(topic string, cs []store.Candidate) (map[uint64]*store.Message, []uint64) {
	out := make(map[uint64]*store.Message, len(cs))
	if b == nil {
		miss := make([]uint64, len(cs))
		for i, c := range cs {
			miss[i] = c.MessageID
		}
		return out, miss
	}
	var miss []uint64
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, c := range cs {
		e, ok := b.byID[c.MessageID]
		if ok && e.m.Topic == topic && e.m.VShard == c.VShard && e.m.Priority == c.Priority && e.m.OrderKey == c.OrderKey {
			out[c.MessageID] = e.m
			continue
		}
		miss = append(miss, c.MessageID)
	}
	b.hits += uint64(len(out))
	b.miss += uint64(len(miss))
	return out, miss
}

// forget drops acked messages: no claim needs them again.
func (b *Bodies) forget(ids []uint64) {
	if b == nil || len(ids) == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, id := range ids {
		if e, ok := b.byID[id]; ok {
			delete(b.byID, id)
			b.bytes -= e.size
		}
	}
	b.compact()
}

// BodiesStats is what the cache holds and how often it answered.
type BodiesStats struct {
	Messages, Bytes, MaxBytes int
	Hits, Misses              uint64
}

// Stats reads the cache's figures (zero for a nil cache).
func (b *Bodies) Stats() BodiesStats {
	if b == nil {
		return BodiesStats{}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return BodiesStats{Messages: len(b.byID), Bytes: b.bytes, MaxBytes: b.max, Hits: b.hits, Misses: b.miss}
}
