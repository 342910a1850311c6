package loadtest

import (
	"context"
	"crypto/md5"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"
	"golang.org/x/sync/errgroup"

	"github.com/shardmq/shardmq/internal/ctxwait"
	"github.com/shardmq/shardmq/internal/idgen"
	"github.com/shardmq/shardmq/internal/reqid"
	"github.com/shardmq/shardmq/store"
)

// Floor writes DESIGN §6's row budget by hand, with nothing else: the
// three rows a produced message costs (dedup registry, message, delivery)
// and the four a first-attempt claim → ack costs (lease, delete, `acked`
// event, status), each batch in the fewest statements, on one primary,
// with no router, no HTTP, no transaction or ordering index and no status
// check across subscriptions. It is the measuring stick for the speed
// targets (docs/performance.md, "The floor"): an implementation of the
// contract writes at least these rows, so a rate against a peer that the
// floor cannot reach is out of reach for the router as well.
//
// Its tables live in the database its DB was opened on and are named
// floor_*; they are a benchmark's schema, not the product's (package store
// holds those). The queue layout's are not partitioned; the inline
// layout's message table is, by month as the product's (LayoutInline);
// the one-row layout's is not (LayoutOneRow).
type Floor struct {
	DB *sql.DB
	// Layout is where the default subscription's delivery lives. Defaults
	// to LayoutQueue, the product's: a row of its own.
	Layout FloorLayout
	// Acks is what an ack writes besides the delete. Defaults to
	// AckBudget, DESIGN §6's rows; the others measure budgets the
	// contract does not allow today (docs/performance.md, "The floor").
	Acks FloorAck
	// LeasedOut moves a leased delivery out of the claim index's range (a
	// leased flag ahead of priority in the key), so that a claim never
	// walks past in-flight rows; the product keeps them in the range,
	// ordered among the ready ones, and tells them apart by available_at.
	// The floor does not pay what LeasedOut would cost a real queue:
	// finding expired leases needs another read.
	LeasedOut bool
	// Clock gives the times written; defaults to time.Now.
	Clock func() time.Time

	ids     atomic.Uint64 // router-generated ids, as the contract asks
	token   atomic.Uint64
	genOnce sync.Once
	gen     *idgen.Gen // the inline and one-row layouts' message ids (messageID)
}

// FloorLayout is where a floor keeps the default subscription's delivery.
type FloorLayout int

const (
	// LayoutQueue keeps a delivery row per message in floor_queue, as the
	// product keeps one in message_queue: a produced message is three
	// rows, and a consumed one deletes its delivery (its key and claim
	// index entries) besides updating the message row.
	LayoutQueue FloorLayout = iota
	// LayoutInline keeps the default subscription's delivery on the
	// message row: a state (dlv_state: ready, acked), available_at and a
	// claim index on floor_store. floor_queue would hold only what needs a
	// row of its own — other subscriptions, retries, delays, ordered
	// parking, dead letters — which the floor never writes. A produced
	// message is two rows (the dedup key and the message) and a consumed
	// one is one update of its message row, the state with the final ack.
	// It is the schema change docs/performance.md weighs ("What limits
	// the figures"). It has only the owned consume (ConsumeOwned) and the
	// final ack on the message row (Acks AckFolded), and no delivery row
	// to lease out (LeasedOut false).
	LayoutInline
	// LayoutOneRow makes the message row the dedup registry as well: a
	// produced message is one row, in floor_store, which is not
	// partitioned so that a unique key on (topic, msg_key) can hold
	// (MySQL asks every unique key of a partitioned table to include the
	// partitioning column; store's message_key is a table of its own for
	// that reason). The row carries what the registry's did (the payload's
	// hash, which tells a duplicate from a conflict) and the default
	// subscription's delivery as LayoutInline's does, with the same claim
	// index, now one index rather than one per month; an ack names rows by
	// id alone. It is the floor of a schema whose produce writes one row,
	// the peer's count (docs/performance.md, "The baseline, the peer and
	// the floor"). The same restrictions as LayoutInline apply.
	//
	// Without month partitions a message leaves by a delete, and its key
	// must outlive it (dedup has no time window): Retire moves each key
	// into floor_key, the registry of retired keys, and deletes the row.
	// A publish therefore also reads floor_key for its keys, after its
	// insert and with a shared lock, so that a key retired before, or
	// while the insert waited for the retiring transaction's lock on the
	// unique key, fails the batch as a stored one does.
	LayoutOneRow
)

// String names the layout for reports.
func (l FloorLayout) String() string {
	switch l {
	case LayoutInline:
		return "inline"
	case LayoutOneRow:
		return "onerow"
	}
	return "queue"
}

// errOwnedOnly: the inline and one-row layouts' claims are the owner's
// (ConsumeOwned); they have no durable lease to write.
var errOwnedOnly = errors.New("floor: the inline and one-row layouts have only the owned consume (ConsumeOwned)")

// check refuses settings the layout cannot honour.
func (f *Floor) check() error {
	if f.Layout != LayoutQueue && (f.Acks != AckFolded || f.LeasedOut) {
		return fmt.Errorf("floor: the %s layout acks on the message row (Acks %s, not %s) and has no delivery row to lease out", f.Layout, AckFolded, f.Acks)
	}
	return nil
}

