package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
)

// message_order finds the head of an order key: the oldest live delivery
// of (topic, subscription, order key), the only one an ordered
// subscription may hand out. It holds one row per delivery that has an
// order key, written in the transaction that writes the delivery and
// deleted with it; a delivery without an order key (most of them) has
// none.
//
// It replaced message_queue's idx_order (topic, subscription, order_key,
// is_dead, message_id), which held an entry for every delivery, order key
// or not. Measured on the sandbox (docs/performance.md, "2 Dec (night,
// late)"): dropping it took 5–10 µs of the servers' CPU off a consumed
// message (a tenth more drained per second) and about a twentieth off a
// produced one.
//
// Reads join each row to its delivery and keep the live ones (is_dead = 0),
// so a row whose delivery went away by a path that does not delete order
// rows cannot make a wrong head; it only costs the lookups that walk past
// it. Every path that deletes deliveries deletes their rows too
// (deleteDeliveries, the owners' general flush, resharding's cleanup).
//
// Upgrade (migration 23): the table is created and filled from the
// deliveries that have an order key; idx_order is dropped at once when no
// router older than OrderTableSince was seen lately (as a member or by
// its heartbeats, which carry their schema version since migration 22),
// else later, by the first membership beat or router start that finds
// none (dropOrderIndex). Until then heads are read through idx_order,
// since an older router writes no order rows.
const createMessageOrder = `CREATE TABLE IF NOT EXISTS message_order (
  message_id BIGINT UNSIGNED NOT NULL,
  subscription VARBINARY(128) NOT NULL,
  topic VARBINARY(128) NOT NULL,
  order_key VARBINARY(256) NOT NULL,
  vshard SMALLINT UNSIGNED NOT NULL,
  PRIMARY KEY (message_id, subscription),
  KEY idx_head (topic, subscription, order_key, message_id)
) ENGINE=InnoDB`

// OrderTableSince is the migration since which routers write message_order
// rows; idx_order is dropped only once no live router is older.
const OrderTableSince = 23

// fillMessageOrder writes the order rows of deliveries that have an order
// key and none yet (the migration, and again just before idx_order is
// dropped, for what older routers produced meanwhile). The anti-join
// reads without locks and inserts only what is missing (an INSERT IGNORE
// over rows that exist would lock every one of them until it ends); IGNORE
// covers a row a producer writes meanwhile.
const fillMessageOrder = `INSERT IGNORE INTO message_order (message_id, subscription, topic, order_key, vshard)
SELECT q.message_id, q.subscription, q.topic, q.order_key, q.vshard FROM message_queue q
LEFT JOIN message_order o ON o.message_id = q.message_id AND o.subscription = q.subscription
WHERE q.order_key IS NOT NULL AND o.message_id IS NULL`

// messageOrderMove moves order rows with their vshards (see move.go). Not
// only under the freeze: an order row does nothing without its delivery,
// which moves under the freeze, when every table is synced again; and
// the source's rows then go with its other tables' at the cleanup.
var messageOrderMove = moveTable{
	name:  "message_order",
	cols:  []string{"message_id", "subscription", "topic", "order_key", "vshard"},
	pk:    []string{"message_id", "subscription"},
	idCol: "message_id",
}

// insertOrderRowsSQL is the insert of the order rows of msgs' deliveries
// to subs, its arguments appended to args; ok is false when none of msgs
// has an order key (no statement).
func insertOrderRowsSQL(args []any, msgs []*Message, subs []string) (string, []any, bool) {
	n := 0
	for _, m := range msgs {
		if m.OrderKey != "" {
			for _, s := range subs {
				args = append(args, m.ID, s, m.Topic, m.OrderKey, m.VShard)
				n++
			}
		}
	}
	if n == 0 {
		return "", args, false
	}
	return "INSERT INTO " + orderRowsInto + placeholders(n, 5), args, true
}

