package testbed

import "fmt"

// ServerSettings size a server: InnoDB's memory and redo log, and how many
// clients it takes. They are the one place where the test beds' and the
// sandbox's MariaDB sizing is decided (docs/performance.md, "The
// sandbox's servers"); durability is not among them, it is always full
// (innodb_flush_log_at_trx_commit=1, sync_binlog=1).
type ServerSettings struct {
	BufferPool     string // innodb_buffer_pool_size
	RedoLog        string // innodb_log_file_size
	MaxConnections int    // max_connections
	// BinlogRowImage is binlog_row_image; empty leaves the server's
	// default (FULL).
	BinlogRowImage string
	// BinlogAnnotateRowEvents is binlog_annotate_row_events; empty leaves
	// the server's default (ON).
	BinlogAnnotateRowEvents string
}

// DeploymentSettings are the sandbox's (`bin/sandbox up`, `make run`, the
// load tests and benchmarks): what a real deployment on this kind of
// machine (2 cores, 24 GiB) would run. One server alone would get about
// two thirds of the memory as buffer pool; the sandbox runs four (two
// clusters of a primary and a replica) on the box beside the router and
// the load generator, so each gets a quarter of that: 4 GiB, 16 GiB in all,
// 8 GiB left for the kernel's page cache (binary logs, relay logs), the
// router and the generator. A 1 GiB redo log holds well over a minute of
// the heaviest benchmark's writes, so checkpoints do not throttle
// commits (the 96 MiB default filled in seconds); 1,000 connections cover
// several routers' pools (each opens up to its -max-conns per cluster).
//
// The binary log (ROW format) carries each changed row's primary key and
// changed columns only (binlog_row_image=MINIMAL): every table has a
// primary key, so a replica finds its row by it, and nothing reads the
// other columns' before images. Under FULL, marking a message consumed
// logged the whole message row, payload included, twice, and the replica
// applied all of it (docs/performance.md, "The sandbox's servers").
func DeploymentSettings() ServerSettings {
	return ServerSettings{BufferPool: "4G", RedoLog: "1G", MaxConnections: 1000, BinlogRowImage: "MINIMAL", BinlogAnnotateRowEvents: "OFF"}
}

// TestSettings are the test beds' (`bin/sandbox exec`, testbed.Main,
// testbed.Start): small, because one `make test` starts many beds side
// by side and their tables stay tiny. Their binary log is the sandbox's,
// so that the tests replicate what a deployment replicates.
func TestSettings() ServerSettings {
	return ServerSettings{BufferPool: "128M", RedoLog: "96M", MaxConnections: 1000, BinlogRowImage: "MINIMAL", BinlogAnnotateRowEvents: "OFF"}
}

func (s ServerSettings) args() []string {
	args := []string{
		"--innodb-buffer-pool-size=" + s.BufferPool,
		"--innodb-log-file-size=" + s.RedoLog,
		fmt.Sprintf("--max-connections=%d", s.MaxConnections),
	}
	if s.BinlogRowImage != "" {
		args = append(args, "--binlog-row-image="+s.BinlogRowImage)
	}
	if s.BinlogAnnotateRowEvents != "" {
		args = append(args, "--binlog-annotate-row-events="+s.BinlogAnnotateRowEvents)
	}
	return args
}

// String names the settings as the benchmark reports print them.
func (s ServerSettings) String() string {
	out := fmt.Sprintf("innodb_buffer_pool_size=%s innodb_log_file_size=%s max_connections=%d", s.BufferPool, s.RedoLog, s.MaxConnections)
	if s.BinlogRowImage != "" {
		out += " binlog_row_image=" + s.BinlogRowImage
	}
	if s.BinlogAnnotateRowEvents != "" {
		out += " binlog_annotate_row_events=" + s.BinlogAnnotateRowEvents
	}
	return out
}