// The budget's four tables, each with only the keys the contract's reads
// need: the dedup registry's unique key, the message by id, the delivery's
// claim index (the product's idx_claim column order), the trace by
// message. floor_store carries the final ack's columns (store's
// markAcked).
const (
	floorKey = `CREATE TABLE floor_key (
  topic VARBINARY(128) NOT NULL,
  msg_key VARBINARY(256) NOT NULL,
  message_id BIGINT UNSIGNED NOT NULL,
  payload_hash BINARY(16) NOT NULL,
  PRIMARY KEY (topic, msg_key)
) ENGINE=InnoDB`
	floorStore = `CREATE TABLE floor_store (
  id BIGINT UNSIGNED NOT NULL,
  created_at DATETIME(3) NOT NULL,
  topic VARBINARY(128) NOT NULL,
  msg_key VARBINARY(256) NOT NULL,
  payload MEDIUMBLOB NOT NULL,
` + floorFinalAck + `  PRIMARY KEY (id)
) ENGINE=InnoDB`
	// floorFinalAck are the message row's status and final ack columns
	// (store's markAcked), in every floor_store layout.
	floorFinalAck = `  msg_status TINYINT UNSIGNED NOT NULL DEFAULT 0,
  status_at DATETIME(6) NULL,
  acked_sub VARBINARY(128) NULL,
  acked_by VARBINARY(128) NULL,
  acked_attempt SMALLINT UNSIGNED NULL,
  acked_claimed_at DATETIME(6) NULL,
  acked_request VARBINARY(64) NULL,
  ack_slot BINARY(64) NOT NULL DEFAULT '',
`
	// floorRowDelivery are the columns of a floor_store that carries the
	// default subscription's delivery (LayoutInline, LayoutOneRow) after
	// its key: priority, payload, the final ack's columns and the
	// delivery's state; floorRowClaimIndex is its claim index, in the
	// product's idx_claim column order.
	floorRowDelivery = `  priority TINYINT UNSIGNED NOT NULL,
  payload MEDIUMBLOB NOT NULL,
` + floorFinalAck + `  dlv_state TINYINT UNSIGNED NOT NULL DEFAULT 0,
  available_at DATETIME(6) NOT NULL,
`
	floorRowClaimIndex = `KEY idx_claim (topic, dlv_state, priority DESC, id, available_at)`
	// floorInlineStore is LayoutInline's floor_store: the message with
	// its priority, the final ack's columns and the default
	// subscription's delivery (dlv_state 0 ready, 1 acked; available_at),
	// found through idx_claim in the product's idx_claim column order.
	// It is partitioned by month on created_at as message_store is
	// (store.MonthPartitions: last month, this one, three ahead and a
	// catch-all; the rows land in this month's), with message_store's
	// primary key (id, created_at), so an ack names each row's partition.
	// An InnoDB index of a partitioned table is local to each partition:
	// a claim's ORDER BY priority DESC, id reads the claim index of every
	// partition (no condition on created_at prunes them) and merges them,
	// which a claim index on message_queue, not partitioned, does not
	// pay. The floor pays it too.
	floorInlineStore = `CREATE TABLE floor_store (
  id BIGINT UNSIGNED NOT NULL,
  created_at DATETIME(3) NOT NULL,
  topic VARBINARY(128) NOT NULL,
  msg_key VARBINARY(256) NOT NULL,
` + floorRowDelivery + `  PRIMARY KEY (id, created_at),
  ` + floorRowClaimIndex + `
) ENGINE=InnoDB
`
	// floorOneRowStore is LayoutOneRow's floor_store: LayoutInline's
	// columns and claim index, the registry's payload hash, and the
	// registry's unique key (uk_key: a key stored already fails the
	// insert, error 1062). Not partitioned, so the primary key is the id
	// alone and a claim reads one claim index. Retention would delete
	// rows in batches instead of dropping months; ids carry their
	// creation time (idgen), so a range of ids below idgen.Floor(cutoff)
	// walks the primary key, and the table has no index on created_at.
	floorOneRowStore = `CREATE TABLE floor_store (
  id BIGINT UNSIGNED NOT NULL,
  created_at DATETIME(3) NOT NULL,
  topic VARBINARY(128) NOT NULL,
  msg_key VARBINARY(256) NOT NULL,
  payload_hash BINARY(16) NOT NULL,
` + floorRowDelivery + `  PRIMARY KEY (id),
  UNIQUE KEY uk_key (topic, msg_key),
  ` + floorRowClaimIndex + `
) ENGINE=InnoDB`
	floorQueue = `CREATE TABLE floor_queue (
  message_id BIGINT UNSIGNED NOT NULL,
  subscription VARBINARY(128) NOT NULL,
  topic VARBINARY(128) NOT NULL,
  priority TINYINT UNSIGNED NOT NULL,
  available_at DATETIME(6) NOT NULL,
  attempts SMALLINT UNSIGNED NOT NULL DEFAULT 0,
  locked_by VARBINARY(128) NULL,
  claim_token BIGINT UNSIGNED NOT NULL DEFAULT 0,
  claimed_at DATETIME(6) NULL,
  leased TINYINT UNSIGNED NOT NULL DEFAULT 0,
  PRIMARY KEY (message_id, subscription),
  KEY idx_claim (%s)
) ENGINE=InnoDB`
	floorTrace = `CREATE TABLE floor_trace (
  message_id BIGINT UNSIGNED NOT NULL,
  id BIGINT UNSIGNED NOT NULL,
  subscription VARBINARY(128) NOT NULL,
  event VARCHAR(24) NOT NULL,
  consumer VARBINARY(128) NULL,
  attempt SMALLINT UNSIGNED NOT NULL,
  claimed_at DATETIME(6) NULL,
  created_at DATETIME(6) NOT NULL,
  PRIMARY KEY (message_id, id)
) ENGINE=InnoDB`
)

