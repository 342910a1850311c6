package store

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"time"

	"github.com/shardmq/shardmq/internal/reqid"
)

// message_trace is the append-only history of what happened to a message
// after it was produced, partitioned by month on the event time. The common
// path writes one row per message (acked, carrying the claim time, consumer
// and attempt); rarer transitions write their own.
func createMessageTrace(now time.Time) string {
	return `CREATE TABLE IF NOT EXISTS message_trace (
  id BIGINT UNSIGNED NOT NULL,
  created_at DATETIME(6) NOT NULL,
  message_id BIGINT UNSIGNED NOT NULL,
  vshard SMALLINT UNSIGNED NOT NULL,
  subscription VARBINARY(128) NULL,
  event VARCHAR(24) NOT NULL,
  consumer VARBINARY(128) NULL,
  attempt SMALLINT UNSIGNED NOT NULL DEFAULT 0,
  claimed_at DATETIME(6) NULL,
  error_code VARBINARY(64) NULL,
  error VARBINARY(2048) NULL,
  PRIMARY KEY (id, created_at),
  KEY idx_message (message_id)
) ENGINE=InnoDB
` + MonthPartitions("created_at", now)
}

// Trace event types.
const (
	EventProduced       = "produced"
	EventDuplicate      = "duplicate"
	EventConflict       = "conflict"
	EventClaimed        = "claimed"
	EventAcked          = "acked"
	EventNacked         = "nacked"
	EventLeaseExpired   = "lease_expired"
	EventRetryScheduled = "retry_scheduled"
	EventDeadLettered   = "dead_lettered"
	EventRedriven       = "redriven"
	EventMoved          = "moved"
	EventArchived       = "archived"
	// EventDropped: the delivery was removed because its subscription was
	// deleted; the message was never delivered to it again.
	EventDropped = "dropped"
)

// Event is one trace row.
type Event struct {
	ID           uint64
	At           time.Time
	MessageID    uint64
	VShard       uint16
	Subscription string
	Type         string
	Consumer     string
	Attempt      int
	ClaimedAt    time.Time // zero when not a claim-related event
	ErrorCode    string
	Error        string
	// RequestID is the id of the HTTP request that caused the event
	// (X-Request-Id), when there was one; insertEvents takes it from the
	// context unless set.
	RequestID string
}

// addRequestIDColumn keeps the id of the request that caused an event. It
// is the last column and NULL when unknown, so adding it is instant and
// costs nothing to rows without one.
const addRequestIDColumn = `ALTER TABLE message_trace ADD COLUMN request_id VARBINARY(64) NULL`

func insertEvents(ctx context.Context, tx execer, evs []Event) error {
	return execInsertEvents(ctx, tx, "INSERT INTO", evs)
}

// insertEventsOnce inserts events whose id and time the caller derived
// from something that happens once (a produce attempt's own message id
// and time), ignoring rows already there: a transaction that runs again,
// or a rejected attempt traced again, adds no second row.
func insertEventsOnce(ctx context.Context, tx execer, evs []Event) error {
	return execInsertEvents(ctx, tx, "INSERT IGNORE INTO", evs)
}

// execer is what a write needs: a pool or a transaction.
type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// AppendEvents writes trace events outside any other change, in one
// statement, exactly once per event id and time (INSERT IGNORE). The
// router writes the duplicate and conflict events of the produce attempts
// its recent-keys cache answered this way, batched.
func (s *Store) AppendEvents(ctx context.Context, evs []Event) error {
	if err := insertEventsOnce(ctx, s.db, evs); err != nil {
		return translate(err)
	}
	return nil
}

func execInsertEvents(ctx context.Context, tx execer, verb string, evs []Event) error {
	if len(evs) == 0 {
		return nil
	}
	q, args := insertEventsSQL(ctx, make([]any, 0, len(evs)*12), verb, evs)
	if _, err := tx.ExecContext(ctx, q, args...); err != nil {
		return fmt.Errorf("insert message_trace: %w", err)
	}
	return nil
}

// insertEventsSQL is the statement that inserts evs (verb: "INSERT INTO"
// or "INSERT IGNORE INTO"), its arguments appended to args; an event
// without a request id takes ctx's.
func insertEventsSQL(ctx context.Context, args []any, verb string, evs []Event) (string, []any) {
	rid := reqid.From(ctx)
	for _, e := range evs {
		var claimed any
		if !e.ClaimedAt.IsZero() {
			claimed = e.ClaimedAt
		}
		if e.RequestID == "" {
			e.RequestID = rid
		}
		args = append(args, e.ID, e.At, e.MessageID, e.VShard, nullString(e.Subscription), e.Type, nullString(e.Consumer),
			e.Attempt, claimed, nullString(e.ErrorCode), nullString(e.Error), nullString(e.RequestID))
	}
	return verb + ` message_trace (id, created_at, message_id, vshard, subscription, event, consumer,
  attempt, claimed_at, error_code, error, request_id) VALUES ` + placeholders(len(evs), 12), args
}

// countEvents counts the trace events of ids (event ids) that are
// stored.
func countEvents(ctx context.Context, q queryer, ids []uint64) (int, error) {
	n := 0
	err := queryEach(ctx, q, "count message_trace", "SELECT COUNT(*) FROM message_trace WHERE id IN ("+inList(len(ids))+")", appendArgs(nil, ids),
		func(rows *sql.Rows) error { return rows.Scan(&n) })
	return n, err
}

// eventsOf reads the trace events of messages ids in time order; types, if
// given, limits them to those event types.
func eventsOf(ctx context.Context, q queryer, ids []uint64, types ...string) ([]Event, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	query := `SELECT id, created_at, message_id, vshard, COALESCE(subscription, ''), event, COALESCE(consumer, ''), attempt, claimed_at,
  COALESCE(error_code, ''), COALESCE(error, ''), COALESCE(request_id, '') FROM message_trace WHERE message_id IN (` + inList(len(ids)) + ")"
	args := appendArgs(make([]any, 0, 3*len(ids)+len(types)), ids)
	if len(types) > 0 {
		query += " AND event IN (" + inList(len(types)) + ")"
		args = appendArgs(args, types)
	}
	evs, err := queryRows(ctx, q, "select message_trace", query+" ORDER BY created_at, id", args, scanEvent)
	if err != nil || len(types) > 0 && !slices.Contains(types, EventAcked) {
		return evs, err
	}
	// The final acks kept on the message rows (message_store.go).
	return withRowAcks(ctx, q, "message_store", ids, evs)
}

// scanEvent reads a trace event in the column order of eventsOf, which
// archive_trace's reads share.
func scanEvent(rows *sql.Rows) (Event, error) {
	var e Event
	var claimed sql.NullTime
	err := rows.Scan(&e.ID, &e.At, &e.MessageID, &e.VShard, &e.Subscription, &e.Type, &e.Consumer, &e.Attempt, &claimed,
		&e.ErrorCode, &e.Error, &e.RequestID)
	e.ClaimedAt = claimed.Time
	return e, err
}

// messageTraceMove moves trace events with their vshard (see move.go).
var messageTraceMove = moveTable{
	name:  "message_trace",
	cols:  []string{"id", "created_at", "message_id", "vshard", "subscription", "event", "consumer", "attempt", "claimed_at", "error_code", "error", "request_id"},
	pk:    []string{"id", "created_at"},
	idCol: "id",
}
