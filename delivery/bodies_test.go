package delivery

import (
	"testing"
	"time"

	"github.com/shardmq/shardmq/domain"
	"github.com/shardmq/shardmq/store"
)

func body(id uint64, at time.Time, payload int) *store.Message {
	return &store.Message{ID: id, Topic: "t", VShard: 7, Priority: 1, OrderKey: "o", Key: "k", Payload: make([]byte, payload), CreatedAt: at}
}

func cand(m *store.Message) store.Candidate {
	return store.Candidate{MessageID: m.ID, VShard: m.VShard, Priority: m.Priority, OrderKey: m.OrderKey}
}

func TestBodiesKeepTakeForget(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	a, b2 := body(1, t0, 10), body(2, t0, 10)
	other := *b2
	other.ID, other.VShard = 3, 8 // another router's id: same number, another message
	tests := []struct {
		name      string
		remember  []*store.Message
		forget    []uint64
		ask       []store.Candidate
		wantHit   []uint64
		wantMiss  []uint64
		wantCount int
	}{
		{"kept bodies answer", []*store.Message{a, b2}, nil, []store.Candidate{cand(a), cand(b2)}, []uint64{1, 2}, nil, 2},
		{"unknown ids are read", []*store.Message{a}, nil, []store.Candidate{cand(a), cand(b2)}, []uint64{1}, []uint64{2}, 1},
		{"acked bodies are dropped", []*store.Message{a, b2}, []uint64{1}, []store.Candidate{cand(a), cand(b2)}, []uint64{2}, []uint64{1}, 1},
		{"a candidate that differs is not ours", []*store.Message{a}, nil, []store.Candidate{{MessageID: 1, VShard: 8, Priority: 1, OrderKey: "o"}}, nil, []uint64{1}, 1},
		{"same id, other priority", []*store.Message{a}, nil, []store.Candidate{{MessageID: 1, VShard: 7, Priority: 2, OrderKey: "o"}}, nil, []uint64{1}, 1},
		{"same id, other order key", []*store.Message{a}, nil, []store.Candidate{{MessageID: 1, VShard: 7, Priority: 1}}, nil, []uint64{1}, 1},
		{"remembered twice is kept once", []*store.Message{a, a}, nil, []store.Candidate{cand(a)}, []uint64{1}, nil, 1},
		{"another vshard's message under its own id", []*store.Message{&other}, nil, []store.Candidate{cand(&other)}, []uint64{3}, nil, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := NewBodies(1 << 20)
			c.Remember(tc.remember)
			c.forget(tc.forget)
			got, miss := c.take("t", tc.ask)
			if len(got) != len(tc.wantHit) || len(miss) != len(tc.wantMiss) {
				t.Fatalf("hits %v misses %v, want %v and %v", keys(got), miss, tc.wantHit, tc.wantMiss)
			}
			for _, id := range tc.wantHit {
				if got[id] == nil || got[id].Status != domain.MessagePending {
					t.Fatalf("id %d: %+v", id, got[id])
				}
			}
			for i, id := range tc.wantMiss {
				if miss[i] != id {
					t.Fatalf("misses %v, want %v", miss, tc.wantMiss)
				}
			}
			if st := c.Stats(); st.Messages != tc.wantCount {
				t.Fatalf("kept %d, want %d", st.Messages, tc.wantCount)
			}
		})
	}
	if _, miss := NewBodies(1<<20).take("other-topic", []store.Candidate{cand(a)}); len(miss) != 1 {
		t.Fatal("a kept body answered for another topic")
	}
}

func keys(m map[uint64]*store.Message) []uint64 {
	var out []uint64
	for id := range m {
		out = append(out, id)
	}
	return out
}

// A full cache keeps its oldest bodies (consumers take the oldest first)
// and refuses new ones, until the oldest are bodyKeep old.
func TestBodiesFullKeepsTheOldestUntilTheyAge(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	size := bodySize(body(0, t0, 100))
	c := NewBodies(10 * size)
	for i := range 10 {
		c.Remember([]*store.Message{body(uint64(i+1), t0, 100)})
	}
	c.Remember([]*store.Message{body(11, t0.Add(time.Second), 100)})
	if got, _ := c.take("t", []store.Candidate{cand(body(1, t0, 100)), cand(body(11, t0, 100))}); got[1] == nil || got[11] != nil {
		t.Fatalf("full cache: kept %v, want the oldest and not the newest", keys(got))
	}
	c.forget([]uint64{1, 2})
	c.Remember([]*store.Message{body(12, t0.Add(time.Second), 100)})
	if got, _ := c.take("t", []store.Candidate{cand(body(12, t0, 100))}); got[12] == nil {
		t.Fatal("room made by acks was not used")
	}
	c.Remember([]*store.Message{body(14, t0.Add(time.Second), 100)}) // full again
	c.Remember([]*store.Message{body(13, t0.Add(bodyKeep+time.Second), 100)})
	got, _ := c.take("t", []store.Candidate{cand(body(3, t0, 100)), cand(body(13, t0, 100))})
	if got[3] != nil || got[13] == nil {
		t.Fatalf("after %v the oldest make room: kept %v", bodyKeep, keys(got))
	}
	if st := c.Stats(); st.Bytes > st.MaxBytes || st.Messages != 10 {
		t.Fatalf("stats %+v", st)
	}
	if c := NewBodies(4 * size); c != nil {
		c.Remember([]*store.Message{body(1, t0, 10*size)})
		if c.Stats().Messages != 0 {
			t.Fatal("a body over a quarter of the budget was kept")
		}
	}
	var nilCache *Bodies
	nilCache.Remember([]*store.Message{body(1, t0, 1)})
	nilCache.forget([]uint64{1})
	if _, miss := nilCache.take("t", []store.Candidate{cand(body(1, t0, 1))}); len(miss) != 1 {
		t.Fatal("a nil cache answered")
	}
}

// The queue of ids does not grow without bound when bodies are acked in
// another order than produced.
func TestBodiesQueueCompacts(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	c := NewBodies(1 << 30)
	for i := range 100000 {
		id := uint64(i + 1)
		c.Remember([]*store.Message{body(id, t0, 1)})
		if i%2 == 1 {
			c.forget([]uint64{id})
		}
	}
	if n := len(c.fifo) - c.head; n > 4*c.Stats().Messages+1024 {
		t.Fatalf("%d ids queued for %d bodies", n, c.Stats().Messages)
	}
}

// BenchmarkBodiesRememberFull remembers batches of 100 messages into a
// cache full of bodies too young to drop, as a produce does while the
// backlog outgrows the cache: none is kept.
func BenchmarkBodiesRememberFull(b *testing.B) {
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	size := bodySize(body(0, t0, 200))
	c := NewBodies(100_000 * size)
	id := uint64(0)
	for range 1000 {
		batch := make([]*store.Message, 100)
		for i := range batch {
			id++
			batch[i] = body(id, t0, 200)
		}
		c.Remember(batch)
	}
	batch := make([]*store.Message, 100)
	for i := range batch {
		batch[i] = body(0, t0.Add(time.Second), 200)
	}
	b.ReportAllocs()
	for b.Loop() {
		for _, m := range batch {
			id++
			m.ID = id
		}
		c.Remember(batch)
	}
	if st := c.Stats(); st.Messages != 100_000 {
		b.Fatalf("%d kept, want the 100,000 of the full cache", st.Messages)
	}
}