// Create drops and creates the floor's tables, those of its Layout. The
// one-row layout's floor_key holds only retired keys (Retire): its
// message rows are the registry of the keys they carry.
func (f *Floor) Create(ctx context.Context) error {
	if err := f.check(); err != nil {
		return err
	}
	for _, t := range []string{"floor_key", "floor_store", "floor_queue", "floor_trace"} {
		if _, err := f.DB.ExecContext(ctx, "DROP TABLE IF EXISTS "+t); err != nil {
			return fmt.Errorf("floor: drop %s: %w", t, err)
		}
	}
	claimKey := "topic, subscription, priority DESC, message_id, available_at"
	if f.LeasedOut {
		claimKey = "topic, subscription, leased, priority DESC, message_id, available_at"
	}
	tables := []string{floorKey, floorStore, fmt.Sprintf(floorQueue, claimKey), floorTrace}
	switch f.Layout {
	case LayoutInline:
		tables[1] = floorInlineStore + store.MonthPartitions("created_at", f.now())
	case LayoutOneRow:
		tables[1] = floorOneRowStore
	}
	for _, q := range tables {
		if _, err := f.DB.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("floor: create tables: %w", err)
		}
	}
	return nil
}

// messageID is a new message's id and creation time. The inline and
// one-row layouts' ids are the product's (idgen: the creation time is in
// the id, so that an ack names the row's partition from its id alone, and
// ids in creation order are the one-row layout's retention order); the
// queue layout's are a counter and created_at the publish time.
func (f *Floor) messageID(now time.Time) (uint64, time.Time) {
	if f.Layout == LayoutQueue {
		return f.ids.Add(1), now
	}
	f.genOnce.Do(func() { f.gen = idgen.New(f.now) })
	id := f.gen.Next()
	return id, idgen.Time(id)
}

// rowsByID is the condition naming rows of floor_store by id: id IN (…)
// (the queue and one-row layouts' primary key), or in the inline layout
// each row's whole primary key, (id, created_at) with the time taken from
// the id, as store's idList writes it (one pair as "id = ? AND created_at
// = ?", which MariaDB's UPDATE can use an index for). It answers the condition and its arguments.
func (f *Floor) rowsByID(ids []uint64) (string, []any) {
	if f.Layout != LayoutInline {
		return "id IN (" + marks(len(ids)) + ")", idArgs(ids)
	}
	args := make([]any, 0, 2*len(ids))
	for _, id := range ids {
		args = append(args, id, idgen.Time(id))
	}
	if len(ids) == 1 {
		return "(id = ? AND created_at = ?)", args
	}
	return "(id, created_at) IN (" + repeatList("(?,?)", len(ids)) + ")", args
}

func (f *Floor) now() time.Time {
	if f.Clock != nil {
		return f.Clock().UTC()
	}
	return time.Now().UTC()
}

// FloorAck is what a floor ack writes besides deleting the delivery.
type FloorAck int

const (
	// AckBudget writes DESIGN §6's rows: an `acked` trace row and the
	// message's status.
	AckBudget FloorAck = iota
	// AckFolded writes the `acked` event's fields into the status update
	// of the message row, the columns the product's final ack writes
	// (finalAck): three rows per consumed message instead of four (two
	// in the owned consume, which writes no lease).
	AckFolded
	// AckDeleteOnly writes neither: the lease and the delete only, as if
	// status and trace were left to a later bulk job.
	AckDeleteOnly
)

// String names the ack for reports.
func (a FloorAck) String() string {
	switch a {
	case AckFolded:
		return "folded"
	case AckDeleteOnly:
		return "delete-only"
	}
	return "budget"
}

// ParseFloorAck reads a FloorAck's name.
func ParseFloorAck(s string) (FloorAck, error) {
	for _, a := range []FloorAck{AckBudget, AckFolded, AckDeleteOnly} {
		if a.String() == s {
			return a, nil
		}
	}
	return 0, fmt.Errorf("floor ack %q: want budget, folded or delete-only", s)
}

// FloorMessage is one message to publish.
type FloorMessage struct {
	Key     string
	Payload []byte
}

// FloorSubscription is the one subscription every floor message is
// delivered to.
const FloorSubscription = "default"

// Publish writes msgs to topic in one transaction: a registry row, a
// message row and (LayoutQueue) a delivery row each, one multi-row INSERT
// per table; the inline layout's message row is the delivery as well, and
// the one-row layout's is the delivery and the registry row, one INSERT
// in all. A key already registered fails the transaction (the floor's keys
// are unique; the registry's primary key, or the one-row layout's unique
// key, is the dedup check).
func (f *Floor) Publish(ctx context.Context, topic string, msgs []FloorMessage) error {
	if len(msgs) == 0 {
		return nil
	}
	now := f.now()
	type insert struct {
		head, row string
		args      []any
	}
	keys := insert{"INSERT INTO floor_key (topic, msg_key, message_id, payload_hash) VALUES ", "(?,?,?,?)", make([]any, 0, 4*len(msgs))}
	stored := insert{"INSERT INTO floor_store (id, created_at, topic, msg_key, payload) VALUES ", "(?,?,?,?,?)", make([]any, 0, 5*len(msgs))}
	queue := insert{"INSERT INTO floor_queue (message_id, subscription, topic, priority, available_at) VALUES ", "(?,?,?,?,?)", nil}
	switch f.Layout {
	case LayoutQueue:
		queue.args = make([]any, 0, 5*len(msgs))
	case LayoutInline:
		stored.head = "INSERT INTO floor_store (id, created_at, topic, msg_key, priority, payload, available_at) VALUES "
		stored.row = "(?,?,?,?,?,?,?)"
	case LayoutOneRow:
		keys.args = nil
		stored = insert{"INSERT INTO floor_store (id, created_at, topic, msg_key, payload_hash, priority, payload, available_at) VALUES ",
			"(?,?,?,?,?,?,?,?)", make([]any, 0, 8*len(msgs))}
	}
	for _, m := range msgs {
		id, created := f.messageID(now)
		sum := md5.Sum(m.Payload)
		switch f.Layout {
		case LayoutQueue:
			keys.args = append(keys.args, topic, m.Key, id, sum[:])
			stored.args = append(stored.args, id, created, topic, m.Key, m.Payload)
			queue.args = append(queue.args, id, FloorSubscription, topic, 0, now)
		case LayoutInline:
			keys.args = append(keys.args, topic, m.Key, id, sum[:])
			stored.args = append(stored.args, id, created, topic, m.Key, 0, m.Payload, now)
		case LayoutOneRow:
			stored.args = append(stored.args, id, created, topic, m.Key, sum[:], 0, m.Payload, now)
		}
	}
	return f.inTx(ctx, "publish", func(tx *sql.Tx) error {
		for _, st := range []insert{keys, stored, queue} {
			if st.args == nil {
				continue
			}
			if _, err := tx.ExecContext(ctx, st.head+repeatList(st.row, len(msgs)), st.args...); err != nil {
				return err
			}
		}
		if f.Layout == LayoutOneRow {
			return refuseRetired(ctx, tx, topic, msgs)
		}
		return nil
	})
}

