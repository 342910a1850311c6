package retention

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/shardmq/shardmq/domain"
	"github.com/shardmq/shardmq/internal/idgen"
	"github.com/shardmq/shardmq/internal/testbed"
	"github.com/shardmq/shardmq/store"
)

// traceTier says where (topic, key)'s trace is found, trying the tiers in
// the order the trace endpoint does: hot, warm (with the hot events
// merged), cold index.
func (f *fixture) traceTier(t *testing.T, topic string, p produced) (string, *store.MessageTrace, *store.ColdEntry) {
	t.Helper()
	ctx := context.Background()
	hot := f.hot[p.cluster]
	tr, err := hot.Trace(ctx, topic, p.key, f.clock.Now())
	if err == nil {
		return "hot", tr, nil
	}
	if !errors.Is(err, store.ErrNotFound) {
		t.Fatal(err)
	}
	tr, err = f.arch.ArchivedTrace(ctx, topic, p.key, f.clock.Now())
	if err == nil {
		evs, err := hot.Events(ctx, []uint64{tr.Message.ID})
		if err != nil {
			t.Fatal(err)
		}
		return "warm", store.MergeEvents(tr, evs, f.clock.Now()), nil
	}
	if !errors.Is(err, store.ErrNotFound) {
		t.Fatal(err)
	}
	ce, err := f.arch.ColdByKey(ctx, topic, p.key)
	if err != nil {
		t.Fatalf("trace of %s found in no tier: %v", p.key, err)
	}
	return "cold", nil, ce
}

// wantEvents checks a trace holds produced, claimed and acked.
func wantEvents(t *testing.T, where string, tr *store.MessageTrace) {
	t.Helper()
	got := map[string]int{}
	for _, e := range tr.Events {
		got[e.Type]++
	}
	if got[store.EventProduced] != 1 || got[store.EventAcked] != 1 || got[store.EventClaimed] != 1 {
		t.Errorf("%s trace of %s: events %v, want produced, claimed, acked once each", where, tr.Message.Key, got)
	}
	if len(tr.Deliveries) != 1 || tr.Deliveries[0].State != domain.DeliveryDone {
		t.Errorf("%s trace of %s: deliveries %+v, want default done", where, tr.Message.Key, tr.Deliveries)
	}
}