// orderRowsInto is the table and columns of an insert of order rows, in
// the order insertOrderRowsSQL and restoreOrderRows give their values.
const orderRowsInto = "message_order (message_id, subscription, topic, order_key, vshard) VALUES "

// insertOrderRows writes the order rows of msgs' deliveries to subs.
func insertOrderRows(ctx context.Context, tx *sql.Tx, msgs []*Message, subs []string) error {
	q, args, ok := insertOrderRowsSQL(nil, msgs, subs)
	if !ok {
		return nil
	}
	if _, err := tx.ExecContext(ctx, q, args...); err != nil {
		return fmt.Errorf("insert message_order: %w", err)
	}
	return nil
}

// restoreOrderRows writes the order rows of re-created deliveries that
// have an order key; a row that exists is left as it is.
func restoreOrderRows(ctx context.Context, tx *sql.Tx, ds []delivery) error {
	var args []any
	n := 0
	for _, d := range ds {
		if d.orderKey != "" {
			args = append(args, d.messageID, d.subscription, d.topic, d.orderKey, d.vshard)
			n++
		}
	}
	if n == 0 {
		return nil
	}
	if _, err := tx.ExecContext(ctx, "INSERT IGNORE INTO "+orderRowsInto+placeholders(n, 5), args...); err != nil {
		return fmt.Errorf("restore message_order rows: %w", err)
	}
	return nil
}

// deleteOrderRows deletes the order rows of deliveries of one subscription
// (those that have none are not there to delete).
func deleteOrderRows(ctx context.Context, tx *sql.Tx, sub string, ids []uint64) error {
	where, args := subscriptionIDs(nil, sub, ids)
	if _, err := tx.ExecContext(ctx, "DELETE FROM message_order WHERE "+where, args...); err != nil {
		return fmt.Errorf("delete message_order: %w", err)
	}
	return nil
}

// deleteOrderRowsManySQL is deleteOrderRows for several subscriptions'
// acks (ids[i] of subs[i]) in one statement (the fast ack flush).
func deleteOrderRowsManySQL(args []any, subs []string, ids [][]uint64) (string, []any) {
	return deleteManySQL("message_order", args, subs, ids)
}

// orderHeadFrom is the FROM and WHERE of a key's head by message_order:
// its rows in id order, each joined to its delivery, live ones only. The
// join is written in that order so that the index range gives the order
// and LIMIT 1 stops at the first live one.
const orderHeadFrom = `FROM message_order o FORCE INDEX (idx_head) STRAIGHT_JOIN message_queue q ON q.message_id = o.message_id AND q.subscription = o.subscription
WHERE o.topic = ? AND o.subscription = ? AND o.order_key = ? AND q.is_dead = 0`

// orderHeadsQuery reads each key's head with one index dive per key (a
// UNION ALL of LIMIT 1 lookups): a GROUP BY with MIN over an IN list reads
// every live delivery of the keys instead. lock adds a shared lock on
// each head. byTable reads message_order, else idx_order.
func orderHeadsQuery(keys int, byTable, lock bool) string {
	one := `(SELECT order_key, message_id FROM message_queue FORCE INDEX (idx_order)
WHERE topic = ? AND subscription = ? AND order_key = ? AND is_dead = 0 ORDER BY message_id LIMIT 1`
	if byTable {
		one = "(SELECT o.order_key, o.message_id " + orderHeadFrom + " ORDER BY o.message_id LIMIT 1"
	}
	if lock {
		one += " LOCK IN SHARE MODE"
	}
	one += ")"
	parts := make([]string, keys)
	for i := range parts {
		parts[i] = one
	}
	return strings.Join(parts, "\nUNION ALL\n")
}