// ErrFloorRetiredKey is a one-row publish of a key that Retire moved to
// the registry of retired keys: a key stored before.
var ErrFloorRetiredKey = errors.New("floor: a key of the batch was retired (stored before)")

// refuseRetired fails a one-row publish whose keys include a retired one.
// It runs after the insert: the insert waits for a retiring transaction
// that holds the key's unique entry, and this locking read then sees the
// key that transaction registered.
func refuseRetired(ctx context.Context, tx *sql.Tx, topic string, msgs []FloorMessage) error {
	args := make([]any, 0, 2*len(msgs))
	for _, m := range msgs {
		args = append(args, topic, m.Key)
	}
	var retired int
	if err := tx.QueryRowContext(ctx, "SELECT COUNT(*) FROM floor_key WHERE (topic, msg_key) IN ("+repeatList("(?,?)", len(msgs))+") LOCK IN SHARE MODE",
		args...).Scan(&retired); err != nil {
		return err
	}
	if retired > 0 {
		return ErrFloorRetiredKey
	}
	return nil
}

// Retire is the one-row layout's retention, the work that dropping a
// month's partition does for the other layouts (whose keys are in
// floor_key from the start): it walks floor_store by id, which is
// creation order, and moves batch rows per transaction — their keys, ids
// and payload hashes into floor_key, then the rows deleted — until none
// is left. Its run counts the rows retired.
func (f *Floor) Retire(ctx context.Context, batch int) (FloorRun, error) {
	if f.Layout != LayoutOneRow {
		return FloorRun{}, fmt.Errorf("floor: only the one-row layout retires by rows (the %s layout drops partitions)", f.Layout)
	}
	start := time.Now()
	var run FloorRun
	for {
		var lo, hi sql.Null[uint64]
		if err := f.DB.QueryRowContext(ctx, "SELECT MIN(id), MAX(id) FROM (SELECT id FROM floor_store ORDER BY id LIMIT ?) AS next", batch).
			Scan(&lo, &hi); err != nil {
			return run, fmt.Errorf("floor: retire: the next ids: %w", err)
		}
		if !lo.Valid {
			break
		}
		var n int64
		err := f.inTx(ctx, "retire", func(tx *sql.Tx) error {
			res, err := tx.ExecContext(ctx, "INSERT INTO floor_key (topic, msg_key, message_id, payload_hash)"+
				" SELECT topic, msg_key, id, payload_hash FROM floor_store WHERE id BETWEEN ? AND ?", lo.V, hi.V)
			if err != nil {
				return err
			}
			kept, err := res.RowsAffected()
			if err != nil {
				return err
			}
			if res, err = tx.ExecContext(ctx, "DELETE FROM floor_store WHERE id BETWEEN ? AND ?", lo.V, hi.V); err != nil {
				return err
			}
			if n, err = res.RowsAffected(); err == nil && n != kept {
				// A row committed into the range between the two statements
				// would lose its key: roll back rather than forget it.
				err = fmt.Errorf("ids %d–%d: %d keys kept, %d rows deleted", lo.V, hi.V, kept, n)
			}
			return err
		})
		if err != nil {
			return run, err
		}
		run.Messages += n
	}
	run.Total, run.Window = run.Messages, time.Since(start)
	return run, nil
}

// FloorLease is one claimed delivery, with what its `acked` event carries.
type FloorLease struct {
	MessageID uint64
	Token     uint64
	Consumer  string
	Attempt   int
	ClaimedAt time.Time
	Payload   []byte
}

// Claim leases up to limit ready deliveries, highest priority then oldest,
// skipping rows another claim holds, and reads their bodies: one short
// transaction of a locking read, the lease update and the body read.
func (f *Floor) Claim(ctx context.Context, topic, consumer string, limit int, visibility time.Duration) ([]FloorLease, error) {
	if f.Layout != LayoutQueue {
		return nil, errOwnedOnly
	}
	// Only the LeasedOut layout has the flag in its index; with the
	// product's layout a condition on it would read every walked row.
	notLeased := ""
	if f.LeasedOut {
		notLeased = " AND leased = 0"
	}
	now := f.now()
	token := f.token.Add(1)
	var out []FloorLease
	err := f.inTx(ctx, "claim", func(tx *sql.Tx) error {
		out = out[:0]
		ids, err := queryIDs(ctx, tx, "SELECT message_id FROM floor_queue WHERE topic = ? AND subscription = ?"+notLeased+" AND available_at <= ?"+
			" ORDER BY priority DESC, message_id LIMIT ? FOR UPDATE SKIP LOCKED", topic, FloorSubscription, now, limit)
		if err != nil || len(ids) == 0 {
			return err
		}
		leased := 0
		if f.LeasedOut {
			leased = 1
		}
		args := []any{token, consumer, now, now.Add(visibility), leased, FloorSubscription}
		if _, err := tx.ExecContext(ctx, "UPDATE floor_queue SET claim_token = ?, locked_by = ?, claimed_at = ?,"+
			" attempts = attempts + 1, available_at = ?, leased = ? WHERE subscription = ? AND message_id IN ("+marks(len(ids))+")",
			append(args, idArgs(ids)...)...); err != nil {
			return err
		}
		rows, err := tx.QueryContext(ctx, "SELECT id, payload FROM floor_store WHERE id IN ("+marks(len(ids))+")", idArgs(ids)...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			l := FloorLease{Token: token, Consumer: consumer, Attempt: 1, ClaimedAt: now}
			if err := rows.Scan(&l.MessageID, &l.Payload); err != nil {
				return err
			}
			out = append(out, l)
		}
		return rows.Err()
	})
	return out, err
}

