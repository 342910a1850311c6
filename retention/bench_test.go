package retention

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/shardmq/shardmq/internal/idgen"
	"github.com/shardmq/shardmq/internal/testbed"
	"github.com/shardmq/shardmq/shard"
	"github.com/shardmq/shardmq/store"
)

// BenchmarkTierMoves times each tier move of one month of messages (and
// one event each) on the test bed: run with -benchtime=1x; it reports rows
// per second of the warm copy (with its checks and the drop), the cold
// export (files, read-back, index, delete) and the restore.
func BenchmarkTierMoves(b *testing.B) {
	testbed.Need(b)
	ctx := context.Background()
	const n = 20000
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		f := setup(b, date(2024, 3, 10), Config{Pause: -1})
		for start := 0; start < n; start += 500 {
			byCluster := map[string][]store.ProduceItem{}
			var evs = map[string][]store.Event{}
			for k := start; k < start+500; k++ {
				key := fmt.Sprintf("bench-%d", k)
				v := shard.Of(shard.Key("", key))
				id := f.ids.Next()
				c := cluster(v)
				byCluster[c] = append(byCluster[c], store.ProduceItem{Msg: &store.Message{ID: id, VShard: uint16(v), Topic: "bench", Key: key,
					PayloadJSON: true, Payload: []byte(`{"amount":1234,"currency":"EUR","note":"a payload of about a hundred bytes for the benchmark"}`),
					CreatedAt: idgen.Time(id)}, Hash: make([]byte, 16), AvailableAt: f.clock.Now()})
				evs[c] = append(evs[c], store.Event{ID: f.ids.Next(), At: f.clock.Now(), MessageID: id, VShard: uint16(v), Subscription: "s", Type: store.EventAcked, Consumer: "w", Attempt: 1})
			}
			for c, items := range byCluster {
				if _, err := f.hot[c].Produce(ctx, items); err != nil {
					b.Fatal(err)
				}
				if err := f.hot[c].AppendEvents(ctx, evs[c]); err != nil {
					b.Fatal(err)
				}
			}
		}
		step := func(name string, at time.Time, fn func() error) {
			f.clock.Set(at)
			start := time.Now()
			b.StartTimer()
			if err := fn(); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			b.ReportMetric(2*n/time.Since(start).Seconds(), name+"_rows/s")
		}
		step("warm", date(2024, 7, 15), func() error { return f.job.Warm(ctx) })
		step("cold", date(2025, 4, 15), func() error { return f.job.Cold(ctx) })
		step("restore", date(2025, 4, 15), func() error {
			rep, err := f.job.Restore(ctx, time.Date(2024, 3, 1, 0, 0, 0, 0, time.UTC))
			if err == nil && rep.Messages != n {
				err = fmt.Errorf("restored %d messages", rep.Messages)
			}
			return err
		})
	}
}
