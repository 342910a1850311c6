package store

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/shardmq/shardmq/internal/idgen"
)

// Message status values of message_store.msg_status.
const (
	StatusPending  = 0
	StatusConsumed = 1
	StatusDead     = 2
)

// StatusName is the API name of a msg_status value.
func StatusName(s int) string {
	switch s {
	case StatusConsumed:
		return "consumed"
	case StatusDead:
		return "dead"
	}
	return "pending"
}

// message_store holds each message once, immutable but for its status,
// partitioned by month on created_at. created_at is the time encoded in the
// id, so a query by id can name its partition. The produced trace event is
// this row's creation time, not a row of its own.
func createMessageStore(now time.Time) string {
	return `CREATE TABLE IF NOT EXISTS message_store (
  id BIGINT UNSIGNED NOT NULL,
  created_at DATETIME(3) NOT NULL,
  vshard SMALLINT UNSIGNED NOT NULL,
  topic VARBINARY(128) NOT NULL,
  msg_key VARBINARY(256) NOT NULL,
  order_key VARBINARY(256) NULL,
  transaction_id VARBINARY(256) NULL,
  priority TINYINT UNSIGNED NOT NULL,
  headers BLOB NULL,
  payload_json TINYINT(1) NOT NULL,
  payload MEDIUMBLOB NOT NULL,
  msg_status TINYINT UNSIGNED NOT NULL DEFAULT 0,
  status_at DATETIME(6) NULL,
  PRIMARY KEY (id, created_at),
  KEY idx_transaction (transaction_id)
) ENGINE=InnoDB
` + monthPartitions("created_at", now)
}

// Message is a stored message.
type Message struct {
	ID            uint64
	VShard        uint16
	Topic         string
	Key           string
	OrderKey      string
	TransactionID string
	Priority      int
	Headers       []byte // JSON object, or nil
	PayloadJSON   bool   // payload is JSON text (else opaque bytes)
	Payload       []byte
	Status        int
	CreatedAt     time.Time
}

func insertMessagesSQL(msgs []*Message) (string, []any) {
	args := make([]any, 0, len(msgs)*11)
	for _, m := range msgs {
		args = append(args, m.ID, m.CreatedAt, m.VShard, m.Topic, m.Key, nullString(m.OrderKey), nullString(m.TransactionID),
			m.Priority, m.Headers, m.PayloadJSON, m.Payload)
	}
	return `INSERT INTO message_store (id, created_at, vshard, topic, msg_key, order_key, transaction_id,
  priority, headers, payload_json, payload) VALUES ` + placeholders(len(msgs), 11), args
}

func insertMessages(ctx context.Context, tx *sql.Tx, msgs []*Message) error {
	q, args := insertMessagesSQL(msgs)
	_, err := tx.ExecContext(ctx, q, args...)
	if err != nil {
		return fmt.Errorf("insert message_store: %w", err)
	}
	return nil
}

// idList writes "id IN (…) AND created_at IN (…)" for ids, naming the
// partitions through the creation times encoded in the ids.
func idList(b *strings.Builder, args []any, ids []uint64) []any {
	b.WriteString("id IN (")
	seen := map[time.Time]bool{}
	var times []any
	for i, id := range ids {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('?')
		args = append(args, id)
		t := idgen.Time(id)
		if !seen[t] {
			seen[t] = true
			times = append(times, t)
		}
	}
	b.WriteString(") AND created_at IN (")
	b.WriteString(strings.TrimSuffix(strings.Repeat("?,", len(times)), ","))
	b.WriteByte(')')
	return append(args, times...)
}

// selectMessages reads messages by id.
func selectMessages(ctx context.Context, q queryer, ids []uint64) (map[uint64]*Message, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	var b strings.Builder
	b.WriteString(`SELECT id, created_at, vshard, topic, msg_key, COALESCE(order_key, ''), COALESCE(transaction_id, ''), priority,
  headers, payload_json, payload, msg_status FROM message_store WHERE `)
	args := idList(&b, nil, ids)
	rows, err := q.QueryContext(ctx, b.String(), args...)
	if err != nil {
		return nil, fmt.Errorf("select message_store: %w", err)
	}
	defer rows.Close()
	out := make(map[uint64]*Message, len(ids))
	for rows.Next() {
		m := &Message{}
		if err := rows.Scan(&m.ID, &m.CreatedAt, &m.VShard, &m.Topic, &m.Key, &m.OrderKey, &m.TransactionID, &m.Priority,
			&m.Headers, &m.PayloadJSON, &m.Payload, &m.Status); err != nil {
			return nil, fmt.Errorf("select message_store: %w", err)
		}
		out[m.ID] = m
	}
	return out, rows.Err()
}

