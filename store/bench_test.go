package store

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/shardmq/shardmq/internal/procstat"
	"github.com/shardmq/shardmq/internal/testbed"
)

// BenchmarkPlaceholders measures building the multi-row VALUES list of a
// 500-message batch, which every produce statement does.
func BenchmarkPlaceholders(b *testing.B) {
	for i := 0; i < b.N; i++ {
		placeholders(500, 11)
	}
}

// BenchmarkProduceBatch commits batches of 1, 20 and 100 new messages, one
// transaction at a time, into the test bed's primary, and reports the
// primary's CPU per transaction and per message (from /proc, on Linux).
// It is what group commit rests on: a commit costs the server far more
// than a message in it, so fewer, larger transactions are cheaper. Run it
// with `make bench`; compare the per-transaction and per-message figures,
// not the absolute rates, across machines.
func BenchmarkProduceBatch(b *testing.B) {
	testbed.Need(b)
	f := setup(b)
	pid := bed.Clusters[0].Primary.PID
	payload := `{"order":"` + strings.Repeat("x", 180) + `"}`
	for _, size := range []int{1, 20, 100} {
		b.Run(fmt.Sprintf("batch=%d", size), func(b *testing.B) { produceBatch(b, f, pid, payload, size, 0) })
	}
}

// BenchmarkProduceBatchFenced is BenchmarkProduceBatch with every item
// carrying a shard-map version, so each transaction first checks the
// cluster's fence (shard_fence.go). Its server CPU per transaction,
// against BenchmarkProduceBatch's in the same run, is the fence's cost
// (docs/performance.md); run them alternately (-count) on a quiet
// machine.
func BenchmarkProduceBatchFenced(b *testing.B) {
	testbed.Need(b)
	f := setup(b)
	pid := bed.Clusters[0].Primary.PID
	payload := `{"order":"` + strings.Repeat("x", 180) + `"}`
	for _, size := range []int{1, 20, 100} {
		b.Run(fmt.Sprintf("batch=%d", size), func(b *testing.B) { produceBatch(b, f, pid, payload, size, 1) })
	}
}

// produceBatch commits b.N batches of size new messages, each item routed
// with mapVersion (0: unfenced), and reports rates and the server's CPU.
func produceBatch(b *testing.B, f *fixture, pid int, payload string, size int, mapVersion int64) {
	ctx := context.Background()
	// Go calls this function again with a larger b.N: keys of each call
	// are new, or the later calls would measure duplicates.
	call := f.ids.Next()
	items := make([]ProduceItem, size)
	cpu0, okCPU := procstat.Process(pid)
	start := time.Now()
	for i := 0; i < b.N; i++ {
		for j := range items {
			items[j] = f.item("bench", fmt.Sprintf("b%d-%d-%d", call, i, j), payload)
			items[j].MapVersion = mapVersion
		}
		if _, err := f.st.Produce(ctx, items); err != nil {
			b.Fatal(err)
		}
	}
	elapsed := time.Since(start)
	msgs := float64(b.N * size)
	b.ReportMetric(msgs/elapsed.Seconds(), "msgs/s")
	if cpu1, ok := procstat.Process(pid); ok && okCPU {
		used := float64((cpu1 - cpu0).Microseconds())
		b.ReportMetric(used/float64(b.N), "server-cpu-µs/tx")
		b.ReportMetric(used/msgs, "server-cpu-µs/msg")
	}
}

