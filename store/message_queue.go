package store

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/shardmq/shardmq/internal/idgen"
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
// covered for filtering, so EXPLAIN shows no filesort (see DESIGN §2). The
// dead-letter channel claims through the same index with is_dead = 1.
//
// Ordered subscriptions park (parked = 1) a delivery that a claim found
// behind an older live delivery of its order key, so that later claims do
// not scan it again; the ack or death of the key's head un-parks the next
// one. message_order finds a key's head (message_order.go, docs/consume.md);
// idx_order did until migration 23 dropped it.
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
  parked TINYINT(1) NOT NULL DEFAULT 0,
  dead_at DATETIME(6) NULL,
  error_code VARBINARY(64) NULL,
  last_error VARBINARY(2048) NULL,
  PRIMARY KEY (message_id, subscription),
  KEY idx_claim (topic, subscription, is_dead, parked, priority DESC, message_id, available_at),
  KEY idx_order (topic, subscription, order_key, is_dead, message_id)
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
	errorCode    string // read by the claim (the dead-letter channel shows it)
}

func insertDeliveriesSQL(args []any, msgs []*Message, subs []string, at map[uint64]time.Time) (string, []any) {
	args = slices.Grow(args, len(msgs)*len(subs)*7)
	for _, m := range msgs {
		for _, s := range subs {
			args = append(args, m.ID, s, m.Topic, m.VShard, m.Priority, nullString(m.OrderKey), at[m.ID])
		}
	}
	return `INSERT INTO message_queue (message_id, subscription, topic, vshard, priority, order_key, available_at) VALUES ` +
		placeholders(len(msgs)*len(subs), 7), args
}

// subscriptionIDs is the condition "these deliveries of one subscription"
// and args followed by its arguments.
func subscriptionIDs(args []any, sub string, ids []uint64) (string, []any) {
	return "subscription = ? AND message_id IN (" + inList(len(ids)) + ")", appendArgs(append(args, sub), ids)
}

func insertDeliveries(ctx context.Context, tx *sql.Tx, msgs []*Message, subs []string, at map[uint64]time.Time) error {
	q, args := insertDeliveriesSQL(nil, msgs, subs, at)
	_, err := tx.ExecContext(ctx, q, args...)
	if err != nil {
		return fmt.Errorf("insert message_queue: %w", err)
	}
	return insertOrderRows(ctx, tx, msgs, subs)
}

// claimCandidates locks up to max ready deliveries (and expired leases) of a
// subscription, highest priority first, then oldest, skipping rows other
// claimers hold.
// claimQuery is the claim's statement; byErrorCode adds the dead-letter
// channel's error_code filter.
func claimQuery(byErrorCode bool, exclude int) string {
	return claimableQuery(`SELECT message_id, vshard, attempts, COALESCE(locked_by, ''), claim_token, COALESCE(order_key, ''), COALESCE(error_code, '')`,
		byErrorCode, exclude) + " FOR UPDATE SKIP LOCKED"
}

// peekQuery is the claim's walk without its locks: where the deliveries a
// claim would take now stand in its order (priority, then id).
func peekQuery(byErrorCode bool, exclude int) string {
	return claimableQuery("SELECT priority, message_id", byErrorCode, exclude)
}

// claimableQuery is the claim's candidates in claim order under cols.
func claimableQuery(cols string, byErrorCode bool, exclude int) string {
	q := cols + `
FROM message_queue FORCE INDEX (idx_claim)
WHERE topic = ? AND subscription = ? AND is_dead = ? AND parked = 0 AND available_at <= ?`
	if byErrorCode {
		q += " AND error_code = ?"
	}
	if exclude > 0 {
		// Frozen vshards (resharding cut-over): their deliveries are
		// being copied to another cluster and must not change here.
		q += " AND vshard NOT IN (" + inList(exclude) + ")"
	}
	return q + "\nORDER BY priority DESC, message_id\nLIMIT ?"
}

// With dead set it claims dead letters instead (the dead-letter channel),
// optionally only those of one error code.
func claimCandidates(ctx context.Context, tx *sql.Tx, topic, sub string, now time.Time, max int, dead bool, errorCode string, exclude []uint16) ([]delivery, error) {
	args := []any{topic, sub, dead, now}
	if errorCode != "" {
		args = append(args, errorCode)
	}
	args = append(appendArgs(args, exclude), max)
	return queryRows(ctx, tx, "select claimable message_queue", claimQuery(errorCode != "", len(exclude)), args, func(rows *sql.Rows) (delivery, error) {
		d := delivery{subscription: sub, topic: topic, isDead: dead}
		err := rows.Scan(&d.messageID, &d.vshard, &d.attempts, &d.lockedBy, &d.claimToken, &d.orderKey, &d.errorCode)
		return d, err
	})
}

// ClaimHead is where one claimable delivery stands in the claim's order.
type ClaimHead struct {
	Priority  int
	MessageID uint64
}

// PeekClaimable reads, without locking anything, the claim order of up to
// max deliveries that a claim with these arguments would take now (rows
// leased by a live claim are not among them: their available_at is the
// lease's expiry). The router merges the answers of its clusters so that
// a claim spanning clusters takes the highest priority, then the oldest,
// of all of them; the claim itself decides, under its locks, what it gets.
func (s *Store) PeekClaimable(ctx context.Context, topic, sub string, now time.Time, max int, dead bool, errorCode string, exclude []uint16) ([]ClaimHead, error) {
	args := []any{topic, sub, dead, now}
	if errorCode != "" {
		args = append(args, errorCode)
	}
	args = append(appendArgs(args, exclude), max)
	out, err := queryRows(ctx, s.db, "peek claimable message_queue", peekQuery(errorCode != "", len(exclude)), args, func(rows *sql.Rows) (ClaimHead, error) {
		var h ClaimHead
		err := rows.Scan(&h.Priority, &h.MessageID)
		return h, err
	})
	return out, translate(err)
}