// TestHotWarmColdAndRestore moves March 2024 through every tier on a test
// clock: hot while its messages are undelivered, warm once past the hot
// window and consumed (its acked events, written in April, follow with
// April's partition), cold past the warm window, and warm again by
// restore, with counts and checksums equal and the trace found at every
// step.
func TestHotWarmColdAndRestore(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	ctx := context.Background()
	march := time.Date(2024, 3, 1, 0, 0, 0, 0, time.UTC)
	f := setup(t, date(2024, 3, 10), Config{})
	var msgs []produced
	for i := 0; i < 40; i++ {
		msgs = append(msgs, f.produce(t, "orders", fmt.Sprintf("order-%d", i), fmt.Sprintf("tx-%d", i%4)))
	}
	clusters := map[string]int{}
	for _, p := range msgs {
		clusters[p.cluster]++
	}
	if len(clusters) != 2 {
		t.Fatalf("messages on %v, want both clusters", clusters)
	}
	// Consumed in April: the acked events live in April's partition.
	f.clock.Set(date(2024, 4, 2))
	before := f.hotSums(t, march)
	if before.messages != 40 || before.events != 0 {
		t.Fatalf("hot March before consumption: %+v", before)
	}

	// July: March is past the hot window but its messages are undelivered.
	f.clock.Set(date(2024, 7, 15))
	if err := f.job.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if st := f.job.Status(); len(st.Blocked) != 2 || st.Blocked[0].Reason != "live_deliveries" || st.Blocked[0].Month != "2024-03" {
		t.Fatalf("blocked: %+v, want both clusters holding 2024-03 for live deliveries", st.Blocked)
	}
	if !partitionNames(t, f.hot["c1"], store.TableMessages)["p202403"] {
		t.Fatal("March dropped while its messages were undelivered")
	}
	f.clock.Set(date(2024, 4, 2))
	if n := f.consumeAll(t, "orders"); n != 40 {
		t.Fatalf("consumed %d, want 40", n)
	}
	hot := f.hotSums(t, march)
	if hot.messages != 40 || hot.events != 40 {
		t.Fatalf("hot March after consumption: %+v", hot)
	}
	for _, p := range msgs[:3] {
		where, tr, _ := f.traceTier(t, "orders", p)
		if where != "hot" {
			t.Fatalf("trace of %s in %s, want hot", p.key, where)
		}
		wantEvents(t, "hot", tr)
	}

	// July again: March moves warm; April (holding March's acked events)
	// is still hot, so a warm trace merges them.
	f.clock.Set(date(2024, 7, 15))
	if err := f.job.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if st := f.job.Status(); len(st.Blocked) != 0 {
		t.Fatalf("blocked after consumption: %+v", st.Blocked)
	}
	for name, st := range f.hot {
		for _, table := range store.PartitionedTables {
			parts := partitionNames(t, st, table)
			if parts["p202403"] || !parts["p202404"] || !parts["p202410"] {
				t.Errorf("%s %s partitions in July: %v (want p202403 gone, p202404 kept, p202410 ahead)", name, table, parts)
			}
		}
	}
	warm := f.archiveSums(t, march)
	if warm.messages != hot.messages || warm.msgSum != hot.msgSum || warm.events != 0 {
		t.Fatalf("warm March %+v, hot was %+v (events still hot in April)", warm, hot)
	}
	for _, p := range msgs {
		where, tr, _ := f.traceTier(t, "orders", p)
		if where != "warm" {
			t.Fatalf("trace of %s in %s, want warm", p.key, where)
		}
		wantEvents(t, "warm", tr)
	}
	txs, _, err := f.arch.ArchivedByTransaction(ctx, "tx-1", 0, 100, 0)
	if err != nil || len(txs) != 10 {
		t.Fatalf("warm transaction tx-1: %d messages (%v), want 10", len(txs), err)
	}

	// April 2025: April 2024 moved warm too (the events), March 2024 is
	// past the warm window and goes cold.
	f.clock.Set(date(2025, 3, 20))
	if err := f.job.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	warm = f.archiveSums(t, march)
	if warm != hot {
		t.Fatalf("warm March with April's events %+v, hot was %+v", warm, hot)
	}
	f.clock.Set(date(2025, 4, 15))
	if err := f.job.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if got := f.archiveSums(t, march); got.messages != 0 || got.events != 0 {
		t.Fatalf("archive still holds March after the cold export: %+v", got)
	}
	man, err := readManifest(filepath.Join(f.dir, "2024-03"))
	if err != nil {
		t.Fatal(err)
	}
	var fileMsgs, fileEvs int64
	for _, mf := range man.Files {
		fileMsgs += mf.Messages
		fileEvs += mf.Events
		if _, err := os.Stat(filepath.Join(f.dir, mf.File)); err != nil {
			t.Error(err)
		}
	}
	if fileMsgs != 40 || fileEvs != 40 || len(man.Files) < 2 {
		t.Fatalf("manifest: %d files, %d messages, %d events; want 40 each in files per vshard range", len(man.Files), fileMsgs, fileEvs)
	}
	for _, p := range msgs {
		where, _, ce := f.traceTier(t, "orders", p)
		if where != "cold" || ce.Message.ID != p.id || ce.File == "" {
			t.Fatalf("trace of %s: %s %+v, want cold with its file", p.key, where, ce)
		}
		if _, err := os.Stat(filepath.Join(f.dir, ce.File)); err != nil {
			t.Fatalf("cold file of %s: %v", p.key, err)
		}
	}
	cold, err := f.arch.ColdByTransaction(ctx, "tx-2", 0, 100)
	if err != nil || len(cold) != 10 {
		t.Fatalf("cold transaction tx-2: %d (%v), want 10", len(cold), err)
	}

	// A damaged file is refused by the restore.
	victim := filepath.Join(f.dir, man.Files[0].File)
	good, _ := os.ReadFile(victim)
	bad := append([]byte(nil), good...)
	bad[len(bad)/2] ^= 0xff
	os.WriteFile(victim, bad, 0o644)
	if _, err := f.job.Restore(ctx, march); err == nil {
		t.Fatal("restore accepted a damaged file")
	}
	os.WriteFile(victim, good, 0o644)

	rep, err := f.job.Restore(ctx, march)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Messages != 40 || rep.Events != 40 {
		t.Fatalf("restore: %+v", rep)
	}
	if got := f.archiveSums(t, march); got != hot {
		t.Fatalf("restored March %+v, hot was %+v", got, hot)
	}
	for _, p := range msgs {
		where, tr, _ := f.traceTier(t, "orders", p)
		if where != "warm" {
			t.Fatalf("trace of %s after restore in %s, want warm", p.key, where)
		}
		wantEvents(t, "restored", tr)
	}
	// Restored months stay warm until released.
	if err := f.job.Cold(ctx); err != nil {
		t.Fatal(err)
	}
	if got := f.archiveSums(t, march); got != hot {
		t.Fatalf("a restored month was exported again before release: %+v", got)
	}
	if err := f.job.Release(ctx, march); err != nil {
		t.Fatal(err)
	}
	if err := f.job.Cold(ctx); err != nil {
		t.Fatal(err)
	}
	if got := f.archiveSums(t, march); got.messages != 0 {
		t.Fatalf("released month still warm: %+v", got)
	}
	again, err := readManifest(filepath.Join(f.dir, "2024-03"))
	if err != nil {
		t.Fatal(err)
	}
	for i := range again.Files {
		if again.Files[i].MessagesSum != man.Files[i].MessagesSum || again.Files[i].EventsSum != man.Files[i].EventsSum {
			t.Errorf("re-export of %s: checksums changed", again.Files[i].File)
		}
	}
}