// Ack completes one claim's leases (one token): deletes the deliveries the
// token still holds, writes each an `acked` event with its claim time,
// consumer and attempt, and marks the messages consumed, in one
// transaction. A lease the token no longer holds fails the whole ack: the
// floor's leases never expire during a run.
func (f *Floor) Ack(ctx context.Context, leases []FloorLease) error {
	if f.Layout != LayoutQueue {
		return errOwnedOnly
	}
	if len(leases) == 0 {
		return nil
	}
	now := f.now()
	ids := make([]uint64, len(leases))
	trace := make([]any, 0, 8*len(leases))
	for i, l := range leases {
		ids[i] = l.MessageID
		trace = append(trace, l.MessageID, f.ids.Add(1), FloorSubscription, "acked", l.Consumer, l.Attempt, l.ClaimedAt, now)
	}
	return f.inTx(ctx, "ack", func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, "DELETE FROM floor_queue WHERE subscription = ? AND claim_token = ? AND message_id IN ("+
			marks(len(ids))+")", append([]any{FloorSubscription, leases[0].Token}, idArgs(ids)...)...)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil || n != int64(len(ids)) {
			return fmt.Errorf("deleted %d of %d deliveries (%v)", n, len(ids), err)
		}
		switch f.Acks {
		case AckDeleteOnly:
			return nil
		case AckFolded:
			return f.finalAck(ctx, tx, leases, "", now)
		}
		if _, err := tx.ExecContext(ctx, "INSERT INTO floor_trace (message_id, id, subscription, event, consumer, attempt, claimed_at, created_at) VALUES "+
			repeatList("(?,?,?,?,?,?,?,?)", len(leases)), trace...); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, "UPDATE floor_store SET msg_status = 1, status_at = ? WHERE id IN ("+marks(len(ids))+")",
			append([]any{now}, idArgs(ids)...)...)
		return err
	})
}

// finalAck writes one claim's final ack on its messages' rows in tx, as
// the product's final ack does (store's markAcked): the status and the
// ack's slot (its time, subscription, consumer, attempt, claim time,
// request) in place, or, when they do not fit the slot, the status and its
// time with the acked_* columns (request NULL when empty). One claim's leases share consumer, attempt and claim
// time, so one UPDATE with constants carries them. In the inline and
// one-row layouts the same update ends the default subscription's
// delivery, and only a delivery still ready is acked: an ack of a message
// acked already changes fewer rows than it names, and fails.
func (f *Floor) finalAck(ctx context.Context, tx *sql.Tx, leases []FloorLease, request string, now time.Time) error {
	l := leases[0]
	var req any
	if request != "" {
		req = request
	}
	ids := make([]uint64, len(leases))
	for i, x := range leases {
		ids[i] = x.MessageID
	}
	byID, args := f.rowsByID(ids)
	q := "UPDATE floor_store SET msg_status = 1, status_at = ?, acked_sub = ?, acked_by = ?, acked_attempt = ?, acked_claimed_at = ?, acked_request = ?"
	set := []any{now, FloorSubscription, l.Consumer, l.Attempt, l.ClaimedAt, req}
	if slot, ok := store.FinalAckSlot(FloorSubscription, l.Consumer, request, l.Attempt, l.ClaimedAt, now); ok {
		q, set = "UPDATE floor_store SET msg_status = 1, ack_slot = ?", []any{slot}
	}
	if f.Layout == LayoutQueue {
		q += " WHERE " + byID
	} else {
		q += ", dlv_state = 1 WHERE dlv_state = 0 AND " + byID
	}
	res, err := tx.ExecContext(ctx, q, append(set, args...)...)
	if err != nil || f.Layout == LayoutQueue {
		return err
	}
	if n, err := res.RowsAffected(); err != nil || n != int64(len(ids)) {
		return fmt.Errorf("acked %d of %d deliveries (%v)", n, len(ids), err)
	}
	return nil
}

// Counts reads how many messages, live deliveries (the inline and one-row
// layouts' ready message rows among them), `acked` events (trace rows, or
// folded into message rows) and consumed messages the floor holds: what a
// test checks after a run.
func (f *Floor) Counts(ctx context.Context) (messages, deliveries, acked, consumed int64, err error) {
	live := "(SELECT COUNT(*) FROM floor_queue)"
	if f.Layout != LayoutQueue {
		live += " + (SELECT COUNT(*) FROM floor_store WHERE dlv_state = 0)"
	}
	err = f.DB.QueryRowContext(ctx, "SELECT (SELECT COUNT(*) FROM floor_store), "+live+","+
		" (SELECT COUNT(*) FROM floor_trace WHERE event = 'acked') + (SELECT COUNT(*) FROM floor_store WHERE acked_by IS NOT NULL OR ack_slot <> REPEAT(0x00, 64)),"+
		" (SELECT COUNT(*) FROM floor_store WHERE msg_status = 1)").
		Scan(&messages, &deliveries, &acked, &consumed)
	if err != nil {
		err = fmt.Errorf("floor: counts: %w", err)
	}
	return
}

