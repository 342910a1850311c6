// Package store is everything shardmq does to one MySQL cluster: the schema
// and its migrations, and the transactions of produce, claim, ack, nack and
// extend. All SQL lives here, one file per table.
package store

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/shardmq/shardmq/domain"
	"github.com/shardmq/shardmq/internal/idgen"
)

// Errors callers match with errors.Is; they are domain's, so a caller that
// does not import store can match them too.
var (
	ErrNotFound       = domain.ErrNotFound
	ErrUnavailable    = domain.ErrUnavailable
	ErrOutcomeUnknown = domain.ErrOutcomeUnknown
)

// Options configure a Store.
type Options struct {
	// MaxOpen caps the cluster's connection pool. Defaults to 64: enough
	// for group-committed batches and claims on 2 cores; each router holds
	// up to this many connections to each primary.
	MaxOpen int
	// MaxIdle defaults to half of MaxOpen.
	MaxIdle int
	// MaxLifetime defaults to 30 minutes.
	MaxLifetime time.Duration
	// IDs makes trace event ids. Defaults to a new generator.
	IDs *idgen.Gen
	// OnRetry is called each time a transaction is run again after a
	// deadlock or lock wait timeout, with the operation's name (metrics).
	OnRetry func(op string)
	// OnDeliveries is called after a claim or nack commits with how many
	// of a subscription's deliveries it moved by event: EventLeaseExpired
	// (a claim found a lapsed lease) and EventDeadLettered (by a nack or a
	// lease lapsed on the last attempt). For metrics; it must not block.
	OnDeliveries func(topic, subscription, event string, n int)
}

func (p Options) withDefaults() Options {
	if p.MaxOpen <= 0 {
		p.MaxOpen = 64
	}
	if p.MaxIdle <= 0 {
		p.MaxIdle = p.MaxOpen / 2
	}
	if p.MaxLifetime <= 0 {
		p.MaxLifetime = 30 * time.Minute
	}
	if p.IDs == nil {
		p.IDs = idgen.New(nil)
	}
	return p
}

// Store is one cluster's primary (or a replica, for reads).
type Store struct {
	db      *sql.DB
	ids     *idgen.Gen
	onRetry func(op string)
	onDeliv func(topic, subscription, event string, n int)
	mariadb bool // else MySQL: GTID functions differ
	// cfg is the driver configuration the pool was opened with (a
	// leader's reshard sessions open a pool of their own from it).
	cfg *mysql.Config
	// packet and rowBytes size the copies' statements (packet.go).
	packet   packetLimit
	rowBytes rowSizes
	// fastCommit, when set (tests), runs the fast flush's COMMIT on
	// conn: it may run it and then lose its answer, as a stalled router
	// or a cut connection does, or end the transaction otherwise.
	fastCommit func(conn *sql.Conn, commit func() error) error
	// slotsOff makes final acks write the acked_* columns, not the slot:
	// a router that does not read the slot is live (SetAckSlots).
	slotsOff atomic.Bool
	// orderTable: idx_order is gone, heads are read through
	// message_order (message_order.go); orderDropAfter is when this
	// router may next try to drop idx_order (unix nanoseconds).
	orderTable     atomic.Bool
	orderDropAfter atomic.Int64
	orderDropping  atomic.Bool
}

// SetAckSlots says whether final acks may be written into the message
// row's slot (ack_slot.go): not while a router of a version that does not
// read it (before migration 19) is a live member of the cluster, since
// its trace, reconciliation and moves would miss the ack. Beat sets it
// from the members it reads. On by default: a router that is no member
// (no address) serves alone.
func (s *Store) SetAckSlots(on bool) { s.slotsOff.Store(!on) }