// claimedAtOf reads when the given deliveries' current leases were taken
// (the claim asks only for lapsed leases it is about to trace, which are
// rare: the claim's own statement stays on its covering index).
func claimedAtOf(ctx context.Context, tx *sql.Tx, sub string, ids []uint64) (map[uint64]time.Time, error) {
	where, args := subscriptionIDs(nil, sub, ids)
	out := make(map[uint64]time.Time, len(ids))
	err := queryEach(ctx, tx, "read claimed_at of lapsed leases", `SELECT message_id, claimed_at FROM message_queue WHERE `+where+` AND claimed_at IS NOT NULL`, args,
		func(rows *sql.Rows) error {
			var id uint64
			var at time.Time
			if err := rows.Scan(&id, &at); err != nil {
				return err
			}
			out[id] = at
			return nil
		})
	return out, err
}

// leaseDeliveries gives the rows to a consumer: a new attempt, a new claim
// token, and available_at moved to the lease's expiry.
// countAttempt is false on the dead-letter channel, whose leases are not
// attempts of the subscription's retry policy.
func leaseDeliveries(ctx context.Context, tx *sql.Tx, sub string, ids []uint64, consumer string, token uint64, now, expires time.Time, countAttempt bool) error {
	inc := 0
	if countAttempt {
		inc = 1
	}
	where, args := subscriptionIDs([]any{inc, consumer, token, now, expires}, sub, ids)
	_, err := tx.ExecContext(ctx, `UPDATE message_queue SET attempts = attempts + ?, locked_by = ?, claim_token = ?, claimed_at = ?, available_at = ?
WHERE `+where, args...)
	if err != nil {
		return fmt.Errorf("lease message_queue: %w", err)
	}
	return nil
}

// releaseDeliveries undoes leases that were never handed to a consumer:
// the claim token in the WHERE leaves a delivery leased since untouched.
func releaseDeliveries(ctx context.Context, tx *sql.Tx, sub string, token uint64, ids []uint64, countAttempt bool, now time.Time) (int64, error) {
	dec := 0
	if countAttempt {
		dec = 1
	}
	where, args := subscriptionIDs([]any{dec, dec, now}, sub, ids)
	res, err := tx.ExecContext(ctx, `UPDATE message_queue SET attempts = GREATEST(attempts, ?) - ?, locked_by = NULL, claim_token = 0, claimed_at = NULL,
  available_at = ?
WHERE `+where+" AND claim_token = ?", append(args, token)...)
	if err != nil {
		return 0, fmt.Errorf("release message_queue: %w", err)
	}
	n, _ := res.RowsAffected()
	return n, nil
}

// lockDeliveries reads and locks deliveries of one subscription by message
// id; absent ids are simply not in the result.
func lockDeliveries(ctx context.Context, tx *sql.Tx, sub string, ids []uint64) (map[uint64]delivery, error) {
	where, args := subscriptionIDs(nil, sub, ids)
	out, err := queryMap(ctx, tx, "lock message_queue", `SELECT message_id, topic, vshard, attempts, COALESCE(locked_by, ''), claim_token, claimed_at, is_dead, available_at,
  COALESCE(order_key, '')
FROM message_queue WHERE `+where+" FOR UPDATE", args, func(rows *sql.Rows) (uint64, delivery, error) {
		d := delivery{subscription: sub}
		var claimedAt sql.NullTime
		err := rows.Scan(&d.messageID, &d.topic, &d.vshard, &d.attempts, &d.lockedBy, &d.claimToken, &claimedAt, &d.isDead, &d.availableAt, &d.orderKey)
		d.claimedAt = claimedAt.Time
		return d.messageID, d, err
	})
	return out, err
}

// deleteDeliveries removes acked deliveries; the caller holds their locks
// and checked their claim tokens, and the count must match.
func deleteDeliveries(ctx context.Context, tx *sql.Tx, sub string, ids []uint64) error {
	// Order rows first: a head read locks the order row, then the
	// delivery; locking in the same order cannot deadlock with it.
	if err := deleteOrderRows(ctx, tx, sub, ids); err != nil {
		return err
	}
	where, args := subscriptionIDs(nil, sub, ids)
	res, err := tx.ExecContext(ctx, "DELETE FROM message_queue WHERE "+where, args...)
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
	where, args := subscriptionIDs([]any{expires}, sub, ids)
	_, err := tx.ExecContext(ctx, "UPDATE message_queue SET available_at = ? WHERE "+where, args...)
	if err != nil {
		return fmt.Errorf("extend message_queue: %w", err)
	}
	return nil
}

// orderHeads returns, for each order key, the id of its oldest live (not
// dead) delivery: the only one an ordered subscription may deliver. A plain
// read: a claim that parks a delivery behind a head that is being acked at
// that moment is un-parked by that ack, which waits for the claim's lock.
func (s *Store) orderHeads(ctx context.Context, tx *sql.Tx, topic, sub string, keys []string) (map[string]uint64, error) {
	return s.orderHeadsWith(ctx, tx, "select order heads", topic, sub, keys, false)
}

// parkDeliveries parks deliveries the caller holds locked.
func parkDeliveries(ctx context.Context, tx *sql.Tx, sub string, ids []uint64) error {
	where, args := subscriptionIDs(nil, sub, ids)
	_, err := tx.ExecContext(ctx, "UPDATE message_queue SET parked = 1 WHERE "+where, args...)
	if err != nil {
		return fmt.Errorf("park message_queue: %w", err)
	}
	return nil
}