// TestWarmResumesWithoutCopyingAgain: a pass stopped after its copies
// (here: a resharding job starts before the drop) leaves the partitions
// hot and its checked ranges recorded; the next pass drops them without
// copying a row again.
func TestWarmResumesWithoutCopyingAgain(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	ctx := context.Background()
	f := setup(t, date(2024, 3, 10), Config{})
	for i := 0; i < 30; i++ {
		f.produce(t, "resume", fmt.Sprintf("r-%d", i), "")
	}
	if n := f.consumeAll(t, "resume"); n != 30 {
		t.Fatalf("consumed %d", n)
	}
	// A resharding job appears once the first rows were copied: c1's
	// March is copied and checked but not dropped, c2 waits.
	f.job.deps.Moving = func() bool { return f.job.Status().Jobs[JobWarm].Rows > 0 }
	f.clock.Set(date(2024, 7, 15))
	if err := f.job.Warm(ctx); err != nil {
		t.Fatal(err)
	}
	copied := f.job.Status().Jobs[JobWarm].Rows
	if copied == 0 || copied >= 60 {
		t.Fatalf("first pass copied %d rows, want c1's share of 60", copied)
	}
	if st := f.job.Status(); len(st.Blocked) != 2 || st.Blocked[0].Reason != "resharding" || st.Blocked[1].Reason != "resharding" {
		t.Fatalf("blocked: %+v, want both clusters waiting for resharding", st.Blocked)
	}
	if !partitionNames(t, f.hot["c1"], store.TableMessages)["p202403"] {
		t.Fatal("March dropped while a resharding job was seen")
	}
	f.job.deps.Moving = func() bool { return false }
	if err := f.job.Warm(ctx); err != nil {
		t.Fatal(err)
	}
	if total := f.job.Status().Jobs[JobWarm].Rows; total != 60 { // 30 messages, 30 acked events, each copied once
		t.Fatalf("after the resumed pass %d rows were copied in all, want 60 (c1's not again)", total)
	}
	for name, st := range f.hot {
		if partitionNames(t, st, store.TableMessages)["p202403"] {
			t.Fatalf("%s kept March after the resumed pass", name)
		}
	}
	if got := f.archiveSums(t, time.Date(2024, 3, 1, 0, 0, 0, 0, time.UTC)); got.messages != 30 || got.events != 30 {
		t.Fatalf("archive holds %+v", got)
	}
}

