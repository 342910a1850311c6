package store

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/go-sql-driver/mysql"
)

// reshard_session is each cluster's record of the connections a resharding
// leader uses on it, under the leader's epoch (a number that grows with
// every change of leader, kept in the jobs' document). It exists so that a
// leader that stalls — stopped, swapped out, its network half open —
// cannot keep a range locked: the next leader reads the connections of
// older epochs here and KILLs them, which ends their transactions and
// releases their locks, before it takes a step of its own on the cluster.
//
// Every connection of a leader's pool registers itself when it is opened
// (its CONNECTION_ID, the epoch, the router) and then checks that no newer
// epoch has registered on the cluster; a newer one refuses the connection
// (ErrSuperseded). A new leader registers first and reads second, an old
// one the same, so one of the two always sees the other: either the old
// connection is killed, or it is refused.
//
// Connection ids restart with the server; a row opened before the server
// last started names a connection that is gone, so it is deleted without a
// KILL (the id may belong to someone else by now).
const createReshardSession = `CREATE TABLE IF NOT EXISTS reshard_session (
  server_conn BIGINT UNSIGNED NOT NULL PRIMARY KEY,
  epoch BIGINT NOT NULL,
  router VARBINARY(255) NOT NULL,
  opened_at DATETIME(6) NOT NULL,
  KEY idx_epoch (epoch)
) ENGINE=InnoDB`

const (
	registerReshardSession = `INSERT INTO reshard_session (server_conn, epoch, router, opened_at)
VALUES (CONNECTION_ID(), ?, ?, NOW(6))
ON DUPLICATE KEY UPDATE epoch = VALUES(epoch), router = VALUES(router), opened_at = VALUES(opened_at)`
	newestReshardEpoch = `SELECT COALESCE(MAX(epoch), 0) FROM reshard_session`
	// olderReshardSessions lists the connections of older epochs opened
	// since the server started (the argument is its uptime in seconds).
	olderReshardSessions = `SELECT server_conn FROM reshard_session
WHERE epoch < ? AND opened_at >= NOW(6) - INTERVAL ? SECOND`
	liveConnections      = `SELECT ID FROM information_schema.PROCESSLIST`
	serverUptime         = `SHOW GLOBAL STATUS LIKE 'Uptime'`
	forgetReshardSession = `DELETE FROM reshard_session WHERE epoch < ?`
	forgetOwnSession     = `DELETE FROM reshard_session WHERE server_conn = CONNECTION_ID()`
	// stalledTransactions lists the connections on this database (other
	// than this one) whose transaction is open while their client has
	// sent nothing for at least the given seconds.
	stalledTransactions = `SELECT p.ID FROM information_schema.INNODB_TRX t
JOIN information_schema.PROCESSLIST p ON p.ID = t.trx_mysql_thread_id
WHERE p.COMMAND = 'Sleep' AND p.TIME >= ? AND p.DB = DATABASE() AND p.ID <> CONNECTION_ID()`
)

// errUnknownThread is MySQL's answer to a KILL of a connection that ended
// meanwhile.
const errUnknownThread = 1094

// ErrSuperseded marks a reshard connection refused because a newer leader
// has taken over the cluster: the leader that asked has been replaced and
// must stop.
var ErrSuperseded = errors.New("a newer resharding leader has taken over this cluster")

// ReshardSession configures the connections a resharding leader uses on
// one cluster. Zero durations take the defaults named.
type ReshardSession struct {
	// Epoch is the leader's; it must grow with every change of leader.
	Epoch int64
	// Router names the leader in the record (for operators).
	Router string
	// LockWait bounds every wait for a row lock (innodb_lock_wait_timeout,
	// whole seconds, at least 1). Defaults to 5s: a statement that meets
	// another's locks for longer fails and is retried, so a step never
	// hangs behind a stalled transaction.
	LockWait time.Duration
	// StatementTime bounds each statement's run (MariaDB
	// max_statement_time, any statement; MySQL 8 max_execution_time, which
	// applies to SELECTs only). Defaults to 60s.
	StatementTime time.Duration
	// Idle is how long the server keeps a connection that sends nothing
	// (wait_timeout; on MariaDB also idle_transaction_timeout, so an open
	// transaction left idle that long is rolled back by the server even if
	// no new leader comes). Defaults to 60s.
	Idle time.Duration
	// MaxOpen caps the pool. Defaults to 16 (the jobs sync four tables at
	// a time, each reading both sides at once).
	MaxOpen int
}

