package store

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"time"
)

// message_key is the dedup registry: one row per (topic, key). Its primary
// key is the unique constraint that makes a duplicate impossible; it is a
// table of its own because message_store is partitioned by month and MySQL
// requires every unique key of a partitioned table to include the
// partitioning column. Keys compare byte for byte (VARBINARY).
const createMessageKey = `CREATE TABLE IF NOT EXISTS message_key (
  topic VARBINARY(128) NOT NULL,
  msg_key VARBINARY(256) NOT NULL,
  vshard SMALLINT UNSIGNED NOT NULL,
  message_id BIGINT UNSIGNED NOT NULL,
  payload_hash BINARY(16) NOT NULL,
  created_at DATETIME(3) NOT NULL,
  PRIMARY KEY (topic, msg_key)
) ENGINE=InnoDB`

// keyRow is one message_key row.
type keyRow struct {
	topic, key string
	vshard     uint16
	messageID  uint64
	hash       []byte
	createdAt  time.Time
}

// insertKeys registers keys, ignoring those already registered, and returns
// how many were new. Rows are sorted by the caller so that concurrent
// batches take row locks in one order (fewer deadlocks).
func insertKeys(ctx context.Context, tx *sql.Tx, rows []keyRow) (int64, error) {
	q, args := insertKeysSQL(nil, rows, true)
	res, err := tx.ExecContext(ctx, q, args...)
	if err != nil {
		return 0, fmt.Errorf("insert message_key: %w", err)
	}
	return res.RowsAffected()
}

// insertKeysSQL registers keys; with ignore, keys already registered are
// skipped, without it the first one fails the statement (error 1062).
func insertKeysSQL(args []any, rows []keyRow, ignore bool) (string, []any) {
	args = slices.Grow(args, len(rows)*6)
	for _, r := range rows {
		args = append(args, r.topic, r.key, r.vshard, r.messageID, r.hash, r.createdAt)
	}
	verb := "INSERT INTO"
	if ignore {
		verb = "INSERT IGNORE INTO"
	}
	return verb + " message_key (topic, msg_key, vshard, message_id, payload_hash, created_at) VALUES " + placeholders(len(rows), 6), args
}

// registeredKey is who holds a (topic, key).
type registeredKey struct {
	messageID uint64
	vshard    uint16
	hash      []byte
}

// keysIn is "(topic, msg_key) IN (…)" for n keys (see pairsIn).
func keysIn(n int) string { return pairsIn("topic", "msg_key", n) }

// selectKeys reads who holds each (topic, key), with a shared lock so that
// the answer is the committed or our own row, never a stale snapshot.
func selectKeys(ctx context.Context, tx *sql.Tx, rows []keyRow) (map[[2]string]registeredKey, error) {
	args := make([]any, 0, len(rows)*2)
	for _, r := range rows {
		args = append(args, r.topic, r.key)
	}
	return queryMap(ctx, tx, "select message_key", "SELECT topic, msg_key, message_id, vshard, payload_hash FROM message_key WHERE "+
		keysIn(len(rows))+" LOCK IN SHARE MODE", args, func(res *sql.Rows) ([2]string, registeredKey, error) {
		var topic, key string
		var k registeredKey
		err := res.Scan(&topic, &key, &k.messageID, &k.vshard, &k.hash)
		return [2]string{topic, key}, k, err
	})
}

// LookupKey returns the message id registered for (topic, key).
func (s *Store) LookupKey(ctx context.Context, topic, key string) (uint64, error) {
	id, err := selectKeyID(ctx, s.db, topic, key)
	return id, translate(err)
}

// selectKeyID returns the message id registered for (topic, key);
// ErrNotFound when none is.
func selectKeyID(ctx context.Context, q queryer, topic, key string) (uint64, error) {
	ids, err := queryRows(ctx, q, "select message_key", "SELECT message_id FROM message_key WHERE topic = ? AND msg_key = ?",
		[]any{topic, key}, scanOne[uint64])
	if err != nil {
		return 0, err
	}
	if len(ids) == 0 {
		return 0, ErrNotFound
	}
	return ids[0], nil
}

// selectKeyHolders returns, for each (topic, key) of msgs that is
// registered, the message id holding it (reconciliation: every message has
// its key row and the row names it).
func selectKeyHolders(ctx context.Context, q queryer, msgs []*Message) (map[[2]string]uint64, error) {
	if len(msgs) == 0 {
		return nil, nil
	}
	args := make([]any, 0, len(msgs)*2)
	for _, m := range msgs {
		args = append(args, m.Topic, m.Key)
	}
	return queryMap(ctx, q, "select message_key holders", "SELECT topic, msg_key, message_id FROM message_key WHERE "+keysIn(len(msgs)),
		args, func(rows *sql.Rows) ([2]string, uint64, error) {
			var topic, key string
			var id uint64
			err := rows.Scan(&topic, &key, &id)
			return [2]string{topic, key}, id, err
		})
}

// messageKeyMove moves dedup keys with their vshard (see move.go): a key
// re-sent after the move is found on the new cluster.
var messageKeyMove = moveTable{
	name:  "message_key",
	cols:  []string{"topic", "msg_key", "vshard", "message_id", "payload_hash", "created_at"},
	pk:    []string{"topic", "msg_key"},
	idCol: "message_id",
}