// BenchmarkClaimByteCap claims 100 deliveries and releases them again,
// without and with a byte cap: the claim reads the candidates' bodies
// inside its transaction either way, so the cap should cost nothing.
func BenchmarkClaimByteCap(b *testing.B) {
	testbed.Need(b)
	f := setup(b)
	ctx := context.Background()
	payload := `{"order":"` + strings.Repeat("x", 180) + `"}`
	items := make([]ProduceItem, 100)
	for j := range items {
		items[j] = f.item("t", fmt.Sprintf("c%d", j), payload)
	}
	if _, err := f.st.Produce(ctx, items); err != nil {
		b.Fatal(err)
	}
	for _, maxBytes := range []int{0, 8 << 20} {
		b.Run(fmt.Sprintf("max_bytes=%d", maxBytes), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				got, err := f.st.Claim(ctx, ClaimRequest{Topic: "t", Subscription: "default", Consumer: "w", Max: 100, Lease: time.Minute,
					Token: f.ids.Next(), MaxAttempts: 5, Now: time.Now().UTC(), MaxBytes: maxBytes, AllowOversize: true})
				if err != nil || len(got) != 100 {
					b.Fatalf("claimed %d, %v", len(got), err)
				}
				leases := make([]Lease, len(got))
				for j, c := range got {
					leases[j] = lease(c, "default")
				}
				if _, err := f.st.Release(ctx, leases, true, time.Now().UTC()); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkFenceCheck isolates the fence's read: transactions that do
// nothing but, with check=true, the fenced writers' first statement
// (checkFence). The difference of server-cpu-µs/tx between the two is
// what the fence adds to every fenced write transaction on the server.
func BenchmarkFenceCheck(b *testing.B) {
	testbed.Need(b)
	f := setup(b)
	pid := bed.Clusters[0].Primary.PID
	for _, check := range []bool{false, true} {
		b.Run(fmt.Sprintf("check=%v", check), func(b *testing.B) {
			ctx := context.Background()
			if check {
				ctx = WithFence(ctx, Fence{MapVersion: 1})
			}
			cpu0, okCPU := procstat.Process(pid)
			for i := 0; i < b.N; i++ {
				if err := f.st.inTx(ctx, 1, nil, func(*sql.Tx) error { return nil }); err != nil {
					b.Fatal(err)
				}
			}
			if cpu1, ok := procstat.Process(pid); ok && okCPU {
				b.ReportMetric(float64((cpu1-cpu0).Microseconds())/float64(b.N), "server-cpu-µs/tx")
			}
		})
	}
}

// BenchmarkScanClaimable measures the owner's scan of 500 claimable
// deliveries on the router's side: its CPU (this process, from /proc) and
// allocations per row read.
func BenchmarkScanClaimable(b *testing.B) {
	testbed.Need(b)
	f := setup(b)
	ctx := context.Background()
	topic := fmt.Sprintf("scan%d", f.ids.Next())
	for i := 0; i < 5; i++ {
		items := make([]ProduceItem, 100)
		for j := range items {
			items[j] = f.item(topic, fmt.Sprintf("k%d-%d", i, j), `{"order":"`+strings.Repeat("x", 180)+`"}`)
		}
		if _, err := f.st.Produce(ctx, items); err != nil {
			b.Fatal(err)
		}
	}
	now := time.Now().UTC().Add(time.Minute)
	pid := os.Getpid()
	b.ReportAllocs()
	c0, _ := procstat.Process(pid)
	for b.Loop() {
		got, err := f.st.ScanClaimable(ctx, topic, "default", now, nil, 500, nil)
		if err != nil || len(got) != 500 {
			b.Fatalf("scanned %d, %v", len(got), err)
		}
	}
	c1, _ := procstat.Process(pid)
	b.ReportMetric(float64((c1-c0).Nanoseconds())/float64(b.N*500), "router-ns/row")
}

// BenchmarkFinalAckRow measures what a final ack's write to the message
// row costs the primary, by whether it grows the row. Messages are
// produced in batches of 90 (their primary CPU reported as
// produce-cpu-µs/msg), as fresh rows sit in their pages (filled to about
// 15/16 by inserts in id order); then each batch's final ack is written
// in one transaction of its own, in id order, as an owner's flush does:
//
//   - slot: markAcked, the product's statement for an ack that fits the
//     slot. It overwrites the fixed-size ack_slot and the status byte in
//     place (migration 20 rebuilt the fresh table, so every row stores
//     its slot).
//   - columns: markAcked for an ack that does not fit (a long consumer
//     name). It fills the acked_* columns and status_at, which were NULL:
//     every row grows by some 50 bytes, more than its page has free, so
//     the pages split (reported per 1,000 messages) and the table ends
//     about twice its size.
//   - status_only: the status byte alone, in place: the least an ack
//     could write.
//   - no_slot: the table as it was before migration 19 (the slot dropped,
//     the table rebuilt) and the columns' statement: what a row without
//     the slot costs to produce, and its ack.
//
// Compare the variants' figures in one run, alternately (-count), on a
// quiet machine (docs/performance.md).
func BenchmarkFinalAckRow(b *testing.B) {
	testbed.Need(b)
	f := setup(b)
	ctx := context.Background()
	pid := bed.Clusters[0].Primary.PID
	if _, err := f.db.ExecContext(ctx, "SET GLOBAL innodb_monitor_enable = 'index_page_splits'"); err != nil {
		b.Fatal(err)
	}
	payload := `{"order":"` + strings.Repeat("x", 180) + `"}`
	const batch = 90
	short := finalAck{sub: "default", consumer: "consumer-1", request: "0123456789abcdef", attempt: 1}
	long := finalAck{sub: "default", consumer: strings.Repeat("consumer-", 5), request: "0123456789abcdef", attempt: 1}
	acked := func(a finalAck) func(ids []uint64, now time.Time) (string, []any) {
		return func(ids []uint64, now time.Time) (string, []any) {
			a.claimedAt = now
			return markAckedSQL(nil, ids, a, now)
		}
	}
	variants := []struct {
		name   string
		update func(ids []uint64, now time.Time) (string, []any)
	}{
		{"slot", acked(short)},
		{"columns", acked(long)},
		{"status_only", func(ids []uint64, now time.Time) (string, []any) {
			var q strings.Builder
			q.WriteString("UPDATE message_store SET msg_status = ? WHERE ")
			args := idList(&q, []any{statusCode(StatusConsumed)}, ids)
			return q.String(), args
		}},
		{"no_slot", acked(long)}, // last: it drops the slot
	}
	for _, v := range variants {
		b.Run(v.name, func(b *testing.B) {
			if v.name == "no_slot" && f.count(b, "SELECT COUNT(*) FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'message_store' AND COLUMN_NAME = 'ack_slot'") == 1 {
				if _, err := f.db.ExecContext(ctx, "ALTER TABLE message_store DROP COLUMN ack_slot, FORCE"); err != nil {
					b.Fatal(err)
				}
			}
			pcpu0, _ := procstat.Process(pid)
			call := f.ids.Next()
			batches := make([][]uint64, b.N)
			items := make([]ProduceItem, batch)
			for i := range batches {
				for j := range items {
					items[j] = f.item("bench", fmt.Sprintf("a%d-%d-%d", call, i, j), payload)
					batches[i] = append(batches[i], items[j].Msg.ID)
				}
				if _, err := f.st.Produce(ctx, items); err != nil {
					b.Fatal(err)
				}
			}
			pcpu1, _ := procstat.Process(pid)
			splits0 := pageSplits(ctx, b, f.db)
			cpu0, okCPU := procstat.Process(pid)
			b.ResetTimer()
			start := time.Now()
			for _, ids := range batches {
				q, args := v.update(ids, time.Now().UTC())
				tx, err := f.db.BeginTx(ctx, nil)
				if err != nil {
					b.Fatal(err)
				}
				res, err := tx.ExecContext(ctx, q, args...)
				if err != nil {
					b.Fatal(err)
				}
				if n, _ := res.RowsAffected(); n != int64(len(ids)) {
					b.Fatalf("updated %d rows of %d", n, len(ids))
				}
				if err := tx.Commit(); err != nil {
					b.Fatal(err)
				}
			}
			elapsed := time.Since(start)
			b.StopTimer()
			msgs := float64(b.N * batch)
			b.ReportMetric(msgs/elapsed.Seconds(), "msgs/s")
			b.ReportMetric(float64(pageSplits(ctx, b, f.db)-splits0)*1000/msgs, "splits/1000msgs")
			if cpu1, ok := procstat.Process(pid); ok && okCPU {
				b.ReportMetric(float64((cpu1-cpu0).Microseconds())/msgs, "server-cpu-µs/msg")
				b.ReportMetric(float64((pcpu1-pcpu0).Microseconds())/msgs, "produce-cpu-µs/msg")
			}
		})
	}
}

// pageSplits reads the server's count of B-tree page splits so far.
func pageSplits(ctx context.Context, b *testing.B, db *sql.DB) int64 {
	var n int64
	if err := db.QueryRowContext(ctx, "SELECT `count` FROM information_schema.INNODB_METRICS WHERE name = 'index_page_splits'").Scan(&n); err != nil {
		b.Fatal(err)
	}
	return n
}

// BenchmarkLeaseWriteOut measures a hand-over's write-out of 1,000 leases
// held in memory into their deliveries, in one transaction: one UPDATE
// per lease (per_lease, as before) against materializeOwnedAll's two
// statements per 500 (together). Report ns/op of the two in one run.
func BenchmarkLeaseWriteOut(b *testing.B) {
	testbed.Need(b)
	f := setup(b)
	ctx := context.Background()
	const n = 1000
	items := make([]ProduceItem, n)
	var ids []uint64
	for i := range items {
		items[i] = f.item("bench", fmt.Sprintf("l%d", i), `{"n":1}`)
		ids = append(ids, items[i].Msg.ID)
	}
	if _, err := f.st.Produce(ctx, items); err != nil {
		b.Fatal(err)
	}
	now := time.Now().UTC()
	leases := func(token uint64) []OwnedLease {
		ls := make([]OwnedLease, n)
		for i, id := range ids {
			ls[i] = OwnedLease{MessageID: id, Token: token, Consumer: "w", Attempt: 1, ClaimedAt: now, Expires: now.Add(time.Minute)}
		}
		return ls
	}
	for _, v := range []struct {
		name  string
		write func(tx *sql.Tx, ls []OwnedLease) error
	}{
		{"per_lease", func(tx *sql.Tx, ls []OwnedLease) error {
			for _, l := range ls {
				if _, err := materializeOwned(ctx, tx, "default", l); err != nil {
					return err
				}
			}
			return nil
		}},
		{"together", func(tx *sql.Tx, ls []OwnedLease) error {
			_, err := materializeOwnedAll(ctx, tx, "default", ls)
			return err
		}},
	} {
		b.Run(v.name, func(b *testing.B) {
			token := uint64(0)
			for b.Loop() {
				token++
				tx, err := f.db.BeginTx(ctx, nil)
				if err != nil {
					b.Fatal(err)
				}
				if err := v.write(tx, leases(token)); err != nil {
					b.Fatal(err)
				}
				if err := tx.Commit(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
