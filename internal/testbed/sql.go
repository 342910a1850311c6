package testbed

// Every statement the test bed sends. They are MariaDB syntax (CHANGE
// MASTER … MASTER_USE_GTID, MASTER_GTID_WAIT, gtid_slave_pos, READ_ONLY
// ADMIN) and are not meant to run on MySQL.
const (
	// sqlSkipBinlog keeps the session's statements out of the binary log, so
	// per-server setup neither replicates nor gives a replica GTIDs of its
	// own (which gtid_strict_mode would later reject).
	sqlSkipBinlog = "SET SESSION sql_log_bin = 0"

	// sqlCreateRootTCP and sqlGrantRootTCP make sure root can log in over TCP
	// from 127.0.0.1 (any address when Spec.Place puts the servers on
	// hosts of their own; %s is the host) with no password under
	// --skip-name-resolve.
	// mariadb-install-db creates this account already; the statements are
	// idempotent and run unlogged.
	sqlCreateRootTCP = "CREATE USER IF NOT EXISTS 'root'@'%s'"
	sqlGrantRootTCP  = "GRANT ALL PRIVILEGES ON *.* TO 'root'@'%s' WITH GRANT OPTION"

	// sqlRevokeReadOnlyAdmin is run on replicas: ALL PRIVILEGES includes READ
	// ONLY ADMIN, which lets a client write through read_only=1 and would
	// give the replica transactions of its own. Without it a write to a
	// replica through a DSN fails with error 1290, as it would for an
	// application account. Admin work goes through the socket as
	// root@localhost, which keeps every privilege.
	sqlRevokeReadOnlyAdmin = "REVOKE READ_ONLY ADMIN ON *.* FROM 'root'@'%s'"
	sqlGrantReadOnlyAdmin  = "GRANT READ_ONLY ADMIN ON *.* TO 'root'@'%s'"

	// sqlCreateReplUser and sqlGrantRepl run logged on a primary before its
	// replicas start: they replicate, so a promoted replica already has the
	// account its peers would connect with.
	sqlCreateReplUser = "CREATE USER IF NOT EXISTS 'repl'@'%s' IDENTIFIED BY ?"
	sqlGrantRepl      = "GRANT REPLICATION SLAVE ON *.* TO 'repl'@'%s'"

	// sqlResetSlavePos makes a fresh replica start from its primary's first
	// binary log.
	sqlResetSlavePos = "SET GLOBAL gtid_slave_pos = ''"

	// sqlChangeMaster points a replica at its primary. MASTER_CONNECT_RETRY=1
	// makes a replica reconnect within a second of its primary's restart
	// rather than the default 60 s.
	sqlChangeMaster = "CHANGE MASTER TO MASTER_HOST = ?, MASTER_PORT = ?, " +
		"MASTER_USER = 'repl', MASTER_PASSWORD = ?, MASTER_USE_GTID = slave_pos, MASTER_CONNECT_RETRY = 1"

	sqlStartSlave        = "START SLAVE"
	sqlStopSlave         = "STOP SLAVE"
	sqlStopSlaveSQL      = "STOP SLAVE SQL_THREAD"
	sqlStopSlaveIO       = "STOP SLAVE IO_THREAD"
	sqlResetSlaveAll     = "RESET SLAVE ALL"
	sqlShowSlaveStatus   = "SHOW SLAVE STATUS"
	sqlSetReadWrite      = "SET GLOBAL read_only = 0"
	sqlSelectOne         = "SELECT 1"
	sqlSelectBinlogPos   = "SELECT @@GLOBAL.gtid_binlog_pos"
	sqlMasterGTIDWait    = "SELECT MASTER_GTID_WAIT(?, ?)"
	sqlCreateDatabaseFmt = "CREATE DATABASE IF NOT EXISTS %s"
)
