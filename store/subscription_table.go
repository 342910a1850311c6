package store

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

// subscription keeps subscription configurations on every cluster's
// primary so that every router sees them and they survive restarts on the
// static topology. A delete leaves a tombstone (deleted = 1) so that a
// cluster that missed it cannot bring the subscription back: the row with
// the highest version wins across clusters.
const createSubscription = `CREATE TABLE IF NOT EXISTS subscription (
  topic VARBINARY(128) NOT NULL,
  name VARBINARY(128) NOT NULL,
  config BLOB NOT NULL,
  version BIGINT UNSIGNED NOT NULL,
  deleted TINYINT(1) NOT NULL DEFAULT 0,
  updated_at DATETIME(6) NOT NULL,
  PRIMARY KEY (topic, name)
) ENGINE=InnoDB`

// SubscriptionRow is one stored subscription configuration (JSON).
type SubscriptionRow struct {
	Topic, Name string
	Config      []byte
	Version     uint64
	Deleted     bool
	UpdatedAt   time.Time
}

// PutSubscription writes a configuration or tombstone unless the stored
// row has a newer version (a late write never undoes a newer one).
func (s *Store) PutSubscription(ctx context.Context, r SubscriptionRow) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO subscription (topic, name, config, version, deleted, updated_at) VALUES (?, ?, ?, ?, ?, ?)
ON DUPLICATE KEY UPDATE
  config = IF(VALUES(version) > version, VALUES(config), config),
  deleted = IF(VALUES(version) > version, VALUES(deleted), deleted),
  updated_at = IF(VALUES(version) > version, VALUES(updated_at), updated_at),
  version = GREATEST(version, VALUES(version))`, r.Topic, r.Name, r.Config, r.Version, r.Deleted, r.UpdatedAt)
	if err != nil {
		return fmt.Errorf("write subscription %s/%s: %w", r.Topic, r.Name, translate(err))
	}
	return nil
}

// ListSubscriptions reads every row, tombstones included.
func (s *Store) ListSubscriptions(ctx context.Context) ([]SubscriptionRow, error) {
	out, err := queryRows(ctx, s.db, "list subscriptions", "SELECT topic, name, config, version, deleted, updated_at FROM subscription", nil,
		func(rows *sql.Rows) (SubscriptionRow, error) {
			var r SubscriptionRow
			err := rows.Scan(&r.Topic, &r.Name, &r.Config, &r.Version, &r.Deleted, &r.UpdatedAt)
			return r, err
		})
	return out, translate(err)
}
