package store

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

// archive_cold_index is what stays in the archive cluster of a message
// exported to a cold file: enough to answer a trace by key or a lookup by
// transaction id with "archived, in this file" without opening files. One
// small row per message (no payload); a key reused after the dedup window
// has one row per message.
const createArchiveColdIndex = `CREATE TABLE IF NOT EXISTS archive_cold_index (
  topic VARBINARY(128) NOT NULL,
  msg_key VARBINARY(256) NOT NULL,
  message_id BIGINT UNSIGNED NOT NULL,
  created_at DATETIME(3) NOT NULL,
  vshard SMALLINT UNSIGNED NOT NULL,
  order_key VARBINARY(256) NULL,
  transaction_id VARBINARY(256) NULL,
  msg_status TINYINT UNSIGNED NOT NULL,
  file VARCHAR(255) NOT NULL,
  exported_at DATETIME(6) NOT NULL,
  PRIMARY KEY (topic, msg_key, message_id),
  KEY idx_transaction (transaction_id),
  KEY idx_message (message_id)
) ENGINE=InnoDB`

// ColdEntry is one message exported to a cold file.
type ColdEntry struct {
	Message    *Message // without headers and payload
	File       string   // path relative to the cold directory
	ExportedAt time.Time
}

// indexCold records where the messages of rows (archive_message rows in
// tierTable column order) were exported, in one statement.
func (s *Store) indexCold(ctx context.Context, rows []MoveRow, file string, at time.Time) error {
	if len(rows) == 0 {
		return nil
	}
	args := make([]any, 0, len(rows)*10)
	for _, r := range rows {
		// id, created_at, vshard, topic, msg_key, order_key, transaction_id, …, msg_status
		args = append(args, r[3], r[4], r[0], r[1], r[2], r[5], r[6], r[11], file, at)
	}
	_, err := s.db.ExecContext(ctx, `INSERT INTO archive_cold_index (topic, msg_key, message_id, created_at, vshard, order_key,
  transaction_id, msg_status, file, exported_at) VALUES `+placeholders(len(rows), 10)+`
  ON DUPLICATE KEY UPDATE file = VALUES(file), exported_at = VALUES(exported_at), msg_status = VALUES(msg_status)`, args...)
	if err != nil {
		return fmt.Errorf("insert archive_cold_index: %w", translate(err))
	}
	return nil
}

const selectColdCols = `SELECT message_id, created_at, vshard, topic, msg_key, COALESCE(order_key, ''), COALESCE(transaction_id, ''),
  msg_status, file, exported_at FROM archive_cold_index`

func scanCold(ctx context.Context, q queryer, query string, args ...any) ([]ColdEntry, error) {
	out, err := queryRows(ctx, q, "select archive_cold_index", query, args, func(rows *sql.Rows) (ColdEntry, error) {
		m := &Message{}
		e := ColdEntry{Message: m}
		var code int
		err := rows.Scan(&m.ID, &m.CreatedAt, &m.VShard, &m.Topic, &m.Key, &m.OrderKey, &m.TransactionID, &code, &e.File, &e.ExportedAt)
		m.Status = statusOf(code)
		return e, err
	})
	return out, translate(err)
}

// ColdByKey returns the newest message with (topic, key) exported to a
// cold file; ErrNotFound when none was.
func (s *Store) ColdByKey(ctx context.Context, topic, key string) (*ColdEntry, error) {
	got, err := scanCold(ctx, s.db, selectColdCols+" WHERE topic = ? AND msg_key = ? ORDER BY message_id DESC LIMIT 1", topic, key)
	if err != nil {
		return nil, err
	}
	if len(got) == 0 {
		return nil, ErrNotFound
	}
	return &got[0], nil
}

// ColdByTransaction returns up to limit messages of transaction id txID
// exported to cold files, with ids above after, oldest first.
func (s *Store) ColdByTransaction(ctx context.Context, txID string, after uint64, limit int) ([]ColdEntry, error) {
	return scanCold(ctx, s.db, selectColdCols+" WHERE transaction_id = ? AND message_id > ? ORDER BY message_id LIMIT ?", txID, after, limit)
}
