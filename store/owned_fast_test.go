package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/shardmq/shardmq/internal/testbed"
)

// flushScene is what a fast-flush case starts from, the same on two
// databases: units a and b of topic t owned by r1, and messages
// (their indexes in msgs): 0–3 for a, 4–6 for b, 7–8 for a and b.
type flushScene struct {
	f    *fixture
	a, b OwnedUnit
	msgs []uint64
}

func newFlushScene(t *testing.T) *flushScene {
	t.Helper()
	f := setup(t)
	sc := &flushScene{f: f}
	sc.msgs = append(sc.msgs, f.produce(t, 4, "", "a")...)
	sc.msgs = append(sc.msgs, f.produce(t, 3, "", "b")...)
	sc.msgs = append(sc.msgs, f.produce(t, 2, "", "a", "b")...)
	for _, u := range []*OwnedUnit{&sc.a, &sc.b} {
		sub := "a"
		if u == &sc.b {
			sub = "b"
		}
		g, _, err := f.st.AcquireOwner(context.Background(), "t", sub, "r1", "", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		*u = OwnedUnit{Topic: "t", Subscription: sub, Epoch: g.Epoch}
	}
	return sc
}

// ack is an ack of message i (an index; -1: a message that was never
// stored) by consumer c.
func (sc *flushScene) ack(i int, c string, claimed time.Time) OwnedAck {
	id := uint64(1)
	if i >= 0 {
		id = sc.msgs[i]
	}
	return OwnedAck{MessageID: id, VShard: 7, Consumer: c, Attempt: 1, ClaimedAt: claimed, RequestID: "req-" + c}
}

// state is what the tables hold, with message ids as indexes into msgs
// and the flush's time as "now", so that two scenes compare.
func (sc *flushScene) state(t *testing.T, now time.Time) string {
	t.Helper()
	index := map[uint64]int{}
	for i, id := range sc.msgs {
		index[id] = i
	}
	at := now.Truncate(time.Microsecond)
	var b strings.Builder
	dump := func(what, query string, args ...any) {
		rows, err := sc.f.db.Query(query, args...)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		defer rows.Close()
		cols, _ := rows.Columns()
		for rows.Next() {
			vals := make([]any, len(cols))
			ptrs := make([]any, len(cols))
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			if err := rows.Scan(ptrs...); err != nil {
				t.Fatal(err)
			}
			var id uint64
			fmt.Sscan(text(vals[0]), &id)
			fmt.Fprintf(&b, "%s m%d", what, index[id])
			for _, v := range vals[1:] {
				b.WriteString(" " + text(v))
			}
			b.WriteByte('\n')
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
	}
	dump("queue", "SELECT message_id, subscription, is_dead, attempts, parked FROM message_queue ORDER BY message_id, subscription")
	dump("message", `SELECT id, msg_status, status_at = ?, COALESCE(acked_sub, '-'), COALESCE(acked_by, '-'), COALESCE(acked_attempt, '-'),
  COALESCE(acked_claimed_at, '-'), COALESCE(acked_request, '-'), HEX(ack_slot) FROM message_store ORDER BY id`, at)
	dump("trace", `SELECT message_id, COALESCE(subscription, '-'), event, COALESCE(consumer, '-'), attempt, COALESCE(claimed_at, '-'),
  COALESCE(request_id, '-'), created_at = ? FROM message_trace ORDER BY message_id, subscription, event, consumer`, at)
	evs, err := eventsOf(context.Background(), sc.f.db, sc.msgs, EventAcked)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range evs {
		fmt.Fprintf(&b, "acked m%d %s %s %d %s %s %v\n", index[e.MessageID], e.Subscription, e.Consumer, e.Attempt, e.ClaimedAt, e.RequestID, near(e.At, now))
	}
	return b.String()
}

// text is a column's value as text.
func text(v any) string {
	if b, ok := v.([]byte); ok {
		return string(b)
	}
	return fmt.Sprint(v)
}

// The fast ack flush answers exactly as the general path on the same
// inputs: each case runs on two databases set up alike, once through the
// fast path and once through the general path alone; the answers and
// what the tables hold after must be the same, and the fast side must
// have gone the expected way.
func TestFlushAcksFastAnswersAsTheGeneralPath(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	ctx := context.Background()
	fenced := WithFence(ctx, Fence{MapVersion: 5})
	for _, tc := range []struct {
		name string
		// prepare changes a scene before the flush (both alike) and
		// answers the flush's ctx.
		prepare func(t *testing.T, sc *flushScene) context.Context
		batch   func(sc *flushScene, claimed time.Time) []OwnedFlush
		path    flushPath // the fast side's
		check   func(t *testing.T, sc *flushScene, res []OwnedResult, err error)
	}{
		{
			name: "acks of two units in three groups",
			batch: func(sc *flushScene, c time.Time) []OwnedFlush {
				return []OwnedFlush{
					{Unit: sc.a, Acks: []OwnedAck{sc.ack(0, "w1", c), sc.ack(1, "w1", c), sc.ack(2, "w2", c)}},
					{Unit: sc.b, Acks: []OwnedAck{sc.ack(4, "w1", c), sc.ack(5, "w1", c)}},
				}
			},
			path: flushFast,
		},
		{
			name:    "acks without a fence",
			prepare: func(*testing.T, *flushScene) context.Context { return ctx },
			batch: func(sc *flushScene, c time.Time) []OwnedFlush {
				return []OwnedFlush{{Unit: sc.a, Acks: []OwnedAck{sc.ack(0, "w1", c)}}}
			},
			path: flushFast,
		},
		{
			name: "an ack that leaves the other subscription's delivery",
			batch: func(sc *flushScene, c time.Time) []OwnedFlush {
				return []OwnedFlush{{Unit: sc.a, Acks: []OwnedAck{sc.ack(0, "w1", c), sc.ack(7, "w1", c)}}}
			},
			path: flushFast,
			check: func(t *testing.T, sc *flushScene, _ []OwnedResult, _ error) {
				if n := sc.f.count(t, "SELECT COUNT(*) FROM message_trace WHERE message_id = ? AND event = 'acked'", sc.msgs[7]); n != 1 {
					t.Errorf("%d acked trace rows for the message still delivered to b, want 1", n)
				}
			},
		},
		{
			name: "both subscriptions of a message in one flush",
			batch: func(sc *flushScene, c time.Time) []OwnedFlush {
				return []OwnedFlush{
					{Unit: sc.a, Acks: []OwnedAck{sc.ack(8, "wa", c)}},
					{Unit: sc.b, Acks: []OwnedAck{sc.ack(8, "wb", c)}},
				}
			},
			path: flushFast,
			check: func(t *testing.T, sc *flushScene, _ []OwnedResult, _ error) {
				id := sc.msgs[8]
				if n := sc.f.count(t, "SELECT COUNT(*) FROM message_store WHERE id = ? AND msg_status = 1 AND ack_slot <> ?", id, emptyAckSlot); n != 1 {
					t.Error("the message is not marked consumed with its final ack")
				}
				if n := sc.f.count(t, "SELECT COUNT(*) FROM message_trace WHERE message_id = ? AND event = 'acked'", id); n != 1 {
					t.Errorf("%d acked trace rows, want 1 (the other ack is on the row)", n)
				}
			},
		},
		{
			name: "a message consumed already",
			prepare: func(t *testing.T, sc *flushScene) context.Context {
				if _, err := sc.f.db.Exec("UPDATE message_store SET msg_status = ? WHERE id = ?", statusCode(StatusConsumed), sc.msgs[1]); err != nil {
					t.Fatal(err)
				}
				return fenced
			},
			batch: func(sc *flushScene, c time.Time) []OwnedFlush {
				return []OwnedFlush{{Unit: sc.a, Acks: []OwnedAck{sc.ack(0, "w1", c), sc.ack(1, "w1", c)}}}
			},
			path: flushFast,
			check: func(t *testing.T, sc *flushScene, _ []OwnedResult, _ error) {
				if n := sc.f.count(t, "SELECT COUNT(*) FROM message_trace WHERE message_id = ? AND event = 'acked'", sc.msgs[1]); n != 1 {
					t.Errorf("the ack of a message consumed already left %d trace rows, want 1", n)
				}
			},
		},
		{
			name: "a delivery gone",
			batch: func(sc *flushScene, c time.Time) []OwnedFlush {
				return []OwnedFlush{
					{Unit: sc.a, Acks: []OwnedAck{sc.ack(0, "w1", c), sc.ack(-1, "w1", c), sc.ack(4, "w1", c)}},
					{Unit: sc.b, Acks: []OwnedAck{sc.ack(5, "w1", c)}},
				}
			},
			path: flushRecount,
			check: func(t *testing.T, _ *flushScene, res []OwnedResult, _ error) {
				if fmt.Sprint(res[0].Acks, res[1].Acks) != "[true false false] [true]" {
					t.Errorf("outcomes %+v", res)
				}
			},
		},
		{
			name: "a stale unit among fresh ones",
			batch: func(sc *flushScene, c time.Time) []OwnedFlush {
				stale := sc.a
				stale.Epoch++
				return []OwnedFlush{
					{Unit: stale, Acks: []OwnedAck{sc.ack(0, "w1", c)}},
					{Unit: sc.b, Acks: []OwnedAck{sc.ack(4, "w1", c)}},
				}
			},
			path: flushRefused,
			check: func(t *testing.T, sc *flushScene, res []OwnedResult, _ error) {
				if !res[0].Stale || res[1].Stale || !res[1].Acks[0] {
					t.Errorf("outcomes %+v", res)
				}
				if n := sc.f.count(t, "SELECT COUNT(*) FROM message_queue WHERE message_id = ?", sc.msgs[0]); n != 1 {
					t.Error("the stale unit's ack deleted its delivery")
				}
			},
		},
		{
			name: "a unit with no owner record",
			batch: func(sc *flushScene, c time.Time) []OwnedFlush {
				return []OwnedFlush{
					{Unit: sc.a, Acks: []OwnedAck{sc.ack(0, "w1", c)}},
					{Unit: OwnedUnit{Topic: "t", Subscription: "nobody", Epoch: 1}, Acks: []OwnedAck{sc.ack(4, "w1", c)}},
				}
			},
			path: flushRefused,
		},
		{
			name: "a shard fence newer than the flush's",
			prepare: func(t *testing.T, sc *flushScene) context.Context {
				if err := sc.f.st.RaiseFence(ctx, 7, nil, "job", sc.f.now); err != nil {
					t.Fatal(err)
				}
				return fenced
			},
			batch: func(sc *flushScene, c time.Time) []OwnedFlush {
				return []OwnedFlush{{Unit: sc.a, Acks: []OwnedAck{sc.ack(0, "w1", c)}}, {Unit: sc.b, Acks: []OwnedAck{sc.ack(4, "w1", c)}}}
			},
			path: flushRefused,
			check: func(t *testing.T, sc *flushScene, res []OwnedResult, err error) {
				var fe *FenceError
				if !errors.As(err, &fe) || fe.Have != 5 || fe.Need != 7 || !errors.Is(err, ErrFenced) || !errors.Is(err, ErrUnavailable) || res != nil {
					t.Errorf("answer %+v, %v; want a FenceError from 5 to 7", res, err)
				}
				if n := sc.f.count(t, "SELECT COUNT(*) FROM message_queue"); n != 11 {
					t.Errorf("%d deliveries left of 11: a fenced flush wrote", n)
				}
			},
		},
		{
			name: "a shard fence as new as the flush's",
			prepare: func(t *testing.T, sc *flushScene) context.Context {
				if err := sc.f.st.RaiseFence(ctx, 5, nil, "job", sc.f.now); err != nil {
					t.Fatal(err)
				}
				return fenced
			},
			batch: func(sc *flushScene, c time.Time) []OwnedFlush {
				return []OwnedFlush{{Unit: sc.a, Acks: []OwnedAck{sc.ack(0, "w1", c)}}}
			},
			path: flushFast,
		},
		{
			name: "not acks alone",
			batch: func(sc *flushScene, c time.Time) []OwnedFlush {
				return []OwnedFlush{{Unit: sc.a, Acks: []OwnedAck{sc.ack(0, "w1", c)}, Nacks: []OwnedNack{{OwnedAck: sc.ack(1, "w1", c), Dead: true}}}}
			},
			path: flushGeneral,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			fast, general := newFlushScene(t), newFlushScene(t)
			flushCtx := fenced
			if tc.prepare != nil {
				flushCtx = tc.prepare(t, fast)
				tc.prepare(t, general)
			}
			// One time for both, after both scenes' messages were made.
			now := time.Now().UTC().Add(time.Second)
			claimed := now.Add(-time.Second)
			fastRes, path, fastErr := fast.f.st.flushOwned(flushCtx, tc.batch(fast, claimed), now, true)
			if path != tc.path {
				t.Errorf("the fast side went way %d, want %d", path, tc.path)
			}
			genRes, genPath, genErr := general.f.st.flushOwned(flushCtx, tc.batch(general, claimed), now, false)
			if genPath != flushGeneral {
				t.Fatalf("the general side went way %d", genPath)
			}
			if !reflect.DeepEqual(fastRes, genRes) {
				t.Errorf("outcomes differ:\nfast    %+v\ngeneral %+v", fastRes, genRes)
			}
			if fmt.Sprint(fastErr) != fmt.Sprint(genErr) {
				t.Errorf("errors differ:\nfast    %v\ngeneral %v", fastErr, genErr)
			}
			if tc.check == nil && (fastErr != nil || len(fastRes) == 0) {
				t.Errorf("answer %+v, %v", fastRes, fastErr)
			}
			if a, b := fast.state(t, now), general.state(t, now); a != b {
				t.Errorf("tables differ:\nfast:\n%s\ngeneral:\n%s", a, b)
			}
			if tc.check != nil {
				tc.check(t, fast, fastRes, fastErr)
			}
		})
	}
}

// sessionCounts reads the statement counters of the one session of a
// store opened with one connection, less the read's own.
func sessionCounts(t *testing.T, st *Store) map[string]int {
	t.Helper()
	rows, err := st.DB().Query(`SELECT LOWER(VARIABLE_NAME), VARIABLE_VALUE FROM information_schema.SESSION_STATUS
WHERE VARIABLE_NAME IN ('QUESTIONS', 'COM_BEGIN', 'COM_SELECT', 'COM_DELETE', 'COM_UPDATE', 'COM_INSERT', 'COM_COMMIT', 'COM_ROLLBACK')`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var name string
		var n int
		if err := rows.Scan(&name, &n); err != nil {
			t.Fatal(err)
		}
		out[name] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// The statements of a flush of acks, counted by the server on the only
// connection of a store opened with one: the fast path sends the general
// path's statements but a delete per unit and the fence's and owners'
// reads, which become probes, in 3 round trips (START TRANSACTION to the
// locking read; the updates; COMMIT) where the general path takes one per
// statement. The server counts statements, not round trips: those are
// read off the code (owned_fast.go).
func TestFlushAcksFastStatements(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	ctx := WithFence(context.Background(), Fence{MapVersion: 5})
	for _, tc := range []struct {
		name  string
		fast  bool
		units int
		want  map[string]int
	}{
		{"fast, one unit", true, 1, map[string]int{"questions": 7, "com_begin": 1, "com_select": 3, "com_delete": 1, "com_update": 1, "com_commit": 1}},
		{"general, one unit", false, 1, map[string]int{"questions": 7, "com_begin": 1, "com_select": 3, "com_delete": 1, "com_update": 1, "com_commit": 1}},
		{"fast, two units", true, 2, map[string]int{"questions": 8, "com_begin": 1, "com_select": 3, "com_delete": 1, "com_update": 2, "com_commit": 1}},
		{"general, two units", false, 2, map[string]int{"questions": 9, "com_begin": 1, "com_select": 3, "com_delete": 2, "com_update": 2, "com_commit": 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			sc := newFlushScene(t)
			var name string
			if err := sc.f.db.QueryRow("SELECT DATABASE()").Scan(&name); err != nil {
				t.Fatal(err)
			}
			st, err := Open(context.Background(), bed.Clusters[0].Primary.DSN(name), Options{MaxOpen: 1, MaxIdle: 1})
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			now := time.Now().UTC().Add(time.Second)
			batch := []OwnedFlush{{Unit: sc.a, Acks: []OwnedAck{sc.ack(0, "w1", now), sc.ack(1, "w1", now)}}}
			if tc.units == 2 {
				batch = append(batch, OwnedFlush{Unit: sc.b, Acks: []OwnedAck{sc.ack(4, "w2", now)}})
			}
			var conn1, conn2 int64
			st.DB().QueryRow("SELECT CONNECTION_ID()").Scan(&conn1)
			base := sessionCounts(t, st)
			again := sessionCounts(t, st) // what a read of the counters adds
			_, path, err := st.flushOwned(ctx, batch, now, tc.fast)
			if err != nil || path != map[bool]flushPath{true: flushFast, false: flushGeneral}[tc.fast] {
				t.Fatalf("flush: way %d, %v", path, err)
			}
			after := sessionCounts(t, st)
			st.DB().QueryRow("SELECT CONNECTION_ID()").Scan(&conn2)
			if conn1 == 0 || conn1 != conn2 {
				t.Fatalf("the store's session changed (%d, %d): its counters say nothing", conn1, conn2)
			}
			got := map[string]int{}
			for k := range after {
				if n := after[k] - again[k] - (again[k] - base[k]); n != 0 {
					got[k] = n
				}
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("statements %v, want %v", got, tc.want)
			}
		})
	}
}

// The fast flush's first round trip holds what the general path's reads
// hold until its commit: the shard fence and its units' owner rows under
// shared locks (a fence raise and a takeover wait for it), and the other
// deliveries of the messages it acks (another subscription's final ack
// waits for it).
func TestFlushAcksFastHoldsTheLocks(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	ctx := context.Background()
	sc := newFlushScene(t)
	now := time.Now().UTC()
	batch := []OwnedFlush{{Unit: sc.a, Acks: []OwnedAck{sc.ack(0, "w1", now), sc.ack(7, "w1", now)}}}
	query, args, want := flushAcksFastSQL(batch, Fence{MapVersion: 5}, true)
	conn, err := sc.f.db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	deleted, left, err := deleteAndLock(ctx, conn, query, args)
	if err != nil || deleted != want || !left[sc.msgs[7]] || left[sc.msgs[0]] {
		t.Fatalf("first round trip: deleted %d of %d, left %v, %v", deleted, want, left, err)
	}
	other, err := sc.f.db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	locked := []struct {
		what, query string
		args        []any
	}{
		{"the shard fence", "SELECT map_version FROM shard_fence WHERE id = 1 FOR UPDATE NOWAIT", nil},
		{"the unit's owner row", "SELECT epoch FROM delivery_owner WHERE topic = ? AND subscription = ? FOR UPDATE NOWAIT", []any{"t", "a"}},
		{"the message's other delivery", "SELECT attempts FROM message_queue WHERE message_id = ? AND subscription = ? FOR UPDATE NOWAIT", []any{sc.msgs[7], "b"}},
	}
	try := func(query string, args []any) error {
		if _, err := other.ExecContext(ctx, "BEGIN"); err != nil {
			t.Fatal(err)
		}
		defer other.ExecContext(ctx, "ROLLBACK")
		rows, err := other.QueryContext(ctx, query, args...)
		if err == nil {
			rows.Close()
		}
		return err
	}
	for _, l := range locked {
		if err := try(l.query, l.args); err == nil {
			t.Errorf("%s is not locked by the fast flush", l.what)
		}
	}
	if _, err := conn.ExecContext(ctx, "ROLLBACK"); err != nil {
		t.Fatal(err)
	}
	for _, l := range locked {
		if err := try(l.query, l.args); err != nil {
			t.Errorf("%s after the rollback: %v", l.what, err)
		}
	}
}

// A fast flush whose COMMIT goes unanswered is answered as one that
// committed when it did — its own rows are there: the final ack's mark
// on the message row, the acked event of an ack that leaves another
// delivery —, also after its deadline, a takeover or a raised fence; and
// stays ErrOutcomeUnknown when it did not, even when its deliveries are
// gone by other hands (a takeover's acks, a dropped subscription): a
// review found those answered ok when the answer rested on the
// deliveries and epochs.
func TestFlushAcksFastResolvesALostCommitAnswer(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	lost := errors.New("connection cut during COMMIT")
	committed := func(then func(sc *flushScene)) func(*flushScene, *sql.Conn, func() error) error {
		return func(sc *flushScene, _ *sql.Conn, commit func() error) error {
			if err := commit(); err != nil {
				return err
			}
			then(sc)
			return lost
		}
	}
	notCommitted := func(then func(sc *flushScene)) func(*flushScene, *sql.Conn, func() error) error {
		return func(sc *flushScene, conn *sql.Conn, commit func() error) error {
			// The server rolls the transaction back when its connection
			// dies: kill it here, then let the others act.
			var id int64
			if err := conn.QueryRowContext(context.Background(), "SELECT CONNECTION_ID()").Scan(&id); err != nil {
				t.Fatal(err)
			}
			if _, err := sc.f.db.Exec("KILL ?", id); err != nil {
				t.Fatal(err)
			}
			for try := 0; ; try++ {
				var n int
				if err := sc.f.db.QueryRow("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = ?", id).Scan(&n); err != nil {
					t.Fatal(err)
				}
				if n == 0 {
					break
				}
				if try == 250 {
					t.Fatalf("the flush's connection %d still there 5 s after its KILL", id)
				}
				time.Sleep(20 * time.Millisecond)
			}
			then(sc)
			return lost
		}
	}
	nothing := func(*flushScene) {}
	takeOverAndAck := func(sc *flushScene) {
		if _, err := sc.f.db.Exec("UPDATE delivery_owner SET epoch = epoch + 1 WHERE topic = 't' AND subscription = 'a'"); err != nil {
			t.Fatal(err)
		}
		if _, err := sc.f.db.Exec("DELETE FROM message_queue WHERE subscription = 'a' AND message_id IN (?, ?)", sc.msgs[0], sc.msgs[7]); err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct {
		name   string
		commit func(sc *flushScene, conn *sql.Conn, commit func() error) error
		// expired: the flush's own deadline has passed when its answer
		// is lost.
		expired bool
		ok      bool // answered as committed, else ErrOutcomeUnknown
	}{
		{"committed, answer lost", committed(nothing), false, true},
		{"committed, answer lost past the flush's deadline", committed(nothing), true, true},
		{"committed, then the unit taken over", committed(func(sc *flushScene) {
			if _, err := sc.f.db.Exec("UPDATE delivery_owner SET epoch = epoch + 1 WHERE topic = 't' AND subscription = 'a'"); err != nil {
				t.Fatal(err)
			}
		}), false, true},
		{"committed, then the fence raised", committed(func(sc *flushScene) {
			if err := sc.f.st.RaiseFence(context.Background(), 9, nil, "job", sc.f.now); err != nil {
				t.Fatal(err)
			}
		}), false, true},
		{"not committed", notCommitted(nothing), false, false},
		{"not committed, then taken over and acked by the next owner", notCommitted(takeOverAndAck), false, false},
		{"not committed, then the subscription dropped", notCommitted(func(sc *flushScene) {
			if _, err := sc.f.st.DropSubscription(context.Background(), "t", "a", sc.f.now); err != nil {
				t.Fatal(err)
			}
		}), false, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			sc := newFlushScene(t)
			ctx := WithFence(context.Background(), Fence{MapVersion: 5})
			if err := sc.f.st.RaiseFence(ctx, 5, nil, "job", sc.f.now); err != nil {
				t.Fatal(err)
			}
			var cancel context.CancelFunc = func() {}
			if c.expired {
				ctx, cancel = context.WithTimeout(ctx, time.Second)
			}
			defer cancel()
			sc.f.st.fastCommit = func(conn *sql.Conn, commit func() error) error {
				err := c.commit(sc, conn, commit)
				if c.expired {
					<-ctx.Done()
					return ctx.Err()
				}
				return err
			}
			now := time.Now().UTC()
			// m0's ack is final (its only delivery); m7's leaves its
			// delivery of b, so it is a trace event.
			batch := []OwnedFlush{{Unit: sc.a, Acks: []OwnedAck{sc.ack(0, "w1", now), sc.ack(7, "w1", now)}}}
			out, err := sc.f.st.FlushOwned(ctx, batch, now)
			switch {
			case c.ok && (err != nil || len(out) != 1 || !reflect.DeepEqual(out[0].Acks, []bool{true, true})):
				t.Fatalf("answered %+v, %v; want both acks done", out, err)
			case !c.ok && (!errors.Is(err, ErrOutcomeUnknown) || out != nil):
				t.Fatalf("answered %+v, %v; want %v", out, err, ErrOutcomeUnknown)
			}
			var marked, traced int
			if err := sc.f.db.QueryRow("SELECT COUNT(*) FROM message_store WHERE id = ? AND ack_slot <> ?", sc.msgs[0], emptyAckSlot).Scan(&marked); err != nil {
				t.Fatal(err)
			}
			if err := sc.f.db.QueryRow("SELECT COUNT(*) FROM message_trace WHERE message_id = ? AND event = ?", sc.msgs[7], EventAcked).Scan(&traced); err != nil {
				t.Fatal(err)
			}
			if wrote := marked == 1 && traced == 1; wrote != c.ok {
				t.Fatalf("the flush's rows: mark %d, event %d; answered as committed: %v", marked, traced, c.ok)
			}
		})
	}
}
