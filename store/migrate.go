package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
)

// migration is one versioned schema change. Statements are generated at
// apply time so that month partitions start around the current month.
type migration struct {
	version int
	name    string
	stmts   func(now time.Time) []string // nil: then alone
	// then, when set, runs after stmts, on the same connection: a step
	// that depends on what the cluster holds.
	then func(ctx context.Context, conn *sql.Conn) error
}

// migrations is the schema history, oldest first. Never edit an applied
// migration; add a new one.
var migrations = []migration{
	{1, "initial tables", func(now time.Time) []string {
		return []string{createMessageKey, createMessageStore(now), createMessageQueue, createMessageTrace(now)}
	}, nil},
	{2, "replica lag heartbeat", func(time.Time) []string { return []string{createHeartbeat} }, nil},
	{3, "subscriptions and dead-letter archive", func(time.Time) []string {
		return []string{createSubscription, createDeadLetterArchive}
	}, nil},
	{4, "vshard owner record", func(time.Time) []string { return []string{createVShardOwner} }, nil},
	{5, "request id of trace events", func(time.Time) []string { return []string{addRequestIDColumn} }, nil},
	// 6–9 are another branch's. 10–13: retention (docs/retention.md).
	{10, "warm archive of messages", func(time.Time) []string { return []string{createArchiveMessage} }, nil},
	{11, "warm archive of trace events", func(time.Time) []string { return []string{createArchiveTrace} }, nil},
	{12, "index of messages in cold files", func(time.Time) []string { return []string{createArchiveColdIndex} }, nil},
	{13, "retention job state", func(time.Time) []string { return []string{createRetentionState} }, nil},
	{14, "delivery owners and router members", func(time.Time) []string { return []string{createDeliveryOwner, createRouterMember} }, nil},
	{15, "delivery owners' leases apart", func(time.Time) []string { return []string{createDeliveryLease, copyOwnerLeases, dropOwnerLeaseColumns} }, nil},
	{16, "shard fence", func(time.Time) []string { return []string{createShardFence, seedShardFence} }, nil},
	{17, "reshard leaders' sessions", func(time.Time) []string { return []string{createReshardSession} }, nil},
	{18, "the final ack on the message row", func(time.Time) []string { return []string{addAckedColumns, addArchivedAckedColumns} }, nil},
	{version: 19, name: "the final ack's slot", then: addAckSlots},
	{version: 20, name: "message_store rebuilt when small", then: rebuildSmallMessageStore},
	{version: 21, name: "routers' schema versions", then: func(ctx context.Context, conn *sql.Conn) error {
		return addColumnIfMissing(ctx, conn, "router_member", "schema_version", addMemberSchemaVersion)
	}},
	{version: 22, name: "routers' schema versions in their heartbeats", then: func(ctx context.Context, conn *sql.Conn) error {
		return addColumnIfMissing(ctx, conn, "heartbeat", "schema_version", addHeartbeatSchemaVersion)
	}},
	{version: 23, name: "ordered deliveries' heads in their own table", then: createOrderTable},
}

// createOrderTable creates message_order and fills it, and drops
// idx_order at once when no router older than OrderTableSince is live;
// else the first beat that finds none drops it (message_order.go).
func createOrderTable(ctx context.Context, conn *sql.Conn) error {
	if _, err := conn.ExecContext(ctx, createMessageOrder); err != nil {
		return fmt.Errorf("create message_order: %w", err)
	}
	if _, err := conn.ExecContext(ctx, fillMessageOrder); err != nil {
		return fmt.Errorf("fill message_order: %w", err)
	}
	_, err := dropOrderIndex(ctx, conn, false)
	return err
}

// AckSlotsSince is the migration since which routers read the final ack's
// slot: a live member of an older version turns the slot off
// (Store.SetAckSlots).
const AckSlotsSince = 19

