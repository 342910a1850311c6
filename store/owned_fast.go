package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The fast ack flush. Most flushes carry acks and nothing else; the
// general path (flushIn) sends each of their statements in a round trip
// of its own: START TRANSACTION, the shard fence, the owners' epochs, a
// delete per unit, the locking read of the deliveries left, an update per
// group of final acks, COMMIT. This path sends the same work in three:
//
//  1. START TRANSACTION; the fence probe (fenceProbeSQL); the epoch probe
//     (ownerProbeSQL); the delete of the acked deliveries' order rows,
//     when some have an order key; one delete of every unit's acks; the deliveries
//     left, read with a shared lock, behind the delete's count.
//  2. One update per group of final acks (markAcked), and the `acked`
//     trace rows of the acks that leave a delivery.
//  3. COMMIT.
//
// The probes stand in for the reads that the general path looks at before
// writing: each fails the multi-statement (error 1690) when the fence is
// newer than the flush's map or a unit's epoch is not the flush's, so
// that nothing after it runs. The probes take the same shared locks, in
// the same order, as checkFence and ownerFence; the delete removes the
// rows of the general path's deletes, one per unit, and its count is
// their sum; the statements after it are the general path's, in its
// order (TestFlushAcksFastHoldsTheLocks). What the
// probes cannot answer goes to the general path, which answers it as it
// always did, in a transaction of its own after this one rolled back:
// a fence newer than the flush's (its FenceError), a stale unit (which
// writes nothing while the others commit), a delivery gone (the careful
// pass). COMMIT keeps its own round trip: a connection lost before it
// is a transaction rolled back and run again, as in inTx; only one lost
// during the COMMIT is outcome unknown.

// fastFlushable says batch can take the fast path: acks alone, none of
// them finishing an ordered delivery (those un-park the next), of
// distinct units, and ctx carries no OwnerCheck (tryTx's second check).
func fastFlushable(ctx context.Context, batch []OwnedFlush) bool {
	if c, ok := OwnerCheckFrom(ctx); ok && len(c.VShards) > 0 {
		return false
	}
	seen := make(map[[2]string]bool, len(batch))
	acks := 0
	for _, f := range batch {
		if len(f.Nacks) > 0 || len(f.Leases) > 0 || len(f.Park) > 0 {
			return false
		}
		k := [2]string{f.Unit.Topic, f.Unit.Subscription}
		if seen[k] {
			return false
		}
		seen[k] = true
		for _, a := range f.Acks {
			if a.Ordered && a.OrderKey != "" {
				return false
			}
		}
		acks += len(f.Acks)
	}
	return acks > 0
}

// flushAcksFast writes a batch that fastFlushable accepted, or answers
// why it did not (flushRefused, flushRecount: nothing was written).
// Deadlocks, lock waits and connections lost before the COMMIT run it
// again, as inTx does.
func (s *Store) flushAcksFast(ctx context.Context, batch []OwnedFlush, now time.Time) ([]OwnedResult, flushPath, error) {
	fence, fenced := FenceFrom(ctx)
	query, args, want := flushAcksFastSQL(batch, fence, fenced)
	type run struct {
		out  []OwnedResult
		path flushPath
	}
	r, err := retry(txAttempts, s.retryHook("flush"), func() (run, error) {
		out, path, err := s.tryFlushAcksFast(ctx, batch, now, query, args, want)
		return run{out, path}, err
	})
	if err != nil {
		return nil, flushFast, err
	}
	return r.out, r.path, nil
}