// TestOlderRowsInLowestPartitionMoveToo: rows of a month this cluster had
// already moved, brought back later (a resharding copy from a cluster that
// had not moved that month yet), land in the lowest partition; they are
// copied and checked by their own month before that partition is dropped.
func TestOlderRowsInLowestPartitionMoveToo(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	ctx := context.Background()
	f := setup(t, date(2024, 3, 10), Config{})
	for i := 0; i < 6; i++ {
		f.produce(t, "older", fmt.Sprintf("o-%d", i), "")
	}
	f.consumeAll(t, "older")
	f.clock.Set(date(2024, 7, 15))
	if err := f.job.Warm(ctx); err != nil {
		t.Fatal(err)
	}
	st := f.hot["c1"]
	if partitionNames(t, st, store.TableMessages)["p202403"] {
		t.Fatal("March not moved")
	}
	// A February message and its event arrive on c1 now.
	feb := time.Date(2024, 2, 20, 9, 0, 0, 0, time.UTC)
	id := idgen.Floor(feb) + 1
	evAt := feb.Add(time.Hour)
	msg := store.MoveRow{id, idgen.Time(id), int64(700), []byte("older"), []byte("stray"), nil, []byte("tx-stray"), int64(0), nil, int64(1),
		[]byte(`{"n":1}`), int64(1) /* msg_status consumed */, evAt, nil, nil, nil, nil, nil, make([]byte, 64) /* ack_slot, empty */}
	ev := store.MoveRow{idgen.Floor(evAt) + 5, evAt, id, int64(700), []byte("default"), []byte(store.EventAcked), []byte("w9"), int64(1), feb, nil, nil, nil}
	if err := st.TierWrite(ctx, store.TableMessages, []store.MoveRow{msg}); err != nil {
		t.Fatal(err)
	}
	if err := st.TierWrite(ctx, store.TableTrace, []store.MoveRow{ev}); err != nil {
		t.Fatal(err)
	}
	if n, _ := st.CountPartition(ctx, store.TableMessages, "p202404"); n != 1 {
		t.Fatalf("the February message is not in the lowest partition p202404 (%d rows there)", n)
	}
	f.clock.Set(date(2024, 8, 15))
	if err := f.job.Warm(ctx); err != nil {
		t.Fatal(err)
	}
	if st := f.job.Status(); len(st.Blocked) != 0 {
		t.Fatalf("blocked: %+v", st.Blocked)
	}
	if partitionNames(t, st, store.TableMessages)["p202404"] || partitionNames(t, st, store.TableTrace)["p202404"] {
		t.Fatal("April not moved")
	}
	tr, err := f.arch.ArchivedTrace(ctx, "older", "stray", f.clock.Now())
	if err != nil {
		t.Fatal(err)
	}
	if len(tr.Deliveries) != 1 || tr.Deliveries[0].State != domain.DeliveryDone || tr.Deliveries[0].Consumer != "w9" {
		t.Fatalf("archived trace of the February message: %+v", tr.Deliveries)
	}
}

// TestColdResumesAfterAFailedFile: a file that cannot be written stops the
// pass after the ranges before it were exported and removed; the next pass
// exports the rest, and the month's files hold every row once.
func TestColdResumesAfterAFailedFile(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	ctx := context.Background()
	march := time.Date(2024, 3, 1, 0, 0, 0, 0, time.UTC)
	f := setup(t, date(2024, 3, 10), Config{})
	for i := 0; i < 40; i++ {
		f.produce(t, "coldresume", fmt.Sprintf("c-%d", i), "")
	}
	f.consumeAll(t, "coldresume")
	f.clock.Set(date(2024, 7, 15))
	if err := f.job.Warm(ctx); err != nil {
		t.Fatal(err)
	}
	warm := f.archiveSums(t, march)
	if warm.messages != 40 {
		t.Fatalf("warm: %+v", warm)
	}
	// The second range's temporary file name is taken by a directory.
	blocker := filepath.Join(f.dir, "2024-03", "v0256-0511.jsonl.gz.tmp")
	if err := os.MkdirAll(blocker, 0o755); err != nil {
		t.Fatal(err)
	}
	f.clock.Set(date(2025, 4, 15))
	if err := f.job.Cold(ctx); err == nil {
		t.Fatal("the pass did not fail on the blocked file")
	}
	left := f.archiveSums(t, march)
	if left.messages == 0 || left.messages == 40 {
		t.Fatalf("after the failed pass the archive holds %d of 40 messages, want the first range gone and the rest kept", left.messages)
	}
	os.Remove(blocker)
	if err := f.job.Cold(ctx); err != nil {
		t.Fatal(err)
	}
	if got := f.archiveSums(t, march); got.messages != 0 || got.events != 0 {
		t.Fatalf("archive holds %+v after the resumed pass", got)
	}
	man, err := readManifest(filepath.Join(f.dir, "2024-03"))
	if err != nil {
		t.Fatal(err)
	}
	var msgs, evs int64
	for _, mf := range man.Files {
		msgs += mf.Messages
		evs += mf.Events
	}
	if msgs != 40 || evs != 40 {
		t.Fatalf("manifest counts %d messages and %d events, want 40 each", msgs, evs)
	}
	rep, err := f.job.Restore(ctx, march)
	if err != nil {
		t.Fatal(err)
	}
	if got := f.archiveSums(t, march); got != warm || rep.Messages != 40 {
		t.Fatalf("restored %+v (%+v), warm was %+v", got, rep, warm)
	}
}