// unparkAll releases every parked delivery of a subscription (it stopped
// being ordered), up to limit rows; it returns how many.
func unparkAll(ctx context.Context, tx *sql.Tx, topic, sub string, now time.Time, limit int) (int64, error) {
	return execCount(ctx, tx, "unpark message_queue",
		`UPDATE message_queue SET parked = 0, available_at = ? WHERE topic = ? AND subscription = ? AND is_dead = 0 AND parked = 1 LIMIT ?`,
		now, topic, sub, limit)
}

// DeadLetter is a dead delivery as the dead-letter tools list it.
type DeadLetter struct {
	MessageID    uint64
	VShard       uint16
	Subscription string
	Attempts     int
	ErrorCode    string
	LastError    string
	DeadAt       time.Time
	OrderKey     string
	InFlight     bool // leased on the dead-letter channel right now
	// Size is what the dead letter takes in a listing's answer (set by
	// ListDead; it counts against the listing's max_bytes).
	Size int
}

// listDead reads a subscription's dead letters newest first (by message
// id), those before cursor when it is not 0.
func listDead(ctx context.Context, q queryer, topic, sub, errorCode string, before uint64, limit int, now time.Time) ([]DeadLetter, error) {
	query := `SELECT message_id, vshard, attempts, COALESCE(error_code, ''), COALESCE(last_error, ''), COALESCE(dead_at, available_at),
  COALESCE(order_key, ''), claim_token <> 0 AND available_at > ?
FROM message_queue WHERE topic = ? AND subscription = ? AND is_dead = 1`
	args := []any{now, topic, sub}
	if errorCode != "" {
		query += " AND error_code = ?"
		args = append(args, errorCode)
	}
	if before != 0 {
		query += " AND message_id < ?"
		args = append(args, before)
	}
	query += " ORDER BY message_id DESC LIMIT ?"
	return queryRows(ctx, q, "list dead message_queue", query, append(args, limit), func(rows *sql.Rows) (DeadLetter, error) {
		d := DeadLetter{Subscription: sub}
		err := rows.Scan(&d.MessageID, &d.VShard, &d.Attempts, &d.ErrorCode, &d.LastError, &d.DeadAt, &d.OrderKey, &d.InFlight)
		return d, err
	})
}

// lockDead locks up to limit dead letters of a subscription (all, one
// error code, or the given ids). With freeAt set it skips those leased on
// the dead-letter channel at that time: a handler is working on them.
func lockDead(ctx context.Context, tx *sql.Tx, topic, sub, errorCode string, ids []uint64, limit int, freeAt time.Time) ([]delivery, error) {
	where, args := deadSelection(topic, sub, errorCode, ids, freeAt)
	query := "SELECT message_id, vshard, attempts, COALESCE(order_key, ''), COALESCE(error_code, '') FROM message_queue\nWHERE " + where +
		" ORDER BY message_id LIMIT ? FOR UPDATE"
	return queryRows(ctx, tx, "lock dead message_queue", query, append(args, limit), func(rows *sql.Rows) (delivery, error) {
		d := delivery{topic: topic, subscription: sub, isDead: true}
		var code string
		err := rows.Scan(&d.messageID, &d.vshard, &d.attempts, &d.orderKey, &code)
		return d, err
	})
}

// deadSelection is the condition "these dead letters of a subscription"
// (all, one error code, or the given ids; with freeAt set, not those
// leased on the dead-letter channel at that time) and its arguments.
func deadSelection(topic, sub, errorCode string, ids []uint64, freeAt time.Time) (string, []any) {
	where := "topic = ? AND subscription = ? AND is_dead = 1"
	args := []any{topic, sub}
	if !freeAt.IsZero() {
		where += " AND (claim_token = 0 OR available_at <= ?)"
		args = append(args, freeAt)
	}
	if errorCode != "" {
		where += " AND error_code = ?"
		args = append(args, errorCode)
	}
	if len(ids) > 0 {
		where += " AND message_id IN (" + inList(len(ids)) + ")"
		args = appendArgs(args, ids)
	}
	return where, args
}

// reviveDelivery makes a dead letter ready again with its attempts reset;
// parked when its ordered key has another live delivery.
func reviveDelivery(ctx context.Context, tx *sql.Tx, sub string, id uint64, parked bool, now time.Time) error {
	_, err := tx.ExecContext(ctx, `UPDATE message_queue SET is_dead = 0, dead_at = NULL, attempts = 0, available_at = ?, parked = ?,
  locked_by = NULL, claim_token = 0, error_code = NULL
WHERE subscription = ? AND message_id = ? AND is_dead = 1`, now, parked, sub, id)
	if err != nil {
		return fmt.Errorf("redrive message_queue: %w", err)
	}
	return nil
}

// deleteDeadBatch deletes up to limit dead letters of a subscription (one
// error code, the given ids, or all) and returns the message ids it
// deleted.
func deleteDeadBatch(ctx context.Context, tx *sql.Tx, topic, sub, errorCode string, only []uint64, limit int) ([]uint64, error) {
	ds, err := lockDead(ctx, tx, topic, sub, errorCode, only, limit, time.Time{})
	if err != nil || len(ds) == 0 {
		return nil, err
	}
	ids := make([]uint64, len(ds))
	for i, d := range ds {
		ids[i] = d.messageID
	}
	return ids, deleteDeliveries(ctx, tx, sub, ids)
}

// countDead counts a subscription's dead letters (an index range).
func countDead(ctx context.Context, q queryer, topic, sub string) (int64, error) {
	n, err := queryRows(ctx, q, "count dead message_queue", "SELECT COUNT(*) FROM message_queue WHERE topic = ? AND subscription = ? AND is_dead = 1",
		[]any{topic, sub}, scanOne[int64])
	if err != nil || len(n) == 0 {
		return 0, err
	}
	return n[0], nil
}

