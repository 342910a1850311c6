package store

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/shardmq/shardmq/internal/ctxwait"
)

// The shapes every statement of this package is built from, written once:
// reading rows (queryEach, queryRows), a list of values (inList,
// appendArgs, vshardIn), a list of rows (placeholders), a write that
// counts its rows (execCount) and a large change in short transactions
// (inBatches). The statements
// themselves stay in the file of their table. docs/design.md says why this
// is a helper rather than generated code.

// queryer is what reads need: a pool, a connection or a transaction.
type queryer interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// queryEach runs query and calls each for every row, in order; what names
// the read in the error of any step (the query, a scan, the rows' end).
func queryEach(ctx context.Context, q queryer, what, query string, args []any, each func(*sql.Rows) error) error {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	defer rows.Close()
	for rows.Next() {
		if err := each(rows); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// queryRows is queryEach that collects what scan makes of each row.
func queryRows[T any](ctx context.Context, q queryer, what, query string, args []any, scan func(*sql.Rows) (T, error)) ([]T, error) {
	var out []T
	err := queryEach(ctx, q, what, query, args, func(rows *sql.Rows) error {
		v, err := scan(rows)
		if err != nil {
			return err
		}
		out = append(out, v)
		return nil
	})
	return out, err
}

// queryMap is queryEach that indexes what scan makes of each row by the
// key it returns (a later row with the same key wins).
func queryMap[K comparable, V any](ctx context.Context, q queryer, what, query string, args []any, scan func(*sql.Rows) (K, V, error)) (map[K]V, error) {
	out := map[K]V{}
	err := queryEach(ctx, q, what, query, args, func(rows *sql.Rows) error {
		k, v, err := scan(rows)
		if err != nil {
			return err
		}
		out[k] = v
		return nil
	})
	return out, err
}

// scanOne reads a row of one column.
func scanOne[T any](rows *sql.Rows) (T, error) {
	var v T
	err := rows.Scan(&v)
	return v, err
}

// inList returns "?,?,?" with n marks, the inside of an IN (…) list.
func inList(n int) string {
	if n <= 0 {
		return ""
	}
	return strings.Repeat("?,", n-1) + "?"
}

// appendArgs appends vs to args, the arguments of an IN list.
func appendArgs[T any](args []any, vs []T) []any {
	for _, v := range vs {
		args = append(args, v)
	}
	return args
}

// placeholders returns "(?,?,?),(?,?,?)" for rows rows of n columns: the
// VALUES of a multi-row insert, or a list of tuples for (a, b) IN (…).
func placeholders(rows, n int) string {
	one := "(" + inList(n) + ")"
	var b strings.Builder
	b.Grow(rows * (len(one) + 1))
	for i := 0; i < rows; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(one)
	}
	return b.String()
}

// pairsIn is the condition "(a, b) IN ((?, ?), …)" for n pairs — but
// "(a = ? AND b = ?)" for one: MariaDB turns a one-pair list into a row
// equality that its UPDATE and DELETE cannot use an index for, and reads
// the whole table (1.3 million rows, 2.3 s, for one message's status on
// a grown sandbox), where SELECT finds the row by its key.
func pairsIn(a, b string, n int) string {
	if n == 1 {
		return "(" + a + " = ? AND " + b + " = ?)"
	}
	return "(" + a + ", " + b + ") IN (" + placeholders(n, 2) + ")"
}

// vshardIn appends " AND col IN (…)" for vshards (nothing when empty).
func vshardIn(b *strings.Builder, args []any, col string, vshards []uint16) []any {
	if len(vshards) == 0 {
		return args
	}
	b.WriteString(" AND " + col + " IN (" + inList(len(vshards)) + ")")
	return appendArgs(args, vshards)
}

// upsertRows writes rows (each in cols' order) into table, in statements
// (each its own transaction) that stay within the server's
// max_allowed_packet: a row whose key is already there takes the values of
// the update columns, so writing the same rows twice (a resumed copy) is
// harmless. op names the retry hook.
func (s *Store) upsertRows(ctx context.Context, op, table string, cols, update []string, rows []MoveRow) error {
	if len(rows) == 0 {
		return nil
	}
	budget, err := s.copyBudget(ctx)
	if err != nil {
		return err
	}
	for _, part := range byBytes(rows, budget) {
		if err := s.upsertStatement(ctx, op, table, cols, update, part); err != nil {
			return err
		}
	}
	return nil
}

// upsertStatement is one statement of upsertRows.
func (s *Store) upsertStatement(ctx context.Context, op, table string, cols, update []string, rows []MoveRow) error {
	var b strings.Builder
	b.WriteString("INSERT INTO " + table + " (" + strings.Join(cols, ", ") + ") VALUES " + placeholders(len(rows), len(cols)))
	b.WriteString(" ON DUPLICATE KEY UPDATE ")
	for i, c := range update {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(c + " = VALUES(" + c + ")")
	}
	args := make([]any, 0, len(rows)*len(cols))
	for _, r := range rows {
		if len(r) != len(cols) {
			return fmt.Errorf("write %s: a row of %d columns, want %d", table, len(r), len(cols))
		}
		args = append(args, r...)
	}
	q := b.String()
	return s.inTx(ctx, txAttempts, s.retryHook(op), func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, q, args...); err != nil {
			return fmt.Errorf("write %s: %w", table, err)
		}
		return nil
	})
}

// execCount runs a statement in tx and returns how many rows it changed;
// what names it in the error.
func execCount(ctx context.Context, tx *sql.Tx, what, query string, args ...any) (int64, error) {
	res, err := tx.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", what, err)
	}
	return res.RowsAffected()
}

// inBatches runs batch in a transaction of its own (retried on deadlock
// like every other) again and again until one handles fewer than limit
// rows, waiting pause between them (a throttle; 0 for none), so that a
// large redrive, purge, archive or delete never holds many locks for
// long. batch returns how many rows it handled; the total is returned,
// with what committed before an error. op names the retry hook.
func (s *Store) inBatches(ctx context.Context, op string, limit int, pause time.Duration, batch func(tx *sql.Tx) (int, error)) (int64, error) {
	var total int64
	for {
		var n int
		err := s.inTx(ctx, txAttempts, s.retryHook(op), func(tx *sql.Tx) error {
			var err error
			n, err = batch(tx)
			return err
		})
		if err != nil {
			return total, err
		}
		total += int64(n)
		if n < limit {
			return total, nil
		}
		if err := ctxwait.Sleep(ctx, pause); err != nil {
			return total, err
		}
	}
}