// consumeOwned claims every ready delivery of topic and acks them as an
// owner's flush does: the final ack is kept on the message row, not as a
// trace row. It returns how many.
func (f *fixture) consumeOwned(t *testing.T, topic string) int {
	t.Helper()
	ctx := context.Background()
	n := 0
	for _, st := range f.hot {
		g, _, err := st.AcquireOwner(ctx, topic, "default", "r1", "", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		for {
			cands, err := st.ScanClaimable(ctx, topic, "default", f.clock.Now(), nil, 100, nil)
			if err != nil {
				t.Fatal(err)
			}
			if len(cands) == 0 {
				break
			}
			acks := make([]store.OwnedAck, len(cands))
			for i, c := range cands {
				acks[i] = store.OwnedAck{MessageID: c.MessageID, VShard: c.VShard, Consumer: "owner-w", Attempt: 1, ClaimedAt: f.clock.Now(), RequestID: "req-owned"}
			}
			res, err := st.FlushOwned(ctx, []store.OwnedFlush{{Unit: store.OwnedUnit{Topic: topic, Subscription: "default", Epoch: g.Epoch}, Acks: acks}}, f.clock.Now())
			if err != nil || res[0].Stale {
				t.Fatalf("owned acks: %+v, %v", res, err)
			}
			n += len(cands)
		}
	}
	return n
}

// wantOwnedAck checks a trace shows the final ack kept on the message row.
func wantOwnedAck(t *testing.T, where string, tr *store.MessageTrace) {
	t.Helper()
	var acked []store.Event
	for _, e := range tr.Events {
		if e.Type == store.EventAcked {
			acked = append(acked, e)
		}
	}
	if len(acked) != 1 || acked[0].Consumer != "owner-w" || acked[0].RequestID != "req-owned" || acked[0].Subscription != "default" || acked[0].Attempt != 1 {
		t.Errorf("%s trace of %s: acked events %+v, want the owner's one", where, tr.Message.Key, acked)
	}
	if tr.Message.Status != domain.MessageConsumed || len(tr.Deliveries) != 1 || tr.Deliveries[0].State != domain.DeliveryDone {
		t.Errorf("%s trace of %s: status %s, deliveries %+v", where, tr.Message.Key, tr.Message.Status, tr.Deliveries)
	}
}

// A final ack kept on the message row goes with it through every tier:
// warm, cold and restored traces show it as the hot one did.
func TestOwnedAcksThroughTheTiers(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	ctx := context.Background()
	march := time.Date(2024, 3, 1, 0, 0, 0, 0, time.UTC)
	f := setup(t, date(2024, 3, 10), Config{})
	var msgs []produced
	for i := 0; i < 10; i++ {
		msgs = append(msgs, f.produce(t, "owned", fmt.Sprintf("o-%d", i), ""))
	}
	f.clock.Set(date(2024, 4, 2))
	if n := f.consumeOwned(t, "owned"); n != 10 {
		t.Fatalf("consumed %d, want 10", n)
	}
	hot := f.hotSums(t, march)
	if hot.messages != 10 || hot.events != 0 {
		t.Fatalf("hot March: %+v, want 10 messages and no trace rows", hot)
	}
	check := func(want string) {
		t.Helper()
		for _, p := range msgs {
			where, tr, _ := f.traceTier(t, "owned", p)
			if where != want {
				t.Fatalf("trace of %s in %s, want %s", p.key, where, want)
			}
			wantOwnedAck(t, where, tr)
		}
	}
	check("hot")
	f.clock.Set(date(2024, 7, 15))
	if err := f.job.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if warm := f.archiveSums(t, march); warm != hot {
		t.Fatalf("warm March %+v, hot was %+v", warm, hot)
	}
	check("warm")
	f.clock.Set(date(2025, 4, 15))
	if err := f.job.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if got := f.archiveSums(t, march); got.messages != 0 {
		t.Fatalf("archive still holds March after the cold export: %+v", got)
	}
	if _, err := f.job.Restore(ctx, march); err != nil {
		t.Fatal(err)
	}
	if got := f.archiveSums(t, march); got != hot {
		t.Fatalf("restored March %+v, hot was %+v", got, hot)
	}
	check("warm")
}
