package store

import (
	"context"
	"database/sql"
	"strconv"
	"testing"

	"github.com/shardmq/shardmq/internal/testbed"
)

// A transaction whose connection is killed before its COMMIT is rolled
// back by the server and runs again whole: its write is there once.
func TestTransactionRunsAgainAfterItsConnectionIsLost(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	if _, err := f.st.db.ExecContext(ctx, "CREATE TABLE lost_conn (id INT PRIMARY KEY, n INT NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	runs := 0
	err := f.st.inTx(ctx, txAttempts, nil, func(tx *sql.Tx) error {
		runs++
		if _, err := tx.ExecContext(ctx, "INSERT INTO lost_conn (id, n) VALUES (1, ?)", runs); err != nil {
			return err
		}
		if runs == 1 {
			var id uint64
			if err := tx.QueryRowContext(ctx, "SELECT CONNECTION_ID()").Scan(&id); err != nil {
				return err
			}
			if _, err := f.st.db.ExecContext(ctx, "KILL CONNECTION "+strconv.FormatUint(id, 10)); err != nil {
				t.Errorf("kill: %v", err)
			}
		}
		_, err := tx.ExecContext(ctx, "UPDATE lost_conn SET n = n + 100 WHERE id = 1")
		return err
	})
	if err != nil {
		t.Fatalf("the transaction did not run again: %v", err)
	}
	if runs != 2 {
		t.Fatalf("ran %d times, want 2", runs)
	}
	var rows, n int
	if err := f.st.db.QueryRowContext(ctx, "SELECT COUNT(*), MAX(n) FROM lost_conn").Scan(&rows, &n); err != nil || rows != 1 || n != 102 {
		t.Fatalf("%d rows, n %d (%v): want the second run's row only", rows, n, err)
	}
}