func (o ReshardSession) withDefaults() ReshardSession {
	if o.LockWait <= 0 {
		o.LockWait = 5 * time.Second
	}
	if o.StatementTime <= 0 {
		o.StatementTime = 60 * time.Second
	}
	if o.Idle <= 0 {
		o.Idle = 60 * time.Second
	}
	if o.MaxOpen <= 0 {
		o.MaxOpen = 16
	}
	return o
}

// secondsAtLeast1 spells d as whole seconds, never 0 (0 means "no limit"
// or is refused by the server).
func secondsAtLeast1(d time.Duration) string {
	return strconv.FormatInt(max(int64(d.Round(time.Second)/time.Second), 1), 10)
}

// OpenReshardSession opens the pool a resharding leader of epoch o.Epoch
// uses on s's cluster and takes the cluster over: every connection of an
// older epoch recorded there is killed (its transaction rolled back, its
// locks released) before this returns. The statements of the pool run
// under o's limits. It returns the new store and how many connections it
// killed; the caller closes the store when its leadership ends.
func (s *Store) OpenReshardSession(ctx context.Context, o ReshardSession) (*Store, int, error) {
	o = o.withDefaults()
	cfg := s.cfg.Clone()
	params := make(map[string]string, len(cfg.Params)+4)
	for k, v := range cfg.Params {
		params[k] = v
	}
	params["innodb_lock_wait_timeout"] = secondsAtLeast1(o.LockWait)
	params["wait_timeout"] = secondsAtLeast1(o.Idle)
	if s.mariadb {
		params["max_statement_time"] = strconv.FormatFloat(o.StatementTime.Seconds(), 'f', 3, 64)
		params["idle_transaction_timeout"] = secondsAtLeast1(o.Idle)
	} else {
		params["max_execution_time"] = strconv.FormatInt(max(o.StatementTime.Milliseconds(), 1), 10)
	}
	cfg.Params = params
	inner, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, 0, fmt.Errorf("open reshard session on %s: %w", cfg.Addr, err)
	}
	db := sql.OpenDB(&sessionConnector{inner: inner, epoch: o.Epoch, router: o.Router})
	db.SetMaxOpenConns(o.MaxOpen)
	db.SetMaxIdleConns(o.MaxOpen)
	// Below the server's wait_timeout: the pool drops an idle connection
	// before the server does.
	db.SetConnMaxIdleTime(o.Idle / 2)
	rs := &Store{db: db, ids: s.ids, onRetry: s.onRetry, onDeliv: s.onDeliv, mariadb: s.mariadb, cfg: cfg}
	killed, err := rs.takeOver(ctx, o.Epoch)
	if err != nil {
		db.Close()
		return nil, 0, err
	}
	return rs, killed, nil
}

// takeOver kills the connections of epochs older than epoch on the
// cluster and forgets them. It runs on a connection of the new epoch's
// pool, which registered itself first.
func (s *Store) takeOver(ctx context.Context, epoch int64) (int, error) {
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return 0, fmt.Errorf("reshard takeover: %w", translate(err))
	}
	defer conn.Close()
	var name string
	var uptime int64
	if err := conn.QueryRowContext(ctx, serverUptime).Scan(&name, &uptime); err != nil {
		return 0, fmt.Errorf("reshard takeover: read uptime: %w", translate(err))
	}
	older, err := queryRows(ctx, conn, "reshard takeover: read older sessions", olderReshardSessions, []any{epoch, uptime}, scanOne[uint64])
	if err != nil {
		return 0, translate(err)
	}
	killed := 0
	if len(older) > 0 {
		live, err := queryRows(ctx, conn, "reshard takeover: read connections", liveConnections, nil, scanOne[uint64])
		if err != nil {
			return 0, translate(err)
		}
		alive := make(map[uint64]bool, len(live))
		for _, id := range live {
			alive[id] = true
		}
		for _, id := range older {
			if !alive[id] {
				continue
			}
			// KILL takes no placeholder; id is a number read from the
			// server.
			_, err := conn.ExecContext(ctx, "KILL CONNECTION "+strconv.FormatUint(id, 10))
			var me *mysql.MySQLError
			if errors.As(err, &me) && me.Number == errUnknownThread {
				continue
			}
			if err != nil {
				return killed, fmt.Errorf("reshard takeover: kill connection %d: %w", id, translate(err))
			}
			killed++
		}
	}
	if _, err := conn.ExecContext(ctx, forgetReshardSession, epoch); err != nil {
		return killed, fmt.Errorf("reshard takeover: forget older sessions: %w", translate(err))
	}
	return killed, nil
}