// flushAcksFastSQL is the fast flush's first multi-statement and its
// arguments, and how many deliveries its delete must find.
func flushAcksFastSQL(batch []OwnedFlush, fence Fence, fenced bool) (string, []any, int64) {
	var b strings.Builder
	var args []any
	b.WriteString("START TRANSACTION;\n")
	if fenced {
		b.WriteString(fenceProbeSQL + ";\n")
		args = append(args, fence.MapVersion)
	}
	units := make([]OwnedUnit, len(batch))
	var subs, keyedSubs []string
	var ids, keyedIDs [][]uint64
	var all []uint64
	for i, f := range batch {
		units[i] = f.Unit
		if len(f.Acks) == 0 {
			continue
		}
		unitIDs := make([]uint64, len(f.Acks))
		var keyed []uint64
		for j, a := range f.Acks {
			unitIDs[j] = a.MessageID
			if a.OrderKey != "" {
				keyed = append(keyed, a.MessageID)
			}
		}
		subs = append(subs, f.Unit.Subscription)
		ids = append(ids, unitIDs)
		all = append(all, unitIDs...)
		if len(keyed) > 0 {
			keyedSubs = append(keyedSubs, f.Unit.Subscription)
			keyedIDs = append(keyedIDs, keyed)
		}
	}
	q, args := ownerProbeSQL(args, units)
	b.WriteString(q + ";\n")
	if len(keyedIDs) > 0 {
		// Order rows before their deliveries, in the order a head read
		// locks (message_order.go).
		q, args = deleteOrderRowsManySQL(args, keyedSubs, keyedIDs)
		b.WriteString(q + ";\n")
	}
	q, args = deleteOwnedManySQL(args, subs, ids)
	b.WriteString(q + ";\n")
	q, args = withDeliveriesCountedSQL(args, all)
	b.WriteString(q)
	return b.String(), args, int64(len(all))
}

func (s *Store) tryFlushAcksFast(ctx context.Context, batch []OwnedFlush, now time.Time, query string, args []any, want int64) ([]OwnedResult, flushPath, error) {
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return nil, flushFast, err
	}
	defer conn.Close()
	// From START TRANSACTION on, the way out is COMMIT or ROLLBACK: the
	// connection never goes back to the pool inside a transaction.
	committed := false
	defer func() {
		if !committed {
			rollbackConn(ctx, conn)
		}
	}()
	deleted, left, err := deleteAndLock(ctx, conn, query, args)
	switch {
	case probeFailed(err):
		return nil, flushRefused, nil
	case err != nil:
		return nil, flushFast, lostBeforeCommit(err)
	case deleted != want: // a delivery gone (or a count the server did not give)
		return nil, flushRecount, nil
	}

	acked := make([]unitAck, 0, want)
	for _, f := range batch {
		u := f.Unit
		for _, a := range f.Acks {
			acked = append(acked, unitAck{delivery{messageID: a.MessageID, vshard: a.VShard, subscription: u.Subscription, topic: u.Topic, orderKey: a.OrderKey}, a})
		}
	}
	p := s.planAcks(acked, left, now)
	q, qargs := finishAcksSQL(ctx, p)
	affected, err := execMulti(ctx, conn, q, qargs)
	if err != nil {
		return nil, flushFast, lostBeforeCommit(fmt.Errorf("flush acks: %w", err))
	}
	if stmts := len(p.groups) + min(len(p.traced), 1); len(affected) != stmts {
		return nil, flushFast, fmt.Errorf("flush acks: %d statements answered, want %d", len(affected), stmts)
	}
	var events []Event
	for i, g := range p.groups {
		if int(affected[i]) == len(g.ids) {
			continue
		}
		evs, err := s.unmarked(ctx, conn, g, p)
		if err != nil {
			return nil, flushFast, lostBeforeCommit(err)
		}
		events = append(events, evs...)
	}
	if err := insertEvents(ctx, conn, events); err != nil {
		return nil, flushFast, lostBeforeCommit(err)
	}
	commit := func() error {
		_, err := conn.ExecContext(ctx, "COMMIT")
		return err
	}
	if s.fastCommit != nil {
		err = s.fastCommit(conn, commit)
	} else {
		err = commit()
	}
	if err != nil {
		if err = uncertain(err); errors.Is(err, ErrOutcomeUnknown) {
			err = &lostCommit{err: err, at: p.at, groups: p.groups, events: append(slices.Clip(p.traced), events...)}
		}
		return nil, flushFast, err
	}
	committed = true

	return allAcked(batch), flushFast, nil
}

// allAcked is the outcome of a fast flush that committed: every ack of
// every unit done (its delete found them all).
func allAcked(batch []OwnedFlush) []OwnedResult {
	out := make([]OwnedResult, len(batch))
	for i, f := range batch {
		r := OwnedResult{Acks: make([]bool, len(f.Acks)), Nacks: make([]bool, 0), Leases: make([]bool, 0)}
		for j := range r.Acks {
			r.Acks[j] = true
		}
		out[i] = r
	}
	return out
}

