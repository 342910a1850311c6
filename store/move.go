package store

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"
)

// Moving vshards between clusters (resharding). Every table that holds
// rows of a vshard describes itself with a moveTable (beside its CREATE
// TABLE, in its own file); the statements below are built from those
// descriptions, the same shape for every table: read rows of a vshard set in
// primary-key order, upsert them on another cluster, compare per-bucket
// counts and checksums, and delete by primary key. Rows keep their identity
// (router-generated ids), so copying twice is harmless.
//
// Rows are bucketed by their router-generated id (or the message id they
// belong to) shifted right by moveBucketShift: ids start with milliseconds,
// so one bucket holds about a second of writes, and the rows that change
// while a copy runs are the recent ones, in few buckets.

// moveBucketShift turns an id into its bucket: 2^32 ids ≈ 1.05 s.
const moveBucketShift = 32

// moveTable describes one table for the resharding statements.
type moveTable struct {
	name  string
	cols  []string // every column, in the order rows are read and written
	pk    []string // primary key columns, in index order (a prefix of nothing in particular)
	idCol string   // router-generated id the rows are bucketed by
	// frozenOnly tables are copied only while the vshards are frozen:
	// their rows are claimable, so a copy on the target before the flip
	// could be delivered there.
	frozenOnly bool
}

// moveTables lists the tables of a vshard in the order they are copied:
// dedup keys first, so that a message is never on the target without its key.
var moveTables = []*moveTable{&messageKeyMove, &messageStoreMove, &messageTraceMove, &deadLetterArchiveMove, &messageQueueMove, &messageOrderMove}

// MoveTableInfo names a table that moves with its vshards.
type MoveTableInfo struct {
	Name string
	// FrozenOnly: copy only while the vshards are frozen (message_queue:
	// its rows are claimable wherever they are).
	FrozenOnly bool
	// Columns are the columns of a MoveRow, in order; Key the primary
	// key's; BucketBy the router-generated id that MoveBuckets groups
	// rows by (shifted right by 32). A fake Mover lays its rows out so.
	Columns  []string
	Key      []string
	BucketBy string
}

// MoveTables lists the tables that hold vshard rows, in copy order.
func MoveTables() []MoveTableInfo {
	out := make([]MoveTableInfo, len(moveTables))
	for i, t := range moveTables {
		out[i] = MoveTableInfo{Name: t.name, FrozenOnly: t.frozenOnly, Columns: append([]string(nil), t.cols...),
			Key: append([]string(nil), t.pk...), BucketBy: t.idCol}
	}
	return out
}

func moveTableNamed(name string) (*moveTable, error) {
	for _, t := range moveTables {
		if t.name == name {
			return t, nil
		}
	}
	return nil, fmt.Errorf("move: unknown table %q", name)
}

// MoveRow is one row in moveTable.cols order, as the driver returned it.
type MoveRow []any

// MoveCursor is the primary key of the last row read, as text (what a job
// records to resume); nil starts from the beginning.
type MoveCursor []string

// MoveBucket is one bucket's row count and checksum.
type MoveBucket struct {
	Rows int64
	Sum  string // SUM of CRC32 of every row, as decimal text
}

// rowText is the expression whose CRC32 / MD5 fingerprints a row: every
// column, NULL told apart from empty; a column of fingerprintOmits is left
// out while it holds its default.
func (t *moveTable) rowText() string {
	parts := make([]string, len(t.cols))
	for i, c := range t.cols {
		if def, ok := fingerprintOmits[c]; ok {
			parts[i] = "NULLIF(" + c + ", " + def + ")" // CONCAT_WS skips a NULL
			continue
		}
		parts[i] = "IFNULL(" + c + ", 0x1e)"
	}
	return "CONCAT_WS(0x1f, " + strings.Join(parts, ", ") + ")"
}

// fingerprintOmits are NOT NULL columns added after rows were
// fingerprinted (cold files' manifests keep those sums), with their
// default: a row that holds the default fingerprints as it did before the
// column existed. The final ack's slot (migration 19).
var fingerprintOmits = map[string]string{"ack_slot": "UNHEX(REPEAT('00', 64))"}

// pkIndex returns the positions of the primary key columns in cols.
func (t *moveTable) pkIndex() []int {
	out := make([]int, len(t.pk))
	for i, p := range t.pk {
		for j, c := range t.cols {
			if c == p {
				out[i] = j
			}
		}
	}
	return out
}

// afterCursor appends "(pk) > cursor" spelled as ORs of equalities, which
// both MariaDB and MySQL turn into index ranges.
func (t *moveTable) afterCursor(b *strings.Builder, args []any, cur MoveCursor) []any {
	if len(cur) == 0 {
		return args
	}
	b.WriteString(" AND (")
	for i := range t.pk {
		if i > 0 {
			b.WriteString(" OR ")
		}
		b.WriteByte('(')
		for j := 0; j < i; j++ {
			b.WriteString(t.pk[j] + " = ? AND ")
			args = append(args, cur[j])
		}
		b.WriteString(t.pk[i] + " > ?)")
		args = append(args, cur[i])
	}
	b.WriteByte(')')
	return args
}