// sessionConnector registers every connection it opens under its epoch
// and refuses to hand one out once a newer epoch has registered.
type sessionConnector struct {
	inner  driver.Connector
	epoch  int64
	router string
}

var _ driver.Connector = (*sessionConnector)(nil)

func (c *sessionConnector) Driver() driver.Driver { return c.inner.Driver() }

func (c *sessionConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.inner.Connect(ctx)
	if err != nil {
		return nil, err
	}
	if err := c.register(ctx, conn); err != nil {
		conn.Close()
		return nil, err
	}
	return conn, nil
}

func (c *sessionConnector) register(ctx context.Context, conn driver.Conn) error {
	ex, ok1 := conn.(driver.ExecerContext)
	qr, ok2 := conn.(driver.QueryerContext)
	if !ok1 || !ok2 {
		return fmt.Errorf("reshard session: the driver's connection cannot run statements directly")
	}
	if _, err := ex.ExecContext(ctx, registerReshardSession, []driver.NamedValue{
		{Ordinal: 1, Value: c.epoch}, {Ordinal: 2, Value: c.router}}); err != nil {
		return fmt.Errorf("reshard session: register: %w", err)
	}
	rows, err := qr.QueryContext(ctx, newestReshardEpoch, nil)
	if err != nil {
		return fmt.Errorf("reshard session: read newest epoch: %w", err)
	}
	defer rows.Close()
	v := make([]driver.Value, 1)
	if err := rows.Next(v); err != nil {
		return fmt.Errorf("reshard session: read newest epoch: %w", err)
	}
	var newest int64
	switch x := v[0].(type) {
	case int64:
		newest = x
	case []byte:
		newest, err = strconv.ParseInt(string(x), 10, 64)
	default:
		err = fmt.Errorf("unexpected %T", x)
	}
	if err != nil {
		return fmt.Errorf("reshard session: read newest epoch: %w", err)
	}
	if newest > c.epoch {
		rows.Close()
		ex.ExecContext(ctx, forgetOwnSession, nil) // best effort: the row names a connection about to close
		return fmt.Errorf("%w: epoch %d registered, this leader's is %d", ErrSuperseded, newest, c.epoch)
	}
	return nil
}

// EndStalledTransactions kills the connections to this database whose
// transaction has stayed open while their client sent nothing for at
// least idle (other databases on the server are not shardmq's): a router
// or leader stopped (SIGSTOP, a frozen VM, a half-open network) between
// two statements of a transaction, still holding its locks. shardmq's own
// transactions never wait on a client, so such a transaction is stalled,
// not slow. A resharding job runs this before the steps that need a
// range's locks (raising a source's fence, the cut-over's deletes), so a
// stalled process cannot hold them. It returns how many it killed.
func (s *Store) EndStalledTransactions(ctx context.Context, idle time.Duration) (int, error) {
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return 0, fmt.Errorf("end stalled transactions: %w", translate(err))
	}
	defer conn.Close()
	ids, err := queryRows(ctx, conn, "end stalled transactions: read them", stalledTransactions,
		[]any{max(int64(idle/time.Second), 1)}, scanOne[uint64])
	if err != nil {
		return 0, translate(err)
	}
	killed := 0
	for _, id := range ids {
		_, err := conn.ExecContext(ctx, "KILL CONNECTION "+strconv.FormatUint(id, 10))
		var me *mysql.MySQLError
		if errors.As(err, &me) && me.Number == errUnknownThread {
			continue
		}
		if err != nil {
			return killed, fmt.Errorf("end stalled transactions: kill connection %d: %w", id, translate(err))
		}
		killed++
	}
	return killed, nil
}