// resolveTimeout bounds the reads that tell whether a fast flush whose
// COMMIT went unanswered committed.
const resolveTimeout = 5 * time.Second

// lostCommit is the ErrOutcomeUnknown of a fast flush whose COMMIT went
// unanswered (a router stalled past the flush's deadline, a connection
// cut during the COMMIT), with what its transaction wrote that nothing
// else writes: each ack left either its final ack's mark on its message
// row (ackedOn: the slot or columns with the flush's time to the
// microsecond) or an acked trace event of its own (by its new id).
type lostCommit struct {
	err    error
	at     time.Time
	groups []ackGroup
	events []Event
}

func (e *lostCommit) Error() string { return e.err.Error() }
func (e *lostCommit) Unwrap() error { return e.err }

// committed reads whether the flush committed: every ack's own row is
// there (a transaction's rows appear together at its commit). Anything
// short of that — a row missing, a read that fails — leaves the outcome
// unknown. The reads get a deadline of their own: the flush's has often
// passed. Deliveries gone prove nothing (a takeover's acks, a dropped
// subscription or a resharding cleanup delete them too); these rows are
// the flush's alone.
func (e *lostCommit) committed(ctx context.Context, q queryer) bool {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), resolveTimeout)
	defer cancel()
	traced := make(map[ackKey]bool, len(e.events))
	if len(e.events) > 0 {
		ids := make([]uint64, len(e.events))
		for i, ev := range e.events {
			ids[i] = ev.ID
			traced[ackKey{ev.Subscription, ev.MessageID}] = true
		}
		n, err := countEvents(ctx, q, ids)
		if err != nil || n != len(ids) {
			return false
		}
	}
	for _, g := range e.groups {
		on, err := ackedOn(ctx, q, g.ids, g.k, e.at)
		if err != nil {
			return false
		}
		for _, id := range g.ids {
			if !on[id] && !traced[ackKey{g.k.sub, id}] {
				return false
			}
		}
	}
	return true
}

// ackKey is one ack: its subscription and message.
type ackKey struct {
	sub string
	id  uint64
}

// deleteAndLock runs the fast flush's first multi-statement on conn and
// answers how many deliveries its delete found (-1: the server did not
// say, which sends the flush to the general path rather than guess) and
// which of the acked messages still have a delivery (locked).
func deleteAndLock(ctx context.Context, conn *sql.Conn, query string, args []any) (int64, map[uint64]bool, error) {
	deleted := int64(-1)
	left := map[uint64]bool{}
	err := queryEach(ctx, conn, "flush acks", query, args, func(rows *sql.Rows) error {
		var v []byte
		var isID int
		if err := rows.Scan(&v, &isID); err != nil {
			return err
		}
		if isID == 0 {
			n, err := strconv.ParseInt(string(v), 10, 64)
			if err != nil {
				return fmt.Errorf("deleted count %q: %w", v, err)
			}
			deleted = n
			return nil
		}
		id, err := strconv.ParseUint(string(v), 10, 64)
		if err != nil {
			return fmt.Errorf("message id %q: %w", v, err)
		}
		left[id] = true
		return nil
	})
	if err != nil {
		return 0, nil, err
	}
	return deleted, left, nil
}

// finishAcksSQL is the fast flush's second multi-statement: p's updates,
// one per group (markAckedSQL), then the insert of its traced events.
func finishAcksSQL(ctx context.Context, p ackPlan) (string, []any) {
	var b strings.Builder
	var args []any
	for i, g := range p.groups {
		if i > 0 {
			b.WriteString(";\n")
		}
		var q string
		q, args = markAckedSQL(args, g.ids, g.k, p.at)
		b.WriteString(q)
	}
	if len(p.traced) > 0 {
		if len(p.groups) > 0 {
			b.WriteString(";\n")
		}
		var q string
		q, args = insertEventsSQL(ctx, args, "INSERT INTO", p.traced)
		b.WriteString(q)
	}
	return b.String(), args
}