// Open connects to dsn (go-sql-driver form) with the session settings
// shardmq relies on: UTC times, one round trip per statement
// (interpolateParams), READ COMMITTED (fewer gap locks on the dedup insert),
// range estimates of long id lists from statistics, and a refusal to
// write to a read-only server (so a demoted primary is noticed). It
// checks the connection before returning.
func Open(ctx context.Context, dsn string, opts Options) (*Store, error) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, fmt.Errorf("parse DSN: %w", err)
	}
	cfg.ParseTime = true
	cfg.Loc = time.UTC
	cfg.InterpolateParams = true
	cfg.RejectReadOnly = true
	// The produce fast path sends its inserts as one multi-statement
	// (values are still escaped by interpolateParams, never concatenated).
	cfg.MultiStatements = true
	if cfg.Timeout == 0 {
		cfg.Timeout = 2 * time.Second
	}
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	cfg.Params["time_zone"] = "'+00:00'"
	// A list of ids on a key's prefix (the flush's read of the deliveries
	// left, message_id IN (…) on (message_id, subscription)) made the
	// range optimizer read the index once per id to estimate the rows,
	// then again to run it: that statement was a tenth of a primary's CPU
	// in a drain, two thirds of it those reads (docs/performance.md, "2
	// Dec (night)"). Past ten values the index's statistics stand in for
	// them. Unique keys given whole are not estimated either way, and the
	// scans name their index.
	cfg.Params["eq_range_index_dive_limit"] = "10"
	// MariaDB before 11.1 only knows tx_isolation; MySQL 8 only
	// transaction_isolation. Ask the server which it is.
	isoVar, mariadb, err := probeServer(ctx, cfg)
	if err != nil {
		return nil, err
	}
	cfg.Params[isoVar] = "'READ-COMMITTED'"
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", cfg.Addr, err)
	}
	db := sql.OpenDB(conn)
	p := opts.withDefaults()
	db.SetMaxOpenConns(p.MaxOpen)
	db.SetMaxIdleConns(p.MaxIdle)
	db.SetConnMaxLifetime(p.MaxLifetime)
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("connect %s: %w", cfg.Addr, translate(err))
	}
	return &Store{db: db, ids: p.IDs, onRetry: p.OnRetry, onDeliv: p.OnDeliveries, mariadb: mariadb, cfg: cfg}, nil
}

func (s *Store) retryHook(op string) func() {
	if s.onRetry == nil {
		return nil
	}
	return func() { s.onRetry(op) }
}

// counted reports n deliveries moved by event to OnDeliveries.
func (s *Store) counted(topic, sub, event string, n int) {
	if n > 0 && s.onDeliv != nil {
		s.onDeliv(topic, sub, event, n)
	}
}

// probeServer tells MariaDB from MySQL and names the session variable of
// the isolation level.
func probeServer(ctx context.Context, cfg *mysql.Config) (isoVar string, mariadb bool, err error) {
	probe := cfg.Clone()
	probe.DBName = ""
	conn, err := mysql.NewConnector(probe)
	if err != nil {
		return "", false, fmt.Errorf("open %s: %w", cfg.Addr, err)
	}
	db := sql.OpenDB(conn)
	defer db.Close()
	var version string
	if err := db.QueryRowContext(ctx, "SELECT VERSION()").Scan(&version); err != nil {
		return "", false, fmt.Errorf("connect %s: %w", cfg.Addr, translate(err))
	}
	if strings.Contains(strings.ToLower(version), "mariadb") {
		var has int
		err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.GLOBAL_VARIABLES WHERE VARIABLE_NAME = 'TRANSACTION_ISOLATION'").Scan(&has)
		if err != nil {
			return "", true, fmt.Errorf("probe %s: %w", cfg.Addr, translate(err))
		}
		if has == 0 {
			return "tx_isolation", true, nil
		}
		return "transaction_isolation", true, nil
	}
	return "transaction_isolation", false, nil
}

// DB exposes the pool for the test bed and the load tester's baseline.
func (s *Store) DB() *sql.DB { return s.db }

// Close closes the pool.
func (s *Store) Close() error { return s.db.Close() }