// orderHeadsWith answers each key's head, reading through idx_order until
// it is dropped (another router may drop it at any moment: the error of a
// missing index switches this Store to message_order and reads again).
func (s *Store) orderHeadsWith(ctx context.Context, q queryer, what, topic, sub string, keys []string, lock bool) (map[string]uint64, error) {
	args := make([]any, 0, 3*len(keys))
	for _, k := range keys {
		args = append(args, topic, sub, k)
	}
	for {
		byTable := s.orderTable.Load()
		out, err := queryMap(ctx, q, what, orderHeadsQuery(len(keys), byTable, lock), args, scanHead)
		if !byTable && s.orderIndexGone(err) {
			continue
		}
		return out, err
	}
}

// unparkHead makes the oldest live delivery of an order key claimable now
// if it is parked (its predecessor was acked or died). The SET order
// matters: available_at reads parked before it is cleared. Through
// message_order the head is read and locked first, then updated by its
// key.
func (s *Store) unparkHead(ctx context.Context, tx *sql.Tx, topic, sub, orderKey string, now time.Time) error {
	for {
		if !s.orderTable.Load() {
			_, err := tx.ExecContext(ctx, `UPDATE message_queue FORCE INDEX (idx_order) SET available_at = IF(parked = 1, ?, available_at), parked = 0
WHERE topic = ? AND subscription = ? AND order_key = ? AND is_dead = 0 ORDER BY message_id LIMIT 1`, now, topic, sub, orderKey)
			if s.orderIndexGone(err) {
				continue
			}
			if err != nil {
				return fmt.Errorf("unpark message_queue: %w", err)
			}
			return nil
		}
		var id uint64
		err := tx.QueryRowContext(ctx, "SELECT o.message_id "+orderHeadFrom+" ORDER BY o.message_id LIMIT 1 FOR UPDATE", topic, sub, orderKey).Scan(&id)
		if errors.Is(err, sql.ErrNoRows) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("lock order head in message_order: %w", err)
		}
		if _, err := tx.ExecContext(ctx, `UPDATE message_queue SET available_at = IF(parked = 1, ?, available_at), parked = 0
WHERE subscription = ? AND message_id = ?`, now, sub, id); err != nil {
			return fmt.Errorf("unpark message_queue: %w", err)
		}
		return nil
	}
}

// keyInFlight reports whether an order key has a delivery leased now. A
// locking read: a claim that is leasing one of the key at this moment is
// waited for, not missed.
func (s *Store) keyInFlight(ctx context.Context, tx *sql.Tx, topic, sub, orderKey string, now time.Time) (bool, error) {
	for {
		byTable := s.orderTable.Load()
		q := `SELECT COUNT(*) FROM message_queue FORCE INDEX (idx_order)
WHERE topic = ? AND subscription = ? AND order_key = ? AND is_dead = 0 AND claim_token <> 0 AND available_at > ?
LOCK IN SHARE MODE`
		if byTable {
			q = "SELECT COUNT(*) " + orderHeadFrom + " AND q.claim_token <> 0 AND q.available_at > ? LOCK IN SHARE MODE"
		}
		var n int
		err := tx.QueryRowContext(ctx, q, topic, sub, orderKey, now).Scan(&n)
		if !byTable && s.orderIndexGone(err) {
			continue
		}
		if err != nil {
			return false, fmt.Errorf("count leased message_queue of an order key: %w", err)
		}
		return n > 0, nil
	}
}

// orderIndexGone says err is the server's answer to a statement that
// names idx_order after it was dropped, and switches this Store to
// message_order.
func (s *Store) orderIndexGone(err error) bool {
	var me *mysql.MySQLError
	if errors.As(err, &me) && me.Number == errNoSuchKey {
		s.orderTable.Store(true)
		return true
	}
	return false
}

// errNoSuchKey: ER_KEY_DOES_NOT_EXISTS, a FORCE INDEX of an index that is
// not there.
const errNoSuchKey = 1176

