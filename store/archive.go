package store

import (
	"context"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/shardmq/shardmq/internal/idgen"
)

// The retention tiers (DESIGN §8, docs/retention.md). Rows move between
// tables of the same columns — message_store and message_trace on the hot
// clusters, archive_message and archive_trace on the archive cluster, and
// cold files — one month and one vshard range (a Span) at a time. The
// statements below are built from the tables' descriptions (tierTable,
// beside each CREATE TABLE), the same shape for each: read a span in id
// order, upsert rows, count and checksum a span per vshard (the checksum of
// the resharding copy: SUM of CRC32 of every column), delete a span.

// tierTable describes one table for the tier statements.
type tierTable struct {
	name string
	cols []string // every column, in the order rows are read and written; the first is the id
	// kinds gives, per column, how a cold file writes it: i integer,
	// t time, s text (a JSON string, or {"base64":…} when not UTF-8),
	// b bytes (base64).
	kinds []byte
	// msgCol is the id of the row's message (id or message_id): a Span
	// ByMessage selects rows by their message's creation time through it
	// (router ids start with their creation time).
	msgCol string
	// partitioned tables are RANGE-partitioned by month on month.
	partitioned bool
	// required is how many leading columns every cold file row has; the
	// columns after them were added later and read NULL from older files,
	// or their value in defaults. 0: all of them.
	required int
	defaults map[string]any
}

var tierTables = []*tierTable{&messageStoreTier, &messageTraceTier, &archiveMessageTier, &archiveTraceTier}

func tierNamed(name string) (*tierTable, error) {
	for _, t := range tierTables {
		if t.name == name {
			return t, nil
		}
	}
	return nil, fmt.Errorf("retention: unknown table %q", name)
}

// Table names of the tiers.
const (
	TableMessages        = "message_store"
	TableTrace           = "message_trace"
	TableArchiveMessages = "archive_message"
	TableArchiveTrace    = "archive_trace"
)

// Span selects the rows of a time range and a vshard range: created_at in
// [From, To) (a zero From: no lower bound) — or, ByMessage, the rows whose
// message was created then — and vshards VFrom…VTo, both included.
type Span struct {
	From, To   time.Time
	VFrom, VTo uint16
	ByMessage  bool
}

func (sp Span) String() string {
	return fmt.Sprintf("%s..%s v%04d-%04d", sp.From.UTC().Format(time.DateOnly), sp.To.UTC().Format(time.DateOnly), sp.VFrom, sp.VTo)
}

// where appends the span's predicate.
func (t *tierTable) where(b *strings.Builder, args []any, sp Span) []any {
	b.WriteString(" WHERE vshard BETWEEN ? AND ?")
	args = append(args, sp.VFrom, sp.VTo)
	if !sp.ByMessage {
		if !sp.From.IsZero() {
			b.WriteString(" AND created_at >= ?")
			args = append(args, sp.From.UTC())
		}
		b.WriteString(" AND created_at < ?")
		return append(args, sp.To.UTC())
	}
	if !sp.From.IsZero() {
		b.WriteString(" AND " + t.msgCol + " >= ?")
		args = append(args, idgen.Floor(sp.From))
	}
	b.WriteString(" AND " + t.msgCol + " < ?")
	return append(args, idgen.Floor(sp.To))
}

// rowText is the fingerprinted text of a row (see moveTable.rowText).
func (t *tierTable) rowText() string {
	return (&moveTable{cols: t.cols}).rowText()
}