// Ping checks the server answers.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.db.PingContext(ctx); err != nil {
		return translate(err)
	}
	return nil
}

// MySQL error numbers we act on.
const (
	errDupEntry      = 1062
	errLockWait      = 1205
	errDeadlock      = 1213
	errReadOnly      = 1290
	errReadOnlyTx    = 1792
	errTooManyConns  = 1040
	errServerShutdow = 1053
)

// translate turns driver errors into the package's errors at the boundary.
func translate(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, sql.ErrNoRows) {
		return ErrNotFound
	}
	// Already translated (the query helpers answer ErrNotFound for no row):
	// wrapping it again would turn a missing row into an outage.
	if errors.Is(err, ErrNotFound) || errors.Is(err, ErrUnavailable) || errors.Is(err, ErrInvalidData) || errors.Is(err, ErrOutcomeUnknown) ||
		errors.Is(err, ErrOwned) || errors.Is(err, ErrStaleOwner) || errors.Is(err, errFlushRecount) || errors.Is(err, ErrFenced) ||
		errors.Is(err, ErrNotOwnerRecord) || errors.Is(err, ErrSuperseded) {
		return err
	}
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		switch me.Number {
		case errReadOnly, errReadOnlyTx, errTooManyConns, errServerShutdow,
			errDeadlock, errLockWait: // a lock still contended after the retries: try later
			return fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		if invalidData(me.Number) {
			return fmt.Errorf("%w: %w", ErrInvalidData, err)
		}
		return err
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	// Anything else from the driver is a broken or refused connection.
	return fmt.Errorf("%w: %w", ErrUnavailable, err)
}

// retryable reports a deadlock or lock wait timeout, or a connection lost
// before the COMMIT was sent: the transaction was rolled back and may be
// run again whole.
func retryable(err error) bool {
	var me *mysql.MySQLError
	return errors.Is(err, errLostBeforeCommit) || errors.As(err, &me) && (me.Number == errDeadlock || me.Number == errLockWait)
}

// errLostBeforeCommit marks a transaction whose connection broke before
// its COMMIT was sent (killed, reset, a server that went away): the server
// rolls such a transaction back, so running it again cannot apply it
// twice. A break during the COMMIT itself is not this: its outcome is
// unknown (uncertain).
var errLostBeforeCommit = errors.New("connection lost before commit")

// lostBeforeCommit marks err errLostBeforeCommit when the driver says the
// connection is broken.
func lostBeforeCommit(err error) error {
	if errors.Is(err, mysql.ErrInvalidConn) || errors.Is(err, driver.ErrBadConn) {
		return fmt.Errorf("%w: %w", errLostBeforeCommit, err)
	}
	return err
}

// txAttempts is how many times a write transaction runs when it meets a
// deadlock or lock wait timeout: the one default of every write here (the
// claim passes 3, its consumer simply claims again).
const txAttempts = 5

// retry runs try up to attempts times while it fails with a deadlock or a
// lock wait timeout (the transaction was rolled back whole), calling
// onRetry before each rerun; the last error is translated.
func retry[T any](attempts int, onRetry func(), try func() (T, error)) (T, error) {
	var v T
	var err error
	for i := 0; i < attempts; i++ {
		if i > 0 && onRetry != nil {
			onRetry()
		}
		v, err = try()
		if err == nil || !retryable(err) {
			return v, translate(err)
		}
	}
	var zero T
	return zero, fmt.Errorf("gave up after %d deadlocks, lock waits or lost connections: %w", attempts, err)
}

// inTx runs fn in a transaction, retrying the whole of it on deadlock or lock
// wait timeout up to attempts times. onRetry counts retries for metrics.
// When ctx carries a Fence, the transaction first checks it
// (shard_fence.go) and fails with a FenceError, having written nothing,
// when the cluster's fence is newer.
func (s *Store) inTx(ctx context.Context, attempts int, onRetry func(), fn func(tx *sql.Tx) error) error {
	_, err := s.inTxGTID(ctx, attempts, onRetry, false, fn)
	return err
}

