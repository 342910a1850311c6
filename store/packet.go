package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Copies sized by bytes. A resharding or archive copy moves rows through
// the router: read in primary-key order on one server, upserted on
// another as one multi-row INSERT. With interpolateParams the statement
// carries every value as escaped text (a zero byte becomes two), and the
// server refuses a statement longer than its max_allowed_packet (error
// 1153). So reads stop once their rows would make a statement of
// copyBudget bytes, and writes split their rows into statements of at
// most that size: any row the API could store (its own INSERT fit) can be
// moved and archived, whatever the rows around it hold.

// maxCopyBudget caps a copy's batch, which the router holds in memory.
const maxCopyBudget = 8 << 20

// statementOverhead is room left in a packet for a statement's text
// besides its values (column lists, ON DUPLICATE KEY UPDATE, framing).
const statementOverhead = 16 << 10

// packetLimit is a server's max_allowed_packet, read once per Store.
type packetLimit struct {
	mu    sync.Mutex
	bytes int64
}

// maxPacket reads the server's max_allowed_packet (once; it only changes
// with a server restart, and a lower value then shows as a refused
// statement and a retry).
func (s *Store) maxPacket(ctx context.Context) (int64, error) {
	s.packet.mu.Lock()
	defer s.packet.mu.Unlock()
	if s.packet.bytes > 0 {
		return s.packet.bytes, nil
	}
	var n int64
	if err := s.db.QueryRowContext(ctx, "SELECT @@max_allowed_packet").Scan(&n); err != nil {
		return 0, fmt.Errorf("read max_allowed_packet: %w", translate(err))
	}
	s.packet.bytes = n
	return n, nil
}

// copyBudget is how many encoded bytes of values one copy statement may
// carry on this server: half its max_allowed_packet (the rest is room for
// what the estimate misses), at most maxCopyBudget.
func (s *Store) copyBudget(ctx context.Context) (int, error) {
	p, err := s.maxPacket(ctx)
	if err != nil {
		return 0, err
	}
	return int(max(min(p/2, maxCopyBudget)-statementOverhead, 1024)), nil
}

// encodedSize estimates the bytes v takes in an interpolated statement:
// bytes and text escaped (at worst two bytes each) and quoted, a time as
// a quoted literal, a number in decimal.
func encodedSize(v any) int {
	switch x := v.(type) {
	case []byte:
		return 2*len(x) + 12 // _binary'…'
	case string:
		return 2*len(x) + 3
	case time.Time:
		return 30
	case nil:
		return 5
	default:
		return 22
	}
}

// rowSize is the estimate of a row's values, separators included.
func rowSize(r MoveRow) int {
	n := 3
	for _, v := range r {
		n += encodedSize(v) + 1
	}
	return n
}

// byBytes splits rows into runs whose encoded size stays within budget
// (a row larger than budget alone in its run).
func byBytes(rows []MoveRow, budget int) [][]MoveRow {
	var out [][]MoveRow
	start, size := 0, 0
	for i, r := range rows {
		n := rowSize(r)
		if i > start && size+n > budget {
			out = append(out, rows[start:i])
			start, size = i, 0
		}
		size += n
	}
	if start < len(rows) {
		out = append(out, rows[start:])
	}
	return out
}

// errEnough stops a read whose rows reached its byte budget.
var errEnough = errors.New("read budget reached")

// readSized is queryEach of rows of n columns that keeps rows until their
// encoded size reaches budget (at least one row). It reports whether it
// stopped on the budget.
func (s *Store) readSized(ctx context.Context, what, query string, args []any, n, budget int) ([]MoveRow, bool, error) {
	var out []MoveRow
	size := 0
	scan := scanMoveRow(n)
	err := queryEach(ctx, s.db, what, query, args, func(rows *sql.Rows) error {
		r, err := scan(rows)
		if err != nil {
			return err
		}
		out = append(out, r)
		size += rowSize(r)
		if size >= budget {
			return errEnough
		}
		return nil
	})
	if errors.Is(err, errEnough) {
		return out, true, nil
	}
	return out, false, err
}

// rowsWithin is how many rows a read asks for: limit, or fewer when the
// table's recent rows were large, so that the server does not send many
// rows past the budget only for them to be dropped.
func (s *Store) rowsWithin(table string, limit, budget int) int {
	s.rowBytes.mu.Lock()
	avg := s.rowBytes.avg[table]
	s.rowBytes.mu.Unlock()
	if avg <= 0 {
		return limit
	}
	return max(min(limit, budget/avg+1), 1)
}

// noteRows records the average size of rows just read from table.
func (s *Store) noteRows(table string, rows []MoveRow) {
	if len(rows) == 0 {
		return
	}
	total := 0
	for _, r := range rows {
		total += rowSize(r)
	}
	s.rowBytes.mu.Lock()
	defer s.rowBytes.mu.Unlock()
	if s.rowBytes.avg == nil {
		s.rowBytes.avg = map[string]int{}
	}
	s.rowBytes.avg[table] = max(total/len(rows), 1)
}

// rowSizes is the average encoded row size of each table's latest read.
type rowSizes struct {
	mu  sync.Mutex
	avg map[string]int
}