func cursorText(v any) string {
	switch x := v.(type) {
	case []byte:
		return string(x)
	case time.Time:
		return x.UTC().Format("2006-01-02 15:04:05.999999")
	case nil:
		return ""
	default:
		return fmt.Sprint(x)
	}
}

// scanMoveRow reads a row of n columns as they come.
func scanMoveRow(n int) func(*sql.Rows) (MoveRow, error) {
	return func(rows *sql.Rows) (MoveRow, error) {
		r := make(MoveRow, n)
		ptrs := make([]any, n)
		for i := range r {
			ptrs[i] = &r[i]
		}
		err := rows.Scan(ptrs...)
		return r, err
	}
}

// onVShards starts a statement on table's rows of vshards: head (what
// comes before the table's name), the name, and the vshard condition.
func onVShards(table, head string, vshards []uint16) (*moveTable, *strings.Builder, []any, error) {
	t, err := moveTableNamed(table)
	if err != nil {
		return t, nil, nil, err
	}
	b := &strings.Builder{}
	b.WriteString(head + " " + t.name + " WHERE 1=1")
	return t, b, vshardIn(b, nil, "vshard", vshards), nil
}

// MoveCount counts table's rows of vshards.
func (s *Store) MoveCount(ctx context.Context, table string, vshards []uint16) (int64, error) {
	t, b, args, err := onVShards(table, "SELECT COUNT(*) FROM", vshards)
	if err != nil {
		return 0, err
	}
	var n int64
	if err := s.db.QueryRowContext(ctx, b.String(), args...).Scan(&n); err != nil {
		return 0, fmt.Errorf("count %s: %w", t.name, translate(err))
	}
	return n, nil
}

// MoveRead reads up to limit rows of vshards after cursor, in primary-key
// order, and the cursor of the last one (the same cursor when none). It
// returns fewer rows when theirs would make a statement too large to write
// as one (packet.go); only an empty answer means there are no more.
func (s *Store) MoveRead(ctx context.Context, table string, vshards []uint16, after MoveCursor, limit int) ([]MoveRow, MoveCursor, error) {
	return s.moveRead(ctx, table, vshards, after, limit, false)
}

// MoveReadKeys is MoveRead of the primary key columns only (for deletes).
func (s *Store) MoveReadKeys(ctx context.Context, table string, vshards []uint16, after MoveCursor, limit int) ([]MoveRow, MoveCursor, error) {
	return s.moveRead(ctx, table, vshards, after, limit, true)
}

func (s *Store) moveRead(ctx context.Context, table string, vshards []uint16, after MoveCursor, limit int, keysOnly bool) ([]MoveRow, MoveCursor, error) {
	t, err := moveTableNamed(table)
	if err != nil {
		return nil, nil, err
	}
	cols := t.cols
	if keysOnly {
		cols = t.pk
	}
	var b strings.Builder
	b.WriteString("SELECT " + strings.Join(cols, ", ") + " FROM " + t.name + " WHERE 1=1")
	args := vshardIn(&b, nil, "vshard", vshards)
	args = t.afterCursor(&b, args, after)
	b.WriteString(" ORDER BY " + strings.Join(t.pk, ", ") + " LIMIT ?")
	budget, err := s.copyBudget(ctx)
	if err != nil {
		return nil, nil, err
	}
	args = append(args, s.rowsWithin(t.name, limit, budget))
	out, _, err := s.readSized(ctx, "read "+t.name, b.String(), args, len(cols), budget)
	if err != nil {
		return nil, nil, translate(err)
	}
	if !keysOnly {
		s.noteRows(t.name, out)
	}
	if len(out) == 0 {
		return nil, after, nil
	}
	last := out[len(out)-1]
	idx := t.pkIndex()
	if keysOnly {
		idx = make([]int, len(t.pk))
		for i := range idx {
			idx[i] = i
		}
	}
	cur := make(MoveCursor, len(idx))
	for i, j := range idx {
		cur[i] = cursorText(last[j])
	}
	return out, cur, nil
}

// MoveWrite upserts rows (read by MoveRead from another cluster) into
// table: a row already there takes the values given. Rows go in as many
// statements as their size needs (each within the server's
// max_allowed_packet).
func (s *Store) MoveWrite(ctx context.Context, table string, rows []MoveRow) error {
	t, err := moveTableNamed(table)
	if err != nil {
		return err
	}
	var update []string
	for _, c := range t.cols {
		if !isPK(t, c) {
			update = append(update, c)
		}
	}
	return s.upsertRows(ctx, "move_write", t.name, t.cols, update, rows)
}

