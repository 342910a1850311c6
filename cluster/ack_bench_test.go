//go:build dbbench

package cluster

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardmq/shardmq/internal/idgen"
	"github.com/shardmq/shardmq/internal/procstat"
	"github.com/shardmq/shardmq/internal/testbed"
	"github.com/shardmq/shardmq/store"
)

// BenchmarkConsumers drains a backlog with 4 consumers (claim 100, ack
// the 100) on one cluster, the acks either each in its own transaction
// (store.Ack, as before the acker), one request per AckMany (the one
// transaction path without coalescing) or through the acker (coalesced),
// and reports messages/s and the primary's CPU per message. Run the
// variants alternately (-count) on a quiet machine: they share one server.
func BenchmarkConsumers(b *testing.B) {
	testbed.Need(b)
	for _, mode := range []string{"ack", "ackmany", "acker"} {
		b.Run(mode, func(b *testing.B) {
			st := openStore(b)
			ids := idgen.New(nil)
			ctx := context.Background()
			payload := `{"order":"` + strings.Repeat("x", 180) + `"}`
			const consumers = 4
			total := b.N * consumers * 100
			for i := 0; i < total; i += 100 {
				items := make([]store.ProduceItem, 100)
				for j := range items {
					it := item(ids.Next(), fmt.Sprintf("k%d-%d", i, j))
					it.Msg.Payload = []byte(payload)
					items[j] = it
				}
				if _, err := st.Produce(ctx, items); err != nil {
					b.Fatal(err)
				}
			}
			a := newAcker(direct{st})
			pid := bed.Clusters[0].Primary.PID
			cpu0, _ := procstat.Process(pid)
			b.ResetTimer()
			start := time.Now()
			var wg sync.WaitGroup
			for range consumers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						tok := ids.Next()
						got, err := st.Claim(ctx, store.ClaimRequest{Topic: "t", Subscription: "default", Consumer: "w", Max: 100,
							Lease: time.Minute, Token: tok, MaxAttempts: 5, Now: time.Now().UTC()})
						if err != nil {
							b.Error(err)
							return
						}
						if len(got) == 0 {
							return
						}
						leases := make([]store.Lease, len(got))
						for j, c := range got {
							leases[j] = store.Lease{MessageID: c.Message.ID, Subscription: "default", Token: tok}
						}
						now := time.Now().UTC()
						switch mode {
						case "ack":
							_, err = st.Ack(ctx, leases, now)
						case "ackmany":
							err = st.AckMany(ctx, []store.AckGroup{{Leases: leases}}, now)[0].Err
						default:
							_, err = a.ack(ctx, leases, now)
						}
						if err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			secs := time.Since(start).Seconds()
			cpu1, _ := procstat.Process(pid)
			b.ReportMetric(float64(total)/secs, "msgs/s")
			b.ReportMetric(float64((cpu1-cpu0).Microseconds())/float64(total), "server-cpu-µs/msg")
			if mode == "acker" {
				runs, leases := a.batch.Stats()
				b.ReportMetric(float64(leases)/float64(runs), "acks/tx")
			}
		})
	}
}
