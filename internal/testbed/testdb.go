package testbed

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"testing"
)

// TestDatabase creates a database of its own for one test on every primary
// of b, named prefix plus random hex, and drops it when the test ends:
// tests sharing one bed isolate by database.
func TestDatabase(t testing.TB, b *Bed, prefix string) string {
	t.Helper()
	var rnd [4]byte
	rand.Read(rnd[:])
	name := prefix + hex.EncodeToString(rnd[:])
	if err := CreateDatabase(context.Background(), b, name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, c := range b.Clusters {
			_ = withConn(context.Background(), c.Primary, func(conn *sql.Conn) error {
				_, err := conn.ExecContext(context.Background(), fmt.Sprintf("DROP DATABASE IF EXISTS %s", quoteIdent(name)))
				return err
			})
		}
	})
	return name
}
