package store

import (
	"context"
	"database/sql"
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
// the acks that reach one cluster while its previous ack commits) in one
// transaction: Ack's statements — lock, delete, trace, status sync — run
// once over every group's leases, each multi-row, and one commit covers
// them all. Each lease keeps Ack's guarantees and outcome: a receipt
// whose lease was lost is lease_lost, one already acked (in an earlier
// transaction or by an earlier group of this one) not_found; each acked
// event carries its own request's id. If the transaction fails, every
// group gets the error.
func (s *Store) AckMany(ctx context.Context, groups []AckGroup, now time.Time) []AckResult {
	var leases []Lease
	var rids []string
	for _, g := range groups {
		rid := g.RequestID
		if rid == "" {
			rid = reqid.From(ctx)
		}
		for _, l := range g.Leases {
			leases = append(leases, l)
			rids = append(rids, rid)
		}
	}
	statuses := make([]LeaseStatus, len(leases))
	var err error
	if len(leases) > 0 {
		err = s.inTx(ctx, txAttempts, s.retryHook("ack"), func(tx *sql.Tx) error {
			return s.ackIn(ctx, tx, leases, rids, now, statuses)
		})
	}
	out := make([]AckResult, len(groups))
	off := 0
	for i, g := range groups {
		if err != nil {
			out[i].Err = err
			continue
		}
		out[i].Statuses = statuses[off : off+len(g.Leases) : off+len(g.Leases)]
		off += len(g.Leases)
	}
	return out
}