// inTxGTID is inTx that, when wantGTID is set, also returns the GTID of the
// committed transaction (read on the same connection right after COMMIT),
// for callers that wait until a replica has applied it.
func (s *Store) inTxGTID(ctx context.Context, attempts int, onRetry func(), wantGTID bool, fn func(tx *sql.Tx) error) (string, error) {
	return retry(attempts, onRetry, func() (string, error) { return s.tryTx(ctx, wantGTID, fn) })
}

func (s *Store) tryTx(ctx context.Context, wantGTID bool, fn func(tx *sql.Tx) error) (string, error) {
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		return "", lostBeforeCommit(err)
	}
	if err := checkFence(ctx, tx); err != nil {
		tx.Rollback()
		return "", lostBeforeCommit(err)
	}
	if err := checkOwnerRecord(ctx, tx); err != nil {
		tx.Rollback()
		return "", lostBeforeCommit(err)
	}
	if err := fn(tx); err != nil {
		tx.Rollback()
		return "", lostBeforeCommit(err)
	}
	if err := tx.Commit(); err != nil {
		return "", uncertain(err)
	}
	if !wantGTID {
		return "", nil
	}
	return s.committedGTID(ctx, conn)
}

// rollbackConn ends the transaction that a multi-statement of its own
// (START TRANSACTION among its statements, as the fast paths send) may
// have left open on conn; when that fails, the connection is dropped, so
// that it never goes back to the pool inside a transaction.
func rollbackConn(ctx context.Context, conn *sql.Conn) {
	if _, err := conn.ExecContext(context.WithoutCancel(ctx), "ROLLBACK"); err != nil {
		conn.Raw(func(any) error { return driver.ErrBadConn })
	}
}

// uncertain marks err, met while a COMMIT was sent or on its way,
// ErrOutcomeUnknown unless the server answered it with an error of its
// own (then nothing was applied): a broken connection or a wait that ran
// out says nothing about whether the commit happened.
func uncertain(err error) error {
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrOutcomeUnknown, translate(err))
}

// committedGTID reads the server's GTID position on conn right after a
// commit on it. The position contains our transaction — and, when every
// item was a duplicate and nothing was written, the original's — so
// waiting for it on a replica waits for at least ours.
func (s *Store) committedGTID(ctx context.Context, conn *sql.Conn) (string, error) {
	q := "SELECT @@GLOBAL.gtid_binlog_pos"
	if !s.mariadb {
		q = "SELECT @@GLOBAL.gtid_executed"
	}
	var gtid string
	if err := conn.QueryRowContext(ctx, q).Scan(&gtid); err != nil {
		return "", fmt.Errorf("%w: committed, but reading its GTID failed: %w", errCommittedNoGTID, err)
	}
	return gtid, nil
}

// errCommittedNoGTID: the transaction committed but its GTID is unknown, so
// a replicated-durability wait cannot be done (the write itself is safe).
var errCommittedNoGTID = errors.New("committed without GTID")

// WaitGTID waits until this server (a replica) has applied gtid, up to
// timeout. It returns ErrReplicaBehind when the time runs out.
func (s *Store) WaitGTID(ctx context.Context, gtid string, timeout time.Duration) error {
	q := "SELECT MASTER_GTID_WAIT(?, ?)"
	timeoutOK := int64(-1)
	if !s.mariadb {
		q = "SELECT WAIT_FOR_EXECUTED_GTID_SET(?, ?)"
		timeoutOK = 1
	}
	var rc sql.NullInt64
	if err := s.db.QueryRowContext(ctx, q, gtid, timeout.Seconds()).Scan(&rc); err != nil {
		return fmt.Errorf("wait for GTID %s: %w", gtid, translate(err))
	}
	if !rc.Valid || rc.Int64 == timeoutOK {
		return fmt.Errorf("%w: GTID %s not applied within %s", ErrReplicaBehind, gtid, timeout)
	}
	return nil
}