// TierRead reads up to limit rows of table in span with ids above after,
// in id order, and the id of the last one (after when none). Like
// MoveRead it returns fewer when theirs would make too large a statement;
// only an empty answer means there are no more.
func (s *Store) TierRead(ctx context.Context, table string, sp Span, after uint64, limit int) ([]MoveRow, uint64, error) {
	t, err := tierNamed(table)
	if err != nil {
		return nil, after, err
	}
	var b strings.Builder
	b.WriteString("SELECT " + strings.Join(t.cols, ", ") + " FROM " + t.name)
	args := t.where(&b, nil, sp)
	b.WriteString(" AND id > ? ORDER BY id LIMIT ?")
	budget, err := s.copyBudget(ctx)
	if err != nil {
		return nil, after, err
	}
	args = append(args, after, s.rowsWithin("tier:"+t.name, limit, budget))
	out, _, err := s.readSized(ctx, "read "+t.name+" "+sp.String(), b.String(), args, len(t.cols), budget)
	if err != nil {
		return nil, after, translate(err)
	}
	s.noteRows("tier:"+t.name, out)
	if len(out) == 0 {
		return nil, after, nil
	}
	last, err := rowID(out[len(out)-1][0])
	if err != nil {
		return nil, after, fmt.Errorf("read %s: %w", t.name, err)
	}
	return out, last, nil
}

// rowID reads an id column as the driver returned it.
func rowID(v any) (uint64, error) {
	switch x := v.(type) {
	case uint64:
		return x, nil
	case int64:
		return uint64(x), nil
	case []byte:
		return strconv.ParseUint(string(x), 10, 64)
	case string:
		return strconv.ParseUint(x, 10, 64)
	}
	return 0, fmt.Errorf("id of type %T", v)
}

// TierWrite upserts rows (in table's column order, as TierRead returns
// them for a table of the same columns) into table: copying twice is
// harmless, a row already there takes the values given.
func (s *Store) TierWrite(ctx context.Context, table string, rows []MoveRow) error {
	t, err := tierNamed(table)
	if err != nil {
		return err
	}
	return s.upsertRows(ctx, "tier_write", t.name, t.cols, t.cols[1:], rows)
}

// TierSums returns the row count and checksum of table's rows in span,
// per vshard that has any: two tables hold the same rows of a span when
// their sums are equal.
func (s *Store) TierSums(ctx context.Context, table string, sp Span) (map[uint16]MoveBucket, error) {
	t, err := tierNamed(table)
	if err != nil {
		return nil, err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "SELECT vshard, COUNT(*), CAST(SUM(CRC32(%s)) AS CHAR) FROM %s", t.rowText(), t.name)
	args := t.where(&b, nil, sp)
	b.WriteString(" GROUP BY vshard")
	out, err := queryMap(ctx, s.db, fmt.Sprintf("checksum %s %s", t.name, sp), b.String(), args, func(rows *sql.Rows) (v uint16, m MoveBucket, err error) {
		err = rows.Scan(&v, &m.Rows, &m.Sum)
		return v, m, err
	})
	return out, translate(err)
}

// TierDelete deletes table's rows in span in statements of at most limit
// rows, pausing pause between them (throttle), and returns how many.
func (s *Store) TierDelete(ctx context.Context, table string, sp Span, limit int, pause time.Duration) (int64, error) {
	t, err := tierNamed(table)
	if err != nil {
		return 0, err
	}
	var b strings.Builder
	b.WriteString("DELETE FROM " + t.name)
	args := t.where(&b, nil, sp)
	b.WriteString(" LIMIT ?")
	args = append(args, limit)
	q, what := b.String(), fmt.Sprintf("delete %s %s", t.name, sp)
	return s.inBatches(ctx, "tier_delete", limit, pause, func(tx *sql.Tx) (int, error) {
		n, err := execCount(ctx, tx, what, q, args...)
		return int(n), err
	})
}

// IndexCold records that the archive_message rows (as TierRead returns
// them) were exported to file.
func (s *Store) IndexCold(ctx context.Context, rows []MoveRow, file string, at time.Time) error {
	return s.indexCold(ctx, rows, file, at)
}