// markConsumed sets consumed on those of ids that have no delivery left in
// message_queue: every subscription has acked (a dead letter acked on the
// dead-letter channel counts as handled).
func markConsumed(ctx context.Context, tx *sql.Tx, ids []uint64, now time.Time) error {
	q, args := markConsumedSQL(ids, now)
	if _, err := tx.ExecContext(ctx, q, args...); err != nil {
		return fmt.Errorf("mark message_store consumed: %w", err)
	}
	return nil
}

// markConsumedSQL is markConsumed's statement (the batched ack sends it
// in its multi-statement).
func markConsumedSQL(ids []uint64, now time.Time) (string, []any) {
	var b strings.Builder
	b.WriteString("UPDATE message_store SET msg_status = ?, status_at = ? WHERE ")
	args := idList(&b, []any{StatusConsumed, now}, ids)
	b.WriteString(" AND msg_status <> ? AND NOT EXISTS (SELECT 1 FROM message_queue q WHERE q.message_id = message_store.id)")
	return b.String(), append(args, StatusConsumed)
}

// markRevived sets pending on dead messages of ids that have no dead
// delivery left (their dead letters were redriven).
func markRevived(ctx context.Context, tx *sql.Tx, ids []uint64, now time.Time) error {
	var b strings.Builder
	b.WriteString("UPDATE message_store SET msg_status = ?, status_at = ? WHERE ")
	args := idList(&b, []any{StatusPending, now}, ids)
	b.WriteString(" AND msg_status = ? AND NOT EXISTS (SELECT 1 FROM message_queue q WHERE q.message_id = message_store.id AND q.is_dead = 1)")
	args = append(args, StatusDead)
	if _, err := tx.ExecContext(ctx, b.String(), args...); err != nil {
		return fmt.Errorf("mark message_store pending: %w", err)
	}
	return nil
}

// markDead sets dead on messages one of whose deliveries died.
func markDead(ctx context.Context, tx *sql.Tx, ids []uint64, now time.Time) error {
	var b strings.Builder
	b.WriteString("UPDATE message_store SET msg_status = ?, status_at = ? WHERE ")
	args := idList(&b, []any{StatusDead, now}, ids)
	if _, err := tx.ExecContext(ctx, b.String(), args...); err != nil {
		return fmt.Errorf("mark message_store dead: %w", err)
	}
	return nil
}

// queryer is what reads need: a pool or a transaction.
type queryer interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// selectMessagesByTransaction reads up to limit messages that carry
// transaction id txID, oldest first, through idx_transaction.
func selectMessagesByTransaction(ctx context.Context, q queryer, txID string, limit int) ([]*Message, error) {
	rows, err := q.QueryContext(ctx, `SELECT id, created_at, vshard, topic, msg_key, COALESCE(order_key, ''), COALESCE(transaction_id, ''), priority,
  headers, payload_json, payload, msg_status FROM message_store WHERE transaction_id = ? ORDER BY id LIMIT ?`, txID, limit)
	if err != nil {
		return nil, fmt.Errorf("select message_store by transaction: %w", err)
	}
	defer rows.Close()
	var out []*Message
	for rows.Next() {
		m := &Message{}
		if err := rows.Scan(&m.ID, &m.CreatedAt, &m.VShard, &m.Topic, &m.Key, &m.OrderKey, &m.TransactionID, &m.Priority,
			&m.Headers, &m.PayloadJSON, &m.Payload, &m.Status); err != nil {
			return nil, fmt.Errorf("select message_store by transaction: %w", err)
		}
		out = append(out, m)
	}
	return out, rows.Err()
}

// countTransactions returns how many messages carry each of ids, for those
// that have any. idx_transaction covers it: no row is read.
func countTransactions(ctx context.Context, q queryer, ids []string) (map[string]int, error) {
	args := make([]any, len(ids))
	for i, id := range ids {
		args[i] = id
	}
	rows, err := q.QueryContext(ctx, "SELECT transaction_id, COUNT(*) FROM message_store WHERE transaction_id IN ("+
		strings.TrimSuffix(strings.Repeat("?,", len(ids)), ",")+") GROUP BY transaction_id", args...)
	if err != nil {
		return nil, fmt.Errorf("count message_store by transaction: %w", err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			return nil, fmt.Errorf("count message_store by transaction: %w", err)
		}
		out[id] = n
	}
	return out, rows.Err()
}

