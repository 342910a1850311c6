package testbed

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
)

// Admin work goes through each server's unix socket as root@localhost, which
// keeps every privilege on replicas too, on a fresh connection per operation:
// a pooled connection would outlive a Kill.

func adminDB(inst *Instance) (*sql.DB, error) {
	cfg := mysql.NewConfig()
	cfg.User = "root"
	cfg.Net = "unix"
	cfg.Addr = inst.Socket
	cfg.InterpolateParams = true // CREATE USER … IDENTIFIED BY ? cannot be prepared
	cfg.Timeout = 2 * time.Second
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, err
	}
	db := sql.OpenDB(conn)
	db.SetMaxOpenConns(1)
	return db, nil
}

// withConn runs fn on one admin connection to inst.
func withConn(ctx context.Context, inst *Instance, fn func(*sql.Conn) error) error {
	db, err := adminDB(inst)
	if err != nil {
		return fmt.Errorf("testbed: %s: %w", inst.Name, err)
	}
	defer db.Close()
	conn, err := db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("testbed: %s: connect: %w", inst.Name, err)
	}
	defer conn.Close()
	if err := fn(conn); err != nil {
		return fmt.Errorf("testbed: %s: %w", inst.Name, err)
	}
	return nil
}

func execAll(ctx context.Context, conn *sql.Conn, stmts ...string) error {
	for _, s := range stmts {
		if _, err := conn.ExecContext(ctx, s); err != nil {
			return fmt.Errorf("%s: %w", s, err)
		}
	}
	return nil
}

// ping reports whether inst answers on its socket.
func ping(ctx context.Context, inst *Instance) error {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	return withConn(ctx, inst, func(conn *sql.Conn) error { return conn.PingContext(ctx) })
}

// prepare sets up a freshly started server's accounts, unlogged (see
// sql.go), then checks that its DSN works over TCP.
func (b *Bed) prepare(ctx context.Context, inst *Instance) error {
	err := withConn(ctx, inst, func(conn *sql.Conn) error {
		h := b.clientHost()
		stmts := []string{sqlSkipBinlog, fmt.Sprintf(sqlCreateRootTCP, h), fmt.Sprintf(sqlGrantRootTCP, h)}
		if inst.readOnly {
			stmts = append(stmts, fmt.Sprintf(sqlRevokeReadOnlyAdmin, h))
		}
		return execAll(ctx, conn, stmts...)
	})
	if err != nil {
		return err
	}
	if b.spec.Place != nil {
		// On a host of its own the server is out of this process's
		// reach over TCP; its clients check their own links.
		return nil
	}
	db, err := sql.Open("mysql", inst.DSN(""))
	if err != nil {
		return fmt.Errorf("testbed: %s: %w", inst.Name, err)
	}
	defer db.Close()
	var one int
	if err := db.QueryRowContext(ctx, sqlSelectOne).Scan(&one); err != nil {
		return fmt.Errorf("testbed: %s: root cannot log in over TCP with %s: %w", inst.Name, inst.DSN(""), err)
	}
	return nil
}

// replicate creates the replication account on c's primary and points its
// replicas at it. The account is created logged, before any replica
// connects, so it replicates from the first binary log on.
func (b *Bed) replicate(ctx context.Context, c *Cluster) error {
	if len(c.Replicas) == 0 {
		return nil
	}
	err := withConn(ctx, c.Primary, func(conn *sql.Conn) error {
		if _, err := conn.ExecContext(ctx, fmt.Sprintf(sqlCreateReplUser, b.clientHost()), b.replPassword); err != nil {
			return fmt.Errorf("create replication user: %w", err)
		}
		return execAll(ctx, conn, fmt.Sprintf(sqlGrantRepl, b.clientHost()))
	})
	if err != nil {
		return err
	}
	for _, r := range c.Replicas {
		err := withConn(ctx, r, func(conn *sql.Conn) error {
			if err := execAll(ctx, conn, sqlResetSlavePos); err != nil {
				return err
			}
			if _, err := conn.ExecContext(ctx, sqlChangeMaster, c.Primary.Host, c.Primary.Port, b.replPassword); err != nil {
				return fmt.Errorf("CHANGE MASTER: %w", err)
			}
			return execAll(ctx, conn, sqlStartSlave)
		})
		if err != nil {
			return err
		}
		if err := b.waitReplicationRunning(ctx, r, true); err != nil {
			return err
		}
	}
	return nil
}

