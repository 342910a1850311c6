package store

import (
	"context"
	"database/sql/driver"
	"fmt"
	"time"

	"github.com/shardmq/shardmq/internal/reqid"
)

// AckGroup is one request's acks in a batched ack: its leases and the
// request id its trace events carry.
type AckGroup struct {
	Leases    []Lease
	RequestID string
}

// AckResult is one group's outcome: a status per lease, in order, or the
// error that left the group undone.
type AckResult struct {
	Statuses []LeaseStatus
	Err      error
}

// AckMany completes the acks of several requests (the broker coalesces
// the acks that arrive for one cluster while its previous ack commits).
// The common case — every receipt still holds its lease, none ordered,
// none repeated — is one transaction for all groups in two round trips:
// a multi-statement of START TRANSACTION, the lock of the leased rows,
// the trace copy (INSERT … SELECT from the rows themselves), the delete
// and the message status sync, each joining the receipts to message_queue
// by primary key with the claim token compared in SQL; then COMMIT once
// the counts show that every receipt held. Otherwise (a lost or unknown
// lease, an ordered lease that un-parks the next of its key, a receipt
// twice) it rolls back and each group takes Ack, in its own transaction,
// which tells the statuses apart. The guarantees are Ack's.
func (s *Store) AckMany(ctx context.Context, groups []AckGroup, now time.Time) []AckResult {
	out := make([]AckResult, len(groups))
	if s.ackFastEligible(groups) {
		ok, err := s.ackFast(ctx, groups, now)
		if err != nil {
			for i := range out {
				out[i].Err = err
			}
			return out
		}
		if ok {
			for i, g := range groups {
				out[i].Statuses = make([]LeaseStatus, len(g.Leases)) // all LeaseOK
			}
			return out
		}
	}
	for i, g := range groups {
		gctx := ctx
		if g.RequestID != "" {
			gctx = reqid.With(ctx, g.RequestID)
		}
		out[i].Statuses, out[i].Err = s.Ack(gctx, g.Leases, now)
	}
	return out
}

func (s *Store) ackFastEligible(groups []AckGroup) bool {
	type key struct {
		id  uint64
		sub string
	}
	seen := map[key]bool{}
	n := 0
	for _, g := range groups {
		for _, l := range g.Leases {
			k := key{l.MessageID, l.Subscription}
			if l.Ordered || l.Token == 0 || seen[k] {
				return false
			}
			seen[k] = true
			n++
		}
	}
	return n > 0
}

// ackFast runs the one-transaction ack of every group; ok is false when
// some receipt no longer held its lease (nothing was changed then).
func (s *Store) ackFast(ctx context.Context, groups []AckGroup, now time.Time) (ok bool, err error) {
	var rows []ackRow
	var ids []uint64
	for _, g := range groups {
		rid := g.RequestID
		if rid == "" {
			rid = reqid.From(ctx)
		}
		for _, l := range g.Leases {
			rows = append(rows, ackRow{messageID: l.MessageID, sub: l.Subscription, token: l.Token, eventID: s.ids.Next(), requestID: rid})
			ids = append(ids, l.MessageID)
		}
	}
	lock, lockArgs := lockAckedSQL(rows)
	trace, traceArgs := insertAckedSQL(rows, now)
	del, delArgs := deleteAckedSQL(rows)
	status, statusArgs := markConsumedSQL(ids, now)
	query := "START TRANSACTION;\n" + lock + ";\n" + trace + ";\n" + del + ";\n" + status
	args := append(append(append(lockArgs, traceArgs...), delArgs...), statusArgs...)
	for attempt := 0; attempt < 5; attempt++ {
		if attempt > 0 {
			if h := s.retryHook("ack"); h != nil {
				h()
			}
		}
		ok, err = s.tryAckFast(ctx, query, args, int64(len(rows)))
		if err == nil || !retryable(err) {
			return ok, translate(err)
		}
	}
	return false, fmt.Errorf("gave up after 5 deadlocks or lock waits: %w", err)
}

func (s *Store) tryAckFast(ctx context.Context, query string, args []any, n int64) (bool, error) {
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return false, err
	}
	defer conn.Close()
	// Whatever happens after START TRANSACTION, the connection must not
	// go back to the pool inside a transaction.
	end := func(stmt string) error {
		_, err := conn.ExecContext(context.WithoutCancel(ctx), stmt)
		if err != nil {
			conn.Raw(func(any) error { return driver.ErrBadConn })
		}
		return err
	}
	affected, err := execMulti(ctx, conn, query, args)
	if err != nil {
		end("ROLLBACK")
		return false, fmt.Errorf("ack: %w", err)
	}
	// 0 START TRANSACTION, 1 lock (a result set: no count), 2 trace,
	// 3 delete, 4 status.
	if len(affected) != 5 || affected[2] != n || affected[3] != n {
		if err := end("ROLLBACK"); err != nil {
			return false, fmt.Errorf("ack: roll back: %w", err)
		}
		return false, nil
	}
	if err := end("COMMIT"); err != nil {
		return false, fmt.Errorf("ack: commit: %w", err)
	}
	return true, nil
}