// scanMessages reads a page of messages (without payloads) created in
// [since, until), with ids above after, in id order, optionally only of
// some vshards: the reconciliation's walk. Ids grow with creation time, so
// the walk prunes to the partitions of the window.
func scanMessages(ctx context.Context, q queryer, since, until time.Time, after uint64, vshards []uint16, limit int) ([]*Message, error) {
	var b strings.Builder
	b.WriteString(`SELECT id, created_at, vshard, topic, msg_key, COALESCE(order_key, ''), COALESCE(transaction_id, ''), priority, msg_status
FROM message_store WHERE created_at >= ? AND created_at < ? AND id > ?`)
	args := []any{since.UTC(), until.UTC(), after}
	args = vshardIn(&b, args, "vshard", vshards)
	b.WriteString(" ORDER BY id LIMIT ?")
	args = append(args, limit)
	rows, err := q.QueryContext(ctx, b.String(), args...)
	if err != nil {
		return nil, fmt.Errorf("scan message_store: %w", err)
	}
	defer rows.Close()
	var out []*Message
	for rows.Next() {
		m := &Message{}
		if err := rows.Scan(&m.ID, &m.CreatedAt, &m.VShard, &m.Topic, &m.Key, &m.OrderKey, &m.TransactionID, &m.Priority, &m.Status); err != nil {
			return nil, fmt.Errorf("scan message_store: %w", err)
		}
		out = append(out, m)
	}
	return out, rows.Err()
}

// lockMessages reads and locks messages by id (without payloads), for a
// repair that must see the current status.
func lockMessages(ctx context.Context, tx *sql.Tx, ids []uint64) (map[uint64]*Message, error) {
	var b strings.Builder
	b.WriteString(`SELECT id, created_at, vshard, topic, msg_key, COALESCE(order_key, ''), COALESCE(transaction_id, ''), priority, msg_status
FROM message_store WHERE `)
	args := idList(&b, nil, ids)
	b.WriteString(" FOR UPDATE")
	rows, err := tx.QueryContext(ctx, b.String(), args...)
	if err != nil {
		return nil, fmt.Errorf("lock message_store: %w", err)
	}
	defer rows.Close()
	out := make(map[uint64]*Message, len(ids))
	for rows.Next() {
		m := &Message{}
		if err := rows.Scan(&m.ID, &m.CreatedAt, &m.VShard, &m.Topic, &m.Key, &m.OrderKey, &m.TransactionID, &m.Priority, &m.Status); err != nil {
			return nil, fmt.Errorf("lock message_store: %w", err)
		}
		out[m.ID] = m
	}
	return out, rows.Err()
}

// setStatus moves one message from status from to status to; false when it
// no longer had from.
func setStatus(ctx context.Context, tx *sql.Tx, m *Message, from, to int, now time.Time) (bool, error) {
	res, err := tx.ExecContext(ctx, "UPDATE message_store SET msg_status = ?, status_at = ? WHERE id = ? AND created_at = ? AND msg_status = ?",
		to, now, m.ID, m.CreatedAt, from)
	if err != nil {
		return false, fmt.Errorf("set message_store status: %w", err)
	}
	n, _ := res.RowsAffected()
	return n == 1, nil
}

// messageStoreMove moves messages with their vshard (see move.go).
var messageStoreMove = moveTable{
	name:  "message_store",
	cols:  []string{"id", "created_at", "vshard", "topic", "msg_key", "order_key", "transaction_id", "priority", "headers", "payload_json", "payload", "msg_status", "status_at"},
	pk:    []string{"id", "created_at"},
	idCol: "id",
}

// VShardLoad is how much one vshard holds on a cluster.
type VShardLoad struct {
	Messages int64 // messages stored
	Recent   int64 // of them, created since the time asked
}

// VShardLoads counts the messages of every vshard on this cluster, and
// those created since since: what the resharding planner weighs vshards
// by. It scans message_store.
func (s *Store) VShardLoads(ctx context.Context, since time.Time) (map[uint16]VShardLoad, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT vshard, COUNT(*), COALESCE(SUM(created_at >= ?), 0) FROM message_store GROUP BY vshard`, since.UTC())
	if err != nil {
		return nil, fmt.Errorf("count messages by vshard: %w", translate(err))
	}
	defer rows.Close()
	out := map[uint16]VShardLoad{}
	for rows.Next() {
		var v uint16
		var l VShardLoad
		if err := rows.Scan(&v, &l.Messages, &l.Recent); err != nil {
			return nil, fmt.Errorf("count messages by vshard: %w", err)
		}
		out[v] = l
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("count messages by vshard: %w", translate(err))
	}
	return out, nil
}