// countDeadByCode counts, by error code, the dead letters a redrive with
// the same selection would take (lockDead's conditions: not leased to a
// dead-letter handler at freeAt).
func countDeadByCode(ctx context.Context, q queryer, topic, sub, errorCode string, ids []uint64, freeAt time.Time) (map[string]int64, error) {
	where, args := deadSelection(topic, sub, errorCode, ids, freeAt)
	return queryMap(ctx, q, "count dead by code message_queue",
		"SELECT COALESCE(error_code, ''), COUNT(*) FROM message_queue\nWHERE "+where+" GROUP BY COALESCE(error_code, '')", args,
		func(rows *sql.Rows) (code string, n int64, err error) {
			err = rows.Scan(&code, &n)
			return code, n, err
		})
}

// droppedDelivery is a delivery of a deleted subscription, as its trace
// event records it.
type droppedDelivery struct {
	messageID uint64
	vshard    uint16
	attempts  int
	dead      bool
	leased    bool
}

// lockSubscriptionBatch locks up to limit deliveries of a subscription.
func lockSubscriptionBatch(ctx context.Context, tx *sql.Tx, topic, sub string, limit int) ([]droppedDelivery, error) {
	return queryRows(ctx, tx, "lock message_queue of a subscription",
		"SELECT message_id, vshard, attempts, is_dead, claim_token <> 0 FROM message_queue WHERE topic = ? AND subscription = ? LIMIT ? FOR UPDATE",
		[]any{topic, sub, limit}, func(rows *sql.Rows) (droppedDelivery, error) {
			var d droppedDelivery
			err := rows.Scan(&d.messageID, &d.vshard, &d.attempts, &d.dead, &d.leased)
			return d, err
		})
}

// lockStaleDead locks up to limit dead letters of a subscription that died
// before cutoff and are not leased on the dead-letter channel, with every
// column the archive keeps.
func lockStaleDead(ctx context.Context, tx *sql.Tx, topic, sub string, cutoff time.Time, limit int) ([]DeadLetter, error) {
	return queryRows(ctx, tx, "lock stale dead message_queue", `SELECT message_id, vshard, subscription, attempts, COALESCE(error_code, ''), COALESCE(last_error, ''), dead_at,
  COALESCE(order_key, '')
FROM message_queue WHERE topic = ? AND subscription = ? AND is_dead = 1 AND dead_at < ? AND claim_token = 0 LIMIT ? FOR UPDATE`,
		[]any{topic, sub, cutoff, limit}, func(rows *sql.Rows) (DeadLetter, error) {
			var d DeadLetter
			err := rows.Scan(&d.MessageID, &d.VShard, &d.Subscription, &d.Attempts, &d.ErrorCode, &d.LastError, &d.DeadAt, &d.OrderKey)
			return d, err
		})
}

// deliveryRow is a whole message_queue row, for the trace and
// reconciliation.
type deliveryRow struct {
	delivery
	lastError string
	deadAt    time.Time
}

const selectDeliveryRows = `SELECT message_id, subscription, topic, vshard, priority, COALESCE(order_key, ''), available_at, attempts,
  COALESCE(locked_by, ''), claim_token, claimed_at, is_dead, dead_at, COALESCE(error_code, ''), COALESCE(last_error, '')
FROM message_queue WHERE message_id IN (`

// deliveriesOf reads every subscription's delivery of messages ids; with
// lock, it locks them too (FOR UPDATE).
func deliveriesOf(ctx context.Context, q queryer, ids []uint64, lock bool) ([]deliveryRow, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	query := selectDeliveryRows + inList(len(ids)) + ") ORDER BY message_id, subscription"
	if lock {
		query += " FOR UPDATE"
	}
	return queryRows(ctx, q, "select message_queue by message", query, appendArgs(nil, ids), func(rows *sql.Rows) (deliveryRow, error) {
		var d deliveryRow
		var claimedAt, deadAt sql.NullTime
		err := rows.Scan(&d.messageID, &d.subscription, &d.topic, &d.vshard, &d.priority, &d.orderKey, &d.availableAt, &d.attempts,
			&d.lockedBy, &d.claimToken, &claimedAt, &d.isDead, &deadAt, &d.errorCode, &d.lastError)
		d.claimedAt, d.deadAt = claimedAt.Time, deadAt.Time
		return d, err
	})
}

// orphanDeliveries reads up to limit deliveries, after the cursor
// (message id, subscription), whose message is not in message_store.
func orphanDeliveries(ctx context.Context, q queryer, afterID uint64, afterSub string, vshards []uint16, limit int) ([]deliveryRow, error) {
	var b strings.Builder
	b.WriteString(`SELECT q.message_id, q.subscription, q.topic, q.vshard, q.attempts, q.is_dead FROM message_queue q
WHERE (q.message_id, q.subscription) > (?, ?)`)
	args := []any{afterID, afterSub}
	args = vshardIn(&b, args, "q.vshard", vshards)
	b.WriteString(" AND NOT EXISTS (SELECT 1 FROM message_store s WHERE s.id = q.message_id) ORDER BY q.message_id, q.subscription LIMIT ?")
	return queryRows(ctx, q, "select orphan message_queue rows", b.String(), append(args, limit), func(rows *sql.Rows) (deliveryRow, error) {
		var d deliveryRow
		err := rows.Scan(&d.messageID, &d.subscription, &d.topic, &d.vshard, &d.attempts, &d.isDead)
		return d, err
	})
}