// EncodeRow writes a row of table as one JSON object keyed by column
// (the line of a cold file).
func EncodeRow(table string, r MoveRow) ([]byte, error) {
	t, err := tierNamed(table)
	if err != nil {
		return nil, err
	}
	if len(r) != len(t.cols) {
		return nil, fmt.Errorf("encode %s: a row of %d columns, want %d", t.name, len(r), len(t.cols))
	}
	obj := make(map[string]any, len(t.cols))
	for i, c := range t.cols {
		v, err := encodeValue(t.kinds[i], r[i])
		if err != nil {
			return nil, fmt.Errorf("encode %s.%s: %w", t.name, c, err)
		}
		obj[c] = v
	}
	return json.Marshal(obj)
}

func encodeValue(kind byte, v any) (any, error) {
	if v == nil {
		return nil, nil
	}
	switch kind {
	case 'i':
		switch x := v.(type) {
		case int64, uint64:
			return x, nil
		case []byte:
			return json.Number(x), nil
		}
	case 't':
		if x, ok := v.(time.Time); ok {
			return x.UTC().Format(time.RFC3339Nano), nil
		}
	case 's', 'b':
		var raw []byte
		switch x := v.(type) {
		case []byte:
			raw = x
		case string:
			raw = []byte(x)
		default:
			return nil, fmt.Errorf("value of type %T", v)
		}
		if kind == 's' && utf8.Valid(raw) {
			return string(raw), nil
		}
		return map[string]string{"base64": base64.StdEncoding.EncodeToString(raw)}, nil
	}
	return nil, fmt.Errorf("value of type %T for kind %c", v, kind)
}

// DecodeRow reads a row of table written by EncodeRow.
func DecodeRow(table string, line []byte) (MoveRow, error) {
	t, err := tierNamed(table)
	if err != nil {
		return nil, err
	}
	var obj map[string]json.RawMessage
	dec := json.NewDecoder(strings.NewReader(string(line)))
	dec.UseNumber()
	if err := dec.Decode(&obj); err != nil {
		return nil, fmt.Errorf("decode %s row: %w", t.name, err)
	}
	r := make(MoveRow, len(t.cols))
	for i, c := range t.cols {
		raw, ok := obj[c]
		if !ok && t.required > 0 && i >= t.required {
			r[i] = t.defaults[c] // a column newer than the file: NULL or its default
			continue
		}
		if !ok {
			return nil, fmt.Errorf("decode %s row: column %s missing", t.name, c)
		}
		v, err := decodeValue(t.kinds[i], raw)
		if err != nil {
			return nil, fmt.Errorf("decode %s.%s: %w", t.name, c, err)
		}
		r[i] = v
	}
	return r, nil
}

func decodeValue(kind byte, raw json.RawMessage) (any, error) {
	if string(raw) == "null" {
		return nil, nil
	}
	switch kind {
	case 'i':
		var n json.Number
		if err := json.Unmarshal(raw, &n); err != nil {
			return nil, err
		}
		if u, err := strconv.ParseUint(string(n), 10, 64); err == nil {
			return u, nil
		}
		return strconv.ParseInt(string(n), 10, 64)
	case 't':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, err
		}
		return time.Parse(time.RFC3339Nano, s)
	case 's', 'b':
		var s string
		if err := json.Unmarshal(raw, &s); err == nil {
			return []byte(s), nil
		}
		var w struct {
			Base64 string `json:"base64"`
		}
		if err := json.Unmarshal(raw, &w); err != nil {
			return nil, err
		}
		return base64.StdEncoding.DecodeString(w.Base64)
	}
	return nil, errors.New("unknown column kind")
}

// RowMessage reads the message of an archive_message or message_store row
// (as TierRead or DecodeRow return it), without payload and headers.
func RowMessage(r MoveRow) (*Message, error) {
	if len(r) != len(messageStoreMove.cols) {
		return nil, fmt.Errorf("a message row of %d columns", len(r))
	}
	m := &Message{}
	var err error
	if m.ID, err = rowID(r[0]); err != nil {
		return nil, err
	}
	m.CreatedAt, _ = r[1].(time.Time)
	v, err := rowID(r[2])
	if err != nil {
		return nil, err
	}
	m.VShard = uint16(v)
	m.Topic, m.Key, m.OrderKey, m.TransactionID = textOf(r[3]), textOf(r[4]), textOf(r[5]), textOf(r[6])
	st, err := rowID(r[11])
	if err != nil {
		return nil, err
	}
	m.Status = statusOf(int(st))
	return m, nil
}