// ErrReplicaBehind: a replica did not apply a transaction in time.
var ErrReplicaBehind = errors.New("replica has not applied the write")

// DurabilityWarnings lists server settings that make a commit less than
// durable (innodb_flush_log_at_trx_commit != 1, sync_binlog != 1), for the
// router to warn about at start.
func (s *Store) DurabilityWarnings(ctx context.Context) ([]string, error) {
	var flush, syncBinlog int
	if err := s.db.QueryRowContext(ctx, "SELECT @@innodb_flush_log_at_trx_commit, @@sync_binlog").Scan(&flush, &syncBinlog); err != nil {
		return nil, fmt.Errorf("read durability settings: %w", translate(err))
	}
	var out []string
	if flush != 1 {
		out = append(out, fmt.Sprintf("innodb_flush_log_at_trx_commit = %d (1 is needed for every commit to survive a crash)", flush))
	}
	if syncBinlog != 1 {
		out = append(out, fmt.Sprintf("sync_binlog = %d (1 is needed for the binary log, and so replicas, to keep every commit)", syncBinlog))
	}
	return out, nil
}

// execMulti runs a multi-statement on conn and returns each statement's
// affected-row count, which database/sql's Result cannot give.
func execMulti(ctx context.Context, conn *sql.Conn, query string, args []any) ([]int64, error) {
	var affected []int64
	err := conn.Raw(func(dc any) error {
		ex, ok := dc.(driver.ExecerContext)
		if !ok {
			return errors.New("driver connection cannot execute")
		}
		buf := namedValueBufs.Get().(*[]driver.NamedValue)
		defer namedValueBufs.Put(buf)
		nv, err := namedValues((*buf)[:0], dc, args)
		if err != nil {
			return err
		}
		res, err := ex.ExecContext(ctx, query, nv)
		clear(nv) // the driver keeps nothing of it once it returned
		*buf = nv[:0]
		if err != nil {
			return err
		}
		r, ok := res.(mysql.Result)
		if !ok {
			return errors.New("driver result has no per-statement counts")
		}
		affected = r.AllRowsAffected()
		return nil
	})
	return affected, err
}

// namedValueBufs holds execMulti's argument slices: a batch of 100
// messages has 2,400 arguments (96 KB of driver.NamedValue).
var namedValueBufs = sync.Pool{New: func() any { return new([]driver.NamedValue) }}

// namedValues appends args to nv converted for the driver connection dc
// as database/sql would: with dc's NamedValueChecker, or else the default
// converter.
func namedValues(nv []driver.NamedValue, dc any, args []any) ([]driver.NamedValue, error) {
	nv = slices.Grow(nv, len(args))[:len(args)]
	checker, _ := dc.(driver.NamedValueChecker)
	for i, a := range args {
		nv[i] = driver.NamedValue{Ordinal: i + 1, Value: a}
		if v, ok := mysqlValue(a); ok {
			nv[i].Value = v
		} else if checker != nil {
			if err := checker.CheckNamedValue(&nv[i]); err != nil {
				return nil, fmt.Errorf("argument %d: %w", i+1, err)
			}
		} else if v, err := driver.DefaultParameterConverter.ConvertValue(a); err == nil {
			nv[i].Value = v
		}
	}
	return nv, nil
}

// mysqlValue is what the MySQL driver's NamedValueChecker makes of the
// argument types a produce passes most that are not driver values (ids,
// vshards, priorities): the same value, got without its reflection and,
// for an id, without boxing it again. ok is false for other types.
func mysqlValue(a any) (driver.Value, bool) {
	switch v := a.(type) {
	case uint64:
		return a, true
	case uint16:
		return uint64(v), true
	case int:
		return int64(v), true
	}
	return nil, false
}

// nullString maps "" to NULL.
func nullString(s string) any {
	if s == "" {
		return nil
	}
	return s
}