// restoreDeliveries re-creates lost deliveries as ready now, first attempt;
// a delivery that exists meanwhile is left as it is.
func restoreDeliveries(ctx context.Context, tx *sql.Tx, ds []delivery, now time.Time) (int64, error) {
	args := make([]any, 0, len(ds)*7)
	for _, d := range ds {
		args = append(args, d.messageID, d.subscription, d.topic, d.vshard, d.priority, nullString(d.orderKey), now)
	}
	res, err := tx.ExecContext(ctx, `INSERT IGNORE INTO message_queue (message_id, subscription, topic, vshard, priority, order_key, available_at) VALUES `+
		placeholders(len(ds), 7), args...)
	if err != nil {
		return 0, fmt.Errorf("restore message_queue rows: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, err
	}
	return n, restoreOrderRows(ctx, tx, ds)
}

// QueueStats counts one subscription's deliveries on one cluster by state.
type QueueStats struct {
	Topic, Subscription string
	Ready               int64 // claimable now
	Delayed             int64 // waiting for a delay or a retry's backoff
	InFlight            int64 // leased, lease not expired
	Parked              int64 // ordered: waiting behind their key's head
	Dead                int64
	// OldestReady is the smallest message id among the ready deliveries
	// (ids grow with their produce time: idgen.Time gives it), 0 when
	// none is ready.
	OldestReady uint64
}

// queueStatsQuery takes now four times.
const queueStatsQuery = `SELECT topic, subscription,
  SUM(is_dead = 0 AND parked = 0 AND available_at <= ?),
  SUM(is_dead = 0 AND parked = 0 AND available_at > ? AND claim_token = 0),
  SUM(is_dead = 0 AND parked = 0 AND available_at > ? AND claim_token <> 0),
  SUM(is_dead = 0 AND parked = 1),
  SUM(is_dead = 1),
  MIN(IF(is_dead = 0 AND parked = 0 AND available_at <= ?, message_id, NULL))
FROM message_queue FORCE INDEX (PRIMARY) GROUP BY topic, subscription`

// queueStats counts every subscription's deliveries. It reads the whole
// table (live deliveries only: acked ones have left it) in one pass: an
// operator's question and the queue-health metrics' periodic refresh, not
// a hot path. The pass reads the rows in their own order, grouping them in
// a temporary table of one row per subscription: left to itself the
// optimizer walked idx_order for the grouping order and looked every
// delivery up in the table from there, 1.5 times the work (676,100
// deliveries: 0.83–1.18 s against 0.55–0.60 s, 2 Dec 2026).
// It names the primary key, there whatever secondary indexes the table has
// (idx_order is dropped by migration 23). TestQueueStatsCountsAndOldestReady
// holds the plan.
func queueStats(ctx context.Context, q queryer, now time.Time) ([]QueueStats, error) {
	return queryRows(ctx, q, "count message_queue", queueStatsQuery, []any{now, now, now, now}, func(rows *sql.Rows) (QueueStats, error) {
		var s QueueStats
		var oldest sql.Null[uint64]
		err := rows.Scan(&s.Topic, &s.Subscription, &s.Ready, &s.Delayed, &s.InFlight, &s.Parked, &s.Dead, &oldest)
		s.OldestReady = oldest.V
		return s, err
	})
}

// messageQueueMove moves deliveries, leases included (claim tokens and
// all), with their vshard (see move.go). Only while the vshards are frozen:
// a delivery on the target before the flip could be claimed there.
var messageQueueMove = moveTable{
	name: "message_queue",
	cols: []string{"message_id", "subscription", "topic", "vshard", "priority", "order_key", "available_at", "attempts",
		"locked_by", "claim_token", "claimed_at", "is_dead", "parked", "dead_at", "error_code", "last_error"},
	pk:         []string{"message_id", "subscription"},
	idCol:      "message_id",
	frozenOnly: true,
}

// LiveDeliveriesBefore counts (up to 1000) deliveries still in
// message_queue — ready, in flight or dead letters not yet archived — of
// messages created before t: the retention keeps such months hot. The
// primary key starts with message_id, whose ids start with their time.
func (s *Store) LiveDeliveriesBefore(ctx context.Context, t time.Time) (int64, error) {
	var n int64
	err := s.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM (SELECT 1 FROM message_queue WHERE message_id < ? LIMIT 1000) live",
		idgen.Floor(t)).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count live deliveries: %w", translate(err))
	}
	return n, nil
}

// LeaseHolder is one consumer's share of a subscription's leased
// deliveries on one cluster.
type LeaseHolder struct {
	Consumer      string // the claim's consumer name; "" when it gave none
	InFlight      int64
	OldestLeaseAt time.Time // when the oldest of its leases was taken
}

// leaseHolders counts a subscription's deliveries in flight at now (leased,
// lease not expired, not dead) by the consumer that holds them, most
// first, at most limit consumers. It walks idx_claim's range of the
// subscription's live deliveries: an operator's question, not a hot path.
func leaseHolders(ctx context.Context, q queryer, topic, sub string, now time.Time, limit int) ([]LeaseHolder, error) {
	return queryRows(ctx, q, "count message_queue lease holders", `SELECT COALESCE(locked_by, ''), COUNT(*), MIN(claimed_at)
FROM message_queue FORCE INDEX (idx_claim)
WHERE topic = ? AND subscription = ? AND is_dead = 0 AND parked = 0 AND claim_token <> 0 AND available_at > ?
GROUP BY COALESCE(locked_by, '') ORDER BY COUNT(*) DESC, COALESCE(locked_by, '') LIMIT ?`, []any{topic, sub, now, limit},
		func(rows *sql.Rows) (LeaseHolder, error) {
			var h LeaseHolder
			var at sql.NullTime
			err := rows.Scan(&h.Consumer, &h.InFlight, &at)
			h.OldestLeaseAt = at.Time
			return h, err
		})
}

// Statements of the owned consume path (owned.go): the owner of a unit
// reads claimable deliveries without locks, holds first-attempt leases in
// its memory, and writes their outcomes in epoch-fenced flushes.