// orderIndexPresent says whether message_queue still has idx_order.
func orderIndexPresent(ctx context.Context, q interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}) (bool, error) {
	var n int
	err := q.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.STATISTICS
WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'message_queue' AND INDEX_NAME = 'idx_order'`).Scan(&n)
	if err != nil {
		return false, fmt.Errorf("read message_queue's indexes: %w", err)
	}
	return n > 0, nil
}

// dropOrderIndex fills message_order with what older routers wrote
// without it, drops idx_order, and deletes the order rows that older
// routers left behind when they deleted deliveries. done is false when it
// did not drop: a router older than OrderTableSince is live (checked
// again just before the fill and the drop), another router is at it
// (named lock), or the drop waited orderDropLockWait for the table's
// metadata lock and gave up (a long transaction on message_queue:
// statements on the table queue behind a DDL that waits, so the wait is
// kept short). fill is false when message_order was just filled (the
// migration).
func dropOrderIndex(ctx context.Context, conn *sql.Conn, fill bool) (done bool, err error) {
	present, err := orderIndexPresent(ctx, conn)
	if err != nil || !present {
		return err == nil, err
	}
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK('shardmq_order_drop', 0)").Scan(&got); err != nil {
		return false, fmt.Errorf("take the drop's lock: %w", err)
	}
	if got.Int64 != 1 {
		return false, nil
	}
	defer conn.ExecContext(context.WithoutCancel(ctx), "SELECT RELEASE_LOCK('shardmq_order_drop')")
	if ok, err := noOlderRoutersLive(ctx, conn); err != nil || !ok {
		return false, err
	}
	if fill {
		if _, err := conn.ExecContext(ctx, fillMessageOrder); err != nil {
			return false, fmt.Errorf("fill message_order: %w", err)
		}
		if ok, err := noOlderRoutersLive(ctx, conn); err != nil || !ok {
			return false, err
		}
	}
	if _, err := conn.ExecContext(ctx, fmt.Sprintf("SET SESSION lock_wait_timeout = %d", int(orderDropLockWait.Seconds()))); err != nil {
		return false, fmt.Errorf("bound the drop's lock wait: %w", err)
	}
	_, err = conn.ExecContext(ctx, "ALTER TABLE message_queue DROP INDEX idx_order")
	conn.ExecContext(context.WithoutCancel(ctx), "SET SESSION lock_wait_timeout = DEFAULT")
	if err != nil {
		var me *mysql.MySQLError
		switch {
		case errors.As(err, &me) && me.Number == errCantDropKey:
			return true, nil // dropped meanwhile
		case errors.As(err, &me) && me.Number == errLockWait:
			return false, nil
		}
		return false, fmt.Errorf("drop message_queue's idx_order: %w", err)
	}
	return true, deleteOrphanOrderRows(ctx, conn)
}

// deleteOrphanOrderRows deletes, orderOrphanBatch at a time, the order
// rows whose delivery is gone: what routers older than OrderTableSince
// left behind when they acked, purged or moved deliveries whose rows a
// newer router had written. Heads skip such rows, but every read of
// their key walks past them. A row found orphaned is deleted only if its
// delivery is still not there (a reconciliation may re-create both).
func deleteOrphanOrderRows(ctx context.Context, conn *sql.Conn) error {
	for {
		keys, err := queryRows(ctx, conn, "select orphan message_order rows", `SELECT o.message_id, o.subscription FROM message_order o
LEFT JOIN message_queue q ON q.message_id = o.message_id AND q.subscription = o.subscription
WHERE q.message_id IS NULL LIMIT ?`, []any{orderOrphanBatch}, func(rows *sql.Rows) ([2]any, error) {
			var id uint64
			var sub []byte
			err := rows.Scan(&id, &sub)
			return [2]any{id, string(sub)}, err
		})
		if err != nil || len(keys) == 0 {
			return err
		}
		args := make([]any, 0, 2*len(keys))
		for _, k := range keys {
			args = append(args, k[0], k[1])
		}
		if _, err := conn.ExecContext(ctx, "DELETE FROM message_order WHERE (message_id, subscription) IN ("+placeholders(len(keys), 2)+
			") AND NOT EXISTS (SELECT 1 FROM message_queue q WHERE q.message_id = message_order.message_id AND q.subscription = message_order.subscription)", args...); err != nil {
			return fmt.Errorf("delete orphan message_order rows: %w", err)
		}
		if len(keys) < orderOrphanBatch {
			return nil
		}
	}
}

// orderOrphanBatch is how many orphan order rows one statement deletes.
const orderOrphanBatch = 1000

// errCantDropKey: ER_CANT_DROP_FIELD_OR_KEY, the index is not there.
const errCantDropKey = 1091

// orderDropLockWait bounds the drop's wait for message_queue's metadata
// lock; orderDropRetry is how long a router waits before it tries again
// after a drop that gave up or failed.
const (
	orderDropLockWait = 2 * time.Second
	orderDropRetry    = time.Minute
)

// DropOrderIndexIfReady drops idx_order once none of members (the live
// routers) is older than OrderTableSince, and from then on reads heads
// through message_order. Cheap once done, and between tries.
func (s *Store) DropOrderIndexIfReady(ctx context.Context, members []Member) error {
	if s.orderTable.Load() || time.Now().UnixNano() < s.orderDropAfter.Load() {
		return nil
	}
	for _, m := range members {
		if m.SchemaVersion < OrderTableSince {
			return nil
		}
	}
	s.orderDropAfter.Store(time.Now().Add(orderDropRetry).UnixNano())
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("drop idx_order: %w", translate(err))
	}
	defer conn.Close()
	done, err := dropOrderIndex(ctx, conn, true)
	if err != nil {
		return translate(err)
	}
	if done {
		s.orderTable.Store(true)
	}
	return nil
}

// olderRouterWindow is how recently a router older than OrderTableSince
// must have beaten for the migration to leave idx_order in place: wider
// than any membership's live window.
const olderRouterWindow = 30 * time.Second

// dropOrderIndexSoon runs DropOrderIndexIfReady in the background (the
// beat, which calls it, renews the owners' leases and must not wait for a
// fill of message_order and a DDL), one at a time, bounded by
// orderDropTimeout. One that fails is tried again orderDropRetry later;
// heads are read through idx_order meanwhile.
func (s *Store) dropOrderIndexSoon(members []Member) {
	if s.orderTable.Load() || time.Now().UnixNano() < s.orderDropAfter.Load() {
		return
	}
	for _, m := range members {
		if m.SchemaVersion < OrderTableSince {
			return // no goroutine per beat while an older member is live
		}
	}
	if !s.orderDropping.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer s.orderDropping.Store(false)
		ctx, cancel := context.WithTimeout(context.Background(), orderDropTimeout)
		defer cancel()
		_ = s.DropOrderIndexIfReady(ctx, members)
	}()
}

// orderDropTimeout bounds a background drop, its fill of message_order
// (a scan of message_queue) included.
const orderDropTimeout = 10 * time.Minute

// noOlderRoutersLive says whether no router older than OrderTableSince
// was seen within olderRouterWindow: neither a member (routers that
// advertise an address) nor a heartbeat (every router, addressed or not,
// with its schema version since migration 22; 0 before).
func noOlderRoutersLive(ctx context.Context, q *sql.Conn) (bool, error) {
	var n int
	err := q.QueryRowContext(ctx, `SELECT (SELECT COUNT(*) FROM router_member WHERE schema_version < ? AND seen_at >= NOW(6) - INTERVAL ? MICROSECOND)
  + (SELECT COUNT(*) FROM heartbeat WHERE schema_version < ? AND beat_at >= NOW(6) - INTERVAL ? MICROSECOND)`,
		OrderTableSince, micros(olderRouterWindow), OrderTableSince, micros(olderRouterWindow)).Scan(&n)
	if err != nil {
		return false, fmt.Errorf("read router_member and heartbeat: %w", err)
	}
	return n == 0, nil
}
