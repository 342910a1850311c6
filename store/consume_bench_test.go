package store

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/shardmq/shardmq/internal/idgen"
	"github.com/shardmq/shardmq/internal/procstat"
	"github.com/shardmq/shardmq/internal/testbed"
)

// BenchmarkConsume drains a backlog with claim 100 + ack 100, one
// consumer, and splits the primary's CPU between the claims and the acks
// (from /proc; the server does nothing else meanwhile), with InnoDB's
// rows read per message. ack=many is the coalesced path (AckMany), ack=one
// the per-request Ack. The backlog's ids are spread in time as when
// messages arrive one per produce request at 10,000/s (0.1 ms apart, in
// the past): 10 distinct creation milliseconds per claim of 100, not the
// one or two of a backlog written in a tight loop. (The load tests'
// produce requests of 100 share one millisecond each, so their claims see
// only a few.) The replica's CPU is counted too.
func BenchmarkConsume(b *testing.B) {
	testbed.Need(b)
	f := setup(b)
	pid := bed.Clusters[0].Primary.PID
	payload := `{"order":"` + strings.Repeat("x", 180) + `"}`
	ctx := context.Background()
	status := func(name string) int64 {
		var k string
		var v int64
		if err := f.db.QueryRow("SHOW GLOBAL STATUS LIKE '"+name+"'").Scan(&k, &v); err != nil {
			b.Fatal(err)
		}
		return v
	}
	at := time.Now().Add(-10 * time.Minute) // room for 6 million messages
	f.ids = idgen.New(func() time.Time {
		at = at.Add(100 * time.Microsecond)
		return at
	})
	// The replica applies what the primary logged: its CPU over the same
	// claims and acks, counted once it has caught up (MariaDB's
	// MASTER_GTID_WAIT; the test beds run MariaDB).
	var replica *sql.DB
	var replicaPID int
	if rs := bed.Clusters[0].Replicas; len(rs) > 0 {
		replicaPID = rs[0].PID
		var err error
		if replica, err = sql.Open("mysql", rs[0].DSN("")); err != nil {
			b.Fatal(err)
		}
		defer replica.Close()
	}
	caughtUp := func() {
		if replica == nil {
			return
		}
		var pos string
		var r int
		if err := f.db.QueryRow("SELECT @@gtid_binlog_pos").Scan(&pos); err != nil {
			b.Fatal(err)
		}
		if err := replica.QueryRow("SELECT MASTER_GTID_WAIT(?, 120)", pos).Scan(&r); err != nil || r != 0 {
			b.Fatalf("the replica did not catch up with %s: %d %v", pos, r, err)
		}
	}
	for _, many := range []bool{true, false} {
		b.Run(fmt.Sprintf("ack=%s", map[bool]string{true: "many", false: "one"}[many]), func(b *testing.B) {
			topic := fmt.Sprintf("c%d", f.ids.Next())
			// The backlog: b.N claims of 100.
			for i := 0; i < b.N; i++ {
				items := make([]ProduceItem, 100)
				for j := range items {
					items[j] = f.item(topic, fmt.Sprintf("k%d-%d", i, j), payload)
				}
				if _, err := f.st.Produce(ctx, items); err != nil {
					b.Fatal(err)
				}
			}
			var claimCPU, ackCPU time.Duration
			var claimT, ackT time.Duration
			caughtUp()
			rep0, _ := procstat.Process(replicaPID)
			key0, read0, binlog0 := status("Handler_read_key"), status("Handler_read_next"), status("Binlog_bytes_written")
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				c0, _ := procstat.Process(pid)
				t0 := time.Now()
				got, err := f.st.Claim(ctx, ClaimRequest{Topic: topic, Subscription: "default", Consumer: "w", Max: 100,
					Lease: time.Minute, Token: f.ids.Next(), MaxAttempts: 5, Now: time.Now().UTC(), MaxBytes: 1 << 20, AllowOversize: true})
				if err != nil {
					b.Fatal(err)
				}
				c1, _ := procstat.Process(pid)
				t1 := time.Now()
				leases := make([]Lease, len(got))
				for j, c := range got {
					leases[j] = lease(c, "default")
				}
				if many {
					for _, r := range f.st.AckMany(ctx, []AckGroup{{Leases: leases}}, time.Now().UTC()) {
						if r.Err != nil {
							b.Fatal(r.Err)
						}
					}
				} else if _, err := f.st.Ack(ctx, leases, time.Now().UTC()); err != nil {
					b.Fatal(err)
				}
				c2, _ := procstat.Process(pid)
				claimCPU += c1 - c0
				ackCPU += c2 - c1
				claimT += t1.Sub(t0)
				ackT += time.Since(t1)
			}
			msgs := float64(b.N * 100)
			b.StopTimer()
			if replica != nil {
				caughtUp()
				rep1, _ := procstat.Process(replicaPID)
				b.ReportMetric(float64((rep1-rep0).Microseconds())/msgs, "replica-µs/msg")
			}
			b.ReportMetric(float64(claimCPU.Microseconds())/msgs, "claim-server-µs/msg")
			b.ReportMetric(float64(ackCPU.Microseconds())/msgs, "ack-server-µs/msg")
			b.ReportMetric(float64(claimT.Microseconds())/msgs, "claim-wall-µs/msg")
			b.ReportMetric(float64(ackT.Microseconds())/msgs, "ack-wall-µs/msg")
			b.ReportMetric(float64(status("Handler_read_key")-key0)/msgs, "index-dives/msg")
			b.ReportMetric(float64(status("Handler_read_next")-read0)/msgs, "index-reads/msg")
			b.ReportMetric(float64(status("Binlog_bytes_written")-binlog0)/msgs, "binlog-bytes/msg")
		})
	}
}