// ClaimCursor is a position in the claim order (priority DESC, id): a
// scan after it reads what follows.
type ClaimCursor struct {
	Priority  int
	MessageID uint64
}

// Candidate is a claimable delivery as the owner's scan reads it: what
// the owner decides on, and no more (each column read costs the router
// a conversion per row; a DATETIME's is the dearest).
type Candidate struct {
	MessageID  uint64
	VShard     uint16
	Priority   int
	OrderKey   string
	Attempts   int
	ClaimToken uint64
}

// Fresh says the delivery was never handed out (or handed out only from
// an owner's memory, which the table does not know): its next claim is
// its first attempt, and may be held in memory.
func (c Candidate) Fresh() bool { return c.Attempts == 0 && c.ClaimToken == 0 }

// claimableCols are the columns of a Candidate, in its Scan order.
const claimableCols = `SELECT message_id, vshard, priority, attempts, claim_token, COALESCE(order_key, '')`

// scanClaimableQuery reads a subscription's claimable deliveries in claim
// order, after a cursor when after is set, on idx_claim's range.
func scanClaimableQuery(after bool, exclude int) string {
	return claimOrderQuery(claimableCols, after, exclude)
}

// claimOrderQuery selects cols of a subscription's claimable deliveries in
// claim order, after a cursor when after is set, on idx_claim's range.
func claimOrderQuery(cols string, after bool, exclude int) string {
	q := cols + `
FROM message_queue FORCE INDEX (idx_claim)
WHERE topic = ? AND subscription = ? AND is_dead = 0 AND parked = 0 AND available_at <= ?`
	if after {
		q += " AND (priority < ? OR (priority = ? AND message_id > ?))"
	}
	if exclude > 0 {
		q += " AND vshard NOT IN (" + inList(exclude) + ")"
	}
	return q + "\nORDER BY priority DESC, message_id\nLIMIT ?"
}

// ScanClaimable reads, without locking anything, up to limit deliveries of
// a subscription that are claimable at now, in claim order (priority, then
// age), after cursor when it is not nil, leaving out the vshards in
// exclude (frozen for a resharding cut-over).
func (s *Store) ScanClaimable(ctx context.Context, topic, sub string, now time.Time, after *ClaimCursor, limit int, exclude []uint16) ([]Candidate, error) {
	args := []any{topic, sub, now}
	if after != nil {
		args = append(args, after.Priority, after.Priority, after.MessageID)
	}
	args = append(appendArgs(args, exclude), limit)
	out, err := queryRows(ctx, s.db, "scan claimable message_queue", scanClaimableQuery(after != nil, len(exclude)), args, scanCandidate)
	return out, translate(err)
}

// scanCandidate reads a row of claimableCols.
func scanCandidate(rows *sql.Rows) (Candidate, error) {
	var c Candidate
	err := rows.Scan(&c.MessageID, &c.VShard, &c.Priority, &c.Attempts, &c.ClaimToken, &c.OrderKey)
	return c, err
}

// Scan is what ScanClaimableSkipping read: the deliveries it read whole,
// how many positions it walked and the last of them.
type Scan struct {
	Candidates []Candidate
	Read       int
	Last       *ClaimCursor
}

// ScanClaimableSkipping is ScanClaimable for a reader that already holds
// many of the deliveries it will walk past (an owner's leases in memory,
// which the table still shows as claimable): it walks the claim order on
// idx_claim alone (priority and id are in the index, so no row is read)
// and reads whole rows only for the ids not in skip. A scan from the head
// of a unit whose consumers keep up walks every lease in flight; reading
// their rows made each such row cost a lookup in the table's primary key.
// A delivery that changed between the two reads is left out.
func (s *Store) ScanClaimableSkipping(ctx context.Context, topic, sub string, now time.Time, after *ClaimCursor, limit int, exclude []uint16, skip map[uint64]bool) (Scan, error) {
	args := []any{topic, sub, now}
	if after != nil {
		args = append(args, after.Priority, after.Priority, after.MessageID)
	}
	args = append(appendArgs(args, exclude), limit)
	pos, err := queryRows(ctx, s.db, "scan claimable positions in message_queue", claimPositionsQuery(after != nil, len(exclude)), args,
		func(rows *sql.Rows) (ClaimCursor, error) {
			var c ClaimCursor
			err := rows.Scan(&c.Priority, &c.MessageID)
			return c, err
		})
	if err != nil {
		return Scan{}, translate(err)
	}
	out := Scan{Read: len(pos)}
	if len(pos) == 0 {
		return out, nil
	}
	out.Last = &pos[len(pos)-1]
	var ids []uint64
	for _, p := range pos {
		if !skip[p.MessageID] {
			ids = append(ids, p.MessageID)
		}
	}
	if len(ids) == 0 {
		return out, nil
	}
	args = append([]any{sub}, appendArgs(nil, ids)...)
	args = appendArgs(append(args, topic, now), exclude)
	byID, err := queryMap(ctx, s.db, "read claimable message_queue by id", claimableByIDQuery(len(ids), len(exclude)), args,
		func(rows *sql.Rows) (uint64, Candidate, error) {
			c, err := scanCandidate(rows)
			return c.MessageID, c, err
		})
	if err != nil {
		return Scan{}, translate(err)
	}
	for _, id := range ids {
		if c, ok := byID[id]; ok {
			out.Candidates = append(out.Candidates, c)
		}
	}
	return out, nil
}

// ScanOf is the Scan of rows read whole in claim order, leaving out those
// in skip: what ScanClaimableSkipping answers when the same rows are
// claimable (for a reader that read them whole, and for fakes).
func ScanOf(rows []Candidate, skip map[uint64]bool) Scan {
	out := Scan{Read: len(rows)}
	if len(rows) == 0 {
		return out
	}
	out.Last = &ClaimCursor{Priority: rows[len(rows)-1].Priority, MessageID: rows[len(rows)-1].MessageID}
	if len(skip) == 0 {
		out.Candidates = rows
		return out
	}
	for _, c := range rows {
		if !skip[c.MessageID] {
			out.Candidates = append(out.Candidates, c)
		}
	}
	return out
}

