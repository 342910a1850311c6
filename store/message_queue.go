package store

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"
)

// message_queue holds the live deliveries: one row per (message,
// subscription) until it is acked (the row is deleted; history is in
// message_trace) or dies (is_dead = 1, kept for the dead-letter tools).
//
// available_at is when the delivery may next be claimed: the produce time
// plus any delay, the retry time after a nack, and — while leased — the
// lease's expiry. So one condition, available_at <= now, selects ready
// deliveries and expired leases alike, and an expired lease needs no
// rescuer to become claimable again. locked_by and claim_token stay set
// after a lease expires until the next claim, which is how the claim knows
// that an attempt was lost (traced as lease_expired).
//
// idx_claim matches the claim's ORDER BY exactly: equality columns, then
// priority DESC, message_id (which grows with age), with available_at
// covered for filtering, so EXPLAIN shows no filesort (see DESIGN §2).
const createMessageQueue = `CREATE TABLE IF NOT EXISTS message_queue (
  message_id BIGINT UNSIGNED NOT NULL,
  subscription VARBINARY(128) NOT NULL,
  topic VARBINARY(128) NOT NULL,
  vshard SMALLINT UNSIGNED NOT NULL,
  priority TINYINT UNSIGNED NOT NULL,
  order_key VARBINARY(256) NULL,
  available_at DATETIME(6) NOT NULL,
  attempts SMALLINT UNSIGNED NOT NULL DEFAULT 0,
  locked_by VARBINARY(128) NULL,
  claim_token BIGINT UNSIGNED NOT NULL DEFAULT 0,
  claimed_at DATETIME(6) NULL,
  is_dead TINYINT(1) NOT NULL DEFAULT 0,
  dead_at DATETIME(6) NULL,
  error_code VARBINARY(64) NULL,
  last_error VARBINARY(2048) NULL,
  PRIMARY KEY (message_id, subscription),
  KEY idx_claim (topic, subscription, is_dead, priority DESC, message_id, available_at)
) ENGINE=InnoDB`

// delivery is one message_queue row as the consume paths need it.
type delivery struct {
	messageID    uint64
	subscription string
	topic        string
	vshard       uint16
	priority     int
	orderKey     string
	availableAt  time.Time
	attempts     int
	lockedBy     string
	claimToken   uint64
	claimedAt    time.Time
	isDead       bool
}

func insertDeliveries(ctx context.Context, tx *sql.Tx, msgs []*Message, subs []string, at map[uint64]time.Time) error {
	args := make([]any, 0, len(msgs)*len(subs)*7)
	for _, m := range msgs {
		for _, s := range subs {
			args = append(args, m.ID, s, m.Topic, m.VShard, m.Priority, nullString(m.OrderKey), at[m.ID])
		}
	}
	_, err := tx.ExecContext(ctx, `INSERT INTO message_queue (message_id, subscription, topic, vshard, priority, order_key, available_at) VALUES `+
		placeholders(len(msgs)*len(subs), 7), args...)
	if err != nil {
		return fmt.Errorf("insert message_queue: %w", err)
	}
	return nil
}

// claimCandidates locks up to max ready deliveries (and expired leases) of a
// subscription, highest priority first, then oldest, skipping rows other
// claimers hold.
func claimCandidates(ctx context.Context, tx *sql.Tx, topic, sub string, now time.Time, max int) ([]delivery, error) {
	rows, err := tx.QueryContext(ctx, `SELECT message_id, vshard, attempts, COALESCE(locked_by, ''), claim_token
FROM message_queue FORCE INDEX (idx_claim)
WHERE topic = ? AND subscription = ? AND is_dead = 0 AND available_at <= ?
ORDER BY priority DESC, message_id
LIMIT ? FOR UPDATE SKIP LOCKED`, topic, sub, now, max)
	if err != nil {
		return nil, fmt.Errorf("select claimable message_queue: %w", err)
	}
	defer rows.Close()
	var out []delivery
	for rows.Next() {
		d := delivery{subscription: sub, topic: topic}
		if err := rows.Scan(&d.messageID, &d.vshard, &d.attempts, &d.lockedBy, &d.claimToken); err != nil {
			return nil, fmt.Errorf("select claimable message_queue: %w", err)
		}
		out = append(out, d)
	}
	return out, rows.Err()
}

// leaseDeliveries gives the rows to a consumer: a new attempt, a new claim
// token, and available_at moved to the lease's expiry.
func leaseDeliveries(ctx context.Context, tx *sql.Tx, sub string, ids []uint64, consumer string, token uint64, now, expires time.Time) error {
	args := []any{consumer, token, now, expires, sub}
	for _, id := range ids {
		args = append(args, id)
	}
	_, err := tx.ExecContext(ctx, `UPDATE message_queue SET attempts = attempts + 1, locked_by = ?, claim_token = ?, claimed_at = ?, available_at = ?
WHERE subscription = ? AND message_id IN (`+strings.TrimSuffix(strings.Repeat("?,", len(ids)), ",")+")", args...)
	if err != nil {
		return fmt.Errorf("lease message_queue: %w", err)
	}
	return nil
}