// inTx runs fn in a transaction, again after a deadlock (error 1213),
// which concurrent multi-row inserts and locking reads may meet: up to
// 20 tries, waiting a little longer each time.
func (f *Floor) inTx(ctx context.Context, what string, fn func(*sql.Tx) error) error {
	var err error
	for attempt := range 20 {
		if attempt > 0 {
			// Deadlocks come in bursts on a loaded machine: back off a
			// little more each time rather than fail the whole run.
			if werr := ctxwait.Sleep(ctx, time.Duration(attempt)*5*time.Millisecond); werr != nil {
				return fmt.Errorf("floor: %s: %w", what, err)
			}
		}
		var tx *sql.Tx
		if tx, err = f.DB.BeginTx(ctx, nil); err != nil {
			break
		}
		if err = fn(tx); err == nil {
			if err = tx.Commit(); err == nil {
				return nil
			}
		} else {
			tx.Rollback()
		}
		var me *mysql.MySQLError
		if !errors.As(err, &me) || me.Number != 1213 {
			break
		}
	}
	return fmt.Errorf("floor: %s: %w", what, err)
}

// FloorRun is the outcome of a floor phase.
type FloorRun struct {
	Messages int64         // counted: committed inside the window (produce) or the whole backlog (consume)
	Total    int64         // moved over the whole phase, warm-up included: the CPU's divisor
	Window   time.Duration // the counted span
}

// PerSec is the phase's rate.
func (r FloorRun) PerSec() float64 {
	if r.Window <= 0 {
		return 0
	}
	return float64(r.Messages) / r.Window.Seconds()
}

// Preload publishes n messages to topic with workers, batch per
// transaction: the backlog a consume phase drains (not measured).
func (f *Floor) Preload(ctx context.Context, topic string, n, workers, batch int) error {
	var seq, left atomic.Int64
	left.Store(int64(n))
	g, gctx := errgroup.WithContext(ctx)
	for w := range workers {
		g.Go(func() error {
			for {
				k := min(int64(batch), left.Add(-int64(batch))+int64(batch))
				if k <= 0 {
					return nil
				}
				if err := f.Publish(gctx, topic, floorMessages(int(k), fmt.Sprint("p", w), &seq)); err != nil {
					return err
				}
			}
		})
	}
	return g.Wait()
}

// ProduceBatched runs workers closed loop for d, each publishing batch
// messages per transaction, and counts what committed after warmup.
func (f *Floor) ProduceBatched(ctx context.Context, topic string, workers, batch int, d, warmup time.Duration) (FloorRun, error) {
	var seq atomic.Int64
	return f.window(ctx, workers, d, warmup, func(ctx context.Context, w int) (int, error) {
		msgs := floorMessages(batch, fmt.Sprint("w", w), &seq)
		return len(msgs), f.Publish(ctx, topic, msgs)
	})
}