// claimPositionsQuery is scanClaimableQuery reading positions only, from
// the index.
func claimPositionsQuery(after bool, exclude int) string {
	return claimOrderQuery("SELECT priority, message_id", after, exclude)
}

// claimableByIDQuery reads the deliveries of one subscription among ids
// that are claimable at a time, by primary key.
func claimableByIDQuery(ids, exclude int) string {
	q := claimableCols + `
FROM message_queue
WHERE subscription = ? AND message_id IN (` + inList(ids) + `) AND topic = ? AND is_dead = 0 AND parked = 0 AND available_at <= ?`
	if exclude > 0 {
		q += " AND vshard NOT IN (" + inList(exclude) + ")"
	}
	return q
}

// OrderHeads answers, for each order key, the id of its oldest live
// delivery on a subscription (the only one an ordered subscription may
// hand out), without locks.
func (s *Store) OrderHeads(ctx context.Context, topic, sub string, keys []string) (map[string]uint64, error) {
	if len(keys) == 0 {
		return map[string]uint64{}, nil
	}
	out, err := s.orderHeadsWith(ctx, s.db, "select order heads", topic, sub, keys, false)
	return out, translate(err)
}

func scanHead(rows *sql.Rows) (string, uint64, error) {
	var k string
	var id uint64
	err := rows.Scan(&k, &id)
	return k, id, err
}

// lockOrderHeads is orderHeads with a shared lock on each head, so that a
// head deleted at the same time by another transaction is waited for.
func (s *Store) lockOrderHeads(ctx context.Context, tx *sql.Tx, topic, sub string, keys []string) (map[string]uint64, error) {
	return s.orderHeadsWith(ctx, tx, "lock order heads", topic, sub, keys, true)
}

// lockLive locks those of ids that are live (not dead) deliveries of a
// subscription and answers which.
func lockLive(ctx context.Context, tx *sql.Tx, sub string, ids []uint64) (map[uint64]bool, error) {
	where, args := subscriptionIDs(nil, sub, ids)
	return queryMap(ctx, tx, "lock live message_queue", "SELECT message_id, 1 FROM message_queue WHERE "+where+" AND is_dead = 0 FOR UPDATE", args,
		func(rows *sql.Rows) (uint64, bool, error) {
			var id uint64
			var one int
			err := rows.Scan(&id, &one)
			return id, true, err
		})
}

// withDeliveries answers which of the messages ids still have a delivery
// (of any subscription, live or dead), read with a shared lock: a delete
// of another subscription's delivery of the same message by a transaction
// still running is waited for, so that of two final acks committing at
// once one sees the other's (or they deadlock and one runs again).
func withDeliveries(ctx context.Context, tx *sql.Tx, ids []uint64) (map[uint64]bool, error) {
	args := appendArgs(make([]any, 0, len(ids)), ids)
	return queryMap(ctx, tx, "lock remaining message_queue", withDeliveriesSQL(len(ids)), args,
		func(rows *sql.Rows) (uint64, bool, error) {
			var id uint64
			var one int
			err := rows.Scan(&id, &one)
			return id, true, err
		})
}

// withDeliveriesSQL is withDeliveries' statement for n ids.
func withDeliveriesSQL(n int) string {
	return "SELECT DISTINCT message_id, 1 FROM message_queue WHERE message_id IN (" + inList(n) + ") LOCK IN SHARE MODE"
}

// withDeliveriesCountedSQL is withDeliveries for a multi-statement that
// has no round trip to spare (the fast ack flush, owned_fast.go): its
// first row is (ROW_COUNT(), 0) — how many rows the statement before it
// changed, the flush's deletes — and the others (message_id, 1), the same
// rows with the same locks as withDeliveries'.
func withDeliveriesCountedSQL(args []any, ids []uint64) (string, []any) {
	return "(SELECT ROW_COUNT(), 0) UNION ALL (" + withDeliveriesSQL(len(ids)) + ")", appendArgs(args, ids)
}

// deleteOwned deletes acked deliveries of a subscription and answers how
// many were there.
func deleteOwned(ctx context.Context, tx *sql.Tx, sub string, ids []uint64) (int64, error) {
	where, args := subscriptionIDs(nil, sub, ids)
	return execCount(ctx, tx, "delete acked message_queue", "DELETE FROM message_queue WHERE "+where, args...)
}

// deleteOwnedManySQL is deleteOwned for the acks of several subscriptions
// (ids[i] of subs[i]) in one statement; with one subscription it is
// deleteOwned's. The rows deleted are the union of what deleteOwned would
// delete for each, so its count is the sum of theirs.
func deleteOwnedManySQL(args []any, subs []string, ids [][]uint64) (string, []any) {
	return deleteManySQL("message_queue", args, subs, ids)
}

// deleteManySQL deletes from table (keyed by subscription and message id)
// the rows of ids[i] of subs[i], in one statement.
func deleteManySQL(table string, args []any, subs []string, ids [][]uint64) (string, []any) {
	var b strings.Builder
	b.WriteString("DELETE FROM " + table + " WHERE ")
	for i, sub := range subs {
		if i > 0 {
			b.WriteString(" OR ")
		}
		var where string
		where, args = subscriptionIDs(args, sub, ids[i])
		b.WriteString("(" + where + ")")
	}
	return b.String(), args
}

