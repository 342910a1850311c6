package store

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// BenchmarkProduceFastSQL is the fast produce's statement and arguments
// for a batch of 100 new messages with 200-byte payloads and one
// subscription (no database: the text and arguments are what is built).
func BenchmarkProduceFastSQL(b *testing.B) {
	now := time.Now().UTC()
	payload := []byte(`{"k":"x","p":"` + strings.Repeat("x", 180) + `"}`)
	items := make([]ProduceItem, 100)
	keys := make([]keyRow, len(items))
	for i := range items {
		m := &Message{ID: uint64(1e15) + uint64(i), VShard: uint16(i * 7), Topic: "loadtest-t3", Key: fmt.Sprint("run1.k", i),
			PayloadJSON: true, Payload: payload, CreatedAt: now}
		hash := make([]byte, 16)
		items[i] = ProduceItem{Msg: m, Hash: hash, AvailableAt: now, Subscriptions: []string{"s1"}}
		keys[i] = keyRow{topic: m.Topic, key: m.Key, vshard: m.VShard, messageID: m.ID, hash: hash, createdAt: m.CreatedAt}
	}
	b.ReportAllocs()
	for b.Loop() {
		q, args := produceFastSQL(keys, items, Fence{MapVersion: 3}, true)
		if len(q) == 0 || len(args) != 1+100*(6+11+7) {
			b.Fatalf("%d arguments", len(args))
		}
	}
}
