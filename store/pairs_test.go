package store

import (
	"context"
	"database/sql/driver"
	"strings"
	"testing"
	"time"

	"github.com/shardmq/shardmq/internal/testbed"
)

// A statement naming messages by id finds them by their key whatever
// their number: one id written as a one-pair row list made MariaDB's
// UPDATE and DELETE read the whole table.
func TestStatementsByIDUseTheKey(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	f := setup(t)
	var ids []uint64
	for range 10 {
		ids = append(ids, f.produce(t, 500, "", "s")...)
	}
	for _, n := range []int{1, 2, 20} {
		for _, verb := range []string{"UPDATE message_store SET msg_status = 1 WHERE ", "DELETE FROM message_store WHERE ", "SELECT id FROM message_store WHERE "} {
			var b strings.Builder
			b.WriteString(verb)
			args := idList(&b, nil, ids[:n])
			for _, row := range explain(t, f.st.db, b.String(), args...) {
				if typ := row["type"]; typ == "ALL" || typ == "index" {
					t.Errorf("%s%d ids: access type %s, a scan of the whole table", verb, n, typ)
				}
			}
		}
	}
}

// mysqlValue makes of each type it takes what the driver's own checker
// makes of it, and leaves the other types to the checker.
func TestMySQLValueIsTheDriversConversion(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	f := setup(t)
	conn, err := f.st.db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	err = conn.Raw(func(dc any) error {
		checker := dc.(driver.NamedValueChecker)
		for _, a := range []any{uint64(0), uint64(255), uint64(1 << 63), uint16(0), uint16(1023), uint16(65535), 0, 9, -1, 1 << 40} {
			got, ok := mysqlValue(a)
			nv := driver.NamedValue{Ordinal: 1, Value: a}
			if err := checker.CheckNamedValue(&nv); err != nil || !ok || got != nv.Value {
				t.Errorf("%T %v: mysqlValue %T %v (%v), the driver %T %v (%v)", a, a, got, got, ok, nv.Value, nv.Value, err)
			}
		}
		for _, a := range []any{"s", []byte("b"), time.Time{}, nil, int64(5), true, uint32(7)} {
			if _, ok := mysqlValue(a); ok {
				t.Errorf("mysqlValue took %T", a)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