// retryOwned records a failed attempt held in an owner's memory and makes
// the delivery claimable again at at (a retry: its next claim is durable).
func retryOwned(ctx context.Context, tx *sql.Tx, sub string, id uint64, attempt int, at time.Time, code, msg string) (bool, error) {
	n, err := execCount(ctx, tx, "schedule retry in message_queue", `UPDATE message_queue SET attempts = GREATEST(attempts, ?), available_at = ?,
  locked_by = NULL, claim_token = 0, claimed_at = NULL, error_code = ?, last_error = ?
WHERE subscription = ? AND message_id = ? AND is_dead = 0`, attempt, at, nullString(code), nullString(msg), sub, id)
	return n == 1, err
}

// killOwned makes a delivery held in an owner's memory a dead letter.
func killOwned(ctx context.Context, tx *sql.Tx, sub string, id uint64, attempt int, now time.Time, code, msg string) (bool, error) {
	n, err := execCount(ctx, tx, "dead-letter message_queue", `UPDATE message_queue SET attempts = GREATEST(attempts, ?), is_dead = 1, dead_at = ?,
  available_at = ?, locked_by = NULL, claim_token = 0, claimed_at = NULL, error_code = ?, last_error = ?
WHERE subscription = ? AND message_id = ? AND is_dead = 0`, attempt, now, now, nullString(code), nullString(msg), sub, id)
	return n == 1, err
}

// materializeOwned writes a lease an owner held in memory into the table
// as a durable lease (its token, consumer, claim time, attempt, and
// available_at at its expiry), so that it fences itself from then on: an
// owner handing the unit over, a cut-over moving the vshard, or a lease
// that lapsed (the next claim traces it lease_expired, as any lapsed
// durable lease).
func materializeOwned(ctx context.Context, tx *sql.Tx, sub string, l OwnedLease) (bool, error) {
	n, err := execCount(ctx, tx, "write lease to message_queue", `UPDATE message_queue SET attempts = GREATEST(attempts, ?), locked_by = ?, claim_token = ?,
  claimed_at = ?, available_at = ?
WHERE subscription = ? AND message_id = ? AND is_dead = 0`, l.Attempt, nullString(l.Consumer), l.Token, l.ClaimedAt, l.Expires, sub, l.MessageID)
	return n == 1, err
}

// materializeLeasesChunk is how many leases one statement of
// materializeOwnedAll writes.
const materializeLeasesChunk = 500

// materializeOwnedAll writes ls as materializeOwned does, answering for
// each whether its delivery was there to take it, in two statements per
// chunk instead of one per lease: a hand-over writes out every lease its
// owner holds, thousands at times, and one round trip each made it
// outlast its deadline on a loaded machine (docs/performance.md, "2 Dec
// (late)"). It locks the live deliveries of the chunk, then updates them
// from a derived table of the leases' values.
func materializeOwnedAll(ctx context.Context, tx *sql.Tx, sub string, ls []OwnedLease) ([]bool, error) {
	out := make([]bool, len(ls))
	for start := 0; start < len(ls); start += materializeLeasesChunk {
		chunk := ls[start:min(start+materializeLeasesChunk, len(ls))]
		if len(chunk) == 1 {
			ok, err := materializeOwned(ctx, tx, sub, chunk[0])
			if err != nil {
				return nil, err
			}
			out[start] = ok
			continue
		}
		ids := make([]uint64, len(chunk))
		for i, l := range chunk {
			ids[i] = l.MessageID
		}
		live, err := lockLive(ctx, tx, sub, ids)
		if err != nil {
			return nil, err
		}
		var b strings.Builder
		b.WriteString("UPDATE message_queue q JOIN (")
		args := make([]any, 0, 6*len(chunk)+1)
		for i, l := range chunk {
			if i == 0 {
				b.WriteString("SELECT ? AS message_id, ? AS attempt, ? AS locked_by, ? AS claim_token, ? AS claimed_at, ? AS available_at")
			} else {
				b.WriteString(" UNION ALL SELECT ?, ?, ?, ?, ?, ?")
			}
			args = append(args, l.MessageID, l.Attempt, nullString(l.Consumer), l.Token, l.ClaimedAt, l.Expires)
		}
		b.WriteString(`) v ON q.message_id = v.message_id
SET q.attempts = GREATEST(q.attempts, v.attempt), q.locked_by = v.locked_by, q.claim_token = v.claim_token,
  q.claimed_at = v.claimed_at, q.available_at = v.available_at
WHERE q.subscription = ? AND q.is_dead = 0`)
		if _, err := tx.ExecContext(ctx, b.String(), append(args, sub)...); err != nil {
			return nil, fmt.Errorf("write leases to message_queue: %w", err)
		}
		for i, l := range chunk {
			out[start+i] = live[l.MessageID]
		}
	}
	return out, nil
}

// lockClaimable locks those of ids that are still claimable deliveries of
// a subscription at now (live, not parked, available), for a durable
// claim of them.
func lockClaimable(ctx context.Context, tx *sql.Tx, topic, sub string, ids []uint64, now time.Time) ([]delivery, error) {
	where, args := subscriptionIDs(nil, sub, ids)
	return queryRows(ctx, tx, "lock claimable message_queue", `SELECT message_id, vshard, attempts, COALESCE(locked_by, ''), claim_token,
  COALESCE(order_key, ''), COALESCE(error_code, '')
FROM message_queue WHERE `+where+` AND topic = ? AND is_dead = 0 AND parked = 0 AND available_at <= ? ORDER BY priority DESC, message_id FOR UPDATE`,
		append(args, topic, now), func(rows *sql.Rows) (delivery, error) {
			d := delivery{subscription: sub, topic: topic}
			err := rows.Scan(&d.messageID, &d.vshard, &d.attempts, &d.lockedBy, &d.claimToken, &d.orderKey, &d.errorCode)
			return d, err
		})
}