func isPK(t *moveTable, c string) bool {
	for _, p := range t.pk {
		if p == c {
			return true
		}
	}
	return false
}

// MoveDelete deletes rows by primary key (rows as MoveReadKeys returns
// them: the key columns only).
func (s *Store) MoveDelete(ctx context.Context, table string, keys []MoveRow) (int64, error) {
	t, err := moveTableNamed(table)
	if err != nil {
		return 0, err
	}
	if len(keys) == 0 {
		return 0, nil
	}
	var b strings.Builder
	b.WriteString("DELETE FROM " + t.name + " WHERE ")
	args := make([]any, 0, len(keys)*len(t.pk))
	one := "(" + strings.Join(t.pk, " = ? AND ") + " = ?)"
	for i, k := range keys {
		if i > 0 {
			b.WriteString(" OR ")
		}
		b.WriteString(one)
		args = append(args, k...)
	}
	q := b.String()
	var n int64
	err = s.inTx(ctx, txAttempts, s.retryHook("move_delete"), func(tx *sql.Tx) error {
		n, err = execCount(ctx, tx, "delete "+t.name, q, args...)
		return err
	})
	return n, err
}

// MoveBuckets returns the count and checksum of every bucket of table's
// rows of vshards.
func (s *Store) MoveBuckets(ctx context.Context, table string, vshards []uint16) (map[uint64]MoveBucket, error) {
	t, err := moveTableNamed(table)
	if err != nil {
		return nil, err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "SELECT %s >> %d AS bucket, COUNT(*), CAST(SUM(CRC32(%s)) AS CHAR) FROM %s WHERE 1=1",
		t.idCol, moveBucketShift, t.rowText(), t.name)
	args := vshardIn(&b, nil, "vshard", vshards)
	b.WriteString(" GROUP BY bucket")
	out, err := queryMap(ctx, s.db, "checksum "+t.name, b.String(), args, func(rows *sql.Rows) (k uint64, m MoveBucket, err error) {
		err = rows.Scan(&k, &m.Rows, &m.Sum)
		return k, m, err
	})
	if err != nil {
		return nil, translate(err)
	}
	return out, nil
}

// MoveBucketRows returns table's rows of vshards in one bucket, each with
// its MD5 fingerprint as the last column; keysOnly reads the primary key
// columns (and the fingerprint) only.
func (s *Store) MoveBucketRows(ctx context.Context, table string, vshards []uint16, bucket uint64, keysOnly bool) ([]MoveRow, error) {
	t, err := moveTableNamed(table)
	if err != nil {
		return nil, err
	}
	cols := t.cols
	if keysOnly {
		cols = t.pk
	}
	var b strings.Builder
	fmt.Fprintf(&b, "SELECT %s, MD5(%s) FROM %s WHERE %s BETWEEN ? AND ?", strings.Join(cols, ", "), t.rowText(), t.name, t.idCol)
	args := []any{bucket << moveBucketShift, bucket<<moveBucketShift | (1<<moveBucketShift - 1)}
	args = vshardIn(&b, args, "vshard", vshards)
	out, err := queryRows(ctx, s.db, "read "+t.name+" bucket", b.String(), args, scanMoveRow(len(cols)+1))
	if err != nil {
		return nil, translate(err)
	}
	return out, nil
}

// MoveKeyOf returns the primary key of a full row (as MoveRead or
// MoveBucketRows with keysOnly false return it).
func MoveKeyOf(table string, r MoveRow) (MoveRow, error) {
	t, err := moveTableNamed(table)
	if err != nil {
		return nil, err
	}
	idx := t.pkIndex()
	out := make(MoveRow, len(idx))
	for i, j := range idx {
		out[i] = r[j]
	}
	return out, nil
}

// MoveKeyText is a primary key as one comparable string.
func MoveKeyText(k MoveRow) string {
	parts := make([]string, len(k))
	for i, v := range k {
		parts[i] = cursorText(v)
	}
	return strings.Join(parts, "\x00")
}

// MoveDeleteVShards deletes table's rows of vshards in statements of at
// most limit rows each, with no read before: the fast way for a small
// table (message_queue) while the vshards are frozen. It returns how many
// rows it deleted.
func (s *Store) MoveDeleteVShards(ctx context.Context, table string, vshards []uint16, limit int) (int64, error) {
	t, b, args, err := onVShards(table, "DELETE FROM", vshards)
	if err != nil {
		return 0, err
	}
	b.WriteString(" LIMIT ?")
	args = append(args, limit)
	q := b.String()
	return s.inBatches(ctx, "move_delete", limit, 0, func(tx *sql.Tx) (int, error) {
		n, err := execCount(ctx, tx, "delete "+t.name, q, args...)
		return int(n), err
	})
}
