package store

import (
	"bytes"
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"slices"
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
` + MonthPartitions("created_at", now)
}

// Message is a stored message.
type Message = domain.Message

func insertMessagesSQL(args []any, msgs []*Message) (string, []any) {
	args = slices.Grow(args, len(msgs)*11)
	for _, m := range msgs {
		args = append(args, m.ID, m.CreatedAt, m.VShard, m.Topic, m.Key, nullString(m.OrderKey), nullString(m.TransactionID),
			m.Priority, m.Headers, m.PayloadJSON, m.Payload)
	}
	return `INSERT INTO message_store (id, created_at, vshard, topic, msg_key, order_key, transaction_id,
  priority, headers, payload_json, payload) VALUES ` + placeholders(len(msgs), 11), args
}

func insertMessages(ctx context.Context, tx *sql.Tx, msgs []*Message) error {
	q, args := insertMessagesSQL(nil, msgs)
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
//
// One id is written "(id = ? AND created_at = ?)" (see pairsIn).
func idList(b *strings.Builder, args []any, ids []uint64) []any {
	b.WriteString(pairsIn("id", "created_at", len(ids)))
	for _, id := range ids {
		args = append(args, id, idgen.Time(id))
	}
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
	return selectBodies(ctx, q, "message_store", ids)
}

// selectBodies reads messages by id from table (message_store or
// archive_message, which share their columns).
func selectBodies(ctx context.Context, q queryer, table string, ids []uint64) (map[uint64]*Message, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	var b strings.Builder
	b.WriteString("SELECT " + messageBodyCols + " FROM " + table + " WHERE ")
	args := idList(&b, nil, ids)
	return byID(queryRows(ctx, q, "select "+table, b.String(), args, scanMessage(true)))
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

// sizedPage reads one page of messages of table by transaction id txID:
// those with ids above after, oldest first, at most limit and at most
// maxBytes encoded (domain.EncodedSize; the first whatever its size). It
// sizes the page before it reads any body, so that it reads only what it
// answers. more says whether messages are left after the page.
func sizedPage(ctx context.Context, q queryer, table, txID string, after uint64, limit, maxBytes int) ([]*Message, bool, error) {
	sizes, err := selectTransactionSizes(ctx, q, table, txID, after, limit+1)
	if err != nil {
		return nil, false, err
	}
	more := len(sizes) > limit
	sizes = sizes[:min(len(sizes), limit)]
	ns := make([]int, len(sizes))
	for i, s := range sizes {
		ns[i] = s.size
	}
	if n := fitBytes(ns, maxBytes); n < len(sizes) {
		sizes, more = sizes[:n], true
	}
	ids := make([]uint64, len(sizes))
	for i, s := range sizes {
		ids[i] = s.id
	}
	bodies, err := selectBodies(ctx, q, table, ids)
	if err != nil {
		return nil, false, err
	}
	out := make([]*Message, 0, len(ids))
	for _, id := range ids {
		if m, ok := bodies[id]; ok { // gone since it was sized: left out
			out = append(out, m)
		}
	}
	return out, more, nil
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

// The final ack of a message — the one that leaves it no delivery — is
// written on the message row, in the update that marks it consumed,
// instead of as an `acked` row of message_trace: which subscription,
// consumer and attempt, when it was claimed and the request that acked
// it, and when. It is the common case (one subscription), so a consumed
// message costs the delete of its delivery and this update, two rows
// instead of three (docs/performance.md). The trace reads it as an
// `acked` event like any other (rowAcks); earlier acks of other
// subscriptions, and acks on the rarer paths, stay rows of message_trace.
// Since migration 19 an ack is written into the row's fixed-size slot
// (ack_slot.go), in place; these columns (with status_at as its time)
// take an ack that does not fit the slot. They come last and NULL, so
// adding them was instant.
const ackedColumns = `ADD COLUMN acked_sub VARBINARY(128) NULL, ADD COLUMN acked_by VARBINARY(128) NULL,
  ADD COLUMN acked_attempt SMALLINT UNSIGNED NULL, ADD COLUMN acked_claimed_at DATETIME(6) NULL, ADD COLUMN acked_request VARBINARY(64) NULL`

const (
	addAckedColumns         = `ALTER TABLE message_store ` + ackedColumns
	addArchivedAckedColumns = `ALTER TABLE archive_message ` + ackedColumns
)

// ackSlotColumn is the final ack's slot (ack_slot.go). Migration 19 adds
// it to message_store and archive_message, at the end, NOT NULL with its
// default, so adding it is instant.
const ackSlotColumn = "ADD COLUMN ack_slot BINARY(64) NOT NULL DEFAULT ''"

const (
	addAckSlot         = `ALTER TABLE message_store ` + ackSlotColumn
	addArchivedAckSlot = `ALTER TABLE archive_message ` + ackSlotColumn
	// rebuildMessageStore rewrites every row whole, the slot included
	// (see ackSlotLen on why a row may lack it).
	rebuildMessageStore = `ALTER TABLE message_store FORCE`
)

// rowAcks reads the final acks kept on the rows of table (message_store
// or archive_message) of messages ids, as trace events (the event's id is
// the message's: one such event per message), from the slot or, for an
// ack that did not fit it, the acked_* columns.
func rowAcks(ctx context.Context, q queryer, table string, ids []uint64) ([]Event, error) {
	var b strings.Builder
	b.WriteString(`SELECT id, vshard, status_at, acked_sub, COALESCE(acked_by, ''), acked_attempt, acked_claimed_at, COALESCE(acked_request, ''),
  ack_slot FROM ` + table + ` WHERE `)
	var args []any
	if table == "message_store" {
		args = idList(&b, nil, ids)
	} else {
		b.WriteString("id IN (" + inList(len(ids)) + ")")
		args = appendArgs(nil, ids)
	}
	b.WriteString(" AND (acked_sub IS NOT NULL OR ack_slot <> ?)")
	// A row holds one ack, in the slot or the columns, unless a message
	// was made pending again (a reconciliation's repair) and acked once
	// more by the other way: then both.
	pairs, err := queryRows(ctx, q, "select "+table+" acks", b.String(), append(args, emptyAckSlot), func(rows *sql.Rows) ([]Event, error) {
		e := Event{Type: EventAcked}
		var at, claimed sql.NullTime
		var sub sql.NullString
		var attempt sql.NullInt64
		var slot []byte
		if err := rows.Scan(&e.ID, &e.VShard, &at, &sub, &e.Consumer, &attempt, &claimed, &e.RequestID, &slot); err != nil {
			return nil, err
		}
		e.MessageID = e.ID
		var out []Event
		if sub.Valid {
			c := e
			c.Subscription, c.At, c.Attempt, c.ClaimedAt = sub.String, at.Time, int(attempt.Int64), claimed.Time
			out = append(out, c)
		}
		if bytes.Equal(slot, emptyAckSlot) {
			return out, nil
		}
		a, when, ok := decodeAckSlot(slot)
		if !ok {
			return nil, fmt.Errorf("message %d: an ack slot this version cannot read (version %d)", e.ID, slot[0])
		}
		e.Subscription, e.Consumer, e.Attempt, e.ClaimedAt, e.RequestID, e.At = a.sub, a.consumer, a.attempt, a.claimedAt, a.request, when
		return append(out, e), nil
	})
	return slices.Concat(pairs...), err
}

// withRowAcks merges the final acks kept on the rows of table into evs
// (trace rows of the same messages, in time order), in time order.
func withRowAcks(ctx context.Context, q queryer, table string, ids []uint64, evs []Event) ([]Event, error) {
	acks, err := rowAcks(ctx, q, table, ids)
	if err != nil || len(acks) == 0 {
		return evs, err
	}
	evs = append(evs, acks...)
	slices.SortStableFunc(evs, func(a, b Event) int {
		if c := a.At.Compare(b.At); c != 0 {
			return c
		}
		return cmp.Compare(a.ID, b.ID)
	})
	return evs, nil
}

// finalAck is the part of a final ack written on its message row.
type finalAck struct {
	sub, consumer, request string
	attempt                int
	claimedAt              time.Time
	// columns: write the acked_* columns even when the slot would do
	// (Store.SetAckSlots).
	columns bool
}

// markAcked marks consumed those of ids whose status is not consumed yet,
// with their final ack a, and answers how many rows it changed.
func markAcked(ctx context.Context, tx *sql.Tx, ids []uint64, a finalAck, now time.Time) (int64, error) {
	q, args := markAckedSQL(nil, ids, a, now)
	return execCount(ctx, tx, "mark message_store acked", q, args...)
}

// markAckedSQL is markAcked's statement, its arguments appended to args:
// the ack in the slot when it fits (in place), else in the acked_* columns.
func markAckedSQL(args []any, ids []uint64, a finalAck, now time.Time) (string, []any) {
	var b strings.Builder
	if slot, ok := encodeAckSlot(a, now); ok {
		b.WriteString("UPDATE message_store SET msg_status = ?, ack_slot = ? WHERE ")
		args = idList(&b, append(args, statusCode(StatusConsumed), slot), ids)
		b.WriteString(" AND msg_status <> ?")
		return b.String(), append(args, statusCode(StatusConsumed))
	}
	b.WriteString(`UPDATE message_store SET msg_status = ?, status_at = ?, acked_sub = ?, acked_by = ?, acked_attempt = ?,
  acked_claimed_at = ?, acked_request = ? WHERE `)
	var claimed any
	if !a.claimedAt.IsZero() {
		claimed = a.claimedAt
	}
	args = append(args, statusCode(StatusConsumed), now, a.sub, nullString(a.consumer), a.attempt, claimed, nullString(a.request))
	args = idList(&b, args, ids)
	b.WriteString(" AND msg_status <> ?")
	return b.String(), append(args, statusCode(StatusConsumed))
}

// ackedOn answers which of ids carry on their row the final ack a written
// at now (markAcked's), to tell which of a group it changed: the slot
// holds the ack's time to the microsecond, and so do the columns.
func ackedOn(ctx context.Context, tx queryer, ids []uint64, a finalAck, now time.Time) (map[uint64]bool, error) {
	var b strings.Builder
	b.WriteString("SELECT id, 1 FROM message_store WHERE ")
	args := idList(&b, nil, ids)
	if slot, ok := encodeAckSlot(a, now); ok {
		b.WriteString(" AND ack_slot = ?")
		args = append(args, slot)
	} else {
		b.WriteString(" AND acked_sub = ? AND status_at = ?")
		args = append(args, a.sub, now)
	}
	return queryMap(ctx, tx, "read message_store acks", b.String(), args, func(rows *sql.Rows) (uint64, bool, error) {
		var id uint64
		var one int
		err := rows.Scan(&id, &one)
		return id, true, err
	})
}

// messageStoreMove moves messages with their vshard (see move.go).
var messageStoreMove = moveTable{
	name: "message_store",
	cols: []string{"id", "created_at", "vshard", "topic", "msg_key", "order_key", "transaction_id", "priority", "headers", "payload_json", "payload", "msg_status", "status_at",
		"acked_sub", "acked_by", "acked_attempt", "acked_claimed_at", "acked_request", "ack_slot"},
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

// messageSizeCols give what a message's encoded size needs (domain.
// EncodedSizeOf) without its body: a listing with a byte cap sizes its
// page first and reads only the bodies it answers, so that the router
// never holds more than the cap of payloads for one answer.
const messageSizeCols = `id, topic, msg_key, COALESCE(order_key, ''), COALESCE(transaction_id, ''), COALESCE(LENGTH(headers), 0),
  LENGTH(payload), payload_json`

// sizedMessage is a message id with its encoded size.
type sizedMessage struct {
	id   uint64
	size int
}

func scanSize(rows *sql.Rows) (sizedMessage, error) {
	var s sizedMessage
	var topic, key, orderKey, txID string
	var headers, payload int
	var isJSON bool
	err := rows.Scan(&s.id, &topic, &key, &orderKey, &txID, &headers, &payload, &isJSON)
	s.size = domain.EncodedSizeOf(topic, key, orderKey, txID, headers, payload, isJSON)
	return s, err
}

// selectMessageSizes reads the encoded sizes of messages by id.
func selectMessageSizes(ctx context.Context, q queryer, ids []uint64) (map[uint64]int, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	var b strings.Builder
	b.WriteString("SELECT " + messageSizeCols + " FROM message_store WHERE ")
	args := idList(&b, nil, ids)
	got, err := queryRows(ctx, q, "size message_store", b.String(), args, scanSize)
	if err != nil {
		return nil, err
	}
	out := make(map[uint64]int, len(got))
	for _, s := range got {
		out[s.id] = s.size
	}
	return out, nil
}

// selectTransactionSizes reads the ids and encoded sizes of up to limit
// messages of table (message_store or archive_message) that carry
// transaction id txID, with ids above after, oldest first.
func selectTransactionSizes(ctx context.Context, q queryer, table, txID string, after uint64, limit int) ([]sizedMessage, error) {
	return queryRows(ctx, q, "size "+table+" by transaction",
		"SELECT "+messageSizeCols+" FROM "+table+" WHERE transaction_id = ? AND id > ? ORDER BY id LIMIT ?",
		[]any{txID, after, limit}, scanSize)
}

// fitBytes says how many of sizes, in order, fit in maxBytes (0: no cap);
// the first always does, so that one large item cannot stop a listing.
func fitBytes(sizes []int, maxBytes int) int {
	used := 0
	for i, n := range sizes {
		if maxBytes > 0 && i > 0 && used+n > maxBytes {
			return i
		}
		used += n
	}
	return len(sizes)
}