// addColumnIfMissing runs ddl, which adds column to table, unless the
// column is there: DDL commits on its own, so a migration cut short after
// it runs again whole.
func addColumnIfMissing(ctx context.Context, conn *sql.Conn, table, column, ddl string) error {
	var n int
	if err := conn.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.COLUMNS
WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND COLUMN_NAME = ?`, table, column).Scan(&n); err != nil {
		return fmt.Errorf("read %s's columns: %w", table, err)
	}
	if n > 0 {
		return nil
	}
	if _, err := conn.ExecContext(ctx, ddl); err != nil {
		return fmt.Errorf("add %s.%s: %w", table, column, err)
	}
	return nil
}

// addAckSlots adds the final ack's slot to message_store and
// archive_message, each only if it is missing: DDL commits on its own, so
// a migration cut short between the two statements runs again whole.
func addAckSlots(ctx context.Context, conn *sql.Conn) error {
	if err := addColumnIfMissing(ctx, conn, "message_store", "ack_slot", addAckSlot); err != nil {
		return err
	}
	return addColumnIfMissing(ctx, conn, "archive_message", "ack_slot", addArchivedAckSlot)
}

// rebuildSmallMessageStore rebuilds message_store when it is small (at
// most ackSlotRebuildMax rows and ackSlotRebuildBytes of data), so that
// every row stores the final ack's slot whole and acks write it in place
// (ack_slot.go); a fresh cluster's empty table is rebuilt at once. The
// rebuild needs the table's metadata lock, and statements on the table
// queue behind a DDL that waits for it: it waits at most
// ackSlotRebuildLockWait, and when that passes (a long transaction on the
// table) the table is left as it is. A bigger table, or one left so, keeps
// the instant column: its operator rebuilds it when convenient
// (docs/operations.md, "Schema upgrades").
func rebuildSmallMessageStore(ctx context.Context, conn *sql.Conn) error {
	var n int
	q := fmt.Sprintf("SELECT COUNT(*) FROM (SELECT 1 FROM message_store LIMIT %d) t", ackSlotRebuildMax+1)
	if err := conn.QueryRowContext(ctx, q).Scan(&n); err != nil {
		return fmt.Errorf("count message_store: %w", err)
	}
	var size int64
	if err := conn.QueryRowContext(ctx, `SELECT COALESCE(SUM(DATA_LENGTH), 0) FROM information_schema.TABLES
WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'message_store'`).Scan(&size); err != nil {
		return fmt.Errorf("size message_store: %w", err)
	}
	if n > ackSlotRebuildMax || size > ackSlotRebuildBytes {
		return nil
	}
	if _, err := conn.ExecContext(ctx, fmt.Sprintf("SET SESSION lock_wait_timeout = %d", int(ackSlotRebuildLockWait.Seconds()))); err != nil {
		return fmt.Errorf("bound the rebuild's lock wait: %w", err)
	}
	defer conn.ExecContext(context.WithoutCancel(ctx), "SET SESSION lock_wait_timeout = DEFAULT")
	if _, err := conn.ExecContext(ctx, rebuildMessageStore); err != nil {
		var me *mysql.MySQLError
		if errors.As(err, &me) && me.Number == errLockWait {
			return nil
		}
		return fmt.Errorf("rebuild message_store: %w", err)
	}
	return nil
}

// SchemaVersion is the newest migration this build knows.
func SchemaVersion() int { return migrations[len(migrations)-1].version }

const createSchemaMigrations = `CREATE TABLE IF NOT EXISTS schema_migrations (
  version INT NOT NULL PRIMARY KEY,
  name VARCHAR(128) NOT NULL,
  applied_at DATETIME(6) NOT NULL
) ENGINE=InnoDB`

// Migrate applies the migrations this cluster lacks, in order, each once.
// It holds a named lock so that routers starting together do not race, and
// records each applied version in schema_migrations. Replicas get the schema
// through replication.
func (s *Store) Migrate(ctx context.Context, now time.Time) error {
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("migrate: %w", translate(err))
	}
	defer conn.Close()
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK('shardmq_migrate', 60)").Scan(&got); err != nil || got.Int64 != 1 {
		return fmt.Errorf("migrate: take lock: %w", translate(err))
	}
	defer conn.ExecContext(context.WithoutCancel(ctx), "SELECT RELEASE_LOCK('shardmq_migrate')")
	if _, err := conn.ExecContext(ctx, createSchemaMigrations); err != nil {
		return fmt.Errorf("migrate: create schema_migrations: %w", translate(err))
	}
	versions, err := queryRows(ctx, conn, "migrate: read versions", "SELECT version FROM schema_migrations", nil, scanOne[int])
	if err != nil {
		return translate(err)
	}
	applied := map[int]bool{}
	for _, v := range versions {
		applied[v] = true
	}
	for _, m := range migrations {
		if applied[m.version] {
			continue
		}
		var stmts []string
		if m.stmts != nil {
			stmts = m.stmts(now.UTC())
		}
		for _, stmt := range stmts {
			if _, err := conn.ExecContext(ctx, stmt); err != nil {
				return fmt.Errorf("migrate: version %d (%s): %w", m.version, m.name, translate(err))
			}
		}
		if m.then != nil {
			if err := m.then(ctx, conn); err != nil {
				return fmt.Errorf("migrate: version %d (%s): %w", m.version, m.name, translate(err))
			}
		}
		if _, err := conn.ExecContext(ctx, "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)", m.version, m.name, now.UTC()); err != nil {
			return fmt.Errorf("migrate: record version %d: %w", m.version, translate(err))
		}
	}
	// A cluster that kept idx_order (an older router was live at its
	// migration) drops it at a router's start once none is: routers that
	// advertise no address beat no membership, and so never drop it in
	// the background.
	if _, err := dropOrderIndex(ctx, conn, true); err != nil {
		return fmt.Errorf("migrate: %w", translate(err))
	}
	present, err := orderIndexPresent(ctx, conn)
	if err != nil {
		return fmt.Errorf("migrate: %w", translate(err))
	}
	s.orderTable.Store(!present)
	return nil
}

// MonthPartitions returns the PARTITION BY clause for a table partitioned by
// month on column col: the previous month, this month and the next three,
// plus a catch-all so that a write never fails for want of a partition. The
// partition upkeep job splits the catch-all ahead of time. It is exported
// for the load tester's floor, whose tables are partitioned as the
// product's are.
func MonthPartitions(col string, now time.Time) string {
	first := time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC).AddDate(0, -1, 0)
	var parts []string
	for i := 0; i < 5; i++ {
		m := first.AddDate(0, i, 0)
		next := m.AddDate(0, 1, 0)
		parts = append(parts, fmt.Sprintf("PARTITION p%s VALUES LESS THAN ('%s')", m.Format("200601"), next.Format("2006-01-02")))
	}
	parts = append(parts, "PARTITION pmax VALUES LESS THAN (MAXVALUE)")
	return fmt.Sprintf("PARTITION BY RANGE COLUMNS(%s) (\n  %s\n)", col, strings.Join(parts, ",\n  "))
}
