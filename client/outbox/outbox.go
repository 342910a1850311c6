// Package outbox is the transactional outbox of a service that produces
// to shardmq (seed 001, DESIGN §9): the message is written to a table of
// the service's own MySQL database in the same transaction as the business
// change, and a Relay publishes it afterwards.
//
// A Relay claims due rows with a time-limited lease (locked_by,
// claim_token, locked_until — every condition checked in SQL), publishes
// them with the row's identity (msg_key) as the message key, and marks a
// row published only after the router answered created or duplicate. A
// relay that dies between publishing and marking leaves the row to be
// published again once its lease expires: the router answers duplicate
// for the same key, so the re-publish stores nothing twice. Several relays
// may run at once; they skip each other's rows.
package outbox

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/go-sql-driver/mysql"
)

// Migrate creates the outbox table in the service's database (idempotent).
// Run it with the service's other migrations.
func Migrate(ctx context.Context, db *sql.DB) error {
	if _, err := db.ExecContext(ctx, sqlCreate); err != nil {
		return fmt.Errorf("creating %s: %w", Table, err)
	}
	return nil
}

// ErrDuplicateKey is answered by Enqueue for a key already in the outbox
// on that topic.
var ErrDuplicateKey = errors.New("outbox: key already enqueued on this topic")

// Execer is what Enqueue needs of the business transaction (*sql.Tx).
type Execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// Enqueue writes msg to the outbox inside tx, the business transaction:
// it is published if and only if tx commits. It answers the message key:
// msg.Key when set (name the business fact: "order-42-paid"), else a new
// random identity "ob-<32 hex>". A DelayMS becomes a DeliverAt from now,
// so a late publish does not delay the message again.
func Enqueue(ctx context.Context, tx Execer, topic string, msg Message) (string, error) {
	if msg.Key == "" {
		var b [16]byte
		if _, err := rand.Read(b[:]); err != nil {
			return "", fmt.Errorf("outbox: making a key: %w", err)
		}
		msg.Key = "ob-" + hex.EncodeToString(b[:])
	}
	if msg.DelayMS > 0 && msg.DeliverAt == "" {
		msg.DeliverAt = time.Now().Add(time.Duration(msg.DelayMS) * time.Millisecond).UTC().Format(time.RFC3339Nano)
		msg.DelayMS = 0
	}
	data, err := json.Marshal(msg)
	if err != nil {
		return "", fmt.Errorf("outbox: encoding message %q: %w", msg.Key, err)
	}
	if _, err := tx.ExecContext(ctx, sqlInsert, topic, msg.Key, data); err != nil {
		var me *mysql.MySQLError
		if errors.As(err, &me) && me.Number == 1062 {
			return "", fmt.Errorf("enqueue %q on %s: %w", msg.Key, topic, ErrDuplicateKey)
		}
		return "", fmt.Errorf("enqueue %q on %s: %w", msg.Key, topic, err)
	}
	return msg.Key, nil
}

// Counts are the outbox's rows by status.
type Counts struct{ Pending, Published, Dead int }

// Count counts the outbox's rows by status.
func Count(ctx context.Context, db *sql.DB) (Counts, error) {
	rows, err := db.QueryContext(ctx, sqlCounts)
	if err != nil {
		return Counts{}, fmt.Errorf("counting %s: %w", Table, err)
	}
	defer rows.Close()
	var c Counts
	for rows.Next() {
		var s string
		var n int
		if err := rows.Scan(&s, &n); err != nil {
			return Counts{}, fmt.Errorf("counting %s: %w", Table, err)
		}
		switch s {
		case "pending":
			c.Pending = n
		case "published":
			c.Published = n
		case "dead":
			c.Dead = n
		}
	}
	return c, rows.Err()
}

// Purge deletes up to limit published rows published more than age ago,
// answering how many it deleted. Call it in a loop off-peak.
func Purge(ctx context.Context, db *sql.DB, age time.Duration, limit int) (int64, error) {
	n, err := execReadCommitted(ctx, db, sqlPurge, age.Microseconds(), limit)
	if err != nil {
		return 0, fmt.Errorf("purging %s: %w", Table, err)
	}
	return n, nil
}

// Redrive makes every dead row pending again with its attempts reset
// (after the cause was fixed), answering how many.
func Redrive(ctx context.Context, db *sql.DB) (int64, error) {
	n, err := execReadCommitted(ctx, db, sqlRedrive)
	if err != nil {
		return 0, fmt.Errorf("redriving %s: %w", Table, err)
	}
	return n, nil
}

// beginReadCommitted starts a transaction at READ COMMITTED, the level of
// every statement the relay and the upkeep functions run on the outbox.
// At the default REPEATABLE READ, their range scans (the claim's
// FOR UPDATE SKIP LOCKED over the pending rows, the unlock of expired
// leases, the purge) take next-key locks, which lock the gap where the
// business transaction's Enqueue inserts its row: the Enqueue waited
// for the relay while the relay could wait for a row the same business
// transaction had inserted earlier — InnoDB answered one of them 1213,
// deadlock. READ COMMITTED takes no gap locks on scans, and its UPDATEs
// skip rows whose newest version is uncommitted (semi-consistent reads),
// so the relay never blocks an Enqueue and never waits for one. It needs
// the service's binlog_format to be ROW or MIXED, the defaults of MySQL 8
// and MariaDB.
func beginReadCommitted(ctx context.Context, db *sql.DB) (*sql.Tx, error) {
	return db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
}

// execReadCommitted runs one statement in its own READ COMMITTED
// transaction, answering the rows it affected.
func execReadCommitted(ctx context.Context, db *sql.DB, query string, args ...any) (int64, error) {
	tx, err := beginReadCommitted(ctx, db)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback()
	res, err := tx.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, err
	}
	return n, tx.Commit()
}
