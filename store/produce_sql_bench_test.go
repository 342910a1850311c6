package store

import (
	"context"
	"database/sql/driver"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/shardmq/shardmq/internal/testbed"
)

// BenchmarkProduceFastSQL is the fast produce's statement and arguments
// for a batch of 100 new messages with 200-byte payloads and one
// subscription (no database: the text and arguments are what is built).
func BenchmarkProduceFastSQL(b *testing.B) {
	keys, items, fence, fenced := produceBatchSQLInput()
	b.ReportAllocs()
	for b.Loop() {
		q, args := produceFastSQL(keys, items, fence, fenced)
		if len(q) == 0 || len(args) != 1+100*(6+11+7) {
			b.Fatalf("%d arguments", len(args))
		}
	}
}

// produceBatchSQLInput is a fenced batch of 100 new messages with
// 200-byte payloads and one subscription.
func produceBatchSQLInput() ([]keyRow, []ProduceItem, Fence, bool) {
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
	return keys, items, Fence{MapVersion: 3}, true
}

// BenchmarkNamedValues is the conversion of the fast produce's arguments
// (100 messages) for the driver: namedValues into a reused slice, as
// execMulti does, against a new slice and the driver's NamedValueChecker
// for each argument, as execMulti did before.
func BenchmarkNamedValues(b *testing.B) {
	testbed.Need(b)
	f := setup(b)
	conn, err := f.st.db.Conn(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	_, args := produceFastSQL(produceBatchSQLInput())
	conn.Raw(func(dc any) error {
		b.Run("namedValues", func(b *testing.B) {
			var nv []driver.NamedValue
			b.ReportAllocs()
			for b.Loop() {
				var err error
				if nv, err = namedValues(nv[:0], dc, args); err != nil {
					b.Fatal(err)
				}
				clear(nv)
			}
		})
		b.Run("checker", func(b *testing.B) {
			checker := dc.(driver.NamedValueChecker)
			b.ReportAllocs()
			for b.Loop() {
				nv := make([]driver.NamedValue, len(args))
				for i, a := range args {
					nv[i] = driver.NamedValue{Ordinal: i + 1, Value: a}
					if err := checker.CheckNamedValue(&nv[i]); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
		return nil
	})
}
