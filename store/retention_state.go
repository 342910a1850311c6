package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// retention_state is where the retention jobs record what they finished,
// so that a job stopped half way (a router that lost the lead, a crash)
// resumes where it was rather than starting over: a range copied to the
// warm tier, a month exported, a table analyzed. Each cluster keeps the
// state of the work done on it. job names the job (warm_copy, cold_export,
// analyze, rebuild, restored), item what it was done to.
const createRetentionState = `CREATE TABLE IF NOT EXISTS retention_state (
  job VARCHAR(32) NOT NULL,
  item VARCHAR(191) NOT NULL,
  detail VARCHAR(1024) NOT NULL DEFAULT '',
  done_at DATETIME(6) NOT NULL,
  PRIMARY KEY (job, item)
) ENGINE=InnoDB`

// MarkDone records that job finished item at at, with a detail.
func (s *Store) MarkDone(ctx context.Context, job, item, detail string, at time.Time) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO retention_state (job, item, detail, done_at) VALUES (?, ?, ?, ?)
  ON DUPLICATE KEY UPDATE detail = VALUES(detail), done_at = VALUES(done_at)`, job, item, detail, at.UTC())
	if err != nil {
		return fmt.Errorf("record %s %s: %w", job, item, translate(err))
	}
	return nil
}

// DoneAt says when job last finished item, with its detail; ErrNotFound
// when never.
func (s *Store) DoneAt(ctx context.Context, job, item string) (time.Time, string, error) {
	var at time.Time
	var detail string
	err := s.db.QueryRowContext(ctx, "SELECT done_at, detail FROM retention_state WHERE job = ? AND item = ?", job, item).Scan(&at, &detail)
	if errors.Is(err, sql.ErrNoRows) {
		return time.Time{}, "", ErrNotFound
	}
	if err != nil {
		return time.Time{}, "", fmt.Errorf("read %s %s: %w", job, item, translate(err))
	}
	return at, detail, nil
}

// ForgetDone removes job's records of items whose name starts with prefix
// (a month finished: its ranges' records are no longer needed).
func (s *Store) ForgetDone(ctx context.Context, job, prefix string) error {
	_, err := s.db.ExecContext(ctx, "DELETE FROM retention_state WHERE job = ? AND item LIKE CONCAT(?, '%')", job, prefix)
	if err != nil {
		return fmt.Errorf("forget %s %s: %w", job, prefix, translate(err))
	}
	return nil
}
