package store

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/shardmq/shardmq/domain"
	"github.com/shardmq/shardmq/internal/idgen"
)

// Message statuses; message_store.msg_status stores each as a number
// (statusCode), the rest of the router knows them by name.
const (
	StatusPending  = domain.MessagePending
	StatusConsumed = domain.MessageConsumed
	StatusDead     = domain.MessageDead
)

// statusCode is the msg_status value of a status.
func statusCode(s domain.MessageStatus) int {
	switch s {
	case StatusConsumed:
		return 1
	case StatusDead:
		return 2
	}
	return 0
}

// statusOf is the status of a msg_status value.
func statusOf(code int) domain.MessageStatus {
	switch code {
	case 1:
		return StatusConsumed
	case 2:
		return StatusDead
	}
	return StatusPending
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
type Message = domain.Message

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

// idList writes "(id, created_at) IN ((?, ?), …)" for ids: each row's
// whole primary key, its creation time taken from the id, so the
// statement names the partitions and reads one index entry per id.
// "id IN (…) AND created_at IN (…)" meant the same rows, but the range
// optimizer made every pair of the two lists a range to probe (200 ids
// of 20 distinct milliseconds: 4,000 index dives, or a full index scan
// when that looked cheaper; docs/performance.md).
func idList(b *strings.Builder, args []any, ids []uint64) []any {
	b.WriteString("(id, created_at) IN (")
	for i, id := range ids {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("(?, ?)")
		args = append(args, id, idgen.Time(id))
	}
	b.WriteString(")")
	return args
}

// messageCols are the columns scanMessage reads; messageBodyCols add the
// headers and the payload.
const (
	messageCols     = `id, created_at, vshard, topic, msg_key, COALESCE(order_key, ''), COALESCE(transaction_id, ''), priority, msg_status`
	messageBodyCols = messageCols + `, headers, payload_json, payload`
)

// scanMessage reads a row of messageCols, or of messageBodyCols with body.
func scanMessage(body bool) func(*sql.Rows) (*Message, error) {
	return func(rows *sql.Rows) (*Message, error) {
		m := &Message{}
		var code int
		dest := []any{&m.ID, &m.CreatedAt, &m.VShard, &m.Topic, &m.Key, &m.OrderKey, &m.TransactionID, &m.Priority, &code}
		if body {
			dest = append(dest, &m.Headers, &m.PayloadJSON, &m.Payload)
		}
		if err := rows.Scan(dest...); err != nil {
			return nil, err
		}
		m.Status = statusOf(code)
		return m, nil
	}
}

// byID indexes messages by id.
func byID(msgs []*Message, err error) (map[uint64]*Message, error) {
	if err != nil {
		return nil, err
	}
	out := make(map[uint64]*Message, len(msgs))
	for _, m := range msgs {
		out[m.ID] = m
	}
	return out, nil
}

// selectMessages reads messages by id.
func selectMessages(ctx context.Context, q queryer, ids []uint64) (map[uint64]*Message, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	var b strings.Builder
	b.WriteString("SELECT " + messageBodyCols + " FROM message_store WHERE ")
	args := idList(&b, nil, ids)
	return byID(queryRows(ctx, q, "select message_store", b.String(), args, scanMessage(true)))
}

// markConsumed sets consumed on those of ids that have no delivery left in
// message_queue: every subscription has acked (a dead letter acked on the
// dead-letter channel counts as handled).
func markConsumed(ctx context.Context, tx *sql.Tx, ids []uint64, now time.Time) error {
	return markStatus(ctx, tx, ids, StatusConsumed, now,
		" AND msg_status <> ? AND NOT EXISTS (SELECT 1 FROM message_queue q WHERE q.message_id = message_store.id)", statusCode(StatusConsumed))
}

// markRevived sets pending on dead messages of ids that have no dead
// delivery left (their dead letters were redriven).
func markRevived(ctx context.Context, tx *sql.Tx, ids []uint64, now time.Time) error {
	return markStatus(ctx, tx, ids, StatusPending, now,
		" AND msg_status = ? AND NOT EXISTS (SELECT 1 FROM message_queue q WHERE q.message_id = message_store.id AND q.is_dead = 1)", statusCode(StatusDead))
}

// markDead sets dead on messages one of whose deliveries died.
func markDead(ctx context.Context, tx *sql.Tx, ids []uint64, now time.Time) error {
	return markStatus(ctx, tx, ids, StatusDead, now, "")
}

// markStatus sets status to on those of ids that also meet cond (SQL
// starting with " AND", with its arguments condArgs).
func markStatus(ctx context.Context, tx *sql.Tx, ids []uint64, to domain.MessageStatus, now time.Time, cond string, condArgs ...any) error {
	var b strings.Builder
	b.WriteString("UPDATE message_store SET msg_status = ?, status_at = ? WHERE ")
	args := idList(&b, []any{statusCode(to), now}, ids)
	b.WriteString(cond)
	if _, err := tx.ExecContext(ctx, b.String(), append(args, condArgs...)...); err != nil {
		return fmt.Errorf("mark message_store %s: %w", to, err)
	}
	return nil
}

// selectMessagesByTransaction reads up to limit messages that carry
// transaction id txID, oldest first, through idx_transaction.
func selectMessagesByTransaction(ctx context.Context, q queryer, txID string, limit int) ([]*Message, error) {
	return queryRows(ctx, q, "select message_store by transaction",
		"SELECT "+messageBodyCols+" FROM message_store WHERE transaction_id = ? ORDER BY id LIMIT ?", []any{txID, limit}, scanMessage(true))
}

// countTransactions returns how many messages carry each of ids, for those
// that have any. idx_transaction covers it: no row is read.
func countTransactions(ctx context.Context, q queryer, ids []string) (map[string]int, error) {
	out, err := queryMap(ctx, q, "count message_store by transaction",
		"SELECT transaction_id, COUNT(*) FROM message_store WHERE transaction_id IN ("+inList(len(ids))+") GROUP BY transaction_id",
		appendArgs(nil, ids), func(rows *sql.Rows) (string, int, error) {
			var id string
			var n int
			err := rows.Scan(&id, &n)
			return id, n, err
		})
	return out, err
}

// scanMessages reads a page of messages (without payloads) created in
// [since, until), with ids above after, in id order, optionally only of
// some vshards: the reconciliation's walk. Ids grow with creation time, so
// the walk prunes to the partitions of the window.
func scanMessages(ctx context.Context, q queryer, since, until time.Time, after uint64, vshards []uint16, limit int) ([]*Message, error) {
	var b strings.Builder
	b.WriteString("SELECT " + messageCols + " FROM message_store WHERE created_at >= ? AND created_at < ? AND id > ?")
	args := []any{since.UTC(), until.UTC(), after}
	args = vshardIn(&b, args, "vshard", vshards)
	b.WriteString(" ORDER BY id LIMIT ?")
	return queryRows(ctx, q, "scan message_store", b.String(), append(args, limit), scanMessage(false))
}

// lockMessages reads and locks messages by id (without payloads), for a
// repair that must see the current status.
func lockMessages(ctx context.Context, tx *sql.Tx, ids []uint64) (map[uint64]*Message, error) {
	var b strings.Builder
	b.WriteString("SELECT " + messageCols + " FROM message_store WHERE ")
	args := idList(&b, nil, ids)
	b.WriteString(" FOR UPDATE")
	return byID(queryRows(ctx, tx, "lock message_store", b.String(), args, scanMessage(false)))
}

// setStatus moves one message from status from to status to; false when it
// no longer had from.
func setStatus(ctx context.Context, tx *sql.Tx, m *Message, from, to domain.MessageStatus, now time.Time) (bool, error) {
	res, err := tx.ExecContext(ctx, "UPDATE message_store SET msg_status = ?, status_at = ? WHERE id = ? AND created_at = ? AND msg_status = ?",
		statusCode(to), now, m.ID, m.CreatedAt, statusCode(from))
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
	out, err := queryMap(ctx, s.db, "count messages by vshard", `SELECT vshard, COUNT(*), COALESCE(SUM(created_at >= ?), 0) FROM message_store GROUP BY vshard`,
		[]any{since.UTC()}, func(rows *sql.Rows) (v uint16, l VShardLoad, err error) {
			err = rows.Scan(&v, &l.Messages, &l.Recent)
			return v, l, err
		})
	if err != nil {
		return nil, translate(err)
	}
	return out, nil
}
