package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/go-sql-driver/mysql"
)

// vshard_owner is each cluster's own copy of the shard map, the record
// that survives the loss of the topology store (docs/consul.md,
// Recovery): one row per vshard with the cluster that owns it in the
// newest map version this primary was told about. A router writes it
// when it applies a map; a row only ever moves to a higher version, so a
// late write of an older map changes nothing. A cluster's own vshards are
// the rows naming it; the rows naming other clusters let any one surviving
// cluster vouch for the whole newest map.
const createVShardOwner = `CREATE TABLE IF NOT EXISTS vshard_owner (
  vshard SMALLINT UNSIGNED NOT NULL,
  cluster VARBINARY(128) NOT NULL,
  map_version BIGINT NOT NULL,
  frozen TINYINT(1) NOT NULL DEFAULT 0,
  recorded_at DATETIME(6) NOT NULL,
  PRIMARY KEY (vshard)
) ENGINE=InnoDB`

// VShardOwner is one row of vshard_owner.
type VShardOwner struct {
	VShard     int
	Cluster    string
	MapVersion int64
	Frozen     bool
}

// recordVShardOwners upserts rows, each only where its version is newer
// than the stored one.
const recordVShardOwners = `INSERT INTO vshard_owner (vshard, cluster, map_version, frozen, recorded_at) VALUES %s
ON DUPLICATE KEY UPDATE
  cluster = IF(VALUES(map_version) > map_version, VALUES(cluster), cluster),
  frozen = IF(VALUES(map_version) > map_version, VALUES(frozen), frozen),
  recorded_at = IF(VALUES(map_version) > map_version, VALUES(recorded_at), recorded_at),
  map_version = GREATEST(map_version, VALUES(map_version))`

// RecordVShardOwners writes the owners of a shard map (every vshard, the
// same version) in one statement.
func (s *Store) RecordVShardOwners(ctx context.Context, owners []VShardOwner, at time.Time) error {
	if len(owners) == 0 {
		return nil
	}
	values := placeholders(len(owners), 5)
	args := make([]any, 0, 5*len(owners))
	for _, o := range owners {
		args = append(args, o.VShard, o.Cluster, o.MapVersion, o.Frozen, at.UTC())
	}
	if _, err := s.db.ExecContext(ctx, fmt.Sprintf(recordVShardOwners, values), args...); err != nil {
		return fmt.Errorf("record vshard owners: %w", translate(err))
	}
	return nil
}

// selectVShardOwners reads the whole record.
const selectVShardOwners = `SELECT vshard, cluster, map_version, frozen FROM vshard_owner ORDER BY vshard`

// VShardOwners reads this primary's record; none when the table was never
// written (or does not exist yet: a cluster that predates it).
func (s *Store) VShardOwners(ctx context.Context) ([]VShardOwner, error) {
	out, err := queryRows(ctx, s.db, "read vshard owners", selectVShardOwners, nil, func(rows *sql.Rows) (VShardOwner, error) {
		var o VShardOwner
		err := rows.Scan(&o.VShard, &o.Cluster, &o.MapVersion, &o.Frozen)
		return o, err
	})
	if err != nil {
		var me *mysql.MySQLError
		if errors.As(err, &me) && me.Number == errNoSuchTable {
			return nil, nil
		}
		return nil, translate(err)
	}
	return out, nil
}