// slaveStatus returns SHOW SLAVE STATUS as a map, or nil if inst replicates
// from nobody.
func slaveStatus(ctx context.Context, conn *sql.Conn) (map[string]string, error) {
	rows, err := conn.QueryContext(ctx, sqlShowSlaveStatus)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return nil, err
	}
	if !rows.Next() {
		return nil, rows.Err()
	}
	// Copies, not sql.RawBytes: their held read lock would deadlock
	// rows.Err below against a close started by ctx ending.
	vals := make([][]byte, len(cols))
	ptrs := make([]any, len(cols))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	if err := rows.Scan(ptrs...); err != nil {
		return nil, err
	}
	st := make(map[string]string, len(cols))
	for i, c := range cols {
		st[c] = string(vals[i])
	}
	return st, rows.Err()
}

func describeSlave(st map[string]string) string {
	return fmt.Sprintf("IO thread %s, SQL thread %s, Gtid_IO_Pos %q, last IO error %q, last SQL error %q",
		st["Slave_IO_Running"], st["Slave_SQL_Running"], st["Gtid_IO_Pos"], st["Last_IO_Error"], st["Last_SQL_Error"])
}

// waitReplicationRunning waits until inst's SQL thread runs and its IO
// thread runs (or, unless strictIO, is connecting to a primary that may be
// down). An instance that replicates from nobody passes at once.
func (b *Bed) waitReplicationRunning(ctx context.Context, inst *Instance, strictIO bool) error {
	ticker := time.NewTicker(pollInterval)
	defer ticker.Stop()
	return withConn(ctx, inst, func(conn *sql.Conn) error {
		for {
			st, err := slaveStatus(ctx, conn)
			if err != nil {
				return err
			}
			if st == nil {
				return nil
			}
			io, sqlThread := st["Slave_IO_Running"], st["Slave_SQL_Running"]
			if sqlThread == "Yes" && (io == "Yes" || !strictIO && io == "Connecting") {
				return nil
			}
			if sqlThread == "No" && st["Last_SQL_Error"] != "" {
				return fmt.Errorf("replication failed: %s", describeSlave(st))
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("replication not running: %w (%s)", ctx.Err(), describeSlave(st))
			case <-ticker.C:
			}
		}
	})
}

// StopReplication stops replica's SQL thread (STOP SLAVE SQL_THREAD): it
// keeps fetching its primary's binary log but applies nothing, as a lagging
// replica would. WaitReplica on it then waits until StartReplication or its
// timeout.
func (b *Bed) StopReplication(ctx context.Context, replica *Instance) error {
	return withConn(ctx, replica, func(conn *sql.Conn) error {
		return execAll(ctx, conn, sqlStopSlaveSQL)
	})
}

// StartReplication starts replica's stopped replication threads and waits
// until its SQL thread runs and its IO thread runs or is connecting.
func (b *Bed) StartReplication(ctx context.Context, replica *Instance) error {
	ctx, cancel := withDefaultTimeout(ctx, defaultWaitTimeout)
	defer cancel()
	err := withConn(ctx, replica, func(conn *sql.Conn) error {
		return execAll(ctx, conn, sqlStartSlave)
	})
	if err != nil {
		return err
	}
	return b.waitReplicationRunning(ctx, replica, false)
}

// Promote makes replica a writable primary, as a failover would: it lets
// the SQL thread apply what the IO thread had fetched (unless StopReplication
// stopped it: then those transactions are lost, as with a lagging replica),
// stops replication, forgets its primary (RESET SLAVE ALL) and sets
// read_only=0; a later Restart keeps it writable.
//
// Promote changes neither the Bed's Clusters nor replica.Role, and other
// replicas of the cluster still replicate from the old primary.
func (b *Bed) Promote(ctx context.Context, replica *Instance) error {
	ctx, cancel := withDefaultTimeout(ctx, defaultWaitTimeout)
	defer cancel()
	err := withConn(ctx, replica, func(conn *sql.Conn) error {
		st, err := slaveStatus(ctx, conn)
		if err != nil {
			return err
		}
		if st == nil {
			return errors.New("promote: not a replica")
		}
		if st["Slave_SQL_Running"] == "Yes" {
			if err := execAll(ctx, conn, sqlStopSlaveIO); err != nil {
				return err
			}
			if st, err = slaveStatus(ctx, conn); err != nil {
				return err
			}
			if err := gtidWait(ctx, conn, st["Gtid_IO_Pos"]); err != nil {
				return fmt.Errorf("promote: apply fetched transactions: %w", err)
			}
		}
		return execAll(ctx, conn, sqlSkipBinlog, sqlStopSlave, sqlResetSlaveAll, sqlSetReadWrite, fmt.Sprintf(sqlGrantReadOnlyAdmin, b.clientHost()))
	})
	if err != nil {
		return err
	}
	b.mu.Lock()
	replica.readOnly = false
	b.mu.Unlock()
	return nil
}

