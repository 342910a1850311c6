package store

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/go-sql-driver/mysql"
)

// heartbeat is how the router measures replica lag below a second: each
// router writes its own row on a cluster's primary every beat and reads it
// back on the replicas; the replica is at least as fresh as the newest beat
// it has applied. Seconds_Behind_Master alone is whole seconds, and it is
// NULL exactly when it matters (replication stopped). One row per router
// keeps every comparison on one clock.
const createHeartbeat = `CREATE TABLE IF NOT EXISTS heartbeat (
  router VARBINARY(64) NOT NULL,
  beat_at DATETIME(6) NOT NULL,
  PRIMARY KEY (router)
) ENGINE=InnoDB`

// addHeartbeatSchemaVersion records which migrations each router knows,
// every router, addressed or not (migration 22): an upgrade that must wait
// for older routers to leave looks here as well as at router_member.
const addHeartbeatSchemaVersion = `ALTER TABLE heartbeat ADD COLUMN schema_version INT NOT NULL DEFAULT 0`

// WriteHeartbeat records router's beat at at on this server (a primary),
// with the newest migration it knows.
// It fails on a read-only server, so it doubles as the check that a newly
// named primary is writable.
func (s *Store) WriteHeartbeat(ctx context.Context, router string, at time.Time) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO heartbeat (router, beat_at, schema_version) VALUES (?, ?, ?)
ON DUPLICATE KEY UPDATE beat_at = VALUES(beat_at), schema_version = VALUES(schema_version)`, router, at.UTC(), SchemaVersion())
	if err != nil {
		return fmt.Errorf("write heartbeat: %w", translate(err))
	}
	return nil
}

// ReadHeartbeat returns router's newest beat as this server (a replica) has
// applied it; ErrNotFound before the first one arrives.
func (s *Store) ReadHeartbeat(ctx context.Context, router string) (time.Time, error) {
	var at time.Time
	if err := s.db.QueryRowContext(ctx, "SELECT beat_at FROM heartbeat WHERE router = ?", router).Scan(&at); err != nil {
		var me *mysql.MySQLError
		if errors.As(err, &me) && me.Number == errNoSuchTable {
			// The replica has not applied the migration yet: no beat.
			return time.Time{}, fmt.Errorf("read heartbeat: %w (%v)", ErrNotFound, err)
		}
		return time.Time{}, fmt.Errorf("read heartbeat: %w", translate(err))
	}
	return at, nil
}

// errNoSuchTable is MySQL's ER_NO_SUCH_TABLE.
const errNoSuchTable = 1146

// PurgeHeartbeats deletes the rows of routers that have not beaten since
// before: routers that stopped or restarted under a new name.
func (s *Store) PurgeHeartbeats(ctx context.Context, before time.Time) error {
	if _, err := s.db.ExecContext(ctx, "DELETE FROM heartbeat WHERE beat_at < ?", before.UTC()); err != nil {
		return fmt.Errorf("purge heartbeats: %w", translate(err))
	}
	return nil
}

// ReplicationStatus is what a replica says of its replication threads.
type ReplicationStatus struct {
	// Replicating is false when the server replicates from nobody (a
	// primary, or a replica after RESET SLAVE ALL).
	Replicating bool
	IORunning   bool // the IO thread is connected to its primary
	SQLRunning  bool // the SQL thread applies what was fetched
	// SecondsBehind is Seconds_Behind_Master; -1 when the server does not
	// know (NULL: a thread is stopped or not connected).
	SecondsBehind int
	LastError     string // the last IO or SQL error, if any
}

// ReplicationStatus reads SHOW REPLICA STATUS (MariaDB ≥ 10.5.1 and MySQL ≥
// 8.0.22 both know it; their column names differ, both are read).
func (s *Store) ReplicationStatus(ctx context.Context) (ReplicationStatus, error) {
	rows, err := s.db.QueryContext(ctx, "SHOW REPLICA STATUS")
	if err != nil {
		return ReplicationStatus{}, fmt.Errorf("read replication status: %w", translate(err))
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return ReplicationStatus{}, fmt.Errorf("read replication status: %w", translate(err))
	}
	if !rows.Next() {
		return ReplicationStatus{}, translate(rows.Err())
	}
	// Copies, not sql.RawBytes: RawBytes keep the rows' lock held until
	// Close, and rows.Err below would then wait forever behind a close
	// started by the context ending meanwhile.
	vals := make([][]byte, len(cols))
	ptrs := make([]any, len(cols))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	if err := rows.Scan(ptrs...); err != nil {
		return ReplicationStatus{}, fmt.Errorf("read replication status: %w", translate(err))
	}
	col := make(map[string][]byte, len(cols))
	for i, c := range cols {
		col[c] = vals[i]
	}
	get := func(names ...string) (string, bool) {
		for _, n := range names {
			if v, ok := col[n]; ok {
				return string(v), v != nil
			}
		}
		return "", false
	}
	st := ReplicationStatus{Replicating: true, SecondsBehind: -1}
	io, _ := get("Slave_IO_Running", "Replica_IO_Running")
	sqlRun, _ := get("Slave_SQL_Running", "Replica_SQL_Running")
	st.IORunning, st.SQLRunning = io == "Yes", sqlRun == "Yes"
	if v, ok := get("Seconds_Behind_Master", "Seconds_Behind_Source"); ok {
		if n, err := strconv.Atoi(v); err == nil {
			st.SecondsBehind = n
		}
	}
	if v, _ := get("Last_SQL_Error"); v != "" {
		st.LastError = v
	} else if v, _ := get("Last_IO_Error"); v != "" {
		st.LastError = v
	}
	return st, rows.Err()
}