func textOf(v any) string {
	switch x := v.(type) {
	case []byte:
		return string(x)
	case string:
		return x
	}
	return ""
}

// ArchivedTrace reads the trace of (topic, key) from the warm tier (this
// store being the archive cluster): the newest archived message with that
// key and its archived events. ErrNotFound when it holds none.
func (s *Store) ArchivedTrace(ctx context.Context, topic, key string, now time.Time) (*MessageTrace, error) {
	var out *MessageTrace
	err := s.readTx(ctx, func(tx *sql.Tx) error {
		msgs, err := scanMessageRows(ctx, tx, selectArchivedByKey, topic, key)
		if err != nil {
			return err
		}
		if len(msgs) == 0 {
			return ErrNotFound
		}
		evs, err := archivedEvents(ctx, tx, msgs[0].ID)
		if err != nil {
			return err
		}
		out = buildTrace(msgs[0], nil, evs, now)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("archived trace %s/%s: %w", topic, key, err)
	}
	return out, nil
}

func archivedEvents(ctx context.Context, q queryer, id uint64) ([]Event, error) {
	evs, err := queryRows(ctx, q, "select archive_trace", selectArchivedEvents(1), []any{id}, scanEvent)
	if err != nil {
		return nil, err
	}
	return withRowAcks(ctx, q, "archive_message", []uint64{id}, evs)
}

// Events reads the trace events of message ids held by this cluster, in
// time order: the hot events of a message whose own row is archived
// already (an event written months after it was produced).
func (s *Store) Events(ctx context.Context, ids []uint64) ([]Event, error) {
	evs, err := eventsOf(ctx, s.db, ids)
	if err != nil {
		return nil, translate(err)
	}
	return evs, nil
}

// MergeEvents adds evs to a trace built from another tier, skipping
// events it has, and rebuilds the deliveries and the order. An event is
// known by its id and subscription: the final acks kept on a message row
// carry the message's id, and a row may hold two of them (rowAcks).
func MergeEvents(tr *MessageTrace, evs []Event, now time.Time) *MessageTrace {
	if len(evs) == 0 {
		return tr
	}
	type key struct {
		id  uint64
		sub string
	}
	have := map[key]bool{}
	var all []Event
	for _, e := range tr.Events {
		// The produced event and the claims implied by acks are rebuilt.
		if k := (key{e.ID, e.Subscription}); e.ID != 0 && !have[k] {
			have[k] = true
			all = append(all, e)
		}
	}
	for _, e := range evs {
		if k := (key{e.ID, e.Subscription}); !have[k] {
			have[k] = true
			all = append(all, e)
		}
	}
	return buildTrace(tr.Message, nil, all, now)
}

// ArchivedByTransaction returns one page of the archived messages of
// transaction id txID, as MessagesByTransaction does for hot ones.
func (s *Store) ArchivedByTransaction(ctx context.Context, txID string, after uint64, limit, maxBytes int) ([]*Message, bool, error) {
	msgs, more, err := sizedPage(ctx, s.db, "archive_message", txID, after, limit, maxBytes)
	if err != nil {
		return nil, false, fmt.Errorf("look up archived transaction %q: %w", txID, translate(err))
	}
	return msgs, more, nil
}

func scanMessageRows(ctx context.Context, q queryer, query string, args ...any) ([]*Message, error) {
	return queryRows(ctx, q, "select archive_message", query, args, scanMessage(true))
}

// RowMessageID reads the message id of a message_trace or archive_trace
// row (as TierRead or DecodeRow return it).
func RowMessageID(r MoveRow) (uint64, error) {
	if len(r) != len(messageTraceMove.cols) {
		return 0, fmt.Errorf("a trace row of %d columns", len(r))
	}
	return rowID(r[2])
}
