package store

import (
	"context"
	"database/sql"
	"fmt"
	"github.com/shardmq/shardmq/internal/testbed"
	"strings"
	"testing"
	"time"
)

// explain returns EXPLAIN's rows for query.
func explain(t *testing.T, db *sql.DB, query string, args ...any) []map[string]string {
	t.Helper()
	rows, err := db.Query("EXPLAIN "+query, args...)
	if err != nil {
		t.Fatalf("EXPLAIN %s: %v", query, err)
	}
	defer rows.Close()
	cols, _ := rows.Columns()
	var out []map[string]string
	for rows.Next() {
		vals := make([]sql.RawBytes, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			t.Fatal(err)
		}
		plan := map[string]string{}
		for i, c := range cols {
			plan[c] = string(vals[i])
		}
		out = append(out, plan)
	}
	return out
}

// rowsRead runs query in a transaction that is rolled back and returns how
// many index and table rows the server read for it (Handler_read_*), the
// real cost that EXPLAIN only estimates.
func rowsRead(t *testing.T, db *sql.DB, query string, args ...any) int {
	t.Helper()
	ctx := context.Background()
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	read := func() int {
		rows, err := conn.QueryContext(ctx, "SHOW SESSION STATUS LIKE 'Handler_read%'")
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		n := 0
		for rows.Next() {
			var name string
			var v int
			rows.Scan(&name, &v)
			if name != "Handler_read_rnd_deleted" {
				n += v
			}
		}
		return n
	}
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	before := read()
	rows, err := tx.QueryContext(ctx, query, args...)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
	}
	rows.Close()
	return read() - before
}

// TestClaimPlansWith100kReady checks every claim variant against the
// server's own plan with 100,000 ready deliveries present: the index that
// matches its ORDER BY, no filesort, and a number of rows read that is a
// small multiple of max.
func TestClaimPlansWith100kReady(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	if testing.Short() {
		t.Skip("loads 100k deliveries")
	}
	f := setup(t)
	ctx := context.Background()
	const total, keys, max = 100000, 1000, 100
	for start := 0; start < total; start += 1000 {
		var batch []ProduceItem
		for i := start; i < start+1000; i++ {
			it := f.item("t", fmt.Sprint("k", i), `1`, "plain", "ordered")
			it.Msg.Priority = i % 10
			it.Msg.OrderKey = fmt.Sprint("ok", i%keys)
			batch = append(batch, it)
		}
		if _, err := f.st.Produce(ctx, batch); err != nil {
			t.Fatal(err)
		}
	}
	// A few dead letters with two error codes, and some delayed rows.
	for i := 0; i < 300; i++ {
		code := "E_A"
		if i%2 == 0 {
			code = "E_B"
		}
		f.db.Exec("UPDATE message_queue SET is_dead = 1, dead_at = ?, error_code = ? WHERE subscription = 'plain' ORDER BY message_id DESC LIMIT 1 OFFSET ?", f.now, code, i)
	}
	f.db.Exec("ANALYZE TABLE message_queue")
	now := f.now.Add(time.Second)
	// A cursor in the middle of priority 5's deliveries.
	var mid uint64
	if err := f.db.QueryRow("SELECT message_id FROM message_queue WHERE subscription = 'plain' AND priority = 5 ORDER BY message_id LIMIT 1 OFFSET 5000").Scan(&mid); err != nil {
		t.Fatal(err)
	}

	cases := []struct {
		name  string
		query string
		args  []any
		index string
	}{
		{"unordered", claimQuery(false, 0), []any{"t", "plain", false, now, max}, "idx_claim"},
		{"ordered candidates", claimQuery(false, 0), []any{"t", "ordered", false, now, max}, "idx_claim"},
		{"delayed rows hidden", claimQuery(false, 0), []any{"t", "plain", false, f.now.Add(-time.Hour), max}, "idx_claim"},
		{"dead-letter channel", claimQuery(false, 0), []any{"t", "plain", true, now, max}, "idx_claim"},
		{"dead-letter channel by error code", claimQuery(true, 0), []any{"t", "plain", true, now, "E_A", max}, "idx_claim"},
		{"frozen vshards excluded", claimQuery(false, 2), []any{"t", "plain", false, now, 1, 2, max}, "idx_claim"},
		{"peek across clusters", peekQuery(false, 0), []any{"t", "plain", false, now, max}, "idx_claim"},
		{"peek of the dead-letter channel by error code", peekQuery(true, 1), []any{"t", "plain", true, now, "E_A", 1, max}, "idx_claim"},
		{"owner's scan from the top", scanClaimableQuery(false, 0), []any{"t", "plain", now, max}, "idx_claim"},
		{"owner's scan after a cursor", scanClaimableQuery(true, 0), []any{"t", "plain", now, 5, 5, mid, max}, "idx_claim"},
		{"owner's scan with frozen vshards", scanClaimableQuery(true, 2), []any{"t", "plain", now, 5, 5, mid, 1, 2, max}, "idx_claim"},
	}
	var heads []any
	for i := 0; i < max; i++ {
		heads = append(heads, "t", "ordered", fmt.Sprint("ok", i))
	}
	for _, c := range cases {
		for _, p := range explain(t, f.db, c.query, c.args...) {
			if p["key"] != c.index || strings.Contains(p["Extra"], "filesort") {
				t.Errorf("%s: plan %v, want %s without filesort", c.name, p, c.index)
			}
		}
		if n := rowsRead(t, f.db, c.query, c.args...); n > 4*max {
			t.Errorf("%s: read %d rows for a claim of %d", c.name, n, max)
		}
	}
	// A key's head is read from message_order's idx_head in id order, each
	// row joined to its delivery by primary key.
	want := map[string]string{"o": "idx_head", "q": "PRIMARY"}
	for _, p := range explain(t, f.db, orderHeadsQuery(max, true, false), heads...) {
		if strings.HasPrefix(p["table"], "<union") {
			continue
		}
		if p["key"] != want[p["table"]] || strings.Contains(p["Extra"], "filesort") {
			t.Errorf("order heads: plan %v, want %s without filesort", p, want[p["table"]])
		}
	}
	if n := rowsRead(t, f.db, orderHeadsQuery(max, true, false), heads...); n > 4*max {
		t.Errorf("order heads: read %d rows for %d keys", n, max)
	}
}