// gtidWait waits until conn's server has applied pos, within ctx's deadline.
func gtidWait(ctx context.Context, conn *sql.Conn, pos string) error {
	if pos == "" {
		return nil
	}
	timeout := defaultWaitTimeout.Seconds()
	if dl, ok := ctx.Deadline(); ok {
		timeout = max(time.Until(dl).Seconds(), 0.001)
	}
	var res sql.NullInt64
	if err := conn.QueryRowContext(ctx, sqlMasterGTIDWait, pos, timeout).Scan(&res); err != nil {
		return err
	}
	if !res.Valid || res.Int64 != 0 {
		return fmt.Errorf("%s not applied within %.1fs", pos, timeout)
	}
	return nil
}

// WaitReplica waits until replica has applied everything its primary has
// written so far (the primary's gtid_binlog_pos, waited on with
// MASTER_GTID_WAIT). Its primary is found by the port it replicates from;
// an instance that replicates from nobody (say, after Promote) passes at
// once. Without a deadline on ctx it gives up after 30 s.
func WaitReplica(ctx context.Context, b *Bed, replica *Instance) error {
	ctx, cancel := withDefaultTimeout(ctx, defaultWaitTimeout)
	defer cancel()
	return withConn(ctx, replica, func(conn *sql.Conn) error {
		st, err := slaveStatus(ctx, conn)
		if err != nil || st == nil {
			return err
		}
		source := b.instanceByPort(st["Master_Port"])
		if source == nil {
			return fmt.Errorf("replicates from port %s, which is not in the bed", st["Master_Port"])
		}
		var pos string
		err = withConn(ctx, source, func(sconn *sql.Conn) error {
			return sconn.QueryRowContext(ctx, sqlSelectBinlogPos).Scan(&pos)
		})
		if err != nil {
			return err
		}
		if err := gtidWait(ctx, conn, pos); err != nil {
			if st, serr := slaveStatus(context.Background(), conn); serr == nil && st != nil {
				return fmt.Errorf("wait for %s: %w (%s)", source.Name, err, describeSlave(st))
			}
			return fmt.Errorf("wait for %s: %w", source.Name, err)
		}
		return nil
	})
}

// WaitReplicated waits until every replica of b has applied its primary's
// current gtid_binlog_pos; see WaitReplica.
func WaitReplicated(ctx context.Context, b *Bed) error {
	var replicas []*Instance
	for _, c := range b.Clusters {
		replicas = append(replicas, c.Replicas...)
	}
	return parallel(replicas, func(r *Instance) error { return WaitReplica(ctx, b, r) })
}

// CreateDatabase runs CREATE DATABASE IF NOT EXISTS name on every primary.
// Replicas get it by replication: call WaitReplicated before using it there.
func CreateDatabase(ctx context.Context, b *Bed, name string) error {
	if name == "" {
		return errors.New("testbed: CreateDatabase: empty name")
	}
	stmt := fmt.Sprintf(sqlCreateDatabaseFmt, quoteIdent(name))
	var primaries []*Instance
	for _, c := range b.Clusters {
		primaries = append(primaries, c.Primary)
	}
	return parallel(primaries, func(p *Instance) error {
		return withConn(ctx, p, func(conn *sql.Conn) error { return execAll(ctx, conn, stmt) })
	})
}

func quoteIdent(s string) string {
	return "`" + strings.ReplaceAll(s, "`", "``") + "`"
}

func (b *Bed) instanceByPort(port string) *Instance {
	for _, inst := range b.Instances() {
		if fmt.Sprint(inst.Port) == port {
			return inst
		}
	}
	return nil
}

func withDefaultTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, d)
}