// ProduceSingle runs clients closed loop for d, each sending one message
// at a time and waiting for its commit, gathered by an ideal group commit:
// up to committers transactions in flight, each taking every message that
// waits (at most 500), with no HTTP, no JSON and no linger between the
// clients and the database. It is the floor of issue 17's single-message
// producers: what one-at-a-time senders can get from the database when
// nothing else costs anything.
func (f *Floor) ProduceSingle(ctx context.Context, topic string, clients, committers int, d, warmup time.Duration) (FloorRun, error) {
	type req struct {
		m    FloorMessage
		done chan error
	}
	queue := make(chan req, clients)
	cctx, cancel := context.WithCancel(ctx)
	var cwg sync.WaitGroup
	for range committers {
		cwg.Add(1)
		go func() {
			defer cwg.Done()
			for {
				var batch []req
				select {
				case r := <-queue:
					batch = append(batch, r)
				case <-cctx.Done():
					return
				}
			more:
				for len(batch) < 500 {
					select {
					case r := <-queue:
						batch = append(batch, r)
					default:
						break more
					}
				}
				msgs := make([]FloorMessage, len(batch))
				for i, r := range batch {
					msgs[i] = r.m
				}
				err := f.Publish(ctx, topic, msgs)
				for _, r := range batch {
					r.done <- err
				}
			}
		}()
	}
	var seq atomic.Int64
	run, err := f.window(ctx, clients, d, warmup, func(ctx context.Context, w int) (int, error) {
		r := req{m: floorMessages(1, fmt.Sprint("s", w), &seq)[0], done: make(chan error, 1)}
		select {
		case queue <- r:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
		return 1, <-r.done
	})
	cancel()
	cwg.Wait()
	return run, err
}

// window runs workers closed loop for d; each call of one reports how many
// messages it committed. Those that finish after warmup count.
func (f *Floor) window(ctx context.Context, workers int, d, warmup time.Duration, one func(context.Context, int) (int, error)) (FloorRun, error) {
	start := time.Now()
	from, end := start.Add(warmup), start.Add(d)
	var counted, total atomic.Int64
	err := f.workers(ctx, workers, func(w int) (bool, error) {
		if !time.Now().Before(end) {
			return false, nil
		}
		n, err := one(ctx, w)
		if err != nil {
			return false, err
		}
		total.Add(int64(n))
		if now := time.Now(); !now.Before(from) && !now.After(end) {
			counted.Add(int64(n))
		}
		return true, nil
	})
	return FloorRun{Messages: counted.Load(), Total: total.Load(), Window: d - warmup}, err
}

// workers runs n loops of step (given the loop's number) until step
// says stop, fails or ctx ends; the answer is the first failure, or ctx's
// error.
func (f *Floor) workers(ctx context.Context, n int, step func(w int) (bool, error)) error {
	var g errgroup.Group
	for w := range n {
		g.Go(func() error {
			for ctx.Err() == nil {
				if more, err := step(w); err != nil || !more {
					return err
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	return ctx.Err()
}

// Consume drains topic's whole backlog with workers, each claiming batch and
// acking what it got, and reports the backlog over the time until the last
// ack committed. A claim that finds nothing while others still hold leases
// tries again; the phase ends when a claim finds nothing and every
// delivery is acked.
func (f *Floor) Consume(ctx context.Context, topic string, workers, batch int, backlog int64) (FloorRun, error) {
	start := time.Now()
	var acked atomic.Int64
	err := f.workers(ctx, workers, func(w int) (bool, error) {
		if acked.Load() >= backlog {
			return false, nil
		}
		leases, err := f.Claim(ctx, topic, fmt.Sprint("floor-", w), batch, time.Minute)
		if err == nil {
			err = f.Ack(ctx, leases)
		}
		if err != nil {
			return false, err
		}
		acked.Add(int64(len(leases)))
		if len(leases) == 0 {
			ctxwait.Sleep(ctx, time.Millisecond) // the last leases are another worker's
		}
		return true, nil
	})
	if err == nil && acked.Load() != backlog {
		err = fmt.Errorf("floor: consumed %d of %d", acked.Load(), backlog)
	}
	return FloorRun{Messages: acked.Load(), Total: acked.Load(), Window: time.Since(start)}, err
}

// floorMessages makes n messages of the load tester's payload size (100–
// 300 bytes of JSON, uniform) with unique keys.
func floorMessages(n int, prefix string, seq *atomic.Int64) []FloorMessage {
	out := make([]FloorMessage, n)
	for i := range out {
		key := fmt.Sprintf("%s-%d", prefix, seq.Add(1))
		body := `{"key":"` + key + `","p":"`
		pad := max(100+rand.IntN(201)-len(body)-2, 0)
		out[i] = FloorMessage{Key: key, Payload: []byte(body + strings.Repeat("x", pad) + `"}`)}
	}
	return out
}

func queryIDs(ctx context.Context, tx *sql.Tx, q string, args ...any) ([]uint64, error) {
	rows, err := tx.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var ids []uint64
	for rows.Next() {
		var id uint64
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	return ids, rows.Err()
}

func marks(n int) string { return strings.TrimSuffix(strings.Repeat("?,", n), ",") }

func repeatList(row string, n int) string {
	return strings.TrimSuffix(strings.Repeat(row+",", n), ",")
}

func idArgs(ids []uint64) []any {
	out := make([]any, len(ids))
	for i, id := range ids {
		out[i] = id
	}
	return out
}

// ConsumeOwned drains topic's backlog as the owner model does (issue 28):
// one owner holds the in-flight set in memory, a claim is a non-locking
// read of the claim index from a cursor plus the bodies (no lease row, no
// commit), and acks from every worker are coalesced into one transaction
// (an epoch check of the owner row, the delete, and Acks' rows; in the
// inline and one-row layouts the epoch check and one update of the
// message rows per ack request) every flushEvery or flushMax acks. An ack
// returns only after its flush committed.
func (f *Floor) ConsumeOwned(ctx context.Context, topic string, workers, batch int, backlog int64, flushEvery time.Duration, flushMax int) (FloorRun, error) {
	if err := f.check(); err != nil {
		return FloorRun{}, err
	}
	if _, err := f.DB.ExecContext(ctx, "CREATE TABLE IF NOT EXISTS floor_owner (topic VARBINARY(128) NOT NULL, subscription VARBINARY(128) NOT NULL, epoch BIGINT NOT NULL, PRIMARY KEY (topic, subscription)) ENGINE=InnoDB"); err != nil {
		return FloorRun{}, err
	}
	if _, err := f.DB.ExecContext(ctx, "REPLACE INTO floor_owner VALUES (?, ?, 1)", topic, FloorSubscription); err != nil {
		return FloorRun{}, err
	}
	o := &floorOwner{f: f, topic: topic, inflight: map[uint64]bool{}}
	acks := make(chan floorAck, workers*2)
	fctx, stopFlush := context.WithCancel(ctx)
	var fwg sync.WaitGroup
	fwg.Add(1)
	go func() {
		defer fwg.Done()
		for {
			var pend []floorAck
			select {
			case r := <-acks:
				pend = append(pend, r)
			case <-fctx.Done():
				return
			}
			timer := time.NewTimer(flushEvery)
			n := len(pend[0].leases)
		gather:
			for n < flushMax {
				select {
				case r := <-acks:
					pend = append(pend, r)
					n += len(r.leases)
				case <-timer.C:
					break gather
				}
			}
			timer.Stop()
			err := o.flush(ctx, pend)
			for _, r := range pend {
				r.done <- err
			}
		}
	}()
	start := time.Now()
	var acked atomic.Int64
	err := f.workers(ctx, workers, func(w int) (bool, error) {
		if acked.Load() >= backlog {
			return false, nil
		}
		leases, err := o.claim(ctx, fmt.Sprint("floor-", w), batch)
		if err != nil {
			return false, err
		}
		if len(leases) > 0 {
			r := floorAck{leases: leases, request: reqid.New(), done: make(chan error, 1)}
			acks <- r
			if err := <-r.done; err != nil {
				return false, err
			}
		}
		acked.Add(int64(len(leases)))
		if len(leases) == 0 {
			ctxwait.Sleep(ctx, time.Millisecond)
		}
		return true, nil
	})
	stopFlush()
	fwg.Wait()
	if err == nil && acked.Load() != backlog {
		err = fmt.Errorf("floor: consumed %d of %d", acked.Load(), backlog)
	}
	return FloorRun{Messages: acked.Load(), Total: acked.Load(), Window: time.Since(start)}, err
}

// floorAck is one ack request of an owned consume: one claim's leases,
// acked together under a request id as the product's acks are.
type floorAck struct {
	leases  []FloorLease
	request string
	done    chan error // the flush's outcome
}

type floorOwner struct {
	f        *Floor
	topic    string
	mu       sync.Mutex
	inflight map[uint64]bool
	buf      []uint64
	cursor   uint64 // last id scanned (priority 0 only in the floor)
}

// Owned claims find ready deliveries through the layout's claim index,
// from the owner's cursor, in claim order, without locks: floor_queue's
// idx_claim, or the inline and one-row layouts' on floor_store (the
// inline layout's is one index per month partition, merged; the one-row
// layout's table is not partitioned).
const (
	floorOwnedScan = "SELECT message_id FROM floor_queue WHERE topic = ? AND subscription = ? AND available_at <= ?" +
		" AND (priority < 0 OR (priority = 0 AND message_id > ?)) ORDER BY priority DESC, message_id LIMIT ?"
	floorInlineOwnedScan = "SELECT id FROM floor_store WHERE topic = ? AND dlv_state = 0 AND available_at <= ?" +
		" AND (priority < 0 OR (priority = 0 AND id > ?)) ORDER BY priority DESC, id LIMIT ?"
)

func (o *floorOwner) claim(ctx context.Context, consumer string, n int) ([]FloorLease, error) {
	now := o.f.now()
	o.mu.Lock()
	if len(o.buf) < n {
		ids, err := func() ([]uint64, error) {
			q, args := floorOwnedScan, []any{o.topic, FloorSubscription, now, o.cursor, 4 * n}
			if o.f.Layout != LayoutQueue {
				q, args = floorInlineOwnedScan, []any{o.topic, now, o.cursor, 4 * n}
			}
			rows, err := o.f.DB.QueryContext(ctx, q, args...)
			if err != nil {
				return nil, err
			}
			defer rows.Close()
			var ids []uint64
			for rows.Next() {
				var id uint64
				if err := rows.Scan(&id); err != nil {
					return nil, err
				}
				ids = append(ids, id)
			}
			return ids, rows.Err()
		}()
		if err != nil {
			o.mu.Unlock()
			return nil, err
		}
		if len(ids) < 4*n {
			o.cursor = 0
		} else {
			o.cursor = ids[len(ids)-1]
		}
		for _, id := range ids {
			if !o.inflight[id] {
				o.inflight[id] = true
				o.buf = append(o.buf, id)
			}
		}
	}
	k := min(n, len(o.buf))
	ids := append([]uint64(nil), o.buf[:k]...)
	o.buf = o.buf[k:]
	o.mu.Unlock()
	if len(ids) == 0 {
		return nil, nil
	}
	byID, args := o.f.rowsByID(ids)
	rows, err := o.f.DB.QueryContext(ctx, "SELECT id, payload FROM floor_store WHERE "+byID, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []FloorLease
	for rows.Next() {
		l := FloorLease{Token: 1, Consumer: consumer, Attempt: 1, ClaimedAt: now}
		if err := rows.Scan(&l.MessageID, &l.Payload); err != nil {
			return nil, err
		}
		out = append(out, l)
	}
	return out, rows.Err()
}

// flush writes acks in one transaction: the owner's epoch checked, then
// in the queue layout the deliveries deleted and Acks' rows written; in
// the inline and one-row layouts each ack request's final ack on its
// message rows, which ends their delivery (finalAck).
func (o *floorOwner) flush(ctx context.Context, acks []floorAck) error {
	now := o.f.now()
	var leases []FloorLease
	for _, a := range acks {
		leases = append(leases, a.leases...)
	}
	ids := make([]uint64, len(leases))
	for i, l := range leases {
		ids[i] = l.MessageID
	}
	finalAcks := func(tx *sql.Tx) error {
		for _, a := range acks {
			if err := o.f.finalAck(ctx, tx, a.leases, a.request, now); err != nil {
				return err
			}
		}
		return nil
	}
	err := o.f.inTx(ctx, "owned ack", func(tx *sql.Tx) error {
		var epoch int64
		if err := tx.QueryRowContext(ctx, "SELECT epoch FROM floor_owner WHERE topic = ? AND subscription = ? LOCK IN SHARE MODE", o.topic, FloorSubscription).Scan(&epoch); err != nil {
			return err
		}
		if epoch != 1 {
			return fmt.Errorf("epoch %d", epoch)
		}
		if o.f.Layout != LayoutQueue {
			return finalAcks(tx)
		}
		res, err := tx.ExecContext(ctx, "DELETE FROM floor_queue WHERE subscription = ? AND message_id IN ("+marks(len(ids))+")",
			append([]any{FloorSubscription}, idArgs(ids)...)...)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil || n != int64(len(ids)) {
			return fmt.Errorf("deleted %d of %d deliveries (%v)", n, len(ids), err)
		}
		switch o.f.Acks {
		case AckDeleteOnly:
			return nil
		case AckFolded:
			return finalAcks(tx)
		}
		trace := make([]any, 0, 8*len(leases))
		for _, l := range leases {
			trace = append(trace, l.MessageID, o.f.ids.Add(1), FloorSubscription, "acked", l.Consumer, l.Attempt, l.ClaimedAt, now)
		}
		if _, err := tx.ExecContext(ctx, "INSERT INTO floor_trace (message_id, id, subscription, event, consumer, attempt, claimed_at, created_at) VALUES "+
			repeatList("(?,?,?,?,?,?,?,?)", len(leases)), trace...); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, "UPDATE floor_store SET msg_status = 1, status_at = ? WHERE id IN ("+marks(len(ids))+")",
			append([]any{now}, idArgs(ids)...)...)
		return err
	})
	if err != nil {
		return err
	}
	o.mu.Lock()
	for _, id := range ids {
		delete(o.inflight, id)
	}
	o.mu.Unlock()
	return nil
}