// lockDeliveries reads and locks deliveries of one subscription by message
// id; absent ids are simply not in the result.
func lockDeliveries(ctx context.Context, tx *sql.Tx, sub string, ids []uint64) (map[uint64]delivery, error) {
	args := []any{sub}
	for _, id := range ids {
		args = append(args, id)
	}
	rows, err := tx.QueryContext(ctx, `SELECT message_id, topic, vshard, attempts, COALESCE(locked_by, ''), claim_token, claimed_at, is_dead, available_at
FROM message_queue WHERE subscription = ? AND message_id IN (`+strings.TrimSuffix(strings.Repeat("?,", len(ids)), ",")+") FOR UPDATE", args...)
	if err != nil {
		return nil, fmt.Errorf("lock message_queue: %w", err)
	}
	defer rows.Close()
	out := make(map[uint64]delivery, len(ids))
	for rows.Next() {
		d := delivery{subscription: sub}
		var claimedAt sql.NullTime
		if err := rows.Scan(&d.messageID, &d.topic, &d.vshard, &d.attempts, &d.lockedBy, &d.claimToken, &claimedAt, &d.isDead, &d.availableAt); err != nil {
			return nil, fmt.Errorf("lock message_queue: %w", err)
		}
		d.claimedAt = claimedAt.Time
		out[d.messageID] = d
	}
	return out, rows.Err()
}

// deleteDeliveries removes acked deliveries; the caller holds their locks
// and checked their claim tokens, and the count must match.
func deleteDeliveries(ctx context.Context, tx *sql.Tx, sub string, ids []uint64) error {
	args := []any{sub}
	for _, id := range ids {
		args = append(args, id)
	}
	res, err := tx.ExecContext(ctx, "DELETE FROM message_queue WHERE subscription = ? AND message_id IN ("+
		strings.TrimSuffix(strings.Repeat("?,", len(ids)), ",")+")", args...)
	if err != nil {
		return fmt.Errorf("delete message_queue: %w", err)
	}
	if n, _ := res.RowsAffected(); n != int64(len(ids)) {
		return fmt.Errorf("delete message_queue: %d rows deleted, %d expected", n, len(ids))
	}
	return nil
}

// scheduleRetry releases a lease and makes the delivery available again at
// at, keeping the error for the trace and the dead-letter tools. The claim
// token in the WHERE makes a stale receipt change nothing.
func scheduleRetry(ctx context.Context, tx *sql.Tx, sub string, id, token uint64, at time.Time, code, msg string) (bool, error) {
	res, err := tx.ExecContext(ctx, `UPDATE message_queue SET available_at = ?, locked_by = NULL, claim_token = 0, error_code = ?, last_error = ?
WHERE subscription = ? AND message_id = ? AND claim_token = ?`, at, nullString(code), nullString(msg), sub, id, token)
	if err != nil {
		return false, fmt.Errorf("schedule retry in message_queue: %w", err)
	}
	n, _ := res.RowsAffected()
	return n == 1, nil
}

// killDelivery makes a delivery a dead letter. token is the lease it must
// still hold (0 when the lease already expired and the claim found it).
func killDelivery(ctx context.Context, tx *sql.Tx, sub string, id, token uint64, now time.Time, code, msg string) (bool, error) {
	res, err := tx.ExecContext(ctx, `UPDATE message_queue SET is_dead = 1, dead_at = ?, available_at = ?, locked_by = NULL, claim_token = 0,
  error_code = ?, last_error = ?
WHERE subscription = ? AND message_id = ? AND claim_token = ?`, now, now, nullString(code), nullString(msg), sub, id, token)
	if err != nil {
		return false, fmt.Errorf("dead-letter message_queue: %w", err)
	}
	n, _ := res.RowsAffected()
	return n == 1, nil
}

// extendLeases moves the expiry of leases the caller verified under lock.
func extendLeases(ctx context.Context, tx *sql.Tx, sub string, ids []uint64, expires time.Time) error {
	args := []any{expires, sub}
	for _, id := range ids {
		args = append(args, id)
	}
	_, err := tx.ExecContext(ctx, "UPDATE message_queue SET available_at = ? WHERE subscription = ? AND message_id IN ("+
		strings.TrimSuffix(strings.Repeat("?,", len(ids)), ",")+")", args...)
	if err != nil {
		return fmt.Errorf("extend message_queue: %w", err)
	}
	return nil
}
