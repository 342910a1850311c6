// Package ordersvc is seed 001's story as two small services: an order
// service that records an order and, in the same transaction, the intent
// to award points (client/outbox), and a points service that applies each
// award once (client/inbox). examples/orders runs them over the sandbox;
// the crash test in this package kills their relay and consumer at every
// point where a crash matters.
package ordersvc

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/go-sql-driver/mysql"

	"github.com/shardmq/shardmq/client"
	"github.com/shardmq/shardmq/client/outbox"
)

// Topic carries the points awards.
const Topic = "orders.points"

// Subscription is the points service's subscription.
const Subscription = "points"

// Award is the message: points for a user, because of an order.
type Award struct {
	OrderID int64 `json:"order_id"`
	UserID  int64 `json:"user_id"`
	Points  int64 `json:"points"`
}

// MigrateOrders creates the order service's tables: its orders and the
// outbox.
func MigrateOrders(ctx context.Context, db *sql.DB) error {
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS orders (
  id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
  user_id BIGINT NOT NULL,
  amount_cents BIGINT NOT NULL,
  status VARCHAR(16) NOT NULL,
  created_at DATETIME(6) NOT NULL) ENGINE=InnoDB`); err != nil {
		return fmt.Errorf("creating orders: %w", err)
	}
	return outbox.Migrate(ctx, db)
}

// MigratePoints creates the points service's tables: a ledger of changes
// (deliberately without a unique key per order, so that a duplicate would
// show), the balances, and the inbox.
func MigratePoints(ctx context.Context, db *sql.DB) error {
	for _, q := range []string{
		`CREATE TABLE IF NOT EXISTS points_ledger (
  id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
  order_id BIGINT NOT NULL,
  user_id BIGINT NOT NULL,
  delta BIGINT NOT NULL,
  KEY idx_order (order_id)) ENGINE=InnoDB`,
		`CREATE TABLE IF NOT EXISTS points_balance (
  user_id BIGINT NOT NULL PRIMARY KEY,
  points BIGINT NOT NULL) ENGINE=InnoDB`,
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("creating the points tables: %w", err)
		}
	}
	return inboxMigrate(ctx, db)
}

// PlaceOrder records an order and its points award in one transaction of
// the order service's database. The award's key names the business fact,
// order-<id>-points: it is the outbox row's identity and the message key.
// A transaction InnoDB rolled back (deadlock, lock wait timeout: the
// relays lock outbox rows too) runs again, up to 5 times.
func PlaceOrder(ctx context.Context, db *sql.DB, userID, amountCents int64) (int64, error) {
	for attempt := 1; ; attempt++ {
		id, err := placeOrder(ctx, db, userID, amountCents)
		var me *mysql.MySQLError
		if attempt < 5 && errors.As(err, &me) && (me.Number == 1213 || me.Number == 1205) {
			continue
		}
		return id, err
	}
}

func placeOrder(ctx context.Context, db *sql.DB, userID, amountCents int64) (int64, error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("place order: %w", err)
	}
	defer tx.Rollback()
	res, err := tx.ExecContext(ctx, `INSERT INTO orders (user_id, amount_cents, status, created_at) VALUES (?, ?, 'placed', NOW(6))`, userID, amountCents)
	if err != nil {
		return 0, fmt.Errorf("place order: %w", err)
	}
	id, err := res.LastInsertId()
	if err != nil {
		return 0, fmt.Errorf("place order: %w", err)
	}
	payload, _ := json.Marshal(Award{OrderID: id, UserID: userID, Points: amountCents / 100})
	if _, err := outbox.Enqueue(ctx, tx, Topic, client.Message{Key: fmt.Sprintf("order-%d-points", id), Payload: payload}); err != nil {
		return 0, fmt.Errorf("place order: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("place order: commit: %w", err)
	}
	return id, nil
}

// ApplyAward is the points service's business change, run by the inbox
// inside its transaction.
func ApplyAward(ctx context.Context, d *client.Delivery, tx *sql.Tx) error {
	var a Award
	if err := json.Unmarshal(d.Body(), &a); err != nil {
		return &client.HandlerError{Code: "E_BAD_AWARD", Err: err}
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO points_ledger (order_id, user_id, delta) VALUES (?, ?, ?)`, a.OrderID, a.UserID, a.Points); err != nil {
		return fmt.Errorf("ledger: %w", err)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO points_balance (user_id, points) VALUES (?, ?) ON DUPLICATE KEY UPDATE points = points + VALUES(points)`, a.UserID, a.Points); err != nil {
		return fmt.Errorf("balance: %w", err)
	}
	return nil
}

// Tally compares the two services' databases.
type Tally struct {
	Orders int
	// Changes counts points changes; Duplicates the changes beyond the
	// first of an order; Missing the orders without one.
	Changes, Duplicates, Missing int
}

func (t Tally) String() string {
	return fmt.Sprintf("orders: %d, points changes: %d, duplicates: %d", t.Orders, t.Changes, t.Duplicates)
}

// Count tallies orders against points changes. The databases are
// separate, so the comparison is made here, not in SQL.
func Count(ctx context.Context, orders, points *sql.DB) (Tally, error) {
	var t Tally
	if err := orders.QueryRowContext(ctx, `SELECT COUNT(*) FROM orders`).Scan(&t.Orders); err != nil {
		return t, fmt.Errorf("counting orders: %w", err)
	}
	var distinct int
	if err := points.QueryRowContext(ctx, `SELECT COUNT(*), COUNT(DISTINCT order_id) FROM points_ledger`).Scan(&t.Changes, &distinct); err != nil {
		return t, fmt.Errorf("counting points changes: %w", err)
	}
	t.Duplicates = t.Changes - distinct
	t.Missing = t.Orders - distinct
	return t, nil
}
