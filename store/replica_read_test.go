package store

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shardmq/shardmq/domain"
	"github.com/shardmq/shardmq/internal/testbed"
)

// replicaOf opens the fixture's database on the first cluster's replica,
// once it has everything the primary wrote so far.
func (f *fixture) replicaOf(t *testing.T) *Store {
	t.Helper()
	ctx := context.Background()
	if err := testbed.WaitReplicated(ctx, bed); err != nil {
		t.Fatal(err)
	}
	var db string
	if err := f.db.QueryRow("SELECT DATABASE()").Scan(&db); err != nil {
		t.Fatal(err)
	}
	st, err := Open(ctx, bed.Clusters[0].Replicas[0].DSN(db), Options{MaxOpen: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func TestHeartbeatAndReplicationStatus(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	at := time.Now().UTC().Truncate(time.Microsecond)
	if err := f.st.WriteHeartbeat(ctx, "router-a", at); err != nil {
		t.Fatal(err)
	}
	rep := f.replicaOf(t)
	got, err := rep.ReadHeartbeat(ctx, "router-a")
	if err != nil || !got.Equal(at) {
		t.Fatalf("replica heartbeat = %v, %v; want %v", got, err, at)
	}
	if _, err := rep.ReadHeartbeat(ctx, "router-b"); err == nil || !strings.Contains(err.Error(), ErrNotFound.Error()) {
		t.Fatalf("unknown router's heartbeat: %v, want not found", err)
	}
	if err := rep.WriteHeartbeat(ctx, "router-a", at); err == nil {
		t.Fatal("a heartbeat was written to a read-only replica")
	}
	st, err := rep.ReplicationStatus(ctx)
	if err != nil || !st.Replicating || !st.IORunning || !st.SQLRunning || st.SecondsBehind < 0 {
		t.Fatalf("replica status = %+v, %v", st, err)
	}
	if st, err := f.st.ReplicationStatus(ctx); err != nil || st.Replicating {
		t.Fatalf("primary status = %+v, %v; want not replicating", st, err)
	}
	if err := f.st.PurgeHeartbeats(ctx, at.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	if n := f.count(t, "SELECT COUNT(*) FROM heartbeat"); n != 0 {
		t.Fatalf("%d heartbeats left after purge", n)
	}
}

func TestTraceMergesDeliveriesAndEvents(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	it := f.item("t", "k", `{"x":1}`, "a", "b")
	it.Msg.TransactionID = "tx-1"
	if _, err := f.st.Produce(ctx, []ProduceItem{it}); err != nil {
		t.Fatal(err)
	}
	t0 := f.now.Add(time.Second)
	ca := f.claim(t, "a", 1, time.Minute, t0)
	if st, err := f.st.Ack(ctx, []Lease{lease(ca[0], "a")}, t0.Add(time.Second)); err != nil || st[0] != LeaseOK {
		t.Fatalf("ack: %v %v", st, err)
	}
	cb := f.claim(t, "b", 1, time.Minute, t0.Add(2*time.Second))
	policy := func(string, string) RetryPolicy { return RetryPolicy{MaxAttempts: 5} }
	if _, err := f.st.Nack(ctx, []NackItem{{Lease: lease(cb[0], "b"), ErrorCode: "E1", Error: "boom", RetryAfter: time.Second}},
		policy, func() float64 { return 0.5 }, t0.Add(3*time.Second)); err != nil {
		t.Fatal(err)
	}
	f.claim(t, "b", 1, time.Minute, t0.Add(5*time.Second))

	tr, err := f.st.Trace(ctx, "t", "k", t0.Add(6*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if tr.Message.ID != it.Msg.ID || tr.Message.Status != StatusPending || tr.Message.TransactionID != "tx-1" {
		t.Fatalf("message = %+v", tr.Message)
	}
	if len(tr.Deliveries) != 2 {
		t.Fatalf("deliveries = %+v", tr.Deliveries)
	}
	if a := tr.Deliveries[0]; a.Subscription != "a" || a.State != domain.DeliveryDone || a.Consumer != "w1" || a.Attempts != 1 {
		t.Fatalf("delivery a = %+v", a)
	}
	if b := tr.Deliveries[1]; b.Subscription != "b" || b.State != domain.DeliveryInFlight || b.Attempts != 2 || b.ErrorCode != "E1" ||
		b.LeaseExpires.Sub(t0.Add(5*time.Second+time.Minute)).Abs() > time.Millisecond {
		t.Fatalf("delivery b = %+v", b)
	}
	var types []string
	for i, e := range tr.Events {
		types = append(types, e.Subscription+":"+e.Type)
		if i > 0 && e.At.Before(tr.Events[i-1].At) {
			t.Fatalf("events out of time order: %+v", tr.Events)
		}
	}
	// Claims are not rows of their own: the acked and nacked events carry
	// their attempt's claim time (DESIGN §6), and the live lease is the
	// last claim.
	want := ":produced a:claimed a:acked b:claimed b:nacked b:retry_scheduled b:claimed"
	if got := strings.Join(types, " "); got != want {
		t.Fatalf("events = %s\nwant     %s", got, want)
	}
	if _, err := f.st.Trace(ctx, "t", "nope", f.now); err == nil || !strings.Contains(err.Error(), ErrNotFound.Error()) {
		t.Fatalf("trace of an unknown key: %v", err)
	}
	// The replica answers the same, from one snapshot.
	rtr, err := f.replicaOf(t).Trace(ctx, "t", "k", t0.Add(6*time.Second))
	if err != nil || len(rtr.Events) != len(tr.Events) {
		t.Fatalf("replica trace = %+v, %v", rtr, err)
	}
}

func TestTransactionLookups(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	var items []ProduceItem
	for i, tx := range []string{"tx-1", "tx-1", "tx-2", ""} {
		it := f.item("t", "k"+string(rune('a'+i)), `1`)
		it.Msg.TransactionID = tx
		items = append(items, it)
	}
	if _, err := f.st.Produce(ctx, items); err != nil {
		t.Fatal(err)
	}
	msgs, err := f.st.MessagesByTransaction(ctx, "tx-1", 10)
	if err != nil || len(msgs) != 2 || msgs[0].ID != items[0].Msg.ID || msgs[1].ID != items[1].Msg.ID {
		t.Fatalf("tx-1 = %v, %v", msgs, err)
	}
	found, err := f.st.FindTransactions(ctx, []string{"tx-1", "tx-2", "tx-3"})
	if err != nil || len(found) != 2 || found["tx-1"] != 2 || found["tx-2"] != 1 {
		t.Fatalf("found = %v, %v", found, err)
	}
	// The existence check reads the index only.
	rows, err := f.db.Query("EXPLAIN SELECT transaction_id, COUNT(*) FROM message_store WHERE transaction_id IN ('tx-1','tx-3') GROUP BY transaction_id")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	cols, _ := rows.Columns()
	vals := make([]any, len(cols))
	ptrs := make([]any, len(cols))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	if !rows.Next() {
		t.Fatal("no plan")
	}
	if err := rows.Scan(ptrs...); err != nil {
		t.Fatal(err)
	}
	plan := map[string]string{}
	for i, c := range cols {
		if b, ok := vals[i].([]byte); ok {
			plan[c] = string(b)
		}
	}
	if plan["key"] != "idx_transaction" || !strings.Contains(plan["Extra"], "Using index") {
		t.Fatalf("plan %v; want idx_transaction, Using index", plan)
	}
}

func TestReconcileFindsAndRepairs(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	var items []ProduceItem
	for _, k := range []string{"acked", "lost", "flipped", "died", "fine"} {
		items = append(items, f.item("t", k, `1`))
	}
	if _, err := f.st.Produce(ctx, items); err != nil {
		t.Fatal(err)
	}
	id := func(i int) uint64 { return items[i].Msg.ID }
	// acked: claimed and acked, then its status flipped back to pending.
	// died: nacked with one attempt allowed, then flipped to consumed.
	got := f.claim(t, "default", 5, time.Minute, f.now)
	policy := func(string, string) RetryPolicy { return RetryPolicy{MaxAttempts: 1} }
	for _, c := range got {
		switch c.Message.ID {
		case id(0):
			if _, err := f.st.Ack(ctx, []Lease{lease(c, "default")}, f.now); err != nil {
				t.Fatal(err)
			}
		case id(3):
			if _, err := f.st.Nack(ctx, []NackItem{{Lease: lease(c, "default"), ErrorCode: "E"}}, policy, func() float64 { return 0 }, f.now); err != nil {
				t.Fatal(err)
			}
		}
	}
	corrupt := []string{
		"UPDATE message_store SET msg_status = 0 WHERE id = " + itoa(id(0)),
		"DELETE FROM message_queue WHERE message_id = " + itoa(id(1)),
		"UPDATE message_store SET msg_status = 1 WHERE id = " + itoa(id(2)),
		"UPDATE message_store SET msg_status = 1 WHERE id = " + itoa(id(3)),
		"DELETE FROM message_key WHERE msg_key = 'fine'",
		"INSERT INTO message_queue (message_id, subscription, topic, vshard, priority, available_at) VALUES (42, 'default', 't', 7, 0, NOW())",
	}
	for _, q := range corrupt {
		if _, err := f.db.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	subs := func(context.Context, string, time.Time) ([]string, error) { return []string{"default"}, nil }
	window := CheckRange{Since: f.now.Add(-time.Hour), Until: f.now.Add(time.Hour), Limit: 2}
	var all []Finding
	scanned := 0
	for {
		found, n, next, err := f.st.CheckMessages(ctx, window, subs)
		if err != nil {
			t.Fatal(err)
		}
		all, scanned = append(all, found...), scanned+n
		if next == 0 {
			break
		}
		window.After = next
	}
	kinds := map[string]int{}
	var ids []uint64
	for _, fd := range all {
		kinds[fd.Kind]++
		ids = append(ids, fd.MessageID)
	}
	if scanned != 5 || kinds[FindingStatus] != 3 || kinds[FindingMissingDelivery] != 1 || kinds[FindingMissingKey] != 1 || len(all) != 5 {
		t.Fatalf("scanned %d, findings %+v", scanned, all)
	}
	repaired, err := f.st.RepairMessages(ctx, ids, subs, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	fixed := 0
	for _, r := range repaired {
		if r.Repaired {
			fixed++
		}
	}
	if fixed != 4 {
		t.Fatalf("repaired = %+v, want 4 repairs", repaired)
	}
	for i, want := range []int{statusCode(StatusConsumed), statusCode(StatusPending), statusCode(StatusPending), statusCode(StatusDead)} {
		if s := f.count(t, "SELECT msg_status FROM message_store WHERE id = ?", id(i)); s != want {
			t.Errorf("%s: status %d, want %d", items[i].Msg.Key, s, want)
		}
	}
	if n := f.count(t, "SELECT COUNT(*) FROM message_queue WHERE message_id = ? AND attempts = 0", id(1)); n != 1 {
		t.Fatal("lost delivery not re-created")
	}
	tr, err := f.st.Trace(ctx, "t", "lost", f.now)
	if err != nil || tr.Events[len(tr.Events)-1].Type != EventRedriven || tr.Events[len(tr.Events)-1].Consumer != ReconcilerConsumer {
		t.Fatalf("trace after repair = %+v, %v", tr, err)
	}
	found, _, _, err := f.st.CheckMessages(ctx, CheckRange{Since: f.now.Add(-time.Hour), Until: f.now.Add(time.Hour)}, subs)
	if err != nil || len(found) != 1 || found[0].Kind != FindingMissingKey {
		t.Fatalf("after repair: %+v, %v", found, err)
	}
	orphans, next, err := f.st.OrphanDeliveries(ctx, OrphanCursor{}, nil, 10)
	if err != nil || len(orphans) != 1 || orphans[0].MessageID != 42 || next != (OrphanCursor{}) {
		t.Fatalf("orphans = %+v, %v", orphans, err)
	}
}

func itoa(v uint64) string { return strconv.FormatUint(v, 10) }
