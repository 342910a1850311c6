package store

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

// dead_letter_archive keeps dead letters untouched for 30 days, out of the
// hot message_queue; their messages stay in message_store and their trace
// ends with an archived event.
const createDeadLetterArchive = `CREATE TABLE IF NOT EXISTS dead_letter_archive (
  message_id BIGINT UNSIGNED NOT NULL,
  subscription VARBINARY(128) NOT NULL,
  topic VARBINARY(128) NOT NULL,
  vshard SMALLINT UNSIGNED NOT NULL,
  order_key VARBINARY(256) NULL,
  attempts SMALLINT UNSIGNED NOT NULL,
  error_code VARBINARY(64) NULL,
  last_error VARBINARY(2048) NULL,
  dead_at DATETIME(6) NULL,
  archived_at DATETIME(6) NOT NULL,
  PRIMARY KEY (message_id, subscription),
  KEY idx_vshard (vshard)
) ENGINE=InnoDB`

func insertArchived(ctx context.Context, tx *sql.Tx, topic string, ds []DeadLetter, now time.Time) error {
	args := make([]any, 0, len(ds)*10)
	for _, d := range ds {
		args = append(args, d.MessageID, d.Subscription, topic, d.VShard, nullString(d.OrderKey), d.Attempts,
			nullString(d.ErrorCode), nullString(d.LastError), d.DeadAt, now)
	}
	_, err := tx.ExecContext(ctx, `INSERT IGNORE INTO dead_letter_archive (message_id, subscription, topic, vshard, order_key, attempts,
  error_code, last_error, dead_at, archived_at) VALUES `+placeholders(len(ds), 10), args...)
	if err != nil {
		return fmt.Errorf("insert dead_letter_archive: %w", err)
	}
	return nil
}

// deadLetterArchiveMove moves archived dead letters with their vshard (see
// move.go).
var deadLetterArchiveMove = moveTable{
	name:  "dead_letter_archive",
	cols:  []string{"message_id", "subscription", "topic", "vshard", "order_key", "attempts", "error_code", "last_error", "dead_at", "archived_at"},
	pk:    []string{"message_id", "subscription"},
	idCol: "message_id",
}
